//! `outbox-relay status`: what an operator asks first. Is the slot there, is someone reading
//! it, how far behind is it, how much WAL does it hold on the primary, how close is it to
//! being invalidated, how many rows wait in the table, and is the relay stuck on a message.
//!
//! Everything but the stuck message comes from PostgreSQL. Which message the relay is stuck
//! on is state of a running relay, not of the database: it is read from that relay's
//! `/readyz` at `--metrics-addr`, and reported as unknown when no relay answers there.
//!
//! Exit code 2 when the slot is missing or lost, so that the command serves as a probe. With
//! `--mode poll` (polling mode has no slot) the slot is not read, and exit code 4 means the
//! table cannot be read or lacks `published_at`, and the unsent backlog
//! (`published_at IS NULL`: WAL mode never sets it) is shown.
//!
//! With `--shards N` it reads every shard's slot `<slot>_<k>`: one line each, the slot fields
//! of the worst one (missing, lost, or else holding the most WAL), and exit code 4 when any
//! of them is missing or lost.
//!
//! It only reads: it must never create, advance or drop anything, so an operator (or a probe
//! every few seconds) can run it against a live relay at no risk.

use std::net::SocketAddr;

use serde::Serialize;
use tokio_postgres::Client;

use crate::advice;
use crate::catalog::preflight::{idle_slot_timeout, synchronized_standby_slots};
use crate::catalog::slot::{
    failover_readiness, read_slot, read_standby_slots, Readiness, SlotReport,
};
use crate::config::{Mode, StatusArgs};
use crate::contract::columns;
use crate::db;
use crate::error::{ConfigProblem, RelayError};
use crate::observability::http_get;
use crate::observability::metrics::{BROKER_INFO, HOST_LABEL, NODE_LABEL, POSTGRES_INFO};
use crate::observability::StandbyWait;
use crate::shard::Shard;
use crate::table::polling::{Backlog, BacklogQuery};
use outbox_common::quote::quote_ident;

/// The probe's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The slot exists and is not lost.
    Healthy,
    /// The slot is missing or lost: exit code 4 (`exit::UNHEALTHY`).
    SlotProblem,
    /// Poll mode: the table cannot be read or has no published_at column: exit code 4.
    TableProblem,
}

/// Everything `status` reports; `--json` prints it as is.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Status {
    /// `wal` or `poll` (`--mode`).
    pub mode: &'static str,
    pub slot: String,
    /// `ok`, `missing` or `lost`; `unused` in poll mode (the slot is not read).
    pub slot_state: &'static str,
    pub active_pid: Option<i32>,
    pub lag_bytes: Option<i64>,
    pub retained_wal_bytes: Option<i64>,
    pub wal_status: Option<String>,
    /// `null` while max_slot_wal_keep_size is unlimited.
    pub safe_wal_size_bytes: Option<i64>,
    pub confirmed_flush_lsn: Option<String>,
    pub restart_lsn: Option<String>,
    pub current_wal_lsn: Option<String>,
    /// Why the slot was invalidated (17+ `invalidation_reason`; what 15 and 16 imply), `null`
    /// while it is valid.
    pub invalidation_reason: Option<String>,
    /// 17+: since when no process has streamed from the slot (`null` while one does, and
    /// before 17).
    pub inactive_since: Option<String>,
    /// 16+: invalidated by a conflict with recovery (`null` before 16; 16 also sets it for a
    /// slot whose WAL was removed).
    pub conflicting: Option<bool>,
    /// 17+: a failover slot (`null` before 17).
    pub failover: Option<bool>,
    /// 17+: synchronized from a primary (`null` before 17).
    pub synced: Option<bool>,
    /// 18+: the server's idle_replication_slot_timeout when set (`null`: off, or before 18).
    pub idle_replication_slot_timeout: Option<String>,
    /// 17+: the server's synchronized_standby_slots (`""`: unset; `null` before 17).
    pub synchronized_standby_slots: Option<String>,
    /// 17+: the physical slots of synchronized_standby_slots that hold the slot back now
    /// (missing, invalidated, or no standby connected): PostgreSQL sends the relay nothing
    /// past what they confirmed. `null` when nothing can hold it back (unset, before 17, not
    /// a failover slot); empty when nothing does.
    pub waiting_for_standby: Option<Vec<StandbyWait>>,
    pub table: String,
    pub outbox_rows: Option<i64>,
    pub oldest_row_age_seconds: Option<f64>,
    /// Poll mode: rows with `published_at IS NULL` (`null` in WAL mode).
    pub unsent_rows: Option<i64>,
    /// Poll mode: age of the oldest unsent row (`null` when none, and in WAL mode).
    pub oldest_unsent_age_seconds: Option<f64>,
    /// Why the table could not be read, if it could not.
    pub table_error: Option<String>,
    /// The address whose `/readyz` was asked.
    pub relay_addr: Option<String>,
    /// The running relay's `/readyz` line (`ready`, `standby`, `stuck message …`), `null`
    /// when no relay answered.
    pub relay_readiness: Option<String>,
    /// Whether the stuck message is known: only a running relay knows it.
    pub stuck_message_known: bool,
    pub stuck_message_id: Option<String>,
    /// The RabbitMQ node (`host:port`) the running relay is connected to, from its
    /// `/metrics`; `null` when no relay answered or it is not connected.
    pub broker: Option<String>,
    /// The PostgreSQL server (`host:port`) the running relay streams from, from its
    /// `/metrics`; `null` when no relay answered.
    pub postgres: Option<String>,
    /// With a database URL of several hosts: each, and whether a promotion of it would keep
    /// the slot. Absent with one host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub servers: Option<Vec<ServerState>>,
    /// With `--shards N` (N > 1): every shard's slot. The slot fields above are then those
    /// of the worst shard. Absent without shards.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<Vec<ShardSlot>>,
}

/// One server of a multi-host database URL, for `status`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ServerState {
    pub host: String,
    #[serde(flatten)]
    pub readiness: Readiness,
}

/// One shard's slot, for `status --shards N`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ShardSlot {
    pub shard: u32,
    pub slot: String,
    /// `ok`, `missing` or `lost`.
    pub slot_state: &'static str,
    pub active_pid: Option<i32>,
    pub lag_bytes: Option<i64>,
    pub retained_wal_bytes: Option<i64>,
    pub wal_status: Option<String>,
    pub confirmed_flush_lsn: Option<String>,
}

/// `ok`, `missing` or `lost`.
fn slot_state(report: Option<&SlotReport>) -> &'static str {
    match report {
        None => "missing",
        Some(report) if report.is_lost() => "lost",
        Some(_) => "ok",
    }
}

/// Every shard's slot, and the index of the worst: lost, else missing, else the one that
/// holds the most WAL (what an operator must look at first).
async fn read_shard_slots(
    client: &Client,
    slot: &str,
    shards: &[Shard],
) -> Result<(Vec<(String, Option<SlotReport>)>, usize), RelayError> {
    let mut slots = Vec::with_capacity(shards.len());
    for shard in shards {
        let name = shard.slot(slot)?;
        let report = read_slot(client, &name).await?;
        slots.push((name, report));
    }
    let severity = |(_, report): &(String, Option<SlotReport>)| {
        let rank = match slot_state(report.as_ref()) {
            "lost" => 0,
            "missing" => 1,
            _ => 2,
        };
        let retained = report.as_ref().and_then(|r| r.retained_wal_bytes);
        (rank, std::cmp::Reverse(retained.unwrap_or(0)))
    };
    let worst = (0..slots.len())
        .min_by_key(|&i| severity(&slots[i]))
        .unwrap_or(0);
    Ok((slots, worst))
}

impl Status {
    pub(crate) fn probe(&self) -> Probe {
        match (self.mode, self.slot_state) {
            ("poll", _) if self.table_error.is_some() => Probe::TableProblem,
            ("poll", _) | (_, "ok") => Probe::Healthy,
            _ => Probe::SlotProblem,
        }
    }
}

pub(crate) async fn run(args: StatusArgs) -> Result<Probe, RelayError> {
    // A malformed column map is refused before anything connects.
    args.columns.map()?;
    let url = args.connections.database_url()?;
    let client = db::connect(&url).await?;
    let mut status = gather(&client, &args).await?;
    if db::servers(&url)?.len() > 1 && args.mode.mode != Mode::Poll {
        let servers = failover_readiness(&url, &status.slot).await;
        status.servers = Some(
            servers
                .into_iter()
                .map(|(host, readiness)| ServerState { host, readiness })
                .collect(),
        );
    }
    if args.json {
        let text = serde_json::to_string_pretty(&status)
            .map_err(|e| RelayError::Bug(format!("cannot render the status as JSON: {e}")))?;
        outln!("{text}");
    } else {
        out!("{}", render(&status));
    }
    Ok(status.probe())
}

/// Reads the slot, the table and the running relay's readiness.
pub(crate) async fn gather(client: &Client, args: &StatusArgs) -> Result<Status, RelayError> {
    let poll = args.mode.mode == Mode::Poll;
    let slots = read_slots(client, args, poll).await?;
    let table = read_table(client, args, poll).await;
    let addr = args.endpoints.metrics_addr.0;
    let relay = ask_relay(addr).await;
    let slot_state = match &slots.report {
        _ if poll => "unused",
        report => slot_state(report.as_ref()),
    };
    let SlotReport {
        active_pid,
        wal_status,
        safe_wal_size_bytes,
        confirmed_flush_lsn,
        restart_lsn,
        lag_bytes,
        retained_wal_bytes,
        current_wal_lsn,
        inactive_since,
        conflicting,
        failover,
        synced,
        ..
    } = slots.report.clone().unwrap_or_default();
    let invalidation_reason = slots
        .report
        .as_ref()
        .and_then(|r| r.lost_reason())
        .map(str::to_string);
    let (idle_replication_slot_timeout, synchronized_standby_slots, waiting_for_standby) =
        match poll {
            true => (None, None, None),
            false => (
                idle_slot_timeout(client).await?,
                synchronized_standby_slots(client).await?,
                // One reading: a standby that stalled is told by the running relay's poller.
                read_standby_slots(client, &slots.slot)
                    .await?
                    .map(|standbys| standbys.waits(None)),
            ),
        };
    Ok(Status {
        mode: if poll { "poll" } else { "wal" },
        slot: slots.slot,
        slot_state,
        active_pid,
        lag_bytes,
        retained_wal_bytes,
        wal_status,
        safe_wal_size_bytes,
        confirmed_flush_lsn,
        restart_lsn,
        current_wal_lsn: (!current_wal_lsn.is_empty()).then_some(current_wal_lsn),
        invalidation_reason,
        inactive_since,
        conflicting,
        failover,
        synced,
        idle_replication_slot_timeout,
        synchronized_standby_slots,
        waiting_for_standby,
        table: args.names.table.to_string(),
        outbox_rows: table.outbox_rows,
        oldest_row_age_seconds: table.oldest_row_age_seconds,
        unsent_rows: table.unsent.map(|b: Backlog| b.unsent_rows),
        oldest_unsent_age_seconds: table.unsent.and_then(|b| b.oldest_unsent_age_seconds),
        table_error: table.error,
        relay_addr: addr.map(|a| a.to_string()),
        stuck_message_known: relay.readiness.is_some(),
        stuck_message_id: relay.stuck_message_id,
        relay_readiness: relay.readiness,
        broker: relay.broker,
        postgres: relay.postgres,
        servers: None,
        shards: slots.shards,
    })
}

/// The slot status reports on: the one slot, or the worst of the shards' (then every
/// shard's too).
struct SlotsRead {
    slot: String,
    report: Option<SlotReport>,
    shards: Option<Vec<ShardSlot>>,
}

async fn read_slots(
    client: &Client,
    args: &StatusArgs,
    poll: bool,
) -> Result<SlotsRead, RelayError> {
    let names = &args.names;
    let shards = Shard::all(args.shards.shards)?;
    if poll && shards.len() > 1 {
        return Err(ConfigProblem::StatusShardsInPollMode.into());
    }
    if poll || shards.len() == 1 {
        let report = match poll {
            true => None,
            false => read_slot(client, &names.slot).await?,
        };
        return Ok(SlotsRead {
            slot: names.slot.to_string(),
            report,
            shards: None,
        });
    }
    let (slots, worst) = read_shard_slots(client, &names.slot, &shards).await?;
    let listed = shards
        .iter()
        .zip(&slots)
        .map(|(shard, (slot, report))| ShardSlot {
            shard: shard.index(),
            slot: slot.clone(),
            slot_state: slot_state(report.as_ref()),
            active_pid: report.as_ref().and_then(|r| r.active_pid),
            lag_bytes: report.as_ref().and_then(|r| r.lag_bytes),
            retained_wal_bytes: report.as_ref().and_then(|r| r.retained_wal_bytes),
            wal_status: report.as_ref().and_then(|r| r.wal_status.clone()),
            confirmed_flush_lsn: report.as_ref().and_then(|r| r.confirmed_flush_lsn.clone()),
        })
        .collect();
    let (slot, report) = slots.into_iter().nth(worst).unwrap_or_default();
    Ok(SlotsRead {
        slot,
        report,
        shards: Some(listed),
    })
}

/// What status says of the table: its rows, and in poll mode the unsent ones.
struct TableRead {
    outbox_rows: Option<i64>,
    oldest_row_age_seconds: Option<f64>,
    unsent: Option<Backlog>,
    /// Why the table could not be read, if it could not.
    error: Option<String>,
}

async fn read_table(client: &Client, args: &StatusArgs, poll: bool) -> TableRead {
    let names = &args.names;
    let (outbox_rows, oldest_row_age_seconds, mut error) = match backlog(client, args).await {
        Ok((rows, age)) => (Some(rows), age, None),
        Err(e) => (None, None, Some(advice::report(&e))),
    };
    // Only in poll mode: WAL mode never writes published_at, so there every row is "unsent".
    let query = match args.columns.map() {
        Ok(map) => Some(BacklogQuery::new(&names.table, &map)),
        Err(e) => {
            error.get_or_insert_with(|| advice::report(&e));
            None
        }
    };
    let unsent = match (poll, &query) {
        (true, Some(query)) => match query.read(client).await {
            Ok(unsent) => unsent,
            Err(e) => {
                error.get_or_insert_with(|| advice::report(&e));
                None
            }
        },
        _ => None,
    };
    if poll && unsent.is_none() && error.is_none() {
        let column = query
            .as_ref()
            .and_then(BacklogQuery::published_column)
            .unwrap_or(columns::PUBLISHED_AT);
        error = Some(advice::report(&RelayError::from(
            ConfigProblem::PollPublishedColumnMissing {
                table: names.table.to_string(),
                column: column.to_string(),
            },
        )));
    }
    TableRead {
        outbox_rows,
        oldest_row_age_seconds,
        unsent,
        error,
    }
}

/// What a running relay says of itself, at its `--metrics-addr`.
struct RelayRead {
    /// Its `/readyz` line; `None` when no relay answered.
    readiness: Option<String>,
    broker: Option<String>,
    postgres: Option<String>,
    stuck_message_id: Option<String>,
}

async fn ask_relay(addr: Option<SocketAddr>) -> RelayRead {
    let readiness = match addr {
        Some(addr) => match http_get(addr, "/readyz").await {
            Ok((_, body)) => Some(body.trim().to_string()),
            Err(_) => None,
        },
        None => None,
    };
    let metrics = match (addr, &readiness) {
        (Some(addr), Some(_)) => http_get(addr, "/metrics").await.ok().map(|(_, body)| body),
        _ => None,
    };
    let broker = metrics
        .as_deref()
        .and_then(|m| in_use(m, BROKER_INFO, NODE_LABEL));
    let postgres = metrics
        .as_deref()
        .and_then(|m| in_use(m, POSTGRES_INFO, HOST_LABEL));
    let stuck_message_id = readiness
        .as_deref()
        .and_then(|line| line.strip_prefix("stuck message "))
        .map(str::to_string);
    RelayRead {
        readiness,
        broker,
        postgres,
        stuck_message_id,
    }
}

/// The node of the `outbox_relay_broker_info` sample that is 1, in a Prometheus text page.
fn in_use(metrics: &str, family: &str, label: &str) -> Option<String> {
    let prefix = format!("{family}{{{label}=\"");
    metrics.lines().find_map(|line| {
        let (node, value) = line.strip_prefix(&prefix)?.split_once("\"}")?;
        (value.trim() == "1").then(|| node.to_string())
    })
}

/// Rows in the table and the age of the oldest (min(created_at) reads the index; no age
/// when the column map leaves created_at unmapped).
async fn backlog(client: &Client, args: &StatusArgs) -> Result<(i64, Option<f64>), RelayError> {
    let map = args.columns.map()?;
    let oldest = match map.column(columns::CREATED_AT) {
        Some(created) => format!(
            "extract(epoch FROM now() - min({}))::float8",
            quote_ident(created)
        ),
        None => "NULL::float8".to_string(),
    };
    let row = client
        .query_one(
            &format!(
                "SELECT count(*), {oldest} FROM {}",
                args.names.table.qualified_table()
            ),
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// The human table.
pub(crate) fn render(status: &Status) -> String {
    let mut lines: Vec<(&str, String)> = Vec::new();
    slot_lines(status, &mut lines);
    server_lines(status, &mut lines);
    table_lines(status, &mut lines);
    relay_lines(status, &mut lines);
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    lines
        .iter()
        .map(|(key, value)| format!("{key:<width$}  {value}\n"))
        .collect()
}

/// The slot's lines (and every shard's).
fn slot_lines(status: &Status, lines: &mut Vec<(&'static str, String)>) {
    let bytes = |value: Option<i64>| match value {
        Some(v) => human_bytes(v),
        None => "unknown".into(),
    };
    let slot_line = match status.slot_state {
        "missing" => format!(
            "{} MISSING: run `outbox-relay setup`; rows inserted while no slot existed need \
             `outbox-relay resync --since <time>`",
            status.slot
        ),
        "lost" => format!(
            "{} LOST (invalidated: {}): messages may be missing. Recover with teardown, setup \
             and resync --since (docs/recovery.md)",
            status.slot,
            status
                .invalidation_reason
                .as_deref()
                .unwrap_or("wal_removed")
        ),
        "unused" => "not used (--mode poll)".into(),
        _ => status.slot.clone(),
    };
    if let Some(shards) = &status.shards {
        lines.push((
            "shards",
            format!(
                "{}; the slot lines below are the worst shard's (lost, missing, or holding the \
                 most WAL)",
                shards.len()
            ),
        ));
        for shard in shards {
            lines.push(("shard", shard_line(shard)));
        }
    }
    lines.push(("slot", slot_line));
    if status.slot_state == "missing" || status.slot_state == "unused" {
        return;
    }
    let pid = status.active_pid.map(|pid| pid.to_string());
    lines.push((
        "active pid",
        pid.unwrap_or_else(|| "none (no relay is streaming)".into()),
    ));
    lines.push(("lag", bytes(status.lag_bytes)));
    lines.push(("retained WAL", bytes(status.retained_wal_bytes)));
    let wal_status = status.wal_status.clone();
    lines.push(("wal_status", wal_status.unwrap_or_else(|| "unknown".into())));
    lines.push((
        "safe_wal_size",
        match status.safe_wal_size_bytes {
            Some(v) => human_bytes(v),
            None => "unlimited (max_slot_wal_keep_size = -1)".into(),
        },
    ));
    let confirmed = status.confirmed_flush_lsn.clone();
    lines.push(("confirmed_flush_lsn", confirmed.unwrap_or_default()));
    lines.push((
        "restart_lsn",
        status.restart_lsn.clone().unwrap_or_default(),
    ));
    version_lines(status, lines);
}

/// What newer servers report of the slot, where the server has it.
fn version_lines(status: &Status, lines: &mut Vec<(&'static str, String)>) {
    if let Some(reason) = &status.invalidation_reason {
        lines.push(("invalidation_reason", reason.clone()));
    }
    let yes_no = |value: bool| if value { "yes" } else { "no" }.to_string();
    if let Some(conflicting) = status.conflicting {
        lines.push(("conflicting", yes_no(conflicting)));
    }
    if let Some(failover) = status.failover {
        lines.push(("failover slot", yes_no(failover)));
    }
    if let Some(synced) = status.synced {
        lines.push(("synced", yes_no(synced)));
    }
    if status.failover.is_some() {
        let since = status.inactive_since.clone();
        lines.push(("inactive since", since.unwrap_or_else(|| "active".into())));
    }
    if let Some(slots) = &status.synchronized_standby_slots {
        lines.push((
            "standby slots",
            match slots.trim() {
                "" => "none (synchronized_standby_slots unset: a failover can lose events the \
                       relay already published)"
                    .into(),
                slots => format!("{slots} (synchronized_standby_slots)"),
            },
        ));
    }
    for wait in status.waiting_for_standby.iter().flatten() {
        lines.push((
            "waiting for",
            format!(
                "standby slot {}: {}; the relay gets nothing past what it confirmed",
                wait.slot, wait.why
            ),
        ));
    }
    if let Some(timeout) = &status.idle_replication_slot_timeout {
        lines.push((
            "idle slot timeout",
            format!("{timeout} (idle_replication_slot_timeout: a slot unused this long is lost)"),
        ));
    }
}

/// A multi-host URL's servers: which is the primary, which standby a promotion would keep
/// the slot on.
fn server_lines(status: &Status, lines: &mut Vec<(&'static str, String)>) {
    for server in status.servers.iter().flatten() {
        let state = match &server.readiness {
            Readiness::Primary => "primary".to_string(),
            Readiness::Ready => "standby, ready for a failover (slot synced)".to_string(),
            Readiness::NotReady { why } => format!("standby, NOT ready for a failover: {why}"),
            Readiness::Unknown { why } => format!("unknown: {why}"),
        };
        lines.push(("server", format!("{} {state}", server.host)));
    }
}

/// The table's lines: its rows, and in poll mode the unsent ones.
fn table_lines(status: &Status, lines: &mut Vec<(&'static str, String)>) {
    let Some(rows) = status.outbox_rows else {
        let error = status.table_error.as_deref();
        let why = error.unwrap_or("the table could not be read");
        lines.push(("outbox rows", format!("unknown: {why}")));
        return;
    };
    lines.push(("outbox rows", format!("{rows} in {}", status.table)));
    let oldest = status.oldest_row_age_seconds.map(human_age);
    lines.push(("oldest row age", oldest.unwrap_or_else(|| "no rows".into())));
    if let Some(unsent) = status.unsent_rows {
        lines.push(("unsent rows", format!("{unsent} (published_at IS NULL)")));
        let oldest = status.oldest_unsent_age_seconds.map(human_age);
        lines.push((
            "oldest unsent age",
            oldest.unwrap_or_else(|| "no unsent rows".into()),
        ));
    }
    if let Some(error) = &status.table_error {
        lines.push(("table problem", error.clone()));
    }
}

/// The running relay's lines: readiness, broker, stuck message.
fn relay_lines(status: &Status, lines: &mut Vec<(&'static str, String)>) {
    let addr = status.relay_addr.as_deref().unwrap_or("off");
    let Some(readiness) = &status.relay_readiness else {
        lines.push(("relay", format!("no answer at {addr} (--metrics-addr)")));
        lines.push((
            "stuck message",
            "unknown (only a running relay knows it)".into(),
        ));
        return;
    };
    lines.push(("relay", format!("{readiness} (/readyz at {addr})")));
    let broker = status.broker.clone();
    lines.push(("broker", broker.unwrap_or_else(|| "not connected".into())));
    let postgres = status.postgres.clone();
    lines.push((
        "postgres",
        postgres.unwrap_or_else(|| "not streaming".into()),
    ));
    let stuck = status.stuck_message_id.clone();
    lines.push(("stuck message", stuck.unwrap_or_else(|| "none".into())));
}

/// One shard's slot on one line: `2: outbox_slot_2 ok, pid 42, lag …, retained WAL …`.
fn shard_line(shard: &ShardSlot) -> String {
    let bytes = |value: Option<i64>| value.map(human_bytes).unwrap_or_else(|| "unknown".into());
    match shard.slot_state {
        "ok" => format!(
            "{}: {} ok, {}, lag {}, retained WAL {}, wal_status {}",
            shard.shard,
            shard.slot,
            shard
                .active_pid
                .map(|pid| format!("pid {pid}"))
                .unwrap_or_else(|| "no relay streaming".into()),
            bytes(shard.lag_bytes),
            bytes(shard.retained_wal_bytes),
            shard.wal_status.as_deref().unwrap_or("unknown")
        ),
        state => format!(
            "{}: {} {}",
            shard.shard,
            shard.slot,
            state.to_ascii_uppercase()
        ),
    }
}

pub(crate) fn human_bytes(value: i64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if value.unsigned_abs() < 1024 {
        return format!("{value} bytes");
    }
    let mut scaled = value as f64;
    let mut unit = "bytes";
    for next in UNITS {
        if scaled.abs() < 1024.0 {
            break;
        }
        scaled /= 1024.0;
        unit = next;
    }
    format!("{scaled:.1} {unit} ({value} bytes)")
}

fn human_age(seconds: f64) -> String {
    let total = seconds.max(0.0).round() as u64;
    let (days, rest) = (total / 86_400, total % 86_400);
    let (hours, rest) = (rest / 3_600, rest % 3_600);
    let (minutes, seconds) = (rest / 60, rest % 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{seconds}s"),
        (0, 0, _) => format!("{minutes}m {seconds}s"),
        (0, _, _) => format!("{hours}h {minutes}m"),
        _ => format!("{days}d {hours}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> Status {
        Status {
            mode: "wal",
            slot: "outbox_slot".into(),
            slot_state: "ok",
            active_pid: Some(4242),
            lag_bytes: Some(3 * 1024 * 1024),
            retained_wal_bytes: Some(100),
            wal_status: Some("reserved".into()),
            safe_wal_size_bytes: None,
            confirmed_flush_lsn: Some("0/16B3748".into()),
            restart_lsn: Some("0/16B3710".into()),
            current_wal_lsn: Some("0/16B3800".into()),
            invalidation_reason: None,
            inactive_since: None,
            conflicting: None,
            failover: None,
            synced: None,
            idle_replication_slot_timeout: None,
            synchronized_standby_slots: None,
            waiting_for_standby: None,
            table: "outbox".into(),
            outbox_rows: Some(12),
            oldest_row_age_seconds: Some(192.4),
            unsent_rows: None,
            oldest_unsent_age_seconds: None,
            table_error: None,
            relay_addr: Some("127.0.0.1:9187".into()),
            relay_readiness: Some("stuck message 0f9c".into()),
            stuck_message_known: true,
            stuck_message_id: Some("0f9c".into()),
            broker: Some("rabbit-2:5672".into()),
            postgres: Some("pg-1:5432".into()),
            servers: None,
            shards: None,
        }
    }

    /// What a newer server reports is shown where the server has it, and only there.
    #[test]
    fn newer_servers_columns_appear_only_where_the_server_has_them() {
        let old = render(&status());
        assert!(!old.contains("failover slot"), "{old}");
        assert!(!old.contains("invalidation_reason"), "{old}");
        let mut s = status();
        s.slot_state = "lost";
        s.invalidation_reason = Some("idle_timeout".into());
        s.failover = Some(true);
        s.synced = Some(false);
        s.idle_replication_slot_timeout = Some("3600s".into());
        let text = render(&s);
        assert!(text.contains("LOST (invalidated: idle_timeout)"), "{text}");
        assert!(text.contains("invalidation_reason  idle_timeout"), "{text}");
        assert!(text.contains("failover slot        yes"), "{text}");
        assert!(text.contains("inactive since       active"), "{text}");
        assert!(text.contains("idle slot timeout    3600s"), "{text}");
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(json["invalidation_reason"], "idle_timeout");
        assert_eq!(json["failover"], true);
    }

    #[test]
    fn shards_get_a_line_each_and_json_lists_them_only_when_sharded() {
        let json = serde_json::to_value(status()).expect("json");
        assert!(json.get("shards").is_none(), "unsharded JSON is unchanged");
        let mut s = status();
        s.slot = "outbox_slot_1".into();
        s.slot_state = "missing";
        let shard = |k: u32, state: &'static str| ShardSlot {
            shard: k,
            slot: format!("outbox_slot_{k}"),
            slot_state: state,
            active_pid: (state == "ok").then_some(40 + k as i32),
            lag_bytes: Some(10),
            retained_wal_bytes: Some(2048),
            wal_status: Some("reserved".into()),
            confirmed_flush_lsn: None,
        };
        s.shards = Some(vec![shard(0, "ok"), shard(1, "missing")]);
        assert_eq!(s.probe(), Probe::SlotProblem);
        let text = render(&s);
        // The widest key without the slot details is "oldest row age" (14).
        for (key, value) in [
            ("shards", "2; the slot lines below are the worst shard's"),
            (
                "shard",
                "0: outbox_slot_0 ok, pid 40, lag 10 bytes, retained WAL 2.0 KiB",
            ),
            ("shard", "1: outbox_slot_1 MISSING\n"),
            ("slot", "outbox_slot_1 MISSING"),
        ] {
            let expected = format!("{key:<14}  {value}");
            assert!(text.contains(&expected), "{expected:?} missing in:\n{text}");
        }
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(json["shards"][1]["slot_state"], "missing");
    }

    #[test]
    fn the_broker_in_use_is_the_info_sample_that_is_one() {
        let page = "# TYPE outbox_relay_broker_info gauge\n\
                    outbox_relay_broker_info{node=\"h1:5672\"} 0\n\
                    outbox_relay_broker_info{node=\"h2:5672\"} 1\n\
                    outbox_relay_ready 1\n";
        assert_eq!(
            in_use(page, BROKER_INFO, NODE_LABEL).as_deref(),
            Some("h2:5672")
        );
        assert_eq!(
            in_use("outbox_relay_ready 1\n", BROKER_INFO, NODE_LABEL),
            None
        );
    }

    #[test]
    fn table_shows_every_field() {
        let text = render(&status());
        for expected in [
            "slot                 outbox_slot\n",
            "active pid           4242\n",
            "lag                  3.0 MiB (3145728 bytes)\n",
            "retained WAL         100 bytes\n",
            "wal_status           reserved\n",
            "safe_wal_size        unlimited",
            "confirmed_flush_lsn  0/16B3748\n",
            "restart_lsn          0/16B3710\n",
            "outbox rows          12 in outbox\n",
            "oldest row age       3m 12s\n",
            "stuck message        0f9c\n",
            "broker               rabbit-2:5672\n",
        ] {
            assert!(text.contains(expected), "{expected:?} missing in:\n{text}");
        }
        assert_eq!(status().probe(), Probe::Healthy);
    }

    #[test]
    fn missing_slot_is_a_probe_failure_and_says_what_to_do() {
        let mut s = status();
        s.slot_state = "missing";
        s.relay_readiness = None;
        s.stuck_message_known = false;
        assert_eq!(s.probe(), Probe::SlotProblem);
        let text = render(&s);
        assert!(text.contains("MISSING: run `outbox-relay setup`"), "{text}");
        assert!(
            text.contains("unknown (only a running relay knows it)"),
            "{text}"
        );
    }

    #[test]
    fn poll_mode_shows_the_unsent_backlog_and_ignores_the_slot() {
        let mut s = status();
        s.mode = "poll";
        s.slot_state = "unused";
        s.unsent_rows = Some(7);
        s.oldest_unsent_age_seconds = Some(65.0);
        assert_eq!(s.probe(), Probe::Healthy);
        let text = render(&s);
        // The widest key without the slot lines is "oldest unsent age" (17).
        for (key, value) in [
            ("slot", "not used (--mode poll)"),
            ("unsent rows", "7 (published_at IS NULL)"),
            ("oldest unsent age", "1m 5s"),
        ] {
            let expected = format!("{key:<17}  {value}\n");
            assert!(text.contains(&expected), "{expected:?} missing in:\n{text}");
        }
        assert!(!text.contains("wal_status"), "{text}");
        s.table_error = Some("no published_at column".into());
        assert_eq!(s.probe(), Probe::TableProblem);
        assert!(render(&s).contains("table problem      no published_at"));
    }

    #[test]
    fn ages_read_naturally() {
        assert_eq!(human_age(5.2), "5s");
        assert_eq!(human_age(3_700.0), "1h 1m");
        assert_eq!(human_age(90_000.0), "1d 1h");
    }
}
