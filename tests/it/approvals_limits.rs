//! Approvals' limits, through the real binary on both backends: a decision after the
//! deadline is refused and nothing is sent; `forbid_self` knows who started a CLI run.

use std::time::Duration;

use flow_adapters::testkit::http::{Behavior, CountingServer};
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

/// A redrive is a new decision to take: an approved node whose call failed asks again
/// (nothing is sent until someone approves anew), and a denied node can be asked again
/// by a redrive instead of failing on the old denial. Issue 49 (break 6): a redrive sent
/// the approved request again under the old approval, and a denied node could never be
/// asked again.
#[test]
fn a_redrive_asks_again_for_an_approved_or_denied_node_on_both_backends() {
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let rt = runtime();
        let down = rt.block_on(CountingServer::start()).expect("downstream");
        let db = TestDb::new(backend);
        let file = db.write("refund.yaml", &workflow(&down.url(), "      timeout: 1h"));
        let flow = |args: &[&str], code: i32| {
            let out = output(db.flow().args(args));
            assert_eq!(
                out.status.code(),
                Some(code),
                "{ctx}: {args:?}: {}",
                stderr(&out)
            );
            stderr(&out)
        };

        // Approved, then the downstream refuses: the run fails after one request.
        down.set("/refund", Behavior::status(400));
        let paused = output(db.flow().arg("run").arg(&file));
        assert_eq!(paused.status.code(), Some(3), "{ctx}: {}", stderr(&paused));
        let run = run_id(&paused);
        flow(&["approve", &run, "refund", "--by", "alice"], 0);
        flow(&["resume", &run], 1);
        assert_eq!(down.total(), 1, "{ctx}");
        down.set("/refund", Behavior::Echo);
        let said = flow(&["redrive", &run], 0);
        assert!(
            said.contains("approval asked again: refund"),
            "{ctx}: {said}"
        );
        let again = flow(&["resume", &run], 3);
        assert!(
            again.contains("awaiting approval: refund"),
            "{ctx}: {again}"
        );
        assert_eq!(down.total(), 1, "{ctx}: nothing sent on the old approval");
        assert_eq!(approval(&show(&db, &run))["status"], "pending", "{ctx}");
        flow(&["approve", &run, "refund", "--by", "bob"], 0);
        flow(&["resume", &run], 0);
        assert_eq!(
            down.total(),
            2,
            "{ctx}: sent once more, after the new approval"
        );
        assert_eq!(events(&db, &run, "approval.requested"), 2, "{ctx}");

        // Denied: the node fails; a redrive asks again instead of failing on the denial.
        let paused = output(db.flow().arg("run").arg(&file));
        assert_eq!(paused.status.code(), Some(3), "{ctx}: {}", stderr(&paused));
        let run = run_id(&paused);
        flow(
            &[
                "deny", &run, "refund", "--by", "alice", "--reason", "not yet",
            ],
            0,
        );
        flow(&["resume", &run], 1);
        flow(&["redrive", &run], 0);
        flow(&["resume", &run], 3);
        assert_eq!(down.total(), 2, "{ctx}: a denied request is never sent");
        flow(&["approve", &run, "refund", "--by", "alice"], 0);
        flow(&["resume", &run], 0);
        assert_eq!(
            down.total(),
            3,
            "{ctx}: sent once, after the approval asked again"
        );
    }
}

/// A refund to an account held in a secret: the approval binds the account's value (a
/// swapped secret is asked again, nothing sent on the old approval), not the bearer
/// token in a header (rotating it sends), and the ledger holds neither value — the
/// digest is keyed by `APPROVAL_DIGEST_KEY`, without which such a request is refused
/// by name. Issue 49 (break 5): the digest hashed the request with secrets as names,
/// so an approval given for one account sent the refund to another.
#[test]
fn an_approval_binds_the_secret_values_of_its_request_on_both_backends() {
    const ACCOUNTS: [&str; 2] = ["acct-7f3a91c2", "acct-0b55e6d4"];
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let rt = runtime();
        let down = rt.block_on(CountingServer::start()).expect("downstream");
        let db = TestDb::new(backend);
        let url = down.url();
        let file = db.write(
            "payout.yaml",
            &format!(
                r#"name: payout
tools:
  pay:
    kind: http
    method: POST
    url: "{url}/payout"
    headers: {{ Authorization: "Bearer ${{{{ secrets.TOKEN }}}}" }}
    timeout: 2s
nodes:
  payout:
    tool: pay
    with: {{ account: "${{{{ secrets.ACCOUNT }}}}", amount: 40 }}
    approval: {{ timeout: 1h }}
"#
            ),
        );
        let flow = |account: &str, token: &str, keyed: bool| {
            let mut cmd = db.flow();
            cmd.env("FLOW_SECRET_ACCOUNT", account)
                .env("FLOW_SECRET_TOKEN", token);
            if keyed {
                cmd.env("FLOW_SECRET_APPROVAL_DIGEST_KEY", "k-55c1e0b2d9a4");
            }
            cmd
        };
        let expect = |mut cmd: std::process::Command, args: &[&str], code: i32| {
            let out = output(cmd.args(args));
            assert_eq!(
                out.status.code(),
                Some(code),
                "{ctx}: {args:?}: {}",
                stderr(&out)
            );
            out
        };

        let unkeyed = expect(
            flow(ACCOUNTS[0], "tok-one-1a2b", false),
            &["run", &file.display().to_string()],
            1,
        );
        let said = stderr(&unkeyed);
        assert!(
            said.contains("APPROVAL_DIGEST_KEY") && said.contains("`ACCOUNT`"),
            "{ctx}: {said}"
        );
        assert!(
            !said.contains("`TOKEN`"),
            "{ctx}: a header credential is not bound: {said}"
        );

        let paused = expect(
            flow(ACCOUNTS[0], "tok-one-1a2b", true),
            &["run", &file.display().to_string()],
            3,
        );
        let run = run_id(&paused);
        let asked = approval(&show(&db, &run))["digest"]
            .as_str()
            .map(str::to_owned);
        assert!(
            asked
                .as_deref()
                .is_some_and(|d| d.starts_with("hmac-sha256:")),
            "{ctx}: {asked:?}"
        );
        expect(
            flow(ACCOUNTS[0], "tok-one-1a2b", true),
            &["approve", &run, "payout", "--by", "alice"],
            0,
        );
        // The account secret changed after the approval: asked again, nothing sent.
        expect(
            flow(ACCOUNTS[1], "tok-one-1a2b", true),
            &["resume", &run],
            3,
        );
        assert_eq!(down.total(), 0, "{ctx}: not sent to another account");
        assert_eq!(events(&db, &run, "approval.invalidated"), 1, "{ctx}");
        expect(
            flow(ACCOUNTS[1], "tok-one-1a2b", true),
            &["approve", &run, "payout", "--by", "alice"],
            0,
        );
        // The bearer token rotated after this approval: still the approved request.
        expect(
            flow(ACCOUNTS[1], "tok-two-3c4d", true),
            &["resume", &run],
            0,
        );
        assert_eq!(down.total(), 1, "{ctx}");
        let body = down.log()[0].body.to_string();
        assert!(
            body.contains(ACCOUNTS[1]),
            "{ctx}: sent to the approved account: {body}"
        );

        let listed = show(&db, &run).to_string();
        for value in ACCOUNTS.iter().chain(&["k-55c1e0b2d9a4"]) {
            assert!(!listed.contains(value), "{ctx}: `flow show` holds {value}");
        }
        let bytes = crate::connections::ledger_bytes(&db);
        let values: Vec<String> = ACCOUNTS.iter().map(|v| v.to_string()).collect();
        crate::connections::assert_no_token("the ledger", &bytes, &values);
    }
}
