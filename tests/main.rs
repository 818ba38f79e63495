//! The relay's integration tests: one test binary, a module per file (`autotests = false` in
//! Cargo.toml). One binary links the relay's library and the test kit once, and its tests
//! share one PostgreSQL and one RabbitMQ (the kit's `services()`): one link, one server pair.
//!
//! A module's tests run with a filter on its path:
//!
//! ```text
//! cargo test --test main wal::                      # the tests of tests/wal.rs
//! cargo test --test main -- --ignored partitions::  # the network partitions
//! ```
//!
//! Every file of tests/ is a module here; `layout::every_test_file_is_a_module_of_main`
//! checks it, so a new file cannot drop out of the suite unseen.

mod big_transaction;
mod check;
mod cluster;
mod credit_flow;
mod dead_letter;
mod docs;
mod emit;
mod failover;
mod failover_recovery;
mod faults;
mod harness_smoke;
mod layout;
mod manual_commands;
mod migration_tables;
mod negative_controls;
mod operations;
mod packaging;
mod partitions;
mod poll;
mod shards;
mod streams;
mod table_layouts;
mod tls;
mod wal;
mod zero_window;
