//! Each command of the binary as one function, so that `main` only parses flags, sets up
//! logging and signals, and the tests can run the same code.
//!
//! `main` sets the process's connection policy (`outbox_common::liveness::configure`: the peer
//! timeout, and `consume`'s statement timeout) from the flags before any of them runs
//! ([`crate::cli::Command::connection_policy`]); `consumer::run` sets the same again, for a
//! library user.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cleanup::{self, OUTBOX_DEFAULT_RETENTION};
use crate::cli::{CleanupArgs, ConsumeArgs, Retention, SetupArgs};
use crate::consumer::{self, ConsumerConfig, Counters};
use crate::effect::SqlEffect;
use crate::error::InboxError;
use crate::{connect, sql};

/// `setup`: prints the SQL (`--print-sql`), or applies it and prints what it found.
pub async fn setup(args: SetupArgs) -> Result<(), InboxError> {
    if args.print_sql {
        print!("{}", sql::setup_sql(&args.table.table));
        return Ok(());
    }
    let mut client = connect(&args.database.url()?).await?;
    let report = sql::setup(&mut client, &args.table.table).await?;
    print!("{report}");
    Ok(())
}

/// `consume`: the reference consumer, with the cleanup beside it unless its interval is 0.
pub async fn consume(args: ConsumeArgs, shutdown: CancellationToken) -> Result<(), InboxError> {
    let effect = SqlEffect::new(args.effect_sql()?)?;
    let config = ConsumerConfig {
        database_url: args.database.url()?,
        amqp_url: args.amqp_url()?,
        queue: args.queue.clone(),
        consumer: args.consumer.clone(),
        table: args.table.table.clone(),
        prefetch: args.prefetch,
        concurrency: usize::from(args.concurrency),
        batch_size: usize::from(args.batch_size),
        max_backoff: args.max_backoff(),
        shutdown_timeout: args.shutdown_timeout(),
        peer_timeout: args.peer_timeout.get()?,
        statement_timeout: args.statement_timeout(),
        dead_letter_exchange: args.dead_letter_exchange(),
    };
    warn_if_short(&args.retention);
    let cleaning = (!args.cleanup_interval.is_zero()).then(|| {
        tokio::spawn(cleanup::every(
            config.database_url.clone(),
            config.table.clone(),
            args.retention.retention,
            args.retention.cleanup_batch,
            args.cleanup_interval,
            shutdown.clone(),
        ))
    });
    let counters = Arc::new(Counters::default());
    let result = consumer::run(config, effect, counters.clone(), shutdown.clone()).await;
    shutdown.cancel();
    if let Some(cleaning) = cleaning {
        let _ = cleaning.await;
    }
    let totals = counters.totals();
    tracing::info!(
        applied = totals.applied,
        duplicates = totals.duplicates,
        rejected = totals.rejected,
        dead_lettered = totals.dead_lettered,
        "consumer stopped"
    );
    result.map(|_| ())
}

/// `cleanup`: one round, or one every `--interval` until `shutdown`.
pub async fn cleanup(args: CleanupArgs, shutdown: CancellationToken) -> Result<(), InboxError> {
    let url = args.database.url()?;
    let table = args.table.table;
    let Retention {
        retention,
        cleanup_batch,
    } = args.retention;
    warn_if_short(&args.retention);
    if !args.interval.is_zero() {
        cleanup::every(
            url,
            table,
            retention,
            cleanup_batch,
            args.interval,
            shutdown,
        )
        .await;
        return Ok(());
    }
    let client = connect(&url).await?;
    let cleaned = cleanup::cleanup(&client, &table, retention, cleanup_batch, &shutdown).await?;
    println!(
        "deleted {} rows older than {} from {table} in {} batches of at most {cleanup_batch}",
        cleaned.deleted,
        humantime_duration(retention),
        cleaned.batches
    );
    Ok(())
}

/// A window shorter than the outbox's own retention cannot absorb the relay's `resync`.
fn warn_if_short(retention: &Retention) {
    if retention.retention < OUTBOX_DEFAULT_RETENTION {
        tracing::warn!(
            retention_secs = retention.retention.as_secs(),
            "the inbox retention is shorter than the relay's default outbox retention (1 h): a \
             resync can re-deliver messages older than this, and they would be applied again \
             (docs/consumers.md, \"How long to keep the inbox\")"
        );
    }
}

fn humantime_duration(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        s if s % 3600 == 0 && s > 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}
