//! MCP authorization: bearer tokens and OAuth client credentials with a scope challenge.

use flow_adapters::FailureKind;
use flow_adapters::mcp::{Auth, ClientAuth, Pool, ServerSpec, Spec};
use flow_adapters::testkit::mcp::{AuthOptions, HttpServer};
use flow_adapters::{Outcome, Tool};
use serde_json::json;

use crate::support::{assert_kind, call, ok};

async fn start(options: AuthOptions) -> HttpServer {
    HttpServer::start(Some(options))
        .await
        .unwrap_or_else(|e| panic!("starting the MCP test server: {e}"))
}

fn spec(server: &HttpServer, auth: Auth) -> Spec {
    Spec {
        server: ServerSpec::Http {
            url: server.url(),
            headers: vec![],
        },
        tool: "count".to_string(),
        auth,
        read_only_override: None,
        elicitation: flow_adapters::mcp::Elicitation::Decline,
        meta: true,
        pinned: None,
    }
}

fn credentials(server: &HttpServer, secret: &str, scope: Option<&str>) -> Auth {
    Auth::ClientCredentials {
        token_url: Some(server.token_url()),
        client_id: "flow".to_string(),
        client_auth: ClientAuth::Secret(secret.to_string()),
        scope: scope.map(str::to_string),
    }
}

async fn count(pool: &Pool, spec: &Spec) -> Outcome {
    pool.tool(spec.clone())
        .call(call(json!({"key": "k"})))
        .await
}

fn pool() -> Pool {
    Pool::new().unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn bearer_token_is_sent_and_its_absence_refused() {
    let server = start(AuthOptions::default()).await;
    let token = server.issue_token("tools:write");
    let pool = pool();
    let outcome = count(&pool, &spec(&server, Auth::Bearer(token.clone()))).await;
    assert_eq!(ok(&outcome)["count"], json!(1));
    assert_eq!(outcome.requests_sent, 1);

    let outcome = count(&pool, &spec(&server, Auth::None)).await;
    assert_kind(
        &outcome,
        FailureKind::Permanent,
        "refused the credentials while initializing",
    );
    assert_eq!(outcome.requests_sent, 0);
    assert!(!crate::support::err(&outcome).message.contains(&token));

    // A bearer token without the scope: challenged, and no credentials to re-auth with.
    let weak = server.issue_token("tools:read");
    let outcome = count(&pool, &spec(&server, Auth::Bearer(weak))).await;
    assert_kind(&outcome, FailureKind::Permanent, "insufficient_scope");
    assert_eq!(outcome.requests_sent, 1);
    assert_eq!(server.stats().count("k"), 1);
}

async fn reauthenticates_once(challenge_status: u16) {
    let server = start(AuthOptions {
        challenge_status,
        ..AuthOptions::default()
    })
    .await;
    let pool = pool();
    let spec = spec(
        &server,
        credentials(&server, "flow-secret", Some("tools:read")),
    );
    let outcome = count(&pool, &spec).await;
    assert_eq!(ok(&outcome)["count"], json!(1));
    assert_eq!(outcome.requests_sent, 2, "the refused call and its re-send");
    assert_eq!(server.http().tool_call_requests(), 2, "the server saw both");
    assert_eq!(server.http().rejected(), 1);
    assert_eq!(
        server.http().token_requests(),
        2,
        "the first token and one re-auth"
    );
    assert_eq!(server.stats().calls("count"), 1, "the tool ran once");
    assert_eq!(
        server.stats().initializes(),
        1,
        "the re-send used the same session"
    );

    // The upgraded token stays with the session.
    let outcome = count(&pool, &spec).await;
    assert_eq!(ok(&outcome)["count"], json!(2));
    assert_eq!(outcome.requests_sent, 1);
    assert_eq!(server.http().tool_call_requests(), 3);
    assert_eq!(server.http().token_requests(), 2);
}

#[tokio::test]
async fn client_credentials_reauthenticate_once_on_a_401_scope_challenge() {
    reauthenticates_once(401).await;
}

#[tokio::test]
async fn client_credentials_reauthenticate_once_on_a_403_insufficient_scope() {
    reauthenticates_once(403).await;
}

#[tokio::test]
async fn a_second_challenge_is_not_retried() {
    let server = start(AuthOptions {
        grant_required_scope: false,
        ..AuthOptions::default()
    })
    .await;
    let pool = pool();
    let spec = spec(&server, credentials(&server, "flow-secret", None));
    let outcome = count(&pool, &spec).await;
    assert_kind(
        &outcome,
        FailureKind::Permanent,
        "still refused after one re-authentication",
    );
    assert_eq!(outcome.requests_sent, 2);
    assert_eq!(server.http().tool_call_requests(), 2);
    assert_eq!(server.http().token_requests(), 2);
    assert_eq!(server.stats().calls("count"), 0);
}

#[tokio::test]
async fn bad_client_credentials_are_permanent_and_nothing_is_sent() {
    let server = start(AuthOptions::default()).await;
    let outcome = count(
        &pool(),
        &spec(&server, credentials(&server, "wrong-secret", None)),
    )
    .await;
    assert_kind(&outcome, FailureKind::Permanent, "invalid_client");
    assert_eq!(outcome.requests_sent, 0);
    assert!(
        !crate::support::err(&outcome)
            .message
            .contains("wrong-secret")
    );
    assert_eq!(server.http().requests(), 0);
}

#[tokio::test]
async fn an_unreachable_token_endpoint_is_not_sent() {
    let server = start(AuthOptions::default()).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("{e}"))
        .port();
    drop(listener);
    let auth = Auth::ClientCredentials {
        token_url: Some(format!("http://127.0.0.1:{port}/token")),
        client_id: "flow".to_string(),
        client_auth: ClientAuth::Secret("flow-secret".to_string()),
        scope: None,
    };
    let outcome = count(&pool(), &spec(&server, auth)).await;
    assert_kind(&outcome, FailureKind::NotSent, "could not connect");
    assert_eq!(outcome.requests_sent, 0);
}
