//! The relay under test, run as a child process: the release binary with its normal CLI.
//!
//! Its output goes to a log file through a task that also watches for the line saying it is
//! ready (`streaming` in WAL mode, `polling` in polling mode), so the benchmark waits for that
//! event instead of sleeping. CPU and peak memory are read from /proc while it is alive.
//!
//! It owns the child process: the relay is killed when its handle is dropped, so a failed
//! measurement never leaves a relay running (and reading a slot) behind it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

use crate::procfs::{self, Usage};

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

/// A running relay.
pub struct RelayProcess {
    child: Child,
    pid: u32,
    ready: watch::Receiver<bool>,
    log: PathBuf,
}

impl RelayBinary {
    /// Runs `outbox-relay <args>` to completion (`setup`); fails with its output if it fails.
    pub async fn run_once(&self, args: &[String]) -> Result<()> {
        let output = self
            .command(args)
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

    /// Starts `outbox-relay <args>` in the background; its output goes to `<log_dir>/<name>.log`.
    pub async fn spawn(&self, name: &str, args: &[String]) -> Result<RelayProcess> {
        let log = self.log_dir.join(format!("{name}.log"));
        let file = tokio::fs::File::create(&log)
            .await
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", self.path.display()))?;
        let Some(pid) = child.id() else {
            bail!("the relay exited as it started");
        };
        let (ready_tx, ready) = watch::channel(false);
        let (lines_tx, mut lines) = tokio::sync::mpsc::channel::<String>(1024);
        if let Some(out) = child.stdout.take() {
            tokio::spawn(forward_lines(out, lines_tx.clone()));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(forward_lines(err, lines_tx));
        }
        tokio::spawn(async move {
            let mut file = tokio::io::BufWriter::new(file);
            while let Some(line) = lines.recv().await {
                if !*ready_tx.borrow() && is_ready_line(&line) {
                    ready_tx.send_replace(true);
                }
                let _ = file.write_all(line.as_bytes()).await;
                let _ = file.write_all(b"\n").await;
                if lines.is_empty() {
                    let _ = file.flush().await;
                }
            }
            let _ = file.flush().await;
        });
        Ok(RelayProcess {
            child,
            pid,
            ready,
            log,
        })
    }

    fn command(&self, args: &[String]) -> Command {
        let mut command = Command::new(&self.path);
        command
            .args(args)
            .env("DATABASE_URL", &self.database_url)
            .env("AMQP_URL", &self.amqp_url)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1");
        command
    }
}

/// The relay's line saying it has started its work: `streaming` (WAL) or `polling`.
fn is_ready_line(line: &str) -> bool {
    line.contains(" streaming") || line.contains(" polling")
}

async fn forward_lines(stream: impl AsyncRead + Unpin, lines: tokio::sync::mpsc::Sender<String>) {
    let mut reader = BufReader::new(stream).lines();
    while let Ok(Some(line)) = reader.next_line().await {
        if lines.send(line).await.is_err() {
            return;
        }
    }
}

impl RelayProcess {
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Waits for the ready line; fails if the relay exits first or takes too long.
    pub async fn ready(&mut self) -> Result<()> {
        match tokio::time::timeout(READY_TIMEOUT, self.ready_or_exit()).await {
            Ok(result) => {
                result.with_context(|| format!("see the relay's log {}", self.log.display()))
            }
            Err(_) => bail!(
                "the relay was not ready after {} s (log: {})",
                READY_TIMEOUT.as_secs(),
                self.log.display()
            ),
        }
    }

    async fn ready_or_exit(&mut self) -> Result<()> {
        loop {
            if *self.ready.borrow_and_update() {
                return Ok(());
            }
            tokio::select! {
                changed = self.ready.changed() => {
                    if changed.is_err() {
                        bail!("the relay's output ended before it was ready");
                    }
                }
                status = self.child.wait() => {
                    bail!("the relay exited at startup ({})", status?);
                }
            }
        }
    }

    /// CPU time and peak RSS so far; fails once the process has exited.
    pub fn usage(&mut self) -> Result<Usage> {
        if let Ok(Some(status)) = self.child.try_wait() {
            bail!(
                "the relay exited early ({status}); see {}",
                self.log.display()
            );
        }
        procfs::usage(self.pid)
    }

    /// `kill -9`: no shutdown, no final feedback.
    pub async fn kill(mut self) -> Result<()> {
        self.child.start_kill().context("cannot kill the relay")?;
        self.child.wait().await?;
        Ok(())
    }

    /// SIGTERM and wait (SIGKILL after a timeout); `Err` unless it exited 0.
    pub async fn stop(mut self) -> Result<()> {
        let sent = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await
            .context("cannot run kill")?;
        if !sent.success() {
            bail!("kill -TERM {} failed", self.pid);
        }
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    bail!(
                        "the relay exited with {status} on SIGTERM; see {}",
                        self.log.display()
                    );
                }
                Ok(())
            }
            Err(_) => {
                let _ = self.child.start_kill();
                bail!(
                    "the relay did not stop within {} s of SIGTERM",
                    STOP_TIMEOUT.as_secs()
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_lines() {
        assert!(is_ready_line(
            "2026-01-01T00:00:00Z  INFO outbox_relay::wal::session: streaming slot=s from=0/0"
        ));
        assert!(is_ready_line(
            "2026-01-01T00:00:00Z  INFO outbox_relay::poll: polling table=t workers=1"
        ));
        assert!(!is_ready_line("INFO outbox_relay: connecting"));
    }
}
