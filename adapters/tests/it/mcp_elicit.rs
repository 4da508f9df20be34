//! Elicitation: the testkit's `elicit` tool asks mid-call, and the tool's policy answers,
//! over stdio and streamable HTTP.

use flow_adapters::Tool;
use flow_adapters::mcp::{Auth, Elicitation, Pool, ServerSpec, Spec};
use flow_adapters::testkit::mcp::HttpServer;
use serde_json::{Value, json};

use crate::support::{call, ok};

fn stdio() -> ServerSpec {
    ServerSpec::Stdio {
        command: vec![
            env!("CARGO_BIN_EXE_flow-testkit").to_string(),
            "mcp-stdio".to_string(),
        ],
        env: vec![],
        cwd: None,
    }
}

/// What the server got back for each policy, asking with `args`.
async fn answers(server: ServerSpec, policy: Elicitation, args: Value) -> Value {
    let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
    let tool = pool.tool(Spec {
        server,
        tool: "elicit".to_string(),
        auth: Auth::None,
        read_only_override: None,
        elicitation: policy,
        meta: true,
        pinned: None,
    });
    let outcome = tool.call(call(args)).await;
    let value = ok(&outcome).clone();
    pool.close().await;
    value
}

fn accept(values: Value) -> Elicitation {
    Elicitation::Accept(values.as_object().cloned().unwrap_or_default())
}

/// Every policy against one server: decline, defaults, given values, and the declines
/// for a required field without default and for values that do not fit.
async fn every_policy(server: ServerSpec) {
    let asked = json!({});
    assert_eq!(
        answers(server.clone(), Elicitation::Decline, asked.clone()).await,
        json!({"action": "decline", "content": null})
    );
    assert_eq!(
        answers(server.clone(), Elicitation::AcceptDefaults, asked.clone()).await,
        json!({"action": "accept", "content": {"name": "ada"}})
    );
    assert_eq!(
        answers(
            server.clone(),
            accept(json!({"name": "bob", "age": 7})),
            asked.clone()
        )
        .await,
        json!({"action": "accept", "content": {"name": "bob", "age": 7}})
    );
    let strict = json!({"schema": {"type": "object",
        "properties": {"age": {"type": "integer"}}, "required": ["age"]}});
    assert_eq!(
        answers(server.clone(), Elicitation::AcceptDefaults, strict).await["action"],
        "decline"
    );
    assert_eq!(
        answers(server, accept(json!({"name": 3})), asked).await["action"],
        "decline"
    );
}

#[tokio::test]
async fn policies_answer_over_stdio() {
    every_policy(stdio()).await;
}

#[tokio::test]
async fn policies_answer_over_http() {
    let server = HttpServer::start(None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    every_policy(ServerSpec::Http {
        url: server.url(),
        headers: vec![],
    })
    .await;
}
