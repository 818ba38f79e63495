//! From the command line to the parts a relay runs with: the one builder that `run`, `poll`
//! and `resync` (and `setup`) make their mapper, shard, broker nodes and emit prefix with.
//!
//! `crate::config` is plain data: flags checked for what they are on their own. What needs
//! more than one flag, or a part of the relay (the mapper's exchange policy and CloudEvents
//! format, the shard's row filter, the broker list's parsing), is made here, once, so the
//! commands cannot build the same thing in different ways.

use std::sync::Arc;

use crate::config::{
    ColumnArgs, Connections, DeadLetterArgs, EmitArgs, ExchangePolicyArgs, MessageFormat,
    MessageFormatArgs, NodeOrder, PublishLimits, RunShard, TableName,
};
use crate::contract::columns::{self, ColumnMap};
use crate::contract::headers;
use crate::contract::mapper::{AllowedExchanges, Mapper};
use crate::contract::template::Template;
use crate::error::{ConfigProblem, RelayError};
use crate::publish::BrokerNodes;
use crate::shard::Shard;
use crate::table::outbox::needs_created_at;

/// What every publishing command (`run`, `poll`, `resync`) runs with: the database it reads,
/// the broker nodes it publishes to, the mapper between them and the dead-letter exchange.
pub(crate) struct RelayParts {
    /// Checked: a malformed URL is a definite error before anything starts, never an outage
    /// to retry.
    pub database_url: String,
    /// The URL's user, for errors that name the role.
    pub role: Option<String>,
    pub brokers: Arc<BrokerNodes>,
    pub mapper: Mapper,
    /// The dead-letter exchange under `--on-unroutable dead-letter`; `None` under halt.
    pub dead_letter_exchange: Option<String>,
}

/// The flag groups a publishing command's [`RelayParts`] are made from.
pub(crate) struct RelayPartsFlags<'a> {
    pub connections: &'a Connections,
    pub table: &'a TableName,
    pub exchange: &'a str,
    pub publishing: &'a PublishLimits,
    pub exchanges: &'a ExchangePolicyArgs,
    pub format: &'a MessageFormatArgs,
    /// `None` for a command without the dead-letter policy (`resync`).
    pub dead_letter: Option<&'a DeadLetterArgs>,
}

impl RelayParts {
    pub(crate) fn new(flags: RelayPartsFlags<'_>) -> Result<RelayParts, RelayError> {
        let database_url = flags.connections.database_url()?;
        let role = crate::db::parse_url(&database_url)?
            .get_user()
            .map(str::to_string);
        let allowed =
            AllowedExchanges::parse(flags.exchanges.allowed_exchanges.as_deref(), flags.exchange)?;
        let routing_key = Template::parse(&flags.exchanges.routing_key)
            .map_err(|problem| ConfigProblem::RoutingKey { problem })?;
        let mapper = Mapper::new(flags.exchange, flags.publishing.max_message_size, allowed)
            .map_err(RelayError::Config)?
            .with_routing_key(routing_key);
        let mapper = with_format(mapper, flags.format, &database_url, flags.table)?;
        let dead_letter_exchange = match flags.dead_letter {
            Some(dead_letter) => dead_letter.exchange(flags.exchange)?,
            None => None,
        };
        Ok(RelayParts {
            brokers: broker_nodes(flags.connections)?,
            database_url,
            role,
            mapper,
            dead_letter_exchange,
        })
    }
}

/// The column map (`--table-layout`, `--column`) of a command that reads the table, checked
/// against what it will run, before anything connects: each of `created_at_for` (why a
/// feature that is on needs `created_at`) refuses a map that leaves `created_at` unmapped.
pub(crate) fn column_map(
    flags: &ColumnArgs,
    table: &TableName,
    created_at_for: &[&str],
) -> Result<Arc<ColumnMap>, RelayError> {
    let map = flags.map()?;
    if let Some(taken) = map
        .header_columns()
        .iter()
        .find(|h| headers::RESERVED.contains(&h.header.as_str()))
    {
        return Err(ConfigProblem::ReservedHeader {
            column: taken.column.clone(),
            header: taken.header.clone(),
            reserved: headers::RESERVED.to_vec(),
        }
        .into());
    }
    if map.column(columns::CREATED_AT).is_none() {
        if let Some(why) = created_at_for.first() {
            return Err(needs_created_at(table, &map, why));
        }
    }
    Ok(Arc::new(map))
}

/// The RabbitMQ nodes `--amqp-url` names, every URL checked, in `--amqp-node-order`.
pub(crate) fn broker_nodes(connections: &Connections) -> Result<Arc<BrokerNodes>, RelayError> {
    let list = connections.amqp_url()?;
    match connections.broker.amqp_node_order() {
        NodeOrder::Shuffled => BrokerNodes::parse(&list),
        NodeOrder::Listed => BrokerNodes::parse_listed(&list),
    }
    .map(Arc::new)
}

/// The shard `run` streams; [`Shard::UNSHARDED`] for `--shards 1`.
pub(crate) fn shard(flags: &RunShard) -> Result<Shard, RelayError> {
    let count = flags.count.shards;
    match flags.shard {
        Some(index) => Shard::new(index, count),
        None if count == 1 => Ok(Shard::UNSHARDED),
        // Not shard 0 by default: a forgotten OUTBOX_SHARD would make every relay a standby
        // of shard 0 while the other shards' rows wait unnoticed.
        None => Err(ConfigProblem::ShardNotGiven { count }.into()),
    }
}

/// The emit prefix: the configured one, or the default for `table`.
pub(crate) fn emit_prefix(flags: &EmitArgs, table: &TableName) -> String {
    match &flags.emit_prefix {
        Some(prefix) => prefix.clone(),
        None => crate::contract::emit::default_prefix(table.table_parts()),
    }
}

/// `mapper` publishing in the chosen format, for `table` of the database `database_url` names
/// (the default CloudEvents source holds its database name, never its user or password).
fn with_format(
    mapper: Mapper,
    flags: &MessageFormatArgs,
    database_url: &str,
    table: &TableName,
) -> Result<Mapper, RelayError> {
    if flags.message_format == MessageFormat::Plain {
        return Ok(mapper);
    }
    let source = match &flags.cloudevents_source {
        Some(source) => source.clone(),
        None => {
            let config = crate::db::parse_url(database_url)?;
            let database = config
                .get_dbname()
                .or(config.get_user())
                .unwrap_or("postgres");
            crate::contract::cloudevents::default_source(database, table.table_parts())
        }
    };
    Ok(mapper.with_cloudevents(&source))
}
