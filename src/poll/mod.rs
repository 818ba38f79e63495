//! Polling mode: the Polling Publisher pattern, for databases that cannot (or should not) run
//! a logical replication slot.
//!
//! ```text
//!  worker 1..N (each its own PG + AMQP connection)          listener (--listen)
//!   loop: BEGIN; claim n rows FOR UPDATE SKIP LOCKED;        LISTEN outbox; each NOTIFY
//!         publish; await all confirms;                       wakes one idle worker
//!         UPDATE published_at; COMMIT
//!   rows found → again at once; none: wait for                cleanup (every --cleanup-interval)
//!   the idle wait or a wake-up                                deletes old published rows
//!                                                             backlog poller (metrics)
//! ```
//!
//! The idle wait adapts: --poll-interval-min after the first empty poll, doubling with each
//! further one up to --poll-interval-max, back to the min as soon as a poll finds rows. An
//! idle outbox then costs one claim transaction per worker per max interval, while a busy
//! one is polled again at once and a quiet one within the min of its last rows.
//!
//! Why it is safe: a claimed row is locked by its worker's transaction until COMMIT, and
//! COMMIT comes only after the broker confirmed every message of the batch. Any failure
//! drops the transaction, so the rows are unpublished again and another poll takes them;
//! SKIP LOCKED keeps workers (and other relay processes) from claiming the same row, and a
//! row published meanwhile fails the claim's recheck of `published_at IS NULL`.
//!
//! What it does not give: a global order (workers publish batches in parallel), and exactly
//! once after a crash (a batch confirmed but not committed is published again: at most
//! workers × batch size rows). It writes (`published_at`), so it runs on the primary.

mod backlog;
mod cleanup;
mod listen;
mod shared;
mod worker;

use shared::{PollStats, Shared};

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::assembly::{RelayParts, RelayPartsFlags};
use crate::config::{OnPublished, PollArgs};
use crate::contract::columns::ColumnMap;
use crate::error::RelayError;
use crate::observability::{self, PollMetrics, WorkerHealth};

/// What `poll` makes of its flags before it connects to anything.
pub(crate) struct Prepared {
    pub parts: RelayParts,
    pub columns: Arc<ColumnMap>,
    /// The shortest and longest wait after an empty poll.
    pub poll_intervals: (Duration, Duration),
}

/// Checks `poll`'s flags as far as they can be without a connection, and makes the relay's
/// parts from them: the one validation of a `poll` configuration, which `check` reports.
pub(crate) fn prepare(args: &PollArgs) -> Result<Prepared, RelayError> {
    // What the map leaves unmapped must not be needed. published_at first: without it the
    // command cannot run at all under mark.
    crate::table::polling::check_on_published(&args.columns.map()?, args.on_published)?;
    let cleanup =
        !args.cleanup.cleanup_interval.is_zero() && args.on_published == OnPublished::Mark;
    let created_at_for: &[&str] = if cleanup {
        &[crate::table::polling::CLEANUP_NEEDS]
    } else {
        &[]
    };
    let poll_intervals = args.poll_intervals()?;
    let columns = crate::assembly::column_map(&args.columns, &args.names.table, created_at_for)?;
    let parts = RelayParts::new(RelayPartsFlags {
        connections: &args.connections,
        table: &args.names.table,
        exchange: &args.names.exchange,
        publishing: &args.delivery.publishing,
        exchanges: &args.exchanges,
        format: &args.format,
        dead_letter: Some(&args.dead_letter),
    })?;
    Ok(Prepared {
        parts,
        columns,
        poll_intervals,
    })
}

/// Runs the polling relay until `shutdown` is cancelled (`Ok`) or a definite error (`Err`).
pub(crate) async fn run(args: PollArgs, shutdown: CancellationToken) -> Result<(), RelayError> {
    let Prepared {
        parts:
            RelayParts {
                database_url,
                brokers,
                mapper,
                dead_letter_exchange,
                ..
            },
        columns,
        poll_intervals: (poll_interval_min, poll_interval_max),
    } = prepare(&args)?;
    // The endpoints and the backlog poller outlive the workers' graceful stop.
    let observing = CancellationToken::new();
    let _stop_observing = observing.clone().drop_guard();
    let health = observability::start_endpoints(args.endpoints.metrics_addr.0, "poll", &observing);
    tracing::info!(
        table = %args.names.table,
        workers = args.workers,
        batch_size = args.batch_size,
        on_published = ?args.on_published,
        poll_interval_min_ms = poll_interval_min.as_millis() as u64,
        poll_interval_max_ms = poll_interval_max.as_millis() as u64,
        listen = args.listen,
        "polling"
    );
    if !columns.is_default() {
        tracing::info!(columns = %columns.describe(), "outbox columns mapped");
    }
    let shared = Arc::new(Shared {
        database_url,
        brokers,
        names: args.names.clone(),
        columns,
        mapper,
        dead_letter_exchange,
        workers: args.workers,
        batch_size: args.batch_size,
        on_published: args.on_published,
        poll_interval_min,
        poll_interval_max,
        delivery: args.delivery.clone(),
        wake: Notify::new(),
        index_checked: AtomicBool::new(false),
        stats: PollStats::new(PollMetrics::new()),
        health: WorkerHealth::new(health, args.workers as usize),
    });
    if !args.backlog_poll_interval.is_zero() {
        tokio::spawn(backlog::run(
            shared.database_url.clone(),
            crate::table::polling::BacklogQuery::new(&shared.names.table, &shared.columns),
            args.backlog_poll_interval,
            observing.clone(),
        ));
    }

    // Cancelled by the caller's shutdown, or by a worker's definite error: either way every
    // worker finishes the batch in hand and stops.
    let stop = shutdown.child_token();
    let mut workers = JoinSet::new();
    for worker in 0..shared.workers as usize {
        workers.spawn(worker::run(Arc::clone(&shared), worker, stop.clone()));
    }
    let mut background = spawn_helpers(&args, &shared, &stop);
    let outcome = join_workers(&mut workers, &stop, shared.delivery.shutdown_timeout()).await;
    background.abort_all();
    shared.stats.log_summary();
    outcome
}

/// The listener (with --listen) and the cleanup (when published rows stay behind), stopping
/// with the workers.
fn spawn_helpers(args: &PollArgs, shared: &Arc<Shared>, stop: &CancellationToken) -> JoinSet<()> {
    let mut helpers = JoinSet::new();
    if args.listen {
        helpers.spawn(listen::run(
            Arc::clone(shared),
            args.listen_channel.clone(),
            stop.clone(),
        ));
    }
    // Under --on-published delete nothing published stays behind for the cleanup.
    if !args.cleanup.cleanup_interval.is_zero() && args.on_published == OnPublished::Mark {
        helpers.spawn(cleanup::run(
            Arc::clone(shared),
            args.cleanup.cleanup_interval,
            args.cleanup.retention,
            args.cleanup.cleanup_batch,
            stop.clone(),
        ));
    }
    helpers
}

/// Waits for every worker: the first definite error stops the others (and is the outcome);
/// once stopping, they get `stop_timeout` to finish their batches before they are aborted.
async fn join_workers(
    workers: &mut JoinSet<Result<(), RelayError>>,
    stop: &CancellationToken,
    stop_timeout: std::time::Duration,
) -> Result<(), RelayError> {
    let mut outcome = Ok(());
    let mut deadline: Option<Instant> = None;
    loop {
        tokio::select! {
            joined = workers.join_next() => {
                let error = match joined {
                    None => return outcome,
                    Some(Ok(Ok(()))) => continue,
                    Some(Ok(Err(error))) => error,
                    Some(Err(panicked)) => RelayError::Bug(format!("a polling worker panicked: {panicked}")),
                };
                if outcome.is_ok() {
                    // The error itself is reported once, by main, when the workers are done.
                    tracing::info!("a worker stopped on an error: stopping all workers");
                    outcome = Err(error);
                }
                stop.cancel();
            }
            () = stop.cancelled(), if deadline.is_none() => {
                deadline = Some(Instant::now() + stop_timeout);
            }
            () = sleep_until(deadline), if deadline.is_some() => {
                tracing::warn!(
                    "shutdown timed out; unfinished batches roll back and are published again \
                     by the next poll"
                );
                workers.abort_all();
                return outcome;
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
