//! Polling mode and `resync` on a table of another design (docs/table-layouts.md, "Polling
//! mode"): Debezium's documented table, plus the columns each case needs, provisioned by
//! `setup --mode poll --no-create-table`. Oracles: the queue (what arrived) and the table
//! (which rows are marked or gone).

use std::time::Duration;

use lapin::types::FieldTable;

use super::common;
use super::{debezium_database, text, ROWS};
use common::faults::{settled, Upto};
use common::outbox::Outbox;
use common::{services, Consumer, Received};

const DEADLINE: Duration = Duration::from_secs(60);

/// Debezium's columns are `type`, `aggregatetype`, … : the preset, with `published_at` in a
/// column of another name (so that a statement naming `published_at` itself would fail).
const MARKED_IN_SENT_AT: [&str; 4] = [
    "--table-layout",
    "debezium",
    "--column",
    "published_at=sent_at",
];

/// Inserts Debezium's example rows as its users' applications would.
async fn insert_rows(outbox: &Outbox) {
    for (id, aggregate_type, aggregate_id, event_type, payload) in ROWS {
        outbox
            .client
            .execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                 VALUES ($1::text::uuid, $2, $3, $4, $5::text::jsonb)",
                &[&id, &aggregate_type, &aggregate_id, &event_type, &payload],
            )
            .await
            .expect("insert a Debezium row");
    }
}

/// Every message is Debezium's row of the same position, mapped per the preset.
fn assert_rows_delivered(received: &[Received], outbox: &Outbox, log: &str) {
    assert_eq!(received.len(), ROWS.len(), "log:\n{log}");
    for (message, (id, aggregate_type, aggregate_id, event_type, payload)) in
        received.iter().zip(ROWS)
    {
        assert_eq!(message.message_id.as_deref(), Some(id), "log:\n{log}");
        assert_eq!(message.kind.as_deref(), Some(event_type));
        assert_eq!(message.routing_key, event_type);
        assert_eq!(message.exchange, outbox.exchange);
        assert_eq!(
            message.body_json(),
            serde_json::from_str::<serde_json::Value>(payload).expect("payload")
        );
        assert_eq!(message.header_str("x-aggregate-type"), Some(aggregate_type));
        assert_eq!(message.header_str("x-aggregate-id"), Some(aggregate_id));
    }
}

/// `status --mode poll` with `map`'s flags, as JSON.
fn status(outbox: &Outbox, map: &[&str]) -> serde_json::Value {
    let mut args = vec!["status", "--mode", "poll", "--json"];
    args.extend_from_slice(map);
    let out = outbox.run_command(&args);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

/// An outbox on Debezium's table with `extra_ddl` applied, provisioned by `setup <setup…>`.
async fn debezium_outbox(prefix: &str, extra_ddl: Option<&str>, setup: &[&str]) -> Outbox {
    let db_url = debezium_database(prefix).await;
    let client = common::pg::pg_connect(&db_url).await;
    if let Some(ddl) = extra_ddl {
        client.batch_execute(ddl).await.expect("extra DDL");
    }
    let outbox = Outbox::provision_in(
        &db_url,
        &services().rabbit.url(),
        setup,
        FieldTable::default(),
    )
    .await;
    drop(client);
    outbox
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_mode_delivers_a_debezium_table_and_marks_rows_in_the_mapped_column() {
    let mut setup = vec!["setup", "--mode", "poll", "--no-create-table"];
    setup.extend_from_slice(&MARKED_IN_SENT_AT);
    let outbox = debezium_outbox(
        "layout_poll",
        Some("ALTER TABLE outbox ADD COLUMN sent_at timestamptz"),
        &setup,
    )
    .await;
    // setup made the claim index on the mapped columns: id order (no created_at).
    let index: String = common::pg::query_value(
        &outbox.client,
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'outbox_unpublished_idx'",
    )
    .await;
    assert!(index.ends_with("(id) WHERE (sent_at IS NULL)"), "{index}");
    insert_rows(&outbox).await;
    assert_eq!(status(&outbox, &MARKED_IN_SENT_AT)["unsent_rows"], 2);

    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    // One worker, so the one claim takes both rows in id order. No created_at: the cleanup,
    // which finds rows through it, is off.
    let mut args = vec!["--workers", "1", "--cleanup-interval", "0"];
    args.extend_from_slice(&MARKED_IN_SENT_AT);
    let relay = outbox.spawn_poll(&args, &[]);
    consumer.wait_for(ROWS.len(), DEADLINE).await;
    let unsent = Upto::Unsent(
        &outbox.client,
        "SELECT count(*) FROM outbox WHERE sent_at IS NULL",
    );
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let received = settled(&mut consumer, url, queue, unsent, || relay.log()).await;
    assert_rows_delivered(received, &outbox, &relay.log());
    let marked = common::pg::wait_count(
        &outbox.client,
        "SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL",
        DEADLINE,
        |n| n == ROWS.len() as i64,
    )
    .await;
    assert_eq!(marked, Ok(ROWS.len() as i64), "log:\n{}", relay.log());
    relay.stop().await;
    let log = relay.log();
    assert!(log.contains("outbox columns mapped"), "log:\n{log}");
    assert!(
        !log.contains("no partial index"),
        "the index was found:\n{log}"
    );
    assert_eq!(status(&outbox, &MARKED_IN_SENT_AT)["unsent_rows"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_mode_deletes_published_rows_of_a_debezium_table_without_published_at() {
    // Debezium's table as documented: no published_at, so rows are deleted once confirmed.
    let layout = ["--table-layout", "debezium"];
    let mut setup = vec!["setup", "--mode", "poll", "--no-create-table"];
    setup.extend_from_slice(&layout);
    let outbox = debezium_outbox("layout_poll_del", None, &setup).await;
    insert_rows(&outbox).await;
    // Every row in the table is unsent.
    assert_eq!(status(&outbox, &layout)["unsent_rows"], 2);

    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let mut args = vec!["--workers", "1", "--on-published", "delete"];
    args.extend_from_slice(&layout);
    let relay = outbox.spawn_poll(&args, &[]);
    consumer.wait_for(ROWS.len(), DEADLINE).await;
    // A row is deleted once the broker confirmed it: none left, none unconfirmed.
    let unsent = Upto::Unsent(&outbox.client, "SELECT count(*) FROM outbox");
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let received = settled(&mut consumer, url, queue, unsent, || relay.log()).await;
    assert_rows_delivered(received, &outbox, &relay.log());
    let left = common::pg::wait_count(
        &outbox.client,
        "SELECT count(*) FROM outbox",
        DEADLINE,
        |n| n == 0,
    )
    .await;
    assert_eq!(left, Ok(0), "log:\n{}", relay.log());
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_a_mapped_table_that_lacks_what_it_needs_is_refused_naming_the_flag() {
    let db_url = debezium_database("layout_poll_bad").await;
    let amqp_url = services().rabbit.url();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(common::relay::binary())
            .args(args)
            .args(["--database-url", &db_url, "--amqp-url", &amqp_url])
            .env_remove("DATABASE_URL")
            .env_remove("AMQP_URL")
            .env_remove("OUTBOX_COLUMNS")
            .env_remove("OUTBOX_TABLE_LAYOUT")
            .env_remove("OUTBOX_ON_PUBLISHED")
            .output()
            .expect("run outbox-relay");
        assert_eq!(
            out.status.code(),
            Some(i32::from(outbox_relay::exit::CONFIG)),
            "{args:?}: {}",
            text(&out)
        );
        text(&out)
    };

    // The map names a published_at column the table does not have.
    let mut args = vec!["setup", "--mode", "poll", "--no-create-table"];
    args.extend_from_slice(&MARKED_IN_SENT_AT);
    let message = run(&args);
    assert!(message.contains("has no column \"sent_at\""), "{message}");
    assert!(
        message.contains("the message contract's \"published_at\""),
        "{message}"
    );
    assert!(
        message.contains("--column published_at=COLUMN"),
        "{message}"
    );

    // Marking needs published_at, which the preset leaves unmapped: refused before connecting.
    let message = run(&["poll", "--table-layout", "debezium"]);
    assert!(
        message.contains("Fix:") && message.contains("--on-published delete"),
        "{message}"
    );
    assert!(
        message.contains("--column published_at=COLUMN"),
        "{message}"
    );

    // The cleanup (on by default under mark) finds rows by created_at, which is unmapped.
    let message = run(&[
        "poll",
        "--table-layout",
        "debezium",
        "--column",
        "published_at=sent_at",
    ]);
    assert!(
        message.contains("leaves \"created_at\" unmapped")
            && message.contains("--cleanup-interval 0"),
        "{message}"
    );

    // setup creates the table under the contract's names only: a map needs --no-create-table.
    let message = run(&["setup", "--mode", "poll", "--table-layout", "debezium"]);
    assert!(message.contains("--no-create-table"), "{message}");

    // Shards spread rows by uuid_hash of the id: a table whose id is a bigint is refused
    // before anything is provisioned.
    let client = common::pg::pg_connect(&db_url).await;
    client
        .batch_execute(
            "CREATE TABLE serial_outbox (id bigint PRIMARY KEY, aggregatetype text, \
             aggregateid text, type text NOT NULL, payload jsonb)",
        )
        .await
        .expect("create a table with a bigint id");
    let message = run(&[
        "setup",
        "--no-create-table",
        "--table",
        "serial_outbox",
        "--table-layout",
        "debezium",
        "--shards",
        "2",
    ]);
    assert!(
        message.contains("uuid_hash") && message.contains("is bigint") && message.contains("Fix:"),
        "{message}"
    );
    let publications: i64 =
        common::pg::query_value(&client, "SELECT count(*) FROM pg_publication").await;
    assert_eq!(publications, 0, "nothing provisioned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resync_republishes_a_mapped_table() {
    // Debezium's table with a creation time under a name of its own.
    let map = [
        "--table-layout",
        "debezium",
        "--column",
        "created_at=occurred_at",
    ];
    let mut setup = vec!["setup", "--mode", "poll", "--no-create-table"];
    setup.extend_from_slice(&map);
    let outbox = debezium_outbox(
        "layout_resync",
        Some("ALTER TABLE outbox ADD COLUMN occurred_at timestamptz NOT NULL DEFAULT now()"),
        &setup,
    )
    .await;
    insert_rows(&outbox).await;
    // Both rows in the table's order: the second one created a second later.
    outbox
        .client
        .execute(
            "UPDATE outbox SET occurred_at = occurred_at + interval '1 second' WHERE id = $1::text::uuid",
            &[&ROWS[1].0],
        )
        .await
        .expect("order the rows");

    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let mut args = vec!["resync", "--since", "2000-01-01T00:00:00Z"];
    args.extend_from_slice(&map);
    let out = outbox.run_command(&args);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("published 2 messages"), "{said}");
    // The summary's range is the mapped creation time, not some other column.
    assert!(!said.contains(ROWS[0].0), "{said}");
    // resync has exited, every message confirmed.
    consumer.wait_for(ROWS.len(), DEADLINE).await;
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let received = settled(&mut consumer, url, queue, Upto::Done, || said.clone()).await;
    assert_rows_delivered(received, &outbox, &said);
    assert!(
        received.iter().all(|m| m.timestamp.is_some()),
        "created_at is mapped: messages carry a timestamp"
    );
    // resync only reads: the table is as it was.
    let rows: i64 = common::pg::query_value(&outbox.client, "SELECT count(*) FROM outbox").await;
    assert_eq!(rows, 2);
}

/// Debezium's table with the id under another name and rows without an aggregate: the two
/// columns the shards' row filters read, both renamed, and both branches of the filter.
const RENAMED_ID_TABLE: &str = "CREATE TABLE outbox (\
     event_id uuid PRIMARY KEY, \
     aggregatetype varchar(255) NOT NULL, \
     aggregateid varchar(255), \
     type varchar(255) NOT NULL, \
     payload jsonb)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_split_a_table_with_a_renamed_id_by_the_mapped_columns() {
    let s = services();
    let db_url =
        s.pg.create_database(&common::unique_name("layout_shards"))
            .await;
    let client = common::pg::pg_connect(&db_url).await;
    client
        .batch_execute(RENAMED_ID_TABLE)
        .await
        .expect("create the table");
    let map = [
        "--table-layout",
        "debezium",
        "--column",
        "id=event_id",
        "--shards",
        "2",
    ];
    let mut setup = vec!["setup", "--no-create-table"];
    setup.extend_from_slice(&map);
    let outbox =
        Outbox::provision_in(&db_url, &s.rabbit.url(), &setup, FieldTable::default()).await;
    let filters = common::pg::first_column(
        &outbox.client,
        "SELECT rowfilter FROM pg_publication_tables WHERE tablename = 'outbox' ORDER BY pubname",
        &[],
    )
    .await;
    assert_eq!(filters.len(), 2, "{filters:?}");
    assert!(
        filters
            .iter()
            .all(|f| f.contains("uuid_hash(event_id)")
                && f.contains("hashtext((aggregateid)::text)")),
        "{filters:?}"
    );

    // Each shard's relay publishes to an exchange of its own: its queue is what it delivered.
    let mut relays = Vec::new();
    let mut consumers = Vec::new();
    for shard in 0..2u32 {
        let exchange = format!("{}_{shard}", outbox.exchange);
        let queue = format!("{}_{shard}", outbox.queue);
        common::amqp::declare_exchange(&outbox.amqp_url, &exchange).await;
        common::declare_bound_queue(&outbox.amqp_url, &exchange, &queue, "#").await;
        consumers.push(Consumer::start(&outbox.amqp_url, &queue).await);
        let shard = shard.to_string();
        let mut args = vec![
            "--exchange",
            exchange.as_str(),
            "--shard",
            shard.as_str(),
            "--cleanup-interval",
            "0",
        ];
        args.extend_from_slice(&map);
        relays.push(common::RelayProcess::spawn(
            &[
                &[
                    "run",
                    "--database-url",
                    &outbox.db_url,
                    "--amqp-url",
                    &outbox.amqp_url,
                ][..],
                &["--slot", &outbox.slot],
                &args[..],
            ]
            .concat(),
            &[common::relay::TEST_LOG],
        ));
    }

    // Each row's shard, computed here with the documented expression on the table's names.
    let rows = outbox
        .client
        .query(
            "INSERT INTO outbox (event_id, aggregatetype, aggregateid, type, payload) \
             SELECT gen_random_uuid(), 'Order', \
                    CASE WHEN g % 3 = 0 THEN NULL ELSE (g % 5)::text END, \
                    'OrderCreated', jsonb_build_object('n', g) \
             FROM generate_series(1, 30) g \
             RETURNING event_id::text, ((CASE WHEN aggregateid IS NOT NULL \
               THEN hashtext(aggregateid) ELSE uuid_hash(event_id) END) & 2147483647) % 2",
            &[],
        )
        .await
        .expect("insert rows");
    let mut expected = [Vec::new(), Vec::new()];
    for row in &rows {
        let shard: i32 = row.get(1);
        expected[shard as usize].push(row.get::<_, String>(0));
    }
    assert!(
        expected.iter().all(|ids| !ids.is_empty()),
        "both shards get rows: {expected:?}"
    );
    for (shard, consumer) in consumers.iter_mut().enumerate() {
        let want = &expected[shard];
        consumer.wait_for(want.len(), DEADLINE).await;
        let queue = format!("{}_{shard}", outbox.queue);
        let upto = Upto::Slots(&outbox.client, vec![format!("{}_{shard}", outbox.slot)]);
        let log = || relays[shard].log();
        let got: Vec<String> = settled(consumer, &outbox.amqp_url, &queue, upto, log)
            .await
            .iter()
            .filter_map(|m| m.message_id.clone())
            .collect();
        let mut got_sorted = got.clone();
        got_sorted.sort();
        let mut want_sorted = want.clone();
        want_sorted.sort();
        assert_eq!(
            got_sorted,
            want_sorted,
            "shard {shard} delivers exactly its rows; log:\n{}",
            relays[shard].log()
        );
    }
    for relay in &relays {
        relay.stop().await;
    }
}
