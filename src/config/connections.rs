//! Where the database and the broker are, and the secrets in their URLs (from a flag, its
//! variable, or a `*_FILE`).

use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::advice::{self, Warning};
use crate::error::{ConfigProblem, RelayError};
use outbox_common::duration::{parse_duration, parse_peer_timeout};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connections")]
pub struct DatabaseConnection {
    /// PostgreSQL URL, e.g. postgres://relay:secret@db:5432/app. `run` opens an ordinary
    /// connection and a logical replication connection with it; the other commands open
    /// ordinary connections only.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// File holding the PostgreSQL URL (instead of --database-url), e.g. a mounted secret.
    #[arg(long, env = "DATABASE_URL_FILE")]
    pub database_url_file: Option<String>,
}

/// Where the broker is: for the commands that publish or declare (`setup`, `run`, `poll`,
/// `resync`; `status` and `teardown` never talk to RabbitMQ).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connections")]
pub struct BrokerConnection {
    /// RabbitMQ URL, e.g. amqp://user:secret@broker:5672/%2f (amqps:// for TLS). A cluster:
    /// its nodes' URLs separated by commas; the relay tries them in a shuffled order (see
    /// --amqp-node-order) and moves to the next node when its connection is lost.
    #[arg(long, env = "AMQP_URL", hide_env_values = true)]
    pub amqp_url: Option<String>,

    /// File holding the RabbitMQ URL or URLs (instead of --amqp-url).
    #[arg(long, env = "AMQP_URL_FILE")]
    pub amqp_url_file: Option<String>,

    /// The order the relay tries a cluster's nodes in: `shuffled` (once at start, so a fleet
    /// of relays spreads over the nodes) or `listed` (the first URL first: the node that leads
    /// the outbox's quorum queues, since a publish through another node is forwarded to it;
    /// docs/high-availability.md).
    #[arg(long, env = "OUTBOX_AMQP_NODE_ORDER", value_enum, default_value_t = NodeOrder::Shuffled)]
    amqp_node_order: NodeOrder,

    /// `AMQP_NODE_ORDER`, as the variable was named before it took the `OUTBOX_` prefix.
    #[arg(
        long = "amqp-node-order-unprefixed",
        env = "AMQP_NODE_ORDER",
        hide = true,
        value_enum,
        conflicts_with = "amqp_node_order"
    )]
    amqp_node_order_unprefixed: Option<NodeOrder>,
}

/// The stream destination: `run` only (WAL mode), in place of the exchange.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Streams")]
pub struct StreamArgs {
    /// Deliver into this RabbitMQ stream (it must exist) through the stream protocol, instead
    /// of publishing to an exchange: a named producer whose publishing ids follow the slot's
    /// order, so the broker drops what a restart re-publishes and the stream holds each row
    /// once (docs/streams.md). The nodes, user and virtual host are
    /// --amqp-url's; rows' exchange and routing key are not used.
    #[arg(long, env = "OUTBOX_STREAM", conflicts_with = "super_stream")]
    pub stream: Option<String>,

    /// Deliver into this RabbitMQ super stream (it must exist), as --stream does into one
    /// stream: each row goes to the partition its aggregate_id hashes to (its message_id when
    /// it has none; murmur3, as the stream clients' producers route), so an aggregate's rows
    /// keep their commit order in one partition, each partition deduplicated on its own.
    #[arg(long, env = "OUTBOX_SUPER_STREAM")]
    pub super_stream: Option<String>,

    /// The stream protocol's port (the rabbitmq_stream plugin's listener) on every node
    /// --amqp-url names, for --stream and --super-stream: a session goes through the first
    /// node that answers, in the relay's node order. Default: 5552, or the plugin's TLS
    /// port 5551 for an amqps:// URL (TLS as for AMQP: the system's CAs, or SSL_CERT_FILE's).
    #[arg(long, env = "OUTBOX_STREAM_PORT", value_name = "PORT")]
    pub stream_port: Option<u16>,
}

/// `--amqp-node-order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NodeOrder {
    /// Shuffled once at start.
    Shuffled,
    /// As `--amqp-url` lists them.
    Listed,
}

/// Where the database and the broker are.
#[derive(Debug, Clone, Args)]
pub struct Connections {
    #[command(flatten)]
    pub database: DatabaseConnection,
    #[command(flatten)]
    pub broker: BrokerConnection,
}

/// How soon a vanished peer is given up: every command.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connections")]
pub struct PeerTimeoutArgs {
    /// How long a peer (PostgreSQL, RabbitMQ) may leave what the relay sent unacknowledged,
    /// or its keepalive probes unanswered, before the connection is given up as dead (a host
    /// powered off, a network dropping packets). Sets TCP keepalives on every connection,
    /// TCP_USER_TIMEOUT on the PostgreSQL ones, both ends (PostgreSQL then ends a vanished
    /// relay's sessions too; its walsender after wal_sender_timeout), and the AMQP heartbeat
    /// (half of it) where the URL sets none (docs/network-failures.md, "Dead peers: what a
    /// vanished host costs"). From 2s to 1h, whole seconds.
    #[arg(long, env = "OUTBOX_PEER_TIMEOUT", default_value = "5s", value_parser = parse_peer_timeout)]
    pub peer_timeout: Duration,
}

/// How long a statement may run: the commands that run unattended (`run`, `poll`, `resync`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connections")]
pub struct StatementTimeoutArgs {
    /// Longest a statement of the relay may run on PostgreSQL (statement_timeout on its
    /// ordinary connections: the backfill's reads, the state, the cleanup, polling's claims),
    /// lock waits included, so that no query waits without end. 0 leaves the server's.
    #[arg(long, env = "OUTBOX_STATEMENT_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub statement_timeout: Duration,
}

impl StatementTimeoutArgs {
    /// `None` for 0: the server's own setting.
    pub fn get(&self) -> Option<Duration> {
        (!self.statement_timeout.is_zero()).then_some(self.statement_timeout)
    }
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

    pub fn amqp_node_order(&self) -> NodeOrder {
        self.amqp_node_order_unprefixed
            .unwrap_or(self.amqp_node_order)
    }
}

impl Connections {
    pub fn database_url(&self) -> Result<String, RelayError> {
        self.database.database_url()
    }

    pub fn amqp_url(&self) -> Result<String, RelayError> {
        self.broker.amqp_url()
    }
}

/// A URL given as `var` (or its flag) or in the file `var_FILE` names. An empty or blank
/// value, path or file is absent, never "connect with the defaults" (an empty DATABASE_URL
/// would have libpq's defaults pick a server); both at once is an error, not a precedence
/// rule nobody remembers.
pub(super) fn secret(
    what: &'static str,
    var: &'static str,
    value: &Option<String>,
    file: &Option<String>,
) -> Result<String, RelayError> {
    let flag = format!("--{}", var.to_ascii_lowercase().replace('_', "-"));
    match (given(value), given(file)) {
        (Some(_), Some(path)) => Err(ConfigProblem::SecretTwice {
            what,
            var,
            flag,
            path: path.to_string(),
        }
        .into()),
        (Some(value), None) => Ok(value.trim().to_string()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|source| RelayError::SecretFile {
                what,
                path: path.to_string(),
                source,
            })?;
            warn_if_others_may_read(path);
            match text.trim() {
                "" => Err(ConfigProblem::SecretFileEmpty {
                    what,
                    var,
                    flag,
                    path: path.to_string(),
                }
                .into()),
                text => Ok(text.to_string()),
            }
        }
        (None, None) => {
            let state = |v: &Option<String>| if v.is_some() { "empty" } else { "not set" };
            Err(ConfigProblem::SecretMissing {
                what,
                var,
                flag,
                value_state: state(value),
                file_state: state(file),
            }
            .into())
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
            "{}",
            advice::warning(
                "the secret file is readable by its group or by others",
                Warning::SecretFileReadable { path }
            )
        );
    }
}

/// Whether the group or others may read a file of this mode.
pub(super) fn readable_by_others(mode: u32) -> bool {
    mode & 0o044 != 0
}
