//! The test server as an enterprise identity provider and as an authorization server
//! that takes its grants (cross-app access, SEP-990): `POST /idp/token` exchanges the ID
//! token the test set (RFC 8693: `subject_token_type` id_token → `requested_token_type`
//! id-jag) for an ID-JAG bound to the audience and resource asked; `/token` takes the
//! JWT bearer grant (RFC 7523) of that ID-JAG from the confidential client, once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::oauth::{AuthCodeStats, form};

/// The RFC 8693 grant type.
const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// The ID-JAG token type.
const ID_JAG: &str = "urn:ietf:params:oauth:token-type:id-jag";
/// An OpenID Connect ID token as a subject token.
const ID_TOKEN: &str = "urn:ietf:params:oauth:token-type:id_token";

/// What cross-app access counts and holds.
#[derive(Default)]
pub struct CrossAppStats {
    /// The ID token the IdP accepts (`None`: every exchange is refused).
    pub(super) id_token: Mutex<Option<String>>,
    /// Live ID-JAGs → (audience, resource).
    jags: Mutex<HashMap<String, (String, String)>>,
    /// The client id each exchange presented (form field or HTTP Basic).
    idp_clients: Mutex<Vec<String>>,
    exchanges: AtomicU32,
    bearer_grants: AtomicU32,
    refused: AtomicU32,
}

impl CrossAppStats {
    /// Token exchanges asked of the IdP (refused ones included).
    pub fn exchanges(&self) -> u32 {
        self.exchanges.load(Ordering::SeqCst)
    }

    /// JWT bearer grants asked of the authorization server (refused ones included).
    pub fn bearer_grants(&self) -> u32 {
        self.bearer_grants.load(Ordering::SeqCst)
    }

    /// The client id each token exchange presented, in order.
    pub fn idp_clients(&self) -> Vec<String> {
        self.idp_clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Requests of either kind refused.
    pub fn refused(&self) -> u32 {
        self.refused.load(Ordering::SeqCst)
    }

    fn refuse(&self, status: StatusCode, code: &str, why: &str) -> Response {
        self.refused.fetch_add(1, Ordering::SeqCst);
        (
            status,
            axum::Json(json!({ "error": code, "error_description": why })),
        )
            .into_response()
    }
}

/// The identity provider's state: the tokens it mints go through the authorization
/// server's records (so tests find every token issued in one list).
#[derive(Clone)]
pub(super) struct Idp {
    /// The authorization-code side's records.
    pub(super) codes: Arc<AuthCodeStats>,
    /// Cross-app access's own.
    pub(super) cross: Arc<CrossAppStats>,
}

/// `POST /idp/token`: the IdP's token exchange.
pub(super) async fn idp_token(State(idp): State<Idp>, body: String) -> Response {
    let (codes, x) = (&idp.codes, &idp.cross);
    x.exchanges.fetch_add(1, Ordering::SeqCst);
    let f = form(&body);
    let get = |k: &str| f.get(k).cloned().unwrap_or_default();
    let client = get("client_id");
    if client.is_empty() {
        return x.refuse(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            "which client asks?",
        );
    }
    x.idp_clients
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(client);
    if get("grant_type") != TOKEN_EXCHANGE {
        return x.refuse(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "token exchange only",
        );
    }
    if get("requested_token_type") != ID_JAG || get("subject_token_type") != ID_TOKEN {
        return x.refuse(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "id_token → id-jag only",
        );
    }
    let (audience, resource) = (get("audience"), get("resource"));
    if audience.is_empty() || resource.is_empty() {
        return x.refuse(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "audience and resource are required",
        );
    }
    let expected = x.id_token.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if expected.as_deref() != Some(get("subject_token").as_str()) {
        return x.refuse(
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "the ID token is not valid",
        );
    }
    let jag = codes.mint("jag");
    x.jags
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(jag.clone(), (audience, resource));
    axum::Json(json!({
        "access_token": jag,
        "issued_token_type": ID_JAG,
        "token_type": "N_A",
        "expires_in": 300,
    }))
    .into_response()
}

/// The JWT bearer grant at `/token` for `client` (authenticated as `expected`), whose
/// issuer is `origin`: an ID-JAG issued for this audience, used once.
pub(super) fn jwt_bearer(
    codes: &AuthCodeStats,
    x: &CrossAppStats,
    client: (&str, &str),
    expected: Option<(&str, &str)>,
    f: &HashMap<String, String>,
    origin: &str,
) -> Response {
    x.bearer_grants.fetch_add(1, Ordering::SeqCst);
    if Some(client) != expected {
        return x.refuse(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            "client authentication failed",
        );
    }
    let assertion = f.get("assertion").cloned().unwrap_or_default();
    let live = x
        .jags
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&assertion);
    let Some((audience, resource)) = live else {
        return x.refuse(
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "unknown or spent ID-JAG",
        );
    };
    if audience != origin {
        return x.refuse(
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "the ID-JAG is for another audience",
        );
    }
    if resource != format!("{origin}/mcp") {
        return x.refuse(
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "the ID-JAG is for another resource",
        );
    }
    let scope = f.get("scope").cloned().unwrap_or_default();
    let access_token = codes.mint("access");
    codes
        .access
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(access_token.clone(), scope.clone());
    axum::Json(json!({
        "access_token": access_token,
        "token_type": "Bearer",
        "expires_in": codes.access_ttl.load(Ordering::SeqCst),
        "scope": scope,
    }))
    .into_response()
}
