//! RabbitMQ Streams: what the stream destination (`run --stream`) builds on, and the relay
//! delivering into a stream (docs/architecture.md, "Streams"). A named producer's publishing
//! ids are deduplicated by
//! the broker: it keeps the highest id stored for that name and drops a publish whose id is
//! not above it. That turns a relay's re-publish after a crash into nothing, and an id that
//! goes backwards into a silent loss. These tests pin both down on the kit's broker (4.0),
//! each read back from offset 0 with a client of its own. They need 3.11 or later: 3.10
//! closes the `rabbitmq-stream-client` 0.11 connection at its command-versions exchange.

use outbox_testkit as common;

use std::collections::HashMap;
use std::time::Duration;

use common::failover::{
    create_standby_oracle, outbox_ids, seed_backlog, FailoverPair, PairOptions,
};
use common::faults::MARKER_PREFIX;
use common::RabbitServer;
use futures_util::StreamExt;
use outbox_relay::metrics::{MESSAGES_PUBLISHED_TOTAL, STANDBY, STREAM_SKIPPED_TOTAL};
use rabbitmq_stream_client::types::{Message, OffsetSpecification};
use rabbitmq_stream_client::{Client, ClientOptions, Environment, NoDedup, Producer};

const MINUTE: Duration = Duration::from_secs(60);

async fn environment(broker: &RabbitServer) -> Environment {
    environment_at("127.0.0.1", broker.stream_port()).await
}

/// A client of the stream port `port` at `host`.
pub(crate) async fn environment_at(host: &str, port: u16) -> Environment {
    Environment::builder()
        .host(host)
        .port(port)
        .build()
        .await
        .expect("connect to the stream port")
}

/// Publishes `bodies` under `ids` through `producer` (named: deduplicated), each awaited until
/// the broker answers; whether it confirmed each.
async fn publish(
    producer: &mut Producer<rabbitmq_stream_client::Dedup>,
    sent: &[(u64, &str)],
) -> Vec<bool> {
    let mut confirmed = Vec::new();
    for &(id, body) in sent {
        let message = Message::builder()
            .body(body.as_bytes().to_vec())
            .publishing_id(id)
            .build();
        let status = producer
            .send_with_confirm(message)
            .await
            .unwrap_or_else(|e| panic!("publish id {id}: {e:?}"));
        confirmed.push(status.confirmed());
    }
    confirmed
}

/// Every body in `stream` from offset 0, up to a marker an unnamed producer appends now: the
/// stream's whole content, read by a consumer of its own.
async fn read_all(environment: &Environment, stream: &str) -> Vec<String> {
    read_messages(environment, stream)
        .await
        .into_iter()
        .map(|(_, body)| body)
        .collect()
}

/// Every message in `stream` from offset 0 as (message_id if it has one, body), up to a marker an unnamed
/// producer appends now; markers appended by earlier reads are left out.
pub(crate) async fn read_messages(
    environment: &Environment,
    stream: &str,
) -> Vec<(Option<String>, String)> {
    static READS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let read = READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let marker = format!("{MARKER_PREFIX}{read}");
    let marker_producer: Producer<NoDedup> = environment
        .producer()
        .build(stream)
        .await
        .expect("the marker's producer");
    let status = marker_producer
        .send_with_confirm(Message::builder().body(marker.as_bytes().to_vec()).build())
        .await
        .expect("publish the marker");
    assert!(
        status.confirmed(),
        "the marker was not confirmed: {status:?}"
    );
    let _ = marker_producer.close().await;
    let mut consumer = environment
        .consumer()
        .offset(OffsetSpecification::First)
        .build(stream)
        .await
        .expect("a consumer from offset 0");
    let mut messages = Vec::new();
    loop {
        let delivery = tokio::time::timeout(MINUTE, consumer.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no marker in {stream} within a minute: read {}",
                    messages.len()
                )
            })
            .unwrap_or_else(|| {
                panic!(
                    "{stream}'s consumer ended before the marker: {}",
                    messages.len()
                )
            })
            .expect("a delivery");
        let message = delivery.message();
        let body = String::from_utf8_lossy(message.data().unwrap_or_default()).into_owned();
        if body == marker {
            let _ = consumer.handle().close().await;
            return messages;
        }
        if body.starts_with(MARKER_PREFIX) {
            continue;
        }
        let id = message
            .properties()
            .and_then(|p| p.message_id.clone())
            .and_then(|id| String::try_from(id).ok());
        messages.push((id, body));
    }
}

/// The message_id of every message in `stream` from offset 0 ([`read_messages`]); every
/// message of the relay's has one.
async fn stream_ids(environment: &Environment, stream: &str) -> Vec<String> {
    read_messages(environment, stream)
        .await
        .into_iter()
        .map(|(id, body)| id.unwrap_or_else(|| panic!("a message without a message_id: {body}")))
        .collect()
}

/// The ids of the outbox rows the `test_decoding` slot `oracle` saw, in commit order.
async fn committed_ids(client: &tokio_postgres::Client, oracle: &str) -> Vec<String> {
    common::read_test_decoding(client, oracle)
        .await
        .iter()
        .flat_map(|txn| txn.inserted_ids("public.outbox"))
        .collect()
}

/// Each outbox row's aggregate_id, by the row's id.
async fn aggregates_of(client: &tokio_postgres::Client) -> HashMap<String, String> {
    common::pg::first_column(
        client,
        "SELECT id::text || ' ' || aggregate_id FROM outbox",
        &[],
    )
    .await
    .into_iter()
    .filter_map(|line| {
        let (id, aggregate) = line.split_once(' ')?;
        Some((id.to_string(), aggregate.to_string()))
    })
    .collect()
}

/// A broker of the test's own with the stream plugin, an outbox (`prefix`) relaying to it,
/// a client of its stream port, and `stream` created there.
async fn outbox_and_stream(
    prefix: &str,
    stream: &str,
) -> (RabbitServer, common::outbox::Outbox, Environment) {
    let broker = tokio::task::block_in_place(RabbitServer::start_with_streams);
    let pg = &common::services().pg;
    let outbox = common::outbox::Outbox::on(&pg.url("postgres"), &broker.url(), prefix).await;
    let environment = environment(&broker).await;
    environment
        .stream_creator()
        .create(stream)
        .await
        .expect("create the stream");
    (broker, outbox, environment)
}

/// The id the broker holds for producer `name` on `stream`.
async fn last_id(broker: &RabbitServer, name: &str, stream: &str) -> u64 {
    let options = ClientOptions::builder()
        .host("127.0.0.1")
        .port(broker.stream_port())
        .build();
    let client = Client::connect(options).await.expect("a stream client");
    let id = client
        .query_publisher_sequence(name, stream)
        .await
        .expect("query the publisher sequence");
    let _ = client.close().await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_producer_s_repeats_are_dropped_and_confirmed_and_an_id_going_back_is_lost() {
    let broker = tokio::task::block_in_place(RabbitServer::start_with_streams);
    let environment = environment(&broker).await;
    let stream = "premises";
    environment
        .stream_creator()
        .create(stream)
        .await
        .expect("create the stream");
    let name = "relay-a";
    let mut producer = environment
        .producer()
        .name(name)
        .build(stream)
        .await
        .expect("a named producer");
    let first = publish(&mut producer, &[(1, "r1"), (2, "r2"), (3, "r3")]).await;
    assert_eq!(first, [true; 3], "the first publishes confirmed");
    // A relay's re-publish after a crash: what the stream holds again, then what follows.
    let again = publish(&mut producer, &[(2, "r2"), (3, "r3"), (4, "r4")]).await;
    // An id below the producer's last: a recreated slot's backfill, or positions from a
    // promoted standby's timeline below those published from the old primary.
    let backwards = publish(&mut producer, &[(2, "r2-of-another-row")]).await;
    let _ = producer.close().await;

    let held = read_all(&environment, stream).await;
    assert_eq!(
        held,
        ["r1", "r2", "r3", "r4"],
        "the stream holds each id once, in order: the repeats were dropped, and so was the row \
         under an id going back"
    );
    // The broker confirms what it drops: a confirm does not say that the stream holds it.
    assert_eq!(again, [true; 3], "the repeats and the new one confirmed");
    assert_eq!(
        backwards,
        [true],
        "the id going back confirmed, and dropped"
    );
    assert_eq!(
        last_id(&broker, name, stream).await,
        4,
        "query_publisher_sequence returns the highest id stored"
    );
    // Another name is another sequence: nothing of relay-a's holds it back.
    assert_eq!(
        last_id(&broker, "relay-b", stream).await,
        0,
        "an unknown name"
    );
}

/// What interrupts the relay into a stream halfway through a backlog.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Interruption {
    /// kill -9 of the relay with a full window in flight, then a new relay.
    RelayKilled,
    /// SIGTERM, then a new relay.
    RelayStopped,
    /// kill -9 of the relay while a standby waits for its slot, which takes over.
    StandbyTookOver,
    /// kill -9 of the broker and its restart, under the same relay.
    BrokerRestarted,
    /// kill -9 of the node that leads the stream, in a 3-node cluster that replicates it on
    /// every node; the first node the relay is given.
    LeaderKilled,
}

/// The broker a scenario runs on: a node of its own, or for [`Interruption::LeaderKilled`] a
/// cluster of its own, whose node 0 leads the stream; the relay is given nodes 0 and 1, in
/// that order, and the reader reads through node 1.
enum Brokers {
    Node(RabbitServer),
    Cluster(common::RabbitCluster),
}

impl Brokers {
    fn start(interruption: Interruption) -> Brokers {
        tokio::task::block_in_place(|| match interruption {
            Interruption::LeaderKilled => {
                Brokers::Cluster(common::RabbitCluster::start_with_streams())
            }
            _ => Brokers::Node(RabbitServer::start_with_streams()),
        })
    }

    fn url(&self) -> String {
        match self {
            Brokers::Node(node) => node.url(),
            Brokers::Cluster(cluster) => cluster.url(1),
        }
    }

    /// What the relay is given: the node, or nodes 0 and 1 of the cluster, tried in that
    /// order (`--amqp-node-order listed`).
    fn relay_urls(&self) -> String {
        match self {
            Brokers::Node(node) => node.url(),
            Brokers::Cluster(cluster) => format!("{},{}", cluster.url(0), cluster.url(1)),
        }
    }

    /// The reader's stream listener: the node's, or the cluster's node 1.
    fn stream_host(&self) -> String {
        match self {
            Brokers::Node(_) => "127.0.0.1".to_string(),
            Brokers::Cluster(cluster) => cluster.addr(1).to_string(),
        }
    }

    /// The stream port (the same on every node of the cluster).
    fn stream_port(&self) -> u16 {
        match self {
            Brokers::Node(node) => node.stream_port(),
            Brokers::Cluster(cluster) => cluster.stream_port(1),
        }
    }

    async fn environment(&self) -> Environment {
        environment_at(&self.stream_host(), self.stream_port()).await
    }

    /// Creates `stream`: in the cluster through node 0 with the leader placed there, and
    /// checked to be there, with a replica on each other node.
    async fn create_stream(&self, stream: &str) {
        let Brokers::Cluster(cluster) = self else {
            return self
                .environment()
                .await
                .stream_creator()
                .create(stream)
                .await
                .expect("create the stream");
        };
        let leader = cluster.addr(0).to_string();
        environment_at(&leader, self.stream_port())
            .await
            .stream_creator()
            .leader_locator(rabbitmq_stream_client::types::LeaderLocator::ClientLocal)
            .create(stream)
            .await
            .expect("create the stream");
        // The broker starts the replicas after it answers the create: the metadata lists
        // them once they run (CI: none listed right after the create, once).
        let options = ClientOptions::builder()
            .host(&self.stream_host())
            .port(self.stream_port())
            .build();
        let client = Client::connect(options).await.expect("a stream client");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let placed = loop {
            let mut metadata = client
                .metadata(vec![stream.to_string()])
                .await
                .expect("the stream's metadata");
            let placed = metadata.remove(stream).expect("the stream in its metadata");
            if placed.replicas.len() == 2 || tokio::time::Instant::now() >= deadline {
                break placed;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let _ = client.close().await;
        assert_eq!(
            (placed.leader.host.as_str(), placed.replicas.len()),
            (leader.as_str(), 2),
            "the stream led by node 0 and replicated on the two others: {placed:?}"
        );
    }
}

/// The relay delivers a 100,000-row backlog into a stream with a window of 1,024 and is
/// interrupted a tenth of the way: the stream then holds every committed row exactly
/// once, in commit order (a `test_decoding` slot's), read from offset 0 by a client of its
/// own. Returns how many rows the last relay read again that the stream held (and did not
/// send them).
async fn delivered_once_in_order_after(interruption: Interruption) -> usize {
    delivered_once_in_order_into(interruption, None).await
}

/// [`delivered_once_in_order_after`] into a stream (`partitions` `None`), or into a super
/// stream of that many partitions, the rows of 500 aggregates: then each partition holds its
/// rows in commit order, each aggregate's rows in one partition, every row once in all.
async fn delivered_once_in_order_into(
    interruption: Interruption,
    partitions: Option<usize>,
) -> usize {
    // Enough that the relay, at about 30,000 rows/s, is still in the backlog when the test
    // sees a tenth of it published.
    const ROWS: usize = 100_000;
    const WINDOW: &str = "1024";
    let broker = Brokers::start(interruption);
    let pg = &common::services().pg;
    let into = partitions.map_or("", |_| "_super");
    let prefix = format!("stream_{interruption:?}{into}").to_lowercase();
    let outbox = common::outbox::Outbox::on(&pg.url("postgres"), &broker.url(), &prefix).await;
    let stream = "outbox-stream";
    let environment = broker.environment().await;
    let streams: Vec<String> = match partitions {
        None => {
            broker.create_stream(stream).await;
            vec![stream.to_string()]
        }
        Some(partitions) => {
            environment
                .stream_creator()
                .create_super_stream(stream, partitions, None)
                .await
                .expect("create the super stream");
            // Named by their binding keys, 0 to partitions - 1.
            (0..partitions).map(|i| format!("{stream}-{i}")).collect()
        }
    };
    let oracle = format!("{prefix}_oracle");
    common::create_test_decoding_slot(&outbox.client, &oracle).await;
    match partitions {
        None => {
            common::outbox::write_concurrently(&outbox.db_url, 4, ROWS, 20).await;
        }
        Some(_) => write_aggregates(&outbox.client, ROWS, 500).await,
    }
    let end = common::current_wal_lsn(&outbox.client).await;
    let port = broker.stream_port().to_string();
    let flags = [
        partitions.map_or("--stream", |_| "--super-stream"),
        stream,
        "--stream-port",
        &port,
        "--max-in-flight",
        WINDOW,
    ];
    let published = |relay: &common::RelayProcess| counter(relay, MESSAGES_PUBLISHED_TOTAL);
    let relay_urls = broker.relay_urls();
    let spawn = || {
        let metrics_addr = format!("127.0.0.1:{}", common::free_port());
        let mut args = vec![
            "--metrics-addr",
            metrics_addr.as_str(),
            "--amqp-node-order",
            "listed",
        ];
        args.extend(flags);
        outbox.spawn("run", (&outbox.db_url, &relay_urls), &args, &[])
    };

    let first = spawn();
    // Published, not acknowledged: the slot's position lags by a status interval, and the
    // relay drains the backlog in seconds.
    assert!(
        first
            .wait_metric(
                outbox_relay::metrics::MESSAGES_PUBLISHED_TOTAL,
                MINUTE * 2,
                |published| published >= ROWS / 10
            )
            .await,
        "a tenth of the rows published; log:\n{}",
        first.log()
    );
    let (relay, published_before, acknowledged_then) = match interruption {
        Interruption::RelayKilled | Interruption::RelayStopped | Interruption::StandbyTookOver => {
            let standby = match interruption {
                Interruption::StandbyTookOver => {
                    let standby = spawn();
                    assert!(
                        standby.wait_metric(STANDBY, MINUTE, |n| n == 1).await,
                        "the second relay waits as a standby; log:\n{}",
                        standby.log()
                    );
                    Some(standby)
                }
                _ => None,
            };
            let published_before = published(&first);
            if interruption == Interruption::RelayStopped {
                first.sigterm();
            } else {
                first.kill9();
            }
            assert!(
                first.wait_exit(MINUTE).await.is_some(),
                "the relay is gone; log:\n{}",
                first.log()
            );
            let acknowledged_then = outbox.confirmed_flush().await;
            let relay = standby.unwrap_or_else(spawn);
            (relay, published_before, acknowledged_then)
        }
        Interruption::BrokerRestarted | Interruption::LeaderKilled => {
            let sessions = first.sessions();
            // The node's kill takes seconds (its metadata is synced first), in which the relay
            // drains the rest of the backlog on a fast machine (CI, once): the relay waits
            // frozen, its window in flight, until the node is gone.
            first.pause();
            tokio::task::block_in_place(|| match &broker {
                Brokers::Node(node) => node.kill9(),
                Brokers::Cluster(cluster) => cluster.kill9(0),
            });
            first.resume();
            let acknowledged_then = outbox.confirmed_flush().await;
            if let Brokers::Node(node) = &broker {
                tokio::task::block_in_place(|| node.restart());
            }
            assert!(
                first.wait_new_session(sessions, MINUTE * 2).await.is_some(),
                "a new session after the {interruption:?}; log:\n{}",
                first.log()
            );
            (first, 0, acknowledged_then)
        }
    };
    // The premise: the interruption left rows to deliver.
    assert!(
        acknowledged_then < end,
        "the {interruption:?} did not land mid-backlog: the slot was at {acknowledged_then:X} of \
         {end:X}"
    );
    assert!(
        outbox.wait_confirmed_flush(end, MINUTE * 3).await,
        "every row acknowledged after the {interruption:?}; log:\n{}",
        relay.log()
    );
    let published_in_all = published_before + published(&relay);
    let skipped = counter(&relay, STREAM_SKIPPED_TOTAL);
    relay.stop().await;

    let committed = committed_ids(&outbox.client, &oracle).await;
    assert_eq!(committed.len(), ROWS, "the oracle saw every row");
    let mut held = Vec::new();
    for stream in &streams {
        let ids = stream_ids(&environment, stream).await;
        held.push(ids);
    }
    let in_all: usize = held.iter().map(Vec::len).sum();
    println!(
        "stream after {interruption:?}{into}: at least {published_in_all} handed on for {ROWS} \
         rows (the first relay's count is read before the interruption), {skipped} of them \
         read again and not sent (the stream held them), {in_all} in the stream ({:?} a \
         partition)",
        held.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert_eq!(
        in_all.saturating_sub(committed.len()),
        0,
        "no row twice in the stream"
    );
    let Some(_) = partitions else {
        assert!(
            held[0] == committed,
            "the stream holds the committed rows in commit order: first difference at {:?}",
            held[0].iter().zip(&committed).position(|(a, b)| a != b)
        );
        return skipped;
    };
    let mut every: Vec<&String> = held.iter().flatten().collect();
    every.sort();
    let mut want: Vec<&String> = committed.iter().collect();
    want.sort();
    assert!(
        every == want,
        "the partitions together hold every committed row once"
    );
    let place: HashMap<&String, usize> = committed
        .iter()
        .enumerate()
        .map(|(i, id)| (id, i))
        .collect();
    let aggregates = aggregates_of(&outbox.client).await;
    let mut partition_of_aggregate: HashMap<&String, usize> = HashMap::new();
    for (partition, ids) in held.iter().enumerate() {
        assert!(!ids.is_empty(), "partition {partition} got rows");
        assert!(
            ids.windows(2).all(|pair| place[&pair[0]] < place[&pair[1]]),
            "partition {partition} holds its rows in commit order"
        );
        for id in ids {
            let aggregate = &aggregates[id];
            let first = *partition_of_aggregate.entry(aggregate).or_insert(partition);
            assert_eq!(
                first, partition,
                "aggregate {aggregate}'s rows in partitions {first} and {partition}"
            );
        }
    }
    skipped
}

/// `rows` rows in transactions of up to 20, on one connection, each of one of `aggregates`
/// aggregates (`agg-N`), spread over them.
async fn write_aggregates(client: &tokio_postgres::Client, rows: usize, aggregates: usize) {
    let mut script = String::new();
    let mut written = 0;
    while written < rows {
        let n = 20.min(rows - written);
        script += &format!(
            "BEGIN; INSERT INTO outbox (event_type, payload, aggregate_type, aggregate_id) \
             SELECT 'TestEvent', jsonb_build_object('g', g), 'order', \
             'agg-' || ((g * 7919) % {aggregates}) \
             FROM generate_series({written}, {written} + {n} - 1) AS g; COMMIT;"
        );
        written += n;
    }
    client
        .batch_execute(&script)
        .await
        .expect("write the aggregates' rows");
}

/// A counter of `relay`'s /metrics.
fn counter(relay: &common::RelayProcess, name: &str) -> usize {
    relay
        .counter(name)
        .unwrap_or_else(|| panic!("{name} in the relay's /metrics; log:\n{}", relay.log()))
}

/// kill -9 with a full window in flight: the restart reads again what the slot had not
/// acknowledged, and sends none of what the stream holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_killed_at_full_speed_leaves_every_row_in_the_stream_once_in_commit_order() {
    let skipped = delivered_once_in_order_after(Interruption::RelayKilled).await;
    assert!(
        skipped > 0,
        "the restart read no row the stream held: the test proves no deduplication"
    );
}

/// A standby relay takes the slot over from one killed at full speed: the same producer
/// name, so it sends none of what the stream holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_taking_over_at_full_speed_leaves_every_row_in_the_stream_once_in_commit_order() {
    let skipped = delivered_once_in_order_after(Interruption::StandbyTookOver).await;
    assert!(
        skipped > 0,
        "the standby read no row the stream held: the test proves no deduplication"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_stopped_mid_backlog_leaves_every_row_in_the_stream_once_in_commit_order() {
    delivered_once_in_order_after(Interruption::RelayStopped).await;
}

/// kill -9 at full speed into a super stream of 3 partitions: each partition deduplicated on
/// its own, each aggregate's rows in one partition, in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_killed_at_full_speed_leaves_every_row_in_a_super_stream_once_in_order_per_partition(
) {
    let skipped = delivered_once_in_order_into(Interruption::RelayKilled, Some(3)).await;
    assert!(
        skipped > 0,
        "the restart read no row the partitions held: the test proves no deduplication"
    );
}

/// Two sharded relays (`setup --shards 2`, `run --shards 2 --shard K`) into one stream, one
/// killed with a full window in flight and started again: each shard's slot names its
/// producer, so each shard is deduplicated on its own. The stream holds every row once, each
/// aggregate's rows in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_into_one_stream_one_killed_leave_every_row_once_each_aggregate_in_order() {
    const ROWS: usize = 60_000;
    let broker = tokio::task::block_in_place(RabbitServer::start_with_streams);
    let pg = &common::services().pg;
    let outbox = common::outbox::Outbox::provision(
        &pg.url("postgres"),
        &broker.url(),
        "stream_shards",
        &["setup", "--shards", "2"],
        lapin::types::FieldTable::default(),
    )
    .await;
    let environment = environment(&broker).await;
    let stream = "shards";
    environment
        .stream_creator()
        .create(stream)
        .await
        .expect("create the stream");
    let oracle = "stream_shards_oracle";
    common::create_test_decoding_slot(&outbox.client, oracle).await;
    write_aggregates(&outbox.client, ROWS, 200).await;
    let end = common::current_wal_lsn(&outbox.client).await;
    let port = broker.stream_port().to_string();
    let spawn = |shard: &str| {
        outbox.spawn_relay(&[
            "--stream",
            stream,
            "--stream-port",
            &port,
            "--shards",
            "2",
            "--shard",
            shard,
        ])
    };
    let other = spawn("1");
    let first = spawn("0");
    assert!(
        first
            .wait_metric(MESSAGES_PUBLISHED_TOTAL, MINUTE * 2, |n| n >= ROWS / 10)
            .await,
        "shard 0's relay published a fifth of its rows; log:\n{}",
        first.log()
    );
    first.kill9();
    assert!(
        first.wait_exit(MINUTE).await.is_some(),
        "shard 0's relay is gone"
    );
    let again = spawn("0");
    for (shard, relay) in [(0, &again), (1, &other)] {
        let slot = format!("{}_{shard}", outbox.slot);
        if let Err(reached) =
            common::outbox::wait_slot_confirmed_flush(&outbox.client, &slot, end, MINUTE * 3).await
        {
            panic!(
                "shard {shard}'s slot reached {}; log:\n{}",
                common::format_lsn(reached),
                relay.log()
            );
        }
    }
    let skipped = counter(&again, STREAM_SKIPPED_TOTAL);
    again.stop().await;
    other.stop().await;

    let committed = committed_ids(&outbox.client, oracle).await;
    assert_eq!(committed.len(), ROWS, "the oracle saw every row");
    let held = stream_ids(&environment, stream).await;
    println!(
        "two shards into one stream, shard 0's relay killed: {} in the stream for {ROWS} rows, \
         {skipped} read again by its restart and not sent",
        held.len()
    );
    assert_eq!(held.len(), committed.len(), "every row once in the stream");
    let mut every = held.clone();
    every.sort();
    let mut want = committed.clone();
    want.sort();
    assert!(every == want, "the stream holds the committed rows");
    let aggregates = aggregates_of(&outbox.client).await;
    let by_aggregate = |ids: &[String]| {
        let mut of: HashMap<String, Vec<String>> = HashMap::new();
        for id in ids {
            of.entry(aggregates[id].clone())
                .or_default()
                .push(id.clone());
        }
        of
    };
    assert!(
        by_aggregate(&held) == by_aggregate(&committed),
        "each aggregate's rows in commit order"
    );
    assert!(
        skipped > 0,
        "the restart read no row the stream held: the test proves no deduplication"
    );
}

/// The stream's leader killed under the relay: the producer's connection (to the leader) is
/// gone, and the next session finds the new leader through another node and resumes from
/// the slot, skipping what the replicated stream holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_leader_killed_mid_backlog_leaves_every_row_once_in_commit_order() {
    delivered_once_in_order_after(Interruption::LeaderKilled).await;
}

/// The broker killed and restarted under the relay: the session fails (its confirms are
/// gone with the connection), the next one re-publishes from the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_under_the_relay_leaves_every_row_in_the_stream_once_in_commit_order() {
    delivered_once_in_order_after(Interruption::BrokerRestarted).await;
}

/// A PostgreSQL failover under the relay (PostgreSQL 18: the slot synced to a streaming
/// standby, `synchronized_standby_slots` on the primary, the relay on a multi-host URL). The
/// primary is killed with a backlog draining at full speed into the stream, the standby
/// promoted, and rows committed on the new primary. The relay resumes from the standby's
/// copy of the slot, behind what the old timeline's producer stored: it reads those rows
/// again on the new timeline, and sends none of them (the old name holds them), while every
/// row committed after the switch point goes in under the new timeline's name. The stream
/// then holds every row of the new primary once, in its commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_failover_mid_backlog_leaves_every_row_in_the_stream_once_in_commit_order() {
    const BACKLOG: usize = 40_000;
    const ROWS_AFTER: usize = 1_000;
    let broker = tokio::task::block_in_place(RabbitServer::start_with_streams);
    let pair = tokio::task::block_in_place(|| FailoverPair::start(18, PairOptions::default(), &[]));
    let outbox = pair.outbox(&broker.url(), "stream_failover").await;
    let db = outbox.database().to_string();
    let oracle = format!("{}_oracle", outbox.slot);
    create_standby_oracle(&pair, &db, &oracle).await;
    let environment = environment(&broker).await;
    let stream = "failover";
    environment
        .stream_creator()
        .create(stream)
        .await
        .expect("create the stream");
    let port = broker.stream_port().to_string();
    let metrics_addr = format!("127.0.0.1:{}", common::free_port());
    let relay = outbox.spawn_relay_via(
        &pair.multi_host_url(&db),
        &broker.url(),
        &[
            "--stream",
            stream,
            "--stream-port",
            &port,
            "--max-in-flight",
            "1024",
            "--metrics-addr",
            &metrics_addr,
        ],
    );
    if let Err(e) = pair.wait_failover_ready(&outbox.slot, MINUTE).await {
        panic!("{e}; log:\n{}", relay.log());
    }
    seed_backlog(&outbox.client, BACKLOG, 10).await;
    assert!(
        relay
            .wait_metric(MESSAGES_PUBLISHED_TOTAL, MINUTE * 2, |n| n >= BACKLOG / 4)
            .await,
        "a quarter of the backlog published; log:\n{}",
        relay.log()
    );
    let sessions = relay.sessions();
    tokio::task::block_in_place(|| pair.primary.stop_immediate());
    let copy = pair.standby_copy(&outbox.slot).await;
    let resume_at = copy
        .and_then(|copy| copy.confirmed_flush)
        .expect("the standby's copy of the slot has a position");
    let client = pair.promote(&db).await;
    assert!(
        relay.wait_new_session(sessions, MINUTE).await.is_some(),
        "a session on the promoted standby; log:\n{}",
        relay.log()
    );
    seed_backlog(&client, ROWS_AFTER, 10).await;
    let end = common::current_wal_lsn(&client).await;
    if let Err(reached) =
        common::outbox::wait_slot_confirmed_flush(&client, &outbox.slot, end, MINUTE * 3).await
    {
        panic!(
            "every row acknowledged on the new primary: the slot is at {}; log:\n{}",
            common::format_lsn(reached),
            relay.log()
        );
    }
    let skipped = counter(&relay, STREAM_SKIPPED_TOTAL);
    relay.stop().await;

    let transactions = common::read_test_decoding(&client, &oracle).await;
    let committed: Vec<String> = transactions
        .iter()
        .flat_map(|txn| txn.inserted_ids("public.outbox"))
        .collect();
    let mut surviving = outbox_ids(&client).await;
    let mut sorted = committed.clone();
    surviving.sort();
    sorted.sort();
    assert!(
        sorted == surviving,
        "the oracle and the new primary's table agree on the rows: {} and {}",
        committed.len(),
        surviving.len()
    );
    // The premise: the copy was behind what the stream held, so rows were read again.
    let read_again = transactions
        .iter()
        .filter(|txn| txn.end_lsn > resume_at)
        .count();
    assert!(read_again > 0, "nothing committed past the copy's position");
    let held = stream_ids(&environment, stream).await;
    println!(
        "stream after a PostgreSQL failover: {} rows on the new primary, {skipped} read again \
         on the new timeline and not sent (the old timeline's producer held them), {} in the \
         stream",
        committed.len(),
        held.len()
    );
    assert_eq!(
        held.len().saturating_sub(committed.len()),
        0,
        "no row twice in the stream"
    );
    assert!(
        held == committed,
        "the stream holds the new primary's rows in commit order: first difference at {:?} \
         ({} held, {} committed)",
        held.iter().zip(&committed).position(|(a, b)| a != b),
        held.len(),
        committed.len()
    );
    assert!(
        skipped > 0,
        "the new timeline read no row the old one had stored: the test proves nothing about \
         the names across timelines"
    );
}

/// Rows of 100 KiB, 200 of them in one transaction, with a full window: the stream client
/// packs up to 100 messages into one publish frame without looking at its size (its TODO),
/// ten times the 1 MiB `frame_max` the connection negotiated. RabbitMQ 4.0 takes such frames
/// (20 rows of 3 MiB were seen through too): every row arrives, once, in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_a_hundred_kib_with_a_full_window_arrive_once_in_commit_order() {
    const ROWS: usize = 200;
    let stream = "large";
    let (broker, outbox, environment) = outbox_and_stream("stream_large", stream).await;
    let oracle = "stream_large_oracle";
    common::create_test_decoding_slot(&outbox.client, oracle).await;
    outbox
        .client
        .batch_execute(&format!(
            "INSERT INTO outbox (event_type, payload) SELECT 'Large', \
             jsonb_build_object('pad', repeat('x', 100 * 1024), 'g', g) \
             FROM generate_series(1, {ROWS}) AS g"
        ))
        .await
        .expect("insert the large rows");
    let end = common::current_wal_lsn(&outbox.client).await;
    let port = broker.stream_port().to_string();
    let relay = outbox.spawn_relay(&["--stream", stream, "--stream-port", &port]);
    assert!(
        outbox.wait_confirmed_flush(end, MINUTE).await,
        "every large row acknowledged; log:\n{}",
        relay.log()
    );
    relay.stop().await;
    let committed = committed_ids(&outbox.client, oracle).await;
    assert_eq!(committed.len(), ROWS, "the oracle saw every row");
    let held = stream_ids(&environment, stream).await;
    assert!(
        held == committed,
        "the stream holds each large row once, in commit order: {} held, {} committed",
        held.len(),
        committed.len()
    );
}

/// A stream missing after the relay found it is waited for, not taken for a wrong name: a
/// restarted broker says a stream does not exist until it has recovered it, and a relay that
/// stopped then would stay stopped. Deleted under the relay and created again, the stream
/// gets the rows committed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_under_the_relay_is_waited_for_and_gets_the_rows_once_created_again() {
    let stream = "deleted";
    let (broker, outbox, environment) = outbox_and_stream("stream_deleted", stream).await;
    outbox.insert("Before", "{}").await;
    let end = common::current_wal_lsn(&outbox.client).await;
    let port = broker.stream_port().to_string();
    let (relay, _) = outbox.spawn_observed(&["--stream", stream, "--stream-port", &port]);
    assert!(
        outbox.wait_confirmed_flush(end, MINUTE).await,
        "the first row acknowledged; log:\n{}",
        relay.log()
    );
    environment
        .delete_stream(stream)
        .await
        .expect("delete the stream");
    let after = outbox.insert("After", "{}").await;
    let end = common::current_wal_lsn(&outbox.client).await;
    let gone = "deleted is gone, after this relay published into it";
    assert!(
        relay.wait_for_log_count(gone, 2, MINUTE).await,
        "the relay waits for the stream, session after session; log:\n{}",
        relay.log()
    );
    assert!(
        relay.try_exit().is_none(),
        "the relay runs; log:\n{}",
        relay.log()
    );
    environment
        .stream_creator()
        .create(stream)
        .await
        .expect("create the stream again");
    assert!(
        outbox.wait_confirmed_flush(end, MINUTE).await,
        "the row committed meanwhile acknowledged; log:\n{}",
        relay.log()
    );
    relay.stop().await;
    let held: Vec<Option<String>> = read_messages(&environment, stream)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(held, [Some(after)], "the new stream holds the row, once");
}

/// docs/consumers.md's stream consumer, as written there: a named consumer stores the offset
/// of what it has applied, and the next one of that name resumes after it, neither skipping
/// a row nor reading one again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_consumer_resumes_after_the_offset_it_stored() {
    const ROWS: usize = 10;
    const FIRST_RUN: usize = 4;
    let stream = "offsets";
    let (broker, outbox, environment) = outbox_and_stream("stream_offsets", stream).await;
    let mut ids = Vec::new();
    for n in 0..ROWS {
        ids.push(outbox.insert("Numbered", &format!(r#"{{"n": {n}}}"#)).await);
    }
    let end = common::current_wal_lsn(&outbox.client).await;
    let port = broker.stream_port().to_string();
    let relay = outbox.spawn_relay(&["--stream", stream, "--stream-port", &port]);
    assert!(
        outbox.wait_confirmed_flush(end, MINUTE).await,
        "the rows acknowledged; log:\n{}",
        relay.log()
    );
    relay.stop().await;

    // The consumer of docs/consumers.md, "Reading a stream", run twice.
    async fn run_consumer(environment: &Environment, stream: &str, take: usize) -> Vec<String> {
        let name = "billing";
        let probe = environment
            .consumer()
            .name(name)
            .offset(OffsetSpecification::First)
            .build(stream)
            .await
            .expect("a consumer");
        let start = match probe.query_offset().await {
            Ok(stored) => OffsetSpecification::Offset(stored + 1),
            Err(_) => OffsetSpecification::First,
        };
        let _ = probe.handle().close().await;
        let mut consumer = environment
            .consumer()
            .name(name)
            .offset(start)
            .build(stream)
            .await
            .expect("the named consumer");
        let mut applied = Vec::new();
        while applied.len() < take {
            let delivery = tokio::time::timeout(MINUTE, consumer.next())
                .await
                .expect("a message within a minute")
                .expect("the consumer runs")
                .expect("a delivery");
            let message_id = delivery
                .message()
                .properties()
                .and_then(|p| p.message_id.clone())
                .and_then(|id| String::try_from(id).ok())
                .expect("a message_id");
            applied.push(message_id);
            consumer
                .store_offset(delivery.offset())
                .await
                .expect("store the offset");
        }
        let _ = consumer.handle().close().await;
        applied
    }
    let first = run_consumer(&environment, stream, FIRST_RUN).await;
    let rest = run_consumer(&environment, stream, ROWS - FIRST_RUN).await;
    assert_eq!(first, ids[..FIRST_RUN], "the first run, from the start");
    assert_eq!(
        rest,
        ids[FIRST_RUN..],
        "the second run, after the stored offset"
    );
}

/// A broker that vanishes under an idle stream session (SIGSTOP: its sockets open and
/// silent) is given up within about `--peer-timeout`, through the stream protocol's
/// heartbeat, as on the AMQP side; once it is back, the relay delivers what was committed
/// meanwhile. At the stream client's default heartbeat (60 s) it took 4 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_vanishes_under_an_idle_stream_session_is_given_up_within_the_peer_timeout() {
    let stream = "vanishing";
    let (broker, outbox, environment) = outbox_and_stream("stream_vanishing", stream).await;
    let port = broker.stream_port().to_string();
    let relay = outbox.spawn_relay(&[
        "--stream",
        stream,
        "--stream-port",
        &port,
        "--peer-timeout",
        "5s",
        "--max-backoff",
        "1s",
    ]);
    // A row through first: the producer's connection is the one to lose.
    let before = outbox.insert("Before", "{}").await;
    let end = common::current_wal_lsn(&outbox.client).await;
    assert!(
        outbox.wait_confirmed_flush(end, MINUTE).await,
        "the first row acknowledged; log:\n{}",
        relay.log()
    );
    let failed = "session failed";
    let failures = relay.log_count(failed);
    tokio::task::block_in_place(|| broker.pause());
    let given_up = relay.wait_for_log_count(failed, failures + 1, MINUTE).await;
    tokio::task::block_in_place(|| broker.resume());
    assert!(
        given_up,
        "the session given up within a minute of the broker's silence; log:\n{}",
        relay.log()
    );
    let after = outbox.insert("After", "{}").await;
    let end = common::current_wal_lsn(&outbox.client).await;
    assert!(
        outbox.wait_confirmed_flush(end, MINUTE * 2).await,
        "the row committed after acknowledged once the broker is back; log:\n{}",
        relay.log()
    );
    relay.stop().await;
    assert_eq!(stream_ids(&environment, stream).await, [before, after]);
}

/// What the stream destination cannot work with yet is refused at start, naming it, and a
/// stream or super stream that does not exist stops the relay with the command that creates
/// it: both are the
/// configuration's to fix (exit code 3), and nothing is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_stream_and_what_a_stream_cannot_work_with_are_refused_naming_the_fix() {
    use outbox_relay::exit;
    let broker = tokio::task::block_in_place(RabbitServer::start_with_streams);
    let pg = &common::services().pg;
    let outbox =
        common::outbox::Outbox::on(&pg.url("postgres"), &broker.url(), "stream_refused").await;
    let port = broker.stream_port().to_string();
    let text = common::output_text;
    for (extra, expected) in [
        (
            ["--on-slot-lost", "recreate"],
            "--stream and --super-stream do not work with --on-slot-lost recreate",
        ),
        (
            ["--on-unroutable", "dead-letter"],
            "--stream and --super-stream do not work with --on-unroutable dead-letter",
        ),
    ] {
        let mut args = vec![
            "run",
            "--stream",
            "s",
            "--stream-port",
            &port,
            "--metrics-addr",
            "off",
        ];
        args.extend(extra);
        if extra[0] == "--on-unroutable" {
            args.extend(["--dead-letter-exchange", "dead"]);
        }
        let out = outbox.run_command(&args);
        assert_eq!(
            out.status.code(),
            Some(i32::from(exit::CONFIG)),
            "{}",
            text(&out)
        );
        assert!(text(&out).contains(expected), "{}", text(&out));
    }

    outbox.insert("Created", "{}").await;
    let before = outbox.confirmed_flush().await;
    for (flag, expected) in [
        (
            "--stream",
            [
                "The RabbitMQ stream \"nowhere\" does not exist",
                "queue_type=stream",
            ],
        ),
        (
            "--super-stream",
            [
                "The RabbitMQ super stream \"nowhere\" does not exist",
                "rabbitmq-streams add_super_stream nowhere",
            ],
        ),
    ] {
        let out = outbox.run_command(&[
            "run",
            flag,
            "nowhere",
            "--stream-port",
            &port,
            "--metrics-addr",
            "off",
        ]);
        assert_eq!(
            out.status.code(),
            Some(i32::from(exit::CONFIG)),
            "{}",
            text(&out)
        );
        assert!(
            expected.iter().all(|needle| text(&out).contains(needle)),
            "{}",
            text(&out)
        );
    }
    assert_eq!(
        outbox.confirmed_flush().await,
        before,
        "the slot did not move past the row"
    );
}

/// `amqps://` URLs take the stream destination over TLS, as they take AMQP: to the stream
/// plugin's TLS listener, verifying the broker's certificate against the CAs the system
/// trusts, here `SSL_CERT_FILE`'s. Another CA fails every session naming the certificate
/// (nothing stored); the right one stores every row once, in commit order;
/// a CA file the stream client could not use stops the relay at start, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_urls_take_the_stream_over_tls_trusting_the_cas_of_ssl_cert_file() {
    use common::tls::TestCerts;
    const ROWS: usize = 2_000;
    let certs = TestCerts::generate("rabbitmq");
    let (amqps_port, tls_port) = (common::free_port(), common::free_port());
    let path = |p: &std::path::Path| p.to_str().expect("utf-8").to_string();
    let conf = [
        format!("listeners.ssl.default = 127.0.0.1:{amqps_port}"),
        format!("stream.listeners.ssl.1 = 127.0.0.1:{tls_port}"),
        // What a TLS client is told the stream's leader listens on.
        format!("stream.advertised_tls_port = {tls_port}"),
        format!("ssl_options.cacertfile = {}", path(&certs.ca)),
        format!("ssl_options.certfile = {}", path(&certs.server_cert)),
        format!("ssl_options.keyfile = {}", path(&certs.server_key)),
        "ssl_options.verify = verify_none".to_string(),
        "ssl_options.fail_if_no_peer_cert = false".to_string(),
    ];
    let broker = tokio::task::block_in_place(|| {
        let conf: Vec<&str> = conf.iter().map(String::as_str).collect();
        RabbitServer::start_with_streams_and_config(&conf)
    });
    let pg = &common::services().pg;
    let outbox = common::outbox::Outbox::on(&pg.url("postgres"), &broker.url(), "stream_tls").await;
    // The test's own client, over the plain listener.
    let environment = environment(&broker).await;
    let stream = "tls";
    environment
        .stream_creator()
        .create(stream)
        .await
        .expect("create the stream");
    let oracle = "stream_tls_oracle";
    common::create_test_decoding_slot(&outbox.client, oracle).await;
    common::outbox::write_concurrently(&outbox.db_url, 2, ROWS, 20).await;
    let end = common::current_wal_lsn(&outbox.client).await;
    let amqps = format!("amqps://guest:guest@localhost:{amqps_port}/%2f");
    let port = tls_port.to_string();
    let flags = ["--stream", stream, "--stream-port", &port];
    let spawn = |ca: &str| {
        let urls = (outbox.db_url.as_str(), amqps.as_str());
        outbox.spawn("run", urls, &flags, &[("SSL_CERT_FILE", ca)])
    };

    let relay = spawn(&path(&certs.wrong_ca));
    assert!(
        relay.wait_for_log("session failed", MINUTE).await,
        "log:\n{}",
        relay.log()
    );
    assert!(
        relay.log().contains("certificate"),
        "the error names the certificate; log:\n{}",
        relay.log()
    );
    relay.kill9();
    assert_eq!(
        read_all(&environment, stream).await.len(),
        0,
        "nothing stored"
    );

    let relay = spawn(&path(&certs.ca));
    if let Err(reached) =
        common::outbox::wait_slot_confirmed_flush(&outbox.client, &outbox.slot, end, MINUTE * 2)
            .await
    {
        panic!(
            "every row acknowledged over TLS: the slot is at {}; log:\n{}",
            common::format_lsn(reached),
            relay.log()
        );
    }
    relay.stop().await;
    let committed = committed_ids(&outbox.client, oracle).await;
    let held = stream_ids(&environment, stream).await;
    assert_eq!(committed.len(), ROWS);
    assert!(
        held == committed,
        "the stream holds every row once in commit order: {} held, {} committed, first \
         difference at {:?}",
        held.len(),
        committed.len(),
        held.iter().zip(&committed).position(|(a, b)| a != b)
    );

    // A CA file without a certificate: refused at start, before any session.
    let empty = certs.dir().join("empty.pem");
    std::fs::write(&empty, "").expect("write an empty CA file");
    let out = std::process::Command::new(common::relay::binary())
        .args([
            "run",
            "--stream",
            stream,
            "--stream-port",
            &port,
            "--metrics-addr",
            "off",
        ])
        .args(outbox.flags_via("run", &outbox.db_url, &amqps))
        .env("SSL_CERT_FILE", &empty)
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .output()
        .expect("run outbox-relay");
    let text = common::output_text(&out);
    assert_eq!(
        out.status.code(),
        Some(i32::from(outbox_relay::exit::CONFIG)),
        "{text}"
    );
    assert!(
        text.contains("holds no PEM certificate") && text.contains("SSL_CERT_FILE"),
        "{text}"
    );
}

/// A row in the stream carries the message contract: over the stream protocol in the AMQP
/// 1.0 sections, and read over AMQP 0-9-1 from the same stream with the properties and
/// headers a queue's consumer sees (docs/consumers.md, "Reading a stream").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_in_the_stream_carries_the_message_contract_for_both_protocols() {
    use lapin::options::{BasicConsumeOptions, BasicQosOptions};
    use lapin::types::{AMQPValue, FieldTable};
    let stream = "contract";
    let (broker, outbox, environment) = outbox_and_stream("stream_contract", stream).await;
    let id = outbox.insert("OrderCreated", r#"{"order": 7}"#).await;
    let end = common::current_wal_lsn(&outbox.client).await;
    let port = broker.stream_port().to_string();
    let relay = outbox.spawn_relay(&["--stream", stream, "--stream-port", &port]);
    assert!(
        outbox.wait_confirmed_flush(end, MINUTE).await,
        "the row acknowledged; log:\n{}",
        relay.log()
    );
    relay.stop().await;

    // Over the stream protocol: the AMQP 1.0 properties and application properties.
    let mut consumer = environment
        .consumer()
        .offset(OffsetSpecification::First)
        .build(stream)
        .await
        .expect("a consumer from offset 0");
    let delivery = tokio::time::timeout(MINUTE, consumer.next())
        .await
        .expect("a message within a minute")
        .expect("the consumer runs")
        .expect("a delivery");
    let message = delivery.message();
    let properties = message.properties().expect("properties");
    let message_id = properties
        .message_id
        .clone()
        .and_then(|m| String::try_from(m).ok());
    assert_eq!(message_id.as_deref(), Some(id.as_str()));
    assert_eq!(properties.subject.as_deref(), Some("OrderCreated"));
    assert!(properties.creation_time.is_some(), "{properties:?}");
    let application = format!("{:?}", message.application_properties());
    assert!(
        application.contains("x-outbox-seq") && application.contains("x-outbox-lsn"),
        "{application}"
    );
    assert_eq!(message.data(), Some(&br#"{"order": 7}"#[..]));
    let _ = consumer.handle().close().await;

    // Over AMQP 0-9-1, as a queue's consumer reads it.
    let connection = common::amqp::amqp_connect(&outbox.amqp_url).await;
    let channel = connection.create_channel().await.expect("a channel");
    channel
        .basic_qos(10, BasicQosOptions::default())
        .await
        .expect("a prefetch: a stream needs one");
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-stream-offset".into(),
        AMQPValue::LongString("first".into()),
    );
    let mut deliveries = channel
        .basic_consume(
            stream.into(),
            "".into(),
            BasicConsumeOptions::default(),
            arguments,
        )
        .await
        .expect("consume the stream over AMQP 0-9-1");
    let delivery = tokio::time::timeout(MINUTE, deliveries.next())
        .await
        .expect("a message within a minute")
        .expect("the consumer runs")
        .expect("a delivery");
    let p = &delivery.properties;
    assert_eq!(
        p.message_id().as_ref().map(|s| s.as_str()),
        Some(id.as_str())
    );
    assert_eq!(p.kind().as_ref().map(|s| s.as_str()), Some("OrderCreated"));
    assert_eq!(
        p.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert!(p.timestamp().is_some(), "{p:?}");
    let headers = p.headers().clone().unwrap_or_default();
    for header in ["x-outbox-seq", "x-outbox-lsn"] {
        assert!(
            headers.inner().contains_key(header),
            "{header} among {headers:?}"
        );
    }
    assert_eq!(delivery.data, br#"{"order": 7}"#);
}
