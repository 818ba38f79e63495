//! RabbitMQ Streams: what the broker does that a stream destination would build on
//! (docs/architecture.md, "Streams (designed, not built yet)"). A named producer's publishing ids are deduplicated by
//! the broker: it keeps the highest id stored for that name and drops a publish whose id is
//! not above it. That turns a relay's re-publish after a crash into nothing, and an id that
//! goes backwards into a silent loss. These tests pin both down on the kit's broker (4.0),
//! each read back from offset 0 with a client of its own. On 3.10 the broker closes the
//! `rabbitmq-stream-client` 0.11 connection at connect (not yet looked into; 3.10 is out of
//! support).

use outbox_testkit as common;

use std::time::Duration;

use common::RabbitServer;
use futures_util::StreamExt;
use rabbitmq_stream_client::types::{Message, OffsetSpecification};
use rabbitmq_stream_client::{Client, ClientOptions, Environment, NoDedup, Producer};

const MINUTE: Duration = Duration::from_secs(60);

async fn environment(broker: &RabbitServer) -> Environment {
    Environment::builder()
        .host("127.0.0.1")
        .port(broker.stream_port())
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
    const MARKER: &str = "test-marker";
    let marker: Producer<NoDedup> = environment
        .producer()
        .build(stream)
        .await
        .expect("the marker's producer");
    let status = marker
        .send_with_confirm(Message::builder().body(MARKER.as_bytes().to_vec()).build())
        .await
        .expect("publish the marker");
    assert!(
        status.confirmed(),
        "the marker was not confirmed: {status:?}"
    );
    let mut consumer = environment
        .consumer()
        .offset(OffsetSpecification::First)
        .build(stream)
        .await
        .expect("a consumer from offset 0");
    let mut bodies = Vec::new();
    loop {
        let delivery = tokio::time::timeout(MINUTE, consumer.next())
            .await
            .unwrap_or_else(|_| panic!("no marker in {stream} within a minute: read {bodies:?}"))
            .unwrap_or_else(|| panic!("{stream}'s consumer ended before the marker: {bodies:?}"))
            .expect("a delivery");
        let body = delivery.message().data().unwrap_or_default();
        let body = String::from_utf8_lossy(body).into_owned();
        if body == MARKER {
            return bodies;
        }
        bodies.push(body);
    }
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
