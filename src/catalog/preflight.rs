//! Checks before streaming, each a definite error with its fix.
//!
//! They exist because PostgreSQL reports some problems late or vaguely: in PG15 a missing
//! publication passes START_REPLICATION and fails only with the first decoded change (42704),
//! and a slot invalidated by `max_slot_wal_keep_size` must never be recreated silently, since
//! the messages in the gap would be lost without anyone noticing.

use std::sync::atomic::{AtomicBool, Ordering};

use pgwire_replication::Lsn;
use tokio_postgres::Client;

use crate::advice::{self, Warning};
use crate::catalog::slot::read_slot;
use crate::config::{FailoverSlot, OutboxNames, TableName};
use crate::contract::columns::ColumnMap;
use crate::error::{CatalogError, SlotError};
use crate::error::{ConfigProblem, RelayError, SlotProblem};
use crate::shard::Shard;

/// What the checks learned about the slot.
#[derive(Debug, Clone)]
pub(crate) struct SlotState {
    /// The slot's confirmed_flush_lsn: where streaming resumes.
    pub confirmed_flush: Lsn,
}

pub(crate) async fn check_wal_level(client: &Client) -> Result<(), RelayError> {
    let row = client.query_one("SHOW wal_level", &[]).await?;
    let level: String = row.get(0);
    if level != "logical" {
        return Err(RelayError::Catalog(CatalogError::WalLevel {
            actual: level,
        }));
    }
    Ok(())
}

pub(crate) async fn check_table(client: &Client, names: &OutboxNames) -> Result<(), RelayError> {
    let (schema, table) = names.table_parts();
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = $1 AND tablename = $2",
            &[&schema, &table],
        )
        .await?;
    match exists {
        Some(_) => Ok(()),
        None => Err(RelayError::Catalog(CatalogError::TableMissing {
            table: names.table.to_string(),
        })),
    }
}

pub(crate) async fn check_publication(
    client: &Client,
    names: &OutboxNames,
) -> Result<(), RelayError> {
    let (schema, table) = names.table_parts();
    let publication = client
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1",
            &[&names.publication.name],
        )
        .await?;
    if publication.is_none() {
        return Err(RelayError::Catalog(CatalogError::PublicationMissing {
            publication: names.publication.to_string(),
            table: names.table.to_string(),
        }));
    }
    let covered = client
        .query_opt(
            "SELECT 1 FROM pg_catalog.pg_publication_tables \
             WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
            &[&names.publication.name, &schema, &table],
        )
        .await?;
    if covered.is_none() {
        // Named in the error: after ALTER TABLE … RENAME the outbox table is among them.
        let covers = client
            .query(
                "SELECT schemaname || '.' || tablename FROM pg_catalog.pg_publication_tables \
                 WHERE pubname = $1 ORDER BY 1 LIMIT 5",
                &[&names.publication.name],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        return Err(RelayError::Catalog(
            CatalogError::PublicationDoesNotCoverTable {
                publication: names.publication.to_string(),
                table: names.table.to_string(),
                covers,
            },
        ));
    }
    Ok(())
}

/// The outbox table as the session found it: which table (its OID) carries the configured
/// name, and a WAL position by which that was so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxTable {
    pub oid: u32,
    /// Read before the catalog was: every transaction that committed before it was visible
    /// to the catalog query, so a rename the stream shows committing before it had been undone
    /// by then (the table had the configured name again).
    pub named_since: Lsn,
}

/// Which table the configured name names now (`TableMissing` if none), and since when at
/// the latest (see [`OutboxTable`]): the relation cache tells a rename of the outbox from its
/// history by it.
pub async fn outbox_table(client: &Client, outbox: &TableName) -> Result<OutboxTable, RelayError> {
    let position: String = client
        .query_one("SELECT pg_catalog.pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    let named_since = Lsn::parse(&position).map_err(|_| {
        RelayError::Protocol(format!(
            "PostgreSQL gave an unreadable WAL position {position:?}"
        ))
    })?;
    let (schema, table) = outbox.table_parts();
    let row = client
        .query_opt(
            "SELECT c.oid FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&schema, &table],
        )
        .await?;
    match row {
        Some(row) => Ok(OutboxTable {
            oid: row.get(0),
            named_since,
        }),
        None => Err(RelayError::Catalog(CatalogError::TableMissing {
            table: outbox.to_string(),
        })),
    }
}

/// What became of the outbox table since the session started, by the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutboxNow {
    /// A table of that name is in the publication (the same or, dropped and created again
    /// and added back, another: its Relation says so when its rows come).
    Published,
    /// No table has the name: renamed (the stream says so when rows come) or dropped.
    Gone,
    /// The table of that name is not in the publication; `recreated`: it is another table
    /// than the session started with.
    Unpublished { recreated: bool },
}

pub(crate) async fn outbox_now(
    client: &Client,
    names: &OutboxNames,
    outbox: OutboxTable,
) -> Result<OutboxNow, RelayError> {
    let (schema, table) = names.table_parts();
    let row = client
        .query_opt(
            "SELECT c.oid, EXISTS (SELECT 1 FROM pg_catalog.pg_publication_tables p \
                 WHERE p.pubname = $3 AND p.schemaname = n.nspname AND p.tablename = c.relname) \
             FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&schema, &table, &names.publication.name],
        )
        .await?;
    Ok(match row {
        None => OutboxNow::Gone,
        Some(row) if row.get::<_, bool>(1) => OutboxNow::Published,
        Some(row) => OutboxNow::Unpublished {
            recreated: row.get::<_, u32>(0) != outbox.oid,
        },
    })
}

/// A sharded relay's publication must carry the row filter `setup` gives its shard: a relay
/// started with another `--shards` than its publications would stream a slice that
/// overlaps the others' (rows twice) or leaves gaps (rows never). Unsharded, the filter is
/// the DBA's business and is not checked (a publication filtered by event type is the DBA's
/// choice).
///
/// PostgreSQL keeps a row filter as a parsed tree and prints it back reformatted, so the
/// expected expression is printed by PostgreSQL too, through the same function against the
/// same columns: as the CHECK constraint of a temporary table made `LIKE` the outbox table,
/// in a transaction that is rolled back (it needs only the TEMPORARY privilege, which every
/// role has by default, and SELECT on the table).
pub(crate) async fn check_row_filter(
    client: &Client,
    names: &OutboxNames,
    shard: Shard,
    map: &ColumnMap,
) -> Result<(), RelayError> {
    let Some(expected) = shard.row_filter(map) else {
        return Ok(());
    };
    let (schema, table) = names.table_parts();
    let actual: Option<String> = client
        .query_opt(
            "SELECT rowfilter FROM pg_catalog.pg_publication_tables \
             WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
            &[&names.publication.name, &schema, &table],
        )
        .await?
        .and_then(|row| row.get(0));
    let printed = printed_by_postgres(client, names, &expected).await?;
    if actual.as_deref() == Some(printed.as_str()) {
        return Ok(());
    }
    Err(RelayError::Catalog(CatalogError::ShardFilterMismatch {
        publication: names.publication.to_string(),
        shard: shard.index(),
        shards: shard.count(),
        found: match actual {
            Some(filter) => format!("has the row filter `{}`", one_line(&filter)),
            None => "has no row filter".into(),
        },
        expected,
    }))
}

/// `expression` on the outbox table's columns as PostgreSQL prints it (`pg_get_expr`).
async fn printed_by_postgres(
    client: &Client,
    names: &OutboxNames,
    expression: &str,
) -> Result<String, RelayError> {
    client.batch_execute("BEGIN").await?;
    let printed = async {
        client
            .batch_execute(&format!(
                "CREATE TEMPORARY TABLE pg_temp.outbox_relay_row_filter \
                 (LIKE {}, CONSTRAINT row_filter CHECK ({expression}))",
                names.qualified_table()
            ))
            .await?;
        let row = client
            .query_one(
                "SELECT pg_catalog.pg_get_expr(conbin, conrelid) FROM pg_catalog.pg_constraint \
                 WHERE conrelid = 'pg_temp.outbox_relay_row_filter'::regclass \
                 AND conname = 'row_filter'",
                &[],
            )
            .await?;
        Ok::<String, RelayError>(row.get(0))
    }
    .await;
    // Rolled back whatever happened: the connection may be used again (setup), and the
    // table must not outlive the check.
    let rolled_back = client.batch_execute("ROLLBACK").await;
    let printed = printed?;
    rolled_back?;
    Ok(printed)
}

/// PostgreSQL prints a row filter over several lines; an error message is one.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The slot must exist in this database, use pgoutput, not be lost, and not be held by
/// another process (then this relay is a standby).
pub(crate) async fn check_slot(client: &Client, slot: &str) -> Result<SlotState, RelayError> {
    let Some(report) = read_slot(client, slot).await? else {
        return Err(RelayError::Slot(SlotError::Missing {
            slot: slot.to_string(),
        }));
    };
    let unusable = |problem: SlotProblem| {
        RelayError::Slot(SlotError::Unusable {
            slot: slot.to_string(),
            problem,
        })
    };
    if report.slot_type != "logical" || report.plugin.as_deref() != Some("pgoutput") {
        return Err(unusable(SlotProblem::WrongKind {
            slot_type: report.slot_type.clone(),
            plugin: report.plugin.clone().unwrap_or_else(|| "none".into()),
        }));
    }
    if report.in_this_database != Some(true) {
        return Err(unusable(SlotProblem::OtherDatabase));
    }
    if report.is_lost() {
        return Err(RelayError::Slot(SlotError::Lost {
            slot: slot.to_string(),
            confirmed_flush: report
                .confirmed_flush_lsn
                .clone()
                .unwrap_or_else(|| "its last position".into()),
            reason: report.lost_reason().map(str::to_string),
        }));
    }
    if let Some(pid) = report.active_pid {
        return Err(RelayError::Slot(SlotError::InUse {
            slot: slot.to_string(),
            pid: pid.to_string(),
        }));
    }
    Ok(SlotState {
        confirmed_flush: report.confirmed_flush().unwrap_or(Lsn::ZERO),
    })
}

/// PostgreSQL 18's `idle_replication_slot_timeout`, when it is set: the setting with its
/// unit (read from pg_settings: the unit changed during 18's development). `None` on older
/// servers and while it is 0 (off, the default).
pub(crate) async fn idle_slot_timeout(client: &Client) -> Result<Option<String>, RelayError> {
    let row = client
        .query_opt(
            "SELECT setting, coalesce(unit, '') FROM pg_catalog.pg_settings \
             WHERE name = 'idle_replication_slot_timeout'",
            &[],
        )
        .await?;
    Ok(row
        .map(|row| (row.get::<_, String>(0), row.get::<_, String>(1)))
        .filter(|(setting, _)| setting != "0")
        .map(|(setting, unit)| format!("{setting}{unit}")))
}

/// Warns, once per process, that the server invalidates idle slots: a relay stopped for
/// longer than the timeout finds its slot lost.
async fn warn_if_idle_slots_expire(client: &Client, slot: &str) -> Result<(), RelayError> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let Some(timeout) = idle_slot_timeout(client).await? else {
        return Ok(());
    };
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            %slot,
            idle_replication_slot_timeout = %timeout,
            "{}",
            advice::warning(
                "PostgreSQL invalidates a slot no process has streamed from for longer than \
                 idle_replication_slot_timeout: if every relay of this slot is stopped that \
                 long (a standby relay waiting does not count), the slot is lost (idle_timeout)",
                Warning::IdleSlotsExpire
            )
        );
    }
    Ok(())
}

/// What a `wal_sender_timeout` of 0 costs (`run` warns of it at start, `check` too).
pub(crate) const WAL_SENDER_TIMEOUT_OFF: &str =
    "wal_sender_timeout is 0 (off): if the relay's host \
     vanishes, PostgreSQL keeps its walsender, and the slot, until TCP gives up (about 15 \
     minutes with data in flight), and a standby relay cannot take over until then";

/// Warns, once per process, that `wal_sender_timeout` is 0 (for the server, or the role or
/// database the relay connects as, which its walsender takes too): then nothing ends the
/// walsender of a relay whose host vanished but TCP giving up, about 15 minutes with data in
/// flight (PostgreSQL's end of the replication session has keepalives and no user timeout:
/// outbox_common::liveness), and the slot is held, a standby relay waiting, all that time.
async fn warn_if_walsenders_never_time_out(client: &Client) -> Result<(), RelayError> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let setting: String = client
        .query_one(
            "SELECT setting FROM pg_catalog.pg_settings WHERE name = 'wal_sender_timeout'",
            &[],
        )
        .await?
        .get(0);
    if setting == "0" && !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "{}",
            advice::warning(WAL_SENDER_TIMEOUT_OFF, Warning::WalSenderTimeoutOff)
        );
    }
    Ok(())
}

/// PostgreSQL 17's `synchronized_standby_slots` on this server: `Some("")` when the
/// server has it unset, `None` before 17.
pub(crate) async fn synchronized_standby_slots(
    client: &Client,
) -> Result<Option<String>, RelayError> {
    let row = client
        .query_opt(
            "SELECT setting FROM pg_catalog.pg_settings WHERE name = 'synchronized_standby_slots'",
            &[],
        )
        .await?;
    Ok(row.map(|row| row.get(0)))
}

/// Warns, once per process, about what a failover would cost (PostgreSQL 17+): a slot
/// that is not a failover slot is not on any standby; a failover slot without
/// `synchronized_standby_slots` on the primary can have the relay publish transactions a
/// failover to an asynchronous standby then loses (phantom events).
async fn warn_about_failover(
    client: &Client,
    slot: &str,
    failover: FailoverSlot,
) -> Result<(), RelayError> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if WARNED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let Some(report) = read_slot(client, slot).await? else {
        return Ok(());
    };
    match (report.failover, failover) {
        (None, _) | (_, FailoverSlot::Off) => {}
        (Some(false), _) => {
            tracing::warn!(
                %slot,
                "{}",
                advice::warning(
                    "the slot is not a failover slot: a standby promoted after a failover will \
                     not have it",
                    Warning::NotFailoverSlot
                )
            );
        }
        (Some(true), _) => {
            if synchronized_standby_slots(client)
                .await?
                .is_some_and(|s| s.trim().is_empty())
            {
                tracing::warn!(
                    %slot,
                    "{}",
                    advice::warning(
                        "synchronized_standby_slots is not set on the primary: the relay can \
                         publish transactions that a failover to a standby which had not \
                         received them yet then loses (phantom events)",
                        Warning::StandbySlotsUnset
                    )
                );
            }
        }
    }
    WARNED.store(true, Ordering::Relaxed);
    Ok(())
}

/// All checks `run` makes before it starts streaming; `names` are `shard`'s.
pub(crate) async fn check_all(
    client: &Client,
    names: &OutboxNames,
    shard: Shard,
    map: &ColumnMap,
    failover: FailoverSlot,
) -> Result<SlotState, RelayError> {
    check_wal_level(client).await?;
    warn_if_idle_slots_expire(client, &names.slot).await?;
    warn_if_walsenders_never_time_out(client).await?;
    check_publication(client, names).await?;
    check_row_filter(client, names, shard, map).await?;
    let slot = check_slot(client, &names.slot).await?;
    warn_about_failover(client, &names.slot, failover).await?;
    Ok(slot)
}

/// The emit functions, where they exist, must write the relay's `--emit-prefix`: events with
/// another prefix are skipped (and their position acknowledged with the next commit), and the
/// WAL is their only copy, so a mismatch loses them. Missing functions are fine (the
/// application may not emit, or a DBA has not created them yet).
pub(crate) async fn check_emit_prefix(
    client: &Client,
    names: &OutboxNames,
    prefix: &str,
) -> Result<(), RelayError> {
    let (schema, table) = names.table_parts();
    let functions: Vec<String> = crate::contract::emit::FUNCTION_SUFFIXES
        .iter()
        .map(|(suffix, _)| format!("{table}{suffix}"))
        .collect();
    let literal = outbox_common::quote::quote_literal(prefix);
    let other: Option<String> = client
        .query_opt(
            "SELECT p.proname::text FROM pg_catalog.pg_proc p \
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = $1 AND p.proname = ANY($2) AND strpos(p.prosrc, $3) = 0 \
             LIMIT 1",
            &[&schema, &functions, &literal],
        )
        .await?
        .map(|row| row.get(0));
    match other {
        None => Ok(()),
        Some(function) => Err(ConfigProblem::EmitPrefixMismatch { function, literal }.into()),
    }
}
