//! Scenario 5, the limits the relay is set against: broker alone (the relay's publisher code
//! and the minimal publisher), decoding alone, the walsender ceiling, and the single node's
//! adjacent pairs of the WAL drain and the minimal publisher.

use anyhow::Result;

use super::*;
use crate::measurement::independent::{self, BareBroker, BareBrokerLimit};
use crate::measurement::limits::{self};
use crate::measurement::results::{
    BrokerLimit, DecodeLimit, Drain, LatencyMs, PublisherPair, Results,
};
use crate::measurement::writers::ORDER_NOTE_LEN;
use crate::scenarios::setups::DrainSetup;

impl Bench {
    /// Scenario 5: broker alone at every window, its latency at the writer's rate, and
    /// decoding alone.
    pub(super) async fn limits(&mut self, results: &mut Results) -> Result<()> {
        let mut windows: Vec<u32> = self.args.sweep.clone();
        if !windows.contains(&self.args.max_in_flight) {
            windows.push(self.args.max_in_flight);
        }
        windows.sort_unstable();
        for window in windows {
            self.say(&format!(
                "broker alone: window {window}, {} messages",
                self.scale.drain_rows
            ));
            let run = self
                .broker_alone(window, self.scale.drain_rows, None)
                .await?;
            self.say(&format!(
                "  {:.0} msgs/s received, {:.0} confirmed",
                run.received_per_sec, run.confirmed_per_sec
            ));
            if window == self.args.max_in_flight {
                self.say(&cpu_split_line(&run.cpu));
                results.limits.broker_cpu = Some(run.cpu.clone());
            }
            results.limits.broker.push(BrokerLimit {
                window,
                messages: run.messages,
                confirmed_per_sec: run.confirmed_per_sec,
                received_per_sec: run.received_per_sec,
            });
        }
        let rate = self.scale.latency_rate;
        self.say(&format!(
            "broker alone: {rate} msgs/s for {} s",
            self.scale.latency_secs
        ));
        let messages = u64::from(rate) * self.scale.latency_secs;
        let paced = self
            .broker_alone(self.args.max_in_flight, messages, Some(rate))
            .await?;
        results.limits.broker_latency = paced.latency.map(LatencyMs::from);
        results.limits.broker_latency_rate = rate;
        if let Some(l) = &results.limits.broker_latency {
            self.say(&format!(
                "  publish→consumer p50 {:.2} ms, p99 {:.2} ms",
                l.p50, l.p99
            ));
        }

        let o = self.objects(true).await?;
        let rows = self.scale.drain_rows;
        self.say(&format!("decoding alone: {rows} rows"));
        self.seed(&o, rows, 1).await?;
        let decoded = limits::decode_alone(
            &self.args.servers.database_url,
            &o.slot,
            &o.publication,
            &o.table,
            &self.args.exchange,
            rows,
        )
        .await?;
        self.drop_objects(o).await?;
        self.say(&format!("  {:.0} rows/s", decoded.rows_per_sec));
        results.limits.decode = Some(DecodeLimit {
            rows,
            rows_per_sec: decoded.rows_per_sec,
            method: "pgwire-replication + our decoder and mapper, nothing published".into(),
        });
        self.independent_limits(results).await
    }

    /// The limits that share no code with the relay ([`independent`]): broker alone
    /// with the minimal publisher at --max-in-flight, with the consumer and without, then the
    /// walsender ceiling on a backlog like the drain's.
    /// One run of the minimal publisher (broker alone, no relay code) on a queue of its own.
    pub(super) async fn bare_broker(
        &mut self,
        window: u32,
        messages: u64,
        consumer: bool,
    ) -> Result<BareBrokerLimit> {
        self.settle(&self.rabbitmq_pids()).await;
        self.runs += 1;
        let queue = format!("bench_{}", self.runs);
        let run = independent::bare_broker_alone(&BareBroker {
            url: &self.endpoints.publish,
            consume_url: &self.endpoints.consume,
            exchange: &self.args.exchange,
            queue: &queue,
            queue_arguments: self.endpoints.queue_arguments.clone(),
            nodes: &self.endpoints.nodes,
            window: window as usize,
            messages,
            consumer,
        })
        .await?;
        self.say(&format!(
            "  {} msgs/s received, {:.0} confirmed",
            run.received_per_sec
                .map_or("—".to_string(), |r| format!("{r:.0}")),
            run.confirmed_per_sec
        ));
        Ok(run)
    }

    pub(super) async fn independent_limits(&mut self, results: &mut Results) -> Result<()> {
        let window = self.args.max_in_flight;
        let messages = self.scale.drain_rows;
        for consumer in [true, false] {
            self.say(&format!(
                "broker alone, minimal publisher: window {window}, {messages} messages, {}",
                if consumer {
                    "consumer attached"
                } else {
                    "no consumer"
                }
            ));
            let run = self.bare_broker(window, messages, consumer).await?;
            if let Some(c) = &run.cpu {
                self.say(&cpu_split_line(c));
            }
            if consumer {
                results.limits.bare_broker = Some(run);
            } else {
                results.limits.bare_broker_no_consumer = Some(run);
            }
        }

        let rows = self.scale.drain_rows.max(1);
        let o = self.objects(true).await?;
        self.say(&format!(
            "walsender ceiling: {rows} rows streamed by pg_recvlogical"
        ));
        // The last row is committed on its own, for pg_recvlogical to stop at its commit.
        self.seed(&o, rows - 1, 1).await?;
        let endpos =
            independent::end_marker_row(&self.admin, &o.table, &o.event_type, rows).await?;
        let bin = independent::pg_recvlogical(&self.admin).await?;
        let run = independent::walsender_ceiling(
            &bin,
            &self.args.servers.database_url,
            &o.slot,
            &o.publication,
            &endpos,
            rows,
        )
        .await?;
        self.drop_objects(o).await?;
        self.say(&format!(
            "  {:.0} rows/s ({rows} in {:.2} s)",
            run.rows_per_sec, run.seconds
        ));
        results.limits.walsender = Some(run);
        self.consumer_pairs(results).await
    }

    /// The WAL drain and the minimal publisher, both with a consumer or both without, in that
    /// order or the other, on the endpoints and relay URL already set.
    pub(super) async fn publisher_pair_runs(
        &mut self,
        relay_first: bool,
        consumer: bool,
    ) -> Result<(Drain, BareBrokerLimit)> {
        let window = self.scale.max_in_flight;
        let rows = self.scale.drain_rows;
        let relay = DrainSpec::of(DrainSetup::WAL, window, rows, false, consumer);
        if relay_first {
            let drain = self.drain_spec(relay).await?;
            Ok((drain, self.bare_broker(window, rows, consumer).await?))
        } else {
            let broker = self.bare_broker(window, rows, consumer).await?;
            Ok((self.drain_spec(relay).await?, broker))
        }
    }

    /// `--single-node-pairs`: the WAL drain and the minimal publisher, consumer attached, in
    /// adjacent pairs, the relay first in odd pairs.
    pub(super) async fn consumer_pairs(&mut self, results: &mut Results) -> Result<()> {
        for round in 1..=self.args.single_node_pairs {
            let relay_first = round % 2 == 1;
            self.say(&format!(
                "single node: consumer-attached pair {round}, {} first",
                if relay_first {
                    "the relay"
                } else {
                    "the minimal publisher"
                }
            ));
            let (drain, broker) = self.publisher_pair_runs(relay_first, true).await?;
            let pair = PublisherPair {
                round,
                relay_first,
                drain,
                broker,
            };
            self.say(&format!("  ratio {:.2}", pair.ratio()));
            results.limits.consumer_pairs.push(pair);
        }
        Ok(())
    }

    /// The broker alone ([`limits::broker_alone`]) on a fresh queue, ~200-byte orders.
    pub(super) async fn broker_alone(
        &mut self,
        window: u32,
        messages: u64,
        rate: Option<u32>,
    ) -> Result<limits::BrokerRun> {
        self.broker_alone_padded(window, messages, rate, ORDER_NOTE_LEN)
            .await
    }

    /// [`Bench::broker_alone`] with `note_len` bytes of padding in each payload.
    pub(super) async fn broker_alone_padded(
        &mut self,
        window: u32,
        messages: u64,
        rate: Option<u32>,
        note_len: u32,
    ) -> Result<limits::BrokerRun> {
        self.settle(&self.rabbitmq_pids()).await;
        self.runs += 1;
        let queue = format!("bench_{}", self.runs);
        let window = window as usize;
        limits::broker_alone(
            &self.endpoints,
            &self.args.exchange,
            &queue,
            window,
            messages,
            rate,
            note_len,
        )
        .await
    }
}
