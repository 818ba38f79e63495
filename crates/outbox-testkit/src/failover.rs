//! A PostgreSQL primary with a streaming standby, for the failover tests: started
//! of a chosen major version, with failover slots synchronized to the standby on 17+, and
//! what a failover test does to them: promote the standby, wait until its copy of a slot
//! would survive a promotion, name both servers in one multi-host URL, and read the rows that
//! exist on the new primary (the oracle: a COMMIT cut by the crash is ambiguous, so what a
//! writer thinks it committed is not).
//!
//! The writers that keep committing through a failover are [`super::faults::Writers`] (they
//! reconnect after any error, through a multi-host URL or a proxy); the proxy that stands in
//! for a VIP or DNS name is [`super::proxy::TcpProxy::retarget`].
//!
//! [`FailoverPair::start_on`] puts the primary and the standby each on a test host of its
//! own ([`super::netns`], the partition lab's `pg1` and `pg2`), so that a test can make the
//! primary's host vanish ([`super::netns::Network::vanish`]) rather than stop the server: a
//! crash nobody hears of. Stopping the pair needs no network (pg_ctl signals the server and
//! watches its pid file), so it stops and drops while its host is gone.
//!
//! It owns the pair's servers and their replication settings; it must never reach into the
//! relay: it sees the servers as an operator does, through SQL.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::Client;

use lapin::types::FieldTable;

use super::faults::connect_retrying;
use super::netns::Host;
use super::outbox::Outbox;
use super::pg::{parse_lsn, query_value, PgServer};

/// The first major version with failover slots (`failover`, `sync_replication_slots`,
/// `synchronized_standby_slots`).
pub const FIRST_FAILOVER_MAJOR: u32 = 17;

/// The physical slot the standby streams through (its `primary_slot_name`).
pub const STANDBY_SLOT: &str = "standby_1";

/// How a [`FailoverPair`] is set up.
#[derive(Debug, Clone, Copy)]
pub struct PairOptions {
    /// Set `synchronized_standby_slots` to the standby's physical slot on the primary (17+):
    /// logical walsenders of failover slots then send only what the standby has flushed.
    /// Set with `ALTER SYSTEM` after the standby's copy was made, so the standby does not
    /// inherit it (a promoted standby with the setting would wait for a slot it lacks).
    pub synchronized_standby_slots: bool,
}

impl Default for PairOptions {
    fn default() -> Self {
        PairOptions {
            synchronized_standby_slots: true,
        }
    }
}

/// A primary and a streaming standby of one major version. On 17+ the standby synchronizes
/// failover slots (`sync_replication_slots`, `hot_standby_feedback`, `primary_slot_name`, a
/// `dbname` in `primary_conninfo`).
pub struct FailoverPair {
    pub primary: PgServer,
    pub standby: PgServer,
    pub major: u32,
    /// The standby's physical slot on the primary: [`STANDBY_SLOT`].
    pub physical_slot: String,
    options: PairOptions,
}

/// How the old primary comes back after a promotion ([`FailoverPair::rejoin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejoin {
    /// Stopped cleanly (a switchover): it follows the new primary's timeline as it is, once
    /// its stale slots are dropped.
    AsItIs,
    /// Crashed: its WAL may run past the new primary's history, so it is rebuilt from an
    /// online copy of the new primary.
    Rebuilt,
}

/// The settings a standby of `major` runs with: on 17+ it synchronizes the failover slots.
fn standby_settings(major: u32) -> &'static [(&'static str, &'static str)] {
    if major >= FIRST_FAILOVER_MAJOR {
        &[
            ("sync_replication_slots", "on"),
            ("hot_standby_feedback", "on"),
        ]
    } else {
        &[("hot_standby_feedback", "on")]
    }
}

impl FailoverPair {
    /// Starts the pair (blocking, a few seconds: call it through `spawn_blocking` from a
    /// test's runtime). `primary_settings` go into the primary's postgresql.conf before the
    /// copy, so the standby has them too.
    pub fn start(major: u32, options: PairOptions, primary_settings: &[(&str, &str)]) -> Self {
        Self::start_in(None, major, options, primary_settings)
    }

    /// [`Self::start`] with the primary on test host `primary_host` and the standby on
    /// `standby_host` (hosts of one network), each listening on its host's address; the
    /// standby streams from the primary's.
    pub fn start_on(
        (primary_host, standby_host): (&Host, &Host),
        major: u32,
        options: PairOptions,
        primary_settings: &[(&str, &str)],
    ) -> Self {
        let hosts = Some((primary_host, standby_host));
        Self::start_in(hosts, major, options, primary_settings)
    }

    fn start_in(
        hosts: Option<(&Host, &Host)>,
        major: u32,
        options: PairOptions,
        primary_settings: &[(&str, &str)],
    ) -> Self {
        let primary = match hosts {
            Some((host, _)) => PgServer::start_major_on(host, major, primary_settings),
            None => PgServer::start_major(major, primary_settings),
        };
        let settings = standby_settings(major);
        let standby = match hosts {
            Some((_, host)) => PgServer::start_standby_on(host, &primary, STANDBY_SLOT, settings),
            None => PgServer::start_standby_of(&primary, STANDBY_SLOT, settings),
        };
        let pair = FailoverPair {
            primary,
            standby,
            major,
            physical_slot: STANDBY_SLOT.to_string(),
            options,
        };
        if options.synchronized_standby_slots {
            assert!(
                pair.has_failover_slots(),
                "synchronized_standby_slots needs PostgreSQL {FIRST_FAILOVER_MAJOR}+"
            );
            super::pg::block_on(pair.set_synchronized_standby_slots(true));
        }
        pair
    }

    /// Whether the servers have failover slots (17+).
    pub fn has_failover_slots(&self) -> bool {
        self.major >= FIRST_FAILOVER_MAJOR
    }

    /// An outbox in a fresh database of the primary, provisioned by `outbox-relay setup`
    /// once the standby has the database: a failover slot made before the standby replayed
    /// `CREATE DATABASE` stops the standby's slot sync worker with an error ("database …
    /// does not exist"), and the postmaster starts it again only when it next wakes up
    /// (a new connection, or after up to a minute).
    pub async fn outbox(&self, amqp_url: &str, prefix: &str) -> Outbox {
        let name = super::unique_name(prefix);
        let db_url = self.primary.create_database(&name).await;
        self.wait_standby_replayed(Duration::from_secs(60)).await;
        Outbox::provision_in(&db_url, amqp_url, &["setup"], FieldTable::default()).await
    }

    /// Both servers in libpq's multi-host form, primary first:
    /// `postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/db?target_session_attrs=read-write`
    /// (each server's own address where it runs on a test host).
    /// tokio-postgres takes it (the writers), and so does the relay.
    pub fn multi_host_url(&self, db: &str) -> String {
        multi_host_url(&[&self.primary, &self.standby], db)
    }

    /// Sets (or resets) `synchronized_standby_slots` on the primary to the standby's
    /// physical slot, and waits until the server uses the new value.
    pub async fn set_synchronized_standby_slots(&self, on: bool) {
        let client = self.primary.client("postgres").await;
        let sql = if on {
            format!(
                "ALTER SYSTEM SET synchronized_standby_slots = '{}'",
                self.physical_slot
            )
        } else {
            "ALTER SYSTEM RESET synchronized_standby_slots".to_string()
        };
        client.batch_execute(&sql).await.expect(&sql);
        client
            .batch_execute("SELECT pg_reload_conf()")
            .await
            .expect("pg_reload_conf");
        let wanted = if on { self.physical_slot.as_str() } else { "" };
        // A reload is asynchronous: new sessions see it once the postmaster has read it.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let fresh = self.primary.client("postgres").await;
            let value: String = query_value(&fresh, "SHOW synchronized_standby_slots").await;
            if value == wanted {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "synchronized_standby_slots is {value:?}, not {wanted:?}, 10 s after the reload"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Promotes the standby (`pg_promote`, waiting up to 60 s) and returns a client of the new
    /// primary in `db`, once it takes writes.
    pub async fn promote(&self, db: &str) -> Client {
        let standby = self.standby.client("postgres").await;
        let promoted: bool = standby
            .query_one("SELECT pg_promote(true, 60)", &[])
            .await
            .expect("pg_promote")
            .get(0);
        assert!(promoted, "the standby was not promoted within 60 s");
        let client = connect_retrying(&self.standby.url(db), Duration::from_secs(30)).await;
        let in_recovery: bool = query_value(&client, "SELECT pg_is_in_recovery()").await;
        assert!(!in_recovery, "the promoted standby is out of recovery");
        client
    }

    /// Promotes the standby once the primary is down (crashed or stopped), as an HA manager
    /// does, and swaps the roles: the promoted server is `primary` from now on and the old
    /// one `standby`, still down until [`Self::rejoin`]. A client of the new primary in `db`.
    pub async fn fail_over(&mut self, db: &str) -> Client {
        let client = self.promote(db).await;
        std::mem::swap(&mut self.primary, &mut self.standby);
        client
    }

    /// Brings the old primary (`standby` after [`Self::fail_over`], stopped) back as the new
    /// primary's streaming standby on its own host and port, so a multi-host URL naming both
    /// still holds (blocking, seconds: call it through `spawn_blocking` or `block_in_place`).
    /// [`Rejoin::AsItIs`] drops its stale slots as docs/high-availability.md says ("The stale slot
    /// after a switchover"): the slots it had as a primary, unsynced, would block the
    /// synchronization of the new primary's slots of the same names. Once it streams,
    /// `synchronized_standby_slots` is set on the new primary (if the pair's options say so),
    /// and it waits until the standby's copy of `slot` is ready for the next failover. How
    /// long all of that took; `Err` after `timeout` naming what it waited for.
    pub fn rejoin(&self, how: Rejoin, slot: &str, timeout: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        let settings = standby_settings(self.major);
        match how {
            Rejoin::AsItIs => {
                self.standby
                    .restart_as_standby_of(&self.primary, &self.physical_slot, settings);
                super::pg::block_on(async {
                    let client = self.standby.client("postgres").await;
                    client
                        .batch_execute(
                            "SELECT pg_drop_replication_slot(slot_name) FROM \
                             pg_replication_slots WHERE NOT synced AND NOT active",
                        )
                        .await
                        .expect("drop the old primary's stale slots");
                });
            }
            Rejoin::Rebuilt => {
                self.standby
                    .rebuild_as_standby_of(&self.primary, &self.physical_slot, settings)
            }
        }
        super::pg::block_on(async {
            self.wait_streaming(timeout.saturating_sub(started.elapsed()))
                .await?;
            if self.options.synchronized_standby_slots {
                self.set_synchronized_standby_slots(true).await;
            }
            self.wait_failover_ready(slot, timeout.saturating_sub(started.elapsed()))
                .await?;
            // A server promoted before keeps its slots flagged `synced`: the one the relays
            // used on it stays as its copy and is ready at once. Ready here also means at or
            // past the primary's slot, whichever way the copy came.
            let primary = self.primary.client("postgres").await;
            let target = super::pg::slot_confirmed_flush(&primary, slot).await;
            self.wait_copy_reaches(slot, target, timeout.saturating_sub(started.elapsed()))
                .await?;
            Ok(started.elapsed())
        })
    }

    /// Waits until the standby's copy of `slot` is ready and its `confirmed_flush_lsn` is at
    /// or past `target`.
    async fn wait_copy_reaches(
        &self,
        slot: &str,
        target: u64,
        timeout: Duration,
    ) -> Result<(), String> {
        let started = Instant::now();
        let client = self.standby.client("postgres").await;
        loop {
            let state = standby_copy(&client, slot).await;
            let reached = state
                .as_ref()
                .is_some_and(|c| c.is_ready() && c.confirmed_flush.is_some_and(|at| at >= target));
            if reached {
                return Ok(());
            }
            if started.elapsed() >= timeout {
                return Err(format!(
                    "the standby's copy of slot {slot} has not reached the primary's \
                     {target:X} after {timeout:?}: {state:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the primary sees its standby's walreceiver streaming through the physical
    /// slot.
    async fn wait_streaming(&self, timeout: Duration) -> Result<(), String> {
        let started = Instant::now();
        let primary = self.primary.client("postgres").await;
        loop {
            let streaming: bool = primary
                .query_one(
                    "SELECT EXISTS (SELECT FROM pg_replication_slots s JOIN \
                     pg_stat_replication r ON r.pid = s.active_pid \
                     WHERE s.slot_name = $1 AND r.state = 'streaming')",
                    &[&self.physical_slot],
                )
                .await
                .expect("read pg_stat_replication")
                .get(0);
            if streaming {
                return Ok(());
            }
            if started.elapsed() >= timeout {
                return Err(format!(
                    "the rejoined standby does not stream through {} after {timeout:?}; its \
                     log (tail):\n{}",
                    self.physical_slot,
                    super::tail_file(&self.standby.log_path(), 40)
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the standby's copy of logical slot `slot` is ready for a failover
    /// (`synced AND NOT temporary AND invalidation_reason IS NULL`), as the standby's own
    /// slot sync worker makes it; how long that took. `Err` names the copy's last state.
    pub async fn wait_failover_ready(
        &self,
        slot: &str,
        timeout: Duration,
    ) -> Result<Duration, String> {
        let started = Instant::now();
        let client = self.standby.client("postgres").await;
        loop {
            let state = standby_copy(&client, slot).await;
            if state.as_ref().is_some_and(SyncedCopy::is_ready) {
                return Ok(started.elapsed());
            }
            if started.elapsed() >= timeout {
                return Err(format!(
                    "the standby's copy of slot {slot} is not ready for a failover after \
                     {timeout:?}: {state:?}; the standby's log (tail):\n{}",
                    super::tail_file(&self.standby.log_path(), 40)
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The standby's copy of `slot`, if it has one.
    pub async fn standby_copy(&self, slot: &str) -> Option<SyncedCopy> {
        standby_copy(&self.standby.client("postgres").await, slot).await
    }

    /// Waits until the standby has replayed everything the primary wrote so far (e.g. a
    /// `CREATE DATABASE`, before connecting to the database there); panics after `timeout`.
    pub async fn wait_standby_replayed(&self, timeout: Duration) {
        let primary = self.primary.client("postgres").await;
        let target = super::pg::current_wal_lsn(&primary).await;
        let standby = self.standby.client("postgres").await;
        let deadline = Instant::now() + timeout;
        loop {
            let replayed: String =
                query_value(&standby, "SELECT pg_last_wal_replay_lsn()::text").await;
            if parse_lsn(&replayed) >= target {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the standby replayed up to {replayed}, not {}, in {timeout:?}",
                super::pg::format_lsn(target)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What the standby has flushed, as the primary knows it: the `restart_lsn` of its
    /// physical slot (what `synchronized_standby_slots` waits on). `None` before it reported.
    pub async fn standby_flushed(&self, primary: &Client) -> Option<u64> {
        let row = primary
            .query_one(
                "SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.physical_slot],
            )
            .await
            .expect("read the physical slot");
        row.get::<_, Option<&str>>(0).map(parse_lsn)
    }
}

/// `servers` in libpq's multi-host form, in that order, asking for the read-write one.
pub fn multi_host_url(servers: &[&PgServer], db: &str) -> String {
    let hosts: Vec<String> = servers
        .iter()
        .map(|server| format!("{}:{}", server.addr(), server.port()))
        .collect();
    format!(
        "postgres://postgres@{}/{db}?target_session_attrs=read-write",
        hosts.join(",")
    )
}

/// A standby's copy of a failover slot, as `pg_replication_slots` there shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncedCopy {
    pub synced: bool,
    pub temporary: bool,
    pub invalidation_reason: Option<String>,
    pub confirmed_flush: Option<u64>,
}

impl SyncedCopy {
    /// What a promotion keeps: synced, persistent, valid.
    pub fn is_ready(&self) -> bool {
        self.synced && !self.temporary && self.invalidation_reason.is_none()
    }
}

async fn standby_copy(client: &Client, slot: &str) -> Option<SyncedCopy> {
    let row = client
        .query_opt(
            "SELECT synced, temporary, invalidation_reason, confirmed_flush_lsn::text \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("read the standby's pg_replication_slots (17+)")?;
    Some(SyncedCopy {
        synced: row.get(0),
        temporary: row.get(1),
        invalidation_reason: row.get(2),
        confirmed_flush: row.get::<_, Option<&str>>(3).map(parse_lsn),
    })
}

/// Creates a `test_decoding` slot on the standby itself, in database `db` (16+: logical
/// decoding on a standby): the commit-order oracle of a failover test. It decodes what the
/// standby has, which after the promotion is exactly the new primary's history, and it is an
/// ordinary slot of the standby, so the promotion keeps it: the ACK check reads from it where
/// each surviving transaction ends. (A failover slot made on the primary would not do: its
/// synced copy stays temporary while nobody consumes the original.) Create it before the
/// rows it must see are written: it sees the transactions that commit after it.
pub async fn create_standby_oracle(pair: &FailoverPair, db: &str, slot: &str) {
    pair.wait_standby_replayed(Duration::from_secs(60)).await;
    let standby = pair.standby.client(db).await;
    let primary = pair.primary.client("postgres").await;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&slot];
    let create = standby.execute(
        "SELECT pg_create_logical_replication_slot($1, 'test_decoding')",
        &params,
    );
    tokio::pin!(create);
    // The slot waits for a running-transactions record to find its start; the primary logs
    // one only every 15 s unless asked.
    let created = loop {
        tokio::select! {
            created = &mut create => break created,
            () = tokio::time::sleep(Duration::from_millis(100)) => {
                primary
                    .batch_execute("SELECT pg_log_standby_snapshot()")
                    .await
                    .expect("pg_log_standby_snapshot");
            }
        }
    };
    created.unwrap_or_else(|e| panic!("create the oracle slot {slot} on the standby: {e:?}"));
}

/// The ids of every row of the outbox table `client` sees: on the new primary, the rows that
/// survived the failover.
pub async fn outbox_ids(client: &Client) -> Vec<String> {
    super::pg::first_column(client, "SELECT id::text FROM outbox", &[]).await
}

/// Commits `rows` rows in transactions of `txn_rows` rows on one connection, with
/// `synchronous_commit = off` (the backlog is committed long before any fault, and the WAL
/// writer flushes it within 200 ms): a backlog for the relay to drain at full speed.
pub async fn seed_backlog(client: &Client, rows: usize, txn_rows: usize) {
    let mut script = String::from("SET synchronous_commit = off;");
    let mut written = 0;
    while written < rows {
        let n = txn_rows.min(rows - written);
        // Each BEGIN … COMMIT in a simple query is a transaction of its own.
        script += &format!(
            "BEGIN; INSERT INTO outbox (event_type, payload) \
             SELECT 'Backlog', jsonb_build_object('g', g) FROM generate_series(1, {n}) AS g; \
             COMMIT;"
        );
        written += n;
    }
    script += "SET synchronous_commit = on;";
    client
        .batch_execute(&script)
        .await
        .expect("seed the backlog");
}
