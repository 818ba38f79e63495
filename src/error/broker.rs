//! Errors of RabbitMQ over AMQP 0-9-1: the connection and login, the publishing channel,
//! and what the broker did with a publish (refused, nacked, returned, not confirmed). The
//! ones that name a message say which message the pipeline stopped on.

use super::kind::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A RabbitMQ node took the connection, then did not answer one step of the session's
    /// setup (`step`: "opening a channel", …).
    #[error(
        "RabbitMQ node {node} accepted the connection but did not answer {step} within \
         {seconds} s; reconnecting, to the next node if there is one"
    )]
    SetupTimeout {
        node: String,
        step: &'static str,
        seconds: u64,
    },

    /// The AMQP client's error, as its text (`publish/` converts it: no other part of the
    /// relay names the client).
    #[error("RabbitMQ error: {0}")]
    Failed(String),

    /// The connection to a node could not be opened: nothing listens there, the network
    /// refused it, or the TLS handshake failed. `reason` is the AMQP client's words.
    #[error("Cannot reach RabbitMQ at {node}: {reason}")]
    Unreachable { node: String, reason: String },

    /// The broker refused the login when the connection opened: 403 ACCESS_REFUSED for a
    /// wrong user or password, 530 NOT_ALLOWED for a virtual host that does not exist or
    /// that the user may not use. Retried like any
    /// broker failure (a password being rotated), but named, with its fix.
    #[error("RabbitMQ at {node} refused the login: {reply_text}")]
    LoginRefused { node: String, reply_text: String },

    /// The broker closed the publishing channel with a channel-level (soft) error, as the
    /// answer to the publishes in flight: one of them caused it. `publish/` tells which.
    #[error("RabbitMQ closed the publishing channel: {reply_code} {reply_text}")]
    ChannelClosed { reply_code: u16, reply_text: String },

    /// The broker closed the publishing channel because of message `message_id`, the one
    /// publish in flight (or the one whose size it names): a 404 for an exchange that
    /// vanished, a 406 for a body over its `max_message_size`, a 403 for a denied exchange.
    #[error(
        "RabbitMQ refused message {message_id} ({size} bytes) and closed the publishing \
         channel: {reply_code} {reply_text}; the relay retries it alone and does not move past \
         it"
    )]
    PublishRefused {
        message_id: String,
        size: usize,
        reply_code: u16,
        reply_text: String,
    },

    /// The broker closed the publishing channel with `unconfirmed` publishes in flight and
    /// nothing names the one that caused it: the next session publishes them one at a time,
    /// through `last_message_id`, which finds it.
    #[error(
        "RabbitMQ closed the publishing channel ({reply_code} {reply_text}) with \
         {unconfirmed} messages unconfirmed; retrying them one at a time, through message \
         {last_message_id}, to find the one it refuses"
    )]
    PublishRefusedAmong {
        last_message_id: String,
        unconfirmed: usize,
        reply_code: u16,
        reply_text: String,
    },

    /// A message routed (by its row's `exchange` column or the `--exchange` template) to an
    /// exchange the broker does not have: checked before its first publish, so the broker
    /// never closes the channel over it.
    #[error(
        "Message {message_id} is routed to exchange \"{exchange}\", which does not exist on \
         the broker; the relay retries it alone and does not move past it"
    )]
    RoutedToMissingExchange {
        message_id: String,
        exchange: String,
    },

    #[error("RabbitMQ did not confirm message {message_id} within {seconds} s; reconnecting")]
    ConfirmTimeout { message_id: String, seconds: u64 },

    #[error("RabbitMQ rejected (nacked) message {message_id}; it will be retried")]
    Nacked { message_id: String },

    #[error(
        "RabbitMQ returned message {message_id} as unroutable ({reply_code} {reply_text}): no \
         queue is bound to exchange \"{exchange}\" for routing key \"{routing_key}\""
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
         restarts from its last acknowledged position"
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
         routing key \"{routing_key}\""
    )]
    DeadLetterReturned {
        message_id: String,
        exchange: String,
        routing_key: String,
        reply_code: u16,
        reply_text: String,
    },

    #[error("The exchange \"{exchange}\" does not exist on the broker")]
    ExchangeMissing { exchange: String },
}

impl BrokerError {
    /// What kind of failure this is (src/error/mod.rs, [`ErrorKind`]).
    pub(crate) fn kind(&self) -> ErrorKind {
        use BrokerError::*;
        match self {
            SetupTimeout { .. } => ErrorKind::BrokerConnectTimeout,
            Failed(_) | Unreachable { .. } | LoginRefused { .. } | ChannelClosed { .. } => {
                ErrorKind::BrokerDown
            }
            PublishRefused { .. } | PublishRefusedAmong { .. } => ErrorKind::PublishRefused,
            RoutedToMissingExchange { .. } | ExchangeMissing { .. } => ErrorKind::ExchangeMissing,
            ConfirmTimeout { .. } => ErrorKind::ConfirmTimeout,
            Nacked { .. } => ErrorKind::Nacked,
            Returned { .. } => ErrorKind::Returned,
            ReturnedAfterSettle { .. } => ErrorKind::ReturnedAfterSettle,
            DeadLetterReturned { .. } => ErrorKind::DeadLetterReturned,
        }
    }

    /// The message the pipeline stopped on, if a message was the cause.
    pub(crate) fn stuck_message_id(&self) -> Option<&str> {
        use BrokerError::*;
        match self {
            ConfirmTimeout { message_id, .. }
            | Nacked { message_id }
            | Returned { message_id, .. }
            | ReturnedAfterSettle { message_id, .. }
            | DeadLetterReturned { message_id, .. }
            | PublishRefused { message_id, .. }
            | RoutedToMissingExchange { message_id, .. }
            | PublishRefusedAmong {
                last_message_id: message_id,
                ..
            } => Some(message_id),
            Failed(_)
            | Unreachable { .. }
            | LoginRefused { .. }
            | ChannelClosed { .. }
            | ExchangeMissing { .. }
            | SetupTimeout { .. } => None,
        }
    }
}
