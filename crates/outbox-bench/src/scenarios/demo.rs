//! `outbox-bench demo`: write rows into the outbox with concurrent writers and check that the
//! running relay delivers every one of them, once and in commit order.
//!
//! The consumer starts before the first write, so nothing the relay publishes is missed; the
//! queue is purged first, so leftovers of an earlier run are not counted.
//!
//! It judges only from outside: the ids the writers committed against what the consumer
//! received ([`crate::measurement::delivery`]), never what the relay says about itself.

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use tokio::time::Instant;

use crate::measurement::delivery::Report;
use crate::measurement::writers::{self, WriterOptions};
use crate::Servers;
use outbox_testkit::arrivals::{ArrivalConsumer, Outstanding, QueueSpec};

/// How long to keep listening after the last expected message, for trailing duplicates.
const QUIET: Duration = Duration::from_millis(300);
/// How often progress is printed while waiting for deliveries…
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// …and how often while nothing new arrives.
const STALLED_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    #[command(flatten)]
    pub servers: Servers,

    /// Rows to commit in total.
    #[arg(long, default_value_t = 5000)]
    pub rows: u64,

    /// Concurrent writer connections.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub writers: u32,

    /// Largest transaction; sizes are drawn from 1..=this.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_txn_rows: u32,

    /// The outbox table the writers insert into.
    #[arg(long, env = "OUTBOX_TABLE", default_value = "outbox")]
    pub table: String,

    /// The exchange the relay publishes to (must exist: `outbox-relay setup`).
    #[arg(long, env = "OUTBOX_EXCHANGE", default_value = "outbox")]
    pub exchange: String,

    /// The queue to consume; declared durable, bound with `#`, and purged first.
    #[arg(long, default_value = "outbox_demo")]
    pub queue: String,

    /// Seconds the whole run may take, writes and deliveries included.
    #[arg(long, default_value_t = 120)]
    pub timeout_secs: u64,

    /// Seed of the transaction sizes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Runs the demo and returns its report; `Err` only if it could not run at all.
pub async fn run(args: &DemoArgs) -> Result<Report> {
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let spec = QueueSpec {
        exchange: args.exchange.clone(),
        queue: args.queue.clone(),
        arguments: Default::default(),
        binding_key: "#".into(),
        purge: true,
        prefetch: 1000,
        delete_on_close: false,
    };
    let mut consumer = ArrivalConsumer::start(&args.servers.amqp_url, &spec).await?;
    println!(
        "demo: consuming queue {} (bound to exchange {} with '#', {} old messages purged)",
        spec.queue,
        spec.exchange,
        consumer.purged()
    );

    println!(
        "demo: {} writers committing {} rows into {} in transactions of 1..={} rows",
        args.writers, args.rows, args.table, args.max_txn_rows
    );
    let options = WriterOptions {
        seed: args.seed,
        ..WriterOptions::new(
            args.writers,
            args.rows,
            args.max_txn_rows,
            &args.table,
            "DemoEvent",
        )
    };
    let written = tokio::time::timeout_at(
        deadline,
        writers::write(&args.servers.database_url, &options),
    )
    .await
    .context("the writers did not finish before the timeout")??;
    if let (Some(started), Some(last)) = (written.started, written.last_commit()) {
        let seconds = last.saturating_duration_since(started).as_secs_f64();
        println!(
            "demo: committed {} rows in {} transactions in {seconds:.2} s; waiting for deliveries",
            written.rows.len(),
            written.transactions
        );
    }

    let mut outstanding = Outstanding::new(written.ids());
    let mut progress = Progress::new(written.rows.len());
    while outstanding.update(consumer.arrivals()) > 0 {
        progress.report(written.rows.len() - outstanding.len());
        if Instant::now() >= deadline {
            println!(
                "demo: timed out after {} s with {} rows not received",
                args.timeout_secs,
                outstanding.len()
            );
            break;
        }
        consumer
            .wait_for_more(deadline.min(Instant::now() + PROGRESS_EVERY))
            .await?;
    }
    if outstanding.is_empty() {
        consumer
            .wait_quiet(QUIET, Instant::now() + QUIET * 3)
            .await?;
    }
    let arrivals = consumer.close().await;
    Ok(Report::analyze(&written, &arrivals))
}

/// Prints "N of M rows received" every few seconds while waiting, less often when stalled.
struct Progress {
    total: usize,
    printed: usize,
    next: Instant,
}

impl Progress {
    fn new(total: usize) -> Progress {
        Progress {
            total,
            printed: 0,
            next: Instant::now() + PROGRESS_EVERY,
        }
    }

    fn report(&mut self, received: usize) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        if received == self.printed {
            println!(
                "demo: {received} of {} rows received (no progress)",
                self.total
            );
            self.next = now + STALLED_EVERY;
        } else {
            println!("demo: {received} of {} rows received", self.total);
            self.next = now + PROGRESS_EVERY;
        }
        self.printed = received;
    }
}
