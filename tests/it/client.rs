//! Client mode through the real binary: `flow submit/runs/show --server URL --token-env
//! VAR` against a real `flow serve`, from a directory and `--db` that hold no ledger (so
//! nothing can have gone to a database directly); the server's problems printed as
//! `error: <title>: <detail>` with exit 2 for a refused request and 5 for an
//! unreachable server.

use std::process::{Command, Output};

use crate::api::{OPERATOR, VIEWER, serve};
use crate::support::{Backend, TestDb, flow, output, show, stderr, stdout};

/// `flow ARGS --server URL --token-env T` with `T=token`, run from an empty directory
/// with a `--db` that does not exist.
pub(crate) fn client(
    dir: &std::path::Path,
    server: &str,
    token: Option<&str>,
    args: &[&str],
) -> Output {
    let mut cmd: Command = flow();
    cmd.current_dir(dir)
        .args(["--db", "sqlite:///nonexistent/flow.db"])
        .args(args)
        .args(["--server", server, "--token-env", "FLOW_TEST_TOKEN"]);
    match token {
        Some(t) => cmd.env("FLOW_TEST_TOKEN", t),
        None => cmd.env_remove("FLOW_TEST_TOKEN"),
    };
    output(&mut cmd)
}

const WF: &str = "name: hi\ninputs:\n  who: { type: string, default: world }\nnodes:\n  greet: { tool: echo, with: { msg: \"${{ inputs.who }}\" } }\ntools:\n  echo: { kind: function, function: core.echo }\n";

#[test]
fn submit_runs_and_show_go_through_the_server() {
    let db = TestDb::new(Backend::Sqlite);
    let server = serve(&db);
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let file = elsewhere.path().join("hi.yaml");
    std::fs::write(&file, WF).expect("write");
    let file = file.to_string_lossy().to_string();
    let dir = elsewhere.path();
    let base = server.base.as_str();

    let out = client(
        dir,
        base,
        Some(OPERATOR),
        &["submit", &file, "--input", "who=Ada", "--run-id", "r-1"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "r-1");
    assert!(stderr(&out).contains("queued (hi)"), "{}", stderr(&out));
    assert_eq!(
        show(&db, "r-1")["run"]["status"],
        "queued",
        "it went through the server"
    );
    let again = client(
        dir,
        base,
        Some(OPERATOR),
        &["submit", &file, "--input", "who=Ada", "--run-id", "r-1"],
    );
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("exists with the same workflow and inputs"),
        "{}",
        stderr(&again)
    );
    let other = client(
        dir,
        base,
        Some(OPERATOR),
        &["submit", &file, "--input", "who=Bob", "--run-id", "r-1"],
    );
    assert_eq!(other.status.code(), Some(2), "{}", stderr(&other));
    assert!(
        stderr(&other).starts_with("error: Conflict: run `r-1`"),
        "{}",
        stderr(&other)
    );
    let second = client(dir, base, Some(OPERATOR), &["submit", &file]);
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    let second_id = stdout(&second).trim().to_string();

    // Refusals: a viewer may not submit, no token at all, an unknown run.
    let viewer = client(dir, base, Some(VIEWER), &["submit", &file]);
    assert_eq!(viewer.status.code(), Some(2));
    assert_eq!(
        stderr(&viewer).trim(),
        "error: Forbidden: token `vera` has role viewer; this needs operator"
    );
    let none = client(dir, base, None, &["runs"]);
    assert_eq!(none.status.code(), Some(2));
    assert!(
        stderr(&none).starts_with("error: Unauthorized: no token"),
        "{}",
        stderr(&none)
    );
    assert!(
        stderr(&none).contains("no token was sent"),
        "{}",
        stderr(&none)
    );
    let unknown = client(dir, base, Some(VIEWER), &["show", "nope"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert_eq!(stderr(&unknown).trim(), "error: Not Found: no run `nope`");

    // Listing with the server's cursor, and show --json equal to the local one.
    let page = client(dir, base, Some(VIEWER), &["runs", "--json", "--limit", "1"]);
    assert_eq!(page.status.code(), Some(0), "{}", stderr(&page));
    let first: serde_json::Value = serde_json::from_str(&stdout(&page)).expect("json");
    assert_eq!(first[0]["id"], second_id.as_str(), "newest first: {first}");
    let more = stderr(&page);
    let cursor = more
        .split("--cursor ")
        .nth(1)
        .map(str::trim)
        .expect("a next page");
    assert!(more.contains(&format!("--server {base}")), "{more}");
    let next = client(
        dir,
        base,
        Some(VIEWER),
        &["runs", "--json", "--limit", "1", "--cursor", cursor],
    );
    let rest: serde_json::Value = serde_json::from_str(&stdout(&next)).expect("json");
    assert_eq!(rest[0]["id"], "r-1", "{rest}");
    assert!(!stderr(&next).contains("more runs"), "the last page");
    let table = client(dir, base, Some(VIEWER), &["runs", "--status", "queued"]);
    assert!(
        stdout(&table).contains("r-1") && stdout(&table).contains("queued"),
        "{}",
        stdout(&table)
    );
    let json = client(dir, base, Some(VIEWER), &["show", "r-1", "--json"]);
    let remote: serde_json::Value = serde_json::from_str(&stdout(&json)).expect("json");
    assert_eq!(
        remote,
        show(&db, "r-1"),
        "the same object as flow show --json"
    );
    let human = client(dir, base, Some(VIEWER), &["show", "r-1"]);
    assert!(
        stdout(&human).starts_with("run r-1  queued  workflow hi"),
        "{}",
        stdout(&human)
    );
}

#[test]
fn client_mode_reports_an_unreachable_or_bad_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let gone = client(
        dir.path(),
        &format!("http://127.0.0.1:{port}"),
        Some(VIEWER),
        &["runs"],
    );
    assert_eq!(gone.status.code(), Some(5), "{}", stderr(&gone));
    assert!(
        stderr(&gone).starts_with("error: cannot reach the server at http://127.0.0.1:"),
        "{}",
        stderr(&gone)
    );
    let bad = client(dir.path(), "ftp://example", Some(VIEWER), &["runs"]);
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(
        stderr(&bad).trim(),
        "error: --server `ftp://example` is not an http:// or https:// URL"
    );
    // A malformed --input is refused before the server is asked (exit 2, not 5).
    let pair = client(
        dir.path(),
        "http://127.0.0.1:1",
        Some(VIEWER),
        &["runs", "--input", "order_id"],
    );
    assert_eq!(pair.status.code(), Some(2), "{}", stderr(&pair));
    assert!(
        stderr(&pair).contains("expected NAME=VALUE"),
        "{}",
        stderr(&pair)
    );
}

/// `flow resume --server`: a garbage `--output` is refused here and writes nothing; a
/// viewer's token is refused by the server (exit 2); an operator's resolve settles the
/// call as that token's name and the server re-queues the run for its daemons; without
/// `--resolve` a paused run is re-queued.
#[test]
fn resume_resolves_and_requeues_through_the_server() {
    let rt = crate::support::runtime();
    let downstream = rt
        .block_on(flow_adapters::testkit::http::CountingServer::start())
        .expect("downstream");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("pay.yaml", &crate::crash::workflow(&downstream.url()));
    let run = crate::api_doubt::paused_run(&db, &file);
    let server = serve(&db);
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let (dir, base) = (elsewhere.path(), server.base.as_str());
    let resolve = |token, output: &str| {
        let args = [
            "resume",
            run.as_str(),
            "--resolve",
            "charge=succeeded",
            "--output",
            output,
        ];
        client(dir, base, Some(token), &args)
    };
    let garbage = resolve(OPERATOR, "{not json");
    assert_eq!(garbage.status.code(), Some(2), "{}", stderr(&garbage));
    let viewer = resolve(VIEWER, r#"{"count": 1}"#);
    assert_eq!(viewer.status.code(), Some(2), "{}", stderr(&viewer));
    assert!(
        stderr(&viewer).starts_with("error: "),
        "{}",
        stderr(&viewer)
    );
    assert_eq!(
        crate::support::call(&show(&db, &run), "charge")["status"],
        "in_doubt",
        "nothing written"
    );
    let ok = resolve(OPERATOR, r#"{"count": 1}"#);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    assert_eq!(stdout(&ok).trim(), run);
    let s = show(&db, &run);
    assert_eq!(
        crate::support::call(&s, "charge")["resolution"]["by"],
        "otto",
        "{s}"
    );
    assert_eq!(
        s["run"]["status"], "queued",
        "re-queued for the daemons: {s}"
    );

    // Without --resolve: a paused run goes back on the queue.
    let second = crate::api_doubt::paused_run(&db, &file);
    let requeued = client(dir, base, Some(OPERATOR), &["resume", &second]);
    assert_eq!(requeued.status.code(), Some(0), "{}", stderr(&requeued));
    assert_eq!(show(&db, &second)["run"]["status"], "queued");
}
