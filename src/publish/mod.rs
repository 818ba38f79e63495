//! Publishing to RabbitMQ: one confirm-mode channel, mandatory persistent messages, and the
//! in-order confirm queue that decides what may be acknowledged to PostgreSQL.
//!
//! We never rely on lapin's auto-recovery: after any channel or connection error every pending
//! confirm is failed, the session is rebuilt, and the slot replays from the last acknowledged
//! position. A blocked connection (broker memory or disk alarm) is reported on a watch so
//! that confirm timeouts can pause instead of reconnecting in a loop.

pub mod queue;

use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use lapin::Confirmation;

use queue::{ConfirmQueue, Failure, Returned};

use std::future::Future;
use std::pin::Pin;

use futures_util::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind, PublisherConfirm};
use tokio::sync::watch;

use crate::error::RelayError;
use crate::mapper::OutboxMessage;

/// A publish whose frames are queued on the connection: resolves to its confirm future once
/// they are written.
pub type Publishing =
    Pin<Box<dyn Future<Output = Result<PublisherConfirm, lapin::Error>> + Send + 'static>>;

/// How long a polite close may wait for the broker's close-ok.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// How errors name the broker (and how readiness tells its timeouts from the database's).
pub const BROKER: &str = "RabbitMQ";

pub struct Broker {
    connection: Connection,
    channel: Channel,
    blocked: watch::Receiver<bool>,
}

impl Broker {
    /// Connects and opens the publishing channel in confirm mode.
    pub async fn connect(url: &str) -> Result<Self, RelayError> {
        let properties =
            ConnectionProperties::default().with_connection_name("outbox-relay".into());
        // A broker (or network) that accepts and goes silent would hold the handshake forever.
        let connection = tokio::time::timeout(
            crate::db::CONNECT_TIMEOUT,
            Connection::connect(url, properties),
        )
        .await
        .map_err(|_| RelayError::ConnectTimeout {
            what: BROKER,
            seconds: crate::db::CONNECT_TIMEOUT.as_secs(),
        })?
        .map_err(RelayError::Broker)?;
        let (blocked_tx, blocked) = watch::channel(false);
        let mut events = connection.events_listener();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                match event {
                    lapin::Event::ConnectionBlocked(reason) => {
                        tracing::warn!(%reason, "broker blocked publishing; confirm timeouts paused");
                        blocked_tx.send_replace(true);
                    }
                    lapin::Event::ConnectionUnblocked => {
                        tracing::info!("broker unblocked publishing");
                        blocked_tx.send_replace(false);
                    }
                    _ => {}
                }
            }
        });
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            connection,
            channel,
            blocked,
        })
    }

    /// `true` while the broker blocks this connection's publishes.
    pub fn blocked(&self) -> watch::Receiver<bool> {
        self.blocked.clone()
    }

    /// Declares the durable topic exchange (setup), or with `passive` only checks that it
    /// exists (run), on a throwaway channel: a failed declare closes its channel.
    pub async fn declare_exchange(&self, exchange: &str, passive: bool) -> Result<(), RelayError> {
        let channel = self.connection.create_channel().await?;
        let options = ExchangeDeclareOptions {
            passive,
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        let name = lapin::types::ShortString::try_new(exchange).map_err(|_| {
            RelayError::Config(format!("Exchange name {exchange:?} is over 255 bytes"))
        })?;
        let declared = channel
            .exchange_declare(name, ExchangeKind::Topic, options, FieldTable::default())
            .await;
        match declared {
            Ok(()) => {
                let _ = channel.close(200, "done".into()).await;
                Ok(())
            }
            Err(e) if passive && is_not_found(&e) => Err(RelayError::ExchangeMissing {
                exchange: exchange.to_string(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Publishes one message (mandatory, so an unroutable one comes back).
    ///
    /// The first poll of the returned future takes the message's delivery tag and queues its
    /// frames on the connection; it then resolves, once the frames are written, to the confirm
    /// future. Polling it once and moving on keeps many publishes in flight without waiting
    /// for the connection's writer after each one.
    pub fn publish(&self, message: OutboxMessage) -> Publishing {
        let channel = self.channel.clone();
        Box::pin(async move {
            channel
                .basic_publish(
                    message.exchange,
                    message.routing_key,
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    &message.body,
                    message.properties,
                )
                .await
        })
    }

    /// Closes the connection politely, but never waits long: after a failure the broker may
    /// not answer at all.
    pub async fn close(&self) {
        let closing = self.connection.close(200, "outbox-relay stopping".into());
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, closing).await;
    }
}

fn is_not_found(e: &lapin::Error) -> bool {
    // A passive declare of a missing exchange fails with channel error 404 NOT_FOUND.
    e.to_string().contains("NOT_FOUND") || e.to_string().contains("404")
}

/// A publish in flight: its frames still being written, or waiting for the broker's answer.
pub enum Stage {
    Writing(Publishing),
    Confirming(PublisherConfirm),
}

impl Stage {
    /// Starts publishing `message`: one poll takes its delivery tag and queues its frames, so
    /// calling this in stream order keeps delivery tags in stream order.
    pub async fn start(broker: &Broker, message: OutboxMessage) -> Result<Stage, lapin::Error> {
        let mut publishing = broker.publish(message);
        Ok(match futures_util::poll!(&mut publishing) {
            Poll::Ready(confirm) => Stage::Confirming(confirm?),
            Poll::Pending => Stage::Writing(publishing),
        })
    }

    /// The broker's answer. Cancel-safe: progress is kept in the stage.
    pub async fn confirmation(&mut self) -> Result<Confirmation, lapin::Error> {
        loop {
            match self {
                Stage::Writing(publishing) => {
                    let confirm = publishing.await?;
                    *self = Stage::Confirming(confirm);
                }
                Stage::Confirming(confirm) => return confirm.await,
            }
        }
    }
}

/// Feeds the broker's answer for the front publish into `queue`: the settled publish's id and
/// what was kept for it, or the error that stops the pipeline. A return carried by this
/// confirm is recorded for whichever publish it names (lapin 4 may attach it to another).
pub fn settle_front<P>(
    queue: &mut ConfirmQueue<P>,
    confirmation: Result<Confirmation, lapin::Error>,
) -> Result<Option<(String, P)>, RelayError> {
    let (acked, returned) = match confirmation? {
        Confirmation::Ack(returned) => (true, returned),
        Confirmation::Nack(returned) => (false, returned),
        Confirmation::NotRequested => {
            return Err(RelayError::Task(
                "publisher confirms are not enabled".into(),
            ))
        }
    };
    if let Some(returned) = returned {
        let message_id = returned
            .delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_string())
            .unwrap_or_default();
        queue.record_return(
            message_id,
            Returned {
                exchange: returned.delivery.exchange.as_str().to_string(),
                routing_key: returned.delivery.routing_key.as_str().to_string(),
                reply_code: returned.reply_code,
                reply_text: returned.reply_text.as_str().to_string(),
            },
        );
    }
    match queue.settle_front(acked) {
        None => Ok(None),
        Some(Ok(settled)) => Ok(Some(settled)),
        Some(Err(Failure::Nacked { message_id })) => Err(RelayError::Nacked { message_id }),
        Some(Err(Failure::Returned {
            message_id,
            returned,
        })) => Err(RelayError::Returned {
            message_id,
            exchange: returned.exchange,
            routing_key: returned.routing_key,
            reply_code: returned.reply_code,
            reply_text: returned.reply_text,
        }),
    }
}

/// Awaits the confirms of a batch in publish order. Any nack, any return (matched to its
/// publish by message id, whichever confirm carried it), a closed channel or a confirm that
/// does not come within `timeout` (paused while the broker blocks publishers) fails the batch.
pub async fn await_confirms(
    queue: &mut ConfirmQueue<Stage>,
    mut blocked: watch::Receiver<bool>,
    timeout: Duration,
) -> Result<(), RelayError> {
    let mut blocked_open = true;
    let mut front_since = Instant::now();
    while queue.front_mut().is_some() {
        let timing = !*blocked.borrow();
        let deadline = front_since + timeout;
        tokio::select! {
            biased;
            confirmation = async {
                match queue.front_mut() {
                    Some(stage) => stage.confirmation().await,
                    None => std::future::pending().await,
                }
            } => {
                front_since = Instant::now();
                settle_front(queue, confirmation)?;
            }
            changed = blocked.changed(), if blocked_open => {
                // Waiting while the broker blocks publishers is its choice, not a lost confirm.
                blocked_open = changed.is_ok();
                front_since = Instant::now();
            }
            () = tokio::time::sleep_until(deadline), if timing => {
                return Err(RelayError::ConfirmTimeout {
                    message_id: queue.front_message_id().unwrap_or_default().to_string(),
                    seconds: timeout.as_secs(),
                });
            }
        }
    }
    Ok(())
}
