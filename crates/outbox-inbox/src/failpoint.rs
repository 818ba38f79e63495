//! The consumer's failpoints: its crash window that timing cannot hit, opened on purpose by
//! the tests (outbox_common::failpoint says how they are armed and that only a build with the
//! `failpoints` feature has them). Points:
//! - `before-commit`: the claim and the effect are done, COMMIT not yet sent (nothing may be
//!   acknowledged yet: the message must come again and be applied);
//! - `after-commit`: COMMIT returned, the ack not yet sent (the message comes again and must
//!   be dropped).
//!
//! Switches (`name=on`), the consumer broken on purpose so that a test can show its oracle
//! catches it:
//! - `ignore-claims`: a message its inbox has claimed already is applied again, as a consumer
//!   without the claim would (crates/outbox-bench/lab/scenarios.md, "Negative controls").

pub use outbox_common::failpoint::{failpoint, switched_on};

/// The environment variable the failpoints are read from.
pub const ENV: &str = "OUTBOX_INBOX_FAILPOINTS";

/// After a message's claim and effect, before COMMIT.
pub const BEFORE_COMMIT: &str = "before-commit";
/// After a message's transaction committed, before its delivery is acknowledged.
pub const AFTER_COMMIT: &str = "after-commit";

/// Every failpoint the consumer has.
pub const POINTS: [&str; 2] = [BEFORE_COMMIT, AFTER_COMMIT];
/// A claim that finds the message claimed already is ignored (see the module documentation).
pub const IGNORE_CLAIMS: &str = "ignore-claims";
/// Every switch the consumer has.
pub const SWITCHES: [&str; 1] = [IGNORE_CLAIMS];

/// Reads [`ENV`] and arms its points; an invalid value is an error naming the fix.
pub fn init_from_env() -> Result<(), String> {
    let points = outbox_common::failpoint::Points {
        aborts: &POINTS,
        switches: &SWITCHES,
    };
    outbox_common::failpoint::init_from_env(ENV, points)
}
