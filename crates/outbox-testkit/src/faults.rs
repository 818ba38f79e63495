//! Fault-injection helpers for `tests/faults.rs` and the other fault-minded tests: writers
//! that outlive server crashes, the three invariants as oracles from outside the relay, a
//! queue barrier (and [`settled`], the barrier once the relay has confirmed everything), and
//! the slot gauges checked against `pg_replication_slots`. It must never
//! trust what the relay says about itself where an outside oracle can answer.
//!
//! - **L0**: every id the `test_decoding` oracle saw committed to the outbox arrived.
//! - **DUP**: how many arrivals were repeats ([`Tally::duplicates`]), against a stated bound.
//! - **ACK**: every row of each transaction ending at or below the slot's
//!   `confirmed_flush_lsn` is already in the queue ([`check_ack`]; under the dead-letter
//!   policy, in the queue or the dead-letter queue: [`check_ack_across`]). "Already" is
//!   exact: the slot position is read first, then a marker is published straight into the
//!   queue; rows the broker confirmed before the relay acknowledged that position were
//!   enqueued before the marker, so they must arrive before it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::{Client, NoTls};

use super::amqp::{publish_confirmed, Consumer, Received};
use super::http::metric_value;
use super::outbox::Outbox;
use super::pg::{read_test_decoding, slot_confirmed_flush, PgServer, Txn};
use super::rabbit::RabbitServer;
use super::rabbit_cluster::RabbitCluster;
use super::relay::RelayProcess;

/// The outbox table as `test_decoding` names it.
pub const OUTBOX_TABLE: &str = "public.outbox";

/// The relay's slot poller's metrics that [`scrape_slot_gauges`] reads (the kit does not link
/// the relay: `tests/layout.rs` checks each against the relay's own constant).
pub const SLOT_POLLS_TOTAL: &str = "outbox_relay_slot_polls_total";
pub const SLOT_LAG_BYTES: &str = "outbox_relay_slot_lag_bytes";
pub const SLOT_RETAINED_WAL_BYTES: &str = "outbox_relay_slot_retained_wal_bytes";

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
    tasks: Vec<JoinHandle<Vec<Commit>>>,
}

/// A transaction a writer committed: its rows, and (from [`Writers::start_noting_positions`])
/// a WAL position its commit record ends at or before: `pg_current_wal_lsn()` read on the
/// same connection once the COMMIT returned (with `synchronous_commit` on, the commit is
/// written by then). A physical standby has the same positions, so the bound still holds on
/// a promoted one. `None` when not asked for, or when the connection failed right after the
/// COMMIT.
#[derive(Debug, Clone)]
pub struct Commit {
    pub ids: Vec<String>,
    pub ended_by: Option<u64>,
}

/// How long [`Writers::stop`] waits for a writer's statement in flight.
const WRITER_STOP_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a writer waits before it tries again after a failure: a server down or a
/// statement refused (the table renamed away) must not make it spin.
const WRITER_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Where [`Writers`] insert: the outbox table, unless told otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteTo {
    /// The table, as SQL names it (`outbox`, or the outbox under another name).
    pub table: String,
    /// Every row's `exchange` column; `None` leaves the column out (the default exchange,
    /// and tables without the column).
    pub exchange: Option<String>,
}

impl Default for WriteTo {
    fn default() -> WriteTo {
        WriteTo {
            table: "outbox".into(),
            exchange: None,
        }
    }
}

impl WriteTo {
    fn insert_sql(&self) -> String {
        let table = &self.table;
        match &self.exchange {
            None => format!(
                "INSERT INTO {table} (event_type, payload) \
                 VALUES ('FaultEvent', $1::text::jsonb) RETURNING id::text"
            ),
            Some(exchange) => format!(
                "INSERT INTO {table} (event_type, payload, exchange) \
                 VALUES ('FaultEvent', $1::text::jsonb, '{}') RETURNING id::text",
                exchange.replace('\'', "''")
            ),
        }
    }
}

impl Writers {
    /// Starts `writers` connections; each pauses `pause` between transactions.
    pub fn start(db_url: &str, writers: usize, max_txn_rows: usize, pause: Duration) -> Writers {
        Self::start_with(
            db_url,
            &WriteTo::default(),
            writers,
            max_txn_rows,
            pause,
            false,
        )
    }

    /// [`Self::start`], each writer also reading the WAL position after each COMMIT (one
    /// more round trip per transaction): the ACK check of [`check_ack_of_commits`], which
    /// needs no `test_decoding` slot and so survives any number of promotions.
    pub fn start_noting_positions(
        db_url: &str,
        writers: usize,
        max_txn_rows: usize,
        pause: Duration,
    ) -> Writers {
        Self::start_noting_positions_to(db_url, &WriteTo::default(), writers, max_txn_rows, pause)
    }

    /// [`Self::start_noting_positions`] into `to`: another table name, or rows routed to
    /// another exchange.
    pub fn start_noting_positions_to(
        db_url: &str,
        to: &WriteTo,
        writers: usize,
        max_txn_rows: usize,
        pause: Duration,
    ) -> Writers {
        Self::start_with(db_url, to, writers, max_txn_rows, pause, true)
    }

    fn start_with(
        db_url: &str,
        to: &WriteTo,
        writers: usize,
        max_txn_rows: usize,
        pause: Duration,
        note_positions: bool,
    ) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicUsize::new(0));
        let insert = Arc::new(to.insert_sql());
        let tasks = (0..writers)
            .map(|writer| {
                let db_url = db_url.to_string();
                let stop = stop.clone();
                let committed = committed.clone();
                let insert = insert.clone();
                let shape = Shape {
                    writer,
                    max_txn_rows,
                    pause,
                    note_positions,
                };
                tokio::spawn(async move {
                    write_until_stopped(&db_url, &insert, shape, &stop, &committed).await
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

    /// Stops the writers and returns the ids whose COMMIT returned. Panics if a writer is
    /// still waiting on its server after [`WRITER_STOP_TIMEOUT`] (a server that vanished
    /// without a timeout to notice it): a test fails rather than hangs.
    pub async fn stop(self) -> Vec<String> {
        let commits = self.stop_with_commits().await;
        commits.into_iter().flat_map(|c| c.ids).collect()
    }

    /// [`Self::stop`], by transaction, with the positions if noted.
    pub async fn stop_with_commits(self) -> Vec<Commit> {
        let by_writer = self.stop_with_commits_by_writer().await;
        by_writer.into_iter().flatten().collect()
    }

    /// [`Self::stop_with_commits`], each writer's commits apart, in the order it made them:
    /// a writer begins its next transaction only once its COMMIT returned, so that is their
    /// commit order.
    pub async fn stop_with_commits_by_writer(self) -> Vec<Vec<Commit>> {
        self.stop.store(true, Ordering::Relaxed);
        let mut by_writer = Vec::new();
        for task in self.tasks {
            let done = tokio::time::timeout(WRITER_STOP_TIMEOUT, task).await;
            let done = done.unwrap_or_else(|_| {
                panic!(
                    "a writer still waits on its server {WRITER_STOP_TIMEOUT:?} after the stop: \
                     its connection needs a timeout for a server that vanished"
                )
            });
            by_writer.push(done.expect("writer task"));
        }
        by_writer
    }
}

/// One writer: who it is and what it writes.
#[derive(Clone, Copy)]
struct Shape {
    writer: usize,
    max_txn_rows: usize,
    pause: Duration,
    note_positions: bool,
}

async fn write_until_stopped(
    db_url: &str,
    insert: &str,
    shape: Shape,
    stop: &AtomicBool,
    committed: &AtomicUsize,
) -> Vec<Commit> {
    let Shape {
        writer,
        max_txn_rows,
        pause,
        note_positions,
    } = shape;
    let mut commits: Vec<Commit> = Vec::new();
    let mut written = 0;
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
                tokio::time::sleep(WRITER_RETRY_PAUSE).await;
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
                let payload = format!(r#"{{"writer": {writer}, "n": {}}}"#, written + rows.len());
                match txn.query_one(insert, &[&payload]).await {
                    Ok(row) => rows.push(row.get::<_, String>(0)),
                    Err(_) => {
                        // A refused statement (the table renamed away) comes back at once:
                        // the reconnect must not spin on it.
                        tokio::time::sleep(WRITER_RETRY_PAUSE).await;
                        continue 'connect;
                    }
                }
            }
            if txn.commit().await.is_err() {
                continue 'connect;
            }
            committed.fetch_add(rows.len(), Ordering::Relaxed);
            written += rows.len();
            let ended_by = if note_positions {
                let lsn = client
                    .query_one("SELECT pg_current_wal_lsn()::text", &[])
                    .await;
                lsn.ok().map(|row| super::pg::parse_lsn(row.get(0)))
            } else {
                None
            };
            commits.push(Commit {
                ids: rows,
                ended_by,
            });
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
    }
    commits
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

/// The setup most fault scenarios share: an outbox on `pg` and `rabbit`, its oracle created
/// before any row is written, and a consumer of its queue (keeping bodies and headers only
/// with `keep_content`).
pub async fn observed_outbox(
    pg: &PgServer,
    rabbit: &RabbitServer,
    prefix: &str,
    keep_content: bool,
) -> (Outbox, Oracle, Consumer) {
    let outbox = Outbox::on(&pg.url("postgres"), &rabbit.url(), prefix).await;
    let oracle = Oracle::create(&outbox).await;
    let consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, keep_content).await;
    (outbox, oracle, consumer)
}

/// An outbox on the PostgreSQL server of `server_url` whose queue is a quorum queue of
/// `cluster` led by node `leader` (it declares the queue; asserted), provisioned with
/// `outbox-relay <setup…>`, its oracle created before any row is written. Its `amqp_url` is
/// node `leader`'s. Needs a multi-threaded runtime (it waits for the leader blocking).
pub async fn quorum_outbox(
    server_url: &str,
    cluster: &RabbitCluster,
    leader: usize,
    prefix: &str,
    setup: &[&str],
) -> (Outbox, Oracle) {
    let url = cluster.url(leader);
    let arguments = super::amqp::quorum_queue_arguments();
    let outbox = Outbox::provision(server_url, &url, prefix, setup, arguments).await;
    let oracle = Oracle::create(&outbox).await;
    let led_by = tokio::task::block_in_place(|| cluster.quorum_leader(&outbox.queue));
    assert_eq!(
        led_by, leader,
        "a quorum queue is led by its declaring node"
    );
    (outbox, oracle)
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
        Tally::of_ids(received.iter().map(|r| {
            r.message_id
                .as_deref()
                .expect("every message has a message_id")
        }))
    }

    /// The tally of message ids in arrival order (a stream's, read from offset 0).
    pub fn of_ids<'a>(ids: impl IntoIterator<Item = &'a str>) -> Tally {
        let mut counts = HashMap::new();
        for id in ids {
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

/// L0 on a drained queue: every committed id arrived, and nothing arrived that never
/// committed.
pub fn assert_nothing_lost_or_invented(tally: &Tally, committed: &[String]) {
    assert!(
        tally.lost(committed).is_empty(),
        "L0: lost {:?}",
        tally.lost(committed)
    );
    assert!(
        tally.unknown(committed).is_empty(),
        "messages for rows that never committed: {:?}",
        tally.unknown(committed)
    );
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

/// Waits until `n` messages have arrived (or `timeout` passed) and returns the highest
/// arrival rate seen over a quarter of a second on the way (at least the average), per
/// second: what the relay can have acknowledged in a moment, which the average understates.
pub async fn peak_rate_until(consumer: &mut Consumer, n: usize, timeout: Duration) -> f64 {
    peak_combined_rate_until(&mut [consumer], n, timeout).await
}

/// [`peak_rate_until`] over several queues at once (the outbox's queue and a dead-letter
/// queue): waits until `n` messages have arrived on them together and returns the highest
/// combined arrival rate over a quarter of a second, per second.
pub async fn peak_combined_rate_until(
    consumers: &mut [&mut Consumer],
    n: usize,
    timeout: Duration,
) -> f64 {
    const SPAN: Duration = Duration::from_millis(250);
    const TICK: Duration = Duration::from_millis(20);
    let count = |consumers: &mut [&mut Consumer]| -> usize {
        consumers.iter_mut().map(|c| c.received().len()).sum()
    };
    let started = Instant::now();
    let first = count(consumers);
    let mut samples = std::collections::VecDeque::from([(started, first)]);
    let mut peak: f64 = 0.0;
    while count(consumers) < n && started.elapsed() < timeout {
        match consumers {
            // One queue: wake on its next delivery.
            [only] => {
                only.wait_for(n, TICK).await;
            }
            _ => tokio::time::sleep(TICK).await,
        }
        let total = count(consumers);
        let now = Instant::now();
        samples.push_back((now, total));
        while samples.len() > 2 && now - samples[1].0 >= SPAN {
            samples.pop_front();
        }
        let (since, before) = samples[0];
        if now - since >= SPAN {
            peak = peak.max((total - before) as f64 / (now - since).as_secs_f64());
        }
    }
    let average = (count(consumers) - first) as f64 / started.elapsed().as_secs_f64();
    peak.max(average)
}

// ---------------------------------------------------------------------------------
// Barrier and ACK invariant

/// Publishes a marker straight into `queue` (default exchange, bypassing the relay's
/// exchange and bindings) and waits until `consumer` has it. Everything the queue held
/// before the marker has then arrived. Returns the marker's index in
/// `consumer.received()`.
pub async fn barrier(consumer: &mut Consumer, amqp_url: &str, queue: &str) -> usize {
    marker_arrival(consumer, amqp_url, queue)
        .await
        .unwrap_or_else(|missing| panic!("{missing}"))
}

/// How long [`barrier`] and [`settled`] wait for their marker, and [`settled`] for a slot or
/// a table.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// [`barrier`]: the marker's index, or what did not arrive.
async fn marker_arrival(
    consumer: &mut Consumer,
    amqp_url: &str,
    queue: &str,
) -> Result<usize, String> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let marker = format!(
        "{MARKER_PREFIX}{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    publish_confirmed(amqp_url, "", queue, &[(marker.as_str(), b"")]).await;
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let mut seen = 0;
    loop {
        let received = consumer.received();
        if let Some(i) = received[seen..]
            .iter()
            .position(|r| r.message_id.as_deref() == Some(marker.as_str()))
        {
            return Ok(seen + i);
        }
        seen = received.len();
        if Instant::now() >= deadline {
            return Err(format!(
                "marker {marker} did not arrive through queue {queue} within {SETTLE_TIMEOUT:?} \
                 ({seen} messages before it; consumer error: {:?})",
                consumer.error()
            ));
        }
        consumer
            .wait_for(seen + 1, Duration::from_millis(500))
            .await;
    }
}

/// What [`settled`] waits for before its marker: the event after which the relay has nothing
/// unconfirmed left of what the test wrote.
pub enum Upto<'a> {
    /// WAL mode (the table-less outbox too): each of these slots, on `client`'s server, has
    /// confirmed the WAL end read when the wait begins. The relay acknowledges a position only
    /// once the broker confirmed every message before it (a repeat after a restart as well),
    /// and it advances an idle slot past other databases' writes.
    Slots(&'a Client, Vec<String>),
    /// Polling mode: the count `sql` returns (of the rows not yet marked sent, or not yet
    /// deleted under `--on-published delete`) is 0. A worker marks or deletes a row only once
    /// the broker confirmed it.
    Unsent(&'a Client, &'a str),
    /// The publisher is gone already: a relay that has exited (stopped, refused to start, or
    /// held at a row it could not deliver), or a command such as `resync` that ran to
    /// completion. What it had confirmed is in the queue; it publishes nothing more.
    Done,
}

impl<'a> Upto<'a> {
    /// [`Upto::Slots`] for the outbox's own slot.
    pub fn slot(outbox: &'a Outbox) -> Upto<'a> {
        Upto::Slots(&outbox.client, vec![outbox.slot.clone()])
    }
}

/// Waits for the event `upto` names, then publishes a marker straight into `queue` and waits
/// until `consumer` has it ([`barrier`]): every message the relay will deliver of what the
/// test wrote, and any repeat of one, is then in `consumer`'s list. That is an event, not a
/// silence: once a slot is at the WAL end (or the rows are marked), the broker confirmed each
/// of those messages before the marker was published, so the queue holds them ahead of it.
///
/// Returns what arrived before the marker. The marker itself is taken out of the list
/// ([`Consumer::remove`]), so later counts and [`Consumer::wait_for`] see the relay's messages
/// only. Panics naming what is missing (the slot with the position it reached and the
/// target, the unsent rows, or the marker), with `log()` (the relay's log, where there is
/// one) appended.
pub async fn settled<'c>(
    consumer: &'c mut Consumer,
    amqp_url: &str,
    queue: &str,
    upto: Upto<'_>,
    log: impl Fn() -> String,
) -> &'c [Received] {
    match upto {
        Upto::Slots(client, slots) => {
            let target = super::pg::current_wal_lsn(client).await;
            for slot in &slots {
                let waited =
                    super::outbox::wait_slot_confirmed_flush(client, slot, target, SETTLE_TIMEOUT)
                        .await;
                if let Err(reached) = waited {
                    panic!(
                        "slot {slot} did not confirm the WAL end within {SETTLE_TIMEOUT:?}: \
                         confirmed_flush_lsn {} of {} ({} messages in queue {queue} so far); \
                         log:\n{}",
                        super::pg::format_lsn(reached),
                        super::pg::format_lsn(target),
                        consumer.received().len(),
                        log()
                    );
                }
            }
        }
        Upto::Unsent(client, sql) => {
            let waited = super::pg::wait_count(client, sql, SETTLE_TIMEOUT, |n| n == 0).await;
            if let Err(unsent) = waited {
                panic!(
                    "{unsent} rows still unsent after {SETTLE_TIMEOUT:?} ({sql}); {} messages \
                     in queue {queue} so far; log:\n{}",
                    consumer.received().len(),
                    log()
                );
            }
        }
        Upto::Done => {}
    }
    let marker = match marker_arrival(consumer, amqp_url, queue).await {
        Ok(marker) => marker,
        Err(missing) => panic!("{missing}; log:\n{}", log()),
    };
    consumer.remove(marker);
    &consumer.received()[..marker]
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
/// `client` reads the slot and the oracle (the outbox's own may have died with its server).
pub async fn check_ack(
    client: &Client,
    outbox: &Outbox,
    oracle: &Oracle,
    consumer: &mut Consumer,
) -> Ack {
    let queue = outbox.queue.clone();
    check_ack_across(client, outbox, oracle, &mut [(queue.as_str(), consumer)]).await
}

/// [`check_ack`] for rows that go to more than one queue (under the dead-letter policy the
/// unroutable ones reach a dead-letter queue instead): every row of each transaction ending at
/// or below the slot's confirmed_flush_lsn is in one of `queues` (each a queue's name and its
/// consumer), before a barrier through each published after reading the slot. Which queue a
/// row belongs in is the caller's check.
pub async fn check_ack_across(
    client: &Client,
    outbox: &Outbox,
    oracle: &Oracle,
    queues: &mut [(&str, &mut Consumer)],
) -> Ack {
    let in_queue = match queues {
        [_] => "the queue",
        _ => "any of the queues",
    };
    match ack_verdict(client, outbox, oracle, queues).await {
        Ok(ack) => ack,
        Err(violation) => panic!("{violation} but is not in {in_queue}"),
    }
}

/// What [`check_ack_across`] checks, as a verdict instead of a panic: a negative control
/// expects the violation.
pub async fn ack_verdict(
    client: &Client,
    outbox: &Outbox,
    oracle: &Oracle,
    queues: &mut [(&str, &mut Consumer)],
) -> Result<Ack, AckViolation> {
    let confirmed = slot_confirmed_flush(client, &outbox.slot).await;
    let mut delivered = HashSet::new();
    for (queue, consumer) in queues.iter_mut() {
        delivered.extend(delivered_before_barrier(consumer, &outbox.amqp_url, queue).await);
    }
    let transactions = oracle.transactions(client).await;
    let ended = transactions
        .iter()
        .map(|txn| (Some(txn.end_lsn), txn.inserted_ids(OUTBOX_TABLE)));
    let acknowledged_rows = acknowledged_rows_delivered(confirmed, ended, &delivered)?;
    Ok(Ack {
        confirmed,
        acknowledged_rows,
    })
}

/// A row the slot acknowledged that the queue does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckViolation {
    pub id: String,
    /// Where its transaction ended, or a position at or after that.
    pub ended_by: u64,
    /// The slot's confirmed_flush_lsn.
    pub confirmed: u64,
}

impl std::fmt::Display for AckViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ACK violated: row {} of a transaction ending at or before {} is acknowledged \
             (confirmed_flush_lsn {})",
            self.id,
            super::pg::format_lsn(self.ended_by),
            super::pg::format_lsn(self.confirmed)
        )
    }
}

/// The ACK comparison on plain data: every id of each transaction that ended at or before a
/// position at or below `confirmed` (the slot's confirmed_flush_lsn) is in `delivered`.
/// `transactions` are each a position at or after the transaction's end (`None`: not known,
/// not checked) and its ids. The number of acknowledged rows checked, or the first that is
/// missing.
pub fn acknowledged_rows_delivered<I, S>(
    confirmed: u64,
    transactions: impl IntoIterator<Item = (Option<u64>, I)>,
    delivered: &HashSet<String>,
) -> Result<usize, AckViolation>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut acknowledged_rows = 0;
    for (ended_by, ids) in transactions {
        let Some(ended_by) = ended_by.filter(|at| *at <= confirmed) else {
            continue;
        };
        for id in ids {
            let id = id.as_ref();
            if !delivered.contains(id) {
                return Err(AckViolation {
                    id: id.to_string(),
                    ended_by,
                    confirmed,
                });
            }
            acknowledged_rows += 1;
        }
    }
    Ok(acknowledged_rows)
}

/// ACK at readings taken while faults ran: each reading is the slot's confirmed_flush_lsn,
/// read, and then a marker (its id) published straight into the queue. Every row of each
/// commit whose noted end is at or below a reading must have arrived before that reading's
/// marker: the broker had confirmed it before the relay acknowledged, so the queue held it
/// before the marker. `arrivals` are the queue's message ids in arrival order, markers
/// included; a reading whose marker never arrived (its node was cut off) is not checked, nor
/// a commit whose end was not noted. The number of readings checked, or the first violation.
pub fn acks_before_markers(
    commits: &[Commit],
    arrivals: &[&str],
    readings: &[(String, u64)],
) -> Result<usize, AckViolation> {
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (at, id) in arrivals.iter().enumerate() {
        first.entry(id).or_insert(at);
    }
    // Each commit's latest first arrival (never: usize::MAX) and the row that has it, by end.
    let mut by_end: Vec<(u64, usize, &str)> = commits
        .iter()
        .filter_map(|commit| {
            let ended_by = commit.ended_by?;
            let (latest, id) = commit
                .ids
                .iter()
                .map(|id| (first.get(id.as_str()).copied().unwrap_or(usize::MAX), id))
                .max()?;
            Some((ended_by, latest, id.as_str()))
        })
        .collect();
    by_end.sort_unstable();
    // The worst arrival among the commits up to each one, in order of their ends.
    let mut worst_so_far: Vec<(usize, u64, &str)> = Vec::with_capacity(by_end.len());
    for &(ended_by, latest, id) in &by_end {
        let worst = match worst_so_far.last() {
            Some(&worst) if worst.0 >= latest => worst,
            _ => (latest, ended_by, id),
        };
        worst_so_far.push(worst);
    }
    let mut checked = 0;
    for (marker, confirmed) in readings {
        let Some(&marker_at) = first.get(marker.as_str()) else {
            continue;
        };
        checked += 1;
        let acknowledged = by_end.partition_point(|&(ended_by, ..)| ended_by <= *confirmed);
        let Some(&(latest, ended_by, id)) = acknowledged
            .checked_sub(1)
            .and_then(|last| worst_so_far.get(last))
        else {
            continue;
        };
        if latest > marker_at {
            return Err(AckViolation {
                id: id.to_string(),
                ended_by,
                confirmed: *confirmed,
            });
        }
    }
    Ok(checked)
}

/// The slot's confirmed_flush_lsn, then every id in the queue before a barrier published
/// after reading it: what the ACK checks compare.
async fn acknowledged_and_delivered(
    client: &Client,
    outbox: &Outbox,
    consumer: &mut Consumer,
) -> (u64, HashSet<String>) {
    let confirmed = slot_confirmed_flush(client, &outbox.slot).await;
    let delivered = delivered_before_barrier(consumer, &outbox.amqp_url, &outbox.queue).await;
    (confirmed, delivered)
}

/// Every id `consumer` received from `queue` before a barrier published now.
async fn delivered_before_barrier(
    consumer: &mut Consumer,
    amqp_url: &str,
    queue: &str,
) -> HashSet<String> {
    let marker = barrier(consumer, amqp_url, queue).await;
    ids_of(&consumer.received()[..marker])
        .into_iter()
        .map(String::from)
        .collect()
}

/// The ACK invariant as [`check_ack`] checks it, with the writers' own record of where
/// each transaction ended ([`Writers::start_noting_positions`]) instead of a `test_decoding`
/// slot: every row of a transaction whose noted position is at or below the slot's
/// confirmed_flush_lsn is in the queue (its commit ended at or before that position, so the
/// relay acknowledged it). `commits` are those whose rows `client`'s server has (a commit
/// lost with a crashed primary was never the new one's to deliver). Weaker only in what it
/// leaves out: a transaction whose position was not read is not checked.
pub async fn check_ack_of_commits(
    client: &Client,
    outbox: &Outbox,
    commits: &[Commit],
    consumer: &mut Consumer,
) -> Ack {
    let (confirmed, delivered) = acknowledged_and_delivered(client, outbox, consumer).await;
    let ended = commits.iter().map(|commit| (commit.ended_by, &commit.ids));
    match acknowledged_rows_delivered(confirmed, ended, &delivered) {
        Ok(acknowledged_rows) => Ack {
            confirmed,
            acknowledged_rows,
        },
        Err(violation) => panic!("{violation} but is not in the queue"),
    }
}

// ---------------------------------------------------------------------------------
// Probing

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

/// [`probe`] that must arrive: how long it took. Panics with the log, saying what the
/// delivery came `after`, if it does not arrive within `timeout`.
pub async fn delivered_after(
    relay: &RelayProcess,
    client: &Client,
    consumer: &mut Consumer,
    timeout: Duration,
    after: &str,
) -> Duration {
    let (_, latency) = probe(client, consumer, timeout).await;
    latency.unwrap_or_else(|| panic!("no delivery after {after}; log:\n{}", relay.log()))
}

/// Polling mode: the ids of the rows not yet marked published.
pub async fn unsent_ids(client: &Client) -> HashSet<String> {
    let sql = "SELECT id::text FROM outbox WHERE published_at IS NULL";
    super::pg::first_column(client, sql, &[])
        .await
        .into_iter()
        .collect()
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

/// The end of a scenario: with every committed row arrived and the relay stopped, check ACK,
/// drain the queue through a marker and count. Returns (committed, tally).
pub async fn finish(
    client: &Client,
    outbox: &Outbox,
    oracle: &Oracle,
    consumer: &mut Consumer,
    relay: &RelayProcess,
) -> (Vec<String>, Tally) {
    let committed = oracle.committed_ids(client).await;
    assert!(
        wait_for_ids(consumer, &committed, Duration::from_secs(180)).await,
        "L0: {} of {} committed rows arrived; log:\n{}",
        committed.len() - Tally::of(consumer.received()).lost(&committed).len(),
        committed.len(),
        relay.log()
    );
    relay.stop().await;
    check_ack(client, outbox, oracle, consumer).await;
    let tally = Tally::of(consumer.received());
    assert_nothing_lost_or_invented(&tally, &committed);
    (committed, tally)
}

/// The most duplicates one relay crash (kill -9) may cause, docs/reliability.md "Duplicate
/// bounds": the window, what was confirmed but not yet reported to PostgreSQL, and the open
/// transaction's confirmed rows. A confirm reaches PostgreSQL once the status interval has
/// passed since the previous report, after the confirm barrier's round trip and the reader's
/// wake-up; on a loaded 2-core machine those took up to a few tens of milliseconds (one run:
/// 126 ms from confirm to report), so the report lag allowed is twice the interval.
pub fn relay_crash_duplicate_bound(
    window: usize,
    rate_per_sec: f64,
    status_interval: Duration,
    open_transaction_rows: usize,
) -> usize {
    let unreported = rate_per_sec * 2.0 * status_interval.as_secs_f64();
    window + unreported.ceil() as usize + open_transaction_rows
}

/// A duration for a report: `1.2 s`.
pub fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The figures one scenario prints (and crates/outbox-bench/lab/scenarios.md collects).
pub fn report(scenario: &str, figures: &[(&str, String)]) {
    let text: Vec<String> = figures.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!("FIGURES {scenario}: {}", text.join(", "));
}

/// [`report`] for a scenario that ran to a full tally: rows, lost (0: the tally was checked)
/// and duplicates first, then the scenario's own `figures`.
pub fn report_tally(
    scenario: &str,
    committed: &[String],
    tally: &Tally,
    figures: &[(&str, String)],
) {
    let mut all = vec![
        ("rows", committed.len().to_string()),
        ("lost", "0".to_string()),
        ("duplicates", tally.duplicates().to_string()),
    ];
    all.extend(figures.iter().cloned());
    report(scenario, &all);
}

/// Nothing acknowledged as far as the transaction of row `id` (`what` says which row that
/// is): the slot's `confirmed_flush_lsn` is still before that transaction's end.
pub async fn assert_not_acknowledged(outbox: &Outbox, oracle: &Oracle, id: &str, what: &str) {
    let txn = oracle.transaction_of(&outbox.client, id).await;
    let confirmed = outbox.confirmed_flush().await;
    assert!(
        confirmed < txn.end_lsn,
        "acknowledged {} past {what} {id} (its transaction ends at {})",
        super::pg::format_lsn(confirmed),
        super::pg::format_lsn(txn.end_lsn)
    );
}

/// Waits until the slot acknowledges the transaction of row `id`: the relay moved past
/// everything before it. Panics with the log otherwise.
pub async fn assert_acknowledged(
    outbox: &Outbox,
    oracle: &Oracle,
    relay: &RelayProcess,
    id: &str,
    timeout: Duration,
) {
    let txn = oracle.transaction_of(&outbox.client, id).await;
    assert!(
        outbox.wait_confirmed_flush(txn.end_lsn, timeout).await,
        "the slot does not reach {}, the end of row {id}'s transaction; log:\n{}",
        super::pg::format_lsn(txn.end_lsn),
        relay.log()
    );
}

/// The relay holds on message `id`, which the broker returns: it logged the return twice
/// (returned, retried with a window of 1 and returned again) and `/readyz` on `port` names it.
pub async fn assert_stuck_on_returned(relay: &RelayProcess, port: u16, id: &str) {
    assert_returned(relay, id, 2, Duration::from_secs(60)).await;
    assert_eq!(
        super::http::readyz(port).await,
        (503, format!("stuck message {id}"))
    );
}

/// Waits until the relay has logged `times` returns of message `id` (returned as unroutable,
/// then retried and returned again); panics with the log otherwise.
pub async fn assert_returned(relay: &RelayProcess, id: &str, times: usize, timeout: Duration) {
    assert!(
        relay
            .wait_for_log_count(&format!("returned message {id}"), times, timeout)
            .await,
        "message {id} was not returned {times} time(s); log:\n{}",
        relay.log()
    );
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
    let polls = |metrics: &str| metric_value(metrics, SLOT_POLLS_TOTAL);
    let scrape = || super::http::metrics(port);
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
    let lag = gauge(SLOT_LAG_BYTES);
    let retained = gauge(SLOT_RETAINED_WAL_BYTES);
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
    assert!(
        lag >= 0 && retained >= 0,
        "negative slot gauges: lag {lag}, retained {retained} ({before:?} .. {after:?})"
    );
    SlotScrape {
        metrics,
        lag,
        retained,
        before,
        after,
    }
}

// ---------------------------------------------------------------------------------
// Returns at full speed

/// Rows of the returns stress tests (`OUTBOX_TEST_STRESS_ROWS` overrides).
pub fn stress_rows() -> usize {
    std::env::var("OUTBOX_TEST_STRESS_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// Rows per transaction of a seeded backlog ([`seed_backlog`]).
pub const SEED_TXN_ROWS: usize = 1_000;

/// Commits `rows` rows in transactions of 1,000, one in a hundred of them unroutable
/// (`Nobody.…`), before any relay runs: the relay then drains them at full speed with a full
/// window and the broker folding acks. Returns (routable ids, unroutable ids).
pub async fn seed_one_percent_unroutable(
    outbox: &Outbox,
    rows: usize,
) -> (Vec<String>, Vec<String>) {
    seed_backlog(outbox, rows, Some(100)).await
}

/// Commits `rows` rows in transactions of [`SEED_TXN_ROWS`] before any relay runs; with
/// `unroutable_every` one row in that many is unroutable (`Nobody.…`), else all are
/// `Good.stress`. Returns (routable ids, unroutable ids).
pub async fn seed_backlog(
    outbox: &Outbox,
    rows: usize,
    unroutable_every: Option<i64>,
) -> (Vec<String>, Vec<String>) {
    let (mut good, mut unroutable) = (Vec::new(), Vec::new());
    let every = unroutable_every.unwrap_or(0);
    for start in (0..rows).step_by(SEED_TXN_ROWS) {
        let end = (start + SEED_TXN_ROWS).min(rows) as i64;
        let inserted = outbox
            .client
            .query(
                "INSERT INTO outbox (event_type, payload) \
                 SELECT CASE WHEN $3::bigint = 0 THEN 'Good.stress' \
                             WHEN g % $3::bigint = 37 % $3::bigint THEN 'Nobody.stress' \
                             ELSE 'Good.stress' END, \
                        jsonb_build_object('g', g) \
                 FROM generate_series($1::bigint, $2::bigint - 1) AS g \
                 RETURNING id::text, event_type",
                &[&(start as i64), &end, &every],
            )
            .await
            .expect("seed the backlog");
        for row in inserted {
            let (id, event_type): (String, String) = (row.get(0), row.get(1));
            match event_type.as_str() {
                "Good.stress" => good.push(id),
                _ => unroutable.push(id),
            }
        }
    }
    (good, unroutable)
}

/// Waits until a returns stress drain under the dead-letter policy is complete, and checks it:
/// every `unroutable` row dead-lettered once with reason `unroutable: NO_ROUTE 312 …`, every
/// `good` row once in the outbox queue and none of the unroutable ones there, the slot past
/// the last row. Panics with the relay's log otherwise.
pub async fn assert_stress_dead_lettered(
    outbox: &Outbox,
    oracle: &Oracle,
    relay: &RelayProcess,
    (consumer, dead_letters): (&mut Consumer, &mut Consumer),
    (good, unroutable): (&[String], &[String]),
) {
    let five_minutes = Duration::from_secs(300);
    assert!(
        wait_for_ids(dead_letters, unroutable, five_minutes).await,
        "every unroutable row dead-lettered; log:\n{}",
        relay.log()
    );
    assert!(
        wait_for_ids(consumer, good, five_minutes).await,
        "every routable row delivered; log:\n{}",
        relay.log()
    );
    let last = oracle
        .committed_ids(&outbox.client)
        .await
        .last()
        .cloned()
        .expect("rows committed");
    assert_acknowledged(outbox, oracle, relay, &last, Duration::from_secs(60)).await;
    let unroutable_set: HashSet<&str> = unroutable.iter().map(String::as_str).collect();
    let delivered = ids_of(consumer.received());
    assert!(
        delivered.iter().all(|id| !unroutable_set.contains(id)),
        "an unroutable row reached the outbox queue"
    );
    assert_eq!(delivered.len(), good.len(), "no routable row twice");
    let letters = dead_letters.received();
    assert_eq!(letters.len(), unroutable.len(), "no dead letter twice");
    // (message id, reason) of each dead letter whose reason is not NO_ROUTE.
    let other: Vec<(Option<&str>, Option<&str>)> = letters
        .iter()
        .map(|letter| {
            let reason = letter.header_str("x-outbox-dead-letter-reason");
            (letter.message_id.as_deref(), reason)
        })
        .filter(|(_, reason)| !reason.is_some_and(|r| r.starts_with("unroutable: NO_ROUTE 312")))
        .collect();
    assert!(
        other.is_empty(),
        "dead letters without the reason \"unroutable: NO_ROUTE 312\" (id, reason): {other:?}"
    );
}

/// Checks a returns stress drain under `halt` (rows seeded by [`seed_one_percent_unroutable`],
/// `relay` and its metrics `port` started on them): the relay stops at the first unroutable
/// row in commit order, whatever the broker batched, and names it; every row before it is
/// delivered; the slot does not pass it, also after more retries. Prints the figures as
/// `scenario`. Panics with the log otherwise.
pub async fn assert_stress_halted(
    outbox: &Outbox,
    oracle: &Oracle,
    (relay, port): (&RelayProcess, u16),
    consumer: &mut Consumer,
    unroutable: &[String],
    scenario: &str,
) {
    let minute = Duration::from_secs(60);
    let unroutable: HashSet<&str> = unroutable.iter().map(String::as_str).collect();
    let committed = oracle.committed_ids(&outbox.client).await;
    let first_stop = committed
        .iter()
        .position(|id| unroutable.contains(id.as_str()))
        .expect("an unroutable row");
    let first = committed[first_stop].clone();
    assert_stuck_on_returned(relay, port, &first).await;
    assert!(
        wait_for_ids(consumer, &committed[..first_stop], minute).await,
        "every row before the first unroutable one is delivered; log:\n{}",
        relay.log()
    );
    assert_not_acknowledged(outbox, oracle, &first, "the first unroutable row").await;
    // Still not past it after more retries.
    assert_returned(relay, &first, 3, minute).await;
    assert_not_acknowledged(outbox, oracle, &first, "the first unroutable row").await;
    report(
        scenario,
        &[
            ("rows", committed.len().to_string()),
            ("unroutable", unroutable.len().to_string()),
            ("stopped at row", (first_stop + 1).to_string()),
            (
                "in the queue (published ahead of the return, not acknowledged)",
                consumer.received().len().to_string(),
            ),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(id: &str) -> Received {
        Received {
            body: Vec::new(),
            message_id: Some(id.into()),
            kind: None,
            exchange: "outbox".into(),
            routing_key: "Created".into(),
            headers: Default::default(),
            timestamp: None,
            content_type: None,
            delivery_mode: Some(2),
            redelivered: false,
        }
    }

    fn strings(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|id| id.to_string()).collect()
    }

    #[test]
    fn a_tally_names_the_lost_the_invented_and_counts_the_repeats_but_not_the_markers() {
        let marker = format!("{MARKER_PREFIX}1");
        let arrived: Vec<Received> = ["a", "b", "b", marker.as_str(), "x", "b", "a"]
            .into_iter()
            .map(received)
            .collect();
        let tally = Tally::of(&arrived);
        let committed = strings(&["a", "b", "c"]);
        assert_eq!(tally.lost(&committed), ["c"]);
        assert_eq!(tally.unknown(&committed), ["x"]);
        assert_eq!(tally.duplicates(), 3, "b twice more, a once more");
        assert_eq!(ids_of(&arrived), ["a", "b", "b", "x", "b", "a"]);

        let whole = Tally::of(&[received("a"), received("b"), received("c")]);
        assert!(
            whole.lost(&committed).is_empty(),
            "lost: {:?}",
            whole.lost(&committed)
        );
        assert!(
            whole.unknown(&committed).is_empty(),
            "invented: {:?}",
            whole.unknown(&committed)
        );
        assert_eq!(whole.duplicates(), 0);
    }

    #[test]
    #[should_panic(expected = "L0: lost [\"c\"]")]
    fn nothing_lost_or_invented_fails_on_a_lost_id() {
        let tally = Tally::of(&[received("a"), received("b")]);
        assert_nothing_lost_or_invented(&tally, &strings(&["a", "b", "c"]));
    }

    #[test]
    #[should_panic(expected = "messages for rows that never committed: [\"x\"]")]
    fn nothing_lost_or_invented_fails_on_an_invented_id() {
        let tally = Tally::of(&[received("a"), received("x")]);
        assert_nothing_lost_or_invented(&tally, &strings(&["a"]));
    }

    #[test]
    fn ack_holds_when_every_row_at_or_below_the_slot_arrived_and_names_the_first_that_did_not() {
        let delivered: HashSet<String> = strings(&["a1", "a2", "b1"]).into_iter().collect();
        let transactions = || {
            vec![
                (Some(100), strings(&["a1", "a2"])),
                (Some(200), strings(&["b1"])),
                // Above the slot: not acknowledged yet, so it need not have arrived.
                (Some(300), strings(&["c1"])),
                // Its end never noted: not checked.
                (None, strings(&["d1"])),
            ]
        };
        assert_eq!(
            acknowledged_rows_delivered(200, transactions(), &delivered),
            Ok(3)
        );
        assert_eq!(
            acknowledged_rows_delivered(300, transactions(), &delivered),
            Err(AckViolation {
                id: "c1".into(),
                ended_by: 300,
                confirmed: 300
            })
        );
        let violation = acknowledged_rows_delivered(250, [(Some(100), ["a3"])], &delivered)
            .expect_err("a3 never arrived");
        assert_eq!(
            violation.to_string(),
            "ACK violated: row a3 of a transaction ending at or before 0/64 is acknowledged \
             (confirmed_flush_lsn 0/FA)"
        );
    }

    #[test]
    fn readings_while_faults_ran_hold_when_acknowledged_rows_came_before_their_markers() {
        let commit = |ended_by: Option<u64>, ids: &[&str]| Commit {
            ids: strings(ids),
            ended_by,
        };
        let commits = [
            commit(Some(100), &["a1", "a2"]),
            commit(Some(200), &["b1"]),
            commit(Some(300), &["c1"]),
            commit(None, &["d1"]),
        ];
        let readings = |pairs: &[(&str, u64)]| -> Vec<(String, u64)> {
            pairs.iter().map(|(m, c)| (m.to_string(), *c)).collect()
        };
        // c1 came after m2, but m2 was read at 200: c1 (300) was not acknowledged then.
        let arrivals = ["a1", "m1", "a2", "b1", "m2", "c1", "d1", "m3", "a1"];
        let fine = readings(&[("m1", 50), ("m2", 200), ("m3", 300), ("lost", 300)]);
        assert_eq!(acks_before_markers(&commits, &arrivals, &fine), Ok(3));
        // m1 read at 100: a2 was acknowledged, yet it arrived after m1.
        let early = readings(&[("m2", 200), ("m1", 100)]);
        assert_eq!(
            acks_before_markers(&commits, &arrivals, &early),
            Err(AckViolation {
                id: "a2".into(),
                ended_by: 100,
                confirmed: 100
            })
        );
        // An acknowledged row that never arrived.
        let without_b1 = ["a1", "a2", "m2", "c1"];
        assert_eq!(
            acks_before_markers(&commits, &without_b1, &readings(&[("m2", 250)])),
            Err(AckViolation {
                id: "b1".into(),
                ended_by: 200,
                confirmed: 250
            })
        );
    }
}
