//! A configuration that cannot work, named by what is wrong with it: flags, URLs and secrets
//! that contradict each other or what they name.

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
