//! The names of what the relay provisions and uses: the table, publication, slot and
//! exchange, each a flag of its own, checked for what PostgreSQL and AMQP accept.

use clap::Args;

use crate::contract::columns::{ColumnMap, Preset};
use crate::error::RelayError;

// Each name is a flag of its own, so that a command takes only the names it uses (`poll`
// has no slot, `teardown` no exchange): clap then refuses the others on its command line. A
// name reads as text (`Deref<Target = str>`, `Display`, `== "x"`), and `"x".into()` makes
// one.

/// The methods every name flag shares.
macro_rules! name_flag {
    ($name:ident) => {
        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.name
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.name)
            }
        }

        impl From<String> for $name {
            fn from(name: String) -> Self {
                Self { name }
            }
        }

        impl From<&str> for $name {
            fn from(name: &str) -> Self {
                Self {
                    name: name.to_string(),
                }
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.name == *other
            }
        }
    };
}

/// `--table`.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = "Outbox objects")]
pub struct TableName {
    /// The outbox table (optionally schema-qualified).
    #[arg(id = "table", long = "table", value_name = "TABLE", env = "OUTBOX_TABLE", default_value = "outbox", value_parser = parse_table_name)]
    pub name: String,
}
name_flag!(TableName);

/// `--publication`.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = "Outbox objects")]
pub struct PublicationName {
    /// The publication that feeds the slot (publish = 'insert', on the outbox table only).
    #[arg(id = "publication", long = "publication", value_name = "PUBLICATION", env = "OUTBOX_PUBLICATION", default_value = "outbox_pub", value_parser = parse_identifier)]
    pub name: String,
}
name_flag!(PublicationName);

/// `--slot`.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = "Outbox objects")]
pub struct SlotName {
    /// The logical replication slot (plugin pgoutput).
    #[arg(id = "slot", long = "slot", value_name = "SLOT", env = "OUTBOX_SLOT", default_value = "outbox_slot", value_parser = parse_slot_name)]
    pub name: String,
}
name_flag!(SlotName);

/// `--exchange`.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = "Outbox objects")]
pub struct ExchangeName {
    /// The exchange messages go to unless a row names its own (a durable topic exchange); or
    /// a template over the contract's fields, e.g. 'events.{aggregate_type}', which needs
    /// --allowed-exchanges.
    #[arg(id = "exchange", long = "exchange", value_name = "EXCHANGE", env = "OUTBOX_EXCHANGE", default_value = "outbox", value_parser = parse_exchange_or_template)]
    pub name: String,
}
name_flag!(ExchangeName);

/// `--table-layout`: a preset of column names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TableLayout {
    /// The table `setup` creates: every column under its contract name.
    Default,
    /// Debezium's Outbox Event Router: id, aggregatetype, aggregateid, type, payload,
    /// tracingspancontext.
    Debezium,
}

/// Which column of the outbox table holds each column of the message contract: a preset
/// and the columns mapped one by one over it (docs/table-layouts.md). Every command that
/// reads the table takes it.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Table layout")]
pub struct ColumnArgs {
    /// The outbox table's column names: `default` (the table `setup` creates) or `debezium`
    /// (Debezium's Outbox Event Router: id, aggregatetype, aggregateid, type, payload,
    /// tracingspancontext; no created_at). --column maps columns over it.
    #[arg(long, env = "OUTBOX_TABLE_LAYOUT", value_enum, default_value_t = TableLayout::Default)]
    pub table_layout: TableLayout,

    /// Maps a column of the message contract to a column of the table (repeatable; in the
    /// variable, separated by commas), e.g. event_type=type or created_at=occurred_at;
    /// `CONTRACT=` leaves an optional column unmapped. Overrides --table-layout.
    #[arg(
        long = "column",
        env = "OUTBOX_COLUMNS",
        value_name = "CONTRACT=COLUMN",
        value_delimiter = ','
    )]
    pub columns: Vec<String>,

    /// Sends a column of the table as an AMQP header of every message (repeatable; in the
    /// variable, separated by commas): `tenant_id` as the header `tenant_id`, or
    /// `tenant_id=x-tenant` under another name. Integers and booleans keep their type; NULL
    /// leaves the header out.
    #[arg(
        long = "header-column",
        env = "OUTBOX_HEADER_COLUMNS",
        value_name = "COLUMN[=HEADER]",
        value_delimiter = ','
    )]
    pub header_columns: Vec<String>,
}

impl ColumnArgs {
    /// The map these flags make; a config error naming the flag when it is malformed.
    pub fn map(&self) -> Result<ColumnMap, RelayError> {
        let preset = match self.table_layout {
            TableLayout::Default => Preset::Default,
            TableLayout::Debezium => Preset::Debezium,
        };
        ColumnMap::resolve(preset, &self.columns)
            .and_then(|map| map.with_header_columns(&self.header_columns))
            .map_err(RelayError::Config)
    }
}

/// Every name: `setup` and `run`, which provision or use all of the objects.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Outbox objects")]
pub struct OutboxNames {
    #[command(flatten)]
    pub table: TableName,
    #[command(flatten)]
    pub publication: PublicationName,
    #[command(flatten)]
    pub slot: SlotName,
    #[command(flatten)]
    pub exchange: ExchangeName,
}

/// The names of a command that reads the table and publishes, without a slot: `poll` and
/// `resync`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Outbox objects")]
pub struct PublishNames {
    #[command(flatten)]
    pub table: TableName,
    #[command(flatten)]
    pub exchange: ExchangeName,
}

/// `status`'s names: the table (its backlog) and the slot (WAL mode).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Outbox objects")]
pub struct StatusNames {
    #[command(flatten)]
    pub table: TableName,
    #[command(flatten)]
    pub slot: SlotName,
}

/// `teardown`'s names: what it drops. The table and the exchange stay.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Outbox objects")]
pub struct SlotNames {
    #[command(flatten)]
    pub publication: PublicationName,
    #[command(flatten)]
    pub slot: SlotName,
}

// Names end up in SQL text (`setup --print-sql`, which a DBA pipes to psql), in the
// replication protocol's START_REPLICATION command and in logs. Quoting keeps quotes and
// spaces harmless; what no quoting fixes is refused here, when the flags are parsed, so no
// command ever renders it: control characters (a newline ends a `--` comment or a log line),
// `$` (dollar quoting: the generated SQL needs a DO block), names PostgreSQL would cut short
// (over 63 bytes: the relay would look for a name that does not exist) and empty names.

/// PostgreSQL's longest identifier (NAMEDATALEN - 1 bytes); longer ones are truncated.
const MAX_IDENTIFIER_BYTES: usize = 63;
/// AMQP's longest exchange name (a short string).
const MAX_EXCHANGE_BYTES: usize = 255;

/// What every name must satisfy: not empty, no control character, no `$`.
pub(super) fn check_name_text(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".into());
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(format!(
            "the name holds the control character U+{:04X}; names may not hold control \
             characters (newlines, tabs, escapes)",
            c as u32
        ));
    }
    if name.contains('$') {
        return Err(
            "the name holds a '$', which the relay's names may not (the SQL that \
                    `setup` generates uses dollar quoting)"
                .into(),
        );
    }
    Ok(())
}

/// A PostgreSQL identifier (publication, schema, table, LISTEN channel): any text PostgreSQL
/// takes quoted, up to 63 bytes, that [`check_name_text`] accepts.
pub(crate) fn parse_identifier(name: &str) -> Result<String, String> {
    check_name_text(name)?;
    if name.len() > MAX_IDENTIFIER_BYTES {
        return Err(format!(
            "the name is {} bytes long; PostgreSQL names hold at most {MAX_IDENTIFIER_BYTES} \
             bytes (it would cut this one short)",
            name.len()
        ));
    }
    Ok(name.to_string())
}

/// `table` or `schema.table`, each part an identifier.
pub(crate) fn parse_table_name(name: &str) -> Result<String, String> {
    check_name_text(name)?;
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 {
        return Err(
            "the name has more than one '.': name the table as `table` or \
                    `schema.table`"
                .into(),
        );
    }
    for part in &parts {
        if part.is_empty() {
            return Err("the schema or the table name is empty (`schema.table`)".into());
        }
        parse_identifier(part)?;
    }
    Ok(name.to_string())
}

/// A replication slot name: PostgreSQL allows only `[a-z0-9_]`, up to 63 bytes.
pub(crate) fn parse_slot_name(name: &str) -> Result<String, String> {
    check_name_text(name)?;
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(
            "slot names may hold only lower-case letters, digits and underscores \
                    (PostgreSQL's rule)"
                .into(),
        );
    }
    parse_identifier(name)
}

/// A RabbitMQ exchange name: up to 255 bytes, no control characters, no `$`.
pub(crate) fn parse_exchange_name(name: &str) -> Result<String, String> {
    check_name_text(name)?;
    if name.len() > MAX_EXCHANGE_BYTES {
        return Err(format!(
            "the name is {} bytes long; AMQP allows at most {MAX_EXCHANGE_BYTES}",
            name.len()
        ));
    }
    Ok(name.to_string())
}

/// `--exchange`: a name, or a template (src/contract/template.rs) that parses: a brace makes it one.
fn parse_exchange_or_template(text: &str) -> Result<String, String> {
    if text.contains(['{', '}']) {
        crate::contract::template::Template::parse(text)?;
    }
    parse_exchange_name(text)
}

/// `--allowed-exchanges`: each name in the list a valid exchange name (`*`, and the shape of
/// the list, are `AllowedExchanges::parse`'s to judge).
pub(super) fn parse_exchange_list(list: &str) -> Result<String, String> {
    for name in list.split(',').map(str::trim) {
        if !name.is_empty() && name != "*" {
            parse_exchange_name(name).map_err(|e| format!("{name:?}: {e}"))?;
        }
    }
    Ok(list.to_string())
}

/// `--dead-letter-exchange`: an exchange name, or empty for none (it is only needed with
/// `--on-unroutable dead-letter`, which says so when it is missing).
pub(super) fn parse_optional_exchange_name(name: &str) -> Result<String, String> {
    match name.trim() {
        "" => Ok(String::new()),
        _ => parse_exchange_name(name),
    }
}

impl TableName {
    /// Schema and table name, `public` when the table name is unqualified.
    pub fn table_parts(&self) -> (&str, &str) {
        match self.name.split_once('.') {
            Some((schema, table)) => (schema, table),
            None => ("public", self.name.as_str()),
        }
    }

    /// `"schema"."table"`, quoted for SQL text.
    pub fn qualified_table(&self) -> String {
        let (schema, table) = self.table_parts();
        format!(
            "{}.{}",
            outbox_common::quote::quote_ident(schema),
            outbox_common::quote::quote_ident(table)
        )
    }
}

impl OutboxNames {
    /// [`TableName::table_parts`] of --table.
    pub fn table_parts(&self) -> (&str, &str) {
        self.table.table_parts()
    }

    /// [`TableName::qualified_table`] of --table.
    pub fn qualified_table(&self) -> String {
        self.table.qualified_table()
    }
}
