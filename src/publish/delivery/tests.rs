//! The delivery loop's own logic, in process, against a stand-in publisher that answers as
//! a broker may: late, out of order, with nacks, and with returns riding on another
//! publish's confirm. Every integration test runs the same loop against a real RabbitMQ;
//! these pin down what the loop does with each answer, at a full window.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::*;
use crate::contract::message::{HeaderValue, Rejection};
use crate::error::MapProblem;
use crate::publish::dead_letter::{headers as dl, ReturnedContent};
use crate::publish::publisher::ReturnedMessage;
use crate::publish::queue::Returned;

/// A test token: the position of an ack point (folds to the highest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Pos(u64);

impl AckToken for Pos {
    fn fold(&mut self, newer: Self) {
        self.0 = self.0.max(newer.0);
    }
}

/// What the stand-in does with a publish, by message id.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Plan {
    Ack,
    Nack,
    /// Acked, but returned as unroutable; the return rides on the confirm `later` publishes
    /// after it (0: its own), as lapin may attach it.
    Return {
        later: usize,
    },
}

/// One publish the stand-in took.
#[derive(Clone)]
struct Taken {
    message_id: String,
    exchange: String,
    /// Published on the dead-letter channel.
    dead_letter_channel: bool,
    outgoing: Outgoing,
}

#[derive(Default)]
struct State {
    taken: Vec<Taken>,
    /// Answers not given yet, by publish index.
    waiting: HashMap<usize, oneshot::Sender<Result<Answer, RelayError>>>,
    /// Returns to attach to the answer of a later publish: (carrier index, return).
    riding: Vec<(usize, ReturnedMessage)>,
    most_unanswered: usize,
    /// For each publish, how many were unanswered once it was taken (itself included).
    unanswered_at: Vec<usize>,
}

/// A broker stand-in: publishes are recorded, and answered by [`Broker::answer_some`]
/// according to `plans` (default: ack) whenever the loop has nothing else to do.
#[derive(Clone)]
struct Broker {
    state: Arc<Mutex<State>>,
    plans: Arc<HashMap<String, Plan>>,
    dead_letters: Option<lapin::types::ShortString>,
    blocked: watch::Receiver<bool>,
    blocked_tx: Arc<watch::Sender<bool>>,
    /// Whether round trips come back (at once) or never: a broker that reads nothing more
    /// from the connection never answers the barrier's request.
    round_trips_pass: bool,
}

/// A round trip that passes at once, or never.
struct FakeRoundTrip {
    passes: bool,
}

impl Future for FakeRoundTrip {
    type Output = Result<(), RelayError>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        match self.passes {
            true => Poll::Ready(Ok(())),
            false => Poll::Pending,
        }
    }
}

struct FakePending(oneshot::Receiver<Result<Answer, RelayError>>);

impl Pending for FakePending {
    async fn answer(&mut self) -> Result<Answer, RelayError> {
        (&mut self.0)
            .await
            .unwrap_or_else(|_| Err(RelayError::Bug("the stand-in dropped an answer".into())))
    }
}

impl Broker {
    fn new(plans: &[(&str, Plan)], dead_letters: bool) -> Self {
        let (blocked_tx, blocked) = watch::channel(false);
        Self {
            state: Arc::default(),
            plans: Arc::new(plans.iter().map(|(id, p)| (id.to_string(), *p)).collect()),
            dead_letters: dead_letters.then(|| "dlx".into()),
            blocked,
            blocked_tx: Arc::new(blocked_tx),
            round_trips_pass: true,
        }
    }

    /// A broker that never answers a round trip: no barrier passes, unless a later publish
    /// witnesses it.
    fn never_answering_round_trips(mut self) -> Self {
        self.round_trips_pass = false;
        self
    }

    /// Blocks (`true`) or unblocks publishing, as connection.blocked / unblocked.
    fn set_blocked(&self, blocked: bool) {
        self.blocked_tx.send_replace(blocked);
    }

    /// Acks the `n` oldest publishes not answered yet.
    fn ack_oldest(&self, n: usize) {
        let mut state = self.state.lock().expect("state");
        let mut indexes: Vec<usize> = state.waiting.keys().copied().collect();
        indexes.sort_unstable();
        for index in indexes.into_iter().take(n) {
            if let Some(tx) = state.waiting.remove(&index) {
                let _ = tx.send(Ok(Answer {
                    acked: true,
                    returned: None,
                }));
            }
        }
    }

    fn take(&self, outgoing: Outgoing, dead_letter_channel: bool) -> FakePending {
        let (tx, rx) = oneshot::channel();
        let mut state = self.state.lock().expect("state");
        let message_id = outgoing
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default();
        let index = state.taken.len();
        state.taken.push(Taken {
            message_id,
            exchange: outgoing.exchange.to_string(),
            dead_letter_channel,
            outgoing,
        });
        state.waiting.insert(index, tx);
        state.most_unanswered = state.most_unanswered.max(state.waiting.len());
        let unanswered = state.waiting.len();
        state.unanswered_at.push(unanswered);
        FakePending(rx)
    }

    /// Answers every publish not answered yet, in a scrambled order (a multiple ack's
    /// confirms resolve in no particular order), holding back the newest `hold` of them.
    fn answer_some(&self, hold: usize, seed: &mut u64) {
        let mut state = self.state.lock().expect("state");
        let mut indexes: Vec<usize> = state.waiting.keys().copied().collect();
        indexes.sort_unstable();
        indexes.truncate(indexes.len().saturating_sub(hold));
        // Returns first, so that each rides on its carrier's answer.
        for &index in &indexes {
            let taken = state.taken[index].clone();
            let plan = match taken.dead_letter_channel {
                true => Plan::Ack,
                false => self
                    .plans
                    .get(&taken.message_id)
                    .copied()
                    .unwrap_or(Plan::Ack),
            };
            if let Plan::Return { later } = plan {
                let carrier = index + later;
                let returned = ReturnedMessage {
                    message_id: taken.message_id.clone(),
                    returned: Returned {
                        exchange: taken.exchange.clone(),
                        routing_key: taken.outgoing.routing_key.to_string(),
                        reply_code: 312,
                        reply_text: "NO_ROUTE".into(),
                        content: ReturnedContent {
                            properties: taken.outgoing.properties.clone(),
                            body: taken.outgoing.body.clone(),
                        },
                    },
                };
                state.riding.push((carrier, returned));
            }
        }
        for step in 0..indexes.len() {
            // A small LCG: scrambles reproducibly.
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let pick = step + (*seed >> 33) as usize % (indexes.len() - step);
            indexes.swap(step, pick);
        }
        for index in indexes {
            let taken = &state.taken[index];
            let acked =
                taken.dead_letter_channel || self.plans.get(&taken.message_id) != Some(&Plan::Nack);
            let ride = state
                .riding
                .iter()
                .position(|(carrier, _)| *carrier == index);
            let returned = ride.map(|at| state.riding.remove(at).1);
            if let Some(tx) = state.waiting.remove(&index) {
                let _ = tx.send(Ok(Answer { acked, returned }));
            }
        }
    }

    /// (publishes taken, publishes not answered yet).
    fn counts(&self) -> (usize, usize) {
        let state = self.state.lock().expect("state");
        (state.taken.len(), state.waiting.len())
    }

    fn taken(&self) -> Vec<Taken> {
        self.state.lock().expect("state").taken.clone()
    }

    fn most_unanswered(&self) -> usize {
        self.state.lock().expect("state").most_unanswered
    }
}

impl Publisher for Broker {
    type Pending = FakePending;
    type RoundTrip = FakeRoundTrip;

    fn start(
        &self,
        message: Outgoing,
    ) -> impl std::future::Future<Output = Result<FakePending, RelayError>> + Send {
        std::future::ready(Ok(self.take(message, false)))
    }

    fn start_dead_letter(
        &self,
        message: Outgoing,
    ) -> impl std::future::Future<Output = Result<FakePending, RelayError>> + Send {
        std::future::ready(Ok(self.take(message, true)))
    }

    fn dead_letter_exchange(&self) -> Option<&lapin::types::ShortString> {
        self.dead_letters.as_ref()
    }

    fn round_trip(&self) -> Self::RoundTrip {
        FakeRoundTrip {
            passes: self.round_trips_pass,
        }
    }

    fn blocked(&self) -> watch::Receiver<bool> {
        self.blocked.clone()
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
    broker: Broker,
}

/// Runs `deliver` over `inputs` with `window`. Whenever the loop and the source are idle
/// (waiting for answers: nothing was published over a few turns of the single-threaded
/// runtime), the stand-in answers all but the newest `hold` publishes, or all of them when
/// no more than `hold` wait: the window fills before any answer comes.
async fn run(broker: Broker, inputs: Vec<Input<Pos>>, window: usize, hold: usize) -> Run {
    run_with(broker, inputs, window, hold, None).await
}

async fn run_with(
    broker: Broker,
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
    let answering = {
        let broker = broker.clone();
        async move {
            let mut seed = 7;
            loop {
                let mut counts = broker.counts();
                loop {
                    for _ in 0..8 {
                        tokio::task::yield_now().await;
                    }
                    let now = broker.counts();
                    if now == counts {
                        break;
                    }
                    counts = now;
                }
                let (_, unanswered) = counts;
                broker.answer_some(if unanswered > hold { hold } else { 0 }, &mut seed);
            }
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

fn ids(taken: &[Taken]) -> Vec<&str> {
    taken.iter().map(|t| t.message_id.as_str()).collect()
}

#[tokio::test]
async fn a_full_window_publishes_in_order_and_acknowledges_every_transaction() {
    let window = 64;
    let broker = Broker::new(&[], false);
    // The stand-in always holds some answers back: the window stays full.
    let run = run(broker, stream(500, 7), window, 5).await;
    run.outcome.expect("delivered");
    let taken = run.broker.taken();
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

#[tokio::test]
async fn a_nack_in_a_full_window_acknowledges_nothing_after_it() {
    // 3-4 is nacked: transaction 3 (ack point 4) and everything after must stay unacknowledged.
    let broker = Broker::new(&[("3-4", Plan::Nack)], false);
    let run = run(broker, stream(200, 7), 64, 3).await;
    assert!(
        matches!(run.outcome, Err(RelayError::Nacked { ref message_id }) if message_id == "3-4"),
        "{:?}",
        run.outcome
    );
    assert!(
        run.reported.iter().all(|&p| p <= Pos(3)),
        "{:?}",
        run.reported
    );
}

#[tokio::test]
async fn a_return_riding_on_a_later_confirm_fails_the_returned_message() {
    // 5-2's own confirm is an ack; its return rides on the confirm of 5-5, three publishes
    // later. The loop must not count 5-2 delivered.
    let broker = Broker::new(&[("5-2", Plan::Return { later: 3 })], false);
    let run = run(broker, stream(100, 7), 64, 0).await;
    assert!(
        matches!(run.outcome, Err(RelayError::Returned { ref message_id, .. }) if message_id == "5-2"),
        "{:?}",
        run.outcome
    );
    assert!(
        run.reported.iter().all(|&p| p <= Pos(5)),
        "{:?}",
        run.reported
    );
}

#[tokio::test]
async fn under_dead_letter_a_returned_message_goes_to_the_dead_letter_exchange_and_delivery_goes_on(
) {
    let broker = Broker::new(
        &[
            ("2-1", Plan::Return { later: 0 }),
            ("7-0", Plan::Return { later: 2 }),
        ],
        true,
    );
    let run = run(broker, stream(50, 4), 32, 2).await;
    run.outcome.expect("delivered");
    assert_eq!(run.reported.last(), Some(&Pos(50)));
    let letters: Vec<Taken> = run
        .broker
        .taken()
        .into_iter()
        .filter(|t| t.dead_letter_channel)
        .collect();
    assert_eq!(ids(&letters), ["2-1", "7-0"]);
    for letter in &letters {
        assert_eq!(letter.exchange, "dlx");
        let headers = letter
            .outgoing
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        let reason = headers.inner().get(dl::REASON).cloned();
        assert_eq!(
            reason,
            Some(lapin::types::AMQPValue::LongString(
                "unroutable: NO_ROUTE 312 exchange=outbox routing_key=Created".into()
            ))
        );
    }
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

#[tokio::test]
async fn under_halt_an_unpublishable_row_stops_after_everything_before_it_is_acknowledged() {
    let broker = Broker::new(&[], false);
    let run = run(broker, stream_with_unpublishable(Some("3-1")), 64, 0).await;
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
    let taken = run.broker.taken();
    assert_eq!(
        ids(&taken).last(),
        Some(&"3-0"),
        "nothing after it is published"
    );
}

#[tokio::test]
async fn under_dead_letter_an_unpublishable_row_is_dead_lettered_in_stream_order() {
    let broker = Broker::new(&[], true);
    let run = run(broker, stream_with_unpublishable(Some("3-1")), 64, 1).await;
    run.outcome.expect("delivered");
    assert_eq!(run.reported.last(), Some(&Pos(7)));
    let taken = run.broker.taken();
    let at = ids(&taken)
        .iter()
        .position(|id| *id == "3-1")
        .expect("dead letter");
    assert_eq!(&ids(&taken)[at - 1..=at + 1], ["3-0", "3-1", "3-2"]);
    assert_eq!(taken[at].exchange, "dlx");
    assert!(!taken[at].dead_letter_channel, "published in stream order");
    assert!(taken[at].outgoing.body.is_empty(), "too large: no body");
}

#[tokio::test]
async fn an_unpublishable_row_without_an_id_stops_even_under_dead_letter() {
    let broker = Broker::new(&[], true);
    let run = run(broker, stream_with_unpublishable(None), 64, 0).await;
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

#[tokio::test]
async fn a_stuck_message_is_published_alone_until_it_is_confirmed() {
    let broker = Broker::new(&[], false);
    let run = run_with(broker, stream(40, 5), 64, 0, Some("2-3")).await;
    run.outcome.expect("delivered");
    // Up to the stuck message one at a time, then the full window again.
    let taken = run.broker.taken();
    assert_eq!(taken.len(), 200);
    let stuck = ids(&taken)
        .iter()
        .position(|id| *id == "2-3")
        .expect("published");
    let unanswered = run
        .broker
        .state
        .lock()
        .expect("state")
        .unanswered_at
        .clone();
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

#[tokio::test]
async fn a_batch_with_an_unpublishable_row_publishes_nothing_under_halt() {
    let broker = Broker::new(&[], false);
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
    assert!(broker.taken().is_empty());
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
    broker: &Broker,
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
        matches!(&run.outcome, Err(RelayError::ConfirmTimeout { message_id: id, .. }) if id == message_id),
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
    let broker = Broker::new(&[], false);
    let run = run_timed(&broker, stream(300, 7), 1024, async {}).await;
    assert_timed_out(&run, "0-0", 30);
    assert_eq!(broker.counts(), (1024, 1024), "a full window, no answer");
    assert_eq!(run.reported, None);
}

#[tokio::test(start_paused = true)]
async fn answers_trickling_in_without_a_passing_barrier_do_not_hold_off_the_timeout() {
    // A broker draining credit slowly: it answers the oldest publish every 20 s, but the
    // barrier's round trip never comes back and the full window leaves no room for a witness,
    // so nothing settles. Each answer used to restart the timeout (20 s < 30 s): the loop
    // waited as long as answers kept coming, with nothing confirmed.
    let broker = Broker::new(&[], false).never_answering_round_trips();
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
    let broker = Broker::new(&[], false);
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
    let broker = Broker::new(&[], false).never_answering_round_trips();
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
    let broker = Broker::new(&[], false);
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
