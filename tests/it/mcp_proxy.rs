//! flow as an at-most-once MCP proxy (`[[mcp.servers]]`, `flow mcp proxy`), driven by
//! the official Python SDK in front of flow's counting MCP test server (its count file
//! outlives every process): a proxy killed after the request left is, once restarted,
//! in doubt about that call and never forwards it again; a destructive tool under
//! `[[policy.approvals]]` is forwarded only once a person — never the agent — approves.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::call;
use crate::mcp_server::{ALICE, client, daemon, http, run_of, sdk, text};
use crate::support::{Backend, TestDb, backends, runtime};

/// `flow.toml` proxying the test server (its calls appended to `count`), with two
/// operators, and (`gated`) destructive MCP tools gated — `count` declares no hints,
/// so MCP's defaults make it destructive.
fn config(db: &TestDb, gated: bool) -> String {
    let bin = flow_adapters::testkit::bin_path();
    let count = db.dir.path().join("count");
    format!(
        r#"{tokens}
[[mcp.servers]]
name = "kit"
server = {{ command = ["{bin}", "mcp-stdio", "--count-file", "{count}"] }}
timeout = "5s"
{policy}"#,
        tokens = crate::mcp_server::TOKENS,
        policy = if gated { POLICY } else { "" },
        bin = bin.display(),
        count = count.display()
    )
}

/// Destructive MCP tools need an operator's approval.
const POLICY: &str = r#"
[[policy.approvals]]
name = "destructive-mcp"
match = { mcp_destructive = true }
require = { roles = ["operator"] }
"#;

/// The `tools/call`s the test server saw of `tool`.
fn forwarded(db: &TestDb, tool: &str) -> usize {
    let path = db.dir.path().join("count");
    if !path.exists() {
        return 0;
    }
    flow_adapters::testkit::mcp::read_count_file(&path)
        .iter()
        .filter(|e| e["event"] == "call" && e["tool"] == tool)
        .count()
}

/// `flow mcp proxy` on stdio for `db`, with `env` for the proxy process.
fn stdio(db: &TestDb, env: Value) -> Value {
    let dir = db.dir.path().display().to_string();
    json!({
        "stdio": [env!("CARGO_BIN_EXE_flow"), "--db", db.url, "--config", format!("{dir}/flow.toml"),
                  "mcp", "proxy", "--principal", "agent", "--poll-interval", "100ms"],
        "env": env,
    })
}

#[test]
fn a_proxy_killed_after_the_request_left_never_forwards_it_again_on_both_backends() {
    if !sdk() {
        return;
    }
    for backend in backends() {
        killed_after_the_request_left(backend);
    }
}

fn killed_after_the_request_left(backend: Backend) {
    let db = TestDb::new(backend);
    db.write("flow.toml", &config(&db, false));
    let step = json!({"op": "call", "tool": "kit__count", "args": {"key": "k1"},
                      "key": "call-1", "may_fail": true});
    // The proxy dies once the server has answered, before the outcome is recorded.
    let path = std::env::var("PATH").unwrap_or_default();
    let dying = stdio(
        &db,
        json!({"FLOW_FAULT": "after_response:call", "PATH": path}),
    );
    let r = client(&dying, &json!([step]));
    assert!(
        r[0]["failed"].is_string(),
        "the proxy died under the call: {}",
        r[0]
    );
    assert_eq!(forwarded(&db, "count"), 1, "the request left once");
    // Restarted, the agent retries the same call: in doubt, not forwarded again.
    let r = client(&stdio(&db, json!({"PATH": path})), &json!([step, step]));
    for x in &r {
        assert_eq!(run_of(x).1, "in_doubt", "{x}");
        assert_eq!(x["isError"], true);
        assert!(text(x).contains("will not send it again"), "{x}");
        assert!(
            text(x).contains("kit__count"),
            "names the proxied tool: {x}"
        );
    }
    assert_eq!(
        forwarded(&db, "count"),
        1,
        "the downstream saw exactly one call"
    );
    // A call that was never in doubt goes through and is answered with the server's
    // output; its retry answers from the same run.
    let ok = json!({"op": "call", "tool": "kit__count", "args": {"key": "k2"}, "key": "call-2"});
    let r = client(&stdio(&db, json!({"PATH": path})), &json!([ok, ok]));
    assert_eq!(run_of(&r[0]).1, "succeeded", "{}", r[0]);
    assert_eq!(r[0]["structuredContent"]["output"]["count"], 1, "{}", r[0]);
    assert_eq!(run_of(&r[1]).0, run_of(&r[0]).0);
    assert_eq!(forwarded(&db, "count"), 2);
}

#[test]
fn a_destructive_proxied_tool_waits_for_a_person_and_not_the_agent() {
    if !sdk() {
        return;
    }
    let db = TestDb::new(Backend::Sqlite);
    db.write("flow.toml", &config(&db, true));
    let server = daemon(&db);
    let agent = http(&server, crate::mcp_server::AGENT);
    let listed = client(&agent, &json!([{"op": "list"}]));
    let tools = listed[0]["tools"].as_array().cloned().unwrap_or_default();
    let delete = tools.iter().find(|t| t["name"] == "kit__delete_thing");
    let delete = delete.unwrap_or_else(|| panic!("listed under the server's prefix: {tools:?}"));
    assert_eq!(
        delete["annotations"]["destructiveHint"], true,
        "as the server declares"
    );

    // Read-only: forwarded at once.
    let look = json!({"op": "call", "tool": "kit__lookup", "args": {}, "key": "l1"});
    assert_eq!(run_of(&client(&agent, &json!([look]))[0]).1, "succeeded");
    // Destructive: held.
    let del = json!({"op": "call", "tool": "kit__delete_thing", "args": {"id": "t1"}, "key": "d1"});
    let r = client(&agent, &json!([del]));
    let (run, status) = run_of(&r[0]);
    assert_eq!(status, "waiting", "{}", r[0]);
    assert_eq!(
        forwarded(&db, "delete_thing"),
        0,
        "not forwarded before the approval"
    );
    let path = format!("/api/v1/runs/{run}/approvals/call");
    let approve = json!({"decision": "approve"});
    let rt = runtime();
    rt.block_on(async {
        let token = crate::mcp_server::AGENT;
        let (s, p) = call(&server, "POST", &path, Some(token), Some(approve.clone())).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "the agent's own token: {p}");
        let (s, p) = call(&server, "POST", &path, Some(ALICE), Some(approve)).await;
        assert_eq!(s, StatusCode::OK, "{p}");
    });
    let r = client(&agent, &json!([del]));
    assert_eq!(run_of(&r[0]), (run, "succeeded".into()), "{}", r[0]);
    assert_eq!(
        r[0]["structuredContent"]["output"]["deleted"], "t1",
        "{}",
        r[0]
    );
    assert_eq!(forwarded(&db, "delete_thing"), 1);
}
