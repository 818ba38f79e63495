//! The backlog poller: how many rows wait unsent and how old the oldest is, read on an
//! ordinary connection of its own every `--backlog-poll-interval` for /metrics. The numbers
//! come from the table, not from the workers, so they keep growing while every worker is
//! stuck or disconnected, which is when they matter.
//!
//! It only reads (a count and a `min` over the unsent rows, no lock): it must never claim or
//! mark rows, so watching the backlog cannot hold back a worker.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::observability::{BACKLOG_POLL_ERRORS_TOTAL, BACKLOG_ROWS, OLDEST_UNSENT_AGE_SECONDS};
use outbox_common::periodic::{self, Job};

use crate::table::polling::{Backlog, BacklogQuery};

/// Reads the backlog every `interval` until `shutdown`.
pub(crate) async fn run(
    database_url: String,
    query: BacklogQuery,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let rows = metrics::gauge!(BACKLOG_ROWS);
    let age = metrics::gauge!(OLDEST_UNSENT_AGE_SECONDS);
    let read = move |connection: periodic::Connection| {
        let query = query.clone();
        async move { query.read(&*connection.client().await?).await }
    };
    let record = move |backlog: Option<Backlog>| {
        // None: no published_at column; the workers stop with an error that names it.
        if let Some(backlog) = backlog {
            rows.set(backlog.unsent_rows as f64);
            age.set(backlog.oldest_unsent_age_seconds.unwrap_or(0.0).max(0.0));
        }
    };
    let errors = metrics::counter!(BACKLOG_POLL_ERRORS_TOTAL);
    let job = Job::poller("backlog poller", interval, errors);
    periodic::run(&database_url, job, shutdown, read, record).await;
}
