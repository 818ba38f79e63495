//! The benchmark's figures (serialised as JSON for tracking across commits) and their Markdown
//! rendering: the reference table's shape first, then the detail behind each column.
//!
//! Pure data and formatting; `suite` fills it in.

use serde::{Deserialize, Serialize};

use crate::compare::CompareResults;
use crate::cost_growth::CostGrowth;
use crate::cpu::CpuSplit;
pub use crate::figures::{
    drain_cell, drain_run_cells, int, load_average, median, ms, or_dash, ratio, us_per_msg, Drain,
    LatencyMs, LatencyRun,
};
use crate::independent::{BareBrokerLimit, WalsenderLimit};
use crate::recovery::Recovery;
use crate::setups::SetupDrains;

/// The relay setups the reference compares.
pub const MODES: [&str; 3] = ["1 polling worker", "5 polling workers", "WAL reader"];

/// Read back by `outbox-bench charts` (crate::charts); `serde(default)` here and on the
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Results {
        let drain = Drain {
            rows: 200_000,
            transaction_rows: 1,
            received: 200_000,
            seconds: 10.0,
            msgs_per_sec: 20_000.0,
            complete: true,
            cpu_seconds: 4.0,
            cpu_seconds_per_100k: 2.0,
            peak_rss_mib: 20.5,
            pg_cpu_seconds: None,
            cpu: Some(CpuSplit {
                messages: 200_000,
                relay_us: Some(20.0),
                walsender_us: Some(12.5),
                rabbitmq_us: Some(40.0),
                bench_us: None,
            }),
            payload_bytes: None,
        };
        let latency = LatencyMs {
            samples: 100,
            avg: 1.2,
            p50: 1.0,
            p99: 4.0,
            max: 9.0,
            percentiles: Vec::new(),
        };
        let mut results = Results {
            scale: Scale {
                name: "full".into(),
                drain_rows: 200_000,
                latency_rate: 100,
                load_writers: 100,
                max_in_flight: 1024,
                crash_rows: 200_000,
                ..Scale::default()
            },
            limits: Limits {
                broker: vec![BrokerLimit {
                    window: 1024,
                    messages: 1000,
                    confirmed_per_sec: 21_000.0,
                    received_per_sec: 20_500.0,
                }],
                broker_latency: Some(LatencyMs {
                    samples: 100,
                    avg: 0.8,
                    p50: 0.8,
                    p99: 1.0,
                    max: 2.0,
                    percentiles: Vec::new(),
                }),
                broker_latency_rate: 100,
                decode: Some(DecodeLimit {
                    rows: 1000,
                    rows_per_sec: 80_000.0,
                    method: "m".into(),
                }),
                bare_broker: Some(BareBrokerLimit {
                    window: 1024,
                    messages: 1000,
                    consumer: true,
                    confirmed_per_sec: 25_000.0,
                    received_per_sec: Some(24_000.0),
                    cpu: Some(CpuSplit {
                        messages: 1000,
                        rabbitmq_us: Some(30.0),
                        bench_us: Some(8.0),
                        ..CpuSplit::default()
                    }),
                }),
                bare_broker_no_consumer: Some(BareBrokerLimit {
                    window: 1024,
                    messages: 1000,
                    consumer: false,
                    confirmed_per_sec: 30_000.0,
                    received_per_sec: None,
                    cpu: None,
                }),
                walsender: Some(WalsenderLimit {
                    rows: 1000,
                    seconds: 0.05,
                    rows_per_sec: 21_000.0,
                    method: "pg_recvlogical".into(),
                }),
                ..Limits::default()
            },
            ..Results::default()
        };
        for mode in MODES {
            results.modes.push(ModeResults {
                mode: mode.into(),
                drain: Some(drain.clone()),
                drain_batched: Some(Drain {
                    complete: false,
                    received: 1500,
                    seconds: 60.0,
                    ..drain.clone()
                }),
                latency: Some(LatencyRun {
                    rate: 100,
                    rows: 100,
                    missing: 0,
                    latency: Some(latency.clone()),
                }),
                load: None,
                crash: Some(Crash {
                    rows: 200_000,
                    received_before_kill: 90_000,
                    lost: 0,
                    duplicates: 1200,
                    duplicate_bound: Some(3000),
                }),
            });
        }
        results
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(int(0.0), "0");
        assert_eq!(int(999.4), "999");
        assert_eq!(int(1234.0), "1,234");
        assert_eq!(int(1_234_567.0), "1,234,567");
        assert_eq!(int(-4536.0), "-4,536");
    }

    #[test]
    fn the_table_has_a_row_per_mode_and_every_column() {
        let text = sample().markdown();
        let header = text
            .lines()
            .find(|l| l.starts_with("| Setup | MPS"))
            .expect("header");
        let columns = header.matches('|').count();
        for mode in MODES {
            let row = text
                .lines()
                .find(|l| l.starts_with(&format!("| {mode} | 20,000")))
                .expect(mode);
            assert_eq!(row.matches('|').count(), columns, "{row}");
            // 20,000 of min(20,500, 80,000) and the incomplete batched drain says how far it got.
            assert!(row.contains("| 98 % |"), "{row}");
            assert!(row.contains("1,500 of 200,000 in 60 s"), "{row}");
            assert!(
                row.contains("| 1.20 ms |") && row.contains("20.5 MiB"),
                "{row}"
            );
        }
        assert!(
            text.contains("| Broker alone, relay's publisher, window 1,024 (1,000 msgs) |"),
            "{text}"
        );
        assert!(
            text.contains(
                "| Broker alone, minimal publisher (bare lapin, no relay code), window 1,024, \
                 consumer attached (1,000 msgs) | 24,000 msgs/s received (25,000 confirmed) |"
            ),
            "{text}"
        );
        assert!(
            text.contains("no consumer (1,000 msgs) | 30,000 msgs/s confirmed |"),
            "{text}"
        );
        assert!(
            text.contains(
                "| Walsender ceiling (pg_recvlogical), 1,000 single-row txns | 21,000 rows/s |"
            ),
            "{text}"
        );
    }

    #[test]
    fn targets_say_met_and_missed() {
        let results = sample();
        let targets = results.targets();
        let find = |prefix: &str| {
            targets
                .iter()
                .find(|(_, t)| t.starts_with(prefix))
                .map(|(met, _)| *met)
        };
        assert_eq!(find("drain ≥ 90 % of broker alone"), Some(true));
        // 20,000 of min(24,000, 21,000): the walsender is the lower.
        let independent = targets
            .iter()
            .find(|(_, t)| t.contains("lower independent limit"))
            .expect("the independent limits' target");
        assert!(independent.0, "{independent:?}");
        assert!(
            independent
                .1
                .ends_with("= walsender ceiling: 20,000 of 21,000 = 95 %"),
            "{independent:?}"
        );
        // 1.0 vs 0.8 ms is 1.25×; 4.0 vs 1.0 ms is 4×.
        assert_eq!(find("p50 ≤ 1.5×"), Some(true));
        assert_eq!(find("p99 ≤ 3×"), Some(false));
        assert_eq!(find("crash: zero lost"), Some(true));
        assert_eq!(find("crash duplicates below"), Some(true));
        assert_eq!(find("peak RSS"), Some(true));
        let cpu = targets
            .iter()
            .find(|(_, t)| t.starts_with("relay CPU per message ≤ 0.2 × RabbitMQ's"))
            .expect("the CPU ratio's target");
        assert!(!cpu.0, "{cpu:?}");
        assert!(cpu.1.ends_with("20.0 of 40.0 µs = 0.50×"), "{cpu:?}");
    }

    #[test]
    fn consumer_pairs_put_the_median_on_the_independent_target() {
        let mut results = sample();
        let broker = |received: f64| BareBrokerLimit {
            received_per_sec: Some(received),
            ..results.limits.bare_broker.clone().expect("in the sample")
        };
        let pair = |round: u32, drain: f64, broker: BareBrokerLimit| PublisherPair {
            round,
            relay_first: round % 2 == 1,
            drain: Drain {
                msgs_per_sec: drain,
                ..Drain::default()
            },
            broker,
        };
        // Each over the lower of its publisher and the walsender ceiling (21,000): 18,000 of
        // 20,000, 19,000 of 21,000, 17,000 of 20,000.
        results.limits.consumer_pairs = vec![
            pair(1, 18_000.0, broker(20_000.0)),
            pair(2, 19_000.0, broker(23_000.0)),
            pair(3, 17_000.0, broker(20_000.0)),
        ];
        let targets = results.targets();
        let independent: Vec<_> = targets
            .iter()
            .filter(|(_, t)| t.contains("lower independent limit"))
            .collect();
        assert_eq!(independent.len(), 1, "{targets:?}");
        assert!(independent[0].0, "{independent:?}");
        assert!(
            independent[0]
                .1
                .ends_with("median of 3 adjacent pairs with a consumer (90 %, 90 %, 85 %): 90 %"),
            "{independent:?}"
        );
        assert!(results.markdown().contains(
            "in adjacent pairs whose order alternates (msgs/s): 1, relay first: 18,000 of \
             20,000 = 90 %; 2, publisher first: 19,000 of 23,000 = 83 %;"
        ));
    }

    #[test]
    fn the_cluster_target_needs_both_no_consumer_runs_through_the_leader() {
        let mut cluster = cluster_sample();
        let results = |cluster: &ClusterResults| Results {
            cluster: Some(cluster.clone()),
            ..Results::default()
        };
        assert!(results(&cluster).targets().is_empty());
        cluster.drain_no_consumer = Some(Drain {
            msgs_per_sec: 9_300.0,
            ..Drain::default()
        });
        cluster.bare_broker_no_consumer = Some(BareBrokerLimit {
            window: 1024,
            messages: 200_000,
            consumer: false,
            confirmed_per_sec: 10_000.0,
            received_per_sec: None,
            cpu: None,
        });
        // An older run: the relay connected to any node, so the ratio measured placement.
        assert!(results(&cluster).targets().is_empty());
        cluster.no_consumer_node = Some(0);
        let targets = results(&cluster).targets();
        assert_eq!(
            targets,
            vec![(
                true,
                "3-node cluster, no consumer, both through the leader's node 0: drain ≥ 90 % of \
                 the minimal publisher: 9,300 of 10,000 = 93 %"
                    .to_string()
            )]
        );
        assert!(results(&cluster)
            .markdown()
            .contains("- met: 3-node cluster, no consumer"));
        // With pairs, the median of their ratios: 0.93, 0.80 and 0.85.
        let pair = |round: u32, drain: f64| PublisherPair {
            round,
            relay_first: round % 2 == 1,
            drain: Drain {
                msgs_per_sec: drain,
                ..Drain::default()
            },
            broker: cluster.bare_broker_no_consumer.clone().expect("set above"),
        };
        cluster.no_consumer_pairs = vec![pair(1, 9_300.0), pair(2, 8_000.0), pair(3, 8_500.0)];
        let targets = results(&cluster).targets();
        assert_eq!(targets.len(), 1);
        assert!(!targets[0].0, "{targets:?}");
        assert!(
            targets[0]
                .1
                .ends_with("median of 3 pairs (93 %, 80 %, 85 %): 85 %"),
            "{targets:?}"
        );
        let text = results(&cluster).markdown();
        assert!(
            text.contains("1, relay first: 9,300 of 10,000 = 93 %; 2, publisher first: 8,000 of"),
            "{text}"
        );
        // Pairs through a follower are reported beside them, and are no target.
        cluster.follower_node = Some(1);
        cluster.follower_pairs = vec![pair(1, 7_000.0), pair(2, 6_000.0)];
        assert_eq!(results(&cluster).targets(), targets);
        let text = results(&cluster).markdown();
        assert!(
            text.contains(
                "through the follower node 1, which forwards every publish to the leader \
                 (msgs/s): 1, relay first: 7,000 of 10,000 = 70 %; 2, publisher first: 6,000 of \
                 10,000 = 60 %; median 70 %."
            ),
            "{text}"
        );
    }

    fn cluster_sample() -> ClusterResults {
        ClusterResults {
            nodes: 3,
            queue_type: "quorum".into(),
            declared_through: 0,
            leader_node: 0,
            window: 1024,
            drain: Drain {
                rows: 200_000,
                received: 200_000,
                msgs_per_sec: 3_000.0,
                complete: true,
                ..Drain::default()
            },
            drain_relay_nodes: vec![2],
            broker: BrokerLimit {
                window: 1024,
                messages: 200_000,
                confirmed_per_sec: 4_100.0,
                received_per_sec: 4_000.0,
            },
            broker_publisher_node: 2,
            latency: LatencyRun {
                rate: 100,
                rows: 3000,
                missing: 0,
                latency: Some(LatencyMs {
                    samples: 3000,
                    avg: 5.0,
                    p50: 4.0,
                    p99: 12.0,
                    max: 20.0,
                    percentiles: Vec::new(),
                }),
            },
            latency_relay_nodes: vec![1, 2],
            broker_latency: Some(LatencyMs {
                samples: 3000,
                avg: 3.0,
                p50: 2.0,
                p99: 8.0,
                max: 10.0,
                percentiles: Vec::new(),
            }),
            broker_latency_publisher_node: 1,
            broker_latency_rate: 100,
            startup_secs: 20.0,
            seconds: 200.0,
            ..ClusterResults::default()
        }
    }

    #[test]
    fn the_cluster_table_sets_each_figure_beside_the_broker_alone() {
        let mut results = sample();
        results.cluster = Some(cluster_sample());
        let text = results.markdown();
        let row = text
            .lines()
            .find(|l| l.starts_with("| 3-node cluster, quorum queue |"))
            .expect("cluster row");
        assert_eq!(
            row,
            "| 3-node cluster, quorum queue | 3,000 | 4,000 | 75 % | 4.00 ms | 2.00 ms | 2.00× \
             | 12 ms | 8.00 ms | 1.50× |"
        );
        // The single-node WAL reader of the same run, against its own broker alone.
        let single = text
            .lines()
            .find(|l| l.starts_with("| 1 node, classic queue (same run) |"))
            .expect("single-node row");
        assert!(
            single.contains("| 20,000 | 20,500 | 98 % | 1.00 ms | 0.80 ms | 1.25× |"),
            "{single}"
        );
        assert!(
            text.contains("connected to node 2 for the drain and nodes 1, 2 (in turn)"),
            "{text}"
        );
    }

    #[test]
    fn cluster_only_reports_only_the_cluster() {
        let results = Results {
            cluster: Some(cluster_sample()),
            ..Results::default()
        };
        let text = results.markdown();
        assert!(text.contains("### 3-node cluster, quorum queue"), "{text}");
        assert!(!text.contains("Reference table"), "{text}");
        assert!(!text.contains("classic queue"), "{text}");
        let json = serde_json::to_value(&results).expect("serialises");
        assert_eq!(json["cluster"]["broker"]["received_per_sec"], 4_000.0);
        assert_eq!(json["cluster"]["drain_relay_nodes"][0], 2);
    }

    fn drain_of(received: u64, msgs_per_sec: f64, cpu: f64, pg: f64) -> Drain {
        Drain {
            rows: received,
            transaction_rows: 1,
            received,
            seconds: received as f64 / msgs_per_sec,
            msgs_per_sec,
            complete: true,
            cpu_seconds: cpu,
            cpu_seconds_per_100k: cpu * 100_000.0 / received as f64,
            peak_rss_mib: 20.0,
            pg_cpu_seconds: Some(pg),
            cpu: None,
            payload_bytes: None,
        }
    }

    #[test]
    fn the_shards_sweep_sets_each_count_beside_the_broker_alone() {
        let run = |round, shards, mps, pg| ShardRun {
            round,
            shards,
            load: "4.00 4.50 5.00".into(),
            drain: drain_of(10_000, mps, 0.4, pg),
        };
        let broker = |received_per_sec| BrokerLimit {
            window: 1024,
            messages: 10_000,
            confirmed_per_sec: received_per_sec,
            received_per_sec,
        };
        let results = Results {
            scale: Scale {
                max_in_flight: 1024,
                ..Scale::default()
            },
            shards: vec![
                run(1, 1, 8_000.0, 0.05),
                run(1, 4, 7_000.0, 0.15),
                run(2, 4, 9_000.0, 0.16),
                run(2, 1, 6_000.0, 0.06),
                run(3, 1, 7_000.0, 0.07),
                run(3, 4, 8_000.0, 0.14),
            ],
            shards_broker: vec![broker(10_000.0), broker(9_000.0), broker(11_000.0)],
            ..Results::default()
        };
        let text = results.markdown();
        assert!(text.contains("### Sharded relays"), "{text}");
        assert!(!text.contains("Reference table"), "{text}");
        assert!(
            text.contains("10,000 · 9,000 · 11,000; median 10,000"),
            "{text}"
        );
        // Medians: 1 shard 7,000 msgs/s (70 %), 40 µs relay, 6 µs PostgreSQL; 4 shards 8,000,
        // 15 µs PostgreSQL.
        assert!(text.contains("| 1 | 7,000 | 70 % | 40.0 | 6.0 |"), "{text}");
        assert!(
            text.contains("| 4 | 8,000 | 80 % | 40.0 | 15.0 |"),
            "{text}"
        );
        let json = serde_json::to_value(&results).expect("serialises");
        assert_eq!(json["shards"][1]["shards"], 4);
    }

    #[test]
    fn the_emit_tables_give_medians_per_clients_and_variant() {
        let writer = |round, clients, variant: &str, events_per_sec, wal| EmitWriterRun {
            round,
            variant: variant.into(),
            clients,
            load: "1.00 1.00 1.00".into(),
            events: 1_000,
            seconds: 1.0,
            events_per_sec,
            wal_bytes_per_event: wal,
        };
        let drain = |round, variant: &str, mps| EmitDrainRun {
            round,
            variant: variant.into(),
            load: "1.00 1.00 1.00".into(),
            drain: drain_of(10_000, mps, 0.3, 0.1),
        };
        let results = Results {
            emit_writers: vec![
                writer(1, 10, "table insert", 5_000.0, 495.0),
                writer(1, 10, "outbox_emit", 6_000.0, 489.0),
                writer(2, 10, "outbox_emit", 4_000.0, 489.0),
                writer(2, 10, "table insert", 3_000.0, 497.0),
                writer(3, 10, "table insert", 4_000.0, 496.0),
                writer(3, 10, "outbox_emit", 5_000.0, 490.0),
            ],
            emit_drains: vec![
                drain(1, "table insert", 6_000.0),
                drain(1, "outbox_emit", 7_000.0),
            ],
            ..Results::default()
        };
        let text = results.markdown();
        assert!(
            text.contains("### Writers: table insert against outbox_emit"),
            "{text}"
        );
        assert!(
            text.contains("| 10 | outbox_emit | 5,000 | 489 |"),
            "{text}"
        );
        assert!(
            text.contains("| 10 | table insert | 4,000 | 496 |"),
            "{text}"
        );
        assert!(
            text.contains("| outbox_emit | 7,000 | 30.0 | 10.0 |"),
            "{text}"
        );
        assert!(!text.contains("Reference table"), "{text}");
    }

    #[test]
    fn the_cpu_split_has_a_row_per_drain_and_limit() {
        let text = sample().markdown();
        assert!(text.contains("### CPU split, µs per message"), "{text}");
        assert!(
            text.contains(
                "| WAL reader: drain, single-row txns | 200,000 | 20.0 | 12.5 | 40.0 | — | 72.5 |"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "| Broker alone, minimal publisher, window 1,024, consumer attached | 1,000 | — | — | 30.0 | 8.0 | 38.0 |"
            ),
            "{text}"
        );
        // A run that measured no split has no table.
        assert!(!Results::default().markdown().contains("CPU split"));
    }

    #[test]
    fn json_has_the_same_figures() {
        let json = serde_json::to_value(sample()).expect("serialises");
        assert_eq!(json["modes"][2]["mode"], "WAL reader");
        assert_eq!(json["modes"][2]["drain"]["msgs_per_sec"], 20_000.0);
        assert_eq!(json["limits"]["broker"][0]["window"], 1024);
        assert_eq!(json["limits"]["bare_broker"]["received_per_sec"], 24_000.0);
        assert_eq!(json["limits"]["bare_broker"]["cpu"]["rabbitmq_us"], 30.0);
        assert_eq!(json["limits"]["bare_broker_no_consumer"]["consumer"], false);
        assert_eq!(json["limits"]["walsender"]["rows_per_sec"], 21_000.0);
        assert_eq!(json["modes"][2]["drain"]["cpu"]["walsender_us"], 12.5);
    }
}
