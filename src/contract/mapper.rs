//! Row -> message, per the message contract (docs/architecture.md, "The message contract"):
//! the [`Layout`] of the table's Relation, the [`Mapper`] that reads a row by it, and
//! [`Mapper::assemble`], the contract itself, for rows and emitted events (emit.rs) alike.
//!
//! Values arrive as text shaped by the session settings pinned on the replication connection
//! (ISO dates in UTC, hex bytea), so parsing them (pg_text.rs) is exact. The body is a slice of
//! the replication buffer: no payload byte is copied between the socket and the broker's frame.
//!
//! A row that cannot be mapped is a [`MapError`] naming it (row_error.rs); `map_row`
//! (salvage.rs) hands it on as an `Unpublishable`: what could be read of it, and why. What
//! happens to it (stop the relay, naming the row, or a dead letter) is delivery's policy, not
//! the mapper's.
//!
//! Pure and synchronous: it owns the translation, no I/O, and knows no broker client's
//! types (the message is `crate::contract::message`'s). It must never make up a value the
//! contract requires (a NULL `id` or `event_type`, an unchanged-TOAST value, a malformed
//! column is a [`MapError`] naming the row): a message published with a wrong id or type
//! cannot be called back. Only optional columns have defaults (the exchange, the routing key =
//! `event_type`, an empty body for a NULL payload).

use std::borrow::Cow;

use bytes::Bytes;
use time::format_description::well_known::Rfc3339;

use crate::contract::columns::{self, ColumnMap};
use crate::contract::headers::insert_stream_headers;
use crate::contract::message::{HeaderValue, Headers, Message, MAX_SHORT_TEXT};
use crate::contract::pg_text::{
    decode_bytea_hex, headers_from_json, parse_timestamptz_at, type_oid, uuid_text,
};
use crate::contract::position::Position;
use crate::contract::row_error::{ColumnLabel, MapError, RowRef};
use crate::contract::template::{Fields, Template};
use crate::contract::trace_context;
use crate::error::ConfigProblem;
use crate::pgoutput::{Relation, Tuple, TupleValue};

/// What a payload is, by its column type (or an emitted event's `payload_type`): it decides
/// the content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyKind {
    Json,
    Jsonb,
    Bytea,
    Text,
}

impl BodyKind {
    fn from_type(oid: u32) -> Self {
        match oid {
            type_oid::JSON => BodyKind::Json,
            type_oid::JSONB => BodyKind::Jsonb,
            type_oid::BYTEA => BodyKind::Bytea,
            _ => BodyKind::Text,
        }
    }

    pub(crate) fn content_type(self) -> &'static str {
        match self {
            BodyKind::Json | BodyKind::Jsonb => "application/json",
            BodyKind::Bytea => "application/octet-stream",
            BodyKind::Text => "text/plain; charset=utf-8",
        }
    }
}

/// Where the contract's columns sit in one version of the outbox table's Relation.
// The fields salvage.rs reads of a rejected row are pub(super); the rest are the mapper's.
#[derive(Debug, Clone)]
pub struct Layout {
    table: String,
    pub(super) width: usize,
    id: usize,
    id_is_uuid: bool,
    pub(super) event_type: usize,
    pub(super) payload: Option<(usize, BodyKind)>,
    pub(super) headers: Option<usize>,
    created_at: Option<usize>,
    pub(super) exchange: Option<usize>,
    pub(super) routing_key: Option<usize>,
    aggregate_type: Option<usize>,
    aggregate_id: Option<usize>,
    traceparent: Option<usize>,
    tracestate: Option<usize>,
    span_context: Option<usize>,
    /// `--header-column`s: index, column name, header name, how the value is typed.
    header_columns: Vec<(usize, String, String, HeaderKind)>,
    /// The contract columns the map renames, with the table's names (for errors).
    renamed: Vec<(&'static str, String)>,
}

/// How a header column's value is sent: integers and booleans as AMQP's, the rest as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeaderKind {
    Int,
    Bool,
    Text,
}

impl HeaderKind {
    fn from_type(oid: u32) -> Self {
        match oid {
            type_oid::INT2 | type_oid::INT4 | type_oid::INT8 => HeaderKind::Int,
            type_oid::BOOL => HeaderKind::Bool,
            _ => HeaderKind::Text,
        }
    }
}

impl Layout {
    /// Builds the layout from a Relation message, finding each contract column under the
    /// name `columns` maps it to (once per Relation: rows are read by index); a new Relation
    /// (schema change) builds a new one.
    pub fn for_relation(relation: &Relation, columns: &ColumnMap) -> Result<Self, MapError> {
        let table = relation.qualified_name();
        let index = |contract: &'static str| {
            columns
                .column(contract)
                .and_then(|name| relation.column_index(name))
        };
        let required = |contract: &'static str| {
            index(contract).ok_or_else(|| MapError::MissingColumn {
                table: table.clone(),
                column: contract,
                // Required columns are never unmapped (ColumnMap::resolve refuses it).
                table_column: columns.column(contract).unwrap_or(contract).to_string(),
            })
        };
        let created_at = index(columns::CREATED_AT);
        if let Some(i) = created_at {
            let column = &relation.columns[i];
            if column.type_oid != type_oid::TIMESTAMPTZ {
                return Err(MapError::CreatedAtType {
                    table: table.clone(),
                    column: column.name.clone(),
                    type_oid: column.type_oid,
                });
            }
        }
        let id = required(columns::ID)?;
        let event_type = required(columns::EVENT_TYPE)?;
        let payload = index(columns::PAYLOAD).map(|i| {
            let kind = BodyKind::from_type(relation.columns[i].type_oid);
            (i, kind)
        });
        let header_columns = columns
            .header_columns()
            .iter()
            .map(|h| match relation.column_index(&h.column) {
                Some(i) => Ok((
                    i,
                    h.column.clone(),
                    h.header.clone(),
                    HeaderKind::from_type(relation.columns[i].type_oid),
                )),
                None => Err(MapError::MissingHeaderColumn {
                    table: table.clone(),
                    column: h.column.clone(),
                }),
            })
            .collect::<Result<_, _>>()?;
        Ok(Layout {
            width: relation.columns.len(),
            id,
            id_is_uuid: relation.columns[id].type_oid == type_oid::UUID,
            event_type,
            payload,
            headers: index(columns::HEADERS),
            created_at,
            exchange: index(columns::EXCHANGE),
            routing_key: index(columns::ROUTING_KEY),
            aggregate_type: index(columns::AGGREGATE_TYPE),
            aggregate_id: index(columns::AGGREGATE_ID),
            traceparent: index(columns::TRACEPARENT),
            tracestate: index(columns::TRACESTATE),
            span_context: index(columns::TRACING_SPAN_CONTEXT),
            header_columns,
            renamed: columns::CONTRACT
                .into_iter()
                .filter_map(|contract| {
                    let table = columns.column(contract)?;
                    (table != contract).then(|| (contract, table.to_string()))
                })
                .collect(),
            table,
        })
    }

    pub fn table(&self) -> &str {
        &self.table
    }
}

/// A message as read from its source (a row, or an emitted event's envelope), before
/// [`Mapper::assemble`] applies the contract to it.
#[derive(Debug)]
pub struct Parts<'a> {
    pub message_id: String,
    pub event_type: &'a str,
    pub body: Bytes,
    pub content_type: Option<&'static str>,
    /// The message's own headers; the relay's are added by `assemble`.
    pub headers: Headers,
    /// At or after 1970 (AMQP timestamps are Unix seconds).
    pub created_at: Option<time::OffsetDateTime>,
    pub exchange: Option<&'a str>,
    pub routing_key: Option<&'a str>,
    pub aggregate_type: Option<&'a str>,
    pub aggregate_id: Option<&'a str>,
    /// Trace context from columns of its own; `assemble` adds the `headers`' keys.
    pub trace: trace_context::Sources<'a>,
}

#[derive(Debug, Clone)]
pub struct Mapper {
    default_exchange: String,
    /// `--exchange` with placeholders: each message's exchange rendered from it.
    exchange_template: Option<Template>,
    /// `--routing-key`: a row's key unless its `routing_key` column names one.
    routing_key: Template,
    max_message_size: usize,
    allowed_exchanges: AllowedExchanges,
    /// `--message-format cloudevents`: the events' `source`; `None` for plain.
    cloudevents_source: Option<std::sync::Arc<str>>,
}

/// Which exchanges a row's `exchange` column, or an `--exchange` template, may name
/// (`--allowed-exchanges`): anyone who can insert an outbox row would otherwise publish
/// wherever the relay's broker user can.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedExchanges {
    Any,
    /// These (a name ending in `*`: any exchange whose name starts with what precedes it)
    /// and the default exchange.
    Only(Vec<String>),
}

impl AllowedExchanges {
    /// `list` as configured (`None`: the default exchange only; `*`: any), for an outbox
    /// whose default exchange is `default_exchange` (`--exchange`; a template is no exchange
    /// of its own, and needs a list).
    pub fn parse(list: Option<&str>, default_exchange: &str) -> Result<Self, ConfigProblem> {
        let template = crate::contract::template::is_template(default_exchange);
        let Some(list) = list else {
            if template {
                return Err(ConfigProblem::ExchangeTemplateUnlisted {
                    exchange: default_exchange.to_string(),
                });
            }
            return Ok(Self::Only(vec![default_exchange.to_string()]));
        };
        let names: Vec<&str> = list.split(',').map(str::trim).collect();
        if names == ["*"] {
            return Ok(Self::Any);
        }
        if names
            .iter()
            .any(|name| name.is_empty() || *name == "*" || name.trim_end_matches('*').contains('*'))
        {
            return Err(ConfigProblem::AllowedExchangesList {
                list: list.to_string(),
            });
        }
        let mut allowed: Vec<String> = names.into_iter().map(str::to_string).collect();
        if !template {
            allowed.push(default_exchange.to_string());
        }
        Ok(Self::Only(allowed))
    }

    pub fn allows(&self, exchange: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Only(names) => names.iter().any(|name| match name.strip_suffix('*') {
                Some(prefix) => exchange.starts_with(prefix),
                None => name == exchange,
            }),
        }
    }
}

impl MapError {
    /// The error with its contract column named as `layout`'s table names it.
    fn in_table(mut self, layout: &Layout) -> Self {
        if let MapError::Null { column, .. } | MapError::Invalid { column, .. } = &mut self {
            if let ColumnLabel::Contract(contract) = column {
                if let Some((_, table)) = layout.renamed.iter().find(|(c, _)| c == contract) {
                    *column = ColumnLabel::Renamed(Box::new((contract, table.clone())));
                }
            }
        }
        self
    }
}

impl Mapper {
    pub fn new(
        default_exchange: &str,
        max_message_size: usize,
        allowed_exchanges: AllowedExchanges,
    ) -> Result<Self, String> {
        if default_exchange.len() > MAX_SHORT_TEXT {
            return Err(format!(
                "Exchange name \"{default_exchange}\" is over {MAX_SHORT_TEXT} bytes"
            ));
        }
        let exchange_template = Template::parse(default_exchange)
            .ok()
            .filter(Template::has_placeholders);
        Ok(Self {
            default_exchange: default_exchange.to_string(),
            exchange_template,
            routing_key: Template::field(columns::EVENT_TYPE)?,
            max_message_size,
            allowed_exchanges,
            cloudevents_source: None,
        })
    }

    /// Routing keys from `template` (`--routing-key`) for rows whose `routing_key` column
    /// is NULL or unmapped.
    pub fn with_routing_key(mut self, template: Template) -> Self {
        self.routing_key = template;
        self
    }

    /// Bodies as CloudEvents in structured mode, with `source` (`--message-format
    /// cloudevents`, src/contract/cloudevents.rs).
    pub fn with_cloudevents(mut self, source: &str) -> Self {
        self.cloudevents_source = Some(source.into());
        self
    }

    /// The row's message, or why it cannot be published, naming its columns as the table
    /// does.
    pub fn map(
        &self,
        layout: &Layout,
        tuple: &Tuple,
        position: Option<Position>,
    ) -> Result<Message, MapError> {
        self.map_contract(layout, tuple, position)
            .map_err(|error| error.in_table(layout))
    }

    fn map_contract(
        &self,
        layout: &Layout,
        tuple: &Tuple,
        position: Option<Position>,
    ) -> Result<Message, MapError> {
        let values = &tuple.0;
        let id = text_value(values.get(layout.id)).and_then(|v| match v {
            Value::Text(t) => Some(t.to_string()),
            Value::Raw(raw) if layout.id_is_uuid => uuid_text(raw),
            Value::Raw(_) => None,
        });
        let row = || RowRef::row(id.clone(), position);
        if values.len() != layout.width {
            return Err(MapError::Invalid {
                row: row(),
                column: columns::ID.into(),
                problem: format!(
                    "is in a row of {} columns, but the table's Relation has {}",
                    values.len(),
                    layout.width
                ),
            });
        }
        // Unchanged TOAST carries no data; an INSERT always has the full row, so it is a bug
        // upstream, and publishing a message without its value would lose data.
        if let Some(i) = values
            .iter()
            .position(|v| matches!(v, TupleValue::UnchangedToast))
        {
            return Err(MapError::UnchangedToast {
                row: row(),
                column: format!("#{}", i + 1),
            });
        }
        let Some(message_id) = id.clone() else {
            return Err(MapError::Null {
                row: row(),
                column: columns::ID.into(),
            });
        };
        let event_type = required_str(values, layout.event_type, columns::EVENT_TYPE, &row)?;
        let body = body(layout, values, &row)?;
        let mut headers = match layout.headers {
            Some(i) => header_table(&values[i], &row)?,
            None => Headers::new(),
        };
        for (i, column, header, kind) in &layout.header_columns {
            if let Some(value) = header_value(values, *i, column, header, *kind, &row)? {
                headers.push((header.clone(), value));
            }
        }
        let created_at = optional_str(values, layout.created_at, columns::CREATED_AT, &row)?
            .map(|text| {
                parse_timestamptz_at(text).map_err(|problem| MapError::Invalid {
                    row: row(),
                    column: columns::CREATED_AT.into(),
                    problem,
                })
            })
            .transpose()?;
        let parts = Parts {
            message_id,
            event_type,
            body,
            content_type: layout.payload.map(|(_, kind)| kind.content_type()),
            headers,
            created_at,
            exchange: optional_str(values, layout.exchange, columns::EXCHANGE, &row)?,
            routing_key: optional_str(values, layout.routing_key, columns::ROUTING_KEY, &row)?,
            aggregate_type: optional_str(
                values,
                layout.aggregate_type,
                columns::AGGREGATE_TYPE,
                &row,
            )?,
            aggregate_id: optional_str(values, layout.aggregate_id, columns::AGGREGATE_ID, &row)?,
            trace: trace_context::Sources {
                columns: (
                    optional_str(values, layout.traceparent, columns::TRACEPARENT, &row)?,
                    optional_str(values, layout.tracestate, columns::TRACESTATE, &row)?,
                ),
                span_context: optional_str(
                    values,
                    layout.span_context,
                    columns::TRACING_SPAN_CONTEXT,
                    &row,
                )?,
                headers: (None, None),
            },
        };
        self.assemble(parts, position, &row)
    }

    /// The contract (docs/consumers.md, "The message contract") in one place, for rows and
    /// emitted events alike: the size limit, the exchange policy, the routing key, the headers
    /// the relay adds and the AMQP properties. `row` names the message in errors.
    pub fn assemble(
        &self,
        parts: Parts<'_>,
        position: Option<Position>,
        row: &dyn Fn() -> RowRef,
    ) -> Result<Message, MapError> {
        let Parts {
            message_id,
            event_type,
            body,
            content_type,
            mut headers,
            created_at,
            exchange,
            routing_key,
            aggregate_type,
            aggregate_id,
            trace,
        } = parts;
        let too_large = |size: usize| MapError::TooLarge {
            row: row(),
            size,
            limit: self.max_message_size,
        };
        if body.len() > self.max_message_size {
            return Err(too_large(body.len()));
        }
        let fields = Fields {
            event_type: Some(event_type),
            aggregate_type,
            aggregate_id,
            id: Some(&message_id),
        };
        let exchange = self.exchange(exchange, &fields, row)?;
        let routing_key = match routing_key {
            Some(key) => short(key, columns::ROUTING_KEY, row)?,
            None => {
                let key = self.render(&self.routing_key, "--routing-key", &fields, row)?;
                check_short(&key, columns::ROUTING_KEY, row)?;
                key
            }
        };
        let (traceparent, tracestate) = trace_headers(&mut headers, trace);
        insert_stream_headers(&mut headers, position);
        for (header, value) in [
            (super::headers::AGGREGATE_TYPE, aggregate_type),
            (super::headers::AGGREGATE_ID, aggregate_id),
        ] {
            if let Some(value) = value {
                headers.push((header.to_string(), value.into()));
            }
        }
        let (body, content_type) = match &self.cloudevents_source {
            None => (body, content_type),
            Some(source) => {
                let attributes = crate::contract::cloudevents::Attributes {
                    id: &message_id,
                    source,
                    event_type,
                    time: created_at.and_then(|at| at.format(&Rfc3339).ok()),
                    aggregate_type,
                    aggregate_id,
                    seq: position.map(|p| p.seq()),
                    traceparent: traceparent.as_deref(),
                    tracestate: tracestate.as_deref(),
                };
                let event =
                    crate::contract::cloudevents::structured(&attributes, &body, content_type);
                if event.len() > self.max_message_size {
                    return Err(too_large(event.len()));
                }
                (event, Some(crate::contract::cloudevents::CONTENT_TYPE))
            }
        };
        check_short(&message_id, columns::ID, row)?;
        Ok(Message {
            message_id,
            exchange,
            routing_key,
            event_type: Some(short(event_type, columns::EVENT_TYPE, row)?),
            content_type: content_type.map(Cow::Borrowed),
            timestamp: created_at.and_then(|at| u64::try_from(at.unix_timestamp()).ok()),
            headers,
            body,
            position,
        })
    }

    /// A row's exchange (its `exchange` column, else the `--exchange` template rendered),
    /// if the policy allows it; else the default exchange.
    fn exchange(
        &self,
        named: Option<&str>,
        fields: &Fields<'_>,
        row: &dyn Fn() -> RowRef,
    ) -> Result<String, MapError> {
        let name = match (named, &self.exchange_template) {
            (Some(name), _) => name.to_string(),
            (None, Some(template)) => self.render(template, "--exchange", fields, row)?,
            (None, None) => return Ok(self.default_exchange.clone()),
        };
        if !self.allowed_exchanges.allows(&name) {
            return Err(MapError::ExchangeNotAllowed {
                row: row(),
                exchange: name,
            });
        }
        check_short(&name, columns::EXCHANGE, row)?;
        Ok(name)
    }

    /// `template` (the value of `flag`) for one message; a placeholder whose field is NULL
    /// or unmapped is the row's error.
    fn render(
        &self,
        template: &Template,
        flag: &str,
        fields: &Fields<'_>,
        row: &dyn Fn() -> RowRef,
    ) -> Result<String, MapError> {
        template
            .render(fields)
            .map_err(|missing| MapError::Invalid {
                row: row(),
                column: missing.0.into(),
                problem: format!(
                    "is NULL or unmapped, and {flag} {:?} needs it",
                    template.source()
                ),
            })
    }

    /// The routing key of a message whose row names none: `--routing-key` rendered from
    /// `fields`, as [`Mapper::assemble`] renders it; `None` when a field it needs is NULL or
    /// unmapped (`assemble` refuses that row, naming it).
    pub fn default_routing_key(&self, fields: &Fields<'_>) -> Option<String> {
        self.routing_key.render(fields).ok()
    }

    /// The default exchange (`--exchange`).
    pub fn default_exchange(&self) -> &str {
        &self.default_exchange
    }

    /// The broker's largest body (`--max-message-size`).
    pub fn max_message_size(&self) -> usize {
        self.max_message_size
    }
}

/// The message's trace context (src/contract/trace_context.rs) from `trace` and the `traceparent` and
/// `tracestate` keys of its own headers, which are taken out: only a valid context goes on,
/// under those names. A value dropped as invalid is counted, never an error.
fn trace_headers(
    headers: &mut Headers,
    trace: trace_context::Sources<'_>,
) -> (Option<String>, Option<String>) {
    let mut take = |name: &str| {
        let at = headers.iter().position(|(header, _)| header == name)?;
        match headers.remove(at).1 {
            HeaderValue::Text(text) => Some(text),
            _ => Some(String::new()),
        }
    };
    let from_headers = (
        take(trace_context::TRACEPARENT),
        take(trace_context::TRACESTATE),
    );
    let resolved = trace_context::resolve(&trace_context::Sources {
        headers: (from_headers.0.as_deref(), from_headers.1.as_deref()),
        ..trace
    });
    for header in &resolved.dropped {
        use crate::observability::metrics::{HEADER_LABEL, TRACE_CONTEXT_DROPPED_TOTAL};
        metrics::counter!(TRACE_CONTEXT_DROPPED_TOTAL, HEADER_LABEL => *header).increment(1);
    }
    let context = (
        resolved.traceparent.map(str::to_string),
        resolved.tracestate.map(str::to_string),
    );
    for (name, value) in [
        (trace_context::TRACEPARENT, &context.0),
        (trace_context::TRACESTATE, &context.1),
    ] {
        if let Some(value) = value {
            headers.push((name.to_string(), value.clone().into()));
        }
    }
    context
}

/// The message body: the payload column's bytes (hex bytea decoded), empty when NULL or absent.
pub(super) fn body(
    layout: &Layout,
    values: &[TupleValue],
    row: &dyn Fn() -> RowRef,
) -> Result<Bytes, MapError> {
    let Some((i, kind)) = layout.payload else {
        return Ok(Bytes::new());
    };
    Ok(match values.get(i) {
        None | Some(TupleValue::Null) => Bytes::new(),
        Some(TupleValue::Text(text)) if kind == BodyKind::Bytea => {
            decode_bytea_hex(text).map_err(|problem| MapError::Invalid {
                row: row(),
                column: columns::PAYLOAD.into(),
                problem,
            })?
        }
        Some(TupleValue::Text(text)) => text.clone(),
        // Binary jsonb starts with a version byte (1) before the JSON text.
        Some(TupleValue::Binary(raw)) if kind == BodyKind::Jsonb => raw.slice(1.min(raw.len())..),
        Some(TupleValue::Binary(raw)) => raw.clone(),
        // `map` refuses unchanged TOAST before reading the body; what is read of a rejected
        // row has no body for it.
        Some(TupleValue::UnchangedToast) => Bytes::new(),
    })
}

enum Value<'a> {
    Text(&'a str),
    Raw(&'a Bytes),
}

fn text_value(value: Option<&TupleValue>) -> Option<Value<'_>> {
    match value? {
        TupleValue::Text(bytes) => std::str::from_utf8(bytes).ok().map(Value::Text),
        TupleValue::Binary(bytes) => Some(Value::Raw(bytes)),
        TupleValue::Null | TupleValue::UnchangedToast => None,
    }
}

pub(super) fn optional_str<'a>(
    values: &'a [TupleValue],
    index: Option<usize>,
    column: &'static str,
    row: &dyn Fn() -> RowRef,
) -> Result<Option<&'a str>, MapError> {
    let Some(index) = index else {
        return Ok(None);
    };
    match &values[index] {
        TupleValue::Null => Ok(None),
        TupleValue::Text(bytes) | TupleValue::Binary(bytes) => std::str::from_utf8(bytes)
            .map(Some)
            .map_err(|_| MapError::Invalid {
                row: row(),
                column: column.into(),
                problem: "is not valid UTF-8 text".into(),
            }),
        TupleValue::UnchangedToast => Ok(None),
    }
}

/// A header column's value (`None` for NULL): integers and booleans typed, the rest as text.
fn header_value(
    values: &[TupleValue],
    index: usize,
    column: &str,
    header: &str,
    kind: HeaderKind,
    row: &dyn Fn() -> RowRef,
) -> Result<Option<HeaderValue>, MapError> {
    let label = || ColumnLabel::Header(Box::new((column.to_string(), header.to_string())));
    let text = match &values[index] {
        TupleValue::Null | TupleValue::UnchangedToast => return Ok(None),
        TupleValue::Text(bytes) | TupleValue::Binary(bytes) => {
            std::str::from_utf8(bytes).map_err(|_| MapError::Invalid {
                row: row(),
                column: label(),
                problem: "is not valid UTF-8 text".into(),
            })?
        }
    };
    let invalid = |problem: String| MapError::Invalid {
        row: row(),
        column: label(),
        problem,
    };
    Ok(Some(match kind {
        HeaderKind::Int => HeaderValue::Int(
            text.parse()
                .map_err(|_| invalid(format!("is not an integer: {text:?}")))?,
        ),
        HeaderKind::Bool => HeaderValue::Bool(match text {
            "t" | "true" => true,
            "f" | "false" => false,
            _ => return Err(invalid(format!("is not a boolean: {text:?}"))),
        }),
        HeaderKind::Text => HeaderValue::Text(text.to_string()),
    }))
}

fn required_str<'a>(
    values: &'a [TupleValue],
    index: usize,
    column: &'static str,
    row: &dyn Fn() -> RowRef,
) -> Result<&'a str, MapError> {
    optional_str(values, Some(index), column, row)?.ok_or_else(|| MapError::Null {
        row: row(),
        column: column.into(),
    })
}

/// `value` as a short text (at most [`MAX_SHORT_TEXT`] bytes), or the error naming the row.
fn short(value: &str, column: &'static str, row: &dyn Fn() -> RowRef) -> Result<String, MapError> {
    check_short(value, column, row)?;
    Ok(value.to_string())
}

/// [`short`]'s check alone, for a value that is already owned.
fn check_short(
    value: &str,
    column: &'static str,
    row: &dyn Fn() -> RowRef,
) -> Result<(), MapError> {
    if value.len() > MAX_SHORT_TEXT {
        return Err(MapError::Invalid {
            row: row(),
            column: column.into(),
            problem: format!(
                "is {} bytes long; AMQP allows at most {MAX_SHORT_TEXT} here",
                value.len()
            ),
        });
    }
    Ok(())
}

/// The `headers` jsonb column: an object whose string, number and bool values become AMQP
/// headers; nested values are passed as their JSON text, nulls are left out.
pub(super) fn header_table(
    value: &TupleValue,
    row: &dyn Fn() -> RowRef,
) -> Result<Headers, MapError> {
    let bytes = match value {
        TupleValue::Null | TupleValue::UnchangedToast => return Ok(Headers::new()),
        TupleValue::Text(bytes) => bytes.clone(),
        TupleValue::Binary(bytes) => bytes.slice(1.min(bytes.len())..),
    };
    headers_from_json(&bytes).map_err(|problem| MapError::Invalid {
        row: row(),
        column: columns::HEADERS.into(),
        problem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::fixtures::*;
    use crate::contract::headers;
    use crate::contract::message::Rejection;

    #[test]
    fn maps_a_full_row_per_the_contract() {
        let layout =
            Layout::for_relation(&outbox_relation(), &ColumnMap::default()).expect("layout");
        let m = mapper()
            .map(&layout, &full_row(), Some(pos()))
            .expect("maps");
        assert_eq!(m.message_id, ID);
        assert_eq!(m.exchange, "outbox");
        assert_eq!(m.routing_key, "OrderCreated");
        assert_eq!(&m.body[..], br#"{"order_id": 42}"#);
        assert_eq!(m.event_type.as_deref(), Some("OrderCreated"));
        assert_eq!(m.content_type.as_deref(), Some("application/json"));
        assert_eq!(m.timestamp, Some(1_796_019_969));
        let text = |s: &str| Some(HeaderValue::Text(s.into()));
        assert_eq!(m.header("tenant").cloned(), text("a"));
        assert_eq!(m.header("attempt"), Some(&HeaderValue::Int(2)));
        assert_eq!(m.header("vip"), Some(&HeaderValue::Bool(true)));
        assert_eq!(m.header("nested").cloned(), text(r#"{"x":1}"#));
        assert_eq!(m.header("gone"), None);
        assert_eq!(m.header(headers::LSN).cloned(), text("0/16B6C50"));
        assert_eq!(
            m.header(headers::SEQ).cloned(),
            text("00000000016B6C50-00000003")
        );
        assert_eq!(m.header(headers::AGGREGATE_ID).cloned(), text("42"));
    }

    #[test]
    fn row_columns_override_exchange_and_routing_key() {
        let layout =
            Layout::for_relation(&outbox_relation(), &ColumnMap::default()).expect("layout");
        let mut r = full_row();
        r.0[5] = text("billing");
        r.0[6] = text("orders.eu.created");
        let m = mapper().map(&layout, &r, Some(pos())).expect("maps");
        assert_eq!(m.exchange, "billing");
        assert_eq!(m.routing_key, "orders.eu.created");
    }

    #[test]
    fn allowed_exchanges_default_to_the_configured_one() {
        let only_default = AllowedExchanges::parse(None, "outbox").unwrap();
        assert!(only_default.allows("outbox"));
        assert!(!only_default.allows("billing"));
        let any = AllowedExchanges::parse(Some(" * "), "outbox").unwrap();
        assert_eq!(any, AllowedExchanges::Any);
        assert!(any.allows("anything"));
        let listed = AllowedExchanges::parse(Some("billing, audit"), "outbox").unwrap();
        for name in ["billing", "audit", "outbox"] {
            assert!(listed.allows(name), "{name}");
        }
        assert!(!listed.allows("bill"));
        for bad in ["", "a,,b", "a,*", "a,"] {
            let err = AllowedExchanges::parse(Some(bad), "outbox")
                .unwrap_err()
                .to_string();
            assert!(err.contains("--allowed-exchanges"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn a_row_naming_an_exchange_not_allowed_is_refused_and_described() {
        let layout =
            Layout::for_relation(&outbox_relation(), &ColumnMap::default()).expect("layout");
        let strict = Mapper::new(
            "outbox",
            1024,
            AllowedExchanges::parse(None, "outbox").unwrap(),
        )
        .expect("mapper");
        let mut row = full_row();
        row.0[5] = text("billing");
        let err = strict.map(&layout, &row, Some(pos())).unwrap_err();
        assert!(
            matches!(err, MapError::ExchangeNotAllowed { ref exchange, .. } if exchange == "billing")
        );
        let text_of_error = err.to_string();
        assert!(text_of_error.contains(ID), "{text_of_error}");
        assert!(
            text_of_error.contains("--allowed-exchanges"),
            "{text_of_error}"
        );
        // Naming the default exchange explicitly is fine.
        row.0[5] = text("outbox");
        assert!(strict.map(&layout, &row, Some(pos())).is_ok());

        row.0[5] = text("billing");
        let unpublishable = strict
            .map_row(&layout, &row, Some(pos()))
            .expect_err("refused");
        assert_eq!(
            unpublishable.rejection,
            Rejection::ExchangeNotAllowed {
                exchange: "billing".into()
            }
        );
        assert_eq!(
            unpublishable.rejection.to_string(),
            "exchange not allowed: billing"
        );
        let original = unpublishable.original.expect("described");
        assert_eq!(original.exchange, "billing", "where it was meant to go");
        assert_eq!(unpublishable.problem, text_of_error);
    }

    #[test]
    fn missing_required_column_is_named() {
        let mut rel = outbox_relation();
        rel.columns.retain(|c| c.name != "event_type");
        let e = Layout::for_relation(&rel, &ColumnMap::default()).expect_err("no event_type");
        assert!(e.to_string().contains("event_type"), "{e}");
    }

    #[test]
    fn a_mapped_relation_is_read_under_the_tables_names() {
        use crate::contract::columns::Preset;
        let map = ColumnMap::preset(Preset::Debezium);
        let layout = Layout::for_relation(&debezium_relation(), &map).expect("layout");
        let r = row(vec![
            text(ID),
            text("Order"),
            text("42"),
            text("OrderCreated"),
            text(r#"{"order_id": 42}"#),
            text("acme"),
        ]);
        let m = mapper().map(&layout, &r, Some(pos())).expect("maps");
        assert_eq!(m.message_id, ID);
        assert_eq!(m.event_type.as_deref(), Some("OrderCreated"));
        assert_eq!(m.routing_key, "OrderCreated");
        assert_eq!(m.content_type.as_deref(), Some("application/json"));
        assert_eq!(&m.body[..], br#"{"order_id": 42}"#);
        assert_eq!(m.timestamp, None, "no created_at in Debezium's table");
        let header = |name: &str| {
            m.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(header(headers::AGGREGATE_TYPE), Some("Order".into()));
        assert_eq!(header(headers::AGGREGATE_ID), Some("42".into()));
        assert_eq!(header("tenant"), None, "an unmapped column is not read");

        // The default map finds no event_type in Debezium's table.
        let e = Layout::for_relation(&debezium_relation(), &ColumnMap::default())
            .expect_err("no event_type");
        let text = crate::advice::report(&e.into());
        assert!(text.contains("no column \"event_type\""), "{text}");
        assert!(text.contains("--column event_type=COLUMN"), "{text}");

        // A mapped column the table lacks is named by both names.
        let map =
            ColumnMap::resolve(Preset::Debezium, &["event_type=kind".to_string()]).expect("map");
        let e = Layout::for_relation(&debezium_relation(), &map).expect_err("no kind");
        let text = e.to_string();
        assert!(text.contains("no column \"kind\""), "{text}");
        assert!(
            text.contains("the message contract's \"event_type\""),
            "{text}"
        );
    }

    #[test]
    fn an_unmapped_optional_column_is_absent_even_when_the_table_has_it() {
        use crate::contract::columns::Preset;
        let map = ColumnMap::resolve(Preset::Default, &["headers=".to_string()]).expect("map");
        let layout = Layout::for_relation(&outbox_relation(), &map).expect("layout");
        let m = mapper()
            .map(&layout, &full_row(), Some(pos()))
            .expect("maps");
        assert!(
            !m.headers.iter().any(|(n, _)| n == "tenant"),
            "{:?}",
            m.headers
        );
    }

    #[test]
    fn bytea_and_text_payloads() {
        let mut rel = outbox_relation();
        rel.columns[2].type_oid = type_oid::BYTEA;
        let layout = Layout::for_relation(&rel, &ColumnMap::default()).expect("layout");
        let mut r = full_row();
        r.0[2] = text("\\x00ff10");
        let m = mapper().map(&layout, &r, Some(pos())).expect("maps");
        assert_eq!(&m.body[..], &[0x00, 0xff, 0x10]);
        assert_eq!(m.content_type.as_deref(), Some("application/octet-stream"));
        r.0[2] = text("\\x0");
        let e = mapper().map(&layout, &r, Some(pos())).expect_err("odd");
        assert!(e.to_string().contains("odd number of hex digits"), "{e}");
        r.0[2] = text("\\x0g");
        let e = mapper().map(&layout, &r, Some(pos())).expect_err("not hex");
        assert!(e.to_string().contains("non-hex character 'g'"), "{e}");
        r.0[2] = text("00ff");
        let e = mapper().map(&layout, &r, Some(pos())).expect_err("no \\x");
        assert!(e.to_string().contains("hex bytea format"), "{e}");

        rel.columns[2].type_oid = 25;
        let layout = Layout::for_relation(&rel, &ColumnMap::default()).expect("layout");
        r.0[2] = text("plain \\x text");
        let m = mapper().map(&layout, &r, Some(pos())).expect("maps");
        assert_eq!(&m.body[..], b"plain \\x text");
    }

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    /// The outbox relation with extra columns: a tenant (text), a shard number (int4), a
    /// flag (bool) and the W3C trace context columns.
    fn wide_relation() -> Relation {
        let mut relation = outbox_relation();
        relation.columns.extend([
            column("tenant_id", 25),
            column("shard_no", type_oid::INT4),
            column("urgent", type_oid::BOOL),
            column("traceparent", 25),
            column("tracestate", 25),
        ]);
        relation
    }

    fn wide_row(extra: [TupleValue; 5]) -> Tuple {
        let mut r = full_row();
        r.0.extend(extra);
        r
    }

    fn header_map() -> ColumnMap {
        ColumnMap::default()
            .with_header_columns(&[
                "tenant_id=x-tenant".to_string(),
                "shard_no".into(),
                "urgent".into(),
            ])
            .expect("map")
    }

    #[test]
    fn header_columns_become_typed_headers() {
        let layout = Layout::for_relation(&wide_relation(), &header_map()).expect("layout");
        let r = wide_row([
            text("acme"),
            text("7"),
            text("t"),
            TupleValue::Null,
            TupleValue::Null,
        ]);
        let m = mapper().map(&layout, &r, Some(pos())).expect("maps");
        assert_eq!(
            m.header("x-tenant"),
            Some(&HeaderValue::Text("acme".into()))
        );
        assert_eq!(m.header("shard_no"), Some(&HeaderValue::Int(7)));
        assert_eq!(m.header("urgent"), Some(&HeaderValue::Bool(true)));
        let r = wide_row([
            TupleValue::Null,
            text("x"),
            TupleValue::Null,
            TupleValue::Null,
            TupleValue::Null,
        ]);
        let error = mapper()
            .map(&layout, &r, Some(pos()))
            .expect_err("not an integer");
        assert!(error.to_string().contains("\"shard_no\""), "{error}");
        let missing = ColumnMap::default()
            .with_header_columns(&["region".to_string()])
            .expect("map");
        let error = Layout::for_relation(&outbox_relation(), &missing).expect_err("no column");
        assert!(
            matches!(&error, MapError::MissingHeaderColumn { column, .. } if column == "region"),
            "{error}"
        );
        assert!(error.to_string().contains("--header-column"), "{error}");
    }

    #[test]
    fn templates_route_by_the_rows_fields() {
        let layout =
            Layout::for_relation(&outbox_relation(), &ColumnMap::default()).expect("layout");
        let allowed =
            AllowedExchanges::parse(Some("events.*"), "events.{aggregate_type}").expect("policy");
        let m = Mapper::new("events.{aggregate_type}", 1024, allowed)
            .expect("mapper")
            .with_routing_key(Template::parse("{aggregate_type}.{event_type}").expect("t"));
        let message = m.map(&layout, &full_row(), Some(pos())).expect("maps");
        assert_eq!(message.exchange, "events.order");
        assert_eq!(message.routing_key, "order.OrderCreated");
        // The row's own columns win over both templates.
        let mut r = full_row();
        r.0[5] = text("events.billing");
        r.0[6] = text("given.key");
        let message = m.map(&layout, &r, Some(pos())).expect("maps");
        assert_eq!(
            (message.exchange.as_str(), message.routing_key.as_str()),
            ("events.billing", "given.key")
        );
        // A field the template needs is NULL: the row's error, naming the flag.
        let mut r = full_row();
        r.0[7] = TupleValue::Null;
        let error = m
            .map(&layout, &r, Some(pos()))
            .expect_err("no aggregate_type");
        let described = error.to_string();
        assert!(
            described.contains("\"aggregate_type\"") && described.contains("--exchange"),
            "{described}"
        );
        // A rendered exchange outside the patterns is not allowed.
        let mut r = full_row();
        r.0[5] = text("audit");
        let error = m.map(&layout, &r, Some(pos())).expect_err("not allowed");
        assert!(
            matches!(error, MapError::ExchangeNotAllowed { .. }),
            "{error}"
        );
    }

    #[test]
    fn an_exchange_template_needs_a_list_and_patterns_match_prefixes() {
        let error = AllowedExchanges::parse(None, "events.{aggregate_type}")
            .expect_err("needs a list")
            .to_string();
        assert!(error.contains("--allowed-exchanges"), "{error}");
        let allowed = AllowedExchanges::parse(Some("events.*, audit"), "events.{aggregate_type}")
            .expect("policy");
        assert!(allowed.allows("events.order") && allowed.allows("audit"));
        assert!(!allowed.allows("eventsx") && !allowed.allows("event"));
        assert!(AllowedExchanges::parse(Some("ev*nts"), "outbox").is_err());
    }

    #[test]
    fn trace_context_goes_on_valid_and_is_dropped_invalid() {
        let layout = Layout::for_relation(&wide_relation(), &ColumnMap::default()).expect("layout");
        let r = wide_row([
            TupleValue::Null,
            TupleValue::Null,
            TupleValue::Null,
            text(PARENT),
            text("congo=t61rcWkgMzE"),
        ]);
        let m = mapper().map(&layout, &r, Some(pos())).expect("maps");
        assert_eq!(
            m.header(headers::TRACEPARENT),
            Some(&HeaderValue::Text(PARENT.into()))
        );
        assert_eq!(
            m.header(headers::TRACESTATE),
            Some(&HeaderValue::Text("congo=t61rcWkgMzE".into()))
        );
        // From the headers column, invalid: left out, the message still published.
        let mut r = full_row();
        r.0[3] = text(r#"{"traceparent": "nonsense", "tenant": "a"}"#);
        let m = mapper()
            .map(&layout_default(), &r, Some(pos()))
            .expect("maps");
        assert_eq!(m.header(headers::TRACEPARENT), None);
        assert_eq!(m.header("tenant"), Some(&HeaderValue::Text("a".into())));
        // From the headers column, valid: kept under its name.
        let mut r = full_row();
        r.0[3] = text(&format!(r#"{{"traceparent": "{PARENT}"}}"#));
        let m = mapper()
            .map(&layout_default(), &r, Some(pos()))
            .expect("maps");
        assert_eq!(
            m.header(headers::TRACEPARENT),
            Some(&HeaderValue::Text(PARENT.into()))
        );
    }

    #[test]
    fn debeziums_span_context_is_the_trace_context_of_cloudevents_too() {
        let mut relation = debezium_relation();
        relation.columns.push(column("tracingspancontext", 25));
        let layout = Layout::for_relation(
            &relation,
            &ColumnMap::preset(crate::contract::columns::Preset::Debezium),
        )
        .expect("layout");
        let mut values: Vec<TupleValue> = relation.columns[..relation.columns.len() - 1]
            .iter()
            .map(|c| match c.name.as_str() {
                "id" => text(ID),
                "type" => text("OrderCreated"),
                "payload" => text("{}"),
                _ => text("x"),
            })
            .collect();
        values.push(text(&format!(
            "#Tue\ntraceparent={PARENT}\ntracestate=congo=t61\n"
        )));
        let m = mapper()
            .with_cloudevents("urn:test")
            .map(&layout, &Tuple(values), Some(pos()))
            .expect("maps");
        assert_eq!(
            m.header(headers::TRACEPARENT),
            Some(&HeaderValue::Text(PARENT.into()))
        );
        let event: serde_json::Value = serde_json::from_slice(&m.body).expect("JSON");
        assert_eq!(event["traceparent"], PARENT);
        assert_eq!(event["tracestate"], "congo=t61");
    }

    #[test]
    fn created_at_must_be_a_timestamptz() {
        let mut relation = outbox_relation();
        relation.columns[4].type_oid = 1114; // timestamp without time zone
        let error = Layout::for_relation(&relation, &ColumnMap::default()).expect_err("refused");
        assert!(
            matches!(error, MapError::CreatedAtType { type_oid: 1114, .. }),
            "{error}"
        );
        let text = crate::advice::report(&error.into());
        assert!(text.contains("Fix:"), "{text}");
        let unmapped = ColumnMap::resolve(
            crate::contract::columns::Preset::Default,
            &["created_at=".to_string()],
        )
        .expect("map");
        assert!(Layout::for_relation(&relation, &unmapped).is_ok());
    }
}
