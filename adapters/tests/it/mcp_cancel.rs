//! A `tools/call` whose attempt times out is cancelled with `notifications/cancelled`
//! and stays unknown (in doubt), never failed: over stdio and streamable HTTP.

use std::time::Duration;

use flow_adapters::mcp::{Auth, Pool, ServerSpec, Spec};
use flow_adapters::testkit::mcp::{HttpServer, read_count_file};
use flow_adapters::{FailureKind, Tool};
use serde_json::json;

use crate::support::{assert_kind, call_within};

fn spec(server: ServerSpec) -> Spec {
    Spec {
        server,
        tool: "slow".to_string(),
        auth: Auth::None,
        read_only_override: None,
        elicitation: flow_adapters::mcp::Elicitation::Decline,
        meta: true,
        pinned: None,
    }
}

/// Waits up to 5 s for `seen` to hold.
async fn eventually(mut seen: impl FnMut() -> bool) -> bool {
    for _ in 0..100 {
        if seen() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn a_timed_out_call_over_http_is_cancelled_and_in_doubt() {
    let server = HttpServer::start(None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
    let tool = pool.tool(spec(ServerSpec::Http {
        url: server.url(),
        headers: vec![],
    }));
    let outcome = tool
        .call(call_within(
            json!({"ms": 30_000}),
            Duration::from_millis(700),
        ))
        .await;
    assert_kind(&outcome, FailureKind::Unknown, "notifications/cancelled");
    assert_eq!(outcome.requests_sent, 1);
    assert_eq!(server.stats().calls("slow"), 1);
    assert!(
        eventually(|| server.stats().cancelled() == 1).await,
        "the server never saw the cancellation"
    );
    pool.close().await;
}

#[tokio::test]
async fn a_timed_out_call_over_stdio_is_cancelled_and_in_doubt() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let count_file = dir.path().join("calls.jsonl");
    let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
    let tool = pool.tool(spec(ServerSpec::Stdio {
        command: vec![
            env!("CARGO_BIN_EXE_flow-testkit").to_string(),
            "mcp-stdio".to_string(),
            "--count-file".to_string(),
            count_file.to_string_lossy().to_string(),
        ],
        env: vec![],
        cwd: None,
    }));
    let outcome = tool
        .call(call_within(json!({"ms": 30_000}), Duration::from_secs(3)))
        .await;
    assert_kind(&outcome, FailureKind::Unknown, "notifications/cancelled");
    assert_eq!(outcome.requests_sent, 1);
    let cancelled = || {
        read_count_file(&count_file)
            .iter()
            .any(|line| line["event"] == "cancelled" && line["tool"] == "slow")
    };
    assert!(
        eventually(cancelled).await,
        "the server never saw the cancellation"
    );
    pool.close().await;
}
