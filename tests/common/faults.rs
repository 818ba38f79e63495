//! Fault-injection helpers for `tests/faults.rs`: writers that outlive server crashes, the
//! three invariants as oracles from outside the relay, a queue barrier, and broker topology
//! changes made behind the relay's back.
//!
//! - **L0**: every id the `test_decoding` oracle saw committed to the outbox arrived.
//! - **DUP**: how many arrivals were repeats ([`Tally::duplicates`]), against a stated bound.
//! - **ACK**: every row of each transaction ending at or below the slot's
//!   `confirmed_flush_lsn` is already in the queue ([`check_ack`]). "Already" is exact: the
//!   slot position is read first, then a marker is published straight into the queue; rows
//!   the broker confirmed before the relay acknowledged that position were enqueued before the
//!   marker, so they must arrive before it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions};
use lapin::types::FieldTable;
use lapin::ExchangeKind;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::{Client, NoTls};

use super::amqp::{amqp_connect, publish_confirmed, Consumer, Received};
use super::outbox::Outbox;
use super::pg::{read_test_decoding, slot_confirmed_flush, Txn};
use super::relay::RelayProcess;

/// The outbox table as `test_decoding` names it.
pub const OUTBOX_TABLE: &str = "public.outbox";

/// Message ids of the barrier markers start with this; tallies ignore them.
pub const MARKER_PREFIX: &str = "test-marker-";

// ---------------------------------------------------------------------------------
// Writers

/// Application writers inserting into the outbox in the background until stopped, in
/// transactions of 1 to `max_txn_rows` rows. They ride out a server crash: a failed
/// statement or connection drops the transaction (the oracle, not the writer, says whether
/// a failed COMMIT committed) and the writer reconnects.
pub struct Writers {
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicUsize>,
    tasks: Vec<JoinHandle<Vec<String>>>,
}

impl Writers {
    /// Starts `writers` connections; each pauses `pause` between transactions.
    pub fn start(db_url: &str, writers: usize, max_txn_rows: usize, pause: Duration) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicUsize::new(0));
        let tasks = (0..writers)
            .map(|writer| {
                let db_url = db_url.to_string();
                let stop = stop.clone();
                let committed = committed.clone();
                tokio::spawn(async move {
                    write_until_stopped(&db_url, writer, max_txn_rows, pause, &stop, &committed)
                        .await
                })
            })
            .collect();
        Writers {
            stop,
            committed,
            tasks,
        }
    }

    /// Rows whose COMMIT has returned so far.
    pub fn committed(&self) -> usize {
        self.committed.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` rows are committed; false after `timeout`.
    pub async fn wait_committed(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.committed() < n {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Stops the writers and returns the ids whose COMMIT returned.
    pub async fn stop(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        let mut ids = Vec::new();
        for task in self.tasks {
            ids.extend(task.await.expect("writer task"));
        }
        ids
    }
}

async fn write_until_stopped(
    db_url: &str,
    writer: usize,
    max_txn_rows: usize,
    pause: Duration,
    stop: &AtomicBool,
    committed: &AtomicUsize,
) -> Vec<String> {
    let mut ids = Vec::new();
    let mut seed = writer as u64 * 7919 + 17;
    'connect: while !stop.load(Ordering::Relaxed) {
        let mut client = match tokio_postgres::connect(db_url, NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                client
            }
            Err(_) => {
                // The server is down or recovering: retry.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        while !stop.load(Ordering::Relaxed) {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let size = 1 + (seed >> 33) as usize % max_txn_rows;
            let Ok(txn) = client.transaction().await else {
                continue 'connect;
            };
            let mut rows = Vec::with_capacity(size);
            for _ in 0..size {
                let payload = format!(r#"{{"writer": {writer}, "n": {}}}"#, ids.len() + rows.len());
                match txn
                    .query_one(
                        "INSERT INTO outbox (event_type, payload) \
                         VALUES ('FaultEvent', $1::text::jsonb) RETURNING id::text",
                        &[&payload],
                    )
                    .await
                {
                    Ok(row) => rows.push(row.get::<_, String>(0)),
                    Err(_) => continue 'connect,
                }
            }
            if txn.commit().await.is_err() {
                continue 'connect;
            }
            committed.fetch_add(rows.len(), Ordering::Relaxed);
            ids.extend(rows);
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
    }
    ids
}

/// A client that retries until the server accepts connections (after a restart).
pub async fn connect_retrying(db_url: &str, timeout: Duration) -> Client {
    let deadline = Instant::now() + timeout;
    loop {
        match tokio_postgres::connect(db_url, NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                return client;
            }
            Err(e) if Instant::now() >= deadline => panic!("connect to {db_url}: {e:?}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

// ---------------------------------------------------------------------------------
// The oracle

/// A `test_decoding` slot created before the writers start: the transactions committed
/// after it, in commit order, with their end LSNs.
pub struct Oracle {
    pub slot: String,
}

impl Oracle {
    pub async fn create(outbox: &Outbox) -> Oracle {
        let slot = format!("{}_oracle", outbox.slot);
        super::pg::create_test_decoding_slot(&outbox.client, &slot).await;
        Oracle { slot }
    }

    pub async fn transactions(&self, client: &Client) -> Vec<Txn> {
        read_test_decoding(client, &self.slot).await
    }

    /// Every committed outbox id, in commit order.
    pub async fn committed_ids(&self, client: &Client) -> Vec<String> {
        self.transactions(client)
            .await
            .iter()
            .flat_map(|t| t.inserted_ids(OUTBOX_TABLE))
            .collect()
    }

    /// The transaction that inserted `id`.
    pub async fn transaction_of(&self, client: &Client, id: &str) -> Txn {
        self.transactions(client)
            .await
            .into_iter()
            .find(|t| t.inserted_ids(OUTBOX_TABLE).iter().any(|i| i == id))
            .unwrap_or_else(|| panic!("the oracle has no committed row {id}"))
    }
}

// ---------------------------------------------------------------------------------
// Tallies

/// How often each message id arrived (markers left out).
#[derive(Debug, Default)]
pub struct Tally {
    pub counts: HashMap<String, usize>,
}

impl Tally {
    pub fn of(received: &[Received]) -> Tally {
        let mut counts = HashMap::new();
        for r in received {
            let id = r
                .message_id
                .as_deref()
                .expect("every message has a message_id");
            if !id.starts_with(MARKER_PREFIX) {
                *counts.entry(id.to_string()).or_insert(0) += 1;
            }
        }
        Tally { counts }
    }

    /// The committed ids that never arrived.
    pub fn lost<'a>(&self, committed: &'a [String]) -> Vec<&'a str> {
        committed
            .iter()
            .filter(|id| !self.counts.contains_key(id.as_str()))
            .map(String::as_str)
            .collect()
    }

    /// Arrivals beyond the first of each id.
    pub fn duplicates(&self) -> usize {
        self.counts.values().map(|n| n - 1).sum()
    }

    /// Ids that arrived but that the oracle never saw committed (must be none).
    pub fn unknown<'a>(&'a self, committed: &[String]) -> Vec<&'a str> {
        let committed: HashSet<&str> = committed.iter().map(String::as_str).collect();
        self.counts
            .keys()
            .map(String::as_str)
            .filter(|id| !committed.contains(id))
            .collect()
    }
}

/// The message ids of `received`, markers left out.
pub fn ids_of(received: &[Received]) -> Vec<&str> {
    received
        .iter()
        .filter_map(|r| r.message_id.as_deref())
        .filter(|id| !id.starts_with(MARKER_PREFIX))
        .collect()
}

/// Waits until every id in `wanted` has arrived; false after `timeout`.
pub async fn wait_for_ids(consumer: &mut Consumer, wanted: &[String], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut missing: HashSet<&str> = wanted.iter().map(String::as_str).collect();
    let mut seen = 0;
    loop {
        let received = consumer.received();
        for r in &received[seen..] {
            if let Some(id) = r.message_id.as_deref() {
                missing.remove(id);
            }
        }
        seen = received.len();
        if missing.is_empty() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        consumer
            .wait_for(seen + 1, (deadline - now).min(Duration::from_millis(500)))
            .await;
    }
}

// ---------------------------------------------------------------------------------
// Barrier and ACK invariant

/// Publishes a marker straight into `queue` (default exchange, bypassing the relay's
/// exchange and bindings) and waits until `consumer` has it. Everything the queue held
/// before the marker has then arrived. Returns the marker's index in
/// `consumer.received()`.
pub async fn barrier(consumer: &mut Consumer, amqp_url: &str, queue: &str) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let marker = format!(
        "{MARKER_PREFIX}{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    publish_confirmed(amqp_url, "", queue, &[(marker.as_str(), b"")]).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = 0;
    loop {
        let received = consumer.received();
        if let Some(i) = received[seen..]
            .iter()
            .position(|r| r.message_id.as_deref() == Some(marker.as_str()))
        {
            return seen + i;
        }
        seen = received.len();
        assert!(
            Instant::now() < deadline,
            "marker {marker} did not arrive through queue {queue} within 60 s (consumer error: {:?})",
            consumer.error()
        );
        consumer
            .wait_for(seen + 1, Duration::from_millis(500))
            .await;
    }
}

/// What an ACK check saw.
#[derive(Debug, Clone, Copy)]
pub struct Ack {
    /// The slot's confirmed_flush_lsn.
    pub confirmed: u64,
    /// Rows of transactions at or below it (all found in the queue).
    pub acknowledged_rows: usize,
}

/// The ACK invariant, at this moment: every row of each transaction ending at or below the
/// slot's confirmed_flush_lsn is in the queue. Panics naming the first row that is not.
pub async fn check_ack(
    client: &Client,
    slot: &str,
    oracle: &Oracle,
    consumer: &mut Consumer,
    amqp_url: &str,
    queue: &str,
) -> Ack {
    let confirmed = slot_confirmed_flush(client, slot).await;
    let marker = barrier(consumer, amqp_url, queue).await;
    let delivered: HashSet<&str> = ids_of(&consumer.received()[..marker]).into_iter().collect();
    let mut acknowledged_rows = 0;
    for txn in oracle.transactions(client).await {
        if txn.end_lsn > confirmed {
            continue;
        }
        for id in txn.inserted_ids(OUTBOX_TABLE) {
            assert!(
                delivered.contains(id.as_str()),
                "ACK violated: row {id} of the transaction ending at {} is acknowledged \
                 (confirmed_flush_lsn {}) but is not in the queue",
                super::pg::format_lsn(txn.end_lsn),
                super::pg::format_lsn(confirmed)
            );
            acknowledged_rows += 1;
        }
    }
    Ack {
        confirmed,
        acknowledged_rows,
    }
}

// ---------------------------------------------------------------------------------
// The relay

/// Starts `outbox-relay run` for `outbox`, with its own database and AMQP URLs (e.g. a
/// proxy's) and `extra` flags.
pub fn spawn_relay_via(
    outbox: &Outbox,
    db_url: &str,
    amqp_url: &str,
    extra: &[&str],
) -> RelayProcess {
    let mut args = vec![
        "run",
        "--database-url",
        db_url,
        "--amqp-url",
        amqp_url,
        "--slot",
        &outbox.slot,
        "--exchange",
        &outbox.exchange,
    ];
    args.extend_from_slice(extra);
    RelayProcess::spawn(&args, &[("RUST_LOG", "info,outbox_relay=debug")])
}

/// How many times `needle` occurs in the relay's log.
pub fn log_count(relay: &RelayProcess, needle: &str) -> usize {
    relay.log().matches(needle).count()
}

/// Waits until `needle` occurs at least `n` times in the relay's log; false after
/// `timeout` or if the relay exits first.
pub async fn wait_for_log_count(
    relay: &RelayProcess,
    needle: &str,
    n: usize,
    timeout: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let exited = relay.try_exit().is_some();
        if log_count(relay, needle) >= n {
            return true;
        }
        if exited || Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the relay logs when a session has started streaming.
pub const SESSION_STARTED: &str = " streaming slot=";

/// Sessions the relay has started so far.
pub fn sessions(relay: &RelayProcess) -> usize {
    log_count(relay, SESSION_STARTED)
}

/// Waits until the relay starts a session beyond the first `before`; how long that took.
pub async fn wait_new_session(
    relay: &RelayProcess,
    before: usize,
    timeout: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    wait_for_log_count(relay, SESSION_STARTED, before + 1, timeout)
        .await
        .then(|| started.elapsed())
}

/// The log lines containing `needle`, for reports.
pub fn log_lines(relay: &RelayProcess, needle: &str) -> Vec<String> {
    relay
        .log()
        .lines()
        .filter(|l| l.contains(needle))
        .map(String::from)
        .collect()
}

/// SIGTERM and wait for a clean exit.
pub async fn stop_relay(relay: &RelayProcess) {
    relay.sigterm();
    let status = relay
        .wait_exit(Duration::from_secs(45))
        .await
        .unwrap_or_else(|| {
            panic!(
                "relay did not exit within 45 s of SIGTERM; log:\n{}",
                relay.log()
            )
        });
    assert!(
        status.success(),
        "relay exit after SIGTERM: {status}; log:\n{}",
        relay.log()
    );
}

/// Inserts one probe row and waits until it arrives: how long the relay takes to deliver a
/// row written now. `None` if it did not arrive within `timeout`.
pub async fn probe(
    client: &Client,
    consumer: &mut Consumer,
    timeout: Duration,
) -> (String, Option<Duration>) {
    let started = Instant::now();
    let row = client
        .query_one(
            "INSERT INTO outbox (event_type, payload) VALUES ('Probe', '{}') RETURNING id::text",
            &[],
        )
        .await
        .expect("insert probe row");
    let id: String = row.get(0);
    let arrived = wait_for_ids(consumer, std::slice::from_ref(&id), timeout).await;
    (id, arrived.then(|| started.elapsed()))
}

// ---------------------------------------------------------------------------------
// Broker topology behind the relay's back

pub async fn unbind_queue(url: &str, queue: &str, exchange: &str, key: &str) {
    let connection = amqp_connect(url).await;
    let channel = connection.create_channel().await.expect("create channel");
    channel
        .queue_unbind(
            queue.into(),
            exchange.into(),
            key.into(),
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("unbind {queue} from {exchange}: {e:?}"));
    let _ = connection.close(200, "OK".into()).await;
}

pub async fn bind_queue(url: &str, queue: &str, exchange: &str, key: &str) {
    let connection = amqp_connect(url).await;
    let channel = connection.create_channel().await.expect("create channel");
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("bind {queue} to {exchange}: {e:?}"));
    let _ = connection.close(200, "OK".into()).await;
}

pub async fn delete_exchange(url: &str, exchange: &str) {
    let connection = amqp_connect(url).await;
    let channel = connection.create_channel().await.expect("create channel");
    channel
        .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
        .await
        .unwrap_or_else(|e| panic!("delete exchange {exchange}: {e:?}"));
    let _ = connection.close(200, "OK".into()).await;
}

/// Declares `exchange` as `setup` does: a durable topic exchange.
pub async fn declare_exchange(url: &str, exchange: &str) {
    let connection = amqp_connect(url).await;
    let channel = connection.create_channel().await.expect("create channel");
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("declare exchange {exchange}: {e:?}"));
    let _ = connection.close(200, "OK".into()).await;
}

// ---------------------------------------------------------------------------------
// Slots

/// `restart_lsn`, `wal_status` and `active_pid` of a slot.
pub async fn slot_state(
    client: &Client,
    slot: &str,
) -> Option<(Option<u64>, Option<String>, Option<i32>)> {
    let row = client
        .query_opt(
            "SELECT restart_lsn::text, wal_status, active_pid \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("query pg_replication_slots")?;
    let restart: Option<&str> = row.get(0);
    Some((restart.map(super::pg::parse_lsn), row.get(1), row.get(2)))
}

/// The figures one scenario prints (and docs/reliability.md collects).
pub fn report(scenario: &str, figures: &[(&str, String)]) {
    let text: Vec<String> = figures.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!("FIGURES {scenario}: {}", text.join(", "));
}

// ---------------------------------------------------------------------------------
// The relay's HTTP endpoints

/// `GET path` on the relay's `--metrics-addr` (127.0.0.1:`port`): status code and body.
/// `None` if nothing answers.
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        Some(String::from_utf8_lossy(&response).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()??;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// The value of an unlabelled sample `name` in Prometheus text, if present.
pub fn metric_value(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let value = rest.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// The sum of every sample of `name` (all label sets), if any.
pub fn metric_sum(metrics: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            if !(rest.starts_with(' ') || rest.starts_with('{')) {
                return None;
            }
            rest.rsplit(' ').next()?.trim().parse().ok()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

// ---------------------------------------------------------------------------------
// The slot gauges against PostgreSQL

/// The positions of one reading of a slot, by the test itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotReading {
    pub current: u64,
    pub confirmed_flush: u64,
    pub restart: u64,
}

impl SlotReading {
    pub async fn read(client: &Client, slot: &str) -> SlotReading {
        let row = client
            .query_one(
                "SELECT pg_current_wal_lsn()::text, confirmed_flush_lsn::text, restart_lsn::text \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .expect("read pg_replication_slots");
        SlotReading {
            current: super::pg::parse_lsn(row.get(0)),
            confirmed_flush: super::pg::parse_lsn(row.get(1)),
            restart: super::pg::parse_lsn(row.get(2)),
        }
    }
}

/// One scrape of the relay's slot gauges, checked against `pg_replication_slots`.
#[derive(Debug)]
pub struct SlotScrape {
    pub metrics: String,
    pub lag: i128,
    pub retained: i128,
    pub before: SlotReading,
    pub after: SlotReading,
}

/// Reads the slot (A), waits until the relay (`/metrics` on `port`) has finished two more
/// slot polls (so the second one started after A), scrapes, and reads the slot again (B).
/// Every position only grows, so the scraped slot lag must lie in
/// [A.current − B.confirmed_flush, B.current − A.confirmed_flush], and the retained WAL
/// likewise with restart_lsn: the values come from one poll of the same view, not from the
/// relay's own idea of its position.
pub async fn scrape_slot_gauges(client: &Client, slot: &str, port: u16) -> SlotScrape {
    let polls = |metrics: &str| metric_value(metrics, "outbox_relay_slot_polls_total");
    let scrape = || async {
        http_get(port, "/metrics")
            .await
            .expect("/metrics answers")
            .1
    };
    let before = SlotReading::read(client, slot).await;
    let start = polls(&scrape().await).unwrap_or(0.0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let metrics = scrape().await;
        if polls(&metrics).unwrap_or(0.0) >= start + 2.0 {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "the slot poller made no 2 polls in 30 s:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let after = SlotReading::read(client, slot).await;
    let gauge = |name: &str| -> i128 {
        metric_value(&metrics, name).unwrap_or_else(|| panic!("{name} missing in:\n{metrics}"))
            as i128
    };
    let lag = gauge("outbox_relay_slot_lag_bytes");
    let retained = gauge("outbox_relay_slot_retained_wal_bytes");
    let between = |value: i128, position: fn(&SlotReading) -> u64| {
        let low = before.current as i128 - position(&after) as i128;
        let high = after.current as i128 - position(&before) as i128;
        assert!(
            (low..=high).contains(&value),
            "{value} outside [{low}, {high}] ({before:?} .. {after:?})"
        );
    };
    between(lag, |r| r.confirmed_flush);
    between(retained, |r| r.restart);
    assert!(lag >= 0 && retained >= 0);
    SlotScrape {
        metrics,
        lag,
        retained,
        before,
        after,
    }
}
