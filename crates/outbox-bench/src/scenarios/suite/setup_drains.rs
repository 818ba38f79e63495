//! The suite's drain of every setup (the setups and figures are [`crate::scenarios::setups`]):
//! the drains of `--compare`, `--shards-sweep` and `--emit`, one round each, with a consumer
//! and without, so one full run draws chart 1 whole.

use anyhow::Result;
use tokio::time::Instant;

use super::{Bench, DrainSpec, Seed, Setup};
use crate::measurement::results::{load_average, Drain, Results};
use crate::scenarios::setups::{SetupDrains, SetupRun, FULL_RUN};

impl Bench {
    /// Each setup of [`FULL_RUN`] drains the scale's backlog with a consumer, then with none;
    /// a consumer-attached drain scenario 1 already ran (the WAL reader, 1 and 5 polling
    /// workers) is reused, not run again. No PostgreSQL CPU, as in the rest of the suite: it
    /// would need the server on this machine.
    pub(super) async fn setup_drains(&mut self, results: &mut Results) -> Result<()> {
        let window = self.scale.max_in_flight;
        let rows = self.scale.drain_rows;
        let started = Instant::now();
        let mut section = SetupDrains {
            rows,
            window,
            ..SetupDrains::default()
        };
        for setup in FULL_RUN {
            for consumer in [true, false] {
                let spec = DrainSpec::of(setup, window, rows, false, consumer);
                let counted = if consumer {
                    "consumer attached"
                } else {
                    "no consumer"
                };
                if let Some(drain) = scenario_one_drain(results, &spec, window) {
                    self.say(&format!(
                        "setups: {setup}, {counted}: scenario 1's drain, {:.0} msgs/s",
                        drain.msgs_per_sec
                    ));
                    section.runs.push(SetupRun {
                        setup: setup.to_string(),
                        consumer,
                        reused: true,
                        load: String::new(),
                        drain,
                    });
                    continue;
                }
                let load = load_average();
                self.say(&format!("setups: {setup}, {counted}"));
                let drain = self.drain_spec(spec).await?;
                section.runs.push(SetupRun {
                    setup: setup.to_string(),
                    consumer,
                    reused: false,
                    load,
                    drain,
                });
            }
        }
        section.seconds = started.elapsed().as_secs_f64();
        self.say(&format!("setups: section took {:.0} s", section.seconds));
        results.setups = Some(section);
        Ok(())
    }
}

/// Scenario 1's drain of `spec`, if the suite ran exactly it: a consumer, one relay, this
/// backlog of single-row transactions of rows, the same relay setup.
fn scenario_one_drain(results: &Results, spec: &DrainSpec, window: u32) -> Option<Drain> {
    let same_kind =
        spec.consumer && spec.seed == Seed::Rows && spec.shards == 1 && spec.transaction_rows == 1;
    if !same_kind {
        return None;
    }
    results
        .modes
        .iter()
        .enumerate()
        .find(|(index, _)| Setup::of_mode(*index, window) == spec.setup)
        .and_then(|(_, mode)| mode.drain.clone())
        .filter(|drain| drain.rows == spec.rows && drain.transaction_rows == 1)
}
