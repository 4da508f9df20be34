//! Reconciliation beyond HTTP and the crash points: MCP and command probes, every crash
//! point against a truthful and a failing probe, and the egress allow-list, on both
//! backends.

use flow_adapters::testkit::http::{Behavior, CountingServer};

use crate::reconcile::{crash_at, effects, probes, resume_expect, workflow};
use crate::support::{Backend, TestDb, backends, call, output, run_id, runtime, show, stderr};

/// An MCP tool's probe is another tool of the same server: after a crash after the
/// response, `count_of` finds the key the `count` call was made with; the node succeeds
/// with the probe's answer and `count` is not called again.
fn mcp_probe(backend: Backend) {
    let rt = runtime();
    let server = rt
        .block_on(flow_adapters::testkit::mcp::HttpServer::start(None))
        .expect("mcp server");
    let db = TestDb::new(backend);
    let file = db.write(
        "mcp.yaml",
        &format!(
            r#"name: mcp-pay
tools:
  counter:
    kind: mcp
    server: {{ url: "{url}" }}
    tool: count
    reconcile:
      tool: count_of
      with: {{ key: "${{{{ call.request.with.key }}}}" }}
      found: "${{{{ response.body.count > 0 }}}}"
      not_found: "${{{{ response.body.count == 0 }}}}"
      after: 0s
nodes:
  charge: {{ tool: counter, with: {{ key: "order-7" }} }}
"#,
            url = server.url()
        ),
    );
    let (run, _) = crash_at(&db, &file, "after_response");
    assert_eq!(server.stats().count("order-7"), 1, "{backend:?}");
    resume_expect(&db, &run, 0, &format!("{backend:?}"));
    assert_eq!(
        server.stats().count("order-7"),
        1,
        "{backend:?}: no second effect"
    );
    let s = show(&db, &run);
    assert_eq!(
        call(&s, "charge")["resolution"]["by"],
        "reconcile",
        "{backend:?}"
    );
    assert_eq!(s["run"]["output"]["charge"]["count"], 1, "{backend:?}: {s}");
}

#[test]
fn an_mcp_tool_is_probed_through_another_tool_of_its_server() {
    for b in backends() {
        mcp_probe(b);
    }
}

/// A command tool's probe is another program; it reads the call on stdin. The effect
/// never happened (crash after the outbound mark), so the command runs once.
fn command_probe(backend: Backend) {
    let db = TestDb::new(backend);
    let effects = db.dir.path().join("effects.log");
    let effects = effects.display();
    let file = db.write(
        "cmd.yaml",
        &format!(
            r#"name: cmd-pay
tools:
  pay:
    kind: command
    command: ["sh", "-c", "cat >> {effects}; echo >> {effects}; echo '{{\"paid\": true}}'"]
    reconcile:
      command: ["sh", "-c", "cat > /dev/null; if [ -s {effects} ]; then echo '{{\"found\": true}}'; else echo '{{\"found\": false}}'; fi"]
      found: "${{{{ response.body.found }}}}"
      not_found: "${{{{ not response.body.found }}}}"
      after: 0s
nodes:
  charge: {{ tool: pay, with: {{ amount: 10 }} }}
"#
        ),
    );
    let (run, _) = crash_at(&db, &file, "after_outbound");
    resume_expect(&db, &run, 0, &format!("{backend:?}"));
    let log = std::fs::read_to_string(db.dir.path().join("effects.log")).unwrap_or_default();
    assert_eq!(
        log.lines().filter(|l| !l.is_empty()).count(),
        1,
        "{backend:?}: {log:?}"
    );
    let s = show(&db, &run);
    assert_eq!(
        call(&s, "charge")["resolution"]["how"],
        "retry",
        "{backend:?}"
    );
    assert_eq!(
        probes(&s, "charge")[0]["observed"],
        "not_found",
        "{backend:?}"
    );
}

#[test]
fn a_command_tool_is_probed_by_another_program() {
    for b in backends() {
        command_probe(b);
    }
}

/// Every crash point × what the probe can say. A truthful probe settles every in-doubt
/// point with one effect in all; a probe that cannot answer leaves exactly the in-doubt
/// points paused (nothing re-sent), and the points that are not in doubt never probe.
#[test]
fn crash_points_by_probe_answers() {
    let rt = runtime();
    // (point, whether the call is in doubt after it, effects before resume)
    let points = [
        ("after_claim", false, 0),
        ("after_outbound", true, 0),
        ("after_response", true, 1),
        ("after_complete", false, 1),
    ];
    for backend in backends() {
        for (point, in_doubt, before) in points {
            for truthful in [true, false] {
                let ctx = format!("{backend:?} {point} truthful={truthful}");
                let server = rt.block_on(CountingServer::start()).expect("server");
                let broken = rt.block_on(CountingServer::start()).expect("probe server");
                broken.set("*", Behavior::status(500));
                let probe = if truthful {
                    effects(&server)
                } else {
                    format!("{}/effects", broken.url())
                };
                let db = TestDb::new(backend);
                let file = db.write("pay.yaml", &workflow(&server.url(), &probe, "0s", 2));
                let crashed = output(
                    db.flow()
                        .arg("run")
                        .arg(&file)
                        .env("FLOW_FAULT", format!("{point}:charge")),
                );
                let run = run_id(&crashed);
                let key = format!("{run}:charge:1");
                assert_eq!(server.count(&key), before, "{ctx}");
                let resumed = output(db.flow().args(["resume", &run]));
                let s = show(&db, &run);
                let probed = probes(&s, "charge").len();
                if in_doubt && !truthful {
                    assert_eq!(
                        resumed.status.code(),
                        Some(3),
                        "{ctx}: {}",
                        stderr(&resumed)
                    );
                    assert_eq!(server.count(&key), before, "{ctx}: nothing re-sent");
                    assert_eq!(probed, 2, "{ctx}");
                } else {
                    assert_eq!(
                        resumed.status.code(),
                        Some(0),
                        "{ctx}: {}",
                        stderr(&resumed)
                    );
                    assert_eq!(server.count(&key), 1, "{ctx}: one effect in all");
                    assert_eq!(
                        probed,
                        usize::from(in_doubt),
                        "{ctx}: probed only when in doubt"
                    );
                }
            }
        }
    }
}

/// A probe obeys the egress allow-list like any request: a probe to a host outside it is
/// not sent, the call stays in doubt (nothing settled, nothing re-sent), and the reason
/// is logged. Probes that are sent count as usage of kind `probe`.
#[test]
fn a_probe_outside_the_egress_allow_list_is_not_sent() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        let db = TestDb::new(backend);
        let config = db.write("flow.toml", "[egress]\nallow = [\"127.0.0.1\"]\n");
        let outside = effects(&server).replace("127.0.0.1", "localhost");
        let file = db.write("pay.yaml", &workflow(&server.url(), &outside, "0s", 2));
        let crashed = output(
            db.flow()
                .arg("--config")
                .arg(&config)
                .arg("run")
                .arg(&file)
                .env("FLOW_FAULT", "after_outbound:charge"),
        );
        let run = run_id(&crashed);
        let resumed = output(
            db.flow()
                .arg("--config")
                .arg(&config)
                .args(["resume", &run]),
        );
        assert_eq!(
            resumed.status.code(),
            Some(3),
            "{backend:?}: {}",
            stderr(&resumed)
        );
        assert!(
            stderr(&resumed).contains("egress to `localhost` is not allowed"),
            "{backend:?}: {}",
            stderr(&resumed)
        );
        let s = show(&db, &run);
        assert!(
            probes(&s, "charge").is_empty(),
            "{backend:?}: no probe was sent"
        );
        assert_eq!(call(&s, "charge")["status"], "in_doubt", "{backend:?}");
        assert_eq!(
            server.total(),
            0,
            "{backend:?}: nothing reached the downstream"
        );
    }
}
