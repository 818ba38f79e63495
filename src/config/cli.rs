//! The command line: the commands and the flag groups each one takes.
//!
//! Each command flattens only the flag groups it uses, so clap refuses a flag that does not
//! apply to it (the variables of the others go unread: containers share one environment).

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use super::connections::{
    Connections, DatabaseConnection, PeerTimeoutArgs, StatementTimeoutArgs, StreamArgs,
};
use super::messages::{
    DeadLetterArgs, EmitArgs, ExchangePolicyArgs, MessageFormatArgs, RestrictEmitArgs,
};
use super::modes::{
    FailoverSlotArgs, Mode, ModeArgs, OnPublished, OnSlotLost, RunShard, ShardCount,
};
use super::names::{
    parse_identifier, ColumnArgs, OutboxNames, PublishNames, SlotNames, StatusNames,
};
use super::observability::{CleanupArgs, EndpointArgs, ObservabilityArgs};
use super::tuning::{Delivery, PublishLimits, Tuning};
use crate::error::ConfigProblem;
use outbox_common::duration::parse_duration;

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

pub(crate) use outbox_common::logging::LogFormat;

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
    /// message a running relay is stuck on. Exits 4 when the slot is missing or lost (a probe).
    /// With --mode poll: no slot; unsent rows and the oldest unsent row's age instead.
    Status(StatusArgs),
    /// Drop the slot and the publication. Asks for --yes: the relay stops delivering, and an
    /// abandoned slot pins WAL on the primary until it is dropped.
    Teardown(TeardownArgs),
    /// Re-publish the rows still in the table created at or after --since, in created_at
    /// order, for rows no slot will deliver (inserted before the slot existed, or lost with it).
    Resync(ResyncArgs),
    /// Check a configuration before `setup` or `run`: the flags of `run` (with --mode poll,
    /// of `poll`), then PostgreSQL and RabbitMQ as that command needs them. One line per
    /// finding (ok, warn or error, with the fix); changes nothing. Exits 0 when all is ok, 5
    /// on warnings, 3 on errors.
    Check(CheckArgs),
}

impl Command {
    /// This command's peer timeout, and the statement timeout of the commands that run
    /// unattended (`run`, `poll`, `resync`); the others leave the server's (`setup` creates a
    /// slot, which waits for every running transaction).
    pub fn connection_limits(&self) -> (Duration, Option<Duration>) {
        match self {
            Command::Setup(args) => (args.peer_timeout.peer_timeout, None),
            Command::Run(args) => (args.peer_timeout.peer_timeout, args.statement_timeout.get()),
            Command::Poll(args) => (args.peer_timeout.peer_timeout, args.statement_timeout.get()),
            Command::Status(args) => (args.peer_timeout.peer_timeout, None),
            Command::Teardown(args) => (args.peer_timeout.peer_timeout, None),
            Command::Resync(args) => (args.peer_timeout.peer_timeout, args.statement_timeout.get()),
            Command::Check(args) => match &args.relay {
                Some(CheckedRelay::Run(run)) => {
                    (run.peer_timeout.peer_timeout, run.statement_timeout.get())
                }
                Some(CheckedRelay::Poll(poll)) => {
                    (poll.peer_timeout.peer_timeout, poll.statement_timeout.get())
                }
                // Not parsed yet (only `Cli::parse_all` fills it): the flag's default.
                None => (DEFAULT_PEER_TIMEOUT, None),
            },
        }
    }
}

/// `--peer-timeout`'s default, for a `check` whose relay flags were not parsed.
const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(5);

impl Cli {
    /// The command line, with `check`'s relay flags parsed as `run`'s or `poll`'s: a usage
    /// error among them exits here, printed by clap with that command's usage, like any other.
    pub fn parse_all() -> Cli {
        let mut cli = Cli::parse();
        if let Command::Check(args) = &mut cli.command {
            match args.parse_relay() {
                Ok(relay) => args.relay = Some(relay),
                Err(e) => e.exit(),
            }
        }
        cli
    }
}

/// `check`: a mode, and the flags of the command that runs it, passed through as they are.
///
/// The flags are parsed by `run`'s (or `poll`'s) own definition rather than a copy of it: a
/// flag added to `run` is checked with no change here, and one `run` refuses, `check` refuses.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("mode", |arg| arg.help(
    "Which relay to check the configuration of: `wal` (the flags of `run`, then wal_level, \
     slots, WAL senders, the role, the table, the publication and the slot) or `poll` (the \
     flags of `poll`, then the table, published_at and the claim index). Before the relay's \
     flags"
)))]
pub struct CheckArgs {
    #[command(flatten)]
    pub mode: ModeArgs,
    /// The flags of `run` (or of `poll` with --mode poll), as that command takes them, with
    /// its environment variables read as it reads them.
    #[arg(
        help_heading = "Relay",
        value_name = "RELAY FLAGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub flags: Vec<String>,
    /// The flags once parsed ([`Cli::parse_all`]).
    #[arg(skip)]
    pub relay: Option<CheckedRelay>,
}

/// The relay whose configuration `check` checks, with its flags.
#[derive(Debug, Clone, Subcommand)]
pub enum CheckedRelay {
    Run(RunArgs),
    Poll(PollArgs),
}

/// `check`'s relay flags, as a command line of their own.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay check")]
struct CheckedCommandLine {
    #[command(subcommand)]
    relay: CheckedRelay,
}

impl CheckArgs {
    /// The relay flags, parsed as `run`'s or, under `--mode poll`, `poll`'s.
    pub fn parse_relay(&self) -> Result<CheckedRelay, clap::Error> {
        let command = match self.mode.mode {
            Mode::Wal => "run",
            Mode::Poll => "poll",
        };
        let argv = ["outbox-relay check", command]
            .into_iter()
            .map(str::to_string)
            .chain(self.flags.iter().cloned());
        CheckedCommandLine::try_parse_from(argv).map(|line| line.relay)
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
    pub peer_timeout: PeerTimeoutArgs,
    #[command(flatten)]
    pub names: OutboxNames,
    #[command(flatten)]
    pub columns: ColumnArgs,
    #[command(flatten)]
    pub shards: ShardCount,
    /// Do not create the outbox table or the emit functions (a DBA created them); still
    /// checks that the table exists, and says whether the emit functions do.
    #[arg(help_heading = "Setup", long, env = "OUTBOX_NO_CREATE_TABLE")]
    pub no_create_table: bool,
    /// Print the provisioning SQL for these names and exit, without connecting (for DBAs).
    #[arg(help_heading = "Setup", long)]
    pub print_sql: bool,
    /// How long to keep retrying the first connection to PostgreSQL and to RabbitMQ while it
    /// fails for a reason that can pass (not listening yet, still starting up), with
    /// backoff; then the error (e.g. 60s). 0 tries once. For a setup started together with
    /// its servers.
    #[arg(help_heading = "Setup", long, env = "OUTBOX_CONNECT_TIMEOUT", default_value = "0s", value_parser = parse_duration)]
    connect_timeout: Duration,
    /// --connect-timeout's variable as it was named before, in seconds.
    #[arg(help_heading = "Setup", long, env = "OUTBOX_CONNECT_TIMEOUT_SECS", hide = true, conflicts_with = "connect_timeout", value_parser = parse_duration)]
    connect_timeout_secs: Option<Duration>,
    #[command(flatten)]
    pub mode: ModeArgs,
    #[command(flatten)]
    pub dead_letter: DeadLetterArgs,
    #[command(flatten)]
    pub emit: EmitArgs,
    #[command(flatten)]
    pub restrict_emit: RestrictEmitArgs,
    #[command(flatten)]
    pub failover: FailoverSlotArgs,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub connections: Connections,
    #[command(flatten)]
    pub peer_timeout: PeerTimeoutArgs,
    #[command(flatten)]
    pub statement_timeout: StatementTimeoutArgs,
    #[command(flatten)]
    pub names: OutboxNames,
    #[command(flatten)]
    pub columns: ColumnArgs,
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
    #[command(flatten)]
    pub failover: FailoverSlotArgs,
    #[command(flatten)]
    pub stream: StreamArgs,
    /// What to do when the slot is missing (a failover without failover slots: PostgreSQL
    /// 16 and older) or invalidated: `stop` (a person recovers: docs/recovery.md,
    /// "Recovering from a lost slot"), or `recreate`: create a new slot and re-publish from
    /// the table every row it will not deliver, from the last acknowledged commit recorded
    /// in the database (minus --recreate-margin), then stream it.
    #[arg(help_heading = "Slot recovery", long, env = "OUTBOX_ON_SLOT_LOST", value_enum, default_value_t = OnSlotLost::Stop)]
    pub on_slot_lost: OnSlotLost,
    /// With --on-slot-lost recreate: how far before the last acknowledged commit the
    /// backfill starts (by created_at), to take in transactions that were open across it.
    #[arg(help_heading = "Slot recovery", long, env = "OUTBOX_RECREATE_MARGIN", default_value = "10m", value_parser = parse_duration)]
    pub recreate_margin: Duration,
}

/// Polling workers by default: two overlap one's claim and commit with the other's confirms,
/// and drained a backlog at 0.94× the WAL reader where one worker managed 0.62×
/// (crates/outbox-bench/lab/records/2026-12-01-polling-levers.md, "Polling defaults:
/// against the WAL reader in one run"). A crash re-publishes at most workers × batch.
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
    pub peer_timeout: PeerTimeoutArgs,
    #[command(flatten)]
    pub statement_timeout: StatementTimeoutArgs,
    #[command(flatten)]
    pub names: PublishNames,
    #[command(flatten)]
    pub columns: ColumnArgs,

    /// Workers, each with its own database and broker connection, claiming batches in parallel.
    /// After a crash up to workers × batch size rows can be published again.
    #[arg(help_heading = "Polling", long, env = "OUTBOX_WORKERS", default_value_t = DEFAULT_POLL_WORKERS, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub workers: u32,

    /// Rows a worker claims, publishes and marks in one transaction (at most: a claim takes
    /// what is there, so batches stay small unless there is a backlog).
    #[arg(help_heading = "Polling", long, env = "OUTBOX_BATCH_SIZE", default_value_t = DEFAULT_POLL_BATCH_SIZE, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub batch_size: u32,

    /// What happens to a row once the broker confirmed it, in the claim's transaction:
    /// `mark` sets published_at (the cleanup deletes it after --retention); `delete` deletes
    /// it at once (no cleanup, no partial-index churn, but no record of what was sent and
    /// nothing for `resync`).
    #[arg(help_heading = "Polling", long, env = "OUTBOX_ON_PUBLISHED", value_enum, default_value_t = OnPublished::Mark)]
    pub on_published: OnPublished,

    /// A fixed wait after every poll that found no rows (e.g. 1s, 250ms, 1m): shorthand for
    /// --poll-interval-min and --poll-interval-max both set to it (no back-off).
    #[arg(help_heading = "Polling", long, env = "OUTBOX_POLL_INTERVAL", value_parser = parse_duration, conflicts_with_all = ["poll_interval_min", "poll_interval_max"])]
    pub poll_interval: Option<Duration>,

    /// The wait after the first empty poll; each further empty poll doubles it up to
    /// --poll-interval-max, and a poll that finds rows resets it. A notification (--listen)
    /// wakes a waiting worker at once.
    #[arg(help_heading = "Polling", long, env = "OUTBOX_POLL_INTERVAL_MIN", default_value = "100ms", value_parser = parse_duration)]
    pub poll_interval_min: Duration,

    /// The longest wait between two empty polls: what an idle outbox costs (one claim
    /// transaction per worker per interval) and, without --listen, the worst delay of a row
    /// written after a quiet spell. Below --poll-interval-min it is refused.
    #[arg(help_heading = "Polling", long, env = "OUTBOX_POLL_INTERVAL_MAX", default_value = "1s", value_parser = parse_duration)]
    pub poll_interval_max: Duration,

    /// LISTEN for notifications on --listen-channel and wake a worker on each one; the
    /// application sends NOTIFY after its commit (docs/polling.md).
    #[arg(help_heading = "Polling", long, env = "OUTBOX_LISTEN")]
    pub listen: bool,

    /// The channel --listen listens on.
    #[arg(help_heading = "Polling", long, env = "OUTBOX_LISTEN_CHANNEL", default_value = "outbox", value_parser = parse_identifier)]
    pub listen_channel: String,

    // Polling mode deletes rows by published_at (src/poll/cleanup.rs).
    #[command(flatten)]
    pub cleanup: CleanupArgs,

    #[command(flatten)]
    pub endpoints: EndpointArgs,

    /// How often the backlog (unsent rows) and the oldest unsent row's age are read for
    /// /metrics, through the claim index (e.g. 5s; 0 turns it off).
    #[arg(help_heading = "Observability", long, env = "OUTBOX_BACKLOG_POLL_INTERVAL", default_value = "5s", value_parser = parse_duration)]
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

impl SetupArgs {
    /// How long setup retries its first connections: --connect-timeout, or the seconds of
    /// the variable's old name.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout_secs.unwrap_or(self.connect_timeout)
    }
}

impl PollArgs {
    /// The shortest and longest wait after an empty poll: --poll-interval for both, else
    /// --poll-interval-min and --poll-interval-max; a max below the min is refused (which of
    /// the two was meant is the operator's to say).
    pub fn poll_intervals(&self) -> Result<(Duration, Duration), ConfigProblem> {
        match self.poll_interval {
            Some(fixed) => Ok((fixed, fixed)),
            None if self.poll_interval_max < self.poll_interval_min => {
                let text = |d: Duration| humantime::format_duration(d).to_string();
                Err(ConfigProblem::PollIntervalsCrossed {
                    min: text(self.poll_interval_min),
                    max: text(self.poll_interval_max),
                })
            }
            None => Ok((self.poll_interval_min, self.poll_interval_max)),
        }
    }
}

#[derive(Debug, Clone, Args)]
#[command(
    mut_arg("mode", |arg| arg.help(
        "Which relay the outbox is for: `wal` (the slot must exist: exit 4 when it is missing \
         or lost) or `poll` (no slot is read; exit 4 when the table cannot be read or has no \
         published_at column)"
    )),
    mut_arg("metrics_addr", |arg| arg.help(
        "A running relay's --metrics-addr: its /readyz tells the message it is stuck on, if any"
    )),
    mut_arg("shards", |arg| arg.help(
        "How many shards `setup --shards` made: one line per shard's slot <slot>_<k> (state, \
         active pid, lag, retained WAL), the slot details of the worst one, and exit 4 when \
         any of them is missing or lost. 1 reads --slot itself"
    )),
)]
pub struct StatusArgs {
    #[command(flatten)]
    pub connections: DatabaseConnection,
    #[command(flatten)]
    pub peer_timeout: PeerTimeoutArgs,
    #[command(flatten)]
    pub names: StatusNames,
    #[command(flatten)]
    pub columns: ColumnArgs,
    #[command(flatten)]
    pub shards: ShardCount,
    /// Print one JSON object instead of the table.
    #[arg(help_heading = "Output", long)]
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
    pub peer_timeout: PeerTimeoutArgs,
    #[command(flatten)]
    pub names: SlotNames,
    #[command(flatten)]
    pub shards: ShardCount,
    /// Really drop the slot and the publication.
    #[arg(help_heading = "Confirmation", long)]
    pub yes: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ResyncArgs {
    #[command(flatten)]
    pub connections: Connections,
    #[command(flatten)]
    pub peer_timeout: PeerTimeoutArgs,
    #[command(flatten)]
    pub statement_timeout: StatementTimeoutArgs,
    #[command(flatten)]
    pub names: PublishNames,
    #[command(flatten)]
    pub columns: ColumnArgs,
    /// Re-publish rows with created_at at or after this RFC 3339 time, e.g.
    /// 2024-05-01T12:00:00Z or 2024-05-01T14:00:00.5+02:00.
    #[arg(help_heading = "Resync", long)]
    pub since: String,
    #[command(flatten)]
    pub publishing: PublishLimits,
    #[command(flatten)]
    pub exchanges: ExchangePolicyArgs,
    #[command(flatten)]
    pub format: MessageFormatArgs,
}
