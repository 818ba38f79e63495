//! `outbox-bench bench --recovery-rounds N`: how long the relay takes to stream again after a
//! fault, each time with the conditions it was measured under, beside the 10 s target. The
//! integration tests (tests/cluster.rs, tests/failover.rs) assert recovery, not its time: a
//! bound on a busy 2-core CI machine fails on load, not on the relay, so the figure lives here.
//!
//! - **Broker node lost**: kill -9 of the RabbitMQ node the WAL relay publishes through, in a
//!   3-node cluster with a quorum queue, under a writer load with a backlog behind it.
//! - **PostgreSQL failover**: the primary stopped (immediate) and its standby, holding a
//!   synchronized copy of the relay's failover slot, promoted; the relay follows through a
//!   multi-host URL.
//!
//! Each round also checks that every committed row arrived (a loss fails the run) and counts
//! duplicates. This module is the figures; their Markdown is [`crate::report::recovery`];
//! `suite::recovery_runs` runs them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The bound the tests asserted on the time from the fault (PostgreSQL: the promotion) to the
/// relay's next streaming session.
pub const TARGET: Duration = Duration::from_secs(10);

/// The figures of `--recovery-rounds`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Recovery {
    pub rounds: u32,
    pub target_secs: f64,
    pub broker_node: Option<Scenario>,
    pub pg_failover: Option<Scenario>,
    /// Starting the cluster (0 when the cluster section had started it already).
    pub cluster_startup_secs: f64,
    /// The whole section.
    pub seconds: f64,
}

/// Which fault a scenario is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// kill -9 of the relay's RabbitMQ node; times run from the signal.
    #[default]
    BrokerNode,
    /// The primary stopped, the standby promoted; times run from the promotion's end.
    PgFailover,
}

impl Fault {
    pub(crate) fn title(self) -> &'static str {
        match self {
            Fault::BrokerNode => {
                "RabbitMQ node lost under load: kill -9 of the relay's node, 3-node cluster, \
                 quorum queue"
            }
            Fault::PgFailover => {
                "PostgreSQL failover: primary stopped (immediate), standby with the synchronized \
                 failover slot promoted"
            }
        }
    }

    /// What the times are counted from.
    pub(crate) fn start(self) -> &'static str {
        match self {
            Fault::BrokerNode => "Kill",
            Fault::PgFailover => "Promotion",
        }
    }

    /// The tests that check the same recovery for loss and repeats, not for its time.
    pub(crate) fn checked_by(self) -> &'static str {
        match self {
            Fault::BrokerNode => "tests/cluster.rs, c2",
            Fault::PgFailover => "tests/failover.rs, f1 and f2",
        }
    }
}

/// One scenario's rounds and what they ran under.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Scenario {
    pub fault: Fault,
    pub conditions: Conditions,
    pub rounds: Vec<Round>,
}

/// The conditions of every round of a scenario.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Conditions {
    /// e.g. "3-node cluster (RabbitMQ 4.0), quorum queue led by node 0".
    pub broker: String,
    /// How the relay reaches the servers, e.g. "a multi-host URL (primary, standby)".
    pub route: String,
    /// `SHOW server_version` of the relay's PostgreSQL.
    pub postgres: String,
    /// `SHOW wal_sender_timeout` there.
    pub wal_sender_timeout: String,
    /// The relay's `--peer-timeout` (its default) and the AMQP heartbeat it derives from it.
    pub peer_timeout_secs: u64,
    pub amqp_heartbeat_secs: u64,
    /// The relay's flags, as run.
    pub max_in_flight: u32,
    pub max_backoff_secs: u64,
    pub status_interval_ms: u64,
    /// Rows committed before the relay's fault run, for a full window at the fault.
    pub backlog_rows: u64,
    /// The writers committing throughout: connections, rows per transaction (1 to this), pause
    /// between transactions.
    pub writers: u32,
    pub writer_txn_rows: u32,
    pub writer_pause_ms: u64,
}

/// One round.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Round {
    pub round: u32,
    /// The load average when the round began.
    pub load: String,
    /// What the fault hit and where the relay went, e.g. "node 1 (follower) → node 2".
    pub fault: String,
    /// `outbox_relay_messages_in_flight` just before the fault.
    pub in_flight_at_fault: Option<f64>,
    /// Rows committed and not yet at the consumer at the fault: what the row written at the
    /// start waits behind.
    pub undelivered_at_fault: Option<u64>,
    /// The writers' rows per second: over the whole round (the broker scenario), from their
    /// start to the fault (PostgreSQL, whose outage stops them).
    pub writer_rows_per_sec: f64,
    /// PostgreSQL: from stopping the primary to the end of the promotion.
    pub fault_to_start_secs: Option<f64>,
    /// From the start (the kill, or the promotion) to the relay's next streaming session.
    pub streaming_secs: f64,
    /// … to the first confirm after it (`outbox_relay_messages_confirmed_total` growing).
    pub first_confirm_secs: Option<f64>,
    /// … until a row committed at the start had reached the consumer (behind whatever the
    /// relay had not delivered yet).
    pub delivered_secs: Option<f64>,
    /// Rows committed (the broker scenario: the `test_decoding` oracle; PostgreSQL: the rows
    /// on the new primary).
    pub rows: u64,
    pub lost: u64,
    pub duplicates: u64,
    /// Deliveries of rows that are not among `rows` (PostgreSQL: phantom events).
    pub unexpected: u64,
    /// Bringing the killed node back afterwards (the broker scenario).
    pub restore_secs: Option<f64>,
}

impl Round {
    pub fn met(&self, target: f64) -> bool {
        self.streaming_secs <= target
    }
}
