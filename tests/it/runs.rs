//! Running workflows through the binary: outputs, conditions, failure policy, deadlines,
//! cancellation, idempotent starts, and the JSON shapes of `show` and `runs`.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{Backend, TestDb, backends, output, repo, run_id, show, stderr, stdout};

#[test]
fn hello_runs_on_both_backends_and_prints_its_sink_outputs() {
    for backend in backends() {
        let db = TestDb::new(backend);
        let out = output(
            db.flow()
                .arg("run")
                .arg(repo().join("workflows/hello.yaml"))
                .args(["--input", "name=Ada"]),
        );
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("stdout is the output JSON");
        assert_eq!(v["summary"]["greeting"], "Hello, Ada!");
        assert_eq!(v["summary"]["letters"], 3);
        let err = stderr(&out);
        for node in ["greet", "count", "summary"] {
            assert!(err.contains(&format!("✓ {node} (attempt 1)")), "{err}");
        }
    }
}

#[test]
fn conditions_skip_nodes_and_their_dependents() {
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write(
        "w.yaml",
        "name: cond\ninputs:\n  go: { type: boolean, default: false }\ntools:\n  e: { kind: function, function: core.echo }\nnodes:\n  a: { tool: e, with: { v: 1 } }\n  b: { tool: e, needs: [a], if: \"${{ inputs.go }}\" }\n  c: { tool: e, needs: [b] }\n  d: { tool: e, needs: [a], if: \"${{ nodes.a.output.v == 1 }}\" }\n",
    );
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let s = show(&db, &run_id(&out));
    let status = |n: &str| {
        s["steps"]
            .as_array()
            .and_then(|st| st.iter().find(|x| x["node_id"] == n))
            .map(|x| x["status"].clone())
    };
    assert_eq!(status("b"), Some("skipped".into()));
    assert_eq!(
        status("c"),
        Some("skipped".into()),
        "a skipped node skips its dependents"
    );
    assert_eq!(status("d"), Some("succeeded".into()));
    let out = output(db.flow().arg("run").arg(&file).args(["--input", "go=true"]));
    let s = show(&db, &run_id(&out));
    assert!(
        s["steps"]
            .as_array()
            .is_some_and(|st| st.iter().all(|x| x["status"] == "succeeded")),
        "{s:#}"
    );
}

/// `if: false`, `if: "false"`, a bare expression and an expression with a space after it
/// are conditions, never truthy strings: a false one sends nothing.
#[test]
fn false_conditions_in_every_spelling_send_nothing() {
    let rt = crate::support::runtime();
    let server = rt
        .block_on(flow_adapters::testkit::http::CountingServer::start())
        .expect("server");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write(
        "w.yaml",
        &format!(
            r#"name: conditions
inputs:
  go: {{ type: boolean, default: false }}
tools:
  post: {{ kind: http, method: POST, url: "{}/hit" }}
nodes:
  bare_false: {{ tool: post, if: false, with: {{ n: bare_false }} }}
  quoted_false: {{ tool: post, if: "false", with: {{ n: quoted_false }} }}
  spaced: {{ tool: post, if: "${{{{ inputs.go }}}} ", with: {{ n: spaced }} }}
  padded: {{ tool: post, if: "  ${{{{ inputs.go }}}}", with: {{ n: padded }} }}
  bare_expr: {{ tool: post, if: "inputs.go", with: {{ n: bare_expr }} }}
  control: {{ tool: post, if: true, with: {{ n: control }} }}
"#,
            server.url()
        ),
    );
    let validate = output(db.flow().arg("validate").arg(&file));
    assert_eq!(validate.status.code(), Some(0), "{}", stderr(&validate));
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let sent: Vec<String> = server
        .log()
        .iter()
        .map(|r| r.body["n"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(sent, ["control"], "only the true condition may send");
    let s = show(&db, &run_id(&out));
    for node in [
        "bare_false",
        "quoted_false",
        "spaced",
        "padded",
        "bare_expr",
    ] {
        let status = s["steps"]
            .as_array()
            .and_then(|st| st.iter().find(|x| x["node_id"] == node))
            .map(|x| x["status"].clone());
        assert_eq!(status, Some("skipped".into()), "{node}: {s:#}");
    }
    let out = output(db.flow().arg("run").arg(&file).args(["--input", "go=true"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut sent: Vec<String> = server
        .log()
        .iter()
        .skip(1)
        .map(|r| r.body["n"].as_str().unwrap_or_default().to_string())
        .collect();
    sent.sort();
    assert_eq!(sent, ["bare_expr", "control", "padded", "spaced"]);
}

#[test]
fn a_failure_stops_new_nodes_unless_continue_on_error() {
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write(
        "w.yaml",
        "name: fail\ntools:\n  e: { kind: function, function: core.echo }\n  f: { kind: function, function: core.fail }\nnodes:\n  a: { tool: f, with: { message: boom } }\n  b: { tool: e, needs: [a] }\n",
    );
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("node `a` failed: boom"),
        "{}",
        stderr(&out)
    );
    let s = show(&db, &run_id(&out));
    assert_eq!(
        s["steps"].as_array().map(Vec::len),
        Some(1),
        "b never started: {s:#}"
    );
    assert_eq!(s["run"]["status"], "failed");
    let ok = file.with_file_name("w2.yaml");
    std::fs::write(
        &ok,
        std::fs::read_to_string(&file).expect("read").replace(
            "message: boom }",
            "message: boom }, continue_on_error: true",
        ),
    )
    .expect("write");
    let out = output(db.flow().arg("run").arg(&ok));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_deadline_bounds_the_whole_node_including_retries() {
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write(
        "w.yaml",
        "name: deadline\ntools:\n  f: { kind: function, function: core.fail }\nnodes:\n  a:\n    tool: f\n    with: { kind: transient }\n    deadline: 1s\n    retry_policy: { max_retries: 50, backoff: { initial: 300ms, max: 300ms, jitter: 0 } }\n",
    );
    let started = Instant::now();
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(started.elapsed() < Duration::from_secs(10));
    let s = show(&db, &run_id(&out));
    let steps = s["steps"].as_array().map_or(0, Vec::len);
    assert!(
        (2..=6).contains(&steps),
        "retries stop at the deadline, got {steps} steps: {s:#}"
    );
}

#[test]
fn cancel_lets_the_running_step_finish_then_stops() {
    for backend in backends() {
        let db = TestDb::new(backend);
        let file = db.write(
            "w.yaml",
            "name: slow\ntools:\n  s: { kind: command, command: [sleep, \"2\"] }\n  e: { kind: function, function: core.echo }\nnodes:\n  a: { tool: s }\n  b: { tool: e, needs: [a] }\n",
        );
        let child = db
            .flow()
            .arg("run")
            .arg(&file)
            .args(["--run-id", "slow-1"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // Cancel only once `a` is in flight (its row is written before its command
        // starts): cancelling a run that has not started a step yet ends it at once.
        let started = Instant::now();
        loop {
            let s = output(db.flow().args(["show", "slow-1", "--json"]));
            let running = serde_json::from_slice::<serde_json::Value>(&s.stdout)
                .ok()
                .and_then(|v| v["steps"].as_array().cloned())
                .is_some_and(|st| {
                    st.iter()
                        .any(|x| x["node_id"] == "a" && x["status"] == "running")
                });
            if running {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "step a never started"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let c = output(db.flow().args(["cancel", "slow-1"]));
        assert_eq!(c.status.code(), Some(0), "{}", stderr(&c));
        let out = child.wait_with_output().expect("wait");
        assert_eq!(out.status.code(), Some(4), "{backend:?}: {}", stderr(&out));
        let s = show(&db, "slow-1");
        assert_eq!(s["run"]["status"], "cancelled");
        let a = s["steps"]
            .as_array()
            .and_then(|st| st.iter().find(|x| x["node_id"] == "a"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            a["status"], "succeeded",
            "the in-flight step finished: {s:#}"
        );
        assert!(
            s["steps"]
                .as_array()
                .is_some_and(|st| st.iter().all(|x| x["node_id"] != "b")),
            "b never started"
        );
        let again = output(db.flow().args(["cancel", "slow-1"]));
        assert_eq!(
            again.status.code(),
            Some(0),
            "cancelling twice is idempotent: {}",
            stderr(&again)
        );
        let done = output(
            db.flow()
                .arg("run")
                .arg(repo().join("workflows/hello.yaml")),
        );
        let refused = output(db.flow().args(["cancel", &run_id(&done)]));
        assert_eq!(
            refused.status.code(),
            Some(2),
            "cancelling a succeeded run is refused"
        );
        assert!(
            stderr(&refused).contains("already finished"),
            "{}",
            stderr(&refused)
        );
    }
}

#[test]
fn run_id_makes_starting_idempotent() {
    let db = TestDb::new(Backend::Sqlite);
    let hello = repo().join("workflows/hello.yaml");
    let first = output(
        db.flow()
            .arg("run")
            .arg(&hello)
            .args(["--run-id", "hello-1", "--input", "name=A"]),
    );
    assert_eq!(first.status.code(), Some(0));
    let again = output(
        db.flow()
            .arg("run")
            .arg(&hello)
            .args(["--run-id", "hello-1", "--input", "name=A"]),
    );
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(
        stdout(&again),
        stdout(&first),
        "attaching prints the same output"
    );
    assert!(
        stderr(&again).contains("already finished"),
        "{}",
        stderr(&again)
    );
    let other = output(
        db.flow()
            .arg("run")
            .arg(&hello)
            .args(["--run-id", "hello-1", "--input", "name=B"]),
    );
    assert_eq!(
        other.status.code(),
        Some(2),
        "different inputs under the same id are refused"
    );
    assert!(
        stderr(&other).contains("different workflow or inputs"),
        "{}",
        stderr(&other)
    );
    let bad = output(db.flow().arg("run").arg(&hello).args(["--run-id", "a b"]));
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn show_and_runs_print_the_documented_json() {
    let db = TestDb::new(Backend::Sqlite);
    let out = output(
        db.flow()
            .arg("run")
            .arg(repo().join("workflows/hello.yaml"))
            .arg("--json"),
    );
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("--json prints the show object");
    for key in [
        "id",
        "status",
        "workflow",
        "created_at",
        "finished_at",
        "error",
    ] {
        assert!(v["run"].get(key).is_some(), "run.{key} missing: {v:#}");
    }
    for key in [
        "step_id",
        "node_id",
        "retry",
        "status",
        "started_at",
        "finished_at",
        "error",
    ] {
        assert!(v["steps"][0].get(key).is_some(), "steps[].{key} missing");
    }
    for key in [
        "tool_call_id",
        "tool",
        "status",
        "attempt_count",
        "outbound_requests",
        "idempotency_key",
        "outbound_started_at",
        "error",
    ] {
        assert!(
            v["tool_calls"][0].get(key).is_some(),
            "tool_calls[].{key} missing"
        );
    }
    let runs = output(db.flow().args(["runs", "--json", "--status", "succeeded"]));
    let list: serde_json::Value = serde_json::from_slice(&runs.stdout).expect("runs --json");
    assert_eq!(list.as_array().map(Vec::len), Some(1));
    for key in ["id", "status", "workflow", "created_at", "finished_at"] {
        assert!(list[0].get(key).is_some(), "runs[].{key} missing");
    }
    assert_eq!(
        output(db.flow().args(["runs", "--status", "bogus"]))
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn resume_waits_for_a_live_holder_and_says_who_it_is() {
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write(
        "w.yaml",
        "name: slow\ntools:\n  s: { kind: function, function: core.sleep }\nnodes:\n  a: { tool: s, with: { duration: 3s } }\n",
    );
    // The file exists before the two processes meet: this test is about a live holder,
    // not about two processes creating a new SQLite file at once (a known race: the one
    // SQLite refuses fails with "database is locked"; see the issue note).
    let migrated = output(db.flow().arg("migrate"));
    assert_eq!(migrated.status.code(), Some(0), "{}", stderr(&migrated));
    let log = db.write("run.log", "");
    let mut child = db
        .flow()
        .arg("run")
        .arg(&file)
        .args(["--run-id", "held-1"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn");
    let started = Instant::now();
    loop {
        let shown = output(db.flow().args(["show", "held-1", "--json"]));
        if shown.status.code() == Some(0) {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) || matches!(child.try_wait(), Ok(Some(_))) {
            let _ = child.kill();
            panic!(
                "run never appeared; run exited {:?}, its stderr: {}\nlast show: {}",
                child.wait().ok(),
                std::fs::read_to_string(&log).unwrap_or_default(),
                stderr(&shown)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let resumed = output(db.flow().args(["resume", "held-1"]));
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    let err = stderr(&resumed);
    assert!(
        err.contains("run held-1 is held by") && err.contains("waiting for the lease"),
        "{err}"
    );
    assert!(err.contains("already finished"), "{err}");
    let s = show(&db, "held-1");
    assert_eq!(
        s["steps"].as_array().map(Vec::len),
        Some(1),
        "the step ran once: {s:#}"
    );
}

/// Processes that open a brand-new SQLite file at the same moment all get in ("database
/// is locked" at open was an exit 5, seen once in CI with `flow show` polling a run
/// `flow run` was starting). The race window is narrow: this test exercises the path
/// many times but did not reproduce the failure on demand before the fix.
#[test]
fn processes_opening_a_fresh_sqlite_file_together_all_get_in() {
    for round in 0..10 {
        let db = TestDb::new(Backend::Sqlite);
        let children: Vec<_> = (0..8)
            .map(|i| {
                let mut cmd = db.flow();
                if i == 0 {
                    cmd.arg("run")
                        .arg(crate::support::repo().join("workflows/hello.yaml"));
                } else {
                    // Writers: read commands do not create a missing ledger.
                    cmd.arg("migrate");
                }
                cmd.stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn flow")
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().expect("wait");
            assert_eq!(
                out.status.code(),
                Some(0),
                "round {round}: {}",
                stderr(&out)
            );
        }
    }
}

/// `flow cancel` of a run whose holder died ends it at once (nobody is left to see a
/// request), and says so; a run held by a live process only gets the request.
#[test]
fn cancel_of_a_dead_holders_run_ends_it_at_once() {
    for backend in backends() {
        let db = TestDb::new(backend);
        let file = db.write(
            "w.yaml",
            "name: slow\ntools:\n  s: { kind: function, function: core.sleep }\nnodes:\n  a: { tool: s, with: { duration: 20s } }\n",
        );
        let migrated = output(db.flow().arg("migrate"));
        assert_eq!(migrated.status.code(), Some(0), "{}", stderr(&migrated));
        let mut child = db
            .flow()
            .arg("run")
            .arg(&file)
            .args(["--run-id", "doomed-1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let started = Instant::now();
        loop {
            let shown = output(db.flow().args(["show", "doomed-1", "--json"]));
            let running = shown.status.code() == Some(0)
                && serde_json::from_slice::<serde_json::Value>(&shown.stdout)
                    .is_ok_and(|v| v["run"]["status"] == "running");
            if running {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{backend:?}: the run never started"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // A live holder: only a request.
        let live = output(db.flow().args(["cancel", "doomed-1"]));
        assert_eq!(live.status.code(), Some(0), "{}", stderr(&live));
        assert!(
            stderr(&live).contains("cancellation requested"),
            "{backend:?}: {}",
            stderr(&live)
        );
        // SIGKILL: the holder is gone, its lease still has ~30 s to run. `flow show`
        // says so and prints the command that continues the run.
        let _ = child.kill();
        let _ = child.wait();
        let shown = output(db.flow().args(["show", "doomed-1"]));
        let text = stdout(&shown);
        assert!(
            text.contains("held by ") && text.contains("its process is gone"),
            "{backend:?}: {text}"
        );
        assert!(
            text.contains(&format!(
                "continue with: flow --db {} resume doomed-1",
                db.url
            )),
            "{backend:?}: {text}"
        );
        assert!(text.contains("  inputs {}"), "{backend:?}: {text}");
        let out = output(db.flow().args(["cancel", "doomed-1"]));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("cancelled at once") && stderr(&out).contains("is gone"),
            "{backend:?}: {}",
            stderr(&out)
        );
        let s = show(&db, "doomed-1");
        assert_eq!(s["run"]["status"], "cancelled", "{backend:?}: {s:#}");
    }
}

/// `flow runs` pages with a cursor (each page's last line on stderr is the command for
/// the next), filters by workflow and creation time, prints a header row, and refuses
/// `--limit 0` instead of listing 100.
#[test]
fn runs_are_listed_in_pages_with_filters() {
    for backend in backends() {
        let db = TestDb::new(backend);
        let hello = repo().join("workflows/hello.yaml");
        for i in 0..5 {
            let out = output(db.flow().arg("run").arg(&hello).args([
                "--run-id",
                &format!("page-{i}"),
                "--input",
                "name=x",
            ]));
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        }
        let retries = output(
            db.flow()
                .arg("run")
                .arg(repo().join("workflows/retries.yaml")),
        );
        let other = run_id(&retries);
        let mut seen = Vec::new();
        let mut args = vec![
            "runs".to_string(),
            "--workflow".into(),
            "hello".into(),
            "--limit".into(),
            "2".into(),
        ];
        for page in 0.. {
            assert!(page < 5, "{backend:?}: paging never ended");
            let out = output(db.flow().args(&args));
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            let text = stdout(&out);
            let mut lines = text.lines();
            assert!(
                lines.next().is_some_and(|h| h.starts_with("RUN ")),
                "{backend:?}: header row: {text}"
            );
            seen.extend(lines.map(|l| l.split_whitespace().next().unwrap_or_default().to_string()));
            let Some(next) = stderr(&out)
                .lines()
                .find_map(|l| l.split_once("--cursor ").map(|(_, c)| c.trim().to_string()))
            else {
                break;
            };
            args.truncate(5);
            args.extend(["--cursor".into(), next]);
        }
        assert_eq!(
            seen,
            ["page-4", "page-3", "page-2", "page-1", "page-0"],
            "{backend:?}: newest first, each once, the other workflow filtered out"
        );
        let all = output(db.flow().args(["runs", "--since", "1h"]));
        assert!(
            stdout(&all).contains(&other),
            "{backend:?}: {}",
            stdout(&all)
        );
        let none = output(db.flow().args(["runs", "--until", "2000-01-01T00:00:00Z"]));
        assert_eq!(
            stdout(&none).lines().count(),
            1,
            "{backend:?}: only the header"
        );
        let zero = output(db.flow().args(["runs", "--limit", "0"]));
        assert_eq!(zero.status.code(), Some(2), "{backend:?}");
        let bad = output(db.flow().args(["runs", "--since", "yesterday-ish"]));
        assert_eq!(bad.status.code(), Some(2), "{backend:?}");
    }
}

/// Three HTTP nodes in a row, `first`, `second`, `third`, at the counting server `url`.
fn three_calls(db: &TestDb, url: &str) -> std::path::PathBuf {
    db.write(
        "w.yaml",
        &format!(
            "name: interrupt\ntools:\n  api: {{ kind: http, method: POST, url: \"{url}/first\", timeout: 10s }}\n  next: {{ kind: http, method: POST, url: \"{url}/second\", timeout: 10s }}\n  last: {{ kind: http, method: POST, url: \"{url}/third\", timeout: 10s }}\nnodes:\n  first: {{ tool: api, with: {{ n: 1 }} }}\n  second: {{ tool: next, needs: [first], with: {{ n: 2 }} }}\n  third: {{ tool: last, needs: [second], with: {{ n: 3 }} }}\n"
        ),
    )
}

/// Starts `flow ARGS` with stderr in a file, waits until the server has received
/// `calls` requests (the last one held in flight), sends `signal` (`INT`, `TERM`) once,
/// and returns the exit code and stderr.
fn signal_in_flight(
    db: &TestDb,
    args: &[&std::ffi::OsStr],
    server: &flow_adapters::testkit::http::CountingServer,
    calls: u32,
    signal: &str,
) -> (Option<i32>, String) {
    let log = db.write("run.log", "");
    let mut child = db
        .flow()
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn");
    let started = Instant::now();
    while server.total() < calls {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "call {calls} never left"
        );
        if let Some(status) = child.try_wait().expect("try_wait") {
            let err = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("flow exited ({status}) before call {calls} left: {err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let kill = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = child.wait().expect("wait");
    (
        status.code(),
        std::fs::read_to_string(&log).unwrap_or_default(),
    )
}

/// Ctrl-C during `flow run`: no new step starts, the call in flight finishes and is
/// recorded, the lease is released, the command to continue is printed, exit 130; the
/// resume then sends only what had not been sent.
#[test]
fn ctrl_c_stops_starting_steps_and_leaves_a_resumable_run() {
    use flow_adapters::testkit::http::{Behavior, CountingServer};
    let rt = crate::support::runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    server.set("/first", Behavior::hold(Duration::from_millis(1_500)));
    let db = TestDb::new(Backend::Sqlite);
    let file = three_calls(&db, &server.url());
    let args: [&std::ffi::OsStr; 4] = [
        "run".as_ref(),
        file.as_os_str(),
        "--run-id".as_ref(),
        "ctrl-c-1".as_ref(),
    ];
    let (code, err) = signal_in_flight(&db, &args, &server, 1, "INT");
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("interrupted: no new steps start"), "{err}");
    assert!(
        err.contains(&format!(
            "continue with: flow --db {} resume ctrl-c-1",
            db.url
        )),
        "{err}"
    );
    assert_eq!(server.total(), 1, "the second node never started");
    assert_eq!(server.completed_total(), 1, "the call in flight finished");
    let s = show(&db, "ctrl-c-1");
    assert_eq!(s["run"]["status"], "queued", "released: {s:#}");
    let resumed = output(db.flow().args(["resume", "ctrl-c-1"]));
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert_eq!(
        server.count("ctrl-c-1:first:1"),
        1,
        "the first call was not sent again"
    );
    assert_eq!(server.count("ctrl-c-1:second:1"), 1);
    assert_eq!(server.count("ctrl-c-1:third:1"), 1);
}

/// SIGTERM (what `kill`, `timeout`, systemd and Kubernetes send) drains `flow run` and
/// `flow resume` exactly as Ctrl-C does: exit 130, the call in flight finished and
/// recorded as it ended (never in doubt), the run released to the queue, not left
/// `running`; the last resume sends only what had not been sent. Issue 49: SIGTERM
/// killed the process (exit 143), leaving the run `running` and its call in doubt.
#[test]
fn sigterm_drains_run_and_resume_like_ctrl_c() {
    use crate::support::call;
    use flow_adapters::testkit::http::{Behavior, CountingServer};
    let rt = crate::support::runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    server.set("/first", Behavior::hold(Duration::from_millis(1_500)));
    server.set("/second", Behavior::hold(Duration::from_millis(1_500)));
    let db = TestDb::new(Backend::Sqlite);
    let file = three_calls(&db, &server.url());
    let run: [&std::ffi::OsStr; 4] = [
        "run".as_ref(),
        file.as_os_str(),
        "--run-id".as_ref(),
        "term-1".as_ref(),
    ];
    let (code, err) = signal_in_flight(&db, &run, &server, 1, "TERM");
    assert_eq!(code, Some(130), "as Ctrl-C: {err}");
    assert!(err.contains("interrupted: no new steps start"), "{err}");
    assert!(err.contains("SIGTERM received"), "{err}");
    assert!(
        err.contains(&format!(
            "continue with: flow --db {} resume term-1",
            db.url
        )),
        "{err}"
    );
    assert_eq!(server.total(), 1, "the second node never started");
    assert_eq!(server.completed_total(), 1, "the call in flight finished");
    let s = show(&db, "term-1");
    assert_eq!(s["run"]["status"], "queued", "released: {s:#}");
    assert_eq!(
        call(&s, "first")["status"],
        "succeeded",
        "not in doubt: {s:#}"
    );

    let resume: [&std::ffi::OsStr; 2] = ["resume".as_ref(), "term-1".as_ref()];
    let (code, err) = signal_in_flight(&db, &resume, &server, 2, "TERM");
    assert_eq!(code, Some(130), "resume drains too: {err}");
    assert_eq!(server.completed_total(), 2, "the call in flight finished");
    let s = show(&db, "term-1");
    assert_eq!(s["run"]["status"], "queued", "released: {s:#}");
    assert_eq!(
        call(&s, "second")["status"],
        "succeeded",
        "not in doubt: {s:#}"
    );

    let resumed = output(db.flow().args(["resume", "term-1"]));
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert_eq!(server.count("term-1:first:1"), 1, "sent once");
    assert_eq!(server.count("term-1:second:1"), 1, "sent once");
    assert_eq!(server.count("term-1:third:1"), 1);
}
