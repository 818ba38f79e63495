//! SQL text: names and literals quoted for statements the relay runs and for the SQL its
//! advice prints. Below every module that writes SQL, the connections' (`db`) and the
//! advice's (`advice`) alike, so that neither depends on the other for it.

/// Quotes an identifier for SQL text (names come from configuration, not from users, but a
/// schema-qualified or mixed-case name must still survive).
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a string literal for SQL text.
pub fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }
}
