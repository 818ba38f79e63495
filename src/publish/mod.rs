//! Publishing to RabbitMQ: one confirm-mode channel, mandatory persistent messages, and the
//! in-order confirm queue that decides what may be acknowledged to PostgreSQL.
//!
//! We never rely on lapin's auto-recovery: after any channel or connection error every pending
//! confirm is failed, the session is rebuilt, and the slot replays from the last acknowledged
//! position. A blocked connection (broker memory or disk alarm) is reported on a watch so
//! that confirm timeouts can pause instead of reconnecting in a loop.
//!
//! Under the dead-letter policy a returned message is re-published to the dead-letter
//! exchange on a channel of its own, one dead letter at a time: lapin may attach a return to
//! another confirm of the same channel, and a dead letter's return reported on a later
//! publish's confirm would be seen too late. Alone on its channel, a dead letter's return
//! comes with its own confirm.

pub mod queue;

use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use lapin::Confirmation;

use queue::{ConfirmQueue, Failure, Returned, Settled};

use std::future::Future;
use std::pin::Pin;

use futures_util::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind, PublisherConfirm};
use tokio::sync::watch;

use crate::dead_letter::{self, ReturnedContent};
use crate::error::RelayError;
use crate::mapper::OutboxMessage;
use crate::observability::{DEAD_LETTERED_TOTAL, REASON_LABEL};

/// A publish whose frames are queued on the connection: resolves to its confirm future once
/// they are written.
pub type Publishing =
    Pin<Box<dyn Future<Output = Result<PublisherConfirm, lapin::Error>> + Send + 'static>>;

/// What a broker connect timeout names ([`RelayError::ConnectTimeout`]).
pub const RABBITMQ: &str = "RabbitMQ";

/// How long a polite close may wait for the broker's close-ok.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

pub struct Broker {
    connection: Connection,
    channel: Channel,
    blocked: watch::Receiver<bool>,
    dead_letters: Option<DeadLetters>,
    /// The connection's error, once it failed.
    lost: watch::Receiver<Option<lapin::Error>>,
}

/// Where dead letters go under the dead-letter policy.
struct DeadLetters {
    exchange: lapin::types::ShortString,
    /// Confirm mode, one publish outstanding at a time (see the module comment).
    channel: Channel,
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
            what: RABBITMQ,
            seconds: crate::db::CONNECT_TIMEOUT.as_secs(),
        })?
        .map_err(RelayError::Broker)?;
        let (blocked_tx, blocked) = watch::channel(false);
        let (lost_tx, lost) = watch::channel(None);
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
                    lapin::Event::Error(error) => {
                        lost_tx.send_replace(Some(error));
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
            dead_letters: None,
            lost,
        })
    }

    /// Turns on the dead-letter policy: checks that `exchange` exists (passively) and opens
    /// the channel dead letters are published on.
    pub async fn enable_dead_letters(&mut self, exchange: &str) -> Result<(), RelayError> {
        self.declare_exchange(exchange, true).await?;
        let name = lapin::types::ShortString::try_new(exchange).map_err(|_| {
            RelayError::Config(format!("Exchange name {exchange:?} is over 255 bytes"))
        })?;
        let channel = self.connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        self.dead_letters = Some(DeadLetters {
            exchange: name,
            channel,
        });
        Ok(())
    }

    /// The dead-letter exchange, when the dead-letter policy is on.
    pub fn dead_letter_exchange(&self) -> Option<&lapin::types::ShortString> {
        self.dead_letters.as_ref().map(|d| &d.exchange)
    }

    /// `true` while the broker blocks this connection's publishes.
    pub fn blocked(&self) -> watch::Receiver<bool> {
        self.blocked.clone()
    }

    /// Resolves to the connection's error once it fails (never, while it works): lets a
    /// user that is not publishing notice a dead broker connection without a publish.
    pub async fn lost(&self) -> RelayError {
        let mut lost = self.lost.clone();
        // Err: the event stream ended with the connection object; its users see that.
        let error = match lost.wait_for(Option::is_some).await {
            Ok(error) => error.clone(),
            Err(_) => None,
        };
        match error {
            Some(error) => RelayError::Broker(error),
            None => std::future::pending().await,
        }
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
        publish_on(self.channel.clone(), message)
    }

    /// Closes the connection politely, but never waits long: after a failure the broker may
    /// not answer at all.
    pub async fn close(&self) {
        let closing = self.connection.close(200, "outbox-relay stopping".into());
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, closing).await;
    }
}

/// [`Broker::publish`] on `channel`.
fn publish_on(channel: Channel, message: OutboxMessage) -> Publishing {
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
        Self::started(broker.publish(message)).await
    }

    async fn started(mut publishing: Publishing) -> Result<Stage, lapin::Error> {
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

/// What [`settle_front`] did with the front publish.
pub enum Settle<P> {
    /// The front is not a publish (ack points first).
    Waiting,
    /// Settled: confirmed, or its dead letter confirmed.
    Settled(Settled<P>),
    /// Returned as unroutable and re-published to the dead-letter exchange: it stays at the
    /// front, now awaiting its dead letter's confirm.
    DeadLettering,
}

/// Feeds the broker's answer for the front publish into `queue`: the settled publish, or the
/// error that stops the pipeline. A return carried by this confirm is recorded for whichever
/// publish it names (lapin 4 may attach it to another). Under the dead-letter policy a
/// returned front is re-published to the dead-letter exchange instead of failing.
pub async fn settle_front<P: AsMut<Stage>>(
    queue: &mut ConfirmQueue<P>,
    confirmation: Result<Confirmation, lapin::Error>,
    broker: &Broker,
) -> Result<Settle<P>, RelayError> {
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
        let delivery = returned.delivery;
        let message_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_string())
            .unwrap_or_default();
        queue.record_return(
            message_id,
            Returned {
                exchange: delivery.exchange.as_str().to_string(),
                routing_key: delivery.routing_key.as_str().to_string(),
                reply_code: returned.reply_code,
                reply_text: returned.reply_text.as_str().to_string(),
                content: ReturnedContent {
                    properties: delivery.properties,
                    body: delivery.data.into(),
                },
            },
        );
    }
    match queue.settle_front(acked) {
        None => Ok(Settle::Waiting),
        Some(Ok(settled)) => {
            if let Some(reason) = &settled.dead_lettered {
                metrics::counter!(DEAD_LETTERED_TOTAL, REASON_LABEL => reason.label()).increment(1);
                tracing::warn!(
                    message_id = %settled.message_id,
                    reason = %reason,
                    "message dead-lettered: the dead-letter exchange confirmed it"
                );
            }
            Ok(Settle::Settled(settled))
        }
        Some(Err(Failure::Nacked { message_id })) => Err(RelayError::Nacked { message_id }),
        Some(Err(Failure::Returned {
            message_id,
            returned,
        })) => match &broker.dead_letters {
            Some(dead_letters) => {
                let reason = returned.reason();
                let message = dead_letter::for_returned(
                    &dead_letters.exchange,
                    message_id,
                    returned.content,
                    &reason,
                );
                let stage =
                    Stage::started(publish_on(dead_letters.channel.clone(), message)).await?;
                if let Some(front) = queue.dead_letter_front(reason) {
                    *front.as_mut() = stage;
                }
                Ok(Settle::DeadLettering)
            }
            None => Err(RelayError::Returned {
                message_id,
                exchange: returned.exchange,
                routing_key: returned.routing_key,
                reply_code: returned.reply_code,
                reply_text: returned.reply_text,
            }),
        },
        Some(Err(Failure::DeadLetterReturned {
            message_id,
            returned,
        })) => Err(RelayError::DeadLetterReturned {
            message_id,
            exchange: returned.exchange,
            routing_key: returned.routing_key,
            reply_code: returned.reply_code,
            reply_text: returned.reply_text,
        }),
    }
}

impl AsMut<Stage> for Stage {
    fn as_mut(&mut self) -> &mut Stage {
        self
    }
}

/// Awaits the confirms of a batch in publish order. Any nack, any return (matched to its
/// publish by message id, whichever confirm carried it) unless the dead-letter policy sends
/// it to the dead-letter exchange, a closed channel or a confirm that does not come within
/// `timeout` (paused while the broker blocks publishers) fails the batch.
pub async fn await_confirms(
    queue: &mut ConfirmQueue<Stage>,
    broker: &Broker,
    timeout: Duration,
) -> Result<(), RelayError> {
    let mut blocked = broker.blocked();
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
                settle_front(queue, confirmation, broker).await?;
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
