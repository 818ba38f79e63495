//! The backfill: rows read from the outbox table instead of the stream and published, each
//! batch confirmed before the next is read. `resync` runs it for the rows no slot will
//! deliver; a lost slot's recovery (wal/recovery.rs) runs it for the rows the new slot will
//! not, and can resume it from the last confirmed row.

use crate::config::TableName;
use crate::contract::columns;
use crate::error::RelayError;
use crate::observability::RelayMetrics;
use crate::publish::{deliver_batch, Broker};
use crate::shard::Shard;
use crate::table::outbox::TextRelation;
use outbox_common::quote::quote_ident;

/// Rows read, mapped and published per round trip.
const BATCH: i32 = 1000;

/// What a lost slot's recovery (wal/recovery.rs) logs once its backfill is confirmed:
/// `published` rows from `from` (`None`: the whole table) on. Nothing re-published is said so,
/// with why.
pub(crate) fn backfill_report(published: u64, from: Option<&str>) -> String {
    if published > 0 {
        return format!(
            "slot recreated (--on-slot-lost recreate): the {published} rows it will not \
             deliver were re-published from the table; streaming the new slot"
        );
    }
    let none = match from {
        Some(from) => format!("no row of the table has created_at at or after {from}"),
        None => "no row of the table has a created_at".to_string(),
    };
    format!(
        "slot recreated (--on-slot-lost recreate), and nothing was re-published: {none} (a \
         row with a NULL created_at is never re-published: the backfill selects rows by \
         it); streaming the new slot"
    )
}

/// Where resync (and a slot's recovery) reads its rows from.
pub(crate) struct Read<'a> {
    pub transaction: &'a tokio_postgres::Transaction<'a>,
    pub portal: &'a tokio_postgres::Portal,
    pub text: &'a TextRelation,
    pub mapper: &'a crate::contract::mapper::Mapper,
}

/// What was published: how many, and the created_at range.
pub(crate) struct Summary {
    pub published: u64,
    pub first: Option<String>,
    pub last: Option<String>,
}

/// Publishes every row of the portal, batch by batch, each confirmed before the next is
/// read, handing `confirmed` the last row of each confirmed batch; the failure, with how
/// many were confirmed before it.
pub(crate) async fn publish_all(
    read: &Read<'_>,
    broker: &Broker,
    confirm_timeout: std::time::Duration,
    mut confirmed: impl AsyncFnMut(&tokio_postgres::Row) -> Result<(), RelayError>,
) -> Result<Summary, (RelayError, u64)> {
    let Read {
        transaction,
        portal,
        text,
        mapper,
    } = *read;
    let mut published: u64 = 0;
    let mut first: Option<String> = None;
    let mut last: Option<String> = None;
    // The table's name for it: a map may call it otherwise (discover checked it is there).
    let created_index = text.column_index(columns::CREATED_AT).unwrap_or_default();
    let failed = |e: RelayError, published| (e, published);
    loop {
        let rows = transaction
            .query_portal(portal, BATCH)
            .await
            .map_err(|e| failed(e.into(), published))?;
        if rows.is_empty() {
            break;
        }
        // Map the whole batch first: under halt a row that cannot be mapped stops resync
        // naming it, with nothing of its batch published.
        let mut messages = Vec::with_capacity(rows.len());
        for row in &rows {
            let tuple = text.tuple(row).map_err(|e| failed(e, published))?;
            messages.push(mapper.map_row(text.layout(), &tuple, None));
        }
        deliver_batch(
            broker,
            messages,
            confirm_timeout,
            &RelayMetrics::for_batches(),
        )
        .await
        .map_err(|e| failed(e, published))?;
        published += rows.len() as u64;
        if let Some(row) = rows.last() {
            confirmed(row).await.map_err(|e| failed(e, published))?;
        }
        first = first.or_else(|| {
            rows.first()
                .and_then(|r| r.get::<_, Option<String>>(created_index))
        });
        last = rows
            .last()
            .and_then(|r| r.get::<_, Option<String>>(created_index));
        if rows.len() < BATCH as usize {
            break;
        }
    }
    Ok(Summary {
        published,
        first,
        last,
    })
}

/// What a slot's recovery that resumes its backfill (wal/recovery.rs) adds to the select:
/// rows created at or before `$2` only (the slot it made delivers the later ones) and, once a
/// row was confirmed, from that row, `($3, $4)` (its created_at and id as text), on. That
/// row is read again: an id need not be unique, and a row of the same key after it must not
/// be skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resumed {
    pub from_confirmed: bool,
}

/// Every contract column as text, rows from `$1` (RFC 3339 text) on, in created_at order,
/// `shard`'s only (its publication's row filter), within `resumed`'s bounds. The ORDER BY
/// names the table's columns: a bare `created_at` would sort the text output.
pub(crate) fn select_sql(
    outbox: &TableName,
    text: &TextRelation,
    shard: Shard,
    resumed: Option<Resumed>,
) -> String {
    let table = outbox.qualified_table();
    // `discover` checked both are mapped (id always is, created_at is one of its needs).
    let quoted = |contract| {
        text.quoted(contract)
            .unwrap_or_else(|| quote_ident(contract))
    };
    let created = quoted(columns::CREATED_AT);
    let id = quoted(columns::ID);
    let shard_rows = shard
        .row_filter(text.map())
        .map(|filter| format!(" AND ({filter})"))
        .unwrap_or_default();
    let resumed_rows = match resumed {
        None => String::new(),
        Some(Resumed { from_confirmed }) => {
            let until = format!(" AND {table}.{created} <= $2::text::timestamptz");
            let from = format!(
                " AND ({table}.{created}, {table}.{id}) >= ($3::text::timestamptz, $4::text::{})",
                text.id_type()
            );
            if from_confirmed {
                until + &from
            } else {
                until
            }
        }
    };
    format!(
        "SELECT {} FROM {table} WHERE {table}.{created} >= $1::text::timestamptz\
         {shard_rows}{resumed_rows} ORDER BY {table}.{created}, {table}.{id}",
        text.select_list()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::columns::ColumnMap;

    /// A recovery whose backfill found no row says that nothing was re-published, and why.
    #[test]
    fn a_backfill_that_re_published_nothing_says_so_and_why() {
        let since = "2026-01-01T00:00:00Z";
        let nothing = backfill_report(0, Some(since));
        assert!(
            nothing.contains("nothing was re-published")
                && nothing.contains(
                    "no row of the table has created_at at or after 2026-01-01T00:00:00Z"
                )
                && nothing.contains("NULL created_at")
                && !nothing.contains("were re-published"),
            "{nothing}"
        );
        let whole = backfill_report(0, None);
        assert!(
            whole.contains("no row of the table has a created_at"),
            "{whole}"
        );
        let some = backfill_report(5, Some(since));
        assert!(
            some.contains("5 rows it will not deliver were re-published from the table"),
            "{some}"
        );
    }

    #[test]
    fn select_orders_by_the_table_columns() {
        let table = TableName::from("outbox");
        let text = crate::table::outbox::text_relation(
            &[columns::ID, columns::EVENT_TYPE, columns::CREATED_AT],
            &ColumnMap::default(),
        );
        let sql = select_sql(&table, &text, Shard::UNSHARDED, None);
        assert_eq!(
            sql,
            "SELECT \"id\"::text, \"event_type\"::text, \"created_at\"::text FROM \
             \"public\".\"outbox\" WHERE \"public\".\"outbox\".\"created_at\" >= \
             $1::text::timestamptz ORDER BY \"public\".\"outbox\".\"created_at\", \
             \"public\".\"outbox\".\"id\""
        );
    }

    #[test]
    fn a_resumed_select_reads_up_to_the_slot_from_the_confirmed_row() {
        let table = TableName::from("outbox");
        let text = crate::table::outbox::text_relation(
            &[columns::ID, columns::EVENT_TYPE, columns::CREATED_AT],
            &ColumnMap::default(),
        );
        let (created, id) = (
            "\"public\".\"outbox\".\"created_at\"",
            "\"public\".\"outbox\".\"id\"",
        );
        let resumed = |from_confirmed| {
            select_sql(
                &table,
                &text,
                Shard::UNSHARDED,
                Some(Resumed { from_confirmed }),
            )
        };
        let until =
            format!("{created} >= $1::text::timestamptz AND {created} <= $2::text::timestamptz");
        let from = format!("AND ({created}, {id}) >= ($3::text::timestamptz, $4::text::uuid)");
        let order = format!(" ORDER BY {created}, {id}");
        let sql = resumed(true);
        assert!(sql.contains(&format!("{until} {from}{order}")), "{sql}");
        let sql = resumed(false);
        assert!(sql.contains(&format!("{until}{order}")), "{sql}");
        assert!(!sql.contains("$3"), "{sql}");
    }
}
