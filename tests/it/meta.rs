//! `flow completions`, `flow man`, `flow version` and the LICENSE, through the binary.

use std::process::{Command, Stdio};

use crate::support::{TestDb, flow, output, repo, stderr, stdout};

/// The bash script registers a completion for `flow` that bash itself accepts, and every
/// shell's script names the subcommands and their flags.
#[test]
fn completion_scripts_load_and_name_every_command() {
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let out = output(flow().args(["completions", shell]));
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        for word in ["resume", "completions", "run-id", "secrets-file"] {
            assert!(script.contains(word), "{shell}: no `{word}`");
        }
    }
    let script = stdout(&output(flow().args(["completions", "bash"])));
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("flow.bash");
    std::fs::write(&file, script).expect("write");
    let loaded = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p flow", file.display()))
        .stdin(Stdio::null())
        .output()
        .expect("bash");
    assert!(
        loaded.status.success(),
        "{}",
        String::from_utf8_lossy(&loaded.stderr)
    );
    assert!(String::from_utf8_lossy(&loaded.stdout).contains("flow"));
    let bad = output(flow().args(["completions", "tcsh"]));
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}

/// `flow man` is a roff page `man` renders, listing the subcommands and the version.
#[test]
fn the_manual_page_renders_and_lists_the_commands() {
    let out = output(flow().arg("man"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = stdout(&out);
    assert!(
        page.starts_with(".ie") || page.contains(".TH flow 1"),
        "{page}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("flow.1");
    std::fs::write(&file, &page).expect("write");
    let rendered = Command::new("man")
        .arg("-l")
        .arg(&file)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .stdin(Stdio::null())
        .output();
    // `man` may be missing on a minimal machine; the roff text is checked either way.
    let text = match rendered {
        Ok(r) if r.status.success() => String::from_utf8_lossy(&r.stdout).into_owned(),
        _ => page.clone(),
    };
    for word in [
        "resume",
        "reconcile",
        "completions",
        "validate",
        env!("CARGO_PKG_VERSION"),
    ] {
        assert!(text.contains(word), "no `{word}` in:\n{text}");
    }
    // The committed copy (docs/flow.1, for packagers) is the page this build prints.
    let committed_path = repo().join("docs/flow.1");
    assert!(
        crate::support::golden(&committed_path, &page).is_ok(),
        "docs/flow.1 is stale: run `FLOW_BLESS=1 cargo nextest run -E 'test(/manual_page/)'`"
    );
}

/// `flow version` says the version and commit, the schema this build expects, and the
/// schema `--db` has — and on a missing ledger says so without creating it.
#[test]
fn version_names_the_commit_and_both_schema_versions_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let here = || {
        let mut cmd = flow();
        cmd.current_dir(dir.path());
        cmd
    };
    let out = output(here().arg("version"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("flow {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(!first.contains("commit unknown"), "built from git: {text}");
    assert!(text.contains("(this build)"), "{text}");
    assert!(text.contains("none: no ledger at"), "{text}");
    assert!(
        !dir.path().join(".flow").exists(),
        "flow version created .flow/"
    );
    let flag = output(here().arg("--version"));
    assert_eq!(flag.status.code(), Some(0));
    assert_eq!(
        stdout(&flag).trim(),
        first,
        "--version and `flow version` agree"
    );

    let migrations = std::fs::read_dir(repo().join("migrations/sqlite"))
        .expect("migrations")
        .count();
    for backend in crate::support::backends() {
        let db = TestDb::new(backend);
        let before = stdout(&output(db.flow().arg("version")));
        assert!(
            before.contains("none") || before.contains("not migrated"),
            "{backend:?}: {before}"
        );
        let migrated = output(db.flow().arg("migrate"));
        assert_eq!(migrated.status.code(), Some(0), "{}", stderr(&migrated));
        let after = stdout(&output(db.flow().arg("version")));
        assert!(
            after.contains(&format!("ledger schema {migrations} (this build)"))
                && after.contains(&format!(": {migrations}\n")),
            "{backend:?}: {after}"
        );
    }
}

/// The LICENSE file is the license Cargo.toml declares.
#[test]
fn the_license_file_matches_cargo_toml() {
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).expect("Cargo.toml");
    assert!(manifest.contains("license = \"Apache-2.0\""));
    let license = std::fs::read_to_string(repo().join("LICENSE")).expect("LICENSE");
    assert!(license.contains("Apache License") && license.contains("Version 2.0, January 2004"));
    assert!(license.contains("TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION"));
}

/// The Dockerfile (no Docker engine runs here, so its shape is checked): a build stage,
/// a runtime stage that copies only the binary from it, a non-root user, `flow` as the
/// entry point, and `.git` / `target` kept out of the build context.
#[test]
fn the_dockerfile_builds_in_two_stages_and_runs_as_non_root() {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let instructions: Vec<(String, String)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let (word, rest) = l.split_once(' ')?;
            word.chars()
                .all(|c| c.is_ascii_uppercase())
                .then(|| (word.to_string(), rest.trim().to_string()))
        })
        .collect();
    let of = |word: &str| -> Vec<&str> {
        instructions
            .iter()
            .filter(|(w, _)| w == word)
            .map(|(_, rest)| rest.as_str())
            .collect()
    };
    let froms = of("FROM");
    assert_eq!(froms.len(), 2, "{froms:?}");
    assert!(froms[0].ends_with(" AS build"), "{froms:?}");
    assert!(
        of("COPY")
            .iter()
            .any(|c| c.starts_with("--from=build ") && c.ends_with("/usr/local/bin/flow"))
    );
    let user = of("USER");
    assert!(
        user.len() == 1 && user[0] != "root" && user[0] != "0",
        "{user:?}"
    );
    assert_eq!(of("ENTRYPOINT"), ["[\"flow\"]"]);
    assert!(
        of("RUN")
            .iter()
            .any(|r| r.contains("cargo build --release --locked"))
    );
    let ignored = std::fs::read_to_string(repo().join(".dockerignore")).expect(".dockerignore");
    for path in [".git", "target"] {
        assert!(ignored.lines().any(|l| l.trim() == path), "{path}");
    }
}
