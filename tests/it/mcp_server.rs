//! flow as an MCP server, driven by a real MCP client — the official Python SDK
//! (`tests/it/mcp/client.py`), not flow's own — over Streamable HTTP (`/mcp` on `flow
//! daemon --serve`) and stdio (`flow mcp serve`), on both backends, against a counting
//! downstream: a call starts at most one run and one effect however the client repeats
//! it, a gated call waits for a person the agent cannot stand in for, and a call in
//! doubt is never an invitation to retry.

use std::process::Command;
use std::time::Duration;

use flow_adapters::testkit::http::{Behavior, CountingServer};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::{Server, call, start};
use crate::support::{Backend, TestDb, backends, repo, runtime};

/// The agent's token (an operator: it may start runs).
pub(crate) const AGENT: &str = "agent-token-1";
/// A person's token (an operator who approves).
pub(crate) const ALICE: &str = "alice-token-1";

/// `flow.toml`'s two operators: the agent and a person.
pub(crate) const TOKENS: &str = r#"
[[api.tokens]]
name = "agent"
role = "operator"
secret = "AGENT_TOKEN"

[[api.tokens]]
name = "alice"
role = "operator"
secret = "ALICE_TOKEN"
"#;

/// `flow.toml`: the two operators, the tools under `tools/`, a one-second window.
fn config() -> String {
    format!("{TOKENS}\n[mcp]\nworkflows = [\"tools/*.yaml\"]\nwindow = \"1s\"\n")
}

/// The workflows offered: a refund (one POST), the same behind an approval, a pure
/// lookup, and a refund whose downstream hangs past its timeout.
fn tools(db: &TestDb, url: &str) {
    std::fs::create_dir_all(db.dir.path().join("tools")).expect("tools dir");
    db.write(
        "tools/refund.yaml",
        &format!(
            r#"name: refund
description: Refunds a charge.
inputs:
  charge: {{ type: string, required: true, description: The charge id }}
  amount: {{ type: integer, default: 100 }}
tools:
  pay: {{ kind: http, method: POST, url: "{url}/refund", timeout: 5s }}
nodes:
  send: {{ tool: pay, with: {{ charge: "${{{{ inputs.charge }}}}", amount: "${{{{ inputs.amount }}}}" }} }}
"#
        ),
    );
    db.write(
        "tools/gated.yaml",
        &format!(
            r#"name: refund_gated
inputs:
  charge: {{ type: string, required: true }}
tools:
  pay: {{ kind: http, method: POST, url: "{url}/refund", timeout: 5s }}
nodes:
  send:
    tool: pay
    with: {{ charge: "${{{{ inputs.charge }}}}" }}
    approval: {{ message: "Refund ${{{{ inputs.charge }}}}", timeout: 1h }}
"#
        ),
    );
    db.write(
        "tools/lookup.yaml",
        r#"name: lookup
inputs:
  charge: { type: string, required: true }
tools:
  echo: { kind: function, function: core.echo }
nodes:
  find: { tool: echo, with: { charge: "${{ inputs.charge }}" } }
"#,
    );
    db.write(
        "tools/fanout.yaml",
        &format!(
            r#"name: fanout
inputs:
  ids: {{ type: array, required: true }}
tools:
  pay: {{ kind: http, method: POST, url: "{url}/item", timeout: 5s }}
nodes:
  each:
    for_each: {{ items: "${{{{ inputs.ids }}}}", key: "${{{{ item }}}}", concurrency: 2 }}
    tool: pay
    with: {{ id: "${{{{ item }}}}" }}
"#
        ),
    );
    db.write(
        "tools/slow.yaml",
        &format!(
            r#"name: refund_slow
inputs:
  charge: {{ type: string, required: true }}
tools:
  pay: {{ kind: http, method: POST, url: "{url}/slow", timeout: 1s }}
nodes:
  send: {{ tool: pay, with: {{ charge: "${{{{ inputs.charge }}}}" }}, retry_policy: {{ max_retries: 0 }} }}
"#
        ),
    );
}

/// `flow daemon --serve` for `db` with the tools of [`tools`], once it listens.
pub(crate) fn daemon(db: &TestDb) -> Server {
    let mut cmd = db.flow();
    cmd.args([
        "daemon",
        "--poll-interval",
        "100ms",
        "--serve",
        "127.0.0.1:0",
    ])
    .env("FLOW_SECRET_AGENT_TOKEN", AGENT)
    .env("FLOW_SECRET_ALICE_TOKEN", ALICE);
    start(cmd, "API at ")
}

/// Starts `cmd` (a `flow daemon --serve`) with its stderr in `log`, once it listens.
pub(crate) fn logged(mut cmd: Command, log: &std::path::Path) -> Server {
    let file = std::fs::File::create(log).expect("log file");
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(file)
        .spawn()
        .expect("flow starts");
    let mut server = Server {
        child,
        base: String::new(),
    };
    for _ in 0..400 {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(rest) = text.split("API at ").nth(1) {
            let url = rest.split_whitespace().next().unwrap_or_default();
            server.base = url.trim_end_matches("/api/v1").to_owned();
            return server;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!(
        "flow did not start listening: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// Whether the official MCP Python SDK is importable (`.ci/test` installs it); without
/// it the test is skipped with a note, except under CI, where it fails.
pub(crate) fn sdk() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import mcp"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            !flow_adapters::testkit::flags::ci(),
            "the MCP Python SDK is missing (`pip install mcp==2.3.0`, as .ci/test does)"
        );
        eprintln!("note: skipped: the MCP Python SDK is missing (`pip install mcp==2.3.0`)");
    }
    found
}

/// Runs the Python SDK client on `target` with `steps`: one JSON value per step.
pub(crate) fn client(target: &Value, steps: &Value) -> Vec<Value> {
    let script = repo().join("tests/it/mcp/client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(target.to_string())
        .arg(steps.to_string())
        .output()
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the MCP client failed (CI installs the SDK: `pip install mcp==2.3.0`):\n{stderr}"
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The HTTP target of `server` as `token`.
pub(crate) fn http(server: &Server, token: &str) -> Value {
    json!({"http": format!("{}/mcp", server.base), "token": token})
}

/// A call step.
fn call_step(tool: &str, args: Value, key: Option<&str>) -> Value {
    json!({"op": "call", "tool": tool, "args": args, "key": key})
}

/// The run id and status of a result.
pub(crate) fn run_of(result: &Value) -> (String, String) {
    let s = &result["structuredContent"];
    (
        s["run_id"].as_str().unwrap_or_default().to_owned(),
        s["status"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The result's text.
pub(crate) fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn an_agent_calls_workflows_at_most_once_and_waits_for_a_person_on_both_backends() {
    if !sdk() {
        return;
    }
    for backend in backends() {
        agent_over_http(backend);
    }
}

fn agent_over_http(backend: Backend) {
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(backend);
    db.write("flow.toml", &config());
    tools(&db, &down.url());
    let server = daemon(&db);
    let agent = http(&server, AGENT);

    // The catalog: names, schemas and annotations derived from the workflows.
    let listed = client(&agent, &json!([{"op": "list"}]));
    let tools = listed[0]["tools"].as_array().expect("tools").clone();
    let tool = |name: &str| {
        tools
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no tool {name} in {tools:?}"))
            .clone()
    };
    let refund = tool("refund");
    assert_eq!(refund["description"], "Refunds a charge.");
    assert_eq!(refund["inputSchema"]["required"], json!(["charge"]));
    assert_eq!(
        refund["inputSchema"]["properties"]["amount"]["default"],
        100
    );
    assert_eq!(refund["annotations"]["readOnlyHint"], false);
    assert_eq!(refund["annotations"]["destructiveHint"], true);
    assert_eq!(tool("lookup")["annotations"]["readOnlyHint"], true);
    tool("refund_gated");
    tool("flow_run_status");

    // A short workflow: its output, one effect.
    let r = client(
        &agent,
        &json!([call_step("refund", json!({"charge": "ch_1"}), None)]),
    );
    let (first, status) = run_of(&r[0]);
    assert_eq!(status, "succeeded", "{}", r[0]);
    let output = r[0]["structuredContent"]["output"]["send"].to_string();
    assert!(output.contains("ch_1"), "the downstream's answer: {}", r[0]);
    assert_eq!(down.total(), 1);

    // One call sent twice 3 ms apart with new JSON-RPC ids, then again after a
    // reconnect within the window: one run, one effect.
    let step = json!({"op": "twice", "tool": "refund", "args": {"charge": "ch_2"}, "gap_ms": 3});
    let r = client(
        &agent,
        &json!([step, {"op": "reconnect"}, call_step("refund", json!({"charge": "ch_2"}), None)]),
    );
    let pair = r[0]["results"].as_array().expect("two results");
    let ids: Vec<String> = pair.iter().chain([&r[2]]).map(|x| run_of(x).0).collect();
    assert!(ids.iter().all(|i| i == &ids[0] && i != &first), "{ids:?}");
    let coalesced = pair
        .iter()
        .chain([&r[2]])
        .filter(|x| x["_meta"]["io.flow/coalesced"] == true)
        .count();
    assert_eq!(coalesced, 2, "{r:?}");
    assert_eq!(down.total(), 2, "one effect for three identical calls");

    // After the window the same arguments are a new call; with a key, the same key is
    // the same call however late (here: after a daemon restart and the window).
    std::thread::sleep(Duration::from_millis(1_100));
    let r = client(
        &agent,
        &json!([call_step("refund", json!({"charge": "ch_2"}), None)]),
    );
    assert_ne!(run_of(&r[0]).0, ids[0], "a new call after the window");
    assert_eq!(down.total(), 3);
    let keyed = call_step("refund", json!({"charge": "ch_3"}), Some("k-3"));
    let r = client(&agent, &json!([keyed]));
    let (k3, status) = run_of(&r[0]);
    assert_eq!(status, "succeeded");
    assert_eq!(
        r[0]["_meta"]["io.flow/coalesced"], false,
        "a keyed retry is not a coalesce"
    );
    drop(server);
    let server = daemon(&db);
    let agent = http(&server, AGENT);
    std::thread::sleep(Duration::from_millis(1_100));
    let other = call_step("refund", json!({"charge": "ch_other"}), Some("k-3"));
    let r = client(&agent, &json!([keyed, other]));
    assert_eq!(run_of(&r[0]), (k3.clone(), "succeeded".into()), "{}", r[0]);
    assert_eq!(r[1]["isError"], true, "{}", r[1]);
    assert!(
        text(&r[1]).contains("used before with other arguments"),
        "{}",
        r[1]
    );
    assert_eq!(down.total(), 4, "the keyed call was sent once");

    gated(&rt, &server, &down);
    in_doubt(&server, &down);
}

/// A gated call answers "waiting" naming who approves; the agent's own token cannot
/// approve (403); a person's can, and the same call then answers with the output.
fn gated(rt: &tokio::runtime::Runtime, server: &Server, down: &CountingServer) {
    let agent = http(server, AGENT);
    let before = down.total();
    let step = call_step("refund_gated", json!({"charge": "ch_4"}), Some("k-4"));
    let r = client(&agent, &json!([step]));
    let (run, status) = run_of(&r[0]);
    assert_eq!(status, "waiting", "{}", r[0]);
    assert_eq!(r[0]["isError"], false);
    assert_eq!(r[0]["structuredContent"]["waiting_for"]["kind"], "approval");
    assert!(text(&r[0]).contains("You cannot approve it"), "{}", r[0]);
    assert_eq!(down.total(), before, "nothing is sent before the approval");
    let path = format!("/api/v1/runs/{run}/approvals/send");
    let approve = json!({"decision": "approve"});
    rt.block_on(async {
        let (s, p) = call(server, "POST", &path, Some(AGENT), Some(approve.clone())).await;
        assert_eq!(
            s,
            StatusCode::FORBIDDEN,
            "the agent approves its own call: {p}"
        );
        assert!(
            p["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("over MCP"),
            "{p}"
        );
        let (s, p) = call(server, "POST", &path, Some(ALICE), Some(approve)).await;
        assert_eq!(s, StatusCode::OK, "{p}");
    });
    let r = client(&agent, &json!([step]));
    assert_eq!(run_of(&r[0]), (run.clone(), "succeeded".into()), "{}", r[0]);
    assert_eq!(down.total(), before + 1);
    // The status tool answers for the run too.
    let status = json!({"op": "call", "tool": "flow_run_status", "args": {"run_id": run}});
    let r = client(&agent, &json!([status]));
    assert_eq!(run_of(&r[0]).1, "succeeded", "{}", r[0]);
}

/// A call whose answer is lost is in doubt: the agent is told flow will not send it
/// again, and calling again sends nothing.
fn in_doubt(server: &Server, down: &CountingServer) {
    down.set("/slow", Behavior::hold(Duration::from_secs(3)));
    let agent = http(server, AGENT);
    let step = call_step("refund_slow", json!({"charge": "ch_5"}), Some("k-5"));
    let r = client(&agent, &json!([step, step]));
    for x in &r {
        assert_eq!(run_of(x).1, "in_doubt", "{x}");
        assert_eq!(x["isError"], true);
        assert!(text(x).contains("flow will not send it again"), "{x}");
    }
    assert_eq!(run_of(&r[0]).0, run_of(&r[1]).0);
    let sent = down.log().iter().filter(|x| x.path == "/slow").count();
    assert_eq!(sent, 1, "sent once, never again");
}

/// `flow mcp serve` speaks MCP on stdio and runs the calls itself; stdout carries only
/// MCP (the SDK would fail on anything else).
#[test]
fn an_agent_calls_a_workflow_over_stdio() {
    if !sdk() {
        return;
    }
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(Backend::Sqlite);
    db.write("flow.toml", &config());
    tools(&db, &down.url());
    let dir = db.dir.path().to_string_lossy().into_owned();
    let target = json!({
        "stdio": [env!("CARGO_BIN_EXE_flow"), "--db", db.url, "--config", format!("{dir}/flow.toml"),
                  "mcp", "serve", "--principal", "desktop", "--poll-interval", "100ms"],
    });
    let r = client(
        &target,
        &json!([{"op": "list"}, call_step("refund", json!({"charge": "ch_9"}), Some("k-9"))]),
    );
    assert!(
        r[0]["tools"].as_array().is_some_and(|t| t.len() == 6),
        "{}",
        r[0]
    );
    let (run, status) = run_of(&r[1]);
    assert_eq!(status, "succeeded", "{}", r[1]);
    assert!(run.starts_with("mcp_"), "{run}");
    assert_eq!(down.total(), 1);
}

/// A task-aware agent (the SDK with the tasks extension declared) gets a task for a
/// gated call; the task completes with the call's output once a person approves
/// through the API. A task the agent cancels ends cancelled, and nothing is sent.
#[test]
fn a_gated_call_is_a_task_that_completes_after_approval_or_ends_when_cancelled() {
    if !sdk() {
        return;
    }
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(Backend::Sqlite);
    db.write("flow.toml", &config());
    tools(&db, &down.url());
    let server = daemon(&db);
    let mut agent = http(&server, AGENT);
    agent["tasks"] = json!(true);

    let step = call_step("refund_gated", json!({"charge": "ch_t1"}), Some("k-t1"));
    let script = repo().join("tests/it/mcp/client.py");
    let waiting = Command::new("python3")
        .arg(&script)
        .arg(agent.to_string())
        .arg(json!([step]).to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    // A person approves the pending call through the API.
    let run = rt.block_on(async {
        for _ in 0..200 {
            let (_, list) = call(&server, "GET", "/api/v1/approvals", Some(ALICE), None).await;
            let pending = list["items"].as_array().and_then(|a| {
                a.iter()
                    .find(|x| x["status"] == "pending")
                    .and_then(|x| x["run"].as_str().map(str::to_owned))
            });
            if let Some(run) = pending {
                // The approval is listed as its run pauses: a decision a moment too
                // early is refused, and made again.
                let path = format!("/api/v1/runs/{run}/approvals/send");
                let approve = Some(json!({"decision": "approve"}));
                let (s, p) = call(&server, "POST", &path, Some(ALICE), approve).await;
                if s == StatusCode::OK {
                    return run;
                }
                eprintln!("approve answered {s}: {p}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no pending approval appeared");
    });
    let out = waiting.wait_with_output().expect("the client ends");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(run_of(&r), (run.clone(), "succeeded".into()), "{r}");
    let task = &r["task"];
    assert_eq!(task["task_id"], run.as_str(), "the task is the run: {r}");
    let statuses = task["statuses"].as_array().expect("statuses");
    assert_eq!(statuses.first(), Some(&json!("working")), "{r}");
    assert_eq!(statuses.last(), Some(&json!("completed")), "{r}");
    assert!(
        task["first_message"]
            .as_str()
            .is_some_and(|m| m.contains("to approve node `send`")),
        "the task says what it waits for: {r}"
    );
    assert_eq!(down.total(), 1);

    // Cancelled by the agent: the run ends cancelled, nothing is sent.
    let mut cancel = call_step("refund_gated", json!({"charge": "ch_t2"}), Some("k-t2"));
    cancel["cancel"] = json!(true);
    let r = client(&agent, &json!([cancel]));
    assert_eq!(r[0]["isError"], true, "{}", r[0]);
    assert_eq!(
        r[0]["task"]["statuses"].as_array().and_then(|s| s.last()),
        Some(&json!("cancelled")),
        "{}",
        r[0]
    );
    let id = r[0]["task"]["task_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let status = rt.block_on(call(
        &server,
        "GET",
        &format!("/api/v1/runs/{id}"),
        Some(ALICE),
        None,
    ));
    assert_eq!(status.1["run"]["status"], "cancelled", "{}", status.1);
    assert_eq!(down.total(), 1, "a cancelled task sends nothing");
}

/// The conformance suite of the MCP project (`@modelcontextprotocol/conformance`,
/// pinned; run with the machine's Node.js) passes every server scenario that applies to
/// a server without the suite's own test tools: `server-initialize`, `ping`,
/// `tools-list` and `dns-rebinding-protection` (`flow serve` without authentication, on
/// loopback, where the API's Host check guards `/mcp`). Skipped, and why: the
/// `tools-call-*`, `resources-*`, `prompts-*`, `logging-set-level`,
/// `completion-complete` and `elicitation-*` scenarios call tools, resources and
/// prompts the suite expects the server to define (flow's tools are its workflows);
/// `server-sse-multiple-streams` checks nothing here (flow answers JSON, not SSE).
#[test]
fn the_mcp_conformance_suite_passes_the_scenarios_that_apply() {
    const SUITE: &str = "@modelcontextprotocol/conformance@0.1.12";
    let has_npx = Command::new("npx")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_npx {
        assert!(!flow_adapters::testkit::flags::ci(), "npx is missing");
        eprintln!("note: skipped: npx is missing");
        return;
    }
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(Backend::Sqlite);
    db.write("flow.toml", "[mcp]\nworkflows = [\"tools/*.yaml\"]\n");
    tools(&db, &down.url());
    let mut cmd = db.flow();
    cmd.args(["serve", "--addr", "127.0.0.1:0", "--insecure-no-auth"]);
    let server = start(cmd, "listening on ");
    // Without the colours it paints its verdicts with.
    let ansi = regex::Regex::new("\x1b\\[[0-9;]*m").expect("regex");
    let verdict = regex::Regex::new(r"Passed: (\d+)/(\d+), 0 failed").expect("regex");
    for scenario in [
        "server-initialize",
        "ping",
        "tools-list",
        "dns-rebinding-protection",
    ] {
        let out = Command::new("npx")
            .args([
                "-y",
                SUITE,
                "server",
                "--url",
                &format!("{}/mcp", server.base),
            ])
            .args(["--scenario", scenario])
            .output()
            .expect("npx runs");
        let text = ansi
            .replace_all(&String::from_utf8_lossy(&out.stdout), "")
            .into_owned();
        let passed = verdict
            .captures(&text)
            .is_some_and(|c| c[1] == c[2] && &c[1] != "0");
        assert!(
            passed,
            "{scenario}:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A call of a workflow that fans out, asked with a `progressToken`, gets progress
/// notifications counting the items done out of the items listed, ending at all of them.
#[test]
fn a_fan_out_reports_its_items_as_progress() {
    if !sdk() {
        return;
    }
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    down.set("/item", Behavior::hold(Duration::from_millis(80)));
    let db = TestDb::new(Backend::Sqlite);
    db.write("flow.toml", &config());
    tools(&db, &down.url());
    let server = daemon(&db);
    let ids: Vec<String> = (0..8).map(|i| format!("i{i}")).collect();
    let mut step = call_step("fanout", json!({"ids": ids}), Some("f1"));
    step["progress"] = json!(true);
    let r = client(&http(&server, AGENT), &json!([step]));
    assert_eq!(run_of(&r[0]).1, "succeeded", "{}", r[0]);
    let progress = r[0]["progress"].as_array().cloned().unwrap_or_default();
    assert!(!progress.is_empty(), "no progress: {}", r[0]);
    assert!(progress.iter().all(|p| p["total"] == 8.0), "{progress:?}");
    assert_eq!(
        progress.last().map(|p| p["progress"].clone()),
        Some(json!(8.0)),
        "{progress:?}"
    );
    let values: Vec<f64> = progress
        .iter()
        .filter_map(|p| p["progress"].as_f64())
        .collect();
    assert!(
        values.windows(2).all(|w| w[0] <= w[1]),
        "progress only grows: {values:?}"
    );
    assert_eq!(down.total(), 8);
}
