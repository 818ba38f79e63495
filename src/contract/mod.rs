//! The message contract: what a row of the outbox table (or an event emitted into the WAL)
//! becomes on the broker, in one place for every way in (WAL mode, polling, resync, the
//! backfill after a lost slot). README.md, "The message contract", is the table: which column
//! becomes which AMQP property or header.
//!
//! ```text
//!  wal/ (pgoutput tuple, logical message)    poll/, ops/resync.rs (rows as text, outbox_table)
//!        │                                          │
//!        ▼                                          ▼
//!  contract/  mapper.rs   row -> Parts ─┐
//!             emit.rs     envelope -> Parts ─┴▶ Mapper::assemble ─▶ Message | Unpublishable
//!             cloudevents.rs  the body under --message-format cloudevents
//!        │
//!        ▼
//!  publish/ (delivery: publishes a Message; halts on, or dead-letters, an Unpublishable)
//! ```
//!
//! A source hands delivery a [`message::Message`], ready to publish, or a
//! [`message::Unpublishable`]: what could be read of it and why it cannot be published (a
//! NULL `id` or `event_type`, a malformed column, a body over `--max-message-size`, an
//! exchange `--allowed-exchanges` does not allow). The contract never makes up a value it
//! requires and never decides what happens to an unpublishable message: that is delivery's
//! policy (`--on-unroutable halt|dead-letter`).
//!
//! Pure and synchronous: no I/O, and no broker client's types (only `publish/` names lapin).
//! Values are parsed in exactly the shapes the pinned session settings produce (`db.rs`).

pub mod cloudevents;
pub mod emit;
pub mod mapper;
pub mod message;
