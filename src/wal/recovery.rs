//! `--on-slot-lost recreate`: a missing or invalidated slot replaced by a new one, with
//! nothing lost between them.
//!
//! A slot goes missing in a failover without failover slots (PostgreSQL 16 and older: the
//! promoted standby never had it) and is lost when PostgreSQL invalidates it. Either way the
//! messages committed after its last acknowledged position are in no slot. The outbox table
//! still has them (cleanup never deletes rows newer than the last acknowledged commit), so:
//!
//! ```text
//!  lower bound   the last acknowledged commit time the relay recorded in
//!                <schema>.outbox_relay_state (at a session's first acknowledgement, then
//!                every minute and at each cleanup round), minus --recreate-margin for
//!                transactions open across it (the cleanup never deletes past that); the
//!                whole table if none
//!  upper bound   the new slot's start: CREATE_REPLICATION_SLOT … (SNAPSHOT 'export') on a
//!                replication session, imported by the backfill (SET TRANSACTION SNAPSHOT)
//!                while that session stays idle. A row the snapshot sees committed before the
//!                slot's consistent point: the backfill publishes it. A row it does not see
//!                commits after: the slot delivers it.
//! ```
//!
//! Crash-only like the rest: the state row says `recovering` from before the slot is
//! created until the backfill is confirmed, and nothing is acknowledged on the new slot
//! before (the session streams it only afterwards). The row also records the slot's
//! consistent point and the server's time once it was made (`until`), then, as the broker
//! confirms each batch, the batch's last row (`created_at`, id: the backfill's order). A
//! relay that finds `recovering` set resumes on that slot, if it is still the one the
//! recovery made (there, valid, its confirmed position still the consistent point):
//!
//! ```text
//!  committed before the slot's start, up to the last confirmed row   confirmed already
//!  committed before the slot's start, after it                       created before `until`:
//!                                                                    read again from a new
//!                                                                    snapshot, from that row on
//!  committed after the slot's start                                  the slot delivers them
//! ```
//!
//! A resumed backfill re-publishes only what was in flight (a batch at most, and the last
//! confirmed row), and rows of transactions still open when the slot was made that were
//! created before `until` (the slot delivers them too). Any other slot (lost again, missing
//! after a failover, made by someone else) is dropped and the recovery starts over from the
//! recorded lower bound with a new one: a new snapshot skips nothing, so the rows between
//! the two slots' starts are published. Duplicates, never a gap.
//!
//! Two relays never recover at once: an advisory lock, held for the recovery, makes the
//! second a standby, which waits while the lock is held (the new slot has no reader during
//! the backfill); a holder that vanishes loses its session, and the lock, within the peer
//! timeout (outbox_common::liveness). No step waits without a bound but the slot's creation,
//! which waits for the write transactions running when it began, and says so
//! (`wait_for_creation`); connecting for it is bounded like any connect.
//!
//! The table-less outbox (`outbox_emit`) cannot be backfilled: its events were only in the
//! WAL. `setup` creates the emit functions for every outbox, so their presence says nothing;
//! each session records the slot's row when it starts and whether it has decoded an emitted
//! event, and the relay refuses to recreate the slot of an outbox that carries them (or whose
//! state no session ever recorded), and says why. Where the functions exist but the record
//! says no event, it recreates and says that events emitted in the gap, if the application
//! began emitting there, are not in the table.

use std::time::SystemTime;

use pgwire_replication::{Lsn, ReplicationClient};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, IsolationLevel};

use crate::catalog::slot::read_slot;
use crate::config::OutboxNames;
use crate::contract::columns::{self};
use crate::db;
use crate::error::RelayError;
use crate::error::SlotError;
use crate::failpoint::{failpoint, RECOVERY_BACKFILL_CONFIRMED};
use crate::observability::SLOT_RECOVERIES_TOTAL;
use crate::publish::Broker;
use crate::publish::BrokerNodes;
use crate::table::backfill::{backfill_report, publish_all, select_sql, Read, Resumed};
use crate::table::outbox::{needs_created_at, TextRelation};
use crate::wal::context::SessionConfig;
use crate::wal::state::{backfill_start, read_state, state_table, Backfilled, State};
use outbox_common::pg::Server;

/// What a recovery needs of the relay's configuration.
/// Why `--on-slot-lost recreate` needs `created_at` (its error when the column is missing).
pub(crate) const BACKFILL_NEEDS: &str =
    "--on-slot-lost recreate backfills the rows a new slot will not deliver by it";

pub(crate) struct Recovery<'a> {
    pub config: &'a SessionConfig,
    pub brokers: &'a Arc<BrokerNodes>,
}

/// Replaces the slot and backfills what it will not deliver (see the module documentation).
/// `server` is the primary the session uses. Returns the rows re-published.
pub(crate) async fn recreate(ctx: &Recovery<'_>, server: &Server) -> Result<u64, RelayError> {
    let names = &ctx.config.names;
    let client = db::connect_to(&ctx.config.database_url, server).await?;
    hold_the_recovery_lock(&client, names).await?;
    // The `recovering` mark is what makes a crash during the backfill safe: no mark, no
    // recovery.
    let Some(state) = read_state(&client, names).await? else {
        return Err(RelayError::Slot(SlotError::RecoveryUnrecordable {
            slot: names.slot.to_string(),
            table: state_table(names),
        }));
    };
    let emit_functions = has_emit_functions(&client, names).await?;
    // Whether events were emitted is known only where a session recorded the state: it
    // watches for them from then on.
    let may_carry_events = state.emitted_events || !state.recorded;
    if emit_functions && may_carry_events {
        return Err(RelayError::Slot(SlotError::CannotBackfill {
            slot: names.slot.to_string(),
        }));
    }
    let from = match &state {
        State {
            recovering: true,
            backfill_from,
            ..
        } => *backfill_from,
        state => state
            .acknowledged_commit
            .map(|at| backfill_start(at, ctx.config.recreate_margin)),
    };
    let backfilled = match resumable(&client, names, &state).await? {
        Some(progress) => {
            tracing::warn!(
                slot = %names.slot,
                "resuming an interrupted recovery on the slot it made: the backfill goes on \
                 from the last row the broker confirmed"
            );
            backfill(ctx, server, &client, from, Rows::Resumed(&progress)).await
        }
        None => {
            begin(&client, names, from).await?;
            drop_old_slot(&client, names).await?;
            let mut created = create_slot(ctx, server).await?;
            let backfilled = match record_slot(&client, names, created.consistent_point).await {
                Ok(()) => {
                    let rows = Rows::Snapshot(&created.snapshot);
                    backfill(ctx, server, &client, from, rows).await
                }
                Err(e) => Err(e),
            };
            created.abort();
            backfilled
        }
    };
    let published = backfilled?;
    finish(&client, names).await?;
    metrics::counter!(SLOT_RECOVERIES_TOTAL).increment(1);
    let from = from.map(|at| humantime::format_rfc3339_micros(at).to_string());
    tracing::warn!(
        slot = %names.slot,
        rows = published,
        from = %from.as_deref().unwrap_or("the oldest row"),
        "{}",
        backfill_report(published, from.as_deref())
    );
    if emit_functions {
        tracing::warn!(
            slot = %names.slot,
            "the outbox has the emit functions, but the relay never recorded an emitted \
             event: events emitted since the last record, if the application began emitting \
             there, were only in the lost slot's WAL and are not re-published"
        );
    }
    Ok(published)
}

/// The advisory lock one recovery of the slot holds, across relays: its key's text (the lock
/// is `hashtext` of it, a bigint key).
fn lock_key(names: &OutboxNames) -> String {
    format!("outbox-relay:recreate:{}", names.slot)
}

/// One recovery at a time, across relays: the lock goes with this connection (the server
/// ends it, and frees the lock, within the peer timeout of a holder that vanished:
/// outbox_common::liveness).
async fn hold_the_recovery_lock(client: &Client, names: &OutboxNames) -> Result<(), RelayError> {
    let locked: bool = client
        .query_one(
            "SELECT pg_try_advisory_lock(hashtext($1))",
            &[&lock_key(names)],
        )
        .await?
        .get(0);
    if locked {
        return Ok(());
    }
    Err(RelayError::Slot(SlotError::RecoveryInProgress {
        slot: names.slot.to_string(),
    }))
}

/// Whether a relay holds the recovery lock of the slot (it is recreating it), read from
/// `pg_locks` without taking the lock: a standby waits while it is held (the new slot has
/// no reader during the backfill, so "free" alone would send it into a session every turn).
/// A bigint advisory key shows its high half as `classid` and its low half as `objid`.
pub(crate) async fn another_is_recovering(
    client: &Client,
    names: &OutboxNames,
) -> Result<bool, RelayError> {
    let held: bool = client
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_catalog.pg_locks l \
             JOIN pg_catalog.pg_database d ON d.oid = l.database \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
             AND d.datname = current_database() \
             AND l.classid = ((hashtext($1)::bigint >> 32) & 4294967295)::oid \
             AND l.objid = (hashtext($1)::bigint & 4294967295)::oid)",
            &[&lock_key(names)],
        )
        .await?
        .get(0);
    Ok(held)
}

/// Whether the outbox has the emit functions (`setup` creates them; a DBA's setup may not),
/// whose events were only in the WAL: no table has them to backfill from.
async fn has_emit_functions(client: &Client, names: &OutboxNames) -> Result<bool, RelayError> {
    let (schema, table) = names.table_parts();
    let functions: Vec<String> = crate::contract::emit::FUNCTION_SUFFIXES
        .iter()
        .map(|(suffix, _)| format!("{table}{suffix}"))
        .collect();
    let emits = client
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n \
             ON n.oid = p.pronamespace WHERE n.nspname = $1 AND p.proname = ANY($2) LIMIT 1",
            &[&schema, &functions],
        )
        .await?;
    Ok(emits.is_some())
}

/// Records, before anything changes, that a recovery from `from` is under way, with no
/// slot and no progress yet.
async fn begin(
    client: &Client,
    names: &OutboxNames,
    from: Option<SystemTime>,
) -> Result<(), RelayError> {
    let upsert = format!(
        "INSERT INTO {} AS s (slot, recovering, backfill_from) VALUES ($1, true, $2) \
         ON CONFLICT (slot) DO UPDATE SET recovering = true, backfill_from = $2, \
         {NO_PROGRESS}, updated_at = now()",
        state_table(names)
    );
    client.execute(&upsert, &[&names.slot.name, &from]).await?;
    Ok(())
}

/// The progress columns of a recovery, cleared.
const NO_PROGRESS: &str = "backfill_slot_lsn = NULL, backfill_until = NULL, \
     backfill_confirmed_created_at = NULL, backfill_confirmed_id = NULL";

/// Records the slot the recovery made, by its consistent point, and the server's time now,
/// after its creation returned: rows committed before the slot's start were created before
/// it.
async fn record_slot(
    client: &Client,
    names: &OutboxNames,
    consistent_point: Lsn,
) -> Result<(), RelayError> {
    let update = format!(
        "UPDATE {} SET backfill_slot_lsn = $2::text::pg_lsn, backfill_until = now(), \
         updated_at = now() WHERE slot = $1",
        state_table(names)
    );
    let lsn = consistent_point.to_string();
    client.execute(&update, &[&names.slot.name, &lsn]).await?;
    Ok(())
}

/// Records the last row of a batch the broker confirmed: a resumed backfill starts there.
async fn record_confirmed(
    client: &Client,
    names: &OutboxNames,
    (created_at, id): (&str, &str),
) -> Result<(), RelayError> {
    let update = format!(
        "UPDATE {} SET backfill_confirmed_created_at = $2, backfill_confirmed_id = $3, \
         updated_at = now() WHERE slot = $1",
        state_table(names)
    );
    client
        .execute(&update, &[&names.slot.name, &created_at, &id])
        .await?;
    Ok(())
}

async fn finish(client: &Client, names: &OutboxNames) -> Result<(), RelayError> {
    let update = format!(
        "UPDATE {} SET recovering = false, backfill_from = NULL, {NO_PROGRESS}, \
         updated_at = now() WHERE slot = $1",
        state_table(names)
    );
    client.execute(&update, &[&names.slot.name]).await?;
    Ok(())
}

/// The progress of an interrupted recovery whose slot is still the one it made: there, not
/// invalidated, and at its consistent point (nothing acknowledged it, so the slot delivers
/// every row committed after its start). `None` otherwise: the recovery starts over. A slot
/// a process streams from is left to it (standby).
async fn resumable(
    client: &Client,
    names: &OutboxNames,
    state: &State,
) -> Result<Option<Backfilled>, RelayError> {
    let Some(progress) = state.backfilled.as_ref().filter(|_| state.recovering) else {
        return Ok(None);
    };
    let Some(slot) = read_slot(client, &names.slot).await? else {
        return Ok(None);
    };
    if let Some(pid) = slot.active_pid {
        return Err(RelayError::Slot(SlotError::InUse {
            slot: names.slot.to_string(),
            pid: pid.to_string(),
        }));
    }
    let made_by_it = !slot.is_lost() && slot.confirmed_flush() == Some(progress.slot_lsn);
    Ok(made_by_it.then(|| progress.clone()))
}

/// Drops the slot of that name, if there is one: lost, or made by an interrupted recovery
/// (nothing of it was acknowledged). One a process streams from is left to it (standby).
async fn drop_old_slot(client: &Client, names: &OutboxNames) -> Result<(), RelayError> {
    let Some(old) = read_slot(client, &names.slot).await? else {
        return Ok(());
    };
    if let Some(pid) = old.active_pid {
        return Err(RelayError::Slot(SlotError::InUse {
            slot: names.slot.to_string(),
            pid: pid.to_string(),
        }));
    }
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&names.slot.name])
        .await?;
    Ok(())
}

/// CREATE_REPLICATION_SLOT with an exported snapshot, on a replication session that must
/// stay open and idle while the snapshot is imported. Connecting, TLS and authentication are
/// bounded as a session's are (a server or proxy that accepts and never answers would hold
/// the recovery's lock, and every standby, for ever); only the creation itself waits as
/// long as it must ([`wait_for_creation`]).
async fn create_slot(ctx: &Recovery<'_>, server: &Server) -> Result<Created, RelayError> {
    let names = &ctx.config.names;
    let config = db::replication_config(
        &ctx.config.database_url,
        server,
        &names.slot,
        &names.publication,
    )?;
    let (mut session, _) = db::connect_replication(config)
        .await?
        .map_err(RelayError::replication)?;
    let client = db::connect_to(&ctx.config.database_url, server).await?;
    let version = db::server_version_num(&client).await?;
    let failover = crate::catalog::slot::failover_wanted(ctx.config.failover, version)?;
    let command = format!(
        "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'export'{})",
        names.slot,
        if failover { ", FAILOVER true" } else { "" }
    );
    let rows = match wait_for_creation(session.simple_query(&command), &client, names).await {
        Ok(rows) => rows,
        Err(e) => {
            session.abort();
            return Err(RelayError::replication(e));
        }
    };
    // slot_name, consistent_point, snapshot_name, output_plugin.
    let column = |i: usize| {
        rows.first()
            .and_then(|row| row.get(i).cloned().flatten())
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    };
    let consistent_point = column(1).and_then(|text| Lsn::parse(&text).ok());
    match (consistent_point, column(2)) {
        (Some(consistent_point), Some(snapshot)) => Ok(Created {
            session,
            consistent_point,
            snapshot,
        }),
        _ => {
            session.abort();
            Err(RelayError::Bug(
                "CREATE_REPLICATION_SLOT … (SNAPSHOT 'export') returned no consistent point \
                 or no snapshot"
                    .into(),
            ))
        }
    }
}

/// How long the slot's creation may take before the relay says what it waits for, and how
/// often it says it again.
const CREATION_REPORT_EVERY: Duration = Duration::from_secs(10);

/// Waits for CREATE_REPLICATION_SLOT however long it takes: PostgreSQL builds the exported
/// snapshot once every transaction that held an xid when the creation began has ended, so a
/// long write transaction holds it for as long as it runs. Capping the wait would make it
/// never converge (each new attempt waits for the transactions running then, and an
/// abandoned attempt's walsender keeps building its slot). The wait is bounded by the peer
/// timeout only (a server that vanished), and said every [`CREATION_REPORT_EVERY`] with the
/// oldest of those transactions this role can see (pid, age, application; never a query).
async fn wait_for_creation<T>(
    creating: impl std::future::Future<Output = pgwire_replication::Result<T>>,
    client: &Client,
    names: &OutboxNames,
) -> pgwire_replication::Result<T> {
    tokio::pin!(creating);
    let started = tokio::time::Instant::now();
    loop {
        tokio::select! {
            created = &mut creating => return created,
            () = tokio::time::sleep(CREATION_REPORT_EVERY) => {}
        }
        let waiting = started.elapsed().as_secs();
        match oldest_writers(client).await {
            Ok(writers) if !writers.is_empty() => tracing::warn!(
                slot = %names.slot,
                waiting_secs = waiting,
                transactions = %writers.join("; "),
                "recreating the slot waits for write transactions that were running when it \
                 began (PostgreSQL builds the slot's snapshot once they end)"
            ),
            _ => tracing::warn!(
                slot = %names.slot,
                waiting_secs = waiting,
                "recreating the slot waits for write transactions that were running when it \
                 began (PostgreSQL builds the slot's snapshot once they end); this role sees \
                 none of them: pg_stat_activity WHERE backend_xid IS NOT NULL, as a role with \
                 pg_read_all_stats, names them"
            ),
        }
    }
}

/// The oldest transactions holding an xid, other than this session's: `pid <n> (<age> s,
/// <application>)`.
async fn oldest_writers(client: &Client) -> Result<Vec<String>, RelayError> {
    let rows = client
        .query(
            "SELECT pid, extract(epoch FROM now() - xact_start)::bigint, application_name \
             FROM pg_catalog.pg_stat_activity \
             WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() \
             ORDER BY xact_start LIMIT 3",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| {
            let (pid, age, application): (i32, Option<i64>, Option<String>) =
                (row.get(0), row.get(1), row.get(2));
            format!(
                "pid {pid} ({} s, {})",
                age.unwrap_or_default(),
                application
                    .filter(|a| !a.is_empty())
                    .unwrap_or_else(|| "no application_name".into())
            )
        })
        .collect())
}

/// A new slot, its consistent point (its start), and the snapshot its creation exported.
struct Created {
    session: ReplicationClient,
    consistent_point: Lsn,
    snapshot: String,
}

impl Created {
    fn abort(&mut self) {
        self.session.abort();
    }
}

/// Which rows a backfill reads, from the lower bound on.
enum Rows<'a> {
    /// Those the snapshot a new slot's creation exported sees: committed before its start.
    Snapshot(&'a str),
    /// An interrupted recovery's, on the slot it made: those created before it was made
    /// (the later ones come through it), from the last one confirmed on, read from a new
    /// snapshot (see the module documentation).
    Resumed(&'a Backfilled),
}

/// Publishes `rows` from `from` on through the delivery loop (the relay's mapper, exchange
/// and dead-letter policy; a sharded relay its shard's rows), recording on `state` (the
/// recovery's connection) the last row of each batch the broker confirmed.
async fn backfill(
    ctx: &Recovery<'_>,
    server: &Server,
    state: &Client,
    from: Option<SystemTime>,
    rows: Rows<'_>,
) -> Result<u64, RelayError> {
    let names = &ctx.config.names;
    let mut reader = db::connect_to(&ctx.config.database_url, server).await?;
    reader.batch_execute(db::PINNED_SET_STATEMENTS).await?;
    let text = TextRelation::discover(
        &reader,
        &names.table,
        &ctx.config.columns,
        &[columns::CREATED_AT],
        |_| needs_created_at(&names.table, &ctx.config.columns, BACKFILL_NEEDS),
    )
    .await?;
    let transaction = reader
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    if let Rows::Snapshot(snapshot) = rows {
        transaction
            .batch_execute(&format!(
                "SET TRANSACTION SNAPSHOT {}",
                outbox_common::quote::quote_literal(snapshot)
            ))
            .await?;
    }
    // The bounds as RFC 3339 text (the select takes them as text): PostgreSQL prints them.
    let since: String = match from {
        Some(at) => humantime::format_rfc3339_micros(at).to_string(),
        None => "-infinity".to_string(),
    };
    let (resumed, until, confirmed) = match rows {
        Rows::Snapshot(_) => (None, None, None),
        Rows::Resumed(progress) => (
            Some(Resumed {
                from_confirmed: progress.confirmed.is_some(),
            }),
            Some(humantime::format_rfc3339_micros(progress.until).to_string()),
            progress.confirmed.as_ref(),
        ),
    };
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&since];
    params.extend(until.as_ref().map(|until| until as &(dyn ToSql + Sync)));
    if let Some((created_at, id)) = confirmed {
        params.extend([created_at as &(dyn ToSql + Sync), id]);
    }
    let statement = transaction
        .prepare(&select_sql(&names.table, &text, ctx.config.shard, resumed))
        .await?;
    let portal = transaction.bind(&statement, &params).await?;
    let mut broker = Broker::connect(ctx.brokers).await?;
    broker
        .prepare(&names.exchange, ctx.config.dead_letter_exchange.as_deref())
        .await?;
    let read = Read {
        transaction: &transaction,
        portal: &portal,
        text: &text,
        mapper: &ctx.config.mapper,
    };
    // The key of the backfill's order, as text (discover checked both columns are there).
    let key = [columns::CREATED_AT, columns::ID].map(|column| text.column_index(column));
    let progress = async |row: &tokio_postgres::Row| {
        failpoint(RECOVERY_BACKFILL_CONFIRMED);
        let [created_at, id] =
            key.map(|i| i.and_then(|i| row.try_get::<_, Option<String>>(i).ok().flatten()));
        match created_at.as_deref().zip(id.as_deref()) {
            Some(last) => record_confirmed(state, names, last).await,
            // A row without an id: the progress stays at the row before (more duplicates).
            None => Ok(()),
        }
    };
    let published = publish_all(
        &read,
        &broker,
        ctx.config.tuning.delivery.publishing.confirm_timeout(),
        progress,
    )
    .await;
    broker.close().await;
    let summary = published.map_err(|(e, _)| e)?;
    transaction.commit().await?;
    Ok(summary.published)
}
