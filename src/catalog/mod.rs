//! What PostgreSQL's catalog says of the relay's objects, read by WAL mode's sessions, the
//! operator's commands (`status`, `teardown`, `check`) and `setup` alike: slot.rs, the one
//! read of `pg_replication_slots` (a [`slot::SlotReport`], the slot poller's gauges, failover
//! readiness) and what a replication error means for the slot; preflight.rs, the checks before
//! a session streams (`wal_level`, the publication and its row filter, the slot, the table's
//! columns, the emit functions).

pub(crate) mod preflight;
pub(crate) mod slot;
