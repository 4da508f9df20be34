//! Authorization by discovery: no `token_url`; the pool follows the server's 401 to
//! its protected-resource and authorization-server metadata and asks for a token
//! there, with the `resource` parameter, within the egress allow-list.

use flow_adapters::egress::AllowList;
use flow_adapters::mcp::{Auth, ClientAuth, Pool, ServerSpec, Spec};
use flow_adapters::testkit::mcp::{AuthOptions, HttpServer};
use flow_adapters::{FailureKind, Tool};
use serde_json::json;

use crate::support::{assert_kind, call, ok};

fn spec(server: &HttpServer, client_auth: ClientAuth) -> Spec {
    Spec {
        server: ServerSpec::Http {
            url: server.url(),
            headers: vec![],
        },
        tool: "count".to_string(),
        auth: Auth::ClientCredentials {
            token_url: None,
            client_id: "flow".to_string(),
            client_auth,
            scope: None,
        },
        read_only_override: None,
        elicitation: flow_adapters::mcp::Elicitation::Decline,
        meta: true,
        pinned: None,
    }
}

async fn start() -> HttpServer {
    HttpServer::start(Some(AuthOptions::default()))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn discovery_finds_the_token_endpoint_and_steps_up_once() {
    let server = start().await;
    let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
    let tool = pool.tool(spec(&server, ClientAuth::Secret("flow-secret".to_string())));
    let outcome = tool.call(call(json!({"key": "k"}))).await;
    assert_eq!(ok(&outcome)["count"], json!(1));
    // The first token (no scope: the 401 names none and the metadata lists none) is
    // challenged for `tools:write` on the call: one step-up, both calls counted.
    assert_eq!(outcome.requests_sent, 2);
    assert_eq!(server.http().token_requests(), 2);
    assert!(server.http().metadata_requests() >= 2);
    assert_eq!(
        server.http().token_resources(),
        vec![server.url(), server.url()],
        "every token request names the MCP server as its resource (RFC 8707)"
    );
    // The token is cached for the session: the next call needs no token request.
    let again = tool.call(call(json!({"key": "k"}))).await;
    assert_eq!(ok(&again)["count"], json!(2));
    assert_eq!(again.requests_sent, 1);
    assert_eq!(server.http().token_requests(), 2);
    pool.close().await;
}

#[tokio::test]
async fn client_secret_post_and_wrong_secrets() {
    let server = start().await;
    let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
    let outcome = pool
        .tool(spec(
            &server,
            ClientAuth::SecretPost("flow-secret".to_string()),
        ))
        .call(call(json!({"key": "p"})))
        .await;
    assert_eq!(ok(&outcome)["count"], json!(1));

    let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
    let outcome = pool
        .tool(spec(&server, ClientAuth::Secret("wrong".to_string())))
        .call(call(json!({"key": "w"})))
        .await;
    assert_kind(&outcome, FailureKind::Permanent, "invalid_client");
    assert!(!crate::support::err(&outcome).message.contains("wrong"));
    assert_eq!(outcome.requests_sent, 0);
    assert_eq!(server.stats().count("w"), 0);
}

#[tokio::test]
async fn discovered_urls_pass_the_egress_allow_list() {
    let server = start().await;
    let pool = Pool::new().unwrap_or_else(|e| panic!("{e}"));
    pool.restrict_egress(Some(AllowList::new(["mcp.example.com"])));
    let outcome = pool
        .tool(spec(&server, ClientAuth::Secret("flow-secret".to_string())))
        .call(call(json!({"key": "e"})))
        .await;
    assert_kind(
        &outcome,
        FailureKind::Permanent,
        "egress to `127.0.0.1` is not allowed",
    );
    assert_eq!(server.http().metadata_requests(), 0);
    assert_eq!(server.http().token_requests(), 0);
    assert_eq!(server.stats().count("e"), 0);
}
