//! No two modules of a crate import each other, directly or around a loop: read from the sources
//! (every `crate::`, `super::` and `self::` path outside the test modules, `use` groups expanded),
//! each path resolved to the module file it names. A module and the modules inside it are one
//! room (a parent declares its children; a child may use what its parent defines), so only paths
//! between modules neither of which contains the other are edges.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module's path inside its crate (`[]` for the crate root, `["admin", "json"]`).
type ModulePath = Vec<String>;

/// Every module of the crate whose sources are under `src`, with its code (test modules cut).
fn modules(src: &Path) -> BTreeMap<ModulePath, String> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|extension| extension != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).expect("under src").with_extension("");
            let mut module: ModulePath = relative
                .components()
                .map(|part| part.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                module.pop();
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            found
                .entry(module)
                .or_insert_with(String::new)
                .push_str(&without_tests(&text));
        }
    }
    found
}

/// The code before the test module (`#[cfg(test)]` on `mod …`), without line comments.
fn without_tests(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&at| {
            lines[at].trim() == "#[cfg(test)]"
                && lines
                    .get(at + 1)
                    .is_some_and(|next| next.trim_start().starts_with("mod "))
        })
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .filter(|line| !line.trim_start().starts_with("//"))
        .copied()
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths starting at `crate`, `super` or `self` in `code`, as segments (`use` groups
/// expanded: `super::{a::X, b}` gives `super a X` and `super b`).
fn paths(code: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut at = 0;
    while at < chars.len() {
        let starts_word = at == 0 || !is_ident(chars[at - 1]) && chars[at - 1] != ':';
        if starts_word && is_ident(chars[at]) {
            let (word, end) = ident(&chars, at);
            if matches!(word.as_str(), "crate" | "super" | "self") && chars[end..].starts_with(&[':', ':']) {
                let (mut tails, end) = tree(&chars, end + 2);
                for tail in &mut tails {
                    tail.insert(0, word.clone());
                }
                found.extend(tails);
                at = end;
                continue;
            }
            at = end;
            continue;
        }
        at += 1;
    }
    found
}

fn is_ident(char: char) -> bool {
    char.is_alphanumeric() || char == '_'
}

fn ident(chars: &[char], start: usize) -> (String, usize) {
    let end = (start..chars.len())
        .find(|&at| !is_ident(chars[at]))
        .unwrap_or(chars.len());
    (chars[start..end].iter().collect(), end)
}

fn skip_space(chars: &[char], mut at: usize) -> usize {
    while at < chars.len() && chars[at].is_whitespace() {
        at += 1;
    }
    at
}

/// A path's rest from `at`: `a::b`, `a::{b, c::d}`, `*`; the paths it names and where it ends.
fn tree(chars: &[char], at: usize) -> (Vec<Vec<String>>, usize) {
    let at = skip_space(chars, at);
    if chars.get(at) == Some(&'{') {
        let mut found = Vec::new();
        let mut at = at + 1;
        loop {
            at = skip_space(chars, at);
            match chars.get(at) {
                None => return (found, at),
                Some('}') => return (found, at + 1),
                Some(',') => at += 1,
                Some(_) => {
                    let (items, end) = tree(chars, at);
                    found.extend(items);
                    // Past `as alias` and anything else up to the item's end.
                    at = (end..chars.len())
                        .find(|&at| chars[at] == ',' || chars[at] == '}')
                        .unwrap_or(chars.len());
                }
            }
        }
    }
    if at >= chars.len() || !is_ident(chars[at]) {
        return (vec![Vec::new()], at);
    }
    let (word, end) = ident(chars, at);
    if chars[end..].starts_with(&[':', ':']) {
        let (mut tails, end) = tree(chars, end + 2);
        for tail in &mut tails {
            tail.insert(0, word.clone());
        }
        (tails, end)
    } else {
        (vec![vec![word]], end)
    }
}

/// The module a path written in `from` names: its anchor resolved, then the longest prefix that
/// is a module of the crate.
fn target(from: &ModulePath, path: &[String], known: &BTreeSet<ModulePath>) -> Option<ModulePath> {
    let mut base = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => from.clone(),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        base.pop()?;
    }
    while rest.first().is_some_and(|segment| segment == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    let mut best = known.contains(&base).then(|| base.clone());
    for segment in rest {
        base.push(segment.clone());
        if known.contains(&base) {
            best = Some(base.clone());
        }
    }
    best
}

/// Which module imports which, between modules neither of which contains the other.
fn edges(modules: &BTreeMap<ModulePath, String>) -> BTreeMap<ModulePath, BTreeSet<ModulePath>> {
    let known: BTreeSet<ModulePath> = modules.keys().cloned().collect();
    let mut edges: BTreeMap<ModulePath, BTreeSet<ModulePath>> = BTreeMap::new();
    for (from, code) in modules {
        for path in paths(code) {
            let Some(to) = target(from, &path, &known) else {
                continue;
            };
            if !to.starts_with(from) && !from.starts_with(&to) {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

/// The loops of `edges`: each a list of modules that reach each other (strongly connected, more
/// than one module).
fn loops(edges: &BTreeMap<ModulePath, BTreeSet<ModulePath>>) -> Vec<Vec<ModulePath>> {
    let reach = |from: &ModulePath| -> BTreeSet<ModulePath> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(module) = stack.pop() {
            for next in edges.get(&module).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&ModulePath, BTreeSet<ModulePath>> =
        edges.keys().map(|module| (module, reach(module))).collect();
    let mut found: BTreeSet<Vec<ModulePath>> = BTreeSet::new();
    for (module, reaches) in &reached {
        let group: Vec<ModulePath> = reaches
            .iter()
            .filter(|other| reached.get(other).is_some_and(|back| back.contains(*module)))
            .cloned()
            .collect();
        if group.len() > 1 {
            found.insert(group);
        }
    }
    found.into_iter().collect()
}

#[test]
fn no_two_modules_of_a_crate_import_each_other() {
    let crates = contrail_testkit::workspace_root().join("crates");
    let mut problems = Vec::new();
    let mut counted = 0;
    for entry in std::fs::read_dir(&crates).expect("read crates/") {
        let src = entry.expect("a crate").path().join("src");
        if !src.is_dir() {
            continue;
        }
        let modules = modules(&src);
        counted += modules.len();
        for group in loops(&edges(&modules)) {
            let names: Vec<String> = group.iter().map(|module| module.join("::")).collect();
            problems.push(format!("{}: {}", src.display(), names.join(" ⇄ ")));
        }
    }
    assert!(counted > 100, "only {counted} modules read");
    assert!(
        problems.is_empty(),
        "modules that import each other:\n{}",
        problems.join("\n")
    );
}

/// The rule finds a loop through `super::` groups, `crate::` paths and three modules, and leaves
/// a parent and its child alone.
#[test]
fn the_rule_itself_finds_modules_that_import_each_other() {
    let module = |path: &str| -> ModulePath {
        path.split("::")
            .filter(|part| !part.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let files = |pairs: &[(&str, &str)]| -> BTreeMap<ModulePath, String> {
        pairs
            .iter()
            .map(|(path, code)| (module(path), without_tests(code)))
            .collect()
    };
    let two = files(&[
        ("", "mod admin;"),
        ("admin", "mod json;\nmod render;\nuse self::json::X;"),
        (
            "admin::json",
            "use super::{render::{format, Y as Z}, target};\nfn x() {}",
        ),
        (
            "admin::render",
            "use super::json::parse; // crate::admin::target in a comment",
        ),
        (
            "admin::target",
            "pub struct T;\n#[cfg(test)]\nmod tests {\n    use crate::admin::json::x;\n}",
        ),
    ]);
    assert_eq!(
        loops(&edges(&two)),
        vec![vec![module("admin::json"), module("admin::render")]]
    );
    let three = files(&[
        ("a", "use crate::b::B;"),
        ("b", "fn f() { crate::c::go(); }"),
        ("c", "use super::a::A;"),
        (
            "c::d",
            "use super::super::a::A;\n#[cfg(test)]\nfn only_in_tests() { crate::b::f(); }",
        ),
    ]);
    assert_eq!(
        loops(&edges(&three)),
        vec![vec![module("a"), module("b"), module("c")]]
    );
    let fine = files(&[
        ("up", "mod supervisor;\nuse self::supervisor::Platform;"),
        (
            "up::supervisor",
            "use super::UpArgs;\nuse crate::board::set_phase;",
        ),
        ("board", "pub fn set_phase() {}"),
    ]);
    assert!(loops(&edges(&fine)).is_empty());
}
