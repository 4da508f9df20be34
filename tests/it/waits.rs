//! Waits through the real binary, on both backends: `wait:` nodes complete from a
//! published event (lookback, an event id published twice completes one wait once),
//! `callback:` nodes complete from a POST to the URL they handed their downstream (a
//! token used twice is 404, a callback that comes back before the call's response is
//! kept, the token is in nothing flow stores), and a wait's timeout is taken once by
//! another daemon after the first is SIGKILLed.

use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::{Behavior, CountingServer};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::{OPERATOR, TOKENS, VIEWER, call};
use crate::support::{Backend, TestDb, backends, output, run_id, runtime, show, stderr, stdout};

/// `delivered` waits for `shipment.delivered` of this order; `after` reads its output.
const EVENT_WAIT: &str = r#"name: delivery
inputs:
  order_id: { type: integer, required: true }
tools:
  echo: { kind: function, function: core.echo }
nodes:
  delivered:
    wait:
      event: { name: shipment.delivered, match: "${{ event.order == inputs.order_id }}", lookback: 1h }
      timeout: 1h
  after:
    needs: [delivered]
    tool: echo
    with: { got: "${{ nodes.delivered.output.order }}" }
"#;

/// How many events of type `t` run `run` has in the outbox.
fn events(db: &TestDb, run: &str, t: &str) -> usize {
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

fn publish(db: &TestDb, data: &str, id: &str) -> String {
    let out = output(db.flow().args([
        "publish",
        "shipment.delivered",
        "--data",
        data,
        "--id",
        id,
        "--by",
        "carrier",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn an_event_wait_matches_from_its_lookback_and_an_event_id_completes_it_once() {
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let db = TestDb::new(backend);
        let file = db.write("wait.yaml", EVENT_WAIT);
        // Published before the run began: matched through the lookback; another
        // order's event is not.
        publish(&db, r#"{"order": 5}"#, "e0");
        publish(&db, r#"{"order": 117}"#, "e1");
        let out = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .args(["--input", "order_id=117"]),
        );
        assert_eq!(out.status.code(), Some(0), "{ctx}: {}", stderr(&out));
        let run = run_id(&out);
        let s = show(&db, &run);
        assert_eq!(s["waits"][0]["event_id"], "e1", "{ctx}: {s}");
        assert!(stdout(&out).contains("117"), "{ctx}: {}", stdout(&out));

        // Nothing matches yet: the run pauses (exit 3), nothing is lost.
        let out = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .args(["--input", "order_id=118"]),
        );
        assert_eq!(out.status.code(), Some(3), "{ctx}: {}", stderr(&out));
        let run = run_id(&out);
        assert!(
            stderr(&out).contains("waiting: delivered"),
            "{ctx}: {}",
            stderr(&out)
        );
        let text = stdout(&output(db.flow().args(["show", &run])));
        assert!(
            text.contains("Waits:") && text.contains("pending"),
            "{ctx}: {text}"
        );
        // The same event id twice: one event, one completion.
        let first = publish(&db, r#"{"order": 118}"#, "e2");
        assert!(
            first.contains("1 waiting run(s) signalled"),
            "{ctx}: {first}"
        );
        let again = publish(&db, r#"{"order": 118}"#, "e2");
        assert!(again.contains("already published"), "{ctx}: {again}");
        let s = show(&db, &run);
        assert_eq!(
            s["run"]["status"], "queued",
            "{ctx}: a publish re-queues it: {s}"
        );
        let out = output(db.flow().args(["resume", &run]));
        assert_eq!(out.status.code(), Some(0), "{ctx}: {}", stderr(&out));
        let s = show(&db, &run);
        assert_eq!(s["waits"][0]["status"], "completed", "{ctx}: {s}");
        assert_eq!(s["waits"][0]["event_id"], "e2", "{ctx}: {s}");
        assert_eq!(events(&db, &run, "wait.completed"), 1, "{ctx}: once");
        let out = output(db.flow().args(["resume", &run]));
        assert_eq!(
            events(&db, &run, "wait.completed"),
            1,
            "{ctx}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn wait_and_callback_mistakes_are_refused_before_anything_runs() {
    let db = TestDb::new(Backend::Sqlite);
    let cases = [
        (
            "event.yaml",
            "tools: { e: { kind: function, function: core.echo } }\nnodes:\n  a: { tool: e, with: { x: \"${{ event.order }}\" } }\n",
            "only a `wait:` node's `match` can see",
        ),
        (
            "cb.yaml",
            "tools: { e: { kind: function, function: core.echo } }\nnodes:\n  a: { tool: e, with: { x: \"${{ callback.url }}\" } }\n",
            "only the `with` of a node with `callback:`",
        ),
        (
            "notimeout.yaml",
            "nodes:\n  a: { wait: { event: { name: x } } }\n",
            "`wait` has no `timeout`",
        ),
        (
            "tool.yaml",
            "tools: { e: { kind: function, function: core.echo } }\nnodes:\n  a: { tool: e, wait: { event: { name: x }, timeout: 1h } }\n",
            "unknown key `tool`",
        ),
    ];
    for (name, text, expected) in cases {
        let file = db.write(name, text);
        let out = output(db.flow().arg("validate").arg(&file));
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(expected), "{name}: {}", stderr(&out));
    }
    // A callback node without `[api] public_url`: refused at `flow run`, nothing written.
    let file = db.write(
        "nourl.yaml",
        "tools: { w: { kind: http, method: POST, url: \"http://127.0.0.1:9/x\" } }\nnodes:\n  a: { tool: w, with: { u: \"${{ callback.url }}\" }, callback: { timeout: 1h } }\n",
    );
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("public_url"), "{}", stderr(&out));
    crate::support::no_runs(&db);
    let config = db.write("empty.toml", "[egress]\n");
    let out = output(
        db.flow()
            .arg("validate")
            .arg("--config")
            .arg(&config)
            .arg(&file),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("`[api]`"), "{}", stderr(&out));
    let config = db.write(
        "url.toml",
        "[api]\npublic_url = \"https://flow.example.com\"\n",
    );
    let out = output(
        db.flow()
            .arg("validate")
            .arg("--config")
            .arg(&config)
            .arg(&file),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// `flow serve` on a port known beforehand (its URL is `[api] public_url`), with the
/// test tokens, and a daemon on the same `flow.toml`.
fn serve_with_public_url(db: &TestDb) -> (crate::api::Server, Child) {
    let addr: SocketAddr = crate::daemon::free_port();
    db.write(
        "flow.toml",
        &format!("[api]\npublic_url = \"http://{addr}\"\n{TOKENS}"),
    );
    let mut cmd = db.flow();
    cmd.args(["serve", "--addr", &addr.to_string()])
        .env("FLOW_SECRET_VIEWER_TOKEN", VIEWER)
        .env("FLOW_SECRET_OPERATOR_TOKEN", OPERATOR)
        .env("FLOW_SECRET_ADMIN_TOKEN", crate::api::ADMIN);
    let server = crate::api::start(cmd, "listening on ");
    let daemon = db
        .flow()
        .args(["daemon", "--poll-interval", "50ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("daemon");
    (server, daemon)
}

/// `fulfil` POSTs the order with its callback URL to the warehouse (which answers at
/// once) and waits for the callback; `after` reads the callback's output.
fn callback_workflow(url: &str) -> String {
    format!(
        r#"name: fulfil
tools:
  warehouse: {{ kind: http, method: POST, url: "{url}/orders", timeout: 10s }}
  echo: {{ kind: function, function: core.echo }}
nodes:
  fulfil:
    tool: warehouse
    with: {{ order: A-17, notify_url: "${{{{ callback.url }}}}" }}
    callback: {{ timeout: 1h, heartbeat: 30m }}
  after:
    needs: [fulfil]
    tool: echo
    with: {{ tracking: "${{{{ nodes.fulfil.output.tracking }}}}" }}
"#
    )
}

async fn submit(server: &crate::api::Server, text: &str) -> String {
    let body = json!({ "workflow": text });
    let (st, body) = call(server, "POST", "/api/v1/runs", Some(OPERATOR), Some(body)).await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    body["id"].as_str().expect("id").to_owned()
}

/// The callback URL the warehouse received in its `n`th request (waits for it).
async fn notify_url(down: &CountingServer, n: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = down.log();
        if let Some(r) = log.get(n) {
            return r.body["notify_url"]
                .as_str()
                .expect("notify_url")
                .to_owned();
        }
        assert!(Instant::now() < deadline, "the warehouse got no request");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn post(url: &str, body: Value) -> (StatusCode, Value) {
    let resp = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("callback");
    let st = resp.status();
    (st, resp.json().await.unwrap_or(Value::Null))
}

async fn wait_status(db: &TestDb, run: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = show(db, run);
        if s["run"]["status"] == status {
            return s;
        }
        assert!(Instant::now() < deadline, "run never became {status}: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn a_callback_completes_its_node_once_and_its_token_is_never_stored() {
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let rt = runtime();
        let down = rt.block_on(CountingServer::start()).expect("downstream");
        let db = TestDb::new(backend);
        let (server, mut daemon) = serve_with_public_url(&db);
        let (run, token) = rt.block_on(async {
            let run = submit(&server, &callback_workflow(&down.url())).await;
            let url = notify_url(&down, 0).await;
            assert!(url.starts_with(&server.base), "{ctx}: {url}");
            let token = url.rsplit('/').next().expect("token").to_owned();
            wait_status(&db, &run, "paused").await;
            let shown = serde_json::to_string(&show(&db, &run)).expect("json");
            assert!(
                !shown.contains(&token),
                "{ctx}: the token is stored: {shown}"
            );

            let (st, _) = post(&format!("{url}/heartbeat"), json!({})).await;
            assert_eq!(st, StatusCode::OK, "{ctx}: heartbeat");
            // A failure without a reason is refused, and the token stays usable.
            let (st, body) = post(&url, json!({ "ok": false })).await;
            assert_eq!(st, StatusCode::BAD_REQUEST, "{ctx}: {body}");
            assert!(body.to_string().contains("needs `error`"), "{ctx}: {body}");
            let done = json!({ "ok": true, "output": { "tracking": "TRK-9" } });
            let (st, body) = post(&url, done.clone()).await;
            assert_eq!(st, StatusCode::OK, "{ctx}: {body}");
            assert_eq!(body["status"], "completed", "{ctx}: {body}");
            let (st, _) = post(&url, done.clone()).await;
            assert_eq!(st, StatusCode::NOT_FOUND, "{ctx}: a used token is 404");
            let (st, _) = post(&format!("{url}/heartbeat"), json!({})).await;
            assert_eq!(
                st,
                StatusCode::NOT_FOUND,
                "{ctx}: and so are its heartbeats"
            );
            let forged = format!("{}/api/v1/callbacks/not-a-token", server.base);
            let (st, _) = post(&forged, done).await;
            assert_eq!(st, StatusCode::NOT_FOUND, "{ctx}: an unknown token is 404");

            let s = wait_status(&db, &run, "succeeded").await;
            let after = s["tool_calls"]
                .as_array()
                .and_then(|a| a.iter().find(|c| c["tool_call_id"] == "after"))
                .cloned()
                .unwrap_or_default();
            assert!(after.to_string().contains("TRK-9"), "{ctx}: {after}");
            assert_eq!(
                down.count(&format!("{run}:fulfil:1")),
                1,
                "{ctx}: sent once"
            );
            let (st, list) =
                call(&server, "GET", "/api/v1/waits?all=true", Some(VIEWER), None).await;
            assert_eq!(st, StatusCode::OK, "{ctx}: {list}");
            assert_eq!(list["items"][0]["status"], "completed", "{ctx}: {list}");
            (run, token)
        });
        assert_eq!(events(&db, &run, "wait.completed"), 1, "{ctx}");
        // Nor anywhere in the ledger's bytes (the files, or a pg_dump): only its hash.
        let bytes = crate::connections::ledger_bytes(&db);
        crate::connections::assert_no_token("the ledger", &bytes, &[token]);
        let _ = daemon.kill();
        let _ = daemon.wait();
    }
}

/// The warehouse calls back while flow still waits for its response (the request is
/// held): the callback is kept, and applied once the response is recorded.
#[test]
fn a_callback_that_comes_back_before_the_response_is_kept() {
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let rt = runtime();
        let down = rt.block_on(CountingServer::start()).expect("downstream");
        down.set("/orders", Behavior::HoldUntilReleased);
        let db = TestDb::new(backend);
        let (server, mut daemon) = serve_with_public_url(&db);
        rt.block_on(async {
            let run = submit(&server, &callback_workflow(&down.url())).await;
            let url = notify_url(&down, 0).await;
            let early = json!({ "ok": true, "output": { "tracking": "EARLY-1" } });
            let (st, body) = post(&url, early).await;
            assert_eq!(st, StatusCode::OK, "{ctx}: {body}");
            let s = show(&db, &run);
            assert_eq!(
                s["run"]["status"], "running",
                "{ctx}: the call is in flight: {s}"
            );
            down.release();
            let s = wait_status(&db, &run, "succeeded").await;
            assert!(s.to_string().contains("EARLY-1"), "{ctx}: {s}");
            assert_eq!(
                down.count(&format!("{run}:fulfil:1")),
                1,
                "{ctx}: sent once"
            );
        });
        let _ = daemon.kill();
        let _ = daemon.wait();
    }
}

/// An 8 s wait whose daemon is SIGKILLed while it waits (8 s: long enough that the first
/// daemon is killed before the deadline however loaded the machine): another daemon
/// times it out, once; the node fails, and no second timer fires later.
#[test]
fn a_wait_timeout_is_taken_once_by_another_daemon() {
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let rt = runtime();
        let db = TestDb::new(backend);
        let file = db.write(
            "wait.yaml",
            &EVENT_WAIT.replace("timeout: 1h", "timeout: 8s"),
        );
        let metrics = crate::daemon::free_port();
        let daemon = |extra: &[&str]| {
            db.flow()
                .args(["daemon", "--poll-interval", "50ms"])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("daemon")
        };
        let mut first = daemon(&["--metrics-addr", &metrics.to_string()]);
        let submitted = output(
            db.flow()
                .arg("submit")
                .arg(&file)
                .args(["--input", "order_id=1"]),
        );
        assert_eq!(
            submitted.status.code(),
            Some(0),
            "{ctx}: {}",
            stderr(&submitted)
        );
        let run = stdout(&submitted).trim().to_owned();
        rt.block_on(wait_status(&db, &run, "paused"));
        let (code, body) = crate::daemon::http_get(metrics, "/metrics").expect("metrics");
        assert_eq!(code, 200, "{ctx}");
        assert!(body.contains("flow_waits_pending 1"), "{ctx}: {body}");
        let _ = first.kill();
        let _ = first.wait();
        let mut second = daemon(&[]);
        let s = rt.block_on(wait_status(&db, &run, "failed"));
        std::thread::sleep(Duration::from_secs(3));
        let _ = second.kill();
        let _ = second.wait();
        let s2 = show(&db, &run);
        assert_eq!(s2["run"]["status"], "failed", "{ctx}: {s}");
        assert_eq!(s2["waits"][0]["status"], "timed_out", "{ctx}: {s2}");
        assert_eq!(events(&db, &run, "wait.timed_out"), 1, "{ctx}: once");
        // A late event changes nothing.
        publish(&db, r#"{"order": 1}"#, "late");
        assert_eq!(show(&db, &run)["run"]["status"], "failed", "{ctx}");
    }
}

/// A callback node's call goes in doubt (the warehouse answers after the timeout); an
/// operator resolves it as succeeded: the node still waits for its callback (the
/// resolution settles the call, not the work), and completes with the callback's output.
#[test]
fn a_resolved_in_doubt_callback_call_still_waits_for_its_callback() {
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let rt = runtime();
        let down = rt.block_on(CountingServer::start()).expect("downstream");
        down.set("/orders", Behavior::hold(Duration::from_secs(3)));
        let db = TestDb::new(backend);
        let (server, mut daemon) = serve_with_public_url(&db);
        let text = callback_workflow(&down.url()).replace("timeout: 10s", "timeout: 1s");
        rt.block_on(async {
            let run = submit(&server, &text).await;
            let url = notify_url(&down, 0).await;
            let s = wait_status(&db, &run, "paused").await;
            assert_eq!(s["tool_calls"][0]["status"], "in_doubt", "{ctx}: {s}");
            let body =
                json!({ "node": "fulfil", "outcome": "succeeded", "output": { "accepted": true } });
            let path = format!("/api/v1/runs/{run}/resolve");
            let (st, body) = call(&server, "POST", &path, Some(OPERATOR), Some(body)).await;
            assert_eq!(st, StatusCode::OK, "{ctx}: {body}");
            // Back on the queue, replayed, and waiting for the callback again.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let s = show(&db, &run);
                if s["run"]["status"] == "paused" && s["tool_calls"][0]["status"] == "succeeded" {
                    assert_eq!(s["waits"][0]["status"], "pending", "{ctx}: {s}");
                    break;
                }
                assert!(Instant::now() < deadline, "{ctx}: never waited again: {s}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let done = json!({ "ok": true, "output": { "tracking": "TRK-R" } });
            let (st, body) = post(&url, done).await;
            assert_eq!(st, StatusCode::OK, "{ctx}: {body}");
            let s = wait_status(&db, &run, "succeeded").await;
            assert!(s.to_string().contains("TRK-R"), "{ctx}: {s}");
            assert_eq!(
                down.count(&format!("{run}:fulfil:1")),
                1,
                "{ctx}: sent once"
            );
        });
        let _ = daemon.kill();
        let _ = daemon.wait();
    }
}
