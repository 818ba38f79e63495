//! The effect: what applying a message does, inside the transaction that also claims it in
//! the inbox. The consumer commits the two together, so a message's effect and its inbox row
//! exist together or not at all; that is the whole trick, and why an effect must do all of
//! its work through the transaction it is given (a call to another service from here would
//! not be undone by a rollback, nor deduplicated).
//!
//! [`SqlEffect`] runs one SQL statement a user gives, with the message's fields as
//! parameters ([`PARAMETERS`]); a Rust consumer implements [`Effect`] itself.

use std::future::Future;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement, Transaction};

use crate::error::{provisioning, InboxError};
use crate::message::InboxMessage;

/// What a consumer does with a message it has claimed.
pub trait Effect: Send + Sync + 'static {
    /// Per connection: what [`Effect::apply`] needs (prepared statements).
    type Prepared: Send + Sync + 'static;

    /// Prepares this effect on a new connection; an error stops the consumer (the
    /// statement cannot run on any message) unless it can pass (`error::provisioning`).
    fn prepare(
        &self,
        client: &Client,
    ) -> impl Future<Output = Result<Self::Prepared, InboxError>> + Send;

    /// Applies `message` inside `txn`, which claimed it in the inbox and commits after this
    /// returns. Must not commit or roll back, and must not act outside the transaction.
    fn apply(
        &self,
        prepared: &Self::Prepared,
        txn: &Transaction<'_>,
        message: &InboxMessage,
    ) -> impl Future<Output = Result<(), tokio_postgres::Error>> + Send;
}

/// The parameters a [`SqlEffect`] statement gets, in order (`$1` first), with their types.
pub const PARAMETERS: [(&str, Type, &str); 10] = [
    (
        "message_id",
        Type::TEXT,
        "the AMQP message_id (the outbox row's id)",
    ),
    ("type", Type::TEXT, "the AMQP type (event_type), or NULL"),
    (
        "routing_key",
        Type::TEXT,
        "the routing key it was published with",
    ),
    (
        "body",
        Type::TEXT,
        "the body as text, NULL if it is not UTF-8",
    ),
    ("body_bytes", Type::BYTEA, "the body as bytes"),
    (
        "headers",
        Type::TEXT,
        "every header as a JSON object (cast with ::jsonb)",
    ),
    ("outbox_seq", Type::TEXT, "x-outbox-seq (WAL mode), or NULL"),
    ("aggregate_type", Type::TEXT, "x-aggregate-type, or NULL"),
    ("aggregate_id", Type::TEXT, "x-aggregate-id, or NULL"),
    (
        "timestamp",
        Type::TIMESTAMPTZ,
        "the AMQP timestamp (created_at), or NULL",
    ),
];

/// One SQL statement run per message with [`PARAMETERS`] as `$1`…`$10` (it may use any of
/// them, or none), e.g. `INSERT INTO orders_paid (order_id) SELECT ($4::jsonb ->>
/// 'order_id')::bigint`.
#[derive(Debug, Clone)]
pub struct SqlEffect {
    sql: String,
}

impl SqlEffect {
    pub fn new(sql: impl Into<String>) -> Result<SqlEffect, InboxError> {
        let sql = sql.into();
        if sql.trim().is_empty() {
            return Err(InboxError::Config(
                "The effect statement is empty. Fix: give --effect-sql (OUTBOX_INBOX_EFFECT_SQL) \
                 a statement, e.g. INSERT INTO applied (message_id) VALUES ($1)"
                    .into(),
            ));
        }
        Ok(SqlEffect { sql })
    }
}

impl Effect for SqlEffect {
    type Prepared = Statement;

    async fn prepare(&self, client: &Client) -> Result<Statement, InboxError> {
        let types: Vec<Type> = PARAMETERS.iter().map(|(_, t, _)| t.clone()).collect();
        let named = PARAMETERS
            .iter()
            .enumerate()
            .map(|(i, (name, _, _))| format!("${} {name}", i + 1))
            .collect::<Vec<_>>()
            .join(", ");
        let statement = client
            .prepare_typed(&self.sql, &types)
            .await
            .map_err(|source| {
                let what = || {
                    format!(
                        "The effect statement does not prepare in the consumer's database. Its \
                         parameters are {named}: check the statement, the tables it names and \
                         the role's privileges"
                    )
                };
                provisioning(what, source)
            })?;
        if statement.params().len() != PARAMETERS.len() {
            return Err(InboxError::Config(format!(
                "The effect statement uses ${}, but the parameters are $1 to ${} ({named})",
                statement.params().len(),
                PARAMETERS.len()
            )));
        }
        Ok(statement)
    }

    async fn apply(
        &self,
        statement: &Statement,
        txn: &Transaction<'_>,
        message: &InboxMessage,
    ) -> Result<(), tokio_postgres::Error> {
        let body_text = std::str::from_utf8(&message.body).ok();
        let headers = message.headers.to_string();
        let params: [&(dyn ToSql + Sync); 10] = [
            &message.message_id,
            &message.kind,
            &message.routing_key,
            &body_text,
            &message.body,
            &headers,
            &message.outbox_seq,
            &message.aggregate_type,
            &message.aggregate_id,
            &message.timestamp,
        ];
        txn.execute(statement, &params).await.map(|_| ())
    }
}
