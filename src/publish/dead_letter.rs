//! The dead-letter policy (`--on-unroutable dead-letter`): what goes to the dead-letter
//! exchange, with which headers, and why.
//!
//! A message is dead-lettered when the broker returns it as unroutable (basic.return of a
//! mandatory publish), or when its source could not make it publishable (over
//! `--max-message-size`, or a row the mapper rejects: a `crate::contract::message::Unpublishable`). It goes to the dead-letter exchange
//! with the reason in headers, and only once the broker CONFIRMS that publish is the
//! original settled: its position may then be acknowledged like a delivered one. A dead
//! letter the broker cannot route either stops the pipeline (halt), naming the exchange.
//!
//! Pure: building the messages. Publishing them is `publish/delivery`, ordering them
//! `publish/queue`. The only place that decides a message is dead-lettered rather than
//! stopping the relay is `publish/delivery`: sources only say why they could not publish.

use std::fmt;

use bytes::Bytes;
use lapin::types::{AMQPValue, LongString, ShortString};
use lapin::BasicProperties;

use super::outgoing::Outgoing;
use crate::contract::message::Rejection;

/// Headers a dead letter carries on top of the message's own (`x-outbox-lsn`, `x-outbox-seq`,
/// the row's headers).
pub mod headers {
    /// Why it was dead-lettered, e.g. `unroutable: NO_ROUTE 312 exchange=outbox
    /// routing_key=OrderCreated`, `too large: N bytes > limit L`, `unmappable: <error>`.
    pub const REASON: &str = "x-outbox-dead-letter-reason";
    /// The exchange the message was meant for.
    pub const ORIGINAL_EXCHANGE: &str = "x-outbox-original-exchange";
    /// The routing key the message was meant to carry.
    pub const ORIGINAL_ROUTING_KEY: &str = "x-outbox-original-routing-key";
    /// The size in bytes of a body that was dropped for being too large.
    pub const ORIGINAL_SIZE: &str = "x-outbox-original-size";
}

/// Why a message went to the dead-letter exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The broker returned it: no queue is bound for its routing key.
    Unroutable {
        reply_code: u16,
        reply_text: String,
        exchange: String,
        routing_key: String,
    },
    /// Its source could not make it publishable (too large, unmappable, exchange not
    /// allowed).
    Rejected(Rejection),
}

impl Reason {
    /// The `reason` label of the dead-lettered metric.
    pub fn label(&self) -> &'static str {
        match self {
            Reason::Unroutable { .. } => "unroutable",
            Reason::Rejected(rejection) => rejection.label(),
        }
    }
}

/// The text of the reason header (never any payload).
impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Unroutable {
                reply_code,
                reply_text,
                exchange,
                routing_key,
            } => write!(
                f,
                "unroutable: {reply_text} {reply_code} exchange={exchange} routing_key={routing_key}"
            ),
            Reason::Rejected(rejection) => rejection.fmt(f),
        }
    }
}

/// What the broker handed back with a basic.return: the message as published.
#[derive(Debug, Clone, PartialEq)]
pub struct ReturnedContent {
    pub properties: BasicProperties,
    pub body: Bytes,
}

/// The dead letter for `original` (a message as it would have been published, or as far as
/// its source could read it): the same id, properties and headers, plus the reason and the
/// original destination, published to `dead_letter_exchange` with the original routing key
/// (a topic exchange can be bound per event type; bind `#` for all).
pub fn dead_letter(
    dead_letter_exchange: &ShortString,
    original: Outgoing,
    reason: &Reason,
) -> Outgoing {
    let Outgoing {
        exchange,
        routing_key,
        properties,
        body,
    } = original;
    let mut table = properties.headers().clone().unwrap_or_default();
    let text = |s: &str| AMQPValue::LongString(LongString::from(s));
    table.insert(headers::REASON.into(), text(&reason.to_string()));
    table.insert(headers::ORIGINAL_EXCHANGE.into(), text(exchange.as_str()));
    table.insert(
        headers::ORIGINAL_ROUTING_KEY.into(),
        text(routing_key.as_str()),
    );
    if let Reason::Rejected(Rejection::TooLarge { size, .. }) = reason {
        table.insert(
            headers::ORIGINAL_SIZE.into(),
            AMQPValue::LongLongInt(i64::try_from(*size).unwrap_or(i64::MAX)),
        );
    }
    // Dead letters are kept like any message: persistent.
    let properties = properties.with_headers(table).with_delivery_mode(2);
    let body = match reason {
        Reason::Rejected(Rejection::TooLarge { .. }) => Bytes::new(),
        _ => body,
    };
    Outgoing {
        exchange: dead_letter_exchange.clone(),
        routing_key,
        properties,
        body,
    }
}

/// The dead letter for a message the broker returned as unroutable, rebuilt from what the
/// return carried.
pub fn for_returned(
    dead_letter_exchange: &ShortString,
    content: ReturnedContent,
    reason: &Reason,
) -> Outgoing {
    let (exchange, routing_key) = match reason {
        Reason::Unroutable {
            exchange,
            routing_key,
            ..
        } => (exchange.as_str(), routing_key.as_str()),
        Reason::Rejected(_) => ("", ""),
    };
    let original = Outgoing {
        // Both came from the broker as short strings: they fit.
        exchange: ShortString::try_new(exchange).unwrap_or_default(),
        routing_key: ShortString::try_new(routing_key).unwrap_or_default(),
        properties: content.properties,
        body: content.body,
    };
    dead_letter(dead_letter_exchange, original, reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::message::{HeaderValue, Message};

    fn header<'a>(message: &'a Outgoing, name: &str) -> Option<&'a AMQPValue> {
        message
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(name))
    }

    fn text(s: &str) -> Option<AMQPValue> {
        Some(AMQPValue::LongString(s.into()))
    }

    fn original() -> Outgoing {
        Outgoing::from_message(Message {
            message_id: "m1".into(),
            exchange: "outbox".into(),
            routing_key: "Nobody".into(),
            event_type: Some("Nobody".into()),
            content_type: None,
            timestamp: None,
            headers: vec![("x-outbox-seq".into(), HeaderValue::Text("0A-01".into()))],
            body: Bytes::from_static(b"{\"a\":1}"),
        })
        .expect("fits AMQP")
    }

    #[test]
    fn unroutable_keeps_the_message_and_names_where_it_was_going() {
        let reason = Reason::Unroutable {
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
            exchange: "outbox".into(),
            routing_key: "Nobody".into(),
        };
        let content = ReturnedContent {
            properties: original().properties,
            body: original().body,
        };
        let dl = for_returned(&"dlx".into(), content, &reason);
        assert_eq!(dl.exchange.as_str(), "dlx");
        assert_eq!(dl.routing_key.as_str(), "Nobody");
        assert_eq!(&dl.body[..], b"{\"a\":1}");
        assert_eq!(
            dl.properties.message_id().as_ref().map(|s| s.as_str()),
            Some("m1")
        );
        assert_eq!(*dl.properties.delivery_mode(), Some(2));
        assert_eq!(
            header(&dl, headers::REASON).cloned(),
            text("unroutable: NO_ROUTE 312 exchange=outbox routing_key=Nobody")
        );
        assert_eq!(
            header(&dl, headers::ORIGINAL_EXCHANGE).cloned(),
            text("outbox")
        );
        assert_eq!(
            header(&dl, headers::ORIGINAL_ROUTING_KEY).cloned(),
            text("Nobody")
        );
        assert_eq!(header(&dl, "x-outbox-seq").cloned(), text("0A-01"));
        assert_eq!(header(&dl, headers::ORIGINAL_SIZE), None);
        assert_eq!(reason.label(), "unroutable");
    }

    #[test]
    fn too_large_drops_the_body_and_records_its_size() {
        let reason = Reason::Rejected(Rejection::TooLarge {
            size: 20_000_000,
            limit: 16_777_216,
        });
        let dl = dead_letter(&"dlx".into(), original(), &reason);
        assert!(dl.body.is_empty());
        assert_eq!(
            header(&dl, headers::ORIGINAL_SIZE),
            Some(&AMQPValue::LongLongInt(20_000_000))
        );
        assert_eq!(
            header(&dl, headers::REASON).cloned(),
            text("too large: 20000000 bytes > limit 16777216")
        );
        assert_eq!(reason.label(), "too_large");
    }

    #[test]
    fn unmappable_carries_the_error() {
        let reason = Reason::Rejected(Rejection::Unmappable {
            error: "column \"event_type\" is NULL".into(),
        });
        let dl = dead_letter(&"dlx".into(), original(), &reason);
        assert_eq!(&dl.body[..], b"{\"a\":1}");
        assert_eq!(
            header(&dl, headers::REASON).cloned(),
            text("unmappable: column \"event_type\" is NULL")
        );
        assert_eq!(reason.label(), "unmappable");
    }

    #[test]
    fn an_exchange_not_allowed_names_it_and_where_it_was_meant_to_go() {
        let reason = Reason::Rejected(Rejection::ExchangeNotAllowed {
            exchange: "billing".into(),
        });
        let mut meant = original();
        meant.exchange = "billing".into();
        let dl = dead_letter(&"dlx".into(), meant, &reason);
        assert_eq!(dl.exchange.as_str(), "dlx");
        assert_eq!(
            header(&dl, headers::REASON).cloned(),
            text("exchange not allowed: billing")
        );
        assert_eq!(
            header(&dl, headers::ORIGINAL_EXCHANGE).cloned(),
            text("billing")
        );
        assert_eq!(reason.label(), "exchange_not_allowed");
    }
}
