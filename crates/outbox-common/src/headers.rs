//! The names of the headers the relay adds to every message: the producer writes them and the
//! consumer reads them, so both take them from here (docs/consumers.md, "The message contract").

/// Commit LSN of the row's transaction (`X/Y`).
pub const LSN: &str = "x-outbox-lsn";
/// Commit LSN and position in the transaction: increases along the stream, so a replay
/// can be traced. Not a high-water mark to drop duplicates by: after a nack or a return
/// the replay brings messages a consumer never had (deduplicate on `message_id`).
pub const SEQ: &str = "x-outbox-seq";
pub const AGGREGATE_TYPE: &str = "x-aggregate-type";
pub const AGGREGATE_ID: &str = "x-aggregate-id";
