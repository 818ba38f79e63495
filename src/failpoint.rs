//! The relay's failpoints (outbox_common::failpoint says how they are armed and that only a
//! build with the `failpoints` feature has them).
//!
//! Points:
//! - `poll-before-commit`: a polling worker after every confirm of its batch arrived and the
//!   rows were marked, just before COMMIT (the window that duplicates a batch).
//! - `recovery-backfill-confirmed`: a slot's recovery after every confirm of a backfill batch
//!   arrived, just before the batch's last row is recorded as its progress (the window that
//!   re-publishes a batch when the backfill resumes).
//!
//! Switches (`name=on`), the relay broken on purpose so that a test can show its oracle
//! catches it:
//! - `ack-before-confirm`: the delivery loop reports every ack point the moment it is queued,
//!   before the broker confirmed what precedes it (invariant 1 broken;
//!   crates/outbox-bench/lab/scenarios.md, "Negative controls").

pub(crate) use outbox_common::failpoint::{failpoint, switched_on};

/// The environment variable the failpoints are read from.
pub(crate) const ENV: &str = "OUTBOX_FAILPOINTS";

/// Every failpoint the relay has; a name not in this list is a configuration error.
pub(crate) const POINTS: [&str; 2] = [POLL_BEFORE_COMMIT, RECOVERY_BACKFILL_CONFIRMED];
/// Every switch the relay has.
pub(crate) const SWITCHES: [&str; 1] = [ACK_BEFORE_CONFIRM];
/// See the module documentation.
pub(crate) const POLL_BEFORE_COMMIT: &str = "poll-before-commit";
/// See the module documentation.
pub(crate) const RECOVERY_BACKFILL_CONFIRMED: &str = "recovery-backfill-confirmed";
/// See the module documentation.
pub(crate) const ACK_BEFORE_CONFIRM: &str = "ack-before-confirm";

/// Reads [`ENV`] and arms its points. Call once at startup; an invalid value is an error
/// naming the problem (so a typo never silently disables a test's crash).
pub fn init_from_env() -> Result<(), String> {
    let points = outbox_common::failpoint::Points {
        aborts: &POINTS,
        switches: &SWITCHES,
    };
    outbox_common::failpoint::init_from_env(ENV, points)
}
