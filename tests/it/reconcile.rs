//! Reconciliation through the real binary, on both backends: a downstream that records
//! effects per Idempotency-Key and answers the probe `GET /_control/effects/{key}` (200
//! when requests with the key arrived, 404 when none did). Every case checks the effect
//! count at the downstream, the probe rows and the call's resolution.

use std::time::Duration;

use flow_adapters::testkit::http::{Behavior, CountingServer};
use serde_json::Value as Json;

use crate::support::{
    Backend, TestDb, backends, call, output, repo, run_id, runtime, show, stderr, stdout,
};

/// A pay workflow whose side effect declares a probe under `probe` (`<base>/_control/effects`:
/// the downstream's effect record), trusting not_found `after` the request left.
pub(crate) fn workflow(url: &str, probe: &str, after: &str, max_probes: u32) -> String {
    workflow_every(url, probe, after, max_probes, "100ms")
}

/// [`workflow`] with probes `interval` apart.
fn workflow_every(url: &str, probe: &str, after: &str, max_probes: u32, interval: &str) -> String {
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
      max_probes: {max_probes}
      interval: {interval}
nodes:
  prepare: {{ tool: echo, with: {{ amount: 10 }} }}
  charge:
    needs: [prepare]
    tool: pay
    with: {{ amount: "${{{{ nodes.prepare.output.amount }}}}" }}
  receipt:
    needs: [charge]
    tool: echo
    with: {{ paid: "${{{{ nodes.charge.output.count }}}}" }}
"#
    )
}

/// Runs `file` until `FLOW_FAULT=<point>:charge` kills it: the run and the key of the
/// charge's first effect attempt.
pub(crate) fn crash_at(db: &TestDb, file: &std::path::Path, point: &str) -> (String, String) {
    let crashed = output(
        db.flow()
            .arg("run")
            .arg(file)
            .env("FLOW_FAULT", format!("{point}:charge")),
    );
    assert_eq!(
        crashed.status.code(),
        None,
        "the fault must abort the process: {}",
        stderr(&crashed)
    );
    let run = run_id(&crashed);
    let key = format!("{run}:charge:1");
    (run, key)
}

/// A downstream, a probe server answering 500 to everything, and the pay workflow
/// probing it at most `max_probes` times, written into `db`'s directory.
fn failing_probe(
    rt: &tokio::runtime::Runtime,
    db: &TestDb,
    max_probes: u32,
) -> (CountingServer, CountingServer, std::path::PathBuf) {
    let server = rt.block_on(CountingServer::start()).expect("server");
    let probe = rt.block_on(CountingServer::start()).expect("probe server");
    probe.set("*", Behavior::status(500));
    let text = workflow(
        &server.url(),
        &format!("{}/effects", probe.url()),
        "0s",
        max_probes,
    );
    let file = db.write("pay.yaml", &text);
    (server, probe, file)
}

/// `flow resume RUN`, which must exit `code` (`ctx` names the case).
pub(crate) fn resume_expect(db: &TestDb, run: &str, code: i32, ctx: &str) -> std::process::Output {
    let out = output(db.flow().args(["resume", run]));
    assert_eq!(
        out.status.code(),
        Some(code),
        "{ctx}: resume of {run}\n{}",
        stderr(&out)
    );
    out
}

pub(crate) fn effects(server: &CountingServer) -> String {
    format!("{}/_control/effects", server.url())
}

pub(crate) fn probes<'a>(s: &'a Json, node: &str) -> Vec<&'a Json> {
    s["probes"]
        .as_array()
        .map(|a| a.iter().filter(|p| p["tool_call_id"] == node).collect())
        .unwrap_or_default()
}

/// The run's audited event types (probes and resolutions carry a `by`).
fn audited(s: &Json) -> Vec<String> {
    s["audit"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["event"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// A crash after the outbound mark: the request never left. `flow resume` probes, the
/// downstream has no such key, so the call is re-sent once with the same key.
fn not_sent_is_resent_once(backend: Backend) {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(backend);
    let file = db.write(
        "pay.yaml",
        &workflow(&server.url(), &effects(&server), "0s", 3),
    );
    let (run, key) = crash_at(&db, &file, "after_outbound");
    assert_eq!(
        server.count(&key),
        0,
        "{backend:?}: nothing left before the crash"
    );

    resume_expect(&db, &run, 0, &format!("{backend:?}"));
    assert_eq!(
        server.count(&key),
        1,
        "{backend:?}: re-sent exactly once, same key"
    );
    let s = show(&db, &run);
    assert_eq!(s["run"]["status"], "succeeded", "{backend:?}");
    let c = call(&s, "charge");
    assert_eq!(c["status"], "succeeded", "{backend:?}");
    assert_eq!(c["resolution"]["how"], "retry", "{backend:?}");
    assert_eq!(c["resolution"]["by"], "reconcile", "{backend:?}");
    let p = probes(&s, "charge");
    assert_eq!(p.len(), 1, "{backend:?}: {p:?}");
    assert_eq!(p[0]["observed"], "not_found", "{backend:?}");
    assert_eq!(p[0]["decision"], "resend", "{backend:?}");
    assert_eq!(p[0]["key"], key, "{backend:?}");
    assert_eq!(p[0]["http_status"], 404, "{backend:?}");
    assert!(
        audited(&s).contains(&"tool_call.probed".to_owned()),
        "{backend:?}: {s}"
    );
}

#[test]
fn after_outbound_probe_not_found_resends_once() {
    for b in backends() {
        not_sent_is_resent_once(b);
    }
}

/// A crash after the response: the effect took place. The probe finds it, the node
/// succeeds with the probe's output and nothing is re-sent.
fn happened_is_found(backend: Backend) {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(backend);
    let file = db.write(
        "pay.yaml",
        &workflow(&server.url(), &effects(&server), "0s", 3),
    );
    let (run, key) = crash_at(&db, &file, "after_response");
    assert_eq!(server.count(&key), 1, "{backend:?}");

    resume_expect(&db, &run, 0, &format!("{backend:?}"));
    assert_eq!(server.count(&key), 1, "{backend:?}: no re-send");
    let s = show(&db, &run);
    assert_eq!(s["run"]["status"], "succeeded", "{backend:?}");
    let c = call(&s, "charge");
    assert_eq!(c["resolution"]["how"], "succeeded", "{backend:?}");
    assert_eq!(c["resolution"]["by"], "reconcile", "{backend:?}");
    // The probe's answer body is the node's output: the receipt reads its count.
    assert_eq!(s["run"]["output"]["receipt"]["paid"], 1, "{backend:?}: {s}");
    let p = probes(&s, "charge");
    assert_eq!(p.len(), 1, "{backend:?}");
    assert_eq!(p[0]["observed"], "found", "{backend:?}");
    assert_eq!(p[0]["decision"], "succeed", "{backend:?}");
    assert_eq!(
        p[0]["response"]["body"]["key"], key,
        "{backend:?}: the answer is kept"
    );
}

#[test]
fn after_response_probe_found_succeeds_without_resend() {
    for b in backends() {
        happened_is_found(b);
    }
}

/// A timeout after the request was sent (the downstream holds it): `flow run` itself
/// probes before pausing, finds the effect, and the run succeeds in the same process.
fn timeout_is_found_in_the_same_run(backend: Backend) {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    server.set("/pay", Behavior::hold(Duration::from_secs(3)));
    let db = TestDb::new(backend);
    let file = db.write(
        "pay.yaml",
        &workflow(&server.url(), &effects(&server), "0s", 3),
    );
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
    let run = run_id(&out);
    let key = format!("{run}:charge:1");
    assert_eq!(server.count(&key), 1, "{backend:?}: sent once, never again");
    let s = show(&db, &run);
    assert_eq!(
        call(&s, "charge")["resolution"]["by"],
        "reconcile",
        "{backend:?}"
    );
    assert_eq!(probes(&s, "charge")[0]["observed"], "found", "{backend:?}");
}

#[test]
fn timeout_after_send_probe_found() {
    for b in backends() {
        timeout_is_found_in_the_same_run(b);
    }
}

/// A probe that cannot answer (HTTP 500) leaves the call in doubt: probed again with
/// backoff, then `tool_call.needs_operator` after `max_probes`; never re-sent, never
/// failed; a later `flow resume` does not probe a spent call again.
fn failing_probe_needs_an_operator(backend: Backend) {
    let rt = runtime();
    let db = TestDb::new(backend);
    let (server, broken, file) = failing_probe(&rt, &db, 3);
    let (run, key) = crash_at(&db, &file, "after_response");
    resume_expect(&db, &run, 3, &format!("{backend:?}"));
    assert_eq!(server.count(&key), 1, "{backend:?}: never re-sent");
    assert_eq!(broken.total(), 3, "{backend:?}: three probes");
    let s = show(&db, &run);
    assert_eq!(call(&s, "charge")["status"], "in_doubt", "{backend:?}");
    let p = probes(&s, "charge");
    let decisions: Vec<&str> = p.iter().filter_map(|p| p["decision"].as_str()).collect();
    assert_eq!(
        decisions,
        ["probe_again", "probe_again", "needs_operator"],
        "{backend:?}"
    );
    assert!(p.iter().all(|p| p["observed"] == "unknown"), "{backend:?}");
    assert!(
        audited(&s).contains(&"tool_call.needs_operator".to_owned()),
        "{backend:?}: {s}"
    );

    let again = output(db.flow().args(["resume", &run]));
    assert_eq!(again.status.code(), Some(3), "{backend:?}");
    assert_eq!(
        broken.total(),
        3,
        "{backend:?}: a spent call is not probed again"
    );
    // The operator still settles it by hand.
    let settled = output(db.flow().args([
        "resume",
        &run,
        "--resolve",
        "charge=succeeded",
        "--output",
        r#"{"count": 1}"#,
    ]));
    assert_eq!(
        settled.status.code(),
        Some(0),
        "{backend:?}: {}",
        stderr(&settled)
    );
}

#[test]
fn probe_error_stays_in_doubt_then_needs_operator() {
    for b in backends() {
        failing_probe_needs_an_operator(b);
    }
}

/// `not_found` before `after` is not trusted: the next probe waits until it can be,
/// and only then is the call re-sent.
fn early_not_found_is_not_trusted(backend: Backend) {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(backend);
    let file = db.write(
        "pay.yaml",
        &workflow(&server.url(), &effects(&server), "3s", 3),
    );
    let (run, key) = crash_at(&db, &file, "after_outbound");
    resume_expect(&db, &run, 0, &format!("{backend:?}"));
    assert_eq!(server.count(&key), 1, "{backend:?}");
    let s = show(&db, &run);
    let p = probes(&s, "charge");
    assert_eq!(p.len(), 2, "{backend:?}: {p:?}");
    assert_eq!(p[0]["observed"], "not_found", "{backend:?}");
    assert_eq!(
        p[0]["decision"], "probe_again",
        "{backend:?}: too early to trust"
    );
    assert_eq!(p[1]["decision"], "resend", "{backend:?}");
    // The first probe scheduled the second for when `after` has passed since the
    // request left; the second came no earlier.
    let ms = |v: &Json| {
        v.as_str()
            .and_then(|t| humantime::parse_rfc3339(t).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis())
            .unwrap_or_else(|| panic!("{backend:?}: not a time: {v}"))
    };
    let (first, due, second) = (ms(&p[0]["at"]), ms(&p[0]["next_probe_at"]), ms(&p[1]["at"]));
    assert!(
        due > first,
        "{backend:?}: the next probe was scheduled later"
    );
    assert!(
        second >= due,
        "{backend:?}: not trusted before `after` ({second} < {due})"
    );
}

#[test]
fn not_found_before_after_is_not_trusted() {
    for b in backends() {
        early_not_found_is_not_trusted(b);
    }
}

/// A paused run whose probe said nothing useful (HTTP 500, probes spent): `flow reconcile
/// --dry-run` reports what a probe would do now and changes nothing; `flow reconcile`
/// settles the call and prints how to continue; `flow resume` then re-sends once.
fn reconcile_command(backend: Backend) {
    let rt = runtime();
    let db = TestDb::new(backend);
    let (server, probe, file) = failing_probe(&rt, &db, 2);
    let (run, key) = crash_at(&db, &file, "after_outbound");
    resume_expect(&db, &run, 3, &format!("{backend:?}"));
    assert_eq!(probes(&show(&db, &run), "charge").len(), 2, "{backend:?}");

    // The downstream can answer now: it has no such charge.
    probe.set(
        "*",
        Behavior::Json {
            status: 404,
            body: serde_json::json!({"error": "no such charge"}),
        },
    );
    let dry = output(db.flow().args(["reconcile", "--dry-run", "--json"]));
    assert_eq!(dry.status.code(), Some(0), "{backend:?}: {}", stderr(&dry));
    let line: Json = serde_json::from_str(stdout(&dry).trim()).expect("one JSON line");
    assert_eq!(line["run"], run.as_str(), "{backend:?}");
    assert_eq!(line["key"], key.as_str(), "{backend:?}");
    assert_eq!(line["outcome"]["decision"], "resend", "{backend:?}: {line}");
    assert_eq!(line["outcome"]["settled"], false, "{backend:?}");
    let s = show(&db, &run);
    assert_eq!(
        probes(&s, "charge").len(),
        2,
        "{backend:?}: a dry run records nothing"
    );
    assert_eq!(
        call(&s, "charge")["status"],
        "in_doubt",
        "{backend:?}: and settles nothing"
    );

    let real = output(db.flow().args(["reconcile"]));
    assert_eq!(
        real.status.code(),
        Some(0),
        "{backend:?}: {}",
        stderr(&real)
    );
    assert!(
        stdout(&real).contains("not_found → resend"),
        "{backend:?}: {}",
        stdout(&real)
    );
    assert!(
        stderr(&real).contains(&format!("resume {run}")),
        "{backend:?}: the command to continue is printed: {}",
        stderr(&real)
    );
    assert_eq!(
        server.count(&key),
        0,
        "{backend:?}: reconcile itself sends no effect"
    );
    resume_expect(&db, &run, 0, &format!("{backend:?}"));
    assert_eq!(
        server.count(&key),
        1,
        "{backend:?}: re-sent once with the same key"
    );
    let s = show(&db, &run);
    assert_eq!(
        call(&s, "charge")["resolution"]["by"],
        "reconcile",
        "{backend:?}"
    );
    assert_eq!(probes(&s, "charge").len(), 3, "{backend:?}");
}

#[test]
fn flow_reconcile_dry_run_changes_nothing_then_settles() {
    for b in backends() {
        reconcile_command(b);
    }
}

/// A probe due later than `flow resume` waits for: the run pauses with the probe
/// scheduled, and a daemon's reconciler re-queues it when due; the worker that claims
/// it probes, finds the effect, and the run succeeds with no second request.
fn daemon_probes_when_due(backend: Backend) {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let probe = rt.block_on(CountingServer::start()).expect("probe server");
    probe.set("*", Behavior::status(503));
    let db = TestDb::new(backend);
    let file = db.write(
        "pay.yaml",
        &workflow_every(
            &server.url(),
            &format!("{}/effects", probe.url()),
            "0s",
            3,
            "12s",
        ),
    );
    let (run, key) = crash_at(&db, &file, "after_response");
    resume_expect(&db, &run, 3, &format!("{backend:?}"));
    let s = show(&db, &run);
    let p = probes(&s, "charge");
    assert_eq!(
        p.len(),
        1,
        "{backend:?}: one probe, the next beyond the in-process wait"
    );
    assert_eq!(p[0]["decision"], "probe_again", "{backend:?}");

    // The downstream recovers; it has the charge.
    probe.set(
        "*",
        Behavior::Json {
            status: 200,
            body: serde_json::json!({"key": key, "count": 1}),
        },
    );
    let log = db.dir.path().join("daemon.log");
    let mut daemon = db
        .flow()
        .args(["daemon", "--poll-interval", "200ms"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn daemon");
    let start = std::time::Instant::now();
    let status = loop {
        let s = show(&db, &run);
        if s["run"]["status"] == "succeeded" || start.elapsed() > Duration::from_secs(40) {
            break s["run"]["status"].clone();
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let _ = daemon.kill();
    let _ = daemon.wait();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status, "succeeded", "{backend:?}: daemon log:\n{log}");
    assert_eq!(server.count(&key), 1, "{backend:?}: never re-sent");
    let s = show(&db, &run);
    let p = probes(&s, "charge");
    assert_eq!(p.len(), 2, "{backend:?}");
    assert_eq!(p[1]["decision"], "succeed", "{backend:?}");
    assert!(
        audited(&s).contains(&"run.queued".to_owned()),
        "{backend:?}: the re-queue is audited: {s}"
    );
}

#[test]
fn the_daemon_reconciler_probes_when_due() {
    for b in backends() {
        daemon_probes_when_due(b);
    }
}

/// The example runs offline against the testkit server and settles a crash by probing.
#[test]
fn the_reconcile_example_settles_a_crash() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        let db = TestDb::new(backend);
        let example = repo().join("workflows/reconcile.yaml");
        let base = format!("base_url={}", server.url());
        let crashed = output(
            db.flow()
                .arg("run")
                .arg(&example)
                .args(["--input", "order_id=42", "--input", &base])
                .env("FLOW_FAULT", "after_response:charge"),
        );
        let run = run_id(&crashed);
        let resumed = resume_expect(&db, &run, 0, &format!("{backend:?}"));
        let v: Json = serde_json::from_slice(&resumed.stdout).expect("output JSON");
        assert_eq!(
            v["receipt"]["payment_key"], "charge-42:1",
            "{backend:?}: {v}"
        );
        assert_eq!(
            server.count("charge-42:1"),
            1,
            "{backend:?}: no second charge"
        );
    }
}
