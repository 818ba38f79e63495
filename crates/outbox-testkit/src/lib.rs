//! The integration-test harness of outbox-relay, shared by its test binary (tests/main.rs,
//! `use outbox_testkit as common;`), the inbox's tests and the benchmark. It owns the servers and processes a test
//! needs around the relay and the oracles that judge it from outside; it must never link
//! the relay library (the relay runs only as its binary, see [`relay::binary`]) nor be a
//! dependency of the product.
//!
//! - [`pg`]: a private PostgreSQL (initdb in a temp dir, `wal_level=logical`) and the
//!   `test_decoding` commit-order oracle.
//! - [`rabbit`]: a private RabbitMQ node (own node name, ports and data dir).
//! - [`rabbit_release`]: which RabbitMQ series every node runs (`OUTBOX_TEST_RABBITMQ`:
//!   4.0 by default, 4.3, or Debian 12's 3.10), and how a command reaches it.
//! - [`rabbit_cluster`]: a private 3-node RabbitMQ cluster (`pause_minority`), one per test
//!   process, for the failover tests: kill, restart and quorum queue leaders by node index.
//! - [`amqp`]: queue and exchange topology, publishing with confirms, and a consumer that
//!   collects deliveries.
//! - [`arrivals`]: a consumer that records only each delivery's id, sequence, LSN and
//!   receive time, acknowledging in batches (the benchmark's and the demo's).
//! - [`proxy`]: a TCP proxy that delays, black-holes or resets connections.
//! - [`netns`]: test hosts as network namespaces on a private bridge, and partitions between
//!   them (nftables drop rules); [`lab`]: the partition tests' hosts with a cluster,
//!   PostgreSQL and relays each on its own.
//! - [`relay`]: the `outbox-relay` binary as a child process, and waiting on its log.
//! - [`procfs`]: a process's CPU time and peak memory from /proc.
//! - [`http`]: `GET` on the relay's HTTP endpoints and reading Prometheus samples.
//! - [`outbox`]: an outbox provisioned by the relay's own `setup`, and writers.
//! - [`faults`]: crash-riding writers, the L0/DUP/ACK oracles and a queue barrier.
//! - [`failover`]: a PostgreSQL primary with a streaming standby (failover slots synced on
//!   17+), promotion, and the multi-host URL of both.
//! - [`nemesis`]: a seeded, reproducible schedule of mixed faults (kills, pauses,
//!   partitions, promotions, alarms) within rules the system must survive; it only plans.
//! - [`tls`]: certificates made with the `openssl` CLI.
//!
//! Ordinary tests share one server pair per test process through [`services`], and give
//! every database, slot and queue its own [`unique_name`]. Fault tests, which kill and
//! restart servers, start private ones with [`PgServer::start`] and [`RabbitServer::start`];
//! the failover tests share the process's [`RabbitCluster::shared`] and [`private_pg`].
//!
//! Servers outlive a test process only if it is killed with SIGKILL before the cleanup
//! watchdog notices (it checks once a second): every server is stopped by `Drop`, the
//! shared ones by an `atexit` handler, and a detached watchdog stops them if the test
//! process dies without running either.

pub mod amqp;
pub mod arrivals;
pub mod failover;
pub mod faults;
pub mod http;
pub mod lab;
pub mod manual;
pub mod nemesis;
pub mod netns;
pub mod outbox;
pub mod pg;
pub mod procfs;
pub mod proxy;
pub mod rabbit;
pub mod rabbit_cluster;
pub mod rabbit_release;
pub mod relay;
pub mod tls;

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use amqp::{
    declare_bound_queue, declare_bound_queue_with_args, delete_queue, queue_message_count,
    Consumer, Received,
};
pub use pg::{
    create_test_decoding_slot, current_wal_lsn, format_lsn, parse_lsn, pg_connect,
    read_test_decoding, read_test_decoding_with_messages, slot_confirmed_flush, Change, PgServer,
    Txn,
};
pub use proxy::{Direction, Mode, TcpProxy};
pub use rabbit::RabbitServer;
pub use rabbit_cluster::RabbitCluster;
pub use relay::RelayProcess;

/// Environment variable naming an existing PostgreSQL (any database; the harness creates
/// its own databases on that server) to use instead of a private one.
pub const DATABASE_URL_ENV: &str = "OUTBOX_TEST_DATABASE_URL";
/// Environment variable naming an existing RabbitMQ to use instead of a private node.
pub const AMQP_URL_ENV: &str = "OUTBOX_TEST_AMQP_URL";
/// Environment variable that, set to `1`, lets a test that needs the harness's own
/// PostgreSQL skip when [`DATABASE_URL_ENV`] names an external one (see [`own_postgres`]).
pub const ALLOW_SKIP_ENV: &str = "OUTBOX_TEST_ALLOW_SKIP";

/// Whether a test that needs the harness's own PostgreSQL server (`why`: what it does to
/// the server that an external one would not allow) can run: `true` unless
/// [`DATABASE_URL_ENV`] names an external server. Then it panics naming the need, unless
/// [`ALLOW_SKIP_ENV`] is `1`, in which case it says it skips and returns `false`: a test
/// passes without running only when someone asked for that.
pub fn own_postgres(why: &str) -> bool {
    let external = std::env::var(DATABASE_URL_ENV).is_ok_and(|url| !url.is_empty());
    if !external {
        return true;
    }
    assert!(
        std::env::var(ALLOW_SKIP_ENV).is_ok_and(|allow| allow == "1"),
        "this test needs the harness's own PostgreSQL ({why}), and {DATABASE_URL_ENV} names \
         an external one: unset it, or set {ALLOW_SKIP_ENV}=1 to skip such tests"
    );
    eprintln!("skipped ({ALLOW_SKIP_ENV}=1): needs the harness's own PostgreSQL ({why})");
    false
}

/// A server process the harness started itself, which it must stop and clean up.
pub(crate) trait PrivateServer {
    /// Stops the server and removes its directory; idempotent.
    fn shutdown(&self);
}

/// A server: a private one the harness started, or an external one named by an environment
/// variable (its URL and port are all the harness knows, and it never stops it). Dropping a
/// private one shuts it down.
pub(crate) enum ServerKind<P: PrivateServer> {
    Private(P),
    External { url: String, port: u16 },
}

impl<P: PrivateServer> ServerKind<P> {
    /// The private server that `server::method` needs; panics for an external one (named by
    /// `env`).
    pub(crate) fn private(&self, server: &str, method: &str, env: &str) -> &P {
        match self {
            ServerKind::Private(p) => p,
            ServerKind::External { .. } => panic!(
                "{server}::{method} needs a private server; this one is external ({env}): \
                 fault tests must use {server}::start"
            ),
        }
    }

    /// Shuts a private server down; nothing for an external one.
    pub(crate) fn shutdown(&self) {
        if let ServerKind::Private(p) = self {
            p.shutdown();
        }
    }
}

impl<P: PrivateServer> Drop for ServerKind<P> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The server pair shared by the tests of one test process.
pub struct Services {
    pub pg: PgServer,
    pub rabbit: RabbitServer,
}

static SERVICES: OnceLock<Result<Services, String>> = OnceLock::new();
static PRIVATE_SERVICES: OnceLock<Result<Services, String>> = OnceLock::new();
static PRIVATE_PG: OnceLock<PgServer> = OnceLock::new();

/// The shared PostgreSQL and RabbitMQ of this test process, started on first use (both in
/// parallel, with blocking process calls: fine from any thread, inside a runtime or not)
/// and stopped when the process exits. [`DATABASE_URL_ENV`] and [`AMQP_URL_ENV`] name
/// existing servers to use instead.
pub fn services() -> &'static Services {
    services_in(&SERVICES, true)
}

/// Like [`services`], but always a private pair, whatever the environment says: for tests
/// that reach the servers' ports through a proxy or need servers of their own.
pub fn private_services() -> &'static Services {
    services_in(&PRIVATE_SERVICES, false)
}

fn services_in(
    cell: &'static OnceLock<Result<Services, String>>,
    external: bool,
) -> &'static Services {
    let services = cell.get_or_init(|| {
        let started = Instant::now();
        let url_of = move |name: &str| {
            std::env::var(name)
                .ok()
                .filter(|url| external && !url.is_empty())
        };
        let rabbit = std::thread::spawn(move || match url_of(AMQP_URL_ENV) {
            Some(url) => RabbitServer::external(&url),
            None => RabbitServer::start(),
        });
        let pg = std::panic::catch_unwind(|| match url_of(DATABASE_URL_ENV) {
            Some(url) => PgServer::external(&url),
            None => PgServer::start(&[]),
        });
        let rabbit = rabbit.join();
        match (pg, rabbit) {
            (Ok(pg), Ok(rabbit)) => {
                stop_services_at_exit_once();
                eprintln!(
                    "harness: shared services ready in {:?} (postgres {} server_version {}, \
                     rabbitmq {})",
                    started.elapsed(),
                    pg.url("postgres"),
                    pg.server_version(),
                    rabbit.url()
                );
                Ok(Services { pg, rabbit })
            }
            // Whichever side did start is stopped by its Drop here.
            (pg, rabbit) => Err(format!(
                "postgres: {}; rabbitmq: {}",
                pg.err().map(|e| panic_message(&*e)).unwrap_or("ok".into()),
                rabbit
                    .err()
                    .map(|e| panic_message(&*e))
                    .unwrap_or("ok".into()),
            )),
        }
    });
    match services {
        Ok(services) => services,
        Err(message) => panic!("the shared test services failed to start: {message}"),
    }
}

/// A private PostgreSQL of this test process alone, started on first use and stopped when the
/// process exits: for tests whose broker is not a [`Services`] one (the
/// [`RabbitCluster`]'s).
pub fn private_pg() -> &'static PgServer {
    PRIVATE_PG.get_or_init(|| {
        let pg = PgServer::start(&[]);
        stop_services_at_exit_once();
        pg
    })
}

/// Registers [`stop_services_at_exit`] with `atexit`, once.
fn stop_services_at_exit_once() {
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: registering a plain `extern "C" fn` with no arguments.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(stop_services_at_exit);
    });
}

extern "C" fn stop_services_at_exit() {
    // Nothing may unwind out of an `extern "C"` function.
    let _ = std::panic::catch_unwind(|| {
        for cell in [&SERVICES, &PRIVATE_SERVICES] {
            if let Some(Ok(services)) = cell.get() {
                services.rabbit.shutdown();
                services.pg.shutdown();
            }
        }
        if let Some(pg) = PRIVATE_PG.get() {
            pg.shutdown();
        }
    });
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        "unknown panic".to_string()
    }
}

/// A fresh lowercase name, safe as a PostgreSQL identifier (at most 63 bytes), a
/// replication slot name (`[a-z0-9_]`) and a queue name: `prefix_pid_counter_suffix`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // A short suffix that differs between runs (and between processes reusing a pid).
    let mixed = nanos.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (n << 17);
    let suffix = to_base36(mixed % 36u64.pow(5));
    let mut clean: String = prefix
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect();
    if !clean.starts_with(|c: char| c.is_ascii_lowercase()) {
        clean.insert(0, 't');
    }
    let tail = format!("_{}_{n}_{suffix}", std::process::id());
    clean.truncate(63 - tail.len());
    clean + &tail
}

fn to_base36(mut v: u64) -> String {
    let mut out = Vec::new();
    loop {
        out.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(v % 36) as usize]);
        v /= 36;
        if v == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ascii")
}

/// What a finished command printed: its stdout, then its stderr.
pub fn output_text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A TCP port on 127.0.0.1 that was free a moment ago and that this process has not
/// handed out before. Skips the well-known ports of the system services and the range
/// `rabbitmqctl` binds for its own distribution listener (35672-35682).
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind an ephemeral port on 127.0.0.1")
            .port();
        if (35672..=35682).contains(&port) || [4369, 5432, 5672, 25672].contains(&port) {
            continue;
        }
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if given.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
    panic!("no free port found on 127.0.0.1 after 100 attempts");
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_is_open(port: u16) -> bool {
    port_is_open_at(Ipv4Addr::LOCALHOST, port)
}

/// Whether something accepts TCP connections on `addr`:`port` (e.g. a test host's).
pub fn port_is_open_at(addr: Ipv4Addr, port: u16) -> bool {
    TcpStream::connect_timeout(&(addr, port).into(), Duration::from_millis(200)).is_ok()
}

/// The last `n` lines of a text file, or a note that it could not be read.
pub fn tail_file(path: &std::path::Path, n: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

/// Whether this process runs as root (then the server binaries run as their own users).
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Recursively hands `path` to `user` (no-op when not root or the user does not exist).
pub(crate) fn chown_to(path: &std::path::Path, user: &str) {
    if !is_root() {
        return;
    }
    let status = Command::new("chown")
        .arg("-R")
        .arg(format!("{user}:{user}"))
        .arg(path)
        .status()
        .expect("run chown");
    assert!(
        status.success(),
        "chown -R {user} {} failed",
        path.display()
    );
}

/// Starts a detached shell (own session, so a terminal's Ctrl-C reaches only the test)
/// that waits for this test process to die and then runs `cleanup`. It catches the
/// exits that skip `Drop` and `atexit` (SIGKILL, a signal's default action). The owner
/// kills the watchdog when it cleans up itself.
pub(crate) fn spawn_watchdog(cleanup: &str) -> Option<Child> {
    use std::os::unix::process::CommandExt;
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {cleanup}",
        pid = std::process::id()
    );
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .ok()
}

/// Kills and reaps a watchdog from [`spawn_watchdog`]: its owner cleaned up itself.
pub(crate) fn stop_watchdog(watchdog: Option<Child>) {
    if let Some(mut watchdog) = watchdog {
        let _ = watchdog.kill();
        let _ = watchdog.wait();
    }
}

/// Quotes a string for `sh`.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// SplitMix64: a tiny, well-mixed, seedable generator, for schedules a seed must repeat
/// (transaction sizes, a flapping partition's cuts).
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration in [`low`, `high`), to the millisecond.
    pub fn between(&mut self, low: Duration, high: Duration) -> Duration {
        let span = (high - low).as_millis().max(1) as u64;
        low + Duration::from_millis(self.next_u64() % span)
    }
}

/// Polls `f` every `every` until it returns true or `timeout` passes.
pub fn poll_until(timeout: Duration, every: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(every);
    }
}
