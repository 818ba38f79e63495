//! A bounds-checked reader over one message (the mini-redis `frame.rs` approach): every read
//! checks that enough bytes are left and returns an error naming the field otherwise, so no
//! input can make the decoder index out of bounds or panic.

use bytes::Bytes;
use pgwire_replication::Lsn;

use super::error::{DecodeError, Field, MessageKind};

/// Reads big-endian fields from `buf` starting at `pos`. Invariant: `pos <= buf.len()`.
pub(super) struct Cursor<'a> {
    buf: &'a Bytes,
    pos: usize,
    kind: MessageKind,
}

impl<'a> Cursor<'a> {
    /// A cursor over `buf` from `pos` (just after the tag byte), decoding a `kind` message.
    pub(super) fn new(buf: &'a Bytes, pos: usize, kind: MessageKind) -> Self {
        Cursor {
            buf,
            pos: pos.min(buf.len()),
            kind,
        }
    }

    /// Bytes not yet read.
    pub(super) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }

    fn truncated(&self, field: Field, expected: usize) -> DecodeError {
        DecodeError::Truncated {
            kind: self.kind,
            field,
            expected,
            left: self.remaining(),
        }
    }

    /// An error for a field whose value is not allowed (used by the decoder for marker bytes).
    pub(super) fn unexpected(
        &self,
        field: Field,
        found: u8,
        expected: &'static str,
    ) -> DecodeError {
        DecodeError::UnexpectedByte {
            kind: self.kind,
            field,
            found,
            expected,
        }
    }

    fn array<const N: usize>(&mut self, field: Field) -> Result<[u8; N], DecodeError> {
        let bytes = *self
            .rest()
            .first_chunk::<N>()
            .ok_or_else(|| self.truncated(field, N))?;
        self.pos += N;
        Ok(bytes)
    }

    pub(super) fn u8(&mut self, field: Field) -> Result<u8, DecodeError> {
        Ok(u8::from_be_bytes(self.array(field)?))
    }

    pub(super) fn i16(&mut self, field: Field) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.array(field)?))
    }

    pub(super) fn i32(&mut self, field: Field) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array(field)?))
    }

    /// An Int32 that PostgreSQL sends as an unsigned value (OIDs, transaction ids).
    pub(super) fn u32(&mut self, field: Field) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    pub(super) fn i64(&mut self, field: Field) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }

    pub(super) fn lsn(&mut self, field: Field) -> Result<Lsn, DecodeError> {
        Ok(Lsn::from_u64(u64::from_be_bytes(self.array(field)?)))
    }

    /// An Int16 count; negative is an error.
    pub(super) fn count16(&mut self, field: Field) -> Result<u16, DecodeError> {
        let value = self.i16(field)?;
        u16::try_from(value).map_err(|_| self.negative(field, value.into()))
    }

    /// An Int32 count; negative is an error.
    pub(super) fn count32(&mut self, field: Field) -> Result<u32, DecodeError> {
        let value = self.i32(field)?;
        u32::try_from(value).map_err(|_| self.negative(field, value))
    }

    /// An Int32 length; negative is an error.
    pub(super) fn len32(&mut self, field: Field) -> Result<usize, DecodeError> {
        let value = self.i32(field)?;
        usize::try_from(value).map_err(|_| self.negative(field, value))
    }

    fn negative(&self, field: Field, value: i32) -> DecodeError {
        DecodeError::NegativeLength {
            kind: self.kind,
            field,
            value,
        }
    }

    /// A NUL-terminated UTF-8 string (the NUL is consumed, not returned).
    pub(super) fn cstr(&mut self, field: Field) -> Result<String, DecodeError> {
        let rest = self.rest();
        let Some(nul) = rest.iter().position(|&b| b == 0) else {
            return Err(DecodeError::UnterminatedString {
                kind: self.kind,
                field,
                left: rest.len(),
            });
        };
        let text = rest.get(..nul).unwrap_or_default();
        let text = std::str::from_utf8(text).map_err(|source| DecodeError::InvalidUtf8 {
            kind: self.kind,
            field,
            source,
        })?;
        self.pos += nul + 1;
        Ok(text.to_owned())
    }

    /// The next `n` bytes as a slice of the input buffer: a reference count, not a copy.
    pub(super) fn bytes(&mut self, n: usize, field: Field) -> Result<Bytes, DecodeError> {
        if n > self.remaining() {
            return Err(self.truncated(field, n));
        }
        let slice = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(slice)
    }

    /// Ends the message: anything left over is an error.
    pub(super) fn finish(self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(DecodeError::TrailingBytes {
                kind: self.kind,
                count,
            }),
        }
    }
}
