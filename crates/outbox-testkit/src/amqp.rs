//! AMQP helpers: the topology a test declares or changes behind the relay's back, publishing
//! with confirms, and a consumer that collects a queue into a list a test can wait on. Each
//! topology call uses a connection of its own, so none shares a channel with the consumer
//! (a channel error from a failed declare would close it); it must never be used by the
//! relay's own publishing path.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long a test waits for lapin to connect or to close a connection. Seen once in the
/// cluster tests: a helper's call stuck for good with no socket left open, between one
/// connection's close and the next one's connect.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Connects on the current tokio runtime; panics if that fails or takes 30 s.
pub async fn amqp_connect(url: &str) -> Connection {
    let connect = Connection::connect(url, ConnectionProperties::default());
    match tokio::time::timeout(CONNECTION_TIMEOUT, connect).await {
        Ok(connected) => connected.unwrap_or_else(|e| panic!("connect to {url}: {e:?}")),
        Err(_) => panic!("connect to {url}: not connected after {CONNECTION_TIMEOUT:?}"),
    }
}

/// Runs `act` on a channel of a connection of its own, then closes the connection.
async fn with_channel<T, F, Fut>(url: &str, act: F) -> T
where
    F: FnOnce(Channel) -> Fut,
    Fut: Future<Output = T>,
{
    let connection = amqp_connect(url).await;
    let channel = connection.create_channel().await.expect("create channel");
    let out = act(channel).await;
    // Best effort: the connection is dropped either way.
    let close = connection.close(200, "OK".into());
    let _ = tokio::time::timeout(CONNECTION_TIMEOUT, close).await;
    out
}

/// Publishes one empty message with id `id` straight into `queue` (default exchange) through
/// `url`, unconfirmed, all of it within `within`: `false` when the node did not take it in
/// time (down, paused, cut off). Never panics: it runs during faults, where a failure is
/// expected and only costs the caller this attempt. The frames are written when it returns
/// `true`; whether the queue ever holds the message is the reader's to find out.
pub async fn try_publish_into(url: &str, queue: &str, id: &str, within: Duration) -> bool {
    let attempt = async {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .ok()?;
        let channel = connection.create_channel().await.ok()?;
        let properties = BasicProperties::default()
            .with_message_id(id.into())
            .with_delivery_mode(2);
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                b"",
                properties,
            )
            .await
            .ok()?;
        let _ = connection.close(200, "OK".into()).await;
        Some(())
    };
    tokio::time::timeout(within, attempt)
        .await
        .ok()
        .flatten()
        .is_some()
}

/// [`with_channel`] for one topology call: its result, or a panic saying `what` failed.
async fn channel_op<T, F, Fut>(url: &str, what: String, act: F) -> T
where
    F: FnOnce(Channel) -> Fut,
    Fut: Future<Output = lapin::Result<T>>,
{
    let result = with_channel(url, act).await;
    result.unwrap_or_else(|e| panic!("{what}: {e:?}"))
}

/// Declares `exchange` as `setup` does: a durable topic exchange (a no-op if it exists with
/// those properties).
pub async fn declare_exchange(url: &str, exchange: &str) {
    let options = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let what = format!("declare exchange {exchange}");
    channel_op(url, what, |channel| async move {
        let kind = ExchangeKind::Topic;
        let arguments = FieldTable::default();
        channel
            .exchange_declare(exchange.into(), kind, options, arguments)
            .await
    })
    .await;
}

/// Declares `exchange` as [`declare_exchange`] does and binds each of `queues` to it with
/// `key`, on a connection of its own, within `timeout`: an error rather than a panic when the
/// node is down, paused or cut off, for a caller that then tries another node.
pub async fn try_declare_and_bind(
    url: &str,
    exchange: &str,
    queues: &[&str],
    key: &str,
    timeout: Duration,
) -> Result<(), String> {
    let attempt = async {
        let properties = ConnectionProperties::default();
        let connection = Connection::connect(url, properties).await?;
        let channel = connection.create_channel().await?;
        let options = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                exchange.into(),
                ExchangeKind::Topic,
                options,
                FieldTable::default(),
            )
            .await?;
        for queue in queues {
            let (options, arguments) = (QueueBindOptions::default(), FieldTable::default());
            channel
                .queue_bind(
                    (*queue).into(),
                    exchange.into(),
                    key.into(),
                    options,
                    arguments,
                )
                .await?;
        }
        // Best effort, as in `with_channel`: the declare and the bindings are done.
        let _ = connection.close(200, "OK".into()).await;
        Ok::<(), lapin::Error>(())
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(done) => done.map_err(|e| format!("{e:?}")),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// Whether `exchange` exists (a passive declare).
pub async fn exchange_exists(url: &str, exchange: &str) -> bool {
    with_channel(url, |channel| async move {
        let options = ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let kind = ExchangeKind::Topic;
        let declared = channel
            .exchange_declare(exchange.into(), kind, options, FieldTable::default())
            .await;
        declared.is_ok()
    })
    .await
}

pub async fn delete_exchange(url: &str, exchange: &str) {
    let what = format!("delete exchange {exchange}");
    channel_op(url, what, |channel| async move {
        let options = ExchangeDeleteOptions::default();
        channel.exchange_delete(exchange.into(), options).await
    })
    .await;
}

/// Declares `exchange` ([`declare_exchange`]), a durable `queue`, and binds them with
/// `binding_key` (`#` for all).
pub async fn declare_bound_queue(url: &str, exchange: &str, queue: &str, binding_key: &str) {
    declare_bound_queue_with_args(url, exchange, queue, binding_key, FieldTable::default()).await;
}

/// [`declare_bound_queue`] with queue arguments (e.g. `x-max-length`, `x-overflow`).
pub async fn declare_bound_queue_with_args(
    url: &str,
    exchange: &str,
    queue: &str,
    binding_key: &str,
    arguments: FieldTable,
) {
    declare_exchange(url, exchange).await;
    let what = format!("declare queue {queue}");
    channel_op(url, what, |channel| async move {
        let options = QueueDeclareOptions::durable();
        channel
            .queue_declare(queue.into(), options, arguments)
            .await
    })
    .await;
    bind_queue(url, queue, exchange, binding_key).await;
}

/// The arguments that make a durable queue a quorum queue (`x-queue-type: quorum`). RabbitMQ
/// 3.10 places a new quorum queue's leader on the node the declaring client is connected to.
pub fn quorum_queue_arguments() -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    arguments
}

/// [`declare_bound_queue`] for a quorum queue ([`quorum_queue_arguments`]), led by the node
/// `url` connects to.
pub async fn declare_bound_quorum_queue(url: &str, exchange: &str, queue: &str, binding_key: &str) {
    let arguments = quorum_queue_arguments();
    declare_bound_queue_with_args(url, exchange, queue, binding_key, arguments).await;
}

pub async fn bind_queue(url: &str, queue: &str, exchange: &str, key: &str) {
    let what = format!("bind {queue} to {exchange} ({key})");
    channel_op(url, what, |channel| async move {
        let (options, arguments) = (QueueBindOptions::default(), FieldTable::default());
        channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                key.into(),
                options,
                arguments,
            )
            .await
    })
    .await;
}

pub async fn unbind_queue(url: &str, queue: &str, exchange: &str, key: &str) {
    let what = format!("unbind {queue} from {exchange} ({key})");
    channel_op(url, what, |channel| async move {
        let arguments = FieldTable::default();
        channel
            .queue_unbind(queue.into(), exchange.into(), key.into(), arguments)
            .await
    })
    .await;
}

/// Deletes `queue` with its messages (a no-op if it does not exist).
pub async fn delete_queue(url: &str, queue: &str) {
    let what = format!("delete queue {queue}");
    channel_op(url, what, |channel| async move {
        let options = QueueDeleteOptions::default();
        channel.queue_delete(queue.into(), options).await
    })
    .await;
}

/// Messages ready in `queue` (passive declare; panics if the queue does not exist).
pub async fn queue_message_count(url: &str, queue: &str) -> u32 {
    let options = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let what = format!("passive declare of queue {queue}");
    let declared = channel_op(url, what, |channel| async move {
        let arguments = FieldTable::default();
        channel
            .queue_declare(queue.into(), options, arguments)
            .await
    })
    .await;
    declared.message_count()
}

/// Publishes `(message_id, body)` pairs as persistent, mandatory messages on one
/// confirm-mode channel and waits for every confirm; panics on a nack or a return.
pub async fn publish_confirmed(
    url: &str,
    exchange: &str,
    routing_key: &str,
    messages: &[(&str, &[u8])],
) {
    with_channel(url, |channel| async move {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm_select");
        let mut confirms = Vec::new();
        for (id, body) in messages {
            let properties = BasicProperties::default()
                .with_message_id((*id).into())
                .with_delivery_mode(2);
            let confirm = channel
                .basic_publish(
                    exchange.into(),
                    routing_key.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    body,
                    properties,
                )
                .await
                .unwrap_or_else(|e| panic!("publish {id}: {e:?}"));
            confirms.push((*id, confirm));
        }
        for (id, confirm) in confirms {
            let confirmation = confirm
                .await
                .unwrap_or_else(|e| panic!("confirm of {id}: {e:?}"));
            assert!(confirmation.is_ack(), "message {id} was nacked");
            assert!(
                confirmation.take_message().is_none(),
                "a message was returned (unroutable) while confirming {id}"
            );
        }
    })
    .await;
}

/// One delivery as a test sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    pub body: Vec<u8>,
    pub message_id: Option<String>,
    /// The AMQP `type` property.
    pub kind: Option<String>,
    pub exchange: String,
    pub routing_key: String,
    /// Header values as JSON: strings, numbers, booleans; nested tables as objects.
    pub headers: BTreeMap<String, serde_json::Value>,
    /// Seconds since the Unix epoch.
    pub timestamp: Option<u64>,
    pub content_type: Option<String>,
    pub delivery_mode: Option<u8>,
    pub redelivered: bool,
}

impl Received {
    /// The body parsed as JSON; panics if it is not.
    pub fn body_json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body of {:?} is not JSON ({e}): {}",
                self.message_id,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header_str(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.as_str()
    }

    pub fn header_u64(&self, name: &str) -> Option<u64> {
        self.headers.get(name)?.as_u64()
    }

    fn from_delivery(delivery: lapin::message::Delivery, keep_content: bool) -> Received {
        let p = &delivery.properties;
        let headers = match (keep_content, p.headers()) {
            (true, Some(table)) => table
                .inner()
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), amqp_to_json(v)))
                .collect(),
            _ => BTreeMap::new(),
        };
        Received {
            message_id: p.message_id().as_ref().map(|s| s.as_str().to_string()),
            kind: p.kind().as_ref().map(|s| s.as_str().to_string()),
            exchange: delivery.exchange.as_str().to_string(),
            routing_key: delivery.routing_key.as_str().to_string(),
            headers,
            timestamp: *p.timestamp(),
            content_type: p.content_type().as_ref().map(|s| s.as_str().to_string()),
            delivery_mode: *p.delivery_mode(),
            redelivered: delivery.redelivered,
            body: if keep_content {
                delivery.data
            } else {
                Vec::new()
            },
        }
    }
}

/// Converts an AMQP field value to JSON (byte arrays and long strings as lossy UTF-8).
pub fn amqp_to_json(value: &AMQPValue) -> serde_json::Value {
    use serde_json::Value;
    match value {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(v) => (*v).into(),
        AMQPValue::ShortShortUInt(v) => (*v).into(),
        AMQPValue::ShortInt(v) => (*v).into(),
        AMQPValue::ShortUInt(v) => (*v).into(),
        AMQPValue::LongInt(v) => (*v).into(),
        AMQPValue::LongUInt(v) => (*v).into(),
        AMQPValue::LongLongInt(v) => (*v).into(),
        AMQPValue::Float(v) => f64::from(*v).into(),
        AMQPValue::Double(v) => (*v).into(),
        AMQPValue::DecimalValue(d) => Value::String(format!("{}e-{}", d.value, d.scale)),
        AMQPValue::ShortString(s) => Value::String(s.as_str().to_string()),
        AMQPValue::LongString(s) => Value::String(String::from_utf8_lossy(s.as_bytes()).into()),
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(amqp_to_json).collect()),
        AMQPValue::Timestamp(t) => (*t).into(),
        AMQPValue::FieldTable(t) => Value::Object(
            t.inner()
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), amqp_to_json(v)))
                .collect(),
        ),
        AMQPValue::ByteArray(b) => Value::String(String::from_utf8_lossy(b.as_slice()).into()),
        AMQPValue::Void => Value::Null,
    }
}

/// Consumes a queue (auto-ack) in a task on the current runtime and collects what
/// arrives, in arrival order. The test awaits a count, or an event after which nothing more
/// can come ([`crate::faults::settled`]), then asserts.
pub struct Consumer {
    connection: Connection,
    rx: mpsc::UnboundedReceiver<Result<Received, String>>,
    received: Vec<Received>,
    error: Option<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Consumer {
    /// Starts consuming `queue` (which must exist), keeping bodies and headers.
    pub async fn start(url: &str, queue: &str) -> Consumer {
        Self::start_with(url, queue, true).await
    }

    /// Like [`Consumer::start`]; with `keep_content` false only the properties other than
    /// headers are kept (for runs of a million messages).
    pub async fn start_with(url: &str, queue: &str, keep_content: bool) -> Consumer {
        let connection = amqp_connect(url).await;
        let channel = connection.create_channel().await.expect("create channel");
        let mut stream = channel
            .basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("consume {queue}: {e:?}"));
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            // Keeps the channel alive as long as the task runs.
            let _channel = channel;
            while let Some(delivery) = stream.next().await {
                let item = delivery
                    .map(|d| Received::from_delivery(d, keep_content))
                    .map_err(|e| format!("{e:?}"));
                let failed = item.is_err();
                if tx.send(item).is_err() || failed {
                    break;
                }
            }
        });
        Consumer {
            connection,
            rx,
            received: Vec::new(),
            error: None,
            task,
        }
    }

    /// Waits until at least `n` messages have arrived in total, the consumer fails, or
    /// `timeout` passes; returns everything received so far.
    pub async fn wait_for(&mut self, n: usize, timeout: Duration) -> &[Received] {
        let deadline = Instant::now() + timeout;
        while self.received.len() < n && self.error.is_none() {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(item)) => self.push(item),
                Ok(None) | Err(_) => break,
            }
        }
        self.drain_ready();
        &self.received
    }

    /// What has arrived so far (without waiting).
    pub fn received(&mut self) -> &[Received] {
        self.drain_ready();
        &self.received
    }

    /// Takes the message at `index` out of what has arrived: a marker the test published
    /// itself ([`crate::faults::settled`]), so that counts stay those of the relay's messages.
    pub fn remove(&mut self, index: usize) -> Received {
        self.drain_ready();
        self.received.remove(index)
    }

    /// Takes what has arrived so far, leaving the list empty.
    pub fn take(&mut self) -> Vec<Received> {
        self.drain_ready();
        std::mem::take(&mut self.received)
    }

    /// The error that ended consumption (e.g. the broker went away), if any.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Closes the connection (unconsumed messages stay in the queue).
    pub async fn close(self) {
        self.task.abort();
        let _ = self.connection.close(200, "OK".into()).await;
    }

    fn drain_ready(&mut self) {
        while let Ok(item) = self.rx.try_recv() {
            self.push(item);
        }
    }

    fn push(&mut self, item: Result<Received, String>) {
        match item {
            Ok(received) => self.received.push(received),
            Err(e) => self.error = Some(e),
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
