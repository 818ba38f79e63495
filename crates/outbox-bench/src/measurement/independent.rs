//! The limits that share no code with the relay: what RabbitMQ and PostgreSQL's
//! walsender do on their own. [`crate::measurement::limits`] runs the relay's own publisher and decoder, so
//! its ceilings include whatever those cost and cannot show it; a relay figure set against
//! these shows the relay's own cost.
//!
//! - Broker alone, minimal publisher ([`bare_broker_alone`]): a bare lapin publisher, one
//!   connection and one confirm-mode channel, `basic_publish` in a loop with at most `window`
//!   unconfirmed and the confirms awaited in publish order (each publish started without
//!   waiting for lapin's writer), nothing else. Its messages are
//!   built by hand in the relay's shape ([`bare_message`]: the same body, properties and
//!   headers as the relay's broker alone sends, byte for byte, which a test checks against the
//!   relay's mapper), persistent and `mandatory`, to the same exchange and routing key, into
//!   the same kind of durable queue. With the benchmark's usual consumer attached (rate:
//!   arrivals), or none (rate: confirms).
//! - Walsender ceiling ([`walsender_ceiling`]): PostgreSQL's own client, `pg_recvlogical`,
//!   streams a backlog from a pgoutput slot with the options the relay asks for (protocol 1,
//!   the publication, logical messages) into /dev/null, until `--endpos` ([`end_marker_row`]
//!   makes the backlog's last transaction one whose position is known).
//!
//! Nothing here may use the relay's crate: a test reads this file and fails if it does.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, StreamExt};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use serde::{Deserialize, Serialize};
use tokio::process::Command;
use tokio::time::Instant;
use tokio_postgres::Client;

use crate::measurement::cpu::{self, CpuProbe, CpuSplit};
use crate::measurement::limits::synthetic_order;
use crate::measurement::writers::ORDER_NOTE_LEN;
use outbox_testkit::arrivals::{self, ArrivalConsumer, QueueSpec};
use outbox_testkit::pg::quote_ident;

/// How long a run may wait for its last confirm, arrival or pg_recvlogical's exit.
const TIMEOUT: Duration = Duration::from_secs(300);

/// `created_at` of the relay's synthetic rows (2026-01-01 00:00:00.123456+00) as the AMQP
/// timestamp the relay sets: whole Unix seconds.
const CREATED_AT_UNIX: u64 = 1_767_225_600;

/// A message ready for `basic_publish`.
#[derive(Debug, Clone)]
pub struct BareMessage {
    pub message_id: String,
    pub routing_key: String,
    pub properties: BasicProperties,
    pub body: Vec<u8>,
}

/// Message `n` as the relay publishes synthetic row `n` (see `limits::SyntheticRows`): a
/// ~200-byte order as the body, the id, type, persistence, content type and timestamp, and
/// the `x-outbox-lsn` / `x-outbox-seq` headers of a row that is alone in a transaction
/// committed at LSN `n + 1`.
pub fn bare_message(event_type: &str, n: u64) -> BareMessage {
    let (message_id, body) = synthetic_order(n);
    let lsn = n + 1;
    let mut headers = FieldTable::default();
    headers.insert(
        "x-outbox-lsn".into(),
        AMQPValue::LongString(format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF).into()),
    );
    headers.insert(
        "x-outbox-seq".into(),
        AMQPValue::LongString(format!("{lsn:016X}-{:08X}", 0).into()),
    );
    let properties = BasicProperties::default()
        .with_message_id(message_id.as_str().into())
        .with_type(event_type.into())
        .with_delivery_mode(2)
        .with_headers(headers)
        .with_content_type("application/json".into())
        .with_timestamp(CREATED_AT_UNIX);
    BareMessage {
        message_id,
        routing_key: event_type.to_string(),
        properties,
        body: body.into_bytes(),
    }
}

/// One run of the minimal publisher.
#[derive(Debug, Clone)]
pub struct BareBroker<'a> {
    /// The publisher's AMQP URL (one node).
    pub url: &'a str,
    /// Where the queue is declared and consumed: `url` on one node; on a cluster the node
    /// that is to lead the quorum queue, as for the relay's drain.
    pub consume_url: &'a str,
    pub exchange: &'a str,
    pub queue: &'a str,
    /// The queue's declare arguments (empty: a classic queue).
    pub queue_arguments: FieldTable,
    /// Every node of the broker, whose processes the CPU split counts (`Endpoints::nodes`).
    pub nodes: &'a str,
    pub window: usize,
    pub messages: u64,
    /// Attach the benchmark's consumer; without it the queue only fills.
    pub consumer: bool,
}

/// What the minimal publisher measured; the JSON of `limits.bare_broker*`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BareBrokerLimit {
    pub window: u32,
    pub messages: u64,
    pub consumer: bool,
    /// Messages per second, from the first publish to the last confirm.
    pub confirmed_per_sec: f64,
    /// Messages per second, from the first publish to the consumer's last receipt (with a
    /// consumer).
    pub received_per_sec: Option<f64>,
    /// CPU per message (RabbitMQ and this process: publisher, and consumer if attached).
    pub cpu: Option<CpuSplit>,
}

impl BareBrokerLimit {
    /// The run's rate: arrivals with a consumer, confirms without.
    pub fn rate(&self) -> f64 {
        self.received_per_sec.unwrap_or(self.confirmed_per_sec)
    }
}

/// Publishes `messages` messages with the minimal publisher (see the module doc); fails if
/// any was nacked or returned unroutable, or (with a consumer) did not arrive.
pub async fn bare_broker_alone(run: &BareBroker<'_>) -> Result<BareBrokerLimit> {
    let event_type = format!("bench.{}", run.queue);
    let queue = QueueSpec {
        exchange: run.exchange.to_string(),
        queue: run.queue.to_string(),
        arguments: run.queue_arguments.clone(),
        binding_key: event_type.clone(),
        purge: true,
        prefetch: 1000,
        delete_on_close: true,
    };
    let connection = Connection::connect(run.url, ConnectionProperties::default())
        .await
        .context("the minimal publisher cannot connect to RabbitMQ")?;
    let channel = connection.create_channel().await?;
    // What `outbox-relay setup` declares: this may run before any setup did.
    channel
        .exchange_declare(
            run.exchange.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("cannot declare exchange {}", run.exchange))?;
    let mut consumer = if run.consumer {
        Some(ArrivalConsumer::start(run.consume_url, &queue).await?)
    } else if run.consume_url == run.url {
        arrivals::declare(&channel, &queue).await?;
        None
    } else {
        // A quorum queue is led by the node it is declared through.
        let declaring = Connection::connect(run.consume_url, ConnectionProperties::default())
            .await
            .context("the minimal publisher cannot connect to the queue's node")?;
        arrivals::declare(&declaring.create_channel().await?, &queue).await?;
        let _ = declaring.close(200, "queue declared".into()).await;
        None
    };
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let rabbitmq = cpu::rabbitmq_pids(run.nodes).unwrap_or_default();
    let probe = CpuProbe::start(&rabbitmq);
    let started = Instant::now();
    // Each publish's future writes its frames, then waits for its confirm; they complete in
    // publish order. A publish is started (its frames queued) by the poll right after it is
    // pushed, without waiting for lapin's writer: awaiting each write first costs a round trip
    // to the writer and a socket write per message, which held a first version of this
    // publisher to 60 % of the relay's.
    let mut unconfirmed = FuturesOrdered::new();
    let mut returned = 0u64;
    for n in 0..run.messages {
        if unconfirmed.len() >= run.window {
            if let Some(oldest) = unconfirmed.next().await {
                returned += settle(oldest)?;
            }
        }
        let message = bare_message(&event_type, n);
        let channel = channel.clone();
        let exchange = run.exchange.into();
        unconfirmed.push_back(async move {
            let options = BasicPublishOptions {
                mandatory: true,
                immediate: false,
            };
            let routing_key = message.routing_key.into();
            channel
                .basic_publish(
                    exchange,
                    routing_key,
                    options,
                    &message.body,
                    message.properties,
                )
                .await?
                .await
        });
        while let Some(confirmed) = unconfirmed.next().now_or_never().flatten() {
            returned += settle(confirmed)?;
        }
    }
    while let Some(oldest) = unconfirmed.next().await {
        returned += settle(oldest)?;
    }
    let last_confirm = Instant::now();
    if returned > 0 {
        bail!("{returned} messages came back unroutable: the queue is not bound");
    }
    let mut last_receipt = None;
    let cpu = match consumer.as_mut() {
        Some(consumer) => {
            let deadline = Instant::now() + TIMEOUT;
            while (consumer.arrivals().len() as u64) < run.messages {
                if !consumer.wait_for_more(deadline).await? {
                    break;
                }
            }
            let cpu = probe.finish(run.messages, None, None);
            let arrivals = consumer.arrivals();
            let distinct: HashSet<&str> = arrivals
                .iter()
                .filter_map(|a| a.message_id.as_deref())
                .collect();
            if (distinct.len() as u64) < run.messages {
                bail!(
                    "the consumer received {} of {} messages",
                    distinct.len(),
                    run.messages
                );
            }
            last_receipt = arrivals.iter().map(|a| a.received_at).max();
            cpu
        }
        None => probe.finish(run.messages, None, None),
    };
    if let Some(consumer) = consumer {
        consumer.close().await;
    } else {
        // The queue holds every message: delete it now, not at the broker's leisure.
        let _ = channel
            .queue_delete(run.queue.into(), Default::default())
            .await;
    }
    let _ = connection.close(200, "bench done".into()).await;
    let per_sec = |end: Instant| per_sec(run.messages, end.saturating_duration_since(started));
    Ok(BareBrokerLimit {
        window: u32::try_from(run.window).unwrap_or(u32::MAX),
        messages: run.messages,
        consumer: run.consumer,
        confirmed_per_sec: per_sec(last_confirm),
        received_per_sec: last_receipt.map(per_sec),
        cpu: Some(cpu),
    })
}

/// 1 for a message acked but returned unroutable (`mandatory`), 0 for a plain ack; a nack,
/// a failed publish or a channel without confirms is an error.
fn settle(confirmation: lapin::Result<Confirmation>) -> Result<u64> {
    match confirmation? {
        Confirmation::Ack(None) => Ok(0),
        Confirmation::Ack(Some(_)) => Ok(1),
        Confirmation::Nack(_) => bail!("the broker nacked a message"),
        Confirmation::NotRequested => bail!("the channel is not in confirm mode"),
    }
}

fn per_sec(count: u64, elapsed: Duration) -> f64 {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

/// What the walsender ceiling measured; the JSON of `limits.walsender`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WalsenderLimit {
    /// Rows in the backlog, one per transaction.
    pub rows: u64,
    /// From starting pg_recvlogical to its exit at the backlog's end.
    pub seconds: f64,
    pub rows_per_sec: f64,
    pub method: String,
}

/// `pg_recvlogical` of the server's major version (Debian's layout), else the one on PATH.
pub async fn pg_recvlogical(admin: &Client) -> Result<PathBuf> {
    let version: String = admin
        .query_one("SHOW server_version_num", &[])
        .await?
        .try_get(0)?;
    let major = version.get(..version.len().saturating_sub(4)).unwrap_or("");
    let debian = PathBuf::from(format!("/usr/lib/postgresql/{major}/bin/pg_recvlogical"));
    Ok(if debian.is_file() {
        debian
    } else {
        PathBuf::from("pg_recvlogical")
    })
}

/// Commits row `n` of a backlog into `table` (the seeded rows' shape, its own transaction)
/// and returns the WAL insert position read after the INSERT, before the COMMIT: past the
/// row's change and not past the commit's end, so `pg_recvlogical --endpos` stops on that
/// commit, having received every row before it. (The position after the commit could be
/// past WAL that is never sent, and pg_recvlogical would then wait for a keepalive.)
pub async fn end_marker_row(
    admin: &Client,
    table: &str,
    event_type: &str,
    n: u64,
) -> Result<String> {
    let insert = format!(
        "INSERT INTO {} (event_type, payload) VALUES ($1, jsonb_build_object('order_id', $2::int8, \
         'customer_id', $2::int8 % 9973, 'status', 'created', 'currency', 'EUR', \
         'total_cents', ($2::int8 * 7919) % 100000, 'note', repeat('x', {ORDER_NOTE_LEN})))",
        quote_ident(table)
    );
    let n = i64::try_from(n).context("row number out of range")?;
    admin.batch_execute("BEGIN").await?;
    let marked = async {
        admin.execute(&insert, &[&event_type, &n]).await?;
        let lsn: String = admin
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await?
            .try_get(0)?;
        Ok::<_, anyhow::Error>(lsn)
    }
    .await;
    match marked {
        Ok(lsn) => {
            admin.batch_execute("COMMIT").await?;
            Ok(lsn)
        }
        Err(e) => {
            let _ = admin.batch_execute("ROLLBACK").await;
            Err(e.context(format!("cannot commit the end marker row into {table}")))
        }
    }
}

/// Streams `slot` with `pg_recvlogical` (pgoutput, `publication`) into /dev/null until
/// `endpos`; `rows` is the backlog's size, for the rate.
pub async fn walsender_ceiling(
    pg_recvlogical: &Path,
    database_url: &str,
    slot: &str,
    publication: &str,
    endpos: &str,
    rows: u64,
) -> Result<WalsenderLimit> {
    let started = Instant::now();
    let child = Command::new(pg_recvlogical)
        .args([
            "--dbname",
            database_url,
            "--slot",
            slot,
            "--start",
            "--no-loop",
        ])
        .arg(format!("--endpos={endpos}"))
        .args(["--plugin", "pgoutput", "-o", "proto_version=1"])
        .arg("-o")
        .arg(format!("publication_names={}", quote_ident(publication)))
        // The relay asks for logical messages too (outbox_emit); none are in this backlog.
        .args(["-o", "messages=true", "--file", "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot run {}", pg_recvlogical.display()))?;
    let output = tokio::time::timeout(TIMEOUT, child.wait_with_output())
        .await
        .with_context(|| format!("pg_recvlogical did not reach {endpos} in {TIMEOUT:?}"))??;
    let elapsed = started.elapsed();
    if !output.status.success() {
        bail!(
            "pg_recvlogical failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(WalsenderLimit {
        rows,
        seconds: elapsed.as_secs_f64(),
        rows_per_sec: per_sec(rows, elapsed),
        method: "pg_recvlogical, pgoutput, into /dev/null".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measurement::limits::SyntheticRows;

    #[test]
    fn the_bare_message_is_the_relays_byte_for_byte() {
        let rows = SyntheticRows::new("outbox", "bench.q").expect("rows");
        for n in [0, 1, 41, 1 << 33] {
            let mapped = rows.message(n).expect("mapped");
            let message_id = mapped.message_id.clone();
            // As the relay's broker side publishes it.
            let relay = outbox_relay::internals::Outgoing::from_message(mapped).expect("fits AMQP");
            let bare = bare_message("bench.q", n);
            assert_eq!(bare.message_id, message_id);
            assert_eq!(bare.routing_key, relay.routing_key.as_str());
            assert_eq!(bare.body, relay.body.as_ref());
            assert_eq!(bare.properties, relay.properties, "message {n}");
        }
    }

    #[test]
    fn nothing_here_uses_the_relay() {
        let source = include_str!("independent.rs");
        let code = source.split("#[cfg(test)]").next().unwrap_or(source);
        // Spelled in two pieces, so that this test's own text does not match.
        let relay_crate = ["outbox", "_relay"].concat();
        assert!(
            !code.contains(&relay_crate),
            "independent.rs uses {relay_crate}"
        );
    }
}
