//! SQL text: names and literals quoted for the statements the relay and the inbox run and for
//! the SQL the relay's advice prints. Below every module that writes SQL, so that none depends
//! on another for it.

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
