//! The in-order confirm queue: which ack point may be acknowledged to the source.
//!
//! Publishes and ack points enter in source order. An ack point carries a token that the
//! source gives back its meaning: for WAL mode a position (a commit's end LSN, or a
//! keepalive's WAL end / a non-transactional message's LSN received outside any
//! transaction), for polling mode the end of a batch. The acknowledged token is the newest
//! ack point all of whose predecessors the broker acked without returning them:
//!
//! ```text
//!   front                                                  back
//!   [pub a ✓] [pub b ✓] [ack 0/100] [pub c …] [ack 0/180] [keepalive 0/200]
//!    settled   settled   -> acknowledged    waiting: nothing behind c moves until c is acked
//! ```
//!
//! A nack, or a return of a publish, stops the queue at that publish: nothing after it is ever
//! acknowledged by this queue; the source restarts from its last acknowledged token.
//!
//! Returns ride on another publish's confirm. AMQP 0-9-1 does not name the delivery tag in
//! basic.return; lapin 4 hands a waiting return to whichever confirm of the next ack frame it
//! resolves first (hash order), which may be a publish before or after the returned one. So
//! returns are matched to publishes by message id, and a publish is settled only once every
//! confirm that could carry its return has been seen: each resolved confirm belongs to an
//! *epoch*, and an epoch's publishes become settleable when a *barrier* begun after all of
//! them resolved has passed (the delivery task passes it once the broker answered something
//! sent after the barrier began, and it has looked at every confirm resolved by then; see
//! docs/architecture.md, "Returns and the confirm barrier"). A return naming a publish that is
//! no longer queued is [`Failure::ReturnedAfterSettle`]: nothing further is acknowledged.
//!
//! Under the dead-letter policy a publish can be a dead letter: pushed as one (a row that
//! cannot be published), or turned into one in place once a passed barrier made its return
//! certain (its re-publish to the dead-letter exchange replaces what the delivery task
//! awaits; every returned publish of a burst is turned at once, so their dead letters are in
//! flight together). Either way it keeps its place, holding back everything behind it, until
//! that publish is confirmed; a dead letter that is itself returned or nacked stops the queue
//! like any publish.
//!
//! Pure and synchronous: the delivery task awaits the front's confirm and feeds the outcome
//! in. It never looks inside a token: it only orders tokens and folds those acknowledged
//! together.

use std::collections::{HashMap, VecDeque};

use super::dead_letter::Reason;
use super::publisher::Returned;
use crate::contract::message::{HeaderValue, Message};

/// What an ack point carries. Ack points acknowledged together fold into one, oldest first:
/// `fold` keeps what the source needs of both (WAL mode: the highest position and the newest
/// commit time).
pub trait AckToken {
    fn fold(&mut self, newer: Self);
}

/// Polling mode and resync acknowledge a whole batch: the token says nothing more.
impl AckToken for () {
    fn fold(&mut self, _newer: Self) {}
}

/// What a publish is known by: its message id (for errors and the stuck message), and the
/// key a return is matched to it by. A user's table may repeat `message_id` within a window
/// (a non-unique mapped column, a partitioned table, an id inserted again), so the key is
/// `x-outbox-seq` where the message carries it (WAL mode: unique along the stream), else the
/// message id (polling and resync claim rows by a unique id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublishId {
    pub message_id: String,
    stream_seq: Option<String>,
}

impl PublishId {
    pub(crate) fn of(message: &Message) -> Self {
        let stream_seq = match message.header(outbox_common::headers::SEQ) {
            Some(HeaderValue::Text(seq)) => Some(seq.clone()),
            _ => None,
        };
        Self {
            message_id: message.message_id.clone(),
            stream_seq,
        }
    }

    /// What returns are matched by.
    fn key(&self) -> &str {
        self.stream_seq.as_deref().unwrap_or(&self.message_id)
    }
}

/// The channel a publish went out on. Each channel's confirms come back in its own order,
/// and a return rides only on a confirm of its own channel: answers are awaited in queue
/// order per channel, so a dead letter the broker is slow to confirm holds back no answer of
/// the publishing channel (nor the returns that more dead letters are made of).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Channel {
    /// Every publish in stream order, a dead letter pushed as one included.
    Publishing,
    /// The dead letters of returned publishes (and of one refused alone).
    DeadLetters,
}

impl Channel {
    const ALL: [Channel; 2] = [Channel::Publishing, Channel::DeadLetters];

    fn index(self) -> usize {
        match self {
            Channel::Publishing => 0,
            Channel::DeadLetters => 1,
        }
    }
}

/// Why the queue stopped at a publish. The publish stays at the front.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Failure {
    /// A return named a publish already settled (or never queued): the broker broke the
    /// return-before-ack order, or the barrier argument does not hold. Stop before
    /// acknowledging anything more.
    ReturnedAfterSettle {
        message_id: String,
        returned: Returned,
    },
    Nacked {
        message_id: String,
    },
    Returned {
        message_id: String,
        returned: Returned,
    },
    /// The dead letter of this message was returned: the dead-letter exchange cannot route
    /// it either.
    DeadLetterReturned {
        message_id: String,
        returned: Returned,
    },
}

/// A publish the broker settled: delivered, or delivered to the dead-letter exchange.
#[derive(Debug, PartialEq)]
pub(crate) struct Settled<P> {
    pub message_id: String,
    pub pending: P,
    /// `Some` when what the broker confirmed was the message's dead letter.
    pub dead_lettered: Option<Reason>,
}

enum Entry<T, P> {
    Publish {
        id: PublishId,
        pending: P,
        /// `Some` when `pending` is the message's dead letter.
        dead_letter: Option<Reason>,
        /// Where `pending` went out.
        channel: Channel,
        /// Publish order: a publish pushed after a barrier began witnesses it.
        seq: u64,
        /// `None` until the broker answered `pending`.
        resolution: Option<Resolution>,
    },
    AckPoint(T),
}

impl<T, P> Entry<T, P> {
    /// What the delivery task keeps for a publish; `None` for an ack point.
    fn pending_mut(&mut self) -> Option<&mut P> {
        match self {
            Entry::Publish { pending, .. } => Some(pending),
            Entry::AckPoint(_) => None,
        }
    }
}

/// The broker's answer to a publish, seen in the given epoch.
#[derive(Debug, Clone, Copy)]
struct Resolution {
    acked: bool,
    epoch: u64,
}

/// A barrier begun after every publish of `epoch` (and before) resolved.
#[derive(Debug, Clone, Copy)]
struct Barrier {
    epoch: u64,
    /// The first publish pushed after the barrier began.
    first_witness: u64,
}

/// `T` is the ack points' token; `P` is what the delivery task keeps for an unconfirmed
/// publish (its confirm future); the queue only orders them.
pub(crate) struct ConfirmQueue<T, P> {
    entries: VecDeque<Entry<T, P>>,
    /// Returns recorded and not yet met at the front, by [`PublishId`]'s key.
    returned: HashMap<String, Returned>,
    in_flight: usize,
    /// Ack points in `entries`: at most one more than the publishes between them.
    ack_points: usize,
    acknowledged: Option<T>,
    /// Per [`Channel`]: every entry before this index is an ack point, a publish on the other
    /// channel or a resolved publish.
    cursors: [usize; 2],
    next_seq: u64,
    /// The epoch that publishes resolving now belong to.
    observing: u64,
    /// Publishes resolved in `observing` so far.
    observed: usize,
    /// Publishes resolved in this epoch or before are settleable.
    passed: u64,
    barrier: Option<Barrier>,
    /// A publish pushed after the barrier began has resolved.
    witnessed: bool,
}

impl<T: AckToken, P> Default for ConfirmQueue<T, P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: AckToken, P> ConfirmQueue<T, P> {
    pub(crate) fn new() -> Self {
        Self {
            entries: VecDeque::new(),
            returned: HashMap::new(),
            in_flight: 0,
            ack_points: 0,
            acknowledged: None,
            cursors: [0; 2],
            next_seq: 0,
            observing: 1,
            observed: 0,
            passed: 0,
            barrier: None,
            witnessed: false,
        }
    }

    pub(crate) fn push_publish(&mut self, id: PublishId, pending: P) {
        self.push(id, pending, None);
    }

    /// A publish that is the dead letter of a message that could not be published (`reason`).
    pub(crate) fn push_dead_letter(&mut self, id: PublishId, reason: Reason, pending: P) {
        self.push(id, pending, Some(reason));
    }

    fn push(&mut self, id: PublishId, pending: P, dead_letter: Option<Reason>) {
        self.in_flight += 1;
        let seq = self.take_seq();
        self.entries.push_back(Entry::Publish {
            id,
            pending,
            dead_letter,
            channel: Channel::Publishing,
            seq,
            resolution: None,
        });
    }

    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Moves `channel`'s cursor to its oldest publish the broker has not answered yet; its
    /// index, if there is one.
    fn seek_unresolved(&mut self, channel: Channel) -> Option<usize> {
        let cursor = &mut self.cursors[channel.index()];
        while let Some(entry) = self.entries.get(*cursor) {
            match entry {
                Entry::Publish {
                    resolution: None,
                    channel: on,
                    ..
                } if *on == channel => return Some(*cursor),
                _ => *cursor += 1,
            }
        }
        None
    }

    /// The oldest publish on `channel` the broker has not answered yet (skipping ack points,
    /// answered publishes and the other channel's): the one whose confirm the delivery task
    /// awaits there.
    pub(crate) fn next_unresolved(&mut self, channel: Channel) -> Option<&mut P> {
        let index = self.seek_unresolved(channel)?;
        self.entries.get_mut(index)?.pending_mut()
    }

    /// [`next_unresolved`](Self::next_unresolved) of both channels at once, publishing
    /// channel first: the delivery task awaits whichever answers first.
    pub(crate) fn next_unresolved_each(&mut self) -> [Option<&mut P>; 2] {
        let wanted = Channel::ALL.map(|channel| self.seek_unresolved(channel));
        // On every turn of the delivery loop: reach the two entries directly, never walk
        // the window.
        match wanted {
            [Some(publishing), Some(dead_letters)] => {
                let (low, high) = (publishing.min(dead_letters), publishing.max(dead_letters));
                let mut between = self.entries.range_mut(low..=high);
                let (first, last) = (between.next(), between.next_back());
                let (first, last) = (
                    first.and_then(Entry::pending_mut),
                    last.and_then(Entry::pending_mut),
                );
                match publishing < dead_letters {
                    true => [first, last],
                    false => [last, first],
                }
            }
            [Some(publishing), None] => [
                self.entries
                    .get_mut(publishing)
                    .and_then(Entry::pending_mut),
                None,
            ],
            [None, Some(dead_letters)] => [
                None,
                self.entries
                    .get_mut(dead_letters)
                    .and_then(Entry::pending_mut),
            ],
            [None, None] => [None, None],
        }
    }

    /// The broker answered the publish [`next_unresolved`](Self::next_unresolved)`(channel)`
    /// returned (`acked` true for basic.ack). Any return its confirm carried is recorded
    /// first, with [`record_return`](Self::record_return).
    pub(crate) fn resolve_next(&mut self, channel: Channel, acked: bool) {
        let Some(index) = self.seek_unresolved(channel) else {
            return;
        };
        if let Some(Entry::Publish {
            seq, resolution, ..
        }) = self.entries.get_mut(index)
        {
            *resolution = Some(Resolution {
                acked,
                epoch: self.observing,
            });
            if self.barrier.is_some_and(|b| *seq >= b.first_witness) {
                self.witnessed = true;
            }
            self.observed += 1;
            self.cursors[channel.index()] += 1;
        }
    }

    /// Publishes resolved since the last barrier began wait for a new one.
    pub(crate) fn needs_barrier(&self) -> bool {
        self.barrier.is_none() && self.observed > 0
    }

    /// Begins a barrier for everything resolved so far. The caller then sends something the
    /// broker answers (unless a publish pushed from now on resolves first, which witnesses the
    /// barrier too) and calls [`pass_barrier`](Self::pass_barrier) once it has the answer and
    /// has resolved every publish whose confirm is ready.
    pub(crate) fn begin_barrier(&mut self) -> u64 {
        let epoch = self.observing;
        self.barrier = Some(Barrier {
            epoch,
            first_witness: self.next_seq,
        });
        self.observing += 1;
        self.observed = 0;
        self.witnessed = false;
        epoch
    }

    /// The barrier that began as `epoch`, if it is the one outstanding.
    pub(crate) fn barrier_outstanding(&self) -> Option<u64> {
        self.barrier.map(|b| b.epoch)
    }

    /// A publish pushed after the outstanding barrier began has resolved: its ack frame came
    /// after every frame that resolved the barrier's publishes.
    pub(crate) fn barrier_witnessed(&self) -> bool {
        self.barrier.is_some() && self.witnessed
    }

    /// The barrier begun as `epoch` passed: its publishes are settleable.
    pub(crate) fn pass_barrier(&mut self, epoch: u64) {
        if self.barrier.is_some_and(|b| b.epoch == epoch) {
            self.passed = epoch;
            self.barrier = None;
            self.witnessed = false;
        }
    }

    /// The broker's answer for the front publish once a passed barrier made it settleable:
    /// `Some(acked)` to hand to [`settle_front`](Self::settle_front).
    pub(crate) fn settleable_front(&self) -> Option<bool> {
        match self.entries.front() {
            Some(Entry::Publish {
                resolution: Some(resolution),
                ..
            }) if resolution.epoch <= self.passed => Some(resolution.acked),
            _ => None,
        }
    }

    /// Queues an ack point. One right behind another (no publish between them) is folded
    /// into it: both become acknowledgeable at the same moment, and while the front publish
    /// waits (a broker alarm can last hours) keepalives and heartbeats would otherwise pile
    /// up without bound.
    pub(crate) fn push_ack_point(&mut self, token: T) {
        if let Some(Entry::AckPoint(newest)) = self.entries.back_mut() {
            newest.fold(token);
            return;
        }
        self.ack_points += 1;
        self.entries.push_back(Entry::AckPoint(token));
    }

    /// Ack points waiting for a publish before them.
    pub(crate) fn ack_points(&self) -> usize {
        self.ack_points
    }

    /// Pops the ack points at the front (all their predecessors are settled) and folds them
    /// into the acknowledged token: `true` if there were any.
    pub(crate) fn advance(&mut self) -> bool {
        let mut moved = false;
        while matches!(self.entries.front(), Some(Entry::AckPoint(_))) {
            if let Some(Entry::AckPoint(token)) = self.entries.pop_front() {
                self.ack_points -= 1;
                self.popped_front();
                match &mut self.acknowledged {
                    Some(acknowledged) => acknowledged.fold(token),
                    None => self.acknowledged = Some(token),
                }
                moved = true;
            }
        }
        moved
    }

    /// Everything acknowledged so far, folded into one token; `None` before the first.
    pub(crate) fn acknowledged(&self) -> Option<&T> {
        self.acknowledged.as_ref()
    }

    /// The oldest publish not settled yet: the front once [`advance`](Self::advance) has
    /// popped the ack points before it.
    pub(crate) fn front_publish(&self) -> Option<&P> {
        self.entries.iter().find_map(|entry| match entry {
            Entry::Publish { pending, .. } => Some(pending),
            Entry::AckPoint(_) => None,
        })
    }

    /// The publishes on `channel` the broker has not answered yet, oldest first, with their
    /// ids.
    pub(crate) fn unresolved(&self, channel: Channel) -> impl Iterator<Item = (&str, &P)> {
        self.entries.iter().filter_map(move |entry| match entry {
            Entry::Publish {
                id,
                pending,
                resolution: None,
                channel: on,
                ..
            } if *on == channel => Some((id.message_id.as_str(), pending)),
            _ => None,
        })
    }

    /// The front entry was popped: every cursor moves with the entries.
    fn popped_front(&mut self) {
        for cursor in &mut self.cursors {
            *cursor = cursor.saturating_sub(1);
        }
    }

    pub(crate) fn front_message_id(&self) -> Option<&str> {
        match self.entries.front() {
            Some(Entry::Publish { id, .. }) => Some(&id.message_id),
            _ => None,
        }
    }

    /// Records a return carried by any confirm: the publish it belongs to (by
    /// [`PublishId`]'s key) fails when it reaches the front. A return for a publish no
    /// longer queued fails at once.
    // Returns are rare and the error ends the session: no point boxing it.
    #[allow(clippy::result_large_err)]
    pub(crate) fn record_return(&mut self, returned: Returned) -> Result<(), Failure> {
        let of = PublishId::of(&returned.message);
        let queued = self
            .entries
            .iter()
            .any(|entry| matches!(entry, Entry::Publish { id, .. } if id.key() == of.key()));
        if !queued {
            return Err(Failure::ReturnedAfterSettle {
                message_id: of.message_id,
                returned,
            });
        }
        self.returned
            .entry(of.key().to_string())
            .or_insert(returned);
        Ok(())
    }

    /// The broker answered the front publish: `acked` true for basic.ack. Returns the settled
    /// publish (popped), or the failure that stops the queue (the publish stays at the
    /// front); `None` when the front is not a publish (call [`advance`](Self::advance) first).
    pub(crate) fn settle_front(&mut self, acked: bool) -> Option<Result<Settled<P>, Failure>> {
        let Some(Entry::Publish {
            id, dead_letter, ..
        }) = self.entries.front()
        else {
            return None;
        };
        if let Some(returned) = self.returned.remove(id.key()) {
            let message_id = id.message_id.clone();
            return Some(Err(if dead_letter.is_some() {
                Failure::DeadLetterReturned {
                    message_id,
                    returned,
                }
            } else {
                Failure::Returned {
                    message_id,
                    returned,
                }
            }));
        }
        if !acked {
            return Some(Err(Failure::Nacked {
                message_id: id.message_id.clone(),
            }));
        }
        let Some(Entry::Publish {
            id,
            pending,
            dead_letter,
            ..
        }) = self.entries.pop_front()
        else {
            return None;
        };
        self.in_flight -= 1;
        self.popped_front();
        Some(Ok(Settled {
            message_id: id.message_id,
            pending,
            dead_lettered: dead_letter,
        }))
    }

    /// The publishes the broker returned whose answers a passed barrier made final, oldest
    /// first, with their returns (taken: each is about to become a dead letter, see
    /// [`dead_letter_at`](Self::dead_letter_at)), by their place in the queue. The scan skips
    /// ack points, dead letters and publishes acked without a return, and stops at the first
    /// publish not answered or not past a barrier, a nack, or a dead letter that was itself
    /// returned: everything it takes lies before anything that fails the queue, and before
    /// every publish still waiting for its first answer.
    pub(crate) fn take_returned(&mut self) -> Vec<(usize, Returned)> {
        // Called on every turn of the delivery loop under the dead-letter policy: nothing to
        // scan for until a return was recorded.
        if self.returned.is_empty() {
            return Vec::new();
        }
        let mut taken = Vec::new();
        for (index, entry) in self.entries.iter().enumerate() {
            let Entry::Publish {
                id,
                dead_letter,
                resolution,
                ..
            } = entry
            else {
                continue;
            };
            let returned = self.returned.contains_key(id.key());
            if dead_letter.is_some() {
                if returned {
                    break;
                }
                continue;
            }
            match resolution {
                Some(resolution) if resolution.epoch <= self.passed => {
                    if returned {
                        taken.push(index);
                    } else if !resolution.acked {
                        break;
                    }
                }
                _ => break,
            }
        }
        taken
            .into_iter()
            .filter_map(|index| match &self.entries[index] {
                Entry::Publish { id, .. } => {
                    let returned = self.returned.remove(id.key())?;
                    Some((index, returned))
                }
                Entry::AckPoint(_) => None,
            })
            .collect()
    }

    /// The publish at `index` (from [`take_returned`](Self::take_returned), or the front)
    /// is re-published to the dead-letter exchange on [`Channel::DeadLetters`]: it becomes a
    /// dead letter for `reason` and keeps its place. Returns what the delivery task keeps for it, to swap in the
    /// re-publish; `None` unless `index` holds a publish that is not a dead letter already.
    /// It waits for its dead letter's confirm: it is unresolved again, and published now (a
    /// witness of any barrier begun before).
    pub(crate) fn dead_letter_at(&mut self, index: usize, reason: Reason) -> Option<&mut P> {
        let new_seq = self.next_seq;
        match self.entries.get_mut(index) {
            Some(Entry::Publish {
                pending,
                dead_letter,
                channel,
                seq,
                resolution,
                ..
            }) if dead_letter.is_none() => {
                *dead_letter = Some(reason);
                *channel = Channel::DeadLetters;
                *seq = new_seq;
                *resolution = None;
                self.next_seq += 1;
                let cursor = &mut self.cursors[Channel::DeadLetters.index()];
                *cursor = (*cursor).min(index);
                Some(pending)
            }
            _ => None,
        }
    }

    /// [`dead_letter_at`](Self::dead_letter_at) the front: a publish the broker refused by
    /// closing the channel while it was alone in flight.
    pub(crate) fn dead_letter_front(&mut self, reason: Reason) -> Option<&mut P> {
        let front = self
            .entries
            .iter()
            .position(|entry| matches!(entry, Entry::Publish { .. }))?;
        self.dead_letter_at(front, reason)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A publish known by its message id alone, as a message without `x-outbox-seq` is.
    impl From<&str> for PublishId {
        fn from(message_id: &str) -> Self {
            PublishId {
                message_id: message_id.into(),
                stream_seq: None,
            }
        }
    }
    use crate::contract::message::Message;

    /// A position like WAL mode's: folding keeps the highest.
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Pos(u64);

    impl AckToken for Pos {
        fn fold(&mut self, newer: Self) {
            self.0 = self.0.max(newer.0);
        }
    }

    /// Advances `q`; the new acknowledged position if it moved forward.
    fn advance<P>(q: &mut ConfirmQueue<Pos, P>) -> Option<u64> {
        let before = acknowledged(q);
        q.advance();
        let after = acknowledged(q);
        (after > before).then_some(after).flatten()
    }

    fn acknowledged<P>(q: &ConfirmQueue<Pos, P>) -> Option<u64> {
        q.acknowledged().map(|p| p.0)
    }

    /// Message `id` as the broker returns it, unroutable.
    fn returned(id: &str) -> Returned {
        Returned {
            message: Message {
                message_id: id.into(),
                exchange: "outbox".into(),
                routing_key: "Nobody".into(),
                event_type: Some("Nobody".into()),
                content_type: None,
                timestamp: None,
                headers: Vec::new(),
                body: Default::default(),
                position: None,
            },
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
        }
    }

    #[test]
    fn acknowledges_a_commit_only_after_all_its_publishes() {
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), ());
        q.push_publish("b".into(), ());
        q.push_ack_point(Pos(100));
        assert_eq!(advance(&mut q), None);
        assert!(q.settle_front(true).expect("front").is_ok());
        assert_eq!(advance(&mut q), None, "b is not confirmed yet");
        assert!(q.settle_front(true).expect("front").is_ok());
        assert_eq!(advance(&mut q), Some(100));
        assert!(q.is_empty());
    }

    #[test]
    fn keepalive_behind_unconfirmed_messages_waits_for_them() {
        // A keepalive asking for a reply while messages are unconfirmed must not move the
        // acknowledged position to its WAL end: it sits behind them.
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), ());
        q.push_ack_point(Pos(100));
        q.push_ack_point(Pos(500)); // keepalive WAL end
        assert_eq!(advance(&mut q), None);
        assert_eq!(acknowledged(&q), None);
        q.settle_front(true).expect("front").expect("acked");
        assert_eq!(advance(&mut q), Some(500));
    }

    #[test]
    fn ack_points_behind_a_waiting_publish_merge_and_stay_bounded() {
        // A broker alarm holds the front publish; keepalives and heartbeats keep coming.
        let mut q = ConfirmQueue::new();
        q.push_ack_point(Pos(50));
        q.push_publish("a".into(), ());
        q.push_ack_point(Pos(100));
        for lsn in 101..10_000 {
            q.push_ack_point(Pos(lsn));
        }
        assert_eq!(
            q.ack_points(),
            2,
            "one before the publish, one merged behind it"
        );
        assert_eq!(advance(&mut q), Some(50));
        assert_eq!(q.ack_points(), 1);
        q.push_publish("b".into(), ());
        q.push_ack_point(Pos(20_000));
        assert_eq!(
            q.ack_points(),
            2,
            "a publish between ack points keeps them apart"
        );
        q.settle_front(true).expect("front").expect("acked");
        assert_eq!(
            advance(&mut q),
            Some(9_999),
            "the merged point is the newest of them"
        );
        q.settle_front(true).expect("front").expect("acked");
        assert_eq!(advance(&mut q), Some(20_000));
        assert_eq!(q.ack_points(), 0);
    }

    #[test]
    fn idle_keepalive_advances_at_once() {
        let mut q: ConfirmQueue<Pos, ()> = ConfirmQueue::new();
        q.push_ack_point(Pos(300));
        assert_eq!(advance(&mut q), Some(300));
        q.push_ack_point(Pos(200));
        assert_eq!(advance(&mut q), None, "never moves backwards");
    }

    #[test]
    fn nack_stops_the_queue() {
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), ());
        q.push_ack_point(Pos(100));
        assert_eq!(
            q.settle_front(false).expect("front").map(|_| ()),
            Err(Failure::Nacked {
                message_id: "a".into()
            })
        );
        assert_eq!(acknowledged(&q), None);
    }

    #[test]
    fn return_reported_on_an_earlier_confirm_fails_the_returned_publish() {
        // lapin attaches the return of "c" to the confirm of "a": "a" and "b" are still
        // delivered, the commit after them is acknowledged, and the queue stops at "c".
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), ());
        q.push_publish("b".into(), ());
        q.push_ack_point(Pos(100));
        q.push_publish("c".into(), ());
        q.push_ack_point(Pos(200));
        q.record_return(returned("c")).expect("queued");
        q.settle_front(true).expect("front").expect("a delivered");
        q.settle_front(true).expect("front").expect("b delivered");
        assert_eq!(advance(&mut q), Some(100));
        assert_eq!(
            q.settle_front(true).expect("front").map(|_| ()),
            Err(Failure::Returned {
                message_id: "c".into(),
                returned: returned("c")
            })
        );
        assert_eq!(acknowledged(&q), Some(100));
    }

    #[test]
    fn counts_in_flight_publishes() {
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), 1);
        q.push_ack_point(Pos(1));
        q.push_publish("b".into(), 2);
        assert_eq!(q.in_flight(), 2);
        assert_eq!(q.front_message_id(), Some("a"));
        assert_eq!(
            q.settle_front(true).expect("front").expect("ok"),
            Settled {
                message_id: "a".to_string(),
                pending: 1,
                dead_lettered: None
            }
        );
        assert!(q.settle_front(true).is_none(), "ack point at the front");
        assert_eq!(q.in_flight(), 1);
    }

    #[test]
    fn returned_front_turned_dead_letter_holds_the_queue_until_its_confirm() {
        // "a" is returned; under the dead-letter policy it is re-published to the dead-letter
        // exchange and stays at the front: "b" behind it is confirmed meanwhile, yet nothing
        // is acknowledged until the dead letter's confirm settles "a".
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), "original");
        q.push_ack_point(Pos(100));
        q.push_publish("b".into(), "b");
        q.push_ack_point(Pos(200));
        q.record_return(returned("a")).expect("queued");
        let failed = q.settle_front(true).expect("front");
        assert!(matches!(failed, Err(Failure::Returned { .. })));
        assert_eq!(
            q.front_message_id(),
            Some("a"),
            "a failure stays at the front"
        );
        let reason = Reason::of_return(&returned("a"));
        *q.dead_letter_front(reason.clone()).expect("front publish") = "dead letter";
        assert!(
            q.dead_letter_front(reason.clone()).is_none(),
            "a dead letter is never dead-lettered again"
        );
        assert_eq!(advance(&mut q), None);
        assert_eq!(
            q.next_unresolved(Channel::DeadLetters),
            Some(&mut "dead letter")
        );
        assert_eq!(
            q.settle_front(true)
                .expect("front")
                .expect("dead letter confirmed"),
            Settled {
                message_id: "a".into(),
                pending: "dead letter",
                dead_lettered: Some(reason)
            }
        );
        assert_eq!(advance(&mut q), Some(100));
        q.settle_front(true).expect("front").expect("b");
        assert_eq!(advance(&mut q), Some(200));
        assert_eq!(q.in_flight(), 0);
    }

    #[test]
    fn a_returned_dead_letter_stops_the_queue() {
        let mut q = ConfirmQueue::new();
        let reason =
            Reason::Rejected(crate::contract::message::Rejection::TooLarge { size: 9, limit: 8 });
        q.push_dead_letter("a".into(), reason, ());
        q.push_ack_point(Pos(100));
        q.record_return(returned("a")).expect("queued");
        assert_eq!(
            q.settle_front(true).expect("front").map(|_| ()),
            Err(Failure::DeadLetterReturned {
                message_id: "a".into(),
                returned: returned("a")
            })
        );
        assert_eq!(advance(&mut q), None);
        assert_eq!(acknowledged(&q), None);
    }

    #[test]
    fn a_nacked_dead_letter_stops_the_queue() {
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), ());
        q.push_ack_point(Pos(100));
        q.record_return(returned("a")).expect("queued");
        assert!(q.settle_front(true).expect("front").is_err());
        assert!(q
            .dead_letter_front(Reason::of_return(&returned("a")))
            .is_some());
        assert_eq!(
            q.settle_front(false).expect("front").map(|_| ()),
            Err(Failure::Nacked {
                message_id: "a".into()
            })
        );
        assert_eq!(advance(&mut q), None);
    }

    #[test]
    fn a_pushed_dead_letter_settles_in_order_with_its_reason() {
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), ());
        let reason = Reason::Rejected(crate::contract::message::Rejection::Unmappable {
            error: "column \"event_type\" is NULL".into(),
        });
        q.push_dead_letter("b".into(), reason.clone(), ());
        q.push_ack_point(Pos(100));
        let a = q.settle_front(true).expect("front").expect("a");
        assert_eq!(a.dead_lettered, None);
        assert_eq!(advance(&mut q), None, "b is not confirmed yet");
        let b = q.settle_front(true).expect("front").expect("b");
        assert_eq!(b.dead_lettered, Some(reason));
        assert_eq!(advance(&mut q), Some(100));
    }

    /// Resolves the next unresolved publish on the publishing channel (`acked`), carrying
    /// `returned` for `carries`.
    #[allow(clippy::result_large_err)]
    fn resolve(
        q: &mut ConfirmQueue<Pos, ()>,
        acked: bool,
        carries: Option<&str>,
    ) -> Result<(), Failure> {
        resolve_on(q, Channel::Publishing, acked, carries)
    }

    /// [`resolve`] on `channel`.
    #[allow(clippy::result_large_err)]
    fn resolve_on(
        q: &mut ConfirmQueue<Pos, ()>,
        channel: Channel,
        acked: bool,
        carries: Option<&str>,
    ) -> Result<(), Failure> {
        if let Some(id) = carries {
            q.record_return(returned(id))?;
        }
        q.resolve_next(channel, acked);
        Ok(())
    }

    #[test]
    fn a_resolved_publish_settles_only_after_a_barrier_begun_after_it() {
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), ());
        q.push_ack_point(Pos(100));
        assert!(!q.needs_barrier(), "nothing resolved yet");
        resolve(&mut q, true, None).expect("recorded");
        assert_eq!(q.settleable_front(), None, "no barrier passed yet");
        assert!(q.needs_barrier());
        let epoch = q.begin_barrier();
        assert!(!q.needs_barrier(), "one barrier at a time");
        assert_eq!(q.settleable_front(), None);
        q.pass_barrier(epoch);
        assert_eq!(q.settleable_front(), Some(true));
        q.settle_front(true).expect("front").expect("acked");
        assert_eq!(advance(&mut q), Some(100));
    }

    #[test]
    fn return_reported_on_a_later_confirm_of_the_same_ack_fails_the_returned_publish() {
        // One multiple ack covers a, b and c; lapin hands a's return to c's confirm, and the
        // delivery task sees a's confirm resolve first, without it. The barrier begun after a
        // resolved passes only after every ready confirm was looked at: a never settles as
        // delivered, and the commit behind it is never acknowledged.
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), ());
        q.push_ack_point(Pos(100));
        q.push_publish("b".into(), ());
        q.push_publish("c".into(), ());
        q.push_ack_point(Pos(200));
        resolve(&mut q, true, None).expect("a");
        let epoch = q.begin_barrier();
        resolve(&mut q, true, None).expect("b");
        resolve(&mut q, true, Some("a")).expect("c carries a's return");
        q.pass_barrier(epoch);
        assert_eq!(q.settleable_front(), Some(true));
        assert_eq!(
            q.settle_front(true).expect("front").map(|_| ()),
            Err(Failure::Returned {
                message_id: "a".into(),
                returned: returned("a")
            })
        );
        assert_eq!(advance(&mut q), None);
        assert_eq!(acknowledged(&q), None);
    }

    #[test]
    fn publishes_resolved_after_a_barrier_began_wait_for_the_next_one() {
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), ());
        q.push_publish("b".into(), ());
        q.push_ack_point(Pos(100));
        resolve(&mut q, true, None).expect("a");
        let first = q.begin_barrier();
        resolve(&mut q, true, None).expect("b");
        q.pass_barrier(first);
        q.settle_front(true).expect("front").expect("a");
        assert_eq!(
            q.settleable_front(),
            None,
            "b resolved after the barrier began"
        );
        assert!(q.needs_barrier());
        let second = q.begin_barrier();
        q.pass_barrier(first);
        assert_eq!(
            q.settleable_front(),
            None,
            "an older barrier's answer passes nothing new"
        );
        q.pass_barrier(second);
        q.settle_front(true).expect("front").expect("b");
        assert_eq!(advance(&mut q), Some(100));
    }

    #[test]
    fn a_publish_pushed_after_the_barrier_began_witnesses_it_when_it_resolves() {
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), ());
        resolve(&mut q, true, None).expect("a");
        q.begin_barrier();
        q.push_publish("b".into(), ());
        assert!(!q.barrier_witnessed());
        resolve(&mut q, true, None).expect("b");
        assert!(q.barrier_witnessed());
    }

    #[test]
    fn a_return_for_a_publish_no_longer_queued_fails_at_once() {
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), ());
        q.push_ack_point(Pos(100));
        q.push_publish("b".into(), ());
        resolve(&mut q, true, None).expect("a");
        let epoch = q.begin_barrier();
        q.pass_barrier(epoch);
        q.settle_front(true).expect("front").expect("a");
        assert_eq!(advance(&mut q), Some(100));
        assert_eq!(
            resolve(&mut q, true, Some("a")),
            Err(Failure::ReturnedAfterSettle {
                message_id: "a".into(),
                returned: returned("a")
            })
        );
    }

    /// The ids `take_returned` took, with their places.
    fn take_returned_ids<P>(q: &mut ConfirmQueue<Pos, P>) -> Vec<(usize, String)> {
        q.take_returned()
            .into_iter()
            .map(|(index, returned)| (index, returned.message.message_id))
            .collect()
    }

    #[test]
    fn every_return_past_a_barrier_is_taken_at_once_up_to_the_first_answer_not_final() {
        // a ✓, b returned, [ack], c returned, d ✓, e returned but answered after the
        // barrier began, f unanswered.
        let mut q = ConfirmQueue::new();
        for id in ["a", "b"] {
            q.push_publish(id.into(), ());
        }
        q.push_ack_point(Pos(100));
        for id in ["c", "d", "e", "f"] {
            q.push_publish(id.into(), ());
        }
        for carries in [None, Some("b"), Some("c"), None] {
            resolve(&mut q, true, carries).expect("recorded");
        }
        let epoch = q.begin_barrier();
        resolve(&mut q, true, Some("e")).expect("recorded");
        assert_eq!(take_returned_ids(&mut q), [], "no barrier passed yet");
        q.pass_barrier(epoch);
        assert_eq!(
            take_returned_ids(&mut q),
            [(1, "b".into()), (3, "c".into())],
            "e's answer is not final yet: nothing from it on"
        );
        assert_eq!(take_returned_ids(&mut q), [], "each return is taken once");
        for (index, id) in [(1, "b"), (3, "c")] {
            assert!(q
                .dead_letter_at(index, Reason::of_return(&returned(id)))
                .is_some());
        }
        assert!(
            q.dead_letter_at(1, Reason::of_return(&returned("b")))
                .is_none(),
            "a dead letter is never dead-lettered again"
        );
        // The dead letters are awaited on their own channel, oldest first; f still waits on
        // the publishing channel.
        assert_eq!(q.unresolved(Channel::Publishing).count(), 1);
        assert_eq!(q.unresolved(Channel::DeadLetters).count(), 2);
        resolve_on(&mut q, Channel::DeadLetters, true, None).expect("b's dead letter");
        resolve_on(&mut q, Channel::DeadLetters, true, None).expect("c's dead letter");
        let epoch = q.begin_barrier();
        q.pass_barrier(epoch);
        assert_eq!(
            take_returned_ids(&mut q),
            [(5, "e".into())],
            "dead letters in flight or answered are skipped"
        );
        q.settle_front(true).expect("front").expect("a");
        let b = q
            .settle_front(true)
            .expect("front")
            .expect("b's dead letter");
        assert_eq!(b.dead_lettered, Some(Reason::of_return(&returned("b"))));
        assert_eq!(advance(&mut q), Some(100));
    }

    #[test]
    fn taking_returns_stops_at_a_nack_and_at_a_returned_dead_letter() {
        let mut q: ConfirmQueue<Pos, ()> = ConfirmQueue::new();
        for id in ["a", "b", "c"] {
            q.push_publish(id.into(), ());
        }
        resolve(&mut q, true, Some("a")).expect("recorded");
        resolve(&mut q, false, None).expect("b nacked");
        resolve(&mut q, true, Some("c")).expect("recorded");
        let epoch = q.begin_barrier();
        q.pass_barrier(epoch);
        assert_eq!(
            take_returned_ids(&mut q),
            [(0, "a".into())],
            "nothing past the nack that stops the queue"
        );

        let mut q: ConfirmQueue<Pos, ()> = ConfirmQueue::new();
        for id in ["a", "b"] {
            q.push_publish(id.into(), ());
        }
        resolve(&mut q, true, Some("a")).expect("recorded");
        resolve(&mut q, true, None).expect("recorded");
        let epoch = q.begin_barrier();
        q.pass_barrier(epoch);
        assert_eq!(take_returned_ids(&mut q), [(0, "a".into())]);
        q.dead_letter_at(0, Reason::of_return(&returned("a")));
        resolve_on(&mut q, Channel::DeadLetters, true, Some("a"))
            .expect("the dead letter returned too");
        q.record_return(returned("b")).expect("b queued");
        let epoch = q.begin_barrier();
        q.pass_barrier(epoch);
        assert_eq!(
            take_returned_ids(&mut q),
            [],
            "nothing past a dead letter that was returned: it stops the queue"
        );
    }

    #[test]
    fn a_dead_lettered_front_is_unresolved_again_and_the_cursor_goes_back_to_it() {
        let mut q = ConfirmQueue::new();
        q.push_publish("a".into(), "a");
        q.push_publish("b".into(), "b");
        q.push_ack_point(Pos(100));
        q.record_return(returned("a")).expect("queued");
        q.resolve_next(Channel::Publishing, true);
        q.resolve_next(Channel::Publishing, true);
        assert_eq!(q.next_unresolved(Channel::Publishing), None);
        let epoch = q.begin_barrier();
        q.pass_barrier(epoch);
        assert!(matches!(
            q.settle_front(true),
            Some(Err(Failure::Returned { .. }))
        ));
        *q.dead_letter_front(Reason::of_return(&returned("a")))
            .expect("front") = "dead letter of a";
        assert_eq!(
            q.next_unresolved(Channel::DeadLetters),
            Some(&mut "dead letter of a")
        );
        assert_eq!(q.next_unresolved(Channel::Publishing), None);
        assert_eq!(q.settleable_front(), None);
        q.resolve_next(Channel::DeadLetters, true);
        assert_eq!(q.next_unresolved(Channel::DeadLetters), None);
        assert_eq!(
            q.next_unresolved(Channel::Publishing),
            None,
            "b keeps its answer"
        );
        let epoch = q.begin_barrier();
        q.pass_barrier(epoch);
        let a = q
            .settle_front(true)
            .expect("front")
            .expect("dead letter confirmed");
        assert_eq!(a.pending, "dead letter of a");
        assert_eq!(
            q.settleable_front(),
            Some(true),
            "b was answered in an earlier epoch"
        );
    }
}
