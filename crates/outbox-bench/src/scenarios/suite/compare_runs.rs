//! The runs of `--compare` (the setups are [`crate::scenarios::compare`], the figures
//! [`crate::measurement::results::compare`]); how a
//! drain counts what arrived is [`super::counting`].

use anyhow::{anyhow, Result};

use super::{panic_text, relay_setup, rotated, Bench, DrainSpec};
use crate::measurement::results::compare::{
    CompareBroker, CompareLatency, CompareResults, CompareRun,
};
use crate::measurement::results::{load_average, Results};
use crate::scenarios::compare::{check_distinct, CompareSetup};
use crate::scenarios::setups::DrainSetup;
use outbox_relay::internals::connect;
use outbox_testkit::PgServer;

impl Bench {
    /// `--compare`: per round, the broker alone at --max-in-flight, then a drain of --rows
    /// single-row transactions with each setup (the order rotated from round to round, so
    /// drift of the machine does not favour one), every drain with PostgreSQL's CPU; then,
    /// with --compare-latency, each setup's latency at the fixed rate.
    pub(super) async fn compare(&mut self, results: &mut Results) -> Result<()> {
        check_distinct(&self.args.compare).map_err(|e| anyhow!(e))?;
        let layout = self
            .args
            .compare
            .iter()
            .find(|s| matches!(s, CompareSetup::Layout(_)));
        if let (true, Some(layout)) = (self.args.compare_latency, layout) {
            anyhow::bail!(
                "--compare-latency does not measure `{layout}`: its writer inserts under the \
                 contract's column names and no aggregate; leave the flag or the setup out"
            );
        }
        let servers = Servers::start(&self.args.compare_pg).await?;
        // Every setup on every server (or on DATABASE_URL's alone), named for both.
        let setups: Vec<(CompareSetup, Option<usize>)> = self
            .args
            .compare
            .iter()
            .flat_map(|&setup| servers.indexes().map(move |server| (setup, server)))
            .collect();
        let name = |(setup, server): (CompareSetup, Option<usize>)| match server {
            Some(i) => format!("{setup}@pg{}", servers.majors[i]),
            None => setup.to_string(),
        };
        let window = self.scale.max_in_flight;
        let rows = self.scale.drain_rows;
        let consumer = !self.args.no_consumer;
        let mut c = CompareResults {
            setups: setups.iter().copied().map(name).collect(),
            rows,
            window,
            consumer,
            rounds: self.args.ab_rounds,
            ..CompareResults::default()
        };
        for round in 1..=self.args.ab_rounds {
            self.say(&format!(
                "compare round {round}: broker alone (minimal publisher), window {window}, {rows} messages, load {}",
                load_average()
            ));
            // The independent limit, with a consumer exactly when the drains have one.
            let run = self.bare_broker(window, rows, consumer).await?;
            c.broker.push(CompareBroker {
                round,
                messages: run.messages,
                received_per_sec: run.received_per_sec,
                confirmed_per_sec: run.confirmed_per_sec,
            });
            for (setup, server) in rotated(&setups, round) {
                let load = load_average();
                let label = name((setup, server));
                self.say(&format!("compare round {round}: {label}"));
                let spec = DrainSpec::of(DrainSetup::Relay(setup), window, rows, true, consumer);
                let drain = self
                    .on_server(&servers, server, async |b: &mut Bench| {
                        b.drain_spec(spec).await
                    })
                    .await?;
                c.runs.push(CompareRun {
                    round,
                    setup: label,
                    load,
                    drain,
                });
            }
        }
        if self.args.compare_latency {
            for &(setup, server) in &setups {
                let relay = relay_setup(setup, window);
                let run = self
                    .on_server(&servers, server, async |b: &mut Bench| {
                        b.latency(relay).await
                    })
                    .await?;
                c.latency.push(CompareLatency {
                    setup: name((setup, server)),
                    run,
                });
            }
        }
        c.summary = c.summarize();
        results.compare = Some(c);
        Ok(())
    }

    /// Runs `run` with the benchmark pointed at server `server` of `servers` (its admin
    /// session, the writers' and the relay's URL), then points it back; `None`: as it is.
    async fn on_server<T>(
        &mut self,
        servers: &Servers,
        server: Option<usize>,
        run: impl AsyncFnOnce(&mut Bench) -> Result<T>,
    ) -> Result<T> {
        let Some(i) = server else {
            return run(self).await;
        };
        let url = servers.pg[i].url("postgres");
        let admin = connect(&url).await?;
        let admin = std::mem::replace(&mut self.admin, admin);
        let url = std::mem::replace(&mut self.args.servers.database_url, url);
        self.relay.database_url = self.args.servers.database_url.clone();
        let result = run(self).await;
        self.admin = admin;
        self.args.servers.database_url = url;
        self.relay.database_url = self.args.servers.database_url.clone();
        result
    }
}

/// `--compare-pg`: private PostgreSQL servers of the given major versions, stopped on drop.
struct Servers {
    majors: Vec<u32>,
    pg: Vec<PgServer>,
}

impl Servers {
    /// Starts one server per major version, with the connections of scripts/bench.sh's.
    async fn start(majors: &[u32]) -> Result<Servers> {
        let mut pg = Vec::new();
        for &major in majors {
            // Blocking process calls; a missing version panics naming its install command.
            let started = tokio::task::spawn_blocking(move || {
                PgServer::start_major(major, &[("max_connections", "300")])
            })
            .await
            .map_err(|e| anyhow!("PostgreSQL {major} did not start: {}", panic_text(e)))?;
            pg.push(started);
        }
        Ok(Servers {
            majors: majors.to_vec(),
            pg,
        })
    }

    /// Each server's index, or the one `None` (DATABASE_URL's server) when there are none.
    fn indexes(&self) -> Box<dyn Iterator<Item = Option<usize>>> {
        if self.pg.is_empty() {
            Box::new(std::iter::once(None))
        } else {
            Box::new((0..self.pg.len()).map(Some))
        }
    }
}
