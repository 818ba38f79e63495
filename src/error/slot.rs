//! Errors of the replication slot: missing, unusable, lost (invalidated), vanished under a
//! session, held by another process (this relay is then a standby), and a lost slot's
//! recovery (`--on-slot-lost recreate`).

use super::kind::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("The replication slot \"{slot}\" does not exist")]
    Missing { slot: String },

    #[error("The replication slot \"{slot}\" {problem}")]
    Unusable { slot: String, problem: SlotProblem },

    #[error(
        "The replication slot \"{slot}\" was invalidated ({}), so messages committed after \
         {confirmed_flush} may be missing. The relay will not recreate the slot silently",
        lost_because(reason.as_deref())
    )]
    Lost {
        slot: String,
        confirmed_flush: String,
        /// `pg_replication_slots.invalidation_reason` (17+), or what 15 and 16 imply.
        reason: Option<String>,
    },

    #[error(
        "The replication slot \"{slot}\" cannot be recreated with --on-slot-lost recreate: \
         this outbox carries events of the emit functions (outbox_emit), or the relay's state \
         table cannot say that it does not (no session of the relay recorded it); those events are \
         only in the WAL, so no table holds what the lost slot did not deliver"
    )]
    CannotBackfill { slot: String },

    #[error(
        "A recovery of the replication slot \"{slot}\" (--on-slot-lost recreate) was \
         interrupted: the rows before the new slot's start may not all be published"
    )]
    RecoveryInterrupted { slot: String },

    #[error(
        "The replication slot \"{slot}\" cannot be recreated with --on-slot-lost recreate: the \
         relay's state table {table} is missing, lacks the columns of a recovery's progress (made \
         by an older setup), or this role may not use it, and without it a recovery \
         interrupted by a crash would go unnoticed and lose the rows it had not re-published \
         yet"
    )]
    RecoveryUnrecordable { slot: String, table: String },

    #[error(
        "The relay's role may not read its state table {table}, so it cannot tell whether a \
         recovery of the replication slot \"{slot}\" (--on-slot-lost recreate) was \
         interrupted; streaming a half-recovered slot would lose the rows not yet re-published"
    )]
    RecoveryStateUnreadable { slot: String, table: String },

    #[error(
        "The replication slot \"{slot}\" was lost or dropped under the session: \
         the next session recreates it"
    )]
    Vanished { slot: String },

    #[error(
        "The replication slot \"{slot}\" is in use by process {pid} (a running relay): stop it \
         first, then run teardown again"
    )]
    Active { slot: String, pid: String },

    #[error("The replication slot \"{slot}\" is in use by process {pid}")]
    InUse { slot: String, pid: String },

    #[error(
        "Another relay is recreating the replication slot \"{slot}\" (--on-slot-lost \
         recreate): this one waits as its standby"
    )]
    RecoveryInProgress { slot: String },
}

impl SlotError {
    /// What kind of failure this is (src/error/mod.rs, [`ErrorKind`]).
    pub(crate) fn kind(&self) -> ErrorKind {
        use SlotError::*;
        match self {
            Missing { .. }
            | Unusable { .. }
            | Active { .. }
            | CannotBackfill { .. }
            | RecoveryInterrupted { .. }
            | RecoveryUnrecordable { .. }
            | RecoveryStateUnreadable { .. } => ErrorKind::Provisioning,
            Lost { .. } => ErrorKind::SlotLost,
            InUse { .. } | RecoveryInProgress { .. } => ErrorKind::SlotHeld,
            Vanished { .. } => ErrorKind::DatabaseDown,
        }
    }
}

/// Why a slot was invalidated, in words, for [`SlotError::Lost`].
fn lost_because(reason: Option<&str>) -> String {
    match reason {
        Some("wal_removed") | None => "wal_removed: PostgreSQL removed WAL it still needed, \
             wal_status = 'lost' (max_slot_wal_keep_size)"
            .into(),
        Some("idle_timeout") => "idle_timeout: no process streamed from it for longer than \
             idle_replication_slot_timeout"
            .into(),
        Some("rows_removed") => "rows_removed: rows it still needed were vacuumed away (a \
             slot on a standby without hot_standby_feedback)"
            .into(),
        Some("wal_level_insufficient") => {
            "wal_level_insufficient: the primary's wal_level is below logical".into()
        }
        Some(other) => format!("invalidation_reason = '{other}'"),
    }
}

/// What a slot found by its name cannot be used for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotProblem {
    #[error(
        "is a {slot_type} slot with plugin {plugin}, but the relay needs a logical slot with \
         plugin pgoutput"
    )]
    WrongKind { slot_type: String, plugin: String },
    #[error("belongs to another database than the one in the database URL")]
    OtherDatabase,
}
