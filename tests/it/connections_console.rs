//! Signing in from the API and the console: `POST /api/v1/connections/{name}/connect`
//! (admins) begins the grant with `[api] public_url` as the redirect, and the browser's
//! return may land on another `flow serve` sharing the ledger, which finishes it; a
//! replayed, forged or refused redirect stores nothing; viewers see the connection's
//! state at `GET /api/v1/connections` and on the console, never a token.

use std::io::Read as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use flow_adapters::testkit::mcp::{AuthOptions, HttpServer};
use reqwest::StatusCode;
use serde_json::Value;

use crate::api::{ADMIN, Server, TOKENS, VIEWER, call};
use crate::connections::{assert_no_token, flow_with, key, ledger_bytes, workflow};
use crate::support::{Backend, TestDb, backends, output, runtime, stderr};
use crate::ui::http_session;

/// Where the test's "load balancer" is: no server listens there; the test sends each
/// redirect to the server it picks.
const PUBLIC: &str = "https://flow.example";

/// A `flow serve` whose stderr goes to `log` (read whole after the test).
struct Logged {
    server: Server,
    log: std::path::PathBuf,
}

fn serve(db: &TestDb, key: &str, log: &str) -> Logged {
    let log = db.dir.path().join(log);
    let file = std::fs::File::create(&log).expect("log file");
    let mut cmd = flow_with(db, key);
    cmd.args(["serve", "--addr", "127.0.0.1:0"])
        .env("FLOW_SECRET_VIEWER_TOKEN", VIEWER)
        .env("FLOW_SECRET_OPERATOR_TOKEN", crate::api::OPERATOR)
        .env("FLOW_SECRET_ADMIN_TOKEN", ADMIN)
        .env("RUST_LOG", "trace")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(file));
    let child = cmd.spawn().expect("flow serve");
    let deadline = Instant::now() + Duration::from_secs(30);
    let base = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(rest) = text.split("listening on ").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
        }
        assert!(
            Instant::now() < deadline,
            "flow serve did not listen:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    Logged {
        server: Server { child, base },
        log,
    }
}

fn config(db: &TestDb, mcp: &str, public_url: Option<&str>) {
    let api = public_url.map_or(String::new(), |u| format!("[api]\npublic_url = \"{u}\"\n"));
    db.write(
        "flow.toml",
        &format!(
            "{api}{TOKENS}\n[[connections]]\nname = \"tracker\"\nserver = \"{mcp}\"\nscopes = [\"tools:write\"]\n"
        ),
    );
}

/// Begins a sign-in on `on` as `token`: the answer.
async fn begin(on: &Server, token: &str) -> (StatusCode, Value) {
    call(
        on,
        "POST",
        "/api/v1/connections/tracker/connect",
        Some(token),
        None,
    )
    .await
}

/// The browser at the authorization server: where it is sent back (the `Location` of
/// the authorize answer), as a path and query under `public_url`.
async fn authorize(url: &str) -> String {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let resp = client.get(url).send().await.expect("authorize");
    assert!(resp.status().is_redirection(), "{}", resp.status());
    let location = resp
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let rest = location
        .strip_prefix(PUBLIC)
        .unwrap_or_else(|| panic!("sent back to {location}, not under {PUBLIC}"));
    assert!(rest.starts_with("/ui/connections/callback?"), "{rest}");
    rest.to_string()
}

/// The browser back at `server`: status and page.
async fn land(server: &Server, path: &str) -> (StatusCode, String) {
    land_with(server, path, None).await
}

/// [`land`] with a `Cookie` header.
async fn land_with(server: &Server, path: &str, cookie: Option<&str>) -> (StatusCode, String) {
    let mut req = reqwest::Client::new().get(format!("{}{path}", server.base));
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    let resp = req.send().await.expect("callback");
    let status = resp.status();
    (status, resp.text().await.unwrap_or_default())
}

/// A state nobody began, a stolen code with a live state, and an error redirect, on
/// servers `a` and `b` after connection `c` was stored: each refused, nothing stored
/// (`connected_at` and the refresh count do not move).
async fn refused_redirects_store_nothing(a: &Server, b: &Server, mcp: &HttpServer, c: &Value) {
    // A state nobody began, a stolen code with a live state, and an error
    // redirect: refused, nothing stored (the generation does not move).
    let generation = |c: &Value| c["refreshes"].clone();
    let before = generation(c);
    let (_, started) = begin(a, ADMIN).await;
    let fresh = authorize(started["authorize_url"].as_str().unwrap_or_default()).await;
    let (status, page) = land(a, &fresh.replace("state=", "state=x")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("no sign-in is waiting"), "{page}");
    let stolen: String = fresh
        .split('&')
        .map(|kv| {
            if kv.contains("code=") {
                "/ui/connections/callback?code=stolen"
            } else {
                kv
            }
        })
        .collect::<Vec<_>>()
        .join("&");
    assert!(
        stolen.contains("code=stolen") && stolen.contains("state="),
        "{stolen}"
    );
    let (status, page) = land(b, &stolen).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("invalid_grant"), "{page}");
    assert_eq!(
        mcp.auth_code().code_requests(),
        2,
        "the stolen code was refused"
    );
    mcp.authorize_with_error(Some("access_denied"));
    let (_, started) = begin(a, ADMIN).await;
    let back = authorize(started["authorize_url"].as_str().unwrap_or_default()).await;
    let (status, page) = land(b, &back).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
    assert!(page.contains("access_denied"), "{page}");
    mcp.authorize_with_error(None);
    assert_eq!(mcp.auth_code().code_requests(), 2);
    let (_, body) = call(b, "GET", "/api/v1/connections", Some(VIEWER), None).await;
    let after = &body["connections"][0];
    assert_eq!(
        (after["connected_at"].clone(), generation(after)),
        (c["connected_at"].clone(), before),
        "nothing stored: {body}"
    );
}

#[test]
fn a_sign_in_begun_on_one_server_finishes_on_another_and_only_once() {
    let rt = runtime();
    for backend in backends() {
        let mcp = rt
            .block_on(HttpServer::start(Some(AuthOptions::default())))
            .expect("server");
        let db = TestDb::new(backend);
        let key = key();
        config(&db, &mcp.url(), Some(PUBLIC));
        let a = serve(&db, &key, "a.log");
        let b = serve(&db, &key, "b.log");
        rt.block_on(async {
            let (status, body) =
                call(&a.server, "GET", "/api/v1/connections", Some(VIEWER), None).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(body["connections"][0]["status"], "not_connected", "{body}");
            let (status, _) = begin(&a.server, VIEWER).await;
            assert_eq!(
                status,
                StatusCode::FORBIDDEN,
                "{backend:?}: a viewer cannot sign in"
            );

            let (status, started) = begin(&a.server, ADMIN).await;
            assert_eq!(status, StatusCode::OK, "{backend:?}: {started}");
            assert_eq!(
                started["redirect_uri"],
                format!("{PUBLIC}/ui/connections/callback"),
                "{started}"
            );
            let back = authorize(started["authorize_url"].as_str().unwrap_or_default()).await;
            // The redirect lands on B, which never saw the sign-in begin.
            let (status, page) = land(&b.server, &back).await;
            assert_eq!(status, StatusCode::OK, "{backend:?}: {page}");
            assert!(page.contains("Connected tracker"), "{page}");
            assert_eq!(mcp.auth_code().code_requests(), 1);
            // The same redirect again, on either server: refused, nothing exchanged.
            for again in [&a.server, &b.server] {
                let (status, page) = land(again, &back).await;
                assert_eq!(status, StatusCode::BAD_REQUEST, "{backend:?}: {page}");
                assert!(page.contains("no sign-in is waiting"), "{page}");
            }
            assert_eq!(mcp.auth_code().code_requests(), 1, "a state works once");

            let (status, body) =
                call(&b.server, "GET", "/api/v1/connections", Some(VIEWER), None).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let c = &body["connections"][0];
            assert_eq!(
                (
                    c["status"].as_str(),
                    c["connected_by"].as_str(),
                    c["scopes"].as_str()
                ),
                (Some("connected"), Some("ada"), Some("tools:write")),
                "{body}"
            );

            refused_redirects_store_nothing(&a.server, &b.server, &mcp, c).await;
        });
        let c = &crate::connections::listed(&db, &key)[0];
        assert_eq!(c["connected_by"], "ada", "{c}");

        // A run uses what the console stored.
        let wf = workflow(&db, &mcp.url(), "console", 1);
        let out = output(flow_with(&db, &key).arg("run").arg(&wf));
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        assert_eq!(mcp.stats().count("console-0"), 1);

        // No token in the API's answers, the console's pages, either server's
        // trace-level log, or the ledger's files.
        let tokens = mcp.auth_code().all_tokens();
        assert!(!tokens.is_empty());
        rt.block_on(async {
            let (_, body) = call(&a.server, "GET", "/api/v1/connections", Some(VIEWER), None).await;
            assert_no_token(
                "GET /api/v1/connections",
                body.to_string().as_bytes(),
                &tokens,
            );
        });
        let logs = [a.log.clone(), b.log.clone()];
        drop((a, b));
        for log in &logs {
            let mut text = Vec::new();
            let _ = std::fs::File::open(log).and_then(|mut f| f.read_to_end(&mut text));
            assert!(!text.is_empty());
            assert_no_token("a server's trace-level log", &text, &tokens);
        }
        assert_no_token("the ledger (files or pg_dump)", &ledger_bytes(&db), &tokens);
    }
}

#[test]
fn without_a_public_url_or_a_key_the_api_says_what_to_set() {
    let rt = runtime();
    let mcp = rt
        .block_on(HttpServer::start(Some(AuthOptions::default())))
        .expect("server");
    let db = TestDb::new(Backend::Sqlite);
    config(&db, &mcp.url(), None);
    let server = serve(&db, &key(), "a.log");
    rt.block_on(async {
        let (status, body) = begin(&server.server, ADMIN).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("public_url"),
            "{body}"
        );
        let (status, body) = call(
            &server.server,
            "POST",
            "/api/v1/connections/nope/connect",
            Some(ADMIN),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    });
    drop(server);
    // A public URL but no connections key: refused before any server is asked.
    config(&db, &mcp.url(), Some(PUBLIC));
    let mut cmd = db.flow();
    cmd.arg("--config")
        .arg(db.dir.path().join("flow.toml"))
        .args(["serve", "--addr", "127.0.0.1:0"])
        .env("FLOW_SECRET_VIEWER_TOKEN", VIEWER)
        .env("FLOW_SECRET_OPERATOR_TOKEN", crate::api::OPERATOR)
        .env("FLOW_SECRET_ADMIN_TOKEN", ADMIN);
    let server = crate::api::start(cmd, "listening on ");
    rt.block_on(async {
        let (status, body) = begin(&server, ADMIN).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("CONNECTIONS_KEY"),
            "{body}"
        );
    });
    assert_eq!(
        mcp.auth_code().registrations(),
        0,
        "nothing asked of the server"
    );
}

#[test]
fn the_console_page_signs_an_admin_in_and_shows_viewers_no_button() {
    let rt = runtime();
    let mcp = rt
        .block_on(HttpServer::start(Some(AuthOptions::default())))
        .expect("server");
    let db = TestDb::new(Backend::Sqlite);
    config(&db, &mcp.url(), Some(PUBLIC));
    let server = serve(&db, &key(), "a.log");
    let server = &server.server;
    rt.block_on(async {
        let get = |s: &(reqwest::Client, String, String)| {
            let req =
                s.0.get(format!("{}/ui/connections", server.base))
                    .header("cookie", &s.1);
            async move {
                let resp = req.send().await.expect("get");
                (resp.status(), resp.text().await.expect("body"))
            }
        };
        let post = |s: &(reqwest::Client, String, String), csrf: Option<&str>| {
            let form = [("csrf", csrf.map_or_else(|| s.2.clone(), str::to_string))];
            let req =
                s.0.post(format!("{}/ui/connections/tracker/connect", server.base))
                    .header("cookie", &s.1)
                    .form(&form);
            async move {
                let resp = req.send().await.expect("post");
                let cookie = resp
                    .headers()
                    .get("set-cookie")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.split(';').next())
                    .unwrap_or_default()
                    .to_string();
                (resp.status(), resp.text().await.expect("body"), cookie)
            }
        };
        let vera = http_session(server, VIEWER).await;
        let (status, page) = get(&vera).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(
            page.contains("tracker") && page.contains("not connected"),
            "{page}"
        );
        assert!(
            !page.contains(">Connect<"),
            "a viewer gets no button: {page}"
        );
        assert_eq!(post(&vera, None).await.0, StatusCode::FORBIDDEN);

        let ada = http_session(server, ADMIN).await;
        let (_, page) = get(&ada).await;
        assert!(page.contains(">Connect<"), "{page}");
        assert_eq!(post(&ada, Some("forged")).await.0, StatusCode::FORBIDDEN);
        let (status, page, cookie) = post(&ada, None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(cookie.starts_with("flow_connect_tracker="), "{cookie}");
        let href = page
            .split("id=\"authorize\" href=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("no sign-in link: {page}"))
            .replace("&amp;", "&")
            .replace("&#x2f;", "/");
        let back = authorize(&href).await;
        // Another browser (no cookie) cannot finish it, and spends it.
        let (status, page) = land(server, &back).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{page}");
        assert!(page.contains("begun in another browser"), "{page}");
        assert_eq!(mcp.auth_code().code_requests(), 0, "no code exchanged");
        let (_, page, cookie) = post(&ada, None).await;
        let href = page
            .split("id=\"authorize\" href=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("no sign-in link: {page}"))
            .replace("&amp;", "&")
            .replace("&#x2f;", "/");
        let back = authorize(&href).await;
        let (status, page) = land_with(server, &back, Some(&cookie)).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let (_, page) = get(&ada).await;
        assert!(
            page.contains(">connected<") && page.contains(">Reconnect<"),
            "{page}"
        );
        assert_eq!(mcp.auth_code().code_requests(), 1);
    });
}
