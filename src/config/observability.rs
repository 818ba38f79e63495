//! The HTTP endpoints, the slot poller's interval and the cleanup job.

use std::time::Duration;

use clap::Args;

use outbox_common::duration::parse_duration;

/// The HTTP endpoints, in both modes (src/observability/http.rs, docs/metrics.md).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Observability")]
pub struct EndpointArgs {
    /// Address for /metrics, /healthz and /readyz (IP:port; in a container 0.0.0.0:9187 so
    /// probes reach it). Empty or `off` turns the endpoints off.
    #[arg(long, env = "OUTBOX_METRICS_ADDR", default_value = DEFAULT_METRICS_ADDR, value_parser = parse_metrics_addr)]
    pub metrics_addr: MetricsAddr,
}

/// `run`'s HTTP endpoints and slot poller (src/observability/http.rs, src/catalog/slot.rs,
/// docs/metrics.md).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Observability")]
pub struct ObservabilityArgs {
    #[command(flatten)]
    pub endpoints: EndpointArgs,

    /// How often the slot's lag, retained WAL and wal_status are read from
    /// pg_replication_slots (e.g. 5s; 0 turns the poller off).
    #[arg(long, env = "OUTBOX_SLOT_POLL_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub slot_poll_interval: Duration,
}

pub(crate) const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9187";

/// Where the metrics endpoints listen; `None` when turned off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsAddr(pub Option<std::net::SocketAddr>);

/// An `IP:port`, or empty / `off` for none.
pub(crate) fn parse_metrics_addr(text: &str) -> Result<MetricsAddr, String> {
    let text = text.trim();
    if text.is_empty() || text.eq_ignore_ascii_case("off") {
        return Ok(MetricsAddr(None));
    }
    text.parse()
        .map(|addr| MetricsAddr(Some(addr)))
        .map_err(|_| {
            format!("{text:?} is not an address such as 127.0.0.1:9187 or 0.0.0.0:9187 (or off)")
        })
}

/// The cleanup job: deletes delivered rows in small batches. The help here is WAL mode's
/// (src/wal/cleanup.rs); `poll` says in its own words what its cleanup deletes.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Cleanup")]
pub struct CleanupArgs {
    /// How often rows older than --retention and than the last acknowledged commit are
    /// deleted (0 turns cleanup off). Only the relay that holds the slot runs it.
    #[arg(long, env = "OUTBOX_CLEANUP_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub cleanup_interval: Duration,

    /// How long a row is kept (by created_at) before cleanup may delete it; `resync --since`
    /// can re-publish rows this far back.
    #[arg(long, env = "OUTBOX_RETENTION", default_value = "1h", value_parser = parse_duration)]
    pub retention: Duration,

    /// Rows one cleanup DELETE removes (small batches keep lock times short).
    #[arg(long, env = "OUTBOX_CLEANUP_BATCH", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub cleanup_batch: u32,
}
