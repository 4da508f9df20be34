//! MCP over streamable HTTP: the pool against the in-process rmcp test server.

use std::time::{Duration, Instant};

use flow_adapters::mcp::{Auth, Pool, ServerSpec, Spec};
use flow_adapters::testkit::http::{Behavior, CountingServer};
use flow_adapters::testkit::mcp::HttpServer;
use flow_adapters::{Call, FailureKind, SideEffect, Tool};
use serde_json::json;

use crate::support::{TRANSIENT, assert_kind, call, call_within, err, ok};

async fn start() -> HttpServer {
    HttpServer::start(None)
        .await
        .unwrap_or_else(|e| panic!("starting the MCP test server: {e}"))
}

fn spec(url: &str, tool: &str) -> Spec {
    Spec {
        server: ServerSpec::Http {
            url: url.to_string(),
            headers: vec![("X-Tenant".to_string(), "acme".to_string())],
        },
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

#[tokio::test]
async fn results_over_http() {
    let server = start().await;
    let pool = pool();
    let url = server.url();
    let outcome = pool
        .tool(spec(&url, "echo"))
        .call(call(json!({"a": 1})))
        .await;
    assert_eq!(ok(&outcome), &json!({"a": 1}));
    assert_eq!(outcome.requests_sent, 1);
    assert_eq!(
        ok(&pool
            .tool(spec(&url, "text"))
            .call(call(json!({"text": "hi"})))
            .await),
        &json!("hi")
    );
    assert_eq!(
        ok(&pool
            .tool(spec(&url, "json_text"))
            .call(call(json!({})))
            .await),
        &json!({"answer": 42})
    );
    let outcome = pool
        .tool(spec(&url, "fail"))
        .call(call(json!({"message": "quota exceeded"})))
        .await;
    assert_kind(&outcome, FailureKind::Permanent, "quota exceeded");
    assert_eq!(outcome.requests_sent, 1);
}

#[tokio::test]
async fn one_initialize_for_many_calls() {
    let server = start().await;
    let pool = pool();
    for n in 1..=5 {
        let outcome = pool
            .tool(spec(&server.url(), "count"))
            .call(call(json!({"key": "k"})))
            .await;
        assert_eq!(ok(&outcome)["count"], json!(n));
    }
    assert_eq!(server.stats().initializes(), 1);
    assert_eq!(server.http().initialize_requests(), 1);
    assert_eq!(server.http().tool_call_requests(), 5);
    assert_eq!(server.stats().count("k"), 5);
}

#[tokio::test]
async fn annotations_over_http() {
    let server = start().await;
    let pool = pool();
    let timeout = Duration::from_secs(10);
    for tool in ["lookup", "delete_thing"] {
        pool.annotations(&spec(&server.url(), tool), timeout)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(
        pool.tool(spec(&server.url(), "lookup")).side_effect(),
        SideEffect::ReadOnly
    );
    assert_eq!(
        pool.tool(spec(&server.url(), "delete_thing")).side_effect(),
        SideEffect::NotIdempotent
    );
}

#[tokio::test]
async fn timeout_during_a_call_is_unknown() {
    let server = start().await;
    let pool = pool();
    ok(&pool
        .tool(spec(&server.url(), "echo"))
        .call(call(json!({})))
        .await);
    let outcome = pool
        .tool(spec(&server.url(), "slow"))
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
async fn rate_limits_and_server_errors_are_transient() {
    let server = start().await;
    let pool = pool();
    let tool = pool.tool(spec(&server.url(), "count"));
    ok(&tool.call(call(json!({"key": "k"}))).await);
    server.fail_calls_with(Some((429, Some("3".to_string()))));
    let outcome = tool.call(call(json!({"key": "k"}))).await;
    assert_eq!(
        err(&outcome).kind,
        FailureKind::Transient {
            retry_after: Some(Duration::from_secs(3))
        }
    );
    assert_eq!(outcome.requests_sent, 1);
    server.fail_calls_with(Some((503, None)));
    let outcome = tool.call(call(json!({"key": "k"}))).await;
    assert_kind(&outcome, TRANSIENT, "HTTP 503");
    server.fail_calls_with(None);
    let outcome = tool.call(call(json!({"key": "k"}))).await;
    assert_eq!(
        ok(&outcome)["count"],
        json!(2),
        "the failed calls never reached the tool"
    );
    assert_eq!(server.stats().initializes(), 1, "the session survived");
}

#[tokio::test]
async fn a_forgotten_session_is_transient_then_replaced() {
    let server = start().await;
    let pool = pool();
    let tool = pool.tool(spec(&server.url(), "count"));
    ok(&tool.call(call(json!({"key": "k"}))).await);
    server.expire_sessions();
    let outcome = tool.call(call(json!({"key": "k"}))).await;
    assert_kind(&outcome, TRANSIENT, "no longer knows this session");
    assert_eq!(outcome.requests_sent, 1);
    let outcome = tool.call(call(json!({"key": "k"}))).await;
    assert_eq!(ok(&outcome)["count"], json!(2));
    assert_eq!(
        server.http().initialize_requests(),
        2,
        "a new session, no hidden re-send"
    );
    assert_eq!(server.http().tool_call_requests(), 3);
}

#[tokio::test]
async fn a_stopped_server_is_not_sent_and_a_restarted_one_gets_a_new_session() {
    let server = start().await;
    let addr = server.addr();
    let url = server.url();
    let pool = pool();
    let tool = pool.tool(spec(&url, "count"));
    assert_eq!(
        ok(&tool.call(call(json!({"key": "k"}))).await)["count"],
        json!(1)
    );
    server.shutdown().await;

    let outcome = tool.call(call(json!({"key": "k"}))).await;
    assert_kind(&outcome, FailureKind::NotSent, "could not");
    assert_eq!(outcome.requests_sent, 0);

    let again = HttpServer::start_on(addr, None, None)
        .await
        .unwrap_or_else(|e| panic!("restarting on {addr}: {e}"));
    let outcome = tool.call(call(json!({"key": "k"}))).await;
    assert_eq!(
        ok(&outcome)["count"],
        json!(1),
        "a new server process counts from 1"
    );
    assert_eq!(
        again.stats().initializes(),
        1,
        "the pool started a new session"
    );
}

#[tokio::test]
async fn connect_refused_is_not_sent() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("{e}"))
        .port();
    drop(listener);
    let url = format!("http://127.0.0.1:{port}/mcp");
    let outcome = pool().tool(spec(&url, "echo")).call(call(json!({}))).await;
    assert_kind(
        &outcome,
        FailureKind::NotSent,
        "could not start the session",
    );
    assert_eq!(outcome.requests_sent, 0);
}

#[tokio::test]
async fn a_server_that_never_answers_initialize_is_not_sent_within_the_timeout() {
    let hang = CountingServer::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    hang.set("/mcp", Behavior::HoldUntilReleased);
    let started = Instant::now();
    let outcome = pool()
        .tool(spec(&format!("{}/mcp", hang.url()), "echo"))
        .call(Call::new(json!({}), "k", Duration::from_millis(600)))
        .await;
    assert_kind(
        &outcome,
        FailureKind::NotSent,
        "timed out starting the session",
    );
    assert_eq!(outcome.requests_sent, 0);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(
        hang.log()[0].header("x-tenant"),
        Some("acme"),
        "declared headers are sent"
    );
    hang.release();
}

#[tokio::test]
async fn a_url_that_is_not_mcp_is_permanent() {
    let plain = CountingServer::start()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    plain.set("/mcp", Behavior::status(404));
    let outcome = pool()
        .tool(spec(&format!("{}/mcp", plain.url()), "echo"))
        .call(call(json!({})))
        .await;
    assert_kind(&outcome, FailureKind::Permanent, "404");
    assert_eq!(outcome.requests_sent, 0);
}
