//! Concurrent outbox writers: N connections inserting rows in transactions of varying size,
//! the way an application writes its outbox.
//!
//! The writers share one row budget: each claims the size of its next transaction from it
//! before `BEGIN`, so exactly `rows` rows are committed in total, whatever the interleaving
//! (or fewer, when a deadline stops them first). A writer can be paced (one transaction per
//! tick) and can send `NOTIFY` after each commit, as an application waking a polling relay.
//! Transaction sizes come from a small seeded generator, so a run is repeatable. Every row's
//! id (`RETURNING id`) is recorded with its transaction's commit time only after `COMMIT`
//! succeeded: the list is what a relay must deliver.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_postgres::NoTls;

use outbox_common::quote::quote_ident;
use outbox_relay::internals::parse_url;
use outbox_testkit::SplitMix64;

/// What the writers insert, and how much.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Concurrent connections.
    pub writers: u32,
    /// Rows committed in total, over all writers.
    pub rows: u64,
    /// Each transaction inserts 1..=max_txn_rows rows.
    pub max_txn_rows: u32,
    /// The outbox table, optionally schema-qualified.
    pub table: String,
    /// The `event_type` of every row (the routing key of its message).
    pub event_type: String,
    /// Seeds the transaction sizes; writer `w` uses `seed ^ w`.
    pub seed: u64,
    /// Each writer commits at most one transaction per this interval (a fixed rate).
    pub pace: Option<Duration>,
    /// No transaction starts at or after this instant.
    pub until: Option<Instant>,
    /// `NOTIFY` this channel after each commit (a separate statement, outside the transaction).
    pub notify: Option<String>,
    /// Length of the `note` padding in each payload; [`ORDER_NOTE_LEN`] makes a ~200-byte order.
    pub note_len: u32,
    /// Call the table's `<table>_emit` function (docs/emit.md: the event goes into the WAL
    /// only) instead of inserting a row; the id it returns is the message id.
    pub emit: bool,
}

/// Padding that makes a writer's payload, and the benchmark's seeded rows, about 200 bytes of
/// JSON: the reference benchmark's message size.
pub const ORDER_NOTE_LEN: u32 = 130;

impl WriterOptions {
    /// `rows` rows from `writers` connections in 1..=`max_txn_rows`-row transactions, as fast as
    /// they can, with small payloads.
    pub fn new(writers: u32, rows: u64, max_txn_rows: u32, table: &str, event_type: &str) -> Self {
        WriterOptions {
            writers,
            rows,
            max_txn_rows,
            table: table.to_string(),
            event_type: event_type.to_string(),
            seed: 1,
            pace: None,
            until: None,
            notify: None,
            note_len: 0,
            emit: false,
        }
    }
}

/// One committed row.
#[derive(Debug, Clone)]
pub struct CommittedRow {
    /// The row's `id` as text: the message's `message_id`.
    pub id: String,
    pub writer: u32,
    /// When its transaction's `COMMIT` returned.
    pub committed_at: Instant,
}

/// Everything the writers committed.
#[derive(Debug, Default)]
pub struct Written {
    /// Each writer's rows in commit order, writers one after another.
    pub rows: Vec<CommittedRow>,
    pub transactions: u64,
    /// When the first `BEGIN` was sent.
    pub started: Option<Instant>,
}

impl Written {
    pub fn first_commit(&self) -> Option<Instant> {
        self.rows.iter().map(|r| r.committed_at).min()
    }

    pub fn last_commit(&self) -> Option<Instant> {
        self.rows.iter().map(|r| r.committed_at).max()
    }

    /// Every committed id: what the relay must deliver.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.rows.iter().map(|r| r.id.as_str())
    }
}

/// Runs the writers until `options.rows` rows are committed; fails on the first error.
pub async fn write(database_url: &str, options: &WriterOptions) -> Result<Written> {
    if options.writers == 0 || options.max_txn_rows == 0 {
        bail!("writers and max-txn-rows must be at least 1");
    }
    let sql = if options.emit {
        emit_sql(&options.table)
    } else {
        insert_sql(&options.table)
    };
    let notify = options
        .notify
        .as_ref()
        .map(|channel| format!("NOTIFY {}", quote_ident(channel)));
    let budget = Arc::new(AtomicU64::new(options.rows));
    // Connect everyone first, so the first commits are not staggered by connection setup.
    let mut clients = Vec::new();
    for w in 0..options.writers {
        clients.push(connect(database_url, w).await?);
    }
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for (w, client) in (0u32..).zip(clients) {
        let writer = Writer {
            id: w,
            client,
            sql: sql.clone(),
            event_type: options.event_type.clone(),
            max_txn_rows: options.max_txn_rows,
            sizes: SplitMix64(options.seed ^ u64::from(w)),
            budget: Arc::clone(&budget),
            pace: options.pace,
            until: options.until,
            notify: notify.clone(),
            note: "x".repeat(options.note_len as usize),
        };
        tasks.spawn(writer.run());
    }
    let mut written = Written {
        started: Some(started),
        ..Written::default()
    };
    while let Some(joined) = tasks.join_next().await {
        let (rows, transactions) = joined.context("a writer task panicked")??;
        written.rows.extend(rows);
        written.transactions += transactions;
    }
    Ok(written)
}

/// `INSERT … RETURNING id::text` for one row; `$1` event type, `$2` writer, `$3` row number,
/// `$4` the padding note.
fn insert_sql(table: &str) -> String {
    let qualified = match table.split_once('.') {
        Some((schema, name)) => format!("{}.{}", quote_ident(schema), quote_ident(name)),
        None => quote_ident(table),
    };
    format!(
        "INSERT INTO {qualified} (event_type, payload) \
         VALUES ($1, jsonb_build_object('writer', $2::int, 'n', $3::bigint, 'note', $4::text)) \
         RETURNING id::text"
    )
}

/// `SELECT <table>_emit(…)::text` for one event, with the same parameters and payload as
/// [`insert_sql`]: the function `setup` creates beside the table (docs/emit.md).
fn emit_sql(table: &str) -> String {
    let function = match table.split_once('.') {
        Some((schema, name)) => format!(
            "{}.{}",
            quote_ident(schema),
            quote_ident(&format!("{name}_emit"))
        ),
        None => quote_ident(&format!("{table}_emit")),
    };
    format!(
        "SELECT {function}($1, jsonb_build_object('writer', $2::int, 'n', $3::bigint, 'note', $4::text))::text"
    )
}

async fn connect(url: &str, writer: u32) -> Result<tokio_postgres::Client> {
    let mut config = parse_url(url)?;
    config.application_name(format!("outbox-bench-writer-{writer}"));
    config.connect_timeout(Duration::from_secs(10));
    let (client, connection) = config
        .connect(NoTls)
        .await
        .with_context(|| format!("writer {writer} cannot connect to PostgreSQL"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "writer connection ended");
        }
    });
    Ok(client)
}

struct Writer {
    id: u32,
    client: tokio_postgres::Client,
    sql: String,
    event_type: String,
    max_txn_rows: u32,
    sizes: SplitMix64,
    budget: Arc<AtomicU64>,
    pace: Option<Duration>,
    until: Option<Instant>,
    notify: Option<String>,
    note: String,
}

impl Writer {
    /// Commits transactions until the shared budget is spent; returns its rows and how many
    /// transactions it committed.
    async fn run(mut self) -> Result<(Vec<CommittedRow>, u64)> {
        let statement = self
            .client
            .prepare(&self.sql)
            .await
            .with_context(|| format!("writer {} cannot prepare its statement", self.id))?;
        let mut rows = Vec::new();
        let mut transactions = 0u64;
        let writer = i32::try_from(self.id)?;
        let mut n: i64 = 0;
        let mut ticks = self.pace.map(|every| {
            let mut ticks = tokio::time::interval(every);
            // A late tick pushes the next one back instead of making it up in a burst.
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks
        });
        loop {
            if let Some(ticks) = ticks.as_mut() {
                ticks.tick().await;
            }
            if self.until.is_some_and(|until| Instant::now() >= until) {
                return Ok((rows, transactions));
            }
            let wanted = 1 + self.sizes.next_u64() % u64::from(self.max_txn_rows);
            let size = claim(&self.budget, wanted);
            if size == 0 {
                return Ok((rows, transactions));
            }
            let txn = self.client.transaction().await?;
            let mut ids = Vec::with_capacity(size as usize);
            for _ in 0..size {
                n += 1;
                let row = txn
                    .query_one(&statement, &[&self.event_type, &writer, &n, &self.note])
                    .await
                    .with_context(|| format!("writer {} cannot write its event", self.id))?;
                ids.push(row.try_get::<_, String>(0)?);
            }
            txn.commit()
                .await
                .with_context(|| format!("writer {} cannot commit", self.id))?;
            let committed_at = Instant::now();
            if let Some(notify) = &self.notify {
                self.client
                    .batch_execute(notify)
                    .await
                    .with_context(|| format!("writer {} cannot notify", self.id))?;
            }
            transactions += 1;
            rows.extend(ids.into_iter().map(|id| CommittedRow {
                id,
                writer: self.id,
                committed_at,
            }));
        }
    }
}

/// Takes up to `wanted` rows from the budget; 0 once it is spent.
fn claim(budget: &AtomicU64, wanted: u64) -> u64 {
    match budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
        (left > 0).then(|| left - left.min(wanted))
    }) {
        Ok(left) => left.min(wanted),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_spent_exactly() {
        let budget = AtomicU64::new(10);
        assert_eq!(claim(&budget, 4), 4);
        assert_eq!(claim(&budget, 4), 4);
        assert_eq!(claim(&budget, 4), 2);
        assert_eq!(claim(&budget, 4), 0);
    }

    #[test]
    fn sizes_are_repeatable_and_spread() {
        let sizes = |seed| {
            let mut g = SplitMix64(seed);
            (0..1000).map(|_| 1 + g.next_u64() % 10).collect::<Vec<_>>()
        };
        assert_eq!(sizes(7), sizes(7));
        assert_ne!(sizes(7), sizes(8));
        for size in 1..=10 {
            assert!(sizes(7).contains(&size), "size {size} never drawn");
        }
    }

    #[test]
    fn table_names_are_quoted() {
        assert!(insert_sql("outbox").contains("INTO \"outbox\" "));
        assert!(insert_sql("app.Events").contains("INTO \"app\".\"Events\" "));
        assert!(emit_sql("outbox").starts_with("SELECT \"outbox_emit\"($1, "));
        assert!(emit_sql("app.Events").starts_with("SELECT \"app\".\"Events_emit\"($1, "));
    }
}
