//! `outbox-bench`: end-to-end checks and measurements of a running relay (src/bench/).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use outbox_relay::bench::demo::{self, DemoArgs};

#[derive(Debug, Parser)]
#[command(
    name = "outbox-bench",
    version,
    about = "Drives a running outbox-relay from outside: writes outbox rows, consumes the \
             messages, and reports what arrived"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Commit rows with concurrent writers and check that the relay delivers each of them, in
    /// commit order. Exits 0 when no row is missing, 1 otherwise.
    Demo(DemoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Demo(args) => match runtime.block_on(demo::run(&args)) {
            Ok(report) => {
                print!("{report}");
                if report.complete() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}
