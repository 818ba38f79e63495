//! W3C trace context (`traceparent`, `tracestate`) carried from the row to the message, so a
//! consumer's span continues the writer's trace (docs/table-layouts.md, "Trace context").
//!
//! A row can carry it three ways, first found wins: the `traceparent` and `tracestate`
//! columns; Debezium's `tracingspancontext` (java.util.Properties text with the same two
//! keys, as Debezium's OpenTelemetry integration writes it); keys of the `headers` column.
//! A value that is not valid W3C is dropped (and counted by the caller), never a reason to
//! stop: tracing is best effort, delivery is not.

/// The header and CloudEvents extension names.
pub(crate) const TRACEPARENT: &str = "traceparent";
pub(crate) const TRACESTATE: &str = "tracestate";

/// `version-traceid-parentid-flags`, lowercase hex: `00-<32>-<16>-<2>`. Version `ff` and
/// all-zero ids are invalid; a version above 00 may carry more fields after a `-`.
pub(crate) fn valid_traceparent(value: &str) -> bool {
    let b = value.as_bytes();
    if b.len() < 55 {
        return false;
    }
    let hex = |range: std::ops::Range<usize>| {
        b[range]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    let zero = |range: std::ops::Range<usize>| b[range].iter().all(|c| *c == b'0');
    let shape =
        hex(0..2) && b[2] == b'-' && hex(3..35) && b[35] == b'-' && hex(36..52) && b[52] == b'-';
    if !shape || !hex(53..55) || &b[0..2] == b"ff" || zero(3..35) || zero(36..52) {
        return false;
    }
    match &b[0..2] {
        b"00" => b.len() == 55,
        _ => b.len() == 55 || b[55] == b'-',
    }
}

/// A `tracestate` list: at most 32 `key=value` members separated by commas, each key
/// lowercase (`[a-z0-9_\-*/@]`, starting with a letter or digit), each value printable ASCII
/// without `,` or `=`, at most 512 bytes in all.
pub(crate) fn valid_tracestate(value: &str) -> bool {
    if value.len() > 512 {
        return false;
    }
    let members: Vec<&str> = value
        .split(',')
        .map(|m| m.trim_matches([' ', '\t']))
        .filter(|m| !m.is_empty())
        .collect();
    if members.is_empty() || members.len() > 32 {
        return false;
    }
    members.iter().all(|member| {
        let Some((key, val)) = member.split_once('=') else {
            return false;
        };
        let key_ok = key.len() <= 256
            && key
                .bytes()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && key
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-*/@".contains(&c));
        let val_ok = !val.is_empty()
            && val.len() <= 256
            && val
                .bytes()
                .all(|c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
            && !val.ends_with(' ');
        key_ok && val_ok
    })
}

/// `traceparent` and `tracestate` from Debezium's `tracingspancontext`: java.util.Properties
/// text (`key=value` or `key:value` lines, `#`/`!` comments). Values are returned as found;
/// the caller validates them.
pub(crate) fn parse_span_context(text: &str) -> (Option<&str>, Option<&str>) {
    let (mut parent, mut state) = (None, None);
    for line in text.lines() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let Some(split) = line.find(['=', ':']) else {
            continue;
        };
        let (key, value) = (line[..split].trim(), line[split + 1..].trim());
        match key {
            TRACEPARENT => parent = Some(value),
            TRACESTATE => state = Some(value),
            _ => {}
        }
    }
    (parent, state)
}

/// Where a row's trace context can come from, each `None` when absent.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sources<'a> {
    /// The `traceparent` and `tracestate` columns.
    pub columns: (Option<&'a str>, Option<&'a str>),
    /// The `tracingspancontext` column's text.
    pub span_context: Option<&'a str>,
    /// The `headers` column's `traceparent` and `tracestate` keys.
    pub headers: (Option<&'a str>, Option<&'a str>),
}

/// The trace context a message carries, and the names of the values found invalid and left
/// out.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Resolved<'a> {
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
    pub dropped: Vec<&'static str>,
}

/// The first source that has a `traceparent` gives the context, its `tracestate` with it (a
/// `tracestate` means nothing without its parent: alone, it is left out, not counted). An
/// invalid `traceparent` is dropped with its `tracestate`; an invalid `tracestate` alone.
pub(crate) fn resolve<'a>(sources: &Sources<'a>) -> Resolved<'a> {
    let from_span_context = sources.span_context.map(parse_span_context);
    let chosen = [
        Some(sources.columns),
        from_span_context,
        Some(sources.headers),
    ]
    .into_iter()
    .flatten()
    .find(|(parent, _)| parent.is_some());
    let mut resolved = Resolved::default();
    let Some((Some(parent), state)) = chosen else {
        return resolved;
    };
    if !valid_traceparent(parent) {
        resolved.dropped.push(TRACEPARENT);
        return resolved;
    }
    resolved.traceparent = Some(parent);
    match state {
        Some(state) if state.trim().is_empty() => {}
        Some(state) if valid_tracestate(state) => resolved.tracestate = Some(state),
        Some(_) => resolved.dropped.push(TRACESTATE),
        None => {}
    }
    resolved
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn traceparent_follows_the_w3c_shape() {
        assert!(valid_traceparent(PARENT));
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert!(!valid_traceparent(bad), "{bad}");
        }
        // A later version may append fields.
        assert!(valid_traceparent(
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future"
        ));
    }

    #[test]
    fn tracestate_members_are_checked() {
        assert!(valid_tracestate("congo=t61rcWkgMzE"));
        assert!(valid_tracestate("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"));
        assert!(valid_tracestate("tenant@vendor=x"));
        for bad in ["", "Congo=x", "congo", "congo=", "a=b=c", "=x"] {
            assert!(!valid_tracestate(bad), "{bad:?}");
        }
        let many = (0..33).map(|i| format!("k{i}=v")).collect::<Vec<_>>();
        assert!(!valid_tracestate(&many.join(",")));
    }

    #[test]
    fn debeziums_span_context_is_read_as_properties() {
        let text =
            format!("#Tue Dec 01 10:00:00 UTC 2026\ntraceparent={PARENT}\ntracestate=congo=t61\n");
        assert_eq!(parse_span_context(&text), (Some(PARENT), Some("congo=t61")));
        assert_eq!(parse_span_context("other: x"), (None, None));
    }

    #[test]
    fn the_first_source_with_a_parent_wins() {
        let state = Some("congo=t61rcWkgMzE");
        let other = "00-11111111111111111111111111111111-2222222222222222-00";
        let span_context = format!("traceparent={other}");
        let resolved = resolve(&Sources {
            columns: (Some(PARENT), state),
            span_context: Some(&span_context),
            headers: (Some(other), None),
        });
        assert_eq!(resolved.traceparent, Some(PARENT));
        assert_eq!(resolved.tracestate, state);
        let resolved = resolve(&Sources {
            columns: (None, state),
            span_context: Some(&span_context),
            headers: (Some(PARENT), None),
        });
        assert_eq!(resolved.traceparent, Some(other));
        assert_eq!(
            resolved.tracestate, None,
            "the column's state has no parent"
        );
        let resolved = resolve(&Sources {
            headers: (Some(PARENT), state),
            ..Sources::default()
        });
        assert_eq!(
            (resolved.traceparent, resolved.tracestate),
            (Some(PARENT), state)
        );
    }

    #[test]
    fn invalid_values_are_dropped_and_named() {
        let resolved = resolve(&Sources {
            columns: (Some("garbage"), Some("congo=x")),
            ..Sources::default()
        });
        assert_eq!(resolved.traceparent, None);
        assert_eq!(resolved.tracestate, None);
        assert_eq!(resolved.dropped, vec![TRACEPARENT]);
        let resolved = resolve(&Sources {
            columns: (Some(PARENT), Some("Not Valid")),
            ..Sources::default()
        });
        assert_eq!(resolved.traceparent, Some(PARENT));
        assert_eq!(resolved.dropped, vec![TRACESTATE]);
        assert_eq!(resolve(&Sources::default()), Resolved::default());
    }
}
