//! What the replication stream means for delivery: each event in, at most one delivery
//! input out, in stream order.
//!
//! ```text
//!  Begin            -> (remember the commit LSN and time; rows are numbered from 0)
//!  Relation         -> relation cache (by OID)
//!  Insert (outbox)  -> mapper -> Input::Publish            (x-outbox-lsn / x-outbox-seq)
//!  Message (--emit-prefix, transactional)
//!                   -> emit -> mapper -> Input::Publish     (numbered with the rows)
//!  Commit           -> Input::AckPoint(commit end)
//!  KeepAlive, non-transactional Message (not ours), outside a transaction
//!                   -> Input::AckPoint(WAL end / message LSN)   (idle advance)
//! ```
//!
//! Synchronous and free of I/O: the stream reader calls it between `recv`s, the delivery task
//! does the publishing. It must never emit an ack point inside a transaction: a keepalive
//! there says nothing about the rows still to come.
//!
//! Rows and emitted events of one transaction share one numbering (`x-outbox-seq`), in the
//! order pgoutput sends them, which is their order in the WAL. Logical messages are not
//! filtered by the publication: those with another prefix are ignored (counted), never
//! published; one with our prefix that cannot be published is handed over as unpublishable,
//! like a row, and delivery applies the policy.

use pgwire_replication::{Lsn, ReplicationEvent};

use crate::contract::emit;
use crate::contract::mapper::Mapper;
use crate::contract::position::Position as RowPosition;
use crate::error::RelayError;
use crate::observability::{pg_timestamp, StreamMetrics};
use crate::pgoutput::{self, LogicalMessage};
use crate::publish::Input;
use crate::shard::Shard;
use crate::wal::heartbeat::Heartbeat;
use crate::wal::position::AckPosition;
use crate::wal::relations::{Known, RelationCache};
use crate::wal::state::EmittedSeen;

/// Bytes the decoder cannot read are definite: the same bytes come back on every retry.
impl From<pgoutput::DecodeError> for RelayError {
    fn from(error: pgoutput::DecodeError) -> Self {
        RelayError::Decode(error.to_string())
    }
}

pub(crate) struct Source {
    mapper: Mapper,
    relations: RelationCache,
    heartbeat: Heartbeat,
    /// The prefix of this outbox's emitted events (`--emit-prefix`).
    emit_prefix: String,
    /// Which emitted events are this relay's (rows are chosen by the publication's filter).
    shard: Shard,
    metrics: StreamMetrics,
    /// Noted at every emitted event (wal/state.rs): a lost slot's recovery needs to know.
    emitted_seen: EmittedSeen,
    transaction: Option<Transaction>,
}

/// The transaction being read: its commit LSN (from Begin) and the next row's index.
struct Transaction {
    commit_lsn: Lsn,
    commit_time: i64,
    next_index: u32,
}

impl Source {
    pub(crate) fn new(
        mapper: Mapper,
        relations: RelationCache,
        heartbeat: Heartbeat,
        emit_prefix: String,
        shard: Shard,
        metrics: StreamMetrics,
    ) -> Self {
        Self {
            mapper,
            relations,
            heartbeat,
            emit_prefix,
            shard,
            metrics,
            emitted_seen: EmittedSeen::default(),
            transaction: None,
        }
    }

    /// Notes every emitted event in `seen` (the session's, which the cleanup records).
    pub(crate) fn noting_emitted(mut self, seen: EmittedSeen) -> Self {
        self.emitted_seen = seen;
        self
    }

    /// `true` between a Begin and its Commit: a graceful stop waits for the Commit.
    pub(crate) fn in_transaction(&self) -> bool {
        self.transaction.is_some()
    }

    /// Where the transaction being read commits (its Begin's final LSN).
    pub(crate) fn transaction_commit_lsn(&self) -> Option<Lsn> {
        self.transaction.as_ref().map(|t| t.commit_lsn)
    }

    /// The delivery input this event makes, if any. An error is definite (a row that cannot
    /// be mapped, malformed input): nothing of this event may be acknowledged.
    pub(crate) fn on_event(
        &mut self,
        event: ReplicationEvent,
    ) -> Result<Option<Input<AckPosition>>, RelayError> {
        Ok(match event {
            ReplicationEvent::Begin {
                final_lsn,
                commit_time_micros,
                ..
            } => {
                self.transaction = Some(Transaction {
                    commit_lsn: final_lsn,
                    commit_time: commit_time_micros,
                    next_index: 0,
                });
                None
            }
            ReplicationEvent::Commit {
                end_lsn,
                commit_time_micros,
                ..
            } => {
                self.transaction = None;
                Some(Input::AckPoint(AckPosition::commit(
                    end_lsn,
                    commit_time_micros,
                )))
            }
            // Outside a transaction, everything before a keepalive or a non-transactional
            // message has been received: its LSN is an ack point.
            ReplicationEvent::KeepAlive { wal_end, .. } if self.transaction.is_none() => {
                Some(Input::AckPoint(AckPosition::idle(wal_end)))
            }
            ReplicationEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } if prefix == self.emit_prefix => {
                // Only a sharded relay reads the hash: a second parse of every event otherwise.
                let hash = match self.shard.is_sharded() {
                    true => emit::shard_hash(&content),
                    false => None,
                };
                if self.shard.takes_emitted(hash) {
                    Some(self.on_emitted(transactional, lsn, &content)?)
                } else {
                    // Another shard's event: that shard's relay publishes it.
                    self.metrics.ignored_messages.increment(1);
                    None
                }
            }
            // Other logical messages are never published; our own heartbeats are marked so
            // that their acknowledgement measures heartbeat lag.
            ReplicationEvent::Message {
                transactional: false,
                lsn,
                prefix,
                content,
            } if self.transaction.is_none() => Some(Input::AckPoint(
                match self.heartbeat.parse_own(&prefix, &content) {
                    Some(sent_at) => AckPosition::heartbeat(lsn, sent_at),
                    None => AckPosition::idle(lsn),
                },
            )),
            ReplicationEvent::Message {
                transactional: true,
                ..
            } => {
                self.metrics.ignored_messages.increment(1);
                None
            }
            ReplicationEvent::XLogData { data, .. } => self.on_data(&data)?,
            _ => None,
        })
    }

    /// An event the emit functions wrote: published like a row, at the next place of its
    /// transaction. A message with our prefix written non-transactionally belongs to no
    /// transaction: it is placed at its own LSN and refused by `emit` (dead-letter policy).
    fn on_emitted(
        &mut self,
        transactional: bool,
        lsn: Lsn,
        content: &bytes::Bytes,
    ) -> Result<Input<AckPosition>, RelayError> {
        let (position, committed_at) = match self.transaction.as_mut() {
            Some(transaction) if transactional => {
                let position = RowPosition {
                    commit_lsn: transaction.commit_lsn,
                    index: transaction.next_index,
                };
                transaction.next_index += 1;
                (position, Some(pg_timestamp(transaction.commit_time)))
            }
            None if transactional => {
                return Err(RelayError::Protocol(
                    "a transactional logical message arrived outside a transaction".into(),
                ))
            }
            _ => (
                RowPosition {
                    commit_lsn: lsn,
                    index: 0,
                },
                None,
            ),
        };
        self.metrics.emitted.increment(1);
        self.emitted_seen.note();
        let mapped = emit::map(&self.mapper, content, transactional, position);
        Ok(Input::mapped(mapped, committed_at))
    }

    /// Decodes one pgoutput message; an outbox row becomes a publish.
    fn on_data(&mut self, data: &bytes::Bytes) -> Result<Option<Input<AckPosition>>, RelayError> {
        let insert = match pgoutput::decode(data)? {
            LogicalMessage::Relation(relation) => {
                let commit_lsn = self.transaction.as_ref().map(|t| t.commit_lsn);
                self.relations.update(&relation, commit_lsn)?;
                return Ok(None);
            }
            LogicalMessage::Insert(insert) => insert,
            // Type, Origin, Truncate and tags we do not use carry nothing to publish.
            _ => return Ok(None),
        };
        let Some(transaction) = self.transaction.as_mut() else {
            return Err(RelayError::Protocol(
                "an Insert arrived outside a transaction".into(),
            ));
        };
        let Known::Outbox(layout) = self.relations.get(insert.relation_oid)? else {
            return Ok(None);
        };
        let position = RowPosition {
            commit_lsn: transaction.commit_lsn,
            index: transaction.next_index,
        };
        transaction.next_index += 1;
        self.metrics.rows.increment(1);
        let mapped = self.mapper.map_row(layout, &insert.tuple, Some(position));
        Ok(Some(Input::mapped(
            mapped,
            Some(pg_timestamp(transaction.commit_time)),
        )))
    }
}

#[cfg(test)]
mod tests;
