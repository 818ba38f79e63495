//! The broker scenario of `--recovery-rounds`: tests/cluster.rs's c2, timed.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::task::block_in_place;

use super::super::{Bench, LEADER};
use super::{
    caught, database_of, delivered_at, page, per_sec, read, resumed, tally, undelivered, value,
    versions, Setting, BACKLOG_TXN_ROWS, GIVE_UP, MESSAGES_CONFIRMED_TOTAL, MESSAGES_IN_FLIGHT,
    POLL,
};
use crate::measurement::results::load_average;
use crate::measurement::results::recovery::{Conditions, Fault, Round, Scenario};
use outbox_common::quote::quote_ident;
use outbox_testkit::amqp::{delete_exchange, delete_queue};
use outbox_testkit::failover::seed_backlog;
use outbox_testkit::faults::quorum_outbox;
use outbox_testkit::outbox::Outbox;
use outbox_testkit::relay::SESSIONS;
use outbox_testkit::{free_port, rabbit_release, Consumer, RabbitCluster};

/// How long the broker scenario waits for a full window before it kills anyway: the
/// backlog keeps the window full in its first seconds, and is gone in about ten.
const WINDOW_WAIT: Duration = Duration::from_secs(5);

/// c2: a backlog behind the window, 2 writers, reconnects capped at 2 s while a node is down.
const BROKER: Setting = Setting {
    backlog: 20_000,
    writers: 2,
    writer_txn_rows: 10,
    writer_pause_ms: 20,
    max_backoff_secs: 2,
};

impl Bench {
    /// The broker scenario's rounds on `cluster`.
    pub(super) async fn broker_node_rounds(
        &mut self,
        cluster: &'static RabbitCluster,
        rounds: u32,
    ) -> Result<Scenario> {
        let mut s = Scenario {
            fault: Fault::BrokerNode,
            conditions: self.conditions(&BROKER),
            rounds: Vec::new(),
        };
        s.conditions.broker = format!(
            "{}-node cluster (RabbitMQ {}, the test kit's), a quorum queue led by node {LEADER} \
             per round, consumed through it",
            cluster.len(),
            rabbit_release::release().series()
        );
        s.conditions.route = "every node's URL, `--amqp-node-order listed` with a follower \
                              first (the two in turn)"
            .into();
        (s.conditions.postgres, s.conditions.wal_sender_timeout) = versions(&self.admin).await?;
        for round in 1..=rounds {
            let measured = caught(self.broker_node_round(cluster, round, &s.conditions)).await;
            s.rounds.push(self.judge(measured?)?);
        }
        Ok(s)
    }

    /// One round of c2: the relay on a follower's node with a full window, the node killed,
    /// the times to its next session and confirm; then the tally, and the node restarted.
    async fn broker_node_round(
        &mut self,
        cluster: &'static RabbitCluster,
        round: u32,
        c: &Conditions,
    ) -> Result<Round> {
        block_in_place(|| cluster.ensure_healthy());
        let load = load_average();
        let database_url = self.args.servers.database_url.clone();
        let (outbox, oracle) =
            quorum_outbox(&database_url, cluster, LEADER, "recovery", &["setup"]).await;
        let leader_url = cluster.url(LEADER);
        let mut consumer = Consumer::start_with(&leader_url, &outbox.queue, false).await;
        seed_backlog(
            &outbox.client,
            BROKER.backlog as usize,
            BACKLOG_TXN_ROWS as usize,
        )
        .await;
        let writing = Instant::now();
        let writers = BROKER.writers(&outbox.db_url);
        // A follower first, so that the kill takes the relay's node and not the queue's
        // leader too (an election on top, c3's case).
        let first = 1 + (round as usize - 1) % (cluster.len() - 1);
        let listed: Vec<String> = (0..cluster.len())
            .map(|k| cluster.url((first + k) % cluster.len()))
            .collect();
        let port = free_port();
        let order = ["--amqp-node-order", "listed"];
        let name = format!("recovery-broker-{round}");
        let urls = (outbox.db_url.as_str(), listed.join(","));
        let relay = self.recovery_relay(&name, &outbox, urls, c, port, &order)?;
        relay.ready().await?;
        let node = node_in_use(cluster, port, None).await?;
        let in_flight = window_filled(port, c.max_in_flight).await;
        let sessions = read(port, SESSIONS).await?;
        let behind = undelivered(BROKER.backlog, &writers, &mut consumer);
        self.say(&format!(
            "recovery round {round}: kill -9 of node {node}, {} in flight, {behind} rows \
             undelivered, load {load}",
            in_flight.map_or("?".into(), |n| format!("{n:.0}"))
        ));
        let killed = block_in_place(|| cluster.kill9(node));
        let confirmed = read(port, MESSAGES_CONFIRMED_TOTAL).await?;
        let (resumed, delivered) = tokio::join!(
            resumed(port, killed, sessions, confirmed),
            delivered_at(&outbox.client, &mut consumer, killed)
        );
        let resumed = resumed?;
        let moved_to = node_in_use(cluster, port, Some(node)).await?;
        // PostgreSQL is untouched here: the writers' rate over the whole round is the load.
        let writer_rate = per_sec(writers.stop().await.len(), writing);
        let rows = oracle.committed_ids(&outbox.client).await;
        let tally = tally(&mut consumer, &rows, relay, &leader_url, &outbox.queue).await?;
        consumer.close().await;
        delete_queue(&leader_url, &outbox.queue).await;
        delete_exchange(&leader_url, &outbox.exchange).await;
        self.drop_database(outbox).await?;
        let restoring = Instant::now();
        block_in_place(|| cluster.restart(node));
        let role = if node == LEADER { "leader" } else { "follower" };
        Ok(Round {
            round,
            load,
            fault: format!("node {node} ({role}) → node {moved_to}"),
            in_flight_at_fault: in_flight,
            undelivered_at_fault: Some(behind),
            writer_rows_per_sec: writer_rate,
            streaming_secs: resumed.streaming,
            first_confirm_secs: resumed.first_confirm,
            delivered_secs: delivered,
            restore_secs: Some(restoring.elapsed().as_secs_f64()),
            ..tally
        })
    }

    /// Drops the round's database with its slots (the relay's, once its walsender let go,
    /// and the oracle's).
    async fn drop_database(&self, outbox: Outbox) -> Result<()> {
        let db = database_of(&outbox.db_url).to_string();
        drop(outbox);
        let slots = self
            .admin
            .query(
                "SELECT slot_name::text FROM pg_replication_slots WHERE database = $1",
                &[&db],
            )
            .await?;
        for row in slots {
            let slot: String = row.try_get(0)?;
            self.wait_slot_released(&slot).await?;
            self.admin
                .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
                .await
                .with_context(|| format!("cannot drop slot {slot}"))?;
        }
        let drop = format!("DROP DATABASE {} WITH (FORCE)", quote_ident(&db));
        self.admin
            .batch_execute(&drop)
            .await
            .with_context(|| format!("cannot drop database {db}"))?;
        Ok(())
    }
}

/// The cluster node the relay reports in use (other than `not`).
async fn node_in_use(cluster: &RabbitCluster, port: u16, not: Option<usize>) -> Result<usize> {
    let deadline = Instant::now() + GIVE_UP;
    while Instant::now() < deadline {
        let in_use = page(port).await.map(|p| cluster.nodes_in_use(&p));
        if let Some(&node) = in_use.iter().flatten().find(|&&n| Some(n) != not) {
            return Ok(node);
        }
        tokio::time::sleep(POLL).await;
    }
    bail!("the relay reported no RabbitMQ node in use (other than {not:?}) in {GIVE_UP:?}")
}

/// Waits (up to [`WINDOW_WAIT`]) until `window` messages are in flight; the last reading.
async fn window_filled(port: u16, window: u32) -> Option<f64> {
    let deadline = Instant::now() + WINDOW_WAIT;
    loop {
        let in_flight = page(port).await.map(|p| value(&p, MESSAGES_IN_FLIGHT));
        if in_flight.is_some_and(|n| n >= f64::from(window)) || Instant::now() >= deadline {
            return in_flight;
        }
        tokio::time::sleep(POLL).await;
    }
}
