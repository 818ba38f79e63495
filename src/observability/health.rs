//! The health behind `/readyz`: one [`Health`] per process, into which the session, the
//! supervisor, the slot poller and (in polling mode) every worker ([`WorkerHealth`]) write
//! what they know, and from which `/readyz` reads one verdict ([`Health::readiness`]).
//!
//! Values that grow with time while nothing happens (heartbeat lag, seconds blocked on one
//! message, readiness) are computed when `/metrics` is scraped, from instants recorded here:
//! a stalled relay cannot report its own stall, but the scrape can.
//!
//! It owns state only: it must never wait on I/O or decide what the relay does next.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use crate::error::{ErrorKind, RelayError, Side};

use super::metrics::{
    ACKNOWLEDGED_LSN, BLOCKED_ON_MESSAGE_SECONDS, BROKER_BLOCKED, HEARTBEAT_LAG_SECONDS, READY,
    STANDBY,
};

/// Why `/readyz` answers 503. The text is the one-line body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Not streaming yet (the first session is connecting).
    Starting,
    /// Another process holds the slot; this one waits to take over.
    Standby,
    /// The broker connection or channel is gone; reconnecting.
    BrokerDown,
    /// PostgreSQL (ordinary or replication connection) is gone; reconnecting.
    DatabaseDown,
    /// The broker blocks publishing (memory or disk alarm).
    BrokerBlocked,
    /// No own heartbeat came back through the stream for 3 intervals.
    NoHeartbeat,
    /// The slot was invalidated (`wal_status = 'lost'`).
    SlotLost,
    /// PostgreSQL sends nothing a standby of `synchronized_standby_slots` has not confirmed,
    /// and that standby is gone or stalled (the slot poller saw it).
    WaitingForStandby(StandbyWait),
    /// The broker keeps refusing this message (nack, unroutable, no confirm).
    StuckMessage(String),
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::Starting => f.write_str("starting"),
            NotReady::Standby => f.write_str("standby"),
            NotReady::BrokerDown => f.write_str("broker down"),
            NotReady::DatabaseDown => f.write_str("database down"),
            NotReady::BrokerBlocked => f.write_str("broker blocked"),
            NotReady::NoHeartbeat => f.write_str("no heartbeat"),
            NotReady::SlotLost => f.write_str("slot lost"),
            NotReady::WaitingForStandby(wait) => {
                write!(f, "waiting for standby slot {} ({})", wait.slot, wait.why)
            }
            NotReady::StuckMessage(id) => write!(f, "stuck message {id}"),
        }
    }
}

impl NotReady {
    /// What a session failure means for readiness while the supervisor reconnects.
    pub fn after(error: &RelayError) -> NotReady {
        if let Some(id) = error.stuck_message_id() {
            return NotReady::StuckMessage(id.to_string());
        }
        match error.kind() {
            ErrorKind::SlotHeld => NotReady::Standby,
            ErrorKind::SlotLost => NotReady::SlotLost,
            ErrorKind::StreamSilent => NotReady::NoHeartbeat,
            kind if kind.side() == Side::Broker => NotReady::BrokerDown,
            _ => NotReady::DatabaseDown,
        }
    }
}

/// A physical slot of `synchronized_standby_slots` that holds the relay's failover slot back,
/// and why (missing, invalidated, no standby connected, or its standby stalled).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StandbyWait {
    pub slot: String,
    pub why: String,
}

/// What the session, the supervisor and the poller report, for `/readyz` and the gauges that
/// are computed at scrape time. One per process; clones share it.
///
/// Readiness combines independent conditions, each set by whoever knows it, so that no
/// writer can clear another's: the session's phase ([`set_ready`](Self::set_ready) /
/// [`set_not_ready`](Self::set_not_ready)), the broker's blocked flag, the heartbeat's
/// staleness, a stuck message, and a lost slot or a standby it waits for, seen by the poller.
/// `/readyz` answers with the first that fails, in that order of precedence: slot lost,
/// waiting for a standby (the cause of the silence and the reconnects that follow it), the
/// phase, broker blocked, no heartbeat, stuck message.
#[derive(Clone, Default)]
pub struct Health {
    state: Arc<Mutex<HealthState>>,
}

#[derive(Default)]
struct HealthState {
    /// `None`: streaming. Initially "starting".
    phase: Option<NotReady>,
    started: bool,
    broker_blocked: bool,
    heartbeat_stale: bool,
    stuck: Option<(String, Instant)>,
    slot_lost: bool,
    /// As of the poller's last successful round.
    waiting_for_standby: Option<StandbyWait>,
    acknowledged: Option<Acknowledged>,
    heartbeat_written: Option<SystemTime>,
}

/// The newest position the relay acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acknowledged {
    pub lsn: u64,
    /// Commit time of the newest acknowledged transaction (the server's clock), if any was
    /// acknowledged by this process. Kept when later ack points are keepalives.
    pub commit_time: Option<SystemTime>,
}

impl Health {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Streaming, with the broker channel open. (The other conditions may still hold
    /// readiness back.)
    pub fn set_ready(&self) {
        let mut state = self.lock();
        update_standby(&state.phase, false);
        state.phase = None;
        state.started = true;
    }

    /// Not streaming, and why.
    pub fn set_not_ready(&self, reason: NotReady) {
        let mut state = self.lock();
        update_standby(&state.phase, reason == NotReady::Standby);
        if let NotReady::StuckMessage(id) = &reason {
            set_stuck(&mut state, Some(id));
        }
        if reason == NotReady::SlotLost {
            state.slot_lost = true;
        }
        state.started = true;
        state.phase = Some(reason);
    }

    /// The broker blocks (true) or unblocks (false) this relay's publishes.
    pub fn set_broker_blocked(&self, blocked: bool) {
        self.lock().broker_blocked = blocked;
        metrics::gauge!(BROKER_BLOCKED).set(if blocked { 1.0 } else { 0.0 });
    }

    /// No own heartbeat came back for 3 intervals (true), or one did again (false).
    pub fn set_heartbeat_stale(&self, stale: bool) {
        self.lock().heartbeat_stale = stale;
    }

    /// The message the pipeline is stuck on (`None` once the broker confirmed it). The
    /// blocked-on-message clock keeps running while the same id is set again.
    pub fn set_stuck(&self, message_id: Option<&str>) {
        set_stuck(&mut self.lock(), message_id);
    }

    /// The id of the message the relay is stuck on, if any.
    pub fn stuck(&self) -> Option<String> {
        self.lock().stuck.as_ref().map(|(id, _)| id.clone())
    }

    /// The slot poller saw `wal_status = 'lost'` (or no longer does).
    pub fn set_slot_lost(&self, lost: bool) {
        self.lock().slot_lost = lost;
    }

    /// The slot poller saw a standby of `synchronized_standby_slots` holding the slot back
    /// (`None`: none does, or nothing can).
    pub fn set_waiting_for_standby(&self, wait: Option<StandbyWait>) {
        self.lock().waiting_for_standby = wait;
    }

    /// The relay acknowledged `lsn` to PostgreSQL; `commit_time` is the commit timestamp of
    /// the transaction that ends there (`None` for a keepalive or heartbeat ack point, which
    /// keeps the previous commit time).
    pub fn record_acknowledged(&self, lsn: u64, commit_time: Option<SystemTime>) {
        let mut state = self.lock();
        let previous = state.acknowledged.and_then(|a| a.commit_time);
        state.acknowledged = Some(Acknowledged {
            lsn,
            commit_time: commit_time.or(previous),
        });
        metrics::gauge!(ACKNOWLEDGED_LSN).set(lsn as f64);
    }

    /// The newest acknowledged position, if the relay acknowledged anything yet.
    pub fn acknowledged(&self) -> Option<Acknowledged> {
        self.lock().acknowledged
    }

    /// Commit time of the newest acknowledged transaction: the cleanup job never deletes
    /// rows newer than this (a stalled relay keeps the evidence).
    pub fn acknowledged_commit_time(&self) -> Option<SystemTime> {
        self.lock().acknowledged.and_then(|a| a.commit_time)
    }

    /// An own heartbeat written at `written` (its timestamp) is at or below the acknowledged
    /// LSN: the heartbeat lag is measured from here at every scrape.
    pub fn record_heartbeat_acknowledged(&self, written: SystemTime) {
        let mut state = self.lock();
        if state.heartbeat_written.is_none_or(|t| written > t) {
            state.heartbeat_written = Some(written);
        }
    }

    /// `Ok` when ready, else the one-line reason `/readyz` gives.
    pub fn readiness(&self) -> Result<(), NotReady> {
        let state = self.lock();
        if state.slot_lost {
            return Err(NotReady::SlotLost);
        }
        if let Some(wait) = &state.waiting_for_standby {
            return Err(NotReady::WaitingForStandby(wait.clone()));
        }
        if !state.started {
            return Err(NotReady::Starting);
        }
        if let Some(reason) = &state.phase {
            return Err(reason.clone());
        }
        if state.broker_blocked {
            return Err(NotReady::BrokerBlocked);
        }
        if state.heartbeat_stale {
            return Err(NotReady::NoHeartbeat);
        }
        if let Some((id, _)) = &state.stuck {
            return Err(NotReady::StuckMessage(id.clone()));
        }
        Ok(())
    }

    /// Sets the gauges that depend on the time of the scrape.
    pub(super) fn update_scrape_gauges(&self) {
        let ready = self.readiness().is_ok();
        let state = self.lock();
        metrics::gauge!(READY).set(if ready { 1.0 } else { 0.0 });
        let blocked = state
            .stuck
            .as_ref()
            .map(|(_, since)| since.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        metrics::gauge!(BLOCKED_ON_MESSAGE_SECONDS).set(blocked);
        if let Some(written) = state.heartbeat_written {
            let lag = SystemTime::now()
                .duration_since(written)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            metrics::gauge!(HEARTBEAT_LAG_SECONDS).set(lag);
        }
    }
}

/// Sets [`STANDBY`] when the phase enters or leaves standby, and only then: polling mode,
/// which has no standby, never exports it (`run` creates it at 0 at start).
fn update_standby(phase: &Option<NotReady>, standby: bool) {
    if (*phase == Some(NotReady::Standby)) != standby {
        metrics::gauge!(STANDBY).set(if standby { 1.0 } else { 0.0 });
    }
}

fn set_stuck(state: &mut HealthState, message_id: Option<&str>) {
    match message_id {
        None => state.stuck = None,
        Some(id) => {
            if state.stuck.as_ref().map(|(current, _)| current.as_str()) != Some(id) {
                state.stuck = Some((id.to_string(), Instant::now()));
            }
        }
    }
}

/// What one polling worker reports about its connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WorkerState {
    /// Connecting for the first time.
    Starting,
    /// Both connections up; `blocked` while the broker blocks this connection's publishes.
    Up { blocked: bool },
    /// The last session failed (this is why); reconnecting.
    Down(NotReady),
}

/// Polling mode's readiness: every worker reports its own state, and the relay is ready
/// while at least one worker has its database and broker connections up (it delivers, if
/// more slowly) and none is blocked. A broker alarm blocks every connection that publishes,
/// so one blocked worker means the others are blocked at their next publish: "broker
/// blocked" wins. Otherwise `/readyz` gives the reason of the first worker that is down.
#[derive(Clone)]
pub(crate) struct WorkerHealth {
    health: Health,
    workers: Arc<Mutex<Vec<WorkerState>>>,
}

impl WorkerHealth {
    pub(crate) fn new(health: Health, workers: usize) -> Self {
        Self {
            health,
            workers: Arc::new(Mutex::new(vec![WorkerState::Starting; workers])),
        }
    }

    /// Records `worker`'s state and updates the process's [`Health`].
    pub(crate) fn set(&self, worker: usize, state: WorkerState) {
        let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = workers.get_mut(worker) {
            *slot = state;
        }
        // Applied under the lock, so that two workers' updates land in order.
        match combined(&workers) {
            Ok(()) => {
                self.health.set_broker_blocked(false);
                self.health.set_stuck(None);
                self.health.set_ready();
            }
            Err(NotReady::BrokerBlocked) => {
                self.health.set_stuck(None);
                self.health.set_ready();
                self.health.set_broker_blocked(true);
            }
            Err(NotReady::Starting) => {}
            Err(reason) => {
                self.health.set_broker_blocked(false);
                self.health.set_not_ready(reason);
            }
        }
    }
}

/// The workers' states as one readiness.
fn combined(workers: &[WorkerState]) -> Result<(), NotReady> {
    if workers.contains(&WorkerState::Up { blocked: true }) {
        return Err(NotReady::BrokerBlocked);
    }
    if workers.contains(&WorkerState::Up { blocked: false }) {
        return Ok(());
    }
    workers
        .iter()
        .find_map(|w| match w {
            WorkerState::Down(reason) => Some(reason.clone()),
            _ => None,
        })
        .map_or(Err(NotReady::Starting), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{BrokerError, SlotError};
    use crate::observability::pg_timestamp;

    #[test]
    fn readiness_reasons_have_precedence() {
        let health = Health::new();
        assert_eq!(health.readiness(), Err(NotReady::Starting));
        health.set_ready();
        assert_eq!(health.readiness(), Ok(()));
        health.set_stuck(Some("m1"));
        assert_eq!(
            health.readiness().unwrap_err().to_string(),
            "stuck message m1"
        );
        health.set_heartbeat_stale(true);
        assert_eq!(health.readiness(), Err(NotReady::NoHeartbeat));
        health.set_broker_blocked(true);
        assert_eq!(health.readiness(), Err(NotReady::BrokerBlocked));
        health.set_not_ready(NotReady::Standby);
        assert_eq!(health.readiness().unwrap_err().to_string(), "standby");
        health.set_waiting_for_standby(Some(StandbyWait {
            slot: "standby_1".into(),
            why: "no standby is connected to its slot".into(),
        }));
        assert_eq!(
            health.readiness().unwrap_err().to_string(),
            "waiting for standby slot standby_1 (no standby is connected to its slot)"
        );
        health.set_slot_lost(true);
        assert_eq!(health.readiness().unwrap_err().to_string(), "slot lost");
        health.set_slot_lost(false);
        health.set_waiting_for_standby(None);
        health.set_ready();
        health.set_broker_blocked(false);
        health.set_heartbeat_stale(false);
        health.set_stuck(None);
        assert_eq!(health.readiness(), Ok(()));
    }

    #[test]
    fn polling_is_ready_while_one_worker_is_up() {
        let health = Health::new();
        let workers = WorkerHealth::new(health.clone(), 3);
        assert_eq!(health.readiness(), Err(NotReady::Starting));
        workers.set(0, WorkerState::Down(NotReady::DatabaseDown));
        assert_eq!(health.readiness(), Err(NotReady::DatabaseDown));
        workers.set(1, WorkerState::Up { blocked: false });
        assert_eq!(health.readiness(), Ok(()));
        workers.set(1, WorkerState::Up { blocked: true });
        assert_eq!(health.readiness(), Err(NotReady::BrokerBlocked));
        // An alarm blocks every publisher: an idle peer is blocked at its next publish.
        workers.set(2, WorkerState::Up { blocked: false });
        assert_eq!(health.readiness(), Err(NotReady::BrokerBlocked));
        workers.set(1, WorkerState::Up { blocked: false });
        assert_eq!(health.readiness(), Ok(()));
        for worker in 0..3 {
            workers.set(worker, WorkerState::Down(NotReady::BrokerDown));
        }
        assert_eq!(health.readiness().unwrap_err().to_string(), "broker down");
        workers.set(0, WorkerState::Up { blocked: false });
        assert_eq!(health.readiness(), Ok(()));
    }

    #[test]
    fn stuck_clock_keeps_running_for_the_same_message() {
        let health = Health::new();
        health.set_stuck(Some("m1"));
        let first = health.lock().stuck.as_ref().map(|(_, t)| *t);
        health.set_stuck(Some("m1"));
        assert_eq!(health.lock().stuck.as_ref().map(|(_, t)| *t), first);
        health.set_stuck(Some("m2"));
        assert_eq!(health.stuck().as_deref(), Some("m2"));
    }

    #[test]
    fn acknowledged_commit_time_survives_keepalive_acks() {
        let health = Health::new();
        assert_eq!(health.acknowledged_commit_time(), None);
        let t = pg_timestamp(1_000_000);
        health.record_acknowledged(100, Some(t));
        health.record_acknowledged(200, None);
        assert_eq!(
            health.acknowledged(),
            Some(Acknowledged {
                lsn: 200,
                commit_time: Some(t)
            })
        );
    }

    #[test]
    fn failures_map_to_reasons() {
        let returned = RelayError::Broker(BrokerError::Returned {
            message_id: "abc".into(),
            exchange: "x".into(),
            routing_key: "k".into(),
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
        });
        assert_eq!(NotReady::after(&returned).to_string(), "stuck message abc");
        let standby = RelayError::Slot(SlotError::InUse {
            slot: "s".into(),
            pid: "1".into(),
        });
        assert_eq!(NotReady::after(&standby), NotReady::Standby);
        let broker_timeout = RelayError::ConnectTimeout {
            endpoint: crate::error::Endpoint::RabbitMq,
            seconds: 15,
        };
        assert_eq!(NotReady::after(&broker_timeout), NotReady::BrokerDown);
        let database_timeout = RelayError::ConnectTimeout {
            endpoint: crate::error::Endpoint::PostgreSql,
            seconds: 15,
        };
        assert_eq!(NotReady::after(&database_timeout), NotReady::DatabaseDown);
    }
}
