//! What an operator watches: every metric the relay exports (each name a constant here,
//! described once in [`describe`]), the health state behind `/readyz`, the small HTTP server
//! for `/metrics`, `/healthz` and `/readyz`, and the slot poller.
//!
//! The relay is watched through its slot. A slot that stops advancing pins WAL on the primary
//! until the disk fills or `max_slot_wal_keep_size` invalidates it, so the numbers that matter
//! most come from PostgreSQL itself, not from the relay's own view: the poller reads
//! `pg_replication_slots` on an ordinary connection every `--slot-poll-interval`, whatever
//! the replication session is doing (it keeps reporting while the session reconnects).
//!
//! Values that grow with time while nothing happens (heartbeat lag, seconds blocked on one
//! message, readiness) are computed when `/metrics` is scraped, from instants the session
//! records in [`Health`]: a stalled relay cannot report its own stall, but the scrape can.
//!
//! Metrics go through the `metrics` facade into `metrics-exporter-prometheus`, used without
//! its HTTP listener: [`PrometheusHandle::render`] produces the text, and the server here is
//! a minimal HTTP/1.1 one (GET and HEAD, one request per connection) so that the relay pulls
//! in no web framework for three fixed paths.

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metrics::{Counter, Gauge, Histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::db;
use crate::error::{chain, RelayError};

// ---- metric names (Prometheus text format, `outbox_relay_` prefix) ----

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
/// Slot polls that succeeded (the slot gauges are as fresh as the last one).
pub const SLOT_POLLS_TOTAL: &str = "outbox_relay_slot_polls_total";
/// Slot polls that failed (connection or query errors); the poller reconnects.
pub const SLOT_POLL_ERRORS_TOTAL: &str = "outbox_relay_slot_poll_errors_total";
/// The LSN the relay last acknowledged to PostgreSQL, as a number.
pub const ACKNOWLEDGED_LSN: &str = "outbox_relay_acknowledged_lsn";
/// Messages handed to the broker (basic.publish), including re-publishes after a failure.
pub const MESSAGES_PUBLISHED_TOTAL: &str = "outbox_relay_messages_published_total";
/// Messages the broker confirmed (basic.ack, not returned).
pub const MESSAGES_CONFIRMED_TOTAL: &str = "outbox_relay_messages_confirmed_total";
/// Messages the broker rejected (basic.nack).
pub const MESSAGES_NACKED_TOTAL: &str = "outbox_relay_messages_nacked_total";
/// Messages the broker returned as unroutable (basic.return of a mandatory publish).
pub const MESSAGES_RETURNED_TOTAL: &str = "outbox_relay_messages_returned_total";
/// Messages sent to the dead-letter exchange (`--on-unroutable dead-letter`) and confirmed
/// there, by reason (`unroutable`, `too_large`, `unmappable`).
pub const DEAD_LETTERED_TOTAL: &str = "outbox_relay_messages_dead_lettered_total";
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
/// Session restarts, by cause (`database`, `broker`, `confirm_timeout`, `nack`, …).
pub const RECONNECTS_TOTAL: &str = "outbox_relay_reconnects_total";
/// Outbox rows the cleanup job deleted.
pub const CLEANUP_DELETED_ROWS_TOTAL: &str = "outbox_relay_cleanup_deleted_rows_total";
/// 1 while this process waits as a standby because another one holds the slot.
pub const STANDBY: &str = "outbox_relay_standby";
/// 1 while the broker blocks this relay's publishes (memory or disk alarm).
pub const BROKER_BLOCKED: &str = "outbox_relay_broker_blocked";
/// 1 while /readyz answers 200, 0 otherwise (alert on this rather than probing /readyz).
pub const READY: &str = "outbox_relay_ready";

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

/// Label of [`RECONNECTS_TOTAL`].
pub const CAUSE_LABEL: &str = "cause";
/// Label of [`DEAD_LETTERED_TOTAL`].
pub const REASON_LABEL: &str = "reason";
/// Its values ([`crate::dead_letter::Reason::label`]).
pub const DEAD_LETTER_REASONS: [&str; 3] = ["unroutable", "too_large", "unmappable"];
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
    describe_counter!(RECONNECTS_TOTAL, "Session restarts, by cause");
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
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if let Err(e) = metrics::set_global_recorder(recorder) {
                tracing::warn!(error = %e, "another metrics recorder is installed; /metrics stays empty");
            }
            describe();
            // Counters exist from the start, so that rate() sees their first increment.
            for name in [
                SLOT_POLLS_TOTAL,
                SLOT_POLL_ERRORS_TOTAL,
                MESSAGES_PUBLISHED_TOTAL,
                MESSAGES_CONFIRMED_TOTAL,
                MESSAGES_NACKED_TOTAL,
                MESSAGES_RETURNED_TOTAL,
                CLEANUP_DELETED_ROWS_TOTAL,
                POLLS_TOTAL,
                EMPTY_POLLS_TOTAL,
                BACKLOG_POLL_ERRORS_TOTAL,
                NOTIFICATIONS_TOTAL,
            ] {
                metrics::counter!(name).absolute(0);
            }
            for reason in DEAD_LETTER_REASONS {
                metrics::counter!(DEAD_LETTERED_TOTAL, REASON_LABEL => reason).absolute(0);
            }
            metrics::gauge!(MESSAGES_IN_FLIGHT).set(0.0);
            metrics::gauge!(STANDBY).set(0.0);
            metrics::gauge!(BROKER_BLOCKED).set(0.0);
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
    pub commit_to_confirm: Histogram,
}

impl Default for RelayMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RelayMetrics {
    /// Resolves the handles on the installed recorder: call it after [`recorder`] (or
    /// [`start`]), or the handles record nowhere.
    pub fn new() -> Self {
        Self {
            published: metrics::counter!(MESSAGES_PUBLISHED_TOTAL),
            confirmed: metrics::counter!(MESSAGES_CONFIRMED_TOTAL),
            nacked: metrics::counter!(MESSAGES_NACKED_TOTAL),
            returned: metrics::counter!(MESSAGES_RETURNED_TOTAL),
            in_flight: metrics::gauge!(MESSAGES_IN_FLIGHT),
            commit_to_confirm: metrics::histogram!(COMMIT_TO_CONFIRM_SECONDS),
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

impl RelayMetrics {
    /// Counts the outcome of a batch of `published` messages whose confirms were awaited
    /// together (polling mode): `unsettled` of them were still waiting when `outcome` came
    /// (0 on success; a nacked or returned message is settled, and counted as such). Each
    /// raised the in-flight gauge when it was published.
    pub fn record_batch_confirms(
        &self,
        published: usize,
        unsettled: usize,
        outcome: &Result<(), RelayError>,
    ) {
        self.in_flight.decrement(published as f64);
        let failed = match outcome {
            Ok(()) => 0,
            Err(RelayError::Nacked { .. }) => {
                self.nacked.increment(1);
                1
            }
            Err(RelayError::Returned { .. }) => {
                self.returned.increment(1);
                1
            }
            Err(_) => 0,
        };
        let confirmed = published.saturating_sub(unsettled + failed);
        self.confirmed.increment(confirmed as u64);
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
            relay: RelayMetrics::new(),
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

// ---- health ----

/// Why `/readyz` answers 503. The text is the one-line body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Not streaming yet (the first session is connecting).
    Starting,
    /// Another process holds the slot; this one waits to take over.
    Standby,
    /// The broker connection or channel is gone; reconnecting.
    BrokerDown,
    /// PostgreSQL (ordinary or replication connection) is gone; reconnecting.
    DatabaseDown,
    /// The broker blocks publishing (memory or disk alarm).
    BrokerBlocked,
    /// No own heartbeat came back through the stream for 3 intervals.
    NoHeartbeat,
    /// The slot was invalidated (`wal_status = 'lost'`).
    SlotLost,
    /// The broker keeps refusing this message (nack, unroutable, no confirm).
    StuckMessage(String),
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::Starting => f.write_str("starting"),
            NotReady::Standby => f.write_str("standby"),
            NotReady::BrokerDown => f.write_str("broker down"),
            NotReady::DatabaseDown => f.write_str("database down"),
            NotReady::BrokerBlocked => f.write_str("broker blocked"),
            NotReady::NoHeartbeat => f.write_str("no heartbeat"),
            NotReady::SlotLost => f.write_str("slot lost"),
            NotReady::StuckMessage(id) => write!(f, "stuck message {id}"),
        }
    }
}

impl NotReady {
    /// What a session failure means for readiness while the supervisor reconnects.
    pub fn after(error: &RelayError) -> NotReady {
        if let Some(id) = error.stuck_message_id() {
            return NotReady::StuckMessage(id.to_string());
        }
        match error {
            RelayError::SlotInUse { .. } => NotReady::Standby,
            RelayError::SlotLost { .. } => NotReady::SlotLost,
            RelayError::StreamSilent { .. } => NotReady::NoHeartbeat,
            RelayError::Broker(_) | RelayError::ExchangeMissing { .. } => NotReady::BrokerDown,
            RelayError::ConnectTimeout { what, .. } if *what == crate::publish::RABBITMQ => {
                NotReady::BrokerDown
            }
            _ => NotReady::DatabaseDown,
        }
    }
}

/// What the session, the supervisor and the poller report, for `/readyz` and the gauges that
/// are computed at scrape time. One per process; clones share it.
///
/// Readiness combines independent conditions, each set by whoever knows it, so that no
/// writer can clear another's: the session's phase ([`set_ready`](Self::set_ready) /
/// [`set_not_ready`](Self::set_not_ready)), the broker's blocked flag, the heartbeat's
/// staleness, a stuck message, and a lost slot seen by the poller. `/readyz` answers with
/// the first that fails, in that order of precedence: slot lost, the phase, broker blocked,
/// no heartbeat, stuck message.
#[derive(Clone, Default)]
pub struct Health {
    state: Arc<Mutex<HealthState>>,
}

#[derive(Default)]
struct HealthState {
    /// `None`: streaming. Initially "starting".
    phase: Option<NotReady>,
    started: bool,
    broker_blocked: bool,
    heartbeat_stale: bool,
    stuck: Option<(String, Instant)>,
    slot_lost: bool,
    acknowledged: Option<Acknowledged>,
    heartbeat_written: Option<SystemTime>,
}

/// The newest position the relay acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acknowledged {
    pub lsn: u64,
    /// Commit time of the newest acknowledged transaction (the server's clock), if any was
    /// acknowledged by this process. Kept when later ack points are keepalives.
    pub commit_time: Option<SystemTime>,
}

impl Health {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Streaming, with the broker channel open. (The other conditions may still hold
    /// readiness back.)
    pub fn set_ready(&self) {
        let mut state = self.lock();
        state.phase = None;
        state.started = true;
        metrics::gauge!(STANDBY).set(0.0);
    }

    /// Not streaming, and why.
    pub fn set_not_ready(&self, reason: NotReady) {
        let mut state = self.lock();
        metrics::gauge!(STANDBY).set(if reason == NotReady::Standby {
            1.0
        } else {
            0.0
        });
        if let NotReady::StuckMessage(id) = &reason {
            set_stuck(&mut state, Some(id));
        }
        if reason == NotReady::SlotLost {
            state.slot_lost = true;
        }
        state.started = true;
        state.phase = Some(reason);
    }

    /// The broker blocks (true) or unblocks (false) this relay's publishes.
    pub fn set_broker_blocked(&self, blocked: bool) {
        self.lock().broker_blocked = blocked;
        metrics::gauge!(BROKER_BLOCKED).set(if blocked { 1.0 } else { 0.0 });
    }

    /// No own heartbeat came back for 3 intervals (true), or one did again (false).
    pub fn set_heartbeat_stale(&self, stale: bool) {
        self.lock().heartbeat_stale = stale;
    }

    /// The message the pipeline is stuck on (`None` once the broker confirmed it). The
    /// blocked-on-message clock keeps running while the same id is set again.
    pub fn set_stuck(&self, message_id: Option<&str>) {
        set_stuck(&mut self.lock(), message_id);
    }

    /// The id of the message the relay is stuck on, if any.
    pub fn stuck(&self) -> Option<String> {
        self.lock().stuck.as_ref().map(|(id, _)| id.clone())
    }

    /// The slot poller saw `wal_status = 'lost'` (or no longer does).
    pub fn set_slot_lost(&self, lost: bool) {
        self.lock().slot_lost = lost;
    }

    /// The relay acknowledged `lsn` to PostgreSQL; `commit_time` is the commit timestamp of
    /// the transaction that ends there (`None` for a keepalive or heartbeat ack point, which
    /// keeps the previous commit time).
    pub fn record_acknowledged(&self, lsn: u64, commit_time: Option<SystemTime>) {
        let mut state = self.lock();
        let previous = state.acknowledged.and_then(|a| a.commit_time);
        state.acknowledged = Some(Acknowledged {
            lsn,
            commit_time: commit_time.or(previous),
        });
        metrics::gauge!(ACKNOWLEDGED_LSN).set(lsn as f64);
    }

    /// The newest acknowledged position, if the relay acknowledged anything yet.
    pub fn acknowledged(&self) -> Option<Acknowledged> {
        self.lock().acknowledged
    }

    /// Commit time of the newest acknowledged transaction: the cleanup job never deletes
    /// rows newer than this (a stalled relay keeps the evidence).
    pub fn acknowledged_commit_time(&self) -> Option<SystemTime> {
        self.lock().acknowledged.and_then(|a| a.commit_time)
    }

    /// An own heartbeat written at `written` (its timestamp) is at or below the acknowledged
    /// LSN: the heartbeat lag is measured from here at every scrape.
    pub fn record_heartbeat_acknowledged(&self, written: SystemTime) {
        let mut state = self.lock();
        if state.heartbeat_written.is_none_or(|t| written > t) {
            state.heartbeat_written = Some(written);
        }
    }

    /// `Ok` when ready, else the one-line reason `/readyz` gives.
    pub fn readiness(&self) -> Result<(), NotReady> {
        let state = self.lock();
        if state.slot_lost {
            return Err(NotReady::SlotLost);
        }
        if !state.started {
            return Err(NotReady::Starting);
        }
        if let Some(reason) = &state.phase {
            return Err(reason.clone());
        }
        if state.broker_blocked {
            return Err(NotReady::BrokerBlocked);
        }
        if state.heartbeat_stale {
            return Err(NotReady::NoHeartbeat);
        }
        if let Some((id, _)) = &state.stuck {
            return Err(NotReady::StuckMessage(id.clone()));
        }
        Ok(())
    }

    /// Sets the gauges that depend on the time of the scrape.
    fn update_scrape_gauges(&self) {
        let ready = self.readiness().is_ok();
        let state = self.lock();
        metrics::gauge!(READY).set(if ready { 1.0 } else { 0.0 });
        let blocked = state
            .stuck
            .as_ref()
            .map(|(_, since)| since.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        metrics::gauge!(BLOCKED_ON_MESSAGE_SECONDS).set(blocked);
        if let Some(written) = state.heartbeat_written {
            let lag = SystemTime::now()
                .duration_since(written)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            metrics::gauge!(HEARTBEAT_LAG_SECONDS).set(lag);
        }
    }
}

fn set_stuck(state: &mut HealthState, message_id: Option<&str>) {
    match message_id {
        None => state.stuck = None,
        Some(id) => {
            if state.stuck.as_ref().map(|(current, _)| current.as_str()) != Some(id) {
                state.stuck = Some((id.to_string(), Instant::now()));
            }
        }
    }
}

/// What one polling worker reports about its connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerState {
    /// Connecting for the first time.
    Starting,
    /// Both connections up; `blocked` while the broker blocks this connection's publishes.
    Up { blocked: bool },
    /// The last session failed (this is why); reconnecting.
    Down(NotReady),
}

/// Polling mode's readiness: every worker reports its own state, and the relay is ready
/// while at least one worker has its database and broker connections up (it delivers, if
/// more slowly) and none is blocked. A broker alarm blocks every connection that publishes,
/// so one blocked worker means the others are blocked at their next publish: "broker
/// blocked" wins. Otherwise `/readyz` gives the reason of the first worker that is down.
#[derive(Clone)]
pub struct WorkerHealth {
    health: Health,
    workers: Arc<Mutex<Vec<WorkerState>>>,
}

impl WorkerHealth {
    pub fn new(health: Health, workers: usize) -> Self {
        Self {
            health,
            workers: Arc::new(Mutex::new(vec![WorkerState::Starting; workers])),
        }
    }

    /// Records `worker`'s state and updates the process's [`Health`].
    pub fn set(&self, worker: usize, state: WorkerState) {
        let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = workers.get_mut(worker) {
            *slot = state;
        }
        // Applied under the lock, so that two workers' updates land in order.
        match combined(&workers) {
            Ok(()) => {
                self.health.set_broker_blocked(false);
                self.health.set_stuck(None);
                self.health.set_ready();
            }
            Err(NotReady::BrokerBlocked) => {
                self.health.set_stuck(None);
                self.health.set_ready();
                self.health.set_broker_blocked(true);
            }
            Err(NotReady::Starting) => {}
            Err(reason) => {
                self.health.set_broker_blocked(false);
                self.health.set_not_ready(reason);
            }
        }
    }
}

/// The workers' states as one readiness.
fn combined(workers: &[WorkerState]) -> Result<(), NotReady> {
    if workers.contains(&WorkerState::Up { blocked: true }) {
        return Err(NotReady::BrokerBlocked);
    }
    if workers.contains(&WorkerState::Up { blocked: false }) {
        return Ok(());
    }
    workers
        .iter()
        .find_map(|w| match w {
            WorkerState::Down(reason) => Some(reason.clone()),
            _ => None,
        })
        .map_or(Err(NotReady::Starting), Err)
}

// ---- HTTP ----

/// Longest request head the server reads; anything larger is answered 431.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a listener that could not bind retries.
const BIND_RETRY: Duration = Duration::from_secs(5);
/// How often histogram samples are folded into their buckets between scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

const TEXT: &str = "text/plain; charset=utf-8";

/// What the HTTP endpoints read.
#[derive(Clone)]
pub struct Endpoints {
    pub metrics: PrometheusHandle,
    pub health: Health,
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until `shutdown`. A port that
/// cannot be bound is not fatal: delivering messages matters more than reporting on them,
/// so the relay warns and keeps trying to bind every few seconds.
pub async fn serve_on(addr: SocketAddr, endpoints: Endpoints, shutdown: CancellationToken) {
    let mut warned = false;
    let listener = loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => break listener,
            Err(e) => {
                if !warned {
                    tracing::warn!(
                        %addr,
                        error = %e,
                        "cannot serve /metrics, /healthz and /readyz; retrying every 5 s \
                         (set --metrics-addr to another address, or off)"
                    );
                    warned = true;
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(BIND_RETRY) => {}
                }
            }
        }
    };
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    serve(listener, endpoints, shutdown).await;
}

/// Serves the endpoints on a bound listener until `shutdown` (tests bind port 0 and pass
/// the listener in).
pub async fn serve(listener: TcpListener, endpoints: Endpoints, shutdown: CancellationToken) {
    let upkeep = {
        let handle = endpoints.metrics.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(UPKEEP_INTERVAL) => handle.run_upkeep(),
                }
            }
        })
    };
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                let endpoints = endpoints.clone();
                tokio::spawn(async move {
                    if let Err(e) = respond(stream, &endpoints).await {
                        tracing::debug!(error = %e, "metrics connection failed");
                    }
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: pause instead of spinning.
                tracing::warn!(error = %e, "cannot accept a metrics connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    upkeep.abort();
}

/// One response to one request on `stream`, then close.
async fn respond(mut stream: TcpStream, endpoints: &Endpoints) -> std::io::Result<()> {
    let (status, content_type, body, head_only) =
        match tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream)).await {
            Ok(Ok(Some(head))) => {
                let (status, content_type, body) = route(&head, endpoints);
                (status, content_type, body, head.starts_with("HEAD "))
            }
            Ok(Ok(None)) => (431, TEXT, "request too large\n".to_string(), false),
            Ok(Err(e)) => return Err(e),
            // A client that sends nothing in time gets nothing.
            Err(_) => return Ok(()),
        };
    let allow = if status == 405 {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let mut response = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         {allow}Cache-Control: no-store\r\nConnection: close\r\n\r\n",
        reason_phrase(status),
        body.len()
    );
    if !head_only {
        response.push_str(&body);
    }
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Reads up to the blank line that ends the request head; `None` if it is too large.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut buffer = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buffer.extend_from_slice(&chunk[..n]);
        if buffer.windows(4).any(|w| w == b"\r\n\r\n") || buffer.windows(2).any(|w| w == b"\n\n") {
            break;
        }
        if buffer.len() > MAX_REQUEST {
            return Ok(None);
        }
    }
    Ok(Some(String::from_utf8_lossy(&buffer).into_owned()))
}

/// Status, content type and body for a request head.
fn route(head: &str, endpoints: &Endpoints) -> (u16, &'static str, String) {
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("");
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return (405, TEXT, "only GET and HEAD\n".into());
    }
    match path {
        "/metrics" => {
            endpoints.health.update_scrape_gauges();
            endpoints.metrics.run_upkeep();
            (
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                endpoints.metrics.render(),
            )
        }
        "/healthz" => (200, TEXT, "ok\n".into()),
        "/readyz" => match endpoints.health.readiness() {
            Ok(()) => (200, TEXT, "ready\n".into()),
            Err(reason) => (503, TEXT, format!("{reason}\n")),
        },
        _ => (
            404,
            TEXT,
            "not found: try /metrics, /healthz or /readyz\n".into(),
        ),
    }
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    }
}

// ---- the slot, as PostgreSQL sees it ----

/// One row of `pg_replication_slots` for the relay's slot, with the byte distances the
/// relay reports (read in one statement, so they belong together).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SlotReport {
    pub slot: String,
    pub plugin: Option<String>,
    pub active_pid: Option<i32>,
    /// `reserved`, `extended`, `unreserved` or `lost` (NULL for a slot never used).
    pub wal_status: Option<String>,
    /// NULL while max_slot_wal_keep_size is -1 (unlimited).
    pub safe_wal_size_bytes: Option<i64>,
    pub confirmed_flush_lsn: Option<String>,
    pub restart_lsn: Option<String>,
    /// pg_current_wal_lsn() − confirmed_flush_lsn.
    pub lag_bytes: Option<i64>,
    /// pg_current_wal_lsn() − restart_lsn.
    pub retained_wal_bytes: Option<i64>,
    pub current_wal_lsn: String,
}

impl SlotReport {
    pub fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
    }
}

/// Reads the slot's row; `None` when no slot has this name.
pub async fn read_slot(client: &Client, slot: &str) -> Result<Option<SlotReport>, RelayError> {
    let row = client
        .query_opt(
            "SELECT slot_name::text, plugin::text, active_pid, wal_status, safe_wal_size, \
                    confirmed_flush_lsn::text, restart_lsn::text, \
                    (pg_current_wal_lsn() - confirmed_flush_lsn)::int8, \
                    (pg_current_wal_lsn() - restart_lsn)::int8, \
                    pg_current_wal_lsn()::text \
             FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.map(|row| SlotReport {
        slot: row.get(0),
        plugin: row.get(1),
        active_pid: row.get(2),
        wal_status: row.get(3),
        safe_wal_size_bytes: row.get(4),
        confirmed_flush_lsn: row.get(5),
        restart_lsn: row.get(6),
        lag_bytes: row.get(7),
        retained_wal_bytes: row.get(8),
        current_wal_lsn: row.get(9),
    }))
}

/// Sets the slot gauges from one report.
pub fn record_slot(report: &SlotReport) {
    let bytes = |value: Option<i64>| value.map(|v| v as f64).unwrap_or(f64::NAN);
    metrics::gauge!(SLOT_LAG_BYTES).set(bytes(report.lag_bytes));
    metrics::gauge!(SLOT_RETAINED_WAL_BYTES).set(bytes(report.retained_wal_bytes));
    metrics::gauge!(SLOT_SAFE_WAL_SIZE_BYTES).set(bytes(report.safe_wal_size_bytes));
    metrics::gauge!(SLOT_ACTIVE).set(if report.active_pid.is_some() {
        1.0
    } else {
        0.0
    });
    for status in WAL_STATUSES {
        let value = if report.wal_status.as_deref() == Some(status) {
            1.0
        } else {
            0.0
        };
        metrics::gauge!(SLOT_WAL_STATUS, STATUS_LABEL => status).set(value);
    }
}

/// Reads the slot every `interval` until `shutdown`, setting the slot gauges and telling
/// `health` when the slot is lost.
pub async fn run_slot_poller(
    database_url: String,
    slot: String,
    interval: Duration,
    health: Health,
    shutdown: CancellationToken,
) {
    let polls = metrics::counter!(SLOT_POLLS_TOTAL);
    let mut missing_logged = false;
    let name = slot.clone();
    let read = move |client: Arc<Client>| {
        let slot = slot.clone();
        async move { read_slot(&client, &slot).await }
    };
    let record = move |report: Option<SlotReport>| {
        polls.increment(1);
        match report {
            Some(report) => {
                record_slot(&report);
                health.set_slot_lost(report.is_lost());
                missing_logged = false;
            }
            None if !missing_logged => {
                tracing::warn!(slot = %name, "slot poller: the replication slot does not exist");
                missing_logged = true;
            }
            None => {}
        }
    };
    let errors = metrics::counter!(SLOT_POLL_ERRORS_TOTAL);
    run_periodically(
        database_url,
        interval,
        "slot poller",
        errors,
        shutdown,
        read,
        record,
    )
    .await;
}

/// Runs `read` every `interval` on an ordinary connection of its own until `shutdown`, and
/// hands each result to `record`. The connection is kept while it works and replaced after a
/// failure; a read that hangs (a black-holed connection) is abandoned after
/// max(`interval`, 10 s), so it cannot stop the next ones. Failures are counted on `errors`
/// and logged once per outage, naming `what`.
pub async fn run_periodically<T, Read, Fut>(
    database_url: String,
    interval: Duration,
    what: &'static str,
    errors: Counter,
    shutdown: CancellationToken,
    mut read: Read,
    mut record: impl FnMut(T),
) where
    Read: FnMut(Arc<Client>) -> Fut,
    Fut: std::future::Future<Output = Result<T, RelayError>>,
{
    let bound = interval.max(Duration::from_secs(10));
    let mut client: Option<Arc<Client>> = None;
    let mut failing = false;
    loop {
        let round = async {
            let connected = match client.take() {
                Some(c) if !c.is_closed() => c,
                _ => Arc::new(db::connect(&database_url).await?),
            };
            let outcome = read(Arc::clone(&connected)).await;
            client = Some(connected);
            outcome
        };
        let outcome = match tokio::time::timeout(bound, round).await {
            Ok(outcome) => outcome,
            Err(_) => Err(RelayError::DatabaseTimeout {
                seconds: bound.as_secs(),
            }),
        };
        match outcome {
            Ok(value) => {
                record(value);
                failing = false;
            }
            Err(e) => {
                errors.increment(1);
                client = None;
                if !failing {
                    tracing::warn!(error = %chain(&e), "{what} failed; retrying");
                    failing = true;
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Starts what `run` serves besides delivering: the HTTP endpoints (unless `addr` is
/// `None`) and the slot poller, both stopping with `shutdown`. Returns the process's health.
pub fn start(
    addr: Option<SocketAddr>,
    database_url: &str,
    slot: &str,
    slot_poll_interval: Duration,
    shutdown: &CancellationToken,
) -> Health {
    let health = start_endpoints(addr, shutdown);
    if !slot_poll_interval.is_zero() {
        tokio::spawn(run_slot_poller(
            database_url.to_string(),
            slot.to_string(),
            slot_poll_interval,
            health.clone(),
            shutdown.clone(),
        ));
    }
    health
}

/// Installs the recorder and serves `/metrics`, `/healthz` and `/readyz` on `addr` (unless
/// `None`) until `shutdown`, in either mode. Returns the health behind `/readyz`.
pub fn start_endpoints(addr: Option<SocketAddr>, shutdown: &CancellationToken) -> Health {
    let health = Health::new();
    let metrics = recorder();
    if let Some(addr) = addr {
        let endpoints = Endpoints {
            metrics,
            health: health.clone(),
        };
        tokio::spawn(serve_on(addr, endpoints, shutdown.clone()));
    }
    health
}

/// Fetches `path` from a running relay's endpoints (for `status`): the status code and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&response).into_owned())
    };
    let response = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in 5 s"))??;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "not HTTP"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_reasons_have_precedence() {
        let health = Health::new();
        assert_eq!(health.readiness(), Err(NotReady::Starting));
        health.set_ready();
        assert_eq!(health.readiness(), Ok(()));
        health.set_stuck(Some("m1"));
        assert_eq!(
            health.readiness().unwrap_err().to_string(),
            "stuck message m1"
        );
        health.set_heartbeat_stale(true);
        assert_eq!(health.readiness(), Err(NotReady::NoHeartbeat));
        health.set_broker_blocked(true);
        assert_eq!(health.readiness(), Err(NotReady::BrokerBlocked));
        health.set_not_ready(NotReady::Standby);
        assert_eq!(health.readiness().unwrap_err().to_string(), "standby");
        health.set_slot_lost(true);
        assert_eq!(health.readiness().unwrap_err().to_string(), "slot lost");
        health.set_slot_lost(false);
        health.set_ready();
        health.set_broker_blocked(false);
        health.set_heartbeat_stale(false);
        health.set_stuck(None);
        assert_eq!(health.readiness(), Ok(()));
    }

    #[test]
    fn polling_is_ready_while_one_worker_is_up() {
        let health = Health::new();
        let workers = WorkerHealth::new(health.clone(), 3);
        assert_eq!(health.readiness(), Err(NotReady::Starting));
        workers.set(0, WorkerState::Down(NotReady::DatabaseDown));
        assert_eq!(health.readiness(), Err(NotReady::DatabaseDown));
        workers.set(1, WorkerState::Up { blocked: false });
        assert_eq!(health.readiness(), Ok(()));
        workers.set(1, WorkerState::Up { blocked: true });
        assert_eq!(health.readiness(), Err(NotReady::BrokerBlocked));
        // An alarm blocks every publisher: an idle peer is blocked at its next publish.
        workers.set(2, WorkerState::Up { blocked: false });
        assert_eq!(health.readiness(), Err(NotReady::BrokerBlocked));
        workers.set(1, WorkerState::Up { blocked: false });
        assert_eq!(health.readiness(), Ok(()));
        for worker in 0..3 {
            workers.set(worker, WorkerState::Down(NotReady::BrokerDown));
        }
        assert_eq!(health.readiness().unwrap_err().to_string(), "broker down");
        workers.set(0, WorkerState::Up { blocked: false });
        assert_eq!(health.readiness(), Ok(()));
    }

    #[test]
    fn batch_confirms_count_what_the_broker_answered() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let m = RelayMetrics::new();
            m.in_flight.increment(10.0);
            m.record_batch_confirms(10, 0, &Ok(()));
            m.in_flight.increment(5.0);
            let nacked = Err(RelayError::Nacked {
                message_id: "x".into(),
            });
            // Two confirmed, the third nacked, two still waiting.
            m.record_batch_confirms(5, 2, &nacked);
        });
        let text = handle.render();
        for expected in [
            "outbox_relay_messages_confirmed_total 12",
            "outbox_relay_messages_nacked_total 1",
            "outbox_relay_messages_in_flight 0",
        ] {
            assert!(text.contains(expected), "{expected} in:\n{text}");
        }
    }

    #[test]
    fn stuck_clock_keeps_running_for_the_same_message() {
        let health = Health::new();
        health.set_stuck(Some("m1"));
        let first = health.lock().stuck.as_ref().map(|(_, t)| *t);
        health.set_stuck(Some("m1"));
        assert_eq!(health.lock().stuck.as_ref().map(|(_, t)| *t), first);
        health.set_stuck(Some("m2"));
        assert_eq!(health.stuck().as_deref(), Some("m2"));
    }

    #[test]
    fn acknowledged_commit_time_survives_keepalive_acks() {
        let health = Health::new();
        assert_eq!(health.acknowledged_commit_time(), None);
        let t = pg_timestamp(1_000_000);
        health.record_acknowledged(100, Some(t));
        health.record_acknowledged(200, None);
        assert_eq!(
            health.acknowledged(),
            Some(Acknowledged {
                lsn: 200,
                commit_time: Some(t)
            })
        );
    }

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
    fn failures_map_to_reasons() {
        let returned = RelayError::Returned {
            message_id: "abc".into(),
            exchange: "x".into(),
            routing_key: "k".into(),
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
        };
        assert_eq!(NotReady::after(&returned).to_string(), "stuck message abc");
        let standby = RelayError::SlotInUse {
            slot: "s".into(),
            pid: "1".into(),
        };
        assert_eq!(NotReady::after(&standby), NotReady::Standby);
        let broker_timeout = RelayError::ConnectTimeout {
            what: crate::publish::RABBITMQ,
            seconds: 15,
        };
        assert_eq!(NotReady::after(&broker_timeout), NotReady::BrokerDown);
        let database_timeout = RelayError::ConnectTimeout {
            what: "PostgreSQL",
            seconds: 15,
        };
        assert_eq!(NotReady::after(&database_timeout), NotReady::DatabaseDown);
    }

    async fn get(addr: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        response
    }

    #[tokio::test]
    async fn endpoints_answer_over_http() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let health = Health::new();
        let endpoints = Endpoints {
            metrics: PrometheusBuilder::new().build_recorder().handle(),
            health: health.clone(),
        };
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, endpoints, shutdown.clone()));

        let response = get(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(response.ends_with("\r\n\r\nok\n"), "{response}");

        let response = get(addr, "GET /readyz HTTP/1.1\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 503 "), "{response}");
        assert!(response.ends_with("\r\n\r\nstarting\n"), "{response}");
        health.set_ready();
        let (status, body) = http_get(addr, "/readyz").await.expect("get");
        assert_eq!((status, body.as_str()), (200, "ready\n"));

        let response = get(addr, "GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(response.contains("text/plain; version=0.0.4"), "{response}");

        let response = get(addr, "POST /readyz HTTP/1.1\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 405 "), "{response}");
        let response = get(addr, "GET /nothing HTTP/1.1\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 404 "), "{response}");
        let response = get(addr, "HEAD /healthz HTTP/1.1\r\n\r\n").await;
        assert!(
            response.ends_with("\r\n\r\n"),
            "HEAD has no body: {response}"
        );

        shutdown.cancel();
        server.await.expect("server stops");
    }

    #[test]
    fn every_metric_is_prefixed_and_unique() {
        let names = [
            SLOT_LAG_BYTES,
            SLOT_RETAINED_WAL_BYTES,
            SLOT_WAL_STATUS,
            SLOT_SAFE_WAL_SIZE_BYTES,
            SLOT_ACTIVE,
            SLOT_POLLS_TOTAL,
            SLOT_POLL_ERRORS_TOTAL,
            ACKNOWLEDGED_LSN,
            MESSAGES_PUBLISHED_TOTAL,
            MESSAGES_CONFIRMED_TOTAL,
            MESSAGES_NACKED_TOTAL,
            MESSAGES_RETURNED_TOTAL,
            MESSAGES_IN_FLIGHT,
            COMMIT_TO_CONFIRM_SECONDS,
            HEARTBEAT_LAG_SECONDS,
            BLOCKED_ON_MESSAGE_SECONDS,
            RECONNECTS_TOTAL,
            CLEANUP_DELETED_ROWS_TOTAL,
            STANDBY,
            BROKER_BLOCKED,
            READY,
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
        let dashboard = include_str!("../docs/grafana-dashboard.json");
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
