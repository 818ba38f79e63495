//! The one way a job runs against PostgreSQL on a timer: the relay's slot poller, backlog
//! poller and both cleanups, and the inbox's cleanup, are each a [`Job`] plus a round. A round
//! ends with the caller's own error type ([`RoundError`]).
//!
//! What [`run`] guarantees:
//! - **Interval.** A round starts `interval` after the previous one ended (the first at once,
//!   or after one interval: [`FirstRound`]). Rounds never overlap. A zero interval turns the
//!   job off.
//! - **Connection.** The job has one ordinary connection of its own ([`Connection`]), opened
//!   when a round first asks for it, kept while rounds succeed, and dropped after a failed
//!   round so that the next round reconnects. A round that needs no database (a cleanup with
//!   nothing acknowledged yet) opens nothing.
//! - **Bounded rounds.** With a round timeout, a round that hangs (a black-holed connection)
//!   is abandoned as failed after that long, so it cannot stop the next ones. Without one,
//!   the round bounds its own statements (a cleanup may run many short ones).
//! - **Errors.** A failed round never ends the job: it is counted on the job's error counter
//!   (if any) and logged as [`RoundError::describe`] says, once per outage or at every
//!   failure ([`FailureLog`]).
//! - **Cancellation.** The job ends when `shutdown` is cancelled, at the latest when the
//!   round in progress ends (a long round should watch the token itself).
//!
//! It must never decide *whether* a job runs (who spawns it does: the cleanup runs only in
//! the session that holds the slot), nor hold the replication connection.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use metrics::Counter;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::pg::{self, PgError};

/// The shortest bound of a poller's round: an interval below it still gets this long.
const MIN_POLL_TIMEOUT: Duration = Duration::from_secs(10);

/// An error a round ends with, as the job needs it.
pub trait RoundError {
    /// A round abandoned after `bound` (the job's round timeout).
    fn timed_out(bound: Duration) -> Self;
    /// The error as the job's warning shows it.
    fn describe(&self) -> String;
}

/// When the first round runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirstRound {
    /// At once: gauges are filled as soon as the process starts.
    AtOnce,
    /// After one interval: deleting rows can wait until the relay has run a while.
    AfterInterval,
}

/// How failed rounds are logged (always as a warning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureLog {
    /// Once, until a round succeeds again: a poller fails every few seconds during an outage.
    OncePerOutage,
    /// Every failed round: a cleanup runs rarely and each failure is news.
    Every,
}

/// What a periodic job is and how it behaves; built with [`Job::poller`] or
/// [`Job::cleanup`].
#[derive(Debug, Clone)]
pub struct Job {
    /// Names the job in its log lines ("slot poller", "cleanup").
    pub what: &'static str,
    pub interval: Duration,
    pub first_round: FirstRound,
    /// Bound on one round, connecting included; `None`: the round bounds itself.
    pub round_timeout: Option<Duration>,
    /// Counts failed rounds.
    pub errors: Option<Counter>,
    pub failure_log: FailureLog,
}

impl Job {
    /// A poller that feeds gauges: first round at once, each round bounded by
    /// max(`interval`, 10 s), failures counted on `errors` and logged once per outage.
    pub fn poller(what: &'static str, interval: Duration, errors: Counter) -> Self {
        Self {
            what,
            interval,
            first_round: FirstRound::AtOnce,
            round_timeout: Some(interval.max(MIN_POLL_TIMEOUT)),
            errors: Some(errors),
            failure_log: FailureLog::OncePerOutage,
        }
    }

    /// A cleanup: first round after one interval, rounds bounding their own statements,
    /// every failure logged.
    pub fn cleanup(interval: Duration) -> Self {
        Self {
            what: "cleanup",
            interval,
            first_round: FirstRound::AfterInterval,
            round_timeout: None,
            errors: None,
            failure_log: FailureLog::Every,
        }
    }
}

/// A job's database connection: opened on first use, kept between rounds, dropped by
/// [`run`] after a failed round. Cheap to clone (clones share the connection).
#[derive(Clone)]
pub struct Connection {
    database_url: Arc<str>,
    client: Arc<Mutex<Option<Arc<Client>>>>,
}

impl Connection {
    fn new(database_url: &str) -> Self {
        Self {
            database_url: database_url.into(),
            client: Arc::default(),
        }
    }

    /// The open connection, or a new one if there is none or the server closed it.
    pub async fn client(&self) -> Result<Arc<Client>, PgError> {
        if let Some(client) = self.slot().as_ref().filter(|c| !c.is_closed()) {
            return Ok(Arc::clone(client));
        }
        let client = Arc::new(pg::connect(&self.database_url).await?);
        *self.slot() = Some(Arc::clone(&client));
        Ok(client)
    }

    fn drop_client(&self) {
        *self.slot() = None;
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<Client>>> {
        self.client.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Runs `round` on the schedule of `job` until `shutdown` (see the module doc for what it
/// guarantees), handing each successful result to `record`.
pub async fn run<T, E, Round, Fut>(
    database_url: &str,
    job: Job,
    shutdown: CancellationToken,
    mut round: Round,
    mut record: impl FnMut(T),
) where
    Round: FnMut(Connection) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: RoundError,
{
    if job.interval.is_zero() {
        return;
    }
    let connection = Connection::new(database_url);
    let pause = || async {
        tokio::select! {
            () = shutdown.cancelled() => false,
            () = tokio::time::sleep(job.interval) => true,
        }
    };
    if job.first_round == FirstRound::AfterInterval && !pause().await {
        return;
    }
    let mut failing = false;
    loop {
        let outcome = match job.round_timeout {
            None => round(connection.clone()).await,
            Some(bound) => tokio::time::timeout(bound, round(connection.clone()))
                .await
                .unwrap_or_else(|_| Err(E::timed_out(bound))),
        };
        match outcome {
            Ok(value) => {
                record(value);
                failing = false;
            }
            Err(e) => {
                connection.drop_client();
                if let Some(errors) = &job.errors {
                    errors.increment(1);
                }
                match job.failure_log {
                    FailureLog::OncePerOutage if failing => {}
                    FailureLog::OncePerOutage => {
                        tracing::warn!(error = %e.describe(), "{} failed; retrying", job.what);
                    }
                    FailureLog::Every => tracing::warn!(
                        error = %e.describe(),
                        "{} failed; retrying next interval",
                        job.what
                    ),
                }
                failing = true;
            }
        }
        if !pause().await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A round's error in these tests: what timed out, or failed.
    #[derive(Debug)]
    struct Failed;

    impl RoundError for Failed {
        fn timed_out(_bound: Duration) -> Self {
            Failed
        }

        fn describe(&self) -> String {
            "failed".into()
        }
    }

    /// A URL nothing listens on: no round here asks for the connection.
    const NOWHERE: &str = "postgres://relay@127.0.0.1:1/none";

    /// Runs `job` until `count` rounds have started, round `n` hanging (`None`) or ending as
    /// `outcome(n)` says, then cancels it. Returns when each round started (from launch),
    /// how many results were recorded, and the failures counted (if the job counts them).
    async fn rounds_of(
        mut job: Job,
        count: usize,
        outcome: fn(usize) -> Option<Result<usize, Failed>>,
    ) -> (Vec<Duration>, usize, String) {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        if job.errors.is_some() {
            job.errors = metrics::with_local_recorder(&recorder, || Some(metrics::counter!("e")));
        }
        let launched = Instant::now();
        let started = Arc::new(Mutex::new(Vec::new()));
        let (rounds, recorded) = (Arc::clone(&started), Arc::new(Mutex::new(0)));
        let results = Arc::clone(&recorded);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(
            NOWHERE,
            job,
            shutdown.clone(),
            move |_connection| {
                let mut rounds = rounds.lock().expect("lock");
                rounds.push(launched.elapsed());
                let result = outcome(rounds.len() - 1);
                async move {
                    match result {
                        Some(result) => result,
                        None => std::future::pending().await,
                    }
                }
            },
            move |_| *results.lock().expect("lock") += 1,
        ));
        while started.lock().expect("lock").len() < count {
            assert!(
                launched.elapsed() < Duration::from_secs(20),
                "rounds stopped"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the job ends on cancel")
            .expect("the job does not panic");
        let started = started.lock().expect("lock").clone();
        let recorded = *recorded.lock().expect("lock");
        (started, recorded, recorder.handle().render())
    }

    #[tokio::test]
    async fn a_cleanup_waits_an_interval_and_outlives_a_failed_round() {
        let interval = Duration::from_millis(300);
        let failed = |n| Some(if n == 0 { Err(Failed) } else { Ok(n) });
        let (started, _, errors) = rounds_of(Job::cleanup(interval), 2, failed).await;
        assert!(
            started[0] >= interval,
            "first round after an interval: {started:?}"
        );
        assert!(started[1] - started[0] >= interval, "{started:?}");
        assert!(
            !errors.contains("e 1"),
            "a cleanup counts nothing: {errors}"
        );
    }

    #[tokio::test]
    async fn a_hanging_poll_is_abandoned_and_counted() {
        let interval = Duration::from_millis(200);
        let mut job = Job::poller("test poller", interval, Counter::noop());
        assert_eq!(job.round_timeout, Some(MIN_POLL_TIMEOUT));
        let bound = Duration::from_millis(300);
        job.round_timeout = Some(bound);
        let hang_first = |n| (n > 0).then_some(Ok(n));
        let (started, recorded, errors) = rounds_of(job, 3, hang_first).await;
        assert!(
            started[0] < interval,
            "the first poll runs at once: {started:?}"
        );
        assert!(started[1] - started[0] >= bound + interval, "{started:?}");
        assert!(recorded >= 1, "the poll after the hung one records");
        assert!(errors.contains("e 1"), "the hung poll is counted: {errors}");
    }
}
