//! Values more than one flag group reads: the duration syntax, shared with the inbox
//! (outbox_common::duration).

pub use outbox_common::duration::{parse_duration, parse_peer_timeout};
