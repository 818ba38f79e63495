//! The delivery loop's own logic, in process, against the stand-in broker of
//! `publish/testing.rs`, scripted to answer as a broker may: late, out of order, with nacks,
//! and with returns riding on another publish's confirm. Every integration test runs the same
//! loop against a real RabbitMQ; these pin down what the loop does with each answer, at a
//! full window.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;

use super::*;
use crate::contract::message::{HeaderValue, Rejection};
use crate::error::BrokerError;
use crate::error::MapProblem;
use crate::publish::dead_letter::headers as dl;
use crate::publish::publisher::Returned;
use crate::publish::testing::{until_idle, Publish, StandInBroker};

/// A test token: the position of an ack point (folds to the highest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Pos(u64);

impl AckToken for Pos {
    fn fold(&mut self, newer: Self) {
        self.0 = self.0.max(newer.0);
    }
}

/// What the scripted broker does with a publish, by message id.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Plan {
    Ack,
    Nack,
    /// Acked, but returned as unroutable; the return rides on the confirm `later` publishes
    /// after it (0: its own), as lapin may attach it.
    Return {
        later: usize,
    },
    /// The broker closes the publishing channel over it (a channel error, not a return): the
    /// publishes before it are acked, and every publish on the channel not answered by then
    /// fails, as lapin fails their confirms.
    Close {
        reply_code: u16,
        reply_text: &'static str,
    },
}

/// A broker as the tests script it: it answers the stand-in's publishes by `plans` (default:
/// ack; a dead letter is always acked), in a scrambled order.
struct Script {
    plans: HashMap<String, Plan>,
    /// How the dead letters of these message ids are answered (default: ack).
    dead_letter_plans: HashMap<String, Plan>,
    /// Returns to attach to the answer of a later publish: (carrier index, return).
    riding: Vec<(usize, Returned)>,
    /// A small LCG's state: scrambles reproducibly.
    seed: u64,
}

impl Script {
    fn new(plans: &[(&str, Plan)]) -> Self {
        Self {
            plans: plans.iter().map(|(id, p)| (id.to_string(), *p)).collect(),
            dead_letter_plans: HashMap::new(),
            riding: Vec::new(),
            seed: 7,
        }
    }

    /// The dead letters of these message ids are answered so (a `later` counts publishes
    /// on either channel).
    fn with_dead_letter_plans(mut self, plans: &[(&str, Plan)]) -> Self {
        self.dead_letter_plans = plans.iter().map(|(id, p)| (id.to_string(), *p)).collect();
        self
    }

    fn plan(&self, publish: &Publish) -> Plan {
        let plans = match publish.dead_letter_channel {
            true => &self.dead_letter_plans,
            false => &self.plans,
        };
        plans
            .get(&publish.message.message_id)
            .copied()
            .unwrap_or(Plan::Ack)
    }

    /// Answers every publish not answered yet, in a scrambled order (a multiple ack's
    /// confirms resolve in no particular order), holding back the newest `hold` of them.
    fn answer_some(&mut self, broker: &StandInBroker, hold: usize) {
        let mut indexes = broker.unanswered();
        indexes.truncate(indexes.len().saturating_sub(hold));
        let plans: Vec<Plan> = indexes
            .iter()
            .map(|&index| self.plan(&broker.publish(index)))
            .collect();
        // Returns first, so that each rides on its carrier's answer.
        for (&index, plan) in indexes.iter().zip(&plans) {
            if let Plan::Return { later } = plan {
                self.riding.push((index + later, broker.unroutable(index)));
            }
        }
        let closing = indexes
            .iter()
            .zip(&plans)
            .find_map(|(&index, plan)| match plan {
                Plan::Close {
                    reply_code,
                    reply_text,
                } => Some((index, *reply_code, *reply_text)),
                _ => None,
            });
        if let Some((culprit, reply_code, reply_text)) = closing {
            for &index in indexes.iter().filter(|&&index| index < culprit) {
                broker.ack(index);
            }
            broker.close_channel(reply_code, reply_text);
            return;
        }
        let mut answers: Vec<(usize, Plan)> = indexes.into_iter().zip(plans).collect();
        for step in 0..answers.len() {
            self.seed = self
                .seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let pick = step + (self.seed >> 33) as usize % (answers.len() - step);
            answers.swap(step, pick);
        }
        for (index, plan) in answers {
            let ride = self
                .riding
                .iter()
                .position(|(carrier, _)| *carrier == index);
            let returned = ride.map(|at| self.riding.remove(at).1);
            broker.answer(index, plan != Plan::Nack, returned);
        }
    }
}

fn message(id: &str) -> Message {
    Message {
        message_id: id.into(),
        exchange: "outbox".into(),
        routing_key: "Created".into(),
        event_type: Some("Created".into()),
        content_type: Some("application/json".into()),
        timestamp: None,
        headers: vec![("x-outbox-seq".into(), HeaderValue::Text(id.into()))],
        body: Bytes::from_static(b"{}"),
        position: None,
    }
}

/// `transactions` transactions of `rows` rows each: message `t-r`, then ack point `t + 1`.
fn stream(transactions: u64, rows: u64) -> Vec<Input<Pos>> {
    let mut inputs = Vec::new();
    for t in 0..transactions {
        for r in 0..rows {
            inputs.push(Input::Publish {
                message: message(&format!("{t}-{r}")),
                committed_at: None,
            });
        }
        inputs.push(Input::AckPoint(Pos(t + 1)));
    }
    inputs
}

/// What one run of the loop did.
struct Run {
    outcome: Result<(), RelayError>,
    /// Every token the loop reported, in order.
    reported: Vec<Pos>,
    broker: StandInBroker,
}

/// Runs `deliver` over `inputs` with `window`, `broker` answering by `script`. Whenever the
/// loop and the source are idle (waiting for answers), the broker answers all but the newest
/// `hold` publishes, or all of them when no more than `hold` wait: the window fills before
/// any answer comes. Needs the paused clock ([`until_idle`]).
async fn run(
    broker: StandInBroker,
    script: Script,
    inputs: Vec<Input<Pos>>,
    window: usize,
    hold: usize,
) -> Run {
    run_with(broker, script, inputs, window, hold, None).await
}

async fn run_with(
    broker: StandInBroker,
    mut script: Script,
    inputs: Vec<Input<Pos>>,
    window: usize,
    hold: usize,
    stuck: Option<&str>,
) -> Run {
    let (tx, rx) = mpsc::channel(8);
    let (acked_tx, mut acked) = watch::channel(Acked::default());
    let options = DeliveryOptions {
        window,
        confirm_timeout: Duration::from_secs(30),
        stuck: stuck.map(str::to_string),
        health: None,
    };
    let metrics = RelayMetrics::for_batches();
    let feed = async move {
        for input in inputs {
            if tx.send(input).await.is_err() {
                return;
            }
        }
    };
    let answering = async {
        loop {
            until_idle().await;
            let unanswered = broker.unanswered().len();
            script.answer_some(&broker, if unanswered > hold { hold } else { 0 });
        }
    };
    let mut reported = Vec::new();
    let watching = async {
        while acked.changed().await.is_ok() {
            if let Some(token) = acked.borrow_and_update().token {
                reported.push(token);
            }
        }
    };
    let delivering = async {
        let outcome = deliver(&broker, &options, &metrics, rx, &acked_tx).await;
        drop(acked_tx);
        outcome
    };
    let (outcome, (), ()) = tokio::select! {
        all = async { tokio::join!(delivering, feed, watching) } => all,
        () = answering => unreachable!("the stand-in answers forever"),
    };
    Run {
        outcome,
        reported,
        broker,
    }
}

/// What the loop published on the dead-letter channel, in order.
fn dead_letter_channel_publishes(broker: &StandInBroker) -> Vec<Publish> {
    broker
        .published()
        .into_iter()
        .filter(|p| p.dead_letter_channel)
        .collect()
}

fn ids(published: &[Publish]) -> Vec<&str> {
    published
        .iter()
        .map(|p| p.message.message_id.as_str())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_full_window_publishes_in_order_and_acknowledges_every_transaction() {
    let window = 64;
    // The stand-in always holds some answers back: the window stays full.
    let script = Script::new(&[]);
    let run = run(StandInBroker::new(), script, stream(500, 7), window, 5).await;
    run.outcome.expect("delivered");
    let taken = run.broker.published();
    let expected: Vec<String> = (0..500)
        .flat_map(|t| (0..7).map(move |r| format!("{t}-{r}")))
        .collect();
    assert_eq!(ids(&taken), expected, "publish order is input order");
    assert_eq!(run.reported.last(), Some(&Pos(500)));
    assert!(
        run.reported.windows(2).all(|w| w[0] < w[1]),
        "tokens only move forward"
    );
    assert_eq!(
        run.broker.most_unanswered(),
        window,
        "the window was full and never exceeded"
    );
}

#[tokio::test(start_paused = true)]
async fn a_nack_in_a_full_window_acknowledges_nothing_after_it() {
    // 3-4 is nacked: transaction 3 (ack point 4) and everything after must stay unacknowledged.
    let script = Script::new(&[("3-4", Plan::Nack)]);
    let run = run(StandInBroker::new(), script, stream(200, 7), 64, 3).await;
    assert!(
        matches!(run.outcome, Err(RelayError::Broker(BrokerError::Nacked { ref message_id })) if message_id == "3-4"),
        "{:?}",
        run.outcome
    );
    assert!(
        run.reported.iter().all(|&p| p <= Pos(3)),
        "{:?}",
        run.reported
    );
}

#[tokio::test(start_paused = true)]
async fn a_return_riding_on_a_later_confirm_fails_the_returned_message() {
    // 5-2's own confirm is an ack; its return rides on the confirm of 5-5, three publishes
    // later. The loop must not count 5-2 delivered.
    let script = Script::new(&[("5-2", Plan::Return { later: 3 })]);
    let run = run(StandInBroker::new(), script, stream(100, 7), 64, 0).await;
    assert!(
        matches!(run.outcome, Err(RelayError::Broker(BrokerError::Returned { ref message_id, .. })) if message_id == "5-2"),
        "{:?}",
        run.outcome
    );
    assert!(
        run.reported.iter().all(|&p| p <= Pos(5)),
        "{:?}",
        run.reported
    );
}

#[tokio::test(start_paused = true)]
async fn under_dead_letter_a_returned_message_goes_to_the_dead_letter_exchange_and_delivery_goes_on(
) {
    let script = Script::new(&[
        ("2-1", Plan::Return { later: 0 }),
        ("7-0", Plan::Return { later: 2 }),
    ]);
    let broker = StandInBroker::new().with_dead_letters("dlx");
    let run = run(broker, script, stream(50, 4), 32, 2).await;
    run.outcome.expect("delivered");
    assert_eq!(run.reported.last(), Some(&Pos(50)));
    let letters = dead_letter_channel_publishes(&run.broker);
    assert_eq!(ids(&letters), ["2-1", "7-0"]);
    for letter in &letters {
        assert_eq!(letter.message.exchange, "dlx");
        assert_eq!(
            letter.message.header(dl::REASON),
            Some(&HeaderValue::Text(
                "unroutable: NO_ROUTE 312 exchange=outbox routing_key=Created".into()
            ))
        );
    }
}

/// Every row of transactions `from..to` of [`stream`]`(_, rows)` returned on its own confirm.
fn returned_transactions(from: u64, to: u64, rows: u64) -> Vec<(String, Plan)> {
    (from..to)
        .flat_map(|t| (0..rows).map(move |r| (format!("{t}-{r}"), Plan::Return { later: 0 })))
        .collect()
}

fn plans(owned: &[(String, Plan)]) -> Vec<(&str, Plan)> {
    owned
        .iter()
        .map(|(id, plan)| (id.as_str(), *plan))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn under_dead_letter_a_burst_of_returns_has_its_dead_letters_in_flight_together() {
    // Transactions 3 to 6 (20 rows) are unroutable. Their dead letters go out together, not
    // one confirm after another (1.4 ms each on a real broker).
    let returned = returned_transactions(3, 7, 5);
    let script = Script::new(&plans(&returned));
    let broker = StandInBroker::new().with_dead_letters("dlx");
    let run = run(broker, script, stream(10, 5), 64, 0).await;
    run.outcome.expect("delivered");
    assert_eq!(run.reported.last(), Some(&Pos(10)));
    let letters = dead_letter_channel_publishes(&run.broker);
    let expected: Vec<&str> = returned.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids(&letters), expected, "each once, in stream order");
    assert_eq!(
        run.broker.most_unanswered_dead_letters(),
        returned.len(),
        "every dead letter of the burst in flight at once"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dead_letters_return_riding_on_a_later_dead_letters_confirm_stops_at_the_right_row() {
    // The dead letters of transactions 3 to 6 go out together; the dead-letter exchange
    // returns 4-1's, and the return rides on the confirm of the dead letter two later (4-3's).
    // 4-1 must not settle on its own ack: transaction 4 and everything after stays
    // unacknowledged, and the error names 4-1.
    let returned = returned_transactions(3, 7, 5);
    let script = Script::new(&plans(&returned))
        .with_dead_letter_plans(&[("4-1", Plan::Return { later: 2 })]);
    let broker = StandInBroker::new().with_dead_letters("dlx");
    let run = run(broker, script, stream(10, 5), 64, 0).await;
    assert!(
        matches!(
            run.outcome,
            Err(RelayError::Broker(BrokerError::DeadLetterReturned { ref message_id, .. })) if message_id == "4-1"
        ),
        "{:?}",
        run.outcome
    );
    assert!(
        run.reported.iter().all(|&p| p <= Pos(4)),
        "{:?}",
        run.reported
    );
    assert!(
        run.broker.most_unanswered_dead_letters() > 3,
        "the carrier was in flight with it"
    );
}

#[tokio::test(start_paused = true)]
async fn two_unroutable_messages_with_one_id_in_one_window_are_both_dead_lettered() {
    // A table may repeat an id (a non-unique mapped column, a partitioned table): returns are
    // matched by x-outbox-seq, so each return fails its own publish. Matched by id, the
    // second return was dropped and its message acknowledged as delivered: lost.
    let same_id = |seq: &str| {
        let mut message = message("dup");
        message.set_header("x-outbox-seq", seq.into());
        Input::Publish {
            message,
            committed_at: None,
        }
    };
    let inputs = vec![
        Input::Publish {
            message: message("a"),
            committed_at: None,
        },
        same_id("0-1"),
        same_id("0-2"),
        Input::AckPoint(Pos(1)),
    ];
    let script = Script::new(&[("dup", Plan::Return { later: 0 })]);
    let broker = StandInBroker::new().with_dead_letters("dlx");
    let run = run(broker, script, inputs, 64, 0).await;
    run.outcome.expect("delivered");
    assert_eq!(run.reported.last(), Some(&Pos(1)));
    let letters: Vec<Option<HeaderValue>> = dead_letter_channel_publishes(&run.broker)
        .into_iter()
        .map(|p| p.message.header("x-outbox-seq").cloned())
        .collect();
    assert_eq!(
        letters,
        [Some("0-1".into()), Some("0-2".into())],
        "each returned publish dead-lettered once"
    );
}

fn unpublishable(id: Option<&str>) -> Input<Pos> {
    Input::Unpublishable {
        unpublishable: Box::new(Unpublishable {
            original: id.map(message),
            rejection: Rejection::TooLarge { size: 9, limit: 8 },
            message_id: id.map(str::to_string),
            problem: format!("Cannot publish row id {}: too large", id.unwrap_or("?")),
            fault: MapProblem::TooLarge,
        }),
        committed_at: None,
    }
}

/// Transaction 3 holds a row that cannot be published, between two that can.
fn stream_with_unpublishable(id: Option<&str>) -> Vec<Input<Pos>> {
    let mut inputs = stream(3, 5);
    inputs.push(Input::Publish {
        message: message("3-0"),
        committed_at: None,
    });
    inputs.push(unpublishable(id));
    inputs.push(Input::Publish {
        message: message("3-2"),
        committed_at: None,
    });
    inputs.push(Input::AckPoint(Pos(4)));
    inputs.extend(stream(3, 5).into_iter().map(|input| match input {
        Input::AckPoint(Pos(p)) => Input::AckPoint(Pos(p + 4)),
        other => other,
    }));
    inputs
}

#[tokio::test(start_paused = true)]
async fn under_halt_an_unpublishable_row_stops_after_everything_before_it_is_acknowledged() {
    let inputs = stream_with_unpublishable(Some("3-1"));
    let run = run(StandInBroker::new(), Script::new(&[]), inputs, 64, 0).await;
    assert!(
        matches!(run.outcome, Err(RelayError::Unpublishable { ref message_id, .. }) if message_id.as_deref() == Some("3-1")),
        "{:?}",
        run.outcome
    );
    assert_eq!(
        run.reported.last(),
        Some(&Pos(3)),
        "the transactions before it"
    );
    let taken = run.broker.published();
    assert_eq!(
        ids(&taken).last(),
        Some(&"3-0"),
        "nothing after it is published"
    );
}

#[tokio::test(start_paused = true)]
async fn under_dead_letter_an_unpublishable_row_is_dead_lettered_in_stream_order() {
    let broker = StandInBroker::new().with_dead_letters("dlx");
    let inputs = stream_with_unpublishable(Some("3-1"));
    let run = run(broker, Script::new(&[]), inputs, 64, 1).await;
    run.outcome.expect("delivered");
    assert_eq!(run.reported.last(), Some(&Pos(7)));
    let taken = run.broker.published();
    let at = ids(&taken)
        .iter()
        .position(|id| *id == "3-1")
        .expect("dead letter");
    assert_eq!(&ids(&taken)[at - 1..=at + 1], ["3-0", "3-1", "3-2"]);
    assert_eq!(taken[at].message.exchange, "dlx");
    assert!(!taken[at].dead_letter_channel, "published in stream order");
    assert!(taken[at].message.body.is_empty(), "too large: no body");
}

#[tokio::test(start_paused = true)]
async fn an_unpublishable_row_without_an_id_stops_even_under_dead_letter() {
    let broker = StandInBroker::new().with_dead_letters("dlx");
    let run = run(
        broker,
        Script::new(&[]),
        stream_with_unpublishable(None),
        64,
        0,
    )
    .await;
    assert!(
        matches!(
            run.outcome,
            Err(RelayError::Unpublishable {
                message_id: None,
                ..
            })
        ),
        "{:?}",
        run.outcome
    );
    assert_eq!(run.reported.last(), Some(&Pos(3)));
}

#[tokio::test(start_paused = true)]
async fn a_stuck_message_is_published_alone_until_it_is_confirmed() {
    let inputs = stream(40, 5);
    let run = run_with(
        StandInBroker::new(),
        Script::new(&[]),
        inputs,
        64,
        0,
        Some("2-3"),
    )
    .await;
    run.outcome.expect("delivered");
    // Up to the stuck message one at a time, then the full window again.
    let taken = run.broker.published();
    assert_eq!(taken.len(), 200);
    let stuck = ids(&taken)
        .iter()
        .position(|id| *id == "2-3")
        .expect("published");
    let unanswered = run.broker.unanswered_at();
    assert!(
        unanswered[..=stuck].iter().all(|&n| n == 1),
        "alone until confirmed: {:?}",
        &unanswered[..=stuck]
    );
    assert_eq!(
        unanswered[stuck + 1..].iter().max(),
        Some(&64),
        "the full window again after it"
    );
    assert_eq!(run.reported.last(), Some(&Pos(40)));
}

// ---------------------------------------------------------------------------------
// The broker closing the publishing channel over one message (a 404, 406 or 403 on
// basic.publish): not a return, and every confirm in flight goes with the channel.

/// `stream(100, 5)` with message `3-2`'s body `size` bytes long (the others: 2 bytes).
fn stream_with_body(size: usize) -> Vec<Input<Pos>> {
    stream(100, 5)
        .into_iter()
        .map(|input| match input {
            Input::Publish {
                mut message,
                committed_at,
            } if message.message_id == "3-2" => {
                message.body = Bytes::from(vec![b'x'; size]);
                Input::Publish {
                    message,
                    committed_at,
                }
            }
            other => other,
        })
        .collect()
}

const TOO_LARGE: &str =
    "PRECONDITION_FAILED - message size 50 is larger than configured max size 40";

#[tokio::test(start_paused = true)]
async fn a_406_naming_a_size_names_the_message_of_that_size_and_teaches_the_limit() {
    let script = Script::new(&[(
        "3-2",
        Plan::Close {
            reply_code: 406,
            reply_text: TOO_LARGE,
        },
    )]);
    let run = run(StandInBroker::new(), script, stream_with_body(50), 64, 3).await;
    assert!(
        matches!(&run.outcome, Err(RelayError::Broker(BrokerError::PublishRefused { message_id, size: 50, reply_code: 406, .. })) if message_id == "3-2"),
        "{:?}",
        run.outcome
    );
    assert_eq!(
        run.outcome
            .as_ref()
            .err()
            .and_then(|e| e.stuck_message_id()),
        Some("3-2")
    );
    assert!(
        run.reported.iter().all(|&p| p <= Pos(3)),
        "{:?}",
        run.reported
    );
    assert_eq!(run.broker.learned_max_message_size(), Some(40));

    // The next session (the same broker: the limit is the process's) checks the body before
    // publishing it. Under halt it stops naming the row, as a body over --max-message-size
    // does, without publishing it again.
    let before = run.broker.published_count();
    let again = run_with(
        run.broker,
        Script::new(&[]),
        stream_with_body(50),
        64,
        0,
        Some("3-2"),
    )
    .await;
    assert!(
        matches!(&again.outcome, Err(RelayError::Unpublishable { message_id: Some(id), fault: MapProblem::TooLarge, .. }) if id == "3-2"),
        "{:?}",
        again.outcome
    );
    assert_eq!(again.reported.last(), Some(&Pos(3)), "everything before it");
    let retaken = &again.broker.published()[before..];
    assert!(
        !ids(retaken).contains(&"3-2"),
        "not published again: {:?}",
        ids(retaken)
    );
}

#[tokio::test(start_paused = true)]
async fn a_publish_that_finds_the_channel_closing_waits_past_earlier_acks_for_the_406() {
    // The 21st start fails with the channel's state before any confirm has come: the acks of
    // the 17 publishes before 3-2 come first, then the close over 3-2. The error names 3-2
    // and the limit is learned, as when the close is seen on a confirm first.
    let broker = StandInBroker::new().closing_after(20);
    let acts = async {
        broker.published_reaches(20).await;
        until_idle().await;
        broker.ack_oldest(17);
        until_idle().await;
        broker.close_channel(406, TOO_LARGE);
    };
    let run = run_timed(&broker, stream_with_body(50), 64, acts).await;
    assert!(
        matches!(&run.outcome, Err(RelayError::Broker(BrokerError::PublishRefused { message_id, size: 50, reply_code: 406, .. })) if message_id == "3-2"),
        "{:?}",
        run.outcome
    );
    assert_eq!(broker.learned_max_message_size(), Some(40));
}

#[tokio::test(start_paused = true)]
async fn under_dead_letter_a_body_over_the_learned_limit_is_dead_lettered_without_it() {
    let broker = StandInBroker::new().with_dead_letters("dlx");
    broker.learn_max_message_size(40);
    let run = run(broker, Script::new(&[]), stream_with_body(50), 64, 3).await;
    run.outcome.expect("delivered");
    assert_eq!(run.reported.last(), Some(&Pos(100)));
    let taken = run.broker.published();
    let letter = taken
        .iter()
        .find(|p| p.message.message_id == "3-2")
        .expect("its dead letter");
    assert_eq!(letter.message.exchange, "dlx");
    assert!(letter.message.body.is_empty(), "too large: no body");
    assert_eq!(
        letter.message.header(dl::REASON),
        Some(&HeaderValue::Text("too large: 50 bytes > limit 40".into()))
    );
}

const DENIED: &str = "ACCESS_REFUSED - access to exchange 'outbox' in vhost '/' refused";

#[tokio::test(start_paused = true)]
async fn a_close_among_many_names_the_newest_and_the_next_session_walks_them_alone_to_the_culprit()
{
    let script = || {
        Script::new(&[(
            "3-2",
            Plan::Close {
                reply_code: 403,
                reply_text: DENIED,
            },
        )])
    };
    let run = run(StandInBroker::new(), script(), stream(100, 5), 64, 3).await;
    let Err(RelayError::Broker(BrokerError::PublishRefusedAmong {
        last_message_id,
        unconfirmed,
        ..
    })) = &run.outcome
    else {
        panic!("{:?}", run.outcome);
    };
    assert!(*unconfirmed > 1, "{unconfirmed}");
    let published = ids(&run.broker.published())
        .iter()
        .map(|id| id.to_string())
        .collect::<Vec<_>>();
    let newest = published.last().expect("published");
    assert_eq!(last_message_id, newest, "the newest publish in flight");
    assert!(
        run.reported.iter().all(|&p| p <= Pos(3)),
        "{:?}",
        run.reported
    );

    // The next session publishes one at a time up to that message: the broker refuses the
    // culprit alone, and the error names it.
    let before = run.broker.published_count();
    let again = run_with(run.broker, script(), stream(100, 5), 64, 3, Some(newest)).await;
    assert!(
        matches!(&again.outcome, Err(RelayError::Broker(BrokerError::PublishRefused { message_id, reply_code: 403, .. })) if message_id == "3-2"),
        "{:?}",
        again.outcome
    );
    let alone = &again.broker.unanswered_at()[before..];
    assert!(alone.iter().all(|&n| n == 1), "{alone:?}");
}

#[tokio::test(start_paused = true)]
async fn under_dead_letter_a_refused_message_alone_in_flight_is_dead_lettered_on_a_new_channel() {
    let script = Script::new(&[(
        "3-2",
        Plan::Close {
            reply_code: 403,
            reply_text: DENIED,
        },
    )]);
    let broker = StandInBroker::new().with_dead_letters("dlx");
    // A session after one that named 3-4 among several: one at a time up to it.
    let run = run_with(broker, script, stream(100, 5), 64, 3, Some("3-4")).await;
    run.outcome.expect("delivered");
    assert_eq!(run.reported.last(), Some(&Pos(100)));
    assert_eq!(
        run.broker.reopened(),
        1,
        "a new publishing channel after the close"
    );
    let letters = dead_letter_channel_publishes(&run.broker);
    assert_eq!(ids(&letters), ["3-2"]);
    assert_eq!(
        letters[0].message.header(dl::REASON),
        Some(&HeaderValue::Text(format!(
            "refused: {DENIED} 403 exchange=outbox"
        )))
    );
    let unanswered = run.broker.unanswered_at();
    assert_eq!(
        unanswered.iter().max(),
        Some(&64),
        "the full window after 3-4"
    );
}

/// `stream(10, 3)` with message `4-1` routed to exchange `events.gone`.
fn stream_to_missing_exchange() -> Vec<Input<Pos>> {
    stream(10, 3)
        .into_iter()
        .map(|input| match input {
            Input::Publish {
                mut message,
                committed_at,
            } if message.message_id == "4-1" => {
                message.exchange = "events.gone".into();
                Input::Publish {
                    message,
                    committed_at,
                }
            }
            other => other,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_message_to_a_missing_exchange_is_never_published_and_halts_naming_it() {
    let broker = StandInBroker::new().without_exchange("events.gone");
    let run = run(
        broker,
        Script::new(&[]),
        stream_to_missing_exchange(),
        64,
        0,
    )
    .await;
    assert!(
        matches!(&run.outcome, Err(RelayError::Broker(BrokerError::RoutedToMissingExchange { message_id, exchange })) if message_id == "4-1" && exchange == "events.gone"),
        "{:?}",
        run.outcome
    );
    assert_eq!(
        run.outcome.as_ref().err().map(|e| e.recovery()),
        Some(crate::error::SupervisorAction::Retry)
    );
    assert_eq!(run.reported.last(), Some(&Pos(4)), "everything before it");
    let taken = run.broker.published();
    assert_eq!(ids(&taken).last(), Some(&"4-0"), "nothing from it on");
}

#[tokio::test(start_paused = true)]
async fn under_dead_letter_a_message_to_a_missing_exchange_is_dead_lettered_in_stream_order() {
    let broker = StandInBroker::new()
        .with_dead_letters("dlx")
        .without_exchange("events.gone");
    let run = run(
        broker,
        Script::new(&[]),
        stream_to_missing_exchange(),
        64,
        1,
    )
    .await;
    run.outcome.expect("delivered");
    assert_eq!(run.reported.last(), Some(&Pos(10)));
    let taken = run.broker.published();
    let letter = taken
        .iter()
        .find(|p| p.message.message_id == "4-1")
        .expect("its dead letter");
    assert_eq!(letter.message.exchange, "dlx");
    assert_eq!(
        letter.message.header(dl::REASON),
        Some(&HeaderValue::Text("exchange missing: events.gone".into()))
    );
    assert!(!taken.iter().any(|p| p.message.exchange == "events.gone"));
}

#[tokio::test]
async fn a_batch_with_an_unpublishable_row_publishes_nothing_under_halt() {
    let broker = StandInBroker::new();
    let batch = vec![
        Ok(message("a")),
        Err(Box::new(Unpublishable {
            original: Some(message("b")),
            rejection: Rejection::Unmappable {
                error: "column \"event_type\" is NULL".into(),
            },
            message_id: Some("b".into()),
            problem: "Cannot publish row id b".into(),
            fault: MapProblem::Null,
        })),
        Ok(message("c")),
    ];
    let outcome = deliver_batch(
        &broker,
        batch,
        Duration::from_secs(5),
        &RelayMetrics::for_batches(),
    )
    .await;
    assert!(
        matches!(outcome, Err(RelayError::Unpublishable { .. })),
        "{outcome:?}"
    );
    assert_eq!(broker.published_count(), 0);
}

// ---------------------------------------------------------------------------------
// The confirm timeout, on paused time: it bounds the age of the oldest unsettled publish.

const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// How a timed run ended.
struct Timed {
    outcome: Result<(), RelayError>,
    /// From the start of the run (the first publish starts at once) to the outcome.
    after: Duration,
    /// The newest token reported.
    reported: Option<Pos>,
}

/// Runs `deliver` over `inputs` with `window` and the 30 s confirm timeout while `broker_acts`
/// plays the broker's part (answers, blocks); until the loop ends. Run it on paused time:
/// the clock jumps to the next timer whenever every task waits.
async fn run_timed(
    broker: &StandInBroker,
    inputs: Vec<Input<Pos>>,
    window: usize,
    broker_acts: impl Future<Output = ()>,
) -> Timed {
    let (tx, rx) = mpsc::channel(8);
    let (acked_tx, acked) = watch::channel(Acked::default());
    let options = DeliveryOptions {
        window,
        confirm_timeout: CONFIRM_TIMEOUT,
        stuck: None,
        health: None,
    };
    let metrics = RelayMetrics::for_batches();
    let began = Instant::now();
    let feed = async move {
        for input in inputs {
            if tx.send(input).await.is_err() {
                return;
            }
        }
    };
    let delivering = async {
        let outcome = deliver(broker, &options, &metrics, rx, &acked_tx).await;
        (outcome, began.elapsed())
    };
    let acting = async {
        broker_acts.await;
        std::future::pending::<Infallible>().await
    };
    let ((outcome, after), ()) = tokio::select! {
        ended = async { tokio::join!(delivering, feed) } => ended,
        never = acting => match never {},
    };
    let reported = acked.borrow().token;
    Timed {
        outcome,
        after,
        reported,
    }
}

/// The run timed out on `message_id`, `seconds` after it started (within a second: the clock
/// is paused, so only the loop's own order of events can add to it).
fn assert_timed_out(run: &Timed, message_id: &str, seconds: u64) {
    assert!(
        matches!(&run.outcome, Err(RelayError::Broker(BrokerError::ConfirmTimeout { message_id: id, .. })) if id == message_id),
        "{:?}",
        run.outcome
    );
    let expected = Duration::from_secs(seconds);
    assert!(
        run.after >= expected && run.after < expected + Duration::from_secs(1),
        "timed out after {:?}, expected {expected:?}",
        run.after
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_window_the_broker_never_answers_times_out_at_the_confirm_timeout() {
    let broker = StandInBroker::new();
    let run = run_timed(&broker, stream(300, 7), 1024, async {}).await;
    assert_timed_out(&run, "0-0", 30);
    assert_eq!(broker.counts(), (1024, 1024), "a full window, no answer");
    assert_eq!(run.reported, None);
}

#[tokio::test(start_paused = true)]
async fn answers_trickling_in_without_a_passing_barrier_do_not_hold_off_the_timeout() {
    // A broker draining credit slowly: it answers the oldest publish every 20 s, but the
    // barrier's round trip never comes back and the full window leaves no room for a witness,
    // so nothing settles. Were each answer to restart the timeout (20 s < 30 s), the loop
    // would wait as long as answers kept coming, with nothing confirmed.
    let broker = StandInBroker::new().never_answering_round_trips();
    let trickle = async {
        loop {
            tokio::time::sleep(Duration::from_secs(20)).await;
            broker.ack_oldest(1);
        }
    };
    let run = tokio::time::timeout(
        Duration::from_secs(600),
        run_timed(&broker, stream(300, 7), 1024, trickle),
    )
    .await
    .expect("the confirm timeout fires while answers trickle in");
    assert_timed_out(&run, "0-0", 30);
    assert_eq!(
        broker.counts(),
        (1024, 1023),
        "one answer came in before the timeout, 30 s after the first publish"
    );
    assert_eq!(run.reported, None, "nothing settled");
}

#[tokio::test(start_paused = true)]
async fn a_blocked_connection_pauses_the_timeout_until_it_is_unblocked() {
    // Blocked 10 s after the window filled, for 60 s: the front publish's 30 s pass inside
    // the block. The timeout runs again from the unblock: nothing settles, so it fires once,
    // 30 s after it.
    let broker = StandInBroker::new();
    let alarm = async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        broker.set_blocked(true);
        tokio::time::sleep(Duration::from_secs(60)).await;
        broker.set_blocked(false);
    };
    let run = run_timed(&broker, stream(300, 7), 1024, alarm).await;
    assert_timed_out(&run, "0-0", 10 + 60 + 30);
}

#[tokio::test(start_paused = true)]
async fn an_unblock_that_comes_with_an_answer_restarts_the_timeout_from_the_unblock() {
    // Blocked for 60 s, then unblocked in the same instant as an answer arrives (the broker
    // resumes and confirms at once). The loop takes the answer first; the timeout must still
    // run from the unblock, not from the first publish (found by faults.rs s12: the relay
    // reconnected 0.15 s after an alarm cleared, with a 3 s timeout). Nothing settles after
    // (round trips never come back), so it fires 30 s after the unblock.
    let broker = StandInBroker::new().never_answering_round_trips();
    let alarm = async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        broker.set_blocked(true);
        tokio::time::sleep(Duration::from_secs(60)).await;
        broker.ack_oldest(1);
        broker.set_blocked(false);
    };
    let run = run_timed(&broker, stream(300, 7), 1024, alarm).await;
    assert_timed_out(&run, "0-0", 10 + 60 + 30);
}

#[tokio::test(start_paused = true)]
async fn a_healthy_full_window_that_runs_longer_than_the_timeout_is_never_timed_out() {
    // 8 answers a second with a window of 64: every publish settles within 8 s of its start,
    // while the whole run takes 250 s, over eight times the timeout.
    let broker = StandInBroker::new();
    let steady = async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            broker.ack_oldest(8);
        }
    };
    let run = run_timed(&broker, stream(200, 10), 64, steady).await;
    run.outcome.expect("delivered");
    assert_eq!(run.reported, Some(Pos(200)));
    assert!(
        run.after >= Duration::from_secs(240),
        "the run lasted {:?}",
        run.after
    );
    assert_eq!(broker.most_unanswered(), 64, "the window was full");
}

// ---------------------------------------------------------------------------------
// Answers the test gives itself, publish by publish: each step waits for what the loop must
// have done by then, never for a number of scheduler turns.

#[tokio::test(start_paused = true)]
async fn a_return_carried_by_a_later_confirm_of_the_same_ack_fails_the_returned_publish() {
    // One multiple ack answers 0-0, 0-1 and 0-2 at once, and 0-0's return rides on 0-2's
    // confirm: 0-0's own answer, taken first, must not settle it as delivered.
    let broker = StandInBroker::new();
    let one_ack_frame = async {
        broker.published_reaches(3).await;
        // No await between them: the loop sees the three answers together.
        broker.ack(0);
        broker.ack(1);
        broker.answer(2, true, Some(broker.unroutable(0)));
    };
    let run = run_timed(&broker, stream(1, 3), 3, one_ack_frame).await;
    assert!(
        matches!(&run.outcome, Err(RelayError::Broker(BrokerError::Returned { message_id, .. })) if message_id == "0-0"),
        "{:?}",
        run.outcome
    );
    assert_eq!(run.reported, None, "nothing acknowledged");
}

#[tokio::test(start_paused = true)]
async fn answers_out_of_order_settle_in_publish_order_and_a_nack_stops_at_its_own_publish() {
    let broker = StandInBroker::new();
    let answers = async {
        broker.published_reaches(2).await;
        // 0-1 answered before 0-0: nothing settles, so the window (2) does not move on.
        broker.ack(1);
        until_idle().await;
        assert_eq!(broker.counts(), (2, 1), "no publish past the full window");
        broker.ack(0);
        broker.published_reaches(4).await;
        // 1-1 nacked before 1-0 is answered: 1-0 still settles, and the loop stops at 1-1.
        broker.nack(3);
        until_idle().await;
        broker.ack(2);
    };
    let run = run_timed(&broker, stream(2, 2), 2, answers).await;
    assert!(
        matches!(&run.outcome, Err(RelayError::Broker(BrokerError::Nacked { message_id })) if message_id == "1-1"),
        "{:?}",
        run.outcome
    );
    assert_eq!(run.reported, Some(Pos(1)), "the transaction before it");
}

/// Acks publishes `indexes`, each carrying its own return (one ack frame).
fn return_each(broker: &StandInBroker, indexes: std::ops::Range<usize>) {
    for index in indexes {
        broker.answer(index, true, Some(broker.unroutable(index)));
    }
}

#[tokio::test(start_paused = true)]
async fn a_dead_letter_slow_to_confirm_holds_back_no_return_behind_it() {
    // Twenty unroutable rows, their returns in two frames. The first ten dead letters stay
    // unconfirmed (a slow dead-letter queue) while the second frame arrives: its returns are
    // still taken and dead-lettered, so all twenty dead letters are in flight together.
    let broker = StandInBroker::new().with_dead_letters("dlx");
    let returns_in_two_frames = async {
        broker.published_reaches(20).await;
        return_each(&broker, 0..10);
        broker.published_reaches(30).await;
        return_each(&broker, 10..20);
        broker.published_reaches(40).await;
        for index in 20..40 {
            broker.ack(index);
        }
    };
    let run = run_timed(&broker, stream(1, 20), 64, returns_in_two_frames).await;
    run.outcome.expect("delivered");
    assert_eq!(run.reported, Some(Pos(1)));
    assert_eq!(broker.most_unanswered_dead_letters(), 20);
}

#[tokio::test(start_paused = true)]
async fn a_closed_dead_letter_channel_ends_the_session_as_a_broker_error_acknowledging_nothing() {
    // The dead-letter exchange vanished: the broker closes the dead-letter channel. That is
    // no refusal of a publish on the publishing channel, which stays as it is.
    let broker = StandInBroker::new().with_dead_letters("dlx");
    let closes = async {
        broker.published_reaches(5).await;
        return_each(&broker, 0..5);
        broker.published_reaches(10).await;
        broker.close_dead_letter_channel(404, "NOT_FOUND - no exchange 'dlx' in vhost '/'");
    };
    let run = run_timed(&broker, stream(1, 5), 64, closes).await;
    assert!(
        matches!(&run.outcome, Err(RelayError::Broker(BrokerError::Failed(text)))
            if text == "RabbitMQ closed the dead-letter channel: 404 NOT_FOUND - no exchange 'dlx' in vhost '/'"),
        "{:?}",
        run.outcome
    );
    assert_eq!(run.reported, None, "nothing acknowledged");
    assert_eq!(
        broker.reopened(),
        0,
        "the publishing channel was not closed"
    );
}
