//! The envelope against the contract: what each field becomes, what is refused and how, and
//! that no input panics.

use super::*;
use crate::mapper::{headers as stream_headers, AllowedExchanges};
use lapin::types::AMQPValue;
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

fn map(json: &str) -> Result<OutboxMessage, MapError> {
    map_or_dead_letter(&mapper(), &content(json), true, pos(), None).map(|(m, _)| m)
}

fn header<'a>(message: &'a OutboxMessage, name: &str) -> Option<&'a AMQPValue> {
    message
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(name))
}

fn text_header(message: &OutboxMessage, name: &str) -> Option<String> {
    match header(message, name)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        _ => None,
    }
}

#[test]
fn an_emitted_event_maps_like_a_row() {
    let data = content(EVENT);
    let (message, dead) =
        map_or_dead_letter(&mapper(), &data, true, pos(), None).expect("publishable");
    assert!(dead.is_none());
    let p = &message.properties;
    assert_eq!(message.message_id, "b5848b82-d25f-4dea-8c91-f1209fe49ee6");
    assert_eq!(
        p.message_id().as_ref().map(|s| s.as_str()),
        Some(message.message_id.as_str())
    );
    assert_eq!(p.kind().as_ref().map(|s| s.as_str()), Some("OrderCreated"));
    assert_eq!(message.exchange.as_str(), "outbox");
    assert_eq!(message.routing_key.as_str(), "OrderCreated");
    assert_eq!(p.delivery_mode(), &Some(2));
    assert_eq!(
        p.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(p.timestamp(), &Some(1_796_078_860));
    let body: serde_json::Value = serde_json::from_slice(&message.body).expect("JSON body");
    assert_eq!(body, serde_json::json!({"n": null, "order_id": 42}));
    // The body is a slice of the received message, not a copy.
    let inside = data.as_ptr() as usize..data.as_ptr() as usize + data.len();
    assert!(inside.contains(&(message.body.as_ptr() as usize)));
    assert_eq!(header(&message, "a"), Some(&AMQPValue::LongLongInt(1)));
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
        text.properties.content_type().as_ref().map(|s| s.as_str()),
        Some("text/plain; charset=utf-8")
    );
    let bytea = map(
        r#"{"v": 1, "id": "2", "event_type": "B", "payload_type": "bytea", "payload": "AP8Q"}"#,
    )
    .expect("bytea");
    assert_eq!(&bytea.body[..], &[0x00, 0xff, 0x10]);
    assert_eq!(
        bytea.properties.content_type().as_ref().map(|s| s.as_str()),
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

fn message_dest(m: &OutboxMessage) -> (&str, &str) {
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
        let text = error.to_string();
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
        let text = error.to_string();
        assert!(
            matches!(error, MapError::Envelope { .. }),
            "{json}: {error:?}"
        );
        assert!(text.contains(problem), "{json}: {text}");
        assert!(text.contains("emitted event"), "{text}");
        assert!(text.contains("docs/emit.md"), "{text}");
        assert!(!text.contains("secret-xyz"), "a value in the error: {text}");
    }
}

#[test]
fn a_non_transactional_message_with_the_prefix_is_refused() {
    let error = map_or_dead_letter(&mapper(), &content(EVENT), false, pos(), None)
        .expect_err("non-transactional");
    assert!(error.to_string().contains("non-transactionally"), "{error}");
}

#[test]
fn under_the_dead_letter_policy_a_malformed_envelope_becomes_a_dead_letter() {
    let dlx = ShortString::from("outbox.dead-letter");
    let data = content("{not an envelope");
    let (letter, reason) =
        map_or_dead_letter(&mapper(), &data, true, pos(), Some(&dlx)).expect("dead-lettered");
    assert!(
        matches!(reason, Some(Reason::Unmappable { .. })),
        "{reason:?}"
    );
    assert_eq!(letter.exchange.as_str(), "outbox.dead-letter");
    // No readable id: one made of its stream position, the same on every replay.
    assert_eq!(letter.message_id, format!("emitted-{}", pos().seq()));
    assert_eq!(letter.body, data, "the envelope itself, for inspection");
    assert_eq!(text_header(&letter, stream_headers::SEQ), Some(pos().seq()));

    let newer = content(r#"{"v": 9, "id": "abc", "event_type": "T"}"#);
    let (_, reason) =
        map_or_dead_letter(&mapper(), &newer, true, pos(), Some(&dlx)).expect("dead-lettered");
    let Some(Reason::Unmappable { error }) = reason else {
        panic!("{reason:?}");
    };
    assert!(error.contains("version 9"), "{error}");
}

#[test]
fn under_the_dead_letter_policy_a_too_large_event_keeps_its_id_not_its_body() {
    let dlx = ShortString::from("outbox.dead-letter");
    let big = "x".repeat(2000);
    let json = format!(
        r#"{{"v": 1, "id": "big-1", "event_type": "T", "payload_type": "text", "payload": "{big}"}}"#
    );
    let (letter, reason) = map_or_dead_letter(&mapper(), &content(&json), true, pos(), Some(&dlx))
        .expect("dead-lettered");
    assert_eq!(
        reason,
        Some(Reason::TooLarge {
            size: 2000,
            limit: 1024
        })
    );
    assert_eq!(letter.message_id, "big-1");
    assert!(letter.body.is_empty());
}

proptest! {
    #[test]
    fn arbitrary_content_never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = map_or_dead_letter(&mapper(), &Bytes::from(data), true, pos(), None);
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
        let dlx = ShortString::from("dlx");
        let _ = map_or_dead_letter(&mapper(), &content(&json), true, pos(), Some(&dlx));
    }
}
