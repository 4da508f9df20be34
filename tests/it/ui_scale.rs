//! The console as a worklist, in a real headless Chromium (the helpers of `ui.rs`)
//! against a real `flow serve`: a deep link survives signing in; of five calls in
//! doubt three are ticked, a dry run lists exactly those three, and resolving them
//! leaves the other two in doubt (checked in the ledger with `flow show --json`); a
//! live update, caused by a resolution made through the API meanwhile, replaces the
//! table without touching a half-typed reason or the ticked boxes, and keeps a region
//! the user is typing in; a run page shows its history and its graph as SVG; a failed
//! run is redriven with its page's button; at 390 px wide nothing scrolls sideways.
//!
//! The plain-HTTP half (`http.rs`, both backends) checks what needs no browser: the
//! `next=` rule (no open redirect), the signed-in event stream, the CSP, and "resolve
//! selected"'s refusals, dry run and skips.
//!
//! Screenshots: `$CARGO_TARGET_DIR/ui-screenshots/console-*.png` (docs/ has copies).

use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use flow_adapters::testkit::http::{Behavior, CountingServer};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::{OPERATOR, Server, call, serve};
use crate::api_doubt::paused_run;
use crate::crash::workflow;
use crate::support::{Backend, TestDb, output, run_id, runtime, show, stderr};
use crate::ui::{browser, browser_missing, driver, snap, wait_for};

mod http;

/// How long a page may take to show what a step waits for.
pub(super) const WAIT: Duration = Duration::from_secs(10);

/// A screenshot of more than the first screen: the window made `height` tall for it.
async fn snap_tall(c: &Client, name: &str, height: u32) {
    c.set_window_size(1280, height).await.expect("resize");
    snap(c, name).await;
    c.set_window_size(1280, 1100).await.expect("resize back");
}

/// A pure node, then one that always fails (HTTP 400, no retries): a run to redrive
/// (from the first node, to show the console's "from").
fn failing(url: &str) -> String {
    format!(
        "name: refund\ntools:\n  echo: {{ kind: function, function: core.echo }}\n  pay: {{ kind: http, method: POST, url: \"{url}/refund\" }}\nnodes:\n  prep:\n    tool: echo\n    with: {{ amount: 5 }}\n  refund:\n    needs: [prep]\n    tool: pay\n    with: {{ amount: \"${{{{ nodes.prep.output.amount }}}}\" }}\n    retry_policy: {{ max_retries: 0 }}\n"
    )
}

/// The status of `run`'s call `charge` in the ledger.
pub(super) fn charge(db: &TestDb, run: &str) -> Value {
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
        runs_list_is_live(&c, &server).await;
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

/// A failed run's page has a Redrive button; pressing it (reason, confirm, "from" the
/// first node) puts the run back on the queue with that node and the failed one as new
/// steps, recorded with who and why.
async fn redrive_button(c: &Client, server: &Server, db: &TestDb, run: &str) {
    c.goto(&format!("{}/ui/runs/{run}", server.base))
        .await
        .expect("run page");
    wait_for(c, "#run-status", "failed", WAIT).await;
    let class = js(c, "return document.querySelector('#redrive').className;").await;
    assert_eq!(class, "danger", "a destructive button looks it");
    type_into(c, "#redrive-why", "the PSP is fixed").await;
    js(
        c,
        "document.querySelector('#redrive-from').value = 'prep'; return null;",
    )
    .await;
    click(c, "#redrive-form input[name=confirm]").await;
    click(c, "#redrive").await;
    wait_for(c, "#run-status", "queued", WAIT).await;
    let after = show(db, run);
    assert_eq!(after["run"]["status"], "queued", "{after}");
    let steps: Vec<&str> = after["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert!(
        steps.contains(&"prep_retry1") && steps.contains(&"refund_retry1"),
        "redriven from prep: {steps:?}"
    );
    let audit = after["audit"].as_array().cloned().unwrap_or_default();
    assert!(
        audit.iter().any(|e| e["event"] == "run.redriven"
            && e["by"] == "otto"
            && e["reason"] == "the PSP is fixed"),
        "{audit:?}"
    );
}

/// The runs list shows a run submitted meanwhile (through the API) without a reload.
async fn runs_list_is_live(c: &Client, server: &Server) {
    c.goto(&format!("{}/ui/runs", server.base))
        .await
        .expect("runs");
    wait_for(c, "h1", "Runs", WAIT).await;
    until(
        c,
        "return document.querySelector('[data-live-status]').textContent === 'Live';",
        "the stream is open",
    )
    .await;
    let body = json!({"workflow": crate::api::HELLO, "run_id": "live-one"});
    let (s, answer) = call(server, "POST", "/api/v1/runs", Some(OPERATOR), Some(body)).await;
    assert!(s.is_success(), "{s}: {answer}");
    until(
        c,
        "return document.querySelector(\"[data-live=runs] a[href='/ui/runs/live-one']\") !== null && document.body.hasAttribute('data-live-updated');",
        "the new run shows up, live",
    )
    .await;
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
