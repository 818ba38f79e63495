//! The outbox table as the relay reads it with SQL instead of from the stream: its columns
//! under the column map and its rows as the decoder's tuples ([`outbox`]), the backfill that
//! publishes rows read that way ([`backfill`]), and polling mode's statements: claim a batch,
//! mark it, delete what was published, read the backlog ([`polling`]).

pub(crate) mod backfill;
pub(crate) mod outbox;
pub(crate) mod polling;
