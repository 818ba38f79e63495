//! Ordinary PostgreSQL connections, for the relay and the inbox alike: the URL, TLS, connect
//! timeouts and the peer timeout, and finding the primary among the URL's hosts.
//!
//! TLS follows libpq's `sslmode` and `sslrootcert` in the URL. tokio-postgres knows neither
//! `verify-ca`/`verify-full` nor `sslrootcert`, so the two are taken out of the URL here
//! ([`split_tls`], which the relay's replication connection reads too), and the connection is
//! upgraded by the same code that upgrades the replication connection (pgwire-replication's
//! rustls handshake), then handed to tokio-postgres as an already-encrypted stream: one TLS
//! policy, one place.
//!
//! It owns how a process reaches PostgreSQL, never what it runs there. Every ordinary
//! connection comes from here ([`connect`], [`connect_for_notifications`] for polling's LISTEN):
//! none may bypass the TLS policy. Its errors are [`PgError`]: the relay turns each into the
//! `RelayError` of the same text, which adds what to do about it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

// Values only: libpq decodes `%XX` in a URI's parameters but, unlike a form, not `+`.
use futures_util::StreamExt;
use percent_encoding::percent_decode_str;
use pgwire_replication::tls::rustls::maybe_upgrade_to_tls;
use pgwire_replication::{SslMode, TlsConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_postgres::config::{Host, SslMode as DriverSslMode};
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Notification};

/// A database URL that cannot work. The relay keeps it as a configuration problem of its own
/// (the advice knows what to do about each).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    /// `problem` names only the kind of problem: the URL may hold a password.
    #[error(
        "The database URL is not valid ({problem}). Expected \
         postgres://user:password@host:port/database"
    )]
    DatabaseUrl { problem: String },

    #[error(
        "The database URL has target_session_attrs={attrs}, but the relay needs the primary \
         (it holds the slot there, and polling writes)"
    )]
    SessionAttrs { attrs: String },

    #[error(
        "The database URL has sslmode={mode}, which PostgreSQL does not know. Use disable, \
         prefer, require, verify-ca or verify-full"
    )]
    SslMode { mode: String },
}

/// Why a connection could not be opened, or its URL not read. The texts are the relay's
/// (`RelayError`'s variants of the same names): both binaries say the same.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error(transparent)]
    Url(#[from] UrlProblem),

    #[error("Cannot set up TLS with PostgreSQL ({reason})")]
    Tls {
        /// What kind of failure, by the TLS library's error type.
        kind: pgwire_replication::TlsErrorKind,
        reason: String,
        /// The URL named a CA (`sslrootcert`).
        ca_given: bool,
    },

    #[error("PostgreSQL error")]
    Database(#[from] tokio_postgres::Error),

    #[error(transparent)]
    Unreachable(#[from] Unreachable),

    #[error("Connecting to PostgreSQL took longer than {seconds} s; retrying")]
    ConnectTimeout { seconds: u64 },
}

/// No server of the URL could serve: the relay keeps it as an error of its own (the database
/// is down, whichever of the two).
#[derive(Debug, thiserror::Error)]
pub enum Unreachable {
    #[error("Cannot reach PostgreSQL at {host}:{port}")]
    DatabaseConnect {
        host: String,
        port: u16,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "None of the database URL's hosts ({}) is the primary: each is in recovery or cannot \
         be reached{}",
        hosts.join(", "),
        last_error.as_deref().map(|e| format!(" (last: {e})")).unwrap_or_default()
    )]
    NoPrimary {
        hosts: Vec<String>,
        last_error: Option<String>,
    },
}

impl PgError {
    /// A failed TLS handshake or setup, as its reason.
    fn tls(error: pgwire_replication::PgWireError, ca_given: bool) -> PgError {
        let (kind, reason) = tls_failure(error);
        PgError::Tls {
            kind,
            reason,
            ca_given,
        }
    }
}

/// A failed TLS setup as its kind and its text; an error of another kind (the socket failed
/// during the handshake) as a handshake failure, which may pass.
pub fn tls_failure(
    error: pgwire_replication::PgWireError,
) -> (pgwire_replication::TlsErrorKind, String) {
    match error {
        pgwire_replication::PgWireError::Tls(tls) => (tls.kind, tls.message),
        other => (
            pgwire_replication::TlsErrorKind::Handshake,
            other.to_string(),
        ),
    }
}

/// A warning's text: what is wrong, then what to do (the form of the relay's advice).
fn with_fix(text: &str, fix: &str) -> String {
    format!("{text}. Fix: {fix}")
}

/// What to do about keepalive parameters in the URL.
const KEEPALIVE_FIX: &str = "remove them from the URL and set --peer-timeout";
/// What to do about a connection over the network without a verified certificate.
const UNVERIFIED_TLS_FIX: &str = "add sslmode=verify-full&sslrootcert=<the CA file of the \
     server's certificate> to the database URL (docs/security.md, \"TLS\")";

/// The name an ordinary connection shows in `pg_stat_activity` unless the database URL sets
/// one (`application_name=`, which wins) or the process set its own
/// ([`set_application_name`]).
pub const APPLICATION_NAME: &str = "outbox-relay";

/// The process's name for its connections: the relay's unless the binary set another.
static PROCESS_NAME: std::sync::RwLock<&str> = std::sync::RwLock::new(APPLICATION_NAME);

/// Names every ordinary connection this process opens from now on (outbox-inbox: its own
/// name), where the database URL names none: before the first connection.
pub fn set_application_name(name: &'static str) {
    *PROCESS_NAME
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = name;
}

fn application_name() -> &'static str {
    *PROCESS_NAME
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How long establishing any connection (PostgreSQL, replication, RabbitMQ) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

pub fn parse_url(url: &str) -> Result<Config, PgError> {
    let (rest, _) = split_tls(url)?;
    parse_driver_url(&rest)
}

pub fn parse_driver_url(url: &str) -> Result<Config, PgError> {
    url.parse::<Config>().map_err(|e| {
        // The error's own text names only the kind of problem; its source (left out) may
        // quote part of the URL, and the URL may hold a password.
        PgError::from(UrlProblem::DatabaseUrl {
            problem: url_mistake(url).unwrap_or_else(|| e.to_string()),
        })
    })
}

/// What is wrong with a database URL the driver refused, where it can be told: the scheme,
/// a missing `://`, or a port. Quotes nothing of the URL: a password may hold any of its
/// characters, `/` and `@` included, so no part of it is surely not the password.
fn url_mistake(url: &str) -> Option<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        let looks_like_a_url = ["postgres", "postgresql"]
            .iter()
            .any(|scheme| url.starts_with(scheme) && !url.contains('='));
        return looks_like_a_url.then(|| "no \"://\" after the scheme postgres".to_string());
    };
    // A `://` inside a key=value string is not a scheme's.
    if !scheme
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    {
        return None;
    }
    if !matches!(scheme, "postgres" | "postgresql") {
        return Some("the scheme is not postgres:// or postgresql://".to_string());
    }
    // The hosts follow the last `@` (the user and password come before it).
    let after_login = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    let hosts = after_login.split(['/', '?']).next().unwrap_or_default();
    let bad_port = hosts.split(',').any(|host| {
        // An IPv6 address is in brackets; its port follows them.
        let after_address = host.rsplit_once(']').map_or(host, |(_, rest)| rest);
        after_address
            .rsplit_once(':')
            .is_some_and(|(_, port)| !matches!(port.parse::<u16>(), Ok(port) if port > 0))
    });
    bad_port.then(|| "a port is not a number from 1 to 65535".to_string())
}

/// The URL's `sslmode` and `sslrootcert` as the TLS settings of both connections, and the
/// URL without them (for tokio-postgres). Without `sslmode` the relay behaves like libpq:
/// `prefer` (TLS if the server offers it, unverified; plain otherwise). As in libpq,
/// `require` with a `sslrootcert` verifies the chain like `verify-ca`.
///
/// `target_session_attrs` comes out too: with several hosts the relay always looks for the
/// primary itself ([`primary`]), so `read-write`, `primary` and `any` all mean that, and a
/// value asking for a standby is refused.
pub fn split_tls(url: &str) -> Result<(String, TlsConfig), PgError> {
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
        return Err(UrlProblem::SessionAttrs { attrs }.into());
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
            return Err(UrlProblem::SslMode {
                mode: other.to_string(),
            }
            .into())
        }
    };
    Ok((rest, tls))
}

/// One parameter of libpq's key=value form: its keyword, its value (unquoted, unescaped) and
/// the parameter as written.
pub struct Param<'a> {
    pub key: &'a str,
    pub value: String,
    pub text: &'a str,
}

/// The parameters of a key=value connection string, read the way libpq and tokio-postgres
/// read them: spaces allowed around `=`, a value in single quotes, backslash escapes. Split at
/// spaces instead, `host = db sslmode = require` was refused for an empty sslmode, and in
/// `host= sslmode=x password=p` (the host is `sslmode=x`) the password became the host name.
/// `None` when the text is not of that form.
pub fn key_value_params(text: &str) -> Option<Vec<Param<'_>>> {
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
/// keepalives and user timeout from `--peer-timeout` instead ([`crate::liveness`]), both ends.
fn warn_once_keepalive_ignored(key: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            parameter = key,
            "{}",
            with_fix(
                "the database URL's keepalive parameters are ignored: the relay sets TCP \
                 keepalives and the user timeout of every connection from --peer-timeout \
                 (OUTBOX_PEER_TIMEOUT)",
                KEEPALIVE_FIX
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
pub fn servers(url: &str) -> Result<Vec<Server>, PgError> {
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
pub async fn primary(url: &str) -> Result<Server, PgError> {
    let mut servers = servers(url)?;
    if let [only] = servers.as_slice() {
        // A VIP or DNS name: it is the primary by the operator's word.
        return Ok(only.clone());
    }
    first_to_ask(&mut servers, last_primary(url).as_ref());
    let ask = |server: Server| async move {
        let asked = tokio::time::timeout(CONNECT_TIMEOUT, is_primary(url, &server)).await;
        let answer = asked.unwrap_or(Err(PgError::ConnectTimeout {
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
    Err(PgError::from(Unreachable::NoPrimary {
        hosts: servers.iter().map(Server::to_string).collect(),
        last_error: last_error.map(|e| crate::error::chain(&e)),
    }))
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

async fn is_primary(url: &str, server: &Server) -> Result<bool, PgError> {
    let client = connect_to(url, server).await?;
    let row = client.query_one("SELECT pg_is_in_recovery()", &[]).await?;
    Ok(!row.get::<_, bool>(0))
}

/// Opens an ordinary connection to the primary ([`primary`]); its driver task ends with
/// the connection.
pub async fn connect(url: &str) -> Result<Client, PgError> {
    let server = primary(url).await?;
    connect_with(url, &server, None).await
}

/// Opens an ordinary connection to `server`, one of the URL's (a standby too).
pub async fn connect_to(url: &str, server: &Server) -> Result<Client, PgError> {
    connect_with(url, server, None).await
}

/// What a notification connection's driver hands over: each `NOTIFY` received, then the
/// error that ended the connection (the channel closes when it ends without one).
pub type Notifications = mpsc::Receiver<Result<Notification, tokio_postgres::Error>>;

/// [`connect`], for a connection that LISTENs: the same TLS and timeouts, and the
/// notifications its driver receives.
pub async fn connect_for_notifications(url: &str) -> Result<(Client, Notifications), PgError> {
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
) -> Result<(Client, Notifications), PgError> {
    let (notifications, received) = mpsc::channel(64);
    let client = connect_with(url, server, Some(notifications)).await?;
    Ok((client, received))
}

async fn connect_with(
    url: &str,
    server: &Server,
    notifications: Option<NotificationSender>,
) -> Result<Client, PgError> {
    let (rest, tls) = split_tls(url)?;
    let mut config = parse_driver_url(&rest)?;
    if config.get_application_name().is_none() {
        config.application_name(application_name());
    }
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
        .map_err(|_| PgError::ConnectTimeout {
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
) -> Result<Client, PgError> {
    let port = server.port;
    let unreachable = |source| Unreachable::DatabaseConnect {
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
        .map_err(|e| PgError::tls(e, tls.ca_pem_path.is_some()))?;
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
    Some(with_fix(
        &format!("the connection to PostgreSQL at {name}:{port} {problem}"),
        UNVERIFIED_TLS_FIX,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(url: &str) -> String {
        match parse_driver_url(url) {
            Err(PgError::Url(UrlProblem::DatabaseUrl { problem })) => problem,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn a_bad_database_url_says_what_is_wrong_without_the_password() {
        let cases = [
            ("postgres://u:secret@host:notaport/db", "a port is not"),
            ("postgres://u:secret@host:99999/db", "a port is not"),
            ("postgres://u:secret@a:5432,b:x/db", "a port is not"),
            // A password with a `/` and an `@`: the hosts still follow the last `@`.
            ("postgres://u:se/cr@et@host:x/db", "a port is not"),
            ("mysql://u:secret@host/db", "the scheme is not"),
            ("postgresql//u:secret@host/db", "no \"://\""),
        ];
        for (url, expected) in cases {
            let problem = problem(url);
            assert!(problem.contains(expected), "{url}: {problem}");
            assert!(
                !problem.contains("secret") && !problem.contains("cr"),
                "{url}: {problem}"
            );
        }
        assert!(parse_driver_url("postgres://u:secret@[::1]:5432/db").is_ok());
    }

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
}
