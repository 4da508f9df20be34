//! The operator API (`flow serve`) through the real binary on both backends: tokens and
//! roles, problem+json errors (401/403/404/400/413/422/409), idempotent submit, batch
//! submit, listing with cursors, cancel and resume with their audit rows, and the
//! start-up refusals.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Backend, TestDb, backends, output, runtime, show, stderr};

/// Token values of the three test tokens (`FLOW_SECRET_*`).
pub(crate) const VIEWER: &str = "viewer-token-1";
pub(crate) const OPERATOR: &str = "operator-token-1";
pub(crate) const ADMIN: &str = "admin-token-1";

pub(crate) const TOKENS: &str = r#"
[[api.tokens]]
name = "vera"
role = "viewer"
secret = "VIEWER_TOKEN"

[[api.tokens]]
name = "otto"
role = "operator"
secret = "OPERATOR_TOKEN"

[[api.tokens]]
name = "ada"
role = "admin"
secret = "ADMIN_TOKEN"
"#;

/// A running `flow serve` on a free loopback port; killed when dropped.
pub(crate) struct Server {
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `flow serve` for `db` with the three test tokens, once it listens.
pub(crate) fn serve(db: &TestDb) -> Server {
    db.write("flow.toml", TOKENS);
    let mut cmd = db.flow();
    cmd.args(["serve", "--addr", "127.0.0.1:0"])
        .env("FLOW_SECRET_VIEWER_TOKEN", VIEWER)
        .env("FLOW_SECRET_OPERATOR_TOKEN", OPERATOR)
        .env("FLOW_SECRET_ADMIN_TOKEN", ADMIN);
    start(cmd, "listening on ")
}

/// Starts `cmd` and waits for the stderr line holding `marker` followed by the URL.
pub(crate) fn start(mut cmd: Command, marker: &str) -> Server {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start flow serve: {e}"));
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut seen = String::new();
    let base = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            panic!("flow serve ended before listening:\n{seen}");
        };
        seen.push_str(&line);
        seen.push('\n');
        if let Some(rest) = line.split(marker).nth(1) {
            let url = rest.split_whitespace().next().unwrap_or_default();
            break url.trim_end_matches("/api/v1").to_string();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Server { child, base }
}

/// One request: method, path, token, JSON body; returns status and parsed body.
pub(crate) async fn call(
    server: &Server,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let client = reqwest::Client::new();
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut req = client.request(method, format!("{}{path}", server.base));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status();
    let is_problem = resp
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap_or_default() == "application/problem+json");
    let text = resp.text().await.expect("body");
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if !status.is_success() && status != StatusCode::REQUEST_TIMEOUT {
        assert!(is_problem, "{status} is not problem+json: {value}");
    }
    (status, value)
}

pub(crate) const HELLO: &str = "name: hello\ninputs:\n  who: { type: string, default: world }\nnodes:\n  greet: { tool: echo, with: { msg: \"${{ inputs.who }}\" } }\ntools:\n  echo: { kind: function, function: core.echo }\n";

#[test]
fn roles_errors_and_submit_on_both_backends() {
    for backend in backends() {
        roles_errors_and_submit(backend);
    }
}

fn roles_errors_and_submit(backend: Backend) {
    let db = TestDb::new(backend);
    let server = serve(&db);
    let rt = runtime();
    rt.block_on(async {
        let ctx = format!("{backend:?}");
        // 401 without or with a wrong token; 403 for a role too low.
        let (s, p) = call(&server, "GET", "/api/v1/runs", None, None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{ctx}: {p}");
        assert_eq!(p["status"], 401);
        let (s, _) = call(&server, "GET", "/api/v1/runs", Some("nope"), None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{ctx}");
        let submit = json!({"workflow": HELLO, "inputs": {"who": "Ada"}, "run_id": "r-1"});
        let (s, p) = call(
            &server,
            "POST",
            "/api/v1/runs",
            Some(VIEWER),
            Some(submit.clone()),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{ctx}: {p}");
        assert!(
            p["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("operator"),
            "{p}"
        );
        // Submit: 201, the same again 200, other inputs 409 naming them.
        let (s, p) = call(
            &server,
            "POST",
            "/api/v1/runs",
            Some(OPERATOR),
            Some(submit.clone()),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{ctx}: {p}");
        assert_eq!(p["id"], "r-1");
        let (s, p) = call(
            &server,
            "POST",
            "/api/v1/runs",
            Some(OPERATOR),
            Some(submit),
        )
        .await;
        assert_eq!((s, &p["id"]), (StatusCode::OK, &json!("r-1")), "{ctx}: {p}");
        let other = json!({"workflow": HELLO, "inputs": {"who": "Bob"}, "run_id": "r-1"});
        let (s, p) = call(&server, "POST", "/api/v1/runs", Some(ADMIN), Some(other)).await;
        assert_eq!(s, StatusCode::CONFLICT, "{ctx}: {p}");
        assert_eq!(p["differs"], "inputs", "{p}");
        // GET a run: exactly `flow show --json`; unknown: 404.
        let (s, got) = call(&server, "GET", "/api/v1/runs/r-1", Some(VIEWER), None).await;
        assert_eq!(s, StatusCode::OK, "{ctx}");
        assert_eq!(got, show(&db, "r-1"), "{ctx}");
        assert_eq!(got["audit"][0]["by"], "otto", "{ctx}: who submitted: {got}");
        let (s, _) = call(&server, "GET", "/api/v1/runs/nope", Some(VIEWER), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{ctx}");
        let (s, _) = call(&server, "GET", "/api/v1/nothing", Some(VIEWER), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{ctx}");
        openapi_is_committed(&server).await;
        bad_input(&server, &ctx).await;
        batch_and_paging(&server, &ctx).await;
        cancel_and_resume(&server, &db, &ctx).await;
    });
}

/// 400 naming the field, 422 with every diagnostic, 413 over the body limit; nothing
/// is queued by any of them.
async fn bad_input(server: &Server, ctx: &str) {
    let cases = [
        (json!({"workflow": HELLO, "inptus": {}}), "inptus"),
        (json!({"workflow": 7}), "workflow"),
        (json!({"workflow": HELLO, "inputs": {"who": 5}}), "who"),
        (json!({"workflow": HELLO, "run_id": "a b"}), "run_id"),
    ];
    for (body, field) in cases {
        let (s, p) = call(server, "POST", "/api/v1/runs", Some(OPERATOR), Some(body)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{ctx}: {p}");
        assert!(
            p["detail"].as_str().unwrap_or_default().contains(field),
            "{ctx}: {field}: {p}"
        );
    }
    let (s, p) = call(server, "GET", "/api/v1/runs?limit=x", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{ctx}: {p}");
    assert!(
        p["detail"].as_str().unwrap_or_default().contains("limit"),
        "{p}"
    );
    let broken = "name: broken\nnodes:\n  a: { tool: nope }\n  b: { tool: echo, needs: [zz] }\ntools:\n  echo: { kind: function, function: core.echo }\n";
    let (s, p) = call(
        server,
        "POST",
        "/api/v1/runs",
        Some(OPERATOR),
        Some(json!({"workflow": broken})),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{ctx}: {p}");
    let errors = p["errors"].as_array().cloned().unwrap_or_default();
    assert!(errors.len() >= 2, "{ctx}: every diagnostic: {p}");
    assert!(
        errors.iter().all(|e| e["text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("workflow.yaml:")),
        "{p}"
    );
    assert_eq!(errors[0]["line"], 3, "{p}");
    let huge = json!({"workflow": "x".repeat(17 * 1024 * 1024)});
    let (s, _) = call(server, "POST", "/api/v1/runs", Some(OPERATOR), Some(huge)).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{ctx}");
    let (_, listed) = call(server, "GET", "/api/v1/runs", Some(VIEWER), None).await;
    assert_eq!(
        listed["runs"].as_array().map(Vec::len),
        Some(1),
        "{ctx}: only r-1: {listed}"
    );
}

/// A batch is one commit (a conflict inside it queues none of it); pages follow
/// `next_cursor` to the end.
async fn batch_and_paging(server: &Server, ctx: &str) {
    let runs: Vec<Value> = (0..5)
        .map(|i| json!({"workflow": HELLO, "inputs": {"who": format!("p{i}")}, "run_id": format!("b-{i}")}))
        .collect();
    let (s, p) = call(
        server,
        "POST",
        "/api/v1/runs:batch",
        Some(OPERATOR),
        Some(json!({"runs": runs})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{ctx}: {p}");
    assert_eq!(p["runs"].as_array().map(Vec::len), Some(5));
    let clash = json!({"runs": [
        {"workflow": HELLO, "run_id": "c-new"},
        {"workflow": HELLO, "inputs": {"who": "other"}, "run_id": "b-0"},
    ]});
    let (s, p) = call(
        server,
        "POST",
        "/api/v1/runs:batch",
        Some(OPERATOR),
        Some(clash),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "{ctx}: {p}");
    let (s, _) = call(server, "GET", "/api/v1/runs/c-new", Some(VIEWER), None).await;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "{ctx}: the whole batch was rolled back"
    );
    let mut seen = Vec::new();
    let mut path = "/api/v1/runs?limit=2".to_string();
    loop {
        let (s, page) = call(server, "GET", &path, Some(VIEWER), None).await;
        assert_eq!(s, StatusCode::OK, "{ctx}: {page}");
        for r in page["runs"].as_array().cloned().unwrap_or_default() {
            seen.push(r["id"].as_str().unwrap_or_default().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/api/v1/runs?limit=2&cursor={c}"),
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, ["b-0", "b-1", "b-2", "b-3", "b-4", "r-1"], "{ctx}");
    let (s, p) = call(
        server,
        "GET",
        "/api/v1/runs?status=queued&workflow=hello&since=1h",
        Some(VIEWER),
        None,
    )
    .await;
    assert_eq!(
        (s, p["runs"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(6)),
        "{ctx}: {p}"
    );
    let (s, p) = call(server, "GET", "/api/v1/events?limit=3", Some(VIEWER), None).await;
    assert_eq!(s, StatusCode::OK, "{ctx}: {p}");
    assert_eq!(p["events"].as_array().map(Vec::len), Some(3), "{p}");
    let after = p["next_after"].clone();
    let (_, more) = call(
        server,
        "GET",
        &format!("/api/v1/events?after={after}"),
        Some(VIEWER),
        None,
    )
    .await;
    assert!(more["events"][0]["seq"].as_i64() > after.as_i64(), "{more}");
}

/// Cancel and resume record who and why; a finished run is a 409.
async fn cancel_and_resume(server: &Server, db: &TestDb, ctx: &str) {
    let why = json!({"reason": "wrong customer"});
    let (s, p) = call(
        server,
        "POST",
        "/api/v1/runs/b-1/cancel",
        Some(VIEWER),
        Some(why.clone()),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{ctx}: {p}");
    let (s, p) = call(
        server,
        "POST",
        "/api/v1/runs/b-1/cancel",
        Some(OPERATOR),
        Some(why),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{ctx}: {p}");
    assert_eq!(p["run"]["status"], "cancelled", "{p}");
    let audit = show(db, "b-1")["audit"].clone();
    let cancelled = audit
        .as_array()
        .and_then(|a| a.iter().find(|e| e["event"] == "run.cancelled"))
        .cloned();
    assert_eq!(
        cancelled.map(|e| (e["by"].clone(), e["reason"].clone())),
        Some((json!("otto"), json!("wrong customer"))),
        "{ctx}: {audit}"
    );
    let (s, p) = call(
        server,
        "POST",
        "/api/v1/runs/b-1/resume",
        Some(OPERATOR),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "{ctx}: {p}");
    let (s, _) = call(
        server,
        "POST",
        "/api/v1/runs/zz/cancel",
        Some(OPERATOR),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{ctx}");
    let (s, p) = call(
        server,
        "POST",
        "/api/v1/runs/b-2/resume",
        Some(OPERATOR),
        Some(json!({"bogus": 1})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{ctx}: {p}");
}

#[test]
fn serve_refuses_to_start_unsafely() {
    let db = TestDb::new(Backend::Sqlite);
    let out = output(db.flow().args(["serve", "--addr", "127.0.0.1:0"]));
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(stderr(&out).contains("[[api.tokens]]"), "{}", stderr(&out));
    let out = output(
        db.flow()
            .args(["serve", "--insecure-no-auth", "--addr", "0.0.0.0:0"]),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("loopback"), "{}", stderr(&out));
    db.write("flow.toml", TOKENS);
    let out = output(db.flow().args(["serve", "--addr", "127.0.0.1:0"]));
    assert_eq!(
        out.status.code(),
        Some(5),
        "missing token secrets: {}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("VIEWER_TOKEN"), "{}", stderr(&out));
    std::fs::remove_file(db.dir.path().join("flow.toml")).expect("rm");
    let mut cmd = db.flow();
    cmd.args(["serve", "--insecure-no-auth", "--addr", "127.0.0.1:0"]);
    let server = start(cmd, "listening on ");
    let rt = runtime();
    rt.block_on(async {
        let health = reqwest::get(format!("{}/healthz", server.base))
            .await
            .expect("healthz");
        assert_eq!(health.status(), StatusCode::OK);
        let metrics = reqwest::get(format!("{}/metrics", server.base))
            .await
            .expect("metrics");
        assert!(
            metrics
                .text()
                .await
                .unwrap_or_default()
                .contains("flow_runs")
        );
        let (s, p) = call(&server, "GET", "/api/v1/in-doubt", None, None).await;
        assert_eq!(s, StatusCode::OK, "no auth: {p}");
    });
}

/// `flow daemon --serve` serves the same API, with the same tokens, beside its workers:
/// a run submitted through it is executed by that daemon — at once, though the daemon
/// polls only every minute: on SQLite too, its own API's enqueues wake its claim loop.
#[test]
fn a_daemon_serves_the_api_and_runs_what_it_takes() {
    let db = TestDb::new(Backend::Sqlite);
    db.write("flow.toml", TOKENS);
    let mut cmd = db.flow();
    cmd.args(["daemon", "--poll-interval", "60s", "--serve", "127.0.0.1:0"])
        .env("FLOW_SECRET_VIEWER_TOKEN", VIEWER)
        .env("FLOW_SECRET_OPERATOR_TOKEN", OPERATOR)
        .env("FLOW_SECRET_ADMIN_TOKEN", ADMIN);
    let server = start(cmd, "API at ");
    let rt = runtime();
    rt.block_on(async {
        let body = json!({"workflow": HELLO, "inputs": {"who": "Ada"}, "run_id": "d-1"});
        let (s, p) = call(
            &server,
            "POST",
            "/api/v1/runs",
            Some(VIEWER),
            Some(body.clone()),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{p}");
        // The second run is submitted while the daemon waits out its minute.
        for id in ["d-1", "d-2"] {
            let body = json!({"workflow": HELLO, "inputs": {"who": "Ada"}, "run_id": id});
            let (s, p) = call(&server, "POST", "/api/v1/runs", Some(OPERATOR), Some(body)).await;
            assert_eq!(s, StatusCode::CREATED, "{p}");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
            loop {
                let path = format!("/api/v1/runs/{id}");
                let (_, run) = call(&server, "GET", &path, Some(VIEWER), None).await;
                if run["run"]["status"] == "succeeded" {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "not run at once: {run}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    });
}

/// The OpenAPI document the server serves is the committed `docs/openapi.json`
/// (`FLOW_BLESS=1` rewrites the file).
async fn openapi_is_committed(server: &Server) {
    let served = reqwest::get(format!("{}/api/v1/openapi.json", server.base))
        .await
        .expect("openapi")
        .text()
        .await
        .expect("body");
    let doc: Value = serde_json::from_str(&served).expect("openapi is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    let path = crate::support::repo().join("docs/openapi.json");
    assert!(
        crate::support::golden(&path, &served).is_ok(),
        "docs/openapi.json is stale: run `FLOW_BLESS=1 cargo nextest run -E 'test(/^api::roles/)'`"
    );
}
