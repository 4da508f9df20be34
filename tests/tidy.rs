//! Project rules that are cheap to check mechanically, in one place.
//!
//! Each rule reads the repository's own files (no build artefacts) and names every
//! offender with its path and line. Where today's code still breaks a rule, the
//! exception is listed here with the reason, and the test fails once the exception is no
//! longer needed, so the lists only shrink.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use regex::Regex;

#[path = "tidy/holds.rs"]
mod holds;
#[path = "tidy/imports.rs"]
mod imports;
#[path = "tidy/layers.rs"]
mod layers;
#[path = "tidy/params.rs"]
mod params;

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

/// The runtime dependencies of a manifest's text: its `[dependencies]` table only.
fn runtime_dependencies(manifest: &str) -> String {
    manifest
        .split("\n[")
        .filter(|t| t.starts_with("dependencies]"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The lines of Rust source `text` that name one of `forbidden` outside a line comment:
/// `(line, name)`.
fn forbidden_names(text: &str, forbidden: &[&str]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        for f in forbidden {
            if line.contains(f) {
                out.push((i + 1, (*f).to_string()));
            }
        }
    }
    out
}

/// Crate direction: `flow` → {`flow-ledger`, `flow-adapters`}; the two leaves never
/// depend on each other, and only `ledger/` names sqlx, only `adapters/` reqwest and rmcp
/// — except `engine/src/mcp/`, flow's own MCP *server* (a face, as `serve/` is for
/// axum): the client half that calls tools stays in `adapters/`.
#[test]
fn crates_depend_in_one_direction() {
    // The checker itself can fail: a made-up leaf naming the other leaf and sqlx.
    let manifest = "[package]\nname = \"x\"\n[dependencies]\nflow-adapters = \"1\"\n\
                    [dev-dependencies]\nflow = { path = \"..\" }\n";
    assert!(runtime_dependencies(manifest).contains("flow-adapters"));
    assert!(!runtime_dependencies(manifest).contains("flow ="));
    let source = "use sqlx::Pool;\n// sqlx:: in a comment\nfn f() { reqwest::get(); }\n";
    assert_eq!(
        forbidden_names(source, &["sqlx::", "reqwest::"]),
        [(1, "sqlx::".to_string()), (3, "reqwest::".to_string())]
    );
    let mut offenders = Vec::new();
    for (manifest, forbidden) in [
        ("ledger/Cargo.toml", ["flow-adapters", "flow ="]),
        ("adapters/Cargo.toml", ["flow-ledger", "flow ="]),
    ] {
        let d = runtime_dependencies(&read(Path::new(manifest)));
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
            let server = path.starts_with("engine/src/mcp");
            let forbidden: Vec<&str> = forbidden
                .iter()
                .copied()
                .filter(|f| !(server && *f == "rmcp::"))
                .collect();
            for (line, f) in forbidden_names(&read(&path), &forbidden) {
                offenders.push(format!("{}:{line}: names {f}", path.display()));
            }
        }
    }
    report("dependency direction broken", &offenders);
}

/// The lines of `text` (Rust or SQL) that read the database's clock, from 1.
fn database_clock_lines(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
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
            out.push(i + 1);
        }
    }
    out
}

/// No SQL reads the database clock: `now` is always an argument, so tests drive time and
/// every worker schedules by the same rule.
#[test]
fn no_sql_reads_the_database_clock() {
    // The checker itself can fail: SQL clocks are found, Rust clocks are not.
    let made_up = "let t = clock.now();\n\
                   sqlx::query(\"UPDATE runs SET at = NOW() WHERE id = $1\")\n\
                   let u = SystemClock::now();\n\
                   \"SELECT datetime('now')\"\n\
                   \"DEFAULT CURRENT_TIMESTAMP\"\n";
    assert_eq!(database_clock_lines(made_up), [2, 4, 5]);
    let mut offenders = Vec::new();
    let paths = files("ledger/src", ".rs")
        .into_iter()
        .chain(files("migrations", ".sql"));
    for path in paths {
        // The one reader of the server's clock, which decides nothing: it anchors every
        // process's `SystemClock` to it (see that file).
        if path.ends_with("ledger/src/ledger_clock.rs") {
            continue;
        }
        let text = read(&path);
        let lines: Vec<&str> = text.lines().collect();
        for n in database_clock_lines(&text) {
            offenders.push(format!("{}:{n}: {}", path.display(), lines[n - 1]));
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

/// What the file-size rule says of `sources` (`(path, text)`) given the exceptions
/// `long`: each file over `max` lines not excepted, each exception that fits now or is
/// gone.
fn file_size_offenders(sources: &[(String, String)], long: &[&str], max: usize) -> Vec<String> {
    let mut offenders = Vec::new();
    for (name, text) in sources {
        let lines = text.lines().count();
        let excepted = long.contains(&name.as_str());
        if lines > max && !excepted {
            offenders.push(format!("{name}: {lines} lines"));
        }
        if lines <= max && excepted {
            offenders.push(format!(
                "{name} fits now ({lines} lines): drop it from LONG_FILES"
            ));
        }
    }
    for listed in long {
        if !sources.iter().any(|(s, _)| s == listed) {
            offenders.push(format!("{listed} is gone: drop it from LONG_FILES"));
        }
    }
    offenders
}

/// No source file over 800 lines: past that a reader cannot hold a module in mind.
#[test]
fn no_source_file_is_over_800_lines() {
    // The checker itself can fail: a made-up long file, an exception that fits, one gone.
    let made_up = [
        ("long.rs".to_string(), "x\n".repeat(801)),
        ("fits.rs".to_string(), "x\n".repeat(800)),
    ];
    assert_eq!(
        file_size_offenders(&made_up, &["fits.rs", "gone.rs"], 800),
        [
            "long.rs: 801 lines",
            "fits.rs fits now (800 lines): drop it from LONG_FILES",
            "gone.rs is gone: drop it from LONG_FILES",
        ]
    );
    let sources: Vec<(String, String)> = rust_sources()
        .iter()
        .map(|p| (p.to_string_lossy().replace('\\', "/"), read(p)))
        .collect();
    report("file size", &file_size_offenders(&sources, LONG_FILES, 800));
}

/// The text of `fn name` in `text`, from its `fn` to the first line that is only `}`.
fn function_text<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = text.find(&format!("fn {name}("))?;
    let len = text[start..].find("\n}\n")? + 2;
    Some(&text[start..start + len])
}

/// `CI` and `FLOW_BLESS` are read by one rule: the ledger's conformance tests may not
/// depend on the adapters' testkit, so they hold a copy of `flag_on`, which must stay the
/// same text as the original.
#[test]
fn the_environment_flag_rule_is_one_text() {
    let original = read(Path::new("adapters/src/testkit/flags.rs"));
    let copy = read(Path::new("ledger/tests/conformance/common.rs"));
    let original = function_text(&original, "flag_on").expect("flag_on in the testkit");
    assert!(original.contains("\"false\""), "{original}");
    assert_eq!(
        function_text(&copy, "flag_on"),
        Some(original),
        "ledger/tests/conformance/common.rs's flag_on differs from adapters/src/testkit/flags.rs's"
    );
    // No other file reads `CI` or `FLOW_BLESS` by a rule of its own.
    let readers = [
        "var(\"CI\")",
        "var_os(\"CI\")",
        "var(\"FLOW_BLESS\")",
        "var_os(\"FLOW_BLESS\")",
    ];
    let mut offenders = Vec::new();
    for path in rust_sources() {
        let name = path.to_string_lossy().replace('\\', "/");
        if [
            "tests/tidy.rs",
            "adapters/src/testkit/flags.rs",
            "ledger/tests/conformance/common.rs",
        ]
        .contains(&name.as_str())
        {
            continue;
        }
        for (i, line) in read(&path).lines().enumerate() {
            if readers.iter().any(|r| line.contains(r)) {
                offenders.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
            }
        }
    }
    report("CI or FLOW_BLESS read by another rule", &offenders);
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

/// The public methods of `impl Ledger` blocks in `text` not gated to tests (`testkit`).
fn public_ledger_methods(text: &str) -> Vec<String> {
    let method = Regex::new(r"^    pub (?:async )?fn (\w+)").expect("regex");
    let mut out = Vec::new();
    let mut in_ledger = false;
    let mut gated = false;
    for line in text.lines() {
        if line.starts_with("impl Ledger {") {
            in_ledger = true;
        } else if line.starts_with('}') {
            in_ledger = false;
        }
        if !in_ledger {
            continue;
        }
        if line.trim_start().starts_with("#[cfg(") && line.contains("testkit") {
            gated = true;
            continue;
        }
        if let Some(c) = method.captures(line) {
            if !gated {
                out.push(c[1].to_string());
            }
            gated = false;
        } else if !line.trim_start().starts_with("#[") && !line.trim_start().starts_with("///") {
            gated = false;
        }
    }
    out
}

/// The ledger's door holds what the engine uses: a public `Ledger` method that no code
/// outside the ledger calls (the engine, the binary, the adapters, the benches) is
/// either made `pub(crate)` or, when only tests need it, gated behind the `testkit`
/// feature. Tests do not count as users.
#[test]
fn no_public_ledger_method_is_used_only_by_tests() {
    let users: Vec<String> = [
        "engine/src",
        "src",
        "adapters/src",
        "benches",
        "ledger/benches",
    ]
    .iter()
    .flat_map(|d| files(d, ".rs"))
    .map(|p| read(&p))
    .collect();
    let mut offenders = Vec::new();
    for path in files("ledger/src", ".rs") {
        for name in public_ledger_methods(&read(&path)) {
            let word = Regex::new(&format!(r"\b{name}\b")).expect("regex");
            if !users.iter().any(|text| word.is_match(text)) {
                offenders.push(format!("{}: Ledger::{name}", path.display()));
            }
        }
    }
    report(
        "public Ledger methods nothing but tests call (gate them with #[cfg(any(test, feature = \"testkit\"))] or make them pub(crate))",
        &offenders,
    );
    // The rule can fail: a planted public method nobody calls is found.
    let planted =
        "impl Ledger {\n    /// x\n    pub async fn planted_only_for_tests(&self) {}\n}\n";
    assert_eq!(public_ledger_methods(planted), ["planted_only_for_tests"]);
    let gated =
        "impl Ledger {\n    #[cfg(any(test, feature = \"testkit\"))]\n    pub fn g(&self) {}\n}\n";
    assert!(public_ledger_methods(gated).is_empty());
}

/// The modules `lib.rs` declares that its table of contents (its `//!` doc) does not
/// name, as `` `name` ``, `` `name.rs` ``, `` `name/` `` or [`name`].
fn unlisted_modules(lib: &str) -> Vec<String> {
    let declared = Regex::new(r"(?m)^(?:pub )?mod (\w+);").expect("regex");
    let doc: String = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    declared
        .captures_iter(lib)
        .map(|c| c[1].to_string())
        .filter(|m| {
            ![
                format!("`{m}`"),
                format!("`{m}.rs`"),
                format!("`{m}/`"),
                format!("[`{m}`]"),
            ]
            .iter()
            .any(|form| doc.contains(form.as_str()))
        })
        .collect()
}

/// Each crate's `lib.rs` is a complete table of contents: a reader finds every module
/// named there with what it holds (a new module without a line fails here).
#[test]
fn every_lib_rs_names_all_its_modules() {
    let mut offenders = Vec::new();
    for lib in [
        "engine/src/lib.rs",
        "ledger/src/lib.rs",
        "adapters/src/lib.rs",
    ] {
        for m in unlisted_modules(&read(Path::new(lib))) {
            offenders.push(format!("{lib}: module `{m}`"));
        }
    }
    report(
        "modules missing from their crate's table of contents",
        &offenders,
    );
    // The rule can fail: a planted module nobody listed is found.
    let planted = "//! - [`a`]: listed.\n\npub mod a;\nmod b;\n";
    assert_eq!(unlisted_modules(planted), ["b"]);
}
