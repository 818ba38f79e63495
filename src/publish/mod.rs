//! The delivery side: everything that talks to RabbitMQ.
//!
//! Open the files in this order: [`nodes`] (the RabbitMQ nodes `AMQP_URL` names and which
//! to try first), [`open_connection`] (how a connection's socket and heartbeat are set up:
//! outbox_common::amqp, shared with the inbox), [`publisher`] (what delivery needs of a
//! broker, in the message contract's terms), [`broker`] (the lapin connection, the confirm-mode channel, a publish's stages), then
//! [`queue`] (the pure in-order confirm queue, generic over the token its source
//! acknowledges with), [`delivery`] (the task that publishes under the in-flight window,
//! awaits confirms in order and reports the acknowledged token), [`dead_letter`] (what goes
//! to the dead-letter exchange, and why). `testing` (test builds only) is a stand-in broker
//! that answers when a test says so.
//!
//! A message of the contract becomes lapin's types in one place: the broker's
//! `Publisher::start` (and `start_dead_letter`), with `outgoing.rs`, once per publish; a
//! returned message comes back to the contract's terms there too. Queue, delivery and dead
//! letters never see lapin's types.
//!
//! Every mode feeds the same delivery loop: WAL mode with positions in the slot, polling mode
//! and resync with the end of a batch, the benchmark's broker-alone limit with nothing. This
//! side never touches PostgreSQL: a source learns what was delivered only from the token the
//! delivery hands back.

pub(crate) mod broker;
pub(crate) mod dead_letter;
pub(crate) mod delivery;
pub(crate) mod destination;
pub(crate) mod nodes;
mod outgoing;
pub(crate) mod publisher;
pub(crate) mod queue;
pub(crate) mod stream;
#[cfg(test)]
pub(crate) mod testing;

pub use broker::Broker;
pub(crate) use delivery::{deliver, deliver_batch, Acked, DeliveryOptions, Input};
pub(crate) use destination::Destination;
pub use nodes::BrokerNodes;
pub(crate) use publisher::Publisher;
pub(crate) use queue::AckToken;
