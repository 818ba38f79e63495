//! The suite's scenarios 2 to 4 and 6: latency at a fixed rate, load, crash, and the
//! --max-in-flight sweep.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::time::Instant;

use super::*;
use crate::measurement::results::{Crash, LatencyMs, LatencyRun, LoadRun, Results, SweepRow};
use crate::measurement::writers::{self, WriterOptions, ORDER_NOTE_LEN};
use outbox_common::quote::{quote_ident, quote_literal};
use outbox_testkit::faults::relay_crash_duplicate_bound;

impl Bench {
    /// Scenario 2: one writer at a fixed rate, one row per transaction.
    pub(super) async fn latency(&mut self, setup: Setup) -> Result<LatencyRun> {
        let rate = self.scale.latency_rate;
        let rows = u64::from(rate) * self.scale.latency_secs;
        let o = self.objects(matches!(setup, Setup::Wal { .. })).await?;
        self.say(&format!(
            "latency: {setup:?}, {rate} rows/s for {} s",
            self.scale.latency_secs
        ));
        let consumer = self.consumer(&o).await?;
        let relay = self.start_relay(setup, &o, "latency")?;
        relay.ready().await?;
        let options = WriterOptions {
            pace: Some(Duration::from_secs(1) / rate),
            note_len: ORDER_NOTE_LEN,
            ..WriterOptions::new(1, rows, 1, &o.table, &o.event_type)
        };
        let written = writers::write(&self.args.servers.database_url, &options).await?;
        let report = collect(consumer, &written, CATCH_UP).await?;
        self.relay_nodes = relay.broker_nodes();
        relay.stop().await?;
        self.drop_objects(o).await?;
        let latency = report.latency.map(LatencyMs::from);
        if let Some(l) = &latency {
            self.say(&format!(
                "  avg {:.2} ms, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                l.avg, l.p50, l.p99, l.max
            ));
        }
        Ok(LatencyRun {
            rate,
            rows: written.rows.len() as u64,
            missing: report.missing as u64,
            latency,
        })
    }

    /// Scenario 3: 100 writers as fast as they can for the load window, with a relay (or none:
    /// the ceiling), optionally waking a listening poller with NOTIFY.
    pub(super) async fn load(&mut self, setup: Option<Setup>, notify: Notify) -> Result<LoadRun> {
        let wal = matches!(setup, Some(Setup::Wal { .. }));
        let o = self.objects(wal).await?;
        let writers_n = self.scale.load_writers;
        self.say(&format!(
            "load: {setup:?}, {notify:?}, {writers_n} writers for {} s",
            self.scale.load_secs
        ));
        if notify == Notify::Trigger {
            let function = quote_ident(&format!("{}_notify", o.table));
            self.admin
                .batch_execute(&format!(
                    "CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ \
                     BEGIN PERFORM pg_notify({channel}, ''); RETURN NEW; END $$; \
                     CREATE TRIGGER notify AFTER INSERT ON {table} \
                     FOR EACH ROW EXECUTE FUNCTION {function}();",
                    channel = quote_literal(LISTEN_CHANNEL),
                    table = quote_ident(&o.table),
                ))
                .await
                .context("cannot create the NOTIFY trigger")?;
        }
        let mut running = None;
        if let Some(setup) = setup {
            let consumer = self.consumer(&o).await?;
            let relay = self.start_relay(setup, &o, "load")?;
            relay.ready().await?;
            running = Some((consumer, relay));
        }
        let options = WriterOptions {
            until: Some(Instant::now() + Duration::from_secs(self.scale.load_secs)),
            notify: (notify == Notify::AfterCommit).then(|| LISTEN_CHANNEL.to_string()),
            note_len: ORDER_NOTE_LEN,
            ..WriterOptions::new(writers_n, u64::MAX, 1, &o.table, &o.event_type)
        };
        let written = writers::write(&self.args.servers.database_url, &options).await?;
        let committed = written.rows.len() as u64;
        let seconds = match (written.started, written.last_commit()) {
            (Some(start), Some(last)) => last.saturating_duration_since(start).as_secs_f64(),
            _ => 0.0,
        };
        let mut run = LoadRun {
            writers: writers_n,
            seconds: self.scale.load_secs,
            committed,
            orders_per_sec: per_sec(committed, seconds),
            missing: 0,
            latency: None,
        };
        if let Some((consumer, relay)) = running {
            let report = collect(consumer, &written, CATCH_UP).await?;
            relay.stop().await?;
            run.missing = report.missing as u64;
            run.latency = report.latency.map(LatencyMs::from);
        }
        if notify == Notify::Trigger {
            let function = quote_ident(&format!("{}_notify", o.table));
            self.drop_objects(o).await?;
            self.admin
                .batch_execute(&format!("DROP FUNCTION IF EXISTS {function}()"))
                .await?;
        } else {
            self.drop_objects(o).await?;
        }
        self.say(&format!(
            "  {:.0} orders/s committed; avg commit→consumer {}; {} missing",
            run.orders_per_sec,
            run.latency
                .as_ref()
                .map_or("—".to_string(), |l| format!("{:.2} ms", l.avg)),
            run.missing
        ));
        Ok(run)
    }

    /// Scenario 4: kill -9 the relay partway through a backlog, restart it, count what the
    /// consumer got against the ids in the table.
    pub(super) async fn crash(&mut self, setup: Setup, rows: u64) -> Result<Crash> {
        let o = self.objects(matches!(setup, Setup::Wal { .. })).await?;
        self.say(&format!("crash: {setup:?}, {rows} rows ({})", o.table));
        let mut consumer = self.consumer(&o).await?;
        self.seed(&o, rows, 1).await?;
        let expected = self.committed_ids(&o).await?;
        let deadline = Instant::now() + CRASH_TIMEOUT;
        let relay = self.start_relay(setup, &o, "crash-1")?;
        let mut counter = Distinct::default();
        let kill_at = ((rows as f64) * KILL_AT) as usize;
        while counter.count() < kill_at {
            if !consumer.wait_for_more(deadline).await? {
                anyhow::bail!("the crash backlog stalled before the kill point");
            }
            counter.add(consumer.arrivals());
        }
        relay.kill();
        // The delivery rate while the relay ran, from its first delivery (startup excluded).
        let delivering = counter.first.map_or(Duration::ZERO, |first| {
            Instant::now().saturating_duration_since(first)
        });
        let received_before_kill = counter.count() as u64;
        let relay = self.start_relay(setup, &o, "crash-2")?;
        while counter.count() < expected.len() {
            if !consumer.wait_for_more(deadline).await? {
                break;
            }
            counter.add(consumer.arrivals());
        }
        relay.stop().await?;
        consumer
            .wait_quiet(QUIET, Instant::now() + QUIET * 5)
            .await?;
        let arrivals = consumer.close().await;
        self.drop_objects(o).await?;
        let mut seen = HashSet::with_capacity(expected.len());
        let mut duplicates = 0u64;
        for id in arrivals.iter().filter_map(|a| a.message_id.as_deref()) {
            if expected.contains(id) && !seen.insert(id) {
                duplicates += 1;
            }
        }
        let lost = (expected.len() - seen.len()) as u64;
        let duplicate_bound = match setup {
            Setup::Wal { window } => {
                let rate = per_sec(received_before_kill, delivering.as_secs_f64());
                let status_interval = Duration::from_millis(self.args.status_interval_ms);
                // 1: the confirmed rows of the open transaction (one row each here).
                let bound = relay_crash_duplicate_bound(window as usize, rate, status_interval, 1);
                Some(bound as u64)
            }
            Setup::Poll { .. } => None,
        };
        self.say(&format!(
            "  killed after {received_before_kill} received; lost {lost}, duplicates {duplicates}{}",
            duplicate_bound.map_or(String::new(), |b| format!(" (bound {b})"))
        ));
        Ok(Crash {
            rows,
            received_before_kill,
            lost,
            duplicates,
            duplicate_bound,
        })
    }

    /// Scenario 6's sweep: WAL drain, p99 at the fixed rate and crash duplicates at each
    /// --max-in-flight (the default's figures are reused when the backlog is the same).
    pub(super) async fn sweep(&mut self, results: &mut Results) -> Result<()> {
        let rows = self.scale.sweep_rows;
        for window in self.args.sweep.clone() {
            let wal = results
                .wal()
                .filter(|_| window == self.args.max_in_flight && rows == self.scale.drain_rows);
            let (drain, latency, crash) = match wal {
                Some(m) => (m.drain.clone(), m.latency.clone(), m.crash.clone()),
                None => (None, None, None),
            };
            let setup = Setup::Wal { window };
            let drain = match drain {
                Some(d) => d,
                None => self.drain(setup, rows, 1).await?,
            };
            let latency = match latency {
                Some(l) => l,
                None => self.latency(setup).await?,
            };
            let crash = match crash {
                Some(c) => c,
                None => self.crash(setup, rows).await?,
            };
            results.sweep.push(SweepRow {
                window,
                drain_msgs_per_sec: drain.msgs_per_sec,
                p99_ms: latency.latency.map(|l| l.p99),
                crash_lost: crash.lost,
                crash_duplicates: crash.duplicates,
                duplicate_bound: crash.duplicate_bound.unwrap_or(0),
                broker_msgs_per_sec: results
                    .limits
                    .broker_at(window)
                    .map_or(0.0, |b| b.received_per_sec),
            });
        }
        Ok(())
    }
}
