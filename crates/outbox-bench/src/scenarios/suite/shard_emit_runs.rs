//! `--shards-sweep` (sharded relays beside the broker alone) and `--emit` (`outbox_emit`
//! against table inserts: writers, then drains).

use std::time::Duration;

use anyhow::Result;
use tokio::time::Instant;

use super::*;
use crate::measurement::results::{
    load_average, BrokerLimit, EmitDrainRun, EmitWriterRun, Results, ShardRun,
};
use crate::measurement::writers::{self, WriterOptions, ORDER_NOTE_LEN};
use crate::scenarios::setups::DrainSetup;

impl Bench {
    /// `--shards-sweep`: per round, the broker alone at the relay's window, then a
    /// drain with each number of shards (the order rotated from round to round, so drift of
    /// the machine does not favour one), every drain with PostgreSQL's CPU.
    pub(super) async fn shards_sweep(&mut self, results: &mut Results) -> Result<()> {
        let counts = self.args.shards_sweep.clone();
        let window = self.scale.max_in_flight;
        let rows = self.scale.drain_rows;
        for round in 1..=self.args.ab_rounds {
            self.say(&format!(
                "shards round {round}: broker alone, window {window}, {rows} messages, load {}",
                load_average()
            ));
            let run = self.broker_alone(window, rows, None).await?;
            self.say(&format!(
                "  {:.0} msgs/s received, {:.0} confirmed",
                run.received_per_sec, run.confirmed_per_sec
            ));
            results.shards_broker.push(BrokerLimit {
                window,
                messages: run.messages,
                confirmed_per_sec: run.confirmed_per_sec,
                received_per_sec: run.received_per_sec,
            });
            for shards in rotated(&counts, round) {
                let load = load_average();
                let spec = DrainSpec::of(DrainSetup::Shards(shards), window, rows, true, true);
                let drain = self.drain_spec(spec).await?;
                results.shards.push(ShardRun {
                    round,
                    shards,
                    load,
                    drain,
                });
            }
        }
        Ok(())
    }

    /// `--emit`: writers inserting rows against writers calling `outbox_emit` at
    /// each client count, then the drain of a backlog of each; the variants alternate.
    pub(super) async fn emit(&mut self, results: &mut Results) -> Result<()> {
        let window = self.scale.max_in_flight;
        let rows = self.scale.drain_rows;
        for round in 1..=self.args.ab_rounds {
            // Emit first in even rounds.
            let variants = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for clients in self.args.emit_clients.clone() {
                for emit in variants {
                    let run = self.emit_writers(round, clients, emit).await?;
                    results.emit_writers.push(run);
                }
            }
            for emit in variants {
                let load = load_average();
                let setup = if emit {
                    DrainSetup::Emit
                } else {
                    DrainSetup::WAL
                };
                let drain = self
                    .drain_spec(DrainSpec::of(setup, window, rows, true, true))
                    .await?;
                results.emit_drains.push(EmitDrainRun {
                    round,
                    variant: variant_name(emit).into(),
                    load,
                    drain,
                });
            }
        }
        Ok(())
    }

    /// `clients` writers, one event per transaction, for --emit-secs, no relay: events/s and
    /// the WAL written per event (pg_current_wal_lsn before and after, commit records included).
    pub(super) async fn emit_writers(
        &mut self,
        round: u32,
        clients: u32,
        emit: bool,
    ) -> Result<EmitWriterRun> {
        let o = self.objects(true).await?;
        let load = load_average();
        self.say(&format!(
            "emit writers: {}, {clients} clients for {} s, load {load}",
            variant_name(emit),
            self.args.emit_secs
        ));
        let lsn = "SELECT pg_current_wal_lsn()::text";
        let before: String = self.admin.query_one(lsn, &[]).await?.try_get(0)?;
        let options = WriterOptions {
            until: Some(Instant::now() + Duration::from_secs(self.args.emit_secs)),
            note_len: ORDER_NOTE_LEN,
            emit,
            ..WriterOptions::new(clients, u64::MAX, 1, &o.table, &o.event_type)
        };
        let written = writers::write(&self.args.servers.database_url, &options).await?;
        let wal_bytes: f64 = self
            .admin
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8",
                &[&before],
            )
            .await?
            .try_get(0)?;
        self.drop_objects(o).await?;
        let events = written.rows.len() as u64;
        let seconds = match (written.started, written.last_commit()) {
            (Some(start), Some(last)) => last.saturating_duration_since(start).as_secs_f64(),
            _ => 0.0,
        };
        let run = EmitWriterRun {
            round,
            variant: variant_name(emit).into(),
            clients,
            load,
            events,
            seconds,
            events_per_sec: per_sec(events, seconds),
            wal_bytes_per_event: if events > 0 {
                wal_bytes / events as f64
            } else {
                0.0
            },
        };
        self.say(&format!(
            "  {:.0} events/s, {:.0} WAL bytes per event",
            run.events_per_sec, run.wal_bytes_per_event
        ));
        Ok(run)
    }
}
