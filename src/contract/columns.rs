//! The outbox table's column names: one list for the mapper, polling, resync, cleanup and
//! shards, and the [`ColumnMap`] that says which of the table's columns holds each.
//!
//! The constants are the message contract's names (docs/consumers.md, "The message contract"),
//! and the names of the table `setup` creates. A table of another design (Debezium's Outbox
//! Event Router, a framework's) is read through a [`ColumnMap`] (`--table-layout`, `--column`,
//! docs/table-layouts.md): every contract column is looked up there once per Relation (or per
//! connect, for SQL), never per row. A column the map leaves unmapped is absent, as if the
//! table did not have it.

pub(crate) const ID: &str = "id";
pub(crate) const EVENT_TYPE: &str = "event_type";
pub(crate) const PAYLOAD: &str = "payload";
pub(crate) const HEADERS: &str = "headers";
pub(crate) const CREATED_AT: &str = "created_at";
pub(crate) const EXCHANGE: &str = "exchange";
pub(crate) const ROUTING_KEY: &str = "routing_key";
pub(crate) const AGGREGATE_TYPE: &str = "aggregate_type";
pub(crate) const AGGREGATE_ID: &str = "aggregate_id";
/// W3C trace context (src/contract/trace_context.rs), sent as the headers of the same names.
pub(crate) const TRACEPARENT: &str = "traceparent";
pub(crate) const TRACESTATE: &str = "tracestate";
/// Debezium's trace context: java.util.Properties text with `traceparent` and `tracestate`.
pub(crate) const TRACING_SPAN_CONTEXT: &str = "tracing_span_context";
/// Polling mode only: marks a claimed row published (NULL until then).
pub(crate) const PUBLISHED_AT: &str = "published_at";

/// The columns a message is made of, read when the table has them; others are ignored.
pub(crate) const CONTRACT: [&str; 12] = [
    ID,
    EVENT_TYPE,
    PAYLOAD,
    HEADERS,
    CREATED_AT,
    EXCHANGE,
    ROUTING_KEY,
    AGGREGATE_TYPE,
    AGGREGATE_ID,
    TRACEPARENT,
    TRACESTATE,
    TRACING_SPAN_CONTEXT,
];

/// The columns every message needs: a map cannot leave them unmapped.
pub(crate) const REQUIRED: [&str; 2] = [ID, EVENT_TYPE];

/// Every column a [`ColumnMap`] maps: the contract, then polling mode's `published_at`.
pub(crate) const MAPPABLE: [&str; CONTRACT.len() + 1] = {
    let mut all = [PUBLISHED_AT; CONTRACT.len() + 1];
    let mut i = 0;
    while i < CONTRACT.len() {
        all[i] = CONTRACT[i];
        i += 1;
    }
    all
};

/// The flag that maps a column, for errors that tell how to map one.
pub(crate) const COLUMN_FLAG: &str = "--column";

/// The flag that sends a column as a header.
pub(crate) const HEADER_COLUMN_FLAG: &str = "--header-column";

/// A column of the table sent as an AMQP header of every message (`--header-column`), as
/// Debezium's `table.fields.additional.placement` does with `header`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderColumn {
    pub column: String,
    pub header: String,
}

/// A preset of column names (`--table-layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// The table `setup` creates: every column under its contract name.
    Default,
    /// Debezium's Outbox Event Router with its defaults: `id`, `aggregatetype`,
    /// `aggregateid`, `type`, `payload`, `tracingspancontext`; no `created_at`, headers,
    /// exchange or routing key.
    Debezium,
}

/// Which column of the table holds each contract column (`None`: the table has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnMap {
    /// In [`MAPPABLE`]'s order.
    columns: [Option<String>; MAPPABLE.len()],
    /// Sent as headers, in the order given.
    header_columns: Vec<HeaderColumn>,
}

impl Default for ColumnMap {
    fn default() -> Self {
        Self::preset(Preset::Default)
    }
}

impl ColumnMap {
    /// The preset's map.
    pub fn preset(preset: Preset) -> Self {
        let mut map = Self {
            columns: MAPPABLE.map(|name| Some(name.to_string())),
            header_columns: Vec::new(),
        };
        if preset == Preset::Debezium {
            for (contract, column) in [
                (ID, Some("id")),
                (EVENT_TYPE, Some("type")),
                (PAYLOAD, Some("payload")),
                (AGGREGATE_TYPE, Some("aggregatetype")),
                (AGGREGATE_ID, Some("aggregateid")),
                (TRACING_SPAN_CONTEXT, Some("tracingspancontext")),
                (HEADERS, None),
                (CREATED_AT, None),
                (EXCHANGE, None),
                (ROUTING_KEY, None),
                (PUBLISHED_AT, None),
            ] {
                map.columns[slot(contract)] = column.map(str::to_string);
            }
        }
        map
    }

    /// The preset's map with `overrides` (`CONTRACT=COLUMN` each; `CONTRACT=` leaves an
    /// optional column unmapped) applied over it. Errors name the flag: an entry that is not
    /// `CONTRACT=COLUMN`, an unknown contract column, one mapped twice, a required one left
    /// unmapped, two contract columns on one table column.
    pub fn resolve(preset: Preset, overrides: &[String]) -> Result<Self, String> {
        let mut map = Self::preset(preset);
        let mut seen: Vec<&'static str> = Vec::new();
        for entry in overrides {
            let Some((contract, column)) = entry.split_once('=') else {
                return Err(format!(
                    "{COLUMN_FLAG} {entry:?}: expected CONTRACT=COLUMN, e.g. \
                     {COLUMN_FLAG} event_type=type"
                ));
            };
            let (contract, column) = (contract.trim(), column.trim());
            let Some(contract) = MAPPABLE.iter().copied().find(|name| *name == contract) else {
                return Err(format!(
                    "{COLUMN_FLAG} {entry:?}: \"{contract}\" is not a column of the message \
                     contract; the columns are {}",
                    MAPPABLE.join(", ")
                ));
            };
            if seen.contains(&contract) {
                return Err(format!(
                    "{COLUMN_FLAG}: \"{contract}\" is mapped twice (OUTBOX_COLUMNS and the \
                     command line are one list); map each contract column once"
                ));
            }
            seen.push(contract);
            if column.is_empty() && REQUIRED.contains(&contract) {
                return Err(format!(
                    "{COLUMN_FLAG} {entry:?}: every message needs \"{contract}\"; map it to \
                     one of the table's columns"
                ));
            }
            if let Err(problem) = check_column_name(column) {
                return Err(format!(
                    "{COLUMN_FLAG} {entry:?}: the column name {problem}"
                ));
            }
            map.columns[slot(contract)] = (!column.is_empty()).then(|| column.to_string());
        }
        for (i, column) in map.columns.iter().enumerate() {
            let Some(column) = column else { continue };
            if let Some(j) = (i + 1..MAPPABLE.len())
                .find(|&j| map.columns[j].as_deref() == Some(column.as_str()))
            {
                return Err(format!(
                    "{COLUMN_FLAG}: \"{}\" and \"{}\" are both mapped to the column \
                     \"{column}\"; each contract column needs a column of its own (map one \
                     elsewhere, or leave an optional one unmapped with {COLUMN_FLAG} {}=)",
                    MAPPABLE[i], MAPPABLE[j], MAPPABLE[j]
                ));
            }
        }
        Ok(map)
    }

    /// The map with `entries` (`COLUMN[=HEADER]` each; the header is named like the column
    /// when `=HEADER` is left out) as header columns. Errors name the flag: a column name
    /// quoting cannot make safe, an empty or over-long header name, a column or a header
    /// given twice.
    pub fn with_header_columns(mut self, entries: &[String]) -> Result<Self, String> {
        for entry in entries {
            let (column, header) = match entry.split_once('=') {
                Some((column, header)) => (column.trim(), header.trim()),
                None => (entry.trim(), entry.trim()),
            };
            if column.is_empty() || header.is_empty() {
                return Err(format!(
                    "{HEADER_COLUMN_FLAG} {entry:?}: expected COLUMN or COLUMN=HEADER, e.g. \
                     {HEADER_COLUMN_FLAG} tenant_id=x-tenant"
                ));
            }
            if let Err(problem) = check_column_name(column) {
                return Err(format!(
                    "{HEADER_COLUMN_FLAG} {entry:?}: the column name {problem}"
                ));
            }
            if header.len() > 255 {
                return Err(format!(
                    "{HEADER_COLUMN_FLAG} {entry:?}: the header name is {} bytes long; AMQP \
                     allows at most 255",
                    header.len()
                ));
            }
            if let Some(earlier) = self
                .header_columns
                .iter()
                .find(|h| h.column == column || h.header == header)
            {
                return Err(format!(
                    "{HEADER_COLUMN_FLAG} {entry:?}: the column \"{}\" or the header \"{}\" \
                     is given twice (OUTBOX_HEADER_COLUMNS and the command line are one list)",
                    earlier.column, earlier.header
                ));
            }
            self.header_columns.push(HeaderColumn {
                column: column.to_string(),
                header: header.to_string(),
            });
        }
        Ok(self)
    }

    /// The columns sent as headers (`--header-column`).
    pub fn header_columns(&self) -> &[HeaderColumn] {
        &self.header_columns
    }

    /// Whether a message reads the table's `column`: a contract column or a header column.
    pub fn reads(&self, column: &str) -> bool {
        self.contract_of(column)
            .is_some_and(|contract| CONTRACT.contains(&contract))
            || self.header_columns.iter().any(|h| h.column == column)
    }

    /// The table's column for `contract` (one of [`MAPPABLE`]); `None` when unmapped.
    pub fn column(&self, contract: &str) -> Option<&str> {
        MAPPABLE
            .iter()
            .position(|name| *name == contract)
            .and_then(|i| self.columns[i].as_deref())
    }

    /// The table's column for `contract` as SQL: bare when it is the contract's own name
    /// (those are plain lower-case non-keywords, so the SQL reads as the docs show it),
    /// quoted otherwise; `None` when unmapped.
    pub fn sql(&self, contract: &str) -> Option<String> {
        self.column(contract)
            .map(|column| match column == contract {
                true => column.to_string(),
                false => outbox_common::quote::quote_ident(column),
            })
    }

    /// The contract column the table's `column` holds, if any.
    pub fn contract_of(&self, column: &str) -> Option<&'static str> {
        self.columns
            .iter()
            .position(|mapped| mapped.as_deref() == Some(column))
            .map(|i| MAPPABLE[i])
    }

    /// Whether every contract column is under its own name and no column is a header (the
    /// table `setup` creates, read as it is).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The contract columns whose table column differs from the default table's (renamed or
    /// unmapped), for messages that say what a map changes.
    pub fn changed(&self) -> Vec<&'static str> {
        let default = Self::default();
        MAPPABLE
            .iter()
            .enumerate()
            .filter(|(i, _)| self.columns[*i] != default.columns[*i])
            .map(|(_, name)| *name)
            .collect()
    }

    /// `contract=column` for each contract column, `contract=` when unmapped, then
    /// `header:column=header` for each header column (logs, errors).
    pub fn describe(&self) -> String {
        MAPPABLE
            .iter()
            .zip(&self.columns)
            .map(|(contract, column)| format!("{contract}={}", column.as_deref().unwrap_or("")))
            .chain(
                self.header_columns
                    .iter()
                    .map(|h| format!("header:{}={}", h.column, h.header)),
            )
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `contract`'s index in [`MAPPABLE`]; only called with its constants.
fn slot(contract: &str) -> usize {
    MAPPABLE
        .iter()
        .position(|name| *name == contract)
        .unwrap_or(0)
}

/// What quoting cannot make harmless in a column name (the same rules as the other names:
/// src/config/names.rs): over 63 bytes, control characters, `$`.
fn check_column_name(column: &str) -> Result<(), String> {
    if column.len() > 63 {
        return Err(format!(
            "is {} bytes long; PostgreSQL names have at most 63",
            column.len()
        ));
    }
    if column.chars().any(|c| c.is_control() || c == '$') {
        return Err("may not contain control characters or `$`".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overrides(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn the_default_map_is_the_identity() {
        let map = ColumnMap::default();
        for name in MAPPABLE {
            assert_eq!(map.column(name), Some(name));
            assert_eq!(map.contract_of(name), Some(name));
        }
        assert!(map.is_default());
        assert!(map.changed().is_empty());
    }

    #[test]
    fn the_debezium_preset_maps_the_routers_defaults() {
        let map = ColumnMap::preset(Preset::Debezium);
        assert_eq!(map.column(ID), Some("id"));
        assert_eq!(map.column(EVENT_TYPE), Some("type"));
        assert_eq!(map.column(PAYLOAD), Some("payload"));
        assert_eq!(map.column(AGGREGATE_TYPE), Some("aggregatetype"));
        assert_eq!(map.column(AGGREGATE_ID), Some("aggregateid"));
        assert_eq!(map.column(TRACING_SPAN_CONTEXT), Some("tracingspancontext"));
        for absent in [HEADERS, CREATED_AT, EXCHANGE, ROUTING_KEY, PUBLISHED_AT] {
            assert_eq!(map.column(absent), None, "{absent}");
        }
        assert_eq!(map.contract_of("type"), Some(EVENT_TYPE));
        assert_eq!(map.contract_of("event_type"), None);
        assert!(!map.is_default());
    }

    #[test]
    fn explicit_columns_override_the_preset() {
        let map = ColumnMap::resolve(
            Preset::Debezium,
            &overrides(&["created_at=occurred_at", " event_type = kind ", "payload="]),
        )
        .expect("map");
        assert_eq!(map.column(CREATED_AT), Some("occurred_at"));
        assert_eq!(map.column(EVENT_TYPE), Some("kind"));
        assert_eq!(map.column(PAYLOAD), None);
        assert_eq!(map.column(AGGREGATE_ID), Some("aggregateid"));
        let map =
            ColumnMap::resolve(Preset::Default, &overrides(&["event_type=type"])).expect("map");
        assert_eq!(map.column(EVENT_TYPE), Some("type"));
        assert_eq!(map.changed(), vec![EVENT_TYPE]);
        assert_eq!(map.column(ID), Some("id"));
    }

    #[test]
    fn bad_mappings_are_refused_naming_the_flag() {
        for (entries, expected) in [
            (&["event_type"][..], "expected CONTRACT=COLUMN"),
            (
                &["kind=type"][..],
                "\"kind\" is not a column of the message contract",
            ),
            (
                &["event_type=type", "event_type=kind"][..],
                "\"event_type\" is mapped twice",
            ),
            (&["id="][..], "every message needs \"id\""),
            (&["event_type=id"][..], "both mapped to the column \"id\""),
            (&["event_type=a$b"][..], "`$`"),
        ] {
            let error =
                ColumnMap::resolve(Preset::Default, &overrides(entries)).expect_err("refused");
            assert!(error.starts_with("--column"), "{error}");
            assert!(error.contains(expected), "{entries:?}: {error}");
        }
    }

    #[test]
    fn describe_lists_every_column() {
        let map = ColumnMap::preset(Preset::Debezium);
        let text = map.describe();
        assert!(
            text.starts_with("id=id,event_type=type,payload=payload,headers=,"),
            "{text}"
        );
        assert!(text.ends_with("published_at="), "{text}");
        let map = map
            .with_header_columns(&overrides(&["tenant_id=x-tenant"]))
            .expect("map");
        assert!(map.describe().ends_with(",header:tenant_id=x-tenant"));
    }

    #[test]
    fn header_columns_are_read_and_checked() {
        let map = ColumnMap::default()
            .with_header_columns(&overrides(&["tenant_id = x-tenant", "region"]))
            .expect("map");
        assert_eq!(
            map.header_columns(),
            [
                HeaderColumn {
                    column: "tenant_id".into(),
                    header: "x-tenant".into()
                },
                HeaderColumn {
                    column: "region".into(),
                    header: "region".into()
                },
            ]
        );
        assert!(map.reads("tenant_id") && map.reads("event_type") && !map.reads("other"));
        assert!(
            !map.reads(PUBLISHED_AT),
            "polling's column is not part of a message"
        );
        assert!(!map.is_default());
        let long = "h".repeat(256);
        for (entries, expected) in [
            (vec!["=x".to_string()], "expected COLUMN or COLUMN=HEADER"),
            (vec!["a$b".to_string()], "`$`"),
            (vec![format!("a={long}")], "at most 255"),
            (vec!["a=x".into(), "b=x".into()], "given twice"),
            (vec!["a=x".into(), "a=y".into()], "given twice"),
        ] {
            let error = ColumnMap::default()
                .with_header_columns(&entries)
                .expect_err("refused");
            assert!(error.starts_with(HEADER_COLUMN_FLAG), "{error}");
            assert!(error.contains(expected), "{entries:?}: {error}");
        }
    }
}
