//! Errors, in two classes, as in the relay:
//! - **retry**: a connection lost (PostgreSQL or RabbitMQ), or a transient SQLSTATE (a
//!   serialization failure, a deadlock, the server shutting down or out of resources). The
//!   session ends without acknowledging anything it had not committed; RabbitMQ requeues
//!   every unacknowledged delivery, and the inbox absorbs the ones that were committed.
//! - **stop**: the configuration, the database or a message is wrong in a way a retry cannot
//!   fix (a missing inbox or queue, an effect statement that fails on a message). The consumer
//!   exits naming the object or message and the fix; the message stays in the queue.
//!
//! [`InboxError::is_retryable`] is the one place the class is decided.

use tokio_postgres::error::SqlState;

/// A boxed source error (the relay's connection errors, which this crate does not match on).
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

    // The server's message only, never its DETAIL: for a constraint violation that is
    // "Failing row contains (…)", the message's payload.
    #[error(
        "Applying message {message_id} failed (SQLSTATE {sqlstate}: {reason}); it stays in the \
         queue and the consumer stops, because a retry would fail the same way. Fix the effect \
         statement or the data it needs, then start the consumer again"
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

    #[error("RabbitMQ failed")]
    Broker(#[from] lapin::Error),

    #[error("The RabbitMQ connection closed the consumer")]
    ConsumerClosed,

    #[error("A cleanup batch took longer than {seconds} s")]
    CleanupTimeout { seconds: u64 },
}

impl InboxError {
    /// Whether a new session may succeed where this one failed.
    pub fn is_retryable(&self) -> bool {
        match self {
            InboxError::Config(_)
            | InboxError::Provisioning { .. }
            | InboxError::QueueMissing { .. }
            | InboxError::Effect { .. } => false,
            InboxError::Database(e) => is_transient(e),
            InboxError::DatabaseConnect(_)
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
/// intervention (shutdown, cancel), 58 system error, and 55P03 lock not available.
pub fn is_transient(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        None => true,
        Some(code) => {
            let code = code.code();
            ["08", "40", "53", "57", "58"].contains(&&code[..2])
                || code == SqlState::LOCK_NOT_AVAILABLE.code()
        }
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
