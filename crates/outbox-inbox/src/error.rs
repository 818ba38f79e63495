//! Errors, in two classes, as in the relay:
//! - **retry**: a connection lost (PostgreSQL or RabbitMQ), or a transient SQLSTATE (a
//!   serialization failure, a deadlock, the server shutting down or out of resources, a
//!   statement cancelled by the statement timeout or a lock timeout). Nothing is
//!   acknowledged that was not committed. A database error holds the lane: it keeps its
//!   deliveries and tries again (giving them back would count toward a quorum queue's
//!   delivery limit); a broker error ends the session, RabbitMQ requeues every
//!   unacknowledged delivery, and the inbox absorbs the ones that were committed.
//! - **stop**: the configuration, the database or a message is wrong in a way a retry cannot
//!   fix (a missing inbox, queue or dead-letter exchange, an effect statement that fails).
//!   The consumer exits naming the object or message and the fix; the message stays in the
//!   queue. An effect failing on a message's data ([`is_poison`]) sends that message to the
//!   dead-letter exchange instead, where there is one.
//!
//! [`InboxError::is_retryable`] is the one place the class is decided.

use tokio_postgres::error::SqlState;

/// A boxed source error (the shared connection errors, which this crate does not match on).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    // ---- stop ----
    #[error("{0}")]
    Config(String),

    #[error("{what}")]
    Provisioning {
        what: String,
        #[source]
        source: tokio_postgres::Error,
    },

    #[error(
        "The queue \"{queue}\" does not exist on the broker. Fix: declare it (durable; a quorum \
         queue in a cluster) and bind it to the outbox exchange; the consumer declares nothing"
    )]
    QueueMissing { queue: String },

    #[error(
        "The dead-letter exchange \"{exchange}\" (--dead-letter-exchange) does not exist on the \
         broker. Fix: declare it (durable, e.g. a topic exchange) and bind a durable queue to \
         it with the binding key #"
    )]
    DeadLetterExchangeMissing { exchange: String },

    // The server's message only, never its DETAIL: for a constraint violation that is
    // "Failing row contains (…)", the message's payload.
    #[error(
        "Applying message {message_id} failed (SQLSTATE {sqlstate}: {reason}); it stays in the \
         queue and the consumer stops, because a retry would fail the same way. Fix the effect \
         statement or the data it needs, then start the consumer again (with \
         --dead-letter-exchange, a message whose effect fails on its data goes there and the \
         consumer goes on)"
    )]
    Effect {
        message_id: String,
        sqlstate: String,
        reason: String,
    },

    // ---- retry ----
    #[error("Cannot connect to PostgreSQL")]
    DatabaseConnect(#[source] BoxError),

    #[error("Connecting to {what} took longer than 15 s")]
    ConnectTimeout { what: &'static str },

    #[error("PostgreSQL failed")]
    Database(#[from] tokio_postgres::Error),

    // Retried like any session failure: a wait that another session's end will cut short
    // (a vanished replica's claim) passes. An effect that always takes longer retries for
    // ever, so the message says what to change.
    #[error(
        "A statement of a claim or an effect was cancelled (SQLSTATE {sqlstate}): it ran, or \
         waited for a lock, longer than the statement timeout (57014; or an operator \
         cancelled it) or the lock timeout (55P03). The lane keeps its deliveries and tries \
         again after a backoff. If an effect needs longer, raise --statement-timeout \
         (OUTBOX_INBOX_STATEMENT_TIMEOUT; 0 leaves the server's)"
    )]
    StatementCancelled {
        sqlstate: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },

    #[error("RabbitMQ failed")]
    Broker(#[from] lapin::Error),

    #[error("The RabbitMQ connection closed the consumer")]
    ConsumerClosed,

    #[error("A cleanup batch took longer than {seconds} s")]
    CleanupTimeout { seconds: u64 },
}

/// The cleanup's rounds: logged with their sources. The cleanup sets no round bound (each
/// batch has its own), so a timed-out round is a batch's timeout.
impl outbox_common::periodic::RoundError for InboxError {
    fn timed_out(bound: std::time::Duration) -> Self {
        InboxError::CleanupTimeout {
            seconds: bound.as_secs(),
        }
    }

    fn describe(&self) -> String {
        outbox_common::error::chain(self)
    }
}

impl InboxError {
    /// Whether a new session may succeed where this one failed.
    pub fn is_retryable(&self) -> bool {
        match self {
            InboxError::Config(_)
            | InboxError::Provisioning { .. }
            | InboxError::QueueMissing { .. }
            | InboxError::DeadLetterExchangeMissing { .. }
            | InboxError::Effect { .. } => false,
            InboxError::Database(e) => is_transient(e),
            InboxError::StatementCancelled { .. }
            | InboxError::DatabaseConnect(_)
            | InboxError::ConnectTimeout { .. }
            | InboxError::Broker(_)
            | InboxError::ConsumerClosed
            | InboxError::CleanupTimeout { .. } => true,
        }
    }
}

/// Whether a PostgreSQL error can pass by itself: no SQLSTATE (the connection broke), or a
/// class that names the moment rather than the statement: 08 connection, 40 transaction
/// rollback (serialization failure, deadlock), 53 insufficient resources, 57 operator
/// intervention (shutdown, cancel, the statement timeout), 58 system error, and 55P03 lock
/// not available (the lock timeout).
pub fn is_transient(e: &tokio_postgres::Error) -> bool {
    e.code().is_none_or(is_transient_code)
}

fn is_transient_code(code: &SqlState) -> bool {
    let code = code.code();
    ["08", "40", "53", "57", "58"].contains(&&code[..2])
        || code == SqlState::LOCK_NOT_AVAILABLE.code()
}

/// Whether an effect's definite failure is about the message's data, so that it would fail
/// the same way every time: SQLSTATE class 22 data exception (a value that does not parse or
/// fit), 23 integrity constraint violation, 44 WITH CHECK OPTION violation, P0 PL/pgSQL
/// (a RAISE in the effect's function). The rest of the definite errors are about the
/// statement or the database (a privilege, a missing table, a read-only server) and would
/// fail for every message: they stop the consumer.
pub fn is_poison(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(is_poison_code)
}

fn is_poison_code(code: &SqlState) -> bool {
    ["22", "23", "44", "P0"].contains(&&code.code()[..2])
}

/// The SQLSTATE of a statement cut short by a timeout: 57014 query_canceled (the statement
/// timeout, or a cancel request) or 55P03 lock_not_available (the lock timeout).
fn cancelled(code: &SqlState) -> Option<&'static str> {
    if *code == SqlState::QUERY_CANCELED {
        Some("57014")
    } else if *code == SqlState::LOCK_NOT_AVAILABLE {
        Some("55P03")
    } else {
        None
    }
}

/// A statement that fails to prepare: a stop naming the fix (`what`), unless the error can
/// pass (the connection broke, or the statement timeout cut short a wait for a lock another
/// session holds on the table, such as an ALTER TABLE): then a retry like any other.
pub fn provisioning(what: impl FnOnce() -> String, source: tokio_postgres::Error) -> InboxError {
    if is_transient(&source) {
        database_error(source)
    } else {
        InboxError::Provisioning {
            what: what(),
            source,
        }
    }
}

/// A failed statement of the consumer's transactions as an error: a timeout says so (and
/// what to change); anything else is [`InboxError::Database`], classed by its SQLSTATE.
pub fn database_error(error: tokio_postgres::Error) -> InboxError {
    match error.code().and_then(cancelled) {
        Some(sqlstate) => InboxError::StatementCancelled {
            sqlstate,
            source: error,
        },
        None => InboxError::Database(error),
    }
}

/// Whether the transaction can simply run again at once on the same connection: a
/// serialization failure or a deadlock (a concurrent claim of the same message under
/// REPEATABLE READ, or lock order in the effect).
pub fn is_serialization_failure(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(code) if *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_transient_and_named_the_rest_by_class() {
        assert_eq!(cancelled(&SqlState::QUERY_CANCELED), Some("57014"));
        assert_eq!(cancelled(&SqlState::LOCK_NOT_AVAILABLE), Some("55P03"));
        assert_eq!(cancelled(&SqlState::ADMIN_SHUTDOWN), None);
        for transient in [
            SqlState::QUERY_CANCELED,
            SqlState::LOCK_NOT_AVAILABLE,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CONNECTION_FAILURE,
        ] {
            assert!(is_transient_code(&transient), "{}", transient.code());
        }
        for definite in [
            SqlState::UNIQUE_VIOLATION,
            SqlState::INVALID_TEXT_REPRESENTATION,
            SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        ] {
            assert!(!is_transient_code(&definite), "{}", definite.code());
        }
        for data in [
            SqlState::INVALID_TEXT_REPRESENTATION,
            SqlState::UNIQUE_VIOLATION,
            SqlState::FOREIGN_KEY_VIOLATION,
            SqlState::WITH_CHECK_OPTION_VIOLATION,
            SqlState::RAISE_EXCEPTION,
        ] {
            assert!(
                is_poison_code(&data) && !is_transient_code(&data),
                "{}",
                data.code()
            );
        }
        for environment in [
            SqlState::INSUFFICIENT_PRIVILEGE,
            SqlState::UNDEFINED_TABLE,
            SqlState::READ_ONLY_SQL_TRANSACTION,
        ] {
            assert!(!is_poison_code(&environment), "{}", environment.code());
        }
    }
}
