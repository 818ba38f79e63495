//! The CPU split of a whole run: every drain's and broker-alone run's [`CpuSplit`], as the
//! report's table and the CPU chart read them; above [`crate::measurement::results`], which holds the splits.

use std::fmt::Write as _;

use crate::measurement::cpu::CpuSplit;
use crate::measurement::figures::int;
use crate::measurement::results::Results;

/// µs with one decimal, or a dash.
fn us_cell(us: Option<f64>) -> String {
    us.map_or_else(|| "—".into(), |us| format!("{us:.1}"))
}

impl Results {
    /// Every CPU split of the run: the drains, then the broker-alone limits.
    pub(crate) fn cpu_splits(&self) -> Vec<(String, &CpuSplit)> {
        let mut rows = Vec::new();
        for m in &self.modes {
            let drains = [
                (m.drain.as_ref(), "single-row txns"),
                (m.drain_batched.as_ref(), "1,000-row txns"),
            ];
            for (drain, kind) in drains {
                if let Some(cpu) = drain.and_then(|d| d.cpu.as_ref()) {
                    rows.push((format!("{}: drain, {kind}", m.mode), cpu));
                }
            }
        }
        let window = int(f64::from(self.scale.max_in_flight));
        if let Some(cpu) = &self.limits.broker_cpu {
            rows.push((
                format!("Broker alone, relay's publisher, window {window}"),
                cpu,
            ));
        }
        for bare in [
            &self.limits.bare_broker,
            &self.limits.bare_broker_no_consumer,
        ]
        .into_iter()
        .flatten()
        {
            if let Some(cpu) = &bare.cpu {
                let consumer = if bare.consumer {
                    "consumer attached"
                } else {
                    "no consumer"
                };
                rows.push((
                    format!("Broker alone, minimal publisher, window {window}, {consumer}"),
                    cpu,
                ));
            }
        }
        rows
    }

    /// The "CPU split" table (nothing if no split was measured).
    pub(crate) fn cpu_split_table(&self, s: &mut String) {
        let rows = self.cpu_splits();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(s, "\n### CPU split, µs per message (same run)\n");
        let _ = writeln!(
            s,
            "| Run | Messages | Relay | Walsender | RabbitMQ | outbox-bench | Sum | Relay ÷ RabbitMQ |\n\
             |---|---|---|---|---|---|---|---|"
        );
        for (name, c) in rows {
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {} | {} | {} | {:.1} | {} |",
                int(c.messages as f64),
                us_cell(c.relay_us),
                us_cell(c.walsender_us),
                us_cell(c.rabbitmq_us),
                us_cell(c.bench_us),
                c.total_us(),
                c.relay_per_rabbitmq()
                    .map_or_else(|| "—".into(), |r| format!("{r:.2}"))
            );
        }
        let _ = writeln!(
            s,
            "\nCPU time (utime + stime from /proc) per message received (confirmed, without a \
             consumer), from the relay's start (the publisher's first message) to the last \
             receipt: the relay process, the walsender serving its slot, the RabbitMQ node \
             (beam.smp), and outbox-bench itself (the consumer; in the broker-alone rows also \
             the publisher, the relay's publisher code in its row). Relay ÷ RabbitMQ: the \
             relay's CPU per message over RabbitMQ's in the same run, which a machine's speed \
             moves less than either (the target: 0.2 or less). — : not measured."
        );
    }
}
