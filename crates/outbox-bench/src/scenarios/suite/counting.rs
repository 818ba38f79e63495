//! Counting a drain's messages: distinct ids at a consumer, or the queue's depth with nothing
//! consuming. A leaf of [`super`], which the suite's runs share.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Result;
use outbox_testkit::arrivals::{Arrival, ArrivalConsumer, QueueDepth, QueueSpec};
use tokio::time::Instant;

/// How often a drain with no consumer asks the broker for the queue's depth: the end of the
/// drain is known to this much (against drains of seconds), at a cost to the broker of one
/// passive declare per interval.
const DEPTH_INTERVAL: Duration = Duration::from_millis(5);

/// What a drain counts its messages with.
pub(super) enum DrainCounter {
    /// Distinct message ids at a consumer, and when each first arrived.
    Consumer(ArrivalConsumer),
    /// The messages in the queue, nothing consuming it (`--no-consumer`): the broker's count
    /// of what it took, duplicates included (a drain without failures publishes none).
    Queue(QueueDepth),
}

impl DrainCounter {
    /// Declares and binds the queue, with a consumer if `consumer`.
    pub(super) async fn start(url: &str, spec: &QueueSpec, consumer: bool) -> Result<DrainCounter> {
        Ok(if consumer {
            DrainCounter::Consumer(ArrivalConsumer::start(url, spec).await?)
        } else {
            DrainCounter::Queue(QueueDepth::start(url, spec).await?)
        })
    }

    /// Waits until `rows` messages were counted, or `deadline`: how many, and when the last
    /// of them was counted (a consumer: its receipt; the queue: the answer of the passive
    /// declare that first counted them all).
    pub(super) async fn wait_for(
        &mut self,
        rows: u64,
        deadline: Instant,
    ) -> Result<(u64, Option<Instant>)> {
        match self {
            DrainCounter::Consumer(consumer) => {
                let mut counter = Distinct::default();
                while (counter.count() as u64) < rows {
                    if !consumer.wait_for_more(deadline).await? {
                        break;
                    }
                    counter.add(consumer.arrivals());
                }
                Ok((counter.count() as u64, counter.last))
            }
            DrainCounter::Queue(depth) => {
                let mut ticks = tokio::time::interval(DEPTH_INTERVAL);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut counted = 0;
                let mut last = None;
                while counted < rows && Instant::now() < deadline {
                    ticks.tick().await;
                    let count = u64::from(depth.count().await?);
                    if count > counted {
                        counted = count;
                        last = Some(Instant::now());
                    }
                }
                Ok((counted, last))
            }
        }
    }

    /// Closes the consumer or the depth watch; the queue is deleted if its spec says so.
    pub(super) async fn close(self) {
        match self {
            DrainCounter::Consumer(consumer) => {
                consumer.close().await;
            }
            DrainCounter::Queue(depth) => depth.close().await,
        }
    }
}

/// Distinct message ids received so far, and when the first and the newest distinct one
/// arrived.
#[derive(Default)]
pub(super) struct Distinct {
    pub(super) ids: HashSet<String>,
    pub(super) seen: usize,
    pub(super) first: Option<Instant>,
    pub(super) last: Option<Instant>,
}

impl Distinct {
    pub(super) fn add(&mut self, arrivals: &[Arrival]) {
        for a in &arrivals[self.seen..] {
            if let Some(id) = &a.message_id {
                if self.ids.insert(id.clone()) {
                    self.first.get_or_insert(a.received_at);
                    self.last = Some(a.received_at);
                }
            }
        }
        self.seen = arrivals.len();
    }

    pub(super) fn count(&self) -> usize {
        self.ids.len()
    }
}
