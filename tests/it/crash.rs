//! Crash safety through the real binary: each `FLOW_FAULT` point on a side-effecting
//! HTTP node, then `flow resume` (and `--resolve` where in doubt), on both backends. The
//! downstream counts requests per Idempotency-Key; the guarantees are checked there.

use flow_adapters::testkit::http::CountingServer;

use crate::support::{
    Backend, TestDb, backends, call, output, run_id, runtime, show, stderr, stdout,
};

/// A pay workflow: a pure node, an HTTP side effect, a pure node (also used by the
/// events crash-point test).
pub(crate) fn workflow(url: &str) -> String {
    format!(
        r#"name: pay
tools:
  echo: {{ kind: function, function: core.echo }}
  pay: {{ kind: http, method: POST, url: "{url}/pay" }}
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

/// `--resolve` right after a crash, before anybody took the run over: the call is
/// still `outbound`, and the message says to resume first.
fn resolving_before_a_resume_is_refused(db: &TestDb, run: &str, ctx: &str) {
    let early = output(db.flow().args(["resume", run, "--resolve", "charge=retry"]));
    assert_eq!(early.status.code(), Some(2), "{ctx}: {}", stderr(&early));
    assert!(
        stderr(&early).contains(&format!("run `flow resume {run}` first")),
        "{ctx}: {}",
        stderr(&early)
    );
}

/// What each fault point must lead to.
struct Case {
    point: &'static str,
    /// Requests the downstream saw after the crash.
    arrived_before_resume: u32,
    /// Whether `flow resume` finds the call in doubt (exit 3).
    in_doubt: bool,
}

const CASES: [Case; 4] = [
    Case {
        point: "after_claim",
        arrived_before_resume: 0,
        in_doubt: false,
    },
    Case {
        point: "after_outbound",
        arrived_before_resume: 0,
        in_doubt: true,
    },
    Case {
        point: "after_response",
        arrived_before_resume: 1,
        in_doubt: true,
    },
    Case {
        point: "after_complete",
        arrived_before_resume: 1,
        in_doubt: false,
    },
];

fn fault_point(backend: Backend, case: &Case) {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(backend);
    let file = db.write("pay.yaml", &workflow(&server.url()));
    let ctx = format!("{backend:?} {}", case.point);

    let crashed = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("FLOW_FAULT", format!("{}:charge", case.point)),
    );
    assert_eq!(
        crashed.status.code(),
        None,
        "{ctx}: the fault must abort the process\n{}",
        stderr(&crashed)
    );
    let run = run_id(&crashed);
    let key = format!("{run}:charge:1");
    assert_eq!(
        server.count(&key),
        case.arrived_before_resume,
        "{ctx}: requests before resume"
    );

    if case.in_doubt {
        resolving_before_a_resume_is_refused(&db, &run, &ctx);
        assert_eq!(server.count(&key), case.arrived_before_resume, "{ctx}");
    }
    let resumed = output(db.flow().args(["resume", &run]));
    if case.in_doubt {
        assert_eq!(
            resumed.status.code(),
            Some(3),
            "{ctx}: resume must pause in doubt\n{}",
            stderr(&resumed)
        );
        let s = show(&db, &run);
        assert_eq!(s["run"]["status"], "paused", "{ctx}");
        assert_eq!(call(&s, "charge")["status"], "in_doubt", "{ctx}");
        let human = output(db.flow().args(["show", &run]));
        assert!(
            stdout(&human).contains(&format!(
                "flow --db {} resume {run} --resolve charge=succeeded",
                db.url
            )),
            "{ctx}: {}",
            stdout(&human)
        );
        assert_eq!(
            server.count(&key),
            case.arrived_before_resume,
            "{ctx}: nothing is re-sent blindly"
        );
        // The operator asks the downstream: arrived → succeeded, not arrived → retry.
        let settle = if server.count(&key) == 1 {
            output(db.flow().args([
                "resume",
                &run,
                "--resolve",
                "charge=succeeded",
                "--output",
                r#"{"count": 1}"#,
            ]))
        } else {
            output(
                db.flow()
                    .args(["resume", &run, "--resolve", "charge=retry"]),
            )
        };
        assert_eq!(
            settle.status.code(),
            Some(0),
            "{ctx}: after resolving\n{}",
            stderr(&settle)
        );
    } else {
        assert_eq!(
            resumed.status.code(),
            Some(0),
            "{ctx}: resume\n{}",
            stderr(&resumed)
        );
    }
    assert_eq!(
        server.count(&key),
        1,
        "{ctx}: the effect landed exactly once"
    );
    assert_eq!(server.total(), 1, "{ctx}: no other request was sent");
    let s = show(&db, &run);
    assert_eq!(s["run"]["status"], "succeeded", "{ctx}: {s:#}");
    let charge = call(&s, "charge");
    assert_eq!(charge["status"], "succeeded", "{ctx}");
    assert_eq!(charge["attempt_count"], 1, "{ctx}");
    let receipt_runs = s["steps"].as_array().map_or(0, |st| {
        st.iter().filter(|x| x["node_id"] == "receipt").count()
    });
    assert_eq!(receipt_runs, 1, "{ctx}: downstream node ran once");
    // Resuming a finished run redoes nothing.
    let again = output(db.flow().args(["resume", &run]));
    assert_eq!(again.status.code(), Some(0), "{ctx}");
    assert_eq!(
        server.total(),
        1,
        "{ctx}: a finished run is never re-executed"
    );
}

#[test]
fn each_fault_point_on_both_backends() {
    for backend in backends() {
        for case in &CASES {
            fault_point(backend, case);
        }
    }
}

#[test]
fn resolve_rejects_garbage_and_writes_nothing() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("pay.yaml", &workflow(&server.url()));
    let crashed = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("FLOW_FAULT", "after_response:charge"),
    );
    let run = run_id(&crashed);
    assert_eq!(
        output(db.flow().args(["resume", &run])).status.code(),
        Some(3)
    );
    let before = show(&db, &run);
    for args in [
        vec!["--resolve", "charge=succeeded", "--output", "{not json"],
        vec!["--resolve", "charge=succeeded"],
        vec!["--resolve", "nope=retry"],
        vec!["--resolve", "charge=maybe"],
        vec!["--resolve", "charge=retry", "--output", "{}"],
        vec!["--resolve", "prepare=succeeded", "--output", "{}"],
    ] {
        let out = output(db.flow().args(["resume", &run]).args(&args));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{args:?}");
    }
    assert_eq!(
        show(&db, &run)["tool_calls"],
        before["tool_calls"],
        "nothing was written"
    );
    assert_eq!(server.count(&format!("{run}:charge:1")), 1);
}

/// A ledger write that has to wait (another session holds the `steps` table) must not
/// wedge the run when kept pure results come due meanwhile. `charge` first records
/// `prepare`'s kept result, holding the run's pure log while its write waits on the
/// lock; 100 ms later the result is due, and the run loop flushes too. That flush once
/// waited for the log while the loop no longer polled the step holding it: the run hung
/// for good after "✓ prepare" (seen in CI as a stuck crash test). PostgreSQL only: a
/// SQLite writer lock also holds back the run's start, so the flush never meets it.
#[test]
fn a_waiting_ledger_write_does_not_wedge_the_run() {
    use sqlx::Connection as _;
    if !crate::support::postgres_available() {
        return;
    }
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(Backend::Postgres);
    let file = db.write("pay.yaml", &workflow(&server.url()));
    let migrated = output(db.flow().arg("migrate"));
    assert_eq!(migrated.status.code(), Some(0), "{}", stderr(&migrated));

    let hold = std::time::Duration::from_millis(1500);
    let mut conn = rt
        .block_on(sqlx::PgConnection::connect(&db.url))
        .expect("connect");
    rt.block_on(sqlx::raw_sql("BEGIN; LOCK TABLE steps IN EXCLUSIVE MODE").execute(&mut conn))
        .expect("lock steps");
    let release = rt.spawn(async move {
        tokio::time::sleep(hold).await;
        sqlx::raw_sql("COMMIT").execute(&mut conn).await.map(|_| ())
    });
    let started = std::time::Instant::now();
    let out = output(db.flow().arg("run").arg(&file));
    let took = started.elapsed();
    rt.block_on(release)
        .expect("join")
        .expect("release the lock");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        took >= hold,
        "the run must have met the lock (took {took:?}); otherwise this test shows nothing"
    );
    let run = run_id(&out);
    assert_eq!(server.count(&format!("{run}:charge:1")), 1);
    assert_eq!(show(&db, &run)["run"]["status"], "succeeded");
}

/// A cancelled run's in-doubt call cannot be re-sent: `--resolve NODE=retry` is refused
/// (exit 2, naming the cancellation and what is left) and writes nothing, on both
/// backends. (`succeeded` and `failed` are recorded: tests/it/doubt_budget.rs.)
#[test]
fn retrying_a_call_of_a_cancelled_run_is_refused_and_records_nothing() {
    for backend in backends() {
        let rt = runtime();
        let server = rt.block_on(CountingServer::start()).expect("server");
        let db = TestDb::new(backend);
        let file = db.write("pay.yaml", &workflow(&server.url()));
        let crashed = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .env("FLOW_FAULT", "after_outbound:charge"),
        );
        assert_eq!(crashed.status.code(), None, "{}", stderr(&crashed));
        let run = run_id(&crashed);
        let resumed = output(db.flow().args(["resume", &run]));
        assert_eq!(resumed.status.code(), Some(3), "{}", stderr(&resumed));
        let cancelled = output(db.flow().args(["cancel", &run]));
        assert_eq!(cancelled.status.code(), Some(0), "{}", stderr(&cancelled));
        let before = show(&db, &run);
        assert_eq!(before["run"]["status"], "cancelled", "{before:#}");
        let out = output(
            db.flow()
                .args(["resume", &run, "--resolve", "charge=retry"]),
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{backend:?}: {err}");
        assert!(err.contains("cancelled"), "{backend:?}: {err}");
        assert!(
            err.contains("charge=succeeded"),
            "{backend:?}: what is left: {err}"
        );
        assert!(!err.contains("resolved charge"), "{err}");
        let after = show(&db, &run);
        assert_eq!(after, before, "{backend:?}: nothing recorded");
        assert_eq!(call(&after, "charge")["status"], "in_doubt");
        let ledger = rt
            .block_on(flow_ledger::Ledger::open(
                &db.url,
                flow_ledger::OpenOptions::default(),
            ))
            .expect("open the ledger");
        let charge = rt
            .block_on(ledger.get_call(&run, "charge"))
            .expect("the call");
        assert_eq!(charge.resolution, None, "{backend:?}");
        let events = rt
            .block_on(ledger.list_events(flow_ledger::EventFilter::default()))
            .expect("events");
        assert!(
            events
                .iter()
                .all(|e| e.event_type != flow_ledger::EventType::ToolCallResolved),
            "{backend:?}: no resolution event"
        );
        rt.block_on(ledger.close());
        assert_eq!(server.count(&format!("{run}:charge:1")), 0, "never sent");
    }
}

/// `FLOW_FAULT` is read by release builds too, so a stray value would abort a daemon at
/// that node again and again: every command that runs workflows (`run`, `resume`,
/// `daemon`, `serve`) names the point and the node in a `warning:` line at start, before
/// anything else can fail; commands that run nothing stay quiet.
#[test]
fn a_set_flow_fault_is_announced_at_start() {
    let db = TestDb::new(Backend::Sqlite);
    let hello = crate::support::repo().join("workflows/hello.yaml");
    let hello = hello.display().to_string();
    // `serve` stops at once on an address in use, after its start warning.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy = busy.local_addr().expect("addr").to_string();
    let warning = "warning: FLOW_FAULT=after_claim:nowhere is set: this process aborts when node `nowhere` reaches after_claim";
    let with_fault = |args: &[&str]| {
        let out = output(
            db.flow()
                .args(args)
                .env("FLOW_FAULT", "after_claim:nowhere"),
        );
        (out.status.code(), stderr(&out))
    };
    let (code, err) = with_fault(&["run", &hello]);
    assert_eq!(code, Some(0), "{err}");
    let warned = |err: &str| err.lines().next().is_some_and(|l| l.starts_with(warning));
    assert!(warned(&err), "{err}");
    for args in [
        &["resume", "run_missing"][..],
        &["daemon", "--exit-when-idle"],
        &["serve", "--insecure-no-auth", "--addr", &busy],
    ] {
        let (_, err) = with_fault(args);
        assert!(warned(&err), "{args:?}: {err}");
    }
    for args in [&["validate", &hello][..], &["submit", &hello], &["runs"]] {
        let (code, err) = with_fault(args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(!err.contains("FLOW_FAULT"), "{args:?} runs nothing: {err}");
    }
    // In JSON log mode the warning is a JSON line at level WARN.
    let (code, err) = with_fault(&["--log-format", "json", "run", &hello]);
    assert_eq!(code, Some(0), "{err}");
    let first: serde_json::Value =
        serde_json::from_str(err.lines().next().unwrap_or_default()).expect("a JSON line");
    assert_eq!(first["level"], "WARN", "{err}");
    let message = first["message"].as_str().unwrap_or_default();
    assert!(message.starts_with(warning), "{err}");
    // A value that configures no fault is reported too, and the run goes on.
    let out = output(db.flow().args(["run", &hello]).env("FLOW_FAULT", "bogus"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with("warning: ignoring FLOW_FAULT=\"bogus\""),
        "{}",
        stderr(&out)
    );
}
