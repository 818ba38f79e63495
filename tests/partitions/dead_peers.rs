//! Dead peers: a host that vanishes without closing its connections (a machine powered off,
//! a VM or zone lost, a firewall dropping everything), made with `common::netns`'s
//! `Network::vanish`: every packet into and out of it is dropped, so its peers, and the test
//! process, hear nothing at all, not even a reset. Only timeouts can tell, and the one that
//! must tell here is the peer timeout T (`--peer-timeout`, default 5 s: TCP_USER_TIMEOUT and
//! keepalives on every connection, the same on PostgreSQL's end of each session, the AMQP
//! heartbeat), never the operating system's (2 hours for an idle connection, about 15
//! minutes of retransmits for a busy one).
//!
//! 0. The kit: a vanished host is silent to everyone until healed.
//! 1. The PostgreSQL primary's host vanishes; the standby is promoted at once: the relay, with
//!    a multi-host URL, streams on the new primary.
//! 2. The relay's RabbitMQ node's host vanishes (another node leads the quorum queue):
//!    delivery goes on through another node.
//! 3. One of two `outbox-inbox consume` replicas vanishes holding a claim: the other applies
//!    that message, and every message's effect exists exactly once.
//! 4. A relay vanishes while it backfills a lost slot (`--on-slot-lost recreate`): its standby
//!    takes the recovery over (before, PostgreSQL kept the vanished relay's advisory lock on
//!    its idle connection for the 2-hour keepalive).
//!
//! Each must happen within [`GIVE_UP`] (60 s), where without the peer timeout it would take
//! the operating system's minutes or hours; how long it took (a few T) is a figure of the
//! scenario's report, not a bound: timing targets belong to the benchmark.
//!
//! 1-3 run twice: idle (a few writers, nothing queued) and at full speed (a backlog draining
//! when the fault comes; for the relay a window of W = 1,024 in flight). 4 is at full speed
//! by its nature: a backfill publishes as fast as the broker confirms.
//!
//! The relays and consumers get T by environment (`OUTBOX_PEER_TIMEOUT`,
//! `OUTBOX_INBOX_PEER_TIMEOUT`), as a unit file gives it: the same tests then run against a
//! binary without the setting (set `CARGO_BIN_EXE_outbox-relay` to it and run the test
//! binary directly), which shows what a dead peer cost before: they time out at 60 s where
//! the wait would be hours.
//!
//! Oracles from outside the relay, as in the rest of this binary: rows on the final primary,
//! the queue drained through a marker, a `test_decoding` slot (on the standby in 1, which
//! the promotion keeps), `pg_stat_replication` and `pg_locks` for who holds the slot and the
//! recovery's lock, `pg_stat_activity` for a replica's open claim, the effect table for what
//! was applied, and the ACK check after stopping the relay. Each test prints one `FIGURES`
//! line.

use super::common;
use super::{
    blocking, confirm_rate, confirmed, exclusive, joined, quorum_outbox, reconnect_causes,
    report_within, scrape, shared, wait_confirmed, wait_holder, wait_whole_in_background,
    MAX_TXN_ROWS, MESSAGES_IN_FLIGHT, MINUTE, RECONNECTS_TOTAL, RELAY_FLAGS, W,
};
use outbox_relay::metrics::{PHANTOM_EVENTS_LABEL, POSTGRES_FAILOVERS_TOTAL};

use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::amqp::{
    amqp_connect, declare_bound_queue_with_args, delete_queue, publish_confirmed,
    quorum_queue_arguments,
};
use common::failover::{create_standby_oracle, outbox_ids, FailoverPair, PairOptions};
use common::faults::{
    barrier, check_ack, delivered_after, finish, ids_of, peak_rate_until, report, secs, Oracle,
    Tally, Writers, OUTBOX_TABLE,
};
use common::http::{metric_sum, metric_value, wait_http};
use common::lab::Lab;
use common::netns::{unacknowledged, Host};
use common::outbox::Outbox;
use common::pg::{drop_slot_once_released, pg_connect, query_value, wait_count};
use common::rabbit_cluster::DELIVERY_AFTER_HEAL as AFTER_HEAL;
use common::relay::inbox_binary;
use common::{format_lsn, unique_name, Consumer, RelayProcess};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::BasicProperties;
use tokio::time::Instant;
use tokio_postgres::Client;

/// The peer timeout of every relay and consumer here: `--peer-timeout`'s default, given
/// explicitly (the bounds below derive from it).
pub(super) const PEER_TIMEOUT: Duration = Duration::from_secs(5);
/// The same for the relay and the consumer, by environment (see the module documentation).
const RELAY_PEER_TIMEOUT: (&str, &str) = ("OUTBOX_PEER_TIMEOUT", "5s");
const INBOX_PEER_TIMEOUT: (&str, &str) = ("OUTBOX_INBOX_PEER_TIMEOUT", "5s");
const INBOX_STATEMENT_TIMEOUT: (&str, &str) = ("OUTBOX_INBOX_STATEMENT_TIMEOUT", "60s");
/// How long a test waits for what would take hours without the peer timeout, before it
/// fails saying so.
const GIVE_UP: Duration = Duration::from_secs(60);
/// A backlog of this many rows (or messages) is draining when the fault of a full-speed run
/// comes, once [`FAULT_AT`] of it has arrived.
const BACKLOG: usize = 12_000;
const FAULT_AT: f64 = 0.4;
/// Rows per transaction of a relay's backlog: X at full speed.
const BACKLOG_TXN_ROWS: usize = 10;

/// The relay hosts of each test that runs beside others: a vanish must take no other
/// test's processes with it (lab.rs: relay0 is the exclusive tests', relay1-4 the `s` tests').
const D0_HOSTS: [usize; 2] = [5, 6];
const D1_RELAY: usize = 7;
const D3_IDLE_REPLICAS: (usize, usize) = (8, 9);
const D3_BACKLOG_REPLICAS: (usize, usize) = (10, 11);
const D4_RELAYS: (usize, usize) = (12, 13);

/// A fault comes on a relay draining nothing but a few writers' rows, or a backlog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Load {
    Idle,
    FullSpeed,
}

/// `outbox-relay run` on `host` through `db_url` and `amqp_url` (a broker list: no
/// `heartbeat=`, so the relay's own default, T), with the peer timeout, [`RELAY_FLAGS`] and
/// `extra`; its `/metrics` address.
pub(super) fn spawn_relay_via(
    outbox: &Outbox,
    host: &Host,
    urls: (&str, &str),
    extra: &[&str],
) -> (RelayProcess, SocketAddrV4) {
    spawn_relay_via_with(outbox, host, urls, extra, &[])
}

/// [`spawn_relay_via`] with more environment (e.g. `OUTBOX_FAILPOINTS`).
pub(super) fn spawn_relay_via_with(
    outbox: &Outbox,
    host: &Host,
    (db_url, amqp_url): (&str, &str),
    extra: &[&str],
    env: &[(&str, &str)],
) -> (RelayProcess, SocketAddrV4) {
    let at = SocketAddrV4::new(host.addr(), common::free_port());
    let addr = at.to_string();
    let mut flags = vec!["--metrics-addr", addr.as_str()];
    flags.extend_from_slice(&RELAY_FLAGS);
    flags.extend_from_slice(extra);
    let mut all_env = vec![RELAY_PEER_TIMEOUT];
    all_env.extend_from_slice(env);
    let relay = outbox.spawn_on(host, "run", (db_url, amqp_url), &flags, &all_env);
    (relay, at)
}

/// Polls `what` every 20 ms until it returns `Some`; `None` after `timeout`.
async fn poll<T>(timeout: Duration, mut what: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = what().await {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------
// 0. The kit

/// What a connect from the test process to `host`:`port` within a second comes to.
fn connect_outcome(host: &Host, port: u16) -> ErrorKind {
    let at = SocketAddrV4::new(host.addr(), port).into();
    match TcpStream::connect_timeout(&at, Duration::from_secs(1)) {
        Ok(_) => panic!("something listens on {at}"),
        Err(e) => e.kind(),
    }
}

/// A read of `stream` that waits at most `within`. A signal interrupts a read with a receive
/// timeout whatever `SA_RESTART` says (signal(7)), and this process gets them: tokio handles
/// SIGCHLD for the lab's children, which other tests start and stop meanwhile. So an
/// interrupted read is read again for the time left (CI, 2026-12-04: `Err(Interrupted)` where
/// only a timeout was expected).
fn read_within(
    stream: &mut TcpStream,
    buffer: &mut [u8],
    within: Duration,
) -> std::io::Result<usize> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(buffer) {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            read => return read,
        }
    }
}

/// A vanished host is silent to everyone: a connection from the test process to a listener
/// on it takes writes and acknowledges none, reports no error, and brings nothing back (the
/// host's own writes are dropped on their way out); a closed port no longer refuses; other
/// hosts neither reach it nor are reached. Once healed, TCP's retransmits deliver what
/// waited, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "8 minutes of waiting out partitions: scripts/test.sh runs them last, alone (or only them with --partitions)"]
async fn a_vanished_host_is_silent_to_its_peers_and_the_test_process_until_healed() {
    let (lab, _lock) = shared().await;
    let (host, other) = (lab.relay_host(D0_HOSTS[0]), lab.relay_host(D0_HOSTS[1]));
    let third = lab.pg_host();
    blocking(|| {
        let listener = host
            .in_namespace(|| TcpListener::bind((host.addr(), 0)))
            .and_then(|bound| bound)
            .expect("a listener on the host");
        let port = listener.local_addr().expect("its address").port();
        // A port nothing listens on: refused (a RST) while the host is there.
        let closed = common::free_port();
        assert_eq!(connect_outcome(host, closed), ErrorKind::ConnectionRefused);
        let at = SocketAddrV4::new(host.addr(), port).into();
        let mut client = TcpStream::connect_timeout(&at, Duration::from_secs(1)).expect("connect");
        let (mut server, _) = listener.accept().expect("accept");
        client.write_all(b"ping").expect("write");
        let mut buffer = [0u8; 64];
        server.read_exact(&mut buffer[..4]).expect("the host reads");
        server.write_all(b"pong").expect("the host writes");
        client
            .read_exact(&mut buffer[..4])
            .expect("the test process reads");
        assert_eq!(unacknowledged(&client), 0);

        let gone = lab.net.vanish(host);
        client
            .write_all(b"into the void")
            .expect("a write is only queued");
        server
            .write_all(b"from the void")
            .expect("so is the host's");
        // Nothing arrives within a second, and nothing fails: no RST, no FIN, no error.
        let read =
            read_within(&mut client, &mut buffer, Duration::from_secs(1)).map_err(|e| e.kind());
        assert!(
            matches!(read, Err(ErrorKind::WouldBlock | ErrorKind::TimedOut)),
            "the test process reads nothing from the vanished host: {read:?}"
        );
        let error = client.take_error().expect("SO_ERROR");
        assert!(
            error.is_none(),
            "the vanished host's socket has an error: {error:?}"
        );
        assert_eq!(
            unacknowledged(&client),
            13,
            "the write waits unacknowledged"
        );
        server.set_nonblocking(true).expect("nonblocking");
        let read = server.read(&mut buffer).map_err(|e| e.kind());
        assert_eq!(
            read,
            Err(ErrorKind::WouldBlock),
            "the host received nothing"
        );
        server.set_nonblocking(false).expect("blocking");
        assert_eq!(
            connect_outcome(host, closed),
            ErrorKind::TimedOut,
            "a closed port of a vanished host does not refuse"
        );
        assert!(
            !other.reaches(host) && !host.reaches(other),
            "no host reaches it"
        );
        assert!(
            other.reaches(third) && third.reaches(other),
            "the others still reach each other"
        );

        gone.heal();
        let healed = Instant::now();
        server
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        server
            .read_exact(&mut buffer[..13])
            .expect("the write arrives after the heal");
        assert_eq!(&buffer[..13], b"into the void");
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        client
            .read_exact(&mut buffer[..13])
            .expect("so does the host's");
        assert_eq!(&buffer[..13], b"from the void");
        let delivered = healed.elapsed();
        assert!(
            common::poll_until(Duration::from_secs(10), Duration::from_millis(20), || {
                unacknowledged(&client) == 0
            }),
            "acknowledged after the heal"
        );
        assert_eq!(connect_outcome(host, closed), ErrorKind::ConnectionRefused);
        assert!(
            other.reaches(host) && host.reaches(other),
            "the healed host and its peer reach each other again"
        );
        report(
            "d0 kit: a vanished host",
            &[
                ("bytes unacknowledged while gone", "13".into()),
                ("errors seen while gone", "none".into()),
                ("heal to the queued bytes delivered", secs(delivered)),
            ],
        );
    });
}

// ---------------------------------------------------------------------------------
// 1. The primary's host vanishes, the standby is promoted

/// Writers through the pair's multi-host URL, from the test process. They must not wait on
/// the vanished primary either: a connect gives a host 2 s (tokio-postgres's default is no
/// limit, and a SYN to a vanished host is retried for about 2 minutes), a statement's socket
/// gives up after T (seconds here, unlike libpq's milliseconds), and keepalives end a
/// connection waiting for a reply the vanished server will never send (a COMMIT whose bytes
/// it had acknowledged: nothing is unacknowledged, so the user timeout never runs; a writer
/// waited for it until the test was killed).
pub(super) fn writers_url(multi_host_url: &str) -> String {
    let user_timeout = PEER_TIMEOUT.as_secs();
    format!(
        "{multi_host_url}&connect_timeout=2&tcp_user_timeout={user_timeout}\
         &keepalives=1&keepalives_idle=2&keepalives_interval=1&keepalives_retries=3"
    )
}

/// The outbox's database name.
fn database_of(outbox: &Outbox) -> &str {
    outbox.db_url.rsplit('/').next().expect("a database")
}

/// The most duplicates a vanished primary may cause. Unlike a killed one (tests/failover.rs,
/// `failover_duplicate_bound`), whose reset discards what the relay had not read yet, a
/// vanished primary leaves the relay its socket's buffers: for the T it takes to notice, the
/// relay publishes everything the walsender had sent it, none of it acknowledged where it
/// counts (the promoted copy of the slot). So the duplicates lie in the transactions ending
/// after the copy's position and at or before the walsender's `sent_lsn` read just before
/// the vanish (`sent_behind` rows), plus what it sent between that reading and the vanish:
/// the drain rate over that moment, and a transaction of each writer committing in it (at
/// most X rows each, the backlog's included).
fn vanish_duplicate_bound(sent_behind: usize, rate: f64, fault_took: Duration, x: usize) -> usize {
    let writers = WRITERS + 1;
    sent_behind + (rate * fault_took.as_secs_f64()).ceil() as usize + writers * x
}

/// The writers of scenario 1, through the multi-host URL.
const WRITERS: usize = 4;

/// Scenario 1: a PostgreSQL `major` pair on the lab's pg1 (primary) and pg2 (standby), a
/// failover slot and `synchronized_standby_slots`, the relay on its own host through both
/// servers in one URL, 4 writers. The primary's host vanishes and the standby is promoted
/// at once, as an HA manager would; the relay, whose replication connection to the old
/// primary hears nothing, must give it up within T and find the new primary among the
/// hosts (all asked at once, so the silent one costs no connect timeout). L0 and no phantom
/// against the rows on the new primary, DUP after the promoted copy's position and within
/// the vanish bound (what the walsender had sent), ACK on the new primary. The pair is
/// dropped while its primary's host is still gone.
async fn primary_vanishes(scenario: &str, major: u32, load: Load) {
    let (lab, _lock) = shared().await;
    let _pair_hosts = blocking(|| lab.lock_pg_pair());
    let began = Instant::now();
    let (primary_host, standby_host) = lab.pg_pair_hosts();
    let hosts = (primary_host, standby_host);
    let pair = blocking(|| FailoverPair::start_on(hosts, major, PairOptions::default(), &[]));
    let outbox = pair.outbox(&lab.cluster.url(1), "d1").await;
    let db = database_of(&outbox).to_string();
    let oracle = Oracle {
        slot: format!("{}_oracle", outbox.slot),
    };
    create_standby_oracle(&pair, &db, &oracle.slot).await;
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let url = pair.multi_host_url(&db);
    let relay_host = lab.relay_host(D1_RELAY);
    let brokers = lab.cluster.url_list();
    let (relay, at) = spawn_relay_via(&outbox, relay_host, (&url, &brokers), &[]);
    let ready = pair.wait_failover_ready(&outbox.slot, MINUTE).await;
    ready.unwrap_or_else(|e| panic!("{scenario}: {e}; log:\n{}", relay.log()));
    let writers = Writers::start(&writers_url(&url), WRITERS, 1, Duration::from_millis(20));
    wait_confirmed(&relay, at, 200.0).await;
    let (rate, x) = match load {
        Load::Idle => (confirm_rate(at).await, 1),
        Load::FullSpeed => {
            let fault_at = consumer.received().len() + (BACKLOG as f64 * FAULT_AT) as usize;
            let seeding = common::failover::seed_backlog(&outbox.client, BACKLOG, BACKLOG_TXN_ROWS);
            let measuring = peak_rate_until(&mut consumer, fault_at, MINUTE);
            let ((), rate) = tokio::join!(seeding, measuring);
            assert!(
                consumer.received().len() >= fault_at,
                "{scenario}: the backlog drains; log:\n{}",
                relay.log()
            );
            (rate, BACKLOG_TXN_ROWS)
        }
    };
    let in_flight = metric_value(&scrape(at).await, MESSAGES_IN_FLIGHT);
    let seen_before = consumer.received().len();
    // What the walsender had sent the relay before the fault: the relay publishes it all.
    let holder = super::slot_holder(&outbox.client, &outbox.slot).await;
    let sent = holder
        .sent
        .unwrap_or_else(|| panic!("{scenario}: no walsender streams the slot: {holder:?}"));
    let read_at = Instant::now();
    let gone = lab.net.vanish(primary_host);
    let vanished = Instant::now();
    let fault_took = read_at.elapsed();
    // Where the relay must resume: the standby's copy, which nothing moves any more.
    let copy = pair.standby_copy(&outbox.slot).await;
    let copy = copy.unwrap_or_else(|| panic!("{scenario}: the standby has no copy of the slot"));
    assert!(copy.is_ready(), "{scenario}: {copy:?}");
    let resume_at = copy.confirmed_flush.expect("a synced position");
    let client = pair.promote(&db).await;
    let promoted = Instant::now();
    // Streaming on the new primary: the slot held by a walsender of the relay's host.
    let on_relay_host = |h: &super::SlotHolder| h.client == Some(relay_host.addr());
    let what = "the relay streams the slot on the new primary";
    wait_holder(&client, &outbox.slot, GIVE_UP, what, on_relay_host).await;
    let (promotion_to_streaming, vanish_to_streaming) = (promoted.elapsed(), vanished.elapsed());
    // Times are figures of the report below, not bounds: that the relay streams on the new
    // primary at all, within GIVE_UP rather than the operating system's hours, is the
    // property.

    // The writers reconnect to the new primary and go on.
    let committed = writers.committed();
    let more = if load == Load::Idle { 300 } else { 1_000 };
    assert!(
        writers.wait_committed(committed + more, MINUTE).await,
        "{scenario}: the writers commit on the new primary"
    );
    let writers_back = vanished.elapsed();
    writers.stop().await;
    let rows = outbox_ids(&client).await;
    assert!(
        common::faults::wait_for_ids(&mut consumer, &rows, Duration::from_secs(180)).await,
        "{scenario}: L0: {} of {} rows on the new primary arrived; log:\n{}",
        rows.len() - Tally::of(consumer.received()).lost(&rows).len(),
        rows.len(),
        relay.log()
    );
    let page = scrape(at).await;
    relay.stop().await;
    let ack = check_ack(&client, &outbox, &oracle, &mut consumer).await;
    let tally = Tally::of(consumer.received());
    assert!(tally.lost(&rows).is_empty(), "{scenario}: L0");
    let phantoms = tally.unknown(&rows);
    assert!(
        phantoms.is_empty(),
        "{scenario}: {} messages whose rows are not on the new primary, e.g. {:?}",
        phantoms.len(),
        &phantoms[..phantoms.len().min(5)]
    );
    // Only what the promoted copy had not acknowledged comes again.
    let transactions = oracle.transactions(&client).await;
    let after_copy: HashSet<String> = transactions
        .iter()
        .filter(|t| t.end_lsn > resume_at)
        .flat_map(|t| t.inserted_ids(OUTBOX_TABLE))
        .collect();
    let repeated_before_copy = tally
        .counts
        .iter()
        .filter(|(id, n)| **n > 1 && !after_copy.contains(id.as_str()))
        .count();
    assert_eq!(
        repeated_before_copy,
        0,
        "{scenario}: rows acknowledged in the promoted slot ({}) arrived twice",
        format_lsn(resume_at)
    );
    let rows_between = |from: u64, to: u64| -> usize {
        transactions
            .iter()
            .filter(|t| t.end_lsn > from && t.end_lsn <= to)
            .map(|t| t.inserted_ids(OUTBOX_TABLE).len())
            .sum()
    };
    let copy_behind = rows_between(resume_at, holder.confirmed_flush);
    let sent_behind = rows_between(resume_at, sent);
    let bound = vanish_duplicate_bound(sent_behind, rate, fault_took, x);
    // Stopped and removed while its primary's host is still gone: pg_ctl needs no network.
    let dropping = Instant::now();
    drop(pair);
    let dropped = dropping.elapsed();
    drop(gone);
    let failovers = |verdict: &str| {
        let series =
            common::http::series(POSTGRES_FAILOVERS_TOTAL, &[(PHANTOM_EVENTS_LABEL, verdict)]);
        metric_value(&page, &series).unwrap_or(0.0).to_string()
    };
    report_within(
        scenario,
        began,
        (&rows, &tally),
        ("bound sent behind + rate x F + (writers + 1) x X", bound),
        &[
            ("PostgreSQL", major.to_string()),
            ("peer timeout", secs(PEER_TIMEOUT)),
            ("copy behind (rows)", copy_behind.to_string()),
            ("sent behind the copy (rows)", sent_behind.to_string()),
            ("drain rate", format!("{rate:.0}/s")),
            (
                "in flight at the vanish",
                in_flight.map_or("?".into(), |n| format!("{n:.0}")),
            ),
            ("consumed before the vanish", seen_before.to_string()),
            (
                "vanish to streaming on the new primary",
                secs(vanish_to_streaming),
            ),
            ("promotion to streaming", secs(promotion_to_streaming)),
            ("vanish to writers committing again", secs(writers_back)),
            (
                "relay's failover verdicts none/possible",
                format!("{}/{}", failovers("none"), failovers("possible")),
            ),
            (
                "pair dropped with its primary's host gone in",
                secs(dropped),
            ),
            (
                "acknowledged rows checked",
                ack.acknowledged_rows.to_string(),
            ),
            ("reconnects", reconnect_causes(&page)),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "8 minutes of waiting out partitions: scripts/test.sh runs them last, alone (or only them with --partitions)"]
async fn the_primarys_host_vanishes_idle_and_the_relay_streams_on_the_promoted_pg17_standby() {
    primary_vanishes(
        "d1a primary's host vanishes, idle, PostgreSQL 17",
        17,
        Load::Idle,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "8 minutes of waiting out partitions: scripts/test.sh runs them last, alone (or only them with --partitions)"]
async fn the_primarys_host_vanishes_mid_backlog_and_the_relay_streams_on_the_promoted_pg18_standby()
{
    let scenario = "d1b primary's host vanishes, full speed, PostgreSQL 18";
    primary_vanishes(scenario, 18, Load::FullSpeed).await;
}

// ---------------------------------------------------------------------------------
// 2. The relay's broker node's host vanishes

/// Scenario 2: the relay streams through the node it picked; the quorum queue is led by
/// another node. The relay's node's host vanishes: the relay's socket hears nothing, so its
/// user timeout (T, with data unacknowledged) or the AMQP heartbeat (T; lapin gives up after
/// 2 T) ends the session, and it moves to another node. Delivery goes on within 2 × the
/// heartbeat. The cluster is whole again before the test ends; 0 lost, duplicates ≤ (W + X)
/// × reconnects.
///
/// Not here: the relay's node leading the queue as well. Then the cluster must notice the
/// loss (`net_ticktime`) and elect a new leader, and RabbitMQ 3.10 leaves what the relay
/// publishes on its new node before that unconfirmed: the confirm timeout (30 s) ends it,
/// about 39 s in all (docs/network-failures.md, "Dead peers: what a vanished host costs").
/// That is the broker's cost, not a timeout of the relay's.
/// Which node leads the quorum queue when the relay's node vanishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leader {
    /// Another node: the queue keeps its leader.
    Elsewhere,
    /// The vanishing node: the rest of the cluster must notice (`net_ticktime`) and elect
    /// another before anything the relay publishes on its new node is confirmed.
    Vanishing,
}

async fn brokers_host_vanishes(scenario: &str, load: Load, leads: Leader) {
    let (lab, _lock) = exclusive().await;
    let began = Instant::now();
    let cluster = &lab.cluster;
    let (mut outbox, oracle) = quorum_outbox(lab, 0, "d2").await;
    let relay_host = lab.relay_host(0);
    let urls = (outbox.db_url.clone(), cluster.url_list());
    let (relay, at) = spawn_relay_via(&outbox, relay_host, (&urls.0, &urls.1), &[]);
    // The relay shuffles its broker list: the queue moves to another node than the one it
    // picked, before anything is written (a new quorum queue is led by the node that
    // declares it).
    let node = cluster.wait_node_in_use(&relay, at, None, MINUTE).await;
    let stays = (node + 1) % cluster.len();
    let leader = match leads {
        Leader::Elsewhere => stays,
        Leader::Vanishing => node,
    };
    let queue = format!("{}_{leader}", outbox.queue);
    let on_leader = cluster.url(leader);
    let quorum = quorum_queue_arguments();
    declare_bound_queue_with_args(&on_leader, &outbox.exchange, &queue, "#", quorum).await;
    delete_queue(&on_leader, &outbox.queue).await;
    outbox.queue = queue;
    assert_eq!(blocking(|| cluster.quorum_leader(&outbox.queue)), leader);
    // The test's own clients go through a node that stays.
    outbox.amqp_url = cluster.url(stays);
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let writers = Writers::start(&outbox.db_url, 2, MAX_TXN_ROWS, Duration::from_millis(20));
    wait_confirmed(&relay, at, 300.0).await;
    if load == Load::FullSpeed {
        let fault_at = consumer.received().len() + (BACKLOG as f64 * FAULT_AT) as usize;
        let seeding = common::failover::seed_backlog(&outbox.client, BACKLOG, BACKLOG_TXN_ROWS);
        let arriving = consumer.wait_for(fault_at, MINUTE);
        let ((), arrived) = tokio::join!(seeding, arriving);
        assert!(
            arrived.len() >= fault_at,
            "the backlog drains; log:\n{}",
            relay.log()
        );
    }
    let before = scrape(at).await;
    let in_flight = metric_value(&before, MESSAGES_IN_FLIGHT);
    let gone = lab.net.vanish(lab.rabbit_host(node));
    let vanished = Instant::now();
    let (mut moved, mut confirmed_when_moved) = (None, 0.0);
    let deadline = vanished + GIVE_UP;
    let streaming = loop {
        let text = scrape(at).await;
        if moved.is_none() && cluster.nodes_in_use(&text).iter().any(|&n| n != node) {
            moved = Some(vanished.elapsed());
            confirmed_when_moved = confirmed(&text);
        } else if moved.is_some() && confirmed(&text) > confirmed_when_moved {
            break vanished.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "{scenario}: {} after node {node}'s host vanished: moved {moved:?}, no confirm \
             since (reconnects {}); log:\n{}",
            secs(GIVE_UP),
            reconnect_causes(&text),
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let heartbeat = PEER_TIMEOUT;
    gone.heal();
    let whole = wait_whole_in_background(lab);
    let probe = delivered_after(
        &relay,
        &outbox.client,
        &mut consumer,
        AFTER_HEAL,
        "the move",
    )
    .await;
    writers.stop().await;
    let text = scrape(at).await;
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    let whole = blocking(|| joined(whole));
    let x = MAX_TXN_ROWS.max(BACKLOG_TXN_ROWS);
    let reconnected = metric_sum(&text, RECONNECTS_TOTAL).unwrap_or(0.0) as usize;
    let bound = (W + x) * reconnected;
    report_within(
        scenario,
        began,
        (&committed, &tally),
        ("bound (W+X) x reconnects", bound),
        &[
            ("AMQP heartbeat (the peer timeout)", secs(heartbeat)),
            (
                "in flight at the vanish",
                in_flight.map_or("?".into(), |n| format!("{n:.0}")),
            ),
            (
                "vanish to relay on another node",
                secs(moved.unwrap_or_default()),
            ),
            ("vanish to delivering again", secs(streaming)),
            ("heal to cluster whole", secs(whole)),
            (
                "paused nodes the kit restarted (so far)",
                lab.cluster.repairs().to_string(),
            ),
            ("probe after", secs(probe)),
            ("reconnects", reconnect_causes(&text)),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "8 minutes of waiting out partitions: scripts/test.sh runs them last, alone (or only them with --partitions)"]
async fn the_relays_broker_host_vanishes_idle_and_delivery_goes_on_through_another_node() {
    brokers_host_vanishes(
        "d2a relay's broker node's host vanishes, idle",
        Load::Idle,
        Leader::Elsewhere,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "8 minutes of waiting out partitions: scripts/test.sh runs them last, alone (or only them with --partitions)"]
async fn the_relays_broker_host_vanishes_mid_backlog_and_delivery_goes_on_through_another_node() {
    let scenario = "d2b relay's broker node's host vanishes, full speed";
    brokers_host_vanishes(scenario, Load::FullSpeed, Leader::Elsewhere).await;
}

/// The relay's node also leads the quorum queue (d2′ of crates/outbox-bench/lab/scenarios.md):
/// on 3.10 what the relay published on its new node before the election was never confirmed,
/// and only the confirm timeout (30 s) ended the wait, 39 s after the vanish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "8 minutes of waiting out partitions: scripts/test.sh runs them last, alone (or only them with --partitions)"]
async fn the_relays_broker_host_vanishes_leading_the_quorum_queue_and_delivery_goes_on_after_the_election(
) {
    let scenario = "d2c relay's broker node, the quorum queue's leader, vanishes, full speed";
    brokers_host_vanishes(scenario, Load::FullSpeed, Leader::Vanishing).await;
}

// ---------------------------------------------------------------------------------
// 3. A consumer replica vanishes holding a claim

/// How long replica A's effect takes on a `slow-…` message: long enough that its host
/// vanishes while the claim is open (the test vanishes it the moment it sees the sleep),
/// short next to the bound.
const SLOW_EFFECT_SECS: u32 = 2;
/// The consumer name both replicas share.
const CONSUMER: &str = "dead-peers";

/// The effect both replicas run: one row per application, naming the host that applied it.
/// On replica A's host, a `slow-…` message sleeps first, with the message's id in
/// `application_name` for the transaction (so pg_stat_activity shows which claim A holds).
fn effect_sql(slow_on: Ipv4Addr) -> String {
    format!(
        "INSERT INTO effect (message_id, applied_by) SELECT $1, host(inet_client_addr()) \
         FROM pg_sleep(CASE WHEN $1 LIKE 'slow-%' AND inet_client_addr() = '{slow_on}'::inet \
         AND set_config('application_name', 'applying ' || $1, true) <> '' \
         THEN {SLOW_EFFECT_SECS} ELSE 0 END)"
    )
}

/// `outbox-inbox consume` on `host`.
pub(super) fn spawn_replica(
    host: &Host,
    db_url: &str,
    amqp_url: &str,
    queue: &str,
    sql: &str,
) -> RelayProcess {
    spawn_replica_with(host, (db_url, amqp_url), queue, sql, &[])
}

/// [`spawn_replica`] with more environment (e.g. `OUTBOX_INBOX_FAILPOINTS`).
pub(super) fn spawn_replica_with(
    host: &Host,
    (db_url, amqp_url): (&str, &str),
    queue: &str,
    sql: &str,
    extra_env: &[(&str, &str)],
) -> RelayProcess {
    let args = [
        "consume",
        "--database-url",
        db_url,
        "--amqp-url",
        amqp_url,
        "--queue",
        queue,
        "--consumer",
        CONSUMER,
        "--effect-sql",
        sql,
        "--cleanup-interval",
        "0",
        "--max-backoff",
        "2s",
    ];
    let mut env = vec![
        ("RUST_LOG", "info,outbox_inbox=debug"),
        INBOX_PEER_TIMEOUT,
        INBOX_STATEMENT_TIMEOUT,
    ];
    env.extend_from_slice(extra_env);
    RelayProcess::spawn_bin_on(inbox_binary(), host, &args, &env)
}

/// Message ids of a test's publisher: every `slow_every`-th a `slow-…` one.
fn message_id(i: usize, slow_every: usize) -> String {
    if i % slow_every == slow_every - 1 {
        format!("slow-{i}")
    } else {
        format!("m-{i}")
    }
}

/// A publisher of a trickle of messages (one every 20 ms, confirmed) into `queue` until
/// stopped: an idle consumer's load. Returns the ids it published.
struct Trickle {
    stop: Arc<AtomicBool>,
    published: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Trickle {
    async fn start(url: &str, queue: &str, slow_every: usize) -> Trickle {
        let connection = amqp_connect(url).await;
        let channel = connection.create_channel().await.expect("a channel");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm_select");
        let stop = Arc::new(AtomicBool::new(false));
        let published = Arc::new(Mutex::new(Vec::new()));
        let queue = queue.to_string();
        let task = tokio::spawn({
            let (stop, published) = (stop.clone(), published.clone());
            async move {
                let _connection = connection;
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let id = message_id(i, slow_every);
                    let properties = BasicProperties::default()
                        .with_message_id(id.clone().into())
                        .with_delivery_mode(2);
                    let options = BasicPublishOptions::default();
                    let confirm = channel
                        .basic_publish("".into(), queue.as_str().into(), options, b"{}", properties)
                        .await
                        .expect("publish");
                    let confirmation = confirm.await.expect("confirm");
                    assert!(confirmation.is_ack(), "{id} nacked");
                    published.lock().unwrap().push(id);
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        });
        Trickle {
            stop,
            published,
            task,
        }
    }

    async fn stop(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the trickle");
        let published = self.published.lock().unwrap().clone();
        published
    }
}

/// A database of the lab's PostgreSQL for consumers' effects: `outbox-inbox setup` run in it,
/// and an `effect` table (one row per application, naming the applying host). Its URL and a
/// client.
pub(super) async fn effects_database(lab: &Lab, prefix: &str) -> (String, Client) {
    let db_url = lab.pg.create_database(&unique_name(prefix)).await;
    let setup = blocking(|| {
        std::process::Command::new(inbox_binary())
            .args(["setup", "--database-url", &db_url])
            .env_remove("DATABASE_URL")
            .output()
            .expect("run outbox-inbox setup")
    });
    assert!(setup.status.success(), "outbox-inbox setup: {setup:?}");
    let client = pg_connect(&db_url).await;
    client
        .batch_execute(
            "CREATE TABLE effect (n bigserial PRIMARY KEY, message_id text NOT NULL, \
             applied_by text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())",
        )
        .await
        .expect("create the effect table");
    (db_url, client)
}

/// The messages that have an effect, with how many each, and who applied them.
pub(super) async fn effects(client: &Client) -> HashMap<String, (i64, String)> {
    let rows = client
        .query(
            "SELECT message_id, count(*), string_agg(applied_by, ',') FROM effect \
             GROUP BY message_id",
            &[],
        )
        .await
        .expect("read the effects");
    rows.iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect()
}

/// The `slow-…` message a session from `host` sleeps on, if one does: the claim it holds.
async fn sleeping_on(client: &Client, host: &Host) -> Option<String> {
    let row = client
        .query_opt(
            "SELECT substr(application_name, 10) FROM pg_stat_activity \
             WHERE client_addr = $1::text::inet AND application_name LIKE 'applying slow-%' \
             AND wait_event = 'PgSleep' LIMIT 1",
            &[&host.addr().to_string()],
        )
        .await
        .expect("read pg_stat_activity");
    row.map(|r| r.get(0))
}

/// Sessions the server still has from `host`.
async fn sessions_from(client: &Client, host: &Host) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE client_addr = $1::text::inet",
            &[&host.addr().to_string()],
        )
        .await
        .expect("read pg_stat_activity")
        .get(0)
}

/// Scenario 3: two replicas of one consumer on one quorum queue, each on its own host,
/// applying into the lab's PostgreSQL. Replica A's host vanishes while A holds the claim of a
/// message whose effect it is running (its transaction is open). RabbitMQ hands A's
/// unacknowledged deliveries to B once A's heartbeat (T/2) has been silent 2-3 times; B's
/// claim of that message waits for A's open claim until PostgreSQL ends A's session (T, from
/// A's startup options), and then applies it: within 10 s. At the end every message has
/// exactly one effect and one inbox row.
async fn replica_vanishes(scenario: &str, load: Load, (a, b): (usize, usize)) {
    let (lab, _lock) = shared().await;
    let began = Instant::now();
    let (host_a, host_b) = (lab.relay_host(a), lab.relay_host(b));
    let (db_url, client) = effects_database(lab, "d3").await;
    // The queue on node 1, which nothing here cuts; both replicas consume through it.
    let amqp = lab.cluster.url(1);
    let queue = unique_name("d3_q");
    let exchange = format!("{queue}_x");
    declare_bound_queue_with_args(&amqp, &exchange, &queue, "#", quorum_queue_arguments()).await;
    let sql = effect_sql(host_a.addr());
    let mut backlog = Vec::new();
    if load == Load::FullSpeed {
        backlog = (0..BACKLOG).map(|i| message_id(i, 250)).collect();
        let messages: Vec<(&str, &[u8])> =
            backlog.iter().map(|id| (id.as_str(), &b"{}"[..])).collect();
        for chunk in messages.chunks(2_000) {
            publish_confirmed(&amqp, "", &queue, chunk).await;
        }
    }
    let replica_a = spawn_replica(host_a, &db_url, &amqp, &queue, &sql);
    let replica_b = spawn_replica(host_b, &db_url, &amqp, &queue, &sql);
    let trickle = match load {
        Load::Idle => Some(Trickle::start(&amqp, &queue, 25).await),
        Load::FullSpeed => None,
    };
    if load == Load::FullSpeed {
        let drained = (BACKLOG as f64 * FAULT_AT) as i64;
        let sql = "SELECT count(*) FROM effect";
        let applied = wait_count(&client, sql, MINUTE * 2, |n| n >= drained).await;
        assert!(
            applied.is_ok(),
            "{scenario}: {applied:?} of {drained} applied; A:\n{}\nB:\n{}",
            replica_a.log(),
            replica_b.log()
        );
    }
    let applied_before: i64 = query_value(&client, "SELECT count(*) FROM effect").await;
    // The moment A is seen in the effect of a slow message, its host vanishes: its claim is
    // open, its transaction cannot commit any more.
    let held = poll(MINUTE, async || sleeping_on(&client, host_a).await).await;
    let held = held.unwrap_or_else(|| {
        panic!(
            "{scenario}: replica A never applied a slow message; A:\n{}",
            replica_a.log()
        )
    });
    let gone = lab.net.vanish(host_a);
    let vanished = Instant::now();
    let (mut a_reaped, mut applied) = (None, None);
    let deadline = vanished + GIVE_UP;
    while applied.is_none() {
        if a_reaped.is_none() && sessions_from(&client, host_a).await == 0 {
            a_reaped = Some(vanished.elapsed());
        }
        if let Some((_, by)) = effects(&client).await.remove(&held) {
            applied = Some((vanished.elapsed(), by));
        }
        assert!(
            Instant::now() < deadline,
            "{scenario}: {held}, whose claim A held when its host vanished, is not applied {} \
             later (A's sessions gone after {a_reaped:?}); B:\n{}",
            secs(GIVE_UP),
            replica_b.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (took, applied_by) = applied.expect("applied");
    assert_eq!(
        applied_by,
        host_b.addr().to_string(),
        "{scenario}: {held} applied by B, once (A's transaction never committed)"
    );
    let published = match trickle {
        Some(trickle) => trickle.stop().await,
        None => backlog,
    };
    // B alone applies the rest.
    let expected = published.len() as i64;
    let all = "SELECT count(DISTINCT message_id) FROM effect";
    let done = wait_count(&client, all, MINUTE * 3, |n| n >= expected).await;
    assert!(
        done.is_ok(),
        "{scenario}: {done:?} of {expected} applied; B:\n{}",
        replica_b.log()
    );
    replica_a.kill9();
    drop(gone);
    replica_b.stop().await;
    let effects = effects(&client).await;
    let twice: Vec<(&String, &(i64, String))> =
        effects.iter().filter(|(_, (n, _))| *n > 1).collect();
    assert!(
        twice.is_empty(),
        "{scenario}: applied more than once: {twice:?}"
    );
    let wanted: HashSet<&str> = published.iter().map(String::as_str).collect();
    let got: HashSet<&str> = effects.keys().map(String::as_str).collect();
    assert_eq!(
        got, wanted,
        "{scenario}: every message published has its effect"
    );
    let claimed: i64 = query_value(
        &client,
        &format!("SELECT count(*) FROM inbox WHERE consumer = '{CONSUMER}'"),
    )
    .await;
    assert_eq!(claimed, expected, "{scenario}: one inbox row per message");
    let by_a = effects
        .values()
        .filter(|(_, by)| *by == host_a.addr().to_string())
        .count();
    report(
        scenario,
        &[
            ("messages", expected.to_string()),
            ("lost", "0".into()),
            ("applied twice", "0".into()),
            ("applied before the vanish", applied_before.to_string()),
            (
                "applied by A (committed before the vanish)",
                by_a.to_string(),
            ),
            ("peer timeout (heartbeat T/2)", secs(PEER_TIMEOUT)),
            (
                "A's effect on a slow message",
                format!("{SLOW_EFFECT_SECS} s"),
            ),
            (
                "vanish to A's sessions ended by PostgreSQL",
                a_reaped.map_or("?".into(), secs),
            ),
            ("vanish to the held message applied by B", secs(took)),
            ("scenario took", secs(began.elapsed())),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "8 minutes of waiting out partitions: scripts/test.sh runs them last, alone (or only them with --partitions)"]
async fn a_consumer_replica_vanishes_holding_a_claim_idle_and_the_other_applies_it_once() {
    let scenario = "d3a consumer replica vanishes holding a claim, idle";
    replica_vanishes(scenario, Load::Idle, D3_IDLE_REPLICAS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "8 minutes of waiting out partitions: scripts/test.sh runs them last, alone (or only them with --partitions)"]
async fn a_consumer_replica_vanishes_holding_a_claim_mid_backlog_and_the_other_applies_it_once() {
    let scenario = "d3b consumer replica vanishes holding a claim, full speed";
    replica_vanishes(scenario, Load::FullSpeed, D3_BACKLOG_REPLICAS).await;
}

// ---------------------------------------------------------------------------------
// 4. A relay vanishes while it backfills a lost slot

/// Rows committed while the relays are stopped, so that the lost slot's backfill lasts
/// several seconds.
const GAP_ROWS: usize = 40_000;
/// The backfill's margin before the recorded commit time (tests/failover_recovery.rs).
const MARGIN: Duration = Duration::from_secs(2);
/// `run` flags of a relay that recreates a lost slot, recording its state every second.
const RECREATE: [&str; 6] = [
    "--on-slot-lost",
    "recreate",
    "--recreate-margin",
    "2s",
    "--cleanup-interval",
    "1s",
];

/// The acknowledged commit time the relay recorded for `slot` in `outbox_relay_state`.
async fn recorded_commit(client: &Client, slot: &str) -> Option<SystemTime> {
    let row = client
        .query_opt(
            "SELECT acknowledged_commit FROM outbox_relay_state WHERE slot = $1",
            &[&slot],
        )
        .await
        .expect("read outbox_relay_state");
    row.and_then(|r| r.get(0))
}

/// Whether a session from `host` holds an advisory lock in the outbox's database (the
/// recovery's: nothing else there takes one).
async fn holds_advisory_lock(client: &Client, host: &Host) -> bool {
    client
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND a.client_addr = $1::text::inet \
             AND a.datname = current_database())",
            &[&host.addr().to_string()],
        )
        .await
        .expect("read pg_locks")
        .get(0)
}

/// Scenario 4: relay A streams and records its acknowledged commit, stops; 40,000 rows are
/// committed and the slot is lost (dropped, as a failover without failover slots loses it).
/// A starts again under `--on-slot-lost recreate`, takes the recovery's advisory lock and
/// backfills the gap; B starts beside it on another host and waits as its standby. A's host
/// vanishes mid-backfill. The lock sits on an idle connection of A's, which only the
/// server's keepalive (T, from A's startup options) ends: B must take the recovery over
/// within T and a few seconds, and stream once its own backfill is done. Every row arrives;
/// a repeat is a row at or after the backfill's lower bound (the recorded commit minus the
/// margin), at most once per backfill besides its first delivery; ACK on B's slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "8 minutes of waiting out partitions: scripts/test.sh runs them last, alone (or only them with --partitions)"]
async fn a_relay_vanishes_mid_backfill_of_a_lost_slot_and_its_standby_takes_the_recovery_over() {
    let scenario = "d4 relay vanishes mid-backfill of a lost slot";
    let (lab, _lock) = shared().await;
    let began = Instant::now();
    let (outbox, oracle) = quorum_outbox(lab, 1, "d4").await;
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let (host_a, host_b) = (lab.relay_host(D4_RELAYS.0), lab.relay_host(D4_RELAYS.1));
    let urls = (outbox.db_url.clone(), lab.cluster.url_list());
    let urls = (urls.0.as_str(), urls.1.as_str());
    let writers = Writers::start(&outbox.db_url, 2, MAX_TXN_ROWS, Duration::from_millis(20));
    let (a, at_a) = spawn_relay_via(&outbox, host_a, urls, &RECREATE);
    wait_confirmed(&a, at_a, 200.0).await;
    let now: SystemTime = query_value(&outbox.client, "SELECT now()").await;
    let recorded = poll(MINUTE, async || {
        recorded_commit(&outbox.client, &outbox.slot)
            .await
            .filter(|at| *at >= now)
    })
    .await;
    assert!(
        recorded.is_some(),
        "the state is recorded; log:\n{}",
        a.log()
    );
    a.stop().await;
    let marker = barrier(&mut consumer, &outbox.amqp_url, &outbox.queue).await;
    let delivered_before: HashSet<String> = ids_of(&consumer.received()[..marker])
        .into_iter()
        .map(String::from)
        .collect();
    common::faults::seed_backlog(&outbox, GAP_ROWS, None).await;
    drop_slot_once_released(&outbox.client, &outbox.slot).await;
    let recorded = recorded_commit(&outbox.client, &outbox.slot).await;
    let recorded = recorded.expect("an acknowledged commit recorded");

    let arrived_at_restart = consumer.received().len();
    let (a, _) = spawn_relay_via(&outbox, host_a, urls, &RECREATE);
    let locked = poll(MINUTE, async || {
        holds_advisory_lock(&outbox.client, host_a)
            .await
            .then_some(())
    });
    assert!(
        locked.await.is_some(),
        "A takes the recovery; log:\n{}",
        a.log()
    );
    let (b, at_b) = spawn_relay_via(&outbox, host_b, urls, &RECREATE);
    let b_up = wait_http(at_b, "/readyz", MINUTE, |_| true).await;
    assert!(b_up.is_some(), "B serves its endpoints; log:\n{}", b.log());
    // Mid-backfill: a fifth of the gap published, A still holding the lock.
    let backfilling = arrived_at_restart + GAP_ROWS / 5;
    consumer.wait_for(backfilling, MINUTE).await;
    assert!(
        consumer.received().len() >= backfilling,
        "A's backfill publishes; log:\n{}",
        a.log()
    );
    assert!(
        holds_advisory_lock(&outbox.client, host_a).await,
        "{scenario}: A finished its backfill before its host vanished (raise GAP_ROWS); log:\n{}",
        a.log()
    );
    let published_by_a = consumer.received().len() - arrived_at_restart;
    let gone = lab.net.vanish(host_a);
    let vanished = Instant::now();
    let (mut a_released, mut b_recovering) = (None, None);
    let deadline = vanished + GIVE_UP;
    let streaming = loop {
        if a_released.is_none() && !holds_advisory_lock(&outbox.client, host_a).await {
            a_released = Some(vanished.elapsed());
        }
        if b_recovering.is_none() && holds_advisory_lock(&outbox.client, host_b).await {
            b_recovering = Some(vanished.elapsed());
        }
        if streamed_from(&outbox.client, &outbox.slot).await == Some(host_b.addr()) {
            break vanished.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "{scenario}: B does not stream {} after A's host vanished mid-backfill (A's lock \
             released {a_released:?}, B recovering {b_recovering:?}): PostgreSQL keeps A's \
             recovery lock on its idle connection until a keepalive ends it; B:\n{}",
            secs(GIVE_UP),
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let b_recovering = b_recovering.expect("B recovered before it streamed");
    // A's machine stays off: killed while its host is gone.
    a.kill9();
    drop(gone);
    writers.stop().await;
    let created: HashMap<String, SystemTime> = outbox
        .client
        .query("SELECT id::text, created_at FROM outbox", &[])
        .await
        .expect("read the outbox table")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let every_row: Vec<String> = created.keys().cloned().collect();
    assert!(
        common::faults::wait_for_ids(&mut consumer, &every_row, Duration::from_secs(180)).await,
        "{scenario}: L0: every row arrives; B:\n{}",
        b.log()
    );
    b.stop().await;
    let ack = check_ack(&outbox.client, &outbox, &oracle, &mut consumer).await;
    let tally = Tally::of(consumer.received());
    common::faults::assert_nothing_lost_or_invented(&tally, &every_row);
    // A repeat is a row the backfills hold (created at or after the lower bound): once per
    // backfill (A's, B's), and once more if it was delivered before the slot was lost.
    let from = recorded - MARGIN;
    let backfilled: HashSet<&str> = created
        .iter()
        .filter(|(_, at)| **at >= from)
        .map(|(id, _)| id.as_str())
        .collect();
    for (id, n) in &tally.counts {
        let most = 2 + usize::from(delivered_before.contains(id));
        assert!(
            *n == 1 || (backfilled.contains(id.as_str()) && *n <= most),
            "{scenario}: row {id} arrived {n} times (backfilled: {}, delivered before the \
             loss: {})",
            backfilled.contains(id.as_str()),
            delivered_before.contains(id)
        );
    }
    let before_in_bound = backfilled
        .iter()
        .filter(|id| delivered_before.contains(**id))
        .count();
    let bound = backfilled.len() + before_in_bound;
    report_within(
        scenario,
        began,
        (&every_row, &tally),
        (
            "bound rows(backfill) + rows(backfill, delivered before)",
            bound,
        ),
        &[
            ("peer timeout", secs(PEER_TIMEOUT)),
            ("gap rows", GAP_ROWS.to_string()),
            ("backfill's rows", backfilled.len().to_string()),
            (
                "published by A before the vanish",
                published_by_a.to_string(),
            ),
            (
                "vanish to A's lock released by PostgreSQL",
                a_released.map_or("?".into(), secs),
            ),
            ("vanish to B recovering", secs(b_recovering)),
            ("vanish to B streaming the new slot", secs(streaming)),
            (
                "acknowledged rows checked",
                ack.acknowledged_rows.to_string(),
            ),
        ],
    );
}

/// The client address of the walsender streaming `slot`, if one does (during a recovery
/// the slot is dropped and made again, and unread while the backfill runs).
async fn streamed_from(client: &Client, slot: &str) -> Option<Ipv4Addr> {
    let row = client
        .query_opt(
            "SELECT host(r.client_addr) FROM pg_replication_slots s \
             JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1",
            &[&slot],
        )
        .await
        .expect("read the slot and its walsender")?;
    row.get::<_, Option<&str>>(0).and_then(|a| a.parse().ok())
}
