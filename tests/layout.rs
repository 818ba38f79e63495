//! The layout docs/architecture.md describes, checked from the source: no import circle among
//! the files of src/, and the AMQP client named only in src/publish/.
//!
//! The import graph is read the way a reader follows it: every `crate::…` and `super::…` path
//! in a file (comments and its `#[cfg(test)]` module left out) is an arrow to the file of the
//! longest module prefix it names. A circle means no file in it can be read or changed alone.

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

/// The code of a file without comments and without its test module.
fn code_of(text: &str) -> String {
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    code.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `code` with the contents of its string literals left out.
fn without_strings(code: &str) -> String {
    code.split('"').step_by(2).collect::<Vec<_>>().join("\"\"")
}

/// The paths `crate::a::b` / `super::a` a file names (brace groups expanded one level).
fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    for (root, skip) in [("crate::", 0usize), ("super::", 1)] {
        let mut rest = code;
        while let Some(at) = rest.find(root) {
            let before = rest[..at].chars().last();
            rest = &rest[at + root.len()..];
            if before.is_some_and(ident) {
                continue;
            }
            let mut base: Vec<String> = match skip {
                0 => Vec::new(),
                // `super` of `a/b.rs` is `a`; of `a/b/mod.rs` (module `a::b`) also `a`.
                _ => module[..module.len().saturating_sub(1)].to_vec(),
            };
            let segment: String = rest
                .chars()
                .take_while(|c| ident(*c) || *c == ':' || *c == '{' || *c == ',' || *c == ' ')
                .collect();
            let (head, group) = match segment.split_once('{') {
                Some((head, group)) => (head, Some(group)),
                None => (segment.as_str(), None),
            };
            base.extend(
                head.split("::")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string),
            );
            match group {
                None => paths.push(base),
                Some(group) => {
                    for item in group.split(',') {
                        let mut path = base.clone();
                        path.extend(
                            item.split("::")
                                .map(str::trim)
                                .filter(|s| !s.is_empty() && s.chars().all(ident))
                                .map(str::to_string),
                        );
                        paths.push(path);
                    }
                }
            }
        }
    }
    paths
}

/// file -> the files it imports.
fn import_graph() -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> =
        files.iter().map(|f| (module_of(f), f.clone())).collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let name = file.to_string_lossy();
        if name.ends_with("tests.rs") || name.contains("/tests/") || name == "main.rs" {
            continue;
        }
        let text = std::fs::read_to_string(src.join(file)).expect("read a source file");
        let module = module_of(file);
        let mut targets = BTreeSet::new();
        for path in named_paths(&code_of(&text), &module) {
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
    let graph = import_graph();
    assert!(graph.len() > 50, "read {} files only", graph.len());
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "import circles among the files of src/: {found:#?}"
    );
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
    let module = ["wal".to_string(), "stream".to_string()];
    let paths = named_paths(
        "use crate::publish::{Acked, Input};\nuse super::source::Source;",
        &module,
    );
    assert!(paths.contains(&vec!["publish".into(), "Acked".into()]));
    assert!(paths.contains(&vec!["wal".into(), "source".into(), "Source".into()]));
}

/// Only src/publish/ names lapin: everything else hands messages over in the contract's
/// terms (src/message.rs).
#[test]
fn only_publish_names_the_amqp_client() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &src, &mut files);
    let naming: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with("publish"))
        .filter(|f| {
            let text = std::fs::read_to_string(src.join(f)).expect("read a source file");
            // Outside string literals: a log filter may name lapin's target.
            without_strings(&code_of(&text)).contains("lapin::")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        naming.is_empty(),
        "lapin named outside src/publish/: {naming:?}"
    );
}
