//! Decode errors. Each names the message kind and the wire field that was short or malformed,
//! so a log line alone says what the server sent. `Field` and `MessageKind` are `Copy`: the
//! decoder passes them to every read without building strings unless a read fails.
//!
//! A decode error is definite (the relay stops, acknowledging nothing past it): a message
//! that cannot be read must never be skipped, since it may be a row.

use std::fmt;

/// Why a pgoutput message could not be decoded. All are definite: the same bytes fail the same
/// way on every replay.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The buffer held no tag byte.
    #[error("Empty pgoutput message: no tag byte")]
    Empty,

    /// The message ended before a field was complete.
    #[error("{kind} message truncated: expected {expected} bytes for {field}, {left} left")]
    Truncated {
        kind: MessageKind,
        field: Field,
        expected: usize,
        left: usize,
    },

    /// A string ran to the end of the message without its NUL terminator.
    #[error("{kind} message truncated: no NUL terminator for {field} in the {left} bytes left")]
    UnterminatedString {
        kind: MessageKind,
        field: Field,
        left: usize,
    },

    /// A string was not valid UTF-8 (we never decode lossily).
    #[error("{kind} message has invalid UTF-8 in {field}")]
    InvalidUtf8 {
        kind: MessageKind,
        field: Field,
        #[source]
        source: std::str::Utf8Error,
    },

    /// A count or length was negative.
    #[error("{kind} message has a negative {field}: {value}")]
    NegativeLength {
        kind: MessageKind,
        field: Field,
        value: i32,
    },

    /// A marker byte had a value the protocol does not allow there.
    #[error("{kind} message has unexpected byte {found:#04x} for {field}, expected {expected}")]
    UnexpectedByte {
        kind: MessageKind,
        field: Field,
        found: u8,
        expected: &'static str,
    },

    /// Bytes were left over after a complete message.
    #[error("{kind} message has {count} trailing bytes after its last field")]
    TrailingBytes { kind: MessageKind, count: usize },
}

/// The kind of message being decoded when an error occurred.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    Begin,
    Commit,
    Origin,
    Relation,
    Type,
    Insert,
    Truncate,
    /// `M` (`pg_logical_emit_message`).
    Message,
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MessageKind::Begin => "Begin",
            MessageKind::Commit => "Commit",
            MessageKind::Origin => "Origin",
            MessageKind::Relation => "Relation",
            MessageKind::Type => "Type",
            MessageKind::Insert => "Insert",
            MessageKind::Truncate => "Truncate",
            MessageKind::Message => "Logical decoding",
        })
    }
}

/// The wire field being read. Column numbers are 0-based positions, the same numbering as
/// `Relation::column_index` and the tuple's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    FinalLsn,
    CommitTime,
    Xid,
    Flags,
    CommitLsn,
    EndLsn,
    OriginName,
    RelationOid,
    Namespace,
    Name,
    ReplicaIdentity,
    ColumnCount,
    ColumnFlags(u16),
    ColumnName(u16),
    ColumnTypeOid(u16),
    ColumnTypeModifier(u16),
    TypeOid,
    NewTupleMarker,
    ColumnKind(u16),
    ColumnLength(u16),
    ColumnValue(u16),
    RelationCount,
    Options,
    TruncatedRelationOid(u32),
    Lsn,
    Prefix,
    ContentLength,
    Content,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::FinalLsn => f.write_str("final LSN"),
            Field::CommitTime => f.write_str("commit time"),
            Field::Xid => f.write_str("transaction id"),
            Field::Flags => f.write_str("flags"),
            Field::CommitLsn => f.write_str("commit LSN"),
            Field::EndLsn => f.write_str("end LSN"),
            Field::OriginName => f.write_str("origin name"),
            Field::RelationOid => f.write_str("relation OID"),
            Field::Namespace => f.write_str("namespace"),
            Field::Name => f.write_str("name"),
            Field::ReplicaIdentity => f.write_str("replica identity"),
            Field::ColumnCount => f.write_str("column count"),
            Field::ColumnFlags(i) => write!(f, "column {i} flags"),
            Field::ColumnName(i) => write!(f, "column {i} name"),
            Field::ColumnTypeOid(i) => write!(f, "column {i} type OID"),
            Field::ColumnTypeModifier(i) => write!(f, "column {i} type modifier"),
            Field::TypeOid => f.write_str("type OID"),
            Field::NewTupleMarker => f.write_str("new tuple marker"),
            Field::ColumnKind(i) => write!(f, "column {i} kind"),
            Field::ColumnLength(i) => write!(f, "column {i} length"),
            Field::ColumnValue(i) => write!(f, "column {i} value"),
            Field::RelationCount => f.write_str("relation count"),
            Field::Options => f.write_str("options"),
            Field::TruncatedRelationOid(i) => write!(f, "relation OID {i}"),
            Field::Lsn => f.write_str("LSN"),
            Field::Prefix => f.write_str("prefix"),
            Field::ContentLength => f.write_str("content length"),
            Field::Content => f.write_str("content"),
        }
    }
}
