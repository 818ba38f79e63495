//! The binary: flags, logging, signals; everything else is in the library.
//!
//! It holds no relay logic: each command is one call into the library, and `run` and `poll`
//! get a shutdown token that SIGTERM or SIGINT cancels, so a test can run the same code with a
//! token of its own.

#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use outbox_relay::advice::report;
use outbox_relay::config::{Cli, Command, LogFormat};
use outbox_relay::liveness::{self, PeerTimeout, Policy};
use outbox_relay::{failpoint, ops, poll, setup, wal};

fn main() -> ExitCode {
    // A usage error exits here, printed by clap: logging is not set up yet.
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // From here on an error is reported once, as a log record in the chosen format: a second
    // plain line would break a `--log-format json` stream.
    if let Err(e) = failpoint::init_from_env() {
        tracing::error!(error = %e, "stopped");
        return ExitCode::FAILURE;
    }
    // Before any connection: every one of them reads it.
    let (peer_timeout, statement_timeout) = cli.command.connection_limits();
    match PeerTimeout::new(peer_timeout) {
        Ok(peer_timeout) => liveness::configure(Policy {
            peer_timeout,
            statement_timeout,
        }),
        Err(e) => {
            tracing::error!(error = %e, "stopped");
            return ExitCode::FAILURE;
        }
    }
    // One thread for all of the relay's tasks: per message it does a few microseconds of
    // work, and handing messages between worker threads (futex wake-ups, cache misses) cost
    // more than the parallelism gave (docs/records/2026-12-01-relay-cpu.md, "One runtime
    // thread"). lapin's I/O loop and blocking calls keep their own threads.
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
    // `status` exits 2 when the slot is missing or lost (poll mode: the table cannot be
    // read), so that it can serve as a probe.
    let mut exit_code = ExitCode::SUCCESS;
    let result = runtime.block_on(async {
        match cli.command {
            Command::Setup(args) => setup::run(args).await,
            Command::Run(args) => {
                let shutdown = CancellationToken::new();
                tokio::spawn(stop_on_signal(shutdown.clone()));
                wal::run(args, shutdown).await
            }
            Command::Poll(args) => {
                let shutdown = CancellationToken::new();
                tokio::spawn(stop_on_signal(shutdown.clone()));
                poll::run(args, shutdown).await
            }
            Command::Status(args) => ops::status::run(args).await.map(|probe| {
                if probe != ops::status::Probe::Healthy {
                    exit_code = ExitCode::from(2);
                }
            }),
            Command::Teardown(args) => ops::teardown::run(args).await,
            Command::Resync(args) => ops::resync::run(args).await,
        }
    });
    match result {
        Ok(()) => exit_code,
        Err(e) => {
            let e = e.clarify(None);
            tracing::error!(error = %report(&e), "stopped");
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
    // Colours only for a person at a terminal, never into a log file.
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
        _ = terminate.recv() => tracing::info!("SIGTERM: finishing the current transaction"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: finishing the current transaction"),
    }
    shutdown.cancel();
}
