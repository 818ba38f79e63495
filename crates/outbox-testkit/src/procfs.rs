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
//!
//! Finding a server's process: [`listening_pids`] names the processes holding the listening
//! TCP socket of a port (`/proc/net/tcp{,6}` gives the socket's inode, `/proc/<pid>/fd` who
//! holds it): the RabbitMQ node behind an AMQP URL, whatever its node name or command line.

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
    for (_, stat) in children(pid)? {
        total += cpu_time(&stat)?;
    }
    Ok(total)
}

/// The live direct children of `pid`, each with its `/proc/<child>/stat` line; a process that
/// ends mid-scan is skipped.
pub fn children(pid: u32) -> Result<Vec<(u32, String)>> {
    let mut found = Vec::new();
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
            found.push((child, stat));
        }
    }
    Ok(found)
}

/// The processes holding a socket that listens on TCP `port` (any local address, IPv4 or
/// IPv6), in pid order; empty if nothing on this machine listens there. Needs the right to
/// read other users' `/proc/<pid>/fd` (root) for a server run by another user.
pub fn listening_pids(port: u16) -> Result<Vec<u32>> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        // A kernel without IPv6 has no tcp6 table.
        if let Ok(text) = std::fs::read_to_string(table) {
            inodes.extend(listening_inodes(&text, port));
        }
    }
    if inodes.is_empty() {
        return Ok(Vec::new());
    }
    let sockets: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").context("cannot list /proc")? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // Processes that end mid-scan, or whose fds we may not read, are skipped.
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| sockets.iter().any(|s| target.as_os_str() == s.as_str()))
        });
        if holds {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    Ok(pids)
}

/// The inodes of the sockets in LISTEN state on `port` in the text of `/proc/net/tcp` or
/// `/proc/net/tcp6` (`local_address` is `HEXADDR:HEXPORT`, `st` 0A is LISTEN, `inode` the
/// tenth field).
fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (_, local_port) = fields.get(1)?.rsplit_once(':')?;
            let listening = *fields.get(3)? == "0A";
            (listening && u16::from_str_radix(local_port, 16).ok()? == port)
                .then(|| fields.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// The queues of one established TCP connection, from this machine's end, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpQueues {
    /// Sent or waiting to be sent, and not acknowledged by the peer: what a peer that stops
    /// reading leaves here once its receive buffer is full (a zero window).
    pub send: u64,
    /// Received and not yet read by the process.
    pub receive: u64,
}

/// The queues of every established connection of this network namespace to remote `port`
/// (`/proc/net/tcp{,6}`: `tx_queue:rx_queue` is the fifth field, in hex).
pub fn tcp_queues_to(port: u16) -> Vec<TcpQueues> {
    tcp_queues(port, End::Remote)
}

/// The queues of every established connection of this network namespace from local `port`
/// (a server's end of its connections).
pub fn tcp_queues_from(port: u16) -> Vec<TcpQueues> {
    tcp_queues(port, End::Local)
}

/// Which end of a connection a port is matched at.
#[derive(Clone, Copy)]
enum End {
    Local,
    Remote,
}

fn tcp_queues(port: u16, end: End) -> Vec<TcpQueues> {
    let mut queues = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            queues.extend(queues_at(&text, port, end));
        }
    }
    queues
}

fn queues_at(table: &str, port: u16, end: End) -> Vec<TcpQueues> {
    let column = match end {
        End::Local => 1,
        End::Remote => 2,
    };
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (_, at_port) = fields.get(column)?.rsplit_once(':')?;
            let established = *fields.get(3)? == "01";
            let (send, receive) = fields.get(4)?.split_once(':')?;
            (established && u16::from_str_radix(at_port, 16).ok()? == port).then_some(TcpQueues {
                send: u64::from_str_radix(send, 16).ok()?,
                receive: u64::from_str_radix(receive, 16).ok()?,
            })
        })
        .collect()
}

/// `VmHWM` in KiB from the text of `/proc/<pid>/status`.
pub fn peak_rss_kib(status: &str) -> Result<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM line in /proc status")
}

/// Whether a process exists and is not a zombie.
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
            .unwrap_or(false),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_queues_of_established_connections_to_a_port_are_read_in_hex() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:D431 0100007F:1628 01 00100000:00000010 00:00000000 00000000     0        0 1 1
   1: 0100007F:D432 0100007F:1628 06 00000005:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:D433 0100007F:1629 01 00000007:00000000 00:00000000 00000000     0        0 3 1
   3: 0100007F:1628 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1";
        // 0x1628 is 5672: one established connection to it (the TIME_WAIT one is not).
        assert_eq!(
            super::queues_at(table, 5672, super::End::Remote),
            [super::TcpQueues {
                send: 0x0010_0000,
                receive: 0x10
            }]
        );
        // 0xD433 is 54323: the established connection from it (the listener is not one).
        assert_eq!(
            super::queues_at(table, 0xD433, super::End::Local),
            [super::TcpQueues {
                send: 7,
                receive: 0
            }]
        );
        assert_eq!(super::queues_at(table, 5672, super::End::Local), []);
    }

    use super::*;

    #[test]
    fn cpu_time_counts_after_the_last_parenthesis() {
        // A command name with a space and a ')' must not shift the fields.
        let stat = "4242 (out) box) S 1 4242 4242 0 -1 4194304 1500 0 0 0 250 37 0 0 20 0 9 0 \
                    123 456789 2048 18446744073709551615";
        assert_eq!(cpu_time(stat).expect("parses"), Duration::from_millis(2870));
        let no_name = cpu_time("4242 no name here");
        assert!(no_name.is_err(), "read without a name: {no_name:?}");
        let short = cpu_time("4242 (x) S 1 2");
        assert!(short.is_err(), "read from 2 fields: {short:?}");
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
        // The process alone first: CPU time only grows, so the later reading with the
        // children cannot be smaller (read the other way round, the test raced its own CPU).
        let alone = usage(std::process::id()).expect("own").cpu;
        let own = process_and_children_cpu(std::process::id()).expect("own /proc entry");
        assert!(
            own >= alone,
            "with its children {own:?}, less than alone earlier {alone:?}"
        );
    }

    #[test]
    fn listening_sockets_by_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                     0: 0100007F:4E3B 00000000:0000 0A 00000000:00000000 00:00000000 00000000   108        0 91234 1 0 100 0 0 10 0\n\
                     1: 0100007F:4E3B 0100007F:9C40 01 00000000:00000000 00:00000000 00000000   108        0 91299 1 0 20 4 30 10 -1\n\
                     2: 00000000:1538 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 555 1 0 100 0 0 10 0\n";
        // 0x4E3B = 20027: the listener, not the connection to it.
        assert_eq!(listening_inodes(table, 20027), [91234]);
        assert_eq!(listening_inodes(table, 5432), [555]);
        let none = listening_inodes(table, 5672);
        assert!(none.is_empty(), "a listener on 5672: {none:?}");

        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        assert_eq!(listening_pids(port).expect("scan"), [std::process::id()]);
    }

    #[test]
    fn peak_rss_from_vmhwm() {
        let status =
            "Name:\toutbox-relay\nVmPeak:\t  100000 kB\nVmHWM:\t   23456 kB\nVmRSS:\t 20000 kB\n";
        assert_eq!(peak_rss_kib(status).expect("parses"), 23456);
        let no_hwm = peak_rss_kib("Name:\tx\n");
        assert!(no_hwm.is_err(), "read without VmHWM: {no_hwm:?}");
    }

    #[test]
    fn this_process_can_be_read() {
        let usage = usage(std::process::id()).expect("own /proc entry");
        assert!(usage.peak_rss_kib > 0, "no peak RSS: {usage:?}");
    }
}
