//! `outbox-relay resync --since <time>`: re-publishes rows from the table.
//!
//! For the rows no slot will ever deliver: those inserted before the slot existed, and those
//! committed while a lost slot could not decode them (docs/recovery.md, "Recovering from a lost
//! slot"). Rows still in the table with `created_at >= since` are published again in
//! `created_at` order (rows of one transaction share a created_at; they go in id order), with
//! the same message id as before, so consumers that deduplicate on `message_id` drop what they
//! already have. Rows the cleanup job already deleted are gone: resync can only reach back as
//! far as `--retention`.
//!
//! Rows are read from one snapshot (a read-only repeatable-read transaction) through a
//! portal, a batch at a time, mapped by the same mapper as the stream (values as text under
//! the same session settings), published pipelined, and each batch's confirms awaited in
//! order before the next batch is read. Any nack, return or missing confirm stops the command
//! with the message named; what was confirmed before it is printed, and running the command
//! again publishes from `since` again.
//!
//! It only publishes: it never writes to the table (the snapshot is read-only) and never
//! touches the slot, so it can run beside a live relay (rows the relay also delivers arrive
//! twice, with the same message id).

use tokio_postgres::IsolationLevel;

use crate::assembly::{RelayParts, RelayPartsFlags};
use crate::config::{ResyncArgs, TableName};
use crate::contract::columns;
use crate::db;
use crate::error::RelayError;
use crate::observability::RelayMetrics;
use crate::outbox_table::{needs_created_at, TextRelation};
use crate::publish::{deliver_batch, Broker};
use crate::shard::Shard;
use outbox_common::quote::quote_ident;

/// Rows read, mapped and published per round trip.
const BATCH: i32 = 1000;

pub async fn run(args: ResyncArgs) -> Result<(), RelayError> {
    check_rfc3339(&args.since).map_err(RelayError::Config)?;
    let map = args.columns.map()?;
    let names = &args.names;
    let RelayParts {
        database_url,
        brokers,
        mapper,
        ..
    } = RelayParts::new(RelayPartsFlags {
        connections: &args.connections,
        table: &names.table,
        exchange: &names.exchange,
        publishing: &args.publishing,
        exchanges: &args.exchanges,
        format: &args.format,
        dead_letter: None,
    })?;
    let mut client = db::connect(&database_url).await?;
    // The text shapes the mapper parses, as the replication connection pins them.
    client.batch_execute(db::PINNED_SET_STATEMENTS).await?;
    let text = TextRelation::discover(&client, &names.table, &map, &[columns::CREATED_AT], |_| {
        needs_created_at(&names.table, &map, "resync selects rows by it")
    })
    .await?;
    let broker = Broker::connect(&brokers).await?;
    broker.check_exchange(&names.exchange).await?;

    let transaction = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let statement = transaction
        .prepare(&select_sql(&names.table, &text, Shard::UNSHARDED, None))
        .await?;
    let portal = transaction.bind(&statement, &[&args.since]).await?;
    let read = Read {
        transaction: &transaction,
        portal: &portal,
        text: &text,
        mapper: &mapper,
    };
    // resync keeps no progress: run again, it publishes from `--since` again.
    let confirmed = async |_: &tokio_postgres::Row| Ok::<_, RelayError>(());
    let published = publish_all(&read, &broker, args.publishing.confirm_timeout(), confirmed).await;
    let Summary {
        published,
        first,
        last,
    } = match published {
        Ok(summary) => summary,
        Err((e, published)) => {
            outln!("resync stopped after {published} confirmed messages");
            broker.close().await;
            return Err(e);
        }
    };
    let undated = undated_rows(&transaction, &names.table, &text).await?;
    transaction.commit().await?;
    broker.close().await;
    let summary = Summary {
        published,
        first,
        last,
    };
    outln!("{}", resync_report(&summary, &args.since, undated));
    Ok(())
}

/// How many rows of the table have a NULL created_at: resync selects by it, so it never
/// publishes them (a nullable column mapped to created_at).
async fn undated_rows(
    transaction: &tokio_postgres::Transaction<'_>,
    outbox: &TableName,
    text: &TextRelation,
) -> Result<u64, RelayError> {
    let table = outbox.qualified_table();
    let created = text
        .quoted(columns::CREATED_AT)
        .unwrap_or_else(|| quote_ident(columns::CREATED_AT));
    let count: i64 = transaction
        .query_one(
            &format!("SELECT count(*) FROM {table} WHERE {table}.{created} IS NULL"),
            &[],
        )
        .await?
        .get(0);
    Ok(u64::try_from(count).unwrap_or_default())
}

/// What resync prints once it is done (`since`: its --since; `undated`: rows it cannot
/// select, their created_at being NULL). Nothing published is said so, with why.
pub(crate) fn resync_report(summary: &Summary, since: &str, undated: u64) -> String {
    let published = match (&summary.first, &summary.last) {
        (Some(first), Some(last)) if summary.published > 0 => format!(
            "resync: published {} messages (created_at from {first} to {last}), each \
             confirmed by the broker",
            summary.published
        ),
        _ => format!("resync: published nothing: no row has created_at at or after {since}"),
    };
    match undated {
        0 => published,
        n => format!(
            "{published}; {n} rows have a NULL created_at, which resync cannot select by \
             time: they were not published"
        ),
    }
}

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

/// Accepts an RFC 3339 date-time (`2024-05-01T12:00:00Z`, `…12:00:00.250+02:00`; a space
/// may stand for the `T`). An offset is required, so the time means one instant whatever
/// the server's time zone; PostgreSQL then parses it exactly.
pub fn check_rfc3339(text: &str) -> Result<(), String> {
    // `time` takes any one character between date and time; PostgreSQL only these.
    let separator = matches!(text.as_bytes().get(10), Some(b'T' | b't' | b' '));
    match time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339) {
        Ok(_) if separator => Ok(()),
        _ => Err(format!(
            "--since {text:?} is not an RFC 3339 time such as 2024-05-01T12:00:00Z or \
             2024-05-01T14:00:00.5+02:00 (a UTC offset is required)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::columns::ColumnMap;

    #[test]
    fn rfc3339_times_are_checked() {
        for good in [
            "2024-05-01T12:00:00Z",
            "2024-05-01t12:00:00z",
            "2024-05-01 12:00:00+02:00",
            "2024-05-01T12:00:00.123456-07:30",
        ] {
            assert_eq!(check_rfc3339(good), Ok(()), "{good}");
        }
        for bad in [
            "2024-05-01",
            "2024-05-01T12:00:00",
            "yesterday",
            "2024-13-01T12:00:00Z",
            "2024-05-01T12:00:00.Z",
            "2024-05-01T12:00:00+0200",
            "2024-05-01T25:00:00Z",
            "2024-05-01X12:00:00Z",
        ] {
            assert!(check_rfc3339(bad).is_err(), "{bad}");
        }
    }

    /// Nothing published is said plainly, with why: no row from that time on, and the rows a
    /// NULL created_at keeps out.
    #[test]
    fn a_resync_that_published_nothing_says_so_and_why() {
        let summary = |published, range: Option<(&str, &str)>| Summary {
            published,
            first: range.map(|(first, _)| first.to_string()),
            last: range.map(|(_, last)| last.to_string()),
        };
        let since = "2026-01-01T00:00:00Z";
        assert_eq!(
            resync_report(&summary(0, None), since, 0),
            "resync: published nothing: no row has created_at at or after 2026-01-01T00:00:00Z"
        );
        assert_eq!(
            resync_report(&summary(0, None), since, 3),
            "resync: published nothing: no row has created_at at or after \
             2026-01-01T00:00:00Z; 3 rows have a NULL created_at, which resync cannot select \
             by time: they were not published"
        );
        let range = Some(("2026-01-01 00:00:01+00", "2026-01-01 00:00:09+00"));
        assert_eq!(
            resync_report(&summary(2, range), since, 1),
            "resync: published 2 messages (created_at from 2026-01-01 00:00:01+00 to \
             2026-01-01 00:00:09+00), each confirmed by the broker; 1 rows have a NULL \
             created_at, which resync cannot select by time: they were not published"
        );
    }

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
        let text = crate::outbox_table::text_relation(
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
        let text = crate::outbox_table::text_relation(
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
