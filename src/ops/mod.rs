//! The operator's commands besides `setup`, `run` and `poll`: `status` (a probe of the slot and
//! the backlog), `teardown` (drop the slot and the publication), `resync` (re-publish rows
//! from the table for what no slot will deliver) and `check` (a configuration, and the servers
//! as it needs them, before `setup` or `run`). docs/recovery.md says when to use which.
//!
//! Each runs once and exits, and none may change what a running relay delivers behind its
//! back: `status` and `check` only read, `teardown` refuses while a process streams from the
//! slot, and `resync` only publishes (it never marks, deletes or acknowledges anything).

pub(crate) mod check;
pub(crate) mod resync;
pub(crate) mod status;
pub(crate) mod teardown;
