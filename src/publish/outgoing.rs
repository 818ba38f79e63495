//! A message of the contract in lapin's terms, and back: the broker's translation, used by
//! `broker.rs` alone. [`Outgoing::from_message`] runs once per publish, in the broker's
//! `start`; [`Outgoing::into_message`] only for a message the broker returned.

use std::borrow::Cow;

use bytes::Bytes;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;

use crate::contract::message::{HeaderValue, Headers, Message};
use crate::error::RelayError;

/// A message in lapin's terms, ready for `basic_publish`.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    pub exchange: ShortString,
    pub routing_key: ShortString,
    pub properties: BasicProperties,
    pub body: Bytes,
}

impl Outgoing {
    /// The AMQP form of `message`: persistent, its headers as a table (a name set twice
    /// keeps its last value). The mapper checked every short string against AMQP's limit:
    /// one over it here is a bug, not a message to publish cut short.
    pub fn from_message(message: Message) -> Result<Outgoing, RelayError> {
        let short = |text: String| {
            ShortString::try_new(text)
                .map_err(|e| RelayError::Bug(format!("a message reached the broker with {e}")))
        };
        let mut table = FieldTable::default();
        for (name, value) in message.headers {
            let value = match value {
                HeaderValue::Text(text) => AMQPValue::LongString(LongString::from(text)),
                HeaderValue::Int(i) => AMQPValue::LongLongInt(i),
                HeaderValue::Float(f) => AMQPValue::Double(f),
                HeaderValue::Bool(b) => AMQPValue::Boolean(b),
            };
            table.insert(short(name)?, value);
        }
        let mut properties = BasicProperties::default()
            .with_message_id(short(message.message_id)?)
            .with_delivery_mode(2)
            .with_headers(table);
        if let Some(event_type) = message.event_type {
            properties = properties.with_type(short(event_type)?);
        }
        if let Some(content_type) = message.content_type {
            properties = properties.with_content_type(short(content_type.into_owned())?);
        }
        if let Some(seconds) = message.timestamp {
            properties = properties.with_timestamp(seconds);
        }
        Ok(Outgoing {
            exchange: short(message.exchange)?,
            routing_key: short(message.routing_key)?,
            properties,
            body: message.body,
        })
    }

    /// The message this was made from, as the broker hands it back with a return: the
    /// contract's terms again, for the dead letter built of it. Headers come back in the
    /// table's order (by name).
    pub fn into_message(self) -> Message {
        let text = |short: &ShortString| short.as_str().to_string();
        let properties = self.properties;
        let headers: Headers = match properties.headers() {
            Some(table) => table
                .inner()
                .iter()
                .map(|(name, value)| (text(name), header_value(value)))
                .collect(),
            None => Headers::new(),
        };
        Message {
            message_id: properties
                .message_id()
                .as_ref()
                .map(text)
                .unwrap_or_default(),
            exchange: self.exchange.into(),
            routing_key: self.routing_key.into(),
            event_type: properties.kind().as_ref().map(text),
            content_type: properties
                .content_type()
                .as_ref()
                .map(|content_type| Cow::Owned(text(content_type))),
            timestamp: *properties.timestamp(),
            headers,
            body: self.body,
            position: None,
        }
    }
}

/// A header's value in the contract's terms. The relay publishes only the four kinds
/// [`Outgoing::from_message`] makes; any other (a broker or plugin may add headers) travels on
/// as its text rather than being dropped from the dead letter.
fn header_value(value: &AMQPValue) -> HeaderValue {
    match value {
        AMQPValue::LongString(text) => {
            HeaderValue::Text(String::from_utf8_lossy(text.as_bytes()).into_owned())
        }
        AMQPValue::LongLongInt(i) => HeaderValue::Int(*i),
        AMQPValue::Double(f) => HeaderValue::Float(*f),
        AMQPValue::Boolean(b) => HeaderValue::Bool(*b),
        AMQPValue::ShortString(text) => HeaderValue::Text(text.to_string()),
        other => HeaderValue::Text(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::dead_letter::{self, headers, Reason};

    fn message() -> Message {
        Message {
            message_id: "m1".into(),
            exchange: "outbox".into(),
            routing_key: "Nobody".into(),
            event_type: Some("Nobody".into()),
            content_type: Some("application/json".into()),
            timestamp: Some(1_764_000_000),
            // In the table's order (by name), as a return brings them back.
            headers: vec![
                ("a-flag".into(), HeaderValue::Bool(true)),
                ("a-ratio".into(), HeaderValue::Float(0.5)),
                ("x-outbox-lsn".into(), HeaderValue::Int(42)),
                ("x-outbox-seq".into(), HeaderValue::Text("0A-01".into())),
            ],
            body: Bytes::from_static(b"{\"a\":1}"),
            position: None,
        }
    }

    #[test]
    fn a_returned_message_comes_back_as_the_message_that_was_published() {
        let outgoing = Outgoing::from_message(message()).expect("fits AMQP");
        assert_eq!(*outgoing.properties.delivery_mode(), Some(2), "persistent");
        assert_eq!(outgoing.into_message(), message());
    }

    #[test]
    fn a_dead_letter_goes_out_persistent_with_its_reason_as_a_header() {
        let reason = Reason::Rejected(crate::contract::message::Rejection::Unmappable {
            error: "column \"event_type\" is NULL".into(),
        });
        let letter = dead_letter::dead_letter("dlx", message(), &reason);
        let outgoing = Outgoing::from_message(letter).expect("fits AMQP");
        assert_eq!(outgoing.exchange.as_str(), "dlx");
        assert_eq!(*outgoing.properties.delivery_mode(), Some(2));
        let table = outgoing.properties.headers().clone().unwrap_or_default();
        assert_eq!(
            table.inner().get(headers::REASON),
            Some(&AMQPValue::LongString(
                "unmappable: column \"event_type\" is NULL".into()
            ))
        );
        assert_eq!(
            table.inner().get("x-outbox-seq"),
            Some(&AMQPValue::LongString("0A-01".into()))
        );
    }
}
