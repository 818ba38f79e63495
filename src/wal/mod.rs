//! WAL mode: the relay proper.
//!
//! Crash-only: a session (`session.rs`) streams the slot until anything fails; the supervisor
//! here then tears it down, waits with backoff and starts a new one, which resumes from the
//! slot's confirmed position. There is no partial recovery to get wrong: whatever the broker
//! confirmed but PostgreSQL had not been told is published again (at least once), and nothing
//! the broker did not confirm was ever acknowledged.
//!
//! Why ack points include keepalives: PostgreSQL 15 skips empty transactions, so while only
//! other tables take writes the stream carries no commits at all, and a slot acknowledged only
//! at commits would pin that WAL forever. A keepalive sent outside any transaction says
//! "everything before this WAL position has been sent"; once everything received before it is
//! confirmed, its position is safe to acknowledge (a transaction still open commits later and
//! is replayed in full).

pub mod heartbeat;
pub mod preflight;
pub mod relations;
pub mod session;

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::config::RunArgs;
use crate::error::{chain, Recovery, RelayError};
use crate::mapper::Mapper;
use crate::observability::{self, NotReady};
use session::SessionContext;

/// How often a standby retries a slot held by another process.
const STANDBY_RETRY: Duration = Duration::from_secs(5);
/// A session that ran this long was healthy: the next failure starts the backoff afresh.
const HEALTHY_SESSION: Duration = Duration::from_secs(60);

/// Runs the WAL relay until `shutdown` is cancelled (`Ok`) or a definite error (`Err`).
pub async fn run(args: RunArgs, shutdown: CancellationToken) -> Result<(), RelayError> {
    let mapper = Mapper::new(&args.names.exchange, args.tuning.max_message_size)
        .map_err(RelayError::Config)?;
    let dead_letter_exchange = args.dead_letter.exchange(&args.names.exchange)?;
    // The endpoints and the slot poller live as long as this function: through a graceful
    // stop, and on while the sessions reconnect.
    let observing = CancellationToken::new();
    let _stop_observing = observing.clone().drop_guard();
    let database_url = args.connections.database_url()?;
    let health = observability::start(
        args.observability.endpoints.metrics_addr.0,
        &database_url,
        &args.names.slot,
        args.observability.slot_poll_interval,
        &observing,
    );
    let role = crate::db::parse_url(&database_url)
        .ok()
        .and_then(|config| config.get_user().map(str::to_string));
    let ctx = SessionContext {
        database_url,
        amqp_url: args.connections.amqp_url()?,
        names: args.names,
        tuning: args.tuning,
        mapper,
        heartbeat: heartbeat::Heartbeat::new(),
        health: health.clone(),
        metrics: observability::RelayMetrics::new(),
        cleanup: args.cleanup,
        dead_letter_exchange,
    };
    let mut backoff = Backoff::new(Duration::from_millis(500), ctx.tuning.max_backoff());
    let mut stuck: Option<String> = None;
    let mut standby_logged = false;
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        let started = Instant::now();
        let session = session::run(&ctx, &mut stuck, shutdown.clone());
        let stop_deadline = async {
            shutdown.cancelled().await;
            tokio::time::sleep(ctx.tuning.shutdown_timeout()).await;
        };
        let result = tokio::select! {
            result = session => result,
            () = stop_deadline => {
                tracing::warn!("shutdown timed out; the open transaction will be replayed on restart");
                return Ok(());
            }
        };
        let error = match result {
            Ok(()) => return Ok(()),
            Err(error) => error.clarify(role.as_deref()),
        };
        health.set_not_ready(NotReady::after(&error));
        let delay = match error.recovery() {
            Recovery::Stop => return Err(error),
            Recovery::Standby => {
                if !standby_logged {
                    tracing::info!(error = %chain(&error), "standby: waiting for the slot");
                    standby_logged = true;
                }
                STANDBY_RETRY
            }
            Recovery::Retry => {
                standby_logged = false;
                if started.elapsed() >= HEALTHY_SESSION {
                    backoff.reset();
                }
                if let Some(id) = error.stuck_message_id() {
                    stuck = Some(id.to_string());
                }
                observability::count_reconnect(error.cause());
                let delay = backoff.next_delay();
                tracing::warn!(
                    cause = error.cause(),
                    error = %chain(&error),
                    retry_in_ms = delay.as_millis() as u64,
                    "session failed; reconnecting"
                );
                delay
            }
        };
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => return Ok(()),
        }
    }
}
