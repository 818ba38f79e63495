//! The `outbox-relay` binary as a child process, its output in a log file, and waiting on
//! that log. It owns the relay's process and environment; it must never reach into the
//! relay's internals (a test sees only what an operator would: exit status, log, HTTP).

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::netns::Host;

/// The relay's log filter in tests: debug for the relay, info for its dependencies.
pub const TEST_LOG: (&str, &str) = ("RUST_LOG", "info,outbox_relay=debug");

/// The signal a relay dies of when a failpoint's `abort` fires (`OUTBOX_FAILPOINTS`).
pub const SIGABRT: i32 = libc::SIGABRT;

/// What the relay logs when a session has started streaming.
pub const SESSION_STARTED: &str = " streaming slot=";
/// The counter of sessions that started streaming (`run`).
pub const SESSIONS: &str = "outbox_relay_sessions_total";
/// The counter of reconnects, by cause.
pub const RECONNECTS: &str = "outbox_relay_reconnects_total";

/// What starts the one record a relay that stops on an error writes, in text logs
/// (`--log-format text`): `<time> ERROR outbox_relay: stopped error=<the error chain>`.
pub const STOPPED: &str = "ERROR outbox_relay: stopped error=";

/// The relay's final error in a text log: the error chain of its [`STOPPED`] record.
pub fn final_error(log: &str) -> Option<&str> {
    log.lines()
        .find_map(|line| Some(line.split_once(STOPPED)?.1))
}

static BINARY: OnceLock<PathBuf> = OnceLock::new();

/// Hands in the relay binary for this process (e.g. the benchmark's). Integration tests of
/// the relay package need not: cargo names it to them in `CARGO_BIN_EXE_outbox-relay`.
/// Panics if a different binary was handed in before.
pub fn set_binary(path: impl Into<PathBuf>) {
    let path = path.into();
    let set = BINARY.get_or_init(|| path.clone());
    assert_eq!(
        *set,
        path,
        "the relay binary was already set to {}",
        set.display()
    );
}

/// Names a relay binary to run instead of the one cargo built (another build of it, e.g. a
/// release's).
pub const RELAY_BIN_ENV: &str = "OUTBOX_TEST_RELAY_BIN";

/// The relay binary: the one handed to [`set_binary`], else [`RELAY_BIN_ENV`]'s, else
/// `CARGO_BIN_EXE_outbox-relay`
/// (which cargo sets when it runs the relay package's integration tests), else
/// `outbox-relay` beside the directory of this executable (`target/<profile>/deps/..`, for
/// a test binary started by hand).
pub fn binary() -> &'static Path {
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os(RELAY_BIN_ENV) {
            return PathBuf::from(path);
        }
        if let Some(path) = std::env::var_os("CARGO_BIN_EXE_outbox-relay") {
            return PathBuf::from(path);
        }
        let beside = std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.parent()?.join("outbox-relay")))
            .filter(|path| path.exists());
        beside.unwrap_or_else(|| {
            panic!(
                "The relay binary is unknown: run the tests with cargo, set \
                 CARGO_BIN_EXE_outbox-relay, or call outbox_testkit::relay::set_binary first."
            )
        })
    })
}

/// The consumer's binary, `outbox-inbox`, beside the relay's ([`binary`]): its package is
/// another member of the workspace, so cargo names it only to that package's own tests, and
/// the relay's tests find it where the workspace build put it. Panics naming the build if it
/// is not there (`cargo test --workspace` builds it; `cargo test --test main partitions::` alone
/// does not, so run `cargo build -p outbox-inbox` first, which also keeps it current).
pub fn inbox_binary() -> &'static Path {
    static INBOX: OnceLock<PathBuf> = OnceLock::new();
    INBOX.get_or_init(|| {
        let path = binary().with_file_name("outbox-inbox");
        assert!(
            path.is_file(),
            "the consumer binary {} is not built: run `cargo build -p outbox-inbox` (cargo \
             test --workspace builds it too)",
            path.display()
        );
        path
    })
}

/// A running `outbox-relay`. Every method takes `&self`. Drop kills it (SIGKILL) and,
/// if the test is panicking, prints the tail of its log.
pub struct RelayProcess {
    pid: u32,
    /// The child and, once reaped, its exit status.
    child: Mutex<(Child, Option<ExitStatus>)>,
    log_path: PathBuf,
    /// Where it serves /metrics (its `--metrics-addr`), if anywhere.
    metrics_at: Option<SocketAddr>,
    _dir: tempfile::TempDir,
}

/// The `--metrics-addr` among `args`, unless `off` or empty.
fn metrics_addr(args: &[&str]) -> Option<SocketAddr> {
    let at = args.iter().position(|a| *a == "--metrics-addr")?;
    args.get(at + 1)?.parse().ok()
}

/// The sum of the samples of the metric family `name` in a Prometheus text page.
fn family_sum(page: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in page.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        let value: f64 = rest.rsplit(' ').next()?.parse().ok()?;
        found = Some(found.unwrap_or(0.0) + value);
    }
    found
}

impl RelayProcess {
    /// Spawns the relay with `args` and `env` (added to the inherited environment, from
    /// which `DATABASE_URL`, `AMQP_URL` and every `OUTBOX_*` variable are removed so the
    /// relay sees only what the test gives it). stdout and stderr go to one log file.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> RelayProcess {
        Self::spawn_bin(binary(), args, env)
    }

    /// [`RelayProcess::spawn`] with another binary.
    pub fn spawn_bin(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> RelayProcess {
        Self::try_spawn_bin(bin, args, env)
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()))
    }

    /// [`RelayProcess::spawn`] on test host `host` ([`super::netns`]): the relay reaches what
    /// that host reaches, and serves its endpoints on the host's address
    /// (`--metrics-addr ADDR:PORT`).
    pub fn spawn_on(host: &Host, args: &[&str], env: &[(&str, &str)]) -> RelayProcess {
        Self::try_spawn_command(host.command(binary()), args, env)
            .unwrap_or_else(|e| panic!("spawn {} on {}: {e}", binary().display(), host.hostname()))
    }

    /// [`RelayProcess::spawn_bin`] on test host `host` (e.g. [`inbox_binary`]'s consumer).
    pub fn spawn_bin_on(
        bin: &Path,
        host: &Host,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> RelayProcess {
        Self::try_spawn_command(host.command(bin), args, env)
            .unwrap_or_else(|e| panic!("spawn {} on {}: {e}", bin.display(), host.hostname()))
    }

    /// [`RelayProcess::spawn_bin`] that returns the failure (no temp dir, no log file, or the
    /// binary would not start) instead of panicking: for the benchmark, which reports it.
    pub fn try_spawn_bin(
        bin: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> std::io::Result<RelayProcess> {
        Self::try_spawn_command(Command::new(bin), args, env)
    }

    /// [`RelayProcess::spawn`] with stdout and stderr into a pipe whose reading end is closed
    /// before the relay starts, as under `outbox-relay run 2>&1 | head -1` once `head` has
    /// exited: every write to them fails (EPIPE). Its log stays empty.
    pub fn spawn_unread(args: &[&str], env: &[(&str, &str)]) -> RelayProcess {
        let spawned = std::io::pipe().and_then(|(reader, writer)| {
            drop(reader);
            Self::spawn_into(Command::new(binary()), args, env, Some(writer))
        });
        spawned.unwrap_or_else(|e| panic!("spawn {}: {e}", binary().display()))
    }

    /// Spawns `command` (the relay binary, possibly behind `ip netns exec`, which keeps the
    /// pid) with `args` and `env`, see [`RelayProcess::spawn`].
    fn try_spawn_command(
        command: Command,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> std::io::Result<RelayProcess> {
        Self::spawn_into(command, args, env, None)
    }

    /// [`RelayProcess::try_spawn_command`], its stdout and stderr into `output` if given, else
    /// into its log file.
    fn spawn_into(
        mut command: Command,
        args: &[&str],
        env: &[(&str, &str)],
        output: Option<std::io::PipeWriter>,
    ) -> std::io::Result<RelayProcess> {
        // OUTBOX_TEST_KEEP_RELAY_LOGS keeps every relay's log after its process is gone: a
        // long campaign's verdict may need the sessions of relays it has since replaced.
        let dir = tempfile::Builder::new()
            .prefix("outbox-test-relay-")
            .disable_cleanup(std::env::var_os("OUTBOX_TEST_KEEP_RELAY_LOGS").is_some())
            .tempdir()?;
        let log_path = dir.path().join("relay.log");
        let log = File::create(&log_path)?;
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key == "DATABASE_URL" || key == "AMQP_URL" || key.starts_with("OUTBOX_") {
                command.env_remove(key.as_ref());
            }
        }
        let (stdout, stderr): (Stdio, Stdio) = match output {
            Some(pipe) => (pipe.try_clone()?.into(), pipe.into()),
            None => (log.try_clone()?.into(), log.into()),
        };
        command
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        let child = command.spawn()?;
        Ok(RelayProcess {
            pid: child.id(),
            child: Mutex::new((child, None)),
            log_path,
            metrics_at: metrics_addr(args),
            _dir: dir,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Everything the relay has written so far.
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    pub fn sigterm(&self) {
        self.signal(libc::SIGTERM);
    }

    pub fn sigint(&self) {
        self.signal(libc::SIGINT);
    }

    /// SIGSTOP: the relay frozen where it is, its window in flight and its sockets open,
    /// while a test lays a fault that takes longer than the relay needs to drain a backlog.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after [`RelayProcess::pause`].
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGKILL, and reap it.
    pub fn kill9(&self) {
        let mut guard = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let (child, exit) = &mut *guard;
        if exit.is_none() {
            let _ = child.kill();
            *exit = child.wait().ok();
        }
    }

    /// The exit status if it has exited (reaps it).
    pub fn try_exit(&self) -> Option<ExitStatus> {
        let mut guard = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let (child, exit) = &mut *guard;
        if exit.is_none() {
            *exit = child.try_wait().ok().flatten();
        }
        *exit
    }

    /// Waits (polling, without blocking the runtime) until the relay exits or `timeout`
    /// passes.
    pub async fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// [`RelayProcess::wait_exit`] for code outside a runtime.
    pub fn wait_exit_blocking(&self, timeout: Duration) -> Option<ExitStatus> {
        super::poll_until(timeout, Duration::from_millis(20), || {
            self.try_exit().is_some()
        });
        self.try_exit()
    }

    /// How many times `needle` occurs in the log so far.
    /// A counter of the running relay's /metrics (the sum over its labels), read with a
    /// blocking request: `None` when it serves no endpoint or does not answer (it exited).
    pub fn counter(&self, name: &str) -> Option<usize> {
        use std::io::{Read, Write};
        let at = self.metrics_at?;
        if self.try_exit().is_some() {
            return None;
        }
        let mut stream = std::net::TcpStream::connect_timeout(&at, Duration::from_secs(2)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {at}\r\n\r\n");
        stream.write_all(request.as_bytes()).ok()?;
        let mut page = String::new();
        stream.read_to_string(&mut page).ok()?;
        // A family that has not appeared yet (reconnects before the first) is zero.
        Some(family_sum(&page, name).map_or(0, |v| v as usize))
    }

    /// Waits until the running relay's /metrics value of `series` (a family summed over its
    /// labels, or one `name{labels}` series; absent is 0) satisfies `wanted`; false after
    /// `timeout`, or if the relay exits first or serves no endpoint.
    pub async fn wait_metric(
        &self,
        series: &str,
        timeout: Duration,
        wanted: impl Fn(usize) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match self.counter(series) {
                Some(value) if wanted(value) => return true,
                None if self.metrics_at.is_none() || self.try_exit().is_some() => return false,
                _ => {}
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Reconnects so far: `outbox_relay_reconnects_total` while the relay serves /metrics,
    /// else its "session failed" log lines (a relay that exited).
    pub fn reconnects(&self) -> usize {
        self.counter(RECONNECTS)
            .unwrap_or_else(|| self.log_count("session failed"))
    }

    pub fn log_count(&self, needle: &str) -> usize {
        self.log().matches(needle).count()
    }

    /// The log lines containing `needle`, for reports.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(needle))
            .map(String::from)
            .collect()
    }

    /// Waits (polling the log file, without blocking the runtime) until the log contains
    /// `needle`; false after `timeout` or if the relay exits without writing it.
    pub async fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        self.wait_for_log_count(needle, 1, timeout).await
    }

    /// Waits until `needle` occurs at least `n` times in the log; false after `timeout` or
    /// if the relay exits first.
    pub async fn wait_for_log_count(&self, needle: &str, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            // Read the exit first: a relay that wrote the line and then exited still counts.
            let exited = self.try_exit().is_some();
            if self.log_count(needle) >= n {
                return true;
            }
            if exited || Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sessions the relay has started so far: `outbox_relay_sessions_total` while it serves
    /// /metrics, else its log (a relay that exited, or one without endpoints).
    pub fn sessions(&self) -> usize {
        self.counter(SESSIONS)
            .unwrap_or_else(|| self.log_count(SESSION_STARTED))
    }

    /// Waits until the relay starts a session beyond the first `before`; how long that took.
    pub async fn wait_new_session(&self, before: usize, timeout: Duration) -> Option<Duration> {
        let started = Instant::now();
        let deadline = started + timeout;
        loop {
            let exited = self.try_exit().is_some();
            if self.sessions() > before {
                return Some(started.elapsed());
            }
            if exited || Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the relay has reconnected `n` times in all; false after `timeout`.
    pub async fn wait_reconnects(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let exited = self.try_exit().is_some();
            if self.reconnects() >= n {
                return true;
            }
            if exited || Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM and wait for a clean exit (panics with the log otherwise).
    pub async fn stop(&self) {
        self.sigterm();
        let status = self
            .wait_exit(Duration::from_secs(45))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "relay did not exit within 45 s of SIGTERM; log:\n{}",
                    self.log()
                )
            });
        assert!(
            status.success(),
            "relay exit after SIGTERM: {status}; log:\n{}",
            self.log()
        );
    }

    /// Peak resident set size (VmHWM) in KiB; `None` once the process has exited.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        super::procfs::peak_rss_kib(&status).ok()
    }

    fn signal(&self, signal: libc::c_int) {
        // Held while signalling, so the child cannot be reaped (and its pid reused) first.
        let guard = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if guard.1.is_none() {
            // SAFETY: kill(2) of our own child, not yet reaped.
            unsafe { libc::kill(self.pid as libc::pid_t, signal) };
        }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "--- outbox-relay log ({}), last 60 lines ---\n{}\n--- end of relay log ---",
                self.log_path.display(),
                super::tail_file(&self.log_path, 60)
            );
        }
    }
}
