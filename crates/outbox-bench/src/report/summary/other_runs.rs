//! The reports of the runs that replace the suite: `--shards-sweep`, `--emit` and the A/B.

use std::fmt::Write as _;

use crate::measurement::figures::{
    drain_run_cells, int, median, or_dash, ratio, us_per_msg, Drain,
};
use crate::measurement::results::{AbRun, EmitWriterRun, Results};

/// The A/B runs, then each binary's median drain rate and CPU per message.
impl Results {
    /// `--shards-sweep`: every drain, then per shard count the medians beside the broker
    /// alone's median.
    pub(super) fn shards_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "### Sharded relays: drain of single-row transactions (rows of 500 aggregates)\n"
        );
        let _ = writeln!(
            s,
            "| Round | Shards | Load (1, 5, 15 min) | MPS | Relay CPU µs / msg (all relays) | \
             PostgreSQL CPU µs / msg | Peak RSS MiB (largest relay) | Complete |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        for run in &self.shards {
            let d = &run.drain;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                run.round,
                run.shards,
                run.load,
                drain_run_cells(d)
            );
        }
        let broker = median(
            self.shards_broker
                .iter()
                .map(|b| b.received_per_sec)
                .collect(),
        );
        let each: Vec<String> = self
            .shards_broker
            .iter()
            .map(|b| int(b.received_per_sec))
            .collect();
        let _ = writeln!(
            s,
            "\nBroker alone at window {} (each round): {}; median {}.\n",
            self.scale.max_in_flight,
            each.join(" · "),
            int(broker)
        );
        let mut counts: Vec<u32> = self.shards.iter().map(|r| r.shards).collect();
        counts.sort_unstable();
        counts.dedup();
        let _ = writeln!(
            s,
            "| Shards | Median MPS | ÷ broker alone | Median relay CPU µs / msg | \
             Median PostgreSQL CPU µs / msg |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|");
        for shards in counts {
            let of = |f: &dyn Fn(&Drain) -> f64| {
                median(
                    self.shards
                        .iter()
                        .filter(|r| r.shards == shards)
                        .map(|r| f(&r.drain))
                        .collect(),
                )
            };
            let mps = of(&|d| d.msgs_per_sec);
            let _ = writeln!(
                s,
                "| {shards} | {} | {} | {:.1} | {:.1} |",
                int(mps),
                if broker > 0.0 {
                    ratio(mps / broker)
                } else {
                    "–".into()
                },
                of(&|d| us_per_msg(d.cpu_seconds, d)),
                of(&|d| us_per_msg(d.pg_cpu_seconds.unwrap_or(0.0), d))
            );
        }
    }

    /// `--emit`: the writer runs and the drains, each with per-variant medians.
    pub(super) fn emit_tables(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "### Writers: table insert against outbox_emit (one event per transaction, no relay)\n"
        );
        let _ = writeln!(
            s,
            "| Round | Clients | Variant | Load (1, 5, 15 min) | Events/s | WAL bytes / event |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|");
        for r in &self.emit_writers {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {:.0} |",
                r.round,
                r.clients,
                r.variant,
                r.load,
                int(r.events_per_sec),
                r.wal_bytes_per_event
            );
        }
        let mut keys: Vec<(u32, &str)> = self
            .emit_writers
            .iter()
            .map(|r| (r.clients, r.variant.as_str()))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let _ = writeln!(
            s,
            "\n| Clients | Variant | Median events/s | Median WAL bytes / event |"
        );
        let _ = writeln!(s, "|---|---|---|---|");
        for (clients, variant) in keys {
            let of = |f: fn(&EmitWriterRun) -> f64| {
                median(
                    self.emit_writers
                        .iter()
                        .filter(|r| r.clients == clients && r.variant == variant)
                        .map(f)
                        .collect(),
                )
            };
            let _ = writeln!(
                s,
                "| {clients} | {variant} | {} | {:.0} |",
                int(of(|r| r.events_per_sec)),
                of(|r| r.wal_bytes_per_event)
            );
        }
        if self.emit_drains.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "\n### WAL relay: drain of a backlog of single-row transactions, rows against emitted events\n"
        );
        let _ = writeln!(
            s,
            "| Round | Variant | Load (1, 5, 15 min) | MPS | Relay CPU µs / msg | PostgreSQL CPU µs / msg | Complete |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for r in &self.emit_drains {
            let d = &r.drain;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.1} | {} | {} |",
                r.round,
                r.variant,
                r.load,
                int(d.msgs_per_sec),
                us_per_msg(d.cpu_seconds, d),
                or_dash(d.pg_cpu_seconds, |c| format!("{:.1}", us_per_msg(c, d))),
                d.complete
            );
        }
        let mut variants: Vec<&str> = self
            .emit_drains
            .iter()
            .map(|r| r.variant.as_str())
            .collect();
        variants.sort_unstable();
        variants.dedup();
        let _ = writeln!(
            s,
            "\n| Variant | Median MPS | Median relay CPU µs / msg | Median PostgreSQL CPU µs / msg |"
        );
        let _ = writeln!(s, "|---|---|---|---|");
        for variant in variants {
            let of = |f: &dyn Fn(&Drain) -> f64| {
                median(
                    self.emit_drains
                        .iter()
                        .filter(|r| r.variant == variant)
                        .map(|r| f(&r.drain))
                        .collect(),
                )
            };
            let _ = writeln!(
                s,
                "| {variant} | {} | {:.1} | {:.1} |",
                int(of(&|d| d.msgs_per_sec)),
                of(&|d| us_per_msg(d.cpu_seconds, d)),
                of(&|d| us_per_msg(d.pg_cpu_seconds.unwrap_or(0.0), d))
            );
        }
    }
}

pub(super) fn ab_table(s: &mut String, runs: &[AbRun]) {
    let setup = runs.first().map_or("wal", |r| r.setup.as_str());
    let _ = writeln!(s, "### A/B: {setup} drain, single-row transactions\n");
    let _ = writeln!(
        s,
        "| Binary | Round | MPS | CPU µs / msg | PostgreSQL CPU µs / msg | Peak RSS MiB | Complete |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for run in runs {
        let d = &run.drain;
        let pg = match d.pg_cpu_seconds {
            Some(seconds) if d.received > 0 => {
                format!("{:.1}", seconds * 1e6 / d.received as f64)
            }
            _ => "–".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} | {pg} | {:.1} | {} |",
            run.binary,
            run.round,
            int(d.msgs_per_sec),
            d.cpu_seconds_per_100k * 10.0,
            d.peak_rss_mib,
            d.complete
        );
    }
    let mut binaries: Vec<&str> = runs.iter().map(|r| r.binary.as_str()).collect();
    binaries.sort_unstable();
    binaries.dedup();
    let _ = writeln!(s, "\n| Binary | Median MPS | Median CPU µs / msg |");
    let _ = writeln!(s, "|---|---|---|");
    for binary in binaries {
        let of = |f: fn(&Drain) -> f64| {
            median(
                runs.iter()
                    .filter(|r| r.binary == binary)
                    .map(|r| f(&r.drain))
                    .collect(),
            )
        };
        let _ = writeln!(
            s,
            "| {binary} | {} | {:.1} |",
            int(of(|d| d.msgs_per_sec)),
            of(|d| d.cpu_seconds_per_100k * 10.0)
        );
    }
}
