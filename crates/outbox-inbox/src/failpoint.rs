//! Failpoints: the consumer's crash window that timing cannot hit, opened on purpose by the
//! tests, in the same shape as the relay's (`OUTBOX_FAILPOINTS`).
//!
//! `OUTBOX_INBOX_FAILPOINTS=after-commit=abort` aborts the process the first time a worker has
//! committed a message's transaction and not yet acknowledged the delivery;
//! `after-commit=abort@N` the N-th time (counted over all workers). `std::process::abort` is
//! as abrupt as kill -9 at exactly that instruction: the effect is committed, the broker never
//! hears the ack and delivers the message again. Points:
//! - `before-commit`: the claim and the effect are done, COMMIT not yet sent (nothing may be
//!   acknowledged yet: the message must come again and be applied);
//! - `after-commit`: COMMIT returned, the ack not yet sent (the message comes again and must
//!   be dropped).
//!
//! Read once at startup by [`init_from_env`]; unset, [`failpoint`] costs one relaxed atomic
//! load. An unknown point or action is an error, so a typo cannot silently disable a crash.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable the failpoints are read from.
pub const ENV: &str = "OUTBOX_INBOX_FAILPOINTS";

/// After a message's claim and effect, before COMMIT.
pub const BEFORE_COMMIT: &str = "before-commit";
/// After a message's transaction committed, before its delivery is acknowledged.
pub const AFTER_COMMIT: &str = "after-commit";

/// Every failpoint the consumer has.
pub const POINTS: [&str; 2] = [BEFORE_COMMIT, AFTER_COMMIT];

static ARMED: AtomicBool = AtomicBool::new(false);
static ARMED_POINTS: OnceLock<Vec<Armed>> = OnceLock::new();

#[derive(Debug)]
struct Armed {
    name: String,
    /// Fires on this hit (1 = the first).
    at: u64,
    hits: AtomicU64,
}

/// Reads [`ENV`] and arms its points; an invalid value is an error naming the fix.
pub fn init_from_env() -> Result<(), String> {
    match std::env::var(ENV) {
        Ok(spec) if !spec.trim().is_empty() => {
            let points = parse(&spec)?;
            ARMED_POINTS
                .set(points)
                .map_err(|_| format!("{ENV} was read twice"))?;
            ARMED.store(true, Ordering::Release);
            Ok(())
        }
        _ => Ok(()),
    }
}

fn parse(spec: &str) -> Result<Vec<Armed>, String> {
    let fix = format!(
        "write name=abort or name=abort@N (N ≥ 1); names: {}",
        POINTS.join(", ")
    );
    spec.split([';', ','])
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
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
        let points = parse("after-commit=abort").expect("parses");
        assert_eq!((points[0].name.as_str(), points[0].at), (AFTER_COMMIT, 1));
        assert_eq!(parse(" after-commit = abort@7 ;").expect("parses")[0].at, 7);
    }

    #[test]
    fn rejects_what_it_does_not_know_naming_the_fix() {
        for bad in [
            "after-comit=abort",
            "after-commit",
            "after-commit=panic",
            "after-commit=abort@0",
        ] {
            let error = parse(bad).expect_err(bad);
            assert!(error.contains("name=abort"), "{bad}: {error}");
        }
    }
}
