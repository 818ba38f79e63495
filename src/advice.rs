//! What an operator does about an error: the "Fix:" that follows its message.
//!
//! An error says what is wrong (`crate::error`); this module says how to repair it, with the
//! commands, flags and SQL that apply. The SQL is what a DBA pastes into psql, so every name
//! in it is quoted where needed (a name that reached the configuration can hold anything).
//! Kept apart from the error types because advice needs the names of commands, flags and
//! quoting, which the error types must not depend on.
//!
//! Every error the relay reports to a person goes through [`report`], and every warning that
//! says what to do through [`warning`]. No other file of src/ writes a "Fix:"
//! (tests/layout.rs checks it).

use outbox_common::pg::{Unreachable, UrlProblem};
use tokio_postgres::error::SqlState;

use crate::error::{BrokerError, CatalogError, SlotError};
use crate::error::{ConfigProblem, MapProblem, RelayError, SlotProblem, TlsProblem};
use outbox_common::error::chain;
use outbox_common::quote::quote_ident;

/// The error, its sources, and what to do about it, on one line.
pub(crate) fn report(error: &RelayError) -> String {
    let text = chain(error);
    match fix(error) {
        Some(fix) => with_fix(&text, &fix),
        None => text,
    }
}

/// A periodic job's failed round is reported like any error of the relay, with its fix.
impl outbox_common::periodic::RoundError for RelayError {
    fn timed_out(bound: std::time::Duration) -> Self {
        RelayError::DatabaseTimeout {
            seconds: bound.as_secs(),
        }
    }

    fn describe(&self) -> String {
        report(self)
    }
}

/// What is wrong, then what to do about it: the one place the relay writes a "Fix:" (the
/// shared crate's connections write their two warnings' own: outbox_common::pg).
fn with_fix(text: &str, fix: &str) -> String {
    format!("{text}. Fix: {fix}")
}

/// A condition the relay warns about and runs on. The warning says what is wrong where it
/// is found; what to do about it is here, as it is for errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Warning<'a> {
    /// A secret file (`path`) its group or others may read.
    SecretFileReadable { path: &'a str },
    /// Polling without the partial index its claims read through.
    NoClaimIndex,
    /// The server invalidates slots idle longer than `idle_replication_slot_timeout`.
    IdleSlotsExpire,
    /// The slot is not a failover slot (PostgreSQL 17+).
    NotFailoverSlot,
    /// A failover slot without `synchronized_standby_slots` on the primary.
    StandbySlotsUnset,
    /// A standby named in `synchronized_standby_slots` holds the relay back.
    WaitingForStandby,
    /// The relay's state table is missing or the role may not use it.
    StateTableUnusable,
    /// `wal_sender_timeout = 0`: a vanished relay's walsender holds the slot for minutes.
    WalSenderTimeoutOff,
    /// Rows of a table newly created under the outbox table's name.
    OutboxRecreated,
    /// Rows written to the former outbox table, renamed, while another table has its name.
    FormerOutboxRows,
    /// `max_slot_wal_keep_size = -1`: a stopped relay's slot retains WAL without limit.
    SlotWalUnbounded,
    /// `wal_sender_timeout` far above `--peer-timeout`: a standby takes over late.
    WalSenderTimeoutLong,
    /// The publication publishes more than inserts (the walsender sends what the relay skips).
    PublicationNotInsertOnly { publication: &'a str },
}

/// What `check` finds that would make `setup` or the relay fail, where no error of the relay
/// says it first (PostgreSQL's own words would, late): its fix, as an error's is here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shortfall<'a> {
    /// Every replication slot of `max_replication_slots` is taken, and the relay's is missing.
    NoFreeSlot,
    /// Every WAL sender of `max_wal_senders` is busy.
    NoFreeWalSender,
    /// The role lacks privileges on the outbox table; `grant` lists them.
    TablePrivileges {
        grant: &'a str,
        table: &'a str,
        role: &'a str,
    },
    /// The publication does not publish inserts: the relay would get no row.
    PublicationSkipsInserts { publication: &'a str },
}

/// A shortfall's text: what is wrong (`problem`, as `check` found it), then what to do.
pub(crate) fn shortfall(problem: &str, shortfall: Shortfall<'_>) -> String {
    with_fix(problem, &shortfall_fix(shortfall))
}

/// What to do about a shortfall `check` found.
fn shortfall_fix(shortfall: Shortfall<'_>) -> String {
    match shortfall {
        Shortfall::NoFreeSlot => "drop a slot nothing uses \
             (SELECT pg_drop_replication_slot('<name>'); look for active = false in \
             pg_replication_slots), or raise max_replication_slots (ALTER SYSTEM SET \
             max_replication_slots = …; then restart PostgreSQL)"
            .into(),
        Shortfall::NoFreeWalSender => "raise max_wal_senders (ALTER SYSTEM SET \
             max_wal_senders = …; then restart PostgreSQL), or stop a replication client that \
             should not run (pg_stat_replication lists them)"
            .into(),
        Shortfall::TablePrivileges { grant, table, role } => format!(
            "GRANT {grant} ON TABLE {} TO {}; (sql/role.sql has the least-privilege role)",
            sql_table(table),
            sql_name(role)
        ),
        Shortfall::PublicationSkipsInserts { publication } => insert_only(publication),
    }
}

/// The SQL that makes `publication` publish inserts and nothing else.
fn insert_only(publication: &str) -> String {
    format!(
        "ALTER PUBLICATION {} SET (publish = 'insert')",
        sql_name(publication)
    )
}

/// A warning's text: what is wrong (`problem`, as the caller found it), then what to do.
pub(crate) fn warning(problem: &str, warning: Warning<'_>) -> String {
    with_fix(problem, &warning_fix(warning))
}

/// What to do about a condition the relay warns about.
fn warning_fix(warning: Warning<'_>) -> String {
    match warning {
        Warning::SecretFileReadable { path } => format!(
            "chmod 600 {path} (owned by the relay's user; in Kubernetes, defaultMode: 0400)"
        ),
        Warning::NoClaimIndex => "`outbox-relay setup --mode poll` (with a map: \
             --no-create-table; sql/outbox_poll.sql)"
            .into(),
        Warning::IdleSlotsExpire => "set it to 0 (off), or well above the longest outage you \
             plan for (docs/recovery.md, \"idle_replication_slot_timeout\")"
            .into(),
        Warning::NotFailoverSlot => "stop the relays of this slot and run `outbox-relay setup` \
             (it turns failover on), or --failover-slot off to keep it so \
             (docs/high-availability.md, \"PostgreSQL high availability\")"
            .into(),
        Warning::StandbySlotsUnset => "on the primary, set synchronized_standby_slots to the \
             physical slots of the standbys that sync this slot \
             (docs/high-availability.md, \"PostgreSQL high availability\")"
            .into(),
        Warning::WaitingForStandby => "bring the standby back, or remove its slot from \
             synchronized_standby_slots on the primary (docs/high-availability.md, \
             \"PostgreSQL high availability\")"
            .into(),
        Warning::StateTableUnusable => "run `outbox-relay setup`, and grant SELECT, INSERT, \
             UPDATE on it to the relay's role (sql/role.sql)"
            .into(),
        Warning::WalSenderTimeoutOff => "ALTER SYSTEM SET wal_sender_timeout = '10s'; \
             SELECT pg_reload_conf(); (or ALTER ROLE / ALTER DATABASE … RESET \
             wal_sender_timeout where it was set to 0 there): the relay reports every \
             --status-interval, so a live one never reaches it (docs/network-failures.md, \
             \"Dead peers: what a vanished host costs\")"
            .into(),
        Warning::OutboxRecreated => "if rows were written to the new table before it was \
             added to the publication, re-publish them with `outbox-relay resync --since \
             <when the table was created>`"
            .into(),
        Warning::FormerOutboxRows => "if they are events, insert them into the outbox table \
             again with their ids (consumers drop what they already have); docs/deployment.md, \
             \"Renaming the outbox table\""
            .into(),
        Warning::SlotWalUnbounded => "ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; \
             SELECT pg_reload_conf(); sized as the WAL rate × the longest relay outage to ride \
             out, below the WAL volume's free space, and alert on \
             outbox_relay_slot_safe_wal_size_bytes (docs/recovery.md, \
             \"max_slot_wal_keep_size\")"
            .into(),
        Warning::WalSenderTimeoutLong => "ALTER SYSTEM SET wal_sender_timeout = '10s'; \
             SELECT pg_reload_conf(); the relay reports every --status-interval, so a live one \
             never reaches it (docs/network-failures.md, \"Dead peers: what a vanished host \
             costs\")"
            .into(),
        Warning::PublicationNotInsertOnly { publication } => insert_only(publication),
    }
}

/// What to do about `error`, when the relay knows.
// A flat lookup table, one arm per error and no logic between them: long because the advice is.
pub(crate) fn fix(error: &RelayError) -> Option<String> {
    use RelayError::*;
    Some(match error {
        Catalog(CatalogError::WalLevel { .. }) => {
            "ALTER SYSTEM SET wal_level = 'logical'; then restart PostgreSQL \
             (or run `outbox-relay poll`, which needs no slot)"
                .into()
        }
        Catalog(CatalogError::PublicationMissing { publication, table }) => format!(
            "run `outbox-relay setup`, or CREATE PUBLICATION {} FOR TABLE {} WITH (publish = \
             'insert')",
            sql_name(publication),
            sql_table(table)
        ),
        Catalog(CatalogError::PublicationDoesNotCoverTable {
            publication,
            table,
            covers,
        }) => format!(
            "ALTER PUBLICATION {} ADD TABLE {}{}",
            sql_name(publication),
            sql_table(table),
            match covers.is_empty() {
                true => "",
                false =>
                    "; but if one of the tables it includes is the outbox table renamed, \
                     rename it back instead (docs/deployment.md, \"Renaming the outbox table\")",
            }
        ),
        Catalog(CatalogError::ShardFilterMismatch { .. }) => {
            "give every relay the --shards (OUTBOX_SHARDS) that \
             `outbox-relay setup --shards` made the publications with (a filter's `% N) = K` \
             names both); to change the number of shards, follow docs/scaling.md, \
             \"Scaling out\""
                .into()
        }
        Slot(SlotError::Missing { .. }) => {
            "run `outbox-relay setup` (it creates the slot after the \
             publication). Rows inserted while no slot existed are not in any slot: re-publish \
             them with `outbox-relay resync --since <time>`"
                .into()
        }
        Slot(SlotError::Unusable { problem, .. }) => match problem {
            SlotProblem::WrongKind { .. } => {
                "choose another --slot name, or drop it and run `outbox-relay setup`".into()
            }
            SlotProblem::OtherDatabase => {
                "connect to the slot's database or choose another --slot name".into()
            }
        },
        Slot(SlotError::Lost { reason, .. }) => format!(
            "`outbox-relay teardown --yes`, `outbox-relay setup`, then `outbox-relay resync \
             --since <time of the last delivered message>` (docs/recovery.md, \"Recovering \
             from a lost slot\"), or run the relay with --on-slot-lost recreate, which does \
             that by itself; {}",
            lost_slot_prevention(reason.as_deref())
        ),
        Catalog(CatalogError::TableMissing { .. }) => {
            "run `outbox-relay setup` or create it from sql/".into()
        }
        Catalog(CatalogError::OutboxUnpublished {
            publication, table, ..
        }) => format!(
            "ALTER PUBLICATION {} ADD TABLE {}, start the relay again, and re-publish the rows \
             written to the table in between with `outbox-relay resync --since <when it left \
             the publication>` (docs/deployment.md, \"Renaming the outbox table\")",
            sql_name(publication),
            sql_table(table)
        ),
        Catalog(CatalogError::OutboxRenamed { from, to, .. }) => format!(
            "rename it back ({}) and start the relay again: it then delivers every row, those \
             written under the new name too. Or keep the new name: start the relay with \
             --table {}.{} (OUTBOX_TABLE). Not a new table under the old name: the relay would \
             take that one for the outbox and skip the rows written to this one \
             (docs/deployment.md, \"Renaming the outbox table\")",
            rename_back(from, to),
            to.0,
            to.1
        ),
        Slot(SlotError::RecoveryInterrupted { .. }) => {
            "run the relay with --on-slot-lost recreate \
             (OUTBOX_ON_SLOT_LOST) to finish it: it resumes the backfill after the last row the \
             broker confirmed (or, when the slot the interrupted recovery made is gone, makes \
             another and backfills again from the same point)"
                .into()
        }
        Slot(SlotError::RecoveryUnrecordable { table, .. }) => format!(
            "run `outbox-relay setup` (it creates {table}, or adds the columns it lacks) and \
             grant the relay's role SELECT, INSERT, UPDATE on it (sql/role.sql); until then \
             recover by hand (docs/recovery.md, \"Recovering from a lost slot\")"
        ),
        Slot(SlotError::RecoveryStateUnreadable { table, .. }) => format!(
            "GRANT SELECT, INSERT, UPDATE ON {table} TO <the relay's role>; (sql/role.sql \
             grants it to outbox_relay; a role made before the table existed lacks it)"
        ),
        DatabaseUnreachable(Unreachable::NoPrimary { .. }) => {
            "promote a standby (or wait for your HA stack to), or add the \
             primary's host to the database URL; the relay keeps trying every host"
                .into()
        }
        Slot(SlotError::CannotBackfill { .. }) => {
            "recover by hand (docs/recovery.md, \"Recovering from a \
             lost slot\"): events emitted since the slot's last acknowledged position are \
             lost, rows of the table can be re-published with `resync --since`; or use \
             failover slots (PostgreSQL 17+) so a failover keeps the slot"
                .into()
        }
        Catalog(CatalogError::NoReplicationPrivilege { role }) => format!(
            "ALTER ROLE {} REPLICATION (sql/role.sql has the least-privilege role), and allow \
             its replication connection in pg_hba.conf with a line for the database name \
             (logical replication connections match the database, not the `replication` \
             keyword)",
            role.as_deref()
                .map(sql_name)
                .unwrap_or_else(|| "<role>".into())
        ),
        Catalog(CatalogError::PublicationNotOwned { publication, .. }) => format!(
            "ask the owner to run: DROP PUBLICATION {};",
            quote_ident(publication)
        ),
        PgTls {
            problem, ca_given, ..
        } => tls_fix(*problem, *ca_given).into(),
        Bug(_) => "none needed to keep data safe: nothing past the failure was acknowledged, \
             and a restart resumes from the slot. Please report this message (and the log \
             before it) to the outbox-relay maintainers"
            .into(),
        Broker(BrokerError::Returned { .. }) => {
            "bind a queue; the relay retries and does not move past this message".into()
        }
        Broker(BrokerError::ReturnedAfterSettle { .. }) => {
            "bind a queue for this routing key, and report the broker version".into()
        }
        Broker(BrokerError::DeadLetterReturned { exchange, .. }) => format!(
            "bind a queue to \"{exchange}\" (with `#` for every dead letter); the relay retries \
             and does not move past this message"
        ),
        Broker(BrokerError::PublishRefused {
            reply_code: 406, ..
        }) => "raise RabbitMQ's max_message_size, or \
             store large payloads elsewhere and send a reference; the relay now checks bodies \
             against the limit the broker named, so under --on-unroutable dead-letter the next \
             attempt dead-letters the message (without its body), under halt it stops naming it"
            .into(),
        Broker(BrokerError::PublishRefused { .. })
        | Broker(BrokerError::PublishRefusedAmong { .. }) => "repair what the broker names \
             (declare the exchange, give the relay's user write access to it, raise its \
             max_message_size), or correct the message; with --on-unroutable dead-letter such \
             messages go to the dead-letter exchange"
            .into(),
        Broker(BrokerError::RoutedToMissingExchange { exchange, .. }) => format!(
            "declare \"{exchange}\" (a durable topic exchange, bound to the queues that want \
             these messages), or correct the row's exchange or the --exchange template; with \
             --on-unroutable dead-letter such messages go to the dead-letter exchange"
        ),
        Broker(BrokerError::Unreachable { .. }) => {
            "the relay retries (the next node first, for a cluster); check that RabbitMQ runs \
             and listens at that address (5672, or 5671 for amqps://), and for a TLS failure \
             (a certificate, a corrupt message) that the URL's scheme matches the port and \
             SSL_CERT_FILE names the CA that signed the broker's certificate (docs/security.md, \
             \"RabbitMQ\")"
                .into()
        }
        Broker(BrokerError::LoginRefused { .. }) => {
            "correct the user or password in --amqp-url (AMQP_URL, \
             or the file AMQP_URL_FILE names; a `%` in the password is written %25), and the \
             virtual host at the URL's end (the default `/` is written %2f): it must exist, \
             and the user needs access to it (rabbitmqctl set_permissions -p <vhost> <user> \
             …); RabbitMQ's log names the refused login"
                .into()
        }
        Broker(BrokerError::ExchangeMissing { .. }) => {
            "run `outbox-relay setup` with the same flags (it declares \
             the exchange and, under `--on-unroutable dead-letter`, the dead-letter exchange, \
             both durable topic exchanges) or declare it; the relay retries"
                .into()
        }
        Configuration(problem) => return config_fix(problem),
        Unpublishable { fault, .. } => return map_fix(*fault),
        Database(e) => return e.code().and_then(refusal_fix).map(String::from),
        Replication {
            sqlstate: Some(code),
            ..
        } => return refusal_fix(code).map(String::from),
        _ => return None,
    })
}

/// What to do when PostgreSQL refused the relay's login or an operation by `code`; `None`
/// for the codes of anything else.
fn refusal_fix(code: &SqlState) -> Option<&'static str> {
    Some(match code.code() {
        // invalid_password
        "28P01" => {
            "correct the user or password in the database URL (DATABASE_URL, or the file \
             DATABASE_URL_FILE names; a `%` in the password is written %25)"
        }
        // invalid_authorization_specification: no such role, or pg_hba.conf refused it
        "28000" => {
            "the role must exist (sql/role.sql creates the least-privilege one) and \
             pg_hba.conf must let it connect to this database from the relay's host; a logical \
             replication connection matches a line by its database name, not the \
             `replication` keyword (docs/security.md, \"The least-privilege role\")"
        }
        // insufficient_privilege
        "42501" => {
            "grant the relay's role what it lacks: sql/role.sql grants what the relay uses \
             (SELECT and DELETE on the outbox table, UPDATE too in polling mode, and \
             REPLICATION), and `outbox-relay check` names each missing grant"
        }
        // invalid_catalog_name
        "3D000" => "create the database, or correct its name at the end of the database URL",
        _ => return None,
    })
}

/// What to do about a row, event or table the mapper cannot make a message of.
fn map_fix(fault: MapProblem) -> Option<String> {
    Some(match fault {
        MapProblem::MissingColumn { contract } => format!(
            "add the column (see sql/), point --table at the outbox table, or map \"{contract}\" \
             to the table's column with --column {contract}=COLUMN (OUTBOX_COLUMNS; \
             --table-layout debezium for Debezium's table)"
        ),
        MapProblem::MissingHeaderColumn { flag } => format!(
            "correct the column's name in {flag} (OUTBOX_HEADER_COLUMNS), or add the column"
        ),
        MapProblem::CreatedAtType => "make it one (ALTER TABLE … ALTER COLUMN … TYPE \
             timestamptz USING … AT TIME ZONE 'UTC', for values written in UTC), map created_at \
             to another column, or leave it unmapped with --column created_at= (and \
             --cleanup-interval 0)"
            .into(),
        MapProblem::Null => "make the column NOT NULL or correct the row; the relay stops \
             before it and acknowledges nothing past it"
            .into(),
        MapProblem::UnchangedToast => {
            "check the table's replica identity and that nothing rewrites outbox rows".into()
        }
        MapProblem::TooLarge => "store large payloads elsewhere and send a reference, or raise \
             both limits"
            .into(),
        MapProblem::ExchangeNotAllowed => "add it to --allowed-exchanges \
             (OUTBOX_ALLOWED_EXCHANGES) if messages may be published there, or correct the \
             message; with --on-unroutable dead-letter such messages go to the dead-letter \
             exchange"
            .into(),
        MapProblem::Envelope => "write events with the emit functions `setup` creates \
             (outbox_emit); a message written by hand with the emit prefix must follow the \
             envelope of docs/emit.md"
            .into(),
        MapProblem::EnvelopeVersion => {
            "upgrade the relay to the release whose `setup` created the emit functions".into()
        }
        MapProblem::Invalid => return None,
    })
}

/// What to do about a configuration that cannot work, when the relay knows.
fn config_fix(problem: &ConfigProblem) -> Option<String> {
    use ConfigProblem::*;
    Some(match problem {
        SecretTwice { .. } => "set only one of them".into(),
        SecretMissing { .. } => "set one of them".into(),
        DatabaseUrl(UrlProblem::SessionAttrs { .. }) => "use read-write or primary, or leave it \
             out: with several hosts the relay finds the primary itself"
            .into(),
        DeadLetterExchangeMissing => "set --dead-letter-exchange (or \
             OUTBOX_DEAD_LETTER_EXCHANGE), and run `outbox-relay setup` with both flags to \
             declare it"
            .into(),
        DeadLetterExchangeIsMain { exchange } => {
            format!("name another exchange, e.g. \"{exchange}.dead-letter\"")
        }
        DeadLetterExchangeTooLong { .. } => "use a shorter name".into(),
        ExchangeTemplateUnlisted { .. } => {
            "list them, or a prefix pattern, e.g. --allowed-exchanges \
             'events.*' (OUTBOX_ALLOWED_EXCHANGES)"
                .into()
        }
        ReservedHeader {
            column, reserved, ..
        } => format!(
            "send the column under another name ({column}=x-{column}); the relay's own headers \
             are {}",
            reserved.join(", ")
        ),
        ShardOutOfRange { .. } => "set --shard (OUTBOX_SHARD) to one of them, and --shards \
             (OUTBOX_SHARDS) to the number `setup --shards` was run with"
            .into(),
        ShardNotGiven { count } => format!(
            "set --shard (OUTBOX_SHARD) to 0..{}, one relay per shard",
            count - 1
        ),
        ShardedNameInvalid { flag, .. } => format!("a shorter {flag}"),
        StatusShardsInPollMode => "drop --shards (OUTBOX_SHARDS) with --mode poll".into(),
        SetupShardsInPollMode { .. } => "drop --shards (OUTBOX_SHARDS), or raise `poll \
             --workers` to scale polling"
            .into(),
        ShardsNeedUuidId { .. } => "run one relay (--shards 1), or map \"id\" to a uuid column \
             with --column id=COLUMN (OUTBOX_COLUMNS)"
            .into(),
        CreatedAtMissing { contract, flag, .. } => format!(
            "add the column, or map \"{contract}\" to the table's creation time with {flag} \
             {contract}=COLUMN (OUTBOX_COLUMNS)"
        ),
        CreatedAtUnmapped { contract, flag, .. } => format!(
            "map it to the table's creation time (a timestamptz set on insert) with {flag} \
             {contract}=COLUMN (OUTBOX_COLUMNS)"
        ),
        PublishedAtUnmapped { contract, flag } => format!(
            "add a nullable timestamptz column and map it with {flag} {contract}=COLUMN \
             (OUTBOX_COLUMNS), or delete each row once published with --on-published delete \
             (OUTBOX_ON_PUBLISHED)"
        ),
        PollColumnMissing {
            contract,
            flag,
            unmapped,
            ..
        } => match unmapped {
            None => "add the column (sql/outbox_poll.sql has its type); `outbox-relay setup \
                 --mode poll` creates a table only where none exists"
                .into(),
            Some(unmapped) => format!(
                "add the column, map \"{contract}\" to one the table has with {flag} \
                 {contract}=COLUMN (OUTBOX_COLUMNS), or leave it unmapped with {flag} \
                 {contract}= ({unmapped})"
            ),
        },
        PollPublishedColumnMissing { table, column } => format!(
            "ALTER TABLE {} ADD COLUMN {} timestamptz; (`outbox-relay setup --mode poll` creates \
             a table only where none exists), or map published_at to a timestamptz column the \
             table has with --column published_at=COLUMN (OUTBOX_COLUMNS)",
            sql_table(table),
            sql_name(column)
        ),
        EmitPrefixMismatch { .. } => "run `outbox-relay setup` with the same --emit-prefix \
             (OUTBOX_EMIT_PREFIX) as `run`"
            .into(),
        FailoverNeeds17 => "use --failover-slot auto (OUTBOX_FAILOVER_SLOT), or upgrade".into(),
        FailoverSlotHeld { .. } => "stop the relays of this slot, run `outbox-relay setup` \
             again, start them; or keep it as it is with --failover-slot off"
            .into(),
        RestrictNeedsSuperuser { .. } => "run it with a superuser's DATABASE_URL (the relay \
             itself need not be one), or have a DBA run `setup --restrict-emit --print-sql` \
             with psql"
            .into(),
        EmitFunctionsRestricted { .. } => "run setup with --restrict-emit --emit-role <the \
             application's role> again"
            .into(),
        TableNameTooLongForEmit { room, .. } => {
            format!("use a table name of at most {room} bytes")
        }
        MappedTableCreation { print_sql, .. } => format!(
            "pass --no-create-table (OUTBOX_NO_CREATE_TABLE), and setup checks your table and \
             provisions the rest{}",
            if *print_sql {
                " (--print-sql has no form for a mapped table yet: run setup against the \
                 database, or take the publication and slot from sql/)"
            } else {
                ""
            }
        ),
        SecretFileEmpty { .. }
        | DatabaseUrl(UrlProblem::DatabaseUrl { .. } | UrlProblem::SslMode { .. })
        | DatabaseUrlNoUser
        | AmqpUrl { .. }
        | NoAmqpUrl
        | ExchangeNameTooLong { .. }
        | AllowedExchangesList { .. }
        | RoutingKey { .. }
        | ShardCount { .. }
        | TeardownUnconfirmed { .. }
        | PollIntervalsCrossed { .. }
        | StreamWith { .. }
        | StreamTrust { .. } => return None,
    })
}

/// A name for SQL a person will read and paste (the fix of an error): bare when it is a
/// plain lower-case identifier, quoted otherwise.
fn sql_name(name: &str) -> String {
    let plain = name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_string()
    } else {
        quote_ident(name)
    }
}

/// [`sql_name`] for a `table` or `schema.table` as configured.
fn sql_table(table: &str) -> String {
    match table.split_once('.') {
        Some((schema, table)) => format!("{}.{}", sql_name(schema), sql_name(table)),
        None => sql_name(table),
    }
}

/// The SQL that gives a renamed table, now `to`, its name `from` back (both (schema, table)).
fn rename_back(from: &(String, String), to: &(String, String)) -> String {
    let now = format!("{}.{}", sql_name(&to.0), sql_name(&to.1));
    if from.0 == to.0 {
        return format!("ALTER TABLE {now} RENAME TO {}", sql_name(&from.1));
    }
    let moved = format!("ALTER TABLE {now} SET SCHEMA {}", sql_name(&from.0));
    if from.1 == to.1 {
        return moved;
    }
    format!(
        "{moved}; ALTER TABLE {}.{} RENAME TO {}",
        sql_name(&from.0),
        sql_name(&to.1),
        sql_name(&from.1)
    )
}

/// How to keep the next slot from the same fate.
fn lost_slot_prevention(reason: Option<&str>) -> &'static str {
    match reason {
        Some("idle_timeout") => {
            "to keep the next one, raise or turn off idle_replication_slot_timeout (0), or keep \
             a relay streaming: a standby relay does not hold the slot"
        }
        Some("rows_removed") => {
            "on a standby, turn on hot_standby_feedback and give it a physical slot on the \
             primary (primary_slot_name)"
        }
        Some("wal_level_insufficient") => "set wal_level = 'logical' on the primary",
        _ => "consider raising max_slot_wal_keep_size, and alert on outbox_relay_slot_safe_wal_size_bytes",
    }
}

/// The fix for the usual causes of a failed TLS setup.
fn tls_fix(problem: TlsProblem, ca_given: bool) -> &'static str {
    match problem {
        TlsProblem::UnknownIssuer if ca_given => {
            "the server's certificate is not signed by the CA in sslrootcert: set sslrootcert \
             in the database URL to the CA that signed the server's certificate"
        }
        TlsProblem::UnknownIssuer => {
            "the server's certificate is not signed by a well-known CA: add \
             sslrootcert=/path/to/ca.pem (the CA that signed it) to the database URL"
        }
        TlsProblem::NameMismatch => {
            "the server's certificate does not name the host in the database URL: connect by a \
             name the certificate lists, or use sslmode=verify-ca"
        }
        TlsProblem::Refused => {
            "the server does not accept TLS connections: enable ssl on the server, or lower \
             sslmode in the database URL (prefer uses TLS only when offered)"
        }
        TlsProblem::CaFile => {
            "sslrootcert in the database URL must name a readable PEM file holding the CA \
             certificate"
        }
        TlsProblem::Definite | TlsProblem::Handshake => {
            "check sslmode and sslrootcert in the database URL"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(sql_name("outbox_pub"), "outbox_pub");
        assert_eq!(
            sql_name("Pub; DROP TABLE t; --"),
            "\"Pub; DROP TABLE t; --\""
        );
        assert_eq!(sql_name("1st"), "\"1st\"");
        assert_eq!(sql_table("app.outbox"), "app.outbox");
        assert_eq!(sql_table("My App.out\"box"), "\"My App\".\"out\"\"box\"");
    }

    #[test]
    fn missing_replication_privilege_names_the_fix() {
        let e = RelayError::replication(crate::error::server_error(
            "must be superuser or replication role to start walsender (SQLSTATE 42501)",
        ))
        .clarify(Some("app_relay"));
        let text = report(&e);
        assert!(text.contains("REPLICATION"), "{text}");
        assert!(text.contains("ALTER ROLE app_relay REPLICATION"), "{text}");
        assert!(text.contains("pg_hba.conf"), "{text}");
    }

    /// The SQL that undoes a rename, a move to another schema, or both, names quoted.
    #[test]
    fn a_renamed_outbox_is_told_how_to_rename_it_back() {
        let part = |s: &str| s.to_string();
        let renamed = |from: (&str, &str), to: (&str, &str)| {
            report(&RelayError::Catalog(CatalogError::OutboxRenamed {
                oid: 16385,
                from: (part(from.0), part(from.1)),
                to: (part(to.0), part(to.1)),
            }))
        };
        let text = renamed(("public", "outbox"), ("public", "Outbox Old"));
        assert!(
            text.contains("(ALTER TABLE public.\"Outbox Old\" RENAME TO outbox)"),
            "{text}"
        );
        assert!(text.contains("--table public.Outbox Old"), "{text}");
        let text = renamed(("app", "outbox"), ("archive", "outbox"));
        assert!(
            text.contains("(ALTER TABLE archive.outbox SET SCHEMA app)"),
            "{text}"
        );
        let text = renamed(("app", "outbox"), ("archive", "old"));
        assert!(
            text.contains(
                "(ALTER TABLE archive.old SET SCHEMA app; ALTER TABLE app.old RENAME TO outbox)"
            ),
            "{text}"
        );
    }

    /// A name that reaches a "Fix:" is quoted there, so pasting the fix runs only the fix.
    #[test]
    fn names_in_the_suggested_sql_are_quoted_where_needed() {
        let publication = "Pub; DROP TABLE users; --".to_string();
        let table = "My App.events".to_string();
        let missing = report(&RelayError::Catalog(CatalogError::PublicationMissing {
            publication: publication.clone(),
            table: table.clone(),
        }));
        assert!(
            missing.contains(
                "CREATE PUBLICATION \"Pub; DROP TABLE users; --\" FOR TABLE \"My App\".events"
            ),
            "{missing}"
        );
        let uncovered = report(&RelayError::Catalog(
            CatalogError::PublicationDoesNotCoverTable {
                publication: publication.clone(),
                table,
                covers: Vec::new(),
            },
        ));
        assert!(
            uncovered.contains(
                "ALTER PUBLICATION \"Pub; DROP TABLE users; --\" ADD TABLE \"My App\".events"
            ),
            "{uncovered}"
        );
        let not_owned = report(&RelayError::Catalog(CatalogError::PublicationNotOwned {
            publication: "x\"; DROP TABLE users; --".into(),
            owner: "dba".into(),
            slot_note: String::new(),
        }));
        assert!(
            not_owned.ends_with("DROP PUBLICATION \"x\"\"; DROP TABLE users; --\";"),
            "{not_owned}"
        );
        let role = report(&RelayError::Catalog(CatalogError::NoReplicationPrivilege {
            role: Some("App Relay".into()),
        }));
        assert!(
            role.contains("ALTER ROLE \"App Relay\" REPLICATION"),
            "{role}"
        );
        // Plain names stay as they were.
        let plain = report(&RelayError::Catalog(CatalogError::PublicationMissing {
            publication: "outbox_pub".into(),
            table: "outbox".into(),
        }));
        assert!(
            plain.contains("CREATE PUBLICATION outbox_pub FOR TABLE outbox"),
            "{plain}"
        );
    }

    #[test]
    fn the_fix_follows_the_message_and_its_sources() {
        let e = RelayError::Broker(BrokerError::ExchangeMissing {
            exchange: "outbox".into(),
        });
        let text = report(&e);
        assert!(
            text.starts_with("The exchange \"outbox\" does not exist on the broker. Fix: run"),
            "{text}"
        );
        // Without advice, the report is the chain alone.
        assert_eq!(
            report(&RelayError::StreamEnded),
            RelayError::StreamEnded.to_string()
        );
    }
}
