//! The manual's references hold: every relative link of README.md and docs/ names a file
//! that exists and, with `#anchor`, a heading of it; every section a source file, SQL file,
//! script or page names by title (`docs/operations.md, "The least-privilege role"`) is a
//! heading of that page; every message docs/troubleshooting.md quotes is text the relay's
//! source prints. Pure: reads the checkout only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Files under `dir` whose names end with one of `extensions`, recursively; `target`,
/// `.git` and the fuzzers' output are not the project's text.
fn files(dir: &Path, extensions: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | ".git" | "out" | "node_modules") {
                files(&path, extensions, out);
            }
        } else if extensions.iter().any(|e| name.ends_with(e)) {
            out.push(path);
        }
    }
}

/// The lines of a Markdown text outside its code fences (and not the fences themselves).
fn outside_fences(markdown: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    markdown.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The headings of a Markdown text outside code fences, as written (`#`s and spaces off).
fn headings(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in outside_fences(markdown) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            out.push(line[hashes..].trim().to_string());
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces
/// to `-`; a repeated anchor gets `-1`, `-2`, ….
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for heading in headings(markdown) {
        let slug: String = heading
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// A heading as a title is quoted: without the Markdown code marks, lower case.
fn title(text: &str) -> String {
    text.replace('`', "").trim().to_lowercase()
}

/// The titles a page's sections go by: its headings and the bold leads of its paragraphs
/// and list items (`**Phantom events.** Without …`), as [`title`]s.
fn titles(markdown: &str) -> BTreeSet<String> {
    let leads = markdown.lines().filter_map(|line| {
        let line = line.trim_start();
        let line = line.strip_prefix("- ").unwrap_or(line);
        let lead = line.strip_prefix("**")?;
        let lead = &lead[..lead.find("**")?];
        Some(lead.trim_end_matches(['.', ':']).to_string())
    });
    headings(markdown)
        .into_iter()
        .chain(leads)
        .map(|t| title(&t))
        .collect()
}

/// Every `[text](target)` of a Markdown text outside code fences.
fn links(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in outside_fences(markdown) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            out.push(rest[..end].trim().to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// What is wrong with `target`, a link in `from`: `None` when it holds.
fn broken_link(from: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        from.to_path_buf()
    } else {
        from.parent().unwrap_or(Path::new(".")).join(path)
    };
    if !file.exists() {
        return Some(format!("no file {}", file.display()));
    }
    let anchor = anchor?;
    if file.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    (!anchors(&text).contains(anchor)).then(|| format!("no heading #{anchor} in {path}"))
}

#[test]
fn every_relative_link_names_a_file_and_heading_that_exist() {
    let root = repo();
    let mut pages = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    files(&root.join("docs"), &[".md"], &mut pages);
    files(&root.join("crates"), &[".md"], &mut pages);
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("read a page");
        for target in links(&text) {
            if let Some(problem) = broken_link(page, &target) {
                let page = page.strip_prefix(&root).unwrap_or(page);
                broken.push(format!("{}: ({target}): {problem}", page.display()));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// Every `<page>.md, "<Title>"` (or `<page>.md "<Title>"`) in `text`: (page, title).
fn section_references(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(".md") {
        let before = &rest[..at];
        let start = before
            .rfind(|c: char| !(c.is_alphanumeric() || matches!(c, '/' | '-' | '_' | '.')))
            .map_or(0, |i| i + 1);
        let page = format!("{}.md", &before[start..]);
        let after = &rest[at + 3..];
        let quoted = after
            .strip_prefix(", \"")
            .or_else(|| after.strip_prefix(" \""))
            .or_else(|| after.strip_prefix(",\n// \""));
        if let Some(quoted) = quoted {
            if let Some(end) = quoted.find('"') {
                let name = &quoted[..end];
                if !name.contains('\n') && !name.is_empty() {
                    out.push((page, name.to_string()));
                }
            }
        }
        rest = after;
    }
    out
}

#[test]
fn every_section_named_by_its_title_is_a_heading_of_its_page() {
    let root = repo();
    let mut sources = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    for dir in [
        "src", "crates", "tests", "sql", "scripts", "docs", ".ci", "fuzz",
    ] {
        files(
            &root.join(dir),
            &[".rs", ".sql", ".sh", ".md", ".toml", ".yml", ".json"],
            &mut sources,
        );
    }
    let mut missing = Vec::new();
    let mut checked = 0;
    for source in &sources {
        // This file's own examples name no real section.
        if source.ends_with("tests/docs.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(source) else {
            continue;
        };
        for (page, name) in section_references(&text) {
            // A bare page name is one of docs/ (how the pages name each other).
            let file = [root.join(&page), root.join("docs").join(&page)]
                .into_iter()
                .find(|f| f.is_file());
            let Some(file) = file else {
                missing.push(format!(
                    "{}: {page}, \"{name}\": no such page",
                    source.strip_prefix(&root).unwrap_or(source).display()
                ));
                continue;
            };
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            checked += 1;
            if !titles(&text).contains(&title(&name)) {
                missing.push(format!(
                    "{}: {page}, \"{name}\": no such heading",
                    source.strip_prefix(&root).unwrap_or(source).display()
                ));
            }
        }
    }
    assert!(checked > 0, "the checker found no reference to check");
    assert!(
        missing.is_empty(),
        "{} of {checked} sections named by title are not headings of their page:\n{}",
        missing.len(),
        missing.join("\n")
    );
}

#[test]
fn the_checkers_catch_a_missing_anchor_and_a_missing_title() {
    let page = "# Dead peers: what a vanished host costs\n\n## Dead peers\n\n## Dead peers\n";
    let found = anchors(page);
    for anchor in [
        "dead-peers-what-a-vanished-host-costs",
        "dead-peers",
        "dead-peers-1",
    ] {
        assert!(found.contains(anchor), "{anchor} in {found:?}");
    }
    assert!(!found.contains("dead-peers-2"), "{found:?}");
    assert_eq!(
        links("see [a](b.md#c) and [d](https://e/f) and [g](#h)"),
        ["b.md#c", "https://e/f", "#h"]
    );
    assert_eq!(
        section_references("(docs/operations.md, \"The least-privilege role\") and x.md \"Y\""),
        [
            (
                "docs/operations.md".to_string(),
                "The least-privilege role".to_string()
            ),
            ("x.md".to_string(), "Y".to_string())
        ]
    );
    assert!(section_references("docs/testing.md, invariant 5").is_empty());
    let page =
        "## `max_slot_wal_keep_size`\n\n**Phantom events.** Without it…\n- **Dead letters:** …\n";
    assert_eq!(
        titles(page),
        BTreeSet::from([
            "max_slot_wal_keep_size".to_string(),
            "phantom events".to_string(),
            "dead letters".to_string()
        ])
    );
}

/// The claim docs/polling.md shows takes the default batch size.
#[test]
fn the_polling_page_shows_the_default_batch_size() {
    let text = std::fs::read_to_string(repo().join("docs/polling.md")).expect("polling.md");
    let limit = text
        .lines()
        .find(|line| line.contains("-- --batch-size"))
        .and_then(|line| line.split("LIMIT").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("a `LIMIT n -- --batch-size` line in docs/polling.md");
    assert_eq!(
        limit,
        outbox_relay::internals::DEFAULT_POLL_BATCH_SIZE.to_string(),
        "docs/polling.md's claim shows LIMIT {limit}"
    );
}

/// The page whose quoted messages [`every_message_the_troubleshooting_page_quotes_is_the_relays`]
/// checks.
const TROUBLESHOOTING: &str = "docs/troubleshooting.md";

/// The shortest fragment of a quoted message that is checked: a shorter one ("(table OID")
/// would be found in the source whatever the message said.
const MIN_FRAGMENT: usize = 12;

/// The most characters a placeholder of the source (`{slot}`, `{}`) stands for inside a
/// fragment: a name or a number the page wrote out ("4" for `{SENDER_TIMEOUT_PEERS}`).
const MAX_PLACEHOLDER: usize = 40;

/// The messages a page quotes: every non-empty line of its ```` ```text ```` blocks.
fn quoted_messages(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_text = false;
    let mut fenced = false;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            in_text = !fenced && info.trim() == "text";
            fenced = !fenced;
            continue;
        }
        if in_text && !line.trim().is_empty() {
            out.push(line.trim().to_string());
        }
    }
    out
}

/// The parts of a quoted message the source must hold: the text between its `…`s, without
/// the spaces and colons at either end (the relay joins an error to its cause with ": "), and
/// at least [`MIN_FRAGMENT`] characters long.
fn fragments(message: &str) -> Vec<&str> {
    message
        .split('…')
        .map(|part| part.trim_matches(|c: char| c.is_whitespace() || c == ':'))
        .filter(|part| part.chars().count() >= MIN_FRAGMENT)
        .collect()
}

/// The string literals of a Rust source, as the program sees them: escapes decoded, a line
/// continuation (`\` at a line's end) joined without the next line's indentation. Comments,
/// character literals and lifetimes are skipped; raw strings are read as written.
fn string_literals(source: &str) -> Vec<String> {
    let chars: Vec<char> = source.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && at(i + 1) == '/') {
                i += 1;
            }
            i += 2;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{2026}') or a lifetime ('a).
            if at(i + 1) == '\\' {
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if c == 'r'
            && (i == 0
                || !ident(chars[i - 1])
                || (chars[i - 1] == 'b' && (i < 2 || !ident(chars[i - 2]))))
            && matches!(at(i + 1), '"' | '#')
        {
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            let open = i + 1 + hashes;
            if at(open) != '"' {
                i += 1; // a raw identifier (r#type)
                continue;
            }
            let closing: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let mut j = open + 1;
            while j < chars.len() && !chars[j..].starts_with(&closing) {
                j += 1;
            }
            out.push(chars[open + 1..j.min(chars.len())].iter().collect());
            i = j + closing.len();
        } else if c == '"' {
            let mut literal = String::new();
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                if chars[j] != '\\' {
                    literal.push(chars[j]);
                    j += 1;
                    continue;
                }
                let escaped = at(j + 1);
                j += 2;
                match escaped {
                    '\n' | '\r' => {
                        while j < chars.len() && chars[j].is_whitespace() {
                            j += 1;
                        }
                    }
                    'n' => literal.push('\n'),
                    't' => literal.push('\t'),
                    'r' => literal.push('\r'),
                    '0' => literal.push('\0'),
                    'x' => {
                        let digits: String = chars[j..(j + 2).min(chars.len())].iter().collect();
                        j += 2;
                        let code = u32::from_str_radix(&digits, 16).unwrap_or(0xfffd);
                        literal.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                    }
                    'u' => {
                        let digits: String = chars[j..]
                            .iter()
                            .skip(1)
                            .take_while(|&&c| c != '}')
                            .collect();
                        j += digits.chars().count() + 2;
                        let code = u32::from_str_radix(&digits, 16).unwrap_or(0xfffd);
                        literal.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                    }
                    other => literal.push(other),
                }
            }
            out.push(literal);
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// A literal split at its format placeholders (`{slot}`, `{}`, `{0}`, `{reason:?}`), with
/// `{{` and `}}` read as the braces they print: the text between the placeholders.
fn pieces(literal: &str) -> Vec<String> {
    let mut pieces = vec![String::new()];
    let mut chars = literal.chars().peekable();
    while let Some(c) = chars.next() {
        let doubled = matches!(c, '{' | '}') && chars.peek() == Some(&c);
        if doubled {
            chars.next();
        } else if c == '{' {
            let inside: String = chars.clone().take_while(|&c| c != '}').collect();
            let closes = chars.clone().nth(inside.chars().count()) == Some('}');
            let spec = |c: char| c.is_alphanumeric() || "_.:?#<>+-".contains(c);
            if closes && inside.chars().all(spec) {
                for _ in 0..=inside.chars().count() {
                    chars.next();
                }
                pieces.push(String::new());
                continue;
            }
        }
        pieces.last_mut().expect("one piece at least").push(c);
    }
    pieces
}

/// Whether `fragment` runs across placeholders of a literal (its [`pieces`]), each standing
/// for up to [`MAX_PLACEHOLDER`] characters of it; it begins and ends in the literal's own
/// text. (A fragment within one piece is found by `contains`.)
fn spans(fragment: &str, pieces: &[String]) -> bool {
    pieces.iter().enumerate().any(|(n, piece)| {
        piece.char_indices().any(|(start, _)| {
            fragment
                .strip_prefix(&piece[start..])
                .is_some_and(|rest| continues(rest, &pieces[n + 1..]))
        })
    })
}

/// Whether `rest` is a placeholder's value, then the beginning of `pieces[0]` (or all of it,
/// and the same again with the pieces after it).
fn continues(rest: &str, pieces: &[String]) -> bool {
    let Some((piece, later)) = pieces.split_first() else {
        return false;
    };
    rest.char_indices()
        .take(MAX_PLACEHOLDER + 1)
        .any(|(at, _)| {
            let after = &rest[at..];
            piece.starts_with(after)
                || after
                    .strip_prefix(piece.as_str())
                    .is_some_and(|more| !more.is_empty() && continues(more, later))
        })
}

/// What is wrong with the messages quoted in `markdown`, against the literals of the source
/// (each as its [`pieces`]): one line per fragment no literal holds, or per message with no
/// fragment long enough to check.
fn misquoted(markdown: &str, literals: &[Vec<String>]) -> Vec<String> {
    let mut wrong = Vec::new();
    for message in quoted_messages(markdown) {
        let parts = fragments(&message);
        if parts.is_empty() {
            wrong.push(format!(
                "{message}\n    has no fragment of {MIN_FRAGMENT} characters to check"
            ));
        }
        for part in parts {
            // Most fragments lie within one piece: look for those first, in every literal.
            let within = |pieces: &Vec<String>| pieces.iter().any(|p| p.contains(part));
            if !literals.iter().any(within) && !literals.iter().any(|p| spans(part, p)) {
                wrong.push(format!("{message}\n    no source literal holds {part:?}"));
            }
        }
    }
    wrong
}

/// Every message docs/troubleshooting.md quotes is one the relay prints. The page quotes
/// messages one per line in ```` ```text ```` blocks, as the relay prints their fixed part,
/// with `…` (U+2026) where a name, a number or a server's own words go. Split at the `…`s,
/// each fragment of [`MIN_FRAGMENT`] characters or more must be text of a string literal under
/// src/ or crates/outbox-common/src/ (escapes and line continuations read as the compiler does,
/// `{{` as `{`), where a placeholder of the literal (`{slot}`, `{}`) may stand for a short
/// value the page wrote out. A reworded message, or one the code no longer prints, fails here
/// naming the message and its fragment.
#[test]
fn every_message_the_troubleshooting_page_quotes_is_the_relays() {
    let root = repo();
    let mut sources = Vec::new();
    files(&root.join("src"), &[".rs"], &mut sources);
    files(
        &root.join("crates/outbox-common/src"),
        &[".rs"],
        &mut sources,
    );
    let literals: Vec<Vec<String>> = sources
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|text| string_literals(&text))
        .map(|literal| pieces(&literal))
        .collect();
    let page = std::fs::read_to_string(root.join(TROUBLESHOOTING)).expect("troubleshooting.md");
    let quoted = quoted_messages(&page).len();
    assert!(quoted >= 20, "{TROUBLESHOOTING} quotes {quoted} messages");
    let wrong = misquoted(&page, &literals);
    assert!(
        wrong.is_empty(),
        "{} of the messages {TROUBLESHOOTING} quotes are not the relay's:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn the_message_checker_reads_literals_as_the_compiler_does() {
    let source = r##"
        // "a comment's quote is no literal"
        fn f<'a>(x: &'a str) -> char {
            let q = '"';
            error!("The replication slot \"{slot}\" was invalidated ({}), so messages \
                    committed after {confirmed_flush} may be missing");
            let raw = r#"a "raw" {{literal}}"#;
            '\''
        }
    "##;
    let literals = string_literals(source);
    assert_eq!(
        literals,
        [
            "The replication slot \"{slot}\" was invalidated ({}), so messages committed after \
             {confirmed_flush} may be missing",
            "a \"raw\" {{literal}}",
        ]
    );
    assert_eq!(
        pieces(&literals[0]),
        [
            "The replication slot \"",
            "\" was invalidated (",
            "), so messages committed after ",
            " may be missing"
        ]
    );
    assert_eq!(pieces(&literals[1]), ["a \"raw\" {literal}"]);
    let literals: Vec<Vec<String>> = literals.iter().map(|l| pieces(l)).collect();
    let page = "```text\nThe replication slot \"…\" was invalidated (…), so messages committed \
                after 0/16B3748 may be missing\n```\n";
    assert!(
        misquoted(page, &literals).is_empty(),
        "{:?}",
        misquoted(page, &literals)
    );
    let reworded = "```text\nThe replication slot \"…\" was dropped (…), so messages committed \
                    after … may be missing\n```\n";
    let wrong = misquoted(reworded, &literals);
    assert_eq!(wrong.len(), 1, "{wrong:?}");
    assert!(wrong[0].contains("\" was dropped ("), "{wrong:?}");
    // A placeholder stands for a short value only, and the fragment must end in the text.
    let long = format!(
        "```text\nThe replication slot \"{}\" was invalidated\n```\n",
        "x".repeat(MAX_PLACEHOLDER + 1)
    );
    assert_eq!(misquoted(&long, &literals).len(), 1);
    assert_eq!(fragments("PostgreSQL error: …"), ["PostgreSQL error"]);
    assert!(fragments("(table OID …)").is_empty());
}
