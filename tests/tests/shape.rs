//! The codebase's shape, checked: no module imports one that imports it back (through any
//! chain), and no source file's code (before its tests) is over ~600 lines. Read from the
//! sources, so a new cycle or an overgrown file fails here rather than in review.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose modules are checked, as (name, `src` directory).
const CRATES: [&str; 5] = ["operator", "gateway", "sandbox", "cli", "crds"];

/// Code lines (before `#[cfg(test)]`) a source file may have.
const MAX_CODE_LINES: usize = 650;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file's module path under `src`: `rollout/controller/mod.rs` → `[rollout, controller]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|p| p == "mod" || p == "lib" || p == "main")
    {
        parts.pop();
    }
    parts
}

/// A file's text before its tests.
fn before_tests(text: &str) -> &str {
    text.split("#[cfg(test)]").next().unwrap_or_default()
}

/// The code of a file before its tests, without comment lines.
fn code(text: &str) -> Vec<&str> {
    before_tests(text)
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect()
}

/// `crate::a::b` and `super::super::c` paths in `text`, with `{a, b::c}` groups expanded.
fn paths(text: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(start).map(|a| a + from) {
            from = at + start.len();
            let before = text[..at].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            expand(&text[at..], &[], &mut found);
        }
    }
    found
}

/// The path at the start of `text` (after `prefix`), each `{...}` group item as its own path.
fn expand(text: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(text.len());
    let mut path = prefix.to_vec();
    path.extend(
        text[..end]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(String::from),
    );
    let rest = &text[end..];
    if !(text[..end].ends_with("::") && rest.starts_with('{')) {
        out.push(path);
        return;
    }
    // The group, up to its matching brace; items split at top-level commas.
    let mut depth = 0;
    let mut item_start = 1;
    for (i, c) in rest.char_indices() {
        match c {
            '{' => depth += 1,
            '}' | ',' if depth == 1 => {
                let item = rest[item_start..i].trim();
                if !item.is_empty() && item != "self" && !item.starts_with('*') {
                    expand(item, &path, out);
                }
                item_start = i + 1;
                if c == '}' {
                    return;
                }
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
}

/// Edges between sibling modules: `a` uses something inside `b`, where `a` and `b` share a
/// parent (a module using its own parent or children is not an edge).
fn edges(krate: &str) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let src = workspace().join(krate).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .filter(|f| !f.ends_with("tests.rs"))
        .map(|f| (module_of(&src, f), f.clone()))
        .collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for path in paths(&code(&text).join("\n")) {
            let (mut target, rest) = if path.first().is_some_and(|p| p == "crate") {
                (Vec::new(), &path[1..])
            } else {
                let ups = path.iter().take_while(|p| *p == "super").count();
                let keep = module.len().saturating_sub(ups);
                (module[..keep].to_vec(), &path[ups..])
            };
            for part in rest {
                let mut next = target.clone();
                next.push(part.clone());
                if modules.contains_key(&next) {
                    target = next;
                } else {
                    break;
                }
            }
            let shared = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if shared < module.len() && shared < target.len() {
                edges
                    .entry(module[..=shared].to_vec())
                    .or_default()
                    .insert(target[..=shared].to_vec());
            }
        }
    }
    edges
}

/// One cycle through `edges`, if there is one.
fn a_cycle(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    fn visit(
        node: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        path: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.clone());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|start| visit(start, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    for krate in CRATES {
        let edges = edges(krate);
        assert!(!edges.is_empty(), "{krate}: no imports read");
        if let Some(cycle) = a_cycle(&edges) {
            let names: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
            panic!("{krate}: import cycle {}", names.join(" -> "));
        }
    }
}

#[test]
fn the_cycle_check_finds_a_cycle_it_is_shown() {
    let m = |s: &str| vec![s.to_string()];
    let edges = BTreeMap::from([
        (m("a"), BTreeSet::from([m("b")])),
        (m("b"), BTreeSet::from([m("c")])),
        (m("c"), BTreeSet::from([m("a")])),
    ]);
    assert_eq!(a_cycle(&edges), Some(vec![m("a"), m("b"), m("c"), m("a")]));
    let acyclic = BTreeMap::from([(m("a"), BTreeSet::from([m("b")]))]);
    assert_eq!(a_cycle(&acyclic), None);
    let v = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        paths("use super::{own_pod, x::{A, B}};\nlet l = crate::sync::lock(&m);"),
        [
            v(&["crate", "sync", "lock"]),
            v(&["super", "own_pod"]),
            v(&["super", "x", "A"]),
            v(&["super", "x", "B"]),
        ]
    );
}

#[test]
fn no_source_file_has_more_than_650_lines_of_code_before_its_tests() {
    let mut long = Vec::new();
    for krate in CRATES {
        let mut files = Vec::new();
        sources(&workspace().join(krate).join("src"), &mut files);
        for file in files.iter().filter(|f| !f.ends_with("tests.rs")) {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            let lines = before_tests(&text).lines().count();
            if lines > MAX_CODE_LINES {
                long.push(format!("{} ({lines} lines)", file.display()));
            }
        }
    }
    assert!(long.is_empty(), "split by role: {long:?}");
}

/// A message line of code (a line that opens a string literal) with a run of eight spaces or
/// more between words: a `\` continuation lost in an edit, which prints the next line's
/// indentation in the middle of the message.
#[test]
fn no_message_carries_a_lost_lines_indentation() {
    let mut broken = Vec::new();
    for krate in CRATES {
        let mut files = Vec::new();
        sources(&workspace().join(krate).join("src"), &mut files);
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            for (at, line) in before_tests(&text).lines().enumerate() {
                if indented_run_inside_a_string(line) {
                    broken.push(format!("{}:{}", file.display(), at + 1));
                }
            }
        }
    }
    assert!(broken.is_empty(), "a lost `\\` continuation: {broken:?}");
}

/// Whether `line`, a line that begins with a string literal, has eight spaces or more between
/// two other characters inside it.
fn indented_run_inside_a_string(line: &str) -> bool {
    let Some(literal) = line.trim_start().strip_prefix('"') else {
        return false;
    };
    let literal = literal.split('"').next().unwrap_or_default();
    literal
        .trim()
        .split("        ")
        .filter(|part| !part.is_empty())
        .count()
        > 1
}

#[test]
fn a_lost_continuation_is_seen() {
    assert!(indented_run_inside_a_string(
        r#"            "stay              there until","#
    ));
    assert!(!indented_run_inside_a_string(r#"            "stay \"#));
    assert!(!indented_run_inside_a_string(
        r#"    let x = "a        b";"#
    ));
}
