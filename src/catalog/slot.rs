//! The slot as PostgreSQL sees it: the one read of `pg_replication_slots` ([`read_slot`]),
//! used by preflight, the standby's watch, the final check that the slot took a stopping
//! session's position, the meaning of a replication error, `status`, `teardown`, and the
//! slot poller, which sets the slot gauges from it every `--slot-poll-interval` on an
//! ordinary connection of its own.
//!
//! The relay is watched through its slot. A slot that stops advancing pins WAL on the primary
//! until the disk fills or `max_slot_wal_keep_size` invalidates it, so the numbers that matter
//! most come from PostgreSQL itself, not from the relay's own view: the poller keeps reading
//! whatever the replication session is doing (it keeps reporting while the session
//! reconnects). It only reads: it must never create, advance or drop the slot.
//!
//! The row is read as JSON (`to_jsonb`), so the columns a newer server adds (17's `failover`,
//! `synced`, `invalidation_reason`, …) are simply there or absent, on every version.
//!
//! On 17+, a failover slot is also held back by the standbys that `synchronized_standby_slots`
//! names: the walsender sends nothing those physical slots have not confirmed. The poller
//! reads them in the same round ([`read_standby_slots`]) and says when one of them is what
//! the relay waits for ([`StandbySlots::waits`]): `/readyz` then names it instead of the
//! symptoms (a growing lag, a silent stream).

use std::time::Duration;

use pgwire_replication::{Lsn, PgWireError};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::advice::{self, Warning};
use crate::config::{FailoverSlot, OutboxNames};
use crate::db;
use crate::error::{CatalogError, SlotError};
use crate::error::{ConfigProblem, RelayError};
use time::format_description::well_known::Rfc3339;

use crate::observability::{
    Health, StandbyWait, FAILOVER_READY, HOST_LABEL, INVALIDATION_REASONS, REASON_LABEL,
    SLOT_ACTIVE, SLOT_CONFLICTING, SLOT_FAILOVER, SLOT_INACTIVE_SINCE_SECONDS,
    SLOT_INVALIDATION_REASON, SLOT_LABEL, SLOT_LAG_BYTES, SLOT_POLLS_TOTAL, SLOT_POLL_ERRORS_TOTAL,
    SLOT_RETAINED_WAL_BYTES, SLOT_SAFE_WAL_SIZE_BYTES, SLOT_SYNCED, SLOT_WAL_STATUS, STATUS_LABEL,
    WAITING_FOR_STANDBY, WAL_STATUSES,
};
use outbox_common::periodic::{self, Job};

/// One row of `pg_replication_slots` for the relay's slot, with the byte distances the
/// relay reports (read in one statement, so they belong together). Columns a server does not
/// have are `None`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct SlotReport {
    #[serde(rename(deserialize = "slot_name"))]
    pub slot: String,
    pub plugin: Option<String>,
    /// `logical` or `physical`.
    #[serde(default)]
    pub slot_type: String,
    /// Whether the slot belongs to the database the connection is in.
    #[serde(default)]
    pub in_this_database: Option<bool>,
    pub active_pid: Option<i32>,
    /// `reserved`, `extended`, `unreserved` or `lost` (NULL for a slot never used).
    pub wal_status: Option<String>,
    /// NULL while max_slot_wal_keep_size is -1 (unlimited).
    #[serde(rename(deserialize = "safe_wal_size"))]
    pub safe_wal_size_bytes: Option<i64>,
    pub confirmed_flush_lsn: Option<String>,
    pub restart_lsn: Option<String>,
    /// pg_current_wal_lsn() − confirmed_flush_lsn.
    pub lag_bytes: Option<i64>,
    /// pg_current_wal_lsn() − restart_lsn.
    pub retained_wal_bytes: Option<i64>,
    pub current_wal_lsn: String,
    /// A temporary slot (a synced one starts so on a standby, 17+).
    #[serde(default)]
    pub temporary: Option<bool>,
    /// 16+: invalidated by a conflict with recovery (a slot on a standby).
    #[serde(default)]
    pub conflicting: Option<bool>,
    /// 17+: a failover slot, synchronized to standbys that ask for it.
    #[serde(default)]
    pub failover: Option<bool>,
    /// 17+: on a standby, synchronized from the primary.
    #[serde(default)]
    pub synced: Option<bool>,
    /// 17+: since when no process has streamed from the slot.
    #[serde(default)]
    pub inactive_since: Option<String>,
    /// 17+: why the slot was invalidated: `wal_removed`, `rows_removed`,
    /// `wal_level_insufficient`, or (18) `idle_timeout`.
    #[serde(default)]
    pub invalidation_reason: Option<String>,
}

impl SlotReport {
    /// Invalidated: it can never be streamed from again. PostgreSQL 15 and 16 say so with
    /// `wal_status = 'lost'` (16: or `conflicting`); from 17 `invalidation_reason` names the
    /// reason, also for invalidations that keep the WAL (`rows_removed`, `idle_timeout`).
    pub(crate) fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
            || self.invalidation_reason.is_some()
            || self.conflicting == Some(true)
    }

    /// Why the slot was invalidated, in 17's words, on every version. 15 and 16 name no
    /// reason: any invalidated slot shows `wal_status = 'lost'`, and on 16 any invalidated
    /// logical slot also shows `conflicting`, even one whose WAL was removed. Removing WAL
    /// is the one invalidation that clears `restart_lsn`, so that tells them apart.
    pub(crate) fn lost_reason(&self) -> Option<&str> {
        if let Some(reason) = &self.invalidation_reason {
            return Some(reason);
        }
        let invalidated = self.wal_status.as_deref() == Some("lost");
        match (invalidated, self.restart_lsn.is_some(), self.conflicting) {
            (true, false, _) => Some("wal_removed"),
            (_, _, Some(true)) => Some("rows_removed"),
            (true, true, _) => Some("wal_removed"),
            (false, _, _) => None,
        }
    }

    /// The slot's confirmed position, once it has one.
    pub(crate) fn confirmed_flush(&self) -> Option<Lsn> {
        self.confirmed_flush_lsn
            .as_deref()
            .and_then(|text| Lsn::parse(text).ok())
    }
}

/// Reads the slot's row; `None` when no slot has this name.
pub(crate) async fn read_slot(
    client: &Client,
    slot: &str,
) -> Result<Option<SlotReport>, RelayError> {
    let row = client
        .query_opt(
            "SELECT (to_jsonb(s) || jsonb_build_object( \
                 'in_this_database', s.database = current_database(), \
                 'lag_bytes', (pg_current_wal_lsn() - s.confirmed_flush_lsn)::int8, \
                 'retained_wal_bytes', (pg_current_wal_lsn() - s.restart_lsn)::int8, \
                 'current_wal_lsn', pg_current_wal_lsn()::text))::text \
             FROM pg_catalog.pg_replication_slots s WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let json: String = row.get(0);
    serde_json::from_str(&json)
        .map(Some)
        .map_err(|e| RelayError::Bug(format!("cannot read pg_replication_slots' row: {e}")))
}

/// [`read_slot`] on a connection of its own, bounded by the connect timeout; `None` when the
/// catalog cannot be read.
async fn read_slot_now(database_url: &str, slot: &str) -> Option<Option<SlotReport>> {
    let read = async {
        let client = db::connect(database_url).await?;
        read_slot(&client, slot).await
    };
    match tokio::time::timeout(outbox_common::pg::CONNECT_TIMEOUT, read).await {
        Ok(Ok(report)) => Some(report),
        _ => None,
    }
}

/// What a replication error means for this relay. The server's SQLSTATE says which kind of
/// problem it is; the catalog, not the message text, says which object: who holds the slot,
/// whether the slot was invalidated, whether it is the slot or the publication that is
/// missing.
pub(crate) async fn replication_error(
    error: PgWireError,
    names: &OutboxNames,
    database_url: &str,
) -> RelayError {
    let error = RelayError::replication(error);
    let RelayError::Replication {
        sqlstate: Some(sqlstate),
        ..
    } = &error
    else {
        return error;
    };
    let sqlstate = sqlstate.clone();
    if ![
        SqlState::OBJECT_IN_USE,
        SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE,
        SqlState::UNDEFINED_OBJECT,
    ]
    .contains(&sqlstate)
    {
        return error;
    }
    let slot = read_slot_now(database_url, &names.slot).await;
    match (sqlstate, slot) {
        (SqlState::OBJECT_IN_USE, slot) => RelayError::Slot(SlotError::InUse {
            slot: names.slot.to_string(),
            pid: slot
                .flatten()
                .and_then(|slot| slot.active_pid)
                .map_or_else(|| "unknown".into(), |pid| pid.to_string()),
        }),
        (SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE, Some(Some(slot))) if slot.is_lost() => {
            RelayError::Slot(SlotError::Lost {
                slot: names.slot.to_string(),
                confirmed_flush: "its last position".into(),
                reason: slot.lost_reason().map(str::to_string),
            })
        }
        (SqlState::UNDEFINED_OBJECT, Some(None)) => RelayError::Slot(SlotError::Missing {
            slot: names.slot.to_string(),
        }),
        // The slot exists: the object the walsender could not find is the publication.
        (SqlState::UNDEFINED_OBJECT, Some(Some(_))) => {
            RelayError::Catalog(CatalogError::PublicationMissing {
                publication: names.publication.to_string(),
                table: names.table.to_string(),
            })
        }
        _ => error,
    }
}

/// Waits until the slot's confirmed_flush_lsn is at `target`: false after `timeout` or on
/// any error. A sent status update is only bytes in a socket: the walsender reads them
/// between its own writes, and closing the connection while it still sends (the relay has
/// stopped reading) makes the kernel reset it, which discards whatever it had not read yet —
/// the final position included. A standby would then replay what was already delivered.
pub(crate) async fn wait_until_confirmed(
    database_url: &str,
    slot: &str,
    target: Lsn,
    timeout: Duration,
) -> bool {
    let check = async {
        let client = db::connect(database_url).await?;
        loop {
            let Some(report) = read_slot(&client, slot).await? else {
                // No slot to tell (the next session reports that).
                return Ok::<_, RelayError>(false);
            };
            if report.confirmed_flush().is_some_and(|at| at >= target) {
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    matches!(tokio::time::timeout(timeout, check).await, Ok(Ok(true)))
}

/// Sets the slot gauges from one report.
pub(crate) fn record_slot(report: &SlotReport) {
    let bytes = |value: Option<i64>| value.map(|v| v as f64).unwrap_or(f64::NAN);
    metrics::gauge!(SLOT_LAG_BYTES).set(bytes(report.lag_bytes));
    metrics::gauge!(SLOT_RETAINED_WAL_BYTES).set(bytes(report.retained_wal_bytes));
    metrics::gauge!(SLOT_SAFE_WAL_SIZE_BYTES).set(bytes(report.safe_wal_size_bytes));
    metrics::gauge!(SLOT_ACTIVE).set(if report.active_pid.is_some() {
        1.0
    } else {
        0.0
    });
    for status in WAL_STATUSES {
        let value = if report.wal_status.as_deref() == Some(status) {
            1.0
        } else {
            0.0
        };
        metrics::gauge!(SLOT_WAL_STATUS, STATUS_LABEL => status).set(value);
    }
    let lost_reason = report.lost_reason();
    for reason in INVALIDATION_REASONS {
        let value = if lost_reason == Some(reason) {
            1.0
        } else {
            0.0
        };
        metrics::gauge!(SLOT_INVALIDATION_REASON, REASON_LABEL => reason).set(value);
    }
    // Columns a server does not have stay unset: absent from /metrics, not a false 0.
    let flag = |value: bool| if value { 1.0 } else { 0.0 };
    for (name, value) in [
        (SLOT_CONFLICTING, report.conflicting),
        (SLOT_FAILOVER, report.failover),
        (SLOT_SYNCED, report.synced),
    ] {
        if let Some(value) = value {
            metrics::gauge!(name).set(flag(value));
        }
    }
    if report.failover.is_some() {
        // 17+: the column exists; NaN while a process streams from the slot.
        let since = report
            .inactive_since
            .as_deref()
            .and_then(|text| time::OffsetDateTime::parse(text, &Rfc3339).ok())
            .map_or(f64::NAN, |at| at.unix_timestamp() as f64);
        metrics::gauge!(SLOT_INACTIVE_SINCE_SECONDS).set(since);
    }
}

/// Reads the slot every `interval` until `shutdown`, setting the slot gauges and telling
/// `health` when the slot is lost, or held back by a standby of `synchronized_standby_slots`
/// (one more cheap query in the same round).
pub(crate) async fn run_slot_poller(
    database_url: String,
    slot: String,
    interval: Duration,
    health: Health,
    shutdown: CancellationToken,
) {
    let polls = metrics::counter!(SLOT_POLLS_TOTAL);
    let mut missing_logged = false;
    let mut previous_standbys: Option<StandbySlots> = None;
    let mut waited_on: Vec<String> = Vec::new();
    let name = slot.clone();
    let read = move |connection: periodic::Connection| {
        let slot = slot.clone();
        async move {
            let client = connection.client().await?;
            let report = read_slot(&client, &slot).await?;
            let standbys = read_standby_slots(&client, &slot).await?;
            Ok::<_, RelayError>((report, standbys))
        }
    };
    let record = move |(report, standbys): (Option<SlotReport>, Option<StandbySlots>)| {
        polls.increment(1);
        match report {
            Some(report) => {
                record_slot(&report);
                health.set_slot_lost(report.is_lost());
                missing_logged = false;
            }
            None if !missing_logged => {
                tracing::warn!(slot = %name, "slot poller: the replication slot does not exist");
                missing_logged = true;
            }
            None => {}
        }
        let waits = standbys
            .as_ref()
            .map(|now| now.waits(previous_standbys.as_ref()))
            .unwrap_or_default();
        record_standby_waits(&waits, &mut waited_on);
        health.set_waiting_for_standby(waits.into_iter().next());
        previous_standbys = standbys;
    };
    let errors = metrics::counter!(SLOT_POLL_ERRORS_TOTAL);
    let job = Job::poller("slot poller", interval, errors);
    periodic::run(&database_url, job, shutdown, read, record).await;
}

/// Sets [`WAITING_FOR_STANDBY`] for the standby slots holding the relay back (1), and back to
/// 0 for those that did at an earlier poll; logs each new wait once.
fn record_standby_waits(waits: &[StandbyWait], waited_on: &mut Vec<String>) {
    for wait in waits {
        if !waited_on.contains(&wait.slot) {
            tracing::warn!(
                standby_slot = %wait.slot,
                why = %wait.why,
                "{}",
                advice::warning(
                    "PostgreSQL sends the relay nothing this standby has not confirmed \
                     (synchronized_standby_slots): publishing waits until it is back",
                    Warning::WaitingForStandby
                )
            );
            waited_on.push(wait.slot.clone());
        }
        metrics::gauge!(WAITING_FOR_STANDBY, SLOT_LABEL => wait.slot.clone()).set(1.0);
    }
    waited_on.retain(|slot| {
        let still = waits.iter().any(|wait| &wait.slot == slot);
        if !still {
            tracing::info!(standby_slot = %slot, "the standby no longer holds the relay back");
            metrics::gauge!(WAITING_FOR_STANDBY, SLOT_LABEL => slot.clone()).set(0.0);
        }
        still
    });
}

/// One physical slot that `synchronized_standby_slots` names, as the primary sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StandbySlot {
    pub name: String,
    /// `None`: no slot of that name exists.
    pub state: Option<StandbySlotState>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StandbySlotState {
    /// Why it was invalidated, if it was.
    pub lost_reason: Option<String>,
    /// A walreceiver streams through it.
    pub active: bool,
    /// Its `restart_lsn`: what the standby has flushed.
    pub flushed: Option<Lsn>,
}

/// The standbys a failover slot waits for, read in one statement on the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StandbySlots {
    pub slots: Vec<StandbySlot>,
    /// The relay's slot's `confirmed_flush_lsn`.
    pub confirmed: Option<Lsn>,
    pub current: Option<Lsn>,
}

impl StandbySlots {
    /// The listed slots that hold the relay's slot back now: missing, invalidated, or with no
    /// standby streaming through them; or behind: its standby has not flushed anything since
    /// the `previous` poll while the primary's WAL is past it and the relay has confirmed
    /// everything up to it (so the relay waits for it, not for itself). A standby a few
    /// milliseconds behind at one poll is normal and is not reported.
    pub(crate) fn waits(&self, previous: Option<&StandbySlots>) -> Vec<StandbyWait> {
        let flushed_before = |name: &str| {
            previous
                .and_then(|p| p.slots.iter().find(|s| s.name == name))
                .and_then(|s| s.state.as_ref())
                .and_then(|s| s.flushed)
        };
        self.slots
            .iter()
            .filter_map(|slot| {
                let why = match &slot.state {
                    None => "its slot does not exist".to_string(),
                    Some(StandbySlotState {
                        lost_reason: Some(reason),
                        ..
                    }) => format!("its slot was invalidated ({reason})"),
                    Some(StandbySlotState { active: false, .. }) => {
                        "no standby is connected to its slot".to_string()
                    }
                    Some(StandbySlotState {
                        flushed: Some(flushed),
                        ..
                    }) if flushed_before(&slot.name) == Some(*flushed)
                        && self.current.is_some_and(|current| current > *flushed)
                        && self
                            .confirmed
                            .is_some_and(|confirmed| confirmed >= *flushed) =>
                    {
                        format!(
                            "its standby has flushed nothing past {flushed} since the last poll"
                        )
                    }
                    Some(_) => return None,
                };
                Some(StandbyWait {
                    slot: slot.name.clone(),
                    why,
                })
            })
            .collect()
    }
}

/// The physical slots `synchronized_standby_slots` names and the relay's slot's position, on
/// the primary. `None` when nothing can hold the slot back: the setting is unset or unknown
/// (before 17), or the relay's slot is not a failover slot (PostgreSQL waits only for those).
pub(crate) async fn read_standby_slots(
    client: &Client,
    slot: &str,
) -> Result<Option<StandbySlots>, RelayError> {
    // The setting is a list of slot names (identifiers: quotes allowed, never needed for a
    // slot name, which is [a-z0-9_]).
    let rows = client
        .query(
            "WITH relay AS ( \
                 SELECT confirmed_flush_lsn::text AS confirmed, \
                        coalesce((to_jsonb(r) ->> 'failover')::bool, false) AS failover \
                 FROM pg_catalog.pg_replication_slots r WHERE slot_name = $1), \
             listed AS ( \
                 SELECT btrim(name, ' \"') AS name \
                 FROM unnest(string_to_array( \
                     current_setting('synchronized_standby_slots', true), ',')) AS name) \
             SELECT l.name, s.slot_name IS NOT NULL, \
                    coalesce(to_jsonb(s) ->> 'invalidation_reason', \
                             CASE WHEN s.wal_status = 'lost' THEN 'wal_removed' END), \
                    coalesce(s.active, false), s.restart_lsn::text, \
                    relay.confirmed, pg_current_wal_lsn()::text \
             FROM listed l \
             CROSS JOIN relay \
             LEFT JOIN pg_catalog.pg_replication_slots s ON s.slot_name = l.name \
             WHERE l.name <> '' AND relay.failover",
            &[&slot],
        )
        .await?;
    let lsn = |text: Option<String>| text.and_then(|t| Lsn::parse(&t).ok());
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let confirmed = lsn(first.get(5));
    let current = lsn(first.get(6));
    let slots = rows
        .iter()
        .map(|row| StandbySlot {
            name: row.get(0),
            state: row.get::<_, bool>(1).then(|| StandbySlotState {
                lost_reason: row.get(2),
                active: row.get(3),
                flushed: lsn(row.get(4)),
            }),
        })
        .collect();
    Ok(Some(StandbySlots {
        slots,
        confirmed,
        current,
    }))
}

/// How one server of the database URL stands for the next failover.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum Readiness {
    /// The primary: the slot the relay streams from.
    Primary,
    /// A standby whose copy of the slot is synced, persistent and valid: a promotion keeps it.
    Ready,
    /// A standby a promotion would leave without a usable slot, and why.
    NotReady { why: String },
    /// Not reachable, or the catalog could not be read.
    Unknown { why: String },
}

/// Each server the database URL names, and whether a promotion of it would keep the slot
/// (PostgreSQL 17+: `synced AND NOT temporary AND invalidation_reason IS NULL` on the
/// standby). One read per server, each bounded by the connect timeout.
pub(crate) async fn failover_readiness(database_url: &str, slot: &str) -> Vec<(String, Readiness)> {
    let Ok(servers) = db::servers(database_url) else {
        return Vec::new();
    };
    let mut found = Vec::with_capacity(servers.len());
    for server in &servers {
        let read = tokio::time::timeout(
            outbox_common::pg::CONNECT_TIMEOUT,
            readiness_of(database_url, server, slot),
        );
        let readiness = match read.await {
            Ok(Ok(readiness)) => readiness,
            Ok(Err(e)) => Readiness::Unknown {
                why: outbox_common::error::chain(&e),
            },
            Err(_) => Readiness::Unknown {
                why: "no answer within the connect timeout".into(),
            },
        };
        found.push((server.to_string(), readiness));
    }
    found
}

async fn readiness_of(
    database_url: &str,
    server: &outbox_common::pg::Server,
    slot: &str,
) -> Result<Readiness, RelayError> {
    let client = db::connect_to(database_url, server).await?;
    let in_recovery: bool = client
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await?
        .get(0);
    if !in_recovery {
        return Ok(Readiness::Primary);
    }
    // On a standby: the row as JSON again (16 has no `synced`), without the WAL distances
    // (pg_current_wal_lsn() is refused during recovery).
    let row = client
        .query_opt(
            "SELECT to_jsonb(s)::text FROM pg_catalog.pg_replication_slots s WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    let Some(row) = row else {
        return Ok(Readiness::NotReady {
            why: "no copy of the slot (not a failover slot, or the standby does not sync \
                  slots: sync_replication_slots)"
                .into(),
        });
    };
    let json: String = row.get(0);
    let copy: serde_json::Value = serde_json::from_str(&json)
        .map_err(|e| RelayError::Bug(format!("cannot read pg_replication_slots' row: {e}")))?;
    let why = match (
        copy.get("synced").and_then(serde_json::Value::as_bool),
        copy.get("temporary").and_then(serde_json::Value::as_bool),
        copy.get("invalidation_reason")
            .and_then(serde_json::Value::as_str),
    ) {
        (None, _, _) => "the server has no failover slots (PostgreSQL 16 or older)".to_string(),
        (_, _, Some(reason)) => format!("its copy was invalidated ({reason})"),
        (Some(false), _, _) => "its slot of that name is not synced from the primary (a \
             leftover of an earlier primary? drop it)"
            .into(),
        (Some(true), Some(true), _) => "its copy is still temporary (not caught up yet)".into(),
        (Some(true), _, None) => return Ok(Readiness::Ready),
    };
    Ok(Readiness::NotReady { why })
}

/// Every `interval` until `shutdown`, when the database URL names more than one server:
/// `outbox_relay_failover_ready{host}` for each standby (1: a promotion keeps the slot).
pub(crate) async fn run_failover_poller(
    database_url: String,
    slot: String,
    interval: Duration,
    shutdown: CancellationToken,
) {
    if db::servers(&database_url).map_or(true, |servers| servers.len() < 2) {
        return;
    }
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = shutdown.cancelled() => return,
        }
        for (host, readiness) in failover_readiness(&database_url, &slot).await {
            let ready = match readiness {
                // The primary is not a failover target: its series goes to 0 once it was one.
                Readiness::Primary => 0.0,
                Readiness::Ready => 1.0,
                Readiness::NotReady { .. } | Readiness::Unknown { .. } => 0.0,
            };
            metrics::gauge!(FAILOVER_READY, HOST_LABEL => host).set(ready);
        }
    }
}

/// Whether a slot made now on a server of `server_version_num` is a failover slot, as
/// `--failover-slot` asks; `on` before 17 is an error that says so.
pub(crate) fn failover_wanted(
    failover: FailoverSlot,
    server_version_num: i32,
) -> Result<bool, RelayError> {
    let has_failover_slots = server_version_num >= 170_000;
    match failover {
        FailoverSlot::Off => Ok(false),
        FailoverSlot::Auto => Ok(has_failover_slots),
        FailoverSlot::On if has_failover_slots => Ok(true),
        FailoverSlot::On => Err(ConfigProblem::FailoverNeeds17.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standbys(flushed: &str, confirmed: &str, current: &str) -> StandbySlots {
        let lsn = |text: &str| Lsn::parse(text).ok();
        StandbySlots {
            slots: vec![
                StandbySlot {
                    name: "gone".into(),
                    state: None,
                },
                StandbySlot {
                    name: "down".into(),
                    state: Some(StandbySlotState {
                        lost_reason: None,
                        active: false,
                        flushed: lsn("0/10"),
                    }),
                },
                StandbySlot {
                    name: "up".into(),
                    state: Some(StandbySlotState {
                        lost_reason: None,
                        active: true,
                        flushed: lsn(flushed),
                    }),
                },
            ],
            confirmed: lsn(confirmed),
            current: lsn(current),
        }
    }

    /// A standby a moment behind is normal; one that flushed nothing since the last poll
    /// while the relay waits at its position holds the slot back.
    #[test]
    fn a_standby_holds_the_slot_back_when_missing_down_or_stalled() {
        let waits = |now: &StandbySlots, before: Option<&StandbySlots>| -> Vec<String> {
            now.waits(before).into_iter().map(|w| w.slot).collect()
        };
        let first = standbys("0/100", "0/100", "0/200");
        assert_eq!(waits(&first, None), ["gone", "down"]);
        let moved = standbys("0/180", "0/180", "0/200");
        assert_eq!(waits(&moved, Some(&first)), ["gone", "down"]);
        let stalled = standbys("0/180", "0/180", "0/300");
        assert_eq!(waits(&stalled, Some(&moved)), ["gone", "down", "up"]);
        let relay_behind = standbys("0/180", "0/100", "0/300");
        assert_eq!(waits(&relay_behind, Some(&moved)), ["gone", "down"]);
        let idle = standbys("0/180", "0/180", "0/180");
        assert_eq!(waits(&idle, Some(&moved)), ["gone", "down"]);
        assert_eq!(
            first.waits(None)[1].why,
            "no standby is connected to its slot"
        );
    }

    fn report(json: &str) -> SlotReport {
        serde_json::from_str(json).expect("a pg_replication_slots row")
    }

    /// What to_jsonb makes of a row: 15 has no failover columns, 17 has them all.
    #[test]
    fn every_version_reads_and_the_lost_reason_is_told_alike() {
        let fifteen = report(
            r#"{"slot_name": "s", "plugin": "pgoutput", "slot_type": "logical", "database": "d",
                "temporary": false, "active": false, "active_pid": null, "wal_status": "lost",
                "safe_wal_size": null, "confirmed_flush_lsn": "0/16B3748",
                "restart_lsn": null, "in_this_database": true, "lag_bytes": 10,
                "retained_wal_bytes": null, "current_wal_lsn": "0/16B3800"}"#,
        );
        assert!(fifteen.is_lost());
        assert_eq!(fifteen.lost_reason(), Some("wal_removed"));
        assert_eq!(fifteen.failover, None);
        assert_eq!(fifteen.confirmed_flush(), Lsn::parse("0/16B3748").ok());

        let eighteen = report(
            r#"{"slot_name": "s", "plugin": "pgoutput", "slot_type": "logical", "database": "d",
                "active_pid": null, "wal_status": "reserved", "safe_wal_size": 1048576,
                "confirmed_flush_lsn": "0/16B3748", "restart_lsn": "0/16B3710",
                "conflicting": false, "failover": true, "synced": false,
                "inactive_since": "2026-12-01T20:00:00.123456+00:00",
                "invalidation_reason": "idle_timeout", "two_phase_at": null,
                "in_this_database": true, "lag_bytes": 10, "retained_wal_bytes": 56,
                "current_wal_lsn": "0/16B3800"}"#,
        );
        assert!(eighteen.is_lost(), "invalidated with its WAL still there");
        assert_eq!(eighteen.lost_reason(), Some("idle_timeout"));
        assert_eq!(eighteen.failover, Some(true));

        // 16 as it reports a slot on a standby that conflicted with recovery: the WAL it
        // reserved is still there.
        let sixteen_conflict = report(
            r#"{"slot_name": "s", "slot_type": "logical", "active_pid": null,
                "wal_status": "lost", "safe_wal_size": null, "conflicting": true,
                "confirmed_flush_lsn": "0/16B3748", "restart_lsn": "0/16B3710",
                "plugin": "pgoutput", "lag_bytes": 10, "retained_wal_bytes": 56,
                "current_wal_lsn": "0/16B3800"}"#,
        );
        assert!(sixteen_conflict.is_lost());
        assert_eq!(sixteen_conflict.lost_reason(), Some("rows_removed"));

        // 16.14 as it reported a slot invalidated by max_slot_wal_keep_size (a CI run):
        // `conflicting` too, but the WAL and the restart_lsn are gone.
        let sixteen_removed = report(
            r#"{"slot_name": "s", "slot_type": "logical", "active_pid": null,
                "wal_status": "lost", "safe_wal_size": null, "conflicting": true,
                "confirmed_flush_lsn": "0/18FFCD0", "restart_lsn": null,
                "plugin": "pgoutput", "lag_bytes": 7341112, "retained_wal_bytes": null,
                "current_wal_lsn": "0/2000000"}"#,
        );
        assert!(sixteen_removed.is_lost());
        assert_eq!(sixteen_removed.lost_reason(), Some("wal_removed"));
    }
}
