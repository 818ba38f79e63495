//! The reference consumer: a queue in, effects in the consumer's database out, each message
//! applied effectively once.
//!
//! ```text
//!  RabbitMQ queue ──basic.consume (prefetch)──▶ dispatch ──lane = hash(order key) % N──▶ worker k
//!                                                 │ no message_id: basic.reject            │
//!                                                 │ (a NUL byte in it or x-outbox-seq too) │
//!                                                 ▼ (dead-letter exchange, if any)         ▼
//!     worker k (own PostgreSQL connection), the messages waiting in its lane (up to the
//!     batch size), in lane order, in one transaction:
//!       BEGIN
//!         per message: SELECT inbox_claim(consumer, message_id, seq)
//!                        true  → the effect
//!                        false → nothing (a duplicate: its effect committed before)
//!       COMMIT; then basic.ack of each
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
//! 4. **Any failure ends the session, nothing else.** A lost connection, or a PostgreSQL error
//!    that may pass, tears everything down (unacknowledged deliveries go back to the queue, in
//!    their places) and a new session starts after a backoff. Only a stop-class error (a missing
//!    inbox or queue, an effect that fails on a message) ends the consumer.
//!
//! 5. **A vanished replica costs about the peer timeout, never hours.** Replica A's host dies
//!    inside a transaction: its claims stay uncommitted, and B's claim of a redelivered copy
//!    (an INSERT that waits for A's row) waits until the server ends A's session. The peer
//!    timeout T bounds both halves: RabbitMQ declares A dead after 2-3 missed heartbeats of
//!    T/2 and hands its deliveries to B, and PostgreSQL's keepalives (or user timeout) on A's
//!    session end it, and its row locks, within about T. The statement timeout bounds every
//!    claim and effect statement besides (a wait nobody else ends): a statement cancelled by
//!    it (57014) or by a lock timeout (55P03) ends the session as a retry, invariant 4.
//!
//! Both are the process's connection policy (`outbox_common::liveness`), which every
//! connection reads where it is opened: [`run`] sets it from [`ConsumerConfig`] before its
//! first connection, so the binary and a library user get the same; a process running
//! several consumers gives them the same timeouts (the last `run` to start sets them).
//!
//! Shutdown (the token): the consumer cancels its subscription, every worker finishes the
//! messages already handed to it (bounded by the shutdown timeout), and the connection closes;
//! deliveries not yet handed out go back to the queue unacknowledged.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::try_join_all;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions,
};
use lapin::types::FieldTable;
use lapin::Acker;
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
    database_error, is_serialization_failure, is_transient, provisioning, InboxError,
};
use crate::failpoint::{failpoint, AFTER_COMMIT, BEFORE_COMMIT};
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
}

/// A reading of [`Counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Messages claimed and applied (committed).
    pub applied: u64,
    /// Copies of messages applied before, dropped.
    pub duplicates: u64,
    /// Deliveries refused (no message_id, or a NUL byte in it or in x-outbox-seq), rejected.
    pub rejected: u64,
}

impl Counters {
    pub fn totals(&self) -> Totals {
        Totals {
            applied: self.applied.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
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
        let client = crate::connect(&config.database_url).await?;
        let claim = prepare_claim(&client, &config.table).await?;
        let prepared = effect.prepare(&client).await?;
        workers.push(Worker {
            client,
            claim,
            prepared,
        });
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
    };
    let mut lanes = Vec::with_capacity(workers.len());
    let mut tasks = JoinSet::new();
    for worker in workers {
        let (sender, jobs) = mpsc::channel(capacity);
        lanes.push(sender);
        tasks.spawn(work(worker, jobs, lane.clone()));
    }

    let dispatched = dispatch(&mut deliveries, &lanes, &mut tasks, counters, shutdown).await;
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
async fn dispatch(
    deliveries: &mut lapin::Consumer,
    lanes: &[mpsc::Sender<Job>],
    tasks: &mut JoinSet<Result<(), InboxError>>,
    counters: &Counters,
    shutdown: &CancellationToken,
) -> Result<(), InboxError> {
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
        let (message, acker) = match InboxMessage::from_delivery(delivery) {
            Ok(accepted) => accepted,
            Err((refusal, acker)) => {
                reject(acker, refusal, counters).await?;
                continue;
            }
        };
        let lane = &lanes[lane_of(message.order_key(), lanes.len())];
        tokio::select! {
            biased;
            // The delivery in hand is dropped unacknowledged: it goes back to the queue.
            _ = shutdown.cancelled() => return Ok(()),
            Some(joined) = tasks.join_next() => return Err(worker_ended(joined)),
            sent = lane.send(Job { message, acker }) => {
                if sent.is_err() {
                    return Err(InboxError::ConsumerClosed);
                }
            }
        }
    }
}

/// A delivery no inbox can deduplicate (or claim) is rejected without requeueing: RabbitMQ
/// moves it to the queue's dead-letter exchange if it has one (`x-dead-letter-exchange`),
/// else drops it. Applying it could apply it twice; requeueing it would loop on it forever.
/// The log names the field, never its value (the id could hold anything).
async fn reject(acker: Acker, refusal: Refusal, counters: &Counters) -> Result<(), InboxError> {
    acker.reject(BasicRejectOptions { requeue: false }).await?;
    counters.rejected.fetch_add(1, Ordering::Relaxed);
    const WENT: &str = "it went to the queue's dead-letter exchange if the queue has one \
         (x-dead-letter-exchange), else RabbitMQ dropped it";
    match refusal {
        Refusal::NoMessageId => tracing::error!(
            "{}: it cannot be deduplicated, so it is not applied; {WENT}. Fix: publish every \
             message with a message_id",
            log::REJECTED
        ),
        Refusal::NulByte { field } => tracing::error!(
            "{} {field}: PostgreSQL text cannot store it, so the inbox cannot claim it and it \
             is not applied; {WENT}. Fix: publish message ids and {} without NUL bytes",
            log::REJECTED_NUL,
            outbox_common::headers::SEQ
        ),
    }
    Ok(())
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
    while let Some(first) = jobs.recv().await {
        // What is already waiting, never more: no lingering for a fuller batch.
        batch.push(first);
        while batch.len() < lane.batch_size {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let outcomes = apply_batch(&mut worker, &*lane.effect, &lane.consumer, &batch).await?;
        failpoint(AFTER_COMMIT);
        for (Job { message, acker }, outcome) in batch.drain(..).zip(outcomes) {
            match outcome {
                Outcome::Applied => lane.counters.applied.fetch_add(1, Ordering::Relaxed),
                Outcome::Duplicate => {
                    tracing::debug!(
                        message_id = %message.message_id,
                        outbox_seq = message.outbox_seq.as_deref().unwrap_or(""),
                        redelivered = message.redelivered,
                        "{}",
                        log::DUPLICATE
                    );
                    lane.counters.duplicates.fetch_add(1, Ordering::Relaxed)
                }
            };
            // Only now: the transaction committed (or found the message applied before).
            acker.ack(BasicAckOptions::default()).await?;
        }
    }
    Ok(())
}

/// What every worker shares.
struct Lane<E> {
    effect: Arc<E>,
    consumer: Arc<str>,
    counters: Arc<Counters>,
    batch_size: usize,
}

impl<E> Clone for Lane<E> {
    fn clone(&self) -> Self {
        Lane {
            effect: self.effect.clone(),
            consumer: self.consumer.clone(),
            counters: self.counters.clone(),
            batch_size: self.batch_size,
        }
    }
}

/// Where a transaction failed: only the effect's own errors name a message.
enum Failure {
    Inbox(tokio_postgres::Error),
    Effect {
        message_id: String,
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

/// Claims and applies the `batch` in one transaction, in order, running it again (a few
/// times) after a serialization failure or a deadlock.
async fn apply_batch<E: Effect>(
    worker: &mut Worker<E::Prepared>,
    effect: &E,
    consumer: &str,
    batch: &[Job],
) -> Result<Vec<Outcome>, InboxError> {
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
            Failure::Effect { message_id, error } if !is_transient(&error) => InboxError::Effect {
                message_id,
                sqlstate: error.code().map_or("none", |c| c.code()).to_string(),
                reason: error
                    .as_db_error()
                    .map_or_else(|| error.to_string(), |db| db.message().to_string()),
            },
            // A statement or lock timeout among them: a retry, never a stop.
            Failure::Effect { error, .. } | Failure::Inbox(error) => database_error(error),
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
    for (Job { message, .. }, claim) in batch.iter().zip(claimed) {
        if !claim.get::<_, bool>(0) {
            // The claim wrote nothing: the copy applied before is the one that counts.
            outcomes.push(Outcome::Duplicate);
            continue;
        }
        // The effects one at a time, in order: an effect may run several statements.
        effect
            .apply(&worker.prepared, &txn, message)
            .await
            .map_err(|error| Failure::Effect {
                message_id: message.message_id.clone(),
                error,
            })?;
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
