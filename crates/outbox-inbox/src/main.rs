//! The `outbox-inbox` binary: flags, logging, signals; everything else is in the library.

#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use outbox_inbox::cli::{Cli, Command, LogFormat};
use outbox_inbox::{commands, failpoint};
use outbox_relay::error::chain;
use outbox_relay::liveness;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    if let Err(e) = failpoint::init_from_env() {
        tracing::error!(error = %e, "stopped");
        return ExitCode::FAILURE;
    }
    // Before any connection (the consumer's cleanup connects beside it): every one of them
    // reads it.
    match cli.command.connection_policy() {
        Ok(policy) => liveness::configure(policy),
        Err(e) => {
            tracing::error!(error = %chain(&e), "stopped");
            return ExitCode::FAILURE;
        }
    }
    // One thread, as the relay: per message the consumer waits on PostgreSQL and the broker
    // and does microseconds of work itself. lapin's I/O loop keeps its own thread.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "stopped: cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        match cli.command {
            Command::Setup(args) => commands::setup(args).await,
            Command::Consume(args) => {
                tokio::spawn(stop_on_signal(shutdown.clone()));
                commands::consume(args, shutdown).await
            }
            Command::Cleanup(args) => {
                tokio::spawn(stop_on_signal(shutdown.clone()));
                commands::cleanup(args, shutdown).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %chain(&e), "stopped");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr. lapin can log message contents (payloads): capped whatever RUST_LOG
/// says.
fn init_logging(format: LogFormat) {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    for directive in ["lapin=warn", "amq_protocol=warn", "tokio_postgres=warn"] {
        if let Ok(directive) = directive.parse() {
            filter = filter.add_directive(directive);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn stop_on_signal(shutdown: CancellationToken) {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                return;
            }
        };
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: finishing the messages in hand"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: finishing the messages in hand"),
    }
    shutdown.cancel();
}
