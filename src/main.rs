//! The binary: flags, logging, signals; everything else is in the library.
//!
//! It holds no relay logic: each command is one call into the library, and `run` and `poll`
//! get a shutdown token that SIGTERM or SIGINT cancels. Integration tests run this binary,
//! not the library in their own process (docs/architecture.md, "Why this cut").

#![forbid(unsafe_code)]

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use outbox_common::error::chain;
use outbox_common::liveness::{self, PeerTimeout, Policy};
use outbox_common::logging::{start, stop_on_signal};
use outbox_relay::advice::report;
use outbox_relay::config::{Cli, Command};
use outbox_relay::{exit, failpoint, ops, poll, setup, wal};

/// What SIGTERM or SIGINT lets the relay do before it exits.
const FINISHING: &str = "finishing the current transaction";

fn main() -> ExitCode {
    // A usage error exits here, printed by clap: logging is not set up yet.
    let cli = Cli::parse_all();
    let runtime = match start(cli.log_format, failpoint::init_from_env) {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %chain(&e), "stopped");
            return ExitCode::from(exit::STOPPED);
        }
    };
    // Before any connection: every one of them reads it.
    let (peer_timeout, statement_timeout) = cli.command.connection_limits();
    match PeerTimeout::new(peer_timeout) {
        Ok(peer_timeout) => liveness::configure(Policy {
            peer_timeout,
            statement_timeout,
        }),
        Err(e) => {
            tracing::error!(error = %e, "stopped");
            return ExitCode::from(exit::CONFIG);
        }
    }
    // `status` exits UNHEALTHY when the slot is missing or lost (poll mode: the table
    // cannot be read), so that it can serve as a probe; `check` by what it found.
    let mut exit_code = ExitCode::SUCCESS;
    let result = runtime.block_on(async {
        match cli.command {
            Command::Setup(args) => setup::run(args).await,
            Command::Run(args) => {
                let shutdown = CancellationToken::new();
                tokio::spawn(stop_on_signal(shutdown.clone(), FINISHING));
                wal::run(args, shutdown).await
            }
            Command::Poll(args) => {
                let shutdown = CancellationToken::new();
                tokio::spawn(stop_on_signal(shutdown.clone(), FINISHING));
                poll::run(args, shutdown).await
            }
            Command::Status(args) => ops::status::run(args).await.map(|probe| {
                if probe != ops::status::Probe::Healthy {
                    exit_code = ExitCode::from(exit::UNHEALTHY);
                }
            }),
            Command::Teardown(args) => ops::teardown::run(args).await,
            Command::Resync(args) => ops::resync::run(args).await,
            Command::Check(args) => ops::check::run(args).await.map(|verdict| {
                exit_code = ExitCode::from(verdict.exit_code());
            }),
        }
    });
    match result {
        Ok(()) => exit_code,
        Err(e) => {
            let e = e.clarify(None);
            tracing::error!(error = %report(&e), "stopped");
            ExitCode::from(exit::of(&e))
        }
    }
}
