//! The one supervisor: runs sessions until a graceful stop or a definite error, and owns
//! everything between two sessions (backoff, standby, the reconnect count and log).
//!
//! Crash-only: a session runs until anything fails; the supervisor tears it down (the
//! session's future is dropped, and every task it started with it), waits, and starts a new
//! one, which resumes from what PostgreSQL has: the slot's confirmed position (WAL mode), or
//! the rows still unpublished (polling). There is no partial recovery to get wrong.
//!
//! Split like mini-redis's `Listener` and `Handler`: the supervisor decides *whether and
//! when* to run the next session, from the error's class alone ([`RelayError::kind`]); the
//! [`Supervised`] side (one WAL relay, one polling worker) knows *how* to run one and what a
//! failure means for its readiness. It never retries a definite error, and never resumes a
//! session in place.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::advice::report;
use crate::error::{RelayError, SupervisorAction};
use crate::observability::count_reconnect;
use outbox_common::backoff::Backoff;

/// The first reconnect delay; it doubles up to the configured maximum.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// How often a standby retries a slot held by another process, at the latest.
pub(crate) const STANDBY_RETRY: Duration = Duration::from_secs(5);

/// What the supervisor runs: one kind of session, again and again.
pub(crate) trait Supervised {
    /// Runs one session until it fails (`Err`) or `shutdown` stops it gracefully (`Ok`).
    fn run(&mut self, shutdown: &CancellationToken)
        -> impl Future<Output = Result<(), RelayError>>;

    /// Tells readiness (and whatever else watches this side) that a session failed.
    fn failed(&mut self, error: &RelayError);

    /// Whether the session that just failed, after running for `ran`, made progress: the
    /// backoff then starts afresh.
    fn progressed(&self, ran: Duration) -> bool;

    /// What a retry is announced with in the log.
    fn retrying(&self) -> &'static str;

    /// Waits, at most `at_most`, while another process holds what this one needs (the
    /// slot); returns early once it may have gone.
    fn wait_as_standby(&self, at_most: Duration) -> impl Future<Output = ()> {
        tokio::time::sleep(at_most)
    }
}

/// How the supervisor runs its sessions.
pub(crate) struct Supervision {
    pub max_backoff: Duration,
    /// How long a session may take to stop after `shutdown`: past it, the supervisor
    /// abandons it (its open work is replayed on restart). `None`: wait for it.
    pub stop_timeout: Option<Duration>,
}

/// Runs sessions of `supervised` until `shutdown` (`Ok`) or a definite error (`Err`).
pub(crate) async fn supervise<S: Supervised>(
    supervised: &mut S,
    supervision: &Supervision,
    shutdown: &CancellationToken,
) -> Result<(), RelayError> {
    let mut backoff = Backoff::new(FIRST_BACKOFF, supervision.max_backoff);
    let mut standby_logged = false;
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        let started = Instant::now();
        let Some(result) = run_session(supervised, supervision, shutdown).await else {
            tracing::warn!("shutdown timed out; the open work will be replayed on restart");
            return Ok(());
        };
        let Err(error) = result else {
            return Ok(());
        };
        supervised.failed(&error);
        let recovery = error.recovery();
        let delay = match recovery {
            SupervisorAction::Stop => return Err(error),
            SupervisorAction::Standby => {
                if !standby_logged {
                    tracing::info!(error = %report(&error), "standby: waiting for the slot");
                    standby_logged = true;
                }
                STANDBY_RETRY
            }
            SupervisorAction::Retry => {
                standby_logged = false;
                if supervised.progressed(started.elapsed()) {
                    backoff.reset();
                }
                let cause = error.kind().label();
                let delay = backoff.next_delay();
                tracing::warn!(
                    cause,
                    error = %report(&error),
                    retry_in_ms = delay.as_millis() as u64,
                    "{}",
                    supervised.retrying()
                );
                // After the log line: whoever sees the count can read the line.
                count_reconnect(cause);
                delay
            }
        };
        let wait = async {
            match recovery {
                SupervisorAction::Standby => supervised.wait_as_standby(delay).await,
                _ => tokio::time::sleep(delay).await,
            }
        };
        tokio::select! {
            () = wait => {}
            () = shutdown.cancelled() => return Ok(()),
        }
    }
}

/// One session, abandoned when it outlives the stop timeout after `shutdown` (`None`).
async fn run_session<S: Supervised>(
    supervised: &mut S,
    supervision: &Supervision,
    shutdown: &CancellationToken,
) -> Option<Result<(), RelayError>> {
    let session = supervised.run(shutdown);
    let Some(stop_timeout) = supervision.stop_timeout else {
        return Some(session.await);
    };
    let stop_deadline = async {
        shutdown.cancelled().await;
        tokio::time::sleep(stop_timeout).await;
    };
    tokio::select! {
        result = session => Some(result),
        () = stop_deadline => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Endpoint, SlotError};

    /// Sessions that fail with the given errors, in turn, and then stop gracefully.
    struct Scripted {
        errors: Vec<RelayError>,
        runs: usize,
        failures: Vec<String>,
    }

    impl Supervised for Scripted {
        async fn run(&mut self, _shutdown: &CancellationToken) -> Result<(), RelayError> {
            self.runs += 1;
            match self.errors.is_empty() {
                true => Ok(()),
                false => Err(self.errors.remove(0)),
            }
        }

        fn failed(&mut self, error: &RelayError) {
            self.failures.push(error.kind().label().to_string());
        }

        fn progressed(&self, _ran: Duration) -> bool {
            false
        }

        fn retrying(&self) -> &'static str {
            "session failed; reconnecting"
        }
    }

    fn scripted(errors: Vec<RelayError>) -> Scripted {
        Scripted {
            errors,
            runs: 0,
            failures: Vec::new(),
        }
    }

    fn supervision() -> Supervision {
        Supervision {
            max_backoff: Duration::from_millis(10),
            stop_timeout: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_until_the_session_stops_gracefully() {
        let mut sessions = scripted(vec![
            RelayError::StreamEnded,
            RelayError::ConnectTimeout {
                endpoint: Endpoint::RabbitMq,
                seconds: 15,
            },
        ]);
        let outcome = supervise(&mut sessions, &supervision(), &CancellationToken::new()).await;
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(sessions.runs, 3);
        assert_eq!(sessions.failures, ["stream_ended", "connect_timeout"]);
    }

    /// An internal invariant break stops the relay at once, naming the bug: a relay that
    /// retried it would repeat the bug forever.
    #[tokio::test(start_paused = true)]
    async fn a_bug_stops_the_relay_instead_of_retrying() {
        let mut sessions = scripted(vec![
            RelayError::Bug("settled a front that is not a publish".into()),
            RelayError::StreamEnded,
        ]);
        let outcome = supervise(&mut sessions, &supervision(), &CancellationToken::new()).await;
        let error = outcome.expect_err("stopped");
        assert_eq!(sessions.runs, 1, "never retried");
        let text = report(&error);
        assert!(text.contains("a bug in outbox-relay"), "{text}");
        assert!(
            text.contains("settled a front that is not a publish"),
            "{text}"
        );
        assert!(text.contains("report this message"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_definite_error_stops_after_transient_ones() {
        let mut sessions = scripted(vec![
            RelayError::StreamEnded,
            RelayError::Slot(SlotError::Missing { slot: "s".into() }),
        ]);
        let outcome = supervise(&mut sessions, &supervision(), &CancellationToken::new()).await;
        assert!(
            matches!(outcome, Err(RelayError::Slot(SlotError::Missing { .. }))),
            "{outcome:?}"
        );
        assert_eq!(sessions.runs, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_waits_and_retries() {
        let mut sessions = scripted(vec![RelayError::Slot(SlotError::InUse {
            slot: "s".into(),
            pid: "7".into(),
        })]);
        let started = Instant::now();
        let outcome = supervise(&mut sessions, &supervision(), &CancellationToken::new()).await;
        assert!(outcome.is_ok());
        assert_eq!(sessions.runs, 2);
        assert!(
            started.elapsed() >= STANDBY_RETRY,
            "the default standby wait"
        );
    }
}
