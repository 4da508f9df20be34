//! Project rules that are cheap to check mechanically, in one place.
//!
//! Each rule reads the repository's own files (no build artefacts) and names every
//! offender with its path and line. Where today's code still breaks a rule, the
//! exception is listed here with the reason, and the test fails once the exception is no
//! longer needed, so the lists only shrink.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every file under `dir` (recursively) whose name ends with `ext`, sorted, as paths
/// relative to the repository root.
fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root().join(dir)];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n == "target") {
                    continue;
                }
                dirs.push(path);
            } else if path.to_string_lossy().ends_with(ext) {
                out.push(path.strip_prefix(root()).unwrap_or(&path).to_path_buf());
            }
        }
    }
    out.sort();
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Rust sources of the three crates, their tests and benches.
fn rust_sources() -> Vec<PathBuf> {
    ["engine", "ledger", "adapters", "tests", "benches"]
        .iter()
        .flat_map(|d| files(d, ".rs"))
        .collect()
}

fn report(what: &str, offenders: &[String]) {
    assert!(offenders.is_empty(), "{what}:\n{}", offenders.join("\n"));
}

#[test]
fn migration_file_lists_are_identical() {
    let names = |dir: &str| -> Vec<String> {
        files(dir, ".sql")
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect()
    };
    let sqlite = names("migrations/sqlite");
    assert!(!sqlite.is_empty());
    assert_eq!(sqlite, names("migrations/postgres"));
}

/// Crate direction: `flow` → {`flow-ledger`, `flow-adapters`}; the two leaves never
/// depend on each other, and only `ledger/` names sqlx, only `adapters/` reqwest and rmcp.
#[test]
fn crates_depend_in_one_direction() {
    let deps = |manifest: &str| -> String {
        let text = read(Path::new(manifest));
        // Runtime dependencies only: everything before the first non-`[dependencies]` table.
        text.split("\n[")
            .filter(|t| t.starts_with("dependencies]"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut offenders = Vec::new();
    for (manifest, forbidden) in [
        ("ledger/Cargo.toml", ["flow-adapters", "flow ="]),
        ("adapters/Cargo.toml", ["flow-ledger", "flow ="]),
    ] {
        let d = deps(manifest);
        for f in forbidden {
            if d.contains(f) {
                offenders.push(format!("{manifest} depends on {f}"));
            }
        }
    }
    let names = [
        ("engine/src", ["sqlx::", "reqwest::", "rmcp::"].as_slice()),
        (
            "ledger/src",
            ["reqwest::", "rmcp::", "flow_adapters"].as_slice(),
        ),
        ("adapters/src", ["sqlx::", "flow_ledger"].as_slice()),
    ];
    for (dir, forbidden) in names {
        for path in files(dir, ".rs") {
            for (i, line) in read(&path).lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                for f in forbidden {
                    if line.contains(f) {
                        offenders.push(format!("{}:{}: names {f}", path.display(), i + 1));
                    }
                }
            }
        }
    }
    report("dependency direction broken", &offenders);
}

/// No SQL reads the database clock: `now` is always an argument, so tests drive time and
/// every worker schedules by the same rule.
#[test]
fn no_sql_reads_the_database_clock() {
    let mut offenders = Vec::new();
    let paths = files("ledger/src", ".rs")
        .into_iter()
        .chain(files("migrations", ".sql"));
    for path in paths {
        for (i, line) in read(&path).lines().enumerate() {
            let lower = line.to_lowercase();
            // `.now()` / `::now()` are Rust calls on a clock; anything else is SQL.
            let sql_now = lower.match_indices("now()").any(|(at, _)| {
                at == 0 || !matches!(lower.as_bytes()[at - 1], b'.' | b':' | b'_' | b'a'..=b'z')
            });
            let other = [
                "current_timestamp",
                "datetime(",
                "strftime(",
                "clock_timestamp",
                "statement_timestamp",
                "localtimestamp",
            ]
            .iter()
            .any(|f| lower.contains(f));
            if sql_now || other {
                offenders.push(format!("{}:{}: {line}", path.display(), i + 1));
            }
        }
    }
    report("database clock used", &offenders);
}

/// The status literals quoted by SQL in `text` that no state enum spells.
fn unknown_status_literals(text: &str, known: &BTreeSet<&str>) -> Vec<String> {
    let compare = Regex::new(r"(?i)status\s*(?:=|<>|!=)\s*'([a-z_]*)'").expect("regex");
    let within = Regex::new(r"(?i)status\s+(?:not\s+)?in\s*\(([^)]*)\)").expect("regex");
    let case = Regex::new(r"(?is)status\s*=\s*case\s+when.*?\bend\b").expect("regex");
    let quoted = Regex::new(r"'([a-z_]*)'").expect("regex");
    let mut found: Vec<String> = Vec::new();
    found.extend(compare.captures_iter(text).map(|c| c[1].to_string()));
    for c in within.captures_iter(text) {
        found.extend(quoted.captures_iter(&c[1]).map(|q| q[1].to_string()));
    }
    for m in case.find_iter(text) {
        found.extend(quoted.captures_iter(m.as_str()).map(|q| q[1].to_string()));
    }
    found.retain(|s| !known.contains(s.as_str()));
    found
}

/// Every status SQL quotes is some state enum's `as_str()`: a typo or a renamed state
/// in a statement fails here instead of silently matching no row.
#[test]
fn sql_quotes_only_statuses_that_exist() {
    use flow_ledger::{CallStatus, DeliveryStatus, RunStatus, StepStatus};
    let mut known: BTreeSet<&str> = BTreeSet::new();
    known.extend(RunStatus::ALL.iter().map(|s| s.as_str()));
    known.extend(StepStatus::ALL.iter().map(|s| s.as_str()));
    known.extend(CallStatus::ALL.iter().map(|s| s.as_str()));
    known.extend(
        [
            DeliveryStatus::Pending,
            DeliveryStatus::Delivered,
            DeliveryStatus::Dead,
        ]
        .map(DeliveryStatus::as_str),
    );
    // The checker itself can fail.
    assert_eq!(
        unknown_status_literals(
            "UPDATE runs SET status = 'runing' WHERE status IN ('queued', 'paussed')",
            &known
        ),
        ["runing", "paussed"]
    );
    let mut offenders = Vec::new();
    for path in files("ledger/src", ".rs") {
        for bad in unknown_status_literals(&read(&path), &known) {
            offenders.push(format!("{}: quotes status '{bad}'", path.display()));
        }
    }
    report("SQL quotes a status no enum has", &offenders);
}

/// Lines of ledger SQL that compare a lease's holder, and are not that lease's fence, with
/// why: the test below fails on any other.
const HOLDER_MATCHES_THAT_ARE_NOT_FENCES: &[(&str, &str)] = &[
    (
        "WHERE tenant = $1 AND workspace = $2 AND worker = $3",
        "expires every run lease of a dead local worker: no single lease is held",
    ),
    (
        "WHERE tenant = $1 AND workspace = $2 AND lease_holder = $3",
        "expires every call lease of a dead local worker: no single lease is held",
    ),
];

/// Every fenced write names one of `ledger/src/fence.rs`'s clauses: a statement that
/// compares the holder itself (`worker = $n`, `lease_holder = $n` in a condition) is a
/// fifth way of writing the fence, which is how `mark_outbound` once had its own copy.
#[test]
fn every_fence_is_written_in_fence_rs() {
    let holder = |line: &str| {
        [
            "AND worker = $",
            "AND r.worker = $",
            "AND lease_holder = $",
            "WHERE worker = $",
        ]
        .iter()
        .any(|p| line.contains(p))
    };
    // The checker itself can fail.
    assert!(holder("WHERE id = $3 AND worker = $4 AND lease_token = $5"));
    assert!(!holder(
        "SET status = 'running', worker = $3, lease_token = lease_token + 1"
    ));
    let mut offenders = Vec::new();
    for path in files("ledger/src", ".rs") {
        if path.ends_with("fence.rs") {
            continue;
        }
        for (i, line) in read(&path).lines().enumerate() {
            let allowed = HOLDER_MATCHES_THAT_ARE_NOT_FENCES
                .iter()
                .any(|(text, _)| line.contains(text));
            if holder(line) && !allowed {
                offenders.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
            }
        }
    }
    report(
        "a lease fence written outside ledger/src/fence.rs",
        &offenders,
    );
}

/// Files over 800 lines that still wait for their split (each a known item of the
/// redesign issue); the test fails once one of them fits or is gone, so the list stays
/// true. Empty now; kept so a file that must grow past the limit is listed, not hidden.
const LONG_FILES: &[&str] = &[];

/// No source file over 800 lines: past that a reader cannot hold a module in mind.
#[test]
fn no_source_file_is_over_800_lines() {
    let mut offenders = Vec::new();
    let mut fits = Vec::new();
    for path in rust_sources() {
        let lines = read(&path).lines().count();
        let name = path.to_string_lossy().replace('\\', "/");
        let excepted = LONG_FILES.contains(&name.as_str());
        if lines > 800 && !excepted {
            offenders.push(format!("{name}: {lines} lines"));
        }
        if lines <= 800 && excepted {
            fits.push(format!(
                "{name} fits now ({lines} lines): drop it from LONG_FILES"
            ));
        }
    }
    let sources: Vec<String> = rust_sources()
        .iter()
        .map(|p| p.to_string_lossy().replace('\\', "/"))
        .collect();
    for listed in LONG_FILES {
        if !sources.iter().any(|s| s == listed) {
            fits.push(format!("{listed} is gone: drop it from LONG_FILES"));
        }
    }
    offenders.extend(fits);
    report("file size", &offenders);
}

/// No reference to documents that are not in this repository: the contract the code
/// relies on is written here (README, ARCHITECTURE.md), in our words. Migrations are
/// exempt: an applied migration's text is checksummed and may never change.
#[test]
fn no_references_to_documents_outside_the_repository() {
    let pattern =
        Regex::new(r"\bDESIGN\b|STYLE\.md|STYLE:|\.\./shared|[\u{2460}-\u{2473}]").expect("regex");
    assert!(pattern.is_match("as DESIGN §7 says") && pattern.is_match("(fix ⑦)"));
    let mut offenders = Vec::new();
    let sources = rust_sources()
        .into_iter()
        .chain(files(".", ".md"))
        .chain(files(".ci", "run"))
        .chain([
            "Cargo.toml".into(),
            "ledger/Cargo.toml".into(),
            "adapters/Cargo.toml".into(),
        ]);
    for path in sources {
        if path.ends_with("tidy.rs") {
            continue;
        }
        for (i, line) in read(&path).lines().enumerate() {
            if pattern.is_match(line) {
                offenders.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
            }
        }
    }
    report("references to documents outside the repository", &offenders);
}

/// The module a source file is, as a path from its crate root (`lib.rs` is `[]`).
fn module_of(src: &Path, path: &Path) -> Vec<String> {
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
fn references(text: &str, module: &[String]) -> Vec<Vec<String>> {
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
            // Test modules may reach anywhere.
            let text = text.split("#[cfg(test)]").next().unwrap_or_default();
            let from = path.to_string_lossy().into_owned();
            for target in references(text, &module) {
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

/// `text` with every comment, string and character literal blanked out (newlines kept),
/// so braces and `fn` inside them do not count.
fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < b.len() {
        let (c, next) = (b[i], b.get(i + 1).copied());
        let prev = if i == 0 { None } else { Some(b[i - 1]) };
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            let mut depth = 0usize;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            continue;
        }
        // Raw strings: r"…", r#"…"#, br"…".
        if (c == 'r' || (c == 'b' && next == Some('r'))) && !prev.is_some_and(ident) {
            let start = i + if c == 'b' { 2 } else { 1 };
            let hashes = b[start..].iter().take_while(|&&h| h == '#').count();
            if b.get(start + hashes) == Some(&'"') {
                let close: String = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                let body_from = start + hashes + 1;
                let rest: String = b[body_from..].iter().collect();
                let body_len = rest.find(&close).map_or(rest.len(), |at| {
                    rest[..at].chars().count() + close.chars().count()
                });
                let end = (body_from + body_len).min(b.len());
                out.extend(b[i..end].iter().map(|&c| blank(c)));
                i = end;
                continue;
            }
        }
        if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            if i < b.len() {
                out.push(' ');
                i += 1;
            }
            continue;
        }
        if c == '\'' {
            // A character literal ('x', '\n', '\u{7b}'); otherwise a lifetime or label.
            let len = if next == Some('\\') {
                b.get(i + 3..)
                    .and_then(|rest| rest.iter().position(|&q| q == '\''))
                    .map(|p| p + 4)
            } else if b.get(i + 2) == Some(&'\'') {
                Some(3)
            } else {
                None
            };
            if let Some(len) = len {
                let end = (i + len).min(b.len());
                out.extend(b[i..end].iter().map(|&c| blank(c)));
                i = end;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

/// Every function in `text` longer than `max` lines, counted from the line of its `fn`
/// to the line of its closing brace: `(name, first line, lines)`.
fn long_functions(text: &str, max: usize) -> Vec<(String, usize, usize)> {
    let code: Vec<char> = code_only(text).chars().collect();
    let line_at = |at: usize| code[..at].iter().filter(|&&c| c == '\n').count() + 1;
    let joined: String = code.iter().collect();
    let def = Regex::new(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)").expect("regex");
    let mut out = Vec::new();
    for m in def.captures_iter(&joined) {
        let whole = m.get(0).expect("match");
        // Char index of the match (the text may hold multi-byte characters).
        let from = joined[..whole.start()].chars().count();
        // The body starts at the first `{` outside the signature's brackets; a `;` there
        // first means a declaration without a body (a trait's).
        let mut depth = 0i32;
        let mut open = None;
        for (k, &c) in code.iter().enumerate().skip(from) {
            match c {
                '(' | '[' | '<' => depth += 1,
                ')' | ']' => depth -= 1,
                '>' if code.get(k.wrapping_sub(1)) != Some(&'-') => depth -= 1,
                ';' if depth <= 0 => break,
                '{' if depth <= 0 => {
                    open = Some(k);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = open else { continue };
        let mut braces = 0usize;
        let mut close = None;
        for (k, &c) in code.iter().enumerate().skip(open) {
            match c {
                '{' => braces += 1,
                '}' => {
                    braces -= 1;
                    if braces == 0 {
                        close = Some(k);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(close) = close else { continue };
        let (first, last) = (line_at(from), line_at(close));
        if last - first + 1 > max {
            out.push((m[1].to_string(), first, last - first + 1));
        }
    }
    out
}

/// Functions over 120 lines that could not be split yet, as `path: name`, each with
/// why; the test fails once one of them fits, so the list only shrinks.
const LONG_FUNCTIONS: &[(&str, &str)] = &[];

/// No function over 120 lines: past that its steps deserve names of their own.
#[test]
fn no_function_is_over_120_lines() {
    // The checker itself can fail: braces in strings, characters and comments do not
    // end a function, lifetimes are not characters, a trait's declaration has no body.
    let body = "    let x = 1;\n".repeat(125);
    let made_up = format!(
        "trait T {{ fn declared(&self) -> [u8; 2]; }}\n\
         fn long<'a>(s: &'a str) -> Vec<u8> {{\n    let _ = \"}}\";\n    let _ = '}}';\n    \
         // }}\n    /* }} */\n    let _ = r#\"}}\"#;\n    let _ = '\\u{{7d}}';\n{body}}}\n\
         fn short() {{ let _ = '{{'; }}\n"
    );
    assert_eq!(
        long_functions(&made_up, 120),
        [("long".to_string(), 2, 133)]
    );
    let mut offenders = Vec::new();
    let mut seen = BTreeSet::new();
    for path in rust_sources() {
        let name = path.to_string_lossy().replace('\\', "/");
        for (function, line, lines) in long_functions(&read(&path), 120) {
            let excepted = LONG_FUNCTIONS
                .iter()
                .any(|&(p, f)| p == name && f == function);
            if excepted {
                seen.insert((name.clone(), function));
            } else {
                offenders.push(format!("{name}:{line}: fn {function} has {lines} lines"));
            }
        }
    }
    for &(p, f) in LONG_FUNCTIONS {
        if !seen.contains(&(p.to_string(), f.to_string())) {
            offenders.push(format!("{p}: fn {f} fits now: drop it from LONG_FUNCTIONS"));
        }
    }
    report("function length", &offenders);
}
