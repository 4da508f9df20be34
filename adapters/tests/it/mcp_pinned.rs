//! Testkit MCP servers pinned to one protocol revision, and the spec of one of their
//! tools: what the version, task and input-round tests share.

use std::net::SocketAddr;

use flow_adapters::mcp::{Auth, Elicitation, ServerSpec, Spec};
use flow_adapters::testkit::mcp::HttpServer;
use rmcp::model::ProtocolVersion;
use serde_json::json;

/// Every revision flow speaks.
pub const VERSIONS: [&str; 4] = ["2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28"];

/// Tool `tool` of `server`, no credentials, answering elicitations with `elicitation`.
pub fn spec(server: ServerSpec, tool: &str, elicitation: Elicitation) -> Spec {
    Spec {
        server,
        tool: tool.to_string(),
        auth: Auth::None,
        read_only_override: None,
        elicitation,
        meta: true,
        pinned: None,
    }
}

/// `flow-testkit mcp-stdio` accepting only `version`.
pub fn stdio(version: &str) -> ServerSpec {
    ServerSpec::Stdio {
        command: vec![
            env!("CARGO_BIN_EXE_flow-testkit").to_string(),
            "mcp-stdio".to_string(),
            "--protocol".to_string(),
            version.to_string(),
        ],
        env: vec![],
        cwd: None,
    }
}

/// An in-process streamable-HTTP testkit server accepting only `version`.
pub async fn http(version: &str) -> HttpServer {
    let version: ProtocolVersion =
        serde_json::from_value(json!(version)).unwrap_or_else(|e| panic!("{e}"));
    HttpServer::start_pinned(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        None,
        None,
        Some(version),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The spec of `server`'s MCP endpoint.
pub fn http_spec(server: &HttpServer) -> ServerSpec {
    ServerSpec::Http {
        url: server.url(),
        headers: vec![],
    }
}
