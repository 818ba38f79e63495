//! The envelope against the contract: what each field becomes, what is refused and how, and
//! that no input panics.

use super::*;
use crate::contract::headers as stream_headers;
use crate::contract::mapper::AllowedExchanges;
use crate::contract::message::{HeaderValue, Rejection};
use pgwire_replication::Lsn;
use proptest::prelude::*;

fn mapper() -> Mapper {
    Mapper::new(
        "outbox",
        1024,
        AllowedExchanges::parse(Some("orders"), "outbox").expect("policy"),
    )
    .expect("mapper")
}

fn pos() -> Position {
    Position {
        commit_lsn: Lsn::from_u64(0x16B6C50),
        index: 2,
    }
}

fn content(json: &str) -> Bytes {
    Bytes::copy_from_slice(json.as_bytes())
}

/// What `outbox_emit` writes (field order as jsonb prints it).
const EVENT: &str = r#"{"v": 1, "id": "b5848b82-d25f-4dea-8c91-f1209fe49ee6", "headers": {"a": 1, "b": "x", "c": null}, "payload": {"n": null, "order_id": 42}, "created_at": "2026-11-30T22:47:40.601909Z", "event_type": "OrderCreated", "shard_hash": 2044531689, "aggregate_id": "42", "payload_type": "jsonb", "aggregate_type": "Order"}"#;

/// The message, or the typed error (what `map` hands delivery carries its text).
fn map(json: &str) -> Result<Message, MapError> {
    let data = content(json);
    read(&data, true, pos()).and_then(|event| event.message(&mapper(), pos()))
}

fn header<'a>(message: &'a Message, name: &str) -> Option<&'a HeaderValue> {
    message.header(name)
}

fn text_header(message: &Message, name: &str) -> Option<String> {
    match header(message, name)? {
        HeaderValue::Text(s) => Some(s.clone()),
        _ => None,
    }
}

#[test]
fn an_emitted_event_maps_like_a_row() {
    let data = content(EVENT);
    let message = super::map(&mapper(), &data, true, pos()).expect("publishable");
    assert_eq!(message.message_id, "b5848b82-d25f-4dea-8c91-f1209fe49ee6");
    assert_eq!(message.event_type.as_deref(), Some("OrderCreated"));
    assert_eq!(message.exchange, "outbox");
    assert_eq!(message.routing_key, "OrderCreated");
    assert_eq!(message.content_type.as_deref(), Some("application/json"));
    assert_eq!(message.timestamp, Some(1_796_078_860));
    let body: serde_json::Value = serde_json::from_slice(&message.body).expect("JSON body");
    assert_eq!(body, serde_json::json!({"n": null, "order_id": 42}));
    // The body is a slice of the received message, not a copy.
    let inside = data.as_ptr() as usize..data.as_ptr() as usize + data.len();
    assert!(inside.contains(&(message.body.as_ptr() as usize)));
    assert_eq!(header(&message, "a"), Some(&HeaderValue::Int(1)));
    assert_eq!(text_header(&message, "b").as_deref(), Some("x"));
    assert_eq!(header(&message, "c"), None, "nulls are left out");
    assert_eq!(
        text_header(&message, stream_headers::AGGREGATE_ID).as_deref(),
        Some("42")
    );
    assert_eq!(
        text_header(&message, stream_headers::AGGREGATE_TYPE).as_deref(),
        Some("Order")
    );
    assert_eq!(
        text_header(&message, stream_headers::SEQ),
        Some(pos().seq()),
        "numbered with the transaction's rows"
    );
    assert_eq!(
        text_header(&message, stream_headers::LSN),
        Some(pos().commit_lsn.to_string())
    );
}

#[test]
fn text_and_bytea_payloads_arrive_byte_for_byte() {
    let text = map(
        r#"{"v": 1, "id": "1", "event_type": "T", "payload_type": "text", "payload": "héllo \"q\"\n"}"#,
    )
    .expect("text");
    assert_eq!(&text.body[..], "héllo \"q\"\n".as_bytes());
    assert_eq!(
        text.content_type.as_deref(),
        Some("text/plain; charset=utf-8")
    );
    let bytea = map(
        r#"{"v": 1, "id": "2", "event_type": "B", "payload_type": "bytea", "payload": "AP8Q"}"#,
    )
    .expect("bytea");
    assert_eq!(&bytea.body[..], &[0x00, 0xff, 0x10]);
    assert_eq!(
        bytea.content_type.as_deref(),
        Some("application/octet-stream")
    );
}

#[test]
fn an_absent_payload_is_an_empty_body_and_a_json_null_is_null() {
    let absent = map(r#"{"v": 1, "id": "1", "event_type": "T", "payload_type": "jsonb"}"#);
    assert!(absent.expect("absent").body.is_empty());
    let null =
        map(r#"{"v": 1, "id": "1", "event_type": "T", "payload_type": "jsonb", "payload": null}"#);
    assert_eq!(&null.expect("null").body[..], b"null");
}

#[test]
fn exchange_and_routing_key_follow_the_policy() {
    let routed = map(
        r#"{"v": 1, "id": "1", "event_type": "T", "payload_type": "jsonb", "exchange": "orders", "routing_key": "r.k"}"#,
    )
    .expect("allowed exchange");
    assert_eq!(message_dest(&routed), ("orders", "r.k"));
    let refused = map(
        r#"{"v": 1, "id": "1", "event_type": "T", "payload_type": "jsonb", "exchange": "elsewhere"}"#,
    );
    assert!(
        matches!(refused, Err(MapError::ExchangeNotAllowed { ref exchange, .. }) if exchange == "elsewhere"),
        "{refused:?}"
    );
}

fn message_dest(m: &Message) -> (&str, &str) {
    (m.exchange.as_str(), m.routing_key.as_str())
}

#[test]
fn a_newer_envelope_is_refused_by_version_whatever_its_shape() {
    for json in [
        r#"{"v": 2, "id": "1", "event_type": "T", "payload_type": "jsonb"}"#,
        r#"{"v": 2, "something": ["entirely", "different"]}"#,
    ] {
        let error = map(json).expect_err("newer");
        assert!(
            matches!(
                error,
                MapError::EnvelopeVersion {
                    version: 2,
                    supported: 1,
                    ..
                }
            ),
            "{error:?}"
        );
        let text = crate::advice::report(&error.into());
        assert!(
            text.contains("version 2") && text.contains("upgrade the relay"),
            "{text}"
        );
    }
}

#[test]
fn malformed_envelopes_are_errors_that_name_the_event_and_never_quote_values() {
    let cases = [
        ("not json at all", "not a JSON object"),
        ("", "truncated"),
        (r#"{"v": 1, "id": "1", "event_type": "T""#, "truncated"),
        (
            r#"{"v": 1, "id": "1", "payload_type": "jsonb"}"#,
            "missing field `event_type`",
        ),
        (r#"{"v": "secret-xyz", "id": "1"}"#, "wrong type"),
        (
            r#"{"v": 0, "id": "1", "event_type": "T", "payload_type": "jsonb"}"#,
            "version 0",
        ),
        (
            r#"{"v": 1, "id": "", "event_type": "T", "payload_type": "jsonb"}"#,
            "empty \"id\"",
        ),
        (
            r#"{"v": 1, "id": "1", "event_type": "T", "payload_type": "xml"}"#,
            "payload_type",
        ),
        (
            r#"{"v": 1, "id": "1", "event_type": "T", "payload_type": "bytea", "payload": "*secret-xyz*"}"#,
            "not base64",
        ),
        (
            r#"{"v": 1, "id": "1", "event_type": "T", "payload_type": "text", "payload": {"secret-xyz": 1}}"#,
            "not a JSON string",
        ),
        (
            r#"{"v": 1, "id": "1", "event_type": "T", "payload_type": "jsonb", "headers": ["secret-xyz"]}"#,
            "\"headers\" must be a JSON object",
        ),
        (
            r#"{"v": 1, "id": "1", "event_type": "T", "payload_type": "jsonb", "created_at": "secret-xyz"}"#,
            "RFC 3339",
        ),
        (
            r#"{"v": 1, "id": "1", "event_type": "T", "payload_type": "jsonb", "shard_hash": -1}"#,
            "shard_hash",
        ),
    ];
    for (json, problem) in cases {
        let error = map(json).expect_err(json);
        assert!(
            matches!(error, MapError::Envelope { .. }),
            "{json}: {error:?}"
        );
        let text = crate::advice::report(&error.into());
        assert!(text.contains(problem), "{json}: {text}");
        assert!(text.contains("emitted event"), "{text}");
        assert!(text.contains("docs/emit.md"), "{text}");
        assert!(!text.contains("secret-xyz"), "a value in the error: {text}");
    }
}

#[test]
fn a_non_transactional_message_with_the_prefix_is_refused() {
    let data = content(EVENT);
    let error = read(&data, false, pos()).err().expect("non-transactional");
    assert!(error.to_string().contains("non-transactionally"), "{error}");
    let unpublishable = super::map(&mapper(), &data, false, pos()).expect_err("refused");
    assert!(unpublishable.problem.contains("non-transactionally"));
}

#[test]
fn a_malformed_envelope_is_described_by_its_stream_position() {
    let data = content("{not an envelope");
    let unpublishable = super::map(&mapper(), &data, true, pos()).expect_err("malformed");
    assert!(
        matches!(unpublishable.rejection, Rejection::Unmappable { .. }),
        "{:?}",
        unpublishable.rejection
    );
    let original = unpublishable.original.expect("described");
    // No readable id: one made of its stream position, the same on every replay.
    assert_eq!(original.message_id, format!("emitted-{}", pos().seq()));
    assert_eq!(original.body, data, "the envelope itself, for inspection");
    assert_eq!(
        text_header(&original, stream_headers::SEQ),
        Some(pos().seq())
    );

    let newer = content(r#"{"v": 9, "id": "abc", "event_type": "T"}"#);
    let unpublishable = super::map(&mapper(), &newer, true, pos()).expect_err("newer");
    let Rejection::Unmappable { error } = unpublishable.rejection else {
        panic!("{:?}", unpublishable.rejection);
    };
    assert!(error.contains("version 9"), "{error}");
}

#[test]
fn a_too_large_event_keeps_its_id_not_its_body() {
    let big = "x".repeat(2000);
    let json = format!(
        r#"{{"v": 1, "id": "big-1", "event_type": "T", "payload_type": "text", "payload": "{big}"}}"#
    );
    let unpublishable = super::map(&mapper(), &content(&json), true, pos()).expect_err("too large");
    assert_eq!(
        unpublishable.rejection,
        Rejection::TooLarge {
            size: 2000,
            limit: 1024
        }
    );
    let original = unpublishable.original.expect("described");
    assert_eq!(original.message_id, "big-1");
    assert!(original.body.is_empty());
}

proptest! {
    #[test]
    fn arbitrary_content_never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = super::map(&mapper(), &Bytes::from(data), true, pos());
    }

    #[test]
    fn arbitrary_field_values_never_panic(
        v in prop_oneof![Just("1".to_string()), Just("2".to_string()), "[0-9a-z\"{}\\[\\],:]{0,8}"],
        field in proptest::sample::select(vec![
            "id", "event_type", "payload_type", "payload", "headers", "created_at",
            "exchange", "routing_key", "aggregate_id", "shard_hash",
        ]),
        value in "[0-9a-zA-Z\"{}\\[\\],: .\\\\-]{0,24}",
    ) {
        let json = format!(
            r#"{{"v": {v}, "id": "1", "event_type": "T", "payload_type": "jsonb", "{field}": {value}}}"#
        );
        let _ = super::map(&mapper(), &content(&json), true, pos());
    }
}
