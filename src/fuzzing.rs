//! The fuzz targets' checks: one function per kind of untrusted input the relay reads, each
//! feeding the input to the relay's own parser and asserting what must hold of the result.
//! A panic here is a finding: either the relay panicked on bad input (it must return an
//! error) or a parse broke its contract.
//!
//! The AFL binaries in fuzz/ call these (through the `fuzzing` feature); the tests below run
//! every committed seed (fuzz/corpus/TARGET/) and every input that once failed
//! (fuzz/regressions/TARGET/) through the same functions, uninstrumented, in the ordinary
//! `cargo test`. docs/testing.md, "Fuzzing", says how to run them.
//!
//! Never part of a release build: only under `cfg(test)` or the `fuzzing` feature.

use bytes::Bytes;
use pgwire_replication::Lsn;
use serde_json::Value;

use crate::contract::emit;
use crate::contract::headers::{LSN, SEQ};
use crate::contract::mapper::{AllowedExchanges, Mapper};
use crate::contract::message::{HeaderValue, Message, MAX_SHORT_TEXT};
use crate::contract::pg_text::{self, headers_from_json};
use crate::contract::position::Position;
use crate::pgoutput::{self, LogicalMessage, TupleValue};
use crate::publish::BrokerNodes;
use outbox_common::error::chain;

/// A target: takes any input; panics on a finding.
pub type Target = fn(&[u8]);

/// Every target by name: the name is its binary in fuzz/ and its folders of inputs.
pub const TARGETS: [(&str, Target); 6] = [
    ("pgoutput", pgoutput),
    ("headers_json", headers_json),
    ("emit_envelope", emit_envelope),
    ("timestamptz", timestamptz),
    ("database_url", database_url),
    ("amqp_url", amqp_url),
];

/// One pgoutput message (the payload of an XLogData frame), as the stream reader hands it to
/// the decoder. What decodes must encode back to the very bytes it came from: the decoder
/// neither drops nor invents a field. Values stay slices of the input (zero copy).
pub fn pgoutput(data: &[u8]) {
    let bytes = Bytes::copy_from_slice(data);
    let message = match pgoutput::decode(&bytes) {
        Ok(message) => message,
        Err(error) => {
            // The text every log line and the halt show: must render for any input.
            assert!(!chain(&error).is_empty());
            return;
        }
    };
    let mut expected = data.to_vec();
    match &message {
        // A tag the relay does not read: only the tag is looked at.
        LogicalMessage::Skipped(tag) => {
            assert_eq!(Some(tag), data.first());
            return;
        }
        // Only bit 0 of a logical decoding message's flags means something (transactional).
        LogicalMessage::Message(m) => {
            expected[1] &= 1;
            assert!(within(&bytes, &m.content), "content copied");
        }
        LogicalMessage::Insert(insert) => {
            for value in &insert.tuple.0 {
                if let TupleValue::Text(b) | TupleValue::Binary(b) = value {
                    assert!(within(&bytes, b), "value copied");
                }
            }
        }
        LogicalMessage::Relation(relation) => {
            assert!(relation.columns.len() <= i16::MAX as usize);
            let _ = relation.qualified_name();
        }
        _ => {}
    }
    assert_eq!(
        pgoutput::encode(&message)[..],
        expected[..],
        "{message:?} does not encode back to its input"
    );
}

/// Whether `part` points into `whole` (or is empty).
fn within(whole: &Bytes, part: &Bytes) -> bool {
    part.is_empty() || whole.as_ptr_range().contains(&part.as_ptr())
}

/// A JSON object of headers: a row's `headers` column, an emitted event's `headers` field.
/// Accepted, each header is the object's member of that name (nulls left out), the kind of
/// value AMQP can carry, its name within AMQP's short string; refused, it says why.
pub fn headers_json(data: &[u8]) {
    let headers = match headers_from_json(data) {
        Ok(headers) => headers,
        Err(problem) => {
            assert!(!problem.is_empty());
            return;
        }
    };
    let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(data) else {
        panic!("headers accepted from what is not a JSON object");
    };
    let members: Vec<_> = object.iter().filter(|(_, v)| !v.is_null()).collect();
    assert_eq!(headers.len(), members.len(), "{headers:?}");
    for ((name, value), (member, json)) in headers.iter().zip(members) {
        assert_eq!(name, member);
        assert!(name.len() <= MAX_SHORT_TEXT);
        match (value, json) {
            (HeaderValue::Bool(b), Value::Bool(j)) => assert_eq!(b, j),
            (HeaderValue::Int(i), Value::Number(n)) => assert_eq!(Some(*i), n.as_i64()),
            (HeaderValue::Float(f), Value::Number(n)) => {
                assert!(n.as_i64().is_none() && f.is_finite(), "{n} as {f}");
                assert_eq!(Some(*f), n.as_f64());
            }
            (HeaderValue::Text(s), Value::String(j)) => assert_eq!(s, j),
            // Nested values travel as their JSON text: it reads back as the same value.
            (HeaderValue::Text(s), nested @ (Value::Array(_) | Value::Object(_))) => {
                assert_eq!(
                    &serde_json::from_str::<Value>(s).ok(),
                    &Some(nested.clone())
                )
            }
            (value, json) => panic!("{json} became {value:?}"),
        }
    }
}

/// An emitted event's envelope (the content of a logical decoding message with the outbox's
/// prefix), mapped as the WAL source maps it: a message that keeps the contract's limits, or
/// an unpublishable one that says why. The same event in CloudEvents structured mode is JSON
/// that carries the same body.
pub fn emit_envelope(data: &[u8]) {
    const LIMIT: usize = 4096;
    let content = Bytes::copy_from_slice(data);
    let position = Position {
        commit_lsn: Lsn::from_u64(0x16_B6C5_0000),
        index: 2,
    };
    let mapper = |cloudevents: bool| {
        let allowed = AllowedExchanges::parse(Some("orders,audit.*"), "outbox")
            .unwrap_or_else(|e| panic!("exchange policy: {e:?}"));
        let mapper = Mapper::new("outbox", LIMIT, allowed).unwrap_or_else(|e| panic!("{e}"));
        match cloudevents {
            true => mapper.with_cloudevents("/outbox-relay/fuzz"),
            false => mapper,
        }
    };
    if let Some(hash) = emit::shard_hash(data) {
        assert!(hash <= i32::MAX as u32);
    }
    // Written outside any transaction: never published, whatever it holds.
    assert!(emit::map(&mapper(false), &content, false, position).is_err());
    let plain = emit::map(&mapper(false), &content, true, position);
    let structured = emit::map(&mapper(true), &content, true, position);
    for result in [&plain, &structured] {
        match result {
            Ok(message) => keeps_the_contract(message, position, LIMIT),
            Err(unpublishable) => {
                assert!(!unpublishable.problem.is_empty());
                if let Some(original) = &unpublishable.original {
                    assert!(!original.message_id.is_empty());
                    assert!(original.message_id.len() <= MAX_SHORT_TEXT);
                    assert!(original.body.len() <= LIMIT);
                }
            }
        }
    }
    if let (Ok(plain), Ok(structured)) = (&plain, &structured) {
        carries_the_same_event(plain, structured);
    }
}

/// What every published message holds: AMQP's limits, an allowed exchange, the body within
/// the size limit, the stream headers of its position.
fn keeps_the_contract(message: &Message, position: Position, limit: usize) {
    assert!(!message.message_id.is_empty() && message.message_id.len() <= MAX_SHORT_TEXT);
    assert!(message.routing_key.len() <= MAX_SHORT_TEXT);
    let event_type = message.event_type.as_deref().unwrap_or_default();
    assert!(event_type.len() <= MAX_SHORT_TEXT);
    assert!(
        ["outbox", "orders"].contains(&message.exchange.as_str())
            || message.exchange.starts_with("audit."),
        "exchange {:?} is not allowed",
        message.exchange
    );
    assert!(message.exchange.len() <= MAX_SHORT_TEXT);
    assert!(message.body.len() <= limit);
    assert!(message.content_type.is_some());
    assert!(message
        .headers
        .iter()
        .all(|(n, _)| n.len() <= MAX_SHORT_TEXT));
    assert_eq!(
        message.header(SEQ),
        Some(&HeaderValue::Text(position.seq()))
    );
    assert_eq!(
        message.header(LSN),
        Some(&HeaderValue::Text(position.commit_lsn.to_string()))
    );
}

/// The CloudEvent names the message's id and type and carries its body: as JSON, as text,
/// or in base64, by the body's content type.
fn carries_the_same_event(plain: &Message, structured: &Message) {
    let event: Value = serde_json::from_slice(&structured.body)
        .unwrap_or_else(|e| panic!("the CloudEvent is not JSON: {e}"));
    assert_eq!(event["id"], Value::from(plain.message_id.as_str()));
    assert_eq!(
        event["type"],
        Value::from(plain.event_type.as_deref().unwrap_or_default())
    );
    let body = &plain.body[..];
    if body.is_empty() {
        assert!(event.get("data").is_none() && event.get("data_base64").is_none());
    } else if let Some(encoded) = event.get("data_base64").and_then(Value::as_str) {
        use base64::Engine as _;
        let decoded = base64::engine::general_purpose::STANDARD.decode(encoded);
        assert_eq!(decoded.ok().as_deref(), Some(body));
    } else if plain.content_type.as_deref() == Some("application/json") {
        assert_eq!(
            serde_json::from_slice::<Value>(body).ok(),
            Some(event["data"].clone())
        );
    } else {
        assert_eq!(event["data"].as_str().map(str::as_bytes), Some(body));
    }
}

/// A timestamptz as PostgreSQL prints it under the pinned DateStyle. The fast path reads what
/// the general parser reads, to the same instant, and nothing it rejects; what is accepted is
/// at or after 1970 and reads back the same once printed again.
pub fn timestamptz(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let general = time::OffsetDateTime::parse(text, pg_text::ISO_TIMESTAMPTZ).ok();
    if let Some(fast) = pg_text::parse_iso_common(data) {
        assert_eq!(Some(fast), general, "the fast path read {text:?} otherwise");
    }
    let parsed = pg_text::parse_timestamptz_at(text);
    assert_eq!(
        parsed.as_ref().ok(),
        general.filter(|at| at.unix_timestamp() >= 0).as_ref()
    );
    match parsed {
        Ok(at) => {
            assert_eq!(
                pg_text::parse_timestamptz(text),
                Ok(at.unix_timestamp().unsigned_abs())
            );
            let printed = at
                .format(pg_text::ISO_TIMESTAMPTZ)
                .unwrap_or_else(|e| panic!("{at} cannot be printed: {e}"));
            assert_eq!(pg_text::parse_timestamptz_at(&printed), Ok(at), "{printed}");
        }
        Err(problem) => assert!(!problem.is_empty()),
    }
}

/// A password the URL seeds carry: an error, a server's or a node's name that repeats it
/// leaks the password into logs.
const SECRET: &str = "Pa55w0rd";

/// The byte range of [`SECRET`] in `text` when it occurs there once.
fn the_secret(text: &str) -> Option<std::ops::Range<usize>> {
    let at = text.find(SECRET)?;
    (text.matches(SECRET).count() == 1).then_some(at..at + SECRET.len())
}

/// Whether `range` lies inside the password of `user_info` (`user:password`), which starts
/// at byte `start` of the text.
fn in_password(range: &std::ops::Range<usize>, user_info: &str, start: usize) -> bool {
    user_info
        .find(':')
        .is_some_and(|colon| range.start > start + colon && range.end <= start + user_info.len())
}

/// Whether [`SECRET`] is the database URL's password, and nothing else, as tokio-postgres
/// reads the URL: in a URI the credentials end at the first `@`, and `password=` may be a
/// parameter after the `?`; in the key=value form, the value of `password`. Elsewhere (a host
/// name, say) a message may rightly quote it.
fn secret_is_the_database_password(url: &str) -> bool {
    let Some(range) = the_secret(url) else {
        return false;
    };
    let uri = ["postgres://", "postgresql://"]
        .iter()
        .find_map(|prefix| url.strip_prefix(prefix));
    match uri {
        Some(rest) => {
            let start = url.len() - rest.len();
            match rest.find('@') {
                Some(at) => in_password(&range, &rest[..at], start),
                // No credentials: the `password` parameter of the query, which starts at the
                // first '?' and is split at '&', each pair at its first '='.
                None => rest.split_once('?').is_some_and(|(_, query)| {
                    query.split('&').any(|pair| {
                        pair.split_once('=')
                            .is_some_and(|(key, value)| key == "password" && value.contains(SECRET))
                    })
                }),
            }
        }
        None => outbox_common::pg::key_value_params(url).is_some_and(|params| {
            params
                .iter()
                .any(|p| p.key == "password" && p.value.contains(SECRET))
        }),
    }
}

/// Whether [`SECRET`] is the password of one of the AMQP URLs, and nothing else, as the URL
/// parser reads it: the authority ends at `/`, `?` or `#`, its user info at its last `@`.
fn secret_is_an_amqp_password(list: &str) -> bool {
    let Some(range) = the_secret(list) else {
        return false;
    };
    let Some(scheme) = list[..range.start].rfind("://") else {
        return false;
    };
    let start = scheme + 3;
    let authority = list[start..]
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    authority
        .rfind('@')
        .is_some_and(|at| in_password(&range, &authority[..at], start))
}

/// A database URL (`DATABASE_URL`), in libpq's URI or key=value form. Whatever the relay
/// parses for one connection it parses for the others (the servers, the replication
/// connection); no error and no server's name repeats the password.
pub fn database_url(data: &[u8]) {
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    let secret = secret_is_the_database_password(url);
    let no_secret = |text: String| {
        assert!(
            !(secret && text.contains(SECRET)),
            "the password leaks: {text}"
        );
    };
    let config = crate::db::parse_url(url);
    let servers = crate::db::servers(url);
    assert_eq!(
        config.is_ok(),
        servers.is_ok(),
        "{config:?} but {servers:?}"
    );
    match servers {
        Ok(servers) => {
            assert!(!servers.is_empty());
            for server in &servers {
                no_secret(server.to_string());
                if let Err(e) = crate::db::replication_config(url, server, "slot", "publication") {
                    no_secret(chain(&e));
                }
            }
        }
        Err(e) => no_secret(chain(&e)),
    }
}

/// A list of broker URLs (`AMQP_URL`). Each node the relay accepts is a URL lapin parses, and
/// is named by the host and port lapin will connect to; no name and no error repeats the
/// password.
pub fn amqp_url(data: &[u8]) {
    let Ok(list) = std::str::from_utf8(data) else {
        return;
    };
    let secret = secret_is_an_amqp_password(list);
    let no_secret = |text: &str| {
        assert!(
            !(secret && text.contains(SECRET)),
            "the password leaks: {text}"
        );
    };
    let nodes = match BrokerNodes::parse(list) {
        Ok(nodes) => nodes,
        Err(e) => return no_secret(&chain(&e)),
    };
    assert!(!nodes.is_empty());
    assert!(nodes.len() <= list.matches(',').count() + 1);
    for node in nodes.nodes() {
        no_secret(node.address());
        let address = node
            .lapin_address()
            .unwrap_or_else(|e| panic!("accepted a URL lapin refuses: {e}"));
        assert_eq!(
            node.address(),
            address,
            "named otherwise than lapin connects"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz")
            .join(kind)
            .join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = entries
            .map(|entry| entry.expect("readable folder").path())
            .filter(|path| path.is_file())
            .collect();
        files.sort();
        files
    }

    /// Every committed seed and every input that once failed, through its target: a bug the
    /// fuzzer found stays fixed, with no fuzzer installed.
    #[test]
    fn every_seed_and_regression_input_passes_its_target() {
        for (name, target) in TARGETS {
            let seeds = inputs("corpus", name);
            assert!(!seeds.is_empty(), "no seeds in fuzz/corpus/{name}");
            for path in seeds.iter().chain(&inputs("regressions", name)) {
                let data = std::fs::read(path).expect("readable input");
                if std::panic::catch_unwind(|| target(&data)).is_err() {
                    panic!("{name} fails on {}", path.display());
                }
            }
        }
    }

    /// A folder of inputs for a target that does not exist would never run.
    #[test]
    fn every_input_folder_is_a_target() {
        for kind in ["corpus", "regressions"] {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fuzz")
                .join(kind);
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let name = entry.expect("readable folder").file_name();
                let name = name.to_string_lossy();
                assert!(
                    TARGETS.iter().any(|(target, _)| *target == name),
                    "fuzz/{kind}/{name} is no target"
                );
            }
        }
    }

    /// Each target has its AFL binary in fuzz/, and each binary is a target.
    #[test]
    fn every_target_has_its_binary() {
        let manifest =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/Cargo.toml"))
                .expect("fuzz/Cargo.toml");
        let mut binaries: Vec<&str> = manifest
            .split("[[bin]]")
            .skip(1)
            .filter_map(|bin| bin.lines().find_map(|l| l.strip_prefix("name = ")))
            .map(|name| name.trim_matches('"'))
            .collect();
        binaries.sort();
        let mut targets: Vec<&str> = TARGETS.iter().map(|(name, _)| *name).collect();
        targets.sort();
        assert_eq!(binaries, targets);
        for name in targets {
            let source =
                Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fuzz/fuzz_targets/{name}.rs"));
            let source = std::fs::read_to_string(&source).expect("the target's source");
            assert!(
                source.contains(&format!("outbox_relay::fuzzing::{name}(")),
                "{name}"
            );
        }
    }

    #[test]
    fn the_secret_is_found_only_where_a_password_goes() {
        for (url, expected) in [
            ("postgres://relay:Pa55w0rd@db:5432/app", true),
            ("host=db user=relay password=Pa55w0rd", true),
            ("host=db password = 'x Pa55w0rd'", true),
            ("postgres://db/app?password=Pa55w0rd&sslmode=disable", true),
            ("postgres://relay@Pa55w0rd:5432/app", false),
            ("postgres://relay:w0rd@Pa55w0rd@db/app", false),
            ("postgres://relay:Pa55w0rd@Pa55w0rd/app", false),
            ("postgres://db password=Pa55w0rd", false),
            ("postgres://db&password=Pa55w0rd", false),
            ("postgres://db?sslmode=x?password=Pa55w0rd", false),
            ("host= sslmode=Pa55w0rd password=x", false),
        ] {
            assert_eq!(secret_is_the_database_password(url), expected, "{url}");
        }
        for (list, expected) in [
            ("amqp://guest:Pa55w0rd@broker/%2f", true),
            ("amqp://h1,amqp://u:Pa55w0rd@h2:5672", true),
            ("amqp://u:w0rd@Pa55w0rd@h", true),
            ("amqp://Pa55w0rd@broker", false),
            ("amqp://u:p@Pa55w0rd:5672", false),
            ("amqp://u:Pa55w0rd/@h", false),
        ] {
            assert_eq!(secret_is_an_amqp_password(list), expected, "{list}");
        }
    }
}
