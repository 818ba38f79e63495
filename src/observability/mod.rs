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
//! Everything is re-exported here, so callers name `crate::observability::X` whichever file
//! holds it.

pub mod health;
pub mod http;
pub mod metrics;

pub use self::health::*;
pub use self::http::*;
pub use self::metrics::*;
