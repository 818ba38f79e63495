//! `--message-format cloudevents`: a message's body as a CloudEvents 1.0 event in the JSON
//! format, structured mode (content type `application/cloudevents+json`). The AMQP
//! properties and headers stay as in plain mode; only the body and its content type change.
//!
//! ```text
//!  {"specversion": "1.0", "id": <message_id>, "source": <--cloudevents-source>,
//!   "type": <event_type>, "time": <created_at, RFC 3339>, "datacontenttype": <payload's>,
//!   "aggregatetype": …, "aggregateid": …, "outboxseq": <x-outbox-seq, WAL mode>,
//!   "traceparent": …, "tracestate": … (the Distributed Tracing extension),
//!   "data": <JSON payload, or text> | "data_base64": <bytes>}
//! ```
//!
//! Extension attribute names follow the spec's rule (lower-case a–z and 0–9, at most 20
//! characters): [`EXTENSIONS`] lists ours, and a test holds them to it. Pure.

use base64::Engine as _;
use bytes::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;

/// The content type of a structured-mode CloudEvent.
pub(crate) const CONTENT_TYPE: &str = "application/cloudevents+json";

#[cfg(test)]
/// Our extension attributes, then the Distributed Tracing extension's.
pub(crate) const EXTENSIONS: [&str; 5] = [
    "aggregatetype",
    "aggregateid",
    "outboxseq",
    "traceparent",
    "tracestate",
];

/// The attributes of one event, from the message the contract built.
pub(crate) struct Attributes<'a> {
    pub id: &'a str,
    pub source: &'a str,
    pub event_type: &'a str,
    /// RFC 3339.
    pub time: Option<String>,
    pub aggregate_type: Option<&'a str>,
    pub aggregate_id: Option<&'a str>,
    /// `x-outbox-seq` (WAL mode).
    pub seq: Option<String>,
    /// W3C trace context, validated (src/contract/trace_context.rs).
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
}

#[derive(Serialize)]
struct Event<'a> {
    specversion: &'static str,
    id: &'a str,
    source: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    datacontenttype: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aggregatetype: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aggregateid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outboxseq: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tracestate: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Data<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data_base64: Option<String>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Data<'a> {
    Json(&'a RawValue),
    Text(&'a str),
}

/// The structured-mode body for a payload `body` of `content_type`: JSON stays JSON (as
/// `data`), UTF-8 text becomes a JSON string, anything else `data_base64`; an empty body has
/// no data.
pub(crate) fn structured(
    attributes: &Attributes<'_>,
    body: &Bytes,
    content_type: Option<&str>,
) -> Bytes {
    let json = content_type.is_some_and(|t| t == "application/json");
    let text = content_type.is_some_and(|t| t.starts_with("text/"));
    let raw = std::str::from_utf8(body).ok();
    let json_data = raw
        .filter(|_| json)
        .and_then(|raw| serde_json::from_str::<&RawValue>(raw).ok());
    let (data, data_base64) = match (json_data, raw.filter(|_| text)) {
        _ if body.is_empty() => (None, None),
        (Some(value), _) => (Some(Data::Json(value)), None),
        (None, Some(text)) => (Some(Data::Text(text)), None),
        (None, None) => (
            None,
            Some(base64::engine::general_purpose::STANDARD.encode(body)),
        ),
    };
    let event = Event {
        specversion: "1.0",
        id: attributes.id,
        source: attributes.source,
        event_type: attributes.event_type,
        time: attributes.time.as_deref(),
        datacontenttype: content_type.filter(|_| !body.is_empty()),
        aggregatetype: attributes.aggregate_type,
        aggregateid: attributes.aggregate_id,
        outboxseq: attributes.seq.as_deref(),
        traceparent: attributes.traceparent,
        tracestate: attributes.tracestate,
        data,
        data_base64,
    };
    // Serializing borrowed strings and raw JSON into a Vec cannot fail; an empty body is
    // the total answer if it ever did.
    Bytes::from(serde_json::to_vec(&event).unwrap_or_default())
}

/// `urn:outbox-relay:<database>:<schema>.<table>`, each name percent-encoded so the result is
/// a URI-reference whatever the names hold. Names only: never a user or a password.
pub(crate) fn default_source(database: &str, (schema, table): (&str, &str)) -> String {
    use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
    const KEEP: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'~');
    let part = |name| utf8_percent_encode(name, KEEP).to_string();
    format!(
        "urn:outbox-relay:{}:{}.{}",
        part(database),
        part(schema),
        part(table)
    )
}

/// `--cloudevents-source`: a URI-reference without credentials (a user or password in its
/// authority would go out with every message).
pub(crate) fn check_source(source: &str) -> Result<(), String> {
    if source.is_empty() || source.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(
            "the source must be a URI-reference: not empty, no spaces or control \
                    characters"
                .into(),
        );
    }
    if let Some((_, rest)) = source.split_once("://") {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            return Err(
                "the source holds credentials (user@ in its authority): every \
                        message would carry them. Use a URI without them"
                    .into(),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attributes() -> Attributes<'static> {
        Attributes {
            id: "id-1",
            source: "urn:outbox-relay:app:public.outbox",
            event_type: "OrderCreated",
            time: Some("2026-11-30T22:47:40.601909Z".into()),
            aggregate_type: Some("Order"),
            aggregate_id: Some("42"),
            seq: Some("0000000001000000-00000002".into()),
            traceparent: None,
            tracestate: None,
        }
    }

    fn parse(body: &Bytes) -> serde_json::Value {
        serde_json::from_slice(body).expect("JSON")
    }

    #[test]
    fn extension_names_follow_the_spec() {
        for name in EXTENSIONS {
            assert!(
                !name.is_empty()
                    && name.len() <= 20
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
                "{name}"
            );
        }
    }

    #[test]
    fn json_text_and_bytes_become_data_or_data_base64() {
        let json = parse(&structured(
            &attributes(),
            &Bytes::from_static(br#"{"order_id": 42}"#),
            Some("application/json"),
        ));
        assert_eq!(json["specversion"], "1.0");
        assert_eq!(json["type"], "OrderCreated");
        assert_eq!(json["data"], serde_json::json!({"order_id": 42}));
        assert_eq!(json["aggregateid"], "42");
        assert_eq!(json["outboxseq"], "0000000001000000-00000002");
        let text = parse(&structured(
            &attributes(),
            &Bytes::from_static(b"hi \"there\""),
            Some("text/plain; charset=utf-8"),
        ));
        assert_eq!(text["data"], "hi \"there\"");
        let bytes = parse(&structured(
            &attributes(),
            &Bytes::from_static(&[0, 255]),
            Some("application/octet-stream"),
        ));
        assert_eq!(bytes["data_base64"], "AP8=");
        assert!(bytes.get("data").is_none());
        let empty = parse(&structured(
            &attributes(),
            &Bytes::new(),
            Some("application/json"),
        ));
        assert!(empty.get("data").is_none() && empty.get("datacontenttype").is_none());
    }

    #[test]
    fn sources_default_to_names_and_refuse_credentials() {
        assert_eq!(
            default_source("app", ("public", "outbox")),
            "urn:outbox-relay:app:public.outbox"
        );
        assert_eq!(
            default_source("my db", ("S", "t:1")),
            "urn:outbox-relay:my%20db:S.t%3A1"
        );
        assert!(check_source("https://orders.example.com/outbox").is_ok());
        assert!(check_source("https://user:pw@orders.example.com/").is_err());
        assert!(check_source("has space").is_err());
    }
}
