//! The outbox table as the relay reads it with SQL instead of from the stream (polling mode,
//! `resync`): its columns as the catalog describes them (found under the names
//! `contract::columns` maps), and a row read as text turned into the tuple the decoder would
//! have produced.
//!
//! Rows are selected with every contract column cast to `text`, on a connection with the
//! session settings the replication connection pins (`db::PINNED_SET_STATEMENTS`: ISO dates
//! in UTC, hex bytea). Paired with a `Relation` that names the columns with their real type
//! OIDs (so the mapper treats jsonb as JSON and bytea as hex), the mapper cannot tell such a
//! row from a streamed one, which is the point: one mapping for every way in.
//!
//! This module only reads the catalog and converts rows: it never writes to the table (each
//! mode owns the SQL that claims, marks, deletes or re-reads rows) and never decides what a
//! row becomes (the mapper does).

use bytes::Bytes;
use tokio_postgres::{Client, Row};

use crate::config::names::TableName;
use crate::contract::columns::{self, ColumnMap};
use crate::contract::mapper::Layout;
use crate::contract::row_error::MapError;
use crate::error::CatalogError;
use crate::error::{ConfigProblem, RelayError};
use crate::pgoutput::{Column, Relation, Tuple, TupleValue};
use outbox_common::quote::quote_ident;

/// The error of a command or feature that needs the `created_at` column (`why`: what for)
/// when the table lacks it or the column map leaves it unmapped (`--table-layout
/// debezium`): it names the column the map looked for and the flag that maps it.
pub(crate) fn needs_created_at(outbox: &TableName, map: &ColumnMap, why: &str) -> RelayError {
    let contract = columns::CREATED_AT;
    let flag = columns::COLUMN_FLAG;
    let why = why.to_string();
    match map.column(contract) {
        Some(column) => ConfigProblem::CreatedAtMissing {
            outbox: outbox.to_string(),
            column: column.to_string(),
            contract,
            why,
            flag,
        },
        None => ConfigProblem::CreatedAtUnmapped {
            contract,
            why,
            flag,
        },
    }
    .into()
}

/// `public.outbox` with `columns` (text-typed), as `discover` would read it: for tests of
/// the SQL built on a [`TextRelation`].
#[cfg(test)]
pub(crate) fn text_relation(columns: &[&str], map: &ColumnMap) -> TextRelation {
    let relation = Relation {
        oid: 0,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns: columns
            .iter()
            .map(|name| Column {
                flags: 0,
                name: name.to_string(),
                // text, and timestamptz for created_at (the mapper refuses another type).
                type_oid: if map.column(columns::CREATED_AT) == Some(*name) {
                    1184
                } else {
                    25
                },
                type_modifier: -1,
            })
            .collect(),
    };
    TextRelation::new(relation, map, "uuid".into()).expect("id and event_type")
}

/// One column of the table as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableColumn {
    pub name: String,
    pub type_oid: u32,
    /// The type as SQL (`uuid`, `bigint`, …).
    pub sql_type: String,
}

/// The table's columns in order. `TableMissing` when the table does not exist.
pub(crate) async fn table_columns(
    client: &Client,
    outbox: &TableName,
) -> Result<Vec<TableColumn>, RelayError> {
    let (schema, table) = outbox.table_parts();
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
        return Err(RelayError::Catalog(CatalogError::TableMissing {
            table: outbox.to_string(),
        }));
    }
    Ok(rows
        .iter()
        .map(|row| TableColumn {
            name: row.get(0),
            type_oid: row.get(1),
            sql_type: row.get(2),
        })
        .collect())
}

/// The contract columns a table has, as the `Relation` of rows selected as text, with the
/// mapper's `Layout` for it. Learned from the catalog on each connect: a schema change is
/// picked up at the next one.
#[derive(Debug, Clone)]
pub(crate) struct TextRelation {
    /// The columns read, in SELECT order, with their type OIDs.
    relation: Relation,
    layout: Layout,
    /// The id column's type as SQL, to cast ids sent back as text.
    id_type: String,
    /// Which of the table's columns holds each contract column.
    map: ColumnMap,
}

impl TextRelation {
    /// Reads the table's columns, each contract column under the name `map` gives it.
    /// Definite errors: the table is missing; it lacks one of `needs` (contract names: an
    /// unmapped one, or a mapped one the table lacks, reported by `missing`, naming what the
    /// caller needs it for; checked first); it lacks a column every message needs (`id`,
    /// `event_type`).
    pub(crate) async fn discover(
        client: &Client,
        outbox: &TableName,
        map: &ColumnMap,
        needs: &[&'static str],
        missing: impl Fn(&'static str) -> RelayError,
    ) -> Result<Self, RelayError> {
        let all = table_columns(client, outbox).await?;
        if let Some(needed) = needs.iter().find(|needed| {
            map.column(needed)
                .is_none_or(|name| !all.iter().any(|c| c.name == name))
        }) {
            return Err(missing(needed));
        }
        let (schema, table) = outbox.table_parts();
        let read: Vec<&TableColumn> = all.iter().filter(|c| map.reads(&c.name)).collect();
        let id_type = read
            .iter()
            .find(|c| map.column(columns::ID) == Some(c.name.as_str()))
            .map_or_else(|| "text".to_string(), |c| c.sql_type.clone());
        let relation = Relation {
            oid: 0,
            namespace: schema.to_string(),
            name: table.to_string(),
            replica_identity: b'd',
            columns: read
                .iter()
                .map(|c| Column {
                    flags: 0,
                    name: c.name.clone(),
                    type_oid: c.type_oid,
                    type_modifier: -1,
                })
                .collect(),
        };
        Ok(Self::new(relation, map, id_type)?)
    }

    /// For a relation already known (its columns under the table's names, which `map`
    /// maps); `MissingColumn` (naming the table) without `id` or `event_type`.
    pub(crate) fn new(
        relation: Relation,
        map: &ColumnMap,
        id_type: String,
    ) -> Result<Self, MapError> {
        let layout = Layout::for_relation(&relation, map)?;
        Ok(Self {
            relation,
            layout,
            id_type,
            map: map.clone(),
        })
    }

    /// The table's column for `contract`, quoted for SQL; `None` when unmapped.
    pub(crate) fn quoted(&self, contract: &str) -> Option<String> {
        self.map.column(contract).map(quote_ident)
    }

    /// The position of `contract`'s column in the relation (and in a selected row); `None`
    /// when unmapped or not in the table.
    pub(crate) fn column_index(&self, contract: &str) -> Option<usize> {
        self.map
            .column(contract)
            .and_then(|column| self.relation.column_index(column))
    }

    /// Which of the table's columns holds each contract column.
    pub(crate) fn map(&self) -> &ColumnMap {
        &self.map
    }

    pub(crate) fn relation(&self) -> &Relation {
        &self.relation
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The id column's type as SQL (`uuid`, `bigint`, …).
    pub(crate) fn id_type(&self) -> &str {
        &self.id_type
    }

    /// The SELECT list: every column read, cast to text, in the relation's order.
    pub(crate) fn select_list(&self) -> String {
        let select: Vec<String> = self
            .relation
            .columns
            .iter()
            .map(|c| format!("{}::text", quote_ident(&c.name)))
            .collect();
        select.join(", ")
    }

    /// One row selected with [`select_list`](Self::select_list), as the decoder would have
    /// produced it: text values in column order.
    pub(crate) fn tuple(&self, row: &Row) -> Result<Tuple, RelayError> {
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
