//! Calls in doubt through the operator API, on both backends: the inbox across runs,
//! two operators resolving the same call at once (exactly one 200), garbage resolves
//! that write nothing, the resolved run finishing under a daemon, and the bulk
//! resolve whose dry-run count equals what it then settles.

use flow_adapters::testkit::http::CountingServer;
use reqwest::StatusCode;
use serde_json::json;

use crate::api::{ADMIN, OPERATOR, VIEWER, call, serve};
use crate::crash::workflow;
use crate::support::{Backend, TestDb, backends, output, run_id, runtime, show, stderr};

/// A run of the pay workflow left paused with `charge` in doubt (the process dies after
/// the response arrived, the resume finds the call in doubt).
pub(crate) fn paused_run(db: &TestDb, file: &std::path::Path) -> String {
    let crashed = output(
        db.flow()
            .arg("run")
            .arg(file)
            .env("FLOW_FAULT", "after_response:charge"),
    );
    let run = run_id(&crashed);
    let resumed = output(db.flow().args(["resume", &run]));
    assert_eq!(resumed.status.code(), Some(3), "{}", stderr(&resumed));
    run
}

#[test]
fn in_doubt_inbox_race_and_bulk_on_both_backends() {
    for backend in backends() {
        in_doubt_inbox_race_and_bulk(backend);
    }
}

fn in_doubt_inbox_race_and_bulk(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let downstream = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(backend);
    let file = db.write("pay.yaml", &workflow(&downstream.url()));
    let runs: Vec<String> = (0..4).map(|_| paused_run(&db, &file)).collect();
    let server = serve(&db);
    rt.block_on(async {
        let (s, inbox) = call(&server, "GET", "/api/v1/in-doubt", Some(VIEWER), None).await;
        assert_eq!(s, StatusCode::OK, "{ctx}: {inbox}");
        let calls = inbox["calls"].as_array().cloned().unwrap_or_default();
        assert_eq!(calls.len(), 4, "{ctx}: {inbox}");
        let first = calls.iter().find(|c| c["run"] == runs[0].as_str()).cloned().unwrap_or_default();
        assert_eq!(first["node"], "charge");
        assert_eq!(first["tool"], "pay");
        assert_eq!(first["key"], format!("{}:charge:1", runs[0]));
        assert_eq!(first["attempts"], 1, "{first}");
        // The process died after the request left and before it counted it: the count
        // is unknown (null), never a bare 0 an operator could read as "not sent".
        assert_eq!(first["requests_sent"], json!(null), "{first}");
        assert_eq!((&first["requests_known"], &first["uncounted_sends"]), (&json!(0), &json!(1)), "{first}");
        assert!(first["requests_text"].as_str().is_some_and(|t| t.contains("at least 1 may have left")), "{first}");
        assert!(first["outbound_at"].is_string() && first["request"].is_object(), "{first}");

        // Garbage resolves: 400, and nothing written.
        let path = format!("/api/v1/runs/{}/resolve", runs[0]);
        let before = show(&db, &runs[0]);
        for body in [
            json!({"node": "charge", "outcome": "succeeded"}),
            json!({"node": "charge", "outcome": "maybe"}),
            json!({"node": "charge", "outcome": "retry", "output": {}}),
            json!({"node": "charge", "outcome": "failed", "extra": 1}),
            json!({"node": 5, "outcome": "failed"}),
        ] {
            let (s, p) = call(&server, "POST", &path, Some(OPERATOR), Some(body.clone())).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{ctx}: {body}: {p}");
        }
        let raw = reqwest::Client::new()
            .post(format!("{}{path}", server.base))
            .bearer_auth(OPERATOR)
            .header("content-type", "application/json")
            .body(r#"{"node": "charge", "outcome": "succeeded", "output": {not json"#)
            .send()
            .await
            .expect("post");
        assert_eq!(raw.status(), StatusCode::BAD_REQUEST, "{ctx}");
        assert_eq!(show(&db, &runs[0])["tool_calls"], before["tool_calls"], "{ctx}: nothing written");
        let (s, _) = call(&server, "POST", &path, Some(VIEWER), Some(json!({"node": "charge", "outcome": "retry"}))).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{ctx}");
        let (s, _) = call(&server, "POST", &path, Some(OPERATOR), Some(json!({"node": "nope", "outcome": "retry"}))).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{ctx}");

        // Two operators at once: exactly one wins.
        let body = json!({"node": "charge", "outcome": "succeeded", "output": {"count": 1}, "reason": "seen in the ledger of pay"});
        let (a, b) = tokio::join!(
            call(&server, "POST", &path, Some(OPERATOR), Some(body.clone())),
            call(&server, "POST", &path, Some(ADMIN), Some(body.clone())),
        );
        let mut statuses = [a.0, b.0];
        statuses.sort();
        assert_eq!(statuses, [StatusCode::OK, StatusCode::CONFLICT], "{ctx}: {a:?} {b:?}");
        let won = if a.0 == StatusCode::OK { &a.1 } else { &b.1 };
        let winner = if a.0 == StatusCode::OK { "otto" } else { "ada" };
        let charge = won["tool_calls"].as_array().and_then(|c| c.iter().find(|c| c["tool_call_id"] == "charge")).cloned().unwrap_or_default();
        assert_eq!(charge["status"], "succeeded", "{ctx}: {won}");
        assert_eq!(charge["resolution"]["by"], winner, "{ctx}: {charge}");
        assert_eq!(charge["resolution"]["reason"], "seen in the ledger of pay", "{charge}");
        assert_eq!(won["run"]["status"], "queued", "{ctx}: settled, back on the queue: {won}");
        let audit = show(&db, &runs[0])["audit"].clone();
        assert!(
            audit.as_array().is_some_and(|a| a.iter().any(|e| e["event"] == "tool_call.resolved" && e["by"] == winner)),
            "{ctx}: {audit}"
        );
        let (s, p) = call(&server, "POST", &path, Some(OPERATOR), Some(body)).await;
        assert_eq!(s, StatusCode::CONFLICT, "{ctx}: not in doubt any more: {p}");

        // Bulk: admins only; the dry-run count is what is then settled.
        let bulk = json!({"filter": {"tool": "pay"}, "outcome": "failed", "error": "refunded by hand", "dry_run": true});
        let (s, _) = call(&server, "POST", "/api/v1/in-doubt:resolve", Some(OPERATOR), Some(bulk.clone())).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{ctx}");
        let (s, dry) = call(&server, "POST", "/api/v1/in-doubt:resolve", Some(ADMIN), Some(bulk.clone())).await;
        assert_eq!((s, &dry["matched"]), (StatusCode::OK, &json!(3)), "{ctx}: {dry}");
        let (_, still) = call(&server, "GET", "/api/v1/in-doubt", Some(VIEWER), None).await;
        assert_eq!(still["calls"].as_array().map(Vec::len), Some(3), "{ctx}: a dry run settles nothing");
        let mut real = bulk;
        real["dry_run"] = json!(false);
        let (s, done) = call(&server, "POST", "/api/v1/in-doubt:resolve", Some(ADMIN), Some(real)).await;
        assert_eq!(s, StatusCode::OK, "{ctx}: {done}");
        assert_eq!(done["settled"], dry["matched"], "{ctx}: {done}");
        let (_, empty) = call(&server, "GET", "/api/v1/in-doubt", Some(VIEWER), None).await;
        assert_eq!(empty["calls"], json!([]), "{ctx}");
    });
    // A daemon finishes what was settled: the succeeded one, and the failed ones fail.
    let drained = output(
        db.flow()
            .args(["daemon", "--exit-when-idle", "--poll-interval", "50ms"]),
    );
    assert_eq!(
        drained.status.code(),
        Some(0),
        "{ctx}: {}",
        stderr(&drained)
    );
    assert_eq!(show(&db, &runs[0])["run"]["status"], "succeeded", "{ctx}");
    for run in &runs[1..] {
        assert_eq!(show(&db, run)["run"]["status"], "failed", "{ctx}");
    }
    assert_eq!(
        downstream.count(&format!("{}:charge:1", runs[0])),
        1,
        "{ctx}: never re-sent"
    );
}
