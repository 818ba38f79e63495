//! The delivery task: the one loop that publishes, awaits confirms in order, handles returns
//! and dead letters, and hands back how far its source may consider messages delivered.
//!
//! ```text
//!  source ── Input::Publish / Input::AckPoint(T) ──▶ delivery ── basic_publish ──▶ RabbitMQ
//!  (WAL reader, poll worker,  (bounded channel)       ConfirmQueue<T, _>   ◀── ack/nack/return
//!   resync, benchmark)  ◀── Acked { token: T } (watch) ── acknowledged prefix
//! ```
//!
//! Owns the in-flight window (at most `window` unconfirmed publishes: it reads no input while
//! the window is full, which is what holds the source back), the confirm queue, the confirm
//! timeout (paused while the broker blocks publishers) and the dead-letter re-publishes. It
//! never knows what a token means: a WAL position, a polling batch, nothing. It must never
//! report a token before every publish ahead of it is confirmed without a return, and it
//! stops at the first nack, return (under halt), closed channel or timeout: nothing after
//! the failure is ever acknowledged.
//!
//! After a failure the source may name a stuck message: the window is 1 until that message is
//! confirmed, so a message the broker keeps refusing does not drag a full window of
//! re-publishes along on every retry.

use std::time::{Duration, SystemTime};

use futures_util::FutureExt;

use lapin::Confirmation;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::broker::{publish_on, Broker, RoundTrip, Stage};
use super::dead_letter::{self, Reason, ReturnedContent};
use super::queue::{AckToken, ConfirmQueue, Failure, Returned, Settled};
use crate::error::RelayError;
use crate::mapper::OutboxMessage;
use crate::observability::{RelayMetrics, DEAD_LETTERED_TOTAL, REASON_LABEL};

/// What a source hands the delivery task, in source order.
// Nearly every input is a publish: boxing it would add an allocation per message to save
// channel slots that are mostly publishes anyway.
#[allow(clippy::large_enum_variant)]
pub enum Input<T> {
    Publish {
        message: OutboxMessage,
        /// `Some` when `message` is the dead letter of a message that cannot be published.
        dead_letter: Option<Reason>,
        /// When its transaction committed, for the commit-to-confirm latency.
        committed_at: Option<SystemTime>,
    },
    /// Everything before this point: acknowledge `T` once all of it is confirmed.
    AckPoint(T),
}

/// What the delivery task reports back (on a watch: a source reads the newest value).
#[derive(Debug, Clone, PartialEq)]
pub struct Acked<T> {
    /// Every ack point acknowledged so far, folded; `None` before the first.
    pub token: Option<T>,
    /// The stuck message this delivery started with, until the broker confirms it.
    pub stuck: Option<String>,
}

impl<T> Acked<T> {
    pub fn new(stuck: Option<String>) -> Self {
        Self { token: None, stuck }
    }
}

pub struct DeliveryOptions {
    /// Most unconfirmed publishes at once.
    pub window: usize,
    /// How long the front publish may wait for its confirm (paused while blocked).
    pub confirm_timeout: Duration,
}

/// An unconfirmed publish.
struct InFlight {
    stage: Stage,
    committed_at: Option<SystemTime>,
}

impl AsMut<Stage> for InFlight {
    fn as_mut(&mut self) -> &mut Stage {
        &mut self.stage
    }
}

/// Runs until `input` is closed and every publish taken from it is settled (`Ok`), or until
/// the first failure (`Err`). `acked` starts as [`Acked::new`] with the stuck message, if
/// any, and is updated as ack points are acknowledged.
///
/// Confirms are awaited in publish order and each answer is recorded in the queue; a publish
/// is settled only once a confirm barrier passed after its answer (see
/// [`ConfirmQueue`]): a [`Broker::round_trip`] sent after the answer came back, or a publish
/// sent after it was confirmed, and every confirm ready by then was looked at for returns.
pub async fn deliver<T: AckToken + Clone>(
    broker: &Broker,
    options: &DeliveryOptions,
    metrics: &RelayMetrics,
    mut input: mpsc::Receiver<Input<T>>,
    acked: &watch::Sender<Acked<T>>,
) -> Result<(), RelayError> {
    let mut queue: ConfirmQueue<T, InFlight> = ConfirmQueue::new();
    let mut stuck = acked.borrow().stuck.clone();
    let mut window = if stuck.is_some() { 1 } else { options.window };
    let mut blocked = broker.blocked();
    let mut blocked_open = true;
    let mut input_open = true;
    // Since the broker last answered anything: the confirm timeout runs from here.
    let mut waiting_since = Instant::now();
    // At most one round trip at a time, with the barrier it was sent for.
    let mut round_trip: Option<(u64, RoundTrip)> = None;
    let outcome = 'delivery: loop {
        // Settle and pass ack points in turn: an ack point between two settleable publishes
        // must not hold the second back.
        let mut advanced = false;
        let settled = loop {
            match settle_ready(&mut queue, broker, metrics, stuck.as_deref()).await {
                Ok(true) => {
                    tracing::info!(message_id = ?stuck, "stuck message delivered; full window again");
                    window = options.window;
                    stuck = None;
                    acked.send_modify(|acked| acked.stuck = None);
                }
                Ok(false) => {}
                Err(e) => break Err(e),
            }
            if !queue.advance() {
                break Ok(());
            }
            advanced = true;
        };
        if advanced {
            let token = queue.acknowledged().cloned();
            acked.send_modify(|acked| acked.token = token);
            metrics.ack_points.set(queue.ack_points() as f64);
        }
        if let Err(e) = settled {
            break Err(count_failure(metrics, e));
        }
        if !input_open && queue.is_empty() {
            break Ok(());
        }
        if queue.needs_barrier() {
            queue.begin_barrier();
        }
        if round_trip.is_none() {
            if let Some(epoch) = queue.barrier_outstanding() {
                round_trip = Some((epoch, broker.round_trip()));
            }
        }
        let has_unresolved = queue.next_unresolved().is_some();
        let room = queue.in_flight() < window;
        let timing = queue.in_flight() > 0 && !*blocked.borrow();
        let deadline = waiting_since + options.confirm_timeout;
        tokio::select! {
            biased;

            confirmation = async {
                match queue.next_unresolved() {
                    Some(next) => next.stage.confirmation().await,
                    None => std::future::pending().await,
                }
            }, if has_unresolved => {
                waiting_since = Instant::now();
                if let Err(e) = observe(&mut queue, confirmation).and_then(|()| observe_ready(&mut queue)) {
                    break Err(count_failure(metrics, e));
                }
                if queue.barrier_witnessed() {
                    if let Some(epoch) = queue.barrier_outstanding() {
                        queue.pass_barrier(epoch);
                    }
                }
            }

            answered = async {
                match round_trip.as_mut() {
                    Some((_, answer)) => answer.await,
                    None => std::future::pending().await,
                }
            }, if round_trip.is_some() => {
                let sent_for = round_trip.take().map(|(epoch, _)| epoch);
                if let Err(e) = answered {
                    break Err(e.into());
                }
                waiting_since = Instant::now();
                if let Err(e) = observe_ready(&mut queue) {
                    break Err(count_failure(metrics, e));
                }
                if let Some(epoch) = sent_for {
                    queue.pass_barrier(epoch);
                }
            }

            item = input.recv(), if input_open && room => {
                // Everything already queued is taken in one pass (up to the window): under a
                // backlog one wake-up publishes a burst, and the frames go out together.
                let mut item = item;
                loop {
                    match item {
                        Some(Input::Publish { message, dead_letter, committed_at }) => {
                            if queue.in_flight() == 0 {
                                waiting_since = Instant::now();
                            }
                            let message_id = message.message_id.clone();
                            // One poll queues the frames: publishing in input order keeps
                            // delivery tags in input order.
                            let stage = match Stage::start(broker, message).await {
                                Ok(stage) => stage,
                                Err(e) => break 'delivery Err(e.into()),
                            };
                            metrics.published.increment(1);
                            metrics.in_flight.increment(1.0);
                            let pending = InFlight { stage, committed_at };
                            match dead_letter {
                                None => queue.push_publish(message_id, pending),
                                Some(reason) => queue.push_dead_letter(message_id, reason, pending),
                            }
                        }
                        Some(Input::AckPoint(token)) => {
                            queue.push_ack_point(token);
                            metrics.ack_points.set(queue.ack_points() as f64);
                        }
                        None => {
                            input_open = false;
                            break;
                        }
                    }
                    if queue.in_flight() >= window {
                        break;
                    }
                    item = match input.try_recv() {
                        Ok(next) => Some(next),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => None,
                    };
                }
            }

            () = tokio::time::sleep_until(deadline), if timing => {
                break Err(RelayError::ConfirmTimeout {
                    message_id: queue.front_message_id().unwrap_or_default().to_string(),
                    seconds: options.confirm_timeout.as_secs(),
                });
            }

            changed = blocked.changed(), if blocked_open => {
                // The timeout restarts when the broker unblocks: waiting while blocked is the
                // broker's choice, not a lost confirm.
                blocked_open = changed.is_ok();
                waiting_since = Instant::now();
            }
        }
    };
    metrics.in_flight.decrement(queue.in_flight() as f64);
    metrics.ack_points.set(0.0);
    outcome
}

/// Counts a failure that stops the pipeline by its kind.
fn count_failure(metrics: &RelayMetrics, e: RelayError) -> RelayError {
    match e {
        RelayError::Nacked { .. } => metrics.nacked.increment(1),
        RelayError::Returned { .. }
        | RelayError::DeadLetterReturned { .. }
        | RelayError::ReturnedAfterSettle { .. } => metrics.returned.increment(1),
        _ => {}
    }
    e
}

/// Records the broker's answer for the queue's next unresolved publish, and the return its
/// confirm carried, for whichever publish the return names.
fn observe<T: AckToken, P>(
    queue: &mut ConfirmQueue<T, P>,
    confirmation: Result<Confirmation, lapin::Error>,
) -> Result<(), RelayError> {
    let (acked, returned) = match confirmation? {
        Confirmation::Ack(returned) => (true, returned),
        Confirmation::Nack(returned) => (false, returned),
        Confirmation::NotRequested => {
            return Err(RelayError::Bug("publisher confirms are not enabled".into()))
        }
    };
    if let Some(returned) = returned {
        let delivery = returned.delivery;
        let message_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_string())
            .unwrap_or_default();
        let recorded = queue.record_return(
            message_id,
            Returned {
                exchange: delivery.exchange.as_str().to_string(),
                routing_key: delivery.routing_key.as_str().to_string(),
                reply_code: returned.reply_code,
                reply_text: returned.reply_text.as_str().to_string(),
                content: ReturnedContent {
                    properties: delivery.properties,
                    body: delivery.data.into(),
                },
            },
        );
        recorded.map_err(failure_error)?;
    }
    queue.resolve_next(acked);
    Ok(())
}

/// Records every answer that is already there, in publish order, up to the first publish
/// still waiting: lapin resolves a multiple ack's confirms one by one, and a return it
/// attached to any of them must be seen before a barrier passes.
fn observe_ready<T: AckToken, P: AsMut<Stage>>(
    queue: &mut ConfirmQueue<T, P>,
) -> Result<(), RelayError> {
    loop {
        let Some(next) = queue.next_unresolved() else {
            return Ok(());
        };
        let Some(confirmation) = next.as_mut().confirmation().now_or_never() else {
            return Ok(());
        };
        observe(queue, confirmation)?;
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
            exchange: returned.exchange,
            routing_key: returned.routing_key,
            reply_code: returned.reply_code,
            reply_text: returned.reply_text,
        },
        Failure::DeadLetterReturned {
            message_id,
            returned,
        } => RelayError::DeadLetterReturned {
            message_id,
            exchange: returned.exchange,
            routing_key: returned.routing_key,
            reply_code: returned.reply_code,
            reply_text: returned.reply_text,
        },
        Failure::ReturnedAfterSettle {
            message_id,
            returned,
        } => RelayError::ReturnedAfterSettle {
            message_id,
            exchange: returned.exchange,
            routing_key: returned.routing_key,
            reply_code: returned.reply_code,
            reply_text: returned.reply_text,
        },
    }
}

/// Settles the front publishes that passed barriers made settleable, in order; `true` when
/// one of them was the `stuck` message. A returned front under the dead-letter policy is
/// re-published to the dead-letter exchange and stays at the front, unresolved again.
async fn settle_ready<T: AckToken>(
    queue: &mut ConfirmQueue<T, InFlight>,
    broker: &Broker,
    metrics: &RelayMetrics,
    stuck: Option<&str>,
) -> Result<bool, RelayError> {
    let mut stuck_settled = false;
    while let Some(acked) = queue.settleable_front() {
        match settle_front(queue, acked, broker).await? {
            Settle::DeadLettering => metrics.returned.increment(1),
            Settle::Settled(settled) => {
                metrics.in_flight.decrement(1.0);
                if settled.dead_lettered.is_none() {
                    metrics.confirmed.increment(1);
                }
                if let Some(committed_at) = settled.pending.committed_at {
                    metrics.observe_commit_to_confirm(committed_at);
                }
                stuck_settled |= stuck == Some(settled.message_id.as_str());
            }
        }
    }
    Ok(stuck_settled)
}

/// Publishes a batch and returns once the broker confirmed every message of it (dead letters
/// included), or with the first failure: polling mode's and resync's whole delivery.
pub async fn deliver_batch(
    broker: &Broker,
    messages: Vec<(OutboxMessage, Option<Reason>)>,
    confirm_timeout: Duration,
    metrics: &RelayMetrics,
) -> Result<(), RelayError> {
    // Room for the whole batch and its ack point: the batch is queued before it is awaited.
    let (inputs, inputs_rx) = mpsc::channel(messages.len() + 1);
    for (message, dead_letter) in messages {
        let input = Input::Publish {
            message,
            dead_letter,
            committed_at: None,
        };
        if inputs.try_send(input).is_err() {
            return Err(RelayError::Bug("a batch outgrew its channel".into()));
        }
    }
    if inputs.try_send(Input::AckPoint(())).is_err() {
        return Err(RelayError::Bug("a batch outgrew its channel".into()));
    }
    drop(inputs);
    let options = DeliveryOptions {
        window: usize::MAX,
        confirm_timeout,
    };
    let (acked, _) = watch::channel(Acked::new(None));
    deliver(broker, &options, metrics, inputs_rx, &acked).await
}

/// What [`settle_front`] did with the front publish.
enum Settle<P> {
    /// Settled: confirmed, or its dead letter confirmed.
    Settled(Settled<P>),
    /// Returned as unroutable and re-published to the dead-letter exchange: it stays at the
    /// front, now awaiting its dead letter's confirm.
    DeadLettering,
}

/// Settles the front publish, which the broker answered (`acked`) and a barrier made
/// settleable: the settled publish, or the error that stops the pipeline. Under the
/// dead-letter policy a returned front is re-published to the dead-letter exchange instead of
/// failing.
async fn settle_front<T: AckToken, P: AsMut<Stage>>(
    queue: &mut ConfirmQueue<T, P>,
    acked: bool,
    broker: &Broker,
) -> Result<Settle<P>, RelayError> {
    match queue.settle_front(acked) {
        None => Err(RelayError::Bug(
            "settled a front that is not a publish".into(),
        )),
        Some(Ok(settled)) => {
            if let Some(reason) = &settled.dead_lettered {
                metrics::counter!(DEAD_LETTERED_TOTAL, REASON_LABEL => reason.label()).increment(1);
                tracing::warn!(
                    message_id = %settled.message_id,
                    reason = %reason,
                    "message dead-lettered: the dead-letter exchange confirmed it"
                );
            }
            Ok(Settle::Settled(settled))
        }
        Some(Err(Failure::Returned {
            message_id,
            returned,
        })) if broker.dead_letters.is_some() => {
            let Some(dead_letters) = &broker.dead_letters else {
                return Err(RelayError::Bug("dead letters are not enabled".into()));
            };
            let reason = returned.reason();
            let message = dead_letter::for_returned(
                &dead_letters.exchange,
                message_id,
                returned.content,
                &reason,
            );
            let stage = Stage::started(publish_on(dead_letters.channel.clone(), message)).await?;
            if let Some(front) = queue.dead_letter_front(reason) {
                *front.as_mut() = stage;
            }
            Ok(Settle::DeadLettering)
        }
        Some(Err(failure)) => Err(failure_error(failure)),
    }
}
