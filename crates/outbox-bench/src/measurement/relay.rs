//! The relay under test: the release binary with its normal CLI, run as the test-kit's
//! [`outbox_testkit::RelayProcess`], with what the benchmark adds to it: errors instead of
//! panics, the log kept under the work directory, and the relay's CPU and peak memory from
//! /proc ([`outbox_testkit::procfs`]). It must never wait by sleeping: it waits for the relay's
//! ready line in its log.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::process::Command;

use outbox_testkit::procfs::{self, Usage};
use outbox_testkit::RelayProcess;

/// How long the relay may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a SIGTERM may take before the relay is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start the relay: the binary, the URLs (passed in the environment, as a deployment
/// passes secrets), and where its logs go.
#[derive(Debug, Clone)]
pub struct RelayBinary {
    pub path: PathBuf,
    pub database_url: String,
    pub amqp_url: String,
    pub log_dir: PathBuf,
}

/// A running relay. Dropping it kills it; its log is then copied to `<log_dir>/<name>.log`.
pub struct Relay {
    process: RelayProcess,
    /// What the relay logs once it has started its work (see [`ready_line`]).
    ready_line: &'static str,
    /// Where the log is kept once the relay is gone.
    log: PathBuf,
}

impl RelayBinary {
    /// Runs `outbox-relay <args>` to completion (`setup`); fails with its output if it fails.
    pub async fn run_once(&self, args: &[String]) -> Result<()> {
        let output = Command::new(&self.path)
            .args(args)
            .envs(self.env())
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("cannot run {}", self.path.display()))?;
        if !output.status.success() {
            bail!(
                "outbox-relay {} failed ({}):\n{}{}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }

    /// Starts `outbox-relay <args>` in the background; its log is kept as
    /// `<log_dir>/<name>.log`.
    pub fn spawn(&self, name: &str, args: &[String]) -> Result<Relay> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let process = RelayProcess::try_spawn_bin(&self.path, &args, &self.env())
            .with_context(|| format!("cannot start {}", self.path.display()))?;
        Ok(Relay {
            process,
            ready_line: ready_line(&args),
            log: self.log_dir.join(format!("{name}.log")),
        })
    }

    fn env(&self) -> [(&str, &str); 4] {
        [
            ("DATABASE_URL", &self.database_url),
            ("AMQP_URL", &self.amqp_url),
            ("RUST_LOG", "info"),
            ("NO_COLOR", "1"),
        ]
    }
}

/// The relay's line saying it has started its work: `streaming` (`run`) or `polling` (`poll`).
fn ready_line(args: &[&str]) -> &'static str {
    match args.first() {
        Some(&"poll") => " polling",
        _ => " streaming",
    }
}

/// The `node=` field of each line saying the relay connected to a RabbitMQ node.
fn broker_nodes(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| {
            l.contains("connected to RabbitMQ") || l.contains("moved to another RabbitMQ node")
        })
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|field| field.strip_prefix("node="))
                .map(String::from)
        })
        .collect()
}

impl Relay {
    /// Waits for the ready line; fails if the relay exits first or takes too long.
    pub async fn ready(&self) -> Result<()> {
        if self
            .process
            .wait_for_log(self.ready_line, READY_TIMEOUT)
            .await
        {
            return Ok(());
        }
        match self.process.try_exit() {
            Some(status) => bail!(
                "the relay exited at startup ({status}); see its log {}",
                self.log.display()
            ),
            None => bail!(
                "the relay was not ready after {} s (log: {})",
                READY_TIMEOUT.as_secs(),
                self.log.display()
            ),
        }
    }

    /// CPU time and peak RSS so far; fails once the process has exited.
    pub fn usage(&self) -> Result<Usage> {
        if let Some(status) = self.process.try_exit() {
            bail!(
                "the relay exited early ({status}); see {}",
                self.log.display()
            );
        }
        procfs::usage(self.process.pid())
    }

    /// The broker nodes (`host:port`) the relay connected to, in order, from its
    /// "connected to RabbitMQ" and "moved to another RabbitMQ node" log lines.
    pub fn broker_nodes(&self) -> Vec<String> {
        broker_nodes(&self.process.log())
    }

    /// `kill -9` and reap it: no shutdown, no final feedback.
    pub fn kill(self) {
        self.process.kill9();
    }

    /// SIGTERM and wait (SIGKILL after a timeout); `Err` unless it exited 0.
    pub async fn stop(self) -> Result<()> {
        self.process.sigterm();
        match self.process.wait_exit(STOP_TIMEOUT).await {
            Some(status) if status.success() => Ok(()),
            Some(status) => bail!(
                "the relay exited with {status} on SIGTERM; see {}",
                self.log.display()
            ),
            None => bail!(
                "the relay did not stop within {} s of SIGTERM",
                STOP_TIMEOUT.as_secs()
            ),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The test-kit's log lives in a temp dir that goes with the process: keep a copy
        // where bench.sh says the logs are. Killed first, so the copy is the whole log.
        self.process.kill9();
        if let Err(e) = std::fs::copy(self.process.log_path(), &self.log) {
            eprintln!(
                "bench: cannot keep the relay log as {}: {e}",
                self.log.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_lines() {
        assert_eq!(ready_line(&["run", "--table", "t"]), " streaming");
        assert_eq!(ready_line(&["poll", "--workers", "1"]), " polling");
    }

    #[test]
    fn broker_nodes_from_the_log() {
        let log = "2026-11-30T19:00:00Z  INFO outbox_relay::internals::nodes: connected to RabbitMQ node=127.0.0.1:40001 nodes=3\n\
                   2026-11-30T19:00:01Z  INFO outbox_relay::wal: streaming slot=s\n\
                   2026-11-30T19:00:02Z  WARN outbox_relay::internals::nodes: moved to another RabbitMQ node node=127.0.0.1:40002 from=127.0.0.1:40001 reason=reconnect\n";
        assert_eq!(broker_nodes(log), ["127.0.0.1:40001", "127.0.0.1:40002"]);
        assert!(broker_nodes("no broker yet").is_empty());
    }
}
