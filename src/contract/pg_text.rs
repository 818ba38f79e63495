//! PostgreSQL's text forms, read exactly in the shapes the pinned session settings give them
//! (`db.rs`: `bytea_output = hex`, ISO dates in UTC): hex bytea, a binary uuid, timestamptz;
//! and a JSON object of headers (a row's `headers` column, an emitted event's `headers`
//! field). Pure functions of their input: a value they reject is the caller's row error.

use bytes::Bytes;

use crate::contract::message::{HeaderValue, Headers, MAX_SHORT_TEXT};

/// The type OIDs the contract reads a value by: they decide how its text is parsed and what
/// its body or header becomes.
pub(super) mod type_oid {
    pub(crate) const BOOL: u32 = 16;
    pub(crate) const INT8: u32 = 20;
    pub(crate) const INT2: u32 = 21;
    pub(crate) const INT4: u32 = 23;
    pub(crate) const BYTEA: u32 = 17;
    pub(crate) const TIMESTAMPTZ: u32 = 1184;
    pub(crate) const JSON: u32 = 114;
    pub(crate) const UUID: u32 = 2950;
    pub(crate) const JSONB: u32 = 3802;
}

/// A JSON object of headers as message headers (string, number and bool values; nested
/// values as their JSON text; nulls left out), or what is wrong with it. Rows' `headers`
/// column and emitted events' `headers` field alike.
pub(crate) fn headers_from_json(json: &[u8]) -> Result<Headers, String> {
    let parsed: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("is not JSON: {e}"))?;
    let serde_json::Value::Object(object) = parsed else {
        return Err("must be a JSON object of header names to values".into());
    };
    let mut headers = Headers::with_capacity(object.len());
    for (name, value) in object {
        if name.len() > MAX_SHORT_TEXT {
            return Err(format!("has a header name over {MAX_SHORT_TEXT} bytes"));
        }
        let value = match value {
            serde_json::Value::Null => continue,
            serde_json::Value::Bool(b) => HeaderValue::Bool(b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => HeaderValue::Int(i),
                None => HeaderValue::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => HeaderValue::Text(s),
            nested => HeaderValue::Text(nested.to_string()),
        };
        headers.push((name, value));
    }
    Ok(headers)
}

/// bytea in `bytea_output = hex`: `\\x` followed by two hex digits a byte.
pub(super) fn decode_bytea_hex(text: &[u8]) -> Result<Bytes, String> {
    let digits = text
        .strip_prefix(b"\\x")
        .ok_or_else(|| "is not in hex bytea format (\\x...)".to_string())?;
    let mut out = vec![0; digits.len() / 2];
    hex::decode_to_slice(digits, &mut out).map_err(|e| match e {
        hex::FromHexError::OddLength => "has an odd number of hex digits".to_string(),
        hex::FromHexError::InvalidHexCharacter { c, .. } => {
            format!("has a non-hex character {c:?}")
        }
        // The output is sized from the input: only the two above can happen.
        other => format!("is not valid hex: {other}"),
    })?;
    Ok(Bytes::from(out))
}

/// A binary uuid (16 bytes) in its canonical text form; `None` for any other length.
pub(super) fn uuid_text(raw: &[u8]) -> Option<String> {
    let uuid = uuid::Uuid::from_slice(raw).ok()?;
    // Encoded on the stack, then one allocation of exactly 36 bytes.
    Some(
        uuid.hyphenated()
            .encode_lower(&mut uuid::Uuid::encode_buffer())
            .to_owned(),
    )
}

/// timestamptz as PostgreSQL prints it under `datestyle = ISO`: `2026-11-30 06:26:09.5+00`,
/// the fraction optional, the offset in hours with optional minutes and seconds (`+05:30`).
pub(crate) const ISO_TIMESTAMPTZ: &[time::format_description::BorrowedFormatItem<'static>] = time::macros::format_description!(
    "[year]-[month]-[day] [hour]:[minute]:[second][optional [.[subsecond]]]\
         [offset_hour sign:mandatory][optional [:[offset_minute]]][optional [:[offset_second]]]"
);

#[cfg(any(test, feature = "fuzzing"))]
/// Seconds since the Unix epoch of a timestamptz in ISO output (the pinned DateStyle). AMQP
/// timestamps have one-second resolution.
pub(crate) fn parse_timestamptz(text: &str) -> Result<u64, String> {
    parse_timestamptz_at(text).map(|at| at.unix_timestamp().unsigned_abs())
}

/// [`parse_timestamptz`] as a point in time (at or after 1970).
pub(crate) fn parse_timestamptz_at(text: &str) -> Result<time::OffsetDateTime, String> {
    let at = match parse_iso_common(text.as_bytes()) {
        Some(at) => at,
        None => time::OffsetDateTime::parse(text, ISO_TIMESTAMPTZ)
            .map_err(|_| format!("is not an ISO timestamp with time zone: {text:?}"))?,
    };
    if at.unix_timestamp() < 0 {
        return Err(format!("is before 1970: {text:?}"));
    }
    Ok(at)
}

/// The shape PostgreSQL writes for nearly every row (`2026-11-30 06:26:09.123456+00`: four-digit
/// year, fraction of 1-9 digits, offset `+HH[:MM[:SS]]`), read without the general parser, which
/// cost about 4 % of the relay's CPU per message. `None` for anything else, out-of-range fields
/// included: the general parser then decides, so both accept and reject the same texts.
pub(crate) fn parse_iso_common(text: &[u8]) -> Option<time::OffsetDateTime> {
    fn digits(text: &[u8], at: usize, len: usize) -> Option<u32> {
        text.get(at..at + len)?.iter().try_fold(0u32, |value, &b| {
            b.is_ascii_digit().then(|| value * 10 + u32::from(b - b'0'))
        })
    }
    let separators = [(4, b'-'), (7, b'-'), (10, b' '), (13, b':'), (16, b':')];
    if !separators.iter().all(|&(at, b)| text.get(at) == Some(&b)) {
        return None;
    }
    let year = i32::try_from(digits(text, 0, 4)?).ok()?;
    let month = time::Month::try_from(u8::try_from(digits(text, 5, 2)?).ok()?).ok()?;
    let day = u8::try_from(digits(text, 8, 2)?).ok()?;
    let hour = u8::try_from(digits(text, 11, 2)?).ok()?;
    let minute = u8::try_from(digits(text, 14, 2)?).ok()?;
    let second = u8::try_from(digits(text, 17, 2)?).ok()?;
    let mut at = 19;
    let mut nanosecond = 0;
    if text.get(at) == Some(&b'.') {
        let len = text[at + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if !(1..=9).contains(&len) {
            return None;
        }
        nanosecond = digits(text, at + 1, len)? * 10u32.pow(9 - len as u32);
        at += 1 + len;
    }
    let sign: i8 = match text.get(at)? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    // The offset: hours, then up to two `:NN` parts (minutes, seconds), then the end.
    let mut offset = [0i8; 3];
    let mut parts = 0;
    let mut next = at + 1;
    loop {
        offset[parts] = sign * i8::try_from(digits(text, next, 2)?).ok()?;
        parts += 1;
        next += 2;
        if next == text.len() {
            break;
        }
        if parts == offset.len() || text[next] != b':' {
            return None;
        }
        next += 1;
    }
    let date = time::Date::from_calendar_date(year, month, day).ok()?;
    let clock = time::Time::from_hms_nano(hour, minute, second, nanosecond).ok()?;
    let offset = time::UtcOffset::from_hms(offset[0], offset[1], offset[2]).ok()?;
    Some(time::PrimitiveDateTime::new(date, clock).assume_offset(offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse_with_offsets() {
        assert_eq!(parse_timestamptz("1970-01-01 00:00:00+00"), Ok(0));
        assert_eq!(parse_timestamptz("1970-01-01 01:00:00+01"), Ok(0));
        assert_eq!(parse_timestamptz("1970-01-01 00:00:00-00:30"), Ok(1800));
        assert_eq!(
            parse_timestamptz("2000-02-29 12:00:00.999999+00"),
            Ok(951_825_600)
        );
        assert_eq!(
            parse_timestamptz("2024-01-02 08:34:05.123456+05:30"),
            Ok(1_704_164_645)
        );
        assert_eq!(
            parse_timestamptz("2024-01-02 03:04:05+00"),
            Ok(1_704_164_645)
        );
        assert!(parse_timestamptz("1969-12-31 23:59:59+00").is_err());
        assert!(parse_timestamptz("yesterday").is_err());
        assert!(parse_timestamptz("2000-13-01 00:00:00+00").is_err());
    }

    #[test]
    fn what_postgresql_writes_takes_the_fast_path() {
        for text in [
            "2026-11-30 06:26:09.123456+00",
            "2026-11-30 06:26:09+00",
            "2026-11-30 06:26:09.1-05",
            "2024-01-02 08:34:05.123456+05:30",
            "1900-01-01 00:00:00+00:09:21",
        ] {
            let fast = parse_iso_common(text.as_bytes());
            assert!(fast.is_some(), "{text}");
            assert_eq!(
                fast,
                time::OffsetDateTime::parse(text, ISO_TIMESTAMPTZ).ok()
            );
        }
    }

    /// Texts near PostgreSQL's ISO output: each field's width and range a little wider than
    /// valid, optional fraction and offset parts, sometimes a stray character.
    fn iso_like() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let width =
            |n: usize| (0u32..10u32.pow(n as u32 - 1) * 12).prop_map(move |v| format!("{v:0n$}"));
        (
            (
                prop_oneof![
                    width(4),
                    width(5),
                    Just("0000".to_string()),
                    Just("1969".to_string())
                ],
                0u32..14,
                0u32..33,
                0u32..26,
                0u32..62,
                0u32..62,
            ),
            proptest::option::of("[0-9]{0,11}"),
            prop_oneof![Just('+'), Just('-'), Just('Z')],
            (
                0u32..30,
                proptest::option::of((0u32..62, proptest::option::of(0u32..62))),
            ),
            proptest::option::of((0usize..32, proptest::char::range(' ', '~'))),
        )
            .prop_map(|((y, mo, d, h, mi, s), fraction, sign, (oh, om), stray)| {
                let mut text = format!("{y}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}");
                if let Some(fraction) = fraction {
                    text.push('.');
                    text.push_str(&fraction);
                }
                text.push(sign);
                text.push_str(&format!("{oh:02}"));
                if let Some((om, os)) = om {
                    text.push_str(&format!(":{om:02}"));
                    if let Some(os) = os {
                        text.push_str(&format!(":{os:02}"));
                    }
                }
                if let Some((at, c)) = stray {
                    let at = at.min(text.len());
                    text.insert(at, c);
                }
                text
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]
        /// The fast path reads what the general parser reads, to the same instant, and nothing
        /// it rejects; whatever it leaves, the general parser decides.
        #[test]
        fn the_common_shape_parses_as_the_general_parser_does(text in iso_like()) {
            let general = time::OffsetDateTime::parse(&text, ISO_TIMESTAMPTZ).ok();
            let fast = parse_iso_common(text.as_bytes());
            if fast.is_some() {
                proptest::prop_assert_eq!(fast, general, "{:?}", text);
            }
            proptest::prop_assert_eq!(
                parse_timestamptz_at(&text).ok(),
                general.filter(|at| at.unix_timestamp() >= 0),
                "{:?}", text
            );
        }
    }

    #[test]
    fn header_floats_arrive_as_written() {
        let headers = headers_from_json(br#"{"f": 1.5e200, "n": {"x": 1.5e200}}"#);
        assert_eq!(
            headers,
            Ok(vec![
                ("f".into(), HeaderValue::Float(1.5e200)),
                ("n".into(), HeaderValue::Text(r#"{"x":1.5e+200}"#.into())),
            ])
        );
    }

    #[test]
    fn uuid_binary_renders_canonically() {
        let raw: Vec<u8> = (0u8..16).collect();
        assert_eq!(
            uuid_text(&raw).as_deref(),
            Some("00010203-0405-0607-0809-0a0b0c0d0e0f")
        );
        assert_eq!(uuid_text(&raw[1..]), None);
    }
}
