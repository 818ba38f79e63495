//! The knobs of publishing and reconnecting: the window, status interval, heartbeats,
//! confirm timeout, message size, backoff and shutdown.
//!
//! Every duration is a humantime string (`30s`, `250ms`; a bare number is seconds) and every
//! size takes a unit (`16MiB`; a bare number is bytes). The names these knobs had before,
//! in whole seconds or milliseconds (`--confirm-timeout-secs 30`,
//! `OUTBOX_STATUS_INTERVAL_MS=100`), are hidden flags that still work for one release
//! (CHANGELOG), with the old unit for a bare number; giving both names is refused.

use std::time::Duration;

use clap::Args;
use outbox_common::duration::parse_duration;

/// Throughput, latency and failure-handling knobs of the WAL relay.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Delivery")]
pub struct Tuning {
    /// Most messages published and not yet confirmed by the broker. Larger windows raise
    /// throughput and the number of duplicates a crash can cause (docs/benchmarks.md).
    #[arg(long, env = "OUTBOX_MAX_IN_FLIGHT", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_in_flight: u32,

    /// How often the acknowledged position is reported to PostgreSQL (e.g. 100ms; at most
    /// 100ms keeps the duplicates after a crash small), from 1ms to 10s.
    #[arg(long, env = "OUTBOX_STATUS_INTERVAL", default_value = "100ms", value_parser = parse_status_interval)]
    status_interval: Duration,
    /// --status-interval in milliseconds, as it was named before.
    #[arg(long, env = "OUTBOX_STATUS_INTERVAL_MS", hide = true, conflicts_with = "status_interval", value_parser = parse_status_interval_ms)]
    status_interval_ms: Option<Duration>,

    #[command(flatten)]
    pub delivery: Delivery,

    /// How often a WAL heartbeat is written (pg_logical_emit_message): heartbeats prove the
    /// replication stream is alive end to end, let an idle slot advance, and measure
    /// heartbeat lag. With none seen for 3 intervals the stream is reconnected. 0 disables
    /// them.
    #[arg(long, env = "OUTBOX_HEARTBEAT_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    heartbeat_interval: Duration,
    /// --heartbeat-interval in seconds, as it was named before.
    #[arg(long, env = "OUTBOX_HEARTBEAT_INTERVAL_SECS", hide = true, conflicts_with = "heartbeat_interval", value_parser = parse_duration)]
    heartbeat_interval_secs: Option<Duration>,
}

/// What every publishing command needs (`run`, `poll`, `resync`): the confirm timeout and
/// the message size limit.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Delivery")]
pub struct PublishLimits {
    /// How long a published message may stay unsettled (not yet confirmed, or its confirm not
    /// yet known to be free of a return) before the relay gives up on the connection and
    /// reconnects (paused while the broker blocks publishers). Keep it above the time the
    /// broker needs to confirm a full window.
    #[arg(long, env = "OUTBOX_CONFIRM_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    confirm_timeout: Duration,
    /// --confirm-timeout in seconds, as it was named before.
    #[arg(long, env = "OUTBOX_CONFIRM_TIMEOUT_SECS", hide = true, conflicts_with = "confirm_timeout", value_parser = parse_duration)]
    confirm_timeout_secs: Option<Duration>,

    /// Largest message body to publish (RabbitMQ's max_message_size: 16MiB by default in
    /// 4.x, 128MiB in 3.x), e.g. 16MiB, 512KiB or a number of bytes. A larger row stops the
    /// relay naming it (or, under --on-unroutable dead-letter, is dead-lettered without its
    /// body), before publishing. A broker that refuses a smaller body names its own limit,
    /// which the relay then applies too.
    #[arg(long, env = "OUTBOX_MAX_MESSAGE_SIZE", default_value = "16MiB", value_parser = parse_size)]
    pub max_message_size: usize,
}

/// The knobs the two long-running relays share (`run`, `poll`): publishing, reconnects,
/// shutdown. `resync` publishes once and stops at its first failure.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Delivery")]
pub struct Delivery {
    #[command(flatten)]
    pub publishing: PublishLimits,

    /// Longest wait between reconnect attempts (backoff doubles from 0.5s).
    #[arg(long, env = "OUTBOX_MAX_BACKOFF", default_value = "30s", value_parser = parse_duration)]
    max_backoff: Duration,
    /// --max-backoff in seconds, as it was named before.
    #[arg(long, env = "OUTBOX_MAX_BACKOFF_SECS", hide = true, conflicts_with = "max_backoff", value_parser = parse_duration)]
    max_backoff_secs: Option<Duration>,

    /// How long a graceful shutdown may spend finishing the current transaction.
    #[arg(long, env = "OUTBOX_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    shutdown_timeout: Duration,
    /// --shutdown-timeout in seconds, as it was named before.
    #[arg(long, env = "OUTBOX_SHUTDOWN_TIMEOUT_SECS", hide = true, conflicts_with = "shutdown_timeout", value_parser = parse_duration)]
    shutdown_timeout_secs: Option<Duration>,
}

impl Tuning {
    /// `None` when heartbeats are disabled.
    pub fn heartbeat_interval(&self) -> Option<Duration> {
        let interval = self
            .heartbeat_interval_secs
            .unwrap_or(self.heartbeat_interval);
        (!interval.is_zero()).then_some(interval)
    }
    pub fn status_interval(&self) -> Duration {
        self.status_interval_ms.unwrap_or(self.status_interval)
    }
}

impl PublishLimits {
    pub fn confirm_timeout(&self) -> Duration {
        self.confirm_timeout_secs.unwrap_or(self.confirm_timeout)
    }
}

impl Delivery {
    pub fn max_backoff(&self) -> Duration {
        self.max_backoff_secs.unwrap_or(self.max_backoff)
    }
    pub fn shutdown_timeout(&self) -> Duration {
        self.shutdown_timeout_secs.unwrap_or(self.shutdown_timeout)
    }
}

/// `--status-interval-ms`, the old name: a bare number is milliseconds.
fn parse_status_interval_ms(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<u64>() {
        Ok(millis) => parse_status_interval(&format!("{millis}ms")),
        Err(_) => parse_status_interval(text),
    }
}

/// `--status-interval`: a duration from 1ms to 10s.
fn parse_status_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text)?;
    if interval < Duration::from_millis(1) || interval > Duration::from_secs(10) {
        return Err(format!("{text:?} is outside 1ms to 10s"));
    }
    Ok(interval)
}

/// A size in bytes: a number, optionally with a unit: KiB, MiB, GiB (powers of 1024), kB,
/// MB, GB (powers of 1000), B; e.g. `16MiB`. Units are read case-insensitively.
pub(crate) fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let count: usize = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size such as 16MiB, 512KiB or 1048576"))?;
    let unit: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use KiB, MiB, GiB, kB, MB, GB or B"
            ))
        }
    };
    count
        .checked_mul(unit)
        .ok_or_else(|| format!("{text:?} is too large"))
}
