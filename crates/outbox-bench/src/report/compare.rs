//! The Markdown of `outbox-bench bench --compare` (the figures are
//! [`crate::measurement::results::compare`]).

use std::fmt::Write as _;

use crate::measurement::figures::{drain_run_cells, int, median, ms, or_dash, ratio};
use crate::measurement::results::compare::{CompareBroker, CompareResults};

impl CompareResults {
    /// Every drain, the broker alone, then per setup its rounds and medians.
    pub fn markdown(&self, s: &mut String) {
        let counted = if self.consumer {
            "distinct ids at a consumer"
        } else {
            "no consumer: messages in the queue, from passive declares"
        };
        let _ = writeln!(
            s,
            "### Compare: drains of {} single-row transactions, one relay binary ({counted})\n",
            int(self.rows as f64)
        );
        let _ = writeln!(
            s,
            "| Round | Setup | Load (1, 5, 15 min) | MPS | Relay CPU µs / msg | \
             PostgreSQL CPU µs / msg | Peak RSS MiB | Complete |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        for run in &self.runs {
            let d = &run.drain;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                run.round,
                run.setup,
                run.load,
                drain_run_cells(d)
            );
        }
        let each = |f: fn(&CompareBroker) -> f64| {
            self.broker
                .iter()
                .map(|b| int(f(b)))
                .collect::<Vec<_>>()
                .join(" · ")
        };
        let medians = |f: fn(&CompareBroker) -> f64| median(self.broker.iter().map(f).collect());
        let confirmed = |b: &CompareBroker| b.confirmed_per_sec;
        if !self.broker.is_empty() && self.consumer {
            let received = |b: &CompareBroker| b.received_per_sec.unwrap_or(0.0);
            let _ = writeln!(
                s,
                "\nBroker alone, minimal publisher (bare lapin, no relay code) at window {}, \
                 consumer attached (each round): {} msgs/s received, median {}; {} confirmed, \
                 median {}.",
                int(f64::from(self.window)),
                each(received),
                int(medians(received)),
                each(confirmed),
                int(medians(confirmed)),
            );
        } else if !self.broker.is_empty() {
            let _ = writeln!(
                s,
                "\nBroker alone, minimal publisher (bare lapin, no relay code) at window {}, no \
                 consumer (each round): {} msgs/s confirmed, median {}.",
                int(f64::from(self.window)),
                each(confirmed),
                int(medians(confirmed)),
            );
        }

        let first = self.setups.first().map_or("first", String::as_str);
        let ratio_header = if first == "wal" {
            "÷ WAL".to_string()
        } else {
            format!("÷ {first}")
        };
        let broker_header = if self.consumer {
            "÷ broker alone (received)"
        } else {
            "÷ broker alone (confirmed)"
        };
        let latency = !self.latency.is_empty();
        let rate = self.latency.first().map_or(0, |l| l.run.rate);
        let _ = write!(
            s,
            "\n| Setup | Drain msgs/s (each round) | Median | {ratio_header} | {broker_header} | \
             Relay CPU µs / msg (median) | PostgreSQL CPU µs / msg (median) | Peak RSS MiB |"
        );
        let mut columns = 8;
        if latency {
            let _ = write!(s, " p50 at {rate} rows/s | p99 |");
            columns += 2;
        }
        let _ = writeln!(s, "\n|{}", "---|".repeat(columns));
        for m in self.summarize() {
            let rounds: Vec<String> = m.msgs_per_sec.iter().map(|r| int(*r)).collect();
            let _ = write!(
                s,
                "| {} | {} | {}{} | {} | {} | {:.1} | {} | {:.1} |",
                m.setup,
                rounds.join(" · "),
                int(m.median_msgs_per_sec),
                if m.complete { "" } else { " (incomplete)" },
                or_dash(m.ratio_to_first, |r| format!("{r:.2}×")),
                or_dash(m.ratio_to_broker, ratio),
                m.relay_cpu_us_per_msg,
                or_dash(m.pg_cpu_us_per_msg, |c| format!("{c:.1}")),
                m.peak_rss_mib,
            );
            if latency {
                let _ = write!(
                    s,
                    " {} | {} |",
                    or_dash(m.latency_p50_ms, ms),
                    or_dash(m.latency_p99_ms, ms)
                );
            }
            s.push('\n');
        }
        let _ = writeln!(
            s,
            "\nwal: the WAL reader at --max-in-flight {window}; poll:N: `poll --workers N` at the \
             relay's default batch size, poll:NxB with --batch-size B, :delete with \
             --on-published delete;{layout_note} every relay with --cleanup-interval 0. The \
             setups' order rotates from round to round. MPS: {counted}, from the relay's start \
             to the last.{latency_note}",
            window = int(f64::from(self.window)),
            layout_note = if self.setups.iter().any(|s| s.starts_with("layout:")) {
                " layout:default: the WAL reader as wal, on rows that each carry an aggregate \
                 (type Order, 500 ids), default flags (routing key: the event type); \
                 layout:debezium: the same rows in a table whose event_type, aggregate_type and \
                 aggregate_id are Debezium's type, aggregatetype and aggregateid, the relay with \
                 --table-layout debezium --routing-key '{aggregate_type}.{event_type}' (key \
                 Order.<event type>);"
            } else {
                ""
            },
            latency_note = if latency {
                format!(
                    " Latency: commit→consumer at {rate} rows/s, one writer, one run per setup."
                )
            } else {
                String::new()
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measurement::figures::{Drain, LatencyRun};
    use crate::measurement::results::compare::{CompareBroker, CompareLatency, CompareRun};
    use crate::measurement::results::{LatencyMs, Results};

    fn drain(msgs_per_sec: f64, cpu: f64, pg: f64) -> Drain {
        Drain {
            rows: 10_000,
            transaction_rows: 1,
            received: 10_000,
            seconds: 10_000.0 / msgs_per_sec,
            msgs_per_sec,
            complete: true,
            cpu_seconds: cpu,
            cpu_seconds_per_100k: cpu * 10.0,
            peak_rss_mib: 20.0,
            pg_cpu_seconds: Some(pg),
            cpu: None,
            payload_bytes: None,
        }
    }

    fn sample() -> CompareResults {
        let run = |round, setup: &str, mps, pg| CompareRun {
            round,
            setup: setup.into(),
            load: "1.00 1.00 1.00".into(),
            drain: drain(mps, 0.1, pg),
        };
        let broker = |round, received_per_sec| CompareBroker {
            round,
            messages: 10_000,
            received_per_sec: Some(received_per_sec),
            confirmed_per_sec: received_per_sec + 1_000.0,
        };
        let mut c = CompareResults {
            setups: vec!["wal".into(), "poll:5".into()],
            rows: 10_000,
            window: 1024,
            consumer: true,
            rounds: 3,
            runs: vec![
                run(1, "wal", 20_000.0, 0.1),
                run(1, "poll:5", 14_000.0, 0.3),
                run(2, "poll:5", 16_000.0, 0.25),
                run(2, "wal", 18_000.0, 0.12),
                run(3, "wal", 22_000.0, 0.11),
                run(3, "poll:5", 12_000.0, 0.28),
            ],
            broker: vec![
                broker(1, 21_000.0),
                broker(2, 25_000.0),
                broker(3, 20_000.0),
            ],
            latency: vec![CompareLatency {
                setup: "poll:5".into(),
                run: LatencyRun {
                    rate: 100,
                    rows: 300,
                    missing: 0,
                    latency: Some(LatencyMs {
                        samples: 300,
                        avg: 30.0,
                        p50: 20.0,
                        p99: 95.0,
                        max: 120.0,
                        percentiles: Vec::new(),
                    }),
                },
            }],
            summary: Vec::new(),
        };
        c.summary = c.summarize();
        c
    }

    #[test]
    fn the_summary_sets_each_median_against_the_first_setup_and_the_broker() {
        let c = sample();
        let wal = &c.summary[0];
        let poll = &c.summary[1];
        assert_eq!(wal.msgs_per_sec, [20_000.0, 18_000.0, 22_000.0]);
        assert_eq!(wal.median_msgs_per_sec, 20_000.0);
        assert_eq!(poll.median_msgs_per_sec, 14_000.0);
        assert_eq!(poll.ratio_to_first, Some(0.7));
        // 14,000 of the broker alone's median received, 21,000.
        assert_eq!(poll.ratio_to_broker, Some(14_000.0 / 21_000.0));
        assert_eq!(poll.relay_cpu_us_per_msg, 10.0);
        assert_eq!(poll.pg_cpu_us_per_msg, Some(28.0));
        assert_eq!(poll.latency_p99_ms, Some(95.0));
        assert_eq!(wal.latency_p50_ms, None);
    }

    #[test]
    fn the_report_has_every_run_and_a_row_per_setup() {
        let results = Results {
            compare: Some(sample()),
            ..Results::default()
        };
        let text = results.markdown();
        assert!(text.contains("### Compare: drains of 10,000"), "{text}");
        assert!(!text.contains("Reference table"), "{text}");
        assert!(
            text.contains("| 2 | poll:5 | 1.00 1.00 1.00 | 16,000 | 10.0 | 25.0 | 20.0 | true |"),
            "{text}"
        );
        assert!(
            text.contains("21,000 · 25,000 · 20,000 msgs/s received, median 21,000"),
            "{text}"
        );
        let header = text
            .lines()
            .find(|l| l.starts_with("| Setup |"))
            .expect("summary header");
        assert!(header.contains("| ÷ WAL |"), "{header}");
        assert!(header.ends_with("| p50 at 100 rows/s | p99 |"), "{header}");
        let row = text
            .lines()
            .find(|l| l.starts_with("| poll:5 | 14,000 · 16,000 · 12,000 |"))
            .expect("poll:5 row");
        assert_eq!(
            row,
            "| poll:5 | 14,000 · 16,000 · 12,000 | 14,000 | 0.70× | 67 % | 10.0 | 28.0 | 20.0 \
             | 20 ms | 95 ms |"
        );
        assert_eq!(row.matches('|').count(), header.matches('|').count());
        let json = serde_json::to_value(&results).expect("serialises");
        assert_eq!(json["compare"]["summary"][1]["ratio_to_first"], 0.7);
        assert_eq!(
            json["compare"]["runs"][0]["drain"]["msgs_per_sec"],
            20_000.0
        );
    }

    #[test]
    fn without_a_consumer_the_broker_figure_is_its_confirms() {
        let mut c = sample();
        c.consumer = false;
        c.latency.clear();
        c.summary = c.summarize();
        // Confirmed: 22,000 · 26,000 · 21,000, median 22,000.
        assert_eq!(c.summary[0].ratio_to_broker, Some(20_000.0 / 22_000.0));
        let mut text = String::new();
        c.markdown(&mut text);
        assert!(
            text.contains("no consumer: messages in the queue"),
            "{text}"
        );
        assert!(text.contains("÷ broker alone (confirmed)"), "{text}");
        assert!(!text.contains("p50 at"), "{text}");
    }

    #[test]
    fn the_layout_setups_are_explained_when_drained() {
        let mut text = String::new();
        sample().markdown(&mut text);
        assert!(!text.contains("layout:"), "{text}");

        let mut c = sample();
        c.setups = vec!["layout:default".into(), "layout:debezium".into()];
        for run in &mut c.runs {
            run.setup = if run.setup == "wal" {
                "layout:default".into()
            } else {
                "layout:debezium".into()
            };
        }
        c.latency.clear();
        c.summary = c.summarize();
        let mut text = String::new();
        c.markdown(&mut text);
        assert!(text.contains("| ÷ layout:default |"), "{text}");
        assert!(
            text.contains("| layout:debezium | 14,000 · 16,000 · 12,000 | 14,000 | 0.70× |"),
            "{text}"
        );
        assert!(
            text.contains(
                "--table-layout debezium --routing-key '{aggregate_type}.{event_type}' (key \
                 Order.<event type>);"
            ),
            "{text}"
        );
    }
}
