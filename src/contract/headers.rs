//! The headers the relay adds to every message (docs/consumers.md, "The message contract"),
//! and a row's place in the stream, which `x-outbox-lsn` and `x-outbox-seq` carry.

use pgwire_replication::Lsn;

use crate::contract::message::Headers;

// The names are the consumer's too: they live in the crate both share.
pub use crate::trace_context::{TRACEPARENT, TRACESTATE};
pub use outbox_common::headers::{AGGREGATE_ID, AGGREGATE_TYPE, LSN, SEQ};

/// The headers the relay sets itself: a header column may not take their names.
pub const RESERVED: [&str; 6] = [
    LSN,
    SEQ,
    AGGREGATE_TYPE,
    AGGREGATE_ID,
    TRACEPARENT,
    TRACESTATE,
];

/// A row's place in the stream: its transaction's commit LSN and its index in the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub commit_lsn: Lsn,
    pub index: u32,
}

impl Position {
    /// `x-outbox-seq`: fixed-width hex of the commit LSN and the index, so that comparing two
    /// values as strings orders them along the stream.
    pub fn seq(&self) -> String {
        format!("{:016X}-{:08X}", self.commit_lsn.as_u64(), self.index)
    }
}

/// `x-outbox-lsn` and `x-outbox-seq`, for a row from the stream. Added after the message's
/// own headers: a header of the same name is replaced by the relay's.
pub(super) fn insert_stream_headers(headers: &mut Headers, position: Option<Position>) {
    if let Some(position) = position {
        headers.push((LSN.to_string(), position.commit_lsn.to_string().into()));
        headers.push((SEQ.to_string(), position.seq().into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_orders_along_the_stream() {
        let a = Position {
            commit_lsn: Lsn::from_u64(0xFF),
            index: 9,
        }
        .seq();
        let b = Position {
            commit_lsn: Lsn::from_u64(0x100),
            index: 0,
        }
        .seq();
        let c = Position {
            commit_lsn: Lsn::from_u64(0x100),
            index: 1,
        }
        .seq();
        assert!(a < b && b < c);
    }
}
