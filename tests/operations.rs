//! Operating the relay, against a real PostgreSQL and RabbitMQ: the HTTP endpoints and the
//! slot metrics, `status`, `teardown`, `resync`, the cleanup job, the least-privilege role
//! and what the logs must never contain.
//!
//! Oracles come from outside the relay: `pg_replication_slots` read by the test itself, the
//! queue's contents, the table's rows, and `EXPLAIN`.

use outbox_relay::metrics::{
    BUILD_INFO, MESSAGES_CONFIRMED_TOTAL, MODE_LABEL, READY, SLOT_ACTIVE, SLOT_WAL_STATUS,
    STATUS_LABEL, VERSION_LABEL,
};
use outbox_testkit as common;
use outbox_testkit::output_text as text;

use std::collections::BTreeSet;
use std::process::Output;
use std::time::{Duration, SystemTime};

use common::faults::{scrape_slot_gauges, settled, Upto};
use common::http::{http_get, metric_value, wait_http, wait_metrics};
use common::outbox::Outbox;
use common::pg::{first_column, psql};
use common::{
    declare_bound_queue, free_port, pg_connect, services, unique_name, Consumer, RelayProcess,
};
use outbox_relay::internals::OutboxNames;
use tokio_postgres::Client;

/// `status`'s exit code for a missing or lost slot.
const UNHEALTHY: i32 = outbox_relay::exit::UNHEALTHY as i32;

// ---------------------------------------------------------------------------------------
// helpers

async fn active_pid(client: &Client, slot: &str) -> Option<i32> {
    client
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("read pg_replication_slots")
        .and_then(|row| row.get(0))
}

async fn slot_exists(client: &Client, slot: &str) -> bool {
    client
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("read pg_replication_slots")
        .is_some()
}

async fn publication_exists(client: &Client, publication: &str) -> bool {
    client
        .query_opt(
            "SELECT 1 FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .expect("read pg_publication")
        .is_some()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Waits until `f` is true; false after `timeout`.
async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn names(outbox: &Outbox) -> OutboxNames {
    OutboxNames {
        table: "outbox".into(),
        publication: "outbox_pub".into(),
        slot: outbox.slot.clone().into(),
        exchange: outbox.exchange.clone().into(),
    }
}

// ---------------------------------------------------------------------------------------
// endpoints, metrics and status

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_serve_health_readiness_and_slot_lag_that_matches_postgres() {
    let outbox = Outbox::new("ops_http").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let relay = outbox.spawn_relay(&["--metrics-addr", &addr, "--slot-poll-interval", "200ms"]);

    let healthz = wait_http(port, "/healthz", Duration::from_secs(30), |a| a.0 == 200).await;
    assert_eq!(healthz, Some((200, "ok\n".into())), "log:\n{}", relay.log());

    let id = outbox.insert("OpsEvent", r#"{"n": 1}"#).await;
    let received = consumer.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(received.len(), 1, "the row is delivered");
    assert_eq!(received[0].message_id.as_deref(), Some(id.as_str()));

    let ready = wait_http(port, "/readyz", Duration::from_secs(30), |a| a.0 == 200).await;
    assert_eq!(
        ready,
        Some((200, "ready\n".into())),
        "streaming with the broker channel open; log:\n{}",
        relay.log()
    );
    let (status, _) = http_get(port, "/nothing").await.expect("answer");
    assert_eq!(status, 404);

    // Every metric is described once, with its type.
    let (status, metrics) = http_get(port, "/metrics").await.expect("metrics");
    assert_eq!(status, 200);
    for line in [
        "# TYPE outbox_relay_slot_lag_bytes gauge",
        "# TYPE outbox_relay_slot_retained_wal_bytes gauge",
        "# TYPE outbox_relay_slot_safe_wal_size_bytes gauge",
        "# TYPE outbox_relay_messages_published_total counter",
        "# TYPE outbox_relay_cleanup_deleted_rows_total counter",
        "# HELP outbox_relay_slot_lag_bytes ",
    ] {
        assert!(metrics.contains(line), "{line:?} missing in:\n{metrics}");
    }
    assert_eq!(metric_value(&metrics, READY), Some(1.0));

    // Slot lag and retained WAL match pg_replication_slots read around the same poll.
    for _ in 0..3 {
        // Make the values move between rounds.
        outbox.insert("OpsEvent", r#"{"n": 2}"#).await;
        let scraped = scrape_slot_gauges(&outbox.client, &outbox.slot, port)
            .await
            .metrics;
        // This poll started while the relay was streaming.
        assert_eq!(
            metric_value(
                &scraped,
                &common::http::series(SLOT_WAL_STATUS, &[(STATUS_LABEL, "reserved")])
            ),
            Some(1.0),
            "{scraped}"
        );
        assert_eq!(
            metric_value(
                &scraped,
                &common::http::series(SLOT_WAL_STATUS, &[(STATUS_LABEL, "lost")])
            ),
            Some(0.0)
        );
        assert_eq!(metric_value(&scraped, SLOT_ACTIVE), Some(1.0));
    }

    // `status` reads the same slot and asks this relay whether it is stuck.
    let pid = active_pid(&outbox.client, &outbox.slot)
        .await
        .expect("the relay holds the slot");
    let out = outbox.run_command(&["status", "--metrics-addr", &addr]);
    let table = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    println!("{table}");
    for expected in [
        format!("slot                 {}\n", outbox.slot),
        format!("active pid           {pid}\n"),
        "wal_status           reserved\n".to_string(),
        format!("relay                ready (/readyz at {addr})\n"),
        "stuck message        none\n".to_string(),
        "outbox rows          4 in outbox\n".to_string(),
    ] {
        assert!(
            table.contains(&expected),
            "{expected:?} missing in:\n{table}"
        );
    }
    for field in [
        "lag  ",
        "retained WAL",
        "safe_wal_size",
        "confirmed_flush_lsn",
        "restart_lsn",
        "oldest row age",
    ] {
        assert!(table.contains(field), "{field:?} missing in:\n{table}");
    }
    let out = outbox.run_command(&["status", "--json", "--metrics-addr", &addr]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("status --json");
    assert_eq!(json["slot_state"], "ok");
    assert_eq!(json["active_pid"], pid);
    assert_eq!(json["outbox_rows"], 4);
    assert_eq!(json["stuck_message_known"], true);
    assert_eq!(json["stuck_message_id"], serde_json::Value::Null);
    assert!(
        json["lag_bytes"].as_i64().is_some_and(|lag| lag >= 0),
        "lag_bytes is a count of bytes: {}",
        json["lag_bytes"]
    );

    relay.sigterm();
    assert!(
        relay.wait_exit(Duration::from_secs(30)).await.is_some(),
        "the relay stops on SIGTERM"
    );
    // With no relay answering, the stuck message is unknown, not "none".
    let out = outbox.run_command(&["status", "--json", "--metrics-addr", &addr]);
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("status --json");
    assert_eq!(json["stuck_message_known"], false, "{json}");
    assert_eq!(json["active_pid"], serde_json::Value::Null);
}

/// The exit codes tell a typo, a configuration to fix and an unhealthy slot apart
/// (docs/operations.md, "Exit codes"), and a closed stdout costs the report, not the code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_tell_a_typo_a_configuration_and_an_unhealthy_slot_apart() {
    use outbox_relay::exit;
    let usage = std::process::Command::new(common::relay::binary())
        .args(["run", "--no-such-flag"])
        .output()
        .expect("run outbox-relay");
    assert_eq!(
        usage.status.code(),
        Some(i32::from(exit::USAGE)),
        "{}",
        text(&usage)
    );

    let outbox = Outbox::new("ops_exit_codes").await;
    let crossed = outbox.run_command(&[
        "poll",
        "--poll-interval-min",
        "5s",
        "--poll-interval-max",
        "1s",
        "--metrics-addr",
        "off",
    ]);
    assert_eq!(
        crossed.status.code(),
        Some(i32::from(exit::CONFIG)),
        "{}",
        text(&crossed)
    );
    assert!(
        text(&crossed).contains("--poll-interval-min 5s is above --poll-interval-max 1s"),
        "{}",
        text(&crossed)
    );

    outbox
        .client
        .execute("SELECT pg_drop_replication_slot($1)", &[&outbox.slot])
        .await
        .expect("drop the slot");
    // A pipe whose reader is gone before the command starts: every write to stdout fails.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let probe = std::process::Command::new(common::relay::binary())
        .arg("status")
        .args(outbox.flags("status"))
        .args(["--metrics-addr", "off"])
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .stdout(writer)
        .output()
        .expect("run outbox-relay status");
    assert_eq!(
        probe.status.code(),
        Some(UNHEALTHY),
        "status with stdout closed; stderr: {}",
        String::from_utf8_lossy(&probe.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_exits_unhealthy_when_the_slot_is_missing() {
    let outbox = Outbox::new("ops_missing").await;
    outbox
        .client
        .execute("SELECT pg_drop_replication_slot($1)", &[&outbox.slot])
        .await
        .expect("drop the slot");
    let out = outbox.run_command(&["status", "--metrics-addr", "off"]);
    assert_eq!(out.status.code(), Some(UNHEALTHY), "{}", text(&out));
    assert!(
        stdout(&out).contains("MISSING: run `outbox-relay setup`"),
        "{}",
        text(&out)
    );
    let out = outbox.run_command(&["status", "--json", "--metrics-addr", "off"]);
    assert_eq!(out.status.code(), Some(UNHEALTHY), "{}", text(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("status --json");
    assert_eq!(json["slot_state"], "missing");
}

/// Both relays export which build runs in which mode, and the standard process metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_build_info_and_process_metrics_in_both_modes() {
    let s = services();
    let wal = Outbox::new("ops_build_run").await;
    let poll = Outbox::on_poll(&s.pg.url("postgres"), &s.rabbit.url(), "ops_build_poll").await;
    for (mode, outbox) in [("run", &wal), ("poll", &poll)] {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let relay = if mode == "run" {
            outbox.spawn_relay(&["--metrics-addr", &addr])
        } else {
            outbox.spawn_poll(&["--metrics-addr", &addr], &[])
        };
        let build_info = common::http::series(
            BUILD_INFO,
            &[
                (VERSION_LABEL, env!("CARGO_PKG_VERSION")),
                (MODE_LABEL, mode),
            ],
        );
        let metrics = wait_metrics(port, Duration::from_secs(30), |m| {
            metric_value(m, &build_info).is_some()
        })
        .await;
        assert_eq!(
            metric_value(&metrics, &build_info),
            Some(1.0),
            "{mode}: {build_info} in:\n{metrics}\nlog:\n{}",
            relay.log()
        );
        assert_eq!(
            metrics.matches(&format!("{BUILD_INFO}{{")).count(),
            1,
            "{mode}: one build_info series"
        );
        let rss = metric_value(&metrics, "process_resident_memory_bytes");
        assert!(rss.is_some_and(|b| b > 0.0), "{mode}: rss {rss:?}");
        for series in [
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                metric_value(&metrics, series).is_some(),
                "{mode}: {series} missing in:\n{metrics}"
            );
        }
        for line in [
            "# TYPE process_cpu_seconds_total counter",
            "# TYPE process_resident_memory_bytes gauge",
            "# TYPE outbox_relay_build_info gauge",
        ] {
            assert!(metrics.contains(line), "{mode}: {line:?} missing");
        }
        relay.stop().await;
    }
}

/// The `outbox_relay_*` families of a scrape, from its `# TYPE` lines.
fn scraped_families(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter(|name| name.starts_with("outbox_relay_"))
        .map(str::to_string)
        .collect()
}

/// What docs/metrics.md's "Metrics" table says each mode exports: the `outbox_relay_`
/// families of every row whose "modes" column names `mode` (labels such as `{cause}`
/// stripped), and those of them it marks as appearing only with their first event.
fn documented_families(mode: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md");
    let doc = std::fs::read_to_string(path).expect("read docs/metrics.md");
    let section = doc
        .split("\n## Metrics\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("a Metrics section");
    let (mut all, mut on_event) = (BTreeSet::new(), BTreeSet::new());
    for row in section.lines().filter(|line| line.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (names, modes, meaning) = (cells[1], cells[3], cells[4]);
        if !modes.split(", ").any(|m| m == mode) {
            continue;
        }
        for name in names.split('`').skip(1).step_by(2) {
            let name = name.split('{').next().expect("a name");
            if name.starts_with("process_") {
                continue;
            }
            let family = format!("outbox_relay_{name}");
            if meaning.contains("appears with the first") {
                on_event.insert(family.clone());
            }
            all.insert(family);
        }
    }
    assert!(all.len() > 10, "{mode}: too few metrics parsed from {path}");
    (all, on_event)
}

/// docs/metrics.md lists the metrics each mode exports: a running `run` and a running
/// `poll` relay, once a row is delivered and the slot or backlog has been read, export
/// exactly those (the ones documented as appearing with their first event may be missing;
/// here, only a reconnect's cause is such an event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_each_mode_exports_are_the_documented_ones() {
    let s = services();
    let wal = Outbox::new("ops_doc_run").await;
    let poll = Outbox::on_poll(&s.pg.url("postgres"), &s.rabbit.url(), "ops_doc_poll").await;
    for (mode, outbox) in [("run", &wal), ("poll", &poll)] {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let relay = if mode == "run" {
            outbox.spawn_relay(&["--metrics-addr", &addr, "--slot-poll-interval", "200ms"])
        } else {
            let flags = ["--metrics-addr", &addr, "--backlog-poll-interval", "200ms"];
            outbox.spawn_poll(&flags, &[])
        };
        outbox.insert("Documented.metrics", "{}").await;
        let (documented, on_event) = documented_families(mode);
        let required: BTreeSet<String> = documented.difference(&on_event).cloned().collect();
        let metrics = wait_metrics(port, Duration::from_secs(30), |m| {
            let scraped = scraped_families(m);
            required.is_subset(&scraped) && metric_value(m, MESSAGES_CONFIRMED_TOTAL) == Some(1.0)
        })
        .await;
        let scraped = scraped_families(&metrics);
        let missing: Vec<_> = required.difference(&scraped).collect();
        let undocumented: Vec<_> = scraped.difference(&documented).collect();
        assert!(
            missing.is_empty() && undocumented.is_empty(),
            "{mode}: documented but not exported: {missing:?}; exported but not documented \
             for {mode}: {undocumented:?}\n{metrics}\nlog:\n{}",
            relay.log()
        );
        relay.stop().await;
    }
}

/// A definite startup error is reported once, as a record in the chosen log format: a second
/// plain `error:` line would break a JSON log stream. The exit code stays 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_startup_error_is_reported_once_in_the_log_format() {
    let outbox = Outbox::new("ops_once").await;
    outbox
        .client
        .batch_execute("DROP PUBLICATION outbox_pub")
        .await
        .expect("drop publication");
    let error = "The publication \"outbox_pub\" does not exist";

    let out = outbox.run_command(&["run", "--metrics-addr", "off"]);
    assert_eq!(
        out.status.code(),
        Some(i32::from(outbox_relay::exit::CONFIG)),
        "{}",
        text(&out)
    );
    let all = text(&out);
    let naming: Vec<&str> = all.lines().filter(|l| l.contains(error)).collect();
    assert_eq!(naming.len(), 1, "one line names the error:\n{all}");
    assert!(
        common::relay::final_error(naming[0]).is_some_and(|e| e.starts_with(error)),
        "it is the log record: {}",
        naming[0]
    );

    let out = outbox.run_command(&["--log-format", "json", "run", "--metrics-addr", "off"]);
    assert_eq!(
        out.status.code(),
        Some(i32::from(outbox_relay::exit::CONFIG)),
        "{}",
        text(&out)
    );
    let records: Vec<serde_json::Value> = text(&out)
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}\n{}", text(&out)))
        })
        .collect();
    let errors: Vec<&serde_json::Value> = records
        .iter()
        .filter(|r| {
            r["fields"]["error"]
                .as_str()
                .is_some_and(|e| e.contains(error))
        })
        .collect();
    assert_eq!(errors.len(), 1, "one record names the error: {records:?}");
    assert_eq!(errors[0]["level"], "ERROR");
    assert_eq!(errors[0]["fields"]["message"], "stopped");
}

/// A one-shot setup started together with its database (docker compose) retries its first
/// connection for --connect-timeout, then stops with the connection error. A private server:
/// the test stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_retries_its_first_connection_for_connect_timeout() {
    let pg = tokio::task::spawn_blocking(|| common::PgServer::start(&[]))
        .await
        .expect("start postgres");
    let name = unique_name("ops_connect");
    let url = pg.url("postgres");
    let amqp = services().rabbit.url();
    let args = [
        "setup",
        "--database-url",
        &url,
        "--amqp-url",
        &amqp,
        "--slot",
        &name,
        "--exchange",
        &name,
    ];
    tokio::task::block_in_place(|| pg.stop());
    let retrying = "cannot connect to PostgreSQL yet; retrying";

    // Nothing listens for longer than the timeout: the connection error, after retries.
    let gave_up = RelayProcess::spawn(&args, &[("OUTBOX_CONNECT_TIMEOUT", "1")]);
    let status = gave_up.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{}", gave_up.log());
    assert!(gave_up.log_count(retrying) >= 1, "{}", gave_up.log());
    let log = gave_up.log();
    let error = common::relay::final_error(&log);
    assert!(
        error.is_some_and(|e| e.starts_with("Cannot reach PostgreSQL at 127.0.0.1:")),
        "{log}"
    );

    // The server comes up within the timeout: setup goes on and provisions everything.
    let setup = RelayProcess::spawn(&args, &[("OUTBOX_CONNECT_TIMEOUT", "120")]);
    assert!(
        setup.wait_for_log(retrying, Duration::from_secs(30)).await,
        "{}",
        setup.log()
    );
    tokio::task::block_in_place(|| pg.start_again());
    let status = setup.wait_exit(Duration::from_secs(60)).await;
    assert!(status.is_some_and(|s| s.success()), "{}", setup.log());
    assert!(setup.log().contains("setup complete"), "{}", setup.log());
    assert!(
        slot_exists(&pg.client("postgres").await, &name).await,
        "setup made the slot {name} once the server came up; log:\n{}",
        setup.log()
    );
}

/// A slot invalidated by max_slot_wal_keep_size needs a server of its own: the setting is
/// server-wide and would invalidate the other tests' slots. `status` and the relay's stop
/// message name the invalidation reason: the server's own on 17+ (checked against its
/// catalog), what a lost slot means on 15 and 16.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_exits_unhealthy_when_the_slot_is_lost() {
    if !common::own_postgres("it invalidates a slot, server-wide settings") {
        return;
    }
    let pg = common::PgServer::start(&[("max_slot_wal_keep_size", "1MB")]);
    let db_url = pg.create_database(&unique_name("ops_lost")).await;
    let client = pg_connect(&db_url).await;
    let slot = unique_name("lost_slot");
    client
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await
        .expect("create slot");
    client
        .batch_execute("CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), event_type text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())")
        .await
        .expect("create table");
    // Write WAL past the limit and checkpoint until the slot is invalidated.
    let lost = eventually(Duration::from_secs(60), || async {
        client
            .batch_execute(
                "INSERT INTO outbox (event_type) SELECT 'x' FROM generate_series(1, 20000); \
                 SELECT pg_switch_wal(); CHECKPOINT;",
            )
            .await
            .expect("write WAL");
        let status: Option<String> = client
            .query_one(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .expect("wal_status")
            .get(0);
        status.as_deref() == Some("lost")
    })
    .await;
    assert!(lost, "the slot is invalidated");

    let out = std::process::Command::new(common::relay::binary())
        .args(["status", "--database-url", &db_url, "--slot", &slot])
        .args(["--metrics-addr", "off"])
        .output()
        .expect("run status");
    assert_eq!(out.status.code(), Some(UNHEALTHY), "{}", text(&out));
    let table = stdout(&out);
    println!("{table}");
    assert!(table.contains("LOST"), "{table}");
    assert!(table.contains("wal_status           lost"), "{table}");

    // The reason, as the server itself gives it where it can.
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .expect("server version")
        .get(0);
    let catalog_reason: Option<String> = if version >= 170000 {
        client
            .query_one(
                "SELECT invalidation_reason FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .expect("invalidation_reason")
            .get(0)
    } else {
        None
    };
    println!("server {version}: invalidation_reason {catalog_reason:?}");
    let reason = catalog_reason.unwrap_or_else(|| "wal_removed".into());
    assert_eq!(reason, "wal_removed", "max_slot_wal_keep_size removes WAL");
    assert!(
        table.contains(&format!("LOST (invalidated: {reason})")),
        "{table}"
    );
    let json = std::process::Command::new(common::relay::binary())
        .args([
            "status",
            "--json",
            "--database-url",
            &db_url,
            "--slot",
            &slot,
        ])
        .args(["--metrics-addr", "off"])
        .output()
        .expect("run status --json");
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("status JSON");
    assert_eq!(json["invalidation_reason"], reason.as_str(), "{json}");
    if version >= 170000 {
        assert_eq!(json["failover"], false, "17+ reports the column: {json}");
        assert!(table.contains("failover slot        no"), "{table}");
    } else {
        assert!(
            json["failover"].is_null(),
            "no such column before 17: {json}"
        );
    }

    // The relay refuses the slot, naming the reason and what to do.
    client
        .batch_execute("CREATE PUBLICATION lost_pub FOR TABLE outbox WITH (publish = 'insert')")
        .await
        .expect("publication");
    let run = std::process::Command::new(common::relay::binary())
        .args(["run", "--database-url", &db_url, "--slot", &slot])
        .args(["--publication", "lost_pub", "--metrics-addr", "off"])
        .args(["--amqp-url", &common::services().rabbit.url()])
        .output()
        .expect("run the relay");
    assert_eq!(run.status.code(), Some(1), "{}", text(&run));
    let stopped = text(&run);
    assert!(stopped.contains("was invalidated"), "{stopped}");
    assert!(stopped.contains(&format!("({reason}:")), "{stopped}");
    assert!(
        stopped.contains("max_slot_wal_keep_size"),
        "the fix: {stopped}"
    );
}

// ---------------------------------------------------------------------------------------
// teardown and resync

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_asks_for_yes_and_refuses_while_a_relay_streams() {
    let outbox = Outbox::new("ops_teardown").await;

    let out = outbox.run_command(&["teardown"]);
    assert!(
        !out.status.success(),
        "teardown without --yes must refuse: {}",
        text(&out)
    );
    assert!(
        text(&out).contains("an abandoned slot pins WAL"),
        "explains why: {}",
        text(&out)
    );
    assert!(
        slot_exists(&outbox.client, &outbox.slot).await,
        "teardown without --yes left the slot {}",
        outbox.slot
    );

    let relay = outbox.spawn_relay(&["--metrics-addr", "off"]);
    assert!(
        eventually(Duration::from_secs(30), || async {
            active_pid(&outbox.client, &outbox.slot).await.is_some()
        })
        .await,
        "the relay streams; log:\n{}",
        relay.log()
    );
    let pid = active_pid(&outbox.client, &outbox.slot).await.expect("pid");
    let out = outbox.run_command(&["teardown", "--yes"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("in use by process {pid}")),
        "names the pid: {}",
        text(&out)
    );
    assert!(
        slot_exists(&outbox.client, &outbox.slot).await,
        "a refused teardown left the slot {}",
        outbox.slot
    );

    relay.sigterm();
    assert!(
        relay.wait_exit(Duration::from_secs(30)).await.is_some(),
        "the relay stops on SIGTERM; log:\n{}",
        relay.log()
    );
    let out = outbox.run_command(&["teardown", "--yes"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !slot_exists(&outbox.client, &outbox.slot).await,
        "teardown --yes dropped the slot {}: {}",
        outbox.slot,
        text(&out)
    );
    assert!(
        !publication_exists(&outbox.client, "outbox_pub").await,
        "teardown --yes dropped outbox_pub: {}",
        text(&out)
    );
    // Again: nothing left to drop is not an error.
    let out = outbox.run_command(&["teardown", "--yes"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("does not exist"), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resync_republishes_exactly_the_rows_from_that_time_on() {
    let outbox = Outbox::new("ops_resync").await;
    // No slot: rows inserted now are in no slot, ever.
    let out = outbox.run_command(&["teardown", "--yes"]);
    assert!(out.status.success(), "{}", text(&out));

    let mut before = Vec::new();
    for n in 0..3 {
        before.push(outbox.insert("Before", &format!(r#"{{"n": {n}}}"#)).await);
    }
    let now = "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', \
               'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')";
    let since: String = common::pg::query_value(&outbox.client, now).await;
    let mut after = Vec::new();
    for n in 0..5 {
        after.push(outbox.insert("After", &format!(r#"{{"n": {n}}}"#)).await);
    }
    // One transaction of two rows: same created_at.
    {
        let mut client = pg_connect(&outbox.db_url).await;
        let txn = client.transaction().await.expect("begin");
        for n in 5..7 {
            let row = txn
                .query_one(
                    "INSERT INTO outbox (event_type, payload) VALUES ('After', $1::text::jsonb) \
                     RETURNING id::text",
                    &[&format!(r#"{{"n": {n}}}"#)],
                )
                .await
                .expect("insert");
            after.push(row.get(0));
        }
        txn.commit().await.expect("commit");
    }
    let setup = outbox.run_command(&["setup"]);
    assert!(setup.status.success(), "{}", text(&setup));

    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let out = outbox.run_command(&["resync", "--since", &since]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        stdout(&out).contains(&format!("published {} messages", after.len())),
        "{}",
        text(&out)
    );
    // resync has exited, every message confirmed: nothing of it can follow the marker.
    consumer
        .wait_for(after.len(), Duration::from_secs(30))
        .await;
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let received = settled(&mut consumer, url, queue, Upto::Done, || text(&out)).await;
    let got: Vec<&str> = received
        .iter()
        .map(|r| r.message_id.as_deref().expect("message_id"))
        .collect();
    // created_at order; the two rows of the last transaction share a created_at, so they
    // come in id order.
    let expected_order = first_column(
        &outbox.client,
        "SELECT id::text FROM outbox WHERE created_at >= $1::text::timestamptz \
         ORDER BY created_at, id",
        &[&since],
    )
    .await;
    let mut expected_set = after.clone();
    expected_set.sort();
    let mut expected_sorted = expected_order.clone();
    expected_sorted.sort();
    assert_eq!(
        expected_sorted, expected_set,
        "the oracle sees the rows after `since`"
    );
    assert_eq!(
        got, expected_order,
        "exactly the rows from `since` on, in created_at order"
    );
    assert!(
        got.iter().all(|id| !before.iter().any(|b| b == id)),
        "no row from before `since` ({before:?}) was republished: {got:?}"
    );
    assert_eq!(received[0].kind.as_deref(), Some("After"));
    assert_eq!(received[0].body_json()["n"], 0, "payload intact");

    let out = outbox.run_command(&["resync", "--since", "yesterday"]);
    assert!(
        !out.status.success(),
        "resync refuses a --since that is not a time: {}",
        text(&out)
    );
    assert!(text(&out).contains("RFC 3339"), "{}", text(&out));
}

/// resync selects rows by `created_at`: a row whose `created_at` is NULL (a nullable column
/// mapped to it) is never published. When nothing is, it says so plainly, and why, counting
/// the rows it cannot select; no message reaches the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resync_that_publishes_nothing_says_so_and_why() {
    let outbox = Outbox::new("ops_resync_none").await;
    outbox
        .client
        .batch_execute(
            "ALTER TABLE outbox ALTER COLUMN created_at DROP NOT NULL;
             INSERT INTO outbox (event_type, payload, created_at)
             SELECT 'Undated', '{}', NULL FROM generate_series(1, 2);",
        )
        .await
        .expect("rows without created_at");
    let since = "2000-01-01T00:00:00Z";
    let out = outbox.run_command(&["resync", "--since", since]);
    assert!(out.status.success(), "{}", text(&out));
    let said = stdout(&out);
    assert!(
        said.contains(&format!(
            "resync: published nothing: no row has created_at at or after {since}"
        )) && said.contains("2 rows have a NULL created_at"),
        "{said}"
    );
    assert_eq!(
        common::queue_message_count(&outbox.amqp_url, &outbox.queue).await,
        0
    );
}

// ---------------------------------------------------------------------------------------
// cleanup

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_deletes_only_rows_past_retention_and_the_last_acknowledged_commit() {
    let outbox = Outbox::new("ops_cleanup").await;
    // Ages in minutes; retention 60 minutes; the last acknowledged commit 150 minutes ago.
    let ages = [
        ("old", 300),
        ("old", 290),
        ("old", 280),
        ("old", 270),
        ("old", 160),
        ("after_ack", 140),
        ("after_ack", 100),
        ("young", 30),
        ("young", 1),
    ];
    for (kind, minutes) in ages {
        outbox
            .client
            .execute(
                "INSERT INTO outbox (event_type, created_at) \
                 VALUES ($1, now() - $2::int * interval '1 minute')",
                &[&kind, &minutes],
            )
            .await
            .expect("insert");
    }
    let sql = "SELECT now() - interval '150 minutes'";
    let acknowledged: SystemTime = common::pg::query_value(&outbox.client, sql).await;
    // Batches of 2: 2 + 2 + 1, the loop stops after the short one.
    let names = names(&outbox);
    let retention = Duration::from_secs(3600);
    let delete = |acknowledged: SystemTime, batch| {
        let deleting = outbox_relay::internals::delete_batch(
            &outbox.client,
            &names,
            retention,
            acknowledged,
            batch,
        );
        async move { deleting.await.expect("cleanup") }
    };
    let deleted = delete(acknowledged, 2).await;
    assert_eq!(deleted, 5);
    let left = first_column(
        &outbox.client,
        "SELECT event_type FROM outbox ORDER BY created_at",
        &[],
    )
    .await;
    assert_eq!(left, ["after_ack", "after_ack", "young", "young"]);

    // A relay that acknowledged more recently lets the rows past retention go, never the
    // young ones.
    let deleted = delete(SystemTime::now() + Duration::from_secs(3600), 1000).await;
    assert_eq!(deleted, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_statement_reads_the_created_at_index_not_the_table() {
    let outbox = Outbox::new("ops_explain").await;
    outbox
        .client
        .batch_execute(
            "INSERT INTO outbox (event_type, payload, created_at) \
             SELECT 'Seeded', '{\"n\": 1}', now() - i * interval '1 second' \
             FROM generate_series(1, 100000) AS i; \
             ANALYZE outbox;",
        )
        .await
        .expect("seed");
    let seq_scan_allowed: String =
        common::pg::query_value(&outbox.client, "SHOW enable_seqscan").await;
    assert_eq!(seq_scan_allowed, "on", "the planner is free to choose");
    let sql = outbox_relay::internals::delete_sql(&names(&outbox), 1000);
    // The worst case for the index: nearly every row qualifies.
    let retention = 60.0f64;
    let acknowledged = SystemTime::now() + Duration::from_secs(3600);
    let explain = format!("EXPLAIN {sql}");
    let plan = first_column(&outbox.client, &explain, &[&retention, &acknowledged]).await;
    let plan = plan.join("\n");
    println!("{plan}");
    assert!(!plan.contains("Seq Scan"), "no sequential scan:\n{plan}");
    assert!(
        plan.contains("outbox_created_at_idx"),
        "reads the created_at index:\n{plan}"
    );
}

// ---------------------------------------------------------------------------------------
// security

/// The password of the least-privilege role: every URL-special character it can hold.
const PASSWORD: &str = "p@ss:w/rd%";
/// The same, percent-encoded for the URL.
const PASSWORD_IN_URL: &str = "p%40ss%3Aw%2Frd%25";

/// pg_hba.conf is one file per server: one test edits it at a time.
static PG_HBA: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A database whose table and publication a superuser created (sql/outbox.sql's table and
/// publication steps), and a relay role made by sql/role.sql with [`PASSWORD`], allowed in
/// by exactly the pg_hba.conf line the script documents (password required; every other
/// line for this role rejects, so the test fails if that line did not match).
struct RoleOutbox {
    outbox: Outbox,
    role: String,
    /// The superuser's URL of the same database.
    admin_url: String,
}

async fn role_outbox(prefix: &str, replication: bool) -> Option<RoleOutbox> {
    if !common::own_postgres("it edits pg_hba.conf") {
        return None;
    }
    let s = services();
    let db = unique_name(prefix);
    let admin_url = s.pg.create_database(&db).await;
    let admin = pg_connect(&admin_url).await;
    let role = unique_name(&format!("{prefix}_role"));
    let names = OutboxNames {
        table: "outbox".into(),
        publication: "outbox_pub".into(),
        slot: format!("{db}_slot").into(),
        exchange: format!("{db}_x").into(),
    };
    for step in [
        outbox_relay::internals::table_step(&names),
        outbox_relay::internals::publication_step(&names),
    ] {
        admin.batch_execute(&step.sql).await.expect("DBA step");
    }

    let mut script = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/role.sql"))
        .expect("read sql/role.sql")
        // The role's name, not the state table's, which only begins like it.
        .replace("outbox_relay_state", "\u{0}")
        .replace("outbox_relay", &role)
        .replace('\u{0}', "outbox_relay_state")
        .replace("ON DATABASE app", &format!("ON DATABASE {db}"));
    if !replication {
        script = script.replace("LOGIN REPLICATION", "LOGIN");
    }
    admin.batch_execute(&script).await.expect("sql/role.sql");
    admin
        .batch_execute(&format!(
            "ALTER ROLE {role} PASSWORD '{}'",
            PASSWORD.replace('\'', "''")
        ))
        .await
        .expect("set password");

    {
        let _one_at_a_time = PG_HBA.lock().await;
        let path = s.pg.dir().join("data").join("pg_hba.conf");
        let existing = std::fs::read_to_string(&path).expect("read pg_hba.conf");
        // The line sql/role.sql documents, then a reject for anything else this role tries.
        let lines = format!(
            "host {db} {role} 127.0.0.1/32 scram-sha-256\nhost all {role} 127.0.0.1/32 reject\n"
        );
        std::fs::write(&path, lines + &existing).expect("write pg_hba.conf");
        admin
            .batch_execute("SELECT pg_reload_conf()")
            .await
            .expect("reload");
    }
    // The reload is asynchronous: wait until a wrong password is refused.
    let port = s.pg.port();
    let wrong = format!("postgres://{role}:wrong@127.0.0.1:{port}/{db}");
    let refused = eventually(Duration::from_secs(30), || async {
        match tokio_postgres::connect(&wrong, tokio_postgres::NoTls).await {
            Ok(_) => false,
            Err(e) => e.code().is_some(),
        }
    })
    .await;
    assert!(refused, "pg_hba.conf requires the password");

    let role_url = format!("postgres://{role}:{PASSWORD_IN_URL}@127.0.0.1:{port}/{db}");
    let outbox = Outbox {
        db_url: role_url,
        amqp_url: s.rabbit.url(),
        slot: names.slot.to_string(),
        exchange: names.exchange.to_string(),
        queue: format!("{db}_q"),
        client: admin,
    };
    Some(RoleOutbox {
        outbox,
        role,
        admin_url,
    })
}

/// `outbox-relay run` as the role, logging at trace level, metrics off.
fn spawn_traced_relay(outbox: &Outbox) -> RelayProcess {
    let mut args: Vec<String> = vec!["run".into()];
    args.extend(outbox.flags("run"));
    args.extend(["--metrics-addr".into(), "off".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    RelayProcess::spawn(&args, &[("RUST_LOG", "trace")])
}

fn assert_no_password(what: &str, text: &str) {
    assert!(
        !text.contains(PASSWORD),
        "{what} contains the password:\n{text}"
    );
    assert!(
        !text.contains(PASSWORD_IN_URL),
        "{what} contains the percent-encoded password:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_role_sets_up_and_runs_but_cannot_drop_the_dba_publication() {
    let Some(fixture) = role_outbox("ops_role", true).await else {
        return;
    };
    let outbox = &fixture.outbox;
    let setup = outbox.run_command(&["setup", "--no-create-table"]);
    assert!(setup.status.success(), "{}", text(&setup));
    assert!(
        stdout(&setup).contains("created (pgoutput)"),
        "{}",
        text(&setup)
    );
    declare_bound_queue(&outbox.amqp_url, &outbox.exchange, &outbox.queue, "#").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;

    let relay = spawn_traced_relay(outbox);
    let id = outbox.insert("RoleEvent", r#"{"ok": true}"#).await;
    let received = consumer.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(
        received.first().and_then(|r| r.message_id.as_deref()),
        Some(id.as_str()),
        "the role's relay delivers; log:\n{}",
        relay.log()
    );
    let slot_owner: String = outbox
        .client
        .query_one(
            "SELECT usename::text FROM pg_stat_replication WHERE pid = \
             (SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1)",
            &[&outbox.slot],
        )
        .await
        .expect("walsender")
        .get(0);
    assert_eq!(
        slot_owner, fixture.role,
        "streaming as the least-privilege role"
    );
    relay.sigterm();
    assert!(
        relay.wait_exit(Duration::from_secs(30)).await.is_some(),
        "the relay stops on SIGTERM; log:\n{}",
        relay.log()
    );
    assert_no_password("the relay's trace log", &relay.log());

    let out = outbox.run_command(&["status", "--metrics-addr", "off"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // The publication belongs to the DBA: the slot goes, the publication stays, and the
    // message says who must drop it.
    let out = outbox.run_command(&["teardown", "--yes"]);
    assert!(!out.status.success(), "{}", text(&out));
    let message = text(&out);
    assert!(
        message.contains("may not drop the publication \"outbox_pub\" (owned by postgres)"),
        "{message}"
    );
    assert!(message.contains("was dropped"), "{message}");
    let admin = pg_connect(&fixture.admin_url).await;
    assert!(
        !slot_exists(&admin, &outbox.slot).await,
        "the slot is dropped"
    );
    assert!(
        publication_exists(&admin, "outbox_pub").await,
        "the DBA's publication outbox_pub is left: {message}"
    );
    assert_no_password("teardown's output", &message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_reach_the_log_at_trace_level() {
    let Some(fixture) = role_outbox("ops_secret", true).await else {
        return;
    };
    let outbox = &fixture.outbox;
    let setup = outbox.run_command(&["setup", "--no-create-table"]);
    assert!(setup.status.success(), "{}", text(&setup));
    assert_no_password("setup's output", &text(&setup));
    declare_bound_queue(&outbox.amqp_url, &outbox.exchange, &outbox.queue, "#").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;

    // The URL comes from the environment here, as in production.
    let mut args: Vec<String> = vec!["run".into()];
    args.extend(
        outbox
            .flags("run")
            .chunks(2)
            .filter(|pair| pair[0] != "--database-url")
            .flatten()
            .cloned(),
    );
    args.extend(["--metrics-addr".into(), "off".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let relay = RelayProcess::spawn(
        &args,
        &[("RUST_LOG", "trace"), ("DATABASE_URL", &outbox.db_url)],
    );
    outbox.insert("SecretEvent", r#"{"n": 1}"#).await;
    assert_eq!(
        consumer.wait_for(1, Duration::from_secs(30)).await.len(),
        1,
        "delivered with the password from the URL; log:\n{}",
        relay.log()
    );
    relay.sigterm();
    assert!(
        relay.wait_exit(Duration::from_secs(30)).await.is_some(),
        "the relay stops on SIGTERM; log:\n{}",
        relay.log()
    );
    let log = relay.log();
    assert!(
        log.contains("TRACE") || log.contains("DEBUG"),
        "trace logging is on"
    );
    assert_no_password("the relay's trace log", &log);

    // A wrong password: the error says what failed, not with what.
    let wrong_url = outbox
        .db_url
        .replace(PASSWORD_IN_URL, "p%40ss%3Aw%2Frd%25x");
    let out = std::process::Command::new(common::relay::binary())
        .args([
            "status",
            "--database-url",
            &wrong_url,
            "--metrics-addr",
            "off",
        ])
        .env("RUST_LOG", "trace")
        .output()
        .expect("status");
    assert!(
        !out.status.success(),
        "status with a wrong password must fail: {}",
        out.status
    );
    assert_no_password("a failed login's output", &text(&out));
    assert!(
        !text(&out).contains("p%40ss%3Aw%2Frd%25x"),
        "{}",
        text(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_replication_gets_a_clear_error() {
    let Some(fixture) = role_outbox("ops_norepl", false).await else {
        return;
    };
    let outbox = &fixture.outbox;
    // setup creates the slot, which needs REPLICATION.
    let out = outbox.run_command(&["setup", "--no-create-table"]);
    assert!(!out.status.success(), "{}", text(&out));
    let message = text(&out);
    assert!(
        message.contains("lacks the REPLICATION attribute"),
        "{message}"
    );
    assert!(message.contains("ALTER ROLE"), "{message}");

    // With the slot made by a superuser, `run` fails at the replication connection.
    outbox
        .client
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&outbox.slot],
        )
        .await
        .expect("create slot");
    declare_bound_queue(&outbox.amqp_url, &outbox.exchange, &outbox.queue, "#").await;
    let relay = spawn_traced_relay(outbox);
    let exit = relay.wait_exit(Duration::from_secs(60)).await;
    assert!(
        exit.is_some_and(|status| !status.success()),
        "stops (retrying cannot help); log:\n{}",
        relay.log()
    );
    let log = relay.log();
    assert!(
        log.contains(&format!(
            "The database role \"{}\" may not use replication",
            fixture.role
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!("ALTER ROLE {} REPLICATION", fixture.role)),
        "{log}"
    );
}

// ---------------------------------------------------------------------------------------
// names and URLs

/// Names that PostgreSQL takes quoted and the relay accepts, each a trap for SQL built by
/// pasting: quotes, spaces, mixed case, unicode, `;` and `--`, `%` (a RAISE placeholder), a
/// schema. `setup --print-sql` for them, piped to psql (twice: the second run takes the
/// "already exists" paths), creates exactly the table, the publication on it and the slot,
/// and nothing else runs; then the relay streams a row under those names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn print_sql_for_unusual_names_creates_exactly_those_objects_and_the_relay_uses_them() {
    let s = services();
    let db = unique_name("ops_names");
    let url = s.pg.create_database(&db).await;
    let client = pg_connect(&url).await;
    let schema = "Ops \"Schema\" ünï";
    let table = "Outbox Évents 'q'; DROP TABLE canary; --";
    let publication = "Pub 100% 'p'; DROP TABLE canary; --";
    let slot = format!("{db}_slot");
    let exchange = format!("{db} exchange ünï:v1");
    // The schema is the DBA's (setup creates tables, not schemas); the canary must survive.
    client
        .batch_execute(&format!(
            "CREATE SCHEMA {}; CREATE TABLE canary (id int)",
            common::pg::quote_ident(schema)
        ))
        .await
        .expect("schema and canary");

    let qualified = format!("{schema}.{table}");
    let name_flags = [
        "--table",
        qualified.as_str(),
        "--publication",
        publication,
        "--slot",
        &slot,
        "--exchange",
        &exchange,
    ];
    let mut args = vec!["setup", "--print-sql"];
    args.extend(name_flags);
    let out = std::process::Command::new(common::relay::binary())
        .args(&args)
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .output()
        .expect("setup --print-sql");
    assert!(out.status.success(), "{}", text(&out));
    let sql = stdout(&out);
    psql(&url, &sql);
    let again = psql(&url, &sql);
    assert!(
        again.contains(&format!(
            "NOTICE:  publication {publication} already exists"
        )),
        "{again}"
    );

    let rows = |sql: &'static str| {
        let client = &client;
        async move { first_column(client, sql, &[]).await }
    };
    assert_eq!(
        rows(
            "SELECT table_schema || '.' || table_name FROM information_schema.tables \
             WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1"
        )
        .await,
        [
            format!("{schema}.{table}"),
            format!("{schema}.outbox_relay_state"),
            "public.canary".to_string()
        ],
        "the outbox table, the relay's state table beside it, and the canary, nothing else"
    );
    assert_eq!(
        rows(
            "SELECT p.pubname || ' ' || t.schemaname || '.' || t.tablename || ' ' || \
             p.pubinsert || p.pubupdate || p.pubdelete || p.pubtruncate \
             FROM pg_publication p LEFT JOIN pg_publication_tables t USING (pubname)"
        )
        .await,
        [format!(
            "{publication} {schema}.{table} truefalsefalsefalse"
        )],
        "one insert-only publication, on the outbox table only"
    );
    assert_eq!(
        rows(
            "SELECT slot_name || ' ' || plugin || ' ' || slot_type FROM pg_replication_slots \
             WHERE database = current_database()"
        )
        .await,
        [format!("{slot} pgoutput logical")],
        "one pgoutput slot in this database"
    );

    // The relay streams a row under these names (START_REPLICATION gets the publication
    // quoted: unquoted, PostgreSQL would fold its case and cut it at the first space).
    let queue = format!("{db}_q");
    let amqp_url = s.rabbit.url();
    declare_bound_queue(&amqp_url, &exchange, &queue, "#").await;
    let mut consumer = Consumer::start(&amqp_url, &queue).await;
    let mut args = vec![
        "run",
        "--database-url",
        &url,
        "--amqp-url",
        &amqp_url,
        "--metrics-addr",
        "off",
    ];
    args.extend(name_flags);
    let relay = RelayProcess::spawn(&args, &[common::relay::TEST_LOG]);
    let id: String = client
        .query_one(
            &format!(
                "INSERT INTO {}.{} (event_type, payload) VALUES ('NamedEvent', '{{}}') \
                 RETURNING id::text",
                common::pg::quote_ident(schema),
                common::pg::quote_ident(table)
            ),
            &[],
        )
        .await
        .expect("insert")
        .get(0);
    let received = consumer.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(
        received.first().and_then(|r| r.message_id.as_deref()),
        Some(id.as_str()),
        "delivered; log:\n{}",
        relay.log()
    );
    relay.stop().await;
    common::pg::drop_slot_once_released(&client, &slot).await;
}

/// A malformed URL is a definite error: `run` and `poll` stop at once with exit 1 and one
/// clear error, never retrying as if the server were down, and never print the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_urls_stop_run_and_poll_at_once_without_printing_the_password() {
    let s = services();
    let db_url = s.pg.url("postgres");
    let amqp_url = s.rabbit.url();
    let cases = [
        // (database URL, AMQP URL, the error)
        (
            db_url.as_str(),
            "http://guest:s3cretpw@x/",
            "\"http\" is not amqp or amqps",
        ),
        (
            db_url.as_str(),
            "amqp://guest:s3cretpw@h:notaport/%2f",
            "AMQP URL #1 is not a valid RabbitMQ URL",
        ),
        (
            "postgres://relay:s3cretpw@db:notaport/app",
            amqp_url.as_str(),
            "The database URL is not valid",
        ),
        (
            "http://relay:s3cretpw@x/",
            amqp_url.as_str(),
            "The database URL is not valid",
        ),
    ];
    for command in ["run", "poll"] {
        for (db, amqp, error) in cases {
            let relay = RelayProcess::spawn(
                &[
                    command,
                    "--database-url",
                    db,
                    "--amqp-url",
                    amqp,
                    "--metrics-addr",
                    "off",
                ],
                &[common::relay::TEST_LOG],
            );
            let exit = relay.wait_exit(Duration::from_secs(15)).await;
            let log = relay.log();
            let case = format!("{command} --database-url {db} --amqp-url {amqp}");
            assert_eq!(
                exit.and_then(|status| status.code()),
                Some(i32::from(outbox_relay::exit::CONFIG)),
                "{case}: exits at once with the configuration's code; log:\n{log}"
            );
            let logged: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
            assert!(
                logged.len() == 1 && logged[0].contains(error),
                "{case}: one ERROR line, the clear one; log:\n{log}"
            );
            for retrying in ["session failed", "reconnect", "retrying", "WARN"] {
                assert!(!log.contains(retrying), "{case}: no retry; log:\n{log}");
            }
            assert!(
                !log.contains("s3cretpw"),
                "{case}: the password; log:\n{log}"
            );
        }
    }
}

/// PostgreSQL 18's `idle_replication_slot_timeout` invalidates the slot of a relay stopped
/// for longer: `status` (text and `--json`) shows the setting with its unit as the server's
/// catalog gives it, and the relay warns at start. On 18 whatever the matrix runs (the
/// setting is 18's), on a server of its own (it is server-wide).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_slot_timeout_of_18_is_shown_and_warned() {
    if !common::own_postgres("a PostgreSQL 18 with a server-wide setting") {
        return;
    }
    let pg = common::PgServer::start_major(18, &[("idle_replication_slot_timeout", "1d")]);
    let db_url = pg.create_database(&unique_name("ops_idle")).await;
    let amqp_url = common::services().rabbit.url();
    let outbox = Outbox::provision_in(
        &db_url,
        &amqp_url,
        &["setup"],
        lapin::types::FieldTable::default(),
    )
    .await;
    let row = outbox
        .client
        .query_one(
            "SELECT setting, coalesce(unit, '') FROM pg_settings \
             WHERE name = 'idle_replication_slot_timeout'",
            &[],
        )
        .await
        .expect("the setting");
    let (setting, unit): (String, String) = (row.get(0), row.get(1));
    assert!(
        matches!(
            (setting.as_str(), unit.as_str()),
            ("86400", "s") | ("1440", "min")
        ),
        "one day, in the server's unit: {setting} {unit}"
    );
    let shown = format!("{setting}{unit}");

    let status = outbox.run_command(&["status", "--metrics-addr", "off"]);
    let table = stdout(&status);
    assert!(
        table.contains(&format!("{shown} (idle_replication_slot_timeout")),
        "{}",
        text(&status)
    );
    let json = outbox.run_command(&["status", "--json", "--metrics-addr", "off"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("status JSON");
    assert_eq!(
        json["idle_replication_slot_timeout"],
        shown.as_str(),
        "{json}"
    );

    let relay = outbox.spawn_relay(&["--metrics-addr", "off"]);
    let warned = relay
        .wait_for_log("idle_replication_slot_timeout", Duration::from_secs(30))
        .await;
    let lines = relay.log_lines("idle_replication_slot_timeout");
    assert!(
        warned
            && lines.len() == 1
            && lines[0].contains("WARN")
            && lines[0].contains(&format!("idle_replication_slot_timeout={shown}")),
        "one warning naming {shown}: {lines:?}\nlog:\n{}",
        relay.log()
    );
    relay.stop().await;
}

/// `--on-slot-lost recreate` backfills from the acknowledged commit the relay records: with
/// the cleanup off (which records at its rounds) the session still records it, at its first
/// acknowledgement, so a lost slot's recovery starts there instead of re-publishing the whole
/// table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_is_recorded_with_the_cleanup_off() {
    let s = common::services();
    let outbox = Outbox::provision(
        &s.pg.url("postgres"),
        &s.rabbit.url(),
        "ops_unrecorded",
        &["setup"],
        lapin::types::FieldTable::default(),
    )
    .await;
    let relay = outbox.spawn_relay(&[
        "--metrics-addr",
        "off",
        "--on-slot-lost",
        "recreate",
        "--cleanup-interval",
        "0",
    ]);
    let streaming = relay
        .wait_for_log("streaming", Duration::from_secs(30))
        .await;
    assert!(streaming, "log:\n{}", relay.log());
    outbox
        .client
        .execute(
            "INSERT INTO outbox (event_type, payload) VALUES ('StateRecorded', '{}')",
            &[],
        )
        .await
        .expect("insert");
    let committed: std::time::SystemTime = outbox
        .client
        .query_one("SELECT max(created_at) FROM outbox", &[])
        .await
        .expect("created_at")
        .get(0);
    let state = format!(
        "SELECT acknowledged_commit FROM outbox_relay_state WHERE slot = '{}'",
        outbox.slot
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let recorded: Option<std::time::SystemTime> = outbox
            .client
            .query_opt(&state, &[])
            .await
            .expect("read the state")
            .and_then(|row| row.get(0));
        if recorded.is_some_and(|at| at >= committed) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no acknowledged commit recorded (state: {recorded:?}); log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    relay.stop().await;
}

// ---------------------------------------------------------------------------------------
// logging

/// Logging never stops the relay: with stdout and stderr a pipe nobody reads any more
/// (`outbox-relay run 2>&1 | head -1` once head has exited), every log line fails to be
/// written, and the relay delivers all the same and stops on SIGTERM with exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stderr_does_not_stop_the_relay() {
    let outbox = Outbox::new("ops_stderr").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let mut args = vec!["run".to_string()];
    args.extend(outbox.flags("run"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let relay = RelayProcess::spawn_unread(&args, &[common::relay::TEST_LOG]);
    let id = outbox.insert("PastAClosedStderr", "{}").await;
    let received = consumer.wait_for(1, Duration::from_secs(60)).await;
    let ids: Vec<&str> = received
        .iter()
        .filter_map(|r| r.message_id.as_deref())
        .collect();
    assert_eq!(
        ids,
        [id.as_str()],
        "delivered with stderr closed; the relay's exit so far: {:?}",
        relay.try_exit().map(|status| status.to_string())
    );
    relay.stop().await;
}

// ---------------------------------------------------------------------------------------
// startup warnings

/// `wal_sender_timeout = 0` turns off what ends the walsender of a relay whose host
/// vanished: a standby relay then waits for TCP to give up (about 15 minutes with data in
/// flight). `run` warns at start, naming the setting and the fix; with the default, it does
/// not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_sender_timeout_off_is_warned_about_at_start() {
    const WARNING: &str = "wal_sender_timeout is 0";
    let outbox = Outbox::new("ops_walsender").await;
    // The log of a relay run until its first session streamed.
    let streamed = || async {
        let relay = outbox.spawn_relay(&[]);
        let started = relay
            .wait_for_log(common::relay::SESSION_STARTED, Duration::from_secs(60))
            .await;
        assert!(started, "log:\n{}", relay.log());
        relay.stop().await;
        relay.log()
    };
    let log = streamed().await;
    assert_eq!(log.matches(WARNING).count(), 0, "log:\n{log}");

    let database: String =
        common::pg::query_value(&outbox.client, "SELECT current_database()").await;
    outbox
        .client
        .batch_execute(&format!(
            "ALTER DATABASE {database} SET wal_sender_timeout = 0"
        ))
        .await
        .expect("turn wal_sender_timeout off for the database");
    let log = streamed().await;
    let warned: Vec<&str> = log.lines().filter(|l| l.contains(WARNING)).collect();
    assert!(
        warned.len() == 1
            && warned[0].contains(" WARN ")
            && warned[0].contains("Fix: ")
            && warned[0].contains("wal_sender_timeout = '10s'"),
        "one warning naming the setting and the fix; log:\n{log}"
    );
}
