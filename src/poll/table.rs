//! The SQL polling mode runs on the outbox table: claim a batch and mark it published, delete
//! what was published long enough ago, read the backlog. Which columns it reads and how a row
//! becomes a tuple for the mapper is `outbox_table`'s, shared with `resync`: this module
//! must never read the catalog for columns or convert rows itself, or the two ways of reading
//! the table drift apart.

use tokio_postgres::{Client, Row};

use crate::config::{OnPublished, TableName};
use crate::db::quote_ident;
use crate::error::RelayError;
use crate::mapper::Layout;
use crate::outbox_table::columns::{self, ColumnMap, PUBLISHED_AT};
use crate::outbox_table::TextRelation;
use crate::pgoutput::Tuple;

/// The rows polling mode has not sent yet (`published_at IS NULL`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Backlog {
    pub unsent_rows: i64,
    /// `None` when there is no unsent row.
    pub oldest_unsent_age_seconds: Option<f64>,
}

/// Reads the backlog; `None` when the table has no `published_at` column (a WAL-mode
/// table). Both aggregates read only the claim index's entries (the unsent rows):
/// `min(created_at)` its first one, so the query stays cheap however many sent rows the
/// table keeps.
pub async fn read_backlog(
    client: &Client,
    outbox: &TableName,
) -> Result<Option<Backlog>, RelayError> {
    let table = outbox.qualified_table();
    let has_column = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute \
             WHERE attrelid = $1::text::regclass AND attname = $2 AND attnum > 0 \
               AND NOT attisdropped)",
            &[&table, &PUBLISHED_AT],
        )
        .await?;
    if !has_column.get::<_, bool>(0) {
        return Ok(None);
    }
    let row = client
        .query_one(
            &format!(
                "SELECT count(*), extract(epoch FROM now() - min({created}))::float8 \
                 FROM {table} WHERE {PUBLISHED_AT} IS NULL",
                created = quote_ident(columns::CREATED_AT),
            ),
            &[],
        )
        .await?;
    Ok(Some(Backlog {
        unsent_rows: row.get(0),
        oldest_unsent_age_seconds: row.get(1),
    }))
}

/// What polling mode knows about the outbox table, learned from the catalog on each connect
/// (a schema change is picked up at the next reconnect).
#[derive(Debug, Clone)]
pub struct OutboxTable {
    /// `"schema"."table"`, quoted for SQL text.
    qualified: String,
    /// The columns read, as text.
    text: TextRelation,
}

impl OutboxTable {
    /// Reads the table's columns. Definite errors: the table is missing, or lacks a column
    /// polling needs (`id`, `event_type`, `created_at` to claim in order, `published_at`).
    pub async fn discover(client: &Client, outbox: &TableName) -> Result<Self, RelayError> {
        let needs = [columns::CREATED_AT, PUBLISHED_AT];
        // Polling reads the table `setup` creates: `poll` refuses a column map at start.
        let map = ColumnMap::default();
        let text = TextRelation::discover(client, outbox, &map, &needs, |needed| {
            RelayError::Config(format!(
                "The outbox table {} has no column \"{needed}\", which polling mode needs \
                 (it claims unpublished rows in created_at order and marks them in \
                 published_at). Fix: run `outbox-relay setup --mode poll`, or add the \
                 column (see sql/outbox_poll.sql)",
                outbox
            ))
        })
        .await?;
        Ok(Self {
            qualified: outbox.qualified_table(),
            text,
        })
    }

    pub fn layout(&self) -> &Layout {
        self.text.layout()
    }

    /// The claim query: takes the oldest `limit` unpublished rows no other worker holds,
    /// marks them published and returns them, in one statement; the rows stay locked and the
    /// mark uncommitted until the transaction ends, which is after every confirm (a rollback
    /// leaves them unpublished). One statement instead of a SELECT and an UPDATE saves a
    /// round trip and a second index lookup per batch (issue 16).
    ///
    /// With the partial index on (created_at) WHERE published_at IS NULL the inner SELECT
    /// reads only unpublished rows. RETURNING has no order, so the rows are numbered in claim
    /// order (created_at, and index order among equal created_at, as a SELECT would return
    /// them) and sorted by that number: a sort of the batch only. The limit is a literal so
    /// that a prepared statement never falls back to a generic plan that guesses the row
    /// count.
    ///
    /// With [`OnPublished::Delete`] the claimed rows are deleted instead of marked, in the
    /// same statement: the transaction that commits after every confirm removes them.
    pub fn claim_sql(&self, limit: u32, on_published: OnPublished) -> String {
        let id = quote_ident(columns::ID);
        let settle = match on_published {
            OnPublished::Mark => format!(
                "UPDATE {table} SET {PUBLISHED_AT} = now() FROM claimed",
                table = self.qualified
            ),
            OnPublished::Delete => format!("DELETE FROM {} USING claimed", self.qualified),
        };
        // ORDER BY names the table's column: the index is read in order up to the limit.
        format!(
            "WITH claimed AS (\
             SELECT claimed_id, relay_claim_order FROM unnest(ARRAY(\
             SELECT {id} FROM {table} WHERE {PUBLISHED_AT} IS NULL ORDER BY {table}.{created} \
             LIMIT {limit} FOR UPDATE SKIP LOCKED)) WITH ORDINALITY AS c(claimed_id, relay_claim_order)), \
             settled AS ({settle} \
             WHERE {table}.{id} = claimed.claimed_id \
             RETURNING claimed.relay_claim_order, {table}.*) \
             SELECT {select} FROM settled ORDER BY relay_claim_order",
            select = self.text.select_list(),
            created = quote_ident(columns::CREATED_AT),
            table = self.qualified,
        )
    }

    /// Deletes up to `limit` rows published more than `$1` seconds ago (float8). The
    /// created_at condition (a row is published after it is created) lets the created_at
    /// index find them; SKIP LOCKED keeps two relays' cleanups out of each other's way.
    pub fn cleanup_sql(&self, limit: u32) -> String {
        let id = quote_ident(columns::ID);
        format!(
            "DELETE FROM {table} WHERE {id} IN (\
             SELECT {id} FROM {table} \
             WHERE {created} < now() - $1::float8 * interval '1 second' \
             AND {PUBLISHED_AT} < now() - $1::float8 * interval '1 second' \
             ORDER BY {created} LIMIT {limit} FOR UPDATE SKIP LOCKED)",
            table = self.qualified,
            created = columns::CREATED_AT,
        )
    }

    /// Whether the table has a partial index for unpublished rows (a warning if not: the
    /// claim query then reads past every published row still in the table).
    pub async fn has_claim_index(&self, client: &Client) -> Result<bool, RelayError> {
        let row = client
            .query_opt(
                "SELECT 1 FROM pg_catalog.pg_index i \
                 WHERE i.indrelid = $1::text::regclass AND i.indpred IS NOT NULL \
                   AND pg_catalog.pg_get_expr(i.indpred, i.indrelid) LIKE '%published_at IS NULL%' \
                 LIMIT 1",
                &[&self.qualified],
            )
            .await?;
        Ok(row.is_some())
    }

    /// One claimed row as the decoder would have produced it: text values in column order.
    pub fn tuple(&self, row: &Row) -> Result<Tuple, RelayError> {
        self.text.tuple(row)
    }
}
