//! The report of a run as Markdown ([`Results::markdown`]) and the targets it is held to
//! ([`Results::targets`]): a view over the whole run, above [`crate::results`] (its data) and
//! the sections' own tables, so that the data imports none of its views.

use std::fmt::Write as _;

use crate::figures::{
    drain_cell, drain_run_cells, int, median, ms, or_dash, ratio, us_per_msg, Drain, LatencyMs,
};
use crate::results::{
    AbRun, ClusterResults, EmitWriterRun, ModeResults, PublisherPair, Results, MODES,
};
use crate::setup_table;

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
        // A --recovery-only run has none of the suite's scale: its section gives its own
        // conditions.
        let scale = if self.modes.is_empty() && self.cluster.is_none() && self.recovery.is_some() {
            String::new()
        } else {
            format!(
                " Scale {}: backlogs of {} rows, drain window {} s, {} rows/s for {} s, {} \
                 writers for {} s; WAL --max-in-flight {}, --status-interval {}ms.",
                self.scale.name,
                int(self.scale.drain_rows as f64),
                self.scale.drain_window_secs,
                self.scale.latency_rate,
                self.scale.latency_secs,
                self.scale.load_writers,
                self.scale.load_secs,
                int(f64::from(w)),
                self.scale.status_interval_ms
            )
        };
        let _ = writeln!(
            s,
            "Run {} of relay {}: {} cores, {} MiB, Linux {}; PostgreSQL {} ({}); RabbitMQ \
             {}.{scale}\n",
            m.started_at,
            m.relay_commit,
            m.cores,
            m.memory_mib,
            m.kernel,
            m.postgres,
            settings.join(", "),
            m.rabbitmq,
        );
        if !m.load_average.is_empty() {
            let _ = writeln!(s, "Load average at the start: {}.\n", m.load_average);
        }
        if let Some(pinning) = &m.pinning {
            let _ = writeln!(s, "CPUs: {pinning}.\n");
        }
        if !self.ab.is_empty() {
            ab_table(&mut s, &self.ab);
            return s;
        }
        if let Some(c) = &self.compare {
            c.markdown(&mut s);
            return s;
        }
        if let Some(c) = &self.cost_growth {
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
                setup_table::markdown(self, &mut s);
                self.targets_list(&mut s);
                self.recovery_section(&mut s);
                return s;
            }
            if let Some(r) = &self.recovery {
                r.markdown(&mut s);
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
        setup_table::markdown(self, &mut s);

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
        if !self.limits.consumer_pairs.is_empty() {
            let _ = writeln!(
                s,
                "\nThe WAL drain against the minimal publisher, consumer attached, in adjacent \
                 pairs whose order alternates (msgs/s): {}.",
                pairs_text(&self.limits.consumer_pairs)
            );
        }

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

        self.targets_list(&mut s);
        if let Some(c) = &self.cluster {
            s.push('\n');
            self.cluster_table(&mut s, c);
        }
        self.recovery_section(&mut s);
        s
    }

    /// The recovery section after the others, when the run had one.
    fn recovery_section(&self, s: &mut String) {
        if let Some(r) = &self.recovery {
            s.push('\n');
            r.markdown(s);
        }
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

    /// The "WAL targets" list (nothing when the run measured none).
    fn targets_list(&self, s: &mut String) {
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

    fn single_node_targets(&self) -> Vec<(bool, String)> {
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
    fn consumer_pairs_target(&self) -> Option<(bool, String)> {
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
fn pairs_text(pairs: &[PublisherPair]) -> String {
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

fn cluster_target(c: &ClusterResults) -> Option<(bool, String)> {
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
