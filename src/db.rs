//! Ordinary PostgreSQL connections, and the replication connection's settings derived from the
//! same URL so the two can never point at different servers.
//!
//! TLS follows libpq's `sslmode` and `sslrootcert` in the URL, for both connections.
//! tokio-postgres knows neither `verify-ca`/`verify-full` nor `sslrootcert`, so the two are
//! taken out of the URL here, and the ordinary connection is upgraded by the same code that
//! upgrades the replication connection (pgwire-replication's rustls handshake), then handed
//! to tokio-postgres as an already-encrypted stream: one TLS policy, one place.
//!
//! It owns how the relay reaches PostgreSQL (URL, TLS, connect timeouts, the pinned session
//! settings, identifier quoting), never what it runs there: no relay query lives here, each
//! belongs to the module that needs it. Every connection the relay opens comes from here
//! ([`connect`], [`connect_for_notifications`] for polling's LISTEN, [`replication_config`]):
//! none may bypass the TLS policy.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

// Values only: libpq decodes `%XX` in a URI's parameters but, unlike a form, not `+`.
use futures_util::StreamExt;
use percent_encoding::percent_decode_str;
use pgwire_replication::tls::rustls::maybe_upgrade_to_tls;
use pgwire_replication::{ReplicationConfig, SslMode, TlsConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_postgres::config::{Host, SslMode as DriverSslMode};
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Notification};

use crate::advice::{self, Warning};
use crate::error::{ConfigProblem, Endpoint, RelayError};
// Re-exported: the relay's modules and the other crates quote their SQL through `db`.
pub use crate::quote::{quote_ident, quote_literal};

/// Both spellings of one list of session settings, so they cannot drift apart.
macro_rules! pinned_session_settings {
    ($name:literal = $value:literal $(, $names:literal = $values:literal)* $(,)?) => {
        /// Session settings pinned on the replication connection, as its startup options:
        /// protocol 1 sends column values as text shaped by them (docs/architecture.md, "Session settings"), and
        /// the mapper parses exactly these shapes.
        pub const PINNED_SESSION_SETTINGS: &str =
            concat!("-c ", $name, "=", $value $(, " -c ", $names, "=", $values)*);
        /// The same settings as SET statements, for the ordinary connections whose rows the
        /// mapper reads as text (polling mode, `resync`).
        pub const PINNED_SET_STATEMENTS: &str =
            concat!("SET ", $name, " = '", $value, "';" $(, " SET ", $names, " = '", $values, "';")*);
    };
}

pinned_session_settings!(
    "datestyle" = "ISO",
    "timezone" = "UTC",
    "bytea_output" = "hex",
    "extra_float_digits" = "3",
);

pub const APPLICATION_NAME: &str = "outbox-relay";

/// How long establishing any connection (PostgreSQL, replication, RabbitMQ) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

pub fn parse_url(url: &str) -> Result<Config, RelayError> {
    let (rest, _) = split_tls(url)?;
    parse_driver_url(&rest)
}

fn parse_driver_url(url: &str) -> Result<Config, RelayError> {
    url.parse::<Config>().map_err(|e| {
        // The error's own text names only the kind of problem; its source (left out) may
        // quote part of the URL, and the URL may hold a password.
        RelayError::from(ConfigProblem::DatabaseUrl {
            problem: e.to_string(),
        })
    })
}

/// The URL's `sslmode` and `sslrootcert` as the TLS settings of both connections, and the
/// URL without them (for tokio-postgres). Without `sslmode` the relay behaves like libpq:
/// `prefer` (TLS if the server offers it, unverified; plain otherwise). As in libpq,
/// `require` with a `sslrootcert` verifies the chain like `verify-ca`.
///
/// `target_session_attrs` comes out too: with several hosts the relay always looks for the
/// primary itself ([`primary`]), so `read-write`, `primary` and `any` all mean that, and a
/// value asking for a standby is refused.
fn split_tls(url: &str) -> Result<(String, TlsConfig), RelayError> {
    let mut mode = None;
    let mut root_cert = None;
    let mut session_attrs = None;
    let mut take = |key: &str, value: &str| match key {
        "sslmode" => {
            mode = Some(value.to_string());
            true
        }
        "sslrootcert" => {
            root_cert = Some(PathBuf::from(value));
            true
        }
        "target_session_attrs" => {
            session_attrs = Some(value.to_string());
            true
        }
        "keepalives"
        | "keepalives_idle"
        | "keepalives_interval"
        | "keepalives_count"
        | "keepalives_retries"
        | "tcp_user_timeout" => {
            warn_once_keepalive_ignored(key);
            true
        }
        _ => false,
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        // tokio-postgres reads the credentials, up to the first '@', before anything else: a
        // '?' in a password is not where the query starts (taken for it, the URL's sslmode
        // went unseen, a silent `prefer`, and the error on a bogus one quoted the password).
        let credentials_end = url.find('@').map_or(0, |at| at + 1);
        let query = url[credentials_end..]
            .find('?')
            .map(|at| url.split_at(credentials_end + at));
        match query.map(|(base, query)| (base, &query[1..])) {
            None => url.to_string(),
            Some((base, query)) => {
                let kept: Vec<&str> = query
                    .split('&')
                    .filter(|pair| {
                        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                        !take(key, &percent_decode_str(value).decode_utf8_lossy())
                    })
                    .collect();
                if kept.is_empty() {
                    base.to_string()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        match key_value_params(url) {
            Some(params) => params
                .iter()
                .filter(|param| !take(param.key, &param.value))
                .map(|param| param.text)
                .collect::<Vec<_>>()
                .join(" "),
            // Not key=value text: tokio-postgres says what is wrong with it.
            None => url.to_string(),
        }
    };
    if let Some(attrs) =
        session_attrs.filter(|a| !["read-write", "primary", "any"].contains(&a.as_str()))
    {
        return Err(ConfigProblem::SessionAttrs { attrs }.into());
    }
    let tls = match mode.as_deref().unwrap_or("prefer") {
        "disable" => TlsConfig::disabled(),
        "allow" | "prefer" => TlsConfig {
            mode: SslMode::Prefer,
            ..TlsConfig::disabled()
        },
        "require" if root_cert.is_none() => TlsConfig::require(),
        "require" | "verify-ca" => TlsConfig::verify_ca(root_cert),
        "verify-full" => TlsConfig::verify_full(root_cert),
        other => {
            return Err(ConfigProblem::SslMode {
                mode: other.to_string(),
            }
            .into())
        }
    };
    Ok((rest, tls))
}

/// One parameter of libpq's key=value form: its keyword, its value (unquoted, unescaped) and
/// the parameter as written.
pub(crate) struct Param<'a> {
    pub key: &'a str,
    pub value: String,
    pub text: &'a str,
}

/// The parameters of a key=value connection string, read the way libpq and tokio-postgres
/// read them: spaces allowed around `=`, a value in single quotes, backslash escapes. Split at
/// spaces instead, `host = db sslmode = require` was refused for an empty sslmode, and in
/// `host= sslmode=x password=p` (the host is `sslmode=x`) the password became the host name.
/// `None` when the text is not of that form.
pub(crate) fn key_value_params(text: &str) -> Option<Vec<Param<'_>>> {
    let mut params = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let start = text.len() - rest.len();
        let key_len = rest.find(|c: char| c.is_whitespace() || c == '=')?;
        let key = rest.get(..key_len).filter(|key| !key.is_empty())?;
        rest = rest[key_len..].trim_start().strip_prefix('=')?.trim_start();
        let quoted = rest.starts_with('\'');
        let mut chars = rest.char_indices().skip(usize::from(quoted));
        let mut value = String::new();
        let mut end = None;
        while let Some((at, c)) = chars.next() {
            match c {
                '\\' => value.extend(chars.next().map(|(_, escaped)| escaped)),
                '\'' if quoted => {
                    end = Some(at + 1);
                    break;
                }
                c if c.is_whitespace() && !quoted => {
                    end = Some(at);
                    break;
                }
                c => value.push(c),
            }
        }
        let end = match end {
            Some(end) => end,
            None if quoted => return None,
            None => rest.len(),
        };
        if !quoted && value.is_empty() {
            return None;
        }
        let stop = text.len() - rest.len() + end;
        rest = rest[end..].trim_start();
        params.push(Param {
            key,
            value,
            text: &text[start..stop],
        });
    }
    Some(params)
}

/// libpq's keepalive parameters in the URL: every connection of the relay takes its
/// keepalives and user timeout from `--peer-timeout` instead (src/liveness.rs), both ends.
fn warn_once_keepalive_ignored(key: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            parameter = key,
            "{}",
            advice::warning(
                "the database URL's keepalive parameters are ignored: the relay sets TCP \
                 keepalives and the user timeout of every connection from --peer-timeout \
                 (OUTBOX_PEER_TIMEOUT)",
                Warning::KeepaliveIgnored
            )
        );
    }
}

/// One server the URL names: where a connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// A TCP name or address, or a Unix socket directory.
    pub host: Host,
    pub port: u16,
}

impl Server {
    /// The host as text: a name, an address, or a socket directory.
    pub fn host_text(&self) -> String {
        match &self.host {
            Host::Tcp(host) => host.clone(),
            Host::Unix(dir) => dir.display().to_string(),
        }
    }
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.host {
            Host::Tcp(host) if host.contains(':') => write!(f, "[{host}]:{}", self.port),
            Host::Tcp(host) => write!(f, "{host}:{}", self.port),
            Host::Unix(dir) => write!(f, "{}:{}", dir.display(), self.port),
        }
    }
}

/// The servers the URL names, in its order (libpq's multi-host form,
/// `postgres://h1:5432,h2:5432/db`: a port for each host, or one for all).
pub fn servers(url: &str) -> Result<Vec<Server>, RelayError> {
    let (rest, _) = split_tls(url)?;
    let config = parse_driver_url(&rest)?;
    let hosts = match config.get_hosts() {
        [] => vec![Host::Tcp("localhost".to_string())],
        hosts => hosts.to_vec(),
    };
    let ports = config.get_ports();
    let port = |i: usize| match ports {
        [] => 5432,
        [one] => *one,
        many => many.get(i).copied().unwrap_or(5432),
    };
    Ok(hosts
        .into_iter()
        .enumerate()
        .map(|(i, host)| Server {
            host,
            port: port(i),
        })
        .collect())
}

/// The server that is the primary: the URL's only one, or else the first that answers and
/// is not in recovery. Both of a session's connections, ordinary and replication, go to it:
/// a standby can neither stream the slot nor take writes.
///
/// The primary found last for this URL is asked first, alone, for [`PRIMARY_HEAD_START`]:
/// in the common case that is one connection. If it has not said "primary" by then (it is a
/// standby now, it refused, or it is gone and silent) every other host is asked at once, and
/// the first to answer "primary" wins: a vanished old primary costs the head start, not a
/// connect timeout per host and per connection. Two hosts that both say "primary" (a split
/// brain an HA manager must not leave behind) are not told apart here: the first to answer is
/// taken.
pub async fn primary(url: &str) -> Result<Server, RelayError> {
    let mut servers = servers(url)?;
    if let [only] = servers.as_slice() {
        // A VIP or DNS name: it is the primary by the operator's word.
        return Ok(only.clone());
    }
    first_to_ask(&mut servers, last_primary(url).as_ref());
    let ask = |server: Server| async move {
        let asked = tokio::time::timeout(CONNECT_TIMEOUT, is_primary(url, &server)).await;
        let answer = asked.unwrap_or(Err(RelayError::ConnectTimeout {
            endpoint: Endpoint::PostgreSql,
            seconds: CONNECT_TIMEOUT.as_secs(),
        }));
        (server, answer)
    };
    let mut others = servers[1..].to_vec();
    let mut asking = futures_util::stream::FuturesUnordered::new();
    asking.push(ask(servers[0].clone()));
    let head_start = tokio::time::sleep(PRIMARY_HEAD_START);
    tokio::pin!(head_start);
    let mut last_error = None;
    loop {
        let answered = tokio::select! {
            answered = asking.next(), if !asking.is_empty() => answered,
            () = &mut head_start, if !others.is_empty() => None,
        };
        match answered {
            Some((server, Ok(true))) => {
                remember_primary(url, &server);
                return Ok(server);
            }
            Some((server, Ok(false))) => {
                tracing::debug!(%server, "a standby (in recovery): asking the other hosts");
            }
            Some((_, Err(e))) => last_error = Some(e),
            None => {}
        }
        // The first host did not make it (or its head start ran out): ask all the others.
        asking.extend(others.drain(..).map(ask));
        if asking.is_empty() {
            break;
        }
    }
    Err(RelayError::NoPrimary {
        hosts: servers.iter().map(Server::to_string).collect(),
        last_error: last_error.map(|e| crate::error::chain(&e)),
    })
}

/// How long the primary found last is asked alone before the other hosts are asked too: far
/// above a healthy server's answer (a connection and one query), small next to a failover.
pub const PRIMARY_HEAD_START: Duration = Duration::from_millis(500);

/// Moves `last` (the primary found last) to the front, the others in the URL's order.
fn first_to_ask(servers: &mut [Server], last: Option<&Server>) {
    let at = last.and_then(|last| servers.iter().position(|server| server == last));
    if let Some(at) = at {
        servers[..=at].rotate_right(1);
    }
}

/// The primary found last for each URL (a process has one or two).
static LAST_PRIMARY: std::sync::Mutex<Vec<(String, Server)>> = std::sync::Mutex::new(Vec::new());

fn last_primary(url: &str) -> Option<Server> {
    let found = LAST_PRIMARY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    found.iter().find(|(u, _)| u == url).map(|(_, s)| s.clone())
}

fn remember_primary(url: &str, server: &Server) {
    let mut found = LAST_PRIMARY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match found.iter_mut().find(|(u, _)| u == url) {
        Some((_, last)) => *last = server.clone(),
        None => found.push((url.to_string(), server.clone())),
    }
}

async fn is_primary(url: &str, server: &Server) -> Result<bool, RelayError> {
    let client = connect_to(url, server).await?;
    let row = client.query_one("SELECT pg_is_in_recovery()", &[]).await?;
    Ok(!row.get::<_, bool>(0))
}

/// The server's version as a number (`server_version_num`: 170004 for 17.4).
pub async fn server_version_num(client: &Client) -> Result<i32, RelayError> {
    let row = client
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await?;
    Ok(row.get(0))
}

/// Opens an ordinary connection to the primary ([`primary`]); its driver task ends with
/// the connection.
pub async fn connect(url: &str) -> Result<Client, RelayError> {
    let server = primary(url).await?;
    connect_with(url, &server, None).await
}

/// Opens an ordinary connection to `server`, one of the URL's (a standby too).
pub async fn connect_to(url: &str, server: &Server) -> Result<Client, RelayError> {
    connect_with(url, server, None).await
}

/// What a notification connection's driver hands over: each `NOTIFY` received, then the
/// error that ended the connection (the channel closes when it ends without one).
pub type Notifications = mpsc::Receiver<Result<Notification, tokio_postgres::Error>>;

/// [`connect`], for a connection that LISTENs: the same TLS and timeouts, and the
/// notifications its driver receives.
pub async fn connect_for_notifications(url: &str) -> Result<(Client, Notifications), RelayError> {
    // Notifications are wake-ups: a few in hand are plenty while the listener catches up.
    let (notifications, received) = mpsc::channel(64);
    let server = primary(url).await?;
    let client = connect_with(url, &server, Some(notifications)).await?;
    Ok((client, received))
}

/// [`connect_to`], handing over what the connection receives and the error that ends it,
/// like [`connect_for_notifications`]: for a connection kept open to learn why `server`
/// closes it (a shutdown).
pub async fn connect_to_for_notifications(
    url: &str,
    server: &Server,
) -> Result<(Client, Notifications), RelayError> {
    let (notifications, received) = mpsc::channel(64);
    let client = connect_with(url, server, Some(notifications)).await?;
    Ok((client, received))
}

async fn connect_with(
    url: &str,
    server: &Server,
    notifications: Option<NotificationSender>,
) -> Result<Client, RelayError> {
    let (rest, tls) = split_tls(url)?;
    let mut config = parse_driver_url(&rest)?;
    config.application_name(APPLICATION_NAME);
    // The relay's settings first: options the URL sets itself come after them and win.
    let settings = crate::liveness::policy().session_settings();
    let options = match config.get_options() {
        Some(own) => format!("{settings} {own}"),
        None => settings,
    };
    config.options(&options);
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    // connect_timeout bounds the TCP connect only: a server (or a network) that accepts and
    // then goes silent would hold the startup handshake forever.
    tokio::time::timeout(CONNECT_TIMEOUT, open(config, server, &tls, notifications))
        .await
        .map_err(|_| RelayError::ConnectTimeout {
            endpoint: Endpoint::PostgreSql,
            seconds: CONNECT_TIMEOUT.as_secs(),
        })?
}

type NotificationSender = mpsc::Sender<Result<Notification, tokio_postgres::Error>>;

/// The connection to `server`: the stream is opened here (not by tokio-postgres, which would
/// try every host of the URL), with TLS as `tls` says, then handed to the driver.
async fn open(
    mut config: Config,
    server: &Server,
    tls: &TlsConfig,
    notifications: Option<NotificationSender>,
) -> Result<Client, RelayError> {
    let port = server.port;
    let unreachable = |source| RelayError::DatabaseConnect {
        host: server.host_text(),
        port,
        source,
    };
    // The stream already is what sslmode asked for: tokio-postgres must not negotiate again.
    config.ssl_mode(DriverSslMode::Disable);
    let host = match &server.host {
        Host::Unix(dir) => {
            // libpq ignores sslmode on Unix sockets, and so does the relay.
            let socket = dir.join(format!(".s.PGSQL.{port}"));
            let stream = tokio::net::UnixStream::connect(&socket)
                .await
                .map_err(unreachable)?;
            let (client, connection) = config.connect_raw(stream, NoTls).await?;
            spawn_driver(connection, notifications);
            return Ok(client);
        }
        Host::Tcp(host) => host.clone(),
    };
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(unreachable)?;
    let _ = tcp.set_nodelay(true);
    crate::liveness::policy()
        .peer_timeout
        .apply(&tcp)
        .map_err(unreachable)?;
    if tls.mode == SslMode::Disable {
        warn_once_if_exposed(&server.host, port, tls.mode, TlsOutcome::Plain);
        let (client, connection) = config.connect_raw(tcp, NoTls).await?;
        spawn_driver(connection, notifications);
        return Ok(client);
    }
    let stream = maybe_upgrade_to_tls(tcp, tls, &host)
        .await
        .map_err(|e| RelayError::pg_tls(e, tls.ca_pem_path.is_some()))?;
    let outcome = match (stream.is_tls(), tls.mode) {
        (false, _) => TlsOutcome::Plain,
        (true, SslMode::VerifyFull) => TlsOutcome::Verified,
        (true, SslMode::VerifyCa) => TlsOutcome::ChainVerified,
        (true, _) => TlsOutcome::Unverified,
    };
    warn_once_if_exposed(&Host::Tcp(host), port, tls.mode, outcome);
    let (client, connection) = config.connect_raw(stream, NoTls).await?;
    spawn_driver(connection, notifications);
    Ok(client)
}

/// What protects a connection to PostgreSQL once it is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsOutcome {
    /// No TLS: `sslmode=disable`, or `prefer` (libpq's default) with a server that offered
    /// none.
    Plain,
    /// TLS with a certificate nobody checked (`prefer`, `require` without `sslrootcert`):
    /// encrypted, but to whoever answered.
    Unverified,
    /// The certificate chain is checked, not the name (`verify-ca`).
    ChainVerified,
    /// Chain and host name checked (`verify-full`).
    Verified,
}

/// The warning for a connection to `host` that `mode` left `outcome`, or `None`: nothing
/// for a Unix socket or a loopback address (no network to cross) nor for a verified
/// certificate. The default, `prefer`, falls back to plaintext without a word, so the
/// relay says it once (see [`warn_once_if_exposed`]).
pub fn tls_warning(host: &Host, port: u16, mode: SslMode, outcome: TlsOutcome) -> Option<String> {
    let Host::Tcp(name) = host else {
        return None;
    };
    if is_loopback(name) {
        return None;
    }
    let name_of_mode = match mode {
        SslMode::Disable => "disable",
        SslMode::Prefer => "prefer",
        SslMode::Require => "require",
        SslMode::VerifyCa => "verify-ca",
        SslMode::VerifyFull => "verify-full",
    };
    let problem = match (outcome, mode) {
        (TlsOutcome::Plain, SslMode::Prefer) => "is not encrypted: the server offered no TLS \
             and sslmode=prefer (libpq's default, used when the URL sets none) fell back to \
             plaintext, so the network sees every outbox row"
            .to_string(),
        (TlsOutcome::Plain, _) => format!(
            "is not encrypted (sslmode={name_of_mode}), so the network sees every outbox row"
        ),
        (TlsOutcome::Unverified, _) => format!(
            "is encrypted but the server's certificate is not verified \
             (sslmode={name_of_mode}), so whoever sits in between can pose as the server"
        ),
        (TlsOutcome::ChainVerified | TlsOutcome::Verified, _) => return None,
    };
    Some(advice::warning(
        &format!("the connection to PostgreSQL at {name}:{port} {problem}"),
        Warning::UnverifiedTls,
    ))
}

/// `localhost` or a loopback address (`127.0.0.0/8`, `::1`, also IPv4-mapped).
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// Logs [`tls_warning`] at WARN, once per process: every connection of a relay goes to the
/// same server with the same URL, and a reconnecting worker must not repeat it.
fn warn_once_if_exposed(host: &Host, port: u16, mode: SslMode, outcome: TlsOutcome) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if let Some(warning) = tls_warning(host, port, mode, outcome) {
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!("{warning}");
        }
    }
}

/// Drives a connection until it ends; with `notifications`, hands over what it receives.
fn spawn_driver<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    notifications: Option<NotificationSender>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let Some(notifications) = notifications else {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "database connection ended");
            }
            return;
        };
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            let handed = match message {
                Ok(AsyncMessage::Notification(notification)) => {
                    notifications.send(Ok(notification)).await
                }
                Ok(AsyncMessage::Notice(notice)) => {
                    tracing::debug!(notice = %notice.message(), "notice on the notification connection");
                    Ok(())
                }
                Ok(_) => Ok(()),
                Err(e) => notifications.send(Err(e)).await,
            };
            if handed.is_err() {
                // Nobody listens any more: the connection goes with the driver.
                return;
            }
        }
    });
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
    let peer_timeout = crate::liveness::policy().peer_timeout;
    let options = format!(
        "{PINNED_SESSION_SETTINGS} {}",
        peer_timeout.server_settings()
    );
    Ok(
        ReplicationConfig::new(host, user, password, database, slot, publication)
            .with_port(port)
            .with_tls(tls)
            .with_options(options)
            .with_application_name(APPLICATION_NAME)
            .with_tcp_keepalive(peer_timeout.tcp_keepalive()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_primary_found_last_is_asked_first_and_the_rest_keep_the_urls_order() {
        let url = "postgres://a:5432,b:5433,c:5434/app";
        let mut order = servers(url).expect("servers");
        let names = |order: &[Server]| order.iter().map(Server::to_string).collect::<Vec<_>>();
        first_to_ask(&mut order, None);
        assert_eq!(names(&order), ["a:5432", "b:5433", "c:5434"]);
        let c = order[2].clone();
        first_to_ask(&mut order, Some(&c));
        assert_eq!(names(&order), ["c:5434", "a:5432", "b:5433"]);
        let gone = Server {
            host: Host::Tcp("d".into()),
            port: 5432,
        };
        first_to_ask(&mut order, Some(&gone));
        assert_eq!(
            names(&order),
            ["c:5434", "a:5432", "b:5433"],
            "not in the URL: no change"
        );
    }

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
        assert!(options.contains("-c tcp_user_timeout="), "{options}");
        assert!(!options.contains("statement_timeout"), "{options}");
        assert!(c.tcp_keepalive.is_some());
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
