//! The dead-letter policy (`--on-unroutable dead-letter`): what goes to the dead-letter
//! exchange, with which headers, and why.
//!
//! A message is dead-lettered when the broker returns it as unroutable (basic.return of a
//! mandatory publish), when its source could not make it publishable (over
//! `--max-message-size`, or a row the mapper rejects: a `crate::contract::message::Unpublishable`),
//! when it is routed to an exchange the broker does not have, or when the broker closed the
//! publishing channel over it (a body over its `max_message_size`, a denied exchange).
//! It goes to the dead-letter exchange with the reason in headers, and only once the broker
//! CONFIRMS that publish is the original settled: its position may then be acknowledged like a
//! delivered one. A dead letter the broker cannot route either stops the pipeline (halt),
//! naming the exchange.
//!
//! Pure: building the messages, in the contract's terms (a [`Message`] in, a `Message` out);
//! the broker turns a dead letter into lapin's types like any other message. Publishing them
//! is `publish/delivery`, ordering them `publish/queue`. The only place that decides a message is dead-lettered rather than
//! stopping the relay is `publish/delivery`: sources only say why they could not publish.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::publisher::Returned;
use crate::contract::message::{HeaderValue, Message, Rejection};

/// Headers a dead letter carries on top of the message's own (`x-outbox-lsn`, `x-outbox-seq`,
/// the row's headers).
pub(crate) mod headers {
    /// Why it was dead-lettered, e.g. `unroutable: NO_ROUTE 312 exchange=outbox
    /// routing_key=OrderCreated`, `too large: N bytes > limit L`, `unmappable: <error>`.
    pub(crate) const REASON: &str = "x-outbox-dead-letter-reason";
    /// The exchange the message was meant for.
    pub(crate) const ORIGINAL_EXCHANGE: &str = "x-outbox-original-exchange";
    /// The routing key the message was meant to carry.
    pub(crate) const ORIGINAL_ROUTING_KEY: &str = "x-outbox-original-routing-key";
    /// The size in bytes of a body that was dropped for being too large.
    pub(crate) const ORIGINAL_SIZE: &str = "x-outbox-original-size";
}

/// Why a message went to the dead-letter exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reason {
    /// The broker returned it: no queue is bound for its routing key.
    Unroutable {
        reply_code: u16,
        reply_text: String,
        exchange: String,
        routing_key: String,
    },
    /// Its source could not make it publishable (too large, unmappable, exchange not
    /// allowed), or it is over the limit the broker named when it refused a body.
    Rejected(Rejection),
    /// Routed to an exchange the broker does not have (checked before its first publish).
    ExchangeMissing { exchange: String },
    /// The broker closed the publishing channel over it (a channel error, not a return).
    Refused {
        reply_code: u16,
        reply_text: String,
        exchange: String,
    },
}

impl Reason {
    /// Why the broker returned `returned`, and where it was meant to go.
    pub(crate) fn of_return(returned: &Returned) -> Self {
        Reason::Unroutable {
            reply_code: returned.reply_code,
            reply_text: returned.reply_text.clone(),
            exchange: returned.message.exchange.clone(),
            routing_key: returned.message.routing_key.clone(),
        }
    }

    /// The `reason` label of the dead-lettered metric.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Reason::Unroutable { .. } => "unroutable",
            Reason::Rejected(rejection) => rejection.label(),
            Reason::ExchangeMissing { .. } => "exchange_missing",
            Reason::Refused { .. } => "refused",
        }
    }
}

/// The text of the reason header (never any payload).
impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Unroutable {
                reply_code,
                reply_text,
                exchange,
                routing_key,
            } => write!(
                f,
                "unroutable: {reply_text} {reply_code} exchange={exchange} routing_key={routing_key}"
            ),
            Reason::Rejected(rejection) => rejection.fmt(f),
            Reason::ExchangeMissing { exchange } => write!(f, "exchange missing: {exchange}"),
            Reason::Refused {
                reply_code,
                reply_text,
                exchange,
            } => write!(f, "refused: {reply_text} {reply_code} exchange={exchange}"),
        }
    }
}

/// How often at most the delivery loop writes a WARN about dead letters.
pub(crate) const REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// What the log says about dead letters: the first of a burst at WARN with its id and reason,
/// then at most one line per [`REPORT_INTERVAL`], with the rest counted by reason. One WARN
/// per dead letter flooded the log (11,319 lines in 15 s in a load test) while
/// `outbox_relay_messages_dead_lettered_total{reason}` counts each one, and every dead letter
/// carries its reason in its headers.
#[derive(Debug, Default)]
pub(crate) struct DeadLetterLog {
    last_line: Option<Instant>,
    /// Dead letters since the last line, by reason label.
    held: BTreeMap<&'static str, u64>,
}

impl DeadLetterLog {
    /// A dead letter was confirmed at `now`: the line to log, if one is due.
    pub(crate) fn record(
        &mut self,
        message_id: &str,
        reason: &Reason,
        now: Instant,
    ) -> Option<String> {
        let due = self
            .last_line
            .is_none_or(|last| now.duration_since(last) >= REPORT_INTERVAL);
        if !due {
            *self.held.entry(reason.label()).or_default() += 1;
            return None;
        }
        self.last_line = Some(now);
        let mut line = format!("message {message_id} dead-lettered ({reason})");
        if let Some((total, by_reason)) = self.take_held() {
            line.push_str(&format!(
                "; {total} more since the last report ({by_reason})"
            ));
        }
        Some(line)
    }

    /// What was counted and not reported yet, when the loop ends.
    pub(crate) fn flush(&mut self) -> Option<String> {
        self.take_held().map(|(total, by_reason)| {
            format!("{total} more messages dead-lettered since the last report ({by_reason})")
        })
    }

    /// How many were held, and "unroutable 10, too_large 2"; the count cleared.
    fn take_held(&mut self) -> Option<(u64, String)> {
        let total: u64 = self.held.values().sum();
        if total == 0 {
            return None;
        }
        let by_reason: Vec<String> = std::mem::take(&mut self.held)
            .into_iter()
            .map(|(label, n)| format!("{label} {n}"))
            .collect();
        Some((total, by_reason.join(", ")))
    }
}

/// The dead letter for `original` (a message as it would have been published, as far as its
/// source could read it, or as the broker returned it): the same id, properties and headers,
/// plus the reason and the original destination, published to `dead_letter_exchange` with
/// the original routing key (a topic exchange can be bound per event type; bind `#` for all).
/// Persistent like every message the relay publishes: the broker's conversion makes it so.
pub(crate) fn dead_letter(
    dead_letter_exchange: &str,
    mut original: Message,
    reason: &Reason,
) -> Message {
    let exchange = std::mem::replace(&mut original.exchange, dead_letter_exchange.to_string());
    let routing_key = original.routing_key.clone();
    original.set_header(headers::REASON, reason.to_string().into());
    original.set_header(headers::ORIGINAL_EXCHANGE, exchange.into());
    original.set_header(headers::ORIGINAL_ROUTING_KEY, routing_key.into());
    if let Reason::Rejected(Rejection::TooLarge { size, .. }) = reason {
        let size = i64::try_from(*size).unwrap_or(i64::MAX);
        original.set_header(headers::ORIGINAL_SIZE, HeaderValue::Int(size));
        // The body is what the broker would not take.
        original.body = Bytes::new();
    }
    original
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_dead_letters_is_one_line_then_one_per_interval_with_the_rest_counted() {
        let mut log = DeadLetterLog::default();
        let start = Instant::now();
        let unroutable = Reason::ExchangeMissing {
            exchange: "gone".into(),
        };
        let too_large = Reason::Rejected(Rejection::TooLarge { size: 9, limit: 8 });
        assert_eq!(
            log.record("m0", &unroutable, start).as_deref(),
            Some("message m0 dead-lettered (exchange missing: gone)")
        );
        let lines = (1..1000)
            .filter_map(|i| {
                let reason = if i % 10 == 0 { &too_large } else { &unroutable };
                let at = start + REPORT_INTERVAL * i / 1000;
                log.record(&format!("m{i}"), reason, at)
            })
            .count();
        assert_eq!(lines, 0, "nothing more within the interval");
        assert_eq!(
            log.record("m1000", &unroutable, start + REPORT_INTERVAL)
                .as_deref(),
            Some(
                "message m1000 dead-lettered (exchange missing: gone); 999 more since the \
                 last report (exchange_missing 900, too_large 99)"
            )
        );
        assert_eq!(log.flush(), None, "nothing held after a line");
        log.record("m1001", &too_large, start + REPORT_INTERVAL);
        assert_eq!(
            log.flush().as_deref(),
            Some("1 more messages dead-lettered since the last report (too_large 1)")
        );
    }

    fn header(message: &Message, name: &str) -> Option<HeaderValue> {
        message.header(name).cloned()
    }

    fn text(s: &str) -> Option<HeaderValue> {
        Some(HeaderValue::Text(s.into()))
    }

    fn original() -> Message {
        Message {
            message_id: "m1".into(),
            exchange: "outbox".into(),
            routing_key: "Nobody".into(),
            event_type: Some("Nobody".into()),
            content_type: None,
            timestamp: None,
            headers: vec![("x-outbox-seq".into(), HeaderValue::Text("0A-01".into()))],
            body: Bytes::from_static(b"{\"a\":1}"),
            position: None,
        }
    }

    #[test]
    fn unroutable_keeps_the_message_and_names_where_it_was_going() {
        let returned = Returned {
            message: original(),
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
        };
        let reason = Reason::of_return(&returned);
        assert_eq!(
            reason,
            Reason::Unroutable {
                reply_code: 312,
                reply_text: "NO_ROUTE".into(),
                exchange: "outbox".into(),
                routing_key: "Nobody".into(),
            }
        );
        let dl = dead_letter("dlx", returned.message, &reason);
        assert_eq!(dl.exchange, "dlx");
        assert_eq!(dl.routing_key, "Nobody");
        assert_eq!(&dl.body[..], b"{\"a\":1}");
        assert_eq!(dl.message_id, "m1");
        assert_eq!(
            header(&dl, headers::REASON),
            text("unroutable: NO_ROUTE 312 exchange=outbox routing_key=Nobody")
        );
        assert_eq!(header(&dl, headers::ORIGINAL_EXCHANGE), text("outbox"));
        assert_eq!(header(&dl, headers::ORIGINAL_ROUTING_KEY), text("Nobody"));
        assert_eq!(header(&dl, "x-outbox-seq"), text("0A-01"));
        assert_eq!(header(&dl, headers::ORIGINAL_SIZE), None);
        assert_eq!(reason.label(), "unroutable");
    }

    #[test]
    fn too_large_drops_the_body_and_records_its_size() {
        let reason = Reason::Rejected(Rejection::TooLarge {
            size: 20_000_000,
            limit: 16_777_216,
        });
        let dl = dead_letter("dlx", original(), &reason);
        assert!(dl.body.is_empty());
        assert_eq!(
            header(&dl, headers::ORIGINAL_SIZE),
            Some(HeaderValue::Int(20_000_000))
        );
        assert_eq!(
            header(&dl, headers::REASON),
            text("too large: 20000000 bytes > limit 16777216")
        );
        assert_eq!(reason.label(), "too_large");
    }

    #[test]
    fn unmappable_carries_the_error() {
        let reason = Reason::Rejected(Rejection::Unmappable {
            error: "column \"event_type\" is NULL".into(),
        });
        let dl = dead_letter("dlx", original(), &reason);
        assert_eq!(&dl.body[..], b"{\"a\":1}");
        assert_eq!(
            header(&dl, headers::REASON),
            text("unmappable: column \"event_type\" is NULL")
        );
        assert_eq!(reason.label(), "unmappable");
    }

    #[test]
    fn an_exchange_not_allowed_names_it_and_where_it_was_meant_to_go() {
        let reason = Reason::Rejected(Rejection::ExchangeNotAllowed {
            exchange: "billing".into(),
        });
        let mut meant = original();
        meant.exchange = "billing".into();
        let dl = dead_letter("dlx", meant, &reason);
        assert_eq!(dl.exchange, "dlx");
        assert_eq!(
            header(&dl, headers::REASON),
            text("exchange not allowed: billing")
        );
        assert_eq!(header(&dl, headers::ORIGINAL_EXCHANGE), text("billing"));
        assert_eq!(reason.label(), "exchange_not_allowed");
    }
}
