//! The decoded pgoutput messages: plain data, one struct per message kind.
//!
//! Values stay as the wire gave them (`Bytes` slices of the received buffer); turning text into
//! typed values is the mapper's job, because only it knows which columns it needs.

use bytes::Bytes;
use pgwire_replication::Lsn;

/// One decoded pgoutput (protocol version 1) message.
#[derive(Debug, Clone, PartialEq)]
pub enum LogicalMessage {
    /// `B`: a transaction starts.
    Begin(Begin),
    /// `C`: a transaction committed; its `end_lsn` is the ack point.
    Commit(Commit),
    /// `O`: the transaction came from another node (replication origin).
    Origin(Origin),
    /// `R`: the schema of a table, sent before its first row and after each schema change.
    Relation(Relation),
    /// `Y`: a non-builtin type used by a column of a following Relation.
    Type(TypeMessage),
    /// `I`: a new row.
    Insert(Insert),
    /// `T`: tables were truncated.
    Truncate(Truncate),
    /// `M`: a `pg_logical_emit_message()` message (only with the `messages` option).
    Message(LogicalDecodingMessage),
    /// A tag we do not use (`U` update, `D` delete) or do not know; holds the tag byte. The body
    /// is not checked: we cannot validate what we do not decode, and a publication filtered to
    /// INSERT should not send these at all.
    Skipped(u8),
}

/// `B`: start of a transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Begin {
    /// LSN of the transaction's commit record.
    pub final_lsn: Lsn,
    /// Commit time, microseconds since 2000-01-01 (the PostgreSQL epoch).
    pub commit_time: i64,
    /// Transaction id.
    pub xid: u32,
}

/// `C`: end of a transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    /// Unused by PostgreSQL so far (always 0); kept raw rather than rejected.
    pub flags: u8,
    /// LSN of the commit record.
    pub commit_lsn: Lsn,
    /// LSN just past the commit record: the position to acknowledge once every row of the
    /// transaction is confirmed.
    pub end_lsn: Lsn,
    /// Commit time, microseconds since 2000-01-01.
    pub commit_time: i64,
}

/// `O`: replication origin of the current transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Origin {
    /// Commit LSN on the origin server.
    pub commit_lsn: Lsn,
    /// Origin name.
    pub name: String,
}

/// `R`: a table's schema. Rows (`Insert`) refer to it by `oid`; values are in `columns` order.
#[derive(Debug, Clone, PartialEq)]
pub struct Relation {
    /// Table OID, the key of the relation cache.
    pub oid: u32,
    /// Schema name (PostgreSQL sends an empty string for `pg_catalog`).
    pub namespace: String,
    /// Table name.
    pub name: String,
    /// `relreplident`: `d` default, `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    /// Columns in the order their values appear in a tuple.
    pub columns: Vec<Column>,
}

impl Relation {
    /// Position of the column called `name` (exact, case-sensitive match), i.e. the index of its
    /// value in an `Insert`'s tuple. The mapper resolves the columns it needs once per Relation
    /// instead of searching names for every row.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// `namespace.name`, as compared with the configured outbox table and shown in logs.
    pub fn qualified_name(&self) -> String {
        format!("{}.{}", self.namespace, self.name)
    }
}

/// One column of a `Relation`.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// 1 if the column is part of the replica identity key, else 0.
    pub flags: u8,
    /// Column name.
    pub name: String,
    /// OID of the column's type.
    pub type_oid: u32,
    /// `atttypmod` (e.g. the length of a `varchar(n)`); -1 when there is none.
    pub type_modifier: i32,
}

/// `Y`: a type referenced by a later Relation.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeMessage {
    /// Type OID.
    pub oid: u32,
    /// Schema name (empty for `pg_catalog`).
    pub namespace: String,
    /// Type name.
    pub name: String,
}

/// `I`: one inserted row.
#[derive(Debug, Clone, PartialEq)]
pub struct Insert {
    /// OID of the Relation (received earlier on this connection) that describes the row.
    pub relation_oid: u32,
    /// The new row, one value per column of the Relation.
    pub tuple: Tuple,
}

/// `T`: truncated tables.
#[derive(Debug, Clone, PartialEq)]
pub struct Truncate {
    /// Bit 0: `CASCADE`; bit 1: `RESTART IDENTITY`.
    pub options: u8,
    /// OIDs of the truncated tables.
    pub relation_oids: Vec<u32>,
}

/// `M`: a message emitted with `pg_logical_emit_message()`.
#[derive(Debug, Clone, PartialEq)]
pub struct LogicalDecodingMessage {
    /// Emitted inside a transaction (delivered at its commit) rather than immediately.
    pub transactional: bool,
    /// LSN of the message.
    pub lsn: Lsn,
    /// Application prefix that tells messages apart.
    pub prefix: String,
    /// Payload: a slice of the received buffer, not a copy.
    pub content: Bytes,
}

/// The column values of a row, in Relation column order.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuple(pub Vec<TupleValue>);

/// One column value of a row.
#[derive(Debug, Clone, PartialEq)]
pub enum TupleValue {
    /// `n`: SQL NULL.
    Null,
    /// `u`: an unchanged TOASTed value whose data was not sent. Only updates can produce it; in
    /// an Insert it means the row is incomplete, and the mapper reports it as an error.
    UnchangedToast,
    /// `t`: the value in text format (a slice of the received buffer).
    Text(Bytes),
    /// `b`: the value in binary format (only with the `binary` option; a slice of the buffer).
    Binary(Bytes),
}
