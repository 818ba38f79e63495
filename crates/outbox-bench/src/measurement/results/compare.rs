//! The figures of `outbox-bench bench --compare` (the setups are [`crate::scenarios::compare`],
//! the Markdown [`crate::report::compare`]).

use serde::{Deserialize, Serialize};

use crate::measurement::figures::{median, us_per_msg, Drain, LatencyRun};

/// The figures of `--compare`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CompareResults {
    /// The setups in the order given; ratios are to the first.
    pub setups: Vec<String>,
    /// Backlog of single-row transactions each drain starts with.
    pub rows: u64,
    /// The WAL reader's --max-in-flight and the broker alone's window.
    pub window: u32,
    /// false (`--no-consumer`): nothing consumed the queue; a drain's count is the messages
    /// in it (the broker's count, from passive declares), not distinct ids at a consumer.
    pub consumer: bool,
    pub rounds: u32,
    /// Every drain, in the order run.
    pub runs: Vec<CompareRun>,
    /// The broker alone at `window`, once per round.
    pub broker: Vec<CompareBroker>,
    /// `--compare-latency`: one run per setup, after the drains.
    pub latency: Vec<CompareLatency>,
    /// Per setup, in the order given: the figures the Markdown's summary shows.
    pub summary: Vec<SetupSummary>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompareRun {
    pub round: u32,
    pub setup: String,
    /// /proc/loadavg when the drain started.
    pub load: String,
    pub drain: Drain,
}

/// The broker alone in one round: the minimal publisher ([`crate::measurement::independent`]), with a
/// consumer exactly when the drains have one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompareBroker {
    pub round: u32,
    pub messages: u64,
    /// With a consumer: messages per second to its last receipt.
    pub received_per_sec: Option<f64>,
    pub confirmed_per_sec: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompareLatency {
    pub setup: String,
    pub run: LatencyRun,
}

/// One setup's medians over its rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SetupSummary {
    pub setup: String,
    /// Each round's drain rate, in round order.
    pub msgs_per_sec: Vec<f64>,
    pub median_msgs_per_sec: f64,
    /// The median over the first setup's median.
    pub ratio_to_first: Option<f64>,
    /// The median over the broker alone's median (received per second with a consumer,
    /// confirmed per second without).
    pub ratio_to_broker: Option<f64>,
    pub relay_cpu_us_per_msg: f64,
    /// PostgreSQL's CPU (postmaster and every backend) per message.
    pub pg_cpu_us_per_msg: Option<f64>,
    /// The largest peak RSS of the setup's relays over the rounds.
    pub peak_rss_mib: f64,
    /// Every round delivered the whole backlog within the drain window.
    pub complete: bool,
    pub latency_p50_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
}

impl CompareResults {
    /// The broker alone's median: received per second with a consumer (what the drains
    /// count then), confirmed per second without.
    pub fn broker_median(&self) -> Option<f64> {
        if self.broker.is_empty() {
            return None;
        }
        let of = |b: &CompareBroker| {
            if self.consumer {
                b.received_per_sec.unwrap_or(0.0)
            } else {
                b.confirmed_per_sec
            }
        };
        Some(median(self.broker.iter().map(of).collect()))
    }

    /// Each setup's medians, in the order given.
    pub fn summarize(&self) -> Vec<SetupSummary> {
        let broker = self.broker_median().filter(|b| *b > 0.0);
        let mut out: Vec<SetupSummary> = Vec::new();
        for setup in &self.setups {
            let drains: Vec<&Drain> = self
                .runs
                .iter()
                .filter(|r| &r.setup == setup)
                .map(|r| &r.drain)
                .collect();
            let of = |f: &dyn Fn(&Drain) -> f64| median(drains.iter().map(|d| f(d)).collect());
            let median_msgs_per_sec = of(&|d| d.msgs_per_sec);
            let pg_measured =
                !drains.is_empty() && drains.iter().all(|d| d.pg_cpu_seconds.is_some());
            let latency = self
                .latency
                .iter()
                .find(|l| &l.setup == setup)
                .and_then(|l| l.run.latency.as_ref());
            let first = out
                .first()
                .map(|s| s.median_msgs_per_sec)
                .unwrap_or(median_msgs_per_sec);
            out.push(SetupSummary {
                setup: setup.clone(),
                msgs_per_sec: drains.iter().map(|d| d.msgs_per_sec).collect(),
                median_msgs_per_sec,
                ratio_to_first: (first > 0.0).then(|| median_msgs_per_sec / first),
                ratio_to_broker: broker.map(|b| median_msgs_per_sec / b),
                relay_cpu_us_per_msg: of(&|d| us_per_msg(d.cpu_seconds, d)),
                pg_cpu_us_per_msg: pg_measured
                    .then(|| of(&|d| us_per_msg(d.pg_cpu_seconds.unwrap_or(0.0), d))),
                peak_rss_mib: drains.iter().map(|d| d.peak_rss_mib).fold(0.0, f64::max),
                complete: !drains.is_empty() && drains.iter().all(|d| d.complete),
                latency_p50_ms: latency.map(|l| l.p50),
                latency_p99_ms: latency.map(|l| l.p99),
            });
        }
        out
    }
}
