//! The framework migration guides of docs/migrating.md ("From a framework's outbox"), run as
//! written: each part's `sql` blocks create the framework's own table in a real PostgreSQL, a
//! row is inserted as the framework writes it, every `outbox-relay` line of its `sh` blocks
//! runs (with only the URLs, slot and exchange added), and the message that reaches the
//! queue is checked against what the part promises. A guide whose flags drift from what
//! works fails here, since the flags are read from the page, not copied into the test.

use outbox_testkit as common;
use outbox_testkit::output_text as text;

use std::time::Duration;

use lapin::types::FieldTable;

use common::faults::{settled, Upto};
use common::outbox::Outbox;
use common::{manual, services, unique_name, Consumer, Received};

const DEADLINE: Duration = Duration::from_secs(60);

/// The text of docs/migrating.md's `### <heading…>` section.
fn guide_section(heading: &str) -> String {
    manual::section("docs/migrating.md", heading)
}

/// Every `outbox-relay …` command of the section's `sh` blocks, as its arguments.
fn relay_commands(section: &str) -> Vec<Vec<String>> {
    let commands = manual::commands_of(section, "outbox-relay");
    assert!(
        !commands.is_empty(),
        "no outbox-relay command in:\n{section}"
    );
    commands
}

/// A fresh database holding the section's tables, made by its `sql` blocks.
async fn database_with_tables(section: &str, prefix: &str) -> String {
    let db_url = services().pg.create_database(&unique_name(prefix)).await;
    let client = common::pg::pg_connect(&db_url).await;
    let ddl = manual::blocks(section, "sql");
    assert!(!ddl.is_empty(), "no sql block in:\n{section}");
    for sql in ddl {
        client
            .batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("{e:?} running the guide's SQL:\n{sql}"));
    }
    db_url
}

/// The guide's WAL-mode setup and run: `setup` provisions (its exchange gets a queue bound
/// with `#`), `run` is started; both exactly as the guide's `sh` block has them.
async fn provision_and_run(
    section: &str,
    db_url: &str,
) -> (Outbox, Consumer, common::RelayProcess) {
    let commands = relay_commands(section);
    let [setup, run] = &commands[..] else {
        panic!("expected a setup and a run line, found {commands:?}");
    };
    assert_eq!(setup[0], "setup", "{setup:?}");
    assert_eq!(run[0], "run", "{run:?}");
    let setup: Vec<&str> = setup.iter().map(String::as_str).collect();
    let outbox = Outbox::provision_in(
        db_url,
        &services().rabbit.url(),
        &setup,
        FieldTable::default(),
    )
    .await;
    let consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let run: Vec<&str> = run[1..].iter().map(String::as_str).collect();
    let relay = outbox.spawn_relay(&run);
    (outbox, consumer, relay)
}

/// The one message the relay delivered, once the slot has confirmed it (so that nothing
/// else is on its way).
async fn the_one_message(
    outbox: &Outbox,
    consumer: &mut Consumer,
    relay: &common::RelayProcess,
) -> Received {
    consumer.wait_for(1, DEADLINE).await;
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let received = settled(consumer, url, queue, Upto::slot(outbox), || relay.log()).await;
    assert_eq!(received.len(), 1, "log:\n{}", relay.log());
    received[0].clone()
}

/// Seconds since the Unix epoch of a timestamptz the test wrote.
fn epoch_seconds(at: std::time::SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masstransits_outbox_message_row_arrives_with_its_id_type_envelope_and_headers() {
    let section = guide_section("MassTransit");
    let db_url = database_with_tables(&section, "mig_mt").await;
    let (outbox, mut consumer, relay) = provision_and_run(&section, &db_url).await;

    // As the bus outbox writes a publish (EntityFrameworkOutboxExtensions.AddSend): its
    // OutboxState row, then the message, the envelope serializer's body as text.
    let (message_id, outbox_id) = (
        "5d7e0000-1a2b-4c3d-8e4f-0123456789ab",
        "0a000000-0000-4000-8000-000000000001",
    );
    let message_type = "urn:message:Contracts:OrderSubmitted";
    let body = format!(
        r#"{{"messageId":"{message_id}","conversationId":"0b000000-0000-4000-8000-000000000002","sourceAddress":"rabbitmq://localhost/orders","destinationAddress":"rabbitmq://localhost/Contracts:OrderSubmitted","messageType":["{message_type}"],"message":{{"orderId":42}},"sentTime":"2026-12-06T10:00:00Z","headers":{{}}}}"#
    );
    let headers = r#"{"Tenant":"acme"}"#;
    let sent_time: std::time::SystemTime = outbox
        .client
        .query_one(
            "INSERT INTO \"OutboxState\" (\"OutboxId\", \"LockId\", \"Created\") \
             VALUES ($1::text::uuid, gen_random_uuid(), now()) RETURNING \"Created\"",
            &[&outbox_id],
        )
        .await
        .expect("insert the OutboxState row")
        .get(0);
    outbox
        .client
        .execute(
            "INSERT INTO \"OutboxMessage\" (\"SentTime\", \"Headers\", \"OutboxId\", \"MessageId\", \
               \"ContentType\", \"MessageType\", \"Body\", \"DestinationAddress\") \
             VALUES ($1, $2, $3::text::uuid, $4::text::uuid, 'application/vnd.masstransit+json', \
               $5, $6, 'rabbitmq://localhost/Contracts:OrderSubmitted')",
            &[
                &sent_time,
                &headers,
                &outbox_id,
                &message_id,
                &message_type,
                &body,
            ],
        )
        .await
        .expect("insert the OutboxMessage row");

    let message = the_one_message(&outbox, &mut consumer, &relay).await;
    assert_eq!(message.message_id.as_deref(), Some(message_id));
    assert_eq!(message.kind.as_deref(), Some(message_type));
    assert_eq!(message.routing_key, message_type);
    assert_eq!(message.body, body.as_bytes(), "the envelope, byte for byte");
    assert_eq!(
        message.content_type.as_deref(),
        Some("text/plain; charset=utf-8"),
        "by the Body column's type, as the guide warns"
    );
    assert_eq!(message.header_str("Tenant"), Some("acme"));
    assert_eq!(message.timestamp, Some(epoch_seconds(sent_time)));
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watermill_topic_row_arrives_as_watermill_amqp_reads_it() {
    let section = guide_section("Watermill");
    let db_url = database_with_tables(&section, "mig_wm").await;
    let (outbox, mut consumer, relay) = provision_and_run(&section, &db_url).await;

    // As watermill-sql's DefaultPostgreSQLSchema.InsertQuery writes a message.
    let uuid = "6f1c2a9e-3b7d-4e21-9c55-8d0a4f7e1b23";
    let payload = r#"{"order_id": 42,  "total": 9.5}"#;
    let metadata = r#"{"correlation_id": "c-1", "name": "OrderPlaced"}"#;
    outbox
        .client
        .execute(
            "INSERT INTO \"watermill_orders\" (uuid, payload, metadata, transaction_id) \
             VALUES ($1, $2::text::json, $3::text::json, pg_current_xact_id())",
            &[&uuid, &payload, &metadata],
        )
        .await
        .expect("insert as watermill-sql does");

    let message = the_one_message(&outbox, &mut consumer, &relay).await;
    assert_eq!(message.message_id.as_deref(), Some(uuid));
    assert_eq!(message.kind.as_deref(), Some("orders"), "the topic column");
    assert_eq!(message.routing_key, "orders");
    assert_eq!(
        message.body,
        payload.as_bytes(),
        "a json column keeps the text"
    );
    assert_eq!(message.content_type.as_deref(), Some("application/json"));
    // watermill-amqp's DefaultMarshaler: the UUID from this header, every header a string.
    assert_eq!(message.header_str("_watermill_message_uuid"), Some(uuid));
    assert_eq!(message.header_str("correlation_id"), Some("c-1"));
    assert_eq!(message.header_str("name"), Some("OrderPlaced"));
    let not_strings: Vec<_> = message
        .headers
        .iter()
        .filter(|(_, value)| !value.is_string())
        .collect();
    assert!(not_strings.is_empty(), "{not_strings:?}");
    assert_eq!(message.timestamp, None, "created_at is left unmapped");
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nservicebus_outbox_table_is_refused_with_the_error_the_guide_quotes() {
    let section = guide_section("NServiceBus");
    let db_url = database_with_tables(&section, "mig_nsb").await;
    let amqp_url = services().rabbit.url();
    let commands = relay_commands(&section);
    let expected = manual::blocks(&section, "text");
    assert_eq!(
        commands.len(),
        expected.len(),
        "one quoted error per command"
    );
    for (args, error) in commands.iter().zip(&expected) {
        let out = std::process::Command::new(common::relay::binary())
            .args(args)
            .args(["--database-url", &db_url, "--amqp-url", &amqp_url])
            .env_remove("DATABASE_URL")
            .env_remove("AMQP_URL")
            .env_remove("OUTBOX_COLUMNS")
            .env_remove("OUTBOX_TABLE_LAYOUT")
            .output()
            .expect("run outbox-relay");
        assert_eq!(
            out.status.code(),
            Some(i32::from(outbox_relay::exit::CONFIG)),
            "{args:?}: {}",
            text(&out)
        );
        assert!(
            text(&out).contains(error.trim()),
            "{args:?} should say {:?}:\n{}",
            error.trim(),
            text(&out)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spring_modulith_event_publication_arrives_with_its_class_as_type_and_type_id() {
    let section = guide_section("Spring Modulith");
    let db_url = database_with_tables(&section, "mig_sm").await;
    let (outbox, mut consumer, relay) = provision_and_run(&section, &db_url).await;

    // As the JDBC registry stores a publication for one listener (the v1 columns: which of
    // v2's it fills at insert is not verified, so they stay NULL).
    let id = "7f000000-0000-4000-8000-00000000abcd";
    let event_type = "com.example.orders.OrderCompleted";
    let listener = "com.example.shipping.ShippingService.on(com.example.orders.OrderCompleted)";
    let event = r#"{"orderId":"42","completedAt":"2026-12-06T10:00:00Z"}"#;
    let published: std::time::SystemTime = outbox
        .client
        .query_one(
            "INSERT INTO event_publication \
               (id, listener_id, event_type, serialized_event, publication_date) \
             VALUES ($1::text::uuid, $2, $3, $4, now()) RETURNING publication_date",
            &[&id, &listener, &event_type, &event],
        )
        .await
        .expect("insert a publication")
        .get(0);

    let message = the_one_message(&outbox, &mut consumer, &relay).await;
    assert_eq!(message.message_id.as_deref(), Some(id));
    assert_eq!(message.kind.as_deref(), Some(event_type));
    assert_eq!(message.routing_key, event_type);
    assert_eq!(message.body, event.as_bytes());
    assert_eq!(
        message.content_type.as_deref(),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(message.header_str("__TypeId__"), Some(event_type));
    assert_eq!(message.header_str("x-listener-id"), Some(listener));
    assert_eq!(message.timestamp, Some(epoch_seconds(published)));
    relay.stop().await;
    // The relay never writes Spring Modulith's table: the publication is still incomplete.
    let completed: Option<std::time::SystemTime> = outbox
        .client
        .query_one("SELECT completion_date FROM event_publication", &[])
        .await
        .expect("read the publication")
        .get(0);
    assert_eq!(completed, None);
}
