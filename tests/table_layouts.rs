//! Bring your own outbox table: a table of another design read through the column map
//! (`--table-layout`, `--column`; docs/table-layouts.md), against a real PostgreSQL and
//! RabbitMQ. Debezium's documented outbox table, provisioned the way its users would:
//! the table is theirs, `setup --no-create-table` checks it and makes the rest.

use outbox_relay::metrics::{HEADER_LABEL, TRACE_CONTEXT_DROPPED_TOTAL};
use outbox_testkit as common;
use outbox_testkit::output_text as text;

use std::time::Duration;

use lapin::types::FieldTable;

use common::faults::{settled, Upto};
use common::outbox::Outbox;
use common::{services, unique_name, Consumer};

mod poll;

/// Debezium's Outbox Event Router table, as its documentation gives it.
pub(crate) const DEBEZIUM_TABLE: &str = "CREATE TABLE outbox (\
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

    consumer.wait_for(ROWS.len(), Duration::from_secs(60)).await;
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let log = || relay.log();
    let received = settled(&mut consumer, url, queue, Upto::slot(&outbox), log).await;
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
    assert_eq!(
        setup.status.code(),
        Some(i32::from(outbox_relay::exit::CONFIG)),
        "{}",
        text(&setup)
    );
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
    assert_eq!(
        setup.status.code(),
        Some(i32::from(outbox_relay::exit::CONFIG)),
        "{}",
        text(&setup)
    );
    let message = text(&setup);
    assert!(message.contains("has no column \"kind\""), "{message}");
    assert!(
        message.contains("the message contract's \"event_type\""),
        "{message}"
    );

    // A contract column that does not exist, before anything connects.
    let out = run(&["run", "--column", "kind=type"]);
    assert_eq!(
        out.status.code(),
        Some(i32::from(outbox_relay::exit::CONFIG)),
        "{}",
        text(&out)
    );
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
        assert_eq!(
            out.status.code(),
            Some(i32::from(outbox_relay::exit::CONFIG)),
            "{}",
            text(&out)
        );
        let message = text(&out);
        assert!(
            message.contains("leaves \"created_at\" unmapped"),
            "{message}"
        );
        assert!(message.contains("--column created_at=COLUMN"), "{message}");
    }

    // Polling mode marks rows in published_at, which Debezium's table lacks: it says so.
    let out = run(&["poll", "--table-layout", "debezium"]);
    assert_eq!(
        out.status.code(),
        Some(i32::from(outbox_relay::exit::CONFIG)),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains("marks each published row in \"published_at\""),
        "{}",
        text(&out)
    );
}

const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const OTHER_PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const STATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";

/// A table of its own design: every contract column under another name, three extra
/// columns sent as headers, the trace context in columns of its own.
const APP_TABLE: &str = "CREATE TABLE app_events (\
     event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
     kind text NOT NULL, \
     entity text NOT NULL, \
     entity_key text NOT NULL, \
     body jsonb, \
     meta jsonb, \
     occurred_at timestamptz NOT NULL DEFAULT now(), \
     tenant_id text, \
     shard_no int NOT NULL DEFAULT 0, \
     urgent boolean, \
     trace_parent text, \
     trace_state text)";

/// The map of [`APP_TABLE`], as flags.
const APP_MAP: [&str; 14] = [
    "--table",
    "app_events",
    "--column",
    "id=event_id,event_type=kind,aggregate_type=entity,aggregate_id=entity_key,payload=body",
    "--column",
    "headers=meta,created_at=occurred_at,traceparent=trace_parent,tracestate=trace_state",
    "--header-column",
    "tenant_id=x-tenant",
    "--header-column",
    "shard_no",
    "--header-column",
    "urgent",
    "--exchange",
    "events.{aggregate_type}",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_its_own_design_is_routed_by_templates_with_header_columns_and_trace_context() {
    let s = services();
    let name = unique_name("layout_app");
    let db_url = s.pg.create_database(&name).await;
    let amqp_url = s.rabbit.url();
    let client = common::pg::pg_connect(&db_url).await;
    client
        .batch_execute(APP_TABLE)
        .await
        .expect("create the table");
    let slot = format!("{name}_slot");
    let connection = [
        "--database-url",
        &db_url,
        "--amqp-url",
        &amqp_url,
        "--slot",
        &slot,
    ];

    let setup = std::process::Command::new(common::relay::binary())
        .args(["setup", "--no-create-table"])
        .args(APP_MAP)
        .args(connection)
        .output()
        .expect("run setup");
    assert!(setup.status.success(), "{}", text(&setup));
    let printed = text(&setup);
    assert!(printed.contains("id=event_id"), "{printed}");
    assert!(
        printed.contains(
            "header columns: tenant_id as x-tenant, shard_no as shard_no, urgent as urgent"
        ),
        "{printed}"
    );
    assert!(printed.contains("a template, not declared"), "{printed}");

    // The exchanges the template renders to are the user's to declare, as for a row's
    // `exchange` column.
    let (orders, invoices) = (format!("{name}_orders"), format!("{name}_invoices"));
    common::declare_bound_queue(&amqp_url, "events.order", &orders, "#").await;
    common::declare_bound_queue(&amqp_url, "events.invoice", &invoices, "#").await;
    let mut order_consumer = Consumer::start(&amqp_url, &orders).await;
    let mut invoice_consumer = Consumer::start(&amqp_url, &invoices).await;

    let metrics_addr = format!("127.0.0.1:{}", common::free_port());
    let mut args = vec!["run", "--metrics-addr", &metrics_addr];
    args.extend(APP_MAP);
    args.extend(connection);
    args.extend([
        "--allowed-exchanges",
        "events.*",
        "--routing-key",
        "{aggregate_type}.{event_type}.{aggregate_id}",
    ]);
    let relay = common::RelayProcess::spawn(&args, &[]);

    // (kind, entity, key, tenant, shard, urgent, meta, trace_parent, trace_state)
    type Row = (
        &'static str,
        &'static str,
        &'static str,
        Option<&'static str>,
        i32,
        Option<bool>,
        String,
        Option<&'static str>,
        Option<&'static str>,
    );
    let rows: [Row; 4] = [
        // Trace context from its columns; every header column set.
        (
            "OrderCreated",
            "order",
            "1",
            Some("acme"),
            3,
            Some(true),
            "{}".into(),
            Some(PARENT),
            Some(STATE),
        ),
        // From the headers column; NULL header columns are left out.
        (
            "InvoicePaid",
            "invoice",
            "9",
            None,
            0,
            None,
            format!(r#"{{"traceparent": "{OTHER_PARENT}", "source": "billing"}}"#),
            None,
            None,
        ),
        // The columns win over the headers column.
        (
            "OrderPaid",
            "order",
            "1",
            Some("acme"),
            3,
            Some(false),
            format!(r#"{{"traceparent": "{OTHER_PARENT}"}}"#),
            Some(PARENT),
            None,
        ),
        // Invalid: dropped and counted, the message delivered all the same.
        (
            "OrderShipped",
            "order",
            "1",
            Some("acme"),
            3,
            None,
            "{}".into(),
            Some("not-a-traceparent"),
            Some(STATE),
        ),
    ];
    for (kind, entity, key, tenant, shard, urgent, meta, parent, state) in &rows {
        client
            .execute(
                "INSERT INTO app_events \
                 (kind, entity, entity_key, body, meta, tenant_id, shard_no, urgent, trace_parent, trace_state) \
                 VALUES ($1, $2, $3, jsonb_build_object('kind', $1::text), $4::text::jsonb, $5, $6, $7, $8, $9)",
                &[kind, entity, key, meta, tenant, shard, urgent, parent, state],
            )
            .await
            .expect("insert a row");
    }

    order_consumer.wait_for(3, Duration::from_secs(60)).await;
    invoice_consumer.wait_for(1, Duration::from_secs(60)).await;
    let upto = || Upto::Slots(&client, vec![slot.clone()]);
    let log = || relay.log();
    let orders = settled(&mut order_consumer, &amqp_url, &orders, upto(), log).await;
    let log = || relay.log();
    let invoices = settled(&mut invoice_consumer, &amqp_url, &invoices, upto(), log).await;
    assert_eq!(
        (orders.len(), invoices.len()),
        (3, 1),
        "log:\n{}",
        relay.log()
    );
    let ids: Vec<String> = client
        .query(
            "SELECT event_id::text FROM app_events ORDER BY event_id",
            &[],
        )
        .await
        .expect("ids")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut received = orders.iter().chain(invoices.iter()).collect::<Vec<_>>();
    received.sort_by_key(|m| m.message_id.clone().unwrap_or_default().parse::<u64>().ok());
    let json = |v: &str| Some(serde_json::json!(v));
    for (i, (message, row)) in received.iter().zip(&rows).enumerate() {
        let (kind, entity, key, tenant, shard, urgent, _, _, _) = row;
        assert_eq!(message.message_id.as_deref(), Some(ids[i].as_str()));
        assert_eq!(message.kind.as_deref(), Some(*kind));
        assert_eq!(message.exchange, format!("events.{entity}"));
        assert_eq!(message.routing_key, format!("{entity}.{kind}.{key}"));
        assert_eq!(message.body_json(), serde_json::json!({ "kind": kind }));
        assert!(message.timestamp.is_some(), "created_at is mapped");
        assert_eq!(
            message.headers.get("x-tenant").cloned(),
            tenant.map(|t| serde_json::json!(t))
        );
        assert_eq!(
            message.headers.get("shard_no"),
            Some(&serde_json::json!(shard))
        );
        assert_eq!(
            message.headers.get("urgent").cloned(),
            urgent.map(|u| serde_json::json!(u))
        );
    }
    let trace = |m: &common::Received| {
        (
            m.headers.get("traceparent").cloned(),
            m.headers.get("tracestate").cloned(),
        )
    };
    assert_eq!(trace(received[0]), (json(PARENT), json(STATE)));
    assert_eq!(trace(received[1]), (json(OTHER_PARENT), None));
    assert_eq!(
        received[1].headers.get("source"),
        Some(&serde_json::json!("billing"))
    );
    assert_eq!(trace(received[2]), (json(PARENT), None));
    assert_eq!(trace(received[3]), (None, None));
    assert!(
        relay
            .wait_metric(
                &common::http::series(
                    TRACE_CONTEXT_DROPPED_TOTAL,
                    &[(HEADER_LABEL, "traceparent")]
                ),
                Duration::from_secs(10),
                |n| n == 1,
            )
            .await,
        "one traceparent dropped; log:\n{}",
        relay.log()
    );
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debeziums_span_context_and_extra_columns_reach_a_cloudevents_consumer() {
    let db_url = debezium_database("layout_trace").await;
    let amqp_url = services().rabbit.url();
    let client = common::pg::pg_connect(&db_url).await;
    client
        .batch_execute(
            "ALTER TABLE outbox ADD COLUMN tracingspancontext varchar(256), \
             ADD COLUMN tenant_id varchar(64)",
        )
        .await
        .expect("Debezium's optional column and one of the user's");
    let outbox = Outbox::provision_in(
        &db_url,
        &amqp_url,
        &["setup", "--no-create-table", "--table-layout", "debezium"],
        FieldTable::default(),
    )
    .await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let relay = outbox.spawn_relay(&[
        "--table-layout",
        "debezium",
        "--cleanup-interval",
        "0",
        "--header-column",
        "tenant_id=x-tenant",
        "--routing-key",
        "{aggregate_type}.{event_type}",
        "--message-format",
        "cloudevents",
    ]);
    // As Debezium's OpenTelemetry integration writes it: java.util.Properties text.
    let span_context =
        format!("#Thu Dec 03 10:00:00 UTC 2026\ntraceparent={PARENT}\ntracestate={STATE}\n");
    let (id, aggregate_type, aggregate_id, event_type, payload) = ROWS[0];
    outbox
        .client
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tracingspancontext, tenant_id) \
             VALUES ($1::text::uuid, $2, $3, $4, $5::text::jsonb, $6, 'acme')",
            &[&id, &aggregate_type, &aggregate_id, &event_type, &payload, &span_context],
        )
        .await
        .expect("insert");
    consumer.wait_for(1, Duration::from_secs(60)).await;
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let log = || relay.log();
    let received = settled(&mut consumer, url, queue, Upto::slot(&outbox), log).await;
    assert_eq!(received.len(), 1, "log:\n{}", relay.log());
    let message = &received[0];
    assert_eq!(
        message.routing_key,
        format!("{aggregate_type}.{event_type}")
    );
    assert_eq!(
        message.headers.get("traceparent"),
        Some(&serde_json::json!(PARENT))
    );
    assert_eq!(
        message.headers.get("tracestate"),
        Some(&serde_json::json!(STATE))
    );
    assert_eq!(
        message.headers.get("x-tenant"),
        Some(&serde_json::json!("acme"))
    );
    assert_eq!(
        message.content_type.as_deref(),
        Some("application/cloudevents+json")
    );
    let event = message.body_json();
    assert_eq!(event["id"], id);
    assert_eq!(event["type"], event_type);
    assert_eq!(event["traceparent"], PARENT);
    assert_eq!(event["tracestate"], STATE);
    assert_eq!(
        event["data"],
        serde_json::from_str::<serde_json::Value>(payload).expect("payload")
    );
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_header_columns_and_templates_are_refused_naming_the_flag() {
    let db_url = debezium_database("layout_badt").await;
    let amqp_url = services().rabbit.url();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(common::relay::binary())
            .args(args)
            .args(["--database-url", &db_url, "--amqp-url", &amqp_url])
            .output()
            .expect("run outbox-relay");
        (out.status.code(), text(&out))
    };
    let debezium = ["--table-layout", "debezium", "--cleanup-interval", "0"];
    for (extra, expected) in [
        (
            &["--header-column", "type=traceparent"][..],
            "the relay sets the header \"traceparent\" itself",
        ),
        (
            &["--routing-key", "{tenant}"][..],
            "not a field of the message contract",
        ),
        (
            &["--exchange", "events.{aggregate_type"][..],
            "without its `}`",
        ),
        (
            &["--exchange", "events.{aggregate_type}"][..],
            "must say which it may be",
        ),
        (
            &["--allowed-exchanges", "ev*ts"][..],
            "a prefix ending in `*`",
        ),
    ] {
        let mut args = vec!["run"];
        args.extend(debezium);
        args.extend(extra);
        let (code, message) = run(&args);
        assert_ne!(code, Some(0), "{extra:?}: {message}");
        assert!(message.contains(expected), "{extra:?}: {message}");
    }
    // A header column the table lacks: setup names it (run would, at the table's first
    // Relation).
    let (code, message) = run(&[
        "setup",
        "--no-create-table",
        "--table-layout",
        "debezium",
        "--header-column",
        "region",
    ]);
    assert_eq!(
        code,
        Some(i32::from(outbox_relay::exit::CONFIG)),
        "{message}"
    );
    assert!(
        message.contains("has no column \"region\", which --header-column sends"),
        "{message}"
    );
}

/// Waits until every id of `expected` has arrived (duplicates allowed), up to `timeout`;
/// the ids that never did.
async fn missing_ids(
    consumer: &mut Consumer,
    expected: &std::collections::HashSet<String>,
    timeout: Duration,
) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let seen = consumer.received().len();
        let received: std::collections::HashSet<&str> = consumer
            .received()
            .iter()
            .filter_map(|m| m.message_id.as_deref())
            .collect();
        let missing: Vec<String> = expected
            .iter()
            .filter(|id| !received.contains(id.as_str()))
            .cloned()
            .collect();
        if missing.is_empty() || tokio::time::Instant::now() >= deadline {
            return missing;
        }
        consumer
            .wait_for(seen + 1, Duration::from_millis(500))
            .await;
    }
}

/// Inserts `rows` Debezium rows of `event_type` in one transaction; their ids.
async fn insert_debezium_rows(
    client: &tokio_postgres::Client,
    event_type: &str,
    rows: i32,
) -> std::collections::HashSet<String> {
    client
        .query(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             SELECT gen_random_uuid(), 'Order', (i % 7)::text, $1, jsonb_build_object('i', i) \
             FROM generate_series(1, $2) i RETURNING id::text",
            &[&event_type, &rows],
        )
        .await
        .expect("insert Debezium rows")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// `--on-slot-lost recreate` on a mapped table: the slot is dropped while the relay is stopped
/// and rows are committed in the gap; the next relay recreates the slot and backfills them
/// from the table, read through the column map (the backfill's SELECT names the mapped
/// columns; the messages are the stream's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_slot_is_backfilled_from_a_mapped_table() {
    let db_url = debezium_database("layout_lost").await;
    let amqp_url = services().rabbit.url();
    let client = common::pg::pg_connect(&db_url).await;
    client
        .batch_execute(
            "ALTER TABLE outbox ADD COLUMN occurred_at timestamptz NOT NULL DEFAULT now(); \
             CREATE TABLE outbox_relay_state (slot text PRIMARY KEY, \
               acknowledged_commit timestamptz, emitted_events boolean NOT NULL DEFAULT false, \
               recovering boolean NOT NULL DEFAULT false, backfill_from timestamptz, \
               backfill_slot_lsn pg_lsn, backfill_until timestamptz, \
               backfill_confirmed_created_at text, backfill_confirmed_id text, \
               updated_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .expect("a creation time, and the state table sql/outbox.sql makes");
    let map = [
        "--table-layout",
        "debezium",
        "--column",
        "created_at=occurred_at",
    ];
    let mut setup = vec!["setup", "--no-create-table"];
    setup.extend(map);
    let outbox = Outbox::provision_in(&db_url, &amqp_url, &setup, FieldTable::default()).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let mut flags = map.to_vec();
    flags.extend([
        "--on-slot-lost",
        "recreate",
        "--recreate-margin",
        "2s",
        "--cleanup-interval",
        "1s",
    ]);

    let relay = outbox.spawn_relay(&flags);
    let before = insert_debezium_rows(&outbox.client, "BeforeTheGap", 300).await;
    let missing = missing_ids(&mut consumer, &before, Duration::from_secs(60)).await;
    assert!(
        missing.is_empty(),
        "missing {missing:?}; log:\n{}",
        relay.log()
    );
    // The recovery starts from the recorded commit: wait until it covers these rows.
    let newest: std::time::SystemTime = outbox
        .client
        .query_one("SELECT max(occurred_at) FROM outbox", &[])
        .await
        .expect("max")
        .get(0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let recorded: Option<std::time::SystemTime> = outbox
            .client
            .query_opt(
                "SELECT acknowledged_commit FROM outbox_relay_state WHERE slot = $1",
                &[&outbox.slot],
            )
            .await
            .expect("state")
            .and_then(|row| row.get(0));
        if recorded.is_some_and(|at| at >= newest) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no state recorded; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    relay.stop().await;

    outbox
        .client
        .execute("SELECT pg_drop_replication_slot($1)", &[&outbox.slot])
        .await
        .expect("drop the slot");
    let gap = insert_debezium_rows(&outbox.client, "InTheGap", 300).await;

    let relay = outbox.spawn_relay(&flags);
    let missing = missing_ids(&mut consumer, &gap, Duration::from_secs(60)).await;
    assert!(
        missing.is_empty(),
        "{} of the gap's rows never arrived; log:\n{}",
        missing.len(),
        relay.log()
    );
    // Logged once the backfill is done, which may be after its last row arrived.
    assert!(
        relay
            .wait_for_log(
                "slot recreated (--on-slot-lost recreate)",
                Duration::from_secs(30)
            )
            .await,
        "log:\n{}",
        relay.log()
    );
    let after = insert_debezium_rows(&outbox.client, "AfterTheGap", 300).await;
    let missing = missing_ids(&mut consumer, &after, Duration::from_secs(60)).await;
    assert!(
        missing.is_empty(),
        "missing {missing:?}; log:\n{}",
        relay.log()
    );
    // The backfilled messages are built as the stream's are, through the map.
    for message in consumer.received() {
        let id = message.message_id.as_deref().unwrap_or_default();
        if gap.contains(id) {
            assert_eq!(message.kind.as_deref(), Some("InTheGap"));
            assert_eq!(message.routing_key, "InTheGap");
            assert_eq!(
                message.headers.get("x-aggregate-type"),
                Some(&serde_json::json!("Order"))
            );
            assert!(message.timestamp.is_some(), "created_at is mapped");
        }
    }
    relay.stop().await;
}

/// What the templates cannot route follows `--on-unroutable`, and delivery goes on: a rendered
/// exchange outside `--allowed-exchanges` and a NULL field the routing key needs become dead
/// letters naming why (the field under the table's own name), the rows around them arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_template_cannot_route_follows_on_unroutable() {
    let s = services();
    let name = unique_name("layout_unroutable");
    let db_url = s.pg.create_database(&name).await;
    let amqp_url = s.rabbit.url();
    let client = common::pg::pg_connect(&db_url).await;
    client
        .batch_execute(DEBEZIUM_TABLE)
        .await
        .expect("create Debezium's table");
    client
        .batch_execute("ALTER TABLE outbox ALTER COLUMN aggregateid DROP NOT NULL")
        .await
        .expect("a nullable aggregate id");
    let slot = format!("{name}_slot");
    let dead_letters = format!("{name}.dead-letter");
    let connection = [
        "--database-url",
        &db_url,
        "--amqp-url",
        &amqp_url,
        "--slot",
        &slot,
    ];
    let routing = [
        "--table-layout",
        "debezium",
        "--exchange",
        "events.{aggregate_type}",
        "--on-unroutable",
        "dead-letter",
        "--dead-letter-exchange",
        &dead_letters,
    ];
    let setup = std::process::Command::new(common::relay::binary())
        .args(["setup", "--no-create-table"])
        .args(routing)
        .args(connection)
        .output()
        .expect("run setup");
    assert!(setup.status.success(), "{}", text(&setup));

    let (orders, dead) = (format!("{name}_orders"), format!("{name}_dead"));
    common::declare_bound_queue(&amqp_url, "events.order", &orders, "#").await;
    common::declare_bound_queue(&amqp_url, &dead_letters, &dead, "#").await;
    let mut order_consumer = Consumer::start(&amqp_url, &orders).await;
    let mut dead_consumer = Consumer::start(&amqp_url, &dead).await;
    let mut args = vec!["run", "--cleanup-interval", "0"];
    args.extend(routing);
    args.extend(connection);
    args.extend([
        "--allowed-exchanges",
        "events.order",
        "--routing-key",
        "{aggregate_id}.{event_type}",
    ]);
    let relay = common::RelayProcess::spawn(&args, &[]);

    // (id, aggregatetype, aggregateid, type)
    let rows = [
        (
            "11111111-1111-4111-8111-111111111111",
            "order",
            Some("1"),
            "OrderCreated",
        ),
        (
            "22222222-2222-4222-8222-222222222222",
            "invoice",
            Some("9"),
            "InvoicePaid",
        ),
        (
            "33333333-3333-4333-8333-333333333333",
            "order",
            None,
            "OrderShipped",
        ),
        (
            "44444444-4444-4444-8444-444444444444",
            "order",
            Some("1"),
            "OrderPaid",
        ),
    ];
    for (id, aggregate_type, aggregate_id, event_type) in rows {
        client
            .execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                 VALUES ($1::text::uuid, $2, $3, $4, '{}')",
                &[&id, &aggregate_type, &aggregate_id, &event_type],
            )
            .await
            .expect("insert");
    }

    order_consumer.wait_for(2, Duration::from_secs(60)).await;
    let upto = || Upto::Slots(&client, vec![slot.clone()]);
    let log = || relay.log();
    let delivered = settled(&mut order_consumer, &amqp_url, &orders, upto(), log).await;
    let delivered: Vec<(Option<&str>, &str)> = delivered
        .iter()
        .map(|m| (m.message_id.as_deref(), m.routing_key.as_str()))
        .collect();
    assert_eq!(
        delivered,
        [
            (Some(rows[0].0), "1.OrderCreated"),
            (Some(rows[3].0), "1.OrderPaid")
        ],
        "log:\n{}",
        relay.log()
    );
    dead_consumer.wait_for(2, Duration::from_secs(60)).await;
    let dead = settled(&mut dead_consumer, &amqp_url, &dead, upto(), || relay.log()).await;
    assert_eq!(dead.len(), 2, "log:\n{}", relay.log());
    let reason = |id: &str| {
        dead.iter()
            .find(|m| m.message_id.as_deref() == Some(id))
            .and_then(|m| m.header_str("x-outbox-dead-letter-reason"))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no dead letter for {id}: {dead:?}"))
    };
    assert_eq!(reason(rows[1].0), "exchange not allowed: events.invoice");
    let unmappable = reason(rows[2].0);
    assert!(
        unmappable.starts_with("unmappable: column \"aggregateid\" (the contract's aggregate_id)")
            && unmappable.contains("--routing-key \"{aggregate_id}.{event_type}\" needs it"),
        "{unmappable}"
    );
    relay.stop().await;
}
