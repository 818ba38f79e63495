//! The in-order confirm queue: which LSN may be acknowledged to PostgreSQL.
//!
//! Publishes and ack points enter in stream order. An ack point is a commit's end LSN, or a
//! keepalive's WAL end / a non-transactional message's LSN received outside any transaction.
//! The acknowledged LSN is the newest ack point all of whose predecessors the broker acked
//! without returning them:
//!
//! ```text
//!   front                                                  back
//!   [pub a ✓] [pub b ✓] [ack 0/100] [pub c …] [ack 0/180] [keepalive 0/200]
//!    settled   settled   -> acknowledged    waiting: nothing behind c moves until c is acked
//! ```
//!
//! A nack, or a return of a publish, stops the queue at that publish: nothing after it is ever
//! acknowledged by this queue; the session restarts and the slot replays from the last ack.
//! lapin 4 may attach a return to an earlier confirm than the returned publish's own, so
//! returns are matched to publishes by message id, and a publish reported returned fails when
//! it reaches the front, whichever confirm carried the report.
//!
//! Pure and synchronous: the tracker task awaits the front's confirm and feeds the outcome in.

use std::collections::{HashMap, VecDeque};

use pgwire_replication::Lsn;

/// Why the queue stopped at a publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    Nacked {
        message_id: String,
    },
    Returned {
        message_id: String,
        returned: Returned,
    },
}

/// What the broker said when it returned a message (basic.return).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Returned {
    pub exchange: String,
    pub routing_key: String,
    pub reply_code: u16,
    pub reply_text: String,
}

/// What an ack point is, for what the relay reports once it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// A transaction's commit; its commit time in microseconds since 2000-01-01 (PostgreSQL's
    /// epoch), as the stream reports it.
    Commit { commit_time: i64 },
    /// A keepalive's WAL end, or someone else's non-transactional message.
    Idle,
    /// One of this relay's own heartbeats, sent at this Unix time in microseconds.
    Heartbeat { sent_at: u64 },
}

enum Entry<P> {
    Publish { message_id: String, pending: P },
    AckPoint(Lsn, Mark),
}

/// `P` is what the tracker keeps for an unconfirmed publish (its confirm future and window
/// permit); the queue only orders it.
pub struct ConfirmQueue<P> {
    entries: VecDeque<Entry<P>>,
    returned: HashMap<String, Returned>,
    in_flight: usize,
    acknowledged: Lsn,
    last_commit_time: Option<i64>,
    last_heartbeat: Option<u64>,
}

impl<P> ConfirmQueue<P> {
    /// `acknowledged`: the position the slot already has (the ack points can only move it on).
    pub fn new(acknowledged: Lsn) -> Self {
        Self {
            entries: VecDeque::new(),
            returned: HashMap::new(),
            in_flight: 0,
            acknowledged,
            last_commit_time: None,
            last_heartbeat: None,
        }
    }

    pub fn push_publish(&mut self, message_id: String, pending: P) {
        self.in_flight += 1;
        self.entries.push_back(Entry::Publish {
            message_id,
            pending,
        });
    }

    pub fn push_ack_point(&mut self, lsn: Lsn, mark: Mark) {
        self.entries.push_back(Entry::AckPoint(lsn, mark));
    }

    /// Pops the ack points at the front (all their predecessors are settled) and returns the
    /// new acknowledged LSN if it moved forward.
    pub fn advance(&mut self) -> Option<Lsn> {
        let before = self.acknowledged;
        while let Some(Entry::AckPoint(lsn, mark)) = self.entries.front() {
            self.acknowledged = self.acknowledged.max(*lsn);
            match *mark {
                Mark::Commit { commit_time } => self.last_commit_time = Some(commit_time),
                Mark::Heartbeat { sent_at } => self.last_heartbeat = Some(sent_at),
                Mark::Idle => {}
            }
            self.entries.pop_front();
        }
        (self.acknowledged > before).then_some(self.acknowledged)
    }

    /// The oldest unsettled publish, once [`advance`](Self::advance) has removed the ack points
    /// before it.
    pub fn front_mut(&mut self) -> Option<&mut P> {
        match self.entries.front_mut() {
            Some(Entry::Publish { pending, .. }) => Some(pending),
            _ => None,
        }
    }

    pub fn front_message_id(&self) -> Option<&str> {
        match self.entries.front() {
            Some(Entry::Publish { message_id, .. }) => Some(message_id),
            _ => None,
        }
    }

    /// Records a return carried by any confirm: the publish with this id fails when it reaches
    /// the front.
    pub fn record_return(&mut self, message_id: String, returned: Returned) {
        self.returned.entry(message_id).or_insert(returned);
    }

    /// The broker answered the front publish: `acked` true for basic.ack. Returns the settled
    /// publish's id and what the tracker kept for it, or the failure that stops the queue;
    /// `None` when the front is not a publish (call [`advance`](Self::advance) first).
    pub fn settle_front(&mut self, acked: bool) -> Option<Result<(String, P), Failure>> {
        if !matches!(self.entries.front(), Some(Entry::Publish { .. })) {
            return None;
        }
        let Some(Entry::Publish {
            message_id,
            pending,
        }) = self.entries.pop_front()
        else {
            return None;
        };
        self.in_flight -= 1;
        if let Some(returned) = self.returned.remove(&message_id) {
            return Some(Err(Failure::Returned {
                message_id,
                returned,
            }));
        }
        if !acked {
            return Some(Err(Failure::Nacked { message_id }));
        }
        Some(Ok((message_id, pending)))
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn acknowledged(&self) -> Lsn {
        self.acknowledged
    }

    /// Commit time of the newest acknowledged transaction (µs since 2000-01-01).
    pub fn acknowledged_commit_time(&self) -> Option<i64> {
        self.last_commit_time
    }

    /// Send time of the newest acknowledged own heartbeat (Unix µs): heartbeat lag is now
    /// minus this.
    pub fn acknowledged_heartbeat(&self) -> Option<u64> {
        self.last_heartbeat
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: Mark = Mark::Commit { commit_time: 7 };

    fn lsn(n: u64) -> Lsn {
        Lsn::from_u64(n)
    }

    fn returned() -> Returned {
        Returned {
            exchange: "outbox".into(),
            routing_key: "Nobody".into(),
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
        }
    }

    #[test]
    fn acknowledges_a_commit_only_after_all_its_publishes() {
        let mut q = ConfirmQueue::new(lsn(10));
        q.push_publish("a".into(), ());
        q.push_publish("b".into(), ());
        q.push_ack_point(lsn(100), COMMIT);
        assert_eq!(q.advance(), None);
        assert!(q.settle_front(true).expect("front").is_ok());
        assert_eq!(q.advance(), None, "b is not confirmed yet");
        assert!(q.settle_front(true).expect("front").is_ok());
        assert_eq!(q.advance(), Some(lsn(100)));
        assert!(q.is_empty());
    }

    #[test]
    fn keepalive_behind_unconfirmed_messages_waits_for_them() {
        // A keepalive asking for a reply while messages are unconfirmed must not move the
        // acknowledged LSN to its WAL end: it sits behind them.
        let mut q = ConfirmQueue::new(lsn(10));
        q.push_publish("a".into(), ());
        q.push_ack_point(lsn(100), COMMIT);
        q.push_ack_point(lsn(500), Mark::Idle); // keepalive WAL end
        assert_eq!(q.advance(), None);
        assert_eq!(q.acknowledged(), lsn(10));
        q.settle_front(true).expect("front").expect("acked");
        assert_eq!(q.advance(), Some(lsn(500)));
    }

    #[test]
    fn idle_keepalive_advances_at_once() {
        let mut q: ConfirmQueue<()> = ConfirmQueue::new(lsn(10));
        q.push_ack_point(lsn(300), Mark::Idle);
        assert_eq!(q.advance(), Some(lsn(300)));
        q.push_ack_point(lsn(200), Mark::Idle);
        assert_eq!(q.advance(), None, "never moves backwards");
    }

    #[test]
    fn nack_stops_the_queue() {
        let mut q = ConfirmQueue::new(lsn(10));
        q.push_publish("a".into(), ());
        q.push_ack_point(lsn(100), COMMIT);
        assert_eq!(
            q.settle_front(false).expect("front").map(|_| ()),
            Err(Failure::Nacked {
                message_id: "a".into()
            })
        );
        assert_eq!(q.acknowledged(), lsn(10));
    }

    #[test]
    fn return_reported_on_an_earlier_confirm_fails_the_returned_publish() {
        // lapin attaches the return of "c" to the confirm of "a": "a" and "b" are still
        // delivered, the commit after them is acknowledged, and the queue stops at "c".
        let mut q = ConfirmQueue::new(lsn(10));
        q.push_publish("a".into(), ());
        q.push_publish("b".into(), ());
        q.push_ack_point(lsn(100), COMMIT);
        q.push_publish("c".into(), ());
        q.push_ack_point(lsn(200), Mark::Idle);
        q.record_return("c".into(), returned());
        q.settle_front(true).expect("front").expect("a delivered");
        q.settle_front(true).expect("front").expect("b delivered");
        assert_eq!(q.advance(), Some(lsn(100)));
        assert_eq!(
            q.settle_front(true).expect("front").map(|_| ()),
            Err(Failure::Returned {
                message_id: "c".into(),
                returned: returned()
            })
        );
        assert_eq!(q.acknowledged(), lsn(100));
    }

    #[test]
    fn reports_the_newest_acknowledged_commit_and_heartbeat() {
        let mut q = ConfirmQueue::new(lsn(0));
        q.push_ack_point(lsn(10), Mark::Heartbeat { sent_at: 1 });
        q.push_publish("a".into(), ());
        q.push_ack_point(lsn(20), Mark::Commit { commit_time: 5 });
        q.push_ack_point(lsn(30), Mark::Heartbeat { sent_at: 2 });
        q.advance();
        assert_eq!(q.acknowledged_heartbeat(), Some(1));
        assert_eq!(
            q.acknowledged_commit_time(),
            None,
            "behind an unconfirmed publish"
        );
        q.settle_front(true).expect("front").expect("acked");
        assert_eq!(q.advance(), Some(lsn(30)));
        assert_eq!(q.acknowledged_commit_time(), Some(5));
        assert_eq!(q.acknowledged_heartbeat(), Some(2));
    }

    #[test]
    fn counts_in_flight_publishes() {
        let mut q = ConfirmQueue::new(lsn(0));
        q.push_publish("a".into(), 1);
        q.push_ack_point(lsn(1), COMMIT);
        q.push_publish("b".into(), 2);
        assert_eq!(q.in_flight(), 2);
        assert_eq!(q.front_message_id(), Some("a"));
        assert_eq!(
            q.settle_front(true).expect("front").expect("ok"),
            ("a".to_string(), 1)
        );
        assert!(q.settle_front(true).is_none(), "ack point at the front");
        assert_eq!(q.in_flight(), 1);
    }
}
