//! Project rules that are cheap to check mechanically.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn migration_file_lists_are_identical() {
    let sqlite = files(&root().join("migrations/sqlite"));
    let postgres = files(&root().join("migrations/postgres"));
    assert!(!sqlite.is_empty());
    assert_eq!(sqlite, postgres);
}

/// No SQL reads the database clock: `now` is always an input (STYLE: time is an input).
#[test]
fn no_sql_reads_the_database_clock() {
    let mut offenders = Vec::new();
    let mut dirs = vec![
        root().join("ledger/src"),
        root().join("migrations/sqlite"),
        root().join("migrations/postgres"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
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
                    offenders.push(format!("{}:{}: {line}", path.display(), i + 1));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "database clock used:\n{}",
        offenders.join("\n")
    );
}
