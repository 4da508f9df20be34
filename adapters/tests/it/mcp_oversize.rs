//! An answer over the transport's limit (16 MiB), over stdio and over streamable HTTP:
//! one classification for both. The server did process the call, so it is never a
//! plain "unknown" that waits out the timeout; it is a permanent failure that says so,
//! counted as sent, and the session is replaced.

use std::time::{Duration, Instant};

use flow_adapters::mcp::{Auth, Pool, ServerSpec, Spec};
use flow_adapters::testkit::mcp::HttpServer;
use flow_adapters::{FailureKind, Tool};
use serde_json::json;

use crate::support::{assert_kind, call_within, ok};

/// rmcp's limit on one message over either transport.
const LIMIT: usize = 16 * 1024 * 1024;

fn spec(server: ServerSpec) -> Spec {
    Spec {
        server,
        tool: "big".to_string(),
        auth: Auth::None,
        read_only_override: None,
        elicitation: flow_adapters::mcp::Elicitation::Decline,
        meta: true,
        pinned: None,
    }
}

async fn oversized(server: ServerSpec, what: &str) -> String {
    let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
    let tool = pool.tool(spec(server));
    // Within the limit: fine, and the same session answers the next call.
    let small = tool
        .call(call_within(json!({"bytes": 1000}), Duration::from_secs(20)))
        .await;
    ok(&small);
    let started = Instant::now();
    let outcome = tool
        .call(call_within(
            json!({"bytes": LIMIT + 1}),
            Duration::from_secs(20),
        ))
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{what}: classified at once, not at the timeout ({:?})",
        started.elapsed()
    );
    assert_kind(
        &outcome,
        FailureKind::Permanent,
        "the server did process the call",
    );
    assert_eq!(outcome.requests_sent, 1, "{what}");
    // The session was replaced: a small call works again.
    let again = tool
        .call(call_within(json!({"bytes": 10}), Duration::from_secs(20)))
        .await;
    ok(&again);
    match outcome.result {
        Err(e) => e.message,
        Ok(_) => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_answer_is_classified_alike_over_stdio_and_http() {
    let stdio = ServerSpec::Stdio {
        command: vec![
            env!("CARGO_BIN_EXE_flow-testkit").to_string(),
            "mcp-stdio".to_string(),
        ],
        env: vec![],
        cwd: None,
    };
    let over_stdio = oversized(stdio, "stdio").await;
    let server = HttpServer::start(None)
        .await
        .unwrap_or_else(|e| panic!("starting the MCP test server: {e}"));
    let http = ServerSpec::Http {
        url: server.url(),
        headers: vec![],
    };
    let over_http = oversized(http, "http").await;
    let tail = |m: &str| m.split(": ").skip(1).collect::<Vec<_>>().join(": ");
    assert_eq!(tail(&over_stdio), tail(&over_http), "one wording for both");
}
