//! Which relay and which shard: `--mode`, `--on-published`, `--shards` and `--shard`.

use clap::{Args, ValueEnum};

/// The most shards `--shards` takes. Each shard costs a slot and a walsender that decodes
/// the whole WAL: far fewer are useful (docs/scaling.md, "Scaling out").
pub(crate) const MAX_SHARDS: u32 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Wal,
    Poll,
}

/// What polling mode does with a row once the broker confirmed it (`--on-published`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnPublished {
    /// Set `published_at`; the cleanup deletes the row after the retention.
    Mark,
    /// Delete the row in the claim's transaction: no cleanup, no audit trail, no `resync`.
    Delete,
}

/// `--mode`, for the commands that serve both relays (`setup`, `status`); each says in its
/// help what the mode changes for it.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Mode")]
pub struct ModeArgs {
    /// Which relay the outbox is for: `wal` or `poll`.
    #[arg(long, env = "OUTBOX_MODE", value_enum, default_value_t = Mode::Wal)]
    pub mode: Mode,
}

/// `--shards`: how many row-filtered publications and slots the outbox is split into
/// (src/shard.rs). `setup` and `teardown` handle every shard; `run` streams one.
#[derive(Debug, Clone, Copy, Args)]
#[command(next_help_heading = "Shards")]
pub struct ShardCount {
    /// How many shards: N publications <publication>_<k>, each with a row filter that takes
    /// shard k's rows (by a hash of aggregate_id, so an aggregate's events stay in order),
    /// and N slots <slot>_<k>, for k = 0..N-1. 1 is no sharding: the one publication and slot
    /// named --publication and --slot (docs/scaling.md, "Scaling out").
    #[arg(long, env = "OUTBOX_SHARDS", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SHARDS)))]
    pub shards: u32,
}

/// `run`'s shard: `--shards` and `--shard`.
#[derive(Debug, Clone, Copy, Args)]
#[command(next_help_heading = "Shards")]
pub struct RunShard {
    #[command(flatten)]
    pub count: ShardCount,

    /// Which shard this relay streams, 0..N-1: the slot <slot>_<K> through the publication
    /// <publication>_<K>. Required with --shards above 1. A second relay with the same
    /// --shard waits as that shard's standby.
    #[arg(long, env = "OUTBOX_SHARD", value_name = "K")]
    pub shard: Option<u32>,
}

/// Whether the slot is a failover slot (PostgreSQL 17+: synchronized to standbys that ask
/// for it, so a promoted standby has it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailoverSlot {
    /// On where the server has failover slots (17+), off before.
    Auto,
    /// On; a server before 17 is an error.
    On,
    /// Off.
    Off,
}

/// `--failover-slot` (`setup`, and `run`, which creates a slot under `--on-slot-lost
/// recreate`).
#[derive(Debug, Clone, Copy, Args)]
#[command(next_help_heading = "Failover")]
pub struct FailoverSlotArgs {
    /// Create the slot as a failover slot, and turn failover on for an existing one
    /// (ALTER_REPLICATION_SLOT, which waits while a relay streams from the slot: stop it
    /// first): `auto` = on from PostgreSQL 17, `on` (an error before 17), `off`
    /// (docs/high-availability.md, "PostgreSQL high availability").
    #[arg(long, env = "OUTBOX_FAILOVER_SLOT", value_enum, default_value_t = FailoverSlot::Auto)]
    pub failover_slot: FailoverSlot,
}

/// What `run` does when its slot is missing or invalidated (`--on-slot-lost`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnSlotLost {
    /// Stop, naming the slot and the recovery (a person decides).
    Stop,
    /// Create a new slot and re-publish from the table what it will not deliver
    /// (docs/recovery.md, "When the slot is lost").
    Recreate,
}
