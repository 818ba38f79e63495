//! Faults and bad inputs, against real PostgreSQL and RabbitMQ processes that this
//! binary owns. Each scenario injects one fault and checks the invariants with oracles from
//! outside the relay (`common::faults`):
//!
//! - **L0**: every id the `test_decoding` oracle saw committed arrives (lost = 0);
//! - **DUP**: duplicates counted and, where a bound is stated, within it (W = max in-flight,
//!   T = status interval, X = confirmed rows of the transaction open at the fault): relay
//!   crash ≤ W + rate×2T + X (docs/reliability.md); broker connection loss ≤ W + X; polling mode ≤ workers × batch
//!   per crash; a PostgreSQL crash has no tight bound and is reported;
//! - **ACK**: every row of each transaction at or below the slot's `confirmed_flush_lsn` is
//!   already in the queue.
//!
//! Scenarios that neither kill nor reconfigure a server share one private pair ([`shared`]);
//! the others start their own. Each prints a `FIGURES` line (lost, duplicates, recovery time)
//! collected in crates/outbox-bench/lab/scenarios.md. Scenarios 2, 5, 7 and 17 live in
//! `tests/wal.rs` and `tests/big_transaction.rs`.
//!
//! `OUTBOX_TEST_KILLS` sets scenario 1's kill count (default 3; the issue's run is 20).
//! Crash windows that timing cannot hit are opened with the relay's failpoints
//! (`OUTBOX_FAILPOINTS`, src/failpoint.rs): scenario 21 aborts a polling worker just before
//! its COMMIT.

use outbox_relay::metrics::{
    ACK_POINTS_QUEUED, BROKER_BLOCKED, CAUSE_LABEL, HEARTBEAT_LAG_SECONDS,
    MESSAGES_CONFIRMED_TOTAL, MESSAGES_IN_FLIGHT, MESSAGES_RETURNED_TOTAL, READY, RECONNECTS_TOTAL,
    SLOT_LAG_BYTES, STANDBY,
};
use outbox_testkit as common;

use std::collections::HashSet;
use std::time::Duration;

use common::amqp::{bind_queue, declare_exchange, delete_exchange, unbind_queue};
use common::faults::{
    assert_acknowledged, assert_not_acknowledged, assert_nothing_lost_or_invented, assert_returned,
    assert_stuck_on_returned, barrier, check_ack, connect_retrying, delivered_after, finish,
    ids_of, observed_outbox, probe, relay_crash_duplicate_bound, report, report_tally,
    scrape_slot_gauges, secs, settled, slot_state, unsent_ids, wait_for_ids, Oracle, Tally, Upto,
    Writers,
};
use common::http::{
    http_get, metric_sum, metric_value, readyz, wait_metrics, wait_ready, wait_readyz,
};
use common::outbox::{write_concurrently, Outbox};
use common::{
    current_wal_lsn, queue_message_count, Consumer, Direction, Mode, PgServer, RabbitServer,
    RelayProcess, Services, TcpProxy,
};
use tokio::time::Instant;

/// The relay's default window, passed explicitly where a bound depends on it.
const W: usize = 1024;
/// The relay's default status interval (`--status-interval`).
const T: Duration = Duration::from_millis(100);
/// Largest transaction the background writers commit: bounds X.
const MAX_TXN_ROWS: usize = 10;
/// Keeps reconnects quick where a server is down for a few seconds (the default is 30 s).
const FAST_BACKOFF: [&str; 2] = ["--max-backoff", "2s"];
const MINUTE: Duration = Duration::from_secs(60);
/// The session failures by cause: what the tests wait on instead of log lines (the
/// supervisor logs each before it counts it).
fn reconnects(cause: &str) -> String {
    common::http::series(RECONNECTS_TOTAL, &[(CAUSE_LABEL, cause)])
}
/// A relay that must notice a silent broker on its own: a 5 s heartbeat (lapin gives up after
/// two silent intervals, `BROKER_SILENCE_QUERY` on the AMQP URL) and a 5 s confirm timeout.
const BROKER_SILENCE_QUERY: &str = "?heartbeat=5";
const BROKER_SILENCE_FLAGS: [&str; 2] = ["--confirm-timeout", "5s"];
/// A relay that must notice a silent replication connection on its own: WAL heartbeats every
/// second, the stream declared dead after 3 silent intervals; quick reconnects.
const PG_SILENCE_FLAGS: [&str; 4] = [
    "--heartbeat-interval",
    "1s",
    FAST_BACKOFF[0],
    FAST_BACKOFF[1],
];

// ---------------------------------------------------------------------------------
// Servers

/// The private pair shared by the scenarios that do not kill or reconfigure a server.
async fn shared() -> &'static Services {
    tokio::task::spawn_blocking(common::private_services)
        .await
        .expect("starting the shared servers panicked")
}

/// An outbox on the shared pair.
async fn shared_outbox(prefix: &str) -> Outbox {
    let pair = shared().await;
    Outbox::on(&pair.pg.url("postgres"), &pair.rabbit.url(), prefix).await
}

/// [`observed_outbox`] on the shared pair.
async fn shared_observed(prefix: &str, keep_content: bool) -> (Outbox, Oracle, Consumer) {
    let pair = shared().await;
    observed_outbox(&pair.pg, &pair.rabbit, prefix, keep_content).await
}

/// [`shared_observed`] for an outbox table that `ddl` changed first: the oracle starts after
/// the change.
async fn shared_observed_after(prefix: &str, ddl: &str) -> (Outbox, Oracle, Consumer) {
    let outbox = shared_outbox(prefix).await;
    outbox.client.batch_execute(ddl).await.expect(ddl);
    let oracle = Oracle::create(&outbox).await;
    let consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    (outbox, oracle, consumer)
}

/// Commits `rows` rows from two writers and waits until every one has arrived.
async fn write_and_deliver(
    outbox: &Outbox,
    relay: &RelayProcess,
    consumer: &mut Consumer,
    rows: usize,
) -> Vec<String> {
    let ids = write_concurrently(&outbox.db_url, 2, rows, MAX_TXN_ROWS).await;
    assert!(
        wait_for_ids(consumer, &ids, MINUTE).await,
        "{rows} rows not delivered; log:\n{}",
        relay.log()
    );
    ids
}

/// Runs a blocking harness call (server start, kill, restart) without stalling the runtime.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    tokio::task::block_in_place(f)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn amqp_url_at(port: u16, query: &str) -> String {
    format!("amqp://guest:guest@127.0.0.1:{port}/%2f{query}")
}

/// The outbox's database URL with the port swapped (to go through a proxy).
fn db_url_at(outbox: &Outbox, port: u16) -> String {
    let db = outbox.db_url.rsplit('/').next().expect("database name");
    format!("postgres://postgres@127.0.0.1:{port}/{db}")
}

/// The id after `prefix` in the first log line that has it (e.g. "returned message ").
fn id_after(relay: &RelayProcess, prefix: &str) -> String {
    let log = relay.log();
    let start = log
        .find(prefix)
        .unwrap_or_else(|| panic!("no {prefix:?} in the log:\n{log}"))
        + prefix.len();
    log[start..]
        .split(|c: char| !(c.is_ascii_hexdigit() || c == '-'))
        .next()
        .expect("an id")
        .to_string()
}

/// Waits for the relay's next session beyond `before`: how long it took. Panics with the
/// log if none starts within `timeout`.
async fn new_session(relay: &RelayProcess, before: usize, timeout: Duration) -> Duration {
    let reconnected = relay.wait_new_session(before, timeout).await;
    reconnected.unwrap_or_else(|| panic!("no new session; log:\n{}", relay.log()))
}

/// Passes traffic through `proxy` again and waits for the relay's next session: how long it
/// took.
async fn heal(relay: &RelayProcess, proxy: &TcpProxy, timeout: Duration) -> Duration {
    let before = relay.sessions();
    proxy.set_modes(Mode::Pass);
    new_session(relay, before, timeout).await
}

/// A relay serving /readyz and /metrics on the returned port, streaming: a probe arrived and
/// /readyz answers 200.
async fn spawn_streaming_observed(
    outbox: &Outbox,
    consumer: &mut Consumer,
    flags: &[&str],
) -> (RelayProcess, u16) {
    let (relay, port) = outbox.spawn_observed(flags);
    delivered_after(&relay, &outbox.client, consumer, MINUTE, "starting").await;
    assert!(
        wait_ready(port, MINUTE).await,
        "/readyz answers 200 while streaming: {:?}",
        readyz(port).await
    );
    (relay, port)
}

/// A relay whose replication connection goes through `proxy` and notices silence on it.
fn spawn_relay_via_pg_proxy(outbox: &Outbox, proxy: &TcpProxy) -> RelayProcess {
    let db_url = db_url_at(outbox, proxy.port());
    outbox.spawn_relay_via(&db_url, &outbox.amqp_url, &PG_SILENCE_FLAGS)
}

/// Raises RabbitMQ's memory alarm (a watermark no node stays under) or clears it (back to
/// the default 0.4).
fn memory_alarm(rabbit: &RabbitServer, raised: bool) {
    blocking(|| rabbit.set_memory_alarm(raised));
}

/// Waits for the relay to log its first failed session; `unnoticed` says what it missed if
/// none comes within a minute.
async fn assert_session_fails(relay: &RelayProcess, unnoticed: &str) {
    assert!(
        relay.wait_reconnects(1, MINUTE).await,
        "{unnoticed}; log:\n{}",
        relay.log()
    );
}

/// ACK at this moment, and nothing acknowledged as far as the transaction of row `id` (`what`
/// says which row that is): the relay holds the slot before it.
async fn assert_acknowledged_only_before(
    outbox: &Outbox,
    oracle: &Oracle,
    consumer: &mut Consumer,
    id: &str,
    what: &str,
) {
    let txn = oracle.transaction_of(&outbox.client, id).await;
    let ack = check_ack(&outbox.client, outbox, oracle, consumer).await;
    assert!(
        ack.confirmed < txn.end_lsn,
        "acknowledged {} past {what} {id} (its transaction ends at {})",
        common::format_lsn(ack.confirmed),
        common::format_lsn(txn.end_lsn)
    );
}

/// Waits until `/readyz` on `port` answers `wanted`; panics with the relay's log otherwise.
async fn assert_readyz_becomes(port: u16, relay: &RelayProcess, wanted: (u16, &str)) {
    let answer = wait_readyz(port, MINUTE, wanted).await;
    assert_eq!(
        answer,
        Some((wanted.0, wanted.1.to_string())),
        "log:\n{}",
        relay.log()
    );
}

// ---------------------------------------------------------------------------------
// 1. Relay crash, repeatedly

/// Rows committed before each of s01's restarts, for the relay to lag behind.
const KILL_BACKLOG: usize = 5_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_kill_9_repeatedly_while_it_lags_with_writers_active() {
    let kills = env_usize("OUTBOX_TEST_KILLS", 3);
    let (outbox, oracle, mut consumer) = shared_observed("kills", false).await;
    let writers = Writers::start(&outbox.db_url, 2, MAX_TXN_ROWS, Duration::from_millis(2));
    let window = W.to_string();
    let flags = ["--max-in-flight", window.as_str()];

    let mut bound = 0;
    let mut first_delivery = Vec::new();
    let mut peak_rate: f64 = 0.0;
    let mut backlog_rows = 0;
    for kill in 0..kills {
        // A backlog committed while no relay runs: the restarted relay drains it at full
        // speed with its window full, and the kill lands in the middle of it.
        backlog_rows += write_concurrently(&outbox.db_url, 4, KILL_BACKLOG, MAX_TXN_ROWS)
            .await
            .len();
        let relay = outbox.spawn_relay(&flags);
        let started = Instant::now();
        let before = consumer.received().len();
        let n = consumer.wait_for(before + 1, MINUTE).await.len();
        assert!(
            n > before,
            "kill {kill}: nothing delivered; log:\n{}",
            relay.log()
        );
        first_delivery.push(started.elapsed());
        // The rate just before the kill, over the next 300 deliveries: it lags (catching up
        // on the replay and on what the writers committed while it was down).
        let t1 = Instant::now();
        let n1 = consumer.received().len();
        let n2 = consumer.wait_for(n1 + 300, MINUTE).await.len();
        assert!(
            n2 >= n1 + 300,
            "kill {kill}: delivery stalled; log:\n{}",
            relay.log()
        );
        let rate = (n2 - n1) as f64 / t1.elapsed().as_secs_f64();
        peak_rate = peak_rate.max(rate);
        let delivered: HashSet<&str> = ids_of(consumer.received()).into_iter().collect();
        let committed = backlog_rows + writers.committed();
        assert!(
            delivered.len() < committed,
            "kill {kill} must land while the relay lags: {} of {committed} rows delivered",
            delivered.len()
        );
        relay.kill9();
        bound += relay_crash_duplicate_bound(W, rate, T, MAX_TXN_ROWS);
        // ACK with the relay dead: nothing acknowledged that the broker does not hold.
        check_ack(&outbox.client, &outbox, &oracle, &mut consumer).await;
    }

    let relay = outbox.spawn_relay(&flags);
    writers.stop().await;
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    let duplicates = tally.duplicates();
    let mean_first: Duration = first_delivery.iter().sum::<Duration>() / kills.max(1) as u32;
    report(
        "s01 relay kill -9",
        &[
            ("kills", kills.to_string()),
            ("rows", committed.len().to_string()),
            ("lost", "0".into()),
            ("duplicates", duplicates.to_string()),
            ("bound", bound.to_string()),
            (
                "per kill",
                format!("{:.0}", duplicates as f64 / kills.max(1) as f64),
            ),
            ("peak rate", format!("{peak_rate:.0} msg/s")),
            ("mean restart to first delivery", secs(mean_first)),
        ],
    );
    assert!(
        duplicates <= bound,
        "DUP: {duplicates} duplicates over {kills} kills, bound Σ(W + rate×2T + X) = {bound}"
    );
}

// ---------------------------------------------------------------------------------
// 3. A keepalive asking for a reply while confirms lag

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_reply_while_confirms_lag_acknowledges_only_the_safe_lsn() {
    let pair = shared().await;
    let pg = blocking(|| PgServer::start(&[("wal_sender_timeout", "2s")]));
    let (outbox, oracle, mut consumer) =
        observed_outbox(&pg, &pair.rabbit, "keepalive", false).await;
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", pair.rabbit.amqp_port()));
    let relay = outbox.spawn_relay_via(&outbox.db_url, &amqp_url_at(proxy.port(), ""), &[]);
    delivered_after(&relay, &outbox.client, &mut consumer, MINUTE, "starting").await;

    // Publishes now reach the broker 3 s late, so confirms lag past wal_sender_timeout / 2:
    // the walsender asks for a reply while the burst below is unconfirmed.
    proxy.set_mode(
        Direction::ClientToServer,
        Mode::Delay(Duration::from_secs(3)),
    );
    let burst = write_concurrently(&outbox.db_url, 2, 400, MAX_TXN_ROWS).await;
    let burst_end = current_wal_lsn(&outbox.client).await;
    let replied_before = reply_time(&outbox.client, &outbox.slot).await;
    let mut replies_while_unconfirmed = 0;
    let mut samples = 0;
    let deadline = Instant::now() + MINUTE;
    loop {
        // ACK at this instant (panics on a violation), while the burst is in flight.
        let ack = check_ack(&outbox.client, &outbox, &oracle, &mut consumer).await;
        samples += 1;
        let replied = reply_time(&outbox.client, &outbox.slot).await;
        if ack.confirmed < burst_end && replied > replied_before {
            replies_while_unconfirmed += 1;
        }
        if wait_for_ids(&mut consumer, &burst, Duration::from_millis(300)).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "burst not delivered; log:\n{}",
            relay.log()
        );
    }
    proxy.set_mode(Direction::ClientToServer, Mode::Pass);
    assert!(
        replies_while_unconfirmed > 0,
        "PostgreSQL never got a status reply while the burst was unconfirmed ({samples} samples)"
    );
    assert_eq!(
        relay.reconnects(),
        0,
        "the walsender kept the session (replies sent in time); log:\n{}",
        relay.log()
    );
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    report_tally(
        "s03 keepalive while confirms lag",
        &committed,
        &tally,
        &[
            ("ACK samples", samples.to_string()),
            (
                "replies while unconfirmed",
                replies_while_unconfirmed.to_string(),
            ),
        ],
    );
    assert_eq!(tally.duplicates(), 0, "no fault, no duplicate");
}

/// When the slot's walsender last heard a status update from the relay (seconds).
async fn reply_time(client: &tokio_postgres::Client, slot: &str) -> Option<f64> {
    client
        .query_opt(
            "SELECT extract(epoch FROM r.reply_time)::float8 FROM pg_stat_replication r \
             JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1",
            &[&slot],
        )
        .await
        .expect("pg_stat_replication")
        .map(|row| row.get::<_, f64>(0))
}

// ---------------------------------------------------------------------------------
// 4. Idle outbox, busy database

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_outbox_releases_wal_that_other_tables_write_after_a_checkpoint() {
    let outbox = shared_outbox("idle").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let relay = outbox.spawn_relay(&[]);
    delivered_after(&relay, &outbox.client, &mut consumer, MINUTE, "starting").await;
    let (restart_before, _, _) = slot_state(&outbox.client, &outbox.slot)
        .await
        .expect("slot");

    outbox
        .client
        .batch_execute(
            "CREATE TABLE other (id serial PRIMARY KEY, v text);
             INSERT INTO other (v) SELECT repeat('x', 100) FROM generate_series(1, 20000);",
        )
        .await
        .expect("writes to another table");
    let after_writes = current_wal_lsn(&outbox.client).await;
    let started = Instant::now();
    let mut checkpoints = 0;
    let restart_after = loop {
        outbox
            .client
            .batch_execute("CHECKPOINT")
            .await
            .expect("CHECKPOINT");
        checkpoints += 1;
        let poll_until = Instant::now() + Duration::from_secs(2);
        let mut restart = None;
        while Instant::now() < poll_until {
            let (r, _, _) = slot_state(&outbox.client, &outbox.slot)
                .await
                .expect("slot");
            if r.is_some_and(|r| r > after_writes) {
                restart = r;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some(r) = restart {
            break r;
        }
        assert!(
            started.elapsed() < MINUTE,
            "restart_lsn {:?} never passed {} (writes to another table); log:\n{}",
            slot_state(&outbox.client, &outbox.slot).await,
            common::format_lsn(after_writes),
            relay.log()
        );
    };
    report(
        "s04 idle outbox",
        &[
            (
                "restart_lsn before",
                common::format_lsn(restart_before.unwrap_or(0)),
            ),
            ("after other writes", common::format_lsn(after_writes)),
            ("restart_lsn after", common::format_lsn(restart_after)),
            ("checkpoints", checkpoints.to_string()),
            ("time", secs(started.elapsed())),
        ],
    );
    assert!(
        consumer.received().len() == 1,
        "only the probe was published: {:?}",
        ids_of(consumer.received())
    );
}

// ---------------------------------------------------------------------------------
// 6. Multi-row INSERT and COPY

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_row_insert_and_copy_deliver_every_row_once_with_distinct_ids() {
    use futures_util::SinkExt;
    let (outbox, oracle, mut consumer) = shared_observed("copy", true).await;
    let relay = outbox.spawn_relay(&[]);

    // Separate calls: one simple-query string with several statements is one transaction.
    outbox
        .client
        .batch_execute(
            "INSERT INTO outbox (event_type, payload)
             SELECT 'Multi', jsonb_build_object('n', g) FROM generate_series(1, 1000) g",
        )
        .await
        .expect("INSERT … SELECT");
    outbox
        .client
        .batch_execute(
            "INSERT INTO outbox (event_type, payload) VALUES
             ('Values', '{\"n\": 1}'), ('Values', '{\"n\": 2}'), ('Values', '{\"n\": 3}')",
        )
        .await
        .expect("INSERT … VALUES");
    let mut text = String::new();
    for n in 1..=1000 {
        text += &format!("Copied\t{{\"n\": {n}}}\n");
    }
    let sink = outbox
        .client
        .copy_in::<_, bytes::Bytes>("COPY outbox (event_type, payload) FROM STDIN")
        .await
        .expect("COPY FROM STDIN");
    let mut sink = std::pin::pin!(sink);
    sink.send(bytes::Bytes::from(text))
        .await
        .expect("COPY data");
    let copied = sink.as_mut().finish().await.expect("COPY finish");
    assert_eq!(copied, 1000);

    let txns = oracle.transactions(&outbox.client).await;
    assert_eq!(
        txns.len(),
        3,
        "three transactions: INSERT … SELECT, INSERT … VALUES, COPY"
    );
    let expected: Vec<String> = txns
        .iter()
        .flat_map(|t| t.inserted_ids(common::faults::OUTBOX_TABLE))
        .collect();
    assert_eq!(expected.len(), 2003);
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    let received: Vec<&str> = ids_of(consumer.received());
    assert_eq!(tally.duplicates(), 0, "no fault, every row once");
    assert_eq!(received, expected, "commit order, rows in insert order");
    let distinct: std::collections::HashSet<&str> = received.iter().copied().collect();
    assert_eq!(distinct.len(), committed.len(), "distinct message ids");
    let kinds: Vec<&str> = consumer
        .received()
        .iter()
        .filter_map(|r| r.kind.as_deref())
        .collect();
    assert_eq!(kinds.iter().filter(|k| **k == "Copied").count(), 1000);
    report_tally("s06 multi-row INSERT and COPY", &committed, &tally, &[]);
}

// ---------------------------------------------------------------------------------
// 8. PostgreSQL crash

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_immediate_stop_and_start_mid_stream_loses_nothing() {
    let pair = shared().await;
    let pg = blocking(|| PgServer::start(&[]));
    let (outbox, oracle, mut consumer) = observed_outbox(&pg, &pair.rabbit, "pgcrash", false).await;
    let relay = outbox.spawn_relay(&FAST_BACKOFF);
    let writers = Writers::start(&outbox.db_url, 2, MAX_TXN_ROWS, Duration::from_millis(2));
    consumer.wait_for(1000, MINUTE).await;
    assert!(consumer.received().len() >= 1000, "log:\n{}", relay.log());
    let delivered_before = consumer.received().len();

    blocking(|| pg.stop_immediate());
    assert_session_fails(&relay, "the relay did not notice the crash").await;
    let before = relay.sessions();
    blocking(|| pg.start_again());
    let client = connect_retrying(&outbox.db_url, MINUTE).await;
    let reconnected = new_session(&relay, before, MINUTE).await;
    let probe_latency = delivered_after(
        &relay,
        &client,
        &mut consumer,
        Duration::from_secs(120),
        "restart",
    )
    .await;
    let committed_now = writers.committed();
    assert!(
        writers.wait_committed(committed_now + 500, MINUTE).await,
        "writers resumed"
    );
    writers.stop().await;

    let (committed, tally) = finish(&client, &outbox, &oracle, &mut consumer, &relay).await;
    report_tally(
        "s08 postgres crash",
        &committed,
        &tally,
        &[
            ("delivered before the crash", delivered_before.to_string()),
            ("restart to new session", secs(reconnected)),
            ("restart to probe delivered", secs(probe_latency)),
            ("failed sessions", relay.reconnects().to_string()),
        ],
    );
}

// ---------------------------------------------------------------------------------
// 9. RabbitMQ crash

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_kill_9_with_confirms_in_flight_duplicates_within_w_plus_x() {
    let pair = shared().await;
    let rabbit = blocking(RabbitServer::start);
    let outbox = Outbox::on(&pair.pg.url("postgres"), &rabbit.url(), "rabbitcrash").await;
    let oracle = Oracle::create(&outbox).await;
    // A backlog so the relay is mid-stream with a full window at the kill, writers on top.
    write_concurrently(&outbox.db_url, 4, 10_000, MAX_TXN_ROWS).await;
    let writers = Writers::start(&outbox.db_url, 2, MAX_TXN_ROWS, Duration::from_millis(20));
    let window = W.to_string();
    let relay = outbox.spawn_relay(&["--max-in-flight", &window, FAST_BACKOFF[0], FAST_BACKOFF[1]]);
    // No consumer until the broker is back: the durable queue keeps what was confirmed.
    let deadline = Instant::now() + MINUTE;
    loop {
        let depth = queue_message_count(&outbox.amqp_url, &outbox.queue).await;
        if depth >= 2000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "relay too slow: {depth} queued; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let killed = blocking(|| rabbit.kill9());
    assert_session_fails(&relay, "the relay did not notice the broker's death").await;
    let before = relay.sessions();
    let restarting = Instant::now();
    blocking(|| rabbit.restart());
    let boot = restarting.elapsed();
    assert!(
        relay.wait_new_session(before, MINUTE).await.is_some(),
        "no new session; log:\n{}",
        relay.log()
    );
    let reconnected = restarting.elapsed();
    let outage = killed.elapsed();
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let probe_latency = delivered_after(
        &relay,
        &outbox.client,
        &mut consumer,
        Duration::from_secs(120),
        "restart",
    )
    .await;
    writers.stop().await;

    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    let bound = W + MAX_TXN_ROWS;
    report_tally(
        "s09 rabbitmq kill -9",
        &committed,
        &tally,
        &[
            ("bound W+X", bound.to_string()),
            ("failed sessions", relay.reconnects().to_string()),
            ("node boot", secs(boot)),
            ("restart begun to new session", secs(reconnected)),
            ("kill to new session", secs(outage)),
            (
                "probe delivered after (behind the backlog)",
                secs(probe_latency),
            ),
        ],
    );
    // Only the kill loses a connection with publishes in flight; the attempts while the broker
    // was down published nothing.
    assert!(
        tally.duplicates() <= bound,
        "DUP: {} duplicates, bound W + X = {bound}",
        tally.duplicates()
    );
}

// ---------------------------------------------------------------------------------
// 10. Broker connection cut

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_connection_reset_is_detected_and_nothing_is_lost() {
    broker_connection_cut_is_detected_and_nothing_is_lost(Cut::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_connection_black_hole_longer_than_the_heartbeat_is_detected() {
    broker_connection_cut_is_detected_and_nothing_is_lost(Cut::BlackHole).await;
}

/// How scenario 10 cuts the relay's live broker connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// An RST on both sides: the relay hears of it at once.
    Reset,
    /// Silence longer than the heartbeat: the relay must notice on its own.
    BlackHole,
}

/// Scenarios 10a and 10b: the broker connection is cut mid-stream with writers active; the
/// relay notices, reconnects, loses nothing and duplicates at most W + X.
async fn broker_connection_cut_is_detected_and_nothing_is_lost(cut: Cut) {
    let pair = shared().await;
    let prefix = match cut {
        Cut::Reset => "amqpreset",
        Cut::BlackHole => "amqphole",
    };
    let (outbox, oracle, mut consumer) =
        observed_outbox(&pair.pg, &pair.rabbit, prefix, false).await;
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", pair.rabbit.amqp_port()));
    let window = W.to_string();
    let mut flags = vec!["--max-in-flight", &window, FAST_BACKOFF[0], FAST_BACKOFF[1]];
    let (query, writer_pause) = match cut {
        Cut::Reset => ("", 2),
        Cut::BlackHole => {
            flags.extend(BROKER_SILENCE_FLAGS);
            (BROKER_SILENCE_QUERY, 5)
        }
    };
    let amqp_url = amqp_url_at(proxy.port(), query);
    let relay = outbox.spawn_relay_via(&outbox.db_url, &amqp_url, &flags);
    let pause = Duration::from_millis(writer_pause);
    let writers = Writers::start(&outbox.db_url, 2, MAX_TXN_ROWS, pause);
    consumer.wait_for(500, MINUTE).await;
    assert!(consumer.received().len() >= 500, "log:\n{}", relay.log());

    let sessions_before_cut = relay.sessions();
    let started = Instant::now();
    let unnoticed = match cut {
        Cut::Reset => {
            proxy.reset_all();
            "reset not noticed"
        }
        Cut::BlackHole => {
            proxy.set_modes(Mode::BlackHole);
            "a silent black hole was not noticed within 60 s"
        }
    };
    assert_session_fails(&relay, unnoticed).await;
    let detected = started.elapsed();
    let cause = relay.log_lines("session failed").remove(0);
    let (healed, reconnected, probed) = match cut {
        Cut::Reset => {
            let reconnected = new_session(&relay, sessions_before_cut, MINUTE).await;
            ("reset to new session", reconnected + detected, "the reset")
        }
        Cut::BlackHole => {
            // Heal at once, before the next attempt (after a backoff of at least 0.4 s): a
            // handshake into the hole is s10c's scenario.
            let reconnected = heal(&relay, &proxy, Duration::from_secs(120)).await;
            ("healed to new session", reconnected, "healing")
        }
    };
    let client = &outbox.client;
    let probe_latency = delivered_after(&relay, client, &mut consumer, MINUTE, probed).await;
    writers.stop().await;
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    let bound = W + MAX_TXN_ROWS;
    let scenario = match cut {
        Cut::Reset => "s10a broker connection reset",
        Cut::BlackHole => "s10b broker black hole",
    };
    report_tally(
        scenario,
        &committed,
        &tally,
        &[
            ("bound W+X", bound.to_string()),
            ("detected after", secs(detected)),
            (healed, secs(reconnected)),
            ("probe delivered after", secs(probe_latency)),
        ],
    );
    if cut == Cut::BlackHole {
        println!("s10b detection: {cause}");
    }
    assert!(
        tally.duplicates() <= bound,
        "DUP: {} > {bound}",
        tally.duplicates()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_connect_into_a_black_hole_is_abandoned_and_retried() {
    connect_into_a_black_hole_is_abandoned_and_retried(Hole::Broker).await;
}

// ---------------------------------------------------------------------------------
// 11. Replication connection black hole

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_connection_black_hole_is_noticed_and_nothing_is_lost() {
    let pair = shared().await;
    let pg = blocking(|| PgServer::start(&[("wal_sender_timeout", "2s")]));
    let (outbox, oracle, mut consumer) = observed_outbox(&pg, &pair.rabbit, "pghole", false).await;
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", pg.port()));
    let relay = spawn_relay_via_pg_proxy(&outbox, &proxy);
    let writers = Writers::start(&outbox.db_url, 2, MAX_TXN_ROWS, Duration::from_millis(20));
    consumer.wait_for(300, MINUTE).await;
    assert!(consumer.received().len() >= 300, "log:\n{}", relay.log());
    let (_, _, walsender) = slot_state(&outbox.client, &outbox.slot)
        .await
        .expect("slot");
    assert!(walsender.is_some(), "the relay holds the slot");

    proxy.set_modes(Mode::BlackHole);
    let cut = Instant::now();
    // PostgreSQL's side gives up after wal_sender_timeout...
    let deadline = Instant::now() + MINUTE;
    loop {
        let (_, _, active) = slot_state(&outbox.client, &outbox.slot)
            .await
            .expect("slot");
        if active != walsender {
            break;
        }
        assert!(Instant::now() < deadline, "the walsender never timed out");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let server_gave_up = cut.elapsed();
    // ...and the relay must notice on its own: nothing arrives on that connection any more.
    let noticed = relay.wait_reconnects(1, Duration::from_secs(30)).await;
    let detected = cut.elapsed();
    assert!(
        noticed,
        "the relay did not notice a silent replication connection within 30 s \
         (wal_sender_timeout 2 s; PostgreSQL gave up after {}); log:\n{}",
        secs(server_gave_up),
        relay.log()
    );
    // Heal at once, before the next attempt: a connection into the hole is s11b's scenario.
    let reconnected = heal(&relay, &proxy, Duration::from_secs(120)).await;
    let probe_latency =
        delivered_after(&relay, &outbox.client, &mut consumer, MINUTE, "healing").await;
    writers.stop().await;
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    report_tally(
        "s11 replication black hole",
        &committed,
        &tally,
        &[
            ("server gave up after", secs(server_gave_up)),
            ("relay noticed after", secs(detected)),
            ("healed to new session", secs(reconnected)),
            ("probe delivered after", secs(probe_latency)),
        ],
    );
    println!(
        "s11 detection: {}",
        relay.log_lines("session failed").remove(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connect_into_a_black_hole_is_abandoned_and_retried() {
    connect_into_a_black_hole_is_abandoned_and_retried(Hole::Postgres).await;
}

/// The replication connection reset while the broker blocks the relay and its window is
/// full: the replication client still buffers events it read before the reset, which could
/// be published but never acknowledged. The session ends at once, while the broker still
/// blocks it (before, it ended only once the alarm cleared and it had published up to 256
/// buffered events: more duplicates of the replay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_reset_while_blocked_ends_the_session_before_publishing_what_it_buffered() {
    let rabbit = std::thread::spawn(RabbitServer::start);
    let pg = blocking(|| PgServer::start(&[]));
    let rabbit = blocking(|| rabbit.join()).expect("rabbitmq start");
    let (outbox, oracle, mut consumer) = observed_outbox(&pg, &rabbit, "pgreset", false).await;
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", pg.port()));
    let relay = spawn_relay_via_pg_proxy(&outbox, &proxy);
    outbox.insert("Before", "{}").await;
    consumer.wait_for(1, MINUTE).await;
    assert_eq!(consumer.received().len(), 1, "log:\n{}", relay.log());

    memory_alarm(&rabbit, true);
    write_concurrently(&outbox.db_url, 2, 3 * W, MAX_TXN_ROWS).await;
    assert!(
        relay
            .wait_metric(MESSAGES_IN_FLIGHT, MINUTE, |v| v == W)
            .await,
        "the window never filled; log:\n{}",
        relay.log()
    );
    proxy.reset_all();
    let noticed = relay.wait_reconnects(1, MINUTE).await;
    let reconnects_while_blocked = relay.reconnects();
    memory_alarm(&rabbit, false);
    assert!(
        noticed && reconnects_while_blocked >= 1,
        "the session outlived its replication connection while the broker blocked it; log:\n{}",
        relay.log()
    );
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    report_tally(
        "s11c replication reset while blocked",
        &committed,
        &tally,
        &[("reconnects", relay.reconnects().to_string())],
    );
    assert!(
        tally.duplicates() <= W + MAX_TXN_ROWS,
        "{} duplicates, over W + X",
        tally.duplicates()
    );
}

/// The server whose connection a scenario sends into a black hole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hole {
    Broker,
    Postgres,
}

/// Scenarios 10c and 11b: the relay's first connection to one server goes into a black hole
/// (the handshake is never answered); the relay must give up on it and try again, and
/// deliver once the path heals.
async fn connect_into_a_black_hole_is_abandoned_and_retried(hole: Hole) {
    let pair = shared().await;
    let prefix = match hole {
        Hole::Broker => "amqpconnect",
        Hole::Postgres => "pgconnect",
    };
    let outbox = Outbox::on(&pair.pg.url("postgres"), &pair.rabbit.url(), prefix).await;
    let target = match hole {
        Hole::Broker => pair.rabbit.amqp_port(),
        Hole::Postgres => pair.pg.port(),
    };
    let proxy = TcpProxy::start(&format!("127.0.0.1:{target}"));
    proxy.set_modes(Mode::BlackHole);
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let relay = match hole {
        Hole::Broker => outbox.spawn_relay_via(
            &outbox.db_url,
            &amqp_url_at(proxy.port(), BROKER_SILENCE_QUERY),
            &[&BROKER_SILENCE_FLAGS[..], &FAST_BACKOFF[..]].concat(),
        ),
        Hole::Postgres => spawn_relay_via_pg_proxy(&outbox, &proxy),
    };
    let (server, scenario) = match hole {
        Hole::Broker => ("broker", "s10c broker connect into a black hole"),
        Hole::Postgres => ("PostgreSQL", "s11b postgres connect into a black hole"),
    };
    // The handshake goes into the hole: the relay must give up on it and try again.
    let started = Instant::now();
    let unnoticed = format!(
        "the relay still waits on its first {server} connection after 60 s (no connect timeout)"
    );
    assert_session_fails(&relay, &unnoticed).await;
    let retried = started.elapsed();
    let reconnected = heal(&relay, &proxy, MINUTE).await;
    delivered_after(&relay, &outbox.client, &mut consumer, MINUTE, "healing").await;
    report(
        scenario,
        &[
            ("attempt abandoned after", secs(retried)),
            ("healed to session", secs(reconnected)),
        ],
    );
}

// ---------------------------------------------------------------------------------
// 12. Broker memory alarm

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_memory_alarm_pauses_publishing_without_a_reconnect_loop() {
    let rabbit = std::thread::spawn(RabbitServer::start);
    let pg = blocking(|| PgServer::start(&[("wal_sender_timeout", "2s")]));
    let rabbit = blocking(|| rabbit.join()).expect("rabbitmq start");
    let (outbox, oracle, mut consumer) = observed_outbox(&pg, &rabbit, "alarm", false).await;
    // A confirm timeout shorter than the alarm: waiting while blocked must not count.
    let relay = outbox.spawn_relay(&["--confirm-timeout", "3s"]);
    let writers = Writers::start(&outbox.db_url, 2, MAX_TXN_ROWS, Duration::from_millis(20));
    consumer.wait_for(300, MINUTE).await;
    assert!(consumer.received().len() >= 300, "log:\n{}", relay.log());
    let (_, _, walsender) = slot_state(&outbox.client, &outbox.slot)
        .await
        .expect("slot");

    memory_alarm(&rabbit, true);
    assert!(
        relay.wait_metric(BROKER_BLOCKED, MINUTE, |v| v == 1).await,
        "the relay reports the block; log:\n{}",
        relay.log()
    );
    let blocked_at = Instant::now();
    let delivered_at_block = consumer.received().len();
    // The alarm lasts longer than wal_sender_timeout (2 s) and the confirm timeout (3 s).
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (_, _, walsender_during) = slot_state(&outbox.client, &outbox.slot)
        .await
        .expect("slot");
    let failures_during = relay.reconnects();
    let delivered_during = consumer.received().len() - delivered_at_block;
    memory_alarm(&rabbit, false);
    let blocked_for = blocked_at.elapsed();
    assert_eq!(
        failures_during,
        0,
        "no reconnect while blocked; log:\n{}",
        relay.log()
    );
    assert_eq!(
        walsender_during, walsender,
        "the replication connection survived the alarm"
    );
    assert!(
        relay.wait_metric(BROKER_BLOCKED, MINUTE, |v| v == 0).await,
        "log:\n{}",
        relay.log()
    );
    let recovery =
        delivered_after(&relay, &outbox.client, &mut consumer, MINUTE, "the alarm").await;
    writers.stop().await;
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    report_tally(
        "s12 broker memory alarm",
        &committed,
        &tally,
        &[
            ("blocked for", secs(blocked_for)),
            ("delivered while blocked", delivered_during.to_string()),
            ("reconnects", relay.reconnects().to_string()),
            ("cleared to probe delivered", secs(recovery)),
        ],
    );
    assert_eq!(tally.duplicates(), 0, "no reconnect, so no replay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_blocked_is_reported_by_readyz_and_a_gauge() {
    let pair = shared().await;
    let rabbit = blocking(RabbitServer::start);
    let outbox = Outbox::on(&pair.pg.url("postgres"), &rabbit.url(), "alarmready").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let (relay, port) =
        spawn_streaming_observed(&outbox, &mut consumer, &["--confirm-timeout", "3s"]).await;

    memory_alarm(&rabbit, true);
    // The broker blocks a connection when it next publishes.
    outbox.insert("WhileBlocked", "{}").await;
    assert!(
        relay.wait_for_log("broker blocked", MINUTE).await,
        "log:\n{}",
        relay.log()
    );
    assert_eq!(readyz(port).await, (503, "broker blocked".to_string()));
    let metrics = common::http::metrics(port).await;
    assert_eq!(
        metric_value(&metrics, BROKER_BLOCKED),
        Some(1.0),
        "{metrics}"
    );

    memory_alarm(&rabbit, false);
    assert!(
        wait_ready(port, MINUTE).await,
        "/readyz answers 200 once unblocked: {:?}",
        readyz(port).await
    );
    let metrics = common::http::metrics(port).await;
    assert_eq!(metric_value(&metrics, BROKER_BLOCKED), Some(0.0));
}

/// A long alarm while the outbox is idle and the database busy: every keepalive and heartbeat
/// behind the blocked publish is an ack point, and they must not pile up (they merge). Long
/// against the heartbeat (1 s) and the confirm timeout (3 s): with the merge taken out, 20 s
/// queued 149,876 of them; 60 s proved no more and cost CI 40 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_alarm_with_a_busy_database_keeps_queued_ack_points_bounded() {
    const ALARM: Duration = Duration::from_secs(20);
    let pair = shared().await;
    let rabbit = blocking(RabbitServer::start);
    let outbox = Outbox::on(&pair.pg.url("postgres"), &rabbit.url(), "alarmbusy").await;
    let oracle = Oracle::create(&outbox).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let (relay, port) = spawn_streaming_observed(
        &outbox,
        &mut consumer,
        &["--confirm-timeout", "3s", "--heartbeat-interval", "1s"],
    )
    .await;

    memory_alarm(&rabbit, true);
    let blocked_id = outbox.insert("WhileBlocked", "{}").await;
    assert!(
        relay.wait_metric(BROKER_BLOCKED, MINUTE, |v| v == 1).await,
        "log:\n{}",
        relay.log()
    );
    // Another table written all along: the WAL moves, so keepalives keep coming.
    outbox
        .client
        .batch_execute("CREATE TABLE alarmbusy_side (id bigserial PRIMARY KEY, v text)")
        .await
        .expect("create the side table");
    let side_writer = {
        let db_url = outbox.db_url.clone();
        tokio::spawn(async move {
            let client = common::pg_connect(&db_url).await;
            loop {
                client
                    .execute(
                        "INSERT INTO alarmbusy_side (v) VALUES (repeat('x', 200))",
                        &[],
                    )
                    .await
                    .expect("side insert");
            }
        })
    };
    let started = Instant::now();
    let mut most_queued = 0.0f64;
    let mut samples = 0;
    while started.elapsed() < ALARM {
        let metrics = common::http::metrics(port).await;
        let queued = metric_value(&metrics, ACK_POINTS_QUEUED)
            .expect("outbox_relay_ack_points_queued is exported");
        most_queued = most_queued.max(queued);
        samples += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_not_acknowledged(&outbox, &oracle, &blocked_id, "the blocked row").await;
    side_writer.abort();
    memory_alarm(&rabbit, false);
    assert!(
        wait_for_ids(&mut consumer, std::slice::from_ref(&blocked_id), MINUTE).await,
        "the blocked row arrives once the alarm clears; log:\n{}",
        relay.log()
    );
    assert_acknowledged(&outbox, &oracle, &relay, &blocked_id, MINUTE).await;
    report(
        "s12c long alarm, busy database",
        &[
            ("alarm", secs(ALARM)),
            ("gauge samples", samples.to_string()),
            ("most ack points queued", most_queued.to_string()),
            ("session failures", relay.reconnects().to_string()),
        ],
    );
    assert!(
        most_queued <= 2.0,
        "ack points pile up behind the blocked publish: {most_queued} queued"
    );
    assert_eq!(relay.reconnects(), 0, "no reconnect while blocked");
}

// ---------------------------------------------------------------------------------
// 13-15. Broker topology and capacity

/// DUP after the pipeline stopped on a message (return, nack, channel error): the first
/// failure may replay the window (W) and the open transaction's confirmed rows (X); each
/// retry, with a window of 1, replays that transaction's rows before the stuck one again (X).
fn assert_within_stop_bound(tally: &Tally, relay: &RelayProcess) {
    let bound = W + MAX_TXN_ROWS * relay.sessions();
    assert!(
        tally.duplicates() <= bound,
        "DUP: {} duplicates, bound W + X × sessions = {bound}",
        tally.duplicates()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_removed_while_publishing_holds_the_slot_until_rebound() {
    let (outbox, oracle, mut consumer) = shared_observed("unbind", false).await;
    let relay = outbox.spawn_relay(&FAST_BACKOFF);
    write_and_deliver(&outbox, &relay, &mut consumer, 200).await;

    unbind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
    write_concurrently(&outbox.db_url, 2, 200, MAX_TXN_ROWS).await;
    // Returned, then retried (window 1) and returned again: the relay does not move past it.
    assert!(
        relay
            .wait_metric(&reconnects("unroutable"), MINUTE, |n| n >= 2)
            .await,
        "log:\n{}",
        relay.log()
    );
    let stuck = id_after(&relay, "returned message ");
    assert_acknowledged_only_before(
        &outbox,
        &oracle,
        &mut consumer,
        &stuck,
        "the returned message",
    )
    .await;
    let returns = relay.log_count("as unroutable");

    bind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
    let recovery =
        delivered_after(&relay, &outbox.client, &mut consumer, MINUTE, "rebinding").await;
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    report_tally(
        "s13 binding removed",
        &committed,
        &tally,
        &[
            ("returns logged while unbound", returns.to_string()),
            ("rebound to probe delivered", secs(recovery)),
        ],
    );
    assert_within_stop_bound(&tally, &relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returned_message_is_reported_by_readyz_and_metrics() {
    let outbox = shared_outbox("unbindready").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let (relay, port) = spawn_streaming_observed(&outbox, &mut consumer, &FAST_BACKOFF).await;

    unbind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
    let stuck = outbox.insert("Unbound", "{}").await;
    assert_stuck_on_returned(&relay, port, &stuck).await;
    let metrics = common::http::metrics(port).await;
    let returned = metric_sum(&metrics, MESSAGES_RETURNED_TOTAL);
    assert!(returned >= Some(1.0), "returns counted: {metrics}");
    let reconnects = metric_sum(&metrics, RECONNECTS_TOTAL);
    assert!(reconnects >= Some(2.0), "reconnects counted: {metrics}");

    bind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
    let wanted = [stuck.clone()];
    assert!(
        wait_for_ids(&mut consumer, &wanted, MINUTE).await,
        "log:\n{}",
        relay.log()
    );
    assert!(
        wait_ready(port, MINUTE).await,
        "/readyz answers 200 once delivered: {:?}",
        readyz(port).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchange_deleted_is_a_clear_error_without_advance_until_redeclared() {
    let (outbox, oracle, mut consumer) = shared_observed("noexchange", false).await;
    let relay = outbox.spawn_relay(&FAST_BACKOFF);
    write_and_deliver(&outbox, &relay, &mut consumer, 200).await;

    delete_exchange(&outbox.amqp_url, &outbox.exchange).await;
    let after = write_concurrently(&outbox.db_url, 1, 100, MAX_TXN_ROWS).await;
    let clear = format!("exchange \"{}\" does not exist", outbox.exchange);
    assert!(
        relay
            .wait_metric(&reconnects("exchange_missing"), MINUTE, |n| n >= 2)
            .await
            && relay.log_count(&clear) >= 2,
        "a clear error naming the exchange, repeated on retry; log:\n{}",
        relay.log()
    );
    let first_after = &after[0];
    let what = "the first row published to the missing exchange";
    assert_acknowledged_only_before(&outbox, &oracle, &mut consumer, first_after, what).await;
    assert!(
        relay.try_exit().is_none(),
        "a missing exchange is retried, not fatal"
    );

    // Deleting the exchange removed its bindings: declare and bind again.
    declare_exchange(&outbox.amqp_url, &outbox.exchange).await;
    bind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
    let recovery = delivered_after(
        &relay,
        &outbox.client,
        &mut consumer,
        MINUTE,
        "re-declaring",
    )
    .await;
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    report_tally(
        "s14 exchange deleted",
        &committed,
        &tally,
        &[
            ("clear errors logged", relay.log_count(&clear).to_string()),
            ("re-declared to probe delivered", secs(recovery)),
        ],
    );
    assert_within_stop_bound(&tally, &relay);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_reject_publish_queue_nacks_back_off_and_everything_arrives_once_drained() {
    full_queue_scenario("s15 reject-publish queue full", "full", 100, None).await;
}

/// s15 at full speed: a backlog drained with a full window, the broker folding acks, and the
/// queue filling up in the middle of it, so the first nack lands inside a window of
/// unconfirmed publishes (nacks of a multiple-nack frame, acks before them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_speed_drain_into_a_filling_queue_never_acknowledges_past_the_first_nack() {
    let rows = common::faults::stress_rows();
    let capacity = (rows / 4) as i64;
    full_queue_scenario(
        "s15b full speed into a full queue",
        "fullspeed",
        capacity,
        Some(rows),
    )
    .await;
}

/// A queue that holds `capacity` messages and rejects publishes beyond (`x-overflow:
/// reject-publish`: the broker nacks them). Rows come from two concurrent writers while the
/// relay runs, or, with `backlog`, that many rows are committed first and drained at full
/// speed. The relay must log nacks, retry, never acknowledge the nacked row's transaction
/// while the queue is full, and deliver everything once a consumer drains the queue.
async fn full_queue_scenario(scenario: &str, prefix: &str, capacity: i64, backlog: Option<usize>) {
    let outbox = shared_outbox(prefix).await;
    let oracle = Oracle::create(&outbox).await;
    common::delete_queue(&outbox.amqp_url, &outbox.queue).await;
    let mut arguments = lapin::types::FieldTable::default();
    arguments.insert(
        "x-max-length".into(),
        lapin::types::AMQPValue::LongLongInt(capacity),
    );
    arguments.insert(
        "x-overflow".into(),
        lapin::types::AMQPValue::LongString("reject-publish".into()),
    );
    common::declare_bound_queue_with_args(
        &outbox.amqp_url,
        &outbox.exchange,
        &outbox.queue,
        "#",
        arguments,
    )
    .await;
    let transaction_rows = match backlog {
        Some(rows) => {
            common::faults::seed_backlog(&outbox, rows, None).await;
            common::faults::SEED_TXN_ROWS
        }
        None => {
            write_concurrently(&outbox.db_url, 2, 300, MAX_TXN_ROWS).await;
            MAX_TXN_ROWS
        }
    };
    let relay = outbox.spawn_relay(&FAST_BACKOFF);
    assert!(
        relay
            .wait_metric(&reconnects("nack"), MINUTE, |n| n >= 3)
            .await,
        "nacked, retried, nacked again; log:\n{}",
        relay.log()
    );
    let nacked = id_after(&relay, "(nacked) message ");
    assert_not_acknowledged(&outbox, &oracle, &nacked, "the nacked message").await;
    assert_eq!(
        queue_message_count(&outbox.amqp_url, &outbox.queue).await,
        capacity as u32,
        "the queue is full"
    );
    let delays: Vec<String> = relay
        .log_lines("nacked) message")
        .iter()
        .filter_map(|l| l.split("retry_in_ms=").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap_or("").to_string())
        .collect();

    // Drain: the retries get through and the rest follows.
    let drained = Instant::now();
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    report_tally(
        scenario,
        &committed,
        &tally,
        &[
            ("queue capacity", capacity.to_string()),
            (
                "nacks logged",
                relay.log_count("nacked) message").to_string(),
            ),
            ("retry delays ms", delays.join("/")),
            ("drain to all delivered", secs(drained.elapsed())),
        ],
    );
    let bound = W + transaction_rows * relay.sessions();
    assert!(
        tally.duplicates() <= bound,
        "DUP: {} duplicates, bound W + X × sessions = {bound}",
        tally.duplicates()
    );
}

// ---------------------------------------------------------------------------------
// 16. Slot lost

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_slot_stops_the_relay_on_reconnect_and_start_and_is_never_recreated() {
    let pair = shared().await;
    let pg = blocking(|| PgServer::start(&[("max_slot_wal_keep_size", "1MB")]));
    let outbox = Outbox::on(&pg.url("postgres"), &pair.rabbit.url(), "lost").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let relay = outbox.spawn_relay(&FAST_BACKOFF);
    let (delivered, first) = probe(&outbox.client, &mut consumer, MINUTE).await;
    assert!(first.is_some(), "log:\n{}", relay.log());

    // The relay falls behind: a row nothing is bound for holds the slot while it retries.
    unbind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
    let in_gap = outbox.insert("InTheGap", "{}").await;
    assert_returned(&relay, &in_gap, 1, MINUTE).await;
    let confirmed = outbox.confirmed_flush().await;
    // WAL beyond the slot's allowance, until a checkpoint invalidates it.
    outbox
        .client
        .batch_execute("CREATE TABLE filler (v text)")
        .await
        .expect("filler table");
    let deadline = Instant::now() + MINUTE;
    let mut rounds = 0;
    loop {
        let (_, status, _) = slot_state(&outbox.client, &outbox.slot)
            .await
            .expect("slot");
        if status.as_deref() == Some("lost") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slot never lost: wal_status {status:?}"
        );
        outbox
            .client
            .batch_execute(
                "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000);
                 SELECT pg_switch_wal();
                 CHECKPOINT;",
            )
            .await
            .expect("generate WAL");
        rounds += 1;
    }
    bind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;

    // On its next reconnect the running relay stops...
    let mut messages = vec![final_error(&relay, "a lost slot").await];
    // ...and so does every later start.
    for _ in 0..2 {
        let run = outbox.run_command(&["run"]);
        assert!(
            !run.status.success(),
            "the relay must not run on a lost slot"
        );
        let stderr = String::from_utf8_lossy(&run.stderr);
        let line = common::relay::final_error(&stderr).unwrap_or_default();
        messages.push(line.to_string());
    }
    for message in &messages {
        assert!(
            message.contains(&outbox.slot)
                && message.contains("invalidated")
                && message.contains("may be missing")
                && message.contains("resync"),
            "names the slot, the gap and the recovery: {message}"
        );
    }
    let (_, status, active) = slot_state(&outbox.client, &outbox.slot)
        .await
        .expect("the slot still exists");
    assert_eq!(status.as_deref(), Some("lost"), "never recreated silently");
    assert_eq!(active, None);
    // The relay has exited (and every later start too): whatever it confirmed is ahead of the
    // marker.
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let received = settled(&mut consumer, url, queue, Upto::Done, || relay.log()).await;
    assert_eq!(
        ids_of(received),
        [delivered.as_str()],
        "nothing published from a lost slot"
    );
    report(
        "s16 slot lost",
        &[
            ("confirmed_flush when held", common::format_lsn(confirmed)),
            ("rounds of switch+checkpoint", rounds.to_string()),
            ("exits (reconnect + 2 starts)", messages.len().to_string()),
        ],
    );
    println!("s16 message: {}", messages[0]);
}

// ---------------------------------------------------------------------------------
// 18. Schema change

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_column_maps_to_a_header_for_later_rows_only_across_a_reconnect() {
    const HEADER: &str = "x-aggregate-id";
    // The column mapped to a header is added mid-stream: start without it.
    let (outbox, oracle, mut consumer) =
        shared_observed_after("addcolumn", "ALTER TABLE outbox DROP COLUMN aggregate_id").await;
    let relay = outbox.spawn_relay(&FAST_BACKOFF);
    let insert_old = |n: usize| {
        let client = &outbox.client;
        async move {
            let mut ids = Vec::new();
            for i in 0..n {
                let row = client
                    .query_one(
                        "INSERT INTO outbox (event_type, payload) VALUES ('Old', jsonb_build_object('i', $1::int)) RETURNING id::text",
                        &[&(i as i32)],
                    )
                    .await
                    .expect("insert");
                ids.push(row.get::<_, String>(0));
            }
            ids
        }
    };
    // Live: old-schema rows delivered.
    let live_old = insert_old(20).await;
    assert!(
        wait_for_ids(&mut consumer, &live_old, MINUTE).await,
        "log:\n{}",
        relay.log()
    );

    // Hold the stream: a row nothing is bound for. Rows behind it wait, unacknowledged, across
    // the schema change, and every retry is a reconnect that replays them.
    unbind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
    let gate = outbox.insert("Gate", "{}").await;
    assert_returned(&relay, &gate, 1, MINUTE).await;
    let held_old = insert_old(20).await;
    outbox
        .client
        .batch_execute("ALTER TABLE outbox ADD COLUMN aggregate_id text")
        .await
        .expect("add aggregate_id");
    let mut held_new = Vec::new();
    for i in 0..20 {
        let row = outbox
            .client
            .query_one(
                "INSERT INTO outbox (event_type, payload, aggregate_id) VALUES ('New', '{}', $1) RETURNING id::text",
                &[&format!("agg-{i}")],
            )
            .await
            .expect("insert with aggregate_id");
        held_new.push(row.get::<_, String>(0));
    }
    let reconnects_before = relay.sessions();
    assert!(
        relay
            .wait_new_session(reconnects_before, MINUTE)
            .await
            .is_some(),
        "a reconnect while the rows are held; log:\n{}",
        relay.log()
    );
    bind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
    let null_id = outbox
        .client
        .query_one(
            "INSERT INTO outbox (event_type, payload, aggregate_id) VALUES ('New', '{}', NULL) RETURNING id::text",
            &[],
        )
        .await
        .expect("insert")
        .get::<_, String>(0);
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;

    let received = consumer.received().to_vec();
    let aggregate_of = |id: &str| -> Vec<Option<String>> {
        received
            .iter()
            .filter(|r| r.message_id.as_deref() == Some(id))
            .map(|r| r.header_str(HEADER).map(String::from))
            .collect()
    };
    for id in live_old.iter().chain(&held_old).chain([&gate, &null_id]) {
        for header in aggregate_of(id) {
            assert_eq!(
                header, None,
                "row {id} has no aggregate id, nor does any replay of it"
            );
        }
    }
    for (i, id) in held_new.iter().enumerate() {
        let headers = aggregate_of(id);
        assert!(
            !headers.is_empty(),
            "row {id}, held across the reconnect, never arrived; log:\n{}",
            relay.log()
        );
        for header in headers {
            assert_eq!(
                header.as_deref(),
                Some(format!("agg-{i}").as_str()),
                "row {id}"
            );
        }
    }
    report_tally(
        "s18 ADD COLUMN mid-stream",
        &committed,
        &tally,
        &[("sessions", relay.sessions().to_string())],
    );
}

// ---------------------------------------------------------------------------------
// 19. Bad rows

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_megabyte_toasted_jsonb_payload_arrives_json_equal() {
    let (outbox, oracle, mut consumer) = shared_observed("toast", true).await;
    let relay = outbox.spawn_relay(&[]);
    let before = outbox.insert("Small", r#"{"n": 1}"#).await;
    // md5 text compresses poorly: about 1 MB of it is stored out of line (TOAST).
    let row = outbox
        .client
        .query_one(
            "INSERT INTO outbox (event_type, payload)
             SELECT 'Large', jsonb_build_object('n', 2, 'blob', string_agg(md5(g::text), ''))
             FROM generate_series(1, 32768) g
             RETURNING id::text, payload::text, pg_column_size(payload)",
            &[],
        )
        .await
        .expect("insert 1 MB payload");
    let (large, text, stored): (String, String, i32) = (row.get(0), row.get(1), row.get(2));
    let toast_table: String = outbox
        .client
        .query_one(
            "SELECT reltoastrelid::regclass::text FROM pg_class WHERE relname = 'outbox'",
            &[],
        )
        .await
        .expect("the outbox table's TOAST table")
        .get(0);
    let toasted: i64 = outbox
        .client
        .query_one(&format!("SELECT count(*) FROM {toast_table}"), &[])
        .await
        .expect("count TOAST chunks")
        .get(0);
    assert!(toasted > 0, "the payload is stored out of line");
    let after = outbox.insert("Small", r#"{"n": 3}"#).await;
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    assert_eq!(tally.duplicates(), 0);
    let received = consumer.received();
    let ids = ids_of(received);
    assert_eq!(ids, [before.as_str(), large.as_str(), after.as_str()]);
    let large_msg = received
        .iter()
        .find(|r| r.message_id.as_deref() == Some(large.as_str()))
        .expect("large message");
    let expected: serde_json::Value = serde_json::from_str(&text).expect("payload JSON");
    assert_eq!(large_msg.body_json(), expected, "JSON-equal");
    report(
        "s19a 1 MB TOASTed payload",
        &[
            ("rows", committed.len().to_string()),
            ("body bytes", large_msg.body.len().to_string()),
            ("stored bytes", stored.to_string()),
            ("toast chunks", toasted.to_string()),
        ],
    );
}

/// Waits for the relay to exit non-zero, as it must on `what`: its final `error:` line.
async fn final_error(relay: &RelayProcess, what: &str) -> String {
    let status = relay
        .wait_exit(MINUTE)
        .await
        .unwrap_or_else(|| panic!("the relay did not stop on {what}; log:\n{}", relay.log()));
    assert!(!status.success(), "exits non-zero; log:\n{}", relay.log());
    let log = relay.log();
    common::relay::final_error(&log)
        .unwrap_or_else(|| panic!("no final error record; log:\n{log}"))
        .to_string()
}

/// Commits three rows, one the relay can publish, the bad one (`bad_sql` inserts it and
/// returns its id) and one after it, then starts a relay with `flags` that must stop on the
/// bad row: it exits non-zero naming the row (and `names`), the row before it is delivered,
/// the row and everything after it are neither published nor acknowledged. Returns the relay
/// and its error line.
async fn assert_stops_on_bad_row(
    outbox: &Outbox,
    oracle: &Oracle,
    consumer: &mut Consumer,
    bad_sql: &str,
    flags: &[&str],
    names: &[&str],
) -> (RelayProcess, String) {
    let good = outbox.insert("Good", "{}").await;
    let bad: String = outbox
        .client
        .query_one(bad_sql, &[])
        .await
        .expect("insert the bad row")
        .get(0);
    let later = outbox.insert("Later", "{}").await;
    let relay = outbox.spawn_relay(flags);
    let line = final_error(&relay, &format!("row {bad}")).await;
    assert!(line.contains(&bad), "the error names row {bad}: {line}");
    for name in names {
        assert!(line.contains(name), "the error says {name:?}: {line}");
    }
    check_ack(&outbox.client, outbox, oracle, consumer).await;
    let ids = ids_of(consumer.received());
    assert!(
        ids.contains(&good.as_str()),
        "the row before it is delivered"
    );
    assert!(!ids.contains(&bad.as_str()), "the bad row is not published");
    assert!(
        !ids.contains(&later.as_str()),
        "nothing after it is published"
    );
    assert_not_acknowledged(outbox, oracle, &bad, "the bad row").await;
    (relay, line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_event_type_stops_the_relay_naming_the_row() {
    let (outbox, oracle, mut consumer) = shared_observed_after(
        "nulltype",
        "ALTER TABLE outbox ALTER COLUMN event_type DROP NOT NULL",
    )
    .await;
    let (_, line) = assert_stops_on_bad_row(
        &outbox,
        &oracle,
        &mut consumer,
        "INSERT INTO outbox (event_type, payload) VALUES (NULL, '{}') RETURNING id::text",
        &[],
        &["event_type", "NULL"],
    )
    .await;
    println!("s19b error: {line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_megabyte_payload_stops_before_publishing_naming_the_row() {
    let (outbox, oracle, mut consumer) = shared_observed("toolarge", true).await;
    let (relay, line) = assert_stops_on_bad_row(
        &outbox,
        &oracle,
        &mut consumer,
        "INSERT INTO outbox (event_type, payload) \
         VALUES ('Huge', jsonb_build_object('blob', repeat('x', 20 * 1024 * 1024))) \
         RETURNING id::text",
        &["--max-message-size", "16777216"],
        &["16777216"],
    )
    .await;
    assert!(
        !relay.log().contains("RabbitMQ error"),
        "checked before publishing: the broker never saw it; log:\n{}",
        relay.log()
    );
    println!("s19c error: {line}");
}

// ---------------------------------------------------------------------------------
// 20. Two relays, one slot

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_relay_waits_as_standby_and_takes_over_when_the_first_stops() {
    let (outbox, oracle, mut consumer) = shared_observed("standby", false).await;
    let first = outbox.spawn_relay(&[]);
    assert!(
        first.wait_new_session(0, MINUTE).await.is_some(),
        "log:\n{}",
        first.log()
    );
    let (_, _, holder) = slot_state(&outbox.client, &outbox.slot)
        .await
        .expect("slot");
    let holder = holder.expect("the first relay holds the slot");

    let second = outbox.spawn_relay(&[]);
    assert!(
        second
            .wait_for_log("standby: waiting for the slot", MINUTE)
            .await,
        "log:\n{}",
        second.log()
    );
    assert!(
        second.log().contains(&holder.to_string()),
        "the standby names the pid holding the slot ({holder}); log:\n{}",
        second.log()
    );
    write_and_deliver(&outbox, &first, &mut consumer, 500).await;
    assert_eq!(
        second.sessions(),
        0,
        "the standby never streamed while the first ran; log:\n{}",
        second.log()
    );

    first.stop().await;
    let stopped = Instant::now();
    assert!(
        second.wait_new_session(0, MINUTE).await.is_some(),
        "the standby takes over; log:\n{}",
        second.log()
    );
    let takeover = stopped.elapsed();
    write_concurrently(&outbox.db_url, 2, 500, MAX_TXN_ROWS).await;
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &second).await;
    report_tally(
        "s20 two relays",
        &committed,
        &tally,
        &[("takeover after", secs(takeover))],
    );
    assert_eq!(
        tally.duplicates(),
        0,
        "the first stopped gracefully; the standby never published alongside it"
    );
}

// ---------------------------------------------------------------------------------
// 21. Polling mode: a crash between the last confirm and COMMIT

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_crash_between_confirms_and_commit_twice_loses_nothing() {
    use std::os::unix::process::ExitStatusExt;
    const WORKERS: usize = 5;
    const BATCH: usize = 100;
    const ROWS: usize = 6_000;
    let pair = shared().await;
    let outbox = Outbox::on_poll(&pair.pg.url("postgres"), &pair.rabbit.url(), "pollcrash").await;
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    // The backlog, committed before the relay starts: its ids are the committed set.
    let committed = write_concurrently(&outbox.db_url, 4, ROWS, MAX_TXN_ROWS).await;
    let (workers, batch) = (WORKERS.to_string(), BATCH.to_string());
    let flags = [
        "--workers",
        workers.as_str(),
        "--batch-size",
        batch.as_str(),
    ];

    // Each crashing run aborts at the Nth batch to reach COMMIT (counted over its workers),
    // with every confirm of that batch in. With the relay dead, a barrier flushes the queue:
    // the rows that arrived during the run but are still unsent in the table are the ones
    // the crash duplicates (confirmed, not committed).
    let mut per_crash = Vec::new();
    for hit in [3, 5] {
        let start = consumer.received().len();
        let spec = format!("poll-before-commit=abort@{hit}");
        let relay = outbox.spawn_poll(&flags, &[("OUTBOX_FAILPOINTS", spec.as_str())]);
        let status = relay
            .wait_exit(MINUTE)
            .await
            .unwrap_or_else(|| panic!("the failpoint did not fire; log:\n{}", relay.log()));
        assert_eq!(
            status.signal(),
            Some(common::relay::SIGABRT),
            "{status}; log:\n{}",
            relay.log()
        );
        assert!(
            relay.log().contains("failpoint poll-before-commit fired"),
            "the crash is the failpoint's; log:\n{}",
            relay.log()
        );
        barrier(&mut consumer, &outbox.amqp_url, &outbox.queue).await;
        // The other workers may have sent their COMMIT as the process died: the server
        // finishes it after the exit, and a row read as unsent before that was counted as a
        // duplicate that never came (500 against 700 once, in CI). Read the table once the
        // aborted relay's backends are gone.
        let backends = common::pg::wait_count(
            &outbox.client,
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = 'outbox-relay'",
            MINUTE,
            |open| open == 0,
        )
        .await;
        assert!(
            backends.is_ok(),
            "the aborted relay's backends stay open: {backends:?}"
        );
        let unsent = unsent_ids(&outbox.client).await;
        assert!(!unsent.is_empty(), "the crash must land mid-backlog");
        let arrived: HashSet<&str> = ids_of(&consumer.received()[start..]).into_iter().collect();
        per_crash.push(arrived.iter().filter(|id| unsent.contains(**id)).count());
    }
    let restarted = Instant::now();
    let relay = outbox.spawn_poll(&flags, &[]);
    assert!(
        wait_for_ids(&mut consumer, &committed, Duration::from_secs(180)).await,
        "L0: not every committed row arrived; log:\n{}",
        relay.log()
    );
    let drained = restarted.elapsed();
    relay.stop().await;
    assert!(
        unsent_ids(&outbox.client).await.is_empty(),
        "every row marked published"
    );
    barrier(&mut consumer, &outbox.amqp_url, &outbox.queue).await;
    let tally = Tally::of(consumer.received());
    assert_nothing_lost_or_invented(&tally, &committed);
    report(
        "s21 polling crash before COMMIT",
        &[
            ("crashes", per_crash.len().to_string()),
            ("rows", committed.len().to_string()),
            ("lost", "0".into()),
            ("duplicates", tally.duplicates().to_string()),
            ("per crash", format!("{per_crash:?}")),
            ("bound per crash", (WORKERS * BATCH).to_string()),
            ("restart → backlog drained", secs(drained)),
        ],
    );
    assert_eq!(
        tally.duplicates(),
        per_crash.iter().sum::<usize>(),
        "each row confirmed but not committed at a crash arrives once more, nothing else"
    );
    for (crash, duplicates) in per_crash.iter().enumerate() {
        // The aborting worker's whole batch was confirmed, so it is published again: that
        // proves the failpoint sits after the confirms.
        assert!(
            *duplicates >= BATCH,
            "crash {crash}: {duplicates} duplicates, expected at least the aborted batch"
        );
        assert!(
            *duplicates <= WORKERS * BATCH,
            "DUP: crash {crash} duplicated {duplicates} rows, bound workers × batch = {}",
            WORKERS * BATCH
        );
    }
}

// ---------------------------------------------------------------------------------
// 22. Broker down: what an operator sees

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_slot_and_heartbeat_lag_rise_readyz_says_why_and_all_recover() {
    let pair = shared().await;
    let rabbit = blocking(RabbitServer::start);
    let outbox = Outbox::on(&pair.pg.url("postgres"), &rabbit.url(), "brokerdown").await;
    let oracle = Oracle::create(&outbox).await;
    let (relay, port) = outbox.spawn_observed(&[
        "--heartbeat-interval",
        "1s",
        "--slot-poll-interval",
        "200ms",
        FAST_BACKOFF[0],
        FAST_BACKOFF[1],
    ]);
    assert!(
        wait_ready(port, MINUTE).await,
        "/readyz: {:?}; log:\n{}",
        readyz(port).await,
        relay.log()
    );
    // A heartbeat made the round trip, so its lag is measured.
    let metrics = wait_metrics(port, MINUTE, |m| {
        metric_value(m, HEARTBEAT_LAG_SECONDS).is_some()
    })
    .await;
    let healthy_heartbeat = metric_value(&metrics, HEARTBEAT_LAG_SECONDS).expect("heartbeat lag");
    let writers = Writers::start(&outbox.db_url, 1, MAX_TXN_ROWS, Duration::from_millis(20));
    assert!(
        writers.wait_committed(100, MINUTE).await,
        "the writer committed {} of 100 rows within a minute",
        writers.committed()
    );

    let killed = blocking(|| rabbit.kill9());
    assert_readyz_becomes(port, &relay, (503, "broker down")).await;
    let reported_after = killed.elapsed();

    // While the broker is down: nothing is acknowledged, and every scrape shows more slot
    // lag (a row was inserted since the last) and more heartbeat lag (time passed and no
    // heartbeat can come back) than the one before, each matching PostgreSQL.
    let mut previous: Option<(i128, f64)> = None;
    for _ in 0..4 {
        outbox.insert("WhileBrokerDown", "{}").await;
        let scrape = scrape_slot_gauges(&outbox.client, &outbox.slot, port).await;
        assert_eq!(
            scrape.before.confirmed_flush, scrape.after.confirmed_flush,
            "nothing is acknowledged while the broker is down"
        );
        let heartbeat =
            metric_value(&scrape.metrics, HEARTBEAT_LAG_SECONDS).expect("heartbeat lag");
        assert_eq!(metric_value(&scrape.metrics, READY), Some(0.0));
        assert_eq!(readyz(port).await, (503, "broker down".to_string()));
        if let Some((lag, previous_heartbeat)) = previous {
            assert!(
                scrape.lag > lag,
                "slot lag rises: {lag} then {}",
                scrape.lag
            );
            assert!(
                heartbeat > previous_heartbeat,
                "heartbeat lag rises: {previous_heartbeat} then {heartbeat}"
            );
        }
        previous = Some((scrape.lag, heartbeat));
    }
    let (outage_lag, outage_heartbeat) = previous.expect("samples");
    let (_, metrics) = http_get(port, "/metrics").await.expect("/metrics");
    let broker_reconnects = metrics
        .lines()
        .find(|l| l.starts_with(&reconnects("broker")))
        .map(String::from);
    assert!(
        broker_reconnects.is_some(),
        "reconnects are counted by cause:\n{metrics}"
    );

    let restarting = Instant::now();
    blocking(|| rabbit.restart());
    assert!(
        wait_ready(port, MINUTE).await,
        "/readyz answers 200 once the broker is back: {:?}; log:\n{}",
        readyz(port).await,
        relay.log()
    );
    let ready_after = restarting.elapsed();
    // Both lags fall back below what the outage reached (writers are still writing).
    let metrics = wait_metrics(port, MINUTE, |m| {
        metric_value(m, HEARTBEAT_LAG_SECONDS).is_some_and(|h| h < outage_heartbeat)
            && metric_value(m, SLOT_LAG_BYTES).is_some_and(|l| (l as i128) < outage_lag)
    })
    .await;
    let recovered_after = restarting.elapsed();
    let heartbeat = metric_value(&metrics, HEARTBEAT_LAG_SECONDS).expect("heartbeat lag");
    let lag = metric_value(&metrics, SLOT_LAG_BYTES).expect("slot lag") as i128;
    assert!(
        heartbeat < outage_heartbeat && lag < outage_lag,
        "after the broker returned: heartbeat lag {heartbeat} (outage {outage_heartbeat}), \
         slot lag {lag} (outage {outage_lag}); log:\n{}",
        relay.log()
    );
    // And they still match PostgreSQL.
    let scrape = scrape_slot_gauges(&outbox.client, &outbox.slot, port).await;
    writers.stop().await;
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    report_tally(
        "s22 broker down",
        &committed,
        &tally,
        &[
            ("readyz 'broker down' after", secs(reported_after)),
            ("heartbeat lag healthy", format!("{healthy_heartbeat:.2} s")),
            (
                "heartbeat lag in outage",
                format!("{outage_heartbeat:.2} s"),
            ),
            ("slot lag in outage", format!("{outage_lag} B")),
            ("ready after restart begun", secs(ready_after)),
            ("lags back after restart begun", secs(recovered_after)),
            (
                "after",
                format!("heartbeat {heartbeat:.2} s, slot lag {} B", scrape.lag),
            ),
        ],
    );
}

// ---------------------------------------------------------------------------------
// 23. Standby takeover under load

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Sigterm,
    Kill9,
    /// The active relay's host vanishes: its PostgreSQL connections (through the proxy)
    /// go silent, nothing is closed.
    HostLost,
}

/// `wal_sender_timeout` of the PostgreSQL in the host-lost case (the default is 60 s).
const HOST_LOST_WAL_SENDER_TIMEOUT: &str = "5s";

/// 20,000 rows from writers; relay A streams, relay B waits as a standby; A is stopped
/// halfway; B takes over and everything arrives. Prints how long the takeover took.
async fn standby_takeover(stop: Stop, prefix: &str) {
    const ROWS: usize = 20_000;
    let pair = shared().await;
    let own_pg = (stop == Stop::HostLost).then(|| {
        blocking(|| PgServer::start(&[("wal_sender_timeout", HOST_LOST_WAL_SENDER_TIMEOUT)]))
    });
    let pg = own_pg.as_ref().unwrap_or(&pair.pg);
    let (outbox, oracle, mut consumer) = observed_outbox(pg, &pair.rabbit, prefix, false).await;
    let proxy =
        (stop == Stop::HostLost).then(|| TcpProxy::start(&format!("127.0.0.1:{}", pg.port())));
    let (active, active_port) = match &proxy {
        None => outbox.spawn_observed(&[]),
        Some(proxy) => {
            let port = common::free_port();
            let addr = format!("127.0.0.1:{port}");
            let db_url = db_url_at(&outbox, proxy.port());
            let relay =
                outbox.spawn_relay_via(&db_url, &outbox.amqp_url, &["--metrics-addr", &addr]);
            (relay, port)
        }
    };
    assert!(
        wait_ready(active_port, MINUTE).await,
        "log:\n{}",
        active.log()
    );
    let (standby, standby_port) = outbox.spawn_observed(&[]);
    assert_readyz_becomes(standby_port, &standby, (503, "standby")).await;
    let metrics = wait_metrics(standby_port, MINUTE, |_| true).await;
    assert_eq!(metric_value(&metrics, STANDBY), Some(1.0));

    let writers = Writers::start(&outbox.db_url, 4, MAX_TXN_ROWS, Duration::from_millis(1));
    assert!(
        writers.wait_committed(ROWS / 2, 5 * MINUTE).await,
        "the writers committed {} of {} rows within 5 minutes",
        writers.committed(),
        ROWS / 2
    );
    assert_eq!(
        standby.sessions(),
        0,
        "the standby never streamed while the active relay ran; log:\n{}",
        standby.log()
    );
    // The premise: the stop lands mid-stream, with committed rows not yet delivered and more of
    // the 20,000 still to be written. A burst committed in one transaction just before it
    // makes the first half sure: the writers alone may leave nothing undelivered for a moment
    // on a loaded machine. Delivered is read first: the committed count only grows.
    outbox
        .client
        .execute(
            "INSERT INTO outbox (event_type, payload) \
             SELECT 'Burst', '{}'::jsonb FROM generate_series(1, $1)",
            &[&(STOP_BURST as i32)],
        )
        .await
        .expect("commit the burst");
    let (delivered_at_stop, committed_at_stop) =
        (consumer.received().len(), writers.committed() + STOP_BURST);
    assert!(
        delivered_at_stop < committed_at_stop && committed_at_stop < ROWS,
        "the {stop:?} did not land mid-stream: {delivered_at_stop} rows delivered of \
         {committed_at_stop} committed, of {ROWS}; log:\n{}",
        active.log()
    );
    let stopped = Instant::now();
    match (stop, &proxy) {
        (Stop::Sigterm, _) => active.sigterm(),
        (Stop::Kill9, _) => active.kill9(),
        (Stop::HostLost, proxy) => proxy.as_ref().expect("proxy").set_modes(Mode::BlackHole),
    }
    let exited = async {
        if stop == Stop::HostLost {
            return None;
        }
        let status = active
            .wait_exit(MINUTE)
            .await
            .expect("the active relay exits");
        Some((status, stopped.elapsed()))
    };
    // The moments of the takeover, each polled every 50 ms or so.
    let slot_released = async {
        loop {
            if let Some((_, _, None)) = slot_state(&outbox.client, &outbox.slot).await {
                return stopped.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let streaming = async {
        standby
            .wait_new_session(0, 2 * MINUTE)
            .await
            .map(|_| stopped.elapsed())
    };
    let first_confirm = async {
        wait_metrics(standby_port, 2 * MINUTE, |m| {
            metric_value(m, MESSAGES_CONFIRMED_TOTAL).is_some_and(|n| n >= 1.0)
        })
        .await;
        stopped.elapsed()
    };
    let (exited, released, streaming, first_confirm) =
        tokio::join!(exited, slot_released, streaming, first_confirm);
    let streaming = streaming
        .unwrap_or_else(|| panic!("the standby did not take over; log:\n{}", standby.log()));
    if let Some((status, _)) = exited {
        if stop == Stop::Sigterm {
            assert!(
                status.success(),
                "exit after SIGTERM: {status}; log:\n{}",
                active.log()
            );
        }
    }
    // The lost host's relay cannot reach PostgreSQL any more; end it for a clean tally.
    active.kill9();
    assert!(
        wait_ready(standby_port, MINUTE).await,
        "log:\n{}",
        standby.log()
    );
    assert!(
        writers.wait_committed(ROWS, 5 * MINUTE).await,
        "the writers committed {} of {ROWS} rows within 5 minutes; standby's log:\n{}",
        writers.committed(),
        standby.log()
    );
    writers.stop().await;
    let (committed, tally) =
        finish(&outbox.client, &outbox, &oracle, &mut consumer, &standby).await;
    report_tally(
        &format!("s23 standby takeover after {stop:?}"),
        &committed,
        &tally,
        &[
            (
                "active exited after",
                exited.map_or("— (still running)".into(), |(_, t)| secs(t)),
            ),
            ("slot released after", secs(released)),
            ("standby streaming after", secs(streaming)),
            ("standby's first confirm after", secs(first_confirm)),
            (
                "delivered / committed at the stop",
                format!("{delivered_at_stop} / {committed_at_stop}"),
            ),
        ],
    );
    println!(
        "takeover after {stop:?}: the standby streamed {} and confirmed its first message {} \
         after the active relay was stopped",
        secs(streaming),
        secs(first_confirm)
    );
    if stop == Stop::Sigterm {
        // A graceful stop acknowledged everything the broker confirmed.
        assert_eq!(tally.duplicates(), 0);
    }
}

/// Rows committed in one transaction right before s23's stop: the stop lands before the relay
/// can have delivered them all.
const STOP_BURST: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_after_sigterm_halfway_through_20000_rows() {
    standby_takeover(Stop::Sigterm, "takeover_term").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_after_kill_9_halfway_through_20000_rows() {
    standby_takeover(Stop::Kill9, "takeover_kill").await;
}

/// Takeover is bounded by PostgreSQL noticing the dead walsender connection: here by
/// wal_sender_timeout (5 s in this test, 60 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_when_the_active_relays_host_vanishes() {
    standby_takeover(Stop::HostLost, "takeover_lost").await;
}
