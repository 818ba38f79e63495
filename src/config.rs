//! Command line and environment configuration.
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

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::error::RelayError;
use crate::mapper::AllowedExchanges;
use crate::publish::BrokerNodes;

#[derive(Debug, Parser)]
#[command(
    name = "outbox-relay",
    version,
    about = "Delivers the rows of a PostgreSQL transactional outbox to RabbitMQ",
    long_about = "Delivers the rows of a PostgreSQL transactional outbox to RabbitMQ, at least \
                  once and in commit order, from a logical replication slot (run) or by polling \
                  (poll)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// Log format: human-readable text or one JSON object per line.
    #[arg(long, env = "OUTBOX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Provision the outbox: check wal_level, create the table (unless --no-create-table), the
    /// publication (before the slot), the slot and the exchange. Idempotent.
    Setup(SetupArgs),
    /// Run the WAL-mode relay: stream the slot and publish every inserted row.
    Run(RunArgs),
    /// Run the polling relay: workers claim unpublished rows with SELECT … FOR UPDATE SKIP
    /// LOCKED, publish them and mark them published (no slot; docs/polling.md).
    Poll(PollArgs),
    /// Show the slot (lag, retained WAL, wal_status, active pid), the outbox backlog and the
    /// message a running relay is stuck on. Exits 2 when the slot is missing or lost (a probe).
    /// With --mode poll: no slot; unsent rows and the oldest unsent row's age instead.
    Status(StatusArgs),
    /// Drop the slot and the publication. Asks for --yes: the relay stops delivering, and an
    /// abandoned slot pins WAL on the primary until it is dropped.
    Teardown(TeardownArgs),
    /// Re-publish the rows still in the table created at or after --since, in created_at
    /// order, for rows no slot will deliver (inserted before the slot existed, or lost with it).
    Resync(ResyncArgs),
}

/// Where the database is: every command but `setup --print-sql` connects to it.
#[derive(Debug, Clone, Args)]
pub struct DatabaseConnection {
    /// PostgreSQL URL, e.g. postgres://relay:secret@db:5432/app. The relay opens one ordinary
    /// connection and one logical replication connection with it.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// File holding the PostgreSQL URL (instead of --database-url), e.g. a mounted secret.
    #[arg(long, env = "DATABASE_URL_FILE")]
    pub database_url_file: Option<String>,
}

/// Where the broker is: for the commands that publish or declare (`setup`, `run`, `poll`,
/// `resync`; `status` and `teardown` never talk to RabbitMQ).
#[derive(Debug, Clone, Args)]
pub struct BrokerConnection {
    /// RabbitMQ URL, e.g. amqp://user:secret@broker:5672/%2f (amqps:// for TLS). A cluster:
    /// its nodes' URLs separated by commas; the relay tries them in a shuffled order and
    /// moves to the next node when its connection is lost.
    #[arg(long, env = "AMQP_URL", hide_env_values = true)]
    pub amqp_url: Option<String>,

    /// File holding the RabbitMQ URL or URLs (instead of --amqp-url).
    #[arg(long, env = "AMQP_URL_FILE")]
    pub amqp_url_file: Option<String>,
}

/// Where the database and the broker are.
#[derive(Debug, Clone, Args)]
pub struct Connections {
    #[command(flatten)]
    pub database: DatabaseConnection,
    #[command(flatten)]
    pub broker: BrokerConnection,
}

impl DatabaseConnection {
    pub fn database_url(&self) -> Result<String, RelayError> {
        secret(
            "database URL",
            "DATABASE_URL",
            &self.database_url,
            &self.database_url_file,
        )
    }
}

impl BrokerConnection {
    pub fn amqp_url(&self) -> Result<String, RelayError> {
        secret("AMQP URL", "AMQP_URL", &self.amqp_url, &self.amqp_url_file)
    }

    /// The RabbitMQ nodes of [`Self::amqp_url`], every URL checked, in a shuffled order.
    pub fn broker_nodes(&self) -> Result<Arc<BrokerNodes>, RelayError> {
        BrokerNodes::parse(&self.amqp_url()?).map(Arc::new)
    }
}

impl Connections {
    pub fn database_url(&self) -> Result<String, RelayError> {
        self.database.database_url()
    }

    pub fn amqp_url(&self) -> Result<String, RelayError> {
        self.broker.amqp_url()
    }

    /// The RabbitMQ nodes of [`BrokerConnection::amqp_url`], in a shuffled order.
    pub fn broker_nodes(&self) -> Result<Arc<BrokerNodes>, RelayError> {
        self.broker.broker_nodes()
    }
}

/// A URL given as `var` (or its flag) or in the file `var_FILE` names. An empty or blank
/// value, path or file is absent, never "connect with the defaults" (an empty DATABASE_URL
/// would have libpq's defaults pick a server); both at once is an error, not a precedence
/// rule nobody remembers.
fn secret(
    what: &'static str,
    var: &'static str,
    value: &Option<String>,
    file: &Option<String>,
) -> Result<String, RelayError> {
    let flag = format!("--{}", var.to_ascii_lowercase().replace('_', "-"));
    match (given(value), given(file)) {
        (Some(_), Some(path)) => Err(RelayError::Config(format!(
            "The {what} is given twice: by {var} (or {flag}) and by {var}_FILE (or \
             {flag}-file, {path}). Fix: set only one of them"
        ))),
        (Some(value), None) => Ok(value.trim().to_string()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|source| RelayError::SecretFile {
                what,
                path: path.to_string(),
                source,
            })?;
            warn_if_others_may_read(path);
            match text.trim() {
                "" => Err(RelayError::Config(format!(
                    "The file {path}, named by {var}_FILE (or {flag}-file), is empty: it must \
                     hold the {what}"
                ))),
                text => Ok(text.to_string()),
            }
        }
        (None, None) => {
            let state = |v: &Option<String>| if v.is_some() { "empty" } else { "not set" };
            Err(RelayError::Config(format!(
                "No {what} given: {var} (or {flag}) is {} and {var}_FILE (or {flag}-file) is \
                 {}. Fix: set one of them",
                state(value),
                state(file)
            )))
        }
    }
}

/// The value, unless it is missing or blank.
fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.trim().is_empty())
}

/// A secret file others may read leaks the password to every account on the machine (or in
/// the pod): say so, naming the file and never its content.
fn warn_if_others_may_read(path: &str) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(metadata) = std::fs::metadata(path) else {
        return;
    };
    let mode = metadata.permissions().mode();
    if readable_by_others(mode) {
        tracing::warn!(
            file = %path,
            mode = %format!("{:03o}", mode & 0o777),
            "the secret file is readable by its group or by others. Fix: chmod 600 {path} \
             (owned by the relay's user; in Kubernetes, defaultMode: 0400)"
        );
    }
}

/// Whether the group or others may read a file of this mode.
fn readable_by_others(mode: u32) -> bool {
    mode & 0o044 != 0
}

// Each name is a flag of its own, so that a command takes only the names it uses (`poll`
// has no slot, `teardown` no exchange): clap then refuses the others on its command line. A
// name reads as text (`Deref<Target = str>`, `Display`, `== "x"`), and `"x".into()` makes
// one.

/// The methods every name flag shares.
macro_rules! name_flag {
    ($name:ident) => {
        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.name
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.name)
            }
        }

        impl From<String> for $name {
            fn from(name: String) -> Self {
                Self { name }
            }
        }

        impl From<&str> for $name {
            fn from(name: &str) -> Self {
                Self {
                    name: name.to_string(),
                }
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.name == *other
            }
        }
    };
}

/// `--table`.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct TableName {
    /// The outbox table (optionally schema-qualified).
    #[arg(id = "table", long = "table", value_name = "TABLE", env = "OUTBOX_TABLE", default_value = "outbox", value_parser = parse_table_name)]
    pub name: String,
}
name_flag!(TableName);

/// `--publication`.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct PublicationName {
    /// The publication that feeds the slot (publish = 'insert', on the outbox table only).
    #[arg(id = "publication", long = "publication", value_name = "PUBLICATION", env = "OUTBOX_PUBLICATION", default_value = "outbox_pub", value_parser = parse_identifier)]
    pub name: String,
}
name_flag!(PublicationName);

/// `--slot`.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct SlotName {
    /// The logical replication slot (plugin pgoutput).
    #[arg(id = "slot", long = "slot", value_name = "SLOT", env = "OUTBOX_SLOT", default_value = "outbox_slot", value_parser = parse_slot_name)]
    pub name: String,
}
name_flag!(SlotName);

/// `--exchange`.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ExchangeName {
    /// The exchange messages go to unless a row names its own (a durable topic exchange).
    #[arg(id = "exchange", long = "exchange", value_name = "EXCHANGE", env = "OUTBOX_EXCHANGE", default_value = "outbox", value_parser = parse_exchange_name)]
    pub name: String,
}
name_flag!(ExchangeName);

/// Every name: `setup` and `run`, which provision or use all of the objects.
#[derive(Debug, Clone, Args)]
pub struct OutboxNames {
    #[command(flatten)]
    pub table: TableName,
    #[command(flatten)]
    pub publication: PublicationName,
    #[command(flatten)]
    pub slot: SlotName,
    #[command(flatten)]
    pub exchange: ExchangeName,
}

/// The names of a command that reads the table and publishes, without a slot: `poll` and
/// `resync`.
#[derive(Debug, Clone, Args)]
pub struct PublishNames {
    #[command(flatten)]
    pub table: TableName,
    #[command(flatten)]
    pub exchange: ExchangeName,
}

/// `status`'s names: the table (its backlog) and the slot (WAL mode).
#[derive(Debug, Clone, Args)]
pub struct StatusNames {
    #[command(flatten)]
    pub table: TableName,
    #[command(flatten)]
    pub slot: SlotName,
}

/// `teardown`'s names: what it drops. The table and the exchange stay.
#[derive(Debug, Clone, Args)]
pub struct SlotNames {
    #[command(flatten)]
    pub publication: PublicationName,
    #[command(flatten)]
    pub slot: SlotName,
}

// Names end up in SQL text (`setup --print-sql`, which a DBA pipes to psql), in the
// replication protocol's START_REPLICATION command and in logs. Quoting keeps quotes and
// spaces harmless; what no quoting fixes is refused here, when the flags are parsed, so no
// command ever renders it: control characters (a newline ends a `--` comment or a log line),
// `$` (dollar quoting: the generated SQL needs a DO block), names PostgreSQL would cut short
// (over 63 bytes: the relay would look for a name that does not exist) and empty names.

/// PostgreSQL's longest identifier (NAMEDATALEN - 1 bytes); longer ones are truncated.
const MAX_IDENTIFIER_BYTES: usize = 63;
/// AMQP's longest exchange name (a short string).
const MAX_EXCHANGE_BYTES: usize = 255;

/// What every name must satisfy: not empty, no control character, no `$`.
fn check_name_text(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".into());
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(format!(
            "the name holds the control character U+{:04X}; names may not hold control \
             characters (newlines, tabs, escapes)",
            c as u32
        ));
    }
    if name.contains('$') {
        return Err(
            "the name holds a '$', which the relay's names may not (the SQL that \
                    `setup` generates uses dollar quoting)"
                .into(),
        );
    }
    Ok(())
}

/// A PostgreSQL identifier (publication, schema, table, LISTEN channel): any text PostgreSQL
/// takes quoted, up to 63 bytes, that [`check_name_text`] accepts.
pub fn parse_identifier(name: &str) -> Result<String, String> {
    check_name_text(name)?;
    if name.len() > MAX_IDENTIFIER_BYTES {
        return Err(format!(
            "the name is {} bytes long; PostgreSQL names hold at most {MAX_IDENTIFIER_BYTES} \
             bytes (it would cut this one short)",
            name.len()
        ));
    }
    Ok(name.to_string())
}

/// `table` or `schema.table`, each part an identifier.
pub fn parse_table_name(name: &str) -> Result<String, String> {
    check_name_text(name)?;
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 {
        return Err(
            "the name has more than one '.': name the table as `table` or \
                    `schema.table`"
                .into(),
        );
    }
    for part in &parts {
        if part.is_empty() {
            return Err("the schema or the table name is empty (`schema.table`)".into());
        }
        parse_identifier(part)?;
    }
    Ok(name.to_string())
}

/// A replication slot name: PostgreSQL allows only `[a-z0-9_]`, up to 63 bytes.
pub fn parse_slot_name(name: &str) -> Result<String, String> {
    check_name_text(name)?;
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(
            "slot names may hold only lower-case letters, digits and underscores \
                    (PostgreSQL's rule)"
                .into(),
        );
    }
    parse_identifier(name)
}

/// A RabbitMQ exchange name: up to 255 bytes, no control characters, no `$`.
pub fn parse_exchange_name(name: &str) -> Result<String, String> {
    check_name_text(name)?;
    if name.len() > MAX_EXCHANGE_BYTES {
        return Err(format!(
            "the name is {} bytes long; AMQP allows at most {MAX_EXCHANGE_BYTES}",
            name.len()
        ));
    }
    Ok(name.to_string())
}

/// `--allowed-exchanges`: each name in the list a valid exchange name (`*`, and the shape of
/// the list, are `AllowedExchanges::parse`'s to judge).
fn parse_exchange_list(list: &str) -> Result<String, String> {
    for name in list.split(',').map(str::trim) {
        if !name.is_empty() && name != "*" {
            parse_exchange_name(name).map_err(|e| format!("{name:?}: {e}"))?;
        }
    }
    Ok(list.to_string())
}

/// `--dead-letter-exchange`: an exchange name, or empty for none (it is only needed with
/// `--on-unroutable dead-letter`, which says so when it is missing).
fn parse_optional_exchange_name(name: &str) -> Result<String, String> {
    match name.trim() {
        "" => Ok(String::new()),
        _ => parse_exchange_name(name),
    }
}

impl TableName {
    /// Schema and table name, `public` when the table name is unqualified.
    pub fn table_parts(&self) -> (&str, &str) {
        match self.name.split_once('.') {
            Some((schema, table)) => (schema, table),
            None => ("public", self.name.as_str()),
        }
    }

    /// `"schema"."table"`, quoted for SQL text.
    pub fn qualified_table(&self) -> String {
        let (schema, table) = self.table_parts();
        format!(
            "{}.{}",
            crate::db::quote_ident(schema),
            crate::db::quote_ident(table)
        )
    }
}

impl OutboxNames {
    /// [`TableName::table_parts`] of --table.
    pub fn table_parts(&self) -> (&str, &str) {
        self.table.table_parts()
    }

    /// [`TableName::qualified_table`] of --table.
    pub fn qualified_table(&self) -> String {
        self.table.qualified_table()
    }
}

#[derive(Debug, Clone, Args)]
#[command(mut_arg("mode", |arg| arg.help(
    "What to provision for: `wal` (publication and slot) or `poll` (the partial index the \
     claim query needs; no wal_level check, no publication, no slot)"
)))]
pub struct SetupArgs {
    #[command(flatten)]
    pub connections: Connections,
    #[command(flatten)]
    pub names: OutboxNames,
    #[command(flatten)]
    pub shards: ShardCount,
    /// Do not create the outbox table or the emit functions (a DBA created them); still
    /// checks that the table exists, and says whether the emit functions do.
    #[arg(long, env = "OUTBOX_NO_CREATE_TABLE")]
    pub no_create_table: bool,
    /// Print the provisioning SQL for these names and exit, without connecting (for DBAs).
    #[arg(long)]
    pub print_sql: bool,
    /// Seconds to keep retrying the first connection to PostgreSQL and to RabbitMQ while it
    /// fails for a reason that can pass (not listening yet, still starting up), with
    /// backoff; then the error. 0 tries once. For a setup started together with its servers.
    #[arg(
        long = "connect-timeout",
        env = "OUTBOX_CONNECT_TIMEOUT_SECS",
        value_name = "SECS",
        default_value_t = 0
    )]
    pub connect_timeout_secs: u64,
    #[command(flatten)]
    pub mode: ModeArgs,
    #[command(flatten)]
    pub dead_letter: DeadLetterArgs,
    #[command(flatten)]
    pub emit: EmitArgs,
    #[command(flatten)]
    pub restrict_emit: RestrictEmitArgs,
}

/// `setup --restrict-emit`: who may write events (docs/emit.md, "Who may emit").
#[derive(Debug, Clone, Args)]
pub struct RestrictEmitArgs {
    /// Restrict who may emit events (needs a superuser): revoke EXECUTE on both
    /// pg_logical_emit_message overloads from PUBLIC, make the emit functions SECURITY
    /// DEFINER with a pinned search_path, revoke them from PUBLIC and grant them to
    /// --emit-role, and grant pg_logical_emit_message(boolean, text, text) to --relay-role
    /// for its heartbeats.
    #[arg(long, env = "OUTBOX_RESTRICT_EMIT", requires = "emit_role")]
    pub restrict_emit: bool,

    /// With --restrict-emit: the role that may call the emit functions (the application's).
    #[arg(long, env = "OUTBOX_EMIT_ROLE", value_parser = parse_identifier)]
    pub emit_role: Option<String>,

    /// With --restrict-emit: the role `run` connects as, which keeps EXECUTE on
    /// pg_logical_emit_message for its heartbeats. Default: the role setup connects as.
    #[arg(long, env = "OUTBOX_RELAY_ROLE", value_parser = parse_identifier)]
    pub relay_role: Option<String>,
}

impl RestrictEmitArgs {
    /// The application's role when emitting is to be restricted, `None` otherwise.
    pub fn emit_role(&self) -> Option<&str> {
        self.emit_role.as_deref().filter(|_| self.restrict_emit)
    }
}

/// The table-less outbox (docs/emit.md): the prefix of this outbox's logical messages.
/// `setup` writes it into the emit functions, `run` publishes the messages that carry it.
#[derive(Debug, Clone, Args)]
pub struct EmitArgs {
    /// Prefix of the logical messages the emit functions write and `run` publishes
    /// (outbox_emit, docs/emit.md). Default: outbox-relay:emit:<schema>.<table>. Messages
    /// with other prefixes are ignored; it may not be the heartbeats' prefix.
    #[arg(long, env = "OUTBOX_EMIT_PREFIX", value_parser = parse_emit_prefix)]
    pub emit_prefix: Option<String>,
}

impl EmitArgs {
    /// The configured prefix, or the default for `table`.
    pub fn prefix(&self, table: &TableName) -> String {
        match &self.emit_prefix {
            Some(prefix) => prefix.clone(),
            None => crate::emit::default_prefix(table.table_parts()),
        }
    }
}

/// `--emit-prefix`: text that [`check_name_text`] accepts (it goes into the SQL of the emit
/// functions, dollar-quoted), and not the heartbeats' prefix.
fn parse_emit_prefix(prefix: &str) -> Result<String, String> {
    check_name_text(prefix).map_err(|e| e.replace("the name", "the prefix"))?;
    if prefix == crate::wal::heartbeat::PREFIX {
        return Err(format!(
            "{prefix:?} is the prefix of the relay's heartbeats; the emit prefix must differ \
             (the default is outbox-relay:emit:<schema>.<table>)"
        ));
    }
    Ok(prefix.to_string())
}

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
pub struct ModeArgs {
    /// Which relay the outbox is for: `wal` or `poll`.
    #[arg(long, env = "OUTBOX_MODE", value_enum, default_value_t = Mode::Wal)]
    pub mode: Mode,
}

/// `--shards`: how many row-filtered publications and slots the outbox is split into
/// (src/shard.rs). `setup` and `teardown` handle every shard; `run` streams one.
#[derive(Debug, Clone, Copy, Args)]
pub struct ShardCount {
    /// How many shards: N publications <publication>_<k>, each with a row filter that takes
    /// shard k's rows (by a hash of aggregate_id, so an aggregate's events stay in order),
    /// and N slots <slot>_<k>, for k = 0..N-1. 1 is no sharding: the one publication and slot
    /// named --publication and --slot (docs/operations.md, "Scaling out").
    #[arg(long, env = "OUTBOX_SHARDS", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::shard::MAX_SHARDS)))]
    pub shards: u32,
}

/// `run`'s shard: `--shards` and `--shard`.
#[derive(Debug, Clone, Copy, Args)]
pub struct RunShard {
    #[command(flatten)]
    pub count: ShardCount,

    /// Which shard this relay streams, 0..N-1: the slot <slot>_<K> through the publication
    /// <publication>_<K>. Required with --shards above 1. A second relay with the same
    /// --shard waits as that shard's standby.
    #[arg(long, env = "OUTBOX_SHARD", value_name = "K")]
    pub shard: Option<u32>,
}

impl RunShard {
    /// The shard to stream; [`Shard::UNSHARDED`] for `--shards 1`.
    ///
    /// [`Shard::UNSHARDED`]: crate::shard::Shard::UNSHARDED
    pub fn shard(&self) -> Result<crate::shard::Shard, RelayError> {
        let count = self.count.shards;
        match self.shard {
            Some(index) => crate::shard::Shard::new(index, count),
            None if count == 1 => Ok(crate::shard::Shard::UNSHARDED),
            // Not shard 0 by default: a forgotten OUTBOX_SHARD would make every relay a
            // standby of shard 0 while the other shards' rows wait unnoticed.
            None => Err(RelayError::Config(format!(
                "--shards is {count} but no --shard is given: a sharded relay streams one \
                 shard. Fix: set --shard (OUTBOX_SHARD) to 0..{}, one relay per shard",
                count - 1
            ))),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub connections: Connections,
    #[command(flatten)]
    pub names: OutboxNames,
    #[command(flatten)]
    pub shard: RunShard,
    #[command(flatten)]
    pub tuning: Tuning,
    #[command(flatten)]
    pub observability: ObservabilityArgs,
    #[command(flatten)]
    pub cleanup: CleanupArgs,
    #[command(flatten)]
    pub dead_letter: DeadLetterArgs,
    #[command(flatten)]
    pub exchanges: ExchangePolicyArgs,
    #[command(flatten)]
    pub emit: EmitArgs,
    #[command(flatten)]
    pub format: MessageFormatArgs,
}

/// How a message's body is laid out (`run`, `poll`, `resync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MessageFormat {
    /// The payload itself, as before.
    Plain,
    /// A CloudEvents 1.0 JSON event, structured mode.
    Cloudevents,
}

/// `--message-format` and the CloudEvents `source` (src/cloudevents.rs, docs/emit.md).
#[derive(Debug, Clone, Args)]
pub struct MessageFormatArgs {
    /// The body of every message: `plain` (the payload) or `cloudevents` (a CloudEvents 1.0
    /// JSON event in structured mode, content type application/cloudevents+json, the payload
    /// as its data). The AMQP properties and headers are the same in both.
    #[arg(long, env = "OUTBOX_MESSAGE_FORMAT", value_enum, default_value_t = MessageFormat::Plain)]
    pub message_format: MessageFormat,

    /// The CloudEvents `source` attribute (a URI-reference, never with credentials).
    /// Default: urn:outbox-relay:<database>:<schema>.<table>.
    #[arg(long, env = "OUTBOX_CLOUDEVENTS_SOURCE", value_parser = parse_cloudevents_source)]
    pub cloudevents_source: Option<String>,
}

fn parse_cloudevents_source(source: &str) -> Result<String, String> {
    crate::cloudevents::check_source(source)?;
    Ok(source.to_string())
}

impl MessageFormatArgs {
    /// `mapper` publishing in this format, for `table` of the database `database_url` names
    /// (the default source holds its database name, never its user or password).
    pub fn apply(
        &self,
        mapper: crate::mapper::Mapper,
        database_url: &str,
        table: &TableName,
    ) -> Result<crate::mapper::Mapper, RelayError> {
        if self.message_format == MessageFormat::Plain {
            return Ok(mapper);
        }
        let source = match &self.cloudevents_source {
            Some(source) => source.clone(),
            None => {
                let config = crate::db::parse_url(database_url)?;
                let database = config
                    .get_dbname()
                    .or(config.get_user())
                    .unwrap_or("postgres");
                crate::cloudevents::default_source(database, table.table_parts())
            }
        };
        Ok(mapper.with_cloudevents(&source))
    }
}

/// Which exchanges a row may send its message to.
#[derive(Debug, Clone, Args)]
pub struct ExchangePolicyArgs {
    /// Exchanges a row's `exchange` column may name, comma-separated; `*` allows any
    /// exchange the broker user can write to. The --exchange is always allowed. A row naming
    /// another exchange is not published: it stops the relay (`halt`) or goes to the
    /// dead-letter exchange with the reason "exchange not allowed".
    #[arg(long, env = "OUTBOX_ALLOWED_EXCHANGES", value_parser = parse_exchange_list)]
    pub allowed_exchanges: Option<String>,
}

impl ExchangePolicyArgs {
    /// The policy for rows of an outbox whose default exchange is `exchange`.
    pub fn policy(&self, exchange: &str) -> Result<AllowedExchanges, RelayError> {
        AllowedExchanges::parse(self.allowed_exchanges.as_deref(), exchange)
            .map_err(RelayError::Config)
    }
}

/// What happens to a message the broker will not route or accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnUnroutable {
    /// Stop at it: nothing after it is acknowledged; retry until it can be delivered.
    Halt,
    /// Publish it to --dead-letter-exchange with the reason in headers, then move on.
    DeadLetter,
}

/// The dead-letter policy (src/publish/dead_letter.rs, docs/operations.md).
#[derive(Debug, Clone, Args)]
pub struct DeadLetterArgs {
    /// What to do with a message the broker returns as unroutable (no binding for its routing
    /// key), or one that cannot be published at all (over --max-message-size, or a row that
    /// cannot be mapped): `halt` stops delivery at it until it can be delivered; `dead-letter`
    /// publishes it to --dead-letter-exchange with the reason in headers, and once the broker
    /// confirms that, moves on.
    #[arg(long, env = "OUTBOX_ON_UNROUTABLE", value_enum, default_value_t = OnUnroutable::Halt)]
    pub on_unroutable: OnUnroutable,

    /// The exchange dead letters go to (required with --on-unroutable dead-letter). `setup`
    /// declares it as a durable topic exchange; dead letters keep their routing key, so bind
    /// a queue with `#` to receive them all.
    #[arg(long, env = "OUTBOX_DEAD_LETTER_EXCHANGE", value_parser = parse_optional_exchange_name)]
    pub dead_letter_exchange: Option<String>,
}

impl DeadLetterArgs {
    /// The dead-letter exchange when the policy is `dead-letter`, `None` under `halt`.
    /// `exchange` is the main exchange, which the dead letters must not go back to.
    pub fn exchange(&self, exchange: &str) -> Result<Option<String>, RelayError> {
        if self.on_unroutable == OnUnroutable::Halt {
            return Ok(None);
        }
        match self.dead_letter_exchange.as_deref().map(str::trim) {
            None | Some("") => Err(RelayError::Config(
                "--on-unroutable dead-letter needs the exchange to send dead letters to. Fix: \
                 set --dead-letter-exchange (or OUTBOX_DEAD_LETTER_EXCHANGE), and run \
                 `outbox-relay setup` with both flags to declare it"
                    .into(),
            )),
            Some(name) if name == exchange => Err(RelayError::Config(format!(
                "--dead-letter-exchange is \"{name}\", the exchange messages are published to: \
                 a message it cannot route would come back unroutable again. Fix: name another \
                 exchange, e.g. \"{exchange}.dead-letter\""
            ))),
            Some(name) if name.len() > 255 => Err(RelayError::Config(format!(
                "--dead-letter-exchange is {} bytes long; AMQP allows at most 255. Fix: use a \
                 shorter name",
                name.len()
            ))),
            Some(name) => Ok(Some(name.to_string())),
        }
    }
}

/// Throughput, latency and failure-handling knobs of the WAL relay.
#[derive(Debug, Clone, Args)]
pub struct Tuning {
    /// Most messages published and not yet confirmed by the broker. Larger windows raise
    /// throughput and the number of duplicates a crash can cause (docs/benchmarks.md).
    #[arg(long, env = "OUTBOX_MAX_IN_FLIGHT", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_in_flight: u32,

    /// How often the acknowledged position is reported to PostgreSQL, in milliseconds (≤ 100
    /// keeps the duplicates after a crash small).
    #[arg(long, env = "OUTBOX_STATUS_INTERVAL_MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub status_interval_ms: u64,

    #[command(flatten)]
    pub delivery: Delivery,

    /// Seconds between WAL heartbeats (pg_logical_emit_message): they prove the replication
    /// stream is alive end to end, let an idle slot advance, and measure heartbeat lag. With
    /// none seen for 3 intervals the stream is reconnected. 0 disables them.
    #[arg(long, env = "OUTBOX_HEARTBEAT_INTERVAL_SECS", default_value_t = 10)]
    pub heartbeat_interval_secs: u64,
}

/// What every publishing command needs (`run`, `poll`, `resync`): the confirm timeout and
/// the message size limit.
#[derive(Debug, Clone, Args)]
pub struct Publishing {
    /// Seconds a published message may wait for its broker confirm before the relay gives up on
    /// the connection and reconnects (paused while the broker blocks publishers).
    #[arg(long, env = "OUTBOX_CONFIRM_TIMEOUT_SECS", default_value_t = 30)]
    pub confirm_timeout_secs: u64,

    /// Largest message body the broker accepts (RabbitMQ's max_message_size; its default is
    /// 128 MiB). A larger row stops the relay with an error naming it, before publishing.
    #[arg(long, env = "OUTBOX_MAX_MESSAGE_SIZE", default_value_t = 134_217_728)]
    pub max_message_size: usize,
}

/// The knobs the two long-running relays share (`run`, `poll`): publishing, reconnects,
/// shutdown. `resync` publishes once and stops at its first failure.
#[derive(Debug, Clone, Args)]
pub struct Delivery {
    #[command(flatten)]
    pub publishing: Publishing,

    /// Longest wait between reconnect attempts, in seconds (backoff doubles from 0.5 s).
    #[arg(long, env = "OUTBOX_MAX_BACKOFF_SECS", default_value_t = 30)]
    pub max_backoff_secs: u64,

    /// Seconds a graceful shutdown may spend finishing the current transaction.
    #[arg(long, env = "OUTBOX_SHUTDOWN_TIMEOUT_SECS", default_value_t = 30)]
    pub shutdown_timeout_secs: u64,
}

impl Tuning {
    /// `None` when heartbeats are disabled.
    pub fn heartbeat_interval(&self) -> Option<Duration> {
        (self.heartbeat_interval_secs > 0)
            .then(|| Duration::from_secs(self.heartbeat_interval_secs))
    }
    pub fn status_interval(&self) -> Duration {
        Duration::from_millis(self.status_interval_ms)
    }
}

/// The shared knobs read as `tuning.confirm_timeout()`, `tuning.max_message_size`, as before
/// they were split out for polling mode.
impl std::ops::Deref for Tuning {
    type Target = Delivery;
    fn deref(&self) -> &Delivery {
        &self.delivery
    }
}

/// The publishing knobs read as `delivery.max_message_size`, as before they were split out
/// for `resync`.
impl std::ops::Deref for Delivery {
    type Target = Publishing;
    fn deref(&self) -> &Publishing {
        &self.publishing
    }
}

impl Publishing {
    pub fn confirm_timeout(&self) -> Duration {
        Duration::from_secs(self.confirm_timeout_secs)
    }
}

impl Delivery {
    pub fn max_backoff(&self) -> Duration {
        Duration::from_secs(self.max_backoff_secs)
    }
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_secs(self.shutdown_timeout_secs)
    }
}

/// Polling workers by default: two overlap one's claim and commit with the other's confirms,
/// and drained a backlog at 0.94× the WAL reader where one worker managed 0.62×
/// (docs/benchmarks.md, "Polling defaults"). A crash re-publishes at most workers × batch.
pub const DEFAULT_POLL_WORKERS: u32 = 2;
/// Rows per polling batch by default: fewer, larger batches cost PostgreSQL less per row (one
/// worker: 22 against 32 µs at 500, same benchmark), while 2 × 1,000 keeps the crash bound
/// below the WAL reader's at its drain rate.
pub const DEFAULT_POLL_BATCH_SIZE: u32 = 1_000;

#[derive(Debug, Clone, Args)]
#[command(
    mut_arg("cleanup_interval", |arg| arg.help(
        "How often published rows older than --retention are deleted (0 turns cleanup off)"
    )),
    mut_arg("retention", |arg| arg.help(
        "How long a published row is kept before cleanup deletes it (by published_at)"
    )),
)]
pub struct PollArgs {
    #[command(flatten)]
    pub connections: Connections,
    #[command(flatten)]
    pub names: PublishNames,

    /// Workers, each with its own database and broker connection, claiming batches in parallel.
    /// After a crash up to workers × batch size rows can be published again.
    #[arg(long, env = "OUTBOX_WORKERS", default_value_t = DEFAULT_POLL_WORKERS, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub workers: u32,

    /// Rows a worker claims, publishes and marks in one transaction (at most: a claim takes
    /// what is there, so batches stay small unless there is a backlog).
    #[arg(long, env = "OUTBOX_BATCH_SIZE", default_value_t = DEFAULT_POLL_BATCH_SIZE, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub batch_size: u32,

    /// What happens to a row once the broker confirmed it, in the claim's transaction:
    /// `mark` sets published_at (the cleanup deletes it after --retention); `delete` deletes
    /// it at once (no cleanup, no partial-index churn, but no record of what was sent and
    /// nothing for `resync`).
    #[arg(long, env = "OUTBOX_ON_PUBLISHED", value_enum, default_value_t = OnPublished::Mark)]
    pub on_published: OnPublished,

    /// A fixed wait after every poll that found no rows (e.g. 1s, 250ms, 1m): shorthand for
    /// --poll-interval-min and --poll-interval-max both set to it (no back-off).
    #[arg(long, env = "OUTBOX_POLL_INTERVAL", value_parser = parse_duration, conflicts_with_all = ["poll_interval_min", "poll_interval_max"])]
    pub poll_interval: Option<Duration>,

    /// The wait after the first empty poll; each further empty poll doubles it up to
    /// --poll-interval-max, and a poll that finds rows resets it. A notification (--listen)
    /// wakes a waiting worker at once.
    #[arg(long, env = "OUTBOX_POLL_INTERVAL_MIN", default_value = "100ms", value_parser = parse_duration)]
    pub poll_interval_min: Duration,

    /// The longest wait between two empty polls: what an idle outbox costs (one claim
    /// transaction per worker per interval) and, without --listen, the worst delay of a row
    /// written after a quiet spell.
    #[arg(long, env = "OUTBOX_POLL_INTERVAL_MAX", default_value = "1s", value_parser = parse_duration)]
    pub poll_interval_max: Duration,

    /// LISTEN for notifications on --listen-channel and wake a worker on each one; the
    /// application sends NOTIFY after its commit (docs/polling.md).
    #[arg(long, env = "OUTBOX_LISTEN")]
    pub listen: bool,

    /// The channel --listen listens on.
    #[arg(long, env = "OUTBOX_LISTEN_CHANNEL", default_value = "outbox", value_parser = parse_identifier)]
    pub listen_channel: String,

    // Polling mode deletes rows by published_at (src/poll/cleanup.rs).
    #[command(flatten)]
    pub cleanup: CleanupArgs,

    #[command(flatten)]
    pub endpoints: EndpointArgs,

    /// How often the backlog (unsent rows) and the oldest unsent row's age are read for
    /// /metrics, through the claim index (e.g. 5s; 0 turns it off).
    #[arg(long, env = "OUTBOX_BACKLOG_POLL_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub backlog_poll_interval: Duration,

    #[command(flatten)]
    pub delivery: Delivery,

    #[command(flatten)]
    pub dead_letter: DeadLetterArgs,

    #[command(flatten)]
    pub exchanges: ExchangePolicyArgs,

    #[command(flatten)]
    pub format: MessageFormatArgs,
}

impl PollArgs {
    /// The shortest and longest wait after an empty poll: --poll-interval for both, else
    /// --poll-interval-min and --poll-interval-max (a max below the min is raised to it).
    pub fn poll_intervals(&self) -> (Duration, Duration) {
        match self.poll_interval {
            Some(fixed) => (fixed, fixed),
            None => (
                self.poll_interval_min,
                self.poll_interval_max.max(self.poll_interval_min),
            ),
        }
    }
}

/// The HTTP endpoints, in both modes (src/observability/http.rs, docs/operations.md).
#[derive(Debug, Clone, Args)]
pub struct EndpointArgs {
    /// Address for /metrics, /healthz and /readyz (IP:port; in a container 0.0.0.0:9187 so
    /// probes reach it). Empty or `off` turns the endpoints off.
    #[arg(long, env = "OUTBOX_METRICS_ADDR", default_value = DEFAULT_METRICS_ADDR, value_parser = parse_metrics_addr)]
    pub metrics_addr: MetricsAddr,
}

/// `run`'s HTTP endpoints and slot poller (src/observability/http.rs, src/wal/slot.rs,
/// docs/operations.md).
#[derive(Debug, Clone, Args)]
pub struct ObservabilityArgs {
    #[command(flatten)]
    pub endpoints: EndpointArgs,

    /// How often the slot's lag, retained WAL and wal_status are read from
    /// pg_replication_slots (e.g. 5s; 0 turns the poller off).
    #[arg(long, env = "OUTBOX_SLOT_POLL_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub slot_poll_interval: Duration,
}

pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9187";

/// Where the metrics endpoints listen; `None` when turned off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsAddr(pub Option<std::net::SocketAddr>);

/// An `IP:port`, or empty / `off` for none.
pub fn parse_metrics_addr(text: &str) -> Result<MetricsAddr, String> {
    let text = text.trim();
    if text.is_empty() || text.eq_ignore_ascii_case("off") {
        return Ok(MetricsAddr(None));
    }
    text.parse()
        .map(|addr| MetricsAddr(Some(addr)))
        .map_err(|_| {
            format!("{text:?} is not an address such as 127.0.0.1:9187 or 0.0.0.0:9187 (or off)")
        })
}

/// The cleanup job: deletes delivered rows in small batches. The help here is WAL mode's
/// (src/cleanup.rs); `poll` says in its own words what its cleanup deletes.
#[derive(Debug, Clone, Args)]
pub struct CleanupArgs {
    /// How often rows older than --retention and than the last acknowledged commit are
    /// deleted (0 turns cleanup off). Only the relay that holds the slot runs it.
    #[arg(long, env = "OUTBOX_CLEANUP_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub cleanup_interval: Duration,

    /// How long a row is kept (by created_at) before cleanup may delete it; `resync --since`
    /// can re-publish rows this far back.
    #[arg(long, env = "OUTBOX_RETENTION", default_value = "1h", value_parser = parse_duration)]
    pub retention: Duration,

    /// Rows one cleanup DELETE removes (small batches keep lock times short).
    #[arg(long, env = "OUTBOX_CLEANUP_BATCH", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub cleanup_batch: u32,
}

#[derive(Debug, Clone, Args)]
#[command(
    mut_arg("mode", |arg| arg.help(
        "Which relay the outbox is for: `wal` (the slot must exist: exit 2 when it is missing \
         or lost) or `poll` (no slot is read; exit 2 when the table cannot be read or has no \
         published_at column)"
    )),
    mut_arg("metrics_addr", |arg| arg.help(
        "A running relay's --metrics-addr: its /readyz tells the message it is stuck on, if any"
    )),
    mut_arg("shards", |arg| arg.help(
        "How many shards `setup --shards` made: one line per shard's slot <slot>_<k> (state, \
         active pid, lag, retained WAL), the slot details of the worst one, and exit 2 when \
         any of them is missing or lost. 1 reads --slot itself"
    )),
)]
pub struct StatusArgs {
    #[command(flatten)]
    pub connections: DatabaseConnection,
    #[command(flatten)]
    pub names: StatusNames,
    #[command(flatten)]
    pub shards: ShardCount,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mode: ModeArgs,
    #[command(flatten)]
    pub endpoints: EndpointArgs,
}

#[derive(Debug, Clone, Args)]
#[command(mut_arg("shards", |arg| arg.help(
    "How many shards `setup --shards` made: teardown drops every shard's slot <slot>_<k>, \
     then every shard's publication <publication>_<k>, k = 0..N-1 (and refuses while any of \
     them is streamed). 1 drops --slot and --publication themselves"
)))]
pub struct TeardownArgs {
    #[command(flatten)]
    pub connections: DatabaseConnection,
    #[command(flatten)]
    pub names: SlotNames,
    #[command(flatten)]
    pub shards: ShardCount,
    /// Really drop the slot and the publication.
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ResyncArgs {
    #[command(flatten)]
    pub connections: Connections,
    #[command(flatten)]
    pub names: PublishNames,
    /// Re-publish rows with created_at at or after this RFC 3339 time, e.g.
    /// 2024-05-01T12:00:00Z or 2024-05-01T14:00:00.5+02:00.
    #[arg(long)]
    pub since: String,
    #[command(flatten)]
    pub publishing: Publishing,
    #[command(flatten)]
    pub exchanges: ExchangePolicyArgs,
    #[command(flatten)]
    pub format: MessageFormatArgs,
}

/// A duration: humantime's spellings (`250ms`, `5m`, `1h 30m`, `2days`), and what the relay
/// accepted before humantime, which humantime does not: a bare number of seconds (`60`) and a
/// decimal count of one unit (`1.5s`, `0.5 h`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(duration) = humantime::parse_duration(text) {
        return Ok(duration);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let count: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 1s, 250ms, 5m or 1h"))?;
    let unit = match unit.trim() {
        "" => Duration::from_secs(1),
        unit => humantime::parse_duration(&format!("1{unit}")).map_err(|_| {
            format!("unknown unit {unit:?} in {text:?}: use ms, s, m or h (or min, d, w)")
        })?,
    };
    Duration::try_from_secs_f64(unit.as_secs_f64() * count).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// What `outbox-relay [COMMAND] -h` and `--help` print, every command, with the values of
    /// any `[env: NAME=value]` the environment sets left out (the names stay).
    fn help_texts() -> String {
        let commands = ["", "setup", "run", "poll", "status", "teardown", "resync"];
        let mut out = String::new();
        for command in commands {
            for flag in ["-h", "--help"] {
                let argv = ["outbox-relay", command, flag];
                let argv = argv.iter().filter(|a| !a.is_empty());
                let help = match Cli::try_parse_from(argv) {
                    Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => e.render(),
                    _ => panic!("{command} {flag} must print help"),
                };
                out.push_str(&format!("==== outbox-relay {command} {flag}\n"));
                out.push_str(&without_env_values(&help.to_string()));
            }
        }
        out
    }

    fn without_env_values(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find("[env: ") {
            let (before, env) = rest.split_at(at);
            out.push_str(before);
            let end = env.find(']').unwrap_or(env.len());
            let name_end = env[..end].find('=').unwrap_or(end);
            out.push_str(&env[..name_end]);
            rest = &env[end..];
        }
        out.push_str(rest);
        out
    }

    /// The command line is an interface: a refactoring of the flag structs must not change a
    /// flag's name, environment variable, default or help. `src/snapshots/cli_help.txt` is
    /// the help as it was; regenerate it (OUTBOX_UPDATE_HELP_SNAPSHOT=1) only when a flag is
    /// meant to change.
    #[test]
    fn help_of_every_command_is_unchanged() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/snapshots/cli_help.txt");
        let actual = help_texts();
        if std::env::var_os("OUTBOX_UPDATE_HELP_SNAPSHOT").is_some() {
            std::fs::write(path, &actual).expect("write the snapshot");
        }
        let expected = std::fs::read_to_string(path).expect("read the snapshot");
        for (line, (want, got)) in expected.lines().zip(actual.lines()).enumerate() {
            assert_eq!(got, want, "help differs at line {} of {path}", line + 1);
        }
        assert_eq!(actual.lines().count(), expected.lines().count(), "{path}");
    }

    /// `outbox-relay <argv>`, parsed.
    fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("outbox-relay").chain(argv.iter().copied()))
    }

    /// A flag a command does not use is refused by that command's parser, not ignored: a
    /// `--heartbeat-interval-secs` given to `poll` would otherwise look like it had an effect.
    #[test]
    fn each_command_refuses_the_flags_it_does_not_use() {
        let db = ["--database-url", "postgres://x"];
        let refused: &[(&str, &[&str])] = &[
            ("poll", &["--heartbeat-interval-secs", "5"]),
            ("poll", &["--slot", "s"]),
            ("poll", &["--publication", "p"]),
            ("poll", &["--max-in-flight", "5"]),
            ("status", &["--amqp-url", "amqp://x"]),
            ("status", &["--amqp-url-file", "/f"]),
            ("status", &["--exchange", "x"]),
            ("status", &["--publication", "p"]),
            ("teardown", &["--max-in-flight", "5"]),
            ("teardown", &["--amqp-url", "amqp://x"]),
            ("teardown", &["--table", "t"]),
            ("teardown", &["--exchange", "x"]),
            ("resync", &["--heartbeat-interval-secs", "5"]),
            ("resync", &["--max-backoff-secs", "5"]),
            ("resync", &["--shutdown-timeout-secs", "5"]),
            ("resync", &["--slot", "s"]),
            ("resync", &["--publication", "p"]),
            ("poll", &["--emit-prefix", "p"]),
            ("run", &["--restrict-emit"]),
            ("run", &["--emit-role", "app"]),
            ("setup", &["--message-format", "cloudevents"]),
            ("status", &["--cloudevents-source", "urn:x"]),
            ("resync", &["--emit-prefix", "p"]),
            ("status", &["--emit-prefix", "p"]),
            ("teardown", &["--emit-prefix", "p"]),
        ];
        for (command, flag) in refused {
            let mut argv = vec![*command];
            argv.extend_from_slice(&db);
            argv.extend_from_slice(flag);
            let e = parse(&argv).expect_err(&format!("{command} must refuse {flag:?}"));
            assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument, "{e}");
            assert!(e.to_string().contains(flag[0]), "{e}");
        }
    }

    #[test]
    fn each_command_accepts_its_own_flags() {
        let amqp = ["--amqp-url", "amqp://x", "--amqp-url-file", "/f"];
        let names = [
            "--table",
            "t",
            "--publication",
            "p",
            "--slot",
            "s",
            "--exchange",
            "x",
        ];
        let delivery = [
            "--confirm-timeout-secs",
            "5",
            "--max-message-size",
            "5",
            "--max-backoff-secs",
            "5",
            "--shutdown-timeout-secs",
            "5",
        ];
        let accepted: &[(&str, Vec<&str>)] = &[
            (
                "setup",
                [
                    &amqp[..],
                    &names,
                    &["--print-sql", "--emit-prefix", "e", "--restrict-emit"],
                    &["--emit-role", "app", "--relay-role", "relay"],
                ]
                .concat(),
            ),
            (
                "run",
                [
                    &amqp[..],
                    &names,
                    &delivery,
                    &["--heartbeat-interval-secs", "5", "--max-in-flight", "5"],
                    &["--emit-prefix", "e"],
                ]
                .concat(),
            ),
            (
                "poll",
                [&amqp[..], &["--table", "t", "--exchange", "x"], &delivery].concat(),
            ),
            ("status", vec!["--table", "t", "--slot", "s", "--json"]),
            (
                "teardown",
                vec!["--publication", "p", "--slot", "s", "--yes"],
            ),
            (
                "resync",
                [
                    &amqp[..],
                    &[
                        "--table",
                        "t",
                        "--exchange",
                        "x",
                        "--since",
                        "2024-05-01T00:00:00Z",
                    ],
                    &delivery[..4],
                ]
                .concat(),
            ),
        ];
        for (command, flags) in accepted {
            let mut argv = vec![*command, "--database-url", "postgres://x"];
            argv.extend_from_slice(flags);
            if let Err(e) = parse(&argv) {
                panic!("{command} {flags:?}: {e}");
            }
        }
    }

    /// The emit prefix defaults to one per table, and may be neither the heartbeats' prefix
    /// nor text that could break the SQL of the emit functions.
    #[test]
    fn emit_prefix_defaults_per_table_and_refuses_the_heartbeat_prefix() {
        let run = |extra: &[&str]| {
            let mut argv = vec!["run", "--database-url", "postgres://x"];
            argv.extend_from_slice(extra);
            match parse(&argv).map(|cli| cli.command) {
                Ok(Command::Run(run)) => Ok(run.emit.prefix(&run.names.table)),
                Ok(_) => panic!("expected run"),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(run(&[]).as_deref(), Ok("outbox-relay:emit:public.outbox"));
        assert_eq!(
            run(&["--table", "app.events"]).as_deref(),
            Ok("outbox-relay:emit:app.events")
        );
        assert_eq!(run(&["--emit-prefix", "mine"]).as_deref(), Ok("mine"));
        let heartbeat = run(&["--emit-prefix", crate::wal::heartbeat::PREFIX]);
        assert!(
            heartbeat
                .as_ref()
                .is_err_and(|e| e.contains("--emit-prefix") && e.contains("heartbeats")),
            "{heartbeat:?}"
        );
        for bad in ["", "a$b", "a\nb"] {
            let refused = run(&["--emit-prefix", bad]);
            assert!(
                refused.as_ref().is_err_and(|e| e.contains("the prefix")),
                "{bad:?}: {refused:?}"
            );
        }
    }

    #[test]
    fn restrict_emit_needs_the_emit_role() {
        let e = parse(&["setup", "--restrict-emit"]).expect_err("needs --emit-role");
        assert_eq!(
            e.kind(),
            clap::error::ErrorKind::MissingRequiredArgument,
            "{e}"
        );
        assert!(e.to_string().contains("--emit-role"), "{e}");
    }

    #[test]
    fn run_defaults_match_the_design() {
        let cli = Cli::try_parse_from(["outbox-relay", "run", "--database-url", "postgres://x"])
            .expect("parses");
        let Command::Run(run) = cli.command else {
            panic!("expected run");
        };
        assert_eq!(run.names.slot, "outbox_slot");
        assert_eq!(run.names.publication, "outbox_pub");
        assert_eq!(run.names.exchange, "outbox");
        assert!(run.tuning.status_interval() <= Duration::from_millis(100));
    }

    #[test]
    fn poll_defaults_match_the_issue() {
        let cli = Cli::try_parse_from(["outbox-relay", "poll", "--database-url", "postgres://x"])
            .expect("parses");
        let Command::Poll(poll) = cli.command else {
            panic!("expected poll");
        };
        assert_eq!(poll.workers, DEFAULT_POLL_WORKERS);
        assert_eq!(poll.batch_size, DEFAULT_POLL_BATCH_SIZE);
        assert_eq!(
            poll.poll_intervals(),
            (Duration::from_millis(100), Duration::from_secs(1))
        );
        assert!(!poll.listen);
        assert_eq!(poll.listen_channel, "outbox");
        assert_eq!(poll.cleanup.retention, Duration::from_secs(3600));
        assert_eq!(poll.delivery.confirm_timeout(), Duration::from_secs(30));
    }

    #[test]
    fn a_fixed_poll_interval_sets_both_bounds_and_excludes_them() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["outbox-relay", "poll", "--database-url", "postgres://x"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv).map(|cli| match cli.command {
                Command::Poll(poll) => poll.poll_intervals(),
                _ => panic!("expected poll"),
            })
        };
        let fixed = Duration::from_millis(250);
        assert_eq!(
            parse(&["--poll-interval", "250ms"]).ok(),
            Some((fixed, fixed))
        );
        assert_eq!(
            parse(&["--poll-interval-min", "50ms", "--poll-interval-max", "30s"]).ok(),
            Some((Duration::from_millis(50), Duration::from_secs(30)))
        );
        assert!(parse(&["--poll-interval", "1s", "--poll-interval-max", "5s"]).is_err());
    }

    #[test]
    fn run_observability_and_cleanup_defaults() {
        let cli = Cli::try_parse_from(["outbox-relay", "run", "--database-url", "postgres://x"])
            .expect("parses");
        let Command::Run(run) = cli.command else {
            panic!("expected run");
        };
        assert_eq!(
            run.observability.endpoints.metrics_addr,
            MetricsAddr(Some("127.0.0.1:9187".parse().expect("addr")))
        );
        assert_eq!(run.observability.slot_poll_interval, Duration::from_secs(5));
        assert_eq!(run.cleanup.cleanup_interval, Duration::from_secs(60));
        assert_eq!(run.cleanup.retention, Duration::from_secs(3600));
        assert_eq!(run.cleanup.cleanup_batch, 1000);
    }

    #[test]
    fn metrics_addr_can_be_turned_off() {
        assert_eq!(parse_metrics_addr("off"), Ok(MetricsAddr(None)));
        assert_eq!(parse_metrics_addr(""), Ok(MetricsAddr(None)));
        assert_eq!(
            parse_metrics_addr("0.0.0.0:9187"),
            Ok(MetricsAddr(Some("0.0.0.0:9187".parse().expect("addr"))))
        );
        assert!(parse_metrics_addr("localhost").is_err());
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("soon").is_err());
        // Before humantime, days were an unknown unit; an unknown unit still is.
        assert!(parse_duration("5x").is_err());
    }

    /// Every spelling the hand-written parser accepted still means what it meant.
    #[test]
    fn durations_keep_every_spelling_accepted_before_humantime_and_add_its_own() {
        let ms = Duration::from_millis;
        for (text, expected) in [
            // A bare number is seconds, decimals included.
            ("0", ms(0)),
            ("60", ms(60_000)),
            ("1.5", ms(1500)),
            (".5", ms(500)),
            ("2.", ms(2000)),
            // Each unit, whole and decimal, with and without a space before it.
            ("250ms", ms(250)),
            ("0.5ms", Duration::from_micros(500)),
            ("1s", ms(1000)),
            ("1.5s", ms(1500)),
            ("1.5 s", ms(1500)),
            ("2m", ms(120_000)),
            ("2 m", ms(120_000)),
            ("1.5m", ms(90_000)),
            ("3min", ms(180_000)),
            ("0.5min", ms(30_000)),
            ("1h", ms(3_600_000)),
            ("0.5h", ms(1_800_000)),
            ("0.5 h", ms(1_800_000)),
            // Surrounding spaces.
            ("  5s  ", ms(5000)),
            (" 10 ", ms(10_000)),
            // And humantime's own spellings.
            ("1h 30m", ms(5_400_000)),
            ("1min 5s", ms(65_000)),
            ("2days", ms(172_800_000)),
            ("7d", ms(604_800_000)),
        ] {
            assert_eq!(parse_duration(text), Ok(expected), "{text:?}");
        }
    }

    #[test]
    fn duration_errors_say_what_is_accepted() {
        let e = parse_duration("soon").expect_err("not a number");
        assert!(e.contains("1s, 250ms, 5m or 1h"), "{e}");
        let e = parse_duration("1.5x").expect_err("unknown unit");
        assert!(
            e.contains("unknown unit \"x\"") && e.contains("ms, s, m or h"),
            "{e}"
        );
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("1e400h").is_err());
    }

    #[test]
    fn table_parts_default_to_public() {
        let table = TableName::from("outbox");
        assert_eq!(table.table_parts(), ("public", "outbox"));
        let table = TableName::from("app.events");
        assert_eq!(table.table_parts(), ("app", "events"));
        assert_eq!(table.qualified_table(), "\"app\".\"events\"");
    }

    /// A secret file with `text` and `mode`, in a directory that lives as long as the guard.
    fn secret_file(text: &str, mode: u32) -> (tempfile::TempDir, Option<String>) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("url");
        std::fs::write(&path, text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        let path = Some(path.display().to_string());
        (dir, path)
    }

    #[test]
    fn secret_comes_from_the_value_or_the_file() {
        let (_dir, file) = secret_file("postgres://from-file\n", 0o600);
        assert_eq!(
            secret("x", "X_URL", &Some(" v ".into()), &None).expect("value"),
            "v"
        );
        assert_eq!(
            secret("x", "X_URL", &None, &file).expect("file"),
            "postgres://from-file"
        );
        assert!(secret("x", "X_URL", &None, &None).is_err());
    }

    #[test]
    fn an_empty_secret_is_absent_and_the_error_names_the_variable() {
        for blank in ["", "  ", "\n"] {
            let e = secret("database URL", "DATABASE_URL", &Some(blank.into()), &None)
                .expect_err("a blank URL is no URL")
                .to_string();
            assert!(
                e.contains("No database URL given: DATABASE_URL (or --database-url) is empty")
                    && e.contains("DATABASE_URL_FILE (or --database-url-file) is not set"),
                "{e}"
            );
            // A blank *_FILE path is absent too.
            let e = secret("AMQP URL", "AMQP_URL", &None, &Some(blank.into()))
                .expect_err("a blank path is no file")
                .to_string();
            assert!(
                e.contains("AMQP_URL (or --amqp-url) is not set")
                    && e.contains("AMQP_URL_FILE (or --amqp-url-file) is empty"),
                "{e}"
            );
        }
        // A blank value beside a file: the file is the one given.
        let (_dir, file) = secret_file("amqp://from-file", 0o600);
        assert_eq!(
            secret("AMQP URL", "AMQP_URL", &Some(String::new()), &file).expect("file"),
            "amqp://from-file"
        );
        // A blank file is absent too, and the error names the file (never its content).
        let (_dir, file) = secret_file(" \n", 0o600);
        let e = secret("database URL", "DATABASE_URL", &None, &file)
            .expect_err("an empty file holds no URL")
            .to_string();
        let path = file.as_deref().expect("path");
        assert!(
            e.contains(&format!("The file {path}, named by DATABASE_URL_FILE"))
                && e.contains("is empty"),
            "{e}"
        );
    }

    #[test]
    fn a_secret_given_as_value_and_as_file_is_an_error_naming_both() {
        let (_dir, file) = secret_file("postgres://from-file", 0o600);
        let e = secret(
            "database URL",
            "DATABASE_URL",
            &Some("postgres://u:s3cret@db/app".into()),
            &file,
        )
        .expect_err("given twice")
        .to_string();
        assert!(
            e.contains("DATABASE_URL (or --database-url)")
                && e.contains("DATABASE_URL_FILE (or --database-url-file"),
            "{e}"
        );
        assert!(!e.contains("s3cret") && !e.contains("from-file"), "{e}");
    }

    /// Everything logged at WARN or above while `f` runs, as text.
    fn warnings_of<T>(f: impl FnOnce() -> T) -> (T, String) {
        #[derive(Clone, Default)]
        struct Buffer(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().expect("lock").extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let result = tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8_lossy(&buffer.0.lock().expect("lock")).into_owned();
        (result, text)
    }

    #[test]
    fn a_secret_file_others_may_read_is_warned_about_by_name_not_content() {
        for (mode, warned) in [(0o600, false), (0o400, false), (0o640, true), (0o644, true)] {
            let (_dir, file) = secret_file("amqp://u:s3cret@h/%2f", mode);
            let (url, log) = warnings_of(|| secret("AMQP URL", "AMQP_URL", &None, &file));
            assert_eq!(url.expect("read"), "amqp://u:s3cret@h/%2f");
            let path = file.as_deref().expect("path");
            if warned {
                assert!(
                    log.contains("WARN") && log.contains(path),
                    "{mode:o}: {log}"
                );
                assert!(log.contains(&format!("chmod 600 {path}")), "{log}");
            } else {
                assert!(log.is_empty(), "{mode:o}: {log}");
            }
            assert!(!log.contains("s3cret"), "{log}");
        }
        assert!(!readable_by_others(0o100600));
        assert!(readable_by_others(0o100604));
    }

    /// The parse error for `flag value` on `command`, as clap prints it.
    fn name_error(command: &str, flag: &str, value: &str) -> String {
        let argv = [
            "outbox-relay",
            command,
            "--database-url",
            "postgres://x",
            flag,
            value,
        ];
        match Cli::try_parse_from(argv) {
            Ok(_) => panic!("{command} {flag} {value:?} must be refused"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn hostile_names_are_refused_naming_the_flag() {
        let cases: &[(&str, &str, &str, &str)] = &[
            // (command, flag, value, what the error says)
            (
                "setup",
                "--publication",
                "p$$; DROP TABLE users; DO $$",
                "'$'",
            ),
            ("setup", "--publication", "p\nDROP TABLE users;", "U+000A"),
            ("setup", "--publication", "", "empty"),
            (
                "setup",
                "--publication",
                &"p".repeat(64),
                "at most 63 bytes",
            ),
            (
                "setup",
                "--table",
                "outbox\n; DROP TABLE users; --",
                "U+000A",
            ),
            ("setup", "--table", "app.", "empty"),
            ("setup", "--table", ".outbox", "empty"),
            ("setup", "--table", "db.app.outbox", "more than one '.'"),
            ("setup", "--table", "a$b.outbox", "'$'"),
            (
                "setup",
                "--table",
                &format!("app.{}", "t".repeat(64)),
                "at most 63 bytes",
            ),
            (
                "setup",
                "--slot",
                "Outbox_Slot",
                "lower-case letters, digits and underscores",
            ),
            (
                "setup",
                "--slot",
                "slot'); DROP TABLE users; --",
                "lower-case letters",
            ),
            ("setup", "--slot", &"s".repeat(64), "at most 63 bytes"),
            ("setup", "--slot", "", "empty"),
            ("run", "--exchange", "", "empty"),
            ("run", "--exchange", "ex\r\nchange", "U+000D"),
            ("run", "--exchange", "ex\u{1b}[31m", "U+001B"),
            ("run", "--exchange", &"e".repeat(256), "at most 255"),
            ("run", "--dead-letter-exchange", "dlx\n", "U+000A"),
            (
                "run",
                "--allowed-exchanges",
                "a,b\u{1b}[2J",
                "\"b\\u{1b}[2J\": the name holds the control character U+001B",
            ),
            ("poll", "--allowed-exchanges", "a,b$", "'$'"),
            ("poll", "--listen-channel", "ch$$", "'$'"),
            ("poll", "--table", "tab\tle", "U+0009"),
            ("status", "--slot", "a-b", "lower-case letters"),
            ("teardown", "--publication", "p\u{7f}", "U+007F"),
            ("resync", "--table", "", "empty"),
        ];
        for (command, flag, value, reason) in cases {
            let e = name_error(command, flag, value);
            assert!(
                e.contains(&format!("'{flag} <")),
                "{command} {flag} {value:?}: {e}"
            );
            assert!(e.contains(reason), "{command} {flag} {value:?}: {e}");
        }
    }

    #[test]
    fn unusual_names_postgresql_takes_quoted_are_accepted() {
        let argv = [
            "outbox-relay",
            "setup",
            "--table",
            "My Schema.Évents \"quoted\" 'x'",
            "--publication",
            "Pub; DROP TABLE users; -- 100%",
            "--slot",
            "slot_0",
            "--exchange",
            "events.topic:v1 ünïcode",
            "--dead-letter-exchange",
            "",
        ];
        let Command::Setup(setup) = Cli::try_parse_from(argv).expect("parses").command else {
            panic!("expected setup");
        };
        assert_eq!(
            setup.names.table_parts(),
            ("My Schema", "Évents \"quoted\" 'x'")
        );
        assert_eq!(setup.names.publication, "Pub; DROP TABLE users; -- 100%");
        // Exactly 63 bytes is PostgreSQL's limit, and ours.
        let longest = "s".repeat(63);
        assert_eq!(parse_slot_name(&longest), Ok(longest.clone()));
        assert_eq!(parse_identifier(&longest), Ok(longest));
    }

    #[test]
    fn a_sharded_relay_needs_its_shard_below_the_count() {
        let shard = |extra: &[&str]| {
            let mut args = vec!["outbox-relay", "run", "--database-url", "postgres://x"];
            args.extend_from_slice(extra);
            let Command::Run(run) = Cli::try_parse_from(args).expect("parses").command else {
                panic!("expected run");
            };
            run.shard.shard()
        };
        assert_eq!(shard(&[]).expect("default"), crate::shard::Shard::UNSHARDED);
        assert_eq!(
            shard(&["--shard", "0"]).expect("shard 0 of 1"),
            crate::shard::Shard::UNSHARDED
        );
        let two_of_four = shard(&["--shards", "4", "--shard", "2"]).expect("2 of 4");
        assert_eq!((two_of_four.index(), two_of_four.count()), (2, 4));
        let e = shard(&["--shards", "3"])
            .expect_err("no --shard")
            .to_string();
        assert!(
            e.contains("--shards is 3 but no --shard") && e.contains("OUTBOX_SHARD"),
            "{e}"
        );
        let e = shard(&["--shards", "3", "--shard", "3"])
            .expect_err("K < N")
            .to_string();
        assert!(e.contains("--shard is 3 but --shards is 3"), "{e}");
        assert!(shard(&["--shard", "1"]).is_err(), "shard 1 of 1");
        for refused in [["--shards", "0"], ["--shards", "65"]] {
            let mut args = vec!["outbox-relay", "run", "--database-url", "postgres://x"];
            args.extend_from_slice(&refused);
            assert!(Cli::try_parse_from(args).is_err(), "{refused:?}");
        }
        // Only the commands that provision, read, drop or stream slots take --shards.
        for command in ["poll", "resync"] {
            let args = ["outbox-relay", command, "--shards", "2"];
            assert!(Cli::try_parse_from(args).is_err(), "{command}");
        }
    }

    #[test]
    fn dead_letter_policy_defaults_to_halt_and_needs_an_exchange() {
        let run = |extra: &[&str]| {
            let mut args = vec!["outbox-relay", "run", "--database-url", "postgres://x"];
            args.extend_from_slice(extra);
            let Command::Run(run) = Cli::try_parse_from(args).expect("parses").command else {
                panic!("expected run");
            };
            run.dead_letter
        };
        let halt = run(&[]);
        assert_eq!(halt.on_unroutable, OnUnroutable::Halt);
        assert_eq!(halt.exchange("outbox").expect("halt"), None);
        let dead_letter = run(&["--on-unroutable", "dead-letter"]);
        let e = dead_letter.exchange("outbox").expect_err("no exchange");
        assert!(e.to_string().contains("--dead-letter-exchange"), "{e}");
        let same = run(&[
            "--on-unroutable",
            "dead-letter",
            "--dead-letter-exchange",
            "outbox",
        ]);
        assert!(same.exchange("outbox").is_err());
        let dlx = run(&[
            "--on-unroutable",
            "dead-letter",
            "--dead-letter-exchange",
            "outbox.dlx",
        ]);
        assert_eq!(
            dlx.exchange("outbox").expect("dead-letter"),
            Some("outbox.dlx".to_string())
        );
    }
}
