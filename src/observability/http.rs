//! The HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (the process answers) and
//! `/readyz` (the verdict of [`Health::readiness`]), served with axum on hyper, GET and
//! HEAD, one request per connection; and [`http_get`], the small client `status` asks a
//! running relay's `/readyz` with.
//!
//! The shape is "bind a listener, then [`serve`] it until a token is cancelled", so tests
//! bind port 0 and pass the listener in; [`serve_on`] binds first and keeps retrying a port
//! it cannot bind. At most [`MAX_CONNECTIONS`] connections are served at once: past that,
//! new ones wait in the listen backlog until one closes, so a flood of scrapers (or of idle
//! sockets) costs a bounded amount of memory. The endpoints only read: they must never
//! change the relay's state, and nothing here may stop the relay.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::health::Health;
use super::metrics::{recorder, register_mode, set_build_info, update_process_metrics};

/// Connections served at once; the next one is accepted when one of them closes.
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// Longest request head the server reads (hyper's smallest buffer limit); anything larger
/// is answered 431.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send its request head.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a listener that could not bind retries.
const BIND_RETRY: Duration = Duration::from_secs(5);
/// How often histogram samples are folded into their buckets between scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

const TEXT: &str = "text/plain; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the HTTP endpoints read.
#[derive(Clone)]
pub(crate) struct Endpoints {
    pub metrics: PrometheusHandle,
    pub health: Health,
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until `shutdown`. A port that
/// cannot be bound is not fatal: delivering messages matters more than reporting on them,
/// so the relay warns and keeps trying to bind every few seconds.
pub(crate) async fn serve_on(addr: SocketAddr, endpoints: Endpoints, shutdown: CancellationToken) {
    let mut warned = false;
    let listener = loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => break listener,
            Err(e) => {
                if !warned {
                    tracing::warn!(
                        %addr,
                        error = %e,
                        "cannot serve /metrics, /healthz and /readyz; retrying every 5 s \
                         (set --metrics-addr to another address, or off)"
                    );
                    warned = true;
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(BIND_RETRY) => {}
                }
            }
        }
    };
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    serve(listener, endpoints, shutdown).await;
}

/// Serves the endpoints on a bound listener until `shutdown`: then it stops accepting,
/// and the exchanges in progress finish on their own (each is one bounded request).
pub(crate) async fn serve(
    listener: TcpListener,
    endpoints: Endpoints,
    shutdown: CancellationToken,
) {
    let upkeep = {
        let handle = endpoints.metrics.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(UPKEEP_INTERVAL) => handle.run_upkeep(),
                }
            }
        })
    };
    let service = TowerToHyperService::new(router(endpoints));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(REQUEST_TIMEOUT)
        .max_buf_size(MAX_REQUEST)
        .keep_alive(false);
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        // A permit before the accept: past the limit, connections wait in the backlog.
        let permit = tokio::select! {
            () = shutdown.cancelled() => break,
            permit = Arc::clone(&permits).acquire_owned() => permit,
        };
        // The semaphore is never closed.
        let Ok(permit) = permit else { break };
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                let connection = http.serve_connection(TokioIo::new(stream), service.clone());
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::debug!(error = %e, "metrics connection failed");
                    }
                    drop(permit);
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: pause instead of spinning.
                tracing::warn!(error = %e, "cannot accept a metrics connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    upkeep.abort();
}

/// The routes. `get` answers HEAD too (same head, no body); any other method is 405.
fn router(endpoints: Endpoints) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(axum::middleware::map_response(no_store))
        .with_state(endpoints)
}

async fn metrics(State(endpoints): State<Endpoints>) -> Response {
    endpoints.health.update_scrape_gauges();
    update_process_metrics();
    endpoints.metrics.run_upkeep();
    text(StatusCode::OK, PROMETHEUS_TEXT, endpoints.metrics.render())
}

async fn healthz() -> Response {
    text(StatusCode::OK, TEXT, "ok\n".into())
}

async fn readyz(State(endpoints): State<Endpoints>) -> Response {
    match endpoints.health.readiness() {
        Ok(()) => text(StatusCode::OK, TEXT, "ready\n".into()),
        Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("{reason}\n")),
    }
}

/// Unknown paths: 404 for GET and HEAD, 405 for other methods (as on the known paths).
async fn not_found(method: Method) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return method_not_allowed().await;
    }
    let body = "not found: try /metrics, /healthz or /readyz\n";
    text(StatusCode::NOT_FOUND, TEXT, body.into())
}

async fn method_not_allowed() -> Response {
    let mut response = text(
        StatusCode::METHOD_NOT_ALLOWED,
        TEXT,
        "only GET and HEAD\n".into(),
    );
    let allow = HeaderValue::from_static("GET, HEAD");
    response.headers_mut().insert(header::ALLOW, allow);
    response
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Every answer is computed at the time of the request: no cache may keep it.
async fn no_store(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Installs the recorder and serves `/metrics`, `/healthz` and `/readyz` on `addr` (unless
/// `None`) until `shutdown`, in either mode (`mode`: the command, `run` or `poll`, for
/// [`super::metrics::BUILD_INFO`]). Returns the health behind `/readyz`.
pub(crate) fn start_endpoints(
    addr: Option<SocketAddr>,
    mode: &'static str,
    shutdown: &CancellationToken,
) -> Health {
    let health = Health::new();
    let metrics = recorder();
    register_mode(mode);
    set_build_info(mode);
    if let Some(addr) = addr {
        let endpoints = Endpoints {
            metrics,
            health: health.clone(),
        };
        tokio::spawn(serve_on(addr, endpoints, shutdown.clone()));
    }
    health
}

/// Fetches `path` from a running relay's endpoints (for `status`): the status code and body.
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&response).into_owned())
    };
    let response = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in 5 s"))??;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "not HTTP"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    async fn get(addr: SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        response
    }

    #[tokio::test]
    async fn endpoints_answer_over_http() {
        let health = Health::new();
        let (addr, shutdown, server) = spawn_server(health.clone()).await;

        let response = get(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(response.ends_with("\r\n\r\nok\n"), "{response}");

        let response = get(addr, "GET /readyz HTTP/1.1\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 503 "), "{response}");
        assert!(response.ends_with("\r\n\r\nstarting\n"), "{response}");
        health.set_ready();
        let (status, body) = http_get(addr, "/readyz").await.expect("get");
        assert_eq!((status, body.as_str()), (200, "ready\n"));

        let response = get(addr, "GET /metrics HTTP/1.1\r\n\r\n").await;
        assert!(response.contains("text/plain; version=0.0.4"), "{response}");

        let response = get(addr, "POST /readyz HTTP/1.1\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 405 "), "{response}");
        let response = get(addr, "GET /nothing HTTP/1.1\r\n\r\n").await;
        assert!(response.starts_with("HTTP/1.1 404 "), "{response}");
        let response = get(addr, "HEAD /healthz HTTP/1.1\r\n\r\n").await;
        assert!(
            response.ends_with("\r\n\r\n"),
            "HEAD has no body: {response}"
        );

        shutdown.cancel();
        server.await.expect("server stops");
    }

    /// Serves fresh endpoints on a port of its own.
    async fn spawn_server(
        health: Health,
    ) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let endpoints = Endpoints {
            metrics: PrometheusBuilder::new().build_recorder().handle(),
            health,
        };
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, endpoints, shutdown.clone()));
        (addr, shutdown, server)
    }

    #[tokio::test]
    async fn errors_keep_their_bodies_and_headers() {
        let (addr, shutdown, server) = spawn_server(Health::new()).await;
        let response = get(addr, "DELETE /nothing HTTP/1.1\r\n\r\n")
            .await
            .to_lowercase();
        assert!(response.starts_with("http/1.1 405 "), "{response}");
        assert!(response.contains("\r\nallow: get, head\r\n"), "{response}");
        assert!(
            response.ends_with("\r\n\r\nonly get and head\n"),
            "{response}"
        );
        let response = get(addr, "GET /nothing?x=1 HTTP/1.1\r\n\r\n").await;
        assert!(response.ends_with("\r\n\r\nnot found: try /metrics, /healthz or /readyz\n"));
        let response = get(addr, "HEAD /readyz HTTP/1.1\r\n\r\n")
            .await
            .to_lowercase();
        assert!(response.starts_with("http/1.1 503 "), "{response}");
        assert!(response.contains("\r\ncontent-length: 9\r\n"), "{response}");
        assert!(
            response.contains("\r\ncache-control: no-store\r\n"),
            "{response}"
        );
        assert!(response.contains("\r\ncontent-type: text/plain; charset=utf-8\r\n"));
        assert!(
            response.ends_with("\r\n\r\n"),
            "HEAD has no body: {response}"
        );
        shutdown.cancel();
        server.await.expect("server stops");
    }

    #[tokio::test]
    async fn a_connection_past_the_limit_waits_for_a_free_one() {
        let (addr, shutdown, server) = spawn_server(Health::new()).await;
        let mut held = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            held.push(TcpStream::connect(addr).await.expect("connect"));
        }
        let mut waiting = TcpStream::connect(addr).await.expect("connect");
        waiting
            .write_all(b"GET /healthz HTTP/1.1\r\n\r\n")
            .await
            .expect("write");
        let mut response = String::new();
        let early = tokio::time::timeout(
            Duration::from_millis(500),
            waiting.read_to_string(&mut response),
        )
        .await;
        assert!(early.is_err(), "answered past the limit: {response}");
        // One of the 64 goes: the waiting connection is accepted and answered.
        drop(held.pop());
        tokio::time::timeout(
            Duration::from_secs(10),
            waiting.read_to_string(&mut response),
        )
        .await
        .expect("answered once a connection closed")
        .expect("read");
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        shutdown.cancel();
        server.await.expect("server stops");
    }
}
