//! After a failover: did the relay hand on events that the new primary does not have?
//!
//! A promoted standby starts a new timeline where it stopped replaying its old primary (the
//! switch point, in the new timeline's history file). A transaction whose commit record ends
//! past that point committed on the old primary only: its rows are not on the new one. If
//! the relay had already read it (it can, without `synchronized_standby_slots`), consumers
//! hold events of rows that do not exist (phantom events). Nothing can take them back; the
//! relay says so when a session finds itself on a newer timeline of the same system
//! (IDENTIFY_SYSTEM), reading the history with TIMELINE_HISTORY
//! (docs/high-availability.md, "Phantom events").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pgwire_replication::{Lsn, ReplicationClient};

use crate::observability::{PHANTOM_EVENTS_LABEL, POSTGRES_FAILOVERS_TOTAL};

/// The newest commit among the transactions the stream handed rows of to delivery on the
/// current server: the start of its commit record (pgoutput's Begin gives no more before the
/// Commit). Set by the stream, taken when a session finds another server. Cheap to clone
/// (clones share it).
#[derive(Debug, Clone, Default)]
pub(crate) struct HandedOver(Arc<AtomicU64>);

impl HandedOver {
    pub(crate) fn note(&self, commit_lsn: Lsn) {
        self.0.fetch_max(commit_lsn.as_u64(), Ordering::Relaxed);
    }

    /// What was noted, and starts afresh: another server's positions are compared with its
    /// own history.
    pub(crate) fn take(&self) -> Option<Lsn> {
        let noted = self.0.swap(0, Ordering::Relaxed);
        (noted != 0).then(|| Lsn::from_u64(noted))
    }
}

/// What a failover did to the events already handed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phantoms {
    /// Every transaction handed on committed before the switch point.
    None { switch_point: Lsn },
    /// A transaction handed on committed at or past it: its events are phantoms, and so are
    /// those of every other transaction between the two points.
    Possible { switch_point: Lsn, handed_over: Lsn },
    /// The history does not say where the old timeline ended.
    Unknown,
}

impl Phantoms {
    /// The metric's label value.
    fn label(self) -> &'static str {
        match self {
            Phantoms::None { .. } => "none",
            Phantoms::Possible { .. } => "possible",
            Phantoms::Unknown => "unknown",
        }
    }
}

/// Every timeline a server's descends from, with where each ended, from its history file's
/// text: its lines are `parent-timeline <tab> switch-point <tab> reason`, one per ancestor.
/// Lines that do not parse are left out.
pub(crate) fn ancestors(history: &str) -> Vec<(u32, Lsn)> {
    history
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let parent: u32 = fields.next()?.parse().ok()?;
            let point = Lsn::parse(fields.next()?).ok()?;
            Some((parent, point))
        })
        .collect()
}

/// Where `timeline` ended, from a history file's text. `None` when no line names `timeline`
/// (the server does not descend from it).
pub(crate) fn switch_point(history: &str, timeline: u32) -> Option<Lsn> {
    ancestors(history)
        .into_iter()
        .find_map(|(parent, point)| (parent == timeline).then_some(point))
}

/// The history file of `timeline` (TIMELINE_HISTORY), bounded like a connect; `None`, with
/// a warning, when the server does not give it.
pub(crate) async fn read_history(client: &mut ReplicationClient, timeline: u32) -> Option<String> {
    match tokio::time::timeout(
        outbox_common::pg::CONNECT_TIMEOUT,
        client.timeline_history(timeline),
    )
    .await
    {
        Ok(Ok(history)) => Some(String::from_utf8_lossy(&history.content).into_owned()),
        Ok(Err(e)) => {
            tracing::warn!(timeline, error = %e, "TIMELINE_HISTORY failed");
            None
        }
        Err(_) => {
            tracing::warn!(timeline, "TIMELINE_HISTORY did not answer");
            None
        }
    }
}

/// Judges the events handed on while streaming from `old_timeline`. A commit record that
/// starts at or past the switch point was not replayed; one that starts just before it and
/// ends past it was not either, and goes unseen here (a few bytes' window).
pub(crate) fn judge(
    history: Option<&str>,
    old_timeline: u32,
    handed_over: Option<Lsn>,
) -> Phantoms {
    let Some(switch_point) = history.and_then(|text| switch_point(text, old_timeline)) else {
        return Phantoms::Unknown;
    };
    match handed_over {
        Some(handed_over) if handed_over >= switch_point => Phantoms::Possible {
            switch_point,
            handed_over,
        },
        _ => Phantoms::None { switch_point },
    }
}

/// On a gated session whose server is on `timeline`, a newer timeline of the system the
/// relay streamed from on `old_timeline`: from the history (`None` if the server did not give
/// it), says what the failover did to the events handed on, and counts it. Never fails the
/// session: the history only informs.
pub(crate) fn report_failover(
    history: Option<&str>,
    old_timeline: u32,
    timeline: u32,
    handed_over: Option<Lsn>,
) -> Phantoms {
    let verdict = judge(history, old_timeline, handed_over);
    match verdict {
        Phantoms::Possible {
            switch_point,
            handed_over,
        } => tracing::warn!(
            old_timeline,
            timeline,
            switch_point = %switch_point,
            handed_over = %handed_over,
            "phantom events: the relay published events of transactions that committed on \
             the old primary at or after the switch point, up to the handed_over commit; the \
             new primary does not have their rows. Consumers may hold events whose rows do not \
             exist. Set synchronized_standby_slots on the primary to prevent it \
             (docs/high-availability.md, \"Phantom events\")"
        ),
        Phantoms::None { switch_point } => tracing::info!(
            old_timeline,
            timeline,
            switch_point = %switch_point,
            "a failover lost nothing the relay had published: every transaction it read \
             committed before the switch point"
        ),
        Phantoms::Unknown => tracing::warn!(
            old_timeline,
            timeline,
            "the new timeline's history does not say where the old one ended: whether the \
             failover left phantom events is unknown"
        ),
    }
    metrics::counter!(POSTGRES_FAILOVERS_TOTAL, PHANTOM_EVENTS_LABEL => verdict.label())
        .increment(1);
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lsn(text: &str) -> Lsn {
        Lsn::parse(text).unwrap_or_else(|e| panic!("{text}: {e:?}"))
    }

    /// A history file as PostgreSQL writes it, two promotions deep.
    const HISTORY: &str = "1\t0/3000060\tno recovery target specified\n\
                           \n\
                           2\t0/5A2B1C8\tno recovery target specified\n";

    #[test]
    fn the_switch_point_is_the_line_that_names_the_old_timeline() {
        assert_eq!(switch_point(HISTORY, 1), Some(lsn("0/3000060")));
        assert_eq!(switch_point(HISTORY, 2), Some(lsn("0/5A2B1C8")));
        assert_eq!(switch_point(HISTORY, 3), None, "not an ancestor");
        assert_eq!(switch_point("", 1), None);
        assert_eq!(switch_point("x\t0/1\n1\tnot-an-lsn\n", 1), None);
        assert_eq!(
            ancestors(HISTORY),
            [(1, lsn("0/3000060")), (2, lsn("0/5A2B1C8"))]
        );
    }

    #[test]
    fn a_commit_at_or_past_the_switch_point_is_a_phantom() {
        let point = lsn("0/3000060");
        assert_eq!(
            judge(Some(HISTORY), 1, Some(lsn("0/3000060"))),
            Phantoms::Possible {
                switch_point: point,
                handed_over: lsn("0/3000060")
            }
        );
        assert_eq!(
            judge(Some(HISTORY), 1, Some(lsn("0/300005F"))),
            Phantoms::None {
                switch_point: point
            }
        );
        assert_eq!(
            judge(Some(HISTORY), 1, None),
            Phantoms::None {
                switch_point: point
            },
            "nothing handed on, nothing lost"
        );
        assert_eq!(judge(None, 1, Some(point)), Phantoms::Unknown);
        assert_eq!(judge(Some(HISTORY), 7, Some(point)), Phantoms::Unknown);
    }

    #[test]
    fn handed_over_keeps_the_newest_and_starts_afresh_when_taken() {
        let noted = HandedOver::default();
        assert_eq!(noted.take(), None);
        noted.note(lsn("0/20"));
        noted.clone().note(lsn("0/10"));
        assert_eq!(noted.take(), Some(lsn("0/20")));
        assert_eq!(noted.take(), None);
    }
}
