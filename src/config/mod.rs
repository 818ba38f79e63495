//! Command line and environment configuration, split by concern: [`cli`] (the commands),
//! [`connections`], [`names`], [`messages`], [`modes`], [`tuning`], [`observability`] and
//! [`values`].
//!
//! Every flag but the one-off switches of single commands (`--print-sql`, `--json`, `--yes`,
//! `--since`) has an environment variable so the relay can be configured the way containers
//! are; secrets (the URLs carry passwords) can also come from a file named by `*_FILE`, so they
//! never have to appear in argv, where `ps` shows them to every user of the machine.
//!
//! It owns the flags, their variables, defaults and the checks that need nothing but the
//! values. Each command flattens only the flag groups it uses, so clap refuses a flag that
//! does not apply to it (the variables of the others go unread: containers share one
//! environment). It must never connect to anything (`--help` and `setup --print-sql` work with
//! neither server up), and the command line must not change unnoticed:
//! `src/snapshots/cli_help.txt` pins every command's help.
//!
//! Plain data: it depends on no part of the relay but the error type and the names of the
//! heartbeat and shard limits; `crate::assembly` makes the relay's parts (the mapper, the
//! shard, the broker nodes) from it.

pub mod cli;
pub mod connections;
pub mod messages;
pub mod modes;
pub mod names;
pub mod observability;
pub mod tuning;

pub use cli::{
    CheckArgs, CheckedRelay, Cli, Command, LogFormat, PollArgs, ResyncArgs, RunArgs, SetupArgs,
    StatusArgs, TeardownArgs, DEFAULT_POLL_BATCH_SIZE, DEFAULT_POLL_WORKERS,
};
pub use connections::{
    BrokerConnection, Connections, DatabaseConnection, NodeOrder, PeerTimeoutArgs,
    StatementTimeoutArgs, StreamArgs,
};
pub use messages::{
    DeadLetterArgs, EmitArgs, ExchangePolicyArgs, MessageFormat, MessageFormatArgs, OnUnroutable,
    RestrictEmitArgs, HEARTBEAT_PREFIX,
};
pub use modes::{
    FailoverSlot, FailoverSlotArgs, Mode, ModeArgs, OnPublished, OnSlotLost, RunShard, ShardCount,
    MAX_SHARDS,
};
pub use names::{
    parse_exchange_name, parse_identifier, parse_slot_name, parse_table_name, ColumnArgs,
    ExchangeName, OutboxNames, PublicationName, PublishNames, SlotName, SlotNames, StatusNames,
    TableLayout, TableName,
};
pub use observability::{
    parse_metrics_addr, CleanupArgs, EndpointArgs, MetricsAddr, ObservabilityArgs,
    DEFAULT_METRICS_ADDR,
};
pub use tuning::{parse_size, Delivery, PublishLimits, Tuning};

#[cfg(test)]
mod tests;
