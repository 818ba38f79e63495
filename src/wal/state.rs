//! The relay's own state in the database, `<schema>.outbox_relay_state`: the commit time of
//! the newest transaction it acknowledged, whether the outbox carries events of the emit
//! functions, and a recovery under way. It lives where a promoted standby has it too (the
//! table replicates like any other), which is what `--on-slot-lost recreate`
//! (`wal/recovery.rs`) needs to know where to backfill from, and whether it can.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::config::OutboxNames;
use crate::db::quote_ident;
use crate::error::RelayError;

/// The state table's name, in the outbox table's schema.
pub const STATE_TABLE: &str = "outbox_relay_state";

/// `<schema>.outbox_relay_state`, quoted.
pub fn state_table(names: &OutboxNames) -> String {
    let (schema, _) = names.table_parts();
    format!("{}.{}", quote_ident(schema), quote_ident(STATE_TABLE))
}

/// The state table, created if missing (setup, and sql/outbox.sql).
pub fn state_table_sql(names: &OutboxNames) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n\
         \x20   slot text PRIMARY KEY,\n\
         \x20   acknowledged_commit timestamptz,\n\
         \x20   emitted_events boolean NOT NULL DEFAULT false,\n\
         \x20   recovering boolean NOT NULL DEFAULT false,\n\
         \x20   backfill_from timestamptz,\n\
         \x20   updated_at timestamptz NOT NULL DEFAULT now()\n\
         );",
        state_table(names)
    )
}

/// Whether the relay has decoded an event of its outbox's emit functions (`outbox_emit`):
/// set by the stream, recorded by the cleanup. Such events were only ever in the WAL, so a
/// recovery of the slot cannot backfill them. Cheap to clone (clones share it).
#[derive(Debug, Clone, Default)]
pub struct EmittedSeen(Arc<AtomicBool>);

impl EmittedSeen {
    pub fn note(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Records the commit time of the newest acknowledged transaction, and whether emitted
/// events were seen (once set, it stays), where a promoted standby has them too (the table
/// replicates like any other). `false` when there is no state table (a setup from before
/// it): recovery then backfills the whole table.
pub async fn record_acknowledged(
    client: &Client,
    names: &OutboxNames,
    at: SystemTime,
    emitted: &EmittedSeen,
) -> Result<bool, RelayError> {
    let upsert = format!(
        "INSERT INTO {} AS s (slot, acknowledged_commit, emitted_events) VALUES ($1, $2, $3) \
         ON CONFLICT (slot) DO UPDATE SET acknowledged_commit = \
         greatest(s.acknowledged_commit, excluded.acknowledged_commit), \
         emitted_events = s.emitted_events OR excluded.emitted_events, updated_at = now()",
        state_table(names)
    );
    let emitted = emitted.get();
    match client
        .execute(&upsert, &[&names.slot.name, &at, &emitted])
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if unavailable(&e) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The state table is missing (a setup from before it) or the role may not use it (a
/// least-privilege role granted before it existed): the relay runs as without it, and says
/// so once.
fn unavailable(e: &tokio_postgres::Error) -> bool {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let code = e.code();
    let unavailable =
        code == Some(&SqlState::UNDEFINED_TABLE) || code == Some(&SqlState::INSUFFICIENT_PRIVILEGE);
    if unavailable && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            table = STATE_TABLE,
            reason = %e.as_db_error().map_or_else(|| e.to_string(), |db| db.message().to_string()),
            "the relay's state table cannot be used: --on-slot-lost recreate cannot recover \
             a lost slot without it. Fix: run `outbox-relay setup`, and grant SELECT, INSERT, UPDATE \
             on it to the relay's role (sql/role.sql)"
        );
    }
    unavailable
}

/// What the state table says of the slot.
#[derive(Debug, Clone, Default)]
pub struct State {
    pub acknowledged_commit: Option<SystemTime>,
    /// The relay decoded events of the emit functions before (at the last record).
    pub emitted_events: bool,
    pub recovering: bool,
    pub backfill_from: Option<SystemTime>,
}

pub async fn read_state(client: &Client, names: &OutboxNames) -> Result<Option<State>, RelayError> {
    let query = format!(
        "SELECT acknowledged_commit, emitted_events, recovering, backfill_from FROM {} \
         WHERE slot = $1",
        state_table(names)
    );
    match client.query_opt(&query, &[&names.slot.name]).await {
        Ok(row) => Ok(Some(row.map_or_else(State::default, |row| State {
            acknowledged_commit: row.get(0),
            emitted_events: row.get(1),
            recovering: row.get(2),
            backfill_from: row.get(3),
        }))),
        Err(e) if unavailable(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether a recovery was begun and not finished: the slot that exists may then have been
/// made by it, and the rows before its start may not all be published.
pub async fn interrupted(client: &Client, names: &OutboxNames) -> Result<bool, RelayError> {
    Ok(read_state(client, names)
        .await?
        .is_some_and(|s| s.recovering))
}
