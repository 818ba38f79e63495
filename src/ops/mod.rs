//! The operator's commands besides `setup`, `run` and `poll`: `status` (a probe of the slot and
//! the backlog), `teardown` (drop the slot and the publication) and `resync` (re-publish rows
//! from the table for what no slot will deliver). docs/recovery.md says when to use which.
//!
//! Each runs once and exits, and none may change what a running relay delivers behind its
//! back: `status` only reads, `teardown` refuses while a process streams from the slot, and
//! `resync` only publishes (it never marks, deletes or acknowledges anything).

pub mod resync;
pub mod status;
pub mod teardown;
