//! The charts of a run, drawn as SVG from [`Results`]: the figures `bench --out`
//! writes as JSON, read back, so any run's file can be drawn again
//! (`outbox-bench charts FILE.json --out DIR`; scripts/bench.sh draws them after each run).
//!
//! - `drain.svg`: every setup's drain rate, with a consumer and without, as bars labelled
//!   with the ratio to the broker alone measured in the same run;
//! - `latency.svg`: commit → consumer latency at the fixed rate as a CDF, beside the broker
//!   alone's publish → consumer at that rate;
//! - `cpu.svg`: the µs of CPU per message of each process (relay, walsender, RabbitMQ, and
//!   outbox-bench: the consumer) for each drain and broker-alone run, stacked;
//! - `window.svg`: the `--max-in-flight` sweep: drain rate and crash duplicates per window.
//!
//! A chart draws what the file holds and says what it lacks: a setup a run did not measure is
//! labelled "not measured", never drawn as zero; a latency from before the percentiles were
//! recorded (only p50, p99 and max) is drawn through those three points and marked so; a chart
//! with nothing at all to draw is not written, and [`Drawing::Empty`] says why.
//!
//! This module picks the figures and names them; [`draw`] lays them out with plotters. Both
//! are pure (results in, SVG text out) except [`write`].

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::measurement::cpu::CpuSplit;
use crate::measurement::figures::{int, median, LatencyMs};
use crate::measurement::results::Results;

mod drain;
mod draw;
mod model;

use drain::{drain_chart, rounds_of, setup_name};

use model::{Cdf, Curve, Stacked, StackedRow, Sweep, SweepPoint, LATENCY_FLOOR_MS};

/// One chart: its file name and what was drawn.
#[derive(Debug, Clone)]
pub struct Chart {
    pub file: &'static str,
    pub drawing: Drawing,
}

#[derive(Debug, Clone)]
pub enum Drawing {
    Svg(String),
    /// Nothing to draw: the reason, for the person who asked for the chart.
    Empty(String),
}

/// The four charts of `results`, in the order of the module doc.
pub fn render(results: &Results) -> Result<Vec<Chart>> {
    let run = run_line(results);
    let chart = |file, drawing: Result<Drawing>| drawing.map(|drawing| Chart { file, drawing });
    Ok(vec![
        chart(
            "drain.svg",
            match drain_chart(results, &run) {
                Some(bars) => draw::bars(&bars).map(Drawing::Svg),
                None => Ok(Drawing::Empty(
                    "no drain of a setup in this file (an A/B compares binaries, not setups)"
                        .into(),
                )),
            },
        )?,
        chart(
            "latency.svg",
            match latency_chart(results, &run) {
                Some(cdf) => draw::cdf(&cdf).map(Drawing::Svg),
                None => Ok(Drawing::Empty(
                    "no latency run at a fixed rate in this file".into(),
                )),
            },
        )?,
        chart(
            "cpu.svg",
            match cpu_chart(results, &run) {
                Some(stacked) => draw::stacked(&stacked).map(Drawing::Svg),
                None => Ok(Drawing::Empty(
                    "no CPU split in this file (older runs did not measure one)".into(),
                )),
            },
        )?,
        chart(
            "window.svg",
            match window_chart(results, &run) {
                Some(sweep) => draw::sweep(&sweep).map(Drawing::Svg),
                None => Ok(Drawing::Empty(
                    "no --max-in-flight sweep in this file".into(),
                )),
            },
        )?,
    ])
}

/// Writes every chart that has something to draw into `dir` (created if missing); returns
/// the files written and, for the others, why not.
pub fn write(results: &Results, dir: &Path) -> Result<Vec<(PathBuf, Option<String>)>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut out = Vec::new();
    for chart in render(results)? {
        let path = dir.join(chart.file);
        match chart.drawing {
            Drawing::Svg(svg) => {
                std::fs::write(&path, svg)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                out.push((path, None));
            }
            Drawing::Empty(why) => out.push((path, Some(why))),
        }
    }
    Ok(out)
}

/// Reads a results file that `bench --out` wrote (any version since the JSON existed).
pub fn read(path: &Path) -> Result<Results> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a results file of `outbox-bench bench --out` (the PREFIX.json it writes)",
            path.display()
        )
    })
}

/// What run a chart shows: stamp, relay commit, machine, load.
fn run_line(r: &Results) -> String {
    let m = &r.machine;
    let mut parts = Vec::new();
    if !m.started_at.is_empty() {
        parts.push(format!("run {}", m.started_at));
    }
    if !m.relay_commit.is_empty() {
        parts.push(format!("relay {}", m.relay_commit));
    }
    if m.cores > 0 {
        parts.push(format!("{} cores", m.cores));
    }
    if let Some(version) = m.postgres.split_whitespace().next() {
        parts.push(format!("PostgreSQL {version}"));
    }
    if !m.rabbitmq.is_empty() {
        parts.push(format!("RabbitMQ {}", m.rabbitmq));
    }
    if !m.load_average.is_empty() {
        parts.push(format!("load {} at the start", m.load_average));
    }
    if !r.scale.name.is_empty() {
        parts.push(format!("{} scale", r.scale.name));
    }
    let mut line = parts.join(", ");
    if let Some(first) = line.get(..1) {
        line = first.to_uppercase() + &line[1..];
    }
    line
}

/// The points of a latency's CDF: every percentile if recorded, else p50, p99 and max.
fn cdf_points(l: &LatencyMs) -> (Vec<(f64, f64)>, bool) {
    let n = l.percentiles.len();
    if n >= 2 {
        let last = (n - 1) as f64;
        let points = l
            .percentiles
            .iter()
            .enumerate()
            .map(|(i, &ms)| (ms, i as f64 / last))
            .collect();
        (points, false)
    } else {
        (vec![(l.p50, 0.5), (l.p99, 0.99), (l.max, 1.0)], true)
    }
}

/// Palette indexes ([`draw`]) of the setups, so a reader can follow one across charts.
mod colours {
    pub const WAL: usize = 0;
    pub const ONE_WORKER: usize = 1;
    pub const FIVE_WORKERS: usize = 2;
    pub const CLUSTER_WAL: usize = 3;
    pub const OTHER: usize = 4;
    pub const CLUSTER_BROKER: usize = 5;
    pub const BROKER: usize = 6;
}

/// The colour of a suite mode.
fn mode_colour(mode: &str) -> usize {
    match mode {
        "WAL reader" => colours::WAL,
        "1 polling worker" => colours::ONE_WORKER,
        "5 polling workers" => colours::FIVE_WORKERS,
        _ => colours::OTHER,
    }
}

fn curve(name: &str, l: &LatencyMs, colour: usize) -> Curve {
    let (points, coarse) = cdf_points(l);
    Curve {
        name: format!(
            "{name} ({} msgs{})",
            int(l.samples as f64),
            if coarse { "; p50, p99, max only" } else { "" }
        ),
        points,
        coarse,
        colour,
    }
}

/// Chart 2: the broker alone, each mode, the cluster and the `--compare` latency runs.
fn latency_chart(r: &Results, run: &str) -> Option<Cdf> {
    let mut curves = Vec::new();
    let mut rates = Vec::new();
    if let Some(l) = &r.limits.broker_latency {
        rates.push(r.limits.broker_latency_rate);
        curves.push(curve("Broker alone, relay's publisher", l, colours::BROKER));
    }
    for m in &r.modes {
        if let Some(run) = &m.latency {
            if let Some(l) = &run.latency {
                rates.push(run.rate);
                curves.push(curve(&m.mode, l, mode_colour(&m.mode)));
            }
        }
    }
    if let Some(c) = &r.cluster {
        if let Some(l) = &c.broker_latency {
            rates.push(c.broker_latency_rate);
            curves.push(curve(
                &format!("{}-node cluster: broker alone", c.nodes),
                l,
                colours::CLUSTER_BROKER,
            ));
        }
        if let Some(l) = &c.latency.latency {
            rates.push(c.latency.rate);
            curves.push(curve(
                &format!("{}-node cluster: WAL reader", c.nodes),
                l,
                colours::CLUSTER_WAL,
            ));
        }
    }
    if let Some(c) = &r.compare {
        for (i, entry) in c.latency.iter().enumerate() {
            if let Some(l) = &entry.run.latency {
                rates.push(entry.run.rate);
                let name = setup_name(&entry.setup);
                // The suite's setups keep their colour; the others take the rest in turn.
                let colour = match mode_colour(&name) {
                    colours::OTHER => colours::OTHER + i,
                    known => known,
                };
                curves.push(curve(&format!("{name} (--compare)"), l, colour));
            }
        }
    }
    if curves.is_empty() {
        return None;
    }
    rates.sort_unstable();
    rates.dedup();
    let rate = match rates.as_slice() {
        [one] => format!("{one} rows/s"),
        _ => "a fixed rate".into(),
    };
    let mut notes = vec![
        "Relays: from the writer's COMMIT returning to the consumer's receipt, one writer, one \
         row per transaction. Broker alone: from just before basic_publish to the receipt."
            .to_string(),
    ];
    for c in &curves {
        let below = c.points.iter().filter(|p| p.0 < LATENCY_FLOOR_MS).count();
        if below > 0 && !c.coarse {
            notes.push(format!(
                "{}: about {:.0} % of messages under {LATENCY_FLOOR_MS} ms, most received before their \
                 COMMIT returned; drawn at the axis' start.",
                c.name,
                100.0 * below as f64 / c.points.len() as f64
            ));
        }
    }
    if curves.iter().any(|c| c.coarse) {
        notes.push(
            "Dashed, with markers: a run from before every percentile was recorded, drawn \
             through its p50, p99 and max."
                .into(),
        );
    }
    notes.push(run.to_string());
    Some(Cdf {
        title: format!("Commit → consumer latency at {rate}"),
        x_desc: "latency, ms (log scale)".into(),
        y_desc: "messages delivered within (%)".into(),
        curves,
        notes,
    })
}

/// The processes of a CPU split, in stacking order, as the chart names them.
const PROCESSES: [&str; 4] = [
    "relay",
    "walsender",
    "RabbitMQ (beam.smp)",
    "outbox-bench: consumer (+ publisher in broker-alone rows)",
];

fn split_parts(c: &CpuSplit) -> Vec<Option<f64>> {
    vec![c.relay_us, c.walsender_us, c.rabbitmq_us, c.bench_us]
}

/// A bar of chart 3, its name followed by the relay's CPU over RabbitMQ's where it has both.
fn cpu_row(name: String, parts: Vec<Option<f64>>) -> StackedRow {
    let ratio = CpuSplit {
        relay_us: parts.first().copied().flatten(),
        rabbitmq_us: parts.get(2).copied().flatten(),
        ..CpuSplit::default()
    }
    .relay_per_rabbitmq();
    StackedRow {
        name: match ratio {
            Some(r) => format!("{name} (relay ÷ RabbitMQ {r:.2})"),
            None => name,
        },
        parts,
    }
}

/// The median of each process's figure over `splits` (none where no split has one).
fn median_parts(splits: &[&CpuSplit]) -> Vec<Option<f64>> {
    (0..PROCESSES.len())
        .map(|i| {
            let values: Vec<f64> = splits.iter().filter_map(|c| split_parts(c)[i]).collect();
            (!values.is_empty()).then(|| median(values))
        })
        .collect()
}

/// Chart 3: the suite's splits ([`Results::cpu_splits`]), the cluster's drain, and the medians
/// of the `--compare`, `--shards-sweep` and `--emit` drains.
fn cpu_chart(r: &Results, run: &str) -> Option<Stacked> {
    let mut rows: Vec<StackedRow> = r
        .cpu_splits()
        .into_iter()
        .map(|(name, c)| cpu_row(name, split_parts(c)))
        .collect();
    let mut cluster_note = None;
    if let Some(c) = &r.cluster {
        if let Some(cpu) = &c.drain.cpu {
            rows.push(cpu_row(
                format!("{}-node cluster: WAL reader: drain", c.nodes),
                split_parts(cpu),
            ));
            // The relay is given every node's URL, so every node's process is read.
            cluster_note = Some(format!(
                "{}-node cluster: RabbitMQ is its {} nodes together (the relay was given every \
                 node's URL).",
                c.nodes, c.nodes
            ));
        }
    }
    let mut medians = |name: String, splits: Vec<&CpuSplit>| {
        if !splits.is_empty() {
            rows.push(cpu_row(
                format!("{name} {}", rounds_of(splits.len())),
                median_parts(&splits),
            ));
        }
    };
    if let Some(c) = &r.compare {
        for setup in &c.setups {
            let splits = c
                .runs
                .iter()
                .filter(|run| &run.setup == setup)
                .filter_map(|run| run.drain.cpu.as_ref())
                .collect();
            medians(format!("{}: drain", setup_name(setup)), splits);
        }
    }
    let mut counts: Vec<u32> = r.shards.iter().map(|s| s.shards).collect();
    counts.sort_unstable();
    counts.dedup();
    for shards in counts {
        let splits = r
            .shards
            .iter()
            .filter(|s| s.shards == shards)
            .filter_map(|s| s.drain.cpu.as_ref())
            .collect();
        medians(format!("WAL reader, {shards} shard(s): drain"), splits);
    }
    let mut variants: Vec<&str> = r.emit_drains.iter().map(|e| e.variant.as_str()).collect();
    variants.sort_unstable();
    variants.dedup();
    for variant in variants {
        let splits = r
            .emit_drains
            .iter()
            .filter(|e| e.variant == variant)
            .filter_map(|e| e.drain.cpu.as_ref())
            .collect();
        medians(format!("WAL reader, {variant}: drain"), splits);
    }
    if let Some(c) = &r.cost_growth {
        for m in c.summarize() {
            let splits = c
                .runs_of(m.part, m.shards, m.payload_bytes)
                .into_iter()
                .filter_map(|run| run.drain.cpu.as_ref())
                .collect();
            medians(format!("{}, {}: drain", m.part.place(), m.setup), splits);
        }
    }
    if rows.is_empty() {
        return None;
    }
    Some(Stacked {
        title: "CPU per message, by process".into(),
        x_desc: "µs of CPU per message (utime + stime from /proc over the messages received)"
            .into(),
        parts: PROCESSES.iter().map(|p| p.to_string()).collect(),
        rows,
        notes: vec![
            "A process without a segment has none in that setup (polling: no walsender; broker \
             alone: no relay) or could not be read: never a zero."
                .into(),
            "On 2 cores every process shares the CPU: the sum, not the relay alone, sets the \
             drain rate."
                .into(),
            "relay ÷ RabbitMQ: the relay's µs per message over RabbitMQ's in the same bar, \
             which a machine's speed moves less than either (the target: 0.2 or less)."
                .into(),
        ]
        .into_iter()
        .chain(cluster_note)
        .chain([run.to_string()])
        .collect(),
    })
}

/// Chart 4: the WAL reader's `--max-in-flight` sweep.
fn window_chart(r: &Results, run: &str) -> Option<Sweep> {
    if r.sweep.is_empty() {
        return None;
    }
    let mut points: Vec<SweepPoint> = r
        .sweep
        .iter()
        .map(|s| SweepPoint {
            window: s.window,
            drain: s.drain_msgs_per_sec,
            broker: (s.broker_msgs_per_sec > 0.0).then_some(s.broker_msgs_per_sec),
            duplicates: s.crash_duplicates,
            bound: s.duplicate_bound,
        })
        .collect();
    points.sort_by_key(|p| p.window);
    let mut notes = vec![format!(
        "Each window: a drain of {} single-row transactions, and a kill -9 at 40 % of a backlog \
         as large, then a restart; bound = window + rate × status interval ({} ms) + 1.",
        int(r.scale.sweep_rows as f64),
        r.scale.status_interval_ms
    )];
    if points.len() == 1 {
        notes.push("This run measured one window only (--sweep with one value).".into());
    }
    notes.push(run.to_string());
    Some(Sweep {
        title: "WAL reader: --max-in-flight against drain rate and crash duplicates".into(),
        x_desc: "--max-in-flight (unconfirmed messages, log scale)".into(),
        y_desc: "drain, messages per second".into(),
        y2_desc: "crash duplicates (messages)".into(),
        series: [
            "WAL reader drain (msgs/s)".into(),
            "broker alone, relay's publisher, same window (msgs/s)".into(),
            "crash duplicates (right axis)".into(),
            "duplicate bound (right axis)".into(),
        ],
        points,
        notes,
    })
}

#[cfg(test)]
mod tests;
