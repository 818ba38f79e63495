//! outbox-common: what the relay and the consumers' inbox must do the same way, so that
//! neither depends on the other.
//!
//! - `liveness`: how every connection notices a peer that vanished (`--peer-timeout`), the
//!   process's policy that every connection reads where it is opened.
//! - `pg`: ordinary PostgreSQL connections (the URL, TLS by libpq's `sslmode`, connect
//!   timeouts, the primary among several hosts) and their errors.
//! - `amqp`: opening a RabbitMQ connection under that policy (the only module that names
//!   lapin).
//! - `backoff`: delays between reconnect attempts; `periodic`: a job on a timer with a
//!   connection of its own (pollers, cleanups), generic over its error.
//! - `duration`: the duration syntax of every flag.
//! - `quote`: SQL identifiers and literals; `error::chain`: an error and its sources on one
//!   log line.
//! - `headers`: the names of the message contract's headers, written by the relay and read
//!   by the consumer.
//! - `logging`: the log format, logging on stderr, and the shutdown signals.
//! - `failpoint`: crash windows for the fault tests, compiled in only with the `failpoints`
//!   feature.
//!
//! It depends on neither binary's crate: both depend on it.

#![forbid(unsafe_code)]

pub mod amqp;
pub mod backoff;
pub mod duration;
pub mod error;
pub mod failpoint;
pub mod headers;
pub mod liveness;
pub mod logging;
pub mod periodic;
pub mod pg;
pub mod quote;
