//! The runs of `--recovery-rounds` (the figures and their Markdown are [`crate::measurement::results::recovery`]):
//! the scenes of tests/cluster.rs (c2, the relay's node killed) and tests/failover.rs (f1a,
//! the primary killed, a multi-host URL), set with the test kit's helpers and timed from the
//! relay's /metrics. The kit panics on what it cannot do; each round turns that into an error.

use outbox_relay::metrics::{MESSAGES_CONFIRMED_TOTAL, MESSAGES_IN_FLIGHT};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures_util::FutureExt;
use tokio::task::block_in_place;
use tokio_postgres::Client;

use super::{panic_text, payload_text, Bench};
use crate::measurement::relay::{Relay, RelayBinary};
use crate::measurement::results::recovery::{Conditions, Recovery, Round, TARGET};
use crate::measurement::results::Results;
use outbox_common::liveness::PeerTimeout;
use outbox_testkit::faults::{barrier, probe, wait_for_ids, Tally, Writers};
use outbox_testkit::http::{http_get, metric_sum};
use outbox_testkit::outbox::Outbox;
use outbox_testkit::relay::SESSIONS;
use outbox_testkit::{Consumer, RabbitCluster};

mod broker_node;
mod pg_failover;

/// How often /metrics is read while the relay recovers: the figures' resolution.
const POLL: Duration = Duration::from_millis(20);
/// How long the relay may take to stream again (or a row to arrive) before the round fails:
/// far past the target, so that a slow recovery is a figure, not an error.
const GIVE_UP: Duration = Duration::from_secs(120);
/// How long every committed row may take to arrive once the writers stopped.
const CATCH_UP: Duration = Duration::from_secs(180);
/// The backlog's rows per transaction (both tests' X).
const BACKLOG_TXN_ROWS: u32 = 10;

/// One scenario's fixed conditions: the tests' own (c2 and f1a).
struct Setting {
    backlog: u64,
    writers: u32,
    writer_txn_rows: u32,
    writer_pause_ms: u64,
    max_backoff_secs: u64,
}

impl Setting {
    fn writers(&self, db_url: &str) -> Writers {
        let pause = Duration::from_millis(self.writer_pause_ms);
        Writers::start(
            db_url,
            self.writers as usize,
            self.writer_txn_rows as usize,
            pause,
        )
    }
}

impl Bench {
    /// The recovery section (nothing without `--recovery-rounds` or `--recovery-only`): the
    /// broker scenario's rounds on the shared cluster (stopped after them), then the
    /// failover's, each on a pair of its own.
    pub(super) async fn recovery(&mut self, results: &mut Results) -> Result<()> {
        let rounds = self.args.recovery_rounds();
        if rounds == 0 {
            return Ok(());
        }
        let started = Instant::now();
        // The kit's `setup` runs the binary under test too.
        let bin = std::fs::canonicalize(&self.relay.path)
            .with_context(|| format!("no relay binary at {}", self.relay.path.display()))?;
        outbox_testkit::relay::set_binary(bin);
        self.say("recovery: the private 3-node RabbitMQ cluster (started unless running)");
        let cluster = tokio::task::spawn_blocking(RabbitCluster::shared)
            .await
            .map_err(|e| anyhow!("the RabbitMQ cluster did not start: {}", panic_text(e)))?;
        let mut r = Recovery {
            rounds,
            target_secs: TARGET.as_secs_f64(),
            cluster_startup_secs: started.elapsed().as_secs_f64(),
            ..Recovery::default()
        };
        let broker = self.broker_node_rounds(cluster, rounds).await;
        block_in_place(|| cluster.shutdown());
        r.broker_node = Some(broker?);
        r.pg_failover = Some(self.failover_rounds(rounds).await?);
        r.seconds = started.elapsed().as_secs_f64();
        self.say(&format!("recovery: section took {:.0} s", r.seconds));
        results.recovery = Some(r);
        Ok(())
    }

    /// A scenario's conditions, from its setting and the bench's flags; the servers' are
    /// filled in by the scenario.
    fn conditions(&self, setting: &Setting) -> Conditions {
        // The relay runs with its default --peer-timeout, hence this heartbeat.
        let peer = PeerTimeout::default();
        Conditions {
            peer_timeout_secs: peer.get().as_secs(),
            amqp_heartbeat_secs: u64::from(peer.amqp_heartbeat()),
            max_in_flight: self.args.max_in_flight,
            max_backoff_secs: setting.max_backoff_secs,
            status_interval_ms: self.args.status_interval_ms,
            backlog_rows: setting.backlog,
            writers: setting.writers,
            writer_txn_rows: setting.writer_txn_rows,
            writer_pause_ms: setting.writer_pause_ms,
            ..Conditions::default()
        }
    }

    /// Prints the round; a round that lost a row ends the run.
    fn judge(&self, r: Round) -> Result<Round> {
        let at = |x: Option<f64>| x.map_or("—".into(), |x| format!("{x:.2} s"));
        self.say(&format!(
            "  {}: streaming after {:.2} s, first confirm {}, row delivered {}; {} rows, {} lost, \
             {} duplicates, {} unexpected",
            r.fault,
            r.streaming_secs,
            at(r.first_confirm_secs),
            at(r.delivered_secs),
            r.rows,
            r.lost,
            r.duplicates,
            r.unexpected
        ));
        if r.lost > 0 {
            bail!(
                "recovery round {}: {} of {} committed rows never arrived ({})",
                r.round,
                r.lost,
                r.rows,
                r.fault
            );
        }
        Ok(r)
    }

    /// `outbox-relay run` on `outbox` through `urls` (the database's, the broker's), serving
    /// /metrics on `port`.
    fn recovery_relay(
        &self,
        name: &str,
        outbox: &Outbox,
        (database_url, amqp_url): (&str, String),
        c: &Conditions,
        port: u16,
        extra: &[&str],
    ) -> Result<Relay> {
        let binary = RelayBinary {
            database_url: database_url.to_string(),
            amqp_url,
            ..self.relay.clone()
        };
        let mut args: Vec<String> = [
            "run",
            "--slot",
            &outbox.slot,
            "--exchange",
            &outbox.exchange,
            "--max-in-flight",
            &c.max_in_flight.to_string(),
            "--status-interval",
            &format!("{}ms", c.status_interval_ms),
            "--max-backoff",
            &c.max_backoff_secs.to_string(),
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            // The failover's oracle is the table: no row may be cleaned away.
            "--cleanup-interval",
            "0",
        ]
        .map(String::from)
        .into();
        args.extend(extra.iter().map(|s| s.to_string()));
        binary.spawn(name, &args)
    }
}

/// A round's future, with a panic of the kit turned into an error.
async fn caught<T>(round: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    match AssertUnwindSafe(round).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(anyhow!("recovery round failed: {}", payload_text(&*panic))),
    }
}

/// When the relay, after `start`, started a new session and had a new confirm.
struct Resumed {
    streaming: f64,
    first_confirm: Option<f64>,
}

/// Reads the relay's /metrics every [`POLL`] from `start` on until its sessions counter
/// passed `sessions` and its confirms passed `confirmed`; fails with no new session.
async fn resumed(port: u16, start: Instant, sessions: f64, confirmed: f64) -> Result<Resumed> {
    let (mut streaming, mut first_confirm) = (None, None);
    while start.elapsed() < GIVE_UP {
        if let Some(page) = page(port).await {
            let at = start.elapsed().as_secs_f64();
            if streaming.is_none() && value(&page, SESSIONS) > sessions {
                streaming = Some(at);
            }
            if first_confirm.is_none() && value(&page, MESSAGES_CONFIRMED_TOTAL) > confirmed {
                first_confirm = Some(at);
            }
        }
        if let Some(streaming) = streaming.filter(|_| first_confirm.is_some()) {
            return Ok(Resumed {
                streaming,
                first_confirm,
            });
        }
        tokio::time::sleep(POLL).await;
    }
    match streaming {
        Some(streaming) => Ok(Resumed {
            streaming,
            first_confirm,
        }),
        None => bail!("the relay did not stream again within {GIVE_UP:?} (its log is kept)"),
    }
}

/// Inserts a row now and waits until the consumer has it: when, counted from `start`.
async fn delivered_at(client: &Client, consumer: &mut Consumer, start: Instant) -> Option<f64> {
    let (_, took) = probe(client, consumer, GIVE_UP).await;
    took.map(|_| start.elapsed().as_secs_f64())
}

/// Rows committed (the backlog and the writers') that had not reached the consumer yet: what
/// a row written at the fault waits behind, less what the relay resumes past or more what it
/// repeats.
fn undelivered(backlog: u64, writers: &Writers, consumer: &mut Consumer) -> u64 {
    let committed = backlog + writers.committed() as u64;
    committed.saturating_sub(consumer.received().len() as u64)
}

/// Waits until every one of `rows` arrived (or [`CATCH_UP`] passed), stops the relay and
/// drains the queue through a marker, so that every repeat is counted: the round's tally.
async fn tally(
    consumer: &mut Consumer,
    rows: &[String],
    relay: Relay,
    amqp_url: &str,
    queue: &str,
) -> Result<Round> {
    wait_for_ids(consumer, rows, CATCH_UP).await;
    relay.stop().await?;
    barrier(consumer, amqp_url, queue).await;
    let tally = Tally::of(consumer.received());
    Ok(Round {
        rows: rows.len() as u64,
        lost: tally.lost(rows).len() as u64,
        duplicates: tally.duplicates() as u64,
        unexpected: tally.unknown(rows).len() as u64,
        ..Round::default()
    })
}

async fn page(port: u16) -> Option<String> {
    http_get(port, "/metrics").await.map(|(_, body)| body)
}

/// A family's value, summed over its labels (absent: 0, as before its first sample).
fn value(page: &str, name: &str) -> f64 {
    metric_sum(page, name).unwrap_or(0.0)
}

async fn read(port: u16, name: &str) -> Result<f64> {
    let page = page(port)
        .await
        .context("the relay's /metrics did not answer")?;
    Ok(value(&page, name))
}

/// `server_version` and `wal_sender_timeout` of `client`'s server.
async fn versions(client: &Client) -> Result<(String, String)> {
    let show = async |name: &str| -> Result<String> {
        let row = client.query_one(&format!("SHOW {name}"), &[]).await?;
        Ok(row.try_get(0)?)
    };
    Ok((
        show("server_version").await?,
        show("wal_sender_timeout").await?,
    ))
}

/// The database of a URL `…/db?params`.
fn database_of(url: &str) -> &str {
    let path = url.split('?').next().unwrap_or(url);
    path.rsplit('/').next().unwrap_or(path)
}

fn per_sec(rows: usize, since: Instant) -> f64 {
    rows as f64 / since.elapsed().as_secs_f64().max(f64::EPSILON)
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::parse_args as parse;

    #[test]
    fn the_section_is_off_by_default_three_rounds_when_asked_and_runs_beside_the_suite() {
        let rounds = |flags: &[&str]| parse(flags).expect("parses").recovery_rounds();
        assert_eq!(rounds(&[]), 0);
        assert_eq!(rounds(&["--recovery-rounds"]), 3);
        assert_eq!(rounds(&["--recovery-rounds", "--quick"]), 3);
        assert_eq!(rounds(&["--recovery-rounds", "5"]), 5);
        assert_eq!(rounds(&["--recovery-only"]), 3);
        assert_eq!(rounds(&["--recovery-only", "--recovery-rounds", "1"]), 1);
        assert_eq!(rounds(&["--cluster-only", "--recovery-rounds", "2"]), 2);
        assert!(parse(&["--recovery-rounds", "21"]).is_err());
        for other in [
            &["--shards-sweep", "1,2"][..],
            &["--emit"],
            &["--compare", "wal"],
            &["--cost-growth"],
            &["--pin-broker"],
            &["--ab-with", "/bin/true"],
        ] {
            for recovery in ["--recovery-rounds", "--recovery-only"] {
                let mut flags = vec![recovery];
                flags.extend(other);
                assert!(parse(&flags).is_err(), "{recovery} {other:?}");
            }
        }
        assert!(parse(&["--recovery-only", "--cluster-only"]).is_err());
    }

    #[test]
    fn the_database_is_the_urls_last_path_segment() {
        assert_eq!(
            database_of("postgres://p@h:1,h:2/db_1?target_session_attrs=read-write"),
            "db_1"
        );
        assert_eq!(database_of("postgres://p@h:1/db_2"), "db_2");
    }
}
