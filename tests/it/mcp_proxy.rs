//! flow as an at-most-once MCP proxy (`[[mcp.servers]]`, `flow mcp proxy`), driven by
//! the official Python SDK in front of flow's counting MCP test server (its count file
//! outlives every process): a proxy killed after the request left is, once restarted,
//! in doubt about that call and never forwards it again; a destructive tool under
//! `[[policy.approvals]]` is forwarded only once a person — never the agent — approves.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::call;
use crate::mcp_server::{ALICE, client, daemon, http, run_of, sdk, text};
use crate::support::{Backend, TestDb, backends, output, runtime};

/// `flow.toml` proxying the test server (its calls appended to `count`), with two
/// operators, and (`gated`) destructive MCP tools gated — `count` declares no hints,
/// so MCP's defaults make it destructive.
fn config(db: &TestDb, gated: bool) -> String {
    config_with(db, gated, false)
}

/// [`config`], with the server declaring `delete_thing` harmless when `benign`.
fn config_with(db: &TestDb, gated: bool, benign: bool) -> String {
    let bin = flow_adapters::testkit::bin_path();
    let count = db.dir.path().join("count");
    format!(
        r#"{tokens}
[[mcp.servers]]
name = "kit"
server = {{ command = ["{bin}", "mcp-stdio", "--count-file", "{count}"{benign}] }}
timeout = "5s"
{policy}"#,
        tokens = crate::mcp_server::TOKENS,
        policy = if gated { POLICY } else { "" },
        benign = if benign { r#", "--benign""# } else { "" },
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

/// The proxied server's credentials — the client secret flow signs in with and the
/// access tokens it gets — reach neither the agent, nor the ledger (its files, or a
/// `pg_dump`), nor the proxy's debug log. (That the scan finds a token when one is
/// there is `connections::the_token_scan_finds_a_planted_token_on_both_backends`.)
#[test]
fn no_credential_of_a_proxied_server_reaches_the_agent_the_ledger_or_the_logs() {
    if !sdk() {
        return;
    }
    const CLIENT_SECRET: &str = "mcp-client-secret-5d1f0c";
    let rt = runtime();
    for backend in backends() {
        let options = flow_adapters::testkit::mcp::AuthOptions {
            client_secret: CLIENT_SECRET.to_owned(),
            ..Default::default()
        };
        let kit = rt
            .block_on(flow_adapters::testkit::mcp::HttpServer::start(Some(
                options,
            )))
            .expect("MCP server");
        let db = TestDb::new(backend);
        db.write(
            "flow.toml",
            &format!(
                r#"{tokens}
[[mcp.servers]]
name = "kit"
server = {{ url = "{url}" }}
auth = {{ oauth = {{ token_url = "{token_url}", client_id = "flow", client_secret = "${{{{ secrets.MCP_SECRET }}}}", scope = "tools:write" }} }}
"#,
                tokens = crate::mcp_server::TOKENS,
                url = kit.url(),
                token_url = kit.token_url(),
            ),
        );
        let log = db.dir.path().join("proxy.log");
        let mut cmd = db.flow();
        cmd.args([
            "daemon",
            "--poll-interval",
            "100ms",
            "--serve",
            "127.0.0.1:0",
        ])
        .env("FLOW_SECRET_AGENT_TOKEN", crate::mcp_server::AGENT)
        .env("FLOW_SECRET_ALICE_TOKEN", ALICE)
        .env("FLOW_SECRET_MCP_SECRET", CLIENT_SECRET)
        .env("RUST_LOG", "debug");
        let server = crate::mcp_server::logged(cmd, &log);
        let agent = http(&server, crate::mcp_server::AGENT);
        let steps = json!([
            {"op": "list"},
            {"op": "call", "tool": "kit__count", "args": {"key": "s1"}, "key": "s1"},
            {"op": "call", "tool": "kit__echo", "args": {"note": "hello"}, "key": "s2"},
        ]);
        let out = client(&agent, &steps);
        assert_eq!(run_of(&out[1]).1, "succeeded", "{}", out[1]);
        assert_eq!(run_of(&out[2]).1, "succeeded", "{}", out[2]);
        assert!(
            kit.http().token_requests() >= 1,
            "flow signed in to the server"
        );
        drop(server);
        let mut secrets = vec![CLIENT_SECRET.to_owned()];
        secrets.extend((1..=9).map(|n| format!("testkit-token-{n}")));
        let agent_saw = serde_json::to_vec(&out).unwrap_or_default();
        crate::connections::assert_no_token("what the agent saw", &agent_saw, &secrets);
        let ledger = crate::connections::ledger_bytes(&db);
        crate::connections::assert_no_token("the ledger (files or pg_dump)", &ledger, &secrets);
        let logged = std::fs::read(&log).unwrap_or_default();
        assert!(logged.len() > 1_000, "the debug log was written");
        crate::connections::assert_no_token("the proxy's debug log", &logged, &secrets);
    }
}

/// A proxied tool is pinned when first seen. A server that later declares
/// `delete_thing` harmless (read-only, not destructive) is still offered and gated as
/// pinned — the agent's call waits for a person — until an admin accepts the change,
/// which is recorded with who and why; then the new definition is the one offered.
#[test]
fn a_tool_whose_server_drops_its_destructive_hint_stays_gated_until_accepted() {
    if !sdk() {
        return;
    }
    let db = TestDb::new(Backend::Sqlite);
    db.write("flow.toml", &config(&db, true));
    let delete_hints = |server: &crate::api::Server| {
        let listed = client(
            &http(server, crate::mcp_server::AGENT),
            &json!([{"op": "list"}]),
        );
        let tools = listed[0]["tools"].as_array().cloned().unwrap_or_default();
        let t = tools
            .iter()
            .find(|t| t["name"] == "kit__delete_thing")
            .cloned();
        t.map(|t| t["annotations"].clone()).unwrap_or_default()
    };
    let first = daemon(&db);
    assert_eq!(
        delete_hints(&first)["destructiveHint"],
        true,
        "pinned as first seen"
    );
    drop(first);

    // The server now says the tool is harmless: the pin stands.
    db.write("flow.toml", &config_with(&db, true, true));
    for _ in 0..2 {
        let again = daemon(&db);
        assert_eq!(
            delete_hints(&again)["destructiveHint"],
            true,
            "still the pin"
        );
        drop(again);
    }
    let server = daemon(&db);
    let agent = http(&server, crate::mcp_server::AGENT);
    let del = json!({"op": "call", "tool": "kit__delete_thing", "args": {"id": "p1"}, "key": "p1"});
    let r = client(&agent, &json!([del]));
    assert_eq!(run_of(&r[0]).1, "waiting", "gated as pinned: {}", r[0]);
    assert_eq!(forwarded(&db, "delete_thing"), 0);
    drop(server);

    accept_as_an_admin(&db);

    let server = daemon(&db);
    assert_eq!(
        delete_hints(&server)["destructiveHint"],
        false,
        "the accepted definition"
    );
    let agent = http(&server, crate::mcp_server::AGENT);
    let del = json!({"op": "call", "tool": "kit__delete_thing", "args": {"id": "p2"}, "key": "p2"});
    let r = client(&agent, &json!([del]));
    assert_eq!(run_of(&r[0]).1, "succeeded", "no longer gated: {}", r[0]);
    assert_eq!(forwarded(&db, "delete_thing"), 1);
}

/// An admin lists the pins, sees the change, and accepts what the server lists now:
/// a digest not reviewed is refused; the acceptance is one audited event.
fn accept_as_an_admin(db: &TestDb) {
    let pins = output(db.flow().args(["mcp", "pins"]));
    let listing = crate::support::stdout(&pins);
    assert!(listing.contains("CHANGED"), "{listing}");
    let digest = listing
        .split("--digest ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default()
        .to_owned();
    let stale = output(db.flow().args([
        "mcp",
        "accept",
        "kit",
        "delete_thing",
        "--digest",
        "sha256:0",
        "--by",
        "ada",
        "--reason",
        "x",
    ]));
    assert_eq!(
        stale.status.code(),
        Some(2),
        "a digest not reviewed: {}",
        crate::support::stderr(&stale)
    );
    let accepted = output(db.flow().args([
        "mcp",
        "accept",
        "kit",
        "delete_thing",
        "--digest",
        &digest,
        "--by",
        "ada",
        "--reason",
        "reviewed the new hints",
    ]));
    assert_eq!(
        accepted.status.code(),
        Some(0),
        "{}",
        crate::support::stderr(&accepted)
    );
    let events = runtime().block_on(async {
        let ledger = flow_ledger::Ledger::open(&db.url, flow_ledger::OpenOptions::default())
            .await
            .expect("ledger");
        let list = ledger
            .list_events(flow_ledger::EventFilter::default())
            .await
            .expect("events");
        ledger.close().await;
        list
    });
    let of = |t: &str| {
        events
            .iter()
            .filter(|e| e.event_type.as_str() == t)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        of("mcp.tool_changed").len(),
        1,
        "one event per new definition"
    );
    let accepted = of("mcp.tool_accepted");
    assert_eq!(accepted.len(), 1);
    assert_eq!(accepted[0].payload["by"], "ada");
    assert_eq!(accepted[0].payload["reason"], "reviewed the new hints");
}
