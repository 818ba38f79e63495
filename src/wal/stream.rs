//! The stream reader: the task that owns the PostgreSQL replication client.
//!
//! ```text
//!  client.recv() ──▶ Source::on_event ──▶ inputs (bounded) ──▶ delivery task
//!  client.update_applied_lsn ◀───────────── acked (watch) ◀────┘
//! ```
//!
//! It reads the stream only when the delivery side has room for one more input, turns each
//! event into at most one input, and tells PostgreSQL the position the delivery side
//! acknowledged: it is the only caller of `update_applied_lsn`, and it never calls it with
//! a position the delivery task has not handed back. It never talks to the broker.
//!
//! Because ack points travel through the same channel as the rows before them, an ack point
//! always sits behind everything received before it, including inputs still in the channel.
//! That is what makes acknowledging an idle keepalive's WAL end safe (DESIGN.md invariant 3).
//!
//! How it ends: a graceful stop (between transactions) or a definite error of the source
//! closes the inputs; the delivery task settles what it has and ends; the reader then makes
//! sure PostgreSQL has the final position before it closes the stream. A broken stream aborts
//! the delivery at once: nothing it confirms afterwards could be acknowledged anyway.

use std::sync::Arc;
use std::time::Duration;

use pgwire_replication::{Lsn, PgWireError, ReplicationClient};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::config::OutboxNames;
use crate::db;
use crate::error::RelayError;
use crate::observability::{pg_timestamp, Health};
use crate::publish::{Acked, Input};
use crate::wal::position::AckPosition;
use crate::wal::slot::read_slot;
use crate::wal::source::Source;

/// How long a stopping session waits for its last acknowledged position to reach PostgreSQL.
const FINAL_FEEDBACK_TIMEOUT: Duration = Duration::from_secs(5);
/// The same after a failure: a little, since the session is being torn down anyway.
const FAILURE_FEEDBACK_TIMEOUT: Duration = Duration::from_secs(1);

pub struct StreamReader<'a> {
    pub client: ReplicationClient,
    pub source: Source,
    /// The slot's confirmed position when the session started.
    pub start: Lsn,
    /// With heartbeats on, the stream is dead if nothing arrives for this long while the
    /// reader is waiting on it (not while the delivery side holds it back).
    pub silence_limit: Option<Duration>,
    /// Notified whenever the client has sent a status update.
    pub feedback_sent: Arc<Notify>,
    pub names: &'a OutboxNames,
    /// For the final check that the slot took the last acknowledged position, and for
    /// telling stream errors apart.
    pub database_url: &'a str,
    pub health: Health,
}

/// The delivery task's handle: its result once it has settled everything it took.
pub type DeliveryTask = AbortOnDropHandle<Result<(), RelayError>>;

impl StreamReader<'_> {
    /// Runs until the stream fails, the delivery fails, the source finds a definite error,
    /// or `shutdown` stops it between transactions (`Ok`).
    pub async fn run(
        self,
        inputs: mpsc::Sender<Input<AckPosition>>,
        mut acked: watch::Receiver<Acked<AckPosition>>,
        mut delivery: DeliveryTask,
        shutdown: CancellationToken,
    ) -> Result<(), RelayError> {
        let StreamReader {
            mut client,
            mut source,
            start,
            silence_limit,
            feedback_sent,
            names,
            database_url,
            health,
        } = self;
        let mut inputs = Some(inputs);
        let mut acknowledged = Acknowledged {
            applied: start,
            health,
        };
        // A definite error of the source: reported once the delivery settled what came before.
        let mut source_error: Option<RelayError> = None;
        // Since when the reader has been waiting on the stream with room to forward: set when
        // it starts waiting, cleared by any event and whenever the delivery side is behind.
        let mut waiting_since: Option<Instant> = None;
        // The loop's own `return`s leave this block, not the function: whatever ended it, the
        // position acknowledged so far is flushed below while the stream is still up, which
        // keeps the replay after a broker failure small.
        let outcome: Result<(), RelayError> = async {
            loop {
                // Under a backlog the stream is always ready, and the select below then polls
                // nothing else: the acknowledgements and the stop request are looked at here,
                // without registering a waiter for each of them once per event.
                // Closed means the delivery task ended; its last acknowledgement may still be
                // unseen (has_changed reports the closing first), so it is taken either way.
                let changed = acked.has_changed();
                if !matches!(changed, Ok(false)) {
                    acknowledged.take(&mut acked, &client);
                }
                if changed.is_err() {
                    return delivery_outcome(&mut delivery, &mut source_error).await;
                }
                let reading = inputs.is_some();
                let can_stop = reading && !source.in_transaction();
                // A stop request is honoured only between transactions: the current one
                // finishes, so a restart after a graceful stop publishes no duplicate.
                if can_stop && shutdown.is_cancelled() {
                    tracing::info!("stopping between transactions");
                    inputs = None;
                    continue;
                }
                let room = inputs.as_ref().is_some_and(|inputs| inputs.capacity() > 0);
                if !room {
                    waiting_since = None;
                } else if waiting_since.is_none() {
                    waiting_since = Some(Instant::now());
                }
                let silence_deadline = match (waiting_since, silence_limit) {
                    (Some(since), Some(limit)) => Some(since + limit),
                    _ => None,
                };
                // Set by a branch below: close the inputs once the select is over.
                let mut stop_reading = false;
                tokio::select! {
                    biased;

                    forwarded = async {
                        let permit = inputs.as_ref()?.reserve().await.ok()?;
                        Some((permit, client.recv().await))
                    }, if reading => match forwarded {
                        // The delivery task is gone: its result arrives with `acked` closing.
                        None => stop_reading = true,
                        Some((permit, Ok(Some(event)))) => {
                            waiting_since = None;
                            match source.on_event(event) {
                                Ok(Some(input)) => permit.send(input),
                                Ok(None) => {}
                                Err(e) => {
                                    // Deliver and acknowledge what came before, then stop.
                                    source_error = Some(e);
                                    stop_reading = true;
                                }
                            }
                        }
                        Some((_, Ok(None))) => return Err(RelayError::StreamEnded),
                        Some((_, Err(e))) => return Err(stream_error(e, names, database_url).await),
                    },

                    // Closed: the next pass takes the last acknowledgement and the outcome.
                    _ = acked.changed() => acknowledged.take(&mut acked, &client),

                    () = shutdown.cancelled(), if can_stop => {
                        tracing::info!("stopping between transactions");
                        stop_reading = true;
                    }

                    () = sleep_until_some(silence_deadline), if silence_deadline.is_some() => {
                        return Err(RelayError::StreamSilent {
                            seconds: silence_limit.unwrap_or_default().as_secs(),
                        });
                    }
                }
                if stop_reading {
                    inputs = None;
                }
            }
        }
        .await;
        drop(delivery);
        let stream_alive = !matches!(
            outcome,
            Err(RelayError::Replication { .. }
                | RelayError::StreamEnded
                | RelayError::StreamSilent { .. }
                | RelayError::SlotInUse { .. }
                | RelayError::SlotLost { .. }
                | RelayError::SlotMissing { .. }
                | RelayError::PublicationMissing { .. })
        );
        let target = acknowledged.applied;
        if stream_alive {
            // The crate's stop does not flush pending feedback: wait until PostgreSQL heard the
            // final position, then end the stream cleanly.
            let wait = if outcome.is_ok() {
                FINAL_FEEDBACK_TIMEOUT
            } else {
                FAILURE_FEEDBACK_TIMEOUT
            };
            let metrics = client.metrics();
            let flushed = tokio::time::timeout(wait, async {
                while metrics.last_applied_lsn() < target {
                    feedback_sent.notified().await;
                }
            })
            .await;
            if flushed.is_err() {
                tracing::warn!(%target, "acknowledged position not confirmed sent; a restart may replay a little");
            } else if outcome.is_ok()
                && !slot_reached(database_url, &names.slot, target, FINAL_FEEDBACK_TIMEOUT).await
            {
                tracing::warn!(%target, "the slot did not confirm the final position; a restart may replay a little");
            }
            client.stop();
        } else {
            // The worker may sit on a dead socket: do not wait for it.
            client.abort();
        }
        if outcome.is_ok() {
            tracing::info!(acknowledged = %target, "session stopped");
            let _ = tokio::time::timeout(FINAL_FEEDBACK_TIMEOUT, client.shutdown()).await;
        }
        outcome
    }
}

/// Maps a replication error to what it means for this relay. The server's SQLSTATE says
/// which kind of problem it is; the catalog, not the message text, says which object: who
/// holds the slot, whether the slot was invalidated, whether it is the slot or the
/// publication that is missing.
pub async fn stream_error(e: PgWireError, names: &OutboxNames, database_url: &str) -> RelayError {
    let error = RelayError::replication(e);
    let RelayError::Replication {
        sqlstate: Some(sqlstate),
        ..
    } = &error
    else {
        return error;
    };
    let sqlstate = sqlstate.clone();
    if ![
        SqlState::OBJECT_IN_USE,
        SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        SqlState::UNDEFINED_OBJECT,
    ]
    .contains(&sqlstate)
    {
        return error;
    }
    let slot = slot_row(database_url, &names.slot).await;
    match (sqlstate, slot) {
        (SqlState::OBJECT_IN_USE, slot) => RelayError::SlotInUse {
            slot: names.slot.to_string(),
            pid: slot
                .flatten()
                .and_then(|(pid, _)| pid)
                .map_or_else(|| "unknown".into(), |pid| pid.to_string()),
        },
        (SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE, Some(Some((_, true)))) => {
            RelayError::SlotLost {
                slot: names.slot.to_string(),
                confirmed_flush: "its last position".into(),
            }
        }
        (SqlState::UNDEFINED_OBJECT, Some(None)) => RelayError::SlotMissing {
            slot: names.slot.to_string(),
        },
        // The slot exists: the object the walsender could not find is the publication.
        (SqlState::UNDEFINED_OBJECT, Some(Some(_))) => RelayError::PublicationMissing {
            publication: names.publication.to_string(),
            table: names.table.to_string(),
        },
        _ => error,
    }
}

/// The slot's holder and whether it is lost: `Some(None)` when there is no such slot, `None`
/// when the catalog cannot be read.
async fn slot_row(database_url: &str, slot: &str) -> Option<Option<(Option<i32>, bool)>> {
    let read = async {
        let client = db::connect(database_url).await?;
        read_slot(&client, slot).await
    };
    match tokio::time::timeout(db::CONNECT_TIMEOUT, read).await {
        Ok(Ok(report)) => Some(report.map(|r| (r.active_pid, r.is_lost()))),
        _ => None,
    }
}

/// Waits until the slot's confirmed_flush_lsn is at `target`: false after `timeout` or on
/// any error. A sent status update is only bytes in a socket: the walsender reads them
/// between its own writes, and closing the connection while it still sends (the relay has
/// stopped reading) makes the kernel reset it, which discards whatever it had not read yet —
/// the final position included. A standby would then replay what was already delivered.
async fn slot_reached(database_url: &str, slot: &str, target: Lsn, timeout: Duration) -> bool {
    let check = async {
        let client = db::connect(database_url).await?;
        let target = target.to_string();
        loop {
            let reached: Option<bool> = client
                .query_opt(
                    "SELECT confirmed_flush_lsn >= $2::text::pg_lsn \
                     FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
                    &[&slot, &target],
                )
                .await?
                .and_then(|row| row.get(0));
            if reached != Some(false) {
                // Reached, or no slot to tell (the next session reports that).
                return Ok::<_, RelayError>(reached.is_some());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    matches!(tokio::time::timeout(timeout, check).await, Ok(Ok(true)))
}

/// The delivery task ended: it settled everything it took, or failed. Its result, or else the
/// source's definite error that made the reader stop.
async fn delivery_outcome(
    delivery: &mut DeliveryTask,
    source_error: &mut Option<RelayError>,
) -> Result<(), RelayError> {
    let delivered = delivery.await.unwrap_or_else(|e| {
        Err(RelayError::Bug(format!(
            "the delivery task ended abnormally: {e}"
        )))
    });
    delivered.and(source_error.take().map_or(Ok(()), Err))
}

/// What the reader has told PostgreSQL of the delivery side's acknowledgements.
struct Acknowledged {
    /// The position last handed to `update_applied_lsn`.
    applied: Lsn,
    health: Health,
}

impl Acknowledged {
    /// Takes the delivery side's newest acknowledgement: tells PostgreSQL a position past the
    /// one already applied.
    fn take(
        &mut self,
        acked: &mut watch::Receiver<Acked<AckPosition>>,
        client: &ReplicationClient,
    ) {
        let acked = acked.borrow_and_update();
        if let Some(position) = acked.token {
            if position.lsn > self.applied {
                self.applied = position.lsn;
                client.update_applied_lsn(position.lsn);
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
        }
    }
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
