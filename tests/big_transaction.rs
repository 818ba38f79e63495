//! One transaction far larger than the relay's memory streams through it, and its commit is
//! acknowledged only once every row is confirmed. On a PostgreSQL of its own, so the WAL
//! around the big commit is quiet and the other tests' server does not write 200 MiB.
//!
//! `OUTBOX_TEST_BIG_ROWS` sets the size: 200,000 rows of ~1 KiB (about 200 MiB) by default,
//! to keep the suite within its budget; the 1,000,000 rows (about 1 GiB) with
//! `OUTBOX_TEST_BIG_ROWS=1000000` (measured: see crates/outbox-bench/lab/scenarios.md).

use outbox_testkit as common;

use std::time::Duration;

use common::outbox::Outbox;
use common::{current_wal_lsn, queue_message_count};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn million_row_transaction_streams_in_bounded_memory() {
    let rows: u64 = std::env::var("OUTBOX_TEST_BIG_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let pg = common::PgServer::start(&[]);
    let outbox = Outbox::on(&pg.url("postgres"), &common::services().rabbit.url(), "big").await;
    let relay = outbox.spawn_relay(&[]);

    let mut client = common::pg_connect(&outbox.db_url).await;
    let txn = client.transaction().await.expect("begin");
    txn.execute(
        "INSERT INTO outbox (event_type, payload)
         SELECT 'Big', jsonb_build_object('n', g, 'pad', repeat('x', 1000))
         FROM generate_series(1, $1::bigint) g",
        &[&(rows as i64)],
    )
    .await
    .expect("insert");
    let before_commit = common::parse_lsn(
        txn.query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .expect("lsn")
            .get(0),
    );
    txn.commit().await.expect("commit");
    let after_commit = current_wal_lsn(&client).await;
    println!("committed {rows} rows; commit record between {before_commit:X} and {after_commit:X}");

    // Sample the slot while the relay works: until it passes the commit, the transaction is
    // not acknowledged; once it has, every row must already be in the queue (confirmed).
    let started = std::time::Instant::now();
    // VmHWM, the process's high-water mark: None once it has exited (a read of nothing must
    // not pass as a small peak).
    let mut peak_rss_kib: Option<u64> = None;
    let sample = |peak: &mut Option<u64>| {
        if let Some(now) = relay.peak_rss_kib() {
            *peak = Some(peak.map_or(now, |p| p.max(now)));
        }
    };
    let deadline = started + Duration::from_secs(900);
    loop {
        sample(&mut peak_rss_kib);
        let flushed = outbox.confirmed_flush().await;
        if flushed >= after_commit {
            let depth = queue_message_count(&outbox.amqp_url, &outbox.queue).await;
            assert_eq!(
                u64::from(depth),
                rows,
                "the commit was acknowledged (confirmed_flush {flushed:X}) with {depth} of {rows} rows in the queue"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not acknowledged within the deadline; log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();
    sample(&mut peak_rss_kib);
    let peak_rss_kib = peak_rss_kib
        .unwrap_or_else(|| panic!("no RSS sample of the relay was read; log:\n{}", relay.log()));
    println!(
        "{rows} rows delivered in {:.1} s ({:.0} rows/s); relay peak RSS {} MiB",
        elapsed.as_secs_f64(),
        rows as f64 / elapsed.as_secs_f64(),
        peak_rss_kib / 1024
    );
    assert!(
        !relay.log().contains("session failed"),
        "no failure, so no replay: the queue depth counts distinct rows; log:\n{}",
        relay.log()
    );
    // A property bound with a wide margin: the transaction is about 1 KiB × rows, the relay
    // holds at most max_in_flight messages of it; a quarter of the transaction (at most
    // 256 MiB) is far above what streaming needs and far below buffering it whole.
    let bound_kib = (rows / 4).min(256 * 1024);
    assert!(
        peak_rss_kib < bound_kib,
        "peak RSS {peak_rss_kib} KiB over {bound_kib} KiB: the relay must not buffer the transaction"
    );
}
