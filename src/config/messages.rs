//! How messages are made and where the ones that cannot be delivered go: the message format,
//! the exchange policy, the dead-letter policy, and the table-less outbox's prefix.

use clap::{Args, ValueEnum};

use super::names::{
    check_name_text, parse_exchange_list, parse_identifier, parse_optional_exchange_name,
};
use crate::error::{ConfigProblem, RelayError};

/// The prefix of the relay's WAL heartbeats (src/wal/heartbeat.rs). Owned here, where
/// `--emit-prefix` is checked against it, so that configuration names no part it configures.
pub(crate) const HEARTBEAT_PREFIX: &str = "outbox-relay:heartbeat";

/// `setup --restrict-emit`: who may write events (docs/emit.md, "Who may emit").
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Emitted events")]
pub struct RestrictEmitArgs {
    /// Restrict who may emit events (needs a superuser): revoke EXECUTE on both
    /// pg_logical_emit_message overloads from PUBLIC, make the emit functions SECURITY
    /// DEFINER with a pinned search_path, revoke them from PUBLIC and grant them to
    /// --emit-role, and grant pg_logical_emit_message(boolean, text, text) to --relay-role
    /// for its heartbeats.
    #[arg(long, env = "OUTBOX_RESTRICT_EMIT", requires = "emit_role")]
    pub restrict_emit: bool,

    /// With --restrict-emit: the role that may call the emit functions (the application's).
    #[arg(long, env = "OUTBOX_EMIT_ROLE", value_parser = parse_identifier)]
    pub emit_role: Option<String>,

    /// With --restrict-emit: the role `run` connects as, which keeps EXECUTE on
    /// pg_logical_emit_message for its heartbeats. Default: the role setup connects as.
    #[arg(long, env = "OUTBOX_RELAY_ROLE", value_parser = parse_identifier)]
    pub relay_role: Option<String>,
}

impl RestrictEmitArgs {
    /// The application's role when emitting is to be restricted, `None` otherwise.
    pub fn emit_role(&self) -> Option<&str> {
        self.emit_role.as_deref().filter(|_| self.restrict_emit)
    }
}

/// The table-less outbox (docs/emit.md): the prefix of this outbox's logical messages.
/// `setup` writes it into the emit functions, `run` publishes the messages that carry it.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Emitted events")]
pub struct EmitArgs {
    /// Prefix of the logical messages the emit functions write and `run` publishes
    /// (outbox_emit, docs/emit.md). Default: outbox-relay:emit:<schema>.<table>. Messages
    /// with other prefixes are ignored; it may not be the heartbeats' prefix.
    #[arg(long, env = "OUTBOX_EMIT_PREFIX", value_parser = parse_emit_prefix)]
    pub emit_prefix: Option<String>,
}

/// `--emit-prefix`: text that [`check_name_text`] accepts (it goes into the SQL of the emit
/// functions, dollar-quoted), and not the heartbeats' prefix.
fn parse_emit_prefix(prefix: &str) -> Result<String, String> {
    check_name_text(prefix).map_err(|e| e.replace("the name", "the prefix"))?;
    if prefix == HEARTBEAT_PREFIX {
        return Err(format!(
            "{prefix:?} is the prefix of the relay's heartbeats; the emit prefix must differ \
             (the default is outbox-relay:emit:<schema>.<table>)"
        ));
    }
    Ok(prefix.to_string())
}

/// How a message's body is laid out (`run`, `poll`, `resync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MessageFormat {
    /// The payload itself: the body is the row's payload, unchanged.
    Plain,
    /// A CloudEvents 1.0 JSON event, structured mode.
    Cloudevents,
}

/// `--message-format` and the CloudEvents `source` (src/contract/cloudevents.rs, docs/emit.md).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Message format")]
pub struct MessageFormatArgs {
    /// The body of every message: `plain` (the payload) or `cloudevents` (a CloudEvents 1.0
    /// JSON event in structured mode, content type application/cloudevents+json, the payload
    /// as its data). The AMQP properties and headers are the same in both.
    #[arg(long, env = "OUTBOX_MESSAGE_FORMAT", value_enum, default_value_t = MessageFormat::Plain)]
    pub message_format: MessageFormat,

    /// The CloudEvents `source` attribute (a URI-reference, never with credentials).
    /// Default: urn:outbox-relay:<database>:<schema>.<table>.
    #[arg(long, env = "OUTBOX_CLOUDEVENTS_SOURCE", value_parser = parse_cloudevents_source)]
    pub cloudevents_source: Option<String>,
}

fn parse_cloudevents_source(source: &str) -> Result<String, String> {
    crate::contract::cloudevents::check_source(source)?;
    Ok(source.to_string())
}

/// Which exchanges a row may send its message to, and with which routing key.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Routing and dead letters")]
pub struct ExchangePolicyArgs {
    /// Exchanges a row's `exchange` column (or an --exchange template) may name,
    /// comma-separated; a name ending in `*` allows every exchange that starts with the rest
    /// (events.*); `*` alone allows any exchange the broker user can write to. A plain
    /// --exchange is always allowed. A message naming another exchange is not published: it
    /// stops the relay (`halt`) or goes to the dead-letter exchange with the reason
    /// "exchange not allowed".
    #[arg(long, env = "OUTBOX_ALLOWED_EXCHANGES", value_parser = parse_exchange_list)]
    pub allowed_exchanges: Option<String>,

    /// The routing key of a message whose row has no `routing_key` value: a template over the
    /// contract's fields, {event_type}, {aggregate_type}, {aggregate_id}, {id} (e.g.
    /// '{aggregate_type}.{event_type}'; `{{` is a literal brace). A field a message lacks
    /// makes it unpublishable (--on-unroutable decides).
    #[arg(
        long,
        env = "OUTBOX_ROUTING_KEY",
        value_name = "TEMPLATE",
        default_value = "{event_type}",
        value_parser = parse_routing_key
    )]
    pub routing_key: String,
}

/// `--routing-key`: a template that parses (src/contract/template.rs).
fn parse_routing_key(text: &str) -> Result<String, String> {
    crate::contract::template::Template::parse(text)?;
    if text.len() > 255 {
        return Err("is over 255 bytes: AMQP allows at most 255 in a routing key".into());
    }
    Ok(text.to_string())
}

/// What happens to a message the broker will not route or accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnUnroutable {
    /// Stop at it: nothing after it is acknowledged; retry until it can be delivered.
    Halt,
    /// Publish it to --dead-letter-exchange with the reason in headers, then move on.
    DeadLetter,
}

/// The dead-letter policy (src/publish/dead_letter.rs, docs/recovery.md, "Dead letters").
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Routing and dead letters")]
pub struct DeadLetterArgs {
    /// What to do with a message the broker returns as unroutable (no binding for its routing
    /// key), or one that cannot be published at all (over --max-message-size, or a row that
    /// cannot be mapped): `halt` stops delivery at it until it can be delivered; `dead-letter`
    /// publishes it to --dead-letter-exchange with the reason in headers, and once the broker
    /// confirms that, moves on.
    #[arg(long, env = "OUTBOX_ON_UNROUTABLE", value_enum, default_value_t = OnUnroutable::Halt)]
    pub on_unroutable: OnUnroutable,

    /// The exchange dead letters go to (required with --on-unroutable dead-letter). `setup`
    /// declares it as a durable topic exchange; dead letters keep their routing key, so bind
    /// a queue with `#` to receive them all.
    #[arg(long, env = "OUTBOX_DEAD_LETTER_EXCHANGE", value_parser = parse_optional_exchange_name)]
    pub dead_letter_exchange: Option<String>,
}

impl DeadLetterArgs {
    /// The dead-letter exchange when the policy is `dead-letter`, `None` under `halt`.
    /// `exchange` is the main exchange, which the dead letters must not go back to.
    pub fn exchange(&self, exchange: &str) -> Result<Option<String>, RelayError> {
        if self.on_unroutable == OnUnroutable::Halt {
            return Ok(None);
        }
        match self.dead_letter_exchange.as_deref().map(str::trim) {
            None | Some("") => Err(ConfigProblem::DeadLetterExchangeMissing.into()),
            Some(name) if name == exchange => Err(ConfigProblem::DeadLetterExchangeIsMain {
                exchange: exchange.to_string(),
            }
            .into()),
            Some(name) if name.len() > 255 => {
                Err(ConfigProblem::DeadLetterExchangeTooLong { bytes: name.len() }.into())
            }
            Some(name) => Ok(Some(name.to_string())),
        }
    }
}
