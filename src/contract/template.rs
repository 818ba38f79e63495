//! Routing templates (`--routing-key '{aggregate_type}.{event_type}'`, `--exchange
//! 'events.{aggregate_type}'`): text with `{field}` placeholders over the message contract's
//! fields, parsed once at start and rendered per message without parsing again.
//!
//! Only contract fields can be named (docs/table-layouts.md, "Routing from the row"): a table
//! column of another name is reached by mapping it (`--column aggregate_type=region`), so a
//! template cannot name a column the relay does not read. `{{` and `}}` are a literal brace.

use std::fmt;

/// The fields a placeholder can name: the contract columns that are short texts.
pub(crate) const FIELDS: [&str; 4] = ["event_type", "aggregate_type", "aggregate_id", "id"];

/// One message's values for the placeholders (`None`: NULL or unmapped).
#[derive(Debug, Clone, Copy, Default)]
pub struct Fields<'a> {
    pub event_type: Option<&'a str>,
    pub aggregate_type: Option<&'a str>,
    pub aggregate_id: Option<&'a str>,
    pub id: Option<&'a str>,
}

impl<'a> Fields<'a> {
    fn get(&self, field: Field) -> Option<&'a str> {
        match field {
            Field::EventType => self.event_type,
            Field::AggregateType => self.aggregate_type,
            Field::AggregateId => self.aggregate_id,
            Field::Id => self.id,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    EventType,
    AggregateType,
    AggregateId,
    Id,
}

impl Field {
    fn name(self) -> &'static str {
        FIELDS[self as usize]
    }

    fn from_name(name: &str) -> Option<Self> {
        [
            Field::EventType,
            Field::AggregateType,
            Field::AggregateId,
            Field::Id,
        ]
        .into_iter()
        .find(|field| field.name() == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    Field(Field),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    pieces: Vec<Piece>,
}

/// A placeholder whose field is NULL or unmapped in a message: its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingField(pub &'static str);

impl Template {
    /// Parses `text`; the error says what is wrong (an unknown field, an unclosed brace).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            if rest.starts_with("{{") || rest.starts_with("}}") {
                literal.push(c);
                rest = &rest[2..];
            } else if c == '{' {
                let Some(end) = rest.find('}') else {
                    return Err(format!("{text:?} has a `{{` without its `}}`"));
                };
                let name = &rest[1..end];
                let Some(field) = Field::from_name(name.trim()) else {
                    return Err(format!(
                        "{text:?} names {{{name}}}, which is not a field of the message \
                         contract; a placeholder names one of {} (map another column to one \
                         of them with --column, or write `{{{{` for a literal brace)",
                        FIELDS.map(|f| format!("{{{f}}}")).join(", ")
                    ));
                };
                if !literal.is_empty() {
                    pieces.push(Piece::Literal(std::mem::take(&mut literal)));
                }
                pieces.push(Piece::Field(field));
                rest = &rest[end + 1..];
            } else if c == '}' {
                return Err(format!(
                    "{text:?} has a `}}` without its `{{` (write `}}}}` for a literal brace)"
                ));
            } else {
                literal.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        Ok(Self {
            source: text.to_string(),
            pieces,
        })
    }

    /// A template of one field: `{field}` (e.g. the default routing key, `{event_type}`).
    pub fn field(name: &str) -> Result<Self, String> {
        Self::parse(&format!("{{{name}}}"))
    }

    /// Whether any placeholder is in it (else it renders to one fixed text).
    pub fn has_placeholders(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, Piece::Field(_)))
    }

    /// The fixed text of a template without placeholders (its braces unescaped).
    pub fn as_literal(&self) -> Option<String> {
        (!self.has_placeholders()).then(|| self.render(&Fields::default()).unwrap_or_default())
    }

    /// The text before the first placeholder: what every rendering starts with.
    pub fn prefix(&self) -> &str {
        match self.pieces.first() {
            Some(Piece::Literal(text)) => text,
            _ => "",
        }
    }

    /// The text as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The template with `fields` in its placeholders; the first field that is `None` is the
    /// error. An empty field renders as empty text.
    pub fn render(&self, fields: &Fields<'_>) -> Result<String, MissingField> {
        // The common template is one field: no second allocation.
        if let [Piece::Field(field)] = self.pieces.as_slice() {
            return fields
                .get(*field)
                .map(str::to_string)
                .ok_or(MissingField(field.name()));
        }
        let mut out = String::with_capacity(self.source.len() + 32);
        for piece in &self.pieces {
            match piece {
                Piece::Literal(text) => out.push_str(text),
                Piece::Field(field) => {
                    out.push_str(fields.get(*field).ok_or(MissingField(field.name()))?)
                }
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// Whether `text` would parse as a template with placeholders (`--exchange` is a name or a
/// template: a name has no unescaped `{`).
pub(crate) fn is_template(text: &str) -> bool {
    Template::parse(text).is_ok_and(|t| t.has_placeholders())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> Fields<'static> {
        Fields {
            event_type: Some("order.created"),
            aggregate_type: Some("order"),
            aggregate_id: Some("42"),
            id: Some("7"),
        }
    }

    #[test]
    fn placeholders_render_from_the_fields() {
        let t = Template::parse("{aggregate_type}.{event_type}").expect("parses");
        assert_eq!(t.render(&fields()).as_deref(), Ok("order.order.created"));
        let t = Template::parse("events.{ aggregate_type }").expect("parses");
        assert_eq!(t.render(&fields()).as_deref(), Ok("events.order"));
        assert_eq!(t.prefix(), "events.");
        let t = Template::field("event_type").expect("parses");
        assert_eq!(t.render(&fields()).as_deref(), Ok("order.created"));
        assert!(t.has_placeholders());
        assert_eq!(t.prefix(), "");
    }

    #[test]
    fn braces_doubled_are_literal() {
        let t = Template::parse("a{{b}}.{id}").expect("parses");
        assert_eq!(t.render(&fields()).as_deref(), Ok("a{b}.7"));
        let t = Template::parse("plain{{x}}").expect("parses");
        assert!(!t.has_placeholders());
        assert_eq!(t.as_literal().as_deref(), Some("plain{x}"));
        assert!(!is_template("outbox"));
        assert!(!is_template("a{{b}}"));
        assert!(is_template("events.{aggregate_type}"));
    }

    #[test]
    fn a_missing_field_is_named() {
        let t = Template::parse("{aggregate_type}.{event_type}").expect("parses");
        let fields = Fields {
            aggregate_type: None,
            ..fields()
        };
        assert_eq!(t.render(&fields), Err(MissingField("aggregate_type")));
        let empty = Fields {
            aggregate_type: Some(""),
            ..fields
        };
        assert_eq!(t.render(&empty).as_deref(), Ok(".order.created"));
    }

    #[test]
    fn bad_templates_say_what_is_wrong() {
        for (text, expected) in [
            ("{tenant}", "not a field of the message contract"),
            ("{event_type", "without its `}`"),
            ("a}b", "without its `{`"),
            ("{}", "not a field"),
        ] {
            let error = Template::parse(text).expect_err(text);
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    proptest::proptest! {
        #[test]
        fn text_without_braces_is_its_own_literal(text in "[^{}]{0,40}") {
            let t = Template::parse(&text).expect("parses");
            proptest::prop_assert_eq!(t.as_literal(), Some(text.clone()));
        }
    }
}
