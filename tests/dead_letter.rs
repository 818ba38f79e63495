//! The dead-letter policy (fault scenarios 13 and 19 of docs/reliability.md under
//! `--on-unroutable dead-letter`), against real PostgreSQL and RabbitMQ.
//!
//! Oracles come from outside the relay: the `test_decoding` slot (which transaction ends
//! where), the slot's `confirmed_flush_lsn`, the queues bound to the exchange and to the
//! dead-letter exchange, and the relay's own HTTP endpoints and `status` command for what it
//! reports.

use outbox_testkit as common;

use std::time::Duration;

use common::amqp::{bind_queue, exchange_exists, unbind_queue};
use common::faults::{
    assert_acknowledged, assert_not_acknowledged, assert_stuck_on_returned, ids_of, wait_for_ids,
    Oracle,
};
use common::http::{http_get, metric_value, readyz, wait_ready};
use common::outbox::Outbox;
use common::{declare_bound_queue, unique_name, Consumer, Received, RelayProcess};

const MINUTE: Duration = Duration::from_secs(60);
const DEAD_LETTERED: &str = "outbox_relay_messages_dead_lettered_total";

/// An outbox whose queue receives only `Good.#` and `Later.#`, provisioned by `setup` with
/// the dead-letter policy (no queue is bound to the dead-letter exchange yet).
struct DeadLetterOutbox {
    outbox: Outbox,
    dead_letter_exchange: String,
}

impl DeadLetterOutbox {
    async fn new(prefix: &str) -> DeadLetterOutbox {
        let outbox = Outbox::new(prefix).await;
        routed_only(&outbox).await;
        let dead_letter_exchange = format!("{}.dead-letter", outbox.exchange);
        let setup = outbox.run_command(&[
            "setup",
            "--on-unroutable",
            "dead-letter",
            "--dead-letter-exchange",
            &dead_letter_exchange,
        ]);
        let stdout = String::from_utf8_lossy(&setup.stdout).into_owned();
        assert!(
            setup.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&setup.stderr)
        );
        assert!(
            stdout.contains(&format!(
                "dead-letter exchange {dead_letter_exchange}: declared"
            )),
            "{stdout}"
        );
        assert!(
            exchange_exists(&outbox.amqp_url, &dead_letter_exchange).await,
            "setup declared the dead-letter exchange"
        );
        DeadLetterOutbox {
            outbox,
            dead_letter_exchange,
        }
    }

    /// Binds a fresh durable queue to the dead-letter exchange with `#`; returns its name.
    async fn bind_dead_letter_queue(&self) -> String {
        let queue = unique_name("dlq");
        declare_bound_queue(
            &self.outbox.amqp_url,
            &self.dead_letter_exchange,
            &queue,
            "#",
        )
        .await;
        queue
    }

    fn policy(&self) -> [&str; 4] {
        [
            "--on-unroutable",
            "dead-letter",
            "--dead-letter-exchange",
            &self.dead_letter_exchange,
        ]
    }
}

/// Rebinds the outbox's queue from `#` to `Good.#` and `Later.#` only: other event types are
/// unroutable.
async fn routed_only(outbox: &Outbox) {
    for key in ["Good.#", "Later.#"] {
        bind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, key).await;
    }
    unbind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
}

/// A relay with `extra` flags serving /metrics and /readyz on a port of its own.
fn spawn_observed(outbox: &Outbox, extra: &[&str]) -> (RelayProcess, u16) {
    outbox.spawn_observed(&[&["--max-backoff-secs", "1"], extra].concat())
}

async fn metric(port: u16, sample: &str) -> Option<f64> {
    metric_value(&common::http::metrics(port).await, sample)
}

fn dead_lettered(reason: &str) -> String {
    format!("{DEAD_LETTERED}{{reason=\"{reason}\"}}")
}

/// `letter` says it was dead-lettered because `exchange` had no route for `Nobody.listens`.
fn assert_unroutable_to_nobody(letter: &Received, exchange: &str) {
    let reason = format!("unroutable: NO_ROUTE 312 exchange={exchange} routing_key=Nobody.listens");
    assert_eq!(
        letter.header_str("x-outbox-dead-letter-reason"),
        Some(reason.as_str())
    );
}

/// The one delivery of `id` among `received`.
fn only<'a>(received: &'a [Received], id: &str) -> &'a Received {
    let found: Vec<&Received> = received
        .iter()
        .filter(|r| r.message_id.as_deref() == Some(id))
        .collect();
    assert_eq!(found.len(), 1, "{id} arrived once: {received:#?}");
    found[0]
}

/// Inserts one row of `event_type` with `payload` (JSON text); returns its id.
async fn insert(outbox: &Outbox, event_type: &str, payload: &str) -> String {
    outbox.insert(event_type, payload).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_event_type_goes_to_the_dead_letter_exchange_and_the_slot_moves_past_it() {
    let dl = DeadLetterOutbox::new("dl_unroutable").await;
    let outbox = &dl.outbox;
    let oracle = Oracle::create(outbox).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let dead_letter_queue = dl.bind_dead_letter_queue().await;
    let mut dead_letters = Consumer::start(&outbox.amqp_url, &dead_letter_queue).await;

    let good = insert(outbox, "Good.one", r#"{"n": 1}"#).await;
    // A payload marker that must never reach the log.
    let bad = insert(outbox, "Nobody.listens", r#"{"secret": "dl-payload-7f3a"}"#).await;
    // A transaction with the unroutable row between two routable ones.
    let txn: Vec<String> = {
        let rows = outbox
            .client
            .query(
                "INSERT INTO outbox (event_type, payload) VALUES \
                 ('Later.a', '{\"n\": 2}'), ('Nobody.listens', '{\"n\": 3}'), ('Later.b', '{\"n\": 4}') \
                 RETURNING id::text",
                &[],
            )
            .await
            .expect("insert a transaction");
        rows.iter().map(|r| r.get(0)).collect()
    };
    let later = insert(outbox, "Later.c", r#"{"n": 5}"#).await;

    let (relay, port) = spawn_observed(outbox, &dl.policy());
    let delivered = [good.clone(), txn[0].clone(), txn[2].clone(), later.clone()];
    assert!(
        wait_for_ids(&mut consumer, &delivered, MINUTE).await,
        "routable rows delivered; log:\n{}",
        relay.log()
    );
    let dead = [bad.clone(), txn[1].clone()];
    assert!(
        wait_for_ids(&mut dead_letters, &dead, MINUTE).await,
        "unroutable rows dead-lettered; log:\n{}",
        relay.log()
    );
    // The slot moves past the dead-lettered rows: the last transaction is acknowledged.
    assert_acknowledged(outbox, &oracle, &relay, &later, MINUTE).await;

    let received = dead_letters.received().to_vec();
    let letter = only(&received, &bad);
    assert_eq!(letter.exchange, dl.dead_letter_exchange);
    assert_eq!(letter.routing_key, "Nobody.listens");
    assert_eq!(letter.kind.as_deref(), Some("Nobody.listens"));
    assert_unroutable_to_nobody(letter, &outbox.exchange);
    assert_eq!(
        letter.header_str("x-outbox-original-exchange"),
        Some(outbox.exchange.as_str())
    );
    assert_eq!(
        letter.header_str("x-outbox-original-routing-key"),
        Some("Nobody.listens")
    );
    assert!(letter.header_str("x-outbox-lsn").is_some(), "{letter:?}");
    assert!(letter.header_str("x-outbox-seq").is_some(), "{letter:?}");
    assert_eq!(
        letter.body_json(),
        serde_json::json!({"secret": "dl-payload-7f3a"})
    );
    assert_eq!(letter.delivery_mode, Some(2));
    only(&received, &txn[1]);

    // In commit order on the main queue, and nothing dead-lettered arrived there.
    assert_eq!(
        ids_of(consumer.received()),
        delivered.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert_eq!(metric(port, &dead_lettered("unroutable")).await, Some(2.0));
    assert_eq!(metric(port, &dead_lettered("too_large")).await, Some(0.0));
    assert_eq!(
        http_get(port, "/readyz").await.map(|(status, _)| status),
        Some(200)
    );
    assert_eq!(relay.sessions(), 1, "no reconnect; log:\n{}", relay.log());
    let log = relay.log();
    let warned = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains("dead-lettered") && l.contains(&bad));
    let warned = warned.unwrap_or_else(|| panic!("a WARN line names {bad}; log:\n{log}"));
    assert!(warned.contains("unroutable"), "{warned}");
    assert!(!log.contains("dl-payload-7f3a"), "no payload in the log");
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_halt_an_unroutable_event_type_blocks_delivery_until_a_binding_exists() {
    let outbox = Outbox::new("dl_halt").await;
    routed_only(&outbox).await;
    let oracle = Oracle::create(&outbox).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let good = insert(&outbox, "Good.one", "{}").await;
    let stuck = insert(&outbox, "Nobody.listens", "{}").await;
    let later = insert(&outbox, "Later.one", "{}").await;

    let (relay, port) = spawn_observed(&outbox, &[]);
    // Returned, retried with a window of 1 and returned again: it does not move past it.
    assert_stuck_on_returned(&relay, port, &stuck).await;
    assert!(
        wait_for_ids(&mut consumer, std::slice::from_ref(&good), MINUTE).await,
        "the row before it is delivered"
    );
    assert!(
        metric(port, "outbox_relay_blocked_on_message_seconds")
            .await
            .is_some(),
        "blocked-on-message gauge exported"
    );
    let (_, metrics) = http_get(port, "/metrics").await.expect("/metrics answers");
    assert!(
        common::http::metric_sum(&metrics, "outbox_relay_messages_returned_total") >= Some(2.0),
        "{metrics}"
    );
    let addr = format!("127.0.0.1:{port}");
    let shown = outbox.run_command(&["status", "--metrics-addr", &addr]);
    let table = String::from_utf8_lossy(&shown.stdout);
    assert!(
        table.contains(&stuck),
        "status shows the stuck message: {table}{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    // Rows behind it may have reached the queue (they were in flight with it): what must not
    // happen is an acknowledgement past it.
    assert_not_acknowledged(&outbox, &oracle, &stuck, "the returned message").await;

    bind_queue(
        &outbox.amqp_url,
        &outbox.queue,
        &outbox.exchange,
        "Nobody.#",
    )
    .await;
    assert!(
        wait_for_ids(&mut consumer, &[stuck.clone(), later.clone()], MINUTE).await,
        "delivery resumes once bound; log:\n{}",
        relay.log()
    );
    assert_acknowledged(&outbox, &oracle, &relay, &later, MINUTE).await;
    assert!(wait_ready(port, MINUTE).await, "/readyz 200 once delivered");
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_large_and_unmappable_rows_go_to_the_dead_letter_exchange_before_publishing() {
    let dl = DeadLetterOutbox::new("dl_badrows").await;
    let outbox = &dl.outbox;
    outbox
        .client
        .batch_execute("ALTER TABLE outbox ALTER COLUMN event_type DROP NOT NULL")
        .await
        .expect("drop NOT NULL");
    let oracle = Oracle::create(outbox).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let dead_letter_queue = dl.bind_dead_letter_queue().await;
    let mut dead_letters = Consumer::start(&outbox.amqp_url, &dead_letter_queue).await;
    let good = insert(outbox, "Good.one", "{}").await;
    let (huge, size): (String, i32) = {
        let row = outbox
            .client
            .query_one(
                "INSERT INTO outbox (event_type, payload) \
                 VALUES ('Good.huge', jsonb_build_object('blob', repeat('x', 20 * 1024 * 1024))) \
                 RETURNING id::text, octet_length(payload::text)",
                &[],
            )
            .await
            .expect("insert 20 MB payload");
        (row.get(0), row.get(1))
    };
    let null_type: String = outbox
        .client
        .query_one(
            "INSERT INTO outbox (event_type, payload) VALUES (NULL, '{\"n\": 7}') RETURNING id::text",
            &[],
        )
        .await
        .expect("insert NULL event_type")
        .get(0);
    let later = insert(outbox, "Later.one", "{}").await;

    let mut flags = dl.policy().to_vec();
    flags.extend(["--max-message-size", "16777216"]);
    let (relay, port) = spawn_observed(outbox, &flags);
    assert!(
        wait_for_ids(&mut consumer, &[good.clone(), later.clone()], MINUTE).await,
        "the rows around them are delivered; log:\n{}",
        relay.log()
    );
    assert!(
        wait_for_ids(
            &mut dead_letters,
            &[huge.clone(), null_type.clone()],
            MINUTE
        )
        .await,
        "both bad rows dead-lettered; log:\n{}",
        relay.log()
    );
    // The slot moves past them.
    assert_acknowledged(outbox, &oracle, &relay, &later, MINUTE).await;

    let received = dead_letters.received().to_vec();
    let too_large = only(&received, &huge);
    assert!(too_large.body.is_empty(), "the body is dropped");
    // The mapper measures the body as it arrives: jsonb text, the size PostgreSQL reports.
    assert_eq!(
        too_large.header_u64("x-outbox-original-size"),
        Some(size as u64)
    );
    assert_eq!(
        too_large.header_str("x-outbox-dead-letter-reason"),
        Some(format!("too large: {size} bytes > limit 16777216").as_str())
    );
    assert_eq!(too_large.routing_key, "Good.huge");
    assert_eq!(
        too_large.header_str("x-outbox-original-exchange"),
        Some(outbox.exchange.as_str())
    );
    assert!(too_large.header_str("x-outbox-seq").is_some());

    let unmappable = only(&received, &null_type);
    assert_eq!(
        unmappable.header_str("x-outbox-dead-letter-reason"),
        Some("unmappable: column \"event_type\" is NULL")
    );
    assert_eq!(unmappable.body_json(), serde_json::json!({"n": 7}));
    assert_eq!(unmappable.kind, None);

    assert_eq!(
        ids_of(consumer.received()),
        [good.as_str(), later.as_str()],
        "neither bad row reached the exchange"
    );
    assert_eq!(metric(port, &dead_lettered("too_large")).await, Some(1.0));
    assert_eq!(metric(port, &dead_lettered("unmappable")).await, Some(1.0));
    assert!(
        !relay.log().contains("RabbitMQ error"),
        "the broker never saw the 20 MB body; log:\n{}",
        relay.log()
    );
    assert_eq!(relay.sessions(), 1, "no reconnect; log:\n{}", relay.log());
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_exchange_without_a_binding_halts_naming_it_until_one_exists() {
    let dl = DeadLetterOutbox::new("dl_unbound").await;
    let outbox = &dl.outbox;
    let oracle = Oracle::create(outbox).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let stuck = insert(outbox, "Nobody.listens", "{}").await;
    let later = insert(outbox, "Later.one", "{}").await;
    let (relay, port) = spawn_observed(outbox, &dl.policy());
    let named = format!("dead-letter exchange \"{}\"", dl.dead_letter_exchange);
    assert!(
        relay.wait_for_log_count(&named, 2, MINUTE).await,
        "the error names the dead-letter exchange, on every retry; log:\n{}",
        relay.log()
    );
    assert!(relay.log().contains(&stuck), "and the message");
    assert_eq!(readyz(port).await, (503, format!("stuck message {stuck}")));
    assert_eq!(metric(port, &dead_lettered("unroutable")).await, Some(0.0));
    let what = "a message the dead-letter exchange did not take:";
    assert_not_acknowledged(outbox, &oracle, &stuck, what).await;

    let dead_letter_queue = dl.bind_dead_letter_queue().await;
    let mut dead_letters = Consumer::start(&outbox.amqp_url, &dead_letter_queue).await;
    assert!(
        wait_for_ids(&mut dead_letters, std::slice::from_ref(&stuck), MINUTE).await,
        "dead-lettered once the dead-letter exchange has a binding; log:\n{}",
        relay.log()
    );
    assert!(wait_for_ids(&mut consumer, std::slice::from_ref(&later), MINUTE).await);
    assert_acknowledged(outbox, &oracle, &relay, &later, MINUTE).await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_dead_letters_a_returned_row_and_commits_the_batch_with_it() {
    let dl = DeadLetterOutbox::new("dl_poll").await;
    let outbox = &dl.outbox;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let dead_letter_queue = dl.bind_dead_letter_queue().await;
    let mut dead_letters = Consumer::start(&outbox.amqp_url, &dead_letter_queue).await;
    let good = insert(outbox, "Good.one", "{}").await;
    let bad = insert(outbox, "Nobody.listens", r#"{"n": 2}"#).await;
    let later = insert(outbox, "Later.one", "{}").await;

    let mut args: Vec<String> = vec!["poll".into()];
    args.extend(outbox.flags("poll"));
    args.extend(dl.policy().iter().map(|s| s.to_string()));
    args.extend(["--poll-interval".into(), "100ms".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let relay = RelayProcess::spawn(&args, &[("RUST_LOG", "info,outbox_relay=debug")]);

    assert!(
        wait_for_ids(&mut consumer, &[good.clone(), later.clone()], MINUTE).await,
        "log:\n{}",
        relay.log()
    );
    assert!(
        wait_for_ids(&mut dead_letters, std::slice::from_ref(&bad), MINUTE).await,
        "log:\n{}",
        relay.log()
    );
    let letter = only(dead_letters.received(), &bad);
    assert_unroutable_to_nobody(letter, &outbox.exchange);
    assert_eq!(letter.body_json(), serde_json::json!({"n": 2}));
    // The batch commits with the dead-lettered row marked published, like the others.
    let sql = "SELECT count(*) FROM outbox WHERE published_at IS NULL";
    let left = common::pg::wait_count(&outbox.client, sql, MINUTE, |n| n == 0).await;
    assert!(
        left.is_ok(),
        "{left:?} rows left unpublished; log:\n{}",
        relay.log()
    );
    assert!(
        !relay.log().contains("rolled back"),
        "no batch failed; log:\n{}",
        relay.log()
    );
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_policy_without_an_exchange_is_a_clear_config_error() {
    // Checked before connecting to anything: nothing listens at these addresses.
    let run = RelayProcess::spawn(
        &[
            "run",
            "--database-url",
            "postgres://relay@127.0.0.1:1/outbox",
            "--amqp-url",
            "amqp://127.0.0.1:1",
            "--metrics-addr",
            "off",
            "--on-unroutable",
            "dead-letter",
        ],
        &[],
    );
    let status = run.wait_exit(MINUTE).await.expect("exits");
    assert!(!status.success());
    let log = run.log();
    assert!(
        log.contains("--dead-letter-exchange") && log.contains("OUTBOX_DEAD_LETTER_EXCHANGE"),
        "names the missing flag and its variable: {log}"
    );
}

/// Inserts a row whose `exchange` column names `exchange`; returns its id.
async fn insert_to_exchange(outbox: &Outbox, exchange: &str) -> String {
    outbox
        .client
        .query_one(
            "INSERT INTO outbox (event_type, payload, exchange) VALUES ('Good.elsewhere', '{}', $1) \
             RETURNING id::text",
            &[&exchange],
        )
        .await
        .expect("insert a row naming another exchange")
        .get(0)
}

/// `--allowed-exchanges`: by default a row may name only the configured
/// exchange; another one stops the relay (halt) or is dead-lettered; listing it lets it through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_naming_an_exchange_not_allowed_halts_or_is_dead_lettered_unless_listed() {
    let dl = DeadLetterOutbox::new("dl_allowed").await;
    let outbox = &dl.outbox;
    let elsewhere = unique_name("elsewhere");
    let elsewhere_queue = unique_name("elsewhere_q");
    common::amqp::declare_exchange(&outbox.amqp_url, &elsewhere).await;
    declare_bound_queue(&outbox.amqp_url, &elsewhere, &elsewhere_queue, "#").await;
    let oracle = Oracle::create(outbox).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let mut diverted = Consumer::start(&outbox.amqp_url, &elsewhere_queue).await;
    let dead_letter_queue = dl.bind_dead_letter_queue().await;
    let mut dead_letters = Consumer::start(&outbox.amqp_url, &dead_letter_queue).await;

    // Halt (the default policy): stops at the row, naming it and the flag.
    let before = insert(outbox, "Good.before", "{}").await;
    let bad = insert_to_exchange(outbox, &elsewhere).await;
    let relay = outbox.spawn_relay(&["--max-backoff-secs", "1"]);
    let status = relay
        .wait_exit(MINUTE)
        .await
        .unwrap_or_else(|| panic!("the relay did not stop at row {bad}; log:\n{}", relay.log()));
    assert!(!status.success(), "exits non-zero; log:\n{}", relay.log());
    let log = relay.log();
    assert!(
        log.contains(&bad) && log.contains("--allowed-exchanges"),
        "the error names the row and the flag; log:\n{log}"
    );
    assert!(
        wait_for_ids(&mut consumer, std::slice::from_ref(&before), MINUTE).await,
        "the row before it is delivered; log:\n{log}"
    );
    assert_not_acknowledged(outbox, &oracle, &bad, "the row naming another exchange").await;

    // Dead-letter: the row goes to the dead-letter exchange with the reason; delivery moves on.
    let after = insert(outbox, "Good.after", "{}").await;
    let (relay, port) = spawn_observed(outbox, &dl.policy());
    assert!(
        wait_for_ids(&mut dead_letters, std::slice::from_ref(&bad), MINUTE).await,
        "dead-lettered; log:\n{}",
        relay.log()
    );
    assert!(
        wait_for_ids(&mut consumer, std::slice::from_ref(&after), MINUTE).await,
        "the row after it is delivered; log:\n{}",
        relay.log()
    );
    assert_acknowledged(outbox, &oracle, &relay, &after, MINUTE).await;
    let letter = only(dead_letters.received(), &bad);
    assert_eq!(
        letter.header_str("x-outbox-dead-letter-reason"),
        Some(format!("exchange not allowed: {elsewhere}").as_str())
    );
    assert_eq!(
        letter.header_str("x-outbox-original-exchange"),
        Some(elsewhere.as_str())
    );
    assert_eq!(
        metric(port, &dead_lettered("exchange_not_allowed")).await,
        Some(1.0)
    );
    relay.stop().await;

    // Listed: the row reaches the exchange it names.
    let listed = insert_to_exchange(outbox, &elsewhere).await;
    let relay = outbox.spawn_relay(&["--allowed-exchanges", &elsewhere]);
    assert!(
        wait_for_ids(&mut diverted, std::slice::from_ref(&listed), MINUTE).await,
        "a listed exchange receives the row; log:\n{}",
        relay.log()
    );
    assert_acknowledged(outbox, &oracle, &relay, &listed, MINUTE).await;
    assert_eq!(
        ids_of(diverted.received()),
        [listed.as_str()],
        "only the allowed row reached the other exchange"
    );
    relay.stop().await;
}

/// The confirm barrier's stress: at full speed, every unroutable row is dead-lettered and
/// every other row reaches its queue, once, with the slot past the last row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_speed_drain_with_one_percent_unroutable_dead_letters_exactly_those() {
    let dl = DeadLetterOutbox::new("dl_stress").await;
    let outbox = &dl.outbox;
    let oracle = Oracle::create(outbox).await;
    let rows = common::faults::stress_rows();
    let (good, unroutable) = common::faults::seed_one_percent_unroutable(outbox, rows).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let dead_letter_queue = dl.bind_dead_letter_queue().await;
    let mut dead_letters = Consumer::start(&outbox.amqp_url, &dead_letter_queue).await;

    let started = std::time::Instant::now();
    let (relay, port) = spawn_observed(outbox, &dl.policy());
    common::faults::assert_stress_dead_lettered(
        outbox,
        &oracle,
        &relay,
        (&mut consumer, &mut dead_letters),
        (&good, &unroutable),
    )
    .await;
    let drained = started.elapsed();
    assert_eq!(
        metric(port, &dead_lettered("unroutable")).await,
        Some(unroutable.len() as f64)
    );
    assert_eq!(relay.sessions(), 1, "no reconnect; log:\n{}", relay.log());
    common::faults::report(
        "returns stress, dead-letter",
        &[
            ("rows", rows.to_string()),
            ("unroutable", unroutable.len().to_string()),
            ("drained in", common::faults::secs(drained)),
            (
                "msgs/s",
                format!("{:.0}", rows as f64 / drained.as_secs_f64()),
            ),
        ],
    );
    relay.stop().await;
}

/// The same drain under `halt`: the relay stops at the first unroutable row in commit order,
/// whatever the broker batched, and the slot never passes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_speed_drain_with_one_percent_unroutable_halts_at_the_first_one() {
    let dl = DeadLetterOutbox::new("halt_stress").await;
    let outbox = &dl.outbox;
    let oracle = Oracle::create(outbox).await;
    let rows = common::faults::stress_rows();
    let (_, unroutable) = common::faults::seed_one_percent_unroutable(outbox, rows).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let (relay, port) = spawn_observed(outbox, &[]);
    common::faults::assert_stress_halted(
        outbox,
        &oracle,
        (&relay, port),
        &mut consumer,
        &unroutable,
        "returns stress, halt",
    )
    .await;
    relay.stop().await;
}
