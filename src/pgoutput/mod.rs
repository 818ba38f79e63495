//! Decoder for the pgoutput logical replication protocol, version 1 (no streaming), on `Bytes`.
//!
//! Protocol 1 has the tags `B` Begin, `C` Commit, `O` Origin, `R` Relation, `Y` Type,
//! `I` Insert, `U` Update, `D` Delete, `T` Truncate and `M` Message (with the `messages`
//! option). We decode all but `U` and `D`, which the publication (INSERT only) does not send;
//! those and any tag unknown to protocol 1 come back as [`LogicalMessage::Skipped`] so the
//! caller decides whether to care.
//!
//! pgwire-replication already turns `B`, `C` and `M` into its own events in the live stream and
//! hands us the rest raw. We decode those three anyway, so tests can build a whole transaction
//! and anything the crate forwards raw goes through the same code path.
//!
//! Values are not parsed here: `t` values are text shaped by the session settings the relay
//! pins (DateStyle, TimeZone, ...), and they stay slices of the received buffer (zero copy: the
//! hot path runs at ~30k rows/s). A `u` (unchanged TOAST) value cannot legitimately appear in an
//! INSERT, which always carries the full row; we decode it faithfully and the mapper turns it
//! into an error naming the row.
//!
//! Every read is bounds-checked (`cursor.rs`): truncated or malformed input of any kind, and
//! trailing bytes after a complete message, is a [`DecodeError`], never a panic.

mod cursor;
// The encoder builds pgoutput bytes for the decoder's tests, other modules' tests (wal/source)
// and the fuzz target's round trip; the relay itself never encodes.
#[cfg(any(test, feature = "fuzzing"))]
mod encode;
mod error;
mod messages;
#[cfg(test)]
mod tests;

use bytes::Bytes;

use cursor::Cursor;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use encode::encode;
#[cfg(test)]
pub(crate) use encode::Enc;
pub(crate) use error::{DecodeError, Field, MessageKind};
pub(crate) use messages::{
    Begin, Commit, Insert, LogicalDecodingMessage, Origin, Truncate, TypeMessage,
};
pub use messages::{Column, LogicalMessage, Relation, Tuple, TupleValue};

/// Decodes one pgoutput message (the payload of an XLogData frame). Value bytes in the result
/// are slices of `data`.
pub fn decode(data: &Bytes) -> Result<LogicalMessage, DecodeError> {
    let Some(&tag) = data.first() else {
        return Err(DecodeError::Empty);
    };
    let kind = match tag {
        b'B' => MessageKind::Begin,
        b'C' => MessageKind::Commit,
        b'O' => MessageKind::Origin,
        b'R' => MessageKind::Relation,
        b'Y' => MessageKind::Type,
        b'I' => MessageKind::Insert,
        b'T' => MessageKind::Truncate,
        b'M' => MessageKind::Message,
        other => return Ok(LogicalMessage::Skipped(other)),
    };
    let mut c = Cursor::new(data, 1, kind);
    let message = match kind {
        MessageKind::Begin => LogicalMessage::Begin(begin(&mut c)?),
        MessageKind::Commit => LogicalMessage::Commit(commit(&mut c)?),
        MessageKind::Origin => LogicalMessage::Origin(origin(&mut c)?),
        MessageKind::Relation => LogicalMessage::Relation(relation(&mut c)?),
        MessageKind::Type => LogicalMessage::Type(type_message(&mut c)?),
        MessageKind::Insert => LogicalMessage::Insert(insert(&mut c)?),
        MessageKind::Truncate => LogicalMessage::Truncate(truncate(&mut c)?),
        MessageKind::Message => LogicalMessage::Message(message(&mut c)?),
    };
    c.finish()?;
    Ok(message)
}

fn begin(c: &mut Cursor<'_>) -> Result<Begin, DecodeError> {
    Ok(Begin {
        final_lsn: c.lsn(Field::FinalLsn)?,
        commit_time: c.i64(Field::CommitTime)?,
        xid: c.u32(Field::Xid)?,
    })
}

fn commit(c: &mut Cursor<'_>) -> Result<Commit, DecodeError> {
    Ok(Commit {
        flags: c.u8(Field::Flags)?,
        commit_lsn: c.lsn(Field::CommitLsn)?,
        end_lsn: c.lsn(Field::EndLsn)?,
        commit_time: c.i64(Field::CommitTime)?,
    })
}

fn origin(c: &mut Cursor<'_>) -> Result<Origin, DecodeError> {
    Ok(Origin {
        commit_lsn: c.lsn(Field::CommitLsn)?,
        name: c.cstr(Field::OriginName)?,
    })
}

/// Smallest wire size of one Relation column: flags, empty name + NUL, type OID, modifier.
const MIN_COLUMN_LEN: usize = 1 + 1 + 4 + 4;

fn relation(c: &mut Cursor<'_>) -> Result<Relation, DecodeError> {
    let oid = c.u32(Field::RelationOid)?;
    let namespace = c.cstr(Field::Namespace)?;
    let name = c.cstr(Field::Name)?;
    let replica_identity = c.u8(Field::ReplicaIdentity)?;
    let count = c.count16(Field::ColumnCount)?;
    // Capacity bounded by what the input can hold, so a bogus count allocates nothing big.
    let mut columns = Vec::with_capacity(usize::from(count).min(c.remaining() / MIN_COLUMN_LEN));
    for i in 0..count {
        columns.push(Column {
            flags: c.u8(Field::ColumnFlags(i))?,
            name: c.cstr(Field::ColumnName(i))?,
            type_oid: c.u32(Field::ColumnTypeOid(i))?,
            type_modifier: c.i32(Field::ColumnTypeModifier(i))?,
        });
    }
    Ok(Relation {
        oid,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn type_message(c: &mut Cursor<'_>) -> Result<TypeMessage, DecodeError> {
    Ok(TypeMessage {
        oid: c.u32(Field::TypeOid)?,
        namespace: c.cstr(Field::Namespace)?,
        name: c.cstr(Field::Name)?,
    })
}

fn insert(c: &mut Cursor<'_>) -> Result<Insert, DecodeError> {
    let relation_oid = c.u32(Field::RelationOid)?;
    let marker = c.u8(Field::NewTupleMarker)?;
    if marker != b'N' {
        return Err(c.unexpected(Field::NewTupleMarker, marker, "'N'"));
    }
    Ok(Insert {
        relation_oid,
        tuple: tuple(c)?,
    })
}

/// TupleData: Int16 column count, then per column a kind byte (`n`, `u`, `t`, `b`); `t` and `b`
/// are followed by an Int32 length and that many bytes.
fn tuple(c: &mut Cursor<'_>) -> Result<Tuple, DecodeError> {
    let count = c.count16(Field::ColumnCount)?;
    // Each value takes at least its kind byte.
    let mut values = Vec::with_capacity(usize::from(count).min(c.remaining()));
    for i in 0..count {
        let value = match c.u8(Field::ColumnKind(i))? {
            b'n' => TupleValue::Null,
            b'u' => TupleValue::UnchangedToast,
            b't' => TupleValue::Text(value_bytes(c, i)?),
            b'b' => TupleValue::Binary(value_bytes(c, i)?),
            other => {
                return Err(c.unexpected(Field::ColumnKind(i), other, "one of 'n', 'u', 't', 'b'"))
            }
        };
        values.push(value);
    }
    Ok(Tuple(values))
}

fn value_bytes(c: &mut Cursor<'_>, column: u16) -> Result<Bytes, DecodeError> {
    let len = c.len32(Field::ColumnLength(column))?;
    c.bytes(len, Field::ColumnValue(column))
}

fn truncate(c: &mut Cursor<'_>) -> Result<Truncate, DecodeError> {
    let count = c.count32(Field::RelationCount)?;
    let options = c.u8(Field::Options)?;
    let fits = c.remaining() / 4;
    let mut relation_oids =
        Vec::with_capacity(usize::try_from(count).map_or(fits, |n| n.min(fits)));
    for i in 0..count {
        relation_oids.push(c.u32(Field::TruncatedRelationOid(i))?);
    }
    Ok(Truncate {
        options,
        relation_oids,
    })
}

fn message(c: &mut Cursor<'_>) -> Result<LogicalDecodingMessage, DecodeError> {
    // Only bit 0 (transactional) is defined; other bits are ignored rather than rejected, like
    // the unused Commit flags, so a server that adds one does not stop the heartbeat.
    let flags = c.u8(Field::Flags)?;
    let lsn = c.lsn(Field::Lsn)?;
    let prefix = c.cstr(Field::Prefix)?;
    let len = c.len32(Field::ContentLength)?;
    Ok(LogicalDecodingMessage {
        transactional: flags & 1 != 0,
        lsn,
        prefix,
        content: c.bytes(len, Field::Content)?,
    })
}
