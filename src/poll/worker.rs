//! One polling worker: its own database and broker connections, one batch per transaction.
//!
//! ```text
//!  BEGIN
//!  UPDATE … SET published_at = now() WHERE id IN (SELECT … WHERE published_at IS NULL
//!    ORDER BY created_at LIMIT n FOR UPDATE SKIP LOCKED) RETURNING …, in claim order
//!  map every row (a row that cannot be mapped stops the relay, naming it: nothing published)
//!  basic_publish each, pipelined ─┐
//!  await every confirm, in order ◄┘  a nack, a return, a timeout or a lost connection:
//!                                    drop both connections = ROLLBACK, rows stay unpublished
//!                                    (dead-letter policy: a returned, too large or unmappable
//!                                    row goes to the dead-letter exchange instead, and counts
//!                                    as published once that is confirmed)
//!  COMMIT
//! ```
//!
//! The invariant: a row is marked published only in a transaction that commits after the
//! broker confirmed its message (the mark is made when the batch is claimed, and rolls back
//! with the transaction if anything fails before COMMIT). A crash between the last confirm and COMMIT publishes the
//! batch again: at most workers × batch size duplicates. Crash-only, like WAL mode: any
//! failure ends the session; the supervisor (`crate::supervisor`) starts the next one after
//! a backoff, and it claims afresh.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::{Client, Statement};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use crate::advice::{self, Warning};
use crate::db;
use crate::error::RelayError;
use crate::failpoint::{failpoint, POLL_BEFORE_COMMIT};
use crate::observability::{NotReady, WorkerState};
use crate::publish::{deliver_batch, Broker};
use crate::supervisor::{supervise, Supervised, Supervision};
use outbox_common::backoff::Backoff;

use super::shared::Shared;
use crate::table::polling::OutboxTable;

/// How long closing the broker connection may take when a session ends (it may be dead).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for one answer from PostgreSQL. A connection that silently stopped answering
/// never fails TCP on its own; without a bound the worker would wait forever. Generous, so
/// that a slow claim on a table without the claim index still completes.
pub(crate) const DB_TIMEOUT: Duration = Duration::from_secs(60);

/// What outlives one session of a worker.
#[derive(Default)]
struct State {
    /// The last session failed: claim one row at a time until a batch commits, so that a
    /// message the broker keeps refusing does not drag a full batch of re-publishes along on
    /// every retry.
    probing: bool,
    /// A batch committed in the last session: the next failure starts the backoff afresh.
    progressed: bool,
}

/// Runs one worker until `shutdown` (`Ok`, after finishing the batch in hand) or a definite
/// error (`Err`).
pub(crate) async fn run(
    shared: Arc<Shared>,
    worker: usize,
    shutdown: CancellationToken,
) -> Result<(), RelayError> {
    let supervision = Supervision {
        max_backoff: shared.delivery.max_backoff(),
        // poll::run bounds the whole stop, for every worker at once.
        stop_timeout: None,
    };
    let mut sessions = Worker {
        shared,
        worker,
        state: State::default(),
    };
    supervise(&mut sessions, &supervision, &shutdown)
        .instrument(tracing::info_span!("worker", worker))
        .await
}

/// One polling worker as the supervisor sees it: one session after another.
struct Worker {
    shared: Arc<Shared>,
    worker: usize,
    state: State,
}

impl Supervised for Worker {
    async fn run(&mut self, shutdown: &CancellationToken) -> Result<(), RelayError> {
        self.state.progressed = false;
        session(&self.shared, self.worker, &mut self.state, shutdown).await
    }

    fn failed(&mut self, error: &RelayError) {
        self.shared.stats.failures.fetch_add(1, Ordering::Relaxed);
        self.shared
            .health
            .set(self.worker, WorkerState::Down(NotReady::after(error)));
        self.state.probing = true;
    }

    fn progressed(&self, _ran: Duration) -> bool {
        self.state.progressed
    }

    fn retrying(&self) -> &'static str {
        "batch failed and rolled back (its rows stay unpublished); retrying"
    }
}

/// The connections and statements of one session.
struct Session<'a> {
    shared: &'a Shared,
    client: Client,
    broker: Broker,
    table: OutboxTable,
    claim_batch: Statement,
    claim_one: Statement,
}

async fn session(
    shared: &Shared,
    worker: usize,
    state: &mut State,
    shutdown: &CancellationToken,
) -> Result<(), RelayError> {
    let client = bounded(db::connect(&shared.database_url)).await?;
    bounded(client.batch_execute(db::PINNED_SET_STATEMENTS)).await?;
    let table = bounded(shared.outbox_table(&client)).await?;
    if !shared.index_checked.swap(true, Ordering::Relaxed)
        && !bounded(table.has_claim_index(&client)).await?
    {
        tracing::warn!(
            table = %shared.names.table,
            "{}",
            advice::warning(crate::table::polling::NO_CLAIM_INDEX, Warning::NoClaimIndex)
        );
    }
    let claim_batch = bounded(client.prepare(&table.claim_sql(shared.batch_size))).await?;
    let claim_one = bounded(client.prepare(&table.claim_sql(1))).await?;
    let broker = Broker::connect(&shared.brokers).await?;
    let mut session = Session {
        shared,
        client,
        broker,
        table,
        claim_batch,
        claim_one,
    };
    let result = session.run(worker, state, shutdown).await;
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, session.broker.close()).await;
    result
}

impl Session<'_> {
    async fn run(
        &mut self,
        worker: usize,
        state: &mut State,
        shutdown: &CancellationToken,
    ) -> Result<(), RelayError> {
        self.broker
            .prepare(
                &self.shared.names.exchange,
                self.shared.dead_letter_exchange.as_deref(),
            )
            .await?;
        tracing::debug!(worker, "worker connected");
        let _reporting = AbortOnDropHandle::new(tokio::spawn(report_blocked(
            self.shared.health.clone(),
            worker,
            self.broker.blocked(),
        )));
        let mut idle = Backoff::new(self.shared.poll_interval_min, self.shared.poll_interval_max);
        loop {
            // A stop request is honoured between batches: the batch in hand commits first.
            if shutdown.is_cancelled() {
                return Ok(());
            }
            let probing = state.probing;
            let limit = if probing { 1 } else { self.shared.batch_size };
            let claimed = self.batch(worker, limit).await?;
            if claimed > 0 {
                state.progressed = true;
                state.probing = false;
                // A full batch suggests a backlog: get an idle peer going too.
                if claimed == limit as usize && !probing && self.shared.workers > 1 {
                    self.shared.wake.notify_one();
                }
                // Only an empty poll waits: rows may have arrived while this batch ran.
                idle.reset();
                continue;
            }
            let wait = idle.next_delay();
            tracing::debug!(
                worker,
                wait_ms = wait.as_millis() as u64,
                "no unpublished rows; waiting for rows"
            );
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(()),
                // An idle worker would notice a dead broker connection only at its next
                // batch: end the session now, so it reconnects and /readyz says so.
                error = self.broker.lost() => return Err(error),
                () = self.shared.wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One transaction: claim and mark up to `limit` rows, publish them, await every
    /// confirm, commit. Returns how many rows it published.
    async fn batch(&mut self, worker: usize, limit: u32) -> Result<usize, RelayError> {
        let stats = &self.shared.stats;
        let claim = if limit == 1 {
            &self.claim_one
        } else {
            &self.claim_batch
        };
        let transaction = bounded(self.client.transaction()).await?;
        let polled = Instant::now();
        let rows = bounded(transaction.query(claim, &[])).await?;
        stats.record_poll(rows.len(), polled.elapsed());
        if rows.is_empty() {
            bounded(transaction.commit()).await?;
            return Ok(0);
        }

        // Map the whole batch before publishing any of it: a row that cannot be mapped stops
        // the relay (a definite error naming the row) with nothing of its batch published,
        // unless the dead-letter policy sends it to the dead-letter exchange.
        let mut messages = Vec::with_capacity(rows.len());
        for row in &rows {
            let tuple = self.table.tuple(row)?;
            messages.push(
                self.shared
                    .mapper
                    .map_row(self.table.layout(), &tuple, None),
            );
        }
        let count = messages.len();

        let claimed = polled.elapsed();
        deliver_batch(
            &self.broker,
            messages,
            self.shared.delivery.publishing.confirm_timeout(),
            &self.shared.stats.metrics.relay,
        )
        .await?;

        // Every confirm is in and the rows are marked: a crash here publishes the batch again.
        failpoint(POLL_BEFORE_COMMIT);
        bounded(transaction.commit()).await?;
        tracing::debug!(
            worker,
            rows = count,
            claim_ms = claimed.as_millis() as u64,
            total_ms = polled.elapsed().as_millis() as u64,
            "batch published"
        );
        stats.record_batch(count, polled.elapsed());
        Ok(count)
    }
}

/// Reports the worker up, and blocked or not, for as long as its session runs: the broker
/// blocks and unblocks a connection whenever its alarms say so, mid-batch or idle.
async fn report_blocked(
    health: crate::observability::WorkerHealth,
    worker: usize,
    mut blocked: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let now = *blocked.borrow_and_update();
        health.set(worker, WorkerState::Up { blocked: now });
        if blocked.changed().await.is_err() {
            return;
        }
    }
}

/// Awaits one database operation for at most [`DB_TIMEOUT`].
pub(crate) async fn bounded<T, E>(
    operation: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, RelayError>
where
    RelayError: From<E>,
{
    match tokio::time::timeout(DB_TIMEOUT, operation).await {
        Ok(result) => result.map_err(RelayError::from),
        Err(_) => Err(RelayError::DatabaseTimeout {
            seconds: DB_TIMEOUT.as_secs(),
        }),
    }
}
