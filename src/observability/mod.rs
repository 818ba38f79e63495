//! What an operator watches, split by concern:
//! - [`metrics`]: every metric name (a constant, described once), the Prometheus recorder
//!   and the handles the hot paths resolve once;
//! - [`health`]: the state behind `/readyz` and the gauges computed at scrape time;
//! - [`http`]: the `/metrics`, `/healthz` and `/readyz` endpoints (axum on hyper, with a
//!   connection limit) and the small client `status` asks them with.
//!
//! The slot's numbers come from PostgreSQL, read by the slot poller in [`crate::wal::slot`];
//! [`start`] wires it up with the endpoints for `run`. This module reports on the relay: it
//! must never decide anything the delivery depends on, and a failure here (a port that
//! cannot be bound, a scrape that fails) never stops the relay.
//!
//! Everything is re-exported here, so callers name `crate::observability::X` whichever file
//! holds it.

pub mod health;
pub mod http;
pub mod metrics;

use std::net::SocketAddr;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use self::health::*;
pub use self::http::*;
pub use self::metrics::*;
use crate::wal::slot::run_slot_poller;

/// Starts what `run` serves besides delivering: the HTTP endpoints (unless `addr` is
/// `None`) and the slot poller, both stopping with `shutdown`. Returns the process's health.
pub fn start(
    addr: Option<SocketAddr>,
    database_url: &str,
    slot: &str,
    slot_poll_interval: Duration,
    shutdown: &CancellationToken,
) -> Health {
    let health = start_endpoints(addr, "run", shutdown);
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
