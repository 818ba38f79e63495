//! What a run delivered, judged from outside the relay: the ids the writers committed against
//! the deliveries the consumer recorded.
//!
//! - missing: committed ids never received (the at-least-once promise broken, or not yet);
//! - duplicates: deliveries beyond the first of an id (allowed after a failure, not otherwise);
//! - unexpected: received ids this run did not commit (leftovers, or another writer);
//! - in commit order: `x-outbox-seq` never went down in arrival order (each message's is
//!   compared with the highest seen before it);
//! - rate: committed rows over the time from the first commit to the receipt that completed
//!   the set; latency: from a row's commit to its first receipt.
//!
//! Pure: it judges the two lists only, and must never take a figure from the relay itself.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::measurement::writers::Written;
use outbox_testkit::arrivals::Arrival;

/// How many missing ids the report names.
const MISSING_SHOWN: usize = 5;

#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub committed: usize,
    pub transactions: u64,
    pub received: usize,
    pub distinct: usize,
    pub missing: usize,
    pub duplicates: usize,
    pub unexpected: usize,
    /// Deliveries without an `x-outbox-seq` header.
    pub without_seq: usize,
    /// Deliveries whose `x-outbox-seq` is below one received before them.
    pub out_of_order: usize,
    /// From the first commit to the first receipt of the last committed row to arrive; `None`
    /// unless every committed row arrived.
    pub span: Option<Duration>,
    pub latency: Option<Latency>,
    /// A few of the missing ids.
    pub missing_ids: Vec<String>,
}

/// Commit-to-first-receipt latency over the rows that arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct Latency {
    pub samples: usize,
    pub avg: Duration,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// The 0th, 1st, …, 100th percentile ([`PERCENTILES`] + 1 values, nearest rank): enough
    /// to draw the distribution (docs/benchmarks.md's latency CDF) without every sample.
    pub percentiles: Vec<Duration>,
}

/// [`Latency::percentiles`] holds the quantiles i / PERCENTILES for i = 0..=PERCENTILES.
pub const PERCENTILES: usize = 100;

impl Report {
    pub fn analyze(written: &Written, arrivals: &[Arrival]) -> Report {
        // The first receipt of every id, and how often each arrived.
        let mut first: HashMap<&str, (Instant, usize)> = HashMap::with_capacity(arrivals.len());
        let mut without_id = 0;
        for arrival in arrivals {
            match arrival.message_id.as_deref() {
                Some(id) => first.entry(id).or_insert((arrival.received_at, 0)).1 += 1,
                None => without_id += 1,
            }
        }
        let mut latencies = Vec::with_capacity(written.rows.len());
        let mut missing_ids = Vec::new();
        let mut missing = 0;
        let mut completed_at: Option<Instant> = None;
        for row in &written.rows {
            match first.get(row.id.as_str()) {
                Some(&(received_at, _)) => {
                    latencies.push(received_at.saturating_duration_since(row.committed_at));
                    completed_at = completed_at.max(Some(received_at));
                }
                None => {
                    missing += 1;
                    if missing_ids.len() < MISSING_SHOWN {
                        missing_ids.push(row.id.clone());
                    }
                }
            }
        }
        let committed_ids: std::collections::HashSet<&str> =
            written.rows.iter().map(|r| r.id.as_str()).collect();
        let unexpected = first
            .keys()
            .filter(|id| !committed_ids.contains(*id))
            .count()
            + without_id;
        let (without_seq, out_of_order) = order(arrivals);
        let span = match (missing, written.first_commit(), completed_at) {
            (0, Some(first_commit), Some(done)) => {
                Some(done.saturating_duration_since(first_commit))
            }
            _ => None,
        };
        Report {
            committed: written.rows.len(),
            transactions: written.transactions,
            received: arrivals.len(),
            distinct: first.len(),
            missing,
            duplicates: first.values().map(|&(_, n)| n - 1).sum(),
            unexpected,
            without_seq,
            out_of_order,
            span,
            latency: Latency::of(latencies),
            missing_ids,
        }
    }

    /// Every committed row arrived.
    pub fn complete(&self) -> bool {
        self.missing == 0
    }

    pub fn in_commit_order(&self) -> bool {
        self.without_seq == 0 && self.out_of_order == 0
    }

    /// Rows per second from the first commit to the last receipt (complete runs only).
    pub fn rate(&self) -> Option<f64> {
        let seconds = self.span?.as_secs_f64();
        (seconds > 0.0).then(|| self.committed as f64 / seconds)
    }
}

/// (deliveries without a seq, deliveries below the highest seq seen before them).
fn order(arrivals: &[Arrival]) -> (usize, usize) {
    let mut highest: Option<&str> = None;
    let (mut without, mut out_of_order) = (0, 0);
    for arrival in arrivals {
        let Some(seq) = arrival.seq.as_deref() else {
            without += 1;
            continue;
        };
        match highest {
            Some(h) if seq < h => out_of_order += 1,
            _ => highest = Some(seq),
        }
    }
    (without, out_of_order)
}

impl Latency {
    /// Average, nearest-rank percentiles and maximum; `None` without samples.
    pub fn of(mut samples: Vec<Duration>) -> Option<Latency> {
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        let max = *samples.last()?;
        let total: Duration = samples.iter().sum();
        Some(Latency {
            samples: samples.len(),
            avg: total / samples.len() as u32,
            p50: at(0.50),
            p99: at(0.99),
            max,
            percentiles: (0..=PERCENTILES)
                .map(|i| at(i as f64 / PERCENTILES as f64))
                .collect(),
        })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "rows committed:    {} (in {} transactions)",
            self.committed, self.transactions
        )?;
        writeln!(f, "messages received: {}", self.received)?;
        writeln!(f, "distinct ids:      {}", self.distinct)?;
        write!(f, "missing:           {}", self.missing)?;
        if !self.missing_ids.is_empty() {
            write!(f, " (e.g. {})", self.missing_ids.join(", "))?;
        }
        writeln!(f)?;
        writeln!(f, "duplicates:        {}", self.duplicates)?;
        if self.unexpected > 0 {
            writeln!(
                f,
                "unexpected:        {} (ids this run did not commit)",
                self.unexpected
            )?;
        }
        write!(
            f,
            "in commit order:   {}",
            if self.in_commit_order() { "yes" } else { "no" }
        )?;
        if self.out_of_order > 0 {
            write!(f, " ({} arrived after a later one)", self.out_of_order)?;
        }
        if self.without_seq > 0 {
            write!(f, " ({} without x-outbox-seq)", self.without_seq)?;
        }
        writeln!(f)?;
        match (self.rate(), self.span) {
            (Some(rate), Some(span)) => writeln!(
                f,
                "rate:              {rate:.0} rows/s (first commit to last receipt: {:.2} s)",
                span.as_secs_f64()
            )?,
            _ => writeln!(f, "rate:              n/a (not every row arrived)")?,
        }
        if let Some(l) = &self.latency {
            writeln!(
                f,
                "latency:           avg {}, p50 {}, p99 {}, max {} (commit to receipt)",
                millis(l.avg),
                millis(l.p50),
                millis(l.p99),
                millis(l.max)
            )?;
        }
        Ok(())
    }
}

fn millis(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measurement::writers::CommittedRow;

    fn written(t0: Instant, ids: &[&str]) -> Written {
        Written {
            rows: ids
                .iter()
                .map(|id| CommittedRow {
                    id: id.to_string(),
                    writer: 0,
                    committed_at: t0,
                })
                .collect(),
            transactions: 1,
            started: Some(t0),
        }
    }

    fn arrival(t0: Instant, ms: u64, id: &str, seq: &str) -> Arrival {
        Arrival {
            message_id: Some(id.to_string()),
            seq: Some(seq.to_string()),
            lsn: None,
            redelivered: false,
            received_at: t0 + Duration::from_millis(ms),
        }
    }

    #[test]
    fn a_clean_run() {
        let t0 = Instant::now();
        let w = written(t0, &["a", "b"]);
        let arrivals = [arrival(t0, 10, "a", "01-0"), arrival(t0, 20, "b", "01-1")];
        let r = Report::analyze(&w, &arrivals);
        assert_eq!(
            (r.received, r.distinct, r.missing, r.duplicates),
            (2, 2, 0, 0)
        );
        assert!(r.complete() && r.in_commit_order());
        assert_eq!(r.span, Some(Duration::from_millis(20)));
        assert_eq!(r.rate().map(|x| x.round()), Some(100.0));
        assert_eq!(r.latency.map(|l| l.max), Some(Duration::from_millis(20)));
    }

    #[test]
    fn latency_percentiles_by_nearest_rank() {
        let ms = Duration::from_millis;
        let l = Latency::of((1..=100).rev().map(ms).collect()).expect("samples");
        assert_eq!(l.samples, 100);
        assert_eq!(l.p50, ms(51));
        assert_eq!(l.p99, ms(99));
        assert_eq!(l.max, ms(100));
        assert_eq!(l.avg, Duration::from_micros(50_500));
        // One per percent, the same ranks as p50 and p99, from the fastest to the slowest.
        assert_eq!(l.percentiles.len(), PERCENTILES + 1);
        assert_eq!(l.percentiles[0], ms(1));
        assert_eq!(l.percentiles[10], ms(11));
        assert_eq!((l.percentiles[50], l.percentiles[99]), (l.p50, l.p99));
        assert_eq!(l.percentiles[100], l.max);
        assert_eq!(
            Latency::of(vec![ms(7)]).map(|l| (l.p50, l.p99)),
            Some((ms(7), ms(7)))
        );
        assert_eq!(Latency::of(Vec::new()), None);
    }

    #[test]
    fn missing_duplicates_unexpected_and_disorder() {
        let t0 = Instant::now();
        let w = written(t0, &["a", "b", "c"]);
        let arrivals = [
            arrival(t0, 1, "b", "02-0"),
            arrival(t0, 2, "a", "01-0"),
            arrival(t0, 3, "b", "02-0"),
            arrival(t0, 4, "x", "03-0"),
        ];
        let r = Report::analyze(&w, &arrivals);
        assert_eq!(r.missing, 1);
        assert_eq!(r.missing_ids, vec!["c".to_string()]);
        assert_eq!(r.duplicates, 1);
        assert_eq!(r.unexpected, 1);
        assert_eq!(r.out_of_order, 1);
        assert!(!r.complete() && !r.in_commit_order());
        assert_eq!(r.rate(), None);
        let text = r.to_string();
        assert!(text.contains("in commit order:   no"), "{text}");
        assert!(text.contains("n/a"), "{text}");
    }
}
