//! `bench --pin-broker`: RabbitMQ on a CPU of its own, PostgreSQL, the relays and this process
//! (the consumer, the minimal publisher) on the others.
//!
//! On the benchmark's 2 cores every process shares the CPU, and a drain's rate follows the
//! CPU all of them spend per message: in the run of 2026-12-05 every consumer-attached run,
//! the relay's drains and the minimal publisher's alike, used 1.55-1.58 cores, and their ratio
//! was the inverse ratio of their CPU per message
//! (crates/outbox-bench/lab/records/2026-12-05-pairs.md). In production the broker has hosts
//! of its own. Pinned, RabbitMQ's core is the limit, and the ratio says whether the relay
//! keeps the broker as busy as a publisher with nothing to do but publish. Processes started
//! later inherit their parent's CPUs: PostgreSQL's backends and walsenders the postmaster's,
//! the relays this process's.

use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use outbox_testkit::procfs;

/// Which CPUs each side gets: the last one to the broker, the rest to everything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinning {
    pub broker: String,
    pub others: String,
}

impl Pinning {
    /// The split for a machine of `cpus` CPUs (CPUs 0 to `cpus - 1`).
    pub fn of(cpus: usize) -> Result<Pinning> {
        if cpus < 2 {
            bail!("--pin-broker needs at least 2 CPUs; this process may use {cpus}");
        }
        let last = cpus - 1;
        Ok(Pinning {
            broker: last.to_string(),
            others: if last == 1 {
                "0".to_string()
            } else {
                format!("0-{}", last - 1)
            },
        })
    }

    /// What the report says about the run's placement.
    pub fn describe(&self) -> String {
        format!(
            "RabbitMQ pinned to CPU {}; PostgreSQL, the relays and the bench's consumer and \
             publisher to CPU {}",
            self.broker, self.others
        )
    }
}

/// Every thread of `pid` and of its live direct children on `cpus` (`taskset -a -p -c`).
pub fn pin_with_children(pid: u32, cpus: &str) -> Result<()> {
    pin(pid, cpus)?;
    for (child, _) in procfs::children(pid)? {
        pin(child, cpus)?;
    }
    Ok(())
}

fn pin(pid: u32, cpus: &str) -> Result<()> {
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .context("cannot run taskset (Debian's util-linux)")?;
    if !status.success() {
        bail!("taskset could not move process {pid} to CPUs {cpus}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_gets_the_last_cpu() {
        assert!(Pinning::of(1).is_err());
        let two = Pinning::of(2).expect("2 CPUs");
        assert_eq!((two.broker.as_str(), two.others.as_str()), ("1", "0"));
        let eight = Pinning::of(8).expect("8 CPUs");
        assert_eq!((eight.broker.as_str(), eight.others.as_str()), ("7", "0-6"));
    }

    #[test]
    fn a_process_is_moved_with_its_children() {
        let mut child = Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep starts");
        let result = pin_with_children(child.id(), "0");
        let allowed = std::fs::read_to_string(format!("/proc/{}/status", child.id()))
            .expect("the child's status");
        let _ = child.kill();
        let _ = child.wait();
        result.expect("pinned");
        assert!(
            allowed
                .lines()
                .any(|l| l.starts_with("Cpus_allowed_list:") && l.trim_end().ends_with("\t0")),
            "{allowed}"
        );
        assert!(pin_with_children(u32::MAX, "0").is_err());
    }
}
