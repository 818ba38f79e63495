//! The Markdown report's tests (moved from results.rs with the figures' types: they render
//! [`Results::markdown`]).

use crate::measurement::cpu::CpuSplit;
use crate::measurement::independent::{BareBrokerLimit, WalsenderLimit};
use crate::measurement::results::*;

fn sample() -> Results {
    let drain = Drain {
        rows: 200_000,
        transaction_rows: 1,
        received: 200_000,
        seconds: 10.0,
        msgs_per_sec: 20_000.0,
        complete: true,
        cpu_seconds: 4.0,
        cpu_seconds_per_100k: 2.0,
        peak_rss_mib: 20.5,
        pg_cpu_seconds: None,
        cpu: Some(CpuSplit {
            messages: 200_000,
            relay_us: Some(20.0),
            walsender_us: Some(12.5),
            rabbitmq_us: Some(40.0),
            bench_us: None,
        }),
        payload_bytes: None,
    };
    let latency = LatencyMs {
        samples: 100,
        avg: 1.2,
        p50: 1.0,
        p99: 4.0,
        max: 9.0,
        percentiles: Vec::new(),
    };
    let mut results = Results {
        scale: Scale {
            name: "full".into(),
            drain_rows: 200_000,
            latency_rate: 100,
            load_writers: 100,
            max_in_flight: 1024,
            crash_rows: 200_000,
            ..Scale::default()
        },
        limits: Limits {
            broker: vec![BrokerLimit {
                window: 1024,
                messages: 1000,
                confirmed_per_sec: 21_000.0,
                received_per_sec: 20_500.0,
            }],
            broker_latency: Some(LatencyMs {
                samples: 100,
                avg: 0.8,
                p50: 0.8,
                p99: 1.0,
                max: 2.0,
                percentiles: Vec::new(),
            }),
            broker_latency_rate: 100,
            decode: Some(DecodeLimit {
                rows: 1000,
                rows_per_sec: 80_000.0,
                method: "m".into(),
            }),
            bare_broker: Some(BareBrokerLimit {
                window: 1024,
                messages: 1000,
                consumer: true,
                confirmed_per_sec: 25_000.0,
                received_per_sec: Some(24_000.0),
                cpu: Some(CpuSplit {
                    messages: 1000,
                    rabbitmq_us: Some(30.0),
                    bench_us: Some(8.0),
                    ..CpuSplit::default()
                }),
            }),
            bare_broker_no_consumer: Some(BareBrokerLimit {
                window: 1024,
                messages: 1000,
                consumer: false,
                confirmed_per_sec: 30_000.0,
                received_per_sec: None,
                cpu: None,
            }),
            walsender: Some(WalsenderLimit {
                rows: 1000,
                seconds: 0.05,
                rows_per_sec: 21_000.0,
                method: "pg_recvlogical".into(),
            }),
            ..Limits::default()
        },
        ..Results::default()
    };
    for mode in MODES {
        results.modes.push(ModeResults {
            mode: mode.into(),
            drain: Some(drain.clone()),
            drain_batched: Some(Drain {
                complete: false,
                received: 1500,
                seconds: 60.0,
                ..drain.clone()
            }),
            latency: Some(LatencyRun {
                rate: 100,
                rows: 100,
                missing: 0,
                latency: Some(latency.clone()),
            }),
            load: None,
            crash: Some(Crash {
                rows: 200_000,
                received_before_kill: 90_000,
                lost: 0,
                duplicates: 1200,
                duplicate_bound: Some(3000),
            }),
        });
    }
    results
}

#[test]
fn thousands_separators() {
    assert_eq!(int(0.0), "0");
    assert_eq!(int(999.4), "999");
    assert_eq!(int(1234.0), "1,234");
    assert_eq!(int(1_234_567.0), "1,234,567");
    assert_eq!(int(-4536.0), "-4,536");
}

#[test]
fn the_table_has_a_row_per_mode_and_every_column() {
    let text = sample().markdown();
    let header = text
        .lines()
        .find(|l| l.starts_with("| Setup | MPS"))
        .expect("header");
    let columns = header.matches('|').count();
    for mode in MODES {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("| {mode} | 20,000")))
            .expect(mode);
        assert_eq!(row.matches('|').count(), columns, "{row}");
        // 20,000 of min(20,500, 80,000) and the incomplete batched drain says how far it got.
        assert!(row.contains("| 98 % |"), "{row}");
        assert!(row.contains("1,500 of 200,000 in 60 s"), "{row}");
        assert!(
            row.contains("| 1.20 ms |") && row.contains("20.5 MiB"),
            "{row}"
        );
    }
    assert!(
        text.contains("| Broker alone, relay's publisher, window 1,024 (1,000 msgs) |"),
        "{text}"
    );
    assert!(
        text.contains(
            "| Broker alone, minimal publisher (bare lapin, no relay code), window 1,024, \
                 consumer attached (1,000 msgs) | 24,000 msgs/s received (25,000 confirmed) |"
        ),
        "{text}"
    );
    assert!(
        text.contains("no consumer (1,000 msgs) | 30,000 msgs/s confirmed |"),
        "{text}"
    );
    assert!(
        text.contains(
            "| Walsender ceiling (pg_recvlogical), 1,000 single-row txns | 21,000 rows/s |"
        ),
        "{text}"
    );
}

#[test]
fn targets_say_met_and_missed() {
    let results = sample();
    let targets = results.targets();
    let find = |prefix: &str| {
        targets
            .iter()
            .find(|(_, t)| t.starts_with(prefix))
            .map(|(met, _)| *met)
    };
    assert_eq!(find("drain ≥ 90 % of broker alone"), Some(true));
    // 20,000 of min(24,000, 21,000): the walsender is the lower.
    let independent = targets
        .iter()
        .find(|(_, t)| t.contains("lower independent limit"))
        .expect("the independent limits' target");
    assert!(independent.0, "{independent:?}");
    assert!(
        independent
            .1
            .ends_with("= walsender ceiling: 20,000 of 21,000 = 95 %"),
        "{independent:?}"
    );
    // 1.0 vs 0.8 ms is 1.25×; 4.0 vs 1.0 ms is 4×.
    assert_eq!(find("p50 ≤ 1.5×"), Some(true));
    assert_eq!(find("p99 ≤ 3×"), Some(false));
    assert_eq!(find("crash: zero lost"), Some(true));
    assert_eq!(find("crash duplicates below"), Some(true));
    assert_eq!(find("peak RSS"), Some(true));
    let cpu = targets
        .iter()
        .find(|(_, t)| t.starts_with("relay CPU per message ≤ 0.2 × RabbitMQ's"))
        .expect("the CPU ratio's target");
    assert!(!cpu.0, "{cpu:?}");
    assert!(cpu.1.ends_with("20.0 of 40.0 µs = 0.50×"), "{cpu:?}");
}

#[test]
fn consumer_pairs_put_the_median_on_the_independent_target() {
    let mut results = sample();
    let broker = |received: f64| BareBrokerLimit {
        received_per_sec: Some(received),
        ..results.limits.bare_broker.clone().expect("in the sample")
    };
    let pair = |round: u32, drain: f64, broker: BareBrokerLimit| PublisherPair {
        round,
        relay_first: round % 2 == 1,
        drain: Drain {
            msgs_per_sec: drain,
            ..Drain::default()
        },
        broker,
    };
    // Each over the lower of its publisher and the walsender ceiling (21,000): 18,000 of
    // 20,000, 19,000 of 21,000, 17,000 of 20,000.
    results.limits.consumer_pairs = vec![
        pair(1, 18_000.0, broker(20_000.0)),
        pair(2, 19_000.0, broker(23_000.0)),
        pair(3, 17_000.0, broker(20_000.0)),
    ];
    let targets = results.targets();
    let independent: Vec<_> = targets
        .iter()
        .filter(|(_, t)| t.contains("lower independent limit"))
        .collect();
    assert_eq!(independent.len(), 1, "{targets:?}");
    assert!(independent[0].0, "{independent:?}");
    assert!(
        independent[0]
            .1
            .ends_with("median of 3 adjacent pairs with a consumer (90 %, 90 %, 85 %): 90 %"),
        "{independent:?}"
    );
    assert!(results.markdown().contains(
        "in adjacent pairs whose order alternates (msgs/s): 1, relay first: 18,000 of \
             20,000 = 90 %; 2, publisher first: 19,000 of 23,000 = 83 %;"
    ));
}

#[test]
fn the_cluster_target_needs_both_no_consumer_runs_through_the_leader() {
    let mut cluster = cluster_sample();
    let results = |cluster: &ClusterResults| Results {
        cluster: Some(cluster.clone()),
        ..Results::default()
    };
    assert!(results(&cluster).targets().is_empty());
    cluster.drain_no_consumer = Some(Drain {
        msgs_per_sec: 9_300.0,
        ..Drain::default()
    });
    cluster.bare_broker_no_consumer = Some(BareBrokerLimit {
        window: 1024,
        messages: 200_000,
        consumer: false,
        confirmed_per_sec: 10_000.0,
        received_per_sec: None,
        cpu: None,
    });
    // An older run: the relay connected to any node, so the ratio measured placement.
    assert!(results(&cluster).targets().is_empty());
    cluster.no_consumer_node = Some(0);
    let targets = results(&cluster).targets();
    assert_eq!(
        targets,
        vec![(
            true,
            "3-node cluster, no consumer, both through the leader's node 0: drain ≥ 90 % of \
                 the minimal publisher: 9,300 of 10,000 = 93 %"
                .to_string()
        )]
    );
    assert!(results(&cluster)
        .markdown()
        .contains("- met: 3-node cluster, no consumer"));
    // With pairs, the median of their ratios: 0.93, 0.80 and 0.85.
    let pair = |round: u32, drain: f64| PublisherPair {
        round,
        relay_first: round % 2 == 1,
        drain: Drain {
            msgs_per_sec: drain,
            ..Drain::default()
        },
        broker: cluster.bare_broker_no_consumer.clone().expect("set above"),
    };
    cluster.no_consumer_pairs = vec![pair(1, 9_300.0), pair(2, 8_000.0), pair(3, 8_500.0)];
    let targets = results(&cluster).targets();
    assert_eq!(targets.len(), 1);
    assert!(!targets[0].0, "{targets:?}");
    assert!(
        targets[0]
            .1
            .ends_with("median of 3 pairs (93 %, 80 %, 85 %): 85 %"),
        "{targets:?}"
    );
    let text = results(&cluster).markdown();
    assert!(
        text.contains("1, relay first: 9,300 of 10,000 = 93 %; 2, publisher first: 8,000 of"),
        "{text}"
    );
    // Pairs through a follower are reported beside them, and are no target.
    cluster.follower_node = Some(1);
    cluster.follower_pairs = vec![pair(1, 7_000.0), pair(2, 6_000.0)];
    assert_eq!(results(&cluster).targets(), targets);
    let text = results(&cluster).markdown();
    assert!(
        text.contains(
            "through the follower node 1, which forwards every publish to the leader \
                 (msgs/s): 1, relay first: 7,000 of 10,000 = 70 %; 2, publisher first: 6,000 of \
                 10,000 = 60 %; median 70 %."
        ),
        "{text}"
    );
}

fn cluster_sample() -> ClusterResults {
    ClusterResults {
        nodes: 3,
        queue_type: "quorum".into(),
        declared_through: 0,
        leader_node: 0,
        window: 1024,
        drain: Drain {
            rows: 200_000,
            received: 200_000,
            msgs_per_sec: 3_000.0,
            complete: true,
            ..Drain::default()
        },
        drain_relay_nodes: vec![2],
        broker: BrokerLimit {
            window: 1024,
            messages: 200_000,
            confirmed_per_sec: 4_100.0,
            received_per_sec: 4_000.0,
        },
        broker_publisher_node: 2,
        latency: LatencyRun {
            rate: 100,
            rows: 3000,
            missing: 0,
            latency: Some(LatencyMs {
                samples: 3000,
                avg: 5.0,
                p50: 4.0,
                p99: 12.0,
                max: 20.0,
                percentiles: Vec::new(),
            }),
        },
        latency_relay_nodes: vec![1, 2],
        broker_latency: Some(LatencyMs {
            samples: 3000,
            avg: 3.0,
            p50: 2.0,
            p99: 8.0,
            max: 10.0,
            percentiles: Vec::new(),
        }),
        broker_latency_publisher_node: 1,
        broker_latency_rate: 100,
        startup_secs: 20.0,
        seconds: 200.0,
        ..ClusterResults::default()
    }
}

#[test]
fn the_cluster_table_sets_each_figure_beside_the_broker_alone() {
    let mut results = sample();
    results.cluster = Some(cluster_sample());
    let text = results.markdown();
    let row = text
        .lines()
        .find(|l| l.starts_with("| 3-node cluster, quorum queue |"))
        .expect("cluster row");
    assert_eq!(
        row,
        "| 3-node cluster, quorum queue | 3,000 | 4,000 | 75 % | 4.00 ms | 2.00 ms | 2.00× \
             | 12 ms | 8.00 ms | 1.50× |"
    );
    // The single-node WAL reader of the same run, against its own broker alone.
    let single = text
        .lines()
        .find(|l| l.starts_with("| 1 node, classic queue (same run) |"))
        .expect("single-node row");
    assert!(
        single.contains("| 20,000 | 20,500 | 98 % | 1.00 ms | 0.80 ms | 1.25× |"),
        "{single}"
    );
    assert!(
        text.contains("connected to node 2 for the drain and nodes 1, 2 (in turn)"),
        "{text}"
    );
}

#[test]
fn cluster_only_reports_only_the_cluster() {
    let results = Results {
        cluster: Some(cluster_sample()),
        ..Results::default()
    };
    let text = results.markdown();
    assert!(text.contains("### 3-node cluster, quorum queue"), "{text}");
    assert!(!text.contains("Reference table"), "{text}");
    assert!(!text.contains("classic queue"), "{text}");
    let json = serde_json::to_value(&results).expect("serialises");
    assert_eq!(json["cluster"]["broker"]["received_per_sec"], 4_000.0);
    assert_eq!(json["cluster"]["drain_relay_nodes"][0], 2);
}

fn drain_of(received: u64, msgs_per_sec: f64, cpu: f64, pg: f64) -> Drain {
    Drain {
        rows: received,
        transaction_rows: 1,
        received,
        seconds: received as f64 / msgs_per_sec,
        msgs_per_sec,
        complete: true,
        cpu_seconds: cpu,
        cpu_seconds_per_100k: cpu * 100_000.0 / received as f64,
        peak_rss_mib: 20.0,
        pg_cpu_seconds: Some(pg),
        cpu: None,
        payload_bytes: None,
    }
}

#[test]
fn the_shards_sweep_sets_each_count_beside_the_broker_alone() {
    let run = |round, shards, mps, pg| ShardRun {
        round,
        shards,
        load: "4.00 4.50 5.00".into(),
        drain: drain_of(10_000, mps, 0.4, pg),
    };
    let broker = |received_per_sec| BrokerLimit {
        window: 1024,
        messages: 10_000,
        confirmed_per_sec: received_per_sec,
        received_per_sec,
    };
    let results = Results {
        scale: Scale {
            max_in_flight: 1024,
            ..Scale::default()
        },
        shards: vec![
            run(1, 1, 8_000.0, 0.05),
            run(1, 4, 7_000.0, 0.15),
            run(2, 4, 9_000.0, 0.16),
            run(2, 1, 6_000.0, 0.06),
            run(3, 1, 7_000.0, 0.07),
            run(3, 4, 8_000.0, 0.14),
        ],
        shards_broker: vec![broker(10_000.0), broker(9_000.0), broker(11_000.0)],
        ..Results::default()
    };
    let text = results.markdown();
    assert!(text.contains("### Sharded relays"), "{text}");
    assert!(!text.contains("Reference table"), "{text}");
    assert!(
        text.contains("10,000 · 9,000 · 11,000; median 10,000"),
        "{text}"
    );
    // Medians: 1 shard 7,000 msgs/s (70 %), 40 µs relay, 6 µs PostgreSQL; 4 shards 8,000,
    // 15 µs PostgreSQL.
    assert!(text.contains("| 1 | 7,000 | 70 % | 40.0 | 6.0 |"), "{text}");
    assert!(
        text.contains("| 4 | 8,000 | 80 % | 40.0 | 15.0 |"),
        "{text}"
    );
    let json = serde_json::to_value(&results).expect("serialises");
    assert_eq!(json["shards"][1]["shards"], 4);
}

#[test]
fn the_emit_tables_give_medians_per_clients_and_variant() {
    let writer = |round, clients, variant: &str, events_per_sec, wal| EmitWriterRun {
        round,
        variant: variant.into(),
        clients,
        load: "1.00 1.00 1.00".into(),
        events: 1_000,
        seconds: 1.0,
        events_per_sec,
        wal_bytes_per_event: wal,
    };
    let drain = |round, variant: &str, mps| EmitDrainRun {
        round,
        variant: variant.into(),
        load: "1.00 1.00 1.00".into(),
        drain: drain_of(10_000, mps, 0.3, 0.1),
    };
    let results = Results {
        emit_writers: vec![
            writer(1, 10, "table insert", 5_000.0, 495.0),
            writer(1, 10, "outbox_emit", 6_000.0, 489.0),
            writer(2, 10, "outbox_emit", 4_000.0, 489.0),
            writer(2, 10, "table insert", 3_000.0, 497.0),
            writer(3, 10, "table insert", 4_000.0, 496.0),
            writer(3, 10, "outbox_emit", 5_000.0, 490.0),
        ],
        emit_drains: vec![
            drain(1, "table insert", 6_000.0),
            drain(1, "outbox_emit", 7_000.0),
        ],
        ..Results::default()
    };
    let text = results.markdown();
    assert!(
        text.contains("### Writers: table insert against outbox_emit"),
        "{text}"
    );
    assert!(
        text.contains("| 10 | outbox_emit | 5,000 | 489 |"),
        "{text}"
    );
    assert!(
        text.contains("| 10 | table insert | 4,000 | 496 |"),
        "{text}"
    );
    assert!(
        text.contains("| outbox_emit | 7,000 | 30.0 | 10.0 |"),
        "{text}"
    );
    assert!(!text.contains("Reference table"), "{text}");
}

#[test]
fn the_cpu_split_has_a_row_per_drain_and_limit() {
    let text = sample().markdown();
    assert!(text.contains("### CPU split, µs per message"), "{text}");
    assert!(
        text.contains(
            "| WAL reader: drain, single-row txns | 200,000 | 20.0 | 12.5 | 40.0 | — | 72.5 |"
        ),
        "{text}"
    );
    assert!(
            text.contains(
                "| Broker alone, minimal publisher, window 1,024, consumer attached | 1,000 | — | — | 30.0 | 8.0 | 38.0 |"
            ),
            "{text}"
        );
    // A run that measured no split has no table.
    assert!(!Results::default().markdown().contains("CPU split"));
}

#[test]
fn json_has_the_same_figures() {
    let json = serde_json::to_value(sample()).expect("serialises");
    assert_eq!(json["modes"][2]["mode"], "WAL reader");
    assert_eq!(json["modes"][2]["drain"]["msgs_per_sec"], 20_000.0);
    assert_eq!(json["limits"]["broker"][0]["window"], 1024);
    assert_eq!(json["limits"]["bare_broker"]["received_per_sec"], 24_000.0);
    assert_eq!(json["limits"]["bare_broker"]["cpu"]["rabbitmq_us"], 30.0);
    assert_eq!(json["limits"]["bare_broker_no_consumer"]["consumer"], false);
    assert_eq!(json["limits"]["walsender"]["rows_per_sec"], 21_000.0);
    assert_eq!(json["modes"][2]["drain"]["cpu"]["walsender_us"], 12.5);
}
