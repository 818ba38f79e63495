//! The cluster section: the WAL drain (with a consumer and without) and the latency through a
//! private 3-node RabbitMQ cluster's quorum queue, each beside the broker alone on that cluster.

use anyhow::{anyhow, Result};
use tokio::time::Instant;

use super::*;
use crate::measurement::limits::Endpoints;
use crate::measurement::results::{BrokerLimit, ClusterResults, LatencyMs, PublisherPair, Results};
use crate::scenarios::setups::DrainSetup;
use outbox_testkit::amqp::quorum_queue_arguments;
use outbox_testkit::RabbitCluster;

impl Bench {
    /// The cluster section: the WAL drain and the latency at the fixed rate through
    /// a private 3-node RabbitMQ cluster with a quorum queue, each beside the broker alone on
    /// the same cluster in the same placement. The cluster is started here and stopped after.
    pub(super) async fn cluster(&mut self, results: &mut Results) -> Result<()> {
        let started = Instant::now();
        let (mut c, startup_secs) = self
            .on_cluster(async |b: &mut Bench, cluster: &'static RabbitCluster| {
                b.cluster_runs(cluster).await
            })
            .await?;
        c.startup_secs = startup_secs;
        c.seconds = started.elapsed().as_secs_f64();
        self.say(&format!(
            "cluster: section took {:.0} s (cluster start {startup_secs:.0} s)",
            c.seconds
        ));
        results.cluster = Some(c);
        Ok(())
    }

    /// Starts a private 3-node RabbitMQ cluster, points the relay (every node's URL), the
    /// consumers and the broker-alone publisher (node [`LEADER`], quorum queues) at it, runs
    /// `run`, then points them back and stops the cluster, also when `run` failed. Returns
    /// what `run` returned and how long the cluster took to start, in seconds.
    pub(super) async fn on_cluster<T>(
        &mut self,
        run: impl AsyncFnOnce(&mut Bench, &'static RabbitCluster) -> Result<T>,
    ) -> Result<(T, f64)> {
        let started = Instant::now();
        self.say("cluster: starting a private 3-node RabbitMQ cluster (pause_minority)");
        let cluster = tokio::task::spawn_blocking(RabbitCluster::shared)
            .await
            .map_err(|e| anyhow!("the RabbitMQ cluster did not start: {}", panic_text(e)))?;
        let startup_secs = started.elapsed().as_secs_f64();
        // Every queue is declared through LEADER's node by the consumer connected there.
        let relay_url = std::mem::replace(&mut self.relay.amqp_url, cluster.url_list());
        let endpoints = std::mem::replace(
            &mut self.endpoints,
            Endpoints {
                publish: cluster.url(LEADER),
                consume: cluster.url(LEADER),
                queue_arguments: quorum_queue_arguments(),
                nodes: cluster.url_list(),
            },
        );
        let measured = run(self, cluster).await;
        self.relay.amqp_url = relay_url;
        self.endpoints = endpoints;
        // The shared cluster cannot start again once stopped: the recovery section, which
        // runs after this one, stops it.
        if self.args.recovery_rounds() == 0 {
            cluster.shutdown();
        }
        Ok((measured?, startup_secs))
    }

    pub(super) async fn cluster_runs(
        &mut self,
        cluster: &'static RabbitCluster,
    ) -> Result<ClusterResults> {
        let leader_node = quorum_leader_of_new_queue(cluster, LEADER).await?;
        self.say(&format!(
            "cluster: a quorum queue declared through node {LEADER} is led by node {leader_node}"
        ));
        let window = self.scale.max_in_flight;
        let setup = Setup::Wal { window };
        let rows = self.scale.drain_rows;
        self.say("cluster: relay given all three nodes' URLs, consumer on the queue's leader");
        let drain = self.drain(setup, rows, 1).await?;
        let drain_relay_nodes = self.relay_node_indexes(cluster);
        // The broker alone publishes through the node the relay used: the same hops.
        let broker_publisher_node = publisher_node(&drain_relay_nodes, leader_node, cluster.len());
        self.endpoints.publish = cluster.url(broker_publisher_node);
        self.say(&format!(
            "cluster: broker alone, window {window}, {rows} messages, publisher on node \
             {broker_publisher_node} (the relay's: {drain_relay_nodes:?})"
        ));
        let run = self.broker_alone(window, rows, None).await?;
        self.say(&format!(
            "  {:.0} msgs/s received, {:.0} confirmed",
            run.received_per_sec, run.confirmed_per_sec
        ));
        let broker = BrokerLimit {
            window,
            messages: run.messages,
            confirmed_per_sec: run.confirmed_per_sec,
            received_per_sec: run.received_per_sec,
        };

        // Chart 1's cluster figures with no consumer: the relay given only the queue leader's
        // URL and the minimal publisher through the same node. A publish through a follower
        // is forwarded to the leader, and the relay picks a node at random: compared with a
        // publisher on another node, the ratio measured the placement (54-63 % with the relay
        // on a follower against the leader, 100-117 % the other way round, in the runs of
        // 2026-12-04), not the relay.
        self.say(&format!(
            "cluster: WAL drain, no consumer, relay given only the leader's URL (node {leader_node})"
        ));
        let all_nodes = std::mem::replace(&mut self.relay.amqp_url, cluster.url(leader_node));
        let drain_no_consumer = self
            .drain_spec(DrainSpec::of(DrainSetup::WAL, window, rows, false, false))
            .await;
        self.relay.amqp_url = all_nodes;
        let drain_no_consumer = drain_no_consumer?;
        let drain_no_consumer_relay_nodes = self.relay_node_indexes(cluster);
        let mut bare = [None, None];
        let placements = [(true, broker_publisher_node), (false, leader_node)];
        for (slot, (consumer, node)) in bare.iter_mut().zip(placements) {
            self.endpoints.publish = cluster.url(node);
            self.say(&format!(
                "cluster: broker alone, minimal publisher, window {window}, {rows} messages, {}, \
                 publisher on node {node}",
                if consumer {
                    "consumer attached"
                } else {
                    "no consumer"
                }
            ));
            *slot = Some(self.bare_broker(window, rows, consumer).await?);
        }
        let [bare_broker, bare_broker_no_consumer] = bare;
        let mut no_consumer_pairs = Vec::new();
        if let Some(broker) = &bare_broker_no_consumer {
            if self.args.cluster_rounds > 1 {
                no_consumer_pairs.push(PublisherPair {
                    round: 1,
                    relay_first: true,
                    drain: drain_no_consumer.clone(),
                    broker: broker.clone(),
                });
            }
        }
        for round in 2..=self.args.cluster_rounds {
            let pair = self.no_consumer_pair(cluster, leader_node, round).await?;
            no_consumer_pairs.push(pair);
        }
        // The same pairs through a follower, which forwards every publish to the leader.
        let follower_node = (leader_node + 1) % cluster.len();
        let mut follower_pairs = Vec::new();
        for round in 1..=self.args.cluster_follower_pairs {
            let pair = self.no_consumer_pair(cluster, follower_node, round).await?;
            follower_pairs.push(pair);
        }

        let latency = self.latency(setup).await?;
        let latency_relay_nodes = self.relay_node_indexes(cluster);
        let broker_latency_publisher_node =
            publisher_node(&latency_relay_nodes, leader_node, cluster.len());
        self.endpoints.publish = cluster.url(broker_latency_publisher_node);
        let rate = self.scale.latency_rate;
        self.say(&format!(
            "cluster: broker alone, {rate} msgs/s for {} s, publisher on node \
             {broker_latency_publisher_node} (the relay's: {latency_relay_nodes:?})",
            self.scale.latency_secs
        ));
        let messages = u64::from(rate) * self.scale.latency_secs;
        let paced = self.broker_alone(window, messages, Some(rate)).await?;
        let broker_latency = paced.latency.map(LatencyMs::from);
        if let Some(l) = &broker_latency {
            self.say(&format!(
                "  publish→consumer p50 {:.2} ms, p99 {:.2} ms",
                l.p50, l.p99
            ));
        }
        Ok(ClusterResults {
            nodes: cluster.len(),
            queue_type: "quorum".into(),
            declared_through: LEADER,
            leader_node,
            window,
            drain,
            drain_relay_nodes,
            broker,
            broker_publisher_node,
            latency,
            latency_relay_nodes,
            broker_latency,
            broker_latency_publisher_node,
            broker_latency_rate: rate,
            drain_no_consumer: Some(drain_no_consumer),
            drain_no_consumer_relay_nodes,
            bare_broker,
            bare_broker_no_consumer,
            no_consumer_node: Some(leader_node),
            no_consumer_pairs,
            follower_node: (!follower_pairs.is_empty()).then_some(follower_node),
            follower_pairs,
            startup_secs: 0.0,
            seconds: 0.0,
        })
    }

    /// One more pair of the consumer-less runs through `node`: the minimal publisher first in
    /// even rounds, the relay's drain first in odd ones (through the leader, round 1 is the
    /// section's own pair, relay first).
    pub(super) async fn no_consumer_pair(
        &mut self,
        cluster: &'static RabbitCluster,
        node: usize,
        round: u32,
    ) -> Result<PublisherPair> {
        let relay_first = round % 2 == 1;
        self.say(&format!(
            "cluster: consumer-less pair {round}, through node {node}, {} first",
            if relay_first {
                "the relay"
            } else {
                "the minimal publisher"
            }
        ));
        self.endpoints.publish = cluster.url(node);
        let all_nodes = std::mem::replace(&mut self.relay.amqp_url, cluster.url(node));
        let runs = self.publisher_pair_runs(relay_first, false).await;
        self.relay.amqp_url = all_nodes;
        let (drain, broker) = runs?;
        let pair = PublisherPair {
            round,
            relay_first,
            drain,
            broker,
        };
        self.say(&format!("  ratio {:.2}", pair.ratio()));
        Ok(pair)
    }

    /// The cluster's indexes of the nodes the newest relay connected to, in order.
    pub(super) fn relay_node_indexes(&self, cluster: &RabbitCluster) -> Vec<usize> {
        self.relay_nodes
            .iter()
            .filter_map(|node| node.rsplit(':').next()?.parse().ok())
            .filter_map(|port| cluster.index_of_port(port))
            .collect()
    }
}

/// The node the broker alone publishes through: the relay's first, or if its log did not say,
/// the one after the leader (a relay that is not on the leader's node is the likelier case).
pub(super) fn publisher_node(relay_nodes: &[usize], leader: usize, nodes: usize) -> usize {
    relay_nodes.first().copied().unwrap_or((leader + 1) % nodes)
}
