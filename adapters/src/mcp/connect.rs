//! The OAuth requests of a connection (`flow connect`, a shared refresh, a revocation):
//! finding the authorization server of an MCP server that asks for a sign-in, dynamic
//! client registration (RFC 7591), the authorization-code exchange with PKCE (RFC 7636)
//! and `resource` (RFC 8707), the refresh grant, and revocation (RFC 7009).
//!
//! The engine decides when (a person signs in once; workers refresh under a ledger
//! lease); this module only speaks the protocol. Tokens are returned to the caller and
//! never logged; error messages carry the server's `error` / `error_description`, which
//! hold no token.

use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use super::auth::without_query;
use super::discovery;
use crate::Error;
use crate::egress::AllowList;
use crate::error::head;
use crate::http::classify::detail;

/// The RFC 8693 token-exchange grant.
const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// The token type of an identity assertion authorization grant (ID-JAG, SEP-990).
const ID_JAG: &str = "urn:ietf:params:oauth:token-type:id-jag";
/// An OpenID Connect ID token as the subject of an exchange.
const ID_TOKEN: &str = "urn:ietf:params:oauth:token-type:id_token";
/// The RFC 7523 JWT bearer grant.
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

/// Bound on each request of a sign-in or a refresh.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The HTTP client of connections: no redirects followed, the egress allow-list checked
/// for every discovered URL.
#[derive(Clone)]
pub struct OAuth {
    http: crate::lazy_client::LazyClient,
    allow: Option<AllowList>,
}

/// What the MCP server and its authorization server say a sign-in needs.
#[derive(Debug, Clone)]
pub struct SignIn {
    /// The RFC 8707 resource (the MCP server, or the parent its metadata names).
    pub resource: String,
    /// The authorization server's issuer.
    pub issuer: String,
    /// Where the person signs in (absent at a server that takes only grants without a
    /// browser, such as cross-app access's JWT bearer grant).
    pub authorization_endpoint: Option<String>,
    /// Where codes and refresh tokens become tokens.
    pub token_endpoint: String,
    /// Dynamic client registration, when offered.
    pub registration_endpoint: Option<String>,
    /// Token revocation, when offered.
    pub revocation_endpoint: Option<String>,
    /// `token_endpoint_auth_methods_supported`.
    pub methods: Vec<String>,
    /// `code_challenge_methods_supported` (PKCE).
    pub code_challenge_methods: Vec<String>,
    /// Whether a client id may be a metadata document URL (CIMD).
    pub client_id_metadata_document_supported: bool,
    /// Whether the server says its redirects carry `iss`
    /// (`authorization_response_iss_parameter_supported`, RFC 9207): then a redirect
    /// without it is refused, as a mix-up attack's would be.
    pub iss_required: bool,
    /// The scope the 401 challenge asked for, if any.
    pub challenged_scope: Option<String>,
    /// The protected resource's `scopes_supported`, else the authorization server's.
    pub scopes_supported: Option<String>,
}

/// The client a connection uses at the token endpoint.
#[derive(Clone)]
pub struct OAuthClient {
    /// Client id.
    pub client_id: String,
    /// Its secret, for a confidential client.
    pub secret: Option<String>,
    /// `none`, `client_secret_basic` or `client_secret_post`.
    pub method: String,
}

impl std::fmt::Debug for OAuthClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthClient")
            .field("client_id", &self.client_id)
            .field("secret", &self.secret.as_ref().map(|_| "…"))
            .field("method", &self.method)
            .finish()
    }
}

/// Tokens a grant returned.
#[derive(Clone)]
pub struct Granted {
    /// The access token.
    pub access_token: String,
    /// A (new) refresh token, if issued.
    pub refresh_token: Option<String>,
    /// Seconds until the access token expires, if said.
    pub expires_in: Option<u64>,
    /// The scope granted, if said.
    pub scope: Option<String>,
    /// What a token exchange (RFC 8693) issued, if said.
    pub issued_token_type: Option<String>,
}

impl std::fmt::Debug for Granted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Granted")
            .field("expires_in", &self.expires_in)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// Why a token request failed.
#[derive(Debug)]
pub enum TokenFailure {
    /// The authorization server refused the request (a 4xx: `invalid_grant` — the code
    /// or refresh token is spent, expired or revoked —, `invalid_client`,
    /// `invalid_scope`, …): asking again with the same will not help.
    Refused(String),
    /// Anything else: unreachable, 5xx, an answer that is not a token response.
    Other(Error),
}

impl std::fmt::Display for TokenFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenFailure::Refused(m) => f.write_str(m),
            TokenFailure::Other(e) => write!(f, "{}", e.message),
        }
    }
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    issued_token_type: Option<String>,
    #[serde(default)]
    refresh_token: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
    #[serde(default)]
    scope: Option<String>,
}

#[derive(Deserialize)]
struct OAuthError {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

#[derive(Deserialize)]
struct Registration {
    client_id: String,
    #[serde(default)]
    client_secret: Option<String>,
    #[serde(default)]
    token_endpoint_auth_method: Option<String>,
}

impl OAuth {
    /// A client limited to `allow` (`None`: any host).
    pub fn new(allow: Option<AllowList>) -> Result<Self, Error> {
        // Built at the first request: every process that may use a connection makes one.
        let http = crate::lazy_client::LazyClient::new("OAuth HTTP", || {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(Duration::from_secs(10))
                .timeout(REQUEST_TIMEOUT)
                .user_agent(concat!("flow/", env!("CARGO_PKG_VERSION")))
        });
        Ok(OAuth { http, allow })
    }

    /// Builds the HTTP client now if no request has (see `http::Client::warm`).
    pub fn warm(&self) -> Result<(), Error> {
        self.http.get().map(|_| ())
    }

    fn check(&self, url: &str) -> Result<(), Error> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| Error::permanent(format!("bad URL {}: {e}", without_query(url))))?;
        let host = parsed.host_str().unwrap_or("");
        match &self.allow {
            Some(allow) if !allow.allows(host) => Err(Error::permanent(format!(
                "egress to `{host}` is not allowed by `egress.allow` in flow.toml ({})",
                without_query(url)
            ))),
            _ => Ok(()),
        }
    }

    /// Asks the MCP server at `server` for its challenge (an `initialize` without a
    /// token) and follows discovery to its authorization server.
    pub async fn discover(&self, server: &str) -> Result<SignIn, Error> {
        self.check(server)?;
        let body = serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": { "name": "flow", "version": env!("CARGO_PKG_VERSION") }
            }
        });
        let response = self
            .http
            .get()?
            .post(server)
            .header(
                reqwest::header::ACCEPT,
                "application/json, text/event-stream",
            )
            .json(&body)
            .send()
            .await
            .map_err(|e| {
                Error::not_sent(format!(
                    "{}: could not reach the MCP server: {}",
                    without_query(server),
                    detail(&e)
                ))
            })?;
        // A server may let `initialize` in and ask only for its tools (a 401 or 403
        // later): its metadata is still at the well-known URLs, so discovery runs
        // either way; the challenge, when there is one, adds its hints.
        let challenge = response
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("Bearer")
            .to_string();
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let allow = self.allow.as_ref();
        let found = match discovery::discover(self.http.get()?, server, &challenge, allow, deadline)
            .await
        {
            Ok(found) => found,
            // No protected-resource metadata: the 2025-03-26 revision's rules.
            Err(e) if discovery::lacks_resource_metadata(&e) => {
                tracing::debug!(target: "flow_adapters::mcp", "{}; trying the 2025-03-26 discovery", e.message);
                discovery::legacy(self.http.get()?, server, allow, deadline).await?
            }
            Err(e) => return Err(e),
        };
        let meta = found.sign_in;
        let authorization_endpoint = meta.authorization_endpoint;
        for url in [
            authorization_endpoint.as_ref(),
            meta.registration_endpoint.as_ref(),
        ]
        .into_iter()
        .flatten()
        .chain(meta.revocation_endpoint.as_ref())
        {
            self.check(url)?;
        }
        let as_scopes =
            (!meta.scopes_supported.is_empty()).then(|| meta.scopes_supported.join(" "));
        Ok(SignIn {
            resource: found.resource,
            issuer: found.issuer,
            authorization_endpoint,
            token_endpoint: found.token_url,
            registration_endpoint: meta.registration_endpoint,
            revocation_endpoint: meta.revocation_endpoint,
            methods: found.methods,
            code_challenge_methods: meta.code_challenge_methods_supported,
            client_id_metadata_document_supported: meta.client_id_metadata_document_supported,
            iss_required: meta.authorization_response_iss_parameter_supported,
            challenged_scope: super::auth::challenge_scope(&challenge),
            scopes_supported: found.scopes_supported.or(as_scopes),
        })
    }

    /// Registers flow as a client (RFC 7591) for `redirect_uri`: a public client
    /// (`none`) unless the server insists on a secret.
    pub async fn register(
        &self,
        endpoint: &str,
        redirect_uri: &str,
        scope: Option<&str>,
    ) -> Result<OAuthClient, Error> {
        self.check(endpoint)?;
        let mut body = serde_json::json!({
            "client_name": "flow",
            "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        });
        if let Some(scope) = scope {
            body["scope"] = scope.into();
        }
        let what = format!("client registration at {}", without_query(endpoint));
        let response = self
            .http
            .get()?
            .post(endpoint)
            .json(&body)
            .send()
            .await
            .map_err(|e| Error::not_sent(format!("{what}: {}", detail(&e))))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| Error::transient(format!("{what}: {}", detail(&e)), None))?;
        if !status.is_success() {
            return Err(Error::permanent(format!(
                "{what}: HTTP {status}: {}",
                head(&bytes, 300)
            )));
        }
        let reg: Registration = serde_json::from_slice(&bytes)
            .map_err(|e| Error::permanent(format!("{what}: not a registration answer: {e}")))?;
        let method = match (
            &reg.client_secret,
            reg.token_endpoint_auth_method.as_deref(),
        ) {
            (None, _) => "none".to_string(),
            (Some(_), Some(m)) => m.to_string(),
            (Some(_), None) => "client_secret_basic".to_string(),
        };
        Ok(OAuthClient {
            client_id: reg.client_id,
            secret: reg.client_secret,
            method,
        })
    }

    /// Exchanges an authorization `code` (with its PKCE `verifier`).
    pub async fn exchange_code(
        &self,
        token_endpoint: &str,
        client: &OAuthClient,
        code: &str,
        verifier: &str,
        redirect_uri: &str,
        resource: &str,
    ) -> Result<Granted, TokenFailure> {
        let form = vec![
            ("grant_type", "authorization_code".to_string()),
            ("code", code.to_string()),
            ("code_verifier", verifier.to_string()),
            ("redirect_uri", redirect_uri.to_string()),
            ("resource", resource.to_string()),
        ];
        self.token(token_endpoint, client, form).await
    }

    /// Trades `refresh_token` for new tokens (for `scope`, if given).
    pub async fn refresh(
        &self,
        token_endpoint: &str,
        client: &OAuthClient,
        refresh_token: &str,
        resource: &str,
        scope: Option<&str>,
    ) -> Result<Granted, TokenFailure> {
        let mut form = vec![
            ("grant_type", "refresh_token".to_string()),
            ("refresh_token", refresh_token.to_string()),
            ("resource", resource.to_string()),
        ];
        if let Some(scope) = scope.filter(|s| !s.is_empty()) {
            form.push(("scope", scope.to_string()));
        }
        self.token(token_endpoint, client, form).await
    }

    /// Cross-app access, step 1 (RFC 8693 at the person's identity provider): trades
    /// their `id_token` for an ID-JAG — an identity assertion authorization grant — for
    /// the authorization server `audience` (its issuer) and the MCP server `resource`.
    /// `idp_client` authenticates flow at the identity provider.
    pub async fn exchange_id_token(
        &self,
        idp_token_endpoint: &str,
        idp_client: &OAuthClient,
        id_token: &str,
        audience: &str,
        resource: &str,
        scope: Option<&str>,
    ) -> Result<String, TokenFailure> {
        let mut form = vec![
            ("grant_type", TOKEN_EXCHANGE.to_string()),
            ("requested_token_type", ID_JAG.to_string()),
            ("subject_token", id_token.to_string()),
            ("subject_token_type", ID_TOKEN.to_string()),
            ("audience", audience.to_string()),
            ("resource", resource.to_string()),
        ];
        if let Some(scope) = scope.filter(|s| !s.is_empty()) {
            form.push(("scope", scope.to_string()));
        }
        let answer = self.token(idp_token_endpoint, idp_client, form).await?;
        match answer.issued_token_type.as_deref() {
            Some(ID_JAG) => Ok(answer.access_token),
            other => Err(TokenFailure::Other(Error::permanent(format!(
                "token endpoint {}: the exchange issued {}, not an ID-JAG ({ID_JAG})",
                without_query(idp_token_endpoint),
                other.unwrap_or("no issued_token_type")
            )))),
        }
    }

    /// Cross-app access, step 2 (RFC 7523 §2.1 at the MCP server's authorization
    /// server): the ID-JAG `assertion` as a JWT bearer grant, the client authenticated.
    pub async fn jwt_bearer(
        &self,
        token_endpoint: &str,
        client: &OAuthClient,
        assertion: &str,
        scope: Option<&str>,
    ) -> Result<Granted, TokenFailure> {
        let mut form = vec![
            ("grant_type", JWT_BEARER.to_string()),
            ("assertion", assertion.to_string()),
        ];
        if let Some(scope) = scope.filter(|s| !s.is_empty()) {
            form.push(("scope", scope.to_string()));
        }
        self.token(token_endpoint, client, form).await
    }

    /// Revokes `token` (RFC 7009); `hint` is `refresh_token` or `access_token`.
    pub async fn revoke(
        &self,
        endpoint: &str,
        client: &OAuthClient,
        token: &str,
        hint: &str,
    ) -> Result<(), Error> {
        self.check(endpoint)?;
        let form = vec![
            ("token", token.to_string()),
            ("token_type_hint", hint.to_string()),
        ];
        let what = format!("revocation at {}", without_query(endpoint));
        let response = authenticate(self.http.get()?.post(endpoint), client, form)
            .send()
            .await
            .map_err(|e| Error::not_sent(format!("{what}: {}", detail(&e))))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let bytes = response.bytes().await.unwrap_or_default();
        Err(Error::permanent(format!(
            "{what}: HTTP {status}: {}",
            head(&bytes, 300)
        )))
    }

    async fn token(
        &self,
        endpoint: &str,
        client: &OAuthClient,
        form: Vec<(&'static str, String)>,
    ) -> Result<Granted, TokenFailure> {
        self.check(endpoint).map_err(TokenFailure::Other)?;
        let what = format!("token endpoint {}", without_query(endpoint));
        let http = self.http.get().map_err(TokenFailure::Other)?;
        let response = authenticate(http.post(endpoint), client, form)
            .send()
            .await
            .map_err(|e| TokenFailure::Other(Error::not_sent(format!("{what}: {}", detail(&e)))))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| {
            TokenFailure::Other(Error::transient(format!("{what}: {}", detail(&e)), None))
        })?;
        if !status.is_success() {
            let message = match serde_json::from_slice::<OAuthError>(&bytes) {
                Ok(e) => format!(
                    "{what}: HTTP {status}: {}{}",
                    e.error,
                    e.error_description
                        .map(|d| format!(": {}", head(d.as_bytes(), 200)))
                        .unwrap_or_default()
                ),
                Err(_) => format!("{what}: HTTP {status}: {}", head(&bytes, 300)),
            };
            // 408 and 429 ask to wait; any other 4xx refuses what was sent.
            let wait = status == reqwest::StatusCode::REQUEST_TIMEOUT
                || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
            return Err(if status.is_client_error() && !wait {
                TokenFailure::Refused(message)
            } else {
                TokenFailure::Other(Error::transient(message, None))
            });
        }
        let parsed: TokenResponse = serde_json::from_slice(&bytes).map_err(|e| {
            TokenFailure::Other(Error::permanent(format!(
                "{what}: the answer is not an OAuth token response: {e}"
            )))
        })?;
        Ok(Granted {
            access_token: parsed.access_token,
            refresh_token: parsed.refresh_token,
            expires_in: parsed.expires_in,
            scope: parsed.scope,
            issued_token_type: parsed.issued_token_type,
        })
    }
}

/// `request` with the client's authentication and `form`.
fn authenticate(
    request: reqwest::RequestBuilder,
    client: &OAuthClient,
    mut form: Vec<(&'static str, String)>,
) -> reqwest::RequestBuilder {
    let request = match (client.method.as_str(), &client.secret) {
        ("client_secret_basic", Some(secret)) => request.basic_auth(
            super::auth::form_encode(&client.client_id),
            Some(super::auth::form_encode(secret)),
        ),
        (_, Some(secret)) => {
            form.push(("client_id", client.client_id.clone()));
            form.push(("client_secret", secret.clone()));
            request
        }
        (_, None) => {
            form.push(("client_id", client.client_id.clone()));
            request
        }
    };
    request.form(&form)
}
