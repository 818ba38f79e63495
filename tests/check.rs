//! `outbox-relay check` against a real PostgreSQL and RabbitMQ: a healthy setup is all ok
//! and exits 0; each broken one gets its finding, with the fix, and the exit code of its
//! worst finding (warnings 5, errors 3). No password and no payload in what it prints.
//!
//! Oracles: what each test broke itself (a dropped publication, a role made without
//! REPLICATION, a server started with other settings), and the exit codes of src/exit.rs.

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use outbox_testkit as common;

use common::outbox::Outbox;
use common::pg::replace_url_database;
use common::relay::binary;
use common::{pg_connect, services, unique_name, PgServer};

/// `check`'s exit code when it found an error, and when it found warnings only.
const ERRORS: i32 = outbox_relay::exit::CONFIG as i32;
const WARNINGS: i32 = outbox_relay::exit::WARNINGS as i32;

/// A server set up as the docs advise: WAL retention bounded, a walsender of a vanished
/// relay ended within 10 s (2 × the default --peer-timeout). Shared by this file's tests.
fn tuned() -> &'static PgServer {
    static TUNED: OnceLock<PgServer> = OnceLock::new();
    TUNED.get_or_init(|| {
        PgServer::start(&[
            ("max_slot_wal_keep_size", "1GB"),
            ("wal_sender_timeout", "10s"),
        ])
    })
}

async fn tuned_outbox(prefix: &str) -> Outbox {
    let pg = tokio::task::block_in_place(tuned);
    let outbox = Outbox::on(&pg.url("postgres"), &services().rabbit.url(), prefix).await;
    outbox
        .client
        .batch_execute(
            "INSERT INTO outbox (event_type, payload) VALUES \
             ('OrderCreated', '{\"card\": \"4111-secret-payload\"}'), \
             ('OrderShipped', '{}'), ('OrderCreated', '{}')",
        )
        .await
        .expect("insert rows");
    outbox
}

/// What `outbox-relay check` said: its exit code and stdout.
struct Checked {
    code: i32,
    out: String,
}

impl Checked {
    /// The finding about `what`: its level and the rest of its line.
    fn finding(&self, what: &str) -> (&str, &str) {
        self.out
            .lines()
            .find_map(|line| {
                let (level, rest) = line.split_once(' ')?;
                let rest = rest.trim_start().strip_prefix(what)?.strip_prefix(": ")?;
                Some((level, rest))
            })
            .unwrap_or_else(|| panic!("no finding about {what:?} in:\n{}", self.out))
    }

    fn assert_finding(&self, what: &str, level: &str, contains: &[&str]) {
        let (found, text) = self.finding(what);
        assert_eq!(found, level, "{what}: {text}\n{}", self.out);
        for part in contains {
            assert!(text.contains(part), "{what}: {part:?} missing in {text}");
        }
    }
}

/// Runs `outbox-relay check <mode…> <flags…>` with no URL from the environment.
fn check(mode: &[&str], flags: &[String]) -> Checked {
    let output = Command::new(binary())
        .arg("check")
        .args(mode)
        .args(flags)
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env_remove("OUTBOX_MODE")
        .output()
        .expect("run outbox-relay check");
    let out = String::from_utf8_lossy(&output.stdout).into_owned();
    println!(
        "{out}{}",
        String::from_utf8_lossy(&output.stderr).trim_end()
    );
    Checked {
        code: output.status.code().unwrap_or(-1),
        out,
    }
}

/// `command`'s flags for `outbox`, with `replaced` flags given other values.
fn flags(outbox: &Outbox, command: &str, replaced: &[(&str, &str)]) -> Vec<String> {
    let mut flags = outbox.flags(command);
    for (flag, value) in replaced {
        match flags.iter().position(|f| f == flag) {
            Some(at) => flags[at + 1] = value.to_string(),
            None => flags.extend([flag.to_string(), value.to_string()]),
        }
    }
    flags
}

async fn wait_slot_active(outbox: &Outbox, active: bool) {
    for _ in 0..200 {
        let row = outbox
            .client
            .query_one(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&outbox.slot],
            )
            .await
            .expect("read the slot");
        if row.get::<_, bool>(0) == active {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the slot never became active = {active}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_setup_is_all_ok_and_exits_0() {
    let outbox = tuned_outbox("chk_ok").await;
    let checked = check(&[], &flags(&outbox, "run", &[]));
    assert_eq!(checked.code, 0, "{}", checked.out);
    for line in checked.out.lines() {
        assert!(line.starts_with("ok "), "not ok: {line}");
    }
    checked.assert_finding("wal_level", "ok", &["logical"]);
    checked.assert_finding("max_slot_wal_keep_size", "ok", &["1GB"]);
    checked.assert_finding("wal_sender_timeout", "ok", &["10s"]);
    checked.assert_finding("role", "ok", &["postgres is a superuser"]);
    let slot = format!("slot {}", outbox.slot);
    checked.assert_finding(&slot, "ok", &["pgoutput", "not active"]);
    checked.assert_finding("publication outbox_pub", "ok", &["and only them"]);
    checked.assert_finding("table outbox", "ok", &["id, event_type, payload"]);
    let exchange = format!("exchange {}", outbox.exchange);
    checked.assert_finding(&exchange, "ok", &["exists"]);
    checked.assert_finding(
        "routing keys",
        "ok",
        &[
            "OrderCreated, OrderShipped in the newest 3 rows",
            "not checked",
        ],
    );
    checked.assert_finding("message size", "ok", &["cannot be read over AMQP 0-9-1"]);
    assert!(
        !checked.out.contains("4111-secret-payload"),
        "a payload printed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_slot_is_fine_and_a_missing_one_is_an_error() {
    let outbox = tuned_outbox("chk_slot").await;
    let slot = format!("slot {}", outbox.slot);
    let relay = outbox.spawn_relay(&[]);
    wait_slot_active(&outbox, true).await;
    let checked = check(&[], &flags(&outbox, "run", &[]));
    assert_eq!(checked.code, 0, "{}", checked.out);
    checked.assert_finding(&slot, "ok", &["active (pid ", "waits as its standby"]);
    checked.assert_finding("WAL senders", "ok", &["one of them the relay's"]);
    drop(relay);
    wait_slot_active(&outbox, false).await;

    outbox
        .client
        .execute("SELECT pg_drop_replication_slot($1)", &[&outbox.slot])
        .await
        .expect("drop the slot");
    let checked = check(&[], &flags(&outbox, "run", &[]));
    assert_eq!(checked.code, ERRORS, "{}", checked.out);
    checked.assert_finding(
        &slot,
        "error",
        &["does not exist", "Fix: run `outbox-relay setup`"],
    );
    checked.assert_finding(
        "replication slots",
        "ok",
        &["free for the slot `setup` creates"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_publication_or_table_is_an_error_with_its_fix() {
    let outbox = tuned_outbox("chk_pub").await;
    outbox
        .client
        .batch_execute("DROP PUBLICATION outbox_pub")
        .await
        .expect("drop the publication");
    let checked = check(&[], &flags(&outbox, "run", &[]));
    assert_eq!(checked.code, ERRORS, "{}", checked.out);
    checked.assert_finding(
        "publication outbox_pub",
        "error",
        &[
            "does not exist",
            "Fix: run `outbox-relay setup`, or CREATE PUBLICATION outbox_pub FOR TABLE outbox \
             WITH (publish = 'insert')",
        ],
    );

    let checked = check(&[], &flags(&outbox, "run", &[("--table", "nosuch")]));
    assert_eq!(checked.code, ERRORS, "{}", checked.out);
    checked.assert_finding(
        "table nosuch",
        "error",
        &["does not exist", "Fix: run `outbox-relay setup`"],
    );
    checked.assert_finding(
        "privileges",
        "ok",
        &["not checked: there is no table nosuch"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_replication_or_grants_gets_the_sql_that_fixes_it() {
    let outbox = tuned_outbox("chk_role").await;
    let role = unique_name("chk_norepl");
    outbox
        .client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD 'pw-never-printed'; \
             GRANT SELECT ON outbox TO {role};"
        ))
        .await
        .expect("create the role");
    let url = outbox
        .db_url
        .replacen("postgres@", &format!("{role}:pw-never-printed@"), 1);
    let checked = check(&[], &flags(&outbox, "run", &[("--database-url", &url)]));
    assert_eq!(checked.code, ERRORS, "{}", checked.out);
    checked.assert_finding(
        "role",
        "error",
        &[
            "REPLICATION",
            &format!("Fix: ALTER ROLE {role} REPLICATION"),
        ],
    );
    checked.assert_finding(
        "privileges",
        "error",
        &[
            &format!("{role} lacks DELETE on outbox"),
            &format!("Fix: GRANT DELETE ON TABLE outbox TO {role};"),
        ],
    );
    assert!(
        !checked.out.contains("pw-never-printed"),
        "a password printed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_logical_wal_is_an_error() {
    let pg = tokio::task::block_in_place(|| PgServer::start(&[("wal_level", "replica")]));
    let admin = pg_connect(&pg.url("postgres")).await;
    let name = unique_name("chk_replica");
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create the database");
    let url = replace_url_database(&pg.url("postgres"), &name);
    let flags = [
        "--database-url",
        &url,
        "--amqp-url",
        &services().rabbit.url(),
    ];
    let checked = check(&[], &flags.map(String::from));
    assert_eq!(checked.code, ERRORS, "{}", checked.out);
    checked.assert_finding(
        "wal_level",
        "error",
        &[
            "wal_level = 'replica'",
            "Fix: ALTER SYSTEM SET wal_level = 'logical'; then restart PostgreSQL",
        ],
    );
}

/// A server as PostgreSQL ships it: nothing broken, two things to fix before production.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_defaults_warn_of_unbounded_wal_and_a_slow_standby_takeover() {
    let pg = tokio::task::block_in_place(|| PgServer::start(&[]));
    let outbox = Outbox::on(&pg.url("postgres"), &services().rabbit.url(), "chk_dflt").await;
    let checked = check(&[], &flags(&outbox, "run", &[]));
    assert_eq!(checked.code, WARNINGS, "{}", checked.out);
    checked.assert_finding(
        "max_slot_wal_keep_size",
        "warn",
        &[
            "-1 (unlimited)",
            "Fix: ALTER SYSTEM SET max_slot_wal_keep_size",
            "outbox_relay_slot_safe_wal_size_bytes",
        ],
    );
    checked.assert_finding(
        "wal_sender_timeout",
        "warn",
        &[
            "1m is over 4 × --peer-timeout (5s)",
            "Fix: ALTER SYSTEM SET wal_sender_timeout",
        ],
    );
    // A longer --peer-timeout accepts the default.
    let mut longer = flags(&outbox, "run", &[]);
    longer.extend(["--peer-timeout".into(), "15s".into()]);
    let checked = check(&[], &longer);
    checked.assert_finding("wal_sender_timeout", "ok", &["1m"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_exchange_and_a_wrong_broker_password_are_errors() {
    let outbox = tuned_outbox("chk_amqp").await;
    let checked = check(
        &[],
        &flags(&outbox, "run", &[("--exchange", "chk_no_such_x")]),
    );
    assert_eq!(checked.code, ERRORS, "{}", checked.out);
    checked.assert_finding(
        "exchange chk_no_such_x",
        "error",
        &[
            "does not exist on the broker",
            "Fix: run `outbox-relay setup`",
        ],
    );

    let wrong = outbox
        .amqp_url
        .replacen("guest:guest@", "guest:wrong-secret@", 1);
    assert_ne!(wrong, outbox.amqp_url, "the kit's broker logs in as guest");
    let checked = check(&[], &flags(&outbox, "run", &[("--amqp-url", &wrong)]));
    assert_eq!(checked.code, ERRORS, "{}", checked.out);
    let node = wrong
        .split_once('@')
        .and_then(|(_, rest)| rest.split('/').next())
        .expect("host:port");
    checked.assert_finding(
        &format!("RabbitMQ {node}"),
        "error",
        &["refused the login", "Fix: correct the user or password"],
    );
    assert!(!checked.out.contains("wrong-secret"), "a password printed");

    // A port nothing listens on: the node is named, with what to check.
    let closed = format!("127.0.0.1:{}", common::free_port());
    let unreachable = wrong.replacen(node, &closed, 1);
    let checked = check(&[], &flags(&outbox, "run", &[("--amqp-url", &unreachable)]));
    assert_eq!(checked.code, ERRORS, "{}", checked.out);
    checked.assert_finding(
        &format!("RabbitMQ {closed}"),
        "error",
        &[
            &format!("Cannot reach RabbitMQ at {closed}"),
            "listens at that address",
        ],
    );

    // A virtual host that does not exist: RabbitMQ's 530 NOT_ALLOWED, named with the fix.
    let (base, _vhost) = outbox
        .amqp_url
        .rsplit_once('/')
        .expect("a vhost in the URL");
    let no_vhost = format!("{base}/chk_no_such_vhost");
    let checked = check(&[], &flags(&outbox, "run", &[("--amqp-url", &no_vhost)]));
    assert_eq!(checked.code, ERRORS, "{}", checked.out);
    checked.assert_finding(
        &format!("RabbitMQ {node}"),
        "error",
        &["refused the login", "chk_no_such_vhost", "the virtual host"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_or_database_postgresql_refuses_is_named_with_its_fix() {
    let outbox = tuned_outbox("chk_refused").await;
    let url = |from: &str, to: &str| {
        let url = outbox.db_url.replacen(from, to, 1);
        assert_ne!(
            url, outbox.db_url,
            "{from} in the kit's URL {}",
            outbox.db_url
        );
        url
    };
    let (user, database) = ("postgres@", format!("/{}", outbox.database()));
    for (wrong, fix) in [
        (url(user, "chk_no_such_role@"), "the role must exist"),
        (url(&database, "/chk_no_such_db"), "create the database"),
    ] {
        let checked = check(&[], &flags(&outbox, "run", &[("--database-url", &wrong)]));
        assert_eq!(checked.code, ERRORS, "{}", checked.out);
        assert!(
            checked
                .out
                .lines()
                .any(|l| l.starts_with("error") && l.contains(fix)),
            "no error line with \"{fix}\":\n{}",
            checked.out
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_mode_checks_the_claim_index() {
    let s = services();
    let outbox = Outbox::on_poll(&s.pg.url("postgres"), &s.rabbit.url(), "chk_poll").await;
    let checked = check(&["--mode", "poll"], &flags(&outbox, "poll", &[]));
    assert_eq!(checked.code, 0, "{}", checked.out);
    checked.assert_finding("table outbox", "ok", &["published_at in \"published_at\""]);
    checked.assert_finding("claim index", "ok", &["partial index"]);
    checked.assert_finding("privileges", "ok", &["SELECT, UPDATE, DELETE on outbox"]);
    assert!(!checked.out.contains("wal_level"), "{}", checked.out);

    outbox
        .client
        .batch_execute("DROP INDEX outbox_unpublished_idx")
        .await
        .expect("drop the claim index");
    let checked = check(&["--mode", "poll"], &flags(&outbox, "poll", &[]));
    assert_eq!(checked.code, WARNINGS, "{}", checked.out);
    checked.assert_finding(
        "claim index",
        "warn",
        &["no partial index", "Fix: `outbox-relay setup --mode poll`"],
    );
}
