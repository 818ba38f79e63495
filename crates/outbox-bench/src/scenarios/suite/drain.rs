//! Scenario 1, the backlog drain: one spec for every kind of run that drains (the suite, the
//! A/B, `--compare`, `--shards-sweep`, `--emit`, `--cost-growth`, the cluster section).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use tokio::time::Instant;

use super::*;
use crate::measurement::cpu::{self, CpuProbe};
use crate::measurement::relay::Relay;
use crate::measurement::results::{load_average, AbRun, Drain};
use crate::scenarios::compare::Layout;
use outbox_common::quote::quote_ident;
use outbox_testkit::procfs;

impl Bench {
    /// Scenario 1: a backlog of `rows` rows, then the relay; msgs/s received until all arrived
    /// or the window ended, and the relay's CPU and peak RSS meanwhile.
    /// The WAL drain alternately with the relay binary and `other`: A, B, A, B, …
    pub(super) async fn drain_ab(&mut self, other: PathBuf) -> Result<Vec<AbRun>> {
        let setup = if self.args.ab_setup == "poll5" {
            Setup::Poll {
                workers: 5,
                listen: false,
                batch_size: None,
                delete: false,
            }
        } else {
            Setup::Wal {
                window: self.scale.max_in_flight,
            }
        };
        let binaries = [self.relay.path.clone(), other];
        let mut runs = Vec::new();
        for round in 1..=self.args.ab_rounds {
            for binary in &binaries {
                self.relay.path = binary.clone();
                let drain = self.drain(setup, self.scale.drain_rows, 1).await?;
                runs.push(AbRun {
                    setup: self.args.ab_setup.clone(),
                    binary: binary.display().to_string(),
                    round,
                    drain,
                });
            }
        }
        self.relay.path = binaries[0].clone();
        Ok(runs)
    }

    pub(super) async fn drain(
        &mut self,
        setup: Setup,
        rows: u64,
        transaction_rows: u64,
    ) -> Result<Drain> {
        self.drain_spec(DrainSpec {
            setup,
            rows,
            transaction_rows,
            seed: Seed::Rows,
            shards: 1,
            // Only the A/B reads PostgreSQL's CPU in the suite: it needs the server on this
            // machine.
            pg_cpu: self.args.ab_with.is_some(),
            consumer: true,
            layout: Layout::Default,
            payload_bytes: None,
            measure_payload: false,
        })
        .await
    }

    pub(super) async fn drain_spec(&mut self, spec: DrainSpec) -> Result<Drain> {
        let DrainSpec {
            setup,
            rows,
            transaction_rows,
            seed,
            shards,
            pg_cpu,
            consumer,
            layout,
            payload_bytes,
            measure_payload,
        } = spec;
        let mut o = self
            .sharded_objects(matches!(setup, Setup::Wal { .. }), shards)
            .await?;
        self.use_layout(&mut o, layout).await?;
        self.say(&format!(
            "drain: {setup:?}, {rows} {seed:?} in {transaction_rows}-row transactions, \
             {layout:?} layout, {shards} relay(s) ({}), load {}",
            o.table,
            load_average()
        ));
        if pg_cpu {
            // An autovacuum of the fresh rows would count as PostgreSQL's cost of the drain.
            self.admin
                .batch_execute(&format!(
                    "ALTER TABLE {} SET (autovacuum_enabled = false)",
                    quote_ident(&o.table)
                ))
                .await?;
        }
        let mut counter =
            DrainCounter::start(&self.endpoints.consume, &self.queue_spec(&o), consumer).await?;
        self.seed_with(&o, rows, transaction_rows, seed, payload_bytes)
            .await?;
        // Read before PostgreSQL's CPU is: the scan is not the drain's.
        let avg_payload_bytes = if measure_payload {
            self.average_payload_bytes(&o).await?
        } else {
            None
        };
        let postmaster = if pg_cpu {
            // The seeding session's backend must be gone (and reaped) before the first read.
            self.wait_backends_gone().await?;
            Some(self.postmaster_pid().await?)
        } else {
            None
        };
        let pg_cpu_before = postmaster
            .map(procfs::process_and_children_cpu)
            .transpose()?;
        // The CPU split: RabbitMQ and this process from here; the relay's and its
        // walsenders' at the end (they start with the drain).
        let walsender_parent = match setup {
            Setup::Wal { .. } => self.postmaster_pid().await.ok(),
            Setup::Poll { .. } => None,
        };
        let rabbitmq = self.rabbitmq_pids();
        self.settle(&rabbitmq).await;
        let cpu_probe = CpuProbe::start(&rabbitmq);
        let started = Instant::now();
        let relays = (0..shards)
            .map(|k| self.start_shard(setup, &o, "drain", k))
            .collect::<Result<Vec<Relay>>>()?;
        let window_end = started + Duration::from_secs(self.args.drain_window_secs);
        let (received, last) = counter.wait_for(rows, window_end).await?;
        let mut cpu = Duration::ZERO;
        let mut peak_rss_kib = 0;
        for relay in &relays {
            let usage = relay.usage()?;
            cpu += usage.cpu;
            peak_rss_kib = peak_rss_kib.max(usage.peak_rss_kib);
        }
        let walsender_cpu = match walsender_parent {
            Some(parent) => cpu::walsender_cpu(&self.admin, &o.slot_names(), parent)
                .await
                .map_err(|e| self.say(&format!("  no walsender CPU: {e:#}")))
                .ok(),
            None => None,
        };
        let cpu_split = cpu_probe.finish(received, Some(cpu), walsender_cpu);
        let complete = received >= rows;
        let end = if complete {
            last.unwrap_or(window_end)
        } else {
            window_end
        };
        self.relay_nodes = relays.first().map(Relay::broker_nodes).unwrap_or_default();
        for relay in relays {
            relay.stop().await?;
        }
        let mut pg_cpu_seconds = None;
        if let (Some(pid), Some(before)) = (postmaster, pg_cpu_before) {
            // After the stop: the relays' backends and walsenders have exited and been reaped
            // into the postmaster's children's time.
            self.wait_backends_gone().await?;
            let cpu = procfs::process_and_children_cpu(pid)?.saturating_sub(before);
            pg_cpu_seconds = Some(cpu.as_secs_f64());
        }
        counter.close().await;
        self.drop_objects(o).await?;
        let seconds = end.saturating_duration_since(started).as_secs_f64();
        let cpu_seconds = cpu.as_secs_f64();
        let drain = Drain {
            rows,
            transaction_rows,
            received,
            seconds,
            msgs_per_sec: per_sec(received, seconds),
            complete,
            cpu_seconds,
            cpu_seconds_per_100k: if received > 0 {
                cpu_seconds * 100_000.0 / received as f64
            } else {
                0.0
            },
            peak_rss_mib: peak_rss_kib as f64 / 1024.0,
            pg_cpu_seconds,
            cpu: Some(cpu_split),
            payload_bytes: avg_payload_bytes,
        };
        self.say(&format!(
            "  {:.0} msgs/s ({received} in {seconds:.2} s), cpu {cpu_seconds:.2} s{}, peak rss {:.1} MiB",
            drain.msgs_per_sec,
            pg_cpu_seconds.map_or(String::new(), |s| format!(", PostgreSQL cpu {s:.2} s")),
            drain.peak_rss_mib
        ));
        if let Some(c) = &drain.cpu {
            self.say(&cpu_split_line(c));
        }
        Ok(drain)
    }
}
