//! The delivery task: the one loop that publishes, awaits confirms in order, handles returns
//! and dead letters, and hands back how far its source may consider messages delivered.
//!
//! ```text
//!  source ── Input::Publish / Unpublishable / AckPoint(T) ──▶ delivery ── publish ──▶ broker
//!  (WAL reader, poll worker,   (bounded channel)       ConfirmQueue<T, _>  ◀── ack/nack/return
//!   resync, benchmark)  ◀── Acked { token: T } (watch) ── acknowledged prefix
//! ```
//!
//! Owns the in-flight window (at most `window` unconfirmed publishes: it reads no input while
//! the window is full, which is what holds the source back), the confirm queue, the confirm
//! timeout, the dead-letter policy and the stuck message's report. It never knows what a token
//! means: a WAL position, a polling batch, nothing. It must never report a token before every
//! publish ahead of it is confirmed without a return, and it stops at the first nack, return
//! (under halt), closed channel or timeout: nothing after the failure is ever acknowledged.
//!
//! The confirm timeout bounds the age of the oldest unsettled publish: it runs from when that
//! publish was started (or from when the broker last unblocked the connection, if later) and
//! nothing the broker says resets it, only the publish settling. Answers trickling in from a
//! broker that holds the connection in credit flow, or an answer whose barrier never passes,
//! do not keep a stalled session alive. Only `connection.blocked` (a memory or disk alarm)
//! pauses it: that wait is the broker's stated choice and reconnecting would not end it.
//!
//! The policy lives here and only here: a source hands over what it could not make
//! publishable ([`Input::Unpublishable`]); under `--on-unroutable dead-letter` it goes to the
//! dead-letter exchange in stream order, under halt the loop takes no further input, settles
//! and acknowledges everything before it, and stops naming the row.
//!
//! After a failure the supervisor may name a stuck message: the window is 1 until that
//! message is confirmed, so a message the broker keeps refusing does not drag a full window
//! of re-publishes along on every retry.
//!
//! The loop is a state machine ([`Delivery`]): one `select!` picks the next [`Event`], biased
//! towards the broker's answers, and one handler per event changes the state.

use std::time::{Duration, SystemTime};

use futures_util::FutureExt;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::dead_letter::{self, DeadLetterLog, Reason};
use super::publisher::{Answer, Pending, Publisher};
use super::queue::{AckToken, Channel, ConfirmQueue, Failure, PublishId, Settled};
use crate::contract::message::{Message, Rejection, Unpublishable};
use crate::error::BrokerError;
use crate::error::{ErrorKind, MapProblem, RelayError};
use crate::observability::{Health, RelayMetrics, DEAD_LETTERED_TOTAL, REASON_LABEL};

/// What a source hands the delivery task, in source order.
// Nearly every input is a publish: boxing it would add an allocation per message to save
// channel slots that are mostly publishes anyway.
#[allow(clippy::large_enum_variant)]
pub enum Input<T> {
    Publish {
        message: Message,
        /// When its transaction committed, for the commit-to-confirm latency.
        committed_at: Option<SystemTime>,
    },
    /// A row or event its source could not make publishable.
    Unpublishable {
        unpublishable: Box<Unpublishable>,
        committed_at: Option<SystemTime>,
    },
    /// Everything before this point: acknowledge `T` once all of it is confirmed.
    AckPoint(T),
}

impl<T> Input<T> {
    /// What a source's mapping result becomes: a publish, or an unpublishable message for
    /// the policy to decide.
    pub fn mapped(
        mapped: Result<Message, Box<Unpublishable>>,
        committed_at: Option<SystemTime>,
    ) -> Self {
        match mapped {
            Ok(message) => Input::Publish {
                message,
                committed_at,
            },
            Err(unpublishable) => Input::Unpublishable {
                unpublishable,
                committed_at,
            },
        }
    }
}

/// The relay broken on purpose (the `ack-before-confirm` switch of a test build, never in a
/// release): every ack point is acknowledged the moment it is queued, before the broker
/// confirmed what precedes it. It exists to show that the oracles catch a relay that breaks
/// invariant 1 (crates/outbox-bench/lab/scenarios.md, "Negative controls"); without the
/// `failpoints` feature this is a constant `false`.
fn ack_before_confirm() -> bool {
    crate::failpoint::switched_on(crate::failpoint::ACK_BEFORE_CONFIRM)
}

/// What the delivery task reports back (on a watch: a source reads the newest value).
#[derive(Debug, Clone, PartialEq)]
pub struct Acked<T> {
    /// Every ack point acknowledged so far, folded; `None` before the first.
    pub token: Option<T>,
}

impl<T> Default for Acked<T> {
    fn default() -> Self {
        Self { token: None }
    }
}

pub struct DeliveryOptions {
    /// Most unconfirmed publishes at once.
    pub window: usize,
    /// How long a publish may stay unsettled after it was started (paused while blocked).
    pub confirm_timeout: Duration,
    /// The message an earlier session failed on: the window is 1 until it is confirmed.
    pub stuck: Option<String>,
    /// Where the stuck message's delivery is reported (/readyz); `None` for batches.
    pub health: Option<Health>,
}

impl DeliveryOptions {
    /// A batch's options: its whole self in flight, no stuck message to report.
    pub fn batch(confirm_timeout: Duration) -> Self {
        Self {
            window: usize::MAX,
            confirm_timeout,
            stuck: None,
            health: None,
        }
    }
}

/// An unconfirmed publish.
struct InFlight<S> {
    pending: S,
    committed_at: Option<SystemTime>,
    /// When it was started (read once per burst): the confirm timeout runs from here. A dead
    /// letter that replaces a returned publish keeps it: the row has waited since then.
    started: Instant,
    /// The body's size: a 406 that closes the channel names the size it refused.
    body_len: usize,
    /// The message as published, kept only while a stuck message holds the window at 1: if
    /// the broker closes the channel over it, the dead-letter policy needs it again.
    original: Option<Message>,
}

/// How long a publish that found the channel closed waits for the close's reason: the
/// confirms in flight learn it from the same frame, after the answers that came before it.
const CLOSE_REASON_WAIT: Duration = Duration::from_secs(5);

/// Runs until `input` is closed and every publish taken from it is settled (`Ok`), or until
/// the first failure (`Err`); under the halt policy, an unpublishable input is that failure
/// once everything before it is settled. `acked` is updated as ack points are acknowledged.
///
/// Confirms are awaited in publish order and each answer is recorded in the queue; a publish
/// is settled only once a confirm barrier passed after its answer (see [`ConfirmQueue`]): a
/// [`Publisher::round_trip`] sent after the answer came back, or a publish sent after it was
/// confirmed, and every confirm ready by then was looked at for returns.
pub async fn deliver<T: AckToken + Clone, P: Publisher>(
    publisher: &P,
    options: &DeliveryOptions,
    metrics: &RelayMetrics,
    mut input: mpsc::Receiver<Input<T>>,
    acked: &watch::Sender<Acked<T>>,
) -> Result<(), RelayError> {
    let mut delivery = Delivery::new(publisher, options, metrics, acked);
    let outcome = delivery.run(&mut input).await;
    if let Some(line) = delivery.dead_letter_log.flush() {
        tracing::warn!("{line}");
    }
    if let Err(e) = &outcome {
        match e.kind() {
            ErrorKind::Nacked => metrics.nacked.increment(1),
            kind if kind.is_return() => metrics.returned.increment(1),
            _ => {}
        }
    }
    metrics
        .in_flight
        .decrement(delivery.queue.in_flight() as f64);
    metrics.ack_points.set(0.0);
    outcome
}

/// Publishes a batch and returns once the broker confirmed every message of it (dead letters
/// included), or with the first failure: polling mode's and resync's whole delivery. Under
/// the halt policy a batch holding an unpublishable row publishes nothing: the row stops the
/// relay, naming it.
pub(crate) async fn deliver_batch<P: Publisher>(
    publisher: &P,
    batch: Vec<Result<Message, Box<Unpublishable>>>,
    confirm_timeout: Duration,
    metrics: &RelayMetrics,
) -> Result<(), RelayError> {
    if let Some(stop) = batch
        .iter()
        .filter_map(|item| item.as_ref().err())
        .find_map(|unpublishable| halts(publisher, unpublishable))
    {
        return Err(stop);
    }
    // Room for the whole batch and its ack point: the batch is queued before it is awaited.
    let (inputs, inputs_rx) = mpsc::channel(batch.len() + 1);
    let queued = batch.into_iter().map(|item| Input::mapped(item, None));
    for input in queued.chain([Input::AckPoint(())]) {
        if inputs.try_send(input).is_err() {
            return Err(RelayError::Bug("a batch outgrew its channel".into()));
        }
    }
    drop(inputs);
    let (acked, _) = watch::channel(Acked::default());
    let options = DeliveryOptions::batch(confirm_timeout);
    deliver(publisher, &options, metrics, inputs_rx, &acked).await
}

/// The error an unpublishable message stops the relay with, or `None` when the dead-letter
/// policy takes it (it must have an id to be told apart by).
fn halts<P: Publisher>(publisher: &P, unpublishable: &Unpublishable) -> Option<RelayError> {
    if publisher.dead_letter_exchange().is_some() && unpublishable.original.is_some() {
        return None;
    }
    Some(RelayError::Unpublishable {
        message_id: unpublishable.message_id.clone(),
        problem: unpublishable.problem.clone(),
        fault: unpublishable.fault,
    })
}

/// What the loop waits for, one at a time.
// On the stack for one turn of the loop: boxing the answer would allocate per confirm.
#[allow(clippy::large_enum_variant)]
enum Event<T> {
    /// The broker answered the oldest publish not yet answered on the channel.
    Answered(Channel, Result<Answer, RelayError>),
    /// The round trip of the outstanding barrier came back.
    RoundTripDone(Result<(), RelayError>),
    /// The source handed over an input (`None`: it closed the channel).
    Received(Option<Input<T>>),
    /// The oldest unsettled publish is older than the confirm timeout.
    ConfirmTimedOut,
    /// The broker blocked or unblocked publishing (`false`: the report ended).
    BlockedChanged(bool),
}

/// The state of one delivery loop (see [`deliver`]).
struct Delivery<'a, T, P: Publisher> {
    publisher: &'a P,
    options: &'a DeliveryOptions,
    metrics: &'a RelayMetrics,
    acked: &'a watch::Sender<Acked<T>>,
    queue: ConfirmQueue<T, InFlight<P::Pending>>,
    /// The stuck message, until the broker confirms it.
    stuck: Option<String>,
    window: usize,
    blocked: watch::Receiver<bool>,
    blocked_open: bool,
    /// Whether the broker blocks the connection, as far as this loop has taken the reports:
    /// the timeout reads this, never the watch itself, so an unblock it has not handled yet
    /// (and whose `unblocked_at` it has not set) cannot start a timeout from before the block.
    is_blocked: bool,
    input_open: bool,
    /// Under halt: the unpublishable input the loop stopped taking input at. Reported once
    /// everything before it is settled.
    halt: Option<RelayError>,
    /// When the broker last unblocked the connection: no publish's confirm timeout runs from
    /// before it.
    unblocked_at: Instant,
    /// At most one round trip at a time, with the barrier it was sent for.
    round_trip: Option<(u64, P::RoundTrip)>,
    /// The exchange the newest publish went to, known to exist: most messages go where the
    /// one before went, and need no other check.
    exchange_checked: String,
    /// What the log has said about dead letters (see [`DeadLetterLog`]).
    dead_letter_log: DeadLetterLog,
}

impl<'a, T: AckToken + Clone, P: Publisher> Delivery<'a, T, P> {
    fn new(
        publisher: &'a P,
        options: &'a DeliveryOptions,
        metrics: &'a RelayMetrics,
        acked: &'a watch::Sender<Acked<T>>,
    ) -> Self {
        let mut blocked = publisher.blocked();
        let is_blocked = *blocked.borrow_and_update();
        Self {
            publisher,
            options,
            metrics,
            acked,
            queue: ConfirmQueue::new(),
            stuck: options.stuck.clone(),
            window: if options.stuck.is_some() {
                1
            } else {
                options.window
            },
            blocked,
            blocked_open: true,
            is_blocked,
            input_open: true,
            halt: None,
            unblocked_at: Instant::now(),
            round_trip: None,
            exchange_checked: String::new(),
            dead_letter_log: DeadLetterLog::default(),
        }
    }

    async fn run(&mut self, input: &mut mpsc::Receiver<Input<T>>) -> Result<(), RelayError> {
        loop {
            self.settle_and_advance().await?;
            if !self.input_open && self.queue.is_empty() {
                return self.halt.take().map_or(Ok(()), Err);
            }
            self.prepare_barrier();
            match self.next_event(input).await {
                Event::Answered(channel, answer) => {
                    if let Err(error) = self.on_answer(channel, answer) {
                        self.on_answer_failed(error).await?;
                    }
                }
                Event::RoundTripDone(result) => {
                    if let Err(error) = self.on_round_trip(result) {
                        self.on_answer_failed(error).await?;
                    }
                }
                Event::Received(item) => {
                    if let Err(error) = self.on_received(item, input).await {
                        return Err(self.on_start_failed(error).await);
                    }
                }
                Event::ConfirmTimedOut => {
                    return Err(RelayError::Broker(BrokerError::ConfirmTimeout {
                        message_id: self.queue.front_message_id().unwrap_or_default().into(),
                        seconds: self.options.confirm_timeout.as_secs(),
                    }))
                }
                Event::BlockedChanged(open) => {
                    // The timeout restarts when the broker unblocks: waiting while blocked is
                    // the broker's choice, not a lost confirm.
                    self.blocked_open = open;
                    // Any report counts: a block and its unblock between two looks at the
                    // watch show only as a change.
                    self.is_blocked = open && *self.blocked.borrow_and_update();
                    if !self.is_blocked {
                        self.unblocked_at = Instant::now();
                    }
                }
            }
        }
    }

    /// The next event, answers first: under a backlog the loop drains confirms before it
    /// takes new work.
    async fn next_event(&mut self, input: &mut mpsc::Receiver<Input<T>>) -> Event<T> {
        let room = self.input_open && self.queue.in_flight() < self.window;
        let deadline = self.confirm_deadline();
        let timing = deadline.is_some();
        let deadline = deadline.unwrap_or(self.unblocked_at);
        let Delivery {
            queue,
            round_trip,
            blocked,
            blocked_open,
            ..
        } = self;
        let [publishing, dead_letters] = queue.next_unresolved_each();
        let (has_publishing, has_dead_letters) = (publishing.is_some(), dead_letters.is_some());
        tokio::select! {
            biased;

            answer = async {
                match publishing {
                    Some(next) => next.pending.answer().await,
                    None => std::future::pending().await,
                }
            }, if has_publishing => Event::Answered(Channel::Publishing, answer),

            answer = async {
                match dead_letters {
                    Some(next) => next.pending.answer().await,
                    None => std::future::pending().await,
                }
            }, if has_dead_letters => Event::Answered(Channel::DeadLetters, answer),

            result = async {
                match round_trip.as_mut() {
                    Some((_, answer)) => answer.await,
                    None => std::future::pending().await,
                }
            }, if round_trip.is_some() => Event::RoundTripDone(result),

            item = input.recv(), if room => Event::Received(item),

            // Before the timer: a block or unblock reported by now moves the deadline.
            changed = blocked.changed(), if *blocked_open => Event::BlockedChanged(changed.is_ok()),

            () = tokio::time::sleep_until(deadline), if timing => Event::ConfirmTimedOut,
        }
    }

    /// When the oldest unsettled publish times out: `None` while nothing is in flight or the
    /// broker blocks the connection. Publishes settle in order, so the oldest is the front.
    fn confirm_deadline(&self) -> Option<Instant> {
        if self.is_blocked {
            return None;
        }
        let oldest = self.queue.front_publish()?;
        // A timeout too large to add is one that never fires.
        oldest
            .started
            .max(self.unblocked_at)
            .checked_add(self.options.confirm_timeout)
    }

    /// Settles what barriers made settleable and passes the ack points behind it, in turn:
    /// an ack point between two settleable publishes must not hold the second back.
    async fn settle_and_advance(&mut self) -> Result<(), RelayError> {
        let mut advanced = false;
        let settled = loop {
            if let Err(e) = self.settle_ready().await {
                break Err(e);
            }
            if !self.queue.advance() {
                break Ok(());
            }
            advanced = true;
        };
        if advanced && !ack_before_confirm() {
            let token = self.queue.acknowledged().cloned();
            self.acked.send_modify(|acked| acked.token = token);
            self.metrics.ack_points.set(self.queue.ack_points() as f64);
        }
        settled
    }

    /// Settles the front publishes that passed barriers, in order. Under the dead-letter
    /// policy every publish a passed barrier showed returned is first re-published to the
    /// dead-letter exchange, in place and unresolved again ([`Self::dead_letter_returned`]).
    async fn settle_ready(&mut self) -> Result<(), RelayError> {
        self.dead_letter_returned().await?;
        while let Some(acked) = self.queue.settleable_front() {
            let settled = self.settle_front(acked)?;
            self.metrics.in_flight.decrement(1.0);
            if settled.dead_lettered.is_none() {
                self.metrics.confirmed.increment(1);
            }
            if let Some(committed_at) = settled.pending.committed_at {
                self.metrics.observe_commit_to_confirm(committed_at);
            }
            if self.stuck.as_deref() == Some(settled.message_id.as_str()) {
                tracing::info!(message_id = %settled.message_id, "stuck message delivered; full window again");
                self.stuck = None;
                self.window = self.options.window;
                if let Some(health) = &self.options.health {
                    health.set_stuck(None);
                }
            }
        }
        Ok(())
    }

    /// Under the dead-letter policy: starts the dead letter of every publish the broker
    /// returned whose answer a passed barrier made final, all of them before awaiting any
    /// (a burst of unroutable rows costs one round of confirms, not one per row). They go
    /// out on the dead-letter channel in queue order, so its confirms come back in the order
    /// they are awaited, and each is settled only past a barrier like any publish: a dead
    /// letter's return riding on another's confirm is seen before either settles.
    async fn dead_letter_returned(&mut self) -> Result<(), RelayError> {
        let Some(exchange) = self.publisher.dead_letter_exchange() else {
            return Ok(());
        };
        for (index, returned) in self.queue.take_returned() {
            self.metrics.returned.increment(1);
            let reason = Reason::of_return(&returned);
            let letter = dead_letter::dead_letter(exchange, returned.message, &reason);
            let pending = self.publisher.start_dead_letter(letter).await?;
            let Some(in_flight) = self.queue.dead_letter_at(index, reason) else {
                return Err(RelayError::Bug(
                    "a returned publish to dead-letter is not in the queue".into(),
                ));
            };
            in_flight.pending = pending;
        }
        Ok(())
    }

    /// Settles the front publish, which the broker answered (`acked`) and a barrier made
    /// settleable: the settled publish, or the error that stops the pipeline.
    fn settle_front(&mut self, acked: bool) -> Result<Settled<InFlight<P::Pending>>, RelayError> {
        match self.queue.settle_front(acked) {
            None => Err(RelayError::Bug(
                "settled a front that is not a publish".into(),
            )),
            Some(Ok(settled)) => {
                if let Some(reason) = &settled.dead_lettered {
                    metrics::counter!(DEAD_LETTERED_TOTAL, REASON_LABEL => reason.label())
                        .increment(1);
                    let line =
                        self.dead_letter_log
                            .record(&settled.message_id, reason, Instant::now());
                    if let Some(line) = line {
                        tracing::warn!("{line}");
                    }
                }
                Ok(settled)
            }
            Some(Err(failure)) => Err(failure_error(failure)),
        }
    }

    /// Begins a barrier when answers wait behind one, and sends its round trip.
    fn prepare_barrier(&mut self) {
        if self.queue.needs_barrier() {
            self.queue.begin_barrier();
        }
        if self.round_trip.is_none() {
            if let Some(epoch) = self.queue.barrier_outstanding() {
                self.round_trip = Some((epoch, self.publisher.round_trip()));
            }
        }
    }

    fn on_answer(
        &mut self,
        channel: Channel,
        answer: Result<Answer, RelayError>,
    ) -> Result<(), RelayError> {
        observe(&mut self.queue, channel, answer_on(channel, answer)?)?;
        observe_ready(&mut self.queue)?;
        if self.queue.barrier_witnessed() {
            if let Some(epoch) = self.queue.barrier_outstanding() {
                self.queue.pass_barrier(epoch);
            }
        }
        Ok(())
    }

    fn on_round_trip(&mut self, result: Result<(), RelayError>) -> Result<(), RelayError> {
        let sent_for = self.round_trip.take().map(|(epoch, _)| epoch);
        result?;
        observe_ready(&mut self.queue)?;
        if let Some(epoch) = sent_for {
            self.queue.pass_barrier(epoch);
        }
        Ok(())
    }

    /// Takes `first` and everything already queued behind it, up to the window, in one pass:
    /// under a backlog one wake-up publishes a burst, and the frames go out together.
    async fn on_received(
        &mut self,
        first: Option<Input<T>>,
        input: &mut mpsc::Receiver<Input<T>>,
    ) -> Result<(), RelayError> {
        let mut item = first;
        // One clock read for the burst: its publishes start within microseconds of it.
        let now = Instant::now();
        loop {
            let Some(next) = item else {
                self.input_open = false;
                return Ok(());
            };
            self.take(next, now).await?;
            if !self.input_open || self.queue.in_flight() >= self.window {
                return Ok(());
            }
            item = match input.try_recv() {
                Ok(next) => Some(next),
                Err(mpsc::error::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
            };
        }
    }

    /// One input: a publish started (at `now`), a dead letter started, the halt begun, or an
    /// ack point queued.
    async fn take(&mut self, input: Input<T>, now: Instant) -> Result<(), RelayError> {
        match input {
            Input::Publish {
                message,
                committed_at,
            } => {
                if let Some(reason) = self.refusal_before_publish(&message).await? {
                    return self.refuse(message, reason, committed_at, now).await;
                }
                let id = PublishId::of(&message);
                let pending = self.start(message, committed_at, now).await?;
                self.queue.push_publish(id, pending);
            }
            Input::Unpublishable {
                unpublishable,
                committed_at,
            } => {
                if let Some(stop) = halts(self.publisher, &unpublishable) {
                    // Nothing after it is taken; what came before is settled first.
                    self.halt = Some(stop);
                    self.input_open = false;
                    return Ok(());
                }
                let Unpublishable {
                    original,
                    rejection,
                    ..
                } = *unpublishable;
                let Some(original) = original else {
                    return Err(RelayError::Bug("dead-lettered without an original".into()));
                };
                self.push_dead_letter(original, Reason::Rejected(rejection), committed_at, now)
                    .await?;
            }
            Input::AckPoint(token) => {
                if ack_before_confirm() {
                    self.acked.send_modify(|acked| match &mut acked.token {
                        Some(older) => older.fold(token.clone()),
                        None => acked.token = Some(token.clone()),
                    });
                }
                self.queue.push_ack_point(token);
                self.metrics.ack_points.set(self.queue.ack_points() as f64);
            }
        }
        Ok(())
    }

    /// Starts one publish on the publishing channel; delivery tags follow the calls' order.
    async fn start(
        &mut self,
        message: Message,
        committed_at: Option<SystemTime>,
        started: Instant,
    ) -> Result<InFlight<P::Pending>, RelayError> {
        let body_len = message.body.len();
        let original = self.stuck.is_some().then(|| message.clone());
        let pending = self.publisher.start(message).await?;
        self.metrics.published.increment(1);
        self.metrics.in_flight.increment(1.0);
        Ok(InFlight {
            pending,
            committed_at,
            started,
            body_len,
            original,
        })
    }

    /// Publishes `original`'s dead letter for `reason` on the publishing channel, in stream
    /// order, in its place (the dead-letter policy is on).
    async fn push_dead_letter(
        &mut self,
        original: Message,
        reason: Reason,
        committed_at: Option<SystemTime>,
        now: Instant,
    ) -> Result<(), RelayError> {
        let Some(exchange) = self.publisher.dead_letter_exchange() else {
            return Err(RelayError::Bug(
                "dead-lettered without the dead-letter policy".into(),
            ));
        };
        let id = PublishId::of(&original);
        let letter = dead_letter::dead_letter(exchange, original, &reason);
        let pending = self.start(letter, committed_at, now).await?;
        self.queue.push_dead_letter(id, reason, pending);
        Ok(())
    }

    /// Why the broker would refuse `message` if it were published now, known before it is:
    /// a body over the limit the broker named by refusing one, or an exchange it does not
    /// have. Either would close the publishing channel and take every confirm in flight
    /// with it.
    async fn refusal_before_publish(
        &mut self,
        message: &Message,
    ) -> Result<Option<Reason>, RelayError> {
        if let Some(limit) = self.publisher.max_message_size() {
            let size = message.body.len();
            if size > limit {
                return Ok(Some(Reason::Rejected(Rejection::TooLarge { size, limit })));
            }
        }
        if message.exchange != self.exchange_checked {
            if !self.publisher.exchange_exists(&message.exchange).await? {
                return Ok(Some(Reason::ExchangeMissing {
                    exchange: message.exchange.clone(),
                }));
            }
            self.exchange_checked.clone_from(&message.exchange);
        }
        Ok(None)
    }

    /// A message the broker would refuse (`reason`): its dead letter under the dead-letter
    /// policy; under halt the loop takes no further input and, once everything before it is
    /// settled, stops naming it.
    async fn refuse(
        &mut self,
        message: Message,
        reason: Reason,
        committed_at: Option<SystemTime>,
        now: Instant,
    ) -> Result<(), RelayError> {
        if self.publisher.dead_letter_exchange().is_some() {
            return self
                .push_dead_letter(message, reason, committed_at, now)
                .await;
        }
        let message_id = message.message_id;
        self.halt = Some(match reason {
            Reason::Rejected(Rejection::TooLarge { size, limit }) => RelayError::Unpublishable {
                problem: format!(
                    "Message {message_id} has a body of {size} bytes, over the {limit} bytes \
                     RabbitMQ takes (its max_message_size, which it named refusing a body)"
                ),
                message_id: Some(message_id),
                fault: MapProblem::TooLarge,
            },
            Reason::ExchangeMissing { exchange } => {
                RelayError::Broker(BrokerError::RoutedToMissingExchange {
                    message_id,
                    exchange,
                })
            }
            other => {
                return Err(RelayError::Bug(format!(
                    "refused before publishing for {other}"
                )))
            }
        });
        self.input_open = false;
        Ok(())
    }

    /// An answer failed. The broker closing the publishing channel is the answer to one of
    /// the publishes in flight: attributed to it, it follows the unroutable policy (see
    /// [`Self::on_channel_closed`]). Any other failure ends the loop.
    async fn on_answer_failed(&mut self, error: RelayError) -> Result<(), RelayError> {
        match error {
            RelayError::Broker(BrokerError::ChannelClosed {
                reply_code,
                reply_text,
            }) => self.on_channel_closed(reply_code, reply_text).await,
            other => Err(other),
        }
    }

    /// Starting a publish failed: the loop ends (the message it took is not in flight). A
    /// publish started just after the broker closed the channel fails with the channel's
    /// state, not the close's reason. The publishes in flight carry that reason, behind the
    /// answers the broker gave before it: those are taken in order until the close shows,
    /// so the error names what the broker refused and a 406 teaches its limit.
    async fn on_start_failed(&mut self, error: RelayError) -> RelayError {
        if !matches!(error, RelayError::Broker(BrokerError::Failed(_))) {
            return error;
        }
        let deadline = Instant::now() + CLOSE_REASON_WAIT;
        while let Some(next) = self.queue.next_unresolved(Channel::Publishing) {
            match tokio::time::timeout_at(deadline, next.pending.answer()).await {
                Ok(Err(RelayError::Broker(BrokerError::ChannelClosed {
                    reply_code,
                    reply_text,
                }))) => {
                    self.learn_from_refusal(reply_code, &reply_text);
                    return self.refused_error(reply_code, &reply_text);
                }
                Ok(answer) => {
                    if self.on_answer(Channel::Publishing, answer).is_err() {
                        return error;
                    }
                }
                Err(_) => return error,
            }
        }
        error
    }

    /// The body limit a 406 over a message's size names, learned for the next publishes
    /// (and sessions); `None` for any other refusal.
    fn learn_from_refusal(&self, reply_code: u16, reply_text: &str) -> Option<(usize, usize)> {
        let refused = refused_size(reply_code, reply_text);
        if let Some((_, limit)) = refused {
            self.publisher.learn_max_message_size(limit);
        }
        refused
    }

    /// The broker closed the publishing channel (`reply_code`, `reply_text`) over one of the
    /// publishes in flight. Alone in flight with its original kept (the window is 1 while a
    /// stuck message is retried) and under the dead-letter policy, it is dead-lettered and
    /// publishing goes on on a new channel; otherwise the loop ends with the error that names
    /// it, or, when several were in flight and nothing says which, the newest of them: the
    /// next session publishes them one at a time up to it, which finds the one.
    async fn on_channel_closed(
        &mut self,
        reply_code: u16,
        reply_text: String,
    ) -> Result<(), RelayError> {
        let refused_size = self.learn_from_refusal(reply_code, &reply_text);
        // Kept only while the window is 1: alone in flight, it is the front.
        let alone_and_kept = self.queue.unresolved(Channel::Publishing).count() == 1
            && self
                .queue
                .next_unresolved(Channel::Publishing)
                .is_some_and(|next| next.original.is_some());
        let dead_letters = self.publisher.dead_letter_exchange().map(str::to_string);
        let (Some(exchange), true) = (dead_letters, alone_and_kept) else {
            return Err(self.refused_error(reply_code, &reply_text));
        };
        let Some(original) = self
            .queue
            .next_unresolved(Channel::Publishing)
            .and_then(|next| next.original.take())
        else {
            return Err(self.refused_error(reply_code, &reply_text));
        };
        let reason = match refused_size {
            Some((size, limit)) => Reason::Rejected(Rejection::TooLarge { size, limit }),
            None => Reason::Refused {
                reply_code,
                reply_text,
                exchange: original.exchange.clone(),
            },
        };
        let letter = dead_letter::dead_letter(&exchange, original, &reason);
        let pending = self.publisher.start_dead_letter(letter).await?;
        let Some(front) = self.queue.dead_letter_front(reason) else {
            return Err(RelayError::Bug(
                "the refused publish is not the front".into(),
            ));
        };
        front.pending = pending;
        self.publisher.reopen().await?;
        // The new channel's first publish goes where the refused one went only if it exists.
        self.exchange_checked.clear();
        Ok(())
    }

    /// The error the broker's closing of the publishing channel ends the loop with: naming
    /// the publish it refused when one is alone in flight or has the size a 406 names, else
    /// the newest publish in flight (see [`Self::on_channel_closed`]).
    fn refused_error(&self, reply_code: u16, reply_text: &str) -> RelayError {
        let unresolved: Vec<(&str, &InFlight<P::Pending>)> =
            self.queue.unresolved(Channel::Publishing).collect();
        let by_size = refused_size(reply_code, reply_text).and_then(|(size, _)| {
            unresolved
                .iter()
                .find(|(_, in_flight)| in_flight.body_len == size)
        });
        let culprit = by_size.or(match unresolved.as_slice() {
            [only] => Some(only),
            _ => None,
        });
        if let Some((message_id, in_flight)) = culprit {
            return RelayError::Broker(BrokerError::PublishRefused {
                message_id: message_id.to_string(),
                size: in_flight.body_len,
                reply_code,
                reply_text: reply_text.to_string(),
            });
        }
        match unresolved.last() {
            Some((newest, _)) => RelayError::Broker(BrokerError::PublishRefusedAmong {
                last_message_id: newest.to_string(),
                unconfirmed: unresolved.len(),
                reply_code,
                reply_text: reply_text.to_string(),
            }),
            None => RelayError::Broker(BrokerError::ChannelClosed {
                reply_code,
                reply_text: reply_text.to_string(),
            }),
        }
    }
}

/// The body size and the limit a 406 that closed the channel names: RabbitMQ's text is
/// "PRECONDITION_FAILED - message size 20971532 is larger than configured max size
/// 16777216". `None` for another code or text: attribution then does without it.
fn refused_size(reply_code: u16, reply_text: &str) -> Option<(usize, usize)> {
    const PRECONDITION_FAILED: u16 = 406;
    if reply_code != PRECONDITION_FAILED {
        return None;
    }
    let number_after = |marker: &str| -> Option<usize> {
        let rest = &reply_text[reply_text.find(marker)? + marker.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    Some((number_after("message size ")?, number_after("max size ")?))
}

/// An answer on `channel`. The broker closing the dead-letter channel refuses no publish
/// the loop could attribute (that is the publishing channel's close): it ends the session
/// like any broker error, and the next one checks the dead-letter exchange again.
fn answer_on(channel: Channel, answer: Result<Answer, RelayError>) -> Result<Answer, RelayError> {
    match (channel, answer) {
        (
            Channel::DeadLetters,
            Err(RelayError::Broker(BrokerError::ChannelClosed {
                reply_code,
                reply_text,
            })),
        ) => Err(RelayError::Broker(BrokerError::Failed(format!(
            "RabbitMQ closed the dead-letter channel: {reply_code} {reply_text}"
        )))),
        (_, answer) => answer,
    }
}

/// Records the broker's answer for the queue's next unresolved publish on `channel`, and
/// the return it carried, for whichever publish the return names.
fn observe<T: AckToken, S>(
    queue: &mut ConfirmQueue<T, InFlight<S>>,
    channel: Channel,
    answer: Answer,
) -> Result<(), RelayError> {
    if let Some(returned) = answer.returned {
        queue.record_return(returned).map_err(failure_error)?;
    }
    queue.resolve_next(channel, answer.acked);
    Ok(())
}

/// Records every answer that is already there on each channel, in publish order, up to the
/// first publish still waiting there: lapin resolves a multiple ack's confirms one by one,
/// and a return it attached to any of them must be seen before a barrier passes.
fn observe_ready<T: AckToken, S: Pending>(
    queue: &mut ConfirmQueue<T, InFlight<S>>,
) -> Result<(), RelayError> {
    for channel in [Channel::Publishing, Channel::DeadLetters] {
        while let Some(next) = queue.next_unresolved(channel) {
            let Some(answer) = next.pending.answer().now_or_never() else {
                break;
            };
            observe(queue, channel, answer_on(channel, answer)?)?;
        }
    }
    Ok(())
}

/// The error a [`Failure`] stops the pipeline with, when it is not dead-lettered.
fn failure_error(failure: Failure) -> RelayError {
    match failure {
        Failure::Nacked { message_id } => RelayError::Broker(BrokerError::Nacked { message_id }),
        Failure::Returned {
            message_id,
            returned,
        } => RelayError::Broker(BrokerError::Returned {
            message_id,
            exchange: returned.message.exchange,
            routing_key: returned.message.routing_key,
            reply_code: returned.reply_code,
            reply_text: returned.reply_text,
        }),
        Failure::DeadLetterReturned {
            message_id,
            returned,
        } => RelayError::Broker(BrokerError::DeadLetterReturned {
            message_id,
            exchange: returned.message.exchange,
            routing_key: returned.message.routing_key,
            reply_code: returned.reply_code,
            reply_text: returned.reply_text,
        }),
        Failure::ReturnedAfterSettle {
            message_id,
            returned,
        } => RelayError::Broker(BrokerError::ReturnedAfterSettle {
            message_id,
            exchange: returned.message.exchange,
            routing_key: returned.message.routing_key,
            reply_code: returned.reply_code,
            reply_text: returned.reply_text,
        }),
    }
}

#[cfg(test)]
mod tests;
