//! The inbox's SQL: the table, its cleanup index and the two functions, rendered for a table
//! name, and `setup`, which applies them and says what it found.
//!
//! The SQL is the product here: a consumer in any language calls `inbox_claim` inside its own
//! transaction and `inbox_cleanup` from a job, so everything the Rust consumer relies on lives
//! in the database, not in this crate. `sql/inbox.sql` is the rendering for the default name
//! (a test keeps the two equal); `outbox-inbox setup --print-sql --table …` renders it for
//! another.
//!
//! Every name in the SQL is schema-qualified and quoted, so the functions behave the same
//! whatever the caller's `search_path`. `inbox_claim` has a SQL-standard body (`BEGIN
//! ATOMIC`, PostgreSQL 14+): PostgreSQL resolves its table when the function is created, and
//! refuses to create it against a table of another shape. `inbox_cleanup` counts each
//! consumer's window back from that consumer's own newest row (see `cleanup`): it visits the
//! consumer names one by one through the `(consumer, received_at)` index (a skip scan, one
//! probe per name), reads the name's newest row from the same index, and builds its DELETE
//! with the batch size as a literal (`EXECUTE format(…)`), so each batch is planned for its
//! own limit and reads that index, oldest first (a generic plan could guess a large limit and
//! prefer a sequential scan).
//!
//! Upgrades: `setup` on an inbox of an earlier version creates the `(consumer, received_at)`
//! index and then drops the `received_at` one that the window across all consumers used: with
//! both, the planner reads one consumer's old rows through `received_at` and filters out the
//! others', which is a scan of every consumer's old rows.

use std::fmt;

use outbox_common::quote::{quote_ident, quote_literal};
use tokio_postgres::Client;

use crate::error::InboxError;

/// The default inbox table (in schema `public`).
pub const DEFAULT_TABLE: &str = "inbox";

/// PostgreSQL's longest name (NAMEDATALEN - 1 bytes): it cuts longer ones short.
const MAX_NAME_BYTES: usize = 63;
/// The longest suffix a derived name adds to the table's (`_received_at_idx`, the index that
/// earlier versions created and `setup` drops).
const LONGEST_SUFFIX: &str = "_received_at_idx";

/// The inbox table and the names derived from it: `<table>_pkey`, `<table>_cleanup_idx`,
/// `<table>_claim` and `<table>_cleanup`, in the table's schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxTable {
    schema: String,
    table: String,
}

impl InboxTable {
    /// `table` (in schema `public`) or `schema.table`. Refused, naming the rule: an empty
    /// part, a control character, a `$` (the SQL is dollar-quoted), more than one `.`, a
    /// schema over 63 bytes or a table over 47 (its derived names must fit in 63).
    pub fn parse(name: &str) -> Result<InboxTable, String> {
        if let Some(c) = name.chars().find(|c| c.is_control()) {
            return Err(format!(
                "the name holds the control character U+{:04X}",
                c as u32
            ));
        }
        if name.contains('$') {
            return Err(
                "the name holds a '$', which the inbox's SQL (dollar-quoted) cannot".into(),
            );
        }
        let (schema, table) = match name.split_once('.') {
            Some((schema, table)) => (schema, table),
            None => ("public", name),
        };
        if table.contains('.') {
            return Err("the name has more than one '.': write `table` or `schema.table`".into());
        }
        if schema.is_empty() || table.is_empty() {
            return Err("the schema or the table name is empty (`schema.table`)".into());
        }
        if schema.len() > MAX_NAME_BYTES {
            return Err(format!(
                "the schema name is {} bytes long; PostgreSQL names hold at most \
                 {MAX_NAME_BYTES} bytes",
                schema.len()
            ));
        }
        let max_table = MAX_NAME_BYTES - LONGEST_SUFFIX.len();
        if table.len() > max_table {
            return Err(format!(
                "the table name is {} bytes long; at most {max_table}, so that \
                 `<table>{LONGEST_SUFFIX}` fits PostgreSQL's {MAX_NAME_BYTES} bytes",
                table.len()
            ));
        }
        Ok(InboxTable {
            schema: schema.to_string(),
            table: table.to_string(),
        })
    }

    /// `"schema"."table"`.
    pub fn qualified(&self) -> String {
        self.in_schema(&self.table)
    }

    /// `"schema"."<table>_claim"`: the claim function.
    pub fn claim_function(&self) -> String {
        self.in_schema(&format!("{}_claim", self.table))
    }

    /// `"schema"."<table>_cleanup"`: one cleanup batch.
    pub fn cleanup_function(&self) -> String {
        self.in_schema(&format!("{}_cleanup", self.table))
    }

    /// `<table>_cleanup_idx`, unquoted (an index lives in its table's schema): the cleanup's
    /// index, on `(consumer, received_at)`.
    pub fn index_name(&self) -> String {
        format!("{}_cleanup_idx", self.table)
    }

    /// `<table>_received_at_idx`, unquoted: the index on `received_at` alone that versions
    /// before the per-consumer window created; `setup` drops it.
    pub fn old_index_name(&self) -> String {
        format!("{}_received_at_idx", self.table)
    }

    /// `"schema"."name"`.
    fn in_schema(&self, name: &str) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(name))
    }
}

impl Default for InboxTable {
    fn default() -> Self {
        InboxTable {
            schema: "public".into(),
            table: DEFAULT_TABLE.into(),
        }
    }
}

impl fmt::Display for InboxTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

/// The DELETE of one cleanup batch of `batch` rows of one consumer, `$1` the consumer (text)
/// and `$2` its cutoff (timestamptz): the statement `inbox_cleanup` runs for each consumer
/// name, for reading its plan.
pub fn cleanup_batch_statement(table: &InboxTable, batch: u32) -> String {
    batch_delete(&table.qualified(), &batch.to_string())
}

/// One consumer's oldest rows past its window, through the `(consumer, received_at)` index,
/// found first and then deleted by `ctid` (a TID scan: the row addresses computed first can
/// only be probed, never joined by a scan of the whole table). Rows another cleanup holds are
/// skipped, so two cleanups never wait on each other. `limit` is text: a number, or
/// format()'s `%s`.
fn batch_delete(qualified: &str, limit: &str) -> String {
    format!(
        "DELETE FROM {qualified} WHERE ctid = ANY(ARRAY(\
         SELECT ctid FROM {qualified} \
         WHERE consumer = $1 AND received_at < $2 \
         ORDER BY received_at LIMIT {limit} FOR UPDATE SKIP LOCKED))"
    )
}

/// The whole provisioning script for `table`: what `setup` runs (in one transaction) and
/// `setup --print-sql` prints. Idempotent.
pub fn setup_sql(table: &InboxTable) -> String {
    let qualified = table.qualified();
    let pkey = quote_ident(&format!("{}_pkey", table.table));
    let index = quote_ident(&table.index_name());
    let old_index = table.in_schema(&table.old_index_name());
    let claim = table.claim_function();
    let cleanup = table.cleanup_function();
    // format() reads % as its own: a name's are doubled, the batch size goes in at %s.
    let batch_statement = quote_literal(&batch_delete(&qualified.replace('%', "%%"), "%s"));
    format!(
        r#"-- outbox-inbox provisioning (generated by `outbox-inbox setup --print-sql`).
-- Run it in the consumer's database, as a role that may create tables and functions there;
-- it is idempotent, and upgrades an inbox made by an earlier version. PostgreSQL 14 or later.
-- docs/consumers.md explains each part.

-- the inbox: one row per message a consumer applied, kept for the deduplication window
CREATE TABLE IF NOT EXISTS {qualified} (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL CHECK (message_id <> ''),
    received_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    outbox_seq  text,
    CONSTRAINT {pkey} PRIMARY KEY (consumer, message_id)
);

-- the cleanup reads each consumer's newest row and its oldest rows first. On a large inbox
-- of an earlier version, create it beforehand with CREATE INDEX CONCURRENTLY (same name and
-- columns): built here, it blocks the claims while it builds
CREATE INDEX IF NOT EXISTS {index} ON {qualified} (consumer, received_at);

-- true exactly once per (consumer, message_id): call it inside the transaction that applies
-- the message, and apply the message only when it returns true. A concurrent claim of the
-- same message waits for this transaction, then returns false if it committed.
CREATE OR REPLACE FUNCTION {claim}(
    consumer   text,
    message_id text,
    outbox_seq text DEFAULT NULL
) RETURNS boolean
LANGUAGE sql VOLATILE
BEGIN ATOMIC
    WITH claimed AS (
        INSERT INTO {qualified} (consumer, message_id, outbox_seq)
        VALUES ($1, $2, $3)
        ON CONFLICT (consumer, message_id) DO NOTHING
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM claimed);
END;

-- deletes one batch (at most batch_size rows) and returns how many: of each consumer, the
-- rows received more than retention before that consumer's newest row (or before now, if
-- that is earlier), oldest first. Call it in its own transaction until it returns less than
-- batch_size, so that no lock is held for long. Each consumer's window counts back from its
-- own newest row: a consumer that receives nothing (the relay or the consumer is down)
-- deletes nothing, whatever the others in the table receive, while the copies an outage
-- causes are still to come
CREATE OR REPLACE FUNCTION {cleanup}(
    retention  interval,
    batch_size integer DEFAULT 1000
) RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $inbox$
DECLARE
    who     text;
    cutoff  timestamptz;
    deleted integer;
    total   integer := 0;
BEGIN
    IF retention IS NULL OR retention < interval '0' OR batch_size IS NULL OR batch_size < 1 THEN
        RAISE EXCEPTION 'the retention must be an interval of at least 0 and batch_size at least 1 (got % and %)',
            retention, batch_size
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- each consumer name once, in order, one index probe each
    SELECT consumer INTO who FROM {qualified} ORDER BY consumer LIMIT 1;
    WHILE who IS NOT NULL AND total < batch_size LOOP
        SELECT LEAST(pg_catalog.now(), pg_catalog.max(received_at)) - retention
          INTO cutoff FROM {qualified} WHERE consumer = who;
        EXECUTE pg_catalog.format({batch_statement}, batch_size - total) USING who, cutoff;
        GET DIAGNOSTICS deleted = ROW_COUNT;
        total := total + deleted;
        SELECT consumer INTO who FROM {qualified} WHERE consumer > who ORDER BY consumer LIMIT 1;
    END LOOP;
    RETURN total;
END
$inbox$;

-- an earlier version's index on received_at alone: no longer read, and with it the planner
-- would find one consumer's old rows by filtering every consumer's
DROP INDEX IF EXISTS {old_index};
"#
    )
}

/// What `setup` found or did, one line per object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupReport {
    pub lines: Vec<String>,
}

impl fmt::Display for SetupReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.lines {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// Applies [`setup_sql`] in one transaction and reports, per object, whether it was created
/// or already there (the functions are replaced by this version either way), and the old
/// `received_at` index if it dropped one.
pub async fn setup(client: &mut Client, table: &InboxTable) -> Result<SetupReport, InboxError> {
    let index = table.in_schema(&table.index_name());
    let old_index = table.in_schema(&table.old_index_name());
    let claim = format!("{}(text, text, text)", table.claim_function());
    let cleanup = format!("{}(interval, integer)", table.cleanup_function());
    let txn = client.transaction().await?;
    let exists = |row: &tokio_postgres::Row, i: usize| row.get::<_, Option<String>>(i).is_some();
    let before = txn
        .query_one(
            "SELECT to_regclass($1)::text, to_regclass($2)::text, \
                    to_regprocedure($3)::text, to_regprocedure($4)::text, \
                    to_regclass($5)::text",
            &[&table.qualified(), &index, &claim, &cleanup, &old_index],
        )
        .await?;
    txn.batch_execute(&setup_sql(table))
        .await
        .map_err(|source| InboxError::Provisioning {
            what: format!(
                "Cannot provision the inbox {table}. If the table exists already, it must \
                 have the columns consumer, message_id and outbox_seq (text) and the primary \
                 key (consumer, message_id): compare it with `outbox-inbox setup --print-sql`"
            ),
            source,
        })?;
    txn.commit().await?;
    let state = |found: bool, created: &'static str| if found { "exists" } else { created };
    let replaced = |found: bool| if found { "replaced" } else { "created" };
    let mut lines = vec![
        format!("table {table}: {}", state(exists(&before, 0), "created")),
        format!(
            "index {}: {}",
            table.index_name(),
            state(exists(&before, 1), "created")
        ),
        format!(
            "function {}.{}_claim(text, text, text): {}",
            table.schema,
            table.table,
            replaced(exists(&before, 2))
        ),
        format!(
            "function {}.{}_cleanup(interval, integer): {}",
            table.schema,
            table.table,
            replaced(exists(&before, 3))
        ),
    ];
    if exists(&before, 4) {
        lines.push(format!(
            "index {}: dropped (the cleanup reads {})",
            table.old_index_name(),
            table.index_name()
        ));
    }
    Ok(SetupReport { lines })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_inbox_sql_is_the_rendering_for_the_default_name() {
        let file = include_str!("../../../sql/inbox.sql");
        assert_eq!(
            file,
            setup_sql(&InboxTable::default()),
            "sql/inbox.sql differs from the rendering: regenerate it with \
             `cargo run -p outbox-inbox -- setup --print-sql > sql/inbox.sql`"
        );
    }

    #[test]
    fn names_default_to_schema_public_and_are_quoted() {
        let table = InboxTable::parse("inbox").expect("valid");
        assert_eq!(table, InboxTable::default());
        assert_eq!(table.qualified(), r#""public"."inbox""#);
        let table = InboxTable::parse(r#"app.My "Inbox""#).expect("valid");
        assert_eq!(table.qualified(), r#""app"."My ""Inbox""""#);
        assert_eq!(table.claim_function(), r#""app"."My ""Inbox""_claim""#);
    }

    #[test]
    fn refuses_names_it_cannot_render_naming_the_rule() {
        for (name, rule) in [
            ("", "empty"),
            ("app.", "empty"),
            ("a.b.c", "more than one"),
            ("in$box", "'$'"),
            ("in\nbox", "control character"),
            (&"t".repeat(48), "at most 47"),
        ] {
            let error = InboxTable::parse(name).expect_err(name);
            assert!(error.contains(rule), "{name:?}: {error}");
        }
        assert!(InboxTable::parse(&"t".repeat(47)).is_ok());
    }

    #[test]
    fn the_cleanup_statement_survives_format_and_quoting() {
        // A name with % and ' must come out of format() unchanged.
        let table = InboxTable::parse("app.50% o'clock").expect("valid");
        let sql = setup_sql(&table);
        assert!(
            sql.contains(r#"'DELETE FROM "app"."50%% o''clock" WHERE ctid"#),
            "{sql}"
        );
        assert!(sql.contains("LIMIT %s FOR UPDATE SKIP LOCKED))', batch_size - total)"));
    }
}
