//! The operator console in a real headless Chromium, driven over WebDriver
//! (`fantoccini` → a `chromedriver` this test starts on a free loopback port) against a
//! real `flow serve` on a ledger with runs paused in doubt: sign in as an operator,
//! resolve a call from the In doubt inbox (a garbage output first: refused, nothing
//! written), watch the run page update itself live until the run (continued by a daemon) has
//! succeeded; a viewer sees no resolve buttons; forged POSTs (no CSRF token, a wrong one,
//! another session's, a viewer's) are refused with 403 and write nothing.
//!
//! Screenshots go to `$CARGO_TARGET_DIR/ui-screenshots/` (or `target/ui-screenshots/`).
//! Without chromium and chromedriver the test fails under `CI` (set and not empty, `0` or
//! `false`: `flow_adapters::testkit::flags`), and otherwise skips saying why.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use flow_adapters::testkit::http::CountingServer;
use reqwest::StatusCode;
use reqwest::redirect::Policy;

use crate::api::{ADMIN, OPERATOR, Server, VIEWER, serve};
use crate::api_doubt::paused_run;
use crate::crash::workflow;
use crate::support::{Backend, TestDb, output, runtime, show, stderr};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A chromedriver child on a free port; killed when dropped.
pub(crate) struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the browser is installed; `None` with the reason to skip (a failure on CI).
pub(crate) fn browser_missing() -> Option<String> {
    let missing: Vec<&str> = [CHROMIUM, CHROMEDRIVER]
        .into_iter()
        .filter(|p| !std::path::Path::new(p).exists())
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{} not installed (apt-get install chromium chromium-driver; .ci/test does it)",
            missing.join(" and ")
        )
    })
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

/// Starts chromedriver and waits until it answers.
pub(crate) fn driver() -> Driver {
    let port = free_port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {CHROMEDRIVER}: {e}"));
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "chromedriver did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    driver
}

/// A headless Chromium session (`--no-sandbox`: the tests may run as root).
pub(crate) async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1100"],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .unwrap_or_else(|e| panic!("cannot start headless chromium through chromedriver: {e}"))
}

pub(crate) fn screenshots() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| crate::support::repo().join("target"), PathBuf::from);
    let dir = target.join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

pub(crate) async fn snap(c: &Client, name: &str) {
    let png = c
        .screenshot()
        .await
        .unwrap_or_else(|e| panic!("screenshot: {e}"));
    let path = screenshots().join(format!("{name}.png"));
    std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// The page's HTML once `css` matches an element whose text holds `text` (the page may
/// be reloading itself meanwhile).
pub(crate) async fn wait_for(c: &Client, css: &str, text: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(e) = c.find(Locator::Css(css)).await
            && e.text().await.is_ok_and(|t| t.contains(text))
        {
            return c.source().await.unwrap_or_default();
        }
        if Instant::now() > deadline {
            let page = c.source().await.unwrap_or_default();
            panic!("no `{css}` with `{text}` within {within:?}:\n{page}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) async fn sign_in(c: &Client, server: &Server, token: &str) {
    c.goto(&format!("{}/ui", server.base))
        .await
        .expect("goto /ui");
    let url = c.current_url().await.expect("url");
    assert!(
        url.path().ends_with("/ui/sign-in"),
        "not redirected to sign in: {url}"
    );
    c.find(Locator::Css("#token"))
        .await
        .expect("token field")
        .send_keys(token)
        .await
        .expect("type");
    c.find(Locator::Css("form button[type=submit]"))
        .await
        .expect("button")
        .click()
        .await
        .expect("click");
    wait_for(c, "h1", "Runs", Duration::from_secs(5)).await;
}

/// The hidden CSRF value of the first form on `html`.
pub(crate) fn csrf_of(html: &str) -> String {
    let at =
        html.find(r#"name="csrf" value=""#).expect("a csrf field") + r#"name="csrf" value=""#.len();
    html[at..].split('"').next().unwrap_or_default().to_string()
}

/// A reqwest client that does not follow redirects, signed in with `token` by the
/// sign-in form; returns it with its cookie header and its session's CSRF token.
pub(crate) async fn http_session(
    server: &Server,
    token: &str,
) -> (reqwest::Client, String, String) {
    let http = reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .expect("client");
    let form = http
        .get(format!("{}/ui/sign-in", server.base))
        .send()
        .await
        .expect("get")
        .text()
        .await
        .expect("body");
    let resp = http
        .post(format!("{}/ui/sign-in", server.base))
        .form(&[("csrf", csrf_of(&form).as_str()), ("token", token)])
        .send()
        .await
        .expect("sign in");
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let set = resp
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(
        !set.contains(token),
        "the cookie must not carry the token: {set}"
    );
    let cookie = set.split(';').next().unwrap_or_default().to_string();
    let page = http
        .get(format!("{}/ui/in-doubt", server.base))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("inbox");
    let csrf = csrf_of(&page.text().await.expect("body"));
    (http, cookie, csrf)
}

#[test]
fn the_console_resolves_in_a_real_browser_and_refuses_forgeries() {
    if let Some(why) = browser_missing() {
        assert!(!flow_adapters::testkit::flags::ci(), "CI is set and {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let rt = runtime();
    let downstream = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("pay.yaml", &workflow(&downstream.url()));
    let runs: Vec<String> = (0..2).map(|_| paused_run(&db, &file)).collect();
    let server = serve(&db);
    let chrome = driver();
    rt.block_on(async {
        let c = browser(&chrome).await;
        operator_resolves(&c, &server, &db, &runs[0]).await;
        viewer_sees_no_buttons(&c, &server).await;
        forged_posts_are_refused(&server, &db, &runs[1]).await;
        let _ = c.close().await;
    });
    assert_eq!(
        downstream.count(&format!("{}:charge:1", runs[0])),
        1,
        "never re-sent"
    );
}

/// Opens the detail of the call in `card` (a `<details>`), fills its form with `output`
/// and `reason`, ticks "I confirm" and presses "Resolve as succeeded".
async fn submit_succeeded(c: &Client, card: &str, output: &str, reason: &str) {
    let details = c
        .find(Locator::Css(&format!("{card} details")))
        .await
        .expect("the call's detail");
    if details.attr("open").await.ok().flatten().is_none() {
        details
            .find(Locator::Css("summary"))
            .await
            .expect("summary")
            .click()
            .await
            .expect("open");
    }
    let form = details
        .find(Locator::Css("form.act.one"))
        .await
        .expect("the call's form");
    let fields = [("textarea", output), ("input[name=reason]", reason)];
    for (css, text) in fields {
        let field = form.find(Locator::Css(css)).await.expect("field");
        field.clear().await.expect("clear");
        field.send_keys(text).await.expect("type");
    }
    for css in ["input[type=checkbox]", "button[value=succeeded]"] {
        let e = form.find(Locator::Css(css)).await.expect("control");
        e.click().await.expect("click");
    }
}

async fn operator_resolves(c: &Client, server: &Server, db: &TestDb, run: &str) {
    sign_in(c, server, OPERATOR).await;
    c.goto(&format!("{}/ui/in-doubt", server.base))
        .await
        .expect("inbox");
    let page = wait_for(c, "h1", "In doubt", Duration::from_secs(5)).await;
    assert!(
        page.contains(&format!("{run}:charge:1")),
        "the key is shown"
    );
    assert!(
        page.contains("Resolve as succeeded") && page.contains("Retry"),
        "operator buttons"
    );
    snap(c, "in-doubt-inbox").await;
    let card = format!("tr.detail[data-call='{run}/charge']");
    // Garbage output: shown as an error, nothing written.
    let before = show(db, run)["tool_calls"].clone();
    submit_succeeded(c, &card, "{not json", "").await;
    wait_for(c, "#notice", "output: not JSON", Duration::from_secs(5)).await;
    // Beside the field too, with what was typed kept.
    let beside = wait_for(
        c,
        &format!("{card} .field-error"),
        "output: not JSON",
        Duration::from_secs(5),
    )
    .await;
    assert!(
        beside.contains("{not json</textarea>"),
        "the typed text is kept"
    );
    snap(c, "in-doubt-garbage-refused").await;
    assert_eq!(show(db, run)["tool_calls"], before, "nothing written");
    // The real output: the run page comes back with the call resolved.
    submit_succeeded(c, &card, r#"{"count": 1}"#, "seen in the pay dashboard").await;
    wait_for(c, "p.info", "resolved", Duration::from_secs(5)).await;
    let charge = show(db, run)["tool_calls"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["tool_call_id"] == "charge"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(charge["resolution"]["by"], "otto", "{charge}");
    assert_eq!(
        charge["resolution"]["reason"], "seen in the pay dashboard",
        "{charge}"
    );
    // A daemon continues the run; the page, refreshing itself, shows it finish.
    let drained = output(
        db.flow()
            .args(["daemon", "--exit-when-idle", "--poll-interval", "50ms"]),
    );
    assert_eq!(drained.status.code(), Some(0), "{}", stderr(&drained));
    let page = wait_for(c, "#run-status", "succeeded", Duration::from_secs(15)).await;
    assert!(
        page.contains("otto") && page.contains("tool_call.resolved"),
        "audit trail"
    );
    snap(c, "run-succeeded").await;
    c.find(Locator::Css("header form button"))
        .await
        .expect("sign out")
        .click()
        .await
        .expect("click");
    wait_for(c, "h1", "Sign in", Duration::from_secs(5)).await;
}

async fn viewer_sees_no_buttons(c: &Client, server: &Server) {
    sign_in(c, server, VIEWER).await;
    c.goto(&format!("{}/ui/in-doubt", server.base))
        .await
        .expect("inbox");
    let page = wait_for(c, "h1", "In doubt", Duration::from_secs(5)).await;
    assert!(page.contains(":charge:1"), "the viewer sees the call");
    assert!(
        !page.contains("Resolve as succeeded") && !page.contains("/ui/in-doubt/resolve"),
        "no resolve for a viewer"
    );
    assert!(!page.contains("Bulk resolve"), "no bulk for a viewer");
    snap(c, "in-doubt-viewer").await;
}

async fn forged_posts_are_refused(server: &Server, db: &TestDb, run: &str) {
    let (http, operator, operator_csrf) = http_session(server, OPERATOR).await;
    let (_, viewer, viewer_csrf) = http_session(server, VIEWER).await;
    let before = show(db, run);
    let url = format!("{}/ui/in-doubt/resolve", server.base);
    let post = |cookie: &str, csrf: Option<&str>| {
        let mut fields = vec![
            ("run", run),
            ("node", "charge"),
            ("outcome", "retry"),
            ("confirm", "yes"),
        ];
        if let Some(t) = csrf {
            fields.push(("csrf", t));
        }
        http.post(&url)
            .header("cookie", cookie)
            .form(&fields)
            .send()
    };
    let cases = [
        (
            "operator, no CSRF token",
            operator.as_str(),
            None,
            StatusCode::FORBIDDEN,
        ),
        (
            "operator, a wrong token",
            operator.as_str(),
            Some("00ff"),
            StatusCode::FORBIDDEN,
        ),
        (
            "operator, the viewer's token",
            operator.as_str(),
            Some(viewer_csrf.as_str()),
            StatusCode::FORBIDDEN,
        ),
        (
            "viewer, its own valid token",
            viewer.as_str(),
            Some(viewer_csrf.as_str()),
            StatusCode::FORBIDDEN,
        ),
        (
            "no session",
            "flow_session=forged",
            Some(operator_csrf.as_str()),
            StatusCode::SEE_OTHER,
        ),
    ];
    for (what, cookie, csrf, want) in cases {
        let resp = post(cookie, csrf).await.expect("post");
        assert_eq!(resp.status(), want, "{what}");
    }
    let bulk = http
        .post(format!("{}/ui/in-doubt/bulk", server.base))
        .header("cookie", &operator)
        .form(&[
            ("csrf", operator_csrf.as_str()),
            ("outcome", "retry"),
            ("confirm", "yes"),
            ("dry_run", "no"),
        ])
        .send()
        .await
        .expect("bulk");
    assert_eq!(bulk.status(), StatusCode::FORBIDDEN, "bulk is for admins");
    let after = show(db, run);
    assert_eq!(after["tool_calls"], before["tool_calls"], "nothing written");
    assert_eq!(after["audit"], before["audit"], "nothing recorded");
    // The operator's real token works, so the refusals above were about the forgery.
    let ok = post(&operator, Some(&operator_csrf)).await.expect("post");
    assert_eq!(ok.status(), StatusCode::SEE_OTHER);
    let charge = show(db, run)["tool_calls"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["tool_call_id"] == "charge"))
        .cloned()
        .unwrap_or_default();
    assert_ne!(charge["status"], "in_doubt", "{charge}");
}

/// The console's forms without a browser, on SQLite and PostgreSQL: bulk resolve (dry-run count, the confirmation,
/// then exactly what was counted is settled, recorded as the admin), untrusted run text
/// escaped, sign-in refusals, and a signed-out cookie that no longer works.
#[test]
fn bulk_resolve_escaping_and_sign_out_on_both_backends() {
    for backend in crate::support::backends() {
        bulk_resolve_escaping_and_sign_out(backend);
    }
}

fn bulk_resolve_escaping_and_sign_out(backend: Backend) {
    let rt = runtime();
    let downstream = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(backend);
    let file = db.write("pay.yaml", &workflow(&downstream.url()));
    let runs: Vec<String> = (0..2).map(|_| paused_run(&db, &file)).collect();
    let hi = db.write("hi.yaml", "name: hi\ninputs:\n  who: { type: string }\nnodes:\n  greet: { tool: echo, with: { msg: \"${{ inputs.who }}\" } }\ntools:\n  echo: { kind: function, function: core.echo }\n");
    let xss = output(db.flow().arg("submit").arg(&hi).args([
        "--input",
        "who=<script>alert(1)</script>",
        "--run-id",
        "xss",
    ]));
    assert_eq!(xss.status.code(), Some(0), "{}", stderr(&xss));
    let server = serve(&db);
    rt.block_on(async {
        let (http, admin, csrf) = http_session(&server, ADMIN).await;
        let get = |path: &str| {
            http.get(format!("{}{path}", server.base))
                .header("cookie", &admin)
                .send()
        };
        let resp = get("/ui/runs/xss").await.expect("run page");
        let csp = resp.headers()["content-security-policy"]
            .to_str()
            .unwrap_or_default();
        assert!(
            csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
            "{csp}"
        );
        assert_eq!(resp.headers()["x-frame-options"], "DENY");
        let page = resp.text().await.expect("body");
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;"),
            "escaped:\n{page}"
        );
        assert!(!page.contains("<script>alert"), "never raw");
        let root = get("/").await.expect("root");
        assert_eq!(
            (root.status(), root.headers()["location"].to_str().ok()),
            (StatusCode::SEE_OTHER, Some("/ui"))
        );

        let bulk = |fields: Vec<(&'static str, &'static str)>| {
            let mut all = vec![
                ("csrf", csrf.as_str()),
                ("tool", "pay"),
                ("outcome", "failed"),
                ("reason", "refunded by hand"),
            ];
            all.extend(fields);
            http.post(format!("{}/ui/in-doubt/bulk", server.base))
                .header("cookie", &admin)
                .form(&all)
                .send()
        };
        let dry = bulk(vec![("dry_run", "yes")]).await.expect("dry");
        assert_eq!(dry.status(), StatusCode::OK);
        assert!(
            dry.text()
                .await
                .expect("body")
                .contains("dry run: 2 call(s) match, 2 would be settled, 0 skipped")
        );
        let unconfirmed = bulk(vec![("dry_run", "no")]).await.expect("bulk");
        assert_eq!(unconfirmed.status(), StatusCode::BAD_REQUEST);
        for run in &runs {
            assert_eq!(
                crate::support::call(&show(&db, run), "charge")["status"],
                "in_doubt",
                "nothing written yet"
            );
        }
        let real = bulk(vec![("dry_run", "no"), ("confirm", "yes")])
            .await
            .expect("bulk");
        assert_eq!(real.status(), StatusCode::OK);
        let body = real.text().await.expect("body");
        assert!(
            body.contains("2 of 2 matching call(s) settled as failed"),
            "{body}"
        );
        for run in &runs {
            let charge = crate::support::call(&show(&db, run), "charge").clone();
            assert_eq!(
                (&charge["status"], &charge["resolution"]["by"]),
                (&serde_json::json!("failed"), &serde_json::json!("ada")),
                "{charge}"
            );
        }

        cancel_from_the_run_page(&server, &http, &admin, &csrf, &db).await;
        sign_in_refusals_then_sign_out(&server, &http, &admin, &csrf).await;
    });
}

/// A wrong token and a forged sign-in form are refused; signing out clears the cookie
/// and ends the session on the server, so the old cookie no longer signs anyone in.
async fn sign_in_refusals_then_sign_out(
    server: &Server,
    http: &reqwest::Client,
    admin: &str,
    csrf: &str,
) {
    // Sign-in refusals, then sign-out ends the session for good.
    let form = http
        .get(format!("{}/ui/sign-in", server.base))
        .send()
        .await
        .expect("form")
        .text()
        .await
        .expect("body");
    let wrong = http
        .post(format!("{}/ui/sign-in", server.base))
        .form(&[("csrf", csrf_of(&form).as_str()), ("token", "nope")])
        .send()
        .await
        .expect("post");
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(wrong.headers().get("set-cookie").is_none());
    let forged = http
        .post(format!("{}/ui/sign-in", server.base))
        .form(&[("csrf", "x"), ("token", ADMIN)])
        .send()
        .await
        .expect("post");
    assert_eq!(
        forged.status(),
        StatusCode::FORBIDDEN,
        "the sign-in form has its CSRF token too"
    );
    let out = http
        .post(format!("{}/ui/sign-out", server.base))
        .header("cookie", admin)
        .form(&[("csrf", csrf)])
        .send()
        .await
        .expect("sign out");
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    assert!(
        out.headers()["set-cookie"]
            .to_str()
            .is_ok_and(|c| c.contains("Max-Age=0"))
    );
    let after = http
        .get(format!("{}/ui/runs", server.base))
        .header("cookie", admin)
        .send()
        .await
        .expect("runs");
    assert_eq!(
        (after.status(), after.headers()["location"].to_str().ok()),
        (StatusCode::SEE_OTHER, Some("/ui/sign-in?next=%2Fui%2Fruns")),
        "signed out: back to the sign-in form, which returns here"
    );
}

/// `--insecure-no-auth`: no sign-in (everyone is admin `anonymous`), yet every form still
/// needs its CSRF token; and the runs list pages with the API's cursor and filters.
#[test]
fn insecure_mode_keeps_csrf_and_the_runs_list_pages() {
    let db = TestDb::new(Backend::Sqlite);
    let mut cmd = db.flow();
    cmd.args(["serve", "--insecure-no-auth", "--addr", "127.0.0.1:0"]);
    let server = crate::api::start(cmd, "listening on ");
    let rt = runtime();
    rt.block_on(async {
        let http = reqwest::Client::builder().redirect(Policy::none()).build().expect("client");
        let at = |path: &str| format!("{}{path}", server.base);
        let runs: Vec<serde_json::Value> = (0..51)
            .map(|i| serde_json::json!({"workflow": crate::api::HELLO, "run_id": format!("r-{i:02}")}))
            .collect();
        let batch = http.post(at("/api/v1/runs:batch")).json(&serde_json::json!({"runs": runs})).send().await.expect("batch");
        assert_eq!(batch.status(), StatusCode::OK);

        let sign_in = http.get(at("/ui/sign-in")).send().await.expect("sign-in");
        assert_eq!(sign_in.headers()["location"].to_str().ok(), Some("/ui/runs"), "nothing to sign in to");
        let first = http.get(at("/ui/runs")).send().await.expect("runs").text().await.expect("body");
        assert!(first.contains("anonymous"), "{first}");
        assert_eq!(first.matches("<tr>").count(), 1 + 50, "a header and 50 runs");
        assert!(first.contains(">r-50<") && !first.contains(">r-00<"), "newest first");
        let at_next = first.find("cursor=").expect("a next page link") + "cursor=".len();
        let cursor: String = first[at_next..].chars().take_while(|c| *c != '"').collect();
        let second = http.get(at(&format!("/ui/runs?status=&cursor={cursor}"))).send().await.expect("page 2").text().await.expect("body");
        assert_eq!(second.matches("<tr>").count(), 1 + 1, "{second}");
        assert!(second.contains(">r-00<") && !second.contains("rel=\"next\""), "the last page");
        let none = http.get(at("/ui/runs?status=succeeded")).send().await.expect("filter").text().await.expect("body");
        assert!(none.contains("No runs succeeded."), "{none}");
        let bad = http.get(at("/ui/runs?status=nope")).send().await.expect("bad");
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);

        let inbox = http.get(at("/ui/in-doubt")).send().await.expect("inbox").text().await.expect("body");
        assert!(inbox.contains("Bulk resolve"), "anonymous is admin");
        let csrf = csrf_of(&inbox);
        let fields = [("run", "r-01"), ("node", "greet"), ("outcome", "retry"), ("confirm", "yes")];
        let forged = http.post(at("/ui/in-doubt/resolve")).form(&fields).send().await.expect("post");
        assert_eq!(forged.status(), StatusCode::FORBIDDEN, "no CSRF token, even without auth");
        let mut with = fields.to_vec();
        with.push(("csrf", &csrf));
        let real = http.post(at("/ui/in-doubt/resolve")).form(&with).send().await.expect("post");
        assert_eq!(real.status(), StatusCode::NOT_FOUND, "past the CSRF check: the run has no call yet");
        assert!(real.text().await.expect("body").contains("has no tool call `greet`"));
    });
}

/// Cancel from a run page (admin `ada`): refused without the confirmation, then recorded
/// with who and why; a finished run shows no cancel form.
async fn cancel_from_the_run_page(
    server: &Server,
    http: &reqwest::Client,
    admin: &str,
    csrf: &str,
    db: &TestDb,
) {
    let cancel = |fields: Vec<(&'static str, &'static str)>| {
        let mut all = vec![("csrf", csrf), ("reason", "wrong customer")];
        all.extend(fields);
        http.post(format!("{}/ui/runs/xss/cancel", server.base))
            .header("cookie", admin)
            .form(&all)
            .send()
    };
    assert!(
        http.get(format!("{}/ui/runs/xss", server.base))
            .header("cookie", admin)
            .send()
            .await
            .expect("page")
            .text()
            .await
            .expect("body")
            .contains("Cancel run")
    );
    let unconfirmed = cancel(vec![]).await.expect("cancel");
    assert_eq!(unconfirmed.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        show(db, "xss")["run"]["status"],
        "queued",
        "nothing written"
    );
    let done = cancel(vec![("confirm", "yes")]).await.expect("cancel");
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let after = show(db, "xss");
    assert_eq!(after["run"]["status"], "cancelled", "{after}");
    let audit = after["audit"].as_array().cloned().unwrap_or_default();
    assert!(
        audit
            .iter()
            .any(|e| e["by"] == "ada" && e["reason"] == "wrong customer"),
        "{audit:?}"
    );
    let page = http
        .get(format!("{}/ui/runs/xss", server.base))
        .header("cookie", admin)
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("body");
    assert!(!page.contains("Cancel run"), "nothing to cancel any more");
}
