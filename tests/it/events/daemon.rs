//! `flow daemon` delivers the events of `flow.toml`'s consumers too: while it runs, and
//! — with `--exit-when-idle` — the events of the last runs before it exits.

use std::process::Stdio;
use std::time::Duration;

use super::hook::Hook;
use super::*;
use crate::support::{Backend, backends, runtime};

fn submit_hello(db: &TestDb, config: &std::path::Path) -> String {
    let out = output(
        flow_with(db, config)
            .arg("submit")
            .arg(crate::support::repo().join("workflows/hello.yaml")),
    );
    assert_eq!(out.status.code(), Some(0), "submit: {}", stderr(&out));
    stdout(&out).trim().to_string()
}

fn delivered_while_serving(backend: Backend) {
    let rt = runtime();
    let hook = Hook::start(&rt);
    let db = TestDb::new(backend);
    let config = db.write(
        "flow.toml",
        &webhook_toml(&hook.url(), "[\"run.succeeded\"]", ""),
    );
    let mut daemon = flow_with(&db, &config)
        .args(["daemon", "--poll-interval", "100ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn flow daemon");
    let run = submit_hello(&db, &config);
    hook.wait_for(Duration::from_secs(20), "run.succeeded", |r| !r.is_empty());
    let stopped = sigterm(&mut daemon);
    let ctx = format!("{backend:?}");
    assert_eq!(
        stopped.status.code(),
        Some(0),
        "{ctx}: {}",
        stderr(&stopped)
    );
    assert!(
        stderr(&stopped).contains("delivering events to ops-webhook"),
        "{ctx}: {}",
        stderr(&stopped)
    );
    let got = hook.received();
    assert_eq!(got.len(), 1, "{ctx}: one run, one matching event");
    let body = got[0].json();
    assert_eq!(body["type"], "run.succeeded", "{ctx}");
    assert_eq!(body["run_id"], run.as_str(), "{ctx}");
    assert_eq!(
        got[0].signature,
        expected_signature(HOOK_SECRET, &got[0].body),
        "{ctx}"
    );
    let d = deliveries(&db, &[]);
    assert_eq!(d.len(), 1, "{ctx}: {d:?}");
    assert_eq!(d[0]["status"], "delivered", "{ctx}: {d:?}");
}

#[test]
fn the_daemon_delivers_events_while_it_serves() {
    for backend in backends() {
        delivered_while_serving(backend);
    }
}

#[test]
fn exit_when_idle_delivers_the_last_runs_events_before_exiting() {
    for backend in backends() {
        let db = TestDb::new(backend);
        let sink = db.dir.path().join("events.jsonl");
        let config = db.write(
            "flow.toml",
            &format!(
                "[[consumers]]\nname = \"audit\"\nkind = \"file\"\npath = \"{}\"\nevents = [\"run.*\"]\n",
                sink.display()
            ),
        );
        let runs: Vec<String> = (0..3).map(|_| submit_hello(&db, &config)).collect();
        let out = output(flow_with(&db, &config).args([
            "daemon",
            "--exit-when-idle",
            "--poll-interval",
            "50ms",
        ]));
        let ctx = format!("{backend:?}");
        assert_eq!(out.status.code(), Some(0), "{ctx}: {}", stderr(&out));
        let text = std::fs::read_to_string(&sink).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        for run in &runs {
            assert!(
                lines
                    .iter()
                    .any(|e| e["run_id"] == run.as_str() && e["type"] == "run.succeeded"),
                "{ctx}: run.succeeded of {run} in the file when the daemon exits: {text}"
            );
        }
        let undelivered = deliveries(&db, &["--status", "pending"]);
        assert!(undelivered.is_empty(), "{ctx}: {undelivered:?}");
    }
}
