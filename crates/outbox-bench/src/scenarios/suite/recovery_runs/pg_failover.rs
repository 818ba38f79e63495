//! The PostgreSQL scenario of `--recovery-rounds`: tests/failover.rs's f1a, timed.

use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use tokio::task::block_in_place;

use super::super::Bench;
use super::{
    caught, database_of, delivered_at, per_sec, read, resumed, tally, undelivered, versions,
    Setting, BACKLOG_TXN_ROWS, GIVE_UP, MESSAGES_CONFIRMED_TOTAL, MESSAGES_IN_FLIGHT,
};
use crate::measurement::results::load_average;
use crate::measurement::results::recovery::{Conditions, Fault, Round, Scenario};
use outbox_testkit::amqp::{delete_exchange, delete_queue};
use outbox_testkit::failover::{outbox_ids, seed_backlog, FailoverPair, FIRST_FAILOVER_MAJOR};
use outbox_testkit::relay::SESSIONS;
use outbox_testkit::{free_port, Consumer};

/// f1a: the fault at 40 % of a backlog, 4 single-row writers, the relay's default backoff
/// (passed explicitly, so that the report says what ran).
const FAILOVER: Setting = Setting {
    backlog: 12_000,
    writers: 4,
    writer_txn_rows: 1,
    writer_pause_ms: 2,
    max_backoff_secs: 30,
};
const FAULT_AT: f64 = 0.4;
/// Rows the writers commit on the new primary before they stop.
const ROWS_AFTER: usize = 1_000;

impl Bench {
    /// The failover scenario's rounds, each on a pair of its own.
    pub(super) async fn failover_rounds(&mut self, rounds: u32) -> Result<Scenario> {
        let mut s = Scenario {
            fault: Fault::PgFailover,
            conditions: self.conditions(&FAILOVER),
            rounds: Vec::new(),
        };
        s.conditions.broker = format!(
            "RabbitMQ {} (AMQP_URL), a classic queue",
            or_unknown(&self.args.rabbitmq_version)
        );
        s.conditions.route = format!(
            "a multi-host URL (primary, standby; `target_session_attrs=read-write`) to a \
             private PostgreSQL {FIRST_FAILOVER_MAJOR} pair, `synchronized_standby_slots` on"
        );
        for round in 1..=rounds {
            let measured = caught(self.failover_round(round, &mut s.conditions)).await;
            s.rounds.push(self.judge(measured?)?);
        }
        Ok(s)
    }

    /// One round of f1a: a fresh pair, the relay draining a backlog behind a multi-host URL,
    /// the primary stopped (immediate) at 40 % of it and the standby promoted; the times from
    /// the promotion, then the tally against the rows on the new primary.
    async fn failover_round(&mut self, round: u32, c: &mut Conditions) -> Result<Round> {
        let load = load_average();
        let amqp = self.args.servers.amqp_url.clone();
        let pair =
            block_in_place(|| FailoverPair::start(FIRST_FAILOVER_MAJOR, Default::default(), &[]));
        let outbox = pair.outbox(&amqp, "recovery").await;
        let db = database_of(&outbox.db_url).to_string();
        let url = pair.multi_host_url(&db);
        let mut consumer = Consumer::start_with(&amqp, &outbox.queue, false).await;
        let port = free_port();
        let name = format!("recovery-pg-{round}");
        let relay = self.recovery_relay(&name, &outbox, (&url, amqp.clone()), c, port, &[])?;
        relay.ready().await?;
        pair.wait_failover_ready(&outbox.slot, GIVE_UP)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let writing = Instant::now();
        let writers = FAILOVER.writers(&url);
        // The fault while the backlog drains with a full window (on a quiet machine 40 % of
        // it has arrived before the seeding returns).
        let fault_at = (FAILOVER.backlog as f64 * FAULT_AT) as usize;
        let rows = FAILOVER.backlog as usize;
        let seeding = seed_backlog(&outbox.client, rows, BACKLOG_TXN_ROWS as usize);
        tokio::join!(seeding, consumer.wait_for(fault_at, GIVE_UP));
        let in_flight = read(port, MESSAGES_IN_FLIGHT).await.ok();
        let sessions = read(port, SESSIONS).await?;
        let writer_rate = per_sec(writers.committed(), writing);
        let behind = undelivered(FAILOVER.backlog, &writers, &mut consumer);
        self.say(&format!(
            "recovery round {round}: PostgreSQL {FIRST_FAILOVER_MAJOR} primary stopped \
             (immediate), {} in flight, {behind} rows undelivered, writers {writer_rate:.0} \
             rows/s, load {load}",
            in_flight.map_or("?".into(), |n| format!("{n:.0}"))
        ));
        let stopped = Instant::now();
        block_in_place(|| pair.primary.stop_immediate());
        let client = pair.promote(&db).await;
        let promoted = Instant::now();
        let confirmed = read(port, MESSAGES_CONFIRMED_TOTAL).await?;
        let (resumed, delivered) = tokio::join!(
            resumed(port, promoted, sessions, confirmed),
            delivered_at(&client, &mut consumer, promoted)
        );
        let resumed = resumed?;
        let committed = writers.committed();
        if !writers
            .wait_committed(committed + ROWS_AFTER, GIVE_UP)
            .await
        {
            bail!("the writers committed fewer than {ROWS_AFTER} rows on the new primary");
        }
        writers.stop().await;
        let rows = outbox_ids(&client).await;
        let tally = tally(&mut consumer, &rows, relay, &amqp, &outbox.queue).await?;
        (c.postgres, c.wal_sender_timeout) = versions(&client).await?;
        consumer.close().await;
        delete_queue(&amqp, &outbox.queue).await;
        delete_exchange(&amqp, &outbox.exchange).await;
        drop((client, outbox));
        // Stopping the servers waits for them.
        block_in_place(|| drop(pair));
        Ok(Round {
            round,
            load,
            fault: format!("primary (PostgreSQL {FIRST_FAILOVER_MAJOR}) → promoted standby"),
            in_flight_at_fault: in_flight,
            undelivered_at_fault: Some(behind),
            writer_rows_per_sec: writer_rate,
            fault_to_start_secs: Some((promoted - stopped).as_secs_f64()),
            streaming_secs: resumed.streaming,
            first_confirm_secs: resumed.first_confirm,
            delivered_secs: delivered,
            ..tally
        })
    }
}

fn or_unknown(version: &str) -> &str {
    if version.is_empty() {
        "(version not given)"
    } else {
        version
    }
}
