//! The figures every section of the report is made of (a drain, a latency) and the formatting
//! of its cells: a leaf, so that the sections and the run that holds them ([`crate::measurement::results`])
//! can all use them without importing each other.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::measurement::cpu::CpuSplit;
use crate::measurement::delivery::Latency;

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
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// One drain's cells of a per-run table: MPS, relay CPU and PostgreSQL CPU per message,
/// peak RSS, complete.
pub fn drain_run_cells(d: &Drain) -> String {
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
pub fn us_per_msg(seconds: f64, d: &Drain) -> f64 {
    if d.received > 0 {
        seconds * 1e6 / d.received as f64
    } else {
        0.0
    }
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
    /// µs of CPU per message of each process, where they could be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuSplit>,
    /// The backlog's average payload, bytes of JSON text (the message body); only
    /// `--cost-growth` measures it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_bytes: Option<f64>,
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

pub fn int(x: f64) -> String {
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

pub fn ms(x: f64) -> String {
    if x >= 1000.0 {
        format!("{:.2} s", x / 1000.0)
    } else if x >= 10.0 {
        format!("{x:.0} ms")
    } else {
        format!("{x:.2} ms")
    }
}

pub fn ratio(x: f64) -> String {
    format!("{:.0} %", x * 100.0)
}

pub fn or_dash<T>(value: Option<T>, f: impl Fn(T) -> String) -> String {
    value.map(f).unwrap_or_else(|| "—".into())
}

/// A drain's rate, with how far it got if the window ended first.
pub fn drain_cell(d: Option<&Drain>) -> String {
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
