//! Failpoints: crash windows that timing cannot hit, opened on purpose by the fault tests.
//!
//! Each binary names its points and the environment variable that arms them (the relay's
//! `OUTBOX_FAILPOINTS`, the inbox's `OUTBOX_INBOX_FAILPOINTS`). The variable names points and
//! what happens there, separated by `;` or `,`: `point=abort` aborts the process the first
//! time a task reaches the point, `point=abort@3` the third time (hits are counted across all
//! tasks). Abort is `std::process::abort`: no destructors, no flush, no COMMIT, nothing sent on
//! any connection, the same as kill -9 at exactly that instruction.
//!
//! The variable is read once, by [`init_from_env`] at startup. Unset, [`failpoint`] costs one
//! relaxed atomic load and a branch: nothing measurable next to a network round trip.
//!
//! Only a build with the `failpoints` feature has them (the test builds: the relay's and the
//! inbox's dev-dependencies turn it on); in any other build [`failpoint`] is empty, and a set
//! variable is an error at startup rather than a crash that silently never comes.
//!
//! It must never act unless the variable names a point, and never ignore a value it cannot
//! read: an unknown point or action is an error at startup, so a typo cannot silently disable
//! a test's crash.

#[cfg(any(test, feature = "failpoints"))]
use std::sync::atomic::AtomicU64;
#[cfg(feature = "failpoints")]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(feature = "failpoints")]
use std::sync::OnceLock;

/// Set once some point is armed: the fast path of [`failpoint`] reads only this.
#[cfg(feature = "failpoints")]
static ARMED: AtomicBool = AtomicBool::new(false);
#[cfg(feature = "failpoints")]
static ARMED_POINTS: OnceLock<Vec<Armed>> = OnceLock::new();

#[cfg(any(test, feature = "failpoints"))]
#[derive(Debug)]
struct Armed {
    name: String,
    /// Fires on this hit (1 = the first).
    at: u64,
    hits: AtomicU64,
}

/// Reads `env` and arms its points, each of which must be one of `points`. Call once at
/// startup; an invalid value is an error naming the problem (so a typo never silently
/// disables a test's crash).
pub fn init_from_env(env: &str, points: &[&str]) -> Result<(), String> {
    match std::env::var(env) {
        Ok(spec) if !spec.trim().is_empty() => arm(env, points, &spec),
        _ => Ok(()),
    }
}

#[cfg(feature = "failpoints")]
fn arm(env: &str, points: &[&str], spec: &str) -> Result<(), String> {
    let armed = parse(env, points, spec)?;
    if ARMED_POINTS.set(armed).is_err() {
        return Err(format!("{env} was read twice"));
    }
    ARMED.store(true, Ordering::Release);
    Ok(())
}

#[cfg(not(feature = "failpoints"))]
fn arm(env: &str, _points: &[&str], _spec: &str) -> Result<(), String> {
    Err(format!(
        "{env} is set, but this build has no failpoints (it was built without the \
         `failpoints` feature, as a release is)"
    ))
}

#[cfg(any(test, feature = "failpoints"))]
fn parse(env: &str, points: &[&str], spec: &str) -> Result<Vec<Armed>, String> {
    spec.split([';', ','])
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let fix = format!(
                "write name=abort or name=abort@N (N ≥ 1), names: {}",
                points.join(", ")
            );
            let (name, action) = entry
                .split_once('=')
                .ok_or_else(|| format!("{env}: {entry:?} has no action: {fix}"))?;
            let name = name.trim();
            if !points.contains(&name) {
                return Err(format!("{env}: unknown failpoint {name:?}: {fix}"));
            }
            let at = match action.trim().split_once('@') {
                None if action.trim() == "abort" => 1,
                Some(("abort", n)) => n
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| format!("{env}: {entry:?}: {n:?} is not a hit count: {fix}"))?,
                _ => return Err(format!("{env}: {entry:?}: unknown action: {fix}")),
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
#[cfg(feature = "failpoints")]
#[inline]
pub fn failpoint(name: &str) {
    if ARMED.load(Ordering::Relaxed) {
        hit(name);
    }
}

/// Without the `failpoints` feature: nothing, and nothing of it left in the binary.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn failpoint(_name: &str) {}

#[cfg(feature = "failpoints")]
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

    const ENV: &str = "TEST_FAILPOINTS";
    const POINTS: [&str; 2] = ["poll-before-commit", "after-commit"];

    #[test]
    fn parses_abort_and_abort_at_n() {
        let points = parse(ENV, &POINTS, "poll-before-commit=abort").expect("parses");
        assert_eq!(
            (points[0].name.as_str(), points[0].at),
            ("poll-before-commit", 1)
        );
        let points = parse(ENV, &POINTS, " after-commit = abort@7 ;").expect("parses");
        assert_eq!((points[0].name.as_str(), points[0].at), ("after-commit", 7));
    }

    #[test]
    fn rejects_what_it_does_not_know_naming_the_fix() {
        for bad in [
            "poll-before-comit=abort",
            "poll-before-commit",
            "poll-before-commit=panic",
            "poll-before-commit=abort@0",
            "poll-before-commit=abort@x",
            "after-commit=abort@",
        ] {
            let error = parse(ENV, &POINTS, bad).expect_err(bad);
            assert!(error.contains("name=abort"), "{bad}: {error}");
        }
    }

    #[test]
    fn an_unarmed_point_does_nothing() {
        // Nothing armed in this test process: must return.
        failpoint("poll-before-commit");
    }
}
