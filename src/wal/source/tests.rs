//! What the source hands delivery for each replication event, in process: events are built
//! here (pgoutput bytes by the decoder's own test encoder) and the inputs read back in order.
//! The integration tests run the same source against a real walsender; these pin down the
//! ack points, the numbering, and what is ignored, counted or handed over as unpublishable.

use std::time::SystemTime;

use bytes::Bytes;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use super::*;
use crate::catalog::preflight::OutboxTable;
use crate::config::HEARTBEAT_PREFIX;
use crate::contract::headers;
use crate::contract::mapper::AllowedExchanges;
use crate::contract::message::{HeaderValue, Message, Rejection};
use crate::error::CatalogError;
use crate::pgoutput::encode;
use crate::pgoutput::{Insert, Tuple, TupleValue};
use crate::wal::relations;

const EMIT_PREFIX: &str = "outbox-relay:emit:public.outbox";
const OUTBOX_OID: u32 = 16385;
const ORDERS_OID: u32 = 16390;
/// Where the catalog said the outbox is OUTBOX_OID: transactions committing before it are
/// history.
const SESSION_START: u64 = 0x5000;
/// Bodies over this are unpublishable (`--max-message-size`).
const MAX_MESSAGE_SIZE: usize = 64;

/// What one input says, in terms a test can compare.
#[derive(Debug, PartialEq)]
enum Out {
    Publish {
        id: String,
        seq: String,
        lsn: String,
        committed_at: Option<SystemTime>,
    },
    Unpublishable {
        id: Option<String>,
        rejection: &'static str,
        seq: Option<String>,
        committed_at: Option<SystemTime>,
    },
    Ack(AckPosition),
}

fn text_header(message: &Message, name: &str) -> String {
    match message.header(name) {
        Some(HeaderValue::Text(text)) => text.clone(),
        other => panic!("header {name} is {other:?}"),
    }
}

impl From<Input<AckPosition>> for Out {
    fn from(input: Input<AckPosition>) -> Self {
        match input {
            Input::Publish {
                message,
                committed_at,
            } => Out::Publish {
                id: message.message_id.clone(),
                seq: text_header(&message, headers::SEQ),
                lsn: text_header(&message, headers::LSN),
                committed_at,
            },
            Input::Unpublishable {
                unpublishable,
                committed_at,
            } => Out::Unpublishable {
                id: unpublishable.message_id.clone(),
                rejection: unpublishable.rejection.label(),
                seq: unpublishable
                    .original
                    .as_ref()
                    .map(|original| text_header(original, headers::SEQ)),
                committed_at,
            },
            Input::AckPoint(position) => Out::Ack(position),
        }
    }
}

/// A source for the outbox `public.outbox`, and the metrics it counts into.
struct Harness {
    source: Source,
    heartbeat: Heartbeat,
    metrics: PrometheusHandle,
}

impl Harness {
    fn new() -> Self {
        Self::for_shard(Shard::UNSHARDED)
    }

    fn for_shard(shard: Shard) -> Self {
        let recorder = PrometheusBuilder::new().build_recorder();
        let metrics = metrics::with_local_recorder(&recorder, StreamMetrics::new);
        let mapper = Mapper::new(
            "outbox",
            MAX_MESSAGE_SIZE,
            AllowedExchanges::parse(None, "outbox").expect("policy"),
        )
        .expect("mapper");
        let heartbeat = Heartbeat::new();
        Self {
            source: Source::new(
                mapper,
                RelationCache::new(
                    "public",
                    "outbox",
                    std::sync::Arc::default(),
                    OutboxTable {
                        oid: OUTBOX_OID,
                        named_since: lsn(SESSION_START),
                    },
                ),
                heartbeat.clone(),
                EMIT_PREFIX.into(),
                shard,
                metrics,
            ),
            heartbeat,
            metrics: recorder.handle(),
        }
    }

    /// Feeds `events` in order; the inputs they made, in order.
    fn feed(&mut self, events: Vec<ReplicationEvent>) -> Vec<Out> {
        events
            .into_iter()
            .filter_map(|event| self.source.on_event(event).expect("a valid event"))
            .map(Out::from)
            .collect()
    }

    /// A counter's value in the text exposition (`series`: name and labels as rendered).
    fn counted(&self, series: &str) -> u64 {
        let rendered = self.metrics.render();
        rendered
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .map_or(0, |value| value.parse().expect("a counter value"))
    }
}

const ROWS: &str = "outbox_relay_decoded_messages_total{source=\"row\"}";
const EMITTED: &str = "outbox_relay_decoded_messages_total{source=\"emitted\"}";
const IGNORED: &str = "outbox_relay_ignored_logical_messages_total";

fn lsn(n: u64) -> Lsn {
    Lsn::from_u64(n)
}

fn seq(commit_lsn: u64, index: u32) -> String {
    RowPosition {
        commit_lsn: lsn(commit_lsn),
        index,
    }
    .seq()
}

/// Each transaction here commits at `commit_lsn` (its Begin's final LSN), at the time of the
/// same number (µs since 2000), and ends 0x30 bytes later.
fn begin(commit_lsn: u64) -> ReplicationEvent {
    ReplicationEvent::Begin {
        final_lsn: lsn(commit_lsn),
        xid: 700,
        commit_time_micros: commit_lsn as i64,
    }
}

fn commit(commit_lsn: u64) -> ReplicationEvent {
    ReplicationEvent::Commit {
        lsn: lsn(commit_lsn),
        end_lsn: lsn(commit_lsn + 0x30),
        commit_time_micros: commit_lsn as i64,
    }
}

/// The ack point of the transaction that commits at `commit_lsn`.
fn committed(commit_lsn: u64) -> Out {
    Out::Ack(AckPosition::commit(
        lsn(commit_lsn + 0x30),
        commit_lsn as i64,
    ))
}

fn keepalive(wal_end: u64) -> ReplicationEvent {
    ReplicationEvent::KeepAlive {
        wal_end: lsn(wal_end),
        reply_requested: false,
        server_time_micros: 0,
    }
}

fn logical_message(transactional: bool, at: u64, prefix: &str, content: &str) -> ReplicationEvent {
    ReplicationEvent::Message {
        transactional,
        lsn: lsn(at),
        prefix: prefix.into(),
        content: Bytes::copy_from_slice(content.as_bytes()),
    }
}

/// An event the emit functions wrote, inside a transaction.
fn emitted(at: u64, content: &str) -> ReplicationEvent {
    logical_message(true, at, EMIT_PREFIX, content)
}

/// The envelope `outbox_emit` writes, with only what these tests need.
fn envelope(id: &str, shard_hash: Option<u32>) -> String {
    let hash = shard_hash.map_or(String::new(), |h| format!(r#", "shard_hash": {h}"#));
    format!(
        r#"{{"v": 1, "id": "{id}", "event_type": "Emitted", "payload_type": "jsonb", "payload": {{"n": 1}}{hash}}}"#
    )
}

/// pgoutput bytes in an XLogData frame, as the crate forwards what it does not decode.
fn data(message: LogicalMessage) -> ReplicationEvent {
    ReplicationEvent::XLogData {
        wal_start: lsn(0),
        wal_end: lsn(0),
        server_time_micros: 0,
        data: encode(&message),
    }
}

/// A Relation of `public.<name>`, every column text.
fn relation(oid: u32, name: &str, columns: &[&str]) -> ReplicationEvent {
    data(LogicalMessage::Relation(relations::tests::relation(
        oid, name, columns,
    )))
}

/// The outbox's Relation: the columns [`row`] fills, in this order.
fn outbox() -> ReplicationEvent {
    relation(OUTBOX_OID, "outbox", &["id", "event_type", "payload"])
}

fn insert(oid: u32, values: &[&str]) -> ReplicationEvent {
    data(LogicalMessage::Insert(Insert {
        relation_oid: oid,
        tuple: Tuple(
            values
                .iter()
                .map(|value| TupleValue::Text(Bytes::copy_from_slice(value.as_bytes())))
                .collect(),
        ),
    }))
}

/// An outbox row with id `id`, for the columns of [`outbox`].
fn row(id: &str) -> ReplicationEvent {
    insert(OUTBOX_OID, &[id, "Created", "{}"])
}

/// Row or event `id`, `index`th of the transaction that commits at `commit_lsn`.
fn published(id: &str, commit_lsn: u64, index: u32) -> Out {
    Out::Publish {
        id: id.into(),
        seq: seq(commit_lsn, index),
        lsn: lsn(commit_lsn).to_string(),
        committed_at: Some(pg_timestamp(commit_lsn as i64)),
    }
}

#[test]
fn a_transaction_is_acknowledged_only_after_its_rows_at_its_commit() {
    let mut h = Harness::new();
    assert!(!h.source.in_transaction());
    let opened = h.feed(vec![begin(0x1000), outbox(), row("a")]);
    assert!(
        h.source.in_transaction(),
        "a graceful stop waits for the commit"
    );
    // A keepalive inside a transaction says nothing of the rows still to come.
    let rest = h.feed(vec![
        keepalive(0x5000),
        row("b"),
        logical_message(false, 0x1010, "app:marker", "x"),
        commit(0x1000),
    ]);
    assert!(!h.source.in_transaction());
    assert_eq!(opened, vec![published("a", 0x1000, 0)]);
    assert_eq!(
        rest,
        vec![published("b", 0x1000, 1), committed(0x1000)],
        "no ack point before the commit; the commit's end after its rows"
    );
    assert_eq!(h.counted(ROWS), 2);
}

#[test]
fn outside_a_transaction_keepalives_and_other_messages_advance() {
    let mut h = Harness::new();
    let own = h.heartbeat.content(1_234);
    let out = h.feed(vec![
        keepalive(0x100),
        logical_message(false, 0x200, "app:marker", "x"),
        logical_message(false, 0x300, HEARTBEAT_PREFIX, &own),
        // Another relay's heartbeat is an idle point, not ours to measure lag with.
        logical_message(false, 0x400, HEARTBEAT_PREFIX, "someone-else 99"),
    ]);
    assert_eq!(
        out,
        vec![
            Out::Ack(AckPosition::idle(lsn(0x100))),
            Out::Ack(AckPosition::idle(lsn(0x200))),
            Out::Ack(AckPosition::heartbeat(lsn(0x300), 1_234)),
            Out::Ack(AckPosition::idle(lsn(0x400))),
        ]
    );
    assert_eq!(
        h.counted(IGNORED),
        0,
        "messages outside a transaction are ack points"
    );
}

#[test]
fn rows_and_emitted_events_share_one_numbering_per_transaction() {
    let mut h = Harness::new();
    let out = h.feed(vec![
        begin(0x1000),
        outbox(),
        row("r0"),
        emitted(0x1008, &envelope("e1", None)),
        row("r2"),
        emitted(0x1018, &envelope("e3", None)),
        commit(0x1000),
        begin(0x2000),
        emitted(0x2008, &envelope("e0", None)),
        row("r1"),
        commit(0x2000),
    ]);
    assert_eq!(
        out,
        vec![
            published("r0", 0x1000, 0),
            published("e1", 0x1000, 1),
            published("r2", 0x1000, 2),
            published("e3", 0x1000, 3),
            committed(0x1000),
            published("e0", 0x2000, 0),
            published("r1", 0x2000, 1),
            committed(0x2000),
        ],
        "numbered in WAL order from 0 in each transaction, by its commit LSN"
    );
    assert_eq!((h.counted(ROWS), h.counted(EMITTED)), (3, 3));
}

#[test]
fn messages_with_other_prefixes_are_ignored_and_counted() {
    let mut h = Harness::new();
    let out = h.feed(vec![
        begin(0x1000),
        outbox(),
        row("r0"),
        logical_message(
            true,
            0x1008,
            "other-outbox:emit:public.outbox",
            &envelope("x", None),
        ),
        logical_message(true, 0x1010, HEARTBEAT_PREFIX, "x"),
        row("r1"),
        commit(0x1000),
    ]);
    assert_eq!(
        out,
        vec![
            published("r0", 0x1000, 0),
            published("r1", 0x1000, 1),
            committed(0x1000),
        ],
        "never published, and they take no place in the numbering"
    );
    assert_eq!(h.counted(IGNORED), 2);
    assert_eq!(h.counted(EMITTED), 0);
}

#[test]
fn what_cannot_be_published_is_handed_over_in_its_place() {
    let mut h = Harness::new();
    let too_large = format!("\"{}\"", "x".repeat(MAX_MESSAGE_SIZE));
    let out = h.feed(vec![
        begin(0x1000),
        outbox(),
        row("r0"),
        insert(OUTBOX_OID, &["big", "Created", &too_large]),
        emitted(0x1010, r#"{"v": 1, "id": "e2"}"#),
        emitted(0x1018, "not json"),
        row("r4"),
        commit(0x1000),
        // Written with pg_logical_emit_message(false, …): part of no transaction, so never
        // an event, and placed at its own LSN.
        logical_message(false, 0x1040, EMIT_PREFIX, &envelope("loose", None)),
    ]);
    let committed_at = Some(pg_timestamp(0x1000));
    assert_eq!(
        out,
        vec![
            published("r0", 0x1000, 0),
            Out::Unpublishable {
                id: Some("big".into()),
                rejection: "too_large",
                seq: Some(seq(0x1000, 1)),
                committed_at,
            },
            Out::Unpublishable {
                id: None,
                rejection: "unmappable",
                seq: Some(seq(0x1000, 2)),
                committed_at,
            },
            Out::Unpublishable {
                id: None,
                rejection: "unmappable",
                seq: Some(seq(0x1000, 3)),
                committed_at,
            },
            published("r4", 0x1000, 4),
            committed(0x1000),
            Out::Unpublishable {
                id: None,
                rejection: "unmappable",
                seq: Some(seq(0x1040, 0)),
                committed_at: None,
            },
        ],
        "each in its own place, for delivery's policy: none dropped"
    );
}

#[test]
fn rows_of_another_table_are_ignored_with_their_relation() {
    let mut h = Harness::new();
    let out = h.feed(vec![
        begin(0x1000),
        relation(ORDERS_OID, "orders", &["id", "total"]),
        insert(ORDERS_OID, &["1", "10"]),
        outbox(),
        insert(ORDERS_OID, &["2", "20"]),
        row("r0"),
        commit(0x1000),
    ]);
    assert_eq!(
        out,
        vec![published("r0", 0x1000, 0), committed(0x1000)],
        "another table's rows take no place in the numbering"
    );
    assert_eq!(h.counted(ROWS), 1);
}

#[test]
fn relations_are_per_session_and_follow_schema_changes() {
    let mut h = Harness::new();
    let out = h.feed(vec![
        begin(0x1000),
        outbox(),
        row("r0"),
        commit(0x1000),
        // Known in a later transaction of the session, until a schema change replaces it.
        begin(0x2000),
        row("r1"),
        relation(OUTBOX_OID, "outbox", &["event_type", "id", "payload"]),
        insert(OUTBOX_OID, &["Created", "r2", "{}"]),
        commit(0x2000),
    ]);
    assert_eq!(
        out,
        vec![
            published("r0", 0x1000, 0),
            committed(0x1000),
            published("r1", 0x2000, 0),
            published("r2", 0x2000, 1),
            committed(0x2000),
        ]
    );
    // A new session's source knows no relation: the server sends every Relation again, and a
    // row before its Relation is a protocol break, not a row to guess the columns of.
    let mut next = Harness::new();
    next.feed(vec![begin(0x3000)]);
    assert!(matches!(
        next.source.on_event(row("r3")),
        Err(RelayError::Protocol(_))
    ));
    // A schema change that drops a required column is definite, before any of its rows.
    assert!(next
        .source
        .on_event(relation(OUTBOX_OID, "outbox", &["id", "payload"]))
        .is_err());
}

/// A renamed outbox stops the source at the Relation, before its transaction's rows: nothing
/// of it reaches delivery. Renamed and back before the session, its rows are published.
#[test]
fn a_renamed_outbox_stops_before_its_rows() {
    let renamed = || {
        relation(
            OUTBOX_OID,
            "outbox_renamed",
            &["id", "event_type", "payload"],
        )
    };
    let mut h = Harness::new();
    let out = h.feed(vec![
        begin(0x1000),
        renamed(),
        row("r0"),
        commit(0x1000),
        begin(0x2000),
        outbox(),
        row("r1"),
        commit(0x2000),
    ]);
    assert_eq!(
        out,
        vec![
            published("r0", 0x1000, 0),
            committed(0x1000),
            published("r1", 0x2000, 0),
            committed(0x2000),
        ],
        "history: renamed and back before the session"
    );
    h.feed(vec![begin(SESSION_START), row("r2")]);
    assert!(matches!(
        h.source.on_event(renamed()),
        Err(RelayError::Catalog(CatalogError::OutboxRenamed { .. }))
    ));
}

#[test]
fn what_breaks_the_protocol_is_an_error() {
    let mut h = Harness::new();
    h.feed(vec![outbox()]);
    assert!(matches!(
        h.source.on_event(row("r0")),
        Err(RelayError::Protocol(_))
    ));
    assert!(matches!(
        h.source.on_event(emitted(0x1008, &envelope("e", None))),
        Err(RelayError::Protocol(_))
    ));
    let garbage = ReplicationEvent::XLogData {
        wal_start: lsn(0),
        wal_end: lsn(0),
        server_time_micros: 0,
        data: Bytes::from_static(b"I\x00"),
    };
    assert!(matches!(
        h.source.on_event(garbage),
        Err(RelayError::Decode(_))
    ));
}

#[test]
fn a_sharded_relay_takes_only_its_shards_events() {
    let events = || {
        vec![
            begin(0x1000),
            outbox(),
            emitted(0x1008, &envelope("hash-3", Some(3))),
            emitted(0x1010, &envelope("hash-4", Some(4))),
            emitted(0x1018, &envelope("no-hash", None)),
            // The publication's row filter chooses rows: the source takes every row it gets.
            row("r"),
            commit(0x1000),
        ]
    };
    let mut one = Harness::for_shard(Shard::new(1, 2).expect("shard"));
    assert_eq!(
        one.feed(events()),
        vec![
            published("hash-3", 0x1000, 0),
            published("r", 0x1000, 1),
            committed(0x1000),
        ]
    );
    assert_eq!(one.counted(IGNORED), 2);
    // An event without a readable hash is shard 0's, which applies the policy to it once.
    let mut zero = Harness::for_shard(Shard::new(0, 2).expect("shard"));
    assert_eq!(
        zero.feed(events()),
        vec![
            published("hash-4", 0x1000, 0),
            published("no-hash", 0x1000, 1),
            published("r", 0x1000, 2),
            committed(0x1000),
        ]
    );
    assert_eq!(zero.counted(IGNORED), 1);
}

#[test]
fn rejections_name_what_a_dead_letter_would_carry() {
    // The handed-over rejection is the mapper's, unchanged: delivery writes it into the
    // dead letter's reason.
    let mut h = Harness::new();
    let too_large = format!("\"{}\"", "x".repeat(MAX_MESSAGE_SIZE));
    h.feed(vec![begin(0x1000), outbox()]);
    let input = h
        .source
        .on_event(insert(OUTBOX_OID, &["big", "Created", &too_large]))
        .expect("a valid event");
    let Some(Input::Unpublishable { unpublishable, .. }) = input else {
        panic!("not handed over as unpublishable");
    };
    assert_eq!(
        unpublishable.rejection,
        Rejection::TooLarge {
            size: too_large.len(),
            limit: MAX_MESSAGE_SIZE
        }
    );
}
