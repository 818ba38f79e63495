//! A private 3-node RabbitMQ cluster, shared by the tests of one test process
//! ([`RabbitCluster::shared`]), for the failover tests (a node dies, a quorum queue elects a
//! new leader, a minority pauses).
//!
//! Each node is a [`rabbit`](super::rabbit) node of its own (name, AMQP and distribution
//! ports, data dir) with `cluster_partition_handling = pause_minority` and a 64 MiB Raft WAL
//! (see `start_once`). The nodes share the `rabbitmq` user's cookie (the Debian wrappers run
//! them as that user), so nodes 1 and 2 join node 0 with `rabbitmqctl stop_app;
//! join_cluster; start_app`. Seen in RabbitMQ 3.10:
//!
//! - the three boots and the two joins each run in parallel: 20-35 s in all on 2 busy cores;
//!   a join that fails (rarely, under load) costs a second cluster from scratch;
//! - a node killed with -9 is noticed by the others at once (its distribution connection
//!   closes); a quorum queue whose leader died elects another within about a second;
//! - with two nodes killed, the third pauses: it stops its `rabbit` application and closes its
//!   AMQP port (clients are refused, not left hanging), and starts again on its own once the
//!   other two are back (they must be restarted together: each waits for the others' tables);
//! - a restarted node rejoins the cluster from its data dir.
//!
//! [`RabbitCluster::start_on`] makes a cluster of its own on three test hosts
//! ([`super::netns`]), each node named after its host (`…@rabbit0`) and listening on the
//! host's address (AMQP, and the stream protocol for the nemesis's stream campaign), for the
//! partition tests ([`super::lab`]); `rabbitmqctl` then runs on the node's own host.
//!
//! Tests share the cluster: the ones that kill nodes hold [`RabbitCluster::lock`], and every
//! test calls [`RabbitCluster::ensure_healthy`] at its start and end, so it leaves the cluster
//! as it found it. It must never touch a node it did not start.

use std::process::{Child, Output};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::http::Endpoint;
use super::netns::Host;
use super::rabbit::{node_prefix, node_tempdir, watchdog_cleanup, Node, Plugins};
use super::relay::RelayProcess;
use super::{spawn_watchdog, stop_watchdog};

/// Nodes in the cluster.
const NODES: usize = 3;
/// The relay's gauge naming the node it is connected to.
pub const BROKER_INFO: &str = "outbox_relay_broker_info";
/// How long the cluster may take to show every node running again (a paused node restarts
/// its application once it sees a majority).
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a node may stay paused once the cluster should be whole again before
/// [`RabbitCluster::ensure_healthy`] restarts it: every heal in the partition tests took
/// under 15 s.
pub const STUCK_PAUSE: Duration = Duration::from_secs(60);
/// How long a test waits for a row to arrive after a partition heals: pause_minority may
/// leave a node paused for good, which [`RabbitCluster::ensure_healthy`] restarts only after
/// [`STUCK_PAUSE`] (the restart took 6 s in CI), and a quorum queue that needs that node
/// confirms nothing until then.
pub const DELIVERY_AFTER_HEAL: Duration = Duration::from_secs(STUCK_PAUSE.as_secs() + 60);

/// Three clustered RabbitMQ nodes owned by this test process.
pub struct RabbitCluster {
    nodes: Vec<Node>,
    state: Mutex<State>,
    /// Nodes [`RabbitCluster::ensure_healthy`] restarted because they stayed paused.
    repairs: std::sync::atomic::AtomicUsize,
}

struct State {
    tempdir: Option<tempfile::TempDir>,
    watchdog: Option<Child>,
}

static CLUSTER: OnceLock<Result<RabbitCluster, String>> = OnceLock::new();

impl RabbitCluster {
    /// The cluster of this test process, started on first use (blocking, about 15-30 s) and
    /// stopped when the process exits.
    pub fn shared() -> &'static RabbitCluster {
        let cluster = CLUSTER.get_or_init(|| {
            let cluster = Self::start_with(None, &[], Plugins::None)?;
            static AT_EXIT: std::sync::Once = std::sync::Once::new();
            // SAFETY: registering a plain `extern "C" fn` with no arguments.
            AT_EXIT.call_once(|| unsafe {
                libc::atexit(stop_cluster_at_exit);
            });
            Ok(cluster)
        });
        match cluster {
            Ok(cluster) => cluster,
            Err(message) => panic!("the rabbitmq cluster failed to start: {message}"),
        }
    }

    /// A cluster of its own whose node `i` runs on test host `hosts[i]` ([`super::netns`];
    /// three hosts), with `extra_conf` lines in every node's `rabbitmq.conf` (e.g.
    /// `"net_ticktime = 10"`). Every node also speaks the stream protocol, on its host's
    /// address and one port for all ([`RabbitCluster::stream_port`]). Panics if it does not
    /// form; stopped by `Drop` or [`RabbitCluster::shutdown`].
    pub fn start_on(hosts: &[Host], extra_conf: &[&str]) -> RabbitCluster {
        assert_eq!(
            hosts.len(),
            NODES,
            "a cluster of {NODES} needs {NODES} hosts"
        );
        Self::start_with(Some(hosts), extra_conf, Plugins::Streams)
            .unwrap_or_else(|e| panic!("the rabbitmq cluster failed to start: {e}"))
    }

    /// A cluster of its own on this host whose nodes also speak the stream protocol: node `i`
    /// listens on loopback address 127.0.0.(11 + i), all on one stream port
    /// ([`RabbitCluster::stream_port`]), as nodes on machines of their own would. Panics if it
    /// does not form; stopped by `Drop`.
    pub fn start_with_streams() -> RabbitCluster {
        Self::start_with(None, &[], Plugins::Streams)
            .unwrap_or_else(|e| panic!("the rabbitmq cluster failed to start: {e}"))
    }

    /// Boots and joins the nodes; once more from scratch (new names, ports and dirs, joining
    /// one node at a time) if that fails. Seen under load in 3.10, about one boot in ten: a
    /// joining node's `start_app` fails in mnesia (`{badmatch, {error, {normal, {mnesia_app,
    /// start, …}}}}`), again after a `reset` and a second join.
    fn start_with(
        hosts: Option<&[Host]>,
        extra_conf: &[&str],
        plugins: Plugins,
    ) -> Result<RabbitCluster, String> {
        match Self::start_once(true, hosts, extra_conf, plugins) {
            Ok(cluster) => Ok(cluster),
            Err(e) => {
                let first = e.lines().next().unwrap_or_default().to_string();
                eprintln!(
                    "harness: the rabbitmq cluster failed to form ({first}); starting another"
                );
                Self::start_once(false, hosts, extra_conf, plugins)
            }
        }
    }

    fn start_once(
        parallel_joins: bool,
        hosts: Option<&[Host]>,
        extra_conf: &[&str],
        plugins: Plugins,
    ) -> Result<RabbitCluster, String> {
        let mut conf = vec![
            "cluster_partition_handling = pause_minority",
            // Quorum queues write every message to each node's Raft WAL; when a WAL file fills
            // up, a segment writer moves what it holds into the queues' segment files. At the
            // default 512 MiB that happened once every ~5 benchmark runs of 200,000 messages,
            // and the run it landed in drained up to 40 % slower. At 64 MiB every run pays its
            // share (crates/outbox-bench/lab/records/2026-12-05-pairs.md).
            "raft.wal_max_size_bytes = 67108864",
        ];
        conf.extend_from_slice(extra_conf);
        let conf = conf.as_slice();
        let started = Instant::now();
        let tempdir = node_tempdir();
        let prefix = node_prefix();
        // One watchdog for the three nodes: their names all start with `prefix`.
        let watchdog = spawn_watchdog(&watchdog_cleanup(&prefix, tempdir.path()));
        let stream_port = super::free_port();
        let booted: Vec<Result<Node, String>> = std::thread::scope(|scope| {
            let boots: Vec<_> = (0..NODES)
                .map(|i| {
                    let name_prefix = format!("{prefix}{i}-");
                    let dir = tempdir.path().join(format!("node{i}"));
                    let host = hosts.map(|hosts| &hosts[i]);
                    let plugins = match plugins {
                        Plugins::Streams => Plugins::StreamsAt {
                            addr: std::net::Ipv4Addr::new(127, 0, 0, 11 + i as u8),
                            port: stream_port,
                        },
                        other => other,
                    };
                    scope.spawn(move || Node::start(&name_prefix, &dir, conf, host, plugins))
                })
                .collect();
            boots
                .into_iter()
                .map(|boot| boot.join().unwrap_or_else(|_| Err("boot panicked".into())))
                .collect()
        });
        let errors: Vec<&String> = booted.iter().filter_map(|b| b.as_ref().err()).collect();
        if !errors.is_empty() {
            let message = errors
                .iter()
                .map(|e| e.as_str())
                .collect::<Vec<_>>()
                .join("\n");
            for node in booted.iter().flatten() {
                node.kill_and_wait();
            }
            stop_watchdog(watchdog);
            return Err(message);
        }
        let booted_in = started.elapsed();
        let cluster = RabbitCluster {
            nodes: booted.into_iter().flatten().collect(),
            state: Mutex::new(State {
                tempdir: Some(tempdir),
                watchdog,
            }),
            repairs: std::sync::atomic::AtomicUsize::new(0),
        };
        // Dropping `cluster` on an error below stops it.
        cluster
            .join(parallel_joins)
            .and_then(|()| cluster.wait_clustered())
            .and_then(|()| cluster.nodes[0].enable_khepri_if_chosen())?;
        eprintln!(
            "harness: rabbitmq {} ({:?}) cluster of {NODES} ready in {:?} (booted in {booted_in:?}; ports {:?}; {})",
            super::rabbit_release::release().series(),
            super::rabbit_release::release().metadata(),
            started.elapsed(),
            (0..NODES).map(|i| cluster.port(i)).collect::<Vec<_>>(),
            cluster.nodes[0].dir.parent().unwrap().display(),
        );
        Ok(cluster)
    }

    /// Joins nodes 1.. to node 0, in parallel or one at a time.
    fn join(&self, parallel: bool) -> Result<(), String> {
        let others = &self.nodes[1..];
        if !parallel {
            return others.iter().try_for_each(|node| self.join_one(node));
        }
        std::thread::scope(|scope| {
            let joins: Vec<_> = others
                .iter()
                .map(|node| scope.spawn(move || self.join_one(node)))
                .collect();
            joins
                .into_iter()
                .try_for_each(|join| join.join().unwrap_or_else(|_| Err("join panicked".into())))
        })
    }

    /// `rabbitmqctl stop_app`, `join_cluster NODE0`, `start_app` on `node`.
    fn join_one(&self, node: &Node) -> Result<(), String> {
        let seed = self.nodes[0].name.as_str();
        for args in [&["stop_app"][..], &["join_cluster", seed], &["start_app"]] {
            let out = node.ctl(args);
            if !out.status.success() {
                return Err(node.failure(&format!(
                    "rabbitmqctl {args:?} failed:\n{}",
                    output_text(&out)
                )));
            }
        }
        Ok(())
    }

    /// Waits until every node accepts AMQP connections and one of them lists all of them as
    /// running cluster members.
    fn wait_clustered(&self) -> Result<(), String> {
        self.wait_clustered_within(HEALTHY_TIMEOUT)
    }

    fn wait_clustered_within(&self, timeout: Duration) -> Result<(), String> {
        let mut last = String::new();
        let clustered = super::poll_until(timeout, Duration::from_millis(100), || {
            if let Some(closed) = (0..NODES).find(|&i| !self.nodes[i].accepts_amqp()) {
                last = format!("node {closed} does not accept AMQP connections");
                return false;
            }
            match self.running_nodes() {
                Ok(running) if running.len() == NODES => true,
                Ok(running) => {
                    last = format!("running nodes: {running:?}");
                    false
                }
                Err(e) => {
                    last = e;
                    false
                }
            }
        });
        if clustered {
            Ok(())
        } else {
            Err(format!(
                "the cluster is not whole after {timeout:?}: {last}\n{}",
                self.nodes
                    .iter()
                    .map(|node| node.failure("state"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ))
        }
    }

    /// The indexes of the nodes `cluster_status` (asked of the first node that accepts
    /// AMQP connections) lists as running.
    fn running_nodes(&self) -> Result<Vec<usize>, String> {
        let json = self.ctl_json(self.any_running()?, &["cluster_status"])?;
        let running = json["running_nodes"]
            .as_array()
            .ok_or_else(|| format!("no running_nodes in {json}"))?;
        Ok(running
            .iter()
            .filter_map(|name| self.index_of_node(name.as_str()?))
            .collect())
    }

    /// The first node that accepts AMQP connections (not killed, not paused).
    fn any_running(&self) -> Result<usize, String> {
        (0..NODES)
            .find(|&i| self.nodes[i].accepts_amqp())
            .ok_or_else(|| "no node accepts AMQP connections".to_string())
    }

    /// `rabbitmqctl -n NODE args… --formatter json`, parsed.
    fn ctl_json(&self, i: usize, args: &[&str]) -> Result<serde_json::Value, String> {
        let mut args = args.to_vec();
        args.extend(["--formatter", "json"]);
        let out = self.ctl(i, &args);
        if !out.status.success() {
            return Err(format!("rabbitmqctl {args:?}: {}", output_text(&out)));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "rabbitmqctl {args:?} printed no JSON ({e}): {}",
                output_text(&out)
            )
        })
    }

    fn index_of_node(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|node| node.name == name)
    }

    /// Nodes in the cluster (3).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Never: a cluster has its nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `amqp://guest:guest@ADDR:PORT/%2f` of node `i` (127.0.0.1, or its test host's address).
    pub fn url(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    /// Every node's URL, in node order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// Every node's URL joined with "," (the relay's `--amqp-url` broker list).
    pub fn url_list(&self) -> String {
        self.urls().join(",")
    }

    /// Node `i`'s AMQP port.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].amqp_port
    }

    /// Node `i`'s address: 127.0.0.1, its loopback address in a cluster started with
    /// [`RabbitCluster::start_with_streams`], or its test host's.
    pub fn addr(&self, i: usize) -> std::net::Ipv4Addr {
        self.nodes[i].addr()
    }

    /// Node `i`'s stream protocol port, in a cluster started with
    /// [`RabbitCluster::start_with_streams`] or [`RabbitCluster::start_on`] (the same on every
    /// node); panics in any other.
    pub fn stream_port(&self, i: usize) -> u16 {
        self.nodes[i].stream_port.unwrap_or_else(|| {
            panic!("RabbitCluster::stream_port: the cluster was not started with streams")
        })
    }

    /// The node listening for AMQP on `port`, if any.
    pub fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|node| node.amqp_port == port)
    }

    /// Node `i`'s AMQP listener as the relay names it in `outbox_relay_broker_info{node=…}`:
    /// `ADDR:PORT`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("{}:{}", self.nodes[i].addr(), self.nodes[i].amqp_port)
    }

    /// Whether node `i` accepts AMQP connections (false while it is killed or paused).
    pub fn accepts_amqp(&self, i: usize) -> bool {
        self.nodes[i].accepts_amqp()
    }

    /// The test host node `i` runs on (`None` for a cluster in the root namespace).
    pub fn host(&self, i: usize) -> Option<&Host> {
        self.nodes[i].host.as_ref()
    }

    /// The nodes the relay's `/metrics` text marks in use (`outbox_relay_broker_info{node=…} 1`),
    /// by index.
    pub fn nodes_in_use(&self, metrics: &str) -> Vec<usize> {
        metrics
            .lines()
            .filter(|line| line.starts_with(&format!("{BROKER_INFO}{{")))
            .filter(|line| line.rsplit(' ').next() == Some("1"))
            .filter_map(|line| {
                let node = line.split("node=\"").nth(1)?.split('"').next()?;
                (0..NODES).find(|&i| self.endpoint(i) == node)
            })
            .collect()
    }

    /// Waits until the relay (`/metrics` at `at`) reports a node in use other than `not`; its
    /// index. Panics with the relay's log after `timeout`.
    pub async fn wait_node_in_use(
        &self,
        relay: &RelayProcess,
        at: impl Endpoint,
        not: Option<usize>,
        timeout: Duration,
    ) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let text = super::http::http_get(at, "/metrics").await;
            let in_use = text.map(|(_, body)| self.nodes_in_use(&body));
            if let Some(&node) = in_use.iter().flatten().find(|&&n| Some(n) != not) {
                return node;
            }
            assert!(
                Instant::now() < deadline,
                "no {BROKER_INFO} 1 for a node other than {not:?} after {timeout:?} \
                 ({in_use:?}); log:\n{}",
                relay.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Node `i`'s name, `outbox-test-PID-N-I-A@localhost`.
    pub fn node(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// `rabbitmqctl -n NODE_i args…`; about 1 s of CPU per call.
    pub fn ctl(&self, i: usize, args: &[&str]) -> Output {
        self.nodes[i].ctl(args)
    }

    /// kill -9 of node `i`; returns once its AMQP port is closed and its process gone, with
    /// the instant of the signal.
    pub fn kill9(&self, i: usize) -> Instant {
        self.nodes[i].kill9()
    }

    /// SIGSTOP of node `i`: frozen, as by a stopped VM, its sockets open and silent until
    /// [`RabbitCluster::resume`].
    pub fn pause(&self, i: usize) {
        self.nodes[i].signal_node(libc::SIGSTOP);
    }

    /// SIGCONT of node `i` after [`RabbitCluster::pause`].
    pub fn resume(&self, i: usize) {
        self.nodes[i].signal_node(libc::SIGCONT);
    }

    /// Starts killed node `i` again (same name, ports and data) and waits until the cluster is
    /// whole.
    pub fn restart(&self, i: usize) {
        self.restart_all(&[i]);
    }

    /// Starts the killed nodes `indexes` again in parallel (killed nodes must come back together:
    /// each waits for the others' tables) and waits until the cluster is whole.
    pub fn restart_all(&self, indexes: &[usize]) {
        self.start_again(indexes);
        if let Err(e) = self.wait_clustered() {
            panic!("{e}");
        }
    }

    /// Starts the killed nodes `indexes` again in parallel, without waiting for the cluster.
    fn start_again(&self, indexes: &[usize]) {
        std::thread::scope(|scope| {
            for &i in indexes {
                let node = &self.nodes[i];
                scope.spawn(move || node.restart());
            }
        });
    }

    /// Restarts every node whose process is gone and waits until all of them run and are
    /// clustered: every test calls it at its start and end, so the next finds the cluster
    /// whole. A node that is alive but still not serving [`STUCK_PAUSE`] later is restarted
    /// too: RabbitMQ's pause_minority can leave a node paused for good after a partition
    /// heals (its Mnesia stays partitioned: rabbitmq-server issue 17319;
    /// crates/outbox-bench/lab/scenarios.md, "Network partitions"), and a restart is what an
    /// operator does. Counted in [`RabbitCluster::repairs`] and printed, so a test reports it.
    pub fn ensure_healthy(&self) {
        let dead: Vec<usize> = (0..NODES).filter(|&i| !self.nodes[i].is_alive()).collect();
        if !dead.is_empty() {
            eprintln!("harness: restarting cluster nodes {dead:?}");
            self.start_again(&dead);
        }
        let Err(waited) = self.wait_clustered_within(STUCK_PAUSE) else {
            return;
        };
        let mut stuck: Vec<usize> = (0..NODES).filter(|&i| !self.accepts_amqp(i)).collect();
        if stuck.is_empty() {
            let running = self.running_nodes().unwrap_or_default();
            stuck = (0..NODES).filter(|i| !running.contains(i)).collect();
        }
        assert!(!stuck.is_empty(), "{waited}");
        eprintln!(
            "harness: cluster nodes {stuck:?} still paused {STUCK_PAUSE:?} after the cluster \
             should be whole (RabbitMQ's pause_minority did not resume them); restarting them"
        );
        self.repairs
            .fetch_add(stuck.len(), std::sync::atomic::Ordering::Relaxed);
        for &i in &stuck {
            self.nodes[i].stop_if_running();
        }
        self.restart_all(&stuck);
    }

    /// What an operator does for one node after a fault on it healed, while faults elsewhere
    /// go on (so not [`RabbitCluster::ensure_healthy`], which waits for every node): if node
    /// `i` does not serve AMQP within `within` (pause_minority left it paused for good, as
    /// above), it is restarted, counted in [`RabbitCluster::repairs`] and printed. Returns
    /// whether it was; the restart waits for the node itself, not for the cluster.
    pub fn repair_if_stuck(&self, i: usize, within: Duration) -> bool {
        let node = &self.nodes[i];
        if super::poll_until(within, Duration::from_millis(100), || node.accepts_amqp()) {
            return false;
        }
        eprintln!(
            "harness: cluster node {i} still does not serve AMQP {within:?} after its fault \
             healed (RabbitMQ's pause_minority did not resume it); restarting it"
        );
        self.repairs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        node.stop_if_running();
        node.restart();
        true
    }

    /// How many nodes [`RabbitCluster::ensure_healthy`] and [`RabbitCluster::repair_if_stuck`]
    /// have restarted because they stayed paused after a partition healed.
    pub fn repairs(&self) -> usize {
        self.repairs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The index of the node that leads quorum queue `queue`, once the leader `list_queues`
    /// names is among the queue's online members and accepts AMQP connections (after a
    /// leader dies, until the election has made another). Panics after 60 s.
    pub fn quorum_leader(&self, queue: &str) -> usize {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let last = match self.quorum_status(queue) {
                Ok((Some(leader), online)) if online.contains(&leader) => {
                    if self.nodes[leader].accepts_amqp() {
                        return leader;
                    }
                    format!("leader {leader} does not accept AMQP connections")
                }
                Ok(status) => format!("(leader, online): {status:?}"),
                Err(e) => e,
            };
            assert!(
                Instant::now() < deadline,
                "quorum queue {queue} has no leader after 60 s: {last}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every node is an online member of quorum queue `queue` (after a restart,
    /// so that the next fault finds a full quorum). Panics after 60 s.
    pub fn wait_quorum_members_online(&self, queue: &str) {
        let mut last = String::new();
        let online =
            super::poll_until(
                Duration::from_secs(60),
                Duration::from_millis(100),
                || match self.quorum_status(queue) {
                    Ok((_, online)) if online.len() == NODES => true,
                    Ok(status) => {
                        last = format!("(leader, online): {status:?}");
                        false
                    }
                    Err(e) => {
                        last = e;
                        false
                    }
                },
            );
        assert!(
            online,
            "quorum queue {queue} has not every member online after 60 s: {last}"
        );
    }

    /// The leader and the online members of quorum queue `queue`, as node indexes.
    fn quorum_status(&self, queue: &str) -> Result<(Option<usize>, Vec<usize>), String> {
        let json = self.ctl_json(
            self.any_running()?,
            &["list_queues", "name", "leader", "online"],
        )?;
        let entry = json
            .as_array()
            .and_then(|queues| queues.iter().find(|q| q["name"] == queue))
            .ok_or_else(|| format!("no queue {queue} in {json}"))?;
        let leader = entry["leader"].as_str().and_then(|l| self.index_of_node(l));
        let online = entry["online"]
            .as_array()
            .map(|members| {
                members
                    .iter()
                    .filter_map(|m| self.index_of_node(m.as_str()?))
                    .collect()
            })
            .unwrap_or_default();
        Ok((leader, online))
    }

    /// Serializes the tests that kill nodes (the tests of a process run in
    /// parallel). A test that panicked while holding it does not block the others.
    pub fn lock(&self) -> MutexGuard<'static, ()> {
        static FAULTS: Mutex<()> = Mutex::new(());
        FAULTS.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Kills every node and removes their directories; idempotent. The exit handler calls
    /// it.
    pub fn shutdown(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.tempdir.is_none() {
            return;
        }
        for node in &self.nodes {
            node.kill_node();
        }
        for node in &self.nodes {
            node.kill_and_wait();
        }
        stop_watchdog(state.watchdog.take());
        state.tempdir.take();
    }
}

impl Drop for RabbitCluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

extern "C" fn stop_cluster_at_exit() {
    // Nothing may unwind out of an `extern "C"` function.
    let _ = std::panic::catch_unwind(|| {
        if let Some(Ok(cluster)) = CLUSTER.get() {
            cluster.shutdown();
        }
    });
}

fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
