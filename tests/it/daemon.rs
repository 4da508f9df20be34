//! `flow submit` and `flow daemon` through the real binary: several daemon processes
//! draining one queue while one is SIGKILLed, graceful and immediate shutdown, the
//! database going away under a running daemon, LISTEN/NOTIFY wake-ups, metrics, JSON
//! logs, and the bad conditions (database unreachable at start, bad submits).
//!
//! The downstream is a `CountingServer` that records every request's Idempotency-Key on
//! arrival; the guarantees are checked there, not in the ledger.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::{Behavior, CountingServer};
use flow_ledger::{Ledger, NewRun, OpenOptions, RunFilter, RunStatus};

use crate::support::{
    Backend, TestDb, backends, output, postgres_available, runtime, show, stderr, stdout,
};

/// A chain of three side-effecting POSTs (no idempotency: unknown outcomes go in doubt).
fn chain(url: &str) -> String {
    format!(
        r#"name: chain3
inputs:
  i: {{ type: integer, required: true }}
tools:
  effect: {{ kind: http, method: POST, url: "{url}/effect/${{{{ with.node }}}}", timeout: 10s }}
nodes:
  a: {{ tool: effect, with: {{ node: a, i: "${{{{ inputs.i }}}}" }} }}
  b: {{ tool: effect, needs: [a], with: {{ node: b }} }}
  c: {{ tool: effect, needs: [b], with: {{ node: c }} }}
"#
    )
}

/// `slow` then `next`: a stop during `slow` must not start `next`.
fn slow_then_next(url: &str) -> String {
    format!(
        r#"name: slow
tools:
  post: {{ kind: http, method: POST, url: "{url}/${{{{ with.path }}}}", timeout: 20s }}
nodes:
  slow: {{ tool: post, with: {{ path: slow }} }}
  next: {{ tool: post, needs: [slow], with: {{ path: next }} }}
"#
    )
}

mod kill;
mod skew;
mod sqlite_health;

/// A `flow daemon` child whose stderr goes to a file in the test directory.
pub(crate) struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    pub(crate) fn start(db: &TestDb, name: &str, args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let log = db.dir.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("daemon log file");
        let mut cmd = db.flow();
        cmd.arg("daemon")
            .args(args)
            .stdout(Stdio::null())
            .stderr(file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn flow daemon");
        Daemon { child, log }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and reap it.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub(crate) fn signal(&self, sig: &str) {
        let status = std::process::Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {sig} failed");
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the exit, failing the test after `limit`.
    pub(crate) fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                panic!("daemon did not exit within {limit:?}; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn open_ledger(rt: &tokio::runtime::Runtime, db: &TestDb) -> Ledger {
    rt.block_on(Ledger::open(&db.url, OpenOptions::default()))
        .expect("open ledger")
}

fn statuses(rt: &tokio::runtime::Runtime, ledger: &Ledger) -> HashMap<String, RunStatus> {
    let filter = RunFilter {
        status: None,
        limit: 10_000,
        ..Default::default()
    };
    rt.block_on(ledger.list_runs(filter))
        .expect("list runs")
        .into_iter()
        .map(|r| (r.id, r.status))
        .collect()
}

/// Polls until `done` holds, failing after `limit` with `what`.
pub(crate) fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "timed out after {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(crate) fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// A plain HTTP/1.0 GET: status code and body (`None` if nothing listens yet).
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// Enqueues through the library (the bulk of a big test; `flow submit` is exercised
/// beside it and by its own tests).
fn enqueue(rt: &tokio::runtime::Runtime, ledger: &Ledger, text: &str, id: &str, i: usize) {
    let run = NewRun {
        id: id.to_string(),
        workflow_name: "chain3".into(),
        workflow_text: text.to_string(),
        inputs: serde_json::json!({ "i": i }),
        priority: 0,
        not_before: None,
        trace_parent: None,
    };
    rt.block_on(ledger.enqueue(run, flow_ledger::Clock::now(&flow_ledger::SystemClock)))
        .expect("enqueue");
}

fn submit(db: &TestDb, file: &PathBuf) -> String {
    let out = output(db.flow().arg("submit").arg(file));
    assert_eq!(out.status.code(), Some(0), "submit: {}", stderr(&out));
    stdout(&out).trim().to_string()
}

#[test]
fn sigterm_lets_the_call_in_flight_finish_and_releases_the_run() {
    for backend in backends() {
        let rt = runtime();
        let server = rt.block_on(CountingServer::start()).expect("server");
        server.set("/slow", Behavior::hold(Duration::from_millis(1500)));
        let db = TestDb::new(backend);
        let file = db.write("slow.yaml", &slow_then_next(&server.url()));
        let run = submit(&db, &file);
        let mut d = Daemon::start(&db, "d", &["--poll-interval", "100ms"], &[]);
        wait_until(Duration::from_secs(20), "the slow call to arrive", || {
            server.total() >= 1
        });
        let asked = Instant::now();
        d.signal("-TERM");
        let status = d.wait(Duration::from_secs(20));
        let ctx = format!("{backend:?}: daemon log:\n{}", d.log());
        assert_eq!(status.code(), Some(0), "{ctx}");
        assert!(
            asked.elapsed() >= Duration::from_millis(800),
            "the daemon must wait for the slow call: {ctx}"
        );
        let s = show(&db, &run);
        assert_eq!(s["run"]["status"], "queued", "{ctx}\n{s:#}");
        let calls = s["tool_calls"].as_array().expect("calls");
        assert_eq!(calls.len(), 1, "`next` must not start: {s:#}");
        assert_eq!(calls[0]["status"], "succeeded", "{s:#}");
        assert_eq!(server.total(), 1);

        let mut later = Daemon::start(&db, "later", &["--exit-when-idle"], &[]);
        assert_eq!(later.wait(Duration::from_secs(20)).code(), Some(0));
        let s = show(&db, &run);
        assert_eq!(s["run"]["status"], "succeeded", "{s:#}");
        for c in s["tool_calls"].as_array().expect("calls") {
            let key = c["current_key"].as_str().expect("key");
            assert_eq!(server.count(key), 1, "{key}: {s:#}");
        }
    }
}

#[test]
fn a_second_signal_stops_at_once_and_the_call_is_found_in_doubt() {
    for backend in backends() {
        let rt = runtime();
        let server = rt.block_on(CountingServer::start()).expect("server");
        server.set("/slow", Behavior::HoldUntilReleased);
        let db = TestDb::new(backend);
        let file = db.write("slow.yaml", &slow_then_next(&server.url()));
        let run = submit(&db, &file);
        let mut d = Daemon::start(&db, "d", &["--poll-interval", "100ms"], &[]);
        wait_until(Duration::from_secs(20), "the slow call to arrive", || {
            server.total() >= 1
        });
        d.signal("-TERM");
        // The second signal only after the first was taken (two close together may
        // arrive as one): the daemon says so.
        wait_until(
            Duration::from_secs(20),
            "the first signal to be taken",
            || d.log().contains("stopping: no new runs"),
        );
        d.signal("-TERM");
        // A daemon that waited for the held call would exit 0 after its 30 s grace:
        // 143 within 20 s is the proof.
        let status = d.wait(Duration::from_secs(20));
        assert_eq!(status.code(), Some(143), "{backend:?}: {}", d.log());
        server.release();
        // The holder is provably dead on this host: the next daemon finds the call in
        // doubt at once and pauses the run instead of sending again.
        let mut later = Daemon::start(&db, "later", &["--exit-when-idle"], &[]);
        assert_eq!(later.wait(Duration::from_secs(20)).code(), Some(0));
        let s = show(&db, &run);
        assert_eq!(s["run"]["status"], "paused", "{backend:?}: {s:#}");
        assert_eq!(crate::support::call(&s, "slow")["status"], "in_doubt");
        assert_eq!(server.total(), 1, "never sent twice");
    }
}

#[test]
fn a_queued_run_wakes_a_listening_daemon_without_waiting_for_the_poll() {
    if !postgres_available() {
        return;
    }
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(Backend::Postgres);
    let file = db.write("slow.yaml", &slow_then_next(&server.url()));
    let addr = free_port();
    let addr_arg = addr.to_string();
    let mut d = Daemon::start(
        &db,
        "d",
        &["--poll-interval", "1h", "--metrics-addr", &addr_arg],
        &[],
    );
    // The first claim happens after LISTEN: from then on a submit wakes the daemon.
    wait_until(Duration::from_secs(20), "the daemon's first claim", || {
        http_get(addr, "/metrics").is_some_and(|(_, body)| {
            !body.contains("flow_claim_duration_seconds_count 0")
                && body.contains("flow_claim_duration_seconds_count")
        })
    });
    let submitted = Instant::now();
    let run = submit(&db, &file);
    wait_until(Duration::from_secs(10), "the run to succeed", || {
        show(&db, &run)["run"]["status"] == "succeeded"
    });
    assert!(
        submitted.elapsed() < Duration::from_secs(10),
        "woken by NOTIFY, not by the hourly poll"
    );
    d.signal("-TERM");
    assert_eq!(
        d.wait(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        d.log()
    );
}

#[test]
fn metrics_healthz_and_json_logs_carry_the_ids() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("slow.yaml", &slow_then_next(&server.url()));
    let runs: Vec<String> = (0..3).map(|_| submit(&db, &file)).collect();
    let addr = free_port();
    let addr_arg = addr.to_string();
    let mut d = Daemon::start(
        &db,
        "d",
        &["--poll-interval", "100ms", "--metrics-addr", &addr_arg],
        &[("RUST_LOG", "info")],
    );
    wait_until(Duration::from_secs(20), "three runs to succeed", || {
        runs.iter()
            .all(|r| show(&db, r)["run"]["status"] == "succeeded")
    });
    let (code, body) = http_get(addr, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    for line in [
        "flow_runs{status=\"succeeded\"} 3",
        "flow_queue_depth 0",
        "flow_oldest_in_doubt_seconds 0",
        "flow_database_up 1",
        "flow_daemon_runs_finished_total{status=\"succeeded\"} 3",
        // Calls are counted and timed per tool (and outcome).
        "flow_tool_calls_total{tool=\"post\",outcome=\"succeeded\"} 6",
        "flow_tool_call_duration_seconds_count{tool=\"post\"} 6",
        "flow_daemon_runs_in_flight 0",
    ] {
        assert!(body.lines().any(|l| l == line), "no `{line}` in:\n{body}");
    }
    let build = format!(
        "flow_build_info{{version=\"{}\",commit=\"",
        env!("CARGO_PKG_VERSION")
    );
    assert!(
        body.lines()
            .any(|l| l.starts_with(&build) && l.ends_with("\"} 1")),
        "no `{build}…` in:\n{body}"
    );
    assert!(
        body.contains("flow_claim_duration_seconds_bucket{le="),
        "{body}"
    );
    let resident = body
        .lines()
        .find_map(|l| l.strip_prefix("flow_process_resident_memory_bytes "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(
        resident.is_some_and(|b| b > 1_000_000),
        "process memory: {body}"
    );
    assert!(
        body.lines()
            .any(|l| l.starts_with("flow_process_open_fds ")),
        "{body}"
    );
    assert_eq!(http_get(addr, "/healthz").map(|r| r.0), Some(200));
    d.signal("-TERM");
    assert_eq!(d.wait(Duration::from_secs(10)).code(), Some(0));

    // JSON logs: a step line carries the run (its span), the step and the call.
    let db2 = TestDb::new(Backend::Sqlite);
    let file = db2.write("slow.yaml", &slow_then_next(&server.url()));
    let run = submit(&db2, &file);
    let out = output(db2.flow().env("RUST_LOG", "info").args([
        "--log-format",
        "json",
        "daemon",
        "--exit-when-idle",
    ]));
    assert_eq!(out.status.code(), Some(0));
    let text = stderr(&out);
    let step_line = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["message"] == "step finished" && v["step"] == "next")
        .unwrap_or_else(|| panic!("no JSON `step finished` line for `next` in:\n{text}"));
    assert_eq!(step_line["call"], "next", "{step_line}");
    assert_eq!(step_line["span"]["run"], run.as_str(), "{step_line}");
}

#[test]
fn losing_the_database_is_ridden_out_and_logged_once_per_change() {
    if !postgres_available() {
        return;
    }
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(Backend::Postgres);
    let file = db.write("slow.yaml", &slow_then_next(&server.url()));
    let addr = free_port();
    let addr_arg = addr.to_string();
    let mut d = Daemon::start(
        &db,
        "d",
        &["--poll-interval", "100ms", "--metrics-addr", &addr_arg],
        &[],
    );
    let first = submit(&db, &file);
    wait_until(Duration::from_secs(20), "the first run", || {
        show(&db, &first)["run"]["status"] == "succeeded"
    });
    let name = db.url.rsplit('/').next().expect("db name").to_string();
    let psql = |sql: &str| {
        let out = output(crate::support::pg_client("psql").args(["-d", "test", "-qc", sql]));
        assert!(out.status.success(), "{sql}: {}", stderr(&out));
    };
    psql(&format!("DROP DATABASE {name} WITH (FORCE)"));
    wait_until(
        Duration::from_secs(10),
        "/healthz to report the loss",
        || http_get(addr, "/healthz").is_some_and(|(code, _)| code == 503),
    );
    std::thread::sleep(Duration::from_secs(2));
    psql(&format!("CREATE DATABASE {name}"));
    let out = output(db.flow().arg("migrate"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let second = submit(&db, &file);
    wait_until(
        Duration::from_secs(20),
        "a run after the database came back",
        || show(&db, &second)["run"]["status"] == "succeeded",
    );
    assert_eq!(http_get(addr, "/healthz").map(|r| r.0), Some(200));
    d.signal("-TERM");
    assert_eq!(
        d.wait(Duration::from_secs(10)).code(),
        Some(0),
        "{}",
        d.log()
    );
    let log = d.log();
    assert_eq!(
        log.matches("database unreachable").count(),
        1,
        "one line per state change, not per retry:\n{log}"
    );
    assert_eq!(log.matches("database reachable again").count(), 1, "{log}");
}

/// A daemon whose every slot is taken claims nothing, so its claim loop never saw the
/// database go; its runs did. The loss is logged once, by the run that noticed it, and
/// the stop summary counts the run it could not release instead of calling it released.
#[test]
fn a_busy_daemon_logs_the_database_loss_and_counts_the_run_it_could_not_release() {
    if !postgres_available() {
        return;
    }
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    server.set("/slow", Behavior::hold(Duration::from_secs(2)));
    let db = TestDb::new(Backend::Postgres);
    let file = db.write("slow.yaml", &slow_then_next(&server.url()));
    let _run = submit(&db, &file);
    let mut d = Daemon::start(
        &db,
        "d",
        &[
            "--concurrency",
            "1",
            "--poll-interval",
            "100ms",
            "--grace",
            "1s",
        ],
        &[],
    );
    wait_until(Duration::from_secs(20), "the slow call to arrive", || {
        server.total() >= 1
    });
    let name = db.url.rsplit('/').next().expect("db name").to_string();
    let out = output(crate::support::pg_client("psql").args([
        "-d",
        "test",
        "-qc",
        &format!("DROP DATABASE {name} WITH (FORCE)"),
    ]));
    assert!(out.status.success(), "drop: {}", stderr(&out));
    let dropped = Instant::now();
    wait_until(
        Duration::from_secs(15),
        "the busy daemon to log the loss",
        || d.log().contains("database unreachable"),
    );
    eprintln!("logged {:?} after the drop", dropped.elapsed());
    d.signal("-TERM");
    let status = d.wait(Duration::from_secs(20));
    let log = d.log();
    assert_eq!(status.code(), Some(0), "{log}");
    assert_eq!(log.matches("database unreachable").count(), 1, "{log}");
    assert!(log.contains("noticed_by"), "{log}");
    let summary = log
        .lines()
        .rfind(|l| l.contains("flow daemon: stopped"))
        .unwrap_or_else(|| panic!("no summary:\n{log}"));
    assert!(
        summary.contains("1 could not be released") && !summary.contains("were released"),
        "{summary}\n{log}"
    );
}

#[test]
fn an_unreachable_database_at_start_exits_5_with_the_url_redacted() {
    let db = TestDb::new(Backend::Sqlite);
    let out = output(
        db.flow()
            .args(["--db", "postgres://flow:s3cret@127.0.0.1:1/flow", "daemon"]),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(
        err.contains("postgres://flow:***@127.0.0.1:1/flow"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
    assert!(err.to_lowercase().contains("refused"), "the reason: {err}");
}

#[test]
fn bad_submits_exit_2_and_enqueue_nothing() {
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("chain3.yaml", &chain("http://127.0.0.1:9"));
    let broken = db.write("broken.yaml", "name: x\nnodes:\n  a: { tool: nope }\n");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![broken.display().to_string()], "error:"),
        (vec![file.display().to_string()], "i"),
        (
            vec![
                file.display().to_string(),
                "--input".into(),
                "i=many".into(),
            ],
            "integer",
        ),
        (
            vec![
                file.display().to_string(),
                "--input".into(),
                "i=1".into(),
                "--run-id".into(),
                "no spaces".into(),
            ],
            "--run-id",
        ),
    ];
    for (args, says) in &cases {
        let out = output(db.flow().arg("submit").args(args));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
        assert!(stdout(&out).is_empty(), "{args:?}: printed a run id");
    }
    crate::support::no_runs(&db);

    // Idempotent with --run-id; the same id with other inputs is refused.
    let with = |i: &str| {
        output(db.flow().arg("submit").arg(&file).args([
            "--input",
            &format!("i={i}"),
            "--run-id",
            "order-42",
        ]))
    };
    for _ in 0..2 {
        let out = with("1");
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(stdout(&out).trim(), "order-42");
    }
    let out = with("2");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("different"), "{}", stderr(&out));
}

/// Every command ends its PostgreSQL sessions with a goodbye: a session whose client
/// just went away counts as abandoned (and the server logs "connection reset by peer"
/// for it), which an operator watching either would rightly take for crashes.
#[test]
fn commands_end_their_postgres_sessions_cleanly() {
    use sqlx::Connection as _;
    if !postgres_available() {
        return;
    }
    let rt = runtime();
    let db = TestDb::new(Backend::Postgres);
    let hello = crate::support::repo().join("workflows/hello.yaml");
    for args in [
        vec!["run", "--input", "name=Ada"],
        vec!["submit", "--input", "name=Bo"],
    ] {
        let out = output(db.flow().arg(args[0]).arg(&hello).args(&args[1..]));
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    }
    for args in [vec!["daemon", "--exit-when-idle"], vec!["runs", "--json"]] {
        let out = output(db.flow().args(&args));
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    }

    let mut conn = rt
        .block_on(sqlx::PgConnection::connect(&db.url))
        .expect("connect");
    let mut abandoned = || -> i64 {
        rt.block_on(
            sqlx::query_scalar(
                "SELECT sessions_abandoned FROM pg_stat_database WHERE datname = current_database()",
            )
            .fetch_one(&mut conn),
        )
        .expect("pg_stat_database")
    };
    // A backend counts its session when it notices the client gone: give it a moment.
    let deadline = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < deadline && abandoned() == 0 {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(abandoned(), 0, "sessions ended without a goodbye");
    rt.block_on(conn.close()).expect("close");
}
