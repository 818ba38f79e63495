//! A delivery as the inbox sees it: the `message_id` it deduplicates on, the headers the
//! relay's message contract adds (`x-outbox-seq`, `x-aggregate-id`, `x-aggregate-type`), and
//! what an effect may use. A delivery without a usable `message_id` is refused here: nothing
//! could tell its repeats apart, so it can never be applied effectively once. So is one whose
//! `message_id` or `x-outbox-seq` holds a NUL byte, which PostgreSQL text cannot store: the
//! claim would fail on it at every attempt.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable};
use lapin::Acker;
use outbox_common::headers;

/// One message to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxMessage {
    pub message_id: String,
    /// The AMQP `type` property (the outbox row's `event_type`).
    pub kind: Option<String>,
    pub routing_key: String,
    pub body: Vec<u8>,
    /// `x-outbox-seq`: the position along the relay's stream (WAL mode only).
    pub outbox_seq: Option<String>,
    /// `x-aggregate-type` and `x-aggregate-id`.
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    /// The AMQP `timestamp` (the row's `created_at`, in seconds).
    pub timestamp: Option<SystemTime>,
    /// Every header, as a JSON object.
    pub headers: serde_json::Value,
    /// RabbitMQ's flag: delivered before, to this or another consumer, and not acknowledged.
    pub redelivered: bool,
}

/// Why a delivery cannot be applied at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No `message_id` property, or an empty one.
    NoMessageId,
    /// The `message_id` or `x-outbox-seq` (`field`) holds a NUL byte.
    NulByte { field: &'static str },
}

impl Refusal {
    /// Why, in a log line and a dead letter's `x-inbox-dead-letter-reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NoMessageId => "no message_id: nothing could deduplicate it",
            Refusal::NulByte {
                field: "message_id",
            } => "a NUL byte in message_id: PostgreSQL text cannot store it",
            Refusal::NulByte { .. } => {
                "a NUL byte in x-outbox-seq: PostgreSQL text cannot store it"
            }
        }
    }
}

impl InboxMessage {
    /// The message and its acker, or the refusal and the delivery as it came (to
    /// dead-letter or reject it).
    pub fn from_delivery(
        delivery: Delivery,
    ) -> Result<(InboxMessage, Acker), (Refusal, Box<Delivery>)> {
        let message_id = match delivery.properties.message_id() {
            Some(id) if !id.as_str().is_empty() => id.as_str().to_string(),
            _ => return Err((Refusal::NoMessageId, Box::new(delivery))),
        };
        let outbox_seq = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|t| header_text(t, headers::SEQ));
        let has_nul = |text: &str| text.contains('\0');
        let nul_in = if has_nul(&message_id) {
            Some("message_id")
        } else if outbox_seq.as_deref().is_some_and(has_nul) {
            Some(headers::SEQ)
        } else {
            None
        };
        if let Some(field) = nul_in {
            return Err((Refusal::NulByte { field }, Box::new(delivery)));
        }
        let Delivery {
            routing_key,
            redelivered,
            properties,
            data,
            acker,
            ..
        } = delivery;
        let table = properties.headers().as_ref();
        let text = |name: &str| table.and_then(|t| header_text(t, name));
        let message = InboxMessage {
            outbox_seq,
            aggregate_type: text(headers::AGGREGATE_TYPE),
            aggregate_id: text(headers::AGGREGATE_ID),
            headers: table.map_or_else(|| serde_json::json!({}), table_to_json),
            message_id,
            kind: properties.kind().as_ref().map(|k| k.as_str().to_string()),
            routing_key: routing_key.as_str().to_string(),
            body: data,
            timestamp: properties
                .timestamp()
                // A sender's timestamp past what the clock can hold is no timestamp.
                .and_then(|seconds| UNIX_EPOCH.checked_add(Duration::from_secs(seconds))),
            redelivered,
        };
        Ok((message, acker))
    }

    /// What decides the order of application: messages with the same key are applied one at
    /// a time, in delivery order. The aggregate where there is one; else the message itself
    /// (so two copies of one message never run at the same time either).
    pub fn order_key(&self) -> &str {
        self.aggregate_id.as_deref().unwrap_or(&self.message_id)
    }
}

/// A header's value as text: strings as they are, numbers and booleans written out.
fn header_text(table: &FieldTable, name: &str) -> Option<String> {
    let value = table.inner().get(name)?;
    match amqp_to_json(value) {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Null => None,
        other => Some(other.to_string()),
    }
}

fn table_to_json(table: &FieldTable) -> serde_json::Value {
    serde_json::Value::Object(
        table
            .inner()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), amqp_to_json(v)))
            .collect(),
    )
}

/// An AMQP field value as JSON (byte arrays and long strings as lossy UTF-8).
fn amqp_to_json(value: &AMQPValue) -> serde_json::Value {
    use serde_json::Value;
    match value {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(v) => (*v).into(),
        AMQPValue::ShortShortUInt(v) => (*v).into(),
        AMQPValue::ShortInt(v) => (*v).into(),
        AMQPValue::ShortUInt(v) => (*v).into(),
        AMQPValue::LongInt(v) => (*v).into(),
        AMQPValue::LongUInt(v) => (*v).into(),
        AMQPValue::LongLongInt(v) => (*v).into(),
        AMQPValue::Float(v) => f64::from(*v).into(),
        AMQPValue::Double(v) => (*v).into(),
        AMQPValue::DecimalValue(d) => Value::String(format!("{}e-{}", d.value, d.scale)),
        AMQPValue::ShortString(s) => Value::String(s.as_str().to_string()),
        AMQPValue::LongString(s) => Value::String(String::from_utf8_lossy(s.as_bytes()).into()),
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(amqp_to_json).collect()),
        AMQPValue::Timestamp(t) => (*t).into(),
        AMQPValue::FieldTable(t) => table_to_json(t),
        AMQPValue::ByteArray(b) => Value::String(String::from_utf8_lossy(b.as_slice()).into()),
        AMQPValue::Void => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::BasicProperties;

    fn delivery(properties: BasicProperties) -> Delivery {
        let mut delivery = Delivery::mock(
            1,
            "outbox".into(),
            "OrderPaid".into(),
            true,
            br#"{"order": 42}"#.to_vec(),
        );
        delivery.properties = properties;
        delivery
    }

    #[test]
    fn reads_the_relays_contract() {
        let mut table = FieldTable::default();
        table.insert(
            headers::SEQ.into(),
            AMQPValue::LongString("0000000001A2B3C4-00000002".into()),
        );
        table.insert(
            headers::AGGREGATE_ID.into(),
            AMQPValue::LongString("order-42".into()),
        );
        table.insert("attempt".into(), AMQPValue::LongLongInt(3));
        let properties = BasicProperties::default()
            .with_message_id("5b0e…".into())
            .with_type("OrderPaid".into())
            .with_timestamp(1_700_000_000)
            .with_headers(table);
        let (message, _) = InboxMessage::from_delivery(delivery(properties)).expect("a message");
        assert_eq!(message.message_id, "5b0e…");
        assert_eq!(
            message.outbox_seq.as_deref(),
            Some("0000000001A2B3C4-00000002")
        );
        assert_eq!(message.order_key(), "order-42");
        assert_eq!(message.headers["attempt"], 3);
        assert_eq!(message.kind.as_deref(), Some("OrderPaid"));
        assert_eq!(
            message.timestamp,
            Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert!(message.redelivered);
    }

    #[test]
    fn without_an_aggregate_the_message_is_its_own_order_key() {
        let properties = BasicProperties::default().with_message_id("m-1".into());
        let (message, _) = InboxMessage::from_delivery(delivery(properties)).expect("a message");
        assert_eq!(message.order_key(), "m-1");
        assert_eq!(message.headers, serde_json::json!({}));
    }

    #[test]
    fn a_nul_byte_in_the_message_id_or_seq_is_refused() {
        let seq = |value: &str| {
            let mut table = FieldTable::default();
            table.insert(headers::SEQ.into(), AMQPValue::LongString(value.into()));
            table
        };
        let refused = |properties| {
            InboxMessage::from_delivery(delivery(properties))
                .map(|_| ())
                .map_err(|(refusal, _)| refusal)
        };
        assert_eq!(
            refused(BasicProperties::default().with_message_id("a\0b".into())),
            Err(Refusal::NulByte {
                field: "message_id"
            })
        );
        assert_eq!(
            refused(
                BasicProperties::default()
                    .with_message_id("m-1".into())
                    .with_headers(seq("0000000001A2B3C4\0-00000002"))
            ),
            Err(Refusal::NulByte {
                field: headers::SEQ
            })
        );
        assert_eq!(
            refused(
                BasicProperties::default()
                    .with_message_id("m-1".into())
                    .with_headers(seq("0000000001A2B3C4-00000002"))
            ),
            Ok(())
        );
    }

    #[test]
    fn a_missing_or_empty_message_id_is_refused() {
        for properties in [
            BasicProperties::default(),
            BasicProperties::default().with_message_id("".into()),
        ] {
            let refused = InboxMessage::from_delivery(delivery(properties)).map(|_| ());
            assert!(matches!(refused, Err((Refusal::NoMessageId, _))));
        }
    }
}
