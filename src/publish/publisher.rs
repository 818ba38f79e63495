//! What the delivery loop needs of a broker, and nothing more: the boundary between
//! [`super::delivery`] and the AMQP client ([`super::broker`], on lapin).
//!
//! Shaped like supabase/etl's `Destination`: the loop hands a message over and gets back a
//! pending publish whose answer it awaits later, in order. Everything that crosses is in the
//! message contract's terms: a [`Message`] goes in, an [`Answer`] comes back, and a message
//! the broker returned comes back as a [`Returned`] `Message`. A `Message` becomes lapin's
//! types in one place, the broker's `start` (with `outgoing.rs`), once per publish.
//!
//! Keeping lapin behind it lets the loop's own logic (window, ordering, barriers, returns,
//! nacks, dead letters) be tested in process against a stand-in that answers when a test
//! says so (`publish/testing.rs`), while every integration test runs it against a real
//! RabbitMQ.

use std::future::Future;

use tokio::sync::watch;

use crate::contract::message::Message;
use crate::error::RelayError;

/// The broker side of delivery.
pub trait Publisher: Sync {
    /// A publish in flight: its frames queued, its answer not yet looked at.
    type Pending: Pending;
    /// A [`round_trip`](Self::round_trip) in progress.
    type RoundTrip: Future<Output = Result<(), RelayError>> + Send + Unpin;

    /// Starts publishing `message` (mandatory, persistent). One poll takes its delivery tag
    /// and queues its frames: calling this in input order keeps delivery tags in that order.
    fn start(
        &self,
        message: Message,
    ) -> impl Future<Output = Result<Self::Pending, RelayError>> + Send;

    /// Starts publishing a dead letter on a channel of its own, whose answers come back in
    /// the order its publishes were started (a return rides on a confirm of that channel).
    /// Only while [`dead_letter_exchange`](Self::dead_letter_exchange) is `Some`.
    fn start_dead_letter(
        &self,
        message: Message,
    ) -> impl Future<Output = Result<Self::Pending, RelayError>> + Send;

    /// Where dead letters go: `Some` under the dead-letter policy, `None` under halt.
    fn dead_letter_exchange(&self) -> Option<&str>;

    /// A request the broker answers after every frame that arrived before it was sent (the
    /// confirm barrier's witness).
    fn round_trip(&self) -> Self::RoundTrip;

    /// `true` while the broker blocks publishing (memory or disk alarm).
    fn blocked(&self) -> watch::Receiver<bool>;

    /// Whether the broker has `exchange` (a round trip the first time a connection asks):
    /// a publish to a missing one would make the broker close the publishing channel.
    fn exchange_exists(
        &self,
        exchange: &str,
    ) -> impl Future<Output = Result<bool, RelayError>> + Send;

    /// A new publishing channel in place of one the broker closed. Only while nothing is in
    /// flight on it: the old channel's answers are gone.
    fn reopen(&self) -> impl Future<Output = Result<(), RelayError>> + Send;

    /// The largest body the broker takes, once it named it by refusing a larger one.
    fn max_message_size(&self) -> Option<usize>;

    /// The broker refused a body over `limit` bytes (its 406 said so).
    fn learn_max_message_size(&self, limit: usize);
}

/// A publish awaiting the broker's answer.
pub trait Pending: Send {
    /// The broker's answer. Cancel-safe: progress is kept in `self`, so it can be polled
    /// again after a `select!` dropped it.
    fn answer(&mut self) -> impl Future<Output = Result<Answer, RelayError>> + Send + '_;
}

/// What the broker said of one publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// Ack (true) or nack (false).
    pub acked: bool,
    /// A return that rode on this answer. It may be of ANOTHER publish: AMQP 0-9-1's
    /// basic.return carries no delivery tag, and lapin hands a waiting return to whichever
    /// confirm it resolves next (docs/architecture.md, "Returns and the confirm barrier").
    pub returned: Option<Returned>,
}

/// A message the broker returned as unroutable (basic.return), as it was published: its
/// `message_id` names the publish it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct Returned {
    pub message: Message,
    pub reply_code: u16,
    pub reply_text: String,
}
