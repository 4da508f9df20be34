//! Secrets never reach disk or logs: not the database files, not `flow show --json`,
//! not logs at `RUST_LOG=trace`, not stored errors — even when the downstream echoes
//! the secret back.

use flow_adapters::testkit::http::{Behavior, CountingServer};

use crate::support::{Backend, TestDb, output, run_id, runtime, show, stderr, stdout};

pub(crate) const SECRET: &str = "sk_live_Zq8v3N1xT7pW";

/// A downstream that echoes the secret back, and a second call quoting it (also used by
/// the events test: no secret in any event).
pub(crate) fn workflow(url: &str) -> String {
    format!(
        r#"name: secretive
tools:
  api:
    kind: http
    method: POST
    url: "{url}/echo"
    headers: {{ Authorization: "Bearer ${{{{ secrets.API_TOKEN }}}}" }}
  rejecting:
    kind: http
    method: POST
    url: "{url}/reject"
nodes:
  call:
    tool: api
    with: {{ token_in_body: "${{{{ secrets.API_TOKEN }}}}", note: "x-${{{{ secrets.API_TOKEN }}}}-y" }}
  denied:
    needs: [call]
    tool: rejecting
    with: {{ echoed: "${{{{ nodes.call.output }}}}", secret: "${{{{ secrets.API_TOKEN }}}}" }}
    continue_on_error: true
"#
    )
}

fn files_with(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut hits = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap_or_default();
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                hits.push(path.display().to_string());
            }
        }
    }
    hits
}

#[test]
fn a_secret_appears_nowhere_even_when_echoed() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    // The echo document returns the request body, and a 400 body is quoted in errors.
    server.set(
        "/reject",
        Behavior::Json {
            status: 400,
            body: serde_json::json!({ "error": format!("bad token {SECRET}") }),
        },
    );
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("w.yaml", &workflow(&server.url()));
    let out = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("FLOW_SECRET_API_TOKEN", SECRET)
            .env("RUST_LOG", "trace"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The downstream did get the real value.
    let log = server.log();
    assert!(
        log.iter()
            .any(|r| r.header("authorization") == Some(&format!("Bearer {SECRET}"))),
        "the secret was not sent"
    );
    assert!(
        log.iter().any(|r| r.body.to_string().contains(SECRET)),
        "the secret was not in the body"
    );
    // Nothing flow wrote holds it.
    assert!(!stdout(&out).contains(SECRET), "stdout leaks the secret");
    assert!(stderr(&out).len() > 1000, "trace logs expected");
    assert!(!stderr(&out).contains(SECRET), "logs leak the secret");
    let run = run_id(&out);
    let s = show(&db, &run).to_string();
    assert!(!s.contains(SECRET), "show --json leaks the secret: {s}");
    assert!(
        s.contains("$secret"),
        "show should say where a secret was: {s}"
    );
    let human = output(db.flow().args(["show", &run]));
    assert!(!stdout(&human).contains(SECRET));
    assert!(
        files_with(db.dir.path(), SECRET).is_empty(),
        "database files leak the secret: {:?}",
        files_with(db.dir.path(), SECRET)
    );
    // Also after a crash that leaves the WAL un-checkpointed.
    let crashed = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("FLOW_SECRET_API_TOKEN", SECRET)
            .env("FLOW_FAULT", "after_complete:denied"),
    );
    assert_eq!(crashed.status.code(), None);
    assert!(
        files_with(db.dir.path(), SECRET).is_empty(),
        "database files leak the secret after a crash: {:?}",
        files_with(db.dir.path(), SECRET)
    );
}

#[test]
fn a_missing_secret_fails_the_node_before_any_claim() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("w.yaml", &workflow(&server.url()));
    let out = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env_remove("FLOW_SECRET_API_TOKEN"),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("secret `API_TOKEN` is not set"),
        "{}",
        stderr(&out)
    );
    let s = show(&db, &run_id(&out));
    assert_eq!(
        s["tool_calls"].as_array().map(Vec::len),
        Some(0),
        "no claim: {s:#}"
    );
    assert_eq!(server.total(), 0);
}

#[test]
fn secrets_file_provides_values_and_the_environment_wins() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("w.yaml", &workflow(&server.url()));
    let secrets = db.write("secrets.env", "API_TOKEN=from-file-value\n");
    let out = output(
        db.flow()
            .arg("--secrets-file")
            .arg(&secrets)
            .arg("run")
            .arg(&file),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        server
            .log()
            .iter()
            .any(|r| r.header("authorization") == Some("Bearer from-file-value"))
    );
    let bad = db.write("bad.env", "API_TOKEN from-file-value-broken\n");
    let out = output(
        db.flow()
            .arg("--secrets-file")
            .arg(&bad)
            .arg("run")
            .arg(&file),
    );
    assert_eq!(out.status.code(), Some(5));
    assert!(
        !stderr(&out).contains("from-file-value-broken"),
        "{}",
        stderr(&out)
    );
}
