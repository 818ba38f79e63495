//! A private PostgreSQL for tests, of a chosen major version, and the `test_decoding` oracle.
//!
//! The server runs from the installed binaries as the `postgres` user (initdb refuses
//! root) in a temp dir that holds the data dir, the unix socket and the server log.
//! fsync stays on: the crash tests stop it with `-m immediate` and rely on recovery.
//!
//! Versions: 15 is Debian 12's (`/usr/lib/postgresql/15/bin`), the default; 16, 17 and 18 are
//! the server binaries `scripts/install-postgres.sh` puts into a cache outside the repository,
//! at the versions pinned in `postgres-versions` (this crate's root). [`PG_MAJOR_ENV`] chooses
//! the version of a test process's servers, [`PgServer::start_major`] one server's.
//!
//! It owns its server's lifecycle; it must never stop or change a server it did not start:
//! with `OUTBOX_TEST_DATABASE_URL` (an external server) the stop and start methods panic.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use tokio_postgres::{Client, NoTls};

use super::netns::Host;

use super::{chown_to, free_port, is_root, spawn_watchdog, stop_watchdog, tail_file};

/// Where Debian puts the PostgreSQL 15 server binaries.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// The major version of Debian 12's PostgreSQL, the tests' default.
pub const DEFAULT_PG_MAJOR: u32 = 15;
/// Environment variable choosing the major version of this process's servers (15, 16, 17, 18).
pub const PG_MAJOR_ENV: &str = "OUTBOX_TEST_PG_MAJOR";
/// Environment variable naming a directory of server binaries to use instead (any version).
pub const PG_BIN_ENV: &str = "OUTBOX_TEST_PG_BIN";
/// Environment variable naming the cache of the installed 16, 17 and 18 (default [`PG_CACHE`]).
pub const PG_CACHE_ENV: &str = "OUTBOX_TEST_PG_CACHE";
/// The default cache: outside the repository, and readable by the `postgres` user (the
/// servers run as it; /root is closed to it).
pub const PG_CACHE: &str = "/var/cache/outbox-relay/postgresql";

/// `MAJOR VERSION` lines: the npm package version that holds each major's binaries.
const PINNED: &str = include_str!("../postgres-versions");

/// The pinned major versions besides [`DEFAULT_PG_MAJOR`], with their package versions.
pub fn pinned_versions() -> Vec<(u32, &'static str)> {
    PINNED
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|line| {
            let mut fields = line.split_whitespace();
            let major = fields.next().and_then(|m| m.parse().ok());
            match (major, fields.next()) {
                (Some(major), Some(version)) => (major, version),
                _ => panic!("postgres-versions: not `MAJOR VERSION`: {line:?}"),
            }
        })
        .collect()
}

/// Every major version the tests can run on: the default, then the pinned ones.
pub fn supported_majors() -> Vec<u32> {
    let pinned = pinned_versions().into_iter().map(|(major, _)| major);
    std::iter::once(DEFAULT_PG_MAJOR).chain(pinned).collect()
}

/// The major version this process's servers run: [`PG_MAJOR_ENV`], else 15. Panics on a
/// value that is not a supported version.
pub fn pg_major() -> u32 {
    let Ok(value) = std::env::var(PG_MAJOR_ENV) else {
        return DEFAULT_PG_MAJOR;
    };
    let supported = supported_majors();
    match value.trim().parse() {
        Ok(major) if supported.contains(&major) => major,
        _ => panic!("{PG_MAJOR_ENV}={value:?} is not a PostgreSQL major version the tests run on: one of {supported:?}"),
    }
}

/// The server binaries of `major`: Debian's for 15, the cache's for the pinned ones. Panics,
/// naming the command that installs them, if they are not there.
pub fn pg_bin_of(major: u32) -> PathBuf {
    let (bin, install) = if major == DEFAULT_PG_MAJOR {
        (
            PathBuf::from(PG_BIN),
            format!("apt-get install postgresql-{major}"),
        )
    } else {
        let Some((_, version)) = pinned_versions().into_iter().find(|(m, _)| *m == major) else {
            panic!(
                "PostgreSQL {major} is not a version the tests run on: one of {:?}",
                supported_majors()
            );
        };
        let cache = std::env::var(PG_CACHE_ENV).unwrap_or_else(|_| PG_CACHE.to_string());
        let bin = Path::new(&cache).join(version).join("bin");
        let env = if cache == PG_CACHE {
            String::new()
        } else {
            format!("{PG_CACHE_ENV}={cache} ")
        };
        (bin, format!("{env}scripts/install-postgres.sh {major}"))
    };
    assert!(
        bin.join("initdb").is_file(),
        "PostgreSQL {major} is not installed ({} has no initdb): install it with `{install}`",
        bin.display()
    );
    bin
}

/// The server binaries this process's servers run: [`PG_BIN_ENV`], else those of
/// [`pg_major`].
pub fn pg_bin() -> PathBuf {
    match std::env::var(PG_BIN_ENV) {
        Ok(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => pg_bin_of(pg_major()),
    }
}

/// A client program (`psql`, `pg_recvlogical`): from the server's binaries where they have
/// it, else Debian's 15 (the 16-18 packages hold only the server; a client of 15 talks to
/// the newer servers).
pub fn client_program(bin: &Path, name: &str) -> PathBuf {
    let own = bin.join(name);
    if own.is_file() {
        own
    } else {
        Path::new(PG_BIN).join(name)
    }
}

/// A PostgreSQL server: a private one started by the harness, or an external one named
/// by `OUTBOX_TEST_DATABASE_URL` (then the stop/start methods panic).
pub struct PgServer {
    kind: Kind,
    /// `server_version` as the server reports it, read on first use.
    version: OnceLock<String>,
}

/// Private, or external with its URL kept as given (for its credentials, host, port and
/// parameters).
type Kind = super::ServerKind<Private>;

struct Private {
    port: u16,
    /// The test host it runs on ([`super::netns`]); `None`: the root namespace, 127.0.0.1.
    host: Option<Host>,
    /// Owned by `postgres`: holds `data/`, the socket and `postgres.log`.
    dir: PathBuf,
    /// The server binaries it runs from.
    bin: PathBuf,
    state: Mutex<PrivateState>,
}

struct PrivateState {
    /// Dropping it removes the directory; `None` once shut down.
    tempdir: Option<tempfile::TempDir>,
    running: bool,
    watchdog: Option<Child>,
}

impl PgServer {
    /// initdb and start a private server of this process's version ([`pg_bin`]) on a free
    /// port with `wal_level=logical`, 200 replication slots, WAL senders and connections,
    /// plus `extra_settings` (written after the defaults into postgresql.conf, so they
    /// override them). About 1 s.
    pub fn start(extra_settings: &[(&str, &str)]) -> PgServer {
        Self::start_from(pg_bin(), None, extra_settings)
    }

    /// [`PgServer::start`] on test host `host`: listening on its address, open (trust) to the
    /// hosts of its network.
    pub fn start_on(host: &Host, extra_settings: &[(&str, &str)]) -> PgServer {
        Self::start_from(pg_bin(), Some(host), extra_settings)
    }

    /// Like [`Self::start`], of the major version `major` whatever [`PG_MAJOR_ENV`] and
    /// [`PG_BIN_ENV`] say: for a test that runs servers of different versions, or one it
    /// names (e.g. a feature of 17).
    pub fn start_major(major: u32, extra_settings: &[(&str, &str)]) -> PgServer {
        Self::start_from(pg_bin_of(major), None, extra_settings)
    }

    /// [`Self::start_major`] on test host `host` (as [`Self::start_on`]).
    pub fn start_major_on(host: &Host, major: u32, extra_settings: &[(&str, &str)]) -> PgServer {
        Self::start_from(pg_bin_of(major), Some(host), extra_settings)
    }

    fn start_from(bin: PathBuf, host: Option<&Host>, extra_settings: &[(&str, &str)]) -> PgServer {
        let started = Instant::now();
        let tempdir = tempfile::Builder::new()
            .prefix("outbox-test-pg-")
            .tempdir()
            .expect("create a temp dir for postgres");
        let dir = tempdir.path().to_path_buf();
        chown_to(&dir, "postgres");
        let data = dir.join("data");

        let out = pg_command(&bin, host, "initdb")
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"])
            // Syncing initdb's output only matters if the machine crashes.
            .args(["--no-sync", "--no-instructions"])
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed in {}:\n{}",
            data.display(),
            output_text(&out)
        );

        let listen = host.map_or(Ipv4Addr::LOCALHOST, Host::addr).to_string();
        let defaults = [
            ("listen_addresses", listen.as_str()),
            (
                "unix_socket_directories",
                dir.to_str().expect("utf-8 temp dir"),
            ),
            ("wal_level", "logical"),
            ("max_replication_slots", "200"),
            ("max_wal_senders", "200"),
            ("max_connections", "200"),
            ("log_line_prefix", "%m [%p] %q%a "),
        ];
        let settings: Vec<(&str, &str)> = defaults.iter().chain(extra_settings).copied().collect();
        append_settings(&data, &settings);
        if let Some(host) = host {
            // initdb's pg_hba.conf admits only the loopback addresses; `all` does not cover
            // physical replication, which a standby on another host needs.
            let hba_path = data.join("pg_hba.conf");
            let mut hba = std::fs::read_to_string(&hba_path).expect("read pg_hba.conf");
            let subnet = host.subnet_cidr();
            hba += &format!("host all all {subnet} trust\nhost replication all {subnet} trust\n");
            std::fs::write(&hba_path, hba).expect("write pg_hba.conf");
        }
        Self::launch(tempdir, bin, host.cloned(), started)
    }

    /// A streaming standby of the private server `primary`, of its version: creates the
    /// physical slot `slot` on the primary (reserving WAL at once), stops it cleanly, copies its data directory (the
    /// 16-18 binaries have no pg_basebackup), starts it again, and starts the copy with
    /// `standby.signal`, `primary_conninfo` (with `dbname`, which slot synchronization needs)
    /// and `primary_slot_name`, plus `extra_settings` (e.g. `hot_standby_feedback`). It
    /// returns once the standby accepts connections; it is caught up to where the primary
    /// stopped, and follows it from there.
    pub fn start_standby_of(
        primary: &PgServer,
        slot: &str,
        extra_settings: &[(&str, &str)],
    ) -> PgServer {
        Self::start_standby_in(None, primary, slot, extra_settings)
    }

    /// [`Self::start_standby_of`] on test host `host`: it listens on the host's address and
    /// streams from the primary's (a primary on a test host of the same network, whose
    /// pg_hba.conf the copy inherits).
    pub fn start_standby_on(
        host: &Host,
        primary: &PgServer,
        slot: &str,
        extra_settings: &[(&str, &str)],
    ) -> PgServer {
        Self::start_standby_in(Some(host), primary, slot, extra_settings)
    }

    fn start_standby_in(
        host: Option<&Host>,
        primary: &PgServer,
        slot: &str,
        extra_settings: &[(&str, &str)],
    ) -> PgServer {
        let started = Instant::now();
        let source = primary.private("start_standby_of");
        block_on(create_physical_slot(primary, slot));
        primary.stop();
        let tempdir = tempfile::Builder::new()
            .prefix("outbox-test-pg-standby-")
            .tempdir()
            .expect("create a temp dir for the standby");
        let dir = tempdir.path().to_path_buf();
        chown_to(&dir, "postgres");
        let data = dir.join("data");
        // As postgres, so the copy keeps its owner and modes.
        let copied = pg_user_command("cp")
            .arg("-a")
            .arg(source.data())
            .arg(&data)
            .output()
            .expect("run cp");
        primary.start_again();
        assert!(
            copied.status.success(),
            "copying {} failed:\n{}",
            source.data().display(),
            output_text(&copied)
        );
        // The copy's postgresql.conf listens where the primary does.
        let listen = host.map_or(Ipv4Addr::LOCALHOST, Host::addr).to_string();
        let own = [
            ("listen_addresses", listen.as_str()),
            (
                "unix_socket_directories",
                dir.to_str().expect("utf-8 temp dir"),
            ),
        ];
        append_settings(&data, &own);
        follow(&data, primary, slot, extra_settings);
        Self::launch(tempdir, source.bin.clone(), host.cloned(), started)
    }

    /// Brings this stopped server back as a streaming standby of `primary` (its new primary
    /// after a switchover) on its own host and port, with `extra_settings`: `standby.signal`,
    /// the settings [`Self::start_standby_of`] writes, `synchronized_standby_slots` removed
    /// from its `postgresql.auto.conf` (a primary's setting: left on a standby, it would stall
    /// logical decoding after a later promotion); the physical slot `slot` is made on
    /// `primary` first. It follows the new primary's timeline from where it stopped, which
    /// works when it stopped cleanly and the standby had received its last WAL before the
    /// promotion; a crashed primary may have WAL the new one lacks: see
    /// [`Self::rebuild_as_standby_of`]. Returns once it accepts connections.
    pub fn restart_as_standby_of(
        &self,
        primary: &PgServer,
        slot: &str,
        extra_settings: &[(&str, &str)],
    ) {
        block_on(create_physical_slot(primary, slot));
        follow(
            &self.private("restart_as_standby_of").data(),
            primary,
            slot,
            extra_settings,
        );
        self.start_again();
    }

    /// Replaces this stopped server's data with an online copy of `primary` (the low-level
    /// base backup: `pg_backup_start`, a copy of the running data directory, `pg_backup_stop`
    /// and its `backup_label`; the 16-18 binaries have no pg_basebackup) and starts it as
    /// [`Self::restart_as_standby_of`] does. Its own `postgresql.conf`, `pg_hba.conf` and
    /// `pg_ident.conf` stay (its address, port and socket); the copy leaves out WAL segments,
    /// replication slots and the run-time files PostgreSQL's documentation names. For a
    /// crashed primary, whose WAL may run past the new primary's history.
    pub fn rebuild_as_standby_of(
        &self,
        primary: &PgServer,
        slot: &str,
        extra_settings: &[(&str, &str)],
    ) {
        let data = self.private("rebuild_as_standby_of").data();
        let source = primary.private("rebuild_as_standby_of").data();
        block_on(create_physical_slot(primary, slot));
        let keep = ["postgresql.conf", "pg_hba.conf", "pg_ident.conf"];
        let mut clear = pg_user_command("find");
        clear.arg(&data).args(["-mindepth", "1", "-maxdepth", "1"]);
        for name in keep {
            clear.args(["!", "-name", name]);
        }
        let cleared = clear
            .args(["-exec", "rm", "-rf", "{}", "+"])
            .output()
            .expect("run find");
        assert!(
            cleared.status.success(),
            "clearing {}: {}",
            data.display(),
            output_text(&cleared)
        );
        let label = block_on(async {
            let client = primary.client("postgres").await;
            client
                .execute("SELECT pg_backup_start('outbox-test rebuild', true)", &[])
                .await
                .expect("pg_backup_start");
            let excluded = [
                "./postmaster.pid",
                "./postmaster.opts",
                "./pg_wal/0*",
                "./pg_replslot/*",
                "./pg_stat_tmp/*",
                "./pg_dynshmem/*",
                "./pg_notify/*",
                "./pg_serial/*",
                "./pg_snapshots/*",
                "./pg_subtrans/*",
                "./base/pgsql_tmp/*",
                "./standby.signal",
                "./backup_label*",
            ]
            .map(String::from)
            .into_iter()
            .chain(keep.iter().map(|name| format!("./{name}")))
            .map(|pattern| format!("--exclude={}", super::shell_quote(&pattern)))
            .collect::<Vec<_>>()
            .join(" ");
            // tar exits 1 for a file that changed while it was read: the backup's WAL
            // replay makes such a file right, which is what the backup API is for.
            let script = format!(
                "tar -C {src} {excluded} -cf - . | tar -C {dst} -xf -; \
                 s=(${{PIPESTATUS[@]}}); [ ${{s[0]}} -le 1 ] && [ ${{s[1]}} -eq 0 ]",
                src = super::shell_quote(source.to_str().expect("utf-8 data dir")),
                dst = super::shell_quote(data.to_str().expect("utf-8 data dir")),
            );
            let copied = pg_user_command("bash")
                .args(["-c", &script])
                .output()
                .expect("run tar");
            assert!(
                copied.status.success(),
                "copying {} online: {}",
                source.display(),
                output_text(&copied)
            );
            let row = client
                .query_one("SELECT labelfile FROM pg_backup_stop(false)", &[])
                .await
                .expect("pg_backup_stop");
            row.get::<_, String>(0)
        });
        let label_path = data.join("backup_label");
        std::fs::write(&label_path, label).expect("write backup_label");
        chown_to(&label_path, "postgres");
        follow(&data, primary, slot, extra_settings);
        self.start_again();
    }

    /// Starts the server whose data directory is `tempdir`/data on a free port, with a
    /// watchdog that removes it if this process dies first.
    fn launch(
        tempdir: tempfile::TempDir,
        bin: PathBuf,
        host: Option<Host>,
        started: Instant,
    ) -> PgServer {
        let dir = tempdir.path().to_path_buf();
        let data = dir.join("data");
        // Started before the server, so that a test process killed during the start
        // does not leave it behind.
        let cleanup = format!(
            "{as_postgres}{bin}/pg_ctl -D {data} stop -m immediate; rm -rf {dir}",
            as_postgres = if is_root() {
                "runuser -u postgres -- "
            } else {
                ""
            },
            bin = super::shell_quote(bin.to_str().expect("utf-8 binaries path")),
            data = super::shell_quote(data.to_str().unwrap()),
            dir = super::shell_quote(dir.to_str().unwrap()),
        );
        let mut watchdog = spawn_watchdog(&cleanup);

        // The port was free a moment ago; another process may take it first: retry.
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            let private = Private {
                port,
                host: host.clone(),
                dir: dir.clone(),
                bin: bin.clone(),
                state: Mutex::new(PrivateState {
                    tempdir: None,
                    running: false,
                    watchdog: None,
                }),
            };
            match private.pg_ctl_start() {
                Ok(()) => {
                    {
                        let mut state = private.state.lock().unwrap();
                        state.tempdir = Some(tempdir);
                        state.running = true;
                        state.watchdog = watchdog.take();
                    }
                    let server = PgServer {
                        kind: Kind::Private(private),
                        version: OnceLock::new(),
                    };
                    eprintln!(
                        "harness: postgres {} on port {port} ready in {:?} ({}, {})",
                        server.server_version(),
                        started.elapsed(),
                        dir.display(),
                        bin.display()
                    );
                    return server;
                }
                Err(e) => last_error = e,
            }
        }
        stop_watchdog(watchdog);
        panic!(
            "postgres failed to start in {}:\n{last_error}",
            dir.display()
        );
    }

    /// An existing server named by a URL; `url(db)` swaps in the database name.
    pub fn external(url: &str) -> PgServer {
        let port = url_port(url).unwrap_or(5432);
        PgServer {
            kind: Kind::External {
                url: url.to_string(),
                port,
            },
            version: OnceLock::new(),
        }
    }

    /// `server_version` as the server reports it (e.g. `18.4`, or `15.14 (Debian …)`).
    pub fn server_version(&self) -> &str {
        self.version.get_or_init(|| {
            block_on(async {
                let client = self.client("postgres").await;
                query_value::<String>(&client, "SHOW server_version").await
            })
        })
    }

    /// The server's major version (e.g. 18), from [`Self::server_version`].
    pub fn major_version(&self) -> u32 {
        let version = self.server_version();
        let digits: String = version.chars().take_while(char::is_ascii_digit).collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("no major version in server_version {version:?}"))
    }

    /// The server binaries a private server runs from.
    pub fn bin(&self) -> &Path {
        &self.private("bin").bin
    }

    /// The address a private server listens on: its test host's, else 127.0.0.1.
    pub fn addr(&self) -> Ipv4Addr {
        let host = self.private("addr").host.as_ref();
        host.map_or(Ipv4Addr::LOCALHOST, Host::addr)
    }

    /// The test host a private server runs on, if any.
    pub fn host(&self) -> Option<&Host> {
        self.private("host").host.as_ref()
    }

    pub fn port(&self) -> u16 {
        match &self.kind {
            Kind::Private(p) => p.port,
            Kind::External { port, .. } => *port,
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/db` (for an external server: its URL with the
    /// database replaced).
    pub fn url(&self, db: &str) -> String {
        match &self.kind {
            Kind::Private(p) => {
                let addr = p.host.as_ref().map_or(Ipv4Addr::LOCALHOST, Host::addr);
                format!("postgres://postgres@{addr}:{}/{db}", p.port)
            }
            Kind::External { url, .. } => replace_url_database(url, db),
        }
    }

    /// The directory holding `data/`, the socket and `postgres.log` (private servers).
    pub fn dir(&self) -> &Path {
        &self.private("dir").dir
    }

    /// The server log (private servers).
    pub fn log_path(&self) -> PathBuf {
        self.private("log_path").dir.join("postgres.log")
    }

    /// A connected client; the connection task runs on the current tokio runtime.
    pub async fn client(&self, db: &str) -> Client {
        pg_connect(&self.url(db)).await
    }

    /// Creates a fresh database and returns its URL.
    pub async fn create_database(&self, name: &str) -> String {
        let admin = self.client("postgres").await;
        admin
            .batch_execute(&format!("CREATE DATABASE {}", quote_ident(name)))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e:?}"));
        self.url(name)
    }

    /// [`Self::create_database`] for code outside a runtime.
    pub fn create_database_blocking(&self, name: &str) -> String {
        block_on(self.create_database(name))
    }

    /// Crash: `pg_ctl stop -m immediate` (no checkpoint; recovery at the next start).
    pub fn stop_immediate(&self) {
        self.private("stop_immediate").pg_ctl_stop("immediate");
    }

    /// Clean stop: `pg_ctl stop -m fast`.
    pub fn stop(&self) {
        self.private("stop").pg_ctl_stop("fast");
    }

    /// Starts the stopped server again on the same port and data dir.
    pub fn start_again(&self) {
        let p = self.private("start_again");
        if let Err(e) = p.pg_ctl_start() {
            panic!("postgres failed to start again: {e}");
        }
        p.state.lock().unwrap().running = true;
    }

    /// Stops the server (immediate) and removes its directory; idempotent. Drop and the
    /// shared services' exit handler call it.
    pub fn shutdown(&self) {
        self.kind.shutdown();
    }

    fn private(&self, what: &str) -> &Private {
        self.kind.private("PgServer", what, super::DATABASE_URL_ENV)
    }
}

impl super::PrivateServer for Private {
    fn shutdown(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.tempdir.is_none() {
            return;
        }
        // Even if we think it is stopped: a failed start_again may have left it up.
        let _ = self.pg_ctl(&["stop", "-m", "immediate"]);
        state.running = false;
        stop_watchdog(state.watchdog.take());
        state.tempdir.take();
    }
}

impl Private {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn pg_ctl(&self, args: &[&str]) -> Output {
        pg_command(&self.bin, self.host.as_ref(), "pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(args)
            .output()
            .expect("run pg_ctl")
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let log = self.dir.join("postgres.log");
        let port = self.port.to_string();
        let out = pg_command(&self.bin, self.host.as_ref(), "pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(&log)
            .args(["-o", &format!("-p {port}"), "-w", "-t", "120", "start"])
            .output()
            .expect("run pg_ctl start");
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl start (port {port}) failed:\n{}\n--- {} (tail) ---\n{}",
                output_text(&out),
                log.display(),
                tail_file(&log, 30)
            ))
        }
    }

    fn pg_ctl_stop(&self, mode: &str) {
        let out = self.pg_ctl(&["stop", "-m", mode, "-w", "-t", "60"]);
        assert!(
            out.status.success(),
            "pg_ctl stop -m {mode} failed:\n{}",
            output_text(&out)
        );
        self.state.lock().unwrap().running = false;
    }
}

/// Appends `settings` to `data`/postgresql.conf: later lines override earlier ones.
fn append_settings(data: &Path, settings: &[(&str, &str)]) {
    let mut conf = String::from("\n# outbox-relay test harness\n");
    for (name, value) in settings {
        conf += &format!("{name} = '{}'\n", value.replace('\'', "''"));
    }
    let conf_path = data.join("postgresql.conf");
    let mut existing = std::fs::read_to_string(&conf_path).expect("read postgresql.conf");
    existing += &conf;
    std::fs::write(&conf_path, existing).expect("write postgresql.conf");
}

/// Makes the data directory `data` a streaming standby of `primary` through its physical
/// slot `slot`: `standby.signal`, `primary_conninfo` (with the `dbname` slot synchronization
/// needs), `primary_slot_name`, `hot_standby` and `extra_settings` appended to its
/// postgresql.conf, and no `synchronized_standby_slots` in its postgresql.auto.conf.
fn follow(data: &Path, primary: &PgServer, slot: &str, extra_settings: &[(&str, &str)]) {
    let conninfo = format!(
        "host={} port={} user=postgres dbname=postgres application_name=standby",
        primary.addr(),
        primary.port()
    );
    let standby = [
        ("primary_conninfo", conninfo.as_str()),
        ("primary_slot_name", slot),
        ("hot_standby", "on"),
    ];
    let settings: Vec<(&str, &str)> = standby.iter().chain(extra_settings).copied().collect();
    append_settings(data, &settings);
    let auto = data.join("postgresql.auto.conf");
    if let Ok(text) = std::fs::read_to_string(&auto) {
        let kept: String = text
            .lines()
            .filter(|line| !line.trim_start().starts_with("synchronized_standby_slots"))
            .map(|line| format!("{line}\n"))
            .collect();
        std::fs::write(&auto, kept).expect("write postgresql.auto.conf");
    }
    let signal = data.join("standby.signal");
    std::fs::write(&signal, "").expect("write standby.signal");
    chown_to(&signal, "postgres");
}

/// Creates the physical slot `slot` on `primary`, reserving WAL at once; one of that name
/// that no standby streams from (left from an earlier standby) is dropped first.
async fn create_physical_slot(primary: &PgServer, slot: &str) {
    let client = primary.client("postgres").await;
    client
        .execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
             WHERE slot_name = $1 AND NOT active",
            &[&slot],
        )
        .await
        .unwrap_or_else(|e| panic!("drop the old physical slot {slot}: {e:?}"));
    client
        .execute(
            "SELECT pg_create_physical_replication_slot($1, true)",
            &[&slot],
        )
        .await
        .unwrap_or_else(|e| panic!("create the physical slot {slot}: {e:?}"));
}

/// Runs `future` to completion on a runtime of its own, in a thread of its own: callable from
/// any thread, inside a runtime or not (a runtime cannot block on another in its own thread).
pub(crate) fn block_on<T: Send>(future: impl std::future::Future<Output = T> + Send) -> T {
    std::thread::scope(|s| {
        let thread = s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("build a runtime")
                .block_on(future)
        });
        thread
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// A server binary of `bin`, run as `postgres` when we are root, on test host `host` if
/// given (the server that `pg_ctl start` forks stays there).
fn pg_command(bin: &Path, host: Option<&Host>, binary: &str) -> Command {
    pg_user_command_on(host, bin.join(binary))
}

/// `program`, run as `postgres` when we are root.
fn pg_user_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    pg_user_command_on(None, program)
}

fn pg_user_command_on(host: Option<&Host>, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let start = |name: &std::ffi::OsStr| match host {
        Some(host) => host.command(name),
        None => Command::new(name),
    };
    let mut cmd = if is_root() {
        let mut c = start(std::ffi::OsStr::new("runuser"));
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        start(program.as_ref())
    };
    // runuser keeps the cwd; postgres cannot read /root.
    cmd.current_dir("/");
    cmd
}

fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `sql` through `psql -v ON_ERROR_STOP=1` against `url` (the way a DBA pipes a
/// provisioning script into it) and returns its output; panics if psql fails.
pub fn psql(url: &str, sql: &str) -> String {
    use std::io::Write as _;
    // The npm builds of 16-18 have no psql: Debian's 15 speaks to them.
    let psql = client_program(&pg_bin(), "psql");
    let mut child = Command::new(&psql)
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", psql.display()));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(sql.as_bytes())
        .expect("write the script");
    let out = child.wait_with_output().expect("psql");
    assert!(
        out.status.success(),
        "psql failed:\n{}\n{sql}",
        output_text(&out)
    );
    output_text(&out)
}

/// Connects and spawns the connection task on the current tokio runtime.
pub async fn pg_connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e:?}"));
    tokio::spawn(async move {
        // Errors after a server crash are expected in fault tests.
        let _ = connection.await;
    });
    client
}

/// The first column of every row `sql` returns, as text (e.g. the lines of an `EXPLAIN`).
pub async fn first_column(
    client: &Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Vec<String> {
    let rows = client.query(sql, params).await;
    let rows = rows.unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    rows.iter().map(|row| row.get(0)).collect()
}

/// The one value the one-row, one-column query `sql` returns.
pub async fn query_value<T: tokio_postgres::types::FromSqlOwned>(client: &Client, sql: &str) -> T {
    let row = client.query_one(sql, &[]).await;
    row.unwrap_or_else(|e| panic!("{sql}: {e:?}")).get(0)
}

/// Polls the count `sql` returns every 20 ms until `wanted` holds: `Ok(count)`, or
/// `Err(last count)` after `timeout`.
pub async fn wait_count(
    client: &Client,
    sql: &str,
    timeout: std::time::Duration,
    wanted: impl Fn(i64) -> bool,
) -> Result<i64, i64> {
    let deadline = Instant::now() + timeout;
    loop {
        let n: i64 = query_value(client, sql).await;
        if wanted(n) {
            return Ok(n);
        }
        if Instant::now() >= deadline {
            return Err(n);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Drops `slot` once no walsender holds it: a stopped relay's walsender exits a moment after
/// the relay does, and dropping an active slot fails.
pub async fn drop_slot_once_released(client: &Client, slot: &str) {
    let active = format!(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}' AND active",
        slot.replace('\'', "''")
    );
    let released = wait_count(client, &active, std::time::Duration::from_secs(30), |n| {
        n == 0
    })
    .await;
    assert!(released.is_ok(), "slot {slot} still active after 30 s");
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .expect("drop the slot");
}

/// `"name"`, with embedded quotes doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

pub fn url_port(url: &str) -> Option<u16> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?']).next()?;
    let host_port = authority.rsplit('@').next()?;
    host_port.rsplit_once(':')?.1.parse().ok()
}

/// `scheme://authority/db?params` with the database replaced.
pub fn replace_url_database(url: &str, db: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let end_of_authority = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end_of_authority);
    let params = tail.find('?').map(|i| &tail[i..]).unwrap_or("");
    format!("{scheme}://{authority}/{db}{params}")
}

// ---------------------------------------------------------------------------------
// LSNs and slots

/// Parses `X/Y` (hex) into a u64.
pub fn parse_lsn(text: &str) -> u64 {
    let (hi, lo) = text
        .split_once('/')
        .unwrap_or_else(|| panic!("not an LSN: {text:?}"));
    let hi = u64::from_str_radix(hi, 16).unwrap_or_else(|_| panic!("not an LSN: {text:?}"));
    let lo = u64::from_str_radix(lo, 16).unwrap_or_else(|_| panic!("not an LSN: {text:?}"));
    (hi << 32) | lo
}

/// Formats a u64 LSN as `X/Y`.
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

/// `pg_current_wal_lsn()`.
pub async fn current_wal_lsn(client: &Client) -> u64 {
    let row = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("pg_current_wal_lsn");
    parse_lsn(row.get(0))
}

/// The slot's `confirmed_flush_lsn`; panics if the slot does not exist.
pub async fn slot_confirmed_flush(client: &Client, slot: &str) -> u64 {
    match try_slot_confirmed_flush(client, slot).await {
        Ok(Some(lsn)) => lsn,
        Ok(None) => panic!("replication slot {slot} does not exist or has no confirmed_flush_lsn"),
        Err(e) => panic!("query pg_replication_slots: {e}"),
    }
}

/// The slot's `confirmed_flush_lsn`, `None` when there is no such slot or it has none yet;
/// the query's error when the server did not answer (a test reading it during faults).
pub async fn try_slot_confirmed_flush(
    client: &Client,
    slot: &str,
) -> Result<Option<u64>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(row.and_then(|row| row.get::<_, Option<&str>>(0).map(parse_lsn)))
}

/// Creates a logical slot with the `test_decoding` plugin: the commit-order oracle.
/// Create it before the writers start; it sees every transaction committed after it.
pub async fn create_test_decoding_slot(client: &Client, name: &str) {
    client
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'test_decoding')",
            &[&name],
        )
        .await
        .unwrap_or_else(|e| panic!("create test_decoding slot {name}: {e:?}"));
}

/// One committed transaction as `test_decoding` saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Txn {
    pub xid: u64,
    /// End of the commit record: what a relay acknowledges for this transaction.
    pub end_lsn: u64,
    /// Row changes in commit order.
    pub changes: Vec<Change>,
}

/// One row change of a transaction, or one transactional logical message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Schema-qualified, as test_decoding prints it: `public.outbox`; for a logical
    /// message, its prefix.
    pub table: String,
    /// `INSERT`, `UPDATE`, `DELETE` or `TRUNCATE`; `MESSAGE` for a logical message.
    pub op: String,
    /// The text of the column named `id`, if the change has one; for a logical message
    /// whose content is a JSON object, its `id` field.
    pub id: Option<String>,
}

impl Txn {
    /// The `id`s of the rows this transaction inserted into `table` (e.g. `public.outbox`).
    pub fn inserted_ids(&self, table: &str) -> Vec<String> {
        self.changes
            .iter()
            .filter(|c| c.table == table && c.op == "INSERT")
            .filter_map(|c| c.id.clone())
            .collect()
    }

    /// The `id`s of the transactional logical messages with `prefix` (e.g. events of the
    /// emit functions), in WAL order.
    pub fn message_ids(&self, prefix: &str) -> Vec<String> {
        self.changes
            .iter()
            .filter(|c| c.table == prefix && c.op == "MESSAGE")
            .filter_map(|c| c.id.clone())
            .collect()
    }

    /// The `id`s of rows inserted into `table` and of messages with `prefix`, interleaved
    /// in WAL order: what a relay publishing both delivers for this transaction.
    pub fn row_and_message_ids(&self, table: &str, prefix: &str) -> Vec<String> {
        self.changes
            .iter()
            .filter(|c| {
                (c.table == table && c.op == "INSERT") || (c.table == prefix && c.op == "MESSAGE")
            })
            .filter_map(|c| c.id.clone())
            .collect()
    }
}

/// Every transaction committed since the slot was created (or last consumed), in commit
/// order, without consuming them (`pg_logical_slot_peek_changes`, empty transactions
/// skipped). Lines other than BEGIN/COMMIT/table changes (e.g. logical messages) are
/// ignored.
pub async fn read_test_decoding(client: &Client, slot: &str) -> Vec<Txn> {
    peek_test_decoding(client, slot, "1").await
}

/// Like [`read_test_decoding`], with the transactional logical messages as changes
/// (`op` `MESSAGE`). test_decoding prints no BEGIN/COMMIT around a transaction that only
/// wrote messages when it skips empty transactions, so this reads them all and leaves out
/// those without changes.
pub async fn read_test_decoding_with_messages(client: &Client, slot: &str) -> Vec<Txn> {
    let mut txns = peek_test_decoding(client, slot, "0").await;
    txns.retain(|t| !t.changes.is_empty());
    txns
}

async fn peek_test_decoding(client: &Client, slot: &str, skip_empty: &str) -> Vec<Txn> {
    let rows = client
        .query(
            "SELECT lsn::text, xid::text::bigint, data \
             FROM pg_logical_slot_peek_changes($1, NULL, NULL, 'skip-empty-xacts', $2)",
            &[&slot, &skip_empty],
        )
        .await
        .unwrap_or_else(|e| panic!("peek test_decoding slot {slot}: {e:?}"));
    let lines: Vec<(u64, u64, String)> = rows
        .iter()
        .map(|r| {
            (
                parse_lsn(r.get::<_, &str>(0)),
                r.get::<_, i64>(1) as u64,
                r.get::<_, String>(2),
            )
        })
        .collect();
    parse_test_decoding(lines.iter().map(|(l, x, d)| (*l, *x, d.as_str())))
}

/// Parses `test_decoding` output lines `(lsn, xid, data)` into transactions.
pub fn parse_test_decoding<'a>(lines: impl IntoIterator<Item = (u64, u64, &'a str)>) -> Vec<Txn> {
    let mut txns = Vec::new();
    let mut current: Option<Txn> = None;
    for (lsn, xid, data) in lines {
        if data.starts_with("BEGIN") {
            current = Some(Txn {
                xid,
                end_lsn: 0,
                changes: Vec::new(),
            });
        } else if data.starts_with("COMMIT") {
            if let Some(mut txn) = current.take() {
                txn.end_lsn = lsn;
                txns.push(txn);
            }
        } else if let Some(rest) = data.strip_prefix("message: transactional: 1 prefix: ") {
            // "message: transactional: 1 prefix: P, sz: N content:C"
            let (Some(txn), Some((prefix, rest))) = (current.as_mut(), rest.split_once(", sz: "))
            else {
                continue;
            };
            let content = rest.split_once(" content:").map_or("", |(_, c)| c);
            let id = serde_json::from_str::<serde_json::Value>(content)
                .ok()
                .and_then(|v| v.get("id").and_then(|id| id.as_str()).map(str::to_string));
            txn.changes.push(Change {
                table: prefix.to_string(),
                op: "MESSAGE".to_string(),
                id,
            });
        } else if let Some(rest) = data.strip_prefix("table ") {
            let Some(txn) = current.as_mut() else {
                continue;
            };
            // "public.outbox: INSERT: id[uuid]:'…' event_type[text]:'…'"
            let Some((table, rest)) = rest.split_once(": ") else {
                continue;
            };
            let (op, columns) = rest
                .split_once(": ")
                .unwrap_or((rest.trim_end_matches(':'), ""));
            let id = column_value(columns, "id");
            txn.changes.push(Change {
                table: table.to_string(),
                op: op.to_string(),
                id,
            });
        }
    }
    txns
}

/// The text of column `wanted` in a test_decoding column list
/// `name[type]:value name[type]:value …`, where a value is `'quoted'` (with `''`
/// escapes), `null` or a bare token. `None` if absent or the list does not parse.
pub fn column_value(mut columns: &str, wanted: &str) -> Option<String> {
    while !columns.is_empty() {
        let (name, rest) = columns.split_once('[')?;
        let (_type, rest) = rest.split_once("]:")?;
        let (value, rest) = if let Some(quoted) = rest.strip_prefix('\'') {
            let mut value = String::new();
            let mut end = None;
            let mut chars = quoted.char_indices().peekable();
            while let Some((i, c)) = chars.next() {
                if c == '\'' {
                    if matches!(chars.peek(), Some((_, '\''))) {
                        chars.next();
                        value.push('\'');
                    } else {
                        end = Some(i + 1);
                        break;
                    }
                } else {
                    value.push(c);
                }
            }
            (value, &quoted[end?..])
        } else {
            let end = rest.find(' ').unwrap_or(rest.len());
            (rest[..end].to_string(), &rest[end..])
        };
        if name == wanted {
            return Some(value);
        }
        columns = rest.trim_start_matches(' ');
    }
    None
}
