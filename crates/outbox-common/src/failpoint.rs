//! Failpoints: crash windows that timing cannot hit, opened on purpose by the fault tests.
//!
//! Each binary names its points and the environment variable that arms them (the relay's
//! `OUTBOX_FAILPOINTS`, the inbox's `OUTBOX_INBOX_FAILPOINTS`). The variable names points and
//! what happens there, separated by `;` or `,`: `point=abort` aborts the process the first
//! time a task reaches the point, `point=abort@3` the third time (hits are counted across all
//! tasks). Abort is `std::process::abort`: no destructors, no flush, no COMMIT, nothing sent on
//! any connection, the same as kill -9 at exactly that instruction.
//!
//! A binary may also name *switches*: `switch=on` breaks the program on purpose for the whole
//! run ([`switched_on`]), so that a test can show its oracle catches the breakage (a negative
//! control). A switch takes only `on`, a point only `abort`.
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
    /// Fires on this hit (1 = the first); 0 for a switch turned on.
    at: u64,
    hits: AtomicU64,
}

/// What a binary can arm: its crash points and its switches.
#[derive(Debug, Clone, Copy)]
pub struct Points<'a> {
    /// Points that take `abort` or `abort@N`.
    pub aborts: &'a [&'a str],
    /// Switches that take `on`.
    pub switches: &'a [&'a str],
}

/// Reads `env` and arms its points and switches, each of which must be one of `points`. Call
/// once at startup; an invalid value is an error naming the problem (so a typo never silently
/// disables a test's crash).
pub fn init_from_env(env: &str, points: Points<'_>) -> Result<(), String> {
    match std::env::var(env) {
        Ok(spec) if !spec.trim().is_empty() => arm(env, points, &spec),
        _ => Ok(()),
    }
}

#[cfg(feature = "failpoints")]
fn arm(env: &str, points: Points<'_>, spec: &str) -> Result<(), String> {
    let armed = parse(env, points, spec)?;
    if ARMED_POINTS.set(armed).is_err() {
        return Err(format!("{env} was read twice"));
    }
    ARMED.store(true, Ordering::Release);
    Ok(())
}

#[cfg(not(feature = "failpoints"))]
fn arm(env: &str, _points: Points<'_>, _spec: &str) -> Result<(), String> {
    Err(format!(
        "{env} is set, but this build has no failpoints (it was built without the \
         `failpoints` feature, as a release is)"
    ))
}

#[cfg(any(test, feature = "failpoints"))]
fn parse(env: &str, points: Points<'_>, spec: &str) -> Result<Vec<Armed>, String> {
    spec.split([';', ','])
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let mut fix = format!(
                "write name=abort or name=abort@N (N ≥ 1), names: {}",
                points.aborts.join(", ")
            );
            if !points.switches.is_empty() {
                fix += &format!("; or switch=on, switches: {}", points.switches.join(", "));
            }
            let (name, action) = entry
                .split_once('=')
                .ok_or_else(|| format!("{env}: {entry:?} has no action: {fix}"))?;
            let (name, action) = (name.trim(), action.trim());
            let at = if points.switches.contains(&name) {
                match action {
                    "on" => 0,
                    _ => return Err(format!("{env}: {entry:?}: a switch takes only on: {fix}")),
                }
            } else if points.aborts.contains(&name) {
                match action.split_once('@') {
                    None if action == "abort" => 1,
                    Some(("abort", n)) => n
                        .trim()
                        .parse::<u64>()
                        .ok()
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| {
                            format!("{env}: {entry:?}: {n:?} is not a hit count: {fix}")
                        })?,
                    _ => return Err(format!("{env}: {entry:?}: unknown action: {fix}")),
                }
            } else {
                return Err(format!("{env}: unknown failpoint {name:?}: {fix}"));
            };
            Ok(Armed {
                name: name.to_string(),
                at,
                hits: AtomicU64::new(0),
            })
        })
        .collect()
}

/// Whether the switch `name` was turned on (`name=on`): the code that asks breaks itself on
/// purpose for the whole run. Always `false` without the `failpoints` feature.
#[cfg(feature = "failpoints")]
#[inline]
pub fn switched_on(name: &str) -> bool {
    ARMED.load(Ordering::Relaxed)
        && ARMED_POINTS
            .get()
            .is_some_and(|points| points.iter().any(|p| p.at == 0 && p.name == name))
}

/// Without the `failpoints` feature: never.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn switched_on(_name: &str) -> bool {
    false
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
    for point in points.iter().filter(|p| p.at > 0 && p.name == name) {
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
    const POINTS: Points<'static> = Points {
        aborts: &["poll-before-commit", "after-commit"],
        switches: &["ack-before-confirm"],
    };

    #[test]
    fn parses_abort_and_abort_at_n() {
        let points = parse(ENV, POINTS, "poll-before-commit=abort").expect("parses");
        assert_eq!(
            (points[0].name.as_str(), points[0].at),
            ("poll-before-commit", 1)
        );
        let points = parse(ENV, POINTS, " after-commit = abort@7 ;").expect("parses");
        assert_eq!((points[0].name.as_str(), points[0].at), ("after-commit", 7));
    }

    #[test]
    fn a_switch_takes_on_and_only_on_and_a_point_never_does() {
        let points = parse(ENV, POINTS, "ack-before-confirm=on").expect("parses");
        assert_eq!(
            (points[0].name.as_str(), points[0].at),
            ("ack-before-confirm", 0)
        );
        for bad in ["ack-before-confirm=abort", "poll-before-commit=on"] {
            let error = parse(ENV, POINTS, bad).expect_err(bad);
            assert!(error.contains("switch=on"), "{bad}: {error}");
        }
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
            let error = parse(ENV, POINTS, bad).expect_err(bad);
            assert!(error.contains("name=abort"), "{bad}: {error}");
        }
    }

    #[test]
    fn an_unarmed_point_does_nothing() {
        // Nothing armed in this test process: must return.
        failpoint("poll-before-commit");
        assert!(!switched_on("ack-before-confirm"));
    }
}
