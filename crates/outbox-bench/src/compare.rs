//! `outbox-bench bench --compare`: setups of one relay binary drained in the same
//! run, so a polling setup's rate is set against the WAL reader's measured beside it on the
//! same servers, rounds interleaved; never against a figure from another day (on this machine
//! the load moves a drain more than most levers).
//!
//! This module is the setups (`--compare wal,poll:5,poll:5x1000,poll:5x500:delete`,
//! `--compare layout:default,layout:debezium`) and the figures with their Markdown;
//! `suite::compare_runs` runs them.

use std::fmt::{self, Write as _};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::figures::{
    drain_run_cells, int, median, ms, or_dash, ratio, us_per_msg, Drain, LatencyRun,
};

/// `poll --workers` accepts 1 to this (src/config.rs): refused here before any run starts.
const MAX_WORKERS: u32 = 256;
/// `poll --batch-size` accepts 1 to this.
const MAX_BATCH_SIZE: u32 = 100_000;

/// One setup of `--compare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareSetup {
    /// `wal`: the WAL reader (`run`) at --max-in-flight.
    Wal,
    /// `layout:default`, `layout:debezium`: the WAL reader as `wal`, on rows that each carry
    /// an aggregate, in a table of that layout (docs/table-layouts.md): the two differ only in
    /// the column map and the routing-key template.
    Layout(Layout),
    /// `poll:WORKERS[xBATCH][:delete]`: `poll --workers WORKERS [--batch-size BATCH]
    /// [--on-published delete]`.
    Poll {
        workers: u32,
        /// None: the relay's default batch size.
        batch_size: Option<u32>,
        delete: bool,
    },
}

/// The outbox table a `layout:` setup drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The contract's column names; the relay's default flags (routing key: the event type).
    Default,
    /// Debezium's Outbox Event Router names for the event type and the aggregate; the relay
    /// with `--table-layout debezium --routing-key '{aggregate_type}.{event_type}'`.
    Debezium,
}

impl FromStr for CompareSetup {
    type Err = String;

    fn from_str(text: &str) -> Result<CompareSetup, String> {
        let spec = text.trim();
        let usage = "expected wal, layout:default, layout:debezium, poll:WORKERS or \
                     poll:WORKERSxBATCH (e.g. poll:5x1000), a poll setup optionally followed by \
                     :delete";
        let (kind, options) = match spec.split_once(':') {
            Some((kind, options)) => (kind, Some(options)),
            None => (spec, None),
        };
        match (kind, options) {
            ("wal", None) => Ok(CompareSetup::Wal),
            ("wal", Some(_)) => Err(format!(
                "setup `{spec}`: wal takes no options (it runs at --max-in-flight)"
            )),
            ("layout", Some("default")) => Ok(CompareSetup::Layout(Layout::Default)),
            ("layout", Some("debezium")) => Ok(CompareSetup::Layout(Layout::Debezium)),
            ("layout", _) => Err(format!(
                "setup `{spec}`: a layout is layout:default or layout:debezium"
            )),
            ("poll", None) | ("poll", Some("")) => Err(format!(
                "setup `{spec}`: poll needs a number of workers, e.g. poll:5 or poll:5x1000"
            )),
            ("poll", Some(options)) => {
                let (sizes, suffix) = match options.split_once(':') {
                    Some((sizes, suffix)) => (sizes, Some(suffix)),
                    None => (options, None),
                };
                let delete = match suffix {
                    None => false,
                    Some("delete") => true,
                    Some(other) => {
                        return Err(format!(
                            "setup `{spec}`: unknown suffix `{other}` (only `delete`, for \
                             --on-published delete)"
                        ))
                    }
                };
                let (workers, batch_size) = match sizes.split_once('x') {
                    Some((workers, batch_size)) => (workers, Some(batch_size)),
                    None => (sizes, None),
                };
                Ok(CompareSetup::Poll {
                    workers: count(spec, "workers", workers, MAX_WORKERS)?,
                    batch_size: batch_size
                        .map(|b| count(spec, "batch size", b, MAX_BATCH_SIZE))
                        .transpose()?,
                    delete,
                })
            }
            ("", _) => Err(format!("an empty setup: {usage}")),
            _ => Err(format!("unknown setup `{spec}`: {usage}")),
        }
    }
}

/// `text` as a number from 1 to `max`, or an error naming the setup and the field.
fn count(spec: &str, what: &str, text: &str, max: u32) -> Result<u32, String> {
    let n: u32 = text
        .parse()
        .map_err(|_| format!("setup `{spec}`: {what} `{text}` is not a whole number"))?;
    if n == 0 || n > max {
        return Err(format!(
            "setup `{spec}`: {what} must be 1 to {max}, not {n}"
        ));
    }
    Ok(n)
}

/// The canonical spelling, which names the setup in the report (`poll:05` is `poll:5`).
impl fmt::Display for CompareSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompareSetup::Wal => f.write_str("wal"),
            CompareSetup::Layout(Layout::Default) => f.write_str("layout:default"),
            CompareSetup::Layout(Layout::Debezium) => f.write_str("layout:debezium"),
            CompareSetup::Poll {
                workers,
                batch_size,
                delete,
            } => {
                write!(f, "poll:{workers}")?;
                if let Some(batch_size) = batch_size {
                    write!(f, "x{batch_size}")?;
                }
                if *delete {
                    f.write_str(":delete")?;
                }
                Ok(())
            }
        }
    }
}

/// An error if a setup is listed twice (its runs would be pooled into one median).
pub fn check_distinct(setups: &[CompareSetup]) -> Result<(), String> {
    for (i, setup) in setups.iter().enumerate() {
        if setups[..i].contains(setup) {
            return Err(format!("--compare lists setup `{setup}` twice"));
        }
    }
    Ok(())
}

/// The figures of `--compare`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CompareResults {
    /// The setups in the order given; ratios are to the first.
    pub setups: Vec<String>,
    /// Backlog of single-row transactions each drain starts with.
    pub rows: u64,
    /// The WAL reader's --max-in-flight and the broker alone's window.
    pub window: u32,
    /// false (`--no-consumer`): nothing consumed the queue; a drain's count is the messages
    /// in it (the broker's count, from passive declares), not distinct ids at a consumer.
    pub consumer: bool,
    pub rounds: u32,
    /// Every drain, in the order run.
    pub runs: Vec<CompareRun>,
    /// The broker alone at `window`, once per round.
    pub broker: Vec<CompareBroker>,
    /// `--compare-latency`: one run per setup, after the drains.
    pub latency: Vec<CompareLatency>,
    /// Per setup, in the order given: the figures the Markdown's summary shows.
    pub summary: Vec<SetupSummary>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompareRun {
    pub round: u32,
    pub setup: String,
    /// /proc/loadavg when the drain started.
    pub load: String,
    pub drain: Drain,
}

/// The broker alone in one round: the minimal publisher ([`crate::independent`]), with a
/// consumer exactly when the drains have one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompareBroker {
    pub round: u32,
    pub messages: u64,
    /// With a consumer: messages per second to its last receipt.
    pub received_per_sec: Option<f64>,
    pub confirmed_per_sec: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompareLatency {
    pub setup: String,
    pub run: LatencyRun,
}

/// One setup's medians over its rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SetupSummary {
    pub setup: String,
    /// Each round's drain rate, in round order.
    pub msgs_per_sec: Vec<f64>,
    pub median_msgs_per_sec: f64,
    /// The median over the first setup's median.
    pub ratio_to_first: Option<f64>,
    /// The median over the broker alone's median (received per second with a consumer,
    /// confirmed per second without).
    pub ratio_to_broker: Option<f64>,
    pub relay_cpu_us_per_msg: f64,
    /// PostgreSQL's CPU (postmaster and every backend) per message.
    pub pg_cpu_us_per_msg: Option<f64>,
    /// The largest peak RSS of the setup's relays over the rounds.
    pub peak_rss_mib: f64,
    /// Every round delivered the whole backlog within the drain window.
    pub complete: bool,
    pub latency_p50_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
}

impl CompareResults {
    /// The broker alone's median: received per second with a consumer (what the drains
    /// count then), confirmed per second without.
    pub fn broker_median(&self) -> Option<f64> {
        if self.broker.is_empty() {
            return None;
        }
        let of = |b: &CompareBroker| {
            if self.consumer {
                b.received_per_sec.unwrap_or(0.0)
            } else {
                b.confirmed_per_sec
            }
        };
        Some(median(self.broker.iter().map(of).collect()))
    }

    /// Each setup's medians, in the order given.
    pub fn summarize(&self) -> Vec<SetupSummary> {
        let broker = self.broker_median().filter(|b| *b > 0.0);
        let mut out: Vec<SetupSummary> = Vec::new();
        for setup in &self.setups {
            let drains: Vec<&Drain> = self
                .runs
                .iter()
                .filter(|r| &r.setup == setup)
                .map(|r| &r.drain)
                .collect();
            let of = |f: &dyn Fn(&Drain) -> f64| median(drains.iter().map(|d| f(d)).collect());
            let median_msgs_per_sec = of(&|d| d.msgs_per_sec);
            let pg_measured =
                !drains.is_empty() && drains.iter().all(|d| d.pg_cpu_seconds.is_some());
            let latency = self
                .latency
                .iter()
                .find(|l| &l.setup == setup)
                .and_then(|l| l.run.latency.as_ref());
            let first = out
                .first()
                .map(|s| s.median_msgs_per_sec)
                .unwrap_or(median_msgs_per_sec);
            out.push(SetupSummary {
                setup: setup.clone(),
                msgs_per_sec: drains.iter().map(|d| d.msgs_per_sec).collect(),
                median_msgs_per_sec,
                ratio_to_first: (first > 0.0).then(|| median_msgs_per_sec / first),
                ratio_to_broker: broker.map(|b| median_msgs_per_sec / b),
                relay_cpu_us_per_msg: of(&|d| us_per_msg(d.cpu_seconds, d)),
                pg_cpu_us_per_msg: pg_measured
                    .then(|| of(&|d| us_per_msg(d.pg_cpu_seconds.unwrap_or(0.0), d))),
                peak_rss_mib: drains.iter().map(|d| d.peak_rss_mib).fold(0.0, f64::max),
                complete: !drains.is_empty() && drains.iter().all(|d| d.complete),
                latency_p50_ms: latency.map(|l| l.p50),
                latency_p99_ms: latency.map(|l| l.p99),
            });
        }
        out
    }

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
    use crate::results::{LatencyMs, Results};

    fn parse(text: &str) -> Result<CompareSetup, String> {
        text.parse()
    }

    #[test]
    fn setups_parse() {
        assert_eq!(parse("wal"), Ok(CompareSetup::Wal));
        assert_eq!(
            parse("layout:default"),
            Ok(CompareSetup::Layout(Layout::Default))
        );
        assert_eq!(
            parse(" layout:debezium "),
            Ok(CompareSetup::Layout(Layout::Debezium))
        );
        assert_eq!(
            parse(" poll:5 "),
            Ok(CompareSetup::Poll {
                workers: 5,
                batch_size: None,
                delete: false
            })
        );
        assert_eq!(
            parse("poll:2x500"),
            Ok(CompareSetup::Poll {
                workers: 2,
                batch_size: Some(500),
                delete: false
            })
        );
        assert_eq!(
            parse("poll:5x500:delete"),
            Ok(CompareSetup::Poll {
                workers: 5,
                batch_size: Some(500),
                delete: true
            })
        );
        assert_eq!(
            parse("poll:1:delete"),
            Ok(CompareSetup::Poll {
                workers: 1,
                batch_size: None,
                delete: true
            })
        );
    }

    #[test]
    fn setups_print_canonically() {
        for (text, shown) in [
            ("wal", "wal"),
            ("layout:default", "layout:default"),
            ("layout:debezium", "layout:debezium"),
            ("poll:05", "poll:5"),
            ("poll:5x1000", "poll:5x1000"),
            ("poll:5x500:delete", "poll:5x500:delete"),
        ] {
            assert_eq!(parse(text).map(|s| s.to_string()), Ok(shown.to_string()));
        }
    }

    #[test]
    fn bad_setups_say_what_is_wrong() {
        let error = |text: &str| parse(text).expect_err(text);
        assert!(error("").contains("an empty setup"));
        assert!(error("kafka").contains("unknown setup `kafka`: expected wal"));
        assert!(error("wal:4096").contains("wal takes no options"));
        assert!(error("layout").contains("a layout is layout:default or layout:debezium"));
        assert!(error("layout:").contains("a layout is layout:default or layout:debezium"));
        assert!(error("layout:outbox").contains("a layout is layout:default or layout:debezium"));
        assert!(error("layout:Debezium").contains("a layout is layout:default"));
        assert!(error("poll").contains("poll needs a number of workers"));
        assert!(error("poll:").contains("poll needs a number of workers"));
        assert!(error("poll:five").contains("workers `five` is not a whole number"));
        assert!(error("poll:0").contains("workers must be 1 to 256, not 0"));
        assert!(error("poll:257").contains("workers must be 1 to 256"));
        assert!(error("poll:5x").contains("batch size `` is not a whole number"));
        assert!(error("poll:5x0").contains("batch size must be 1 to 100000"));
        assert!(error("poll:5x500:mark").contains("unknown suffix `mark`"));
        assert!(error("poll:-1").contains("is not a whole number"));
    }

    #[test]
    fn a_setup_listed_twice_is_refused() {
        let setups: Vec<CompareSetup> = ["wal", "poll:5", "poll:05"]
            .iter()
            .map(|t| parse(t).expect(t))
            .collect();
        assert_eq!(
            check_distinct(&setups),
            Err("--compare lists setup `poll:5` twice".to_string())
        );
        assert_eq!(check_distinct(&setups[..2]), Ok(()));
    }

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
