//! What the `outbox-relay` binary runs: one command to its end, and the exit code it ends
//! with (src/exit.rs). The binary (src/main.rs) keeps the flags' parsing, logging and the
//! connection policy; a failed command's error is logged here, once, with its advice.

use outbox_common::logging::stop_on_signal;
use tokio_util::sync::CancellationToken;

use crate::advice::report;
use crate::exit;
use crate::ops::status::Probe;
use crate::ops::{check, resync, status, teardown};
use crate::{poll, setup, wal};

pub use crate::config::cli::{Cli, Command};
pub use crate::failpoint::init_from_env;

/// What SIGTERM or SIGINT lets the relay do before it exits.
const FINISHING: &str = "finishing the current transaction";

/// Runs `command` to its end and returns its exit code. `run` and `poll` stop at SIGTERM or
/// SIGINT, finishing the current transaction; the other commands keep the signals' default.
/// `status` exits [`exit::UNHEALTHY`] when the slot is missing or lost (poll mode: the table
/// cannot be read), so that it can serve as a probe; `check` by what it found.
pub async fn execute(command: Command) -> u8 {
    let result = match command {
        Command::Setup(args) => setup::run(args).await.map(|()| 0),
        Command::Run(args) => wal::run(args, on_signal()).await.map(|()| 0),
        Command::Poll(args) => poll::run(args, on_signal()).await.map(|()| 0),
        Command::Status(args) => status::run(args).await.map(|probe| match probe {
            Probe::Healthy => 0,
            _ => exit::UNHEALTHY,
        }),
        Command::Teardown(args) => teardown::run(args).await.map(|()| 0),
        Command::Resync(args) => resync::run(args).await.map(|()| 0),
        Command::Check(args) => check::run(args).await.map(check::Verdict::exit_code),
    };
    result.unwrap_or_else(|e| {
        let e = e.clarify(None);
        // The binary's target, as the startup errors main.rs logs: one record a log search
        // finds every stop by.
        tracing::error!(target: "outbox_relay", error = %report(&e), "stopped");
        exit::of(&e)
    })
}

/// A shutdown token that the first SIGTERM or SIGINT cancels.
fn on_signal() -> CancellationToken {
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone(), FINISHING));
    shutdown
}
