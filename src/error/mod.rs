//! # Error handling
//!
//! Two classes, as in every relay that must not lose data:
//! - **transient**: a connection lost, a confirm that did not come, a nack, a returned
//!   (unroutable) message. Nothing after the failure was acknowledged, so the supervisor tears
//!   the session down and resumes from the slot after a backoff.
//! - **definite**: the configuration or the data is wrong (wal_level, a missing publication or
//!   slot, an invalidated slot, a row that cannot be mapped), or the relay itself broke an
//!   invariant (a bug). Retrying cannot help: the relay stops with a message that names the
//!   object, row or bug, having acknowledged nothing past it.
//!
//! A slot held by another process is its own case: this relay is a standby and waits.
//!
//! Under `--on-unroutable dead-letter` a returned message, and a row too large or unmappable,
//! are neither: delivery sends them to the dead-letter exchange. Only a dead letter that
//! cannot be delivered there either is an error again (transient: the relay retries).
//!
//! One classification: [`RelayError::kind`] names what kind of failure an error is, and
//! everything else is derived from that [`ErrorKind`]: the recovery the supervisor applies
//! ([`ErrorKind::recovery`]), the `cause` label of logs and the reconnect metric
//! ([`ErrorKind::label`]), which side of the relay is down for `/readyz`
//! ([`ErrorKind::side`]). Causes come as types or fields, never from an error's text (a
//! replication error's SQLSTATE field, a TLS failure's kind), read once where the error is
//! made. A definite error must never be classed
//! as retry (the relay would loop on a row it can never deliver), nor a transient one as stop
//! (an outage would end the relay).
//!
//! The errors are grouped by what the relay met: [`CatalogError`] (catalog.rs: wal_level,
//! the publication, the table, the role), [`SlotError`] (slot.rs: the slot and its
//! recovery), [`BrokerError`] (broker.rs: RabbitMQ over AMQP) and [`StreamError`] (stream.rs:
//! RabbitMQ over the stream protocol), each classifying its own variants, to which
//! [`RelayError::kind`] delegates; [`ConfigProblem`] (config.rs) names a configuration that
//! cannot work; kind.rs holds the classification itself. What is left in [`RelayError`]
//! belongs to no one part: PostgreSQL's connections and replication stream, the data, a bug.
//!
//! The messages say what is wrong; what to do about it (the fix, with SQL to paste) is
//! written by `crate::advice`, which knows the names and flags. This module depends on no
//! other part of the relay: every module may use it.

mod broker;
mod catalog;
mod config;
mod kind;
mod slot;
mod stream;

use tokio_postgres::error::SqlState;

pub(crate) use broker::BrokerError;
pub(crate) use catalog::CatalogError;
pub(crate) use config::ConfigProblem;
pub(crate) use kind::{ErrorKind, Side, SupervisorAction};
pub(crate) use slot::{SlotError, SlotProblem};
pub(crate) use stream::StreamError;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    // ---- definite: configuration and provisioning ----
    /// A parser's own text for a flag it cannot read (`--since`, `--column`, the exchange's
    /// name): free-form because the parser says what is wrong in its own words, with no
    /// advice to add. Any other configuration error is a [`ConfigProblem`].
    #[error("{0}")]
    Config(String),

    /// A configuration that cannot work, named by what is wrong with it.
    #[error(transparent)]
    Configuration(#[from] ConfigProblem),

    #[error("Cannot read the {what} from {path}")]
    SecretFile {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error("Cannot set up TLS with PostgreSQL ({reason})")]
    PgTls {
        reason: String,
        problem: TlsProblem,
        /// The URL named a CA (`sslrootcert`).
        ca_given: bool,
    },

    // ---- definite: data ----
    /// The replication stream carries bytes the decoder cannot read.
    #[error("Cannot decode the replication stream: {0}")]
    Decode(String),

    /// A row or emitted event that cannot be published, under the halt policy (or without an
    /// id to dead-letter it by). `problem` names the row and what is wrong with it; `fault`
    /// is what kind of problem that is, for the advice.
    #[error("{problem}")]
    Unpublishable {
        message_id: Option<String>,
        problem: String,
        fault: MapProblem,
    },

    // ---- definite: the relay's own invariant ----
    /// An invariant of the relay itself does not hold: retrying would only repeat it.
    #[error("Internal error (a bug in outbox-relay): {0}")]
    Bug(String),

    // ---- transient, unless the server's answer says otherwise ----
    #[error("PostgreSQL error")]
    Database(#[from] tokio_postgres::Error),

    /// No host of the URL answered, or none is the primary (outbox_common::pg).
    #[error(transparent)]
    DatabaseUnreachable(#[from] outbox_common::pg::Unreachable),

    #[error("Replication stream error")]
    Replication {
        /// The SQLSTATE the server sent (the crate's `ServerError::code`).
        sqlstate: Option<SqlState>,
        #[source]
        source: pgwire_replication::PgWireError,
    },

    #[error("Connecting to {endpoint} took longer than {seconds} s; retrying")]
    ConnectTimeout { endpoint: Endpoint, seconds: u64 },

    #[error("PostgreSQL did not answer within {seconds} s; reconnecting")]
    DatabaseTimeout { seconds: u64 },

    #[error("The PostgreSQL connection that listens for notifications ended")]
    NotificationsEnded,

    #[error(
        "The PostgreSQL server {server} is shutting down (a switchover or a restart): the \
         session stopped taking changes from it, so that a promoted standby replays as little \
         as possible; reconnecting to the primary"
    )]
    ServerShuttingDown { server: String },

    #[error("Unexpected replication stream content: {0}")]
    Protocol(String),

    #[error(
        "Nothing arrived on the replication stream for {seconds} s, not even the relay's own \
         heartbeats: the connection is presumed dead; reconnecting"
    )]
    StreamSilent { seconds: u64 },

    #[error("The replication stream ended unexpectedly")]
    StreamEnded,
    // ---- by the part of the relay that meets them ----
    /// What PostgreSQL's catalog says of the relay's objects: wal_level, the publication,
    /// the outbox table, the role.
    #[error(transparent)]
    Catalog(#[from] CatalogError),

    /// The replication slot: missing, lost, held by another process, or under recovery.
    #[error(transparent)]
    Slot(#[from] SlotError),

    /// RabbitMQ over AMQP 0-9-1: the connection, the channel and what it did with a publish.
    #[error(transparent)]
    Broker(#[from] BrokerError),

    /// RabbitMQ over the stream protocol (`--stream`, `--super-stream`).
    #[error(transparent)]
    Stream(#[from] StreamError),
}

/// What kind of row, emitted event or table the mapper cannot make a message of
/// (`crate::contract::row_error::MapError`), for the advice on it: the error's own text says
/// which row and what exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapProblem {
    /// The table lacks a column every message needs (`contract`: the contract's name).
    MissingColumn { contract: &'static str },
    /// The table lacks a column `flag` (`--header-column`) sends as a header.
    MissingHeaderColumn { flag: &'static str },
    /// The column read as `created_at` is not a timestamptz.
    CreatedAtType,
    /// A column the message needs is NULL.
    Null,
    /// A column arrived as an unchanged TOAST value in an INSERT.
    UnchangedToast,
    /// The body is over the broker's size limit.
    TooLarge,
    /// The row names an exchange `--allowed-exchanges` does not allow.
    ExchangeNotAllowed,
    /// An emitted event's envelope cannot be read.
    Envelope,
    /// An emitted event's envelope is newer than the relay reads.
    EnvelopeVersion,
    /// A value the contract cannot take: the message says which and why.
    Invalid,
}

/// What went wrong setting up TLS with PostgreSQL, by the kind the TLS layer gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsProblem {
    /// The certificate is not signed by the CA the relay trusts.
    UnknownIssuer,
    /// The certificate does not name the host in the URL.
    NameMismatch,
    /// The server does not accept TLS.
    Refused,
    /// The CA file named by sslrootcert cannot be read or holds no certificate.
    CaFile,
    /// Another certificate or configuration problem: it stays until someone fixes it.
    Definite,
    /// Anything else (a connection reset during the handshake): it may pass.
    Handshake,
}

impl TlsProblem {
    /// What the relay says and does about a TLS failure of `kind`.
    pub fn of(kind: pgwire_replication::TlsErrorKind) -> TlsProblem {
        use pgwire_replication::TlsErrorKind as Kind;
        match kind {
            Kind::UnknownIssuer => TlsProblem::UnknownIssuer,
            Kind::NameMismatch => TlsProblem::NameMismatch,
            Kind::Refused => TlsProblem::Refused,
            Kind::CaFile => TlsProblem::CaFile,
            Kind::Config | Kind::Certificate => TlsProblem::Definite,
            Kind::Handshake => TlsProblem::Handshake,
        }
    }
}

/// What a connection goes to, in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    PostgreSql,
    Replication,
    RabbitMq,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Endpoint::PostgreSql => "PostgreSQL",
            Endpoint::Replication => "the PostgreSQL replication connection",
            Endpoint::RabbitMq => "RabbitMQ",
        })
    }
}

impl RelayError {
    /// What kind of failure this is (see the module documentation).
    pub fn kind(&self) -> ErrorKind {
        use RelayError::*;
        match self {
            Catalog(e) => e.kind(),
            Slot(e) => e.kind(),
            Broker(e) => e.kind(),
            Stream(e) => e.kind(),
            Config(_) | Configuration(_) | SecretFile { .. } => ErrorKind::Config,
            PgTls { problem, .. } => match problem {
                TlsProblem::Handshake => ErrorKind::TlsHandshake,
                _ => ErrorKind::TlsConfig,
            },
            Decode(_) | Unpublishable { .. } => ErrorKind::Data,
            Bug(_) => ErrorKind::Bug,
            Database(e) => match e.code() {
                Some(code) if !transient_sqlstate(code) => ErrorKind::DatabaseRefused,
                _ => ErrorKind::DatabaseDown,
            },
            DatabaseUnreachable(_)
            | DatabaseTimeout { .. }
            | NotificationsEnded
            | ServerShuttingDown { .. } => ErrorKind::DatabaseDown,
            Replication { sqlstate, source } => replication_kind(sqlstate.as_ref(), source),
            ConnectTimeout { endpoint, .. } => match endpoint {
                Endpoint::RabbitMq => ErrorKind::BrokerConnectTimeout,
                Endpoint::PostgreSql | Endpoint::Replication => ErrorKind::DatabaseConnectTimeout,
            },
            Protocol(_) => ErrorKind::Protocol,
            StreamSilent { .. } => ErrorKind::StreamSilent,
            StreamEnded => ErrorKind::StreamEnded,
        }
    }

    /// Shorthand for `self.kind().recovery()`.
    pub fn recovery(&self) -> SupervisorAction {
        self.kind().recovery()
    }

    /// The message the pipeline stopped on, if a message was the cause: the next session
    /// publishes with a window of 1 until it is confirmed.
    pub fn stuck_message_id(&self) -> Option<&str> {
        match self {
            RelayError::Broker(e) => e.stuck_message_id(),
            _ => None,
        }
    }

    /// A replication error, with the SQLSTATE the server sent.
    pub fn replication(source: pgwire_replication::PgWireError) -> RelayError {
        let sqlstate = match &source {
            pgwire_replication::PgWireError::Server(error) => {
                error.code.as_deref().map(SqlState::from_code)
            }
            _ => None,
        };
        RelayError::Replication { sqlstate, source }
    }

    /// A failed TLS setup on either PostgreSQL connection; `ca_given` says whether the URL
    /// named a CA (sslrootcert).
    pub fn pg_tls(error: pgwire_replication::PgWireError, ca_given: bool) -> RelayError {
        let (kind, reason) = outbox_common::pg::tls_failure(error);
        RelayError::PgTls {
            problem: TlsProblem::of(kind),
            reason,
            ca_given,
        }
    }

    /// Replaces PostgreSQL's terse refusal of a role without REPLICATION with an error that
    /// names it: SQLSTATE 42501 on a replication connection (which checks no other
    /// privilege), or on an ordinary one from a slot function, whose message or detail then
    /// speaks of replication (15: "must be superuser or replication role"; 16+: "permission
    /// denied to use replication slots", "Only roles with the REPLICATION attribute …").
    /// `role` is the URL's user, when known.
    pub fn clarify(self, role: Option<&str>) -> RelayError {
        let refused = |code: Option<&SqlState>| code == Some(&SqlState::INSUFFICIENT_PRIVILEGE);
        let clarified = match &self {
            RelayError::Database(e) => e.as_db_error().is_some_and(|db| {
                let text = format!("{} {}", db.message(), db.detail().unwrap_or_default());
                refused(Some(db.code())) && text.to_lowercase().contains("replication")
            }),
            RelayError::Replication { sqlstate, .. } => refused(sqlstate.as_ref()),
            _ => false,
        };
        if clarified {
            RelayError::Catalog(CatalogError::NoReplicationPrivilege {
                role: role.map(str::to_string),
            })
        } else {
            self
        }
    }
}

/// SQLSTATE classes that retrying can fix: connection exceptions, operator intervention
/// (shutdown, crash recovery), insufficient resources, transaction rollback.
fn transient_sqlstate(code: &SqlState) -> bool {
    matches!(code.code().get(..2), Some("08" | "57" | "53" | "40"))
}

fn replication_kind(
    sqlstate: Option<&SqlState>,
    source: &pgwire_replication::PgWireError,
) -> ErrorKind {
    use pgwire_replication::PgWireError::*;
    match source {
        Server(_) => match sqlstate {
            Some(code) if *code == SqlState::OBJECT_IN_USE => ErrorKind::SlotHeld,
            Some(code) if !transient_sqlstate(code) => ErrorKind::ReplicationRefused,
            _ => ErrorKind::ReplicationDown,
        },
        Auth(_) | Tls(_) | MessageTooLarge { .. } => ErrorKind::ReplicationRefused,
        _ => ErrorKind::ReplicationDown,
    }
}

/// A connection error of the shared crate as the relay's error of the same text, which the
/// advice knows what to do about.
impl From<outbox_common::pg::PgError> for RelayError {
    fn from(error: outbox_common::pg::PgError) -> Self {
        use outbox_common::pg::PgError;
        match error {
            PgError::Url(problem) => ConfigProblem::DatabaseUrl(problem).into(),
            PgError::Tls {
                kind,
                reason,
                ca_given,
            } => RelayError::PgTls {
                problem: TlsProblem::of(kind),
                reason,
                ca_given,
            },
            PgError::Database(e) => RelayError::Database(e),
            PgError::Unreachable(unreachable) => RelayError::DatabaseUnreachable(unreachable),
            PgError::ConnectTimeout { seconds } => RelayError::ConnectTimeout {
                endpoint: Endpoint::PostgreSql,
                seconds,
            },
        }
    }
}

/// The replication crate's error for the ErrorResponse a server sends as `text`: the
/// message, and the SQLSTATE when `text` ends in "(SQLSTATE xxxxx)" (the crate's rendering).
#[cfg(test)]
pub(crate) fn server_error(text: &str) -> pgwire_replication::PgWireError {
    let (message, code) = match text.rsplit_once(" (SQLSTATE ") {
        Some((message, code)) => (message, code.strip_suffix(')')),
        None => (text, None),
    };
    let mut payload = vec![b'M'];
    payload.extend_from_slice(message.as_bytes());
    payload.push(0);
    if let Some(code) = code {
        payload.push(b'C');
        payload.extend_from_slice(code.as_bytes());
        payload.push(0);
    }
    payload.push(0);
    pgwire_replication::PgWireError::Server(pgwire_replication::ServerError::parse(&payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replication error as the server sends it: `message`, and the SQLSTATE in it.
    fn server(message: &str) -> RelayError {
        RelayError::replication(server_error(message))
    }

    #[test]
    fn missing_replication_privilege_is_named() {
        let e = server("must be superuser or replication role to start walsender (SQLSTATE 42501)")
            .clarify(Some("app_relay"));
        assert_eq!(e.recovery(), SupervisorAction::Stop);
        assert!(matches!(
            e,
            RelayError::Catalog(CatalogError::NoReplicationPrivilege { .. })
        ));
        let sixteen = server(
            "permission denied to start WAL sender: Only roles with the REPLICATION attribute \
             may start a WAL sender process. (SQLSTATE 42501)",
        )
        .clarify(None);
        assert!(matches!(
            sixteen,
            RelayError::Catalog(CatalogError::NoReplicationPrivilege { .. })
        ));
        let other = server("terminating connection (SQLSTATE 57P01)").clarify(None);
        assert!(matches!(other, RelayError::Replication { .. }));
    }

    #[test]
    fn slot_in_use_is_standby_and_auth_stops() {
        let e = server("replication slot \"s\" is active for PID 42 (SQLSTATE 55006)");
        assert_eq!(e.recovery(), SupervisorAction::Standby);
        assert_eq!(e.kind().label(), "standby");
        let e = RelayError::replication(pgwire_replication::PgWireError::Auth("no".into()));
        assert_eq!(e.recovery(), SupervisorAction::Stop);
        let e = server("terminating connection due to administrator command (SQLSTATE 57P01)");
        assert_eq!(e.recovery(), SupervisorAction::Retry);
        assert_eq!(e.kind().side(), Side::Stream);
        // A server error without a SQLSTATE is an outage until shown otherwise.
        assert_eq!(
            server("connection lost").recovery(),
            SupervisorAction::Retry
        );
    }

    /// A broken invariant of the relay stops it: retrying would repeat the bug forever.
    #[test]
    fn a_bug_stops_and_says_it_is_one() {
        let e = RelayError::Bug("settled a front that is not a publish".into());
        assert_eq!(e.recovery(), SupervisorAction::Stop);
        assert_eq!(e.kind().label(), "bug");
        assert!(e.to_string().contains("a bug in outbox-relay"), "{e}");
    }

    /// tokio-rustls's error for a handshake rustls refused with `error`.
    fn handshake_error(error: rustls::Error) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, error)
    }

    #[test]
    fn tls_failures_are_classified_by_rustls_error_type() {
        use pgwire_replication::TlsErrorKind as Kind;
        use rustls::{AlertDescription, CertificateError, Error};
        let kind = |error: Error| Kind::of_handshake(&handshake_error(error));
        let certificate = |error: CertificateError| kind(Error::InvalidCertificate(error));
        assert_eq!(
            certificate(CertificateError::UnknownIssuer),
            Kind::UnknownIssuer
        );
        assert_eq!(
            certificate(CertificateError::BadSignature),
            Kind::UnknownIssuer
        );
        assert_eq!(
            certificate(CertificateError::NotValidForName),
            Kind::NameMismatch
        );
        assert_eq!(certificate(CertificateError::Expired), Kind::Certificate);
        assert_eq!(
            kind(Error::AlertReceived(AlertDescription::UnknownCA)),
            Kind::Certificate
        );
        assert_eq!(kind(Error::DecryptError), Kind::Handshake);
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(Kind::of_handshake(&reset), Kind::Handshake);
        // A message that reads like a certificate problem is not classified by its words.
        let worded = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        assert_eq!(Kind::of_handshake(&worded), Kind::Handshake);
    }

    #[test]
    fn tls_problems_decide_the_recovery() {
        use pgwire_replication::{PgWireError, TlsError, TlsErrorKind as Kind};
        let pg_tls = |kind: Kind| {
            RelayError::pg_tls(PgWireError::Tls(TlsError::new(kind, "some text")), false)
        };
        for definite in [
            Kind::UnknownIssuer,
            Kind::NameMismatch,
            Kind::Refused,
            Kind::CaFile,
            Kind::Config,
            Kind::Certificate,
        ] {
            assert_eq!(
                pg_tls(definite).recovery(),
                SupervisorAction::Stop,
                "{definite:?}"
            );
        }
        assert_eq!(pg_tls(Kind::Handshake).recovery(), SupervisorAction::Retry);
        // The socket failing mid-handshake is a handshake failure: it may pass.
        let io = PgWireError::Io(std::sync::Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(
            RelayError::pg_tls(io, false).recovery(),
            SupervisorAction::Retry
        );
    }

    #[test]
    fn the_side_decides_readiness_and_the_stream_flush() {
        let broker_timeout = RelayError::ConnectTimeout {
            endpoint: Endpoint::RabbitMq,
            seconds: 15,
        };
        assert_eq!(broker_timeout.kind().side(), Side::Broker);
        let pg_timeout = RelayError::ConnectTimeout {
            endpoint: Endpoint::PostgreSql,
            seconds: 15,
        };
        assert_eq!(pg_timeout.kind().side(), Side::Database);
        assert_eq!(RelayError::StreamEnded.kind().side(), Side::Stream);
        assert!(
            RelayError::Broker(BrokerError::Nacked {
                message_id: "m".into()
            })
            .kind()
            .side()
                == Side::Broker
        );
    }
}
