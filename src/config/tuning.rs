//! The knobs of publishing and reconnecting: the window, status interval, heartbeats,
//! confirm timeout, message size, backoff and shutdown.

use std::time::Duration;

use clap::Args;

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

    #[command(flatten)]
    pub delivery: Delivery,

    /// Seconds between WAL heartbeats (pg_logical_emit_message): they prove the replication
    /// stream is alive end to end, let an idle slot advance, and measure heartbeat lag. With
    /// none seen for 3 intervals the stream is reconnected. 0 disables them.
    #[arg(long, env = "OUTBOX_HEARTBEAT_INTERVAL_SECS", default_value_t = 10)]
    pub heartbeat_interval_secs: u64,
}

/// What every publishing command needs (`run`, `poll`, `resync`): the confirm timeout and
/// the message size limit.
#[derive(Debug, Clone, Args)]
pub struct PublishLimits {
    /// Seconds a published message may stay unsettled (not yet confirmed, or its confirm not
    /// yet known to be free of a return) before the relay gives up on the connection and
    /// reconnects (paused while the broker blocks publishers). Keep it above the time the broker
    /// needs to confirm a full window.
    #[arg(long, env = "OUTBOX_CONFIRM_TIMEOUT_SECS", default_value_t = 30)]
    pub confirm_timeout_secs: u64,

    /// Largest message body to publish (RabbitMQ's max_message_size: 16 MiB by default in
    /// 4.x, 128 MiB in 3.x). A larger row stops the relay naming it (or, under
    /// --on-unroutable dead-letter, is dead-lettered without its body), before publishing. A
    /// broker that refuses a smaller body names its own limit, which the relay then applies too.
    #[arg(long, env = "OUTBOX_MAX_MESSAGE_SIZE", default_value_t = 16_777_216)]
    pub max_message_size: usize,
}

/// The knobs the two long-running relays share (`run`, `poll`): publishing, reconnects,
/// shutdown. `resync` publishes once and stops at its first failure.
#[derive(Debug, Clone, Args)]
pub struct Delivery {
    #[command(flatten)]
    pub publishing: PublishLimits,

    /// Longest wait between reconnect attempts, in seconds (backoff doubles from 0.5 s).
    #[arg(long, env = "OUTBOX_MAX_BACKOFF_SECS", default_value_t = 30)]
    pub max_backoff_secs: u64,

    /// Seconds a graceful shutdown may spend finishing the current transaction.
    #[arg(long, env = "OUTBOX_SHUTDOWN_TIMEOUT_SECS", default_value_t = 30)]
    pub shutdown_timeout_secs: u64,
}

impl Tuning {
    /// `None` when heartbeats are disabled.
    pub fn heartbeat_interval(&self) -> Option<Duration> {
        (self.heartbeat_interval_secs > 0)
            .then(|| Duration::from_secs(self.heartbeat_interval_secs))
    }
    pub fn status_interval(&self) -> Duration {
        Duration::from_millis(self.status_interval_ms)
    }
}

impl PublishLimits {
    pub fn confirm_timeout(&self) -> Duration {
        Duration::from_secs(self.confirm_timeout_secs)
    }
}

impl Delivery {
    pub fn max_backoff(&self) -> Duration {
        Duration::from_secs(self.max_backoff_secs)
    }
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_secs(self.shutdown_timeout_secs)
    }
}
