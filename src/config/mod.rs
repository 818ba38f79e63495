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

pub(crate) mod cli;
pub(crate) mod connections;
pub(crate) mod messages;
pub(crate) mod modes;
pub(crate) mod names;
pub(crate) mod observability;
pub(crate) mod tuning;

pub(crate) use cli::{
    CheckArgs, CheckedRelay, PollArgs, ResyncArgs, RunArgs, SetupArgs, StatusArgs, TeardownArgs,
};
pub(crate) use connections::{Connections, NodeOrder};
pub(crate) use messages::{
    DeadLetterArgs, EmitArgs, ExchangePolicyArgs, MessageFormat, MessageFormatArgs,
    HEARTBEAT_PREFIX,
};
pub(crate) use modes::{FailoverSlot, Mode, OnPublished, OnSlotLost, RunShard};
pub(crate) use names::{ColumnArgs, OutboxNames, PublishNames, TableName};
pub(crate) use observability::CleanupArgs;
pub(crate) use tuning::{Delivery, PublishLimits, Tuning};

#[cfg(test)]
mod tests;
