//! `for_each` through the real binary, against a downstream that counts requests per
//! idempotency key: each item's call is sent once under `<run>:<node>[<key>]`, within the
//! node's `concurrency`; a list re-evaluated in another order and without one item keeps
//! every key (the vanished, never-sent item is reported skipped); failures past
//! `tolerate` fail the node after the items in flight are recorded; items in doubt hold
//! only themselves, and resolving them finishes the node; a list flow cannot use fails
//! the node before anything is sent.

use flow_adapters::testkit::http::{Behavior, CountingServer};
use serde_json::{Value, json};

use crate::support::{Backend, TestDb, backends, output, run_id, runtime, show, stderr, stdout};

/// `notify` POSTs once per customer of the input list to `<url>/mail/<id>`; `after`
/// reads its output.
fn mail(url: &str, for_each_extra: &str, tool_extra: &str) -> String {
    format!(
        r#"name: mail
max_parallel: 8
inputs:
  customers: {{ type: array, required: true }}
tools:
  echo: {{ kind: function, function: core.echo }}
  post: {{ kind: http, method: POST, url: "{url}/mail/${{{{ with.id }}}}", timeout: 5s {tool_extra} }}
nodes:
  list:
    tool: echo
    with: {{ customers: "${{{{ inputs.customers }}}}" }}
  notify:
    needs: [list]
    for_each:
      items: "${{{{ nodes.list.output.customers }}}}"
      key: "${{{{ item.id }}}}"
      {for_each_extra}
    tool: post
    with: {{ id: "${{{{ item.id }}}}", to: "${{{{ item.email }}}}" }}
  after:
    needs: [notify]
    tool: echo
    with: {{ sent: "${{{{ nodes.notify.output.succeeded }}}}", c1: "${{{{ nodes.notify.output.items.c1.body.to }}}}" }}
"#
    )
}

fn customers(ids: &[&str]) -> String {
    let list: Vec<Value> = ids
        .iter()
        .map(|id| json!({ "id": id, "email": format!("{id}@example.com") }))
        .collect();
    Value::Array(list).to_string()
}

fn inputs(db: &TestDb, ids: &[&str]) -> std::path::PathBuf {
    db.write(
        "inputs.json",
        &json!({ "customers": serde_json::from_str::<Value>(&customers(ids)).expect("json") })
            .to_string(),
    )
}

/// `node`'s grouped items in a `show --json` object (`nodes[].items`).
fn items(s: &Value, node: &str) -> Value {
    s["nodes"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["id"] == node))
        .map(|n| n["items"].clone())
        .unwrap_or(Value::Null)
}

/// The keys and states of the items `items` lists (those that did not simply succeed).
fn listed(items: &Value) -> Vec<(String, String)> {
    items["listed"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            (
                i["key"].as_str().unwrap_or("").to_string(),
                i["status"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn each_item_is_sent_once_under_its_own_key_within_the_concurrency() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        let ids = ["c1", "c2", "c3", "c4", "c5", "c6"];
        for id in ids {
            server.set(&format!("/mail/{id}"), Behavior::Hold { ms: 150 });
        }
        let db = TestDb::new(backend);
        let file = db.write("w.yaml", &mail(&server.url(), "concurrency: 2", ""));
        let out = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .arg("--inputs-file")
                .arg(inputs(&db, &ids)),
        );
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        let run = run_id(&out);
        let result: Value = serde_json::from_slice(&out.stdout).expect("output");
        assert_eq!(result["after"]["sent"], 6, "{backend:?}: {result}");
        assert_eq!(
            result["after"]["c1"], "c1@example.com",
            "{backend:?}: {result}"
        );
        for id in ids {
            assert_eq!(
                server.count(&format!("{run}:notify[{id}]:1")),
                1,
                "{backend:?}: item {id} is sent once under its own key: {:?}",
                server
                    .log()
                    .iter()
                    .map(|r| r.key.clone())
                    .collect::<Vec<_>>()
            );
        }
        assert_eq!(server.total(), 6, "{backend:?}");
        assert_eq!(
            server.max_in_flight(),
            2,
            "{backend:?}: `concurrency: 2` bounds the requests in flight (and uses them)"
        );
        let s = show(&db, &run);
        let items = items(&s, "notify");
        assert_eq!(items["total"], 6, "{backend:?}: {items}");
        assert_eq!(items["succeeded"], 6, "{backend:?}: {items}");
        assert_eq!(listed(&items), vec![], "{backend:?}: nothing to list");
        assert!(
            s["steps"].as_array().is_some_and(|a| a.len() == 3),
            "{backend:?}: items are grouped, not steps of the run: {}",
            s["steps"]
        );
    }
}

/// The run is killed after item c3's outcome is recorded (concurrency 1: c1, c2, c3
/// sent); the list node's recorded output is then changed to the list reordered and
/// without c4 — as an operator's resolution would change it — and the run resumed.
#[test]
fn a_reordered_list_without_an_item_keeps_every_key_and_reports_the_vanished_one() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        let db = TestDb::new(backend);
        let file = db.write("w.yaml", &mail(&server.url(), "concurrency: 1", ""));
        let ids = ["c1", "c2", "c3", "c4", "c5"];
        let out = output(
            db.flow()
                .env("FLOW_FAULT", "after_complete:notify[c3]")
                .arg("run")
                .arg(&file)
                .arg("--inputs-file")
                .arg(inputs(&db, &ids)),
        );
        assert_ne!(out.status.code(), Some(0), "{backend:?}: the fault aborts");
        let run = run_id(&out);
        assert_eq!(server.total(), 3, "{backend:?}: c1, c2, c3 were sent");

        let reordered = json!({ "customers": serde_json::from_str::<Value>(&customers(&["c5", "c3", "c1", "c2"])).expect("json") });
        set_step_output(&db, backend, &run, "list", &reordered);

        let out = output(db.flow().args(["resume", &run]));
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        let result: Value = serde_json::from_slice(&out.stdout).expect("output");
        assert_eq!(result["after"]["sent"], 4, "{backend:?}: {result}");
        for id in ["c1", "c2", "c3", "c5"] {
            assert_eq!(
                server.count(&format!("{run}:notify[{id}]:1")),
                1,
                "{backend:?}: {id} sent once, under the key it had before the list changed"
            );
        }
        assert_eq!(
            server.total(),
            4,
            "{backend:?}: c4 vanished before it was sent"
        );
        let s = show(&db, &run);
        let items = items(&s, "notify");
        assert_eq!(
            listed(&items),
            vec![("c4".to_string(), "skipped".to_string())],
            "{backend:?}: the vanished item is reported skipped: {items}"
        );
        assert_eq!(items["succeeded"], 4, "{backend:?}: {items}");
        let text = output(db.flow().args(["show", &run]));
        assert!(
            stdout(&text).contains("notify  succeeded  5 items: 4 succeeded, 1 skipped"),
            "{backend:?}: {}",
            stdout(&text)
        );
    }
}

/// Rewrites a step's recorded output directly in the ledger (both backends).
fn set_step_output(db: &TestDb, backend: Backend, run: &str, step: &str, output: &Value) {
    runtime().block_on(async {
        let text = output.to_string();
        let sql = "UPDATE steps SET output = $1 WHERE run_id = $2 AND step_id = $3";
        let changed = match backend {
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&db.url).await.expect("sqlite");
                let r = sqlx::query(sql)
                    .bind(&text)
                    .bind(run)
                    .bind(step)
                    .execute(&pool)
                    .await
                    .expect("update");
                pool.close().await;
                r.rows_affected()
            }
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&db.url).await.expect("postgres");
                let r = sqlx::query(sql)
                    .bind(&text)
                    .bind(run)
                    .bind(step)
                    .execute(&pool)
                    .await
                    .expect("update");
                pool.close().await;
                r.rows_affected()
            }
        };
        assert_eq!(changed, 1, "step {step} of {run}");
    });
}

#[test]
fn failures_past_tolerate_fail_the_node_after_the_items_in_flight_are_recorded() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    for id in ["c2", "c4", "c6"] {
        server.set(&format!("/mail/{id}"), Behavior::status(400));
    }
    let ids = ["c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8"];
    // Tolerating 3 first: the redrive at the end makes the mail service answer.
    for (tolerate, code) in [(3, 0), (2, 1)] {
        let db = TestDb::new(Backend::Sqlite);
        let extra = format!("concurrency: 1\n      tolerate: {{ failed: {tolerate} }}");
        let file = db.write("w.yaml", &mail(&server.url(), &extra, ""));
        let out = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .arg("--inputs-file")
                .arg(inputs(&db, &ids)),
        );
        assert_eq!(
            out.status.code(),
            Some(code),
            "tolerate {tolerate}: {}",
            stderr(&out)
        );
        let run = run_id(&out);
        let s = show(&db, &run);
        let items = items(&s, "notify");
        let started =
            items["succeeded"].as_u64().unwrap_or(0) + items["failed"].as_u64().unwrap_or(0);
        if tolerate == 2 {
            assert!(
                stderr(&out).contains("3 of 8 items failed, 2 tolerated: c2, c4, c6"),
                "{}",
                stderr(&out)
            );
            // In list order, one at a time: the third failure (c6) stops new starts.
            assert_eq!(started, 6, "c7 and c8 never started: {items}");
            assert_eq!(items["failed"], 3, "{items}");
            assert_eq!(server.count(&format!("{run}:notify[c7]:1")), 0);
            redrive_sends_the_failed_and_never_sent_items_once(&db, &server, &run);
        } else {
            let result: Value = serde_json::from_slice(&out.stdout).expect("output");
            assert_eq!(result["after"]["sent"], 5, "{result}");
            assert_eq!(started, 8, "{items}");
        }
    }
}

/// The run of `failures_past_tolerate_…` (c2, c4, c6 failed with a 400; c7, c8 never
/// started) redriven once the mail service answers: the failed items are sent again
/// under their next attempt's key, the never-started ones once, the succeeded ones not
/// at all, and the node and the run succeed — the keys never change, so nothing an item
/// already sent goes out again.
fn redrive_sends_the_failed_and_never_sent_items_once(
    db: &TestDb,
    server: &CountingServer,
    run: &str,
) {
    for id in ["c2", "c4", "c6"] {
        server.set(&format!("/mail/{id}"), Behavior::status(200));
    }
    let before = server.total();
    let redrive = output(db.flow().args(["redrive", run]));
    assert_eq!(redrive.status.code(), Some(0), "{}", stderr(&redrive));
    assert!(
        stderr(&redrive).contains("1 run again as notify_retry1 and 3 items as notify[c2]_retry1, notify[c4]_retry1, notify[c6]_retry1"),
        "{}",
        stderr(&redrive)
    );
    let resumed = output(db.flow().args(["resume", run]));
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    let result: Value = serde_json::from_slice(&resumed.stdout).expect("output");
    assert_eq!(result["after"]["sent"], 8, "{result}");
    for id in ["c1", "c3", "c5"] {
        assert_eq!(server.count(&format!("{run}:notify[{id}]:1")), 1, "{id}");
        assert_eq!(server.count(&format!("{run}:notify[{id}]:2")), 0, "{id}");
    }
    for id in ["c2", "c4", "c6"] {
        assert_eq!(server.count(&format!("{run}:notify[{id}]:1")), 1, "{id}");
        assert_eq!(server.count(&format!("{run}:notify[{id}]:2")), 1, "{id}");
    }
    for id in ["c7", "c8"] {
        assert_eq!(server.count(&format!("{run}:notify[{id}]:1")), 1, "{id}");
    }
    assert_eq!(
        server.total() - before,
        5,
        "three failed items and two never sent"
    );
    let s = show(db, run);
    let items = items(&s, "notify");
    assert_eq!(items["succeeded"], 8, "{items}");
    // A second redrive has nothing to do: the run succeeded.
    let again = output(db.flow().args(["redrive", run]));
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
}

/// Five items' responses are cut mid-body (a POST without idempotency: in doubt); the
/// other items finish, then the run pauses naming those five; resolving them finishes
/// the node and the run without sending anything again.
#[test]
fn items_in_doubt_hold_only_themselves_and_resolving_them_finishes_the_node() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        let ids: Vec<String> = (1..=12).map(|i| format!("c{i}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let doubtful = ["c2", "c3", "c5", "c8", "c11"];
        for id in doubtful {
            server.set(&format!("/mail/{id}"), Behavior::DropMidResponse);
        }
        let db = TestDb::new(backend);
        let file = db.write("w.yaml", &mail(&server.url(), "concurrency: 3", ""));
        let out = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .arg("--inputs-file")
                .arg(inputs(&db, &refs)),
        );
        assert_eq!(out.status.code(), Some(3), "{backend:?}: {}", stderr(&out));
        let run = run_id(&out);
        assert_eq!(server.total(), 12, "{backend:?}: every item was sent once");
        let s = show(&db, &run);
        let items = items(&s, "notify");
        assert_eq!(items["in_doubt"], 5, "{backend:?}: {items}");
        assert_eq!(items["succeeded"], 7, "{backend:?}: {items}");
        let in_doubt: Vec<&str> = s["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["status"] == "in_doubt")
            .filter_map(|c| c["tool_call_id"].as_str())
            .collect();
        assert_eq!(
            in_doubt.len(),
            5,
            "{backend:?}: the calls in doubt are listed: {in_doubt:?}"
        );
        let text = stdout(&output(db.flow().args(["show", &run])));
        assert!(
            text.contains("--resolve notify[c11]=succeeded"),
            "{backend:?}: show says how to resolve each item: {text}"
        );
        let reason = s["run"]["error"].as_str().unwrap_or_default().to_string();
        assert!(
            reason.contains("notify[c2]") && reason.contains("notify[c11]"),
            "{backend:?}: the pause names the items: {reason}"
        );
        for (n, id) in doubtful.iter().enumerate() {
            let last = n + 1 == doubtful.len();
            let out = output(db.flow().args([
                "resume",
                &run,
                "--resolve",
                &format!("notify[{id}]=succeeded"),
                "--output",
                r#"{"body": {"to": "resolved"}}"#,
            ]));
            let want = if last { 0 } else { 3 };
            assert_eq!(
                out.status.code(),
                Some(want),
                "{backend:?}: resolving {id}: {}",
                stderr(&out)
            );
            if last {
                let result: Value = serde_json::from_slice(&out.stdout).expect("output");
                assert_eq!(result["after"]["sent"], 12, "{backend:?}: {result}");
            }
        }
        assert_eq!(server.total(), 12, "{backend:?}: nothing was sent again");
    }
}

/// A list flow cannot use fails the node, naming why, before any item is sent.
#[test]
fn a_list_flow_cannot_use_fails_the_node_before_anything_is_sent() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let cases: [(&str, &str, &str); 6] = [
        (
            "items: \"${{ nodes.list.output.customers }}\"\n      key: \"${{ item.id }}\"",
            r#"[{"id": 1}, {"id": 2}, {"id": 1.0}]"#,
            "`for_each.key` of node `notify` is not unique: `1.0` (the same number as `1`) appear more than once",
        ),
        (
            "items: \"${{ nodes.list.output.customers[0] }}\"\n      key: \"${{ item.id }}\"",
            r#"[{"id": "a"}]"#,
            "`for_each.items` of node `notify` is an object, not a list",
        ),
        (
            "items: \"${{ nodes.list.output.customers }}\"\n      key: \"${{ item.id }}\"",
            r#"[{"id": "a"}, {"id": "b"}, {"id": "a"}]"#,
            "`for_each.key` of node `notify` is not unique: `a` appear more than once",
        ),
        (
            "items: \"${{ nodes.list.output.customers }}\"\n      key: \"${{ item.tags }}\"",
            r#"[{"id": "a", "tags": ["x"]}]"#,
            "`for_each.key` of node `notify` is a list for item 0",
        ),
        (
            "items: \"${{ nodes.list.output.customers }}\"\n      key: \"${{ item.id }}\"\n      max_items: 2",
            r#"[{"id": "a"}, {"id": "b"}, {"id": "c"}]"#,
            "has 3 items, more than `max_items` (2)",
        ),
        (
            "items: \"${{ nodes.list.output.customers }}\"\n      key: \"${{ item.id }}\"",
            r#"[{"id": "has space"}]"#,
            "a key is 1 to 200 visible ASCII characters",
        ),
    ];
    for (for_each, list, want) in cases {
        let db = TestDb::new(Backend::Sqlite);
        let text = format!(
            r#"name: bad
inputs:
  customers: {{ type: array, required: true }}
tools:
  echo: {{ kind: function, function: core.echo }}
  post: {{ kind: http, method: POST, url: "{}/mail", timeout: 5s }}
nodes:
  list:
    tool: echo
    with: {{ customers: "${{{{ inputs.customers }}}}" }}
  notify:
    needs: [list]
    for_each:
      {for_each}
    tool: post
    with: {{ id: "${{{{ item.id }}}}" }}
"#,
            server.url()
        );
        let file = db.write("w.yaml", &text);
        let inputs = db.write("in.json", &format!(r#"{{"customers": {list}}}"#));
        let out = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .arg("--inputs-file")
                .arg(&inputs),
        );
        assert_eq!(out.status.code(), Some(1), "{want}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(want),
            "want `{want}` in:\n{}",
            stderr(&out)
        );
        assert_eq!(server.total(), 0, "{want}: nothing was sent");
    }
}

/// What validation refuses in a `for_each` node, with its position, exit 2.
#[test]
fn validation_refuses_what_a_for_each_node_cannot_mean() {
    let db = TestDb::new(Backend::Sqlite);
    let cases: [(&str, &str); 6] = [
        (
            "    for_each: { items: [1, 2], key: \"${{ item }}\" }\n    idempotency_key: refund\n",
            "`idempotency_key` of `for_each` node `n` does not read `item`",
        ),
        (
            "    for_each: { items: [1, 2] }\n",
            "`for_each` has no `key`",
        ),
        (
            "    for_each: { items: [1, 2], key: fixed }\n",
            "`for_each.key` is a constant",
        ),
        (
            "    for_each: { items: [1, 2], key: \"${{ item }}\", tolerate: { failed: \"x%\" } }\n",
            "`tolerate.failed` must be a count or a percentage",
        ),
        (
            "    for_each: { items: [1, 2], key: \"${{ item }}\" }\n    if: \"${{ item == 1 }}\"\n",
            "reads `item`, which only the `with`, `idempotency_key`, `approval.message` and `for_each.key` of a `for_each` node can see",
        ),
        (
            "    for_each: { items: [1, 2], key: \"${{ item }}\" }\n    callback: { timeout: 1h }\n",
            "has `for_each:` and `callback:`, which cannot be combined yet",
        ),
    ];
    for (node, want) in cases {
        let text = format!(
            "name: v\ntools:\n  post: {{ kind: http, method: POST, url: \"http://127.0.0.1:9/x\" }}\nnodes:\n  n:\n    tool: post\n{node}"
        );
        let file = db.write("v.yaml", &text);
        let out = output(db.flow().arg("validate").arg(&file));
        assert_eq!(out.status.code(), Some(2), "{want}: {}", stdout(&out));
        let all = format!("{}{}", stdout(&out), stderr(&out));
        assert!(all.contains(want), "want `{want}` in:\n{all}");
        assert!(all.contains("v.yaml:"), "a position: {all}");
    }
    let outside = "name: v\ntools:\n  post: { kind: http, method: POST, url: \"http://127.0.0.1:9/x\" }\nnodes:\n  n:\n    tool: post\n    with: { x: \"${{ item.id }}\" }\n";
    let file = db.write("o.yaml", outside);
    let out = output(db.flow().arg("validate").arg(&file));
    assert_eq!(out.status.code(), Some(2));
}

/// Items whose responses are cut mid-body go in doubt; the tool's `reconcile:` probe asks
/// the downstream about each item's own key, finds each effect, and the run finishes
/// without a person and without sending anything again.
#[test]
fn items_in_doubt_are_probed_each_under_its_own_key() {
    let rt = runtime();
    for backend in backends() {
        let server = rt.block_on(CountingServer::start()).expect("server");
        let ids = ["c1", "c2", "c3", "c4"];
        for id in ["c2", "c4"] {
            server.set(&format!("/mail/{id}"), Behavior::DropMidResponse);
        }
        let url = server.url();
        let reconcile = format!(
            r#", reconcile: {{ request: {{ method: GET, url: "{url}/_control/effects/${{{{ call.key }}}}" }}, found: "${{{{ response.status == 200 }}}}", not_found: "${{{{ response.status == 404 }}}}", after: 10s, interval: 100ms }}"#
        );
        let db = TestDb::new(backend);
        let file = db.write("w.yaml", &mail(&url, "concurrency: 2", &reconcile));
        let out = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .arg("--inputs-file")
                .arg(inputs(&db, &ids)),
        );
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        let run = run_id(&out);
        for id in ids {
            assert_eq!(
                server.count(&format!("{run}:notify[{id}]:1")),
                1,
                "{backend:?}: {id} sent once"
            );
        }
        let s = show(&db, &run);
        let probed: Vec<&str> = s["probes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["node"].as_str())
            .collect();
        assert!(
            probed.contains(&"notify[c2]") && probed.contains(&"notify[c4]"),
            "{backend:?}: each item in doubt was probed as itself: {probed:?}"
        );
        assert_eq!(items(&s, "notify")["succeeded"], 4, "{backend:?}");
    }
}
