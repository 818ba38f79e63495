//! The report of a run as Markdown ([`Results::markdown`]) and the targets it is held to
//! ([`Results::targets`]): a view over the whole run, above [`crate::measurement::results`] (its data) and
//! the sections' own tables, so that the data imports none of its views.

use std::fmt::Write as _;

use crate::measurement::figures::int;
use crate::measurement::results::{ModeResults, Results, MODES};
use crate::report::setup_table;

impl Results {
    pub fn wal(&self) -> Option<&ModeResults> {
        self.modes.iter().find(|m| m.mode == MODES[2])
    }

    /// The whole report in Markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        self.header(&mut s);
        let m = &self.machine;
        if !m.load_average.is_empty() {
            let _ = writeln!(s, "Load average at the start: {}.\n", m.load_average);
        }
        if let Some(pinning) = &m.pinning {
            let _ = writeln!(s, "CPUs: {pinning}.\n");
        }
        if !self.ab.is_empty() {
            ab_table(&mut s, &self.ab);
            return s;
        }
        if let Some(c) = &self.compare {
            c.markdown(&mut s);
            return s;
        }
        if let Some(c) = &self.cost_growth {
            c.markdown(&mut s);
            return s;
        }
        if !self.shards.is_empty() {
            self.shards_table(&mut s);
            return s;
        }
        if !self.emit_writers.is_empty() || !self.emit_drains.is_empty() {
            self.emit_tables(&mut s);
            return s;
        }
        if self.modes.is_empty() {
            if let Some(c) = &self.cluster {
                self.cluster_table(&mut s, c);
                s.push('\n');
                setup_table::markdown(self, &mut s);
                self.targets_list(&mut s);
                self.recovery_section(&mut s);
                return s;
            }
            if let Some(r) = &self.recovery {
                r.markdown(&mut s);
                return s;
            }
        }
        self.reference_table(&mut s);
        self.limits_section(&mut s);
        self.latency_section(&mut s);
        self.notify_section(&mut s);
        self.crash_section(&mut s);
        self.sweep_section(&mut s);

        self.targets_list(&mut s);
        if let Some(c) = &self.cluster {
            s.push('\n');
            self.cluster_table(&mut s, c);
        }
        self.recovery_section(&mut s);
        s
    }

    /// The recovery section after the others, when the run had one.
    fn recovery_section(&self, s: &mut String) {
        if let Some(r) = &self.recovery {
            s.push('\n');
            r.markdown(s);
        }
    }

    /// The first lines: the machine, the servers' versions and settings, and the scale.
    fn header(&self, s: &mut String) {
        let w = self.scale.max_in_flight;
        let m = &self.machine;
        let settings: Vec<String> = m
            .postgres_settings
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        // A --recovery-only run has none of the suite's scale: its section gives its own
        // conditions.
        let scale = if self.modes.is_empty() && self.cluster.is_none() && self.recovery.is_some() {
            String::new()
        } else {
            format!(
                " Scale {}: backlogs of {} rows, drain window {} s, {} rows/s for {} s, {} \
                 writers for {} s; WAL --max-in-flight {}, --status-interval {}ms.",
                self.scale.name,
                int(self.scale.drain_rows as f64),
                self.scale.drain_window_secs,
                self.scale.latency_rate,
                self.scale.latency_secs,
                self.scale.load_writers,
                self.scale.load_secs,
                int(f64::from(w)),
                self.scale.status_interval_ms
            )
        };
        let _ = writeln!(
            s,
            "Run {} of relay {}: {} cores, {} MiB, Linux {}; PostgreSQL {} ({}); RabbitMQ \
             {}.{scale}\n",
            m.started_at,
            m.relay_commit,
            m.cores,
            m.memory_mib,
            m.kernel,
            m.postgres,
            settings.join(", "),
            m.rabbitmq,
        );
    }
}

mod cluster;
mod other_runs;
mod suite_sections;
mod targets;

use other_runs::ab_table;
use targets::pairs_text;

#[cfg(test)]
mod tests;
