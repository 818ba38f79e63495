//! The full run's drain of every setup as a table and as the drain chart's rows: a view over
//! the whole run ([`Results`]: its setups, limits and cluster), above [`crate::measurement::results`] and
//! [`crate::scenarios::setups`] (the section's data).

use std::fmt::Write as _;

use crate::measurement::figures::{drain_cell, int, or_dash, ratio, Drain};
use crate::measurement::results::{ClusterResults, Results};
use crate::scenarios::setups::DrainSetup;

/// Index of the consumer and no-consumer figures in a [`Row`].
pub const WITH_CONSUMER: usize = 0;
pub const NO_CONSUMER: usize = 1;

/// One row of the table, one group of the chart.
#[derive(Debug)]
pub struct Row<'a> {
    pub name: String,
    /// The broker alone the other rows of its part are set against (100 %).
    pub baseline: bool,
    /// Consumer attached ([`WITH_CONSUMER`]) and none ([`NO_CONSUMER`]); `None`: not measured.
    pub cells: [Option<Cell<'a>>; 2],
    /// The consumer-attached figure is scenario 1's drain.
    pub reused: bool,
}

#[derive(Debug)]
pub struct Cell<'a> {
    /// Messages per second (the broker alone: received with a consumer, confirmed without).
    pub rate: f64,
    /// The broker alone's rate of the same kind (consumer or none) that this one is set
    /// against; `None` where that broker alone was not measured.
    pub broker: Option<f64>,
    /// The drain behind the figure (none for a broker alone).
    pub drain: Option<&'a Drain>,
}

impl Cell<'_> {
    pub fn ratio(&self) -> Option<f64> {
        self.broker.filter(|b| *b > 0.0).map(|b| self.rate / b)
    }

    pub fn complete(&self) -> bool {
        self.drain.is_none_or(|d| d.complete)
    }
}

fn broker_cell<'a>(rate: f64) -> Cell<'a> {
    Cell {
        rate,
        broker: Some(rate),
        drain: None,
    }
}

fn drain_figure(d: &Drain, broker: Option<f64>) -> Cell<'_> {
    Cell {
        rate: d.msgs_per_sec,
        broker,
        drain: Some(d),
    }
}

/// The single-node rows: the broker alone (minimal publisher, then the relay's own publisher
/// at the relays' window), then each setup of the section; empty without the section.
pub fn single_node_rows(r: &Results) -> Vec<Row<'_>> {
    let Some(section) = &r.setups else {
        return Vec::new();
    };
    let brokers = [
        r.limits.bare_broker.as_ref().map(|b| b.rate()),
        r.limits
            .bare_broker_no_consumer
            .as_ref()
            .map(|b| b.confirmed_per_sec),
    ];
    let mut rows = vec![Row {
        name: "Broker alone, minimal publisher".into(),
        baseline: true,
        cells: brokers.map(|b| b.map(broker_cell)),
        reused: false,
    }];
    if let Some(b) = r.limits.broker_at(section.window) {
        rows.push(Row {
            name: "Broker alone, relay's publisher".into(),
            baseline: false,
            cells: [
                Some(Cell {
                    rate: b.received_per_sec,
                    broker: brokers[WITH_CONSUMER],
                    drain: None,
                }),
                None,
            ],
            reused: false,
        });
    }
    for setup in section.setups() {
        let run = |consumer: bool| section.run(setup, consumer);
        let slot = |i: usize| run(i == WITH_CONSUMER).map(|r| drain_figure(&r.drain, brokers[i]));
        rows.push(Row {
            name: setup
                .parse::<DrainSetup>()
                .map_or_else(|_| setup.to_string(), |s| s.reader_name()),
            baseline: false,
            cells: [slot(WITH_CONSUMER), slot(NO_CONSUMER)],
            reused: run(true).is_some_and(|r| r.reused),
        });
    }
    rows
}

/// The cluster's rows when it measured the minimal publisher and a drain with no consumer
/// (full runs since the drains of every setup were added); empty for older cluster sections,
/// whose one drain and relay's publisher the chart draws alone.
pub fn cluster_rows(c: &ClusterResults) -> Vec<Row<'_>> {
    if c.bare_broker.is_none() && c.bare_broker_no_consumer.is_none() {
        return Vec::new();
    }
    let brokers = [
        c.bare_broker.as_ref().map(|b| b.rate()),
        c.bare_broker_no_consumer
            .as_ref()
            .map(|b| b.confirmed_per_sec),
    ];
    let nodes = c.nodes;
    vec![
        Row {
            name: format!("{nodes}-node cluster: broker alone, minimal publisher"),
            baseline: true,
            cells: brokers.map(|b| b.map(broker_cell)),
            reused: false,
        },
        Row {
            name: format!("{nodes}-node cluster: broker alone, relay's publisher"),
            baseline: false,
            cells: [
                Some(Cell {
                    rate: c.broker.received_per_sec,
                    broker: brokers[WITH_CONSUMER],
                    drain: None,
                }),
                None,
            ],
            reused: false,
        },
        Row {
            name: format!("{nodes}-node cluster: WAL reader"),
            baseline: false,
            cells: [
                Some(drain_figure(&c.drain, brokers[WITH_CONSUMER])),
                c.drain_no_consumer
                    .as_ref()
                    .map(|d| drain_figure(d, brokers[NO_CONSUMER])),
            ],
            reused: false,
        },
    ]
}

/// A figure of the table: the rate (with how far an unfinished drain got) and its ratio.
fn cells(cell: Option<&Cell>) -> String {
    let Some(c) = cell else {
        return "— | —".into();
    };
    let rate = match c.drain {
        Some(d) => drain_cell(Some(d)),
        None => int(c.rate),
    };
    format!("{rate} | {}", or_dash(c.ratio(), ratio))
}

/// The section's table (nothing without the section or the cluster's figures of it).
pub fn markdown(r: &Results, s: &mut String) {
    let single = single_node_rows(r);
    let cluster = r.cluster.as_ref().map(cluster_rows).unwrap_or_default();
    if single.is_empty() && cluster.is_empty() {
        return;
    }
    let rows = r.setups.as_ref().map_or_else(
        || r.cluster.as_ref().map_or(0, |c| c.drain.rows),
        |s| s.rows,
    );
    let _ = writeln!(
        s,
        "### Drain of every setup, consumer attached and none ({} single-row txns)\n",
        int(rows as f64)
    );
    let _ = writeln!(
        s,
        "| Setup | Consumer attached, msgs/s | ÷ broker alone | No consumer, msgs/s | ÷ broker alone |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|");
    for row in single.iter().chain(&cluster) {
        let _ = writeln!(
            s,
            "| {}{} | {} | {} |",
            row.name,
            if row.reused { " ¹" } else { "" },
            cells(row.cells[WITH_CONSUMER].as_ref()),
            cells(row.cells[NO_CONSUMER].as_ref()),
        );
    }
    let mut notes = vec![
        "Consumer attached: distinct ids received, from the relay's start to the last (broker \
         alone: from the first publish to the last receipt). No consumer: messages in the queue \
         (RabbitMQ's count, a passive declare every 5 ms), from the relay's start until it holds \
         the backlog, against the broker alone's confirm rate with no consumer either."
            .to_string(),
    ];
    if let Some(section) = &r.setups {
        notes.push(format!(
            "One drain per setup and consumer, in the table's order; WAL relays at \
             --max-in-flight {}. Shards: `setup --shards N` and N relays into one queue, rows of \
             500 aggregates (one in ten of none). outbox_emit: a backlog of events written by \
             the table's `outbox_emit`, no row. The section's own drains took {:.0} s.",
            int(f64::from(section.window)),
            section.seconds
        ));
        if single.iter().any(|row| row.reused) {
            notes.push(
                "¹ Consumer attached: scenario 1's drain of the same backlog (the reference \
                 table's figure), not run again."
                    .into(),
            );
        }
    }
    if let Some(c) = r.cluster.as_ref().filter(|_| !cluster.is_empty()) {
        let no_consumer = match c.no_consumer_node {
            Some(node) => format!(
                "; with no consumer, the relay given only the queue leader's URL and the \
                 publisher through it too (node {node})"
            ),
            None => String::new(),
        };
        notes.push(format!(
            "{}-node cluster: {} queues; % of the minimal publisher on the same cluster, \
             publishing through the node the consumer-attached drain's relay used \
             ({}){no_consumer}; every queue declared and consumed through node {}.",
            c.nodes, c.queue_type, c.broker_publisher_node, c.declared_through
        ));
    }
    let _ = writeln!(s, "\n{}\n", notes.join(" "));
}
