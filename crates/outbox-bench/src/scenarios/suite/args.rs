//! The flags of `outbox-bench bench`.

use std::path::PathBuf;

use clap::Args;

use crate::scenarios::compare::CompareSetup;
use crate::Servers;

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
