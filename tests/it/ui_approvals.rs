//! The console's Approvals inbox in a real headless Chromium (the helpers of `ui.rs`)
//! against a real `flow serve` and a real `flow daemon`, on runs whose node `refund`
//! needs two approvers (`min: 2`) and a required input `reason`:
//!
//! - `otto` (operator) approves one with a reason: "1 more needed", and his name under
//!   "Approved by"; `ada` (admin) approves it: the daemon sends the request to the
//!   downstream exactly once and the run succeeds;
//! - while `ada` looks at the page, `otto` votes on another run through the API: its
//!   card shows his vote without a reload;
//! - a reason half typed in one card survives a vote on a fourth run (the region is
//!   kept, not replaced);
//! - `ada` denies a third with a reason: the node fails, nothing is sent;
//! - `vera` (viewer) sees the approvals but no form, and a POST crafted with her own
//!   session and CSRF token is refused (403);
//! - at 390 px wide the page does not scroll sideways.
//!
//! The plain-HTTP half (`http.rs`, both backends) checks the refusals beside their
//! fields, a stale digest, a lost race and the run page.
//!
//! Screenshots: `$CARGO_TARGET_DIR/ui-screenshots/console-approvals*.png` (docs/ has a
//! copy of `console-approvals.png`).

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use flow_adapters::testkit::http::CountingServer;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::{ADMIN, OPERATOR, Server, VIEWER, call, serve};
use crate::approvals::workflow;
use crate::support::{Backend, TestDb, output, run_id, runtime, show, stderr};
use crate::ui::{browser, browser_missing, driver, http_session, sign_in, snap, wait_for};

mod http;

/// How long a page may take to show what a step waits for.
const WAIT: Duration = Duration::from_secs(15);

/// The approval of the tests: two distinct approvers, a required `reason`.
pub(super) const MIN_TWO: &str = "      approvers: { roles: [operator], min: 2 }\n      inputs: { reason: { type: string, required: true } }\n      timeout: 1h";

/// The `Location` of a redirect.
pub(super) fn location(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// `run`'s approval of `refund` as `flow show --json` has it.
pub(super) fn pending_approval(db: &TestDb, run: &str) -> Value {
    let s = show(db, run);
    let a = s["approvals"][0].clone();
    assert_eq!(a["node"], "refund", "{s}");
    a
}

/// A `flow daemon` that continues the runs once decided; killed when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn approvals_are_decided_in_a_real_browser() {
    if let Some(why) = browser_missing() {
        assert!(!flow_adapters::testkit::flags::ci(), "CI is set and {why}");
        eprintln!("skipped: {why}");
        return;
    }
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("refund.yaml", &workflow(&down.url(), MIN_TWO));
    let runs: Vec<String> = (0..4)
        .map(|_| {
            let out = output(db.flow().arg("run").arg(&file));
            assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
            run_id(&out)
        })
        .collect();
    let server = serve(&db);
    let _daemon = Daemon(
        db.flow()
            .args(["daemon", "--poll-interval", "50ms"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("daemon"),
    );
    let chrome = driver();
    rt.block_on(async {
        let c = browser(&chrome).await;
        sign_in(&c, &server, OPERATOR).await;
        operator_votes(&c, &server, &db, &runs[0]).await;
        sign_out(&c).await;
        sign_in(&c, &server, ADMIN).await;
        admin_approves(&c, &server, &db, &runs[0], &down).await;
        a_vote_shows_live(&c, &server, &runs[2]).await;
        typing_is_kept(&c, &server, &runs[1], &runs[3]).await;
        admin_denies(&c, &server, &db, &runs[1]).await;
        sign_out(&c).await;
        sign_in(&c, &server, VIEWER).await;
        viewer_sees_no_form(&c, &server, &runs[2]).await;
        small_screen(&c, &server).await;
        let _ = c.close().await;
    });
    assert_eq!(down.count(&format!("{}:refund:1", runs[0])), 1, "sent once");
    assert_eq!(
        down.count(&format!("{}:refund:1", runs[1])),
        0,
        "denied: never sent"
    );
    assert_eq!(
        down.count(&format!("{}:refund:1", runs[2])),
        0,
        "still waiting"
    );
    assert_eq!(
        down.count(&format!("{}:refund:1", runs[3])),
        0,
        "one vote of two: still waiting"
    );
}

async fn js(c: &Client, script: &str) -> Value {
    c.execute(script, Vec::new())
        .await
        .unwrap_or_else(|e| panic!("{script}: {e}"))
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

async fn sign_out(c: &Client) {
    click(c, ".who form button").await;
    wait_for(c, "h1", "Sign in", WAIT).await;
}

async fn approvals_page(c: &Client, server: &Server) {
    c.goto(&format!("{}/ui/approvals", server.base))
        .await
        .expect("approvals");
    wait_for(c, "h1", "Approvals", WAIT).await;
}

/// The id of `run`'s card.
fn card(run: &str) -> String {
    format!("#a-{run}-refund")
}

/// `otto` approves with a reason: his vote counts, one more is needed.
async fn operator_votes(c: &Client, server: &Server, db: &TestDb, run: &str) {
    approvals_page(c, server).await;
    wait_for(c, "#approvals-count", "4", WAIT).await;
    wait_for(c, "#approvals-badge", "4", WAIT).await;
    let progress = format!("{} .progress", card(run));
    wait_for(c, &progress, "nobody yet · 2 more needed", WAIT).await;
    let shown = js(
        c,
        &format!(
            "return document.querySelector('{} code.digest').textContent;",
            card(run)
        ),
    )
    .await;
    assert_eq!(
        shown,
        pending_approval(db, run)["digest"],
        "the digest shown"
    );
    let deny = js(
        c,
        &format!("return document.querySelector('#deny-{run}-refund').className;"),
    )
    .await;
    assert_eq!(deny, "danger", "Deny looks destructive");
    type_into(c, &format!("{}-in-reason", card(run)), "duplicate charge").await;
    click(c, &format!("#approve-{run}-refund")).await;
    wait_for(c, "#notice", "1 more needed", WAIT).await;
    wait_for(c, &progress, "otto · 1 more needed", WAIT).await;
    wait_for(
        c,
        &format!("{}-voted", card(run)),
        "You approved this request",
        WAIT,
    )
    .await;
    let approve = js(
        c,
        &format!("return document.querySelector('#approve-{run}-refund') === null;"),
    )
    .await;
    assert_eq!(approve, json!(true), "no second approval by the same voter");
    let a = pending_approval(db, run);
    assert_eq!(a["approved_by"], json!(["otto"]), "{a}");
    assert_eq!(a["status"], "pending", "{a}");
}

/// `ada` approves: the daemon sends the request once and the run succeeds.
async fn admin_approves(
    c: &Client,
    server: &Server,
    db: &TestDb,
    run: &str,
    down: &CountingServer,
) {
    approvals_page(c, server).await;
    wait_for(
        c,
        &format!("{} .progress", card(run)),
        "otto · 1 more needed",
        WAIT,
    )
    .await;
    snap_tall(c, "console-approvals", 1700).await;
    type_into(c, &format!("{}-in-reason", card(run)), "checked the order").await;
    type_into(c, &format!("{}-reason", card(run)), "second pair of eyes").await;
    click(c, &format!("#approve-{run}-refund")).await;
    wait_for(c, "#notice", "Approved", WAIT).await;
    let gone = js(
        c,
        &format!("return document.querySelector('{}') === null;", card(run)),
    )
    .await;
    assert_eq!(gone, json!(true), "a decided approval leaves the inbox");
    let key = format!("{run}:refund:1");
    let deadline = Instant::now() + WAIT;
    while show(db, run)["run"]["status"] != "succeeded" {
        assert!(
            Instant::now() < deadline,
            "the run did not go on: {}",
            show(db, run)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(down.count(&key), 1, "sent exactly once");
    let s = show(db, run);
    let a = &s["approvals"][0];
    assert_eq!(
        (a["status"].as_str(), a["decided_by"].as_str()),
        (Some("approved"), Some("otto, ada")),
        "{a}"
    );
    assert_eq!(
        a["decision_inputs"],
        json!({"reason": "checked the order"}),
        "{a}"
    );
    c.goto(&format!("{}/ui/runs/{run}", server.base))
        .await
        .expect("run page");
    wait_for(c, "#approval-refund", "approved", WAIT).await;
    wait_for(c, "#approval-refund", "otto, ada", WAIT).await;
}

/// `otto` votes through the API while `ada` has the page open: the card shows it, live.
async fn a_vote_shows_live(c: &Client, server: &Server, run: &str) {
    approvals_page(c, server).await;
    let until_live = "return document.querySelector('[data-live-status]').textContent === 'Live';";
    let deadline = Instant::now() + WAIT;
    while js(c, until_live).await != json!(true) {
        assert!(Instant::now() < deadline, "the stream did not open");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = js(c, "return document.body.getAttribute('data-live-updated');").await;
    let body = json!({"decision": "approve", "inputs": {"reason": "looks right"}});
    let path = format!("/api/v1/runs/{run}/approvals/refund");
    let (s, answer) = call(server, "POST", &path, Some(OPERATOR), Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{answer}");
    assert_eq!(answer["outcome"], "voted", "{answer}");
    wait_for(
        c,
        &format!("{} .progress", card(run)),
        "otto · 1 more needed",
        WAIT,
    )
    .await;
    let after = js(c, "return document.body.getAttribute('data-live-updated');").await;
    assert_ne!(after, before, "updated in place, not reloaded");
}

/// A reason half typed into one card survives a vote on another: the region the user
/// is typing in is kept (and tried again later), never replaced under their hands.
async fn typing_is_kept(c: &Client, server: &Server, typing: &str, other: &str) {
    let field = format!("{}-reason", card(typing));
    type_into(c, &field, "half-typed reas").await;
    let before = js(c, "return document.body.getAttribute('data-live-updated');").await;
    let body = json!({"decision": "approve", "inputs": {"reason": "fine"}});
    let path = format!("/api/v1/runs/{other}/approvals/refund");
    let (s, answer) = call(server, "POST", &path, Some(OPERATOR), Some(body)).await;
    assert_eq!(s, StatusCode::OK, "{answer}");
    let deadline = Instant::now() + WAIT;
    let updated = "return document.body.getAttribute('data-live-updated');";
    while js(c, updated).await == before {
        assert!(Instant::now() < deadline, "no live update after the vote");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kept = js(
        c,
        "return document.querySelector('[data-live=approvals]').hasAttribute('data-live-kept');",
    )
    .await;
    assert_eq!(kept, json!(true), "the region being typed in is kept");
    let typed = js(
        c,
        &format!("return document.querySelector('{field}').value;"),
    )
    .await;
    assert_eq!(typed, "half-typed reas", "the half-typed reason survives");
}

/// `ada` denies with a reason: the node fails, nothing is sent.
async fn admin_denies(c: &Client, server: &Server, db: &TestDb, run: &str) {
    approvals_page(c, server).await;
    click(c, &format!("#deny-{run}-refund")).await;
    let field = format!("{}-reason-error", card(run));
    wait_for(c, &field, "a denial needs a reason", WAIT).await;
    type_into(c, &format!("{}-reason", card(run)), "amount does not match").await;
    click(c, &format!("#deny-{run}-refund")).await;
    wait_for(c, "#notice", "Denied", WAIT).await;
    let deadline = Instant::now() + WAIT;
    while show(db, run)["run"]["status"] != "failed" {
        assert!(
            Instant::now() < deadline,
            "the run did not fail: {}",
            show(db, run)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let s = show(db, run);
    assert_eq!(s["approvals"][0]["reason"], "amount does not match", "{s}");
}

/// `vera` sees the approval but no form; her crafted POST is 403 and writes nothing.
async fn viewer_sees_no_form(c: &Client, server: &Server, run: &str) {
    approvals_page(c, server).await;
    wait_for(c, &card(run), "Refund 42 EUR", WAIT).await;
    let forms = js(
        c,
        "return document.querySelectorAll('form.decide, button[name=decision]').length;",
    )
    .await;
    assert_eq!(forms, json!(0), "a viewer sees no form");
    wait_for(c, "#viewer-hint", "deciding needs an operator", WAIT).await;
    let (http, cookie, csrf) = http_session(server, VIEWER).await;
    let resp = http
        .post(format!("{}/ui/approvals/decide", server.base))
        .header("cookie", &cookie)
        .form(&[
            ("csrf", csrf.as_str()),
            ("run", run),
            ("node", "refund"),
            ("decision", "approve"),
            ("in_reason", "me too"),
        ])
        .send()
        .await
        .expect("post");
    assert_eq!(
        resp.status(),
        StatusCode::FORBIDDEN,
        "a viewer's crafted POST"
    );
    wait_for(
        c,
        &format!("{} .progress", card(run)),
        "otto · 1 more needed",
        WAIT,
    )
    .await;
}

/// A screenshot of more than the first screen.
async fn snap_tall(c: &Client, name: &str, height: u32) {
    c.set_window_size(1280, height).await.expect("resize");
    snap(c, name).await;
    c.set_window_size(1280, 1100).await.expect("resize back");
}

/// At 390 px the page fits: the document is no wider than the viewport.
async fn small_screen(c: &Client, server: &Server) {
    c.set_window_size(390, 844).await.expect("resize");
    approvals_page(c, server).await;
    let (doc, view) = (
        js(c, "return document.documentElement.scrollWidth;").await,
        js(c, "return document.documentElement.clientWidth;").await,
    );
    assert!(
        doc.as_u64().unwrap_or(u64::MAX) <= view.as_u64().unwrap_or(0),
        "the approvals page scrolls sideways on a phone: {doc} > {view}"
    );
    snap(c, "console-approvals-mobile").await;
    c.set_window_size(1280, 1100).await.expect("resize back");
}
