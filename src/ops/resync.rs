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
use crate::publish::Broker;
use crate::shard::Shard;
use crate::table::backfill::{publish_all, select_sql, Read, Summary};
use crate::table::outbox::{needs_created_at, TextRelation};
use outbox_common::quote::quote_ident;

pub(crate) async fn run(args: ResyncArgs) -> Result<(), RelayError> {
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

/// Accepts an RFC 3339 date-time (`2024-05-01T12:00:00Z`, `…12:00:00.250+02:00`; a space
/// may stand for the `T`). An offset is required, so the time means one instant whatever
/// the server's time zone; PostgreSQL then parses it exactly.
pub(crate) fn check_rfc3339(text: &str) -> Result<(), String> {
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
}
