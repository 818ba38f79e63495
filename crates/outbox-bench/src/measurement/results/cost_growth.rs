//! `outbox-bench bench --cost-growth`: how a drain's cost grows, in one run on the same
//! servers: with 1, 2 and 4 sharded relays on one node, with larger payloads (about 1 KiB and
//! 16 KiB) through one relay, and with 1, 2 and 4 shards through a 3-node cluster's quorum
//! queue. Each drain records every process's CPU per message, because the rate alone hides
//! where the cost goes: each shard's walsender decodes the whole WAL (docs/scaling.md), so N
//! shards cost about N× decoding on the database even when the rate does not move.
//!
//! This module is the figures; their Markdown is [`crate::report::cost_growth`];
//! `suite::cost_growth_runs` runs them.

use serde::{Deserialize, Serialize};

use crate::measurement::cpu::CpuSplit;
use crate::measurement::figures::{int, median, us_per_msg, Drain};

/// The three parts of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostPart {
    /// One RabbitMQ node, N sharded relays, the default order (~240 bytes of JSON).
    Shards,
    /// One RabbitMQ node, one relay, payloads of a given size.
    Payload,
    /// The 3-node cluster (quorum queue), N sharded relays, the default order (~240 bytes of JSON).
    Cluster,
}

impl CostPart {
    /// Where the part's drains ran, as the CPU chart names them.
    pub fn place(self) -> &'static str {
        match self {
            CostPart::Shards | CostPart::Payload => "1 node",
            CostPart::Cluster => "3-node cluster",
        }
    }
}

/// The figures of `--cost-growth`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct CostGrowth {
    /// Backlog of single-row transactions each drain starts with.
    pub rows: u64,
    /// The relays' --max-in-flight and the broker alone's window.
    pub window: u32,
    pub rounds: u32,
    /// `--cost-growth-shards`, in the order given.
    pub shard_counts: Vec<u32>,
    /// `--cost-growth-payloads`: the payload sizes asked for, bytes of JSON text.
    pub payloads: Vec<u32>,
    /// Every drain, in the order run.
    pub runs: Vec<CostRun>,
    /// The broker alone (the relay's publisher code, no PostgreSQL), once per round and body
    /// size, on the single node.
    pub brokers: Vec<CostBroker>,
    /// The cluster part's cluster; None when it did not run.
    pub cluster: Option<CostCluster>,
    /// Why the cluster part did not run (e.g. `--no-cluster`).
    pub cluster_skipped: Option<String>,
    /// Per setup, part by part: the medians the Markdown shows.
    pub summary: Vec<CostSummary>,
    /// The whole run, the cluster's start included.
    pub seconds: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CostCluster {
    pub nodes: usize,
    /// The node leading the queues (declared through it; the relays were given only its URL).
    pub leader_node: usize,
    pub startup_secs: f64,
}

/// One drain.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostRun {
    pub part: CostPart,
    pub round: u32,
    /// Relays, one per shard.
    pub shards: u32,
    /// The payload size asked for (bytes of JSON text); None: the default order (~240 bytes of JSON). The size
    /// reached is `drain.payload_bytes`.
    pub payload_bytes: Option<u32>,
    /// /proc/loadavg when the drain started.
    pub load: String,
    pub drain: Drain,
}

/// The broker alone in one round at one body size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostBroker {
    pub part: CostPart,
    pub round: u32,
    /// As [`CostRun::payload_bytes`].
    pub payload_bytes: Option<u32>,
    /// The body's length (the middle message's).
    pub body_bytes: u64,
    pub load: String,
    pub messages: u64,
    pub received_per_sec: f64,
    pub confirmed_per_sec: f64,
    /// RabbitMQ's and outbox-bench's (publisher and consumer) CPU per message.
    pub cpu: CpuSplit,
}

/// One setup's medians over its rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostSummary {
    pub part: CostPart,
    pub setup: String,
    pub shards: u32,
    pub payload_bytes: Option<u32>,
    /// The median of the backlogs' average payload sizes.
    pub avg_payload_bytes: Option<f64>,
    /// Each round's drain rate, in round order.
    pub msgs_per_sec: Vec<f64>,
    pub median_msgs_per_sec: f64,
    /// The median over the broker alone's median at the same body size (single node only).
    pub ratio_to_broker: Option<f64>,
    /// All relays together.
    pub relay_us_per_msg: Option<f64>,
    /// Every shard's walsender together.
    pub walsender_us_per_msg: Option<f64>,
    /// The walsender's median over its baseline's: the part's smallest shard count, or for a
    /// payload the single node's one relay with the default order (~240 bytes of JSON).
    pub walsender_growth: Option<f64>,
    /// The postmaster and every backend, walsenders included.
    pub pg_us_per_msg: Option<f64>,
    /// Every node of the broker.
    pub rabbitmq_us_per_msg: Option<f64>,
    /// The median of each round's relay CPU over RabbitMQ's.
    pub relay_per_rabbitmq: Option<f64>,
    /// Every round delivered the whole backlog within the drain window.
    pub complete: bool,
}

/// One drain's CPU figures, µs per message (None: not read).
pub struct Figures {
    pub(crate) relay: Option<f64>,
    pub(crate) walsender: Option<f64>,
    pub(crate) pg: Option<f64>,
    pub(crate) rabbitmq: Option<f64>,
}

impl Figures {
    pub fn of(d: &Drain) -> Figures {
        let split = d.cpu.as_ref();
        Figures {
            relay: (d.received > 0).then(|| us_per_msg(d.cpu_seconds, d)),
            walsender: split.and_then(|c| c.walsender_us),
            pg: d.pg_cpu_seconds.map(|s| us_per_msg(s, d)),
            rabbitmq: split.and_then(|c| c.rabbitmq_us),
        }
    }

    /// The relays' CPU over RabbitMQ's, as [`CpuSplit::relay_per_rabbitmq`] gives it.
    pub fn relay_per_rabbitmq(&self) -> Option<f64> {
        CpuSplit {
            relay_us: self.relay,
            rabbitmq_us: self.rabbitmq,
            ..CpuSplit::default()
        }
        .relay_per_rabbitmq()
    }
}

/// The median of the values that were read; None if none was.
pub(crate) fn median_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let read: Vec<f64> = values.flatten().collect();
    (!read.is_empty()).then(|| median(read))
}

/// How a setup is named in the report.
pub(crate) fn setup_name(part: CostPart, shards: u32, payload_bytes: Option<u32>) -> String {
    match (part, payload_bytes) {
        (CostPart::Payload, Some(bytes)) => format!("1 relay, {} B payload", int(f64::from(bytes))),
        _ if shards == 1 => "1 shard".into(),
        _ => format!("{shards} shards"),
    }
}

pub(crate) fn broker_name(payload_bytes: Option<u32>) -> String {
    match payload_bytes {
        Some(bytes) => format!("broker alone, {} B payload", int(f64::from(bytes))),
        None => "broker alone".into(),
    }
}

impl CostGrowth {
    /// The setups of `part` in the order given: (shards, payload asked for).
    fn setups(&self, part: CostPart) -> Vec<(u32, Option<u32>)> {
        match part {
            CostPart::Shards | CostPart::Cluster => {
                self.shard_counts.iter().map(|&n| (n, None)).collect()
            }
            CostPart::Payload => self.payloads.iter().map(|&b| (1, Some(b))).collect(),
        }
    }

    /// The drains of one setup, in the order run.
    pub(crate) fn runs_of(
        &self,
        part: CostPart,
        shards: u32,
        payload: Option<u32>,
    ) -> Vec<&CostRun> {
        self.runs
            .iter()
            .filter(|r| r.part == part && r.shards == shards && r.payload_bytes == payload)
            .collect()
    }

    pub(crate) fn brokers_of(&self, part: CostPart, payload: Option<u32>) -> Vec<&CostBroker> {
        self.brokers
            .iter()
            .filter(|b| b.part == part && b.payload_bytes == payload)
            .collect()
    }

    /// The broker alone's received rate in `round` at `payload`'s body size.
    pub(crate) fn broker_in(
        &self,
        part: CostPart,
        payload: Option<u32>,
        round: u32,
    ) -> Option<f64> {
        self.brokers_of(part, payload)
            .into_iter()
            .find(|b| b.round == round)
            .map(|b| b.received_per_sec)
            .filter(|r| *r > 0.0)
    }

    /// Each setup's medians, part by part.
    pub fn summarize(&self) -> Vec<CostSummary> {
        let mut out: Vec<CostSummary> = Vec::new();
        for part in [CostPart::Shards, CostPart::Payload, CostPart::Cluster] {
            for (shards, payload) in self.setups(part) {
                let runs = self.runs_of(part, shards, payload);
                if runs.is_empty() {
                    continue;
                }
                let figures: Vec<Figures> = runs.iter().map(|r| Figures::of(&r.drain)).collect();
                let median_msgs_per_sec =
                    median(runs.iter().map(|r| r.drain.msgs_per_sec).collect());
                let brokers = self.brokers_of(part, payload);
                let broker = (!brokers.is_empty())
                    .then(|| median(brokers.iter().map(|b| b.received_per_sec).collect()))
                    .filter(|b| *b > 0.0);
                out.push(CostSummary {
                    part,
                    setup: setup_name(part, shards, payload),
                    shards,
                    payload_bytes: payload,
                    avg_payload_bytes: median_of(runs.iter().map(|r| r.drain.payload_bytes)),
                    msgs_per_sec: runs.iter().map(|r| r.drain.msgs_per_sec).collect(),
                    median_msgs_per_sec,
                    ratio_to_broker: broker.map(|b| median_msgs_per_sec / b),
                    relay_us_per_msg: median_of(figures.iter().map(|f| f.relay)),
                    walsender_us_per_msg: median_of(figures.iter().map(|f| f.walsender)),
                    walsender_growth: None,
                    pg_us_per_msg: median_of(figures.iter().map(|f| f.pg)),
                    rabbitmq_us_per_msg: median_of(figures.iter().map(|f| f.rabbitmq)),
                    relay_per_rabbitmq: median_of(figures.iter().map(Figures::relay_per_rabbitmq)),
                    complete: runs.iter().all(|r| r.drain.complete),
                });
            }
        }
        let baselines: Vec<Option<f64>> = out
            .iter()
            .map(|s| {
                let base_part = match s.part {
                    CostPart::Payload => CostPart::Shards,
                    part => part,
                };
                let fewest = self.shard_counts.iter().min().copied().unwrap_or(1);
                let base_shards = if s.part == CostPart::Payload {
                    1
                } else {
                    fewest
                };
                out.iter()
                    .find(|b| b.part == base_part && b.shards == base_shards)
                    .and_then(|b| b.walsender_us_per_msg)
                    .filter(|w| *w > 0.0)
            })
            .collect();
        for (s, base) in out.iter_mut().zip(baselines) {
            s.walsender_growth = s.walsender_us_per_msg.zip(base).map(|(w, b)| w / b);
        }
        out
    }
}
