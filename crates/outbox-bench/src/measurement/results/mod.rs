//! The benchmark's figures (serialised as JSON for tracking across commits): what a run
//! records, per scenario.
//!
//! Pure data; `suite` fills it in, [`crate::report`] renders it (the Markdown: the reference
//! table's shape first, then the detail behind each column).

use serde::{Deserialize, Serialize};

pub mod compare;
pub mod cost_growth;
pub mod recovery;

use crate::measurement::cpu::CpuSplit;
pub use crate::measurement::figures::{
    drain_cell, drain_run_cells, int, load_average, median, ms, or_dash, ratio, us_per_msg, Drain,
    LatencyMs, LatencyRun,
};
use crate::measurement::independent::{BareBrokerLimit, WalsenderLimit};
use crate::measurement::results::compare::CompareResults;
use crate::measurement::results::cost_growth::CostGrowth;
use crate::measurement::results::recovery::Recovery;
use crate::scenarios::setups::SetupDrains;

/// The relay setups the reference compares.
pub const MODES: [&str; 3] = ["1 polling worker", "5 polling workers", "WAL reader"];

/// Read back by `outbox-bench charts` (crate::report::charts); `serde(default)` here and on the
/// sections that grew over time lets a file written before a field existed still be read.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Results {
    pub machine: Machine,
    pub scale: Scale,
    /// One per entry of [`MODES`], in that order.
    pub modes: Vec<ModeResults>,
    pub notify: Option<NotifyResults>,
    pub limits: Limits,
    pub sweep: Vec<SweepRow>,
    /// `--ab-with`: the WAL drain of two relay binaries, alternated (the suite is not run).
    pub ab: Vec<AbRun>,
    /// `--cluster` / `--cluster-only`: the WAL reader through a 3-node cluster.
    pub cluster: Option<ClusterResults>,
    /// `--shards-sweep`: drains with N sharded relays (the suite is not run).
    pub shards: Vec<ShardRun>,
    /// `--shards-sweep`: the broker alone at the relays' window, once per round.
    pub shards_broker: Vec<BrokerLimit>,
    /// `--emit`: writers inserting rows against writers calling `outbox_emit`.
    pub emit_writers: Vec<EmitWriterRun>,
    /// `--emit`: the WAL relay's drain of a backlog of rows and of emitted events.
    pub emit_drains: Vec<EmitDrainRun>,
    /// `--compare`: drains of setups of one relay binary (the suite is not run).
    pub compare: Option<CompareResults>,
    /// The suite's drain of every setup, consumer attached and none.
    pub setups: Option<SetupDrains>,
    /// `--cost-growth`: drains by shard count, payload size and broker (the suite is not run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_growth: Option<CostGrowth>,
    /// `--recovery-rounds`: times to stream again after a broker node or the primary is lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery: Option<Recovery>,
}

/// One drain of `--shards-sweep`: `shards` relays, one per shard, into one queue; the drain's
/// CPU is all relays' together, its peak RSS the largest relay's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardRun {
    pub round: u32,
    pub shards: u32,
    /// /proc/loadavg when the drain started (1, 5, 15 minutes).
    pub load: String,
    pub drain: Drain,
}

/// One writer run of `--emit`: one event per transaction, no relay running.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EmitWriterRun {
    pub round: u32,
    /// `table insert` or `outbox_emit`.
    pub variant: String,
    pub clients: u32,
    pub load: String,
    pub events: u64,
    /// From the first `BEGIN` to the last commit.
    pub seconds: f64,
    pub events_per_sec: f64,
    /// WAL written during the run (pg_current_wal_lsn) over the events committed.
    pub wal_bytes_per_event: f64,
}

/// One drain of `--emit`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EmitDrainRun {
    pub round: u32,
    pub variant: String,
    pub load: String,
    pub drain: Drain,
}

/// The cluster section: the WAL reader through a 3-node RabbitMQ cluster
/// (`pause_minority`) into a quorum queue, beside the broker alone on the same cluster, in
/// the same placement, in the same run. Nodes are the cluster's indexes (0, 1, 2).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClusterResults {
    pub nodes: usize,
    pub queue_type: String,
    /// The node every queue was declared through (its consumer connects there).
    pub declared_through: usize,
    /// The leader of a probe quorum queue declared through that node (RabbitMQ places a new
    /// quorum queue's leader on the declaring connection's node).
    pub leader_node: usize,
    /// The relay's --max-in-flight and the broker alone's window.
    pub window: u32,
    /// Backlog of single-row transactions (the scale's drain rows).
    pub drain: Drain,
    /// The nodes the relay connected to during the drain, in order (it gets all URLs).
    pub drain_relay_nodes: Vec<usize>,
    pub broker: BrokerLimit,
    /// The node the broker-alone publisher used: the drain relay's.
    pub broker_publisher_node: usize,
    pub latency: LatencyRun,
    pub latency_relay_nodes: Vec<usize>,
    /// Publish→consumer at `broker_latency_rate`, publishing through the latency relay's node.
    pub broker_latency: Option<LatencyMs>,
    pub broker_latency_publisher_node: usize,
    pub broker_latency_rate: u32,
    /// The WAL drain with no consumer (absent in files from before the drains of every setup),
    /// its relay's nodes, and the broker alone with the minimal publisher (through
    /// `broker_publisher_node`, the queue declared through `declared_through`), consumer
    /// attached and none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_no_consumer: Option<Drain>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drain_no_consumer_relay_nodes: Vec<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bare_broker: Option<BareBrokerLimit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bare_broker_no_consumer: Option<BareBrokerLimit>,
    /// The node both the consumer-less drain's relay (given only its URL) and the minimal
    /// publisher without a consumer went through: the queue's leader. Absent in files from
    /// before 2026-12-04, whose consumer-less relay picked a node at random and whose
    /// publisher went through `broker_publisher_node`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_consumer_node: Option<usize>,
    /// With `--cluster-rounds` above 1, every pair of the consumer-less runs, the first being
    /// `drain_no_consumer` and `bare_broker_no_consumer`; empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_consumer_pairs: Vec<PublisherPair>,
    /// With `--cluster-follower-pairs`: the follower both sides of `follower_pairs` went
    /// through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follower_node: Option<usize>,
    /// The same consumer-less pairs through `follower_node`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub follower_pairs: Vec<PublisherPair>,
    /// Starting the cluster (boot, join, check).
    pub startup_secs: f64,
    /// The whole section, the cluster's start included.
    pub seconds: f64,
}

/// One pair of runs in the same placement, adjacent: the relay's WAL drain and the minimal
/// publisher, both with a consumer or both without (the cluster's consumer-less pairs go
/// through the queue leader's node).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PublisherPair {
    pub round: u32,
    /// The relay's drain ran before the minimal publisher's.
    pub relay_first: bool,
    pub drain: Drain,
    pub broker: BareBrokerLimit,
}

impl PublisherPair {
    /// The drain's rate over the publisher's: arrivals with a consumer, confirms without.
    pub fn ratio(&self) -> f64 {
        self.drain.msgs_per_sec / self.broker.rate()
    }
}

fn wal_setup() -> String {
    "wal".into()
}

/// One drain of an A/B.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AbRun {
    /// What was drained: `wal`, or `poll5` (5 polling workers, default batch). Files from
    /// before `--ab-setup` have none: their A/Bs drained the WAL reader.
    #[serde(default = "wal_setup")]
    pub setup: String,
    pub binary: String,
    pub round: u32,
    pub drain: Drain,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Machine {
    pub cores: usize,
    pub memory_mib: u64,
    pub kernel: String,
    pub postgres: String,
    pub postgres_settings: Vec<(String, String)>,
    pub rabbitmq: String,
    pub relay_commit: String,
    pub started_at: String,
    /// /proc/loadavg when the run started.
    pub load_average: String,
    /// With `--pin-broker`: which CPUs RabbitMQ and everything else ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinning: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Scale {
    pub name: String,
    pub drain_rows: u64,
    pub drain_window_secs: u64,
    pub latency_rate: u32,
    pub latency_secs: u64,
    pub load_writers: u32,
    pub load_secs: u64,
    pub crash_rows: u64,
    pub sweep_rows: u64,
    pub max_in_flight: u32,
    pub status_interval_ms: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ModeResults {
    pub mode: String,
    /// Backlog of single-row transactions.
    pub drain: Option<Drain>,
    /// The same backlog in 1,000-row transactions.
    pub drain_batched: Option<Drain>,
    pub latency: Option<LatencyRun>,
    pub load: Option<LoadRun>,
    pub crash: Option<Crash>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoadRun {
    pub writers: u32,
    pub seconds: u64,
    pub committed: u64,
    pub orders_per_sec: f64,
    /// Committed rows the consumer had not received when the wait ended.
    pub missing: u64,
    pub latency: Option<LatencyMs>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Crash {
    pub rows: u64,
    /// Distinct messages received when the relay was killed.
    pub received_before_kill: u64,
    pub lost: u64,
    pub duplicates: u64,
    /// WAL mode's bound: max_in_flight + rate × status interval + open transaction rows.
    pub duplicate_bound: Option<u64>,
}

/// Writer throughput at 100 concurrent writers: no relay (the ceiling), a trigger sending
/// NOTIFY inside every transaction, and NOTIFY sent after each commit (both with poll --listen).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NotifyResults {
    pub ceiling: LoadRun,
    pub trigger: LoadRun,
    pub after_commit: LoadRun,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Broker alone at each window of the sweep (and the default).
    pub broker: Vec<BrokerLimit>,
    pub broker_latency: Option<LatencyMs>,
    pub broker_latency_rate: u32,
    pub decode: Option<DecodeLimit>,
    /// The CPU split of the broker alone through the relay's publisher at --max-in-flight.
    pub broker_cpu: Option<CpuSplit>,
    /// Broker alone with a minimal publisher (no relay code) at --max-in-flight, the
    /// consumer attached.
    pub bare_broker: Option<BareBrokerLimit>,
    /// The same with no consumer: confirms per second.
    pub bare_broker_no_consumer: Option<BareBrokerLimit>,
    /// pg_recvlogical streaming a backlog of single-row transactions.
    pub walsender: Option<WalsenderLimit>,
    /// `--single-node-pairs`: the WAL drain and the minimal publisher, consumer attached, in
    /// adjacent pairs whose order alternates.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub consumer_pairs: Vec<PublisherPair>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BrokerLimit {
    pub window: u32,
    pub messages: u64,
    pub confirmed_per_sec: f64,
    pub received_per_sec: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DecodeLimit {
    pub rows: u64,
    pub rows_per_sec: f64,
    pub method: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SweepRow {
    pub window: u32,
    pub drain_msgs_per_sec: f64,
    pub p99_ms: Option<f64>,
    pub crash_lost: u64,
    pub crash_duplicates: u64,
    pub duplicate_bound: u64,
    pub broker_msgs_per_sec: f64,
}

impl Limits {
    pub fn broker_at(&self, window: u32) -> Option<&BrokerLimit> {
        self.broker.iter().find(|b| b.window == window)
    }

    pub fn best_broker(&self) -> Option<f64> {
        self.broker
            .iter()
            .map(|b| b.received_per_sec)
            .reduce(f64::max)
    }

    /// The lower of the two limits that share no code with the relay, and its name: the
    /// minimal publisher with the consumer attached, and the walsender ceiling.
    pub fn independent(&self) -> Option<(f64, &'static str)> {
        let broker = self
            .bare_broker
            .as_ref()
            .map(|b| (b.rate(), "broker alone, minimal publisher"));
        let walsender = self
            .walsender
            .as_ref()
            .map(|w| (w.rows_per_sec, "walsender ceiling"));
        match (broker, walsender) {
            (Some(b), Some(w)) => Some(if w.0 < b.0 { w } else { b }),
            (b, w) => b.or(w),
        }
    }

    /// The lower of broker-alone at `window` and decoding alone: what a relay could reach.
    pub fn lower(&self, window: u32) -> Option<f64> {
        let broker = self.broker_at(window).map(|b| b.received_per_sec);
        let decode = self.decode.as_ref().map(|d| d.rows_per_sec);
        match (broker, decode) {
            (Some(b), Some(d)) => Some(b.min(d)),
            (b, d) => b.or(d),
        }
    }
}
