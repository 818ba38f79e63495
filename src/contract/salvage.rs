//! What could be read of a row (or an emitted event) the contract rejected: its id,
//! destination, headers and body as far as they are readable, through the contract's defaults
//! ([`Mapper::unpublishable`]). That is the [`Unpublishable`] a source hands delivery in place
//! of a message, the raw material of its dead letter. A row without a readable id is described
//! by nothing (`original: None`): a dead letter without an id could not be told apart, so such
//! a row always stops the relay.

use std::borrow::Cow;

use bytes::Bytes;

use crate::contract::columns;
use crate::contract::headers::insert_stream_headers;
use crate::contract::mapper::{body, header_table, optional_str, Layout, Mapper};
use crate::contract::message::{Headers, Message, Unpublishable, MAX_SHORT_TEXT};
use crate::contract::position::Position;
use crate::contract::row_error::{MapError, RowRef};
use crate::pgoutput::{Tuple, TupleValue};

impl Mapper {
    /// [`map`](Self::map), or what can be read of a row that cannot be published, and why.
    pub fn map_row(
        &self,
        layout: &Layout,
        tuple: &Tuple,
        position: Option<Position>,
    ) -> Result<Message, Box<Unpublishable>> {
        self.map(layout, tuple, position).map_err(|error| {
            let readable = readable_row(layout, tuple, position, &error);
            self.unpublishable(readable, position, error)
        })
    }

    /// A row or event `error` rejected, with what could be read of it (`None`: nothing that
    /// identifies it). What is read goes through the contract's defaults (the default
    /// exchange, the event type as routing key, the stream headers), minus what it would
    /// break: a value over AMQP's limit is left out, a body over the size limit left empty.
    pub fn unpublishable(
        &self,
        readable: Option<Readable<'_>>,
        position: Option<Position>,
        error: MapError,
    ) -> Box<Unpublishable> {
        let original = readable
            .filter(|readable| readable.message_id.len() <= MAX_SHORT_TEXT)
            .map(|readable| {
                let fits = |text: Option<&str>| {
                    text.filter(|t| t.len() <= MAX_SHORT_TEXT)
                        .map(str::to_string)
                };
                let event_type = fits(readable.event_type);
                let mut headers = readable.headers;
                insert_stream_headers(&mut headers, position);
                Message {
                    message_id: readable.message_id,
                    exchange: fits(readable.exchange)
                        .unwrap_or_else(|| self.default_exchange().to_string()),
                    routing_key: fits(readable.routing_key)
                        .or_else(|| event_type.clone())
                        .unwrap_or_default(),
                    event_type,
                    content_type: readable.content_type.map(Cow::Borrowed),
                    timestamp: None,
                    headers,
                    body: if readable.body.len() > self.max_message_size() {
                        Bytes::new()
                    } else {
                        readable.body
                    },
                    position,
                }
            });
        Box::new(Unpublishable {
            original,
            rejection: error.rejection(),
            message_id: error.row_id().map(str::to_string),
            problem: error.to_string(),
            fault: error.fault(),
        })
    }
}

/// What could be read of a rejected row or event: the raw material of its description.
#[derive(Debug)]
pub struct Readable<'a> {
    pub message_id: String,
    pub event_type: Option<&'a str>,
    pub exchange: Option<&'a str>,
    pub routing_key: Option<&'a str>,
    pub body: Bytes,
    pub content_type: Option<&'static str>,
    pub headers: Headers,
}

/// What can be read of a row `map` rejected: its id, destination and headers when readable,
/// and its body (decoded, or else as it arrived). `None` when the row has no usable id or
/// does not match its Relation.
fn readable_row<'a>(
    layout: &Layout,
    tuple: &'a Tuple,
    position: Option<Position>,
    error: &MapError,
) -> Option<Readable<'a>> {
    let values = &tuple.0;
    if values.len() != layout.width {
        return None;
    }
    let message_id = error.row_id()?.to_string();
    let row = || RowRef::row(Some(message_id.clone()), position);
    let readable =
        |index: Option<usize>, column| optional_str(values, index, column, &row).ok().flatten();
    let body = body(layout, values, &row)
        .or_else(|_| match layout.payload.and_then(|(i, _)| values.get(i)) {
            Some(TupleValue::Text(raw) | TupleValue::Binary(raw)) => Ok(raw.clone()),
            _ => Err(()),
        })
        .unwrap_or_default();
    Some(Readable {
        event_type: readable(Some(layout.event_type), columns::EVENT_TYPE),
        exchange: readable(layout.exchange, columns::EXCHANGE),
        routing_key: readable(layout.routing_key, columns::ROUTING_KEY),
        body,
        content_type: layout.payload.map(|(_, kind)| kind.content_type()),
        headers: layout
            .headers
            .and_then(|i| header_table(&values[i], &row).ok())
            .unwrap_or_default(),
        message_id,
    })
}

#[cfg(test)]
mod tests {
    use crate::contract::columns::ColumnMap;
    use crate::contract::fixtures::*;
    use crate::contract::headers;
    use crate::contract::mapper::Layout;
    use crate::contract::message::{HeaderValue, Rejection};
    use crate::pgoutput::TupleValue;

    #[test]
    fn unpublishable_rows_are_described_as_far_as_they_can_be_read() {
        let layout =
            Layout::for_relation(&outbox_relation(), &ColumnMap::default()).expect("layout");
        let header_text = |s: &str| Some(HeaderValue::Text(s.into()));

        assert!(mapper().map_row(&layout, &full_row(), Some(pos())).is_ok());

        // Too large: the body is dropped; destination and stream headers kept.
        let mut big = full_row();
        big.0[2] = text(&"x".repeat(2000));
        let unpublishable = mapper()
            .map_row(&layout, &big, Some(pos()))
            .expect_err("too large");
        assert_eq!(
            unpublishable.rejection,
            Rejection::TooLarge {
                size: 2000,
                limit: 1024
            }
        );
        assert_eq!(unpublishable.message_id.as_deref(), Some(ID));
        assert!(
            unpublishable.problem.contains(ID),
            "{}",
            unpublishable.problem
        );
        let m = unpublishable.original.expect("described");
        assert_eq!(m.exchange, "outbox");
        assert_eq!(m.routing_key, "OrderCreated");
        assert_eq!(m.message_id, ID);
        assert!(m.body.is_empty());
        assert_eq!(
            m.header(headers::SEQ).cloned(),
            header_text("00000000016B6C50-00000003")
        );

        // Unmappable: the payload travels (it is within the limit), the reason names the column.
        let mut null_type = full_row();
        null_type.0[1] = TupleValue::Null;
        let unpublishable = mapper()
            .map_row(&layout, &null_type, Some(pos()))
            .expect_err("null event type");
        assert_eq!(
            unpublishable.rejection,
            Rejection::Unmappable {
                error: "column \"event_type\" is NULL".into()
            }
        );
        let m = unpublishable.original.expect("described");
        assert_eq!(&m.body[..], br#"{"order_id": 42}"#);
        assert_eq!(m.routing_key, "", "no event type to route by");

        // No id: nothing would identify it, so nothing describes it.
        let mut no_id = full_row();
        no_id.0[0] = TupleValue::Null;
        let unpublishable = mapper()
            .map_row(&layout, &no_id, Some(pos()))
            .expect_err("no id");
        assert_eq!(unpublishable.original, None);
        assert_eq!(unpublishable.message_id, None);
    }
}
