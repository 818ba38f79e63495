//! The relation cache, keyed by table OID.
//!
//! Invariants, from pgoutput: a Relation message arrives before the first row of a table in a
//! session and again after each schema change, so the cache always describes the rows that
//! follow. The cache lives for one session: a reconnect starts empty, and the server sends
//! every Relation again.
//!
//! Only the configured outbox table is mapped. A publication may cover other tables (a DBA's
//! choice); their rows are logged once and ignored, never published.

use std::collections::HashMap;
use std::sync::Arc;

use crate::contract::columns::ColumnMap;
use crate::contract::mapper::Layout;
use crate::contract::row_error::MapError;
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
    entries: HashMap<u32, Entry>,
}

impl RelationCache {
    pub fn new(schema: &str, table: &str, columns: Arc<ColumnMap>) -> Self {
        Self {
            schema: schema.to_string(),
            table: table.to_string(),
            columns,
            entries: HashMap::new(),
        }
    }

    pub fn update(&mut self, relation: &Relation) -> Result<(), MapError> {
        let entry = if relation.namespace == self.schema && relation.name == self.table {
            let layout = Layout::for_relation(relation, &self.columns)?;
            tracing::debug!(
                table = layout.table(),
                oid = relation.oid,
                "outbox relation"
            );
            Entry::Outbox(Box::new(layout))
        } else {
            if !self.entries.contains_key(&relation.oid) {
                tracing::warn!(
                    table = %relation.qualified_name(),
                    "the publication covers a table other than the outbox; its rows are ignored"
                );
            }
            Entry::Ignored
        };
        self.entries.insert(relation.oid, entry);
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

    #[test]
    fn maps_only_the_outbox_and_follows_schema_changes() {
        let mut cache = RelationCache::new("public", "outbox", Arc::default());
        assert!(cache.get(1).is_err(), "row before Relation");
        cache
            .update(&relation(1, "outbox", &["id", "event_type"]))
            .expect("outbox");
        cache
            .update(&relation(2, "orders", &["id"]))
            .expect("other table");
        assert!(matches!(cache.get(1), Ok(Known::Outbox(_))));
        assert!(matches!(cache.get(2), Ok(Known::Ignored)));
        // A schema change that drops a required column is a definite error.
        assert!(cache.update(&relation(1, "outbox", &["id"])).is_err());
    }
}
