//! The boundary between the sources of messages and their delivery: what a source hands
//! delivery, in terms of the message contract, not of any broker client.
//!
//! ```text
//!  WAL source, poll worker, resync ── Message ───────────▶ publish/ (delivery)
//!   (mapper.rs, emit.rs, salvage.rs) └─ Unpublishable ───▶   halt or dead-letter: delivery's call
//! ```
//!
//! A source turns a row (or an emitted event) into either a [`Message`], ready to publish, or
//! an [`Unpublishable`]: what could be read of it and why it cannot be published. It never
//! decides what happens to an unpublishable one; only delivery applies the policy
//! (`--on-unroutable halt|dead-letter`), in stream order. Only the broker's start
//! (`publish/broker.rs`, with `publish/outgoing.rs`) turns a `Message` into the AMQP client's
//! types: delivery, its queue and dead letters, like every source, handle `Message`s.
//!
//! Pure data.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;

use crate::contract::position::Position;
use crate::error::MapProblem;

/// One message of the contract (docs/architecture.md, "The message contract"), ready to
/// publish. Every message the relay publishes is persistent and mandatory: that is the
/// broker side's business, not a field here.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// `message_id`: consumers deduplicate on it.
    pub message_id: String,
    pub exchange: String,
    pub routing_key: String,
    /// The AMQP `type` (the event type); `None` only for what an unpublishable row lacked.
    pub event_type: Option<String>,
    /// The contract's own are static; a message the broker returned carries the one it
    /// hands back.
    pub content_type: Option<Cow<'static, str>>,
    /// The AMQP `timestamp`: Unix seconds.
    pub timestamp: Option<u64>,
    /// The message's own headers and the relay's, in the order they were added.
    pub headers: Headers,
    pub body: Bytes,
    /// Where the row was in the slot's stream (WAL mode): a stream destination's publishing
    /// id. `None` for what polling and resync publish.
    pub position: Option<Position>,
}

impl Message {
    /// The value of header `name`, if it has one.
    pub fn header(&self, name: &str) -> Option<&HeaderValue> {
        self.headers
            .iter()
            .rev()
            .find(|(header, _)| header == name)
            .map(|(_, value)| value)
    }

    /// Sets header `name`, replacing a value it had.
    pub fn set_header(&mut self, name: &str, value: HeaderValue) {
        self.headers.retain(|(header, _)| header != name);
        self.headers.push((name.to_string(), value));
    }
}

/// A message's headers, in the order they were added.
pub(crate) type Headers = Vec<(String, HeaderValue)>;

/// AMQP's limit for a short string (the exchange, routing key, message id, type and header
/// names): the contract checks it, so that a row over it is named like any other mapping
/// error rather than failing at the broker.
pub(crate) const MAX_SHORT_TEXT: usize = 255;

/// A header's value: what a JSON object of headers can hold (nested values travel as their
/// JSON text).
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderValue {
    Text(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl From<&str> for HeaderValue {
    fn from(text: &str) -> Self {
        HeaderValue::Text(text.to_string())
    }
}

impl From<String> for HeaderValue {
    fn from(text: String) -> Self {
        HeaderValue::Text(text)
    }
}

/// A row or emitted event that cannot be published as it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Unpublishable {
    /// What could be read of it: its id, destination, stream headers, and body when within
    /// the size limit. `None` when nothing identifies it (no readable id): a dead letter
    /// without an id could not be told apart, so it always stops the relay.
    pub original: Option<Message>,
    pub rejection: Rejection,
    /// The row's id, when readable.
    pub message_id: Option<String>,
    /// What stops the relay under the halt policy: names the row and what is wrong with it.
    pub problem: String,
    /// What kind of problem that is, for the advice on it.
    pub fault: MapProblem,
}

/// Why a source could not build a message: the text a dead letter carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Its body is over the broker's limit (checked before publishing).
    TooLarge { size: usize, limit: usize },
    /// The row cannot be turned into a message (what is wrong with it, without advice).
    Unmappable { error: String },
    /// The row names an exchange `--allowed-exchanges` does not allow.
    ExchangeNotAllowed { exchange: String },
}

impl Rejection {
    /// The `reason` label of the dead-lettered metric.
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::TooLarge { .. } => "too_large",
            Rejection::Unmappable { .. } => "unmappable",
            Rejection::ExchangeNotAllowed { .. } => "exchange_not_allowed",
        }
    }
}

/// The text of a dead letter's reason header (never any payload).
impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::TooLarge { size, limit } => {
                write!(f, "too large: {size} bytes > limit {limit}")
            }
            Rejection::Unmappable { error } => write!(f, "unmappable: {error}"),
            Rejection::ExchangeNotAllowed { exchange } => {
                write!(f, "exchange not allowed: {exchange}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_set_again_replaces_the_old_value() {
        let mut message = Message {
            message_id: "m".into(),
            exchange: "outbox".into(),
            routing_key: "k".into(),
            event_type: None,
            content_type: None,
            timestamp: None,
            headers: vec![("a".into(), HeaderValue::Int(1))],
            body: Bytes::new(),
            position: None,
        };
        message.set_header("a", "two".into());
        assert_eq!(message.header("a"), Some(&HeaderValue::Text("two".into())));
        assert_eq!(message.headers.len(), 1);
    }
}
