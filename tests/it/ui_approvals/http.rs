//! The Approvals inbox over plain HTTP, on SQLite and PostgreSQL: a viewer sees the
//! approvals but no form, and a POST crafted with a viewer's own session and CSRF token
//! is 403; a POST without the CSRF token is 403; a missing required input or a denial
//! without a reason is refused beside its field (400, typed text kept); a digest that
//! is not the one waiting is refused (409) beside the form; an operator's approval of a
//! `min: 2` approval counts ("1 more needed"), an admin's approves it, and `flow
//! resume` sends the request exactly once; a late denial is told who won; a denial
//! fails its node and nothing is sent; under `forbid_self` the token that submitted the
//! run gets no form, and its crafted POST is 403.

use flow_adapters::testkit::http::CountingServer;
use reqwest::StatusCode;
use serde_json::Value;

use super::{MIN_TWO, location, pending_approval};
use crate::api::{ADMIN, OPERATOR, Server, VIEWER, call, serve};
use crate::approvals::workflow;
use crate::support::{Backend, TestDb, backends, output, run_id, runtime, show, stderr};
use crate::ui::http_session;

/// A signed-in plain-HTTP session: client, cookie, CSRF token.
type Session = (reqwest::Client, String, String);

#[test]
fn the_approvals_inbox_over_http_on_both_backends() {
    for backend in backends() {
        over_http(backend);
    }
}

fn over_http(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(backend);
    let file = db.write("refund.yaml", &workflow(&down.url(), MIN_TWO));
    let runs: Vec<String> = (0..2)
        .map(|_| {
            let out = output(db.flow().arg("run").arg(&file));
            assert_eq!(out.status.code(), Some(3), "{ctx}: {}", stderr(&out));
            run_id(&out)
        })
        .collect();
    let server = serve(&db);
    let own = submitted_by_otto(&server, &db, &down, &ctx);
    rt.block_on(async {
        let viewer = http_session(&server, VIEWER).await;
        let otto = http_session(&server, OPERATOR).await;
        let ada = http_session(&server, ADMIN).await;
        viewer_sees_no_form(&server, &db, &viewer, &runs[0], &ctx).await;
        refusals_keep_what_was_typed(&server, &db, &otto, &runs[0], &ctx).await;
        two_approvers(&server, &db, &otto, &ada, &runs[0], &ctx).await;
        deny(&server, &db, &ada, &runs[1], &ctx).await;
        forbid_self(&server, &db, &otto, &own, &ctx).await;
    });
    let key = |run: &str| format!("{run}:refund:1");
    let sent = output(db.flow().args(["resume", &runs[0]]));
    assert_eq!(sent.status.code(), Some(0), "{ctx}: {}", stderr(&sent));
    assert_eq!(down.count(&key(&runs[0])), 1, "{ctx}: sent once");
    let again = output(db.flow().args(["resume", &runs[0]]));
    assert_eq!(again.status.code(), Some(0), "{ctx}: {}", stderr(&again));
    assert_eq!(down.count(&key(&runs[0])), 1, "{ctx}: never again");
    let denied = output(db.flow().args(["resume", &runs[1]]));
    assert_eq!(denied.status.code(), Some(1), "{ctx}: {}", stderr(&denied));
    assert_eq!(
        down.count(&key(&runs[1])),
        0,
        "{ctx}: a denial sends nothing"
    );
    assert_eq!(show(&db, &runs[1])["run"]["status"], "failed", "{ctx}");
}

async fn get(server: &Server, s: &Session, path: &str) -> (StatusCode, String) {
    let resp =
        s.0.get(format!("{}{path}", server.base))
            .header("cookie", &s.1)
            .send()
            .await
            .expect("get");
    let status = resp.status();
    (status, resp.text().await.expect("body"))
}

/// Posts the decide form of `run`'s node `refund` with `fields` (and the session's
/// CSRF token unless `fields` has one).
async fn post(
    server: &Server,
    s: &Session,
    run: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    let mut form: Vec<(&str, &str)> = vec![("run", run), ("node", "refund")];
    if !fields.iter().any(|(k, _)| *k == "csrf") {
        form.push(("csrf", &s.2));
    }
    form.extend_from_slice(fields);
    s.0.post(format!("{}/ui/approvals/decide", server.base))
        .header("cookie", &s.1)
        .form(&form)
        .send()
        .await
        .expect("post")
}

fn digest(db: &TestDb, run: &str) -> String {
    pending_approval(db, run)["digest"]
        .as_str()
        .expect("digest")
        .to_owned()
}

/// The viewer's page lists both approvals with the nav's badge, and no form; the
/// viewer's own session and CSRF token cannot decide (403), nothing written.
async fn viewer_sees_no_form(server: &Server, db: &TestDb, viewer: &Session, run: &str, ctx: &str) {
    let (status, page) = get(server, viewer, "/ui/approvals").await;
    assert_eq!(status, StatusCode::OK, "{ctx}: {page}");
    assert!(
        page.contains(&format!(r#"data-approval="{run}/refund""#)),
        "{ctx}: {page}"
    );
    assert!(page.contains(r#"id="approvals-count">3<"#), "{ctx}: {page}");
    assert!(
        page.contains(r#"id="approvals-badge""#),
        "{ctx}: the nav's badge"
    );
    assert!(page.contains("Refund 42 EUR"), "{ctx}: the message");
    assert!(page.contains(&digest(db, run)), "{ctx}: the digest");
    assert!(
        page.contains("&quot;amount&quot;: 42"),
        "{ctx}: the request: {page}"
    );
    assert!(
        !page.contains("/ui/approvals/decide") && !page.contains("name=\"decision\""),
        "{ctx}: a viewer sees no form: {page}"
    );
    assert!(page.contains(r#"id="viewer-hint""#), "{ctx}");
    let d = digest(db, run);
    let fields = [
        ("decision", "approve"),
        ("in_reason", "mine"),
        ("digest", d.as_str()),
    ];
    let resp = post(server, viewer, run, &fields).await;
    assert_eq!(
        resp.status(),
        StatusCode::FORBIDDEN,
        "{ctx}: a viewer's crafted POST"
    );
    let deny = [("decision", "deny"), ("reason", "mine")];
    let resp = post(server, viewer, run, &deny).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{ctx}: nor a denial");
    let a = pending_approval(db, run);
    assert_eq!(
        a["approved_by"],
        serde_json::json!([]),
        "{ctx}: nothing written: {a}"
    );
}

/// Refusals: no CSRF token (403); a missing required input and a denial without a
/// reason (400, beside the field); a digest not the one waiting (409, beside the form);
/// each keeps what was typed and writes nothing.
async fn refusals_keep_what_was_typed(
    server: &Server,
    db: &TestDb,
    otto: &Session,
    run: &str,
    ctx: &str,
) {
    let forged = [("csrf", ""), ("decision", "approve"), ("in_reason", "x")];
    let resp = post(server, otto, run, &forged).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{ctx}: no CSRF token");
    let d = digest(db, run);
    let missing = [
        ("decision", "approve"),
        ("in_reason", " "),
        ("reason", "kept words"),
        ("digest", d.as_str()),
    ];
    let resp = post(server, otto, run, &missing).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{ctx}");
    let page = resp.text().await.expect("body");
    let card = format!("a-{run}-refund");
    assert!(
        page.contains(&format!(r#"id="{card}-inputs-error""#)),
        "{ctx}: beside the inputs: {page}"
    );
    assert!(page.contains("reason"), "{ctx}");
    assert!(
        page.contains(r#"value="kept words""#),
        "{ctx}: the typed reason is kept"
    );
    let deny = [("decision", "deny"), ("in_reason", "half typed")];
    let resp = post(server, otto, run, &deny).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{ctx}");
    let page = resp.text().await.expect("body");
    assert!(
        page.contains(&format!(r#"id="{card}-reason-error""#)),
        "{ctx}: {page}"
    );
    assert!(
        page.contains(r#"value="half typed""#),
        "{ctx}: the typed input is kept"
    );
    let stale = [
        ("decision", "approve"),
        ("in_reason", "dup"),
        ("digest", "sha256:0"),
    ];
    let resp = post(server, otto, run, &stale).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT, "{ctx}");
    let page = resp.text().await.expect("body");
    assert!(
        page.contains(&format!(r#"id="{card}-error""#)),
        "{ctx}: beside the form: {page}"
    );
    assert!(
        page.contains("the request changed since it was shown"),
        "{ctx}: {page}"
    );
    assert!(page.contains(r#"value="dup""#), "{ctx}");
    assert_eq!(
        pending_approval(db, run)["approved_by"],
        serde_json::json!([]),
        "{ctx}"
    );
}

/// `otto` approves (a vote: "1 more needed"), `ada` approves (the approval), a late
/// denial is told who won; the run page shows the approval as approved.
async fn two_approvers(
    server: &Server,
    db: &TestDb,
    otto: &Session,
    ada: &Session,
    run: &str,
    ctx: &str,
) {
    let d = digest(db, run);
    let vote = [
        ("decision", "approve"),
        ("in_reason", "duplicate charge"),
        ("digest", d.as_str()),
    ];
    let resp = post(server, otto, run, &vote).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{ctx}");
    let to = location(&resp);
    assert!(
        to.starts_with("/ui/approvals?") && to.ends_with("outcome=voted&needed=1"),
        "{ctx}: {to}"
    );
    let (_, page) = get(server, otto, &to).await;
    assert!(
        page.contains("counted: 1 more needed"),
        "{ctx}: the notice: {page}"
    );
    assert!(
        page.contains("<strong>otto</strong>"),
        "{ctx}: who approved so far"
    );
    let a = pending_approval(db, run);
    assert_eq!(a["approved_by"], serde_json::json!(["otto"]), "{ctx}: {a}");
    let resp = post(server, ada, run, &vote).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{ctx}");
    assert!(location(&resp).contains("outcome=approved"), "{ctx}");
    let late = [("decision", "deny"), ("reason", "too late")];
    let resp = post(server, otto, run, &late).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT, "{ctx}");
    let page = resp.text().await.expect("body");
    assert!(
        page.contains("already approved (by otto, ada)"),
        "{ctx}: the loser is told who won: {page}"
    );
    let s = show(db, run);
    let a = &s["approvals"][0];
    assert_eq!(
        (a["status"].as_str(), a["decided_by"].as_str()),
        (Some("approved"), Some("otto, ada")),
        "{ctx}: {a}"
    );
    let (_, page) = get(server, otto, &format!("/ui/runs/{run}")).await;
    assert!(
        page.contains(r#"id="approval-refund""#) && page.contains("st-approved"),
        "{ctx}: {page}"
    );
}

/// A denial with a reason: recorded with who and why.
async fn deny(server: &Server, db: &TestDb, ada: &Session, run: &str, ctx: &str) {
    let (_, page) = get(server, ada, &format!("/ui/runs/{run}")).await;
    assert!(
        page.contains(&format!(r#"href="/ui/approvals?run={run}#a-{run}-refund""#)),
        "{ctx}: the run page links a pending approval to the inbox: {page}"
    );
    let fields = [("decision", "deny"), ("reason", "amount does not match")];
    let resp = post(server, ada, run, &fields).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER, "{ctx}");
    assert!(location(&resp).contains("outcome=denied"), "{ctx}");
    let s = show(db, run);
    let a: &Value = &s["approvals"][0];
    assert_eq!(
        (a["status"].as_str(), a["reason"].as_str()),
        (Some("denied"), Some("amount does not match")),
        "{ctx}: {a}"
    );
}

/// A run submitted through the API by `otto` (operator) whose approval has
/// `forbid_self`, paused awaiting it (`flow resume` runs it up to the approval).
fn submitted_by_otto(server: &Server, db: &TestDb, down: &CountingServer, ctx: &str) -> String {
    let text = workflow(
        &down.url(),
        "      approvers: { roles: [operator] }\n      forbid_self: true\n      timeout: 1h",
    );
    let body = serde_json::json!({ "workflow": text });
    let (st, answer) = runtime().block_on(call(
        server,
        "POST",
        "/api/v1/runs",
        Some(OPERATOR),
        Some(body),
    ));
    assert_eq!(st, StatusCode::CREATED, "{ctx}: {answer}");
    let run = answer["id"].as_str().expect("id").to_owned();
    let paused = output(db.flow().args(["resume", &run]));
    assert_eq!(paused.status.code(), Some(3), "{ctx}: {}", stderr(&paused));
    assert_eq!(pending_approval(db, &run)["submitted_by"], "otto", "{ctx}");
    run
}

/// `otto` submitted the run: his page shows why he may not decide instead of a form,
/// and his crafted POST is 403 with that reason, nothing written.
async fn forbid_self(server: &Server, db: &TestDb, otto: &Session, run: &str, ctx: &str) {
    let (_, page) = get(server, otto, "/ui/approvals").await;
    let card = format!("a-{run}-refund");
    assert!(
        page.contains(&format!(r#"id="{card}-why-not""#)),
        "{ctx}: {page}"
    );
    assert!(
        !page.contains(&format!(r#"id="f-{card}""#)),
        "{ctx}: no form for the submitter: {page}"
    );
    let resp = post(server, otto, run, &[("decision", "approve")]).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{ctx}");
    let page = resp.text().await.expect("body");
    assert!(
        page.contains(&format!(r#"id="{card}-error""#)),
        "{ctx}: {page}"
    );
    assert!(page.contains("forbid_self"), "{ctx}: {page}");
    let a = pending_approval(db, run);
    assert_eq!(
        (a["status"].as_str(), a["approved_by"].clone()),
        (Some("pending"), serde_json::json!([])),
        "{ctx}: {a}"
    );
}
