//! `outbox-bench bench`: the benchmark, every scenario in one run against a
//! PostgreSQL and a RabbitMQ given by URL (scripts/bench.sh starts private ones).
//!
//! Each measurement gets fresh objects (table, publication, slot, queue, routing key) and
//! drops them afterwards, so no run sees another's rows or keeps WAL pinned. The relay under
//! test is the release binary, run with its normal CLI as a child process; the writers and the
//! consumer run in this process, so commit and receipt times come from the same clock.
//! Every figure is judged from outside the relay: ids committed (or read back from the table)
//! against messages the consumer received. docs/benchmarks.md explains the columns.

use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use tokio::time::Instant;
use tokio_postgres::Client;

use crate::measurement::delivery::Report;
use crate::measurement::limits::Endpoints;
use crate::measurement::relay::RelayBinary;
use crate::measurement::results::{
    load_average, Machine, ModeResults, NotifyResults, Results, Scale, MODES,
};
use crate::measurement::writers::{self};
use crate::scenarios::compare::{CompareSetup, Layout};
use crate::scenarios::pinning::Pinning;
use crate::scenarios::setups::DrainSetup;
use outbox_relay::internals::connect;
use outbox_testkit::amqp::quorum_queue_arguments;
use outbox_testkit::arrivals::{ArrivalConsumer, Outstanding};
use outbox_testkit::RabbitCluster;

mod args;
mod cluster_runs;
mod compare_runs;
mod cost_growth_runs;
mod counting;
mod drain;
mod limit_runs;
mod objects;
mod rabbitmq;
mod recovery_runs;
mod scenario_runs;
mod seeding;
mod shard_emit_runs;

/// `bench` with a database and a broker URL and `extra`, as the command line parses it: for
/// the sections' tests of their flags.
#[cfg(test)]
fn parse_args(extra: &[&str]) -> Result<BenchArgs, clap::Error> {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }
    use clap::Parser;
    let base = [
        "bench",
        "--database-url",
        "postgres://x",
        "--amqp-url",
        "amqp://y",
    ];
    Cli::try_parse_from(base.iter().chain(extra)).map(|cli| cli.args)
}
mod setup_drains;
pub use args::BenchArgs;
use counting::{Distinct, DrainCounter};

/// The relay is killed once this share of the crash backlog has arrived.
const KILL_AT: f64 = 0.4;
/// After the last expected message, how long to keep listening for trailing duplicates.
const QUIET: Duration = Duration::from_secs(1);
/// How long committed rows may take to arrive after the writers stopped.
const CATCH_UP: Duration = Duration::from_secs(120);
/// How long a crash run may take to deliver its whole backlog.
const CRASH_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a stopped relay's walsender may hold its slot.
const SLOT_RELEASE: Duration = Duration::from_secs(30);

/// How the suite runs a `--compare` setup.
fn relay_setup(setup: CompareSetup, window: u32) -> Setup {
    match setup {
        // A layout's table, seed and relay flags are the drain's (`DrainSpec::of`).
        CompareSetup::Wal | CompareSetup::Layout(_) => Setup::Wal { window },
        CompareSetup::Poll {
            workers,
            batch_size,
            delete,
        } => Setup::Poll {
            workers,
            listen: false,
            batch_size,
            delete,
        },
    }
}

/// How a relay is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    Poll {
        workers: u32,
        listen: bool,
        /// `--batch-size` (None: the relay's default).
        batch_size: Option<u32>,
        /// `--on-published delete` (false: the default, mark).
        delete: bool,
    },
    Wal {
        window: u32,
    },
}

impl Setup {
    fn of_mode(index: usize, window: u32) -> Setup {
        match index {
            0 => Setup::Poll {
                workers: 1,
                listen: false,
                batch_size: None,
                delete: false,
            },
            1 => Setup::Poll {
                workers: 5,
                listen: false,
                batch_size: None,
                delete: false,
            },
            _ => Setup::Wal { window },
        }
    }
}

/// One measurement's objects; dropped by [`Bench::drop_objects`].
struct Objects {
    table: String,
    publication: String,
    slot: String,
    queue: String,
    event_type: String,
    wal: bool,
    /// `setup --shards`: 1, or that many publications and slots suffixed `_<k>`.
    shards: u32,
    /// The table's column names, and so how the relay reads it: `setup` makes the default,
    /// [`Bench::use_layout`] renames.
    layout: Layout,
}

/// The columns a Debezium table names otherwise (docs/table-layouts.md, the Debezium preset):
/// the contract's name, Debezium's. The other columns keep theirs: the preset reads
/// `traceparent` and `tracestate` (NULL here) and leaves `headers`, `created_at`, `exchange` and
/// `routing_key` unmapped.
const DEBEZIUM_COLUMNS: [(&str, &str); 3] = [
    ("event_type", "type"),
    ("aggregate_type", "aggregatetype"),
    ("aggregate_id", "aggregateid"),
];

/// The aggregate type of every row of a `layout:` backlog ([`Seed::Orders`]).
const AGGREGATE_TYPE: &str = "Order";

/// The routing key of a Debezium table's messages: `Order.<event type>`.
const DEBEZIUM_ROUTING_KEY: &str = "{aggregate_type}.{event_type}";

impl Objects {
    /// The table's name of contract column `column`.
    fn column(&self, column: &'static str) -> &'static str {
        match self.layout {
            Layout::Default => column,
            Layout::Debezium => DEBEZIUM_COLUMNS
                .iter()
                .find(|(contract, _)| *contract == column)
                .map_or(column, |(_, debezium)| debezium),
        }
    }

    /// The relay's flags that read the table as it is named.
    fn layout_args(&self) -> Vec<String> {
        match self.layout {
            Layout::Default => Vec::new(),
            Layout::Debezium => vec![
                "--table-layout".into(),
                "debezium".into(),
                "--routing-key".into(),
                DEBEZIUM_ROUTING_KEY.into(),
            ],
        }
    }

    /// The routing key of the seeded rows' messages, which the drain's queue is bound with:
    /// the event type, or what [`DEBEZIUM_ROUTING_KEY`] renders (exactly, not `#`: a key
    /// rendered wrong leaves the drain incomplete).
    fn routing_key(&self) -> String {
        match self.layout {
            Layout::Default => self.event_type.clone(),
            Layout::Debezium => format!("{AGGREGATE_TYPE}.{}", self.event_type),
        }
    }

    /// The slots `setup` made: one, or one per shard suffixed `_<k>`.
    fn slot_names(&self) -> Vec<String> {
        if self.shards > 1 {
            (0..self.shards)
                .map(|k| format!("{}_{k}", self.slot))
                .collect()
        } else {
            vec![self.slot.clone()]
        }
    }
}

/// What a backlog is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seed {
    /// Rows without an aggregate.
    Rows,
    /// Rows of 500 aggregates, one in ten of none (the shards' hash then takes the id).
    Aggregates,
    /// Events written by the table's `outbox_emit` function, no row.
    Emitted,
    /// Rows that each carry an aggregate: type [`AGGREGATE_TYPE`], 500 ids (the `layout:`
    /// setups, whose Debezium relay routes by the type).
    Orders,
}

/// One backlog drain: what is seeded, and how the relays run.
#[derive(Debug, Clone, Copy)]
struct DrainSpec {
    setup: Setup,
    rows: u64,
    transaction_rows: u64,
    seed: Seed,
    /// Relays, one per shard (1: today's unsharded names).
    shards: u32,
    /// Also measure PostgreSQL's CPU (postmaster and backends, from /proc).
    pg_cpu: bool,
    /// Count distinct ids at a consumer; false: count the messages in the queue, nothing
    /// consuming (`--compare --no-consumer`).
    consumer: bool,
    /// The table's column names, given right after `setup` made it.
    layout: Layout,
    /// The payload's JSON text in bytes, about (None: the ~200-byte order).
    payload_bytes: Option<u32>,
    /// Read the seeded payloads' average size back from the table ([`Drain::payload_bytes`]).
    measure_payload: bool,
}

impl DrainSpec {
    /// How `setup` is drained (the relays, and what the backlog is made of): one spec for
    /// `--compare`, `--shards-sweep`, `--emit` and the suite's drain of every setup.
    fn of(setup: DrainSetup, window: u32, rows: u64, pg_cpu: bool, consumer: bool) -> DrainSpec {
        let (relays, seed, shards, layout) = match setup {
            DrainSetup::Relay(CompareSetup::Layout(layout)) => {
                (Setup::Wal { window }, Seed::Orders, 1, layout)
            }
            DrainSetup::Relay(setup) => {
                (relay_setup(setup, window), Seed::Rows, 1, Layout::Default)
            }
            DrainSetup::Shards(shards) => (
                Setup::Wal { window },
                Seed::Aggregates,
                shards,
                Layout::Default,
            ),
            DrainSetup::Emit => (Setup::Wal { window }, Seed::Emitted, 1, Layout::Default),
        };
        DrainSpec {
            setup: relays,
            rows,
            transaction_rows: 1,
            seed,
            shards,
            pg_cpu,
            consumer,
            layout,
            payload_bytes: None,
            measure_payload: false,
        }
    }
}

struct Bench {
    args: BenchArgs,
    scale: Scale,
    relay: RelayBinary,
    /// Where consumers and the broker-alone publisher connect (the relay's URL is in `relay`).
    endpoints: Endpoints,
    admin: Client,
    runs: u32,
    /// The broker nodes the newest drain's or latency run's relay connected to.
    relay_nodes: Vec<String>,
}

/// Runs the whole suite, printing progress to stderr; returns the figures.
pub async fn run(args: BenchArgs) -> Result<Results> {
    let rows = args
        .rows
        .unwrap_or(if args.quick { 10_000 } else { 200_000 });
    let scale = Scale {
        name: if args.quick { "quick" } else { "full" }.into(),
        drain_rows: rows,
        drain_window_secs: args.drain_window_secs,
        latency_rate: 100,
        latency_secs: if args.quick { 3 } else { 30 },
        load_writers: 100,
        load_secs: if args.quick { 3 } else { 30 },
        crash_rows: rows,
        sweep_rows: args.sweep_rows.unwrap_or(rows),
        max_in_flight: args.max_in_flight,
        status_interval_ms: args.status_interval_ms,
    };
    std::fs::create_dir_all(&args.work_dir)
        .with_context(|| format!("cannot create {}", args.work_dir.display()))?;
    let relay = RelayBinary {
        path: args.relay_bin.clone(),
        database_url: args.servers.database_url.clone(),
        amqp_url: args.servers.amqp_url.clone(),
        log_dir: args.work_dir.clone(),
    };
    if !relay.path.is_file() {
        anyhow::bail!(
            "no relay binary at {}: build it with `cargo build --release` or pass --relay-bin",
            relay.path.display()
        );
    }
    let admin = connect(&args.servers.database_url).await?;
    let endpoints = Endpoints::single(&args.servers.amqp_url);
    let mut bench = Bench {
        args,
        scale,
        relay,
        endpoints,
        admin,
        runs: 0,
        relay_nodes: Vec::new(),
    };
    let mut results = Results {
        machine: bench.machine().await?,
        scale: bench.scale.clone(),
        ..Results::default()
    };
    if bench.args.pin_broker {
        let pinning = Pinning::of(results.machine.cores)?;
        bench.pin_broker(&pinning).await?;
        results.machine.pinning = Some(pinning.describe());
    }
    if let Some(other) = bench.args.ab_with.clone() {
        results.ab = bench.drain_ab(other).await?;
        return Ok(results);
    }
    if bench.args.recovery_only {
        bench.recovery(&mut results).await?;
        return Ok(results);
    }
    if bench.args.cluster_only {
        bench.cluster(&mut results).await?;
        bench.recovery(&mut results).await?;
        return Ok(results);
    }
    if !bench.args.shards_sweep.is_empty() {
        bench.shards_sweep(&mut results).await?;
        return Ok(results);
    }
    if bench.args.emit {
        bench.emit(&mut results).await?;
        return Ok(results);
    }
    if bench.args.cost_growth {
        bench.cost_growth(&mut results).await?;
        return Ok(results);
    }
    if !bench.args.compare.is_empty() {
        bench.compare(&mut results).await?;
        return Ok(results);
    }
    bench.limits(&mut results).await?;
    for (index, mode) in MODES.iter().enumerate() {
        let setup = Setup::of_mode(index, bench.scale.max_in_flight);
        let rows = bench.scale.drain_rows;
        let mut m = ModeResults {
            mode: mode.to_string(),
            ..ModeResults::default()
        };
        m.drain = Some(bench.drain(setup, rows, 1).await?);
        m.drain_batched = Some(bench.drain(setup, rows, 1000).await?);
        m.latency = Some(bench.latency(setup).await?);
        m.load = Some(bench.load(Some(setup), Notify::None).await?);
        m.crash = Some(bench.crash(setup, bench.scale.crash_rows).await?);
        results.modes.push(m);
    }
    bench.setup_drains(&mut results).await?;
    let listen = Setup::Poll {
        workers: 5,
        listen: true,
        batch_size: None,
        delete: false,
    };
    results.notify = Some(NotifyResults {
        ceiling: bench.load(None, Notify::None).await?,
        trigger: bench.load(Some(listen), Notify::Trigger).await?,
        after_commit: bench.load(Some(listen), Notify::AfterCommit).await?,
    });
    bench.sweep(&mut results).await?;
    // A few minutes at full scale (docs/benchmarks.md), so a full run includes it.
    if bench.args.cluster || !(bench.args.quick || bench.args.no_cluster || bench.args.pin_broker) {
        bench.cluster(&mut results).await?;
    }
    bench.recovery(&mut results).await?;
    Ok(results)
}

/// How writers wake a listening polling relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Notify {
    None,
    /// A trigger calls pg_notify for every inserted row, inside the transaction.
    Trigger,
    /// The writer sends NOTIFY after its COMMIT returned.
    AfterCommit,
}

/// The channel `poll --listen` listens on by default.
const LISTEN_CHANNEL: &str = "outbox";

impl Bench {
    fn say(&self, text: &str) {
        eprintln!("bench: {text}");
    }

    async fn machine(&self) -> Result<Machine> {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_kib: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        let version: String = self
            .admin
            .query_one("SHOW server_version", &[])
            .await?
            .try_get(0)?;
        let settings = self
            .admin
            .query(
                "SELECT name, setting || COALESCE(unit, '') FROM pg_settings WHERE name IN \
                 ('shared_buffers', 'synchronous_commit', 'fsync', 'wal_level', 'max_wal_size', \
                 'checkpoint_timeout', 'max_connections', 'wal_sender_timeout') ORDER BY name",
                &[],
            )
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<Vec<(String, String)>, tokio_postgres::Error>>()?;
        Ok(Machine {
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory_mib: memory_kib / 1024,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            postgres: version,
            postgres_settings: settings,
            rabbitmq: self.args.rabbitmq_version.clone(),
            relay_commit: self.args.relay_commit.clone(),
            started_at: self.args.started_at.clone(),
            load_average: load_average(),
            pinning: None,
        })
    }
}

/// What a panicking blocking task (the test kit's cluster calls panic) said.
fn panic_text(error: tokio::task::JoinError) -> String {
    match error.try_into_panic() {
        Ok(payload) => payload_text(&*payload),
        Err(error) => error.to_string(),
    }
}

/// A panic's message.
fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".into())
}

/// Waits until every written row arrived (at most `catch_up` after the writers stopped), then
/// a moment for trailing duplicates; closes the consumer and compares.
async fn collect(
    mut consumer: ArrivalConsumer,
    written: &writers::Written,
    catch_up: Duration,
) -> Result<Report> {
    let deadline = Instant::now() + catch_up;
    let mut outstanding = Outstanding::new(written.ids());
    while outstanding.update(consumer.arrivals()) > 0 {
        if !consumer.wait_for_more(deadline).await? {
            break;
        }
    }
    if outstanding.is_empty() {
        consumer
            .wait_quiet(Duration::from_millis(200), Instant::now() + QUIET)
            .await?;
    }
    let arrivals = consumer.close().await;
    Ok(Report::analyze(written, &arrivals))
}

/// `items` rotated left by one per round after the first, so that drift of the machine
/// does not favour the setup that always runs first.
fn rotated<T: Clone>(items: &[T], round: u32) -> Vec<T> {
    let mut order = items.to_vec();
    let len = order.len();
    if len > 0 {
        order.rotate_left(round.saturating_sub(1) as usize % len);
    }
    order
}

/// How an --emit variant is named in the results.
fn variant_name(emit: bool) -> &'static str {
    if emit {
        "outbox_emit"
    } else {
        "table insert"
    }
}

/// A CPU split as a progress line.
fn cpu_split_line(c: &crate::measurement::cpu::CpuSplit) -> String {
    let us = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
    format!(
        "  cpu µs/msg: relay {}, walsender {}, rabbitmq {}, bench {}",
        us(c.relay_us),
        us(c.walsender_us),
        us(c.rabbitmq_us),
        us(c.bench_us)
    )
}

fn per_sec(count: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

/// The cluster node whose connection declares every queue of the cluster section.
const LEADER: usize = 0;

/// Declares a throwaway quorum queue through node `node`, asks the cluster which node leads
/// it, and deletes it: where the section's queues are led.
async fn quorum_leader_of_new_queue(cluster: &'static RabbitCluster, node: usize) -> Result<usize> {
    let queue = format!("bench_cluster_probe_{}", std::process::id());
    let connection =
        lapin::Connection::connect(&cluster.url(node), lapin::ConnectionProperties::default())
            .await
            .with_context(|| format!("cannot connect to cluster node {node}"))?;
    let channel = connection.create_channel().await?;
    channel
        .queue_declare(
            queue.as_str().into(),
            lapin::options::QueueDeclareOptions::durable(),
            quorum_queue_arguments(),
        )
        .await
        .context("cannot declare a quorum queue")?;
    let asked = queue.clone();
    let leader = tokio::task::spawn_blocking(move || cluster.quorum_leader(&asked))
        .await
        .map_err(|e| anyhow!("cannot find the quorum queue's leader: {}", panic_text(e)));
    channel
        .queue_delete(queue.as_str().into(), Default::default())
        .await
        .context("cannot delete the probe queue")?;
    let _ = connection.close(200, "probe done".into()).await;
    leader
}
