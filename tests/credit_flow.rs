//! The confirm timeout against a broker that holds the relay's connection in credit flow (scenario
//! x1 of crates/outbox-bench/lab/scenarios.md): RabbitMQ stops reading the connection's socket,
//! sends no `connection.blocked`, and neither side's heartbeat ends the connection. On one private
//! node without a partition: the outbox's classic queue process is suspended (`sys:suspend`), so it
//! takes no more messages and grants no more credit. A backlog committed then fills the relay's
//! window: the channel publishing to the queue runs out of credit after 400 messages, the
//! connection's reader after 400 more, and the connection shows as `flow` with the rest of the
//! window unread in its socket. (Suspending the queue under a window that is already full is not
//! enough: the queue took those messages before it stopped, owes only their confirms, and no credit
//! runs out.)
//!
//! Oracles from outside the relay: RabbitMQ's own view of the connection
//! (`rabbitmqctl list_connections`), the relay's `/metrics` (reconnect causes, the blocked
//! gauge), the `test_decoding` slot, the queue, and the slot after the relay stopped (ACK).

use outbox_relay::metrics::{
    BROKER_BLOCKED, CAUSE_LABEL, MESSAGES_CONFIRMED_TOTAL, MESSAGES_IN_FLIGHT, RECONNECTS_TOTAL,
};
use outbox_testkit as common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::faults::{
    finish, report_tally, secs, seed_backlog, Oracle, Tally, Writers, SEED_TXN_ROWS,
};
use common::http::{metric_value, metrics};
use common::outbox::Outbox;
use common::{Consumer, RabbitServer};
use tokio::time::Instant;

/// The window, as the relay's default, passed explicitly: the duplicate bound depends on it.
const W: usize = 1024;
/// Short enough to run in a test, long enough that a healthy drain never trips it.
const CONFIRM_TIMEOUT_SECS: u64 = 3;
/// Rows committed before the relay starts: drained at full speed, the window full.
const BACKLOG_ROWS: usize = 30_000;
/// Largest transaction the background writers commit.
const WRITER_TXN_ROWS: usize = 10;
const MINUTE: Duration = Duration::from_secs(60);

/// The sessions the confirm timeout ended.
fn confirm_timeouts() -> String {
    common::http::series(RECONNECTS_TOTAL, &[(CAUSE_LABEL, "confirm_timeout")])
}

/// Runs a blocking harness call (server start, rabbitmqctl) without stalling the runtime.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    tokio::task::block_in_place(f)
}

/// [`RabbitServer::suspend_queue`], without stalling the runtime.
fn suspend_queue(rabbit: &RabbitServer, queue: &str, suspended: bool) {
    blocking(|| rabbit.suspend_queue(queue, suspended));
}

/// The state of each AMQP connection of `rabbit`, as RabbitMQ reports it (`running`, `flow`,
/// `blocked`, …).
fn connection_states(rabbit: &RabbitServer) -> Vec<String> {
    let out = rabbit.ctl(&["list_connections", "--no-table-headers", "state"]);
    assert!(out.status.success(), "list_connections: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| line.trim().to_string())
        .filter(|line| !line.is_empty() && !line.starts_with("Listing"))
        .collect()
}

/// Polls [`connection_states`] on a thread of its own (each call takes about a second) until
/// dropped: what it saw, and after how long it first saw a connection in `flow`.
struct FlowWatch {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<(Vec<String>, Option<Duration>)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FlowWatch {
    fn start(rabbit: &'static RabbitServer) -> FlowWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new((Vec::new(), None)));
        let thread = {
            let (stop, seen) = (Arc::clone(&stop), Arc::clone(&seen));
            let started = std::time::Instant::now();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let states = connection_states(rabbit);
                    let mut seen = seen.lock().expect("flow watch");
                    if seen.1.is_none() && states.iter().any(|state| state == "flow") {
                        seen.1 = Some(started.elapsed());
                    }
                    seen.0 = states;
                }
            })
        };
        FlowWatch {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// The newest states seen, and when `flow` was first seen.
    fn seen(&self) -> (Vec<String>, Option<Duration>) {
        self.seen.lock().expect("flow watch").clone()
    }
}

impl Drop for FlowWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn value(metrics: &str, series: &str) -> f64 {
    metric_value(metrics, series).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_held_in_credit_flow_is_given_up_after_the_confirm_timeout_and_nothing_is_lost(
) {
    let pair = blocking(common::private_services);
    let rabbit = &pair.rabbit;
    let outbox = Outbox::on(&pair.pg.url("postgres"), &rabbit.url(), "flow").await;
    let oracle = Oracle::create(&outbox).await;
    let timeout = CONFIRM_TIMEOUT_SECS.to_string();
    let window = W.to_string();
    let (relay, port) = outbox.spawn_observed(&[
        "--confirm-timeout",
        &timeout,
        "--max-in-flight",
        &window,
        "--max-backoff",
        "2s",
    ]);
    let writers = Writers::start(
        &outbox.db_url,
        2,
        WRITER_TXN_ROWS,
        Duration::from_millis(20),
    );
    let streaming = common::http::wait_metrics(port, MINUTE, |m| {
        value(m, MESSAGES_CONFIRMED_TOTAL) >= 500.0
    })
    .await;
    assert!(
        value(&streaming, MESSAGES_CONFIRMED_TOTAL) >= 500.0,
        "the relay streams before the queue is suspended; log:\n{}",
        relay.log()
    );

    suspend_queue(rabbit, &outbox.queue, true);
    // The writers' next rows go into the suspended queue: the clock starts about here.
    let suspended_at = Instant::now();
    let confirmed_before = value(&metrics(port).await, MESSAGES_CONFIRMED_TOTAL);
    let watch = FlowWatch::start(rabbit);
    // A backlog at full speed into the suspended queue: the window fills at once.
    seed_backlog(&outbox, BACKLOG_ROWS, None).await;
    // Watch the relay until the confirm timeout ends its session: how full its window got, and
    // whether the broker ever blocked it (it must not: this is credit flow, not an alarm).
    let (mut most_in_flight, mut ever_blocked) = (0.0f64, 0.0f64);
    let timed_out_after = loop {
        let text = metrics(port).await;
        most_in_flight = most_in_flight.max(value(&text, MESSAGES_IN_FLIGHT));
        ever_blocked = ever_blocked.max(value(&text, BROKER_BLOCKED));
        if value(&text, &confirm_timeouts()) >= 1.0 {
            break suspended_at.elapsed();
        }
        assert!(
            suspended_at.elapsed() < Duration::from_secs(CONFIRM_TIMEOUT_SECS + 30),
            "no confirm timeout {} s after the queue was suspended (in flight {}, confirmed {} since {confirmed_before}, connections {:?}); log:\n{}",
            suspended_at.elapsed().as_secs(),
            value(&text, MESSAGES_IN_FLIGHT),
            value(&text, MESSAGES_CONFIRMED_TOTAL),
            watch.seen(),
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // A while longer suspended: each new session times out again, on its first publish; and
    // RabbitMQ's own view: the connection given up still sits in flow (the broker reads
    // nothing from it, not even the relay's close) while the queue stays suspended.
    let before_resume = Instant::now();
    while before_resume.elapsed() < Duration::from_secs(2 * CONFIRM_TIMEOUT_SECS) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (states, flow_seen_after) = watch.seen();
    drop(watch);
    let text = metrics(port).await;
    let timeouts_while_suspended = value(&text, &confirm_timeouts());
    let confirmed_while_suspended = value(&text, MESSAGES_CONFIRMED_TOTAL) - confirmed_before;
    assert!(
        flow_seen_after.is_some(),
        "no connection in flow while the queue was suspended (last seen: {states:?})"
    );
    assert_eq!(
        ever_blocked, 0.0,
        "the broker blocked the relay (connection.blocked): not the case under test"
    );
    assert_eq!(
        most_in_flight, W as f64,
        "the window was full when the broker stopped reading"
    );
    assert_eq!(
        confirmed_while_suspended, 0.0,
        "nothing can be confirmed by a suspended queue"
    );

    suspend_queue(rabbit, &outbox.queue, false);
    let resumed_at = Instant::now();
    common::http::wait_metrics(port, MINUTE, |m| {
        value(m, MESSAGES_CONFIRMED_TOTAL) > confirmed_before
    })
    .await;
    let streaming_again = resumed_at.elapsed();
    writers.stop().await;
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let sessions = relay.sessions();
    let (committed, tally) = finish(&outbox.client, &outbox, &oracle, &mut consumer, &relay).await;
    let bound = W + SEED_TXN_ROWS * sessions;
    report_tally(
        "credit flow: backlog into a suspended queue",
        &committed,
        &tally,
        &[
            ("bound W + X × sessions", bound.to_string()),
            ("confirm timeout", format!("{CONFIRM_TIMEOUT_SECS} s")),
            (
                "suspend to first confirm_timeout reconnect",
                secs(timed_out_after),
            ),
            ("most in flight", most_in_flight.to_string()),
            ("flow seen after", format!("{flow_seen_after:?}")),
            (
                "confirm_timeout reconnects while suspended",
                timeouts_while_suspended.to_string(),
            ),
            ("resume to streaming again", secs(streaming_again)),
            ("sessions", sessions.to_string()),
        ],
    );
    assert_within(&tally, bound);
}

/// DUP: every timed-out session may leave its unconfirmed window in the queue (W for the full
/// one, X, a seeded transaction's rows, for each retry that replays the open transaction).
fn assert_within(tally: &Tally, bound: usize) {
    assert!(
        tally.duplicates() <= bound,
        "DUP: {} duplicates, bound {bound}",
        tally.duplicates()
    );
}
