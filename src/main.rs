//! The binary: flags, logging and the connection policy; everything else is in the library.
//!
//! It holds no relay logic: the command is one call into the library (src/commands.rs), which
//! handles the signals and returns the exit code. Integration tests run this binary, not the
//! library in their own process (docs/architecture.md, "Why this cut").

#![forbid(unsafe_code)]

use std::process::ExitCode;

use outbox_common::error::chain;
use outbox_common::liveness::{self, PeerTimeout, Policy};
use outbox_common::logging::start;
use outbox_relay::commands::{self, Cli};
use outbox_relay::exit;

fn main() -> ExitCode {
    // A usage error exits here, printed by clap: logging is not set up yet.
    let cli = Cli::parse_all();
    let runtime = match start(cli.log_format, commands::init_from_env) {
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
    ExitCode::from(runtime.block_on(commands::execute(cli.command)))
}
