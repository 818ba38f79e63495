//! # Error handling
//!
//! Two classes, as in every relay that must not lose data:
//! - **transient**: a connection lost, a confirm that did not come, a nack, a returned
//!   (unroutable) message. Nothing after the failure was acknowledged, so the supervisor tears
//!   the session down and resumes from the slot after a backoff.
//! - **definite**: the configuration or the data is wrong (wal_level, a missing publication or
//!   slot, an invalidated slot, a row that cannot be mapped). Retrying cannot help: the relay
//!   stops with a message that names the object or row and the fix, having acknowledged nothing
//!   past it.
//!
//! Under `--on-unroutable dead-letter` a returned message, and a row too large or unmappable,
//! are neither: they go to the dead-letter exchange (`dead_letter`). Only a dead letter that
//! cannot be delivered there either is an error again (transient: the relay retries).
//!
//! A slot held by another process is its own case: this relay is a standby and waits.
//!
//! This module owns that classification: [`RelayError::recovery`] is the one place an error's
//! class is decided, and the supervisors (`wal`, `poll`) only act on it. A definite error must
//! never be classed as retry (the relay would loop on a row it can never deliver), nor a
//! transient one as stop (an outage would end the relay).

use crate::db::{quote_ident, sql_name, sql_table};
use crate::mapper::MapError;
use crate::pgoutput::DecodeError;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    // ---- definite: configuration and provisioning ----
    #[error("{0}")]
    Config(String),

    #[error("Cannot read the {what} from {path}")]
    SecretFile {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "PostgreSQL has wal_level = '{actual}', but logical replication needs wal_level = \
         'logical'. Fix: ALTER SYSTEM SET wal_level = 'logical'; then restart PostgreSQL \
         (or run `outbox-relay poll`, which needs no slot)"
    )]
    WalLevel { actual: String },

    // The SQL in a "Fix:" is what a DBA pastes into psql: names go in quoted where needed.
    #[error(
        "The publication \"{publication}\" does not exist. Fix: run `outbox-relay setup`, or \
         CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert')",
        sql_name(publication),
        sql_table(table)
    )]
    PublicationMissing { publication: String, table: String },

    #[error(
        "The publication \"{publication}\" does not include the table {table}. Fix: ALTER \
         PUBLICATION {} ADD TABLE {}",
        sql_name(publication),
        sql_table(table)
    )]
    PublicationDoesNotCoverTable { publication: String, table: String },

    #[error(
        "The publication \"{publication}\" {found}, but shard {shard} of --shards {shards} \
         needs the row filter `{expected}`: a relay whose shards differ from its \
         publication's would skip rows or deliver them twice. Fix: give every relay the \
         --shards (OUTBOX_SHARDS) that `outbox-relay setup --shards` made the publications \
         with (a filter's `% N) = K` names both); to change the number of shards, follow \
         docs/operations.md, \"Scaling out\""
    )]
    ShardFilterMismatch {
        publication: String,
        shard: u32,
        shards: u32,
        /// "has the row filter `…`" or "has no row filter".
        found: String,
        expected: String,
    },

    #[error(
        "The replication slot \"{slot}\" does not exist. Fix: run `outbox-relay setup` (it \
         creates the slot after the publication). Rows inserted while no slot existed are not \
         in any slot: re-publish them with `outbox-relay resync --since <time>`"
    )]
    SlotMissing { slot: String },

    #[error("The replication slot \"{slot}\" {problem}")]
    SlotUnusable { slot: String, problem: String },

    #[error(
        "The replication slot \"{slot}\" was invalidated (wal_status = 'lost'): PostgreSQL \
         removed WAL it still needed, so messages committed after {confirmed_flush} may be \
         missing. The relay will not recreate the slot silently. Recover: `outbox-relay \
         teardown --yes`, `outbox-relay setup`, then `outbox-relay resync --since <time of the \
         last delivered message>`; consider raising max_slot_wal_keep_size"
    )]
    SlotLost {
        slot: String,
        confirmed_flush: String,
    },

    #[error(
        "The table {table} does not exist. Fix: run `outbox-relay setup` or create it from sql/"
    )]
    TableMissing { table: String },

    #[error(
        "The database role {} may not use replication: it lacks the REPLICATION attribute. \
         Fix: ALTER ROLE {} REPLICATION (sql/role.sql has the least-privilege role), and allow \
         its replication connection in pg_hba.conf with a line for the database name (logical \
         replication connections match the database, not the `replication` keyword)",
        role.as_deref().map(|r| format!("\"{r}\"")).unwrap_or_else(|| "of the database URL".into()),
        role.as_deref().map(sql_name).unwrap_or_else(|| "<role>".into())
    )]
    NoReplicationPrivilege { role: Option<String> },

    #[error(
        "The replication slot \"{slot}\" is in use by process {pid} (a running relay): stop it \
         first, then run teardown again"
    )]
    SlotActive { slot: String, pid: String },

    #[error(
        "The role may not drop the publication \"{publication}\" (owned by {owner}): only its \
         owner or a superuser can. {slot_note} Ask the owner to run: DROP PUBLICATION {};",
        quote_ident(publication)
    )]
    PublicationNotOwned {
        publication: String,
        owner: String,
        slot_note: String,
    },

    #[error("Cannot set up TLS with PostgreSQL ({reason}). {hint}")]
    PgTls { reason: String, hint: &'static str },

    // ---- definite: data ----
    #[error("Cannot decode the replication stream")]
    Decode(#[from] DecodeError),

    #[error(transparent)]
    Map(#[from] MapError),

    // ---- standby ----
    #[error("The replication slot \"{slot}\" is in use by process {pid}")]
    SlotInUse { slot: String, pid: String },

    // ---- transient ----
    #[error("PostgreSQL error")]
    Database(#[from] tokio_postgres::Error),

    #[error("Cannot reach PostgreSQL at {host}:{port}")]
    DatabaseConnect {
        host: String,
        port: u16,
        #[source]
        source: std::io::Error,
    },

    #[error("Replication stream error")]
    Replication(#[source] pgwire_replication::PgWireError),

    #[error("Connecting to {what} took longer than {seconds} s; retrying")]
    ConnectTimeout { what: &'static str, seconds: u64 },

    #[error("PostgreSQL did not answer within {seconds} s; reconnecting")]
    DatabaseTimeout { seconds: u64 },

    #[error("RabbitMQ error")]
    Broker(#[from] lapin::Error),

    #[error("RabbitMQ did not confirm message {message_id} within {seconds} s; reconnecting")]
    ConfirmTimeout { message_id: String, seconds: u64 },

    #[error("RabbitMQ rejected (nacked) message {message_id}; it will be retried")]
    Nacked { message_id: String },

    #[error(
        "RabbitMQ returned message {message_id} as unroutable ({reply_code} {reply_text}): no \
         queue is bound to exchange \"{exchange}\" for routing key \"{routing_key}\". Fix: bind \
         a queue; the relay retries and does not move past this message"
    )]
    Returned {
        message_id: String,
        exchange: String,
        routing_key: String,
        reply_code: u16,
        reply_text: String,
    },

    #[error(
        "RabbitMQ returned message {message_id} as unroutable ({reply_code} {reply_text}; \
         exchange \"{exchange}\", routing key \"{routing_key}\") after the relay had counted it \
         delivered: the return came later than AMQP's order allows (basic.return before the ack \
         that covers the message). Stopping before acknowledging anything more; the relay \
         restarts from its last acknowledged position. Fix: bind a queue for this routing key, \
         and report the broker version"
    )]
    ReturnedAfterSettle {
        message_id: String,
        exchange: String,
        routing_key: String,
        reply_code: u16,
        reply_text: String,
    },

    #[error(
        "RabbitMQ returned the dead letter of message {message_id} as unroutable ({reply_code} \
         {reply_text}): no queue is bound to the dead-letter exchange \"{exchange}\" for \
         routing key \"{routing_key}\". Fix: bind a queue to \"{exchange}\" (with `#` for \
         every dead letter); the relay retries and does not move past this message"
    )]
    DeadLetterReturned {
        message_id: String,
        exchange: String,
        routing_key: String,
        reply_code: u16,
        reply_text: String,
    },

    #[error(
        "The exchange \"{exchange}\" does not exist on the broker. Fix: run `outbox-relay \
         setup` with the same flags (it declares the exchange and, under `--on-unroutable \
         dead-letter`, the dead-letter exchange, both durable topic exchanges) or declare it; \
         the relay retries"
    )]
    ExchangeMissing { exchange: String },

    #[error("Unexpected replication stream content: {0}")]
    Protocol(String),

    #[error(
        "Nothing arrived on the replication stream for {seconds} s, not even the relay's own \
         heartbeats: the connection is presumed dead; reconnecting"
    )]
    StreamSilent { seconds: u64 },

    #[error("The replication stream ended unexpectedly")]
    StreamEnded,

    #[error("Internal task failed: {0}")]
    Task(String),
}

/// What the supervisor does after a session ends with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Reconnect after a backoff and resume from the slot.
    Retry,
    /// Another process holds the slot: wait as a standby and retry.
    Standby,
    /// Stop the relay: retrying cannot help.
    Stop,
}

impl RelayError {
    pub fn recovery(&self) -> Recovery {
        use RelayError::*;
        match self {
            Config(_)
            | SecretFile { .. }
            | WalLevel { .. }
            | PublicationMissing { .. }
            | PublicationDoesNotCoverTable { .. }
            | ShardFilterMismatch { .. }
            | SlotMissing { .. }
            | SlotUnusable { .. }
            | SlotLost { .. }
            | TableMissing { .. }
            | NoReplicationPrivilege { .. }
            | SlotActive { .. }
            | PublicationNotOwned { .. }
            | Decode(_)
            | Map(_) => Recovery::Stop,
            SlotInUse { .. } => Recovery::Standby,
            PgTls { reason, .. } => tls_recovery(reason),
            Database(e) => database_recovery(e),
            Replication(e) => replication_recovery(e),
            Broker(_)
            | DatabaseConnect { .. }
            | DatabaseTimeout { .. }
            | ConnectTimeout { .. }
            | ExchangeMissing { .. }
            | ConfirmTimeout { .. }
            | Nacked { .. }
            | Returned { .. }
            | ReturnedAfterSettle { .. }
            | DeadLetterReturned { .. }
            | StreamEnded
            | StreamSilent { .. }
            | Protocol(_)
            | Task(_) => Recovery::Retry,
        }
    }

    /// The message the pipeline stopped on, if a message was the cause: the next session
    /// publishes with a window of 1 until it is confirmed.
    pub fn stuck_message_id(&self) -> Option<&str> {
        match self {
            RelayError::ConfirmTimeout { message_id, .. }
            | RelayError::Nacked { message_id }
            | RelayError::Returned { message_id, .. }
            | RelayError::ReturnedAfterSettle { message_id, .. }
            | RelayError::DeadLetterReturned { message_id, .. } => Some(message_id),
            _ => None,
        }
    }

    /// A short label for logs and the reconnect metric.
    pub fn cause(&self) -> &'static str {
        use RelayError::*;
        match self {
            Database(_) | DatabaseConnect { .. } | DatabaseTimeout { .. } => "database",
            PgTls { .. } => "tls",
            ConnectTimeout { .. } => "connect_timeout",
            Replication(_) => "replication",
            Broker(_) => "broker",
            ConfirmTimeout { .. } => "confirm_timeout",
            Nacked { .. } => "nack",
            Returned { .. } => "unroutable",
            ReturnedAfterSettle { .. } => "returned_after_settle",
            DeadLetterReturned { .. } => "dead_letter_unroutable",
            ExchangeMissing { .. } => "exchange_missing",
            StreamEnded => "stream_ended",
            StreamSilent { .. } => "no_heartbeat",
            SlotInUse { .. } => "standby",
            _ => "other",
        }
    }
}

impl RelayError {
    /// Replaces PostgreSQL's terse refusals that have a known fix with an error that names
    /// it: a role without REPLICATION (SQLSTATE 42501 on a replication connection, or on
    /// slot functions) becomes [`RelayError::NoReplicationPrivilege`]. `role` is the URL's
    /// user, when known.
    pub fn clarify(self, role: Option<&str>) -> RelayError {
        let lacks_replication = |sqlstate: Option<&str>, message: &str| {
            sqlstate == Some("42501") && message.contains("replication role")
        };
        let clarified = match &self {
            RelayError::Database(e) => e
                .as_db_error()
                .is_some_and(|db| lacks_replication(Some(db.code().code()), db.message())),
            RelayError::Replication(e) => {
                lacks_replication(replication_sqlstate(e), &e.to_string())
            }
            _ => false,
        };
        if clarified {
            RelayError::NoReplicationPrivilege {
                role: role.map(str::to_string),
            }
        } else {
            self
        }
    }
}

impl RelayError {
    /// A failed TLS setup on either PostgreSQL connection, with the fix for the usual
    /// causes. `tls` is what the URL's sslmode and sslrootcert asked for.
    pub fn pg_tls(
        error: pgwire_replication::PgWireError,
        tls: &pgwire_replication::TlsConfig,
    ) -> RelayError {
        let reason = match error {
            pgwire_replication::PgWireError::Tls(reason) => reason,
            other => other.to_string(),
        };
        let hint = if reason.contains("UnknownIssuer") || reason.contains("BadSignature") {
            if tls.ca_pem_path.is_some() {
                "The server's certificate is not signed by the CA in sslrootcert. Fix: set \
                 sslrootcert in the database URL to the CA that signed the server's certificate"
            } else {
                "The server's certificate is not signed by a well-known CA. Fix: add \
                 sslrootcert=/path/to/ca.pem (the CA that signed it) to the database URL"
            }
        } else if reason.contains("NotValidForName") {
            "The server's certificate does not name the host in the database URL. Fix: connect \
             by a name the certificate lists, or use sslmode=verify-ca"
        } else if reason.contains("SSLRequest rejected") {
            "The server does not accept TLS connections. Fix: enable ssl on the server, or \
             lower sslmode in the database URL (prefer uses TLS only when offered)"
        } else if reason.contains("CA PEM") || reason.contains("CA certificates") {
            "Fix: sslrootcert in the database URL must name a readable PEM file holding the CA \
             certificate"
        } else {
            "Fix: check sslmode and sslrootcert in the database URL"
        };
        RelayError::PgTls { reason, hint }
    }
}

/// A certificate or configuration problem stays until someone fixes it; anything else (a
/// connection reset during the handshake) may pass.
fn tls_recovery(reason: &str) -> Recovery {
    let definite = [
        "certificate",
        "Certificate",
        "config error",
        "SSLRequest rejected",
        "Unix domain",
    ];
    if definite.iter().any(|needle| reason.contains(needle)) {
        Recovery::Stop
    } else {
        Recovery::Retry
    }
}

/// SQLSTATE classes that retrying can fix: connection exceptions, operator intervention
/// (shutdown, crash recovery), insufficient resources.
fn database_recovery(e: &tokio_postgres::Error) -> Recovery {
    match e.code() {
        None => Recovery::Retry,
        Some(code) => {
            let class = &code.code()[..2];
            if matches!(class, "08" | "57" | "53" | "40") {
                Recovery::Retry
            } else {
                Recovery::Stop
            }
        }
    }
}

fn replication_recovery(e: &pgwire_replication::PgWireError) -> Recovery {
    use pgwire_replication::PgWireError::*;
    match e {
        Server(_) => match replication_sqlstate(e).unwrap_or("") {
            "55006" => Recovery::Standby,
            s if s.starts_with("08") || s.starts_with("57") || s.starts_with("53") => {
                Recovery::Retry
            }
            "" => Recovery::Retry,
            _ => Recovery::Stop,
        },
        Auth(_) | Tls(_) | MessageTooLarge { .. } => Recovery::Stop,
        _ => Recovery::Retry,
    }
}

/// The SQLSTATE of a replication error, when the server sent one (the crate renders the
/// server's ErrorResponse as text ending in "(SQLSTATE xxxxx)").
pub fn replication_sqlstate(e: &pgwire_replication::PgWireError) -> Option<&str> {
    match e {
        pgwire_replication::PgWireError::Server(message) => message
            .split("SQLSTATE ")
            .nth(1)
            .and_then(|rest| rest.get(..5)),
        _ => None,
    }
}

/// An error and its sources, one line (`a: b: c`), for logs.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_replication_privilege_names_the_fix() {
        let e = RelayError::Replication(pgwire_replication::PgWireError::Server(
            "must be superuser or replication role to start walsender (SQLSTATE 42501)".into(),
        ))
        .clarify(Some("app_relay"));
        assert_eq!(e.recovery(), Recovery::Stop);
        let text = e.to_string();
        assert!(text.contains("REPLICATION"), "{text}");
        assert!(text.contains("ALTER ROLE app_relay REPLICATION"), "{text}");
        assert!(text.contains("pg_hba.conf"), "{text}");
        let other = RelayError::Replication(pgwire_replication::PgWireError::Server(
            "permission denied for table outbox (SQLSTATE 42501)".into(),
        ))
        .clarify(None);
        assert!(matches!(other, RelayError::Replication(_)));
    }

    /// A name that reaches a "Fix:" is quoted there, so pasting the fix runs only the fix.
    #[test]
    fn names_in_the_suggested_sql_are_quoted_where_needed() {
        let publication = "Pub; DROP TABLE users; --".to_string();
        let table = "My App.events".to_string();
        let missing = RelayError::PublicationMissing {
            publication: publication.clone(),
            table: table.clone(),
        }
        .to_string();
        assert!(
            missing.contains(
                "CREATE PUBLICATION \"Pub; DROP TABLE users; --\" FOR TABLE \"My App\".events"
            ),
            "{missing}"
        );
        let uncovered = RelayError::PublicationDoesNotCoverTable {
            publication: publication.clone(),
            table,
        }
        .to_string();
        assert!(
            uncovered.contains(
                "ALTER PUBLICATION \"Pub; DROP TABLE users; --\" ADD TABLE \"My App\".events"
            ),
            "{uncovered}"
        );
        let not_owned = RelayError::PublicationNotOwned {
            publication: "x\"; DROP TABLE users; --".into(),
            owner: "dba".into(),
            slot_note: String::new(),
        }
        .to_string();
        assert!(
            not_owned.ends_with("DROP PUBLICATION \"x\"\"; DROP TABLE users; --\";"),
            "{not_owned}"
        );
        let role = RelayError::NoReplicationPrivilege {
            role: Some("App Relay".into()),
        }
        .to_string();
        assert!(
            role.contains("ALTER ROLE \"App Relay\" REPLICATION"),
            "{role}"
        );
        // Plain names stay as they were.
        let plain = RelayError::PublicationMissing {
            publication: "outbox_pub".into(),
            table: "outbox".into(),
        }
        .to_string();
        assert!(
            plain.contains("CREATE PUBLICATION outbox_pub FOR TABLE outbox"),
            "{plain}"
        );
    }

    #[test]
    fn slot_in_use_is_standby_and_auth_stops() {
        let e = RelayError::Replication(pgwire_replication::PgWireError::Server(
            "replication slot \"s\" is active for PID 42 (SQLSTATE 55006)".into(),
        ));
        assert_eq!(e.recovery(), Recovery::Standby);
        let e = RelayError::Replication(pgwire_replication::PgWireError::Auth("no".into()));
        assert_eq!(e.recovery(), Recovery::Stop);
        let e = RelayError::Replication(pgwire_replication::PgWireError::Server(
            "terminating connection due to administrator command (SQLSTATE 57P01)".into(),
        ));
        assert_eq!(e.recovery(), Recovery::Retry);
    }
}
