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
            stdout(&human).contains(&format!("flow resume {run} --resolve charge=succeeded")),
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
