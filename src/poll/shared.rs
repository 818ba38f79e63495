//! What the workers, the listener and the cleanup of one `poll` run share, and its counters:
//! a leaf of `poll`, so that they and `poll` (which starts them) do not import each other.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::config::{Delivery, OnPublished, PublishNames};
use crate::contract::columns::ColumnMap;
use crate::contract::mapper::Mapper;
use crate::error::RelayError;
use crate::observability::{PollMetrics, WorkerHealth};
use crate::publish::BrokerNodes;

use crate::table::polling::OutboxTable;

/// Counters of one `poll` run for its summary log line; each is also exported as a metric.
pub(super) struct PollStats {
    /// Claim queries run.
    pub(super) polls: AtomicU64,
    /// Claim queries that found no row.
    pub(super) empty_polls: AtomicU64,
    /// Batches published, confirmed and committed.
    pub(super) batches: AtomicU64,
    /// Rows published, confirmed and marked.
    pub(super) published: AtomicU64,
    /// The largest batch committed.
    pub(super) largest_batch: AtomicU64,
    /// Microseconds spent in claim queries, in total (÷ polls = mean poll latency).
    pub(super) claim_micros: AtomicU64,
    /// Worker sessions that failed (each rolled back its batch).
    pub(super) failures: AtomicU64,
    /// Notifications received with --listen.
    pub(super) notifications: AtomicU64,
    /// Published rows deleted by cleanup.
    pub(super) deleted: AtomicU64,
    pub(super) metrics: PollMetrics,
}

impl PollStats {
    /// Counters at zero, exporting through `metrics`.
    pub(super) fn new(metrics: PollMetrics) -> Self {
        Self {
            polls: AtomicU64::new(0),
            empty_polls: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            published: AtomicU64::new(0),
            largest_batch: AtomicU64::new(0),
            claim_micros: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            notifications: AtomicU64::new(0),
            deleted: AtomicU64::new(0),
            metrics,
        }
    }

    /// One claim query that found `rows` rows and took `claim`.
    pub(super) fn record_poll(&self, rows: usize, claim: Duration) {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.metrics.polls.increment(1);
        self.claim_micros
            .fetch_add(claim.as_micros() as u64, Ordering::Relaxed);
        if rows == 0 {
            self.empty_polls.fetch_add(1, Ordering::Relaxed);
            self.metrics.empty_polls.increment(1);
        }
    }

    /// One batch of `rows` committed, `claim_to_commit` after its claim started.
    pub(super) fn record_batch(&self, rows: usize, claim_to_commit: Duration) {
        let rows = rows as u64;
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.published.fetch_add(rows, Ordering::Relaxed);
        self.largest_batch.fetch_max(rows, Ordering::Relaxed);
        self.metrics.batch_rows.record(rows as f64);
        self.metrics
            .batch_seconds
            .record(claim_to_commit.as_secs_f64());
    }

    pub(super) fn record_notification(&self) {
        self.notifications.fetch_add(1, Ordering::Relaxed);
        self.metrics.notifications.increment(1);
    }

    pub(super) fn record_deleted(&self, rows: u64) {
        self.deleted.fetch_add(rows, Ordering::Relaxed);
        self.metrics.cleanup_deleted.increment(rows);
    }

    pub(super) fn log_summary(&self) {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        tracing::info!(
            published = get(&self.published),
            batches = get(&self.batches),
            polls = get(&self.polls),
            empty_polls = get(&self.empty_polls),
            failures = get(&self.failures),
            notifications = get(&self.notifications),
            deleted = get(&self.deleted),
            "polling stopped"
        );
    }
}

/// What the workers, the listener and the cleanup share.
pub(super) struct Shared {
    pub(super) database_url: String,
    pub(super) brokers: Arc<BrokerNodes>,
    pub(super) names: PublishNames,
    /// Which of the table's columns holds each contract column (`--table-layout`,
    /// `--column`): every connect builds its SQL from it.
    pub(super) columns: Arc<ColumnMap>,
    pub(super) mapper: Mapper,
    /// The dead-letter exchange under `--on-unroutable dead-letter`; `None` under halt.
    pub(super) dead_letter_exchange: Option<String>,
    pub(super) workers: u32,
    pub(super) batch_size: u32,
    pub(super) on_published: OnPublished,
    /// The wait after the first empty poll, doubling with each further one up to the max.
    pub(super) poll_interval_min: Duration,
    pub(super) poll_interval_max: Duration,
    pub(super) delivery: Delivery,
    /// Wakes idle workers: one per notification, one more after each full batch.
    pub(super) wake: Notify,
    /// Whether a worker has looked for the claim index yet (one warning per run).
    pub(super) index_checked: AtomicBool,
    pub(super) stats: PollStats,
    /// Each worker's connections, for /readyz.
    pub(super) health: WorkerHealth,
}

impl Shared {
    /// The outbox table as this run reads it (its column map, its `--on-published`): what
    /// every worker session and cleanup round learns on connect.
    pub(super) async fn outbox_table(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<OutboxTable, RelayError> {
        OutboxTable::discover(client, &self.names.table, &self.columns, self.on_published).await
    }
}
