//! Every metric the relay exports: each name a constant here, described once in
//! [`describe`], recorded through the `metrics` facade into the Prometheus recorder
//! ([`recorder`]), plus the handles the hot paths resolve once ([`RelayMetrics`],
//! [`PollMetrics`]).
//!
//! It owns the names and the recorder, not the values: whoever knows a value records it.
//! It must never read a database or the network: the slot's gauges are set by
//! [`crate::catalog::slot`], the scrape-time gauges by [`super::health`].

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::{Counter, Gauge, Histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// pg_current_wal_lsn() − the slot's confirmed_flush_lsn: WAL the relay has not acknowledged.
pub const SLOT_LAG_BYTES: &str = "outbox_relay_slot_lag_bytes";
/// pg_current_wal_lsn() − the slot's restart_lsn: WAL the slot keeps on the primary's disk.
pub const SLOT_RETAINED_WAL_BYTES: &str = "outbox_relay_slot_retained_wal_bytes";
/// 1 for the slot's current wal_status (label `status`), 0 for the others.
pub const SLOT_WAL_STATUS: &str = "outbox_relay_slot_wal_status";
/// The slot's safe_wal_size: WAL that can still be written before the slot is invalidated
/// (NaN while max_slot_wal_keep_size is -1, i.e. unlimited).
pub const SLOT_SAFE_WAL_SIZE_BYTES: &str = "outbox_relay_slot_safe_wal_size_bytes";
/// 1 while some process streams from the slot (active_pid is set), 0 otherwise.
pub const SLOT_ACTIVE: &str = "outbox_relay_slot_active";
/// 1 for the reason the slot was invalidated (label `reason`), 0 for the others; all 0 while
/// it is valid. PostgreSQL 17+ names the reason; on 15 and 16 a lost slot is `wal_removed`
/// unless it kept its restart_lsn (16: a conflict with recovery, `rows_removed`).
pub const SLOT_INVALIDATION_REASON: &str = "outbox_relay_slot_invalidation_reason";
/// The reasons [`SLOT_INVALIDATION_REASON`] reports (`pg_replication_slots.invalidation_reason`).
pub const INVALIDATION_REASONS: [&str; 4] = [
    "wal_removed",
    "rows_removed",
    "wal_level_insufficient",
    "idle_timeout",
];
/// PostgreSQL 16+: the server's `conflicting`: 1 while the slot is invalidated by a conflict
/// with recovery (16 also sets it for a slot whose WAL was removed).
pub const SLOT_CONFLICTING: &str = "outbox_relay_slot_conflicting";
/// PostgreSQL 17+: 1 for a failover slot (synchronized to standbys that ask for it).
pub const SLOT_FAILOVER: &str = "outbox_relay_slot_failover";
/// PostgreSQL 17+: 1 when the slot on this server was synchronized from a primary.
pub const SLOT_SYNCED: &str = "outbox_relay_slot_synced";
/// PostgreSQL 17+: since when (Unix seconds) no process has streamed from the slot; NaN while
/// one does.
pub const SLOT_INACTIVE_SINCE_SECONDS: &str = "outbox_relay_slot_inactive_since_seconds";
/// Slot polls that succeeded (the slot gauges are as fresh as the last one).
pub const SLOT_POLLS_TOTAL: &str = "outbox_relay_slot_polls_total";
/// Slot polls that failed (connection or query errors); the poller reconnects.
pub const SLOT_POLL_ERRORS_TOTAL: &str = "outbox_relay_slot_poll_errors_total";
/// The LSN the relay last acknowledged to PostgreSQL, as a number.
pub const ACKNOWLEDGED_LSN: &str = "outbox_relay_acknowledged_lsn";
/// Messages handed to the broker (basic.publish), including re-publishes after a failure.
pub const MESSAGES_PUBLISHED_TOTAL: &str = "outbox_relay_messages_published_total";
/// Rows a session read again that the stream already held (`--stream`): confirmed without
/// being sent. Counted in [`MESSAGES_PUBLISHED_TOTAL`] too, which counts what delivery
/// handed on.
pub const STREAM_SKIPPED_TOTAL: &str = "outbox_relay_stream_skipped_total";
/// Messages the broker confirmed (basic.ack, not returned).
pub const MESSAGES_CONFIRMED_TOTAL: &str = "outbox_relay_messages_confirmed_total";
/// Messages the broker rejected (basic.nack).
pub const MESSAGES_NACKED_TOTAL: &str = "outbox_relay_messages_nacked_total";
/// Messages the broker returned as unroutable (basic.return of a mandatory publish).
pub const MESSAGES_RETURNED_TOTAL: &str = "outbox_relay_messages_returned_total";
/// Messages sent to the dead-letter exchange (`--on-unroutable dead-letter`) and confirmed
/// there, by reason (`unroutable`, `too_large`, `unmappable`).
pub const DEAD_LETTERED_TOTAL: &str = "outbox_relay_messages_dead_lettered_total";
/// Ack points (commits, keepalives, heartbeats) queued behind an unconfirmed publish;
/// consecutive ones are merged, so this stays at most one above the publishes between them.
pub const ACK_POINTS_QUEUED: &str = "outbox_relay_ack_points_queued";
/// Messages published and not yet confirmed.
pub const MESSAGES_IN_FLIGHT: &str = "outbox_relay_messages_in_flight";
/// Seconds from a transaction's commit (its timestamp in the stream) to the broker's
/// confirm of each of its messages.
pub const COMMIT_TO_CONFIRM_SECONDS: &str = "outbox_relay_commit_to_confirm_seconds";
/// Seconds since the newest own heartbeat at or below the acknowledged LSN was written:
/// end-to-end delay of the whole path, growing while anything on it is stuck.
pub const HEARTBEAT_LAG_SECONDS: &str = "outbox_relay_heartbeat_lag_seconds";
/// Seconds the relay has been failing on the same message (0 when it is not stuck).
pub const BLOCKED_ON_MESSAGE_SECONDS: &str = "outbox_relay_blocked_on_message_seconds";
/// W3C trace context values found invalid and left out of a message, by `header`
/// (`traceparent`, `tracestate`): the message goes on without them.
pub const TRACE_CONTEXT_DROPPED_TOTAL: &str = "outbox_relay_trace_context_dropped_total";
/// Session restarts, by cause (`database`, `broker`, `confirm_timeout`, `nack`, …).
pub const RECONNECTS_TOTAL: &str = "outbox_relay_reconnects_total";
/// Outbox messages taken from the stream for publishing, by source: `row` (the outbox
/// table) or `emitted` (events the emit functions wrote). Replays after a reconnect count
/// again.
pub const DECODED_MESSAGES_TOTAL: &str = "outbox_relay_decoded_messages_total";
/// Transactional logical messages with a prefix other than `--emit-prefix` (another outbox,
/// another tool): not published. Rising while emitted events stay at 0 points at a prefix
/// mismatch between the emit functions and the relay.
pub const IGNORED_LOGICAL_MESSAGES_TOTAL: &str = "outbox_relay_ignored_logical_messages_total";
/// Outbox rows the cleanup job deleted.
pub const CLEANUP_DELETED_ROWS_TOTAL: &str = "outbox_relay_cleanup_deleted_rows_total";
/// 1 while this process waits as a standby because another one holds the slot.
pub const STANDBY: &str = "outbox_relay_standby";
/// 1 while the broker blocks this relay's publishes (memory or disk alarm).
pub const BROKER_BLOCKED: &str = "outbox_relay_broker_blocked";
/// 1 for the RabbitMQ node (label `node`, `host:port`) the newest connection went to, 0 for
/// nodes used before.
pub const BROKER_INFO: &str = "outbox_relay_broker_info";
/// 1 while /readyz answers 200, 0 otherwise (alert on this rather than probing /readyz).
pub const READY: &str = "outbox_relay_ready";
/// Always 1, labelled with the relay's `version` and `mode` (`run` or `poll`): which build
/// runs where, and a series to join other metrics against.
pub const BUILD_INFO: &str = "outbox_relay_build_info";

// Polling mode (`poll`): what the workers do, and what waits in the table.

/// Claim queries run by the polling workers.
pub const POLLS_TOTAL: &str = "outbox_relay_polls_total";
/// Claim queries that found no unsent row.
pub const EMPTY_POLLS_TOTAL: &str = "outbox_relay_empty_polls_total";
/// Seconds from a batch's claim to its COMMIT (claim, publish, confirms, mark), per batch
/// that found rows.
pub const POLL_BATCH_SECONDS: &str = "outbox_relay_poll_batch_seconds";
/// Rows per committed batch.
pub const POLL_BATCH_ROWS: &str = "outbox_relay_poll_batch_rows";
/// Unsent rows (`published_at IS NULL`), read every `--backlog-poll-interval`.
pub const BACKLOG_ROWS: &str = "outbox_relay_backlog_rows";
/// Age of the oldest unsent row (0 when none), read with [`BACKLOG_ROWS`].
pub const OLDEST_UNSENT_AGE_SECONDS: &str = "outbox_relay_oldest_unsent_age_seconds";
/// Backlog reads that failed (the gauges keep their last value); the poller reconnects.
pub const BACKLOG_POLL_ERRORS_TOTAL: &str = "outbox_relay_backlog_poll_errors_total";
/// Notifications received on the --listen channel.
pub const NOTIFICATIONS_TOTAL: &str = "outbox_relay_notifications_total";

/// Label of [`DECODED_MESSAGES_TOTAL`], and its values.
pub const SOURCE_LABEL: &str = "source";
pub const SOURCES: [&str; 2] = ["row", "emitted"];
/// Label of [`RECONNECTS_TOTAL`].
pub const CAUSE_LABEL: &str = "cause";
/// Label of [`DEAD_LETTERED_TOTAL`].
pub const REASON_LABEL: &str = "reason";
/// Its values ([`crate::publish::dead_letter::Reason::label`]).
pub const DEAD_LETTER_REASONS: [&str; 4] = [
    "unroutable",
    "too_large",
    "unmappable",
    "exchange_not_allowed",
];
/// Label of [`TRACE_CONTEXT_DROPPED_TOTAL`], and its values.
pub const HEADER_LABEL: &str = "header";
pub const TRACE_HEADERS: [&str; 2] = ["traceparent", "tracestate"];
/// Label of [`BROKER_INFO`].
pub const NODE_LABEL: &str = "node";
/// 1 for the PostgreSQL server (label `host`, `host:port`) the newest session went to, 0 for
/// servers used before: after a failover with a multi-host URL, the new primary.
pub const POSTGRES_INFO: &str = "outbox_relay_postgres_info";
/// 1 for each standby the database URL names on which the slot is ready to take over (synced,
/// persistent, valid: PostgreSQL 17+ failover slots), 0 where it is not or cannot be read.
pub const FAILOVER_READY: &str = "outbox_relay_failover_ready";
/// Label of [`POSTGRES_INFO`] and [`FAILOVER_READY`].
pub const HOST_LABEL: &str = "host";
/// 1 for each physical slot of `synchronized_standby_slots` that holds the relay's failover
/// slot back (label `slot`: missing, invalidated, no standby connected, or stalled), 0 once it
/// no longer does. PostgreSQL 17+.
pub const WAITING_FOR_STANDBY: &str = "outbox_relay_waiting_for_standby";
/// Label of [`WAITING_FOR_STANDBY`]: the physical slot's name.
pub const SLOT_LABEL: &str = "slot";
/// Replication sessions that started streaming (the first one included): a reconnect adds
/// one.
pub const SESSIONS_TOTAL: &str = "outbox_relay_sessions_total";
/// Failovers of PostgreSQL a session found (a newer timeline of the same system), with the
/// relay's verdict on the events it had handed on (label `phantom_events`: `none`,
/// `possible`, `unknown`; src/wal/timeline.rs).
pub const POSTGRES_FAILOVERS_TOTAL: &str = "outbox_relay_postgres_failovers_total";
/// Label of [`POSTGRES_FAILOVERS_TOTAL`].
pub const PHANTOM_EVENTS_LABEL: &str = "phantom_events";
/// Lost or missing slots the relay recreated and backfilled (`--on-slot-lost recreate`).
pub const SLOT_RECOVERIES_TOTAL: &str = "outbox_relay_slot_recoveries_total";
/// Labels of [`BUILD_INFO`].
pub const VERSION_LABEL: &str = "version";
pub const MODE_LABEL: &str = "mode";
/// Label of every metric of a sharded relay (`run --shards N --shard K`): its shard, `K`.
/// An unsharded relay's metrics carry no shard label: its dashboards need none.
pub const SHARD_LABEL: &str = "shard";
/// Label of [`SLOT_WAL_STATUS`].
pub const STATUS_LABEL: &str = "status";
/// The values `pg_replication_slots.wal_status` takes in PostgreSQL 15.
pub const WAL_STATUSES: [&str; 4] = ["reserved", "extended", "unreserved", "lost"];

/// Buckets of [`COMMIT_TO_CONFIRM_SECONDS`]: milliseconds when healthy, minutes after an outage.
const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Buckets of [`POLL_BATCH_ROWS`]: up to the largest `--batch-size`.
const BATCH_ROWS_BUCKETS: [f64; 13] = [
    1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0, 10000.0, 100000.0,
];

/// Describes every metric (help text and unit) on the installed recorder.
// One description per metric, all in one place: long, and better read as the list it is.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        SLOT_LAG_BYTES,
        Unit::Bytes,
        "WAL not yet acknowledged by the relay: pg_current_wal_lsn() - confirmed_flush_lsn"
    );
    describe_gauge!(
        SLOT_RETAINED_WAL_BYTES,
        Unit::Bytes,
        "WAL the slot keeps on the primary: pg_current_wal_lsn() - restart_lsn"
    );
    describe_gauge!(
        SLOT_WAL_STATUS,
        "1 for the slot's wal_status (reserved, extended, unreserved, lost), 0 for the others"
    );
    describe_gauge!(
        SLOT_SAFE_WAL_SIZE_BYTES,
        Unit::Bytes,
        "WAL that can be written before max_slot_wal_keep_size invalidates the slot (NaN: unlimited)"
    );
    describe_gauge!(SLOT_ACTIVE, "1 while a process streams from the slot");
    describe_gauge!(
        SLOT_INVALIDATION_REASON,
        "1 for the reason the slot was invalidated (wal_removed, rows_removed, wal_level_insufficient, idle_timeout), 0 for the others"
    );
    describe_gauge!(
        SLOT_CONFLICTING,
        "PostgreSQL 16+: 1 while the slot is invalidated by a conflict with recovery (16: by any cause)"
    );
    describe_gauge!(SLOT_FAILOVER, "PostgreSQL 17+: 1 for a failover slot");
    describe_gauge!(
        SLOT_SYNCED,
        "PostgreSQL 17+: 1 when the slot was synchronized from a primary"
    );
    describe_gauge!(
        SLOT_INACTIVE_SINCE_SECONDS,
        "PostgreSQL 17+: since when (Unix seconds) no process has streamed from the slot; NaN while one does"
    );
    describe_counter!(SLOT_POLLS_TOTAL, "Successful reads of pg_replication_slots");
    describe_counter!(
        SLOT_POLL_ERRORS_TOTAL,
        "Failed reads of pg_replication_slots"
    );
    describe_gauge!(
        ACKNOWLEDGED_LSN,
        "The LSN last acknowledged to PostgreSQL (confirmed by the broker up to here)"
    );
    describe_counter!(
        MESSAGES_PUBLISHED_TOTAL,
        "Messages published to the broker, re-publishes included"
    );
    describe_counter!(
        STREAM_SKIPPED_TOTAL,
        "Rows read again that the stream already held: confirmed without being sent"
    );
    describe_counter!(MESSAGES_CONFIRMED_TOTAL, "Messages the broker confirmed");
    describe_counter!(MESSAGES_NACKED_TOTAL, "Messages the broker nacked");
    describe_counter!(
        MESSAGES_RETURNED_TOTAL,
        "Messages the broker returned as unroutable"
    );
    describe_counter!(
        DEAD_LETTERED_TOTAL,
        "Messages the dead-letter exchange confirmed instead of their own, by reason"
    );
    describe_gauge!(
        MESSAGES_IN_FLIGHT,
        "Messages published and not yet confirmed"
    );
    describe_gauge!(
        ACK_POINTS_QUEUED,
        "Ack points (commits, keepalives, heartbeats) queued behind unconfirmed publishes"
    );
    describe_histogram!(
        COMMIT_TO_CONFIRM_SECONDS,
        Unit::Seconds,
        "Seconds from a transaction's commit to the broker's confirm of its message"
    );
    describe_gauge!(
        HEARTBEAT_LAG_SECONDS,
        Unit::Seconds,
        "Seconds since the newest heartbeat at or below the acknowledged LSN was written"
    );
    describe_gauge!(
        BLOCKED_ON_MESSAGE_SECONDS,
        Unit::Seconds,
        "Seconds the relay has been failing on the same message (0: not stuck)"
    );
    describe_counter!(
        DECODED_MESSAGES_TOTAL,
        "Outbox messages taken from the stream for publishing, by source (row, emitted)"
    );
    describe_counter!(
        IGNORED_LOGICAL_MESSAGES_TOTAL,
        "Transactional logical messages with another prefix than --emit-prefix (not published)"
    );
    describe_counter!(RECONNECTS_TOTAL, "Session restarts, by cause");
    describe_counter!(
        TRACE_CONTEXT_DROPPED_TOTAL,
        "Invalid W3C trace context values left out of messages, by header"
    );
    describe_counter!(
        CLEANUP_DELETED_ROWS_TOTAL,
        "Outbox rows deleted by the cleanup job"
    );
    describe_gauge!(
        STANDBY,
        "1 while waiting as a standby for a slot another process holds"
    );
    describe_gauge!(
        BROKER_BLOCKED,
        "1 while the broker blocks publishing (connection.blocked)"
    );
    describe_gauge!(READY, "1 while /readyz answers 200");
    describe_gauge!(
        BUILD_INFO,
        "Always 1: the relay's version and mode (run or poll) as labels"
    );
    describe_gauge!(
        POSTGRES_INFO,
        "1 for the PostgreSQL server (host:port) the relay streams from, 0 for servers used before"
    );
    describe_gauge!(
        FAILOVER_READY,
        "1 for each standby of the database URL where the slot is synced and valid (ready for a failover), 0 otherwise"
    );
    describe_gauge!(
        WAITING_FOR_STANDBY,
        "1 for each physical slot of synchronized_standby_slots that holds the relay's slot back, 0 once it no longer does"
    );
    describe_counter!(
        SESSIONS_TOTAL,
        "Replication sessions that started streaming (the first included)"
    );
    describe_counter!(
        POSTGRES_FAILOVERS_TOTAL,
        "PostgreSQL failovers a session found (a newer timeline of the same system); phantom_events=possible when events of transactions the new primary lacks were handed on"
    );
    describe_counter!(
        SLOT_RECOVERIES_TOTAL,
        "Lost or missing slots recreated and backfilled from the table (--on-slot-lost recreate)"
    );
    describe_gauge!(
        BROKER_INFO,
        "1 for the RabbitMQ node (host:port) the relay is connected to, 0 for nodes used before"
    );
    describe_counter!(POLLS_TOTAL, "Claim queries run by the polling workers");
    describe_counter!(EMPTY_POLLS_TOTAL, "Claim queries that found no unsent row");
    describe_histogram!(
        POLL_BATCH_SECONDS,
        Unit::Seconds,
        "Seconds from a batch's claim to its commit (publish and confirms included)"
    );
    describe_histogram!(POLL_BATCH_ROWS, Unit::Count, "Rows per committed batch");
    describe_gauge!(
        BACKLOG_ROWS,
        Unit::Count,
        "Unsent outbox rows (published_at IS NULL)"
    );
    describe_gauge!(
        OLDEST_UNSENT_AGE_SECONDS,
        Unit::Seconds,
        "Age of the oldest unsent outbox row (0: none)"
    );
    describe_counter!(BACKLOG_POLL_ERRORS_TOTAL, "Failed reads of the backlog");
    describe_counter!(NOTIFICATIONS_TOTAL, "Notifications received with --listen");
}

static RECORDER: OnceLock<PrometheusHandle> = OnceLock::new();

/// The standard `process_*` metrics (resident and virtual memory, CPU seconds, open and
/// maximum file descriptors, start time, threads), read from /proc by `metrics-process` at
/// each scrape. Its CPU counter counts whole seconds (the `metrics` counters are integers).
static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();

fn process_collector() -> &'static metrics_process::Collector {
    PROCESS.get_or_init(metrics_process::Collector::default)
}

/// Refreshes the `process_*` metrics: call before each render.
pub fn update_process_metrics() {
    process_collector().collect();
}

/// Creates, at 0, the counters and gauges of `mode` (the command, `run` or `poll`), and only
/// those: a counter exists from the start so that rate() sees its first increment, and a
/// family the mode never records is not exported at all (docs/metrics.md lists each
/// mode's). What carries a measurement (the slot and backlog gauges, the histograms,
/// `reconnects_total{cause}`) appears with its first one.
pub fn register_mode(mode: &'static str) {
    let (own_counters, own_gauges): (&[&str], &[&str]) = match mode {
        "poll" => (
            &[
                POLLS_TOTAL,
                EMPTY_POLLS_TOTAL,
                BACKLOG_POLL_ERRORS_TOTAL,
                NOTIFICATIONS_TOTAL,
            ],
            &[],
        ),
        _ => {
            for source in SOURCES {
                metrics::counter!(DECODED_MESSAGES_TOTAL, SOURCE_LABEL => source).absolute(0);
            }
            (
                &[
                    SLOT_POLLS_TOTAL,
                    SLOT_POLL_ERRORS_TOTAL,
                    IGNORED_LOGICAL_MESSAGES_TOTAL,
                    SESSIONS_TOTAL,
                    STREAM_SKIPPED_TOTAL,
                ],
                &[ACK_POINTS_QUEUED, STANDBY],
            )
        }
    };
    let counters = [
        MESSAGES_PUBLISHED_TOTAL,
        MESSAGES_CONFIRMED_TOTAL,
        MESSAGES_NACKED_TOTAL,
        MESSAGES_RETURNED_TOTAL,
        CLEANUP_DELETED_ROWS_TOTAL,
    ];
    for name in counters.iter().chain(own_counters) {
        metrics::counter!(*name).absolute(0);
    }
    for reason in DEAD_LETTER_REASONS {
        metrics::counter!(DEAD_LETTERED_TOTAL, REASON_LABEL => reason).absolute(0);
    }
    for header in TRACE_HEADERS {
        metrics::counter!(TRACE_CONTEXT_DROPPED_TOTAL, HEADER_LABEL => header).absolute(0);
    }
    for name in [MESSAGES_IN_FLIGHT, BROKER_BLOCKED]
        .iter()
        .chain(own_gauges)
    {
        metrics::gauge!(*name).set(0.0);
    }
}

/// Sets [`BUILD_INFO`] for this process: `mode` is the command, `run` or `poll`.
pub fn set_build_info(mode: &'static str) {
    metrics::gauge!(
        BUILD_INFO,
        VERSION_LABEL => env!("CARGO_PKG_VERSION"),
        MODE_LABEL => mode
    )
    .set(1.0);
}

/// The value of [`SHARD_LABEL`] on every metric of this process, if it is a sharded relay.
static SHARD: OnceLock<String> = OnceLock::new();

/// Labels every metric of this process with `shard="<index>"`: call it before the recorder
/// is installed ([`recorder`], `start_endpoints`), which reads it once.
pub fn label_every_metric_with_shard(index: u32) {
    if SHARD.set(index.to_string()).is_err() || RECORDER.get().is_some() {
        tracing::warn!("the shard label was set too late or twice; metrics may lack it");
    }
}

/// Installs the Prometheus recorder as the global `metrics` recorder (once per process) and
/// describes the metrics; later calls return the same handle.
pub fn recorder() -> PrometheusHandle {
    RECORDER
        .get_or_init(|| {
            let buckets: [(&str, &[f64]); 3] = [
                (COMMIT_TO_CONFIRM_SECONDS, &LATENCY_BUCKETS),
                (POLL_BATCH_SECONDS, &LATENCY_BUCKETS),
                (POLL_BATCH_ROWS, &BATCH_ROWS_BUCKETS),
            ];
            let mut builder = PrometheusBuilder::new();
            for (name, values) in buckets {
                builder = match builder.set_buckets_for_metric(Matcher::Full(name.into()), values)
                {
                    Ok(builder) => builder,
                    Err(e) => {
                        tracing::warn!(error = %e, "histogram buckets rejected; exporting summaries");
                        PrometheusBuilder::new()
                    }
                };
            }
            if let Some(shard) = SHARD.get() {
                builder = builder.add_global_label(SHARD_LABEL, shard.as_str());
            }
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if let Err(e) = metrics::set_global_recorder(recorder) {
                tracing::warn!(error = %e, "another metrics recorder is installed; /metrics stays empty");
            }
            describe();
            process_collector().describe();
            handle
        })
        .clone()
}

/// The per-message metrics of a session, resolved once (a registry lookup per message would
/// cost more than the increment). Cheap to clone.
#[derive(Clone)]
pub struct RelayMetrics {
    pub published: Counter,
    pub confirmed: Counter,
    pub nacked: Counter,
    pub returned: Counter,
    pub in_flight: Gauge,
    pub ack_points: Gauge,
    pub commit_to_confirm: Histogram,
}

impl Default for RelayMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RelayMetrics {
    /// Resolves the handles on the installed recorder: call it after [`recorder`] (or
    /// [`super::start`]), or the handles record nowhere.
    pub fn new() -> Self {
        Self {
            published: metrics::counter!(MESSAGES_PUBLISHED_TOTAL),
            confirmed: metrics::counter!(MESSAGES_CONFIRMED_TOTAL),
            nacked: metrics::counter!(MESSAGES_NACKED_TOTAL),
            returned: metrics::counter!(MESSAGES_RETURNED_TOTAL),
            in_flight: metrics::gauge!(MESSAGES_IN_FLIGHT),
            ack_points: metrics::gauge!(ACK_POINTS_QUEUED),
            commit_to_confirm: metrics::histogram!(COMMIT_TO_CONFIRM_SECONDS),
        }
    }

    /// The handles of a delivery in batches (polling mode, `resync`): its messages carry no
    /// commit time and its ack points are the batches' ends, so neither
    /// [`COMMIT_TO_CONFIRM_SECONDS`] nor [`ACK_POINTS_QUEUED`] is exported for it.
    pub fn for_batches() -> Self {
        // Not `..Self::new()`: resolving a handle registers its family.
        Self {
            published: metrics::counter!(MESSAGES_PUBLISHED_TOTAL),
            confirmed: metrics::counter!(MESSAGES_CONFIRMED_TOTAL),
            nacked: metrics::counter!(MESSAGES_NACKED_TOTAL),
            returned: metrics::counter!(MESSAGES_RETURNED_TOTAL),
            in_flight: metrics::gauge!(MESSAGES_IN_FLIGHT),
            ack_points: Gauge::noop(),
            commit_to_confirm: Histogram::noop(),
        }
    }

    /// Records one confirm of a message whose transaction committed at `commit_time` (the
    /// server's clock; a clock behind ours counts as 0).
    pub fn observe_commit_to_confirm(&self, commit_time: SystemTime) {
        let seconds = SystemTime::now()
            .duration_since(commit_time)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.commit_to_confirm.record(seconds);
    }
}

/// What the stream reader counts (WAL mode), resolved once. Cheap to clone.
#[derive(Clone)]
pub struct StreamMetrics {
    pub rows: Counter,
    pub emitted: Counter,
    pub ignored_messages: Counter,
}

impl Default for StreamMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl StreamMetrics {
    pub fn new() -> Self {
        Self {
            rows: metrics::counter!(DECODED_MESSAGES_TOTAL, SOURCE_LABEL => SOURCES[0]),
            emitted: metrics::counter!(DECODED_MESSAGES_TOTAL, SOURCE_LABEL => SOURCES[1]),
            ignored_messages: metrics::counter!(IGNORED_LOGICAL_MESSAGES_TOTAL),
        }
    }
}

/// Polling mode's metric handles, resolved once (call after [`recorder`]). Cheap to clone.
#[derive(Clone)]
pub struct PollMetrics {
    pub relay: RelayMetrics,
    pub polls: Counter,
    pub empty_polls: Counter,
    pub batch_seconds: Histogram,
    pub batch_rows: Histogram,
    pub cleanup_deleted: Counter,
    pub notifications: Counter,
}

impl Default for PollMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl PollMetrics {
    pub fn new() -> Self {
        Self {
            relay: RelayMetrics::for_batches(),
            polls: metrics::counter!(POLLS_TOTAL),
            empty_polls: metrics::counter!(EMPTY_POLLS_TOTAL),
            batch_seconds: metrics::histogram!(POLL_BATCH_SECONDS),
            batch_rows: metrics::histogram!(POLL_BATCH_ROWS),
            cleanup_deleted: metrics::counter!(CLEANUP_DELETED_ROWS_TOTAL),
            notifications: metrics::counter!(NOTIFICATIONS_TOTAL),
        }
    }
}

/// Counts one session restart with its cause ([`RelayError::cause`]).
pub fn count_reconnect(cause: &'static str) {
    metrics::counter!(RECONNECTS_TOTAL, CAUSE_LABEL => cause).increment(1);
}

/// A timestamp from the replication stream (microseconds since 2000-01-01 UTC, as in
/// Begin, Commit and keepalive messages) as a `SystemTime`.
pub fn pg_timestamp(micros_since_2000: i64) -> SystemTime {
    const PG_EPOCH_UNIX_SECONDS: u64 = 946_684_800;
    let epoch = UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECONDS);
    let offset = Duration::from_micros(micros_since_2000.unsigned_abs());
    if micros_since_2000 >= 0 {
        epoch + offset
    } else {
        epoch - offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_timestamps_count_from_2000() {
        assert_eq!(
            pg_timestamp(0)
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .ok(),
            Some(946_684_800)
        );
        assert_eq!(
            pg_timestamp(-1_000_000)
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .ok(),
            Some(946_684_799)
        );
    }

    #[test]
    fn every_metric_is_prefixed_and_unique() {
        let names = [
            SLOT_LAG_BYTES,
            SLOT_RETAINED_WAL_BYTES,
            SLOT_WAL_STATUS,
            SLOT_SAFE_WAL_SIZE_BYTES,
            SLOT_ACTIVE,
            SLOT_INVALIDATION_REASON,
            SLOT_CONFLICTING,
            SLOT_FAILOVER,
            SLOT_SYNCED,
            SLOT_INACTIVE_SINCE_SECONDS,
            SLOT_POLLS_TOTAL,
            SLOT_POLL_ERRORS_TOTAL,
            ACKNOWLEDGED_LSN,
            MESSAGES_PUBLISHED_TOTAL,
            STREAM_SKIPPED_TOTAL,
            MESSAGES_CONFIRMED_TOTAL,
            MESSAGES_NACKED_TOTAL,
            MESSAGES_RETURNED_TOTAL,
            MESSAGES_IN_FLIGHT,
            ACK_POINTS_QUEUED,
            BROKER_INFO,
            POSTGRES_INFO,
            FAILOVER_READY,
            WAITING_FOR_STANDBY,
            SLOT_RECOVERIES_TOTAL,
            POSTGRES_FAILOVERS_TOTAL,
            SESSIONS_TOTAL,
            COMMIT_TO_CONFIRM_SECONDS,
            HEARTBEAT_LAG_SECONDS,
            BLOCKED_ON_MESSAGE_SECONDS,
            RECONNECTS_TOTAL,
            DECODED_MESSAGES_TOTAL,
            IGNORED_LOGICAL_MESSAGES_TOTAL,
            CLEANUP_DELETED_ROWS_TOTAL,
            STANDBY,
            BROKER_BLOCKED,
            READY,
            BUILD_INFO,
            POLLS_TOTAL,
            EMPTY_POLLS_TOTAL,
            POLL_BATCH_SECONDS,
            POLL_BATCH_ROWS,
            BACKLOG_ROWS,
            OLDEST_UNSENT_AGE_SECONDS,
            BACKLOG_POLL_ERRORS_TOTAL,
            NOTIFICATIONS_TOTAL,
        ];
        let unique: std::collections::HashSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
        assert!(names.iter().all(|n| n.starts_with("outbox_relay_")));
        // The Grafana dashboard shipped in docs/ is built on these names, and only on them.
        let dashboard = include_str!("../../docs/grafana-dashboard.json");
        let used: std::collections::HashSet<&str> = dashboard
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("outbox_relay_"))
            .map(|word| {
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| word.strip_suffix(suffix))
                    .unwrap_or(word)
            })
            .collect();
        for name in &used {
            assert!(
                names.contains(name),
                "the dashboard uses unknown metric {name}"
            );
        }
        for name in [
            SLOT_LAG_BYTES,
            SLOT_RETAINED_WAL_BYTES,
            HEARTBEAT_LAG_SECONDS,
            READY,
            BACKLOG_ROWS,
            OLDEST_UNSENT_AGE_SECONDS,
        ] {
            assert!(used.contains(name), "the dashboard lacks {name}");
        }
    }
}
