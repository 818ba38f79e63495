//! The reference consumer: a queue in, effects in the consumer's database out, each message
//! applied effectively once.
//!
//! ```text
//!  RabbitMQ queue ──basic.consume (prefetch)──▶ dispatch ──lane = hash(order key) % N──▶ worker k
//!                                                 │ no message_id, or a NUL byte in it or  │
//!                                                 │ x-outbox-seq: dead-lettered            │
//!                                                 ▼ (--dead-letter-exchange; else reject)  ▼
//!     worker k (own PostgreSQL connection), the messages waiting in its lane (up to the
//!     batch size), in lane order, in one transaction:
//!       BEGIN
//!         per message: SELECT inbox_claim(consumer, message_id, seq)
//!                        true  → the effect
//!                        false → nothing (a duplicate: its effect committed before)
//!       COMMIT; then basic.ack of each
//!     an error that can pass: the lane keeps the batch (never gives it back) and runs it
//!     again after a backoff; an effect failing on a message's data: that message to the
//!     dead-letter exchange (confirmed, then acked), the rest of the batch again
//! ```
//!
//! Invariants:
//! 1. **Never acknowledge before commit.** A delivery is acked only after the transaction that
//!    claimed it committed (or found it claimed already). A crash anywhere before the ack
//!    leaves the message unacknowledged: RabbitMQ delivers it again, and if its transaction
//!    had committed, the claim returns false and the copy is dropped.
//! 2. **The claim and the effect commit together**, in one transaction: an effect without its
//!    inbox row, or an inbox row without its effect, cannot exist.
//! 3. **Per-aggregate order.** Messages with the same order key (`x-aggregate-id`, else the
//!    `message_id`) go to the same lane, and a lane applies its messages in delivery order,
//!    one transaction at a time: two messages of one aggregate are never applied concurrently
//!    or out of the order the queue delivered them in. Across aggregates, lanes run in
//!    parallel. A batch is what already waits in the lane, never more: an idle consumer
//!    applies each message as it comes, a busy one shares a commit (a WAL flush) over many.
//! 4. **A failure of the database never gives a delivery back.** RabbitMQ 4 counts every
//!    give-back (a nack or reject with requeue, a closed channel or connection) toward a
//!    quorum queue's delivery limit, 20 by default, and drops or dead-letters the message
//!    past it (docs/consumers.md, "Quorum queues: the delivery limit"). So a PostgreSQL error
//!    that may pass (a lost connection, a deadlock, a timeout, a full disk) holds the lane:
//!    it keeps its batch unacknowledged and runs it again after a backoff, on a new
//!    connection if the old one broke, for as long as it takes; the lanes fill, the prefetch
//!    runs out, and the broker stops sending. A lost broker connection ends the session
//!    (its deliveries go back: once per loss) and a new one starts after a backoff. A stop-class
//!    error (a missing inbox or queue, an effect statement that fails for every message)
//!    ends the consumer.
//! 5. **A poison message goes to the dead-letter exchange, once it is confirmed there.** An
//!    effect that fails on a message's data (SQLSTATE class 22, 23, 44 or P0: it would fail
//!    the same way every time) is published to `--dead-letter-exchange` with the reason, and
//!    acknowledged only once the broker confirmed it there; the lane goes on with the rest.
//!    Without a dead-letter exchange such a message stops the consumer, as any definite
//!    error does.
//!
//! 6. **A vanished replica costs about the peer timeout, never hours.** Replica A's host dies
//!    inside a transaction: its claims stay uncommitted, and B's claim of a redelivered copy
//!    (an INSERT that waits for A's row) waits until the server ends A's session. The peer
//!    timeout T bounds both halves: RabbitMQ declares A dead after 2-3 missed heartbeats of
//!    T/2 and hands its deliveries to B, and PostgreSQL's keepalives (or user timeout) on A's
//!    session end it, and its row locks, within about T. The statement timeout bounds every
//!    claim and effect statement besides (a wait nobody else ends): a statement cancelled by
//!    it (57014) or by a lock timeout (55P03) holds the lane and is tried again, invariant 4.
//!
//! Both are the process's connection policy (`outbox_common::liveness`), which every
//! connection reads where it is opened: [`run`] sets it from [`ConsumerConfig`] before its
//! first connection, so the binary and a library user get the same; a process running
//! several consumers gives them the same timeouts (the last `run` to start sets them).
//!
//! Shutdown (the token): the consumer cancels its subscription, every worker finishes the
//! messages already handed to it (bounded by the shutdown timeout; a lane holding its batch
//! stops waiting at once), and the connection closes; deliveries not yet applied go back to
//! the queue unacknowledged.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::try_join_all;
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Acker, BasicProperties, Channel, Confirmation, ExchangeKind};
use lapin::{Connection, ConnectionProperties};
use outbox_common::backoff::Backoff;
use outbox_common::error::chain;
use outbox_common::liveness::{self, PeerTimeout, Policy};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};
use tokio_util::sync::CancellationToken;

use crate::effect::Effect;
use crate::error::{
    database_error, is_poison, is_serialization_failure, is_transient, provisioning, InboxError,
};
use crate::failpoint::{failpoint, switched_on, AFTER_COMMIT, BEFORE_COMMIT, IGNORE_CLAIMS};
use crate::message::{InboxMessage, Refusal};
use crate::sql::InboxTable;

/// How long connecting to PostgreSQL or RabbitMQ, or closing a connection, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How many times a transaction that failed to serialize (or deadlocked) runs again at once,
/// on the same connection, before the session gives up.
const SERIALIZATION_RETRIES: u32 = 10;
/// AMQP reply code 404 NOT_FOUND: a consume from a missing queue.
const NOT_FOUND: u16 = 404;

/// What `log` lines a test or an operator can look for.
pub mod log {
    /// A session started consuming.
    pub const CONSUMING: &str = "consuming queue=";
    /// A copy of a message already applied was dropped (debug level).
    pub const DUPLICATE: &str = "duplicate dropped";
    /// A delivery without a message_id was rejected.
    pub const REJECTED: &str = "rejected a delivery without a message_id";
    /// A delivery whose message_id or x-outbox-seq PostgreSQL cannot store was rejected.
    pub const REJECTED_NUL: &str = "rejected a delivery with a NUL byte in its";
    /// A lane keeps its batch after an error that can pass, and will run it again.
    pub const HOLDING: &str = "applying failed; the lane keeps its deliveries and tries again";
    /// A message its effect fails on went to the dead-letter exchange.
    pub const DEAD_LETTERED: &str = "dead-lettered a message its effect fails on";
    /// A dead letter could not be placed yet (unroutable or refused); tried again.
    pub const DEAD_LETTER_WAITING: &str = "the dead-letter exchange did not take a dead letter";
}

/// Where and how to consume.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub database_url: String,
    pub amqp_url: String,
    pub queue: String,
    /// The name this consumer's rows carry in the inbox: one per service applying the
    /// messages, the same for all of its replicas.
    pub consumer: String,
    pub table: InboxTable,
    /// Unacknowledged deliveries RabbitMQ sends ahead (basic.qos).
    pub prefetch: u16,
    /// Lanes: workers applying messages in parallel, each with its own PostgreSQL connection.
    pub concurrency: usize,
    /// Messages one transaction applies at most: a lane takes what is waiting for it, up to
    /// this, so a backlog shares one commit (one WAL flush) over many messages.
    pub batch_size: usize,
    pub max_backoff: Duration,
    pub shutdown_timeout: Duration,
    /// How soon a vanished peer is given up, on every connection and at both ends; the AMQP
    /// heartbeat is half of it unless the URL sets `heartbeat=` (`--peer-timeout`, default
    /// 5 s). The process's: [`run`] sets it.
    pub peer_timeout: PeerTimeout,
    /// PostgreSQL's `statement_timeout` on every connection of the process, lock waits
    /// included (`--statement-timeout`, default 60 s); `None`: the server's own. The
    /// process's: [`run`] sets it.
    pub statement_timeout: Option<Duration>,
    /// Where a message goes that its effect fails on (its data: it would fail every time),
    /// and a delivery without a message_id: published there with confirms, then
    /// acknowledged (`--dead-letter-exchange`). `None`: such a message stops the consumer
    /// and the refused delivery is rejected to the queue's own dead-letter exchange.
    pub dead_letter_exchange: Option<String>,
}

impl ConsumerConfig {
    /// The connection policy this consumer needs.
    pub fn connection_policy(&self) -> Policy {
        Policy {
            peer_timeout: self.peer_timeout,
            statement_timeout: self.statement_timeout,
        }
    }
}

/// What the consumer did, over all of its sessions.
#[derive(Debug, Default)]
pub struct Counters {
    applied: AtomicU64,
    duplicates: AtomicU64,
    rejected: AtomicU64,
    dead_lettered: AtomicU64,
}

/// A reading of [`Counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Messages claimed and applied (committed).
    pub applied: u64,
    /// Copies of messages applied before, dropped.
    pub duplicates: u64,
    /// Deliveries refused (no message_id, or a NUL byte in it or in x-outbox-seq), rejected
    /// or dead-lettered.
    pub rejected: u64,
    /// Messages their effect failed on, published to the dead-letter exchange.
    pub dead_lettered: u64,
}

impl Counters {
    pub fn totals(&self) -> Totals {
        Totals {
            applied: self.applied.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
        }
    }
}

/// Consumes until `shutdown` is cancelled (then `Ok` with the totals) or a stop-class error;
/// retry-class errors start a new session after a backoff. `counters` may be read while it
/// runs.
///
/// First it sets the process's connection policy (`outbox_common::liveness::configure`) to
/// the config's peer and statement timeouts, and the name its PostgreSQL sessions show
/// ([`crate::APPLICATION_NAME`], unless the URL names them): every connection opened from
/// then on, by this consumer or anything else in the process, gets them.
pub async fn run<E: Effect>(
    config: ConsumerConfig,
    effect: E,
    counters: Arc<Counters>,
    shutdown: CancellationToken,
) -> Result<Totals, InboxError> {
    check(&config)?;
    liveness::configure(config.connection_policy());
    outbox_common::pg::set_application_name(crate::APPLICATION_NAME);
    let effect = Arc::new(effect);
    let mut backoff = Backoff::new(Duration::from_millis(500), config.max_backoff);
    loop {
        match session(&config, &effect, &counters, &shutdown, &mut backoff).await {
            Ok(()) => return Ok(counters.totals()),
            Err(e) if e.is_retryable() && !shutdown.is_cancelled() => {
                let wait = backoff.next_delay();
                tracing::warn!(
                    error = %chain(&e),
                    retry_in_ms = wait.as_millis() as u64,
                    "consumer session failed; unacknowledged deliveries go back to the queue"
                );
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(counters.totals()),
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            Err(e) if e.is_retryable() => return Ok(counters.totals()),
            Err(e) => return Err(e),
        }
    }
}

fn check(config: &ConsumerConfig) -> Result<(), InboxError> {
    if config.concurrency == 0 {
        return Err(InboxError::Config(
            "--concurrency (OUTBOX_INBOX_CONCURRENCY) must be at least 1".into(),
        ));
    }
    if usize::from(config.prefetch) < config.concurrency {
        return Err(InboxError::Config(format!(
            "--prefetch {} is below --concurrency {}: the lanes beyond the prefetch would \
             never get a message. Fix: a prefetch of at least the concurrency (a few times it \
             keeps every lane busy)",
            config.prefetch, config.concurrency
        )));
    }
    if config.consumer.is_empty() || config.queue.is_empty() {
        return Err(InboxError::Config(
            "--consumer (OUTBOX_INBOX_CONSUMER) and --queue (OUTBOX_INBOX_QUEUE) must not be \
             empty"
                .into(),
        ));
    }
    if config.dead_letter_exchange.as_deref() == Some("") {
        return Err(InboxError::Config(
            "The dead-letter exchange is empty: the default exchange routes by queue name, \
             not by the message's routing key. Fix: name an exchange with a durable queue \
             bound to it (#), or give none"
                .into(),
        ));
    }
    outbox_common::pg::parse_url(&config.database_url)
        .map_err(|e| InboxError::Config(chain(&e)))?;
    Ok(())
}

/// One worker's connection and statements.
struct Worker<P> {
    client: Client,
    claim: Statement,
    prepared: P,
}

/// A delivery handed to a lane.
struct Job {
    message: InboxMessage,
    acker: Acker,
    /// Its properties as they came, for its dead letter (only with a dead-letter exchange).
    properties: Option<BasicProperties>,
}

/// A new worker: a connection to the consumer's database, the claim and the effect prepared.
async fn open_worker<E: Effect>(
    database_url: &str,
    table: &InboxTable,
    effect: &E,
) -> Result<Worker<E::Prepared>, InboxError> {
    let client = crate::connect(database_url).await?;
    let claim = prepare_claim(&client, table).await?;
    let prepared = effect.prepare(&client).await?;
    Ok(Worker {
        client,
        claim,
        prepared,
    })
}

async fn session<E: Effect>(
    config: &ConsumerConfig,
    effect: &Arc<E>,
    counters: &Arc<Counters>,
    shutdown: &CancellationToken,
    backoff: &mut Backoff,
) -> Result<(), InboxError> {
    // PostgreSQL first: a missing inbox or an effect that cannot prepare stops the consumer
    // before it takes a single delivery.
    let mut workers = Vec::with_capacity(config.concurrency);
    for _ in 0..config.concurrency {
        workers.push(open_worker(&config.database_url, &config.table, &**effect).await?);
    }
    let properties = ConnectionProperties::default().with_connection_name("outbox-inbox".into());
    // The heartbeat is half the peer timeout (set above as the process's policy), so that
    // RabbitMQ gives this consumer's deliveries to another within about the timeout if this
    // host vanishes.
    let connection = tokio::time::timeout(
        CONNECT_TIMEOUT,
        outbox_common::amqp::open_connection(&config.amqp_url, properties),
    )
    .await
    .map_err(|_| InboxError::ConnectTimeout { what: "RabbitMQ" })??;
    let result = consume(
        config,
        effect,
        counters,
        shutdown,
        backoff,
        &connection,
        workers,
    )
    .await;
    // Bounded: a silent broker would never answer close-ok. Unacknowledged deliveries go
    // back to the queue once the connection is gone, either way.
    let close = connection.close(200, "OK".into());
    let _ = tokio::time::timeout(Duration::from_secs(2), close).await;
    result
}

/// A broker request's answer, within the connect timeout: a node that took the connection
/// and then reads nothing more must not hold the consumer (or its shutdown) forever.
async fn answered<T>(request: impl Future<Output = T>) -> Result<T, InboxError> {
    tokio::time::timeout(CONNECT_TIMEOUT, request)
        .await
        .map_err(|_| InboxError::ConnectTimeout { what: "RabbitMQ" })
}

async fn consume<E: Effect>(
    config: &ConsumerConfig,
    effect: &Arc<E>,
    counters: &Arc<Counters>,
    shutdown: &CancellationToken,
    backoff: &mut Backoff,
    connection: &Connection,
    workers: Vec<Worker<E::Prepared>>,
) -> Result<(), InboxError> {
    // Before the first delivery: a dead-letter exchange that is missing stops the consumer
    // with nothing taken.
    let dead_letters = match &config.dead_letter_exchange {
        Some(exchange) => Some(Arc::new(
            DeadLetters::open(connection, exchange, config).await?,
        )),
        None => None,
    };
    let channel = answered(connection.create_channel()).await??;
    answered(channel.basic_qos(config.prefetch, BasicQosOptions::default())).await??;
    let mut deliveries = answered(channel.basic_consume(
        config.queue.as_str().into(),
        "".into(),
        BasicConsumeOptions::default(),
        FieldTable::default(),
    ))
    .await?
    .map_err(|e| match e.kind() {
        lapin::ErrorKind::ProtocolError(error) if error.get_id() == NOT_FOUND => {
            InboxError::QueueMissing {
                queue: config.queue.clone(),
            }
        }
        _ => InboxError::Broker(e),
    })?;
    tracing::info!(
        "{}{} consumer={} prefetch={} concurrency={}",
        log::CONSUMING,
        config.queue,
        config.consumer,
        config.prefetch,
        config.concurrency
    );
    backoff.reset();

    // A lane holds at most what the broker sends ahead, so sends block only while one lane
    // has the whole prefetch.
    let capacity = usize::from(config.prefetch).max(1);
    let lane = Lane {
        effect: effect.clone(),
        consumer: config.consumer.as_str().into(),
        counters: counters.clone(),
        batch_size: config.batch_size.max(1),
        database_url: config.database_url.as_str().into(),
        table: config.table.clone(),
        max_backoff: config.max_backoff,
        dead_letters: dead_letters.clone(),
        shutdown: shutdown.clone(),
    };
    let mut lanes = Vec::with_capacity(workers.len());
    let mut tasks = JoinSet::new();
    for worker in workers {
        let (sender, jobs) = mpsc::channel(capacity);
        lanes.push(sender);
        tasks.spawn(work(worker, jobs, lane.clone()));
    }

    let dispatched = dispatch(&mut deliveries, &lanes, &mut tasks, &lane).await;
    if let Err(e) = dispatched {
        tasks.abort_all();
        return Err(e);
    }
    // Stopping: no new deliveries; every worker finishes what it was handed.
    let _ = answered(channel.basic_cancel(deliveries.tag(), BasicCancelOptions::default())).await;
    drop(lanes);
    let finish = async {
        while let Some(joined) = tasks.join_next().await {
            worker_result(joined)?;
        }
        Ok::<_, InboxError>(())
    };
    match tokio::time::timeout(config.shutdown_timeout, finish).await {
        Ok(finished) => finished,
        Err(_) => {
            tracing::warn!(
                timeout_secs = config.shutdown_timeout.as_secs(),
                "the workers did not finish their messages in time; the rest go back to the queue"
            );
            tasks.abort_all();
            Ok(())
        }
    }
}

/// Hands each delivery to its lane until `shutdown` (Ok) or a failure: the broker's, or a
/// worker's (a worker ends early only on an error).
async fn dispatch<E>(
    deliveries: &mut lapin::Consumer,
    lanes: &[mpsc::Sender<Job>],
    tasks: &mut JoinSet<Result<(), InboxError>>,
    lane: &Lane<E>,
) -> Result<(), InboxError> {
    let shutdown = &lane.shutdown;
    loop {
        let delivery = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(()),
            Some(joined) = tasks.join_next() => return Err(worker_ended(joined)),
            next = deliveries.next() => match next {
                Some(Ok(delivery)) => delivery,
                Some(Err(e)) => return Err(e.into()),
                None => return Err(InboxError::ConsumerClosed),
            },
        };
        // Cloned only where a dead letter may need them.
        let properties = lane
            .dead_letters
            .is_some()
            .then(|| delivery.properties.clone());
        let (message, acker) = match InboxMessage::from_delivery(delivery) {
            Ok(accepted) => accepted,
            Err((refusal, delivery)) => {
                if !refuse(refusal, *delivery, lane).await? {
                    return Ok(());
                }
                continue;
            }
        };
        let job = Job {
            message,
            acker,
            properties,
        };
        let sender = &lanes[lane_of(job.message.order_key(), lanes.len())];
        tokio::select! {
            biased;
            // The delivery in hand is dropped unacknowledged: it goes back to the queue.
            _ = shutdown.cancelled() => return Ok(()),
            Some(joined) = tasks.join_next() => return Err(worker_ended(joined)),
            sent = sender.send(job) => {
                if sent.is_err() {
                    return Err(InboxError::ConsumerClosed);
                }
            }
        }
    }
}

/// A delivery no inbox can deduplicate (or claim) is never applied (it could be applied twice) and
/// never requeued (it would come back for ever, and count toward the queue's delivery
/// limit): it goes to the dead-letter exchange, confirmed there before it is acked; without
/// one it is rejected without requeue, and RabbitMQ moves it to the queue's own dead-letter
/// exchange if it has one (`x-dead-letter-exchange`), else drops it. False: `shutdown` came
/// while the dead-letter exchange would not take it.
async fn refuse<E>(
    refusal: Refusal,
    delivery: Delivery,
    lane: &Lane<E>,
) -> Result<bool, InboxError> {
    let Delivery {
        routing_key,
        properties,
        data,
        acker,
        ..
    } = delivery;
    let went = match &lane.dead_letters {
        Some(dead_letters) => {
            let letter = DeadLetter {
                message_id: None,
                routing_key: routing_key.as_str(),
                body: &data,
                properties,
                reason: refusal.reason(),
            };
            if !dead_letters.place(letter, acker, lane).await? {
                return Ok(false);
            }
            format!(
                "it went to the dead-letter exchange {}",
                dead_letters.exchange
            )
        }
        None => {
            acker.reject(BasicRejectOptions { requeue: false }).await?;
            "it went to the queue's dead-letter exchange if the queue has one \
             (x-dead-letter-exchange), else RabbitMQ dropped it"
                .to_string()
        }
    };
    lane.counters.rejected.fetch_add(1, Ordering::Relaxed);
    // The log names the field, never its value (the id could hold anything).
    match refusal {
        Refusal::NoMessageId => tracing::error!(
            "{} ({}): it is not applied; {went}. Fix: publish every message with a message_id",
            log::REJECTED,
            refusal.reason()
        ),
        Refusal::NulByte { field } => tracing::error!(
            "{} {field}: PostgreSQL text cannot store it, so the inbox cannot claim it and it \
             is not applied; {went}. Fix: publish message ids and {} without NUL bytes",
            log::REJECTED_NUL,
            outbox_common::headers::SEQ
        ),
    }
    Ok(true)
}

fn worker_ended(joined: Result<Result<(), InboxError>, tokio::task::JoinError>) -> InboxError {
    match worker_result(joined) {
        Err(e) => e,
        // A worker's lane is open until dispatch ends: it cannot finish cleanly first.
        Ok(()) => InboxError::ConsumerClosed,
    }
}

fn worker_result(
    joined: Result<Result<(), InboxError>, tokio::task::JoinError>,
) -> Result<(), InboxError> {
    match joined {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Aborted: only after the session has already failed.
        Err(_) => Err(InboxError::ConsumerClosed),
    }
}

/// The lane of an order key: the same key, the same lane, for the whole session.
fn lane_of(key: &str, lanes: usize) -> usize {
    let mut hasher = std::hash::DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() % lanes as u64) as usize
}

async fn prepare_claim(client: &Client, table: &InboxTable) -> Result<Statement, InboxError> {
    let sql = format!("SELECT {}($1, $2, $3)", table.claim_function());
    client.prepare(&sql).await.map_err(|source| {
        let what = || {
            format!(
                "Cannot call {}: run `outbox-inbox setup` (or sql/inbox.sql) in the \
                     consumer's database, and grant the consumer's role EXECUTE on it and \
                     INSERT on {table}",
                table.claim_function()
            )
        };
        provisioning(what, source)
    })
}

/// What became of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Claimed now, its effect committed.
    Applied,
    /// Claimed before: dropped.
    Duplicate,
}

async fn work<E: Effect>(
    mut worker: Worker<E::Prepared>,
    mut jobs: mpsc::Receiver<Job>,
    lane: Lane<E>,
) -> Result<(), InboxError> {
    let mut batch = Vec::with_capacity(lane.batch_size);
    let mut backoff = Backoff::new(Duration::from_millis(500), lane.max_backoff);
    while let Some(first) = jobs.recv().await {
        // What is already waiting, never more: no lingering for a fuller batch.
        batch.push(first);
        while batch.len() < lane.batch_size {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // Until every delivery of the batch is acknowledged: none is given back while the
        // consumer runs (invariant 4).
        while !batch.is_empty() {
            let failure =
                match apply_batch(&mut worker, &*lane.effect, &lane.consumer, &batch).await {
                    Ok(outcomes) => {
                        failpoint(AFTER_COMMIT);
                        acknowledge(&mut batch, outcomes, &lane.counters).await?;
                        backoff.reset();
                        continue;
                    }
                    Err(failure) => failure,
                };
            match failure {
                BatchFailure::Stop(e) => return Err(e),
                BatchFailure::Poison { index, error } => match &lane.dead_letters {
                    Some(dead_letters) => {
                        let job = batch.remove(index);
                        if !dead_letter_poison(dead_letters, job, &error, &lane).await? {
                            return Ok(());
                        }
                    }
                    None => return Err(error.into_stop(&batch[index].message.message_id)),
                },
                BatchFailure::Held(e) => {
                    let wait = backoff.next_delay();
                    tracing::warn!(
                        error = %chain(&e),
                        deliveries = batch.len(),
                        retry_in_ms = wait.as_millis() as u64,
                        "{}",
                        log::HOLDING
                    );
                    if !lane.pause(wait).await {
                        return Ok(());
                    }
                    if worker.client.is_closed() {
                        match reopen(&lane, &mut backoff).await? {
                            Some(reopened) => worker = reopened,
                            None => return Ok(()),
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Acknowledges the whole `batch`, which committed (or was applied before), and counts it.
async fn acknowledge(
    batch: &mut Vec<Job>,
    outcomes: Vec<Outcome>,
    counters: &Counters,
) -> Result<(), InboxError> {
    for (Job { message, acker, .. }, outcome) in batch.drain(..).zip(outcomes) {
        match outcome {
            Outcome::Applied => counters.applied.fetch_add(1, Ordering::Relaxed),
            Outcome::Duplicate => {
                tracing::debug!(
                    message_id = %message.message_id,
                    outbox_seq = message.outbox_seq.as_deref().unwrap_or(""),
                    redelivered = message.redelivered,
                    "{}",
                    log::DUPLICATE
                );
                counters.duplicates.fetch_add(1, Ordering::Relaxed)
            }
        };
        // Only now: the transaction committed (or found the message applied before).
        acker.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

/// A new connection for a lane whose connection broke, tried until it opens (a failure that
/// can pass waits a backoff), the lane still holding its batch. `None`: shutdown came first.
async fn reopen<E: Effect>(
    lane: &Lane<E>,
    backoff: &mut Backoff,
) -> Result<Option<Worker<E::Prepared>>, InboxError> {
    loop {
        match open_worker(&lane.database_url, &lane.table, &*lane.effect).await {
            Ok(worker) => return Ok(Some(worker)),
            Err(e) if e.is_retryable() => {
                let wait = backoff.next_delay();
                tracing::warn!(
                    error = %chain(&e),
                    retry_in_ms = wait.as_millis() as u64,
                    "{}",
                    log::HOLDING
                );
                if !lane.pause(wait).await {
                    return Ok(None);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Publishes `job`, whose effect fails on its data, to the dead-letter exchange, and acks it
/// once the broker confirmed the dead letter. False: shutdown came first (it goes back).
async fn dead_letter_poison<E>(
    dead_letters: &DeadLetters,
    job: Job,
    error: &EffectError,
    lane: &Lane<E>,
) -> Result<bool, InboxError> {
    let Job {
        message,
        acker,
        properties,
    } = job;
    let reason = format!(
        "effect failed: SQLSTATE {}: {}",
        error.sqlstate, error.reason
    );
    let letter = DeadLetter {
        message_id: Some(&message.message_id),
        routing_key: &message.routing_key,
        body: &message.body,
        properties: properties.unwrap_or_default(),
        reason: &reason,
    };
    if !dead_letters.place(letter, acker, lane).await? {
        return Ok(false);
    }
    lane.counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
    // The server's message, as in the stop error: never its DETAIL (the row's values).
    tracing::error!(
        message_id = %message.message_id,
        sqlstate = %error.sqlstate,
        reason = %error.reason,
        exchange = %dead_letters.exchange,
        "{}: it is not applied, and the lane goes on. Fix the effect or the data it needs, \
         then move the message back to the queue (it is applied once)",
        log::DEAD_LETTERED
    );
    Ok(true)
}

/// What every worker shares.
struct Lane<E> {
    effect: Arc<E>,
    consumer: Arc<str>,
    counters: Arc<Counters>,
    batch_size: usize,
    database_url: Arc<str>,
    table: InboxTable,
    max_backoff: Duration,
    dead_letters: Option<Arc<DeadLetters>>,
    shutdown: CancellationToken,
}

impl<E> Lane<E> {
    /// Waits `wait`; false if the consumer is stopping (then nothing more is tried).
    async fn pause(&self, wait: Duration) -> bool {
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep(wait) => true,
        }
    }
}

impl<E> Clone for Lane<E> {
    fn clone(&self) -> Self {
        Lane {
            effect: self.effect.clone(),
            consumer: self.consumer.clone(),
            counters: self.counters.clone(),
            batch_size: self.batch_size,
            database_url: self.database_url.clone(),
            table: self.table.clone(),
            max_backoff: self.max_backoff,
            dead_letters: self.dead_letters.clone(),
            shutdown: self.shutdown.clone(),
        }
    }
}

/// A dead letter: the message as it came, with the reason.
struct DeadLetter<'a> {
    message_id: Option<&'a str>,
    routing_key: &'a str,
    body: &'a [u8],
    properties: BasicProperties,
    reason: &'a str,
}

/// `--dead-letter-exchange`: a channel of its own in confirm mode (a refused publish closes
/// only it), on the session's connection.
struct DeadLetters {
    channel: Channel,
    exchange: String,
    consumer: String,
    queue: String,
}

impl DeadLetters {
    /// Checks that the exchange exists (a passive declare), then opens the channel.
    async fn open(
        connection: &Connection,
        exchange: &str,
        config: &ConsumerConfig,
    ) -> Result<DeadLetters, InboxError> {
        let missing = || InboxError::DeadLetterExchangeMissing {
            exchange: exchange.to_string(),
        };
        // A failed passive declare closes its channel: one of its own.
        let check = answered(connection.create_channel()).await??;
        let options = ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let kind = ExchangeKind::Topic;
        answered(check.exchange_declare(exchange.into(), kind, options, FieldTable::default()))
            .await?
            .map_err(|e| match e.kind() {
                lapin::ErrorKind::ProtocolError(error) if error.get_id() == NOT_FOUND => missing(),
                _ => InboxError::Broker(e),
            })?;
        let _ = answered(check.close(200, "OK".into())).await;
        let channel = answered(connection.create_channel()).await??;
        answered(channel.confirm_select(ConfirmSelectOptions::default())).await??;
        Ok(DeadLetters {
            channel,
            exchange: exchange.to_string(),
            consumer: config.consumer.clone(),
            queue: config.queue.clone(),
        })
    }

    /// Publishes `letter` (persistent, mandatory, its own routing key, the reason, the
    /// consumer and the queue in headers) until the exchange takes it, confirmed and routed
    /// to a queue, and only then acks the original with `acker`. A return or a nack waits a
    /// backoff and tries again, the lane held; false if the consumer stops meanwhile (the
    /// original goes back).
    async fn place<E>(
        &self,
        letter: DeadLetter<'_>,
        acker: Acker,
        lane: &Lane<E>,
    ) -> Result<bool, InboxError> {
        let mut headers = letter.properties.headers().clone().unwrap_or_default();
        for (name, value) in [
            ("x-inbox-dead-letter-reason", letter.reason),
            ("x-inbox-consumer", self.consumer.as_str()),
            ("x-inbox-queue", self.queue.as_str()),
        ] {
            headers.insert(name.into(), AMQPValue::LongString(value.into()));
        }
        let properties = letter
            .properties
            .with_headers(headers)
            .with_delivery_mode(2);
        let mut backoff = Backoff::new(Duration::from_millis(500), lane.max_backoff);
        loop {
            let confirm = answered(self.channel.basic_publish(
                self.exchange.as_str().into(),
                letter.routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                letter.body,
                properties.clone(),
            ))
            .await??;
            let problem = match answered(confirm).await?? {
                Confirmation::Ack(None) | Confirmation::NotRequested => {
                    acker.ack(BasicAckOptions::default()).await?;
                    return Ok(true);
                }
                Confirmation::Ack(Some(_)) => "routed it to no queue",
                Confirmation::Nack(_) => "refused it (a nack)",
            };
            let wait = backoff.next_delay();
            tracing::error!(
                message_id = letter.message_id.unwrap_or(""),
                exchange = %self.exchange,
                retry_in_ms = wait.as_millis() as u64,
                "{}: it {problem}; the message stays unacknowledged and its lane waits. Fix: \
                 bind a durable queue to the dead-letter exchange (binding key #)",
                log::DEAD_LETTER_WAITING
            );
            if !lane.pause(wait).await {
                return Ok(false);
            }
        }
    }
}

/// Where a transaction failed: only the effect's own errors name a message.
enum Failure {
    Inbox(tokio_postgres::Error),
    Effect {
        index: usize,
        error: tokio_postgres::Error,
    },
}

impl Failure {
    fn error(&self) -> &tokio_postgres::Error {
        match self {
            Failure::Inbox(error) | Failure::Effect { error, .. } => error,
        }
    }
}

/// An effect's definite failure on a message, as the server named it.
struct EffectError {
    sqlstate: String,
    // The server's message only, never its DETAIL: for a constraint violation that is
    // "Failing row contains (…)", the message's payload.
    reason: String,
}

impl EffectError {
    fn of(error: &tokio_postgres::Error) -> EffectError {
        EffectError {
            sqlstate: error.code().map_or("none", |c| c.code()).to_string(),
            reason: error
                .as_db_error()
                .map_or_else(|| error.to_string(), |db| db.message().to_string()),
        }
    }

    fn into_stop(self, message_id: &str) -> InboxError {
        InboxError::Effect {
            message_id: message_id.to_string(),
            sqlstate: self.sqlstate,
            reason: self.reason,
        }
    }
}

/// Why a batch did not commit, and what the lane does about it.
enum BatchFailure {
    /// It can pass: the lane keeps the batch and runs it again after a backoff.
    Held(InboxError),
    /// The effect failed on `batch[index]`'s data: it would fail the same way every time.
    Poison { index: usize, error: EffectError },
    /// The consumer stops.
    Stop(InboxError),
}

/// Claims and applies the `batch` in one transaction, in order, running it again (a few
/// times) after a serialization failure or a deadlock.
async fn apply_batch<E: Effect>(
    worker: &mut Worker<E::Prepared>,
    effect: &E,
    consumer: &str,
    batch: &[Job],
) -> Result<Vec<Outcome>, BatchFailure> {
    let mut attempt = 0;
    loop {
        let failure = match try_apply(worker, effect, consumer, batch).await {
            Ok(outcomes) => return Ok(outcomes),
            Err(failure) => failure,
        };
        attempt += 1;
        if is_serialization_failure(failure.error()) && attempt < SERIALIZATION_RETRIES {
            tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt))).await;
            continue;
        }
        return Err(match failure {
            // A statement or lock timeout among them: held, never a stop.
            Failure::Effect { error, .. } | Failure::Inbox(error) if is_transient(&error) => {
                BatchFailure::Held(database_error(error))
            }
            Failure::Effect { index, error } if is_poison(&error) => BatchFailure::Poison {
                index,
                error: EffectError::of(&error),
            },
            Failure::Effect { index, error } => BatchFailure::Stop(
                EffectError::of(&error).into_stop(&batch[index].message.message_id),
            ),
            Failure::Inbox(error) => BatchFailure::Stop(database_error(error)),
        });
    }
}

async fn try_apply<E: Effect>(
    worker: &mut Worker<E::Prepared>,
    effect: &E,
    consumer: &str,
    batch: &[Job],
) -> Result<Vec<Outcome>, Failure> {
    let txn = worker.client.transaction().await.map_err(Failure::Inbox)?;
    // Every claim first, pipelined (sent together, run by PostgreSQL one after the other in
    // this order): one round trip for the batch's claims, not one each.
    let claims = batch.iter().map(|Job { message, .. }| async {
        let params: [&(dyn ToSql + Sync); 3] =
            [&consumer, &message.message_id, &message.outbox_seq];
        txn.query_one(&worker.claim, &params).await
    });
    let claimed = try_join_all(claims).await.map_err(Failure::Inbox)?;
    let mut outcomes = Vec::with_capacity(batch.len());
    for (index, (Job { message, .. }, claim)) in batch.iter().zip(claimed).enumerate() {
        if !claim.get::<_, bool>(0) && !switched_on(IGNORE_CLAIMS) {
            // The claim wrote nothing: the copy applied before is the one that counts.
            outcomes.push(Outcome::Duplicate);
            continue;
        }
        // The effects one at a time, in order: an effect may run several statements.
        effect
            .apply(&worker.prepared, &txn, message)
            .await
            .map_err(|error| Failure::Effect { index, error })?;
        outcomes.push(Outcome::Applied);
    }
    failpoint(BEFORE_COMMIT);
    // A batch of duplicates only has nothing to commit: PostgreSQL writes no WAL for it.
    txn.commit().await.map_err(Failure::Inbox)?;
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_one_lane_and_keys_spread() {
        assert_eq!(lane_of("order-42", 4), lane_of("order-42", 4));
        let mut used = [0usize; 4];
        for i in 0..400 {
            used[lane_of(&format!("order-{i}"), 4)] += 1;
        }
        assert!(used.iter().all(|&n| n > 50), "{used:?}");
    }
}
