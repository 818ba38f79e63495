//! The stream reader: the task that owns the PostgreSQL replication client, and only that.
//!
//! ```text
//!  client.recv() ──▶ Source::on_event ──▶ inputs (bounded) ──▶ delivery task
//!  client.update_applied_lsn ◀───────────── acked (watch) ◀────┘
//! ```
//!
//! It reads the stream only when the delivery side has room for one more input, turns each
//! event into at most one input, and tells PostgreSQL the position the delivery side
//! acknowledged: it is the only caller of `update_applied_lsn`, and it never calls it with
//! a position the delivery task has not handed back. It never talks to the broker, and
//! opens no database connection: what a stream error means (by the catalog) and whether the
//! slot took the final position are the session's to find out ([`Stop`]).
//!
//! Because ack points travel through the same channel as the rows before them, an ack point
//! always sits behind everything received before it, including inputs still in the channel.
//! That is what makes acknowledging an idle keepalive's WAL end safe (docs/architecture.md,
//! "Invariants", 3).
//!
//! How it ends: a graceful stop (between transactions) or a definite error of the source
//! closes the inputs; the delivery task settles what it has and ends; the reader then makes
//! sure the final position was sent before it closes the stream. A broken stream aborts the
//! delivery at once: nothing it confirms afterwards could be acknowledged anyway.
//!
//! The loop is a state machine ([`StreamReader`]): one `select!` picks the next [`Step`],
//! one handler per step.

use std::sync::Arc;
use std::time::Duration;

use pgwire_replication::{Lsn, PgWireError, ReplicationClient, ReplicationEvent};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::error::RelayError;
use crate::observability::{pg_timestamp, Health};
use crate::publish::{Acked, Input};
use crate::wal::position::AckPosition;
use crate::wal::source::Source;
use crate::wal::timeline::HandedOver;

/// How long a stopping session waits for its last acknowledged position to be sent.
pub(crate) const FINAL_FEEDBACK_TIMEOUT: Duration = Duration::from_secs(5);
/// The same after a failure: a little, since the session is being torn down anyway.
const FAILURE_FEEDBACK_TIMEOUT: Duration = Duration::from_secs(1);

/// The delivery task's handle: its result once it has settled everything it took.
pub(crate) type DeliveryTask = AbortOnDropHandle<Result<(), RelayError>>;

/// How a reader's run ended.
#[derive(Debug)]
pub(crate) enum Stop {
    /// A graceful stop between transactions; the final position was sent (or the wait for
    /// it timed out, which was logged). The stream is still open: the session closes it
    /// once the slot has taken the position.
    Graceful {
        acknowledged: Lsn,
        stream: OpenStream,
    },
    /// The delivery or the source failed; the stream was alive, and the position
    /// acknowledged so far was sent.
    Failed(RelayError),
    /// The stream itself broke: nothing more could be sent on it.
    StreamLost(StreamLoss),
}

/// A stream that stopped reading and is still open: closing it too early can lose the
/// final position (see `crate::catalog::slot::wait_until_confirmed`).
pub(crate) struct OpenStream(ReplicationClient);

impl std::fmt::Debug for OpenStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenStream")
    }
}

impl OpenStream {
    /// Ends the stream cleanly.
    pub(crate) async fn close(self) {
        let mut client = self.0;
        client.stop();
        let _ = tokio::time::timeout(FINAL_FEEDBACK_TIMEOUT, client.shutdown()).await;
    }
}

/// What broke the stream.
#[derive(Debug)]
pub(crate) enum StreamLoss {
    /// The replication crate's error: the session explains it with the catalog.
    Error(PgWireError),
    /// The server closed the stream.
    Ended,
    /// Nothing arrived for the silence limit (seconds), not even own heartbeats.
    Silent { seconds: u64 },
}

/// What the reader does next.
enum Step {
    Event(Result<Option<ReplicationEvent>, PgWireError>),
    /// The client's worker ended: the connection is gone, whatever events it buffered.
    WorkerEnded,
    /// The inputs channel has room again.
    Room,
    /// The delivery task is gone: its result arrives with the acknowledgements' end.
    DeliveryGone,
    Acknowledged,
    StopRequested,
    Silent,
}

pub(crate) struct StreamReader {
    client: ReplicationClient,
    source: Source,
    /// With heartbeats on, the stream is dead if nothing arrives for this long while the
    /// reader is waiting on it (not while the delivery side holds it back).
    silence_limit: Option<Duration>,
    /// Notified whenever the client has sent a status update.
    feedback_sent: Arc<Notify>,
    /// The position last handed to `update_applied_lsn`.
    applied: Lsn,
    health: Health,
    /// `None` once the reader stopped reading (a stop request, a definite source error, or
    /// the delivery task gone).
    inputs: Option<mpsc::Sender<Input<AckPosition>>>,
    acked: watch::Receiver<Acked<AckPosition>>,
    delivery: DeliveryTask,
    /// A definite error of the source: reported once the delivery settled what came before.
    source_error: Option<RelayError>,
    /// Since when the reader has been waiting on the stream with room to forward: set when
    /// it starts waiting, cleared by any event and whenever the delivery side is behind.
    waiting_since: Option<Instant>,
    /// Notes the commit of every transaction whose rows go to delivery.
    handed_over: HandedOver,
    /// The commit last noted there: once per transaction, not per row.
    noted_commit: Lsn,
}

/// What the reader is handed by its session.
pub(crate) struct ReaderParts {
    pub client: ReplicationClient,
    pub source: Source,
    /// The slot's confirmed position when the session started.
    pub start: Lsn,
    pub silence_limit: Option<Duration>,
    pub feedback_sent: Arc<Notify>,
    pub health: Health,
    pub inputs: mpsc::Sender<Input<AckPosition>>,
    pub acked: watch::Receiver<Acked<AckPosition>>,
    pub delivery: DeliveryTask,
    pub handed_over: HandedOver,
}

impl StreamReader {
    pub(crate) fn new(parts: ReaderParts) -> Self {
        Self {
            client: parts.client,
            source: parts.source,
            silence_limit: parts.silence_limit,
            feedback_sent: parts.feedback_sent,
            applied: parts.start,
            health: parts.health,
            inputs: Some(parts.inputs),
            acked: parts.acked,
            delivery: parts.delivery,
            source_error: None,
            waiting_since: None,
            handed_over: parts.handed_over,
            noted_commit: Lsn::ZERO,
        }
    }

    /// Runs until the stream fails, the delivery fails, the source finds a definite error,
    /// or `shutdown` stops it between transactions.
    pub(crate) async fn run(mut self, shutdown: CancellationToken) -> Stop {
        let ended = self.read(&shutdown).await;
        self.finish(ended).await
    }

    /// The loop. Its `return`s leave only the loop: whatever ended it, [`Self::finish`]
    /// sends the position acknowledged so far while the stream is still up, which keeps the
    /// replay after a broker failure small.
    async fn read(&mut self, shutdown: &CancellationToken) -> Result<(), Ended> {
        loop {
            // Under a backlog the stream is always ready, and the select below then polls
            // nothing else: the acknowledgements and the stop request are looked at here,
            // without registering a waiter for each of them once per event. Closed means the
            // delivery task ended; its last acknowledgement may still be unseen (has_changed
            // reports the closing first), so it is taken either way.
            let changed = self.acked.has_changed();
            if !matches!(changed, Ok(false)) {
                self.take_acknowledged();
            }
            if changed.is_err() {
                return self.delivery_outcome().await.map_err(Ended::Failed);
            }
            if self.can_stop() && shutdown.is_cancelled() {
                self.stop_reading();
                continue;
            }
            // Checked before every event: what the client still buffers after its connection
            // failed could be published, but never acknowledged (a replay's duplicates).
            let step = match self.client.worker_ended() {
                true => Step::WorkerEnded,
                false => self.next_step(shutdown).await,
            };
            if let Some(loss) = self.handle(step).await {
                return Err(Ended::StreamLost(loss));
            }
        }
    }

    /// A stop request is honoured only between transactions: the current one finishes, so a
    /// restart after a graceful stop publishes no duplicate.
    fn can_stop(&self) -> bool {
        self.inputs.is_some() && !self.source.in_transaction()
    }

    fn stop_reading(&mut self) {
        tracing::info!("stopping between transactions");
        self.inputs = None;
    }

    async fn next_step(&mut self, shutdown: &CancellationToken) -> Step {
        let room = self
            .inputs
            .as_ref()
            .is_some_and(|inputs| inputs.capacity() > 0);
        if !room {
            self.waiting_since = None;
        } else if self.waiting_since.is_none() {
            self.waiting_since = Some(Instant::now());
        }
        let silence_deadline = self
            .waiting_since
            .zip(self.silence_limit)
            .map(|(t, l)| t + l);
        let can_stop = self.can_stop();
        let worker_end = self.client.worker_end();
        let StreamReader {
            client,
            inputs,
            acked,
            ..
        } = self;
        tokio::select! {
            biased;

            event = client.recv(), if room => Step::Event(event),

            // While the delivery side holds the reader back: a connection that fails then
            // ends the session at once, not once its buffered events were published.
            () = worker_end, if !room => Step::WorkerEnded,

            // Full: wait for the delivery side to take an input. The permit only proves room.
            reserved = async {
                match inputs.as_ref() {
                    Some(inputs) => inputs.reserve().await.is_ok(),
                    None => std::future::pending().await,
                }
            }, if !room && inputs.is_some() => match reserved {
                true => Step::Room,
                false => Step::DeliveryGone,
            },

            // Closed: the next pass takes the last acknowledgement and the outcome.
            _ = acked.changed() => Step::Acknowledged,

            () = shutdown.cancelled(), if can_stop => Step::StopRequested,

            () = sleep_until_some(silence_deadline), if silence_deadline.is_some() => Step::Silent,
        }
    }

    /// One step; `Some` when it broke the stream.
    async fn handle(&mut self, step: Step) -> Option<StreamLoss> {
        match step {
            Step::Event(Ok(Some(event))) => self.forward(event),
            Step::Event(Ok(None)) => return Some(StreamLoss::Ended),
            Step::Event(Err(e)) => return Some(StreamLoss::Error(e)),
            Step::WorkerEnded => {
                return Some(match self.client.worker_outcome().await {
                    Ok(_) => StreamLoss::Ended,
                    Err(e) => StreamLoss::Error(e),
                })
            }
            Step::Room => {}
            Step::DeliveryGone => self.inputs = None,
            Step::Acknowledged => self.take_acknowledged(),
            Step::StopRequested => self.stop_reading(),
            Step::Silent => {
                let seconds = self.silence_limit.unwrap_or_default().as_secs();
                return Some(StreamLoss::Silent { seconds });
            }
        }
        None
    }

    /// Turns one event into at most one input and hands it on; the channel had room (this
    /// task is its only sender).
    fn forward(&mut self, event: ReplicationEvent) {
        self.waiting_since = None;
        match self.source.on_event(event) {
            Ok(None) => {}
            Ok(Some(input)) => {
                let Some(inputs) = &self.inputs else {
                    return;
                };
                let commit = match input {
                    Input::AckPoint(_) => None,
                    _ => self.source.transaction_commit_lsn(),
                };
                if let Some(commit) = commit.filter(|&c| c > self.noted_commit) {
                    self.noted_commit = commit;
                    self.handed_over.note(commit);
                }
                if let Err(e) = inputs.try_send(input) {
                    if matches!(e, mpsc::error::TrySendError::Full(_)) {
                        self.source_error = Some(RelayError::Bug(
                            "the inputs channel was full after the reader saw room".into(),
                        ));
                    }
                    // Closed: the delivery task is gone; its result arrives with `acked`.
                    self.inputs = None;
                }
            }
            Err(e) => {
                // Deliver and acknowledge what came before, then stop.
                self.source_error = Some(e);
                self.inputs = None;
            }
        }
    }

    /// Takes the delivery side's newest acknowledgement: tells PostgreSQL a position past the
    /// one already applied.
    fn take_acknowledged(&mut self) {
        let Some(position) = self.acked.borrow_and_update().token else {
            return;
        };
        if position.lsn <= self.applied {
            return;
        }
        self.applied = position.lsn;
        self.client.update_applied_lsn(position.lsn);
        self.health.record_acknowledged(
            position.lsn.as_u64(),
            position.commit_time.map(pg_timestamp),
        );
        if let Some(sent_at) = position.heartbeat_sent_at {
            self.health.record_heartbeat_acknowledged(
                std::time::UNIX_EPOCH + Duration::from_micros(sent_at),
            );
        }
    }

    /// The delivery task ended: it settled everything it took, or failed. Its result, or else
    /// the source's definite error that made the reader stop.
    async fn delivery_outcome(&mut self) -> Result<(), RelayError> {
        let delivered = (&mut self.delivery).await.unwrap_or_else(|e| {
            Err(RelayError::Bug(format!(
                "the delivery task ended abnormally: {e}"
            )))
        });
        delivered.and(self.source_error.take().map_or(Ok(()), Err))
    }

    /// Ends the reading: over a live stream the final position is sent first (the crate's
    /// stop does not flush pending feedback); a broken one is abandoned at once.
    async fn finish(self, ended: Result<(), Ended>) -> Stop {
        let StreamReader {
            mut client,
            applied,
            feedback_sent,
            delivery,
            ..
        } = self;
        drop(delivery);
        let failure = match ended {
            Err(Ended::StreamLost(loss)) => {
                // The worker may sit on a dead socket: do not wait for it.
                client.abort();
                return Stop::StreamLost(loss);
            }
            Err(Ended::Failed(e)) => Some(e),
            Ok(()) => None,
        };
        let wait = match failure {
            None => FINAL_FEEDBACK_TIMEOUT,
            Some(_) => FAILURE_FEEDBACK_TIMEOUT,
        };
        let metrics = client.metrics();
        let flushed = tokio::time::timeout(wait, async {
            while metrics.last_applied_lsn() < applied {
                feedback_sent.notified().await;
            }
        })
        .await;
        if flushed.is_err() {
            tracing::warn!(target = %applied, "acknowledged position not confirmed sent; a restart may replay a little");
        }
        match failure {
            Some(e) => {
                client.stop();
                Stop::Failed(e)
            }
            None => Stop::Graceful {
                acknowledged: applied,
                stream: OpenStream(client),
            },
        }
    }
}

/// How the reading loop ended, when not gracefully.
enum Ended {
    Failed(RelayError),
    StreamLost(StreamLoss),
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
