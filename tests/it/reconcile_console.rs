//! "Probe now" through the operator API and the console, on both backends: roles, CSRF,
//! a run that is not paused, and the probe history each shows.

use flow_adapters::testkit::http::{Behavior, CountingServer};
use reqwest::StatusCode;
use serde_json::json;

use crate::api::{OPERATOR, VIEWER, call, serve};
use crate::reconcile::{crash_at, workflow};
use crate::support::{Backend, TestDb, backends, output, runtime, show, stderr};
use crate::ui::http_session;

/// A run paused with `charge` in doubt after two probes the downstream could not answer.
fn paused(db: &TestDb, file: &std::path::Path) -> String {
    let (run, _) = crash_at(db, file, "after_outbound");
    let resumed = output(db.flow().args(["resume", &run]));
    assert_eq!(resumed.status.code(), Some(3), "{}", stderr(&resumed));
    run
}

fn probe_now(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let downstream = rt.block_on(CountingServer::start()).expect("downstream");
    let prober = rt.block_on(CountingServer::start()).expect("probe server");
    prober.set("*", Behavior::status(500));
    let db = TestDb::new(backend);
    let file = db.write(
        "pay.yaml",
        &workflow(
            &downstream.url(),
            &format!("{}/effects", prober.url()),
            "0s",
            2,
        ),
    );
    let api_run = paused(&db, &file);
    let ui_run = paused(&db, &file);
    // The downstream can answer now: no such charge.
    prober.set(
        "*",
        Behavior::Json {
            status: 404,
            body: json!({"error": "no such charge"}),
        },
    );
    let server = serve(&db);
    rt.block_on(async {
        let path = format!("/api/v1/runs/{api_run}/reconcile");
        let (s, _) = call(&server, "POST", &path, Some(VIEWER), None).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{ctx}: a viewer cannot probe");
        assert_eq!(
            show(&db, &api_run)["probes"].as_array().map(Vec::len),
            Some(2),
            "{ctx}"
        );
        let (s, _) = call(
            &server,
            "POST",
            "/api/v1/runs/run_nope/reconcile",
            Some(OPERATOR),
            None,
        )
        .await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{ctx}");
        let (s, body) = call(
            &server,
            "POST",
            &path,
            Some(OPERATOR),
            Some(json!({"reason": "downstream is back"})),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{ctx}: {body}");
        assert_eq!(body["probes"][0]["node"], "charge", "{ctx}: {body}");
        assert_eq!(
            body["probes"][0]["outcome"]["decision"], "resend",
            "{ctx}: {body}"
        );
        assert_eq!(
            body["probes"][0]["outcome"]["settled"], true,
            "{ctx}: {body}"
        );
        assert_eq!(
            body["run"]["run"]["status"], "queued",
            "{ctx}: re-queued for the daemons: {body}"
        );
        let probes = body["run"]["probes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(probes.len(), 3, "{ctx}");
        assert_eq!(
            probes[2]["by"], "otto (probe now: downstream is back)",
            "{ctx}: who asked and why: {probes:?}"
        );
        let (s, p) = call(&server, "POST", &path, Some(OPERATOR), None).await;
        assert_eq!(
            s,
            StatusCode::CONFLICT,
            "{ctx}: a queued run is not probed on request: {p}"
        );

        console(&server, &db, &ui_run, &api_run, &ctx).await;
    });
    assert_eq!(downstream.total(), 0, "{ctx}: probing sent no effect");
}

/// The console: the button, CSRF, the history; a viewer has no button.
async fn console(server: &crate::api::Server, db: &TestDb, ui_run: &str, api_run: &str, ctx: &str) {
    {
        let (http, cookie, csrf) = http_session(server, OPERATOR).await;
        let page_url = format!("{}/ui/runs/{ui_run}", server.base);
        let page = http
            .get(&page_url)
            .header("cookie", &cookie)
            .send()
            .await
            .expect("page");
        let html = page.text().await.expect("html");
        assert!(
            html.contains("id=\"probe-now\""),
            "{ctx}: the operator sees Probe now"
        );
        assert!(
            html.contains("<table class=\"probes\">"),
            "{ctx}: and the probe history"
        );
        let post = format!("{}/ui/runs/{ui_run}/reconcile", server.base);
        let forged = http
            .post(&post)
            .header("cookie", &cookie)
            .form(&[("csrf", "forged")])
            .send()
            .await
            .expect("post");
        assert_eq!(forged.status(), StatusCode::FORBIDDEN, "{ctx}");
        assert_eq!(
            show(db, ui_run)["probes"].as_array().map(Vec::len),
            Some(2),
            "{ctx}: a forged POST probes nothing"
        );
        let ok = http
            .post(&post)
            .header("cookie", &cookie)
            .form(&[("csrf", csrf.as_str())])
            .send()
            .await
            .expect("post");
        assert_eq!(ok.status(), StatusCode::SEE_OTHER, "{ctx}");
        let to = ok
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        assert!(to.ends_with("?probed=1"), "{ctx}: {to}");
        let s = show(db, ui_run);
        assert_eq!(
            crate::support::call(&s, "charge")["resolution"]["by"],
            "reconcile",
            "{ctx}: {s}"
        );

        let (vhttp, vcookie, _) = http_session(server, VIEWER).await;
        let vpage = vhttp
            .get(format!("{}/ui/runs/{api_run}", server.base))
            .header("cookie", &vcookie)
            .send()
            .await
            .expect("page");
        assert!(
            !vpage
                .text()
                .await
                .expect("html")
                .contains("id=\"probe-now\""),
            "{ctx}: a viewer has no button"
        );
    }
}

#[test]
fn probe_now_through_the_api_and_the_console() {
    for b in backends() {
        probe_now(b);
    }
}
