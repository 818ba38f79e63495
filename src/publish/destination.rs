//! Where WAL mode delivers: an exchange over AMQP 0-9-1 ([`Broker`]), or a stream over the
//! stream protocol ([`StreamDestination`], `--stream`). One type for the session to hold, so
//! that the delivery loop, its helpers and the teardown stay the same for both.

use tokio::sync::watch;

use super::broker::{self, Broker};
use super::publisher::{Answer, Pending, Publisher};
use super::stream::{StreamDestination, StreamPending};
use crate::contract::message::Message;
use crate::error::RelayError;

// One per session, behind an Arc: boxing a variant would save nothing that matters.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Destination {
    Exchange(Broker),
    Stream(StreamDestination),
}

impl Destination {
    /// Resolves when the connection is known lost, with the error that says so: the stream
    /// client's producer reports its connection's end. The AMQP broker's loss shows in its
    /// confirms instead, so for it this never resolves.
    pub(crate) async fn lost(&self) -> RelayError {
        match self {
            Destination::Exchange(_) => std::future::pending().await,
            Destination::Stream(stream) => stream.lost().await,
        }
    }

    /// Closes the connection, politely and briefly.
    pub(crate) async fn close(&self) {
        match self {
            Destination::Exchange(broker) => broker.close().await,
            Destination::Stream(stream) => stream.close().await,
        }
    }
}

/// A publish in flight to either destination.
pub(crate) enum DestinationPending {
    Exchange(<Broker as Publisher>::Pending),
    Stream(StreamPending),
}

impl Pending for DestinationPending {
    async fn answer(&mut self) -> Result<Answer, RelayError> {
        match self {
            DestinationPending::Exchange(pending) => pending.answer().await,
            DestinationPending::Stream(pending) => pending.answer().await,
        }
    }
}

impl Publisher for Destination {
    type Pending = DestinationPending;
    type RoundTrip = broker::RoundTrip;

    async fn start(&self, message: Message) -> Result<DestinationPending, RelayError> {
        Ok(match self {
            Destination::Exchange(broker) => {
                DestinationPending::Exchange(broker.start(message).await?)
            }
            Destination::Stream(stream) => DestinationPending::Stream(stream.start(message).await?),
        })
    }

    async fn start_dead_letter(&self, message: Message) -> Result<DestinationPending, RelayError> {
        Ok(match self {
            Destination::Exchange(broker) => {
                DestinationPending::Exchange(broker.start_dead_letter(message).await?)
            }
            Destination::Stream(stream) => {
                DestinationPending::Stream(stream.start_dead_letter(message).await?)
            }
        })
    }

    fn dead_letter_exchange(&self) -> Option<&str> {
        match self {
            Destination::Exchange(broker) => broker.dead_letter_exchange(),
            Destination::Stream(stream) => stream.dead_letter_exchange(),
        }
    }

    fn round_trip(&self) -> Self::RoundTrip {
        match self {
            Destination::Exchange(broker) => broker.round_trip(),
            Destination::Stream(stream) => stream.round_trip(),
        }
    }

    fn blocked(&self) -> watch::Receiver<bool> {
        match self {
            Destination::Exchange(broker) => broker.blocked(),
            Destination::Stream(stream) => stream.blocked(),
        }
    }

    async fn exchange_exists(&self, exchange: &str) -> Result<bool, RelayError> {
        match self {
            Destination::Exchange(broker) => broker.exchange_exists(exchange).await,
            Destination::Stream(stream) => stream.exchange_exists(exchange).await,
        }
    }

    async fn reopen(&self) -> Result<(), RelayError> {
        match self {
            Destination::Exchange(broker) => broker.reopen().await,
            Destination::Stream(stream) => stream.reopen().await,
        }
    }

    fn max_message_size(&self) -> Option<usize> {
        match self {
            Destination::Exchange(broker) => broker.max_message_size(),
            Destination::Stream(stream) => stream.max_message_size(),
        }
    }

    fn learn_max_message_size(&self, limit: usize) {
        match self {
            Destination::Exchange(broker) => broker.learn_max_message_size(limit),
            Destination::Stream(stream) => stream.learn_max_message_size(limit),
        }
    }
}
