//! The one place a message of the contract (`crate::contract::message::Message`) becomes lapin's
//! types: what `basic_publish` takes, and what dead letters are built from.

use bytes::Bytes;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;

use crate::contract::message::{HeaderValue, Message};
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
}
