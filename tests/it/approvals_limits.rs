//! Approvals' limits, through the real binary on both backends: a decision after the
//! deadline is refused and nothing is sent; `forbid_self` knows who started a CLI run.

use std::time::Duration;

use flow_adapters::testkit::http::CountingServer;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::{ADMIN, call, serve};
use crate::approvals::{approval, events, workflow};
use crate::support::{TestDb, backends, output, run_id, runtime, show, stderr, stdout};

/// No daemon, so no sweep: past the approval's deadline it is listed `timed_out`, not
/// waiting; an approve through the CLI is exit 2 and a deny through the API 409, both
/// naming the deadline; the run then goes on with `on_timeout` and the downstream
/// never sees a request. Issue 49: an approve 4 s late was accepted and the request
/// sent by the next resume.
#[test]
fn a_decision_after_the_deadline_is_refused_and_nothing_is_sent_on_both_backends() {
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let rt = runtime();
        let down = rt.block_on(CountingServer::start()).expect("downstream");
        let db = TestDb::new(backend);
        let file = db.write(
            "refund.yaml",
            &workflow(&down.url(), "      timeout: 1s\n      on_timeout: fail"),
        );
        let paused = output(db.flow().arg("run").arg(&file));
        assert_eq!(paused.status.code(), Some(3), "{ctx}: {}", stderr(&paused));
        let run = run_id(&paused);
        let all = || {
            let out = output(db.flow().args(["approvals", "--all", "--json"]));
            assert_eq!(out.status.code(), Some(0), "{ctx}: {}", stderr(&out));
            serde_json::from_str::<Value>(&stdout(&out)).expect("json")
        };
        let deadline = all()[0]["deadline"].as_str().expect("deadline").to_owned();
        let at = flow_ledger::Timestamp::parse_rfc3339(&deadline).expect("rfc3339");
        // The deadline is a time: waiting for it is the one wait this test cannot avoid.
        let left = at.0 - flow_ledger::Clock::now(&flow_ledger::SystemClock).0;
        if let Ok(ms) = u64::try_from(left) {
            std::thread::sleep(Duration::from_millis(ms + 1));
        }

        let waiting = output(db.flow().args(["approvals", "--json"]));
        assert_eq!(stdout(&waiting).trim(), "[]", "{ctx}: not waiting any more");
        assert_eq!(all()[0]["status"], "timed_out", "{ctx}: listed timed out");

        let late = output(db.flow().args(["approve", &run, "refund", "--by", "alice"]));
        assert_eq!(late.status.code(), Some(2), "{ctx}: {}", stderr(&late));
        assert!(
            stderr(&late).contains(&format!("timed out at its deadline {deadline}")),
            "{ctx}: {}",
            stderr(&late)
        );

        let server = serve(&db);
        let path = format!("/api/v1/runs/{run}/approvals/refund");
        let deny = json!({ "decision": "deny", "reason": "late" });
        let (st, body) = rt.block_on(call(&server, "POST", &path, Some(ADMIN), Some(deny)));
        assert_eq!(st, StatusCode::CONFLICT, "{ctx}: {body}");
        let named = body["detail"]
            .as_str()
            .is_some_and(|d| d.contains(&deadline));
        assert!(named, "{ctx}: names the deadline: {body}");
        drop(server);

        let resumed = output(db.flow().args(["resume", &run]));
        let ended = (resumed.status.code(), stderr(&resumed));
        assert_eq!(ended.0, Some(1), "{ctx}: on_timeout fails it: {}", ended.1);
        assert_eq!(down.total(), 0, "{ctx}: nothing is sent after the deadline");
        let s = show(&db, &run);
        assert_eq!(approval(&s)["status"], "timed_out", "{ctx}: {s}");
        assert_eq!(approval(&s)["decided_by"], Value::Null, "{ctx}: {s}");
        assert_eq!(events(&db, &run, "approval.decided"), 0, "{ctx}");
        assert_eq!(events(&db, &run, "approval.timed_out"), 1, "{ctx}: once");
    }
}

/// `forbid_self` on a run started from the CLI: the run records who started it
/// (`USER@host`, what `flow approve` decides under by default), so the same person is
/// refused and another is not. Before, a CLI run recorded nobody and the rule let anyone
/// through — its starter included; a child run recorded nobody either (its root's
/// starter is used now; `ledger/src/approvals/rows.rs`, `submitter`).
#[test]
fn forbid_self_refuses_the_cli_user_who_started_the_run_on_both_backends() {
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let rt = runtime();
        let down = rt.block_on(CountingServer::start()).expect("downstream");
        let db = TestDb::new(backend);
        let gate = "      forbid_self: true\n      timeout: 1h";
        let file = db.write("refund.yaml", &workflow(&down.url(), gate));
        let paused = output(db.flow().arg("run").arg(&file).env("USER", "mallory"));
        assert_eq!(paused.status.code(), Some(3), "{ctx}: {}", stderr(&paused));
        let run = run_id(&paused);
        let own = output(
            db.flow()
                .args(["approve", &run, "refund"])
                .env("USER", "mallory"),
        );
        assert_eq!(own.status.code(), Some(2), "{ctx}: {}", stderr(&own));
        assert!(
            stderr(&own).contains("forbid_self"),
            "{ctx}: {}",
            stderr(&own)
        );
        let other = output(
            db.flow()
                .args(["approve", &run, "refund"])
                .env("USER", "alice"),
        );
        assert_eq!(other.status.code(), Some(0), "{ctx}: {}", stderr(&other));
        let done = output(db.flow().args(["resume", &run]));
        assert_eq!(done.status.code(), Some(0), "{ctx}: {}", stderr(&done));
        assert_eq!(down.total(), 1, "{ctx}");
    }
}
