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
//!
//! This file owns the supervisor: the endpoints and the slot poller that outlive sessions,
//! backoff, standby (waiting for another process to release the slot) and the stuck message
//! the next session publishes alone. It never retries a definite error, and never resumes a
//! session in place: each new one starts from the slot.
//!
//! A row's path through the folder: [`stream`] reads it from the replication client;
//! [`source`] turns it into a delivery input (`pgoutput` decodes it, [`relations`] and the
//! mapper make it a message); the input goes to `publish::delivery`, whose acknowledged
//! [`position`] comes back to [`stream`], which sends it to PostgreSQL. [`session`] wires one
//! session; [`preflight`], [`heartbeat`] and [`slot`] serve it.

pub mod heartbeat;
pub mod position;
pub mod preflight;
pub mod relations;
pub mod session;
pub mod slot;
pub mod source;
pub mod stream;

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::advice::report;
use crate::backoff::Backoff;
use crate::config::RunArgs;
use crate::error::{Recovery, RelayError};
use crate::mapper::Mapper;
use crate::observability::{self, NotReady};
use session::SessionContext;

/// How often a standby retries a slot held by another process, at the latest.
const STANDBY_RETRY: Duration = Duration::from_secs(5);
/// How often a standby looks whether the slot's holder has gone, between retries: the
/// takeover then follows the release of the slot within this much, not within a retry
/// interval, for the price of one small query on an ordinary connection.
const STANDBY_WATCH: Duration = Duration::from_millis(250);
/// A session that ran this long was healthy: the next failure starts the backoff afresh.
const HEALTHY_SESSION: Duration = Duration::from_secs(60);

/// Runs the WAL relay until `shutdown` is cancelled (`Ok`) or a definite error (`Err`).
pub async fn run(args: RunArgs, shutdown: CancellationToken) -> Result<(), RelayError> {
    let allowed_exchanges = args.exchanges.policy(&args.names.exchange)?;
    let mapper = Mapper::new(
        &args.names.exchange,
        args.tuning.max_message_size,
        allowed_exchanges,
    )
    .map_err(RelayError::Config)?;
    let dead_letter_exchange = args.dead_letter.exchange(&args.names.exchange)?;
    // Both URLs are parsed before anything starts: a malformed one is a definite error (exit
    // 1 now), never an outage to retry.
    let database_url = args.connections.database_url()?;
    let mapper = args
        .format
        .apply(mapper, &database_url, &args.names.table)?;
    let role = crate::db::parse_url(&database_url)?
        .get_user()
        .map(str::to_string);
    let brokers = args.connections.broker_nodes()?;
    let shard = args.shard.shard()?;
    let names = shard.names(&args.names)?;
    if shard.is_sharded() {
        // Before the recorder is installed (observability::start): the label is global.
        observability::label_every_metric_with_shard(shard.index());
    }
    // The endpoints and the slot poller live as long as this function: through a graceful
    // stop, and on while the sessions reconnect.
    let observing = CancellationToken::new();
    let _stop_observing = observing.clone().drop_guard();
    let health = observability::start(
        args.observability.endpoints.metrics_addr.0,
        &database_url,
        &names.slot,
        args.observability.slot_poll_interval,
        &observing,
    );
    let emit_prefix = args.emit.prefix(&args.names.table);
    let ctx = SessionContext {
        database_url,
        brokers,
        names,
        shard,
        tuning: args.tuning,
        mapper,
        heartbeat: heartbeat::Heartbeat::new(),
        health: health.clone(),
        metrics: observability::RelayMetrics::new(),
        cleanup: args.cleanup,
        dead_letter_exchange,
        emit_prefix,
    };
    let mut backoff = Backoff::new(Duration::from_millis(500), ctx.tuning.max_backoff());
    let mut standby_logged = false;
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        let started = Instant::now();
        let session = session::run(&ctx, shutdown.clone());
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
        let standby = error.recovery() == Recovery::Standby;
        let delay = match error.recovery() {
            Recovery::Stop => return Err(error),
            Recovery::Standby => {
                if !standby_logged {
                    tracing::info!(error = %report(&error), "standby: waiting for the slot");
                    standby_logged = true;
                }
                STANDBY_RETRY
            }
            Recovery::Retry => {
                standby_logged = false;
                if started.elapsed() >= HEALTHY_SESSION {
                    backoff.reset();
                }
                observability::count_reconnect(error.kind().label());
                let delay = backoff.next_delay();
                tracing::warn!(
                    cause = error.kind().label(),
                    error = %report(&error),
                    retry_in_ms = delay.as_millis() as u64,
                    "session failed; reconnecting"
                );
                delay
            }
        };
        let wait = async {
            if standby {
                wait_for_free_slot(&ctx.database_url, &ctx.names.slot, delay).await;
            } else {
                tokio::time::sleep(delay).await;
            }
        };
        tokio::select! {
            () = wait => {}
            () = shutdown.cancelled() => return Ok(()),
        }
    }
}

/// Returns once no process holds `slot` (or it is gone: the next session says so), and
/// after `at_most` in any case, e.g. when the database cannot be asked.
async fn wait_for_free_slot(database_url: &str, slot: &str, at_most: Duration) {
    let deadline = Instant::now() + at_most;
    let watch = async {
        let client = crate::db::connect(database_url).await?;
        loop {
            let row = client
                .query_opt(
                    "SELECT active_pid FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
                    &[&slot],
                )
                .await?;
            if row.is_none_or(|row| row.get::<_, Option<i32>>(0).is_none()) {
                return Ok::<_, RelayError>(());
            }
            tokio::time::sleep(STANDBY_WATCH).await;
        }
    };
    match tokio::time::timeout_at(deadline, watch).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::debug!(error = %report(&e), "standby: cannot watch the slot; retrying later");
            tokio::time::sleep_until(deadline).await;
        }
        Err(_) => {}
    }
}
