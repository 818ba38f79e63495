//! The table-less outbox: events written with the emit functions `setup` creates,
//! published by `run` like rows, against real PostgreSQL and RabbitMQ.
//!
//! Oracles come from outside the relay: a `test_decoding` slot created before the writers
//! start (it shows the logical messages too, in WAL order with the rows), the ids the emit
//! functions returned to the writers, the outbox table itself, the queues and
//! `pg_replication_slots`.

use outbox_relay::metrics::{
    DEAD_LETTERED_TOTAL, DECODED_MESSAGES_TOTAL, HEARTBEAT_LAG_SECONDS,
    IGNORED_LOGICAL_MESSAGES_TOTAL, REASON_LABEL, SOURCE_LABEL,
};
use outbox_testkit as common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::faults::{ids_of, relay_crash_duplicate_bound, settled, wait_for_ids, Oracle, Upto};
use common::http::{metric_value, metrics};
use common::outbox::Outbox;
use common::{
    declare_bound_queue, pg_connect, read_test_decoding_with_messages, unique_name, Consumer,
    Received,
};

const OUTBOX: &str = "public.outbox";
/// `--emit-prefix`'s default for the table `outbox`.
const PREFIX: &str = "outbox-relay:emit:public.outbox";
const MINUTE: Duration = Duration::from_secs(60);

/// What a writer expects the consumer to receive for one committed event.
#[derive(Debug, Clone)]
enum Expected {
    Json(serde_json::Value),
    Text(String),
    Bytes(Vec<u8>),
}

/// What the writers did: the ids of committed events and rows, what each event must carry,
/// and the ids the database returned for work that was rolled back.
#[derive(Default)]
struct Written {
    events: HashMap<String, Expected>,
    rows: HashSet<String>,
    undone: HashSet<String>,
}

/// `writers` connections, each writing until it has committed `per_writer` events: 1 to 8
/// operations a transaction, most `outbox_emit` (jsonb), some `outbox_emit_text`,
/// `outbox_emit_bytea` or a plain insert into the table; about 5 % of transactions rolled
/// back, and about 5 % of operations undone by ROLLBACK TO SAVEPOINT inside transactions that
/// commit. Deterministic per writer.
async fn write_events(db_url: &str, writers: usize, per_writer: usize) -> Written {
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let db_url = db_url.to_string();
        tasks.push(tokio::spawn(async move {
            let mut client = pg_connect(&db_url).await;
            let mut written = Written::default();
            let mut seed = writer as u64 * 7919 + 17;
            let mut next = move |n: u64| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 33) % n
            };
            let mut committed = 0;
            while committed < per_writer {
                let txn = client.transaction().await.expect("begin");
                let rollback = next(100) < 5;
                let mut events = Vec::new();
                let mut rows = Vec::new();
                let mut undone = Vec::new();
                for op in 0..1 + next(8) {
                    let savepoint = next(100) < 5;
                    if savepoint {
                        txn.batch_execute("SAVEPOINT sp").await.expect("savepoint");
                    }
                    let n = format!("{writer}-{committed}-{op}");
                    let (id, expected): (String, Option<Expected>) = match next(100) {
                        0..=9 => {
                            let id = txn
                                .query_one(
                                    "INSERT INTO outbox (event_type, payload) \
                                     VALUES ('Row', jsonb_build_object('n', $1::text)) \
                                     RETURNING id::text",
                                    &[&n],
                                )
                                .await
                                .expect("insert");
                            (id.get(0), None)
                        }
                        10..=14 => {
                            let text = format!("text {n} \"q\" é\n");
                            let id = txn
                                .query_one("SELECT outbox_emit_text('Text', $1)::text", &[&text])
                                .await
                                .expect("outbox_emit_text");
                            (id.get(0), Some(Expected::Text(text)))
                        }
                        15..=19 => {
                            let bytes: Vec<u8> = [0, 255, writer as u8]
                                .into_iter()
                                .chain(n.bytes())
                                .collect();
                            let id = txn
                                .query_one("SELECT outbox_emit_bytea('Bytes', $1)::text", &[&bytes])
                                .await
                                .expect("outbox_emit_bytea");
                            (id.get(0), Some(Expected::Bytes(bytes)))
                        }
                        _ => {
                            let payload = serde_json::json!({"writer": writer, "n": n});
                            let id = txn
                                .query_one(
                                    "SELECT outbox_emit(event_type => 'Json', \
                                     payload => $1::text::jsonb, aggregate_id => $2)::text",
                                    &[&payload.to_string(), &writer.to_string()],
                                )
                                .await
                                .expect("outbox_emit");
                            (id.get(0), Some(Expected::Json(payload)))
                        }
                    };
                    if savepoint && next(2) == 0 {
                        txn.batch_execute("ROLLBACK TO SAVEPOINT sp")
                            .await
                            .expect("rollback to savepoint");
                        undone.push(id);
                    } else {
                        match expected {
                            Some(expected) => events.push((id, expected)),
                            None => rows.push(id),
                        }
                    }
                }
                if rollback {
                    txn.rollback().await.expect("rollback");
                    undone.extend(events.into_iter().map(|(id, _)| id));
                    undone.extend(rows);
                } else {
                    txn.commit().await.expect("commit");
                    committed += events.len();
                    written.events.extend(events);
                    written.rows.extend(rows);
                }
                written.undone.extend(undone);
            }
            written
        }));
    }
    let mut all = Written::default();
    for task in tasks {
        let written = task.await.expect("writer task");
        all.events.extend(written.events);
        all.rows.extend(written.rows);
        all.undone.extend(written.undone);
    }
    all
}

/// `received` carries what its writer emitted, with the content type of its payload type.
fn assert_carries(received: &Received, expected: &Expected) {
    let (content_type, kind) = match expected {
        Expected::Json(json) => {
            assert_eq!(&received.body_json(), json, "jsonb payload JSON-equal");
            ("application/json", "Json")
        }
        Expected::Text(text) => {
            assert_eq!(received.body, text.as_bytes(), "text payload byte-equal");
            ("text/plain; charset=utf-8", "Text")
        }
        Expected::Bytes(bytes) => {
            assert_eq!(&received.body, bytes, "bytea payload byte-equal");
            ("application/octet-stream", "Bytes")
        }
    };
    assert_eq!(received.content_type.as_deref(), Some(content_type));
    assert_eq!(received.kind.as_deref(), Some(kind));
    assert_eq!(received.routing_key, kind);
    assert_eq!(received.delivery_mode, Some(2), "persistent");
    assert!(received.timestamp.is_some(), "created_at as timestamp");
}

/// Acceptance 1: 20,000 events from 8 writers, with rollbacks, savepoints rolled back and
/// table inserts in the same transactions. Every committed event arrives once, none that was
/// rolled back, in commit order interleaved with the rows as in the WAL; the ids the emit
/// functions returned are the message ids; `outbox_emit` writes nothing to the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emitted_events_arrive_once_in_commit_order_with_the_rows() {
    let outbox = Outbox::new("emit_order").await;
    let oracle = Oracle::create(&outbox).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let (relay, port) = outbox.spawn_observed(&[]);

    let written = write_events(&outbox.db_url, 8, 2_500).await;
    assert!(
        written.events.len() >= 20_000,
        "the writers committed {} events, fewer than 20,000",
        written.events.len()
    );
    assert!(
        !written.undone.is_empty() && !written.rows.is_empty(),
        "the mix has rollbacks and table rows: {} undone, {} rows",
        written.undone.len(),
        written.rows.len()
    );

    let txns = read_test_decoding_with_messages(&outbox.client, &oracle.slot).await;
    let expected: Vec<String> = txns
        .iter()
        .flat_map(|t| t.row_and_message_ids(OUTBOX, PREFIX))
        .collect();
    let emitted: HashSet<String> = txns.iter().flat_map(|t| t.message_ids(PREFIX)).collect();
    let returned: HashSet<String> = written.events.keys().cloned().collect();
    assert_eq!(
        emitted, returned,
        "the oracle's committed events are exactly those whose ids the emit functions returned"
    );
    assert_eq!(expected.len(), written.events.len() + written.rows.len());

    consumer
        .wait_for(expected.len(), Duration::from_secs(180))
        .await;
    // The table-less outbox has a slot too: past the WAL end, any repeat is ahead of the marker.
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let log = || relay.log();
    let received = settled(&mut consumer, url, queue, Upto::slot(&outbox), log)
        .await
        .to_vec();
    let got = ids_of(&received);
    assert_eq!(
        got.len(),
        expected.len(),
        "each event and row exactly once; log:\n{}",
        relay.log()
    );
    assert_eq!(
        got, expected,
        "commit order, events and rows of a transaction in WAL order"
    );
    assert!(
        got.iter().all(|id| !written.undone.contains(*id)),
        "nothing rolled back arrives"
    );
    let seqs: Vec<&str> = received
        .iter()
        .map(|r| r.header_str("x-outbox-seq").expect("x-outbox-seq"))
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "x-outbox-seq increases across rows and events"
    );
    for r in &received {
        let id = r.message_id.as_deref().expect("message_id");
        if let Some(expected) = written.events.get(id) {
            assert_carries(r, expected);
            assert!(
                r.header_str("x-outbox-lsn").is_some(),
                "event {id} carries x-outbox-lsn: {:?}",
                r.headers
            );
        }
    }
    let json = received
        .iter()
        .find(|r| r.kind.as_deref() == Some("Json"))
        .expect("a jsonb event");
    let writer = json.body_json()["writer"].to_string();
    assert_eq!(json.header_str("x-aggregate-id"), Some(writer.as_str()));

    let rows: i64 = outbox
        .client
        .query_one("SELECT count(*) FROM outbox", &[])
        .await
        .expect("count rows")
        .get(0);
    assert_eq!(
        rows as usize,
        written.rows.len(),
        "the table holds the inserted rows only: outbox_emit writes nothing to it"
    );

    let scrape = metrics(port).await;
    let count = |source: &str| {
        metric_value(
            &scrape,
            &common::http::series(DECODED_MESSAGES_TOTAL, &[(SOURCE_LABEL, source)]),
        )
    };
    assert_eq!(relay.sessions(), 1, "no reconnect; log:\n{}", relay.log());
    assert_eq!(count("emitted"), Some(written.events.len() as f64));
    assert_eq!(count("row"), Some(written.rows.len() as f64));

    let last = txns.last().expect("transactions").end_lsn;
    assert!(
        outbox.wait_confirmed_flush(last, MINUTE).await,
        "the slot reaches the last commit; log:\n{}",
        relay.log()
    );
    relay.stop().await;
}

/// Emits one event of `event_type` with a small jsonb payload in its own transaction.
async fn emit(outbox: &Outbox, event_type: &str) -> String {
    outbox
        .client
        .query_one("SELECT outbox_emit($1, '{\"n\": 1}')::text", &[&event_type])
        .await
        .expect("outbox_emit")
        .get(0)
}

/// Writes `content` by hand as a transactional message with the outbox's prefix.
async fn emit_by_hand(outbox: &Outbox, content: &str) {
    outbox
        .client
        .execute(
            "SELECT pg_logical_emit_message(true, $1, $2::text)",
            &[&PREFIX, &content],
        )
        .await
        .expect("pg_logical_emit_message");
}

/// The end LSN of the transaction that wrote the message with `prefix` and no readable id.
async fn end_of_unreadable_message(outbox: &Outbox, oracle: &Oracle) -> u64 {
    read_test_decoding_with_messages(&outbox.client, &oracle.slot)
        .await
        .iter()
        .find(|t| {
            t.changes
                .iter()
                .any(|c| c.op == "MESSAGE" && c.table == PREFIX && c.id.is_none())
        })
        .expect("the oracle has the malformed message")
        .end_lsn
}

/// Acceptance 4: a malformed envelope, and one of a newer version, written by hand with the
/// prefix. Under halt the relay stops at the first, naming it, delivers what came before and
/// acknowledges nothing past it; under dead-letter both go to the dead-letter exchange with
/// the reason, and delivery moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_envelopes_halt_or_are_dead_lettered_never_acknowledged_silently() {
    let outbox = Outbox::new("emit_malformed").await;
    let dead_letter_exchange = format!("{}.dead-letter", outbox.exchange);
    let policy = [
        "--on-unroutable",
        "dead-letter",
        "--dead-letter-exchange",
        dead_letter_exchange.as_str(),
    ];
    let setup = outbox.run_command(&[&["setup"][..], &policy].concat());
    assert!(setup.status.success(), "{setup:?}");
    let dead_letter_queue = unique_name("emit_dlq");
    declare_bound_queue(
        &outbox.amqp_url,
        &dead_letter_exchange,
        &dead_letter_queue,
        "#",
    )
    .await;
    let oracle = Oracle::create(&outbox).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let mut dead_letters = Consumer::start(&outbox.amqp_url, &dead_letter_queue).await;

    let before = emit(&outbox, "Good.before").await;
    emit_by_hand(&outbox, "not an envelope {secret-7f3a}").await;
    emit_by_hand(
        &outbox,
        r#"{"v": 2, "id": "from-the-future", "event_type": "Good.future"}"#,
    )
    .await;
    let after = emit(&outbox, "Good.after").await;
    let malformed_end = end_of_unreadable_message(&outbox, &oracle).await;

    // Halt (the default): stops at the malformed message, naming it and the fix.
    let relay = outbox.spawn_relay(&["--max-backoff", "1s"]);
    let status = relay.wait_exit(MINUTE).await.unwrap_or_else(|| {
        panic!(
            "the relay did not stop at the malformed envelope; log:\n{}",
            relay.log()
        )
    });
    assert!(!status.success(), "exits non-zero; log:\n{}", relay.log());
    let log = relay.log();
    assert!(
        log.contains("emitted event") && log.contains("envelope") && log.contains("docs/emit.md"),
        "the error names the event and the fix; log:\n{log}"
    );
    assert!(
        !log.contains("secret-7f3a"),
        "no content in the log:\n{log}"
    );
    assert!(
        wait_for_ids(&mut consumer, std::slice::from_ref(&before), MINUTE).await,
        "the event before it is delivered; log:\n{log}"
    );
    assert!(
        outbox.confirmed_flush().await < malformed_end,
        "nothing acknowledged past the malformed message"
    );

    // Dead-letter: both go to the dead-letter exchange with the reason; delivery moves on.
    let (relay, port) = outbox.spawn_observed(&policy);
    assert!(
        wait_for_ids(&mut consumer, std::slice::from_ref(&after), MINUTE).await,
        "the event after them is delivered; log:\n{}",
        relay.log()
    );
    let letters = dead_letters.wait_for(2, MINUTE).await.to_vec();
    assert_eq!(letters.len(), 2, "{letters:#?}; log:\n{}", relay.log());
    let reason = |r: &Received| {
        r.header_str("x-outbox-dead-letter-reason")
            .unwrap_or_default()
            .to_string()
    };
    let malformed = &letters[0];
    let seq = malformed
        .header_str("x-outbox-seq")
        .expect("x-outbox-seq")
        .to_string();
    assert_eq!(
        malformed.message_id.as_deref(),
        Some(format!("emitted-{seq}").as_str()),
        "no readable id: one made of its stream position"
    );
    assert_eq!(malformed.body, b"not an envelope {secret-7f3a}");
    assert!(
        reason(malformed).starts_with("unmappable: envelope"),
        "{}",
        reason(malformed)
    );
    assert!(
        reason(&letters[1]).contains("version 2"),
        "{}",
        reason(&letters[1])
    );
    let last = read_test_decoding_with_messages(&outbox.client, &oracle.slot)
        .await
        .last()
        .map(|t| t.end_lsn)
        .expect("transactions");
    assert!(
        outbox.wait_confirmed_flush(last, MINUTE).await,
        "the slot moves past the dead-lettered messages; log:\n{}",
        relay.log()
    );
    let scrape = metrics(port).await;
    assert_eq!(
        metric_value(
            &scrape,
            &common::http::series(DEAD_LETTERED_TOTAL, &[(REASON_LABEL, "unmappable")])
        ),
        Some(2.0)
    );
    relay.stop().await;
}

/// `total` events, each in its own transaction, from `writers` connections; returns the ids.
async fn emit_single_event_transactions(db_url: &str, total: usize, writers: usize) -> Vec<String> {
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let share = total / writers + usize::from(writer < total % writers);
        let db_url = db_url.to_string();
        tasks.push(tokio::spawn(async move {
            let client = pg_connect(&db_url).await;
            let mut ids = Vec::with_capacity(share);
            for n in 0..share {
                let payload = format!(r#"{{"writer": {writer}, "n": {n}}}"#);
                let row = client
                    .query_one(
                        "SELECT outbox_emit('TestEvent', $1::text::jsonb)::text",
                        &[&payload],
                    )
                    .await
                    .expect("outbox_emit");
                ids.push(row.get::<_, String>(0));
            }
            ids
        }));
    }
    let mut all = Vec::with_capacity(total);
    for task in tasks {
        all.extend(task.await.expect("writer task"));
    }
    all
}

/// Acceptance 2: kill -9 of the relay in the middle of a backlog of emitted events, then a
/// restart: nothing lost (the WAL is their only copy, and nothing unconfirmed was
/// acknowledged), duplicates within max-in-flight + rate × status interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_of_emitted_events_loses_nothing_and_bounds_duplicates() {
    const EVENTS: usize = 30_000;
    const MAX_IN_FLIGHT: usize = 1024;
    let outbox = Outbox::new("emit_kill").await;
    let committed = emit_single_event_transactions(&outbox.db_url, EVENTS, 4).await;
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;

    let window = MAX_IN_FLIGHT.to_string();
    let relay = outbox.spawn_relay(&["--max-in-flight", &window]);
    // The bound's rate is the rate at the kill, measured over the stretch before it.
    consumer
        .wait_for(EVENTS / 8, Duration::from_secs(120))
        .await;
    let (from_count, from) = (consumer.received().len(), std::time::Instant::now());
    consumer
        .wait_for(EVENTS / 4, Duration::from_secs(120))
        .await;
    let rate = (consumer.received().len() - from_count) as f64 / from.elapsed().as_secs_f64();
    // The premise: all EVENTS were committed before the relay started, so fewer arrived means
    // the kill lands mid-stream.
    let arrived = consumer.received().len();
    assert!(
        arrived < EVENTS,
        "the kill must land mid-stream: {arrived} of {EVENTS} events had arrived"
    );
    relay.kill9();
    assert!(
        relay.wait_exit(Duration::from_secs(10)).await.is_some(),
        "the relay is gone after kill -9; log:\n{}",
        relay.log()
    );

    let relay = outbox.spawn_relay(&["--max-in-flight", &window]);
    assert!(
        wait_for_ids(&mut consumer, &committed, Duration::from_secs(180)).await,
        "every committed event arrives after the restart"
    );
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let log = || relay.log();
    let received = settled(&mut consumer, url, queue, Upto::slot(&outbox), log).await;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for id in ids_of(received) {
        *counts.entry(id).or_default() += 1;
    }
    let lost = committed
        .iter()
        .filter(|id| !counts.contains_key(id.as_str()))
        .count();
    let duplicates: usize = counts.values().map(|n| n - 1).sum();
    // Status interval 100 ms; single-event transactions: no open transaction adds to it.
    let bound = relay_crash_duplicate_bound(MAX_IN_FLIGHT, rate, Duration::from_millis(100), 0);
    println!(
        "kill -9 at ~{rate:.0} events/s: lost {lost}, duplicates {duplicates} (bound {bound})"
    );
    assert_eq!(lost, 0, "no committed event is lost");
    assert!(counts.len() == committed.len(), "nothing invented");
    assert!(
        duplicates <= bound,
        "duplicates {duplicates} within {bound}"
    );
}

/// `url` (the harness's own server, where every role logs in without a password) as `role`.
fn as_role(url: &str, role: &str) -> String {
    url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1)
}

/// The SQLSTATE of calling `sql` as the client, `None` if it succeeds.
async fn sqlstate_of(client: &tokio_postgres::Client, sql: &str) -> Option<String> {
    client
        .batch_execute(sql)
        .await
        .err()
        .map(|e| e.code().map_or("none".into(), |c| c.code().to_string()))
}

/// Acceptance 3: `setup --restrict-emit --emit-role app`. Run by a non-superuser it fails
/// with a clear error and changes nothing; run by a superuser, `app` can call the emit
/// functions and neither overload of pg_logical_emit_message, another role cannot call
/// them, and the relay, as a least-privilege role, still writes and sees its heartbeats and
/// delivers app's events. A later setup without --restrict-emit refuses to undo it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restrict_emit_lets_only_the_app_role_emit_and_keeps_the_heartbeats() {
    if !common::own_postgres("roles log in without a password") {
        return;
    }
    let outbox = Outbox::new("emit_restrict").await;
    let [app, other, relay_role] = ["app", "other", "relay"].map(unique_name);
    outbox
        .client
        .batch_execute(&format!(
            "CREATE ROLE {app} LOGIN; CREATE ROLE {other} LOGIN; \
             CREATE ROLE {relay_role} LOGIN REPLICATION; \
             GRANT SELECT, DELETE ON TABLE public.outbox TO {relay_role}; \
             GRANT SELECT, INSERT, UPDATE ON TABLE public.outbox_relay_state TO {relay_role};"
        ))
        .await
        .expect("roles");
    let emit_call = "SELECT outbox_emit('Restricted', '{}')";
    let direct = [
        "SELECT pg_logical_emit_message(true, 'outbox-relay:emit:public.outbox', 'forged')",
        "SELECT pg_logical_emit_message(true, 'outbox-relay:emit:public.outbox', 'forged'::bytea)",
    ];
    let restrict = [
        "setup",
        "--restrict-emit",
        "--emit-role",
        app.as_str(),
        "--relay-role",
        relay_role.as_str(),
    ];

    // A non-superuser: a clear error, and nothing changed.
    let other_url = as_role(&outbox.db_url, &other);
    let refused = std::process::Command::new(common::relay::binary())
        .args(restrict)
        .args(outbox.flags_via("setup", &other_url, &outbox.amqp_url))
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .output()
        .expect("setup as a non-superuser");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr)
    );
    assert_eq!(
        refused.status.code(),
        Some(i32::from(outbox_relay::exit::CONFIG)),
        "{said}"
    );
    assert!(
        said.contains("needs a superuser") && said.contains("Nothing was changed"),
        "{said}"
    );
    let other_client = pg_connect(&other_url).await;
    assert_eq!(
        sqlstate_of(&other_client, emit_call).await,
        None,
        "unchanged"
    );
    // (Another prefix: a forged message with ours would rightly stop the relay below.)
    let unrelated = "SELECT pg_logical_emit_message(true, 'test:unrelated', 'x')";
    assert_eq!(
        sqlstate_of(&other_client, unrelated).await,
        None,
        "unchanged"
    );

    // A superuser: restricted.
    let done = outbox.run_command(&restrict);
    assert!(done.status.success(), "{done:?}");
    let app_client = pg_connect(&as_role(&outbox.db_url, &app)).await;
    let other_client = pg_connect(&other_url).await;
    assert_eq!(
        sqlstate_of(&app_client, emit_call).await,
        None,
        "app may emit"
    );
    for sql in direct {
        assert_eq!(
            sqlstate_of(&app_client, sql).await.as_deref(),
            Some("42501"),
            "app may not call {sql}"
        );
        assert_eq!(
            sqlstate_of(&other_client, sql).await.as_deref(),
            Some("42501")
        );
    }
    for function in ["outbox_emit_text", "outbox_emit_bytea"] {
        let sql = format!("SELECT {function}('Restricted', NULL)");
        assert_eq!(sqlstate_of(&app_client, &sql).await, None, "{sql}");
        assert_eq!(
            sqlstate_of(&other_client, &sql).await.as_deref(),
            Some("42501"),
            "another role may not call {function}"
        );
    }
    assert_eq!(
        sqlstate_of(&other_client, emit_call).await.as_deref(),
        Some("42501"),
        "another role may not emit"
    );

    // The relay as a least-privilege role: heartbeats still work, app's events arrive.
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay_url = as_role(&outbox.db_url, &relay_role);
    let relay = outbox.spawn_relay_via(
        &relay_url,
        &outbox.amqp_url,
        &["--heartbeat-interval", "1s", "--metrics-addr", &addr],
    );
    let id: String = app_client
        .query_one("SELECT outbox_emit('Restricted', '{\"n\": 1}')::text", &[])
        .await
        .expect("app emits")
        .get(0);
    assert!(
        wait_for_ids(&mut consumer, std::slice::from_ref(&id), MINUTE).await,
        "app's event arrives; log:\n{}",
        relay.log()
    );
    let scrape = common::http::wait_metrics(port, MINUTE, |m| {
        metric_value(m, HEARTBEAT_LAG_SECONDS).is_some()
    })
    .await;
    assert!(
        metric_value(&scrape, HEARTBEAT_LAG_SECONDS).is_some_and(|lag| lag < 30.0),
        "heartbeats are written and acknowledged; log:\n{}",
        relay.log()
    );
    assert!(
        !relay.log().contains("heartbeats disabled"),
        "{}",
        relay.log()
    );
    relay.stop().await;

    // setup without --restrict-emit would undo it: refused.
    let undo = outbox.run_command(&["setup"]);
    assert_eq!(
        undo.status.code(),
        Some(i32::from(outbox_relay::exit::CONFIG)),
        "{undo:?}"
    );
    assert!(
        String::from_utf8_lossy(&undo.stderr).contains("--restrict-emit"),
        "{undo:?}"
    );
    assert_eq!(
        sqlstate_of(&app_client, emit_call).await,
        None,
        "still restricted, still works"
    );
}

/// Other prefixes are not ours: ignored and counted, never published. A relay whose
/// --emit-prefix differs from the one the emit functions write refuses to start, since it
/// would skip (and lose) their events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_prefixes_are_ignored_and_a_prefix_mismatch_refuses_to_start() {
    let outbox = Outbox::new("emit_prefixes").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;

    let mismatched =
        outbox.spawn_relay(&["--emit-prefix", "someone:else", "--metrics-addr", "off"]);
    let status = mismatched.wait_exit(MINUTE).await.expect("exits");
    assert!(
        !status.success(),
        "a relay with another --emit-prefix refuses to start: {status}; log:\n{}",
        mismatched.log()
    );
    let log = mismatched.log();
    assert!(
        log.contains("'someone:else'") && log.contains("--emit-prefix"),
        "names the prefix and the flag; log:\n{log}"
    );

    outbox
        .client
        .batch_execute(
            "BEGIN; SELECT pg_logical_emit_message(true, 'other:tool', 'not ours'); COMMIT;",
        )
        .await
        .expect("another tool's message");
    let ours = emit(&outbox, "Ours").await;
    let (relay, port) = outbox.spawn_observed(&[]);
    assert!(
        wait_for_ids(&mut consumer, std::slice::from_ref(&ours), MINUTE).await,
        "log:\n{}",
        relay.log()
    );
    let scrape = metrics(port).await;
    assert_eq!(
        metric_value(&scrape, IGNORED_LOGICAL_MESSAGES_TOTAL),
        Some(1.0)
    );
    assert_eq!(ids_of(consumer.received()), [ours.as_str()], "only ours");
    relay.stop().await;
}

/// The CloudEvents extension rule (the SDK does not check it): lower-case a-z and 0-9, at most
/// 20 characters.
fn valid_extension_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 20
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// `received` parses as a CloudEvent (structured mode) with the cloudevents SDK, says what
/// the plain message's properties say, and carries `data` (JSON, text or bytes).
fn assert_cloudevent(received: &Received, data: &cloudevents::Data) -> cloudevents::Event {
    use cloudevents::AttributesReader as _;
    assert_eq!(
        received.content_type.as_deref(),
        Some("application/cloudevents+json")
    );
    let event: cloudevents::Event = serde_json::from_slice(&received.body).unwrap_or_else(|e| {
        panic!(
            "not a CloudEvent ({e}): {}",
            String::from_utf8_lossy(&received.body)
        )
    });
    assert_eq!(event.specversion().as_str(), "1.0");
    assert_eq!(Some(event.id()), received.message_id.as_deref());
    assert_eq!(Some(event.ty()), received.kind.as_deref());
    assert!(
        event.source().starts_with("urn:outbox-relay:")
            && event.source().ends_with(":public.outbox"),
        "{}",
        event.source()
    );
    let time = event.time().expect("time");
    assert_eq!(
        Some(time.timestamp() as u64),
        received.timestamp,
        "time = created_at"
    );
    assert_eq!(event.data(), Some(data));
    for (name, _) in event.iter_extensions() {
        assert!(valid_extension_name(name), "extension name {name:?}");
    }
    if let Some(seq) = received.header_str("x-outbox-seq") {
        assert_eq!(
            event.extension("outboxseq").map(|v| v.to_string()),
            Some(seq.to_string())
        );
    }
    event
}

/// Acceptance 5: every message of a run in `cloudevents` format parses with the cloudevents
/// SDK, for json, text and bytea payloads, rows and emitted events, in WAL mode and (rows)
/// in polling mode; the AMQP properties stay as in plain mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_format_parses_with_the_sdk_for_rows_and_emitted_events() {
    use cloudevents::Data;
    let outbox = Outbox::new("emit_ce").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let relay = outbox.spawn_relay(&["--message-format", "cloudevents"]);
    let row = outbox.insert("CeRow", r#"{"kind": "row"}"#).await;
    let json: String = outbox
        .client
        .query_one(
            "SELECT outbox_emit('CeJson', '{\"kind\": \"emitted\"}', aggregate_type => 'Order', \
             aggregate_id => '42')::text",
            &[],
        )
        .await
        .expect("outbox_emit")
        .get(0);
    let text: String = outbox
        .client
        .query_one(
            "SELECT outbox_emit_text('CeText', 'héllo \"q\"')::text",
            &[],
        )
        .await
        .expect("outbox_emit_text")
        .get(0);
    let bytes: String = outbox
        .client
        .query_one(
            "SELECT outbox_emit_bytea('CeBytes', '\\x00ff10')::text",
            &[],
        )
        .await
        .expect("outbox_emit_bytea")
        .get(0);
    let ids = [row.clone(), json.clone(), text.clone(), bytes.clone()];
    assert!(
        wait_for_ids(&mut consumer, &ids, MINUTE).await,
        "log:\n{}",
        relay.log()
    );
    let received = consumer.received().to_vec();
    let by_id = |id: &str| {
        received
            .iter()
            .find(|r| r.message_id.as_deref() == Some(id))
            .expect("received")
    };
    assert_cloudevent(by_id(&row), &Data::Json(serde_json::json!({"kind": "row"})));
    let event = assert_cloudevent(
        by_id(&json),
        &Data::Json(serde_json::json!({"kind": "emitted"})),
    );
    assert_eq!(
        event.extension("aggregateid").map(|v| v.to_string()),
        Some("42".to_string())
    );
    assert_eq!(
        event.extension("aggregatetype").map(|v| v.to_string()),
        Some("Order".to_string())
    );
    assert_eq!(
        by_id(&json).header_str("x-aggregate-id"),
        Some("42"),
        "headers as in plain mode"
    );
    assert_cloudevent(by_id(&text), &Data::String("héllo \"q\"".into()));
    assert_cloudevent(by_id(&bytes), &Data::Binary(vec![0x00, 0xff, 0x10]));
    relay.stop().await;

    // Polling mode: rows.
    let s = common::services();
    let poll = Outbox::on_poll(&s.pg.url("postgres"), &s.rabbit.url(), "emit_ce_poll").await;
    let mut consumer = Consumer::start(&poll.amqp_url, &poll.queue).await;
    let poller = poll.spawn_poll(&["--message-format", "cloudevents"], &[]);
    let id = poll.insert("CePolled", r#"{"kind": "polled"}"#).await;
    assert!(
        wait_for_ids(&mut consumer, std::slice::from_ref(&id), MINUTE).await,
        "log:\n{}",
        poller.log()
    );
    let polled = consumer.received()[0].clone();
    let event = assert_cloudevent(&polled, &Data::Json(serde_json::json!({"kind": "polled"})));
    assert!(event.extension("outboxseq").is_none(), "no stream position");
    poller.stop().await;
}

/// The envelope's `shard_hash` is the hash a sharded outbox's row filter computes
/// (docs/scaling.md, "Scaling out"): a shard can select its events by it without reimplementing
/// PostgreSQL's hash functions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_hash_is_the_row_filters_hash_computed_in_sql() {
    let outbox = Outbox::new("emit_hash").await;
    let oracle = Oracle::create(&outbox).await;
    let mut expected = HashMap::new();
    for aggregate_id in [None, Some("42"), Some("order-ü-7"), None] {
        let row = outbox
            .client
            .query_one(
                "WITH e AS (SELECT outbox_emit('Hashed', '{}', aggregate_id => $1) AS id) \
                 SELECT id::text, (CASE WHEN $1::text IS NOT NULL THEN hashtext($1::text) \
                 ELSE uuid_hash(id) END) & 2147483647 FROM e",
                &[&aggregate_id],
            )
            .await
            .expect("emit");
        expected.insert(row.get::<_, String>(0), i64::from(row.get::<_, i32>(1)));
    }
    let contents: Vec<serde_json::Value> = outbox
        .client
        .query(
            "SELECT convert_from(data, 'UTF8') FROM pg_logical_slot_peek_binary_changes($1, \
             NULL, NULL, 'skip-empty-xacts', '0') WHERE convert_from(data, 'UTF8') LIKE 'message:%'",
            &[&oracle.slot],
        )
        .await
        .expect("peek")
        .iter()
        .filter_map(|row| {
            let line: String = row.get(0);
            let (_, json) = line.split_once(" content:")?;
            serde_json::from_str(json).ok()
        })
        .collect();
    assert_eq!(contents.len(), expected.len(), "{contents:?}");
    for envelope in contents {
        let id = envelope["id"].as_str().expect("id");
        assert_eq!(
            envelope["shard_hash"].as_i64(),
            expected.get(id).copied(),
            "{envelope}"
        );
    }
}
