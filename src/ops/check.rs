//! `outbox-relay check`: is this configuration ready for `setup` and `run` (or `poll`), and
//! if not, what to do about it.
//!
//! It parses the flags of the relay it checks with that command's own definition, validates
//! them with that command's own validation (`wal::prepare`, `poll::prepare`), then asks
//! PostgreSQL and every RabbitMQ node what the relay would find there, with the checks the
//! relay itself runs where it has them (`catalog::preflight`, the table's column discovery, the
//! broker's passive declare). Each finding is one line: `ok`, `warn` (the relay runs, but
//! something will cost you: the fix is advised) or `error` (it would not run, or not
//! deliver: the fix), and the exit code says which was the worst (src/exit.rs).
//!
//! It only reads: no statement that writes, no declare that is not passive, no publish (a
//! test message would reach consumers' queues). So some things stay unknown, and it says
//! so: whether a queue is bound for each routing key (AMQP 0-9-1 cannot list bindings) and
//! the broker's `max_message_size` (never negotiated: it shows only when a publish is
//! refused). It prints no password (URLs are named by host) and no row's payload (only the
//! routing keys that recent rows' event types make).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;

use crate::advice::{self, report, Shortfall, Warning};
use crate::assembly;
use crate::catalog::preflight;
use crate::catalog::slot::read_slot;
use crate::config::{CheckArgs, CheckedRelay, OnPublished, OutboxNames, PollArgs, RunArgs};
use crate::config::{ColumnArgs, TableName};
use crate::contract::columns::{self, ColumnMap};
use crate::contract::mapper::Mapper;
use crate::contract::template::Fields;
use crate::db;
use crate::error::RelayError;
use crate::error::{CatalogError, SlotError};
use crate::exit;
use crate::ops::status::human_bytes;
use crate::publish::{Broker, BrokerNodes};
use crate::shard::Shard;
use crate::table::outbox::{needs_created_at, TextRelation};
use outbox_common::quote::quote_ident;

/// How many of the newest rows the routing keys are taken from: enough to see every event
/// type an application writes often, few enough to read at no cost.
const RECENT_ROWS: i64 = 1_000;
/// How many routing keys the line lists by name.
const KEYS_LISTED: usize = 12;
/// `wal_sender_timeout` above this many `--peer-timeout`s is "far above": the relay gives a
/// vanished peer up after about one, and a standby relay takes over from a vanished active
/// one only after `wal_sender_timeout` (docs/network-failures.md recommends 10 s: two of
/// the default 5 s).
const SENDER_TIMEOUT_PEERS: u32 = 4;

/// How a finding stands, from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Ok,
    Warn,
    Error,
}

impl Level {
    fn word(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

/// What one check found, without its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub level: Level,
    /// What was found; for a warning or an error, with its fix.
    pub detail: String,
}

fn ok(detail: impl Into<String>) -> Outcome {
    Outcome {
        level: Level::Ok,
        detail: detail.into(),
    }
}

fn warn(problem: &str, warning: Warning<'_>) -> Outcome {
    Outcome {
        level: Level::Warn,
        detail: advice::warning(problem, warning),
    }
}

fn short(problem: &str, shortfall: Shortfall<'_>) -> Outcome {
    Outcome {
        level: Level::Error,
        detail: advice::shortfall(problem, shortfall),
    }
}

/// An error of the relay as a finding: its report, with the fix the relay gives for it.
fn failed(error: &RelayError) -> Outcome {
    Outcome {
        level: Level::Error,
        detail: report(error),
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    /// What was checked.
    pub what: String,
    pub outcome: Outcome,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = self.outcome.level.word();
        write!(f, "{level:<5}  {}: {}", self.what, self.outcome.detail)
    }
}

/// The findings so far, each printed as it is found (a node that does not answer holds the
/// next line up to the connect timeout: the lines before it are already out).
#[derive(Debug, Default)]
pub(crate) struct Findings {
    list: Vec<Finding>,
    print: bool,
}

impl Findings {
    fn printing() -> Self {
        Findings {
            list: Vec::new(),
            print: true,
        }
    }

    fn add(&mut self, what: impl Into<String>, outcome: Outcome) {
        let finding = Finding {
            what: what.into(),
            outcome,
        };
        if self.print {
            outln!("{finding}");
        }
        self.list.push(finding);
    }

    /// A check's result: what it found, or the error it met (reported with its fix).
    fn record(&mut self, what: impl Into<String>, result: Result<Outcome, RelayError>) {
        self.add(what, result.unwrap_or_else(|e| failed(&e)));
    }

    pub(crate) fn verdict(&self) -> Verdict {
        match self.list.iter().map(|f| f.outcome.level).max() {
            Some(Level::Error) => Verdict::Errors,
            Some(Level::Warn) => Verdict::Warnings,
            _ => Verdict::Ok,
        }
    }
}

/// The worst of the findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Ok,
    Warnings,
    Errors,
}

impl Verdict {
    /// 0, [`exit::WARNINGS`], or [`exit::CONFIG`]: what was found is a configuration (or a
    /// provisioning) to fix, as when the relay stops on it.
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            Verdict::Ok => 0,
            Verdict::Warnings => exit::WARNINGS,
            Verdict::Errors => exit::CONFIG,
        }
    }
}

pub(crate) async fn run(args: CheckArgs) -> Result<Verdict, RelayError> {
    let Some(relay) = args.relay else {
        return Err(RelayError::Bug(
            "check ran without its relay flags parsed".into(),
        ));
    };
    let mut findings = Findings::printing();
    match relay {
        CheckedRelay::Run(args) => check_run(&args, &mut findings).await,
        CheckedRelay::Poll(args) => check_poll(&args, &mut findings).await,
    }
    Ok(findings.verdict())
}

/// What the servers are checked against: the validated configuration's, or, when it is not
/// valid, what can still be read from the flags (the finding above names the problem).
struct Target<'a> {
    table: TableName,
    exchange: String,
    columns: Option<Arc<ColumnMap>>,
    mapper: Option<&'a Mapper>,
    brokers: Option<Arc<BrokerNodes>>,
    dead_letter_exchange: Option<String>,
    max_message_size: usize,
}

impl<'a> Target<'a> {
    /// From flags that did not validate: each part that is valid on its own.
    fn unvalidated(
        (table, exchange): (&TableName, &str),
        flags: &ColumnArgs,
        args: BrokerFlags<'_>,
    ) -> Self {
        Target {
            table: table.clone(),
            exchange: exchange.to_string(),
            columns: flags.map().ok().map(Arc::new),
            mapper: None,
            brokers: assembly::broker_nodes(args.connections).ok(),
            dead_letter_exchange: None,
            max_message_size: args.max_message_size,
        }
    }
}

struct BrokerFlags<'a> {
    connections: &'a crate::config::Connections,
    max_message_size: usize,
}

async fn check_run(args: &RunArgs, findings: &mut Findings) {
    let prepared = crate::wal::prepare(args);
    let broker_flags = BrokerFlags {
        connections: &args.connections,
        max_message_size: args.tuning.delivery.publishing.max_message_size,
    };
    let names_of = (&args.names.table, &*args.names.exchange);
    let (target, names, shard, created_at_for) = match &prepared {
        Ok(prepared) => {
            findings.add("configuration", ok("the flags of `run` are valid"));
            let target = Target {
                table: args.names.table.clone(),
                exchange: args.names.exchange.to_string(),
                columns: Some(Arc::clone(&prepared.columns)),
                mapper: Some(&prepared.parts.mapper),
                brokers: Some(Arc::clone(&prepared.parts.brokers)),
                dead_letter_exchange: prepared.parts.dead_letter_exchange.clone(),
                max_message_size: broker_flags.max_message_size,
            };
            let created_at_for = prepared.created_at_for.clone();
            let names = prepared.names.clone();
            (target, names, prepared.shard, created_at_for)
        }
        Err(e) => {
            findings.add("configuration", failed(e));
            let names = assembly::shard(&args.shard)
                .and_then(|shard| shard.names(&args.names))
                .unwrap_or_else(|_| args.names.clone());
            let target = Target::unvalidated(names_of, &args.columns, broker_flags);
            (target, names, Shard::UNSHARDED, Vec::new())
        }
    };
    if let Some(client) = connect(&args.connections, findings).await {
        let wal = WalChecks {
            client: &client,
            names: &names,
            target: &target,
            shard,
            created_at_for: &created_at_for,
            peer_timeout: args.peer_timeout.peer_timeout,
            cleanup: !args.cleanup.cleanup_interval.is_zero(),
            emit_prefix: assembly::emit_prefix(&args.emit, &args.names.table),
        };
        wal.run(findings).await;
        routing_keys(&client, &target, findings).await;
    }
    match (&args.stream.stream, &args.stream.super_stream) {
        (None, None) => check_brokers(&target, findings).await,
        (stream, super_stream) => {
            let name = stream.as_ref().or(super_stream.as_ref());
            findings.add(
                "destination",
                ok(format!(
                    "the stream {} (--stream, --super-stream): RabbitMQ's stream protocol is \
                     `run`'s own, and `check` does not reach it; `run` stops at start, naming \
                     the fix, when the stream is missing",
                    name.map(String::as_str).unwrap_or_default()
                )),
            );
        }
    }
}

async fn check_poll(args: &PollArgs, findings: &mut Findings) {
    let prepared = crate::poll::prepare(args);
    let broker_flags = BrokerFlags {
        connections: &args.connections,
        max_message_size: args.delivery.publishing.max_message_size,
    };
    let target = match &prepared {
        Ok(prepared) => {
            findings.add("configuration", ok("the flags of `poll` are valid"));
            Target {
                table: args.names.table.clone(),
                exchange: args.names.exchange.to_string(),
                columns: Some(Arc::clone(&prepared.columns)),
                mapper: Some(&prepared.parts.mapper),
                brokers: Some(Arc::clone(&prepared.parts.brokers)),
                dead_letter_exchange: prepared.parts.dead_letter_exchange.clone(),
                max_message_size: broker_flags.max_message_size,
            }
        }
        Err(e) => {
            findings.add("configuration", failed(e));
            let names_of = (&args.names.table, &*args.names.exchange);
            Target::unvalidated(names_of, &args.columns, broker_flags)
        }
    };
    if let Some(client) = connect(&args.connections, findings).await {
        if let Some(map) = &target.columns {
            poll_table(&client, args, map, findings).await;
        }
        routing_keys(&client, &target, findings).await;
    }
    check_brokers(&target, findings).await;
}

/// Connects to PostgreSQL as the relay would; `None` (the error a finding) when it cannot,
/// or when the configuration has no usable URL (the configuration's finding names why).
async fn connect(
    connections: &crate::config::Connections,
    findings: &mut Findings,
) -> Option<Client> {
    let url = connections.database_url().ok()?;
    let role = db::parse_url(&url)
        .ok()
        .and_then(|config| config.get_user().map(str::to_string));
    match db::connect(&url).await {
        Ok(client) => {
            findings.record("PostgreSQL", server(&client).await);
            Some(client)
        }
        Err(e) => {
            findings.add("PostgreSQL", failed(&e.clarify(role.as_deref())));
            None
        }
    }
}

async fn server(client: &Client) -> Result<Outcome, RelayError> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version'), current_user::text, \
             current_database()::text",
            &[],
        )
        .await?;
    let (version, user, database): (String, String, String) = (row.get(0), row.get(1), row.get(2));
    Ok(ok(format!(
        "connected to PostgreSQL {version}, database {database}, as {user}"
    )))
}

/// WAL mode's checks of the database, in the order `run` meets what they check.
struct WalChecks<'a> {
    client: &'a Client,
    /// The shard's names (the publication and slot `run` would use).
    names: &'a OutboxNames,
    target: &'a Target<'a>,
    shard: Shard,
    created_at_for: &'a [&'static str],
    peer_timeout: Duration,
    cleanup: bool,
    emit_prefix: String,
}

impl WalChecks<'_> {
    async fn run(&self, findings: &mut Findings) {
        let names = self.names;
        let result = preflight::check_wal_level(self.client).await;
        findings.record("wal_level", result.map(|()| ok("logical")));
        match self.capacity().await {
            Ok((slots, senders)) => {
                findings.add("replication slots", slots);
                findings.add("WAL senders", senders);
            }
            Err(e) => findings.add("replication slots", failed(&e)),
        }
        findings.record("max_slot_wal_keep_size", self.keep_size().await);
        findings.record("wal_sender_timeout", self.sender_timeout().await);
        findings.record("role", self.role().await);
        findings.record(
            "privileges",
            table_privileges(self.client, &names.table, &self.needed()).await,
        );
        if let Some(map) = &self.target.columns {
            findings.record(format!("table {}", names.table), self.table(map).await);
        }
        findings.record(
            format!("publication {}", names.publication),
            self.publication().await,
        );
        findings.record(format!("slot {}", names.slot), self.slot().await);
        let result = preflight::check_emit_prefix(self.client, names, &self.emit_prefix).await;
        findings.record(
            "emit functions",
            result.map(|()| {
                ok(format!(
                    "none, or they write --emit-prefix {:?}",
                    self.emit_prefix
                ))
            }),
        );
    }

    /// The privileges `run` uses on the table (sql/role.sql): SELECT (`status`, `resync`,
    /// the recovery's backfill), DELETE for the cleanup.
    fn needed(&self) -> Vec<&'static str> {
        let mut needed = vec!["SELECT"];
        if self.cleanup {
            needed.push("DELETE");
        }
        needed
    }

    async fn capacity(&self) -> Result<(Outcome, Outcome), RelayError> {
        let slot: &str = &self.names.slot;
        let row = self
            .client
            .query_one(
                "SELECT current_setting('max_replication_slots')::int, \
                 (SELECT count(*) FROM pg_catalog.pg_replication_slots)::int, \
                 current_setting('max_wal_senders')::int, \
                 (SELECT count(*) FROM pg_catalog.pg_stat_replication)::int, \
                 (SELECT active_pid FROM pg_catalog.pg_replication_slots WHERE slot_name = $1), \
                 EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = $1)",
                &[&slot],
            )
            .await?;
        let ours_active = row.get::<_, Option<i32>>(4).is_some();
        Ok((
            slot_capacity(row.get(0), row.get(1), row.get(5)),
            sender_capacity(row.get(2), row.get(3), ours_active),
        ))
    }

    async fn keep_size(&self) -> Result<Outcome, RelayError> {
        let setting: String = self
            .client
            .query_one("SELECT current_setting('max_slot_wal_keep_size')", &[])
            .await?
            .get(0);
        Ok(keep_size(&setting))
    }

    /// The role's and database's value too: pg_settings shows this session's, which the
    /// relay's replication session shares (same role, same database).
    async fn sender_timeout(&self) -> Result<Outcome, RelayError> {
        let milliseconds: i64 = self
            .client
            .query_one(
                "SELECT setting::bigint FROM pg_catalog.pg_settings \
                 WHERE name = 'wal_sender_timeout'",
                &[],
            )
            .await?
            .get(0);
        Ok(sender_timeout(milliseconds, self.peer_timeout))
    }

    /// REPLICATION (or superuser): the replication connection of `run`, and the slot that
    /// `setup` creates.
    async fn role(&self) -> Result<Outcome, RelayError> {
        let row = self
            .client
            .query_one(
                "SELECT rolname::text, rolsuper, rolreplication FROM pg_catalog.pg_roles \
                 WHERE rolname = current_user",
                &[],
            )
            .await?;
        let (role, superuser, replication): (String, bool, bool) =
            (row.get(0), row.get(1), row.get(2));
        Ok(match (superuser, replication) {
            (true, _) => ok(format!(
                "{role} is a superuser (the relay needs less: sql/role.sql)"
            )),
            (false, true) => ok(format!(
                "{role} has REPLICATION (`run` streams with it, `setup` creates the slot)"
            )),
            (false, false) => failed(&RelayError::Catalog(CatalogError::NoReplicationPrivilege {
                role: Some(role),
            })),
        })
    }

    /// The columns the message contract needs, by the check `run`'s recovery and `setup
    /// --no-create-table` make (the catalog: no privilege on the table needed).
    async fn table(&self, map: &ColumnMap) -> Result<Outcome, RelayError> {
        let table = &self.names.table;
        let needs: Vec<&'static str> = match self.created_at_for.first() {
            Some(_) => vec![columns::CREATED_AT],
            None => Vec::new(),
        };
        let why = self.created_at_for.first().copied().unwrap_or_default();
        let text = TextRelation::discover(self.client, table, map, &needs, |_| {
            needs_created_at(table, map, why)
        })
        .await?;
        Ok(ok(format!("has the columns {}", read_columns(&text))))
    }

    async fn publication(&self) -> Result<Outcome, RelayError> {
        let names = self.names;
        preflight::check_publication(self.client, names).await?;
        if let Some(map) = &self.target.columns {
            preflight::check_row_filter(self.client, names, self.shard, map).await?;
        }
        let row = self
            .client
            .query_one(
                "SELECT pubinsert, pubupdate, pubdelete, pubtruncate \
                 FROM pg_catalog.pg_publication WHERE pubname = $1",
                &[&names.publication.name],
            )
            .await?;
        let publishes = Publishes {
            insert: row.get(0),
            update: row.get(1),
            delete: row.get(2),
            truncate: row.get(3),
        };
        Ok(publication_outcome(
            &names.publication,
            &names.table.name,
            publishes,
        ))
    }

    /// The slot as `run` checks it at start; held by a process is fine here (a relay
    /// streams, and one started now waits as its standby).
    async fn slot(&self) -> Result<Outcome, RelayError> {
        let slot: &str = &self.names.slot;
        match preflight::check_slot(self.client, slot).await {
            Ok(_) | Err(RelayError::Slot(SlotError::InUse { .. })) => {}
            Err(e) => return Err(e),
        }
        let report = read_slot(self.client, slot).await?.ok_or_else(|| {
            RelayError::Slot(SlotError::Missing {
                slot: slot.to_string(),
            })
        })?;
        let holder = match report.active_pid {
            Some(pid) => format!(
                "active (pid {pid}): a relay streams from it, and one started now waits as its \
                 standby"
            ),
            None => "not active: no relay streams from it".to_string(),
        };
        let bytes = |value: Option<i64>| value.map_or_else(|| "unknown".into(), human_bytes);
        Ok(ok(format!(
            "pgoutput, {holder}; lag {}, retained WAL {}, wal_status {}",
            bytes(report.lag_bytes),
            bytes(report.retained_wal_bytes),
            report.wal_status.as_deref().unwrap_or("unknown")
        )))
    }
}

/// The columns a table's relation reads, `contract=column` where the map renames one.
fn read_columns(text: &TextRelation) -> String {
    let map = text.map();
    let names: Vec<String> = text
        .relation()
        .columns
        .iter()
        .map(|column| {
            let contract = columns::CONTRACT
                .iter()
                .find(|contract| map.column(contract) == Some(column.name.as_str()));
            match contract {
                Some(contract) if *contract != column.name => {
                    format!("{contract}={}", column.name)
                }
                _ => column.name.clone(),
            }
        })
        .collect();
    names.join(", ")
}

/// Polling's checks of the table: the columns and `published_at` as `poll` discovers them,
/// the privileges its claims and marks use, and the claim index.
async fn poll_table(client: &Client, args: &PollArgs, map: &ColumnMap, findings: &mut Findings) {
    let table = &args.names.table;
    let mut needed = vec!["SELECT"];
    match args.on_published {
        OnPublished::Mark => needed.push("UPDATE"),
        OnPublished::Delete => needed.push("DELETE"),
    }
    let cleanup =
        args.on_published == OnPublished::Mark && !args.cleanup.cleanup_interval.is_zero();
    if cleanup {
        needed.push("DELETE");
    }
    findings.record("privileges", table_privileges(client, table, &needed).await);
    let discovered =
        crate::table::polling::OutboxTable::discover(client, table, map, args.on_published).await;
    let outbox = match discovered {
        Ok(outbox) => outbox,
        Err(e) => return findings.add(format!("table {table}"), failed(&e)),
    };
    let published = match map.column(columns::PUBLISHED_AT) {
        Some(column) if args.on_published == OnPublished::Mark => {
            format!("published_at in \"{column}\"")
        }
        _ => "rows deleted once published (--on-published delete)".to_string(),
    };
    findings.add(
        format!("table {table}"),
        ok(format!("has the columns polling reads; {published}")),
    );
    let outcome = outbox.has_claim_index(client).await.map(|has| match has {
        true => ok("a partial index on the unsent rows serves the claims"),
        false => warn(crate::table::polling::NO_CLAIM_INDEX, Warning::NoClaimIndex),
    });
    findings.record("claim index", outcome);
}

/// Whether the role has each of `needed` on the table. Nothing to say when the table is
/// missing: the table's own finding says so.
async fn table_privileges(
    client: &Client,
    table: &TableName,
    needed: &[&'static str],
) -> Result<Outcome, RelayError> {
    let row = client
        .query_one(
            "SELECT current_user::text, pg_catalog.to_regclass($1)::oid",
            &[&table.qualified_table()],
        )
        .await?;
    let (role, oid): (String, Option<u32>) = (row.get(0), row.get(1));
    let Some(oid) = oid else {
        return Ok(ok(format!("not checked: there is no table {table}")));
    };
    let mut missing = Vec::new();
    for privilege in needed {
        let has: bool = client
            .query_one(
                "SELECT pg_catalog.has_table_privilege($1::oid, $2)",
                &[&oid, privilege],
            )
            .await?
            .get(0);
        if !has && !missing.contains(privilege) {
            missing.push(*privilege);
        }
    }
    if missing.is_empty() {
        return Ok(ok(format!("{role} has {} on {table}", needed.join(", "))));
    }
    let grant = missing.join(", ");
    Ok(short(
        &format!("{role} lacks {grant} on {table}"),
        Shortfall::TablePrivileges {
            grant: &grant,
            table: &table.name,
            role: &role,
        },
    ))
}

/// The routing keys the newest rows' messages would go out with. Nothing to say without a
/// valid configuration (no mapper) or a table (their own findings say why).
async fn routing_keys(client: &Client, target: &Target<'_>, findings: &mut Findings) {
    let (Some(mapper), Some(map)) = (target.mapper, target.columns.as_deref()) else {
        return;
    };
    match recent_keys(client, &target.table, map, mapper).await {
        Ok(Some(keys)) => findings.add("routing keys", routing_keys_outcome(&keys)),
        Ok(None) => {}
        Err(e) => findings.add("routing keys", failed(&e)),
    }
}

/// The routing keys of the newest rows.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct RecentKeys {
    rows: usize,
    keys: BTreeSet<String>,
    /// Rows whose key `--routing-key` cannot render (a field NULL or unmapped).
    unrenderable: usize,
}

/// Reads the fields the routing key is made of (never the payload) from the newest
/// [`RECENT_ROWS`] rows, and makes each row's key as the mapper does: the row's own
/// `routing_key` when it has one, else `--routing-key` rendered.
async fn recent_keys(
    client: &Client,
    table: &TableName,
    map: &ColumnMap,
    mapper: &Mapper,
) -> Result<Option<RecentKeys>, RelayError> {
    let exists: bool = client
        .query_one(
            "SELECT pg_catalog.to_regclass($1) IS NOT NULL",
            &[&table.qualified_table()],
        )
        .await?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let field = |contract: &str| match map.column(contract) {
        Some(column) => format!("{}::text", quote_ident(column)),
        None => "NULL::text".to_string(),
    };
    let order = match map.column(columns::CREATED_AT) {
        Some(created) => format!("ORDER BY {} DESC", quote_ident(created)),
        None => String::new(),
    };
    let sql = format!(
        "SELECT {}, {}, {}, {}, {} FROM {} {order} LIMIT {RECENT_ROWS}",
        field(columns::EVENT_TYPE),
        field(columns::AGGREGATE_TYPE),
        field(columns::AGGREGATE_ID),
        field(columns::ID),
        field(columns::ROUTING_KEY),
        table.qualified_table()
    );
    let rows = client.query(&sql, &[]).await?;
    let mut keys = RecentKeys {
        rows: rows.len(),
        ..RecentKeys::default()
    };
    for row in &rows {
        let text = |i: usize| row.get::<_, Option<String>>(i);
        let (event_type, aggregate_type, aggregate_id, id, own) =
            (text(0), text(1), text(2), text(3), text(4));
        let fields = Fields {
            event_type: event_type.as_deref(),
            aggregate_type: aggregate_type.as_deref(),
            aggregate_id: aggregate_id.as_deref(),
            id: id.as_deref(),
        };
        match own.or_else(|| mapper.default_routing_key(&fields)) {
            Some(key) => {
                keys.keys.insert(key);
            }
            None => keys.unrenderable += 1,
        }
    }
    Ok(Some(keys))
}

/// Every node: its login, then (on the first that answers) the exchanges and the message
/// size limit.
async fn check_brokers(target: &Target<'_>, findings: &mut Findings) {
    let Some(brokers) = &target.brokers else {
        return;
    };
    let mut checked = false;
    for node in brokers.singly() {
        let address = node.nodes().first().map_or("", |n| n.address()).to_string();
        let what = format!("RabbitMQ {address}");
        let broker = match Broker::connect(&node).await {
            Ok(broker) => broker,
            Err(e) => {
                findings.add(what, failed(&e));
                continue;
            }
        };
        findings.add(
            what,
            ok("connected: the login, the virtual host and publisher confirms"),
        );
        if !checked {
            checked = true;
            exchanges(&broker, target, findings).await;
        }
        broker.close().await;
    }
    if checked {
        findings.add("message size", message_size(target.max_message_size));
    }
}

/// The exchange (and the dead-letter exchange), passively: a missing one is `run`'s error.
async fn exchanges(broker: &Broker, target: &Target<'_>, findings: &mut Findings) {
    let exchange = target.exchange.as_str();
    let what = format!("exchange {exchange}");
    let outcome = match crate::contract::template::is_template(exchange) {
        true => ok(
            "a template: each exchange it renders to is checked when the relay first \
             publishes to it",
        ),
        false => match broker.check_exchange(exchange).await {
            Ok(()) => ok("exists"),
            Err(e) => failed(&e),
        },
    };
    findings.add(what, outcome);
    if let Some(dead_letter) = &target.dead_letter_exchange {
        let outcome = match broker.declare_exchange(dead_letter, true).await {
            Ok(()) => ok("exists"),
            Err(e) => failed(&e),
        };
        findings.add(format!("dead-letter exchange {dead_letter}"), outcome);
    }
}

// ---------------------------------------------------------------------------------------
// The judgements, apart from the queries that feed them.

/// `max_replication_slots` against the slots that exist: `setup` needs one free unless the
/// relay's slot exists.
fn slot_capacity(max: i32, used: i32, ours_exists: bool) -> Outcome {
    let free = (max - used).max(0);
    match (ours_exists, free) {
        (true, _) => ok(format!(
            "{used} of {max} used (max_replication_slots), the relay's among them"
        )),
        (false, 0) => short(
            &format!(
                "all {max} slots of max_replication_slots are taken, and `setup` needs one for \
                 the relay's"
            ),
            Shortfall::NoFreeSlot,
        ),
        (false, _) => ok(format!(
            "{used} of {max} used (max_replication_slots): {free} free for the slot `setup` \
             creates"
        )),
    }
}

/// `max_wal_senders` against the walsenders running: `run` needs one, unless a relay
/// already streams from the slot (one started now waits as a standby, and takes over that
/// one's sender when it goes).
fn sender_capacity(max: i32, busy: i32, ours_active: bool) -> Outcome {
    let free = (max - busy).max(0);
    match (ours_active, free) {
        (true, _) => ok(format!(
            "{busy} of {max} busy (max_wal_senders), one of them the relay's"
        )),
        (false, 0) => short(
            &format!(
                "all {max} WAL senders of max_wal_senders are busy, and `run` needs one for \
                 its replication connection"
            ),
            Shortfall::NoFreeWalSender,
        ),
        (false, _) => ok(format!(
            "{busy} of {max} busy (max_wal_senders): {free} free"
        )),
    }
}

/// `max_slot_wal_keep_size` as `current_setting` prints it (`-1`, `50GB`).
fn keep_size(setting: &str) -> Outcome {
    match setting.trim() {
        "-1" => warn(
            "-1 (unlimited): a slot no relay reads retains WAL until the primary's disk \
             fills, and a full WAL disk stops the database",
            Warning::SlotWalUnbounded,
        ),
        size => ok(format!(
            "{size}: a slot that would retain more is invalidated (then recovered with \
             `resync`), the disk is not filled"
        )),
    }
}

/// `wal_sender_timeout` (milliseconds) against the relay's `--peer-timeout`.
fn sender_timeout(milliseconds: i64, peer_timeout: Duration) -> Outcome {
    let timeout = Duration::from_millis(milliseconds.max(0).unsigned_abs());
    let text = |d: Duration| humantime::format_duration(d).to_string();
    if milliseconds == 0 {
        return warn(
            preflight::WAL_SENDER_TIMEOUT_OFF,
            Warning::WalSenderTimeoutOff,
        );
    }
    if timeout > peer_timeout * SENDER_TIMEOUT_PEERS {
        return warn(
            &format!(
                "{} is over {SENDER_TIMEOUT_PEERS} × --peer-timeout ({}): when the active \
                 relay's host vanishes, PostgreSQL keeps its walsender, and the slot, for {}, \
                 and a standby relay takes over only then",
                text(timeout),
                text(peer_timeout),
                text(timeout)
            ),
            Warning::WalSenderTimeoutLong,
        );
    }
    ok(format!(
        "{}: a vanished relay's slot is released for a standby within it (--peer-timeout {})",
        text(timeout),
        text(peer_timeout)
    ))
}

/// What a publication publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Publishes {
    insert: bool,
    update: bool,
    delete: bool,
    truncate: bool,
}

fn publication_outcome(publication: &str, table: &str, publishes: Publishes) -> Outcome {
    let others: Vec<&str> = [
        ("update", publishes.update),
        ("delete", publishes.delete),
        ("truncate", publishes.truncate),
    ]
    .into_iter()
    .filter_map(|(what, on)| on.then_some(what))
    .collect();
    if !publishes.insert {
        return short(
            &format!(
                "it does not publish inserts: the relay would receive none of the rows of \
                 {table}"
            ),
            Shortfall::PublicationSkipsInserts { publication },
        );
    }
    if !others.is_empty() {
        return warn(
            &format!(
                "it publishes {} besides inserts: the walsender decodes and sends them (the \
                 cleanup's deletes among them), and the relay skips them",
                others.join(", ")
            ),
            Warning::PublicationNotInsertOnly { publication },
        );
    }
    ok(format!("publishes the inserts of {table}, and only them"))
}

fn routing_keys_outcome(keys: &RecentKeys) -> Outcome {
    const UNKNOWABLE: &str = "whether a queue is bound for each is not checked: AMQP 0-9-1 \
         cannot list bindings, and a test message would reach consumers (the management \
         API's /api/exchanges/<vhost>/<exchange>/bindings/source lists them); the relay stops \
         at a message no queue takes, naming it";
    if keys.rows == 0 {
        return ok(format!("no rows in the table yet; {UNKNOWABLE}"));
    }
    let mut listed: Vec<&str> = keys
        .keys
        .iter()
        .take(KEYS_LISTED)
        .map(String::as_str)
        .collect();
    let more = keys.keys.len().saturating_sub(KEYS_LISTED);
    let more = match more {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let unrenderable = match keys.unrenderable {
        0 => String::new(),
        n => format!(" ({n} rows have none: a field --routing-key names is NULL)"),
    };
    if listed.is_empty() {
        listed.push("none");
    }
    ok(format!(
        "{}{more} in the newest {} rows{unrenderable}; {UNKNOWABLE}",
        listed.join(", "),
        keys.rows
    ))
}

fn message_size(limit: usize) -> Outcome {
    let limit = human_bytes(i64::try_from(limit).unwrap_or(i64::MAX));
    ok(format!(
        "--max-message-size {limit}; RabbitMQ's max_message_size cannot be read over AMQP \
         0-9-1 (16 MiB by default in 4.x, 128 MiB in 3.x): a broker that refuses a larger \
         body names its limit then, and the relay applies it"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_finding_decides_the_exit_code() {
        let mut findings = Findings::default();
        assert_eq!(findings.verdict().exit_code(), 0);
        findings.add("a", ok("fine"));
        assert_eq!(findings.verdict(), Verdict::Ok);
        findings.add("b", keep_size("-1"));
        assert_eq!(findings.verdict().exit_code(), exit::WARNINGS);
        findings.add("c", slot_capacity(10, 10, false));
        findings.add("d", ok("fine"));
        assert_eq!(findings.verdict().exit_code(), exit::CONFIG);
        assert_ne!(exit::WARNINGS, exit::CONFIG);
    }

    #[test]
    fn a_finding_is_one_line_with_its_level_and_fix() {
        let finding = Finding {
            what: "max_slot_wal_keep_size".into(),
            outcome: keep_size("-1"),
        };
        let line = finding.to_string();
        assert!(
            line.starts_with("warn   max_slot_wal_keep_size: -1 (unlimited)"),
            "{line}"
        );
        assert!(
            line.contains(". Fix: ALTER SYSTEM SET max_slot_wal_keep_size"),
            "{line}"
        );
        assert!(!line.contains('\n'), "{line}");
        let line = Finding {
            what: "wal_level".into(),
            outcome: ok("logical"),
        }
        .to_string();
        assert_eq!(line, "ok     wal_level: logical");
    }

    #[test]
    fn a_full_slot_table_is_an_error_unless_the_slot_exists() {
        assert_eq!(slot_capacity(10, 10, true).level, Level::Ok);
        let full = slot_capacity(10, 10, false);
        assert_eq!(full.level, Level::Error);
        assert!(
            full.detail.contains("Fix: drop a slot nothing uses"),
            "{}",
            full.detail
        );
        let free = slot_capacity(10, 4, false);
        assert_eq!(free.level, Level::Ok);
        assert!(free.detail.contains("6 free"), "{}", free.detail);
    }

    #[test]
    fn busy_wal_senders_are_an_error_unless_the_relay_holds_one() {
        assert_eq!(sender_capacity(5, 5, true).level, Level::Ok);
        let busy = sender_capacity(5, 5, false);
        assert_eq!(busy.level, Level::Error);
        assert!(
            busy.detail.contains("Fix: raise max_wal_senders"),
            "{}",
            busy.detail
        );
        assert_eq!(sender_capacity(5, 1, false).level, Level::Ok);
    }

    #[test]
    fn unbounded_wal_retention_warns_and_a_bound_is_reported() {
        assert_eq!(keep_size("-1").level, Level::Warn);
        let bounded = keep_size("50GB");
        assert_eq!(bounded.level, Level::Ok);
        assert!(bounded.detail.starts_with("50GB"), "{}", bounded.detail);
    }

    #[test]
    fn wal_sender_timeout_warns_when_off_or_far_above_the_peer_timeout() {
        let peer = Duration::from_secs(5);
        let off = sender_timeout(0, peer);
        assert_eq!(off.level, Level::Warn);
        assert!(off.detail.contains("is 0 (off)"), "{}", off.detail);
        let long = sender_timeout(60_000, peer);
        assert_eq!(long.level, Level::Warn);
        assert!(
            long.detail.contains("1m is over 4 × --peer-timeout (5s)"),
            "{}",
            long.detail
        );
        assert!(long
            .detail
            .contains("Fix: ALTER SYSTEM SET wal_sender_timeout = '10s'"));
        assert_eq!(sender_timeout(10_000, peer).level, Level::Ok);
        assert_eq!(sender_timeout(20_000, peer).level, Level::Ok);
        assert_eq!(
            sender_timeout(60_000, Duration::from_secs(15)).level,
            Level::Ok
        );
    }

    #[test]
    fn a_publication_must_publish_inserts_and_should_publish_only_them() {
        let publishes = |insert, update, delete, truncate| Publishes {
            insert,
            update,
            delete,
            truncate,
        };
        let only = publication_outcome("p", "outbox", publishes(true, false, false, false));
        assert_eq!(only.level, Level::Ok);
        let all = publication_outcome("p", "outbox", publishes(true, true, true, true));
        assert_eq!(all.level, Level::Warn);
        assert!(
            all.detail.contains("update, delete, truncate besides"),
            "{}",
            all.detail
        );
        assert!(all
            .detail
            .ends_with("Fix: ALTER PUBLICATION p SET (publish = 'insert')"));
        let none = publication_outcome("My Pub", "outbox", publishes(false, true, false, false));
        assert_eq!(none.level, Level::Error);
        assert!(
            none.detail
                .ends_with("ALTER PUBLICATION \"My Pub\" SET (publish = 'insert')"),
            "{}",
            none.detail
        );
    }

    #[test]
    fn routing_keys_are_listed_with_what_cannot_be_known() {
        let keys = RecentKeys {
            rows: 30,
            keys: (0..15).map(|i| format!("k{i:02}")).collect(),
            unrenderable: 2,
        };
        let line = routing_keys_outcome(&keys).detail;
        assert!(line.starts_with("k00, k01,"), "{line}");
        assert!(
            line.contains("k11 and 3 more in the newest 30 rows"),
            "{line}"
        );
        assert!(line.contains("(2 rows have none"), "{line}");
        assert!(
            line.contains("not checked: AMQP 0-9-1 cannot list bindings"),
            "{line}"
        );
        let empty = routing_keys_outcome(&RecentKeys::default()).detail;
        assert!(empty.starts_with("no rows in the table yet"), "{empty}");
    }

    #[test]
    fn the_message_size_says_what_cannot_be_known() {
        let line = message_size(16 * 1024 * 1024).detail;
        assert!(line.starts_with("--max-message-size 16.0 MiB"), "{line}");
        assert!(line.contains("cannot be read over AMQP 0-9-1"), "{line}");
    }
}
