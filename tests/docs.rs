//! The manual's references hold: every relative link of README.md and docs/ names a file
//! that exists and, with `#anchor`, a heading of it; every section a source file, SQL file,
//! script or page names by title (`docs/operations.md, "The least-privilege role"`) is a
//! heading of that page. Pure: reads the checkout only.

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
