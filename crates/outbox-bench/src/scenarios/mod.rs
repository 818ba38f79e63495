//! What is run: the `demo` subcommand, and the `bench` suite with its other kinds of run
//! (A/B, `--compare`, `--shards-sweep`, `--emit`, `--cost-growth`, `--recovery-rounds`). The
//! runs measure with [`crate::measurement`]; [`crate::report`] renders what they found.

pub mod compare;
pub mod demo;
pub mod pinning;
pub mod setups;
pub mod suite;
