//! The headers the relay adds to every message (docs/consumers.md, "The message contract"),
//! and a row's place in the stream, which `x-outbox-lsn` and `x-outbox-seq` carry.

use crate::contract::message::Headers;
use crate::contract::position::Position;

// The names are the consumer's too: they live in the crate both share.
pub(crate) use crate::contract::trace_context::{TRACEPARENT, TRACESTATE};
pub(crate) use outbox_common::headers::{AGGREGATE_ID, AGGREGATE_TYPE, LSN, SEQ};

/// The headers the relay sets itself: a header column may not take their names.
pub(crate) const RESERVED: [&str; 6] = [
    LSN,
    SEQ,
    AGGREGATE_TYPE,
    AGGREGATE_ID,
    TRACEPARENT,
    TRACESTATE,
];

/// `x-outbox-lsn` and `x-outbox-seq`, for a row from the stream. Added after the message's
/// own headers: a header of the same name is replaced by the relay's.
pub(super) fn insert_stream_headers(headers: &mut Headers, position: Option<Position>) {
    if let Some(position) = position {
        headers.push((LSN.to_string(), position.commit_lsn.to_string().into()));
        headers.push((SEQ.to_string(), position.seq().into()));
    }
}
