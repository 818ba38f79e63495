//! WAL mode end to end, against a real PostgreSQL (wal_level=logical) and RabbitMQ.
//!
//! Oracles come from outside the relay: commit order from a `test_decoding` slot created
//! before the writers start, delivery from the queue itself, acknowledgement from
//! `pg_replication_slots`.

use outbox_testkit as common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::faults::relay_crash_duplicate_bound;
use common::outbox::{write_concurrently, Outbox};
use common::{create_test_decoding_slot, current_wal_lsn, read_test_decoding, Consumer};

const OUTBOX: &str = "public.outbox";

/// Counts how often each id arrived.
fn arrivals<'a>(ids: impl IntoIterator<Item = &'a str>) -> HashMap<&'a str, usize> {
    let mut counts = HashMap::new();
    for id in ids {
        *counts.entry(id).or_insert(0) += 1;
    }
    counts
}

/// Waits until every id in `wanted` has arrived (or `timeout` passes); true if all did.
async fn wait_for_ids(consumer: &mut Consumer, wanted: &HashSet<&str>, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let have = consumer.received().len();
        let received = consumer.wait_for(have + 1, Duration::from_secs(1)).await;
        let arrived: HashSet<&str> = received_ids(received).into_iter().collect();
        if wanted.is_subset(&arrived) {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
    }
}

fn received_ids(received: &[common::Received]) -> Vec<&str> {
    received
        .iter()
        .map(|r| {
            r.message_id
                .as_deref()
                .expect("every message has a message_id")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_arrive_once_in_commit_order() {
    let outbox = Outbox::new("order").await;
    let oracle = format!("{}_oracle", outbox.slot);
    create_test_decoding_slot(&outbox.client, &oracle).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let relay = outbox.spawn_relay(&[]);

    let committed = write_concurrently(&outbox.db_url, 8, 10_000, 50).await;
    let txns = read_test_decoding(&outbox.client, &oracle).await;
    let expected: Vec<String> = txns.iter().flat_map(|t| t.inserted_ids(OUTBOX)).collect();
    assert_eq!(
        expected.len(),
        committed.len(),
        "the oracle saw every commit"
    );

    // Nothing failed, so nothing may arrive twice: wait for quiet before counting.
    let received = consumer
        .wait_settled(expected.len(), Duration::from_secs(120))
        .await;
    let got = received_ids(received);
    assert_eq!(
        got.len(),
        expected.len(),
        "each row exactly once; log:\n{}",
        relay.log()
    );
    assert_eq!(
        got, expected,
        "arrival order is the commit order (rows in insert order)"
    );

    // Headers say where each row came from, increasing along the stream.
    let seqs: Vec<&str> = received
        .iter()
        .map(|r| r.header_str("x-outbox-seq").expect("x-outbox-seq"))
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "x-outbox-seq increases"
    );
    let first = &received[0];
    assert_eq!(first.kind.as_deref(), Some("TestEvent"));
    assert_eq!(first.routing_key, "TestEvent");
    assert_eq!(first.delivery_mode, Some(2), "persistent");
    assert_eq!(first.content_type.as_deref(), Some("application/json"));
    assert!(first.timestamp.is_some());
    assert!(
        first.body_json().get("writer").is_some(),
        "jsonb payload intact"
    );

    // Acceptance 2: the slot reaches the last commit once everything is confirmed...
    let last_commit = txns.last().expect("transactions").end_lsn;
    assert!(
        outbox
            .wait_confirmed_flush(last_commit, Duration::from_secs(10))
            .await,
        "confirmed_flush_lsn reaches the last commit"
    );
    // ...and keeps advancing while only another table takes writes (WAL is not pinned).
    outbox
        .client
        .batch_execute(
            "CREATE TABLE other (id serial PRIMARY KEY, v text);
             INSERT INTO other (v) SELECT 'x' FROM generate_series(1, 1000);",
        )
        .await
        .expect("other table writes");
    let after_other_writes = current_wal_lsn(&outbox.client).await;
    assert!(
        outbox
            .wait_confirmed_flush(after_other_writes, Duration::from_secs(30))
            .await,
        "an idle outbox does not pin WAL; log:\n{}",
        relay.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollbacks_and_other_tables_publish_nothing() {
    let outbox = Outbox::new("rollback").await;
    // A table in the publication that is not the outbox: its rows are ignored.
    outbox
        .client
        .batch_execute(
            "CREATE TABLE side (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), event_type text);
             ALTER PUBLICATION outbox_pub ADD TABLE side;
             CREATE TABLE unpublished (id serial PRIMARY KEY, event_type text);",
        )
        .await
        .expect("tables");
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let relay = outbox.spawn_relay(&[]);

    outbox
        .client
        .batch_execute(
            "BEGIN;
             INSERT INTO outbox (event_type, payload) VALUES ('RolledBack', '{}');
             ROLLBACK;
             BEGIN;
             INSERT INTO outbox (event_type, payload) VALUES ('Kept', '{\"n\": 1}');
             SAVEPOINT s;
             INSERT INTO outbox (event_type, payload) VALUES ('RolledBackToSavepoint', '{}');
             ROLLBACK TO SAVEPOINT s;
             INSERT INTO outbox (event_type, payload) VALUES ('Kept', '{\"n\": 2}');
             COMMIT;
             INSERT INTO side (event_type) VALUES ('Side');
             INSERT INTO unpublished (event_type) VALUES ('Unpublished');",
        )
        .await
        .expect("writes");
    let marker = outbox.insert("Marker", "{}").await;
    let received = consumer.wait_settled(3, Duration::from_secs(30)).await;
    let kinds: Vec<&str> = received.iter().filter_map(|r| r.kind.as_deref()).collect();
    assert_eq!(kinds, ["Kept", "Kept", "Marker"], "log:\n{}", relay.log());
    assert_eq!(received[2].message_id.as_deref(), Some(marker.as_str()));
    let bodies: Vec<serde_json::Value> = received[..2].iter().map(|r| r.body_json()).collect();
    assert_eq!(bodies[0]["n"], 1);
    assert_eq!(bodies[1]["n"], 2);
}

/// With the relay stopped: every row of each transaction whose end LSN is at or below the
/// slot's confirmed_flush_lsn is in `delivered`.
async fn assert_ack_invariant(outbox: &Outbox, oracle: &str, delivered: &HashSet<String>) {
    let confirmed = outbox.confirmed_flush().await;
    for txn in read_test_decoding(&outbox.client, oracle).await {
        if txn.end_lsn <= confirmed {
            for id in txn.inserted_ids(OUTBOX) {
                assert!(
                    delivered.contains(&id),
                    "row {id} of a transaction ending at {:X} is acknowledged (confirmed_flush {:X}) but was not delivered",
                    txn.end_lsn,
                    confirmed
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_message_holds_the_slot_until_a_queue_is_bound() {
    let outbox = Outbox::new("unroutable").await;
    let oracle = format!("{}_oracle", outbox.slot);
    create_test_decoding_slot(&outbox.client, &oracle).await;
    // Only "Routed" reaches a queue; the catch-all queue of the fixture is not consumed here.
    let routed = format!("{}_routed", outbox.queue);
    common::declare_bound_queue(&outbox.amqp_url, &outbox.exchange, &routed, "Routed").await;
    common::amqp::delete_queue(&outbox.amqp_url, &outbox.queue).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &routed).await;

    let first = outbox.insert("Routed", r#"{"n": 1}"#).await;
    let stuck = outbox.insert("Unbound", r#"{"n": 2}"#).await;
    let after = outbox.insert("Routed", r#"{"n": 3}"#).await;
    let relay = outbox.spawn_relay(&[]);
    consumer.wait_for(1, Duration::from_secs(30)).await;
    assert!(
        relay
            .wait_for_log(
                &format!("returned message {stuck} as unroutable"),
                Duration::from_secs(30)
            )
            .await,
        "the relay says which message is unroutable; log:\n{}",
        relay.log()
    );
    relay.sigterm();
    assert!(
        relay.wait_exit(Duration::from_secs(20)).await.is_some(),
        "relay stops on SIGTERM"
    );
    let received = consumer
        .wait_quiet(Duration::from_millis(300), Duration::from_secs(5))
        .await;
    let delivered: HashSet<String> = received_ids(received)
        .into_iter()
        .map(String::from)
        .collect();
    assert!(delivered.contains(&first));
    // Pipelining may deliver rows after the stuck one; none of them may be acknowledged.
    assert_ack_invariant(&outbox, &oracle, &delivered).await;

    // Once a queue is bound for it, the stuck message and the ones behind it are delivered.
    let catch_all = format!("{}_all", outbox.queue);
    common::declare_bound_queue(&outbox.amqp_url, &outbox.exchange, &catch_all, "#").await;
    let mut all = Consumer::start(&outbox.amqp_url, &catch_all).await;
    let _relay = outbox.spawn_relay(&[]);
    // At least once: the first row may come again, if its acknowledgement had not reached
    // PostgreSQL when the first relay stopped.
    let wanted: HashSet<&str> = [stuck.as_str(), after.as_str()].into();
    assert!(wait_for_ids(&mut all, &wanted, Duration::from_secs(30)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacked_message_is_not_acknowledged_and_is_retried() {
    let outbox = Outbox::new("nack").await;
    let oracle = format!("{}_oracle", outbox.slot);
    create_test_decoding_slot(&outbox.client, &oracle).await;
    // A queue that rejects every publish makes the broker nack the message.
    common::amqp::delete_queue(&outbox.amqp_url, &outbox.queue).await;
    let full = format!("{}_full", outbox.queue);
    let mut arguments = lapin::types::FieldTable::default();
    arguments.insert(
        "x-max-length".into(),
        lapin::types::AMQPValue::LongLongInt(0),
    );
    arguments.insert(
        "x-overflow".into(),
        lapin::types::AMQPValue::LongString("reject-publish".into()),
    );
    common::amqp::declare_bound_queue_with_args(
        &outbox.amqp_url,
        &outbox.exchange,
        &full,
        "#",
        arguments,
    )
    .await;
    let nacked = outbox.insert("Nacked", r#"{"n": 1}"#).await;
    let relay = outbox.spawn_relay(&[]);
    assert!(
        relay
            .wait_for_log(
                &format!("nacked) message {nacked}"),
                Duration::from_secs(30)
            )
            .await,
        "log:\n{}",
        relay.log()
    );
    relay.sigterm();
    assert!(relay.wait_exit(Duration::from_secs(20)).await.is_some());
    assert_ack_invariant(&outbox, &oracle, &HashSet::new()).await;

    // The broker accepts it again: delivered.
    common::amqp::delete_queue(&outbox.amqp_url, &full).await;
    common::declare_bound_queue(&outbox.amqp_url, &outbox.exchange, &outbox.queue, "#").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let _relay = outbox.spawn_relay(&[]);
    let received = consumer.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(received_ids(received), [nacked.as_str()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_backlog_loses_nothing_and_bounds_duplicates() {
    const ROWS: usize = 50_000;
    const MAX_IN_FLIGHT: usize = 1024;
    let outbox = Outbox::new("kill").await;
    let committed = outbox.seed_single_row_transactions(ROWS, 4).await;
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;

    let relay = outbox.spawn_relay(&["--max-in-flight", &MAX_IN_FLIGHT.to_string()]);
    // The bound's rate is the rate at the kill: measured over the quarter before it, not
    // from the start (which includes the relay's start-up and would understate it).
    consumer.wait_for(ROWS / 8, Duration::from_secs(120)).await;
    let (from_count, from) = (consumer.received().len(), std::time::Instant::now());
    consumer.wait_for(ROWS / 4, Duration::from_secs(120)).await;
    let rate = (consumer.received().len() - from_count) as f64 / from.elapsed().as_secs_f64();
    relay.kill9();
    assert!(relay.wait_exit(Duration::from_secs(10)).await.is_some());

    let _relay = outbox.spawn_relay(&["--max-in-flight", &MAX_IN_FLIGHT.to_string()]);
    let committed: HashSet<&str> = committed.iter().map(String::as_str).collect();
    wait_for_ids(&mut consumer, &committed, Duration::from_secs(180)).await;
    let received = consumer
        .wait_quiet(Duration::from_millis(500), Duration::from_secs(10))
        .await;
    let counts = arrivals(received_ids(received));
    let lost = committed
        .iter()
        .filter(|id| !counts.contains_key(*id))
        .count();
    let duplicates: usize = counts.values().map(|n| n - 1).sum();
    // Status interval 100 ms; single-row transactions, so no open transaction adds to it.
    let bound = relay_crash_duplicate_bound(MAX_IN_FLIGHT, rate, Duration::from_millis(100), 0);
    println!("kill -9 at ~{rate:.0} msg/s: lost {lost}, duplicates {duplicates} (bound {bound})");
    assert_eq!(lost, 0, "no committed row is lost");
    assert!(
        duplicates <= bound,
        "duplicates {duplicates} within {bound}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_stream_then_restart_publishes_no_duplicate() {
    const ROWS: usize = 20_000;
    let outbox = Outbox::new("sigterm").await;
    let committed = write_concurrently(&outbox.db_url, 4, ROWS, 20).await;
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let relay = outbox.spawn_relay(&[]);
    consumer.wait_for(ROWS / 4, Duration::from_secs(120)).await;
    relay.sigterm();
    let status = relay
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("exits after SIGTERM");
    assert!(
        status.success(),
        "exit 0 after SIGTERM; log:\n{}",
        relay.log()
    );

    let _relay = outbox.spawn_relay(&[]);
    let received = consumer.wait_settled(ROWS, Duration::from_secs(120)).await;
    let counts = arrivals(received_ids(received));
    let duplicates: usize = counts.values().map(|n| n - 1).sum();
    let lost = committed
        .iter()
        .filter(|id| !counts.contains_key(id.as_str()))
        .count();
    println!("SIGTERM and restart: lost {lost}, duplicates {duplicates}");
    assert_eq!(lost, 0);
    assert_eq!(
        duplicates, 0,
        "a graceful stop acknowledges everything it delivered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_is_idempotent_and_run_names_missing_objects() {
    let outbox = Outbox::new("setup").await;
    let again = outbox.run_command(&["setup"]);
    assert!(again.status.success(), "setup twice: {again:?}");
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(
        text.contains("exists"),
        "second setup reports existing objects: {text}"
    );

    outbox
        .client
        .batch_execute("DROP PUBLICATION outbox_pub")
        .await
        .expect("drop publication");
    let run = outbox.run_command(&["run"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains("publication \"outbox_pub\" does not exist") && stderr.contains("Fix:"),
        "{stderr}"
    );

    outbox.run_command(&["setup"]);
    outbox
        .client
        .execute("SELECT pg_drop_replication_slot($1)", &[&outbox.slot])
        .await
        .expect("drop slot");
    let run = outbox.run_command(&["run"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains(&format!("slot \"{}\" does not exist", outbox.slot))
            && stderr.contains("Fix:"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_level_replica_is_a_clear_error() {
    let server = common::PgServer::start(&[("wal_level", "replica")]);
    let url = server.url("postgres");
    for command in ["setup", "run"] {
        let output = std::process::Command::new(common::relay::binary())
            .args([
                command,
                "--database-url",
                &url,
                "--amqp-url",
                "amqp://127.0.0.1:1",
            ])
            .output()
            .expect("run outbox-relay");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success());
        assert!(
            stderr.contains("wal_level = 'replica'") && stderr.contains("wal_level = 'logical'"),
            "{command}: {stderr}"
        );
    }
}
