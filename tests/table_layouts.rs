//! Bring your own outbox table: a table of another design read through the column map
//! (`--table-layout`, `--column`; docs/table-layouts.md), against a real PostgreSQL and
//! RabbitMQ. Debezium's documented outbox table, provisioned the way its users would:
//! the table is theirs, `setup --no-create-table` checks it and makes the rest.

use outbox_testkit as common;

use std::time::Duration;

use lapin::types::FieldTable;

use common::outbox::Outbox;
use common::{services, unique_name, Consumer};

#[path = "table_layouts/poll.rs"]
mod poll;

/// Debezium's Outbox Event Router table, as its documentation gives it.
const DEBEZIUM_TABLE: &str = "CREATE TABLE outbox (\
     id uuid PRIMARY KEY, \
     aggregatetype varchar(255) NOT NULL, \
     aggregateid varchar(255) NOT NULL, \
     type varchar(255) NOT NULL, \
     payload jsonb)";

/// Debezium's example rows: (id, aggregatetype, aggregateid, type, payload).
const ROWS: [(&str, &str, &str, &str, &str); 2] = [
    (
        "406c07f3-26f0-4eea-a50c-109940064b8f",
        "Order",
        "1",
        "OrderCreated",
        r#"{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "status": "ENTERED", "quantity": 2, "totalPrice": 39.98}, {"id": 2, "item": "Debezium for Dummies", "status": "ENTERED", "quantity": 1, "totalPrice": 29.99}], "orderDate": "2019-01-31T12:13:01", "customerId": 123}"#,
    ),
    (
        "ab720dd3-176d-40a6-96f3-6cf961d7df6a",
        "Order",
        "1",
        "OrderLineUpdated",
        r#"{"orderId": 1, "orderLineId": 1, "oldStatus": "ENTERED", "newStatus": "CANCELLED"}"#,
    ),
];

fn text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A database holding Debezium's outbox table (created as its users would, not by setup).
async fn debezium_database(prefix: &str) -> String {
    let s = services();
    let db_url = s.pg.create_database(&unique_name(prefix)).await;
    let client = common::pg::pg_connect(&db_url).await;
    client
        .batch_execute(DEBEZIUM_TABLE)
        .await
        .expect("create Debezium's table");
    db_url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debeziums_outbox_table_is_relayed_with_the_debezium_layout() {
    let db_url = debezium_database("layout_dbz").await;
    let amqp_url = services().rabbit.url();
    let outbox = Outbox::provision_in(
        &db_url,
        &amqp_url,
        &["setup", "--no-create-table", "--table-layout", "debezium"],
        FieldTable::default(),
    )
    .await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    // The table has no created_at: the cleanup, which deletes by it, is turned off.
    let relay = outbox.spawn_relay(&["--table-layout", "debezium", "--cleanup-interval", "0"]);

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

    let received = consumer
        .wait_settled(ROWS.len(), Duration::from_secs(60))
        .await;
    assert_eq!(received.len(), ROWS.len(), "log:\n{}", relay.log());
    for (message, (id, aggregate_type, aggregate_id, event_type, payload)) in
        received.iter().zip(ROWS)
    {
        assert_eq!(message.message_id.as_deref(), Some(id));
        assert_eq!(message.kind.as_deref(), Some(event_type));
        assert_eq!(message.routing_key, event_type);
        assert_eq!(message.exchange, outbox.exchange);
        assert_eq!(message.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            message.body_json(),
            serde_json::from_str::<serde_json::Value>(payload).expect("payload")
        );
        assert_eq!(
            message.headers.get("x-aggregate-type"),
            Some(&serde_json::json!(aggregate_type))
        );
        assert_eq!(
            message.headers.get("x-aggregate-id"),
            Some(&serde_json::json!(aggregate_id))
        );
        assert_eq!(
            message.timestamp, None,
            "no created_at column, no timestamp"
        );
    }
    assert!(
        relay.log().contains("outbox columns mapped"),
        "log:\n{}",
        relay.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapping_that_does_not_fit_the_table_is_refused_naming_the_flag() {
    let db_url = debezium_database("layout_bad").await;
    let amqp_url = services().rabbit.url();
    let run = |args: &[&str]| {
        std::process::Command::new(common::relay::binary())
            .args(args)
            .args(["--database-url", &db_url, "--amqp-url", &amqp_url])
            .env_remove("DATABASE_URL")
            .env_remove("AMQP_URL")
            .env_remove("OUTBOX_COLUMNS")
            .env_remove("OUTBOX_TABLE_LAYOUT")
            .output()
            .expect("run outbox-relay")
    };

    // The default layout looks for event_type, which Debezium's table calls `type`.
    let setup = run(&["setup", "--no-create-table"]);
    assert_eq!(setup.status.code(), Some(1), "{}", text(&setup));
    let message = text(&setup);
    assert!(
        message.contains("has no column \"event_type\""),
        "{message}"
    );
    assert!(message.contains("--column event_type=COLUMN"), "{message}");

    // A mapped column the table lacks is named by the table's name and the contract's.
    let setup = run(&[
        "setup",
        "--no-create-table",
        "--table-layout",
        "debezium",
        "--column",
        "event_type=kind",
    ]);
    assert_eq!(setup.status.code(), Some(1), "{}", text(&setup));
    let message = text(&setup);
    assert!(message.contains("has no column \"kind\""), "{message}");
    assert!(
        message.contains("the message contract's \"event_type\""),
        "{message}"
    );

    // A contract column that does not exist, before anything connects.
    let out = run(&["run", "--column", "kind=type"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("\"kind\" is not a column of the message contract"),
        "{}",
        text(&out)
    );

    // Debezium's table has no created_at, which the cleanup deletes by (on by default) and
    // --on-slot-lost recreate backfills by.
    for extra in [
        &[][..],
        &["--cleanup-interval", "0", "--on-slot-lost", "recreate"][..],
    ] {
        let mut args = vec!["run", "--table-layout", "debezium"];
        args.extend_from_slice(extra);
        let out = run(&args);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let message = text(&out);
        assert!(
            message.contains("leaves \"created_at\" unmapped"),
            "{message}"
        );
        assert!(message.contains("--column created_at=COLUMN"), "{message}");
    }

    // Polling mode marks rows in published_at, which Debezium's table lacks: it says so.
    let out = run(&["poll", "--table-layout", "debezium"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("marks each published row in \"published_at\""),
        "{}",
        text(&out)
    );
}
