//! outbox-inbox: the consumer's side of the outbox. The relay delivers every row at least
//! once; an inbox in the consumer's database makes applying each message effectively once.
//!
//! - `sql`: the inbox table, the claim and cleanup functions (the recipe any language can
//!   use: sql/inbox.sql is its rendering), and `setup`.
//! - `message`: a delivery as the inbox reads it (message_id, `x-outbox-seq`,
//!   `x-aggregate-id`); a delivery without a message_id is refused.
//! - `effect`: what applying a message does, inside the claiming transaction; `SqlEffect`
//!   runs a statement the user gives.
//! - `consumer`: the reference consumer (claim, effect, commit, then ack), with prefetch,
//!   lanes per aggregate and reconnects; `consumer::run` sets the process's peer and
//!   statement timeouts (`outbox_common::liveness`) from its config before it connects, so a
//!   vanished replica or a statement that waits costs seconds, for a library user as for the
//!   binary.
//! - `cleanup`: retention in bounded batches, each consumer name's window counted from its
//!   own newest row, every interval on outbox-common's periodic runner.
//! - `cli` and `commands`: the `outbox-inbox` binary's flags and commands; `failpoint` opens
//!   the commit-to-ack crash window for the tests.
//!
//! It shares with the relay, through outbox-common, what must be the same on both sides
//! (PostgreSQL and AMQP connections, their TLS policy and liveness, identifier quoting,
//! duration syntax, the header names of the message contract, logging, the periodic runner,
//! failpoints), and depends on the relay not at all: neither build holds the other.

#![forbid(unsafe_code)]

pub mod cleanup;
pub mod cli;
pub mod commands;
pub mod consumer;
pub mod effect;
pub mod error;
pub mod failpoint;
pub mod message;
pub mod sql;

use error::{BoxError, InboxError};

/// What the consumer's PostgreSQL sessions are called in `pg_stat_activity`, unless the
/// database URL names them (`application_name=`).
pub const APPLICATION_NAME: &str = "outbox-inbox";

/// A connection to the consumer's database, with the relay's TLS policy and timeouts.
pub(crate) async fn connect(url: &str) -> Result<tokio_postgres::Client, InboxError> {
    outbox_common::pg::connect(url).await.map_err(connect_error)
}

/// A connection that could not be opened, as the inbox's (retryable) error.
pub(crate) fn connect_error(error: outbox_common::pg::PgError) -> InboxError {
    InboxError::DatabaseConnect(BoxError::from(error))
}
