//! The exit codes of every command, so that a script or a probe can tell a typo from a
//! configuration to fix, an unhealthy relay and a stop (docs/operations.md, "Exit codes").

use crate::error::{ErrorKind, MapProblem, RelayError};

/// The relay stopped on an error it cannot retry past (a row it may not skip, a lost slot
/// under `--on-slot-lost stop`, a bug), or a command failed while it ran.
pub const STOPPED: u8 = 1;
/// The command line is wrong: an unknown flag, a missing value (clap's own code).
pub const USAGE: u8 = 2;
/// The configuration or the provisioning is wrong (a flag's value, a URL, a secret, TLS
/// files, `wal_level`, a missing publication): fix it and start again.
pub const CONFIG: u8 = 3;
/// `status` found the relay unhealthy: its slot is missing or lost, or (`--mode poll`) the
/// table cannot be read.
pub const UNHEALTHY: u8 = 4;
/// `check` found something to look at but nothing that stops the relay (WAL retention
/// unbounded, a slow standby takeover): the relay runs, the fix is advised. `check` exits
/// [`CONFIG`] when it found an error, since what it found is a configuration to fix.
pub const WARNINGS: u8 = 5;

/// The code a command that failed with `error` exits with. A table whose columns do not
/// fit the column map is the configuration's problem, though the relay learns it from a
/// Relation or a row.
pub fn of(error: &RelayError) -> u8 {
    if let RelayError::Unpublishable {
        fault:
            MapProblem::MissingColumn { .. }
            | MapProblem::MissingHeaderColumn { .. }
            | MapProblem::CreatedAtType,
        ..
    } = error
    {
        return CONFIG;
    }
    match error.kind() {
        ErrorKind::Config | ErrorKind::Provisioning | ErrorKind::TlsConfig => CONFIG,
        _ => STOPPED,
    }
}
