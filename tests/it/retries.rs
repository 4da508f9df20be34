//! Node retries through the real binary: step ids, attempt counts, keys per attempt,
//! what is retried and what is not, and a backoff that survives a crash.

use std::process::Stdio;
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::{Behavior, CountingServer};

use crate::support::{Backend, TestDb, backends, call, output, run_id, runtime, show, stderr};

fn workflow(url: &str, policy: &str, extra_tool: &str) -> String {
    format!(
        r#"name: retry
tools:
  api: {{ kind: http, method: POST, url: "{url}/api", timeout: 5s {extra_tool} }}
nodes:
  charge:
    tool: api
    with: {{ amount: 3 }}
    retry_policy: {policy}
"#
    )
}

fn steps_of(s: &serde_json::Value, node: &str) -> Vec<String> {
    s["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["node_id"] == node)
        .filter_map(|x| x["step_id"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn transient_failures_retry_as_numbered_steps_with_a_new_key_each() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        server.set(
            "/api",
            Behavior::FailTimes {
                times: 2,
                status: 503,
            },
        );
        let db = TestDb::new(backend);
        let file = db.write(
            "w.yaml",
            &workflow(
                &server.url(),
                "{ max_retries: 2, backoff: { initial: 50ms, max: 200ms } }",
                "",
            ),
        );
        let out = output(db.flow().arg("run").arg(&file));
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        let run = run_id(&out);
        let s = show(&db, &run);
        assert_eq!(
            steps_of(&s, "charge"),
            ["charge", "charge_retry1", "charge_retry2"],
            "{backend:?}"
        );
        let c = call(&s, "charge");
        assert_eq!(c["attempt_count"], 3, "{backend:?}");
        assert_eq!(c["outbound_requests"], 3, "{backend:?}");
        for attempt in 1..=3 {
            assert_eq!(
                server.count(&format!("{run}:charge:{attempt}")),
                1,
                "{backend:?}: attempt {attempt} has its own key, sent once"
            );
        }
        assert_eq!(server.total(), 3);
    }
}

#[test]
fn permanent_errors_are_not_retried_and_the_run_fails() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        server.set("/api", Behavior::status(400));
        let db = TestDb::new(backend);
        let file = db.write(
            "w.yaml",
            &workflow(
                &server.url(),
                "{ max_retries: 3, backoff: { initial: 10ms } }",
                "",
            ),
        );
        let out = output(db.flow().arg("run").arg(&file));
        assert_eq!(out.status.code(), Some(1), "{backend:?}: {}", stderr(&out));
        let s = show(&db, &run_id(&out));
        assert_eq!(
            steps_of(&s, "charge"),
            ["charge"],
            "{backend:?}: a 4xx is not retried"
        );
        assert_eq!(s["run"]["status"], "failed");
        assert!(
            s["run"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("charge")),
            "{s:#}"
        );
        assert_eq!(server.total(), 1);
    }
}

#[test]
fn exhausted_retries_fail_with_the_last_error() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    server.set("/api", Behavior::status(503));
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write(
        "w.yaml",
        &workflow(
            &server.url(),
            "{ max_retries: 1, backoff: { initial: 10ms } }",
            "",
        ),
    );
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let s = show(&db, &run_id(&out));
    assert_eq!(steps_of(&s, "charge"), ["charge", "charge_retry1"]);
    assert_eq!(call(&s, "charge")["status"], "failed");
    assert_eq!(call(&s, "charge")["error"]["kind"], "transient");
    assert_eq!(server.total(), 2, "max_retries: 1 means two attempts");
}

#[test]
fn a_backoff_survives_a_crash_during_the_wait() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        server.set(
            "/api",
            Behavior::FailTimes {
                times: 1,
                status: 503,
            },
        );
        let db = TestDb::new(backend);
        let file = db.write(
            "w.yaml",
            &workflow(
                &server.url(),
                // 10 s: the kill below must land inside the wait however slowly the
                // polling `flow show`s run on a loaded machine.
                "{ max_retries: 1, backoff: { initial: 10s, max: 10s, jitter: 0 } }",
                "",
            ),
        );
        let mut child = db
            .flow()
            .arg("run")
            .arg(&file)
            .arg("--run-id")
            .arg("backoff-1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(db.dir.path().join("run.log")).expect("log"))
            .spawn()
            .expect("spawn");
        // Wait until the retry step is recorded as pending, then kill the process mid-wait.
        let started = Instant::now();
        let not_before = loop {
            let out = output(db.flow().args(["show", "backoff-1", "--json"]));
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{backend:?}: no pending retry appeared; run log:\n{}\nshow: {} {}",
                std::fs::read_to_string(db.dir.path().join("run.log")).unwrap_or_default(),
                crate::support::stdout(&out),
                stderr(&out)
            );
            if out.status.code() == Some(0) {
                let s: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
                if let Some(nb) = s["steps"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|x| x["step_id"] == "charge_retry1" && x["status"] == "pending")
                    .and_then(|x| x["not_before"].as_str().map(str::to_string))
                {
                    break nb;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(server.total(), 1, "{backend:?}");
        let resumed_at = Instant::now();
        let out = output(db.flow().args(["resume", "backoff-1"]));
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        assert_eq!(server.total(), 2, "{backend:?}");
        assert_eq!(server.count("backoff-1:charge:2"), 1);
        // The retry did not start before its durable not_before (10 s after the failure).
        let waited = resumed_at.elapsed();
        let s = show(&db, "backoff-1");
        let retry = s["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|x| x["step_id"] == "charge_retry1")
            .cloned()
            .unwrap_or_default();
        assert!(
            retry["started_at"]
                .as_str()
                .is_some_and(|t| t >= not_before.as_str()),
            "{backend:?}: started {} before not_before {not_before}",
            retry["started_at"]
        );
        assert!(
            waited > Duration::from_millis(500),
            "{backend:?}: resume did not wait for the backoff ({waited:?})"
        );
    }
}

#[test]
fn header_idempotent_tools_resend_the_same_key_after_a_timeout() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    server.set("/api", Behavior::hold(Duration::from_secs(3)));
    let db = TestDb::new(Backend::Sqlite);
    let text = workflow(
        &server.url(),
        "{ max_retries: 2, backoff: { initial: 10ms } }",
        ", idempotency: header",
    )
    .replace("timeout: 5s", "timeout: 300ms");
    let file = db.write("w.yaml", &text);
    let out = output(db.flow().arg("run").arg(&file));
    let run = run_id(&out);
    // Three sends of one effect attempt, all with the same key; the outcome stays unknown.
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(server.count(&format!("{run}:charge:1")), 3);
    assert_eq!(server.total(), 3);
    let s = show(&db, &run);
    let c = call(&s, "charge");
    assert_eq!(c["status"], "in_doubt");
    assert_eq!(c["attempt_count"], 1);
    assert_eq!(c["outbound_requests"], 3);
}

#[test]
fn read_only_timeouts_are_retried_not_put_in_doubt() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    server.set("/api", Behavior::hold(Duration::from_secs(3)));
    let db = TestDb::new(Backend::Sqlite);
    let text = workflow(
        &server.url(),
        "{ max_retries: 1, backoff: { initial: 10ms } }",
        "",
    )
    .replace("method: POST", "method: GET")
    .replace("timeout: 5s", "timeout: 300ms");
    let file = db.write("w.yaml", &text);
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let s = show(&db, &run_id(&out));
    assert_eq!(steps_of(&s, "charge"), ["charge", "charge_retry1"]);
    assert_eq!(call(&s, "charge")["error"]["kind"], "unknown");
    assert_eq!(server.total(), 2);
}

/// Every step that ran has a start time, retry steps of pure functions included (they
/// go from pending to their outcome in one write), and it is not after the finish.
#[test]
fn every_step_that_ran_has_its_start_time() {
    for backend in backends() {
        let db = TestDb::new(backend);
        let out = output(
            db.flow()
                .arg("run")
                .arg(crate::support::repo().join("workflows/retries.yaml")),
        );
        let run = run_id(&out);
        let s = show(&db, &run);
        let steps = s["steps"].as_array().cloned().unwrap_or_default();
        assert!(
            steps.iter().any(|x| x["retry"].as_u64() > Some(0)),
            "{backend:?}: the example has retry steps: {s:#}"
        );
        for step in steps {
            if !matches!(step["status"].as_str(), Some("succeeded" | "failed")) {
                continue;
            }
            let (start, end) = (step["started_at"].as_str(), step["finished_at"].as_str());
            assert!(
                start.is_some() && start <= end,
                "{backend:?}: {} started {start:?}, finished {end:?}",
                step["step_id"]
            );
        }
    }
}
