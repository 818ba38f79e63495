//! The SQL polling mode runs on the outbox table: claim a batch and mark it published, delete
//! what was published long enough ago, read the backlog. Which columns it reads and how a row
//! becomes a tuple for the mapper is `table::outbox`'s, shared with `resync`: this module
//! must never read the catalog for columns or convert rows itself, or the two ways of reading
//! the table drift apart.

use tokio_postgres::{Client, Row};

use crate::config::{OnPublished, TableName};
use crate::contract::columns::{self, ColumnMap, COLUMN_FLAG, PUBLISHED_AT};
use crate::contract::mapper::Layout;
use crate::error::{ConfigProblem, RelayError};
use crate::pgoutput::Tuple;
use crate::table::outbox::{needs_created_at, TextRelation};
use outbox_common::quote::quote_ident;

/// Why the cleanup needs `created_at` (`poll`'s error when it is unmapped).
pub(crate) const CLEANUP_NEEDS: &str = "the cleanup (--cleanup-interval) finds published rows \
     through it; turn it off with --cleanup-interval 0, or delete rows once published with \
     --on-published delete";

/// `--on-published mark` writes `published_at`: a map that leaves it unmapped can only be
/// read under `--on-published delete` (every row still in the table is then unsent).
pub(crate) fn check_on_published(
    map: &ColumnMap,
    on_published: OnPublished,
) -> Result<(), RelayError> {
    if on_published == OnPublished::Delete || map.column(PUBLISHED_AT).is_some() {
        return Ok(());
    }
    Err(ConfigProblem::PublishedAtUnmapped {
        contract: PUBLISHED_AT,
        flag: COLUMN_FLAG,
    }
    .into())
}

/// The rows polling mode has not sent yet (`published_at IS NULL`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct Backlog {
    pub unsent_rows: i64,
    /// `None` when there is no unsent row, or `created_at` is unmapped.
    pub oldest_unsent_age_seconds: Option<f64>,
}

/// The backlog query of a table whose columns `map` names, built once (the backlog poller
/// runs it every interval).
#[derive(Debug, Clone)]
pub(crate) struct BacklogQuery {
    /// `"schema"."table"`, quoted for SQL text.
    qualified: String,
    /// The table's `published_at` column; `None` when unmapped.
    published: Option<String>,
    sql: String,
}

impl BacklogQuery {
    /// Both aggregates read only the claim index's entries (the unsent rows): `min` of the
    /// creation time its first one, so the query stays cheap however many sent rows the
    /// table keeps. With `published_at` unmapped every row is unsent (only `--on-published
    /// delete` reads such a table); with `created_at` unmapped the age is unknown.
    pub(crate) fn new(outbox: &TableName, map: &ColumnMap) -> Self {
        let qualified = outbox.qualified_table();
        let published = map.column(PUBLISHED_AT).map(str::to_string);
        let unsent = published
            .as_deref()
            .map(|column| format!(" WHERE {} IS NULL", quote_ident(column)))
            .unwrap_or_default();
        let oldest = match map.column(columns::CREATED_AT) {
            Some(created) => format!(
                "extract(epoch FROM now() - min({}))::float8",
                quote_ident(created)
            ),
            None => "NULL::float8".to_string(),
        };
        Self {
            sql: format!("SELECT count(*), {oldest} FROM {qualified}{unsent}"),
            qualified,
            published,
        }
    }

    /// The table's `published_at` column, when mapped (for errors).
    pub(crate) fn published_column(&self) -> Option<&str> {
        self.published.as_deref()
    }

    /// Reads the backlog; `None` when the table lacks the mapped `published_at` column (a
    /// WAL-mode table).
    pub(crate) async fn read(&self, client: &Client) -> Result<Option<Backlog>, RelayError> {
        if let Some(published) = &self.published {
            let has_column = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute \
                     WHERE attrelid = $1::text::regclass AND attname = $2 AND attnum > 0 \
                       AND NOT attisdropped)",
                    &[&self.qualified, published],
                )
                .await?;
            if !has_column.get::<_, bool>(0) {
                return Ok(None);
            }
        }
        let row = client.query_one(&self.sql, &[]).await?;
        Ok(Some(Backlog {
            unsent_rows: row.get(0),
            oldest_unsent_age_seconds: row.get(1),
        }))
    }
}

/// What a claimed row becomes once its batch is confirmed.
#[derive(Debug, Clone)]
enum Settle {
    /// `published_at` (the quoted column) is set.
    Mark(String),
    Delete,
}

/// What polling mode knows about the outbox table, learned from the catalog on each connect
/// (a schema change is picked up at the next reconnect). Every column name its SQL uses is
/// the column map's, quoted here once: the statements are prepared per connect and rows are
/// read by position.
#[derive(Debug, Clone)]
pub struct OutboxTable {
    /// `"schema"."table"`, quoted for SQL text.
    qualified: String,
    /// The columns read, as text.
    text: TextRelation,
    /// The quoted `id` column.
    id: String,
    /// The quoted `created_at` column; `None` when unmapped (claims then go in id order).
    created: Option<String>,
    /// The quoted `published_at` column; `None` when unmapped (`--on-published delete`).
    published: Option<String>,
    settle: Settle,
    /// For the cleanup's error when `created_at` is unmapped.
    outbox: TableName,
    map: ColumnMap,
}

impl OutboxTable {
    /// Reads the table's columns, each under the name `map` gives it. Definite errors: the
    /// table is missing; `on_published` is `Mark` with `published_at` unmapped
    /// ([`check_on_published`]); it lacks a mapped column polling needs (`created_at` to
    /// claim in order, `published_at` to claim and mark) or one every message needs (`id`,
    /// `event_type`).
    pub async fn discover(
        client: &Client,
        outbox: &TableName,
        map: &ColumnMap,
        on_published: OnPublished,
    ) -> Result<Self, RelayError> {
        check_on_published(map, on_published)?;
        let needs: Vec<&'static str> = [columns::CREATED_AT, PUBLISHED_AT]
            .into_iter()
            .filter(|contract| map.column(contract).is_some())
            .collect();
        let text = TextRelation::discover(client, outbox, map, &needs, |needed| {
            missing_column(outbox, map, needed)
        })
        .await?;
        Ok(Self::new(outbox, text, map, on_published))
    }

    /// For columns already read (`text`, under the names `map` gives them).
    fn new(
        outbox: &TableName,
        text: TextRelation,
        map: &ColumnMap,
        on_published: OnPublished,
    ) -> Self {
        let quoted = |contract| map.column(contract).map(quote_ident);
        let published = quoted(PUBLISHED_AT);
        let settle = match (on_published, &published) {
            (OnPublished::Mark, Some(column)) => Settle::Mark(column.clone()),
            // check_on_published refuses Mark without the column.
            _ => Settle::Delete,
        };
        Self {
            qualified: outbox.qualified_table(),
            text,
            id: quoted(columns::ID).unwrap_or_else(|| quote_ident(columns::ID)),
            created: quoted(columns::CREATED_AT),
            published,
            settle,
            outbox: outbox.clone(),
            map: map.clone(),
        }
    }

    pub fn layout(&self) -> &Layout {
        self.text.layout()
    }

    /// The claim query: takes the oldest `limit` unpublished rows no other worker holds,
    /// marks them published (or deletes them, under `--on-published delete`) and returns
    /// them, in one statement; the rows stay locked and the change uncommitted until the
    /// transaction ends, which is after every confirm (a rollback leaves them unpublished).
    /// One statement instead of a SELECT and an UPDATE saves a round trip and a second index
    /// lookup per batch.
    ///
    /// With the partial index on (created_at) WHERE published_at IS NULL the inner SELECT
    /// reads only unpublished rows. RETURNING has no order, so the rows are numbered in claim
    /// order (created_at, and index order among equal created_at, as a SELECT would return
    /// them) and sorted by that number: a sort of the batch only. The limit is a literal so
    /// that a prepared statement never falls back to a generic plan that guesses the row
    /// count.
    ///
    /// With `created_at` unmapped rows are claimed in id order (insert order for a sequence
    /// or a time-ordered id; polling promises no global order anyway). With `published_at`
    /// unmapped (delete only) every row in the table is unpublished.
    pub fn claim_sql(&self, limit: u32) -> String {
        let (table, id) = (&self.qualified, &self.id);
        let settle = match &self.settle {
            Settle::Mark(published) => {
                format!("UPDATE {table} SET {published} = now() FROM claimed")
            }
            Settle::Delete => format!("DELETE FROM {table} USING claimed"),
        };
        let unsent = self
            .published
            .as_ref()
            .map(|published| format!(" WHERE {published} IS NULL"))
            .unwrap_or_default();
        // ORDER BY names the table's column: the index is read in order up to the limit.
        let order = self.created.as_ref().unwrap_or(id);
        format!(
            "WITH claimed AS (\
             SELECT claimed_id, relay_claim_order FROM unnest(ARRAY(\
             SELECT {id} FROM {table}{unsent} ORDER BY {table}.{order} \
             LIMIT {limit} FOR UPDATE SKIP LOCKED)) WITH ORDINALITY AS c(claimed_id, relay_claim_order)), \
             settled AS ({settle} \
             WHERE {table}.{id} = claimed.claimed_id \
             RETURNING claimed.relay_claim_order, {table}.*) \
             SELECT {select} FROM settled ORDER BY relay_claim_order",
            select = self.text.select_list(),
        )
    }

    /// Deletes up to `limit` rows published more than `$1` seconds ago (float8). The
    /// created_at condition (a row is published after it is created) lets the created_at
    /// index find them; SKIP LOCKED keeps two relays' cleanups out of each other's way.
    /// Needs both columns: `poll` refuses to start the cleanup without them
    /// ([`CLEANUP_NEEDS`], [`check_on_published`]).
    pub fn cleanup_sql(&self, limit: u32) -> Result<String, RelayError> {
        let Some(created) = &self.created else {
            return Err(needs_created_at(&self.outbox, &self.map, CLEANUP_NEEDS));
        };
        let Some(published) = &self.published else {
            return Err(RelayError::Bug(
                "the polling cleanup ran with published_at unmapped".into(),
            ));
        };
        Ok(format!(
            "DELETE FROM {table} WHERE {id} IN (\
             SELECT {id} FROM {table} \
             WHERE {created} < now() - $1::float8 * interval '1 second' \
             AND {published} < now() - $1::float8 * interval '1 second' \
             ORDER BY {created} LIMIT {limit} FOR UPDATE SKIP LOCKED)",
            table = self.qualified,
            id = self.id,
        ))
    }

    /// Whether the table has a partial index for unpublished rows (a warning if not: the
    /// claim query then reads past every published row still in the table). `true` when
    /// `published_at` is unmapped: nothing published stays in the table then. The predicate
    /// is compared as PostgreSQL prints it, with the column quoted by PostgreSQL's rules.
    pub async fn has_claim_index(&self, client: &Client) -> Result<bool, RelayError> {
        let Some(published) = self.map.column(PUBLISHED_AT) else {
            return Ok(true);
        };
        let row = client
            .query_opt(
                "SELECT 1 FROM pg_catalog.pg_index i \
                 WHERE i.indrelid = $1::text::regclass AND i.indpred IS NOT NULL \
                   AND strpos(pg_catalog.pg_get_expr(i.indpred, i.indrelid), \
                              pg_catalog.quote_ident($2) || ' IS NULL') > 0 \
                 LIMIT 1",
                &[&self.qualified, &published],
            )
            .await?;
        Ok(row.is_some())
    }

    /// One claimed row as the decoder would have produced it: text values in column order.
    pub fn tuple(&self, row: &Row) -> Result<Tuple, RelayError> {
        self.text.tuple(row)
    }
}

/// What a table without the claim index costs (`poll` warns of it, `check` too).
pub(crate) const NO_CLAIM_INDEX: &str =
    "no partial index on (created_at) WHERE published_at IS NULL \
     (the columns the column map names): every claim reads past the published rows still in \
     the table";

/// The error for a column polling needs that the table lacks: it names the table's column,
/// the contract's, and the fix.
fn missing_column(outbox: &TableName, map: &ColumnMap, contract: &'static str) -> RelayError {
    let column = map.column(contract).unwrap_or(contract);
    let why = match contract {
        PUBLISHED_AT => {
            "which polling mode needs: it claims the rows where it is NULL and marks \
                         them in it"
        }
        _ => "which polling mode needs: it claims rows in its order",
    };
    // What leaving the column unmapped means, for a map that is not the default.
    let unmapped = (!map.is_default()).then_some(match contract {
        PUBLISHED_AT => "only with --on-published delete",
        _ => "then rows are claimed in id order",
    });
    ConfigProblem::PollColumnMissing {
        outbox: outbox.to_string(),
        column: column.to_string(),
        contract,
        why,
        flag: COLUMN_FLAG,
        unmapped,
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::columns::Preset;

    /// Debezium's table plus `published_at`, read through the Debezium preset with
    /// `published_at` mapped to `published` (`None`: left unmapped, as the preset has it).
    fn debezium(on_published: OnPublished, published: Option<&str>) -> OutboxTable {
        let overrides: Vec<String> = published
            .map(|column| format!("published_at={column}"))
            .into_iter()
            .collect();
        let map = ColumnMap::resolve(Preset::Debezium, &overrides).expect("map");
        let columns = ["id", "aggregatetype", "aggregateid", "type", "payload"];
        let text = crate::table::outbox::text_relation(&columns, &map);
        OutboxTable::new(&TableName::from("outbox"), text, &map, on_published)
    }

    #[test]
    fn the_claim_names_the_mapped_columns_and_goes_in_id_order_without_created_at() {
        let sql = debezium(OnPublished::Mark, Some("sent at")).claim_sql(10);
        assert!(
            sql.contains(
                "SELECT \"id\" FROM \"public\".\"outbox\" WHERE \"sent at\" IS NULL ORDER BY \
                 \"public\".\"outbox\".\"id\" LIMIT 10 FOR UPDATE SKIP LOCKED"
            ),
            "{sql}"
        );
        assert!(
            sql.contains("UPDATE \"public\".\"outbox\" SET \"sent at\" = now() FROM claimed"),
            "{sql}"
        );
        assert!(
            sql.ends_with(
                "SELECT \"id\"::text, \"aggregatetype\"::text, \"aggregateid\"::text, \
                 \"type\"::text, \"payload\"::text FROM settled ORDER BY relay_claim_order"
            ),
            "{sql}"
        );
        assert!(
            !sql.contains("created_at") && !sql.contains("published_at"),
            "{sql}"
        );
    }

    #[test]
    fn delete_without_published_at_claims_every_row_in_the_table() {
        let map = ColumnMap::preset(Preset::Debezium);
        assert!(check_on_published(&map, OnPublished::Delete).is_ok());
        let e = crate::advice::report(
            &check_on_published(&map, OnPublished::Mark).expect_err("mark needs published_at"),
        );
        assert!(
            e.contains("leaves unmapped")
                && e.contains("Fix:")
                && e.contains("--column published_at=COLUMN")
                && e.contains("--on-published delete"),
            "{e}"
        );
        let sql = debezium(OnPublished::Delete, None).claim_sql(5);
        assert!(
            sql.contains("SELECT \"id\" FROM \"public\".\"outbox\" ORDER BY"),
            "{sql}"
        );
        assert!(
            sql.contains("DELETE FROM \"public\".\"outbox\" USING claimed"),
            "{sql}"
        );
    }

    #[test]
    fn the_cleanup_refuses_without_created_at_naming_the_flag() {
        let e = crate::advice::report(
            &debezium(OnPublished::Mark, Some("published_at"))
                .cleanup_sql(100)
                .expect_err("no created_at"),
        );
        assert!(e.contains("--column created_at=COLUMN"), "{e}");
    }

    #[test]
    fn the_backlog_counts_by_the_mapped_columns() {
        let table = TableName::from("outbox");
        let default = BacklogQuery::new(&table, &ColumnMap::default());
        assert_eq!(
            default.sql,
            "SELECT count(*), extract(epoch FROM now() - min(\"created_at\"))::float8 FROM \
             \"public\".\"outbox\" WHERE \"published_at\" IS NULL"
        );
        let debezium = BacklogQuery::new(&table, &ColumnMap::preset(Preset::Debezium));
        assert_eq!(
            debezium.sql,
            "SELECT count(*), NULL::float8 FROM \"public\".\"outbox\""
        );
        assert_eq!(debezium.published_column(), None);
    }
}
