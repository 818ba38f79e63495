//! Polling mode's cleanup: deletes rows published longer ago than the retention, in small
//! batches (short lock times), oldest first through the created_at index. Unpublished rows
//! are never deleted, however old: they are the evidence of a stuck message.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::RelayError;
use outbox_common::periodic::{self, Job};

use super::shared::Shared;
use super::worker::bounded;

/// Runs a cleanup round every `interval` until `shutdown`; a failed round is logged and the
/// next one tries again (cleanup never stops the relay).
pub(crate) async fn run(
    shared: Arc<Shared>,
    interval: Duration,
    retention: Duration,
    batch: u32,
    shutdown: CancellationToken,
) {
    let database_url = shared.database_url.clone();
    let stop = shutdown.clone();
    let round = move |connection: periodic::Connection| {
        let (shared, shutdown) = (Arc::clone(&shared), stop.clone());
        async move { round(&connection, &shared, retention, batch, &shutdown).await }
    };
    let record = |deleted: u64| match deleted {
        0 => tracing::debug!("cleanup: nothing to delete"),
        deleted => tracing::info!(deleted, "cleanup deleted published rows"),
    };
    let job = Job::cleanup(interval);
    periodic::run(&database_url, job, shutdown, round, record).await;
}

async fn round(
    connection: &periodic::Connection,
    shared: &Shared,
    retention: Duration,
    batch: u32,
    shutdown: &CancellationToken,
) -> Result<u64, RelayError> {
    let client = connection.client().await?;
    let table = bounded(shared.outbox_table(&client)).await?;
    let delete = bounded(client.prepare(&table.cleanup_sql(batch)?)).await?;
    let seconds = retention.as_secs_f64();
    let mut total = 0;
    loop {
        let deleted = bounded(client.execute(&delete, &[&seconds])).await?;
        total += deleted;
        shared.stats.record_deleted(deleted);
        if deleted < u64::from(batch) || shutdown.is_cancelled() {
            return Ok(total);
        }
    }
}
