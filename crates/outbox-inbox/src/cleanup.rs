//! Retention: the inbox keeps a row per applied message for the deduplication window
//! (`--retention`, default [`DEFAULT_RETENTION`]), then deletes it. A copy of a message that
//! arrives after its row is gone is applied again: the window must outlast every way the
//! relay can deliver a message twice (docs/consumers.md, "How long to keep the inbox").
//!
//! Each consumer name's window counts back from that consumer's own newest row, not from the
//! clock (from the clock only if that is earlier) nor from the table's newest row: a
//! consumer that receives nothing deletes nothing. While the relay, the broker or this
//! consumer is down, no copy can arrive, but the copies a crash causes are the first things
//! delivered when it is over; a window by the clock would have aged their rows out in the
//! meantime, and so would a window of the whole table while another consumer sharing it
//! keeps receiving. The same rule as the relay's own cleanup: a stalled relay keeps the
//! evidence.
//!
//! Each batch is one call of `<table>_cleanup` in its own transaction (autocommit), at most
//! `batch` rows found through the `(consumer, received_at)` index, consumer after consumer,
//! so no lock is held for long and no statement scans the table; batches repeat until one
//! deletes fewer than `batch`.

use std::time::Duration;

use outbox_common::periodic::{self, FailureLog, FirstRound, Job};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::error::InboxError;
use crate::sql::InboxTable;

/// The default window: a day (docs/consumers.md says what it covers and what not).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The relay's own default `--retention`: rows younger than this can still be re-published
/// by `outbox-relay resync`, so a shorter inbox window cannot absorb a resync.
pub const OUTBOX_DEFAULT_RETENTION: Duration = Duration::from_secs(3600);

/// How long one batch may take before the round gives up (and the next round retries).
const BATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// What one cleanup round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cleaned {
    pub deleted: u64,
    /// Statements (transactions) run, the last one short of a full batch.
    pub batches: u64,
}

/// Deletes every row received more than `retention` before its consumer's newest row (or
/// before now), `batch` rows per transaction, until a batch comes back short or `stop` is
/// cancelled. The connection's policy is the process's (`outbox_common::liveness`).
pub async fn cleanup(
    client: &Client,
    table: &InboxTable,
    retention: Duration,
    batch: u32,
    stop: &CancellationToken,
) -> Result<Cleaned, InboxError> {
    let batch = i32::try_from(batch.max(1)).unwrap_or(i32::MAX);
    let sql = format!(
        "SELECT {}($1::float8 * interval '1 second', $2::integer)",
        table.cleanup_function()
    );
    let statement = client
        .prepare(&sql)
        .await
        .map_err(|source| missing(table, source))?;
    let seconds = retention.as_secs_f64();
    let mut cleaned = Cleaned::default();
    loop {
        let row = tokio::time::timeout(
            BATCH_TIMEOUT,
            client.query_one(&statement, &[&seconds, &batch]),
        )
        .await
        .map_err(|_| InboxError::CleanupTimeout {
            seconds: BATCH_TIMEOUT.as_secs(),
        })??;
        let deleted: i32 = row.get(0);
        cleaned.deleted += u64::try_from(deleted).unwrap_or(0);
        cleaned.batches += 1;
        if deleted < batch || stop.is_cancelled() {
            return Ok(cleaned);
        }
    }
}

/// A cleanup of `table` that cannot prepare: its function is missing (or the role may not
/// call it); a retry if the error can pass.
fn missing(table: &InboxTable, source: tokio_postgres::Error) -> InboxError {
    let what = || {
        format!(
            "Cannot call {}: run `outbox-inbox setup` (or sql/inbox.sql) in this database, \
             and grant the consumer's role EXECUTE on it and SELECT, DELETE on {table}",
            table.cleanup_function()
        )
    };
    crate::error::provisioning(what, source)
}

/// Runs [`cleanup`] every `interval` until `stop` is cancelled, on a connection of its own,
/// logging what each round deleted; a failed round is logged and retried at the next interval
/// on a new connection (a cleanup that falls behind only keeps rows longer).
pub async fn every(
    database_url: String,
    table: InboxTable,
    retention: Duration,
    batch: u32,
    interval: Duration,
    stop: CancellationToken,
) {
    // The first round at once: a consumer started after an outage finds its backlog of old
    // rows cleaned before the first interval is over.
    let job = Job {
        what: "inbox cleanup",
        interval,
        first_round: FirstRound::AtOnce,
        round_timeout: None,
        errors: None,
        failure_log: FailureLog::Every,
    };
    let round = |connection: periodic::Connection| {
        let (table, stop) = (table.clone(), stop.clone());
        async move {
            let client = connection.client().await.map_err(crate::connect_error)?;
            cleanup(&client, &table, retention, batch, &stop).await
        }
    };
    let record = |cleaned: Cleaned| {
        if cleaned.deleted > 0 {
            tracing::info!(
                deleted = cleaned.deleted,
                batches = cleaned.batches,
                "inbox cleanup"
            );
        }
    };
    periodic::run(&database_url, job, stop.clone(), round, record).await;
}
