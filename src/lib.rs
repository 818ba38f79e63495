//! outbox-relay: delivers the rows of a PostgreSQL transactional outbox to RabbitMQ.
//!
//! Follow one row from the slot to the broker by opening the modules in order:
//! `pgoutput` (decode the replication stream), `mapper` (row -> AMQP message), `publish`
//! (the broker connection and the in-order confirm queue), `wal` (the replication session,
//! LSN feedback, and the supervisor that restarts it). `poll` is the other way in: workers
//! that claim rows from the table instead of the slot, sharing the mapper and publisher.
//! `setup` provisions; `config` and `error` hold the flags and the two error classes.
//! `observability` (metrics, `/healthz`, `/readyz`, the slot poller), `cleanup` (deleting
//! delivered rows) and `ops` (`status`, `teardown`, `resync`) are for running it;
//! `failpoint` opens crash windows for the fault tests.

#![forbid(unsafe_code)]

pub mod backoff;
pub mod cleanup;
pub mod config;
pub mod db;
pub mod error;
pub mod failpoint;
pub mod mapper;
pub mod observability;
pub mod ops;
pub mod outbox_table;
pub mod periodic;
pub mod pgoutput;
pub mod poll;
pub mod publish;
pub mod setup;
pub mod wal;

// Where the mapper and the tests found it before it moved to the delivery side.
pub use publish::dead_letter;
