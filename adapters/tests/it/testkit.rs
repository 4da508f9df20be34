//! The `flow-testkit` binary, driven the way the engine's end-to-end tests drive it.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use flow_adapters::http::{Client, Spec as HttpSpec};
use flow_adapters::mcp::{Auth, ClientAuth, Pool, ServerSpec, Spec};
use flow_adapters::testkit::http::{Behavior, Remote, read_log_file};
use flow_adapters::testkit::{self};
use flow_adapters::{FailureKind, Tool};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::support::{assert_kind, call, ok};

/// Starts `flow-testkit ARGS --print-url` and returns the child and the printed URL.
async fn spawn(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(testkit::bin_path())
        .args(args)
        .arg("--print-url")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawning flow-testkit: {e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let mut lines = BufReader::new(stdout).lines();
    let url = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("flow-testkit printed no URL"))
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("flow-testkit exited"));
    (child, url)
}

#[test]
fn bin_path_finds_the_binary_cargo_built() {
    let found = std::fs::canonicalize(testkit::bin_path()).unwrap_or_else(|e| panic!("{e}"));
    let built = std::fs::canonicalize(Path::new(env!("CARGO_BIN_EXE_flow-testkit")))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(found, built);
}

#[tokio::test]
async fn http_server_is_controlled_from_another_process_and_logs_to_a_file() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let log_file = dir.path().join("arrivals.jsonl");
    let log_arg = log_file.to_string_lossy().to_string();
    let (_child, url) = spawn(&["http", "--addr", "127.0.0.1:0", "--log-file", &log_arg]).await;
    let remote = Remote::new(&url);
    let client = Client::new().unwrap_or_else(|e| panic!("{e}"));
    let tool = client.tool(HttpSpec::new("POST", format!("{url}/pay")));

    remote
        .set("/pay", &Behavior::status_retry_after(503, "1"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let outcome = tool.call(call(json!({"n": 1}))).await;
    assert_eq!(
        crate::support::err(&outcome).kind,
        FailureKind::Transient {
            retry_after: Some(Duration::from_secs(1))
        }
    );

    remote
        .set("/pay", &Behavior::HoldUntilReleased)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let held = tokio::spawn({
        let tool = tool.clone();
        async move { tool.call(call(json!({"n": 2}))).await }
    });
    // Release once the held request has arrived.
    for _ in 0..100 {
        if remote.state().await.map(|s| s.total).unwrap_or(0) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    remote.release().await.unwrap_or_else(|e| panic!("{e}"));
    let outcome = held.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        ok(&outcome)["count"],
        json!(2),
        "both requests carried key k-1"
    );

    let state = remote.state().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(state.total, 2);
    assert_eq!(state.counts.get("k-1"), Some(&2));
    assert_eq!(state.completed.get("k-1"), Some(&2));
    let lines = read_log_file(&log_file).unwrap_or_else(|e| panic!("{e}"));
    let arrived = lines.iter().filter(|l| l["event"] == "arrived").count();
    let completed = lines.iter().filter(|l| l["event"] == "completed").count();
    assert_eq!((arrived, completed), (2, 2));

    remote.reset().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(remote.state().await.map(|s| s.total).unwrap_or(99), 0);
}

#[tokio::test]
async fn mcp_http_server_with_oauth_from_the_binary() {
    let (_child, url) = spawn(&[
        "mcp-http",
        "--addr",
        "127.0.0.1:0",
        "--auth-scope",
        "tools:write",
    ])
    .await;
    let token_url = url.replace("/mcp", "/token");
    let spec = Spec {
        server: ServerSpec::Http {
            url,
            headers: vec![],
        },
        tool: "count".to_string(),
        auth: Auth::ClientCredentials {
            token_url: Some(token_url),
            client_id: "flow".to_string(),
            client_auth: ClientAuth::Secret("flow-secret".to_string()),
            scope: None,
        },
        read_only_override: None,
        elicitation: flow_adapters::mcp::Elicitation::Decline,
        meta: true,
        pinned: None,
    };
    let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
    let outcome = pool
        .tool(spec.clone())
        .call(call(json!({"key": "x"})))
        .await;
    assert_eq!(ok(&outcome), &json!({"key": "x", "count": 1}));
    assert_eq!(outcome.requests_sent, 2);

    let wrong = Spec {
        auth: Auth::Bearer("not-a-token".to_string()),
        ..spec
    };
    let outcome = pool.tool(wrong).call(call(json!({"key": "x"}))).await;
    assert_kind(&outcome, FailureKind::Permanent, "invalid_token");
}
