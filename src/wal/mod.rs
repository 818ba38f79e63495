//! WAL mode: the relay proper.
//!
//! Crash-only: a session (`session.rs`) streams the slot until anything fails; the supervisor
//! (`crate::supervisor`) then tears it down, waits with backoff and starts a new one, which
//! resumes from the slot's confirmed position. There is no partial recovery to get wrong: whatever the broker
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
//! This file owns what outlives sessions: the endpoints and the slot poller, and what a
//! failed session means here (readiness, a healthy session's length, watching the slot as a
//! standby). The supervisor decides whether and when the next session runs.
//!
//! A row's path through the folder: [`stream`] reads it from the replication client;
//! [`source`] turns it into a delivery input (`pgoutput` decodes it, [`relations`] and the
//! mapper make it a message); the input goes to `publish::delivery`, whose acknowledged
//! [`position`] comes back to [`stream`], which sends it to PostgreSQL. [`session`] wires one
//! session; [`heartbeat`] serves it, and `catalog/` (the preflight checks, the slot's reads)
//! tells it what PostgreSQL holds.

pub(crate) mod cleanup;
pub(crate) mod context;
pub(crate) mod heartbeat;
pub(crate) mod position;
pub(crate) mod recovery;
pub(crate) mod relations;
pub(crate) mod session;
pub(crate) mod source;
pub(crate) mod state;
pub(crate) mod stream;
pub(crate) mod timeline;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::advice::report;
use crate::assembly::{self, RelayParts, RelayPartsFlags};
use crate::catalog::slot;
use crate::config::{OutboxNames, RunArgs};
use crate::contract::columns::ColumnMap;
use crate::error::{ConfigProblem, RelayError};
use crate::observability::{self, NotReady};
use crate::publish::stream::{StreamAddress, StreamTarget};
use crate::shard::Shard;
use crate::supervisor::{supervise, Supervised, Supervision};
use context::{RelayState, SessionConfig, SessionContext};

/// How often a standby looks whether the slot's holder has gone, between retries: the
/// takeover then follows the release of the slot within this much, not within a retry
/// interval, for the price of one small query on an ordinary connection.
const STANDBY_WATCH: Duration = Duration::from_millis(250);
/// A session that ran this long was healthy: the next failure starts the backoff afresh.
const HEALTHY_SESSION: Duration = Duration::from_secs(60);

/// Runs the WAL relay until `shutdown` is cancelled (`Ok`) or a definite error (`Err`).
pub(crate) async fn run(args: RunArgs, shutdown: CancellationToken) -> Result<(), RelayError> {
    let Prepared {
        parts:
            RelayParts {
                database_url,
                role,
                brokers,
                mapper,
                dead_letter_exchange,
            },
        shard,
        names,
        stream,
        columns,
        ..
    } = prepare(&args)?;
    if !columns.is_default() {
        tracing::info!(columns = %columns.describe(), "outbox columns mapped");
    }
    if shard.is_sharded() {
        // Before the recorder is installed (start_endpoints): the label is global.
        observability::label_every_metric_with_shard(shard.index());
    }
    // The endpoints and the slot poller live as long as this function: through a graceful
    // stop, and on while the sessions reconnect.
    let observing = CancellationToken::new();
    let _stop_observing = observing.clone().drop_guard();
    let health = observability::start_endpoints(
        args.observability.endpoints.metrics_addr.0,
        "run",
        &observing,
    );
    if !args.observability.slot_poll_interval.is_zero() {
        tokio::spawn(slot::run_failover_poller(
            database_url.clone(),
            names.slot.to_string(),
            args.observability.slot_poll_interval,
            observing.clone(),
        ));
        tokio::spawn(slot::run_slot_poller(
            database_url.clone(),
            names.slot.to_string(),
            args.observability.slot_poll_interval,
            health.clone(),
            observing.clone(),
        ));
    }
    let emit_prefix = assembly::emit_prefix(&args.emit, &args.names.table);
    let supervision = Supervision {
        max_backoff: args.tuning.delivery.max_backoff(),
        stop_timeout: Some(args.tuning.delivery.shutdown_timeout()),
    };
    let mut relay = Relay {
        ctx: SessionContext {
            config: SessionConfig {
                database_url,
                names,
                shard,
                tuning: args.tuning,
                mapper,
                columns,
                heartbeat: heartbeat::Heartbeat::new(),
                cleanup: args.cleanup,
                dead_letter_exchange,
                emit_prefix,
                failover: args.failover.failover_slot,
                on_slot_lost: args.on_slot_lost,
                recreate_margin: args.recreate_margin,
                stream,
            },
            state: RelayState {
                brokers,
                health,
                metrics: observability::RelayMetrics::new(),
                last_server: std::sync::Mutex::new(None),
                handed_over: timeline::HandedOver::default(),
                emitted_seen: state::EmittedSeen::default(),
            },
        },
        role,
    };
    supervise(&mut relay, &supervision, &shutdown).await
}

/// What `run` makes of its flags before it connects to anything.
pub(crate) struct Prepared {
    pub parts: RelayParts,
    pub shard: Shard,
    /// The shard's names.
    pub names: OutboxNames,
    pub stream: Option<StreamAddress>,
    pub columns: Arc<ColumnMap>,
    /// Why `created_at` must be mapped, for each feature that is on and needs it.
    pub created_at_for: Vec<&'static str>,
}

/// Checks `run`'s flags as far as they can be without a connection, and makes the relay's
/// parts from them: the one validation of a `run` configuration, which `check` reports.
pub(crate) fn prepare(args: &RunArgs) -> Result<Prepared, RelayError> {
    let parts = RelayParts::new(RelayPartsFlags {
        connections: &args.connections,
        table: &args.names.table,
        exchange: &args.names.exchange,
        publishing: &args.tuning.delivery.publishing,
        exchanges: &args.exchanges,
        format: &args.format,
        dead_letter: Some(&args.dead_letter),
    })?;
    let shard = assembly::shard(&args.shard)?;
    let names = shard.names(&args.names)?;
    let dead_letters = parts.dead_letter_exchange.is_some();
    let stream = stream_destination(args, &parts.brokers, dead_letters)?;
    let mut created_at_for = Vec::new();
    if !args.cleanup.cleanup_interval.is_zero() {
        created_at_for.push(crate::wal::cleanup::CLEANUP_NEEDS);
    }
    if args.on_slot_lost == crate::config::OnSlotLost::Recreate {
        created_at_for.push(recovery::BACKFILL_NEEDS);
    }
    let columns = assembly::column_map(&args.columns, &args.names.table, &created_at_for)?;
    Ok(Prepared {
        parts,
        shard,
        names,
        stream,
        columns,
        created_at_for,
    })
}

/// `--stream`'s destination, if given, with what it cannot work with yet refused: dead
/// letters (an exchange the stream does not have) and a recreated slot's backfill (rows
/// without a place in the slot's stream, so without a publishing id).
fn stream_destination(
    args: &RunArgs,
    brokers: &crate::publish::BrokerNodes,
    dead_letters: bool,
) -> Result<Option<StreamAddress>, RelayError> {
    let target = match (&args.stream.stream, &args.stream.super_stream) {
        (Some(stream), _) => StreamTarget::Stream(stream.trim().to_string()),
        (None, Some(super_stream)) => StreamTarget::SuperStream(super_stream.trim().to_string()),
        (None, None) => return Ok(None),
    };
    if dead_letters {
        return Err(ConfigProblem::StreamWith {
            setting: "--on-unroutable dead-letter",
            why: "a stream returns nothing, and a row that cannot be mapped stops the relay \
                  (--on-unroutable halt)",
        }
        .into());
    }
    if args.on_slot_lost == crate::config::OnSlotLost::Recreate {
        return Err(ConfigProblem::StreamWith {
            setting: "--on-slot-lost recreate",
            why: "the backfill's rows have no place in the slot's stream, so no publishing id",
        }
        .into());
    }
    StreamAddress::of(brokers, args.stream.stream_port, target).map(Some)
}

/// The WAL relay as the supervisor sees it: one replication session after another.
struct Relay {
    ctx: SessionContext,
    /// The database URL's user, for errors that name the role.
    role: Option<String>,
}

impl Supervised for Relay {
    async fn run(&mut self, shutdown: &CancellationToken) -> Result<(), RelayError> {
        session::run(&self.ctx, shutdown.clone())
            .await
            .map_err(|error| error.clarify(self.role.as_deref()))
    }

    fn failed(&mut self, error: &RelayError) {
        self.ctx.state.health.set_not_ready(NotReady::after(error));
    }

    fn progressed(&self, ran: Duration) -> bool {
        ran >= HEALTHY_SESSION
    }

    fn retrying(&self) -> &'static str {
        "session failed; reconnecting"
    }

    /// Returns once no process holds the slot and no relay is recreating it, and after
    /// `at_most` in any case (a database that cannot be asked: the next session says).
    /// While another relay recreates the slot (`--on-slot-lost recreate`) the new slot has no
    /// reader during the backfill, and may not exist yet: the recovery's lock is what says
    /// it is taken. A missing slot nobody recovers is this relay's to report or recover.
    async fn wait_as_standby(&self, at_most: Duration) {
        let names = &self.ctx.config.names;
        let watch = async {
            let client = crate::db::connect(&self.ctx.config.database_url).await?;
            loop {
                let held = slot::read_slot(&client, &names.slot)
                    .await?
                    .is_some_and(|slot| slot.active_pid.is_some());
                if !held && !recovery::another_is_recovering(&client, names).await? {
                    return Ok::<_, RelayError>(());
                }
                tokio::time::sleep(STANDBY_WATCH).await;
            }
        };
        let deadline = Instant::now() + at_most;
        match tokio::time::timeout_at(deadline, watch).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %report(&e), "standby: cannot watch the slot; retrying later");
                tokio::time::sleep_until(deadline).await;
            }
            Err(_) => {}
        }
    }
}
