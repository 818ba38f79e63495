//! Polling mode against real PostgreSQL and RabbitMQ.
//!
//! Oracles come from outside the relay: the queue (what arrived, how often) and the table
//! (which rows are marked published). "Everything arrived" is established by a sentinel:
//! after the relay has exited, the test publishes one confirmed message to the same queue;
//! the queue is FIFO with one consumer, so when the sentinel arrives, everything the relay
//! ever published has arrived too, and counting duplicates needs no quiet period.

use outbox_relay::metrics::{
    BACKLOG_ROWS, BROKER_BLOCKED, EMPTY_POLLS_TOTAL, MESSAGES_CONFIRMED_TOTAL, MESSAGES_IN_FLIGHT,
    MESSAGES_PUBLISHED_TOTAL, OLDEST_UNSENT_AGE_SECONDS, POLLS_TOTAL, POLL_BATCH_ROWS,
    POLL_BATCH_SECONDS, RECONNECTS_TOTAL,
};
use outbox_testkit as common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{
    declare_bound_queue, pg_connect, queue_message_count, services, unique_name, Consumer,
    RabbitServer, Received, RelayProcess,
};
use outbox_relay::internals::ColumnMap;
use outbox_relay::internals::{poll_script, OutboxTable};
use outbox_relay::internals::{
    OnPublished, OutboxNames, DEFAULT_POLL_BATCH_SIZE, DEFAULT_POLL_WORKERS,
};
use tokio_postgres::Client;

/// Generous bounds for events that normally take a fraction of them.
const DEADLINE: Duration = Duration::from_secs(180);
const EXIT: Duration = Duration::from_secs(60);

/// One test's outbox: its own database, exchange and queue (bound with `#`).
struct Outbox {
    db_url: String,
    amqp_url: String,
    exchange: String,
    queue: String,
}

impl Outbox {
    /// A fresh database with the outbox table and the claim index created by setup's own
    /// SQL, and a queue bound to every routing key of a fresh exchange on `amqp_url`.
    async fn new(prefix: &str, amqp_url: &str) -> Outbox {
        let (db_url, exchange) = fresh(prefix).await;
        let client = pg_connect(&db_url).await;
        client
            .batch_execute(&poll_script(&names(&exchange)))
            .await
            .expect("run the polling setup SQL");
        let queue = unique_name(&format!("{prefix}_q"));
        declare_bound_queue(amqp_url, &exchange, &queue, "#").await;
        Outbox {
            db_url,
            amqp_url: amqp_url.to_string(),
            exchange,
            queue,
        }
    }

    async fn client(&self) -> Client {
        pg_connect(&self.db_url).await
    }

    /// `outbox-relay poll` on this outbox with `args`.
    fn spawn_poll(&self, args: &[&str]) -> RelayProcess {
        self.spawn_poll_env(args, &[])
    }

    fn spawn_poll_env(&self, args: &[&str], env: &[(&str, &str)]) -> RelayProcess {
        let mut all = vec!["poll", "--exchange", &self.exchange];
        all.extend_from_slice(args);
        // Plain log lines: the tests read fields such as `worker=2` from them.
        let mut vars = vec![
            ("DATABASE_URL", self.db_url.as_str()),
            ("AMQP_URL", self.amqp_url.as_str()),
            ("NO_COLOR", "1"),
        ];
        vars.extend_from_slice(env);
        RelayProcess::spawn(&all, &vars)
    }

    /// Drains the queue through `consumer` up to a sentinel published now: call it once no
    /// relay runs, and it returns everything any relay published (plus what was received).
    async fn drain(&self, consumer: &mut Consumer) -> Vec<Received> {
        let sentinel = unique_name("sentinel");
        common::amqp::publish_confirmed(
            &self.amqp_url,
            &self.exchange,
            "test.sentinel",
            &[(&sentinel, b"")],
        )
        .await;
        let mut checked = 0;
        loop {
            let got = consumer.received();
            if got[checked..]
                .iter()
                .any(|m| m.message_id.as_deref() == Some(&sentinel))
            {
                break;
            }
            checked = got.len();
            let got = consumer.wait_for(checked + 1, DEADLINE).await;
            assert!(
                got.len() > checked,
                "the sentinel did not arrive within {DEADLINE:?} (consumer error: {:?})",
                consumer.error()
            );
        }
        consumer
            .take()
            .into_iter()
            .filter(|m| m.message_id.as_deref() != Some(&sentinel))
            .collect()
    }
}

/// A fresh database on the shared server and a fresh exchange name, both after `prefix`.
async fn fresh(prefix: &str) -> (String, String) {
    let db_url = services().pg.create_database(&unique_name(prefix)).await;
    (db_url, unique_name(&format!("{prefix}_ex")))
}

fn names(exchange: &str) -> OutboxNames {
    OutboxNames {
        table: "outbox".into(),
        publication: "unused".into(),
        slot: "unused".into(),
        exchange: exchange.into(),
    }
}

/// Inserts `count` rows in one transaction; returns their ids.
async fn insert_rows(client: &Client, writer: i32, first: i32, count: i32) -> Vec<String> {
    client
        .query(
            "INSERT INTO outbox (event_type, payload, aggregate_id) \
             SELECT 'order.created', jsonb_build_object('writer', $1::int4, 'n', g), $1::int4::text \
             FROM generate_series($2::int4, $3::int4) g RETURNING id::text",
            &[&writer, &first, &(first + count - 1)],
        )
        .await
        .expect("insert outbox rows")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Seeds `total` rows in transactions of `per_transaction`.
async fn seed(client: &Client, total: i32, per_transaction: i32) -> Vec<String> {
    let mut ids = Vec::new();
    let mut n = 0;
    while n < total {
        let count = per_transaction.min(total - n);
        ids.extend(insert_rows(client, 0, n, count).await);
        n += count;
    }
    ids
}

/// A fresh outbox on the shared broker with a committed backlog of `rows` rows, in
/// transactions of `per_transaction`, and a consumer of its queue: the outbox, a client of
/// its database, the backlog's ids and the consumer.
async fn backlog(
    prefix: &str,
    rows: i32,
    per_transaction: i32,
) -> (Outbox, Client, HashSet<String>, Consumer) {
    let amqp = services().rabbit.url();
    let outbox = Outbox::new(prefix, &amqp).await;
    let client = outbox.client().await;
    let inserted = seed(&client, rows, per_transaction)
        .await
        .into_iter()
        .collect();
    let consumer = Consumer::start_with(&amqp, &outbox.queue, false).await;
    (outbox, client, inserted, consumer)
}

async fn count(client: &Client, sql: &str) -> i64 {
    common::pg::query_value(client, sql).await
}

async fn unpublished(client: &Client) -> i64 {
    count(
        client,
        "SELECT count(*) FROM outbox WHERE published_at IS NULL",
    )
    .await
}

async fn published(client: &Client) -> i64 {
    count(
        client,
        "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
    )
    .await
}

async fn published_ids(client: &Client) -> HashSet<String> {
    let sql = "SELECT id::text FROM outbox WHERE published_at IS NOT NULL";
    common::pg::first_column(client, sql, &[])
        .await
        .into_iter()
        .collect()
}

/// Waits, checking the table, until `condition` holds for `sql`'s count.
async fn wait_count(client: &Client, sql: &str, condition: impl Fn(i64) -> bool) -> i64 {
    let counted = common::pg::wait_count(client, sql, DEADLINE, condition).await;
    counted.unwrap_or_else(|n| panic!("{sql} stayed at {n} for {DEADLINE:?}"))
}

/// Waits until no row is left unpublished.
async fn wait_all_published(client: &Client) {
    wait_count(
        client,
        "SELECT count(*) FROM outbox WHERE published_at IS NULL",
        |n| n == 0,
    )
    .await;
}

/// How often each message id arrived.
fn tally(received: &[Received]) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for message in received {
        let id = message.message_id.clone().expect("every message has an id");
        *seen.entry(id).or_insert(0) += 1;
    }
    seen
}

/// Sends SIGTERM and expects a clean exit (the batch in hand is finished first).
async fn stop(relay: &RelayProcess) {
    relay.sigterm();
    let status = relay.wait_exit(EXIT).await.expect("poll exits on SIGTERM");
    assert!(
        status.success(),
        "poll exited with {status}:\n{}",
        relay.log()
    );
}

/// `published=N` from the relay's final "polling stopped" line.
fn published_by(relay: &RelayProcess) -> u64 {
    let log = relay.log();
    let line = log
        .lines()
        .rfind(|l| l.contains("polling stopped"))
        .unwrap_or_else(|| panic!("no summary line in:\n{log}"));
    let value = line
        .split("published=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok());
    value.unwrap_or_else(|| panic!("no published= in {line}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_rows_from_concurrent_writers_arrive_once_each_with_five_workers() {
    let amqp = services().rabbit.url();
    let outbox = Outbox::new("poll_many", &amqp).await;
    let mut consumer = Consumer::start_with(&amqp, &outbox.queue, false).await;
    let relay = outbox.spawn_poll(&["--workers", "5", "--poll-interval", "100ms"]);

    // Four writers, 5,000 rows each, in transactions of 1 to 250 rows, while the relay runs.
    let mut writers = Vec::new();
    for writer in 0..4 {
        let url = outbox.db_url.clone();
        writers.push(tokio::spawn(async move {
            let client = pg_connect(&url).await;
            let mut ids = Vec::new();
            let mut n = 0;
            for size in [1, 3, 10, 37, 100, 250].iter().cycle() {
                if n >= 5_000 {
                    break;
                }
                let size = (*size).min(5_000 - n);
                ids.extend(insert_rows(&client, writer, n, size).await);
                n += size;
            }
            ids
        }));
    }
    let mut inserted = HashSet::new();
    for writer in writers {
        inserted.extend(writer.await.expect("writer"));
    }
    assert_eq!(inserted.len(), 20_000);

    let got = consumer.wait_for(20_000, DEADLINE).await.len();
    assert!(got >= 20_000, "only {got} of 20000 arrived");
    stop(&relay).await;
    let received = outbox.drain(&mut consumer).await;

    let seen = tally(&received);
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} rows arrived more than once",
        twice.len()
    );
    let seen: HashSet<String> = seen.into_keys().collect();
    assert_eq!(seen, inserted, "the queue holds exactly the inserted rows");
    assert_eq!(unpublished(&outbox.client().await).await, 0);
    assert_eq!(published_by(&relay), 20_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_publishes_in_created_at_order_and_ties_in_insertion_order() {
    // The claim marks rows with UPDATE … RETURNING, which has no order of its own: the
    // batch must still go out as the claim read it. Two transactions of 300 rows with one
    // created_at each, the later-inserted one older: 600 rows, two batches of up to 500.
    let amqp = services().rabbit.url();
    let outbox = Outbox::new("poll_order", &amqp).await;
    let client = outbox.client().await;
    let mut consumer = Consumer::start_with(&amqp, &outbox.queue, false).await;
    let mut expected = Vec::new();
    for created in ["2026-01-01 00:00:02+00", "2026-01-01 00:00:01+00"] {
        let ids: Vec<String> = client
            .query(
                "INSERT INTO outbox (event_type, payload, created_at) \
                 SELECT 'order.created', jsonb_build_object('n', g), $1::text::timestamptz \
                 FROM generate_series(1, 300) g ORDER BY g RETURNING id::text",
                &[&created],
            )
            .await
            .expect("insert")
            .iter()
            .map(|row| row.get(0))
            .collect();
        expected.splice(0..0, ids);
    }

    let relay = outbox.spawn_poll(&["--workers", "1"]);
    let got = consumer.wait_for(600, DEADLINE).await.len();
    assert!(got >= 600, "only {got} of 600 arrived");
    stop(&relay).await;
    let received: Vec<String> = outbox
        .drain(&mut consumer)
        .await
        .iter()
        .map(|m| m.message_id.clone().expect("every message has an id"))
        .collect();
    assert_eq!(
        received, expected,
        "created_at order, ties in insertion order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_poll_processes_with_three_workers_each_publish_every_row_once() {
    let (outbox, client, inserted, mut consumer) = backlog("poll_two", 10_000, 100).await;

    let args = ["--workers", "3", "--batch-size", "100"];
    let first = outbox.spawn_poll(&args);
    let second = outbox.spawn_poll(&args);
    let got = consumer.wait_for(10_000, DEADLINE).await.len();
    assert!(got >= 10_000, "only {got} of 10000 arrived");
    stop(&first).await;
    stop(&second).await;
    let received = outbox.drain(&mut consumer).await;

    let seen = tally(&received);
    assert_eq!(received.len(), 10_000, "no row published twice");
    assert_eq!(
        seen.into_keys().collect::<HashSet<_>>(),
        inserted,
        "none lost"
    );
    assert_eq!(unpublished(&client).await, 0);
    let (a, b) = (published_by(&first), published_by(&second));
    eprintln!("first process published {a}, second {b}");
    assert_eq!(a + b, 10_000);
    assert!(a > 0 && b > 0, "both processes took part ({a}, {b})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_backlog_loses_nothing_and_duplicates_at_most_workers_times_batch() {
    kill_9_mid_backlog(OnPublished::Mark).await;
}

/// The same crash under `--on-published delete`: the rows are deleted in the transaction
/// that commits after the confirms, so a kill before that commit leaves them in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_published_delete_kill_9_mid_backlog_loses_nothing_and_leaves_an_empty_table() {
    kill_9_mid_backlog(OnPublished::Delete).await;
}

/// At the defaults: no --workers or --batch-size.
async fn kill_9_mid_backlog(on_published: OnPublished) {
    const WORKERS: usize = DEFAULT_POLL_WORKERS as usize;
    const BATCH: usize = DEFAULT_POLL_BATCH_SIZE as usize;
    const ROWS: i64 = 20_000;
    let prefix = match on_published {
        OnPublished::Mark => "poll_kill",
        OnPublished::Delete => "poll_kill_delete",
    };
    let (outbox, client, inserted, mut consumer) = backlog(prefix, ROWS as i32, 500).await;
    // Rows done: marked, or gone.
    let settled_sql = match on_published {
        OnPublished::Mark => "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL".into(),
        OnPublished::Delete => format!("SELECT {ROWS} - count(*) FROM outbox"),
    };
    let mode = match on_published {
        OnPublished::Mark => "mark",
        OnPublished::Delete => "delete",
    };

    let args = ["--on-published", mode];
    let relay = outbox.spawn_poll(&args);
    let done = wait_count(&client, &settled_sql, |n| n >= 2_000).await;
    relay.kill9();
    let at_kill = count(&client, &settled_sql).await;
    eprintln!("killed with -9 after {done}+ rows settled ({at_kill} at the kill, {mode})");
    assert!(at_kill < ROWS, "the kill must land mid-backlog");

    let relay = outbox.spawn_poll(&args);
    wait_all_published(&client).await;
    stop(&relay).await;
    let received = outbox.drain(&mut consumer).await;

    let seen = tally(&received);
    let duplicates = received.len() - seen.len();
    eprintln!(
        "kill -9 mid-backlog ({mode}): {} messages for {} rows, {duplicates} duplicates (bound {})",
        received.len(),
        seen.len(),
        WORKERS * BATCH
    );
    assert_eq!(
        seen.into_keys().collect::<HashSet<_>>(),
        inserted,
        "zero lost"
    );
    assert!(duplicates <= WORKERS * BATCH, "{duplicates} duplicates");
    let left = count(&client, "SELECT count(*) FROM outbox").await;
    match on_published {
        OnPublished::Mark => assert_eq!(left, ROWS, "marked rows stay for the cleanup"),
        OnPublished::Delete => assert_eq!(left, 0, "every delivered row deleted"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_for_ten_seconds_marks_nothing_published_and_everything_arrives_after() {
    const WORKERS: usize = 3;
    let rabbit = Arc::new(
        tokio::task::spawn_blocking(RabbitServer::start)
            .await
            .expect("start a private rabbitmq"),
    );
    let outbox = Outbox::new("poll_broker", &rabbit.url()).await;
    let client = outbox.client().await;
    let mut inserted: HashSet<String> = seed(&client, 3_000, 100).await.into_iter().collect();

    // A writer keeps inserting through the outage.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let url = outbox.db_url.clone();
        let writing = Arc::clone(&writing);
        tokio::spawn(async move {
            let client = pg_connect(&url).await;
            let mut ids = Vec::new();
            let mut n = 0;
            while writing.load(Ordering::Relaxed) {
                ids.extend(insert_rows(&client, 1, n, 10).await);
                n += 10;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            ids
        })
    };

    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = outbox.spawn_poll(&[
        "--metrics-addr",
        &addr,
        "--workers",
        "3",
        "--batch-size",
        "50",
        "--poll-interval",
        "200ms",
        "--max-backoff",
        "2s",
        "--confirm-timeout",
        "5s",
    ]);
    wait_count(
        &client,
        "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
        |n| n >= 1_000,
    )
    .await;

    let log_at_kill = relay.log().len();
    {
        let rabbit = Arc::clone(&rabbit);
        tokio::task::spawn_blocking(move || rabbit.kill9())
            .await
            .expect("kill rabbitmq");
    }
    // Once every worker has failed since the kill, no batch can commit until the broker is
    // back: the rows marked published must not change during the outage.
    let failed_workers = |log: &str| -> HashSet<String> {
        log[log_at_kill.min(log.len())..]
            .lines()
            .filter(|l| l.contains("batch failed"))
            .filter_map(|l| l.split("worker=").nth(1))
            .filter_map(|rest| rest.split(' ').next())
            .map(str::to_string)
            .collect()
    };
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while failed_workers(&relay.log()).len() < WORKERS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every worker noticed the broker going away:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // No worker can have its broker connection up: /readyz says why.
    let (status, reason) = common::http::http_get(port, "/readyz")
        .await
        .expect("/readyz answers");
    assert_eq!((status, reason.as_str()), (503, "broker down\n"));
    let marked_during = published_ids(&client).await;
    tokio::time::sleep(Duration::from_secs(10)).await; // the outage itself
    assert_eq!(
        published_ids(&client).await,
        marked_during,
        "rows were marked published while the broker was down"
    );
    assert!(unpublished(&client).await > 0, "rows waited for the broker");

    {
        let rabbit = Arc::clone(&rabbit);
        tokio::task::spawn_blocking(move || rabbit.restart())
            .await
            .expect("restart rabbitmq");
    }
    writing.store(false, Ordering::Relaxed);
    inserted.extend(writer.await.expect("writer"));
    wait_http(port, "/readyz", |status, _| status == 200).await;
    let metrics = wait_http(port, "/metrics", |_, _| true).await;
    let reconnects = common::http::metric_sum(&metrics, RECONNECTS_TOTAL);
    assert!(reconnects.is_some_and(|n| n >= WORKERS as f64), "{metrics}");
    wait_all_published(&client).await;
    stop(&relay).await;

    let mut consumer = Consumer::start_with(&rabbit.url(), &outbox.queue, false).await;
    let received = outbox.drain(&mut consumer).await;
    let seen = tally(&received);
    eprintln!(
        "broker outage: {} rows, {} messages, {} duplicates",
        inserted.len(),
        received.len(),
        received.len() - seen.len()
    );
    let seen: HashSet<String> = seen.into_keys().collect();
    assert_eq!(
        seen, inserted,
        "every row arrived, each marked only after its confirm"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_delivers_a_notified_row_long_before_the_fallback_poll() {
    let amqp = services().rabbit.url();
    let (db_url, exchange) = fresh("poll_listen").await;
    // Provision with the binary itself: table, claim index, exchange.
    let setup = RelayProcess::spawn(
        &["setup", "--mode", "poll", "--exchange", &exchange],
        &[("DATABASE_URL", &db_url), ("AMQP_URL", &amqp)],
    );
    let status = setup.wait_exit(EXIT).await.expect("setup exits");
    assert!(status.success(), "setup failed:\n{}", setup.log());
    assert!(
        setup.log().contains("outbox_unpublished_idx"),
        "{}",
        setup.log()
    );
    let queue = unique_name("poll_listen_q");
    declare_bound_queue(&amqp, &exchange, &queue, "#").await;
    let outbox = Outbox {
        db_url,
        amqp_url: amqp.clone(),
        exchange,
        queue,
    };
    let mut consumer = Consumer::start(&amqp, &outbox.queue).await;
    let relay = outbox.spawn_poll_env(
        &["--listen", "--poll-interval", "60s"],
        &[("RUST_LOG", "info,outbox_relay::poll=debug")],
    );

    // Wait until LISTEN is active and the worker has polled since (and found nothing): from
    // then on only a notification, or the poll 60 s later, makes it look again.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let log = relay.log();
        let idle_after_listen = log
            .find("listening for notifications")
            .is_some_and(|at| log[at..].contains("waiting for rows"));
        if idle_after_listen {
            break;
        }
        assert!(relay.try_exit().is_none(), "poll exited:\n{log}");
        assert!(tokio::time::Instant::now() < deadline, "not idle:\n{log}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let client = outbox.client().await;
    let row = client
        .query_one(
            "INSERT INTO outbox (event_type, payload, headers, aggregate_type, aggregate_id) \
             VALUES ('order.paid', '{\"order_id\": 42, \"note\": \"it''s paid\"}', \
                     '{\"tenant\": \"acme\", \"attempt\": 2}', 'order', '42') \
             RETURNING id::text, floor(extract(epoch FROM created_at))::int8",
            &[],
        )
        .await
        .expect("insert");
    let (id, created): (String, i64) = (row.get(0), row.get(1));
    // After the commit (autocommit), as docs/polling.md tells applications to do.
    client.batch_execute("NOTIFY outbox").await.expect("notify");

    let got = consumer.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(
        got.len(),
        1,
        "not delivered within 5 s of the NOTIFY:\n{}",
        relay.log()
    );
    let message = &got[0];
    assert_eq!(message.message_id.as_deref(), Some(id.as_str()));
    assert_eq!(message.kind.as_deref(), Some("order.paid"));
    assert_eq!(message.routing_key, "order.paid");
    assert_eq!(message.exchange, outbox.exchange);
    assert_eq!(
        message.body_json(),
        serde_json::json!({"order_id": 42, "note": "it's paid"})
    );
    assert_eq!(message.content_type.as_deref(), Some("application/json"));
    assert_eq!(message.delivery_mode, Some(2));
    assert_eq!(message.timestamp, Some(created as u64));
    assert_eq!(message.header_str("tenant"), Some("acme"));
    assert_eq!(message.header_u64("attempt"), Some(2));
    assert_eq!(message.header_str("x-aggregate-id"), Some("42"));
    assert_eq!(message.header_str("x-aggregate-type"), Some("order"));
    wait_all_published(&client).await;
    stop(&relay).await;
}

#[tokio::test]
async fn claim_query_uses_the_partial_index_on_a_mostly_published_table() {
    let db_url = services()
        .pg
        .create_database(&unique_name("poll_explain"))
        .await;
    let client = pg_connect(&db_url).await;
    client
        .batch_execute(&poll_script(&names("outbox")))
        .await
        .expect("setup SQL");
    client
        .batch_execute(
            "INSERT INTO outbox (event_type, payload, created_at, published_at) \
             SELECT 'order.created', jsonb_build_object('n', g), \
                    now() - (100000 - g) * interval '1 second', \
                    CASE WHEN g <= 99000 THEN now() END \
             FROM generate_series(1, 100000) g; \
             ANALYZE outbox;",
        )
        .await
        .expect("seed 100,000 rows");

    let map = ColumnMap::default();
    let table = OutboxTable::discover(&client, &names("outbox").table, &map, OnPublished::Mark)
        .await
        .expect("discover");
    for limit in [1, 500] {
        let explain = format!("EXPLAIN {}", table.claim_sql(limit));
        let plan = common::pg::first_column(&client, &explain, &[]).await;
        let plan = plan.join("\n");
        eprintln!("claim query plan (LIMIT {limit}):\n{plan}");
        assert!(!plan.contains("Seq Scan on outbox"), "{plan}");
        // Read in created_at order from the index and stop at the limit: no Sort of the
        // whole backlog; the one Sort puts the claimed batch back in claim order.
        let sort_keys: Vec<&str> = plan.lines().filter(|l| l.contains("Sort Key")).collect();
        assert!(
            sort_keys.iter().all(|l| l.contains("relay_claim_order")),
            "{plan}"
        );
        assert!(plan.contains("outbox_unpublished_idx"), "{plan}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_cannot_be_mapped_stops_the_relay_naming_it_and_publishes_nothing() {
    let amqp = services().rabbit.url();
    let outbox = Outbox::new("poll_bad", &amqp).await;
    let client = outbox.client().await;
    let bad: String = client
        .query_one(
            "INSERT INTO outbox (event_type, headers, created_at) \
             VALUES ('order.created', '[1, 2]', now() - interval '1 minute') RETURNING id::text",
            &[],
        )
        .await
        .expect("insert")
        .get(0);
    insert_rows(&client, 0, 0, 5).await;

    // One worker: with two, the other's claim can skip the bad row (locked by the first) and
    // take the five behind it, publish and mark them before the process stops (in CI it did,
    // as polling's workers may: docs/polling.md). This test is about the batch that holds it.
    let relay = outbox.spawn_poll(&["--workers", "1"]);
    let status = relay.wait_exit(EXIT).await.expect("poll stops");
    assert!(!status.success(), "a definite error exits non-zero");
    let log = relay.log();
    assert!(log.contains(&bad), "the error names the row:\n{log}");
    assert!(log.contains("headers"), "and the column:\n{log}");
    assert_eq!(
        published(&client).await,
        0,
        "its batch rolled back, nothing marked"
    );
    assert_eq!(queue_message_count(&amqp, &outbox.queue).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_row_stays_unpublished_until_a_queue_is_bound() {
    let amqp = services().rabbit.url();
    let (db_url, exchange) = fresh("poll_unroutable").await;
    let client = pg_connect(&db_url).await;
    client
        .batch_execute(&poll_script(&names(&exchange)))
        .await
        .expect("setup SQL");
    let routed = unique_name("poll_routed_q");
    declare_bound_queue(&amqp, &exchange, &routed, "order.#").await;
    let stray: String = client
        .query_one(
            "INSERT INTO outbox (event_type, created_at) \
             VALUES ('nobody.listens', now() - interval '1 minute') RETURNING id::text",
            &[],
        )
        .await
        .expect("insert")
        .get(0);
    insert_rows(&client, 0, 0, 3).await;

    let outbox = Outbox {
        db_url,
        amqp_url: amqp.clone(),
        exchange: exchange.clone(),
        queue: routed,
    };
    let relay = outbox.spawn_poll(&["--max-backoff", "1s"]);
    // Returned twice: the first batch, then the retry that claims only the oldest row.
    assert!(
        relay.wait_for_log_count("as unroutable", 2, DEADLINE).await,
        "no return reported:\n{}",
        relay.log()
    );
    assert!(relay.log().contains(&stray), "{}", relay.log());
    let unmarked: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox WHERE id::text = $1 AND published_at IS NULL",
            &[&stray],
        )
        .await
        .expect("query")
        .get(0);
    assert_eq!(unmarked, 1, "a returned message is never marked published");

    let late = unique_name("poll_late_q");
    declare_bound_queue(&amqp, &exchange, &late, "nobody.#").await;
    let mut consumer = Consumer::start(&amqp, &late).await;
    let got = consumer.wait_for(1, DEADLINE).await;
    assert_eq!(got[0].message_id.as_deref(), Some(stray.as_str()));
    wait_all_published(&client).await;
    stop(&relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_deletes_only_rows_published_longer_ago_than_the_retention() {
    let amqp = services().rabbit.url();
    let outbox = Outbox::new("poll_cleanup", &amqp).await;
    let client = outbox.client().await;
    client
        .batch_execute(
            "INSERT INTO outbox (event_type, created_at, published_at) \
             SELECT 'old.published', now() - interval '3 hours', now() - interval '2 hours' \
             FROM generate_series(1, 2500); \
             INSERT INTO outbox (event_type, created_at, published_at) \
             SELECT 'recent.published', now() - interval '3 hours', now() - interval '10 minutes' \
             FROM generate_series(1, 10); \
             INSERT INTO outbox (event_type, created_at) \
             SELECT 'old.unpublished', now() - interval '3 hours' FROM generate_series(1, 10);",
        )
        .await
        .expect("seed");
    let relay = outbox.spawn_poll(&[
        "--cleanup-interval",
        "100ms",
        "--retention",
        "1h",
        "--cleanup-batch",
        "1000",
    ]);
    wait_count(
        &client,
        "SELECT count(*) FROM outbox WHERE event_type = 'old.published'",
        |n| n == 0,
    )
    .await;
    stop(&relay).await;
    let left: Vec<(String, i64)> = client
        .query(
            "SELECT event_type, count(*) FROM outbox GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await
        .expect("count")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        left,
        [
            ("old.unpublished".to_string(), 10),
            ("recent.published".to_string(), 10)
        ],
        "rows within the retention, and rows published just now, are kept"
    );
    assert!(relay.log().contains("cleanup deleted"), "{}", relay.log());
}

/// `GET path` on a relay's metrics port, polled until `accept` holds; the last body.
async fn wait_http(port: u16, path: &str, accept: impl Fn(u16, &str) -> bool) -> String {
    let accepted = |(status, body): &(u16, String)| accept(*status, body);
    let answer = common::http::wait_http(port, path, DEADLINE, accepted).await;
    match answer {
        Some(answer) if accepted(&answer) => answer.1,
        _ => panic!("{path} never satisfied the test; last answer {answer:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_mode_serves_metrics_readyz_and_status_with_the_unsent_backlog() {
    use common::http::metric_value;
    let amqp = services().rabbit.url();
    let outbox = Outbox::new("poll_metrics", &amqp).await;
    let client = outbox.client().await;
    let mut inserted: HashSet<String> = seed(&client, 1_000, 100).await.into_iter().collect();
    // Three rows a test transaction holds locked: the workers skip them (SKIP LOCKED), so
    // they stay unsent, a backlog the test controls.
    let held = insert_rows(&client, 9, 0, 3).await;
    inserted.extend(held.iter().cloned());
    let mut locker = outbox.client().await;
    let holding = locker.transaction().await.expect("begin");
    let locked = holding
        .query(
            "SELECT id FROM outbox WHERE id::text = ANY($1) FOR UPDATE",
            &[&held],
        )
        .await
        .expect("lock the held rows");
    assert_eq!(locked.len(), 3);

    let mut consumer = Consumer::start_with(&amqp, &outbox.queue, false).await;
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = outbox.spawn_poll(&[
        "--workers",
        "2",
        "--batch-size",
        "100",
        "--metrics-addr",
        &addr,
        "--backlog-poll-interval",
        "100ms",
    ]);
    let ready = wait_http(port, "/readyz", |status, _| status == 200).await;
    assert_eq!(ready, "ready\n");
    wait_count(
        &client,
        "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
        |n| n == 1_000,
    )
    .await;
    // The backlog gauge is read from the table on its own schedule: it settles at the held
    // rows, and the workers, having drained the rest, poll empty.
    let metrics = wait_http(port, "/metrics", |_, body| {
        metric_value(body, BACKLOG_ROWS) == Some(3.0)
            && metric_value(body, EMPTY_POLLS_TOTAL).is_some_and(|n| n >= 1.0)
    })
    .await;
    let value = |name: &str| metric_value(&metrics, name).unwrap_or(f64::NAN);
    assert_eq!(value(MESSAGES_PUBLISHED_TOTAL), 1_000.0);
    assert_eq!(value(MESSAGES_CONFIRMED_TOTAL), 1_000.0);
    assert_eq!(value(MESSAGES_IN_FLIGHT), 0.0);
    let (rows_sum, rows_count) = (
        format!("{POLL_BATCH_ROWS}_sum"),
        format!("{POLL_BATCH_ROWS}_count"),
    );
    assert_eq!(value(&rows_sum), 1_000.0);
    assert_eq!(
        value(&format!("{POLL_BATCH_SECONDS}_count")),
        value(&rows_count)
    );
    assert!(
        value(POLLS_TOTAL) > value(&rows_count),
        "{} polls, no more than the {} batches with rows:\n{metrics}",
        value(POLLS_TOTAL),
        value(&rows_count)
    );
    assert!(value(OLDEST_UNSENT_AGE_SECONDS) > 0.0, "{metrics}");
    assert!(
        metrics.contains(&format!("{POLL_BATCH_SECONDS}_bucket{{le=\"0.1\"}}")),
        "{metrics}"
    );

    // `status --mode poll` sees the same backlog, reads the relay's /readyz, and a missing
    // slot is no error; without --mode poll it is (exit 4).
    let status = |extra: &[&str]| {
        let mut args = vec!["status", "--metrics-addr", addr.as_str()];
        args.extend_from_slice(extra);
        std::process::Command::new(common::relay::binary())
            .args(&args)
            .env("DATABASE_URL", &outbox.db_url)
            .env_remove("OUTBOX_MODE")
            .output()
            .expect("run status")
    };
    let output = status(&["--mode", "poll", "--json"]);
    assert!(output.status.success(), "{output:?}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("status JSON");
    assert_eq!(json["mode"], "poll");
    assert_eq!(json["unsent_rows"], 3);
    assert!(
        json["oldest_unsent_age_seconds"]
            .as_f64()
            .is_some_and(|age| age > 0.0),
        "{json}"
    );
    assert_eq!(json["relay_readiness"], "ready");
    let text = String::from_utf8_lossy(&status(&["--mode", "poll"]).stdout).into_owned();
    assert!(
        text.contains("unsent rows") && text.contains("3 (published_at IS NULL)"),
        "{text}"
    );
    assert_eq!(
        status(&[]).status.code(),
        Some(i32::from(outbox_relay::exit::UNHEALTHY)),
        "WAL mode: the slot is missing"
    );

    // Released, the held rows go out with the next poll and the gauge follows.
    holding.rollback().await.expect("release the held rows");
    wait_http(port, "/metrics", |_, body| {
        metric_value(body, BACKLOG_ROWS) == Some(0.0)
            && metric_value(body, OLDEST_UNSENT_AGE_SECONDS) == Some(0.0)
    })
    .await;
    stop(&relay).await;
    let received = outbox.drain(&mut consumer).await;
    assert_eq!(received.len(), inserted.len(), "each row once");
    let arrived: HashSet<String> = tally(&received).into_keys().collect();
    assert_eq!(
        arrived,
        inserted,
        "{} inserted rows missing (e.g. {:?}), {} arrived that were not inserted",
        inserted.difference(&arrived).count(),
        inserted.difference(&arrived).min(),
        arrived.difference(&inserted).count()
    );
}

/// A table without published_at: `status --mode poll` is unhealthy and names the column,
/// and the SQL its fix gives, run as written, makes it healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_published_at_gets_a_fix_that_adds_it() {
    let outbox = Outbox::new("poll_no_published", &services().rabbit.url()).await;
    let client = outbox.client().await;
    client
        .batch_execute("ALTER TABLE outbox DROP COLUMN published_at CASCADE")
        .await
        .expect("drop published_at");
    let status = || {
        std::process::Command::new(common::relay::binary())
            .args(["status", "--mode", "poll", "--metrics-addr", "off"])
            .env("DATABASE_URL", &outbox.db_url)
            .env_remove("OUTBOX_MODE")
            .output()
            .expect("run status")
    };
    let unhealthy = status();
    let printed = String::from_utf8_lossy(&unhealthy.stdout).into_owned();
    assert_eq!(
        unhealthy.status.code(),
        Some(i32::from(outbox_relay::exit::UNHEALTHY)),
        "{printed}"
    );
    let fix = printed
        .split_once("Fix: ")
        .and_then(|(_, fix)| fix.split_once(';'))
        .map(|(sql, _)| sql.to_string())
        .unwrap_or_else(|| panic!("no fix with a statement:\n{printed}"));
    assert!(fix.starts_with("ALTER TABLE"), "{fix}");
    client
        .batch_execute(&fix)
        .await
        .unwrap_or_else(|e| panic!("the fix as written: {fix}: {e}"));
    let healthy = status();
    assert!(
        healthy.status.success(),
        "{}",
        String::from_utf8_lossy(&healthy.stdout)
    );
}

#[test]
fn a_failpoint_name_that_does_not_exist_stops_the_relay_naming_the_valid_ones() {
    let relay = RelayProcess::spawn(
        &["poll", "--database-url", "postgres://127.0.0.1:1/none"],
        &[("OUTBOX_FAILPOINTS", "poll-before-comit=abort")],
    );
    let status = relay
        .wait_exit_blocking(EXIT)
        .expect("the relay exits at once");
    assert!(
        !status.success(),
        "exits non-zero, not {status}; log:\n{}",
        relay.log()
    );
    let log = relay.log();
    assert!(
        log.contains("unknown failpoint \"poll-before-comit\"")
            && log.contains("poll-before-commit"),
        "{log}"
    );
}

/// Transactions committed in `db` so far, from pg_stat_database (what an idle relay costs
/// the server, counted by the server).
async fn xact_commits(client: &Client) -> i64 {
    client
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .expect("read pg_stat_database")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement for docs/polling.md (about 4 minutes): cargo test --test main poll::idle_query_rate -- --ignored --nocapture"]
async fn idle_query_rate_fixed_versus_adaptive_poll_interval() {
    use common::http::metric_value;
    const WINDOW: Duration = Duration::from_secs(30);
    let amqp = services().rabbit.url();
    let configs: [(&str, &[&str]); 4] = [
        ("fixed --poll-interval 100ms", &["--poll-interval", "100ms"]),
        (
            "fixed --poll-interval 1s (the old default)",
            &["--poll-interval", "1s"],
        ),
        ("adaptive 100ms..1s (the default)", &[]),
        (
            "adaptive 100ms..10s with --listen",
            &["--poll-interval-max", "10s", "--listen"],
        ),
    ];
    for (label, extra) in configs {
        let outbox = Outbox::new("poll_idle", &amqp).await;
        let client = outbox.client().await;
        let port = common::free_port();
        let addr = format!("127.0.0.1:{port}");
        // Only the workers: no backlog poller, no cleanup in the window.
        let mut args = vec![
            "--workers",
            "5",
            "--metrics-addr",
            &addr,
            "--backlog-poll-interval",
            "0",
            "--cleanup-interval",
            "0",
        ];
        args.extend_from_slice(extra);
        let relay = outbox.spawn_poll(&args);
        wait_http(port, "/readyz", |status, _| status == 200).await;
        // Past the back-off's ramp (100 ms doubling to 10 s takes under 13 s), and past
        // the statistics' flush delay of the connections (up to 10 s when idle).
        tokio::time::sleep(Duration::from_secs(15)).await;
        let polls = |body: &str| metric_value(body, POLLS_TOTAL).unwrap_or(0.0);
        let before = (
            xact_commits(&client).await,
            polls(&wait_http(port, "/metrics", |_, _| true).await),
        );
        tokio::time::sleep(WINDOW).await;
        let after = (
            xact_commits(&client).await,
            polls(&wait_http(port, "/metrics", |_, _| true).await),
        );
        stop(&relay).await;
        let seconds = WINDOW.as_secs_f64();
        // The two xact_commit reads are transactions of their own: one is inside the window.
        println!(
            "IDLE {label}: 5 workers, {:.2} claim queries/s, {:.2} transactions/s (pg_stat_database)",
            (after.1 - before.1) / seconds,
            (after.0 - before.0 - 1) as f64 / seconds
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_alarm_reads_broker_blocked_and_delivery_resumes_without_a_reconnect() {
    use common::http::{metric_sum, metric_value};
    let rabbit = tokio::task::spawn_blocking(RabbitServer::start)
        .await
        .expect("start a private rabbitmq");
    let outbox = Outbox::new("poll_alarm", &rabbit.url()).await;
    let client = outbox.client().await;
    let mut consumer = Consumer::start_with(&rabbit.url(), &outbox.queue, false).await;
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = outbox.spawn_poll(&[
        "--workers",
        "2",
        "--metrics-addr",
        &addr,
        "--confirm-timeout",
        "3s",
    ]);
    wait_http(port, "/readyz", |status, _| status == 200).await;

    tokio::task::block_in_place(|| rabbit.set_memory_alarm(true));
    // The broker blocks a connection when it next publishes: the worker that claims this row.
    let ids = insert_rows(&client, 0, 0, 1).await;
    wait_http(port, "/readyz", |status, body| {
        status == 503 && body == "broker blocked\n"
    })
    .await;
    let metrics = wait_http(port, "/metrics", |_, _| true).await;
    assert_eq!(metric_value(&metrics, BROKER_BLOCKED), Some(1.0));
    assert_eq!(
        unpublished(&client).await,
        1,
        "nothing marked while blocked"
    );

    tokio::task::block_in_place(|| rabbit.set_memory_alarm(false));
    wait_http(port, "/readyz", |status, _| status == 200).await;
    let got = consumer.wait_for(1, DEADLINE).await;
    assert_eq!(got[0].message_id.as_deref(), Some(ids[0].as_str()));
    let metrics = wait_http(port, "/metrics", |_, _| true).await;
    // The confirm timeout (3 s) paused while the broker blocked: no session was restarted.
    assert_eq!(
        metric_sum(&metrics, RECONNECTS_TOTAL).unwrap_or(0.0),
        0.0,
        "{metrics}"
    );
    stop(&relay).await;
}
