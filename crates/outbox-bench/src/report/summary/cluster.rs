//! The cluster section's table.

use std::fmt::Write as _;

use super::*;
use crate::measurement::figures::{drain_cell, int, median, ms, or_dash, ratio, Drain, LatencyMs};
use crate::measurement::results::{ClusterResults, PublisherPair, Results};

impl Results {
    /// The cluster section's table, with the single-node WAL reader of the same run (if it
    /// ran) in the same columns, and where each connection went.
    pub(super) fn cluster_table(&self, s: &mut String, c: &ClusterResults) {
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
             published through the node of the matching relay run ({bp}, {blp}){nc}. Latency: \
             commit→consumer for the relay, publish→consumer for the broker alone, at {rate} \
             per second. The section took {secs:.0} s, starting the cluster {start:.0} s of it.",
            w = int(f64::from(c.window)),
            decl = c.declared_through,
            leader = c.leader_node,
            dn = nodes(&c.drain_relay_nodes),
            ln = nodes(&c.latency_relay_nodes),
            bp = c.broker_publisher_node,
            blp = c.broker_latency_publisher_node,
            nc = c.no_consumer_node.map_or(String::new(), |node| format!(
                "; the drain with no consumer had only the queue leader's URL, and its \
                 broker alone published through the leader too (node {node})"
            )),
            rate = c.broker_latency_rate,
            secs = c.seconds,
            start = c.startup_secs,
        );
        if !c.no_consumer_pairs.is_empty() {
            let _ = writeln!(
                s,
                "\nThe consumer-less drain against the minimal publisher with no consumer, both \
                 through the leader, in pairs whose order alternates (msgs/s): {}.",
                pairs_text(&c.no_consumer_pairs)
            );
        }
        if let Some(node) = c.follower_node {
            let ratios = c.follower_pairs.iter().map(PublisherPair::ratio).collect();
            let _ = writeln!(
                s,
                "\nThe same pairs through the follower node {node}, which forwards every publish \
                 to the leader (msgs/s): {}; median {}.",
                pairs_text(&c.follower_pairs),
                ratio(median(ratios))
            );
        }
    }
}
