//! A peer that stops reading is not a dead peer. While RabbitMQ holds the relay back (credit
//! flow, a memory alarm), nothing more the relay sends is read: its publishes pile up in its
//! AMQP socket, and it stops reading its replication stream, whose socket fills while a busy
//! database goes on writing. Linux (5.11+) ends a connection whose zero window lasts its user timeout, answered
//! probes or not. So no user timeout may sit on either end of those two connections, or a
//! stall longer than `--peer-timeout` costs a reconnect and a window of re-publishes
//! (docs/network-failures.md, "Dead peers: what a vanished host costs"); dead peers are
//! noticed by heartbeats instead.
//!
//! Each test holds the stall for five peer timeouts after the zero window is seen (the kernel's
//! own queues, `/proc/net/tcp`, are the witness, at the start and at the end of the stall),
//! then asserts that the connection outlived it.

use outbox_testkit as common;

use std::time::Duration;

use common::faults::{finish, observed_outbox, report_tally, secs, slot_state};
use common::procfs::{tcp_queues_from, tcp_queues_to, TcpQueues};
use common::{PgServer, RabbitServer};
use tokio::time::Instant;

const MINUTE: Duration = Duration::from_secs(60);
/// The shortest `--peer-timeout`: the stall lasts several of them.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long each stall is held once the zero window is seen.
const HELD: Duration = Duration::from_secs(5 * 2);
/// Bytes waiting in a socket queue that only a peer that stopped reading leaves there (more
/// than any pause in a flowing connection).
const STALLED: u64 = 1024 * 1024;
/// Bytes waiting at both ends of a connection at once, for the whole stall: unread in the
/// receiver's queue and unsent in the sender's. A receiver's buffer grows from 128 KiB only
/// as fast as it reads, so a reader that stops early may hold far less than [`STALLED`];
/// data held at both ends for seconds is a zero window whatever the size.
const HELD_AT_BOTH_ENDS: u64 = 16 * 1024;

fn blocking<R>(f: impl FnOnce() -> R) -> R {
    tokio::task::block_in_place(f)
}

/// Waits (a minute at most) until `queued()` reads at least `at_least` bytes; returns that
/// reading.
async fn wait_queued(at_least: u64, queued: impl Fn() -> u64) -> Option<u64> {
    let deadline = Instant::now() + MINUTE;
    loop {
        let now = queued();
        if now >= at_least {
            return Some(now);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The most bytes `which` picks from any connection among `queues`.
fn most(queues: Vec<TcpQueues>, which: fn(&TcpQueues) -> u64) -> u64 {
    queues.iter().map(which).max().unwrap_or(0)
}

/// Unsent at the AMQP broker's peer: the most any connection to `port` holds in its send
/// queue.
fn unsent_to(port: u16) -> u64 {
    most(tcp_queues_to(port), |q| q.send)
}

/// Held at both ends of the replication connection to PostgreSQL on `port`: the smaller of
/// what the relay has not read and what the walsender has not sent.
fn held_at_both_ends(port: u16) -> u64 {
    let unread = most(tcp_queues_to(port), |q| q.receive);
    let unsent = most(tcp_queues_from(port), |q| q.send);
    unread.min(unsent)
}

/// Inserts `rows` rows of about `kib` KiB each (distinct text, so nothing compresses them
/// away on the wire), in transactions of 10.
async fn insert_large_rows(outbox: &common::outbox::Outbox, rows: i32, kib: i32) {
    outbox
        .client
        .batch_execute(&format!(
            "DO $$ BEGIN FOR t IN 0..{} LOOP \
               INSERT INTO outbox (event_type, payload) \
               SELECT 'Large', jsonb_build_object('pad', repeat(md5((t * 10 + i)::text), {})) \
               FROM generate_series(1, 10) AS i; \
               COMMIT; END LOOP; END $$",
            rows / 10 - 1,
            kib * 32
        ))
        .await
        .expect("insert the large rows");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_stops_reading_a_full_window_of_large_publishes_keeps_the_connection() {
    let rabbit = std::thread::spawn(RabbitServer::start);
    let pg = blocking(|| PgServer::start(&[]));
    let rabbit = blocking(|| rabbit.join()).expect("rabbitmq start");
    let (outbox, oracle, mut consumer) = observed_outbox(&pg, &rabbit, "zw_amqp", false).await;
    let peer_timeout = PEER_TIMEOUT.as_secs().to_string();
    // Credit flow sends no connection.blocked: lapin goes on writing the whole window, and
    // what the broker no longer reads stays in the socket. The stall must not reach the
    // confirm timeout, which ends a session held in credit flow by design (credit_flow.rs).
    let relay = outbox.spawn_relay(&["--peer-timeout", &peer_timeout, "--confirm-timeout", "120s"]);
    outbox.insert("Before", "{}").await;
    consumer.wait_for(1, MINUTE).await;
    assert_eq!(consumer.received().len(), 1, "log:\n{}", relay.log());

    blocking(|| rabbit.suspend_queue(&outbox.queue, true));
    // The queue takes no more, the channel runs out of credit after 400 publishes and the
    // connection's reader after 400 more; 1,100 rows of 256 KiB leave the rest of the window
    // (224 publishes, 56 MiB) to the sockets, more than both ends' buffers hold (autotuned
    // receive buffers grow to net.ipv4.tcp_rmem's maximum, 32 MiB here, and a receiver with
    // room never closes its window).
    insert_large_rows(&outbox, 1_100, 256).await;
    let amqp_port = rabbit.amqp_port();
    let queued = wait_queued(STALLED, || unsent_to(amqp_port)).await;
    assert!(
        queued.is_some(),
        "the relay's publishes never piled up in its socket; log:\n{}",
        relay.log()
    );
    let stalled_at = Instant::now();
    tokio::time::sleep(HELD).await;
    let held = stalled_at.elapsed();
    let reconnects = relay.reconnects();
    let still_queued = unsent_to(amqp_port);
    blocking(|| rabbit.suspend_queue(&outbox.queue, false));
    assert_eq!(
        reconnects,
        0,
        "the AMQP connection ended while the broker did not read it; log:\n{}",
        relay.log()
    );
    assert!(
        still_queued >= STALLED,
        "the window stayed closed for the whole stall ({still_queued} bytes queued at its end); log:\n{}",
        relay.log()
    );

    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    report_tally(
        "zero window on the AMQP connection",
        &committed,
        &tally,
        &[
            (
                "queued at the stall",
                format!("{} bytes", queued.unwrap_or(0)),
            ),
            ("queued at its end", format!("{still_queued} bytes")),
            ("held", secs(held)),
            ("reconnects", relay.reconnects().to_string()),
        ],
    );
    assert_eq!(tally.duplicates(), 0, "no reconnect, so no replay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirms_held_back_while_the_database_is_busy_keep_the_replication_session() {
    let rabbit = std::thread::spawn(RabbitServer::start);
    let pg = blocking(|| PgServer::start(&[]));
    let rabbit = blocking(|| rabbit.join()).expect("rabbitmq start");
    let (outbox, oracle, mut consumer) = observed_outbox(&pg, &rabbit, "zw_repl", false).await;
    let peer_timeout = PEER_TIMEOUT.as_secs().to_string();
    let relay = outbox.spawn_relay(&["--peer-timeout", &peer_timeout]);
    outbox.insert("Before", "{}").await;
    consumer.wait_for(1, MINUTE).await;
    assert_eq!(consumer.received().len(), 1, "log:\n{}", relay.log());
    let (_, _, walsender) = slot_state(&outbox.client, &outbox.slot)
        .await
        .expect("slot");

    // Small publishes fill the relay's window without filling its AMQP socket; then it stops
    // reading the stream, and the rows written meanwhile (about 60 MiB of WAL) pile up in the
    // replication connection.
    blocking(|| rabbit.set_memory_alarm(true));
    insert_large_rows(&outbox, 30_000, 2).await;
    let pg_port = pg.port();
    let unread = wait_queued(HELD_AT_BOTH_ENDS, || held_at_both_ends(pg_port)).await;
    assert!(
        unread.is_some(),
        "the stream never piled up at both ends of the replication connection; log:\n{}",
        relay.log()
    );
    let stalled_at = Instant::now();
    tokio::time::sleep(HELD).await;
    let held = stalled_at.elapsed();
    let reconnects = relay.reconnects();
    let still_held = held_at_both_ends(pg_port);
    let (_, _, walsender_after) = slot_state(&outbox.client, &outbox.slot)
        .await
        .expect("slot");
    blocking(|| rabbit.set_memory_alarm(false));
    assert_eq!(
        (reconnects, walsender_after),
        (0, walsender),
        "the replication session ended while the relay held back; log:\n{}",
        relay.log()
    );
    assert!(
        still_held >= HELD_AT_BOTH_ENDS,
        "the window stayed closed for the whole stall ({still_held} bytes held at both ends at \
         its end); log:\n{}",
        relay.log()
    );

    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    report_tally(
        "zero window on the replication connection",
        &committed,
        &tally,
        &[
            (
                "held at both ends at the stall",
                format!("{} bytes", unread.unwrap_or(0)),
            ),
            ("at its end", format!("{still_held} bytes")),
            ("held", secs(held)),
            ("reconnects", relay.reconnects().to_string()),
        ],
    );
    assert_eq!(tally.duplicates(), 0, "no reconnect, so no replay");
}
