//! Messages the broker refuses by closing the publishing channel rather than returning them
//! (a 406 for a body over its `max_message_size`, a 404 for an exchange it does not have, a
//! 403 for an exchange the relay's user may not write to): each behind 3,000 rows drained at
//! full speed with the default window, under both policies.
//!
//! A closed channel takes every confirm in flight with it. What must hold: the message is
//! named, it follows the unroutable policy, and the rows before it are not re-published on
//! every retry (a relay that re-publishes the window on each reconnect while the refused
//! message stays makes hundreds of repeats a minute). The oracles are the
//! queues, the slot's `confirmed_flush_lsn` and the relay's own log and endpoints.

use super::*;

use common::faults::{barrier, Tally};
use common::Received;

/// Rows before and after the refused one.
const BEFORE: usize = 3_000;
const AFTER: usize = 1_000;
/// A body over the kit's brokers' `max_message_size` (16 MiB on every series).
const HUGE_PAD: usize = 20 * 1024 * 1024;
/// Above the broker's limit: the relay's own check lets the row through to the broker.
const RELAY_LIMIT: &str = "67108864";

/// Inserts a row whose JSON body is over 20 MiB; returns its id and body size.
async fn insert_huge(outbox: &Outbox) -> (String, usize) {
    let row = outbox
        .client
        .query_one(
            "INSERT INTO outbox (event_type, payload) \
             VALUES ('Good.huge', jsonb_build_object('pad', repeat('x', $1))) \
             RETURNING id::text, octet_length(payload::text)",
            &[&(HUGE_PAD as i32)],
        )
        .await
        .expect("insert a huge row");
    (row.get(0), row.get::<_, i32>(1) as usize)
}

/// `rows` single-row transactions of `Good.n`.
async fn seed(outbox: &Outbox, rows: usize) -> Vec<String> {
    outbox.seed_single_row_transactions(rows, 4).await
}

/// Every message before the marker [`barrier`] puts behind them, tallied by id.
async fn drained(consumer: &mut Consumer, outbox: &Outbox, queue: &str) -> Tally {
    barrier(consumer, &outbox.amqp_url, queue).await;
    Tally::of(consumer.received())
}

/// A refusal costs at most one window of repeats: the one in flight when the channel closed.
fn assert_one_window_of_repeats(tally: &Tally, relay: &RelayProcess) {
    assert!(
        tally.duplicates() <= W,
        "{} repeats, over one window ({W}); log:\n{}",
        tally.duplicates(),
        relay.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_brokers_max_message_size_halts_naming_it_after_one_window_of_repeats() {
    let outbox = Outbox::new("refused_huge").await;
    let oracle = Oracle::create(&outbox).await;
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let before = seed(&outbox, BEFORE).await;
    let (huge, size) = insert_huge(&outbox).await;
    seed(&outbox, AFTER).await;

    let relay = outbox.spawn_relay(&["--max-message-size", RELAY_LIMIT, "--max-backoff", "1s"]);
    // The broker refuses it with the window full; the relay learns the broker's limit from
    // the refusal, and on its retry the row is too large before it is published: halt stops.
    let status = relay.wait_exit(2 * MINUTE).await.unwrap_or_else(|| {
        panic!(
            "the relay did not stop at row {huge}; it re-published {} messages; log:\n{}",
            Tally::of(consumer.received()).duplicates(),
            relay.log()
        )
    });
    assert!(!status.success(), "exits non-zero; log:\n{}", relay.log());
    let log = relay.log();
    assert!(
        log.contains(&format!("RabbitMQ refused message {huge} ({size} bytes)"))
            && log.contains("PRECONDITION_FAILED"),
        "the refusal names the row; log:\n{log}"
    );
    assert!(
        log.contains(&format!(
            "Message {huge} has a body of {size} bytes, over the 16777216 bytes RabbitMQ takes"
        )),
        "the stop names the row and the broker's limit; log:\n{log}"
    );
    assert_eq!(
        relay.sessions(),
        2,
        "one refusal, then the stop; log:\n{log}"
    );
    assert!(
        wait_for_ids(&mut consumer, &before, MINUTE).await,
        "every row before it is delivered"
    );
    assert_not_acknowledged(&outbox, &oracle, &huge, "the refused row").await;
    let tally = drained(&mut consumer, &outbox, &outbox.queue).await;
    assert_one_window_of_repeats(&tally, &relay);
    report(
        "refused body, halt",
        &[
            ("rows before", BEFORE.to_string()),
            ("repeats", tally.duplicates().to_string()),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_dead_letter_a_body_over_the_brokers_max_message_size_is_dead_lettered_without_it() {
    let dl = DeadLetterOutbox::new("refused_huge_dl").await;
    let outbox = &dl.outbox;
    bind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
    let oracle = Oracle::create(outbox).await;
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let dead_letter_queue = dl.bind_dead_letter_queue().await;
    let mut dead_letters = Consumer::start(&outbox.amqp_url, &dead_letter_queue).await;
    let mut committed = seed(outbox, BEFORE).await;
    let (huge, size) = insert_huge(outbox).await;
    committed.extend(seed(outbox, AFTER).await);

    let (relay, port) = spawn_observed(
        outbox,
        &[&dl.policy()[..], &["--max-message-size", RELAY_LIMIT]].concat(),
    );
    assert!(
        wait_for_ids(&mut dead_letters, std::slice::from_ref(&huge), MINUTE).await,
        "dead-lettered; log:\n{}",
        relay.log()
    );
    let last = committed.last().expect("rows").clone();
    assert_acknowledged(outbox, &oracle, &relay, &last, MINUTE).await;
    let letter = only(dead_letters.received(), &huge);
    assert_eq!(
        letter.header_str("x-outbox-dead-letter-reason"),
        Some(format!("too large: {size} bytes > limit 16777216").as_str())
    );
    assert!(
        letter.body.is_empty(),
        "without the body the broker refused"
    );
    assert_eq!(metric(port, &dead_lettered("too_large")).await, Some(1.0));
    assert_eq!(relay.sessions(), 2, "one refusal; log:\n{}", relay.log());
    let tally = drained(&mut consumer, outbox, &outbox.queue).await;
    committed.retain(|id| *id != huge);
    assert_nothing_lost_or_invented(&tally, &committed);
    assert_one_window_of_repeats(&tally, &relay);
    report(
        "refused body, dead-letter",
        &[
            ("rows", (BEFORE + AFTER).to_string()),
            ("repeats", tally.duplicates().to_string()),
        ],
    );
    relay.stop().await;
}

/// An exchange name the relay may route to (`--allowed-exchanges PREFIX*`) that nobody
/// declared, and the flags that allow it.
fn undeclared_exchange() -> (String, [String; 2]) {
    let prefix = unique_name("events");
    let exchange = format!("{prefix}.undeclared");
    (
        exchange,
        ["--allowed-exchanges".into(), format!("{prefix}.*")],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_routed_to_an_allowed_undeclared_exchange_waits_named_without_a_repeat_until_declared(
) {
    let outbox = Outbox::new("refused_exchange").await;
    let oracle = Oracle::create(&outbox).await;
    let (exchange, allowed) = undeclared_exchange();
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let before = seed(&outbox, BEFORE).await;
    let stuck = insert_to_exchange(&outbox, &exchange).await;
    let after = seed(&outbox, AFTER).await;

    let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
    let (relay, port) = spawn_observed(&outbox, &allowed);
    assert!(
        relay
            .wait_for_log_count(
                &format!(
                    "Message {stuck} is routed to exchange \"{exchange}\", which does not exist"
                ),
                2,
                MINUTE
            )
            .await,
        "named on every attempt; log:\n{}",
        relay.log()
    );
    assert_eq!(readyz(port).await, (503, format!("stuck message {stuck}")));
    assert!(
        wait_for_ids(&mut consumer, &before, MINUTE).await,
        "every row before it is delivered"
    );
    assert_not_acknowledged(
        &outbox,
        &oracle,
        &stuck,
        "the row to the undeclared exchange",
    )
    .await;
    let tally = drained(&mut consumer, &outbox, &outbox.queue).await;
    assert_eq!(
        tally.duplicates(),
        0,
        "checked before publishing: the channel never closed, nothing was re-published; log:\n{}",
        relay.log()
    );

    // Declared and bound, the row goes there and delivery goes on.
    let elsewhere = unique_name("undeclared_q");
    common::amqp::declare_exchange(&outbox.amqp_url, &exchange).await;
    declare_bound_queue(&outbox.amqp_url, &exchange, &elsewhere, "#").await;
    let mut diverted = Consumer::start(&outbox.amqp_url, &elsewhere).await;
    assert!(
        wait_for_ids(&mut diverted, std::slice::from_ref(&stuck), MINUTE).await,
        "delivered once declared; log:\n{}",
        relay.log()
    );
    assert!(
        wait_for_ids(&mut consumer, &after, MINUTE).await,
        "the rows after it"
    );
    assert_acknowledged(
        &outbox,
        &oracle,
        &relay,
        after.last().expect("rows"),
        MINUTE,
    )
    .await;
    assert!(wait_ready(port, MINUTE).await, "/readyz 200 once delivered");
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_dead_letter_a_row_routed_to_an_undeclared_exchange_is_dead_lettered_without_a_repeat(
) {
    let dl = DeadLetterOutbox::new("refused_exchange_dl").await;
    let outbox = &dl.outbox;
    bind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
    let oracle = Oracle::create(outbox).await;
    let (exchange, allowed) = undeclared_exchange();
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let dead_letter_queue = dl.bind_dead_letter_queue().await;
    let mut dead_letters = Consumer::start(&outbox.amqp_url, &dead_letter_queue).await;
    let mut committed = seed(outbox, BEFORE).await;
    let stuck = insert_to_exchange(outbox, &exchange).await;
    committed.extend(seed(outbox, AFTER).await);

    let flags: Vec<&str> = dl
        .policy()
        .into_iter()
        .chain(allowed.iter().map(String::as_str))
        .collect();
    let (relay, port) = spawn_observed(outbox, &flags);
    assert!(
        wait_for_ids(&mut dead_letters, std::slice::from_ref(&stuck), MINUTE).await,
        "dead-lettered; log:\n{}",
        relay.log()
    );
    assert_acknowledged(
        outbox,
        &oracle,
        &relay,
        committed.last().expect("rows"),
        MINUTE,
    )
    .await;
    let letter = only(dead_letters.received(), &stuck);
    assert_eq!(
        letter.header_str("x-outbox-dead-letter-reason"),
        Some(format!("exchange missing: {exchange}").as_str())
    );
    assert_eq!(
        metric(port, &dead_lettered("exchange_missing")).await,
        Some(1.0)
    );
    assert_eq!(relay.sessions(), 1, "no reconnect; log:\n{}", relay.log());
    let tally = drained(&mut consumer, outbox, &outbox.queue).await;
    committed.retain(|id| *id != stuck);
    assert_nothing_lost_or_invented(&tally, &committed);
    assert_eq!(tally.duplicates(), 0, "log:\n{}", relay.log());
    relay.stop().await;
}

/// The relay's own RabbitMQ user, allowed everything but writing to exchanges starting with
/// `denied`, on the shared broker (guest declares; the relay publishes as this user).
fn user_denied_writes(amqp_url: &str) -> String {
    let user = unique_name("relayuser");
    let rabbit = &common::services().rabbit;
    for args in [
        &["add_user", user.as_str(), "secret"][..],
        &[
            "set_permissions",
            "-p",
            "/",
            user.as_str(),
            ".*",
            "^(?!denied).*",
            ".*",
        ],
    ] {
        let out = rabbit.ctl(args);
        assert!(
            out.status.success(),
            "rabbitmqctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    amqp_url.replacen("guest:guest", &format!("{user}:secret"), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_dead_letter_a_write_the_broker_denies_is_found_alone_and_dead_lettered_on_a_new_channel(
) {
    let dl = DeadLetterOutbox::new("refused_denied").await;
    let outbox = &dl.outbox;
    bind_queue(&outbox.amqp_url, &outbox.queue, &outbox.exchange, "#").await;
    let oracle = Oracle::create(outbox).await;
    let denied = unique_name("denied");
    common::amqp::declare_exchange(&outbox.amqp_url, &denied).await;
    let mut consumer = Consumer::start_with(&outbox.amqp_url, &outbox.queue, false).await;
    let dead_letter_queue = dl.bind_dead_letter_queue().await;
    let mut dead_letters = Consumer::start(&outbox.amqp_url, &dead_letter_queue).await;
    let mut committed = seed(outbox, BEFORE).await;
    let refused = insert_to_exchange(outbox, &denied).await;
    committed.extend(seed(outbox, AFTER).await);

    let amqp_url = user_denied_writes(&outbox.amqp_url);
    let mut flags = dl.policy().to_vec();
    flags.extend(["--allowed-exchanges", "denied*"]);
    let relay = outbox.spawn_relay_via(&outbox.db_url, &amqp_url, &flags);
    // The 403 closes the channel with a window in flight and names nothing: the next session
    // publishes one at a time up to the newest of them, finds the row alone and dead-letters
    // it, then goes on at full speed on a new channel.
    assert!(
        wait_for_ids(&mut dead_letters, std::slice::from_ref(&refused), MINUTE).await,
        "dead-lettered; log:\n{}",
        relay.log()
    );
    assert_acknowledged(
        outbox,
        &oracle,
        &relay,
        committed.last().expect("rows"),
        MINUTE,
    )
    .await;
    let letter = only(dead_letters.received(), &refused);
    let reason = letter
        .header_str("x-outbox-dead-letter-reason")
        .unwrap_or_default();
    assert!(
        reason.starts_with("refused: ACCESS_REFUSED")
            && reason.ends_with(&format!("403 exchange={denied}")),
        "{reason}"
    );
    assert!(
        relay.sessions() <= 3,
        "one close among many, at most one more alone; log:\n{}",
        relay.log()
    );
    let tally = drained(&mut consumer, outbox, &outbox.queue).await;
    committed.retain(|id| *id != refused);
    assert_nothing_lost_or_invented(&tally, &committed);
    assert_one_window_of_repeats(&tally, &relay);
    report(
        "denied write, dead-letter",
        &[
            ("rows", (BEFORE + AFTER).to_string()),
            ("sessions", relay.sessions().to_string()),
            ("repeats", tally.duplicates().to_string()),
        ],
    );
    relay.stop().await;
}

/// Rows of the repeated-id drain: pairs of rows share an id, one pair in ten unroutable.
const PAIRED_ROWS: usize = 4_000;

/// The `x-outbox-seq` of each of `received`, every one distinct (panics on a repeat).
fn distinct_seqs(received: &[Received]) -> std::collections::HashSet<String> {
    let mut seqs = std::collections::HashSet::new();
    for r in received {
        if let Some(seq) = r.header_str("x-outbox-seq") {
            assert!(seqs.insert(seq.to_string()), "{seq} arrived twice");
        }
    }
    seqs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_dead_letter_rows_repeating_an_id_in_one_window_are_each_dead_lettered_or_delivered()
{
    let dl = DeadLetterOutbox::new("paired_ids").await;
    let outbox = &dl.outbox;
    outbox
        .client
        .batch_execute("ALTER TABLE outbox ADD COLUMN ref text")
        .await
        .expect("add the id column the relay maps");
    let mut consumer = Consumer::start(&outbox.amqp_url, &outbox.queue).await;
    let dead_letter_queue = dl.bind_dead_letter_queue().await;
    let mut dead_letters = Consumer::start(&outbox.amqp_url, &dead_letter_queue).await;
    // Rows 2k and 2k + 1 share id `rk`; both rows of every tenth pair are unroutable. In
    // transactions of 100 rows: the pairs travel in one window.
    outbox
        .client
        .batch_execute(&format!(
            "DO $$ BEGIN FOR t IN 0..{} LOOP \
               INSERT INTO outbox (event_type, payload, ref) \
               SELECT CASE WHEN (i / 2) % 10 = 3 THEN 'Nobody.listens' ELSE 'Good.paired' END, \
                      '{{}}', 'r' || (i / 2) \
               FROM generate_series(t * 100, t * 100 + 99) AS i; \
               COMMIT; END LOOP; END $$",
            PAIRED_ROWS / 100 - 1
        ))
        .await
        .expect("insert the paired rows");
    let unroutable = PAIRED_ROWS / 10;

    let flags: Vec<&str> = dl
        .policy()
        .into_iter()
        .chain(["--column", "id=ref"])
        .collect();
    let (relay, _port) = spawn_observed(outbox, &flags);
    consumer
        .wait_for(PAIRED_ROWS - unroutable, 2 * MINUTE)
        .await;
    dead_letters.wait_for(unroutable, MINUTE).await;
    barrier(&mut consumer, &outbox.amqp_url, &outbox.queue).await;
    barrier(&mut dead_letters, &outbox.amqp_url, &dead_letter_queue).await;
    let delivered = distinct_seqs(consumer.received());
    let lettered = distinct_seqs(dead_letters.received());
    assert_eq!(
        lettered.len(),
        unroutable,
        "every unroutable row dead-lettered, each once; log:\n{}",
        relay.log()
    );
    assert_eq!(
        delivered.len(),
        PAIRED_ROWS - unroutable,
        "every other row delivered once"
    );
    let both: Vec<_> = delivered.intersection(&lettered).collect();
    assert!(
        delivered.is_disjoint(&lettered),
        "{} rows both delivered and dead-lettered, e.g. seq {:?}",
        both.len(),
        both.iter().min()
    );
    relay.stop().await;
}
