//! `outbox-bench bench`: the benchmark, every scenario in one run against a
//! PostgreSQL and a RabbitMQ given by URL (scripts/bench.sh starts private ones).
//!
//! Each measurement gets fresh objects (table, publication, slot, queue, routing key) and
//! drops them afterwards, so no run sees another's rows or keeps WAL pinned. The relay under
//! test is the release binary, run with its normal CLI as a child process; the writers and the
//! consumer run in this process, so commit and receipt times come from the same clock.
//! Every figure is judged from outside the relay: ids committed (or read back from the table)
//! against messages the consumer received. docs/benchmarks.md explains the columns.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::Args;
use tokio::time::Instant;
use tokio_postgres::Client;

use crate::compare::{CompareSetup, Layout};
use crate::cpu::{self, CpuProbe};
use crate::independent::{self, BareBroker, BareBrokerLimit};
use crate::limits::{self, Endpoints};
use crate::pinning::{self, Pinning};
use crate::relay::{Relay, RelayBinary};
use crate::report::Report;
use crate::results::{
    load_average, AbRun, BrokerLimit, ClusterResults, Crash, DecodeLimit, Drain, EmitDrainRun,
    EmitWriterRun, LatencyMs, LatencyRun, LoadRun, Machine, ModeResults, NotifyResults,
    PublisherPair, Results, Scale, ShardRun, SweepRow, MODES,
};
use crate::setups::DrainSetup;
use crate::writers::{self, WriterOptions, ORDER_NOTE_LEN};
use crate::Servers;
use outbox_common::quote::{quote_ident, quote_literal};
use outbox_relay::db;
use outbox_testkit::amqp::quorum_queue_arguments;
use outbox_testkit::arrivals::{ArrivalConsumer, Outstanding, QueueSpec};
use outbox_testkit::faults::relay_crash_duplicate_bound;
use outbox_testkit::{procfs, RabbitCluster};

mod compare_runs;
mod cost_growth_runs;
mod counting;
mod recovery_runs;

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

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub servers: Servers,

    /// The relay under test (a release build).
    #[arg(long, default_value = "target/release/outbox-relay")]
    pub relay_bin: PathBuf,

    /// Reduced scale for development: every scenario, a few minutes.
    #[arg(long)]
    pub quick: bool,

    /// Backlog rows of the drain, crash and decoding runs (default 200,000; quick 10,000).
    #[arg(long)]
    pub rows: Option<u64>,

    /// Longest a drain may run before its rate is taken, in seconds.
    #[arg(long, default_value_t = 60)]
    pub drain_window_secs: u64,

    /// The relay's --max-in-flight in every WAL run outside the sweep.
    #[arg(long, default_value_t = 1024)]
    pub max_in_flight: u32,

    /// The relay's --status-interval (WAL mode), for the duplicate bound.
    #[arg(long, default_value_t = 100)]
    pub status_interval_ms: u64,

    /// The --max-in-flight values of the sweep (comma-separated; only --max-in-flight: no extra
    /// run, the suite's own figures are reused).
    #[arg(long, value_delimiter = ',', default_value = "256,1024,4096,16384")]
    pub sweep: Vec<u32>,

    /// Backlog rows of each sweep run (default: --rows).
    #[arg(long)]
    pub sweep_rows: Option<u64>,

    /// Where the relay logs go.
    #[arg(long, default_value = "target/bench")]
    pub work_dir: PathBuf,

    /// Write the results to PREFIX.json and PREFIX.md.
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// The exchange (declared by `outbox-relay setup`).
    #[arg(long, default_value = "outbox")]
    pub exchange: String,

    /// Recorded with the machine: the RabbitMQ version (the script asks rabbitmqctl).
    #[arg(long, default_value = "")]
    pub rabbitmq_version: String,

    /// Recorded with the machine: the commit of the relay under test.
    #[arg(long, default_value = "")]
    pub relay_commit: String,

    /// Recorded with the machine: when the run started.
    #[arg(long, default_value = "")]
    pub started_at: String,

    /// Instead of the suite: an A/B of the WAL drain (single-row transactions, --rows, at
    /// --max-in-flight, with the consumer) between --relay-bin and this binary, alternating
    /// them --ab-rounds times, in one run on the same servers.
    #[arg(long)]
    pub ab_with: Option<PathBuf>,

    /// What the A/B drains: `wal` (the WAL reader at --max-in-flight) or `poll5` (5 polling
    /// workers, default batch size).
    #[arg(long, default_value = "wal", value_parser = ["wal", "poll5"])]
    pub ab_setup: String,

    /// Rounds of the A/B, of --shards-sweep, of --emit and of --compare (each round runs
    /// every variant once, their order alternating from round to round).
    #[arg(long, default_value_t = 3)]
    pub ab_rounds: u32,

    /// Instead of the suite: drain a backlog of --rows single-row transactions
    /// (rows of 500 aggregates, one in ten of none) with each of these numbers of sharded
    /// relays (`setup --shards N`, one `run --shards N --shard K` each) into one queue, beside
    /// the broker alone at --max-in-flight, --ab-rounds times; the relays' and PostgreSQL's
    /// CPU per message (PostgreSQL on this machine). E.g. `--shards-sweep 1,2,4`.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["ab_with", "cluster_only", "emit"])]
    pub shards_sweep: Vec<u32>,

    /// Instead of the suite: writers calling `outbox_emit` against writers
    /// inserting rows, at each of --emit-clients for --emit-secs each, no relay running (events
    /// per second and WAL bytes per event), then the WAL relay's drain of a backlog of --rows
    /// emitted events against one of rows; --ab-rounds times, the variants alternating.
    #[arg(long, conflicts_with_all = ["ab_with", "cluster_only"])]
    pub emit: bool,

    /// Instead of the suite: how a drain's cost grows, --ab-rounds times (the order rotated
    /// from round to round), each drain a backlog of --rows single-row transactions (rows of
    /// 500 aggregates) with a consumer: on the single node the broker alone at
    /// --max-in-flight and drains with each of --cost-growth-shards sharded relays, then one
    /// relay with payloads of each of --cost-growth-payloads (beside the broker alone at that
    /// body size); then, unless --no-cluster, the same shard counts through a private 3-node
    /// cluster's quorum queue (started once; the relays given only the queue leader's URL).
    /// Every drain with the CPU per message of the relays, every shard's walsender, PostgreSQL
    /// (on this machine) and RabbitMQ.
    #[arg(long, conflicts_with_all = ["ab_with", "cluster_only", "cluster", "shards_sweep", "emit", "compare"])]
    pub cost_growth: bool,

    /// The numbers of sharded relays of --cost-growth.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub cost_growth_shards: Vec<u32>,

    /// The payload sizes of --cost-growth's one-relay drains, in bytes of JSON text (the
    /// message body; the seed's padding is sized to reach it).
    #[arg(long, value_delimiter = ',', default_value = "1024,16384")]
    pub cost_growth_payloads: Vec<u32>,

    /// The numbers of concurrent writers of --emit.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    pub emit_clients: Vec<u32>,

    /// How long each --emit writer run lasts, in seconds.
    #[arg(long, default_value_t = 10)]
    pub emit_secs: u64,

    /// After the suite, the cluster section: the WAL drain (with a consumer and without) and
    /// latency through a private 3-node RabbitMQ cluster (started and stopped by this process)
    /// with a quorum queue, each beside the broker alone on that cluster. Full scale runs it unless --no-cluster;
    /// --quick only with this flag.
    #[arg(long)]
    pub cluster: bool,

    /// Leave the cluster section out of a full-scale run.
    #[arg(long, conflicts_with_all = ["cluster", "cluster_only"])]
    pub no_cluster: bool,

    /// Only the cluster section (no single-node scenario).
    #[arg(long, conflicts_with = "ab_with")]
    pub cluster_only: bool,

    /// Pairs of the cluster section's consumer-less runs (the WAL drain and the minimal
    /// publisher, both through the queue leader's node), their order alternating from pair to
    /// pair: the ratio moves between runs more than its target's margin, so the target takes
    /// the median of the pairs' ratios. 1: one pair.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub cluster_rounds: u32,

    /// After the independent limits, this many adjacent pairs of the WAL drain and the minimal
    /// publisher, consumer attached, on the single node, their order alternating: the target
    /// against the independent limit then takes the median of the pairs' ratios instead of
    /// comparing two runs minutes apart. 0: none.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=20))]
    pub single_node_pairs: u32,

    /// After the cluster's consumer-less pairs through the leader, this many more through a
    /// follower (the relay and the minimal publisher both given the same follower's URL),
    /// reported beside them; no target (0.61-0.85 in single runs of 2026-12-02 to 12-04).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=20))]
    pub cluster_follower_pairs: u32,

    /// After everything else, this many rounds of each recovery scenario (docs/benchmarks.md,
    /// "Recovery after a fault"): kill -9 of the WAL relay's RabbitMQ node in a private 3-node cluster under
    /// load, and a PostgreSQL 17 failover (a private primary and standby with a synchronized
    /// failover slot) under load; the times to stream again, each beside the 10 s target, and
    /// a loss check (a lost row fails the run). Without a number: 3. 0: none.
    #[arg(
        long,
        num_args = 0..=1,
        default_value_t = 0,
        default_missing_value = "3",
        value_parser = clap::value_parser!(u32).range(0..=20),
        conflicts_with_all = ["ab_with", "shards_sweep", "emit", "cost_growth", "compare", "pin_broker"]
    )]
    pub recovery_rounds: u32,

    /// Only the recovery section (--recovery-rounds, 3 unless given).
    #[arg(long, conflicts_with_all = ["ab_with", "cluster_only", "shards_sweep", "emit", "cost_growth", "compare", "pin_broker"])]
    pub recovery_only: bool,

    /// RabbitMQ's node on the last CPU, PostgreSQL, the relays and this process (the consumer
    /// and the minimal publisher) on the others, as when the broker has hosts of its own: on
    /// a shared CPU a drain's rate follows the CPU all processes spend per message. Needs the
    /// servers on this machine and 2 CPUs or more; leaves the cluster section out.
    #[arg(long, conflicts_with_all = ["cluster", "cluster_only", "cost_growth"])]
    pub pin_broker: bool,

    /// Before each measured run (a drain, the broker alone, the minimal publisher), wait up to
    /// this many seconds for RabbitMQ to go quiet (under 10 % of a core in each half second of
    /// the last two), so that no run pays for the one before it, e.g. the deletion of a full
    /// queue. 0: no wait.
    #[arg(long, default_value_t = 30)]
    pub settle_secs: u64,

    /// Instead of the suite: drain a backlog of --rows single-row transactions with
    /// each of these setups of the relay binary, beside the broker alone at --max-in-flight,
    /// --ab-rounds times (the order rotated from round to round); rates, ratios to the first
    /// setup, the relay's and PostgreSQL's CPU per message. A setup is `wal` (the WAL reader
    /// at --max-in-flight), `layout:default` or `layout:debezium` (the WAL reader on rows that
    /// each carry an aggregate, in a table under the contract's column names or Debezium's,
    /// read with `--table-layout debezium --routing-key '{aggregate_type}.{event_type}'`),
    /// `poll:WORKERS` or `poll:WORKERSxBATCH` (polling workers, the relay's default batch size
    /// if none), either poll form optionally ending in `:delete` (--on-published delete). E.g.
    /// `--compare wal,poll:1,poll:5,poll:5x1000`, `--compare layout:default,layout:debezium`.
    #[arg(long, value_name = "SETUPS", value_delimiter = ',', conflicts_with_all = ["ab_with", "cluster_only", "shards_sweep", "emit"])]
    pub compare: Vec<CompareSetup>,

    /// --compare on private PostgreSQL servers of these major versions (e.g. `15,18`), which
    /// this process starts with the same settings and stops afterwards (15: Debian's binaries;
    /// 16-18: scripts/install-postgres.sh's): every setup is drained on each, named
    /// SETUP@pgMAJOR, in the same rounds. Without it, on DATABASE_URL's server.
    #[arg(
        long,
        value_name = "MAJORS",
        value_delimiter = ',',
        requires = "compare"
    )]
    pub compare_pg: Vec<u32>,

    /// --compare with no consumer attached: the rate is messages in the queue per second (the
    /// broker's count, from passive declares), from the relay's start.
    #[arg(long, requires = "compare")]
    pub no_consumer: bool,

    /// --compare also measures each setup's commit→consumer latency at 100 rows/s (one run
    /// per setup, after the drains).
    #[arg(long, requires = "compare")]
    pub compare_latency: bool,
}

impl BenchArgs {
    /// The recovery section's rounds: `--recovery-rounds`, or 3 for `--recovery-only` alone.
    pub fn recovery_rounds(&self) -> u32 {
        match self.recovery_rounds {
            0 if self.recovery_only => 3,
            rounds => rounds,
        }
    }
}

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
    let admin = db::connect(&args.servers.database_url).await?;
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

    /// Fresh names, and `outbox-relay setup` for them (WAL: table, publication, slot,
    /// exchange; poll: table and claim index).
    async fn objects(&mut self, wal: bool) -> Result<Objects> {
        self.sharded_objects(wal, 1).await
    }

    /// [`Bench::objects`] with `setup --shards shards` (WAL mode).
    async fn sharded_objects(&mut self, wal: bool, shards: u32) -> Result<Objects> {
        self.runs += 1;
        let k = self.runs;
        let objects = Objects {
            table: format!("bench_{k}"),
            publication: format!("bench_{k}_pub"),
            slot: format!("bench_{k}_slot"),
            queue: format!("bench_{k}"),
            event_type: format!("bench.{k}"),
            wal,
            shards,
            layout: Layout::Default,
        };
        let mut args = vec!["setup".to_string()];
        args.extend(self.names(&objects));
        if shards > 1 {
            args.extend(["--shards".into(), shards.to_string()]);
        }
        if !wal {
            args.extend(["--mode".into(), "poll".into()]);
        }
        self.relay.run_once(&args).await?;
        Ok(objects)
    }

    fn names(&self, o: &Objects) -> Vec<String> {
        let mut args = vec![
            "--table".to_string(),
            o.table.clone(),
            "--exchange".into(),
            self.args.exchange.clone(),
        ];
        if o.wal {
            args.extend([
                "--publication".into(),
                o.publication.clone(),
                "--slot".into(),
                o.slot.clone(),
            ]);
        }
        args
    }

    /// Renames the table's columns to `layout`'s names (`setup` made the contract's), before
    /// any row or relay.
    async fn use_layout(&self, o: &mut Objects, layout: Layout) -> Result<()> {
        o.layout = layout;
        if layout == Layout::Debezium {
            for (contract, debezium) in DEBEZIUM_COLUMNS {
                self.admin
                    .batch_execute(&format!(
                        "ALTER TABLE {} RENAME COLUMN {} TO {}",
                        quote_ident(&o.table),
                        quote_ident(contract),
                        quote_ident(debezium)
                    ))
                    .await
                    .with_context(|| format!("cannot rename {}.{contract}", o.table))?;
            }
        }
        Ok(())
    }

    async fn drop_objects(&self, o: Objects) -> Result<()> {
        if o.wal {
            let names: Vec<(String, String)> = if o.shards > 1 {
                (0..o.shards)
                    .map(|k| (format!("{}_{k}", o.slot), format!("{}_{k}", o.publication)))
                    .collect()
            } else {
                vec![(o.slot.clone(), o.publication.clone())]
            };
            for (slot, publication) in names {
                self.wait_slot_released(&slot).await?;
                self.admin
                    .execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                         WHERE slot_name = $1",
                        &[&slot],
                    )
                    .await
                    .with_context(|| format!("cannot drop slot {slot}"))?;
                self.admin
                    .batch_execute(&format!(
                        "DROP PUBLICATION IF EXISTS {}",
                        quote_ident(&publication)
                    ))
                    .await?;
            }
            // WAL-mode setup also creates the table's emit functions (docs/emit.md).
            let functions: Vec<String> = ["_emit", "_emit_text", "_emit_bytea"]
                .iter()
                .map(|suffix| quote_ident(&format!("{}{suffix}", o.table)))
                .collect();
            self.admin
                .batch_execute(&format!("DROP FUNCTION IF EXISTS {}", functions.join(", ")))
                .await?;
        }
        self.admin
            .batch_execute(&format!("DROP TABLE IF EXISTS {}", quote_ident(&o.table)))
            .await?;
        Ok(())
    }

    /// Waits until no client backend or walsender but the admin session runs: the seeding
    /// session's, the writers' and the stopped relays' backends exit a moment after their
    /// clients, and only then is their CPU the postmaster's reaped children's, counted once.
    async fn wait_backends_gone(&self) -> Result<()> {
        let deadline = Instant::now() + SLOT_RELEASE;
        loop {
            let others: i64 = self
                .admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE backend_type IN ('client backend', 'walsender') \
                     AND pid <> pg_backend_pid()",
                    &[],
                )
                .await?
                .try_get(0)?;
            if others == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "{others} other PostgreSQL sessions still run {SLOT_RELEASE:?} after the \
                     measured ones ended: PostgreSQL's CPU per message needs a server this \
                     benchmark has to itself"
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until no walsender holds `slot`: the relay has exited, but its walsender may
    /// not have noticed yet, and dropping an active slot fails.
    async fn wait_slot_released(&self, slot: &str) -> Result<()> {
        let deadline = Instant::now() + SLOT_RELEASE;
        loop {
            let active: bool = self
                .admin
                .query_opt(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                    &[&slot],
                )
                .await?
                .map_or(Ok(false), |row| row.try_get(0))?;
            if !active {
                return Ok(());
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "slot {slot} is still in use {SLOT_RELEASE:?} after the relay exited"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn consumer(&self, o: &Objects) -> Result<ArrivalConsumer> {
        ArrivalConsumer::start(&self.endpoints.consume, &self.queue_spec(o)).await
    }

    fn queue_spec(&self, o: &Objects) -> QueueSpec {
        QueueSpec {
            exchange: self.args.exchange.clone(),
            queue: o.queue.clone(),
            arguments: self.endpoints.queue_arguments.clone(),
            binding_key: o.routing_key(),
            purge: true,
            prefetch: 1000,
            delete_on_close: true,
        }
    }

    fn start_relay(&self, setup: Setup, o: &Objects, name: &str) -> Result<Relay> {
        self.start_shard(setup, o, name, 0)
    }

    /// The relay of shard `shard` of `o.shards` (with one shard: the unsharded relay).
    fn start_shard(&self, setup: Setup, o: &Objects, name: &str, shard: u32) -> Result<Relay> {
        let command = match setup {
            Setup::Wal { .. } => "run",
            Setup::Poll { .. } => "poll",
        };
        let mut args = vec![command.to_string()];
        args.extend(self.names(o));
        args.extend(o.layout_args());
        let name = if o.shards > 1 {
            args.extend([
                "--shards".into(),
                o.shards.to_string(),
                "--shard".into(),
                shard.to_string(),
            ]);
            format!("{name}-shard{shard}")
        } else {
            name.to_string()
        };
        match setup {
            Setup::Wal { window } => args.extend([
                "--max-in-flight".into(),
                window.to_string(),
                "--status-interval".into(),
                format!("{}ms", self.args.status_interval_ms),
                // No port to clash with.
                "--metrics-addr".into(),
                "off".into(),
            ]),
            Setup::Poll {
                workers,
                listen,
                batch_size,
                delete,
            } => {
                args.extend(["--workers".into(), workers.to_string()]);
                if let Some(batch_size) = batch_size {
                    args.extend(["--batch-size".into(), batch_size.to_string()]);
                }
                if delete {
                    args.extend(["--on-published".into(), "delete".into()]);
                }
                if listen {
                    args.push("--listen".into());
                }
            }
        }
        // Cleanup would only add deletes to the measurement.
        args.extend(["--cleanup-interval".into(), "0".into()]);
        self.relay
            .spawn(&format!("relay-{}-{name}", o.table), &args)
    }

    /// Commits `rows` rows into the table in `transaction_rows`-row transactions, server side
    /// (one DO block committing as it goes: it writes the same WAL as an application's
    /// transactions, much faster than a client round trip per row). Payloads are ~200-byte
    /// orders shaped like the writers' and the broker-alone messages.
    async fn seed(&self, o: &Objects, rows: u64, transaction_rows: u64) -> Result<()> {
        self.seed_with(o, rows, transaction_rows, Seed::Rows, None)
            .await
    }

    /// [`Bench::seed`] of `seed`'s rows, with payloads of about `payload_bytes` bytes of JSON
    /// text (None: the ~200-byte order).
    async fn seed_with(
        &self,
        o: &Objects,
        rows: u64,
        transaction_rows: u64,
        seed: Seed,
        payload_bytes: Option<u32>,
    ) -> Result<()> {
        let started = Instant::now();
        let client = db::connect(&self.args.servers.database_url).await?;
        // Durability of the seed is not what is measured; the WAL it writes is the same.
        client.batch_execute("SET synchronous_commit = off").await?;
        let table = quote_ident(&o.table);
        let [event_type_column, aggregate_type, aggregate_id] =
            ["event_type", "aggregate_type", "aggregate_id"].map(|c| quote_ident(o.column(c)));
        let event_type = quote_literal(&o.event_type);
        // `pad` is the DO block's variable, set once below.
        let payload = "jsonb_build_object('order_id', i, 'customer_id', i % 9973, 'status', \
                       'created', 'currency', 'EUR', 'total_cents', (i::bigint * 7919) % 100000, \
                       'note', pad)";
        let pad = match payload_bytes {
            None => format!("repeat('x', {ORDER_NOTE_LEN})"),
            // Hex digits, not one letter repeated: TOAST compresses 16 KiB of `x` to ~200
            // bytes, so the WAL, and the walsender's work, would stay small; it stores hex
            // digits uncompressed, out of line like a real payload of that size.
            Some(bytes) => {
                let note_len = self.note_len_for(payload, bytes, rows).await?;
                format!(
                    "(SELECT left(string_agg(md5(k::text), ''), {note_len}) \
                     FROM generate_series(1, {note_len} / 32 + 1) AS k)"
                )
            }
        };
        let write = match seed {
            Seed::Rows => format!(
                "INSERT INTO {table} ({event_type_column}, payload) VALUES ({event_type}, \
                 {payload})"
            ),
            Seed::Aggregates => format!(
                "INSERT INTO {table} ({event_type_column}, payload, {aggregate_id}) VALUES \
                 ({event_type}, {payload}, CASE WHEN i % 10 = 0 THEN NULL ELSE 'agg-' || \
                 (i * 7) % 500 END)"
            ),
            Seed::Orders => format!(
                "INSERT INTO {table} ({event_type_column}, payload, {aggregate_type}, \
                 {aggregate_id}) VALUES ({event_type}, {payload}, {}, 'agg-' || (i % 500))",
                quote_literal(AGGREGATE_TYPE)
            ),
            Seed::Emitted => format!(
                "PERFORM {}({event_type}, {payload})",
                quote_ident(&format!("{}_emit", o.table))
            ),
        };
        let sql = format!(
            "DO $$ DECLARE pad text := {pad}; BEGIN FOR i IN 1..{rows} LOOP {write}; \
               IF i % {transaction_rows} = 0 THEN COMMIT; END IF; \
             END LOOP; END $$"
        );
        client
            .batch_execute(&sql)
            .await
            .with_context(|| format!("cannot seed {}", o.table))?;
        // The seed's dirty pages are written now, not by the next checkpoint or the kernel's
        // writeback while the relay drains: a cluster's quorum queue with no consumer writes
        // every message to disk beside them, and the broker alone it is compared with runs
        // with no seed behind it
        // (crates/outbox-bench/lab/records/2026-12-04-cluster-drain-placement.md).
        client.batch_execute("CHECKPOINT").await?;
        self.say(&format!(
            "seeded {rows} {seed:?} in {transaction_rows}-row transactions in {:.1} s \
             (checkpoint included)",
            started.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    /// The note length that makes `payload`'s JSON text `bytes` long, from the server's own
    /// rendering of the payload with an empty note in the backlog's middle row.
    async fn note_len_for(&self, payload: &str, bytes: u32, rows: u64) -> Result<u32> {
        let middle = (rows / 2).max(1);
        let empty: i32 = self
            .admin
            .query_one(
                &format!(
                    "SELECT octet_length(({payload})::text) \
                     FROM (SELECT {middle}::int AS i, ''::text AS pad) AS s"
                ),
                &[],
            )
            .await
            .context("cannot render an empty payload")?
            .try_get(0)?;
        Ok(bytes.saturating_sub(u32::try_from(empty).unwrap_or(0)))
    }

    /// The average size of the table's payloads as JSON text (the message bodies); None for
    /// a table with no row (emitted events).
    async fn average_payload_bytes(&self, o: &Objects) -> Result<Option<f64>> {
        let average: Option<f64> = self
            .admin
            .query_one(
                &format!(
                    "SELECT avg(octet_length(payload::text))::float8 FROM {}",
                    quote_ident(&o.table)
                ),
                &[],
            )
            .await
            .with_context(|| format!("cannot measure the payloads of {}", o.table))?
            .try_get(0)?;
        Ok(average)
    }

    /// Every id in the table: what the relay must deliver.
    async fn committed_ids(&self, o: &Objects) -> Result<HashSet<String>> {
        let rows = self
            .admin
            .query(
                &format!("SELECT id::text FROM {}", quote_ident(&o.table)),
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| r.try_get::<_, String>(0).map_err(Into::into))
            .collect()
    }

    /// Scenario 1: a backlog of `rows` rows, then the relay; msgs/s received until all arrived
    /// or the window ended, and the relay's CPU and peak RSS meanwhile.
    /// The WAL drain alternately with the relay binary and `other`: A, B, A, B, …
    async fn drain_ab(&mut self, other: PathBuf) -> Result<Vec<AbRun>> {
        let setup = if self.args.ab_setup == "poll5" {
            Setup::Poll {
                workers: 5,
                listen: false,
                batch_size: None,
                delete: false,
            }
        } else {
            Setup::Wal {
                window: self.scale.max_in_flight,
            }
        };
        let binaries = [self.relay.path.clone(), other];
        let mut runs = Vec::new();
        for round in 1..=self.args.ab_rounds {
            for binary in &binaries {
                self.relay.path = binary.clone();
                let drain = self.drain(setup, self.scale.drain_rows, 1).await?;
                runs.push(AbRun {
                    setup: self.args.ab_setup.clone(),
                    binary: binary.display().to_string(),
                    round,
                    drain,
                });
            }
        }
        self.relay.path = binaries[0].clone();
        Ok(runs)
    }

    /// The postmaster's pid: the parent of this session's backend (PostgreSQL on this
    /// machine, as scripts/bench.sh runs it).
    async fn postmaster_pid(&self) -> Result<u32> {
        let backend: i32 = self
            .admin
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let stat = std::fs::read_to_string(format!("/proc/{backend}/stat"))
            .with_context(|| format!("PostgreSQL backend {backend} is not on this machine"))?;
        procfs::parent_pid(&stat)
    }

    async fn drain(&mut self, setup: Setup, rows: u64, transaction_rows: u64) -> Result<Drain> {
        self.drain_spec(DrainSpec {
            setup,
            rows,
            transaction_rows,
            seed: Seed::Rows,
            shards: 1,
            // Only the A/B reads PostgreSQL's CPU in the suite: it needs the server on this
            // machine.
            pg_cpu: self.args.ab_with.is_some(),
            consumer: true,
            layout: Layout::Default,
            payload_bytes: None,
            measure_payload: false,
        })
        .await
    }

    async fn drain_spec(&mut self, spec: DrainSpec) -> Result<Drain> {
        let DrainSpec {
            setup,
            rows,
            transaction_rows,
            seed,
            shards,
            pg_cpu,
            consumer,
            layout,
            payload_bytes,
            measure_payload,
        } = spec;
        let mut o = self
            .sharded_objects(matches!(setup, Setup::Wal { .. }), shards)
            .await?;
        self.use_layout(&mut o, layout).await?;
        self.say(&format!(
            "drain: {setup:?}, {rows} {seed:?} in {transaction_rows}-row transactions, \
             {layout:?} layout, {shards} relay(s) ({}), load {}",
            o.table,
            load_average()
        ));
        if pg_cpu {
            // An autovacuum of the fresh rows would count as PostgreSQL's cost of the drain.
            self.admin
                .batch_execute(&format!(
                    "ALTER TABLE {} SET (autovacuum_enabled = false)",
                    quote_ident(&o.table)
                ))
                .await?;
        }
        let mut counter =
            DrainCounter::start(&self.endpoints.consume, &self.queue_spec(&o), consumer).await?;
        self.seed_with(&o, rows, transaction_rows, seed, payload_bytes)
            .await?;
        // Read before PostgreSQL's CPU is: the scan is not the drain's.
        let avg_payload_bytes = if measure_payload {
            self.average_payload_bytes(&o).await?
        } else {
            None
        };
        let postmaster = if pg_cpu {
            // The seeding session's backend must be gone (and reaped) before the first read.
            self.wait_backends_gone().await?;
            Some(self.postmaster_pid().await?)
        } else {
            None
        };
        let pg_cpu_before = postmaster
            .map(procfs::process_and_children_cpu)
            .transpose()?;
        // The CPU split: RabbitMQ and this process from here; the relay's and its
        // walsenders' at the end (they start with the drain).
        let walsender_parent = match setup {
            Setup::Wal { .. } => self.postmaster_pid().await.ok(),
            Setup::Poll { .. } => None,
        };
        let rabbitmq = self.rabbitmq_pids();
        self.settle(&rabbitmq).await;
        let cpu_probe = CpuProbe::start(&rabbitmq);
        let started = Instant::now();
        let relays = (0..shards)
            .map(|k| self.start_shard(setup, &o, "drain", k))
            .collect::<Result<Vec<Relay>>>()?;
        let window_end = started + Duration::from_secs(self.args.drain_window_secs);
        let (received, last) = counter.wait_for(rows, window_end).await?;
        let mut cpu = Duration::ZERO;
        let mut peak_rss_kib = 0;
        for relay in &relays {
            let usage = relay.usage()?;
            cpu += usage.cpu;
            peak_rss_kib = peak_rss_kib.max(usage.peak_rss_kib);
        }
        let walsender_cpu = match walsender_parent {
            Some(parent) => cpu::walsender_cpu(&self.admin, &o.slot_names(), parent)
                .await
                .map_err(|e| self.say(&format!("  no walsender CPU: {e:#}")))
                .ok(),
            None => None,
        };
        let cpu_split = cpu_probe.finish(received, Some(cpu), walsender_cpu);
        let complete = received >= rows;
        let end = if complete {
            last.unwrap_or(window_end)
        } else {
            window_end
        };
        self.relay_nodes = relays.first().map(Relay::broker_nodes).unwrap_or_default();
        for relay in relays {
            relay.stop().await?;
        }
        let mut pg_cpu_seconds = None;
        if let (Some(pid), Some(before)) = (postmaster, pg_cpu_before) {
            // After the stop: the relays' backends and walsenders have exited and been reaped
            // into the postmaster's children's time.
            self.wait_backends_gone().await?;
            let cpu = procfs::process_and_children_cpu(pid)?.saturating_sub(before);
            pg_cpu_seconds = Some(cpu.as_secs_f64());
        }
        counter.close().await;
        self.drop_objects(o).await?;
        let seconds = end.saturating_duration_since(started).as_secs_f64();
        let cpu_seconds = cpu.as_secs_f64();
        let drain = Drain {
            rows,
            transaction_rows,
            received,
            seconds,
            msgs_per_sec: per_sec(received, seconds),
            complete,
            cpu_seconds,
            cpu_seconds_per_100k: if received > 0 {
                cpu_seconds * 100_000.0 / received as f64
            } else {
                0.0
            },
            peak_rss_mib: peak_rss_kib as f64 / 1024.0,
            pg_cpu_seconds,
            cpu: Some(cpu_split),
            payload_bytes: avg_payload_bytes,
        };
        self.say(&format!(
            "  {:.0} msgs/s ({received} in {seconds:.2} s), cpu {cpu_seconds:.2} s{}, peak rss {:.1} MiB",
            drain.msgs_per_sec,
            pg_cpu_seconds.map_or(String::new(), |s| format!(", PostgreSQL cpu {s:.2} s")),
            drain.peak_rss_mib
        ));
        if let Some(c) = &drain.cpu {
            self.say(&cpu_split_line(c));
        }
        Ok(drain)
    }

    /// `--shards-sweep`: per round, the broker alone at the relay's window, then a
    /// drain with each number of shards (the order rotated from round to round, so drift of
    /// the machine does not favour one), every drain with PostgreSQL's CPU.
    async fn shards_sweep(&mut self, results: &mut Results) -> Result<()> {
        let counts = self.args.shards_sweep.clone();
        let window = self.scale.max_in_flight;
        let rows = self.scale.drain_rows;
        for round in 1..=self.args.ab_rounds {
            self.say(&format!(
                "shards round {round}: broker alone, window {window}, {rows} messages, load {}",
                load_average()
            ));
            let run = self.broker_alone(window, rows, None).await?;
            self.say(&format!(
                "  {:.0} msgs/s received, {:.0} confirmed",
                run.received_per_sec, run.confirmed_per_sec
            ));
            results.shards_broker.push(BrokerLimit {
                window,
                messages: run.messages,
                confirmed_per_sec: run.confirmed_per_sec,
                received_per_sec: run.received_per_sec,
            });
            for shards in rotated(&counts, round) {
                let load = load_average();
                let spec = DrainSpec::of(DrainSetup::Shards(shards), window, rows, true, true);
                let drain = self.drain_spec(spec).await?;
                results.shards.push(ShardRun {
                    round,
                    shards,
                    load,
                    drain,
                });
            }
        }
        Ok(())
    }

    /// `--emit`: writers inserting rows against writers calling `outbox_emit` at
    /// each client count, then the drain of a backlog of each; the variants alternate.
    async fn emit(&mut self, results: &mut Results) -> Result<()> {
        let window = self.scale.max_in_flight;
        let rows = self.scale.drain_rows;
        for round in 1..=self.args.ab_rounds {
            // Emit first in even rounds.
            let variants = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for clients in self.args.emit_clients.clone() {
                for emit in variants {
                    let run = self.emit_writers(round, clients, emit).await?;
                    results.emit_writers.push(run);
                }
            }
            for emit in variants {
                let load = load_average();
                let setup = if emit {
                    DrainSetup::Emit
                } else {
                    DrainSetup::WAL
                };
                let drain = self
                    .drain_spec(DrainSpec::of(setup, window, rows, true, true))
                    .await?;
                results.emit_drains.push(EmitDrainRun {
                    round,
                    variant: variant_name(emit).into(),
                    load,
                    drain,
                });
            }
        }
        Ok(())
    }

    /// `clients` writers, one event per transaction, for --emit-secs, no relay: events/s and
    /// the WAL written per event (pg_current_wal_lsn before and after, commit records included).
    async fn emit_writers(
        &mut self,
        round: u32,
        clients: u32,
        emit: bool,
    ) -> Result<EmitWriterRun> {
        let o = self.objects(true).await?;
        let load = load_average();
        self.say(&format!(
            "emit writers: {}, {clients} clients for {} s, load {load}",
            variant_name(emit),
            self.args.emit_secs
        ));
        let lsn = "SELECT pg_current_wal_lsn()::text";
        let before: String = self.admin.query_one(lsn, &[]).await?.try_get(0)?;
        let options = WriterOptions {
            until: Some(Instant::now() + Duration::from_secs(self.args.emit_secs)),
            note_len: ORDER_NOTE_LEN,
            emit,
            ..WriterOptions::new(clients, u64::MAX, 1, &o.table, &o.event_type)
        };
        let written = writers::write(&self.args.servers.database_url, &options).await?;
        let wal_bytes: f64 = self
            .admin
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8",
                &[&before],
            )
            .await?
            .try_get(0)?;
        self.drop_objects(o).await?;
        let events = written.rows.len() as u64;
        let seconds = match (written.started, written.last_commit()) {
            (Some(start), Some(last)) => last.saturating_duration_since(start).as_secs_f64(),
            _ => 0.0,
        };
        let run = EmitWriterRun {
            round,
            variant: variant_name(emit).into(),
            clients,
            load,
            events,
            seconds,
            events_per_sec: per_sec(events, seconds),
            wal_bytes_per_event: if events > 0 {
                wal_bytes / events as f64
            } else {
                0.0
            },
        };
        self.say(&format!(
            "  {:.0} events/s, {:.0} WAL bytes per event",
            run.events_per_sec, run.wal_bytes_per_event
        ));
        Ok(run)
    }

    /// Scenario 2: one writer at a fixed rate, one row per transaction.
    async fn latency(&mut self, setup: Setup) -> Result<LatencyRun> {
        let rate = self.scale.latency_rate;
        let rows = u64::from(rate) * self.scale.latency_secs;
        let o = self.objects(matches!(setup, Setup::Wal { .. })).await?;
        self.say(&format!(
            "latency: {setup:?}, {rate} rows/s for {} s",
            self.scale.latency_secs
        ));
        let consumer = self.consumer(&o).await?;
        let relay = self.start_relay(setup, &o, "latency")?;
        relay.ready().await?;
        let options = WriterOptions {
            pace: Some(Duration::from_secs(1) / rate),
            note_len: ORDER_NOTE_LEN,
            ..WriterOptions::new(1, rows, 1, &o.table, &o.event_type)
        };
        let written = writers::write(&self.args.servers.database_url, &options).await?;
        let report = collect(consumer, &written, CATCH_UP).await?;
        self.relay_nodes = relay.broker_nodes();
        relay.stop().await?;
        self.drop_objects(o).await?;
        let latency = report.latency.map(LatencyMs::from);
        if let Some(l) = &latency {
            self.say(&format!(
                "  avg {:.2} ms, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                l.avg, l.p50, l.p99, l.max
            ));
        }
        Ok(LatencyRun {
            rate,
            rows: written.rows.len() as u64,
            missing: report.missing as u64,
            latency,
        })
    }

    /// Scenario 3: 100 writers as fast as they can for the load window, with a relay (or none:
    /// the ceiling), optionally waking a listening poller with NOTIFY.
    async fn load(&mut self, setup: Option<Setup>, notify: Notify) -> Result<LoadRun> {
        let wal = matches!(setup, Some(Setup::Wal { .. }));
        let o = self.objects(wal).await?;
        let writers_n = self.scale.load_writers;
        self.say(&format!(
            "load: {setup:?}, {notify:?}, {writers_n} writers for {} s",
            self.scale.load_secs
        ));
        if notify == Notify::Trigger {
            let function = quote_ident(&format!("{}_notify", o.table));
            self.admin
                .batch_execute(&format!(
                    "CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ \
                     BEGIN PERFORM pg_notify({channel}, ''); RETURN NEW; END $$; \
                     CREATE TRIGGER notify AFTER INSERT ON {table} \
                     FOR EACH ROW EXECUTE FUNCTION {function}();",
                    channel = quote_literal(LISTEN_CHANNEL),
                    table = quote_ident(&o.table),
                ))
                .await
                .context("cannot create the NOTIFY trigger")?;
        }
        let mut running = None;
        if let Some(setup) = setup {
            let consumer = self.consumer(&o).await?;
            let relay = self.start_relay(setup, &o, "load")?;
            relay.ready().await?;
            running = Some((consumer, relay));
        }
        let options = WriterOptions {
            until: Some(Instant::now() + Duration::from_secs(self.scale.load_secs)),
            notify: (notify == Notify::AfterCommit).then(|| LISTEN_CHANNEL.to_string()),
            note_len: ORDER_NOTE_LEN,
            ..WriterOptions::new(writers_n, u64::MAX, 1, &o.table, &o.event_type)
        };
        let written = writers::write(&self.args.servers.database_url, &options).await?;
        let committed = written.rows.len() as u64;
        let seconds = match (written.started, written.last_commit()) {
            (Some(start), Some(last)) => last.saturating_duration_since(start).as_secs_f64(),
            _ => 0.0,
        };
        let mut run = LoadRun {
            writers: writers_n,
            seconds: self.scale.load_secs,
            committed,
            orders_per_sec: per_sec(committed, seconds),
            missing: 0,
            latency: None,
        };
        if let Some((consumer, relay)) = running {
            let report = collect(consumer, &written, CATCH_UP).await?;
            relay.stop().await?;
            run.missing = report.missing as u64;
            run.latency = report.latency.map(LatencyMs::from);
        }
        if notify == Notify::Trigger {
            let function = quote_ident(&format!("{}_notify", o.table));
            self.drop_objects(o).await?;
            self.admin
                .batch_execute(&format!("DROP FUNCTION IF EXISTS {function}()"))
                .await?;
        } else {
            self.drop_objects(o).await?;
        }
        self.say(&format!(
            "  {:.0} orders/s committed; avg commit→consumer {}; {} missing",
            run.orders_per_sec,
            run.latency
                .as_ref()
                .map_or("—".to_string(), |l| format!("{:.2} ms", l.avg)),
            run.missing
        ));
        Ok(run)
    }

    /// Scenario 4: kill -9 the relay partway through a backlog, restart it, count what the
    /// consumer got against the ids in the table.
    async fn crash(&mut self, setup: Setup, rows: u64) -> Result<Crash> {
        let o = self.objects(matches!(setup, Setup::Wal { .. })).await?;
        self.say(&format!("crash: {setup:?}, {rows} rows ({})", o.table));
        let mut consumer = self.consumer(&o).await?;
        self.seed(&o, rows, 1).await?;
        let expected = self.committed_ids(&o).await?;
        let deadline = Instant::now() + CRASH_TIMEOUT;
        let relay = self.start_relay(setup, &o, "crash-1")?;
        let mut counter = Distinct::default();
        let kill_at = ((rows as f64) * KILL_AT) as usize;
        while counter.count() < kill_at {
            if !consumer.wait_for_more(deadline).await? {
                anyhow::bail!("the crash backlog stalled before the kill point");
            }
            counter.add(consumer.arrivals());
        }
        relay.kill();
        // The delivery rate while the relay ran, from its first delivery (startup excluded).
        let delivering = counter.first.map_or(Duration::ZERO, |first| {
            Instant::now().saturating_duration_since(first)
        });
        let received_before_kill = counter.count() as u64;
        let relay = self.start_relay(setup, &o, "crash-2")?;
        while counter.count() < expected.len() {
            if !consumer.wait_for_more(deadline).await? {
                break;
            }
            counter.add(consumer.arrivals());
        }
        relay.stop().await?;
        consumer
            .wait_quiet(QUIET, Instant::now() + QUIET * 5)
            .await?;
        let arrivals = consumer.close().await;
        self.drop_objects(o).await?;
        let mut seen = HashSet::with_capacity(expected.len());
        let mut duplicates = 0u64;
        for id in arrivals.iter().filter_map(|a| a.message_id.as_deref()) {
            if expected.contains(id) && !seen.insert(id) {
                duplicates += 1;
            }
        }
        let lost = (expected.len() - seen.len()) as u64;
        let duplicate_bound = match setup {
            Setup::Wal { window } => {
                let rate = per_sec(received_before_kill, delivering.as_secs_f64());
                let status_interval = Duration::from_millis(self.args.status_interval_ms);
                // 1: the confirmed rows of the open transaction (one row each here).
                let bound = relay_crash_duplicate_bound(window as usize, rate, status_interval, 1);
                Some(bound as u64)
            }
            Setup::Poll { .. } => None,
        };
        self.say(&format!(
            "  killed after {received_before_kill} received; lost {lost}, duplicates {duplicates}{}",
            duplicate_bound.map_or(String::new(), |b| format!(" (bound {b})"))
        ));
        Ok(Crash {
            rows,
            received_before_kill,
            lost,
            duplicates,
            duplicate_bound,
        })
    }

    /// Scenario 5: broker alone at every window, its latency at the writer's rate, and
    /// decoding alone.
    async fn limits(&mut self, results: &mut Results) -> Result<()> {
        let mut windows: Vec<u32> = self.args.sweep.clone();
        if !windows.contains(&self.args.max_in_flight) {
            windows.push(self.args.max_in_flight);
        }
        windows.sort_unstable();
        for window in windows {
            self.say(&format!(
                "broker alone: window {window}, {} messages",
                self.scale.drain_rows
            ));
            let run = self
                .broker_alone(window, self.scale.drain_rows, None)
                .await?;
            self.say(&format!(
                "  {:.0} msgs/s received, {:.0} confirmed",
                run.received_per_sec, run.confirmed_per_sec
            ));
            if window == self.args.max_in_flight {
                self.say(&cpu_split_line(&run.cpu));
                results.limits.broker_cpu = Some(run.cpu.clone());
            }
            results.limits.broker.push(BrokerLimit {
                window,
                messages: run.messages,
                confirmed_per_sec: run.confirmed_per_sec,
                received_per_sec: run.received_per_sec,
            });
        }
        let rate = self.scale.latency_rate;
        self.say(&format!(
            "broker alone: {rate} msgs/s for {} s",
            self.scale.latency_secs
        ));
        let messages = u64::from(rate) * self.scale.latency_secs;
        let paced = self
            .broker_alone(self.args.max_in_flight, messages, Some(rate))
            .await?;
        results.limits.broker_latency = paced.latency.map(LatencyMs::from);
        results.limits.broker_latency_rate = rate;
        if let Some(l) = &results.limits.broker_latency {
            self.say(&format!(
                "  publish→consumer p50 {:.2} ms, p99 {:.2} ms",
                l.p50, l.p99
            ));
        }

        let o = self.objects(true).await?;
        let rows = self.scale.drain_rows;
        self.say(&format!("decoding alone: {rows} rows"));
        self.seed(&o, rows, 1).await?;
        let decoded = limits::decode_alone(
            &self.args.servers.database_url,
            &o.slot,
            &o.publication,
            &o.table,
            &self.args.exchange,
            rows,
        )
        .await?;
        self.drop_objects(o).await?;
        self.say(&format!("  {:.0} rows/s", decoded.rows_per_sec));
        results.limits.decode = Some(DecodeLimit {
            rows,
            rows_per_sec: decoded.rows_per_sec,
            method: "pgwire-replication + our decoder and mapper, nothing published".into(),
        });
        self.independent_limits(results).await
    }

    /// The limits that share no code with the relay ([`independent`]): broker alone
    /// with the minimal publisher at --max-in-flight, with the consumer and without, then the
    /// walsender ceiling on a backlog like the drain's.
    /// One run of the minimal publisher (broker alone, no relay code) on a queue of its own.
    async fn bare_broker(
        &mut self,
        window: u32,
        messages: u64,
        consumer: bool,
    ) -> Result<BareBrokerLimit> {
        self.settle(&self.rabbitmq_pids()).await;
        self.runs += 1;
        let queue = format!("bench_{}", self.runs);
        let run = independent::bare_broker_alone(&BareBroker {
            url: &self.endpoints.publish,
            consume_url: &self.endpoints.consume,
            exchange: &self.args.exchange,
            queue: &queue,
            queue_arguments: self.endpoints.queue_arguments.clone(),
            nodes: &self.endpoints.nodes,
            window: window as usize,
            messages,
            consumer,
        })
        .await?;
        self.say(&format!(
            "  {} msgs/s received, {:.0} confirmed",
            run.received_per_sec
                .map_or("—".to_string(), |r| format!("{r:.0}")),
            run.confirmed_per_sec
        ));
        Ok(run)
    }

    async fn independent_limits(&mut self, results: &mut Results) -> Result<()> {
        let window = self.args.max_in_flight;
        let messages = self.scale.drain_rows;
        for consumer in [true, false] {
            self.say(&format!(
                "broker alone, minimal publisher: window {window}, {messages} messages, {}",
                if consumer {
                    "consumer attached"
                } else {
                    "no consumer"
                }
            ));
            let run = self.bare_broker(window, messages, consumer).await?;
            if let Some(c) = &run.cpu {
                self.say(&cpu_split_line(c));
            }
            if consumer {
                results.limits.bare_broker = Some(run);
            } else {
                results.limits.bare_broker_no_consumer = Some(run);
            }
        }

        let rows = self.scale.drain_rows.max(1);
        let o = self.objects(true).await?;
        self.say(&format!(
            "walsender ceiling: {rows} rows streamed by pg_recvlogical"
        ));
        // The last row is committed on its own, for pg_recvlogical to stop at its commit.
        self.seed(&o, rows - 1, 1).await?;
        let endpos =
            independent::end_marker_row(&self.admin, &o.table, &o.event_type, rows).await?;
        let bin = independent::pg_recvlogical(&self.admin).await?;
        let run = independent::walsender_ceiling(
            &bin,
            &self.args.servers.database_url,
            &o.slot,
            &o.publication,
            &endpos,
            rows,
        )
        .await?;
        self.drop_objects(o).await?;
        self.say(&format!(
            "  {:.0} rows/s ({rows} in {:.2} s)",
            run.rows_per_sec, run.seconds
        ));
        results.limits.walsender = Some(run);
        self.consumer_pairs(results).await
    }

    /// `--pin-broker`: the RabbitMQ node on its CPU, the postmaster with its processes and this
    /// process on the others.
    async fn pin_broker(&self, pinning: &Pinning) -> Result<()> {
        let rabbitmq = self.rabbitmq_pids();
        if rabbitmq.is_empty() {
            anyhow::bail!(
                "--pin-broker: no RabbitMQ process of this machine listens on the broker's ports"
            );
        }
        for pid in rabbitmq {
            pinning::pin_with_children(pid, &pinning.broker)?;
        }
        pinning::pin_with_children(self.postmaster_pid().await?, &pinning.others)?;
        pinning::pin_with_children(std::process::id(), &pinning.others)?;
        self.say(&pinning.describe());
        Ok(())
    }

    /// Waits (at most --settle-secs) for the broker's nodes to go quiet before a measured run;
    /// says so when that took a while or did not happen.
    async fn settle(&self, rabbitmq: &[u32]) {
        if self.args.settle_secs == 0 || rabbitmq.is_empty() {
            return;
        }
        let limit = Duration::from_secs(self.args.settle_secs);
        let settle = cpu::wait_quiet(rabbitmq, limit).await;
        let waited = settle.waited.as_secs_f64();
        match settle.share {
            None => self.say("  RabbitMQ's CPU cannot be read: not waiting for it to go quiet"),
            Some(share) if !settle.quiet => self.say(&format!(
                "  RabbitMQ still busy after {waited:.1} s ({:.0} % of a core): measuring anyway",
                share * 100.0
            )),
            Some(share) if waited >= 3.0 => self.say(&format!(
                "  RabbitMQ quiet after {waited:.1} s ({:.0} % of a core)",
                share * 100.0
            )),
            Some(_) => {}
        }
    }

    /// The RabbitMQ processes of every node of the broker (`Endpoints::nodes`), if they run on
    /// this machine: not only the relay's URLs, since a relay pinned to one node of a cluster
    /// still costs the others.
    fn rabbitmq_pids(&self) -> Vec<u32> {
        match cpu::rabbitmq_pids(&self.endpoints.nodes) {
            Ok(pids) if !pids.is_empty() => pids,
            Ok(_) => {
                self.say("  no process here listens on the broker's AMQP ports: no RabbitMQ CPU");
                Vec::new()
            }
            Err(e) => {
                self.say(&format!("  no RabbitMQ CPU: {e:#}"));
                Vec::new()
            }
        }
    }

    /// The broker alone ([`limits::broker_alone`]) on a fresh queue, ~200-byte orders.
    async fn broker_alone(
        &mut self,
        window: u32,
        messages: u64,
        rate: Option<u32>,
    ) -> Result<limits::BrokerRun> {
        self.broker_alone_padded(window, messages, rate, ORDER_NOTE_LEN)
            .await
    }

    /// [`Bench::broker_alone`] with `note_len` bytes of padding in each payload.
    async fn broker_alone_padded(
        &mut self,
        window: u32,
        messages: u64,
        rate: Option<u32>,
        note_len: u32,
    ) -> Result<limits::BrokerRun> {
        self.settle(&self.rabbitmq_pids()).await;
        self.runs += 1;
        let queue = format!("bench_{}", self.runs);
        let window = window as usize;
        limits::broker_alone(
            &self.endpoints,
            &self.args.exchange,
            &queue,
            window,
            messages,
            rate,
            note_len,
        )
        .await
    }

    /// The cluster section: the WAL drain and the latency at the fixed rate through
    /// a private 3-node RabbitMQ cluster with a quorum queue, each beside the broker alone on
    /// the same cluster in the same placement. The cluster is started here and stopped after.
    async fn cluster(&mut self, results: &mut Results) -> Result<()> {
        let started = Instant::now();
        let (mut c, startup_secs) = self
            .on_cluster(async |b: &mut Bench, cluster: &'static RabbitCluster| {
                b.cluster_runs(cluster).await
            })
            .await?;
        c.startup_secs = startup_secs;
        c.seconds = started.elapsed().as_secs_f64();
        self.say(&format!(
            "cluster: section took {:.0} s (cluster start {startup_secs:.0} s)",
            c.seconds
        ));
        results.cluster = Some(c);
        Ok(())
    }

    /// Starts a private 3-node RabbitMQ cluster, points the relay (every node's URL), the
    /// consumers and the broker-alone publisher (node [`LEADER`], quorum queues) at it, runs
    /// `run`, then points them back and stops the cluster, also when `run` failed. Returns
    /// what `run` returned and how long the cluster took to start, in seconds.
    async fn on_cluster<T>(
        &mut self,
        run: impl AsyncFnOnce(&mut Bench, &'static RabbitCluster) -> Result<T>,
    ) -> Result<(T, f64)> {
        let started = Instant::now();
        self.say("cluster: starting a private 3-node RabbitMQ cluster (pause_minority)");
        let cluster = tokio::task::spawn_blocking(RabbitCluster::shared)
            .await
            .map_err(|e| anyhow!("the RabbitMQ cluster did not start: {}", panic_text(e)))?;
        let startup_secs = started.elapsed().as_secs_f64();
        // Every queue is declared through LEADER's node by the consumer connected there.
        let relay_url = std::mem::replace(&mut self.relay.amqp_url, cluster.url_list());
        let endpoints = std::mem::replace(
            &mut self.endpoints,
            Endpoints {
                publish: cluster.url(LEADER),
                consume: cluster.url(LEADER),
                queue_arguments: quorum_queue_arguments(),
                nodes: cluster.url_list(),
            },
        );
        let measured = run(self, cluster).await;
        self.relay.amqp_url = relay_url;
        self.endpoints = endpoints;
        // The shared cluster cannot start again once stopped: the recovery section, which
        // runs after this one, stops it.
        if self.args.recovery_rounds() == 0 {
            cluster.shutdown();
        }
        Ok((measured?, startup_secs))
    }

    async fn cluster_runs(&mut self, cluster: &'static RabbitCluster) -> Result<ClusterResults> {
        let leader_node = quorum_leader_of_new_queue(cluster, LEADER).await?;
        self.say(&format!(
            "cluster: a quorum queue declared through node {LEADER} is led by node {leader_node}"
        ));
        let window = self.scale.max_in_flight;
        let setup = Setup::Wal { window };
        let rows = self.scale.drain_rows;
        self.say("cluster: relay given all three nodes' URLs, consumer on the queue's leader");
        let drain = self.drain(setup, rows, 1).await?;
        let drain_relay_nodes = self.relay_node_indexes(cluster);
        // The broker alone publishes through the node the relay used: the same hops.
        let broker_publisher_node = publisher_node(&drain_relay_nodes, leader_node, cluster.len());
        self.endpoints.publish = cluster.url(broker_publisher_node);
        self.say(&format!(
            "cluster: broker alone, window {window}, {rows} messages, publisher on node \
             {broker_publisher_node} (the relay's: {drain_relay_nodes:?})"
        ));
        let run = self.broker_alone(window, rows, None).await?;
        self.say(&format!(
            "  {:.0} msgs/s received, {:.0} confirmed",
            run.received_per_sec, run.confirmed_per_sec
        ));
        let broker = BrokerLimit {
            window,
            messages: run.messages,
            confirmed_per_sec: run.confirmed_per_sec,
            received_per_sec: run.received_per_sec,
        };

        // Chart 1's cluster figures with no consumer: the relay given only the queue leader's
        // URL and the minimal publisher through the same node. A publish through a follower
        // is forwarded to the leader, and the relay picks a node at random: compared with a
        // publisher on another node, the ratio measured the placement (54-63 % with the relay
        // on a follower against the leader, 100-117 % the other way round, in the runs of
        // 2026-12-04), not the relay.
        self.say(&format!(
            "cluster: WAL drain, no consumer, relay given only the leader's URL (node {leader_node})"
        ));
        let all_nodes = std::mem::replace(&mut self.relay.amqp_url, cluster.url(leader_node));
        let drain_no_consumer = self
            .drain_spec(DrainSpec::of(DrainSetup::WAL, window, rows, false, false))
            .await;
        self.relay.amqp_url = all_nodes;
        let drain_no_consumer = drain_no_consumer?;
        let drain_no_consumer_relay_nodes = self.relay_node_indexes(cluster);
        let mut bare = [None, None];
        let placements = [(true, broker_publisher_node), (false, leader_node)];
        for (slot, (consumer, node)) in bare.iter_mut().zip(placements) {
            self.endpoints.publish = cluster.url(node);
            self.say(&format!(
                "cluster: broker alone, minimal publisher, window {window}, {rows} messages, {}, \
                 publisher on node {node}",
                if consumer {
                    "consumer attached"
                } else {
                    "no consumer"
                }
            ));
            *slot = Some(self.bare_broker(window, rows, consumer).await?);
        }
        let [bare_broker, bare_broker_no_consumer] = bare;
        let mut no_consumer_pairs = Vec::new();
        if let Some(broker) = &bare_broker_no_consumer {
            if self.args.cluster_rounds > 1 {
                no_consumer_pairs.push(PublisherPair {
                    round: 1,
                    relay_first: true,
                    drain: drain_no_consumer.clone(),
                    broker: broker.clone(),
                });
            }
        }
        for round in 2..=self.args.cluster_rounds {
            let pair = self.no_consumer_pair(cluster, leader_node, round).await?;
            no_consumer_pairs.push(pair);
        }
        // The same pairs through a follower, which forwards every publish to the leader.
        let follower_node = (leader_node + 1) % cluster.len();
        let mut follower_pairs = Vec::new();
        for round in 1..=self.args.cluster_follower_pairs {
            let pair = self.no_consumer_pair(cluster, follower_node, round).await?;
            follower_pairs.push(pair);
        }

        let latency = self.latency(setup).await?;
        let latency_relay_nodes = self.relay_node_indexes(cluster);
        let broker_latency_publisher_node =
            publisher_node(&latency_relay_nodes, leader_node, cluster.len());
        self.endpoints.publish = cluster.url(broker_latency_publisher_node);
        let rate = self.scale.latency_rate;
        self.say(&format!(
            "cluster: broker alone, {rate} msgs/s for {} s, publisher on node \
             {broker_latency_publisher_node} (the relay's: {latency_relay_nodes:?})",
            self.scale.latency_secs
        ));
        let messages = u64::from(rate) * self.scale.latency_secs;
        let paced = self.broker_alone(window, messages, Some(rate)).await?;
        let broker_latency = paced.latency.map(LatencyMs::from);
        if let Some(l) = &broker_latency {
            self.say(&format!(
                "  publish→consumer p50 {:.2} ms, p99 {:.2} ms",
                l.p50, l.p99
            ));
        }
        Ok(ClusterResults {
            nodes: cluster.len(),
            queue_type: "quorum".into(),
            declared_through: LEADER,
            leader_node,
            window,
            drain,
            drain_relay_nodes,
            broker,
            broker_publisher_node,
            latency,
            latency_relay_nodes,
            broker_latency,
            broker_latency_publisher_node,
            broker_latency_rate: rate,
            drain_no_consumer: Some(drain_no_consumer),
            drain_no_consumer_relay_nodes,
            bare_broker,
            bare_broker_no_consumer,
            no_consumer_node: Some(leader_node),
            no_consumer_pairs,
            follower_node: (!follower_pairs.is_empty()).then_some(follower_node),
            follower_pairs,
            startup_secs: 0.0,
            seconds: 0.0,
        })
    }

    /// One more pair of the consumer-less runs through `node`: the minimal publisher first in
    /// even rounds, the relay's drain first in odd ones (through the leader, round 1 is the
    /// section's own pair, relay first).
    async fn no_consumer_pair(
        &mut self,
        cluster: &'static RabbitCluster,
        node: usize,
        round: u32,
    ) -> Result<PublisherPair> {
        let relay_first = round % 2 == 1;
        self.say(&format!(
            "cluster: consumer-less pair {round}, through node {node}, {} first",
            if relay_first {
                "the relay"
            } else {
                "the minimal publisher"
            }
        ));
        self.endpoints.publish = cluster.url(node);
        let all_nodes = std::mem::replace(&mut self.relay.amqp_url, cluster.url(node));
        let runs = self.publisher_pair_runs(relay_first, false).await;
        self.relay.amqp_url = all_nodes;
        let (drain, broker) = runs?;
        let pair = PublisherPair {
            round,
            relay_first,
            drain,
            broker,
        };
        self.say(&format!("  ratio {:.2}", pair.ratio()));
        Ok(pair)
    }

    /// The WAL drain and the minimal publisher, both with a consumer or both without, in that
    /// order or the other, on the endpoints and relay URL already set.
    async fn publisher_pair_runs(
        &mut self,
        relay_first: bool,
        consumer: bool,
    ) -> Result<(Drain, BareBrokerLimit)> {
        let window = self.scale.max_in_flight;
        let rows = self.scale.drain_rows;
        let relay = DrainSpec::of(DrainSetup::WAL, window, rows, false, consumer);
        if relay_first {
            let drain = self.drain_spec(relay).await?;
            Ok((drain, self.bare_broker(window, rows, consumer).await?))
        } else {
            let broker = self.bare_broker(window, rows, consumer).await?;
            Ok((self.drain_spec(relay).await?, broker))
        }
    }

    /// `--single-node-pairs`: the WAL drain and the minimal publisher, consumer attached, in
    /// adjacent pairs, the relay first in odd pairs.
    async fn consumer_pairs(&mut self, results: &mut Results) -> Result<()> {
        for round in 1..=self.args.single_node_pairs {
            let relay_first = round % 2 == 1;
            self.say(&format!(
                "single node: consumer-attached pair {round}, {} first",
                if relay_first {
                    "the relay"
                } else {
                    "the minimal publisher"
                }
            ));
            let (drain, broker) = self.publisher_pair_runs(relay_first, true).await?;
            let pair = PublisherPair {
                round,
                relay_first,
                drain,
                broker,
            };
            self.say(&format!("  ratio {:.2}", pair.ratio()));
            results.limits.consumer_pairs.push(pair);
        }
        Ok(())
    }

    /// The cluster's indexes of the nodes the newest relay connected to, in order.
    fn relay_node_indexes(&self, cluster: &RabbitCluster) -> Vec<usize> {
        self.relay_nodes
            .iter()
            .filter_map(|node| node.rsplit(':').next()?.parse().ok())
            .filter_map(|port| cluster.index_of_port(port))
            .collect()
    }

    /// Scenario 6's sweep: WAL drain, p99 at the fixed rate and crash duplicates at each
    /// --max-in-flight (the default's figures are reused when the backlog is the same).
    async fn sweep(&mut self, results: &mut Results) -> Result<()> {
        let rows = self.scale.sweep_rows;
        for window in self.args.sweep.clone() {
            let wal = results
                .wal()
                .filter(|_| window == self.args.max_in_flight && rows == self.scale.drain_rows);
            let (drain, latency, crash) = match wal {
                Some(m) => (m.drain.clone(), m.latency.clone(), m.crash.clone()),
                None => (None, None, None),
            };
            let setup = Setup::Wal { window };
            let drain = match drain {
                Some(d) => d,
                None => self.drain(setup, rows, 1).await?,
            };
            let latency = match latency {
                Some(l) => l,
                None => self.latency(setup).await?,
            };
            let crash = match crash {
                Some(c) => c,
                None => self.crash(setup, rows).await?,
            };
            results.sweep.push(SweepRow {
                window,
                drain_msgs_per_sec: drain.msgs_per_sec,
                p99_ms: latency.latency.map(|l| l.p99),
                crash_lost: crash.lost,
                crash_duplicates: crash.duplicates,
                duplicate_bound: crash.duplicate_bound.unwrap_or(0),
                broker_msgs_per_sec: results
                    .limits
                    .broker_at(window)
                    .map_or(0.0, |b| b.received_per_sec),
            });
        }
        Ok(())
    }
}

/// The cluster node whose connection declares every queue of the cluster section.
const LEADER: usize = 0;

/// The node the broker alone publishes through: the relay's first, or if its log did not say,
/// the one after the leader (a relay that is not on the leader's node is the likelier case).
fn publisher_node(relay_nodes: &[usize], leader: usize, nodes: usize) -> usize {
    relay_nodes.first().copied().unwrap_or((leader + 1) % nodes)
}

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
fn cpu_split_line(c: &crate::cpu::CpuSplit) -> String {
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
