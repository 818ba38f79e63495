//! The inverse of [`super::decode`]: a message as PostgreSQL (protocol 1) sends it. For the
//! decoder's tests, which state each message as data, and for the fuzz target, which checks
//! that whatever decodes encodes back to the same bytes. Never part of a release build.

use bytes::Bytes;
use pgwire_replication::Lsn;

use super::messages::{LogicalMessage, Tuple, TupleValue};

/// Writes pgoutput fields, big-endian, the way PostgreSQL's `pq_send*` functions do.
#[derive(Default)]
pub(crate) struct Enc(Vec<u8>);

impl Enc {
    pub(crate) fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    pub(crate) fn i16(mut self, v: i16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn lsn(self, v: Lsn) -> Self {
        self.i64(v.as_u64() as i64)
    }
    pub(crate) fn cstr(mut self, s: &str) -> Self {
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        self
    }
    pub(crate) fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    /// Int32 length then the bytes.
    pub(crate) fn counted(self, b: &[u8]) -> Self {
        self.i32(b.len() as i32).raw(b)
    }
    pub(crate) fn tuple(self, t: &Tuple) -> Self {
        t.0.iter().fold(self.i16(t.0.len() as i16), |e, v| match v {
            TupleValue::Null => e.u8(b'n'),
            TupleValue::UnchangedToast => e.u8(b'u'),
            TupleValue::Text(b) => e.u8(b't').counted(b),
            TupleValue::Binary(b) => e.u8(b'b').counted(b),
        })
    }
    pub(crate) fn done(self) -> Bytes {
        Bytes::from(self.0)
    }
}

/// Encodes a message exactly as PostgreSQL (protocol 1) would send it.
pub(crate) fn encode(m: &LogicalMessage) -> Bytes {
    let e = Enc::default();
    match m {
        LogicalMessage::Begin(b) => e.u8(b'B').lsn(b.final_lsn).i64(b.commit_time).u32(b.xid),
        LogicalMessage::Commit(c) => e
            .u8(b'C')
            .u8(c.flags)
            .lsn(c.commit_lsn)
            .lsn(c.end_lsn)
            .i64(c.commit_time),
        LogicalMessage::Origin(o) => e.u8(b'O').lsn(o.commit_lsn).cstr(&o.name),
        LogicalMessage::Relation(r) => r.columns.iter().fold(
            e.u8(b'R')
                .u32(r.oid)
                .cstr(&r.namespace)
                .cstr(&r.name)
                .u8(r.replica_identity)
                .i16(r.columns.len() as i16),
            |e, c| {
                e.u8(c.flags)
                    .cstr(&c.name)
                    .u32(c.type_oid)
                    .i32(c.type_modifier)
            },
        ),
        LogicalMessage::Type(t) => e.u8(b'Y').u32(t.oid).cstr(&t.namespace).cstr(&t.name),
        LogicalMessage::Insert(i) => e.u8(b'I').u32(i.relation_oid).u8(b'N').tuple(&i.tuple),
        LogicalMessage::Truncate(t) => t.relation_oids.iter().fold(
            e.u8(b'T').i32(t.relation_oids.len() as i32).u8(t.options),
            |e, &oid| e.u32(oid),
        ),
        LogicalMessage::Message(m) => e
            .u8(b'M')
            .u8(u8::from(m.transactional))
            .lsn(m.lsn)
            .cstr(&m.prefix)
            .counted(&m.content),
        LogicalMessage::Skipped(tag) => e.u8(*tag),
    }
    .done()
}
