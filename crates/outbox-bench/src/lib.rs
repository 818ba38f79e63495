//! `outbox-bench`: drives the relay from outside, as an application and a consumer would.
//!
//! Three layers, one folder each:
//!
//! - [`scenarios`]: what is run. The `demo` subcommand ([`scenarios::demo`]) and the `bench`
//!   subcommand ([`scenarios::suite`], docs/benchmarks.md): the suite's scenarios (drain,
//!   latency, load, crash, limits, sweep, the drain of every setup, the cluster section), the
//!   A/B, `--compare` ([`scenarios::compare`]: its setups), `--shards-sweep`, `--emit`,
//!   `--cost-growth` and `--recovery-rounds`; the setups drained ([`scenarios::setups`]) and
//!   `--pin-broker` ([`scenarios::pinning`]).
//! - [`measurement`]: how a run is measured. Concurrent writers committing outbox rows
//!   ([`measurement::writers`]); the relay as a child process ([`measurement::relay`]: the
//!   test-kit's relay process, its CPU and memory from [`outbox_testkit::procfs`]); the consumer,
//!   shared with the tests ([`outbox_testkit::arrivals`]); what arrived against what was
//!   committed ([`measurement::delivery`]: missing, duplicates, commit order, rate, latency);
//!   the limits the relay is set against ([`measurement::limits`]: broker alone and decoding
//!   alone through the relay's own code; [`measurement::independent`]: broker alone with a
//!   minimal publisher and the walsender ceiling, which share no code with the relay); the CPU
//!   each process spends per message ([`measurement::cpu`]); and the figures
//!   ([`measurement::figures`], [`measurement::results`]: what a run's JSON holds).
//! - [`report`]: what is made of the figures. The Markdown report ([`report::summary`], with
//!   the sections of `--compare`, `--cost-growth`, `--recovery-rounds`, the setups' and the CPU
//!   tables) and the SVG charts ([`report::charts`], from the results or their JSON).
//!
//! A tool, not the daemon: errors are `anyhow`, with context saying what failed. It reaches
//! the relay through `outbox_relay`'s public API and runs its binary as a child process; the
//! relay must never depend on this crate, so the product's build and image leave it out.
//! The harness pieces it shares with the tests (private servers aside: scripts/bench.sh starts
//! those) come from `outbox-testkit`; what only the benchmark needs stays here.

pub mod measurement;
pub mod report;
pub mod scenarios;

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
