//! The benchmark's figures (serialised as JSON for tracking across commits) and their Markdown
//! rendering: the reference table's shape first, then the detail behind each column.
//!
//! Pure data and formatting; `suite` fills it in.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::compare::CompareResults;
use crate::cpu::CpuSplit;
use crate::independent::{BareBrokerLimit, WalsenderLimit};
use crate::report::Latency;
use crate::setups::{self, SetupDrains};

/// The relay setups the reference compares.
pub const MODES: [&str; 3] = ["1 polling worker", "5 polling workers", "WAL reader"];

/// Read back by `outbox-bench charts` (crate::charts); `serde(default)` here and on the
/// sections that grew over time lets a file written before a field existed still be read.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Results {
    pub machine: Machine,
    pub scale: Scale,
    /// One per entry of [`MODES`], in that order.
    pub modes: Vec<ModeResults>,
    pub notify: Option<NotifyResults>,
    pub limits: Limits,
    pub sweep: Vec<SweepRow>,
    /// `--ab-with`: the WAL drain of two relay binaries, alternated (the suite is not run).
    pub ab: Vec<AbRun>,
    /// `--cluster` / `--cluster-only`: the WAL reader through a 3-node cluster.
    pub cluster: Option<ClusterResults>,
    /// `--shards-sweep`: drains with N sharded relays (the suite is not run).
    pub shards: Vec<ShardRun>,
    /// `--shards-sweep`: the broker alone at the relays' window, once per round.
    pub shards_broker: Vec<BrokerLimit>,
    /// `--emit`: writers inserting rows against writers calling `outbox_emit`.
    pub emit_writers: Vec<EmitWriterRun>,
    /// `--emit`: the WAL relay's drain of a backlog of rows and of emitted events.
    pub emit_drains: Vec<EmitDrainRun>,
    /// `--compare`: drains of setups of one relay binary (the suite is not run).
    pub compare: Option<CompareResults>,
    /// The suite's drain of every setup, consumer attached and none (issue 26).
    pub setups: Option<SetupDrains>,
}

/// One drain of `--shards-sweep`: `shards` relays, one per shard, into one queue; the drain's
/// CPU is all relays' together, its peak RSS the largest relay's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardRun {
    pub round: u32,
    pub shards: u32,
    /// /proc/loadavg when the drain started (1, 5, 15 minutes).
    pub load: String,
    pub drain: Drain,
}

/// One writer run of `--emit`: one event per transaction, no relay running.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EmitWriterRun {
    pub round: u32,
    /// `table insert` or `outbox_emit`.
    pub variant: String,
    pub clients: u32,
    pub load: String,
    pub events: u64,
    /// From the first `BEGIN` to the last commit.
    pub seconds: f64,
    pub events_per_sec: f64,
    /// WAL written during the run (pg_current_wal_lsn) over the events committed.
    pub wal_bytes_per_event: f64,
}

/// One drain of `--emit`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EmitDrainRun {
    pub round: u32,
    pub variant: String,
    pub load: String,
    pub drain: Drain,
}

/// /proc/loadavg's 1, 5 and 15-minute figures (empty where there is none): the machine is
/// shared, and the load says how far to trust a figure.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The median (the upper one of an even count); 0 for none.
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// One drain's cells of a per-run table: MPS, relay CPU and PostgreSQL CPU per message,
/// peak RSS, complete.
pub(crate) fn drain_run_cells(d: &Drain) -> String {
    format!(
        "{} | {:.1} | {} | {:.1} | {}",
        int(d.msgs_per_sec),
        us_per_msg(d.cpu_seconds, d),
        or_dash(d.pg_cpu_seconds, |c| format!("{:.1}", us_per_msg(c, d))),
        d.peak_rss_mib,
        d.complete
    )
}

/// Microseconds per message of `seconds` of CPU over a drain's received messages.
pub(crate) fn us_per_msg(seconds: f64, d: &Drain) -> f64 {
    if d.received > 0 {
        seconds * 1e6 / d.received as f64
    } else {
        0.0
    }
}

/// The cluster section (issue 11): the WAL reader through a 3-node RabbitMQ cluster
/// (`pause_minority`) into a quorum queue, beside the broker alone on the same cluster, in
/// the same placement, in the same run. Nodes are the cluster's indexes (0, 1, 2).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClusterResults {
    pub nodes: usize,
    pub queue_type: String,
    /// The node every queue was declared through (its consumer connects there).
    pub declared_through: usize,
    /// The leader of a probe quorum queue declared through that node (RabbitMQ places a new
    /// quorum queue's leader on the declaring connection's node).
    pub leader_node: usize,
    /// The relay's --max-in-flight and the broker alone's window.
    pub window: u32,
    /// Backlog of single-row transactions (the scale's drain rows).
    pub drain: Drain,
    /// The nodes the relay connected to during the drain, in order (it gets all URLs).
    pub drain_relay_nodes: Vec<usize>,
    pub broker: BrokerLimit,
    /// The node the broker-alone publisher used: the drain relay's.
    pub broker_publisher_node: usize,
    pub latency: LatencyRun,
    pub latency_relay_nodes: Vec<usize>,
    /// Publish→consumer at `broker_latency_rate`, publishing through the latency relay's node.
    pub broker_latency: Option<LatencyMs>,
    pub broker_latency_publisher_node: usize,
    pub broker_latency_rate: u32,
    /// The WAL drain with no consumer (issue 26; absent in files from before it), its relay's
    /// nodes, and the broker alone with the minimal publisher (through `broker_publisher_node`,
    /// the queue declared through `declared_through`), consumer attached and none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_no_consumer: Option<Drain>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drain_no_consumer_relay_nodes: Vec<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bare_broker: Option<BareBrokerLimit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bare_broker_no_consumer: Option<BareBrokerLimit>,
    /// Starting the cluster (boot, join, check).
    pub startup_secs: f64,
    /// The whole section, the cluster's start included.
    pub seconds: f64,
}

fn wal_setup() -> String {
    "wal".into()
}

/// One drain of an A/B.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AbRun {
    /// What was drained: `wal`, or `poll5` (5 polling workers, default batch). Files from
    /// before `--ab-setup` have none: their A/Bs drained the WAL reader.
    #[serde(default = "wal_setup")]
    pub setup: String,
    pub binary: String,
    pub round: u32,
    pub drain: Drain,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Machine {
    pub cores: usize,
    pub memory_mib: u64,
    pub kernel: String,
    pub postgres: String,
    pub postgres_settings: Vec<(String, String)>,
    pub rabbitmq: String,
    pub relay_commit: String,
    pub started_at: String,
    /// /proc/loadavg when the run started.
    pub load_average: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Scale {
    pub name: String,
    pub drain_rows: u64,
    pub drain_window_secs: u64,
    pub latency_rate: u32,
    pub latency_secs: u64,
    pub load_writers: u32,
    pub load_secs: u64,
    pub crash_rows: u64,
    pub sweep_rows: u64,
    pub max_in_flight: u32,
    pub status_interval_ms: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ModeResults {
    pub mode: String,
    /// Backlog of single-row transactions.
    pub drain: Option<Drain>,
    /// The same backlog in 1,000-row transactions.
    pub drain_batched: Option<Drain>,
    pub latency: Option<LatencyRun>,
    pub load: Option<LoadRun>,
    pub crash: Option<Crash>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Drain {
    pub rows: u64,
    pub transaction_rows: u64,
    /// Distinct messages received within the window.
    pub received: u64,
    /// From the relay's start to the last receipt (or to the window's end).
    pub seconds: f64,
    pub msgs_per_sec: f64,
    pub complete: bool,
    pub cpu_seconds: f64,
    pub cpu_seconds_per_100k: f64,
    pub peak_rss_mib: f64,
    /// PostgreSQL's CPU (postmaster and every backend) from the relay's start to its stop;
    /// only the A/B, --shards-sweep and --emit measure it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pg_cpu_seconds: Option<f64>,
    /// µs of CPU per message of each process (issue 14), where they could be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuSplit>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencyMs {
    pub samples: usize,
    pub avg: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// The 0th to the 100th percentile in ms, one per percent (nearest rank, to the µs); empty
    /// in files written before they were recorded (those have only p50, p99 and max).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub percentiles: Vec<f64>,
}

impl From<Latency> for LatencyMs {
    fn from(l: Latency) -> LatencyMs {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        LatencyMs {
            samples: l.samples,
            avg: ms(l.avg),
            p50: ms(l.p50),
            p99: ms(l.p99),
            max: ms(l.max),
            percentiles: l
                .percentiles
                .iter()
                .map(|&d| (ms(d) * 1000.0).round() / 1000.0)
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LatencyRun {
    pub rate: u32,
    pub rows: u64,
    pub missing: u64,
    pub latency: Option<LatencyMs>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoadRun {
    pub writers: u32,
    pub seconds: u64,
    pub committed: u64,
    pub orders_per_sec: f64,
    /// Committed rows the consumer had not received when the wait ended.
    pub missing: u64,
    pub latency: Option<LatencyMs>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Crash {
    pub rows: u64,
    /// Distinct messages received when the relay was killed.
    pub received_before_kill: u64,
    pub lost: u64,
    pub duplicates: u64,
    /// WAL mode's bound: max_in_flight + rate × status interval + open transaction rows.
    pub duplicate_bound: Option<u64>,
}

/// Writer throughput at 100 concurrent writers: no relay (the ceiling), a trigger sending
/// NOTIFY inside every transaction, and NOTIFY sent after each commit (both with poll --listen).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NotifyResults {
    pub ceiling: LoadRun,
    pub trigger: LoadRun,
    pub after_commit: LoadRun,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Broker alone at each window of the sweep (and the default).
    pub broker: Vec<BrokerLimit>,
    pub broker_latency: Option<LatencyMs>,
    pub broker_latency_rate: u32,
    pub decode: Option<DecodeLimit>,
    /// The CPU split of the broker alone through the relay's publisher at --max-in-flight.
    pub broker_cpu: Option<CpuSplit>,
    /// Broker alone with a minimal publisher (no relay code) at --max-in-flight, the
    /// consumer attached (issue 14).
    pub bare_broker: Option<BareBrokerLimit>,
    /// The same with no consumer: confirms per second.
    pub bare_broker_no_consumer: Option<BareBrokerLimit>,
    /// pg_recvlogical streaming a backlog of single-row transactions (issue 14).
    pub walsender: Option<WalsenderLimit>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BrokerLimit {
    pub window: u32,
    pub messages: u64,
    pub confirmed_per_sec: f64,
    pub received_per_sec: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DecodeLimit {
    pub rows: u64,
    pub rows_per_sec: f64,
    pub method: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SweepRow {
    pub window: u32,
    pub drain_msgs_per_sec: f64,
    pub p99_ms: Option<f64>,
    pub crash_lost: u64,
    pub crash_duplicates: u64,
    pub duplicate_bound: u64,
    pub broker_msgs_per_sec: f64,
}

impl Limits {
    pub fn broker_at(&self, window: u32) -> Option<&BrokerLimit> {
        self.broker.iter().find(|b| b.window == window)
    }

    pub fn best_broker(&self) -> Option<f64> {
        self.broker
            .iter()
            .map(|b| b.received_per_sec)
            .reduce(f64::max)
    }

    /// The lower of the two limits that share no code with the relay, and its name: the
    /// minimal publisher with the consumer attached, and the walsender ceiling.
    pub fn independent(&self) -> Option<(f64, &'static str)> {
        let broker = self
            .bare_broker
            .as_ref()
            .map(|b| (b.rate(), "broker alone, minimal publisher"));
        let walsender = self
            .walsender
            .as_ref()
            .map(|w| (w.rows_per_sec, "walsender ceiling"));
        match (broker, walsender) {
            (Some(b), Some(w)) => Some(if w.0 < b.0 { w } else { b }),
            (b, w) => b.or(w),
        }
    }

    /// The lower of broker-alone at `window` and decoding alone: what a relay could reach.
    pub fn lower(&self, window: u32) -> Option<f64> {
        let broker = self.broker_at(window).map(|b| b.received_per_sec);
        let decode = self.decode.as_ref().map(|d| d.rows_per_sec);
        match (broker, decode) {
            (Some(b), Some(d)) => Some(b.min(d)),
            (b, d) => b.or(d),
        }
    }
}

pub(crate) fn int(x: f64) -> String {
    let n = x.round() as i64;
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

pub(crate) fn ms(x: f64) -> String {
    if x >= 1000.0 {
        format!("{:.2} s", x / 1000.0)
    } else if x >= 10.0 {
        format!("{x:.0} ms")
    } else {
        format!("{x:.2} ms")
    }
}

pub(crate) fn ratio(x: f64) -> String {
    format!("{:.0} %", x * 100.0)
}

pub(crate) fn or_dash<T>(value: Option<T>, f: impl Fn(T) -> String) -> String {
    value.map(f).unwrap_or_else(|| "—".into())
}

/// A drain's rate, with how far it got if the window ended first.
pub(crate) fn drain_cell(d: Option<&Drain>) -> String {
    or_dash(d, |d| {
        let mut cell = int(d.msgs_per_sec);
        if !d.complete {
            let _ = write!(
                cell,
                " ({} of {} in {:.0} s)",
                int(d.received as f64),
                int(d.rows as f64),
                d.seconds
            );
        }
        cell
    })
}

impl Results {
    pub fn wal(&self) -> Option<&ModeResults> {
        self.modes.iter().find(|m| m.mode == MODES[2])
    }

    /// The whole report in Markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let w = self.scale.max_in_flight;
        let m = &self.machine;
        let settings: Vec<String> = m
            .postgres_settings
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        let _ = writeln!(
            s,
            "Run {} of relay {}: {} cores, {} MiB, Linux {}; PostgreSQL {} ({}); RabbitMQ {}. \
             Scale {}: backlogs of {} rows, drain window {} s, {} rows/s for {} s, {} writers \
             for {} s; WAL --max-in-flight {}, --status-interval-ms {}.\n",
            m.started_at,
            m.relay_commit,
            m.cores,
            m.memory_mib,
            m.kernel,
            m.postgres,
            settings.join(", "),
            m.rabbitmq,
            self.scale.name,
            int(self.scale.drain_rows as f64),
            self.scale.drain_window_secs,
            self.scale.latency_rate,
            self.scale.latency_secs,
            self.scale.load_writers,
            self.scale.load_secs,
            int(f64::from(w)),
            self.scale.status_interval_ms
        );
        if !m.load_average.is_empty() {
            let _ = writeln!(s, "Load average at the start: {}.\n", m.load_average);
        }
        if !self.ab.is_empty() {
            ab_table(&mut s, &self.ab);
            return s;
        }
        if let Some(c) = &self.compare {
            c.markdown(&mut s);
            return s;
        }
        if !self.shards.is_empty() {
            self.shards_table(&mut s);
            return s;
        }
        if !self.emit_writers.is_empty() || !self.emit_drains.is_empty() {
            self.emit_tables(&mut s);
            return s;
        }
        if self.modes.is_empty() {
            if let Some(c) = &self.cluster {
                self.cluster_table(&mut s, c);
                s.push('\n');
                setups::markdown(self, &mut s);
                return s;
            }
        }
        let _ = writeln!(s, "### Reference table ({} scale)\n", self.scale.name);
        let _ = writeln!(
            s,
            "| Setup | MPS, backlog of {} single-row txns | MPS, 1,000-row txns | ÷ limit | Avg commit→consumer, {} orders/s | Avg commit→consumer, {} users | Orders/s, {} users | CPU s / 100k msgs | Peak RSS |",
            int(self.scale.drain_rows as f64),
            self.scale.latency_rate,
            self.scale.load_writers,
            self.scale.load_writers
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
        let lower = self.limits.lower(w);
        for m in &self.modes {
            let drain = m.drain.as_ref();
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                m.mode,
                drain_cell(drain),
                drain_cell(m.drain_batched.as_ref()),
                or_dash(drain.zip(lower), |(d, l)| ratio(d.msgs_per_sec / l)),
                or_dash(m.latency.as_ref().and_then(|l| l.latency.as_ref()), |l| ms(
                    l.avg
                )),
                or_dash(m.load.as_ref().and_then(|l| l.latency.as_ref()), |l| ms(
                    l.avg
                )),
                or_dash(m.load.as_ref(), |l| int(l.orders_per_sec)),
                or_dash(drain, |d| format!("{:.2}", d.cpu_seconds_per_100k)),
                or_dash(drain, |d| format!("{:.1} MiB", d.peak_rss_mib)),
            );
        }
        let _ = writeln!(
            s,
            "\n÷ limit: drain MPS over the lower of broker alone at the relay's window ({}) and \
             decoding alone, both measured in this run.\n",
            int(f64::from(w))
        );
        setups::markdown(self, &mut s);

        let _ = writeln!(s, "### Limits (same run)\n");
        let _ = writeln!(s, "| Limit | Figure |\n|---|---|");
        for b in &self.limits.broker {
            let _ = writeln!(
                s,
                "| Broker alone, relay's publisher, window {} ({} msgs) | {} msgs/s received ({} confirmed) |",
                int(f64::from(b.window)),
                int(b.messages as f64),
                int(b.received_per_sec),
                int(b.confirmed_per_sec)
            );
        }
        if let Some(l) = &self.limits.broker_latency {
            let _ = writeln!(
                s,
                "| Broker alone, relay's publisher, publish→consumer at {} msgs/s | avg {}, p50 {}, p99 {}, max {} |",
                self.limits.broker_latency_rate,
                ms(l.avg),
                ms(l.p50),
                ms(l.p99),
                ms(l.max)
            );
        }
        if let Some(d) = &self.limits.decode {
            let _ = writeln!(
                s,
                "| Decoding alone ({}), {} rows | {} rows/s |",
                d.method,
                int(d.rows as f64),
                int(d.rows_per_sec)
            );
        }
        for b in [
            &self.limits.bare_broker,
            &self.limits.bare_broker_no_consumer,
        ]
        .into_iter()
        .flatten()
        {
            let figure = match b.received_per_sec {
                Some(received) => format!(
                    "{} msgs/s received ({} confirmed)",
                    int(received),
                    int(b.confirmed_per_sec)
                ),
                None => format!("{} msgs/s confirmed", int(b.confirmed_per_sec)),
            };
            let _ = writeln!(
                s,
                "| Broker alone, minimal publisher (bare lapin, no relay code), window {}, {} ({} msgs) | {figure} |",
                int(f64::from(b.window)),
                if b.consumer { "consumer attached" } else { "no consumer" },
                int(b.messages as f64)
            );
        }
        if let Some(w) = &self.limits.walsender {
            let _ = writeln!(
                s,
                "| Walsender ceiling ({}), {} single-row txns | {} rows/s |",
                w.method,
                int(w.rows as f64),
                int(w.rows_per_sec)
            );
        }
        self.cpu_split_table(&mut s);

        let _ = writeln!(s, "\n### Latency, commit→consumer\n");
        let _ = writeln!(
            s,
            "| Setup | Load | Rows | avg | p50 | p99 | max | ÷ broker p50 | ÷ broker p99 | Missing |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        let broker = self.limits.broker_latency.as_ref();
        for m in &self.modes {
            let runs = [
                m.latency.as_ref().map(|l| {
                    (
                        format!("{} rows/s, 1 writer", l.rate),
                        l.rows,
                        l.latency.as_ref(),
                        l.missing,
                    )
                }),
                m.load.as_ref().map(|l| {
                    (
                        format!("{} writers, {} s", l.writers, l.seconds),
                        l.committed,
                        l.latency.as_ref(),
                        l.missing,
                    )
                }),
            ];
            for (load, rows, latency, missing) in runs.into_iter().flatten() {
                let _ = writeln!(
                    s,
                    "| {} | {load} | {} | {} | {} | {} | {} | {} | {} | {missing} |",
                    m.mode,
                    int(rows as f64),
                    or_dash(latency, |l| ms(l.avg)),
                    or_dash(latency, |l| ms(l.p50)),
                    or_dash(latency, |l| ms(l.p99)),
                    or_dash(latency, |l| ms(l.max)),
                    or_dash(latency.zip(broker), |(l, b)| format!(
                        "{:.2}×",
                        l.p50 / b.p50
                    )),
                    or_dash(latency.zip(broker), |(l, b)| format!(
                        "{:.2}×",
                        l.p99 / b.p99
                    )),
                );
            }
        }

        if let Some(n) = &self.notify {
            let _ = writeln!(
                s,
                "\n### Writers at {} users: the NOTIFY trap\n",
                self.scale.load_writers
            );
            let _ = writeln!(
                s,
                "| Variant | Orders/s | ÷ ceiling | Avg commit→consumer |\n|---|---|---|---|"
            );
            let ceiling = n.ceiling.orders_per_sec;
            for (name, run) in [
                ("No relay (ceiling)", &n.ceiling),
                ("NOTIFY in a trigger, poll ×5 --listen", &n.trigger),
                ("NOTIFY after commit, poll ×5 --listen", &n.after_commit),
            ] {
                let _ = writeln!(
                    s,
                    "| {name} | {} | {} | {} |",
                    int(run.orders_per_sec),
                    if ceiling > 0.0 {
                        ratio(run.orders_per_sec / ceiling)
                    } else {
                        "—".into()
                    },
                    or_dash(run.latency.as_ref(), |l| ms(l.avg))
                );
            }
        }

        let _ = writeln!(
            s,
            "\n### Crash: kill -9 partway through the backlog, restart\n"
        );
        let _ = writeln!(s, "| Setup | Rows | Received before kill | Lost | Duplicates | WAL bound |\n|---|---|---|---|---|---|");
        for m in &self.modes {
            if let Some(c) = &m.crash {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} |",
                    m.mode,
                    int(c.rows as f64),
                    int(c.received_before_kill as f64),
                    c.lost,
                    int(c.duplicates as f64),
                    or_dash(c.duplicate_bound, |b| int(b as f64))
                );
            }
        }

        if !self.sweep.is_empty() {
            let _ = writeln!(
                s,
                "\n### WAL reader: --max-in-flight sweep ({} rows)\n",
                int(self.scale.sweep_rows as f64)
            );
            let _ = writeln!(s, "| max_in_flight | Drain MPS | Broker alone (relay's publisher) MPS | ÷ broker | p99 at {} rows/s | Crash lost | Crash duplicates | Bound |\n|---|---|---|---|---|---|---|---|", self.scale.latency_rate);
            for r in &self.sweep {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    int(f64::from(r.window)),
                    int(r.drain_msgs_per_sec),
                    int(r.broker_msgs_per_sec),
                    if r.broker_msgs_per_sec > 0.0 {
                        ratio(r.drain_msgs_per_sec / r.broker_msgs_per_sec)
                    } else {
                        "—".into()
                    },
                    or_dash(r.p99_ms, ms),
                    r.crash_lost,
                    int(r.crash_duplicates as f64),
                    int(r.duplicate_bound as f64)
                );
            }
        }

        let targets = self.targets();
        if !targets.is_empty() {
            let _ = writeln!(s, "\n### WAL targets (issue 6)\n");
            for (met, text) in targets {
                let _ = writeln!(s, "- {} {text}", if met { "met:" } else { "**missed:**" });
            }
        }
        if let Some(c) = &self.cluster {
            s.push('\n');
            self.cluster_table(&mut s, c);
        }
        s
    }

    /// The cluster section's table, with the single-node WAL reader of the same run (if it
    /// ran) in the same columns, and where each connection went.
    fn cluster_table(&self, s: &mut String, c: &ClusterResults) {
        let _ = writeln!(s, "### {}-node cluster, quorum queue\n", c.nodes);
        let _ = writeln!(
            s,
            "| Setup | Drain MPS, {} single-row txns | Broker alone MPS | ÷ broker alone | p50 at {} rows/s | Broker alone p50 | ÷ | p99 | Broker alone p99 | ÷ |",
            int(c.drain.rows as f64),
            c.latency.rate
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
        let row = |s: &mut String,
                   name: &str,
                   drain: Option<&Drain>,
                   broker: Option<f64>,
                   latency: Option<&LatencyMs>,
                   broker_latency: Option<&LatencyMs>| {
            let times = |a: f64, b: f64| format!("{:.2}×", a / b);
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                drain_cell(drain),
                or_dash(broker, int),
                or_dash(drain.zip(broker.filter(|b| *b > 0.0)), |(d, b)| ratio(
                    d.msgs_per_sec / b
                )),
                or_dash(latency, |l| ms(l.p50)),
                or_dash(broker_latency, |l| ms(l.p50)),
                or_dash(latency.zip(broker_latency), |(l, b)| times(l.p50, b.p50)),
                or_dash(latency, |l| ms(l.p99)),
                or_dash(broker_latency, |l| ms(l.p99)),
                or_dash(latency.zip(broker_latency), |(l, b)| times(l.p99, b.p99)),
            );
        };
        row(
            s,
            &format!("{}-node cluster, quorum queue", c.nodes),
            Some(&c.drain),
            Some(c.broker.received_per_sec),
            c.latency.latency.as_ref(),
            c.broker_latency.as_ref(),
        );
        if let Some(wal) = self.wal() {
            row(
                s,
                "1 node, classic queue (same run)",
                wal.drain.as_ref(),
                self.limits.broker_at(c.window).map(|b| b.received_per_sec),
                wal.latency.as_ref().and_then(|l| l.latency.as_ref()),
                self.limits.broker_latency.as_ref(),
            );
        }
        let nodes = |n: &[usize]| match n {
            [] => "an unlogged node".to_string(),
            [one] => format!("node {one}"),
            many => format!(
                "nodes {} (in turn)",
                many.iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let _ = writeln!(
            s,
            "\nWAL reader at --max-in-flight {w}, broker alone at window {w}. Every queue was \
             declared through node {decl} by the consumer connected there (a probe quorum queue \
             declared so was led by node {leader}); the relay got the three nodes' URLs and \
             connected to {dn} for the drain and {ln} for the latency run; each broker-alone run \
             published through the node of the matching relay run ({bp}, {blp}). Latency: \
             commit→consumer for the relay, publish→consumer for the broker alone, at {rate} \
             per second. The section took {secs:.0} s, starting the cluster {start:.0} s of it.",
            w = int(f64::from(c.window)),
            decl = c.declared_through,
            leader = c.leader_node,
            dn = nodes(&c.drain_relay_nodes),
            ln = nodes(&c.latency_relay_nodes),
            bp = c.broker_publisher_node,
            blp = c.broker_latency_publisher_node,
            rate = c.broker_latency_rate,
            secs = c.seconds,
            start = c.startup_secs,
        );
    }

    /// Each WAL target of issue 6 with whether this run met it.
    pub fn targets(&self) -> Vec<(bool, String)> {
        let mut out = Vec::new();
        let Some(wal) = self.wal() else {
            return out;
        };
        let w = self.scale.max_in_flight;
        if let (Some(d), Some(b)) = (wal.drain.as_ref(), self.limits.broker_at(w)) {
            let r = d.msgs_per_sec / b.received_per_sec;
            out.push((
                r >= 0.90,
                format!(
                    "drain ≥ 90 % of broker alone (relay's publisher) at window {w}: {} of {} = {}",
                    int(d.msgs_per_sec),
                    int(b.received_per_sec),
                    ratio(r)
                ),
            ));
        }
        if let (Some(d), Some(best)) = (wal.drain.as_ref(), self.limits.best_broker()) {
            let r = d.msgs_per_sec / best;
            out.push((
                r >= 0.85,
                format!(
                    "drain ≥ 85 % of the best broker-alone figure (relay's publisher): {} of {} = {}",
                    int(d.msgs_per_sec),
                    int(best),
                    ratio(r)
                ),
            ));
        }
        if let (Some(d), Some((limit, name))) = (wal.drain.as_ref(), self.limits.independent()) {
            let r = d.msgs_per_sec / limit;
            out.push((
                r >= 0.90,
                format!(
                    "drain ≥ 90 % of the lower independent limit, min(broker alone with the \
                     minimal publisher, walsender ceiling) = {name}: {} of {} = {}",
                    int(d.msgs_per_sec),
                    int(limit),
                    ratio(r)
                ),
            ));
        }
        if let (Some(l), Some(b)) = (
            wal.latency.as_ref().and_then(|l| l.latency.as_ref()),
            self.limits.broker_latency.as_ref(),
        ) {
            out.push((
                l.p50 <= 1.5 * b.p50,
                format!(
                    "p50 ≤ 1.5× broker alone: {} vs {} = {:.2}×",
                    ms(l.p50),
                    ms(b.p50),
                    l.p50 / b.p50
                ),
            ));
            out.push((
                l.p99 <= 3.0 * b.p99,
                format!(
                    "p99 ≤ 3× broker alone: {} vs {} = {:.2}×",
                    ms(l.p99),
                    ms(b.p99),
                    l.p99 / b.p99
                ),
            ));
        }
        if let Some(c) = &wal.crash {
            out.push((c.lost == 0, format!("crash: zero lost ({})", c.lost)));
            if let Some(bound) = c.duplicate_bound {
                out.push((
                    c.duplicates <= bound,
                    format!(
                        "crash duplicates within the bound: {} ≤ {}",
                        int(c.duplicates as f64),
                        int(bound as f64)
                    ),
                ));
            }
            let reference = 4536.0 * c.rows as f64 / 200_000.0;
            out.push((
                (c.duplicates as f64) < reference,
                format!("crash duplicates below the reference's polling workers (4,536 per 200,000, here {}): {}", int(reference), int(c.duplicates as f64)),
            ));
        }
        for r in &self.sweep {
            if r.crash_lost > 0 || r.crash_duplicates > r.duplicate_bound {
                out.push((
                    false,
                    format!(
                        "sweep window {}: lost {}, duplicates {} (bound {})",
                        r.window, r.crash_lost, r.crash_duplicates, r.duplicate_bound
                    ),
                ));
            }
        }
        if let Some(d) = &wal.drain {
            out.push((
                d.peak_rss_mib <= 64.0,
                format!(
                    "peak RSS ≤ 64 MiB during the drain: {:.1} MiB",
                    d.peak_rss_mib
                ),
            ));
        }
        out
    }
}

/// The A/B runs, then each binary's median drain rate and CPU per message.
impl Results {
    /// `--shards-sweep`: every drain, then per shard count the medians beside the broker
    /// alone's median.
    fn shards_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "### Sharded relays: drain of single-row transactions (rows of 500 aggregates)\n"
        );
        let _ = writeln!(
            s,
            "| Round | Shards | Load (1, 5, 15 min) | MPS | Relay CPU µs / msg (all relays) | \
             PostgreSQL CPU µs / msg | Peak RSS MiB (largest relay) | Complete |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        for run in &self.shards {
            let d = &run.drain;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                run.round,
                run.shards,
                run.load,
                drain_run_cells(d)
            );
        }
        let broker = median(
            self.shards_broker
                .iter()
                .map(|b| b.received_per_sec)
                .collect(),
        );
        let each: Vec<String> = self
            .shards_broker
            .iter()
            .map(|b| int(b.received_per_sec))
            .collect();
        let _ = writeln!(
            s,
            "\nBroker alone at window {} (each round): {}; median {}.\n",
            self.scale.max_in_flight,
            each.join(" · "),
            int(broker)
        );
        let mut counts: Vec<u32> = self.shards.iter().map(|r| r.shards).collect();
        counts.sort_unstable();
        counts.dedup();
        let _ = writeln!(
            s,
            "| Shards | Median MPS | ÷ broker alone | Median relay CPU µs / msg | \
             Median PostgreSQL CPU µs / msg |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|");
        for shards in counts {
            let of = |f: &dyn Fn(&Drain) -> f64| {
                median(
                    self.shards
                        .iter()
                        .filter(|r| r.shards == shards)
                        .map(|r| f(&r.drain))
                        .collect(),
                )
            };
            let mps = of(&|d| d.msgs_per_sec);
            let _ = writeln!(
                s,
                "| {shards} | {} | {} | {:.1} | {:.1} |",
                int(mps),
                if broker > 0.0 {
                    ratio(mps / broker)
                } else {
                    "–".into()
                },
                of(&|d| us_per_msg(d.cpu_seconds, d)),
                of(&|d| us_per_msg(d.pg_cpu_seconds.unwrap_or(0.0), d))
            );
        }
    }

    /// `--emit`: the writer runs and the drains, each with per-variant medians.
    fn emit_tables(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "### Writers: table insert against outbox_emit (one event per transaction, no relay)\n"
        );
        let _ = writeln!(
            s,
            "| Round | Clients | Variant | Load (1, 5, 15 min) | Events/s | WAL bytes / event |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|");
        for r in &self.emit_writers {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {:.0} |",
                r.round,
                r.clients,
                r.variant,
                r.load,
                int(r.events_per_sec),
                r.wal_bytes_per_event
            );
        }
        let mut keys: Vec<(u32, &str)> = self
            .emit_writers
            .iter()
            .map(|r| (r.clients, r.variant.as_str()))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let _ = writeln!(
            s,
            "\n| Clients | Variant | Median events/s | Median WAL bytes / event |"
        );
        let _ = writeln!(s, "|---|---|---|---|");
        for (clients, variant) in keys {
            let of = |f: fn(&EmitWriterRun) -> f64| {
                median(
                    self.emit_writers
                        .iter()
                        .filter(|r| r.clients == clients && r.variant == variant)
                        .map(f)
                        .collect(),
                )
            };
            let _ = writeln!(
                s,
                "| {clients} | {variant} | {} | {:.0} |",
                int(of(|r| r.events_per_sec)),
                of(|r| r.wal_bytes_per_event)
            );
        }
        if self.emit_drains.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "\n### WAL relay: drain of a backlog of single-row transactions, rows against emitted events\n"
        );
        let _ = writeln!(
            s,
            "| Round | Variant | Load (1, 5, 15 min) | MPS | Relay CPU µs / msg | PostgreSQL CPU µs / msg | Complete |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for r in &self.emit_drains {
            let d = &r.drain;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.1} | {} | {} |",
                r.round,
                r.variant,
                r.load,
                int(d.msgs_per_sec),
                us_per_msg(d.cpu_seconds, d),
                or_dash(d.pg_cpu_seconds, |c| format!("{:.1}", us_per_msg(c, d))),
                d.complete
            );
        }
        let mut variants: Vec<&str> = self
            .emit_drains
            .iter()
            .map(|r| r.variant.as_str())
            .collect();
        variants.sort_unstable();
        variants.dedup();
        let _ = writeln!(
            s,
            "\n| Variant | Median MPS | Median relay CPU µs / msg | Median PostgreSQL CPU µs / msg |"
        );
        let _ = writeln!(s, "|---|---|---|---|");
        for variant in variants {
            let of = |f: &dyn Fn(&Drain) -> f64| {
                median(
                    self.emit_drains
                        .iter()
                        .filter(|r| r.variant == variant)
                        .map(|r| f(&r.drain))
                        .collect(),
                )
            };
            let _ = writeln!(
                s,
                "| {variant} | {} | {:.1} | {:.1} |",
                int(of(&|d| d.msgs_per_sec)),
                of(&|d| us_per_msg(d.cpu_seconds, d)),
                of(&|d| us_per_msg(d.pg_cpu_seconds.unwrap_or(0.0), d))
            );
        }
    }
}

fn ab_table(s: &mut String, runs: &[AbRun]) {
    let setup = runs.first().map_or("wal", |r| r.setup.as_str());
    let _ = writeln!(s, "### A/B: {setup} drain, single-row transactions\n");
    let _ = writeln!(
        s,
        "| Binary | Round | MPS | CPU µs / msg | PostgreSQL CPU µs / msg | Peak RSS MiB | Complete |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for run in runs {
        let d = &run.drain;
        let pg = match d.pg_cpu_seconds {
            Some(seconds) if d.received > 0 => {
                format!("{:.1}", seconds * 1e6 / d.received as f64)
            }
            _ => "–".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} | {pg} | {:.1} | {} |",
            run.binary,
            run.round,
            int(d.msgs_per_sec),
            d.cpu_seconds_per_100k * 10.0,
            d.peak_rss_mib,
            d.complete
        );
    }
    let mut binaries: Vec<&str> = runs.iter().map(|r| r.binary.as_str()).collect();
    binaries.sort_unstable();
    binaries.dedup();
    let _ = writeln!(s, "\n| Binary | Median MPS | Median CPU µs / msg |");
    let _ = writeln!(s, "|---|---|---|");
    for binary in binaries {
        let of = |f: fn(&Drain) -> f64| {
            median(
                runs.iter()
                    .filter(|r| r.binary == binary)
                    .map(|r| f(&r.drain))
                    .collect(),
            )
        };
        let _ = writeln!(
            s,
            "| {binary} | {} | {:.1} |",
            int(of(|d| d.msgs_per_sec)),
            of(|d| d.cpu_seconds_per_100k * 10.0)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Results {
        let drain = Drain {
            rows: 200_000,
            transaction_rows: 1,
            received: 200_000,
            seconds: 10.0,
            msgs_per_sec: 20_000.0,
            complete: true,
            cpu_seconds: 4.0,
            cpu_seconds_per_100k: 2.0,
            peak_rss_mib: 20.5,
            pg_cpu_seconds: None,
            cpu: Some(CpuSplit {
                messages: 200_000,
                relay_us: Some(20.0),
                walsender_us: Some(12.5),
                rabbitmq_us: Some(40.0),
                bench_us: None,
            }),
        };
        let latency = LatencyMs {
            samples: 100,
            avg: 1.2,
            p50: 1.0,
            p99: 4.0,
            max: 9.0,
            percentiles: Vec::new(),
        };
        let mut results = Results {
            scale: Scale {
                name: "full".into(),
                drain_rows: 200_000,
                latency_rate: 100,
                load_writers: 100,
                max_in_flight: 1024,
                crash_rows: 200_000,
                ..Scale::default()
            },
            limits: Limits {
                broker: vec![BrokerLimit {
                    window: 1024,
                    messages: 1000,
                    confirmed_per_sec: 21_000.0,
                    received_per_sec: 20_500.0,
                }],
                broker_latency: Some(LatencyMs {
                    samples: 100,
                    avg: 0.8,
                    p50: 0.8,
                    p99: 1.0,
                    max: 2.0,
                    percentiles: Vec::new(),
                }),
                broker_latency_rate: 100,
                decode: Some(DecodeLimit {
                    rows: 1000,
                    rows_per_sec: 80_000.0,
                    method: "m".into(),
                }),
                bare_broker: Some(BareBrokerLimit {
                    window: 1024,
                    messages: 1000,
                    consumer: true,
                    confirmed_per_sec: 25_000.0,
                    received_per_sec: Some(24_000.0),
                    cpu: Some(CpuSplit {
                        messages: 1000,
                        rabbitmq_us: Some(30.0),
                        bench_us: Some(8.0),
                        ..CpuSplit::default()
                    }),
                }),
                bare_broker_no_consumer: Some(BareBrokerLimit {
                    window: 1024,
                    messages: 1000,
                    consumer: false,
                    confirmed_per_sec: 30_000.0,
                    received_per_sec: None,
                    cpu: None,
                }),
                walsender: Some(WalsenderLimit {
                    rows: 1000,
                    seconds: 0.05,
                    rows_per_sec: 21_000.0,
                    method: "pg_recvlogical".into(),
                }),
                ..Limits::default()
            },
            ..Results::default()
        };
        for mode in MODES {
            results.modes.push(ModeResults {
                mode: mode.into(),
                drain: Some(drain.clone()),
                drain_batched: Some(Drain {
                    complete: false,
                    received: 1500,
                    seconds: 60.0,
                    ..drain.clone()
                }),
                latency: Some(LatencyRun {
                    rate: 100,
                    rows: 100,
                    missing: 0,
                    latency: Some(latency.clone()),
                }),
                load: None,
                crash: Some(Crash {
                    rows: 200_000,
                    received_before_kill: 90_000,
                    lost: 0,
                    duplicates: 1200,
                    duplicate_bound: Some(3000),
                }),
            });
        }
        results
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(int(0.0), "0");
        assert_eq!(int(999.4), "999");
        assert_eq!(int(1234.0), "1,234");
        assert_eq!(int(1_234_567.0), "1,234,567");
        assert_eq!(int(-4536.0), "-4,536");
    }

    #[test]
    fn the_table_has_a_row_per_mode_and_every_column() {
        let text = sample().markdown();
        let header = text
            .lines()
            .find(|l| l.starts_with("| Setup | MPS"))
            .expect("header");
        let columns = header.matches('|').count();
        for mode in MODES {
            let row = text
                .lines()
                .find(|l| l.starts_with(&format!("| {mode} | 20,000")))
                .expect(mode);
            assert_eq!(row.matches('|').count(), columns, "{row}");
            // 20,000 of min(20,500, 80,000) and the incomplete batched drain says how far it got.
            assert!(row.contains("| 98 % |"), "{row}");
            assert!(row.contains("1,500 of 200,000 in 60 s"), "{row}");
            assert!(
                row.contains("| 1.20 ms |") && row.contains("20.5 MiB"),
                "{row}"
            );
        }
        assert!(
            text.contains("| Broker alone, relay's publisher, window 1,024 (1,000 msgs) |"),
            "{text}"
        );
        assert!(
            text.contains(
                "| Broker alone, minimal publisher (bare lapin, no relay code), window 1,024, \
                 consumer attached (1,000 msgs) | 24,000 msgs/s received (25,000 confirmed) |"
            ),
            "{text}"
        );
        assert!(
            text.contains("no consumer (1,000 msgs) | 30,000 msgs/s confirmed |"),
            "{text}"
        );
        assert!(
            text.contains(
                "| Walsender ceiling (pg_recvlogical), 1,000 single-row txns | 21,000 rows/s |"
            ),
            "{text}"
        );
    }

    #[test]
    fn targets_say_met_and_missed() {
        let results = sample();
        let targets = results.targets();
        let find = |prefix: &str| {
            targets
                .iter()
                .find(|(_, t)| t.starts_with(prefix))
                .map(|(met, _)| *met)
        };
        assert_eq!(find("drain ≥ 90 % of broker alone"), Some(true));
        // 20,000 of min(24,000, 21,000): the walsender is the lower.
        let independent = targets
            .iter()
            .find(|(_, t)| t.contains("lower independent limit"))
            .expect("the independent limits' target");
        assert!(independent.0, "{independent:?}");
        assert!(
            independent
                .1
                .ends_with("= walsender ceiling: 20,000 of 21,000 = 95 %"),
            "{independent:?}"
        );
        // 1.0 vs 0.8 ms is 1.25×; 4.0 vs 1.0 ms is 4×.
        assert_eq!(find("p50 ≤ 1.5×"), Some(true));
        assert_eq!(find("p99 ≤ 3×"), Some(false));
        assert_eq!(find("crash: zero lost"), Some(true));
        assert_eq!(find("crash duplicates below"), Some(true));
        assert_eq!(find("peak RSS"), Some(true));
    }

    fn cluster_sample() -> ClusterResults {
        ClusterResults {
            nodes: 3,
            queue_type: "quorum".into(),
            declared_through: 0,
            leader_node: 0,
            window: 1024,
            drain: Drain {
                rows: 200_000,
                received: 200_000,
                msgs_per_sec: 3_000.0,
                complete: true,
                ..Drain::default()
            },
            drain_relay_nodes: vec![2],
            broker: BrokerLimit {
                window: 1024,
                messages: 200_000,
                confirmed_per_sec: 4_100.0,
                received_per_sec: 4_000.0,
            },
            broker_publisher_node: 2,
            latency: LatencyRun {
                rate: 100,
                rows: 3000,
                missing: 0,
                latency: Some(LatencyMs {
                    samples: 3000,
                    avg: 5.0,
                    p50: 4.0,
                    p99: 12.0,
                    max: 20.0,
                    percentiles: Vec::new(),
                }),
            },
            latency_relay_nodes: vec![1, 2],
            broker_latency: Some(LatencyMs {
                samples: 3000,
                avg: 3.0,
                p50: 2.0,
                p99: 8.0,
                max: 10.0,
                percentiles: Vec::new(),
            }),
            broker_latency_publisher_node: 1,
            broker_latency_rate: 100,
            startup_secs: 20.0,
            seconds: 200.0,
            ..ClusterResults::default()
        }
    }

    #[test]
    fn the_cluster_table_sets_each_figure_beside_the_broker_alone() {
        let mut results = sample();
        results.cluster = Some(cluster_sample());
        let text = results.markdown();
        let row = text
            .lines()
            .find(|l| l.starts_with("| 3-node cluster, quorum queue |"))
            .expect("cluster row");
        assert_eq!(
            row,
            "| 3-node cluster, quorum queue | 3,000 | 4,000 | 75 % | 4.00 ms | 2.00 ms | 2.00× \
             | 12 ms | 8.00 ms | 1.50× |"
        );
        // The single-node WAL reader of the same run, against its own broker alone.
        let single = text
            .lines()
            .find(|l| l.starts_with("| 1 node, classic queue (same run) |"))
            .expect("single-node row");
        assert!(
            single.contains("| 20,000 | 20,500 | 98 % | 1.00 ms | 0.80 ms | 1.25× |"),
            "{single}"
        );
        assert!(
            text.contains("connected to node 2 for the drain and nodes 1, 2 (in turn)"),
            "{text}"
        );
    }

    #[test]
    fn cluster_only_reports_only_the_cluster() {
        let results = Results {
            cluster: Some(cluster_sample()),
            ..Results::default()
        };
        let text = results.markdown();
        assert!(text.contains("### 3-node cluster, quorum queue"), "{text}");
        assert!(!text.contains("Reference table"), "{text}");
        assert!(!text.contains("classic queue"), "{text}");
        let json = serde_json::to_value(&results).expect("serialises");
        assert_eq!(json["cluster"]["broker"]["received_per_sec"], 4_000.0);
        assert_eq!(json["cluster"]["drain_relay_nodes"][0], 2);
    }

    fn drain_of(received: u64, msgs_per_sec: f64, cpu: f64, pg: f64) -> Drain {
        Drain {
            rows: received,
            transaction_rows: 1,
            received,
            seconds: received as f64 / msgs_per_sec,
            msgs_per_sec,
            complete: true,
            cpu_seconds: cpu,
            cpu_seconds_per_100k: cpu * 100_000.0 / received as f64,
            peak_rss_mib: 20.0,
            pg_cpu_seconds: Some(pg),
            cpu: None,
        }
    }

    #[test]
    fn the_shards_sweep_sets_each_count_beside_the_broker_alone() {
        let run = |round, shards, mps, pg| ShardRun {
            round,
            shards,
            load: "4.00 4.50 5.00".into(),
            drain: drain_of(10_000, mps, 0.4, pg),
        };
        let broker = |received_per_sec| BrokerLimit {
            window: 1024,
            messages: 10_000,
            confirmed_per_sec: received_per_sec,
            received_per_sec,
        };
        let results = Results {
            scale: Scale {
                max_in_flight: 1024,
                ..Scale::default()
            },
            shards: vec![
                run(1, 1, 8_000.0, 0.05),
                run(1, 4, 7_000.0, 0.15),
                run(2, 4, 9_000.0, 0.16),
                run(2, 1, 6_000.0, 0.06),
                run(3, 1, 7_000.0, 0.07),
                run(3, 4, 8_000.0, 0.14),
            ],
            shards_broker: vec![broker(10_000.0), broker(9_000.0), broker(11_000.0)],
            ..Results::default()
        };
        let text = results.markdown();
        assert!(text.contains("### Sharded relays"), "{text}");
        assert!(!text.contains("Reference table"), "{text}");
        assert!(
            text.contains("10,000 · 9,000 · 11,000; median 10,000"),
            "{text}"
        );
        // Medians: 1 shard 7,000 msgs/s (70 %), 40 µs relay, 6 µs PostgreSQL; 4 shards 8,000,
        // 15 µs PostgreSQL.
        assert!(text.contains("| 1 | 7,000 | 70 % | 40.0 | 6.0 |"), "{text}");
        assert!(
            text.contains("| 4 | 8,000 | 80 % | 40.0 | 15.0 |"),
            "{text}"
        );
        let json = serde_json::to_value(&results).expect("serialises");
        assert_eq!(json["shards"][1]["shards"], 4);
    }

    #[test]
    fn the_emit_tables_give_medians_per_clients_and_variant() {
        let writer = |round, clients, variant: &str, events_per_sec, wal| EmitWriterRun {
            round,
            variant: variant.into(),
            clients,
            load: "1.00 1.00 1.00".into(),
            events: 1_000,
            seconds: 1.0,
            events_per_sec,
            wal_bytes_per_event: wal,
        };
        let drain = |round, variant: &str, mps| EmitDrainRun {
            round,
            variant: variant.into(),
            load: "1.00 1.00 1.00".into(),
            drain: drain_of(10_000, mps, 0.3, 0.1),
        };
        let results = Results {
            emit_writers: vec![
                writer(1, 10, "table insert", 5_000.0, 495.0),
                writer(1, 10, "outbox_emit", 6_000.0, 489.0),
                writer(2, 10, "outbox_emit", 4_000.0, 489.0),
                writer(2, 10, "table insert", 3_000.0, 497.0),
                writer(3, 10, "table insert", 4_000.0, 496.0),
                writer(3, 10, "outbox_emit", 5_000.0, 490.0),
            ],
            emit_drains: vec![
                drain(1, "table insert", 6_000.0),
                drain(1, "outbox_emit", 7_000.0),
            ],
            ..Results::default()
        };
        let text = results.markdown();
        assert!(
            text.contains("### Writers: table insert against outbox_emit"),
            "{text}"
        );
        assert!(
            text.contains("| 10 | outbox_emit | 5,000 | 489 |"),
            "{text}"
        );
        assert!(
            text.contains("| 10 | table insert | 4,000 | 496 |"),
            "{text}"
        );
        assert!(
            text.contains("| outbox_emit | 7,000 | 30.0 | 10.0 |"),
            "{text}"
        );
        assert!(!text.contains("Reference table"), "{text}");
    }

    #[test]
    fn the_cpu_split_has_a_row_per_drain_and_limit() {
        let text = sample().markdown();
        assert!(text.contains("### CPU split, µs per message"), "{text}");
        assert!(
            text.contains(
                "| WAL reader: drain, single-row txns | 200,000 | 20.0 | 12.5 | 40.0 | — | 72.5 |"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "| Broker alone, minimal publisher, window 1,024, consumer attached | 1,000 | — | — | 30.0 | 8.0 | 38.0 |"
            ),
            "{text}"
        );
        // A run that measured no split has no table.
        assert!(!Results::default().markdown().contains("CPU split"));
    }

    #[test]
    fn json_has_the_same_figures() {
        let json = serde_json::to_value(sample()).expect("serialises");
        assert_eq!(json["modes"][2]["mode"], "WAL reader");
        assert_eq!(json["modes"][2]["drain"]["msgs_per_sec"], 20_000.0);
        assert_eq!(json["limits"]["broker"][0]["window"], 1024);
        assert_eq!(json["limits"]["bare_broker"]["received_per_sec"], 24_000.0);
        assert_eq!(json["limits"]["bare_broker"]["cpu"]["rabbitmq_us"], 30.0);
        assert_eq!(json["limits"]["bare_broker_no_consumer"]["consumer"], false);
        assert_eq!(json["limits"]["walsender"]["rows_per_sec"], 21_000.0);
        assert_eq!(json["modes"][2]["drain"]["cpu"]["walsender_us"], 12.5);
    }
}
