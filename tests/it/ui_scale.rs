//! The console as a worklist, in a real headless Chromium (the helpers of `ui.rs`)
//! against a real `flow serve`: a deep link survives signing in; of five calls in
//! doubt three are ticked, a dry run lists exactly those three, and resolving them
//! leaves the other two in doubt (checked in the ledger with `flow show --json`); a
//! live update, caused by a resolution made through the API meanwhile, replaces the
//! table without touching a half-typed reason or the ticked boxes, and keeps a region
//! the user is typing in; a run page shows its history and its graph as SVG; a failed
//! run is redriven with its page's button; at 390 px wide nothing scrolls sideways.
//!
//! The plain-HTTP half (both backends) checks what needs no browser: the `next=` rule
//! (no open redirect), the signed-in event stream, the CSP, and "resolve selected"'s
//! refusals, dry run and skips.
//!
//! Screenshots: `$CARGO_TARGET_DIR/ui-screenshots/console-*.png` (docs/ has copies).

use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use flow_adapters::testkit::http::{Behavior, CountingServer};
use reqwest::StatusCode;
use reqwest::redirect::Policy;
use serde_json::{Value, json};

use crate::api::{OPERATOR, Server, VIEWER, call, serve};
use crate::api_doubt::paused_run;
use crate::crash::workflow;
use crate::support::{Backend, TestDb, backends, output, run_id, runtime, show, stderr};
use crate::ui::{browser, browser_missing, csrf_of, driver, http_session, snap, wait_for};

const WAIT: Duration = Duration::from_secs(10);

/// A screenshot of more than the first screen: the window made `height` tall for it.
async fn snap_tall(c: &Client, name: &str, height: u32) {
    c.set_window_size(1280, height).await.expect("resize");
    snap(c, name).await;
    c.set_window_size(1280, 1100).await.expect("resize back");
}

/// One node that always fails (HTTP 400, no retries): a run to redrive.
fn failing(url: &str) -> String {
    format!(
        "name: refund\ntools:\n  pay: {{ kind: http, method: POST, url: \"{url}/refund\" }}\nnodes:\n  refund:\n    tool: pay\n    with: {{ amount: 5 }}\n    retry_policy: {{ max_retries: 0 }}\n"
    )
}

/// The status of `run`'s call `charge` in the ledger.
fn charge(db: &TestDb, run: &str) -> Value {
    crate::support::call(&show(db, run), "charge").clone()
}

/// Runs `script` (a function body) in the page and returns its value.
async fn js(c: &Client, script: &str) -> Value {
    c.execute(script, Vec::new())
        .await
        .unwrap_or_else(|e| panic!("{script}: {e}"))
}

/// Waits until `script` returns `true`.
async fn until(c: &Client, script: &str, what: &str) {
    let deadline = Instant::now() + WAIT;
    while js(c, script).await != json!(true) {
        if Instant::now() > deadline {
            let page = c.source().await.unwrap_or_default();
            panic!("{what}: not within {WAIT:?}\n{page}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("click {css}: {e}"));
}

async fn type_into(c: &Client, css: &str, text: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .send_keys(text)
        .await
        .unwrap_or_else(|e| panic!("type into {css}: {e}"));
}

#[test]
fn the_worklist_in_a_real_browser() {
    if let Some(why) = browser_missing() {
        assert!(!flow_adapters::testkit::flags::ci(), "CI is set and {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let rt = runtime();
    let downstream = rt.block_on(CountingServer::start()).expect("downstream");
    downstream.set("/refund", Behavior::status(400));
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("pay.yaml", &workflow(&downstream.url()));
    let runs: Vec<String> = (0..5).map(|_| paused_run(&db, &file)).collect();
    let refund = db.write("refund.yaml", &failing(&downstream.url()));
    let failed = output(db.flow().arg("run").arg(&refund));
    assert_eq!(failed.status.code(), Some(1), "{}", stderr(&failed));
    let failed = run_id(&failed);
    let server = serve(&db);
    let chrome = driver();
    rt.block_on(async {
        let c = browser(&chrome).await;
        deep_link_sign_in(&c, &server).await;
        small_screens(&c, &server, &runs[0]).await;
        select_three_of_five(&c, &server, &db, &runs).await;
        live_update_keeps_typing(&c, &server, &db, &runs).await;
        run_page_history_and_graph(&c, &server, &db, &runs[3]).await;
        redrive_button(&c, &server, &db, &failed).await;
        let _ = c.close().await;
    });
    for run in &runs {
        assert_eq!(
            downstream.count(&format!("{run}:charge:1")),
            1,
            "never re-sent"
        );
    }
}

/// Signed out, a link to the inbox goes through the sign-in form and lands on it.
async fn deep_link_sign_in(c: &Client, server: &Server) {
    c.goto(&format!("{}/ui/in-doubt?prefix=run", server.base))
        .await
        .expect("goto");
    let url = c.current_url().await.expect("url");
    assert_eq!(url.path(), "/ui/sign-in", "{url}");
    assert_eq!(url.query(), Some("next=%2Fui%2Fin-doubt%3Fprefix%3Drun"));
    type_into(c, "#token", OPERATOR).await;
    click(c, "form button[type=submit]").await;
    wait_for(c, "h1", "In doubt", WAIT).await;
    let url = c.current_url().await.expect("url");
    assert_eq!(
        (url.path(), url.query()),
        ("/ui/in-doubt", Some("prefix=run"))
    );
}

fn row(run: &str) -> String {
    format!("input[name=call][value='{run}/charge']")
}

/// Ticks 3 of the 5, dry-runs (lists exactly those, writes nothing), then resolves
/// them: the other two stay in doubt.
async fn select_three_of_five(c: &Client, server: &Server, db: &TestDb, runs: &[String]) {
    c.goto(&format!("{}/ui/in-doubt?prefix=run", server.base))
        .await
        .expect("inbox");
    let page = wait_for(c, "#doubt-count", "5", WAIT).await;
    for run in runs {
        assert!(
            page.contains(&format!("{run}:charge:1")),
            "the key of {run}"
        );
    }
    let since = js(
        c,
        "return document.querySelector('td[data-label=\"In doubt\"] time').textContent;",
    )
    .await;
    assert!(
        since.as_str().is_some_and(|t| t.starts_with("for ")),
        "in doubt since, relative: {since}"
    );
    snap_tall(c, "console-inbox", 1500).await;
    for run in &runs[..3] {
        click(c, &row(run)).await;
    }
    click(c, "input[name=outcome][value=failed]").await;
    type_into(c, "#sel-reason", "refunded by hand").await;
    click(c, "#sel-dry").await;
    let page = wait_for(
        c,
        "#dry-run h2",
        "3 call(s) would be settled as failed",
        WAIT,
    )
    .await;
    let listed = js(
        c,
        "return [...document.querySelectorAll('#dry-run td[data-label=Key] code')].map(e => e.textContent);",
    )
    .await;
    let want: Vec<String> = runs[..3].iter().map(|r| format!("{r}:charge:1")).collect();
    assert_eq!(
        listed,
        json!(want),
        "exactly the three ticked, with their keys"
    );
    assert!(page.contains("nothing was written"));
    for run in runs {
        assert_eq!(
            charge(db, run)["status"],
            "in_doubt",
            "a dry run writes nothing"
        );
    }
    snap_tall(c, "console-dry-run", 1500).await;
    // The selection and the form came back as they were: confirm and go.
    let ticked = js(
        c,
        "return [...document.querySelectorAll('input[name=call]:checked')].map(e => e.value);",
    )
    .await;
    let want: Vec<String> = runs[..3].iter().map(|r| format!("{r}/charge")).collect();
    assert_eq!(ticked, json!(want));
    click(c, "#sel-confirm").await;
    click(c, "#sel-go").await;
    wait_for(c, "#resolved h2", "3 call(s) settled as failed", WAIT).await;
    for run in &runs[..3] {
        let call = charge(db, run);
        assert_eq!(
            (
                &call["status"],
                &call["resolution"]["by"],
                &call["resolution"]["reason"]
            ),
            (&json!("failed"), &json!("otto"), &json!("refunded by hand")),
            "{call}"
        );
    }
    for run in &runs[3..] {
        assert_eq!(
            charge(db, run)["status"],
            "in_doubt",
            "not selected: untouched"
        );
    }
    wait_for(c, "#doubt-count", "2", WAIT).await;
}

/// A reason half typed in the selection form and a ticked box survive a live update
/// caused by a resolution made through the API meanwhile.
async fn live_update_keeps_typing(c: &Client, server: &Server, db: &TestDb, runs: &[String]) {
    click(c, &row(&runs[3])).await;
    type_into(c, "#sel-reason", "half-typed reas").await;
    let before = js(c, "return document.body.getAttribute('data-live-updated');").await;
    let path = format!("/api/v1/runs/{}/resolve", runs[4]);
    let body = json!({"node": "charge", "outcome": "failed", "error": "declined", "reason": "seen in the PSP"});
    let (s, answer) = call(server, "POST", &path, Some(OPERATOR), Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{answer}");
    let gone = format!(
        "return document.querySelector(\"{}\") === null && document.querySelector('#doubt-count').textContent.trim() === '1';",
        row(&runs[4])
    );
    until(c, &gone, "the settled call leaves the table, live").await;
    let after = js(c, "return document.body.getAttribute('data-live-updated');").await;
    assert_ne!(after, before, "updated in place, not reloaded");
    let reason = js(c, "return document.querySelector('#sel-reason').value;").await;
    assert_eq!(reason, "half-typed reas", "the half-typed reason is kept");
    let kept = js(
        c,
        &format!(
            "return document.querySelector(\"{}\").checked;",
            row(&runs[3])
        ),
    )
    .await;
    assert_eq!(kept, json!(true), "the ticked box is carried over");
    assert_eq!(charge(db, &runs[3])["status"], "in_doubt");
    let live = js(
        c,
        "return document.querySelector('[data-live-status]').textContent;",
    )
    .await;
    assert!(
        live.as_str().is_some_and(|t| t.starts_with("Updated")),
        "{live}"
    );
}

/// The run page: history (steps with attempts, the doubt, who), the graph as SVG with
/// states and links; a cancel reason being typed keeps its region while another
/// updates.
async fn run_page_history_and_graph(c: &Client, server: &Server, db: &TestDb, run: &str) {
    c.goto(&format!("{}/ui/runs/{run}", server.base))
        .await
        .expect("run page");
    wait_for(c, "#run-status", "paused", WAIT).await;
    let svg = js(
        c,
        "const s = document.querySelector('svg.graph'); return s && [...s.querySelectorAll('a.g-node')].map(a => a.getAttribute('href') + ' ' + a.getAttribute('class'));",
    )
    .await;
    assert_eq!(
        svg,
        json!([
            "#node-prepare g-node st-succeeded",
            "#node-charge g-node st-paused",
            "#node-receipt g-node st-not-started"
        ]),
        "the plan's nodes in order, coloured by state"
    );
    let events = js(
        c,
        "return [...document.querySelectorAll('.timeline tr.ev')].map(r => r.dataset.event);",
    )
    .await;
    let events: Vec<String> = serde_json::from_value(events).unwrap_or_default();
    for want in [
        "run.queued",
        "step.started",
        "step.succeeded",
        "tool_call.in_doubt",
        "run.paused",
    ] {
        assert!(events.iter().any(|e| e == want), "{want} in {events:?}");
    }
    let first = wait_for(
        c,
        ".timeline tr[data-event='step.succeeded']",
        "prepare",
        WAIT,
    )
    .await;
    assert!(
        first.contains("<time datetime="),
        "times are <time> elements"
    );
    let local = js(
        c,
        "return document.querySelector('.timeline time').getAttribute('title');",
    )
    .await;
    assert!(
        local.as_str().is_some_and(|t| t.ends_with("UTC)")),
        "local time, then UTC: {local}"
    );
    snap_tall(c, "console-run", 2400).await;
    // Typing a cancel reason: its region is kept; the nodes table still updates.
    type_into(c, "#cancel-why", "wrong custo").await;
    let body = json!({"node": "charge", "outcome": "failed", "error": "declined"});
    let path = format!("/api/v1/runs/{run}/resolve");
    let (s, answer) = call(server, "POST", &path, Some(OPERATOR), Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{answer}");
    wait_for(c, "#node-charge", "resolved failed by", WAIT).await;
    until(
        c,
        "return document.querySelector('[data-live=steer]').hasAttribute('data-live-kept');",
        "the steer region is kept",
    )
    .await;
    let typed = js(c, "return document.querySelector('#cancel-why').value;").await;
    assert_eq!(typed, "wrong custo");
    let timeline = wait_for(c, ".timeline", "resolved as failed", WAIT).await;
    assert!(
        timeline.contains("<strong>otto</strong>"),
        "who resolved it"
    );
    assert_eq!(charge(db, run)["resolution"]["by"], "otto");
}

/// A failed run's page has a Redrive button; pressing it (reason, confirm) puts the
/// run back on the queue, recorded with who and why.
async fn redrive_button(c: &Client, server: &Server, db: &TestDb, run: &str) {
    c.goto(&format!("{}/ui/runs/{run}", server.base))
        .await
        .expect("run page");
    wait_for(c, "#run-status", "failed", WAIT).await;
    let class = js(c, "return document.querySelector('#redrive').className;").await;
    assert_eq!(class, "danger", "a destructive button looks it");
    type_into(c, "#redrive-why", "the PSP is fixed").await;
    click(c, "#redrive-form input[name=confirm]").await;
    click(c, "#redrive").await;
    wait_for(c, "#run-status", "queued", WAIT).await;
    let after = show(db, run);
    assert_eq!(after["run"]["status"], "queued", "{after}");
    let audit = after["audit"].as_array().cloned().unwrap_or_default();
    assert!(
        audit.iter().any(|e| e["event"] == "run.redriven"
            && e["by"] == "otto"
            && e["reason"] == "the PSP is fixed"),
        "{audit:?}"
    );
}

/// The elements that reach past the right edge of the page (what makes it scroll
/// sideways), for the failure message.
const WIDER_THAN_THE_PAGE: &str = "const w = document.documentElement.clientWidth; return [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > w + 0.5 && ![...e.querySelectorAll('*')].some(k => k.getBoundingClientRect().right > w + 0.5)).slice(0, 10).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right));";

/// At 390×844 the runs list, a run page and the inbox fit: the document is no wider
/// than the viewport.
async fn small_screens(c: &Client, server: &Server, run: &str) {
    c.set_window_size(390, 844).await.expect("resize");
    for (path, name) in [
        ("/ui/in-doubt".to_string(), "console-mobile"),
        ("/ui/runs".to_string(), "console-mobile-runs"),
        (format!("/ui/runs/{run}"), "console-mobile-run"),
    ] {
        c.goto(&format!("{}{path}", server.base))
            .await
            .expect("goto");
        wait_for(c, "h1", "", WAIT).await;
        let (doc, view, inner) = (
            js(c, "return document.documentElement.scrollWidth;").await,
            js(c, "return document.documentElement.clientWidth;").await,
            js(c, "return window.innerWidth;").await,
        );
        let num = |v: &Value, or: u64| v.as_u64().unwrap_or(or);
        let (doc, view, inner) = (num(&doc, u64::MAX), num(&view, 0), num(&inner, 0));
        assert!(
            inner <= 400,
            "{path}: the window is {inner} px wide, not a phone's"
        );
        // clientWidth is innerWidth less a vertical scrollbar: the stricter of the two.
        if doc > view || doc > inner {
            let wide = js(c, WIDER_THAN_THE_PAGE).await;
            panic!(
                "{path}: the document is {doc} px wide in a {view} px viewport; too wide: {wide}"
            );
        }
        c.set_window_size(390, 2400).await.expect("resize");
        snap(c, name).await;
        c.set_window_size(390, 844).await.expect("resize");
    }
    c.set_window_size(1280, 1100).await.expect("resize back");
}

/// The plain-HTTP half, on both backends.
#[test]
fn deep_links_the_event_stream_and_selection_over_http_on_both_backends() {
    for backend in backends() {
        over_http(backend);
    }
}

fn over_http(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let downstream = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(backend);
    let file = db.write("pay.yaml", &workflow(&downstream.url()));
    let runs: Vec<String> = (0..3).map(|_| paused_run(&db, &file)).collect();
    let server = serve(&db);
    rt.block_on(async {
        next_is_local_only(&server, &ctx).await;
        event_stream(&server, &runs[2], &ctx).await;
        selection_refusals(&server, &db, &runs, &ctx).await;
        selection_dry_run_and_skips(&server, &db, &runs, &ctx).await;
    });
}

fn location(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// Signed out, a page redirects to the sign-in form with `next`; signing in returns
/// there — but only to a console page of this server.
async fn next_is_local_only(server: &Server, ctx: &str) {
    let http = reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .expect("client");
    let at = |p: &str| format!("{}{p}", server.base);
    let asked = http
        .get(at("/ui/runs/run_x?resolved=charge"))
        .send()
        .await
        .expect("get");
    assert_eq!(asked.status(), StatusCode::SEE_OTHER, "{ctx}");
    assert_eq!(
        location(&asked),
        "/ui/sign-in?next=%2Fui%2Fruns%2Frun_x%3Fresolved%3Dcharge",
        "{ctx}"
    );
    let form = http
        .get(at("/ui/sign-in?next=%2Fui%2Fruns%2Frun_x"))
        .send()
        .await
        .expect("form");
    let form = form.text().await.expect("body");
    assert!(
        form.contains(r#"name="next" value="&#x2f;ui&#x2f;runs&#x2f;run_x""#),
        "{ctx}: {form}"
    );
    let evil = http
        .get(at("/ui/sign-in?next=https://evil.example/"))
        .send()
        .await
        .expect("form");
    assert!(
        !evil.text().await.expect("body").contains("evil.example"),
        "{ctx}: not even shown"
    );
    let csrf = csrf_of(&form);
    let cases = [
        ("/ui/in-doubt?prefix=run", "/ui/in-doubt?prefix=run"),
        ("https://evil.example/ui/runs", "/ui/runs"),
        ("//evil.example/ui/runs", "/ui/runs"),
        ("/\\evil.example", "/ui/runs"),
        ("/ui/../api/v1/runs", "/ui/runs"),
        ("", "/ui/runs"),
    ];
    for (next, want) in cases {
        let resp = http
            .post(at("/ui/sign-in"))
            .form(&[("csrf", csrf.as_str()), ("token", VIEWER), ("next", next)])
            .send()
            .await
            .expect("sign in");
        assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{ctx}: {next}");
        assert_eq!(location(&resp), want, "{ctx}: next={next:?}");
    }
    // A failed sign-in keeps `next` for the next try (checked again).
    let wrong = http
        .post(at("/ui/sign-in"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("token", "nope"),
            ("next", "/ui/in-doubt"),
        ])
        .send()
        .await
        .expect("sign in");
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED, "{ctx}");
    assert!(
        wrong
            .text()
            .await
            .expect("body")
            .contains(r#"name="next" value="&#x2f;ui&#x2f;in-doubt""#),
        "{ctx}"
    );
}

/// `/ui/events` streams to a session cookie (not without one), carrying only seq, type,
/// run and node; pages allow only our own script.
async fn event_stream(server: &Server, run: &str, ctx: &str) {
    let (http, cookie, _) = http_session(server, VIEWER).await;
    let url = format!("{}/ui/events", server.base);
    let anonymous = http.get(&url).send().await.expect("get");
    assert_eq!(
        anonymous.status(),
        StatusCode::SEE_OTHER,
        "{ctx}: no session, no stream"
    );
    let mut live = http
        .get(&url)
        .header("cookie", &cookie)
        .send()
        .await
        .expect("get");
    assert_eq!(live.status(), StatusCode::OK, "{ctx}");
    let kind = live.headers()["content-type"]
        .to_str()
        .unwrap_or_default()
        .to_string();
    assert!(kind.starts_with("text/event-stream"), "{ctx}: {kind}");
    let body = json!({"node": "charge", "outcome": "failed", "error": "declined", "reason": "private words"});
    let (s, answer) = call(
        server,
        "POST",
        &format!("/api/v1/runs/{run}/resolve"),
        Some(OPERATOR),
        Some(body),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{ctx}: {answer}");
    let mut text = String::new();
    let deadline = Instant::now() + WAIT;
    while !text.contains("tool_call.resolved") {
        assert!(
            Instant::now() < deadline,
            "{ctx}: the stream said only:\n{text}"
        );
        if let Ok(Ok(Some(bytes))) =
            tokio::time::timeout(Duration::from_millis(500), live.chunk()).await
        {
            text.push_str(&String::from_utf8_lossy(&bytes));
        }
    }
    assert!(
        text.contains(&format!(r#""run":"{run}""#)) && text.contains("id: "),
        "{ctx}: {text}"
    );
    assert!(
        !text.contains("private words"),
        "{ctx}: payloads stay on the server"
    );
    let page = http
        .get(format!("{}/ui/in-doubt", server.base))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("page");
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("connect-src 'self'"),
        "{ctx}: {csp}"
    );
    assert!(!csp.contains("unsafe"), "{ctx}: {csp}");
    let html = page.text().await.expect("body");
    assert!(
        html.contains(r#"<script src="/ui/assets/live.js" defer></script>"#),
        "{ctx}"
    );
    assert_eq!(
        html.matches("<script").count(),
        1,
        "{ctx}: no inline script"
    );
    assert!(
        html.contains(r#"class="refresh">Refresh</a>"#),
        "{ctx}: works without the script"
    );
    let js = http
        .get(format!("{}/ui/assets/live.js", server.base))
        .send()
        .await
        .expect("js");
    assert_eq!(
        js.headers()["content-type"],
        "text/javascript; charset=utf-8",
        "{ctx}"
    );
}

/// "Resolve selected" over HTTP: CSRF and role first, then the values (nothing
/// written; a bad output shown beside its field, kept).
async fn selection_refusals(server: &Server, db: &TestDb, runs: &[String], ctx: &str) {
    let (http, cookie, csrf) = http_session(server, OPERATOR).await;
    let (_, viewer, viewer_csrf) = http_session(server, VIEWER).await;
    let url = format!("{}/ui/in-doubt/selected", server.base);
    let post = |cookie: &str, fields: Vec<(&str, String)>| {
        http.post(&url)
            .header("cookie", cookie)
            .form(&fields)
            .send()
    };
    let pick = |i: usize| ("call", format!("{}/charge", runs[i]));
    let base = |c: &str| vec![("csrf", c.to_string()), pick(0), pick(1), pick(2)];
    let mut forged = base("00ff");
    forged.extend([("outcome", "retry".into()), ("confirm", "yes".into())]);
    assert_eq!(
        post(&cookie, forged).await.expect("post").status(),
        StatusCode::FORBIDDEN,
        "{ctx}"
    );
    let mut as_viewer = base(&viewer_csrf);
    as_viewer.extend([("outcome", "retry".into()), ("confirm", "yes".into())]);
    assert_eq!(
        post(&viewer, as_viewer).await.expect("post").status(),
        StatusCode::FORBIDDEN,
        "{ctx}"
    );
    let mut garbage = base(&csrf);
    garbage.extend([
        ("outcome", "succeeded".into()),
        ("output", "{nope".into()),
        ("confirm", "yes".into()),
    ]);
    let resp = post(&cookie, garbage).await.expect("post");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{ctx}");
    let page = resp.text().await.expect("body");
    assert!(
        page.contains(r#"class="field-error" id="sel-output-error">output: not JSON"#),
        "{ctx}: {page}"
    );
    assert!(
        page.contains(">{nope</textarea>"),
        "{ctx}: the typed output is kept"
    );
    // The per-call form shows a bad output beside its field too, the text kept.
    let one = http
        .post(format!("{}/ui/in-doubt/resolve", server.base))
        .header("cookie", &cookie)
        .form(&[
            ("csrf", csrf.as_str()),
            ("run", runs[0].as_str()),
            ("node", "charge"),
            ("outcome", "succeeded"),
            ("output", "{x"),
            ("confirm", "yes"),
        ])
        .send()
        .await
        .expect("post");
    assert_eq!(one.status(), StatusCode::BAD_REQUEST, "{ctx}");
    let page = one.text().await.expect("body");
    let beside = format!(
        r#"<p class="field-error" id="out-{}-charge-error">output: not JSON"#,
        runs[0]
    );
    assert!(
        page.contains(&beside) && page.contains(">{x</textarea>"),
        "{ctx}: {page}"
    );
    let mut unconfirmed = base(&csrf);
    unconfirmed.push(("outcome", "failed".into()));
    assert_eq!(
        post(&cookie, unconfirmed).await.expect("post").status(),
        StatusCode::BAD_REQUEST,
        "{ctx}"
    );
    let none = vec![
        ("csrf", csrf.clone()),
        ("outcome", "failed".into()),
        ("confirm", "yes".into()),
    ];
    assert_eq!(
        post(&cookie, none).await.expect("post").status(),
        StatusCode::BAD_REQUEST,
        "{ctx}"
    );
    for run in &runs[..2] {
        assert_eq!(
            charge(db, run)["status"],
            "in_doubt",
            "{ctx}: nothing written"
        );
    }
}

/// A dry run lists what would be settled and what skipped; the real one settles what
/// is still in doubt and reports the call settled meanwhile as skipped.
async fn selection_dry_run_and_skips(server: &Server, db: &TestDb, runs: &[String], ctx: &str) {
    let (http, cookie, csrf) = http_session(server, OPERATOR).await;
    let url = format!("{}/ui/in-doubt/selected", server.base);
    let post = |cookie: &str, fields: Vec<(&str, String)>| {
        http.post(&url)
            .header("cookie", cookie)
            .form(&fields)
            .send()
    };
    let pick = |i: usize| ("call", format!("{}/charge", runs[i]));
    let base = |c: &str| vec![("csrf", c.to_string()), pick(0), pick(1), pick(2)];
    // runs[2] was settled through the API already (event_stream): skipped, and said so.
    let mut dry = base(&csrf);
    dry.extend([("outcome", "retry".into()), ("dry_run", "yes".into())]);
    let page = post(&cookie, dry)
        .await
        .expect("post")
        .text()
        .await
        .expect("body");
    assert!(
        page.contains("Dry run: 2 call(s) would be settled as retry"),
        "{ctx}: {page}"
    );
    assert!(
        page.contains(&format!("{}:charge:1", runs[0]))
            && page.contains(&format!("{}:charge:1", runs[1])),
        "{ctx}"
    );
    assert!(
        page.contains("Would be skipped") && page.contains("not in doubt"),
        "{ctx}: {page}"
    );
    let mut real = base(&csrf);
    real.extend([
        ("outcome", "failed".into()),
        ("reason", "declined".into()),
        ("confirm", "yes".into()),
    ]);
    let page = post(&cookie, real)
        .await
        .expect("post")
        .text()
        .await
        .expect("body");
    assert!(
        page.contains("2 of 3 selected call(s) settled as failed; 1 skipped"),
        "{ctx}: {page}"
    );
    for run in &runs[..2] {
        assert_eq!(charge(db, run)["resolution"]["by"], "otto", "{ctx}");
    }
}
