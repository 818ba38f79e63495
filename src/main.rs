//! The binary: flags, logging, signals; everything else is in the library.

use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use outbox_relay::config::{Cli, Command, LogFormat};
use outbox_relay::error::chain;
use outbox_relay::{setup, wal};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Setup(args) => setup::run(args).await,
            Command::Run(args) => {
                let shutdown = CancellationToken::new();
                tokio::spawn(stop_on_signal(shutdown.clone()));
                wal::run(args, shutdown).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %chain(&e), "stopped");
            eprintln!("error: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr. Libraries that can print message contents (lapin logs a returned
/// message whole, payload included) are capped whatever RUST_LOG says.
fn init_logging(format: LogFormat) {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    for directive in [
        "lapin=warn",
        "lapin::returned_messages=off",
        "amq_protocol=warn",
        "pgwire_replication=info",
        "tokio_postgres=warn",
    ] {
        if let Ok(directive) = directive.parse() {
            filter = filter.add_directive(directive);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
        _ = terminate.recv() => tracing::info!("SIGTERM: finishing the current transaction"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: finishing the current transaction"),
    }
    shutdown.cancel();
}
