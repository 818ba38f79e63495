//! A provisioned outbox for one test: its own database, slot, exchange and bound queue,
//! provisioned by the relay's own `setup`, the relay commands run against it, plus writers
//! that insert like an application. It must never create the outbox's objects itself: the
//! relay's `setup` is what a test provisions with, so the tests check what operators run.

use std::net::SocketAddrV4;
use std::process::{Command, Output};
use std::time::Duration;

use lapin::types::FieldTable;
use tokio_postgres::Client;

use super::amqp::declare_bound_queue_with_args;
use super::netns::Host;
use super::pg::{pg_connect, slot_confirmed_flush};
use super::relay::{binary, RelayProcess, TEST_LOG};
use super::{services, unique_name};

pub struct Outbox {
    pub db_url: String,
    pub amqp_url: String,
    pub slot: String,
    pub exchange: String,
    /// Bound to `exchange` with `#`: receives every message.
    pub queue: String,
    pub client: Client,
}

/// The relay's commands, as [`Outbox::run_command`] finds them among its arguments.
const COMMANDS: [&str; 6] = ["setup", "run", "poll", "status", "teardown", "resync"];

impl Outbox {
    /// A fresh database on the shared services, provisioned with `outbox-relay setup`.
    pub async fn new(prefix: &str) -> Outbox {
        let s = services();
        Self::on(&s.pg.url("postgres"), &s.rabbit.url(), prefix).await
    }

    /// Like [`Outbox::new`], on the given servers (fault tests own theirs).
    pub async fn on(server_url: &str, amqp_url: &str, prefix: &str) -> Outbox {
        Self::provision(
            server_url,
            amqp_url,
            prefix,
            &["setup"],
            FieldTable::default(),
        )
        .await
    }

    /// Like [`Outbox::on`], provisioned for polling mode (`setup --mode poll`: the table with
    /// `published_at` and the claim index; no publication, no slot).
    pub async fn on_poll(server_url: &str, amqp_url: &str, prefix: &str) -> Outbox {
        let setup = ["setup", "--mode", "poll"];
        Self::provision(server_url, amqp_url, prefix, &setup, FieldTable::default()).await
    }

    /// An outbox provisioned with `outbox-relay <setup…>` (e.g. `["setup"]`), its queue
    /// declared with `queue_arguments` (e.g. [`quorum_queue_arguments`]: a quorum queue led
    /// by the node of `amqp_url`).
    ///
    /// [`quorum_queue_arguments`]: super::amqp::quorum_queue_arguments
    pub async fn provision(
        server_url: &str,
        amqp_url: &str,
        prefix: &str,
        setup: &[&str],
        queue_arguments: FieldTable,
    ) -> Outbox {
        let name = unique_name(prefix);
        let admin = pg_connect(server_url).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("create database {name}: {e:?}"));
        let db_url = super::pg::replace_url_database(server_url, &name);
        Self::provision_in(&db_url, amqp_url, setup, queue_arguments).await
    }

    /// Like [`Outbox::provision`], in the existing, empty database of `db_url`, whose name
    /// also names the slot, exchange and queue (e.g. a database a standby must have before
    /// the slot is made: [`super::failover::FailoverPair::outbox`]).
    pub async fn provision_in(
        db_url: &str,
        amqp_url: &str,
        setup: &[&str],
        queue_arguments: FieldTable,
    ) -> Outbox {
        let name = db_url
            .split('?')
            .next()
            .and_then(|url| url.rsplit('/').next())
            .expect("a database in the URL");
        let outbox = Outbox {
            client: pg_connect(db_url).await,
            db_url: db_url.to_string(),
            amqp_url: amqp_url.to_string(),
            slot: format!("{name}_slot"),
            exchange: format!("{name}_x"),
            queue: format!("{name}_q"),
        };
        let setup = outbox.run_command(setup);
        assert!(
            setup.status.success(),
            "setup failed: {}{}",
            String::from_utf8_lossy(&setup.stdout),
            String::from_utf8_lossy(&setup.stderr)
        );
        let (url, exchange, queue) = (&outbox.amqp_url, &outbox.exchange, &outbox.queue);
        declare_bound_queue_with_args(url, exchange, queue, "#", queue_arguments).await;
        outbox
    }

    /// The connection and name flags `command` takes for this outbox: only those, since a
    /// command refuses flags it does not use (`status` has no --amqp-url, `poll` no --slot).
    pub fn flags(&self, command: &str) -> Vec<String> {
        self.flags_via(command, &self.db_url, &self.amqp_url)
    }

    /// [`Outbox::flags`] with other database and AMQP URLs (e.g. a proxy's).
    pub fn flags_via(&self, command: &str, db_url: &str, amqp_url: &str) -> Vec<String> {
        let (broker, slot, exchange) = match command {
            "setup" | "run" => (true, true, true),
            "poll" | "resync" => (true, false, true),
            "status" | "teardown" => (false, true, false),
            other => panic!("no flags known for the command {other:?}"),
        };
        let flags = [
            ("--database-url", db_url, true),
            ("--amqp-url", amqp_url, broker),
            ("--slot", &self.slot, slot),
            ("--exchange", &self.exchange, exchange),
        ];
        flags
            .iter()
            .filter(|(_, _, taken)| *taken)
            .flat_map(|(flag, value, _)| [flag.to_string(), value.to_string()])
            .collect()
    }

    /// Runs `outbox-relay <args> <flags>` to completion, with the flags of the command
    /// `args` name.
    pub fn run_command(&self, args: &[&str]) -> Output {
        let command = args
            .iter()
            .find(|arg| COMMANDS.contains(arg))
            .unwrap_or_else(|| panic!("{args:?} names no command"));
        Command::new(binary())
            .args(args)
            .args(self.flags(command))
            .env_remove("DATABASE_URL")
            .env_remove("AMQP_URL")
            .output()
            .expect("run outbox-relay")
    }

    /// Starts `outbox-relay <command>` with the flags of [`Outbox::flags_via`], `extra`
    /// ones, and [`TEST_LOG`] plus `env`.
    pub fn spawn(
        &self,
        command: &str,
        urls: (&str, &str),
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> RelayProcess {
        self.spawn_in(None, command, urls, extra, env)
    }

    /// [`Outbox::spawn`] on test host `host` ([`super::netns`]).
    pub fn spawn_on(
        &self,
        host: &Host,
        command: &str,
        urls: (&str, &str),
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> RelayProcess {
        self.spawn_in(Some(host), command, urls, extra, env)
    }

    /// [`Outbox::spawn_on`] serving /metrics and /readyz on a free port of `host`'s address,
    /// which it returns: `outbox-relay <command>` through `amqp_url` (one URL or a broker
    /// list) with `extra` flags.
    pub fn spawn_observed_on(
        &self,
        host: &Host,
        command: &str,
        amqp_url: &str,
        extra: &[&str],
    ) -> (RelayProcess, SocketAddrV4) {
        let at = SocketAddrV4::new(host.addr(), super::free_port());
        let addr = at.to_string();
        let mut args = vec!["--metrics-addr", addr.as_str()];
        args.extend_from_slice(extra);
        let relay = self.spawn_on(host, command, (&self.db_url, amqp_url), &args, &[]);
        (relay, at)
    }

    fn spawn_in(
        &self,
        host: Option<&Host>,
        command: &str,
        (db_url, amqp_url): (&str, &str),
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> RelayProcess {
        let mut args: Vec<String> = vec![command.into()];
        args.extend(self.flags_via(command, db_url, amqp_url));
        args.extend(extra.iter().map(|s| s.to_string()));
        // A relay serves its endpoints on a port of its own (tests count its sessions and
        // reconnects there), unless the test chose an address (or `off`).
        if matches!(command, "run" | "poll") && !extra.contains(&"--metrics-addr") {
            let ip = host.map_or(std::net::Ipv4Addr::LOCALHOST, Host::addr);
            args.push("--metrics-addr".into());
            args.push(SocketAddrV4::new(ip, super::free_port()).to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut vars = vec![TEST_LOG];
        vars.extend_from_slice(env);
        match host {
            Some(host) => RelayProcess::spawn_on(host, &args, &vars),
            None => RelayProcess::spawn(&args, &vars),
        }
    }

    /// Starts `outbox-relay run` with this outbox's flags and `extra` ones.
    pub fn spawn_relay(&self, extra: &[&str]) -> RelayProcess {
        self.spawn_relay_via(&self.db_url, &self.amqp_url, extra)
    }

    /// [`Outbox::spawn_relay`] through other database and AMQP URLs (e.g. a proxy's).
    pub fn spawn_relay_via(&self, db_url: &str, amqp_url: &str, extra: &[&str]) -> RelayProcess {
        self.spawn("run", (db_url, amqp_url), extra, &[])
    }

    /// [`Outbox::spawn_relay`] serving /metrics and /readyz on a free port of its own, which
    /// it returns.
    pub fn spawn_observed(&self, extra: &[&str]) -> (RelayProcess, u16) {
        let port = super::free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut args = vec!["--metrics-addr", addr.as_str()];
        args.extend_from_slice(extra);
        (self.spawn_relay(&args), port)
    }

    /// Starts `outbox-relay poll` with this outbox's flags, `extra` ones and `env`.
    pub fn spawn_poll(&self, extra: &[&str], env: &[(&str, &str)]) -> RelayProcess {
        self.spawn("poll", (&self.db_url, &self.amqp_url), extra, env)
    }

    /// The outbox's database: the last part of its URL.
    pub fn database(&self) -> &str {
        self.db_url.rsplit('/').next().unwrap_or_default()
    }

    pub async fn confirmed_flush(&self) -> u64 {
        slot_confirmed_flush(&self.client, &self.slot).await
    }

    /// Waits until the slot's confirmed_flush_lsn reaches `lsn`; false on timeout.
    pub async fn wait_confirmed_flush(&self, lsn: u64, timeout: Duration) -> bool {
        wait_slot_confirmed_flush(&self.client, &self.slot, lsn, timeout)
            .await
            .is_ok()
    }

    /// Inserts one row in its own transaction; returns its id.
    pub async fn insert(&self, event_type: &str, payload: &str) -> String {
        let row = self
            .client
            .query_one(
                "INSERT INTO outbox (event_type, payload) VALUES ($1, $2::text::jsonb) RETURNING id::text",
                &[&event_type, &payload],
            )
            .await
            .expect("insert");
        row.get(0)
    }

    /// `rows` single-row transactions from `writers` connections; returns the ids.
    pub async fn seed_single_row_transactions(&self, rows: usize, writers: usize) -> Vec<String> {
        write_concurrently(&self.db_url, writers, rows, 1).await
    }
}

/// Waits until `slot`'s confirmed_flush_lsn, on `client`'s server, reaches `lsn`: `Ok` with
/// the position reached, or `Err` with the last one read once `timeout` has passed.
pub async fn wait_slot_confirmed_flush(
    client: &Client,
    slot: &str,
    lsn: u64,
    timeout: Duration,
) -> Result<u64, u64> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let reached = slot_confirmed_flush(client, slot).await;
        if reached >= lsn {
            return Ok(reached);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(reached);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `writers` connections insert `total` rows between them, in transactions of 1 to
/// `max_txn_rows` rows (sizes vary deterministically). Returns every committed id.
pub async fn write_concurrently(
    db_url: &str,
    writers: usize,
    total: usize,
    max_txn_rows: usize,
) -> Vec<String> {
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let share = total / writers + usize::from(writer < total % writers);
        let db_url = db_url.to_string();
        tasks.push(tokio::spawn(async move {
            let mut client = pg_connect(&db_url).await;
            let mut ids = Vec::with_capacity(share);
            let mut seed = writer as u64 * 7919 + 1;
            while ids.len() < share {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let size = (1 + (seed >> 33) as usize % max_txn_rows).min(share - ids.len());
                let txn = client.transaction().await.expect("begin");
                for _ in 0..size {
                    let payload = format!(r#"{{"writer": {writer}, "n": {}}}"#, ids.len());
                    let row = txn
                        .query_one(
                            "INSERT INTO outbox (event_type, payload) VALUES ('TestEvent', $1::text::jsonb) RETURNING id::text",
                            &[&payload],
                        )
                        .await
                        .expect("insert");
                    ids.push(row.get::<_, String>(0));
                }
                txn.commit().await.expect("commit");
            }
            ids
        }));
    }
    let mut all = Vec::with_capacity(total);
    for task in tasks {
        all.extend(task.await.expect("writer task"));
    }
    all
}
