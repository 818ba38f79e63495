//! Why a row (or an emitted event, or the table's Relation) cannot become a message, and how
//! the error names it: the row ([`RowRef`]: its id and stream position) and the column
//! ([`ColumnLabel`]: as the table names it). A [`MapError`] is definite, a retry would read
//! the same row: under halt it stops the relay naming the row; under the dead-letter policy
//! its [`Rejection`] is the dead letter's reason.

use std::fmt;

use crate::contract::columns::HEADER_COLUMN_FLAG;
use crate::contract::message::Rejection;
use crate::contract::position::Position;
use crate::error::MapProblem;

/// Identifies a row (or an emitted event) in error messages: its id when readable, and its
/// stream position when it came from the WAL (polling mode reads rows from the table: no
/// position).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowRef {
    pub id: Option<String>,
    pub position: Option<Position>,
    /// An event written by the emit functions (contract/emit.rs), not a row of the table.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::columns::ColumnMap;
    use crate::contract::fixtures::*;
    use crate::contract::mapper::Layout;
    use crate::pgoutput::{Tuple, TupleValue};

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
}
