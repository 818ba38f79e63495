//! The `outbox-inbox` binary: flags, logging, signals; everything else is in the library.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;

use outbox_common::error::chain;
use outbox_common::liveness;
use outbox_common::logging::{start, stop_on_signal};
use outbox_inbox::cli::{Cli, Command};
use outbox_inbox::{commands, failpoint};

/// What SIGTERM or SIGINT lets the consumer do before it exits.
const FINISHING: &str = "finishing the messages in hand";

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match start(cli.log_format, failpoint::init_from_env) {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %chain(&e), "stopped");
            return ExitCode::FAILURE;
        }
    };
    // Before any connection (the consumer's cleanup connects beside it): every one of them
    // reads them.
    outbox_common::pg::set_application_name(outbox_inbox::APPLICATION_NAME);
    match cli.command.connection_policy() {
        Ok(policy) => liveness::configure(policy),
        Err(e) => {
            tracing::error!(error = %chain(&e), "stopped");
            return ExitCode::FAILURE;
        }
    }
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        match cli.command {
            Command::Setup(args) => commands::setup(args).await,
            Command::Consume(args) => {
                tokio::spawn(stop_on_signal(shutdown.clone(), FINISHING));
                commands::consume(*args, shutdown).await
            }
            Command::Cleanup(args) => {
                tokio::spawn(stop_on_signal(shutdown.clone(), FINISHING));
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
