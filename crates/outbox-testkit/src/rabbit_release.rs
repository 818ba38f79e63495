//! Which RabbitMQ the kit's nodes run, and how a command reaches it.
//!
//! [`RABBITMQ_ENV`] (`OUTBOX_TEST_RABBITMQ`) chooses the series of every node a test process
//! starts, single nodes, the cluster and the partition lab's alike: `4.0` (the default: the
//! series users run), `4.3` (Debian testing's, a moving target) or `3.10` (Debian 12's own).
//!
//! - **3.10** runs from Debian's `/usr/sbin/rabbitmq-*` wrappers, which switch to the
//!   `rabbitmq` user and use its cookie and the system's epmd on 4369.
//! - **4.x** needs a newer glibc than Debian 12's. `scripts/install-rabbitmq.sh` makes a
//!   Debian root of that series with debootstrap (listed in `rabbitmq-versions`, this crate's
//!   root); a node runs in it with `chroot`, as root (the root's `rabbitmq` user has a uid that
//!   names another user outside), with the root's own cookie (`/root/.erlang.cookie`) and an
//!   epmd of the series' own port, so that it never meets a 3.10 node. Each command runs in
//!   a mount namespace of its own (`unshare --mount`) that binds into the root what the node
//!   needs of the machine: `/proc`, the hosts file (a test host's, on a test host: `ip netns
//!   exec` bound it over `/etc/hosts` first) and the temp dir, at the same path, where the
//!   kit keeps the nodes' directories. Nothing is mounted outside that namespace, so nothing
//!   is left behind in the cached root.
//!
//! Either way the node's processes are this machine's: the kit finds, signals and kills them
//! by pid.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::netns::Host;

/// Environment variable choosing the RabbitMQ series of this process's nodes.
pub const RABBITMQ_ENV: &str = "OUTBOX_TEST_RABBITMQ";
/// The series users run, the tests' default.
pub const DEFAULT_SERIES: &str = "4.0";
/// Debian 12's own RabbitMQ.
pub const HOST_SERIES: &str = "3.10";
/// Environment variable choosing the metadata store of 4.0's nodes: `khepri` turns on the
/// `khepri_db` feature flag once a node or cluster is up; `mnesia` (or unset) leaves the
/// series' default (4.0: Mnesia; 4.3: Khepri, which cannot be turned off).
pub const METADATA_ENV: &str = "OUTBOX_TEST_RABBITMQ_METADATA";
/// Environment variable naming the cache of the installed roots (default [`RABBITMQ_CACHE`]).
pub const RABBITMQ_CACHE_ENV: &str = "OUTBOX_TEST_RABBITMQ_CACHE";
/// The default cache, beside the PostgreSQL binaries.
pub const RABBITMQ_CACHE: &str = "/var/cache/outbox-relay/rabbitmq";

/// `SERIES SUITE SCRIPT EPMD_PORT` lines: the Debian roots of the 4.x series.
const LISTED: &str = include_str!("../rabbitmq-versions");

/// A RabbitMQ program the kit runs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Program {
    Server,
    Ctl,
}

impl Program {
    fn name(self) -> &'static str {
        match self {
            Program::Server => "rabbitmq-server",
            Program::Ctl => "rabbitmqctl",
        }
    }
}

/// The RabbitMQ series this process's nodes run, and where it is installed.
#[derive(Debug)]
pub struct Release {
    series: String,
    /// A 4.x series' root and its epmd port; `None` for Debian 12's own 3.10.
    root: Option<(PathBuf, u16)>,
    /// The kit turns Khepri on once a node or cluster is up ([`METADATA_ENV`]).
    enable_khepri: bool,
}

/// The metadata store the nodes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metadata {
    Mnesia,
    Khepri,
}

/// The series a test process can choose: 3.10, then the listed ones.
pub fn supported_series() -> Vec<&'static str> {
    std::iter::once(HOST_SERIES)
        .chain(listed().into_iter().map(|(series, _)| series))
        .collect()
}

/// The listed series with their epmd ports.
fn listed() -> Vec<(&'static str, u16)> {
    LISTED
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                [series, _suite, _script, port] => match port.parse() {
                    Ok(port) => (*series, port),
                    Err(_) => panic!("rabbitmq-versions: not an epmd port: {line:?}"),
                },
                _ => panic!("rabbitmq-versions: not `SERIES SUITE SCRIPT EPMD_PORT`: {line:?}"),
            }
        })
        .collect()
}

/// This process's release: [`RABBITMQ_ENV`], else [`DEFAULT_SERIES`]. Panics on a series the
/// tests do not run on, or one that is not installed (naming the command that installs it).
pub fn release() -> &'static Release {
    static RELEASE: OnceLock<Release> = OnceLock::new();
    RELEASE.get_or_init(|| {
        let series = std::env::var(RABBITMQ_ENV)
            .ok()
            .map(|value| value.trim().to_string())
            .filter(|value| !value.is_empty())
            .unwrap_or_else(|| DEFAULT_SERIES.to_string());
        let mut release = Release::of(&series);
        match std::env::var(METADATA_ENV).as_deref().map(str::trim) {
            Err(_) | Ok("") => {}
            Ok("mnesia") => assert!(
                release.metadata() == Metadata::Mnesia,
                "{METADATA_ENV}=mnesia: RabbitMQ {series} runs Khepri, which cannot be turned off"
            ),
            Ok("khepri") => {
                assert!(
                    release.major() >= 4,
                    "{METADATA_ENV}=khepri: RabbitMQ {series} has no Khepri (4.0 and later do)"
                );
                release.enable_khepri = release.metadata() == Metadata::Mnesia;
            }
            Ok(other) => panic!("{METADATA_ENV}={other:?}: mnesia or khepri"),
        }
        release
    })
}

impl Release {
    /// `series` as installed on this machine; panics if it is not.
    pub fn of(series: &str) -> Release {
        if series == HOST_SERIES {
            assert!(
                Path::new("/usr/sbin/rabbitmq-server").is_file(),
                "RabbitMQ 3.10 is not installed: install it with `apt-get install rabbitmq-server`"
            );
            return Release {
                series: series.to_string(),
                root: None,
                enable_khepri: false,
            };
        }
        let Some((_, epmd_port)) = listed().into_iter().find(|(s, _)| *s == series) else {
            panic!(
                "{RABBITMQ_ENV}={series:?} is not a RabbitMQ series the tests run on: one of {:?}",
                supported_series()
            );
        };
        let cache =
            std::env::var(RABBITMQ_CACHE_ENV).unwrap_or_else(|_| RABBITMQ_CACHE.to_string());
        let root = Path::new(&cache).join(series).join("root");
        let env = if cache == RABBITMQ_CACHE {
            String::new()
        } else {
            format!("{RABBITMQ_CACHE_ENV}={cache} ")
        };
        assert!(
            root.join(".installed").is_file(),
            "RabbitMQ {series} is not installed ({} is not a finished root): install it with \
             `{env}scripts/install-rabbitmq.sh {series}`",
            root.display()
        );
        Release {
            series: series.to_string(),
            root: Some((root, epmd_port)),
            enable_khepri: false,
        }
    }

    /// The metadata store its nodes run once the kit has set them up.
    pub fn metadata(&self) -> Metadata {
        let minor: u32 = self
            .series
            .split('.')
            .nth(1)
            .and_then(|minor| minor.parse().ok())
            .unwrap_or(0);
        // 4.2 made Khepri the default of a new cluster.
        if self.enable_khepri || (self.major(), minor) >= (4, 2) {
            Metadata::Khepri
        } else {
            Metadata::Mnesia
        }
    }

    /// Whether the kit turns Khepri on once a node or cluster is up.
    pub(crate) fn enables_khepri(&self) -> bool {
        self.enable_khepri
    }

    /// `3.10`, `4.0`, `4.3`.
    pub fn series(&self) -> &str {
        &self.series
    }

    /// The series' major version (3 or 4).
    pub fn major(&self) -> u32 {
        self.series
            .split('.')
            .next()
            .and_then(|major| major.parse().ok())
            .unwrap_or(0)
    }

    /// The exact package version for a 4.x root (`4.0.5-6+deb13u2`), as installed.
    pub fn installed_version(&self) -> Option<String> {
        let (root, _) = self.root.as_ref()?;
        std::fs::read_to_string(root.join(".installed"))
            .ok()
            .map(|v| v.trim().to_string())
    }

    /// `rabbitmq.conf` lines every node of this release gets: on 4.x global QoS, deprecated
    /// and still usable by a client, is refused, so that a test fails where the relay, the
    /// inbox or the kit leans on it (3.10 predates the mechanism). Transient non-exclusive
    /// queues are not refused on 4.0: 4.0.5 counts durable queues as such, so a node that has
    /// any fails to restart with them denied (`failed_to_deny_deprecated_features`; seen after
    /// every kill -9 and restart, and on every join in the partition lab). 4.3 refuses them
    /// by default.
    pub(crate) fn conf_lines(&self) -> &'static [&'static str] {
        if self.major() >= 4 {
            &["deprecated_features.permit.global_qos = false"]
        } else {
            &[]
        }
    }

    /// A command running `program` of this release, on the test `host` if given (else in
    /// the root namespace). Environment set on it reaches the program.
    pub(crate) fn command(&self, program: Program, host: Option<&Host>) -> Command {
        let Some((root, epmd_port)) = &self.root else {
            let path = format!("/usr/sbin/{}", program.name());
            return match host {
                Some(host) => host.command(path),
                None => Command::new(path),
            };
        };
        let mut command = match host {
            Some(host) => host.command("unshare"),
            None => Command::new("unshare"),
        };
        let temp = std::env::temp_dir();
        // $0 is the root, $1 the temp dir; the rest is the program and its arguments.
        command
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(
                "set -e; root=$0; temp=$1; shift; \
                 mount -t proc proc \"$root/proc\"; \
                 mount --bind /etc/hosts \"$root/etc/hosts\"; \
                 mkdir -p \"$root$temp\"; mount --bind \"$temp\" \"$root$temp\"; \
                 exec chroot \"$root\" \"$@\"",
            )
            .arg(root)
            .arg(&temp)
            .arg("/usr/bin/env")
            .arg("HOME=/root")
            .arg(format!("ERL_EPMD_PORT={epmd_port}"))
            .arg(Path::new("/usr/lib/rabbitmq/bin").join(program.name()));
        command
    }

    /// The program's name as a command line shows it, for messages.
    pub(crate) fn describe(&self, program: Program) -> String {
        match &self.root {
            None => format!("/usr/sbin/{}", program.name()),
            Some((root, _)) => format!(
                "{} (RabbitMQ {} in {})",
                program.name(),
                self.series,
                root.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    fn args_of(command: &Command) -> Vec<&OsStr> {
        command.get_args().collect()
    }

    #[test]
    fn the_listed_series_parse_with_their_epmd_ports() {
        let listed = listed();
        assert!(
            listed.iter().any(|(series, _)| *series == DEFAULT_SERIES),
            "{DEFAULT_SERIES} not listed: {listed:?}"
        );
        let mut ports: Vec<u16> = listed.iter().map(|(_, port)| *port).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), listed.len(), "each series has its own epmd");
        assert!(!ports.contains(&4369), "4369 is 3.10's epmd");
    }

    #[test]
    fn a_root_command_chroots_with_the_series_epmd_and_keeps_the_program_last() {
        let release = Release {
            series: "4.0".into(),
            root: Some((PathBuf::from("/cache/4.0/root"), 4370)),
            enable_khepri: false,
        };
        let command = release.command(Program::Ctl, None);
        assert_eq!(command.get_program(), "unshare");
        let args = args_of(&command);
        assert_eq!(args[7], OsStr::new("/cache/4.0/root"));
        assert_eq!(
            &args[9..],
            [
                OsStr::new("/usr/bin/env"),
                OsStr::new("HOME=/root"),
                OsStr::new("ERL_EPMD_PORT=4370"),
                OsStr::new("/usr/lib/rabbitmq/bin/rabbitmqctl"),
            ]
        );
    }
}
