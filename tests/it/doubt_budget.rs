//! The guarantee breaks of round 2, tried as a hostile operator would, on both backends
//! with the real binary and a downstream that counts effects per Idempotency-Key:
//! - a status endpoint that lags its effect endpoint (`not_found` for ever) while the
//!   effect endpoint times out: re-sends are bounded by `reconcile.max_resends`, counted
//!   in the ledger across `flow run`, `flow resume` and `flow reconcile`;
//! - a cancelled run's call in doubt stays settleable (succeeded or failed, never
//!   retry), probe-able, counted alike by the inbox, the gauge and bulk dry runs;
//! - settling a paused run's last doubt re-queues it, so a daemon finishes it.

use std::time::Duration;

use flow_adapters::testkit::http::{Behavior, CountingServer};
use reqwest::StatusCode;
use serde_json::{Value as Json, json};

use crate::api::{ADMIN, VIEWER, call as api, serve};
use crate::api_doubt::paused_run;
use crate::reconcile::{crash_at, effects, probes};
use crate::support::{Backend, TestDb, backends, call, output, run_id, runtime, show, stderr};

/// The pay workflow whose effect endpoint `url/pay` and probe `probe/<key>` are given,
/// with `after` and `max_resends` (`None`: the default).
fn workflow(url: &str, probe: &str, after: &str, max_resends: Option<u32>) -> String {
    let budget = max_resends.map_or(String::new(), |n| format!("\n      max_resends: {n}"));
    format!(
        r#"name: pay
tools:
  echo: {{ kind: function, function: core.echo }}
  pay:
    kind: http
    method: POST
    url: "{url}/pay"
    timeout: 400ms
    reconcile:
      request: {{ method: GET, url: "{probe}/${{{{ call.key }}}}" }}
      found: "${{{{ response.status == 200 }}}}"
      not_found: "${{{{ response.status == 404 }}}}"
      after: {after}
      max_probes: 2
      interval: 100ms{budget}
nodes:
  prepare: {{ tool: echo, with: {{ amount: 10 }} }}
  charge:
    needs: [prepare]
    tool: pay
    with: {{ amount: "${{{{ nodes.prepare.output.amount }}}}" }}
    retry_policy: {{ max_retries: 0 }}
"#
    )
}

fn decisions(s: &Json) -> Vec<String> {
    probes(s, "charge")
        .iter()
        .filter_map(|p| p["decision"].as_str().map(str::to_owned))
        .collect()
}

fn millis(v: &Json) -> i64 {
    v.as_str()
        .and_then(|t| humantime::parse_rfc3339(t).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0))
}

/// The effect endpoint holds every request past the timeout (each send is in doubt) and
/// the status endpoint says `not_found` for ever (it lags). Before: 30 POSTs of one key
/// in 30 s and `flow run` never exited. Now: the original and one re-send, then a human.
fn lagging_status(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    server.set("/pay", Behavior::hold(Duration::from_secs(2)));
    let lagging = rt.block_on(CountingServer::start()).expect("probe server");
    lagging.set("*", Behavior::status(404));
    let db = TestDb::new(backend);
    let file = db.write(
        "pay.yaml",
        &workflow(
            &server.url(),
            &format!("{}/effects", lagging.url()),
            "1s",
            None,
        ),
    );
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(
        out.status.code(),
        Some(3),
        "{ctx}: paused: {}",
        stderr(&out)
    );
    let run = run_id(&out);
    let key = format!("{run}:charge:1");
    assert_eq!(server.count(&key), 2, "{ctx}: the original and ONE re-send");
    let s = show(&db, &run);
    assert_eq!(call(&s, "charge")["status"], "in_doubt", "{ctx}");
    // `after` is measured from the latest send: the not_found right after the re-send
    // is not trusted yet (probe_again), the one a second later is — and the budget is
    // spent, so a human decides.
    assert_eq!(
        decisions(&s),
        ["probe_again", "resend", "probe_again", "needs_operator"],
        "{ctx}: {s}"
    );
    let p = probes(&s, "charge");
    let resent_at = millis(&call(&s, "charge")["outbound_started_at"]);
    assert!(
        millis(&p[3]["at"]) >= resent_at + 1_000,
        "{ctx}: trusted only `after` the latest send: {p:?}"
    );
    assert!(
        p[3]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("max_resends")),
        "{ctx}: {p:?}"
    );
    assert!(
        s["audit"]
            .as_array()
            .is_some_and(|a| a.iter().any(|e| e["event"] == "tool_call.needs_operator")),
        "{ctx}: {s}"
    );
    // Another process, and an operator's forced probe: the budget is the ledger's.
    let again = output(db.flow().args(["resume", &run]));
    assert_eq!(again.status.code(), Some(3), "{ctx}: {}", stderr(&again));
    let forced = output(db.flow().args(["reconcile", "--run", &run]));
    assert_eq!(forced.status.code(), Some(0), "{ctx}: {}", stderr(&forced));
    assert_eq!(server.count(&key), 2, "{ctx}: never a third send");
    let s = show(&db, &run);
    assert_eq!(
        decisions(&s).last().map(String::as_str),
        Some("needs_operator"),
        "{ctx}"
    );
}

#[test]
fn a_lagging_status_endpoint_gets_one_resend_not_thirty() {
    for b in backends() {
        lagging_status(b);
    }
}

/// `max_resends: 0`: a trusted not_found re-sends nothing; a human decides at once.
#[test]
fn a_budget_of_zero_never_resends() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write(
        "pay.yaml",
        &workflow(&server.url(), &effects(&server), "0s", Some(0)),
    );
    let (run, key) = crash_at(&db, &file, "after_outbound");
    let out = output(db.flow().args(["resume", &run]));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(
        server.count(&key),
        0,
        "nothing was ever sent, nothing re-sent"
    );
    assert_eq!(decisions(&show(&db, &run)), ["needs_operator"]);
}

/// A crash after the request left: `flow show` says the count is unknown rather than 0,
/// in text and JSON.
fn uncounted_send(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(backend);
    let file = db.write("pay.yaml", &crate::crash::workflow(&server.url()));
    // Killed after the response arrived, then found in doubt by the resume.
    let run = paused_run(&db, &file);
    let c = call(&show(&db, &run), "charge").clone();
    assert_eq!(c["outbound_requests"], json!(null), "{ctx}: {c}");
    assert_eq!(c["outbound_requests_known"], json!(0), "{ctx}: {c}");
    assert_eq!(c["uncounted_sends"], json!(1), "{ctx}: {c}");
    let text = output(db.flow().args(["show", &run]));
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(
        text.contains("requests sent 0 known + 1 send unknown (at least 1 may have left)"),
        "{ctx}: {text}"
    );
    let charge = text
        .lines()
        .find(|l| l.contains("tool pay"))
        .unwrap_or_default();
    assert!(!charge.contains("requests sent 0  key"), "{ctx}: {text}");
}

#[test]
fn an_in_doubt_call_never_says_zero_requests_sent() {
    for b in backends() {
        uncounted_send(b);
    }
}

/// Cancel a paused run whose charge is in doubt: `flow cancel` says so; the inbox, the
/// gauge and a bulk dry run count the call alike; `retry` is refused with a reason and
/// writes nothing; `succeeded` is recorded, audited, and the run stays cancelled.
fn cancelled_doubt(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(backend);
    let file = db.write("pay.yaml", &crate::crash::workflow(&server.url()));
    let runs: Vec<String> = (0..2).map(|_| paused_run(&db, &file)).collect();
    for run in &runs {
        let cancel = output(db.flow().args(["cancel", run]));
        assert_eq!(cancel.status.code(), Some(0), "{ctx}: {}", stderr(&cancel));
        assert!(
            stderr(&cancel).contains("`charge`") && stderr(&cancel).contains("still in doubt"),
            "{ctx}: flow cancel says what it leaves in doubt: {}",
            stderr(&cancel)
        );
    }
    let served = serve(&db);
    rt.block_on(async {
        let (code, inbox) = api(&served, "GET", "/api/v1/in-doubt", Some(VIEWER), None).await;
        assert_eq!(code, StatusCode::OK, "{ctx}: {inbox}");
        assert_eq!(
            inbox["calls"].as_array().map(Vec::len),
            Some(2),
            "{ctx}: {inbox}"
        );
        let dry = json!({"outcome": "retry", "dry_run": true});
        let (code, d) = api(
            &served,
            "POST",
            "/api/v1/in-doubt:resolve",
            Some(ADMIN),
            Some(dry),
        )
        .await;
        assert_eq!(code, StatusCode::OK, "{ctx}: {d}");
        assert_eq!(
            (&d["matched"], &d["would_settle"]),
            (&json!(2), &json!(0)),
            "{ctx}: {d}"
        );
        assert_eq!(
            d["would_skip"].as_array().map(Vec::len),
            Some(2),
            "{ctx}: {d}"
        );
        let real = json!({"outcome": "retry", "dry_run": false});
        let (code, done) = api(
            &served,
            "POST",
            "/api/v1/in-doubt:resolve",
            Some(ADMIN),
            Some(real),
        )
        .await;
        assert_eq!(code, StatusCode::OK, "{ctx}: {done}");
        assert_eq!(
            done["settled"],
            json!(0),
            "{ctx}: the real one does what the dry run said: {done}"
        );
        let metrics = reqwest::Client::new()
            .get(format!("{}/metrics", served.base))
            .bearer_auth(VIEWER)
            .send()
            .await
            .expect("metrics");
        let text = metrics.text().await.unwrap_or_default();
        let gauge = text
            .lines()
            .find(|l| l.starts_with("flow_tool_calls_in_doubt"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok());
        assert_eq!(gauge, Some(2.0), "{ctx}: the gauge counts the same: {text}");
    });
    drop(served);
    let run = &runs[0];
    let retry = output(db.flow().args(["resume", run, "--resolve", "charge=retry"]));
    assert_eq!(retry.status.code(), Some(2), "{ctx}: {}", stderr(&retry));
    assert!(
        stderr(&retry).contains("succeeded"),
        "{ctx}: says what is left: {}",
        stderr(&retry)
    );
    assert_eq!(
        call(&show(&db, run), "charge")["status"],
        "in_doubt",
        "{ctx}: nothing written"
    );
    let settled = output(db.flow().args([
        "resume",
        run,
        "--resolve",
        "charge=succeeded",
        "--output",
        r#"{"count": 1}"#,
    ]));
    assert_eq!(
        settled.status.code(),
        Some(4),
        "{ctx}: recorded; the run stays cancelled: {}",
        stderr(&settled)
    );
    let s = show(&db, run);
    assert_eq!(call(&s, "charge")["status"], "succeeded", "{ctx}: {s}");
    assert_eq!(s["run"]["status"], "cancelled", "{ctx}");
    assert!(
        s["audit"]
            .as_array()
            .is_some_and(|a| a.iter().any(|e| e["event"] == "tool_call.resolved")),
        "{ctx}: {s}"
    );
    assert_eq!(server.total(), 2, "{ctx}: nothing was ever re-sent");
}

#[test]
fn a_cancelled_runs_doubt_stays_settleable_and_is_counted_alike() {
    for b in backends() {
        cancelled_doubt(b);
    }
}

/// A cancelled run's call in doubt is probed by `flow reconcile`: found is recorded as
/// succeeded; nothing is re-sent for a finished run.
fn cancelled_probe(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let down = rt.block_on(CountingServer::start()).expect("probe server");
    down.set("*", Behavior::status(500));
    let db = TestDb::new(backend);
    let file = db.write(
        "pay.yaml",
        &workflow(
            &server.url(),
            &format!("{}/effects", down.url()),
            "0s",
            None,
        ),
    );
    let (run, key) = crash_at(&db, &file, "after_response");
    let out = output(db.flow().args(["resume", &run]));
    assert_eq!(
        out.status.code(),
        Some(3),
        "{ctx}: probes unanswered: {}",
        stderr(&out)
    );
    let cancel = output(db.flow().args(["cancel", &run]));
    assert_eq!(cancel.status.code(), Some(0), "{ctx}: {}", stderr(&cancel));
    // The probe server is back and says: not found. For a cancelled run that re-sends
    // nothing; it stays for a human.
    down.set("*", Behavior::status(404));
    let r = output(db.flow().args(["reconcile", "--run", &run]));
    assert_eq!(r.status.code(), Some(0), "{ctx}: {}", stderr(&r));
    assert_eq!(
        server.count(&key),
        1,
        "{ctx}: never re-sent for a cancelled run"
    );
    let s = show(&db, &run);
    assert_eq!(call(&s, "charge")["status"], "in_doubt", "{ctx}");
    assert_eq!(
        decisions(&s).last().map(String::as_str),
        Some("needs_operator"),
        "{ctx}"
    );
    // Now it says found: recorded as succeeded.
    down.set("*", Behavior::status(200));
    let r = output(db.flow().args(["reconcile", "--run", &run]));
    assert_eq!(r.status.code(), Some(0), "{ctx}: {}", stderr(&r));
    let s = show(&db, &run);
    assert_eq!(call(&s, "charge")["status"], "succeeded", "{ctx}: {s}");
    assert_eq!(s["run"]["status"], "cancelled", "{ctx}");
    assert_eq!(server.count(&key), 1, "{ctx}");
}

#[test]
fn reconcile_probes_a_cancelled_runs_call_and_never_resends() {
    for b in backends() {
        cancelled_probe(b);
    }
}

/// `flow reconcile` settles a paused run's last doubt beside a daemon: the run is
/// re-queued in the same transaction, and the daemon finishes it (before: it stayed
/// paused, "tool call in doubt" with nothing in doubt, until a hand-run resume).
fn settled_requeues(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let down = rt.block_on(CountingServer::start()).expect("probe server");
    down.set("*", Behavior::status(500));
    let db = TestDb::new(backend);
    let file = db.write(
        "pay.yaml",
        &workflow(
            &server.url(),
            &format!("{}/effects", down.url()),
            "0s",
            None,
        ),
    );
    let (run, key) = crash_at(&db, &file, "after_outbound");
    let out = output(db.flow().args(["resume", &run]));
    assert_eq!(out.status.code(), Some(3), "{ctx}: {}", stderr(&out));
    down.set("*", Behavior::status(404));
    let r = output(db.flow().args(["reconcile", "--run", &run]));
    assert_eq!(r.status.code(), Some(0), "{ctx}: {}", stderr(&r));
    assert_eq!(
        show(&db, &run)["run"]["status"],
        "queued",
        "{ctx}: back on the queue"
    );
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
    let s = show(&db, &run);
    assert_eq!(s["run"]["status"], "succeeded", "{ctx}: {s}");
    assert_eq!(server.count(&key), 1, "{ctx}: sent once, by the daemon");
}

#[test]
fn settling_the_last_doubt_requeues_the_run_for_the_daemons() {
    for b in backends() {
        settled_requeues(b);
    }
}

/// A run killed while its charge was outbound, then cancelled before anyone resumed it:
/// the send is in doubt (not left `outbound` for ever, in no inbox and no gauge), and
/// `flow cancel` says so.
fn cancelled_while_outbound(backend: Backend) {
    let ctx = format!("{backend:?}");
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(backend);
    let file = db.write("pay.yaml", &crate::crash::workflow(&server.url()));
    let (run, _) = crash_at(&db, &file, "after_response");
    let cancel = output(db.flow().args(["cancel", &run]));
    assert_eq!(cancel.status.code(), Some(0), "{ctx}: {}", stderr(&cancel));
    assert!(
        stderr(&cancel).contains("`charge`") && stderr(&cancel).contains("still in doubt"),
        "{ctx}: {}",
        stderr(&cancel)
    );
    let s = show(&db, &run);
    assert_eq!(s["run"]["status"], "cancelled", "{ctx}");
    let c = call(&s, "charge");
    assert_eq!(c["status"], "in_doubt", "{ctx}: {s}");
    assert_eq!(c["uncounted_sends"], json!(1), "{ctx}: {c}");
    assert_eq!(server.total(), 1, "{ctx}");
}

#[test]
fn cancelling_a_crashed_run_puts_its_outbound_call_in_doubt() {
    for b in backends() {
        cancelled_while_outbound(b);
    }
}
