//! Protocol 2026-07-28's multi-round-trip input: a server that needs input before it
//! acts answers `input_required`; flow answers with the tool's elicitation policy and
//! sends the call again with the answers (the testkit's `ask`), over stdio and HTTP.

use std::net::SocketAddr;

use flow_adapters::mcp::{Auth, Elicitation, Pool, ServerSpec, Spec};
use flow_adapters::testkit::mcp::HttpServer;
use flow_adapters::{Report, Reports, Tool};
use rmcp::model::ProtocolVersion;
use serde_json::json;

use crate::support::{call, ok};

fn spec(server: ServerSpec, elicitation: Elicitation) -> Spec {
    Spec {
        server,
        tool: "ask".to_string(),
        auth: Auth::None,
        read_only_override: None,
        elicitation,
    }
}

/// One `ask` call under `policy`: its output, requests sent and what was reported.
async fn ask(server: ServerSpec, policy: Elicitation) -> (serde_json::Value, u32, Vec<Report>) {
    let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
    let (reports, mut rx) = Reports::channel();
    let out = pool
        .tool(spec(server, policy))
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
    let stdio = ServerSpec::Stdio {
        command: vec![
            env!("CARGO_BIN_EXE_flow-testkit").to_string(),
            "mcp-stdio".to_string(),
            "--protocol".to_string(),
            version.to_string(),
        ],
        env: vec![],
        cwd: None,
    };
    answers_on(stdio, "stdio").await;
    let pinned: ProtocolVersion =
        serde_json::from_value(json!(version)).unwrap_or_else(|e| panic!("{e}"));
    let server = HttpServer::start_pinned(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        None,
        None,
        Some(pinned),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let url = ServerSpec::Http {
        url: server.url(),
        headers: vec![],
    };
    answers_on(url, "http").await;
    assert_eq!(
        server.stats().count("q1"),
        2,
        "one effect per answered call"
    );
    server.shutdown().await;
}
