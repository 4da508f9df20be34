//! One view of a run for every reader: `flow show --json`, `GET /api/v1/runs/{id}` and
//! the console's run page are the same `RunView`; the field names it renamed still
//! parse for one release; text `flow show` says why a call is in doubt, and the API's
//! in-doubt listing and the console's worklist say the same why.

use std::time::Duration;

use flow_adapters::testkit::http::{Behavior, CountingServer};
use serde::Deserialize;
use serde_json::Value;

use crate::api::{VIEWER, call, serve};
use crate::api_doubt::paused_run;
use crate::crash::workflow;
use crate::support::{Backend, TestDb, backends, output, run_id, runtime, show, stderr, stdout};
use crate::ui::http_session;

/// A `tool_calls` entry as a script written against the old names reads it.
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct OldCall {
    tool_call_id: String,
    attempt_count: u32,
    outbound_requests: Option<u32>,
    outbound_requests_known: u32,
    current_key: String,
    outbound_started_at: Option<String>,
}

/// A `steps` entry under the old names.
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct OldStep {
    step_id: String,
    node_id: String,
}

#[test]
fn the_cli_the_api_and_the_console_show_one_run_view_on_both_backends() {
    for backend in backends() {
        one_view(backend);
    }
}

fn one_view(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let downstream = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(backend);
    let file = db.write("pay.yaml", &workflow(&downstream.url()));
    let run = paused_run(&db, &file);
    let cli = show(&db, &run);
    let server = serve(&db);
    rt.block_on(async {
        let (_, api) = call(
            &server,
            "GET",
            &format!("/api/v1/runs/{run}"),
            Some(VIEWER),
            None,
        )
        .await;
        assert_eq!(
            api, cli,
            "{ctx}: the API answers exactly `flow show --json`"
        );

        // The renamed fields still parse under their old names.
        let old: Vec<OldCall> =
            serde_json::from_value(cli["tool_calls"].clone()).expect("old call names");
        let charge = old
            .iter()
            .find(|c| c.tool_call_id == "charge")
            .expect("charge");
        assert_eq!(charge.current_key, format!("{run}:charge:1"), "{ctx}");
        assert_eq!(
            charge.outbound_requests, None,
            "{ctx}: unknown count stays null"
        );
        let steps: Vec<OldStep> =
            serde_json::from_value(cli["steps"].clone()).expect("old step names");
        assert!(
            steps
                .iter()
                .all(|s| !s.step_id.is_empty() && !s.node_id.is_empty()),
            "{ctx}"
        );

        // The console's run page shows every field of the view a reader looks for.
        let (http, cookie, _) = http_session(&server, VIEWER).await;
        let html = http
            .get(format!("{}/ui/runs/{run}", server.base))
            .header("cookie", &cookie)
            .send()
            .await
            .expect("page")
            .text()
            .await
            .expect("html");
        let text = |v: &Value| {
            v.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string())
        };
        for node in cli["nodes"].as_array().expect("nodes") {
            assert!(
                html.contains(&format!("id=\"node-{}\"", text(&node["id"]))),
                "{ctx}: node {node}"
            );
        }
        for step in cli["steps"].as_array().expect("steps") {
            assert!(
                html.contains(&format!("<code>{}</code>", text(&step["id"]))),
                "{ctx}: step {step}"
            );
        }
        let c = cli["tool_calls"]
            .as_array()
            .and_then(|calls| calls.iter().find(|c| c["node"] == "charge"))
            .expect("charge");
        for field in ["key", "requests_text", "status", "in_doubt_reason"] {
            let want = minijinja_escaped(&text(&c[field]));
            assert!(
                html.contains(&want),
                "{ctx}: call {field} `{want}` not on the page"
            );
        }
        assert!(
            html.contains(&format!("attempts {}", c["attempts"])),
            "{ctx}"
        );
    });
    // Text `flow show` says why the call is in doubt.
    let shown = output(db.flow().args(["show", &run]));
    let reason = cli["tool_calls"]
        .as_array()
        .and_then(|calls| calls.iter().find(|c| c["node"] == "charge"))
        .and_then(|c| c["in_doubt_reason"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(
        !reason.is_empty(),
        "{ctx}: a call in doubt has a reason: {cli}"
    );
    assert!(
        stdout(&shown).contains(&format!("# why: {reason}")),
        "{ctx}: {}",
        stdout(&shown)
    );
}

#[test]
fn the_api_and_the_console_say_why_a_call_is_in_doubt_as_show_does_on_both_backends() {
    for backend in backends() {
        one_reason(backend);
    }
}

/// The pay workflow with a 300 ms timeout on `charge` and no retry: a downstream that
/// holds the request longer leaves the call in doubt by a timeout.
fn timing_out(url: &str) -> String {
    workflow(url).replace(
        &format!(r#"pay: {{ kind: http, method: POST, url: "{url}/pay" }}"#),
        &format!(r#"pay: {{ kind: http, method: POST, url: "{url}/pay", timeout: 300ms }}"#),
    )
}

/// Two calls in doubt for two reasons — a timeout (the worker recorded it) and a
/// crash after the send (a takeover recorded "lease … ended"; only the event holds
/// it) — each read by `flow show --json`, `GET /api/v1/in-doubt` and the console's
/// worklist: one reason, word for word.
fn one_reason(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let downstream = rt.block_on(CountingServer::start()).expect("downstream");
    let slow = rt
        .block_on(CountingServer::start())
        .expect("slow downstream");
    slow.set("/pay", Behavior::hold(Duration::from_secs(3)));
    let db = TestDb::new(backend);
    let crashed = paused_run(&db, &db.write("pay.yaml", &workflow(&downstream.url())));
    let file = db.write("slow.yaml", &timing_out(&slow.url()));
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(3), "{ctx}: {}", stderr(&out));
    let timed_out = run_id(&out);
    let server = serve(&db);
    rt.block_on(async {
        let (http, cookie, _) = http_session(&server, VIEWER).await;
        for (run, says) in [(&timed_out, "timed out"), (&crashed, "lease of")] {
            let shown = show(&db, run);
            let reason = shown["tool_calls"]
                .as_array()
                .and_then(|calls| calls.iter().find(|c| c["node"] == "charge"))
                .and_then(|c| c["in_doubt_reason"].as_str())
                .unwrap_or_default()
                .to_string();
            assert!(reason.contains(says), "{ctx}: {run}: {shown}");
            let (_, listed) = call(
                &server,
                "GET",
                &format!("/api/v1/in-doubt?run={run}"),
                Some(VIEWER),
                None,
            )
            .await;
            assert_eq!(
                listed["calls"][0]["in_doubt_reason"],
                reason.as_str(),
                "{ctx}: the API's item says why as `flow show` does: {listed}"
            );
            let page = http
                .get(format!("{}/ui/in-doubt?run={run}", server.base))
                .header("cookie", &cookie)
                .send()
                .await
                .expect("page")
                .text()
                .await
                .expect("html");
            assert!(
                page.contains(&minijinja_escaped(&reason)),
                "{ctx}: the worklist says `{reason}`"
            );
        }
    });
}

/// `text` as the console's templates escape it (HTML: `&`, `<`, `>`, `"`, `'`, `/`).
fn minijinja_escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#x27;")
        .replace('/', "&#x2f;")
}
