//! The full run's drain of every setup: the WAL reader, 1, 2 and 5 polling workers,
//! two sharded relays and `outbox_emit` events, each with a consumer attached and with none,
//! set against the broker alone (the minimal publisher) of the same run, and the 3-node
//! cluster's WAL reader against the broker alone on that cluster. One table in the report,
//! one chart (drain.svg), both from [`single_node_rows`] and [`cluster_rows`], so they agree.
//!
//! The drains are the ones `--compare`, `--shards-sweep` and `--emit` run (`suite::setup_drains`
//! picks them by [`DrainSetup`]), one round each at the full run's backlog; this module is the
//! setups and the figures with their Markdown.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::measurement::figures::{int, Drain};
use crate::scenarios::compare::{CompareSetup, Layout};

/// One setup of the section: what is drained, by which relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainSetup {
    /// `wal`, `layout:…` or `poll:…` (as `--compare` spells them): one relay, a backlog of
    /// rows.
    Relay(CompareSetup),
    /// `shards:N`: N relays of `setup --shards N` into one queue, a backlog of rows of 500
    /// aggregates (as `--shards-sweep`).
    Shards(u32),
    /// `emit`: the WAL reader, a backlog of events written by the table's `outbox_emit`,
    /// no row (as `--emit`).
    Emit,
}

impl DrainSetup {
    pub const WAL: DrainSetup = DrainSetup::Relay(CompareSetup::Wal);

    const fn poll(workers: u32) -> DrainSetup {
        DrainSetup::Relay(CompareSetup::Poll {
            workers,
            batch_size: None,
            delete: false,
        })
    }

    /// The setup as a reader knows it (`poll:2x1000` is "2 polling workers × 1,000").
    pub fn reader_name(&self) -> String {
        match self {
            DrainSetup::Relay(CompareSetup::Wal) => "WAL reader".into(),
            DrainSetup::Relay(CompareSetup::Layout(Layout::Default)) => {
                "WAL reader, default layout".into()
            }
            DrainSetup::Relay(CompareSetup::Layout(Layout::Debezium)) => {
                "WAL reader, Debezium layout + template".into()
            }
            DrainSetup::Relay(CompareSetup::Poll {
                workers,
                batch_size,
                delete,
            }) => {
                let mut name = format!(
                    "{workers} polling worker{}",
                    if *workers == 1 { "" } else { "s" }
                );
                if let Some(b) = batch_size {
                    name.push_str(&format!(" × {}", int(f64::from(*b))));
                }
                if *delete {
                    name.push_str(", delete");
                }
                name
            }
            DrainSetup::Shards(1) => "WAL reader, 1 relay".into(),
            DrainSetup::Shards(n) => format!("WAL reader, {n} shards"),
            DrainSetup::Emit => "WAL reader, outbox_emit events".into(),
        }
    }
}

/// The setups of the full run's section, in the order of its table and chart. Two shards
/// are enough to show what sharding does to one queue's drain (`--shards-sweep` measured 1, 2
/// and 4).
pub const FULL_RUN: [DrainSetup; 6] = [
    DrainSetup::WAL,
    DrainSetup::poll(1),
    DrainSetup::poll(2),
    DrainSetup::poll(5),
    DrainSetup::Shards(2),
    DrainSetup::Emit,
];

impl FromStr for DrainSetup {
    type Err = String;

    fn from_str(text: &str) -> Result<DrainSetup, String> {
        let spec = text.trim();
        if spec == "emit" {
            return Ok(DrainSetup::Emit);
        }
        if let Some(n) = spec.strip_prefix("shards:") {
            return match n.parse() {
                Ok(n) if n > 0 => Ok(DrainSetup::Shards(n)),
                _ => Err(format!(
                    "setup `{spec}`: shards must be a whole number from 1"
                )),
            };
        }
        spec.parse().map(DrainSetup::Relay)
    }
}

/// The spelling the results file names a setup by.
impl fmt::Display for DrainSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrainSetup::Relay(setup) => setup.fmt(f),
            DrainSetup::Shards(n) => write!(f, "shards:{n}"),
            DrainSetup::Emit => f.write_str("emit"),
        }
    }
}

/// The figures of the section (`setups` in the JSON; absent in files from before it).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SetupDrains {
    /// Backlog of every drain, single-row transactions (the scale's drain rows).
    pub rows: u64,
    /// The WAL relays' --max-in-flight.
    pub window: u32,
    /// Each setup with a consumer, then without, in the order of [`FULL_RUN`].
    pub runs: Vec<SetupRun>,
    /// How long the section's own drains took (the reused ones not counted).
    pub seconds: f64,
}

/// One drain of the section.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SetupRun {
    /// [`DrainSetup`]'s spelling: `wal`, `poll:2`, `shards:2`, `emit`.
    pub setup: String,
    /// A consumer attached (rate: distinct ids received); false: nothing consuming (rate:
    /// messages in the queue, the broker's count).
    pub consumer: bool,
    /// Scenario 1's drain of the same setup (same backlog, same relay, a consumer), copied
    /// rather than run again.
    pub reused: bool,
    /// /proc/loadavg when the drain started (empty for a reused drain: scenario 1 does not
    /// record it).
    pub load: String,
    pub drain: Drain,
}

impl SetupDrains {
    /// The setups in the order first drained.
    pub fn setups(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for run in &self.runs {
            if !out.contains(&run.setup.as_str()) {
                out.push(&run.setup);
            }
        }
        out
    }

    pub fn run(&self, setup: &str, consumer: bool) -> Option<&SetupRun> {
        self.runs
            .iter()
            .find(|r| r.setup == setup && r.consumer == consumer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measurement::results::Results;
    use crate::report::setup_table::*;

    #[test]
    fn setups_parse_and_print_as_the_results_name_them() {
        for (text, setup) in [
            ("wal", DrainSetup::WAL),
            ("poll:2", DrainSetup::poll(2)),
            (
                "layout:debezium",
                DrainSetup::Relay(CompareSetup::Layout(Layout::Debezium)),
            ),
            ("shards:2", DrainSetup::Shards(2)),
            ("emit", DrainSetup::Emit),
        ] {
            assert_eq!(text.parse::<DrainSetup>(), Ok(setup));
            assert_eq!(setup.to_string(), text);
        }
        assert!("shards:0"
            .parse::<DrainSetup>()
            .expect_err("0")
            .contains("shards must be a whole number from 1"));
        assert!("kafka"
            .parse::<DrainSetup>()
            .expect_err("kafka")
            .contains("unknown setup `kafka`"));
    }

    fn fixture() -> Results {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/results.json");
        crate::report::charts::read(&path).expect("the fixture reads")
    }

    fn table_row<'a>(text: &'a str, name: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("no row {name}: {text}"))
    }

    #[test]
    fn the_table_gives_each_setup_with_and_without_a_consumer_against_the_broker_alone() {
        let results = fixture();
        let mut text = String::new();
        markdown(&results, &mut text);
        assert!(
            text.starts_with(
                "### Drain of every setup, consumer attached and none (200,000 single-row txns)"
            ),
            "{text}"
        );
        // The minimal publisher: 15,340 received with a consumer, 12,405 confirmed without.
        for (name, row) in [
            (
                "Broker alone, minimal publisher",
                "| 15,340 | 100 % | 12,405 | 100 % |",
            ),
            (
                "Broker alone, relay's publisher",
                "| 7,594 | 50 % | — | — |",
            ),
            ("WAL reader ¹", "| 16,510 | 108 % | 14,567 | 117 % |"),
            ("1 polling worker ¹", "| 8,448 | 55 % | 9,796 | 79 % |"),
            ("2 polling workers", "| 12,500 | 81 % | 11,471 | 92 % |"),
            ("5 polling workers ¹", "| 13,408 | 87 % | 11,770 | 95 % |"),
            (
                "WAL reader, 2 shards",
                "| 15,980 | 104 % | 14,900 | 120 % |",
            ),
            (
                "WAL reader, outbox_emit events",
                "| 16,050 | 105 % | 14,100 | 114 % |",
            ),
            // The cluster against its own minimal publisher: 7,300 and 8,200.
            (
                "3-node cluster: broker alone, minimal publisher",
                "| 7,300 | 100 % | 8,200 | 100 % |",
            ),
            (
                "3-node cluster: broker alone, relay's publisher",
                "| 7,525 | 103 % | — | — |",
            ),
            (
                "3-node cluster: WAL reader",
                "| 6,160 | 84 % | 6,800 | 83 % |",
            ),
        ] {
            assert_eq!(table_row(&text, name), format!("| {name} {row}"));
        }
        assert!(
            text.contains("¹ Consumer attached: scenario 1's drain of the same backlog"),
            "{text}"
        );
        assert!(text.contains("own drains took 291 s"), "{text}");
        // A full run's report has the table after the reference table (the fixture's
        // sections of other modes would each print their own report instead).
        let suite = Results {
            compare: None,
            shards: Vec::new(),
            emit_writers: Vec::new(),
            emit_drains: Vec::new(),
            ..results
        };
        let report = suite.markdown();
        let reference = report.find("### Reference table").expect("reference table");
        let section = report.find("### Drain of every setup").expect("section");
        assert!(reference < section, "{report}");
    }

    #[test]
    fn an_unfinished_drain_says_how_far_it_got_and_an_older_file_has_no_table() {
        let mut results = fixture();
        let section = results.setups.as_mut().expect("section");
        let run = section
            .runs
            .iter_mut()
            .find(|r| r.setup == "poll:2" && !r.consumer)
            .expect("poll:2 without a consumer");
        run.drain.complete = false;
        run.drain.received = 150_000;
        run.drain.seconds = 60.0;
        run.drain.msgs_per_sec = 2_500.0;
        let mut text = String::new();
        markdown(&results, &mut text);
        assert_eq!(
            table_row(&text, "2 polling workers"),
            "| 2 polling workers | 12,500 | 81 % | 2,500 (150,000 of 200,000 in 60 s) | 20 % |"
        );

        results.setups = None;
        let cluster = results.cluster.as_mut().expect("cluster");
        cluster.bare_broker = None;
        cluster.bare_broker_no_consumer = None;
        let mut text = String::new();
        markdown(&results, &mut text);
        assert_eq!(text, "");
    }

    #[test]
    fn the_layout_setups_are_named_for_what_differs() {
        let name = |text: &str| text.parse::<DrainSetup>().expect(text).reader_name();
        assert_eq!(name("layout:default"), "WAL reader, default layout");
        assert_eq!(
            name("layout:debezium"),
            "WAL reader, Debezium layout + template"
        );
    }

    #[test]
    fn the_full_run_drains_every_setup() {
        let names: Vec<String> = FULL_RUN.iter().map(DrainSetup::reader_name).collect();
        assert_eq!(
            names,
            [
                "WAL reader",
                "1 polling worker",
                "2 polling workers",
                "5 polling workers",
                "WAL reader, 2 shards",
                "WAL reader, outbox_emit events",
            ]
        );
    }
}
