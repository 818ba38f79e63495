//! `outbox-relay setup`: idempotent provisioning.
//!
//! The SQL is generated here from the configured names and nowhere else; `sql/outbox.sql` is its
//! rendering for the default names (a test keeps them equal), and `setup --print-sql` renders
//! it for other names, so a DBA can review and run exactly what the relay would.
//!
//! Order matters: the publication is created BEFORE the slot. A slot only decodes changes with
//! the publications that exist when those changes are decoded, so rows inserted between a slot
//! and a later publication would be skipped (and PG15 errors on a missing publication only
//! when the first change is decoded).
//!
//! It only creates what is missing: it must never drop or alter an existing object (a second
//! run changes nothing), since the table holds the application's data and the slot the
//! position of every undelivered message; a slot is never recreated.

use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::Client;

use crate::advice::report;
use crate::catalog::preflight;
use crate::catalog::slot::{failover_wanted, read_slot};
use crate::config::{FailoverSlot, Mode, OutboxNames, SetupArgs};
use crate::contract::columns::{self, ColumnMap};
use crate::db;
use crate::error::{CatalogError, SlotError};
use crate::error::{ConfigProblem, RelayError, SupervisorAction};
use crate::publish::Broker;
use crate::shard::Shard;
use crate::table::outbox::TextRelation;
use outbox_common::backoff::Backoff;
use outbox_common::quote::{quote_ident, quote_literal};

/// One provisioning step: what it makes, and idempotent SQL that makes it.
///
/// The script's comment lines say only `about`, never a configured name: a name is data, and
/// data in a `--` comment is one newline away from being a statement (names are validated
/// when the flags are parsed, src/config.rs; this is the second line of defence).
pub struct Step {
    /// The object, with its configured name (for what `setup` prints as it goes).
    pub object: String,
    /// What it is, in words that hold no configured name (for the script's comment line).
    pub about: &'static str,
    pub sql: String,
}

/// The dollar-quote tag of the DO block: configured names cannot contain a `$`
/// (src/config.rs), so no name can close the block early.
const DO_TAG: &str = "$outbox_relay$";

/// The outbox table and its `created_at` index (docs/consumers.md, "The message contract").
pub fn table_step(names: &OutboxNames) -> Step {
    let (_, table) = names.table_parts();
    let qualified = names.qualified_table();
    let index = quote_ident(&format!("{table}_created_at_idx"));
    Step {
        object: format!("table {}", names.table),
        about: "the outbox table and its created_at index",
        sql: format!(
            "CREATE TABLE IF NOT EXISTS {qualified} (\n\
             \x20   id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),\n\
             \x20   event_type     text        NOT NULL,\n\
             \x20   payload        jsonb,\n\
             \x20   headers        jsonb,\n\
             \x20   created_at     timestamptz NOT NULL DEFAULT now(),\n\
             \x20   exchange       text,\n\
             \x20   routing_key    text,\n\
             \x20   aggregate_type text,\n\
             \x20   aggregate_id   text,\n\
             \x20   published_at   timestamptz\n\
             );\n\
             CREATE INDEX IF NOT EXISTS {index} ON {qualified} (created_at);"
        ),
    }
}

/// The insert-only publication on the outbox table. CREATE PUBLICATION has no IF NOT EXISTS,
/// hence the DO block; the name reaches RAISE as a parameter, not in its format string (where
/// a `%` would be a placeholder).
pub fn publication_step(names: &OutboxNames) -> Step {
    shard_publication_step(names, Shard::UNSHARDED, &ColumnMap::default())
}

/// [`publication_step`] for one shard: `names` are the shard's, and the publication takes
/// only the shard's rows (its row filter, src/shard.rs, on the columns `map` names).
pub(crate) fn shard_publication_step(names: &OutboxNames, shard: Shard, map: &ColumnMap) -> Step {
    let publication = quote_ident(&names.publication);
    let qualified = names.qualified_table();
    let (about, filter) = match shard.row_filter(map) {
        Some(filter) => (
            "a shard's publication (insert only, its rows of the outbox table)",
            format!(" WHERE ({filter})"),
        ),
        None => (
            "the publication (insert only, on the outbox table)",
            String::new(),
        ),
    };
    Step {
        object: format!("publication {}", names.publication),
        about,
        sql: format!(
            "DO {DO_TAG} BEGIN\n\
             \x20   CREATE PUBLICATION {publication} FOR TABLE {qualified}{filter} WITH (publish = 'insert');\n\
             EXCEPTION WHEN duplicate_object THEN\n\
             \x20   RAISE NOTICE 'publication % already exists', {};\n\
             END {DO_TAG};",
            quote_literal(&names.publication)
        ),
    }
}

/// The relay's state table (`wal/state.rs`): where `--on-slot-lost recreate` finds, on a
/// promoted standby too, the last acknowledged commit to backfill from.
pub(crate) fn state_step(names: &OutboxNames) -> Step {
    Step {
        object: format!("state table {}", crate::wal::state::STATE_TABLE),
        about: "the relay's state: the last acknowledged commit (--on-slot-lost recreate \
                backfills from it)",
        sql: crate::wal::state::state_table_sql(names),
    }
}

/// The logical slot, created only if missing (never recreated: see `SlotLost`), as a
/// failover slot where `failover` asks for one and the server (17+) has them. One script
/// for every version: psql's `\if` picks the statement by the server's version (the other
/// branch is never sent, so older servers never parse the `failover` argument).
///
/// Top-level statements, never PL/pgSQL: on PostgreSQL 15 a slot created from a DO block
/// failed now and then with "snapshot reference … is not owned by resource owner
/// TopTransaction" while other sessions committed (seen in CI); the plain SELECT never did.
pub(crate) fn slot_step(names: &OutboxNames, failover: FailoverSlot) -> Step {
    let sql = match failover {
        FailoverSlot::Off => create_slot_sql(names, false),
        FailoverSlot::Auto | FailoverSlot::On => {
            let before_17 = match failover {
                FailoverSlot::On => format!(
                    "DO {DO_TAG} BEGIN\n\
                     \x20   RAISE EXCEPTION 'a failover slot (--failover-slot on) needs PostgreSQL 17 or later'\n\
                     \x20       USING ERRCODE = 'feature_not_supported';\n\
                     END {DO_TAG};"
                ),
                _ => create_slot_sql(names, false),
            };
            format!(
                "SELECT pg_catalog.current_setting('server_version_num')::int >= 170000 \
                 AS outbox_relay_failover_slots \\gset\n\
                 \\if :outbox_relay_failover_slots\n\
                 {}\n\
                 \\else\n\
                 {before_17}\n\
                 \\endif",
                create_slot_sql(names, true)
            )
        }
    };
    Step {
        object: format!("slot {}", names.slot),
        about: "the logical replication slot (pgoutput), created only if missing; a failover \
                slot on PostgreSQL 17+ unless --failover-slot off (psql's \\if picks the \
                statement)",
        sql,
    }
}

/// One statement that creates the slot unless it exists; `failover` (17+ only: older
/// servers reject the argument) makes it a failover slot. Named, as the 4th positional
/// argument is two-phase.
pub(crate) fn create_slot_sql(names: &OutboxNames, failover: bool) -> String {
    let slot = quote_literal(&names.slot);
    format!(
        "SELECT pg_catalog.pg_create_logical_replication_slot({slot}, 'pgoutput'{})\n\
         WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = {slot});",
        if failover { ", failover => true" } else { "" }
    )
}

/// The emit functions of the table-less outbox (src/contract/emit.rs, docs/emit.md), in the table's
/// schema and named after the table: `<table>_emit` (jsonb payload), `<table>_emit_text`
/// and `<table>_emit_bytea`, so no call resolves to the wrong overload. Each checks its
/// arguments in the writer's transaction (a bad event fails there, not in the relay), writes
/// one transactional logical message with the versioned envelope and returns the event's id.
/// `CREATE OR REPLACE`: they are code, not data, and a second run with the same flags changes
/// nothing. WAL mode only: polling reads the table and never sees them.
// Longer than the others: one function's SQL text, kept whole so it reads as the SQL it is.
pub(crate) fn emit_step(names: &OutboxNames, prefix: &str) -> Step {
    use crate::contract::emit::{fields, FUNCTION_SUFFIXES, VERSION};
    let (schema, table) = names.table_parts();
    let prefix = quote_literal(prefix);
    let mut sql = String::new();
    for (suffix, kind) in FUNCTION_SUFFIXES {
        let function = format!(
            "{}.{}",
            quote_ident(schema),
            quote_ident(&format!("{table}{suffix}"))
        );
        let payload_type = kind.sql_type();
        let payload = match kind {
            crate::contract::emit::PayloadType::Bytea => {
                "pg_catalog.translate(pg_catalog.encode(payload, 'base64'), E'\\n', '')"
            }
            _ => "payload",
        };
        if !sql.is_empty() {
            sql.push('\n');
        }
        let _ = write!(
            sql,
            "CREATE OR REPLACE FUNCTION {function}(\n\
             \x20   event_type     text,\n\
             \x20   payload        {payload_type},\n\
             \x20   headers        jsonb DEFAULT NULL,\n\
             \x20   aggregate_type text  DEFAULT NULL,\n\
             \x20   aggregate_id   text  DEFAULT NULL,\n\
             \x20   exchange       text  DEFAULT NULL,\n\
             \x20   routing_key    text  DEFAULT NULL\n\
             ) RETURNS uuid\n\
             LANGUAGE plpgsql VOLATILE\n\
             AS {DO_TAG}\n\
             DECLARE\n\
             \x20   event_id uuid := pg_catalog.gen_random_uuid();\n\
             \x20   envelope jsonb;\n\
             BEGIN\n\
             \x20   IF event_type IS NULL OR pg_catalog.octet_length(event_type) > 255\n\
             \x20      OR pg_catalog.octet_length(exchange) > 255\n\
             \x20      OR pg_catalog.octet_length(routing_key) > 255 THEN\n\
             \x20       RAISE EXCEPTION 'event_type is required; event_type, exchange and routing_key hold at most 255 bytes'\n\
             \x20           USING ERRCODE = 'invalid_parameter_value';\n\
             \x20   END IF;\n\
             \x20   IF pg_catalog.jsonb_typeof(headers) <> 'object' THEN\n\
             \x20       RAISE EXCEPTION 'headers must be a JSON object' USING ERRCODE = 'invalid_parameter_value';\n\
             \x20   END IF;\n\
             \x20   envelope := pg_catalog.jsonb_build_object(\n\
             \x20       '{v}', {VERSION},\n\
             \x20       '{id}', event_id,\n\
             \x20       '{event_type}', event_type,\n\
             \x20       '{created_at}', pg_catalog.to_char(pg_catalog.now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),\n\
             \x20       '{payload_type_field}', '{payload_type}',\n\
             \x20       '{shard_hash}', (CASE WHEN aggregate_id IS NOT NULL THEN pg_catalog.hashtext(aggregate_id)\n\
             \x20                        ELSE pg_catalog.uuid_hash(event_id) END) & 2147483647\n\
             \x20   ) || pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(\n\
             \x20       '{aggregate_type}', aggregate_type,\n\
             \x20       '{aggregate_id}', aggregate_id,\n\
             \x20       '{exchange}', exchange,\n\
             \x20       '{routing_key}', routing_key\n\
             \x20   ));\n\
             \x20   IF headers IS NOT NULL THEN\n\
             \x20       envelope := envelope || pg_catalog.jsonb_build_object('{headers}', headers);\n\
             \x20   END IF;\n\
             \x20   IF payload IS NOT NULL THEN\n\
             \x20       envelope := envelope || pg_catalog.jsonb_build_object('{payload_field}', {payload});\n\
             \x20   END IF;\n\
             \x20   PERFORM pg_catalog.pg_logical_emit_message(true, {prefix},\n\
             \x20       pg_catalog.convert_to(envelope::text, 'UTF8'));\n\
             \x20   RETURN event_id;\n\
             END\n\
             {DO_TAG};",
            v = fields::VERSION,
            id = fields::ID,
            event_type = fields::EVENT_TYPE,
            created_at = fields::CREATED_AT,
            payload_type_field = fields::PAYLOAD_TYPE,
            shard_hash = fields::SHARD_HASH,
            aggregate_type = fields::AGGREGATE_TYPE,
            aggregate_id = fields::AGGREGATE_ID,
            exchange = fields::EXCHANGE,
            routing_key = fields::ROUTING_KEY,
            headers = fields::HEADERS,
            payload_field = fields::PAYLOAD,
        );
    }
    Step {
        object: format!("emit functions {table}_emit, {table}_emit_text, {table}_emit_bytea"),
        about: "the emit functions: events written straight to the WAL (WAL mode only)",
        sql,
    }
}

/// `setup --restrict-emit`: who may write events.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Restrict<'a> {
    /// The application's role: the only one granted the emit functions.
    pub emit_role: &'a str,
    /// The role `run` connects as (its heartbeats); `None`: the role running the SQL.
    pub relay_role: Option<&'a str>,
}

/// The superuser check `--restrict-emit` starts with: a REVOKE by a role that does not own
/// `pg_logical_emit_message` only warns, and would leave it callable by everyone.
pub(crate) fn superuser_check_step() -> Step {
    Step {
        object: "superuser check".into(),
        about: "restricting who may emit needs a superuser",
        sql: format!(
            "DO {DO_TAG} BEGIN\n\
             \x20   IF NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN\n\
             \x20       RAISE EXCEPTION '{SUPERUSER_NEEDED}' USING ERRCODE = 'insufficient_privilege';\n\
             \x20   END IF;\n\
             END {DO_TAG};"
        ),
    }
}

const SUPERUSER_NEEDED: &str = "restricting who may emit needs a superuser: a REVOKE by a role \
                                that does not own pg_logical_emit_message only warns";

/// `--restrict-emit` (docs/emit.md, "Who may emit"): PUBLIC may call
/// `pg_logical_emit_message`, so any role could forge an event with our prefix. Revoke every
/// overload from PUBLIC; keep the text one for the relay's heartbeats; make the emit
/// functions SECURITY DEFINER (they run as their owner, with a search_path no caller can
/// change) and callable by the application's role only. The overloads are found in the
/// catalog: PostgreSQL 17 added a fourth argument (`flush`) to both, and the script is
/// printed for DBAs without knowing the server.
pub(crate) fn restrict_emit_step(names: &OutboxNames, restrict: Restrict<'_>) -> Step {
    let (schema, table) = names.table_parts();
    let relay = restrict
        .relay_role
        .map_or_else(|| "current_user".to_string(), quote_literal);
    let emit_role = quote_ident(restrict.emit_role);
    let mut sql = format!(
        "DO {DO_TAG} DECLARE overload regprocedure; BEGIN\n\
         \x20   FOR overload IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p\n\
         \x20       WHERE p.pronamespace = 'pg_catalog'::regnamespace\n\
         \x20       AND p.proname = 'pg_logical_emit_message' LOOP\n\
         \x20       EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', overload);\n\
         \x20       -- The text overload stays callable for the relay's heartbeats.\n\
         \x20       IF (SELECT p.proargtypes[2] FROM pg_catalog.pg_proc p WHERE p.oid = overload)\n\
         \x20           = 'text'::regtype THEN\n\
         \x20           EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %I', overload, {relay});\n\
         \x20       END IF;\n\
         \x20   END LOOP;\n\
         END {DO_TAG};"
    );
    for (suffix, kind) in crate::contract::emit::FUNCTION_SUFFIXES {
        let function = format!(
            "{}.{}(text, {}, jsonb, text, text, text, text)",
            quote_ident(schema),
            quote_ident(&format!("{table}{suffix}")),
            kind.sql_type()
        );
        let _ = write!(
            sql,
            "\nALTER FUNCTION {function} SECURITY DEFINER SET search_path = pg_catalog, pg_temp;\n\
             REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC;\n\
             GRANT EXECUTE ON FUNCTION {function} TO {emit_role};"
        );
    }
    Step {
        object: format!("emit restricted to role {}", restrict.emit_role),
        about: "who may emit: the application's role only (--restrict-emit)",
        sql,
    }
}

/// Polling mode's claim index: only unpublished rows, in claim order, so the claim query
/// stays an index scan however many published rows the table keeps (docs/polling.md).
pub(crate) fn poll_index_step(names: &OutboxNames, map: &ColumnMap) -> Option<Step> {
    let published = map.sql(columns::PUBLISHED_AT)?;
    // Claims go in created_at order, or in id order where it is unmapped.
    let order = map
        .sql(columns::CREATED_AT)
        .or_else(|| map.sql(columns::ID))?;
    let (_, table) = names.table_parts();
    let index = quote_ident(&format!("{table}_unpublished_idx"));
    Some(Step {
        object: format!("index {table}_unpublished_idx"),
        about: "the claim index: unpublished rows in created_at order",
        sql: format!(
            "CREATE INDEX IF NOT EXISTS {index} ON {} ({order}) WHERE {published} IS NULL;",
            names.qualified_table()
        ),
    })
}

/// Polling mode's provisioning SQL (`setup --mode poll --print-sql`, `sql/outbox_poll.sql`).
pub fn poll_script(names: &OutboxNames) -> String {
    let mut text = String::from(
        "-- outbox-relay provisioning for polling mode (generated by `outbox-relay setup --mode \
         poll --print-sql`).\n\
         -- No slot and no publication: `outbox-relay poll` claims rows by published_at.\n",
    );
    let index = poll_index_step(names, &ColumnMap::default());
    for step in std::iter::once(table_step(names)).chain(index) {
        let _ = write!(text, "\n-- {}\n{}\n", step.about, step.sql);
    }
    text
}

#[cfg(test)]
/// The provisioning SQL as a script, in order (unsharded).
pub(crate) fn script(
    names: &OutboxNames,
    emit_prefix: &str,
    restrict: Option<Restrict<'_>>,
) -> String {
    shards_script(
        names,
        &[(Shard::UNSHARDED, names.clone())],
        emit_prefix,
        restrict,
        FailoverSlot::Auto,
    )
}

/// The provisioning SQL for `shards` (from [`Shard::every`]): the table, every shard's
/// publication, then every shard's slot (all publications before any slot), then the emit
/// functions. The emit functions come after the slots: an event emitted while no slot exists
/// is in no slot, and nothing can bring it back. With `restrict`, the superuser check comes
/// first, so a script run by another role stops before it has changed anything.
pub(crate) fn shards_script(
    names: &OutboxNames,
    shards: &[(Shard, OutboxNames)],
    emit_prefix: &str,
    restrict: Option<Restrict<'_>>,
    failover: FailoverSlot,
) -> String {
    let mut text = String::from(
        "-- outbox-relay provisioning (generated by `outbox-relay setup --print-sql`).\n\
         -- Requires wal_level = logical. Run each statement in autocommit mode (psql does):\n\
         -- a replication slot cannot be created in a transaction that has written.\n\
         -- The publication must exist before the slot.\n",
    );
    if let Some((shard, _)) = shards.iter().find(|(shard, _)| shard.is_sharded()) {
        let _ = write!(
            text,
            "-- {} shards: one publication per shard, each with a row filter that takes the\n\
             -- shard's rows, then one slot per shard (docs/scaling.md, \"Scaling out\").\n",
            shard.count()
        );
    }
    let mut steps = Vec::new();
    steps.extend(restrict.map(|_| superuser_check_step()));
    steps.push(table_step(names));
    steps.push(state_step(names));
    // --print-sql has no form for a mapped table: the script is the default table's.
    let map = ColumnMap::default();
    steps.extend(
        shards
            .iter()
            .map(|(s, n)| shard_publication_step(n, *s, &map)),
    );
    steps.extend(shards.iter().map(|(_, n)| slot_step(n, failover)));
    steps.push(emit_step(names, emit_prefix));
    steps.extend(restrict.map(|restrict| restrict_emit_step(names, restrict)));
    for step in steps {
        let _ = write!(text, "\n-- {}\n{}\n", step.about, step.sql);
    }
    text
}

pub(crate) async fn run(args: SetupArgs) -> Result<(), RelayError> {
    let names = &args.names;
    // A bad dead-letter configuration is reported before anything is provisioned.
    args.dead_letter.exchange(&names.exchange)?;
    if args.mode.mode == Mode::Poll {
        return run_poll(args).await;
    }
    let columns = crate::assembly::column_map(&args.columns, &names.table, &[])?;
    refuse_creating_mapped(&columns, &args)?;
    let shards = Shard::every(names, args.shards.shards)?;
    let emit_prefix = crate::assembly::emit_prefix(&args.emit, &names.table);
    check_emit_names(names)?;
    let restrict = args.restrict_emit.emit_role().map(|emit_role| Restrict {
        emit_role,
        relay_role: args.restrict_emit.relay_role.as_deref(),
    });
    if args.print_sql {
        let failover = args.failover.failover_slot;
        out!(
            "{}",
            shards_script(names, &shards, &emit_prefix, restrict, failover)
        );
        return Ok(());
    }
    let client = connect_database(&args).await?;
    preflight::check_wal_level(&client).await?;
    outln!("wal_level: logical");
    if restrict.is_some() {
        // Before anything is provisioned: a role that cannot restrict changes nothing.
        client
            .batch_execute(&superuser_check_step().sql)
            .await
            .map_err(|e| match e.code() {
                Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) => {
                    RelayError::from(ConfigProblem::RestrictNeedsSuperuser {
                        needed: SUPERUSER_NEEDED,
                    })
                }
                _ => RelayError::Database(e),
            })?;
    }

    ensure_table(&client, &args).await?;
    if args.no_create_table {
        check_columns(&client, &args.names.table, &columns, args.shards.shards).await?;
    }

    // Every publication before any slot: a slot decodes with the publications that exist.
    for (shard, names) in &shards {
        ensure_publication(&client, names, *shard, &columns).await?;
    }
    for (_, names) in &shards {
        ensure_slot(&client, &args, names).await?;
    }

    ensure_emit_functions(&client, &args, &emit_prefix, restrict).await?;

    declare_exchanges(&args).await?;
    outln!("setup complete");
    Ok(())
}

/// Creates the publication of `shard` (whose names `names` are) unless it exists; an
/// existing sharded one must have the shard's row filter (it is never altered).
async fn ensure_publication(
    client: &Client,
    names: &OutboxNames,
    shard: Shard,
    map: &ColumnMap,
) -> Result<(), RelayError> {
    match preflight::check_publication(client, names).await {
        Ok(()) => {
            preflight::check_row_filter(client, names, shard, map).await?;
            outln!(
                "publication {}: exists and covers the table",
                names.publication
            );
        }
        Err(RelayError::Catalog(CatalogError::PublicationMissing { .. })) => {
            client
                .batch_execute(&shard_publication_step(names, shard, map).sql)
                .await?;
            preflight::check_publication(client, names).await?;
            if shard.is_sharded() {
                outln!(
                    "publication {}: created (publish = 'insert', rows of shard {shard})",
                    names.publication
                );
            } else {
                outln!(
                    "publication {}: created (publish = 'insert')",
                    names.publication
                );
            }
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// Creates the slot of `names` unless it exists (never recreated: see `SlotLost`), and
/// turns failover on for one without it where `--failover-slot` asks (17+).
async fn ensure_slot(
    client: &Client,
    args: &SetupArgs,
    names: &OutboxNames,
) -> Result<(), RelayError> {
    let failover = args.failover.failover_slot;
    let created = match preflight::check_slot(client, &names.slot).await {
        Ok(_) | Err(RelayError::Slot(SlotError::InUse { .. })) => false,
        Err(RelayError::Slot(SlotError::Missing { .. })) => {
            let version = db::server_version_num(client).await?;
            let sql = create_slot_sql(names, failover_wanted(failover, version)?);
            client.batch_execute(&sql).await?;
            true
        }
        Err(e) => return Err(e),
    };
    let report = read_slot(client, &names.slot).await?.ok_or_else(|| {
        RelayError::Slot(SlotError::Missing {
            slot: names.slot.to_string(),
        })
    })?;
    let done = if created { "created" } else { "exists" };
    match (report.failover, failover) {
        (None, FailoverSlot::On) => return Err(ConfigProblem::FailoverNeeds17.into()),
        (Some(false), FailoverSlot::Auto | FailoverSlot::On) => {
            turn_on_failover(args, names, report.active_pid).await?;
            outln!("slot {}: {done} (pgoutput); failover turned on", names.slot);
        }
        (Some(true), _) => outln!("slot {}: {done} (pgoutput) as a failover slot", names.slot),
        _ => outln!("slot {}: {done} (pgoutput)", names.slot),
    }
    Ok(())
}

/// `ALTER_REPLICATION_SLOT … (FAILOVER true)`: a replication command, on a replication
/// session of its own. It waits while a process streams from the slot, so a held slot is
/// refused here instead of hanging setup.
async fn turn_on_failover(
    args: &SetupArgs,
    names: &OutboxNames,
    active_pid: Option<i32>,
) -> Result<(), RelayError> {
    if let Some(pid) = active_pid {
        return Err(ConfigProblem::FailoverSlotHeld {
            slot: names.slot.to_string(),
            pid,
        }
        .into());
    }
    let url = args.connections.database_url()?;
    let server = db::primary(&url).await?;
    let config = db::replication_config(&url, &server, &names.slot, &names.publication)?;
    let mut session = pgwire_replication::ReplicationClient::connect_gated(config)
        .await
        .map_err(RelayError::replication)?;
    let command = format!("ALTER_REPLICATION_SLOT {} (FAILOVER true)", names.slot);
    let altered = tokio::time::timeout(
        outbox_common::pg::CONNECT_TIMEOUT,
        session.simple_query(&command),
    )
    .await;
    session.abort();
    match altered {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(RelayError::replication(e)),
        Err(_) => Err(RelayError::ConnectTimeout {
            endpoint: crate::error::Endpoint::Replication,
            seconds: outbox_common::pg::CONNECT_TIMEOUT.as_secs(),
        }),
    }
}

/// Creates (or replaces) the emit functions, restricted with `--restrict-emit`; with
/// `--no-create-table` only says whether a DBA created them.
async fn ensure_emit_functions(
    client: &Client,
    args: &SetupArgs,
    prefix: &str,
    restrict: Option<Restrict<'_>>,
) -> Result<(), RelayError> {
    let names = &args.names;
    let step = emit_step(names, prefix);
    let (schema, table) = names.table_parts();
    let functions: Vec<String> = crate::contract::emit::FUNCTION_SUFFIXES
        .iter()
        .map(|(suffix, _)| format!("{table}{suffix}"))
        .collect();
    // How many of the functions exist, and whether any is SECURITY DEFINER (restricted).
    let row = client
        .query_one(
            "SELECT count(*), coalesce(bool_or(p.prosecdef), false) \
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = $1 AND p.proname = ANY($2)",
            &[&schema, &functions],
        )
        .await?;
    let (count, restricted): (i64, bool) = (row.get(0), row.get(1));
    if args.no_create_table && restrict.is_none() {
        let state = if count >= 3 {
            "exist (not managed by setup)"
        } else {
            "not found (not managed by setup: a DBA creates them with the SQL of `setup \
             --print-sql`; only outbox_emit needs them)"
        };
        outln!("{}: {state}", step.object);
        return Ok(());
    }
    if restricted && restrict.is_none() {
        return Err(ConfigProblem::EmitFunctionsRestricted {
            functions: step.object,
        }
        .into());
    }
    client.batch_execute(&step.sql).await?;
    outln!("{}: ensured (prefix {prefix})", step.object);
    if let Some(restrict) = restrict {
        let step = restrict_emit_step(names, restrict);
        client.batch_execute(&step.sql).await?;
        outln!(
            "{}: pg_logical_emit_message revoked from PUBLIC (kept for {}); the emit functions \
             are SECURITY DEFINER",
            step.object,
            restrict.relay_role.unwrap_or("the role setup connected as")
        );
    }
    Ok(())
}

/// The emit functions are named after the table: its name must leave room for their
/// suffixes within PostgreSQL's 63 bytes, or PostgreSQL would cut them short.
fn check_emit_names(names: &OutboxNames) -> Result<(), RelayError> {
    let (_, table) = names.table_parts();
    let room = 63 - crate::contract::emit::LONGEST_SUFFIX;
    if table.len() > room {
        return Err(ConfigProblem::TableNameTooLongForEmit {
            table: table.to_string(),
            room,
        }
        .into());
    }
    Ok(())
}

/// setup creates the table under the contract's own names: a map describes a table the user
/// already has, so it goes with `--no-create-table` only (and `--print-sql` has no form
/// for it yet).
fn refuse_creating_mapped(columns: &ColumnMap, args: &SetupArgs) -> Result<(), RelayError> {
    if columns.is_default() || (!args.print_sql && args.no_create_table) {
        return Ok(());
    }
    Err(ConfigProblem::MappedTableCreation {
        changed: columns.changed(),
        print_sql: args.print_sql,
    }
    .into())
}

/// `setup --mode poll`: the table, the claim index and the exchange; no slot, any wal_level.
/// With a column map (and `--no-create-table`) it checks the table has what polling reads
/// under the mapped names, and makes the claim index on them.
async fn run_poll(args: SetupArgs) -> Result<(), RelayError> {
    let names = &args.names;
    if args.shards.shards > 1 {
        return Err(ConfigProblem::SetupShardsInPollMode {
            shards: args.shards.shards,
        }
        .into());
    }
    let columns = crate::assembly::column_map(&args.columns, &names.table, &[])?;
    refuse_creating_mapped(&columns, &args)?;
    if args.print_sql {
        out!("{}", poll_script(names));
        return Ok(());
    }
    let client = connect_database(&args).await?;
    ensure_table(&client, &args).await?;
    if args.no_create_table {
        check_columns(&client, &names.table, &columns, 1).await?;
        check_poll_columns(&client, &names.table, &columns).await?;
    }
    match poll_index_step(names, &columns) {
        Some(index) => {
            client.batch_execute(&index.sql).await?;
            outln!(
                "{}: ensured (WHERE {} IS NULL)",
                index.object,
                columns.column(columns::PUBLISHED_AT).unwrap_or_default()
            );
        }
        None => outln!(
            "claim index: none (published_at is unmapped: rows are deleted once published, \
             so every row in the table is unsent)"
        ),
    }

    declare_exchanges(&args).await?;
    outln!("setup complete");
    Ok(())
}

/// Declares the exchange and, under the dead-letter policy, the dead-letter exchange: both
/// durable topic exchanges (dead letters keep their routing key; bind `#` to get them all).
async fn declare_exchanges(args: &SetupArgs) -> Result<(), RelayError> {
    let names = &args.names;
    let dead_letter = args.dead_letter.exchange(&names.exchange)?;
    let nodes = crate::assembly::broker_nodes(&args.connections)?;
    let broker = within_connect_timeout(args, "RabbitMQ", || Broker::connect(&nodes)).await?;
    if crate::contract::template::is_template(&names.exchange) {
        outln!(
            "exchange {}: a template, not declared (declare the exchanges it renders to, \
             which --allowed-exchanges lists, before messages go there)",
            names.exchange
        );
    } else {
        broker.declare_exchange(&names.exchange, false).await?;
        outln!("exchange {}: declared (durable topic)", names.exchange);
    }
    if let Some(dead_letter) = dead_letter {
        broker.declare_exchange(&dead_letter, false).await?;
        outln!(
            "dead-letter exchange {dead_letter}: declared (durable topic; bind a queue with `#` \
             to keep every dead letter)"
        );
    }
    broker.close().await;
    Ok(())
}

/// Connects to PostgreSQL, having checked the AMQP URL first: a malformed one is reported
/// before anything is provisioned.
async fn connect_database(args: &SetupArgs) -> Result<Client, RelayError> {
    crate::assembly::broker_nodes(&args.connections)?;
    let url = args.connections.database_url()?;
    within_connect_timeout(args, "PostgreSQL", || db::connect(&url)).await
}

/// Runs `connect` again, with backoff, while it fails with an error that can pass (a server
/// not listening yet, or still starting up), until `--connect-timeout` has passed since the
/// first attempt; then returns the last error. A server started at the same time as `setup`
/// (docker compose) may take a while to accept connections, and a one-shot setup has no
/// supervisor to retry it. Definite errors (a wrong password, TLS refused) return at once.
async fn within_connect_timeout<T, F, Fut>(
    args: &SetupArgs,
    what: &str,
    mut connect: F,
) -> Result<T, RelayError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, RelayError>>,
{
    let deadline = Instant::now() + args.connect_timeout();
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
    loop {
        let error = match connect().await {
            Ok(connected) => return Ok(connected),
            Err(error) => error,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if error.recovery() != SupervisorAction::Retry || left.is_zero() {
            return Err(error);
        }
        let delay = backoff.next_delay().min(left);
        tracing::warn!(
            error = %report(&error),
            retry_in_ms = delay.as_millis() as u64,
            "cannot connect to {what} yet; retrying (--connect-timeout)"
        );
        tokio::time::sleep(delay).await;
    }
}

/// Creates the outbox table if missing, or with `--no-create-table` only checks it exists.
async fn ensure_table(client: &Client, args: &SetupArgs) -> Result<(), RelayError> {
    let names = &args.names;
    let table_existed = preflight::check_table(client, names).await.is_ok();
    if args.no_create_table {
        preflight::check_table(client, names).await?;
        outln!("table {}: exists (not managed by setup)", names.table);
    } else {
        client.batch_execute(&table_step(names).sql).await?;
        outln!(
            "table {}: {}",
            names.table,
            created_or_existed(table_existed)
        );
        client.batch_execute(&state_step(names).sql).await?;
        outln!(
            "state table {}: ready (the last acknowledged commit, for --on-slot-lost recreate)",
            crate::wal::state::state_table(names)
        );
    }
    Ok(())
}

/// With `--no-create-table`: the table has the columns every message needs under the names
/// `map` gives them (else the error `run` would stop with, naming the flag); prints where
/// each contract column is read from, and which are absent. With `shards` above 1 the id
/// must be a uuid: the shards' row filters hash it with uuid_hash.
async fn check_columns(
    client: &Client,
    table: &crate::config::TableName,
    map: &ColumnMap,
    shards: u32,
) -> Result<(), RelayError> {
    let text = TextRelation::discover(client, table, map, &[], |needed| {
        RelayError::Bug(format!(
            "setup's column check needs nothing, asked for {needed}"
        ))
    })
    .await?;
    if shards > 1 && text.id_type() != "uuid" {
        return Err(ConfigProblem::ShardsNeedUuidId {
            shards,
            column: map.column(columns::ID).unwrap_or(columns::ID).to_string(),
            table: table.to_string(),
            id_type: text.id_type().to_string(),
        }
        .into());
    }
    let present: Vec<&str> = text
        .relation()
        .columns
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    let mut read = Vec::new();
    let mut absent = Vec::new();
    for contract in columns::CONTRACT {
        match map.column(contract) {
            Some(column) if present.contains(&column) && column == contract => {
                read.push(contract.to_string());
            }
            Some(column) if present.contains(&column) => read.push(format!("{contract}={column}")),
            Some(column) if column == contract => absent.push(contract.to_string()),
            Some(column) => absent.push(format!("{contract} (no column \"{column}\")")),
            None => absent.push(format!("{contract} (unmapped)")),
        }
    }
    outln!("columns read: {}", read.join(", "));
    if !absent.is_empty() {
        outln!("columns absent: {}", absent.join(", "));
    }
    let headers: Vec<String> = map
        .header_columns()
        .iter()
        .map(|h| format!("{} as {}", h.column, h.header))
        .collect();
    if !headers.is_empty() {
        outln!("header columns: {}", headers.join(", "));
    }
    Ok(())
}

/// `setup --mode poll --no-create-table`: the mapped table has the columns polling reads
/// besides the message's (the error `poll` would stop with), and says how rows are claimed.
async fn check_poll_columns(
    client: &Client,
    table: &crate::config::TableName,
    map: &ColumnMap,
) -> Result<(), RelayError> {
    // published_at unmapped is fine for setup: `poll --on-published delete` reads the table.
    let settle = match map.column(columns::PUBLISHED_AT) {
        Some(_) => crate::config::OnPublished::Mark,
        None => crate::config::OnPublished::Delete,
    };
    crate::table::polling::OutboxTable::discover(client, table, map, settle).await?;
    match map.column(columns::PUBLISHED_AT) {
        Some(column) => outln!("published_at: marked in \"{column}\""),
        None => {
            outln!("published_at: unmapped; only `poll --on-published delete` reads this table")
        }
    }
    if map.column(columns::CREATED_AT).is_none() {
        outln!("claims: in id order (created_at is unmapped)");
    }
    Ok(())
}

fn created_or_existed(existed: bool) -> &'static str {
    if existed {
        "exists"
    } else {
        "created"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_names() -> OutboxNames {
        OutboxNames {
            table: "outbox".into(),
            publication: "outbox_pub".into(),
            slot: "outbox_slot".into(),
            exchange: "outbox".into(),
        }
    }

    #[test]
    fn bundled_sql_is_the_rendering_for_default_names() {
        let bundled = include_str!("../sql/outbox.sql");
        assert_eq!(
            bundled,
            script(&default_names(), "outbox-relay:emit:public.outbox", None),
            "sql/outbox.sql is stale: regenerate it with `outbox-relay setup --print-sql > sql/outbox.sql`"
        );
    }

    #[test]
    fn bundled_poll_sql_is_the_rendering_for_default_names() {
        let bundled = include_str!("../sql/outbox_poll.sql");
        assert_eq!(
            bundled,
            poll_script(&default_names()),
            "sql/outbox_poll.sql is stale: regenerate it with `outbox-relay setup --mode poll --print-sql > sql/outbox_poll.sql`"
        );
    }

    #[test]
    fn the_claim_index_is_on_the_mapped_columns() {
        use crate::contract::columns::Preset;
        let names = default_names();
        let map = ColumnMap::resolve(Preset::Debezium, &["published_at=sent at".to_string()])
            .expect("map");
        let step = poll_index_step(&names, &map).expect("published_at is mapped");
        assert_eq!(
            step.sql,
            "CREATE INDEX IF NOT EXISTS \"outbox_unpublished_idx\" ON \"public\".\"outbox\" (id) \
             WHERE \"sent at\" IS NULL;"
        );
        // Nothing to index when published rows leave the table.
        assert!(poll_index_step(&names, &ColumnMap::preset(Preset::Debezium)).is_none());
    }

    #[test]
    fn publication_comes_before_slot() {
        let sql = script(&default_names(), "p", None);
        let publication = sql.find("CREATE PUBLICATION").expect("publication");
        let slot = sql
            .find("pg_create_logical_replication_slot")
            .expect("slot");
        assert!(publication < slot);
    }

    /// Names that pass validation but would break naive SQL: the script must quote them
    /// everywhere and keep them out of its comment lines.
    #[test]
    fn names_stay_out_of_comments_and_cannot_close_the_do_block() {
        let names = OutboxNames {
            table: "My Schema.Évents \"q\" 'x' -- y".into(),
            publication: "Pub; DROP TABLE users; -- 100% 'x' \"y\"".into(),
            slot: "slot_0".into(),
            exchange: "outbox".into(),
        };
        let restrict = Restrict {
            emit_role: "App Role 'r' -- z",
            relay_role: Some("Relay \"r\""),
        };
        for sql in [
            script(&names, "my:prefix 'q' -- x", Some(restrict)),
            poll_script(&names),
        ] {
            for line in sql
                .lines()
                .filter(|line| line.trim_start().starts_with("--"))
            {
                for name in ["My Schema", "Évents", "Pub;", "slot_0"] {
                    assert!(!line.contains(name), "a name in the comment {line:?}");
                }
            }
            assert!(!sql.contains("$$"), "{sql}");
        }
        let publication = publication_step(&names).sql;
        assert!(
            publication.contains("DO $outbox_relay$ BEGIN")
                && publication.ends_with("END $outbox_relay$;"),
            "{publication}"
        );
        // The name is RAISE's parameter, not part of its format, where `%` is a placeholder.
        assert!(
            publication.contains(
                "RAISE NOTICE 'publication % already exists', 'Pub; DROP TABLE users; -- 100% ''x'' \"y\"';"
            ),
            "{publication}"
        );
    }

    /// With --restrict-emit, the superuser check runs before anything else, and the
    /// restriction after the functions it alters.
    #[test]
    fn restricting_starts_with_the_superuser_check_and_ends_with_the_grants() {
        let restrict = Restrict {
            emit_role: "app",
            relay_role: None,
        };
        let sql = script(&default_names(), "p", Some(restrict));
        let check = sql.find("rolsuper").expect("superuser check");
        let table = sql.find("CREATE TABLE").expect("table");
        let function = sql.find("CREATE OR REPLACE FUNCTION").expect("functions");
        let revoke = sql.find("REVOKE EXECUTE").expect("revoke");
        assert!(check < table && function < revoke, "{sql}");
        // Every overload, whatever the server's version names them.
        assert!(
            sql.contains("p.proname = 'pg_logical_emit_message' LOOP"),
            "{sql}"
        );
        assert!(sql.contains("FROM PUBLIC', overload);"), "{sql}");
        assert!(
            sql.contains("TO %I', overload, current_user);"),
            "the relay keeps the text overload: {sql}"
        );
        assert_eq!(
            sql.matches("SECURITY DEFINER SET search_path = pg_catalog, pg_temp")
                .count(),
            3
        );
        assert!(sql.contains(
            "GRANT EXECUTE ON FUNCTION \"public\".\"outbox_emit_bytea\"(text, bytea, jsonb, text, text, text, text) TO \"app\";"
        ), "{sql}");
        assert!(!script(&default_names(), "p", None).contains("REVOKE"));
    }

    #[test]
    fn sharded_script_has_every_publication_with_its_filter_before_any_slot() {
        let names = default_names();
        let shards = Shard::every(&names, 3).expect("shards");
        let sql = shards_script(&names, &shards, "p", None, FailoverSlot::Auto);
        let mut last_publication = 0;
        for (shard, names) in &shards {
            let create = format!(
                "CREATE PUBLICATION \"{}\" FOR TABLE \"public\".\"outbox\" WHERE ({}) WITH \
                 (publish = 'insert');",
                names.publication,
                shard.row_filter(&ColumnMap::default()).expect("filter")
            );
            last_publication = sql
                .find(&create)
                .unwrap_or_else(|| panic!("{create}\n{sql}"));
        }
        let first_slot = sql
            .find("pg_create_logical_replication_slot")
            .expect("slot");
        assert!(last_publication < first_slot, "{sql}");
        for k in 0..3 {
            assert!(sql.contains(&format!("'outbox_slot_{k}'")), "{sql}");
        }
        assert!(!sql.contains("'outbox_slot'") && !sql.contains("\"outbox_pub\""));
        // One shard is exactly the unsharded script.
        let one = Shard::every(&names, 1).expect("one");
        assert_eq!(
            shards_script(&names, &one, "p", None, FailoverSlot::Auto),
            script(&names, "p", None)
        );
    }

    #[test]
    fn names_are_quoted() {
        let mut names = default_names();
        names.table = "app.Events".into();
        names.slot = "it's".into();
        let sql = script(&names, "it's:prefix", None);
        assert!(sql.contains("\"app\".\"Events\""), "{sql}");
        assert!(sql.contains("\"app\".\"Events_emit_text\"("), "{sql}");
        assert!(sql.contains("'it''s:prefix'"), "{sql}");
        assert!(sql.contains("'it''s'"), "{sql}");
    }
}
