//! The Markdown of `outbox-bench bench --cost-growth` (the figures are
//! [`crate::measurement::results::cost_growth`]).

use std::fmt::Write as _;

use crate::measurement::figures::{int, or_dash, ratio};
use crate::measurement::results::cost_growth::{
    broker_name, median_of, setup_name, CostBroker, CostGrowth, CostPart, CostSummary, Figures,
};

impl CostGrowth {
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
    use crate::measurement::cpu::CpuSplit;
    use crate::measurement::figures::Drain;
    use crate::measurement::results::cost_growth::*;
    use crate::measurement::results::Results;

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
