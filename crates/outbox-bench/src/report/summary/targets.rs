//! The targets a run is held to, met or missed, and their list in the report.

use std::fmt::Write as _;

use crate::measurement::figures::{int, median, ms, ratio};
use crate::measurement::results::{ClusterResults, PublisherPair, Results};

impl Results {
    /// The "WAL targets" list (nothing when the run measured none).
    pub(super) fn targets_list(&self, s: &mut String) {
        let targets = self.targets();
        if !targets.is_empty() {
            let _ = writeln!(s, "\n### WAL targets\n");
            for (met, text) in targets {
                let _ = writeln!(s, "- {} {text}", if met { "met:" } else { "**missed:**" });
            }
        }
    }

    /// Each WAL target (the goals the benchmark checks) with whether this run met it.
    pub fn targets(&self) -> Vec<(bool, String)> {
        let mut out = self.single_node_targets();
        out.extend(self.cluster.as_ref().and_then(cluster_target));
        out
    }

    pub(super) fn single_node_targets(&self) -> Vec<(bool, String)> {
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
        if let Some(target) = self.consumer_pairs_target() {
            out.push(target);
        } else if let (Some(d), Some((limit, name))) =
            (wal.drain.as_ref(), self.limits.independent())
        {
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
        if let Some(c) = wal.drain.as_ref().and_then(|d| d.cpu.as_ref()) {
            if let Some((r, (relay, rabbitmq))) =
                c.relay_per_rabbitmq().zip(c.relay_us.zip(c.rabbitmq_us))
            {
                out.push((
                    r <= 0.2,
                    format!(
                        "relay CPU per message ≤ 0.2 × RabbitMQ's in the drain (single-row \
                         txns, window {w}): {relay:.1} of {rabbitmq:.1} µs = {r:.2}×"
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

/// The cluster's drain with no consumer against the minimal publisher, when both went through
/// the queue leader's node (runs before that placement compared different hops).
impl Results {
    /// With `--single-node-pairs`: the independent limits' target on the median of the pairs'
    /// ratios, each pair's drain over the lower of its own minimal publisher and the walsender
    /// ceiling.
    pub(super) fn consumer_pairs_target(&self) -> Option<(bool, String)> {
        let pairs = &self.limits.consumer_pairs;
        if pairs.is_empty() {
            return None;
        }
        let walsender = self.limits.walsender.as_ref().map(|w| w.rows_per_sec);
        let ratios: Vec<f64> = pairs
            .iter()
            .map(|p| {
                let limit = walsender.map_or(p.broker.rate(), |w| w.min(p.broker.rate()));
                p.drain.msgs_per_sec / limit
            })
            .collect();
        let each: Vec<String> = ratios.iter().map(|r| ratio(*r)).collect();
        let r = median(ratios);
        Some((
            r >= 0.90,
            format!(
                "drain ≥ 90 % of the lower independent limit, min(broker alone with the minimal \
                 publisher, walsender ceiling), median of {} adjacent pairs with a consumer \
                 ({}): {}",
                each.len(),
                each.join(", "),
                ratio(r)
            ),
        ))
    }
}

/// Each pair as "round, who first: drain of publisher = ratio".
pub(super) fn pairs_text(pairs: &[PublisherPair]) -> String {
    let each: Vec<String> = pairs
        .iter()
        .map(|p| {
            format!(
                "{}, {} first: {} of {} = {}",
                p.round,
                if p.relay_first { "relay" } else { "publisher" },
                int(p.drain.msgs_per_sec),
                int(p.broker.rate()),
                ratio(p.ratio())
            )
        })
        .collect();
    each.join("; ")
}

pub(super) fn cluster_target(c: &ClusterResults) -> Option<(bool, String)> {
    let node = c.no_consumer_node?;
    let target = format!(
        "{}-node cluster, no consumer, both through the leader's node {node}: drain ≥ 90 % of \
         the minimal publisher",
        c.nodes
    );
    if !c.no_consumer_pairs.is_empty() {
        let ratios: Vec<f64> = c.no_consumer_pairs.iter().map(|p| p.ratio()).collect();
        let each: Vec<String> = ratios.iter().map(|r| ratio(*r)).collect();
        let r = median(ratios);
        return Some((
            r >= 0.90,
            format!(
                "{target}, median of {} pairs ({}): {}",
                each.len(),
                each.join(", "),
                ratio(r)
            ),
        ));
    }
    let drain = c.drain_no_consumer.as_ref()?;
    let broker = c.bare_broker_no_consumer.as_ref()?;
    let r = drain.msgs_per_sec / broker.confirmed_per_sec;
    Some((
        r >= 0.90,
        format!(
            "{target}: {} of {} = {}",
            int(drain.msgs_per_sec),
            int(broker.confirmed_per_sec),
            ratio(r)
        ),
    ))
}
