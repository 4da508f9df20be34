//! Import circles between the modules of a crate: the paths each file names, the
//! files they resolve to, and the circles among them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

use super::{code_only, files, read, report};

/// The module a source file is, as a path from its crate root (`lib.rs` is `[]`).
pub(super) fn module_of(src: &Path, path: &Path) -> Vec<String> {
    let rel = path.strip_prefix(src).unwrap_or(path);
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The paths a file refers to: `crate::a::b`, `super::x`, grouped `{…}` imports
/// expanded, and a parent's `child::x` for its own `mod child;`. Comments and `pub use`
/// re-exports (a module's face, not a dependency of its code) are skipped.
pub(super) fn references(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let children: BTreeSet<String> =
        Regex::new(r"(?m)^\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_0-9]+)\s*;")
            .expect("regex")
            .captures_iter(text)
            .map(|c| c[1].to_string())
            .collect();
    let code: String = text
        .lines()
        .map(|l| {
            let t = l.trim_start();
            if t.starts_with("//") || t.starts_with("pub use") || t.starts_with("pub(crate) use") {
                ""
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let start = Regex::new(r"\b(crate|super|self|[a-z_][a-z_0-9]*)::").expect("regex");
    let mut out = Vec::new();
    for m in start.find_iter(&code) {
        // Only a path's first segment: skip `a::b::` continuations.
        let before = &code[..m.start()];
        if before.ends_with("::") {
            continue;
        }
        let head = m.as_str().trim_end_matches("::");
        let base: Vec<String> = match head {
            "crate" => Vec::new(),
            "super" | "self" => {
                // `a/b.rs` is module a::b and `a/mod.rs` module a: `super` drops one
                // segment of either.
                let mut m = module.to_vec();
                if head == "super" {
                    m.pop();
                }
                m
            }
            child if children.contains(child) => {
                let mut m = module.to_vec();
                m.push(child.to_string());
                m
            }
            _ => continue,
        };
        for tail in expand(&code[m.end()..]) {
            let mut p = base.clone();
            p.extend(tail);
            out.push(p);
        }
    }
    out
}

/// The paths spelled at the start of `rest` (after `crate::`): `a::b`, `{a, b::c}`.
fn expand(rest: &str) -> Vec<Vec<String>> {
    let rest = rest.trim_start();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut depth = 0usize;
        let mut end = inner.len();
        for (i, ch) in inner.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    end = i;
                    break;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        let body = &inner[..end];
        let mut items = Vec::new();
        let (mut depth, mut from) = (0usize, 0usize);
        for (i, ch) in body.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&body[from..i]);
                    from = i + 1;
                }
                _ => {}
            }
        }
        items.push(&body[from..]);
        return items.into_iter().flat_map(expand).collect();
    }
    let mut path = Vec::new();
    let mut s = rest;
    loop {
        let ident: String = s
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() {
            break;
        }
        path.push(ident.clone());
        s = &s[ident.len()..];
        match s.strip_prefix("::") {
            Some(next) if next.starts_with('{') => {
                return expand(next)
                    .into_iter()
                    .map(|t| path.iter().cloned().chain(t).collect())
                    .collect();
            }
            Some(next) => s = next,
            None => break,
        }
    }
    vec![path]
}

/// `text` with every `#[cfg(test)]` item blanked out (newlines kept): the attribute and
/// the item it guards, up to the `;` or the closing brace that ends it, and nothing
/// after. (Once the reader stopped at the first `#[cfg(test)]`, which hid every line
/// below a test module in the middle of a file.)
pub(super) fn without_test_items(text: &str) -> String {
    let code: Vec<char> = code_only(text).chars().collect();
    let mut out: Vec<char> = text.chars().collect();
    let attr: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + attr.len() <= code.len() {
        if code[i..i + attr.len()] != attr[..] {
            i += 1;
            continue;
        }
        // The guarded item ends at its first `;` outside brackets and braces, or at the
        // brace that closes its first `{`.
        let (mut braces, mut brackets) = (0usize, 0usize);
        let mut end = code.len();
        for (k, &c) in code.iter().enumerate().skip(i + attr.len()) {
            match c {
                '(' | '[' => brackets += 1,
                ')' | ']' => brackets = brackets.saturating_sub(1),
                '{' => braces += 1,
                '}' => {
                    braces = braces.saturating_sub(1);
                    if braces == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if braces == 0 && brackets == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        for c in &mut out[i..end] {
            if *c != '\n' {
                *c = ' ';
            }
        }
        i = end;
    }
    out.into_iter().collect()
}

#[test]
fn test_items_are_skipped_and_the_code_after_them_is_read() {
    let made_up = "use crate::a::x;\n\
        #[cfg(test)]\nmod tests {\n    use crate::b::y;\n    fn f() { let _ = \"}\"; }\n}\n\
        #[cfg(test)]\nuse crate::c::z;\n\
        #[cfg(test)]\nfn helper() -> [u8; 2] { crate::d::w() }\n\
        fn after() { crate::e::v(); }\n\
        // #[cfg(test)] in a comment hides nothing\n\
        fn last() { crate::f::u(); }\n";
    let kept = without_test_items(made_up);
    assert_eq!(kept.lines().count(), made_up.lines().count());
    let found: Vec<String> = references(&kept, &[])
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(found, ["a::x", "e::v", "f::u"]);
}

/// No import circles between the modules of a crate: each module stands above all it
/// imports, so a reader can learn the code bottom-up. A file's use of its ancestors'
/// `mod.rs` (the shared items of the folder it belongs to) does not count.
#[test]
fn no_import_cycles_between_modules() {
    // The checker itself can fail: a two-file circle in a made-up crate.
    let edges = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert!(!cycles(&edges).is_empty());
    let mut offenders = Vec::new();
    for src in ["engine/src", "ledger/src", "adapters/src"] {
        let sources: Vec<PathBuf> = files(src, ".rs")
            .into_iter()
            .filter(|p| !p.ends_with("main.rs") && !p.to_string_lossy().contains("/bin/"))
            .collect();
        let modules: BTreeMap<Vec<String>, String> = sources
            .iter()
            .map(|p| {
                (
                    module_of(Path::new(src), p),
                    p.to_string_lossy().into_owned(),
                )
            })
            .collect();
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for path in &sources {
            let module = module_of(Path::new(src), path);
            let text = read(path);
            // Test modules may reach anywhere; the code after them may not.
            let text = without_test_items(&text);
            let from = path.to_string_lossy().into_owned();
            for target in references(&text, &module) {
                // The longest prefix of the path that is a file of this crate.
                let to = (0..=target.len())
                    .rev()
                    .find_map(|n| modules.get(&target[..n]))
                    .cloned();
                // A file's use of its own folder's `mod.rs` (or the crate root) — the
                // shared items of the unit it belongs to — is not counted; the folder's
                // use of its files is.
                let ancestor = modules
                    .iter()
                    .find(|(_, f)| Some(*f) == to.as_ref())
                    .is_some_and(|(m, _)| m.len() < module.len() && module.starts_with(m));
                if let Some(to) = to
                    && to != from
                    && !ancestor
                {
                    edges.entry(from.clone()).or_default().insert(to);
                }
            }
        }
        offenders.extend(cycles(&edges));
    }
    report("import circles", &offenders);
}

/// The first module of `module` that a path in `text` reaches, among `banned` (the
/// layer a module must not import), with the path as written: what
/// [`cli_and_serve_never_import_each_other`] checks.
fn banned_reference(text: &str, module: &[String], banned: &str) -> Option<String> {
    references(text, module)
        .into_iter()
        .find(|p| p.first().is_some_and(|m| m == banned))
        .map(|p| p.join("::"))
}

/// `cli` (the command line) and `serve` (the HTTP API and console) are two faces of
/// the same runtime: neither imports the other, in code or tests, so a view or a
/// composition step is written once below both (`view`, `runtime`) and the API never
/// depends on how the command line prints.
#[test]
fn cli_and_serve_never_import_each_other() {
    // The check itself can fail: a made-up `serve` file that reaches into `cli`.
    let serve_file = ["serve".to_string(), "api".to_string()];
    assert_eq!(
        banned_reference("use crate::cli::show::x;", &serve_file, "cli").as_deref(),
        Some("cli::show::x")
    );
    assert!(banned_reference("use crate::view::RunView;", &serve_file, "cli").is_none());
    let src = Path::new("engine/src");
    let mut offenders = Vec::new();
    for (layer, banned) in [("cli", "serve"), ("serve", "cli")] {
        for path in files(&format!("engine/src/{layer}"), ".rs") {
            let module = module_of(src, &path);
            if let Some(p) = banned_reference(&read(&path), &module, banned) {
                offenders.push(format!("{}: imports `crate::{p}`", path.display()));
            }
        }
    }
    report("imports between cli and serve", &offenders);
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<String>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(next) = s.edges.get(v) {
            for w in next {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low[v];
                    s.low.insert(v, lv.min(lw));
                } else if s.on_stack.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low[v];
                    s.low.insert(v, lv.min(iw));
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort_unstable();
                let ties: Vec<String> = component
                    .iter()
                    .flat_map(|a| {
                        s.edges
                            .get(*a)
                            .into_iter()
                            .flatten()
                            .filter(|b| component.contains(&b.as_str()))
                            .map(move |b| format!("{a} -> {b}"))
                    })
                    .collect();
                s.found.push(format!("circle: {}", ties.join(", ")));
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found
}
