//! A private RabbitMQ node for tests.
//!
//! Debian's `/usr/sbin/rabbitmq-*` wrappers, run as root, switch to the `rabbitmq` user
//! with `su` (not a login shell), which keeps the environment: the `RABBITMQ_*`
//! variables set here reach the node, and override `/etc/rabbitmq/rabbitmq-env.conf`.
//! The node runs with the system cookie (`/var/lib/rabbitmq`), so `rabbitmqctl -n NODE`
//! reaches it, and registers with the system's epmd on 4369.
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

use super::{chown_to, free_port, port_is_open, spawn_watchdog, stop_watchdog, tail_file};

const RABBITMQ_SERVER: &str = "/usr/sbin/rabbitmq-server";
const RABBITMQCTL: &str = "/usr/sbin/rabbitmqctl";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(90);

/// A RabbitMQ broker: a private node started by the harness, or an external one named by
/// `OUTBOX_TEST_AMQP_URL` (then `ctl`, `kill9` and `restart` panic).
pub struct RabbitServer {
    kind: Kind,
}

type Kind = super::ServerKind<Private>;

struct Private {
    node: String,
    amqp_port: u16,
    dist_port: u16,
    /// Owned by `rabbitmq`: `mnesia/`, `log/`, `pid`, `rabbitmq.conf`, `enabled_plugins`.
    dir: PathBuf,
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
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let started = Instant::now();
        let tempdir = tempfile::Builder::new()
            .prefix("outbox-test-rabbit-")
            .tempdir()
            .expect("create a temp dir for rabbitmq");
        let dir = tempdir.path().to_path_buf();
        // Readable by the rabbitmq user once chowned; tempdir creates it 0700.
        std::fs::write(dir.join("enabled_plugins"), "[].\n").expect("write enabled_plugins");
        std::fs::create_dir(dir.join("mnesia")).expect("mkdir mnesia");
        std::fs::create_dir(dir.join("log")).expect("mkdir log");

        // Started before the node, so that a test process killed while the node boots
        // does not leave it behind. It finds the node's processes by the name prefix in
        // their environment (the pid file appears only ~2 s into the boot).
        let node_prefix = format!("outbox-test-{}-{n}-", std::process::id());
        let cleanup = format!(
            "for p in /proc/[0-9]*; do \
               grep -qz '^RABBITMQ_NODENAME={node_prefix}' $p/environ 2>/dev/null \
               && kill -9 ${{p#/proc/}}; \
             done; sleep 1; rm -rf {dir}",
            dir = super::shell_quote(dir.to_str().unwrap()),
        );
        let mut watchdog = spawn_watchdog(&cleanup);
        let mut last_error = String::new();
        for attempt in 0..3 {
            let private = Private {
                node: format!("{node_prefix}{attempt}@localhost"),
                amqp_port: free_port(),
                dist_port: free_port(),
                dir: dir.clone(),
                state: Mutex::new(State {
                    tempdir: None,
                    watchdog: None,
                }),
            };
            let mut conf = format!(
                "listeners.tcp.1 = 127.0.0.1:{}\n\
                 loopback_users = none\n\
                 max_message_size = 16777216\n\
                 disk_free_limit.absolute = 1MB\n",
                private.amqp_port
            );
            for line in extra_conf {
                conf += line;
                conf += "\n";
            }
            std::fs::write(dir.join("rabbitmq.conf"), conf).expect("write rabbitmq.conf");
            chown_to(&dir, "rabbitmq");

            match private.launch() {
                Ok(()) => {
                    {
                        let mut state = private.state.lock().unwrap();
                        state.tempdir = Some(tempdir);
                        state.watchdog = watchdog.take();
                    }
                    eprintln!(
                        "harness: rabbitmq {} on port {} ready in {:?} ({})",
                        private.node,
                        private.amqp_port,
                        started.elapsed(),
                        dir.display()
                    );
                    return RabbitServer {
                        kind: Kind::Private(private),
                    };
                }
                Err(e) => {
                    private.kill_node();
                    last_error = e;
                    // A failed node leaves its mnesia dir behind; start the next clean.
                    let _ = std::fs::remove_dir_all(dir.join("mnesia"));
                    let _ = std::fs::create_dir(dir.join("mnesia"));
                }
            }
        }
        stop_watchdog(watchdog);
        panic!("rabbitmq failed to start:\n{last_error}");
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

    pub fn amqp_port(&self) -> u16 {
        match &self.kind {
            Kind::Private(p) => p.amqp_port,
            Kind::External { port, .. } => *port,
        }
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f`.
    pub fn url(&self) -> String {
        match &self.kind {
            Kind::Private(p) => format!("amqp://guest:guest@127.0.0.1:{}/%2f", p.amqp_port),
            Kind::External { url, .. } => url.clone(),
        }
    }

    /// The node name, `outbox-test-PID-N-A@localhost`.
    pub fn node(&self) -> &str {
        &self.private("node").node
    }

    pub fn dir(&self) -> &Path {
        &self.private("dir").dir
    }

    /// The node's main log.
    pub fn log_path(&self) -> PathBuf {
        self.private("log_path").log_path()
    }

    /// `rabbitmqctl -n NODE args…` (e.g. `["set_vm_memory_high_watermark", "0.0001"]`).
    /// About 1 s of CPU per call.
    pub fn ctl(&self, args: &[&str]) -> Output {
        self.private("ctl").ctl(args)
    }

    /// The beam process's pid, from the pid file.
    pub fn pid(&self) -> Option<i32> {
        self.private("pid").pid()
    }

    /// kill -9 of the node; returns once its AMQP port is closed.
    pub fn kill9(&self) {
        let p = self.private("kill9");
        let pid = p.pid().expect("rabbitmq pid file");
        p.kill_node();
        let closed = super::poll_until(Duration::from_secs(30), Duration::from_millis(20), || {
            !port_is_open(p.amqp_port) && !process_alive(pid)
        });
        assert!(closed, "rabbitmq (pid {pid}) still running after kill -9");
    }

    /// Starts the node again on the same ports and data dir and waits for it.
    pub fn restart(&self) {
        let p = self.private("restart");
        let started = Instant::now();
        if let Err(e) = p.launch() {
            panic!("rabbitmq failed to restart:\n{e}");
        }
        eprintln!(
            "harness: rabbitmq {} restarted in {:?}",
            p.node,
            started.elapsed()
        );
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
        // The data is thrown away: no need for a graceful `rabbitmqctl stop`.
        self.kill_node();
        if let Some(pid) = self.pid() {
            super::poll_until(Duration::from_secs(10), Duration::from_millis(10), || {
                !process_alive(pid)
            });
        }
        stop_watchdog(state.watchdog.take());
        state.tempdir.take();
    }
}

impl Private {
    fn pid_file(&self) -> PathBuf {
        self.dir.join("pid")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("log").join(format!("{}.log", self.node))
    }

    fn pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.pid_file())
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// kill -9 of the pid file's process and of any process still carrying this node's
    /// name in its environment (a node that died or hung before writing its pid file).
    fn kill_node(&self) {
        let mut pids: Vec<i32> = self.pid().into_iter().collect();
        pids.extend(node_processes(&self.node));
        for pid in pids {
            // SAFETY: kill(2) of a process this harness started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    fn ctl(&self, args: &[&str]) -> Output {
        Command::new(RABBITMQCTL)
            .arg("-n")
            .arg(&self.node)
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
        let status = Command::new(RABBITMQ_SERVER)
            .arg("-detached")
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_PORT", self.amqp_port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_PID_FILE", self.pid_file())
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
            .env_remove("RABBITMQ_ADVANCED_CONFIG_FILE")
            .env_remove("RABBITMQ_CONF_ENV_FILE")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .map_err(|e| format!("cannot run {RABBITMQ_SERVER}: {e}"))?;
        if !status.success() {
            return Err(self.failure(&format!("rabbitmq-server -detached exited with {status}")));
        }

        let started = Instant::now();
        loop {
            if port_is_open(self.amqp_port) {
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

    fn failure(&self, what: &str) -> String {
        format!(
            "node {} (amqp {}, dist {}, dir {}): {what}\n--- startup.log ---\n{}\n--- {} (tail) ---\n{}",
            self.node,
            self.amqp_port,
            self.dist_port,
            self.dir.display(),
            tail_file(&self.dir.join("startup.log"), 20),
            self.log_path().display(),
            tail_file(&self.log_path(), 40),
        )
    }
}

/// Whether a process exists and is not a zombie.
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
            .unwrap_or(false),
        Err(_) => false,
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
