//! What each binary does before its first log line and around its last: logs on stderr in
//! the chosen format, its failpoints armed, the runtime, and SIGTERM or SIGINT turned into a
//! cancelled shutdown token.

use std::io::{IsTerminal, Write};

use clap::ValueEnum;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Why a process cannot start, for its `main` to log: under the binary's own log target, so
/// that its one "stopped" record looks the same whatever stopped it.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The failpoints' variable is wrong (or set in a build without failpoints).
    #[error("{0}")]
    Failpoints(String),
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
}

/// The start both binaries share: logging in `format`, then their failpoints armed
/// (`arm_failpoints`, which says what is wrong with the variable), then the runtime. From
/// here on an error is reported once, as a log record in the chosen format (a second plain
/// line would break a JSON stream).
///
/// One thread for all of a process's tasks: per message the relay and the consumer do a few
/// microseconds of work, and handing messages between worker threads (futex wake-ups, cache
/// misses) cost more than the parallelism gave
/// (crates/outbox-bench/lab/records/2026-12-01-relay-cpu.md, "One runtime thread"). lapin's
/// I/O loop and blocking calls keep their own threads.
pub fn start(
    format: LogFormat,
    arm_failpoints: fn() -> Result<(), String>,
) -> Result<tokio::runtime::Runtime, StartError> {
    init_logging(format);
    arm_failpoints().map_err(StartError::Failpoints)?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StartError::Runtime)
}

/// Logs go to stderr. Libraries that can print message contents (lapin logs a returned
/// message whole, payload included) are capped whatever RUST_LOG says.
pub fn init_logging(format: LogFormat) {
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
        .with_writer(|| Unfailing(std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// A log writer whose writes never fail: what `inner` refuses (stderr a pipe nobody reads
/// any more, `run 2>&1 | head -1`) is dropped. tracing-subscriber reports a failed write with
/// `eprintln!`, which panics when stderr fails: logging would end the process (exit 101).
struct Unfailing<W>(W);

impl<W: Write> Write for Unfailing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = self.0.write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

/// Cancels `shutdown` at the first SIGTERM or SIGINT, logging which one came and `finishing`
/// (what the process does before it exits: "finishing the current transaction").
pub async fn stop_on_signal(shutdown: CancellationToken, finishing: &'static str) {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                return;
            }
        };
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: {finishing}"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: {finishing}"),
    }
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a closed pipe does to every write.
    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
    }

    #[test]
    fn a_failed_write_is_dropped_not_reported() {
        let mut writer = Unfailing(Broken);
        assert_eq!(writer.write(b"a log line\n").ok(), Some(11));
        assert!(writer.write_all(b"another").is_ok());
        assert!(writer.flush().is_ok());
    }
}
