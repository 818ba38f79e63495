//! The outbox table as polling mode reads it, and the SQL it runs on it.
//!
//! Rows are read with every contract column cast to `text`, under the same session settings
//! as the WAL mode's replication connection (ISO dates in UTC, hex bytea), and turned into the
//! shape the decoder produces: a `Relation` naming the columns with their real type OIDs (so
//! the mapper treats jsonb as JSON and bytea as hex) and a `Tuple` of text values. The mapper
//! then cannot tell a polled row from a streamed one, which is the point: one mapping.

use bytes::Bytes;
use tokio_postgres::{Client, Row};

use crate::config::OutboxNames;
use crate::db::quote_ident;
use crate::error::RelayError;
use crate::mapper::{columns, Layout};
use crate::pgoutput::{Column, Relation, Tuple, TupleValue};

/// Pinned on every polling connection: the text shapes the mapper parses (the same values as
/// `db::PINNED_SESSION_SETTINGS` pins on the replication connection).
pub const SESSION_SETTINGS: &str = "SET datestyle = 'ISO'; SET timezone = 'UTC'; \
                                    SET bytea_output = 'hex'; SET extra_float_digits = 3;";

/// Marks a claimed row published; the claim query only returns rows where it is NULL.
pub const PUBLISHED_AT: &str = "published_at";

/// The contract columns polling mode reads when the table has them; the rest are ignored.
const READ: [&str; 9] = [
    columns::ID,
    columns::EVENT_TYPE,
    columns::PAYLOAD,
    columns::HEADERS,
    columns::CREATED_AT,
    columns::EXCHANGE,
    columns::ROUTING_KEY,
    columns::AGGREGATE_TYPE,
    columns::AGGREGATE_ID,
];

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
    names: &OutboxNames,
) -> Result<Option<Backlog>, RelayError> {
    let table = names.qualified_table();
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
    /// The columns read, in SELECT order, with their type OIDs.
    relation: Relation,
    /// The id column's type as SQL (`uuid`, `bigint`, …), to cast the ids of a batch back.
    id_type: String,
    layout: Layout,
}

/// The table's columns in order: name, type OID and type name. `TableMissing` when the table
/// does not exist. Shared by polling and `resync`, which both read rows with SQL.
pub async fn table_columns(
    client: &Client,
    names: &OutboxNames,
) -> Result<Vec<(String, u32, String)>, RelayError> {
    let (schema, table) = names.table_parts();
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid, pg_catalog.format_type(a.atttypid, NULL) \
             FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p') \
               AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
            &[&schema, &table],
        )
        .await?;
    if rows.is_empty() {
        return Err(RelayError::TableMissing {
            table: names.table.clone(),
        });
    }
    Ok(rows
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect())
}

impl OutboxTable {
    /// Reads the table's columns. Definite errors: the table is missing, or lacks a column
    /// polling needs (`id`, `event_type`, `created_at` to claim in order, `published_at`).
    pub async fn discover(client: &Client, names: &OutboxNames) -> Result<Self, RelayError> {
        let (schema, table) = names.table_parts();
        let all = table_columns(client, names).await?;
        for needed in [columns::CREATED_AT, PUBLISHED_AT] {
            if !all.iter().any(|(name, _, _)| name == needed) {
                return Err(RelayError::Config(format!(
                    "The outbox table {} has no column \"{needed}\", which polling mode needs \
                     (it claims unpublished rows in created_at order and marks them in \
                     published_at). Fix: run `outbox-relay setup --mode poll`, or add the \
                     column (see sql/outbox_poll.sql)",
                    names.table
                )));
            }
        }
        let read: Vec<&(String, u32, String)> = all
            .iter()
            .filter(|(name, _, _)| READ.contains(&name.as_str()))
            .collect();
        let relation = Relation {
            oid: 0,
            namespace: schema.to_string(),
            name: table.to_string(),
            replica_identity: b'd',
            columns: read
                .iter()
                .map(|(name, type_oid, _)| Column {
                    flags: 0,
                    name: name.clone(),
                    type_oid: *type_oid,
                    type_modifier: -1,
                })
                .collect(),
        };
        // Names the table and the missing column (id or event_type).
        let layout = Layout::for_relation(&relation)?;
        let id_type = read
            .iter()
            .find(|(name, _, _)| name == columns::ID)
            .map(|(_, _, sql_type)| sql_type.clone())
            .unwrap_or_else(|| "text".into());
        Ok(Self {
            qualified: names.qualified_table(),
            relation,
            id_type,
            layout,
        })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The claim query: the oldest `limit` unpublished rows no other worker holds, locked
    /// until this transaction ends. With the partial index on (created_at) WHERE
    /// published_at IS NULL it reads only unpublished rows. The limit is a literal so that a
    /// prepared statement never falls back to a generic plan that guesses the row count.
    pub fn claim_sql(&self, limit: u32) -> String {
        let select: Vec<String> = self
            .relation
            .columns
            .iter()
            .map(|c| format!("{}::text", quote_ident(&c.name)))
            .collect();
        // ORDER BY names the table's column: a bare `created_at` would mean the output
        // column `created_at::text`, and sorting that text needs a Sort of every unpublished
        // row instead of reading the index in order and stopping at the limit.
        format!(
            "SELECT {} FROM {table} WHERE {PUBLISHED_AT} IS NULL ORDER BY {table}.{} \
             LIMIT {limit} FOR UPDATE SKIP LOCKED",
            select.join(", "),
            quote_ident(columns::CREATED_AT),
            table = self.qualified,
        )
    }

    /// Marks a batch published, by the ids as text (`$1 text[]`), in one statement.
    pub fn mark_sql(&self) -> String {
        format!(
            "UPDATE {} SET {PUBLISHED_AT} = now() WHERE {} = ANY($1::text[]::{}[])",
            self.qualified,
            quote_ident(columns::ID),
            self.id_type
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
        (0..self.relation.columns.len())
            .map(|i| {
                let value: Option<&str> = row.try_get(i)?;
                Ok(match value {
                    None => TupleValue::Null,
                    Some(text) => TupleValue::Text(Bytes::copy_from_slice(text.as_bytes())),
                })
            })
            .collect::<Result<Vec<_>, RelayError>>()
            .map(Tuple)
    }
}
