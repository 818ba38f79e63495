//! `--listen`: one dedicated connection LISTENs and wakes an idle worker per notification.
//!
//! Notifications are a latency hint, never the source of truth: one sent while this
//! connection was down is lost, so workers keep their fallback poll, and after every
//! (re)connect the listener wakes the idle workers once to pick up what it may have missed.
//! The application sends `NOTIFY` after its commit (docs/polling.md explains why not from a
//! trigger inside the transaction).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::advice::report;
use crate::db;
use crate::error::RelayError;
use outbox_common::backoff::Backoff;
use outbox_common::quote::quote_ident;

use super::shared::Shared;

/// Listens until `shutdown`, reconnecting with backoff; never stops the relay.
pub(crate) async fn run(shared: Arc<Shared>, channel: String, shutdown: CancellationToken) {
    let mut backoff = Backoff::new(Duration::from_millis(500), shared.delivery.max_backoff());
    loop {
        let error = tokio::select! {
            () = shutdown.cancelled() => return,
            ended = listen(&shared, &channel, &mut backoff) => ended,
        };
        let delay = backoff.next_delay();
        tracing::warn!(
            error = %report(&error),
            retry_in_ms = delay.as_millis() as u64,
            "notification connection lost; workers fall back to polling until it is back"
        );
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// One LISTEN connection, until it fails.
async fn listen(shared: &Arc<Shared>, channel: &str, backoff: &mut Backoff) -> RelayError {
    match listen_inner(shared, channel, backoff).await {
        Ok(()) => RelayError::NotificationsEnded,
        Err(e) => e,
    }
}

async fn listen_inner(
    shared: &Arc<Shared>,
    channel: &str,
    backoff: &mut Backoff,
) -> Result<(), RelayError> {
    // The same TLS and timeouts as every other connection (db.rs).
    let (client, mut notifications) = db::connect_for_notifications(&shared.database_url).await?;
    client
        .batch_execute(&format!("LISTEN {}", quote_ident(channel)))
        .await?;
    // Whatever was notified while nobody listened: idle workers look once.
    shared.wake.notify_waiters();
    backoff.reset();
    tracing::info!(channel, "listening for notifications");
    while let Some(received) = notifications.recv().await {
        received?;
        shared.stats.record_notification();
        shared.wake.notify_one();
    }
    drop(client);
    Ok(())
}
