//! Failpoints: crash windows that timing cannot hit, opened on purpose by the fault tests.
//!
//! `OUTBOX_FAILPOINTS` names points and what happens there, separated by `;` or `,`:
//! `poll-before-commit=abort` aborts the process the first time a worker reaches the point,
//! `poll-before-commit=abort@3` the third time (hits are counted across all workers). Abort is
//! `std::process::abort`: no destructors, no flush, no COMMIT, nothing sent on any
//! connection, the same as kill -9 at exactly that instruction.
//!
//! The variable is read once, by [`init_from_env`] at startup. Unset, [`failpoint`] costs one
//! relaxed atomic load and a branch: nothing measurable next to a network round trip.
//!
//! Points:
//! - `poll-before-commit`: a polling worker after every confirm of its batch arrived and the
//!   rows were marked, just before COMMIT (the window that duplicates a batch).
//!
//! It must never act unless the variable names a point, and never ignore a value it cannot
//! read: an unknown point or action is an error at startup, so a typo cannot silently disable
//! a test's crash.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable the failpoints are read from.
pub const ENV: &str = "OUTBOX_FAILPOINTS";

/// Every failpoint the relay has; a name not in this list is a configuration error.
pub const POINTS: [&str; 1] = [POLL_BEFORE_COMMIT];
/// See the module documentation.
pub const POLL_BEFORE_COMMIT: &str = "poll-before-commit";

/// Set once some point is armed: the fast path of [`failpoint`] reads only this.
static ARMED: AtomicBool = AtomicBool::new(false);
static ARMED_POINTS: OnceLock<Vec<Armed>> = OnceLock::new();

#[derive(Debug)]
struct Armed {
    name: String,
    /// Fires on this hit (1 = the first).
    at: u64,
    hits: AtomicU64,
}

/// Reads [`ENV`] and arms its points. Call once at startup; an invalid value is an error
/// naming the problem (so a typo never silently disables a test's crash).
pub fn init_from_env() -> Result<(), String> {
    match std::env::var(ENV) {
        Ok(spec) if !spec.trim().is_empty() => arm(&spec),
        _ => Ok(()),
    }
}

fn arm(spec: &str) -> Result<(), String> {
    let points = parse(spec)?;
    if ARMED_POINTS.set(points).is_err() {
        return Err(format!("{ENV} was read twice"));
    }
    ARMED.store(true, Ordering::Release);
    Ok(())
}

fn parse(spec: &str) -> Result<Vec<Armed>, String> {
    spec.split([';', ','])
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let fix = format!(
                "write name=abort or name=abort@N (N ≥ 1), names: {}",
                POINTS.join(", ")
            );
            let (name, action) = entry
                .split_once('=')
                .ok_or_else(|| format!("{ENV}: {entry:?} has no action: {fix}"))?;
            let name = name.trim();
            if !POINTS.contains(&name) {
                return Err(format!("{ENV}: unknown failpoint {name:?}: {fix}"));
            }
            let at = match action.trim().split_once('@') {
                None if action.trim() == "abort" => 1,
                Some(("abort", n)) => n
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| format!("{ENV}: {entry:?}: {n:?} is not a hit count: {fix}"))?,
                _ => return Err(format!("{ENV}: {entry:?}: unknown action: {fix}")),
            };
            Ok(Armed {
                name: name.to_string(),
                at,
                hits: AtomicU64::new(0),
            })
        })
        .collect()
}

/// Aborts the process here if `name` is armed and this is its hit; otherwise nothing.
#[inline]
pub fn failpoint(name: &str) {
    if ARMED.load(Ordering::Relaxed) {
        hit(name);
    }
}

#[cold]
fn hit(name: &str) {
    let Some(points) = ARMED_POINTS.get() else {
        return;
    };
    for point in points.iter().filter(|p| p.name == name) {
        if point.hits.fetch_add(1, Ordering::SeqCst) + 1 == point.at {
            // stderr is unbuffered: the line is out before the abort.
            eprintln!("failpoint {name} fired (hit {}): aborting", point.at);
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_abort_and_abort_at_n() {
        let points = parse("poll-before-commit=abort").expect("parses");
        assert_eq!(
            (points[0].name.as_str(), points[0].at),
            (POLL_BEFORE_COMMIT, 1)
        );
        let points = parse(" poll-before-commit = abort@7 ;").expect("parses");
        assert_eq!(points[0].at, 7);
    }

    #[test]
    fn rejects_what_it_does_not_know_naming_the_fix() {
        for bad in [
            "poll-before-comit=abort",
            "poll-before-commit",
            "poll-before-commit=panic",
            "poll-before-commit=abort@0",
            "poll-before-commit=abort@x",
        ] {
            let error = parse(bad).expect_err(bad);
            assert!(error.contains("name=abort"), "{bad}: {error}");
        }
    }

    #[test]
    fn an_unarmed_point_does_nothing() {
        // Nothing armed in this test process: must return.
        failpoint(POLL_BEFORE_COMMIT);
    }
}
