//! Protocol 2026-07-28's multi-round-trip input: a server that needs input before it
//! acts answers `input_required`; flow answers with the tool's elicitation policy and
//! sends the call again with the answers (the testkit's `ask`), over stdio and HTTP.

use flow_adapters::mcp::{Elicitation, Pool, ServerSpec};
use flow_adapters::{Report, Reports, Tool};
use serde_json::json;

use crate::mcp_pinned::{self as pinned, http, http_spec, stdio};
use crate::support::{call, ok};

/// One `ask` call under `policy`: its output, requests sent and what was reported.
async fn ask(server: ServerSpec, policy: Elicitation) -> (serde_json::Value, u32, Vec<Report>) {
    let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
    let (reports, mut rx) = Reports::channel();
    let out = pool
        .tool(pinned::spec(server, "ask", policy))
        .call(call(json!({"key": "q1"})).with_reports(reports))
        .await;
    pool.close().await;
    let mut reported = Vec::new();
    while let Ok(r) = rx.try_recv() {
        reported.push(r);
    }
    (ok(&out).clone(), out.requests_sent, reported)
}

async fn answers_on(server: ServerSpec, ctx: &str) {
    let (out, sent, reported) = ask(server.clone(), Elicitation::AcceptDefaults).await;
    assert_eq!(out["answer"]["action"], "accept", "{ctx}: {out}");
    assert_eq!(out["answer"]["content"], json!({"name": "ada"}), "{ctx}");
    assert_eq!(
        out["count"], 1,
        "{ctx}: the effect once, on the answered round"
    );
    assert_eq!(sent, 2, "{ctx}: two rounds, both counted");
    match reported.as_slice() {
        [Report::Elicited(record)] => {
            assert_eq!(record["message"], "flow testkit asks first", "{ctx}");
            assert_eq!(record["decided_by"], "policy accept_defaults", "{ctx}");
        }
        other => panic!("{ctx}: reported {other:?}"),
    }
    let (out, _, _) = ask(server, Elicitation::Decline).await;
    assert_eq!(out["answer"]["action"], "decline", "{ctx}: {out}");
}

#[tokio::test]
async fn input_required_is_answered_over_stdio_and_http() {
    let version = "2026-07-28";
    answers_on(stdio(version), "stdio").await;
    let server = http(version).await;
    answers_on(http_spec(&server), "http").await;
    assert_eq!(
        server.stats().count("q1"),
        2,
        "one effect per answered call"
    );
    server.shutdown().await;
}
