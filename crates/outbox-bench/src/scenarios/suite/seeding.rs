//! The backlogs: rows committed server side before a relay starts, and what is read back
//! from the table (payload sizes, committed ids).

use std::collections::HashSet;

use anyhow::{Context, Result};
use tokio::time::Instant;

use super::*;
use crate::measurement::writers::ORDER_NOTE_LEN;
use outbox_common::quote::{quote_ident, quote_literal};
use outbox_relay::internals::connect;

impl Bench {
    /// Commits `rows` rows into the table in `transaction_rows`-row transactions, server side
    /// (one DO block committing as it goes: it writes the same WAL as an application's
    /// transactions, much faster than a client round trip per row). Payloads are ~200-byte
    /// orders shaped like the writers' and the broker-alone messages.
    pub(super) async fn seed(&self, o: &Objects, rows: u64, transaction_rows: u64) -> Result<()> {
        self.seed_with(o, rows, transaction_rows, Seed::Rows, None)
            .await
    }

    /// [`Bench::seed`] of `seed`'s rows, with payloads of about `payload_bytes` bytes of JSON
    /// text (None: the ~200-byte order).
    pub(super) async fn seed_with(
        &self,
        o: &Objects,
        rows: u64,
        transaction_rows: u64,
        seed: Seed,
        payload_bytes: Option<u32>,
    ) -> Result<()> {
        let started = Instant::now();
        let client = connect(&self.args.servers.database_url).await?;
        // Durability of the seed is not what is measured; the WAL it writes is the same.
        client.batch_execute("SET synchronous_commit = off").await?;
        let table = quote_ident(&o.table);
        let [event_type_column, aggregate_type, aggregate_id] =
            ["event_type", "aggregate_type", "aggregate_id"].map(|c| quote_ident(o.column(c)));
        let event_type = quote_literal(&o.event_type);
        // `pad` is the DO block's variable, set once below.
        let payload = "jsonb_build_object('order_id', i, 'customer_id', i % 9973, 'status', \
                       'created', 'currency', 'EUR', 'total_cents', (i::bigint * 7919) % 100000, \
                       'note', pad)";
        let pad = match payload_bytes {
            None => format!("repeat('x', {ORDER_NOTE_LEN})"),
            // Hex digits, not one letter repeated: TOAST compresses 16 KiB of `x` to ~200
            // bytes, so the WAL, and the walsender's work, would stay small; it stores hex
            // digits uncompressed, out of line like a real payload of that size.
            Some(bytes) => {
                let note_len = self.note_len_for(payload, bytes, rows).await?;
                format!(
                    "(SELECT left(string_agg(md5(k::text), ''), {note_len}) \
                     FROM generate_series(1, {note_len} / 32 + 1) AS k)"
                )
            }
        };
        let write = match seed {
            Seed::Rows => format!(
                "INSERT INTO {table} ({event_type_column}, payload) VALUES ({event_type}, \
                 {payload})"
            ),
            Seed::Aggregates => format!(
                "INSERT INTO {table} ({event_type_column}, payload, {aggregate_id}) VALUES \
                 ({event_type}, {payload}, CASE WHEN i % 10 = 0 THEN NULL ELSE 'agg-' || \
                 (i * 7) % 500 END)"
            ),
            Seed::Orders => format!(
                "INSERT INTO {table} ({event_type_column}, payload, {aggregate_type}, \
                 {aggregate_id}) VALUES ({event_type}, {payload}, {}, 'agg-' || (i % 500))",
                quote_literal(AGGREGATE_TYPE)
            ),
            Seed::Emitted => format!(
                "PERFORM {}({event_type}, {payload})",
                quote_ident(&format!("{}_emit", o.table))
            ),
        };
        let sql = format!(
            "DO $$ DECLARE pad text := {pad}; BEGIN FOR i IN 1..{rows} LOOP {write}; \
               IF i % {transaction_rows} = 0 THEN COMMIT; END IF; \
             END LOOP; END $$"
        );
        client
            .batch_execute(&sql)
            .await
            .with_context(|| format!("cannot seed {}", o.table))?;
        // The seed's dirty pages are written now, not by the next checkpoint or the kernel's
        // writeback while the relay drains: a cluster's quorum queue with no consumer writes
        // every message to disk beside them, and the broker alone it is compared with runs
        // with no seed behind it
        // (crates/outbox-bench/lab/records/2026-12-04-cluster-drain-placement.md).
        client.batch_execute("CHECKPOINT").await?;
        self.say(&format!(
            "seeded {rows} {seed:?} in {transaction_rows}-row transactions in {:.1} s \
             (checkpoint included)",
            started.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    /// The note length that makes `payload`'s JSON text `bytes` long, from the server's own
    /// rendering of the payload with an empty note in the backlog's middle row.
    pub(super) async fn note_len_for(&self, payload: &str, bytes: u32, rows: u64) -> Result<u32> {
        let middle = (rows / 2).max(1);
        let empty: i32 = self
            .admin
            .query_one(
                &format!(
                    "SELECT octet_length(({payload})::text) \
                     FROM (SELECT {middle}::int AS i, ''::text AS pad) AS s"
                ),
                &[],
            )
            .await
            .context("cannot render an empty payload")?
            .try_get(0)?;
        Ok(bytes.saturating_sub(u32::try_from(empty).unwrap_or(0)))
    }

    /// The average size of the table's payloads as JSON text (the message bodies); None for
    /// a table with no row (emitted events).
    pub(super) async fn average_payload_bytes(&self, o: &Objects) -> Result<Option<f64>> {
        let average: Option<f64> = self
            .admin
            .query_one(
                &format!(
                    "SELECT avg(octet_length(payload::text))::float8 FROM {}",
                    quote_ident(&o.table)
                ),
                &[],
            )
            .await
            .with_context(|| format!("cannot measure the payloads of {}", o.table))?
            .try_get(0)?;
        Ok(average)
    }

    /// Every id in the table: what the relay must deliver.
    pub(super) async fn committed_ids(&self, o: &Objects) -> Result<HashSet<String>> {
        let rows = self
            .admin
            .query(
                &format!("SELECT id::text FROM {}", quote_ident(&o.table)),
                &[],
            )
            .await?;
        rows.iter()
            .map(|r| r.try_get::<_, String>(0).map_err(Into::into))
            .collect()
    }
}
