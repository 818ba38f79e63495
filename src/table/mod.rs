//! The outbox table as the relay reads it with SQL instead of from the stream: its columns
//! under the column map and its rows as the decoder's tuples ([`outbox`]), and the backfill
//! that publishes rows read that way ([`backfill`]).

pub(crate) mod backfill;
pub(crate) mod outbox;
