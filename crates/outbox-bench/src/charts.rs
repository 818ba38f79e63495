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

use crate::compare::CompareResults;
use crate::cpu::CpuSplit;
use crate::figures::{int, median, LatencyMs};
use crate::results::Results;
use crate::setup_table::{self, Row, NO_CONSUMER, WITH_CONSUMER};
use crate::setups::DrainSetup;

mod draw;
mod model;

use model::{
    Bar, BarGroup, Bars, Cdf, Curve, Stacked, StackedRow, Sweep, SweepPoint, LATENCY_FLOOR_MS,
};

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

/// A bar of `rate` msgs/s labelled with its ratio to `baseline` (none: the rate alone).
fn rate_bar(rate: f64, baseline: Option<f64>, complete: bool) -> Bar {
    let baseline = baseline.filter(|b| *b > 0.0);
    let mut label = format!("{} msgs/s", int(rate));
    if let Some(b) = baseline {
        label.push_str(&format!(" · {:.0} % of broker alone", 100.0 * rate / b));
    }
    if !complete {
        label.push_str(", window ended first");
    }
    Bar {
        value: rate,
        label,
        reference: baseline,
    }
}

/// The broker alone that the other bars of its run are set against.
fn baseline_bar(rate: f64) -> Bar {
    Bar {
        value: rate,
        label: format!("{} msgs/s = 100 %", int(rate)),
        reference: None,
    }
}

/// A drain setup's name as a reader knows it (`poll:2x1000` is "2 polling workers × 1,000").
fn setup_name(spec: &str) -> String {
    spec.parse::<DrainSetup>()
        .map_or_else(|_| spec.to_string(), |s| s.reader_name())
}

/// "(median of N rounds)" for a figure taken over rounds, "(1 round)" for one.
fn rounds_of(n: usize) -> String {
    if n == 1 {
        "(1 round)".into()
    } else {
        format!("(median of {n} rounds)")
    }
}

fn drain_group(
    name: impl Into<String>,
    consumer: Option<Bar>,
    no_consumer: Option<Bar>,
) -> BarGroup {
    BarGroup {
        name: name.into(),
        bars: vec![consumer, no_consumer],
    }
}

/// A group of the drain chart from a row of the setups section: each bar labelled with its
/// ratio to the broker alone of its kind (a broker-alone row: 100 %).
fn row_group(row: &Row) -> BarGroup {
    let bar = |cell: &setup_table::Cell| {
        if row.baseline {
            baseline_bar(cell.rate)
        } else {
            rate_bar(cell.rate, cell.broker, cell.complete())
        }
    };
    let name = if row.reused {
        format!("{} ¹", row.name)
    } else {
        row.name.clone()
    };
    BarGroup {
        name,
        bars: row.cells.iter().map(|c| c.as_ref().map(bar)).collect(),
    }
}

/// Chart 1: the suite's drain of every setup (or, in files from before it, the limits and
/// scenario 1's drains), the cluster, and the `--compare`, `--shards-sweep` and `--emit`
/// drains, each against the broker alone of its own run.
fn drain_chart(r: &Results, run: &str) -> Option<Bars> {
    let mut groups = Vec::new();
    let mut notes = Vec::new();
    let mut backlogs = Vec::new();

    let bare = r.limits.bare_broker.as_ref().map(|b| b.rate());
    let single_node = setup_table::single_node_rows(r);
    if let Some(section) = &r.setups {
        backlogs.push(section.rows);
        groups.extend(single_node.iter().map(row_group));
        notes.push(
            "Every setup drained once with a consumer and once without; N shards: N relays into \
             one queue, rows of 500 aggregates; outbox_emit: a backlog of emitted events, no row."
                .to_string(),
        );
        if single_node.iter().any(|row| row.reused) {
            notes.push(
                "¹ With a consumer: scenario 1's drain (the reference table's), not run again."
                    .into(),
            );
        }
    } else {
        let bare_alone = r
            .limits
            .bare_broker_no_consumer
            .as_ref()
            .map(|b| b.confirmed_per_sec);
        let relays_publisher = r
            .limits
            .broker_at(r.scale.max_in_flight)
            .map(|b| b.received_per_sec);
        // The independent limit when the run measured it; older runs had only the
        // relay's own publisher.
        let baseline = bare.or(relays_publisher);
        if bare.is_some() || bare_alone.is_some() {
            groups.push(drain_group(
                "Broker alone, minimal publisher",
                bare.map(baseline_bar),
                bare_alone.map(baseline_bar),
            ));
        }
        if let Some(b) = relays_publisher {
            groups.push(drain_group(
                "Broker alone, relay's publisher",
                Some(rate_bar(b, baseline, true)),
                None,
            ));
        }
        for m in &r.modes {
            if let Some(d) = &m.drain {
                backlogs.push(d.rows);
                groups.push(drain_group(
                    m.mode.clone(),
                    Some(rate_bar(d.msgs_per_sec, baseline, d.complete)),
                    None,
                ));
            }
        }
    }
    if !groups.is_empty() {
        notes.push(format!(
            "%: of the broker alone in the same run, {} (no consumer: of its confirm rate with no \
             consumer either).",
            if bare.is_some() {
                "the minimal publisher with no relay code"
            } else {
                "the relay's own publisher (this run measured no minimal publisher)"
            }
        ));
    }
    if let Some(c) = &r.cluster {
        backlogs.push(c.drain.rows);
        let rows = setup_table::cluster_rows(c);
        if rows.is_empty() {
            let broker = c.broker.received_per_sec;
            groups.push(drain_group(
                format!("{}-node cluster: broker alone, relay's publisher", c.nodes),
                Some(baseline_bar(broker)),
                None,
            ));
            groups.push(drain_group(
                format!("{}-node cluster: WAL reader", c.nodes),
                Some(rate_bar(
                    c.drain.msgs_per_sec,
                    Some(broker),
                    c.drain.complete,
                )),
                None,
            ));
        } else {
            groups.extend(rows.iter().map(row_group));
        }
        notes.push(format!(
            "{}-node cluster: {} queues, % of the broker alone on the same cluster ({}).",
            c.nodes,
            c.queue_type,
            if rows.is_empty() {
                "the relay's publisher"
            } else {
                "the minimal publisher"
            }
        ));
    }
    if let Some(c) = &r.compare {
        backlogs.push(c.rows);
        compare_groups(c, &mut groups, &mut notes);
    }
    if !r.shards.is_empty() {
        let broker = median(r.shards_broker.iter().map(|b| b.received_per_sec).collect());
        let rounds = r.shards_broker.len();
        if rounds > 0 {
            groups.push(drain_group(
                format!("Broker alone, relay's publisher {}", rounds_of(rounds)),
                Some(baseline_bar(broker)),
                None,
            ));
        }
        let mut counts: Vec<u32> = r.shards.iter().map(|s| s.shards).collect();
        counts.sort_unstable();
        counts.dedup();
        for shards in counts {
            let drains: Vec<_> = r.shards.iter().filter(|s| s.shards == shards).collect();
            backlogs.extend(drains.iter().map(|s| s.drain.rows));
            let rate = median(drains.iter().map(|s| s.drain.msgs_per_sec).collect());
            let name = if shards == 1 {
                "WAL reader, 1 relay".to_string()
            } else {
                format!("WAL reader, {shards} shards")
            };
            groups.push(drain_group(
                format!("{name} {}", rounds_of(drains.len())),
                Some(rate_bar(
                    rate,
                    (rounds > 0).then_some(broker),
                    drains.iter().all(|s| s.drain.complete),
                )),
                None,
            ));
        }
        notes.push("Shards: rows of 500 aggregates, all relays into one queue.".into());
    }
    if !r.emit_drains.is_empty() {
        let mut variants: Vec<&str> = r.emit_drains.iter().map(|e| e.variant.as_str()).collect();
        variants.sort_unstable();
        variants.dedup();
        for variant in variants {
            let drains: Vec<_> = r
                .emit_drains
                .iter()
                .filter(|e| e.variant == variant)
                .collect();
            backlogs.extend(drains.iter().map(|e| e.drain.rows));
            let rate = median(drains.iter().map(|e| e.drain.msgs_per_sec).collect());
            groups.push(drain_group(
                format!("WAL reader, {variant} {}", rounds_of(drains.len())),
                Some(rate_bar(
                    rate,
                    None,
                    drains.iter().all(|e| e.drain.complete),
                )),
                None,
            ));
        }
        notes.push("--emit measures no broker alone: its drains show the rate only.".into());
    }
    if groups.is_empty() {
        return None;
    }
    if groups.iter().any(|g| g.bars.iter().any(Option::is_none)) {
        notes.push(
            "A setup without a bar of one colour was not measured that way in this run (the \
             relay's publisher runs with a consumer only, as did every drain of a full run before \
             the drains of every setup were added; `bench --compare SETUPS --no-consumer` \
             drains without one)."
                .into(),
        );
    }
    backlogs.sort_unstable();
    backlogs.dedup();
    let backlog = match backlogs.as_slice() {
        [one] => format!("a backlog of {} single-row transactions", int(*one as f64)),
        _ => "backlogs of single-row transactions".to_string(),
    };
    notes.push(run.to_string());
    Some(Bars {
        title: format!("Drain rate: {backlog}, one relay binary, same run"),
        x_desc: "messages per second (consumer attached: received; no consumer: confirmed / in \
                 the queue)"
            .into(),
        series: vec!["consumer attached".into(), "no consumer".into()],
        groups,
        reference_desc: "the bar's broker alone (100 %)".into(),
        notes,
    })
}

/// The `--compare` setups' medians beside the minimal publisher's median.
fn compare_groups(c: &CompareResults, groups: &mut Vec<BarGroup>, notes: &mut Vec<String>) {
    let slot = if c.consumer {
        WITH_CONSUMER
    } else {
        NO_CONSUMER
    };
    let place = |name: String, bar: Bar| {
        let mut bars = vec![None, None];
        bars[slot] = Some(bar);
        BarGroup { name, bars }
    };
    let broker = c.broker_median();
    if let Some(b) = broker {
        groups.push(place(
            format!(
                "Broker alone, minimal publisher {}",
                rounds_of(c.broker.len())
            ),
            baseline_bar(b),
        ));
    }
    for s in c.summarize() {
        groups.push(place(
            format!(
                "{} {}",
                setup_name(&s.setup),
                rounds_of(s.msgs_per_sec.len())
            ),
            rate_bar(s.median_msgs_per_sec, broker, s.complete),
        ));
    }
    notes.push(format!(
        "--compare: {} rounds, the setups' order rotated; {}.",
        c.rounds,
        if c.consumer {
            "consumer attached"
        } else {
            "no consumer: messages in the queue, from the broker's count"
        }
    ));
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
