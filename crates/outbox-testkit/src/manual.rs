//! The manual's pages read as a user reads them: sections, fenced code blocks and the shell
//! commands in them, so tests run what the pages show instead of a copy of it.

use std::path::{Path, PathBuf};

/// The checkout's root (the workspace's, where README.md and docs/ are).
pub fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the kit sits two levels under the checkout")
        .to_path_buf()
}

/// The text of `page` (a path under the checkout, e.g. `docs/polling.md`).
pub fn page(page: &str) -> String {
    let path = checkout().join(page);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The text of `page`'s `### <heading…>` section, up to the next heading of level 2 or 3.
pub fn section(page_path: &str, heading: &str) -> String {
    let text = page(page_path);
    let start = text
        .find(&format!("\n### {heading}"))
        .unwrap_or_else(|| panic!("no section \"### {heading}\" in {page_path}"));
    let body = &text[start + 1..];
    let end = body[4..]
        .find("\n## ")
        .into_iter()
        .chain(body[4..].find("\n### "))
        .min()
        .map_or(body.len(), |at| at + 4);
    body[..end].to_string()
}

/// The contents of the code blocks of `text` fenced as ```` ```lang ````, in order.
pub fn blocks(text: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        match &mut current {
            None if trimmed == format!("```{lang}") => current = Some(String::new()),
            Some(_) if trimmed == "```" => out.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    out
}

/// Shell words of one command line: whitespace-separated, single and double quotes taken
/// literally (no escapes or expansions: the pages use none), `#` starting a comment.
pub fn shell_words(line: &str) -> Vec<String> {
    command_lines(line).into_iter().next().unwrap_or_default()
}

/// The commands of a shell script as their words: a newline ends a command unless it is
/// inside quotes or after a `\`; quotes are taken literally (the pages use no escapes or
/// expansions inside them); `#` at the start of a word comments out the rest of the line.
fn command_lines(script: &str) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    let mut comment = false;
    let mut chars = script.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (_, '\n') if comment => {
                comment = false;
                words.extend(word.take());
                commands.push(std::mem::take(&mut words));
            }
            _ if comment => {}
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, '\\') if chars.peek() == Some(&'\n') => {
                chars.next();
                words.extend(word.take());
            }
            (None, '\n') => {
                words.extend(word.take());
                commands.push(std::mem::take(&mut words));
            }
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, '#') if word.is_none() => comment = true,
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    assert!(quote.is_none(), "unclosed quote in {script:?}");
    words.extend(word);
    commands.push(words);
    commands.retain(|words| !words.is_empty());
    commands
}

/// The command lines of `text`'s `sh` blocks, each as its shell words (comments and blank
/// lines dropped).
pub fn sh_commands(text: &str) -> Vec<Vec<String>> {
    blocks(text, "sh")
        .iter()
        .flat_map(|block| command_lines(block))
        .collect()
}

/// Every `program …` command of `text`'s `sh` blocks, as its arguments (the program name
/// dropped; `target/release/program` counts as `program`).
pub fn commands_of(text: &str, program: &str) -> Vec<Vec<String>> {
    sh_commands(text)
        .into_iter()
        .filter_map(|words| {
            let (first, rest) = words.split_first()?;
            (first.rsplit('/').next() == Some(program)).then(|| rest.to_vec())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readers_split_blocks_and_shell_words_as_a_shell_would() {
        assert_eq!(
            shell_words("outbox-relay run --routing-key '{event_type}' --column created_at= # why"),
            [
                "outbox-relay",
                "run",
                "--routing-key",
                "{event_type}",
                "--column",
                "created_at="
            ]
        );
        assert_eq!(
            sh_commands(
                "```sh\nrabbitmqctl p '^o$' \\\n  '{\"a\": 1,\n   \"b\": 2}' \\\n  --x\nls\n```\n"
            ),
            [
                vec!["rabbitmqctl", "p", "^o$", "{\"a\": 1,\n   \"b\": 2}", "--x"],
                vec!["ls"]
            ]
        );
        let section = "### X\n\n```sh\noutbox-relay setup --table t \\\n  --column a=b\n\
                       export Y=1\ntarget/release/outbox-relay run &\n```\n";
        assert_eq!(
            commands_of(section, "outbox-relay"),
            [
                vec!["setup", "--table", "t", "--column", "a=b"],
                vec!["run", "&"]
            ]
        );
        assert_eq!(blocks("```sql\nSELECT 1;\n```\n", "sql"), ["SELECT 1;\n"]);
    }
}
