//! The token WAL mode acknowledges with: a position in the slot and what the relay reports
//! once it is acknowledged.
//!
//! Ack points come from the stream in order: a commit's end LSN, or a keepalive's WAL end /
//! a non-transactional logical message's LSN seen outside any transaction. When several are
//! acknowledged at once they fold into one: the highest LSN (a keepalive may name a position
//! below a commit already seen: the acknowledged position never moves back), the newest
//! commit time (cleanup deletes only rows older than it) and the newest own heartbeat
//! (heartbeat lag).

use pgwire_replication::Lsn;

use crate::publish::AckToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckPosition {
    pub lsn: Lsn,
    /// The commit time of the newest acknowledged transaction (µs since 2000-01-01).
    pub commit_time: Option<i64>,
    /// When the newest acknowledged own heartbeat was written (Unix µs).
    pub heartbeat_sent_at: Option<u64>,
}

impl AckPosition {
    /// A commit's end: acknowledging it says the whole transaction was delivered.
    pub(crate) fn commit(lsn: Lsn, commit_time: i64) -> Self {
        Self {
            lsn,
            commit_time: Some(commit_time),
            heartbeat_sent_at: None,
        }
    }

    /// A keepalive's WAL end, or someone else's non-transactional message.
    pub(crate) fn idle(lsn: Lsn) -> Self {
        Self {
            lsn,
            commit_time: None,
            heartbeat_sent_at: None,
        }
    }

    /// One of this relay's own heartbeats, written at `sent_at` (Unix µs).
    pub(crate) fn heartbeat(lsn: Lsn, sent_at: u64) -> Self {
        Self {
            lsn,
            commit_time: None,
            heartbeat_sent_at: Some(sent_at),
        }
    }
}

impl AckToken for AckPosition {
    fn fold(&mut self, newer: Self) {
        self.lsn = self.lsn.max(newer.lsn);
        self.commit_time = newer.commit_time.or(self.commit_time);
        self.heartbeat_sent_at = newer.heartbeat_sent_at.or(self.heartbeat_sent_at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::queue::ConfirmQueue;

    fn lsn(n: u64) -> Lsn {
        Lsn::from_u64(n)
    }

    #[test]
    fn reports_the_newest_acknowledged_commit_and_heartbeat() {
        let mut q = ConfirmQueue::new();
        q.push_ack_point(AckPosition::heartbeat(lsn(10), 1));
        q.push_publish("a".into(), ());
        q.push_ack_point(AckPosition::commit(lsn(20), 5));
        q.push_ack_point(AckPosition::heartbeat(lsn(30), 2));
        q.advance();
        let acknowledged = q.acknowledged().copied().expect("the first heartbeat");
        assert_eq!(acknowledged.heartbeat_sent_at, Some(1));
        assert_eq!(
            acknowledged.commit_time, None,
            "behind an unconfirmed publish"
        );
        q.settle_front(true).expect("front").expect("acked");
        assert!(q.advance());
        let acknowledged = q.acknowledged().copied().expect("all of it");
        assert_eq!(acknowledged.lsn, lsn(30));
        assert_eq!(acknowledged.commit_time, Some(5));
        assert_eq!(acknowledged.heartbeat_sent_at, Some(2));
    }

    #[test]
    fn never_moves_backwards() {
        let mut position = AckPosition::commit(lsn(300), 7);
        position.fold(AckPosition::idle(lsn(200)));
        assert_eq!(position.lsn, lsn(300));
        assert_eq!(
            position.commit_time,
            Some(7),
            "an idle point keeps the commit time"
        );
    }
}
