//! The relay's HTTP endpoints as a test reads them: one `GET` over a plain socket, polling
//! until an answer matches, and samples out of Prometheus text. It owns the client side
//! only; it must never share code with the relay's own HTTP server (an oracle that reused
//! the server's parser would agree with its bugs).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// Where an endpoint listens: a port on 127.0.0.1 (`u16`), or an address and port (a relay on
/// a test host, [`super::netns`]).
pub trait Endpoint: Copy {
    fn socket_addr(self) -> SocketAddr;
}

impl Endpoint for u16 {
    fn socket_addr(self) -> SocketAddr {
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, self).into()
    }
}

impl Endpoint for SocketAddr {
    fn socket_addr(self) -> SocketAddr {
        self
    }
}

impl Endpoint for SocketAddrV4 {
    fn socket_addr(self) -> SocketAddr {
        self.into()
    }
}

/// `GET path` at `at` (e.g. the relay's `--metrics-addr`, or just its port on 127.0.0.1):
/// status code and body. `None` if nothing answers within 5 s.
pub async fn http_get(at: impl Endpoint, path: &str) -> Option<(u16, String)> {
    let addr = at.socket_addr();
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        Some(String::from_utf8_lossy(&response).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()??;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// Polls `GET path` every 50 ms until `wanted` holds for the answer (the relay may not
/// listen yet); the last answer either way.
pub async fn wait_http(
    at: impl Endpoint,
    path: &str,
    timeout: Duration,
    wanted: impl Fn(&(u16, String)) -> bool,
) -> Option<(u16, String)> {
    let deadline = Instant::now() + timeout;
    loop {
        let answer = http_get(at, path).await;
        if answer.as_ref().is_some_and(&wanted) || Instant::now() >= deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The body of `/metrics`; panics if it does not answer.
pub async fn metrics(at: impl Endpoint) -> String {
    http_get(at, "/metrics").await.expect("/metrics answers").1
}

/// `/readyz` as (status, body trimmed); panics if it does not answer.
pub async fn readyz(at: impl Endpoint) -> (u16, String) {
    let (status, body) = http_get(at, "/readyz").await.expect("/readyz answers");
    (status, body.trim().to_string())
}

/// Waits until `/readyz` answers 200; false after `timeout`.
pub async fn wait_ready(at: impl Endpoint, timeout: Duration) -> bool {
    let answer = wait_http(at, "/readyz", timeout, |(status, _)| *status == 200).await;
    answer.is_some_and(|(status, _)| status == 200)
}

/// Waits until `/readyz` gives `wanted` (status, body trimmed); the last answer either way,
/// its body trimmed.
pub async fn wait_readyz(
    at: impl Endpoint,
    timeout: Duration,
    wanted: (u16, &str),
) -> Option<(u16, String)> {
    let matches = |(status, body): &(u16, String)| (*status, body.trim()) == wanted;
    let answer = wait_http(at, "/readyz", timeout, matches).await;
    answer.map(|(status, body)| (status, body.trim().to_string()))
}

/// Scrapes until `wanted` holds for the text of `/metrics`; the last scrape either way
/// (panics if `/metrics` never answered).
pub async fn wait_metrics(
    at: impl Endpoint,
    timeout: Duration,
    wanted: impl Fn(&str) -> bool,
) -> String {
    wait_http(at, "/metrics", timeout, |(_, body)| wanted(body))
        .await
        .expect("/metrics answers")
        .1
}

/// A series as Prometheus text names it: `name{label="value",…}`, the labels in the order
/// the exporter writes them; `name` alone without labels.
pub fn series(name: &str, labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return name.to_string();
    }
    let labels: Vec<String> = labels
        .iter()
        .map(|(label, value)| format!("{label}=\"{value}\""))
        .collect();
    format!("{name}{{{}}}", labels.join(","))
}

/// The value of one sample `series` (`name` or `name{labels}`) in Prometheus text, if
/// present.
pub fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The sum of every sample of `name` (all label sets), if any.
pub fn metric_sum(metrics: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            if !(rest.starts_with(' ') || rest.starts_with('{')) {
                return None;
            }
            rest.rsplit(' ').next()?.trim().parse().ok()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_named_as_the_exporter_writes_it() {
        assert_eq!(series("up", &[]), "up");
        assert_eq!(
            series("build_info", &[("version", "0.1.0"), ("mode", "wal")]),
            r#"build_info{version="0.1.0",mode="wal"}"#
        );
        let page = "# TYPE x counter\nx{cause=\"nack\"} 3\nx{cause=\"broker\"} 1\n";
        assert_eq!(
            metric_value(page, &series("x", &[("cause", "nack")])),
            Some(3.0)
        );
    }
}
