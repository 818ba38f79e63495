//! The rows the contract's unit tests map: the outbox table `setup` creates, a full row of
//! it, Debezium's table, and a mapper with a small size limit.

use bytes::Bytes;
use pgwire_replication::Lsn;

use crate::contract::columns::ColumnMap;
use crate::contract::mapper::{AllowedExchanges, Layout, Mapper};
use crate::contract::pg_text::type_oid;
use crate::contract::position::Position;
use crate::pgoutput::{Column, Relation, Tuple, TupleValue};

pub(super) fn column(name: &str, type_oid: u32) -> Column {
    Column {
        flags: 0,
        name: name.into(),
        type_oid,
        type_modifier: -1,
    }
}

pub(super) fn outbox_relation() -> Relation {
    Relation {
        oid: 16384,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns: vec![
            column("id", type_oid::UUID),
            column("event_type", 25),
            column("payload", type_oid::JSONB),
            column("headers", type_oid::JSONB),
            column("created_at", 1184),
            column("exchange", 25),
            column("routing_key", 25),
            column("aggregate_type", 25),
            column("aggregate_id", 25),
        ],
    }
}

pub(super) fn text(s: &str) -> TupleValue {
    TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

pub(super) fn row(values: Vec<TupleValue>) -> Tuple {
    Tuple(values)
}

pub(super) fn pos() -> Position {
    Position {
        commit_lsn: Lsn::from_u64(0x16B6C50),
        index: 3,
    }
}
pub(super) const ID: &str = "2b0b6f3e-8a6c-4a43-9a4f-0c1d2e3f4a5b";

pub(super) fn mapper() -> Mapper {
    Mapper::new("outbox", 1024, AllowedExchanges::Any).expect("mapper")
}

pub(super) fn full_row() -> Tuple {
    row(vec![
        text(ID),
        text("OrderCreated"),
        text(r#"{"order_id": 42}"#),
        text(r#"{"tenant": "a", "attempt": 2, "vip": true, "nested": {"x": 1}, "gone": null}"#),
        text("2026-11-30 06:26:09.123456+00"),
        TupleValue::Null,
        TupleValue::Null,
        text("order"),
        text("42"),
    ])
}

/// Debezium's documented outbox table, with an extra column of the team's own.
pub(super) fn debezium_relation() -> Relation {
    Relation {
        oid: 16385,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns: vec![
            column("id", type_oid::UUID),
            column("aggregatetype", 1043),
            column("aggregateid", 1043),
            column("type", 1043),
            column("payload", type_oid::JSONB),
            column("tenant", 25),
        ],
    }
}

pub(super) fn layout_default() -> Layout {
    Layout::for_relation(&outbox_relation(), &ColumnMap::default()).expect("layout")
}
