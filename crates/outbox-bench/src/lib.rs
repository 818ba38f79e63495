//! `outbox-bench`: drives the relay from outside, as an application and a consumer would.
//!
//! - [`writers`]: concurrent connections committing outbox rows; records every committed id.
//! - [`consumer`]: a queue consumer that records each delivery's id, `x-outbox-seq` and
//!   receive time.
//! - [`report`]: compares the two: missing, duplicates, commit order, rate, latency.
//! - [`demo`]: the `demo` subcommand built from those three.
//! - [`suite`]: the `bench` subcommand (issue 6, docs/benchmarks.md): the relay as a child
//!   process ([`relay`], its CPU and memory from [`procfs`]), the limits it is set against
//!   ([`limits`]: broker alone, decoding alone), and the figures ([`results`]: JSON and
//!   Markdown).
//!
//! A tool, not the daemon: errors are `anyhow`, with context saying what failed. It reaches
//! the relay through `outbox_relay`'s public API and runs its binary as a child process; the
//! relay must never depend on this crate, so the product's build and image leave it out.

pub mod demo;
pub mod limits;
pub mod relay;
pub mod report;
pub mod results;
pub mod suite;
pub mod writers;
