//! Approvals through the real binary, on both backends, with a downstream that counts
//! requests per idempotency key: what was approved is what is sent, at most once, and
//! the decision is in the ledger before the outbound mark.
//!
//! - the CLI: a run pauses awaiting approval (nothing sent); bad inputs are refused; a
//!   crash between the approval and the outbound mark sends exactly once after resume;
//!   a denial fails the node and sends nothing;
//! - a changed request (an approval whose digest is not the rendered one) is voided
//!   and not sent;
//! - the API: a viewer cannot decide, `forbid_self` refuses the submitting token, the
//!   loser of a second decision gets 409 naming the winner; a daemon sends once;
//! - a timeout taken by another daemon after the first is SIGKILLed, once;
//! - with no daemon, a decision after the deadline is refused and nothing is sent.

use std::time::{Duration, Instant};

use flow_adapters::testkit::http::CountingServer;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::{ADMIN, OPERATOR, VIEWER, call, serve};
use crate::support::{Backend, TestDb, backends, output, run_id, runtime, show, stderr, stdout};

/// `order` (pure) → `refund` (HTTP POST) behind an approval with a required input.
pub(crate) fn workflow(url: &str, approval: &str) -> String {
    format!(
        r#"name: refunds
inputs:
  order_id: {{ type: integer, default: 117 }}
tools:
  echo: {{ kind: function, function: core.echo }}
  pay: {{ kind: http, method: POST, url: "{url}/refund", timeout: 2s }}
nodes:
  order: {{ tool: echo, with: {{ total: 42 }} }}
  refund:
    needs: [order]
    tool: pay
    with: {{ order: "${{{{ inputs.order_id }}}}", amount: "${{{{ nodes.order.output.total }}}}" }}
    retry_policy: {{ max_retries: 0 }}
    approval:
      message: "Refund ${{{{ nodes.order.output.total }}}} EUR"
{approval}
  receipt:
    needs: [refund]
    tool: echo
    with: {{ why: "${{{{ nodes.refund.approval.inputs }}}}", by: "${{{{ nodes.refund.approval.by }}}}" }}
"#
    )
}

const NEEDS_REASON: &str =
    "      inputs: { reason: { type: string, required: true } }\n      timeout: 1h";

/// How many events of type `t` run `run` has in the outbox.
pub(crate) fn events(db: &TestDb, run: &str, t: &str) -> usize {
    runtime().block_on(async {
        let ledger = flow_ledger::Ledger::open(&db.url, flow_ledger::OpenOptions::default())
            .await
            .expect("ledger");
        let filter = flow_ledger::EventFilter {
            run_id: Some(run.to_owned()),
            ..Default::default()
        };
        let list = ledger.list_events(filter).await.expect("events");
        ledger.close().await;
        list.iter().filter(|e| e.event_type.as_str() == t).count()
    })
}

pub(crate) fn approval(s: &Value) -> &Value {
    &s["approvals"][0]
}

#[test]
fn the_approved_request_is_sent_once_and_a_denied_one_never_on_both_backends() {
    for backend in backends() {
        approve_then_crash_then_send(backend);
        deny(backend);
    }
}

fn approve_then_crash_then_send(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(backend);
    let file = db.write("refund.yaml", &workflow(&down.url(), NEEDS_REASON));

    let paused = output(db.flow().arg("run").arg(&file));
    assert_eq!(paused.status.code(), Some(3), "{ctx}: {}", stderr(&paused));
    assert!(
        stderr(&paused).contains("awaiting approval: refund"),
        "{ctx}: {}",
        stderr(&paused)
    );
    let run = run_id(&paused);
    let key = format!("{run}:refund:1");
    assert_eq!(down.total(), 0, "{ctx}: nothing leaves before the approval");

    let listed = output(db.flow().args(["approvals", "--json"]));
    let items: Value = serde_json::from_str(&stdout(&listed)).expect("json");
    assert_eq!(items[0]["run"], run.as_str(), "{ctx}: {items}");
    assert_eq!(items[0]["status"], "pending");
    assert_eq!(items[0]["message"], "Refund 42 EUR");
    assert_eq!(
        items[0]["request"]["spec"]["body"],
        json!({ "order": 117, "amount": 42 }),
        "{ctx}: {items}"
    );
    let digest = items[0]["digest"].as_str().expect("digest").to_owned();

    // A crash before any decision: resuming sends nothing, the node still waits.
    let again = output(db.flow().args(["resume", &run]));
    assert_eq!(again.status.code(), Some(3), "{ctx}: {}", stderr(&again));
    assert_eq!(down.total(), 0, "{ctx}");

    for bad in [
        vec!["approve", &run, "refund", "--by", "alice"],
        vec![
            "approve", &run, "refund", "--by", "alice", "--input", "why=x",
        ],
        vec![
            "approve", &run, "refund", "--by", "alice", "--input", "reason=x", "--digest",
            "sha256:0",
        ],
        vec![
            "approve", &run, "nosuch", "--by", "alice", "--input", "reason=x",
        ],
    ] {
        let out = output(db.flow().args(&bad));
        assert_eq!(
            out.status.code(),
            Some(2),
            "{ctx}: {bad:?}: {}",
            stderr(&out)
        );
    }
    assert_eq!(
        approval(&show(&db, &run))["status"],
        "pending",
        "{ctx}: refusals write nothing"
    );

    let ok = output(db.flow().args([
        "approve",
        &run,
        "refund",
        "--by",
        "alice",
        "--input",
        "reason=duplicate",
        "--digest",
        &digest,
    ]));
    assert_eq!(ok.status.code(), Some(0), "{ctx}: {}", stderr(&ok));
    assert_eq!(
        show(&db, &run)["run"]["status"],
        "queued",
        "{ctx}: the decision re-queues"
    );

    // A crash after the approval, before the outbound mark: nothing left.
    let crashed = output(
        db.flow()
            .args(["resume", &run])
            .env("FLOW_FAULT", "after_approval:refund"),
    );
    assert_eq!(
        crashed.status.code(),
        None,
        "{ctx}: the fault aborts: {}",
        stderr(&crashed)
    );
    assert_eq!(down.total(), 0, "{ctx}");

    let done = output(db.flow().args(["resume", &run]));
    assert_eq!(done.status.code(), Some(0), "{ctx}: {}", stderr(&done));
    assert_eq!(down.count(&key), 1, "{ctx}: sent exactly once");
    let again = output(db.flow().args(["resume", &run]));
    assert_eq!(again.status.code(), Some(0), "{ctx}");
    assert_eq!(down.total(), 1, "{ctx}: never again");

    let s = show(&db, &run);
    let a = approval(&s);
    assert_eq!(
        (a["status"].as_str(), a["decided_by"].as_str()),
        (Some("approved"), Some("alice")),
        "{ctx}: {a}"
    );
    assert_eq!(a["decision_inputs"], json!({ "reason": "duplicate" }));
    assert_eq!(a["digest"], digest.as_str());
    assert_eq!(events(&db, &run, "approval.decided"), 1, "{ctx}");
    let receipt = &s["run"]["output"]["receipt"];
    assert_eq!(
        *receipt,
        json!({ "why": { "reason": "duplicate" }, "by": "alice" }),
        "{ctx}: dependents read the approver's inputs: {receipt}"
    );
}

/// What a dependent may read of an approval is checked before anything runs.
#[test]
fn reading_an_undeclared_approval_input_is_refused_at_validation() {
    let db = TestDb::new(Backend::Sqlite);
    let text = workflow("http://127.0.0.1:9", NEEDS_REASON).replace(
        "nodes.refund.approval.inputs }}",
        "nodes.refund.approval.inputs.nope }}",
    );
    let file = db.write("bad.yaml", &text);
    let out = output(db.flow().arg("validate").arg(&file));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the approval of `refund` gives `by` and `inputs` (reason)"),
        "{}",
        stderr(&out)
    );
    let order = workflow("http://127.0.0.1:9", NEEDS_REASON)
        .replace("nodes.refund.approval.by }}", "nodes.order.approval.by }}");
    let file = db.write("bad2.yaml", &order);
    let out = output(db.flow().arg("validate").arg(&file));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("a node exposes only `nodes.order.output`"),
        "{}",
        stderr(&out)
    );
}

fn deny(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(backend);
    let file = db.write("refund.yaml", &workflow(&down.url(), "      timeout: 1h"));
    let paused = output(db.flow().arg("run").arg(&file));
    assert_eq!(paused.status.code(), Some(3), "{ctx}: {}", stderr(&paused));
    let run = run_id(&paused);
    let no_reason = output(db.flow().args(["deny", &run, "refund", "--by", "bob"]));
    assert_eq!(
        no_reason.status.code(),
        Some(2),
        "{ctx}: a denial needs a reason"
    );
    let denied = output(db.flow().args([
        "deny",
        &run,
        "refund",
        "--by",
        "bob",
        "--reason",
        "wrong amount",
    ]));
    assert_eq!(denied.status.code(), Some(0), "{ctx}: {}", stderr(&denied));
    let late = output(db.flow().args(["approve", &run, "refund", "--by", "alice"]));
    assert_eq!(late.status.code(), Some(2), "{ctx}");
    assert!(
        stderr(&late).contains("already denied (by bob)"),
        "{ctx}: {}",
        stderr(&late)
    );
    let failed = output(db.flow().args(["resume", &run]));
    assert_eq!(failed.status.code(), Some(1), "{ctx}: {}", stderr(&failed));
    let s = show(&db, &run);
    let step = s["steps"]
        .as_array()
        .and_then(|a| a.iter().find(|st| st["node"] == "refund"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(step["status"], "failed", "{ctx}: {s}");
    assert!(
        step["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("approval denied by bob: wrong amount"),
        "{ctx}: {step}"
    );
    assert_eq!(down.total(), 0, "{ctx}: a denied request never leaves");
}

/// An approval binds to the digest it was given for: when the request rendered at send
/// time has another digest, it is not sent; the approval goes back to pending under the
/// new digest (`approval.invalidated`) and needs a new decision. The change is made in
/// the database (the stored approval now holds another digest, as if approved under an
/// earlier rendering): nothing in a run's own inputs can change between the two.
#[test]
fn a_changed_request_is_not_sent_on_both_backends() {
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let rt = runtime();
        let down = rt.block_on(CountingServer::start()).expect("downstream");
        let db = TestDb::new(backend);
        let file = db.write("refund.yaml", &workflow(&down.url(), "      timeout: 1h"));
        let run = run_id(&output(db.flow().arg("run").arg(&file)));
        let ok = output(db.flow().args(["approve", &run, "refund", "--by", "alice"]));
        assert_eq!(ok.status.code(), Some(0), "{ctx}: {}", stderr(&ok));
        let digest = approval(&show(&db, &run))["digest"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        rt.block_on(set_digest(
            &db,
            backend,
            "sha256:approved-under-another-rendering",
        ));

        let out = output(db.flow().args(["resume", &run]));
        assert_eq!(
            out.status.code(),
            Some(3),
            "{ctx}: paused again: {}",
            stderr(&out)
        );
        assert_eq!(down.total(), 0, "{ctx}: the changed request is not sent");
        let s = show(&db, &run);
        let a = approval(&s);
        assert_eq!(a["status"], "pending", "{ctx}: {a}");
        assert_eq!(
            a["digest"],
            digest.as_str(),
            "{ctx}: pending under the rendered digest"
        );
        assert_eq!(
            a["approved_by"],
            json!([]),
            "{ctx}: the old approval does not count"
        );
        assert_eq!(events(&db, &run, "approval.invalidated"), 1, "{ctx}");

        let ok = output(db.flow().args(["approve", &run, "refund", "--by", "bob"]));
        assert_eq!(ok.status.code(), Some(0), "{ctx}: {}", stderr(&ok));
        let done = output(db.flow().args(["resume", &run]));
        assert_eq!(done.status.code(), Some(0), "{ctx}: {}", stderr(&done));
        assert_eq!(down.count(&format!("{run}:refund:1")), 1, "{ctx}");
    }
}

async fn set_digest(db: &TestDb, backend: Backend, digest: &str) {
    let sql = "UPDATE approvals SET digest = $1 WHERE node_id = 'refund'";
    match backend {
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.expect("sqlite");
            sqlx::query(sql)
                .bind(digest)
                .execute(&pool)
                .await
                .expect("update");
            pool.close().await;
        }
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(&db.url).await.expect("postgres");
            sqlx::query(sql)
                .bind(digest)
                .execute(&pool)
                .await
                .expect("update");
            pool.close().await;
        }
    }
}

/// Through the API with a daemon: the run submitted by `otto` pauses awaiting approval;
/// a viewer is refused (403) and so is `otto` under `forbid_self`; `ada` approves, a
/// second decision gets 409 naming her; the daemon sends the request once.
#[test]
fn the_api_decides_who_may_approve_on_both_backends() {
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let rt = runtime();
        let down = rt.block_on(CountingServer::start()).expect("downstream");
        let db = TestDb::new(backend);
        let text = workflow(
            &down.url(),
            "      approvers: { roles: [operator] }\n      forbid_self: true\n      timeout: 1h",
        );
        let server = serve(&db);
        let mut daemon = db
            .flow()
            .args(["daemon", "--poll-interval", "50ms"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("daemon");
        rt.block_on(async {
            let (st, body) = call(
                &server,
                "POST",
                "/api/v1/runs",
                Some(OPERATOR),
                Some(json!({ "workflow": text })),
            )
            .await;
            assert_eq!(st, StatusCode::CREATED, "{ctx}: {body}");
            let run = body["id"].as_str().expect("id").to_owned();
            let path = format!("/api/v1/runs/{run}/approvals/refund");
            let listed = wait_for_pending(&server, &ctx).await;
            assert_eq!(
                listed["items"][0]["submitted_by"], "otto",
                "{ctx}: {listed}"
            );

            let approve = json!({ "decision": "approve" });
            let (st, _) = call(&server, "POST", &path, Some(VIEWER), Some(approve.clone())).await;
            assert_eq!(st, StatusCode::FORBIDDEN, "{ctx}: a viewer never decides");
            let (st, body) = call(
                &server,
                "POST",
                &path,
                Some(OPERATOR),
                Some(approve.clone()),
            )
            .await;
            assert_eq!(st, StatusCode::FORBIDDEN, "{ctx}: forbid_self: {body}");
            assert!(
                body["detail"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("forbid_self"),
                "{ctx}: {body}"
            );
            let (st, body) = call(
                &server,
                "POST",
                &path,
                Some(ADMIN),
                Some(json!({ "decision": "deny" })),
            )
            .await;
            assert_eq!(
                st,
                StatusCode::BAD_REQUEST,
                "{ctx}: a denial needs a reason: {body}"
            );
            let (st, body) = call(&server, "POST", &path, Some(ADMIN), Some(approve.clone())).await;
            assert_eq!(st, StatusCode::OK, "{ctx}: {body}");
            assert_eq!(body["outcome"], "approved", "{ctx}: {body}");
            let (st, body) = call(
                &server,
                "POST",
                &path,
                Some(ADMIN),
                Some(json!({ "decision": "deny", "reason": "late" })),
            )
            .await;
            assert_eq!(st, StatusCode::CONFLICT, "{ctx}: {body}");
            assert!(
                body["detail"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("already approved (by ada)"),
                "{ctx}: {body}"
            );

            let key = format!("{run}:refund:1");
            let deadline = Instant::now() + Duration::from_secs(30);
            while down.count(&key) == 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            wait_status(&db, &run, "succeeded").await;
            assert_eq!(down.count(&key), 1, "{ctx}: sent once by the daemon");
        });
        let _ = daemon.kill();
        let _ = daemon.wait();
    }
}

async fn wait_for_pending(server: &crate::api::Server, ctx: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (st, body) = call(server, "GET", "/api/v1/approvals", Some(VIEWER), None).await;
        assert_eq!(st, StatusCode::OK, "{ctx}: {body}");
        if body["items"].as_array().is_some_and(|a| !a.is_empty()) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{ctx}: no approval was requested"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_status(db: &TestDb, run: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = show(db, run);
        if s["run"]["status"] == status {
            return s;
        }
        assert!(Instant::now() < deadline, "run never became {status}: {s}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An 8 s approval whose daemon is SIGKILLed while it waits (8 s: long enough that the
/// first daemon is killed before the deadline however loaded the machine): another
/// daemon times it out, once; the node fails (`on_timeout: fail`), nothing is sent, and no second timer
/// fires later.
#[test]
fn a_timeout_is_taken_once_by_another_daemon_on_both_backends() {
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let rt = runtime();
        let down = rt.block_on(CountingServer::start()).expect("downstream");
        let db = TestDb::new(backend);
        let file = db.write(
            "refund.yaml",
            &workflow(&down.url(), "      timeout: 8s\n      on_timeout: fail"),
        );
        let metrics = crate::daemon::free_port();
        let daemon = |extra: &[&str]| {
            db.flow()
                .args(["daemon", "--poll-interval", "50ms"])
                .args(extra)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("daemon")
        };
        let mut first = daemon(&["--metrics-addr", &metrics.to_string()]);
        let submitted = output(db.flow().arg("submit").arg(&file));
        let run = stdout(&submitted).trim().to_owned();
        rt.block_on(wait_status(&db, &run, "paused"));
        let (code, body) = crate::daemon::http_get(metrics, "/metrics").expect("metrics");
        assert_eq!(code, 200, "{ctx}");
        assert!(body.contains("flow_approvals_pending 1"), "{ctx}: {body}");
        let _ = first.kill();
        let _ = first.wait();
        let mut second = daemon(&[]);
        let s = rt.block_on(wait_status(&db, &run, "failed"));
        std::thread::sleep(Duration::from_secs(3));
        let _ = second.kill();
        let _ = second.wait();
        let s2 = show(&db, &run);
        assert_eq!(s2["run"]["status"], "failed", "{ctx}: {s}");
        assert_eq!(approval(&s2)["status"], "timed_out", "{ctx}: {s2}");
        assert_eq!(events(&db, &run, "approval.timed_out"), 1, "{ctx}: once");
        let step = s2["steps"]
            .as_array()
            .and_then(|a| a.iter().find(|st| st["node"] == "refund"))
            .cloned()
            .unwrap_or_default();
        assert!(
            step["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("approval timed out"),
            "{ctx}: {step}"
        );
        assert_eq!(down.total(), 0, "{ctx}: a timeout never approves");
    }
}

/// `[[policy.approvals]]` gates a node whose workflow asks for no approval: `flow
/// validate --config` says so, the run waits (nothing sent) until an admin approves,
/// and a node the rule does not match (a GET) runs at once.
#[test]
fn the_installation_policy_gates_calls_the_workflow_did_not_on_both_backends() {
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let rt = runtime();
        let down = rt.block_on(CountingServer::start()).expect("downstream");
        let db = TestDb::new(backend);
        db.write(
            "flow.toml",
            r#"
[[policy.approvals]]
name = "writes-to-payments"
match = { tool_kind = "http", method = ["POST", "DELETE"], host = "127.0.0.1" }
require = { roles = ["admin"] }
timeout = "1h"
"#,
        );
        let text = format!(
            r#"name: policy
tools:
  look: {{ kind: http, method: GET, url: "{url}/look" }}
  pay: {{ kind: http, method: POST, url: "{url}/refund" }}
nodes:
  look: {{ tool: look }}
  refund: {{ tool: pay, needs: [look], with: {{ amount: 5 }} }}
"#,
            url = down.url()
        );
        let file = db.write("policy.yaml", &text);
        let validated = output(
            db.flow()
                .args(["--config", "flow.toml", "validate"])
                .arg(&file),
        );
        assert_eq!(
            validated.status.code(),
            Some(0),
            "{ctx}: {}",
            stderr(&validated)
        );
        assert!(
            stdout(&validated)
                .contains("node `refund` needs approval: policy `writes-to-payments`"),
            "{ctx}: {}",
            stdout(&validated)
        );
        assert!(
            !stdout(&validated).contains("node `look`"),
            "{ctx}: a GET is not gated"
        );

        let paused = output(db.flow().arg("run").arg(&file));
        assert_eq!(paused.status.code(), Some(3), "{ctx}: {}", stderr(&paused));
        let run = run_id(&paused);
        assert_eq!(down.total(), 1, "{ctx}: the GET ran: {}", stderr(&paused));
        assert_eq!(
            down.count(&format!("{run}:refund:1")),
            0,
            "{ctx}: the POST waits"
        );
        let a = approval(&show(&db, &run)).clone();
        assert_eq!(a["roles"], json!(["admin"]), "{ctx}: {a}");
        let ok = output(db.flow().args(["approve", &run, "refund", "--by", "ada"]));
        assert_eq!(ok.status.code(), Some(0), "{ctx}: {}", stderr(&ok));
        let done = output(db.flow().args(["resume", &run]));
        assert_eq!(done.status.code(), Some(0), "{ctx}: {}", stderr(&done));
        assert_eq!(
            down.count(&format!("{run}:refund:1")),
            1,
            "{ctx}: sent once"
        );
        assert_eq!(down.total(), 2, "{ctx}");
    }
}

/// `mcp_destructive = true` gates the MCP tools whose annotations say they may destroy
/// data (`delete_thing`: destructiveHint) and those that say nothing (`echo`: MCP's
/// default is destructive), not a read-only one (`lookup`), which runs at once.
#[test]
fn a_policy_gates_destructive_mcp_tools_by_their_annotations() {
    let bin = flow_adapters::testkit::bin_path();
    let db = TestDb::new(Backend::Sqlite);
    db.write(
        "flow.toml",
        "[[policy.approvals]]\nmatch = { mcp_destructive = true }\nrequire = { roles = [\"operator\"] }\n",
    );
    let text = format!(
        r#"name: mcp-policy
tools:
  lookup: {{ kind: mcp, server: {{ command: ["{bin}", "mcp-stdio"] }}, tool: lookup }}
  delete: {{ kind: mcp, server: {{ command: ["{bin}", "mcp-stdio"] }}, tool: delete_thing }}
  echo: {{ kind: mcp, server: {{ command: ["{bin}", "mcp-stdio"] }}, tool: echo }}
nodes:
  find: {{ tool: lookup, with: {{ id: "42" }} }}
  remove: {{ tool: delete, needs: [find], with: {{ id: "42" }} }}
  say: {{ tool: echo, needs: [find], with: {{ text: hi }} }}
"#,
        bin = bin.display()
    );
    let file = db.write("mcp.yaml", &text);
    let validated = output(
        db.flow()
            .args(["--config", "flow.toml", "validate"])
            .arg(&file),
    );
    assert!(
        stdout(&validated).contains("node `remove` may need approval"),
        "annotations are known at call time: {}",
        stdout(&validated)
    );
    let paused = output(db.flow().arg("run").arg(&file));
    assert_eq!(paused.status.code(), Some(3), "{}", stderr(&paused));
    let run = run_id(&paused);
    let s = show(&db, &run);
    let mut gated: Vec<&str> = s["approvals"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["node"].as_str()).collect())
        .unwrap_or_default();
    gated.sort_unstable();
    assert_eq!(gated, ["remove", "say"], "{s}");
    let find = s["steps"]
        .as_array()
        .and_then(|a| a.iter().find(|st| st["node"] == "find"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(find["status"], "succeeded", "the read-only tool ran: {s}");
    for node in ["remove", "say"] {
        let ok = output(db.flow().args(["approve", &run, node, "--by", "otto"]));
        assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    }
    let done = output(db.flow().args(["resume", &run]));
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
}

/// `flow approvals|approve|deny --server`: the token decides (a viewer lists but is
/// refused a decision, exit 2), `--input` pairs are typed by the declaration read from
/// the server, and the local database is never opened.
#[test]
fn the_cli_decides_through_a_server() {
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("refund.yaml", &workflow(&down.url(), NEEDS_REASON));
    let paused = output(db.flow().arg("run").arg(&file));
    assert_eq!(paused.status.code(), Some(3), "{}", stderr(&paused));
    let run = run_id(&paused);
    let server = serve(&db);
    let empty = tempfile::tempdir().expect("tempdir");
    let client =
        |token, args: &[&str]| crate::client::client(empty.path(), &server.base, Some(token), args);

    let listed = client(VIEWER, &["approvals", "--json"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    let items: Value = serde_json::from_str(&stdout(&listed)).expect("json");
    assert_eq!(items[0]["node"], "refund", "{items}");
    let refused = client(VIEWER, &["deny", &run, "refund", "--reason", "no"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let bad = client(OPERATOR, &["approve", &run, "refund", "--input", "nope=1"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    let ok = client(
        OPERATOR,
        &["approve", &run, "refund", "--input", "reason=dup"],
    );
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    assert_eq!(stdout(&ok).trim(), format!("{run} refund approved"));
    let a = approval(&show(&db, &run)).clone();
    assert_eq!(a["decided_by"], "otto", "{a}");
    assert_eq!(a["decision_inputs"], json!({ "reason": "dup" }), "{a}");
    assert_eq!(
        down.total(),
        0,
        "deciding sends nothing; the run's next holder does"
    );
}
