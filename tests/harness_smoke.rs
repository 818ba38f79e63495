//! The test harness works: private PostgreSQL and RabbitMQ start, the test_decoding
//! oracle reads a transaction back, a queue receives confirmed publishes, the proxy
//! passes and resets PostgreSQL connections, and child processes are supervised.

use outbox_testkit as common;

use std::path::Path;
use std::time::Duration;

use common::faults::{settled, Upto};
use common::outbox::Outbox;
use common::pg::{self, column_value, parse_test_decoding, replace_url_database, url_port};
use common::{
    create_test_decoding_slot, current_wal_lsn, declare_bound_queue, format_lsn, parse_lsn,
    pg_connect, queue_message_count, read_test_decoding, services, slot_confirmed_flush,
    unique_name, Consumer, Direction, Mode, PgServer, RabbitServer, RelayProcess, TcpProxy,
};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn postgres_test_decoding_oracle_sees_one_transaction_in_insert_order() {
    let pg = &services().pg;
    let db = unique_name("smoke_oracle");
    let url = pg.create_database(&db).await;
    let client = pg_connect(&url).await;
    client
        .batch_execute(
            "CREATE TABLE outbox (
                 id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
                 event_type text NOT NULL,
                 payload jsonb
             )",
        )
        .await
        .unwrap();
    let slot = unique_name("oracle");
    create_test_decoding_slot(&client, &slot).await;
    let created_at = slot_confirmed_flush(&client, &slot).await;

    let rows = client
        .query(
            "INSERT INTO outbox (event_type, payload) VALUES
                 ('OrderCreated', '{\"order_id\": 1}'),
                 ('OrderPaid', '{\"order_id\": 1, \"note\": \"it''s paid\"}')
             RETURNING id::text",
            &[],
        )
        .await
        .unwrap();
    let inserted: Vec<String> = rows.iter().map(|r| r.get(0)).collect();

    let txns = read_test_decoding(&client, &slot).await;
    assert_eq!(txns.len(), 1, "{txns:?}");
    assert_eq!(txns[0].inserted_ids("public.outbox"), inserted);
    assert!(
        txns[0].end_lsn > created_at,
        "the transaction ends at {} after the slot's creation at {}",
        format_lsn(txns[0].end_lsn),
        format_lsn(created_at)
    );
    let wal_end = current_wal_lsn(&client).await;
    assert!(
        wal_end >= txns[0].end_lsn,
        "the WAL end {} is at or past the transaction's end {}",
        format_lsn(wal_end),
        format_lsn(txns[0].end_lsn)
    );
    // Peeking does not consume: the slot has not moved.
    assert_eq!(slot_confirmed_flush(&client, &slot).await, created_at);
    assert_eq!(read_test_decoding(&client, &slot).await, txns);
}

/// The shared server is the version `OUTBOX_TEST_PG_MAJOR` chose, as the server itself says
/// (or, with `OUTBOX_TEST_PG_BIN`, the version of those binaries).
#[test]
fn the_shared_server_runs_the_chosen_major_version() {
    let pg = &services().pg;
    if !common::own_postgres("it checks the version the harness chose") {
        return;
    }
    let expected = match std::env::var(pg::PG_BIN_ENV) {
        Ok(bin) if !bin.is_empty() => binaries_major(Path::new(&bin)),
        _ => pg::pg_major(),
    };
    assert_eq!(
        pg.major_version(),
        expected,
        "server_version {}",
        pg.server_version()
    );
}

/// `postgres --version` of the binaries in `bin`: `postgres (PostgreSQL) 18.4` is 18.
fn binaries_major(bin: &Path) -> u32 {
    let out = std::process::Command::new(bin.join("postgres"))
        .arg("--version")
        .output()
        .expect("run postgres --version");
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.rsplit(' ').next().unwrap_or_default();
    let major = version.split(['.', 'b', 'r']).next().unwrap_or_default();
    major
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no major version in {text:?}"))
}

/// One process runs servers of two major versions at once (a primary and a standby of a
/// failover test are started this way), each from its own binaries.
#[test]
fn servers_of_two_major_versions_run_side_by_side() {
    let newest = *pg::supported_majors().iter().max().expect("versions");
    let majors = [pg::DEFAULT_PG_MAJOR, newest];
    let servers: Vec<PgServer> = std::thread::scope(|s| {
        let started: Vec<_> = majors
            .iter()
            .map(|&major| s.spawn(move || PgServer::start_major(major, &[])))
            .collect();
        started.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (server, major) in servers.iter().zip(majors) {
        assert_eq!(server.major_version(), major, "{}", server.server_version());
        assert_eq!(server.bin(), pg::pg_bin_of(major));
        assert_eq!(binaries_major(server.bin()), major);
    }
    assert_ne!(servers[0].port(), servers[1].port());
}

/// A streaming standby made by copying the primary's data directory: it replays what the
/// primary commits after the copy, refuses writes, and takes them once promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_follows_its_primary_and_takes_writes_once_promoted() {
    let primary = tokio::task::spawn_blocking(|| PgServer::start(&[]))
        .await
        .unwrap();
    let client = primary.client("postgres").await;
    client
        .batch_execute("CREATE TABLE t (id int); INSERT INTO t VALUES (1);")
        .await
        .unwrap();
    let (primary, standby) = tokio::task::spawn_blocking(move || {
        let standby = PgServer::start_standby_of(&primary, "standby_slot", &[]);
        (primary, standby)
    })
    .await
    .unwrap();
    assert_eq!(standby.major_version(), primary.major_version());
    let primary_client = primary.client("postgres").await;
    primary_client
        .batch_execute("INSERT INTO t VALUES (2)")
        .await
        .unwrap();
    let replica = standby.client("postgres").await;
    let in_recovery: bool = pg::query_value(&replica, "SELECT pg_is_in_recovery()").await;
    assert!(in_recovery, "the copy runs as a standby");
    let streamed = pg::wait_count(&replica, "SELECT count(*) FROM t", WAIT, |n| n == 2).await;
    assert_eq!(streamed, Ok(2), "the row committed after the copy arrives");
    let active: i64 = pg::query_value(
        &primary_client,
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'standby_slot' AND active",
    )
    .await;
    assert_eq!(active, 1, "the standby streams through its physical slot");
    let refused = replica.batch_execute("INSERT INTO t VALUES (3)").await;
    assert!(
        refused.is_err(),
        "a standby must refuse writes: {refused:?}"
    );

    let promoted: bool = pg::query_value(&replica, "SELECT pg_promote()").await;
    assert!(promoted, "pg_promote() returned false");
    replica
        .batch_execute("INSERT INTO t VALUES (3)")
        .await
        .unwrap();
}

#[tokio::test]
async fn rabbitmq_confirmed_publishes_reach_a_bound_queue() {
    let url = services().rabbit.url();
    let exchange = unique_name("smoke_ex");
    let queue = unique_name("smoke_q");
    declare_bound_queue(&url, &exchange, &queue, "order.*").await;

    let mut consumer = Consumer::start(&url, &queue).await;
    common::amqp::publish_confirmed(
        &url,
        &exchange,
        "order.created",
        &[("m-1", b"{\"n\": 1}"), ("m-2", b"{\"n\": 2}")],
    )
    .await;

    let got = consumer.wait_for(2, WAIT).await;
    let ids: Vec<_> = got.iter().map(|m| m.message_id.as_deref()).collect();
    assert_eq!(ids, [Some("m-1"), Some("m-2")]);
    assert_eq!(got[0].routing_key, "order.created");
    assert_eq!(got[0].exchange, exchange);
    assert_eq!(got[0].delivery_mode, Some(2));
    assert_eq!(got[1].body_json()["n"], 2);

    // One more, straight into the queue and not waited for: `settled` returns it, since its
    // marker was published after it, and takes the marker out of the list.
    common::amqp::publish_confirmed(&url, "", &queue, &[("m-3", b"")]).await;
    let got = settled(&mut consumer, &url, &queue, Upto::Done, String::new).await;
    let ids: Vec<_> = got.iter().map(|m| m.message_id.as_deref()).collect();
    assert_eq!(
        ids,
        [Some("m-1"), Some("m-2"), Some("m-3")],
        "everything ahead of the marker, and not the marker"
    );
    // Counts after it are the messages' own.
    common::amqp::publish_confirmed(&url, &exchange, "order.paid", &[("m-4", b"{}")]).await;
    let got = consumer.wait_for(4, WAIT).await;
    let ids: Vec<_> = got.iter().map(|m| m.message_id.as_deref()).collect();
    assert_eq!(ids, [Some("m-1"), Some("m-2"), Some("m-3"), Some("m-4")]);
    assert_eq!(queue_message_count(&url, &queue).await, 0);
    consumer.close().await;
}

/// `settled` in WAL mode, not told how many to expect: a row written just before it is in
/// what it returns, because the slot has to pass it before the marker goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_waits_for_the_slot_to_pass_a_row_just_written() {
    let outbox = Outbox::new("smoke_settled_wal").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let relay = outbox.spawn_relay(&["--metrics-addr", "off"]);
    let id = outbox.insert("Settled", "{}").await;
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let got = settled(&mut consumer, url, queue, Upto::slot(&outbox), || {
        relay.log()
    })
    .await;
    let ids: Vec<_> = got.iter().map(|m| m.message_id.as_deref()).collect();
    assert_eq!(ids, [Some(id.as_str())], "log:\n{}", relay.log());
    relay.stop().await;
}

/// `settled` in polling mode, not told how many to expect: a row written just before it is
/// in what it returns, because the row has to be marked before the marker goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_waits_for_a_polled_row_to_be_marked() {
    let s = services();
    let outbox =
        Outbox::on_poll(&s.pg.url("postgres"), &s.rabbit.url(), "smoke_settled_poll").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let relay = outbox.spawn_poll(&["--metrics-addr", "off"], &[]);
    let id = outbox.insert("Settled", "{}").await;
    let unsent = "SELECT count(*) FROM outbox WHERE published_at IS NULL";
    let upto = Upto::Unsent(&outbox.client, unsent);
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let got = settled(&mut consumer, url, queue, upto, || relay.log()).await;
    let ids: Vec<_> = got.iter().map(|m| m.message_id.as_deref()).collect();
    assert_eq!(ids, [Some(id.as_str())], "log:\n{}", relay.log());
    relay.stop().await;
}

#[tokio::test]
async fn proxy_passes_and_resets_postgres_connections() {
    let pg = &services().pg;
    let db = unique_name("smoke_proxy");
    pg.create_database(&db).await;
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", pg.port()));
    let via_proxy = format!("postgres://postgres@127.0.0.1:{}/{db}", proxy.port());

    let client = pg_connect(&via_proxy).await;
    let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    assert_eq!(proxy.live_connections(), 1);

    // Delay: still works, just later.
    proxy.set_mode(
        Direction::ServerToClient,
        Mode::Delay(Duration::from_millis(150)),
    );
    let started = std::time::Instant::now();
    client.query_one("SELECT 2", &[]).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "a 150 ms delay let the answer through in {:?}",
        started.elapsed()
    );
    proxy.set_modes(Mode::Pass);

    // Black hole: the query gets no answer and the connection stays open.
    proxy.set_mode(Direction::ClientToServer, Mode::BlackHole);
    let silent = tokio::time::timeout(
        Duration::from_millis(300),
        client.query_one("SELECT 3", &[]),
    );
    assert!(
        silent.await.is_err(),
        "a black-holed query must not complete"
    );
    assert_eq!(proxy.live_connections(), 1);
    proxy.set_modes(Mode::Pass);

    // Reset: the open connection fails at once; a new one works.
    proxy.reset_all();
    let err = tokio::time::timeout(WAIT, client.query_one("SELECT 4", &[]))
        .await
        .expect("a reset connection fails promptly")
        .expect_err("the connection was reset");
    assert!(
        err.is_closed() || err.to_string().contains("connection"),
        "{err:?}"
    );
    let client = pg_connect(&via_proxy).await;
    client.query_one("SELECT 5", &[]).await.unwrap();
    assert_eq!(proxy.accepted_connections(), 2);
}

#[test]
fn proxy_delays_and_resets_with_rst_on_both_ends() {
    use std::io::{ErrorKind, Read, Write};
    let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = TcpProxy::start(&target.local_addr().unwrap().to_string());
    let mut client = std::net::TcpStream::connect(proxy.addr()).unwrap();
    let (mut server, _) = target.accept().unwrap();
    let mut buf = [0u8; 16];

    client.write_all(b"ping").unwrap();
    server.read_exact(&mut buf[..4]).unwrap();
    assert_eq!(&buf[..4], b"ping");

    proxy.set_mode(
        Direction::ServerToClient,
        Mode::Delay(Duration::from_millis(200)),
    );
    let started = std::time::Instant::now();
    server.write_all(b"pong").unwrap();
    client.read_exact(&mut buf[..4]).unwrap();
    assert_eq!(&buf[..4], b"pong");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "a 200 ms delay let the answer through in {:?}",
        started.elapsed()
    );

    proxy.reset_all();
    assert_eq!(proxy.live_connections(), 0);
    for (end, stream) in [("client", &mut client), ("server", &mut server)] {
        stream.set_read_timeout(Some(WAIT)).unwrap();
        let err = stream.read(&mut buf).expect_err(end);
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{end}: {err}");
    }
}

#[tokio::test]
async fn child_process_log_signals_and_memory_are_observable() {
    assert!(
        common::relay::binary().exists(),
        "no relay binary at {}",
        common::relay::binary().display()
    );
    let child = RelayProcess::spawn_bin(
        Path::new("/bin/sh"),
        &["-c", "echo \"ready $SMOKE_VALUE\"; trap 'echo bye; exit 3' TERM; while :; do sleep 0.05; done"],
        &[("SMOKE_VALUE", "42")],
    );
    assert!(
        child.wait_for_log("ready 42", WAIT).await,
        "{}",
        child.log()
    );
    assert!(
        child.peak_rss_kib().unwrap() > 0,
        "a running child has a peak RSS: {:?}",
        child.peak_rss_kib()
    );
    child.sigterm();
    let status = child.wait_exit(WAIT).await.expect("exits on SIGTERM");
    assert_eq!(status.code(), Some(3));
    assert!(
        child.log().contains("bye"),
        "the TERM trap ran; log:\n{}",
        child.log()
    );
    assert_eq!(child.peak_rss_kib(), None);
}

/// The fault-test API on private servers. About 20 s, so not in the default run:
/// `cargo test --test main harness_smoke:: -- --ignored`.
#[tokio::test]
#[ignore = "slow: starts, kills and restarts private servers"]
async fn private_servers_can_be_crashed_and_restarted() {
    let pg = PgServer::start(&[("max_slot_wal_keep_size", "64MB")]);
    let client = pg.client("postgres").await;
    client
        .batch_execute("CREATE TABLE t (id int); INSERT INTO t VALUES (1), (2);")
        .await
        .unwrap();
    pg.stop_immediate();
    let answered = client.query_one("SELECT 1", &[]).await;
    assert!(answered.is_err(), "a stopped server answered: {answered:?}");
    pg.start_again();
    let client = pg.client("postgres").await;
    let n: i64 = client
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 2, "committed rows survive a crash");
    let setting: String = client
        .query_one("SHOW max_slot_wal_keep_size", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(setting, "64MB");

    let rabbit = RabbitServer::start();
    let url = rabbit.url();
    let (exchange, queue) = (unique_name("crash_ex"), unique_name("crash_q"));
    declare_bound_queue(&url, &exchange, &queue, "#").await;
    common::amqp::publish_confirmed(&url, &exchange, "k", &[("m-1", b"x")]).await;
    rabbit.kill9();
    assert!(
        !common::port_is_open(rabbit.amqp_port()),
        "port {} still open after kill -9",
        rabbit.amqp_port()
    );
    rabbit.restart();
    assert_eq!(
        queue_message_count(&url, &queue).await,
        1,
        "a confirmed message survives"
    );
    let listed = rabbit.ctl(&["list_queues", "name", "messages"]);
    assert!(
        listed.status.success(),
        "rabbitmqctl list_queues: {listed:?}"
    );
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains(&queue),
        "{queue} is listed after the restart: {}",
        String::from_utf8_lossy(&listed.stdout)
    );
}

#[test]
fn test_decoding_lines_parse_into_transactions() {
    let lines = [
        (1, 700, "BEGIN 700"),
        (
            2,
            700,
            "table public.outbox: INSERT: id[uuid]:'a-1' event_type[text]:'it''s' \
             created_at[timestamp with time zone]:'2024-01-01 00:00:00+00'",
        ),
        (
            3,
            700,
            "table public.other: INSERT: v[text]:null id[integer]:7",
        ),
        (
            4,
            700,
            r#"message: transactional: 1 prefix: app:emit, sz: 24 content:{"v": 1, "id": "m-1"}"#,
        ),
        (4, 700, "COMMIT 700"),
        (5, 0, "message: transactional: 0 prefix: hb, sz: 0 content:"),
    ];
    let txns = parse_test_decoding(lines);
    assert_eq!(txns.len(), 1);
    assert_eq!(txns[0].xid, 700);
    assert_eq!(txns[0].end_lsn, 4);
    assert_eq!(txns[0].inserted_ids("public.outbox"), ["a-1"]);
    assert_eq!(txns[0].changes[1].id.as_deref(), Some("7"));
    assert_eq!(txns[0].message_ids("app:emit"), ["m-1"]);
    assert_eq!(
        txns[0].row_and_message_ids("public.outbox", "app:emit"),
        ["a-1", "m-1"]
    );
    assert_eq!(
        column_value("a[text]:'x y' b[text[]]:'{1}' c[int4]:5", "c").as_deref(),
        Some("5")
    );
    assert_eq!(
        column_value("a[text]:'it''s' b[int4]:1", "a").as_deref(),
        Some("it's")
    );
}

#[test]
fn lsns_and_urls_round_trip() {
    assert_eq!(parse_lsn("16/B374D848"), 0x16_B374_D848);
    assert_eq!(format_lsn(0x16_B374_D848), "16/B374D848");
    assert_eq!(
        replace_url_database("postgres://u:p@h:5433/old?sslmode=disable", "new"),
        "postgres://u:p@h:5433/new?sslmode=disable"
    );
    assert_eq!(
        replace_url_database("postgres://h", "new"),
        "postgres://h/new"
    );
    assert_eq!(
        url_port("amqp://guest:guest@127.0.0.1:5673/%2f"),
        Some(5673)
    );
}

#[test]
fn unique_names_are_lowercase_identifiers() {
    let a = unique_name("Outbox-Slot");
    let b = unique_name("Outbox-Slot");
    assert_ne!(a, b);
    for name in [a, b, unique_name(&"x".repeat(100)), unique_name("9lives")] {
        assert!(name.len() <= 63, "{name}");
        assert!(name.starts_with(|c: char| c.is_ascii_lowercase()), "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{name}"
        );
    }
}

/// The kit reads some of the relay's metrics without linking the relay: each name it reads
/// is the relay's own constant.
#[test]
fn the_metric_names_the_kit_reads_are_the_relays() {
    use outbox_relay::metrics as relay;
    let kit_and_relay = [
        (common::relay::SESSIONS, relay::SESSIONS_TOTAL),
        (common::relay::RECONNECTS, relay::RECONNECTS_TOTAL),
        (common::rabbit_cluster::BROKER_INFO, relay::BROKER_INFO),
        (common::faults::SLOT_POLLS_TOTAL, relay::SLOT_POLLS_TOTAL),
        (common::faults::SLOT_LAG_BYTES, relay::SLOT_LAG_BYTES),
        (
            common::faults::SLOT_RETAINED_WAL_BYTES,
            relay::SLOT_RETAINED_WAL_BYTES,
        ),
    ];
    for (kit, relay) in kit_and_relay {
        assert_eq!(kit, relay);
    }
}
