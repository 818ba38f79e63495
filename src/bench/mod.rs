//! `outbox-bench`: drives the relay from outside, as an application and a consumer would.
//!
//! - [`writers`]: concurrent connections committing outbox rows; records every committed id.
//! - [`consumer`]: a queue consumer that records each delivery's id, `x-outbox-seq` and
//!   receive time.
//! - [`report`]: compares the two: missing, duplicates, commit order, rate, latency.
//! - [`demo`]: the `demo` subcommand built from those three.
//!
//! A tool, not the daemon: errors are `anyhow`, with context saying what failed.

pub mod consumer;
pub mod demo;
pub mod report;
pub mod writers;
