//! The relation cache, keyed by table OID.
//!
//! Invariants, from pgoutput: a Relation message arrives before the first row of a table in a
//! session and again after each schema change, so the cache always describes the rows that
//! follow. The cache lives for one session: a reconnect starts empty, and the server sends
//! every Relation again.
//!
//! Only the configured outbox table is mapped. A publication may cover other tables (a DBA's
//! choice); their rows are logged once and ignored, never published.
//!
//! A Relation carries the table's name as it was when the row was written (decoding reads
//! the catalog as of then), so a renamed table shows up as its OID under another name. The
//! outbox table is the one the configured name names when the session starts
//! ([`OutboxTable`]); for it, or a table this session streamed as the outbox, under another
//! name (ALTER TABLE … RENAME / SET SCHEMA):
//!
//! ```text
//!  committed after the session start   renamed now, as far as the relay knows: a definite
//!                                      error (OutboxRenamed), before anything of it is
//!                                      acknowledged; never a reason to ignore its rows
//!  committed before, the outbox now    renamed and back since: its rows are the outbox's
//!  committed before, another table     the table was replaced (another one has the name now):
//!  has the name now                    its later rows are not the outbox's; ignored, with a
//!                                      warning naming them
//! ```
//!
//! A table of another OID under the configured name (dropped and created again) is the
//! outbox, by its name; the relay warns that rows written to it before it joined the
//! publication were not decoded.

use std::collections::HashMap;
use std::sync::Arc;

use pgwire_replication::Lsn;

use crate::advice::{self, Warning};
use crate::catalog::preflight::OutboxTable;
use crate::contract::columns::ColumnMap;
use crate::contract::mapper::Layout;
use crate::error::CatalogError;
use crate::error::RelayError;
use crate::pgoutput::Relation;

pub enum Known<'a> {
    Outbox(&'a Layout),
    Ignored,
}

enum Entry {
    /// Boxed: a Layout is large beside `Ignored`, and looked up once per row either way.
    Outbox(Box<Layout>),
    Ignored,
}

pub struct RelationCache {
    schema: String,
    table: String,
    /// Which of the table's columns holds each contract column: applied once per Relation.
    columns: Arc<ColumnMap>,
    /// The table the configured name named when the session started.
    outbox: OutboxTable,
    entries: HashMap<u32, Entry>,
}

impl RelationCache {
    pub fn new(schema: &str, table: &str, columns: Arc<ColumnMap>, outbox: OutboxTable) -> Self {
        Self {
            schema: schema.to_string(),
            table: table.to_string(),
            columns,
            outbox,
            entries: HashMap::new(),
        }
    }

    /// Takes a Relation that arrived in the transaction committing at `commit_lsn` (pgoutput
    /// sends it inside the transaction, before the table's first row there; `None` outside
    /// one, which is taken as the present).
    pub fn update(
        &mut self,
        relation: &Relation,
        commit_lsn: Option<Lsn>,
    ) -> Result<(), RelayError> {
        let oid = relation.oid;
        let named = relation.namespace == self.schema && relation.name == self.table;
        let streamed_as_outbox = matches!(self.entries.get(&oid), Some(Entry::Outbox(_)));
        let entry = if named {
            if oid != self.outbox.oid && !streamed_as_outbox {
                self.warn_recreated(relation);
            }
            self.outbox_entry(relation)?
        } else if oid == self.outbox.oid || streamed_as_outbox {
            let before_start = commit_lsn.is_some_and(|lsn| lsn < self.outbox.named_since);
            match (oid == self.outbox.oid, before_start) {
                (true, true) => {
                    tracing::info!(
                        table = %relation.qualified_name(),
                        outbox = %self.configured(),
                        oid,
                        "rows the outbox table took while it was named otherwise (it has its \
                         name back): publishing them"
                    );
                    self.outbox_entry(relation)?
                }
                (false, true) => {
                    self.warn_replaced(relation);
                    Entry::Ignored
                }
                (_, false) => {
                    return Err(RelayError::Catalog(CatalogError::OutboxRenamed {
                        oid,
                        from: (self.schema.clone(), self.table.clone()),
                        to: (relation.namespace.clone(), relation.name.clone()),
                    }))
                }
            }
        } else {
            if !self.entries.contains_key(&oid) {
                tracing::warn!(
                    table = %relation.qualified_name(),
                    "the publication covers a table other than the outbox; its rows are ignored"
                );
            }
            Entry::Ignored
        };
        self.entries.insert(oid, entry);
        Ok(())
    }

    pub fn get(&self, oid: u32) -> Result<Known<'_>, RelayError> {
        match self.entries.get(&oid) {
            Some(Entry::Outbox(layout)) => Ok(Known::Outbox(layout)),
            Some(Entry::Ignored) => Ok(Known::Ignored),
            None => Err(RelayError::Protocol(format!(
                "a row of relation {oid} arrived before its Relation message"
            ))),
        }
    }

    fn outbox_entry(&self, relation: &Relation) -> Result<Entry, RelayError> {
        let layout = Layout::for_relation(relation, &self.columns)?;
        tracing::debug!(
            table = layout.table(),
            oid = relation.oid,
            "outbox relation"
        );
        Ok(Entry::Outbox(Box::new(layout)))
    }

    fn configured(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }

    /// A table of another OID under the outbox's name: dropped and created again.
    fn warn_recreated(&self, relation: &Relation) {
        tracing::warn!(
            table = %self.configured(),
            oid = relation.oid,
            outbox_oid = self.outbox.oid,
            "{}",
            advice::warning(
                "rows of another table than the one named so now arrive under the outbox \
                 table's name: it was dropped and created again. Unless the publication covers \
                 all tables, rows written to the new table before it was added to the \
                 publication were not decoded and are in no slot",
                Warning::OutboxRecreated
            )
        );
    }

    /// The table this session streamed as the outbox, under another name, in a transaction
    /// that committed before the session started, while another table has the name now.
    fn warn_replaced(&self, relation: &Relation) {
        tracing::warn!(
            table = %relation.qualified_name(),
            outbox = %self.configured(),
            oid = relation.oid,
            "{}",
            advice::warning(
                "rows written to the former outbox table after it was renamed are not \
                 published: another table has the outbox's name now",
                Warning::FormerOutboxRows
            )
        );
    }
}

// wal/source.rs's tests build their Relations with `relation` too.
#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::pgoutput::Column;

    pub(in crate::wal) fn relation(oid: u32, name: &str, columns: &[&str]) -> Relation {
        Relation {
            oid,
            namespace: "public".into(),
            name: name.into(),
            replica_identity: b'd',
            columns: columns
                .iter()
                .map(|c| Column {
                    flags: 0,
                    name: (*c).into(),
                    type_oid: 25,
                    type_modifier: -1,
                })
                .collect(),
        }
    }

    /// The cache of a session that started at `start`, the outbox table then being OID 1.
    fn session_cache(start: u64) -> RelationCache {
        let outbox = OutboxTable {
            oid: 1,
            named_since: Lsn::from_u64(start),
        };
        RelationCache::new("public", "outbox", Arc::default(), outbox)
    }

    fn at(lsn: u64) -> Option<Lsn> {
        Some(Lsn::from_u64(lsn))
    }

    #[test]
    fn maps_only_the_outbox_and_follows_schema_changes() {
        let mut cache = session_cache(0x100);
        assert!(cache.get(1).is_err(), "row before Relation");
        cache
            .update(&relation(1, "outbox", &["id", "event_type"]), at(0x200))
            .expect("outbox");
        cache
            .update(&relation(2, "orders", &["id"]), at(0x200))
            .expect("other table");
        assert!(matches!(cache.get(1), Ok(Known::Outbox(_))));
        assert!(matches!(cache.get(2), Ok(Known::Ignored)));
        // A schema change that drops a required column is a definite error.
        assert!(cache
            .update(&relation(1, "outbox", &["id"]), at(0x300))
            .is_err());
    }

    /// The outbox's OID under another name or schema, in a transaction committed after the
    /// session started, is a definite error naming both names; before it (renamed and back
    /// since), its rows are the outbox's.
    #[test]
    fn a_renamed_outbox_is_an_error_unless_it_has_its_name_back() {
        let columns = ["id", "event_type"];
        let mut cache = session_cache(0x100);
        cache
            .update(&relation(1, "outbox_old", &columns), at(0x80))
            .expect("history");
        assert!(matches!(cache.get(1), Ok(Known::Outbox(_))));
        cache
            .update(&relation(1, "outbox", &columns), at(0x90))
            .expect("its name back");

        let renamed = cache.update(&relation(1, "outbox_new", &columns), at(0x100));
        let Err(RelayError::Catalog(CatalogError::OutboxRenamed { oid, from, to })) = renamed
        else {
            panic!("a rename after the start is an error");
        };
        assert_eq!(oid, 1);
        assert_eq!(from, ("public".to_string(), "outbox".to_string()));
        assert_eq!(to, ("public".to_string(), "outbox_new".to_string()));

        let mut moved = relation(1, "outbox", &columns);
        moved.namespace = "archive".into();
        let mut cache = session_cache(0x100);
        assert!(matches!(
            cache.update(&moved, at(0x200)),
            Err(RelayError::Catalog(CatalogError::OutboxRenamed { .. }))
        ));
        // Outside a transaction (pgoutput never sends it so) it is taken as the present.
        assert!(matches!(
            cache.update(&moved, None),
            Err(RelayError::Catalog(CatalogError::OutboxRenamed { .. }))
        ));
    }

    /// A table of another OID under the outbox's name (dropped and created again) is the
    /// outbox; the table it replaced, renamed before the session started, is not any more.
    #[test]
    fn a_replaced_outbox_is_the_table_that_has_the_name() {
        let columns = ["id", "event_type"];
        let mut cache = session_cache(0x100);
        // Table 5 was the outbox, then renamed, and table 1 took the name.
        cache
            .update(&relation(5, "outbox", &columns), at(0x10))
            .expect("the former outbox, by its name then");
        assert!(matches!(cache.get(5), Ok(Known::Outbox(_))));
        cache
            .update(&relation(5, "outbox_2025", &columns), at(0x20))
            .expect("replaced before the start");
        assert!(matches!(cache.get(5), Ok(Known::Ignored)));
        cache
            .update(&relation(1, "outbox", &columns), at(0x30))
            .expect("the outbox now");
        assert!(matches!(cache.get(1), Ok(Known::Outbox(_))));
        // Table 7 takes the name while the session runs: the outbox too, by its name; and
        // renamed in its turn, an error.
        cache
            .update(&relation(7, "outbox", &columns), at(0x200))
            .expect("recreated");
        assert!(matches!(cache.get(7), Ok(Known::Outbox(_))));
        assert!(matches!(
            cache.update(&relation(7, "outbox_x", &columns), at(0x300)),
            Err(RelayError::Catalog(CatalogError::OutboxRenamed { .. }))
        ));
    }
}
