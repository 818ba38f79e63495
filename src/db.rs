//! Ordinary PostgreSQL connections, and the replication connection's settings derived from the
//! same URL so the two can never point at different servers.

use std::time::Duration;

use pgwire_replication::{ReplicationConfig, TlsConfig};
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls};

use crate::error::RelayError;

/// Session settings pinned on the replication connection: protocol 1 sends column values as
/// text shaped by them (DESIGN.md section 2), and the mapper parses exactly these shapes.
pub const PINNED_SESSION_SETTINGS: &str =
    "-c datestyle=ISO -c timezone=UTC -c bytea_output=hex -c extra_float_digits=3";

pub const APPLICATION_NAME: &str = "outbox-relay";

/// How long establishing any connection (PostgreSQL, replication, RabbitMQ) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

pub fn parse_url(url: &str) -> Result<Config, RelayError> {
    url.parse::<Config>().map_err(|e| {
        // The parser's message may quote the URL; say only what is wrong with it.
        RelayError::Config(format!(
            "The database URL is not valid ({}). Expected postgres://user:password@host:port/database",
            redact_parse_error(&e.to_string())
        ))
    })
}

fn redact_parse_error(message: &str) -> &str {
    message.split(':').next().unwrap_or("invalid")
}

/// Opens an ordinary connection; its driver task ends with the connection.
pub async fn connect(url: &str) -> Result<Client, RelayError> {
    let mut config = parse_url(url)?;
    config.application_name(APPLICATION_NAME);
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    // connect_timeout bounds the TCP connect only: a server (or a network) that accepts and
    // then goes silent would hold the startup handshake forever.
    let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, config.connect(NoTls))
        .await
        .map_err(|_| RelayError::ConnectTimeout {
            what: "PostgreSQL",
            seconds: CONNECT_TIMEOUT.as_secs(),
        })??;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "database connection ended");
        }
    });
    Ok(client)
}

/// The replication connection's configuration for `slot` and `publication`.
pub fn replication_config(
    url: &str,
    slot: &str,
    publication: &str,
) -> Result<ReplicationConfig, RelayError> {
    let config = parse_url(url)?;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config
        .get_user()
        .ok_or_else(|| RelayError::Config("The database URL names no user".into()))?
        .to_string();
    let password = config
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let database = config.get_dbname().unwrap_or(&user).to_string();
    Ok(
        ReplicationConfig::new(host, user, password, database, slot, publication)
            .with_port(port)
            .with_tls(TlsConfig::disabled())
            .with_options(PINNED_SESSION_SETTINGS)
            .with_application_name(APPLICATION_NAME),
    )
}

/// Quotes an identifier for SQL text (names come from configuration, not from users, but a
/// schema-qualified or mixed-case name must still survive).
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a string literal for SQL text.
pub fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replication_config_follows_the_url() {
        let c = replication_config(
            "postgres://relay:p%40ss@db.example:6543/app",
            "outbox_slot",
            "outbox_pub",
        )
        .expect("config");
        assert_eq!(c.host, "db.example");
        assert_eq!(c.port, 6543);
        assert_eq!(c.user, "relay");
        assert_eq!(c.password, "p@ss");
        assert_eq!(c.database, "app");
        assert_eq!(c.slot, "outbox_slot");
        assert_eq!(c.options.as_deref(), Some(PINNED_SESSION_SETTINGS));
    }

    #[test]
    fn invalid_url_error_does_not_echo_the_url() {
        let e = parse_url("postgres://user:s3cret@host:notaport/db").expect_err("bad port");
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn quoting() {
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }
}
