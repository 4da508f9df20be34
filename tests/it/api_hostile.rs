//! The operator API against a hostile user, through the real binary: NUL and control
//! characters in paths, queries and bodies (400, never a 503 with the database's
//! words), run ids `.` and `..` at every entry point, duplicate token values, DNS
//! rebinding against `--insecure-no-auth` (Host and Origin), throttled and counted
//! failed authentications (API and console), and `/metrics` behind `metrics_token`.

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use crate::api::{ADMIN, HELLO, OPERATOR, Server, TOKENS, VIEWER, serve, start};
use crate::support::{Backend, TestDb, backends, flow, output, runtime, stderr, stdout};

/// One request with extra headers; returns status, headers and the parsed body. Every
/// error must be problem+json (the console's pages aside, which callers check).
async fn send(
    base: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, HeaderMap, Value) {
    let client = reqwest::Client::new();
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut req = client.request(method, format!("{base}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status();
    let headers = resp.headers().clone();
    let text = resp.text().await.expect("body");
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, headers, value)
}

fn detail(p: &Value) -> String {
    p["detail"].as_str().unwrap_or_default().to_string()
}

fn is_problem(h: &HeaderMap) -> bool {
    h.get("content-type")
        .is_some_and(|v| v.to_str().unwrap_or_default() == "application/problem+json")
}

#[test]
fn nul_bytes_are_refused_as_400_never_503_on_both_backends() {
    for backend in backends() {
        nul_bytes_are_refused(backend);
    }
}

fn nul_bytes_are_refused(backend: Backend) {
    let db = TestDb::new(backend);
    let server = serve(&db);
    let base = server.base.as_str();
    runtime().block_on(async {
        let ctx = format!("{backend:?}");
        for id in ["r-1", "r-2"] {
            let body = json!({"workflow": HELLO, "run_id": id});
            let (s, _, p) = send(
                base,
                "POST",
                "/api/v1/runs",
                Some(OPERATOR),
                &[],
                Some(body),
            )
            .await;
            assert_eq!(s, StatusCode::CREATED, "{ctx}: {p}");
        }
        for (method, path) in [
            ("GET", "/api/v1/runs/%00"),
            ("GET", "/api/v1/runs?workflow=%00"),
            ("GET", "/api/v1/runs?workflow=a%0Ab"),
            ("GET", "/api/v1/in-doubt?node=%00"),
            ("GET", "/api/v1/in-doubt?run=r-1%00"),
            ("GET", "/api/v1/events?run=%00"),
            ("POST", "/api/v1/runs/%00x/cancel"),
            ("POST", "/api/v1/runs/r-1%7F/resume"),
            ("GET", "/api/v1/runs/%FF"),
            ("GET", "/ui/runs/%00"),
        ] {
            let (s, h, p) = send(base, method, path, Some(ADMIN), &[], None).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{ctx}: {method} {path}: {p}");
            assert!(is_problem(&h), "{ctx}: {method} {path}: {h:?}");
            let d = detail(&p);
            assert!(
                (d.contains("control character") || d.contains("UTF-8")) && !d.contains("database"),
                "{ctx}: {method} {path}: {d}"
            );
        }
        // NULs inside JSON bodies reach the ledger as text: never a 5xx, never the
        // database's words (PostgreSQL refuses them; SQLite stores them).
        let bodies = [
            (
                "/api/v1/runs",
                json!({"workflow": HELLO, "inputs": {"who": "a\u{0}b"}}),
            ),
            ("/api/v1/runs/r-2/cancel", json!({"reason": "x\u{0}y"})),
            (
                "/api/v1/runs",
                json!({"workflow": HELLO, "run_id": "n\u{0}l"}),
            ),
        ];
        for (path, body) in bodies {
            let (s, _, p) = send(base, "POST", path, Some(OPERATOR), &[], Some(body)).await;
            assert!(!s.is_server_error(), "{ctx}: {path}: {s} {p}");
            assert!(
                !detail(&p).contains("database") && !detail(&p).contains("0x00"),
                "{ctx}: {path}: {p}"
            );
        }
        let (s, _, p) = send(base, "GET", "/api/v1/runs/r-1", Some(VIEWER), &[], None).await;
        assert_eq!(s, StatusCode::OK, "{ctx}: the server still serves: {p}");
    });
    // The CLI's client refuses such an id before sending (exit 2, not 5).
    let out = output(
        flow()
            .args(["show", "r\u{1}", "--server", &server.base])
            .env("FLOW_TOKEN", VIEWER),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("run id"), "{}", stderr(&out));
}

#[test]
fn run_ids_dot_and_dot_dot_are_refused_at_every_entry_point() {
    let db = TestDb::new(Backend::Sqlite);
    let server = serve(&db);
    let base = server.base.clone();
    let file = db.write("hello.yaml", HELLO);
    let file = file.to_string_lossy().to_string();
    runtime().block_on(async {
        let long = "x".repeat(129);
        for bad in [".", "..", "", "a/b", long.as_str(), "a\u{0}"] {
            let body = json!({"workflow": HELLO, "run_id": bad});
            let (s, h, p) = send(
                &base,
                "POST",
                "/api/v1/runs",
                Some(OPERATOR),
                &[],
                Some(body),
            )
            .await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{bad:?}: {p}");
            assert!(
                is_problem(&h) && detail(&p).contains("run_id"),
                "{bad:?}: {p}"
            );
        }
        let batch = json!({"runs": [
            {"workflow": HELLO, "run_id": "fine-1"},
            {"workflow": HELLO, "run_id": ".."},
        ]});
        let (s, _, p) = send(
            &base,
            "POST",
            "/api/v1/runs:batch",
            Some(OPERATOR),
            &[],
            Some(batch),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{p}");
        assert!(detail(&p).contains("runs[1].run_id"), "{p}");
        assert!(detail(&p).contains("dot-segment"), "{p}");
        let (_, _, listed) = send(&base, "GET", "/api/v1/runs", Some(VIEWER), &[], None).await;
        assert_eq!(listed["runs"], json!([]), "nothing was queued: {listed}");
    });
    let cli = |args: &[&str], server: bool| {
        let mut cmd = db.flow();
        cmd.args(args).env("FLOW_TOKEN", OPERATOR);
        if server {
            cmd.args(["--server", &base]);
        }
        output(&mut cmd)
    };
    let cases: Vec<(Vec<&str>, bool)> = vec![
        (vec!["submit", &file, "--run-id", ".."], false),
        (vec!["submit", &file, "--run-id", "."], true),
        (vec!["run", &file, "--run-id", ".."], false),
        (vec!["show", ".."], true),
        (vec!["show", "."], true),
        (vec!["show", ".."], false),
        (vec!["cancel", ".."], false),
        (vec!["resume", ".."], false),
        (vec!["resume", ".."], true),
        (vec!["--tenant", "..", "runs"], false),
        (vec!["--workspace", ".", "runs"], false),
    ];
    for (args, server) in cases {
        let out = cli(&args, server);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?} server={server}: {}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains("dot-segment"),
            "{args:?}: {}",
            stderr(&out)
        );
        assert_eq!(stdout(&out), "", "{args:?}: printed nothing (no runs list)");
    }
}

#[test]
fn duplicate_token_values_or_names_refuse_to_start() {
    let db = TestDb::new(Backend::Sqlite);
    let two = |first: (&str, &str), second: (&str, &str)| {
        format!(
            "[[api.tokens]]\nname = \"{}\"\nrole = \"viewer\"\nsecret = \"{}\"\n\n[[api.tokens]]\nname = \"{}\"\nrole = \"admin\"\nsecret = \"{}\"\n",
            first.0, first.1, second.0, second.1
        )
    };
    let start = |toml: String| {
        db.write("flow.toml", &toml);
        output(
            db.flow()
                .args(["serve", "--addr", "127.0.0.1:0"])
                .env("FLOW_SECRET_A", "the-same-value-1")
                .env("FLOW_SECRET_B", "the-same-value-1")
                .env("FLOW_SECRET_C", "another-value-2"),
        )
    };
    for toml in [
        two(("vera", "A"), ("ada", "B")),
        two(("vera", "A"), ("ada", "A")),
    ] {
        let out = start(toml);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(5), "{err}");
        assert!(
            err.contains("`vera`") && err.contains("`ada`") && err.contains("same value"),
            "{err}"
        );
        assert!(!err.contains("the-same-value-1"), "never the value: {err}");
    }
    let out = start(two(("vera", "A"), ("vera", "C")));
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(stderr(&out).contains("named `vera`"), "{}", stderr(&out));
}

#[test]
fn without_auth_only_loopback_hosts_and_same_origin_changes_are_served() {
    let db = TestDb::new(Backend::Sqlite);
    let mut cmd = db.flow();
    cmd.args(["serve", "--insecure-no-auth", "--addr", "127.0.0.1:0"]);
    let server = start(cmd, "listening on ");
    let base = server.base.as_str();
    let host = base.trim_start_matches("http://");
    let own_origin = base.to_string();
    let port = host.rsplit(':').next().unwrap_or_default().to_string();
    runtime().block_on(async {
        let run = |id: &str| json!({"workflow": HELLO, "run_id": id});
        // DNS rebinding: the attacker's name resolved to 127.0.0.1.
        for bad_host in [
            "attacker.example",
            "attacker.example:8080",
            "127.0.0.1.nip.io",
        ] {
            let (s, h, p) = send(
                base,
                "POST",
                "/api/v1/runs",
                None,
                &[("host", bad_host)],
                Some(run("x-1")),
            )
            .await;
            assert_eq!(s, StatusCode::MISDIRECTED_REQUEST, "{bad_host}: {p}");
            assert!(is_problem(&h), "{h:?}");
            let (s, _, _) = send(
                base,
                "GET",
                "/api/v1/runs",
                None,
                &[("host", bad_host)],
                None,
            )
            .await;
            assert_eq!(s, StatusCode::MISDIRECTED_REQUEST, "{bad_host}: reads too");
        }
        // A cross-origin POST to the right host (a page elsewhere, a form or fetch).
        for origin in [
            "http://attacker.example",
            "null",
            "https://127.0.0.1",
            "http://localhost:1",
        ] {
            let (s, h, p) = send(
                base,
                "POST",
                "/api/v1/runs",
                None,
                &[("origin", origin)],
                Some(run("x-2")),
            )
            .await;
            assert_eq!(s, StatusCode::FORBIDDEN, "{origin}: {p}");
            assert!(is_problem(&h) && detail(&p).contains("Origin"), "{p}");
            let (s, _, p) = send(
                base,
                "POST",
                "/ui/runs/x-2/cancel",
                None,
                &[("origin", origin)],
                None,
            )
            .await;
            assert_eq!(
                s,
                StatusCode::FORBIDDEN,
                "{origin}: the console's forms too: {p}"
            );
        }
        let (_, _, listed) = send(base, "GET", "/api/v1/runs", None, &[], None).await;
        assert_eq!(listed["runs"], json!([]), "nothing was queued: {listed}");
        // Its own origin, other loopback names, and clients without Origin are served.
        let (s, _, p) = send(
            base,
            "POST",
            "/api/v1/runs",
            None,
            &[("origin", &own_origin)],
            Some(run("ok-1")),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{p}");
        let localhost = format!("localhost:{port}");
        let (s, _, p) = send(
            base,
            "POST",
            "/api/v1/runs",
            None,
            &[("host", &localhost)],
            Some(run("ok-2")),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{p}");
        let (s, _, p) = send(
            base,
            "GET",
            "/api/v1/runs/ok-1",
            None,
            &[("origin", "http://attacker.example")],
            None,
        )
        .await;
        assert_eq!(s, StatusCode::OK, "a GET changes nothing: {p}");
    });
}

/// The CSRF token of the console's sign-in form.
async fn sign_in_csrf(base: &str) -> String {
    let page = reqwest::get(format!("{base}/ui/sign-in"))
        .await
        .expect("sign-in page")
        .text()
        .await
        .expect("body");
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_default()
        .to_string()
}

async fn metrics_text(base: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut req = reqwest::Client::new().get(format!("{base}/metrics"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("metrics");
    (resp.status(), resp.text().await.unwrap_or_default())
}

#[test]
fn failed_authentications_are_throttled_and_counted() {
    let db = TestDb::new(Backend::Sqlite);
    let server = serve(&db);
    let base = server.base.as_str();
    runtime().block_on(async {
        for i in 0..10 {
            let (s, _, p) = send(
                base,
                "GET",
                "/api/v1/runs",
                Some(&format!("guess-{i}")),
                &[],
                None,
            )
            .await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "guess {i}: {p}");
        }
        for token in ["guess-11", VIEWER] {
            let (s, h, p) = send(base, "GET", "/api/v1/runs", Some(token), &[], None).await;
            assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{token}: {p}");
            assert!(is_problem(&h), "{h:?}");
            let after: u64 = h
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            assert!((1..=60).contains(&after), "Retry-After: {h:?}");
        }
        let (s, text) = metrics_text(base, None).await;
        assert_eq!(s, StatusCode::OK);
        assert!(
            text.contains("flow_api_auth_failures_total{via=\"api\"} 10"),
            "{text}"
        );
    });
    // The console's sign-in, on a server of its own (its own throttle).
    let db = TestDb::new(Backend::Sqlite);
    let server: Server = serve(&db);
    let base = server.base.as_str();
    runtime().block_on(async {
        let csrf = sign_in_csrf(base).await;
        assert!(!csrf.is_empty(), "no CSRF token on the sign-in page");
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        let sign_in = |token: String| {
            let form = [("csrf", csrf.clone()), ("token", token)];
            client.post(format!("{base}/ui/sign-in")).form(&form).send()
        };
        for i in 0..10 {
            let resp = sign_in(format!("guess-{i}")).await.expect("sign in");
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "guess {i}");
        }
        let resp = sign_in(OPERATOR.to_string()).await.expect("sign in");
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(
            resp.headers().get("retry-after").is_some(),
            "{:?}",
            resp.headers()
        );
        assert!(
            resp.headers().get("set-cookie").is_none(),
            "no session while refused"
        );
        let (_, text) = metrics_text(base, None).await;
        assert!(
            text.contains("flow_api_auth_failures_total{via=\"console\"} 10"),
            "{text}"
        );
    });
}

#[test]
fn metrics_can_require_a_token() {
    let db = TestDb::new(Backend::Sqlite);
    let serve_with = |metrics_token: &str| {
        db.write(
            "flow.toml",
            &format!("[api]\nmetrics_token = \"{metrics_token}\"\n{TOKENS}"),
        );
        let mut cmd = db.flow();
        cmd.args(["serve", "--addr", "127.0.0.1:0"])
            .env("FLOW_SECRET_VIEWER_TOKEN", VIEWER)
            .env("FLOW_SECRET_OPERATOR_TOKEN", OPERATOR)
            .env("FLOW_SECRET_ADMIN_TOKEN", ADMIN);
        cmd
    };
    let out = output(&mut serve_with("nobody"));
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(stderr(&out).contains("metrics_token"), "{}", stderr(&out));
    let server = start(serve_with("vera"), "listening on ");
    let base = server.base.as_str();
    runtime().block_on(async {
        let (s, _) = metrics_text(base, None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        let (s, _) = metrics_text(base, Some("wrong")).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        let (s, text) = metrics_text(base, Some(OPERATOR)).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "another token: {text}");
        assert!(text.contains("vera"), "{text}");
        let (s, text) = metrics_text(base, Some(VIEWER)).await;
        assert_eq!(s, StatusCode::OK, "{text}");
        assert!(text.contains("flow_runs"), "{text}");
        assert!(
            text.contains("flow_api_auth_failures_total{via=\"metrics\"} 1"),
            "{text}"
        );
        let health = reqwest::get(format!("{base}/healthz"))
            .await
            .expect("healthz");
        assert_eq!(health.status(), StatusCode::OK, "/healthz stays open");
    });
}
