//! What the sessions of one `run` are given: the configuration, fixed once the flags are
//! read, and the state they share and hand on from one session to the next. A session reads
//! the first and updates the second; nothing else carries over a reconnect.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::{CleanupArgs, FailoverSlot, OnSlotLost, OutboxNames, Tuning};
use crate::contract::columns::ColumnMap;
use crate::contract::mapper::Mapper;
use crate::observability::{Health, RelayMetrics};
use crate::publish::stream::StreamAddress;
use crate::publish::BrokerNodes;
use crate::shard::Shard;
use crate::wal::heartbeat::Heartbeat;
use crate::wal::{state, timeline};

/// What every session of one `run` shares.
pub(crate) struct SessionContext {
    pub config: SessionConfig,
    pub state: RelayState,
}

/// How the relay's sessions run: its flags, as the sessions use them. Never changes.
pub(crate) struct SessionConfig {
    pub database_url: String,
    /// The names of this relay's shard (src/shard.rs): its publication and slot.
    pub names: OutboxNames,
    pub shard: Shard,
    pub tuning: Tuning,
    pub mapper: Mapper,
    /// Which of the table's columns holds each contract column (`--table-layout`, `--column`).
    pub columns: Arc<ColumnMap>,
    /// This process's heartbeat nonce (its own heartbeats through the WAL).
    pub heartbeat: Heartbeat,
    pub cleanup: CleanupArgs,
    /// The dead-letter exchange under `--on-unroutable dead-letter`; `None` under halt.
    pub dead_letter_exchange: Option<String>,
    /// The prefix of this outbox's emitted events (`--emit-prefix`).
    pub emit_prefix: String,
    /// `--failover-slot`: what preflight expects of the slot, and how a recreated one is made.
    pub failover: FailoverSlot,
    /// `--on-slot-lost`, and the backfill's `--recreate-margin`.
    pub on_slot_lost: OnSlotLost,
    pub recreate_margin: Duration,
    /// `--stream`: the stream WAL mode delivers into instead of the exchange.
    pub stream: Option<StreamAddress>,
}

impl SessionConfig {
    /// How far before the recorded acknowledged commit the cleanup keeps rows: the backfill's
    /// `--recreate-margin` where a lost slot is recreated; none under `stop`, where no
    /// backfill reads them (a short `--retention` then deletes delivered rows promptly).
    pub(crate) fn backfill_margin(&self) -> Duration {
        match self.on_slot_lost {
            OnSlotLost::Recreate => self.recreate_margin,
            OnSlotLost::Stop => Duration::ZERO,
        }
    }
}

/// What the sessions share and hand on: the broker nodes (and which one serves), readiness,
/// the metrics, and what a session saw that the next one needs.
pub(crate) struct RelayState {
    pub brokers: Arc<BrokerNodes>,
    pub health: Health,
    pub metrics: RelayMetrics,
    /// The PostgreSQL server the last session streamed from.
    pub last_server: Mutex<Option<SeenServer>>,
    /// Commits of the transactions handed on from that server, for a failover's report.
    pub handed_over: timeline::HandedOver,
    /// Set once a session decoded an emitted event; the cleanup records it.
    pub emitted_seen: state::EmittedSeen,
}

/// A server a session streamed from: where, and which one (IDENTIFY_SYSTEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeenServer {
    pub address: String,
    pub system_id: String,
    pub timeline: u32,
}
