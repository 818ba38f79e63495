//! `outbox-bench`: drives the relay from outside, as an application and a consumer would.
//!
//! - [`writers`]: concurrent connections committing outbox rows; records every committed id.
//! - the consumer, shared with the tests: [`outbox_testkit::arrivals`] records each
//!   delivery's id, `x-outbox-seq` and receive time.
//! - [`report`]: compares the two: missing, duplicates, commit order, rate, latency.
//! - [`demo`]: the `demo` subcommand built from those three.
//! - [`suite`]: the `bench` subcommand (docs/benchmarks.md): the relay as a child
//!   process ([`relay`]: the test-kit's relay process, its CPU and memory from
//!   [`outbox_testkit::procfs`]), the limits it is set against ([`limits`]: broker alone
//!   and decoding alone through the relay's own code; [`independent`]: broker alone with a
//!   minimal publisher and the walsender ceiling, which share no code with the relay), the
//!   CPU each process spends per message ([`cpu`]), and the figures ([`results`]: JSON and
//!   Markdown).
//! - [`compare`]: `bench --compare`, setups of one relay binary drained in one run.
//! - [`cost_growth`]: `bench --cost-growth`, the CPU per message by shards, payload and broker.
//! - [`setups`]: the suite's drain of every setup, consumer attached and none.
//! - [`pinning`]: `bench --pin-broker`, RabbitMQ on a CPU of its own.
//! - [`recovery`]: `bench --recovery-rounds`, the time to stream again after a fault.
//! - [`charts`]: SVG charts of a run's figures, from the results or their JSON.
//!
//! A tool, not the daemon: errors are `anyhow`, with context saying what failed. It reaches
//! the relay through `outbox_relay`'s public API and runs its binary as a child process; the
//! relay must never depend on this crate, so the product's build and image leave it out.
//! The harness pieces it shares with the tests (private servers aside: scripts/bench.sh starts
//! those) come from `outbox-testkit`; what only the benchmark needs stays here.

pub mod charts;
pub mod compare;
pub mod cost_growth;
pub mod cpu;
pub mod cpu_table;
pub mod demo;
pub mod figures;
pub mod independent;
pub mod limits;
pub mod pinning;
pub mod recovery;
pub mod relay;
pub mod report;
pub mod results;
pub mod setup_table;
pub mod setups;
pub mod suite;
pub mod summary;
pub mod writers;

/// The PostgreSQL and RabbitMQ both subcommands drive (`bench` needs a PostgreSQL superuser:
/// it creates and drops tables, slots and triggers).
#[derive(Debug, Clone, clap::Args)]
pub struct Servers {
    /// PostgreSQL URL of the database holding the outbox table (`bench`: a superuser).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    /// RabbitMQ URL of the broker the relay publishes to.
    #[arg(long, env = "AMQP_URL", hide_env_values = true)]
    pub amqp_url: String,
}
