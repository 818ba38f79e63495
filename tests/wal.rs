//! WAL mode end to end, against a real PostgreSQL (wal_level=logical) and RabbitMQ.
//!
//! Oracles come from outside the relay: commit order from a `test_decoding` slot created
//! before the writers start, delivery from the queue itself, acknowledgement from
//! `pg_replication_slots`.

use outbox_testkit as common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::faults::{relay_crash_duplicate_bound, settled, Upto};
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

/// The ids of `wanted` that have not arrived (yet).
fn missing_ids<'a>(consumer: &mut Consumer, wanted: &HashSet<&'a str>) -> Vec<&'a str> {
    let arrived: HashSet<&str> = received_ids(consumer.received()).into_iter().collect();
    wanted
        .iter()
        .filter(|id| !arrived.contains(**id))
        .copied()
        .collect()
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

    // Nothing failed, so nothing may arrive twice: once the slot has passed every commit,
    // any repeat would be in the queue ahead of the marker.
    consumer
        .wait_for(expected.len(), Duration::from_secs(120))
        .await;
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let log = || relay.log();
    let received = settled(&mut consumer, url, queue, Upto::slot(&outbox), log).await;
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
    assert!(
        first.timestamp.is_some(),
        "created_at gives the message a timestamp: {first:?}"
    );
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
    consumer.wait_for(3, Duration::from_secs(30)).await;
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let log = || relay.log();
    let received = settled(&mut consumer, url, queue, Upto::slot(&outbox), log).await;
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
    // The relay has exited, holding the slot at the unroutable row: what it acknowledged was
    // confirmed before its exit, so it is in the queue ahead of the marker.
    let log = || relay.log();
    let received = settled(&mut consumer, &outbox.amqp_url, &routed, Upto::Done, log).await;
    let delivered: HashSet<String> = received_ids(received)
        .into_iter()
        .map(String::from)
        .collect();
    assert!(
        delivered.contains(&first),
        "the row before the unroutable one, {first}, arrived: delivered {delivered:?}; log:\n{}",
        relay.log()
    );
    // Pipelining may deliver rows after the stuck one; none of them may be acknowledged.
    assert_ack_invariant(&outbox, &oracle, &delivered).await;

    // Once a queue is bound for it, the stuck message and the ones behind it are delivered.
    let catch_all = format!("{}_all", outbox.queue);
    common::declare_bound_queue(&outbox.amqp_url, &outbox.exchange, &catch_all, "#").await;
    let mut all = Consumer::start(&outbox.amqp_url, &catch_all).await;
    let relay = outbox.spawn_relay(&[]);
    // At least once: the first row may come again, if its acknowledgement had not reached
    // PostgreSQL when the first relay stopped.
    let wanted: HashSet<&str> = [stuck.as_str(), after.as_str()].into();
    assert!(
        wait_for_ids(&mut all, &wanted, Duration::from_secs(30)).await,
        "once a queue is bound, the stuck row and the one behind it arrive: missing {:?}; \
         log:\n{}",
        missing_ids(&mut all, &wanted),
        relay.log()
    );
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
    assert!(
        relay.wait_exit(Duration::from_secs(20)).await.is_some(),
        "relay stops on SIGTERM; log:\n{}",
        relay.log()
    );
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
    assert!(
        relay.wait_exit(Duration::from_secs(10)).await.is_some(),
        "the relay is gone after kill -9; log:\n{}",
        relay.log()
    );
    // The premise: the kill left part of the backlog to the restart.
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let before_restart = settled(&mut consumer, url, queue, Upto::Done, || relay.log())
        .await
        .len();
    assert!(
        before_restart < ROWS,
        "the kill did not land mid-backlog: {before_restart} of {ROWS} rows had arrived; \
         log:\n{}",
        relay.log()
    );

    let relay = outbox.spawn_relay(&["--max-in-flight", &MAX_IN_FLIGHT.to_string()]);
    let committed: HashSet<&str> = committed.iter().map(String::as_str).collect();
    wait_for_ids(&mut consumer, &committed, Duration::from_secs(180)).await;
    let log = || relay.log();
    let received = settled(&mut consumer, url, queue, Upto::slot(&outbox), log).await;
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
    // The premise: the stop left part of the rows to the restart.
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let before_restart = settled(&mut consumer, url, queue, Upto::Done, || relay.log())
        .await
        .len();
    assert!(
        before_restart < ROWS,
        "SIGTERM did not land mid-stream: {before_restart} of {ROWS} rows had arrived; \
         log:\n{}",
        relay.log()
    );

    let relay = outbox.spawn_relay(&[]);
    consumer.wait_for(ROWS, Duration::from_secs(120)).await;
    let log = || relay.log();
    let received = settled(&mut consumer, url, queue, Upto::slot(&outbox), log).await;
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
    assert!(
        !run.status.success(),
        "run without the publication must fail: {}; stderr: {stderr}",
        run.status
    );
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
    assert!(
        !run.status.success(),
        "run without the slot must fail: {}; stderr: {stderr}",
        run.status
    );
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
        assert_eq!(
            output.status.code(),
            Some(i32::from(outbox_relay::exit::CONFIG)),
            "{command} must fail under wal_level=replica, with the configuration's exit code; \
             stderr: {stderr}"
        );
        assert!(
            stderr.contains("wal_level = 'replica'") && stderr.contains("wal_level = 'logical'"),
            "{command}: {stderr}"
        );
    }
}

/// Inserts `rows` rows into `table` (a name the outbox table has for now), in transactions of
/// `per_transaction`; returns their ids.
async fn insert_into(
    client: &tokio_postgres::Client,
    table: &str,
    rows: usize,
    per_transaction: usize,
) -> Vec<String> {
    let mut ids = Vec::with_capacity(rows);
    while ids.len() < rows {
        let n = per_transaction.min(rows - ids.len()) as i32;
        let inserted = client
            .query(
                &format!(
                    "INSERT INTO {table} (event_type, payload) \
                     SELECT 'TestEvent', jsonb_build_object('n', g) \
                     FROM generate_series(1, $1::int) g RETURNING id::text"
                ),
                &[&n],
            )
            .await
            .unwrap_or_else(|e| panic!("insert into {table}: {e:?}"));
        ids.extend(inserted.iter().map(|row| row.get::<_, String>(0)));
    }
    ids
}

/// What a renamed outbox left: the rows delivered before the rename, and those written to
/// the table under its new name, `public.outbox_renamed`, none of them delivered yet.
struct Renamed {
    outbox: Outbox,
    consumer: Consumer,
    before: Vec<String>,
    renamed: Vec<String>,
}

/// `ALTER TABLE outbox RENAME` while the relay streams, then 200 rows under the new name:
/// those must neither vanish nor be acknowledged. The relay stops, naming both names and
/// the fix, with the slot below the first commit into the renamed table (the
/// `test_decoding` oracle), and a relay started again as it is names the renamed table.
async fn rename_while_streaming(prefix: &str) -> Renamed {
    let outbox = Outbox::new(prefix).await;
    let oracle = format!("{}_oracle", outbox.slot);
    create_test_decoding_slot(&outbox.client, &oracle).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let relay = outbox.spawn_relay(&[]);
    let before = outbox.seed_single_row_transactions(50, 2).await;
    let wanted: HashSet<&str> = before.iter().map(String::as_str).collect();
    assert!(
        wait_for_ids(&mut consumer, &wanted, Duration::from_secs(60)).await,
        "rows before the rename arrive; log:\n{}",
        relay.log()
    );

    outbox
        .client
        .batch_execute("ALTER TABLE outbox RENAME TO outbox_renamed")
        .await
        .expect("rename");
    let renamed = insert_into(&outbox.client, "outbox_renamed", 200, 50).await;
    let first_renamed_commit = read_test_decoding(&outbox.client, &oracle)
        .await
        .iter()
        .find(|t| !t.inserted_ids("public.outbox_renamed").is_empty())
        .expect("the oracle saw the rows of the renamed table")
        .end_lsn;
    // Until the relay exits, and once more after: the slot never passes those rows.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        let exited = relay.try_exit();
        let confirmed = outbox.confirmed_flush().await;
        assert!(
            confirmed < first_renamed_commit,
            "the slot was acknowledged past the rows written to the renamed table \
             (confirmed_flush_lsn {confirmed:X}, their first commit ends at \
             {first_renamed_commit:X}); delivered {} of them; log:\n{}",
            renamed
                .iter()
                .filter(|id| received_ids(consumer.received()).contains(&id.as_str()))
                .count(),
            relay.log()
        );
        if let Some(status) = exited {
            break status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the relay did not stop; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let log = relay.log();
    assert_eq!(
        status.code(),
        Some(i32::from(outbox_relay::exit::CONFIG)),
        "exit status; log:\n{log}"
    );
    let error =
        common::relay::final_error(&log).unwrap_or_else(|| panic!("no final error; log:\n{log}"));
    assert!(
        error.contains("The outbox table public.outbox was renamed to public.outbox_renamed")
            && error.contains(
                "Fix: rename it back (ALTER TABLE public.outbox_renamed RENAME TO outbox)"
            )
            && error.contains("--table public.outbox_renamed"),
        "the error names the old and the new name and the fix: {error}"
    );
    let delivered: HashSet<&str> = received_ids(consumer.received()).into_iter().collect();
    assert!(
        renamed.iter().all(|id| !delivered.contains(id.as_str())),
        "nothing of the renamed table was published"
    );

    // Started again as it is, the relay stops at once, naming the table the publication has.
    let again = outbox.spawn_relay(&[]);
    let status = again.wait_exit(Duration::from_secs(60)).await;
    let log = again.log();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(i32::from(outbox_relay::exit::CONFIG)),
        "log:\n{log}"
    );
    let error = common::relay::final_error(&log).unwrap_or_default();
    assert!(
        error.contains("(it includes public.outbox_renamed)")
            && error.contains("rename it back instead"),
        "{error}"
    );
    Renamed {
        outbox,
        consumer,
        before,
        renamed,
    }
}

/// Renamed back (the error's first fix), every row arrives on a new relay, the ones written
/// under the other name too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_outbox_stops_the_relay_and_renamed_back_delivers_every_row() {
    let Renamed {
        outbox,
        mut consumer,
        before,
        renamed,
    } = rename_while_streaming("rename").await;
    outbox
        .client
        .batch_execute("ALTER TABLE outbox_renamed RENAME TO outbox")
        .await
        .expect("rename back");
    let after = outbox.insert("AfterRenameBack", "{}").await;
    let relay = outbox.spawn_relay(&[]);
    let every: HashSet<&str> = before
        .iter()
        .chain(&renamed)
        .chain([&after])
        .map(String::as_str)
        .collect();
    assert!(
        wait_for_ids(&mut consumer, &every, Duration::from_secs(60)).await,
        "every row arrives after the rename back; log:\n{}",
        relay.log()
    );
    relay.stop().await;
}

/// Kept under the new name (the error's second fix: `--table` names it), every row arrives,
/// the ones the table took under its old name before the stop too (here: none undelivered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_outbox_is_delivered_under_its_new_name_with_table() {
    let Renamed {
        outbox,
        mut consumer,
        renamed,
        ..
    } = rename_while_streaming("rename_kept").await;
    let relay = outbox.spawn_relay(&["--table", "public.outbox_renamed"]);
    let wanted: HashSet<&str> = renamed.iter().map(String::as_str).collect();
    assert!(
        wait_for_ids(&mut consumer, &wanted, Duration::from_secs(60)).await,
        "the rows written under the new name arrive; log:\n{}",
        relay.log()
    );
    relay.stop().await;
}

/// The reverse of a rename: the outbox table dropped and created again under its name. DROP
/// TABLE took the old table out of the publication and the new one is not in it, so its rows
/// are decoded by no slot and nothing in the stream says so. The relay stops, naming the
/// publication and the fix, rather than run on without them; fixed as the error says (the
/// table added to the publication, `resync` for the rows in between), every row arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_outbox_outside_the_publication_stops_the_relay() {
    let outbox = Outbox::new("recreate").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let relay = outbox.spawn_relay(&[]);
    let first = outbox.insert("BeforeRecreate", "{}").await;
    assert!(
        wait_for_ids(
            &mut consumer,
            &[first.as_str()].into(),
            Duration::from_secs(60)
        )
        .await,
        "log:\n{}",
        relay.log()
    );
    outbox
        .client
        .batch_execute(
            "CREATE TABLE outbox_new (LIKE outbox INCLUDING ALL);
             DROP TABLE outbox;
             ALTER TABLE outbox_new RENAME TO outbox;",
        )
        .await
        .expect("recreate");
    let now = "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', \
               'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')";
    let since: String = common::pg::query_value(&outbox.client, now).await;
    let unpublished = outbox.insert("AfterRecreate", "{}").await;

    let status = relay.wait_exit(Duration::from_secs(60)).await;
    let log = relay.log();
    let status = status.unwrap_or_else(|| {
        panic!("the relay ran on with the outbox table outside the publication; log:\n{log}")
    });
    assert_eq!(
        status.code(),
        Some(i32::from(outbox_relay::exit::CONFIG)),
        "log:\n{log}"
    );
    let error = common::relay::final_error(&log).unwrap_or_default();
    assert!(
        error.contains("no longer includes the outbox table public.outbox")
            && error.contains("dropped and created again")
            && error.contains("ALTER PUBLICATION outbox_pub ADD TABLE public.outbox")
            && error.contains("resync --since"),
        "{error}"
    );

    outbox
        .client
        .batch_execute("ALTER PUBLICATION outbox_pub ADD TABLE outbox")
        .await
        .expect("add the new table");
    let resync = outbox.run_command(&["resync", "--since", &since]);
    assert!(resync.status.success(), "{resync:?}");
    let relay = outbox.spawn_relay(&[]);
    let later = outbox.insert("AfterFix", "{}").await;
    let wanted: HashSet<&str> = [unpublished.as_str(), later.as_str()].into();
    assert!(
        wait_for_ids(&mut consumer, &wanted, Duration::from_secs(60)).await,
        "log:\n{}",
        relay.log()
    );
    relay.stop().await;
}
