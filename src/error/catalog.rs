//! Errors of what PostgreSQL's catalog says of the relay's objects: `wal_level`, the
//! publication and its row filter, the outbox table (missing, renamed, dropped and created
//! again), the role's replication attribute. All definite: the relay stops, naming the object
//! and the fix (src/advice.rs).

use super::kind::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(
        "PostgreSQL has wal_level = '{actual}', but logical replication needs wal_level = \
         'logical'"
    )]
    WalLevel { actual: String },

    #[error("The publication \"{publication}\" does not exist")]
    PublicationMissing { publication: String, table: String },

    #[error(
        "The publication \"{publication}\" does not include the table {table}{}",
        match covers.as_slice() {
            [] => String::new(),
            tables => format!(" (it includes {})", tables.join(", ")),
        }
    )]
    PublicationDoesNotCoverTable {
        publication: String,
        table: String,
        /// The tables it does include (a few): a renamed outbox table is among them.
        covers: Vec<String>,
    },

    #[error(
        "The publication \"{publication}\" {found}, but shard {shard} of --shards {shards} \
         needs the row filter `{expected}`: a relay whose shards differ from its \
         publication's would skip rows or deliver them twice"
    )]
    ShardFilterMismatch {
        publication: String,
        shard: u32,
        shards: u32,
        /// "has the row filter `…`" or "has no row filter".
        found: String,
        expected: String,
    },

    #[error("The table {table} does not exist")]
    TableMissing { table: String },

    /// The outbox table's OID arrived in the stream under another name or schema: renamed
    /// (ALTER TABLE … RENAME / SET SCHEMA) while the relay streamed it. `from` and `to` are
    /// (schema, table).
    #[error(
        "The outbox table {}.{} was renamed to {}.{} (table OID {oid}) and rows were written to \
         it under the new name: the relay publishes the table --table names, so it stops \
         before those rows, with none of them acknowledged",
        from.0, from.1, to.0, to.1
    )]
    OutboxRenamed {
        oid: u32,
        from: (String, String),
        to: (String, String),
    },

    /// The publication stopped including the outbox table while the relay streamed: the
    /// table was dropped and created again (DROP TABLE takes it out of the publication), or
    /// taken out of the publication.
    #[error(
        "The publication \"{publication}\" no longer includes the outbox table {table}{}: rows \
         written to it now are decoded by no slot, so the relay stops rather than run on \
         without them",
        if *recreated { " (the table was dropped and created again)" } else { "" }
    )]
    OutboxUnpublished {
        publication: String,
        table: String,
        recreated: bool,
    },

    #[error(
        "The database role {} may not use replication: it lacks the REPLICATION attribute",
        role.as_deref().map(|r| format!("\"{r}\"")).unwrap_or_else(|| "of the database URL".into())
    )]
    NoReplicationPrivilege { role: Option<String> },

    #[error(
        "The role may not drop the publication \"{publication}\" (owned by {owner}): only its \
         owner or a superuser can.{}",
        if slot_note.is_empty() { String::new() } else { format!(" {slot_note}") }
    )]
    PublicationNotOwned {
        publication: String,
        owner: String,
        slot_note: String,
    },
}

impl CatalogError {
    /// What kind of failure this is (src/error/mod.rs, [`ErrorKind`]).
    pub(crate) fn kind(&self) -> ErrorKind {
        use CatalogError::*;
        match self {
            ShardFilterMismatch { .. } => ErrorKind::Config,
            WalLevel { .. }
            | PublicationMissing { .. }
            | PublicationDoesNotCoverTable { .. }
            | TableMissing { .. }
            | OutboxRenamed { .. }
            | OutboxUnpublished { .. }
            | NoReplicationPrivilege { .. }
            | PublicationNotOwned { .. } => ErrorKind::Provisioning,
        }
    }
}
