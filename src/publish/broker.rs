//! The broker connection: one confirm-mode channel for publishing, mandatory persistent
//! messages, and a second channel for dead letters under the dead-letter policy.
//!
//! Messages arrive here in the contract's terms, and this is where one becomes lapin's types:
//! [`Publisher::start`] (and `start_dead_letter`) converts it with `outgoing.rs`, once, before
//! its first poll; a returned message goes back the same way (`answer_of`). Only this file
//! and `outgoing.rs` name lapin on the delivery path (`nodes.rs` chooses connections,
//! outbox-common's `amqp.rs` opens them).
//!
//! Owns the lapin connection and nothing else: no ordering, no acknowledgement (that is
//! [`super::delivery`]). It never relies on lapin's auto-recovery: after any channel or
//! connection error every pending confirm fails, and its user rebuilds the session. A blocked
//! connection (broker memory or disk alarm) is reported on a watch so that confirm timeouts
//! can pause instead of reconnecting in a loop.
//!
//! Dead letters of returned messages go out on a channel of their own, many at once: its
//! confirms come back in its own order, so a dead-letter queue slow to confirm holds back no
//! answer of the publishing channel, and the delivery loop settles them past the same confirm
//! barrier as every publish (a dead letter's return riding on another's confirm is seen).
//!
//! A third channel carries nothing but round trips ([`Broker::round_trip`]): the confirm
//! barrier of [`super::delivery`] needs a frame from the broker that is read after every ack
//! frame already being handled, without waiting behind the publishes' confirms.
//!
//! Every step of the setup after the handshake (channels, confirm mode, the exchange's
//! declare) waits at most the connect timeout: a node that took the connection and then reads
//! nothing more (paused, or holding the connection in credit flow) fails the attempt, naming
//! the node, instead of holding the session before it starts.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{
    Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind, PublisherConfirm,
};
use tokio::sync::watch;

use super::nodes::BrokerNodes;
// Public for the benchmark's check that its bare publisher sends the relay's bytes.
pub use super::outgoing::Outgoing;
use super::publisher::{Answer, Pending, Publisher, Returned};
use crate::contract::message::Message;
use crate::error::BrokerError;
use crate::error::{ConfigProblem, Endpoint, RelayError};

/// Any failure of the AMQP client is the broker's: the connection or channel is gone (a
/// passive declare's 404 is told apart before it gets here).
impl From<lapin::Error> for RelayError {
    fn from(error: lapin::Error) -> Self {
        RelayError::Broker(BrokerError::Failed(error.to_string()))
    }
}

/// One basic.publish (lapin's future, boxed): its first poll queues the frames on the
/// connection; it resolves to the confirm future once they are written.
pub(crate) type BasicPublish =
    Pin<Box<dyn Future<Output = Result<PublisherConfirm, lapin::Error>> + Send + 'static>>;

/// A [`Broker::round_trip`] in progress.
pub(crate) type RoundTrip = Pin<Box<dyn Future<Output = Result<(), RelayError>> + Send + 'static>>;

/// How long a polite close may wait for the broker's close-ok.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one setup request (a channel, confirm mode, a declare) may wait for its answer.
const SETUP_TIMEOUT: Duration = outbox_common::pg::CONNECT_TIMEOUT;

pub struct Broker {
    /// `nodes[index]` is the node this connection went to: for errors, and to move on from it.
    nodes: Arc<BrokerNodes>,
    index: usize,
    connection: Connection,
    /// The publishing channel: replaced by [`Broker::reopen`] after the broker closed it over
    /// a message the delivery loop dealt with (nothing else in flight on it).
    channel: Mutex<Channel>,
    /// Exchanges a passive declare found on this connection: a message to any other is
    /// checked before its first publish ([`Publisher::exchange_exists`]).
    known_exchanges: Mutex<HashSet<String>>,
    /// Round trips only (see the module comment).
    round_trips: Channel,
    blocked: watch::Receiver<bool>,
    dead_letters: Option<DeadLetters>,
    /// The connection's error, once it failed.
    lost: watch::Receiver<Option<lapin::Error>>,
}

/// Where dead letters go under the dead-letter policy.
struct DeadLetters {
    exchange: ShortString,
    /// Confirm mode, awaited in its own order (see the module comment).
    channel: Channel,
}

impl Broker {
    /// Connects to the first of `nodes` that answers, preferred one first (see
    /// [`BrokerNodes`]), and opens the publishing channel in confirm mode. Fails with the
    /// last node's error when none answers.
    pub async fn connect(nodes: &Arc<BrokerNodes>) -> Result<Self, RelayError> {
        let mut last_error = None;
        for index in nodes.attempt_order() {
            match Self::connect_to(nodes, index).await {
                Ok(broker) => {
                    nodes.connected(index);
                    return Ok(broker);
                }
                Err(error) => {
                    nodes.connect_failed(index, &error);
                    last_error = Some(error);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| ConfigProblem::NoAmqpUrl.into()))
    }

    async fn connect_to(nodes: &Arc<BrokerNodes>, index: usize) -> Result<Self, RelayError> {
        let properties =
            ConnectionProperties::default().with_connection_name("outbox-relay".into());
        // A broker (or network) that accepts and goes silent would hold the handshake forever.
        let connection = tokio::time::timeout(
            outbox_common::pg::CONNECT_TIMEOUT,
            outbox_common::amqp::open_connection(nodes.node(index).url(), properties),
        )
        .await
        .map_err(|_| RelayError::ConnectTimeout {
            endpoint: Endpoint::RabbitMq,
            seconds: outbox_common::pg::CONNECT_TIMEOUT.as_secs(),
        })?
        .map_err(|e| match login_refused(&e) {
            Some(reply_text) => RelayError::Broker(BrokerError::LoginRefused {
                node: nodes.node(index).address().to_string(),
                reply_text,
            }),
            None => RelayError::Broker(BrokerError::Unreachable {
                node: nodes.node(index).address().to_string(),
                reason: e.to_string(),
            }),
        })?;
        let (blocked_tx, blocked) = watch::channel(false);
        let (lost_tx, lost) = watch::channel(None);
        let mut events = connection.events_listener();
        let events_nodes = Arc::clone(nodes);
        tokio::spawn(async move {
            let node = events_nodes.node(index).address();
            while let Some(event) = events.next().await {
                match event {
                    lapin::Event::ConnectionBlocked(reason) => {
                        tracing::warn!(%node, %reason, "broker blocked publishing; confirm timeouts paused");
                        blocked_tx.send_replace(true);
                    }
                    lapin::Event::ConnectionUnblocked => {
                        tracing::info!(%node, "broker unblocked publishing");
                        blocked_tx.send_replace(false);
                    }
                    // channel.flow: unlike connection.blocked the broker gives no reason and
                    // no promise; a channel it never lets go is what the confirm timeout is for.
                    lapin::Event::SendFlow(active) => {
                        let state = if active { "resumed" } else { "paused" };
                        tracing::warn!(%node, "broker {state} publishing on a channel (channel.flow); the confirm timeout keeps running");
                    }
                    lapin::Event::Error(error) => {
                        events_nodes.connection_lost(index, &error.to_string());
                        lost_tx.send_replace(Some(error));
                    }
                    _ => {}
                }
            }
        });
        let address = nodes.node(index).address();
        let channel = setup(
            address,
            "opening the publishing channel",
            connection.create_channel(),
        )
        .await??;
        let confirms = channel.confirm_select(ConfirmSelectOptions::default());
        setup(address, "turning on publisher confirms", confirms).await??;
        let round_trips = setup(
            address,
            "opening the round-trip channel",
            connection.create_channel(),
        )
        .await??;
        Ok(Self {
            nodes: Arc::clone(nodes),
            index,
            connection,
            channel: Mutex::new(channel),
            known_exchanges: Mutex::new(HashSet::new()),
            round_trips,
            blocked,
            dead_letters: None,
            lost,
        })
    }

    /// [`setup`] on this connection's node; a node that stopped answering is given up: the
    /// next connection tries the node after it first.
    async fn setup<T>(
        &self,
        step: &'static str,
        request: impl Future<Output = Result<T, lapin::Error>>,
    ) -> Result<Result<T, lapin::Error>, RelayError> {
        let answered = setup(self.nodes.node(self.index).address(), step, request).await;
        if let Err(error) = &answered {
            self.nodes.connection_lost(self.index, &error.to_string());
        }
        answered
    }

    /// Ready to deliver to `exchange` (checked passively) and, under the dead-letter policy,
    /// to `dead_letter_exchange`: what every publishing session does first.
    pub async fn prepare(
        &mut self,
        exchange: &str,
        dead_letter_exchange: Option<&str>,
    ) -> Result<(), RelayError> {
        self.check_exchange(exchange).await?;
        if let Some(dead_letters) = dead_letter_exchange {
            self.enable_dead_letters(dead_letters).await?;
        }
        Ok(())
    }

    /// Turns on the dead-letter policy: checks that `exchange` exists (passively) and opens
    /// the channel dead letters are published on.
    pub async fn enable_dead_letters(&mut self, exchange: &str) -> Result<(), RelayError> {
        self.declare_exchange(exchange, true).await?;
        let name = ShortString::try_new(exchange).map_err(|_| {
            RelayError::from(ConfigProblem::ExchangeNameTooLong {
                exchange: exchange.to_string(),
            })
        })?;
        let opening = self.connection.create_channel();
        let channel = self
            .setup("opening the dead-letter channel", opening)
            .await??;
        let confirms = channel.confirm_select(ConfirmSelectOptions::default());
        self.setup("turning on publisher confirms for dead letters", confirms)
            .await??;
        self.dead_letters = Some(DeadLetters {
            exchange: name,
            channel,
        });
        Ok(())
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
            Some(error) => error.into(),
            None => std::future::pending().await,
        }
    }

    /// Checks passively that `exchange` (`--exchange`) exists. A template names no exchange
    /// of its own: each message's rendered exchange is checked by its publish, as a row's
    /// `exchange` column is.
    pub async fn check_exchange(&self, exchange: &str) -> Result<(), RelayError> {
        if crate::contract::template::is_template(exchange) {
            return Ok(());
        }
        self.declare_exchange(exchange, true).await?;
        self.known_exchanges().insert(exchange.to_string());
        Ok(())
    }

    fn known_exchanges(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.known_exchanges
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `exchange` exists: known on this connection, or found now by a passive
    /// declare (a round trip, once per exchange and connection).
    pub async fn exchange_exists(&self, exchange: &str) -> Result<bool, RelayError> {
        if self.known_exchanges().contains(exchange) {
            return Ok(true);
        }
        match self.declare_exchange(exchange, true).await {
            Ok(()) => {
                self.known_exchanges().insert(exchange.to_string());
                Ok(true)
            }
            Err(RelayError::Broker(BrokerError::ExchangeMissing { .. })) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The publishing channel as it is now (a handle: lapin's channels are shared).
    fn publishing_channel(&self) -> Channel {
        self.channel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Opens a new publishing channel in confirm mode in place of one the broker closed.
    /// Only while nothing is in flight on the old one: its confirms are gone with it.
    pub async fn reopen(&self) -> Result<(), RelayError> {
        let opening = self.connection.create_channel();
        let channel = self
            .setup("opening the publishing channel again", opening)
            .await??;
        let confirms = channel.confirm_select(ConfirmSelectOptions::default());
        self.setup("turning on publisher confirms", confirms)
            .await??;
        *self.channel.lock().unwrap_or_else(PoisonError::into_inner) = channel;
        Ok(())
    }

    /// Declares the durable topic exchange (setup), or with `passive` only checks that it
    /// exists (run), on a throwaway channel: a failed declare closes its channel.
    pub async fn declare_exchange(&self, exchange: &str, passive: bool) -> Result<(), RelayError> {
        let opening = self.connection.create_channel();
        let channel = self
            .setup("opening a channel to declare the exchange", opening)
            .await??;
        let options = ExchangeDeclareOptions {
            passive,
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        let name = ShortString::try_new(exchange).map_err(|_| {
            RelayError::from(ConfigProblem::ExchangeNameTooLong {
                exchange: exchange.to_string(),
            })
        })?;
        let declaring =
            channel.exchange_declare(name, ExchangeKind::Topic, options, FieldTable::default());
        let step = match passive {
            true => "checking the exchange",
            false => "declaring the exchange",
        };
        match self.setup(step, declaring).await? {
            Ok(()) => {
                let _ =
                    tokio::time::timeout(CLOSE_TIMEOUT, channel.close(200, "done".into())).await;
                Ok(())
            }
            Err(e) if passive && is_not_found(&e) => {
                Err(RelayError::Broker(BrokerError::ExchangeMissing {
                    exchange: exchange.to_string(),
                }))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// One request the broker answers on this connection (basic.qos on a channel that
    /// consumes nothing: no permission needed, no effect). Its answer is read after every
    /// frame that arrived before the request was sent.
    pub fn round_trip(&self) -> RoundTrip {
        let channel = self.round_trips.clone();
        Box::pin(async move {
            channel.basic_qos(0, BasicQosOptions::default()).await?;
            Ok(())
        })
    }

    /// Closes the connection politely, but never waits long: after a failure the broker may
    /// not answer at all.
    pub async fn close(&self) {
        let closing = self.connection.close(200, "outbox-relay stopping".into());
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, closing).await;
    }
}

/// Awaits one setup request to the node `address`, at most [`SETUP_TIMEOUT`]: the request's
/// own result, or the timeout naming the node and `step`.
async fn setup<T>(
    address: &str,
    step: &'static str,
    request: impl Future<Output = Result<T, lapin::Error>>,
) -> Result<Result<T, lapin::Error>, RelayError> {
    tokio::time::timeout(SETUP_TIMEOUT, request)
        .await
        .map_err(|_| {
            RelayError::Broker(BrokerError::SetupTimeout {
                node: address.to_string(),
                step,
                seconds: SETUP_TIMEOUT.as_secs(),
            })
        })
}

/// Publishes `message` on `channel` (mandatory, so an unroutable one comes back), made into
/// lapin's types here: the one conversion of a publish.
///
/// The first poll of the returned future takes the message's delivery tag and queues its
/// frames on the connection; it then resolves, once the frames are written, to the confirm
/// future. Polling it once and moving on keeps many publishes in flight without waiting for
/// the connection's writer after each one.
fn publish_on(channel: &Channel, message: Message) -> Result<BasicPublish, RelayError> {
    let message = Outgoing::from_message(message)?;
    let channel = channel.clone();
    Ok(Box::pin(async move {
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
    }))
}

/// AMQP reply code 404 NOT_FOUND: what a passive declare of a missing exchange fails with.
const NOT_FOUND: u16 = 404;

fn is_not_found(e: &lapin::Error) -> bool {
    matches!(e.kind(), lapin::ErrorKind::ProtocolError(error) if error.get_id() == NOT_FOUND)
}

/// AMQP reply code 403 ACCESS_REFUSED: what RabbitMQ closes a connection whose login it
/// refused with (the client asks for it: `authentication_failure_close`).
const ACCESS_REFUSED: u16 = 403;
/// AMQP reply code 530 NOT_ALLOWED: what RabbitMQ closes a connection with when the URL's
/// virtual host does not exist or the user may not use it.
const NOT_ALLOWED: u16 = 530;

/// The broker's words when `e` is a refused login or virtual host (without their full stop:
/// the report adds its own).
fn login_refused(e: &lapin::Error) -> Option<String> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(error)
            if matches!(error.get_id(), ACCESS_REFUSED | NOT_ALLOWED) =>
        {
            Some(
                error
                    .get_message()
                    .as_str()
                    .trim_end_matches('.')
                    .to_string(),
            )
        }
        _ => None,
    }
}

/// A publish in flight: its frames still being written, or waiting for the broker's answer.
pub enum Stage {
    Writing(BasicPublish),
    Confirming(PublisherConfirm),
}

impl Stage {
    /// One poll of `publishing`: enough to take the delivery tag and queue the frames.
    async fn started(mut publishing: BasicPublish) -> Result<Stage, RelayError> {
        Ok(match futures_util::poll!(&mut publishing) {
            Poll::Ready(confirm) => Stage::Confirming(confirm?),
            Poll::Pending => Stage::Writing(publishing),
        })
    }

    /// The broker's confirmation. Cancel-safe: progress is kept in the stage.
    async fn confirmation(&mut self) -> Result<Confirmation, lapin::Error> {
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

impl Pending for Stage {
    async fn answer(&mut self) -> Result<Answer, RelayError> {
        answer_of(self.confirmation().await.map_err(publish_error)?)
    }
}

/// A publish's failure: the broker closing the channel with a channel-level (soft) error is
/// the answer to one of the publishes in flight ([`BrokerError::ChannelClosed`], which the
/// delivery loop attributes); anything else is the connection's.
fn publish_error(error: lapin::Error) -> RelayError {
    match error.kind() {
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), lapin::protocol::AMQPErrorKind::Soft(_)) =>
        {
            RelayError::Broker(BrokerError::ChannelClosed {
                reply_code: amqp.get_id(),
                reply_text: amqp.get_message().to_string(),
            })
        }
        _ => error.into(),
    }
}

/// lapin's confirmation as delivery's answer: ack or nack, and the return it carried.
fn answer_of(confirmation: Confirmation) -> Result<Answer, RelayError> {
    let (acked, returned) = match confirmation {
        Confirmation::Ack(returned) => (true, returned),
        Confirmation::Nack(returned) => (false, returned),
        Confirmation::NotRequested => {
            return Err(RelayError::Bug(
                "a publish was answered without a confirm: publisher confirms are not enabled \
                 on its channel"
                    .into(),
            ))
        }
    };
    // Rare (an unroutable message): converting it back costs nothing on the hot path.
    let returned = returned.map(|returned| {
        let delivery = returned.delivery;
        let published = Outgoing {
            exchange: delivery.exchange,
            routing_key: delivery.routing_key,
            properties: delivery.properties,
            body: delivery.data.into(),
        };
        Returned {
            message: published.into_message(),
            reply_code: returned.reply_code,
            reply_text: returned.reply_text.into(),
        }
    });
    Ok(Answer { acked, returned })
}

impl Publisher for Broker {
    type Pending = Stage;
    type RoundTrip = RoundTrip;

    fn start(&self, message: Message) -> impl Future<Output = Result<Stage, RelayError>> + Send {
        // Converted now, at the call: the returned future only polls the publish.
        let publishing = publish_on(&self.publishing_channel(), message);
        async move { Stage::started(publishing?).await }
    }

    fn start_dead_letter(
        &self,
        message: Message,
    ) -> impl Future<Output = Result<Stage, RelayError>> + Send {
        let publishing = match &self.dead_letters {
            Some(dead_letters) => publish_on(&dead_letters.channel, message),
            None => Err(RelayError::Bug(
                "a dead letter was published without the dead-letter policy".into(),
            )),
        };
        async move { Stage::started(publishing?).await }
    }

    fn dead_letter_exchange(&self) -> Option<&str> {
        self.dead_letters.as_ref().map(|d| d.exchange.as_str())
    }

    fn round_trip(&self) -> RoundTrip {
        Broker::round_trip(self)
    }

    fn blocked(&self) -> watch::Receiver<bool> {
        Broker::blocked(self)
    }

    fn exchange_exists(
        &self,
        exchange: &str,
    ) -> impl Future<Output = Result<bool, RelayError>> + Send {
        Broker::exchange_exists(self, exchange)
    }

    fn reopen(&self) -> impl Future<Output = Result<(), RelayError>> + Send {
        Broker::reopen(self)
    }

    fn max_message_size(&self) -> Option<usize> {
        self.nodes.max_message_size()
    }

    fn learn_max_message_size(&self, limit: usize) {
        self.nodes.learn_max_message_size(limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_setup_request_left_unanswered_fails_after_the_connect_timeout_naming_the_node() {
        let began = tokio::time::Instant::now();
        let unanswered = std::future::pending::<Result<(), lapin::Error>>();
        let error = setup(
            "rabbit-2:5672",
            "opening the publishing channel",
            unanswered,
        )
        .await
        .expect_err("a request nobody answers times out");
        assert_eq!(began.elapsed(), SETUP_TIMEOUT);
        assert_eq!(
            error.to_string(),
            "RabbitMQ node rabbit-2:5672 accepted the connection but did not answer opening \
             the publishing channel within 15 s; reconnecting, to the next node if there is one"
        );
        assert_eq!(error.kind().label(), "connect_timeout");
        assert_eq!(error.recovery(), crate::error::SupervisorAction::Retry);
    }
}
