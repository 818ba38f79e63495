//! WAL heartbeats: `pg_logical_emit_message(false, 'outbox-relay:heartbeat', '<nonce> <µs>')`
//! written on an ordinary connection every interval.
//!
//! A heartbeat travels the whole path: it is decoded by the walsender, arrives on the stream,
//! and becomes an ack point behind everything received before it. That gives three things a
//! keepalive cannot: proof that the replication connection is alive end to end (a silently
//! dropped connection never fails TCP, and an idle walsender sends nothing while our status
//! updates keep it content), an ack point that lets an idle slot advance, and heartbeat lag
//! (now minus the send time of the newest acknowledged heartbeat). The nonce is per process,
//! so another relay's or an application's message never counts as ours. Heartbeats are never
//! published.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::HEARTBEAT_PREFIX as PREFIX;
use crate::db;

/// This process's heartbeat identity.
#[derive(Debug, Clone)]
pub(crate) struct Heartbeat {
    nonce: String,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self::new()
    }
}

impl Heartbeat {
    pub(crate) fn new() -> Self {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Self {
            nonce: format!("{:x}-{:x}", std::process::id(), started),
        }
    }

    /// What one heartbeat carries (wal/source.rs's tests write their own).
    pub(super) fn content(&self, sent_at: u64) -> String {
        format!("{} {sent_at}", self.nonce)
    }

    /// The send time (Unix µs) of one of our own heartbeats; `None` for any other message.
    pub(crate) fn parse_own(&self, prefix: &str, content: &[u8]) -> Option<u64> {
        if prefix != PREFIX {
            return None;
        }
        let text = std::str::from_utf8(content).ok()?;
        let (nonce, sent_at) = text.split_once(' ')?;
        if nonce != self.nonce {
            return None;
        }
        sent_at.parse().ok()
    }
}

pub(crate) fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Writes a heartbeat every `interval` until the task is dropped. Connection errors are
/// retried on the next tick (the stream's own liveness check decides about reconnecting);
/// a permission error (42501) disables heartbeats for this process with a loud warning.
pub(crate) async fn emit(database_url: String, heartbeat: Heartbeat, interval: Duration) {
    let mut client = None;
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if client.is_none() {
            match db::connect(&database_url).await {
                Ok(c) => client = Some(c),
                Err(e) => {
                    tracing::debug!(error = %crate::advice::report(&e), "heartbeat: cannot connect");
                    continue;
                }
            }
        }
        let Some(c) = client.as_ref() else { continue };
        let content = heartbeat.content(unix_micros());
        let written = c
            .execute(
                "SELECT pg_logical_emit_message(false, $1, $2)",
                &[&PREFIX, &content],
            )
            .await;
        if let Err(e) = written {
            if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
                tracing::warn!(
                    "heartbeats disabled: the relay's role may not call pg_logical_emit_message \
                     (GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO \
                     the role; on PostgreSQL 17+ (boolean, text, text, boolean); see \
                     sql/role.sql). Without them a silently dropped replication \
                     connection is noticed only by TCP, and an idle slot advances only on keepalives"
                );
                return;
            }
            tracing::debug!(error = %e, "heartbeat: write failed");
            client = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_only_its_own_heartbeats() {
        let ours = Heartbeat::new();
        let theirs = Heartbeat {
            nonce: "someone-else".into(),
        };
        let content = ours.content(1234);
        assert_eq!(ours.parse_own(PREFIX, content.as_bytes()), Some(1234));
        assert_eq!(theirs.parse_own(PREFIX, content.as_bytes()), None);
        assert_eq!(ours.parse_own("app:marker", content.as_bytes()), None);
        assert_eq!(ours.parse_own(PREFIX, b"garbage"), None);
    }
}
