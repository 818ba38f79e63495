//! The layout docs/architecture.md describes, checked from the source: no import circle among
//! the files of src/ nor of any other crate, the AMQP client named only in src/publish/ and
//! the shared crate's amqp.rs, the advice on errors and warnings ("Fix: …") written only in
//! src/advice.rs (and, for its two warnings, the shared crate's pg.rs), and no more untyped
//! configuration errors (`RelayError::Config(String)`) than are left.
//!
//! The import graph is read the way a reader follows it: every path a file names through
//! `crate::`, `self::`, `super::` or a child module's bare name, in its `use` items
//! (re-exports included) and anywhere in its code, is an arrow to the file of the longest
//! module prefix it names. Comments, string literals and `#[cfg(test)]` items are left out:
//! tests may import what they test. A circle means no file in it can be read or changed alone.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file below `dir`, as paths relative to src/.
fn rust_files(src: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(src, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.strip_prefix(src).expect("below src/").to_path_buf());
        }
    }
}

/// The module path of a file: `wal/stream.rs` is `wal::stream`, `wal/mod.rs` is `wal`.
fn module_of(file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `text` without its comments, and with its string and character literals emptied (`""`,
/// `' '`): a `//` inside a string is not a comment, and a path in a comment or a string (a
/// log filter may name lapin's target) is not an import.
fn without_comments_or_strings(text: &str) -> String {
    without_comments(text, |_| "\"\"".to_string())
}

/// `text` without its comments, each string literal replaced by what `literal` makes of its
/// content (as written, escapes included), and its character literals by `' '`.
fn without_comments(text: &str, mut literal: impl FnMut(String) -> String) -> String {
    let chars: Vec<char> = text.chars().collect();
    let starts = |i: usize, s: &str| {
        s.chars()
            .enumerate()
            .all(|(k, c)| chars.get(i + k) == Some(&c))
    };
    let mut code = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let after_ident = i > 0 && is_ident(chars[i - 1]);
        // A raw string: r"…", r#"…"#, br"…" (not the end of an identifier like `bar`).
        let raw = match after_ident {
            true => None,
            false => {
                let r = i + usize::from(chars[i] == 'b');
                let hashes = chars.iter().skip(r + 1).take_while(|c| **c == '#').count();
                (chars.get(r) == Some(&'r') && chars.get(r + 1 + hashes) == Some(&'"'))
                    .then_some((r, hashes))
            }
        };
        if let Some((r, hashes)) = raw {
            let close: String = std::iter::once('"')
                .chain("#".repeat(hashes).chars())
                .collect();
            i = r + 2 + hashes;
            let start = i;
            while i < chars.len() && !starts(i, &close) {
                i += 1;
            }
            let content = chars[start..i.min(chars.len())].iter().collect();
            i += close.len();
            code.push_str(&literal(content));
        } else if starts(i, "//") {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if starts(i, "/*") {
            // Block comments nest.
            let mut depth = 0;
            loop {
                if starts(i, "/*") {
                    depth += 1;
                    i += 2;
                } else if starts(i, "*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else if i >= chars.len() {
                    break;
                } else {
                    i += 1;
                }
            }
        } else if chars[i] == '"' {
            i += 1;
            let start = i;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            let content = chars[start..i.min(chars.len())].iter().collect();
            i += 1;
            code.push_str(&literal(content));
        } else if chars[i] == '\'' && chars.get(i + 1) == Some(&'\\') {
            // An escaped character ('\'', '\n', '\u{…}'): up to the next quote after the escape.
            i += 3;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            code.push_str("' '");
        } else if chars[i] == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
            code.push_str("' '");
        } else {
            // Anything else, a lifetime's quote included.
            code.push(chars[i]);
            i += 1;
        }
    }
    code
}

/// `code` without its `#[cfg(test)]` items (test modules, test-only functions and imports):
/// tests may import what they test. Code after them stays.
fn without_test_items(code: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let mut code = code.to_string();
    while let Some(at) = code.find(MARK) {
        let bytes = code.as_bytes();
        let mut end = at + MARK.len();
        let mut depth = 0usize;
        // The item ends at a `;` outside any bracket, or where its first `{…}` (or a
        // following attribute's `[…]`) closes at the outermost level.
        while end < bytes.len() {
            match bytes[end] {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' => depth = depth.saturating_sub(1),
                b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        break;
                    }
                }
                b';' if depth == 0 => break,
                _ => {}
            }
            end += 1;
        }
        code.replace_range(at..(end + 1).min(code.len()), "");
    }
    code
}

/// The code of a file as the import graph reads it.
fn code_of(text: &str) -> String {
    without_test_items(&without_comments_or_strings(text))
}

/// Identifiers, `::`, and single characters (whitespace dropped).
fn tokens(code: &str) -> Vec<&str> {
    let mut tokens = Vec::new();
    let mut rest = code;
    while let Some(c) = rest.chars().next() {
        let len = if is_ident(c) {
            rest.find(|c| !is_ident(c)).unwrap_or(rest.len())
        } else if rest.starts_with("::") {
            2
        } else {
            c.len_utf8()
        };
        if !c.is_whitespace() {
            tokens.push(&rest[..len]);
        }
        rest = &rest[len..];
    }
    tokens
}

/// The paths of one use tree at `tokens[*i..]` (`a::{b, c::{self, D}, e as f, g::*}`), each
/// as written after `prefix`.
fn use_tree(tokens: &[&str], i: &mut usize, prefix: &[String], paths: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match tokens.get(*i).copied() {
            Some("{") => {
                *i += 1;
                while !matches!(tokens.get(*i).copied(), Some("}") | None) {
                    use_tree(tokens, i, &path, paths);
                    if tokens.get(*i) == Some(&",") {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            Some("::") => *i += 1,
            // `x as y` names x; `x::*` names x.
            Some("as") => *i += 2,
            Some("*") => *i += 1,
            Some(segment) if segment.chars().all(is_ident) => {
                path.push(segment.to_string());
                *i += 1;
            }
            _ => break,
        }
    }
    paths.push(path);
}

/// The module a path names, from module `scope`: `crate::`, `self::`, `super::` (repeated),
/// or a child module of `scope` by its bare name; `None` for anything else (another crate,
/// a type, a local item).
fn resolve(
    path: &[String],
    scope: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let first = path.first()?;
    let (mut module, rest) = match first.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (scope.to_vec(), &path[1..]),
        "super" => {
            let supers = path.iter().take_while(|s| *s == "super").count();
            (
                scope[..scope.len().saturating_sub(supers)].to_vec(),
                &path[supers..],
            )
        }
        child if modules.contains(&[scope, &[child.to_string()]].concat()) => {
            (scope.to_vec(), path)
        }
        _ => return None,
    };
    // `a::{self, B}` names `a`.
    module.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(module)
}

/// The modules a file of module `module` names: in its `use` items (`pub use` re-exports
/// included, groups nested and over several lines) and in paths anywhere in its code, each
/// as an absolute module path plus what it names inside. Inline `mod x { … }` blocks are
/// followed, so that their `super::` and `self::` resolve from them.
fn named_paths(code: &str, module: &[String], modules: &BTreeSet<Vec<String>>) -> Vec<Vec<String>> {
    let tokens = tokens(code);
    let mut named = Vec::new();
    // The module being read, and the brace depth its block opened at (the file's: 0).
    let mut scopes = vec![(module.to_vec(), 0usize)];
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let scope = &scopes[scopes.len() - 1].0;
        let previous = i.checked_sub(1).map(|p| tokens[p]);
        match tokens[i] {
            "{" => depth += 1,
            "}" => {
                if scopes.len() > 1 && scopes[scopes.len() - 1].1 == depth {
                    scopes.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "mod" if tokens.get(i + 2) == Some(&"{") => {
                let inner = [scope.as_slice(), &[tokens[i + 1].to_string()]].concat();
                depth += 1;
                scopes.push((inner, depth));
                i += 3;
                continue;
            }
            "use" => {
                let end = tokens[i..]
                    .iter()
                    .position(|t| *t == ";")
                    .map_or(tokens.len(), |n| i + n);
                let mut paths = Vec::new();
                let mut at = i + 1;
                use_tree(&tokens[..end], &mut at, &[], &mut paths);
                named.extend(paths.iter().filter_map(|p| resolve(p, scope, modules)));
                i = end + 1;
                continue;
            }
            // The start of a path `a::b…` (not a method's `.a::<T>` nor the middle of one).
            first
                if first.chars().all(is_ident)
                    && tokens.get(i + 1) == Some(&"::")
                    && !matches!(previous, Some("::" | ".")) =>
            {
                let mut path = vec![first.to_string()];
                let mut at = i + 1;
                while tokens.get(at) == Some(&"::")
                    && tokens.get(at + 1).is_some_and(|t| t.chars().all(is_ident))
                {
                    path.push(tokens[at + 1].to_string());
                    at += 2;
                }
                if path.len() > 1 {
                    named.extend(resolve(&path, scope, modules));
                }
                i = at;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    named
}

/// file -> the files it imports, among the files of the source tree `src`.
fn import_graph(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    rust_files(src, src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> =
        files.iter().map(|f| (module_of(f), f.clone())).collect();
    let module_names: BTreeSet<Vec<String>> = modules.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let name = file.to_string_lossy();
        if name.ends_with("tests.rs") || name.contains("/tests/") || name == "main.rs" {
            continue;
        }
        let text = std::fs::read_to_string(src.join(file)).expect("read a source file");
        let module = module_of(file);
        let mut targets = BTreeSet::new();
        for path in named_paths(&code_of(&text), &module, &module_names) {
            let longest = (1..=path.len()).rev().find_map(|n| modules.get(&path[..n]));
            if let Some(target) = longest.filter(|target| *target != file) {
                targets.insert(target.clone());
            }
        }
        graph.insert(file.clone(), targets);
    }
    graph
}

/// The strongly connected components of more than one file (Tarjan).
fn circles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        graph: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        next: usize,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(state: &mut State<'a>, node: &'a PathBuf) {
        state.index.insert(node, state.next);
        state.low.insert(node, state.next);
        state.next += 1;
        state.stack.push(node);
        let targets = state.graph.get(node).into_iter().flatten();
        for target in targets {
            if !state.index.contains_key(target) {
                visit(state, target);
                let low = state.low[target].min(state.low[node]);
                state.low.insert(node, low);
            } else if state.stack.contains(&target) {
                let low = state.index[target].min(state.low[node]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(top) = state.stack.pop() {
                component.push(top.clone());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node) {
            visit(&mut state, node);
        }
    }
    state.found
}

#[test]
fn no_file_of_src_is_in_an_import_circle() {
    let graph = import_graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(graph.len() > 50, "read {} files only", graph.len());
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "import circles among the files of src/: {found:#?}"
    );
}

/// The workspace's other crates, each a tree of its own. crates/pgwire-replication is
/// upstream's code with a small patch (its PATCH.md), kept as upstream wrote it.
#[test]
fn no_file_of_another_crate_is_in_an_import_circle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let mut found = Vec::new();
    for name in [
        "outbox-bench",
        "outbox-common",
        "outbox-inbox",
        "outbox-testkit",
    ] {
        let graph = import_graph(&crates.join(name).join("src"));
        assert!(graph.len() > 3, "{name}: read {} files only", graph.len());
        found.extend(circles(&graph).into_iter().map(|circle| (name, circle)));
    }
    assert!(found.is_empty(), "import circles: {found:#?}");
}

/// The reader can fail: a graph with a circle in it is found.
#[test]
fn a_circle_is_found() {
    let mut graph = BTreeMap::new();
    let [a, b, c] = ["a.rs", "b.rs", "c.rs"].map(PathBuf::from);
    graph.insert(a.clone(), BTreeSet::from([b.clone()]));
    graph.insert(b.clone(), BTreeSet::from([c.clone()]));
    graph.insert(c.clone(), BTreeSet::from([a.clone()]));
    assert_eq!(circles(&graph), vec![vec![a, b, c]]);
    let paths = named(
        "use crate::publish::{Acked, Input};\nuse super::source::Source;",
        "wal::stream",
    );
    assert!(paths.contains(&"publish::Acked".into()), "{paths:?}");
    assert!(paths.contains(&"wal::source::Source".into()), "{paths:?}");
}

/// What a file of module `module` (`a::b`) names, each path as `a::b::C`, among the modules
/// `a`, `a::child`, `a::other`, `wal`, `wal::heartbeat`, `wal::source` and `config`.
fn named(code: &str, module: &str) -> Vec<String> {
    let split = |path: &str| -> Vec<String> { path.split("::").map(str::to_string).collect() };
    let modules = [
        "a",
        "a::child",
        "a::other",
        "wal",
        "wal::heartbeat",
        "wal::source",
        "config",
    ]
    .map(split)
    .into_iter()
    .collect();
    named_paths(&code_of(code), &split(module), &modules)
        .iter()
        .map(|path| path.join("::"))
        .collect()
}

/// A test module hides only itself: what follows it is read, and so is a file whose test
/// module is a block rather than a file.
#[test]
fn code_after_a_test_item_counts() {
    let paths = named(
        "use crate::wal::source::Source;\n\
         #[cfg(test)]\nmod tests;\n\
         use crate::config::Before;\n\
         #[cfg(test)]\nmod more {\n    use crate::a::Hidden;\n    fn f() { if x { crate::a::g() } }\n}\n\
         #[cfg(test)]\n#[allow(dead_code)]\nfn helper() -> [u8; 2] { crate::a::other::h() }\n\
         #[cfg(test)]\nuse crate::a::child::Hidden;\n\
         fn after() { crate::wal::heartbeat::emit(); }",
        "x",
    );
    assert_eq!(
        paths,
        [
            "wal::source::Source",
            "config::Before",
            "wal::heartbeat::emit"
        ]
    );
}

/// `self::`, a child module's bare name (in `use` and in code) and re-exports are arrows;
/// another crate, a type's path and a method's turbofish are not.
#[test]
fn self_child_and_reexport_paths_count() {
    let paths = named(
        "pub use child::*;\npub use self::other::Thing;\n\
         fn f() { child::go(); std::mem::take(x); Thing::new(); v.child::<u8>(); }",
        "a",
    );
    assert_eq!(paths, ["a::child", "a::other::Thing", "a::child::go"]);
    // Inside an inline module, `super::` is the file's module.
    let paths = named("pub mod headers { use super::child::X; }", "a");
    assert_eq!(paths, ["a::child::X"]);
}

/// `use` groups may span lines and nest; `self` in a group names its prefix, `as` and `*`
/// name what precedes them.
#[test]
fn use_groups_over_lines_and_nested_count() {
    let paths = named(
        "use crate::{\n    wal::{heartbeat::{self, Heartbeat},\n        source::Source},\n    config as c,\n    a::child::*,\n};",
        "x",
    );
    assert_eq!(
        paths,
        [
            "wal::heartbeat",
            "wal::heartbeat::Heartbeat",
            "wal::source::Source",
            "config",
            "a::child",
        ]
    );
}

/// A `//` inside a string is not a comment, and paths inside strings, comments and raw
/// strings are not imports.
#[test]
fn strings_are_read_before_comments() {
    let paths = named(
        "let url = \"http://crate::wal::x\"; use crate::config::Shown;\n\
         // use crate::a::Commented;\n/* crate::a::Block /* nested */ crate::a::Still */\n\
         let q = '\"'; let raw = r#\"crate::a::Raw // \"#; fn f<'a>(x: &'a str) { crate::a::other::y() }",
        "x",
    );
    assert_eq!(paths, ["config::Shown", "a::other::y"]);
}

/// Only the broker's own files name lapin: the connection and its translation of a message
/// (`publish/broker.rs`, `publish/outgoing.rs`), and the choice of a connection
/// (`publish/nodes.rs`); its opening, the inbox's too, is the shared crate's (`amqp.rs`, see
/// the next test). Everything else, delivery and its queue and dead letters included, handles
/// messages in the contract's terms (src/contract/message.rs).
#[test]
fn only_the_broker_names_the_amqp_client() {
    let allowed = [
        "publish/broker.rs",
        "publish/outgoing.rs",
        "publish/nodes.rs",
    ];
    let naming = files_where("src", 50, &allowed, names_lapin);
    assert!(
        naming.is_empty(),
        "lapin named outside the broker's files {allowed:?}: {naming:?}"
    );
}

/// In the crate the relay and the inbox share, only `amqp.rs` (opening a connection) names
/// lapin: the rest serves a process that may not talk to a broker at all.
#[test]
fn only_amqp_names_the_amqp_client_in_the_shared_crate() {
    let naming = files_where("crates/outbox-common/src", 5, &[], names_lapin);
    assert_eq!(naming, ["amqp.rs"], "lapin named outside amqp.rs");
}

/// Whether a file's code names lapin: outside string literals, since a log filter may name
/// lapin's target.
fn names_lapin(text: &str) -> bool {
    code_of(text).contains("lapin::")
}

/// The files below `dir` (from the repository's root; more than `more_than` of them, or the
/// reader is lost), but `except` and files that are all tests, whose text `holds` for: their
/// paths relative to `dir`, sorted.
fn files_where(
    dir: &str,
    more_than: usize,
    except: &[&str],
    holds: fn(&str) -> bool,
) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files = Vec::new();
    rust_files(&src, &src, &mut files);
    assert!(
        files.len() > more_than,
        "{dir}: read {} files only",
        files.len()
    );
    let mut found: Vec<String> = files
        .iter()
        .filter(|f| !except.iter().any(|e| Path::new(e) == f.as_path()) && !is_test_file(f))
        .filter(|f| holds(&std::fs::read_to_string(src.join(f)).expect("read a source file")))
        .map(|f| f.display().to_string())
        .collect();
    found.sort();
    found
}

/// The string literals of a file's code, as written (escapes included), without those in
/// comments and in `#[cfg(test)]` items (a test may assert on the advice it reads).
fn literals_outside_tests(text: &str) -> Vec<String> {
    let mut literals = Vec::new();
    // Each literal stands in the code as its number, so that the literals the test items
    // hide can be told from those that stay.
    let code = without_comments(text, |content| {
        literals.push(content);
        format!("\"{}\"", literals.len() - 1)
    });
    without_test_items(&code)
        .split('"')
        .skip(1)
        .step_by(2)
        .filter_map(|number| number.parse::<usize>().ok())
        .map(|number| literals[number].clone())
        .collect()
}

/// A file that is all tests (`tests.rs`, or below a `tests/` folder).
fn is_test_file(file: &Path) -> bool {
    let name = file.to_string_lossy();
    name.ends_with("tests.rs") || name.contains("tests/")
}

/// What to do about an error or a warning is src/advice.rs's to say, behind a typed error
/// (`ConfigProblem`, `MapProblem`, a `RelayError` variant) or an `advice::Warning`: a "Fix:"
/// written anywhere else would be advice no one finds, checks or quotes like the rest.
#[test]
fn only_advice_writes_a_fix() {
    // The reader is not blind: it finds the advice where it is.
    let writing = files_where("src", 50, &[], writes_a_fix);
    assert_eq!(
        writing,
        ["advice.rs"],
        "\"Fix:\" written outside src/advice.rs (give the error a typed variant, or the warning \
         an advice::Warning, and its fix in src/advice.rs)"
    );
}

/// The shared crate has no advice module of its own: only its connections (`pg.rs`) write a
/// "Fix:", for the two warnings they give (keepalive parameters in the URL, a connection
/// without a verified certificate); its errors leave the fix to the relay's advice.
#[test]
fn only_the_shared_connections_write_a_fix_in_the_shared_crate() {
    let writing = files_where("crates/outbox-common/src", 5, &[], writes_a_fix);
    assert_eq!(writing, ["pg.rs"], "\"Fix:\" written outside pg.rs");
}

/// Whether a file's code (its tests left out) writes a "Fix:" in a string literal.
fn writes_a_fix(text: &str) -> bool {
    literals_outside_tests(text)
        .iter()
        .any(|literal| literal.contains("Fix:"))
}

/// The reader can fail: a "Fix:" in a string literal is found, in a format string, an
/// attribute or a raw string alike; one in a comment or a test is not.
#[test]
fn a_fix_in_code_is_found() {
    let literals = literals_outside_tests(
        "// Fix: in a comment\n\
         fn f() -> String { format!(\"{x}. Fix: y\") }\n\
         #[error(\"a. Fix: b\")]\nX,\n\
         #[cfg(test)]\nmod tests { fn t() { assert!(s.contains(\"Fix:\")); } }\n\
         const R: &str = r#\"raw \"Fix:\" \"#;\n\
         const C: char = '\"'; const PLAIN: &str = \"no advice\";",
    );
    assert_eq!(
        literals,
        ["{x}. Fix: y", "a. Fix: b", "raw \"Fix:\" ", "no advice"]
    );
}

/// The files of src/ that still make an untyped configuration error
/// (`RelayError::Config(text)`), and how many times: parsers of one flag each, whose own
/// words say what is wrong and which have no advice to give. A new configuration error is a
/// typed `ConfigProblem` (its fix, if any, in src/advice.rs): these may go, none may be added.
const UNTYPED_CONFIG_ERRORS: &[(&str, usize)] = &[
    // The mapper's own check of the exchange and the routing key's field.
    ("assembly.rs", 1),
    // --column and --header-column.
    ("config/names.rs", 1),
    // --since.
    ("ops/resync.rs", 1),
];

/// How many times `text` names `RelayError::Config` in its code (comments, strings and
/// `#[cfg(test)]` items left out).
fn untyped_config_errors(text: &str) -> usize {
    let code = code_of(text);
    tokens(&code)
        .windows(3)
        .filter(|path| *path == ["RelayError", "::", "Config"])
        .count()
}

#[test]
fn untyped_configuration_errors_do_not_grow() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &src, &mut files);
    let allowed: BTreeMap<PathBuf, usize> = UNTYPED_CONFIG_ERRORS
        .iter()
        .map(|(file, count)| (PathBuf::from(file), *count))
        .collect();
    let mut found = BTreeMap::new();
    for file in files.iter().filter(|f| !is_test_file(f)) {
        let text = std::fs::read_to_string(src.join(file)).expect("read a source file");
        let count = untyped_config_errors(&text);
        if count > 0 {
            found.insert(file.clone(), count);
        }
    }
    let grown: Vec<String> = found
        .iter()
        .filter(|(file, count)| **count > allowed.get(*file).copied().unwrap_or(0))
        .map(|(file, count)| format!("{}: {count}", file.display()))
        .collect();
    assert!(
        grown.is_empty(),
        "untyped RelayError::Config beyond {UNTYPED_CONFIG_ERRORS:?} (make it a ConfigProblem \
         variant instead): {grown:?}"
    );
    // The reader is not blind: the sites that are left are found.
    assert!(!found.is_empty(), "no RelayError::Config found at all");
}

/// The count can fail: a constructor and a function path both count, a typed problem, a
/// comment, a string and a test do not.
#[test]
fn an_untyped_configuration_error_is_counted() {
    let text = "fn a() -> R { Err(RelayError::Config(format!(\"x\"))) }\n\
                fn b() -> R { parse().map_err(RelayError::Config) }\n\
                fn c() -> R { Err(ConfigProblem::NoAmqpUrl.into()) }\n\
                // RelayError::Config(in a comment)\n\
                const S: &str = \"RelayError::Config(\";\n\
                #[cfg(test)]\nmod tests { fn t() { RelayError::Config(\"t\".into()); } }";
    assert_eq!(untyped_config_errors(text), 2);
}

/// The `mod` items of tests/main.rs.
fn modules_of_main(main: &str) -> BTreeSet<String> {
    main.lines()
        .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

/// tests/ builds one binary (`autotests = false`): a file that tests/main.rs does not name is
/// never compiled, and its tests never run.
#[test]
fn every_test_file_is_a_module_of_main() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let main = std::fs::read_to_string(tests.join("main.rs")).expect("read tests/main.rs");
    let declared = modules_of_main(&main);
    let files: BTreeSet<String> = std::fs::read_dir(&tests)
        .expect("read tests/")
        .map(|entry| entry.expect("tests/ entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .filter_map(|path| Some(path.file_stem()?.to_str()?.to_string()))
        .filter(|stem| stem != "main")
        .collect();
    assert!(files.len() > 10, "tests/ read as {files:?}");
    let missing: Vec<_> = files.difference(&declared).collect();
    assert!(
        missing.is_empty(),
        "tests/main.rs does not declare: {missing:?}"
    );
    let stale: Vec<_> = declared.difference(&files).collect();
    assert!(
        stale.is_empty(),
        "tests/main.rs declares missing files: {stale:?}"
    );
}

/// The check can fail: an undeclared module is not read as declared.
#[test]
fn a_test_file_missing_from_main_is_found() {
    let declared = modules_of_main("//! mod doc;\nmod wal;\n// mod poll;\nmod faults;\n");
    assert_eq!(declared, BTreeSet::from(["wal".into(), "faults".into()]));
}
