//! A private RabbitMQ node for tests, of the series [`super::rabbit_release`] chooses.
//!
//! On 3.10, Debian's `/usr/sbin/rabbitmq-*` wrappers, run as root, switch to the `rabbitmq`
//! user with `su` (not a login shell), which keeps the environment: the `RABBITMQ_*`
//! variables set here reach the node, and override `/etc/rabbitmq/rabbitmq-env.conf`.
//! The node runs with the system cookie (`/var/lib/rabbitmq`), so `rabbitmqctl -n NODE`
//! reaches it, and registers with the system's epmd on 4369. A 4.x node runs in its Debian
//! root with the same variables ([`super::rabbit_release`]).
//!
//! `rabbitmq-server -detached` returns at once; the node writes its pid file ~2 s later
//! and opens the AMQP port at the end of its boot (~5 s on these machines). The node's
//! processes show the node name only in their environment, not on the command line.
//!
//! It owns its node's lifecycle; it must never touch a node it did not start: every command
//! names this node (never the package's own), and with `OUTBOX_TEST_AMQP_URL` (an external
//! broker) `ctl`, `kill9` and `restart` panic.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use std::net::Ipv4Addr;

use super::netns::Host;
use super::procfs::process_alive;
use super::rabbit_release::{release, Program};
use super::{chown_to, free_port, port_is_open_at, spawn_watchdog, stop_watchdog, tail_file};

const STARTUP_TIMEOUT: Duration = Duration::from_secs(90);
/// Boot attempts per node, each with a fresh node name and ports.
const ATTEMPTS: u32 = 3;

/// A RabbitMQ broker: a private node started by the harness, or an external one named by
/// `OUTBOX_TEST_AMQP_URL` (then `ctl`, `kill9` and `restart` panic).
pub struct RabbitServer {
    kind: Kind,
}

type Kind = super::ServerKind<Private>;

struct Private {
    node: Node,
    state: Mutex<State>,
}

struct State {
    tempdir: Option<tempfile::TempDir>,
    watchdog: Option<Child>,
}

impl RabbitServer {
    /// Starts a private node; about 6 s.
    pub fn start() -> RabbitServer {
        Self::start_with_config(&[])
    }

    /// Starts a private node with extra `rabbitmq.conf` lines (e.g.
    /// `"vm_memory_high_watermark.relative = 0.0001"`), appended after the defaults:
    /// `max_message_size = 16777216`, `loopback_users = none`,
    /// `disk_free_limit.absolute = 1MB`, the listener on 127.0.0.1:PORT.
    pub fn start_with_config(extra_conf: &[&str]) -> RabbitServer {
        Self::boot(extra_conf, Plugins::None)
    }

    /// Starts a private node with the stream plugin (`rabbitmq_stream`) listening on a port of
    /// its own ([`RabbitServer::stream_port`]) beside AMQP; its boot takes a second or two
    /// longer, which is why no other node enables it.
    pub fn start_with_streams() -> RabbitServer {
        Self::start_with_streams_and_config(&[])
    }

    /// [`RabbitServer::start_with_streams`] with extra `rabbitmq.conf` lines (e.g. a TLS
    /// listener for the stream protocol, `stream.listeners.ssl.1 = 127.0.0.1:PORT`).
    pub fn start_with_streams_and_config(extra_conf: &[&str]) -> RabbitServer {
        Self::boot(extra_conf, Plugins::Streams)
    }

    fn boot(extra_conf: &[&str], plugins: Plugins) -> RabbitServer {
        let started = Instant::now();
        let tempdir = node_tempdir();
        let dir = tempdir.path().to_path_buf();
        // Started before the node, so that a test process killed while the node boots
        // does not leave it behind.
        let node_prefix = node_prefix();
        let mut watchdog = spawn_watchdog(&watchdog_cleanup(&node_prefix, &dir));
        match Node::start(&node_prefix, &dir, extra_conf, None, plugins)
            .and_then(|node| node.enable_khepri_if_chosen().map(|()| node))
        {
            Ok(node) => {
                eprintln!(
                    "harness: rabbitmq {} ({:?}) {} on port {} ready in {:?} ({})",
                    release().series(),
                    release().metadata(),
                    node.name,
                    node.amqp_port,
                    started.elapsed(),
                    dir.display()
                );
                RabbitServer {
                    kind: Kind::Private(Private {
                        node,
                        state: Mutex::new(State {
                            tempdir: Some(tempdir),
                            watchdog: watchdog.take(),
                        }),
                    }),
                }
            }
            Err(e) => {
                stop_watchdog(watchdog);
                panic!("rabbitmq failed to start:\n{e}");
            }
        }
    }

    /// An existing broker named by an AMQP URL.
    pub fn external(url: &str) -> RabbitServer {
        let port = super::pg::url_port(url).unwrap_or(5672);
        RabbitServer {
            kind: Kind::External {
                url: url.to_string(),
                port,
            },
        }
    }

    /// The stream protocol's port of a node started with [`RabbitServer::start_with_streams`]
    /// (on 127.0.0.1, user guest/guest); panics for any other.
    pub fn stream_port(&self) -> u16 {
        let private = self
            .kind
            .private("RabbitServer", "stream_port", "OUTBOX_TEST_AMQP_URL");
        private.node.stream_port.unwrap_or_else(|| {
            panic!("RabbitServer::stream_port: the node was not started with start_with_streams")
        })
    }

    pub fn amqp_port(&self) -> u16 {
        match &self.kind {
            Kind::Private(p) => p.node.amqp_port,
            Kind::External { port, .. } => *port,
        }
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f`.
    pub fn url(&self) -> String {
        match &self.kind {
            Kind::Private(p) => p.node.url(),
            Kind::External { url, .. } => url.clone(),
        }
    }

    /// The node name, `outbox-test-PID-N-A@localhost`.
    pub fn node(&self) -> &str {
        &self.private("node").node.name
    }

    pub fn dir(&self) -> &Path {
        &self.private("dir").node.dir
    }

    /// The node's main log.
    pub fn log_path(&self) -> PathBuf {
        self.private("log_path").node.log_path()
    }

    /// `rabbitmqctl -n NODE args…` (e.g. `["set_vm_memory_high_watermark", "0.0001"]`).
    /// About 1 s of CPU per call.
    pub fn ctl(&self, args: &[&str]) -> Output {
        self.private("ctl").node.ctl(args)
    }

    /// Raises the node's memory alarm (a watermark no node stays under: it blocks every
    /// publishing connection) or clears it (back to the default 0.4). Blocking: call it with
    /// `tokio::task::block_in_place` from a runtime.
    pub fn set_memory_alarm(&self, raised: bool) {
        let watermark = if raised { "0.0000001" } else { "0.4" };
        let set = self.ctl(&["set_vm_memory_high_watermark", watermark]);
        assert!(
            set.status.success(),
            "set_vm_memory_high_watermark {watermark}: {set:?}"
        );
    }

    /// `sys:suspend` (`true`) or `sys:resume` of the process of the classic queue `queue`
    /// on the default vhost. A suspended queue takes no message from its mailbox, so it
    /// confirms nothing and grants its publishers no credit: the connection publishing to it
    /// runs out of credit and RabbitMQ stops reading its socket, with no
    /// `connection.blocked` (credit flow, not an alarm). System messages (the resume) still
    /// reach it. Blocking.
    pub fn suspend_queue(&self, queue: &str, suspended: bool) {
        let call = if suspended { "suspend" } else { "resume" };
        let expression = format!(
            "{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<\"/\">>, queue, <<\"{queue}\">>)), \
             ok = sys:{call}(amqqueue:get_pid(Q))."
        );
        let out = self.ctl(&["eval", &expression]);
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
            "sys:{call} of queue {queue}: {out:?}"
        );
    }

    /// The beam process's pid, from the pid file.
    pub fn pid(&self) -> Option<i32> {
        self.private("pid").node.pid()
    }

    /// kill -9 of the node; returns once its AMQP port is closed, with the instant of the
    /// signal.
    pub fn kill9(&self) -> Instant {
        self.private("kill9").node.kill9()
    }

    /// SIGSTOP of the node: frozen, its sockets open and silent, as a host that vanished,
    /// until [`RabbitServer::resume`].
    pub fn pause(&self) {
        self.private("pause").node.signal_node(libc::SIGSTOP);
    }

    /// SIGCONT of the node after [`RabbitServer::pause`].
    pub fn resume(&self) {
        self.private("resume").node.signal_node(libc::SIGCONT);
    }

    /// Starts the node again on the same ports and data dir and waits for it.
    pub fn restart(&self) {
        self.private("restart").node.restart();
    }

    /// Kills the node and removes its directory; idempotent. Drop and the shared
    /// services' exit handler call it.
    pub fn shutdown(&self) {
        self.kind.shutdown();
    }

    fn private(&self, what: &str) -> &Private {
        self.kind.private("RabbitServer", what, super::AMQP_URL_ENV)
    }
}

impl super::PrivateServer for Private {
    fn shutdown(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.tempdir.is_none() {
            return;
        }
        self.node.kill_and_wait();
        stop_watchdog(state.watchdog.take());
        state.tempdir.take();
    }
}

// ---------------------------------------------------------------------------------
// One node process, shared with `rabbit_cluster`

/// A temp dir for one or more nodes' directories (the harness removes it).
pub(crate) fn node_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("outbox-test-rabbit-")
        .tempdir()
        .expect("create a temp dir for rabbitmq")
}

/// A fresh prefix for node names, `outbox-test-PID-N-`: a watchdog finds every node whose
/// name starts with it ([`watchdog_cleanup`]).
pub(crate) fn node_prefix() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("outbox-test-{}-{n}-", std::process::id())
}

/// The cleanup a watchdog runs: kill -9 of every process whose environment names a node
/// starting with `node_prefix` (the pid file appears only ~2 s into a boot), then removal of
/// `dir`.
pub(crate) fn watchdog_cleanup(node_prefix: &str, dir: &Path) -> String {
    format!(
        "for p in /proc/[0-9]*; do \
           grep -qz '^RABBITMQ_NODENAME={node_prefix}' $p/environ 2>/dev/null \
           && kill -9 ${{p#/proc/}}; \
         done; sleep 1; rm -rf {dir}",
        dir = super::shell_quote(dir.to_str().unwrap()),
    )
}

/// The plugins a node enables: none (boots fastest), or the stream protocol's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plugins {
    None,
    /// The stream protocol on a port of its own.
    Streams,
    /// The stream protocol on `port`, and every listener on loopback address `addr`: nodes of
    /// one cluster on this host that a client tells apart by address, as on machines of their
    /// own, each with the stream port the relay's `--stream-port` names for all.
    StreamsAt {
        addr: Ipv4Addr,
        port: u16,
    },
}

/// One RabbitMQ node the harness launches: its name, ports and directory. Restarts reuse
/// all three.
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) amqp_port: u16,
    pub(crate) dist_port: u16,
    /// The stream protocol's listener, with [`Plugins::Streams`].
    pub(crate) stream_port: Option<u16>,
    /// The loopback address its listeners bind, with [`Plugins::StreamsAt`].
    pub(crate) loopback: Option<Ipv4Addr>,
    /// Owned by `rabbitmq`: `mnesia/`, `log/`, `pid`, `rabbitmq.conf`, `enabled_plugins`.
    pub(crate) dir: PathBuf,
    /// The test host it runs on ([`super::netns`]); `None`: the root namespace, on
    /// 127.0.0.1 and `@localhost`.
    pub(crate) host: Option<Host>,
}

impl Node {
    /// Creates `dir` (if needed) and boots a node in it named `{name_prefix}{attempt}@localhost`
    /// (on a test `host`: `@{its hostname}`, listening on its address) on fresh ports, with the
    /// default `rabbitmq.conf` plus the release's and `extra_conf` lines; up to [`ATTEMPTS`]
    /// times, a failed attempt killed and its data removed.
    pub(crate) fn start(
        name_prefix: &str,
        dir: &Path,
        extra_conf: &[&str],
        host: Option<&Host>,
        plugins: Plugins,
    ) -> Result<Node, String> {
        std::fs::create_dir_all(dir).expect("create the node's dir");
        let enabled = match plugins {
            Plugins::None => "[].\n",
            Plugins::Streams | Plugins::StreamsAt { .. } => "[rabbitmq_stream].\n",
        };
        std::fs::write(dir.join("enabled_plugins"), enabled).expect("write enabled_plugins");
        std::fs::create_dir_all(dir.join("log")).expect("mkdir log");
        // The system's rabbitmq-env.conf may bind epmd and the distribution listener to
        // 127.0.0.1 (ERL_EPMD_ADDRESS, inet_dist_use_interface; it does on these machines),
        // where no other host reaches them: a node on a test host reads its own, empty one.
        if host.is_some() {
            std::fs::write(
                dir.join("rabbitmq-env.conf"),
                "# outbox-relay test host node\n",
            )
            .expect("write rabbitmq-env.conf");
        }
        let host_part = host.map_or("localhost", |h| h.hostname());
        let mut last_error = String::new();
        for attempt in 0..ATTEMPTS {
            // A failed node leaves its mnesia dir behind; start each attempt clean.
            let _ = std::fs::remove_dir_all(dir.join("mnesia"));
            std::fs::create_dir(dir.join("mnesia")).expect("mkdir mnesia");
            let node = Node {
                name: format!("{name_prefix}{attempt}@{host_part}"),
                amqp_port: free_port(),
                dist_port: free_port(),
                stream_port: match plugins {
                    Plugins::None => None,
                    Plugins::Streams => Some(free_port()),
                    Plugins::StreamsAt { port, .. } => Some(port),
                },
                loopback: match plugins {
                    Plugins::StreamsAt { addr, .. } => Some(addr),
                    _ => None,
                },
                dir: dir.to_path_buf(),
                host: host.cloned(),
            };
            let mut conf = format!(
                "listeners.tcp.1 = {}:{}\n\
                 loopback_users = none\n\
                 max_message_size = 16777216\n\
                 disk_free_limit.absolute = 1MB\n",
                node.addr(),
                node.amqp_port
            );
            // A stream client connects to the address the node advertises (the stream's
            // leader's): its own, not the hostname the node would give.
            if let Some(port) = node.stream_port {
                let addr = node.addr();
                conf += &format!(
                    "stream.listeners.tcp.1 = {addr}:{port}\n\
                     stream.advertised_host = {addr}\n\
                     stream.advertised_port = {port}\n"
                );
            }
            for line in release().conf_lines().iter().chain(extra_conf) {
                conf += line;
                conf += "\n";
            }
            std::fs::write(dir.join("rabbitmq.conf"), conf).expect("write rabbitmq.conf");
            chown_to(dir, "rabbitmq");
            match node.launch() {
                Ok(()) => return Ok(node),
                Err(e) => {
                    node.kill_node();
                    last_error = e;
                }
            }
        }
        Err(last_error)
    }

    /// `amqp://guest:guest@ADDR:PORT/%2f`: 127.0.0.1, or the test host's address.
    pub(crate) fn url(&self) -> String {
        format!("amqp://guest:guest@{}:{}/%2f", self.addr(), self.amqp_port)
    }

    /// Where its listeners are: 127.0.0.1, another loopback address of its own, or the test
    /// host's address.
    pub(crate) fn addr(&self) -> Ipv4Addr {
        match (&self.host, self.loopback) {
            (Some(host), _) => host.addr(),
            (None, Some(loopback)) => loopback,
            (None, None) => Ipv4Addr::LOCALHOST,
        }
    }

    /// Whether its AMQP port accepts connections.
    pub(crate) fn accepts_amqp(&self) -> bool {
        port_is_open_at(self.addr(), self.amqp_port)
    }

    /// `program` of the release for this node: on its test host, with its own
    /// `rabbitmq-env.conf` there (see [`Node::start`]) and `RABBITMQ_NODENAME` set to the
    /// node: `rabbitmqctl` names its own Erlang node after that name's host part (else after
    /// the machine's hostname, which resolves to 127.0.0.1), and the other nodes send some
    /// answers straight to it (`list_queues` timed out waiting for theirs).
    fn command(&self, program: Program) -> Command {
        let mut command = release().command(program, self.host.as_ref());
        match &self.host {
            None => {
                command.env_remove("RABBITMQ_CONF_ENV_FILE");
            }
            Some(_) => {
                command
                    .env("RABBITMQ_CONF_ENV_FILE", self.dir.join("rabbitmq-env.conf"))
                    .env("RABBITMQ_NODENAME", &self.name);
            }
        }
        command
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.join("pid")
    }

    pub(crate) fn log_path(&self) -> PathBuf {
        self.dir.join("log").join(format!("{}.log", self.name))
    }

    pub(crate) fn pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.pid_file())
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Whether the node's process runs (it may be booting, or paused).
    pub(crate) fn is_alive(&self) -> bool {
        self.pid().is_some_and(process_alive) || !node_processes(&self.name).is_empty()
    }

    /// kill -9 of the pid file's process and of any process still carrying this node's
    /// name in its environment (a node that died or hung before writing its pid file).
    pub(crate) fn kill_node(&self) {
        self.signal_node(libc::SIGKILL);
    }

    /// Sends `signal` to the node's processes (the beam and its helpers).
    pub(crate) fn signal_node(&self, signal: libc::c_int) {
        let mut pids: Vec<i32> = self.pid().into_iter().collect();
        pids.extend(node_processes(&self.name));
        for pid in pids {
            // SAFETY: kill(2) of a process this harness started.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// [`Node::kill_node`], then waits up to 10 s for its process to go (for a shutdown: the
    /// data is thrown away, no need for a graceful `rabbitmqctl stop`).
    pub(crate) fn kill_and_wait(&self) {
        self.kill_node();
        if let Some(pid) = self.pid() {
            super::poll_until(Duration::from_secs(10), Duration::from_millis(10), || {
                !process_alive(pid)
            });
        }
    }

    /// [`Node::kill9`] for a repair: a node left paused may also have exited by the time it
    /// is repaired (CI, 2026-12-04: one of two nodes still paused 60 s after a heal had no
    /// process left, and the repair's kill -9 panicked), and then there is nothing to kill.
    pub(crate) fn stop_if_running(&self) {
        if self.is_alive() {
            self.kill9();
        }
    }

    /// kill -9 of the node; returns once its AMQP port is closed and its process gone, with
    /// the instant of the signal (a fault test's clock starts there, not before the
    /// `rabbitmqctl` call ahead of it, which takes seconds on a loaded machine).
    pub(crate) fn kill9(&self) -> Instant {
        // The pid file may be gone while the node runs (CI, 2026-12-03: a node restarted
        // earlier in the run, its application stopped by `stop_app`, had none, and the
        // kit's repair of it panicked): its processes are found by name too.
        let pids: Vec<i32> = self
            .pid()
            .into_iter()
            .chain(node_processes(&self.name))
            .collect();
        assert!(
            !pids.is_empty(),
            "rabbitmq {}: no pid file and no beam.smp carrying its name",
            self.name
        );
        // Mnesia (RabbitMQ 3.x's metadata store) appends committed declarations to its log
        // asynchronously: a kill -9 soon after a test declared its queue and bindings could
        // lose them, and the test would see its own topology vanish rather than what the
        // relay does (seen once under load: NO_ROUTE after the restart). Syncing the log
        // first keeps the fault about messages and connections, which is what it tests.
        let _ = self.ctl(&["eval", "mnesia:sync_log()."]);
        let killed = Instant::now();
        self.kill_node();
        let closed = super::poll_until(Duration::from_secs(30), Duration::from_millis(20), || {
            !self.accepts_amqp() && !pids.iter().any(|&pid| process_alive(pid))
        });
        assert!(
            closed,
            "rabbitmq {} (pids {pids:?}) still running after kill -9",
            self.name
        );
        killed
    }

    /// Starts the node again on the same ports and data dir and waits for it.
    pub(crate) fn restart(&self) {
        let started = Instant::now();
        if let Err(e) = self.launch() {
            panic!("rabbitmq failed to restart:\n{e}");
        }
        eprintln!(
            "harness: rabbitmq {} restarted in {:?}",
            self.name,
            started.elapsed()
        );
    }

    /// Turns the `khepri_db` feature flag on when the release says so
    /// ([`super::rabbit_release::METADATA_ENV`]); on a cluster, once it is whole (it migrates
    /// every member).
    pub(crate) fn enable_khepri_if_chosen(&self) -> Result<(), String> {
        if !release().enables_khepri() {
            return Ok(());
        }
        // 4.0 marks Khepri opt-in: the flag alone is refused.
        let out = self.ctl(&["enable_feature_flag", "--opt-in", "khepri_db"]);
        if out.status.success() {
            Ok(())
        } else {
            Err(self.failure(&format!(
                "rabbitmqctl enable_feature_flag khepri_db failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// `rabbitmqctl -n NODE args…`.
    pub(crate) fn ctl(&self, args: &[&str]) -> Output {
        self.command(Program::Ctl)
            .arg("-n")
            .arg(&self.name)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run rabbitmqctl")
    }

    /// `rabbitmq-server -detached`, then wait for the AMQP port and `await_startup`.
    fn launch(&self) -> Result<(), String> {
        let dir = &self.dir;
        // A stale pid file (after kill -9) would hide a node that died while booting.
        let _ = std::fs::remove_file(self.pid_file());
        let startup_log = dir.join("startup.log");
        let out = std::fs::File::create(&startup_log).expect("create startup.log");
        let err = out.try_clone().expect("clone startup.log");
        let status = self
            .command(Program::Server)
            .arg("-detached")
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_PORT", self.amqp_port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_PID_FILE", self.pid_file())
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
            .env_remove("RABBITMQ_ADVANCED_CONFIG_FILE")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .map_err(|e| format!("cannot run {}: {e}", release().describe(Program::Server)))?;
        if !status.success() {
            return Err(self.failure(&format!("rabbitmq-server -detached exited with {status}")));
        }

        let started = Instant::now();
        loop {
            if self.accepts_amqp() {
                break;
            }
            match self.pid() {
                Some(pid) if !process_alive(pid) => {
                    return Err(self.failure(&format!("the node (pid {pid}) died while booting")));
                }
                None if started.elapsed() > Duration::from_secs(30) => {
                    return Err(self.failure("no pid file 30 s after rabbitmq-server -detached"));
                }
                _ => {}
            }
            if started.elapsed() > STARTUP_TIMEOUT {
                return Err(self.failure(&format!(
                    "AMQP port {} not open after {STARTUP_TIMEOUT:?}",
                    self.amqp_port
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = self.ctl(&["await_startup", "--timeout", "60"]);
        if !out.status.success() {
            return Err(self.failure(&format!(
                "rabbitmqctl await_startup failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }

    /// `what` went wrong, with the node's startup log and the tail of its main log.
    pub(crate) fn failure(&self, what: &str) -> String {
        format!(
            "node {} (amqp {}, dist {}, dir {}): {what}\n--- startup.log ---\n{}\n--- {} (tail) ---\n{}",
            self.name,
            self.amqp_port,
            self.dist_port,
            self.dir.display(),
            tail_file(&self.dir.join("startup.log"), 20),
            self.log_path().display(),
            tail_file(&self.log_path(), 40),
        )
    }
}

/// The pids of the `beam.smp` processes whose environment names `node`.
fn node_processes(node: &str) -> Vec<i32> {
    let needle = format!("RABBITMQ_NODENAME={node}\0");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|comm| comm.trim() == "beam.smp")
                .unwrap_or(false)
        })
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.windows(needle.len()).any(|w| w == needle.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}
