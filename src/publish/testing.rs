//! A broker stand-in for tests of the delivery loop: [`StandInBroker`] records every publish,
//! in order, and answers one only when the test says so.
//!
//! A test waits for the publishes it expects ([`StandInBroker::published_reaches`]), then
//! acks, nacks or returns exactly the ones it names, by their place in publish order. Answers
//! given between two awaits reach the loop together, as the confirms of one ack frame do
//! (lapin resolves them all before it reads the next frame). A test that plays a broker
//! answering whenever the loop waits uses [`until_idle`], which tells exactly when that is.
//!
//! Everything here speaks the message contract: the stand-in never sees lapin's types, as
//! the delivery loop does not. Every integration test runs the same loop against a real
//! RabbitMQ.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use super::publisher::{Answer, Pending, Publisher, Returned};
use crate::contract::message::Message;
use crate::error::BrokerError;
use crate::error::RelayError;

/// One publish the stand-in took.
#[derive(Debug, Clone)]
pub(crate) struct Publish {
    pub message: Message,
    /// Published on the dead-letter channel ([`Publisher::start_dead_letter`]).
    pub dead_letter_channel: bool,
}

/// A broker that answers only when told: see the module comment.
#[derive(Clone)]
pub(crate) struct StandInBroker {
    shared: Arc<Shared>,
    dead_letter_exchange: Option<String>,
    /// Whether round trips come back (at once) or never: a broker that reads nothing more
    /// from the connection never answers the barrier's request.
    round_trips_pass: bool,
    /// After this many publishes every start fails, as lapin's does on a channel the broker
    /// is closing, before the confirms in flight learn why.
    starts_fail_after: Option<usize>,
}

struct Shared {
    state: Mutex<State>,
    /// Exchanges the stand-in says do not exist (every other one does).
    missing_exchanges: Mutex<HashSet<String>>,
    /// The body limit the delivery loop learned from a refusal.
    max_message_size: Mutex<Option<usize>>,
    /// How many times the publishing channel was opened again.
    reopened: Mutex<usize>,
    /// How many publishes were taken: what [`StandInBroker::published_reaches`] waits on.
    published: watch::Sender<usize>,
    blocked: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    publishes: Vec<Publish>,
    /// Answers not given yet, by place in publish order.
    unanswered: BTreeMap<usize, oneshot::Sender<Result<Answer, RelayError>>>,
    most_unanswered: usize,
    /// The most dead-letter channel publishes that were unanswered at once.
    most_unanswered_dead_letters: usize,
    /// For each publish, how many were unanswered once it was taken (itself included).
    unanswered_at: Vec<usize>,
}

impl Default for StandInBroker {
    fn default() -> Self {
        Self::new()
    }
}

impl StandInBroker {
    /// A broker without the dead-letter policy, whose round trips pass at once.
    pub(crate) fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::default(),
                missing_exchanges: Mutex::default(),
                max_message_size: Mutex::default(),
                reopened: Mutex::default(),
                published: watch::Sender::new(0),
                blocked: watch::Sender::new(false),
            }),
            dead_letter_exchange: None,
            round_trips_pass: true,
            starts_fail_after: None,
        }
    }

    /// A broker whose publishing channel is closing once `count` publishes were taken: every
    /// later start fails with the channel's state, and the publishes in flight wait for the
    /// test to answer or fail them ([`close_channel`](Self::close_channel)).
    pub(crate) fn closing_after(mut self, count: usize) -> Self {
        self.starts_fail_after = Some(count);
        self
    }

    /// Under the dead-letter policy, with `exchange` as the dead-letter exchange.
    pub(crate) fn with_dead_letters(mut self, exchange: &str) -> Self {
        self.dead_letter_exchange = Some(exchange.to_string());
        self
    }

    /// A broker that never answers a round trip: no barrier passes, unless a later publish
    /// witnesses it.
    pub(crate) fn never_answering_round_trips(mut self) -> Self {
        self.round_trips_pass = false;
        self
    }

    /// A broker without `exchange`: [`Publisher::exchange_exists`] says so.
    pub(crate) fn without_exchange(self, exchange: &str) -> Self {
        lock(&self.shared.missing_exchanges).insert(exchange.to_string());
        self
    }

    /// The broker closes the publishing channel (`reply_code`, `reply_text`): every publish
    /// on it not answered yet fails with that, as lapin fails their confirms. Publishes on
    /// the dead-letter channel are not on it.
    pub(crate) fn close_channel(&self, reply_code: u16, reply_text: &str) {
        self.close(false, reply_code, reply_text);
    }

    /// The broker closes the dead-letter channel: [`close_channel`](Self::close_channel)'s
    /// failure for the publishes on it.
    pub(crate) fn close_dead_letter_channel(&self, reply_code: u16, reply_text: &str) {
        self.close(true, reply_code, reply_text);
    }

    fn close(&self, dead_letter_channel: bool, reply_code: u16, reply_text: &str) {
        let mut state = self.state();
        let on_channel: Vec<usize> = state
            .unanswered
            .keys()
            .copied()
            .filter(|&index| state.publishes[index].dead_letter_channel == dead_letter_channel)
            .collect();
        for index in on_channel {
            if let Some(answer) = state.unanswered.remove(&index) {
                let _ = answer.send(Err(RelayError::Broker(BrokerError::ChannelClosed {
                    reply_code,
                    reply_text: reply_text.to_string(),
                })));
            }
        }
    }

    /// How many times the delivery loop opened the publishing channel again.
    pub(crate) fn reopened(&self) -> usize {
        *lock(&self.shared.reopened)
    }

    /// The body limit the delivery loop learned from a refusal, if any.
    pub(crate) fn learned_max_message_size(&self) -> Option<usize> {
        *lock(&self.shared.max_message_size)
    }

    /// Blocks (`true`) or unblocks publishing, as connection.blocked / unblocked.
    pub(crate) fn set_blocked(&self, blocked: bool) {
        self.shared.blocked.send_replace(blocked);
    }

    /// Returns once at least `count` publishes were taken.
    pub(crate) async fn published_reaches(&self, count: usize) {
        let mut published = self.shared.published.subscribe();
        // Err only if the stand-in is gone, and `self` is the stand-in.
        let _ = published.wait_for(|&taken| taken >= count).await;
    }

    /// Answers publish `index` (its place in publish order): ack or nack, carrying
    /// `returned` (a return may ride on any publish's answer, as lapin attaches it).
    ///
    /// Panics when that publish was never taken or is answered already: a test's mistake.
    pub(crate) fn answer(&self, index: usize, acked: bool, returned: Option<Returned>) {
        let answer = self.state().unanswered.remove(&index);
        let Some(answer) = answer else {
            panic!("publish {index} was never taken or is answered already");
        };
        // The loop may have ended (a failure) and dropped the publish: nobody to tell.
        let _ = answer.send(Ok(Answer { acked, returned }));
    }

    /// Acks publish `index`, nothing returned.
    pub(crate) fn ack(&self, index: usize) {
        self.answer(index, true, None);
    }

    /// Nacks publish `index`.
    pub(crate) fn nack(&self, index: usize) {
        self.answer(index, false, None);
    }

    /// Acks the `n` oldest publishes not answered yet.
    pub(crate) fn ack_oldest(&self, n: usize) {
        for index in self.unanswered().into_iter().take(n) {
            self.ack(index);
        }
    }

    /// Publish `index` as the broker returns an unroutable message (312 NO_ROUTE): to ride
    /// on the answer of it or of another publish.
    pub(crate) fn unroutable(&self, index: usize) -> Returned {
        Returned {
            message: self.publish(index).message,
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
        }
    }

    /// Publish `index` as taken. Panics when there is none: a test's mistake.
    pub(crate) fn publish(&self, index: usize) -> Publish {
        self.state().publishes[index].clone()
    }

    /// Every publish taken, in order.
    pub(crate) fn published(&self) -> Vec<Publish> {
        self.state().publishes.clone()
    }

    pub(crate) fn published_count(&self) -> usize {
        self.state().publishes.len()
    }

    /// (publishes taken, publishes not answered yet).
    pub(crate) fn counts(&self) -> (usize, usize) {
        let state = self.state();
        (state.publishes.len(), state.unanswered.len())
    }

    /// The places of the publishes not answered yet, oldest first.
    pub(crate) fn unanswered(&self) -> Vec<usize> {
        self.state().unanswered.keys().copied().collect()
    }

    /// The most publishes that were unanswered at once.
    pub(crate) fn most_unanswered(&self) -> usize {
        self.state().most_unanswered
    }

    /// The most publishes on the dead-letter channel that were unanswered at once.
    pub(crate) fn most_unanswered_dead_letters(&self) -> usize {
        self.state().most_unanswered_dead_letters
    }

    /// For each publish, how many were unanswered once it was taken (itself included).
    pub(crate) fn unanswered_at(&self) -> Vec<usize> {
        self.state().unanswered_at.clone()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.shared.state)
    }

    fn take(&self, message: Message, dead_letter_channel: bool) -> StandInPending {
        let (answer, answered) = oneshot::channel();
        let taken = {
            let mut state = self.state();
            let index = state.publishes.len();
            state.publishes.push(Publish {
                message,
                dead_letter_channel,
            });
            state.unanswered.insert(index, answer);
            let unanswered = state.unanswered.len();
            state.most_unanswered = state.most_unanswered.max(unanswered);
            if dead_letter_channel {
                let letters = state
                    .unanswered
                    .keys()
                    .filter(|&&index| state.publishes[index].dead_letter_channel)
                    .count();
                state.most_unanswered_dead_letters =
                    state.most_unanswered_dead_letters.max(letters);
            }
            state.unanswered_at.push(unanswered);
            state.publishes.len()
        };
        self.shared.published.send_replace(taken);
        StandInPending(answered)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked while holding it has failed already.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A publish the stand-in took, until the test answers it.
pub(crate) struct StandInPending(oneshot::Receiver<Result<Answer, RelayError>>);

impl Pending for StandInPending {
    async fn answer(&mut self) -> Result<Answer, RelayError> {
        (&mut self.0)
            .await
            .map_err(|_| RelayError::Bug("the stand-in dropped an unanswered publish".into()))?
    }
}

/// A round trip that passes at once, or never.
pub(crate) struct StandInRoundTrip {
    passes: bool,
}

impl Future for StandInRoundTrip {
    type Output = Result<(), RelayError>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        match self.passes {
            true => Poll::Ready(Ok(())),
            false => Poll::Pending,
        }
    }
}

impl Publisher for StandInBroker {
    type Pending = StandInPending;
    type RoundTrip = StandInRoundTrip;

    fn start(
        &self,
        message: Message,
    ) -> impl Future<Output = Result<StandInPending, RelayError>> + Send {
        let closing = self
            .starts_fail_after
            .is_some_and(|count| self.state().publishes.len() >= count);
        std::future::ready(if closing {
            Err(RelayError::Broker(BrokerError::Failed(
                "invalid channel state: Closing".into(),
            )))
        } else {
            Ok(self.take(message, false))
        })
    }

    fn start_dead_letter(
        &self,
        message: Message,
    ) -> impl Future<Output = Result<StandInPending, RelayError>> + Send {
        std::future::ready(Ok(self.take(message, true)))
    }

    fn dead_letter_exchange(&self) -> Option<&str> {
        self.dead_letter_exchange.as_deref()
    }

    fn round_trip(&self) -> StandInRoundTrip {
        StandInRoundTrip {
            passes: self.round_trips_pass,
        }
    }

    fn blocked(&self) -> watch::Receiver<bool> {
        self.shared.blocked.subscribe()
    }

    fn exchange_exists(
        &self,
        exchange: &str,
    ) -> impl Future<Output = Result<bool, RelayError>> + Send {
        let exists = !lock(&self.shared.missing_exchanges).contains(exchange);
        std::future::ready(Ok(exists))
    }

    fn reopen(&self) -> impl Future<Output = Result<(), RelayError>> + Send {
        *lock(&self.shared.reopened) += 1;
        std::future::ready(Ok(()))
    }

    fn max_message_size(&self) -> Option<usize> {
        *lock(&self.shared.max_message_size)
    }

    fn learn_max_message_size(&self, limit: usize) {
        let mut known = lock(&self.shared.max_message_size);
        *known = Some(known.map_or(limit, |known| known.min(limit)));
    }
}

/// Returns once every other task of this runtime waits: for an answer, for input, for a
/// timer. The test's runtime must be current-thread with the clock paused
/// (`#[tokio::test(start_paused = true)]`): the paused clock moves on only when no task can
/// run, so the short sleep here ends exactly then, where counting `yield_now` rounds guesses.
/// Each call moves the clock a millisecond.
pub(crate) async fn until_idle() {
    // Panics ("time is not frozen") on a running clock, which would make this a guess again.
    tokio::time::advance(Duration::ZERO).await;
    tokio::time::sleep(Duration::from_millis(1)).await;
}
