//! The RabbitMQ nodes the relay may connect to: the list `AMQP_URL` names, shuffled once at
//! start, and which one to try first.
//!
//! lapin connects to one address; the list and the failover are here, so that every caller
//! of [`super::Broker::connect`] (WAL sessions, polling workers, setup, resync) gets them.
//! A connection tries the nodes in turn from the preferred one and the first that answers
//! becomes preferred; losing the connection to the preferred node moves the preference to
//! the next one, so a reconnect after a node died does not wait on it first. A single URL
//! is a list of one: every connection tries it.
//!
//! Never logs a URL: they carry passwords. Nodes are named by `host:port`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{ConfigProblem, RelayError};
use crate::observability::metrics::{BROKER_INFO, NODE_LABEL};
use outbox_common::error::chain;

/// One broker URL and its `host:port` name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerNode {
    url: String,
    address: String,
}

impl BrokerNode {
    /// The URL, with its password: for lapin only, never for a log.
    pub(super) fn url(&self) -> &str {
        &self.url
    }

    /// `host:port` as lapin reads the URL: where it connects, which [`Self::address`] must
    /// name (the fuzz target checks it, src/fuzzing.rs).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn lapin_address(&self) -> Result<String, String> {
        let uri: lapin::uri::AMQPUri = self.url.parse()?;
        Ok(format!("{}:{}", uri.authority.host, uri.authority.port))
    }

    /// `host:port`, the name logs, metrics and `status` use.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Who the URL logs in as, and where, for the stream protocol's own connection.
    pub(super) fn login(&self) -> Result<NodeLogin, String> {
        let uri: lapin::uri::AMQPUri = self.url.parse()?;
        Ok(NodeLogin {
            host: uri.authority.host,
            user: uri.authority.userinfo.username,
            password: uri.authority.userinfo.password,
            vhost: uri.vhost,
            tls: uri.scheme == lapin::uri::AMQPScheme::AMQPS,
        })
    }
}

/// A node URL's host, credentials and virtual host ([`BrokerNode::login`]).
pub(super) struct NodeLogin {
    pub host: String,
    pub user: String,
    pub password: String,
    pub vhost: String,
    /// `amqps://`.
    pub tls: bool,
}

/// The configured nodes, in this process's (shuffled) order, and the connection state they
/// share: one value per process, behind an `Arc`, used by every connection it makes.
#[derive(Debug)]
pub struct BrokerNodes {
    nodes: Vec<BrokerNode>,
    state: Mutex<NodeState>,
    /// The largest body the broker takes, once it named it by refusing a larger one (0:
    /// not known). AMQP 0-9-1 has no way to ask: RabbitMQ's `max_message_size` shows only in
    /// the 406 that closes the channel.
    refused_above: AtomicUsize,
}

#[derive(Debug, Default)]
struct NodeState {
    /// Where the next connection attempt starts.
    preferred: usize,
    /// The node of the newest connection.
    in_use: Option<usize>,
    /// The newest failure of a node other than the one connected after it: why it moved.
    last_failure: Option<(usize, String)>,
}

impl BrokerNodes {
    /// Parses `AMQP_URL` (one URL, or several separated by commas), checks every URL and
    /// shuffles the list, so that a fleet of relays spreads over the nodes.
    pub fn parse(list: &str) -> Result<Self, RelayError> {
        let mut nodes = Self::checked(list)?;
        shuffle(&mut nodes, RandomState::new().build_hasher().finish());
        Ok(Self::in_order(nodes))
    }

    /// [`Self::parse`] without the shuffle: the first URL is tried first, for an operator who
    /// knows which node leads the queues (`--amqp-node-order listed`).
    pub fn parse_listed(list: &str) -> Result<Self, RelayError> {
        Ok(Self::in_order(Self::checked(list)?))
    }

    fn checked(list: &str) -> Result<Vec<BrokerNode>, RelayError> {
        split_urls(list)
            .into_iter()
            .enumerate()
            .map(|(position, url)| check_url(url, position))
            .collect()
    }

    fn in_order(nodes: Vec<BrokerNode>) -> Self {
        Self {
            nodes,
            state: Mutex::new(NodeState::default()),
            refused_above: AtomicUsize::new(0),
        }
    }

    /// The largest body the broker takes, if it named it ([`Self::learn_max_message_size`]).
    pub(super) fn max_message_size(&self) -> Option<usize> {
        match self.refused_above.load(Ordering::Relaxed) {
            0 => None,
            limit => Some(limit),
        }
    }

    /// The broker refused a body over `limit` bytes: later bodies are checked against it
    /// before they are published. The smallest limit named wins (nodes may differ).
    pub(super) fn learn_max_message_size(&self, limit: usize) {
        let limit = limit.max(1);
        let previous =
            self.refused_above
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |known| {
                    (known == 0 || limit < known).then_some(limit)
                });
        if previous.is_ok() {
            tracing::warn!(limit, "RabbitMQ refuses message bodies over {limit} bytes (its max_message_size): larger ones are now handled as too large before they are published");
        }
    }

    /// Each node as a list of its own, in this order: for `check`, which connects to every
    /// node instead of the first that answers.
    pub fn singly(&self) -> Vec<Arc<BrokerNodes>> {
        self.nodes
            .iter()
            .map(|node| Arc::new(Self::in_order(vec![node.clone()])))
            .collect()
    }

    /// The nodes in the order this process tries them.
    pub fn nodes(&self) -> &[BrokerNode] {
        &self.nodes
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, NodeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The indices of all nodes, the preferred one first.
    pub(super) fn attempt_order(&self) -> Vec<usize> {
        let first = self.lock().preferred;
        let n = self.nodes.len();
        (0..n).map(|offset| (first + offset) % n).collect()
    }

    pub(super) fn node(&self, index: usize) -> &BrokerNode {
        &self.nodes[index]
    }

    /// A connection to `index` failed to open: the next attempt tries the node after it.
    pub(super) fn connect_failed(&self, index: usize, error: &RelayError) {
        if self.nodes.len() > 1 {
            tracing::warn!(
                node = %self.nodes[index].address,
                error = %chain(error),
                "RabbitMQ node did not answer; trying the next one"
            );
        }
        self.lock().last_failure = Some((index, chain(error)));
    }

    /// A connection to `index` is open: it becomes the preferred node and the one in use.
    pub(super) fn connected(&self, index: usize) {
        let mut state = self.lock();
        let previous = state.in_use.replace(index);
        state.preferred = index;
        let address = &self.nodes[index].address;
        match previous {
            Some(previous) if previous != index => {
                let from = &self.nodes[previous].address;
                let reason = match &state.last_failure {
                    Some((failed, reason)) if *failed != index => {
                        format!("{}: {reason}", self.nodes[*failed].address)
                    }
                    _ => "reconnect".to_string(),
                };
                tracing::warn!(node = %address, from = %from, reason = %reason, "moved to another RabbitMQ node");
                metrics::gauge!(BROKER_INFO, NODE_LABEL => from.clone()).set(0.0);
            }
            Some(_) => tracing::debug!(node = %address, "connected to RabbitMQ again"),
            None => {
                tracing::info!(node = %address, nodes = self.nodes.len(), "connected to RabbitMQ")
            }
        }
        metrics::gauge!(BROKER_INFO, NODE_LABEL => address.clone()).set(1.0);
        state.last_failure = None;
    }

    /// The open connection to `index` failed: unless another connection already moved on,
    /// the next attempt starts at the node after it.
    pub(super) fn connection_lost(&self, index: usize, reason: &str) {
        let mut state = self.lock();
        if state.preferred == index {
            state.preferred = (index + 1) % self.nodes.len();
        }
        state.last_failure = Some((index, reason.to_string()));
    }

    /// `host:port` of the node the newest connection went to.
    pub fn in_use(&self) -> Option<&str> {
        let index = self.lock().in_use?;
        Some(&self.nodes[index].address)
    }
}

/// Splits a list of URLs at the commas that come right before `amqp://` or `amqps://` (any
/// case, spaces allowed after the comma): a comma is legal inside a password.
fn split_urls(list: &str) -> Vec<&str> {
    let starts_url = |rest: &str| {
        let rest = rest.trim_start();
        ["amqp://", "amqps://"].iter().any(|scheme| {
            rest.get(..scheme.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(scheme))
        })
    };
    let mut urls = Vec::new();
    let mut start = 0;
    for (at, _) in list.match_indices(',') {
        if starts_url(&list[at + 1..]) {
            urls.push(list[start..at].trim());
            start = at + 1;
        }
    }
    urls.push(list[start..].trim());
    urls
}

/// Checks one URL the way lapin will parse it, and names it by `host:port`. `position` is
/// its place in the list as written (0-based), for the error.
fn check_url(url: &str, position: usize) -> Result<BrokerNode, RelayError> {
    let bad = |problem: String| {
        RelayError::from(ConfigProblem::AmqpUrl {
            number: position + 1,
            problem,
        })
    };
    if url.is_empty() {
        return Err(bad("it is empty".into()));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad("it has no scheme".into()));
    };
    if !["amqp", "amqps"].contains(&scheme.to_ascii_lowercase().as_str()) {
        return Err(bad(format!("the scheme {scheme:?} is not amqp or amqps")));
    }
    // lapin's own parser decides; its message may quote the URL, password and all.
    let uri = match url.parse::<lapin::uri::AMQPUri>() {
        Ok(uri) => uri,
        Err(problem) => return Err(bad(problem.replace(url, "<the URL>"))),
    };
    // The authority ends at the first '/', '?' or '#' (a password must percent-encode them).
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host_port)| host_port);
    if host_port.is_empty() || host_port.starts_with(':') {
        return Err(bad("it names no host".into()));
    }
    if host_port.starts_with('[') {
        // lapin's parser takes only a domain or IPv4 host and would silently connect to
        // localhost instead.
        return Err(bad(
            "an IPv6 address is not supported as the host; use a host name that resolves to it"
                .into(),
        ));
    }
    // Named by where lapin connects: an empty port is the default one, and the host is
    // percent-decoded ("h:" and "h%31:5672" are h:5672 and h1:5672).
    let address = format!("{}:{}", uri.authority.host, uri.authority.port);
    Ok(BrokerNode {
        url: url.to_string(),
        address,
    })
}

/// Fisher–Yates with a xorshift generator: no randomness crate for one shuffle per process.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed | 1;
    for i in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let j = (state % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addresses(nodes: &BrokerNodes) -> Vec<&str> {
        nodes.nodes().iter().map(BrokerNode::address).collect()
    }

    #[test]
    fn one_url_is_one_node() {
        let nodes = BrokerNodes::parse("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap();
        assert_eq!(addresses(&nodes), ["127.0.0.1:5672"]);
        assert_eq!(nodes.node(0).url(), "amqp://guest:guest@127.0.0.1:5672/%2f");
    }

    #[test]
    fn a_node_is_named_by_where_lapin_connects() {
        for (url, address) in [
            ("amqp://h:/%2f", "h:5672"),
            ("amqps://u:p@h:", "h:5671"),
            ("amqp://h%31/%2f", "h1:5672"),
            ("amqp://u:p@broker.example:5673", "broker.example:5673"),
        ] {
            let nodes = BrokerNodes::parse(url).unwrap();
            assert_eq!(addresses(&nodes), [address], "{url}");
        }
    }

    #[test]
    fn splits_only_before_a_scheme_so_a_password_may_hold_commas() {
        let list = "amqp://u:pa,ss@h1:5672/%2f, AMQPS://u:p,amqp:@h2/%2f,amqp://h3:1/v,x";
        assert_eq!(
            split_urls(list),
            [
                "amqp://u:pa,ss@h1:5672/%2f",
                "AMQPS://u:p,amqp:@h2/%2f",
                "amqp://h3:1/v,x"
            ]
        );
        let nodes = BrokerNodes::parse(list).unwrap();
        let mut found = addresses(&nodes);
        found.sort();
        assert_eq!(found, ["h1:5672", "h2:5671", "h3:1"]);
    }

    #[test]
    fn listed_order_keeps_the_list_and_tries_its_first_node_first() {
        let list = "amqp://h1/%2f,amqp://h2/%2f,amqp://h3/%2f,amqp://h4/%2f,amqp://h5/%2f";
        let nodes = BrokerNodes::parse_listed(list).unwrap();
        assert_eq!(
            addresses(&nodes),
            ["h1:5672", "h2:5672", "h3:5672", "h4:5672", "h5:5672"]
        );
        assert_eq!(nodes.attempt_order(), [0, 1, 2, 3, 4]);
        let err = BrokerNodes::parse_listed("amqp://h1/%2f,amqp://u:secret@h2:notaport/%2f")
            .unwrap_err()
            .to_string();
        assert!(err.contains("#2") && !err.contains("secret"), "{err}");
    }

    #[test]
    fn every_url_is_checked_and_the_error_names_which_without_its_password() {
        let err = BrokerNodes::parse("amqp://u:secret@h1/%2f,amqp://u:secret@h2:notaport/%2f")
            .unwrap_err()
            .to_string();
        assert!(err.contains("AMQP URL #2"), "{err}");
        assert!(!err.contains("secret"), "{err}");
        let err = BrokerNodes::parse("http://h1/").unwrap_err().to_string();
        assert!(err.contains("\"http\" is not amqp or amqps"), "{err}");
        let err = BrokerNodes::parse("").unwrap_err().to_string();
        assert!(
            err.contains("AMQP URL #1 is not a valid RabbitMQ URL: it is empty"),
            "{err}"
        );
        let err = BrokerNodes::parse("amqp://u:p@:5672/")
            .unwrap_err()
            .to_string();
        assert!(err.contains("empty host"), "{err}");
    }

    #[test]
    fn an_ipv6_host_is_refused_rather_than_replaced_by_localhost() {
        let err = BrokerNodes::parse("amqp://h1/%2f,amqp://[2001:db8::5]:5673/%2f")
            .unwrap_err()
            .to_string();
        assert!(err.contains("AMQP URL #2") && err.contains("IPv6"), "{err}");
        let nodes = BrokerNodes::parse("amqp://10.1.2.3/%2f").unwrap();
        assert_eq!(addresses(&nodes), ["10.1.2.3:5672"]);
    }

    #[test]
    fn shuffle_is_a_permutation_and_varies_with_the_seed() {
        let orders: std::collections::HashSet<Vec<u32>> = (0..64u64)
            .map(|seed| {
                let mut items = vec![0, 1, 2];
                shuffle(&mut items, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let mut sorted = items.clone();
                sorted.sort();
                assert_eq!(sorted, [0, 1, 2]);
                items
            })
            .collect();
        assert_eq!(orders.len(), 6, "all six orders of three nodes occur");
    }

    fn three() -> BrokerNodes {
        let nodes = ["amqp://a/%2f", "amqp://b/%2f", "amqp://c/%2f"]
            .iter()
            .enumerate()
            .map(|(i, url)| check_url(url, i).unwrap())
            .collect();
        BrokerNodes::in_order(nodes)
    }

    #[test]
    fn a_lost_connection_moves_the_next_attempt_to_the_following_node() {
        let nodes = three();
        assert_eq!(nodes.attempt_order(), [0, 1, 2]);
        nodes.connected(0);
        assert_eq!(nodes.in_use(), Some("a:5672"));
        nodes.connection_lost(0, "connection reset");
        assert_eq!(nodes.attempt_order(), [1, 2, 0]);
        // A second connection to the same node (another polling worker) noticing the same
        // loss does not skip a node.
        nodes.connection_lost(0, "connection reset");
        assert_eq!(nodes.attempt_order(), [1, 2, 0]);
        nodes.connect_failed(1, &RelayError::Config("refused".into()));
        nodes.connected(2);
        assert_eq!(nodes.in_use(), Some("c:5672"));
        assert_eq!(nodes.attempt_order(), [2, 0, 1]);
    }

    #[test]
    fn a_session_that_ends_for_another_reason_reconnects_to_the_same_node() {
        let nodes = three();
        nodes.connected(1);
        assert_eq!(nodes.attempt_order(), [1, 2, 0]);
        nodes.connected(1);
        assert_eq!(nodes.in_use(), Some("b:5672"));
    }
}
