//! The two limits a relay figure is set against, measured in the same run.
//!
//! - Broker alone: the relay's own delivery loop (`publish::deliver`: the broker connection,
//!   the in-flight window and the in-order confirm queue) sending messages the relay's mapper
//!   built from a synthetic outbox row — same size, persistence, `mandatory`, exchange and kind
//!   of durable queue — with the same confirm window, received by the same consumer. No
//!   PostgreSQL.
//! - Decoding alone: the slot drained with pgwire-replication, our pgoutput decoder and the
//!   mapper, nothing published: what the relay does minus the broker.
//!
//! Both call the relay's own decoder, mapper and delivery loop, never copies of them: they
//! are what the relay's code can do, minus one side. They share the relay's costs, so they
//! cannot show them: [`crate::measurement::independent`] has the limits that share no code with the relay.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use lapin::types::FieldTable;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationEvent};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::measurement::cpu::{self, CpuProbe, CpuSplit};
use crate::measurement::delivery::{Latency, Report};
use crate::measurement::writers::{CommittedRow, Written, ORDER_NOTE_LEN};
use outbox_relay::internals::{
    connect_to, decode, deliver, outbox_table, primary, replication_config, Acked,
    AllowedExchanges, Broker, BrokerNodes, Column, DeliveryOptions, Input, Known, Layout,
    LogicalMessage, Mapper, Message, Position, Relation, RelationCache, RelayMetrics, TableName,
    Tuple, TupleValue, CLIENT_EVENT_BUFFER,
};
use outbox_testkit::arrivals::{ArrivalConsumer, QueueSpec};

/// How long a limit run may wait for its last message.
const TIMEOUT: Duration = Duration::from_secs(300);

/// Synthetic outbox rows, mapped by the relay's own mapper: the broker-alone messages carry
/// exactly the properties and headers a relayed row does.
pub struct SyntheticRows {
    layout: Layout,
    mapper: Mapper,
    event_type: String,
    created_at: Bytes,
    /// The payload's `note` padding ([`ORDER_NOTE_LEN`]: a ~200-byte order).
    note_len: u32,
}

mod type_oid {
    pub const UUID: u32 = 2950;
    pub const TEXT: u32 = 25;
    pub const JSONB: u32 = 3802;
    pub const TIMESTAMPTZ: u32 = 1184;
}

impl SyntheticRows {
    pub fn new(exchange: &str, event_type: &str) -> Result<SyntheticRows> {
        let column = |name: &str, type_oid: u32| Column {
            flags: 0,
            name: name.into(),
            type_oid,
            type_modifier: -1,
        };
        let relation = Relation {
            oid: 1,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: vec![
                column("id", type_oid::UUID),
                column("event_type", type_oid::TEXT),
                column("payload", type_oid::JSONB),
                column("created_at", type_oid::TIMESTAMPTZ),
            ],
        };
        Ok(SyntheticRows {
            layout: Layout::for_relation(&relation, &Default::default())?,
            mapper: Mapper::new(exchange, usize::MAX, AllowedExchanges::Any)
                .map_err(anyhow::Error::msg)?,
            event_type: event_type.to_string(),
            created_at: Bytes::from_static(b"2026-01-01 00:00:00.123456+00"),
            note_len: ORDER_NOTE_LEN,
        })
    }

    /// The same rows with `note_len` bytes of padding in each payload.
    pub fn with_note_len(self, note_len: u32) -> SyntheticRows {
        SyntheticRows { note_len, ..self }
    }

    /// Row `n` as the relay would publish it (the payload shaped like a seeded order).
    pub fn message(&self, n: u64) -> Result<Message> {
        let (id, payload) = synthetic_order_padded(n, self.note_len);
        let tuple = Tuple(vec![
            TupleValue::Text(Bytes::from(id)),
            TupleValue::Text(Bytes::from(self.event_type.clone())),
            TupleValue::Text(Bytes::from(payload)),
            TupleValue::Text(self.created_at.clone()),
        ]);
        let position = Position {
            commit_lsn: Lsn::from_u64(n + 1),
            index: 0,
        };
        Ok(self.mapper.map(&self.layout, &tuple, Some(position))?)
    }
}

/// The id and payload of synthetic row `n`, shared by [`SyntheticRows`] and the minimal
/// publisher (`independent::bare_message`): a ~200-byte order shaped like a seeded one.
pub fn synthetic_order(n: u64) -> (String, String) {
    synthetic_order_padded(n, ORDER_NOTE_LEN)
}

/// [`synthetic_order`] with `note_len` bytes of padding: the body of a larger payload.
pub fn synthetic_order_padded(n: u64, note_len: u32) -> (String, String) {
    let id = format!("00000000-0000-4000-8000-{n:012x}");
    let payload = format!(
        "{{\"note\": \"{}\", \"total_cents\": {}, \"order_id\": {n}, \"status\": \"created\", \
         \"currency\": \"EUR\", \"customer_id\": {}}}",
        "x".repeat(note_len as usize),
        (n * 7919) % 100_000,
        n % 9973
    );
    (id, payload)
}

/// What the broker-alone publisher measured.
#[derive(Debug, Clone)]
pub struct BrokerRun {
    pub messages: u64,
    /// Messages per second, from the first publish to the last confirm.
    pub confirmed_per_sec: f64,
    /// Messages per second, from the first publish to the consumer's last receipt.
    pub received_per_sec: f64,
    /// Publish-to-receipt latency (paced runs).
    pub latency: Option<Latency>,
    pub missing: usize,
    /// RabbitMQ's and this process's CPU per message (publisher and consumer), from the first
    /// publish to the last receipt.
    pub cpu: CpuSplit,
}

/// Where the broker-alone publisher and consumer connect, and the kind of queue.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// The publisher's broker (a list is tried the way the relay tries it).
    pub publish: String,
    /// The consumer's broker: one URL. The consumer declares the queue, so a quorum queue's
    /// leader is this node.
    pub consume: String,
    /// The queue's declare arguments (empty: a classic queue).
    pub queue_arguments: FieldTable,
    /// Every node of the broker, whose processes the CPU split counts: on a cluster a
    /// publish costs the node it enters, the queue's leader and its followers, and the relay's
    /// drains count all three, so the broker alone must too.
    pub nodes: String,
}

impl Endpoints {
    /// Everything on one broker, classic queues.
    pub fn single(amqp_url: &str) -> Endpoints {
        Endpoints {
            publish: amqp_url.to_string(),
            nodes: amqp_url.to_string(),
            consume: amqp_url.to_string(),
            queue_arguments: FieldTable::default(),
        }
    }
}

/// Publishes `messages` synthetic messages through the relay's publisher with `window`
/// unconfirmed at most; paced at `rate` per second if given, as fast as confirms allow if not.
/// The consumer reads `queue`, bound to `exchange` with the messages' routing key. Each
/// payload carries `note_len` bytes of padding ([`ORDER_NOTE_LEN`]: a ~200-byte order).
pub async fn broker_alone(
    endpoints: &Endpoints,
    exchange: &str,
    queue: &str,
    window: usize,
    messages: u64,
    rate: Option<u32>,
    note_len: u32,
) -> Result<BrokerRun> {
    let event_type = format!("bench.{queue}");
    let rows = SyntheticRows::new(exchange, &event_type)?.with_note_len(note_len);
    let spec = QueueSpec {
        exchange: exchange.to_string(),
        queue: queue.to_string(),
        arguments: endpoints.queue_arguments.clone(),
        binding_key: event_type,
        purge: true,
        prefetch: 1000,
        delete_on_close: true,
    };
    let nodes = std::sync::Arc::new(BrokerNodes::parse(&endpoints.publish)?);
    let broker = Broker::connect(&nodes)
        .await
        .context("the broker-alone publisher cannot connect")?;
    // What `outbox-relay setup` declares: this may run before any setup did.
    broker.declare_exchange(exchange, false).await?;
    let mut consumer = ArrivalConsumer::start(&endpoints.consume, &spec).await?;
    let mut ticks = rate.map(|rate| {
        let mut ticks = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    });
    let mut written = Written::default();
    let rabbitmq = cpu::rabbitmq_pids(&endpoints.nodes).unwrap_or_default();
    let probe = CpuProbe::start(&rabbitmq);
    let started = Instant::now();
    written.started = Some(started);
    // The relay's own delivery loop, fed one message at a time: the window is its.
    let (inputs, inputs_rx) = mpsc::channel(1);
    let options = DeliveryOptions {
        window,
        ..DeliveryOptions::batch(TIMEOUT)
    };
    let (acked, _) = watch::channel(Acked::<()>::default());
    let metrics = RelayMetrics::new();
    let mut sent = 0u64;
    let produce = async {
        let inputs = inputs;
        while sent < messages {
            if let Some(ticks) = ticks.as_mut() {
                ticks.tick().await;
            }
            let message = rows.message(sent)?;
            let id = message.message_id.clone();
            // Taken as the publish is handed over, as a writer takes it right after COMMIT.
            let at = Instant::now();
            let input = Input::Publish {
                message,
                committed_at: None,
            };
            if inputs.send(input).await.is_err() {
                break;
            }
            written.rows.push(CommittedRow {
                id,
                writer: 0,
                committed_at: at,
            });
            sent += 1;
        }
        Ok::<_, anyhow::Error>(())
    };
    let (produced, delivered) = tokio::join!(
        produce,
        deliver(&broker, &options, &metrics, inputs_rx, &acked)
    );
    let last_confirm = Instant::now();
    produced?;
    delivered?;
    broker.close().await;
    written.transactions = sent;
    let deadline = Instant::now() + TIMEOUT;
    let mut received = 0;
    while received < written.rows.len() {
        if !consumer.wait_for_more(deadline).await? {
            break;
        }
        received = consumer.arrivals().len();
    }
    let cpu = probe.finish(received as u64, None, None);
    let arrivals = consumer.close().await;
    let report = Report::analyze(&written, &arrivals);
    let per_sec = |end: Instant| {
        let seconds = end.saturating_duration_since(started).as_secs_f64();
        if seconds > 0.0 {
            messages as f64 / seconds
        } else {
            0.0
        }
    };
    let last_receipt = arrivals.iter().map(|a| a.received_at).max();
    Ok(BrokerRun {
        messages,
        confirmed_per_sec: per_sec(last_confirm),
        received_per_sec: last_receipt.map(per_sec).unwrap_or(0.0),
        latency: report.latency,
        missing: report.missing,
        cpu,
    })
}

/// What draining the slot without publishing measured.
#[derive(Debug, Clone)]
pub struct DecodeRun {
    pub rows: u64,
    pub seconds: f64,
    pub rows_per_sec: f64,
}

/// Streams `slot` from its confirmed position until `rows` outbox rows were decoded and mapped,
/// publishing nothing. The slot is left where it was (nothing is acknowledged).
pub async fn decode_alone(
    database_url: &str,
    slot: &str,
    publication: &str,
    table: &str,
    exchange: &str,
    rows: u64,
) -> Result<DecodeRun> {
    let server = primary(database_url).await?;
    let config = replication_config(database_url, &server, slot, publication)?
        .with_buffer_size(CLIENT_EVENT_BUFFER);
    // Which table is the outbox: decoding alone needs the cache the relay's session builds.
    let outbox = TableName {
        name: table.to_string(),
    };
    let outbox = outbox_table(&connect_to(database_url, &server).await?, &outbox).await?;
    let mut client = ReplicationClient::connect(config).await?;
    client.wait_started().await?;
    let started = Instant::now();
    let mapper =
        Mapper::new(exchange, usize::MAX, AllowedExchanges::Any).map_err(anyhow::Error::msg)?;
    let mut relations = RelationCache::new("public", table, std::sync::Arc::default(), outbox);
    let mut commit_lsn = Lsn::from_u64(0);
    let mut index = 0u32;
    let mut decoded = 0u64;
    let deadline = started + TIMEOUT;
    while decoded < rows {
        let event = tokio::time::timeout_at(deadline, client.recv())
            .await
            .context("decoding alone timed out")??;
        match event {
            Some(ReplicationEvent::Begin { final_lsn, .. }) => {
                commit_lsn = final_lsn;
                index = 0;
            }
            Some(ReplicationEvent::XLogData { data, .. }) => match decode(&data)? {
                LogicalMessage::Relation(relation) => {
                    relations.update(&relation, Some(commit_lsn))?
                }
                LogicalMessage::Insert(insert) => {
                    if let Known::Outbox(layout) = relations.get(insert.relation_oid)? {
                        let position = Position { commit_lsn, index };
                        index += 1;
                        let message = mapper.map(layout, &insert.tuple, Some(position))?;
                        std::hint::black_box(message);
                        decoded += 1;
                    }
                }
                _ => {}
            },
            Some(_) => {}
            None => bail!("the replication stream ended after {decoded} rows"),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    client.abort();
    Ok(DecodeRun {
        rows,
        seconds,
        rows_per_sec: if seconds > 0.0 {
            rows as f64 / seconds
        } else {
            0.0
        },
    })
}
