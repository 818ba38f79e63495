//! Errors of RabbitMQ over the stream protocol (`--stream`, `--super-stream`): the
//! connection, a missing stream, a transaction too large for the publishing ids.

use super::kind::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("Cannot reach RabbitMQ's {address} over the stream protocol: {reason}")]
    Connect { address: String, reason: String },

    #[error(
        "The RabbitMQ stream \"{stream}\" does not exist in virtual host \"{vhost}\": create \
         it (rabbitmqadmin declare queue name={stream} queue_type=stream durable=true), or name \
         another with --stream"
    )]
    Missing { stream: String, vhost: String },

    #[error(
        "The RabbitMQ super stream \"{super_stream}\" does not exist in virtual host \
         \"{vhost}\" (no partitions): create it (rabbitmq-streams add_super_stream \
         {super_stream} --partitions 3 --vhost {vhost}), or name another with --super-stream"
    )]
    SuperStreamMissing { super_stream: String, vhost: String },

    #[error(
        "The transaction that committed at {commit_lsn} has more than {limit} outbox rows: \
         a stream's publishing ids hold at most that many per transaction; split it"
    )]
    TransactionTooLarge { commit_lsn: String, limit: u64 },
}

impl StreamError {
    /// What kind of failure this is (src/error/mod.rs, [`ErrorKind`]).
    pub(crate) fn kind(&self) -> ErrorKind {
        use StreamError::*;
        match self {
            Connect { .. } => ErrorKind::BrokerDown,
            Missing { .. } | SuperStreamMissing { .. } => ErrorKind::Provisioning,
            TransactionTooLarge { .. } => ErrorKind::Data,
        }
    }
}
