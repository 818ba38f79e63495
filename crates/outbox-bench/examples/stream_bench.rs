//! The relay into a RabbitMQ stream beside the relay into a quorum queue and a minimal
//! stream publisher (the broker alone), in one run on one pair of servers
//! (docs/benchmarks.md, "Streams").
//!
//! ```sh
//! cargo build --release -p outbox-relay --bin outbox-relay
//! cargo build --release -p outbox-bench --example stream_bench
//! target/release/examples/stream_bench --rows 100000 --rounds 3
//! ```
//!
//! Each round runs every variant once, in an order that rotates from round to round (runs on
//! one RabbitMQ node drift):
//!
//! - `broker alone`: one named producer publishes `--rows` messages of a row's size into a
//!   stream, with at most `--window` unconfirmed: what the broker takes from one publisher;
//! - `relay -> stream`: `--rows` rows committed (transactions of 100) before the relay
//!   (`target/release/outbox-relay run --stream`) starts; the drain lasts until the slot has
//!   acknowledged them all;
//! - `relay -> quorum queue`: the same into a quorum queue with no consumer attached.
//!
//! Figures per variant: the median messages/s, and the relay's CPU per message. Then, once,
//! the duplicates a kill -9 at full speed leaves (the relay killed a third of the way through
//! the backlog, started again, the destination counted once the slot has caught up): the
//! stream's against the queue's.
//!
//! Servers: a private RabbitMQ node with the stream plugin and the test kit's PostgreSQL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures_util::StreamExt;
use outbox_testkit::amqp::quorum_queue_arguments;
use outbox_testkit::failover::seed_backlog;
use outbox_testkit::outbox::{wait_slot_confirmed_flush, Outbox};
use outbox_testkit::pg::current_wal_lsn;
use outbox_testkit::{procfs, queue_message_count, services, RabbitServer, RelayProcess};
use rabbitmq_stream_client::types::{Message, OffsetSpecification};
use rabbitmq_stream_client::{Environment, NoDedup, Producer};
use tokio::sync::Semaphore;

#[derive(Debug, Parser)]
struct Args {
    /// Rows per drain (and messages of the broker-alone run).
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// Rounds; each runs every variant once.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Unconfirmed messages at most: the relay's --max-in-flight, and the publisher's.
    #[arg(long, default_value_t = 1024)]
    window: usize,
}

const TRANSACTION_ROWS: usize = 100;
const PATIENCE: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    BrokerAlone,
    RelayStream,
    RelayQuorumQueue,
}

impl Variant {
    const ALL: [Variant; 3] = [
        Variant::BrokerAlone,
        Variant::RelayStream,
        Variant::RelayQuorumQueue,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::BrokerAlone => "broker alone (minimal stream publisher)",
            Variant::RelayStream => "relay -> stream",
            Variant::RelayQuorumQueue => "relay -> quorum queue",
        }
    }
}

/// One run: messages/s, and the relay's CPU per message (none for the broker alone).
struct Run {
    rate: f64,
    cpu_per_message: Option<Duration>,
}

struct Bench {
    args: Args,
    broker: RabbitServer,
    environment: Environment,
    /// Streams made so far: each run gets a fresh one.
    streams: std::sync::atomic::AtomicUsize,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let broker = tokio::task::spawn_blocking(RabbitServer::start_with_streams).await?;
    let environment = Environment::builder()
        .host("127.0.0.1")
        .port(broker.stream_port())
        .build()
        .await
        .context("connect to the stream port")?;
    let bench = Bench {
        args,
        broker,
        environment,
        streams: Default::default(),
    };
    let mut rates: Vec<(Variant, Vec<Run>)> = Variant::ALL.iter().map(|v| (*v, vec![])).collect();
    for round in 0..bench.args.rounds {
        for i in 0..Variant::ALL.len() {
            let variant = Variant::ALL[(i + round) % Variant::ALL.len()];
            let run = bench.run(variant).await?;
            eprintln!(
                "round {}: {}: {:.0} msg/s{}",
                round + 1,
                variant.name(),
                run.rate,
                run.cpu_per_message
                    .map(|cpu| format!(", relay CPU {:.1} µs/msg", micros(cpu)))
                    .unwrap_or_default()
            );
            if let Some((_, runs)) = rates.iter_mut().find(|(v, _)| *v == variant) {
                runs.push(run);
            }
        }
    }
    println!(
        "| variant ({} rows, window {}, {} rounds) | median msg/s | relay CPU µs/msg (median) |",
        bench.args.rows, bench.args.window, bench.args.rounds
    );
    println!("|---|---:|---:|");
    for (variant, runs) in &rates {
        let rate = median(runs.iter().map(|r| r.rate).collect());
        let cpu: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.cpu_per_message.map(micros))
            .collect();
        let cpu = match cpu.is_empty() {
            true => "-".to_string(),
            false => format!("{:.1}", median(cpu)),
        };
        println!("| {} | {rate:.0} | {cpu} |", variant.name());
    }
    let stream = bench.duplicates_after_kill(true).await?;
    let queue = bench.duplicates_after_kill(false).await?;
    println!();
    println!(
        "kill -9 a third of the way through {} rows at full speed, window {}: {stream} \
         duplicates in the stream, {queue} in the quorum queue",
        bench.args.rows, bench.args.window
    );
    Ok(())
}

impl Bench {
    async fn run(&self, variant: Variant) -> Result<Run> {
        match variant {
            Variant::BrokerAlone => self.broker_alone().await,
            Variant::RelayStream => self.relay_drain(true).await,
            Variant::RelayQuorumQueue => self.relay_drain(false).await,
        }
    }

    /// A fresh stream of this run.
    async fn stream(&self) -> Result<String> {
        let made = self
            .streams
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stream = format!("bench-{made}");
        self.environment
            .stream_creator()
            .create(&stream)
            .await
            .context("create the stream")?;
        Ok(stream)
    }

    async fn broker_alone(&self) -> Result<Run> {
        let stream = self.stream().await?;
        let mut producer = self
            .environment
            .producer()
            .name("bench")
            .build(&stream)
            .await
            .context("a producer")?;
        let window = Arc::new(Semaphore::new(self.args.window));
        let started = Instant::now();
        for n in 0..self.args.rows {
            let permit = Arc::clone(&window).acquire_owned().await?;
            let message = Message::builder()
                .body(format!(r#"{{"g": {n}}}"#).into_bytes())
                .publishing_id(n as u64 + 1)
                .build();
            producer
                .send(message, move |_| async move { drop(permit) })
                .await
                .context("publish")?;
        }
        // Every permit back: every message confirmed.
        let _all = window.acquire_many(self.args.window as u32).await?;
        let elapsed = started.elapsed();
        let _ = producer.close().await;
        Ok(Run {
            rate: self.args.rows as f64 / elapsed.as_secs_f64(),
            cpu_per_message: None,
        })
    }

    /// An outbox with `rows` rows committed, and the relay's flags for the destination.
    async fn outbox(&self, into_stream: bool) -> Result<(Outbox, Vec<String>, u64)> {
        let pg = &services().pg;
        let prefix = if into_stream {
            "bench_stream"
        } else {
            "bench_queue"
        };
        let outbox = Outbox::provision(
            &pg.url("postgres"),
            &self.broker.url(),
            prefix,
            &["setup"],
            quorum_queue_arguments(),
        )
        .await;
        seed_backlog(&outbox.client, self.args.rows, TRANSACTION_ROWS).await;
        let end = current_wal_lsn(&outbox.client).await;
        let mut flags = vec!["--max-in-flight".to_string(), self.args.window.to_string()];
        if into_stream {
            flags.extend([
                "--stream".to_string(),
                self.stream().await?,
                "--stream-port".to_string(),
                self.broker.stream_port().to_string(),
            ]);
        }
        Ok((outbox, flags, end))
    }

    async fn relay_drain(&self, into_stream: bool) -> Result<Run> {
        let (outbox, flags, end) = self.outbox(into_stream).await?;
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let started = Instant::now();
        let relay = outbox.spawn_relay(&flags);
        caught_up(&outbox, &relay, end).await?;
        let elapsed = started.elapsed();
        let cpu = procfs::usage(relay.pid())?.cpu;
        relay.stop().await;
        Ok(Run {
            rate: self.args.rows as f64 / elapsed.as_secs_f64(),
            cpu_per_message: Some(cpu / self.args.rows as u32),
        })
    }

    /// Messages in the destination beyond the rows, after a kill -9 a third of the way.
    async fn duplicates_after_kill(&self, into_stream: bool) -> Result<i64> {
        let (outbox, flags, end) = self.outbox(into_stream).await?;
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let (first, _) = outbox.spawn_observed(&flags);
        let published = outbox_relay::metrics::MESSAGES_PUBLISHED_TOTAL;
        if !first
            .wait_metric(published, PATIENCE, |n| n >= self.args.rows / 3)
            .await
        {
            bail!(
                "the relay did not publish a third of the rows:\n{}",
                first.log()
            );
        }
        first.kill9();
        first.wait_exit(PATIENCE).await;
        let relay = outbox.spawn_relay(&flags);
        caught_up(&outbox, &relay, end).await?;
        relay.stop().await;
        let held = match into_stream {
            true => self.count_stream(flags[3]).await?,
            false => queue_message_count(&outbox.amqp_url, &outbox.queue).await as usize,
        };
        Ok(held as i64 - self.args.rows as i64)
    }

    /// Messages in `stream`, counted by a consumer from offset 0 up to a marker.
    async fn count_stream(&self, stream: &str) -> Result<usize> {
        let marker: Producer<NoDedup> = self.environment.producer().build(stream).await?;
        marker
            .send_with_confirm(Message::builder().body(b"marker".to_vec()).build())
            .await?;
        let _ = marker.close().await;
        let mut consumer = self
            .environment
            .consumer()
            .offset(OffsetSpecification::First)
            .build(stream)
            .await?;
        let mut count = 0;
        while let Some(delivery) = tokio::time::timeout(PATIENCE, consumer.next()).await? {
            if delivery?.message().data() == Some(b"marker".as_slice()) {
                let _ = consumer.handle().close().await;
                return Ok(count);
            }
            count += 1;
        }
        bail!("the stream's consumer ended before the marker")
    }
}

/// Waits until the relay's slot has acknowledged `end`.
async fn caught_up(outbox: &Outbox, relay: &RelayProcess, end: u64) -> Result<()> {
    if wait_slot_confirmed_flush(&outbox.client, &outbox.slot, end, PATIENCE)
        .await
        .is_err()
    {
        bail!("the relay did not catch up:\n{}", relay.log());
    }
    Ok(())
}

fn micros(cpu: Duration) -> f64 {
    cpu.as_secs_f64() * 1e6
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}
