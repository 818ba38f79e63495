//! `outbox-bench bench --cost-growth`: how a drain's cost grows, in one run on the same
//! servers: with 1, 2 and 4 sharded relays on one node, with larger payloads (about 1 KiB and
//! 16 KiB) through one relay, and with 1, 2 and 4 shards through a 3-node cluster's quorum
//! queue. Each drain records every process's CPU per message, because the rate alone hides
//! where the cost goes: each shard's walsender decodes the whole WAL (docs/scaling.md), so N
//! shards cost about N× decoding on the database even when the rate does not move.
//!
//! This module is the figures and their Markdown; `suite::cost_growth_runs` runs them.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::cpu::CpuSplit;
use crate::figures::{int, median, or_dash, ratio, us_per_msg, Drain};

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
    relay: Option<f64>,
    walsender: Option<f64>,
    pg: Option<f64>,
    rabbitmq: Option<f64>,
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
fn median_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
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

fn broker_name(payload_bytes: Option<u32>) -> String {
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

    fn brokers_of(&self, part: CostPart, payload: Option<u32>) -> Vec<&CostBroker> {
        self.brokers
            .iter()
            .filter(|b| b.part == part && b.payload_bytes == payload)
            .collect()
    }

    /// The broker alone's received rate in `round` at `payload`'s body size.
    fn broker_in(&self, part: CostPart, payload: Option<u32>, round: u32) -> Option<f64> {
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

    /// A section per part, then the walsender's growth with shards in one line.
    pub fn markdown(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "### Cost growth: drains of {} single-row transactions (rows of 500 aggregates), \
             window {}, {} round(s)\n",
            int(self.rows as f64),
            int(f64::from(self.window)),
            self.rounds
        );
        let summary = self.summarize();
        let counts: Vec<String> = self.shard_counts.iter().map(u32::to_string).collect();
        let counts = counts.join(", ");
        let fewest = self.shard_counts.iter().min().copied().unwrap_or(1);
        let parts = [
            (
                CostPart::Shards,
                format!("#### Single node: {counts} sharded relays, default payload"),
                format!("÷ {}", setup_name(CostPart::Shards, fewest, None)),
            ),
            (
                CostPart::Payload,
                "#### Single node: 1 relay, larger payloads".to_string(),
                "÷ 1 shard, default payload".to_string(),
            ),
            (
                CostPart::Cluster,
                format!(
                    "#### 3-node cluster, quorum queue: {counts} sharded relays, default payload"
                ),
                format!("÷ {}", setup_name(CostPart::Cluster, fewest, None)),
            ),
        ];
        for (part, title, growth_header) in parts {
            let _ = writeln!(s, "{title}\n");
            if part == CostPart::Cluster {
                if let Some(why) = &self.cluster_skipped {
                    let _ = writeln!(s, "Not run: {why}.\n");
                    continue;
                }
                if let Some(c) = &self.cluster {
                    let _ = writeln!(
                        s,
                        "{} nodes (started in {:.0} s); every queue led by node {}, the relays \
                         given only its URL, the consumer on it, the broker alone publishing \
                         through it.\n",
                        c.nodes, c.startup_secs, c.leader_node
                    );
                }
            }
            self.part_table(s, part, &summary, &growth_header);
        }
        self.walsender_line(s, &summary);
        let _ = writeln!(
            s,
            "\nEach round drains every setup once, the order rotated from round to round (the \
             broker alone first); a setup's first row is its median over the rounds, then each \
             round. MPS: distinct ids at the consumer per second, from the relays' start to \
             the last. CPU from /proc (utime + stime) per message received: all relays \
             together; every shard's walsender together (each decodes the whole WAL); \
             PostgreSQL: the postmaster and every backend, walsenders included; RabbitMQ: \
             every node. Relay ÷ RabbitMQ: each round's ratio, median. The broker alone is the \
             relay's own publisher code on synthetic rows of the same body size (no \
             PostgreSQL); its RabbitMQ figure is the reference for the broker's share. \
             Payload bytes: the backlog's average `octet_length(payload::text)` (the message \
             body); a larger payload's padding is hex digits, which TOAST stores uncompressed \
             and out of line (one letter repeated would be compressed to a few hundred bytes, \
             and the WAL would not grow with the payload; a real JSON payload compresses \
             partly, so its WAL and walsender figures lie between). /proc counts CPU in 10 ms \
             ticks: over {} messages a figure moves in steps of {:.2} µs. — : not measured.",
            int(self.rows as f64),
            if self.rows > 0 {
                10_000.0 / self.rows as f64
            } else {
                0.0
            }
        );
    }

    /// One part's table: per setup the median row, then each round.
    fn part_table(&self, s: &mut String, part: CostPart, summary: &[CostSummary], growth: &str) {
        let _ = writeln!(
            s,
            "| Setup | Round | Load (1, 5, 15 min) | Payload bytes | MPS | ÷ broker alone | \
             Relay CPU µs / msg (all relays) | Walsender CPU µs / msg (all shards) | \
             Walsender {growth} | PostgreSQL CPU µs / msg | RabbitMQ CPU µs / msg | \
             Relay ÷ RabbitMQ | Complete |"
        );
        let _ = writeln!(s, "|{}", "---|".repeat(13));
        let us = |v: Option<f64>| or_dash(v, |v| format!("{v:.1}"));
        let bytes = |v: Option<f64>| or_dash(v, int);
        let share = |v: Option<f64>| or_dash(v, |v| format!("{v:.2}"));
        let mut payloads: Vec<Option<u32>> = Vec::new();
        for b in self.brokers.iter().filter(|b| b.part == part) {
            if !payloads.contains(&b.payload_bytes) {
                payloads.push(b.payload_bytes);
            }
        }
        for payload in payloads {
            let brokers = self.brokers_of(part, payload);
            let name = broker_name(payload);
            let of = |f: fn(&CostBroker) -> Option<f64>| median_of(brokers.iter().map(|b| f(b)));
            let _ = writeln!(
                s,
                "| {name} | median | | {} | {} | | — | — | | — | {} | — | |",
                bytes(of(|b| Some(b.body_bytes as f64))),
                or_dash(of(|b| Some(b.received_per_sec)), int),
                us(of(|b| b.cpu.rabbitmq_us)),
            );
            for b in brokers {
                let _ = writeln!(
                    s,
                    "| {name} | {} | {} | {} | {} | | — | — | | — | {} | — | |",
                    b.round,
                    b.load,
                    int(b.body_bytes as f64),
                    int(b.received_per_sec),
                    us(b.cpu.rabbitmq_us),
                );
            }
        }
        for m in summary.iter().filter(|m| m.part == part) {
            let _ = writeln!(
                s,
                "| {} | median | | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                m.setup,
                bytes(m.avg_payload_bytes),
                int(m.median_msgs_per_sec),
                or_dash(m.ratio_to_broker, ratio),
                us(m.relay_us_per_msg),
                us(m.walsender_us_per_msg),
                or_dash(m.walsender_growth, |g| format!("×{g:.2}")),
                us(m.pg_us_per_msg),
                us(m.rabbitmq_us_per_msg),
                share(m.relay_per_rabbitmq),
                m.complete
            );
            for r in self.runs_of(part, m.shards, m.payload_bytes) {
                let d = &r.drain;
                let f = Figures::of(d);
                let broker = self.broker_in(part, m.payload_bytes, r.round);
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | | {} | {} | {} | {} |",
                    m.setup,
                    r.round,
                    r.load,
                    bytes(d.payload_bytes),
                    int(d.msgs_per_sec),
                    or_dash(broker, |b| ratio(d.msgs_per_sec / b)),
                    us(f.relay),
                    us(f.walsender),
                    us(f.pg),
                    us(f.rabbitmq),
                    share(f.relay_per_rabbitmq()),
                    d.complete
                );
            }
        }
        s.push('\n');
    }

    /// "Walsender µs / msg by shard count": the growth with shards, part by part.
    fn walsender_line(&self, s: &mut String, summary: &[CostSummary]) {
        let mut parts = Vec::new();
        for (part, name) in [
            (CostPart::Shards, "single node"),
            (CostPart::Cluster, "cluster"),
        ] {
            let cells: Vec<String> = summary
                .iter()
                .filter(|m| m.part == part)
                .map(|m| {
                    format!(
                        "{}: {}{}",
                        m.setup,
                        or_dash(m.walsender_us_per_msg, |w| format!("{w:.1}")),
                        m.walsender_growth
                            .map_or(String::new(), |g| format!(" (×{g:.2})"))
                    )
                })
                .collect();
            if !cells.is_empty() {
                parts.push(format!("{name}: {}", cells.join(", ")));
            }
        }
        if !parts.is_empty() {
            let _ = writeln!(
                s,
                "Walsender CPU µs / msg by shard count (every shard's walsender together, \
                 median; × the fewest shards'): {}.",
                parts.join("; ")
            );
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::results::Results;

    fn drain(mps: f64, relay_s: f64, walsender_us: f64, pg_s: f64, rabbitmq_us: f64) -> Drain {
        Drain {
            rows: 10_000,
            transaction_rows: 1,
            received: 10_000,
            seconds: 10_000.0 / mps,
            msgs_per_sec: mps,
            complete: true,
            cpu_seconds: relay_s,
            cpu_seconds_per_100k: relay_s * 10.0,
            peak_rss_mib: 20.0,
            pg_cpu_seconds: Some(pg_s),
            cpu: Some(CpuSplit {
                messages: 10_000,
                relay_us: Some(relay_s * 100.0),
                walsender_us: Some(walsender_us),
                rabbitmq_us: Some(rabbitmq_us),
                bench_us: Some(5.0),
            }),
            payload_bytes: Some(208.0),
        }
    }

    fn run(part: CostPart, round: u32, shards: u32, payload: Option<u32>, d: Drain) -> CostRun {
        CostRun {
            part,
            round,
            shards,
            payload_bytes: payload,
            load: "1.00 1.00 1.00".into(),
            drain: d,
        }
    }

    fn broker(round: u32, payload: Option<u32>, body: u64, received: f64) -> CostBroker {
        CostBroker {
            part: if payload.is_some() {
                CostPart::Payload
            } else {
                CostPart::Shards
            },
            round,
            payload_bytes: payload,
            body_bytes: body,
            load: "1.00 1.00 1.00".into(),
            messages: 10_000,
            received_per_sec: received,
            confirmed_per_sec: received + 500.0,
            cpu: CpuSplit {
                messages: 10_000,
                rabbitmq_us: Some(30.0),
                bench_us: Some(10.0),
                ..CpuSplit::default()
            },
        }
    }

    /// Two rounds: 1 and 4 shards on one node and on the cluster, a 1 KiB payload.
    pub(crate) fn sample() -> CostGrowth {
        use CostPart::{Cluster, Payload, Shards};
        let mut big = drain(6_000.0, 0.3, 15.0, 0.5, 60.0);
        big.payload_bytes = Some(1_030.0);
        let mut c = CostGrowth {
            rows: 10_000,
            window: 1024,
            rounds: 2,
            shard_counts: vec![1, 4],
            payloads: vec![1024],
            runs: vec![
                // 1 shard: walsender 10 and 12, median 12; 4 shards 40 and 30, median 40.
                run(Shards, 1, 1, None, drain(8_000.0, 0.2, 10.0, 0.3, 40.0)),
                run(Shards, 1, 4, None, drain(7_000.0, 0.4, 40.0, 0.6, 40.0)),
                run(Payload, 1, 1, Some(1024), big.clone()),
                run(Shards, 2, 4, None, drain(9_000.0, 0.4, 30.0, 0.5, 50.0)),
                run(Shards, 2, 1, None, drain(6_000.0, 0.2, 12.0, 0.3, 50.0)),
                run(Payload, 2, 1, Some(1024), big),
                run(Cluster, 1, 1, None, drain(3_000.0, 0.2, 11.0, 0.3, 100.0)),
                run(Cluster, 1, 4, None, drain(2_500.0, 0.4, 44.0, 0.6, 120.0)),
            ],
            brokers: vec![
                broker(1, None, 207, 10_000.0),
                broker(1, Some(1024), 1_031, 8_000.0),
                broker(2, None, 207, 12_000.0),
                broker(2, Some(1024), 1_031, 6_000.0),
                CostBroker {
                    part: Cluster,
                    ..broker(1, None, 207, 4_000.0)
                },
            ],
            cluster: Some(CostCluster {
                nodes: 3,
                leader_node: 0,
                startup_secs: 21.0,
            }),
            ..CostGrowth::default()
        };
        c.summary = c.summarize();
        c
    }

    #[test]
    fn the_summary_gives_medians_and_the_walsenders_growth_with_shards() {
        let c = sample();
        let find = |part, shards| {
            c.summary
                .iter()
                .find(|s| s.part == part && s.shards == shards)
                .expect("setup")
        };
        let one = find(CostPart::Shards, 1);
        assert_eq!(one.msgs_per_sec, [8_000.0, 6_000.0]);
        assert_eq!(one.median_msgs_per_sec, 8_000.0);
        // Broker alone median 12,000 (the upper of an even count).
        assert_eq!(one.ratio_to_broker, Some(8_000.0 / 12_000.0));
        assert_eq!(one.relay_us_per_msg, Some(20.0));
        assert_eq!(one.walsender_us_per_msg, Some(12.0));
        assert_eq!(one.walsender_growth, Some(1.0));
        // Relay 20 µs over RabbitMQ 40 and 50: 0.5 and 0.4, median 0.5.
        assert_eq!(one.relay_per_rabbitmq, Some(0.5));
        let four = find(CostPart::Shards, 4);
        assert_eq!(four.walsender_us_per_msg, Some(40.0));
        assert_eq!(four.walsender_growth, Some(40.0 / 12.0));
        assert_eq!(four.pg_us_per_msg, Some(60.0));
        // A payload's growth is against the single node's 1 shard, default payload.
        let payload = find(CostPart::Payload, 1);
        assert_eq!(payload.setup, "1 relay, 1,024 B payload");
        assert_eq!(payload.avg_payload_bytes, Some(1_030.0));
        assert_eq!(payload.walsender_growth, Some(15.0 / 12.0));
        assert_eq!(payload.ratio_to_broker, Some(6_000.0 / 8_000.0));
        // The cluster's against its own 1 shard and its own broker alone.
        let cluster = find(CostPart::Cluster, 4);
        assert_eq!(cluster.walsender_growth, Some(4.0));
        assert_eq!(cluster.ratio_to_broker, Some(2_500.0 / 4_000.0));
    }

    #[test]
    fn the_report_has_a_table_per_part_with_medians_and_rounds() {
        let results = Results {
            cost_growth: Some(sample()),
            ..Results::default()
        };
        let text = results.markdown();
        assert!(text.contains("### Cost growth: drains of 10,000"), "{text}");
        assert!(!text.contains("Reference table"), "{text}");
        for title in [
            "#### Single node: 1, 4 sharded relays",
            "#### Single node: 1 relay, larger payloads",
            "#### 3-node cluster, quorum queue: 1, 4 sharded relays",
        ] {
            assert!(text.contains(title), "{title}: {text}");
        }
        let header = text
            .lines()
            .find(|l| l.starts_with("| Setup | Round |"))
            .expect("header");
        assert!(header.contains("| Walsender ÷ 1 shard |"), "{header}");
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no `{prefix}` in {text}"))
                .to_string()
        };
        let median = line("| 4 shards | median |");
        assert_eq!(
            median,
            "| 4 shards | median | | 208 | 9,000 | 75 % | 40.0 | 40.0 | ×3.33 | 60.0 | 50.0 | \
             1.00 | true |"
        );
        assert_eq!(median.matches('|').count(), header.matches('|').count());
        let round = line("| 4 shards | 2 |");
        assert_eq!(
            round,
            "| 4 shards | 2 | 1.00 1.00 1.00 | 208 | 9,000 | 75 % | 40.0 | 30.0 | | 50.0 | 50.0 \
             | 0.80 | true |"
        );
        assert!(
            line("| broker alone, 1,024 B payload | median |").contains("| 1,031 | 8,000 |"),
            "{text}"
        );
        assert!(
            line("| 1 relay, 1,024 B payload | median |").contains("| 1,030 | 6,000 | 75 % |"),
            "{text}"
        );
        assert!(
            text.contains("every queue led by node 0, the relays given only its URL"),
            "{text}"
        );
        assert!(
            text.contains(
                "single node: 1 shard: 12.0 (×1.00), 4 shards: 40.0 (×3.33); cluster: 1 shard: \
                 11.0 (×1.00), 4 shards: 44.0 (×4.00)."
            ),
            "{text}"
        );
    }

    #[test]
    fn a_walsender_below_one_tick_has_no_growth() {
        let mut c = sample();
        for r in c.runs.iter_mut().filter(|r| r.part == CostPart::Cluster) {
            if let Some(split) = r.drain.cpu.as_mut().filter(|_| r.shards == 1) {
                split.walsender_us = Some(0.0);
            }
        }
        let mut text = String::new();
        c.markdown(&mut text);
        assert!(
            text.contains("cluster: 1 shard: 0.0, 4 shards: 44.0."),
            "{text}"
        );
        assert!(
            text.contains("over 10,000 messages a figure moves in steps of 1.00 µs"),
            "{text}"
        );
    }

    #[test]
    fn a_skipped_cluster_says_why() {
        let mut c = sample();
        c.runs.retain(|r| r.part != CostPart::Cluster);
        c.cluster = None;
        c.cluster_skipped = Some("--no-cluster".into());
        let mut text = String::new();
        c.markdown(&mut text);
        assert!(text.contains("Not run: --no-cluster."), "{text}");
        assert!(!text.contains("cluster: 1 shard"), "{text}");
    }

    #[test]
    fn the_json_round_trips() {
        let results = Results {
            cost_growth: Some(sample()),
            ..Results::default()
        };
        let json = serde_json::to_string(&results).expect("serialises");
        let value: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(value["cost_growth"]["runs"][0]["part"], "shards");
        assert_eq!(value["cost_growth"]["runs"][2]["payload_bytes"], 1024);
        assert_eq!(
            value["cost_growth"]["runs"][2]["drain"]["payload_bytes"],
            1030.0
        );
        assert_eq!(value["cost_growth"]["brokers"][1]["body_bytes"], 1031);
        let back: Results = serde_json::from_str(&json).expect("reads back");
        let c = back.cost_growth.expect("cost growth");
        assert_eq!(c.runs.len(), 8);
        assert_eq!(c.summary.len(), 5);
        assert_eq!(
            serde_json::to_value(&c.summary).expect("summary"),
            value["cost_growth"]["summary"]
        );
        // A file without the section, or a drain without a payload size, still reads.
        let old: Results = serde_json::from_str("{}").expect("an empty results file reads");
        assert!(old.cost_growth.is_none());
        assert!(!serde_json::to_string(&old)
            .expect("serialises")
            .contains("cost_growth"));
    }
}
