//! A `for_each` node with `approval:`, through the real binary on both backends, against
//! a downstream that counts requests per idempotency key: each item asks for its own
//! approval (`node[<key>]`, its message rendered with `item`), nothing leaves before its
//! item is approved, a denied item is never sent and counts against `tolerate`, a crash
//! between an item's approval and its outbound mark sends it once after resume, and an
//! installation policy gates each item the same way.

use flow_adapters::testkit::http::CountingServer;
use serde_json::{Value, json};

use crate::support::{Backend, TestDb, backends, output, run_id, runtime, show, stderr, stdout};

/// `notify` POSTs once per id of the input list, each behind its own approval.
fn workflow(url: &str, approval: &str) -> String {
    format!(
        r#"name: approve-each
inputs:
  ids: {{ type: array, required: true }}
tools:
  echo: {{ kind: function, function: core.echo }}
  post: {{ kind: http, method: POST, url: "{url}/mail/${{{{ with.id }}}}", timeout: 5s }}
nodes:
  notify:
    for_each:
      items: "${{{{ inputs.ids }}}}"
      key: "${{{{ item }}}}"
      concurrency: 1
      tolerate: {{ failed: 1 }}
    tool: post
    with: {{ id: "${{{{ item }}}}" }}
    retry_policy: {{ max_retries: 0 }}
{approval}
  after:
    needs: [notify]
    tool: echo
    with: {{ sent: "${{{{ nodes.notify.output.succeeded }}}}", failed: "${{{{ nodes.notify.output.failed }}}}" }}
"#
    )
}

/// The pending approvals `flow approvals --json` lists, by node, sorted.
fn pending(db: &TestDb) -> Vec<(String, String)> {
    let out = output(db.flow().args(["approvals", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let list: Value = serde_json::from_str(&stdout(&out)).expect("json");
    let mut named: Vec<(String, String)> = list
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["status"] == "pending")
        .map(|a| {
            (
                a["node"].as_str().unwrap_or_default().to_owned(),
                a["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    named.sort();
    named
}

fn decide(db: &TestDb, verb: &str, run: &str, node: &str) {
    let mut args = vec![verb, run, node, "--by", "alice"];
    if verb == "deny" {
        args.extend(["--reason", "not this one"]);
    }
    let out = output(db.flow().args(&args));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{verb} {node}: {}",
        stderr(&out)
    );
}

#[test]
fn each_item_asks_for_its_own_approval_and_only_approved_items_are_sent() {
    let rt = runtime();
    for backend in backends() {
        let ctx = format!("{backend:?}");
        let down = rt.block_on(CountingServer::start()).expect("downstream");
        let db = TestDb::new(backend);
        let approval = "    approval: { message: \"Mail ${{ item }}\", timeout: 1h }";
        let file = db.write("w.yaml", &workflow(&down.url(), approval));
        let ins = db.write("in.json", r#"{"ids": ["c1", "c2", "c3", "c4"]}"#);
        let paused = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .arg("--inputs-file")
                .arg(&ins),
        );
        assert_eq!(paused.status.code(), Some(3), "{ctx}: {}", stderr(&paused));
        let run = run_id(&paused);
        assert!(
            stderr(&paused)
                .contains("awaiting approval: notify[c1], notify[c2], notify[c3], notify[c4]"),
            "{ctx}: every item asks at once, concurrency 1 notwithstanding: {}",
            stderr(&paused)
        );
        assert_eq!(down.total(), 0, "{ctx}: nothing leaves before its approval");
        let want: Vec<(String, String)> = ["c1", "c2", "c3", "c4"]
            .iter()
            .map(|k| (format!("notify[{k}]"), format!("Mail {k}")))
            .collect();
        assert_eq!(pending(&db), want, "{ctx}: one approval per item");

        // Approve two, deny one; the fourth still waits.
        decide(&db, "approve", &run, "notify[c1]");
        decide(&db, "approve", &run, "notify[c2]");
        decide(&db, "deny", &run, "notify[c3]");
        let again = output(db.flow().args(["resume", &run]));
        assert_eq!(again.status.code(), Some(3), "{ctx}: {}", stderr(&again));
        assert!(
            stderr(&again).contains("awaiting approval: notify[c4]"),
            "{ctx}: {}",
            stderr(&again)
        );
        let counts = |k: &str| down.count(&format!("{run}:notify[{k}]:1"));
        assert_eq!(
            (counts("c1"), counts("c2"), counts("c3"), counts("c4")),
            (1, 1, 0, 0),
            "{ctx}: the approved items were sent once, the denied and the waiting never"
        );

        // A crash between the last item's approval and its outbound mark.
        decide(&db, "approve", &run, "notify[c4]");
        let crashed = output(
            db.flow()
                .args(["resume", &run])
                .env("FLOW_FAULT", "after_approval:notify"),
        );
        assert_eq!(crashed.status.code(), None, "{ctx}: {}", stderr(&crashed));
        assert_eq!(counts("c4"), 0, "{ctx}: nothing left before the crash");
        let done = output(db.flow().args(["resume", &run]));
        assert_eq!(done.status.code(), Some(0), "{ctx}: {}", stderr(&done));
        let result: Value = serde_json::from_slice(&done.stdout).expect("output");
        assert_eq!(
            result["after"],
            json!({ "sent": 3, "failed": 1 }),
            "{ctx}: the denial is tolerated: {result}"
        );
        let twice = output(db.flow().args(["resume", &run]));
        assert_eq!(twice.status.code(), Some(0), "{ctx}");
        assert_eq!(
            (counts("c1"), counts("c2"), counts("c3"), counts("c4")),
            (1, 1, 0, 1),
            "{ctx}: each approved item exactly once"
        );
        assert_eq!(down.total(), 3, "{ctx}");
        let s = show(&db, &run);
        let decided: Vec<(String, String)> = s["approvals"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let node = a["node"].as_str().unwrap_or_default().to_owned();
                (node, a["status"].as_str().unwrap_or_default().to_owned())
            })
            .collect();
        assert_eq!(decided.len(), 4, "{ctx}: {s}");
        assert!(
            decided.contains(&("notify[c3]".into(), "denied".into())),
            "{ctx}: {decided:?}"
        );
    }
}

/// Too many denials fail the node; an item still awaiting then is dropped, never sent.
#[test]
fn past_tolerate_the_items_still_awaiting_are_dropped_unsent() {
    let rt = runtime();
    let backend = Backend::Sqlite;
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(backend);
    let file = db.write(
        "w.yaml",
        &workflow(&down.url(), "    approval: { timeout: 1h }"),
    );
    let ins = db.write("in.json", r#"{"ids": ["a", "b", "c"]}"#);
    let paused = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .arg("--inputs-file")
            .arg(&ins),
    );
    assert_eq!(paused.status.code(), Some(3), "{}", stderr(&paused));
    let run = run_id(&paused);
    decide(&db, "deny", &run, "notify[a]");
    decide(&db, "deny", &run, "notify[b]");
    let failed = output(db.flow().args(["resume", &run]));
    assert_eq!(failed.status.code(), Some(1), "{}", stderr(&failed));
    assert_eq!(down.total(), 0, "nothing was sent");
    let s = show(&db, &run);
    assert_eq!(s["run"]["status"], "failed", "{s}");
    let error = s["run"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("2 of 3 items failed, 1 tolerated: a, b"),
        "the failure names the denied items: {error}"
    );
    let late = output(
        db.flow()
            .args(["approve", &run, "notify[c]", "--by", "alice"]),
    );
    let again = output(db.flow().args(["resume", &run]));
    assert_eq!(
        again.status.code(),
        Some(1),
        "{}{}",
        stderr(&late),
        stderr(&again)
    );
    assert_eq!(down.total(), 0, "an approval after the end sends nothing");
}

/// An installation policy that gates the tool asks per item, as `approval:` does.
#[test]
fn a_policy_gates_each_item_of_a_fan_out() {
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("w.yaml", &workflow(&down.url(), ""));
    db.write(
        "flow.toml",
        "[[policy.approvals]]\nname = \"mail\"\nmatch = { tool_kind = \"http\", method = [\"POST\"] }\ntimeout = \"1h\"\n",
    );
    let ins = db.write("in.json", r#"{"ids": ["x", "y"]}"#);
    let paused = output(
        db.flow()
            .args(["--config", "flow.toml", "run"])
            .arg(&file)
            .arg("--inputs-file")
            .arg(&ins),
    );
    assert_eq!(paused.status.code(), Some(3), "{}", stderr(&paused));
    let run = run_id(&paused);
    let names: Vec<String> = pending(&db).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["notify[x]", "notify[y]"]);
    decide(&db, "approve", &run, "notify[x]");
    decide(&db, "approve", &run, "notify[y]");
    let done = output(db.flow().args(["--config", "flow.toml", "resume", &run]));
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert_eq!(down.count(&format!("{run}:notify[x]:1")), 1);
    assert_eq!(down.count(&format!("{run}:notify[y]:1")), 1);
    assert_eq!(down.total(), 2);
}
