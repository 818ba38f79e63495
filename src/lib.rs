//! outbox-relay: delivers the rows of a PostgreSQL transactional outbox to RabbitMQ.
//!
//! Follow one row from the slot to the broker by opening the modules in order (WAL mode):
//!
//! 1. `wal` — the PostgreSQL side. `wal::stream` owns the replication client: it reads the
//!    stream and tells PostgreSQL the acknowledged position, nothing else. `wal::source` turns
//!    each event into a delivery input, using `pgoutput` (the decoder), `wal::relations` (the
//!    relation cache) and `contract` (row -> message: the message contract); `wal::position`
//!    is the token a position is acknowledged with. `wal::session` wires one session; `wal`
//!    (mod) restarts it.
//! 2. `publish` — the delivery side. `publish::delivery` publishes under the in-flight window
//!    on `publish::broker`'s channel, awaits confirms in order through `publish::queue`, sends
//!    returned rows to `publish::dead_letter` when asked, and hands back "acknowledged up to
//!    token T" — to the stream reader in WAL mode.
//!
//! `poll` is the other way in: workers that claim rows from the table (`table::outbox` reads
//! its columns) and hand each batch to the same delivery loop; `ops::resync` does the same
//! for a time range (`table::backfill`). `catalog` reads what PostgreSQL holds of the relay's
//! objects (the slot, the preflight checks) for sessions, `setup` and `ops` alike. `setup`
//! provisions; `config` and `error` hold the flags and the error classes (retry, standby,
//! stop); `db` the connections and their pinned settings; `outbox_common::liveness` how every
//! connection notices a peer that vanished (`--peer-timeout`). `observability` (metrics,
//! health, the HTTP endpoints), `outbox_common::periodic` (timed database jobs: the slot and
//! backlog pollers, both cleanups), `wal::cleanup` (deleting delivered rows) and `ops`
//! (`status`, `teardown`, `resync`, `check`) are for running it; `exit` the exit codes;
//! `failpoint` opens crash windows for the fault tests.
//!
//! The library must never hold `unsafe` code (forbidden below), and never depends on the
//! benchmark or the test kit in crates/: they depend on it (or run its binary), not the
//! reverse, so the product's build and image leave them out.

#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

/// `println!` that never panics: with stdout closed (`status | head -1`) the rest of the
/// report is lost, not the exit code. The commands print their reports with it.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// [`outln`] without the newline.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout().lock(), $($arg)*);
    }};
}

mod advice;
mod assembly;
mod catalog;
pub mod commands;
mod config;
mod contract;
mod db;
mod error;
pub mod exit;
mod failpoint;
// The fuzz targets' checks (fuzz/): test builds and the `fuzzing` feature only.
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod observability;
mod ops;
mod pgoutput;
mod poll;
mod publish;
mod setup;
mod shard;
mod supervisor;
mod table;
mod wal;

/// Every metric the relay exports, by name (docs/metrics.md): for dashboards, alerts and tests.
pub use observability::metrics;

/// The parts the benchmark (crates/outbox-bench) and the integration tests drive in their own
/// process: the delivery loop, the decoder, the mapper, the table's SQL. Named one by one; not
/// a stable API.
pub mod internals {
    pub use crate::catalog::preflight::outbox_table;
    pub use crate::config::cli::{DEFAULT_POLL_BATCH_SIZE, DEFAULT_POLL_WORKERS};
    pub use crate::config::modes::OnPublished;
    pub use crate::config::names::{OutboxNames, TableName};
    pub use crate::contract::columns::ColumnMap;
    pub use crate::contract::mapper::{AllowedExchanges, Layout, Mapper};
    pub use crate::contract::message::Message;
    pub use crate::contract::position::Position;
    pub use crate::db::{connect, connect_to, parse_url, primary, replication_config};
    pub use crate::observability::metrics::RelayMetrics;
    pub use crate::pgoutput::{decode, Column, LogicalMessage, Relation, Tuple, TupleValue};
    pub use crate::publish::broker::Outgoing;
    pub use crate::publish::delivery::{deliver, Acked, DeliveryOptions, Input};
    pub use crate::publish::{Broker, BrokerNodes};
    pub use crate::setup::{poll_script, publication_step, table_step};
    pub use crate::table::polling::OutboxTable;
    pub use crate::wal::cleanup::{delete_batch, delete_sql};
    pub use crate::wal::relations::{Known, RelationCache};
    pub use crate::wal::session::CLIENT_EVENT_BUFFER;
}
