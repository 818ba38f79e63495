//! The relay against a 3-node RabbitMQ cluster: quorum queues, failover to another
//! node when the relay's node dies, a quorum queue's leader election, and a paused minority.
//!
//! The binary shares one private cluster ([`RabbitCluster::shared`], `pause_minority`) and one
//! private PostgreSQL. Every test holds the cluster's lock (tests that kill nodes must not
//! overlap, and the others must not see their kills) and calls `ensure_healthy` at its start
//! and end. Each outbox's queue is a quorum queue whose leader is placed by the node that
//! declares it. Oracles come from outside the relay (`common::faults`): the `test_decoding`
//! slot (what committed, in which order), the queue itself (drained through a marker), and
//! `pg_replication_slots` (ACK: nothing acknowledged that is not in the queue). Each test
//! prints one `FIGURES` line.
//!
//! The relay takes the cluster as a broker list (`--amqp-url URL1,URL2,URL3`) and names the
//! node it uses in `outbox_relay_broker_info{node="127.0.0.1:PORT"} 1`.

// The cluster's lock is a std Mutex held for a whole test, across awaits: each test has a
// runtime of its own and takes the lock inside `block_in_place`, so no task waits for it on a
// runtime thread that the holder needs.
#![allow(clippy::await_holding_lock)]

use outbox_relay::metrics::{MESSAGES_CONFIRMED_TOTAL, MESSAGES_IN_FLIGHT};
use outbox_testkit as common;

use std::sync::MutexGuard;
use std::time::Duration;

use common::faults::{
    barrier, check_ack, delivered_after, finish, ids_of, report, report_tally, secs, unsent_ids,
    Oracle, Tally, Writers,
};
use common::http::{metric_value, metrics, wait_metrics};
use common::outbox::{write_concurrently, Outbox};
use common::rabbit_release::Metadata;
use common::{queue_message_count, Consumer, PgServer, RabbitCluster, RelayProcess};
use tokio::time::Instant;

/// The window, passed explicitly: the duplicate bound depends on it.
const W: usize = 1024;
/// Largest transaction the writers commit: bounds X.
const MAX_TXN_ROWS: usize = 10;
/// Keeps reconnects quick while nodes are down (the default is 30 s).
const FAST_BACKOFF: [&str; 2] = ["--max-backoff", "2s"];
const MINUTE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------
// Servers

/// Runs a blocking harness call (start, kill, restart, rabbitmqctl) without stalling the
/// runtime.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    tokio::task::block_in_place(f)
}

/// The servers of this binary, started in parallel on first use, with the cluster's lock
/// held and the cluster whole. Call `ensure_healthy` again at the end.
async fn servers() -> (
    &'static PgServer,
    &'static RabbitCluster,
    MutexGuard<'static, ()>,
) {
    blocking(|| {
        let cluster = std::thread::spawn(RabbitCluster::shared);
        let pg = common::private_pg();
        let cluster = cluster
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        let lock = cluster.lock();
        cluster.ensure_healthy();
        (pg, cluster, lock)
    })
}

/// An outbox whose queue is a quorum queue led by node `leader`, on this binary's PostgreSQL.
async fn quorum_outbox(
    pg: &PgServer,
    cluster: &RabbitCluster,
    leader: usize,
    prefix: &str,
    setup: &[&str],
) -> (Outbox, Oracle) {
    common::faults::quorum_outbox(&pg.url("postgres"), cluster, leader, prefix, setup).await
}

/// `outbox-relay <command>` on `outbox` through `amqp_url` (one URL or the broker list),
/// serving /metrics and /readyz on the returned port.
fn spawn_observed(
    outbox: &Outbox,
    command: &str,
    amqp_url: &str,
    extra: &[&str],
) -> (RelayProcess, u16) {
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut args = vec!["--metrics-addr", addr.as_str()];
    args.extend_from_slice(extra);
    let relay = outbox.spawn(command, (&outbox.db_url, amqp_url), &args, &[]);
    (relay, port)
}

/// Waits until `queue` holds at least `depth` messages (asked through `url`): the relay is
/// mid-stream with a full window behind it.
async fn wait_depth(relay: &RelayProcess, url: &str, queue: &str, depth: u32) {
    let deadline = Instant::now() + MINUTE;
    loop {
        let queued = queue_message_count(url, queue).await;
        if queued >= depth {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "relay too slow: {queued} queued; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The relay's confirmed-messages counter.
async fn confirmed_total(port: u16) -> f64 {
    metric_value(&metrics(port).await, MESSAGES_CONFIRMED_TOTAL).unwrap_or(0.0)
}

/// The node after `i`, round the cluster.
fn next(cluster: &RabbitCluster, i: usize) -> usize {
    (i + 1) % cluster.len()
}

// ---------------------------------------------------------------------------------
// 0. The harness

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_forms_and_a_quorum_queue_serves_every_node() {
    let (pg, cluster, _lock) = servers().await;
    assert_eq!(cluster.len(), 3);
    let (outbox, _oracle) = quorum_outbox(pg, cluster, 1, "smoke", &["setup"]).await;
    // Published through one node, consumed through another, led by a third.
    let mut consumer = Consumer::start(&cluster.url(2), &outbox.queue).await;
    common::amqp::publish_confirmed(&cluster.url(0), &outbox.exchange, "smoke", &[("a", b"1")])
        .await;
    let received = consumer.wait_for(1, MINUTE).await;
    assert_eq!(received[0].message_id.as_deref(), Some("a"));
    assert_eq!(cluster.url_list().split(',').count(), 3);
    assert_eq!(cluster.index_of_port(cluster.port(2)), Some(2));
    blocking(|| cluster.wait_quorum_members_online(&outbox.queue));
    blocking(|| cluster.ensure_healthy());
}

// ---------------------------------------------------------------------------------
// 1. A quorum queue, no fault

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_queue_20000_rows_from_writers_arrive_once_in_commit_order() {
    const ROWS: usize = 20_000;
    let (pg, cluster, _lock) = servers().await;
    // Led by node 0, published to through node 1, consumed through node 2.
    let (outbox, oracle) = quorum_outbox(pg, cluster, 0, "quorum", &["setup"]).await;
    let mut consumer = Consumer::start_with(&cluster.url(2), &outbox.queue, false).await;
    let (relay, _port) = spawn_observed(&outbox, "run", &cluster.url(1), &[]);
    let started = Instant::now();
    write_concurrently(&outbox.db_url, 4, ROWS, MAX_TXN_ROWS).await;
    let written = started.elapsed();
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    let delivered = started.elapsed();
    assert_eq!(committed.len(), ROWS);
    assert_eq!(tally.duplicates(), 0, "DUP: no fault, no duplicate");
    let arrived: Vec<&str> = ids_of(consumer.received()).into_iter().collect();
    assert!(
        arrived == committed,
        "arrival order is the commit order ({} arrived)",
        arrived.len()
    );
    report_tally(
        "c1 quorum queue",
        &committed,
        &tally,
        &[
            ("order", "commit order".into()),
            ("written in", secs(written)),
            ("all delivered in", secs(delivered)),
            (
                "rows/s",
                format!("{:.0}", ROWS as f64 / delivered.as_secs_f64()),
            ),
        ],
    );
    blocking(|| cluster.ensure_healthy());
}

/// `--amqp-node-order listed`: the relay connects to the first URL of the list, whichever node
/// that is (a shuffled list would start at the named node in one start of three), and delivers
/// through it. An operator lists the node leading the outbox's quorum queues first, since a
/// publish through another node is forwarded to the leader (docs/high-availability.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_node_order_connects_to_the_first_url_each_time() {
    const ROWS: usize = 2_000;
    let (pg, cluster, _lock) = servers().await;
    let (outbox, oracle) = quorum_outbox(pg, cluster, 2, "listed", &["setup"]).await;
    let listed = |first: usize| {
        (0..cluster.len())
            .map(|offset| cluster.url((first + offset) % cluster.len()))
            .collect::<Vec<_>>()
            .join(",")
    };
    let order = ["--amqp-node-order", "listed"];
    // Three starts, each listing another node first: a shuffle passes all three by chance
    // once in 27.
    for first in [1, 0] {
        let (relay, port) = spawn_observed(&outbox, "run", &listed(first), &order);
        let node = cluster.wait_node_in_use(&relay, port, None, MINUTE).await;
        assert_eq!(node, first, "listed order; log:\n{}", relay.log());
        relay.stop().await;
    }
    let (relay, port) = spawn_observed(&outbox, "run", &listed(2), &order);
    let node = cluster.wait_node_in_use(&relay, port, None, MINUTE).await;
    assert_eq!(node, 2, "listed order; log:\n{}", relay.log());
    let mut consumer = Consumer::start_with(&cluster.url(2), &outbox.queue, false).await;
    write_concurrently(&outbox.db_url, 2, ROWS, MAX_TXN_ROWS).await;
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    assert_eq!(committed.len(), ROWS);
    assert_eq!(tally.duplicates(), 0, "DUP: no fault, no duplicate");
    let arrived: Vec<&str> = ids_of(consumer.received()).into_iter().collect();
    assert!(arrived == committed, "arrival order is the commit order");
    assert_eq!(relay.sessions(), 1, "no reconnect; log:\n{}", relay.log());
    report_tally(
        "c1b listed node order",
        &committed,
        &tally,
        &[("node in use, listed first", node.to_string())],
    );
    blocking(|| cluster.ensure_healthy());
}

// ---------------------------------------------------------------------------------
// 2. The relay's node dies

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_relays_node_fails_over_duplicates_within_w_plus_x() {
    let (pg, cluster, _lock) = servers().await;
    let (mut outbox, oracle) = quorum_outbox(pg, cluster, 0, "relaynode", &["setup"]).await;
    // A backlog so the relay is mid-stream with a full window at the kill (it drains about
    // 3,000 rows/s here), writers on top.
    write_concurrently(&outbox.db_url, 4, 20_000, MAX_TXN_ROWS).await;
    let writers = Writers::start(&outbox.db_url, 2, MAX_TXN_ROWS, Duration::from_millis(20));
    let window = W.to_string();
    let flags = ["--max-in-flight", &window, FAST_BACKOFF[0], FAST_BACKOFF[1]];
    let (relay, port) = spawn_observed(&outbox, "run", &cluster.url_list(), &flags);
    let node = cluster.wait_node_in_use(&relay, port, None, MINUTE).await;
    // The test's own clients go through a node that survives.
    outbox.amqp_url = cluster.url(next(cluster, node));
    let leader_too = node == 0;
    // The window at least half full (the backlog keeps the relay publishing ahead of the
    // confirms), and the kill right after.
    let half_full =
        |text: &str| metric_value(text, MESSAGES_IN_FLIGHT).is_some_and(|n| n >= (W / 2) as f64);
    let text = wait_metrics(port, MINUTE, half_full).await;
    let in_flight = metric_value(&text, MESSAGES_IN_FLIGHT).unwrap_or(0.0);
    assert!(
        half_full(&text),
        "the window never filled: {in_flight} in flight"
    );

    let before = relay.sessions();
    let killed = blocking(|| cluster.kill9(node));
    let now_on = cluster
        .wait_node_in_use(&relay, port, Some(node), MINUTE)
        .await;
    let failover = relay.wait_new_session(before, MINUTE).await;
    let failover = failover.map(|_| killed.elapsed());
    let failover = failover.unwrap_or_else(|| panic!("no new session; log:\n{}", relay.log()));
    // How long is a figure (the report below; its target is the benchmark's, with its
    // conditions): the test asserts that it streams again, and loses nothing.
    println!(
        "c2: streaming again through node {now_on} {} after node {node} died",
        secs(failover)
    );
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let ack = check_ack(&outbox.client, &outbox, &oracle, &mut consumer).await;
    let probe = delivered_after(
        &relay,
        &outbox.client,
        &mut consumer,
        Duration::from_secs(120),
        "the failover",
    )
    .await;
    writers.stop().await;

    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    let bound = W + MAX_TXN_ROWS;
    report_tally(
        "c2 relay's node kill -9",
        &committed,
        &tally,
        &[
            ("bound W+X", bound.to_string()),
            ("kill to streaming via another node", secs(failover)),
            ("in flight at the kill", in_flight.to_string()),
            ("leader killed too", leader_too.to_string()),
            (
                "acknowledged rows checked after failover",
                ack.acknowledged_rows.to_string(),
            ),
            ("probe delivered after (behind the backlog)", secs(probe)),
        ],
    );
    assert!(
        tally.duplicates() <= bound,
        "DUP: {} duplicates, bound W + X = {bound}",
        tally.duplicates()
    );
    blocking(|| cluster.ensure_healthy());
}

// ---------------------------------------------------------------------------------
// 3. The quorum queue's leader dies

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_quorum_leader_confirms_resume_after_the_election() {
    let (pg, cluster, _lock) = servers().await;
    // Led by node 0; the relay publishes through node 1 only, the test consumes through 2.
    let (mut outbox, oracle) = quorum_outbox(pg, cluster, 0, "leader", &["setup"]).await;
    outbox.amqp_url = cluster.url(2);
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    // A backlog the workers cannot drain in the second a kill takes (the test kit syncs the
    // broker's metadata log first; polling drains ~16k rows/s on a quiet machine).
    const BACKLOG: i64 = 40_000;
    write_concurrently(&outbox.db_url, 4, BACKLOG as usize, MAX_TXN_ROWS).await;
    let writers = Writers::start(&outbox.db_url, 2, MAX_TXN_ROWS, Duration::from_millis(20));
    let window = W.to_string();
    let flags = ["--max-in-flight", &window, FAST_BACKOFF[0], FAST_BACKOFF[1]];
    let (relay, port) = spawn_observed(&outbox, "run", &cluster.url(1), &flags);
    consumer.wait_for(2_000, MINUTE).await;
    assert!(
        consumer.received().len() >= 2_000,
        "relay too slow; log:\n{}",
        relay.log()
    );

    let sessions = relay.sessions();
    let killed = blocking(|| cluster.kill9(0));
    let confirmed_at_kill = confirmed_total(port).await;
    let delivered_at_kill = consumer.received().len();
    let new_leader = blocking(|| cluster.quorum_leader(&outbox.queue));
    let elected = killed.elapsed();
    // The first confirm and the first delivery after the kill.
    let deadline = Instant::now() + MINUTE;
    let (mut first_confirm, mut first_delivery) = (None, None);
    while first_confirm.is_none() || first_delivery.is_none() {
        if first_confirm.is_none() && confirmed_total(port).await > confirmed_at_kill {
            first_confirm = Some(killed.elapsed());
        }
        if first_delivery.is_none() && consumer.received().len() > delivered_at_kill {
            first_delivery = Some(killed.elapsed());
        }
        assert!(
            Instant::now() < deadline,
            "no confirm ({first_confirm:?}) or delivery ({first_delivery:?}) a minute after \
             the leader died (consumer error {:?}); log:\n{}",
            consumer.error(),
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ack = check_ack(&outbox.client, &outbox, &oracle, &mut consumer).await;
    writers.stop().await;

    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    report_tally(
        "c3 quorum leader kill -9",
        &committed,
        &tally,
        &[
            ("new leader", format!("node {new_leader}")),
            ("kill to new leader listed", secs(elected)),
            ("kill to first confirm", secs(first_confirm.unwrap())),
            ("kill to first delivery", secs(first_delivery.unwrap())),
            (
                "relay sessions lost",
                (relay.sessions() - sessions).to_string(),
            ),
            (
                "acknowledged rows checked after the election",
                ack.acknowledged_rows.to_string(),
            ),
        ],
    );
    blocking(|| cluster.ensure_healthy());
}

// ---------------------------------------------------------------------------------
// 4. A minority left: it pauses

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_killed_the_paused_survivor_holds_the_slot_and_the_relay_drains_after() {
    let (pg, cluster, _lock) = servers().await;
    let (mut outbox, oracle) = quorum_outbox(pg, cluster, 0, "minority", &["setup"]).await;
    write_concurrently(&outbox.db_url, 4, 5_000, MAX_TXN_ROWS).await;
    let writers = Writers::start(&outbox.db_url, 2, MAX_TXN_ROWS, Duration::from_millis(20));
    let (relay, port) = spawn_observed(&outbox, "run", &cluster.url_list(), &FAST_BACKOFF);
    let node = cluster.wait_node_in_use(&relay, port, None, MINUTE).await;
    let victims = [node, next(cluster, node)];
    let survivor = next(cluster, victims[1]);
    outbox.amqp_url = cluster.url(survivor);
    wait_depth(&relay, &outbox.amqp_url, &outbox.queue, 1_000).await;

    let killed = Instant::now();
    blocking(|| {
        std::thread::scope(|scope| {
            for victim in victims {
                scope.spawn(move || cluster.kill9(victim));
            }
        })
    });
    // Mnesia's pause_minority: the survivor stops its broker and refuses connections, and
    // /readyz says the broker is down. Khepri (Raft) pauses nothing: the survivor takes the
    // relay's connection and confirms none of its publishes without a majority, so each
    // session ends at the confirm timeout, on the message it waited for.
    let khepri = common::rabbit_release::release().metadata() == Metadata::Khepri;
    if !khepri {
        let paused = common::poll_until(MINUTE, Duration::from_millis(20), || {
            std::net::TcpStream::connect(("127.0.0.1", cluster.port(survivor)))
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        });
        assert!(paused, "node {survivor} still accepts connections alone");
    }
    let paused_in = killed.elapsed();
    let not_ready = common::http::wait_http(port, "/readyz", 2 * MINUTE, |(status, body)| {
        let reason = body.trim();
        *status == 503 && (reason == "broker down" || khepri && reason.starts_with("stuck message"))
    })
    .await;
    assert!(
        not_ready.is_some(),
        "/readyz still 200; log:\n{}",
        relay.log()
    );
    // The outage: writers go on committing, the relay acknowledges nothing new.
    let held = outbox.confirmed_flush().await;
    let committed_at = writers.committed();
    let outage = Instant::now();
    while outage.elapsed() < Duration::from_secs(5) {
        assert_eq!(
            outbox.confirmed_flush().await,
            held,
            "the slot moved while no node could take a message"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        writers.committed() > committed_at,
        "rows committed during the outage"
    );
    if !khepri {
        // Under Khepri a new session on the survivor is ready again until its confirm timeout.
        assert_eq!(
            common::http::readyz(port).await,
            (503, "broker down".to_string())
        );
    }

    let before = relay.sessions();
    let restarting = Instant::now();
    blocking(|| cluster.restart_all(&victims));
    let restart = restarting.elapsed();
    // Under Khepri the session on the survivor may simply go on: its publishes are confirmed
    // once the majority is back.
    let resumed = match khepri {
        true => Duration::ZERO,
        false => relay
            .wait_new_session(before, MINUTE)
            .await
            .unwrap_or_else(|| panic!("no new session; log:\n{}", relay.log())),
    };
    assert!(relay.try_exit().is_none(), "the same relay process drains");
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let probe = delivered_after(
        &relay,
        &outbox.client,
        &mut consumer,
        Duration::from_secs(120),
        "the restart",
    )
    .await;
    writers.stop().await;

    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    report_tally(
        "c4 minority paused",
        &committed,
        &tally,
        &[
            (
                if khepri {
                    "kill to not ready (Khepri: no pause)"
                } else {
                    "survivor paused after"
                },
                secs(paused_in),
            ),
            ("kill to restart begun", secs(restarting - killed)),
            ("two nodes restarted in", secs(restart)),
            ("restart to new session", secs(restart + resumed)),
            ("probe delivered after", secs(probe)),
            ("failed sessions", relay.reconnects().to_string()),
        ],
    );
    blocking(|| cluster.ensure_healthy());
}

// ---------------------------------------------------------------------------------
// 5. Polling mode: the relay's node dies

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_kill_9_of_the_relays_node_fails_over_duplicates_within_workers_times_batch() {
    const WORKERS: usize = 2;
    const BATCH: usize = 200;
    let (pg, cluster, _lock) = servers().await;
    let setup = ["setup", "--mode", "poll"];
    let (mut outbox, _oracle) = quorum_outbox(pg, cluster, 0, "pollnode", &setup).await;
    // A backlog the workers cannot drain in the second a kill takes (the test kit syncs the
    // broker's metadata log first; polling drains ~16k rows/s on a quiet machine).
    const BACKLOG: i64 = 40_000;
    write_concurrently(&outbox.db_url, 4, BACKLOG as usize, MAX_TXN_ROWS).await;
    let writers = Writers::start(&outbox.db_url, 2, MAX_TXN_ROWS, Duration::from_millis(20));
    let (workers, batch) = (WORKERS.to_string(), BATCH.to_string());
    let flags = [
        "--workers",
        &workers,
        "--batch-size",
        &batch,
        FAST_BACKOFF[0],
        FAST_BACKOFF[1],
    ];
    let (relay, port) = spawn_observed(&outbox, "poll", &cluster.url_list(), &flags);
    let node = cluster.wait_node_in_use(&relay, port, None, MINUTE).await;
    outbox.amqp_url = cluster.url(next(cluster, node));
    let published = "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL";
    let at_least = |n: i64| move |count: i64| count >= n;
    let marked = common::pg::wait_count(&outbox.client, published, MINUTE, at_least(2_000)).await;
    assert!(marked.is_ok(), "relay too slow; log:\n{}", relay.log());

    let killed = blocking(|| cluster.kill9(node));
    let marked_at_kill: i64 = common::pg::query_value(&outbox.client, published).await;
    assert!(
        marked_at_kill < BACKLOG,
        "the kill must land mid-backlog ({marked_at_kill} of {BACKLOG} marked)"
    );
    let now_on = cluster
        .wait_node_in_use(&relay, port, Some(node), MINUTE)
        .await;
    // Streaming again: rows are marked published through the other node.
    let more = at_least(marked_at_kill + 1);
    let resumed = common::pg::wait_count(&outbox.client, published, MINUTE, more).await;
    assert!(
        resumed.is_ok(),
        "nothing published after the kill; log:\n{}",
        relay.log()
    );
    // A figure in the report below, not a bound (the benchmark's recovery section has it).
    let failover = killed.elapsed();
    println!(
        "publishing again through node {now_on} {} after node {node} died",
        secs(failover)
    );
    let committed = writers.stop().await.len() + BACKLOG as usize;
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let all = common::pg::wait_count(&outbox.client, published, MINUTE * 3, |n| {
        n as usize >= committed
    })
    .await;
    assert!(
        all.is_ok(),
        "not every row published: {all:?}; log:\n{}",
        relay.log()
    );
    relay.stop().await;
    let unsent = unsent_ids(&outbox.client).await;
    assert!(
        unsent.is_empty(),
        "{} rows unsent at the end, e.g. {:?}",
        unsent.len(),
        unsent.iter().min()
    );
    barrier(&mut consumer, &outbox.amqp_url, &outbox.queue).await;
    let ids = common::pg::first_column(&outbox.client, "SELECT id::text FROM outbox", &[]).await;
    let tally = Tally::of(consumer.received());
    common::faults::assert_nothing_lost_or_invented(&tally, &ids);
    let bound = WORKERS * BATCH;
    report(
        "c5 polling, relay's node kill -9",
        &[
            ("rows", ids.len().to_string()),
            ("lost", "0".into()),
            ("duplicates", tally.duplicates().to_string()),
            ("bound workers×batch", bound.to_string()),
            ("marked published at the kill", marked_at_kill.to_string()),
            ("kill to publishing via another node", secs(failover)),
        ],
    );
    assert!(
        tally.duplicates() <= bound,
        "DUP: {} duplicates, bound workers × batch = {bound}",
        tally.duplicates()
    );
    blocking(|| cluster.ensure_healthy());
}

/// Returns at full speed through the cluster: 100,000 rows, 1 % unroutable, dead-letter
/// policy, the quorum queue and the dead-letter queue both quorum queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_speed_drain_with_one_percent_unroutable_dead_letters_exactly_those() {
    let (pg, cluster, _lock) = servers().await;
    let dead_letter_exchange = common::unique_name("stress_dlx");
    let setup = [
        "setup",
        "--on-unroutable",
        "dead-letter",
        "--dead-letter-exchange",
        &dead_letter_exchange,
    ];
    let (outbox, oracle) = quorum_outbox(pg, cluster, 0, "stress", &setup).await;
    // Only Good.# is routed: the Nobody.… rows come back.
    common::amqp::bind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "Good.#").await;
    common::amqp::unbind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
    let dead_letter_queue = common::unique_name("stress_dlq");
    common::amqp::declare_bound_quorum_queue(
        &outbox.amqp_url,
        &dead_letter_exchange,
        &dead_letter_queue,
        "#",
    )
    .await;
    let rows = common::faults::stress_rows();
    let (good, unroutable) = common::faults::seed_one_percent_unroutable(&outbox, rows).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let mut dead_letters = Consumer::start(&outbox.amqp_url, &dead_letter_queue).await;

    let started = Instant::now();
    let policy = [
        "--on-unroutable",
        "dead-letter",
        "--dead-letter-exchange",
        &dead_letter_exchange,
    ];
    let (relay, _port) = spawn_observed(&outbox, "run", &cluster.url_list(), &policy);
    common::faults::assert_stress_dead_lettered(
        &outbox,
        &oracle,
        &relay,
        (&mut consumer, &mut dead_letters),
        (&good, &unroutable),
    )
    .await;
    let drained = started.elapsed();
    assert_eq!(relay.sessions(), 1, "no reconnect; log:\n{}", relay.log());
    report(
        "c6 returns stress through the cluster, dead-letter",
        &[
            ("rows", rows.to_string()),
            ("unroutable", unroutable.len().to_string()),
            ("drained in", secs(drained)),
            (
                "msgs/s",
                format!("{:.0}", rows as f64 / drained.as_secs_f64()),
            ),
        ],
    );
    relay.stop().await;
}

/// The same drain under `halt` through the cluster: the relay stops at the first unroutable
/// row in commit order and the slot never passes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_speed_drain_with_one_percent_unroutable_halts_at_the_first_one() {
    let (pg, cluster, _lock) = servers().await;
    let (outbox, oracle) = quorum_outbox(pg, cluster, 0, "halt_stress", &["setup"]).await;
    // Only Good.# is routed: the Nobody.… rows come back.
    common::amqp::bind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "Good.#").await;
    common::amqp::unbind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
    let rows = common::faults::stress_rows();
    let (_, unroutable) = common::faults::seed_one_percent_unroutable(&outbox, rows).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let (relay, port) = spawn_observed(
        &outbox,
        "run",
        &cluster.url_list(),
        &["--max-backoff", "1s"],
    );
    common::faults::assert_stress_halted(
        &outbox,
        &oracle,
        (&relay, port),
        &mut consumer,
        &unroutable,
        "c6b returns stress through the cluster, halt",
    )
    .await;
    relay.stop().await;
}
