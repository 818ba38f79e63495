//! The message contract: what a row of the outbox table (or an event emitted into the WAL)
//! becomes on the broker, in one place for every way in (WAL mode, polling, resync, the
//! backfill after a lost slot). docs/consumers.md, "The message contract", is the table: which
//! column becomes which AMQP property or header.
//!
//! ```text
//!  wal/ (decoded rows, logical messages)      poll/, ops/resync.rs (rows read as text)
//!        │                                            │
//!        ▼                                            ▼
//!  contract/  mapper.rs  a row, by its Layout ──────────┐
//!             emit.rs    an emitted event's envelope ───┴─▶ Mapper::assemble ─▶ Message
//!             salvage.rs what could be read of a rejected one ──────────────▶ Unpublishable
//!        │    message.rs: Message | Unpublishable, what delivery is handed
//!        ▼
//!  publish/ (delivery: publishes a Message; halts on, or dead-letters, an Unpublishable)
//! ```
//!
//! Beside them: columns.rs, the contract's column names and which of the table's columns
//! holds each (`--table-layout`, `--column`); headers.rs, the headers the relay adds and a
//! row's stream position; row_error.rs, why a row cannot be mapped, naming the row and column;
//! pg_text.rs, PostgreSQL's text forms (bytea, uuid, timestamptz) and a JSON object of
//! headers; cloudevents.rs, the body under `--message-format cloudevents`; template.rs, an
//! exchange named by a template over the contract's fields (`events.{aggregate_type}`);
//! trace_context.rs, the W3C trace context a row carries into `traceparent`.
//!
//! A source hands delivery a [`message::Message`], ready to publish, or a
//! [`message::Unpublishable`]: what could be read of it and why it cannot be published (a
//! NULL `id` or `event_type`, a malformed column, a body over `--max-message-size`, an
//! exchange `--allowed-exchanges` does not allow). The contract never makes up a value it
//! requires and never decides what happens to an unpublishable message: that is delivery's
//! policy (`--on-unroutable halt|dead-letter`).
//!
//! Pure and synchronous: no I/O, and no broker client's types (only the broker's files in
//! `publish/` name lapin).
//! Values are parsed in exactly the shapes the pinned session settings produce (`db.rs`).

pub(crate) mod cloudevents;
/// Column names of the outbox table (docs/consumers.md, "The message contract") and the map
/// to a table of another design.
pub(crate) mod columns;
pub(crate) mod emit;
#[cfg(test)]
mod fixtures;
pub(crate) mod headers;
pub(crate) mod mapper;
pub(crate) mod message;
pub(crate) mod pg_text;
pub(crate) mod position;
pub(crate) mod row_error;
pub(crate) mod salvage;
pub(crate) mod template;
pub(crate) mod trace_context;
