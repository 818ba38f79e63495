//! A child process's CPU time and peak memory, read from Linux's /proc: the benchmark's
//! per-process accounting of the relay (and [`crate::RelayProcess::peak_rss_kib`]). It only
//! reads /proc; it must never sample by polling in a loop of its own (the caller decides
//! when a figure is taken, so the measurement's end is the caller's).
//!
//! CPU: `utime` + `stime` (fields 14 and 15 of `/proc/<pid>/stat`, in clock ticks). The
//! second field, the command name, is in parentheses and may itself hold spaces or `)`, so
//! fields are counted after the LAST `)`. Peak memory: `VmHWM` of `/proc/<pid>/status`, the
//! high-water mark of the resident set, which the kernel keeps for the process's lifetime.
//!
//! It only reads /proc, and a figure it cannot read is an error, never a zero that would
//! flatter the relay.

use std::time::Duration;

use anyhow::{bail, Context, Result};

/// `USER_HZ`: the unit of the times in /proc. Fixed at 100 by the kernel's ABI on every
/// architecture Linux reports it for (`getconf CLK_TCK`), whatever the kernel's own HZ.
const TICKS_PER_SECOND: u64 = 100;

/// What a process has used so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// User plus system CPU time.
    pub cpu: Duration,
    /// Peak resident set size, in KiB.
    pub peak_rss_kib: u64,
}

/// Reads the usage of a live process.
pub fn usage(pid: u32) -> Result<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    Ok(Usage {
        cpu: cpu_time(&stat)?,
        peak_rss_kib: peak_rss_kib(&status)?,
    })
}

/// `utime + stime` from the text of `/proc/<pid>/stat`.
pub fn cpu_time(stat: &str) -> Result<Duration> {
    // After the name: field 3 (state) onwards; utime and stime are fields 14 and 15.
    stat_ticks(stat, [(11, "utime"), (12, "stime")])
}

/// `cutime + cstime` from the text of `/proc/<pid>/stat`: the CPU of the children the
/// process has waited for (a PostgreSQL backend's, once it exited and the postmaster reaped
/// it).
pub fn reaped_children_cpu_time(stat: &str) -> Result<Duration> {
    stat_ticks(stat, [(13, "cutime"), (14, "cstime")])
}

/// The sum of two clock-tick fields of a stat line, indexed from the field after the
/// command name (field 3 is index 0).
fn stat_ticks(stat: &str, fields: [(usize, &str); 2]) -> Result<Duration> {
    let Some((_, after_name)) = stat.rsplit_once(')') else {
        bail!("no command name in /proc stat line {stat:?}");
    };
    let values: Vec<&str> = after_name.split_whitespace().collect();
    let mut ticks = 0;
    for (index, name) in fields {
        ticks += values
            .get(index)
            .and_then(|f| f.parse::<u64>().ok())
            .with_context(|| format!("no {name} in /proc stat line {stat:?}"))?;
    }
    Ok(Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND))
}

/// The parent pid (field 4) from the text of `/proc/<pid>/stat`.
pub fn parent_pid(stat: &str) -> Result<u32> {
    stat.rsplit_once(')')
        .and_then(|(_, after)| after.split_whitespace().nth(1))
        .and_then(|f| f.parse().ok())
        .with_context(|| format!("no ppid in /proc stat line {stat:?}"))
}

/// The CPU used so far by a process and its direct children, live or exited and reaped:
/// PostgreSQL's, from its postmaster (backends are its children). A child that exited but
/// was not reaped yet is missed; a process that ends mid-scan is skipped.
pub fn process_and_children_cpu(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    let mut total = cpu_time(&stat)? + reaped_children_cpu_time(&stat)?;
    for entry in std::fs::read_dir("/proc").context("cannot list /proc")? {
        let Some(child) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        if parent_pid(&stat)? == pid {
            total += cpu_time(&stat)?;
        }
    }
    Ok(total)
}

/// `VmHWM` in KiB from the text of `/proc/<pid>/status`.
pub fn peak_rss_kib(status: &str) -> Result<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM line in /proc status")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_counts_after_the_last_parenthesis() {
        // A command name with a space and a ')' must not shift the fields.
        let stat = "4242 (out) box) S 1 4242 4242 0 -1 4194304 1500 0 0 0 250 37 0 0 20 0 9 0 \
                    123 456789 2048 18446744073709551615";
        assert_eq!(cpu_time(stat).expect("parses"), Duration::from_millis(2870));
        assert!(cpu_time("4242 no name here").is_err());
        assert!(cpu_time("4242 (x) S 1 2").is_err());
    }

    #[test]
    fn parent_and_reaped_children_after_the_last_parenthesis() {
        let stat = "4242 (out) box) S 1 4242 4242 0 -1 4194304 1500 0 0 0 250 37 12 3 20 0 9 0 \
                    123 456789 2048 18446744073709551615";
        assert_eq!(parent_pid(stat).expect("parses"), 1);
        assert_eq!(
            reaped_children_cpu_time(stat).expect("parses"),
            Duration::from_millis(150)
        );
        let own = process_and_children_cpu(std::process::id()).expect("own /proc entry");
        assert!(own >= usage(std::process::id()).expect("own").cpu);
    }

    #[test]
    fn peak_rss_from_vmhwm() {
        let status =
            "Name:\toutbox-relay\nVmPeak:\t  100000 kB\nVmHWM:\t   23456 kB\nVmRSS:\t 20000 kB\n";
        assert_eq!(peak_rss_kib(status).expect("parses"), 23456);
        assert!(peak_rss_kib("Name:\tx\n").is_err());
    }

    #[test]
    fn this_process_can_be_read() {
        let usage = usage(std::process::id()).expect("own /proc entry");
        assert!(usage.peak_rss_kib > 0);
    }
}
