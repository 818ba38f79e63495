//! What an operator watches, split by concern:
//! - [`metrics`]: every metric name (a constant, described once), the Prometheus recorder
//!   and the handles the hot paths resolve once;
//! - [`health`]: the state behind `/readyz` and the gauges computed at scrape time;
//! - [`http`]: the `/metrics`, `/healthz` and `/readyz` endpoints (axum on hyper, with a
//!   connection limit) and the small client `status` asks them with.
//!
//! The slot's numbers come from PostgreSQL, read by the slot poller in `crate::catalog::slot`,
//! which `run` starts beside the endpoints. This module reports on the relay: it must never
//! decide anything the delivery depends on, and a failure here (a port that cannot be bound,
//! a scrape that fails) never stops the relay.
//!
//! What callers use is re-exported here by name, so they name `crate::observability::X`
//! whichever file holds it.

pub mod health;
pub mod http;
pub mod metrics;

pub use self::health::{Acknowledged, Health, NotReady, StandbyWait, WorkerHealth, WorkerState};
pub use self::http::{http_get, serve, serve_on, start_endpoints, Endpoints, MAX_CONNECTIONS};
pub use self::metrics::{
    count_reconnect, describe, label_every_metric_with_shard, pg_timestamp, recorder,
    register_mode, set_build_info, update_process_metrics, PollMetrics, RelayMetrics,
    StreamMetrics, ACKNOWLEDGED_LSN, ACK_POINTS_QUEUED, BACKLOG_POLL_ERRORS_TOTAL, BACKLOG_ROWS,
    BLOCKED_ON_MESSAGE_SECONDS, BROKER_BLOCKED, BROKER_INFO, BUILD_INFO, CAUSE_LABEL,
    CLEANUP_DELETED_ROWS_TOTAL, COMMIT_TO_CONFIRM_SECONDS, DEAD_LETTERED_TOTAL,
    DEAD_LETTER_REASONS, DECODED_MESSAGES_TOTAL, EMPTY_POLLS_TOTAL, FAILOVER_READY, HEADER_LABEL,
    HEARTBEAT_LAG_SECONDS, HOST_LABEL, IGNORED_LOGICAL_MESSAGES_TOTAL, INVALIDATION_REASONS,
    MESSAGES_CONFIRMED_TOTAL, MESSAGES_IN_FLIGHT, MESSAGES_NACKED_TOTAL, MESSAGES_PUBLISHED_TOTAL,
    MESSAGES_RETURNED_TOTAL, MODE_LABEL, NODE_LABEL, NOTIFICATIONS_TOTAL,
    OLDEST_UNSENT_AGE_SECONDS, PHANTOM_EVENTS_LABEL, POLLS_TOTAL, POLL_BATCH_ROWS,
    POLL_BATCH_SECONDS, POSTGRES_FAILOVERS_TOTAL, POSTGRES_INFO, READY, REASON_LABEL,
    RECONNECTS_TOTAL, SESSIONS_TOTAL, SHARD_LABEL, SLOT_ACTIVE, SLOT_CONFLICTING, SLOT_FAILOVER,
    SLOT_INACTIVE_SINCE_SECONDS, SLOT_INVALIDATION_REASON, SLOT_LABEL, SLOT_LAG_BYTES,
    SLOT_POLLS_TOTAL, SLOT_POLL_ERRORS_TOTAL, SLOT_RECOVERIES_TOTAL, SLOT_RETAINED_WAL_BYTES,
    SLOT_SAFE_WAL_SIZE_BYTES, SLOT_SYNCED, SLOT_WAL_STATUS, SOURCES, SOURCE_LABEL, STANDBY,
    STATUS_LABEL, STREAM_SKIPPED_TOTAL, TRACE_CONTEXT_DROPPED_TOTAL, TRACE_HEADERS, VERSION_LABEL,
    WAITING_FOR_STANDBY, WAL_STATUSES,
};
