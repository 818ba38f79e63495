//! Command line and environment configuration.
//!
//! Every flag has an environment variable so the relay can be configured the way containers
//! are; secrets (the URLs carry passwords) can also come from a file named by `*_FILE`, so they
//! never have to appear in argv, where `ps` shows them to every user of the machine.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::error::RelayError;

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
}

/// Where the database and the broker are.
#[derive(Debug, Clone, Args)]
pub struct Connections {
    /// PostgreSQL URL, e.g. postgres://relay:secret@db:5432/app. The relay opens one ordinary
    /// connection and one logical replication connection with it.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// File holding the PostgreSQL URL (instead of --database-url), e.g. a mounted secret.
    #[arg(long, env = "DATABASE_URL_FILE")]
    pub database_url_file: Option<String>,

    /// RabbitMQ URL, e.g. amqp://user:secret@broker:5672/%2f (amqps:// for TLS).
    #[arg(long, env = "AMQP_URL", hide_env_values = true)]
    pub amqp_url: Option<String>,

    /// File holding the RabbitMQ URL (instead of --amqp-url).
    #[arg(long, env = "AMQP_URL_FILE")]
    pub amqp_url_file: Option<String>,
}

impl Connections {
    pub fn database_url(&self) -> Result<String, RelayError> {
        secret(
            "database URL",
            "--database-url",
            &self.database_url,
            &self.database_url_file,
        )
    }

    pub fn amqp_url(&self) -> Result<String, RelayError> {
        secret(
            "AMQP URL",
            "--amqp-url",
            &self.amqp_url,
            &self.amqp_url_file,
        )
    }
}

fn secret(
    what: &'static str,
    flag: &'static str,
    value: &Option<String>,
    file: &Option<String>,
) -> Result<String, RelayError> {
    match (value, file) {
        (Some(value), _) => Ok(value.clone()),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map(|text| text.trim().to_string())
            .map_err(|source| RelayError::SecretFile {
                what,
                path: path.clone(),
                source,
            }),
        (None, None) => Err(RelayError::Config(format!(
            "No {what} given: set {flag}, its environment variable, or its *_FILE variant"
        ))),
    }
}

/// The names of the objects the relay works with.
#[derive(Debug, Clone, Args)]
pub struct OutboxNames {
    /// The outbox table (optionally schema-qualified).
    #[arg(long, env = "OUTBOX_TABLE", default_value = "outbox")]
    pub table: String,

    /// The publication that feeds the slot (publish = 'insert', on the outbox table only).
    #[arg(long, env = "OUTBOX_PUBLICATION", default_value = "outbox_pub")]
    pub publication: String,

    /// The logical replication slot (plugin pgoutput).
    #[arg(long, env = "OUTBOX_SLOT", default_value = "outbox_slot")]
    pub slot: String,

    /// The exchange messages go to unless a row names its own (a durable topic exchange).
    #[arg(long, env = "OUTBOX_EXCHANGE", default_value = "outbox")]
    pub exchange: String,
}

impl OutboxNames {
    /// Schema and table name, `public` when the table name is unqualified.
    pub fn table_parts(&self) -> (&str, &str) {
        match self.table.split_once('.') {
            Some((schema, table)) => (schema, table),
            None => ("public", self.table.as_str()),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct SetupArgs {
    #[command(flatten)]
    pub connections: Connections,
    #[command(flatten)]
    pub names: OutboxNames,
    /// Do not create the outbox table (a DBA created it); still checks that it exists.
    #[arg(long, env = "OUTBOX_NO_CREATE_TABLE")]
    pub no_create_table: bool,
    /// Print the provisioning SQL for these names and exit, without connecting (for DBAs).
    #[arg(long)]
    pub print_sql: bool,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub connections: Connections,
    #[command(flatten)]
    pub names: OutboxNames,
    #[command(flatten)]
    pub tuning: Tuning,
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

    /// Seconds a published message may wait for its broker confirm before the relay gives up on
    /// the connection and reconnects (paused while the broker blocks publishers).
    #[arg(long, env = "OUTBOX_CONFIRM_TIMEOUT_SECS", default_value_t = 30)]
    pub confirm_timeout_secs: u64,

    /// Largest message body the broker accepts (RabbitMQ's max_message_size; its default is
    /// 128 MiB). A larger row stops the relay with an error naming it, before publishing.
    #[arg(long, env = "OUTBOX_MAX_MESSAGE_SIZE", default_value_t = 134_217_728)]
    pub max_message_size: usize,

    /// Longest wait between reconnect attempts, in seconds (backoff doubles from 0.5 s).
    #[arg(long, env = "OUTBOX_MAX_BACKOFF_SECS", default_value_t = 30)]
    pub max_backoff_secs: u64,

    /// Seconds a graceful shutdown may spend finishing the current transaction.
    #[arg(long, env = "OUTBOX_SHUTDOWN_TIMEOUT_SECS", default_value_t = 30)]
    pub shutdown_timeout_secs: u64,
}

impl Tuning {
    pub fn status_interval(&self) -> Duration {
        Duration::from_millis(self.status_interval_ms)
    }
    pub fn confirm_timeout(&self) -> Duration {
        Duration::from_secs(self.confirm_timeout_secs)
    }
    pub fn max_backoff(&self) -> Duration {
        Duration::from_secs(self.max_backoff_secs)
    }
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_secs(self.shutdown_timeout_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
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
    fn table_parts_default_to_public() {
        let mut names = OutboxNames {
            table: "outbox".into(),
            publication: String::new(),
            slot: String::new(),
            exchange: String::new(),
        };
        assert_eq!(names.table_parts(), ("public", "outbox"));
        names.table = "app.events".into();
        assert_eq!(names.table_parts(), ("app", "events"));
    }

    #[test]
    fn secret_prefers_value_then_file_then_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("url");
        std::fs::write(&path, "postgres://from-file\n").expect("write");
        let file = Some(path.display().to_string());
        assert_eq!(
            secret("x", "--x", &Some("v".into()), &file).expect("value"),
            "v"
        );
        assert_eq!(
            secret("x", "--x", &None, &file).expect("file"),
            "postgres://from-file"
        );
        assert!(secret("x", "--x", &None, &None).is_err());
    }
}
