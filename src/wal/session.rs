//! One replication session: from START_REPLICATION to the first failure or a graceful stop.
//!
//! Wires the two sides for one session and owns nothing itself:
//!
//! ```text
//!   PostgreSQL side (wal/stream.rs)            delivery side (publish/delivery.rs)
//!   ReplicationClient ─ recv ─ Source ─ inputs (bounded) ─▶ basic_publish, window,
//!                                                           confirms in order, dead letters
//!   update_applied_lsn ◀──────────── acked position (watch) ◀┘
//! ```
//!
//! plus the session-scoped helpers: heartbeats, the cleanup job (only the relay that holds
//! the slot deletes) and the broker-blocked readiness report. Every task started here ends
//! with the session, however it ends.

use std::sync::Arc;

use pgwire_replication::{FeedbackObserver, Lsn, PgWireError, ReplicationClient};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::catalog::preflight;
use crate::catalog::slot;
use crate::config::OnSlotLost;
use crate::db;
use crate::error::{CatalogError, SlotError};
use crate::error::{Endpoint, RelayError};
use crate::observability::{Health, StreamMetrics, HOST_LABEL, POSTGRES_INFO, SESSIONS_TOTAL};
use crate::publish::stream::{Ancestor, StreamDestination};
use crate::publish::{deliver, Acked, Broker, DeliveryOptions, Destination, Input, Publisher};
use crate::wal::context::{SeenServer, SessionContext};
use crate::wal::heartbeat::{self};
use crate::wal::position::AckPosition;
use crate::wal::relations::RelationCache;
use crate::wal::source::Source;
use crate::wal::stream::{
    DeliveryTask, ReaderParts, Stop, StreamLoss, StreamReader, FINAL_FEEDBACK_TIMEOUT,
};
use crate::wal::{recovery, state, timeline};

/// Events the replication client may buffer. Small: events there are in flight but invisible
/// to the delivery side, and a large buffer hides rows (docs/architecture.md, "Tasks and
/// channels").
pub const CLIENT_EVENT_BUFFER: usize = 256;
/// Inputs (rows and ack points) handed from the stream reader to the delivery task.
const INPUT_CHANNEL: usize = 256;

/// Runs one session. A message that failed in an earlier session (the health's stuck
/// message) is published with a window of 1 until the broker confirms it, so a stuck message
/// does not drag a full window of re-publishes along on every retry.
pub(crate) async fn run(
    ctx: &SessionContext,
    shutdown: CancellationToken,
) -> Result<(), RelayError> {
    // Chosen afresh every session: after a failover the primary is another host.
    let server = db::primary(&ctx.config.database_url).await?;
    let (slot, outbox) = match preflight(ctx, &server).await {
        Err(e) if recreates(ctx, &e) => {
            recovery::recreate(&recovery_of(ctx), &server).await?;
            preflight(ctx, &server).await?
        }
        checked => checked?,
    };
    let broker = Arc::new(connect_destination(ctx).await?);
    let stuck = ctx.state.health.stuck();
    let streaming = match start_streaming(ctx, &server, slot.confirmed_flush).await {
        // Lost between the check and START_REPLICATION: the next session recovers it.
        Err(e) if recreates(ctx, &e) => return Err(slot_vanished(ctx)),
        started => started?,
    };
    let Streaming {
        client,
        feedback_sent,
        ancestors,
    } = streaming;
    if let Destination::Stream(stream) = &*broker {
        let ancestors = ancestors
            .into_iter()
            .map(|(timeline, ended_at)| Ancestor { timeline, ended_at })
            .collect();
        stream.name_producers(&ctx.config.names.slot, streamed_timeline(ctx)?, ancestors);
    }
    let leaving = CancellationToken::new();
    let (unpublished, mut outbox_unpublished) = oneshot::channel();
    let _watch = watch_server(ctx, &server, leaving.clone(), (outbox, unpublished)).await?;
    tracing::info!(
        slot = %ctx.config.names.slot,
        from = %slot.confirmed_flush,
        window = if stuck.is_some() { 1 } else { ctx.config.tuning.max_in_flight },
        "streaming"
    );
    ctx.state.health.set_ready();
    metrics::counter!(SESSIONS_TOTAL).increment(1);
    let _helpers = Helpers::start(ctx, &broker);

    let (inputs, inputs_rx) = mpsc::channel(INPUT_CHANNEL);
    let (acked_tx, acked) = watch::channel(Acked::default());
    let delivery = start_delivery(ctx, &broker, stuck, inputs_rx, acked_tx);
    let reader = StreamReader::new(ReaderParts {
        client,
        source: source_of(ctx, outbox),
        start: slot.confirmed_flush,
        silence_limit: ctx.config.tuning.heartbeat_interval().map(|i| i * 3),
        feedback_sent,
        health: ctx.state.health.clone(),
        inputs,
        acked,
        delivery,
        handed_over: ctx.state.handed_over.clone(),
    });
    // A child: the real shutdown stops the reading too, and so does the server going away.
    let stopping = shutdown.child_token();
    let left = || RelayError::ServerShuttingDown {
        server: server.to_string(),
    };
    let stop = tokio::select! {
        stop = reader.run(stopping.clone()) => stop,
        // A clean shutdown lets the reader finish the transaction and send its position
        // within milliseconds; after a crash nothing will take it, so it is not waited for.
        () = async {
            leaving.cancelled().await;
            stopping.cancel();
            tokio::time::sleep(LEAVING_GRACE).await;
        } => {
            broker.close().await;
            return Err(left());
        }
        // Rows of the outbox table are not decoded any more: nothing to finish.
        Ok(e) = &mut outbox_unpublished => {
            broker.close().await;
            return Err(e);
        }
        // Whatever the session was waiting for, nothing more will come from that connection.
        e = broker.lost() => {
            broker.close().await;
            return Err(e);
        }
    };
    broker.close().await;
    match stop {
        Stop::Graceful { stream, .. } if !shutdown.is_cancelled() => {
            // The server shuts down: no final position to wait for on it.
            stream.close().await;
            Err(left())
        }
        // Lost while streaming (invalidated under a lagging relay): the next session's
        // preflight finds it so and recovers it.
        stop => conclude(ctx, stop)
            .await
            .map_err(|e| match recreates(ctx, &e) {
                true => slot_vanished(ctx),
                false => e,
            }),
    }
}

/// The session's delivery task: publishes what the reader hands on, over `broker`, with a
/// window of 1 while `stuck` (an earlier session's failed message) is unconfirmed.
fn start_delivery(
    ctx: &SessionContext,
    broker: &Arc<Destination>,
    stuck: Option<String>,
    inputs: mpsc::Receiver<Input<AckPosition>>,
    acked: watch::Sender<Acked<AckPosition>>,
) -> DeliveryTask {
    let broker = Arc::clone(broker);
    let options = DeliveryOptions {
        window: ctx.config.tuning.max_in_flight as usize,
        confirm_timeout: ctx.config.tuning.delivery.publishing.confirm_timeout(),
        stuck,
        health: Some(ctx.state.health.clone()),
    };
    let metrics = ctx.state.metrics.clone();
    AbortOnDropHandle::new(tokio::spawn(async move {
        deliver(&*broker, &options, &metrics, inputs, &acked).await
    }))
}

/// What turns this relay's share of the stream into delivery inputs; `outbox` is the table
/// the configured name named at the session's start.
fn source_of(ctx: &SessionContext, outbox: preflight::OutboxTable) -> Source {
    let (schema, table) = ctx.config.names.table_parts();
    Source::new(
        ctx.config.mapper.clone(),
        RelationCache::new(schema, table, Arc::clone(&ctx.config.columns), outbox),
        ctx.config.heartbeat.clone(),
        ctx.config.emit_prefix.clone(),
        ctx.config.shard,
        StreamMetrics::new(),
    )
    .noting_emitted(ctx.state.emitted_seen.clone())
}

fn slot_vanished(ctx: &SessionContext) -> RelayError {
    RelayError::Slot(SlotError::Vanished {
        slot: ctx.config.names.slot.to_string(),
    })
}

/// How long a session whose server shuts down waits for its reader to stop between
/// transactions before it abandons the stream.
const LEAVING_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// How often the session looks at the outbox table in the catalog ([`watch_server`]).
const TABLE_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Watches `server` on an ordinary connection of its own and cancels `leaving` when the
/// server ends that connection because it shuts down (SQLSTATE 57P01, 57P02 or 57P03). On a
/// clean shutdown (a switchover stops the primary with `-m fast`) PostgreSQL ends every
/// ordinary connection first, the standby's slot synchronization included, and then keeps
/// the walsender streaming until the relay has confirmed everything: all the relay
/// delivered in that time, the promoted standby's copy of the slot does not know about, and
/// delivers again. Stopping at the first sign of the shutdown (between transactions, as for
/// SIGTERM, or within [`LEAVING_GRACE`]) keeps that replay to what a crash costs. Any other
/// end of the connection is left to the session's own connections to notice.
///
/// On the same connection, every [`TABLE_CHECK_INTERVAL`], it looks at the outbox table
/// (`outbox`: the one the session started with) and sends `unpublished` the error if the
/// publication no longer includes the table of that name: a table dropped and created again,
/// or taken out of the publication, leaves no trace in the stream, and its rows are decoded
/// by no slot.
async fn watch_server(
    ctx: &SessionContext,
    server: &outbox_common::pg::Server,
    leaving: CancellationToken,
    (outbox, unpublished): (preflight::OutboxTable, oneshot::Sender<RelayError>),
) -> Result<AbortOnDropHandle<()>, RelayError> {
    let (client, mut received) =
        db::connect_to_for_notifications(&ctx.config.database_url, server).await?;
    let server = server.to_string();
    let names = ctx.config.names.clone();
    Ok(AbortOnDropHandle::new(tokio::spawn(async move {
        let mut unpublished = Some(unpublished);
        let mut gone_warned = false;
        let mut check = tokio::time::interval_at(
            tokio::time::Instant::now() + TABLE_CHECK_INTERVAL,
            TABLE_CHECK_INTERVAL,
        );
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let message = tokio::select! {
                message = received.recv() => message,
                _ = check.tick(), if unpublished.is_some() => {
                    // A failed or slow check is left to the next one: the connection's end
                    // is what the other branch watches.
                    let now = tokio::time::timeout(
                        TABLE_CHECK_INTERVAL,
                        preflight::outbox_now(&client, &names, outbox),
                    )
                    .await;
                    match now {
                        Ok(Ok(preflight::OutboxNow::Unpublished { recreated })) => {
                            let (schema, table) = names.table_parts();
                            let error = RelayError::Catalog(CatalogError::OutboxUnpublished {
                                publication: names.publication.to_string(),
                                table: format!("{schema}.{table}"),
                                recreated,
                            });
                            if let Some(sender) = unpublished.take() {
                                let _ = sender.send(error);
                            }
                        }
                        Ok(Ok(preflight::OutboxNow::Gone)) if !gone_warned => {
                            // Renamed: the stream stops the relay at the first row written
                            // under the new name. Dropped: nothing can be written to it.
                            tracing::warn!(
                                table = %names.table,
                                "the outbox table does not exist any more (renamed or \
                                 dropped): writes to it under its name fail"
                            );
                            gone_warned = true;
                        }
                        _ => {}
                    }
                    continue;
                }
            };
            let Some(message) = message else { return };
            let Err(e) = message else { continue };
            let shutting_down = [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
            ];
            if e.code().is_some_and(|code| shutting_down.contains(code)) {
                tracing::warn!(%server, "PostgreSQL is shutting down: stopping the session between transactions");
                leaving.cancel();
            }
            return;
        }
    })))
}

/// What a recovery of the slot needs of the session's context.
fn recovery_of(ctx: &SessionContext) -> recovery::Recovery<'_> {
    recovery::Recovery {
        config: &ctx.config,
        brokers: &ctx.state.brokers,
    }
}

/// Whether `--on-slot-lost recreate` replaces the slot after `error`.
fn recreates(ctx: &SessionContext, error: &RelayError) -> bool {
    ctx.config.on_slot_lost == OnSlotLost::Recreate
        && matches!(
            error,
            RelayError::Slot(SlotError::Missing { .. })
                | RelayError::Slot(SlotError::Lost { .. })
                | RelayError::Slot(SlotError::RecoveryInterrupted { .. })
        )
}

/// The checks before streaming, on `server`; the slot's state, and which table the outbox
/// is.
async fn preflight(
    ctx: &SessionContext,
    server: &outbox_common::pg::Server,
) -> Result<(preflight::SlotState, preflight::OutboxTable), RelayError> {
    let database = db::connect_to(&ctx.config.database_url, server).await?;
    let slot = preflight::check_all(
        &database,
        &ctx.config.names,
        ctx.config.shard,
        &ctx.config.columns,
        ctx.config.failover,
    )
    .await?;
    if state::interrupted(&database, &ctx.config.names).await? {
        return Err(RelayError::Slot(SlotError::RecoveryInterrupted {
            slot: ctx.config.names.slot.to_string(),
        }));
    }
    preflight::check_emit_prefix(&database, &ctx.config.names, &ctx.config.emit_prefix).await?;
    let outbox = preflight::outbox_table(&database, &ctx.config.names.table).await?;
    Ok((slot, outbox))
}

/// The destination's connection: the stream's, checked to exist; or the broker's, with the
/// exchange checked and the dead-letter policy's channel.
async fn connect_destination(ctx: &SessionContext) -> Result<Destination, RelayError> {
    if let Some(stream) = &ctx.config.stream {
        return Ok(Destination::Stream(
            StreamDestination::connect(stream.clone()).await?,
        ));
    }
    let mut broker = Broker::connect(&ctx.state.brokers).await?;
    broker
        .prepare(
            &ctx.config.names.exchange,
            ctx.config.dead_letter_exchange.as_deref(),
        )
        .await?;
    Ok(Destination::Exchange(broker))
}

/// The timeline of the server this session streams from (IDENTIFY_SYSTEM's): part of the
/// stream producers' names.
fn streamed_timeline(ctx: &SessionContext) -> Result<u32, RelayError> {
    ctx.state
        .last_server
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .map(|server| server.timeline)
        .ok_or_else(|| RelayError::Bug("streaming from a server never identified".into()))
}

/// A replication connection that streams.
struct Streaming {
    client: ReplicationClient,
    /// Notified when the client sent feedback.
    feedback_sent: Arc<Notify>,
    /// The timelines the server's descends from, with where each ended (its history file's;
    /// read on a newer timeline for a failover's report or a stream's producers, else empty).
    ancestors: Vec<(u32, Lsn)>,
}

/// START_REPLICATION on `server` from `from` (the slot's own confirmed position there, never
/// one remembered from another server).
async fn start_streaming(
    ctx: &SessionContext,
    server: &outbox_common::pg::Server,
    from: Lsn,
) -> Result<Streaming, RelayError> {
    let feedback_sent = Arc::new(Notify::new());
    let observer = {
        let feedback_sent = Arc::clone(&feedback_sent);
        FeedbackObserver::new(move |_| feedback_sent.notify_one())
    };
    let config = db::replication_config(
        &ctx.config.database_url,
        server,
        &ctx.config.names.slot,
        &ctx.config.names.publication,
    )?
    .with_start_lsn(from)
    .with_status_interval(ctx.config.tuning.status_interval())
    .with_buffer_size(CLIENT_EVENT_BUFFER)
    .with_feedback_observer(observer);
    let ca_given = config.tls.ca_pem_path.is_some();
    let start_error = |e: PgWireError| async move {
        match e {
            PgWireError::Tls(_) => RelayError::pg_tls(e, ca_given),
            e => slot::replication_error(e, &ctx.config.names, &ctx.config.database_url).await,
        }
    };
    let (mut client, system) = match db::connect_replication(config).await? {
        Ok(connected) => connected,
        Err(e) => return Err(start_error(e).await),
    };
    let before = note_server(ctx, server, system.system_id.clone(), system.timeline);
    let handed_over = before.as_ref().and_then(|_| ctx.state.handed_over.take());
    let failover = before
        .filter(|before| before.system_id == system.system_id)
        .filter(|before| system.timeline > before.timeline);
    // A stream's producers are named by timeline: what the ancestors' names hold is read
    // from the same history.
    let history = match (failover.is_some() || ctx.config.stream.is_some()) && system.timeline > 1 {
        true => timeline::read_history(&mut client, system.timeline).await,
        false => None,
    };
    if let Some(before) = failover {
        let (old, new) = (before.timeline, system.timeline);
        timeline::report_failover(history.as_deref(), old, new, handed_over);
    }
    let ancestors = history
        .as_deref()
        .map(timeline::ancestors)
        .unwrap_or_default();
    // START_REPLICATION runs in the crate's worker too: bounded like the connect.
    if let Err(e) = client.start().await {
        return Err(start_error(e).await);
    }
    match tokio::time::timeout(outbox_common::pg::CONNECT_TIMEOUT, client.wait_started()).await {
        Ok(Ok(())) => Ok(Streaming {
            client,
            feedback_sent,
            ancestors,
        }),
        Ok(Err(e)) => Err(start_error(e).await),
        Err(_) => {
            client.abort();
            Err(RelayError::ConnectTimeout {
                endpoint: Endpoint::Replication,
                seconds: outbox_common::pg::CONNECT_TIMEOUT.as_secs(),
            })
        }
    }
}

/// Records the server this session streams from: the `postgres_info` metric, and a warning
/// when it is another server than the last session's (a failover: another host, or the same
/// address now another system or timeline). Nothing is carried over from the old one: the
/// session starts from the slot's position on this server. Returns the last session's
/// server when it was another.
fn note_server(
    ctx: &SessionContext,
    server: &outbox_common::pg::Server,
    system_id: String,
    timeline: u32,
) -> Option<SeenServer> {
    let seen = SeenServer {
        address: server.to_string(),
        system_id,
        timeline,
    };
    let mut last = ctx
        .state
        .last_server
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let before = last.as_ref().filter(|before| **before != seen).cloned();
    if let Some(before) = &before {
        if before.address != seen.address {
            metrics::gauge!(POSTGRES_INFO, HOST_LABEL => before.address.clone()).set(0.0);
        }
        tracing::warn!(
            from = %before.address,
            to = %seen.address,
            system_identifier = %seen.system_id,
            timeline = seen.timeline,
            previous_system_identifier = %before.system_id,
            previous_timeline = before.timeline,
            "PostgreSQL is another server than before (a failover or switchover): \
             resuming from the slot's own position there"
        );
    }
    metrics::gauge!(POSTGRES_INFO, HOST_LABEL => seen.address.clone()).set(1.0);
    *last = Some(seen);
    before
}

/// What the session's end means: a graceful stop once the slot took the final position, or
/// the error, a broken stream's explained by the catalog.
async fn conclude(ctx: &SessionContext, stop: Stop) -> Result<(), RelayError> {
    match stop {
        Stop::Graceful {
            acknowledged,
            stream,
        } => {
            let reached = slot::wait_until_confirmed(
                &ctx.config.database_url,
                &ctx.config.names.slot,
                acknowledged,
                FINAL_FEEDBACK_TIMEOUT,
            )
            .await;
            if !reached {
                tracing::warn!(target = %acknowledged, "the slot did not confirm the final position; a restart may replay a little");
            }
            stream.close().await;
            tracing::info!(acknowledged = %acknowledged, "session stopped");
            Ok(())
        }
        Stop::Failed(e) => Err(e),
        Stop::StreamLost(StreamLoss::Error(e)) => {
            Err(slot::replication_error(e, &ctx.config.names, &ctx.config.database_url).await)
        }
        Stop::StreamLost(StreamLoss::Ended) => Err(RelayError::StreamEnded),
        Stop::StreamLost(StreamLoss::Silent { seconds }) => {
            Err(RelayError::StreamSilent { seconds })
        }
    }
}

/// The session's helper tasks: the cleanup job (only the relay that holds the slot deletes),
/// the state recorder, the broker-blocked report and the heartbeats. Dropping it stops them
/// all.
struct Helpers {
    _cleanup: AbortOnDropHandle<()>,
    _state: AbortOnDropHandle<()>,
    _blocked: AbortOnDropHandle<()>,
    _heartbeats: Option<AbortOnDropHandle<()>>,
}

impl Helpers {
    fn start(ctx: &SessionContext, broker: &Destination) -> Self {
        Self {
            _cleanup: AbortOnDropHandle::new(tokio::spawn(crate::wal::cleanup::run_cleanup(
                ctx.config.database_url.clone(),
                (ctx.config.names.clone(), Arc::clone(&ctx.config.columns)),
                (ctx.config.shard, ctx.config.backfill_margin()),
                ctx.config.cleanup.clone(),
                (ctx.state.health.clone(), ctx.state.emitted_seen.clone()),
                CancellationToken::new(),
            ))),
            _state: AbortOnDropHandle::new(tokio::spawn(state::run_recorder(
                ctx.config.database_url.clone(),
                ctx.config.names.clone(),
                (ctx.state.health.clone(), ctx.state.emitted_seen.clone()),
                CancellationToken::new(),
            ))),
            _blocked: AbortOnDropHandle::new(tokio::spawn(report_blocked(
                ctx.state.health.clone(),
                broker.blocked(),
            ))),
            _heartbeats: ctx.config.tuning.heartbeat_interval().map(|interval| {
                AbortOnDropHandle::new(tokio::spawn(heartbeat::emit(
                    ctx.config.database_url.clone(),
                    ctx.config.heartbeat.clone(),
                    interval,
                )))
            }),
        }
    }
}

/// Reports whether the broker blocks publishing, for as long as the session runs.
async fn report_blocked(health: Health, mut blocked: watch::Receiver<bool>) {
    loop {
        health.set_broker_blocked(*blocked.borrow_and_update());
        if blocked.changed().await.is_err() {
            return;
        }
    }
}
