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

use super::dead_letter::{self, Reason};
use super::publisher::{Answer, Pending, Publisher};
use super::queue::{AckToken, ConfirmQueue, Failure, Settled};
use crate::contract::message::{Message, Unpublishable};
use crate::error::{ErrorKind, RelayError};
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

/// The deliberately broken build (cargo feature `broken-ack-before-confirm`, never in a
/// release): every ack point is acknowledged the moment it is queued, before the broker
/// confirmed what precedes it. It exists to show that the nemesis campaign catches a relay
/// that breaks invariant 1 (docs/reliability.md, "Nemesis"); off, this is a constant `false`.
const ACK_BEFORE_CONFIRM: bool = cfg!(feature = "broken-ack-before-confirm");

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
}

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
pub async fn deliver_batch<P: Publisher>(
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
    /// The broker answered the oldest publish not yet answered.
    Answered(Result<Answer, RelayError>),
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
                Event::Answered(answer) => self.on_answer(answer)?,
                Event::RoundTripDone(result) => self.on_round_trip(result)?,
                Event::Received(item) => self.on_received(item, input).await?,
                Event::ConfirmTimedOut => {
                    return Err(RelayError::ConfirmTimeout {
                        message_id: self.queue.front_message_id().unwrap_or_default().into(),
                        seconds: self.options.confirm_timeout.as_secs(),
                    })
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
        let has_unresolved = self.queue.next_unresolved().is_some();
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
        tokio::select! {
            biased;

            answer = async {
                match queue.next_unresolved() {
                    Some(next) => next.pending.answer().await,
                    None => std::future::pending().await,
                }
            }, if has_unresolved => Event::Answered(answer),

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
        if advanced && !ACK_BEFORE_CONFIRM {
            let token = self.queue.acknowledged().cloned();
            self.acked.send_modify(|acked| acked.token = token);
            self.metrics.ack_points.set(self.queue.ack_points() as f64);
        }
        settled
    }

    /// Settles the front publishes that passed barriers, in order. A returned front under
    /// the dead-letter policy is re-published to the dead-letter exchange and stays at the
    /// front, unresolved again.
    async fn settle_ready(&mut self) -> Result<(), RelayError> {
        while let Some(acked) = self.queue.settleable_front() {
            let Some(settled) = self.settle_front(acked).await? else {
                self.metrics.returned.increment(1);
                continue;
            };
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

    /// Settles the front publish, which the broker answered (`acked`) and a barrier made
    /// settleable: the settled publish, `None` when a returned front went to the dead-letter
    /// exchange instead, or the error that stops the pipeline.
    async fn settle_front(
        &mut self,
        acked: bool,
    ) -> Result<Option<Settled<InFlight<P::Pending>>>, RelayError> {
        let failure = match self.queue.settle_front(acked) {
            None => {
                return Err(RelayError::Bug(
                    "settled a front that is not a publish".into(),
                ))
            }
            Some(Ok(settled)) => {
                if let Some(reason) = &settled.dead_lettered {
                    metrics::counter!(DEAD_LETTERED_TOTAL, REASON_LABEL => reason.label())
                        .increment(1);
                    tracing::warn!(
                        message_id = %settled.message_id,
                        reason = %reason,
                        "message dead-lettered: the dead-letter exchange confirmed it"
                    );
                }
                return Ok(Some(settled));
            }
            Some(Err(failure)) => failure,
        };
        let (returned, exchange) = match (failure, self.publisher.dead_letter_exchange()) {
            (Failure::Returned { returned, .. }, Some(exchange)) => (returned, exchange),
            (failure, _) => return Err(failure_error(failure)),
        };
        let reason = Reason::of_return(&returned);
        let letter = dead_letter::dead_letter(exchange, returned.message, &reason);
        let pending = self.publisher.start_dead_letter(letter).await?;
        if let Some(front) = self.queue.dead_letter_front(reason) {
            front.pending = pending;
        }
        Ok(None)
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

    fn on_answer(&mut self, answer: Result<Answer, RelayError>) -> Result<(), RelayError> {
        observe(&mut self.queue, answer?)?;
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
                let message_id = message.message_id.clone();
                let pending = self.start(message, committed_at, now).await?;
                self.queue.push_publish(message_id, pending);
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
                let (Some(original), Some(exchange)) =
                    (original, self.publisher.dead_letter_exchange())
                else {
                    return Err(RelayError::Bug("dead-lettered without an original".into()));
                };
                let message_id = original.message_id.clone();
                let reason = Reason::Rejected(rejection);
                let letter = dead_letter::dead_letter(exchange, original, &reason);
                let pending = self.start(letter, committed_at, now).await?;
                self.queue.push_dead_letter(message_id, reason, pending);
            }
            Input::AckPoint(token) => {
                if ACK_BEFORE_CONFIRM {
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
        let pending = self.publisher.start(message).await?;
        self.metrics.published.increment(1);
        self.metrics.in_flight.increment(1.0);
        Ok(InFlight {
            pending,
            committed_at,
            started,
        })
    }
}

/// Records the broker's answer for the queue's next unresolved publish, and the return it
/// carried, for whichever publish the return names.
fn observe<T: AckToken, S>(
    queue: &mut ConfirmQueue<T, InFlight<S>>,
    answer: Answer,
) -> Result<(), RelayError> {
    if let Some(returned) = answer.returned {
        queue.record_return(returned).map_err(failure_error)?;
    }
    queue.resolve_next(answer.acked);
    Ok(())
}

/// Records every answer that is already there, in publish order, up to the first publish
/// still waiting: lapin resolves a multiple ack's confirms one by one, and a return it
/// attached to any of them must be seen before a barrier passes.
fn observe_ready<T: AckToken, S: Pending>(
    queue: &mut ConfirmQueue<T, InFlight<S>>,
) -> Result<(), RelayError> {
    loop {
        let Some(next) = queue.next_unresolved() else {
            return Ok(());
        };
        let Some(answer) = next.pending.answer().now_or_never() else {
            return Ok(());
        };
        observe(queue, answer?)?;
    }
}

/// The error a [`Failure`] stops the pipeline with, when it is not dead-lettered.
fn failure_error(failure: Failure) -> RelayError {
    match failure {
        Failure::Nacked { message_id } => RelayError::Nacked { message_id },
        Failure::Returned {
            message_id,
            returned,
        } => RelayError::Returned {
            message_id,
            exchange: returned.message.exchange,
            routing_key: returned.message.routing_key,
            reply_code: returned.reply_code,
            reply_text: returned.reply_text,
        },
        Failure::DeadLetterReturned {
            message_id,
            returned,
        } => RelayError::DeadLetterReturned {
            message_id,
            exchange: returned.message.exchange,
            routing_key: returned.message.routing_key,
            reply_code: returned.reply_code,
            reply_text: returned.reply_text,
        },
        Failure::ReturnedAfterSettle {
            message_id,
            returned,
        } => RelayError::ReturnedAfterSettle {
            message_id,
            exchange: returned.message.exchange,
            routing_key: returned.message.routing_key,
            reply_code: returned.reply_code,
            reply_text: returned.reply_text,
        },
    }
}

#[cfg(test)]
mod tests;
