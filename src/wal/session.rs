//! One replication session: from START_REPLICATION to the first failure or a graceful stop.
//!
//! Two tasks, joined by bounded channels so that nothing piles up:
//!
//! ```text
//!            events (bounded)              items (bounded)
//!  tracker ───────────────────> publisher ─────────────────> tracker
//!  (owns the replication         decode, map, basic_publish    awaits confirms IN ORDER,
//!   client: recv, feedback)      under the in-flight window    update_applied_lsn at ack points
//! ```
//!
//! The tracker owns the replication client, so it is the only caller of
//! `update_applied_lsn`. It reads the stream only to hand events to the publisher, which
//! turns them back into publishes and ack points in stream order; an ack point therefore
//! always sits behind everything received before it, including events still in a channel.
//! That is what makes acknowledging an idle keepalive's WAL end safe (DESIGN.md invariant 3).

use std::sync::Arc;
use std::time::Duration;

use pgwire_replication::{FeedbackObserver, Lsn, PgWireError, ReplicationClient, ReplicationEvent};
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{CleanupArgs, OutboxNames, Tuning};
use crate::db;
use crate::dead_letter::Reason;
use crate::error::{replication_sqlstate, RelayError};
use crate::mapper::{Mapper, Position};
use crate::observability::{pg_timestamp, Health, RelayMetrics};
use crate::pgoutput::{self, LogicalMessage};
use crate::publish::queue::{ConfirmQueue, Mark};
use crate::publish::{settle_front, Broker, Settle, Stage};
use crate::wal::heartbeat::{self, Heartbeat};
use crate::wal::preflight;
use crate::wal::relations::{Known, RelationCache};

/// Events the replication client may buffer. Small: events there are in flight but invisible
/// to the tracker, and a large buffer hides rows (DESIGN.md section 7).
pub const CLIENT_EVENT_BUFFER: usize = 256;
/// Events handed from the tracker to the publisher.
const EVENT_CHANNEL: usize = 256;
/// Publishes and ack points handed from the publisher to the tracker.
const ITEM_CHANNEL: usize = 1024;
/// How long a stopping session waits for its last acknowledged position to reach PostgreSQL.
const FINAL_FEEDBACK_TIMEOUT: Duration = Duration::from_secs(5);
/// The same after a failure: a little, since the session is being torn down anyway.
const FAILURE_FEEDBACK_TIMEOUT: Duration = Duration::from_secs(1);

/// What every session of one `run` shares.
pub struct SessionContext {
    pub database_url: String,
    pub amqp_url: String,
    pub names: OutboxNames,
    pub tuning: Tuning,
    pub mapper: Mapper,
    pub heartbeat: Heartbeat,
    pub health: Health,
    pub metrics: RelayMetrics,
    pub cleanup: CleanupArgs,
    /// The dead-letter exchange under `--on-unroutable dead-letter`; `None` under halt.
    pub dead_letter_exchange: Option<String>,
}

/// Runs one session. `stuck` names a message that failed in an earlier session: until the
/// broker confirms it, publishing uses a window of 1 so a stuck message does not drag a full
/// window of re-publishes along on every retry. Cleared here once it is confirmed.
pub async fn run(
    ctx: &SessionContext,
    stuck: &mut Option<String>,
    shutdown: CancellationToken,
) -> Result<(), RelayError> {
    let database = db::connect(&ctx.database_url).await?;
    let slot = preflight::check_all(&database, &ctx.names).await?;
    drop(database);

    let mut broker = Broker::connect(&ctx.amqp_url).await?;
    broker.declare_exchange(&ctx.names.exchange, true).await?;
    if let Some(exchange) = &ctx.dead_letter_exchange {
        broker.enable_dead_letters(exchange).await?;
    }
    let broker = Arc::new(broker);

    let feedback_sent = Arc::new(Notify::new());
    let observer = {
        let feedback_sent = Arc::clone(&feedback_sent);
        FeedbackObserver::new(move |_| feedback_sent.notify_one())
    };
    let config =
        db::replication_config(&ctx.database_url, &ctx.names.slot, &ctx.names.publication)?
            .with_start_lsn(slot.confirmed_flush)
            .with_status_interval(ctx.tuning.status_interval())
            .with_buffer_size(CLIENT_EVENT_BUFFER)
            .with_feedback_observer(observer);
    let tls = config.tls.clone();
    let start_error = |e: PgWireError| match e {
        PgWireError::Tls(_) => RelayError::pg_tls(e, &tls),
        e => stream_error(e, &ctx.names),
    };
    let mut client = ReplicationClient::connect(config)
        .await
        .map_err(start_error)?;
    // Connecting and START_REPLICATION run in the crate's worker: bound the wait, since a
    // server that accepts and goes silent would otherwise hold this session forever.
    match tokio::time::timeout(db::CONNECT_TIMEOUT, client.wait_started()).await {
        Ok(started) => started.map_err(start_error)?,
        Err(_) => {
            client.abort();
            return Err(RelayError::ConnectTimeout {
                what: "the PostgreSQL replication connection",
                seconds: db::CONNECT_TIMEOUT.as_secs(),
            });
        }
    }
    tracing::info!(
        slot = %ctx.names.slot,
        from = %slot.confirmed_flush,
        window = if stuck.is_some() { 1 } else { ctx.tuning.max_in_flight },
        "streaming"
    );
    ctx.health.set_ready();
    ctx.health.set_stuck(stuck.as_deref());
    ctx.health.set_broker_blocked(*broker.blocked().borrow());
    // Only the relay that holds the slot deletes delivered rows; it stops with the session.
    let _cleanup = AbortOnDrop(tokio::spawn(crate::cleanup::run_cleanup(
        ctx.database_url.clone(),
        ctx.names.clone(),
        ctx.cleanup.clone(),
        ctx.health.clone(),
        CancellationToken::new(),
    )));

    let full_window = ctx.tuning.max_in_flight as usize;
    let window = Arc::new(Semaphore::new(if stuck.is_some() {
        1
    } else {
        full_window
    }));
    let (events_tx, events_rx) = mpsc::channel(EVENT_CHANNEL);
    let (items_tx, items_rx) = mpsc::channel(ITEM_CHANNEL);
    let (schema, table) = ctx.names.table_parts();
    let publisher = Publisher {
        broker: Arc::clone(&broker),
        mapper: ctx.mapper.clone(),
        relations: RelationCache::new(schema, table),
        window: Arc::clone(&window),
        items: items_tx,
        heartbeat: ctx.heartbeat.clone(),
        metrics: ctx.metrics.clone(),
    };
    let publisher = tokio::spawn(publisher.run(events_rx, shutdown));
    // Heartbeats are written only while this session streams; dropping the guard stops them.
    let _heartbeats = ctx.tuning.heartbeat_interval().map(|interval| {
        AbortOnDrop(tokio::spawn(heartbeat::emit(
            ctx.database_url.clone(),
            ctx.heartbeat.clone(),
            interval,
        )))
    });

    let tracker = Tracker {
        client,
        queue: ConfirmQueue::new(slot.confirmed_flush),
        window,
        full_window,
        stuck,
        blocked: broker.blocked(),
        confirm_timeout: ctx.tuning.confirm_timeout(),
        silence_limit: ctx.tuning.heartbeat_interval().map(|i| i * 3),
        feedback_sent,
        names: &ctx.names,
        database_url: &ctx.database_url,
        health: ctx.health.clone(),
        metrics: ctx.metrics.clone(),
        broker: &broker,
    };
    let tracked = tracker.run(events_tx, items_rx).await;
    let published = match tracked {
        Err(e) => {
            publisher.abort();
            Err(e)
        }
        Ok(()) => publisher
            .await
            .unwrap_or_else(|e| Err(RelayError::Task(e.to_string()))),
    };
    broker.close().await;
    published
}

/// Maps a replication error to what it means for this relay.
fn stream_error(e: PgWireError, names: &OutboxNames) -> RelayError {
    let message = e.to_string();
    match replication_sqlstate(&e) {
        Some("55006") => RelayError::SlotInUse {
            slot: names.slot.clone(),
            pid: message
                .split("PID ")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .unwrap_or("unknown")
                .to_string(),
        },
        Some("55000") if message.contains("invalidated") => RelayError::SlotLost {
            slot: names.slot.clone(),
            confirmed_flush: "its last position".into(),
        },
        Some("42704") if message.contains("publication") => RelayError::PublicationMissing {
            publication: names.publication.clone(),
            table: names.table.clone(),
        },
        Some("42704") if message.contains("slot") => RelayError::SlotMissing {
            slot: names.slot.clone(),
        },
        _ => RelayError::Replication(e),
    }
}

/// What the publisher hands the tracker, in stream order.
enum Item {
    Publish {
        message_id: String,
        pending: InFlight,
        /// `Some` for the dead letter of a row that cannot be published.
        dead_letter: Option<Reason>,
    },
    AckPoint(Lsn, Mark),
}

/// An unconfirmed publish, and its place in the window (released on settle).
struct InFlight {
    stage: Stage,
    /// Its transaction's commit time (µs since 2000), for the commit-to-confirm latency.
    commit_time: i64,
    _window: OwnedSemaphorePermit,
}

impl AsMut<Stage> for InFlight {
    fn as_mut(&mut self) -> &mut Stage {
        &mut self.stage
    }
}

struct Publisher {
    broker: Arc<Broker>,
    mapper: Mapper,
    relations: RelationCache,
    window: Arc<Semaphore>,
    items: mpsc::Sender<Item>,
    heartbeat: Heartbeat,
    metrics: RelayMetrics,
}

/// The transaction being published: its commit LSN (from Begin) and the next row's index.
struct Transaction {
    commit_lsn: Lsn,
    commit_time: i64,
    next_index: u32,
}

/// Why the publisher stopped early: the tracker went away (it reports its own reason).
struct TrackerGone;

impl Publisher {
    async fn run(
        mut self,
        mut events: mpsc::Receiver<ReplicationEvent>,
        shutdown: CancellationToken,
    ) -> Result<(), RelayError> {
        let mut transaction: Option<Transaction> = None;
        loop {
            // A stop request is honoured only between transactions: the current one finishes,
            // so a restart after a graceful stop publishes no duplicate.
            let event = if transaction.is_none() {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => {
                        tracing::info!("stopping between transactions");
                        return Ok(());
                    }
                    event = events.recv() => event,
                }
            } else {
                events.recv().await
            };
            let Some(event) = event else {
                return Ok(());
            };
            let step = match event {
                ReplicationEvent::Begin {
                    final_lsn,
                    commit_time_micros,
                    ..
                } => {
                    transaction = Some(Transaction {
                        commit_lsn: final_lsn,
                        commit_time: commit_time_micros,
                        next_index: 0,
                    });
                    Ok(())
                }
                ReplicationEvent::Commit {
                    end_lsn,
                    commit_time_micros,
                    ..
                } => {
                    transaction = None;
                    let mark = Mark::Commit {
                        commit_time: commit_time_micros,
                    };
                    self.ack_point(end_lsn, mark).await
                }
                // Outside a transaction, everything before a keepalive or a non-transactional
                // message has been received: its LSN is an ack point.
                ReplicationEvent::KeepAlive { wal_end, .. } if transaction.is_none() => {
                    self.ack_point(wal_end, Mark::Idle).await
                }
                // Logical messages are never published; our own heartbeats are marked so that
                // their acknowledgement measures heartbeat lag.
                ReplicationEvent::Message {
                    transactional: false,
                    lsn,
                    prefix,
                    content,
                } if transaction.is_none() => {
                    let mark = match self.heartbeat.parse_own(&prefix, &content) {
                        Some(sent_at) => Mark::Heartbeat { sent_at },
                        None => Mark::Idle,
                    };
                    self.ack_point(lsn, mark).await
                }
                ReplicationEvent::XLogData { data, .. } => {
                    match self.on_data(&data, transaction.as_mut()).await? {
                        Some(()) => Ok(()),
                        None => Err(TrackerGone),
                    }
                }
                _ => Ok(()),
            };
            if step.is_err() {
                return Ok(());
            }
        }
    }

    /// Decodes one pgoutput message and publishes it if it is an outbox row. `None` when the
    /// tracker is gone.
    async fn on_data(
        &mut self,
        data: &bytes::Bytes,
        transaction: Option<&mut Transaction>,
    ) -> Result<Option<()>, RelayError> {
        match pgoutput::decode(data)? {
            LogicalMessage::Relation(relation) => self.relations.update(&relation)?,
            LogicalMessage::Insert(insert) => {
                let Some(transaction) = transaction else {
                    return Err(RelayError::Protocol(
                        "an Insert arrived outside a transaction".into(),
                    ));
                };
                let Known::Outbox(layout) = self.relations.get(insert.relation_oid)? else {
                    return Ok(Some(()));
                };
                let position = Position {
                    commit_lsn: transaction.commit_lsn,
                    index: transaction.next_index,
                };
                transaction.next_index += 1;
                let (message, dead_letter) = self.mapper.map_or_dead_letter(
                    layout,
                    &insert.tuple,
                    Some(position),
                    self.broker.dead_letter_exchange(),
                )?;
                let Ok(permit) = Arc::clone(&self.window).acquire_owned().await else {
                    return Ok(None);
                };
                let message_id = message.message_id.clone();
                // Frames queued in stream order; the tracker awaits the write and the confirm.
                let stage = Stage::start(&self.broker, message).await?;
                let item = Item::Publish {
                    message_id,
                    pending: InFlight {
                        stage,
                        commit_time: transaction.commit_time,
                        _window: permit,
                    },
                    dead_letter,
                };
                self.metrics.published.increment(1);
                if self.items.send(item).await.is_err() {
                    return Ok(None);
                }
            }
            // Type, Origin, Truncate and tags we do not use carry nothing to publish.
            _ => {}
        }
        Ok(Some(()))
    }

    async fn ack_point(&self, lsn: Lsn, mark: Mark) -> Result<(), TrackerGone> {
        self.items
            .send(Item::AckPoint(lsn, mark))
            .await
            .map_err(|_| TrackerGone)
    }
}

struct Tracker<'a> {
    client: ReplicationClient,
    queue: ConfirmQueue<InFlight>,
    window: Arc<Semaphore>,
    full_window: usize,
    stuck: &'a mut Option<String>,
    blocked: watch::Receiver<bool>,
    confirm_timeout: Duration,
    /// With heartbeats on, the stream is dead if nothing arrives for this long while the
    /// tracker is waiting on it (not while the publisher holds it back).
    silence_limit: Option<Duration>,
    feedback_sent: Arc<Notify>,
    names: &'a OutboxNames,
    /// For the final check that the slot took the last acknowledged position.
    database_url: &'a str,
    health: Health,
    metrics: RelayMetrics,
    /// Where a returned message is re-published under the dead-letter policy.
    broker: &'a Broker,
}

impl Tracker<'_> {
    /// Runs until the publisher has stopped and every publish it handed over is settled
    /// (`Ok`), or until the first failure (`Err`: nothing after it was acknowledged).
    async fn run(
        self,
        events: mpsc::Sender<ReplicationEvent>,
        mut items: mpsc::Receiver<Item>,
    ) -> Result<(), RelayError> {
        let Tracker {
            mut client,
            mut queue,
            window,
            full_window,
            stuck,
            mut blocked,
            confirm_timeout,
            silence_limit,
            feedback_sent,
            names,
            database_url,
            health,
            metrics,
            broker,
        } = self;
        // Since when the tracker has been waiting on the stream with room to forward: set when
        // it starts waiting, cleared by any event and whenever the publisher is behind.
        let mut waiting_since: Option<Instant> = None;
        let mut items_open = true;
        let mut reading = true;
        let mut blocked_open = true;
        let mut front_since = Instant::now();
        // The loop's own `return`s leave this block, not the function: whatever ended it, the
        // position acknowledged so far is flushed below while the stream is still up, which
        // keeps the replay after a broker failure small.
        let outcome: Result<(), RelayError> = async {
            loop {
                if let Some(lsn) = queue.advance() {
                    client.update_applied_lsn(lsn);
                    health.record_acknowledged(
                        lsn.as_u64(),
                        queue.acknowledged_commit_time().map(pg_timestamp),
                    );
                    if let Some(sent_at) = queue.acknowledged_heartbeat() {
                        health.record_heartbeat_acknowledged(
                            std::time::UNIX_EPOCH + Duration::from_micros(sent_at),
                        );
                    }
                    metrics.in_flight.set(queue.in_flight() as f64);
                }
                if !items_open && queue.is_empty() {
                    break;
                }
                if !reading || events.capacity() == 0 {
                    waiting_since = None;
                } else if waiting_since.is_none() {
                    waiting_since = Some(Instant::now());
                }
                let silence_deadline = match (waiting_since, silence_limit) {
                    (Some(since), Some(limit)) => Some(since + limit),
                    _ => None,
                };
                let has_front = queue.front_mut().is_some();
                let timing = has_front && !*blocked.borrow();
                let deadline = front_since + confirm_timeout;
                tokio::select! {
                    biased;

                    confirmation = async {
                        match queue.front_mut() {
                            Some(front) => front.stage.confirmation().await,
                            None => std::future::pending().await,
                        }
                    }, if has_front => {
                        front_since = Instant::now();
                        let settled = settle_front(&mut queue, confirmation, broker)
                            .await
                            .inspect_err(|e| match e {
                                RelayError::Nacked { .. } => metrics.nacked.increment(1),
                                RelayError::Returned { .. }
                                | RelayError::DeadLetterReturned { .. } => {
                                    metrics.returned.increment(1)
                                }
                                _ => {}
                            })?;
                        if let Settle::DeadLettering = settled {
                            metrics.returned.increment(1);
                        }
                        if let Settle::Settled(settled) = settled {
                            let message_id = settled.message_id;
                            if settled.dead_lettered.is_none() {
                                metrics.confirmed.increment(1);
                            }
                            metrics.observe_commit_to_confirm(pg_timestamp(settled.pending.commit_time));
                            if stuck.as_deref() == Some(message_id.as_str()) {
                                tracing::info!(%message_id, "stuck message delivered; full window again");
                                window.add_permits(full_window.saturating_sub(1));
                                *stuck = None;
                                health.set_stuck(None);
                            }
                        }
                    }

                    item = items.recv(), if items_open => match item {
                        Some(Item::Publish { message_id, pending, dead_letter }) => {
                            if !has_front {
                                front_since = Instant::now();
                            }
                            match dead_letter {
                                None => queue.push_publish(message_id, pending),
                                Some(reason) => queue.push_dead_letter(message_id, reason, pending),
                            }
                        }
                        Some(Item::AckPoint(lsn, mark)) => queue.push_ack_point(lsn, mark),
                        None => items_open = false,
                    },

                    _ = tokio::time::sleep_until(deadline), if timing => {
                        return Err(RelayError::ConfirmTimeout {
                            message_id: queue.front_message_id().unwrap_or_default().to_string(),
                            seconds: confirm_timeout.as_secs(),
                        });
                    }

                    changed = blocked.changed(), if blocked_open => {
                        // The timeout restarts when the broker unblocks: waiting while blocked is
                        // the broker's choice, not a lost confirm.
                        blocked_open = changed.is_ok();
                        front_since = Instant::now();
                        health.set_broker_blocked(*blocked.borrow());
                    }

                    _ = sleep_until_some(silence_deadline), if silence_deadline.is_some() => {
                        return Err(RelayError::StreamSilent {
                            seconds: silence_limit.unwrap_or_default().as_secs(),
                        });
                    }

                    forwarded = async {
                        let permit = events.reserve().await.ok()?;
                        Some((permit, client.recv().await))
                    }, if reading => match forwarded {
                        None => reading = false,
                        Some((permit, Ok(Some(event)))) => {
                            waiting_since = None;
                            permit.send(event);
                        }
                        Some((_, Ok(None))) => return Err(RelayError::StreamEnded),
                        Some((_, Err(e))) => return Err(stream_error(e, names)),
                    },
                }
            }
            Ok(())
        }
        .await;
        let target = queue.acknowledged();
        let stream_alive = !matches!(
            outcome,
            Err(RelayError::Replication(_)
                | RelayError::StreamEnded
                | RelayError::StreamSilent { .. }
                | RelayError::SlotInUse { .. }
                | RelayError::SlotLost { .. }
                | RelayError::SlotMissing { .. }
                | RelayError::PublicationMissing { .. })
        );
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
        }
        if stream_alive {
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

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Aborts a session-scoped task when the session ends, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
