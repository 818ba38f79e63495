//! Each measurement's objects: fresh names, `outbox-relay setup` for them, the table's layout,
//! the relays started on them, their consumer, and their drop (waiting for the walsenders and
//! backends to go).

use std::time::Duration;

use anyhow::{Context, Result};
use tokio::time::Instant;

use super::*;
use crate::measurement::relay::Relay;
use crate::scenarios::compare::Layout;
use outbox_common::quote::quote_ident;
use outbox_testkit::arrivals::{ArrivalConsumer, QueueSpec};
use outbox_testkit::procfs;

impl Bench {
    /// Fresh names, and `outbox-relay setup` for them (WAL: table, publication, slot,
    /// exchange; poll: table and claim index).
    pub(super) async fn objects(&mut self, wal: bool) -> Result<Objects> {
        self.sharded_objects(wal, 1).await
    }

    /// [`Bench::objects`] with `setup --shards shards` (WAL mode).
    pub(super) async fn sharded_objects(&mut self, wal: bool, shards: u32) -> Result<Objects> {
        self.runs += 1;
        let k = self.runs;
        let objects = Objects {
            table: format!("bench_{k}"),
            publication: format!("bench_{k}_pub"),
            slot: format!("bench_{k}_slot"),
            queue: format!("bench_{k}"),
            event_type: format!("bench.{k}"),
            wal,
            shards,
            layout: Layout::Default,
        };
        let mut args = vec!["setup".to_string()];
        args.extend(self.names(&objects));
        if shards > 1 {
            args.extend(["--shards".into(), shards.to_string()]);
        }
        if !wal {
            args.extend(["--mode".into(), "poll".into()]);
        }
        self.relay.run_once(&args).await?;
        Ok(objects)
    }

    pub(super) fn names(&self, o: &Objects) -> Vec<String> {
        let mut args = vec![
            "--table".to_string(),
            o.table.clone(),
            "--exchange".into(),
            self.args.exchange.clone(),
        ];
        if o.wal {
            args.extend([
                "--publication".into(),
                o.publication.clone(),
                "--slot".into(),
                o.slot.clone(),
            ]);
        }
        args
    }

    /// Renames the table's columns to `layout`'s names (`setup` made the contract's), before
    /// any row or relay.
    pub(super) async fn use_layout(&self, o: &mut Objects, layout: Layout) -> Result<()> {
        o.layout = layout;
        if layout == Layout::Debezium {
            for (contract, debezium) in DEBEZIUM_COLUMNS {
                self.admin
                    .batch_execute(&format!(
                        "ALTER TABLE {} RENAME COLUMN {} TO {}",
                        quote_ident(&o.table),
                        quote_ident(contract),
                        quote_ident(debezium)
                    ))
                    .await
                    .with_context(|| format!("cannot rename {}.{contract}", o.table))?;
            }
        }
        Ok(())
    }

    pub(super) async fn drop_objects(&self, o: Objects) -> Result<()> {
        if o.wal {
            let names: Vec<(String, String)> = if o.shards > 1 {
                (0..o.shards)
                    .map(|k| (format!("{}_{k}", o.slot), format!("{}_{k}", o.publication)))
                    .collect()
            } else {
                vec![(o.slot.clone(), o.publication.clone())]
            };
            for (slot, publication) in names {
                self.wait_slot_released(&slot).await?;
                self.admin
                    .execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                         WHERE slot_name = $1",
                        &[&slot],
                    )
                    .await
                    .with_context(|| format!("cannot drop slot {slot}"))?;
                self.admin
                    .batch_execute(&format!(
                        "DROP PUBLICATION IF EXISTS {}",
                        quote_ident(&publication)
                    ))
                    .await?;
            }
            // WAL-mode setup also creates the table's emit functions (docs/emit.md).
            let functions: Vec<String> = ["_emit", "_emit_text", "_emit_bytea"]
                .iter()
                .map(|suffix| quote_ident(&format!("{}{suffix}", o.table)))
                .collect();
            self.admin
                .batch_execute(&format!("DROP FUNCTION IF EXISTS {}", functions.join(", ")))
                .await?;
        }
        self.admin
            .batch_execute(&format!("DROP TABLE IF EXISTS {}", quote_ident(&o.table)))
            .await?;
        Ok(())
    }

    /// Waits until no client backend or walsender but the admin session runs: the seeding
    /// session's, the writers' and the stopped relays' backends exit a moment after their
    /// clients, and only then is their CPU the postmaster's reaped children's, counted once.
    pub(super) async fn wait_backends_gone(&self) -> Result<()> {
        let deadline = Instant::now() + SLOT_RELEASE;
        loop {
            let others: i64 = self
                .admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE backend_type IN ('client backend', 'walsender') \
                     AND pid <> pg_backend_pid()",
                    &[],
                )
                .await?
                .try_get(0)?;
            if others == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "{others} other PostgreSQL sessions still run {SLOT_RELEASE:?} after the \
                     measured ones ended: PostgreSQL's CPU per message needs a server this \
                     benchmark has to itself"
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until no walsender holds `slot`: the relay has exited, but its walsender may
    /// not have noticed yet, and dropping an active slot fails.
    pub(super) async fn wait_slot_released(&self, slot: &str) -> Result<()> {
        let deadline = Instant::now() + SLOT_RELEASE;
        loop {
            let active: bool = self
                .admin
                .query_opt(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                    &[&slot],
                )
                .await?
                .map_or(Ok(false), |row| row.try_get(0))?;
            if !active {
                return Ok(());
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "slot {slot} is still in use {SLOT_RELEASE:?} after the relay exited"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(super) async fn consumer(&self, o: &Objects) -> Result<ArrivalConsumer> {
        ArrivalConsumer::start(&self.endpoints.consume, &self.queue_spec(o)).await
    }

    pub(super) fn queue_spec(&self, o: &Objects) -> QueueSpec {
        QueueSpec {
            exchange: self.args.exchange.clone(),
            queue: o.queue.clone(),
            arguments: self.endpoints.queue_arguments.clone(),
            binding_key: o.routing_key(),
            purge: true,
            prefetch: 1000,
            delete_on_close: true,
        }
    }

    pub(super) fn start_relay(&self, setup: Setup, o: &Objects, name: &str) -> Result<Relay> {
        self.start_shard(setup, o, name, 0)
    }

    /// The relay of shard `shard` of `o.shards` (with one shard: the unsharded relay).
    pub(super) fn start_shard(
        &self,
        setup: Setup,
        o: &Objects,
        name: &str,
        shard: u32,
    ) -> Result<Relay> {
        let command = match setup {
            Setup::Wal { .. } => "run",
            Setup::Poll { .. } => "poll",
        };
        let mut args = vec![command.to_string()];
        args.extend(self.names(o));
        args.extend(o.layout_args());
        let name = if o.shards > 1 {
            args.extend([
                "--shards".into(),
                o.shards.to_string(),
                "--shard".into(),
                shard.to_string(),
            ]);
            format!("{name}-shard{shard}")
        } else {
            name.to_string()
        };
        match setup {
            Setup::Wal { window } => args.extend([
                "--max-in-flight".into(),
                window.to_string(),
                "--status-interval".into(),
                format!("{}ms", self.args.status_interval_ms),
                // No port to clash with.
                "--metrics-addr".into(),
                "off".into(),
            ]),
            Setup::Poll {
                workers,
                listen,
                batch_size,
                delete,
            } => {
                args.extend(["--workers".into(), workers.to_string()]);
                if let Some(batch_size) = batch_size {
                    args.extend(["--batch-size".into(), batch_size.to_string()]);
                }
                if delete {
                    args.extend(["--on-published".into(), "delete".into()]);
                }
                if listen {
                    args.push("--listen".into());
                }
            }
        }
        // Cleanup would only add deletes to the measurement.
        args.extend(["--cleanup-interval".into(), "0".into()]);
        self.relay
            .spawn(&format!("relay-{}-{name}", o.table), &args)
    }

    /// The postmaster's pid: the parent of this session's backend (PostgreSQL on this
    /// machine, as scripts/bench.sh runs it).
    pub(super) async fn postmaster_pid(&self) -> Result<u32> {
        let backend: i32 = self
            .admin
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let stat = std::fs::read_to_string(format!("/proc/{backend}/stat"))
            .with_context(|| format!("PostgreSQL backend {backend} is not on this machine"))?;
        procfs::parent_pid(&stat)
    }
}
