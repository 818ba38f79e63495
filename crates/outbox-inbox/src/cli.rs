//! The command line of `outbox-inbox`: every flag has an environment variable (the URLs as
//! `DATABASE_URL` and `AMQP_URL`, the rest `OUTBOX_INBOX_…`), as the relay's do. URLs carry
//! passwords: give them by environment, not in argv. It must never connect to anything
//! (`--help` and `setup --print-sql` work with no server up).

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use outbox_common::duration::{parse_duration, parse_peer_timeout};
use outbox_common::liveness::{PeerTimeout, Policy};
pub use outbox_common::logging::LogFormat;

use crate::error::InboxError;
use crate::sql::InboxTable;

#[derive(Debug, Parser)]
#[command(
    name = "outbox-inbox",
    version,
    about = "The consumer's side of the outbox: an inbox that applies each message effectively once",
    long_about = "The consumer's side of the outbox: an inbox table in the consumer's database \
                  that makes applying each message effectively once (setup, cleanup), and a \
                  reference consumer that applies a queue's messages with it (consume). See \
                  docs/consumers.md."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// Log format: human-readable text or one JSON object per line.
    #[arg(long, env = "OUTBOX_INBOX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the inbox table, its cleanup index and its functions (sql/inbox.sql) in the
    /// consumer's database. Idempotent; prints what it created or found.
    Setup(SetupArgs),
    /// Apply a queue's messages effectively once: a transaction that claims each message in
    /// the inbox and runs the effect statement for it, then the acks.
    // Boxed: its flags make it far larger than the others.
    Consume(Box<ConsumeArgs>),
    /// Delete inbox rows older than the retention, in bounded batches (once, or every
    /// --interval).
    Cleanup(CleanupArgs),
}

/// The consumer's database.
#[derive(Debug, Clone, Args)]
pub struct Database {
    /// PostgreSQL URL of the consumer's database (where the inbox and the effects live), e.g.
    /// postgres://app:secret@db:5432/orders; TLS by libpq's sslmode and sslrootcert, as for
    /// the relay.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
}

impl Database {
    pub fn url(&self) -> Result<String, InboxError> {
        match self.database_url.as_deref().map(str::trim) {
            Some(url) if !url.is_empty() => Ok(url.to_string()),
            _ => Err(InboxError::Config(
                "No database URL given: DATABASE_URL (or --database-url) is empty or not set. \
                 Fix: set it to the consumer's database"
                    .into(),
            )),
        }
    }
}

/// `--peer-timeout`: every command that connects.
#[derive(Debug, Clone, Args)]
pub struct PeerTimeoutArgs {
    /// How long a peer (PostgreSQL, RabbitMQ) may leave what was sent unacknowledged, or its
    /// keepalive probes unanswered, before the connection is given up as dead (a host powered
    /// off, a network dropping packets). Sets TCP keepalives and TCP_USER_TIMEOUT on every
    /// connection, both ends: PostgreSQL then ends a vanished replica's session, and with it
    /// the claims it held, within about this; the AMQP heartbeat is half of it (unless the
    /// URL sets heartbeat=), so RabbitMQ hands a vanished replica's deliveries to another
    /// within about this too. From 2s to 1h, whole seconds (docs/consumers.md, "A replica
    /// that vanishes").
    #[arg(long, env = "OUTBOX_INBOX_PEER_TIMEOUT", default_value = "5s", value_parser = parse_peer_timeout)]
    pub peer_timeout: Duration,
}

impl PeerTimeoutArgs {
    pub fn get(&self) -> Result<PeerTimeout, InboxError> {
        PeerTimeout::new(self.peer_timeout).map_err(InboxError::Config)
    }
}

/// `--table`.
#[derive(Debug, Clone, Args)]
pub struct Table {
    /// The inbox table: `table` (in schema public) or `schema.table`; its functions are
    /// `<table>_claim` and `<table>_cleanup` in the same schema.
    #[arg(long = "table", env = "OUTBOX_INBOX_TABLE", default_value = "inbox", value_parser = InboxTable::parse)]
    pub table: InboxTable,
}

#[derive(Debug, Clone, Args)]
pub struct SetupArgs {
    #[command(flatten)]
    pub database: Database,
    #[command(flatten)]
    pub table: Table,
    #[command(flatten)]
    pub peer_timeout: PeerTimeoutArgs,
    /// Print the SQL (for a DBA to review and run with psql) instead of running it; connects
    /// to nothing.
    #[arg(long)]
    pub print_sql: bool,
}

/// The retention and the batch size, shared by `cleanup` and `consume`'s cleanup.
#[derive(Debug, Clone, Args)]
pub struct Retention {
    /// How long an applied message's inbox row is kept, counted back from the newest row of
    /// the same consumer name (so a consumer that receives nothing loses nothing, whatever
    /// the others sharing the table receive): a copy arriving later is applied again. Must outlast the relay's duplicates (docs/consumers.md, "How long to keep the
    /// inbox"); at least the outbox's own --retention if the relay's `resync` is to be
    /// absorbed.
    #[arg(long, env = "OUTBOX_INBOX_RETENTION", default_value = "24h", value_parser = parse_duration)]
    pub retention: Duration,

    /// Rows per cleanup transaction, at most (short locks).
    #[arg(long, env = "OUTBOX_INBOX_CLEANUP_BATCH", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub cleanup_batch: u32,
}

#[derive(Debug, Clone, Args)]
pub struct CleanupArgs {
    #[command(flatten)]
    pub database: Database,
    #[command(flatten)]
    pub table: Table,
    #[command(flatten)]
    pub peer_timeout: PeerTimeoutArgs,
    #[command(flatten)]
    pub retention: Retention,
    /// Run again every this long until SIGTERM; 0 runs once and exits (for cron).
    #[arg(long, env = "OUTBOX_INBOX_CLEANUP_INTERVAL", default_value = "0", value_parser = parse_duration)]
    pub interval: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct ConsumeArgs {
    #[command(flatten)]
    pub database: Database,
    #[command(flatten)]
    pub table: Table,

    /// RabbitMQ URL, e.g. amqp://user:secret@broker:5672/%2f (amqps:// for TLS).
    #[arg(long, env = "AMQP_URL", hide_env_values = true)]
    pub amqp_url: Option<String>,

    /// The queue to consume (it must exist, bound to the outbox exchange: the consumer
    /// declares nothing).
    #[arg(long, env = "OUTBOX_INBOX_QUEUE")]
    pub queue: String,

    /// This consumer's name in the inbox: one per service that applies the messages, the same
    /// for all of its replicas (two services sharing an inbox table must differ).
    #[arg(long, env = "OUTBOX_INBOX_CONSUMER")]
    pub consumer: String,

    /// The effect: one SQL statement run per message in the transaction that claims it (only
    /// when the claim is new), with
    /// $1 message_id, $2 type, $3 routing_key, $4 body (text, NULL unless UTF-8), $5 body
    /// (bytea), $6 headers (JSON text), $7 x-outbox-seq, $8 x-aggregate-type, $9
    /// x-aggregate-id, $10 timestamp (timestamptz); any of them or none.
    #[arg(
        long,
        env = "OUTBOX_INBOX_EFFECT_SQL",
        required_unless_present = "effect_sql_file",
        conflicts_with = "effect_sql_file"
    )]
    pub effect_sql: Option<String>,

    /// A file holding the effect statement (instead of --effect-sql).
    #[arg(long, env = "OUTBOX_INBOX_EFFECT_SQL_FILE")]
    pub effect_sql_file: Option<String>,

    /// Unacknowledged deliveries RabbitMQ sends ahead (basic.qos); at least --concurrency.
    #[arg(long, env = "OUTBOX_INBOX_PREFETCH", default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..))]
    pub prefetch: u16,

    /// Messages applied at the same time, each lane with its own PostgreSQL connection;
    /// messages of one aggregate (x-aggregate-id) always share a lane, in delivery order.
    #[arg(long, env = "OUTBOX_INBOX_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub concurrency: u16,

    /// Messages one transaction applies at most: a lane takes what waits for it, up to this,
    /// so that a backlog shares one commit (one WAL flush) over many messages; 1 commits each
    /// message alone.
    #[arg(long, env = "OUTBOX_INBOX_BATCH_SIZE", default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..))]
    pub batch_size: u16,

    #[command(flatten)]
    pub peer_timeout: PeerTimeoutArgs,

    /// Longest a statement of a claim or an effect (or of the cleanup) may run on
    /// PostgreSQL, lock waits included (statement_timeout on every connection). A statement
    /// that takes longer ends the session as a retry: its unacknowledged deliveries go back
    /// to the queue and come again. An effect that needs longer needs a longer timeout; 0
    /// leaves the server's (docs/consumers.md, "Statement timeout").
    #[arg(long, env = "OUTBOX_INBOX_STATEMENT_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub statement_timeout: Duration,

    /// The exchange a message goes to when its effect fails on its data (SQLSTATE class 22,
    /// 23, 44 or P0: it would fail every time), and a delivery without a message_id:
    /// published there (persistent, with its routing key and the reason in
    /// x-inbox-dead-letter-reason), and acknowledged once the broker confirms it; the
    /// consumer goes on. It must exist, with a durable queue bound to it (#). Without it
    /// such a message stops the consumer (docs/consumers.md, "Poison messages").
    #[arg(long, env = "OUTBOX_INBOX_DEAD_LETTER_EXCHANGE")]
    pub dead_letter_exchange: Option<String>,

    /// Longest wait between reconnects, and between attempts of a batch held after an
    /// error that can pass (e.g. 30s, 2m).
    #[arg(long, env = "OUTBOX_INBOX_MAX_BACKOFF", default_value = "30s", value_parser = parse_duration)]
    max_backoff: Duration,
    /// --max-backoff in seconds, as it was named before.
    #[arg(long, env = "OUTBOX_INBOX_MAX_BACKOFF_SECS", hide = true, conflicts_with = "max_backoff", value_parser = parse_duration)]
    max_backoff_secs: Option<Duration>,

    /// How long SIGTERM may take to finish the messages handed to the workers (e.g. 30s).
    #[arg(long, env = "OUTBOX_INBOX_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    shutdown_timeout: Duration,
    /// --shutdown-timeout in seconds, as it was named before.
    #[arg(long, env = "OUTBOX_INBOX_SHUTDOWN_TIMEOUT_SECS", hide = true, conflicts_with = "shutdown_timeout", value_parser = parse_duration)]
    shutdown_timeout_secs: Option<Duration>,

    #[command(flatten)]
    pub retention: Retention,

    /// How often this consumer deletes inbox rows past the retention; 0 leaves it to
    /// `outbox-inbox cleanup` (or a job calling <table>_cleanup).
    #[arg(long, env = "OUTBOX_INBOX_CLEANUP_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub cleanup_interval: Duration,
}

impl ConsumeArgs {
    pub fn max_backoff(&self) -> Duration {
        self.max_backoff_secs.unwrap_or(self.max_backoff)
    }

    pub fn shutdown_timeout(&self) -> Duration {
        self.shutdown_timeout_secs.unwrap_or(self.shutdown_timeout)
    }
}

impl Command {
    /// What every connection of this command gets (`outbox_common::liveness`): the peer
    /// timeout, and for `consume` the statement timeout; `setup` and `cleanup` leave the
    /// server's statement timeout (a cleanup batch has its own bound).
    pub fn connection_policy(&self) -> Result<Policy, InboxError> {
        let (peer_timeout, statement_timeout) = match self {
            Command::Setup(args) => (&args.peer_timeout, None),
            Command::Cleanup(args) => (&args.peer_timeout, None),
            Command::Consume(args) => (&args.peer_timeout, args.statement_timeout()),
        };
        Ok(Policy {
            peer_timeout: peer_timeout.get()?,
            statement_timeout,
        })
    }
}

impl ConsumeArgs {
    /// `--statement-timeout`: `None` for 0, the server's own.
    pub fn statement_timeout(&self) -> Option<Duration> {
        (!self.statement_timeout.is_zero()).then_some(self.statement_timeout)
    }

    pub fn amqp_url(&self) -> Result<String, InboxError> {
        match self.amqp_url.as_deref().map(str::trim) {
            Some(url) if !url.is_empty() => Ok(url.to_string()),
            _ => Err(InboxError::Config(
                "No RabbitMQ URL given: AMQP_URL (or --amqp-url) is empty or not set".into(),
            )),
        }
    }

    /// `--dead-letter-exchange`; an empty value (an environment variable set to nothing) is
    /// none.
    pub fn dead_letter_exchange(&self) -> Option<String> {
        self.dead_letter_exchange
            .as_deref()
            .map(str::trim)
            .filter(|exchange| !exchange.is_empty())
            .map(String::from)
    }

    /// The effect statement, from the flag or the file.
    pub fn effect_sql(&self) -> Result<String, InboxError> {
        match (&self.effect_sql, &self.effect_sql_file) {
            (Some(sql), _) => Ok(sql.clone()),
            (None, Some(path)) => std::fs::read_to_string(path).map_err(|e| {
                InboxError::Config(format!(
                    "Cannot read the effect statement from {path} (--effect-sql-file): {e}"
                ))
            }),
            (None, None) => Err(InboxError::Config(
                "No effect statement: give --effect-sql or --effect-sql-file".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cleanup::DEFAULT_RETENTION;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_has_an_environment_variable() {
        let cli = Cli::command();
        for command in cli.get_subcommands() {
            for arg in command.get_arguments() {
                let one_off = ["print_sql", "help", "version"].contains(&arg.get_id().as_str());
                assert!(
                    one_off || arg.get_env().is_some(),
                    "{} --{} has no environment variable",
                    command.get_name(),
                    arg.get_id()
                );
            }
        }
    }

    /// The durations take a humantime value; their old names, in seconds (a bare number is
    /// seconds), still work for this release, and both at once is refused.
    #[test]
    fn the_backoff_and_shutdown_durations_take_the_old_names_too() {
        let consume = ["outbox-inbox", "consume", "--queue", "q", "--consumer", "c"];
        let consume = [&consume[..], &["--effect-sql", "SELECT 1"]].concat();
        let args = |flags: &[&str]| {
            let cli = Cli::try_parse_from([&consume[..], flags].concat()).map_err(|e| e.kind())?;
            match cli.command {
                Command::Consume(args) => Ok((args.max_backoff(), args.shutdown_timeout())),
                _ => panic!("consume"),
            }
        };
        let secs = Duration::from_secs;
        assert_eq!(args(&[]), Ok((secs(30), secs(30))));
        assert_eq!(
            args(&["--max-backoff", "2m", "--shutdown-timeout", "500ms"]),
            Ok((secs(120), Duration::from_millis(500)))
        );
        assert_eq!(
            args(&["--max-backoff-secs", "5", "--shutdown-timeout-secs", "7"]),
            Ok((secs(5), secs(7)))
        );
        assert_eq!(
            args(&["--max-backoff", "5s", "--max-backoff-secs", "5"]),
            Err(clap::error::ErrorKind::ArgumentConflict)
        );
    }

    #[test]
    fn the_default_retention_is_the_documented_one() {
        let cli = Cli::try_parse_from(["outbox-inbox", "cleanup"]).expect("parses");
        let Command::Cleanup(args) = cli.command else {
            panic!("cleanup")
        };
        assert_eq!(args.retention.retention, DEFAULT_RETENTION);
        assert_eq!(args.interval, Duration::ZERO);
    }

    fn policy_of(args: &[&str]) -> Result<Policy, String> {
        let cli = Cli::try_parse_from(args).map_err(|e| e.to_string())?;
        cli.command.connection_policy().map_err(|e| e.to_string())
    }

    #[test]
    fn the_peer_and_statement_timeouts_default_to_5s_and_60s_and_reach_the_policy() {
        let consume = ["outbox-inbox", "consume", "--queue", "q", "--consumer", "c"];
        let consume = [&consume[..], &["--effect-sql", "SELECT 1"]].concat();
        let policy = policy_of(&consume).expect("defaults");
        assert_eq!(policy.peer_timeout.get(), Duration::from_secs(5));
        assert_eq!(policy.statement_timeout, Some(Duration::from_secs(60)));
        // The flags the partition test gives.
        let flags = ["--peer-timeout", "5s", "--statement-timeout", "60s"];
        let given = policy_of(&[&consume[..], &flags[..]].concat()).expect("given");
        assert_eq!(given, policy);
        let zero = policy_of(&[&consume[..], &["--statement-timeout", "0"]].concat());
        assert_eq!(zero.expect("0").statement_timeout, None, "0: the server's");
        let short = policy_of(&[&consume[..], &["--peer-timeout", "3s"]].concat());
        assert_eq!(
            short.expect("3 s").peer_timeout.get(),
            Duration::from_secs(3)
        );
        let refused = policy_of(&[&consume[..], &["--peer-timeout", "1s"]].concat());
        assert!(refused.expect_err("1 s").contains("between 2 s and 3600 s"));

        for command in [
            &["outbox-inbox", "setup"][..],
            &["outbox-inbox", "cleanup"][..],
        ] {
            let flags = [command, &["--peer-timeout", "7s"][..]].concat();
            let policy = policy_of(&flags).expect("setup, cleanup");
            assert_eq!(policy.peer_timeout.get(), Duration::from_secs(7));
            assert_eq!(policy.statement_timeout, None, "{command:?}: the server's");
        }
    }
}
