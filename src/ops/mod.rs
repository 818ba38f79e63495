//! The operator's commands besides `setup`, `run` and `poll`: `status` (a probe of the slot and
//! the backlog), `teardown` (drop the slot and the publication) and `resync` (re-publish rows
//! from the table for what no slot will deliver). docs/operations.md says when to use which.

pub mod resync;
pub mod status;
pub mod teardown;
