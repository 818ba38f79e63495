//! Opening an AMQP connection the way every connection of the relay and the inbox is opened:
//! its socket carries the peer timeout's keepalives but no user timeout (a broker that blocks
//! a publisher stops reading its socket), and the AMQP heartbeat, derived from the peer timeout
//! ([`crate::liveness`]) unless the URL asks for one, notices a dead broker.
//!
//! lapin opens its socket itself; its `Connection::connector` hands the opening to us. The
//! socket options go on the plain TCP stream, before the TLS handshake of `amqps://`.

use lapin::tcp::{AsyncTcpStream, OwnedTLSConfig};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties};

/// Opens a connection to the broker at `url`, with the heartbeat of the process's peer
/// timeout unless the URL sets `heartbeat=`.
pub async fn open_connection(
    url: &str,
    properties: ConnectionProperties,
) -> Result<Connection, lapin::Error> {
    let mut uri: AMQPUri = url.parse().map_err(|problem: String| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, problem)
    })?;
    let peer_timeout = crate::liveness::policy().peer_timeout;
    if uri.query.heartbeat.is_none() {
        uri.query.heartbeat = Some(peer_timeout.amqp_heartbeat());
    }
    let runtime = lapin::runtime::default_runtime()?;
    Connection::connector(
        uri,
        runtime,
        async move |uri: AMQPUri, runtime| {
            let host = uri.authority.host.clone();
            let addresses: Vec<_> = tokio::net::lookup_host((host.as_str(), uri.authority.port))
                .await?
                .collect();
            let stream = AsyncTcpStream::connect(&runtime, addresses).await?;
            if let AsyncTcpStream::Plain(plain) = &stream {
                peer_timeout.apply_keepalives(plain.get_ref())?;
            }
            Ok(match uri.scheme {
                AMQPScheme::AMQP => stream,
                AMQPScheme::AMQPS => {
                    stream
                        .into_tls(&host, OwnedTLSConfig::default().as_ref())
                        .await?
                }
            })
        },
        properties,
    )
    .await
}
