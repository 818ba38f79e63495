//! The reference consumer's throughput beside the relay's drain, in one run on one pair of
//! servers (docs/benchmarks.md, "The inbox consumer").
//!
//! ```sh
//! cargo build --release -p outbox-relay --bin outbox-relay
//! cargo build --release -p outbox-inbox --example inbox_bench
//! target/release/examples/inbox_bench --rows 100000 --rounds 5
//! ```
//!
//! Each round, for each variant (their order rotates from round to round, since successive
//! runs on one RabbitMQ node drift): `--rows` rows committed to the outbox (transactions of
//! 1,000, 500 aggregates), the relay (`target/release/outbox-relay`, WAL mode) drains them
//! into a queue with no consumer attached (the drain rate), stops, and then one consumer
//! takes the whole queue:
//!
//! - `acks`: consume and ack each delivery, no database: what the broker gives a consumer;
//! - `inbox + insert, concurrency 1, batch 1`: the reference consumer with a one-row INSERT as
//!   the effect (what the tests apply), one transaction per message, one at a time: the
//!   textbook idempotent consumer;
//! - the same with `--concurrency` lanes;
//! - `inbox, no effect`: the defaults (`--concurrency`, `--batch-size`) with an effect that
//!   does nothing: the claims and the commit alone (the inbox's own cost);
//! - `inbox + insert`: the defaults with the INSERT.
//!
//! Figures per variant: median messages/s of the consumer and of the relay's drain of the
//! same rounds, the consumer's CPU per message (this process: the consumer runs in it), and
//! the consumer database's WAL per message. Then the inbox's size per row and what a cleanup
//! of all of it costs.
//!
//! Servers: private ones from the test kit (or `OUTBOX_TEST_DATABASE_URL` and
//! `OUTBOX_TEST_AMQP_URL`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use outbox_inbox::cleanup::cleanup;
use outbox_inbox::consumer::{self, ConsumerConfig, Counters};
use outbox_inbox::effect::{Effect, SqlEffect};
use outbox_inbox::error::InboxError;
use outbox_inbox::message::InboxMessage;
use outbox_inbox::sql::{self, InboxTable};
use outbox_testkit::amqp::amqp_connect;
use outbox_testkit::outbox::Outbox;
use outbox_testkit::pg::{current_wal_lsn, pg_connect};
use outbox_testkit::{procfs, queue_message_count, services, unique_name};
use tokio_postgres::{Client, Transaction};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
struct Args {
    /// Rows per drain (and messages per consumer run).
    #[arg(long, default_value_t = 20_000)]
    rows: usize,
    /// Rounds; each runs every variant once.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The consumer's --concurrency (lanes) in the variants that use more than one.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// The consumer's --batch-size in the variants that batch.
    #[arg(long, default_value_t = 100)]
    batch_size: usize,
    /// basic.qos of every consumer.
    #[arg(long, default_value_t = 100)]
    prefetch: u16,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    Acks,
    Inbox {
        insert: bool,
        concurrency: usize,
        batch_size: usize,
    },
}

impl Variant {
    fn name(&self) -> String {
        match self {
            Variant::Acks => "acks, no database".into(),
            Variant::Inbox {
                insert,
                concurrency,
                batch_size,
            } => format!(
                "inbox{}, concurrency {concurrency}, batch {batch_size}",
                if *insert { " + insert" } else { ", no effect" }
            ),
        }
    }
}

/// One variant's run in one round.
#[derive(Debug, Clone, Copy)]
struct Sample {
    drain_rate: f64,
    consumer_rate: f64,
    cpu_us_per_message: f64,
    wal_bytes_per_message: f64,
}

/// An effect that does nothing: the transaction is the claim alone.
struct NoEffect;

impl Effect for NoEffect {
    type Prepared = ();

    async fn prepare(&self, _client: &Client) -> Result<(), InboxError> {
        Ok(())
    }

    async fn apply(
        &self,
        _prepared: &(),
        _txn: &Transaction<'_>,
        _message: &InboxMessage,
    ) -> Result<(), tokio_postgres::Error> {
        Ok(())
    }
}

const EFFECT_SQL: &str = "INSERT INTO effect (message_id, outbox_seq) VALUES ($1, $7)";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let s = services();
    let outbox = Outbox::new("inbox_bench").await;
    let consumer_url =
        s.pg.create_database(&unique_name("inbox_bench_consumer"))
            .await;
    let mut consumer_db = pg_connect(&consumer_url).await;
    sql::setup(&mut consumer_db, &InboxTable::default()).await?;
    consumer_db
        .batch_execute(
            "CREATE TABLE effect (n bigserial PRIMARY KEY, message_id text NOT NULL, outbox_seq text)",
        )
        .await?;

    let inbox = |insert, concurrency, batch_size| Variant::Inbox {
        insert,
        concurrency,
        batch_size,
    };
    let (lanes, batch) = (args.concurrency, args.batch_size);
    // The textbook consumer (a transaction per message, one at a time), then more lanes,
    // then the defaults, with and without an effect.
    let variants = [
        Variant::Acks,
        inbox(true, 1, 1),
        inbox(true, lanes, 1),
        inbox(false, lanes, batch),
        inbox(true, lanes, batch),
    ];
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); variants.len()];
    for round in 0..args.rounds {
        for k in 0..variants.len() {
            let i = (k + round) % variants.len();
            let variant = variants[i];
            consumer_db.batch_execute("TRUNCATE inbox, effect").await?;
            let drain_rate = drain(&outbox, args.rows).await?;
            let wal_before = current_wal_lsn(&consumer_db).await;
            let cpu_before = procfs::usage(std::process::id())?.cpu;
            let started = Instant::now();
            match variant {
                Variant::Acks => plain_acks(&outbox, args.prefetch, args.rows).await?,
                Variant::Inbox {
                    insert,
                    concurrency,
                    batch_size,
                } => {
                    let config = ConsumerConfig {
                        concurrency,
                        batch_size,
                        ..config(&outbox, &consumer_url, args.prefetch)
                    };
                    match insert {
                        true => reference(config, SqlEffect::new(EFFECT_SQL)?, args.rows).await?,
                        false => reference(config, NoEffect, args.rows).await?,
                    }
                }
            }
            let elapsed = started.elapsed().as_secs_f64();
            let cpu = (procfs::usage(std::process::id())?.cpu - cpu_before).as_secs_f64();
            let wal = current_wal_lsn(&consumer_db).await - wal_before;
            let n = args.rows as f64;
            let sample = Sample {
                drain_rate,
                consumer_rate: n / elapsed,
                cpu_us_per_message: cpu * 1e6 / n,
                wal_bytes_per_message: wal as f64 / n,
            };
            eprintln!(
                "round {} {}: consumer {:.0} msg/s, drain {:.0} msg/s",
                round + 1,
                variant.name(),
                sample.consumer_rate,
                sample.drain_rate
            );
            samples[i].push(sample);
        }
    }

    println!(
        "| consumer ({} messages, prefetch {}, {} rounds) | consumer msg/s | relay drain msg/s, same rounds | consumer / drain | consumer CPU µs/msg | consumer WAL bytes/msg |",
        args.rows, args.prefetch, args.rounds
    );
    println!("|---|---|---|---|---|---|");
    for (variant, samples) in variants.iter().zip(&samples) {
        let median_of = |f: fn(&Sample) -> f64| median(samples.iter().map(f).collect());
        let (consumer, drain) = (median_of(|s| s.consumer_rate), median_of(|s| s.drain_rate));
        println!(
            "| {} | {consumer:.0} | {drain:.0} | {:.2} | {:.1} | {:.0} |",
            variant.name(),
            consumer / drain,
            median_of(|s| s.cpu_us_per_message),
            median_of(|s| s.wal_bytes_per_message),
        );
    }
    sizes(&consumer_db, &consumer_url, args.rows).await
}

/// Commits `rows` rows and lets the relay publish them into the outbox's queue with no
/// consumer; the drain rate, from the relay's start to the queue holding all of them.
async fn drain(outbox: &Outbox, rows: usize) -> Result<f64> {
    for start in (0..rows).step_by(1_000) {
        let end = (start + 1_000).min(rows) as i64;
        outbox
            .client
            .execute(
                "INSERT INTO outbox (event_type, aggregate_id, payload)
                 SELECT 'Order.paid', 'order-' || g % 500,
                        jsonb_build_object('order_id', g, 'total_cents', g * 7919, 'currency', 'EUR')
                 FROM generate_series($1::bigint, $2::bigint - 1) AS g",
                &[&(start as i64), &end],
            )
            .await?;
    }
    let relay = outbox.spawn_relay(&[]);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(600);
    while (queue_message_count(&outbox.amqp_url, &outbox.queue).await as usize) < rows {
        if Instant::now() > deadline {
            bail!(
                "the relay did not drain {rows} rows in 600 s; log:\n{}",
                relay.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rate = rows as f64 / started.elapsed().as_secs_f64();
    relay.stop().await;
    Ok(rate)
}

/// A consumer that acks every delivery and does nothing else.
async fn plain_acks(outbox: &Outbox, prefetch: u16, rows: usize) -> Result<()> {
    let connection = amqp_connect(&outbox.amqp_url).await;
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    let mut deliveries = channel
        .basic_consume(
            outbox.queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    for _ in 0..rows {
        let delivery = deliveries.next().await.context("the consumer closed")??;
        delivery.acker.ack(BasicAckOptions::default()).await?;
    }
    let _ = connection.close(200, "OK".into()).await;
    Ok(())
}

/// The consumer of `outbox`'s queue, one lane, one message per transaction.
fn config(outbox: &Outbox, database_url: &str, prefetch: u16) -> ConsumerConfig {
    ConsumerConfig {
        database_url: database_url.to_string(),
        amqp_url: outbox.amqp_url.clone(),
        queue: outbox.queue.clone(),
        consumer: "bench".into(),
        table: InboxTable::default(),
        prefetch,
        concurrency: 1,
        batch_size: 1,
        max_backoff: Duration::from_secs(2),
        shutdown_timeout: Duration::from_secs(30),
        peer_timeout: Default::default(),
        statement_timeout: Some(outbox_common::liveness::DEFAULT_STATEMENT_TIMEOUT),
        dead_letter_exchange: None,
    }
}

/// The reference consumer until it has applied `rows` messages.
async fn reference<E: Effect>(config: ConsumerConfig, effect: E, rows: usize) -> Result<()> {
    let counters = Arc::new(Counters::default());
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(consumer::run(
        config,
        effect,
        counters.clone(),
        shutdown.clone(),
    ));
    let deadline = Instant::now() + Duration::from_secs(600);
    while (counters.totals().applied as usize) < rows {
        if running.is_finished() || Instant::now() > deadline {
            shutdown.cancel();
            bail!(
                "the consumer stopped at {:?}: {:?}",
                counters.totals(),
                running.await?
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    shutdown.cancel();
    running.await??;
    Ok(())
}

/// The inbox's size per row after the last inbox run, and a cleanup of all of it.
async fn sizes(client: &Client, url: &str, rows: usize) -> Result<()> {
    // Fill it once more, with the default names, for a clean reading.
    client.batch_execute("TRUNCATE inbox").await?;
    client
        .execute(
            "INSERT INTO inbox (consumer, message_id, outbox_seq, received_at)
             SELECT 'orders-service', gen_random_uuid()::text,
                    lpad(to_hex(g), 16, '0') || '-' || lpad(to_hex(g % 10), 8, '0'),
                    now() - g * interval '1 millisecond'
             FROM generate_series(1, $1::bigint) AS g",
            &[&(rows as i64)],
        )
        .await?;
    client.batch_execute("VACUUM ANALYZE inbox").await?;
    let row = client
        .query_one(
            "SELECT pg_relation_size('inbox'), pg_indexes_size('inbox')",
            &[],
        )
        .await?;
    let (heap, indexes): (i64, i64) = (row.get(0), row.get(1));
    let n = rows as f64;
    println!();
    println!(
        "inbox per row ({rows} rows, uuid message ids, 14-byte consumer name): heap {:.0} B, indexes {:.0} B, total {:.0} B",
        heap as f64 / n,
        indexes as f64 / n,
        (heap + indexes) as f64 / n
    );
    let wal_before = current_wal_lsn(client).await;
    let started = Instant::now();
    let own = pg_connect(url).await;
    let cleaned = cleanup(
        &own,
        &InboxTable::default(),
        Duration::ZERO,
        1_000,
        &CancellationToken::new(),
    )
    .await?;
    let elapsed = started.elapsed();
    let wal = current_wal_lsn(client).await - wal_before;
    // With a window of 0, all but the newest row (the window's anchor) are past it.
    println!(
        "cleanup of all of it in batches of 1,000: {} rows in {} batches, {:.0} rows/s, {:.1} ms per batch, WAL {:.0} B per row",
        cleaned.deleted,
        cleaned.batches,
        cleaned.deleted as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e3 / cleaned.batches as f64,
        wal as f64 / cleaned.deleted.max(1) as f64
    );
    Ok(())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}
