//! Error types for pgwire-replication.
//!
//! All errors in this crate are represented by [`PgWireError`], which covers:
//! - I/O errors (network, file system)
//! - Protocol errors (malformed messages, unexpected responses)
//! - Server errors (PostgreSQL error responses)
//! - Authentication errors (wrong password, unsupported method)
//! - TLS errors (handshake failure, certificate issues)
//! - Task errors (worker panics, unexpected termination)
//! - Message-size errors (a frame larger than the configured limit)

use std::sync::Arc;
use thiserror::Error;

/// A PostgreSQL ErrorResponse: the text the crate renders and the SQLSTATE, so that a caller
/// classifies the error by its code, never by its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    /// "message (SQLSTATE xxxxx)", as `parse_error_response` renders it.
    pub message: String,
    /// The SQLSTATE (the `C` field), when the server sent one.
    pub code: Option<String>,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What kind of TLS failure a [`TlsError`] is, so that a caller classifies it by type, never
/// by its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsErrorKind {
    /// The server answered the SSLRequest with 'N': it does not accept TLS.
    Refused,
    /// The CA file (`TlsConfig::ca_pem_path`) cannot be read or holds no usable certificate.
    CaFile,
    /// The TLS configuration cannot work: half of a client certificate pair, verify-full on
    /// an IP address, a Unix socket, an invalid SNI name, TLS support not built in.
    Config,
    /// The server's certificate is not signed by a trusted CA, or its signature is bad.
    UnknownIssuer,
    /// The server's certificate does not name the host.
    NameMismatch,
    /// Another certificate problem: expired, revoked, or one the peer refused.
    Certificate,
    /// Anything else during the handshake (a reset, a corrupt message): it may pass.
    Handshake,
}

impl TlsErrorKind {
    /// The kind of a failed handshake, from the error tokio-rustls returns: rustls's own error
    /// inside it, by its variant.
    #[cfg(feature = "tls-rustls")]
    pub fn of_handshake(error: &std::io::Error) -> TlsErrorKind {
        use rustls::{AlertDescription as Alert, CertificateError, Error as Rustls};
        let Some(rustls) = error.get_ref().and_then(|e| e.downcast_ref::<Rustls>()) else {
            return TlsErrorKind::Handshake;
        };
        match rustls {
            Rustls::InvalidCertificate(CertificateError::UnknownIssuer)
            | Rustls::InvalidCertificate(CertificateError::BadSignature) => {
                TlsErrorKind::UnknownIssuer
            }
            Rustls::InvalidCertificate(CertificateError::NotValidForName)
            | Rustls::InvalidCertificate(CertificateError::NotValidForNameContext { .. }) => {
                TlsErrorKind::NameMismatch
            }
            Rustls::InvalidCertificate(_)
            | Rustls::InvalidCertRevocationList(_)
            | Rustls::NoCertificatesPresented
            | Rustls::AlertReceived(
                Alert::BadCertificate
                | Alert::UnsupportedCertificate
                | Alert::CertificateRevoked
                | Alert::CertificateExpired
                | Alert::CertificateUnknown
                | Alert::UnknownCA
                | Alert::CertificateRequired
                | Alert::AccessDenied,
            ) => TlsErrorKind::Certificate,
            _ => TlsErrorKind::Handshake,
        }
    }
}

/// A failed TLS setup: its kind, and the text that explains it to a person.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct TlsError {
    pub kind: TlsErrorKind,
    pub message: String,
}

impl TlsError {
    pub fn new(kind: TlsErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// Error type for all pgwire-replication operations.
///
/// This enum is `#[non_exhaustive]`: match on it with a `_` arm so that new
/// variants can be added without a breaking release.
#[derive(Debug, Error, Clone)]
#[non_exhaustive]
pub enum PgWireError {
    /// I/O error (network, file system).
    ///
    /// Wraps `std::io::Error` in an `Arc` to preserve `ErrorKind` while
    /// keeping `PgWireError` `Clone`. Use `.kind()` via `Arc`'s `Deref`.
    #[error("io error: {0}")]
    Io(Arc<std::io::Error>),

    /// Protocol error - malformed message or unexpected response.
    #[error("protocol error: {0}")]
    Protocol(String),

    /// Server error - PostgreSQL returned an error response: its text (which ends in
    /// "(SQLSTATE xxxxx)") and its SQLSTATE as a field.
    #[error("server error: {0}")]
    Server(ServerError),

    /// Authentication error - wrong credentials or unsupported method.
    #[error("authentication error: {0}")]
    Auth(String),

    /// TLS error - handshake failure, certificate validation, etc., with its kind.
    #[error("tls error: {0}")]
    Tls(TlsError),

    /// Task error - worker panicked or terminated unexpectedly.
    #[error("task error: {0}")]
    Task(String),

    /// Internal error - bug in the library.
    #[error("internal error: {0}")]
    Internal(String),

    /// A backend message announced a payload larger than the configured
    /// limit, so it was refused before any of it was buffered.
    ///
    /// Distinct from [`Protocol`](Self::Protocol) so a caller can tell a
    /// legitimate frame over its own
    /// [`max_message_size`](crate::config::ReplicationConfig::max_message_size)
    /// apart from malformed framing, and report which bound was exceeded
    /// without parsing the message text. Non-transient: the refused payload
    /// is never consumed, so the connection cannot be resumed.
    #[error("backend message too large: {payload_bytes} bytes (max {limit_bytes})")]
    MessageTooLarge {
        /// Payload size the server announced, in bytes.
        payload_bytes: usize,
        /// Limit that refused it, in bytes.
        limit_bytes: usize,
    },
}

impl PgWireError {
    /// Returns `true` if this is an I/O error.
    #[inline]
    pub fn is_io(&self) -> bool {
        matches!(self, PgWireError::Io(_))
    }

    /// Returns `true` if this is a server error.
    #[inline]
    pub fn is_server(&self) -> bool {
        matches!(self, PgWireError::Server(_))
    }

    /// Returns `true` if this is an authentication error.
    #[inline]
    pub fn is_auth(&self) -> bool {
        matches!(self, PgWireError::Auth(_))
    }

    /// Returns `true` if this is a TLS error.
    #[inline]
    pub fn is_tls(&self) -> bool {
        matches!(self, PgWireError::Tls(_))
    }

    /// Returns `true` if this is a message-size error.
    #[inline]
    pub fn is_message_too_large(&self) -> bool {
        matches!(self, PgWireError::MessageTooLarge { .. })
    }

    /// Returns `true` if this error is likely transient and retryable.
    ///
    /// Transient errors include I/O errors and task errors. Non-transient
    /// errors (auth, server, protocol) typically require configuration changes.
    pub fn is_transient(&self) -> bool {
        matches!(self, PgWireError::Io(_) | PgWireError::Task(_))
    }
}

impl From<std::io::Error> for PgWireError {
    fn from(err: std::io::Error) -> Self {
        PgWireError::Io(Arc::new(err))
    }
}

/// Result type alias for pgwire-replication operations.
pub type Result<T> = std::result::Result<T, PgWireError>;
