//! Negative controls: the relay broken on purpose, and the oracle that must catch it with its
//! named verdict. An oracle never seen to fail a broken relay proves nothing
//! (crates/outbox-bench/lab/scenarios.md, "Negative controls").
//!
//! The breakage is a switch of the test build (`OUTBOX_FAILPOINTS=<switch>=on`,
//! src/failpoint.rs): a release has none, and refuses the variable at start.

use outbox_testkit as common;

use std::time::Duration;

use common::faults::{ack_verdict, ids_of, observed_outbox, report};
use common::{PgServer, RabbitServer};

const MINUTE: Duration = Duration::from_secs(60);
/// Rows written while the broker reads nothing from the relay.
const HELD_ROWS: i32 = 200;

fn blocking<R>(f: impl FnOnce() -> R) -> R {
    tokio::task::block_in_place(f)
}

/// A relay that acknowledges each commit as soon as it queued its rows
/// (`ack-before-confirm`), while a memory alarm keeps every publish of it off the broker,
/// then killed: its slot is past rows that no queue holds. The ACK oracle (slot read, then a
/// marker through the queue) must name such a row. The relay built correctly never gets the
/// slot past the first held row, so the scenario waits for the broken relay's acknowledgement
/// before it kills it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_acknowledges_before_the_confirm_is_caught_by_the_ack_oracle() {
    let rabbit = std::thread::spawn(RabbitServer::start);
    let pg = blocking(|| PgServer::start(&[]));
    let rabbit = blocking(|| rabbit.join()).expect("rabbitmq start");
    let (outbox, oracle, mut consumer) = observed_outbox(&pg, &rabbit, "neg_ack", false).await;
    let relay = outbox.spawn(
        "run",
        (&outbox.db_url, &outbox.amqp_url),
        &[],
        &[("OUTBOX_FAILPOINTS", "ack-before-confirm=on")],
    );
    outbox.insert("Before", "{}").await;
    consumer.wait_for(1, MINUTE).await;
    assert_eq!(consumer.received().len(), 1, "log:\n{}", relay.log());

    blocking(|| rabbit.set_memory_alarm(true));
    outbox
        .client
        .batch_execute(&format!(
            "DO $$ BEGIN FOR t IN 1..{} LOOP \
               INSERT INTO outbox (event_type, payload) \
               SELECT 'Held', jsonb_build_object('n', i) FROM generate_series(1, 10) AS i; \
               COMMIT; END LOOP; END $$",
            HELD_ROWS / 10
        ))
        .await
        .expect("insert the held rows");
    let committed = oracle.committed_ids(&outbox.client).await;
    let last = committed.last().expect("rows committed");
    let last_end = oracle.transaction_of(&outbox.client, last).await.end_lsn;
    assert!(
        outbox.wait_confirmed_flush(last_end, MINUTE).await,
        "the switched relay never acknowledged the held rows: is the switch armed? log:\n{}",
        relay.log()
    );
    relay.kill9();
    blocking(|| rabbit.set_memory_alarm(false));

    let queue = outbox.queue.clone();
    let verdict = ack_verdict(
        &outbox.client,
        &outbox,
        &oracle,
        &mut [(queue.as_str(), &mut consumer)],
    )
    .await;
    let violation = match verdict {
        Err(violation) => violation,
        Ok(ack) => panic!(
            "the ACK oracle passed a relay that acknowledged before the confirm: {} rows \
             acknowledged, all in the queue; log:\n{}",
            ack.acknowledged_rows,
            relay.log()
        ),
    };
    let named = violation.to_string();
    assert!(named.starts_with("ACK violated: row "), "{named}");
    assert!(
        committed[1..].contains(&violation.id),
        "the row named is one of the held rows: {named}"
    );
    let held = committed.len() - 1;
    let arrived = ids_of(consumer.received()).len() - 1;
    report(
        "negative control: acknowledged before the confirm",
        &[
            ("held rows", held.to_string()),
            ("of them in the queue", arrived.to_string()),
            ("verdict", named),
        ],
    );
}
