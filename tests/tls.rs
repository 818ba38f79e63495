//! TLS to PostgreSQL, on both of the relay's connections, as `sslmode` and `sslrootcert` in
//! the database URL ask. A private PostgreSQL with `ssl = on` and a certificate
//! for `localhost` signed by a CA made for this test (`common::tls`); a private RabbitMQ.
//!
//! The oracle for "this connection is encrypted" is PostgreSQL's own `pg_stat_ssl`, for
//! every backend the relay opened (the walsender included), read while it streams.

use outbox_testkit as common;

use std::time::Duration;

use common::outbox::Outbox;
use common::relay::SESSION_STARTED;
use common::tls::TestCerts;
use common::{Consumer, PgServer, RabbitServer, RelayProcess};

const MINUTE: Duration = Duration::from_secs(60);

/// `postgres://postgres@HOST:PORT/DB?QUERY` for the outbox's database.
fn url_with(outbox: &Outbox, host: &str, port: u16, query: &str) -> String {
    let db = outbox.db_url.rsplit('/').next().expect("database name");
    format!("postgres://postgres@{host}:{port}/{db}?{query}")
}

/// (encrypted, all, walsenders) among the relay's backends in the outbox's database (the
/// relay names its connections `outbox-relay`).
async fn relay_backends(outbox: &Outbox) -> (i64, i64, i64) {
    let row = outbox
        .client
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*), \
                    count(*) FILTER (WHERE a.backend_type = 'walsender') \
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = 'outbox-relay' AND a.datname = current_database()",
            &[],
        )
        .await
        .expect("read pg_stat_ssl");
    (row.get(0), row.get(1), row.get(2))
}

/// The relay delivers a row over `url`, and every connection it holds is encrypted.
async fn delivers_over_tls(outbox: &Outbox, consumer: &mut Consumer, url: &str) -> RelayProcess {
    let relay = outbox.spawn_relay_via(url, &outbox.amqp_url, &["--heartbeat-interval", "1s"]);
    assert!(
        relay.wait_for_log(SESSION_STARTED, MINUTE).await,
        "log:\n{}",
        relay.log()
    );
    let id = outbox.insert("TlsEvent", r#"{"tls": true}"#).await;
    let before = consumer.received().len();
    let received = consumer.wait_for(before + 1, MINUTE).await;
    assert_eq!(
        received.last().and_then(|r| r.message_id.as_deref()),
        Some(id.as_str()),
        "log:\n{}",
        relay.log()
    );
    // The heartbeat connection is open once a heartbeat came back; the walsender streams.
    let deadline = tokio::time::Instant::now() + MINUTE;
    let (encrypted, all, walsenders) = loop {
        let counts = relay_backends(outbox).await;
        if (counts.1 >= 2 && counts.2 == 1) || tokio::time::Instant::now() >= deadline {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(walsenders, 1, "the replication connection is there");
    assert!(all >= 2, "an ordinary connection is there too ({all})");
    assert_eq!(encrypted, all, "every relay connection uses TLS");
    relay
}

/// The relay refuses to start over `url`, with an error containing every one of `expected`.
async fn fails_clearly(outbox: &Outbox, url: &str, expected: &[&str]) {
    let relay = outbox.spawn_relay_via(url, &outbox.amqp_url, &[]);
    let status = relay
        .wait_exit(MINUTE)
        .await
        .unwrap_or_else(|| panic!("the relay should stop; log:\n{}", relay.log()));
    let log = relay.log();
    assert!(!status.success(), "log:\n{log}");
    for needle in expected {
        assert!(log.contains(needle), "{needle:?} missing in:\n{log}");
    }
    println!("{url}:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tls_follows_sslmode_and_sslrootcert_on_both_connections() {
    let certs = TestCerts::generate("postgres");
    let rabbit = tokio::task::spawn_blocking(RabbitServer::start);
    let pg = PgServer::start(&[
        ("ssl", "on"),
        ("ssl_cert_file", certs.server_cert.to_str().expect("utf-8")),
        ("ssl_key_file", certs.server_key.to_str().expect("utf-8")),
    ]);
    let rabbit = rabbit.await.expect("rabbitmq starts");
    let outbox = Outbox::on(&pg.url("postgres"), &rabbit.url(), "tls").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let port = pg.port();
    let ca = certs.ca.to_str().expect("utf-8");
    let wrong_ca = certs.wrong_ca.to_str().expect("utf-8");

    // verify-full with the CA that signed the server's certificate, by its name.
    let url = url_with(
        &outbox,
        "localhost",
        port,
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let relay = delivers_over_tls(&outbox, &mut consumer, &url).await;
    relay.stop().await;

    // verify-full with a CA that did not sign it: a definite error naming the fix.
    let url = url_with(
        &outbox,
        "localhost",
        port,
        &format!("sslmode=verify-full&sslrootcert={wrong_ca}"),
    );
    fails_clearly(
        &outbox,
        &url,
        &["Cannot set up TLS with PostgreSQL", "sslrootcert"],
    )
    .await;

    // verify-full by IP address: the certificate names a host, so say what to do.
    let url = url_with(
        &outbox,
        "127.0.0.1",
        port,
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    fails_clearly(
        &outbox,
        &url,
        &["Cannot set up TLS with PostgreSQL", "IP address"],
    )
    .await;

    // require: encrypted, without a CA to verify against.
    let url = url_with(&outbox, "127.0.0.1", port, "sslmode=require");
    let relay = delivers_over_tls(&outbox, &mut consumer, &url).await;
    relay.stop().await;

    // Polling mode with --listen: the LISTEN connection is encrypted too (it once bypassed
    // the TLS policy and went out in plain text).
    let polled = Outbox::on_poll(&pg.url("postgres"), &rabbit.url(), "tlspoll").await;
    let url = url_with(
        &polled,
        "localhost",
        port,
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let relay = polled.spawn(
        "poll",
        (&url, &polled.amqp_url),
        &["--listen", "--workers", "1"],
        &[],
    );
    assert!(
        relay
            .wait_for_log("listening for notifications", MINUTE)
            .await,
        "log:\n{}",
        relay.log()
    );
    let deadline = tokio::time::Instant::now() + MINUTE;
    let (encrypted, all, _) = loop {
        let counts = relay_backends(&polled).await;
        if counts.1 >= 2 || tokio::time::Instant::now() >= deadline {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        all >= 2,
        "the worker's and the listener's connections ({all})"
    );
    assert_eq!(
        encrypted, all,
        "every polling connection uses TLS, LISTEN's too"
    );
    relay.stop().await;

    // disable: the server allows plain connections too, and the relay uses one.
    let url = url_with(&outbox, "127.0.0.1", port, "sslmode=disable");
    let relay = outbox.spawn_relay_via(&url, &outbox.amqp_url, &[]);
    assert!(
        relay.wait_for_log(SESSION_STARTED, MINUTE).await,
        "log:\n{}",
        relay.log()
    );
    let (encrypted, _, walsenders) = relay_backends(&outbox).await;
    assert_eq!((encrypted, walsenders), (0, 1));
    relay.stop().await;
    drop(certs);
}

/// `amqps://` to a RabbitMQ node with a TLS listener and a certificate from a private CA:
/// trusted through `SSL_CERT_FILE` (lapin's rustls verifier reads the system store, which
/// that variable replaces), refused without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_a_private_ca_named_by_ssl_cert_file() {
    let certs = TestCerts::generate("rabbitmq");
    let tls_port = common::free_port();
    let path = |p: &std::path::Path| p.to_str().expect("utf-8").to_string();
    let conf = [
        format!("listeners.ssl.default = 127.0.0.1:{tls_port}"),
        format!("ssl_options.cacertfile = {}", path(&certs.ca)),
        format!("ssl_options.certfile = {}", path(&certs.server_cert)),
        format!("ssl_options.keyfile = {}", path(&certs.server_key)),
        "ssl_options.verify = verify_none".to_string(),
        "ssl_options.fail_if_no_peer_cert = false".to_string(),
    ];
    let rabbit = tokio::task::spawn_blocking(move || {
        let conf: Vec<&str> = conf.iter().map(String::as_str).collect();
        RabbitServer::start_with_config(&conf)
    });
    let pg = PgServer::start(&[]);
    let rabbit = rabbit.await.expect("rabbitmq starts");
    let outbox = Outbox::on(&pg.url("postgres"), &rabbit.url(), "amqps").await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let amqps = format!("amqps://guest:guest@localhost:{tls_port}/%2f");
    let args = |url: &str| -> Vec<String> {
        [
            "run",
            "--database-url",
            &outbox.db_url,
            "--amqp-url",
            url,
            "--slot",
            &outbox.slot,
            "--exchange",
            &outbox.exchange,
            "--metrics-addr",
            "off",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let spawn = |env: &[(&str, &str)]| {
        let args = args(&amqps);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut env = env.to_vec();
        env.push(("RUST_LOG", "info,outbox_relay=debug"));
        RelayProcess::spawn(&args, &env)
    };

    // Without the CA the broker's certificate is not trusted: the relay says so and retries.
    let relay = spawn(&[("SSL_CERT_FILE", &path(&certs.wrong_ca))]);
    assert!(
        relay.wait_for_log("session failed", MINUTE).await,
        "log:\n{}",
        relay.log()
    );
    assert!(
        relay.log().contains("certificate"),
        "the error names the certificate problem; log:\n{}",
        relay.log()
    );
    assert!(
        relay.log().contains("Cannot reach RabbitMQ at") && relay.log().contains("SSL_CERT_FILE"),
        "the error names the node, and the fix the CA file; log:\n{}",
        relay.log()
    );
    relay.kill9();

    let relay = spawn(&[("SSL_CERT_FILE", &path(&certs.ca))]);
    assert!(
        relay.wait_for_log(SESSION_STARTED, MINUTE).await,
        "log:\n{}",
        relay.log()
    );
    let id = outbox.insert("AmqpsEvent", "{}").await;
    let received = consumer.wait_for(1, MINUTE).await;
    assert_eq!(received[0].message_id.as_deref(), Some(id.as_str()));
    // The broker's view: a TLS connection on the TLS listener (only the relay uses it).
    let out = tokio::task::block_in_place(|| {
        rabbit.ctl(&[
            "-q",
            "--no-table-headers",
            "list_connections",
            "port",
            "ssl",
        ])
    });
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let on_tls_port: Vec<Vec<&str>> = listing
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|fields| fields.first() == Some(&tls_port.to_string().as_str()))
        .collect();
    assert_eq!(
        on_tls_port,
        [[tls_port.to_string().as_str(), "true"]],
        "{listing}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    relay.stop().await;
}
