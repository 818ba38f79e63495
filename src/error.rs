//! # Error handling
//!
//! Two classes, as in every relay that must not lose data:
//! - **transient**: a connection lost, a confirm that did not come, a nack, a returned
//!   (unroutable) message. Nothing after the failure was acknowledged, so the supervisor tears
//!   the session down and resumes from the slot after a backoff.
//! - **definite**: the configuration or the data is wrong (wal_level, a missing publication or
//!   slot, an invalidated slot, a row that cannot be mapped), or the relay itself broke an
//!   invariant (a bug). Retrying cannot help: the relay stops with a message that names the
//!   object, row or bug, having acknowledged nothing past it.
//!
//! A slot held by another process is its own case: this relay is a standby and waits.
//!
//! Under `--on-unroutable dead-letter` a returned message, and a row too large or unmappable,
//! are neither: delivery sends them to the dead-letter exchange. Only a dead letter that
//! cannot be delivered there either is an error again (transient: the relay retries).
//!
//! One classification: [`RelayError::kind`] names what kind of failure an error is, and
//! everything else is derived from that [`ErrorKind`]: the recovery the supervisor applies
//! ([`ErrorKind::recovery`]), the `cause` label of logs and the reconnect metric
//! ([`ErrorKind::label`]), which side of the relay is down for `/readyz`
//! ([`ErrorKind::side`]). Causes come as types or fields, never from an error's text (a
//! replication error's SQLSTATE field, a TLS failure's kind), read once where the error is
//! made. A definite error must never be classed
//! as retry (the relay would loop on a row it can never deliver), nor a transient one as stop
//! (an outage would end the relay).
//!
//! The messages say what is wrong; what to do about it (the fix, with SQL to paste) is
//! written by `crate::advice`, which knows the names and flags. This module depends on no
//! other part of the relay: every module may use it.

use tokio_postgres::error::SqlState;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    // ---- definite: configuration and provisioning ----
    /// A parser's own text for a flag it cannot read (`--since`, `--column`, the exchange's
    /// name): free-form because the parser says what is wrong in its own words, with no
    /// advice to add. Any other configuration error is a [`ConfigProblem`].
    #[error("{0}")]
    Config(String),

    /// A configuration that cannot work, named by what is wrong with it.
    #[error(transparent)]
    Configuration(#[from] ConfigProblem),

    #[error("Cannot read the {what} from {path}")]
    SecretFile {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },

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

    #[error("The replication slot \"{slot}\" does not exist")]
    SlotMissing { slot: String },

    #[error("The replication slot \"{slot}\" {problem}")]
    SlotUnusable { slot: String, problem: SlotProblem },

    #[error(
        "The replication slot \"{slot}\" was invalidated ({}), so messages committed after \
         {confirmed_flush} may be missing. The relay will not recreate the slot silently",
        lost_because(reason.as_deref())
    )]
    SlotLost {
        slot: String,
        confirmed_flush: String,
        /// `pg_replication_slots.invalidation_reason` (17+), or what 15 and 16 imply.
        reason: Option<String>,
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
        "The replication slot \"{slot}\" cannot be recreated with --on-slot-lost recreate: \
         this outbox carries events of the emit functions (outbox_emit), or the relay's state \
         table cannot say that it does not (no session of the relay recorded it); those events are \
         only in the WAL, so no table holds what the lost slot did not deliver"
    )]
    CannotBackfill { slot: String },

    #[error(
        "A recovery of the replication slot \"{slot}\" (--on-slot-lost recreate) was \
         interrupted: the rows before the new slot's start may not all be published"
    )]
    RecoveryInterrupted { slot: String },

    #[error(
        "The replication slot \"{slot}\" cannot be recreated with --on-slot-lost recreate: the \
         relay's state table {table} is missing, lacks the columns of a recovery's progress (made \
         by an older setup), or this role may not use it, and without it a recovery \
         interrupted by a crash would go unnoticed and lose the rows it had not re-published \
         yet"
    )]
    RecoveryUnrecordable { slot: String, table: String },

    #[error(
        "The relay's role may not read its state table {table}, so it cannot tell whether a \
         recovery of the replication slot \"{slot}\" (--on-slot-lost recreate) was \
         interrupted; streaming a half-recovered slot would lose the rows not yet re-published"
    )]
    RecoveryStateUnreadable { slot: String, table: String },

    #[error(
        "The replication slot \"{slot}\" was lost or dropped under the session: \
         the next session recreates it"
    )]
    SlotVanished { slot: String },

    #[error(
        "The database role {} may not use replication: it lacks the REPLICATION attribute",
        role.as_deref().map(|r| format!("\"{r}\"")).unwrap_or_else(|| "of the database URL".into())
    )]
    NoReplicationPrivilege { role: Option<String> },

    #[error(
        "The replication slot \"{slot}\" is in use by process {pid} (a running relay): stop it \
         first, then run teardown again"
    )]
    SlotActive { slot: String, pid: String },

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

    #[error("Cannot set up TLS with PostgreSQL ({reason})")]
    PgTls {
        reason: String,
        problem: TlsProblem,
        /// The URL named a CA (`sslrootcert`).
        ca_given: bool,
    },

    // ---- definite: data ----
    /// The replication stream carries bytes the decoder cannot read.
    #[error("Cannot decode the replication stream: {0}")]
    Decode(String),

    /// A row or emitted event that cannot be published, under the halt policy (or without an
    /// id to dead-letter it by). `problem` names the row and what is wrong with it; `fault`
    /// is what kind of problem that is, for the advice.
    #[error("{problem}")]
    Unpublishable {
        message_id: Option<String>,
        problem: String,
        fault: MapProblem,
    },

    // ---- definite: the relay's own invariant ----
    /// An invariant of the relay itself does not hold: retrying would only repeat it.
    #[error("Internal error (a bug in outbox-relay): {0}")]
    Bug(String),

    // ---- standby ----
    #[error("The replication slot \"{slot}\" is in use by process {pid}")]
    SlotInUse { slot: String, pid: String },

    #[error(
        "Another relay is recreating the replication slot \"{slot}\" (--on-slot-lost \
         recreate): this one waits as its standby"
    )]
    RecoveryInProgress { slot: String },

    // ---- transient, unless the server's answer says otherwise ----
    #[error("PostgreSQL error")]
    Database(#[from] tokio_postgres::Error),

    /// No host of the URL answered, or none is the primary (outbox_common::pg).
    #[error(transparent)]
    DatabaseUnreachable(#[from] outbox_common::pg::Unreachable),

    #[error("Replication stream error")]
    Replication {
        /// The SQLSTATE the server sent (the crate's `ServerError::code`).
        sqlstate: Option<SqlState>,
        #[source]
        source: pgwire_replication::PgWireError,
    },

    #[error("Connecting to {endpoint} took longer than {seconds} s; retrying")]
    ConnectTimeout { endpoint: Endpoint, seconds: u64 },

    #[error("PostgreSQL did not answer within {seconds} s; reconnecting")]
    DatabaseTimeout { seconds: u64 },

    /// A RabbitMQ node took the connection, then did not answer one step of the session's
    /// setup (`step`: "opening a channel", …).
    #[error(
        "RabbitMQ node {node} accepted the connection but did not answer {step} within \
         {seconds} s; reconnecting, to the next node if there is one"
    )]
    BrokerSetupTimeout {
        node: String,
        step: &'static str,
        seconds: u64,
    },

    #[error("The PostgreSQL connection that listens for notifications ended")]
    NotificationsEnded,

    #[error(
        "The PostgreSQL server {server} is shutting down (a switchover or a restart): the \
         session stopped taking changes from it, so that a promoted standby replays as little \
         as possible; reconnecting to the primary"
    )]
    ServerShuttingDown { server: String },

    /// The AMQP client's error, as its text (`publish/` converts it: no other part of the
    /// relay names the client).
    #[error("RabbitMQ error: {0}")]
    Broker(String),

    /// The broker refused the login (403 ACCESS_REFUSED when the connection opens): a wrong
    /// user or password, or a user without access to the virtual host. Retried like any
    /// broker failure (a password being rotated), but named, with its fix.
    #[error("RabbitMQ at {node} refused the login: {reply_text}")]
    BrokerLoginRefused { node: String, reply_text: String },

    /// The broker closed the publishing channel with a channel-level (soft) error, as the
    /// answer to the publishes in flight: one of them caused it. `publish/` tells which.
    #[error("RabbitMQ closed the publishing channel: {reply_code} {reply_text}")]
    ChannelClosed { reply_code: u16, reply_text: String },

    /// The broker closed the publishing channel because of message `message_id`, the one
    /// publish in flight (or the one whose size it names): a 404 for an exchange that
    /// vanished, a 406 for a body over its `max_message_size`, a 403 for a denied exchange.
    #[error(
        "RabbitMQ refused message {message_id} ({size} bytes) and closed the publishing \
         channel: {reply_code} {reply_text}; the relay retries it alone and does not move past \
         it"
    )]
    PublishRefused {
        message_id: String,
        size: usize,
        reply_code: u16,
        reply_text: String,
    },

    /// The broker closed the publishing channel with `unconfirmed` publishes in flight and
    /// nothing names the one that caused it: the next session publishes them one at a time,
    /// through `last_message_id`, which finds it.
    #[error(
        "RabbitMQ closed the publishing channel ({reply_code} {reply_text}) with \
         {unconfirmed} messages unconfirmed; retrying them one at a time, through message \
         {last_message_id}, to find the one it refuses"
    )]
    PublishRefusedAmong {
        last_message_id: String,
        unconfirmed: usize,
        reply_code: u16,
        reply_text: String,
    },

    /// A message routed (by its row's `exchange` column or the `--exchange` template) to an
    /// exchange the broker does not have: checked before its first publish, so the broker
    /// never closes the channel over it.
    #[error(
        "Message {message_id} is routed to exchange \"{exchange}\", which does not exist on \
         the broker; the relay retries it alone and does not move past it"
    )]
    RoutedToMissingExchange {
        message_id: String,
        exchange: String,
    },

    #[error("RabbitMQ did not confirm message {message_id} within {seconds} s; reconnecting")]
    ConfirmTimeout { message_id: String, seconds: u64 },

    #[error("RabbitMQ rejected (nacked) message {message_id}; it will be retried")]
    Nacked { message_id: String },

    #[error(
        "RabbitMQ returned message {message_id} as unroutable ({reply_code} {reply_text}): no \
         queue is bound to exchange \"{exchange}\" for routing key \"{routing_key}\""
    )]
    Returned {
        message_id: String,
        exchange: String,
        routing_key: String,
        reply_code: u16,
        reply_text: String,
    },

    #[error(
        "RabbitMQ returned message {message_id} as unroutable ({reply_code} {reply_text}; \
         exchange \"{exchange}\", routing key \"{routing_key}\") after the relay had counted it \
         delivered: the return came later than AMQP's order allows (basic.return before the ack \
         that covers the message). Stopping before acknowledging anything more; the relay \
         restarts from its last acknowledged position"
    )]
    ReturnedAfterSettle {
        message_id: String,
        exchange: String,
        routing_key: String,
        reply_code: u16,
        reply_text: String,
    },

    #[error(
        "RabbitMQ returned the dead letter of message {message_id} as unroutable ({reply_code} \
         {reply_text}): no queue is bound to the dead-letter exchange \"{exchange}\" for \
         routing key \"{routing_key}\""
    )]
    DeadLetterReturned {
        message_id: String,
        exchange: String,
        routing_key: String,
        reply_code: u16,
        reply_text: String,
    },

    #[error("The exchange \"{exchange}\" does not exist on the broker")]
    ExchangeMissing { exchange: String },

    #[error("Unexpected replication stream content: {0}")]
    Protocol(String),

    #[error(
        "Nothing arrived on the replication stream for {seconds} s, not even the relay's own \
         heartbeats: the connection is presumed dead; reconnecting"
    )]
    StreamSilent { seconds: u64 },

    #[error("The replication stream ended unexpectedly")]
    StreamEnded,

    #[error("Cannot reach RabbitMQ's {address} over the stream protocol: {reason}")]
    StreamConnect { address: String, reason: String },

    #[error(
        "The RabbitMQ stream \"{stream}\" does not exist in virtual host \"{vhost}\": create \
         it (rabbitmqadmin declare queue name={stream} queue_type=stream durable=true), or name \
         another with --stream"
    )]
    StreamMissing { stream: String, vhost: String },

    #[error(
        "The RabbitMQ super stream \"{super_stream}\" does not exist in virtual host \
         \"{vhost}\" (no partitions): create it (rabbitmq-streams add_super_stream \
         {super_stream} --partitions 3 --vhost {vhost}), or name another with --super-stream"
    )]
    SuperStreamMissing { super_stream: String, vhost: String },

    #[error(
        "The transaction that committed at {commit_lsn} has more than {limit} outbox rows: \
         a stream's publishing ids hold at most that many per transaction; split it"
    )]
    StreamTransactionTooLarge { commit_lsn: String, limit: u64 },
}

/// Why a slot was invalidated, in words, for [`RelayError::SlotLost`].
fn lost_because(reason: Option<&str>) -> String {
    match reason {
        Some("wal_removed") | None => "wal_removed: PostgreSQL removed WAL it still needed, \
             wal_status = 'lost' (max_slot_wal_keep_size)"
            .into(),
        Some("idle_timeout") => "idle_timeout: no process streamed from it for longer than \
             idle_replication_slot_timeout"
            .into(),
        Some("rows_removed") => "rows_removed: rows it still needed were vacuumed away (a \
             slot on a standby without hot_standby_feedback)"
            .into(),
        Some("wal_level_insufficient") => {
            "wal_level_insufficient: the primary's wal_level is below logical".into()
        }
        Some(other) => format!("invalidation_reason = '{other}'"),
    }
}

/// A configuration that cannot work: flags, URLs and secrets that contradict each other or
/// what they name (the table, the server). What to do about each is in `crate::advice`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    // ---- secrets and URLs ----
    #[error(
        "The {what} is given twice: by {var} (or {flag}) and by {var}_FILE (or {flag}-file, \
         {path})"
    )]
    SecretTwice {
        what: &'static str,
        var: &'static str,
        flag: String,
        path: String,
    },

    #[error(
        "The file {path}, named by {var}_FILE (or {flag}-file), is empty: it must hold the \
         {what}"
    )]
    SecretFileEmpty {
        what: &'static str,
        var: &'static str,
        flag: String,
        path: String,
    },

    #[error(
        "No {what} given: {var} (or {flag}) is {value_state} and {var}_FILE (or {flag}-file) \
         is {file_state}"
    )]
    SecretMissing {
        what: &'static str,
        var: &'static str,
        flag: String,
        /// "empty" or "not set".
        value_state: &'static str,
        file_state: &'static str,
    },

    /// An invalid URL, a standby-seeking target_session_attrs or an unknown sslmode, found
    /// where the URL is read (outbox_common::pg).
    #[error(transparent)]
    DatabaseUrl(#[from] outbox_common::pg::UrlProblem),

    #[error("The database URL names no user")]
    DatabaseUrlNoUser,

    /// `number` counts from 1, as the list is written.
    #[error(
        "AMQP URL #{number} is not a valid RabbitMQ URL: {problem}. Expected \
         amqp://user:password@host:5672/vhost (amqps:// for TLS; percent-encode the vhost's \
         '/' as %2f); several URLs are separated by commas"
    )]
    AmqpUrl { number: usize, problem: String },

    #[error("No RabbitMQ URL given")]
    NoAmqpUrl,

    // ---- exchanges and messages ----
    #[error("Exchange name {exchange:?} is over 255 bytes")]
    ExchangeNameTooLong { exchange: String },

    #[error("--on-unroutable dead-letter needs the exchange to send dead letters to")]
    DeadLetterExchangeMissing,

    #[error(
        "--dead-letter-exchange is \"{exchange}\", the exchange messages are published to: a \
         message it cannot route would come back unroutable again"
    )]
    DeadLetterExchangeIsMain { exchange: String },

    #[error("--dead-letter-exchange is {bytes} bytes long; AMQP allows at most 255")]
    DeadLetterExchangeTooLong { bytes: usize },

    #[error(
        "--exchange {exchange:?} is a template: every message's exchange comes from its row, \
         so --allowed-exchanges must say which it may be"
    )]
    ExchangeTemplateUnlisted { exchange: String },

    #[error(
        "--allowed-exchanges {list:?}: expected exchange names separated by commas, each \
         either a name or a prefix ending in `*` (events.*), or `*` alone to allow any exchange"
    )]
    AllowedExchangesList { list: String },

    #[error("--routing-key: {problem}")]
    RoutingKey { problem: String },

    #[error("--header-column {column}={header}: the relay sets the header \"{header}\" itself")]
    ReservedHeader {
        column: String,
        header: String,
        /// The headers the relay sets itself.
        reserved: Vec<&'static str>,
    },

    // ---- shards ----
    #[error("--shards is {count}; it must be between 1 and {max}")]
    ShardCount { count: u32, max: u32 },

    #[error(
        "--shard is {index} but --shards is {count}: shards are numbered 0 to {}",
        count - 1
    )]
    ShardOutOfRange { index: u32, count: u32 },

    #[error("--shards is {count} but no --shard is given: a sharded relay streams one shard")]
    ShardNotGiven { count: u32 },

    #[error("With --shards {count}, {flag} \"{name}\" becomes \"{sharded}\", and {problem}")]
    ShardedNameInvalid {
        count: u32,
        flag: &'static str,
        name: String,
        sharded: String,
        problem: String,
    },

    /// `status --mode poll` with `--shards`.
    #[error("--shards is for WAL mode's slots; polling mode has none")]
    StatusShardsInPollMode,

    /// `setup --mode poll` with `--shards`.
    #[error(
        "--shards {shards} is for WAL mode (one row-filtered publication and slot per shard); \
         polling mode has neither"
    )]
    SetupShardsInPollMode { shards: u32 },

    #[error(
        "--shards {shards}: the shards' row filters spread rows by uuid_hash of the id, but \
         the column \"{column}\" of {table} is {id_type}"
    )]
    ShardsNeedUuidId {
        shards: u32,
        column: String,
        table: String,
        id_type: String,
    },

    // ---- the outbox table and its column map ----
    /// The table lacks the column the map names for the contract's `created_at` (`why`: what
    /// needs it).
    #[error(
        "The outbox table {outbox} has no column \"{column}\" (the message contract's \
         \"{contract}\"): {why}"
    )]
    CreatedAtMissing {
        outbox: String,
        column: String,
        contract: &'static str,
        why: String,
        /// The flag that maps a column (`--column`).
        flag: &'static str,
    },

    #[error(
        "The column map leaves \"{contract}\" unmapped (--table-layout debezium has none, or \
         {flag} {contract}=), but {why}"
    )]
    CreatedAtUnmapped {
        contract: &'static str,
        why: String,
        flag: &'static str,
    },

    /// `poll --on-published mark` with `published_at` unmapped.
    #[error(
        "poll --on-published mark (the default) marks each published row in \"{contract}\", \
         which the column map leaves unmapped (--table-layout debezium has none, or {flag} \
         {contract}=)"
    )]
    PublishedAtUnmapped {
        contract: &'static str,
        flag: &'static str,
    },

    /// A column polling needs that the table lacks (`why`: what for).
    #[error(
        "The outbox table {outbox} has no column \"{column}\" (the message contract's \
         \"{contract}\"), {why}"
    )]
    PollColumnMissing {
        outbox: String,
        column: String,
        contract: &'static str,
        why: &'static str,
        flag: &'static str,
        /// `None` under the default column map; otherwise what leaving the column unmapped
        /// means ("only with --on-published delete").
        unmapped: Option<&'static str>,
    },

    /// What `status --mode poll` reports when the table lacks the column it marks rows in.
    #[error(
        "{table} has no column \"{column}\" (the message contract's published_at), which \
         polling mode marks published rows in"
    )]
    PollPublishedColumnMissing { table: String, column: String },

    // ---- setup, teardown and the server's features ----
    #[error(
        "The emit function {function} does not write the prefix {literal} that --emit-prefix \
         names: its events would be skipped, and the WAL is their only copy"
    )]
    EmitPrefixMismatch { function: String, literal: String },

    #[error("--failover-slot on needs PostgreSQL 17 or later, which has failover slots")]
    FailoverNeeds17,

    #[error(
        "The slot {slot} is not a failover slot, and turning failover on \
         (ALTER_REPLICATION_SLOT) waits while a process streams from it: process {pid} does"
    )]
    FailoverSlotHeld { slot: String, pid: i32 },

    /// `needed`: why restricting needs a superuser.
    #[error("setup --restrict-emit: {needed}. Nothing was changed")]
    RestrictNeedsSuperuser { needed: &'static str },

    /// `functions`: "emit functions public.outbox_emit…", as setup prints them.
    #[error(
        "The {functions} are restricted (SECURITY DEFINER: set up with --restrict-emit), and \
         replacing them without --restrict-emit would undo that"
    )]
    EmitFunctionsRestricted { functions: String },

    #[error(
        "The table name \"{table}\" is {} bytes long; the emit functions are named after it \
         ({table}_emit_bytea) and PostgreSQL names hold at most 63 bytes",
        table.len()
    )]
    TableNameTooLongForEmit {
        table: String,
        /// The longest table name the emit functions leave room for.
        room: usize,
    },

    #[error(
        "--table-layout and --column describe an outbox table you already have ({} mapped \
         otherwise), but setup {} the table under the contract's own names",
        changed.join(", "),
        if *print_sql { "--print-sql prints" } else { "would create" }
    )]
    MappedTableCreation {
        changed: Vec<&'static str>,
        print_sql: bool,
    },

    /// `slots`, `publications`: what teardown would drop, in words; `all`: "both", "them all".
    #[error(
        "Teardown drops {slots} and {publications}: rows committed afterwards reach no slot \
         (only `outbox-relay resync --since` can publish them later). Do drop a slot you no \
         longer use, though: an abandoned slot pins WAL on the primary until it is dropped, \
         and can fill its disk. Run again with --yes to drop {all}"
    )]
    TeardownUnconfirmed {
        slots: String,
        publications: String,
        all: &'static str,
    },

    // ---- polling ----
    /// `min`, `max`: the two waits as given (humantime).
    #[error(
        "--poll-interval-min {min} is above --poll-interval-max {max}: set \
         --poll-interval-max at least as high, or --poll-interval for one fixed wait"
    )]
    PollIntervalsCrossed { min: String, max: String },

    // ---- the stream destination ----
    /// `setting`: what the stream destination cannot work with yet; `why`: and why.
    #[error("--stream and --super-stream do not work with {setting}: {why}")]
    StreamWith {
        setting: &'static str,
        why: &'static str,
    },

    /// An amqps:// URL for the stream destination, whose TLS cannot verify the broker:
    /// `reason` says why and what to do.
    #[error("The stream destination cannot verify the broker over TLS (amqps://): {reason}")]
    StreamTrust { reason: String },
}

/// What kind of row, emitted event or table the mapper cannot make a message of
/// (`crate::contract::row_error::MapError`), for the advice on it: the error's own text says
/// which row and what exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapProblem {
    /// The table lacks a column every message needs (`contract`: the contract's name).
    MissingColumn { contract: &'static str },
    /// The table lacks a column `flag` (`--header-column`) sends as a header.
    MissingHeaderColumn { flag: &'static str },
    /// The column read as `created_at` is not a timestamptz.
    CreatedAtType,
    /// A column the message needs is NULL.
    Null,
    /// A column arrived as an unchanged TOAST value in an INSERT.
    UnchangedToast,
    /// The body is over the broker's size limit.
    TooLarge,
    /// The row names an exchange `--allowed-exchanges` does not allow.
    ExchangeNotAllowed,
    /// An emitted event's envelope cannot be read.
    Envelope,
    /// An emitted event's envelope is newer than the relay reads.
    EnvelopeVersion,
    /// A value the contract cannot take: the message says which and why.
    Invalid,
}

/// What a slot found by its name cannot be used for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotProblem {
    #[error(
        "is a {slot_type} slot with plugin {plugin}, but the relay needs a logical slot with \
         plugin pgoutput"
    )]
    WrongKind { slot_type: String, plugin: String },
    #[error("belongs to another database than the one in the database URL")]
    OtherDatabase,
}

/// What went wrong setting up TLS with PostgreSQL, by the kind the TLS layer gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsProblem {
    /// The certificate is not signed by the CA the relay trusts.
    UnknownIssuer,
    /// The certificate does not name the host in the URL.
    NameMismatch,
    /// The server does not accept TLS.
    Refused,
    /// The CA file named by sslrootcert cannot be read or holds no certificate.
    CaFile,
    /// Another certificate or configuration problem: it stays until someone fixes it.
    Definite,
    /// Anything else (a connection reset during the handshake): it may pass.
    Handshake,
}

impl TlsProblem {
    /// What the relay says and does about a TLS failure of `kind`.
    pub fn of(kind: pgwire_replication::TlsErrorKind) -> TlsProblem {
        use pgwire_replication::TlsErrorKind as Kind;
        match kind {
            Kind::UnknownIssuer => TlsProblem::UnknownIssuer,
            Kind::NameMismatch => TlsProblem::NameMismatch,
            Kind::Refused => TlsProblem::Refused,
            Kind::CaFile => TlsProblem::CaFile,
            Kind::Config | Kind::Certificate => TlsProblem::Definite,
            Kind::Handshake => TlsProblem::Handshake,
        }
    }
}

/// What a connection goes to, in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    PostgreSql,
    Replication,
    RabbitMq,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Endpoint::PostgreSql => "PostgreSQL",
            Endpoint::Replication => "the PostgreSQL replication connection",
            Endpoint::RabbitMq => "RabbitMQ",
        })
    }
}

/// What the supervisor does after a session ends with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SupervisorAction {
    /// Reconnect after a backoff and resume from the slot.
    Retry,
    /// Another process holds the slot: wait as a standby and retry.
    Standby,
    /// Stop the relay: retrying cannot help.
    Stop,
}

/// Which side of the relay a failure is on, for readiness and for the stream reader (which
/// need not flush its position over a replication connection that is already gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// An ordinary PostgreSQL connection, or the configuration and provisioning.
    Database,
    /// The replication connection: the stream itself is gone.
    Stream,
    /// RabbitMQ.
    Broker,
}

/// What kind of failure an error is: the one classification everything else derives from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    // definite
    /// Flags, URLs, secrets: wrong before anything ran.
    Config,
    /// Something `setup` provisions (or a DBA) is missing or wrong.
    Provisioning,
    /// The slot was invalidated.
    SlotLost,
    /// A certificate or TLS configuration problem.
    TlsConfig,
    /// PostgreSQL refused a statement for a reason that stays (not an outage).
    DatabaseRefused,
    /// The replication connection was refused for a reason that stays.
    ReplicationRefused,
    /// A row, event or stream content that cannot be published.
    Data,
    /// An invariant of the relay itself broke.
    Bug,
    // standby
    SlotHeld,
    // transient
    DatabaseDown,
    TlsHandshake,
    DatabaseConnectTimeout,
    BrokerConnectTimeout,
    ReplicationDown,
    StreamEnded,
    StreamSilent,
    Protocol,
    BrokerDown,
    ExchangeMissing,
    ConfirmTimeout,
    Nacked,
    Returned,
    ReturnedAfterSettle,
    DeadLetterReturned,
    /// The broker closed the publishing channel over a message.
    PublishRefused,
}

impl ErrorKind {
    pub fn recovery(self) -> SupervisorAction {
        use ErrorKind::*;
        match self {
            Config | Provisioning | SlotLost | TlsConfig | DatabaseRefused | ReplicationRefused
            | Data | Bug => SupervisorAction::Stop,
            SlotHeld => SupervisorAction::Standby,
            DatabaseDown
            | TlsHandshake
            | DatabaseConnectTimeout
            | BrokerConnectTimeout
            | ReplicationDown
            | StreamEnded
            | StreamSilent
            | Protocol
            | BrokerDown
            | ExchangeMissing
            | ConfirmTimeout
            | Nacked
            | Returned
            | ReturnedAfterSettle
            | DeadLetterReturned
            | PublishRefused => SupervisorAction::Retry,
        }
    }

    /// A short label for logs and the reconnect metric's `cause`.
    pub fn label(self) -> &'static str {
        use ErrorKind::*;
        match self {
            DatabaseDown | DatabaseRefused => "database",
            TlsConfig | TlsHandshake => "tls",
            DatabaseConnectTimeout | BrokerConnectTimeout => "connect_timeout",
            ReplicationDown | ReplicationRefused => "replication",
            BrokerDown => "broker",
            ConfirmTimeout => "confirm_timeout",
            Nacked => "nack",
            Returned => "unroutable",
            ReturnedAfterSettle => "returned_after_settle",
            DeadLetterReturned => "dead_letter_unroutable",
            PublishRefused => "publish_refused",
            ExchangeMissing => "exchange_missing",
            StreamEnded => "stream_ended",
            StreamSilent => "no_heartbeat",
            SlotHeld => "standby",
            Protocol => "protocol",
            SlotLost => "slot_lost",
            Bug => "bug",
            Config | Provisioning | Data => "other",
        }
    }

    /// Which side of the relay is down after a failure of this kind.
    pub fn side(self) -> Side {
        use ErrorKind::*;
        match self {
            ReplicationDown | ReplicationRefused | StreamEnded | StreamSilent | SlotHeld
            | SlotLost => Side::Stream,
            BrokerDown | BrokerConnectTimeout | ExchangeMissing | ConfirmTimeout | Nacked
            | Returned | ReturnedAfterSettle | DeadLetterReturned | PublishRefused => Side::Broker,
            Config
            | Provisioning
            | TlsConfig
            | TlsHandshake
            | DatabaseRefused
            | Data
            | Bug
            | DatabaseDown
            | DatabaseConnectTimeout
            | Protocol => Side::Database,
        }
    }

    /// The broker returned a message (counted as a return, not a nack).
    pub fn is_return(self) -> bool {
        matches!(
            self,
            ErrorKind::Returned | ErrorKind::ReturnedAfterSettle | ErrorKind::DeadLetterReturned
        )
    }
}

impl RelayError {
    /// What kind of failure this is (see the module documentation).
    pub fn kind(&self) -> ErrorKind {
        use RelayError::*;
        match self {
            Config(_) | Configuration(_) | SecretFile { .. } | ShardFilterMismatch { .. } => {
                ErrorKind::Config
            }
            WalLevel { .. }
            | PublicationMissing { .. }
            | PublicationDoesNotCoverTable { .. }
            | SlotMissing { .. }
            | SlotUnusable { .. }
            | TableMissing { .. }
            | OutboxRenamed { .. }
            | OutboxUnpublished { .. }
            | CannotBackfill { .. }
            | RecoveryInterrupted { .. }
            | RecoveryUnrecordable { .. }
            | RecoveryStateUnreadable { .. }
            | NoReplicationPrivilege { .. }
            | SlotActive { .. }
            | StreamMissing { .. }
            | SuperStreamMissing { .. }
            | PublicationNotOwned { .. } => ErrorKind::Provisioning,
            SlotLost { .. } => ErrorKind::SlotLost,
            PgTls { problem, .. } => match problem {
                TlsProblem::Handshake => ErrorKind::TlsHandshake,
                _ => ErrorKind::TlsConfig,
            },
            Decode(_) | Unpublishable { .. } | StreamTransactionTooLarge { .. } => ErrorKind::Data,
            Bug(_) => ErrorKind::Bug,
            SlotInUse { .. } | RecoveryInProgress { .. } => ErrorKind::SlotHeld,
            Database(e) => match e.code() {
                Some(code) if !transient_sqlstate(code) => ErrorKind::DatabaseRefused,
                _ => ErrorKind::DatabaseDown,
            },
            DatabaseUnreachable(_)
            | DatabaseTimeout { .. }
            | NotificationsEnded
            | ServerShuttingDown { .. }
            | SlotVanished { .. } => ErrorKind::DatabaseDown,
            Replication { sqlstate, source } => replication_kind(sqlstate.as_ref(), source),
            ConnectTimeout { endpoint, .. } => match endpoint {
                Endpoint::RabbitMq => ErrorKind::BrokerConnectTimeout,
                Endpoint::PostgreSql | Endpoint::Replication => ErrorKind::DatabaseConnectTimeout,
            },
            BrokerSetupTimeout { .. } => ErrorKind::BrokerConnectTimeout,
            Broker(_) | BrokerLoginRefused { .. } | ChannelClosed { .. } | StreamConnect { .. } => {
                ErrorKind::BrokerDown
            }
            PublishRefused { .. } | PublishRefusedAmong { .. } => ErrorKind::PublishRefused,
            RoutedToMissingExchange { .. } => ErrorKind::ExchangeMissing,
            ConfirmTimeout { .. } => ErrorKind::ConfirmTimeout,
            Nacked { .. } => ErrorKind::Nacked,
            Returned { .. } => ErrorKind::Returned,
            ReturnedAfterSettle { .. } => ErrorKind::ReturnedAfterSettle,
            DeadLetterReturned { .. } => ErrorKind::DeadLetterReturned,
            ExchangeMissing { .. } => ErrorKind::ExchangeMissing,
            Protocol(_) => ErrorKind::Protocol,
            StreamSilent { .. } => ErrorKind::StreamSilent,
            StreamEnded => ErrorKind::StreamEnded,
        }
    }

    /// Shorthand for `self.kind().recovery()`.
    pub fn recovery(&self) -> SupervisorAction {
        self.kind().recovery()
    }

    /// The message the pipeline stopped on, if a message was the cause: the next session
    /// publishes with a window of 1 until it is confirmed.
    pub fn stuck_message_id(&self) -> Option<&str> {
        match self {
            RelayError::ConfirmTimeout { message_id, .. }
            | RelayError::Nacked { message_id }
            | RelayError::Returned { message_id, .. }
            | RelayError::ReturnedAfterSettle { message_id, .. }
            | RelayError::DeadLetterReturned { message_id, .. }
            | RelayError::PublishRefused { message_id, .. }
            | RelayError::RoutedToMissingExchange { message_id, .. }
            | RelayError::PublishRefusedAmong {
                last_message_id: message_id,
                ..
            } => Some(message_id),
            _ => None,
        }
    }

    /// A replication error, with the SQLSTATE the server sent.
    pub fn replication(source: pgwire_replication::PgWireError) -> RelayError {
        let sqlstate = match &source {
            pgwire_replication::PgWireError::Server(error) => {
                error.code.as_deref().map(SqlState::from_code)
            }
            _ => None,
        };
        RelayError::Replication { sqlstate, source }
    }

    /// A failed TLS setup on either PostgreSQL connection; `ca_given` says whether the URL
    /// named a CA (sslrootcert).
    pub fn pg_tls(error: pgwire_replication::PgWireError, ca_given: bool) -> RelayError {
        let (kind, reason) = outbox_common::pg::tls_failure(error);
        RelayError::PgTls {
            problem: TlsProblem::of(kind),
            reason,
            ca_given,
        }
    }

    /// Replaces PostgreSQL's terse refusal of a role without REPLICATION with an error that
    /// names it: SQLSTATE 42501 on a replication connection (which checks no other
    /// privilege), or on an ordinary one from a slot function, whose message or detail then
    /// speaks of replication (15: "must be superuser or replication role"; 16+: "permission
    /// denied to use replication slots", "Only roles with the REPLICATION attribute …").
    /// `role` is the URL's user, when known.
    pub fn clarify(self, role: Option<&str>) -> RelayError {
        let refused = |code: Option<&SqlState>| code == Some(&SqlState::INSUFFICIENT_PRIVILEGE);
        let clarified = match &self {
            RelayError::Database(e) => e.as_db_error().is_some_and(|db| {
                let text = format!("{} {}", db.message(), db.detail().unwrap_or_default());
                refused(Some(db.code())) && text.to_lowercase().contains("replication")
            }),
            RelayError::Replication { sqlstate, .. } => refused(sqlstate.as_ref()),
            _ => false,
        };
        if clarified {
            RelayError::NoReplicationPrivilege {
                role: role.map(str::to_string),
            }
        } else {
            self
        }
    }
}

/// SQLSTATE classes that retrying can fix: connection exceptions, operator intervention
/// (shutdown, crash recovery), insufficient resources, transaction rollback.
fn transient_sqlstate(code: &SqlState) -> bool {
    matches!(code.code().get(..2), Some("08" | "57" | "53" | "40"))
}

fn replication_kind(
    sqlstate: Option<&SqlState>,
    source: &pgwire_replication::PgWireError,
) -> ErrorKind {
    use pgwire_replication::PgWireError::*;
    match source {
        Server(_) => match sqlstate {
            Some(code) if *code == SqlState::OBJECT_IN_USE => ErrorKind::SlotHeld,
            Some(code) if !transient_sqlstate(code) => ErrorKind::ReplicationRefused,
            _ => ErrorKind::ReplicationDown,
        },
        Auth(_) | Tls(_) | MessageTooLarge { .. } => ErrorKind::ReplicationRefused,
        _ => ErrorKind::ReplicationDown,
    }
}

/// A connection error of the shared crate as the relay's error of the same text, which the
/// advice knows what to do about.
impl From<outbox_common::pg::PgError> for RelayError {
    fn from(error: outbox_common::pg::PgError) -> Self {
        use outbox_common::pg::PgError;
        match error {
            PgError::Url(problem) => ConfigProblem::DatabaseUrl(problem).into(),
            PgError::Tls {
                kind,
                reason,
                ca_given,
            } => RelayError::PgTls {
                problem: TlsProblem::of(kind),
                reason,
                ca_given,
            },
            PgError::Database(e) => RelayError::Database(e),
            PgError::Unreachable(unreachable) => RelayError::DatabaseUnreachable(unreachable),
            PgError::ConnectTimeout { seconds } => RelayError::ConnectTimeout {
                endpoint: Endpoint::PostgreSql,
                seconds,
            },
        }
    }
}

/// The replication crate's error for the ErrorResponse a server sends as `text`: the
/// message, and the SQLSTATE when `text` ends in "(SQLSTATE xxxxx)" (the crate's rendering).
#[cfg(test)]
pub(crate) fn server_error(text: &str) -> pgwire_replication::PgWireError {
    let (message, code) = match text.rsplit_once(" (SQLSTATE ") {
        Some((message, code)) => (message, code.strip_suffix(')')),
        None => (text, None),
    };
    let mut payload = vec![b'M'];
    payload.extend_from_slice(message.as_bytes());
    payload.push(0);
    if let Some(code) = code {
        payload.push(b'C');
        payload.extend_from_slice(code.as_bytes());
        payload.push(0);
    }
    payload.push(0);
    pgwire_replication::PgWireError::Server(pgwire_replication::ServerError::parse(&payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replication error as the server sends it: `message`, and the SQLSTATE in it.
    fn server(message: &str) -> RelayError {
        RelayError::replication(server_error(message))
    }

    #[test]
    fn missing_replication_privilege_is_named() {
        let e = server("must be superuser or replication role to start walsender (SQLSTATE 42501)")
            .clarify(Some("app_relay"));
        assert_eq!(e.recovery(), SupervisorAction::Stop);
        assert!(matches!(e, RelayError::NoReplicationPrivilege { .. }));
        let sixteen = server(
            "permission denied to start WAL sender: Only roles with the REPLICATION attribute \
             may start a WAL sender process. (SQLSTATE 42501)",
        )
        .clarify(None);
        assert!(matches!(sixteen, RelayError::NoReplicationPrivilege { .. }));
        let other = server("terminating connection (SQLSTATE 57P01)").clarify(None);
        assert!(matches!(other, RelayError::Replication { .. }));
    }

    #[test]
    fn slot_in_use_is_standby_and_auth_stops() {
        let e = server("replication slot \"s\" is active for PID 42 (SQLSTATE 55006)");
        assert_eq!(e.recovery(), SupervisorAction::Standby);
        assert_eq!(e.kind().label(), "standby");
        let e = RelayError::replication(pgwire_replication::PgWireError::Auth("no".into()));
        assert_eq!(e.recovery(), SupervisorAction::Stop);
        let e = server("terminating connection due to administrator command (SQLSTATE 57P01)");
        assert_eq!(e.recovery(), SupervisorAction::Retry);
        assert_eq!(e.kind().side(), Side::Stream);
        // A server error without a SQLSTATE is an outage until shown otherwise.
        assert_eq!(
            server("connection lost").recovery(),
            SupervisorAction::Retry
        );
    }

    /// A broken invariant of the relay stops it: retrying would repeat the bug forever.
    #[test]
    fn a_bug_stops_and_says_it_is_one() {
        let e = RelayError::Bug("settled a front that is not a publish".into());
        assert_eq!(e.recovery(), SupervisorAction::Stop);
        assert_eq!(e.kind().label(), "bug");
        assert!(e.to_string().contains("a bug in outbox-relay"), "{e}");
    }

    /// tokio-rustls's error for a handshake rustls refused with `error`.
    fn handshake_error(error: rustls::Error) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, error)
    }

    #[test]
    fn tls_failures_are_classified_by_rustls_error_type() {
        use pgwire_replication::TlsErrorKind as Kind;
        use rustls::{AlertDescription, CertificateError, Error};
        let kind = |error: Error| Kind::of_handshake(&handshake_error(error));
        let certificate = |error: CertificateError| kind(Error::InvalidCertificate(error));
        assert_eq!(
            certificate(CertificateError::UnknownIssuer),
            Kind::UnknownIssuer
        );
        assert_eq!(
            certificate(CertificateError::BadSignature),
            Kind::UnknownIssuer
        );
        assert_eq!(
            certificate(CertificateError::NotValidForName),
            Kind::NameMismatch
        );
        assert_eq!(certificate(CertificateError::Expired), Kind::Certificate);
        assert_eq!(
            kind(Error::AlertReceived(AlertDescription::UnknownCA)),
            Kind::Certificate
        );
        assert_eq!(kind(Error::DecryptError), Kind::Handshake);
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(Kind::of_handshake(&reset), Kind::Handshake);
        // A message that reads like a certificate problem is not classified by its words.
        let worded = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        assert_eq!(Kind::of_handshake(&worded), Kind::Handshake);
    }

    #[test]
    fn tls_problems_decide_the_recovery() {
        use pgwire_replication::{PgWireError, TlsError, TlsErrorKind as Kind};
        let pg_tls = |kind: Kind| {
            RelayError::pg_tls(PgWireError::Tls(TlsError::new(kind, "some text")), false)
        };
        for definite in [
            Kind::UnknownIssuer,
            Kind::NameMismatch,
            Kind::Refused,
            Kind::CaFile,
            Kind::Config,
            Kind::Certificate,
        ] {
            assert_eq!(
                pg_tls(definite).recovery(),
                SupervisorAction::Stop,
                "{definite:?}"
            );
        }
        assert_eq!(pg_tls(Kind::Handshake).recovery(), SupervisorAction::Retry);
        // The socket failing mid-handshake is a handshake failure: it may pass.
        let io = PgWireError::Io(std::sync::Arc::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        assert_eq!(
            RelayError::pg_tls(io, false).recovery(),
            SupervisorAction::Retry
        );
    }

    #[test]
    fn the_side_decides_readiness_and_the_stream_flush() {
        let broker_timeout = RelayError::ConnectTimeout {
            endpoint: Endpoint::RabbitMq,
            seconds: 15,
        };
        assert_eq!(broker_timeout.kind().side(), Side::Broker);
        let pg_timeout = RelayError::ConnectTimeout {
            endpoint: Endpoint::PostgreSql,
            seconds: 15,
        };
        assert_eq!(pg_timeout.kind().side(), Side::Database);
        assert_eq!(RelayError::StreamEnded.kind().side(), Side::Stream);
        assert!(
            RelayError::Nacked {
                message_id: "m".into()
            }
            .kind()
            .side()
                == Side::Broker
        );
    }
}
