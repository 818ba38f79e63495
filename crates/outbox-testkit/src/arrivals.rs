//! A queue consumer that records what arrives: each delivery's `message_id`, its
//! `x-outbox-seq` and `x-outbox-lsn` headers and when it was received, in arrival order; and
//! [`Outstanding`], the committed ids not received yet; and [`QueueDepth`], a queue counted
//! but not consumed. The benchmark and `outbox-bench demo` measure with them; a test that
//! needs whole messages uses [`crate::amqp::Consumer`].
//!
//! It consumes with manual acknowledgements and a prefetch window, like a real consumer, and
//! acknowledges in batches (`multiple`) so that acking costs little next to receiving. Bodies
//! are dropped: a benchmark of millions of messages keeps only what it measures. Its
//! per-delivery work is the benchmark's receive path: it must never grow an extra copy or an
//! extra await there (the drain figure would measure the consumer). Unlike the panicking test
//! helpers, it returns errors: the benchmark reports them.
//!
//! It only observes: it never rejects or nacks a delivery, which would come back as a
//! duplicate the relay never sent.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The relay's header names, spelled out here: an oracle must not take them from the relay.
pub const SEQ_HEADER: &str = "x-outbox-seq";
pub const LSN_HEADER: &str = "x-outbox-lsn";

/// Acknowledge (multiple) after this many unacknowledged deliveries…
const ACK_BATCH: u32 = 256;
/// …or once no delivery has arrived for this long.
const ACK_IDLE: Duration = Duration::from_millis(20);

/// One delivery as the benchmark sees it.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub message_id: Option<String>,
    /// `x-outbox-seq`: increases along the stream (compare as strings).
    pub seq: Option<String>,
    /// `x-outbox-lsn`: the commit LSN of the row's transaction.
    pub lsn: Option<String>,
    pub redelivered: bool,
    pub received_at: Instant,
}

/// Where to consume from.
#[derive(Debug, Clone)]
pub struct QueueSpec {
    /// Must exist already (`outbox-relay setup` declares it).
    pub exchange: String,
    /// Declared durable if missing.
    pub queue: String,
    /// The queue's declare arguments: empty for a classic queue,
    /// [`quorum_queue_arguments`](crate::amqp::quorum_queue_arguments) for a quorum queue (led
    /// by the node `url` connects to).
    pub arguments: FieldTable,
    /// `#` receives everything the exchange routes.
    pub binding_key: String,
    /// Drop what the queue holds before consuming (leftovers of an earlier run).
    pub purge: bool,
    pub prefetch: u16,
    /// Delete the queue on [`ArrivalConsumer::close`] (a benchmark's throwaway queue).
    pub delete_on_close: bool,
}

/// A running consumer. Arrivals accumulate in the order they were received.
pub struct ArrivalConsumer {
    connection: Connection,
    arrivals: Vec<Arrival>,
    rx: mpsc::UnboundedReceiver<Arrival>,
    stop: CancellationToken,
    /// `None` once awaited.
    task: Option<JoinHandle<Result<()>>>,
    /// Messages the purge removed.
    purged: u32,
    /// The queue to delete on close, if any.
    delete: Option<String>,
}

impl ArrivalConsumer {
    /// Connects, declares and binds the queue, optionally purges it, and starts consuming.
    pub async fn start(url: &str, spec: &QueueSpec) -> Result<ArrivalConsumer> {
        let properties =
            ConnectionProperties::default().with_connection_name("outbox-arrivals".into());
        let connection = Connection::connect(url, properties)
            .await
            .context("cannot connect to RabbitMQ")?;
        let channel = connection.create_channel().await?;
        let purged = declare(&channel, spec).await?;
        channel
            .basic_qos(spec.prefetch, BasicQosOptions::default())
            .await?;
        let deliveries = channel
            .basic_consume(
                short(&spec.queue)?,
                // Empty: the broker names the consumer, so several can share a connection.
                ShortString::default(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("cannot consume queue {}", spec.queue))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let task = tokio::spawn(consume(channel, deliveries, tx, stop.clone()));
        Ok(ArrivalConsumer {
            connection,
            arrivals: Vec::new(),
            rx,
            stop,
            task: Some(task),
            purged,
            delete: spec.delete_on_close.then(|| spec.queue.clone()),
        })
    }

    pub fn purged(&self) -> u32 {
        self.purged
    }

    /// Everything received so far, in arrival order.
    pub fn arrivals(&mut self) -> &[Arrival] {
        while let Ok(arrival) = self.rx.try_recv() {
            self.arrivals.push(arrival);
        }
        &self.arrivals
    }

    /// Waits until something arrived that [`ArrivalConsumer::arrivals`] has not shown yet, or
    /// `deadline`: `Ok(false)` if nothing came. An error means consumption stopped (the
    /// connection or channel failed, or the broker cancelled the consumer).
    pub async fn wait_for_more(&mut self, deadline: Instant) -> Result<bool> {
        let shown = self.arrivals.len();
        if self.arrivals().len() > shown {
            return Ok(true);
        }
        match tokio::time::timeout_at(deadline, self.rx.recv()).await {
            Ok(Some(arrival)) => {
                self.arrivals.push(arrival);
                Ok(true)
            }
            Ok(None) => Err(self.failure().await),
            Err(_) => Ok(false),
        }
    }

    /// Keeps receiving until nothing has arrived for `quiet` (at most until `deadline`), to
    /// catch duplicates that trail the last expected message.
    pub async fn wait_quiet(&mut self, quiet: Duration, deadline: Instant) -> Result<()> {
        loop {
            let until = (Instant::now() + quiet).min(deadline);
            if !self.wait_for_more(until).await? || Instant::now() >= deadline {
                return Ok(());
            }
        }
    }

    /// Acknowledges what was received, stops consuming and closes the connection; returns
    /// every arrival. Unacknowledged deliveries return to the queue.
    pub async fn close(mut self) -> Vec<Arrival> {
        self.stop.cancel();
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout(Duration::from_secs(5), &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
        if let Some(queue) = self.delete.take() {
            if let (Ok(channel), Ok(name)) = (self.connection.create_channel().await, short(&queue))
            {
                let _ = channel
                    .queue_delete(name, QueueDeleteOptions::default())
                    .await;
                // Closed before the connection: a channel dropped open is closed in the
                // background, and that close racing the connection's made lapin log a
                // connection error after every benchmark run with a consumer.
                let _ = channel
                    .close(200, short_lossy("outbox-arrivals done"))
                    .await;
            }
        }
        let _ = self
            .connection
            .close(200, short_lossy("outbox-arrivals done"))
            .await;
        self.arrivals();
        std::mem::take(&mut self.arrivals)
    }

    async fn failure(&mut self) -> anyhow::Error {
        let Some(task) = self.task.take() else {
            return anyhow!("consuming stopped");
        };
        match task.await {
            Ok(Err(e)) => e.context("consuming stopped"),
            Ok(Ok(())) => anyhow!("consuming stopped: the broker cancelled the consumer"),
            Err(e) => anyhow!("the consumer task failed: {e}"),
        }
    }
}

impl Drop for ArrivalConsumer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A queue declared and bound like [`ArrivalConsumer::start`] does, then only counted, never
/// consumed: RabbitMQ's count of the messages it holds, from a passive declare. What a drain
/// with no consumer attached measures (every message the broker took stays in the queue).
pub struct QueueDepth {
    connection: Connection,
    channel: Channel,
    queue: ShortString,
    delete_on_close: bool,
}

impl QueueDepth {
    /// Connects, declares and binds the queue, and purges it if asked.
    pub async fn start(url: &str, spec: &QueueSpec) -> Result<QueueDepth> {
        let properties =
            ConnectionProperties::default().with_connection_name("outbox-queue-depth".into());
        let connection = Connection::connect(url, properties)
            .await
            .context("cannot connect to RabbitMQ")?;
        let channel = connection.create_channel().await?;
        declare(&channel, spec).await?;
        Ok(QueueDepth {
            connection,
            channel,
            queue: short(&spec.queue)?,
            delete_on_close: spec.delete_on_close,
        })
    }

    /// The messages in the queue now (ready ones: nothing consumes them).
    pub async fn count(&self) -> Result<u32> {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let declared = self
            .channel
            .queue_declare(self.queue.clone(), passive, FieldTable::default())
            .await
            .with_context(|| format!("cannot count the messages of queue {}", self.queue))?;
        Ok(declared.message_count())
    }

    /// Deletes the queue if the spec said so, and closes the connection.
    pub async fn close(self) {
        if self.delete_on_close {
            let _ = self
                .channel
                .queue_delete(self.queue.clone(), QueueDeleteOptions::default())
                .await;
        }
        let _ = self
            .connection
            .close(200, short_lossy("outbox-queue-depth done"))
            .await;
    }
}

/// The ids a run committed that have not arrived yet, crossed off as a consumer's arrivals
/// grow (each arrival is looked at once).
#[derive(Debug)]
pub struct Outstanding<'a> {
    ids: HashSet<&'a str>,
    /// Arrivals already looked at.
    seen: usize,
}

impl<'a> Outstanding<'a> {
    pub fn new(ids: impl IntoIterator<Item = &'a str>) -> Outstanding<'a> {
        Outstanding {
            ids: ids.into_iter().collect(),
            seen: 0,
        }
    }

    /// Crosses off the ids of the arrivals after those seen before; how many remain.
    pub fn update(&mut self, arrivals: &[Arrival]) -> usize {
        for arrival in &arrivals[self.seen..] {
            if let Some(id) = arrival.message_id.as_deref() {
                self.ids.remove(id);
            }
        }
        self.seen = arrivals.len();
        self.ids.len()
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// Checks the exchange exists, declares the durable queue, binds it, and purges it if asked;
/// returns how many messages the purge removed. What [`ArrivalConsumer::start`] does before
/// consuming; the benchmark's broker alone without a consumer declares its queue with it too.
pub async fn declare(channel: &Channel, spec: &QueueSpec) -> Result<u32> {
    let passive = ExchangeDeclareOptions {
        passive: true,
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            short(&spec.exchange)?,
            ExchangeKind::Topic,
            passive,
            FieldTable::default(),
        )
        .await
        .with_context(|| {
            format!(
                "exchange {} not found: run `outbox-relay setup` first",
                spec.exchange
            )
        })?;
    channel
        .queue_declare(
            short(&spec.queue)?,
            QueueDeclareOptions::durable(),
            spec.arguments.clone(),
        )
        .await
        .with_context(|| format!("cannot declare queue {}", spec.queue))?;
    channel
        .queue_bind(
            short(&spec.queue)?,
            short(&spec.exchange)?,
            short(&spec.binding_key)?,
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("cannot bind queue {} to {}", spec.queue, spec.exchange))?;
    if !spec.purge {
        return Ok(0);
    }
    let purged = channel
        .queue_purge(short(&spec.queue)?, QueuePurgeOptions::default())
        .await
        .with_context(|| format!("cannot purge queue {}", spec.queue))?;
    Ok(purged)
}

/// The consuming task: records each delivery, acknowledges in batches, and on `stop`
/// acknowledges what is left, closes the channel and returns.
async fn consume(
    channel: Channel,
    mut deliveries: lapin::Consumer,
    tx: mpsc::UnboundedSender<Arrival>,
    stop: CancellationToken,
) -> Result<()> {
    let mut unacked: u32 = 0;
    let mut last_tag = 0;
    loop {
        tokio::select! {
            biased;
            delivery = deliveries.next() => {
                let Some(delivery) = delivery else {
                    ack_up_to(&channel, &mut unacked, last_tag).await?;
                    return Ok(());
                };
                let delivery = delivery.context("delivery failed")?;
                let arrival = Arrival::from_delivery(&delivery, Instant::now());
                last_tag = delivery.delivery_tag;
                unacked += 1;
                // The receiver dropping only means nobody looks any more.
                let _ = tx.send(arrival);
                if unacked >= ACK_BATCH {
                    ack_up_to(&channel, &mut unacked, last_tag).await?;
                }
            }
            () = tokio::time::sleep(ACK_IDLE), if unacked > 0 => {
                ack_up_to(&channel, &mut unacked, last_tag).await?;
            }
            () = stop.cancelled() => {
                ack_up_to(&channel, &mut unacked, last_tag).await?;
                // Closed here, before the connection: a consumer dropped on an open channel
                // cancels and closes it in the background, racing the connection's close
                // (lapin then logs a connection error).
                let _ = channel.close(200, short_lossy("outbox-arrivals done")).await;
                return Ok(());
            }
        }
    }
}

async fn ack_up_to(channel: &Channel, unacked: &mut u32, tag: u64) -> Result<()> {
    if *unacked == 0 {
        return Ok(());
    }
    channel
        .basic_ack(tag, BasicAckOptions { multiple: true })
        .await
        .context("cannot acknowledge deliveries")?;
    *unacked = 0;
    Ok(())
}

impl Arrival {
    fn from_delivery(delivery: &lapin::message::Delivery, received_at: Instant) -> Arrival {
        let properties = &delivery.properties;
        let header = |name: &str| {
            properties
                .headers()
                .as_ref()
                .and_then(|table| table.inner().get(name))
                .and_then(header_text)
        };
        Arrival {
            message_id: properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str().to_string()),
            seq: header(SEQ_HEADER),
            lsn: header(LSN_HEADER),
            redelivered: delivery.redelivered,
            received_at,
        }
    }
}

fn header_text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

/// An AMQP short string from configuration: an error, not a panic, over 255 bytes.
fn short(value: &str) -> Result<ShortString> {
    match ShortString::try_new(value) {
        Ok(s) => Ok(s),
        Err(_) => bail!("{value:?} is longer than 255 bytes, too long for an AMQP name"),
    }
}

/// A fixed short string known to fit; empty if it somehow does not.
fn short_lossy(value: &str) -> ShortString {
    ShortString::try_new(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::LongString;

    #[test]
    fn long_names_are_errors_not_panics() {
        let too_long = short(&"q".repeat(256));
        assert!(
            too_long.is_err(),
            "256 bytes accepted: {:?}",
            too_long.map(|s| s.as_str().len())
        );
        let longest = short(&"q".repeat(255));
        assert!(longest.is_ok(), "255 bytes refused: {:?}", longest.err());
    }

    #[test]
    fn outstanding_ids_are_crossed_off_once() {
        let arrival = |id: &str| Arrival {
            message_id: Some(id.to_string()),
            seq: None,
            lsn: None,
            redelivered: false,
            received_at: Instant::now(),
        };
        let mut outstanding = Outstanding::new(["1", "2", "3"]);
        let mut arrivals = vec![arrival("2"), arrival("9")];
        assert_eq!(outstanding.update(&arrivals), 2);
        arrivals.extend([arrival("1"), arrival("3")]);
        assert_eq!(outstanding.update(&arrivals), 0);
        assert!(outstanding.is_empty(), "still outstanding: {outstanding:?}");
    }

    #[test]
    fn header_values_read_as_text() {
        assert_eq!(
            header_text(&AMQPValue::LongString(LongString::from("0/16B6C50"))),
            Some("0/16B6C50".to_string())
        );
        assert_eq!(header_text(&AMQPValue::Boolean(true)), None);
    }
}
