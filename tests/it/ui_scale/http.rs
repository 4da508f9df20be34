//! The console's worklist over plain HTTP, on SQLite and PostgreSQL: signing in
//! returns only to local console pages (no open redirect), `/ui/events` streams to a
//! session cookie and carries no payload, pages allow only our own script, and
//! "resolve selected" refuses forgeries, viewers and bad values before writing, lists
//! what a dry run would settle or skip, and skips a call settled meanwhile; every
//! page's *In doubt* link counts the calls in doubt.

use std::time::{Duration, Instant};

use flow_adapters::testkit::http::CountingServer;
use reqwest::StatusCode;
use reqwest::redirect::Policy;
use serde_json::json;

use super::{WAIT, charge};
use crate::api::{OPERATOR, Server, VIEWER, call, serve};
use crate::api_doubt::paused_run;
use crate::crash::workflow;
use crate::support::{Backend, TestDb, backends, runtime};
use crate::ui::{csrf_of, http_session};

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
        // runs[2]'s call was settled: two calls are in doubt.
        nav_badge(&server, &runs[0], Some(2), &ctx).await;
        selection_refusals(&server, &db, &runs, &ctx).await;
        selection_dry_run_and_skips(&server, &db, &runs, &ctx).await;
        nav_badge(&server, &runs[0], None, &ctx).await;
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

/// Every page's *In doubt* link carries the number of calls in doubt (`want`), in a
/// live region so live updates refresh it; no number when none is.
async fn nav_badge(server: &Server, run: &str, want: Option<u32>, ctx: &str) {
    let (http, cookie, _) = http_session(server, VIEWER).await;
    let region = r#"In doubt<span data-live="nav-in-doubt">"#;
    for page in [
        "/ui/runs".to_string(),
        format!("/ui/runs/{run}"),
        "/ui/in-doubt".into(),
    ] {
        let html = http
            .get(format!("{}{page}", server.base))
            .header("cookie", &cookie)
            .send()
            .await
            .expect("page")
            .text()
            .await
            .expect("body");
        let link = html
            .split(region)
            .nth(1)
            .and_then(|rest| rest.split("</span></a>").next())
            .unwrap_or_else(|| panic!("{ctx}: {page}: no In doubt link with its region"));
        let shown = match want {
            Some(n) => format!(r#" <span class="badge">({n})</span>"#),
            None => String::new(),
        };
        assert_eq!(link, shown, "{ctx}: {page}");
    }
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
