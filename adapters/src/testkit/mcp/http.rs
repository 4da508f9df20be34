//! The MCP test server over streamable HTTP, with counting and an OAuth mode.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};

use super::cross_app::{self, CrossAppStats};
use super::oauth::{self, AuthCodeStats};
use super::{Stats, TestServer};

/// The OAuth mode: `tools/call` needs a token carrying `required_scope`.
///
/// A request without a valid token gets 401 `Bearer realm="flow-testkit",
/// error="invalid_token"`. A `tools/call` whose token lacks the scope gets
/// `challenge_status` (401, or 403 for the `insufficient_scope` form) with
/// `WWW-Authenticate: Bearer error="insufficient_scope", scope="<required_scope>"`.
/// Tokens come from `POST /token` (`grant_type=client_credentials`, client
/// authenticated with HTTP Basic or form fields), granted for exactly the scope asked.
///
/// For clients that discover the token endpoint, the 401 names
/// `resource_metadata="http://…/.well-known/oauth-protected-resource/mcp"`, which
/// (RFC 9728) names this server as its own authorization server, whose RFC 8414
/// metadata at `/.well-known/oauth-authorization-server` gives `/token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthOptions {
    /// Accepted client id.
    pub client_id: String,
    /// Accepted client secret.
    pub client_secret: String,
    /// Scope a token needs for `tools/call`.
    pub required_scope: String,
    /// 401 or 403.
    pub challenge_status: u16,
    /// Whether `/token` grants `required_scope` when asked; `false` makes every
    /// re-authentication useless, to check that a client gives up after one.
    pub grant_required_scope: bool,
}

impl Default for AuthOptions {
    fn default() -> Self {
        AuthOptions {
            client_id: "flow".to_string(),
            client_secret: "flow-secret".to_string(),
            required_scope: "tools:write".to_string(),
            challenge_status: 401,
            grant_required_scope: true,
        }
    }
}

/// HTTP-level counts, taken before authorization, so rejected requests count too.
#[derive(Debug, Default)]
pub struct HttpStats {
    requests: AtomicU32,
    tool_call_requests: AtomicU32,
    initialize_requests: AtomicU32,
    rejected: AtomicU32,
    token_requests: AtomicU32,
    metadata_requests: AtomicU32,
    token_resources: Mutex<Vec<String>>,
    /// The `params._meta` of every `tools/call` (`null` when absent).
    call_metas: Mutex<Vec<Value>>,
}

impl HttpStats {
    /// The `params._meta` of every `tools/call` so far, in arrival order (`null` for a
    /// call without one): what a client propagated (trace context, progress token).
    pub fn call_metas(&self) -> Vec<Value> {
        self.call_metas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every HTTP request to `/mcp` (POST, GET, DELETE), rejected ones included.
    pub fn requests(&self) -> u32 {
        self.requests.load(Ordering::SeqCst)
    }

    /// POSTs carrying a `tools/call`, rejected ones included.
    pub fn tool_call_requests(&self) -> u32 {
        self.tool_call_requests.load(Ordering::SeqCst)
    }

    /// POSTs carrying an `initialize`, rejected ones included.
    pub fn initialize_requests(&self) -> u32 {
        self.initialize_requests.load(Ordering::SeqCst)
    }

    /// Requests answered 401/403 by the OAuth mode.
    pub fn rejected(&self) -> u32 {
        self.rejected.load(Ordering::SeqCst)
    }

    /// Requests to `/token`, refused ones included.
    pub fn token_requests(&self) -> u32 {
        self.token_requests.load(Ordering::SeqCst)
    }

    /// Requests for the well-known metadata documents.
    pub fn metadata_requests(&self) -> u32 {
        self.metadata_requests.load(Ordering::SeqCst)
    }

    /// The `resource` parameter (RFC 8707) of each token request, `""` when absent.
    pub fn token_resources(&self) -> Vec<String> {
        self.token_resources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

struct Gate {
    auth: Option<AuthOptions>,
    stats: HttpStats,
    /// The authorization-code side (`oauth.rs`), which holds the live access tokens.
    codes: Arc<AuthCodeStats>,
    /// Cross-app access: the IdP's exchanges and the JWT bearer grants.
    cross: Arc<CrossAppStats>,
    issued: AtomicU32,
    /// `tools/call` answered with this status (and `Retry-After`) instead of running.
    call_failure: Mutex<Option<(u16, Option<String>)>>,
    /// Session ids seen so far, and those the server pretends to have forgotten.
    sessions: Mutex<(Vec<String>, Vec<String>)>,
    /// Refuse a `tools/call` whose `_meta` holds a key this server does not know (all
    /// but `progressToken`), as a strict server may.
    strict_meta: std::sync::atomic::AtomicBool,
}

impl Gate {
    fn issue(&self, scope: &str) -> String {
        let n = self.issued.fetch_add(1, Ordering::SeqCst) + 1;
        let token = format!("testkit-token-{n}");
        self.codes
            .access
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.clone(), scope.to_string());
        token
    }

    fn scope_of(&self, token: &str) -> Option<String> {
        self.codes
            .access
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()
    }
}

/// The MCP test server on loopback: MCP at `/mcp`, tokens at `/token`.
pub struct HttpServer {
    addr: SocketAddr,
    stats: Arc<Stats>,
    gate: Arc<Gate>,
    running: crate::testkit::Running,
}

impl HttpServer {
    /// Starts on `127.0.0.1:0`; `auth` turns the OAuth mode on.
    pub async fn start(auth: Option<AuthOptions>) -> std::io::Result<HttpServer> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), auth, None).await
    }

    /// Starts on `addr`, logging tool calls to `count_file` if given.
    pub async fn start_on(
        addr: SocketAddr,
        auth: Option<AuthOptions>,
        count_file: Option<PathBuf>,
    ) -> std::io::Result<HttpServer> {
        Self::start_pinned(addr, auth, count_file, None).await
    }

    /// [`HttpServer::start_on`] accepting only protocol `version` when given.
    pub async fn start_pinned(
        addr: SocketAddr,
        auth: Option<AuthOptions>,
        count_file: Option<PathBuf>,
        version: Option<rmcp::model::ProtocolVersion>,
    ) -> std::io::Result<HttpServer> {
        let server = TestServer::new(count_file).pinned(version);
        let stats = server.stats();
        let config = StreamableHttpServerConfig::default().with_sse_keep_alive(None);
        let sessions = config.cancellation_token.clone();
        let service: StreamableHttpService<TestServer, LocalSessionManager> =
            StreamableHttpService::new(move || Ok(server.clone()), Default::default(), config);
        let gate = Arc::new(Gate {
            auth,
            stats: HttpStats::default(),
            codes: Arc::new(AuthCodeStats::default()),
            cross: Arc::new(CrossAppStats::default()),
            issued: AtomicU32::new(0),
            call_failure: Mutex::new(None),
            sessions: Mutex::new((Vec::new(), Vec::new())),
            strict_meta: std::sync::atomic::AtomicBool::new(false),
        });
        gate.codes
            .access_ttl
            .store(3600, std::sync::atomic::Ordering::SeqCst);
        let router = Router::new()
            .route("/token", post(token))
            .route(
                "/.well-known/oauth-protected-resource/mcp",
                get(resource_metadata),
            )
            .route(
                "/.well-known/oauth-authorization-server",
                get(server_metadata),
            )
            .nest_service("/mcp", service)
            .layer(middleware::from_fn_with_state(gate.clone(), guard))
            .with_state(gate.clone())
            .merge(
                Router::new()
                    .route("/authorize", get(oauth::authorize))
                    .route("/register", post(oauth::register))
                    .route("/revoke", post(oauth::revoke))
                    .with_state(gate.codes.clone()),
            )
            .merge(
                Router::new()
                    .route("/idp/token", post(cross_app::idp_token))
                    .with_state(cross_app::Idp {
                        codes: gate.codes.clone(),
                        cross: gate.cross.clone(),
                    }),
            );
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let end_sessions: Box<dyn FnOnce() + Send + Sync> = Box::new(move || sessions.cancel());
        let running = crate::testkit::Running::serve(listener, router, Some(end_sessions));
        Ok(HttpServer {
            addr,
            stats,
            gate,
            running,
        })
    }

    /// The MCP endpoint, `http://127.0.0.1:PORT/mcp`.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// The token endpoint, `http://127.0.0.1:PORT/token`.
    pub fn token_url(&self) -> String {
        format!("http://{}/token", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the tools saw.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// What arrived over HTTP, rejected requests included.
    pub fn http(&self) -> &HttpStats {
        &self.gate.stats
    }

    /// Redirects from `/authorize` leave out `iss` (`true`), though the metadata
    /// promises it (RFC 9207).
    pub fn omit_iss(&self, omit: bool) {
        self.gate.codes.omit_iss.store(omit, Ordering::SeqCst);
    }

    /// The identity provider's token endpoint (cross-app access), `http://…/idp/token`.
    pub fn idp_token_url(&self) -> String {
        format!("http://{}/idp/token", self.addr)
    }

    /// The ID token the identity provider accepts in a token exchange (`None`: none).
    pub fn set_id_token(&self, token: Option<&str>) {
        *self
            .gate
            .cross
            .id_token
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = token.map(str::to_string);
    }

    /// What cross-app access saw.
    pub fn cross_app(&self) -> &CrossAppStats {
        &self.gate.cross
    }

    /// Issues a token for `scope` without a token request (for bearer-token tests).
    pub fn issue_token(&self, scope: &str) -> String {
        self.gate.issue(scope)
    }

    /// Answers every later `tools/call` with `status` (and `Retry-After`), before the
    /// tool runs; `None` restores normal service.
    pub fn fail_calls_with(&self, failure: Option<(u16, Option<String>)>) {
        *self
            .gate
            .call_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = failure;
    }

    /// From now on, refuses (JSON-RPC error -32602) every `tools/call` whose `_meta` holds
    /// a key other than `progressToken`.
    pub fn refuse_unknown_meta(&self, on: bool) {
        self.gate.strict_meta.store(on, Ordering::SeqCst);
    }

    /// The authorization-code side: codes, refresh tokens, counts.
    pub fn auth_code(&self) -> &AuthCodeStats {
        &self.gate.codes
    }

    /// Access tokens issued from now on expire after `secs` (the `expires_in` said).
    pub fn set_access_ttl(&self, secs: u64) {
        self.gate.codes.access_ttl.store(secs, Ordering::SeqCst);
    }

    /// Refresh grants answer after `ms` milliseconds.
    pub fn delay_refreshes(&self, ms: u64) {
        self.gate.codes.refresh_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// `/authorize` redirects with `error=<e>` instead of a code (`None`: codes again).
    pub fn authorize_with_error(&self, e: Option<&str>) {
        *self
            .gate
            .codes
            .authorize_error
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = e.map(str::to_string);
    }

    /// Forgets every access token issued: the next request with one gets 401.
    pub fn forget_access_tokens(&self) {
        self.gate
            .codes
            .access
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// The `Mcp-Session-Id` of every live session a request carried so far, in order.
    pub fn sessions_seen(&self) -> Vec<String> {
        let sessions = self.gate.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.0.clone()
    }

    /// Forgets every session seen so far, as a restarted server would: their requests
    /// get 404 from now on, and clients must initialize a new session.
    pub fn expire_sessions(&self) {
        let mut sessions = self.gate.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let (seen, expired) = &mut *sessions;
        expired.append(seen);
    }
}

impl HttpServer {
    /// Ends every session and stops listening, as a stopped server process would, and
    /// waits for it. Dropping the server does the same without waiting.
    pub async fn shutdown(self) {
        self.running.shutdown().await;
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

fn challenge(status: u16, value: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::UNAUTHORIZED);
    let mut response = (status, "authorization required").into_response();
    if let Ok(value) = value.parse() {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// Counts every `/mcp` request, then enforces the OAuth mode.
async fn guard(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    if !request.uri().path().starts_with("/mcp") {
        return next.run(request).await;
    }
    gate.stats.requests.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 16 * 1024 * 1024).await else {
        return (StatusCode::BAD_REQUEST, "unreadable body").into_response();
    };
    let message = serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null);
    let method = message
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_string);
    let is_call = method.as_deref() == Some("tools/call");
    if is_call {
        gate.stats.tool_call_requests.fetch_add(1, Ordering::SeqCst);
        if let Some(refused) = meta_of_call(&gate, &message) {
            return refused;
        }
    }
    if method.as_deref() == Some("initialize") {
        gate.stats
            .initialize_requests
            .fetch_add(1, Ordering::SeqCst);
    }
    if let Some(id) = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
    {
        let mut sessions = gate.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if sessions.1.iter().any(|s| s == id) {
            return (StatusCode::NOT_FOUND, "session not found").into_response();
        }
        if !sessions.0.iter().any(|s| s == id) {
            sessions.0.push(id.to_string());
        }
    }
    if let Some(auth) = &gate.auth {
        let scope = bearer(&parts.headers).and_then(|token| gate.scope_of(token));
        match scope {
            None => {
                gate.stats.rejected.fetch_add(1, Ordering::SeqCst);
                let host = parts
                    .headers
                    .get(header::HOST)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("127.0.0.1");
                return challenge(
                    401,
                    format!(
                        r#"Bearer realm="flow-testkit", error="invalid_token", resource_metadata="http://{host}/.well-known/oauth-protected-resource/mcp""#
                    ),
                );
            }
            Some(scope)
                if is_call && !scope.split_whitespace().any(|s| s == auth.required_scope) =>
            {
                gate.stats.rejected.fetch_add(1, Ordering::SeqCst);
                return challenge(
                    auth.challenge_status,
                    format!(
                        r#"Bearer realm="flow-testkit", error="insufficient_scope", scope="{}""#,
                        auth.required_scope
                    ),
                );
            }
            Some(_) => {}
        }
    }
    let failure = gate
        .call_failure
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let (true, Some((status, retry_after))) = (is_call, failure) {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, "failing on purpose").into_response();
        if let Some(value) = retry_after.and_then(|v| v.parse().ok()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Records a `tools/call`'s `_meta`; in strict mode, the JSON-RPC error a server that
/// knows no other key than `progressToken` answers.
fn meta_of_call(gate: &Gate, message: &Value) -> Option<Response> {
    let meta = message
        .pointer("/params/_meta")
        .cloned()
        .unwrap_or(Value::Null);
    gate.stats
        .call_metas
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(meta.clone());
    if !gate.strict_meta.load(Ordering::SeqCst) {
        return None;
    }
    let unknown = meta
        .as_object()?
        .keys()
        .find(|k| k.as_str() != "progressToken")?
        .clone();
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": message.get("id").cloned().unwrap_or(Value::Null),
        "error": { "code": -32602, "message": format!("unknown _meta key `{unknown}`") },
    });
    Some(
        (
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response(),
    )
}

/// `POST /token`: the OAuth `client_credentials` grant.
async fn token(State(gate): State<Arc<Gate>>, headers: HeaderMap, body: String) -> Response {
    gate.stats.token_requests.fetch_add(1, Ordering::SeqCst);
    let form = oauth::form(&body);
    gate.stats
        .token_resources
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(form.get("resource").cloned().unwrap_or_default());
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
        .and_then(|raw| String::from_utf8(raw).ok())
        .and_then(|pair| {
            pair.split_once(':')
                .map(|(id, secret)| (decode(id), decode(secret)))
        });
    let (client_id, client_secret) = basic.unwrap_or_else(|| {
        (
            form.get("client_id").cloned().unwrap_or_default(),
            form.get("client_secret").cloned().unwrap_or_default(),
        )
    });
    let error = |status: StatusCode, code: &str| {
        (status, axum::Json(json!({"error": code}))).into_response()
    };
    if form.get("grant_type").map(String::as_str) == Some(JWT_BEARER) {
        let expected = gate
            .auth
            .as_ref()
            .map(|a| (a.client_id.as_str(), a.client_secret.as_str()));
        let client = (client_id.as_str(), client_secret.as_str());
        let (codes, cross) = (gate.codes.as_ref(), gate.cross.as_ref());
        return cross_app::jwt_bearer(codes, cross, client, expected, &form, &origin(&headers));
    }
    if form.get("grant_type").map(String::as_str) != Some("client_credentials") {
        return oauth::grant(&gate.codes, &form).await;
    }
    let Some(auth) = &gate.auth else {
        return error(StatusCode::BAD_REQUEST, "invalid_request");
    };
    if client_id != auth.client_id || client_secret != auth.client_secret {
        return error(StatusCode::UNAUTHORIZED, "invalid_client");
    }
    let mut scope = form.get("scope").cloned().unwrap_or_default();
    if !auth.grant_required_scope {
        scope = scope
            .split_whitespace()
            .filter(|s| *s != auth.required_scope)
            .collect::<Vec<_>>()
            .join(" ");
    }
    let access_token = gate.issue(&scope);
    axum::Json(json!({
        "access_token": access_token,
        "token_type": "Bearer",
        "expires_in": 3600,
        "scope": scope,
    }))
    .into_response()
}

/// The RFC 7523 grant type.
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// Basic credentials are form-urlencoded before base64 (RFC 6749 §2.3.1).
fn decode(text: &str) -> String {
    reqwest::Url::parse(&format!("http://x/?v={text}"))
        .ok()
        .and_then(|url| url.query_pairs().next().map(|(_, v)| v.into_owned()))
        .unwrap_or_else(|| text.to_string())
}

fn origin(headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1");
    format!("http://{host}")
}

/// RFC 9728 protected-resource metadata: this server is its own authorization server.
async fn resource_metadata(State(gate): State<Arc<Gate>>, headers: HeaderMap) -> Response {
    gate.stats.metadata_requests.fetch_add(1, Ordering::SeqCst);
    let origin = origin(&headers);
    axum::Json(json!({
        "resource": format!("{origin}/mcp"),
        "authorization_servers": [origin],
    }))
    .into_response()
}

/// RFC 8414 authorization-server metadata.
async fn server_metadata(State(gate): State<Arc<Gate>>, headers: HeaderMap) -> Response {
    gate.stats.metadata_requests.fetch_add(1, Ordering::SeqCst);
    let origin = origin(&headers);
    axum::Json(json!({
        "issuer": origin,
        "token_endpoint": format!("{origin}/token"),
        "authorization_endpoint": format!("{origin}/authorize"),
        "registration_endpoint": format!("{origin}/register"),
        "revocation_endpoint": format!("{origin}/revoke"),
        "code_challenge_methods_supported": ["S256"],
        "authorization_response_iss_parameter_supported": true,
        "grant_types_supported": ["client_credentials", "authorization_code", "refresh_token", JWT_BEARER],
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
    }))
    .into_response()
}
