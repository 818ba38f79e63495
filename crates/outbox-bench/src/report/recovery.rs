//! The Markdown of `outbox-bench bench --recovery-rounds` (the figures are
//! [`crate::measurement::results::recovery`]).

use std::fmt::Write as _;

use crate::measurement::figures::{int, median, or_dash};
use crate::measurement::results::recovery::{Recovery, Round, Scenario};

/// `1.23 s`.
fn secs(x: f64) -> String {
    format!("{x:.2} s")
}

/// The target: `10 s`.
fn whole_secs(x: f64) -> String {
    format!("{x:.0} s")
}

/// A time with its verdict against the target.
fn judged(x: f64, target: f64) -> String {
    if x <= target {
        format!("{} (met)", secs(x))
    } else {
        format!("{} (**missed**)", secs(x))
    }
}

impl Recovery {
    pub fn markdown(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "### Recovery: {} round(s) per fault, target {} from the fault to streaming again\n",
            self.rounds,
            whole_secs(self.target_secs)
        );
        for scenario in [&self.broker_node, &self.pg_failover].into_iter().flatten() {
            scenario.markdown(s, self.target_secs);
        }
        let _ = writeln!(
            s,
            "The section took {:.0} s (starting the cluster {:.0} s of it). The target is \
             reported, not enforced; a round that lost a row fails the run.",
            self.seconds, self.cluster_startup_secs
        );
    }
}

impl Scenario {
    fn markdown(&self, s: &mut String, target: f64) {
        let c = &self.conditions;
        let start = self.fault.start();
        let promoted = self.rounds.iter().any(|r| r.fault_to_start_secs.is_some());
        let restored = self.rounds.iter().any(|r| r.restore_secs.is_some());
        let transactions = match c.writer_txn_rows {
            1 => "single-row transactions".to_string(),
            n => format!("transactions of 1 to {n} rows"),
        };
        let _ = writeln!(s, "#### {}\n", self.fault.title());
        let _ = writeln!(
            s,
            "{}; PostgreSQL {} (wal_sender_timeout {}); the relay through {}, `--max-in-flight \
             {}`, `--max-backoff {}s` (backoff doubles from 0.5 s), `--status-interval \
             {}ms`, `--peer-timeout` {} s (its default: AMQP heartbeat {} s); a backlog of {} rows \
             committed before the relay started, and {} writers committing {transactions} with \
             {} ms between them throughout.\n",
            c.broker,
            c.postgres,
            c.wal_sender_timeout,
            c.route,
            int(f64::from(c.max_in_flight)),
            c.max_backoff_secs,
            c.status_interval_ms,
            c.peer_timeout_secs,
            c.amqp_heartbeat_secs,
            int(c.backlog_rows as f64),
            c.writers,
            c.writer_pause_ms
        );
        let _ = write!(
            s,
            "| Round | Load | Fault | In flight at the fault | Undelivered at the fault | \
             Writers, rows/s |"
        );
        if promoted {
            let _ = write!(s, " Kill → promoted |");
        }
        let _ = write!(
            s,
            " {start} → streaming (≤ {}) | {start} → first confirm | {start} → row delivered | \
             Rows | Lost | Duplicates | Unexpected |",
            whole_secs(target)
        );
        let _ = writeln!(s, "{}", if restored { " Restored in |" } else { "" });
        let columns = 13 + usize::from(promoted) + usize::from(restored);
        let _ = writeln!(s, "|{}", "---|".repeat(columns));
        for r in &self.rounds {
            let _ = write!(
                s,
                "| {} | {} | {} | {} | {} | {} |",
                r.round,
                r.load,
                r.fault,
                or_dash(r.in_flight_at_fault, int),
                or_dash(r.undelivered_at_fault, |n| int(n as f64)),
                int(r.writer_rows_per_sec)
            );
            if promoted {
                let _ = write!(s, " {} |", or_dash(r.fault_to_start_secs, secs));
            }
            let _ = write!(
                s,
                " {} | {} | {} | {} | {} | {} | {} |",
                judged(r.streaming_secs, target),
                or_dash(r.first_confirm_secs, secs),
                or_dash(r.delivered_secs, secs),
                int(r.rows as f64),
                r.lost,
                int(r.duplicates as f64),
                r.unexpected,
            );
            if restored {
                let _ = write!(s, " {} |", or_dash(r.restore_secs, secs));
            }
            s.push('\n');
        }
        let pick = |f: fn(&Round) -> Option<f64>| -> Vec<f64> {
            self.rounds.iter().filter_map(f).collect()
        };
        let streaming = pick(|r| Some(r.streaming_secs));
        let columns: [Vec<f64>; 4] = [
            pick(|r| r.fault_to_start_secs),
            streaming.clone(),
            pick(|r| r.first_confirm_secs),
            pick(|r| r.delivered_secs),
        ];
        for (name, of) in [("median", median as fn(Vec<f64>) -> f64), ("max", max)] {
            let figure = |values: &Vec<f64>| (!values.is_empty()).then(|| of(values.clone()));
            let _ = write!(s, "| {name} | | | | | |");
            if promoted {
                let _ = write!(s, " {} |", or_dash(figure(&columns[0]), secs));
            }
            let _ = writeln!(
                s,
                " {} | {} | {} | | | | |{}",
                or_dash(figure(&columns[1]), |x| judged(x, target)),
                or_dash(figure(&columns[2]), secs),
                or_dash(figure(&columns[3]), secs),
                if restored { " |" } else { "" }
            );
        }
        let missed = self.rounds.iter().filter(|r| !r.met(target)).count();
        let verdict = match missed {
            0 => format!("**met** in every round (max {})", secs(max(streaming))),
            n => format!("**missed** in {n} of {} rounds", self.rounds.len()),
        };
        let _ = writeln!(
            s,
            "\n{start} → streaming within {} (the tests {} check the recovery, not its time): \
             {verdict}. Streaming: \
             the relay's `outbox_relay_sessions_total` grew; first confirm: its \
             `outbox_relay_messages_confirmed_total` grew past its value at the {}; row \
             delivered: a row inserted then reached the consumer.\n",
            whole_secs(target),
            self.fault.checked_by(),
            start.to_lowercase()
        );
    }
}

fn max(values: Vec<f64>) -> f64 {
    values.into_iter().fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use crate::measurement::results::recovery::*;
    use crate::measurement::results::Results;

    fn round(round: u32, streaming: f64, promoted: Option<f64>) -> Round {
        Round {
            round,
            load: "0.50 0.40 0.30".into(),
            fault: "node 1 (follower) → node 2".into(),
            in_flight_at_fault: Some(1024.0),
            undelivered_at_fault: Some(12_000),
            writer_rows_per_sec: 450.0,
            fault_to_start_secs: promoted,
            streaming_secs: streaming,
            first_confirm_secs: Some(streaming + 0.01),
            delivered_secs: Some(streaming + 1.0),
            rows: 30_000,
            lost: 0,
            duplicates: 1_100,
            unexpected: 0,
            restore_secs: promoted.is_none().then_some(9.0),
        }
    }

    fn sample() -> Recovery {
        Recovery {
            rounds: 3,
            target_secs: TARGET.as_secs_f64(),
            broker_node: Some(Scenario {
                fault: Fault::BrokerNode,
                conditions: Conditions {
                    max_in_flight: 1024,
                    max_backoff_secs: 2,
                    writer_txn_rows: 10,
                    ..Conditions::default()
                },
                rounds: vec![
                    round(1, 1.5, None),
                    round(2, 0.5, None),
                    round(3, 12.0, None),
                ],
            }),
            pg_failover: Some(Scenario {
                fault: Fault::PgFailover,
                conditions: Conditions {
                    writer_txn_rows: 1,
                    ..Conditions::default()
                },
                rounds: vec![round(1, 2.0, Some(1.0)), round(2, 3.0, Some(1.5))],
            }),
            cluster_startup_secs: 20.0,
            seconds: 200.0,
        }
    }

    #[test]
    fn every_round_then_median_and_max_each_judged_against_the_target() {
        let mut text = String::new();
        sample().markdown(&mut text);
        let line = |prefix: &str, nth: usize| {
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .nth(nth)
                .unwrap_or_else(|| panic!("no `{prefix}` in {text}"))
                .to_string()
        };
        assert!(line("| 3 |", 0).contains("| 12.00 s (**missed**) | 12.01 s | 13.00 s |"));
        assert!(line("| 1 |", 0).contains("| 1.50 s (met) |"), "{text}");
        assert!(line("| 1 |", 0).ends_with("| 30,000 | 0 | 1,100 | 0 | 9.00 s |"));
        assert!(line("| median |", 0).contains("| 1.50 s (met) | 1.51 s | 2.50 s |"));
        assert!(
            line("| max |", 0).contains("| 12.00 s (**missed**) |"),
            "{text}"
        );
        assert!(text.contains("**missed** in 1 of 3 rounds"), "{text}");
        // The failover's table has the promotion's own column, and its verdict.
        let header = line("| Round |", 1);
        assert!(header.contains("| Kill → promoted | Promotion → streaming (≤ 10 s) |"));
        assert!(!header.contains("Restored in"), "{header}");
        for row in [header.as_str(), &line("|---", 1), &line("| max |", 1)] {
            assert_eq!(row.matches('|').count(), 15, "{row}");
        }
        for row in [line("| Round |", 0), line("|---", 0), line("| max |", 0)] {
            assert_eq!(row.matches('|').count(), 15, "{row}");
        }
        assert!(
            line("| median |", 1).contains("| 1.50 s | 3.00 s (met) |"),
            "{text}"
        );
        assert!(
            text.contains("**met** in every round (max 3.00 s)"),
            "{text}"
        );
        assert!(text.contains("`--max-backoff 2s`"), "{text}");
        assert!(
            text.contains("writers committing transactions of 1 to 10 rows"),
            "{text}"
        );
        assert!(
            text.contains("writers committing single-row transactions"),
            "{text}"
        );
    }

    #[test]
    fn a_recovery_only_run_reports_only_the_section_and_old_files_read_without_it() {
        let results = Results {
            recovery: Some(sample()),
            ..Results::default()
        };
        let text = results.markdown();
        assert!(
            text.contains("### Recovery: 3 round(s) per fault"),
            "{text}"
        );
        assert!(!text.contains("Reference table"), "{text}");
        assert!(!text.contains("Scale "), "{text}");
        let json = serde_json::to_string(&results).expect("serialise");
        let back: Results = serde_json::from_str(&json).expect("read back");
        let scenario = back.recovery.and_then(|r| r.pg_failover).expect("failover");
        assert_eq!(scenario.fault, Fault::PgFailover);
        assert_eq!(scenario.rounds[1].fault_to_start_secs, Some(1.5));
        let old: Results = serde_json::from_str("{}").expect("an old file");
        assert!(old.recovery.is_none());
        assert!(!serde_json::to_string(&old)
            .expect("serialise")
            .contains("recovery"));
    }
}
