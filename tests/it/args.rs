//! Global arguments checked before any ledger is touched: a read-only SQLite URL
//! (`?mode=ro`) serves the reading commands and refuses the writing ones with nothing
//! created or written; tenant and workspace names follow the run-id rule.

use std::path::Path;

use crate::support::{Backend, TestDb, output, repo, run_id, stderr, stdout};

/// The bytes of the ledger file and its WAL, to prove nothing was written.
fn contents(db_file: &Path) -> Vec<Vec<u8>> {
    ["", "-wal"]
        .iter()
        .map(|suffix| {
            let mut p = db_file.as_os_str().to_owned();
            p.push(suffix);
            std::fs::read(Path::new(&p)).unwrap_or_default()
        })
        .collect()
}

#[test]
fn a_read_only_sqlite_url_serves_reads_and_refuses_writes() {
    let db = TestDb::new(Backend::Sqlite);
    let hello = repo().join("workflows/hello.yaml");
    let out = output(
        db.flow()
            .arg("run")
            .arg(&hello)
            .args(["--input", "name=Ada"]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let run = run_id(&out);
    let file = db.dir.path().join("flow.db");
    let before = contents(&file);
    let ro = format!("sqlite://{}?mode=ro", file.display());

    let out = output(db.flow().args(["--db", &ro, "runs", "--json"]));
    assert_eq!(out.status.code(), Some(0), "runs: {}", stderr(&out));
    assert!(stdout(&out).contains(&run), "{}", stdout(&out));
    let out = output(db.flow().args(["--db", &ro, "show", &run, "--json"]));
    assert_eq!(out.status.code(), Some(0), "show: {}", stderr(&out));
    assert!(stdout(&out).contains("succeeded"));
    let out = output(db.flow().args(["--db", &ro, "events", "--json"]));
    assert_eq!(out.status.code(), Some(0), "events: {}", stderr(&out));

    let hello_arg = hello.to_str().expect("path");
    let writes: [&[&str]; 6] = [
        &["run", hello_arg, "--input", "name=Bo"],
        &["submit", hello_arg, "--input", "name=Bo"],
        &["cancel", &run],
        &["resume", &run],
        &["migrate"],
        &["events", "redeliver", "--failed"],
    ];
    for args in writes {
        let out = output(db.flow().args(["--db", &ro]).args(args));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("read-only (mode=ro)"), "{args:?}: {err}");
    }
    assert!(contents(&file) == before, "the ledger file changed");

    // A missing file is never created, whatever the command.
    let missing = db.dir.path().join("nothing/here.db");
    let ro_missing = format!("sqlite://{}?mode=ro", missing.display());
    let out = output(db.flow().args(["--db", &ro_missing, "runs"]));
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(stderr(&out).contains("no ledger at"), "{}", stderr(&out));
    let out = output(
        db.flow()
            .args(["--db", &ro_missing, "run"])
            .arg(&hello)
            .args(["--input", "name=Bo"]),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!missing.exists() && !missing.parent().expect("parent").exists());
}

#[test]
fn bad_tenant_and_workspace_names_exit_2_before_the_ledger_is_opened() {
    let db = TestDb::new(Backend::Sqlite);
    let long = "t".repeat(2_000);
    let hello = repo().join("workflows/hello.yaml");
    for flag in ["--tenant", "--workspace"] {
        for bad in ["", "a\nb", long.as_str(), "a b", "ü"] {
            for args in [
                vec!["runs".to_string()],
                vec![
                    "run".to_string(),
                    hello.display().to_string(),
                    "--input".into(),
                    "name=Ada".into(),
                ],
            ] {
                let out = output(db.flow().args([flag, bad]).args(&args));
                let err = stderr(&out);
                assert_eq!(out.status.code(), Some(2), "{flag} {bad:?} {args:?}: {err}");
                assert!(err.contains(&format!("invalid {flag}")), "{err}");
                assert!(err.len() < 400, "the value is shortened: {err}");
            }
        }
        // The environment variables are checked the same way.
        let env = if flag == "--tenant" {
            "FLOW_TENANT"
        } else {
            "FLOW_WORKSPACE"
        };
        let out = output(db.flow().env(env, "bad\nname").arg("runs"));
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    }
    assert!(
        !db.dir.path().join("flow.db").exists(),
        "nothing was opened"
    );
    for command in ["migrate", "runs"] {
        let out = output(
            db.flow()
                .args(["--tenant", "acme-1.prod_2", "--workspace", "w"])
                .arg(command),
        );
        assert_eq!(out.status.code(), Some(0), "{command}: {}", stderr(&out));
    }
}

/// Colour only on a terminal: help and usage errors through a pipe are plain text;
/// `CLICOLOR_FORCE` and `--color always` force it, `NO_COLOR` and `--color never` win
/// over `CLICOLOR_FORCE`.
#[test]
fn help_and_errors_through_a_pipe_carry_no_escape_codes() {
    let esc = |b: &[u8]| b.contains(&0x1b);
    let flow = || {
        let mut cmd = crate::support::flow();
        cmd.env_remove("NO_COLOR").env_remove("CLICOLOR_FORCE");
        cmd
    };
    let help = output(flow().arg("--help"));
    assert_eq!(help.status.code(), Some(0));
    assert!(!esc(&help.stdout), "{}", stdout(&help));
    assert!(stdout(&help).contains("Usage: flow"));
    let bad = output(flow().arg("bogus"));
    assert_eq!(bad.status.code(), Some(2));
    assert!(!esc(&bad.stderr), "{}", stderr(&bad));
    let forced = output(
        crate::support::flow()
            .arg("--help")
            .env("CLICOLOR_FORCE", "1"),
    );
    assert!(esc(&forced.stdout), "CLICOLOR_FORCE=1 colours a pipe");
    let always = output(flow().args(["--color", "always", "bogus"]));
    assert!(esc(&always.stderr), "--color always");
    let no_color = output(
        flow()
            .arg("--help")
            .env("CLICOLOR_FORCE", "1")
            .env("NO_COLOR", "1"),
    );
    assert!(!esc(&no_color.stdout), "NO_COLOR wins over CLICOLOR_FORCE");
    let never = output(
        flow()
            .args(["--color=never", "--help"])
            .env("CLICOLOR_FORCE", "1"),
    );
    assert!(!esc(&never.stdout), "--color never wins");
}

/// The resolve commands `flow show` prints repeat the non-default `--db` and
/// `--tenant`: pasted into a shell elsewhere (no FLOW_* variables, another directory),
/// one reaches the same ledger and settles the call.
#[test]
fn a_pasted_resolve_command_reaches_the_same_ledger() {
    use flow_adapters::testkit::http::CountingServer;
    let rt = crate::support::runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    for backend in crate::support::backends() {
        let db = TestDb::new(backend);
        let file = db.write(
            "w.yaml",
            &format!(
                "name: paste\ntools:\n  api: {{ kind: http, method: POST, url: \"{}/charge\", timeout: 5s }}\nnodes:\n  charge: {{ tool: api, with: {{ n: 1 }} }}\n",
                server.url()
            ),
        );
        let crashed = output(
            db.flow()
                .args(["--tenant", "acme"])
                .arg("run")
                .arg(&file)
                .env("FLOW_FAULT", "after_response:charge"),
        );
        let run = run_id(&crashed);
        let resumed = output(db.flow().args(["--tenant", "acme", "resume", &run]));
        assert_eq!(resumed.status.code(), Some(3), "{}", stderr(&resumed));
        assert!(
            stderr(&resumed).contains(&format!("--tenant acme show {run}")),
            "{backend:?}: {}",
            stderr(&resumed)
        );
        let shown = output(db.flow().args(["--tenant", "acme", "show", &run]));
        let line = stdout(&shown)
            .lines()
            .find(|l| l.contains("=retry"))
            .map(|l| l.split('#').next().unwrap_or_default().trim().to_string())
            .unwrap_or_else(|| panic!("{backend:?}: no retry command in {}", stdout(&shown)));
        assert!(line.starts_with("flow --db "), "{line}");
        let pasted = line.replacen("flow", env!("CARGO_BIN_EXE_flow"), 1);
        let elsewhere = tempfile::tempdir().expect("tempdir");
        let mut sh = std::process::Command::new("sh");
        sh.arg("-c").arg(&pasted).current_dir(elsewhere.path());
        for (key, _) in std::env::vars() {
            if key.starts_with("FLOW_") {
                sh.env_remove(key);
            }
        }
        let out = output(&mut sh);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{backend:?}: `{line}`: {}",
            stderr(&out)
        );
        let shown = output(db.flow().args(["--tenant", "acme", "show", &run, "--json"]));
        let s: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("show --json");
        assert_eq!(s["run"]["status"], "succeeded", "{backend:?}: {s:#}");
    }
}

/// In `--log-format json` (or `FLOW_LOG_FORMAT=json`) every stderr line is one JSON
/// object: tracing's log lines, flow's own results and hints, progress lines, errors.
#[test]
fn in_json_log_mode_every_stderr_line_parses() {
    let db = TestDb::new(Backend::Sqlite);
    let hello = repo().join("workflows/hello.yaml");
    let submitted = output(
        db.flow()
            .arg("submit")
            .arg(&hello)
            .args(["--input", "name=q"]),
    );
    assert_eq!(submitted.status.code(), Some(0), "{}", stderr(&submitted));
    let outputs = [
        output(
            db.flow()
                .args(["--log-format", "json", "run"])
                .arg(&hello)
                .args(["--input", "name=z"])
                .env("RUST_LOG", "info"),
        ),
        output(
            db.flow()
                .args(["daemon", "--exit-when-idle"])
                .env("FLOW_LOG_FORMAT", "json")
                .env("RUST_LOG", "info"),
        ),
        output(
            db.flow()
                .args(["--log-format", "json", "show", "no-such-run"]),
        ),
    ];
    for out in &outputs {
        let err = stderr(out);
        assert!(!err.trim().is_empty(), "something was said");
        for line in err.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {line}\nall of stderr:\n{err}"));
            assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
        }
    }
    assert_eq!(outputs[0].status.code(), Some(0));
    assert_eq!(outputs[2].status.code(), Some(2));
    assert!(stderr(&outputs[2]).contains("\"level\":\"ERROR\""));
}

/// Commands that read never create a ledger: on a missing SQLite file they say so
/// (exit 5) and leave no file or directory behind; `flow migrate` creates one.
#[test]
fn read_commands_on_a_missing_ledger_create_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let here = || {
        let mut cmd = crate::support::flow();
        cmd.current_dir(dir.path());
        cmd
    };
    for args in [
        vec!["runs"],
        vec!["show", "run_x"],
        vec!["events"],
        vec!["cancel", "run_x"],
        vec!["resume", "run_x"],
    ] {
        let out = output(here().args(&args));
        assert_eq!(out.status.code(), Some(5), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("no ledger at"),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(
            !dir.path().join(".flow").exists(),
            "{args:?} created .flow/"
        );
    }
    let nowhere = dir.path().join("nonexistent/dir/x.db");
    let out = output(
        here()
            .arg("--db")
            .arg(format!("sqlite://{}", nowhere.display()))
            .arg("runs"),
    );
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        !dir.path().join("nonexistent").exists(),
        "the directory was created"
    );
    let migrated = output(here().arg("migrate"));
    assert_eq!(migrated.status.code(), Some(0), "{}", stderr(&migrated));
    let listed = output(here().arg("runs"));
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
}

/// A read command on a PostgreSQL database that does not exist says so (exit 5, naming
/// the database) and does not create it: flow never creates PostgreSQL databases.
#[test]
fn read_commands_on_a_missing_postgres_database_create_nothing() {
    if !crate::support::postgres_available() {
        return;
    }
    let (host, port) = crate::support::postgres_admin();
    let name = format!(
        "flow_it_missing_{}",
        ulid::Ulid::generate().to_string().to_lowercase()
    );
    let url = format!("postgres://postgres@{host}:{port}/{name}");
    for args in [vec!["runs"], vec!["show", "run_x"], vec!["events"]] {
        let out = output(crate::support::flow().args(["--db", &url]).args(&args));
        assert_eq!(out.status.code(), Some(5), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(&name), "{args:?}: {}", stderr(&out));
    }
    let listed = crate::support::pg_client("psql")
        .args(["-d", "test", "-tAc"])
        .arg(format!(
            "SELECT count(*) FROM pg_database WHERE datname = '{name}'"
        ))
        .output()
        .expect("psql");
    assert_eq!(String::from_utf8_lossy(&listed.stdout).trim(), "0");
}

/// A flow.toml with an unknown key or a value of the wrong type is refused (exit 5)
/// with `FILE:LINE:COL: error: …` on one line, before anything runs.
#[test]
fn flow_toml_mistakes_are_reported_at_file_line_and_column() {
    let db = TestDb::new(Backend::Sqlite);
    let hello = repo().join("workflows/hello.yaml");
    for (text, at, says) in [
        (
            "[egress]\nallow = [\"x\"]\nalow = 1\n",
            ":3:1: error: ",
            "unknown field `alow`",
        ),
        ("[egress]\nallow = 7\n", ":2:9: error: ", "invalid type"),
        // Malformed patterns are refused where they stand, not kept matching nothing.
        ("[egress]\nallow = [\"\"]\n", ":2:10: error: ", "is empty"),
        (
            "[egress]\nallow = [\"a\", \"*.\"]\n",
            ":2:15: error: ",
            "no name after `*.`",
        ),
        (
            "[egress]\nallow = [\"http://x\"]\n",
            ":2:10: error: ",
            "is a URL",
        ),
    ] {
        let config = db.write("flow.toml", text);
        let out = output(
            db.flow()
                .arg("--config")
                .arg(&config)
                .arg("run")
                .arg(&hello)
                .args(["--input", "name=Ada"]),
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(5), "{err}");
        let first = err.lines().next().unwrap_or_default();
        assert_eq!(
            first.split(at).next(),
            Some(config.display().to_string().as_str()),
            "{err}"
        );
        assert!(first.contains(says), "{err}");
    }
    crate::support::no_runs(&db);
}
