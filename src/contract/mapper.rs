//! Row -> message, per the message contract (docs/architecture.md, "The message contract").
//!
//! Values arrive as text shaped by the session settings pinned on the replication connection
//! (ISO dates in UTC, hex bytea), so parsing them here is exact. The body is a slice of the
//! replication buffer: no payload byte is copied between the socket and the broker's frame.
//!
//! A row that cannot be mapped becomes an [`Unpublishable`]: what could be read of it, and
//! why. What happens to it (stop the relay, naming the row, or a dead letter) is delivery's
//! policy, not the mapper's.
//!
//! Pure and synchronous: it owns the translation, no I/O, and knows no broker client's
//! types (the message is `crate::contract::message`'s). It must never make up a value the
//! contract requires (a NULL `id` or `event_type`, an unchanged-TOAST value, a malformed
//! column is a [`MapError`] naming the row): a message published with a wrong id or type
//! cannot be called back. Only optional columns have defaults (the exchange, the routing key =
//! `event_type`, an empty body for a NULL payload).

use std::fmt;

use bytes::Bytes;
use pgwire_replication::Lsn;
use time::format_description::well_known::Rfc3339;

use crate::contract::message::{HeaderValue, Message, Rejection, Unpublishable};
use crate::error::{ConfigProblem, MapProblem};
use crate::pgoutput::{Relation, Tuple, TupleValue};
use crate::template::{Fields, Template};
use crate::trace_context;

use crate::contract::columns::{self, ColumnMap, HEADER_COLUMN_FLAG};

/// Headers the relay adds to every message.
pub mod headers {
    /// Commit LSN of the row's transaction (`X/Y`).
    pub const LSN: &str = "x-outbox-lsn";
    /// Commit LSN and position in the transaction: increases along the stream, so a replay
    /// can be traced. Not a high-water mark to drop duplicates by: after a nack or a return
    /// the replay brings messages a consumer never had (deduplicate on `message_id`).
    pub const SEQ: &str = "x-outbox-seq";
    pub const AGGREGATE_TYPE: &str = "x-aggregate-type";
    pub const AGGREGATE_ID: &str = "x-aggregate-id";
    pub use crate::trace_context::{TRACEPARENT, TRACESTATE};

    /// The headers the relay sets itself: a header column may not take their names.
    pub const RESERVED: [&str; 6] = [
        LSN,
        SEQ,
        AGGREGATE_TYPE,
        AGGREGATE_ID,
        TRACEPARENT,
        TRACESTATE,
    ];
}

mod type_oid {
    pub const BOOL: u32 = 16;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const BYTEA: u32 = 17;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const JSON: u32 = 114;
    pub const UUID: u32 = 2950;
    pub const JSONB: u32 = 3802;
}

/// What a payload is, by its column type (or an emitted event's `payload_type`): it decides
/// the content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
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

    pub fn content_type(self) -> &'static str {
        match self {
            BodyKind::Json | BodyKind::Jsonb => "application/json",
            BodyKind::Bytea => "application/octet-stream",
            BodyKind::Text => "text/plain; charset=utf-8",
        }
    }
}

/// Where the contract's columns sit in one version of the outbox table's Relation.
#[derive(Debug, Clone)]
pub struct Layout {
    table: String,
    width: usize,
    id: usize,
    id_is_uuid: bool,
    event_type: usize,
    payload: Option<(usize, BodyKind)>,
    headers: Option<usize>,
    created_at: Option<usize>,
    exchange: Option<usize>,
    routing_key: Option<usize>,
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

/// A row's place in the stream: its transaction's commit LSN and its index in the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub commit_lsn: Lsn,
    pub index: u32,
}

impl Position {
    /// `x-outbox-seq`: fixed-width hex of the commit LSN and the index, so that comparing two
    /// values as strings orders them along the stream.
    pub fn seq(&self) -> String {
        format!("{:016X}-{:08X}", self.commit_lsn.as_u64(), self.index)
    }
}

/// The message's own headers, as a source read them.
pub type Headers = Vec<(String, HeaderValue)>;

/// AMQP's limit for a short string (the exchange, routing key, message id, type and header
/// names): checked here, so that a row over it is named like any other mapping error.
pub const MAX_SHORT_TEXT: usize = 255;

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
        let template = crate::template::is_template(default_exchange);
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

/// Identifies a row (or an emitted event) in error messages: its id when readable, and its
/// stream position when it came from the WAL (polling mode reads rows from the table: no
/// position).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowRef {
    pub id: Option<String>,
    pub position: Option<Position>,
    /// An event written by the emit functions (src/contract/emit.rs), not a row of the table.
    pub emitted: bool,
}

impl RowRef {
    /// A row of the outbox table.
    pub fn row(id: Option<String>, position: Option<Position>) -> Self {
        Self {
            id,
            position,
            emitted: false,
        }
    }

    /// What holds a value: a row's column, an envelope's field.
    pub fn part(&self) -> &'static str {
        if self.emitted {
            "field"
        } else {
            "column"
        }
    }
}

impl fmt::Display for RowRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, item) = if self.emitted {
            ("emitted event", "message")
        } else {
            ("row", "row")
        };
        match &self.id {
            Some(id) => write!(f, "{what} id {id}"),
            None => write!(f, "{what} without a readable id"),
        }?;
        match &self.position {
            Some(position) => write!(
                f,
                " (transaction committed at {}, {item} {})",
                position.commit_lsn, position.index
            ),
            None => Ok(()),
        }
    }
}

/// The column (or an emitted event's field) an error is about, as the user knows it: the
/// contract's name, or the table's when the column map renames it (`map` sets that), or a
/// header column.
#[derive(Debug, Clone, PartialEq, Eq)]
// Boxed beyond the common case: a MapError travels in every row's Result.
pub enum ColumnLabel {
    Contract(&'static str),
    /// The contract's name, the table's.
    Renamed(Box<(&'static str, String)>),
    /// A header column: the table's name, the header's.
    Header(Box<(String, String)>),
}

impl From<&'static str> for ColumnLabel {
    fn from(contract: &'static str) -> Self {
        ColumnLabel::Contract(contract)
    }
}

impl fmt::Display for ColumnLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ColumnLabel::Contract(contract) => write!(f, "\"{contract}\""),
            ColumnLabel::Renamed(names) => {
                let (contract, table) = &**names;
                write!(f, "\"{table}\" (the contract's {contract})")
            }
            ColumnLabel::Header(names) => {
                let (column, header) = &**names;
                write!(f, "\"{column}\" (sent as the header {header:?})")
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error(
        "The outbox table {table} has no column \"{table_column}\", which every message needs \
         (the message contract's \"{column}\")"
    )]
    MissingColumn {
        table: String,
        /// The contract's name of the column.
        column: &'static str,
        /// The table's column the map looked for.
        table_column: String,
    },

    #[error(
        "The outbox table {table} has no column \"{column}\", which {HEADER_COLUMN_FLAG} sends \
         as a header"
    )]
    MissingHeaderColumn { table: String, column: String },

    #[error(
        "The outbox table {table}'s column \"{column}\", read as the message contract's \
         \"created_at\", is not a timestamptz (type OID {type_oid}): the relay needs the \
         offset to know when a row was written (the AMQP timestamp, the cleanup, the backfill)"
    )]
    CreatedAtType {
        table: String,
        column: String,
        type_oid: u32,
    },

    #[error("Cannot publish {row}: column {column} is NULL, but the message needs a value")]
    Null { row: RowRef, column: ColumnLabel },

    #[error(
        "Cannot publish {row}: column \"{column}\" arrived as an unchanged TOAST value in an \
         INSERT, which carries no data"
    )]
    UnchangedToast { row: RowRef, column: String },

    #[error(
        "Cannot publish {row}: its body is {size} bytes, over the broker's limit of {limit} \
         bytes (--max-message-size, RabbitMQ max_message_size)"
    )]
    TooLarge {
        row: RowRef,
        size: usize,
        limit: usize,
    },

    #[error(
        "Cannot publish {row}: its exchange {} names \"{exchange}\", which \
         --allowed-exchanges does not allow",
        row.part()
    )]
    ExchangeNotAllowed { row: RowRef, exchange: String },

    #[error("Cannot publish {row}: {} {column} {problem}", row.part())]
    Invalid {
        row: RowRef,
        column: ColumnLabel,
        problem: String,
    },

    #[error("Cannot publish {row}: its envelope {problem}")]
    Envelope { row: RowRef, problem: String },

    #[error(
        "Cannot publish {row}: its envelope is version {version}, newer than this relay reads \
         (up to {supported})"
    )]
    EnvelopeVersion {
        row: RowRef,
        version: u64,
        supported: u64,
    },
}

/// A mapping error is definite: under halt it stops the relay, naming the row.
impl From<MapError> for crate::error::RelayError {
    fn from(error: MapError) -> Self {
        crate::error::RelayError::Unpublishable {
            message_id: error.row_id().map(str::to_string),
            problem: error.to_string(),
            fault: error.fault(),
        }
    }
}

impl MapError {
    /// Why a message that failed this way could not be built: the reason its dead letter
    /// carries.
    pub fn rejection(&self) -> Rejection {
        match self {
            MapError::TooLarge { size, limit, .. } => Rejection::TooLarge {
                size: *size,
                limit: *limit,
            },
            MapError::ExchangeNotAllowed { exchange, .. } => Rejection::ExchangeNotAllowed {
                exchange: exchange.clone(),
            },
            other => Rejection::Unmappable {
                error: other.problem(),
            },
        }
    }

    /// What kind of problem this is, for the advice on it (`crate::advice`).
    pub fn fault(&self) -> MapProblem {
        match self {
            MapError::MissingColumn { column, .. } => {
                MapProblem::MissingColumn { contract: column }
            }
            MapError::MissingHeaderColumn { .. } => MapProblem::MissingHeaderColumn {
                flag: HEADER_COLUMN_FLAG,
            },
            MapError::CreatedAtType { .. } => MapProblem::CreatedAtType,
            MapError::Null { .. } => MapProblem::Null,
            MapError::UnchangedToast { .. } => MapProblem::UnchangedToast,
            MapError::TooLarge { .. } => MapProblem::TooLarge,
            MapError::ExchangeNotAllowed { .. } => MapProblem::ExchangeNotAllowed,
            MapError::Invalid { .. } => MapProblem::Invalid,
            MapError::Envelope { .. } => MapProblem::Envelope,
            MapError::EnvelopeVersion { .. } => MapProblem::EnvelopeVersion,
        }
    }

    /// The id of the row this error is about, for the stuck-message report.
    pub fn row_id(&self) -> Option<&str> {
        match self {
            MapError::MissingColumn { .. }
            | MapError::MissingHeaderColumn { .. }
            | MapError::CreatedAtType { .. } => None,
            MapError::Null { row, .. }
            | MapError::UnchangedToast { row, .. }
            | MapError::TooLarge { row, .. }
            | MapError::ExchangeNotAllowed { row, .. }
            | MapError::Invalid { row, .. }
            | MapError::Envelope { row, .. }
            | MapError::EnvelopeVersion { row, .. } => row.id.as_deref(),
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

    /// What is wrong with the row, without the row reference and the advice (the text of an
    /// `unmappable` dead-letter reason).
    pub fn problem(&self) -> String {
        match self {
            MapError::MissingColumn {
                table,
                table_column,
                ..
            } => format!("the table {table} has no column \"{table_column}\""),
            MapError::CreatedAtType { table, column, .. } => {
                format!("the table {table}'s column \"{column}\" is not a timestamptz")
            }
            MapError::MissingHeaderColumn { table, column } => {
                format!("the table {table} has no header column \"{column}\"")
            }
            MapError::Null { column, .. } => format!("column {column} is NULL"),
            MapError::UnchangedToast { column, .. } => {
                format!("column {column} arrived as an unchanged TOAST value")
            }
            MapError::TooLarge { size, limit, .. } => {
                format!("body of {size} bytes is over the limit of {limit}")
            }
            MapError::Invalid {
                row,
                column,
                problem,
            } => format!("{} {column} {problem}", row.part()),
            MapError::Envelope { problem, .. } => format!("envelope {problem}"),
            MapError::EnvelopeVersion {
                version, supported, ..
            } => format!("envelope version {version} is newer than {supported}"),
            MapError::ExchangeNotAllowed { exchange, .. } => {
                format!("exchange \"{exchange}\" is not in --allowed-exchanges")
            }
        }
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

    /// The contract (README.md, "The message contract") in one place, for rows and emitted events alike:
    /// the size limit, the exchange policy, the routing key, the headers the relay adds and
    /// the AMQP properties. `row` names the message in errors.
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
            (self::headers::AGGREGATE_TYPE, aggregate_type),
            (self::headers::AGGREGATE_ID, aggregate_id),
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
            content_type,
            timestamp: created_at.and_then(|at| u64::try_from(at.unix_timestamp()).ok()),
            headers,
            body,
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

    /// The default exchange (`--exchange`).
    pub fn default_exchange(&self) -> &str {
        &self.default_exchange
    }

    /// The broker's largest body (`--max-message-size`).
    pub fn max_message_size(&self) -> usize {
        self.max_message_size
    }
}

/// The message's trace context (src/trace_context.rs) from `trace` and the `traceparent` and
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

/// `x-outbox-lsn` and `x-outbox-seq`, for a row from the stream. Added after the message's
/// own headers: a header of the same name is replaced by the relay's.
fn insert_stream_headers(headers: &mut Headers, position: Option<Position>) {
    if let Some(position) = position {
        headers.push((
            self::headers::LSN.to_string(),
            position.commit_lsn.to_string().into(),
        ));
        headers.push((self::headers::SEQ.to_string(), position.seq().into()));
    }
}

/// The message body: the payload column's bytes (hex bytea decoded), empty when NULL or absent.
fn body(
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
                        .unwrap_or_else(|| self.default_exchange.clone()),
                    routing_key: fits(readable.routing_key)
                        .or_else(|| event_type.clone())
                        .unwrap_or_default(),
                    event_type,
                    content_type: readable.content_type,
                    timestamp: None,
                    headers,
                    body: if readable.body.len() > self.max_message_size {
                        Bytes::new()
                    } else {
                        readable.body
                    },
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

fn optional_str<'a>(
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
fn header_table(value: &TupleValue, row: &dyn Fn() -> RowRef) -> Result<Headers, MapError> {
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

/// A JSON object of headers as message headers (string, number and bool values; nested
/// values as their JSON text; nulls left out), or what is wrong with it. Rows' `headers`
/// column and emitted events' `headers` field alike.
pub fn headers_from_json(json: &[u8]) -> Result<Headers, String> {
    let parsed: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("is not JSON: {e}"))?;
    let serde_json::Value::Object(object) = parsed else {
        return Err("must be a JSON object of header names to values".into());
    };
    let mut headers = Headers::with_capacity(object.len());
    for (name, value) in object {
        if name.len() > MAX_SHORT_TEXT {
            return Err(format!("has a header name over {MAX_SHORT_TEXT} bytes"));
        }
        let value = match value {
            serde_json::Value::Null => continue,
            serde_json::Value::Bool(b) => HeaderValue::Bool(b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => HeaderValue::Int(i),
                None => HeaderValue::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => HeaderValue::Text(s),
            nested => HeaderValue::Text(nested.to_string()),
        };
        headers.push((name, value));
    }
    Ok(headers)
}

/// bytea in `bytea_output = hex`: `\\x` followed by two hex digits a byte.
fn decode_bytea_hex(text: &[u8]) -> Result<Bytes, String> {
    let digits = text
        .strip_prefix(b"\\x")
        .ok_or_else(|| "is not in hex bytea format (\\x...)".to_string())?;
    let mut out = vec![0; digits.len() / 2];
    hex::decode_to_slice(digits, &mut out).map_err(|e| match e {
        hex::FromHexError::OddLength => "has an odd number of hex digits".to_string(),
        hex::FromHexError::InvalidHexCharacter { c, .. } => {
            format!("has a non-hex character {c:?}")
        }
        // The output is sized from the input: only the two above can happen.
        other => format!("is not valid hex: {other}"),
    })?;
    Ok(Bytes::from(out))
}

/// A binary uuid (16 bytes) in its canonical text form; `None` for any other length.
fn uuid_text(raw: &[u8]) -> Option<String> {
    let uuid = uuid::Uuid::from_slice(raw).ok()?;
    // Encoded on the stack, then one allocation of exactly 36 bytes.
    Some(
        uuid.hyphenated()
            .encode_lower(&mut uuid::Uuid::encode_buffer())
            .to_owned(),
    )
}

/// timestamptz as PostgreSQL prints it under `datestyle = ISO`: `2026-11-30 06:26:09.5+00`,
/// the fraction optional, the offset in hours with optional minutes and seconds (`+05:30`).
const ISO_TIMESTAMPTZ: &[time::format_description::BorrowedFormatItem<'static>] = time::macros::format_description!(
    "[year]-[month]-[day] [hour]:[minute]:[second][optional [.[subsecond]]]\
         [offset_hour sign:mandatory][optional [:[offset_minute]]][optional [:[offset_second]]]"
);

/// Seconds since the Unix epoch of a timestamptz in ISO output (the pinned DateStyle). AMQP
/// timestamps have one-second resolution.
pub fn parse_timestamptz(text: &str) -> Result<u64, String> {
    parse_timestamptz_at(text).map(|at| at.unix_timestamp().unsigned_abs())
}

/// [`parse_timestamptz`] as a point in time (at or after 1970).
pub fn parse_timestamptz_at(text: &str) -> Result<time::OffsetDateTime, String> {
    let at = match parse_iso_common(text.as_bytes()) {
        Some(at) => at,
        None => time::OffsetDateTime::parse(text, ISO_TIMESTAMPTZ)
            .map_err(|_| format!("is not an ISO timestamp with time zone: {text:?}"))?,
    };
    if at.unix_timestamp() < 0 {
        return Err(format!("is before 1970: {text:?}"));
    }
    Ok(at)
}

/// The shape PostgreSQL writes for nearly every row (`2026-11-30 06:26:09.123456+00`: four-digit
/// year, fraction of 1-9 digits, offset `+HH[:MM[:SS]]`), read without the general parser, which
/// cost about 4 % of the relay's CPU per message. `None` for anything else, out-of-range fields
/// included: the general parser then decides, so both accept and reject the same texts.
fn parse_iso_common(text: &[u8]) -> Option<time::OffsetDateTime> {
    fn digits(text: &[u8], at: usize, len: usize) -> Option<u32> {
        text.get(at..at + len)?.iter().try_fold(0u32, |value, &b| {
            b.is_ascii_digit().then(|| value * 10 + u32::from(b - b'0'))
        })
    }
    let separators = [(4, b'-'), (7, b'-'), (10, b' '), (13, b':'), (16, b':')];
    if !separators.iter().all(|&(at, b)| text.get(at) == Some(&b)) {
        return None;
    }
    let year = i32::try_from(digits(text, 0, 4)?).ok()?;
    let month = time::Month::try_from(u8::try_from(digits(text, 5, 2)?).ok()?).ok()?;
    let day = u8::try_from(digits(text, 8, 2)?).ok()?;
    let hour = u8::try_from(digits(text, 11, 2)?).ok()?;
    let minute = u8::try_from(digits(text, 14, 2)?).ok()?;
    let second = u8::try_from(digits(text, 17, 2)?).ok()?;
    let mut at = 19;
    let mut nanosecond = 0;
    if text.get(at) == Some(&b'.') {
        let len = text[at + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if !(1..=9).contains(&len) {
            return None;
        }
        nanosecond = digits(text, at + 1, len)? * 10u32.pow(9 - len as u32);
        at += 1 + len;
    }
    let sign: i8 = match text.get(at)? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    // The offset: hours, then up to two `:NN` parts (minutes, seconds), then the end.
    let mut offset = [0i8; 3];
    let mut parts = 0;
    let mut next = at + 1;
    loop {
        offset[parts] = sign * i8::try_from(digits(text, next, 2)?).ok()?;
        parts += 1;
        next += 2;
        if next == text.len() {
            break;
        }
        if parts == offset.len() || text[next] != b':' {
            return None;
        }
        next += 1;
    }
    let date = time::Date::from_calendar_date(year, month, day).ok()?;
    let clock = time::Time::from_hms_nano(hour, minute, second, nanosecond).ok()?;
    let offset = time::UtcOffset::from_hms(offset[0], offset[1], offset[2]).ok()?;
    Some(time::PrimitiveDateTime::new(date, clock).assume_offset(offset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgoutput::Column;

    fn column(name: &str, type_oid: u32) -> Column {
        Column {
            flags: 0,
            name: name.into(),
            type_oid,
            type_modifier: -1,
        }
    }

    fn outbox_relation() -> Relation {
        Relation {
            oid: 16384,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: vec![
                column("id", type_oid::UUID),
                column("event_type", 25),
                column("payload", type_oid::JSONB),
                column("headers", type_oid::JSONB),
                column("created_at", 1184),
                column("exchange", 25),
                column("routing_key", 25),
                column("aggregate_type", 25),
                column("aggregate_id", 25),
            ],
        }
    }

    fn text(s: &str) -> TupleValue {
        TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn row(values: Vec<TupleValue>) -> Tuple {
        Tuple(values)
    }

    fn pos() -> Position {
        Position {
            commit_lsn: Lsn::from_u64(0x16B6C50),
            index: 3,
        }
    }
    const ID: &str = "2b0b6f3e-8a6c-4a43-9a4f-0c1d2e3f4a5b";

    fn full_row() -> Tuple {
        row(vec![
            text(ID),
            text("OrderCreated"),
            text(r#"{"order_id": 42}"#),
            text(r#"{"tenant": "a", "attempt": 2, "vip": true, "nested": {"x": 1}, "gone": null}"#),
            text("2026-11-30 06:26:09.123456+00"),
            TupleValue::Null,
            TupleValue::Null,
            text("order"),
            text("42"),
        ])
    }

    fn mapper() -> Mapper {
        Mapper::new("outbox", 1024, AllowedExchanges::Any).expect("mapper")
    }

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
        assert_eq!(m.content_type, Some("application/json"));
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
    fn seq_orders_along_the_stream() {
        let a = Position {
            commit_lsn: Lsn::from_u64(0xFF),
            index: 9,
        }
        .seq();
        let b = Position {
            commit_lsn: Lsn::from_u64(0x100),
            index: 0,
        }
        .seq();
        let c = Position {
            commit_lsn: Lsn::from_u64(0x100),
            index: 1,
        }
        .seq();
        assert!(a < b && b < c);
    }

    #[test]
    fn errors_name_the_row() {
        let layout =
            Layout::for_relation(&outbox_relation(), &ColumnMap::default()).expect("layout");
        let mut r = full_row();
        r.0[1] = TupleValue::Null;
        let e = mapper()
            .map(&layout, &r, Some(pos()))
            .expect_err("null event_type");
        assert!(e.to_string().contains(ID), "{e}");
        assert!(e.to_string().contains("event_type"), "{e}");
        assert_eq!(e.row_id(), Some(ID));

        let mut r = full_row();
        r.0[2] = TupleValue::UnchangedToast;
        let e = mapper().map(&layout, &r, Some(pos())).expect_err("toast");
        assert!(matches!(e, MapError::UnchangedToast { .. }), "{e}");

        let mut r = full_row();
        r.0[2] = text(&"x".repeat(2000));
        let e = mapper()
            .map(&layout, &r, Some(pos()))
            .expect_err("too large");
        assert!(matches!(e, MapError::TooLarge { size: 2000, .. }), "{e}");

        let mut r = full_row();
        r.0[1] = text(&"e".repeat(300));
        let e = mapper()
            .map(&layout, &r, Some(pos()))
            .expect_err("long type");
        assert!(e.to_string().contains("255"), "{e}");

        let mut r = full_row();
        r.0[3] = text("[1,2]");
        assert!(mapper().map(&layout, &r, Some(pos())).is_err());
    }

    #[test]
    fn missing_required_column_is_named() {
        let mut rel = outbox_relation();
        rel.columns.retain(|c| c.name != "event_type");
        let e = Layout::for_relation(&rel, &ColumnMap::default()).expect_err("no event_type");
        assert!(e.to_string().contains("event_type"), "{e}");
    }

    /// Debezium's documented outbox table, with an extra column of the team's own.
    fn debezium_relation() -> Relation {
        Relation {
            oid: 16385,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: vec![
                column("id", type_oid::UUID),
                column("aggregatetype", 1043),
                column("aggregateid", 1043),
                column("type", 1043),
                column("payload", type_oid::JSONB),
                column("tenant", 25),
            ],
        }
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
        assert_eq!(m.content_type, Some("application/json"));
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
        assert_eq!(m.content_type, Some("application/octet-stream"));
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

    #[test]
    fn timestamps_parse_with_offsets() {
        assert_eq!(parse_timestamptz("1970-01-01 00:00:00+00"), Ok(0));
        assert_eq!(parse_timestamptz("1970-01-01 01:00:00+01"), Ok(0));
        assert_eq!(parse_timestamptz("1970-01-01 00:00:00-00:30"), Ok(1800));
        assert_eq!(
            parse_timestamptz("2000-02-29 12:00:00.999999+00"),
            Ok(951_825_600)
        );
        assert_eq!(
            parse_timestamptz("2024-01-02 08:34:05.123456+05:30"),
            Ok(1_704_164_645)
        );
        assert_eq!(
            parse_timestamptz("2024-01-02 03:04:05+00"),
            Ok(1_704_164_645)
        );
        assert!(parse_timestamptz("1969-12-31 23:59:59+00").is_err());
        assert!(parse_timestamptz("yesterday").is_err());
        assert!(parse_timestamptz("2000-13-01 00:00:00+00").is_err());
    }

    #[test]
    fn what_postgresql_writes_takes_the_fast_path() {
        for text in [
            "2026-11-30 06:26:09.123456+00",
            "2026-11-30 06:26:09+00",
            "2026-11-30 06:26:09.1-05",
            "2024-01-02 08:34:05.123456+05:30",
            "1900-01-01 00:00:00+00:09:21",
        ] {
            let fast = parse_iso_common(text.as_bytes());
            assert!(fast.is_some(), "{text}");
            assert_eq!(
                fast,
                time::OffsetDateTime::parse(text, ISO_TIMESTAMPTZ).ok()
            );
        }
    }

    /// Texts near PostgreSQL's ISO output: each field's width and range a little wider than
    /// valid, optional fraction and offset parts, sometimes a stray character.
    fn iso_like() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let width =
            |n: usize| (0u32..10u32.pow(n as u32 - 1) * 12).prop_map(move |v| format!("{v:0n$}"));
        (
            (
                prop_oneof![
                    width(4),
                    width(5),
                    Just("0000".to_string()),
                    Just("1969".to_string())
                ],
                0u32..14,
                0u32..33,
                0u32..26,
                0u32..62,
                0u32..62,
            ),
            proptest::option::of("[0-9]{0,11}"),
            prop_oneof![Just('+'), Just('-'), Just('Z')],
            (
                0u32..30,
                proptest::option::of((0u32..62, proptest::option::of(0u32..62))),
            ),
            proptest::option::of((0usize..32, proptest::char::range(' ', '~'))),
        )
            .prop_map(|((y, mo, d, h, mi, s), fraction, sign, (oh, om), stray)| {
                let mut text = format!("{y}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}");
                if let Some(fraction) = fraction {
                    text.push('.');
                    text.push_str(&fraction);
                }
                text.push(sign);
                text.push_str(&format!("{oh:02}"));
                if let Some((om, os)) = om {
                    text.push_str(&format!(":{om:02}"));
                    if let Some(os) = os {
                        text.push_str(&format!(":{os:02}"));
                    }
                }
                if let Some((at, c)) = stray {
                    let at = at.min(text.len());
                    text.insert(at, c);
                }
                text
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]
        /// The fast path reads what the general parser reads, to the same instant, and nothing
        /// it rejects; whatever it leaves, the general parser decides.
        #[test]
        fn the_common_shape_parses_as_the_general_parser_does(text in iso_like()) {
            let general = time::OffsetDateTime::parse(&text, ISO_TIMESTAMPTZ).ok();
            let fast = parse_iso_common(text.as_bytes());
            if fast.is_some() {
                proptest::prop_assert_eq!(fast, general, "{:?}", text);
            }
            proptest::prop_assert_eq!(
                parse_timestamptz_at(&text).ok(),
                general.filter(|at| at.unix_timestamp() >= 0),
                "{:?}", text
            );
        }
    }

    #[test]
    fn uuid_binary_renders_canonically() {
        let raw: Vec<u8> = (0u8..16).collect();
        assert_eq!(
            uuid_text(&raw).as_deref(),
            Some("00010203-0405-0607-0809-0a0b0c0d0e0f")
        );
        assert_eq!(uuid_text(&raw[1..]), None);
    }

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

    fn layout_default() -> Layout {
        Layout::for_relation(&outbox_relation(), &ColumnMap::default()).expect("layout")
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
    fn row_errors_name_the_tables_column() {
        let map = ColumnMap::preset(crate::contract::columns::Preset::Debezium);
        let layout = Layout::for_relation(&debezium_relation(), &map).expect("layout");
        let values = vec![
            text(ID),
            text("Order"),
            text("1"),
            TupleValue::Null,
            text("{}"),
            text("t"),
        ];
        let error = mapper()
            .map(&layout, &Tuple(values), Some(pos()))
            .expect_err("NULL type");
        let described = error.to_string();
        assert!(
            described.contains("column \"type\" (the contract's event_type) is NULL"),
            "{described}"
        );
        // Under the contract's own names, the text is as it always was.
        let mut r = full_row();
        r.0[1] = TupleValue::Null;
        let error = mapper()
            .map(&layout_default(), &r, Some(pos()))
            .expect_err("NULL event_type");
        assert_eq!(error.problem(), "column \"event_type\" is NULL");
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
