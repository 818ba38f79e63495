//! The one classification of failures: what kind an error is, and what follows from it (the
//! supervisor's recovery, the `cause` label, the side `/readyz` reports down).

/// What the supervisor does after a session ends with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SupervisorAction {
    /// Reconnect after a backoff and resume from the slot.
    Retry,
    /// Another process holds the slot: wait as a standby and retry.
    Standby,
    /// Stop the relay: retrying cannot help.
    Stop,
}

/// Which side of the relay a failure is on, for readiness and for the stream reader (which
/// need not flush its position over a replication connection that is already gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// An ordinary PostgreSQL connection, or the configuration and provisioning.
    Database,
    /// The replication connection: the stream itself is gone.
    Stream,
    /// RabbitMQ.
    Broker,
}

/// What kind of failure an error is: the one classification everything else derives from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    // definite
    /// Flags, URLs, secrets: wrong before anything ran.
    Config,
    /// Something `setup` provisions (or a DBA) is missing or wrong.
    Provisioning,
    /// The slot was invalidated.
    SlotLost,
    /// A certificate or TLS configuration problem.
    TlsConfig,
    /// PostgreSQL refused a statement for a reason that stays (not an outage).
    DatabaseRefused,
    /// The replication connection was refused for a reason that stays.
    ReplicationRefused,
    /// A row, event or stream content that cannot be published.
    Data,
    /// An invariant of the relay itself broke.
    Bug,
    // standby
    SlotHeld,
    // transient
    DatabaseDown,
    TlsHandshake,
    DatabaseConnectTimeout,
    BrokerConnectTimeout,
    ReplicationDown,
    StreamEnded,
    StreamSilent,
    Protocol,
    BrokerDown,
    ExchangeMissing,
    ConfirmTimeout,
    Nacked,
    Returned,
    ReturnedAfterSettle,
    DeadLetterReturned,
    /// The broker closed the publishing channel over a message.
    PublishRefused,
}

impl ErrorKind {
    pub fn recovery(self) -> SupervisorAction {
        use ErrorKind::*;
        match self {
            Config | Provisioning | SlotLost | TlsConfig | DatabaseRefused | ReplicationRefused
            | Data | Bug => SupervisorAction::Stop,
            SlotHeld => SupervisorAction::Standby,
            DatabaseDown
            | TlsHandshake
            | DatabaseConnectTimeout
            | BrokerConnectTimeout
            | ReplicationDown
            | StreamEnded
            | StreamSilent
            | Protocol
            | BrokerDown
            | ExchangeMissing
            | ConfirmTimeout
            | Nacked
            | Returned
            | ReturnedAfterSettle
            | DeadLetterReturned
            | PublishRefused => SupervisorAction::Retry,
        }
    }

    /// A short label for logs and the reconnect metric's `cause`.
    pub fn label(self) -> &'static str {
        use ErrorKind::*;
        match self {
            DatabaseDown | DatabaseRefused => "database",
            TlsConfig | TlsHandshake => "tls",
            DatabaseConnectTimeout | BrokerConnectTimeout => "connect_timeout",
            ReplicationDown | ReplicationRefused => "replication",
            BrokerDown => "broker",
            ConfirmTimeout => "confirm_timeout",
            Nacked => "nack",
            Returned => "unroutable",
            ReturnedAfterSettle => "returned_after_settle",
            DeadLetterReturned => "dead_letter_unroutable",
            PublishRefused => "publish_refused",
            ExchangeMissing => "exchange_missing",
            StreamEnded => "stream_ended",
            StreamSilent => "no_heartbeat",
            SlotHeld => "standby",
            Protocol => "protocol",
            SlotLost => "slot_lost",
            Bug => "bug",
            Config | Provisioning | Data => "other",
        }
    }

    /// Which side of the relay is down after a failure of this kind.
    pub fn side(self) -> Side {
        use ErrorKind::*;
        match self {
            ReplicationDown | ReplicationRefused | StreamEnded | StreamSilent | SlotHeld
            | SlotLost => Side::Stream,
            BrokerDown | BrokerConnectTimeout | ExchangeMissing | ConfirmTimeout | Nacked
            | Returned | ReturnedAfterSettle | DeadLetterReturned | PublishRefused => Side::Broker,
            Config
            | Provisioning
            | TlsConfig
            | TlsHandshake
            | DatabaseRefused
            | Data
            | Bug
            | DatabaseDown
            | DatabaseConnectTimeout
            | Protocol => Side::Database,
        }
    }

    /// The broker returned a message (counted as a return, not a nack).
    pub fn is_return(self) -> bool {
        matches!(
            self,
            ErrorKind::Returned | ErrorKind::ReturnedAfterSettle | ErrorKind::DeadLetterReturned
        )
    }
}
