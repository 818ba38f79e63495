//! The relay's PostgreSQL connections: the ordinary ones are the shared crate's
//! (outbox_common::pg: URL, TLS by libpq's `sslmode`, connect timeouts, finding the primary;
//! the inbox opens its own the same way), with their errors as `RelayError`s; the replication
//! connection's settings are derived here from the same URL and TLS policy, so the two can
//! never point at different servers.
//!
//! It owns how the relay reaches PostgreSQL (the pinned session settings, identifier quoting),
//! never what it runs there: no relay query lives here, each belongs to the module that needs
//! it. Every connection the relay opens comes from here ([`connect`],
//! [`connect_for_notifications`] for polling's LISTEN, [`replication_config`] and
//! [`connect_replication`]): none may bypass the TLS policy.

use outbox_common::pg;
use pgwire_replication::{
    IdentifySystem, PgWireError, ReplicationClient, ReplicationConfig, TlsConfig,
};
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config};

use crate::error::{ConfigProblem, Endpoint, RelayError};
use outbox_common::pg::{
    parse_driver_url, split_tls, Notifications, Server, APPLICATION_NAME, CONNECT_TIMEOUT,
};
use outbox_common::quote::quote_ident;

/// Both spellings of one list of session settings, so they cannot drift apart.
macro_rules! pinned_session_settings {
    ($name:literal = $value:literal $(, $names:literal = $values:literal)* $(,)?) => {
        /// Session settings pinned on the replication connection, as its startup options:
        /// protocol 1 sends column values as text shaped by them (docs/architecture.md, "Session settings"), and
        /// the mapper parses exactly these shapes.
        pub(crate) const PINNED_SESSION_SETTINGS: &str =
            concat!("-c ", $name, "=", $value $(, " -c ", $names, "=", $values)*);
        /// The same settings as SET statements, for the ordinary connections whose rows the
        /// mapper reads as text (polling mode, `resync`).
        pub(crate) const PINNED_SET_STATEMENTS: &str =
            concat!("SET ", $name, " = '", $value, "';" $(, " SET ", $names, " = '", $values, "';")*);
    };
}

pinned_session_settings!(
    "datestyle" = "ISO",
    "timezone" = "UTC",
    "bytea_output" = "hex",
    "extra_float_digits" = "3",
);

/// The URL as tokio-postgres reads it, the TLS settings taken out (outbox_common::pg::parse_url).
pub fn parse_url(url: &str) -> Result<Config, RelayError> {
    Ok(pg::parse_url(url)?)
}

/// The servers the URL names, in its order (outbox_common::pg::servers).
pub(crate) fn servers(url: &str) -> Result<Vec<Server>, RelayError> {
    Ok(pg::servers(url)?)
}

/// The server that is the primary (outbox_common::pg::primary).
pub async fn primary(url: &str) -> Result<Server, RelayError> {
    Ok(pg::primary(url).await?)
}

/// Opens an ordinary connection to the primary; its driver task ends with the connection.
pub async fn connect(url: &str) -> Result<Client, RelayError> {
    Ok(pg::connect(url).await?)
}

/// Opens an ordinary connection to `server`, one of the URL's (a standby too).
pub async fn connect_to(url: &str, server: &Server) -> Result<Client, RelayError> {
    Ok(pg::connect_to(url, server).await?)
}

/// [`connect`], for a connection that LISTENs: the same TLS and timeouts, and the
/// notifications its driver receives.
pub(crate) async fn connect_for_notifications(
    url: &str,
) -> Result<(Client, Notifications), RelayError> {
    Ok(pg::connect_for_notifications(url).await?)
}

/// [`connect_to`], handing over what the connection receives and the error that ends it: for
/// a connection kept open to learn why `server` closes it (a shutdown).
pub(crate) async fn connect_to_for_notifications(
    url: &str,
    server: &Server,
) -> Result<(Client, Notifications), RelayError> {
    Ok(pg::connect_to_for_notifications(url, server).await?)
}

/// The server's version as a number (`server_version_num`: 170004 for 17.4).
pub(crate) async fn server_version_num(client: &Client) -> Result<i32, RelayError> {
    let row = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await?;
    Ok(row.get(0))
}

/// Opens a gated replication session (nothing streams before `start`) and waits, at most
/// [`CONNECT_TIMEOUT`], until it is connected, past TLS and authentication, and has answered
/// IDENTIFY_SYSTEM. The crate connects in its worker and reports only at the first command,
/// so this round trip is what bounds the connect: without it a server (or a proxy) that
/// accepts and never answers holds the caller for ever. The timeout is the outer error
/// (`ConnectTimeout`, the session aborted); what the server said is the inner one, for the
/// caller to name.
pub(crate) async fn connect_replication(
    config: ReplicationConfig,
) -> Result<Result<(ReplicationClient, IdentifySystem), PgWireError>, RelayError> {
    let mut client = match ReplicationClient::connect_gated(config).await {
        Ok(client) => client,
        Err(e) => return Ok(Err(e)),
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, client.identify_system()).await {
        Ok(Ok(system)) => Ok(Ok((client, system))),
        Ok(Err(e)) => Ok(Err(e)),
        Err(_) => {
            client.abort();
            Err(RelayError::ConnectTimeout {
                endpoint: Endpoint::Replication,
                seconds: CONNECT_TIMEOUT.as_secs(),
            })
        }
    }
}

/// The replication connection's configuration for `slot` and `publication`, to `server`
/// (the one the session's ordinary connection went to: [`primary`]).
pub fn replication_config(
    url: &str,
    server: &Server,
    slot: &str,
    publication: &str,
) -> Result<ReplicationConfig, RelayError> {
    let (rest, tls) = split_tls(url)?;
    let config = parse_driver_url(&rest)?;
    let (host, tls) = match &server.host {
        Host::Tcp(host) => (host.clone(), tls),
        // libpq ignores sslmode on Unix sockets; the crate refuses TLS there.
        Host::Unix(path) => (path.display().to_string(), TlsConfig::disabled()),
    };
    let port = server.port;
    let user = config
        .get_user()
        .ok_or(ConfigProblem::DatabaseUrlNoUser)?
        .to_string();
    let password = config
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let database = config.get_dbname().unwrap_or(&user).to_string();
    // pgoutput reads `publication_names` as a list of identifiers: unquoted, a name is folded
    // to lower case and ends at a space or comma. Quoted, any name setup accepts arrives as
    // it is (the crate doubles the single quotes around it).
    let publication = quote_ident(publication);
    // No statement timeout here: START_REPLICATION runs for the whole session.
    let peer_timeout = outbox_common::liveness::policy().peer_timeout;
    let options = format!(
        "{PINNED_SESSION_SETTINGS} {}",
        peer_timeout.replication_server_settings()
    );
    Ok(
        ReplicationConfig::new(host, user, password, database, slot, publication)
            .with_port(port)
            .with_tls(tls)
            .with_options(options)
            // The URL's name wins, as on the ordinary connections (outbox_common::pg).
            .with_application_name(config.get_application_name().unwrap_or(APPLICATION_NAME))
            .with_tcp_keepalive(peer_timeout.tcp_keepalive()),
    )
}

#[cfg(test)]
mod tests {
    use outbox_common::pg::{key_value_params, tls_warning, TlsOutcome};
    use std::path::PathBuf;

    use pgwire_replication::SslMode;

    use super::*;

    #[test]
    fn replication_config_follows_the_url() {
        let url = "postgres://relay:p%40ss@db.example:6543/app";
        let c = replication_config(
            url,
            &servers(url).expect("one server")[0],
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
        assert_eq!(c.publication.names(), ["\"outbox_pub\""]);
        let options = c.options.as_deref().unwrap_or_default();
        assert!(options.starts_with(PINNED_SESSION_SETTINGS), "{options}");
        assert!(options.contains("-c tcp_keepalives_idle="), "{options}");
        // A relay holding back for the broker stops reading: no user timeout on the server's
        // end, or a zero window would end the session (crates/outbox-common/src/liveness.rs).
        assert!(options.contains("-c tcp_user_timeout=0"), "{options}");
        assert!(!options.contains("statement_timeout"), "{options}");
        assert!(c.tcp_keepalive.is_some());
        assert_eq!(c.application_name.as_deref(), Some(APPLICATION_NAME));
        // A name the URL sets wins (pg_stat_replication shows it).
        let named = "postgres://relay@db.example/app?application_name=billing-relay";
        let c =
            replication_config(named, &servers(named).expect("one")[0], "s", "p").expect("config");
        assert_eq!(c.application_name.as_deref(), Some("billing-relay"));
    }

    #[test]
    fn a_question_mark_in_the_password_does_not_start_the_query() {
        let url = "postgres://relay:p?sslmode=x@db/app?sslmode=require";
        let (rest, tls) = split_tls(url).expect("valid");
        assert_eq!(rest, "postgres://relay:p?sslmode=x@db/app");
        assert_eq!(tls.mode, SslMode::Require);
        let config = parse_url(url).expect("valid");
        assert_eq!(config.get_password(), Some(&b"p?sslmode=x"[..]));
        let error = parse_url("postgres://relay:p?sslmode=secret@db/app").map(|_| ());
        assert!(error.is_ok(), "{error:?}");
    }

    #[test]
    fn key_value_parameters_are_read_as_libpq_reads_them() {
        let params = |text| {
            key_value_params(text).map(|params| {
                params
                    .iter()
                    .map(|p| (p.key.to_string(), p.value.clone(), p.text.to_string()))
                    .collect::<Vec<_>>()
            })
        };
        let param = |key: &str, value: &str, text: &str| (key.into(), value.into(), text.into());
        assert_eq!(
            params(" host = db  password='a b\\'c' sslmode= require x=a\\ "),
            Some(vec![
                param("host", "db", "host = db"),
                param("password", "a b'c", "password='a b\\'c'"),
                param("sslmode", "require", "sslmode= require"),
                param("x", "a ", "x=a\\ "),
            ])
        );
        for bad in ["host", "=db", "host=", "host='db", "host=\\"] {
            assert!(params(bad).is_none(), "{bad}");
        }
        // Spaces around `=` keep the mode out of what tokio-postgres reads, and a value that
        // looks like a parameter stays the value it is.
        let (rest, tls) = split_tls("host = db sslmode = verify-full user=r").expect("valid");
        assert_eq!(
            (rest.as_str(), tls.mode),
            ("host = db user=r", SslMode::VerifyFull)
        );
        let (rest, _) = split_tls("host= sslmode=x password=p").expect("valid");
        assert_eq!(rest, "host= sslmode=x password=p");
        let server = servers("host= sslmode=x password=p").expect("valid");
        assert_eq!(server[0].host_text(), "sslmode=x");
    }

    #[test]
    fn sslmode_and_sslrootcert_come_out_of_the_url_for_both_connections() {
        let (rest, tls) = split_tls(
            "postgres://relay:pw@db.example/app?sslmode=verify-full&connect_timeout=5&sslrootcert=/etc/ca%20dir/ca.pem",
        )
        .expect("parses");
        assert_eq!(rest, "postgres://relay:pw@db.example/app?connect_timeout=5");
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.ca_pem_path, Some(PathBuf::from("/etc/ca dir/ca.pem")));
        parse_url("postgres://relay@db/app?sslmode=verify-ca")
            .expect("the driver accepts the rest");

        let only = |url: &str| servers(url).expect("servers").remove(0);
        let url = "postgres://r@db/app?sslmode=require";
        let c = replication_config(url, &only(url), "s", "p").expect("config");
        assert_eq!(c.tls.mode, SslMode::Require);
        // Unix sockets never use TLS (as in libpq).
        let url = "postgres://r@%2Frun%2Fpg/app?sslmode=require";
        let c = replication_config(url, &only(url), "s", "p").expect("config");
        assert_eq!(c.tls.mode, SslMode::Disable);
    }

    /// libpq's multi-host URLs: every host with its port, in order; target_session_attrs
    /// taken out (the relay finds the primary itself) and a standby-seeking one refused.
    #[test]
    fn several_hosts_are_read_in_order() {
        let url = "postgres://relay@pg-a:5432,pg-b:6543,[::1]/app?target_session_attrs=read-write";
        let found: Vec<String> = servers(url)
            .expect("servers")
            .iter()
            .map(Server::to_string)
            .collect();
        assert_eq!(found, ["pg-a:5432", "pg-b:6543", "[::1]:5432"]);
        let ports: Vec<u16> = servers("postgres://relay@a,b:7000/app")
            .expect("servers")
            .iter()
            .map(|s| s.port)
            .collect();
        assert_eq!(ports, [5432, 7000], "each host its own port, as in libpq");
        assert_eq!(
            servers("host=a,b port=1,2 user=r dbname=app")
                .expect("key=value")
                .len(),
            2
        );
        assert!(parse_url("postgres://r@a,b/app?target_session_attrs=primary").is_ok());
        let standby = parse_url("postgres://r@a,b/app?target_session_attrs=standby")
            .expect_err("a standby cannot serve the relay");
        assert!(
            standby.to_string().contains("needs the primary"),
            "{standby}"
        );
    }

    #[test]
    fn sslmodes_follow_libpq() {
        let mode = |url: &str| split_tls(url).map(|(_, tls)| (tls.mode, tls.ca_pem_path));
        assert_eq!(
            mode("postgres://r@db/app").expect("default"),
            (SslMode::Prefer, None)
        );
        assert_eq!(
            mode("postgres://r@db/app?sslmode=disable").expect("disable"),
            (SslMode::Disable, None)
        );
        // require with a CA verifies the chain, as libpq does.
        assert_eq!(
            mode("postgres://r@db/app?sslmode=require&sslrootcert=ca.pem").expect("require"),
            (SslMode::VerifyCa, Some(PathBuf::from("ca.pem")))
        );
        assert_eq!(
            mode("host=db user=r sslmode=verify-full sslrootcert=/ca.pem").expect("key=value"),
            (SslMode::VerifyFull, Some(PathBuf::from("/ca.pem")))
        );
        let e = split_tls("postgres://r@db/app?sslmode=verify").expect_err("unknown mode");
        assert!(e.to_string().contains("sslmode=verify,"), "{e}");
        assert!(e.to_string().contains("verify-full"), "{e}");
    }

    #[test]
    fn invalid_url_error_does_not_echo_the_url() {
        let e = parse_url("postgres://user:s3cret@host:notaport/db").expect_err("bad port");
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn both_spellings_of_the_pinned_settings_come_from_one_list() {
        assert_eq!(
            PINNED_SESSION_SETTINGS,
            "-c datestyle=ISO -c timezone=UTC -c bytea_output=hex -c extra_float_digits=3"
        );
        assert_eq!(
            PINNED_SET_STATEMENTS,
            "SET datestyle = 'ISO'; SET timezone = 'UTC'; SET bytea_output = 'hex'; \
             SET extra_float_digits = '3';"
        );
    }

    #[test]
    fn query_values_are_percent_decoded_as_libpq_does() {
        let ca = |url: &str| split_tls(url).map(|(_, tls)| tls.ca_pem_path);
        // `+` stays a plus (a form would make it a space); a stray `%` stays as it is.
        assert_eq!(
            ca("postgres://r@db/app?sslmode=verify-ca&sslrootcert=/ca/a+b%2Bc%zz.pem")
                .expect("parses"),
            Some(PathBuf::from("/ca/a+b+c%zz.pem"))
        );
    }

    #[test]
    fn a_connection_over_the_network_without_verified_tls_is_warned_about() {
        let tcp = |name: &str| Host::Tcp(name.to_string());
        use TlsOutcome::*;
        // Over the network: plaintext and unverified TLS warn, naming the fix.
        for (mode, outcome, says) in [
            (SslMode::Prefer, Plain, "sslmode=prefer (libpq's default"),
            (
                SslMode::Disable,
                Plain,
                "is not encrypted (sslmode=disable)",
            ),
            (SslMode::Prefer, Unverified, "not verified (sslmode=prefer)"),
            (
                SslMode::Require,
                Unverified,
                "not verified (sslmode=require)",
            ),
        ] {
            let warning = tls_warning(&tcp("db.example"), 5432, mode, outcome)
                .unwrap_or_else(|| panic!("{mode:?} {outcome:?} warns"));
            assert!(
                warning.contains("PostgreSQL at db.example:5432"),
                "{warning}"
            );
            assert!(warning.contains(says), "{warning}");
            assert!(
                warning.contains("Fix: add sslmode=verify-full&sslrootcert="),
                "{warning}"
            );
        }
        assert!(tls_warning(&tcp("10.1.2.3"), 5432, SslMode::Prefer, Plain).is_some());
        assert!(tls_warning(&tcp("::ffff:10.0.0.1"), 5432, SslMode::Prefer, Plain).is_some());
        // Verified certificates do not.
        assert_eq!(
            tls_warning(&tcp("db"), 5432, SslMode::VerifyFull, Verified),
            None
        );
        assert_eq!(
            tls_warning(&tcp("db"), 5432, SslMode::VerifyCa, ChainVerified),
            None
        );
        // Nor does anything that stays on the machine.
        for host in [
            "localhost",
            "LOCALHOST",
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "[::1]",
            "::ffff:127.0.0.1",
        ] {
            assert_eq!(
                tls_warning(&tcp(host), 5432, SslMode::Prefer, Plain),
                None,
                "{host}"
            );
        }
        let socket = Host::Unix(PathBuf::from("/run/postgresql"));
        assert_eq!(tls_warning(&socket, 5432, SslMode::Prefer, Plain), None);
    }
}
