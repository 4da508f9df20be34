//! Protocol version negotiation against testkit servers pinned to one revision each,
//! over stdio and streamable HTTP.

use flow_adapters::mcp::{Elicitation, Pool, ServerSpec, Spec};
use flow_adapters::{FailureKind, Outcome, Tool};
use serde_json::json;

use crate::mcp_pinned::{self as pinned, VERSIONS, http, http_spec, stdio};
use crate::support::{assert_kind, call, ok};

/// The testkit's `protocol` tool of `server`.
fn spec(server: ServerSpec) -> Spec {
    pinned::spec(server, "protocol", Elicitation::Decline)
}

/// One `protocol` call to `server` on a fresh pool, closed after it.
async fn call_once(server: ServerSpec) -> Outcome {
    let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
    let outcome = pool.tool(spec(server)).call(call(json!({}))).await;
    pool.close().await;
    outcome
}

/// A server speaking only `version` is refused before any call: a permanent error naming
/// its version and flow's.
fn assert_refused(outcome: &Outcome, version: &str) {
    assert_kind(outcome, FailureKind::Permanent, version);
    assert_kind(
        outcome,
        FailureKind::Permanent,
        "flow supports 2025-03-26, 2025-06-18, 2025-11-25, 2026-07-28",
    );
    assert_eq!(outcome.requests_sent, 0, "{version}");
}

#[tokio::test]
async fn every_supported_version_over_stdio() {
    for version in VERSIONS {
        let outcome = call_once(stdio(version)).await;
        assert_eq!(
            ok(&outcome),
            &json!({"protocol_version": version}),
            "{version}"
        );
        assert_eq!(outcome.requests_sent, 1);
    }
}

#[tokio::test]
async fn every_supported_version_over_http() {
    for version in VERSIONS {
        let server = http(version).await;
        let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
        let tool = pool.tool(spec(http_spec(&server)));
        let first = tool.call(call(json!({}))).await;
        assert_eq!(
            ok(&first),
            &json!({"protocol_version": version}),
            "{version}"
        );
        // The session is reused: the second call goes out under the same version.
        let second = tool.call(call(json!({}))).await;
        assert_eq!(
            ok(&second),
            &json!({"protocol_version": version}),
            "{version}"
        );
        assert_eq!(server.stats().calls("protocol"), 2, "{version}");
        pool.close().await;
    }
}

#[tokio::test]
async fn an_older_version_is_a_permanent_error_naming_both() {
    let server = http("2024-11-05").await;
    assert_refused(&call_once(http_spec(&server)).await, "2024-11-05");
    assert_eq!(server.stats().total_calls(), 0);
    assert_refused(&call_once(stdio("2024-11-05")).await, "2024-11-05");
}

#[tokio::test]
async fn a_newer_unknown_version_is_a_permanent_error_naming_both() {
    let server = http("2027-01-01").await;
    assert_refused(&call_once(http_spec(&server)).await, "2027-01-01");
    assert_eq!(server.stats().total_calls(), 0);
}
