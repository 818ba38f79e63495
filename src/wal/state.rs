//! The relay's own state in the database, `<schema>.outbox_relay_state`: the commit time of
//! the newest transaction it acknowledged, whether the outbox carries events of the emit
//! functions, and a recovery under way. It lives where a promoted standby has it too (the
//! table replicates like any other), which is what `--on-slot-lost recreate`
//! (`wal/recovery.rs`) needs to know where to backfill from, and whether it can.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use pgwire_replication::Lsn;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::advice::{self, Warning};
use crate::config::OutboxNames;
use crate::error::RelayError;
use crate::error::SlotError;
use crate::observability::Health;
use outbox_common::periodic::{self, FailureLog, FirstRound, Job};
use outbox_common::quote::quote_ident;

/// The state table's name, in the outbox table's schema.
pub(crate) const STATE_TABLE: &str = "outbox_relay_state";

/// `<schema>.outbox_relay_state`, quoted.
pub(crate) fn state_table(names: &OutboxNames) -> String {
    let (schema, _) = names.table_parts();
    format!("{}.{}", quote_ident(schema), quote_ident(STATE_TABLE))
}

/// The state table, created if missing (setup, and sql/outbox.sql); the columns of a
/// recovery's progress are added to one made before them.
pub(crate) fn state_table_sql(names: &OutboxNames) -> String {
    let table = state_table(names);
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n\
         \x20   slot text PRIMARY KEY,\n\
         \x20   acknowledged_commit timestamptz,\n\
         \x20   emitted_events boolean NOT NULL DEFAULT false,\n\
         \x20   recovering boolean NOT NULL DEFAULT false,\n\
         \x20   backfill_from timestamptz,\n\
         \x20   backfill_slot_lsn pg_lsn,\n\
         \x20   backfill_until timestamptz,\n\
         \x20   backfill_confirmed_created_at text,\n\
         \x20   backfill_confirmed_id text,\n\
         \x20   updated_at timestamptz NOT NULL DEFAULT now()\n\
         );\n\
         ALTER TABLE {table}\n\
         \x20   ADD COLUMN IF NOT EXISTS backfill_slot_lsn pg_lsn,\n\
         \x20   ADD COLUMN IF NOT EXISTS backfill_until timestamptz,\n\
         \x20   ADD COLUMN IF NOT EXISTS backfill_confirmed_created_at text,\n\
         \x20   ADD COLUMN IF NOT EXISTS backfill_confirmed_id text;"
    )
}

/// Whether the relay has decoded an event of its outbox's emit functions (`outbox_emit`):
/// set by the stream, recorded by the cleanup. Such events were only ever in the WAL, so a
/// recovery of the slot cannot backfill them. Cheap to clone (clones share it).
#[derive(Debug, Clone, Default)]
pub(crate) struct EmittedSeen(Arc<AtomicBool>);

impl EmittedSeen {
    pub(crate) fn note(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Records the commit time of the newest acknowledged transaction, and whether emitted
/// events were seen (once set, it stays), where a promoted standby has them too (the table
/// replicates like any other). `false` when there is no state table (a setup from before
/// it): recovery then backfills the whole table.
pub(crate) async fn record_acknowledged(
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

/// How often the recorder looks whether there is something to record: the first
/// acknowledged commit is recorded within this of being acknowledged.
const RECORDER_TICK: Duration = Duration::from_millis(250);
/// After the first, an acknowledged commit is recorded at most this often (the cleanup
/// records one at each of its rounds too, before it deletes by it).
const RECORD_EVERY: Duration = Duration::from_secs(60);

/// What the session's recorder wrote so far.
#[derive(Default)]
struct Recorded {
    session: bool,
    commit: Option<(SystemTime, Instant)>,
}

/// Records the state for `--on-slot-lost recreate` while a session holds the slot: the row
/// at once (so a slot lost in the relay's first minute is known to have been watched), the
/// first acknowledged commit within a [`RECORDER_TICK`] of it, then a newer one every
/// [`RECORD_EVERY`], with cleanup or without. Until `shutdown`; failures are logged, never
/// fatal (the next tick tries again).
pub(crate) async fn run_recorder(
    database_url: String,
    names: OutboxNames,
    (health, emitted): (Health, EmittedSeen),
    shutdown: CancellationToken,
) {
    let job = Job {
        what: "state recorder",
        interval: RECORDER_TICK,
        first_round: FirstRound::AtOnce,
        round_timeout: Some(Duration::from_secs(10)),
        errors: None,
        failure_log: FailureLog::OncePerOutage,
    };
    let recorded = Arc::new(Mutex::new(Recorded::default()));
    let round = |connection: periodic::Connection| {
        let (names, health, emitted) = (names.clone(), health.clone(), emitted.clone());
        let recorded = Arc::clone(&recorded);
        async move {
            let lock = || recorded.lock().unwrap_or_else(PoisonError::into_inner);
            if !lock().session {
                record_session(&*connection.client().await?, &names, &emitted).await?;
                lock().session = true;
            }
            let Some(at) = health.acknowledged_commit_time() else {
                return Ok(());
            };
            let due = match lock().commit {
                None => true,
                Some((last, when)) => at > last && when.elapsed() >= RECORD_EVERY,
            };
            if due {
                record_acknowledged(&*connection.client().await?, &names, at, &emitted).await?;
                lock().commit = Some((at, Instant::now()));
            }
            Ok::<_, RelayError>(())
        }
    };
    periodic::run(&database_url, job, shutdown, round, |()| {}).await;
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
            "{}",
            advice::warning(
                "the relay's state table cannot be used: --on-slot-lost recreate cannot recover \
                 a lost slot without it",
                Warning::StateTableUnusable
            )
        );
    }
    unavailable
}

/// Where a recovery's backfill starts for a recorded acknowledged commit (by `created_at`):
/// `margin` (`--recreate-margin`) before it, for transactions open across it. The cleanup
/// never deletes past it.
pub(crate) fn backfill_start(acknowledged_commit: SystemTime, margin: Duration) -> SystemTime {
    acknowledged_commit
        .checked_sub(margin)
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// What the state table says of the slot.
#[derive(Debug, Clone, Default)]
pub(crate) struct State {
    /// The slot has a row: a relay recorded it (at a session's start, at its first
    /// acknowledgement, at each cleanup round), and has watched for emitted events since.
    pub recorded: bool,
    pub acknowledged_commit: Option<SystemTime>,
    /// The relay decoded events of the emit functions before (at the last record).
    pub emitted_events: bool,
    pub recovering: bool,
    pub backfill_from: Option<SystemTime>,
    /// How far the recovery under way got, once it made its slot.
    pub backfilled: Option<Backfilled>,
}

/// A recovery's progress (wal/recovery.rs): the slot it made, and the last row its backfill
/// had confirmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Backfilled {
    /// The slot's consistent point: its `confirmed_flush_lsn` until a session acknowledges
    /// something, which none does before the recovery finishes.
    pub slot_lsn: Lsn,
    /// The server's time once the slot was made: every row committed before the slot's
    /// start was created before it (`created_at` is its transaction's `now()`).
    pub until: SystemTime,
    /// The last confirmed row's `created_at` and id, as the backfill read them (text).
    pub confirmed: Option<(String, String)>,
}

pub(crate) async fn read_state(
    client: &Client,
    names: &OutboxNames,
) -> Result<Option<State>, RelayError> {
    let query = format!(
        "SELECT acknowledged_commit, emitted_events, recovering, backfill_from, \
         backfill_slot_lsn::text, backfill_until, backfill_confirmed_created_at, \
         backfill_confirmed_id FROM {} WHERE slot = $1",
        state_table(names)
    );
    match client.query_opt(&query, &[&names.slot.name]).await {
        Ok(row) => Ok(Some(row.map_or_else(State::default, |row| {
            let slot_lsn: Option<String> = row.get(4);
            let until: Option<SystemTime> = row.get(5);
            let confirmed: (Option<String>, Option<String>) = (row.get(6), row.get(7));
            State {
                recorded: true,
                acknowledged_commit: row.get(0),
                emitted_events: row.get(1),
                recovering: row.get(2),
                backfill_from: row.get(3),
                backfilled: slot_lsn
                    .and_then(|lsn| Lsn::parse(&lsn).ok())
                    .zip(until)
                    .map(|(slot_lsn, until)| Backfilled {
                        slot_lsn,
                        until,
                        confirmed: confirmed.0.zip(confirmed.1),
                    }),
            }
        }))),
        Err(e) if unavailable(&e) => Ok(None),
        // A table made before the progress columns: `setup` adds them.
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_COLUMN) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether a recovery was begun and not finished: the slot that exists may then have been
/// made by it, and the rows before its start may not all be published.
///
/// Fails closed: a state table this role may not read could hold such a mark (another
/// relay's recovery, a crash mid-backfill), and streaming that slot would lose the rows not
/// yet re-published, so that is an error naming the grant. Only a missing table means no
/// mark: a recovery refuses to start without one.
pub(crate) async fn interrupted(client: &Client, names: &OutboxNames) -> Result<bool, RelayError> {
    let query = format!(
        "SELECT recovering FROM {} WHERE slot = $1",
        state_table(names)
    );
    match client.query_opt(&query, &[&names.slot.name]).await {
        Ok(row) => Ok(row.is_some_and(|row| row.get(0))),
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(false),
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
            Err(RelayError::Slot(SlotError::RecoveryStateUnreadable {
                slot: names.slot.to_string(),
                table: state_table(names),
            }))
        }
        Err(e) => Err(e.into()),
    }
}

/// Records that a session of this relay holds the slot: the row exists from then on (a
/// recovery tells "watched, no emitted event seen" from "never recorded" by it), with the
/// emitted events seen so far. Nothing else changes; `false` without a usable state table.
pub(crate) async fn record_session(
    client: &Client,
    names: &OutboxNames,
    emitted: &EmittedSeen,
) -> Result<bool, RelayError> {
    let upsert = format!(
        "INSERT INTO {} AS s (slot, emitted_events) VALUES ($1, $2) \
         ON CONFLICT (slot) DO UPDATE SET \
         emitted_events = s.emitted_events OR excluded.emitted_events, updated_at = now()",
        state_table(names)
    );
    match client
        .execute(&upsert, &[&names.slot.name, &emitted.get()])
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if unavailable(&e) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
