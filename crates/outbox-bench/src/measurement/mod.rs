//! How a run is measured: the writers, the relay process, the consumer's view of what arrived,
//! the limits the relay is set against, the CPU per message, and the figures a run records
//! ([`results`]: what `bench --out` writes as JSON and [`crate::report`] renders).

pub mod cpu;
pub mod delivery;
pub mod figures;
pub mod independent;
pub mod limits;
pub mod relay;
pub mod results;
pub mod writers;
