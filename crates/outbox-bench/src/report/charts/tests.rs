//! The charts drawn from tests/fixtures/results.json: a results file in today's shape with
//! every section (the suite with its drain of every setup, the cluster, --compare without a
//! consumer, --shards-sweep, --emit), trimmed from real runs (the drain of every setup, which
//! no full run had yet when it was written, from the --compare, --shards-sweep and --emit runs
//! in lab/results). The fixture must round-trip through [`Results`] exactly,
//! so a renamed or dropped field fails here instead of silently emptying a chart; each chart
//! must name every series and axis. No pixel is compared.

use std::path::PathBuf;

use super::*;
use crate::measurement::delivery::Latency;

fn fixture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/results.json")
}

fn fixture() -> Results {
    read(&fixture_path()).expect("the fixture reads")
}

/// The first place two JSON values differ, as a path.
fn first_difference(a: &serde_json::Value, b: &serde_json::Value, path: &str) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(p), Some(q)) => first_difference(p, q, &format!("{path}.{k}")),
                (p, q) => Some(format!(
                    "{path}.{k}: {} in the fixture, {} written",
                    if p.is_some() { "present" } else { "absent" },
                    if q.is_some() { "present" } else { "absent" }
                )),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, &format!("{path}[{i}]"))),
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        _ if a == b => None,
        _ => Some(format!("{path}: {a} in the fixture, {b} written")),
    }
}

/// Every `<text>` of an SVG, unescaped, in document order.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..t.find("</text>")?];
            Some(
                body.trim()
                    .replace("&lt;", "<")
                    .replace("&gt;", ">")
                    .replace("&quot;", "\"")
                    .replace("&apos;", "'")
                    .replace("&amp;", "&"),
            )
        })
        .collect()
}

fn svg_of(charts: &[Chart], file: &str) -> String {
    let chart = charts
        .iter()
        .find(|c| c.file == file)
        .unwrap_or_else(|| panic!("no {file}"));
    match &chart.drawing {
        Drawing::Svg(svg) => svg.clone(),
        Drawing::Empty(why) => panic!("{file} was not drawn: {why}"),
    }
}

/// Asserts that the chart's text (wrapped lines joined) holds every one of `expected`.
fn assert_names(file: &str, svg: &str, expected: &[&str]) {
    let all = texts(svg).join(" ");
    for e in expected {
        assert!(
            all.contains(e),
            "{file} does not name `{e}`; its text: {all}"
        );
    }
}

#[test]
fn the_fixture_round_trips_through_the_results_exactly() {
    let text = std::fs::read_to_string(fixture_path()).expect("fixture");
    let raw: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let written = serde_json::to_value(fixture()).expect("serialises");
    if let Some(diff) = first_difference(&raw, &written, "") {
        panic!(
            "the results' JSON shape changed ({diff}): update tests/fixtures/results.json and \
             the charts that read the field"
        );
    }
}

#[test]
fn the_drain_chart_names_every_setup_series_and_axis() {
    let svg = svg_of(&render(&fixture()).expect("renders"), "drain.svg");
    assert_names(
        "drain.svg",
        &svg,
        &[
            "Drain rate",
            "messages per second",
            "consumer attached",
            "no consumer",
            "Broker alone, minimal publisher",
            "Broker alone, relay's publisher",
            "1 polling worker",
            "5 polling workers",
            "WAL reader",
            "3-node cluster: broker alone, relay's publisher",
            "3-node cluster: WAL reader",
            "Broker alone, minimal publisher (median of 2 rounds)",
            "WAL reader (median of 2 rounds)",
            "2 polling workers × 1,000 (median of 2 rounds)",
            "Broker alone, relay's publisher (1 round)",
            "WAL reader, 1 relay (1 round)",
            "WAL reader, 2 shards (1 round)",
            "WAL reader, outbox_emit (1 round)",
            "WAL reader, table insert (1 round)",
            // 16,510 of the minimal publisher's 15,340 with a consumer.
            "16,510 msgs/s · 108 % of broker alone",
            "15,340 msgs/s = 100 %",
            "12,405 msgs/s = 100 %",
            "A setup without a bar of one colour was not measured that way in this run",
            "Run 20261201T040840Z, relay 9c07dbc",
        ],
    );
}

/// Chart 1 of a full run: every setup of the suite's drain section and the
/// cluster, each with its consumer-attached and its no-consumer bar labelled with the ratio to
/// the broker alone of that kind. The other modes' sections are taken out first, so no name
/// or figure can come from them.
#[test]
fn the_drain_chart_draws_every_setup_of_a_full_run_with_and_without_a_consumer() {
    let mut results = fixture();
    results.compare = None;
    results.shards.clear();
    results.shards_broker.clear();
    results.emit_writers.clear();
    results.emit_drains.clear();
    let svg = svg_of(&render(&results).expect("renders"), "drain.svg");
    assert_names(
        "drain.svg",
        &svg,
        &[
            "consumer attached",
            "no consumer",
            "the bar's broker alone (100 %)",
            // Broker alone, minimal publisher: received with a consumer, confirmed without.
            "Broker alone, minimal publisher",
            "15,340 msgs/s = 100 %",
            "12,405 msgs/s = 100 %",
            "Broker alone, relay's publisher",
            "7,594 msgs/s · 50 % of broker alone",
            // Each setup: with a consumer of 15,340, without of 12,405.
            "WAL reader ¹",
            "16,510 msgs/s · 108 % of broker alone",
            "14,567 msgs/s · 117 % of broker alone",
            "1 polling worker ¹",
            "8,448 msgs/s · 55 % of broker alone",
            "9,796 msgs/s · 79 % of broker alone",
            "2 polling workers",
            "12,500 msgs/s · 81 % of broker alone",
            "11,471 msgs/s · 92 % of broker alone",
            "5 polling workers ¹",
            "13,408 msgs/s · 87 % of broker alone",
            "11,770 msgs/s · 95 % of broker alone",
            "WAL reader, 2 shards",
            "15,980 msgs/s · 104 % of broker alone",
            "14,900 msgs/s · 120 % of broker alone",
            "WAL reader, outbox_emit events",
            "16,050 msgs/s · 105 % of broker alone",
            "14,100 msgs/s · 114 % of broker alone",
            // The cluster against its own minimal publisher: 7,300 received, 8,200 confirmed.
            "3-node cluster: broker alone, minimal publisher",
            "7,300 msgs/s = 100 %",
            "8,200 msgs/s = 100 %",
            "3-node cluster: broker alone, relay's publisher",
            "7,525 msgs/s · 103 % of broker alone",
            "3-node cluster: WAL reader",
            "6,160 msgs/s · 84 % of broker alone",
            "6,800 msgs/s · 83 % of broker alone",
            "¹ With a consumer: scenario 1's drain",
            "% of the broker alone on the same cluster (the minimal publisher)",
        ],
    );
    // Scenario 1's drains are drawn once, in the section, not again as the suite's modes.
    let all = texts(&svg);
    for name in ["WAL reader", "1 polling worker", "5 polling workers"] {
        let groups = all
            .iter()
            .filter(|t| *t == name || t.strip_prefix(name) == Some(" ¹"))
            .count();
        assert_eq!(groups, 1, "{name} drawn {groups} times: {all:?}");
    }
}

/// A full run's file from before the drains of every setup (no drain section, a cluster
/// without its no-consumer figures) draws scenario 1's drains and the cluster as it did then.
#[test]
fn the_drain_chart_of_an_older_full_run_draws_the_suite_drains() {
    let mut results = fixture();
    results.setups = None;
    let cluster = results.cluster.as_mut().expect("the fixture has a cluster");
    cluster.drain_no_consumer = None;
    cluster.bare_broker = None;
    cluster.bare_broker_no_consumer = None;
    results.compare = None;
    results.shards.clear();
    results.emit_drains.clear();
    let svg = svg_of(&render(&results).expect("renders"), "drain.svg");
    assert_names(
        "drain.svg",
        &svg,
        &[
            "16,510 msgs/s · 108 % of broker alone",
            "8,448 msgs/s · 55 % of broker alone",
            "3-node cluster: broker alone, relay's publisher",
            "7,525 msgs/s = 100 %",
            "6,160 msgs/s · 82 % of broker alone",
            "A setup without a bar of one colour was not measured that way in this run",
        ],
    );
    let all = texts(&svg).join(" ");
    assert!(!all.contains("2 polling workers"), "{all}");
}

#[test]
fn the_latency_chart_names_every_curve_and_axis() {
    let svg = svg_of(&render(&fixture()).expect("renders"), "latency.svg");
    assert_names(
        "latency.svg",
        &svg,
        &[
            "Commit → consumer latency at 100 rows/s",
            "latency, ms (log scale)",
            "messages delivered within (%)",
            "Broker alone, relay's publisher (3,000 msgs)",
            "WAL reader (3,000 msgs)",
            "1 polling worker (3,000 msgs; p50, p99, max only)",
            "5 polling workers (3,000 msgs; p50, p99, max only)",
            "3-node cluster: broker alone",
            "3-node cluster: WAL reader (3,000 msgs)",
            "WAL reader (--compare)",
            "drawn through its p50, p99 and max",
            "50 %",
        ],
    );
}

#[test]
fn the_cpu_chart_names_every_process_and_run() {
    let results = fixture();
    let svg = svg_of(&render(&results).expect("renders"), "cpu.svg");
    let wal = results.modes[2]
        .drain
        .as_ref()
        .and_then(|d| d.cpu.as_ref())
        .expect("the fixture's WAL drain has a split");
    let wal_total = format!("{:.1} µs", wal.total_us());
    assert_names(
        "cpu.svg",
        &svg,
        &[
            "CPU per message, by process",
            "µs of CPU per message",
            "relay",
            "walsender",
            "RabbitMQ (beam.smp)",
            "outbox-bench: consumer (+ publisher in broker-alone rows)",
            "WAL reader: drain, single-row txns",
            "WAL reader: drain, 1,000-row txns",
            "1 polling worker: drain, single-row txns",
            "Broker alone, relay's publisher, window 1,024",
            "Broker alone, minimal publisher, window 1,024, consumer attached",
            "Broker alone, minimal publisher, window 1,024, no consumer",
            "3-node cluster: WAL reader: drain",
            "WAL reader: drain (median of 2 rounds)",
            "WAL reader, 2 shard(s): drain (1 round)",
            &wal_total,
            "polling: no walsender",
        ],
    );
}

#[test]
fn the_cpu_chart_has_a_bar_per_cost_growth_setup() {
    let results = Results {
        cost_growth: Some(crate::report::cost_growth::tests::sample()),
        ..Results::default()
    };
    let svg = svg_of(&render(&results).expect("renders"), "cpu.svg");
    assert_names(
        "cpu.svg",
        &svg,
        &[
            "1 node, 4 shards: drain (median of 2 rounds)",
            "1 node, 1 relay, 1,024 B payload: drain",
            "3-node cluster, 1 shard: drain (1 round)",
        ],
    );
}

#[test]
fn the_window_chart_names_every_series_axis_and_window() {
    let results = fixture();
    let svg = svg_of(&render(&results).expect("renders"), "window.svg");
    let mut expected = vec![
        "--max-in-flight".to_string(),
        "drain, messages per second".into(),
        "crash duplicates (messages)".into(),
        "WAL reader drain (msgs/s)".into(),
        "broker alone, relay's publisher, same window (msgs/s)".into(),
        "crash duplicates (right axis)".into(),
        "duplicate bound (right axis)".into(),
    ];
    for s in &results.sweep {
        expected.push(int(f64::from(s.window)));
        expected.push(int(s.crash_duplicates as f64));
    }
    assert!(
        results.sweep.len() >= 3,
        "the fixture sweeps several windows"
    );
    let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    assert_names("window.svg", &svg, &expected);
}

#[test]
fn a_file_without_a_section_draws_no_chart_and_says_why() {
    let charts = render(&Results::default()).expect("renders");
    assert_eq!(charts.len(), 4);
    for chart in charts {
        match chart.drawing {
            Drawing::Empty(why) => assert!(why.starts_with("no "), "{}: {why}", chart.file),
            Drawing::Svg(_) => panic!("{} drawn from nothing", chart.file),
        }
    }
}

#[test]
fn latency_is_drawn_from_every_percentile_or_from_p50_p99_and_max() {
    let ms = std::time::Duration::from_millis;
    let full: LatencyMs = Latency::of((1..=200).map(ms).collect())
        .expect("samples")
        .into();
    let (points, coarse) = cdf_points(&full);
    assert!(!coarse);
    assert_eq!(points.len(), 101);
    assert_eq!(points[0], (1.0, 0.0));
    assert_eq!(points[50], (full.p50, 0.5));
    assert_eq!(points[100], (200.0, 1.0));
    let old = LatencyMs {
        percentiles: Vec::new(),
        ..full.clone()
    };
    assert_eq!(
        cdf_points(&old),
        (vec![(full.p50, 0.5), (full.p99, 0.99), (200.0, 1.0)], true)
    );
}

#[test]
fn compare_setups_are_named_as_a_reader_knows_them() {
    assert_eq!(setup_name("wal"), "WAL reader");
    assert_eq!(setup_name("poll:1"), "1 polling worker");
    assert_eq!(setup_name("poll:2x1000"), "2 polling workers × 1,000");
    assert_eq!(
        setup_name("poll:5x500:delete"),
        "5 polling workers × 500, delete"
    );
    assert_eq!(setup_name("kafka"), "kafka");
}

/// Every results file committed under lab/results reads and draws: the charts can be
/// redrawn from any of them.
#[test]
fn every_committed_results_file_draws() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("lab/results");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("crates/outbox-bench/lab/results")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() > 10, "{} results files", files.len());
    for file in files {
        let results = read(&file).unwrap_or_else(|e| panic!("{e:#}"));
        let charts = render(&results).unwrap_or_else(|e| panic!("{}: {e:#}", file.display()));
        let drawn = |name: &str| {
            charts
                .iter()
                .any(|c| c.file == name && matches!(c.drawing, Drawing::Svg(_)))
        };
        let setups = !results.modes.is_empty()
            || results.compare.is_some()
            || !results.shards.is_empty()
            || !results.emit_drains.is_empty()
            || results.cluster.is_some();
        let split = !results.cpu_splits().is_empty()
            || results.cluster.iter().any(|c| c.drain.cpu.is_some())
            || results.emit_drains.iter().any(|e| e.drain.cpu.is_some())
            || results.shards.iter().any(|s| s.drain.cpu.is_some())
            || results
                .cost_growth
                .iter()
                .flat_map(|c| &c.runs)
                .any(|r| r.drain.cpu.is_some())
            || results
                .compare
                .iter()
                .flat_map(|c| &c.runs)
                .any(|r| r.drain.cpu.is_some());
        assert_eq!(drawn("drain.svg"), setups, "{}", file.display());
        assert_eq!(drawn("cpu.svg"), split, "{}", file.display());
        assert_eq!(
            drawn("window.svg"),
            !results.sweep.is_empty(),
            "{}",
            file.display()
        );
        if !results.modes.is_empty() {
            assert!(drawn("latency.svg"), "{}", file.display());
        }
    }
}

#[test]
fn latencies_below_the_axis_floor_are_counted_in_a_note() {
    // A tenth of the messages arrived before their COMMIT returned: measured as 0.
    let ms = std::time::Duration::from_millis;
    let samples = (0..100).map(|i| if i < 10 { ms(0) } else { ms(1 + i) });
    let mut results = Results::default();
    results.limits.broker_latency = Latency::of(samples.collect()).map(LatencyMs::from);
    results.limits.broker_latency_rate = 100;
    let svg = svg_of(&render(&results).expect("renders"), "latency.svg");
    assert_names(
        "latency.svg",
        &svg,
        &["about 10 % of messages under 0.1 ms", "0.2 ms", "100 ms"],
    );
}
