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

pub(crate) mod health;
pub(crate) mod http;
pub mod metrics;

pub(crate) use self::health::{Health, NotReady, StandbyWait, WorkerHealth, WorkerState};
pub(crate) use self::http::{http_get, start_endpoints};
pub(crate) use self::metrics::{
    count_reconnect, label_every_metric_with_shard, pg_timestamp, PollMetrics, RelayMetrics,
    StreamMetrics, BACKLOG_POLL_ERRORS_TOTAL, BACKLOG_ROWS, CLEANUP_DELETED_ROWS_TOTAL,
    DEAD_LETTERED_TOTAL, FAILOVER_READY, HOST_LABEL, INVALIDATION_REASONS,
    OLDEST_UNSENT_AGE_SECONDS, PHANTOM_EVENTS_LABEL, POSTGRES_FAILOVERS_TOTAL, POSTGRES_INFO,
    REASON_LABEL, SESSIONS_TOTAL, SLOT_ACTIVE, SLOT_CONFLICTING, SLOT_FAILOVER,
    SLOT_INACTIVE_SINCE_SECONDS, SLOT_INVALIDATION_REASON, SLOT_LABEL, SLOT_LAG_BYTES,
    SLOT_POLLS_TOTAL, SLOT_POLL_ERRORS_TOTAL, SLOT_RECOVERIES_TOTAL, SLOT_RETAINED_WAL_BYTES,
    SLOT_SAFE_WAL_SIZE_BYTES, SLOT_SYNCED, SLOT_WAL_STATUS, STATUS_LABEL, STREAM_SKIPPED_TOTAL,
    WAITING_FOR_STANDBY, WAL_STATUSES,
};
