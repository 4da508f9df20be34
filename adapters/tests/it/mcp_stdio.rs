//! MCP over stdio: the pool against `flow-testkit mcp-stdio` child processes.

use std::path::Path;
use std::time::{Duration, Instant};

use flow_adapters::mcp::{Auth, Pool, ServerSpec, Spec};
use flow_adapters::testkit::mcp::read_count_file;
use flow_adapters::{Call, FailureKind, SideEffect, Tool};
use serde_json::{Value, json};

use crate::support::{assert_kind, call, call_within, ok};

fn testkit() -> String {
    env!("CARGO_BIN_EXE_flow-testkit").to_string()
}

fn server(count_file: &Path) -> ServerSpec {
    ServerSpec::Stdio {
        command: vec![
            testkit(),
            "mcp-stdio".to_string(),
            "--count-file".to_string(),
            count_file.to_string_lossy().to_string(),
        ],
        env: vec![],
        cwd: None,
    }
}

fn spec(server: &ServerSpec, tool: &str) -> Spec {
    Spec {
        server: server.clone(),
        tool: tool.to_string(),
        auth: Auth::None,
        read_only_override: None,
        elicitation: flow_adapters::mcp::Elicitation::Decline,
        meta: true,
        pinned: None,
    }
}

fn pool() -> Pool {
    Pool::new().unwrap_or_else(|e| panic!("{e}"))
}

/// (initialize lines, call lines, distinct pids) of a count file.
fn tally(path: &Path) -> (usize, usize, Vec<u64>) {
    let lines = read_count_file(path);
    let inits = lines.iter().filter(|l| l["event"] == "initialize").count();
    let calls = lines.iter().filter(|l| l["event"] == "call").count();
    let mut pids: Vec<u64> = lines.iter().filter_map(|l| l["pid"].as_u64()).collect();
    pids.dedup();
    (inits, calls, pids)
}

#[tokio::test]
async fn structured_text_and_json_text_results() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let server = server(&dir.path().join("calls.jsonl"));
    let pool = pool();
    let outcome = pool
        .tool(spec(&server, "echo"))
        .call(call(json!({"a": 1, "b": [true]})))
        .await;
    assert_eq!(ok(&outcome), &json!({"a": 1, "b": [true]}));
    assert_eq!(outcome.requests_sent, 1);
    let text = pool.tool(spec(&server, "text")).call(call(json!({}))).await;
    assert_eq!(ok(&text), &json!("plain text"));
    let json_text = pool
        .tool(spec(&server, "json_text"))
        .call(call(Value::Null))
        .await;
    assert_eq!(ok(&json_text), &json!({"answer": 42}));
    let texts = pool
        .tool(spec(&server, "texts"))
        .call(call(json!({})))
        .await;
    assert_eq!(ok(&texts), &json!(["one", {"two": 2}]));
}

#[tokio::test]
async fn is_error_is_permanent_with_the_tools_text() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let server = server(&dir.path().join("calls.jsonl"));
    let outcome = pool()
        .tool(spec(&server, "fail"))
        .call(call(json!({"message": "ticket system is read-only today"})))
        .await;
    assert_kind(
        &outcome,
        FailureKind::Permanent,
        "ticket system is read-only today",
    );
    assert_eq!(outcome.requests_sent, 1);
}

#[tokio::test]
async fn unknown_tool_and_bad_args_are_permanent() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let server = server(&dir.path().join("calls.jsonl"));
    let pool = pool();
    let outcome = pool
        .tool(spec(&server, "no_such_tool"))
        .call(call(json!({})))
        .await;
    assert_kind(&outcome, FailureKind::Permanent, "JSON-RPC error");
    assert_eq!(outcome.requests_sent, 1);
    let outcome = pool
        .tool(spec(&server, "echo"))
        .call(call(json!([1, 2])))
        .await;
    assert_kind(&outcome, FailureKind::Permanent, "must be an object");
    assert_eq!(outcome.requests_sent, 0);
}

#[tokio::test]
async fn one_session_serves_many_calls() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let count_file = dir.path().join("calls.jsonl");
    let server = server(&count_file);
    let pool = pool();
    for n in 1..=5 {
        let outcome = pool
            .tool(spec(&server, "count"))
            .call(call(json!({"key": "k"})))
            .await;
        assert_eq!(ok(&outcome), &json!({"key": "k", "count": n}));
    }
    // A clone of the pool shares the session.
    let clone = pool.clone();
    ok(&clone
        .tool(spec(&server, "count"))
        .call(call(json!({"key": "k"})))
        .await);
    let (inits, calls, pids) = tally(&count_file);
    assert_eq!((inits, calls), (1, 6), "one initialize for six calls");
    assert_eq!(pids.len(), 1, "one server process");
}

#[tokio::test]
async fn a_killed_server_is_restarted_on_the_next_call() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let count_file = dir.path().join("calls.jsonl");
    let server = server(&count_file);
    let pool = pool();
    ok(&pool
        .tool(spec(&server, "count"))
        .call(call(json!({"key": "a"})))
        .await);
    let (_, _, pids) = tally(&count_file);
    let pid = i32::try_from(pids[0]).unwrap_or_else(|e| panic!("{e}"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap_or_else(|e| panic!("kill {pid}: {e}"));
    // Let the session notice the closed pipe (it does so as soon as it reads EOF).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let outcome = pool
        .tool(spec(&server, "count"))
        .call(call(json!({"key": "a"})))
        .await;
    assert_eq!(
        ok(&outcome),
        &json!({"key": "a", "count": 1}),
        "a fresh server counts from 1"
    );
    let (inits, calls, pids) = tally(&count_file);
    assert_eq!((inits, calls), (2, 2));
    assert_eq!(pids.len(), 2, "a second server process");
}

#[tokio::test]
async fn a_server_dying_mid_call_is_unknown_then_restarted() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let count_file = dir.path().join("calls.jsonl");
    let server = server(&count_file);
    let pool = pool();
    let outcome = pool
        .tool(spec(&server, "crash"))
        .call(call(json!({})))
        .await;
    assert_kind(&outcome, FailureKind::Unknown, "may have been processed");
    assert_eq!(outcome.requests_sent, 1);
    let outcome = pool
        .tool(spec(&server, "echo"))
        .call(call(json!({"after": "crash"})))
        .await;
    assert_eq!(ok(&outcome), &json!({"after": "crash"}));
    let (inits, _, pids) = tally(&count_file);
    assert_eq!(inits, 2);
    assert_eq!(pids.len(), 2);
}

#[tokio::test]
async fn timeout_during_a_call_is_unknown() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let server = server(&dir.path().join("calls.jsonl"));
    let pool = pool();
    // Start the session first, so the timeout falls on the call itself.
    ok(&pool.tool(spec(&server, "echo")).call(call(json!({}))).await);
    let outcome = pool
        .tool(spec(&server, "slow"))
        .call(call_within(json!({"ms": 5000}), Duration::from_millis(300)))
        .await;
    assert_kind(
        &outcome,
        FailureKind::Unknown,
        "timed out after the call was sent",
    );
    assert_eq!(outcome.requests_sent, 1);
}

#[tokio::test]
async fn annotations_feed_the_side_effect_class() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let server = server(&dir.path().join("calls.jsonl"));
    let pool = pool();
    let timeout = Duration::from_secs(10);
    let lookup = pool
        .annotations(&spec(&server, "lookup"), timeout)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("lookup is listed"));
    assert!(lookup.read_only);
    let delete = pool
        .annotations(&spec(&server, "delete_thing"), timeout)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("delete_thing is listed"));
    assert!(delete.destructive && !delete.read_only);
    for tool in ["set_flag", "echo"] {
        pool.annotations(&spec(&server, tool), timeout)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let missing = pool.annotations(&spec(&server, "nope"), timeout).await;
    assert_eq!(missing, Ok(None));

    assert_eq!(
        pool.tool(spec(&server, "lookup")).side_effect(),
        SideEffect::ReadOnly
    );
    assert_eq!(
        pool.tool(spec(&server, "set_flag")).side_effect(),
        SideEffect::ReadOnly
    );
    assert_eq!(
        pool.tool(spec(&server, "delete_thing")).side_effect(),
        SideEffect::NotIdempotent
    );
    assert_eq!(
        pool.tool(spec(&server, "echo")).side_effect(),
        SideEffect::NotIdempotent
    );
    let mut overridden = spec(&server, "lookup");
    overridden.read_only_override = Some(false);
    assert_eq!(
        pool.tool(overridden).side_effect(),
        SideEffect::NotIdempotent
    );
    let mut overridden = spec(&server, "delete_thing");
    overridden.read_only_override = Some(true);
    assert_eq!(pool.tool(overridden).side_effect(), SideEffect::ReadOnly);
    // Without annotations fetched, an unknown tool is not assumed read-only.
    assert_eq!(
        pool.tool(spec(&server, "never_listed")).side_effect(),
        SideEffect::NotIdempotent
    );
}

#[tokio::test]
async fn a_server_that_never_initializes_is_not_sent_within_the_timeout() {
    let server = ServerSpec::Stdio {
        command: vec!["sleep".to_string(), "30".to_string()],
        env: vec![],
        cwd: None,
    };
    let started = Instant::now();
    let outcome = pool()
        .tool(spec(&server, "echo"))
        .call(Call::new(json!({}), "k", Duration::from_millis(700)))
        .await;
    assert_kind(
        &outcome,
        FailureKind::NotSent,
        "timed out starting the session",
    );
    assert_eq!(outcome.requests_sent, 0);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_server_that_exits_or_cannot_start_is_not_sent() {
    let exits = ServerSpec::Stdio {
        command: vec![
            "sh".to_string(),
            "-c".to_string(),
            "echo 'missing config file' >&2; exit 1".to_string(),
        ],
        env: vec![],
        cwd: None,
    };
    let pool = pool();
    let outcome = pool.tool(spec(&exits, "echo")).call(call(json!({}))).await;
    assert_kind(&outcome, FailureKind::NotSent, "missing config file");
    assert_eq!(outcome.requests_sent, 0);

    let missing = ServerSpec::Stdio {
        command: vec!["/nonexistent/mcp-server".to_string()],
        env: vec![],
        cwd: None,
    };
    let outcome = pool
        .tool(spec(&missing, "echo"))
        .call(call(json!({})))
        .await;
    assert_kind(
        &outcome,
        FailureKind::NotSent,
        "cannot start `/nonexistent/mcp-server`",
    );
    assert_eq!(outcome.requests_sent, 0);
}

#[tokio::test]
async fn declared_env_reaches_the_server_and_nothing_else_does() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let env_file = dir.path().join("env.txt");
    // A wrapper that records its environment, then becomes the test server.
    let script = format!("env > {}; exec {} mcp-stdio", env_file.display(), testkit());
    let server = ServerSpec::Stdio {
        command: vec!["sh".to_string(), "-c".to_string(), script],
        env: vec![("MCP_TOKEN".to_string(), "declared".to_string())],
        cwd: Some(dir.path().to_path_buf()),
    };
    ok(&pool()
        .tool(spec(&server, "echo"))
        .call(call(json!({})))
        .await);
    let env = std::fs::read_to_string(&env_file).unwrap_or_else(|e| panic!("{e}"));
    assert!(env.lines().any(|l| l == "MCP_TOKEN=declared"), "{env}");
    assert!(
        !env.contains("CARGO_"),
        "the test's environment leaked: {env}"
    );
}

/// Whether process `pid` is gone (or a zombie awaiting its reaper).
fn is_gone(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_gone(pid: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !is_gone(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    is_gone(pid)
}

#[tokio::test]
async fn closing_or_dropping_the_pool_ends_the_server() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let first = dir.path().join("first.jsonl");
    let pool = pool();
    ok(&pool
        .tool(spec(&server(&first), "echo"))
        .call(call(json!({})))
        .await);
    let (_, _, pids) = tally(&first);
    pool.close().await;
    assert!(
        wait_gone(pids[0]).await,
        "close() left server {} running",
        pids[0]
    );

    let second = dir.path().join("second.jsonl");
    let pool = self::pool();
    ok(&pool
        .tool(spec(&server(&second), "echo"))
        .call(call(json!({})))
        .await);
    let (_, _, pids) = tally(&second);
    drop(pool);
    assert!(
        wait_gone(pids[0]).await,
        "dropping the pool left server {} running",
        pids[0]
    );
}
