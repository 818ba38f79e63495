//! The broker's processes on this machine: found, waited on until quiet before a measured run,
//! pinned to a CPU of their own (`--pin-broker`).

use std::time::Duration;

use anyhow::Result;

use super::*;
use crate::measurement::cpu::{self};
use crate::scenarios::pinning::{self, Pinning};

impl Bench {
    /// `--pin-broker`: the RabbitMQ node on its CPU, the postmaster with its processes and this
    /// process on the others.
    pub(super) async fn pin_broker(&self, pinning: &Pinning) -> Result<()> {
        let rabbitmq = self.rabbitmq_pids();
        if rabbitmq.is_empty() {
            anyhow::bail!(
                "--pin-broker: no RabbitMQ process of this machine listens on the broker's ports"
            );
        }
        for pid in rabbitmq {
            pinning::pin_with_children(pid, &pinning.broker)?;
        }
        pinning::pin_with_children(self.postmaster_pid().await?, &pinning.others)?;
        pinning::pin_with_children(std::process::id(), &pinning.others)?;
        self.say(&pinning.describe());
        Ok(())
    }

    /// Waits (at most --settle-secs) for the broker's nodes to go quiet before a measured run;
    /// says so when that took a while or did not happen.
    pub(super) async fn settle(&self, rabbitmq: &[u32]) {
        if self.args.settle_secs == 0 || rabbitmq.is_empty() {
            return;
        }
        let limit = Duration::from_secs(self.args.settle_secs);
        let settle = cpu::wait_quiet(rabbitmq, limit).await;
        let waited = settle.waited.as_secs_f64();
        match settle.share {
            None => self.say("  RabbitMQ's CPU cannot be read: not waiting for it to go quiet"),
            Some(share) if !settle.quiet => self.say(&format!(
                "  RabbitMQ still busy after {waited:.1} s ({:.0} % of a core): measuring anyway",
                share * 100.0
            )),
            Some(share) if waited >= 3.0 => self.say(&format!(
                "  RabbitMQ quiet after {waited:.1} s ({:.0} % of a core)",
                share * 100.0
            )),
            Some(_) => {}
        }
    }

    /// The RabbitMQ processes of every node of the broker (`Endpoints::nodes`), if they run on
    /// this machine: not only the relay's URLs, since a relay pinned to one node of a cluster
    /// still costs the others.
    pub(super) fn rabbitmq_pids(&self) -> Vec<u32> {
        match cpu::rabbitmq_pids(&self.endpoints.nodes) {
            Ok(pids) if !pids.is_empty() => pids,
            Ok(_) => {
                self.say("  no process here listens on the broker's AMQP ports: no RabbitMQ CPU");
                Vec::new()
            }
            Err(e) => {
                self.say(&format!("  no RabbitMQ CPU: {e:#}"));
                Vec::new()
            }
        }
    }
}
