//! The CPU split of a measurement: the µs of CPU per message each process spent,
//! the relay, the walsender serving its slot, the RabbitMQ node and this process (the
//! consumer; in the broker-alone limits the publisher too). On a 2-core machine they all
//! share the CPU, so a drain's rate alone cannot say whose work the messages cost.
//!
//! Every figure comes from /proc through [`outbox_testkit::procfs`], so the processes must
//! run on this machine (scripts/bench.sh runs them so). A process that cannot be found or read
//! gives no figure ("—"), never a zero.
//!
//! - relay: what the caller read (the relay's whole CPU: it starts with the drain);
//! - walsender: the process serving each slot (`pg_replication_slots.active_pid`, checked to be
//!   a child of the postmaster), read at the end: it started with the relay's connection;
//! - RabbitMQ: the processes listening on the AMQP URLs' ports (each node's `beam.smp`),
//!   the difference between the start and the end;
//! - bench: /proc/self, the difference between the start and the end.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

use outbox_testkit::pg::url_port;
use outbox_testkit::procfs;

/// µs of CPU per message of each process; `None` where the process was not read.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuSplit {
    /// What the figures are divided by: messages received (confirmed, without a consumer).
    pub messages: u64,
    pub relay_us: Option<f64>,
    pub walsender_us: Option<f64>,
    pub rabbitmq_us: Option<f64>,
    /// outbox-bench itself: the consumer (and the publisher of a broker-alone limit).
    pub bench_us: Option<f64>,
}

impl CpuSplit {
    /// The sum of the figures that were read.
    pub fn total_us(&self) -> f64 {
        [
            self.relay_us,
            self.walsender_us,
            self.rabbitmq_us,
            self.bench_us,
        ]
        .into_iter()
        .flatten()
        .sum()
    }

    /// The relay's CPU per message over RabbitMQ's in the same run: a machine's speed
    /// changes both, so this ratio compares across machines where µs do not (the target in
    /// docs/benchmarks.md is 0.2 or less).
    pub fn relay_per_rabbitmq(&self) -> Option<f64> {
        self.relay_us
            .zip(self.rabbitmq_us.filter(|r| *r > 0.0))
            .map(|(relay, rabbitmq)| relay / rabbitmq)
    }
}

/// The CPU already used when a measurement starts, by the processes read again at its end.
#[derive(Debug)]
pub struct CpuProbe {
    rabbitmq: Vec<u32>,
    rabbitmq_before: Option<Duration>,
    bench_before: Option<Duration>,
}

impl CpuProbe {
    /// Reads the RabbitMQ processes' CPU and this process's now.
    pub fn start(rabbitmq: &[u32]) -> CpuProbe {
        CpuProbe {
            rabbitmq: rabbitmq.to_vec(),
            rabbitmq_before: cpu_of(rabbitmq),
            bench_before: cpu_of(&[std::process::id()]),
        }
    }

    /// The split over `messages`, with the relay's and walsenders' CPU the caller read.
    pub fn finish(
        &self,
        messages: u64,
        relay: Option<Duration>,
        walsender: Option<Duration>,
    ) -> CpuSplit {
        let since = |before: Option<Duration>, now: Option<Duration>| {
            before.zip(now).map(|(b, n)| n.saturating_sub(b))
        };
        let rabbitmq = since(self.rabbitmq_before, cpu_of(&self.rabbitmq));
        let bench = since(self.bench_before, cpu_of(&[std::process::id()]));
        let us = |cpu: Option<Duration>| {
            cpu.filter(|_| messages > 0)
                .map(|c| c.as_secs_f64() * 1e6 / messages as f64)
        };
        CpuSplit {
            messages,
            relay_us: us(relay),
            walsender_us: us(walsender),
            rabbitmq_us: us(rabbitmq),
            bench_us: us(bench),
        }
    }
}

/// A share of one core below which the broker counts as quiet: an idle node uses well under
/// 1 % (0.2 % measured on the benchmark's machine); a node still deleting a full queue uses
/// most of a core.
pub const QUIET_SHARE: f64 = 0.10;

/// How busy the broker was as a run was about to start, and how long it was waited for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settle {
    pub waited: Duration,
    /// The broker's CPU over the last sample, in cores; `None` if its processes were not read.
    pub share: Option<f64>,
    /// Every sample of the last two seconds was under [`QUIET_SHARE`].
    pub quiet: bool,
}

/// Waits, at most `limit`, until `pids` together have used less than [`QUIET_SHARE`] of a
/// core in each half second of the last two, so that no run starts while the broker still
/// works for the one before (a run ends by deleting its queue, up to 200,000 messages).
/// Processes that cannot be read are not waited for. The cluster's slow runs of 2026-12-05
/// were not this but a Raft WAL rollover inside the run
/// (crates/outbox-bench/lab/records/2026-12-05-pairs.md).
pub async fn wait_quiet(pids: &[u32], limit: Duration) -> Settle {
    const SAMPLE: Duration = Duration::from_millis(500);
    const QUIET_SAMPLES: u32 = 4;
    let started = tokio::time::Instant::now();
    let mut quiet_samples = 0;
    loop {
        let sample_start = tokio::time::Instant::now();
        let before = cpu_of(pids);
        tokio::time::sleep(SAMPLE).await;
        let span = sample_start.elapsed().as_secs_f64();
        let share = before
            .zip(cpu_of(pids))
            .map(|(b, a)| a.saturating_sub(b).as_secs_f64() / span);
        quiet_samples = match share {
            Some(share) if share < QUIET_SHARE => quiet_samples + 1,
            _ => 0,
        };
        let settle = Settle {
            waited: started.elapsed(),
            share,
            quiet: quiet_samples == QUIET_SAMPLES,
        };
        if settle.share.is_none() || settle.quiet || settle.waited >= limit {
            return settle;
        }
    }
}

/// The CPU used so far by all of `pids`; `None` if there are none or one cannot be read.
fn cpu_of(pids: &[u32]) -> Option<Duration> {
    if pids.is_empty() {
        return None;
    }
    pids.iter()
        .map(|&pid| procfs::usage(pid).ok().map(|u| u.cpu))
        .sum()
}

/// The processes on this machine listening on the ports of an AMQP URL list (the relay's
/// syntax: URLs separated by commas): the RabbitMQ nodes. Empty if none listens here.
pub fn rabbitmq_pids(urls: &str) -> Result<Vec<u32>> {
    let mut pids = Vec::new();
    for url in split_amqp_urls(urls) {
        let default = if url.starts_with("amqps") { 5671 } else { 5672 };
        pids.extend(procfs::listening_pids(url_port(url).unwrap_or(default))?);
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// A list split before each `amqp://` or `amqps://` (a comma elsewhere stays in its URL).
fn split_amqp_urls(list: &str) -> Vec<&str> {
    let mut urls = Vec::new();
    let mut start = 0;
    for (at, _) in list.match_indices(',') {
        if list[at + 1..].trim_start().starts_with("amqp") {
            urls.push(list[start..at].trim());
            start = at + 1;
        }
    }
    urls.push(list[start..].trim());
    urls.retain(|u| !u.is_empty());
    urls
}

/// The CPU used so far by the walsenders serving `slots`, each of which must be active and
/// a child of `postmaster` (a pid of another machine's server could name a process here).
pub async fn walsender_cpu(admin: &Client, slots: &[String], postmaster: u32) -> Result<Duration> {
    let rows = admin
        .query(
            "SELECT slot_name::text, active_pid FROM pg_replication_slots \
             WHERE slot_name = ANY($1)",
            &[&slots],
        )
        .await?;
    if rows.len() != slots.len() {
        bail!("{} of the slots {slots:?} exist", rows.len());
    }
    let mut total = Duration::ZERO;
    for row in rows {
        let slot: String = row.try_get(0)?;
        let Some(pid) = row.try_get::<_, Option<i32>>(1)? else {
            bail!("no walsender serves slot {slot}");
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("walsender {pid} is not on this machine"))?;
        if procfs::parent_pid(&stat)? != postmaster {
            bail!("process {pid} is not a child of the postmaster {postmaster}");
        }
        total += procfs::cpu_time(&stat)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amqp_url_lists_split_before_each_url() {
        assert_eq!(
            split_amqp_urls("amqp://a:1/%2f,amqps://b:2/v?x=1,2, amqp://c"),
            ["amqp://a:1/%2f", "amqps://b:2/v?x=1,2", "amqp://c"]
        );
        assert!(split_amqp_urls("").is_empty());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_busy_process_is_waited_for_up_to_the_limit_and_an_unread_one_not() {
        let me = [std::process::id()];
        // Spins a core until told to stop: this process is then far over the quiet share.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinner = std::thread::spawn({
            let stop = stop.clone();
            move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            }
        });
        let busy = wait_quiet(&me, Duration::from_secs(1)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spinner.join().expect("the spinner ends");
        assert!(!busy.quiet, "{busy:?}");
        assert!(busy.waited >= Duration::from_secs(1), "{busy:?}");
        // Unread processes are not waited for.
        let unread = wait_quiet(&[u32::MAX], Duration::from_secs(30)).await;
        assert_eq!(unread.share, None);
        assert!(unread.waited < Duration::from_secs(30), "{unread:?}");
    }

    #[test]
    fn a_probe_reads_this_process_and_skips_what_it_cannot_read() {
        let probe = CpuProbe::start(&[]);
        let split = probe.finish(1000, Some(Duration::from_millis(50)), None);
        assert_eq!(split.relay_us, Some(50.0));
        assert_eq!(split.walsender_us, None);
        assert_eq!(split.rabbitmq_us, None);
        assert!(split.bench_us.is_some());
        assert_eq!(
            probe.finish(0, Some(Duration::from_secs(1)), None).relay_us,
            None
        );
        // A process that is gone reads as none, never as zero.
        assert_eq!(cpu_of(&[u32::MAX]), None);
    }
}
