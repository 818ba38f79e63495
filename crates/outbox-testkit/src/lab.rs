//! The partition tests' lab: one set of test hosts per test process ([`Lab::shared`]), each
//! server on a host of its own, so that a test can cut any link between them
//! ([`super::netns`]).
//!
//! ```text
//!   rabbit0  rabbit1  rabbit2     a 3-node cluster (pause_minority, net_ticktime 10 s,
//!                                 the stream protocol on one port)
//!   postgres                      PostgreSQL (wal_level=logical, wal_sender_timeout 5 s)
//!   relay0 … relay13              one relay (or consumer replica) each (the tests start them)
//!   pg1  pg2                      a test's own PostgreSQL failover pair (primary, standby),
//!                                 one test at a time (Lab::lock_pg_pair)
//!   the test process              on the bridge: writers, consumers, oracles, rabbitmqctl
//! ```
//!
//! The test process itself is never cut off: its writers, consumers and oracles see the
//! servers as an operator's monitoring would, from outside the partition. (A host made to
//! vanish is gone for the test process too, as for everyone: that is what vanishing is.) `rabbitmqctl`
//! runs on each node's own host, so it reaches a node whatever the node's links.
//!
//! Starting it takes as long as the cluster (20-35 s on 2 busy cores); PostgreSQL starts
//! meanwhile. It is stopped when the process exits (an `atexit` handler: the cluster, the
//! server, then the network, which kills anything left on the hosts), or by the watchdogs
//! of its parts if the process dies without running it.
//!
//! Tests share it: a test that cuts broker nodes apart (the whole cluster is affected) holds
//! [`Lab::lock_exclusive`]; a test that cuts only its own relay's links holds
//! [`Lab::lock_shared`] and may run beside the others of its kind. Every test calls
//! [`RabbitCluster::ensure_healthy`] at its start and heals its cuts (a [`Cut`] heals when
//! dropped, also when a test panics).
//!
//! [`Cut`]: super::netns::Cut

use std::sync::{Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use super::netns::{Host, Network};
use super::pg::PgServer;
use super::rabbit_cluster::RabbitCluster;

/// The lab nodes' Erlang `net_ticktime`: a node declares a silent peer down after between
/// 0.75 and 1.25 times this (RabbitMQ's default is 60 s). It decides how soon a minority
/// notices that it is one and pauses.
pub const NET_TICKTIME_SECS: u64 = 10;

/// The lab server's `wal_sender_timeout` (PostgreSQL's default is 60 s): a walsender whose
/// relay sent nothing for this long ends the session and releases the slot.
pub const WAL_SENDER_TIMEOUT: Duration = Duration::from_secs(5);

/// Hosts for relays: relay0 … relay13. A test that runs beside others (shared lock) and
/// makes one of its hosts vanish has hosts no other test uses.
pub const RELAY_HOSTS: usize = 14;

/// The hosts of a test's own failover pair ([`super::failover::FailoverPair::start_on`]):
/// the primary's and the standby's.
pub const PG_PAIR_HOSTS: [&str; 2] = ["pg1", "pg2"];

/// The hosts, the cluster on rabbit0-2 and PostgreSQL on `postgres`.
pub struct Lab {
    pub net: Network,
    pub cluster: RabbitCluster,
    pub pg: PgServer,
}

static LAB: OnceLock<Result<Lab, String>> = OnceLock::new();
static LOCK: RwLock<()> = RwLock::new(());
static PG_PAIR: Mutex<()> = Mutex::new(());

impl Lab {
    /// The lab of this test process, made on first use (blocking) and removed when the
    /// process exits. Panics, saying why, where it cannot be made (no network namespaces:
    /// the tests fail, they never pass without their partitions).
    pub fn shared() -> &'static Lab {
        let lab = LAB.get_or_init(|| {
            let started = Instant::now();
            let names = ["rabbit0", "rabbit1", "rabbit2", "postgres"]
                .into_iter()
                .map(String::from)
                .chain((0..RELAY_HOSTS).map(|i| format!("relay{i}")))
                .chain(PG_PAIR_HOSTS.into_iter().map(String::from))
                .collect::<Vec<_>>();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let net = std::panic::catch_unwind(|| Network::create(&names))
                .map_err(|e| super::panic_message(&*e))?;
            let rabbit_hosts: Vec<Host> = net.hosts()[..3].to_vec();
            let pg_host = net.host("postgres").clone();
            let ticktime = format!("net_ticktime = {NET_TICKTIME_SECS}");
            let cluster = std::thread::spawn(move || {
                RabbitCluster::start_on(&rabbit_hosts, &[ticktime.as_str()])
            });
            let timeout = format!("{}s", WAL_SENDER_TIMEOUT.as_secs());
            let pg = std::panic::catch_unwind(|| {
                PgServer::start_on(&pg_host, &[("wal_sender_timeout", timeout.as_str())])
            });
            let cluster = cluster.join();
            match (cluster, pg) {
                (Ok(cluster), Ok(pg)) => {
                    static AT_EXIT: std::sync::Once = std::sync::Once::new();
                    // SAFETY: registering a plain `extern "C" fn` with no arguments.
                    AT_EXIT.call_once(|| unsafe {
                        libc::atexit(remove_lab_at_exit);
                    });
                    eprintln!("harness: lab ready in {:?}", started.elapsed());
                    Ok(Lab { net, cluster, pg })
                }
                // What did start is stopped by its Drop here, the network last.
                (cluster, pg) => Err(format!(
                    "rabbitmq cluster: {}; postgres: {}",
                    cluster
                        .err()
                        .map(|e| super::panic_message(&*e))
                        .unwrap_or("ok".into()),
                    pg.err()
                        .map(|e| super::panic_message(&*e))
                        .unwrap_or("ok".into()),
                )),
            }
        });
        match lab {
            Ok(lab) => lab,
            Err(message) => panic!("the partition lab could not be made: {message}"),
        }
    }

    /// The host of cluster node `i` (0-2).
    pub fn rabbit_host(&self, i: usize) -> &Host {
        &self.net.hosts()[i]
    }

    /// PostgreSQL's host.
    pub fn pg_host(&self) -> &Host {
        self.net.host("postgres")
    }

    /// Relay host `i` (0 .. [`RELAY_HOSTS`]).
    pub fn relay_host(&self, i: usize) -> &Host {
        assert!(
            i < RELAY_HOSTS,
            "relay hosts are relay0 .. relay{}",
            RELAY_HOSTS - 1
        );
        self.net.host(&format!("relay{i}"))
    }

    /// The hosts of a failover pair, primary's first: hold [`Lab::lock_pg_pair`] while a pair
    /// runs on them.
    pub fn pg_pair_hosts(&self) -> (&Host, &Host) {
        let [primary, standby] = PG_PAIR_HOSTS;
        (self.net.host(primary), self.net.host(standby))
    }

    /// For a test that runs a failover pair on [`Lab::pg_pair_hosts`]: one such test at a
    /// time (a second pair's servers would share the hosts, and a vanish would take both).
    /// Take it after [`Lab::lock_shared`]; a test that panicked holding it does not block the
    /// others.
    pub fn lock_pg_pair(&self) -> MutexGuard<'static, ()> {
        PG_PAIR.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// For a test that cuts broker nodes apart: no other test runs meanwhile. A test that
    /// panicked while holding it does not block the others.
    pub fn lock_exclusive(&self) -> RwLockWriteGuard<'static, ()> {
        LOCK.write().unwrap_or_else(|e| e.into_inner())
    }

    /// For a test that cuts only its own relay's links: others of its kind may run beside it.
    pub fn lock_shared(&self) -> RwLockReadGuard<'static, ()> {
        LOCK.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the cluster and the server and removes the network; idempotent.
    pub fn shutdown(&self) {
        self.cluster.shutdown();
        self.pg.shutdown();
        self.net.remove();
    }
}

extern "C" fn remove_lab_at_exit() {
    // Nothing may unwind out of an `extern "C"` function.
    let _ = std::panic::catch_unwind(|| {
        if let Some(Ok(lab)) = LAB.get() {
            lab.shutdown();
        }
    });
}
