//! Publishing to RabbitMQ: one confirm-mode channel, mandatory persistent messages, and the
//! in-order confirm queue that decides what may be acknowledged to PostgreSQL.
//!
//! We never rely on lapin's auto-recovery: after any channel or connection error every pending
//! confirm is failed, the session is rebuilt, and the slot replays from the last acknowledged
//! position. A blocked connection (broker memory or disk alarm) is reported on a watch so
//! that confirm timeouts can pause instead of reconnecting in a loop.

pub mod queue;

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
        let connection = Connection::connect(url, properties)
            .await
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

    pub async fn close(&self) {
        let _ = self
            .connection
            .close(200, "outbox-relay stopping".into())
            .await;
    }
}

fn is_not_found(e: &lapin::Error) -> bool {
    // A passive declare of a missing exchange fails with channel error 404 NOT_FOUND.
    e.to_string().contains("NOT_FOUND") || e.to_string().contains("404")
}
