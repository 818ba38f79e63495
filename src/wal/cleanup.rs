//! WAL mode's cleanup job: the outbox table is insert-only, so something must delete rows.
//!
//! Deleting a row never loses a message: the slot decodes message content from the WAL, not
//! from the table (docs/architecture.md, "Cleanup"). Rows are kept anyway for two reasons, and a row
//! goes only when both have passed:
//! - the **retention** (`--retention`, default 1 h): rows stay around for `resync --since`
//!   and for people investigating a message;
//! - the **last acknowledged commit**, less `--recreate-margin`: a row created after the
//!   commit time T of the newest transaction the relay acknowledged may not be delivered yet,
//!   and neither may one created a little before T in a transaction that committed after it
//!   (`created_at` is the transaction's start). A lost slot's recovery re-publishes from
//!   T − margin (`wal/recovery.rs`), so the deletion stops there too, never past the
//!   backfill's start. A stalled relay therefore keeps every row since it stalled, however
//!   long that is: the evidence stays.
//!
//! Deletes run in small batches (`--cleanup-batch`), each its own statement, so no lock is
//! held for long, and each batch is found through the `created_at` index, oldest first, so
//! the job never scans the table. Only the relay that holds the slot runs it.
//!
//! A sharded relay deletes only its own shard's rows (the row filter of its publication,
//! src/shard.rs), by its own acknowledged commit: a stopped shard keeps its rows whatever
//! the others have delivered, with no coordination between the relays.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::config::{CleanupArgs, OutboxNames};
use crate::contract::columns::{self, ColumnMap};
use crate::error::RelayError;
use crate::observability::{Health, CLEANUP_DELETED_ROWS_TOTAL};
use crate::shard::Shard;
use crate::wal::state::{backfill_start, record_acknowledged, EmittedSeen};
use outbox_common::periodic::{self, Job};
use outbox_common::quote::quote_ident;

/// Why the cleanup needs `created_at` (`run`'s error when it is unmapped).
pub(crate) const CLEANUP_NEEDS: &str =
    "the cleanup (--cleanup-interval) deletes delivered rows by \
     it; turn it off with --cleanup-interval 0 if the table is cleaned otherwise";

/// How long one cleanup statement may take before the round gives up (and retries at the
/// next interval).
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);

/// The delete statement for batches of `batch` rows. `$1`: the retention in seconds
/// (float8); `$2`: the commit time of the last acknowledged transaction (timestamptz).
///
/// The inner SELECT reads the `created_at` index in order and stops after `batch` rows; the
/// outer DELETE finds them by primary key. The ids are handed over as an array
/// (`id = ANY(ARRAY(SELECT …))`), not as `id IN (SELECT …)`: the planner turns `IN` into a
/// semi join, and on a large table it prefers hashing the batch and scanning the whole table
/// for it (seen on 100,000 rows: Hash Semi Join over a Seq Scan). An array computed first
/// can only be probed through the primary key's index. The limit is a literal so that a
/// prepared statement never falls back to a generic plan that guesses the row count.
pub fn delete_sql(names: &OutboxNames, batch: u32) -> String {
    shard_delete_sql(names, &ColumnMap::default(), Shard::UNSHARDED, batch)
}

/// [`delete_sql`] for one shard's rows of a table whose columns `map` names: with the
/// shard's row filter in the inner SELECT (the index scan then skips the other shards' rows).
/// `run` refuses to start the cleanup with `created_at` unmapped ([`CLEANUP_NEEDS`]).
pub(crate) fn shard_delete_sql(
    names: &OutboxNames,
    map: &ColumnMap,
    shard: Shard,
    batch: u32,
) -> String {
    let (schema, table) = names.table_parts();
    let qualified = format!("{}.{}", quote_ident(schema), quote_ident(table));
    let quoted = |contract| quote_ident(map.column(contract).unwrap_or(contract));
    let id = quoted(columns::ID);
    let created = quoted(columns::CREATED_AT);
    format!(
        "DELETE FROM {qualified} WHERE {id} = ANY(ARRAY(\
         SELECT {id} FROM {qualified} \
         WHERE {created} < now() - $1::float8 * interval '1 second' \
         AND {created} < $2::timestamptz{shard_rows} \
         ORDER BY {created} LIMIT {batch}))",
        shard_rows = shard
            .row_filter(map)
            .map(|filter| format!(" AND ({filter})"))
            .unwrap_or_default()
    )
}

/// Deletes every row older than `retention` and older than `acknowledged_commit_time`, at
/// most `batch` rows per statement, until a statement deletes fewer than `batch`. Returns
/// how many rows it deleted.
pub async fn delete_batch(
    client: &Client,
    names: &OutboxNames,
    retention: Duration,
    acknowledged_commit_time: SystemTime,
    batch: u32,
) -> Result<u64, RelayError> {
    delete_until(
        client,
        (names, &ColumnMap::default()),
        Shard::UNSHARDED,
        retention,
        acknowledged_commit_time,
        batch,
        &CancellationToken::new(),
    )
    .await
}

async fn delete_until(
    client: &Client,
    (names, map): (&OutboxNames, &ColumnMap),
    shard: Shard,
    retention: Duration,
    acknowledged_commit_time: SystemTime,
    batch: u32,
    shutdown: &CancellationToken,
) -> Result<u64, RelayError> {
    let batch = batch.max(1);
    let statement = bounded(client.prepare(&shard_delete_sql(names, map, shard, batch))).await?;
    let seconds = retention.as_secs_f64();
    let deleted_rows = metrics::counter!(CLEANUP_DELETED_ROWS_TOTAL);
    let mut total = 0;
    loop {
        let deleted =
            bounded(client.execute(&statement, &[&seconds, &acknowledged_commit_time])).await?;
        deleted_rows.increment(deleted);
        total += deleted;
        if deleted < u64::from(batch) || shutdown.is_cancelled() {
            return Ok(total);
        }
    }
}

async fn bounded<T>(
    operation: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, RelayError> {
    match tokio::time::timeout(STATEMENT_TIMEOUT, operation).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(RelayError::DatabaseTimeout {
            seconds: STATEMENT_TIMEOUT.as_secs(),
        }),
    }
}

/// Runs a cleanup round every `args.cleanup_interval` until `shutdown` (the session's token:
/// start it once the session holds the slot, and let it stop with the session), deleting
/// `shard`'s rows. A round needs the commit time of an acknowledged transaction from
/// `health`; until the relay has acknowledged one, rounds are skipped. A failed round is
/// logged and retried at the next interval: cleanup never stops the relay.
/// `--cleanup-interval 0` turns it off. Each round first records the relay's state
/// (`wal/state.rs`): the acknowledged commit time and whether `emitted` events were seen;
/// then it deletes rows created before that commit less `margin` (`--recreate-margin`), where
/// a recovery from that record would start.
pub(crate) async fn run_cleanup(
    database_url: String,
    (names, map): (OutboxNames, Arc<ColumnMap>),
    (shard, margin): (Shard, Duration),
    args: CleanupArgs,
    (health, emitted): (Health, EmittedSeen),
    shutdown: CancellationToken,
) {
    let (retention, batch, stop) = (args.retention, args.cleanup_batch, shutdown.clone());
    let round = move |connection: periodic::Connection| {
        let (names, map, health, emitted, shutdown) = (
            names.clone(),
            Arc::clone(&map),
            health.clone(),
            emitted.clone(),
            stop.clone(),
        );
        async move {
            let Some(acknowledged) = health.acknowledged_commit_time() else {
                tracing::debug!("cleanup: no transaction acknowledged yet; nothing is deleted");
                return Ok(None);
            };
            let client = connection.client().await?;
            // Where a promoted standby finds it: --on-slot-lost recreate backfills from here,
            // less the margin, so the rows from there on stay.
            record_acknowledged(&client, &names, acknowledged, &emitted).await?;
            let backfill_start = backfill_start(acknowledged, margin);
            let deleted = delete_until(
                &client,
                (&names, &map),
                shard,
                retention,
                backfill_start,
                batch,
                &shutdown,
            )
            .await?;
            Ok::<_, RelayError>(Some(deleted))
        }
    };
    let record = |deleted: Option<u64>| match deleted {
        None => {}
        Some(0) => tracing::debug!("cleanup: nothing to delete"),
        Some(deleted) => tracing::info!(deleted, "cleanup deleted delivered rows"),
    };
    let job = Job::cleanup(args.cleanup_interval);
    periodic::run(&database_url, job, shutdown, round, record).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statement_uses_both_bounds_and_a_literal_limit() {
        let names = OutboxNames {
            table: "app.events".into(),
            publication: "".into(),
            slot: "".into(),
            exchange: "".into(),
        };
        let sql = delete_sql(&names, 500);
        assert!(sql.starts_with("DELETE FROM \"app\".\"events\" WHERE \"id\" = ANY(ARRAY(SELECT"));
        assert!(sql.contains("\"created_at\" < now() - $1::float8 * interval '1 second'"));
        assert!(sql.contains("\"created_at\" < $2::timestamptz"));
        assert!(sql.ends_with("ORDER BY \"created_at\" LIMIT 500))"));
    }

    #[test]
    fn a_shard_deletes_only_its_own_rows() {
        let names = OutboxNames {
            table: "outbox".into(),
            publication: "".into(),
            slot: "".into(),
            exchange: "".into(),
        };
        assert!(!delete_sql(&names, 10).contains("hashtext"));
        let shard = Shard::new(2, 4).expect("shard");
        let sql = shard_delete_sql(&names, &ColumnMap::default(), shard, 10);
        let filter = shard.row_filter(&ColumnMap::default()).expect("filter");
        assert!(
            sql.contains(&format!(
                "\"created_at\" < $2::timestamptz AND ({filter}) ORDER BY"
            )),
            "{sql}"
        );
    }

    #[test]
    fn a_mapped_table_is_deleted_from_by_its_own_columns() {
        let names = OutboxNames {
            table: "outbox".into(),
            publication: "".into(),
            slot: "".into(),
            exchange: "".into(),
        };
        let map = ColumnMap::resolve(
            crate::contract::columns::Preset::Debezium,
            &["created_at=occurred at".to_string()],
        )
        .expect("map");
        let sql = shard_delete_sql(&names, &map, Shard::UNSHARDED, 10);
        assert!(
            sql.contains("WHERE \"id\" = ANY(ARRAY(SELECT \"id\""),
            "{sql}"
        );
        assert!(
            sql.ends_with("ORDER BY \"occurred at\" LIMIT 10))"),
            "{sql}"
        );
    }
}
