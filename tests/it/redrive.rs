//! Redrive on both backends: a failed run goes back on the queue; its failed node runs
//! again under a new key (`<run>:<node>:2`) while the node that succeeded is replayed,
//! never re-sent; who and why are in the audit trail; a run with a call in doubt, a
//! run that did not fail and an unknown `--from` node are refused and write nothing.

use std::time::Duration;

use flow_adapters::testkit::http::{Behavior, CountingServer};
use reqwest::StatusCode;
use serde_json::json;

use crate::api::{OPERATOR, VIEWER, call, serve};
use crate::support::{Backend, TestDb, backends, output, run_id, runtime, show, stderr};

/// `prepare` (pure) → `charge` (HTTP, no retries) → `receipt` (pure), and a parallel
/// `notify` (HTTP) that `slow` mode holds past its timeout.
fn workflow(url: &str) -> String {
    format!(
        r#"name: pay
tools:
  echo: {{ kind: function, function: core.echo }}
  pay: {{ kind: http, method: POST, url: "{url}/pay", timeout: 300ms }}
  notify: {{ kind: http, method: POST, url: "{url}/notify", timeout: 300ms }}
nodes:
  prepare: {{ tool: echo, with: {{ amount: 10 }} }}
  charge:
    needs: [prepare]
    tool: pay
    with: {{ amount: "${{{{ nodes.prepare.output.amount }}}}" }}
    retry_policy: {{ max_retries: 0 }}
  notify:
    needs: [prepare]
    tool: notify
    with: {{ to: ops }}
    retry_policy: {{ max_retries: 0 }}
  receipt:
    needs: [charge, notify]
    tool: echo
    with: {{ paid: true }}
"#
    )
}

#[test]
fn redrive_runs_failed_nodes_again_and_replays_the_rest_on_both_backends() {
    for backend in backends() {
        redrive(backend);
    }
}

fn redrive(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(backend);
    let file = db.write("pay.yaml", &workflow(&down.url()));

    // The charge is refused (400: permanent): the run fails.
    down.set("/pay", Behavior::status(400));
    let failed = output(db.flow().arg("run").arg(&file));
    assert_eq!(failed.status.code(), Some(1), "{ctx}: {}", stderr(&failed));
    let run = run_id(&failed);
    assert_eq!(show(&db, &run)["run"]["status"], "failed", "{ctx}");

    let server = serve(&db);
    refused_before_anything(&db, &server, &run, &ctx);

    // The downstream is fixed; an operator redrives through the CLI, with a reason.
    down.set("/pay", Behavior::Echo);
    let redriven =
        output(
            db.flow()
                .args(["redrive", &run, "--by", "ada", "--reason", "PSP fixed"]),
        );
    assert_eq!(
        redriven.status.code(),
        Some(0),
        "{ctx}: {}",
        stderr(&redriven)
    );
    let queued = show(&db, &run);
    assert_eq!(queued["run"]["status"], "queued", "{ctx}: {queued}");
    assert_eq!(
        queued["run"]["error"],
        serde_json::Value::Null,
        "{ctx}: error cleared"
    );
    let audit = queued["audit"].as_array().cloned().unwrap_or_default();
    assert!(
        audit.iter().any(|a| a["event"] == "run.redriven"
            && a["by"] == "ada"
            && a["reason"] == "PSP fixed"),
        "{ctx}: {audit:?}"
    );
    let resumed = output(db.flow().args(["resume", &run]));
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{ctx}: {}",
        stderr(&resumed)
    );
    let done = show(&db, &run);
    assert_eq!(done["run"]["status"], "succeeded", "{ctx}: {done}");
    // The failed charge ran again under the next key; the charge under the first key,
    // the notify and the pure nodes were not sent again.
    assert_eq!(down.count(&format!("{run}:charge:1")), 1, "{ctx}");
    assert_eq!(down.count(&format!("{run}:charge:2")), 1, "{ctx}");
    assert_eq!(down.count(&format!("{run}:notify:1")), 1, "{ctx}");
    let steps: Vec<String> = done["steps"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter_map(|s| s["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        steps.contains(&"charge_retry1".to_string()),
        "{ctx}: {steps:?}"
    );
    assert_eq!(
        steps.iter().filter(|s| s.starts_with("prepare")).count(),
        1,
        "{ctx}: {steps:?}"
    );
    assert_eq!(
        steps.iter().filter(|s| s.starts_with("notify")).count(),
        1,
        "{ctx}: {steps:?}"
    );

    // A succeeded run cannot be redriven (exit 2), through the API neither (409).
    let again = output(db.flow().args(["redrive", &run, "--by", "ada"]));
    assert_eq!(again.status.code(), Some(2), "{ctx}: {}", stderr(&again));
    rt.block_on(async {
        let path = format!("/api/v1/runs/{run}/redrive");
        let (s, p) = call(
            &server,
            "POST",
            &path,
            Some(OPERATOR),
            Some(json!({"reason": "x"})),
        )
        .await;
        assert_eq!(s, StatusCode::CONFLICT, "{ctx}: {p}");
    });
    in_doubt_refused(&db, &down, &server, &file, &ctx);
}

/// A run that failed while another of its calls is in doubt is refused until that call
/// is settled: what is in doubt may have happened. Then the API redrives it.
fn in_doubt_refused(
    db: &TestDb,
    down: &CountingServer,
    server: &crate::api::Server,
    file: &std::path::Path,
    ctx: &str,
) {
    down.set("/pay", Behavior::status(400));
    down.set("/notify", Behavior::hold(Duration::from_secs(2)));
    let failed = output(db.flow().arg("run").arg(file));
    let run = run_id(&failed);
    let before = show(db, &run);
    assert_eq!(before["run"]["status"], "failed", "{ctx}: {before}");
    assert!(
        before["tool_calls"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["status"] == "in_doubt")),
        "{ctx}: {before}"
    );
    let refused = output(db.flow().args(["redrive", &run, "--by", "ada"]));
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{ctx}: {}",
        stderr(&refused)
    );
    assert!(
        stderr(&refused).contains("in doubt"),
        "{ctx}: {}",
        stderr(&refused)
    );
    assert_eq!(
        show(db, &run)["steps"],
        before["steps"],
        "{ctx}: nothing written"
    );
    let settled = output(db.flow().args([
        "resume",
        &run,
        "--resolve",
        "notify=succeeded",
        "--output",
        "{}",
        "--by",
        "ada",
        "--detach",
    ]));
    assert_eq!(
        settled.status.code(),
        Some(0),
        "{ctx}: {}",
        stderr(&settled)
    );
    let rt = runtime();
    rt.block_on(async {
        let path = format!("/api/v1/runs/{run}/redrive");
        let (s, p) = call(
            server,
            "POST",
            &path,
            Some(OPERATOR),
            Some(json!({"reason": "retry the charge"})),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{ctx}: {p}");
        assert_eq!(p["run"]["status"], "queued", "{ctx}: {p}");
    });
}

/// Refused, and nothing written: an unknown `--from` node, a viewer through the API.
fn refused_before_anything(db: &TestDb, server: &crate::api::Server, run: &str, ctx: &str) {
    let unknown = output(
        db.flow()
            .args(["redrive", run, "--from", "nope", "--by", "ada"]),
    );
    assert_eq!(
        unknown.status.code(),
        Some(2),
        "{ctx}: {}",
        stderr(&unknown)
    );
    assert!(
        stderr(&unknown).contains("no node `nope`"),
        "{ctx}: {}",
        stderr(&unknown)
    );
    runtime().block_on(async {
        let path = format!("/api/v1/runs/{run}/redrive");
        let (s, _) = call(server, "POST", &path, Some(VIEWER), Some(json!({}))).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{ctx}");
    });
    assert_eq!(
        show(db, run)["run"]["status"],
        "failed",
        "{ctx}: nothing written"
    );
}
