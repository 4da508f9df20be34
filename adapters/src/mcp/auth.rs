//! Credentials for MCP servers over HTTP: a bearer token slot shared with the transport,
//! the OAuth `client_credentials` grant, and `WWW-Authenticate` challenge parsing.
//!
//! The token lives in a [`TokenSlot`] that the transport reads on every request, so a
//! re-authenticated token applies to the existing session: the re-sent call goes out on
//! the same MCP session, and only the two `tools/call` requests are counted.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use serde::Deserialize;
use tokio::time::Instant;

use super::ClientAuth;
use crate::error::head;
use crate::http::classify::detail;
use crate::http::classify::status_kind;
use crate::{Error, FailureKind};

/// The current bearer token of one session, read by the transport on every request.
#[derive(Clone, Default)]
pub(crate) struct TokenSlot(Arc<RwLock<Option<String>>>);

impl TokenSlot {
    pub(crate) fn get(&self) -> Option<String> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn set(&self, token: String) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(token);
    }
}

/// The `Mcp-Session-Id` a Streamable HTTP session's requests carry once the server gave
/// one (rmcp keeps it inside its transport): a call's trace names it (`mcp.session.id`).
#[derive(Clone, Default)]
pub(crate) struct SessionSeen(Arc<RwLock<Option<Arc<str>>>>);

impl SessionSeen {
    fn note(&self, id: Option<&Arc<str>>) {
        if let Some(id) = id {
            let mut seen = self.0.write().unwrap_or_else(|e| e.into_inner());
            if seen.as_ref() != Some(id) {
                *seen = Some(id.clone());
            }
        }
    }

    pub(crate) fn get(&self) -> Option<String> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
            .map(str::to_owned)
    }
}

/// rmcp's reqwest transport with the `Authorization` value taken from a [`TokenSlot`]
/// at send time instead of being fixed when the transport is built.
///
/// It also watches the answers' SSE streams for an event over rmcp's limit: rmcp ends the
/// stream there and the call would end "session closed, may have been processed"; the
/// flag lets the pool say what happened instead, as it does for stdio and for a JSON body
/// over the limit (`classify::oversized`).
#[derive(Clone)]
pub(crate) struct AuthedClient {
    pub(crate) inner: reqwest::Client,
    pub(crate) token: TokenSlot,
    /// Set when an answer's SSE event was over the limit.
    pub(crate) oversized: Arc<std::sync::atomic::AtomicBool>,
    /// The session id the requests carry.
    pub(crate) session: SessionSeen,
}

/// The text rmcp 3.11 (pinned) gives an SSE event over its limit.
const SSE_EVENT_TOO_LARGE: &str = "SSE event exceeded the maximum size";

impl AuthedClient {
    /// `response` with its SSE stream (if any) watched for an event over the limit.
    fn watched(&self, response: StreamableHttpPostResponse) -> StreamableHttpPostResponse {
        use futures::StreamExt;
        match response {
            StreamableHttpPostResponse::Sse(stream, session) => {
                let flag = self.oversized.clone();
                let stream = stream.inspect(move |item| {
                    if let Err(e) = item
                        && crate::error::chain(e).contains(SSE_EVENT_TOO_LARGE)
                    {
                        flag.store(true, std::sync::atomic::Ordering::Release);
                    }
                });
                StreamableHttpPostResponse::Sse(stream.boxed(), session)
            }
            other => other,
        }
    }
}

impl StreamableHttpClient for AuthedClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            None,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.session.note(session_id.as_ref());
        self.inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                self.token.get(),
                custom_headers,
                max_sse_event_size,
            )
            .await
            .map(|r| self.watched(r))
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.session.note(session_id.as_ref());
        self.inner
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                self.token.get(),
                custom_headers,
                limits,
            )
            .await
            .map(|r| self.watched(r))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.inner
            .delete_session(uri, session_id, self.token.get(), custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<
        BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        self.inner
            .get_stream(
                uri,
                session_id,
                last_event_id,
                self.token.get(),
                custom_headers,
            )
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<
        BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                self.token.get(),
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

/// The client of an OAuth `client_credentials` grant (RFC 6749 §4.4) and where its
/// tokens come from (explicit, or found by [`super::discovery`]).
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) token_url: String,
    pub(crate) client_id: String,
    pub(crate) client_auth: ClientAuth,
    /// The RFC 8707 `resource` sent with every token request: the MCP server.
    pub(crate) resource: String,
    /// The audience of a private-key JWT: the authorization server's issuer when
    /// discovered, else the token endpoint.
    pub(crate) audience: String,
    /// The authorization server's `token_endpoint_auth_methods_supported`, if known.
    pub(crate) methods: Vec<String>,
}

impl Credentials {
    /// How the client authenticates at the token endpoint: `client_secret_basic`
    /// unless the server lists `client_secret_post` and not basic (or the workflow
    /// asked for post).
    fn method(&self) -> &'static str {
        match &self.client_auth {
            ClientAuth::Secret(_) => {
                let lists = |m: &str| self.methods.iter().any(|x| x == m);
                if lists("client_secret_post") && !lists("client_secret_basic") {
                    "client_secret_post"
                } else {
                    "client_secret_basic"
                }
            }
            ClientAuth::SecretPost(_) => "client_secret_post",
            ClientAuth::None => "none",
            ClientAuth::PrivateKeyJwt { .. } => "private_key_jwt",
        }
    }
}

/// A token and what it was granted for.
pub(crate) struct Token {
    pub(crate) access_token: String,
    /// Granted scope: the server's answer, else what was asked for.
    pub(crate) scope: Option<String>,
    pub(crate) expires_at: Option<Instant>,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
    #[serde(default)]
    scope: Option<String>,
}

/// Tokens are renewed this long before they expire, so none expires in flight.
const EXPIRY_SKEW: Duration = Duration::from_secs(30);

impl Token {
    /// Whether the token should be renewed before the next call.
    pub(crate) fn is_stale(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|at| now + EXPIRY_SKEW >= at)
    }
}

/// Requests a token with `scope`. Errors are classified as if nothing had been sent to
/// the MCP server yet; the caller adjusts when a tool call already left.
///
/// Every request carries `resource` (RFC 8707). The client authenticates by
/// [`Credentials::method`]; the secret or key never appears in an error message.
pub(crate) async fn fetch_token(
    http: &reqwest::Client,
    credentials: &Credentials,
    scope: Option<&str>,
    deadline: Instant,
) -> Result<Token, Error> {
    let what = format!("token endpoint {}", without_query(&credentials.token_url));
    let mut form: Vec<(&str, String)> = vec![
        ("grant_type", "client_credentials".to_string()),
        ("resource", credentials.resource.clone()),
    ];
    if let Some(scope) = scope.filter(|s| !s.is_empty()) {
        form.push(("scope", scope.to_string()));
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    if remaining.is_zero() {
        return Err(Error::not_sent(format!(
            "{what}: the timeout expired before the token request"
        )));
    }
    let mut request = http.post(&credentials.token_url);
    match (&credentials.client_auth, credentials.method()) {
        (ClientAuth::Secret(secret), "client_secret_basic") => {
            request = request.basic_auth(
                form_encode(&credentials.client_id),
                Some(form_encode(secret)),
            );
        }
        (ClientAuth::Secret(secret) | ClientAuth::SecretPost(secret), _) => {
            form.push(("client_id", credentials.client_id.clone()));
            form.push(("client_secret", secret.clone()));
        }
        (ClientAuth::None, _) => form.push(("client_id", credentials.client_id.clone())),
        (ClientAuth::PrivateKeyJwt { key_pem, algorithm }, _) => {
            let assertion = super::jwt::assertion(
                &credentials.client_id,
                &credentials.audience,
                key_pem,
                algorithm,
            )?;
            form.push(("client_id", credentials.client_id.clone()));
            form.push((
                "client_assertion_type",
                "urn:ietf:params:oauth:client-assertion-type:jwt-bearer".to_string(),
            ));
            form.push(("client_assertion", assertion));
        }
    }
    let request = request.form(&form).timeout(remaining);
    let response = match request.send().await {
        Ok(response) => response,
        Err(e) if e.is_connect() => {
            return Err(Error::not_sent(format!(
                "{what}: could not connect: {}",
                detail(&e)
            )));
        }
        Err(e) if e.is_builder() => {
            return Err(Error::permanent(format!(
                "{what}: invalid request: {}",
                detail(&e)
            )));
        }
        Err(e) => {
            return Err(Error::transient(format!("{what}: {}", detail(&e)), None));
        }
    };
    let status = response.status();
    let kind = status_kind(status, response.headers());
    let body = response.bytes().await.map_err(|e| {
        Error::transient(format!("{what}: reading the answer: {}", detail(&e)), None)
    })?;
    if !status.is_success() {
        // OAuth errors carry `error` and `error_description`, never the secret.
        let detail = head(&body, 300);
        let message = format!("{what}: HTTP {status}: {detail}");
        let kind = match kind {
            FailureKind::Transient { .. } => kind,
            _ => FailureKind::Permanent,
        };
        return Err(Error::new(kind, message));
    }
    let parsed: TokenResponse = serde_json::from_slice(&body).map_err(|e| {
        Error::permanent(format!(
            "{what}: the answer is not an OAuth token response: {e}"
        ))
    })?;
    Ok(Token {
        access_token: parsed.access_token,
        scope: parsed.scope.or_else(|| scope.map(str::to_string)),
        expires_at: parsed
            .expires_in
            .map(|secs| Instant::now() + Duration::from_secs(secs)),
    })
}

/// The `scope` parameter of a `WWW-Authenticate: Bearer …` challenge (RFC 6750 §3).
pub(crate) fn challenge_scope(header: &str) -> Option<String> {
    challenge_param(header, "scope")
}

/// One auth-param of a `WWW-Authenticate: Bearer …` challenge (RFC 9110 §11.6.1):
/// `scope`, `error`, `resource_metadata` (RFC 9728 §5.1).
pub(crate) fn challenge_param(header: &str, wanted: &str) -> Option<String> {
    let rest = header.trim_start();
    let params = match rest.get(..6) {
        Some(scheme) if scheme.eq_ignore_ascii_case("bearer") => &rest[6..],
        _ => return None,
    };
    let mut chars = params.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if name.is_empty() {
            return None;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| *c != ',') {
                value.push(c);
            }
            value = value.trim().to_string();
        }
        if name.trim().eq_ignore_ascii_case(wanted) {
            return Some(value);
        }
    }
}

/// `application/x-www-form-urlencoded` for Basic credentials (RFC 6749 §2.3.1).
pub(crate) fn form_encode(text: &str) -> String {
    reqwest::Url::parse_with_params("http://x/", &[("v", text)])
        .ok()
        .and_then(|url| url.query().map(|q| q.trim_start_matches("v=").to_string()))
        .unwrap_or_else(|| text.to_string())
}

/// The union of two space-separated scope lists, first list's order first.
pub(crate) fn scope_union(current: Option<&str>, challenged: Option<&str>) -> Option<String> {
    let mut scopes: Vec<&str> = Vec::new();
    for scope in current
        .into_iter()
        .chain(challenged)
        .flat_map(str::split_whitespace)
    {
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }
    (!scopes.is_empty()).then(|| scopes.join(" "))
}

/// A URL for messages: without query and user info.
pub(crate) fn without_query(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) => {
            parsed.set_query(None);
            parsed.set_fragment(None);
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        Err(_) => "<invalid url>".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenge_scopes() {
        assert_eq!(
            challenge_scope(r#"Bearer scope="tools:write""#).as_deref(),
            Some("tools:write")
        );
        assert_eq!(
            challenge_scope(r#"Bearer error="insufficient_scope", scope="a b", realm="x""#)
                .as_deref(),
            Some("a b")
        );
        assert_eq!(
            challenge_scope(r#"bearer realm=x, scope=read:data"#).as_deref(),
            Some("read:data")
        );
        assert_eq!(challenge_scope(r#"Bearer realm="x""#), None);
        assert_eq!(challenge_scope(r#"Basic realm="x", scope="a""#), None);
        assert_eq!(
            challenge_param(
                r#"Bearer resource_metadata="http://h/.well-known/oauth-protected-resource/mcp", scope="a""#,
                "resource_metadata"
            )
            .as_deref(),
            Some("http://h/.well-known/oauth-protected-resource/mcp")
        );
    }

    #[test]
    fn scope_unions() {
        assert_eq!(
            scope_union(Some("a b"), Some("b c")).as_deref(),
            Some("a b c")
        );
        assert_eq!(scope_union(None, Some("c")).as_deref(), Some("c"));
        assert_eq!(scope_union(None, None), None);
    }
}
