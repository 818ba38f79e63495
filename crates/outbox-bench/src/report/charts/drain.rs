//! Chart 1, the drain rates: every setup's bars beside its broker alone, from whichever
//! kinds of run the file holds (the suite, the cluster section, `--compare`, `--shards-sweep`,
//! `--emit`).

use crate::measurement::figures::{int, median};
use crate::measurement::results::compare::CompareResults;
use crate::measurement::results::Results;
use crate::report::setup_table::{self, Row, NO_CONSUMER, WITH_CONSUMER};
use crate::scenarios::setups::DrainSetup;

use super::model::{Bar, BarGroup, Bars};

/// A bar of `rate` msgs/s labelled with its ratio to `baseline` (none: the rate alone).
pub(super) fn rate_bar(rate: f64, baseline: Option<f64>, complete: bool) -> Bar {
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
pub(super) fn baseline_bar(rate: f64) -> Bar {
    Bar {
        value: rate,
        label: format!("{} msgs/s = 100 %", int(rate)),
        reference: None,
    }
}

/// A drain setup's name as a reader knows it (`poll:2x1000` is "2 polling workers × 1,000").
pub(super) fn setup_name(spec: &str) -> String {
    spec.parse::<DrainSetup>()
        .map_or_else(|_| spec.to_string(), |s| s.reader_name())
}

/// "(median of N rounds)" for a figure taken over rounds, "(1 round)" for one.
pub(super) fn rounds_of(n: usize) -> String {
    if n == 1 {
        "(1 round)".into()
    } else {
        format!("(median of {n} rounds)")
    }
}

pub(super) fn drain_group(
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
pub(super) fn row_group(row: &Row) -> BarGroup {
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
pub(super) fn drain_chart(r: &Results, run: &str) -> Option<Bars> {
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
pub(super) fn compare_groups(
    c: &CompareResults,
    groups: &mut Vec<BarGroup>,
    notes: &mut Vec<String>,
) {
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
