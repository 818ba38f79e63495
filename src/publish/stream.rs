//! The stream destination (`--stream NAME`): WAL mode's messages go into a RabbitMQ stream
//! through the stream protocol, under a named producer whose publishing ids the broker
//! deduplicates. A re-publish after a crash (the slot's replay) is then dropped by the broker,
//! and the stream holds every row once (docs/architecture.md, "Streams").
//!
//! A row's publishing id is a pure function of its place in the slot's stream ([`publishing_id`]),
//! so a session that resumes from the slot gives every row the id it had before. The broker
//! drops a publish whose id is not above the highest it stored for the producer's name, so an
//! id must never go backwards under one name: the name carries the slot, the PostgreSQL
//! timeline and the LSN epoch ([`producer_name`]), which is everything that could make ids go
//! back.
//!
//! The broker confirms what it drops as a duplicate: a confirm here says "the stream holds
//! this id", not "this publish stored it". That is what the slot's acknowledgement needs.
//!
//! Implements [`Publisher`] for the delivery loop, which keeps its window, ordering and
//! confirm timeout unchanged. A stream has no routing: nothing is returned, no exchange is
//! checked, and the dead-letter policy does not apply (refused at start).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use pgwire_replication::Lsn;
use rabbitmq_stream_client::types::{Message as StreamMessage, ResponseCode, SimpleValue};
use rabbitmq_stream_client::{Dedup, Environment, OnClosed, Producer, TlsConfiguration};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::sync::{oneshot, watch, Mutex};

use super::nodes::BrokerNodes;
use super::publisher::{Answer, Pending, Publisher};
use crate::contract::message::{HeaderValue, Message};
use crate::contract::position::Position;
use crate::error::{BrokerError, StreamError};
use crate::error::{ConfigProblem, RelayError};
use crate::observability::STREAM_SKIPPED_TOTAL;

/// The bits of a publishing id below a transaction's commit LSN: its rows' indexes.
const INDEX_BITS: u32 = 16;
/// WAL bytes per epoch: an id of the epoch, `(commit_lsn − base) << 16` plus the index, fits
/// in 64 bits with the indexes' room to spare.
const EPOCH_BYTES: u64 = 1 << 47;
/// Two commit records lie at least 32 bytes apart (a 24-byte record header and the 8-byte
/// commit time, aligned), so a transaction owns the ids from its commit LSN's up to 32 bytes
/// further: this many rows.
pub(crate) const MAX_ROWS_PER_TRANSACTION: u64 = 32 << INDEX_BITS;

/// Where a row goes in the stream's id space: the epoch (part of the producer's name) and the
/// publishing id within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamId {
    pub epoch: u64,
    pub publishing_id: u64,
}

/// The publishing id of the row at `position`. Ids grow with the commit LSN, then with the
/// index: the slot's order. Plus one: an id of 0 would not be above a fresh name's "nothing
/// stored yet".
pub(crate) fn publishing_id(position: Position) -> Result<StreamId, RelayError> {
    let lsn = position.commit_lsn.as_u64();
    let index = u64::from(position.index);
    if index >= MAX_ROWS_PER_TRANSACTION {
        return Err(RelayError::Stream(StreamError::TransactionTooLarge {
            commit_lsn: position.commit_lsn.to_string(),
            limit: MAX_ROWS_PER_TRANSACTION,
        }));
    }
    let epoch = lsn / EPOCH_BYTES;
    let within = lsn % EPOCH_BYTES;
    Ok(StreamId {
        epoch,
        publishing_id: (within << INDEX_BITS) + index + 1,
    })
}

/// The producer name for one slot, timeline and epoch. A promoted standby continues the WAL
/// on a new timeline from its switch point: under a new name, nothing the old primary
/// published past that point (a phantom) can make the broker drop the new primary's rows.
pub(crate) fn producer_name(slot: &str, timeline: u32, epoch: u64) -> String {
    format!("outbox-relay.{slot}.tl{timeline}.e{epoch}")
}

/// A timeline the session's server descends from (its history file's), and where it ended:
/// the rows below that point are the same rows, at the same positions, on both timelines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ancestor {
    pub timeline: u32,
    pub ended_at: Lsn,
}

/// What the stream already holds under one producer name, as the broker said at the
/// session's start: every id up to `last_id`, of rows committed below `below` (the point an
/// ancestor timeline ended; `None` for the session's own timeline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    below: Option<Lsn>,
    last_id: u64,
}

/// Whether the stream holds the row at `position` (publishing id `id`) already. Under the
/// session's own name the broker would drop it anyway; under an ancestor's it would not, and
/// only a row committed before that timeline ended is the same row on this one (a commit at
/// or past it happened on the old primary only, and its id means another row here).
fn held(holds: &[Held], position: Position, id: u64) -> bool {
    holds.iter().any(|held| {
        id <= held.last_id
            && held
                .below
                .is_none_or(|ended_at| position.commit_lsn < ended_at)
    })
}

/// What the relay delivers into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StreamTarget {
    /// One stream (`--stream`).
    Stream(String),
    /// A super stream's partitions (`--super-stream`), each row to the one its key hashes to.
    SuperStream(String),
}

impl StreamTarget {
    fn name(&self) -> &str {
        match self {
            StreamTarget::Stream(name) | StreamTarget::SuperStream(name) => name,
        }
    }
}

/// The stream plugin's listeners by default: plain, and TLS (for amqps:// URLs).
const STREAM_PORT: u16 = 5552;
const STREAM_TLS_PORT: u16 = 5551;

/// One node's stream listener, and who the relay is there.
#[derive(Clone)]
pub(crate) struct StreamNode {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub vhost: String,
    /// Over TLS (an amqps:// URL): the PEM file of the CAs that verify the broker.
    pub trust: Option<PathBuf>,
}

/// Where the stream is: the nodes to reach it through, in the relay's node order, and what
/// is delivered into there.
#[derive(Clone)]
pub(crate) struct StreamAddress {
    pub nodes: Vec<StreamNode>,
    pub target: StreamTarget,
    /// Whether a session of this relay found the stream (shared by the address's clones): a
    /// stream missing after that is a broker still recovering it, or one deleted under the
    /// relay, and is waited for rather than taken for a wrong name.
    found: Arc<AtomicBool>,
}

impl StreamAddress {
    /// `target` through each of `nodes` (in their order), at the stream protocol's `port`
    /// (by default the plugin's: TLS for an amqps:// URL), with each AMQP URL's user,
    /// password and virtual host. The client finds the stream's leader from whichever node
    /// answers.
    pub(crate) fn of(
        nodes: &BrokerNodes,
        port: Option<u16>,
        target: StreamTarget,
    ) -> Result<Self, RelayError> {
        Self::trusting(nodes, port, target, trusted_roots)
    }

    /// [`StreamAddress::of`], with the CA file that TLS nodes trust from `roots` (asked once,
    /// at the first of them).
    fn trusting(
        nodes: &BrokerNodes,
        port: Option<u16>,
        target: StreamTarget,
        roots: impl FnOnce() -> Result<PathBuf, ConfigProblem>,
    ) -> Result<Self, RelayError> {
        let mut roots = Some(roots);
        let mut trusted = None;
        let mut stream_nodes = Vec::new();
        for node in nodes.nodes() {
            let login = node.login().map_err(|_| {
                RelayError::Broker(BrokerError::Failed(format!(
                    "the AMQP URL of {} does not parse",
                    node.address()
                )))
            })?;
            let trust = if login.tls {
                if let Some(roots) = roots.take() {
                    trusted = Some(roots()?);
                }
                // The client would panic on a host TLS cannot name.
                if ServerName::try_from(login.host.as_str()).is_err() {
                    return Err(ConfigProblem::StreamTrust {
                        reason: format!(
                            "{} is neither a host name nor an IP address a certificate can \
                             name",
                            login.host
                        ),
                    }
                    .into());
                }
                trusted.clone()
            } else {
                None
            };
            let default_port = match login.tls {
                true => STREAM_TLS_PORT,
                false => STREAM_PORT,
            };
            stream_nodes.push(StreamNode {
                host: login.host,
                port: port.unwrap_or(default_port),
                user: login.user,
                password: login.password,
                vhost: login.vhost,
                trust,
            });
        }
        if stream_nodes.is_empty() {
            return Err(ConfigProblem::NoAmqpUrl.into());
        }
        Ok(Self {
            nodes: stream_nodes,
            target,
            found: Arc::default(),
        })
    }

    /// The virtual host (the first node's: one stream lives in one).
    fn vhost(&self) -> &str {
        self.nodes.first().map_or("/", |node| node.vhost.as_str())
    }
}

impl std::fmt::Display for StreamNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl std::fmt::Display for StreamAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.target {
            StreamTarget::Stream(_) => "stream",
            StreamTarget::SuperStream(_) => "super stream",
        };
        let nodes: Vec<String> = self.nodes.iter().map(ToString::to_string).collect();
        write!(f, "{kind} {} at {}", self.target.name(), nodes.join(", "))
    }
}

/// One connection's producers into one stream.
pub(crate) struct StreamDestination {
    environment: Environment,
    address: StreamAddress,
    /// Set once the session knows its timeline (after IDENTIFY_SYSTEM): the slot and
    /// timeline part of every producer name, and the timelines before it.
    naming: OnceLock<Naming>,
    /// Asks the broker what a producer name holds.
    queries: rabbitmq_stream_client::Client,
    /// The streams rows go into: the one stream, or the super stream's partitions in the
    /// broker's order.
    partitions: Vec<String>,
    /// One producer per partition and epoch, declared at its first publish (nearly always
    /// one epoch), with what the partition held for it then.
    producers: Mutex<HashMap<(usize, u64), EpochProducer>>,
    /// Becomes `true` when a producer's connection closes: every pending answer fails then.
    closed: watch::Sender<bool>,
    /// A stream connection is never blocked the way an AMQP one is: constant `false`.
    never_blocked: watch::Sender<bool>,
}

impl StreamDestination {
    /// Connects to the stream port of the first node that answers and checks that the
    /// stream exists.
    pub(crate) async fn connect(address: StreamAddress) -> Result<Self, RelayError> {
        let mut failures = Vec::new();
        let mut connected = None;
        for node in &address.nodes {
            match connect_node(node).await {
                Ok(both) => {
                    connected = Some(both);
                    break;
                }
                Err(reason) => failures.push(format!("{node}: {reason}")),
            }
        }
        let Some((environment, queries)) = connected else {
            return Err(RelayError::Stream(StreamError::Connect {
                address: address.to_string(),
                reason: failures.join("; "),
            }));
        };
        let mut destination = Self {
            environment,
            address,
            naming: OnceLock::new(),
            queries,
            partitions: Vec::new(),
            producers: Mutex::new(HashMap::new()),
            closed: watch::Sender::new(false),
            never_blocked: watch::Sender::new(false),
        };
        destination.partitions = destination.partitions().await?;
        for stream in &destination.partitions {
            destination.check_stream(stream).await?;
        }
        destination.address.found.store(true, Ordering::Relaxed);
        Ok(destination)
    }

    /// Names this session's producers: call once, before the first publish. `ancestors`:
    /// the timelines `timeline` descends from.
    pub(crate) fn name_producers(&self, slot: &str, timeline: u32, ancestors: Vec<Ancestor>) {
        let _ = self.naming.set(Naming {
            slot: slot.to_string(),
            timeline,
            ancestors,
        });
    }

    /// A stream that does not exist fails here, naming the fix, rather than at the first row.
    /// One the broker has but cannot serve yet (its leader starting after a restart) is a
    /// passing state: the session is retried; so is one missing after a session found it (a
    /// restarted broker answers so before it has recovered its streams).
    async fn check_stream(&self, stream: &str) -> Result<(), RelayError> {
        let code = bounded(self.queries.metadata(vec![stream.to_string()]))
            .await
            .map_err(|e| self.connect_error(e))?
            .map_err(|e| self.connect_error(e))?
            .get(stream)
            .map(|metadata| metadata.response_code.clone());
        match code {
            Some(ResponseCode::Ok) => Ok(()),
            None | Some(ResponseCode::StreamDoesNotExist) => Err(self.missing()),
            Some(other) => {
                Err(self.connect_error(format!("the stream is not available ({other:?})")))
            }
        }
    }

    /// The streams rows go into: the one stream, or the super stream's partitions.
    async fn partitions(&self) -> Result<Vec<String>, RelayError> {
        let super_stream = match &self.address.target {
            StreamTarget::Stream(stream) => return Ok(vec![stream.clone()]),
            StreamTarget::SuperStream(super_stream) => super_stream,
        };
        let partitions = bounded(self.queries.partitions(super_stream.clone()))
            .await
            .map_err(|e| self.connect_error(e))?
            .map_err(|e| self.connect_error(e))?
            .streams;
        match partitions.is_empty() {
            true => Err(self.missing()),
            false => Ok(partitions),
        }
    }

    /// What a missing stream or super stream is: a wrong name, unless a session of this relay
    /// found it before (a broker still recovering it after a restart, or one deleted under
    /// the relay), which is waited for.
    fn missing(&self) -> RelayError {
        let vhost = self.address.vhost().to_string();
        match (
            &self.address.target,
            self.address.found.load(Ordering::Relaxed),
        ) {
            (target, true) => self.connect_error(format!(
                "{} is gone, after this relay published into it: a broker still recovering \
                 it after a restart (waited for), or it was deleted (create it again)",
                target.name()
            )),
            (StreamTarget::Stream(stream), false) => RelayError::Stream(StreamError::Missing {
                stream: stream.clone(),
                vhost,
            }),
            (StreamTarget::SuperStream(super_stream), false) => {
                RelayError::Stream(StreamError::SuperStreamMissing {
                    super_stream: super_stream.clone(),
                    vhost,
                })
            }
        }
    }

    /// The partition `message` goes into: its aggregate_id's (else its message_id's)
    /// murmur3 hash, modulo the partitions, as the stream clients' hash routing does; 0 for
    /// one stream.
    fn partition_of(&self, message: &Message) -> usize {
        partition(message, self.partitions.len())
    }

    fn connect_error(&self, error: impl std::fmt::Display) -> RelayError {
        RelayError::Stream(StreamError::Connect {
            address: self.address.to_string(),
            reason: error.to_string(),
        })
    }

    /// What the stream holds under the name of `timeline`'s producer for `epoch`: the
    /// broker's last id for it.
    async fn last_id(
        &self,
        stream: &str,
        naming: &Naming,
        timeline: u32,
        epoch: u64,
    ) -> Result<u64, RelayError> {
        let name = producer_name(&naming.slot, timeline, epoch);
        self.queries
            .query_publisher_sequence(&name, stream)
            .await
            .map_err(|e| {
                RelayError::Broker(BrokerError::Failed(format!(
                    "asking {stream} what {name} holds: {e}"
                )))
            })
    }

    /// Declares the producer for `epoch` unless `producers` has it, and learns what the
    /// stream holds under its name and under its ancestors' for the same epoch.
    async fn declare_producer(
        &self,
        producers: &mut HashMap<(usize, u64), EpochProducer>,
        partition: usize,
        epoch: u64,
    ) -> Result<(), RelayError> {
        if producers.contains_key(&(partition, epoch)) {
            return Ok(());
        }
        let Some(stream) = self.partitions.get(partition) else {
            return Err(RelayError::Bug(format!("no partition {partition}")));
        };
        let Some(naming) = self.naming.get() else {
            return Err(RelayError::Bug(
                "the stream producer was used before the session named it".into(),
            ));
        };
        let mut holds = vec![Held {
            below: None,
            last_id: self.last_id(stream, naming, naming.timeline, epoch).await?,
        }];
        for ancestor in &naming.ancestors {
            holds.push(Held {
                below: Some(ancestor.ended_at),
                last_id: self
                    .last_id(stream, naming, ancestor.timeline, epoch)
                    .await?,
            });
        }
        let name = producer_name(&naming.slot, naming.timeline, epoch);
        let producer = self
            .environment
            .producer()
            .client_provided_name("outbox-relay")
            .name(&name)
            .on_closed(Box::new(ClosedSignal(self.closed.clone())))
            .build(stream)
            .await
            .map_err(|e| {
                RelayError::Broker(BrokerError::Failed(format!(
                    "declaring stream producer {name}: {e}"
                )))
            })?;
        let held: Vec<String> = holds
            .iter()
            .zip(
                std::iter::once(naming.timeline).chain(naming.ancestors.iter().map(|a| a.timeline)),
            )
            .filter(|(held, _)| held.last_id > 0)
            .map(|(held, timeline)| match held.below {
                None => format!("up to id {} under its own name", held.last_id),
                Some(ended_at) => format!(
                    "up to id {} of timeline {timeline} (ended at {ended_at})",
                    held.last_id
                ),
            })
            .collect();
        tracing::info!(
            stream = %stream,
            producer = %name,
            holds = %if held.is_empty() { "nothing of this slot".to_string() } else { held.join(", ") },
            "stream producer declared; rows the stream holds are not sent again"
        );
        producers.insert((partition, epoch), EpochProducer { producer, holds });
        Ok(())
    }

    /// Declares the message's producer if need be and hands the message to the client.
    async fn queue(&self, message: Message) -> Result<StreamPending, RelayError> {
        let Some(position) = message.position else {
            return Err(RelayError::Broker(BrokerError::Failed(format!(
                "message {} has no place in the slot's stream: only WAL mode's rows go into a \
                 stream",
                message.message_id
            ))));
        };
        let id = publishing_id(position)?;
        // Held across the send: the delivery loop starts publishes one at a time anyway, and
        // the send only queues the message for the client's batching task.
        let partition = self.partition_of(&message);
        let mut producers = self.producers.lock().await;
        self.declare_producer(&mut producers, partition, id.epoch)
            .await?;
        let Some(EpochProducer { producer, holds }) = producers.get_mut(&(partition, id.epoch))
        else {
            return Err(RelayError::Bug(
                "a declared stream producer is missing".into(),
            ));
        };
        let (answered, answer) = oneshot::channel();
        if held(holds, position, id.publishing_id) {
            metrics::counter!(STREAM_SKIPPED_TOTAL).increment(1);
            let _ = answered.send(Ok(true));
            return Ok(StreamPending {
                answer: Some(answer),
                closed: self.closed.subscribe(),
            });
        }
        let send = producer.send(
            stream_message(&message, id.publishing_id),
            |status| async move {
                let _ = answered.send(
                    status
                        .map(|status| status.confirmed())
                        .map_err(|e| e.to_string()),
                );
            },
        );
        // The client queues the message for its batching task; once the connection is gone
        // that queue may never drain, and the send would wait for ever.
        let mut closed = self.closed.subscribe();
        tokio::select! {
            sent = send => {
                sent.map_err(|e| RelayError::Broker(BrokerError::Failed(format!("publishing into the stream: {e}"))))?
            }
            _ = closed.wait_for(|closed| *closed) => return Err(connection_closed()),
        }
        Ok(StreamPending {
            answer: Some(answer),
            closed: self.closed.subscribe(),
        })
    }

    /// Resolves once a producer's connection has closed, or the broker has not answered a
    /// question for the peer timeout. The client notices a silent broker by its heartbeat,
    /// but then waits for the broker to answer its close before it reports the connection
    /// closed: a broker that vanished (a host gone, a process frozen) would hold the session
    /// until it came back.
    pub(crate) async fn lost(&self) -> RelayError {
        let mut closed = self.closed.subscribe();
        tokio::select! {
            _ = closed.wait_for(|closed| *closed) => connection_closed(),
            silent = self.silent() => silent,
        }
    }

    /// Asks the broker something every half peer timeout, and resolves with the error once it
    /// does not answer within the peer timeout.
    async fn silent(&self) -> RelayError {
        let timeout = outbox_common::liveness::policy().peer_timeout.get();
        let stream = self.partitions.first().cloned().unwrap_or_default();
        loop {
            tokio::time::sleep(timeout / 2).await;
            let asked = self.queries.metadata(vec![stream.clone()]);
            match tokio::time::timeout(timeout, asked).await {
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => return self.connect_error(e),
                Err(_) => {
                    return self.connect_error(format!(
                        "the broker did not answer for {} s (--peer-timeout)",
                        timeout.as_secs()
                    ))
                }
            }
        }
    }

    /// Closes every producer and the question's connection, politely and briefly.
    pub(crate) async fn close(&self) {
        let producers: Vec<_> = self
            .producers
            .lock()
            .await
            .drain()
            .map(|(_, epoch)| epoch.producer)
            .collect();
        for producer in producers {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, producer.close()).await;
        }
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.queries.close()).await;
    }
}

/// How long a publish may take to be handed to the client, its producer's declaration
/// included; and a connection to the stream port, or a question to the broker there.
const START_TIMEOUT: std::time::Duration = outbox_common::pg::CONNECT_TIMEOUT;

/// `step` if it ends within [`START_TIMEOUT`]; else why not.
async fn bounded<T>(step: impl std::future::Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(START_TIMEOUT, step)
        .await
        .map_err(|_| format!("no answer within {} s", START_TIMEOUT.as_secs()))
}

/// The producer of one epoch, and what the stream held for it when it was declared.
struct EpochProducer {
    producer: Producer<Dedup>,
    holds: Vec<Held>,
}

/// What names a session's producers.
struct Naming {
    slot: String,
    timeline: u32,
    ancestors: Vec<Ancestor>,
}

/// The environment producers are made from, and a client for questions, both through
/// `node`; or why not.
async fn connect_node(
    node: &StreamNode,
) -> Result<(Environment, rabbitmq_stream_client::Client), String> {
    let heartbeat = outbox_common::liveness::policy()
        .peer_timeout
        .stream_heartbeat();
    let tls = match &node.trust {
        None => TlsConfiguration::Disabled,
        Some(roots) => {
            // The client builds its TLS configuration on rustls' process-wide provider, and
            // with two compiled in (ring, and aws-lc-rs through other crates) rustls picks
            // none by itself. An error means one is installed already.
            let _ = rustls::crypto::ring::default_provider().install_default();
            TlsConfiguration::builder()
                .add_root_certificates(roots)
                .build()
                .map_err(str::to_string)?
        }
    };
    let environment = Environment::builder()
        .host(&node.host)
        .port(node.port)
        .username(&node.user)
        .password(&node.password)
        .virtual_host(&node.vhost)
        .heartbeat(heartbeat)
        .tls(tls.clone())
        .client_provided_name("outbox-relay")
        .build();
    let environment = bounded(environment).await?.map_err(|e| refusal(&e))?;
    let options = rabbitmq_stream_client::ClientOptions::builder()
        .host(&node.host)
        .port(node.port)
        .user(&node.user)
        .password(&node.password)
        .v_host(&node.vhost)
        .heartbeat(heartbeat)
        .tls(tls)
        .build();
    let queries = bounded(rabbitmq_stream_client::Client::connect(options))
        .await?
        .map_err(|e| refusal(&e))?;
    Ok((environment, queries))
}

/// The CA file a TLS stream connection trusts: `SSL_CERT_FILE`, else the system's bundle
/// where OpenSSL looks for it (the AMQP connection's verifier reads the same), checked by
/// [`usable_roots`].
fn trusted_roots() -> Result<PathBuf, ConfigProblem> {
    let Some(path) = openssl_probe::probe().cert_file else {
        return Err(ConfigProblem::StreamTrust {
            reason: "no CA file: SSL_CERT_FILE is not set and no system bundle was found \
                     (/etc/ssl/certs/ca-certificates.crt on Debian: install ca-certificates); \
                     set SSL_CERT_FILE to a PEM file of the CAs that signed the broker's \
                     certificate"
                .into(),
        });
    };
    usable_roots(&path)?;
    Ok(path)
}

/// How many certificates the PEM file at `path` holds, each one rustls takes as a trust
/// anchor: the stream client reads the file at every connection and panics on a certificate
/// it cannot add, so a file that would make it do so is refused here, with the reason.
fn usable_roots(path: &Path) -> Result<usize, ConfigProblem> {
    let problem = |what: String| ConfigProblem::StreamTrust {
        reason: format!(
            "{what} (the CA file, from SSL_CERT_FILE or the system's: {}); point SSL_CERT_FILE \
             at a PEM file of the CAs that signed the broker's certificate",
            path.display()
        ),
    };
    let pem = std::fs::read(path).map_err(|e| problem(format!("cannot read it: {e}")))?;
    let mut store = rustls::RootCertStore::empty();
    for (n, cert) in CertificateDer::pem_slice_iter(&pem).enumerate() {
        let cert =
            cert.map_err(|e| problem(format!("certificate {} does not parse: {e}", n + 1)))?;
        store.add(cert).map_err(|e| {
            problem(format!(
                "certificate {} is no CA rustls can trust ({e})",
                n + 1
            ))
        })?;
    }
    match store.len() {
        0 => Err(problem("it holds no PEM certificate".into())),
        n => Ok(n),
    }
}

/// Why a connection to a stream port failed, in words: a close during the handshake is what
/// RabbitMQ 3.10 does to the client's command-versions exchange (3.11 added it), and says so.
fn refusal(error: &rabbitmq_stream_client::error::ClientError) -> String {
    match error {
        rabbitmq_stream_client::error::ClientError::ConnectionClosed => {
            "the broker closed the connection during the handshake: RabbitMQ 3.10 and older \
             do (the stream destination needs RabbitMQ 3.11 or later)"
                .to_string()
        }
        other => other.to_string(),
    }
}

/// How long a polite close may wait.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Tells pending answers that the producer's connection is gone: the client calls back no
/// confirm for what was in flight then.
struct ClosedSignal(watch::Sender<bool>);

#[async_trait::async_trait]
impl OnClosed for ClosedSignal {
    async fn on_closed(&self, _unconfirmed: Vec<StreamMessage>) {
        self.0.send_replace(true);
    }
}

/// The partition of `partitions` (at least 1) `message` goes into: the murmur3 hash (seed
/// 104729, the stream clients' hash routing) of its aggregate_id, or of its message_id when it
/// has none, modulo `partitions`.
fn partition(message: &Message, partitions: usize) -> usize {
    if partitions <= 1 {
        return 0;
    }
    let key = match message.header(crate::contract::headers::AGGREGATE_ID) {
        Some(HeaderValue::Text(aggregate)) => aggregate.as_str(),
        _ => message.message_id.as_str(),
    };
    let hash = murmur3::murmur3_32(&mut std::io::Cursor::new(key.as_bytes()), 104_729).unwrap_or(0);
    (hash as usize) % partitions
}

/// A message of the contract in the stream's AMQP 1.0 format: message_id, content_type,
/// creation_time and subject (the event type) in the properties, the event type also as the
/// `x-basic-type` annotation (RabbitMQ's name for AMQP 0-9-1's `type`); the headers, the
/// relay's own included, as application properties.
pub(crate) fn stream_message(message: &Message, publishing_id: u64) -> StreamMessage {
    let mut properties = StreamMessage::builder()
        .properties()
        .message_id(message.message_id.clone());
    if let Some(content_type) = &message.content_type {
        properties = properties.content_type(content_type.as_ref());
    }
    if let Some(event_type) = &message.event_type {
        properties = properties.subject(event_type.clone());
    }
    if let Some(timestamp) = message
        .timestamp
        .and_then(|secs| i64::try_from(secs).ok())
        .and_then(|secs| chrono::DateTime::<chrono::Utc>::from_timestamp(secs, 0))
    {
        properties = properties.creation_time(timestamp);
    }
    let mut builder = properties.message_builder();
    if let Some(event_type) = &message.event_type {
        builder = builder
            .message_annotations()
            .insert("x-basic-type", event_type.as_str())
            .message_builder();
    }
    let mut application = builder.application_properties();
    for (name, value) in &message.headers {
        let value: SimpleValue = match value {
            HeaderValue::Text(text) => text.clone().into(),
            HeaderValue::Int(int) => (*int).into(),
            HeaderValue::Float(float) => {
                rabbitmq_stream_client::types::SimpleValue::Double((*float).into())
            }
            HeaderValue::Bool(flag) => (*flag).into(),
        };
        application = application.insert(name.clone(), value);
    }
    application
        .message_builder()
        .body(message.body.to_vec())
        .publishing_id(publishing_id)
        .build()
}

fn connection_closed() -> RelayError {
    RelayError::Broker(BrokerError::Failed("the stream connection closed".into()))
}

/// A publish into the stream awaiting its confirm.
pub(crate) struct StreamPending {
    answer: Option<oneshot::Receiver<Result<bool, String>>>,
    closed: watch::Receiver<bool>,
}

impl Pending for StreamPending {
    async fn answer(&mut self) -> Result<Answer, RelayError> {
        let Some(answer) = self.answer.as_mut() else {
            return Err(RelayError::Broker(BrokerError::Failed(
                "the stream publish was answered already".into(),
            )));
        };
        let outcome = tokio::select! {
            biased;
            outcome = answer => outcome,
            _ = self.closed.wait_for(|closed| *closed) => {
                return Err(connection_closed());
            }
        };
        self.answer = None;
        match outcome {
            Ok(Ok(acked)) => Ok(Answer {
                acked,
                returned: None,
            }),
            Ok(Err(error)) => Err(RelayError::Broker(BrokerError::Failed(error))),
            Err(_) => Err(connection_closed()),
        }
    }
}

impl Publisher for StreamDestination {
    type Pending = StreamPending;
    type RoundTrip = super::broker::RoundTrip;

    async fn start(&self, message: Message) -> Result<StreamPending, RelayError> {
        // The delivery loop's confirm timeout cannot see a start that hangs: bound it here.
        tokio::time::timeout(START_TIMEOUT, self.queue(message))
            .await
            .unwrap_or_else(|_| {
                Err(RelayError::Broker(BrokerError::Failed(format!(
                    "the stream client took no message for {} s",
                    START_TIMEOUT.as_secs()
                ))))
            })
    }

    async fn start_dead_letter(&self, message: Message) -> Result<StreamPending, RelayError> {
        Err(RelayError::Broker(BrokerError::Failed(format!(
            "message {}: a stream destination has no dead-letter exchange",
            message.message_id
        ))))
    }

    fn dead_letter_exchange(&self) -> Option<&str> {
        None
    }

    /// Nothing is ever returned from a stream, so no answer waits behind a barrier.
    fn round_trip(&self) -> Self::RoundTrip {
        Box::pin(async { Ok(()) })
    }

    fn blocked(&self) -> watch::Receiver<bool> {
        self.never_blocked.subscribe()
    }

    /// A stream has no exchanges: what a row names as its exchange is not used.
    async fn exchange_exists(&self, _exchange: &str) -> Result<bool, RelayError> {
        Ok(true)
    }

    async fn reopen(&self) -> Result<(), RelayError> {
        Err(RelayError::Broker(BrokerError::Failed(
            "the stream connection cannot be reopened within a session".into(),
        )))
    }

    fn max_message_size(&self) -> Option<usize> {
        None
    }

    fn learn_max_message_size(&self, _limit: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(commit_lsn: u64, index: u32) -> Position {
        Position {
            commit_lsn: Lsn::from_u64(commit_lsn),
            index,
        }
    }

    fn id(commit_lsn: u64, index: u32) -> StreamId {
        publishing_id(at(commit_lsn, index)).expect("within the limits")
    }

    #[test]
    fn ids_follow_the_slots_order() {
        let order = [
            id(0x1000, 0),
            id(0x1000, 1),
            id(0x1000, 70_000),
            id(0x1020, 0),
            id(0x1_0000_0000, 3),
        ];
        for pair in order.windows(2) {
            assert_eq!(pair[0].epoch, pair[1].epoch);
            assert!(
                pair[0].publishing_id < pair[1].publishing_id,
                "{:?} then {:?}",
                pair[0],
                pair[1]
            );
        }
        assert!(
            id(0, 0).publishing_id > 0,
            "0 is below a fresh name's start"
        );
    }

    #[test]
    fn a_transaction_owns_the_ids_up_to_the_next_possible_commit() {
        let last_of_one = id(0x1000, (MAX_ROWS_PER_TRANSACTION - 1) as u32);
        let first_of_next = id(0x1000 + 32, 0);
        assert!(last_of_one.publishing_id < first_of_next.publishing_id);
        let too_many = publishing_id(at(0x1000, MAX_ROWS_PER_TRANSACTION as u32));
        assert!(
            matches!(
                too_many,
                Err(RelayError::Stream(StreamError::TransactionTooLarge { .. }))
            ),
            "{too_many:?}"
        );
    }

    #[test]
    fn the_epoch_changes_the_name_not_the_order_within_it() {
        let last = id(EPOCH_BYTES - 32, (MAX_ROWS_PER_TRANSACTION - 1) as u32);
        let next = id(EPOCH_BYTES, 0);
        assert_eq!((last.epoch, next.epoch), (0, 1));
        assert_ne!(
            producer_name("s", 1, last.epoch),
            producer_name("s", 1, next.epoch)
        );
        let highest = id(u64::MAX, (MAX_ROWS_PER_TRANSACTION - 1) as u32);
        assert!(highest.publishing_id > id(u64::MAX - 32, 0).publishing_id);
    }

    #[test]
    fn a_row_is_held_under_its_own_name_up_to_the_last_id() {
        let own = [Held {
            below: None,
            last_id: id(0x2000, 4).publishing_id,
        }];
        assert!(held(&own, at(0x2000, 4), id(0x2000, 4).publishing_id));
        assert!(held(&own, at(0x1000, 9), id(0x1000, 9).publishing_id));
        assert!(!held(&own, at(0x2000, 5), id(0x2000, 5).publishing_id));
        assert!(!held(&[], at(0x1000, 0), id(0x1000, 0).publishing_id));
    }

    /// After a failover the old timeline's producer held ids up to a phantom's, past the
    /// switch point: a row of the new timeline below that point is the same row and held, one
    /// at or past it is another row with an id the old name happens to cover, and is not.
    #[test]
    fn under_an_ancestor_s_name_only_rows_committed_before_it_ended_are_held() {
        let switch_point = Lsn::from_u64(0x3000);
        let phantom = id(0x3400, 2).publishing_id;
        let holds = [
            Held {
                below: None,
                last_id: 0,
            },
            Held {
                below: Some(switch_point),
                last_id: phantom,
            },
        ];
        assert!(held(&holds, at(0x2fe0, 0), id(0x2fe0, 0).publishing_id));
        assert!(!held(&holds, at(0x3000, 0), id(0x3000, 0).publishing_id));
        assert!(!held(&holds, at(0x3100, 1), id(0x3100, 1).publishing_id));
        // Below the switch point, but above what the old name stored: not held.
        let short = [Held {
            below: Some(switch_point),
            last_id: id(0x2000, 0).publishing_id,
        }];
        assert!(!held(&short, at(0x2800, 0), id(0x2800, 0).publishing_id));
    }

    fn with_aggregate(message_id: &str, aggregate: Option<&str>) -> Message {
        let headers = aggregate
            .map(|aggregate| {
                (
                    crate::contract::headers::AGGREGATE_ID.to_string(),
                    HeaderValue::Text(aggregate.to_string()),
                )
            })
            .into_iter()
            .collect();
        Message {
            message_id: message_id.into(),
            exchange: String::new(),
            routing_key: String::new(),
            event_type: None,
            content_type: None,
            timestamp: None,
            headers,
            body: bytes::Bytes::new(),
            position: None,
        }
    }

    #[test]
    fn an_aggregate_s_rows_share_a_partition_and_the_aggregates_spread() {
        let of = |id: &str, aggregate: Option<&str>| partition(&with_aggregate(id, aggregate), 3);
        assert_eq!(of("a", Some("order-7")), of("b", Some("order-7")));
        let used: std::collections::HashSet<usize> = (0..30)
            .map(|n| of("x", Some(&format!("order-{n}"))))
            .collect();
        assert_eq!(used.len(), 3, "30 aggregates over 3 partitions: {used:?}");
        // Without an aggregate the message_id decides.
        assert_eq!(of("m-1", None), of("m-1", None));
        assert_eq!(partition(&with_aggregate("m-1", Some("order-7")), 1), 0);
    }

    #[test]
    fn a_close_during_the_handshake_names_the_version_it_needs() {
        use rabbitmq_stream_client::error::ClientError;
        assert!(refusal(&ClientError::ConnectionClosed).contains("RabbitMQ 3.11 or later"));
        assert_eq!(
            refusal(&ClientError::AlreadyClosed),
            "Client already closed"
        );
    }

    #[test]
    fn a_new_timeline_is_a_new_name() {
        assert_ne!(producer_name("s", 1, 0), producer_name("s", 2, 0));
        assert_ne!(producer_name("a", 1, 0), producer_name("b", 1, 0));
    }

    fn address(urls: &str, port: Option<u16>) -> Result<StreamAddress, RelayError> {
        let nodes = BrokerNodes::parse_listed(urls).expect("valid URLs");
        let target = StreamTarget::Stream("s".into());
        StreamAddress::trusting(&nodes, port, target, || Ok(PathBuf::from("/ca.pem")))
    }

    #[test]
    fn amqps_urls_reach_the_tls_listener_and_trust_the_ca_file() {
        let plain_and_tls = "amqp://u:p@a:5672/%2f,amqps://u:p@b:5671/%2f";
        let nodes = address(plain_and_tls, None).expect("an address").nodes;
        let seen: Vec<(&str, u16, Option<&Path>)> = nodes
            .iter()
            .map(|n| (n.host.as_str(), n.port, n.trust.as_deref()))
            .collect();
        let ca = Some(Path::new("/ca.pem"));
        assert_eq!(seen, [("a", 5552, None), ("b", 5551, ca)]);
        // A port given is every node's.
        let nodes = address(plain_and_tls, Some(6000))
            .expect("an address")
            .nodes;
        assert!(nodes.iter().all(|n| n.port == 6000));
    }

    #[test]
    fn a_tls_node_without_a_usable_ca_file_is_refused_naming_ssl_cert_file() {
        let nodes = BrokerNodes::parse_listed("amqps://u:p@b:5671/%2f").expect("a valid URL");
        let target = StreamTarget::Stream("s".into());
        let no_file = || {
            Err(ConfigProblem::StreamTrust {
                reason: "no CA file".into(),
            })
        };
        let refused = StreamAddress::trusting(&nodes, None, target, no_file).err();
        assert!(
            matches!(
                &refused,
                Some(RelayError::Configuration(ConfigProblem::StreamTrust { .. }))
            ),
            "{refused:?}"
        );
        // Plain nodes never ask for one.
        let plain = BrokerNodes::parse_listed("amqp://u:p@a:5672/%2f").expect("a valid URL");
        let target = StreamTarget::Stream("s".into());
        let asked = StreamAddress::trusting(&plain, None, target, || panic!("asked for CAs"));
        assert!(asked.is_ok());

        let dir = std::env::temp_dir().join(format!("outbox-usable-roots-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let file = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write the file");
            path
        };
        let cases = [
            (file("empty.pem", ""), "holds no PEM certificate"),
            (
                file(
                    "garbage.pem",
                    "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                ),
                "certificate 1 is no CA rustls can trust",
            ),
            (dir.join("missing.pem"), "cannot read it"),
        ];
        for (path, wanted) in cases {
            let message = usable_roots(&path).expect_err("refused").to_string();
            assert!(
                message.contains(wanted) && message.contains("SSL_CERT_FILE"),
                "{}: {message}",
                path.display()
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
