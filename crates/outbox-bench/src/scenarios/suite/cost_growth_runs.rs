//! The runs of `--cost-growth` (the figures and their Markdown are [`crate::measurement::results::cost_growth`]).

use anyhow::{bail, Result};
use tokio::time::Instant;

use super::{cpu_split_line, quorum_leader_of_new_queue, rotated, Bench, DrainSpec, LEADER};
use crate::measurement::limits::synthetic_order_padded;
use crate::measurement::results::cost_growth::{
    setup_name, CostBroker, CostCluster, CostGrowth, CostPart, CostRun, Figures,
};
use crate::measurement::results::{load_average, Results};
use crate::measurement::writers::ORDER_NOTE_LEN;
use crate::scenarios::setups::DrainSetup;
use outbox_testkit::RabbitCluster;

impl Bench {
    /// `--cost-growth`: per round on the single node the broker alone, the drains with each
    /// shard count, the broker alone at each payload size and one relay's drain of each; then
    /// the cluster, started once, with each shard count per round. Every drain with
    /// PostgreSQL's CPU and the backlog's payload size read back.
    pub(super) async fn cost_growth(&mut self, results: &mut Results) -> Result<()> {
        check_counts("--cost-growth-shards", &self.args.cost_growth_shards)?;
        check_counts("--cost-growth-payloads", &self.args.cost_growth_payloads)?;
        let started = Instant::now();
        let mut c = CostGrowth {
            rows: self.scale.drain_rows,
            window: self.scale.max_in_flight,
            rounds: self.args.ab_rounds,
            shard_counts: self.args.cost_growth_shards.clone(),
            payloads: self.args.cost_growth_payloads.clone(),
            ..CostGrowth::default()
        };
        for round in 1..=c.rounds {
            self.cost_broker(&mut c, CostPart::Shards, round, None)
                .await?;
            for shards in rotated(&c.shard_counts, round) {
                self.cost_drain(&mut c, CostPart::Shards, round, shards, None)
                    .await?;
            }
            for payload in rotated(&c.payloads, round) {
                self.cost_broker(&mut c, CostPart::Payload, round, Some(payload))
                    .await?;
            }
            for payload in rotated(&c.payloads, round) {
                self.cost_drain(&mut c, CostPart::Payload, round, 1, Some(payload))
                    .await?;
            }
        }
        if self.args.no_cluster {
            c.cluster_skipped = Some("--no-cluster".into());
        } else {
            let ((), startup_secs) = self
                .on_cluster(async |b: &mut Bench, cluster: &'static RabbitCluster| {
                    b.cost_growth_cluster(&mut c, cluster).await
                })
                .await?;
            if let Some(cluster) = c.cluster.as_mut() {
                cluster.startup_secs = startup_secs;
            }
        }
        c.seconds = started.elapsed().as_secs_f64();
        c.summary = c.summarize();
        self.say(&format!("cost growth: took {:.0} s", c.seconds));
        results.cost_growth = Some(c);
        Ok(())
    }

    /// The cluster part: each shard count per round, the relays given only the queue
    /// leader's URL. A publish through a follower is forwarded to the leader, and a relay
    /// given every URL picks a node at random, so the figures would measure the placement (see
    /// the cluster section's consumer-less drain), and differently for each relay of a
    /// sharded drain.
    async fn cost_growth_cluster(
        &mut self,
        c: &mut CostGrowth,
        cluster: &'static RabbitCluster,
    ) -> Result<()> {
        let leader_node = quorum_leader_of_new_queue(cluster, LEADER).await?;
        self.say(&format!(
            "cost growth: the cluster's queues are led by node {leader_node}; relays given only \
             its URL, consumer on it"
        ));
        self.relay.amqp_url = cluster.url(leader_node);
        // The broker alone publishes through the leader too: the same hops as the relays.
        self.endpoints.publish = cluster.url(leader_node);
        c.cluster = Some(CostCluster {
            nodes: cluster.len(),
            leader_node,
            startup_secs: 0.0,
        });
        for round in 1..=c.rounds {
            self.cost_broker(c, CostPart::Cluster, round, None).await?;
            for shards in rotated(&c.shard_counts, round) {
                self.cost_drain(c, CostPart::Cluster, round, shards, None)
                    .await?;
            }
        }
        Ok(())
    }

    /// The broker alone at the relays' window, with bodies of about `payload` bytes (None: the
    /// default order, ~240 bytes), on the broker of `part`.
    async fn cost_broker(
        &mut self,
        c: &mut CostGrowth,
        part: CostPart,
        round: u32,
        payload: Option<u32>,
    ) -> Result<()> {
        // The broker alone's body is the synthetic order: pad it as the seed pads its rows.
        let middle = c.rows / 2;
        let note_len = match payload {
            None => ORDER_NOTE_LEN,
            Some(bytes) => bytes.saturating_sub(body_len(middle, 0)),
        };
        let body_bytes = body_len(middle, note_len);
        let load = load_average();
        self.say(&format!(
            "cost round {round}: broker alone, window {}, {} messages of {body_bytes} B, load \
             {load}",
            c.window, c.rows
        ));
        let run = self
            .broker_alone_padded(c.window, c.rows, None, note_len)
            .await?;
        self.say(&format!(
            "  {:.0} msgs/s received, {:.0} confirmed",
            run.received_per_sec, run.confirmed_per_sec
        ));
        self.say(&cpu_split_line(&run.cpu));
        c.brokers.push(CostBroker {
            part,
            round,
            payload_bytes: payload,
            body_bytes: u64::from(body_bytes),
            load,
            messages: run.messages,
            received_per_sec: run.received_per_sec,
            confirmed_per_sec: run.confirmed_per_sec,
            cpu: run.cpu,
        });
        Ok(())
    }

    /// One drain of `shards` sharded relays (1: one unsharded relay) into one queue with a
    /// consumer, of rows of 500 aggregates with payloads of about `payload` bytes.
    async fn cost_drain(
        &mut self,
        c: &mut CostGrowth,
        part: CostPart,
        round: u32,
        shards: u32,
        payload: Option<u32>,
    ) -> Result<()> {
        let load = load_average();
        self.say(&format!(
            "cost round {round}: {part:?}, {}",
            setup_name(part, shards, payload)
        ));
        let spec = DrainSpec {
            payload_bytes: payload,
            measure_payload: true,
            ..DrainSpec::of(DrainSetup::Shards(shards), c.window, c.rows, true, true)
        };
        let drain = self.drain_spec(spec).await?;
        let relay_per_rabbitmq = Figures::of(&drain)
            .relay_per_rabbitmq()
            .map_or("—".to_string(), |r| format!("{r:.2}"));
        self.say(&format!(
            "  payload {} B on average; relay ÷ RabbitMQ CPU {relay_per_rabbitmq}",
            drain
                .payload_bytes
                .map_or("—".to_string(), |b| format!("{b:.0}"))
        ));
        c.runs.push(CostRun {
            part,
            round,
            shards,
            payload_bytes: payload,
            load,
            drain,
        });
        Ok(())
    }
}

/// The synthetic order's body length with `note_len` bytes of padding (row `n`).
fn body_len(n: u64, note_len: u32) -> u32 {
    u32::try_from(synthetic_order_padded(n, note_len).1.len()).unwrap_or(u32::MAX)
}

/// An error unless `values` are all above zero and distinct (a value listed twice would pool
/// its runs into one median).
fn check_counts(flag: &str, values: &[u32]) -> Result<()> {
    if values.is_empty() {
        bail!("{flag} needs at least one value");
    }
    for (i, v) in values.iter().enumerate() {
        if *v == 0 {
            bail!("{flag}: 0 is not a count or size");
        }
        if values[..i].contains(v) {
            bail!("{flag} lists {v} twice");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_must_be_positive_and_distinct() {
        assert!(check_counts("--x", &[1, 2, 4]).is_ok());
        let error = |values: &[u32]| format!("{:#}", check_counts("--x", values).unwrap_err());
        assert_eq!(error(&[]), "--x needs at least one value");
        assert_eq!(error(&[1, 0]), "--x: 0 is not a count or size");
        assert_eq!(error(&[1, 2, 1]), "--x lists 1 twice");
    }

    use super::super::parse_args as parse;

    #[test]
    fn the_mode_defaults_to_1_2_4_shards_and_1_and_16_kib_and_runs_alone() {
        let args = parse(&["--cost-growth"]).expect("parses");
        assert!(args.cost_growth);
        assert_eq!(args.cost_growth_shards, [1, 2, 4]);
        assert_eq!(args.cost_growth_payloads, [1024, 16384]);
        let args = parse(&[
            "--cost-growth",
            "--cost-growth-shards",
            "1,8",
            "--no-cluster",
        ])
        .expect("parses");
        assert_eq!(args.cost_growth_shards, [1, 8]);
        assert!(args.no_cluster);
        for other in [
            &["--shards-sweep", "1,2"][..],
            &["--emit"],
            &["--compare", "wal"],
            &["--cluster-only"],
            &["--ab-with", "/bin/true"],
        ] {
            let mut flags = vec!["--cost-growth"];
            flags.extend(other);
            assert!(parse(&flags).is_err(), "{other:?}");
        }
    }

    #[test]
    fn the_broker_body_is_padded_to_the_payload_size() {
        let empty = body_len(5_000, 0);
        assert_eq!(body_len(5_000, 1024 - empty), 1024);
        assert!(body_len(5_000, ORDER_NOTE_LEN) < 300);
    }
}
