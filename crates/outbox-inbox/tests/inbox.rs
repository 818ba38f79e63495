//! The inbox and the reference consumer against real PostgreSQL and RabbitMQ (the test kit's
//! shared pair), with the relay as its binary where the messages come from an outbox. The
//! oracle is the consumer's own database: an effect table that gets one row per applied
//! message (no unique key, so a message applied twice shows as two rows), and the inbox.
//! Duplicates are counted from outside too: a second queue bound like the consumer's sees
//! every publish the relay made, so its repeats are exactly what the inbox must drop.
//!
//! The consumer runs as the `outbox-inbox` binary (kill -9 and failpoints need a process);
//! the relay is the `outbox-relay` binary that the workspace build put beside it
//! (`target/<profile>/outbox-relay`: `cargo test --workspace` builds it; with `cargo test -p
//! outbox-inbox` alone, run `cargo build` first so that it is current).
//!
//! Crash windows that timing cannot hit use the consumer's failpoints
//! (`OUTBOX_INBOX_FAILPOINTS`: `before-commit`, `after-commit`) and the relay's
//! (`OUTBOX_FAILPOINTS=poll-before-commit`).

use outbox_testkit as common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::amqp::{amqp_connect, declare_bound_queue_with_args, publish_confirmed};
use common::faults::{
    assert_nothing_lost_or_invented, barrier, report, seed_backlog, unsent_ids, wait_for_ids,
    Oracle, Tally, Writers,
};
use common::outbox::Outbox;
use common::pg::{first_column, pg_connect, psql, query_value, wait_count};
use common::relay::SIGABRT;
use common::{
    declare_bound_queue, queue_message_count, services, unique_name, Consumer, RelayProcess,
};
use futures_util::StreamExt;
use lapin::options::{
    BasicPublishOptions, BasicQosOptions, BasicRejectOptions, ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use outbox_inbox::consumer::log;
use outbox_inbox::failpoint;
use outbox_inbox::sql::{cleanup_batch_statement, InboxTable};
use tokio_postgres::Client;

const MINUTE: Duration = Duration::from_secs(60);
/// The name the tests' consumers carry in the inbox.
const CONSUMER: &str = "test-consumer";
/// The effect of every test but the order test: one row per application.
const EFFECT_SQL: &str = "INSERT INTO effect (message_id, outbox_seq) VALUES ($1, $7)";

// ---------------------------------------------------------------------------------
// Harness

/// `outbox-inbox`, as cargo built it for this test binary.
fn inbox_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_outbox-inbox"))
}

/// A consumer's database on the shared server: the inbox (made by `outbox-inbox setup`) and
/// the effect table.
struct ConsumerDb {
    url: String,
    client: Client,
}

impl ConsumerDb {
    async fn new(prefix: &str) -> ConsumerDb {
        let url = services().pg.create_database(&unique_name(prefix)).await;
        let setup = Command::new(inbox_bin())
            .args(["setup", "--database-url", &url])
            .output()
            .expect("run outbox-inbox setup");
        assert!(setup.status.success(), "setup: {setup:?}");
        let client = pg_connect(&url).await;
        client
            .batch_execute(
                "CREATE TABLE effect (
                     n            bigserial PRIMARY KEY,
                     message_id   text NOT NULL,
                     outbox_seq   text,
                     aggregate_id text,
                     step         integer,
                     alone        boolean
                 )",
            )
            .await
            .expect("create the effect table");
        ConsumerDb { url, client }
    }

    /// Starts `outbox-inbox consume` on `queue` with [`EFFECT_SQL`] (unless `extra` names
    /// another), `extra` flags and `env`, logging duplicates (debug).
    fn consume(
        &self,
        amqp_url: &str,
        queue: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> RelayProcess {
        let mut args = vec![
            "consume",
            "--database-url",
            &self.url,
            "--amqp-url",
            amqp_url,
            "--queue",
            queue,
            "--consumer",
            CONSUMER,
            "--cleanup-interval",
            "0",
        ];
        if !extra.contains(&"--effect-sql") {
            args.extend(["--effect-sql", EFFECT_SQL]);
        }
        args.extend_from_slice(extra);
        let mut vars = vec![("RUST_LOG", "info,outbox_inbox=debug")];
        vars.extend_from_slice(env);
        RelayProcess::spawn_bin(inbox_bin(), &args, &vars)
    }

    /// How many effect rows each message id has.
    async fn effects(&self) -> HashMap<String, i64> {
        let rows = self
            .client
            .query(
                "SELECT message_id, count(*) FROM effect GROUP BY message_id",
                &[],
            )
            .await
            .expect("read the effects");
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    }

    /// The applied message ids in the order their effects were written.
    async fn applied_in_order(&self) -> Vec<String> {
        first_column(
            &self.client,
            "SELECT message_id FROM effect ORDER BY n",
            &[],
        )
        .await
    }

    /// Waits until `n` distinct messages have an effect; panics with the consumer's log.
    async fn wait_applied(&self, n: usize, consumer: &RelayProcess) {
        let sql = "SELECT count(DISTINCT message_id) FROM effect";
        let applied = wait_count(&self.client, sql, 3 * MINUTE, |c| c >= n as i64).await;
        assert!(
            applied.is_ok(),
            "{applied:?} of {n} messages applied; consumer log:\n{}",
            consumer.log()
        );
    }

    /// Every id in `expected` has exactly one effect and one inbox row, and nothing else
    /// has either.
    async fn assert_applied_once(&self, expected: &[String]) {
        let effects = self.effects().await;
        let twice: Vec<_> = effects.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "applied more than once: {twice:?}");
        let wanted: HashSet<&str> = expected.iter().map(String::as_str).collect();
        let applied: HashSet<&str> = effects.keys().map(String::as_str).collect();
        assert_eq!(
            applied, wanted,
            "the applied messages are the expected ones"
        );
        let claimed: i64 = query_value(
            &self.client,
            &format!("SELECT count(*) FROM inbox WHERE consumer = '{CONSUMER}'"),
        )
        .await;
        assert_eq!(claimed, expected.len() as i64, "one inbox row per message");
    }
}

/// What a consumer said it did, from its `consumer stopped …` line.
#[derive(Debug, Default, PartialEq, Eq)]
struct Totals {
    applied: u64,
    duplicates: u64,
    rejected: u64,
}

fn totals(consumer: &RelayProcess) -> Totals {
    let log = consumer.log();
    let line = log
        .lines()
        .find(|l| l.contains("consumer stopped"))
        .unwrap_or_else(|| panic!("no `consumer stopped` line; log:\n{log}"));
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}= in {line}"))
    };
    Totals {
        applied: field("applied"),
        duplicates: field("duplicates"),
        rejected: field("rejected"),
    }
}

/// A second queue bound to the outbox exchange like the consumer's, and a consumer of it:
/// every publish the relay makes, repeats included.
async fn publish_tally(outbox: &Outbox) -> (String, Consumer) {
    let queue = format!("{}_tally", outbox.queue);
    declare_bound_queue(&outbox.amqp_url, &outbox.exchange, &queue, "#").await;
    let consumer = Consumer::start_with(&outbox.amqp_url, &queue, false).await;
    (queue, consumer)
}

/// Drains the tally through a marker; the relay's repeats. Checks that every committed id
/// was published and nothing else.
async fn published_duplicates(
    tally: &mut Consumer,
    outbox: &Outbox,
    queue: &str,
    committed: &[String],
) -> usize {
    barrier(tally, &outbox.amqp_url, queue).await;
    let published = Tally::of(tally.received());
    assert_nothing_lost_or_invented(&published, committed);
    published.duplicates()
}

/// The end of a relay scenario: the consumer applied each of `expected` once, dropped exactly
/// the `duplicates` the relay published, and left the queue empty. Prints the figures.
async fn assert_absorbed(
    db: &ConsumerDb,
    consumer: &RelayProcess,
    outbox: &Outbox,
    expected: &[String],
    duplicates: usize,
    scenario: &str,
    figures: &[(&str, String)],
) {
    db.wait_applied(expected.len(), consumer).await;
    stop_after_dropping(consumer, expected.len(), duplicates).await;
    db.assert_applied_once(expected).await;
    assert_eq!(
        queue_message_count(&outbox.amqp_url, &outbox.queue).await,
        0
    );
    let mut all = vec![
        ("rows", expected.len().to_string()),
        ("published duplicates", duplicates.to_string()),
        ("dropped by the inbox", duplicates.to_string()),
        ("applied twice", "0".into()),
    ];
    all.extend(figures.iter().cloned());
    report(scenario, &all);
}

/// Waits until the consumer has dropped `duplicates` copies, stops it (SIGTERM), and checks
/// its totals: `applied` applied, exactly `duplicates` dropped, nothing rejected.
async fn stop_after_dropping(consumer: &RelayProcess, applied: usize, duplicates: usize) {
    assert!(
        consumer
            .wait_for_log_count(log::DUPLICATE, duplicates, MINUTE)
            .await,
        "the consumer dropped {} of {duplicates} duplicates; log:\n{}",
        consumer.log_count(log::DUPLICATE),
        consumer.log()
    );
    consumer.stop().await;
    let expected = Totals {
        applied: applied as u64,
        duplicates: duplicates as u64,
        rejected: 0,
    };
    assert_eq!(totals(consumer), expected);
}

fn assert_aborted(process: &RelayProcess, status: Option<std::process::ExitStatus>, what: &str) {
    let status = status.unwrap_or_else(|| panic!("{what} did not fire; log:\n{}", process.log()));
    assert_eq!(
        status.signal(),
        Some(SIGABRT),
        "{what}: {status}; log:\n{}",
        process.log()
    );
}

// ---------------------------------------------------------------------------------
// 1. Relay kill -9, WAL mode

/// The relay killed with -9 three times while it lags behind writers republishes what the
/// broker confirmed but the slot had not been told: the consumer applies every committed row
/// once, and drops exactly the repeats the relay published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_kill_9_three_times_every_row_is_applied_once_and_each_repeat_is_dropped() {
    let outbox = Outbox::new("inbox_kills").await;
    let oracle = Oracle::create(&outbox).await;
    let (tally_queue, mut tally) = publish_tally(&outbox).await;
    let db = ConsumerDb::new("inbox_kills_consumer").await;
    let consumer = db.consume(&outbox.amqp_url, &outbox.queue, &[], &[]);
    let writers = Writers::start(&outbox.db_url, 2, 10, Duration::from_millis(2));
    for kill in 0..3 {
        let relay = outbox.spawn_relay(&[]);
        let before = tally.received().len();
        let n = tally.wait_for(before + 300, MINUTE).await.len();
        assert!(
            n >= before + 300,
            "kill {kill}: delivery stalled; log:\n{}",
            relay.log()
        );
        relay.kill9();
    }
    let relay = outbox.spawn_relay(&[]);
    writers.stop().await;
    let committed = oracle.committed_ids(&outbox.client).await;
    assert!(
        wait_for_ids(&mut tally, &committed, 3 * MINUTE).await,
        "not every committed row was published; log:\n{}",
        relay.log()
    );
    relay.stop().await;
    let duplicates = published_duplicates(&mut tally, &outbox, &tally_queue, &committed).await;
    assert!(
        duplicates > 0,
        "three kills while lagging republished nothing: no duplicate to absorb"
    );

    let scenario = "inbox relay kill -9";
    assert_absorbed(
        &db,
        &consumer,
        &outbox,
        &committed,
        duplicates,
        scenario,
        &[],
    )
    .await;
}

// ---------------------------------------------------------------------------------
// 2. Consumer crashes around its commit

/// One lane, a transaction per message: the n-th commit is the n-th message.
const ONE_LANE: [&str; 6] = [
    "--concurrency",
    "1",
    "--prefetch",
    "10",
    "--batch-size",
    "1",
];

/// `n` messages `<name>-0000`… published (confirmed) to a fresh exchange and its queue, on
/// the shared broker; the broker's URL, the queue and the ids.
async fn queued_messages(prefix: &str, n: usize) -> (String, String, Vec<String>) {
    let amqp = services().rabbit.url();
    let name = unique_name(prefix);
    let (exchange, queue) = (format!("{name}_x"), format!("{name}_q"));
    declare_bound_queue(&amqp, &exchange, &queue, "#").await;
    let ids: Vec<String> = (0..n).map(|i| format!("{name}-{i:04}")).collect();
    let messages: Vec<(&str, &[u8])> = ids.iter().map(|id| (id.as_str(), &b"{}"[..])).collect();
    publish_confirmed(&amqp, &exchange, "Test.crash", &messages).await;
    (amqp, queue, ids)
}

/// The consumer aborted just before a COMMIT: that message was not acknowledged, comes again
/// and is applied. Aborted just after a COMMIT, before the ack: the message comes again
/// (redelivered) and is dropped. Every message's effect exists exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_killed_around_its_commit_loses_nothing_and_applies_nothing_twice() {
    const MESSAGES: usize = 300;
    let (amqp, queue, ids) = queued_messages("inbox_crash", MESSAGES).await;
    let db = ConsumerDb::new("inbox_crash_consumer").await;

    let before = db.consume(
        &amqp,
        &queue,
        &ONE_LANE,
        &[(failpoint::ENV, "before-commit=abort@50")],
    );
    assert_aborted(&before, before.wait_exit(MINUTE).await, "before-commit");
    assert_applied_in_order(
        &db.applied_in_order().await,
        &ids[..49],
        "49 committed, the 50th rolled back",
    );

    let after = db.consume(
        &amqp,
        &queue,
        &ONE_LANE,
        &[(failpoint::ENV, "after-commit=abort@50")],
    );
    assert_aborted(&after, after.wait_exit(MINUTE).await, "after-commit");
    assert_applied_in_order(
        &db.applied_in_order().await,
        &ids[..99],
        "the 50th came again and was applied, then 49 more",
    );
    let unacknowledged = &ids[98];

    let consumer = db.consume(&amqp, &queue, &[], &[]);
    db.wait_applied(MESSAGES, &consumer).await;
    assert!(
        consumer.wait_for_log(log::DUPLICATE, MINUTE).await,
        "the committed, unacknowledged message was not dropped; log:\n{}",
        consumer.log()
    );
    let dropped = consumer.log_lines(log::DUPLICATE);
    assert!(
        dropped.iter().any(
            |line| line.contains(&format!("message_id={unacknowledged} "))
                && line.contains("redelivered=true")
        ),
        "the copy dropped is the redelivered {unacknowledged}: {dropped:?}"
    );
    consumer.stop().await;
    let totals = totals(&consumer);
    // Acks sent just before the abort may be lost with the process: those come again too.
    assert!(totals.duplicates >= 1, "{totals:?}");
    assert_eq!(totals.applied, (MESSAGES - 99) as u64, "{totals:?}");
    db.assert_applied_once(&ids).await;
    assert_eq!(queue_message_count(&amqp, &queue).await, 0);
}

/// The negative control of the test above: a consumer that ignores its claims
/// (`ignore-claims`), aborted after a COMMIT and before the ack, applies the redelivered
/// message again, and the oracle (each message's effects counted in the consumer's database)
/// names it. A consumer without the claim is caught applying twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_ignores_its_claims_is_caught_applying_a_redelivered_message_twice() {
    const MESSAGES: usize = 60;
    let (amqp, queue, ids) = queued_messages("inbox_noclaim", MESSAGES).await;
    let db = ConsumerDb::new("inbox_noclaim_consumer").await;
    let broken = (failpoint::ENV, "ignore-claims=on;after-commit=abort@20");
    let after = db.consume(&amqp, &queue, &ONE_LANE, &[broken]);
    assert_aborted(&after, after.wait_exit(MINUTE).await, "after-commit");
    let consumer = db.consume(&amqp, &queue, &[], &[(failpoint::ENV, "ignore-claims=on")]);
    db.wait_applied(MESSAGES, &consumer).await;
    consumer.stop().await;

    // The oracle of assert_applied_once, as a verdict: the messages with more than one effect.
    let mut twice: Vec<(String, i64)> = db
        .effects()
        .await
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    twice.sort();
    let unacknowledged = &ids[19];
    assert!(
        twice.iter().any(|(id, n)| id == unacknowledged && *n == 2),
        "the oracle did not catch the redelivered {unacknowledged} applied twice: {twice:?}; \
         log:\n{}",
        consumer.log()
    );
    println!(
        "FIGURES negative control: the inbox without its claim: messages {MESSAGES}, applied \
         more than once {} ({twice:?})",
        twice.len()
    );
}

/// `applied` is `expected`, in order; else says where they part.
fn assert_applied_in_order(applied: &[String], expected: &[String], what: &str) {
    let shorter = applied.len().min(expected.len());
    let parted = (applied.iter().zip(expected).position(|(a, e)| a != e))
        .or((applied.len() != expected.len()).then_some(shorter));
    assert!(
        parted.is_none(),
        "{what}: {} applied, {} expected; first difference at {:?}: applied {:?}, expected {:?}",
        applied.len(),
        expected.len(),
        parted,
        parted.and_then(|i| applied.get(i)),
        parted.and_then(|i| expected.get(i)),
    );
}

// ---------------------------------------------------------------------------------
// 3. Polling mode

/// `poll` with 2 workers: a worker aborted after its batch's confirms but before COMMIT (the
/// batch is published again: duplicates certain), then a kill -9 mid-backlog, then a run to
/// the end. Every row applied once; the inbox dropped exactly the repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_with_two_workers_crashed_and_killed_applies_every_row_once() {
    let s = services();
    let outbox = Outbox::on_poll(&s.pg.url("postgres"), &s.rabbit.url(), "inbox_poll").await;
    let (tally_queue, mut tally) = publish_tally(&outbox).await;
    let (rows, _) = seed_backlog(&outbox, 6_000, None).await;
    let db = ConsumerDb::new("inbox_poll_consumer").await;
    let consumer = db.consume(&outbox.amqp_url, &outbox.queue, &[], &[]);
    let workers = ["--workers", "2"];

    let crashing = outbox.spawn_poll(
        &workers,
        &[("OUTBOX_FAILPOINTS", "poll-before-commit=abort@2")],
    );
    assert_aborted(
        &crashing,
        crashing.wait_exit(MINUTE).await,
        "poll-before-commit",
    );
    let relay = outbox.spawn_poll(&workers, &[]);
    let before = tally.received().len();
    tally.wait_for(before + 1_000, MINUTE).await;
    relay.kill9();
    let unsent = unsent_ids(&outbox.client).await.len();
    assert!(unsent > 0, "the kill must land mid-backlog");
    let relay = outbox.spawn_poll(&workers, &[]);
    assert!(
        wait_for_ids(&mut tally, &rows, 2 * MINUTE).await,
        "not every row was published; log:\n{}",
        relay.log()
    );
    relay.stop().await;
    let left = unsent_ids(&outbox.client).await;
    assert!(
        left.is_empty(),
        "{} rows unsent after the last run, e.g. {:?}; log:\n{}",
        left.len(),
        left.iter().min(),
        relay.log()
    );
    let duplicates = published_duplicates(&mut tally, &outbox, &tally_queue, &rows).await;
    assert!(
        duplicates > 0,
        "the aborted batch was confirmed: it must come again"
    );

    let scenario = "inbox polling crash and kill -9";
    let figures = [("unsent at the kill", unsent.to_string())];
    assert_absorbed(
        &db, &consumer, &outbox, &rows, duplicates, scenario, &figures,
    )
    .await;
}

// ---------------------------------------------------------------------------------
// 4. Cleanup

/// `outbox-inbox cleanup --retention 24h --cleanup-batch 1000`: every row inside the window
/// stays (the oldest of them a minute inside it), every older one goes, 1,000 per
/// transaction at most, found through the `(consumer, received_at)` index. A statement-level
/// trigger records what each DELETE removed, in which transaction. The window counts back
/// from the newest row (here every consumer's newest row is the same moment): an inbox whose
/// newest row is 30 hours old (nothing received since) keeps what is within 24 hours of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_keeps_every_row_inside_the_window_and_deletes_older_ones_in_bounded_batches() {
    let db = ConsumerDb::new("inbox_cleanup").await;
    let stalled = Command::new(inbox_bin())
        .args(["setup", "--database-url", &db.url, "--table", "stalled"])
        .output()
        .expect("run outbox-inbox setup");
    assert!(stalled.status.success(), "setup: {stalled:?}");
    // Per table: 2,500 rows past the window and 500 inside it, the newest `age` old: three
    // of them, one per consumer, so that every consumer's window is the table's.
    let seed = |table: &str, age: &str| {
        format!(
            "CREATE TRIGGER {table}_deletes AFTER DELETE ON {table} REFERENCING OLD TABLE AS gone
                 FOR EACH STATEMENT EXECUTE FUNCTION log_deletes('{table}');
             INSERT INTO {table} (consumer, message_id, received_at)
                 SELECT 'c' || g % 3, 'old-' || g,
                        now() - interval '{age}' - interval '24 hours' - g * interval '1 second'
                 FROM generate_series(1, 2500) AS g;
             INSERT INTO {table} (consumer, message_id, received_at)
                 SELECT 'c' || g % 3, 'young-' || g,
                        now() - interval '{age}' - interval '24 hours' + interval '1 minute'
                            + LEAST(g, 497) * interval '1439 minutes' / 497
                 FROM generate_series(0, 499) AS g;"
        )
    };
    db.client
        .batch_execute(&format!(
            "CREATE TABLE deletes (tbl text, txid bigint, rows bigint);
             CREATE FUNCTION log_deletes() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO deletes SELECT TG_ARGV[0], txid_current(), count(*) FROM gone;
                 RETURN NULL;
             END $$;
             {}{}",
            seed("inbox", "0 hours"),
            seed("stalled", "30 hours")
        ))
        .await
        .expect("seed the inboxes");
    let young: HashSet<String> = (0..500).map(|g| format!("young-{g}")).collect();
    for table in ["inbox", "stalled"] {
        let out = Command::new(inbox_bin())
            .args(["cleanup", "--database-url", &db.url, "--table", table])
            .args(["--retention", "24h", "--cleanup-batch", "1000"])
            .output()
            .expect("run outbox-inbox cleanup");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "cleanup: {out:?}");
        assert!(
            stdout.contains(&format!(
                "deleted 2500 rows older than 24h from public.{table} in 3 batches"
            )),
            "{stdout}"
        );
        let sql = format!("SELECT message_id FROM {table}");
        let left: HashSet<String> = first_column(&db.client, &sql, &[])
            .await
            .into_iter()
            .collect();
        assert_eq!(
            left, young,
            "{table}: exactly the rows inside the window stay"
        );
        // One DELETE per consumer name in a call: what each transaction removed.
        let deletes = db
            .client
            .query(
                "SELECT txid, sum(rows)::bigint FROM deletes WHERE tbl = $1 \
                 GROUP BY txid ORDER BY txid",
                &[&table],
            )
            .await
            .expect("read the deletes");
        let batches: Vec<i64> = deletes.iter().map(|r| r.get(1)).collect();
        let transactions: HashSet<i64> = deletes.iter().map(|r| r.get(0)).collect();
        assert_eq!(
            batches,
            [1000, 1000, 500],
            "{table}: at most the batch size"
        );
        assert_eq!(
            transactions.len(),
            3,
            "{table}: each batch its own transaction"
        );
    }

    // The batch's plan reads the index, with the inbox at the size it has in production:
    // mostly rows inside the window.
    db.client
        .batch_execute(
            "INSERT INTO inbox (consumer, message_id, received_at)
                 SELECT 'c', 'more-' || g, now() - g * interval '1 second'
                 FROM generate_series(1, 50000) AS g;
             ANALYZE inbox;",
        )
        .await
        .expect("grow the inbox");
    let batch = cleanup_batch_statement(&InboxTable::default(), 1000);
    let explain = format!(
        "EXPLAIN {}",
        batch
            .replace("$1", "'c'")
            .replace("$2", "now() - interval '24 hours'")
    );
    let plan = first_column(&db.client, &explain, &[]).await.join("\n");
    assert!(
        plan.contains("Index Scan using inbox_cleanup_idx") && plan.contains("Tid Scan"),
        "{plan}"
    );
    assert!(!plan.contains("Seq Scan"), "{plan}");
}

/// Two consumer names in one table, the window counted per name: `billing` has been down for
/// 3 hours (its newest row is 3 h old) while `shipping` kept receiving until now. A cleanup
/// with a 1 h retention keeps every `billing` row within an hour of `billing`'s own newest
/// row, and deletes only what is older than that, and the same for `shipping`: a window
/// counted from the table's newest row (the earlier SQL) deleted all of `billing`'s rows,
/// whose copies the outage still owes. Batches stay bounded across the names, every
/// statement of the cleanup reads the `(consumer, received_at)` index (no sequential scan
/// of the table, on a few thousand rows), and `setup` upgrades an inbox of the earlier
/// version: the new index created, the old `received_at` one dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_counts_each_consumers_window_back_from_that_consumers_own_newest_row() {
    let db = ConsumerDb::new("inbox_window").await;
    // The earlier version's shape, and setup over it.
    db.client
        .batch_execute(
            "DROP INDEX inbox_cleanup_idx;
             CREATE INDEX inbox_received_at_idx ON inbox (received_at);",
        )
        .await
        .expect("the earlier version's index");
    let upgrade = Command::new(inbox_bin())
        .args(["setup", "--database-url", &db.url])
        .output()
        .expect("run outbox-inbox setup");
    let report = String::from_utf8_lossy(&upgrade.stdout);
    assert!(upgrade.status.success(), "setup: {upgrade:?}");
    assert!(
        report.contains("index inbox_cleanup_idx: created\n")
            && report.contains("index inbox_received_at_idx: dropped"),
        "{report}"
    );
    let indexes = first_column(
        &db.client,
        "SELECT indexname::text FROM pg_indexes WHERE tablename = 'inbox' ORDER BY 1",
        &[],
    )
    .await;
    assert_eq!(indexes, ["inbox_cleanup_idx", "inbox_pkey"]);

    // 2,000 rows each, 3 s apart: billing's newest 3 h old, shipping's 30 min (its newest
    // is what counts, not the clock). With a 1 h window, each keeps its newest 1,201 rows
    // (the 1,201st exactly an hour before its newest) and loses the rest.
    db.client
        .batch_execute(
            "INSERT INTO inbox (consumer, message_id, received_at)
                 SELECT 'billing', 'billing-' || g, now() - interval '3 hours' - g * interval '3 s'
                 FROM generate_series(0, 1999) AS g;
             INSERT INTO inbox (consumer, message_id, received_at)
                 SELECT 'shipping', 'shipping-' || g,
                        now() - interval '30 minutes' - g * interval '3 s'
                 FROM generate_series(0, 1999) AS g;
             ANALYZE inbox;",
        )
        .await
        .expect("seed the inbox");
    let kept = |consumer: &str| -> HashSet<String> {
        (0..=1200).map(|g| format!("{consumer}-{g}")).collect()
    };

    // The plans: each consumer's batch through the index (an ordered index scan; a bitmap
    // scan of the same index where the planner expects fewer due rows than a batch), and
    // not one sequential scan in a whole call (a fresh session counts only its own scans;
    // the call is rolled back).
    for (consumer, cutoff) in [("billing", "4 hours"), ("shipping", "90 minutes")] {
        let batch = cleanup_batch_statement(&InboxTable::default(), 500);
        let explain = format!(
            "EXPLAIN {}",
            batch
                .replace("$1", &format!("'{consumer}'"))
                .replace("$2", &format!("now() - interval '{cutoff}'"))
        );
        let plan = first_column(&db.client, &explain, &[]).await.join("\n");
        assert!(
            plan.contains("Index Scan on inbox_cleanup_idx")
                || plan.contains("Index Scan using inbox_cleanup_idx"),
            "{consumer}: {plan}"
        );
        assert!(!plan.contains("Seq Scan"), "{consumer}: {plan}");
    }
    let counting = pg_connect(&db.url).await;
    counting.batch_execute("BEGIN").await.expect("begin");
    let deleted: i32 = query_value(&counting, "SELECT inbox_cleanup(interval '1 hour', 500)").await;
    assert_eq!(deleted, 500, "one bounded batch");
    let scans = counting
        .query_one(
            "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relname = 'inbox'",
            &[],
        )
        .await
        .expect("read the scans");
    let (seq_scans, index_scans): (i64, i64) = (scans.get(0), scans.get(1));
    assert_eq!(
        seq_scans, 0,
        "a sequential scan of the inbox in the cleanup"
    );
    assert!(
        index_scans > 0,
        "the cleanup used no index scan of the inbox (idx_scan {index_scans})"
    );
    counting.batch_execute("ROLLBACK").await.expect("rollback");

    let cleanup = || {
        let out = Command::new(inbox_bin())
            .args(["cleanup", "--database-url", &db.url])
            .args(["--retention", "1h", "--cleanup-batch", "500"])
            .output()
            .expect("run outbox-inbox cleanup");
        assert!(out.status.success(), "cleanup: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let stdout = cleanup();
    // 799 of each, 1,598 in all: 500, 500, 500, then 98 (short: done).
    assert!(
        stdout.contains("deleted 1598 rows older than 1h from public.inbox in 4 batches"),
        "{stdout}"
    );
    for consumer in ["billing", "shipping"] {
        let left: HashSet<String> = first_column(
            &db.client,
            "SELECT message_id FROM inbox WHERE consumer = $1",
            &[&consumer],
        )
        .await
        .into_iter()
        .collect();
        assert_eq!(
            left,
            kept(consumer),
            "{consumer}: exactly the rows within an hour of its own newest stay"
        );
    }
    // shipping keeps receiving, 15 minutes more: its window moves by as much (300 rows
    // go); billing, still down, keeps its rows.
    db.client
        .batch_execute(
            "INSERT INTO inbox (consumer, message_id, received_at)
                 SELECT 'shipping', 'shipping-new-' || g,
                        (SELECT max(received_at) FROM inbox) + interval '15 minutes'
                 FROM generate_series(1, 100) AS g",
        )
        .await
        .expect("shipping receives more");
    let again = cleanup();
    assert!(again.contains("deleted 300 rows"), "{again}");
    let shipping: i64 = query_value(
        &db.client,
        "SELECT count(*) FROM inbox WHERE consumer = 'shipping' AND message_id NOT LIKE '%new%'",
    )
    .await;
    assert_eq!(
        shipping, 901,
        "shipping keeps what is within an hour of its newest"
    );
    let billing: i64 = query_value(
        &db.client,
        "SELECT count(*) FROM inbox WHERE consumer = 'billing'",
    )
    .await;
    assert_eq!(
        billing, 1201,
        "billing's rows stay while it receives nothing"
    );
}

// ---------------------------------------------------------------------------------
// Setup and the claim

/// `setup` twice says what it created, then what it found; sql/inbox.sql runs in psql, twice;
/// the claim is true once per (consumer, message_id), and a concurrent claim of the same
/// message waits for the first transaction: false if it committed, true if it rolled back;
/// under REPEATABLE READ a serialization failure if it committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_is_idempotent_and_a_claim_is_true_exactly_once_per_consumer_and_message() {
    let s = services();
    let url = s.pg.create_database(&unique_name("inbox_setup")).await;
    let setup = || {
        let out = Command::new(inbox_bin())
            .args(["setup", "--database-url", &url])
            .output()
            .expect("run outbox-inbox setup");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).expect("utf-8")
    };
    assert_eq!(
        setup(),
        "table public.inbox: created\nindex inbox_cleanup_idx: created\n\
         function public.inbox_claim(text, text, text): created\n\
         function public.inbox_cleanup(interval, integer): created\n"
    );
    assert_eq!(
        setup(),
        "table public.inbox: exists\nindex inbox_cleanup_idx: exists\n\
         function public.inbox_claim(text, text, text): replaced\n\
         function public.inbox_cleanup(interval, integer): replaced\n"
    );

    let url = s.pg.create_database(&unique_name("inbox_psql")).await;
    let script = include_str!("../../../sql/inbox.sql");
    psql(&url, script);
    psql(&url, script);
    let a = pg_connect(&url).await;
    let claim = |consumer: &'static str, id: &'static str| {
        format!("SELECT inbox_claim('{consumer}', '{id}', '0000000001A2B3C4-00000000')")
    };
    assert!(
        claimed(&a, &claim("billing", "m-1")).await,
        "the first claim of billing/m-1"
    );
    assert!(
        !claimed(&a, &claim("billing", "m-1")).await,
        "the second claim"
    );
    assert!(
        claimed(&a, &claim("shipping", "m-1")).await,
        "another consumer"
    );

    for (end, second_gets) in [("COMMIT", false), ("ROLLBACK", true)] {
        let id: &'static str = if end == "COMMIT" { "m-2" } else { "m-3" };
        a.batch_execute("BEGIN").await.expect("begin");
        assert!(
            claimed(&a, &claim("billing", id)).await,
            "the first claim of billing/{id} (before {end})"
        );
        let second = {
            let url = url.clone();
            let sql = claim("billing", id);
            tokio::spawn(async move { claimed(&pg_connect(&url).await, &sql).await })
        };
        let waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted";
        let blocked = wait_count(&a, waiting, MINUTE, |n| n > 0).await;
        assert!(blocked.is_ok(), "the second claim waits for the first");
        a.batch_execute(end).await.expect("end");
        assert_eq!(
            second.await.expect("second claim"),
            second_gets,
            "after {end}"
        );
    }

    // Under REPEATABLE READ the waiting claim cannot see the row that beat it: a
    // serialization failure, which a consumer at that level retries (then it is false).
    let b = pg_connect(&url).await;
    b.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .await
        .expect("take b's snapshot");
    a.batch_execute("BEGIN").await.expect("begin");
    assert!(
        claimed(&a, &claim("billing", "m-4")).await,
        "the first claim of billing/m-4 (REPEATABLE READ)"
    );
    let second = tokio::spawn(async move {
        let result = b.query_one(&claim("billing", "m-4"), &[]).await;
        result.map(|_| ()).map_err(|e| e.code().cloned())
    });
    let waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted";
    let blocked = wait_count(&a, waiting, MINUTE, |n| n > 0).await;
    assert!(
        blocked.is_ok(),
        "the REPEATABLE READ claim waits for the first: ungranted locks {blocked:?}"
    );
    a.batch_execute("COMMIT").await.expect("commit");
    assert_eq!(
        second.await.expect("second claim"),
        Err(Some(
            tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
        )),
        "REPEATABLE READ: 40001"
    );
}

/// What one claim returned.
async fn claimed(client: &Client, sql: &str) -> bool {
    client.query_one(sql, &[]).await.expect("claim").get(0)
}

// ---------------------------------------------------------------------------------
// Order

/// Four lanes, twenty aggregates, their events interleaved in every transaction: each
/// aggregate's events are applied in the order they were committed, never two at once (the
/// effect takes the aggregate's advisory lock with a try: it fails if another transaction of
/// the aggregate is open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_one_aggregate_are_applied_one_at_a_time_in_delivery_order() {
    const AGGREGATES: i32 = 20;
    const STEPS: i32 = 30;
    let outbox = Outbox::new("inbox_order").await;
    for step in 0..STEPS {
        // One transaction per step, the aggregates in a different order each time.
        outbox
            .client
            .execute(
                "INSERT INTO outbox (event_type, aggregate_id, payload)
                 SELECT 'Order.step', 'order-' || a, jsonb_build_object('step', $1::int)
                 FROM generate_series(0, $2::int - 1) AS a
                 ORDER BY (a * 7 + $1::int) % $2::int",
                &[&step, &AGGREGATES],
            )
            .await
            .expect("insert a step");
    }
    let relay = outbox.spawn_relay(&[]);
    let db = ConsumerDb::new("inbox_order_consumer").await;
    let effect = "INSERT INTO effect (message_id, aggregate_id, step, alone)
                  SELECT $1, $9, ($4::jsonb ->> 'step')::int, pg_try_advisory_xact_lock(hashtext($9))
                  FROM pg_sleep(0.002)";
    let args = [
        "--concurrency",
        "4",
        "--prefetch",
        "100",
        "--effect-sql",
        effect,
    ];
    let consumer = db.consume(&outbox.amqp_url, &outbox.queue, &args, &[]);
    let total = (AGGREGATES * STEPS) as usize;
    db.wait_applied(total, &consumer).await;
    consumer.stop().await;
    relay.stop().await;

    let rows = db
        .client
        .query(
            "SELECT aggregate_id, step, alone FROM effect ORDER BY n",
            &[],
        )
        .await
        .expect("read the effects");
    assert_eq!(rows.len(), total, "each once");
    let mut steps: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for row in &rows {
        assert!(row.get::<_, bool>(2), "an aggregate applied twice at once");
        steps.entry(row.get(0)).or_default().push(row.get(1));
    }
    let in_order: Vec<i32> = (0..STEPS).collect();
    assert_eq!(steps.len(), AGGREGATES as usize);
    for (aggregate, applied) in &steps {
        assert_eq!(applied, &in_order, "{aggregate} out of order");
    }
}

// ---------------------------------------------------------------------------------
// Refusals

/// An exchange and a queue bound to it with `#` whose dead letters go to a dead-letter
/// exchange and its queue, all named after `prefix`: the exchange, the queue, the
/// dead-letter queue.
async fn dead_lettering_queue(amqp: &str, prefix: &str) -> (String, String, String) {
    let name = unique_name(prefix);
    let (exchange, queue) = (format!("{name}_x"), format!("{name}_q"));
    let (dead_letters, dead_letter_queue) = (format!("{name}_dlx"), format!("{name}_dlq"));
    declare_bound_queue(amqp, &dead_letters, &dead_letter_queue, "#").await;
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(dead_letters.as_str().into()),
    );
    declare_bound_queue_with_args(amqp, &exchange, &queue, "#", arguments).await;
    (exchange, queue, dead_letter_queue)
}

/// A delivery without a message_id (or with an empty one) is rejected without requeue: it
/// lands on the queue's dead-letter exchange, nothing is applied for it, and the consumer
/// goes on with the next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_a_message_id_goes_to_the_dead_letter_exchange_and_the_rest_are_applied()
{
    let amqp = services().rabbit.url();
    let (exchange, queue, dead_letter_queue) = dead_lettering_queue(&amqp, "inbox_noid").await;
    for id in [Some("first"), None, Some(""), Some("last")] {
        publish(&amqp, &exchange, id).await;
    }
    let mut dead = Consumer::start(&amqp, &dead_letter_queue).await;
    let db = ConsumerDb::new("inbox_noid_consumer").await;
    let consumer = db.consume(&amqp, &queue, &[], &[]);
    db.wait_applied(2, &consumer).await;
    let letters = dead.wait_for(2, MINUTE).await;
    assert_eq!(letters.len(), 2, "both refused deliveries dead-lettered");
    assert!(
        letters
            .iter()
            .all(|l| l.message_id.as_deref().unwrap_or("").is_empty()),
        "a dead letter with a message_id: {:?}",
        letters.iter().map(|l| &l.message_id).collect::<Vec<_>>()
    );
    consumer.stop().await;
    assert_eq!(
        totals(&consumer),
        Totals {
            applied: 2,
            duplicates: 0,
            rejected: 2
        }
    );
    assert_eq!(consumer.log_count(log::REJECTED), 2);
    db.assert_applied_once(&["first".into(), "last".into()])
        .await;
}

/// A message_id or an x-outbox-seq holding a NUL byte cannot be stored in PostgreSQL text,
/// so the claim would fail on it at every attempt: it is refused like a message without a
/// message_id (dead-lettered), and the consumer goes on with the next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_byte_in_the_message_id_or_seq_goes_to_the_dead_letter_exchange_and_the_rest_are_applied(
) {
    let amqp = services().rabbit.url();
    let (exchange, queue, dead_letter_queue) = dead_lettering_queue(&amqp, "inbox_nul").await;
    let seq = |value: &str| {
        let mut headers = FieldTable::default();
        headers.insert("x-outbox-seq".into(), AMQPValue::LongString(value.into()));
        headers
    };
    publish(&amqp, &exchange, Some("first")).await;
    publish(&amqp, &exchange, Some("nul\0in the id")).await;
    publish_with(
        &amqp,
        &exchange,
        Some("nul-in-the-seq"),
        seq("0000000001A2B3C4\0-00000000"),
    )
    .await;
    publish_with(
        &amqp,
        &exchange,
        Some("last"),
        seq("0000000001A2B3C4-00000001"),
    )
    .await;
    let mut dead = Consumer::start(&amqp, &dead_letter_queue).await;
    let db = ConsumerDb::new("inbox_nul_consumer").await;
    let consumer = db.consume(&amqp, &queue, &[], &[]);
    let letters = dead.wait_for(2, MINUTE).await;
    let ids: HashSet<&str> = letters
        .iter()
        .filter_map(|l| l.message_id.as_deref())
        .collect();
    assert_eq!(
        ids,
        ["nul\0in the id", "nul-in-the-seq"].into(),
        "both refused deliveries dead-lettered; consumer log:\n{}",
        consumer.log()
    );
    db.wait_applied(2, &consumer).await;
    consumer.stop().await;
    assert_eq!(
        totals(&consumer),
        Totals {
            applied: 2,
            duplicates: 0,
            rejected: 2
        }
    );
    assert_eq!(consumer.log_count(log::REJECTED_NUL), 2);
    db.assert_applied_once(&["first".into(), "last".into()])
        .await;
}

/// Publishes one persistent message, with `message_id` if given, and waits for its confirm.
async fn publish(amqp: &str, exchange: &str, message_id: Option<&str>) {
    publish_with(amqp, exchange, message_id, FieldTable::default()).await;
}

/// [`publish`] with `headers`.
async fn publish_with(amqp: &str, exchange: &str, message_id: Option<&str>, headers: FieldTable) {
    let connection = amqp_connect(amqp).await;
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm_select");
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(id) = message_id {
        properties = properties.with_message_id(id.into());
    }
    let confirm = channel
        .basic_publish(
            exchange.into(),
            "Test.noid".into(),
            BasicPublishOptions::default(),
            b"{}",
            properties,
        )
        .await
        .expect("publish");
    let confirmation = confirm.await.expect("confirm");
    assert!(
        confirmation.is_ack(),
        "publish of {message_id:?} to {exchange}: {confirmation:?}"
    );
    let _ = connection.close(200, "OK".into()).await;
}

/// An effect that fails on a message (here: the id is not a number) stops the consumer,
/// naming the message; the message stays in the queue and nothing of its transaction, not
/// even its inbox row, is left. Without its inbox, or its queue, the consumer does not start,
/// and says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definite_errors_stop_the_consumer_naming_the_fix_and_keep_the_message() {
    let s = services();
    let amqp = s.rabbit.url();
    let name = unique_name("inbox_fail");
    let (exchange, queue) = (format!("{name}_x"), format!("{name}_q"));
    declare_bound_queue(&amqp, &exchange, &queue, "#").await;
    publish_confirmed(&amqp, &exchange, "Test.fail", &[("not-a-number", b"{}")]).await;
    let db = ConsumerDb::new("inbox_fail_consumer").await;
    let failing = "INSERT INTO effect (message_id, step) VALUES ($1, $1::int)";
    let consumer = db.consume(&amqp, &queue, &["--effect-sql", failing], &[]);
    let status = consumer
        .wait_exit(MINUTE)
        .await
        .expect("the consumer stops");
    assert_eq!(status.code(), Some(1), "log:\n{}", consumer.log());
    let log = consumer.log();
    assert!(
        log.contains("Applying message not-a-number failed (SQLSTATE 22P02: "),
        "{log}"
    );
    assert_eq!(queue_message_count(&amqp, &queue).await, 1, "still queued");
    db.assert_applied_once(&[]).await;

    let bare = s.pg.create_database(&unique_name("inbox_bare")).await;
    let stopped = |args: &[&str]| {
        let out = Command::new(inbox_bin())
            .args(["consume", "--amqp-url", &amqp, "--consumer", CONSUMER])
            .args(["--effect-sql", "SELECT 1", "--cleanup-interval", "0"])
            .args(args)
            .output()
            .expect("run outbox-inbox consume");
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let no_inbox = stopped(&["--database-url", &bare, "--queue", &queue]);
    assert!(no_inbox.contains("run `outbox-inbox setup`"), "{no_inbox}");
    let no_queue = stopped(&["--database-url", &db.url, "--queue", "no_such_queue"]);
    assert!(
        no_queue.contains("The queue \"no_such_queue\" does not exist"),
        "{no_queue}"
    );
    let no_dead_letters = ["--database-url", &db.url, "--queue", &queue];
    let no_dead_letters = [
        &no_dead_letters[..],
        &["--dead-letter-exchange", "no_such_x"],
    ];
    let no_dead_letters = stopped(&no_dead_letters.concat());
    assert!(
        no_dead_letters.contains(
            "The dead-letter exchange \"no_such_x\" (--dead-letter-exchange) does not exist"
        ),
        "{no_dead_letters}"
    );
    assert_eq!(queue_message_count(&amqp, &queue).await, 1, "nothing taken");
}

// ---------------------------------------------------------------------------------
// Connections

/// The consumer's PostgreSQL sessions say who they are in pg_stat_activity: `outbox-inbox`,
/// or the application_name its database URL sets (which wins).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumers_sessions_are_named_outbox_inbox_unless_the_url_names_them() {
    let s = services();
    let amqp = s.rabbit.url();
    let name = unique_name("inbox_appname");
    let (exchange, queue) = (format!("{name}_x"), format!("{name}_q"));
    declare_bound_queue(&amqp, &exchange, &queue, "#").await;
    for (url_name, expected) in [
        (Some("billing-inbox"), "billing-inbox"),
        (None, "outbox-inbox"),
    ] {
        let mut db = ConsumerDb::new("inbox_appname_consumer").await;
        if let Some(url_name) = url_name {
            db.url = format!("{}?application_name={url_name}", db.url);
        }
        let consumer = db.consume(&amqp, &queue, &["--concurrency", "2"], &[]);
        let named = format!(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = '{expected}'"
        );
        let sessions = wait_count(&db.client, &named, MINUTE, |n| n >= 2).await;
        let seen = first_column(
            &db.client,
            "SELECT DISTINCT application_name FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await;
        assert!(
            sessions.is_ok(),
            "the consumer's sessions are named {expected:?}: seen {seen:?}; log:\n{}",
            consumer.log()
        );
        consumer.stop().await;
    }
}

// ---------------------------------------------------------------------------------
// Timeouts

/// A claim or an effect that waits is bounded by `--statement-timeout`. First the claim: the
/// test holds an uncommitted claim of the message (what a replica whose host vanished
/// mid-transaction leaves until the server ends its session), so the consumer's claim waits
/// on that row. Then the effect: the test holds a row lock the effect's UPDATE needs. Each
/// time the consumer's statement is cancelled after 2 s (57014), the lane keeps the delivery
/// and tries again after a backoff (the consumer keeps running); once the test lets go, the
/// message is applied, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_or_effect_waiting_past_the_statement_timeout_is_retried_and_applied_once() {
    let s = services();
    let amqp = s.rabbit.url();
    let name = unique_name("inbox_timeout");
    let (exchange, queue) = (format!("{name}_x"), format!("{name}_q"));
    declare_bound_queue(&amqp, &exchange, &queue, "#").await;
    let db = ConsumerDb::new("inbox_timeout_consumer").await;
    db.client
        .batch_execute("CREATE TABLE gate (id int PRIMARY KEY, passed int NOT NULL); INSERT INTO gate VALUES (1, 0);")
        .await
        .expect("create the gate");
    let effect = "WITH passed AS (UPDATE gate SET passed = passed + 1 WHERE id = 1 RETURNING 1)
                  INSERT INTO effect (message_id) SELECT $1 FROM passed";
    let args = [
        "--effect-sql",
        effect,
        "--concurrency",
        "1",
        "--prefetch",
        "10",
        "--peer-timeout",
        "5s",
        "--statement-timeout",
        "2s",
    ];
    let consumer = db.consume(&amqp, &queue, &args, &[]);
    let holder = pg_connect(&db.url).await;
    let cancelled = "SQLSTATE 57014";
    let ids = [format!("{name}-claim"), format!("{name}-effect")];

    for (id, hold) in ids.iter().zip([
        format!("SELECT inbox_claim('{CONSUMER}', '{}')", ids[0]),
        "SELECT * FROM gate WHERE id = 1 FOR UPDATE".to_string(),
    ]) {
        holder
            .batch_execute(&format!("BEGIN; {hold}"))
            .await
            .expect("hold the row");
        let before = consumer.log_count(cancelled);
        publish_confirmed(&amqp, &exchange, "Test.timeout", &[(id.as_str(), b"{}")]).await;
        assert!(
            consumer
                .wait_for_log_count(cancelled, before + 2, MINUTE)
                .await,
            "{id}: the waiting statement was not cancelled twice; log:\n{}",
            consumer.log()
        );
        assert!(
            consumer.try_exit().is_none(),
            "a timeout stopped the consumer"
        );
        assert!(
            !db.effects().await.contains_key(id),
            "{id} applied while its row was held"
        );
        // The claim's holder goes away (as the server ends a vanished replica's session);
        // the effect's commits, having changed nothing.
        let end = if id == &ids[0] { "ROLLBACK" } else { "COMMIT" };
        holder.batch_execute(end).await.expect("let go");
        let applied = wait_count(
            &db.client,
            &format!("SELECT count(*) FROM effect WHERE message_id = '{id}'"),
            MINUTE,
            |n| n > 0,
        )
        .await;
        assert!(
            applied.is_ok(),
            "{id} not applied; log:\n{}",
            consumer.log()
        );
    }
    // The AMQP heartbeat is half the peer timeout (5 s: 3 s), so that RabbitMQ would give a
    // vanished replica's deliveries to another within about the timeout.
    if std::env::var_os(common::AMQP_URL_ENV).is_none() {
        let mut heartbeat = None;
        for _ in 0..20 {
            let out = s
                .rabbit
                .ctl(&["list_connections", "client_properties", "timeout"]);
            let listed = String::from_utf8_lossy(&out.stdout).into_owned();
            heartbeat = listed
                .lines()
                .find(|line| line.contains("outbox-inbox"))
                .and_then(|line| line.split_whitespace().last().map(String::from));
            if heartbeat.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(heartbeat.as_deref(), Some("3"), "the consumer's heartbeat");
    }
    let failures = consumer.log_lines(cancelled);
    assert!(
        failures
            .iter()
            .all(|line| line.contains(log::HOLDING) && line.contains("--statement-timeout")),
        "{failures:?}"
    );
    consumer.stop().await;
    assert_eq!(
        totals(&consumer),
        Totals {
            applied: 2,
            duplicates: 0,
            rejected: 0
        }
    );
    db.assert_applied_once(&ids).await;
    let passed: i32 = query_value(&db.client, "SELECT passed FROM gate").await;
    assert_eq!(passed, 2, "each effect committed once");
    assert_eq!(queue_message_count(&amqp, &queue).await, 0);
}

// ---------------------------------------------------------------------------------
// Quorum queues' delivery limit (RabbitMQ 4)

/// A way a consumer gives a delivery back to its queue unacknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GiveBack {
    RejectRequeue,
    NackRequeue,
    ChannelClosed,
    ConnectionClosed,
    /// basic.cancel of the consumer holding it (is it given back?), then its channel closed.
    CancelledThenChannelClosed,
}

const GIVE_BACKS: [GiveBack; 5] = [
    GiveBack::RejectRequeue,
    GiveBack::NackRequeue,
    GiveBack::ChannelClosed,
    GiveBack::ConnectionClosed,
    GiveBack::CancelledThenChannelClosed,
];

/// What became of one message given back again and again.
#[derive(Debug, Default)]
struct GiveBacks {
    /// Give-backs before it left the queue (for the dead-letter queue); `None`: still
    /// queued after the most a run tries.
    gone_after: Option<u32>,
    /// `x-delivery-count` on each delivery (None: absent).
    delivery_counts: Vec<Option<i64>>,
    /// `x-acquired-count` on each delivery (4.3).
    acquired_counts: Vec<Option<i64>>,
    /// The dead letter's `x-first-death-reason`.
    death_reason: Option<String>,
    /// For a cancel: whether the cancel alone gave it back (each time).
    cancel_gave_back: Vec<bool>,
}

/// A header's integer value, if it has one.
fn header_int(properties: &BasicProperties, name: &str) -> Option<i64> {
    let value = properties.headers().as_ref()?.inner().get(name)?;
    common::amqp::amqp_to_json(value).as_i64()
}

/// Ready messages in `queue`, through `channel` (a passive declare).
async fn ready(channel: &lapin::Channel, queue: &str) -> u32 {
    let options = lapin::options::QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue.into(), options, FieldTable::default())
        .await
        .unwrap_or_else(|e| panic!("passive declare of {queue}: {e:?}"))
        .message_count()
}

/// Declares a quorum queue with a dead-letter exchange bound to its own queue, with
/// `extra` arguments; publishes one message to it. Returns (queue, dead-letter queue).
async fn quorum_queue_with_one_message(
    amqp: &str,
    prefix: &str,
    extra: &[(&str, AMQPValue)],
) -> (String, String) {
    let name = unique_name(prefix);
    let (exchange, queue) = (format!("{name}_x"), format!("{name}_q"));
    let (dead_letters, dead_letter_queue) = (format!("{name}_dlx"), format!("{name}_dlq"));
    declare_bound_queue(amqp, &dead_letters, &dead_letter_queue, "#").await;
    let mut arguments = common::amqp::quorum_queue_arguments();
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(dead_letters.as_str().into()),
    );
    for (key, value) in extra {
        arguments.insert((*key).into(), value.clone());
    }
    declare_bound_queue_with_args(amqp, &exchange, &queue, "#", arguments).await;
    publish_confirmed(amqp, &exchange, "Test.limit", &[(name.as_str(), b"{}")]).await;
    (queue, dead_letter_queue)
}

/// Takes the message and gives it back `how`, up to `most` times, until it is no longer
/// given out: each round waits until it is ready in `queue` again or in the dead-letter
/// queue (one of the two always comes: the queue has a dead-letter exchange).
async fn give_back_until_gone(
    amqp: &str,
    queue: &str,
    dead_letter_queue: &str,
    how: GiveBack,
    most: u32,
) -> GiveBacks {
    let probe_connection = amqp_connect(amqp).await;
    let probe = probe_connection.create_channel().await.expect("channel");
    let mut connection = amqp_connect(amqp).await;
    let mut measured = GiveBacks::default();
    let get = lapin::options::BasicGetOptions { no_ack: false };
    for given_back in 0..=most {
        let deadline = tokio::time::Instant::now() + MINUTE;
        loop {
            if ready(&probe, dead_letter_queue).await == 1 {
                measured.gone_after = Some(given_back);
                let letter = probe
                    .basic_get(dead_letter_queue.into(), get)
                    .await
                    .expect("get the dead letter")
                    .expect("the dead letter");
                let reason = letter.delivery.properties.headers().as_ref().and_then(|h| {
                    h.inner()
                        .get("x-first-death-reason")
                        .map(common::amqp::amqp_to_json)
                });
                measured.death_reason = reason.map(|r| r.as_str().unwrap_or("").to_string());
                let _ = probe_connection.close(200, "OK".into()).await;
                let _ = connection.close(200, "OK".into()).await;
                return measured;
            }
            if ready(&probe, queue).await == 1 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{how:?}: after {given_back} give-backs the message is neither ready nor \
                 dead-lettered"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if given_back == most {
            break;
        }
        if how == GiveBack::ConnectionClosed {
            connection = amqp_connect(amqp).await;
        }
        let channel = connection.create_channel().await.expect("channel");
        let delivery = if how == GiveBack::CancelledThenChannelClosed {
            channel
                .basic_qos(1, BasicQosOptions::default())
                .await
                .expect("qos");
            let mut deliveries = channel
                .basic_consume(
                    queue.into(),
                    "".into(),
                    lapin::options::BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("consume");
            let delivery = tokio::time::timeout(MINUTE, deliveries.next())
                .await
                .expect("a delivery within a minute")
                .expect("a delivery")
                .expect("a delivery");
            channel
                .basic_cancel(
                    deliveries.tag(),
                    lapin::options::BasicCancelOptions::default(),
                )
                .await
                .expect("cancel");
            // Ordered after the cancel on the queue's side (one channel): it gets the message
            // only if the cancel gave it back.
            let again = channel.basic_get(queue.into(), get).await.expect("get");
            measured.cancel_gave_back.push(again.is_some());
            delivery
        } else {
            channel
                .basic_get(queue.into(), get)
                .await
                .expect("get")
                .expect("the message is ready")
                .delivery
        };
        measured
            .delivery_counts
            .push(header_int(&delivery.properties, "x-delivery-count"));
        measured
            .acquired_counts
            .push(header_int(&delivery.properties, "x-acquired-count"));
        match how {
            GiveBack::RejectRequeue => {
                let requeue = BasicRejectOptions { requeue: true };
                delivery.acker.reject(requeue).await.expect("reject");
                let _ = channel.close(200, "OK".into()).await;
            }
            GiveBack::NackRequeue => {
                let requeue = lapin::options::BasicNackOptions {
                    requeue: true,
                    multiple: false,
                };
                delivery.acker.nack(requeue).await.expect("nack");
                let _ = channel.close(200, "OK".into()).await;
            }
            GiveBack::ChannelClosed | GiveBack::CancelledThenChannelClosed => {
                channel.close(200, "OK".into()).await.expect("close");
            }
            GiveBack::ConnectionClosed => {
                connection.close(200, "OK".into()).await.expect("close");
            }
        }
    }
    let _ = probe_connection.close(200, "OK".into()).await;
    let _ = connection.close(200, "OK".into()).await;
    measured
}

/// One line of figures for a run.
fn describe(measured: &GiveBacks) -> String {
    let counts = |values: &[Option<i64>]| -> String {
        let shown: Vec<String> = values
            .iter()
            .map(|v| v.map_or("-".into(), |n| n.to_string()))
            .collect();
        shown.join(" ")
    };
    format!(
        "gone after {} give-backs (reason {}); x-delivery-count [{}]; x-acquired-count [{}]; \
         cancel gave back {:?}",
        measured.gone_after.map_or("none".into(), |n| n.to_string()),
        measured.death_reason.as_deref().unwrap_or("-"),
        counts(&measured.delivery_counts),
        counts(&measured.acquired_counts),
        measured.cancel_gave_back,
    )
}

/// What the measurements found, per series (docs/consumers.md, "Quorum queues: the delivery
/// limit"): the default limit, whether `basic.nack` with requeue and a consumer timeout
/// count toward it, and what `x-delivery-limit: -1` means.
struct Facts {
    /// `None`: no limit unless the queue sets one.
    default_limit: Option<u32>,
    nack_counts: bool,
    consumer_timeout_counts: bool,
    /// `x-delivery-limit: -1` lifts the limit (else: the first give-back dead-letters).
    minus_one_unlimited: bool,
}

fn facts() -> Facts {
    match common::rabbit_release::release().series() {
        "3.10" => Facts {
            default_limit: None,
            nack_counts: true,
            consumer_timeout_counts: true,
            minus_one_unlimited: false,
        },
        "4.0" => Facts {
            default_limit: Some(20),
            nack_counts: true,
            consumer_timeout_counts: true,
            minus_one_unlimited: true,
        },
        "4.3" => Facts {
            default_limit: Some(20),
            nack_counts: false,
            consumer_timeout_counts: false,
            minus_one_unlimited: true,
        },
        other => panic!(
            "no facts recorded for RabbitMQ {other}: see what these tests print on it, and \
             record them here and in docs/consumers.md"
        ),
    }
}

impl GiveBack {
    fn counts(self, facts: &Facts) -> bool {
        self != GiveBack::NackRequeue || facts.nack_counts
    }
}

/// Which ways of giving a delivery back count toward a quorum queue's delivery limit, and
/// when the message leaves the queue, on the kit's RabbitMQ series: for each way, a quorum
/// queue with a dead-letter exchange, the message taken and given back until it leaves
/// (for the dead-letter queue) or 25 times; once with the series' default limit, once with
/// `x-delivery-limit: 2`. A consumer's cancel alone never gives its delivery back. Without
/// a dead-letter exchange the message is dropped where it would have been dead-lettered;
/// `x-delivery-limit: -1` lifts the limit on 4.x and dead-letters at once on 3.10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_counts_toward_a_quorum_queues_delivery_limit() {
    let amqp = services().rabbit.url();
    let series = common::rabbit_release::release().series();
    let facts = facts();
    for how in GIVE_BACKS {
        let (queue, dlq) = quorum_queue_with_one_message(&amqp, "limit_default", &[]).await;
        let default = give_back_until_gone(&amqp, &queue, &dlq, how, 25).await;
        println!(
            "LIMIT {series} {how:?}, default limit: {}",
            describe(&default)
        );
        let two = [("x-delivery-limit", AMQPValue::LongInt(2))];
        let (queue, dlq) = quorum_queue_with_one_message(&amqp, "limit_two", &two).await;
        let limited = give_back_until_gone(&amqp, &queue, &dlq, how, 6).await;
        println!(
            "LIMIT {series} {how:?}, x-delivery-limit 2: {}",
            describe(&limited)
        );

        let counted = how.counts(&facts);
        let expected = facts
            .default_limit
            .filter(|_| counted)
            .map(|limit| limit + 1);
        assert_eq!(default.gone_after, expected, "{how:?}, the default limit");
        assert_eq!(limited.gone_after, counted.then_some(3), "{how:?}, limit 2");
        for gone in [&default, &limited]
            .into_iter()
            .filter(|m| m.gone_after.is_some())
        {
            assert_eq!(gone.death_reason.as_deref(), Some("delivery_limit"));
        }
        assert!(
            !default.cancel_gave_back.iter().any(|gave| *gave),
            "a cancel gave the delivery back"
        );
    }

    // No dead-letter exchange: dropped where it would have been dead-lettered.
    let name = unique_name("limit_nodlx");
    let (exchange, queue) = (format!("{name}_x"), format!("{name}_q"));
    common::amqp::declare_bound_quorum_queue(&amqp, &exchange, &queue, "#").await;
    publish_confirmed(&amqp, &exchange, "Test.limit", &[(name.as_str(), b"{}")]).await;
    let delivered = deliveries_until_gone(&amqp, &queue, 30).await;
    println!("LIMIT {series} no dead-letter exchange: delivered {delivered} times (30 at most)");
    let expected = facts.default_limit.map_or(30, |limit| limit + 1);
    assert_eq!(delivered, expected, "deliveries before it was dropped");
    let left = queue_message_count(&amqp, &queue).await;
    assert_eq!(left, u32::from(facts.default_limit.is_none()), "dropped");

    let minus_one = [("x-delivery-limit", AMQPValue::LongInt(-1))];
    let (queue, dlq) = quorum_queue_with_one_message(&amqp, "limit_minus1", &minus_one).await;
    let measured = give_back_until_gone(&amqp, &queue, &dlq, GiveBack::ChannelClosed, 25).await;
    println!(
        "LIMIT {series} x-delivery-limit -1: {}",
        describe(&measured)
    );
    let expected = (!facts.minus_one_unlimited).then_some(1);
    assert_eq!(measured.gone_after, expected, "x-delivery-limit -1");
}

/// Takes the message from `queue` and rejects it with requeue on one channel until a get
/// finds the queue empty (ordered after the reject: one channel), at most `most` times;
/// how many deliveries there were.
async fn deliveries_until_gone(amqp: &str, queue: &str, most: u32) -> u32 {
    let connection = amqp_connect(amqp).await;
    let channel = connection.create_channel().await.expect("channel");
    let get = lapin::options::BasicGetOptions { no_ack: false };
    let mut delivered = 0;
    while delivered < most {
        let Some(message) = channel.basic_get(queue.into(), get).await.expect("get") else {
            break;
        };
        delivered += 1;
        let requeue = BasicRejectOptions { requeue: true };
        message
            .delivery
            .acker
            .reject(requeue)
            .await
            .expect("reject");
    }
    let _ = connection.close(200, "OK".into()).await;
    delivered
}

/// A delivery held past the broker's `consumer_timeout` (1 s here, checked every second)
/// comes back to the queue: on 3.10 and 4.0 the broker closes the channel (406
/// PRECONDITION_FAILED) and that counts toward the limit, as any closed channel does; on
/// 4.3 it cancels the consumer instead, and that does not count. With `x-delivery-limit: 1`
/// the second timeout dead-letters the message where timeouts count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_consumer_timeout_does_to_a_quorum_queues_delivery_count() {
    let rabbit = common::RabbitServer::start_with_config(&["consumer_timeout = 1000"]);
    // The channel checks its deliveries' age on this tick (60 s by default); channels
    // opened from now on read it.
    let tick = "application:set_env(rabbit, channel_tick_interval, 1000).";
    let set = rabbit.ctl(&["eval", tick]);
    assert!(set.status.success(), "{set:?}");
    let amqp = rabbit.url();
    let series = common::rabbit_release::release().series();
    let one = [("x-delivery-limit", AMQPValue::LongInt(1))];
    let (queue, dlq) = quorum_queue_with_one_message(&amqp, "limit_timeout", &one).await;
    let probe_connection = amqp_connect(&amqp).await;
    let probe = probe_connection.create_channel().await.expect("channel");
    let connection = amqp_connect(&amqp).await;
    let mut gone_after = None;
    let mut ends = Vec::new();
    for timeouts in 0..=3 {
        let deadline = tokio::time::Instant::now() + MINUTE;
        loop {
            if ready(&probe, &dlq).await == 1 {
                gone_after = Some(timeouts);
                break;
            }
            if ready(&probe, &queue).await == 1 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "neither ready nor dead"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if gone_after.is_some() || timeouts == 3 {
            break;
        }
        let channel = connection.create_channel().await.expect("channel");
        channel
            .basic_qos(1, BasicQosOptions::default())
            .await
            .expect("qos");
        let mut deliveries = channel
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                lapin::options::BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let first = tokio::time::timeout(MINUTE, deliveries.next()).await;
        assert!(matches!(first, Ok(Some(Ok(_)))), "a delivery: {first:?}");
        // Held, unacknowledged, until the broker ends the consumer or its channel.
        let end = tokio::time::timeout(MINUTE, deliveries.next())
            .await
            .expect("the broker ends the consumer within a minute");
        ends.push(match end {
            None => "consumer cancelled".to_string(),
            Some(Err(e)) => format!("channel closed: {e}"),
            Some(Ok(_)) => panic!("a second delivery with a prefetch of 1"),
        });
    }
    println!(
        "LIMIT {series} consumer timeouts, x-delivery-limit 1: gone after {gone_after:?}; {ends:?}"
    );
    let _ = probe_connection.close(200, "OK".into()).await;
    let _ = connection.close(200, "OK".into()).await;
    let counts = facts().consumer_timeout_counts;
    assert_eq!(gone_after, counts.then_some(2), "{ends:?}");
    let closed = ends.iter().all(|end| end.contains("PRECONDITION_FAILED"));
    assert_eq!(closed, counts, "{ends:?}");
}

/// The consumer's queue as docs/consumers.md declares it for RabbitMQ 4 (and 3.10): a
/// quorum queue whose delivery limit is set on purpose (20, 4.x's default, which 3.10 does
/// not have) and whose dead letters go to `dead_letters` at least once (which needs
/// `x-overflow: reject-publish`).
fn recipe_queue_arguments(dead_letters: &str) -> FieldTable {
    let mut arguments = common::amqp::quorum_queue_arguments();
    for (key, value) in [
        ("x-delivery-limit", AMQPValue::LongInt(20)),
        (
            "x-dead-letter-exchange",
            AMQPValue::LongString(dead_letters.into()),
        ),
        (
            "x-dead-letter-strategy",
            AMQPValue::LongString("at-least-once".into()),
        ),
        ("x-overflow", AMQPValue::LongString("reject-publish".into())),
    ] {
        arguments.insert(key.into(), value);
    }
    arguments
}

/// The effect `SELECT through_gate($1)`: counts each attempt in a sequence (a rollback does
/// not undo it) and, while the gate is closed, fails with SQLSTATE 53100 disk_full, a
/// failure that can pass (what a consumer's database out of disk answers); once the gate
/// is open it applies the message.
const GATE: &str = "
    CREATE SEQUENCE attempts;
    CREATE TABLE gate (open boolean NOT NULL);
    INSERT INTO gate VALUES (false);
    CREATE FUNCTION through_gate(id text) RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM nextval('attempts');
        IF NOT (SELECT open FROM gate) THEN
            RAISE EXCEPTION 'the test''s gate is closed' USING ERRCODE = 'disk_full';
        END IF;
        INSERT INTO effect (message_id) VALUES (id);
    END $$;";

/// A failure of the consumer's database that passes, but only after more attempts than the
/// queue's delivery limit allows give-backs (25 > 20): the messages are neither applied nor
/// given up meanwhile, and once the database works again each is applied once. The queue is
/// the recipe's (limit 20, dead letters at least once to its dead-letter exchange), so a
/// message counted out by its redeliveries would show in the dead-letter queue. Halfway,
/// the consumer's database sessions are terminated as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_outlasting_the_delivery_limit_loses_nothing_and_applies_once() {
    const ATTEMPTS: i64 = 25;
    let s = services();
    let amqp = s.rabbit.url();
    let name = unique_name("inbox_outage");
    let (exchange, queue) = (format!("{name}_x"), format!("{name}_q"));
    let (dead_letters, dead_letter_queue) = (format!("{name}_dlx"), format!("{name}_dlq"));
    declare_bound_queue(&amqp, &dead_letters, &dead_letter_queue, "#").await;
    let arguments = recipe_queue_arguments(&dead_letters);
    declare_bound_queue_with_args(&amqp, &exchange, &queue, "#", arguments).await;
    let db = ConsumerDb::new("inbox_outage_consumer").await;
    db.client
        .batch_execute(GATE)
        .await
        .expect("create the gate");
    let ids: Vec<String> = (0..3).map(|i| format!("{name}-{i}")).collect();
    let messages: Vec<(&str, &[u8])> = ids.iter().map(|id| (id.as_str(), &b"{}"[..])).collect();
    publish_confirmed(&amqp, &exchange, "Test.outage", &messages).await;
    let args = [
        "--effect-sql",
        "SELECT through_gate($1)",
        "--concurrency",
        "1",
        "--prefetch",
        "10",
        "--max-backoff",
        "1s",
    ];
    let consumer = db.consume(&amqp, &queue, &args, &[]);

    let attempts_sql = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM attempts";
    let deadline = tokio::time::Instant::now() + 3 * MINUTE;
    let mut terminated: i64 = 0;
    // One connection for the whole watch, not one per look.
    let probe_connection = amqp_connect(&amqp).await;
    let probe = probe_connection.create_channel().await.expect("channel");
    loop {
        let attempts: i64 = query_value(&db.client, attempts_sql).await;
        if attempts >= ATTEMPTS {
            break;
        }
        if attempts >= 10 && terminated == 0 {
            // Its database connection lost too, in the middle of it.
            let terminate = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                             WHERE datname = current_database() AND pid <> pg_backend_pid()";
            // None between two sessions of a consumer that reconnects: the next round tries.
            terminated = query_value(&db.client, terminate).await;
        }
        let dead = ready(&probe, &dead_letter_queue).await;
        assert_eq!(
            dead,
            0,
            "after {attempts} attempts RabbitMQ dead-lettered {dead} messages by their \
             delivery count (queue {queue}: {} ready); consumer log:\n{}",
            ready(&probe, &queue).await,
            consumer.log()
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {attempts} attempts in 3 minutes; log:\n{}",
            consumer.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = probe_connection.close(200, "OK".into()).await;
    assert!(terminated > 0, "no consumer session was terminated");
    assert!(
        db.effects().await.is_empty(),
        "applied through a closed gate"
    );
    assert!(
        consumer.try_exit().is_none(),
        "a transient failure stopped it"
    );

    db.client
        .execute("UPDATE gate SET open = true", &[])
        .await
        .expect("open the gate");
    db.wait_applied(ids.len(), &consumer).await;
    consumer.stop().await;
    db.assert_applied_once(&ids).await;
    assert_eq!(queue_message_count(&amqp, &queue).await, 0, "{queue}");
    assert_eq!(
        queue_message_count(&amqp, &dead_letter_queue).await,
        0,
        "nothing dead-lettered"
    );
    let attempts: i64 = query_value(&db.client, attempts_sql).await;
    report(
        "inbox transient failure past the delivery limit",
        &[
            ("messages", ids.len().to_string()),
            ("attempts", attempts.to_string()),
            ("sessions terminated", terminated.to_string()),
            ("dead-lettered", "0".into()),
        ],
    );
}

/// An effect that fails on a body whose `step` is not a number: SQLSTATE 22P02, the
/// message's data, every time.
const STEP_EFFECT: &str =
    "INSERT INTO effect (message_id, step) VALUES ($1, ($4::jsonb ->> 'step')::int)";

/// The environment variable naming the inbox's dead-letter exchange (`--dead-letter-exchange`).
const DEAD_LETTER_EXCHANGE_ENV: &str = "OUTBOX_INBOX_DEAD_LETTER_EXCHANGE";

/// A poison message (its effect fails on its data every time: SQLSTATE 22P02) and a delivery
/// without a message_id go to the dead-letter exchange the consumer is given, with the
/// reason, and the messages after them are applied; the consumer never stops. The queue is a
/// quorum queue as declared before RabbitMQ 4 (nothing but its type): on 4.x it drops a
/// message given back more than 20 times, and it has no dead-letter exchange of its own. The
/// consumer runs as a supervisor would run it: started again whenever it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_goes_to_the_named_dead_letter_exchange_and_the_rest_are_applied() {
    let s = services();
    let amqp = s.rabbit.url();
    let name = unique_name("inbox_poison");
    let (exchange, queue) = (format!("{name}_x"), format!("{name}_q"));
    let (dead_letters, dead_letter_queue) = (format!("{name}_dead"), format!("{name}_dead_q"));
    common::amqp::declare_bound_quorum_queue(&amqp, &exchange, &queue, "#").await;
    declare_bound_queue(&amqp, &dead_letters, &dead_letter_queue, "#").await;
    let good: Vec<String> = (0..5).map(|i| format!("{name}-{i}")).collect();
    let poison = format!("{name}-poison");
    let mut messages: Vec<(&str, &[u8])> = vec![(good[0].as_str(), br#"{"step": 0}"#)];
    messages.push((poison.as_str(), br#"{"step": "x"}"#));
    messages.extend(
        good[1..]
            .iter()
            .map(|id| (id.as_str(), &br#"{"step": 1}"#[..])),
    );
    publish_confirmed(&amqp, &exchange, "Test.poison", &messages).await;
    publish(&amqp, &exchange, None).await;

    let db = ConsumerDb::new("inbox_poison_consumer").await;
    let args = [
        "--effect-sql",
        STEP_EFFECT,
        "--concurrency",
        "1",
        "--prefetch",
        "10",
    ];
    let env = [(DEAD_LETTER_EXCHANGE_ENV, dead_letters.as_str())];
    let mut consumer = db.consume(&amqp, &queue, &args, &env);
    let mut exits = Vec::new();
    let deadline = tokio::time::Instant::now() + 2 * MINUTE;
    let probe_connection = amqp_connect(&amqp).await;
    let probe = probe_connection.create_channel().await.expect("channel");
    let applied_sql = "SELECT count(DISTINCT message_id) FROM effect";
    loop {
        let applied: i64 = query_value(&db.client, applied_sql).await;
        let dead = ready(&probe, &dead_letter_queue).await;
        if applied == good.len() as i64 && dead == 2 {
            break;
        }
        if let Some(status) = consumer.try_exit() {
            exits.push(status);
            if exits.len() > 25 {
                break;
            }
            consumer = db.consume(&amqp, &queue, &args, &env);
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let state = format!(
        "{} exits ({:?}); queue {queue}: {} ready; dead-letter queue: {}; applied {:?}; last \
         log:\n{}",
        exits.len(),
        exits.first(),
        ready(&probe, &queue).await,
        ready(&probe, &dead_letter_queue).await,
        db.effects().await,
        consumer.log()
    );
    let _ = probe_connection.close(200, "OK".into()).await;
    assert!(exits.is_empty(), "the consumer stopped: {state}");
    let mut dead = Consumer::start(&amqp, &dead_letter_queue).await;
    let letters = dead.wait_for(2, MINUTE).await.to_vec();
    assert_eq!(letters.len(), 2, "{state}");
    let letter = letters
        .iter()
        .find(|l| l.message_id.as_deref() == Some(poison.as_str()))
        .unwrap_or_else(|| panic!("the poison message is not among {letters:?}"));
    assert_eq!(letter.body, br#"{"step": "x"}"#, "its body, intact");
    assert_eq!(letter.routing_key, "Test.poison", "its routing key");
    let reason = letter
        .header_str("x-inbox-dead-letter-reason")
        .unwrap_or("");
    assert!(reason.contains("SQLSTATE 22P02"), "{:?}", letter.headers);
    assert_eq!(letter.header_str("x-inbox-consumer"), Some(CONSUMER));
    assert_eq!(letter.header_str("x-inbox-queue"), Some(queue.as_str()));
    assert!(
        letters.iter().any(|l| l.message_id.is_none()),
        "the delivery without a message_id: {letters:?}"
    );
    consumer.stop().await;
    db.assert_applied_once(&good).await;
    assert_eq!(queue_message_count(&amqp, &queue).await, 0, "{queue}");
    let stopped = consumer.log_lines("consumer stopped");
    assert!(
        stopped
            .iter()
            .any(|l| l.contains("dead_lettered=1") && l.contains("rejected=1")),
        "{stopped:?}"
    );
}

/// A dead letter that its exchange routes to no queue (none bound yet) is not taken as
/// placed: the message stays unacknowledged, its lane waits (the message after it is not
/// applied meanwhile), and the consumer says what to do; once a queue is bound, the dead
/// letter lands there and the lane goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_its_exchange_cannot_route_waits_for_a_bound_queue() {
    let s = services();
    let amqp = s.rabbit.url();
    let name = unique_name("inbox_unbound");
    let (exchange, queue) = (format!("{name}_x"), format!("{name}_q"));
    let (dead_letters, dead_letter_queue) = (format!("{name}_dead"), format!("{name}_dead_q"));
    common::amqp::declare_bound_quorum_queue(&amqp, &exchange, &queue, "#").await;
    common::amqp::declare_exchange(&amqp, &dead_letters).await;
    let (poison, after) = (format!("{name}-poison"), format!("{name}-after"));
    let messages: [(&str, &[u8]); 2] = [(&poison, br#"{"step": "x"}"#), (&after, b"{}")];
    publish_confirmed(&amqp, &exchange, "Test.unbound", &messages).await;
    let db = ConsumerDb::new("inbox_unbound_consumer").await;
    let args = [
        "--effect-sql",
        STEP_EFFECT,
        "--concurrency",
        "1",
        "--batch-size",
        "1",
        "--max-backoff",
        "1s",
        "--dead-letter-exchange",
        &dead_letters,
    ];
    let consumer = db.consume(&amqp, &queue, &args, &[]);
    assert!(
        consumer
            .wait_for_log_count(log::DEAD_LETTER_WAITING, 2, MINUTE)
            .await,
        "log:\n{}",
        consumer.log()
    );
    let waiting = consumer.log_lines(log::DEAD_LETTER_WAITING);
    assert!(
        waiting.iter().all(|l| l.contains("bind a durable queue")),
        "{waiting:?}"
    );
    assert!(db.effects().await.is_empty(), "the lane went on");

    declare_bound_queue(&amqp, &dead_letters, &dead_letter_queue, "#").await;
    db.wait_applied(1, &consumer).await;
    let mut dead = Consumer::start(&amqp, &dead_letter_queue).await;
    let letters = dead.wait_for(1, MINUTE).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message_id.as_deref(), Some(poison.as_str()));
    consumer.stop().await;
    db.assert_applied_once(&[after]).await;
    assert_eq!(queue_message_count(&amqp, &queue).await, 0);
    let stopped = consumer.log_lines("consumer stopped");
    assert!(
        stopped.iter().any(|l| l.contains("dead_lettered=1")),
        "{stopped:?}"
    );
}
