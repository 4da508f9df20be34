//! MCP tasks through the real binary, on both backends: a server that answers
//! `tools/call` with a task (the testkit's `task` tool, over streamable HTTP, in this
//! process so it outlives the `flow` it serves). The task id is written to the ledger
//! the moment it arrives; a timeout or a SIGKILL after that is collected by asking
//! `tasks/get`, never by calling again; only a crash before the id arrived leaves the
//! call in doubt.

use std::process::Stdio;
use std::time::{Duration, Instant};

use flow_adapters::testkit::mcp::HttpServer;
use serde_json::Value as Json;

use crate::support::{Backend, TestDb, backends, call, output, run_id, runtime, show, stderr};

/// The workflow: one node calling the `task` tool with `with`, under `timeout`.
fn workflow(url: &str, with: &str, timeout: &str) -> String {
    format!(
        r#"name: task-pay
tools:
  job:
    kind: mcp
    server: {{ url: "{url}" }}
    tool: task
    timeout: {timeout}
nodes:
  charge: {{ tool: job, with: {with} }}
"#
    )
}

/// A task that ends within the attempt: its result is the node's output, one call
/// reached the tool, flow polled `tasks/get`, and the task id is on the call.
fn completes(backend: Backend) {
    let rt = runtime();
    let server = rt.block_on(HttpServer::start(None)).expect("mcp server");
    let db = TestDb::new(backend);
    let with = r#"{ key: "order-1", ms: 300 }"#;
    let file = db.write("w.yaml", &workflow(&server.url(), with, "10s"));
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
    let v: Json = serde_json::from_slice(&out.stdout).expect("output JSON");
    assert_eq!(v["charge"]["count"], 1, "{backend:?}: {v}");
    assert_eq!(v["charge"]["slept_ms"], 300);
    let stats = server.stats();
    assert_eq!(stats.calls("task"), 1, "{backend:?}");
    assert!(stats.task_gets() >= 1, "{backend:?}: no tasks/get");
    let run = run_id(&out);
    let s = show(&db, &run);
    let c = call(&s, "charge");
    assert_eq!(c["status"], "succeeded", "{s:#}");
    assert_eq!(c["outbound_requests"], 1, "polls are not requests: {s:#}");
    assert!(c["remote_task"].is_string(), "{s:#}");
}

#[test]
fn a_task_that_ends_in_time_is_the_nodes_output() {
    for b in backends() {
        completes(b);
    }
}

/// A task that outlives the attempt's timeout: not in doubt, not re-sent; the same
/// `flow run` asks again and collects the result.
fn outlives_its_timeout(backend: Backend) {
    let rt = runtime();
    let server = rt.block_on(HttpServer::start(None)).expect("mcp server");
    let db = TestDb::new(backend);
    let with = r#"{ key: "order-2", ms: 2500 }"#;
    let file = db.write("w.yaml", &workflow(&server.url(), with, "1s"));
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
    let v: Json = serde_json::from_slice(&out.stdout).expect("output JSON");
    assert_eq!(v["charge"]["count"], 1, "{backend:?}: {v}");
    assert_eq!(server.stats().calls("task"), 1, "{backend:?}: called again");
    assert!(
        stderr(&out).contains("still working; asking again"),
        "{}",
        stderr(&out)
    );
    // Exit 0 from the one `flow run`: the run never paused, so the call was never in doubt.
    assert_eq!(
        call(&show(&db, &run_id(&out)), "charge")["status"],
        "succeeded"
    );
}

#[test]
fn a_task_outliving_its_timeout_is_collected_not_doubted() {
    for b in backends() {
        outlives_its_timeout(b);
    }
}

/// SIGKILL of `flow run` while the task works, after its id is written: the call is
/// left `outbound` with the task, and `flow resume` collects the task's result with no
/// second call.
fn killed_during_the_task(backend: Backend) {
    let rt = runtime();
    let server = rt.block_on(HttpServer::start(None)).expect("mcp server");
    let db = TestDb::new(backend);
    let with = r#"{ key: "order-3", ms: 3000 }"#;
    let file = db.write("w.yaml", &workflow(&server.url(), with, "30s"));
    let run = "run_task_killed";
    let mut child = db
        .flow()
        .arg("run")
        .arg(&file)
        .args(["--run-id", run])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn flow run");
    // Wait for the task id to be in the ledger, then kill.
    let started = Instant::now();
    loop {
        let out = output(db.flow().args(["show", run, "--json"]));
        if out.status.code() == Some(0) {
            let s: Json = serde_json::from_slice(&out.stdout).unwrap_or(Json::Null);
            let recorded = s["tool_calls"]
                .as_array()
                .and_then(|c| c.first())
                .is_some_and(|c| c["remote_task"].is_string());
            if recorded {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{backend:?}: the task id was never recorded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        matches!(child.try_wait(), Ok(None)),
        "{backend:?}: flow finished before the kill"
    );
    let _ = child.kill();
    let _ = child.wait();
    let s = show(&db, run);
    assert_eq!(call(&s, "charge")["status"], "outbound", "{s:#}");
    let out = output(db.flow().args(["resume", run]));
    assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
    let s = show(&db, run);
    assert_eq!(s["run"]["status"], "succeeded", "{s:#}");
    assert_eq!(s["run"]["output"]["charge"]["count"], 1, "{s:#}");
    assert_eq!(server.stats().calls("task"), 1, "{backend:?}: called again");
    assert_eq!(
        server.stats().count("order-3"),
        1,
        "{backend:?}: two effects"
    );
    assert!(
        !stderr(&out).contains("in doubt"),
        "{backend:?}: {}",
        stderr(&out)
    );
}

#[test]
fn a_run_killed_during_a_task_collects_it_on_resume_without_a_second_call() {
    for b in backends() {
        killed_during_the_task(b);
    }
}

/// A crash after the outbound mark, before any answer: nothing says a task exists, so
/// the call is in doubt, as any other.
fn crash_before_the_task_id(backend: Backend) {
    let rt = runtime();
    let server = rt.block_on(HttpServer::start(None)).expect("mcp server");
    let db = TestDb::new(backend);
    let with = r#"{ key: "order-4", ms: 100 }"#;
    let file = db.write("w.yaml", &workflow(&server.url(), with, "10s"));
    let crashed = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("FLOW_FAULT", "after_outbound:charge"),
    );
    assert_eq!(crashed.status.code(), None, "{}", stderr(&crashed));
    let run = run_id(&crashed);
    let out = output(db.flow().args(["resume", &run]));
    assert_ne!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
    let s = show(&db, &run);
    let c = call(&s, "charge");
    assert_eq!(c["status"], "in_doubt", "{s:#}");
    assert!(c["remote_task"].is_null(), "{s:#}");
    assert_eq!(server.stats().calls("task"), 0, "{backend:?}");
}

#[test]
fn a_crash_before_the_task_id_arrived_leaves_the_call_in_doubt() {
    for b in backends() {
        crash_before_the_task_id(b);
    }
}

/// A task that fails: the node fails with the server's error, once.
fn fails(backend: Backend) {
    let rt = runtime();
    let server = rt.block_on(HttpServer::start(None)).expect("mcp server");
    let db = TestDb::new(backend);
    let with = r#"{ key: "order-5", ms: 100, fail: true }"#;
    let file = db.write("w.yaml", &workflow(&server.url(), with, "10s"));
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(1), "{backend:?}: {}", stderr(&out));
    let s = show(&db, &run_id(&out));
    let c = call(&s, "charge");
    assert_eq!(c["status"], "failed", "{s:#}");
    let message = c["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("the task failed"), "{s:#}");
    assert_eq!(server.stats().calls("task"), 1, "{backend:?}");
}

#[test]
fn a_failed_task_fails_its_node() {
    for b in backends() {
        fails(b);
    }
}

/// Starts `flow` with `args` and SIGKILLs it after `after` unless it ended first;
/// whether it was killed.
fn kill_after(db: &TestDb, args: &[&str], after: Duration) -> bool {
    let mut child = db
        .flow()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn flow");
    std::thread::sleep(after);
    let running = matches!(child.try_wait(), Ok(None));
    if running {
        let _ = child.kill();
    }
    let _ = child.wait();
    running
}

/// Seeded random SIGKILLs of `flow run` and `flow resume` on a chain of three task
/// nodes whose tasks outlive their 300 ms timeout: whatever the moment of each kill, no
/// key's tool is called twice, a run ends succeeded with every effect once, and a call
/// is only ever in doubt when no task id was recorded for it. `FLOW_TASK_CHAOS_RUNS` sets the
/// runs per backend (default 6); the figures print with `--no-capture`.
#[test]
fn random_kills_during_tasks_never_call_twice() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("FLOW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let runs: usize = std::env::var("FLOW_TASK_CHAOS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    eprintln!("task chaos seed: {seed} (replay with FLOW_TEST_SEED={seed})");
    let rt = runtime();
    for backend in backends() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (backend as u64));
        let server = rt.block_on(HttpServer::start(None)).expect("mcp server");
        let db = TestDb::new(backend);
        let (mut kills, mut succeeded, mut doubted) = (0, 0, 0);
        for i in 0..runs {
            let ms: [u64; 3] = std::array::from_fn(|_| rng.random_range(100..700));
            let run = format!("run_tasks_{i}");
            let text = format!(
                r#"name: task-chain
tools:
  job: {{ kind: mcp, server: {{ url: "{url}" }}, tool: task, timeout: 300ms }}
nodes:
  a: {{ tool: job, with: {{ key: "{run}-a", ms: {} }} }}
  b: {{ tool: job, needs: [a], with: {{ key: "{run}-b", ms: {} }} }}
  c: {{ tool: job, needs: [b], with: {{ key: "{run}-c", ms: {} }} }}
"#,
                ms[0],
                ms[1],
                ms[2],
                url = server.url()
            );
            let file = db.write(&format!("{run}.yaml"), &text);
            let file = file.display().to_string();
            let start = ["run", file.as_str(), "--run-id", run.as_str()];
            let at = Duration::from_millis(rng.random_range(0..1500));
            kills += u32::from(kill_after(&db, &start, at));
            for _ in 0..4 {
                let at = Duration::from_millis(rng.random_range(0..900));
                kills += u32::from(kill_after(&db, &continue_args(&db, &start), at));
            }
            let last = output(db.flow().args(continue_args(&db, &start)));
            let s = show(&db, &run);
            let ctx = format!("{backend:?} {run} (seed {seed}): {}", stderr(&last));
            for node in ["a", "b", "c"] {
                let key = format!("{run}-{node}");
                assert!(server.stats().count(&key) <= 1, "{ctx}: {key} called twice");
            }
            match s["run"]["status"].as_str() {
                Some("succeeded") => {
                    succeeded += 1;
                    for node in ["a", "b", "c"] {
                        assert_eq!(server.stats().count(&format!("{run}-{node}")), 1, "{ctx}");
                    }
                }
                Some("paused") => {
                    doubted += 1;
                    let calls = s["tool_calls"].as_array().cloned().unwrap_or_default();
                    let stuck: Vec<_> =
                        calls.iter().filter(|c| c["status"] == "in_doubt").collect();
                    assert_eq!(stuck.len(), 1, "{ctx}: {s:#}");
                    assert!(
                        stuck[0]["remote_task"].is_null(),
                        "{ctx}: a recorded task went in doubt: {s:#}"
                    );
                }
                other => panic!("{ctx}: run ended {other:?}: {s:#}"),
            }
        }
        eprintln!(
            "{backend:?}: {runs} runs, {kills} SIGKILLs, {succeeded} succeeded, {doubted} in doubt (a kill before the task id was written), {} tools/call for {} keys",
            server.stats().calls("task"),
            3 * runs
        );
    }
}

/// `flow resume RUN` once the run exists; `start` again while a kill came before the
/// run was even created.
fn continue_args<'a>(db: &TestDb, start: &[&'a str; 4]) -> Vec<&'a str> {
    let exists = output(db.flow().args(["show", start[3]])).status.code() == Some(0);
    if exists {
        vec!["resume", start[3]]
    } else {
        start.to_vec()
    }
}
