//! What is made of a run's figures: the Markdown report ([`summary`], with the sections of
//! `--compare`, `--cost-growth` and `--recovery-rounds`, the setups' and the CPU tables) and
//! the SVG charts ([`charts`]). Everything here reads [`crate::measurement::results`] only, so a
//! committed results file renders again without running anything.

pub mod charts;
pub mod compare;
pub mod cost_growth;
pub mod cpu_table;
pub mod recovery;
pub mod setup_table;
pub mod summary;
