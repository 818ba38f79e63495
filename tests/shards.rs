//! Sharded relays, against a real PostgreSQL and RabbitMQ: `setup --shards N`,
//! one relay per shard on row-filtered publications, per-aggregate order, the row-filter
//! check, a standby per shard, cleanup per shard and `teardown --shards N`.
//!
//! Oracles come from outside the relay: the catalog (`pg_publication`,
//! `pg_publication_tables`, `pg_replication_slots`), each row's shard computed by the test in
//! SQL with the documented expression, commit order from a `test_decoding` slot created
//! before the writers start, and the queues themselves (each shard's relay publishes to an
//! exchange of its own, so a queue shows exactly what one relay delivered).

use outbox_relay::metrics::{MESSAGES_CONFIRMED_TOTAL, SHARD_LABEL};
use outbox_testkit as common;
use outbox_testkit::output_text as text;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::faults::{
    assert_nothing_lost_or_invented, relay_crash_duplicate_bound, settled, wait_for_ids, Oracle,
    Tally, Upto, Writers,
};
use common::http::{metric_value, readyz, wait_metrics, wait_ready, wait_readyz};
use common::outbox::Outbox;
use common::pg::first_column;
use common::relay::{final_error, TEST_LOG};
use common::{
    create_test_decoding_slot, declare_bound_queue, free_port, pg_connect, read_test_decoding,
    services, Consumer, RelayProcess,
};
use lapin::types::FieldTable;
use tokio_postgres::Client;

const OUTBOX: &str = "public.outbox";

/// A row's shard of `shards`, as anyone can compute it (docs/scaling.md, "Scaling out"):
/// written out here, not taken from the relay.
fn shard_sql(shards: u32) -> String {
    format!(
        "((CASE WHEN aggregate_id IS NOT NULL THEN hashtext(aggregate_id) ELSE uuid_hash(id) \
         END) & 2147483647) % {shards}"
    )
}

/// An outbox provisioned with `setup --shards <shards>`.
async fn sharded_outbox(prefix: &str, shards: u32) -> Outbox {
    let s = services();
    let count = shards.to_string();
    let setup = ["setup", "--shards", count.as_str()];
    Outbox::provision(
        &s.pg.url("postgres"),
        &s.rabbit.url(),
        prefix,
        &setup,
        FieldTable::default(),
    )
    .await
}

/// Starts `run --shards <shards> --shard <shard>` publishing to `exchange`, with `extra`.
fn spawn_shard(
    outbox: &Outbox,
    shards: u32,
    shard: u32,
    exchange: &str,
    extra: &[&str],
) -> RelayProcess {
    let (shards, shard) = (shards.to_string(), shard.to_string());
    let mut args = vec![
        "run",
        "--database-url",
        outbox.db_url.as_str(),
        "--amqp-url",
        outbox.amqp_url.as_str(),
        "--slot",
        outbox.slot.as_str(),
        "--exchange",
        exchange,
        "--shards",
        shards.as_str(),
        "--shard",
        shard.as_str(),
    ];
    args.extend_from_slice(extra);
    RelayProcess::spawn(&args, &[TEST_LOG])
}

/// An exchange and a queue bound to it with `#`, for one shard's relay.
async fn shard_exchange(outbox: &Outbox, shard: u32) -> (String, String) {
    let exchange = format!("{}_{shard}", outbox.exchange);
    let queue = format!("{}_{shard}", outbox.queue);
    common::amqp::declare_exchange(&outbox.amqp_url, &exchange).await;
    declare_bound_queue(&outbox.amqp_url, &exchange, &queue, "#").await;
    (exchange, queue)
}

/// `writers` connections insert `total` rows between them in transactions of 1 to 4 rows,
/// each row of one of `aggregates` aggregates (`agg-<n>`) or, one row in ten, of none.
/// Returns every row written as (id, aggregate_id).
async fn write_aggregates(
    db_url: &str,
    writers: usize,
    total: usize,
    aggregates: u64,
) -> Vec<(String, Option<String>)> {
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let share = total / writers + usize::from(writer < total % writers);
        let db_url = db_url.to_string();
        tasks.push(tokio::spawn(async move {
            let mut client = pg_connect(&db_url).await;
            let mut seed = writer as u64 * 7919 + 17;
            let mut next = move || {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                seed >> 33
            };
            let mut rows = Vec::with_capacity(share);
            let mut written = 0;
            while written < share {
                let size = (1 + next() as usize % 4).min(share - written);
                let txn = client.transaction().await.expect("begin");
                for _ in 0..size {
                    // Two draws: `r % aggregates` of an `r` already known not to be a multiple
                    // of ten would never pick `agg-0`, `agg-10`, ….
                    let without = next() % 10 == 0;
                    let aggregate = (!without).then(|| format!("agg-{}", next() % aggregates));
                    let payload = format!(r#"{{"writer": {writer}, "n": {written}}}"#);
                    let row = txn
                        .query_one(
                            "INSERT INTO outbox (event_type, payload, aggregate_id) \
                             VALUES ('TestEvent', $1::text::jsonb, $2) RETURNING id::text",
                            &[&payload, &aggregate],
                        )
                        .await
                        .expect("insert");
                    rows.push((row.get(0), aggregate));
                    written += 1;
                }
                txn.commit().await.expect("commit");
            }
            rows
        }));
    }
    let mut rows = Vec::with_capacity(total);
    for task in tasks {
        rows.extend(task.await.expect("writer task"));
    }
    rows
}

/// The shard of `shards` of each row in `rows` (id, aggregate_id), computed by PostgreSQL
/// from the values alone: for rows that may have been deleted since.
async fn shards_of(
    client: &Client,
    rows: &[(String, Option<String>)],
    shards: u32,
) -> HashMap<String, u32> {
    let (ids, aggregates): (Vec<&str>, Vec<Option<&str>>) = rows
        .iter()
        .map(|(id, aggregate)| (id.as_str(), aggregate.as_deref()))
        .unzip();
    let sql = format!(
        "SELECT id::text, ({})::int4 \
         FROM unnest($1::text[]::uuid[], $2::text[]) AS outbox(id, aggregate_id)",
        shard_sql(shards)
    );
    let found = client
        .query(&sql, &[&ids, &aggregates])
        .await
        .expect("compute the shards");
    found
        .iter()
        .map(|row| (row.get(0), row.get::<_, i32>(1) as u32))
        .collect()
}

/// Every row of the table: id -> (aggregate_id, shard of `shards`).
async fn rows_by_id(client: &Client, shards: u32) -> HashMap<String, (Option<String>, u32)> {
    let sql = format!(
        "SELECT id::text, aggregate_id, ({})::int4 FROM outbox",
        shard_sql(shards)
    );
    let rows = client.query(&sql, &[]).await.expect("read the outbox");
    rows.iter()
        .map(|row| {
            let shard: i32 = row.get(2);
            (row.get(0), (row.get(1), shard as u32))
        })
        .collect()
}

/// Aggregate ids `agg-<n>` that fall into `shard` of `shards`, computed by PostgreSQL.
async fn aggregates_of_shard(client: &Client, shards: u32, shard: u32, n: i64) -> Vec<String> {
    let sql = format!(
        "SELECT a FROM (SELECT 'agg-' || g AS a FROM generate_series(1, 1000) g) s \
         WHERE (hashtext(a) & 2147483647) % {shards} = {shard} ORDER BY a LIMIT {n}"
    );
    first_column(client, &sql, &[]).await
}

/// Inserts one row of `aggregate` in its own transaction; returns its id.
async fn insert_for(client: &Client, event_type: &str, aggregate: &str) -> String {
    let row = client
        .query_one(
            "INSERT INTO outbox (event_type, payload, aggregate_id) \
             VALUES ($1, '{}', $2) RETURNING id::text",
            &[&event_type, &aggregate],
        )
        .await
        .expect("insert");
    row.get(0)
}

/// The shard of `shards` that outbox row `id` falls to.
async fn shard_of_row(client: &Client, shards: u32, id: &str) -> u32 {
    let sql = format!(
        "SELECT {} FROM outbox WHERE id = $1::text::uuid",
        shard_sql(shards)
    );
    let shard: i32 = value_with(client, &sql, &[&id]).await;
    shard as u32
}

/// One row per shard but `skip`, each committed on its own after the call: (shard, id).
/// Rows that fall to `skip` on the way are ordinary rows of that shard.
async fn probes_after(client: &Client, shards: u32, skip: u32) -> Vec<(u32, String)> {
    let mut probes: Vec<(u32, String)> = Vec::new();
    for n in 0.. {
        let id = insert_for(client, "Probe", &format!("probe-{n}")).await;
        let shard = shard_of_row(client, shards, &id).await;
        if shard != skip && probes.iter().all(|(s, _)| *s != shard) {
            probes.push((shard, id));
        }
        if probes.len() + 1 == shards as usize {
            break;
        }
    }
    probes
}

/// [`Upto::Slots`] for shard slots `shards` of `slot` (as `setup --shards` names them).
fn shard_slots<'a>(
    client: &'a Client,
    slot: &str,
    shards: impl IntoIterator<Item = u32>,
) -> Upto<'a> {
    Upto::Slots(
        client,
        shards.into_iter().map(|k| format!("{slot}_{k}")).collect(),
    )
}

fn ids(received: &[common::Received]) -> Vec<String> {
    received
        .iter()
        .map(|r| {
            r.message_id
                .clone()
                .expect("every message has a message_id")
        })
        .collect()
}

/// The pgoutput slots whose names start with `prefix`, as `name plugin`, sorted.
async fn slot_names(client: &Client, prefix: &str) -> Vec<String> {
    let sql = "SELECT slot_name::text || ' ' || plugin FROM pg_replication_slots \
               WHERE slot_name LIKE $1 || '%' AND plugin = 'pgoutput' ORDER BY 1";
    first_column(client, sql, &[&prefix]).await
}

/// `ids` grouped by aggregate (rows without one left out), each group in `ids`' order.
fn per_aggregate<'a>(
    ids: &'a [String],
    rows: &'a HashMap<String, (Option<String>, u32)>,
) -> HashMap<&'a str, Vec<&'a str>> {
    let mut by: HashMap<&str, Vec<&str>> = HashMap::new();
    for id in ids {
        if let Some(aggregate) = &rows[id.as_str()].0 {
            by.entry(aggregate.as_str()).or_default().push(id.as_str());
        }
    }
    by
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_with_three_shards_creates_filtered_publications_and_slots_and_teardown_drops_them() {
    let outbox = sharded_outbox("shards_setup", 3).await;
    let client = &outbox.client;

    // Three insert-only publications on the outbox, each with its shard's filter...
    let publications = client
        .query(
            "SELECT p.pubname::text, p.pubinsert, p.pubupdate OR p.pubdelete OR p.pubtruncate, \
                    t.rowfilter \
             FROM pg_publication p \
             JOIN pg_publication_tables t ON t.pubname = p.pubname \
             WHERE t.schemaname = 'public' AND t.tablename = 'outbox' ORDER BY 1",
            &[],
        )
        .await
        .expect("read pg_publication");
    let found: Vec<(String, bool, bool)> = publications
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    let expected: Vec<(String, bool, bool)> = (0..3)
        .map(|k| (format!("outbox_pub_{k}"), true, false))
        .collect();
    assert_eq!(found, expected, "no unsharded outbox_pub, only the shards'");
    for (k, row) in publications.iter().enumerate() {
        let filter: String = row.get(3);
        let filter = filter.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            filter.contains("hashtext(aggregate_id)")
                && filter.contains("uuid_hash(id)")
                && filter.contains("& 2147483647)")
                && filter.ends_with(&format!("% 3) = {k})")),
            "shard {k}: {filter}"
        );
    }
    // ...which split the rows as the documented expression does: each row passes exactly
    // its own shard's filter (PostgreSQL evaluates the stored filters here).
    write_aggregates(&outbox.db_url, 2, 300, 40).await;
    for (k, row) in publications.iter().enumerate() {
        let filter: String = row.get(3);
        let sql = format!(
            "SELECT count(*) FILTER (WHERE {filter}), \
                    count(*) FILTER (WHERE ({}) = {k}) FROM outbox",
            shard_sql(3)
        );
        let counts = client.query_one(&sql, &[]).await.expect("count");
        let (by_filter, by_expression): (i64, i64) = (counts.get(0), counts.get(1));
        assert_eq!(by_filter, by_expression, "shard {k}");
        assert!(by_filter > 0, "shard {k} has rows");
    }

    // Three pgoutput slots, named after --slot.
    let slots: Vec<String> = (0..3)
        .map(|k| format!("{}_{k} pgoutput", outbox.slot))
        .collect();
    assert_eq!(slot_names(client, &outbox.slot).await, slots);

    // A second run changes nothing.
    let again = outbox.run_command(&["setup", "--shards", "3"]);
    assert!(again.status.success(), "{}", text(&again));
    assert_eq!(
        text(&again).matches(": exists").count(),
        7,
        "table, 3 publications, 3 slots: {}",
        text(&again)
    );
    // Setup for another number of shards refuses the existing publications and creates
    // nothing.
    let four = outbox.run_command(&["setup", "--shards", "4"]);
    assert!(!four.status.success(), "{}", text(&four));
    assert!(
        text(&four).contains("\"outbox_pub_0\" has the row filter")
            && text(&four).contains("% 4 = 0"),
        "{}",
        text(&four)
    );
    assert_eq!(
        slot_names(client, &outbox.slot).await,
        slots,
        "no slot added"
    );

    // --print-sql renders the same, without connecting.
    let print = common::relay::binary();
    let sql = std::process::Command::new(print)
        .args(["setup", "--print-sql", "--shards", "3"])
        .output()
        .expect("print-sql");
    let sql = String::from_utf8_lossy(&sql.stdout);
    assert!(
        sql.contains(&format!(
            "CREATE PUBLICATION \"outbox_pub_2\" FOR TABLE \"public\".\"outbox\" WHERE ({} = 2) \
             WITH (publish = 'insert');",
            shard_sql(3)
        )),
        "{sql}"
    );

    // status --shards 3 reads every shard's slot.
    let status = outbox.run_command(&["status", "--shards", "3", "--json"]);
    assert!(status.status.success(), "{}", text(&status));
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).expect("JSON");
    let listed: Vec<String> = json["shards"]
        .as_array()
        .expect("a shards array")
        .iter()
        .map(|s| format!("{} {}", s["slot"], s["slot_state"]))
        .collect();
    let expected: Vec<String> = (0..3)
        .map(|k| format!("\"{}_{k}\" \"ok\"", outbox.slot))
        .collect();
    assert_eq!(listed, expected, "{json}");

    // teardown --shards 3 drops every slot and every publication.
    let teardown = outbox.run_command(&["teardown", "--yes", "--shards", "3"]);
    assert!(teardown.status.success(), "{}", text(&teardown));
    let slots = slot_names(client, &outbox.slot).await;
    assert!(
        slots.is_empty(),
        "teardown --shards 3 left slots {slots:?}: {}",
        text(&teardown)
    );
    let left: i64 = common::pg::query_value(client, "SELECT count(*) FROM pg_publication").await;
    assert_eq!(left, 0, "{}", text(&teardown));
    // ...which status, the probe, reports with its unhealthy exit code.
    let status = outbox.run_command(&["status", "--shards", "3"]);
    assert_eq!(
        status.status.code(),
        Some(i32::from(outbox_relay::exit::UNHEALTHY)),
        "{}",
        text(&status)
    );
    assert!(
        text(&status).contains(&format!("2: {}_2 MISSING", outbox.slot)),
        "{}",
        text(&status)
    );
}

/// 4 shards, 4 relays, 50,000 rows from 8 writers over 500
/// aggregates (one row in ten without one), written while the relays stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_relays_deliver_50_000_rows_once_each_aggregate_in_commit_order() {
    const SHARDS: u32 = 4;
    const ROWS: usize = 50_000;
    let outbox = sharded_outbox("shards_order", SHARDS).await;
    let oracle = format!("{}_oracle", outbox.slot);
    create_test_decoding_slot(&outbox.client, &oracle).await;
    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let mut consumers = Vec::new();
    let mut relays = Vec::new();
    for k in 0..SHARDS {
        let (exchange, queue) = shard_exchange(&outbox, k).await;
        consumers.push(Consumer::start(&outbox.amqp_url, &queue).await);
        let metrics = if k == 1 { metrics_addr.as_str() } else { "off" };
        relays.push(spawn_shard(
            &outbox,
            SHARDS,
            k,
            &exchange,
            &["--metrics-addr", metrics],
        ));
    }

    // Writers run while the relays stream.
    let started = std::time::Instant::now();
    write_aggregates(&outbox.db_url, 8, ROWS, 500).await;
    let written = started.elapsed();
    let rows = rows_by_id(&outbox.client, SHARDS).await;
    assert_eq!(rows.len(), ROWS);
    let commit_order: Vec<String> = read_test_decoding(&outbox.client, &oracle)
        .await
        .iter()
        .flat_map(|txn| txn.inserted_ids(OUTBOX))
        .collect();
    assert_eq!(commit_order.len(), rows.len(), "the oracle saw every row");

    let mut delivered = HashSet::new();
    let mut per_shard = Vec::new();
    for (k, consumer) in consumers.iter_mut().enumerate() {
        let k = k as u32;
        // This shard's rows in commit order: what its relay must deliver, exactly that.
        let expected: Vec<String> = commit_order
            .iter()
            .filter(|id| rows[id.as_str()].1 == k)
            .cloned()
            .collect();
        consumer
            .wait_for(expected.len(), Duration::from_secs(180))
            .await;
        let queue = format!("{}_{k}", outbox.queue);
        let upto = shard_slots(&outbox.client, &outbox.slot, [k]);
        let log = || relays[k as usize].log();
        let received = settled(consumer, &outbox.amqp_url, &queue, upto, log).await;
        let got = ids(received);
        per_shard.push(got.len());
        assert_eq!(
            got.len(),
            expected.len(),
            "shard {k}: each of its rows exactly once; log:\n{}",
            relays[k as usize].log()
        );
        // Per aggregate, the commit order (the contract)...
        assert_eq!(
            per_aggregate(&got, &rows),
            per_aggregate(&expected, &rows),
            "shard {k}: each aggregate's events in commit order"
        );
        // ...and, with nothing failing, the whole shard's commit order.
        assert_eq!(got, expected, "shard {k}: commit order");
        let aggregate_header = received
            .iter()
            .filter_map(|r| r.header_str("x-aggregate-id"))
            .count();
        assert!(aggregate_header > 0, "rows carry their aggregate");
        delivered.extend(got);
    }
    assert_eq!(delivered.len(), rows.len(), "no row twice across shards");
    // Every shard's last row has arrived and its slot has passed the WAL end.
    let settled_after = started.elapsed();

    // Every shard's slot reaches the last commit: one with few rows does not pin WAL.
    let last_commit = read_test_decoding(&outbox.client, &oracle)
        .await
        .last()
        .expect("transactions")
        .end_lsn;
    for k in 0..SHARDS {
        let slot = format!("{}_{k}", outbox.slot);
        assert!(
            eventually(Duration::from_secs(30), || async {
                common::slot_confirmed_flush(&outbox.client, &slot).await >= last_commit
            })
            .await,
            "{slot} acknowledges up to the last commit; log:\n{}",
            relays[k as usize].log()
        );
    }

    // Rows without an aggregate spread over the shards by their id.
    let null_shards: HashSet<u32> = rows
        .values()
        .filter(|r| r.0.is_none())
        .map(|r| r.1)
        .collect();
    assert_eq!(null_shards.len(), SHARDS as usize, "{null_shards:?}");

    // Every metric of a sharded relay carries its shard.
    let confirmed = &common::http::series(MESSAGES_CONFIRMED_TOTAL, &[(SHARD_LABEL, "1")]);
    let expected_1 = rows.values().filter(|r| r.1 == 1).count() as f64;
    let metrics = wait_metrics(metrics_port, Duration::from_secs(10), |m| {
        metric_value(m, confirmed).is_some_and(|v| v >= expected_1)
    })
    .await;
    assert!(
        metric_value(&metrics, confirmed).is_some_and(|v| v >= expected_1),
        "{metrics}"
    );
    let unlabelled: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with("outbox_relay_") || line.starts_with("process_"))
        .filter(|line| !line.contains(r#"shard="1""#))
        .collect();
    assert!(unlabelled.is_empty(), "{unlabelled:?}");
    for relay in &relays {
        relay.stop().await;
    }
    let aggregates: HashSet<&str> = rows.values().filter_map(|r| r.0.as_deref()).collect();
    assert_eq!(aggregates.len(), 500, "every aggregate written to");
    common::faults::report(
        "shards-order",
        &[
            ("rows", ROWS.to_string()),
            ("aggregates", aggregates.len().to_string()),
            (
                "without aggregate",
                (ROWS - rows.values().filter(|r| r.0.is_some()).count()).to_string(),
            ),
            ("rows per shard", format!("{per_shard:?}")),
            ("written in", common::faults::secs(written)),
            (
                "all delivered and settled after",
                common::faults::secs(settled_after),
            ),
        ],
    );
}

/// `--shards 3 --shard 1` against publications made for 4 shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_shards_differ_from_its_publication_refuses_to_start() {
    let outbox = sharded_outbox("shards_wrong", 4).await;
    let stopped = |relay: RelayProcess| async move {
        let status = relay.wait_exit(Duration::from_secs(30)).await;
        assert!(
            status.is_some_and(|s| !s.success()),
            "{status:?}; log:\n{}",
            relay.log()
        );
        final_error(&relay.log()).unwrap_or_default().to_string()
    };

    // --shards 3 against publications made for 4: the error names both filters, the one
    // found (`% 4) = 1`) and the one expected (`% 3 = 1`), and so both shard counts.
    let e = stopped(spawn_shard(&outbox, 3, 1, &outbox.exchange, &[])).await;
    assert!(
        e.contains("The publication \"outbox_pub_1\" has the row filter")
            && e.contains("% 4) = 1)")
            && e.contains("shard 1 of --shards 3")
            && e.contains(&format!("{} = 1", shard_sql(3)))
            && e.contains("Fix:"),
        "{e}"
    );
    // Nothing streamed from this outbox's slots (other tests share the server).
    let active: i64 = value_with(
        &outbox.client,
        "SELECT count(*) FROM pg_replication_slots WHERE active AND slot_name LIKE $1 || '\\_%'",
        &[&outbox.slot],
    )
    .await;
    assert_eq!(active, 0);

    // A publication without a filter is refused too.
    outbox
        .client
        .batch_execute("CREATE PUBLICATION plain_0 FOR TABLE outbox WITH (publish = 'insert')")
        .await
        .expect("publication");
    let relay = spawn_shard(&outbox, 4, 0, &outbox.exchange, &["--publication", "plain"]);
    let e = stopped(relay).await;
    assert!(e.contains("\"plain_0\" has no row filter"), "{e}");

    // A shard beyond the count is a configuration error.
    let e = stopped(spawn_shard(&outbox, 4, 4, &outbox.exchange, &[])).await;
    assert!(e.contains("--shard is 4 but --shards is 4"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_shard_one_streams_the_other_waits_and_takes_over() {
    let outbox = sharded_outbox("shards_standby", 2).await;
    let (exchange, queue) = shard_exchange(&outbox, 1).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &queue).await;
    let aggregates = aggregates_of_shard(&outbox.client, 2, 1, 3).await;
    let other = aggregates_of_shard(&outbox.client, 2, 0, 1).await;

    let (first_port, second_port) = (free_port(), free_port());
    let addr = |port: u16| format!("127.0.0.1:{port}");
    let first_addr = addr(first_port);
    let first = spawn_shard(&outbox, 2, 1, &exchange, &["--metrics-addr", &first_addr]);
    assert!(
        wait_ready(first_port, Duration::from_secs(30)).await,
        "{}",
        first.log()
    );
    let second_addr = addr(second_port);
    let second = spawn_shard(&outbox, 2, 1, &exchange, &["--metrics-addr", &second_addr]);
    assert_eq!(
        wait_readyz(second_port, Duration::from_secs(30), (503, "standby")).await,
        Some((503, "standby".to_string())),
        "{}",
        second.log()
    );

    let mut wanted = Vec::new();
    for aggregate in &aggregates {
        wanted.push(insert_for(&outbox.client, "Before", aggregate).await);
    }
    insert_for(&outbox.client, "OtherShard", &other[0]).await;
    let received = consumer
        .wait_for(wanted.len(), Duration::from_secs(30))
        .await;
    assert_eq!(ids(received), wanted, "{}", first.log());

    // The streaming relay stops; its standby takes the shard over.
    first.stop().await;
    assert!(
        wait_ready(second_port, Duration::from_secs(30)).await,
        "{:?}; log:\n{}",
        readyz(second_port).await,
        second.log()
    );
    for aggregate in &aggregates {
        wanted.push(insert_for(&outbox.client, "After", aggregate).await);
    }
    consumer
        .wait_for(wanted.len(), Duration::from_secs(30))
        .await;
    let upto = shard_slots(&outbox.client, &outbox.slot, [1]);
    let log = || second.log();
    let received = settled(&mut consumer, &outbox.amqp_url, &queue, upto, log).await;
    assert_eq!(
        ids(received),
        wanted,
        "shard 1's rows once each, none of shard 0's; log:\n{}",
        second.log()
    );
    second.stop().await;
}

/// Cleanup with 4 shards, one of them stopped. The running relays
/// delete their own delivered rows past the retention; the stopped shard's rows newer than
/// its acknowledged commit all stay, however long the others run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_with_one_of_four_shards_stopped_keeps_its_unacknowledged_rows() {
    const SHARDS: u32 = 4;
    const STOPPED: u32 = 3;
    let outbox = sharded_outbox("shards_cleanup", SHARDS).await;
    let oracle = Oracle::create(&outbox).await;
    let flags = [
        "--retention",
        "0s",
        "--cleanup-interval",
        "200ms",
        "--metrics-addr",
        "off",
    ];
    let mut consumers = Vec::new();
    let mut relays = Vec::new();
    for k in 0..SHARDS {
        let (exchange, queue) = shard_exchange(&outbox, k).await;
        consumers.push(Consumer::start_with(&outbox.amqp_url, &queue, false).await);
        relays.push(spawn_shard(&outbox, SHARDS, k, &exchange, &flags));
    }
    let left = |ids: Vec<String>| {
        let client = &outbox.client;
        async move {
            let count = "SELECT count(*) FROM outbox WHERE id = ANY($1::text[]::uuid[])";
            let row = client.query_one(count, &[&ids]).await.expect("count");
            row.get::<_, i64>(0)
        }
    };
    // The ids of `rows` that fall into the shards `wanted` accepts.
    let of = |rows: &HashMap<String, u32>, wanted: &dyn Fn(u32) -> bool| -> Vec<String> {
        let mut ids: Vec<String> = rows
            .iter()
            .filter(|(_, &k)| wanted(k))
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    };

    // All four run: each delivers and deletes its rows, the stopped-to-be shard too.
    let before = write_aggregates(&outbox.db_url, 2, 800, 40).await;
    let before = shards_of(&outbox.client, &before, SHARDS).await;
    for (k, consumer) in consumers.iter_mut().enumerate() {
        let n = of(&before, &|s| s == k as u32).len();
        consumer.wait_for(n, Duration::from_secs(60)).await;
    }
    let all = of(&before, &|_| true);
    assert!(
        eventually(Duration::from_secs(30), || async {
            left(all.clone()).await == 0
        })
        .await,
        "every shard deletes its delivered rows: {} left",
        left(all.clone()).await
    );

    // Shard 3 stops; writers go on.
    relays[STOPPED as usize].stop().await;
    let slot = format!("{}_{STOPPED}", outbox.slot);
    let acknowledged = common::slot_confirmed_flush(&outbox.client, &slot).await;
    let after = write_aggregates(&outbox.db_url, 2, 800, 40).await;
    let after = shards_of(&outbox.client, &after, SHARDS).await;
    let running = of(&after, &|k| k != STOPPED);
    let stopped = of(&after, &|k| k == STOPPED);
    assert!(
        !running.is_empty() && !stopped.is_empty(),
        "the 800 rows reach both the running shards ({}) and the stopped one ({})",
        running.len(),
        stopped.len()
    );
    // Each of the stopped shard's new rows committed after its acknowledged position (the
    // oracle's end LSNs), so it is one the cleanup must keep.
    let newer: HashSet<String> = oracle
        .transactions(&outbox.client)
        .await
        .iter()
        .filter(|txn| txn.end_lsn > acknowledged)
        .flat_map(|txn| txn.inserted_ids(OUTBOX))
        .collect();
    let older: Vec<&String> = stopped.iter().filter(|id| !newer.contains(*id)).collect();
    assert!(
        stopped.iter().all(|id| newer.contains(id)),
        "rows of the stopped shard committed at or before its acknowledged position {}: \
         {older:?}",
        common::format_lsn(acknowledged)
    );

    // The running shards deliver theirs and delete them...
    for (k, consumer) in consumers.iter_mut().enumerate() {
        if k as u32 != STOPPED {
            let n = of(&before, &|s| s == k as u32).len() + of(&after, &|s| s == k as u32).len();
            consumer.wait_for(n, Duration::from_secs(60)).await;
        }
    }
    assert!(
        eventually(Duration::from_secs(30), || async {
            left(running.clone()).await == 0
        })
        .await,
        "the running shards' delivered rows are deleted: {} left",
        left(running.clone()).await
    );
    // ...and none of the stopped shard's rows newer than its acknowledged commit.
    assert_eq!(
        left(stopped.clone()).await,
        stopped.len() as i64,
        "none of the stopped shard's unacknowledged rows is deleted"
    );
    assert_eq!(
        common::slot_confirmed_flush(&outbox.client, &slot).await,
        acknowledged,
        "the stopped shard's slot stays where it was"
    );
    for (k, relay) in relays.iter().enumerate() {
        if k as u32 != STOPPED {
            relay.stop().await;
        }
    }
    common::faults::report(
        "shards-cleanup",
        &[
            ("rows", (before.len() + after.len()).to_string()),
            ("deleted while all ran", before.len().to_string()),
            ("deleted with shard 3 stopped", running.len().to_string()),
            ("kept (shard 3, unacknowledged)", stopped.len().to_string()),
        ],
    );
}

/// The row-filter check renders the expected filter through a temporary table: the role of
/// sql/role.sql may do that (TEMPORARY is PUBLIC's by default, SELECT is granted), so a
/// least-privilege relay runs a shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_privilege_role_runs_a_shard() {
    if !common::own_postgres("roles log in by trust authentication") {
        return;
    }
    let outbox = sharded_outbox("shards_role", 2).await;
    let database: String =
        common::pg::query_value(&outbox.client, "SELECT current_database()::text").await;
    let role = common::unique_name("shards_role");
    let script = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/role.sql"))
        .expect("read sql/role.sql")
        // The role's name, not the state table's, which only begins like it.
        .replace("outbox_relay_state", "\u{0}")
        .replace("outbox_relay", &role)
        .replace('\u{0}', "outbox_relay_state")
        .replace("ON DATABASE app", &format!("ON DATABASE {database}"));
    outbox
        .client
        .batch_execute(&script)
        .await
        .expect("sql/role.sql");
    let port = common::pg::url_port(&outbox.db_url).expect("port");
    let role_url = format!("postgres://{role}@127.0.0.1:{port}/{database}");

    let (exchange, queue) = shard_exchange(&outbox, 1).await;
    let mut consumer = Consumer::start(&outbox.amqp_url, &queue).await;
    let aggregate = aggregates_of_shard(&outbox.client, 2, 1, 1).await;
    let id = insert_for(&outbox.client, "ByRole", &aggregate[0]).await;
    let as_role = Outbox {
        db_url: role_url,
        amqp_url: outbox.amqp_url.clone(),
        slot: outbox.slot.clone(),
        exchange: outbox.exchange.clone(),
        queue: outbox.queue.clone(),
        client: pg_connect(&outbox.db_url).await,
    };
    let relay = spawn_shard(&as_role, 2, 1, &exchange, &["--metrics-addr", "off"]);
    let received = consumer.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(ids(received), [id], "log:\n{}", relay.log());
    relay.stop().await;

    // The role drops every shard's slot but none of the DBA's publications, and says so
    // for each of them.
    let teardown = as_role.run_command(&["teardown", "--yes", "--shards", "2"]);
    assert!(!teardown.status.success(), "{}", text(&teardown));
    let slots = slot_names(&outbox.client, &outbox.slot).await;
    assert!(
        slots.is_empty(),
        "the role's teardown left slots {slots:?}: {}",
        text(&teardown)
    );
    for k in 0..2 {
        assert!(
            text(&teardown).contains(&format!("publication outbox_pub_{k}: not dropped")),
            "{}",
            text(&teardown)
        );
    }
}

/// Kill -9 of one shard's relay under writers, and a restart at least 5 s
/// later. That shard loses nothing and its duplicates stay within one relay's bound; the
/// other shards deliver exactly once, and each delivers a probe row committed after the kill
/// while the killed shard is still down (their queues are the oracle; the killed shard stays
/// down until every probe has arrived, so a loaded machine delays the restart, not the proof).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_one_shards_relay_and_a_restart_5_s_later_leaves_the_others_alone() {
    const SHARDS: u32 = 4;
    const KILLED: usize = 1;
    const WINDOW: usize = 256;
    // How long the killed shard stays down at least (the scenario).
    const DOWN: Duration = Duration::from_secs(5);
    // How long the other shards' probes may take to arrive before the test gives up on them.
    const PROBES_WITHIN: Duration = Duration::from_secs(60);
    let outbox = sharded_outbox("shards_kill", SHARDS).await;
    let oracle = Oracle::create(&outbox).await;
    let window = WINDOW.to_string();
    let flags = ["--max-in-flight", window.as_str(), "--metrics-addr", "off"];
    let mut consumers = Vec::new();
    let mut exchanges = Vec::new();
    let mut relays = Vec::new();
    for k in 0..SHARDS {
        let (exchange, queue) = shard_exchange(&outbox, k).await;
        consumers.push(Consumer::start_with(&outbox.amqp_url, &queue, false).await);
        relays.push(spawn_shard(&outbox, SHARDS, k, &exchange, &flags));
        exchanges.push(exchange);
    }
    let started = std::time::Instant::now();
    let writers = Writers::start(&outbox.db_url, 4, 4, Duration::from_millis(1));
    assert!(
        writers.wait_committed(1_500, Duration::from_secs(60)).await,
        "the writers committed {} of 1,500 rows within 60 s",
        writers.committed()
    );
    consumers[KILLED]
        .wait_for(100, Duration::from_secs(60))
        .await;

    relays[KILLED].kill9();
    let killed = std::time::Instant::now();
    let killed_at = common::current_wal_lsn(&outbox.client).await;
    let probes = probes_after(&outbox.client, SHARDS, KILLED as u32).await;
    // The time down. Every 100 ms: the WAL position (a commit past it came later) and, after
    // it, what the other shards' queues hold (a row seen came earlier).
    let mut positions: Vec<(Duration, u64)> = Vec::new();
    let mut arrived: HashMap<String, Duration> = HashMap::new();
    while killed.elapsed() < DOWN || probes.iter().any(|(_, id)| !arrived.contains_key(id)) {
        let missing: Vec<_> = probes
            .iter()
            .filter(|(_, id)| !arrived.contains_key(id))
            .collect();
        assert!(
            killed.elapsed() < PROBES_WITHIN,
            "the probes (shard, id) {missing:?}, committed after the kill, did not arrive within \
             {PROBES_WITHIN:?} while shard {KILLED} was down"
        );
        let at = killed.elapsed();
        positions.push((at, common::current_wal_lsn(&outbox.client).await));
        for (k, consumer) in consumers.iter_mut().enumerate() {
            if k == KILLED {
                continue;
            }
            let seen = killed.elapsed();
            for id in ids(consumer.received()) {
                arrived.entry(id).or_insert(seen);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The others kept acknowledging: past the kill, so (ACK) past what was committed before.
    for k in (0..SHARDS as usize).filter(|&k| k != KILLED) {
        let slot = format!("{}_{k}", outbox.slot);
        assert!(
            common::slot_confirmed_flush(&outbox.client, &slot).await > killed_at,
            "shard {k} acknowledged past the kill while shard {KILLED} was down; log:\n{}",
            relays[k].log()
        );
    }
    let down_until = positions.last().map_or(killed_at, |p| p.1);
    let before_restart = consumers[KILLED].received().len();
    relays[KILLED] = spawn_shard(&outbox, SHARDS, KILLED as u32, &exchanges[KILLED], &flags);
    let restarted = std::time::Instant::now();
    let down = restarted - killed;
    consumers[KILLED]
        .wait_for(before_restart + 1, Duration::from_secs(30))
        .await;
    let first_delivery = restarted.elapsed();
    let now = writers.committed();
    assert!(
        writers
            .wait_committed(now + 1_000, Duration::from_secs(60))
            .await,
        "the writers committed {} of {} rows within 60 s after the restart; log:\n{}",
        writers.committed(),
        now + 1_000,
        relays[KILLED].log()
    );
    writers.stop().await;
    let writing = started.elapsed();

    let committed = oracle.committed_ids(&outbox.client).await;
    let rows = rows_by_id(&outbox.client, SHARDS).await;

    // The other shards' rows committed while shard 1 was down, and how many of them arrived
    // before the restart, how late at worst (figures: the probes above are the proof).
    let (mut while_down, mut in_time, mut worst) = (0, 0, Duration::ZERO);
    for txn in oracle.transactions(&outbox.client).await {
        if txn.end_lsn <= killed_at || txn.end_lsn > down_until {
            continue;
        }
        // The last position read before the commit: it committed after that reading.
        let after = positions
            .iter()
            .rev()
            .find(|p| p.1 < txn.end_lsn)
            .map_or(Duration::ZERO, |p| p.0);
        for id in txn.inserted_ids(OUTBOX) {
            if rows[id.as_str()].1 == KILLED as u32 {
                continue;
            }
            while_down += 1;
            let latency = arrived.get(&id).map(|seen| seen.saturating_sub(after));
            if let Some(latency) = latency {
                in_time += 1;
                worst = worst.max(latency);
            }
        }
    }
    assert!(while_down > 0, "the other shards committed rows meanwhile");

    let mut duplicates = Vec::new();
    for (k, consumer) in consumers.iter_mut().enumerate() {
        let expected: Vec<String> = committed
            .iter()
            .filter(|id| rows[id.as_str()].1 == k as u32)
            .cloned()
            .collect();
        assert!(
            wait_for_ids(consumer, &expected, Duration::from_secs(120)).await,
            "L0, shard {k}; log:\n{}",
            relays[k].log()
        );
        // Settled while its relay runs: a stopped relay no longer moves its slot.
        let queue = format!("{}_{k}", outbox.queue);
        let upto = shard_slots(&outbox.client, &outbox.slot, [k as u32]);
        let log = || relays[k].log();
        let received = settled(consumer, &outbox.amqp_url, &queue, upto, log).await;
        relays[k].stop().await;
        let tally = Tally::of(received);
        assert_nothing_lost_or_invented(&tally, &expected);
        duplicates.push(tally.duplicates());
    }
    // A relay crash re-publishes at most the window, the rows confirmed but not yet reported
    // and the confirmed rows of the transaction that was open (docs/architecture.md, invariant 5); the
    // rate is the shard's average rate.
    let rate =
        rows.values().filter(|r| r.1 == KILLED as u32).count() as f64 / writing.as_secs_f64();
    let bound = relay_crash_duplicate_bound(WINDOW, rate, Duration::from_millis(100), 4);
    for (k, &d) in duplicates.iter().enumerate() {
        if k != KILLED {
            assert_eq!(d, 0, "shard {k} delivers exactly once");
        }
    }
    assert!(
        duplicates[KILLED] <= bound,
        "shard {KILLED}: {} duplicates, bound {bound}",
        duplicates[KILLED]
    );
    common::faults::report(
        "shards-kill9",
        &[
            ("rows", committed.len().to_string()),
            ("lost", "0".to_string()),
            ("duplicates per shard", format!("{duplicates:?}")),
            ("bound", bound.to_string()),
            ("down", common::faults::secs(down)),
            (
                "other shards' rows committed while down",
                while_down.to_string(),
            ),
            ("of them arrived while down", in_time.to_string()),
            ("slowest", format!("{} ms", worst.as_millis())),
            (
                "restart → first delivery",
                common::faults::secs(first_delivery),
            ),
        ],
    );
}

/// Resharding 2 → 4 under writers, by the outline in
/// docs/scaling.md ("Changing the number of shards"): new publications and slots under
/// other names, the old relays kept until every old slot has passed the newest new slot's
/// consistent point, then the switch and the old ones dropped. Nothing is lost; the rows
/// between the new slots' creation and the old relays' stop may arrive twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_two_to_four_under_writers_loses_nothing() {
    let outbox = sharded_outbox("shards_reshard", 2).await;
    let oracle = Oracle::create(&outbox).await;
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let flags = ["--metrics-addr", "off"];
    let old: Vec<RelayProcess> = (0..2)
        .map(|k| spawn_shard(&outbox, 2, k, &outbox.exchange, &flags))
        .collect();
    let writers = Writers::start(&outbox.db_url, 4, 4, Duration::from_millis(1));
    assert!(
        writers.wait_committed(1_000, Duration::from_secs(60)).await,
        "the writers committed {} of 1,000 rows within 60 s",
        writers.committed()
    );

    // The new shards, under other names, while the old relays deliver.
    let new_slot = format!("{}_v2", outbox.slot);
    let setup = std::process::Command::new(common::relay::binary())
        .args(["setup", "--database-url", &outbox.db_url, "--amqp-url"])
        .args([
            &outbox.amqp_url,
            "--exchange",
            &outbox.exchange,
            "--shards",
            "4",
        ])
        .args(["--publication", "outbox_pub_v2", "--slot", &new_slot])
        .output()
        .expect("setup --shards 4");
    assert!(setup.status.success(), "{}", text(&setup));
    let (mut consistent, mut earliest) = (0, u64::MAX);
    for k in 0..4 {
        let slot = format!("{new_slot}_{k}");
        let created = common::slot_confirmed_flush(&outbox.client, &slot).await;
        consistent = consistent.max(created);
        earliest = earliest.min(created);
    }
    // The old relays stop only once every old slot has passed the newest consistent point.
    for (k, relay) in old.iter().enumerate() {
        let slot = format!("{}_{k}", outbox.slot);
        assert!(
            eventually(Duration::from_secs(60), || async {
                common::slot_confirmed_flush(&outbox.client, &slot).await >= consistent
            })
            .await,
            "{slot} passes the new slots' consistent point; log:\n{}",
            relay.log()
        );
    }
    for relay in &old {
        relay.stop().await;
    }
    let old_stopped = common::current_wal_lsn(&outbox.client).await;
    let switched = writers.committed();
    let new: Vec<RelayProcess> = (0..4u32)
        .map(|k| {
            let k = k.to_string();
            let args = [
                "--publication",
                "outbox_pub_v2",
                "--slot",
                new_slot.as_str(),
                "--shards",
                "4",
                "--shard",
                k.as_str(),
                "--metrics-addr",
                "off",
            ];
            let mut argv = vec!["run", "--database-url", outbox.db_url.as_str()];
            argv.extend(["--amqp-url", outbox.amqp_url.as_str()]);
            argv.extend(["--exchange", outbox.exchange.as_str()]);
            argv.extend(args);
            RelayProcess::spawn(&argv, &[TEST_LOG])
        })
        .collect();
    assert!(
        writers
            .wait_committed(switched + 1_000, Duration::from_secs(60))
            .await,
        "the writers committed {} of {} rows within 60 s after the switch",
        writers.committed(),
        switched + 1_000
    );
    writers.stop().await;

    // The old shards go.
    let teardown = outbox.run_command(&["teardown", "--yes", "--shards", "2"]);
    assert!(teardown.status.success(), "{}", text(&teardown));
    let publications = first_column(
        &outbox.client,
        "SELECT pubname::text FROM pg_publication ORDER BY 1",
        &[],
    )
    .await;
    let expected: Vec<String> = (0..4).map(|k| format!("outbox_pub_v2_{k}")).collect();
    assert_eq!(publications, expected);

    let committed = oracle.committed_ids(&outbox.client).await;
    let logs = || {
        new.iter()
            .map(|r| r.log())
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    assert!(
        wait_for_ids(&mut consumer, &committed, Duration::from_secs(120)).await,
        "L0 across the switch; logs:\n{}",
        logs()
    );
    // Settled while the new relays run: a stopped relay no longer moves its slot.
    let upto = shard_slots(&outbox.client, &new_slot, 0..4);
    let (url, queue) = (&outbox.amqp_url, &outbox.queue);
    let received = settled(&mut consumer, url, queue, upto, logs).await;
    for relay in &new {
        relay.stop().await;
    }
    let tally = Tally::of(received);
    assert_nothing_lost_or_invented(&tally, &committed);
    // Only rows both generations could deliver arrive twice: those of transactions that
    // ended after the earliest new slot's consistent point and before the old relays stopped.
    let overlap: usize = oracle
        .transactions(&outbox.client)
        .await
        .iter()
        .filter(|txn| txn.end_lsn > earliest && txn.end_lsn <= old_stopped)
        .map(|txn| txn.inserted_ids(OUTBOX).len())
        .sum();
    assert!(
        tally.duplicates() <= overlap,
        "{} duplicates, {overlap} rows in the overlap",
        tally.duplicates()
    );
    common::faults::report(
        "shards-reshard-2-to-4",
        &[
            ("rows", committed.len().to_string()),
            ("duplicates", tally.duplicates().to_string()),
            ("overlap rows", overlap.to_string()),
        ],
    );
}

/// The table-less outbox with shards: PostgreSQL does not row-filter logical messages, so
/// every shard's walsender sends every emitted event; each relay publishes only those whose
/// envelope hash is its shard's, by the same expression as the rows (computed here in SQL from
/// the event's aggregate, or its id when it has none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_each_publish_only_their_shards_emitted_events_and_rows() {
    const SHARDS: u32 = 2;
    const EVENTS: i64 = 400;
    let outbox = sharded_outbox("shards_emit", SHARDS).await;
    // Events of 40 aggregates and, one in five, of none; a row between them now and then.
    let mut expected: HashMap<String, u32> = HashMap::new();
    for n in 0..EVENTS {
        let aggregate = (n % 5 != 0).then(|| format!("agg-{}", n % 40));
        let id: String = value_with(
            &outbox.client,
            "SELECT outbox_emit(event_type => 'Emitted', payload => '{}'::jsonb, \
             aggregate_id => $1)::text",
            &[&aggregate],
        )
        .await;
        let shard_of: i32 = value_with(
            &outbox.client,
            &format!(
                "SELECT ((CASE WHEN $1::text IS NOT NULL THEN hashtext($1::text) \
                 ELSE uuid_hash($2::text::uuid) END) & 2147483647) % {SHARDS}"
            ),
            &[&aggregate, &id],
        )
        .await;
        expected.insert(id, shard_of as u32);
        if n % 10 == 0 {
            let row = insert_for(&outbox.client, "Row", &format!("agg-{}", n % 40)).await;
            let shard_of = shard_of_row(&outbox.client, SHARDS, &row).await;
            expected.insert(row, shard_of);
        }
    }
    let mut relays = Vec::new();
    let mut consumers = Vec::new();
    for shard in 0..SHARDS {
        let (exchange, queue) = shard_exchange(&outbox, shard).await;
        consumers.push(Consumer::start(&outbox.amqp_url, &queue).await);
        relays.push(spawn_shard(&outbox, SHARDS, shard, &exchange, &[]));
    }
    for (shard, consumer) in consumers.iter_mut().enumerate() {
        let mine: Vec<String> = expected
            .iter()
            .filter(|(_, s)| **s == shard as u32)
            .map(|(id, _)| id.clone())
            .collect();
        assert!(!mine.is_empty(), "shard {shard} has events");
        assert!(
            wait_for_ids(consumer, &mine, Duration::from_secs(60)).await,
            "shard {shard}'s events and rows arrive; log:\n{}",
            relays[shard].log()
        );
        let queue = format!("{}_{shard}", outbox.queue);
        let upto = shard_slots(&outbox.client, &outbox.slot, [shard as u32]);
        let log = || relays[shard].log();
        let received = settled(consumer, &outbox.amqp_url, &queue, upto, log).await;
        let mut got = ids(received);
        got.sort();
        let mut want = mine;
        want.sort();
        assert_eq!(
            got, want,
            "shard {shard} published exactly its own, once each"
        );
    }
    for relay in relays {
        relay.stop().await;
    }
}

/// The one value `sql` returns with `params`.
async fn value_with<T: tokio_postgres::types::FromSqlOwned>(
    client: &Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> T {
    let row = client.query_one(sql, params).await;
    row.unwrap_or_else(|e| panic!("{sql}: {e:?}")).get(0)
}
