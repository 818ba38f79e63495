//! The sections of a suite run's report, in the order [`Results::markdown`] writes them:
//! reference table, limits, latency, NOTIFY, crash, sweep.

use std::fmt::Write as _;

use super::*;
use crate::measurement::figures::{drain_cell, int, ms, or_dash, ratio};
use crate::measurement::results::Results;
use crate::report::setup_table;

impl Results {
    /// The reference table: a row per mode, each against the lower limit.
    pub(super) fn reference_table(&self, s: &mut String) {
        let w = self.scale.max_in_flight;
        let _ = writeln!(s, "### Reference table ({} scale)\n", self.scale.name);
        let _ = writeln!(
            s,
            "| Setup | MPS, backlog of {} single-row txns | MPS, 1,000-row txns | ÷ limit | Avg commit→consumer, {} orders/s | Avg commit→consumer, {} users | Orders/s, {} users | CPU s / 100k msgs | Peak RSS |",
            int(self.scale.drain_rows as f64),
            self.scale.latency_rate,
            self.scale.load_writers,
            self.scale.load_writers
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
        let lower = self.limits.lower(w);
        for m in &self.modes {
            let drain = m.drain.as_ref();
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                m.mode,
                drain_cell(drain),
                drain_cell(m.drain_batched.as_ref()),
                or_dash(drain.zip(lower), |(d, l)| ratio(d.msgs_per_sec / l)),
                or_dash(m.latency.as_ref().and_then(|l| l.latency.as_ref()), |l| ms(
                    l.avg
                )),
                or_dash(m.load.as_ref().and_then(|l| l.latency.as_ref()), |l| ms(
                    l.avg
                )),
                or_dash(m.load.as_ref(), |l| int(l.orders_per_sec)),
                or_dash(drain, |d| format!("{:.2}", d.cpu_seconds_per_100k)),
                or_dash(drain, |d| format!("{:.1} MiB", d.peak_rss_mib)),
            );
        }
        let _ = writeln!(
            s,
            "\n÷ limit: drain MPS over the lower of broker alone at the relay's window ({}) and \
             decoding alone, both measured in this run.\n",
            int(f64::from(w))
        );
        setup_table::markdown(self, s);
    }

    /// The limits measured in the same run, the CPU split, and the single node's adjacent pairs.
    pub(super) fn limits_section(&self, s: &mut String) {
        let _ = writeln!(s, "### Limits (same run)\n");
        let _ = writeln!(s, "| Limit | Figure |\n|---|---|");
        for b in &self.limits.broker {
            let _ = writeln!(
                s,
                "| Broker alone, relay's publisher, window {} ({} msgs) | {} msgs/s received ({} confirmed) |",
                int(f64::from(b.window)),
                int(b.messages as f64),
                int(b.received_per_sec),
                int(b.confirmed_per_sec)
            );
        }
        if let Some(l) = &self.limits.broker_latency {
            let _ = writeln!(
                s,
                "| Broker alone, relay's publisher, publish→consumer at {} msgs/s | avg {}, p50 {}, p99 {}, max {} |",
                self.limits.broker_latency_rate,
                ms(l.avg),
                ms(l.p50),
                ms(l.p99),
                ms(l.max)
            );
        }
        if let Some(d) = &self.limits.decode {
            let _ = writeln!(
                s,
                "| Decoding alone ({}), {} rows | {} rows/s |",
                d.method,
                int(d.rows as f64),
                int(d.rows_per_sec)
            );
        }
        for b in [
            &self.limits.bare_broker,
            &self.limits.bare_broker_no_consumer,
        ]
        .into_iter()
        .flatten()
        {
            let figure = match b.received_per_sec {
                Some(received) => format!(
                    "{} msgs/s received ({} confirmed)",
                    int(received),
                    int(b.confirmed_per_sec)
                ),
                None => format!("{} msgs/s confirmed", int(b.confirmed_per_sec)),
            };
            let _ = writeln!(
                s,
                "| Broker alone, minimal publisher (bare lapin, no relay code), window {}, {} ({} msgs) | {figure} |",
                int(f64::from(b.window)),
                if b.consumer { "consumer attached" } else { "no consumer" },
                int(b.messages as f64)
            );
        }
        if let Some(w) = &self.limits.walsender {
            let _ = writeln!(
                s,
                "| Walsender ceiling ({}), {} single-row txns | {} rows/s |",
                w.method,
                int(w.rows as f64),
                int(w.rows_per_sec)
            );
        }
        self.cpu_split_table(s);
        if !self.limits.consumer_pairs.is_empty() {
            let _ = writeln!(
                s,
                "\nThe WAL drain against the minimal publisher, consumer attached, in adjacent \
                 pairs whose order alternates (msgs/s): {}.",
                pairs_text(&self.limits.consumer_pairs)
            );
        }
    }

    /// Commit→consumer latency of every mode at the fixed rate and under load, beside the broker alone.
    pub(super) fn latency_section(&self, s: &mut String) {
        let _ = writeln!(s, "\n### Latency, commit→consumer\n");
        let _ = writeln!(
            s,
            "| Setup | Load | Rows | avg | p50 | p99 | max | ÷ broker p50 | ÷ broker p99 | Missing |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        let broker = self.limits.broker_latency.as_ref();
        for m in &self.modes {
            let runs = [
                m.latency.as_ref().map(|l| {
                    (
                        format!("{} rows/s, 1 writer", l.rate),
                        l.rows,
                        l.latency.as_ref(),
                        l.missing,
                    )
                }),
                m.load.as_ref().map(|l| {
                    (
                        format!("{} writers, {} s", l.writers, l.seconds),
                        l.committed,
                        l.latency.as_ref(),
                        l.missing,
                    )
                }),
            ];
            for (load, rows, latency, missing) in runs.into_iter().flatten() {
                let _ = writeln!(
                    s,
                    "| {} | {load} | {} | {} | {} | {} | {} | {} | {} | {missing} |",
                    m.mode,
                    int(rows as f64),
                    or_dash(latency, |l| ms(l.avg)),
                    or_dash(latency, |l| ms(l.p50)),
                    or_dash(latency, |l| ms(l.p99)),
                    or_dash(latency, |l| ms(l.max)),
                    or_dash(latency.zip(broker), |(l, b)| format!(
                        "{:.2}×",
                        l.p50 / b.p50
                    )),
                    or_dash(latency.zip(broker), |(l, b)| format!(
                        "{:.2}×",
                        l.p99 / b.p99
                    )),
                );
            }
        }
    }

    /// The writers at the load's users with a listening poller woken by NOTIFY.
    pub(super) fn notify_section(&self, s: &mut String) {
        if let Some(n) = &self.notify {
            let _ = writeln!(
                s,
                "\n### Writers at {} users: the NOTIFY trap\n",
                self.scale.load_writers
            );
            let _ = writeln!(
                s,
                "| Variant | Orders/s | ÷ ceiling | Avg commit→consumer |\n|---|---|---|---|"
            );
            let ceiling = n.ceiling.orders_per_sec;
            for (name, run) in [
                ("No relay (ceiling)", &n.ceiling),
                ("NOTIFY in a trigger, poll ×5 --listen", &n.trigger),
                ("NOTIFY after commit, poll ×5 --listen", &n.after_commit),
            ] {
                let _ = writeln!(
                    s,
                    "| {name} | {} | {} | {} |",
                    int(run.orders_per_sec),
                    if ceiling > 0.0 {
                        ratio(run.orders_per_sec / ceiling)
                    } else {
                        "—".into()
                    },
                    or_dash(run.latency.as_ref(), |l| ms(l.avg))
                );
            }
        }
    }

    /// The crash runs: kill -9 partway through the backlog, restart.
    pub(super) fn crash_section(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n### Crash: kill -9 partway through the backlog, restart\n"
        );
        let _ = writeln!(s, "| Setup | Rows | Received before kill | Lost | Duplicates | WAL bound |\n|---|---|---|---|---|---|");
        for m in &self.modes {
            if let Some(c) = &m.crash {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} |",
                    m.mode,
                    int(c.rows as f64),
                    int(c.received_before_kill as f64),
                    c.lost,
                    int(c.duplicates as f64),
                    or_dash(c.duplicate_bound, |b| int(b as f64))
                );
            }
        }
    }

    /// The --max-in-flight sweep.
    pub(super) fn sweep_section(&self, s: &mut String) {
        if !self.sweep.is_empty() {
            let _ = writeln!(
                s,
                "\n### WAL reader: --max-in-flight sweep ({} rows)\n",
                int(self.scale.sweep_rows as f64)
            );
            let _ = writeln!(s, "| max_in_flight | Drain MPS | Broker alone (relay's publisher) MPS | ÷ broker | p99 at {} rows/s | Crash lost | Crash duplicates | Bound |\n|---|---|---|---|---|---|---|---|", self.scale.latency_rate);
            for r in &self.sweep {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    int(f64::from(r.window)),
                    int(r.drain_msgs_per_sec),
                    int(r.broker_msgs_per_sec),
                    if r.broker_msgs_per_sec > 0.0 {
                        ratio(r.drain_msgs_per_sec / r.broker_msgs_per_sec)
                    } else {
                        "—".into()
                    },
                    or_dash(r.p99_ms, ms),
                    r.crash_lost,
                    int(r.crash_duplicates as f64),
                    int(r.duplicate_bound as f64)
                );
            }
        }
    }
}
