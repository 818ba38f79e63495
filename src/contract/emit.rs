//! The table-less outbox: events an application writes straight into the WAL with the emit
//! functions `setup` creates (`outbox_emit`, `outbox_emit_text`, `outbox_emit_bytea`: SQL in
//! `setup.rs`), published like rows (docs/emit.md).
//!
//! ```text
//!  SELECT outbox_emit('OrderCreated', '{"order_id": 42}')   (inside the application's transaction)
//!   -> pg_logical_emit_message(true, <prefix>, <envelope, UTF-8 JSON>)
//!   -> decoded at commit, never after a rollback; pgoutput sends it (`messages 'true'`)
//!      between Begin and Commit, in WAL order with the transaction's rows
//!   -> wal/source.rs: our prefix -> this module -> mapper's contract -> Input::Publish
//! ```
//!
//! The envelope is versioned ([`VERSION`]): a relay refuses an envelope newer than it reads
//! rather than guess, and a malformed one (e.g. written by hand with the prefix) is a
//! [`MapError`] that follows the dead-letter policy like an unmappable row: it stops the
//! relay before it is acknowledged (halt), or goes to the dead-letter exchange: delivery's
//! call, not this module's. Never dropped silently. Messages with other prefixes are not ours (other outboxes, heartbeats,
//! other tools): the stream's reader ignores them.
//!
//! Pure and synchronous, like the mapper.

use std::borrow::Cow;

use base64::Engine as _;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::contract::mapper::{BodyKind, Mapper, Parts};
use crate::contract::message::{Headers, Message, Unpublishable, MAX_SHORT_TEXT};
use crate::contract::pg_text::headers_from_json;
use crate::contract::position::Position;
use crate::contract::row_error::{MapError, RowRef};
use crate::contract::salvage::Readable;

/// The envelope version this relay writes (in the emit functions) and reads.
pub(crate) const VERSION: u64 = 1;

/// The envelope's fields, as the emit functions write them and docs/emit.md describes them.
pub(crate) mod fields {
    pub(crate) const VERSION: &str = "v";
    pub(crate) const ID: &str = "id";
    pub(crate) const EVENT_TYPE: &str = "event_type";
    pub(crate) const CREATED_AT: &str = "created_at";
    pub(crate) const PAYLOAD_TYPE: &str = "payload_type";
    pub(crate) const PAYLOAD: &str = "payload";
    pub(crate) const HEADERS: &str = "headers";
    pub(crate) const AGGREGATE_TYPE: &str = "aggregate_type";
    pub(crate) const AGGREGATE_ID: &str = "aggregate_id";
    pub(crate) const EXCHANGE: &str = "exchange";
    pub(crate) const ROUTING_KEY: &str = "routing_key";
    pub(crate) const SHARD_HASH: &str = "shard_hash";
}

/// The prefix of an outbox's events unless `--emit-prefix` says otherwise.
pub(crate) fn default_prefix((schema, table): (&str, &str)) -> String {
    format!("outbox-relay:emit:{schema}.{table}")
}

/// What the emit functions' names add to the table's name: `outbox` gets `outbox_emit`,
/// `outbox_emit_text` and `outbox_emit_bytea`, and two outboxes in one schema keep theirs
/// apart.
pub(crate) const FUNCTION_SUFFIXES: [(&str, PayloadType); 3] = [
    ("_emit", PayloadType::Jsonb),
    ("_emit_text", PayloadType::Text),
    ("_emit_bytea", PayloadType::Bytea),
];

/// The longest suffix: a table name may be at most 63 bytes minus this, or PostgreSQL would
/// cut the functions' names short.
pub(crate) const LONGEST_SUFFIX: usize = "_emit_bytea".len();

/// How an envelope carries its payload (`payload_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PayloadType {
    /// `payload` is the JSON value itself.
    Jsonb,
    /// `payload` is a JSON string: the text.
    Text,
    /// `payload` is a JSON string: the bytes in base64 (RFC 4648, padded, no line breaks).
    Bytea,
}

impl PayloadType {
    /// The SQL type of the emit function's payload parameter, and the envelope's name for it.
    pub(crate) fn sql_type(self) -> &'static str {
        match self {
            PayloadType::Jsonb => "jsonb",
            PayloadType::Text => "text",
            PayloadType::Bytea => "bytea",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        FUNCTION_SUFFIXES
            .iter()
            .map(|(_, kind)| *kind)
            .find(|kind| kind.sql_type() == name)
    }

    fn body_kind(self) -> BodyKind {
        match self {
            PayloadType::Jsonb => BodyKind::Jsonb,
            PayloadType::Text => BodyKind::Text,
            PayloadType::Bytea => BodyKind::Bytea,
        }
    }
}

/// The envelope as written (field meanings in docs/emit.md). Fields it does not know are
/// ignored: a change an older relay must not ignore bumps [`VERSION`].
#[derive(Deserialize)]
struct Wire<'a> {
    v: u64,
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow)]
    event_type: Cow<'a, str>,
    #[serde(borrow, default)]
    created_at: Option<Cow<'a, str>>,
    #[serde(borrow)]
    payload_type: Cow<'a, str>,
    /// Absent: no payload (an empty body). Present, even as `null`: the payload.
    #[serde(borrow, default, deserialize_with = "present")]
    payload: Option<&'a RawValue>,
    #[serde(borrow, default)]
    headers: Option<&'a RawValue>,
    #[serde(borrow, default)]
    aggregate_type: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    aggregate_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    exchange: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    routing_key: Option<Cow<'a, str>>,
    #[serde(default)]
    shard_hash: Option<i64>,
}

/// A field that is present, whatever its value (`null` included).
fn present<'de, D>(deserializer: D) -> Result<Option<&'de RawValue>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    <&RawValue>::deserialize(deserializer).map(Some)
}

/// Only the version, to tell a newer envelope from a malformed one when the whole does not
/// parse.
#[derive(Deserialize)]
struct VersionOnly {
    v: u64,
}

/// Only the shard hash, for a sharded relay to tell its events from the other shards'.
#[derive(Deserialize)]
struct ShardHashOnly {
    #[serde(default)]
    shard_hash: Option<i64>,
}

/// The envelope's shard hash (the row filter's hash, computed in SQL by the emit function);
/// `None` when the content does not parse or has none in `0..=2147483647`.
pub(crate) fn shard_hash(content: &[u8]) -> Option<u32> {
    serde_json::from_slice::<ShardHashOnly>(content)
        .ok()?
        .shard_hash
        .and_then(|hash| u32::try_from(hash).ok())
        .filter(|hash| *hash <= i32::MAX as u32)
}

/// One event read from its envelope, borrowing the message's content.
struct Event<'a> {
    wire: Wire<'a>,
    body: Bytes,
    kind: PayloadType,
    headers: Headers,
    created_at: Option<time::OffsetDateTime>,
}

/// A serde_json error as a problem to report: its category and place, and the field it
/// names when one is missing, but never a value (an invalid-type error quotes the value,
/// which may come from the application).
fn describe(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if text.starts_with("missing field") || text.starts_with("duplicate field") {
        let what = text.split(" at line").next().unwrap_or(&text);
        return format!("is incomplete: {what}");
    }
    match e.classify() {
        serde_json::error::Category::Data => format!(
            "has a field of the wrong type or value (line {}, column {})",
            e.line(),
            e.column()
        ),
        serde_json::error::Category::Eof => "is truncated JSON".to_string(),
        _ => format!(
            "is not a JSON object (invalid at line {}, column {})",
            e.line(),
            e.column()
        ),
    }
}

impl<'a> Event<'a> {
    /// Reads the envelope in `content`; `row` names the event in errors.
    fn parse(content: &'a Bytes, row: &dyn Fn() -> RowRef) -> Result<Self, MapError> {
        let envelope = |problem: String| MapError::Envelope {
            row: row(),
            problem,
        };
        let newer = |version: u64| MapError::EnvelopeVersion {
            row: row(),
            version,
            supported: VERSION,
        };
        let wire: Wire<'a> = match serde_json::from_slice(content) {
            Ok(wire) => wire,
            Err(e) => {
                return Err(match serde_json::from_slice::<VersionOnly>(content) {
                    Ok(VersionOnly { v }) if v > VERSION => newer(v),
                    _ => envelope(describe(&e)),
                })
            }
        };
        if wire.v > VERSION {
            return Err(newer(wire.v));
        }
        if wire.v != VERSION {
            return Err(envelope(format!(
                "has version {}; versions start at 1",
                wire.v
            )));
        }
        if wire.id.is_empty() {
            return Err(envelope(format!("has an empty \"{}\"", fields::ID)));
        }
        let kind = PayloadType::parse(&wire.payload_type).ok_or_else(|| {
            envelope(format!(
                "has an unknown \"{}\" (expected jsonb, text or bytea)",
                fields::PAYLOAD_TYPE
            ))
        })?;
        let body = match wire.payload {
            None => Bytes::new(),
            Some(raw) => payload(content, raw, kind).map_err(envelope)?,
        };
        let headers = match wire.headers {
            None => Headers::new(),
            Some(raw) => headers_from_json(raw.get().as_bytes())
                .map_err(|problem| envelope(format!("\"{}\" {problem}", fields::HEADERS)))?,
        };
        let created_at = match &wire.created_at {
            None => None,
            Some(text) => Some(rfc3339_seconds(text).ok_or_else(|| {
                envelope(format!(
                    "has a \"{}\" that is not an RFC 3339 time at or after 1970",
                    fields::CREATED_AT
                ))
            })?),
        };
        if wire
            .shard_hash
            .is_some_and(|hash| !(0..=i64::from(i32::MAX)).contains(&hash))
        {
            return Err(envelope(format!(
                "has a \"{}\" outside 0..=2147483647",
                fields::SHARD_HASH
            )));
        }
        Ok(Event {
            wire,
            body,
            kind,
            headers,
            created_at,
        })
    }

    /// The message this event becomes, at `position`: the contract applied to its fields.
    fn message(&self, mapper: &Mapper, position: Position) -> Result<Message, MapError> {
        // From here on, its id names the event in errors.
        let row = || RowRef {
            id: Some(self.wire.id.to_string()),
            position: Some(position),
            emitted: true,
        };
        mapper.assemble(self.parts(), Some(position), &row)
    }

    fn parts(&self) -> Parts<'_> {
        let wire = &self.wire;
        Parts {
            message_id: wire.id.to_string(),
            event_type: &wire.event_type,
            body: self.body.clone(),
            content_type: Some(self.kind.body_kind().content_type()),
            headers: self.headers.clone(),
            created_at: self.created_at,
            exchange: wire.exchange.as_deref(),
            routing_key: wire.routing_key.as_deref(),
            aggregate_type: wire.aggregate_type.as_deref(),
            aggregate_id: wire.aggregate_id.as_deref(),
            // An event's trace context travels in its headers (`assemble` reads them).
            trace: Default::default(),
        }
    }
}

/// The body an envelope's `payload` carries. A JSON payload stays a slice of the received
/// message (no copy), as a row's jsonb does.
fn payload(content: &Bytes, raw: &RawValue, kind: PayloadType) -> Result<Bytes, String> {
    let text = raw.get();
    let string = || {
        serde_json::from_str::<String>(text).map_err(|_| {
            format!(
                "has a {} payload that is not a JSON string",
                kind.sql_type()
            )
        })
    };
    Ok(match kind {
        PayloadType::Jsonb => slice_of(content, text.as_bytes()),
        PayloadType::Text => Bytes::from(string()?),
        PayloadType::Bytea => base64::engine::general_purpose::STANDARD
            .decode(string()?)
            .map(Bytes::from)
            .map_err(|_| "has a bytea payload that is not base64".to_string())?,
    })
}

/// `part` as a slice of `whole` when it lies inside it (serde borrows from the input), a copy
/// otherwise: never a panic.
fn slice_of(whole: &Bytes, part: &[u8]) -> Bytes {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize);
    match start {
        Some(start) if start + part.len() <= whole.len() => whole.slice(start..start + part.len()),
        _ => Bytes::copy_from_slice(part),
    }
}

/// An RFC 3339 time; `None` when it is not one, or before 1970 (AMQP timestamps are Unix
/// seconds).
fn rfc3339_seconds(text: &str) -> Option<time::OffsetDateTime> {
    let at =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    (at.unix_timestamp() >= 0).then_some(at)
}

/// The message an emitted event at `position` becomes, or what can be read of one that
/// cannot be published, and why. `transactional` is false for a message written with
/// `pg_logical_emit_message(false, …)`: it is part of no transaction (written even if the
/// writer rolled back), so it is never published as an event.
pub(crate) fn map(
    mapper: &Mapper,
    content: &Bytes,
    transactional: bool,
    position: Position,
) -> Result<Message, Box<Unpublishable>> {
    let (event, error) = match read(content, transactional, position) {
        Ok(event) => match event.message(mapper, position) {
            Ok(message) => return Ok(message),
            Err(error) => (Some(event), error),
        },
        Err(error) => (None, error),
    };
    let readable = readable_event(content, event.as_ref(), position);
    Err(mapper.unpublishable(Some(readable), Some(position), error))
}

/// The event in `content`, or why it is not one.
fn read(content: &Bytes, transactional: bool, position: Position) -> Result<Event<'_>, MapError> {
    let row = || RowRef {
        id: None,
        position: Some(position),
        emitted: true,
    };
    if !transactional {
        return Err(MapError::Envelope {
            row: row(),
            problem: "was written non-transactionally (pg_logical_emit_message(false, …)), \
                      so it is part of no transaction and would be published even after a \
                      rollback"
                .into(),
        });
    }
    Event::parse(content, &row)
}

/// What can be read of an event that cannot be published: its id and destination when the
/// envelope was readable, else an id made of its stream position (stable across replays, so
/// consumers of dead letters can deduplicate) and the envelope itself as the body.
fn readable_event<'a>(
    content: &Bytes,
    event: Option<&'a Event<'_>>,
    position: Position,
) -> Readable<'a> {
    let message_id = event
        .map(|e| e.wire.id.to_string())
        .filter(|id| id.len() <= MAX_SHORT_TEXT)
        .unwrap_or_else(|| format!("emitted-{}", position.seq()));
    match event {
        Some(event) => Readable {
            message_id,
            event_type: Some(event.wire.event_type.as_ref()),
            exchange: event.wire.exchange.as_deref(),
            routing_key: event.wire.routing_key.as_deref(),
            body: event.body.clone(),
            content_type: Some(event.kind.body_kind().content_type()),
            headers: event.headers.clone(),
        },
        None => Readable {
            message_id,
            event_type: None,
            exchange: None,
            routing_key: None,
            body: content.clone(),
            content_type: None,
            headers: Headers::new(),
        },
    }
}

#[cfg(test)]
mod tests;
