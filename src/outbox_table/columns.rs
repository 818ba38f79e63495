//! The outbox table's column names: one list for the mapper, polling, resync, cleanup and
//! shards.

pub const ID: &str = "id";
pub const EVENT_TYPE: &str = "event_type";
pub const PAYLOAD: &str = "payload";
pub const HEADERS: &str = "headers";
pub const CREATED_AT: &str = "created_at";
pub const EXCHANGE: &str = "exchange";
pub const ROUTING_KEY: &str = "routing_key";
pub const AGGREGATE_TYPE: &str = "aggregate_type";
pub const AGGREGATE_ID: &str = "aggregate_id";
/// Polling mode only: marks a claimed row published (NULL until then).
pub const PUBLISHED_AT: &str = "published_at";

/// The columns a message is made of, read when the table has them; others are ignored.
pub const CONTRACT: [&str; 9] = [
    ID,
    EVENT_TYPE,
    PAYLOAD,
    HEADERS,
    CREATED_AT,
    EXCHANGE,
    ROUTING_KEY,
    AGGREGATE_TYPE,
    AGGREGATE_ID,
];
