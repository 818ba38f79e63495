//! The slot as PostgreSQL sees it: one read of `pg_replication_slots` ([`read_slot`]) used
//! by `status`, `teardown` and the slot poller, which sets the slot gauges from it every
//! `--slot-poll-interval` on an ordinary connection of its own.
//!
//! The relay is watched through its slot. A slot that stops advancing pins WAL on the primary
//! until the disk fills or `max_slot_wal_keep_size` invalidates it, so the numbers that matter
//! most come from PostgreSQL itself, not from the relay's own view: the poller keeps reading
//! whatever the replication session is doing (it keeps reporting while the session
//! reconnects). It only reads: it must never create, advance or drop the slot.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::error::RelayError;
use crate::observability::{
    Health, SLOT_ACTIVE, SLOT_LAG_BYTES, SLOT_POLLS_TOTAL, SLOT_POLL_ERRORS_TOTAL,
    SLOT_RETAINED_WAL_BYTES, SLOT_SAFE_WAL_SIZE_BYTES, SLOT_WAL_STATUS, STATUS_LABEL, WAL_STATUSES,
};
use crate::periodic::{self, Job};

/// One row of `pg_replication_slots` for the relay's slot, with the byte distances the
/// relay reports (read in one statement, so they belong together).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SlotReport {
    pub slot: String,
    pub plugin: Option<String>,
    pub active_pid: Option<i32>,
    /// `reserved`, `extended`, `unreserved` or `lost` (NULL for a slot never used).
    pub wal_status: Option<String>,
    /// NULL while max_slot_wal_keep_size is -1 (unlimited).
    pub safe_wal_size_bytes: Option<i64>,
    pub confirmed_flush_lsn: Option<String>,
    pub restart_lsn: Option<String>,
    /// pg_current_wal_lsn() − confirmed_flush_lsn.
    pub lag_bytes: Option<i64>,
    /// pg_current_wal_lsn() − restart_lsn.
    pub retained_wal_bytes: Option<i64>,
    pub current_wal_lsn: String,
}

impl SlotReport {
    pub fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
    }
}

/// Reads the slot's row; `None` when no slot has this name.
pub async fn read_slot(client: &Client, slot: &str) -> Result<Option<SlotReport>, RelayError> {
    let row = client
        .query_opt(
            "SELECT slot_name::text, plugin::text, active_pid, wal_status, safe_wal_size, \
                    confirmed_flush_lsn::text, restart_lsn::text, \
                    (pg_current_wal_lsn() - confirmed_flush_lsn)::int8, \
                    (pg_current_wal_lsn() - restart_lsn)::int8, \
                    pg_current_wal_lsn()::text \
             FROM pg_catalog.pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.map(|row| SlotReport {
        slot: row.get(0),
        plugin: row.get(1),
        active_pid: row.get(2),
        wal_status: row.get(3),
        safe_wal_size_bytes: row.get(4),
        confirmed_flush_lsn: row.get(5),
        restart_lsn: row.get(6),
        lag_bytes: row.get(7),
        retained_wal_bytes: row.get(8),
        current_wal_lsn: row.get(9),
    }))
}

/// Sets the slot gauges from one report.
pub fn record_slot(report: &SlotReport) {
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
}

/// Reads the slot every `interval` until `shutdown`, setting the slot gauges and telling
/// `health` when the slot is lost.
pub async fn run_slot_poller(
    database_url: String,
    slot: String,
    interval: Duration,
    health: Health,
    shutdown: CancellationToken,
) {
    let polls = metrics::counter!(SLOT_POLLS_TOTAL);
    let mut missing_logged = false;
    let name = slot.clone();
    let read = move |connection: periodic::Connection| {
        let slot = slot.clone();
        async move { read_slot(&*connection.client().await?, &slot).await }
    };
    let record = move |report: Option<SlotReport>| {
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
    };
    let errors = metrics::counter!(SLOT_POLL_ERRORS_TOTAL);
    let job = Job::poller("slot poller", interval, errors);
    periodic::run(&database_url, job, shutdown, read, record).await;
}
