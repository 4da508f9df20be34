//! Authorization by discovery, as the MCP authorization spec has a client find its
//! authorization server: from a 401's `WWW-Authenticate` to a token endpoint.
//!
//! 1. The challenge's `resource_metadata` URL, else the protected-resource metadata
//!    (RFC 9728) at the path-based well-known URL
//!    (`/.well-known/oauth-protected-resource/<mcp path>`), then at the root.
//! 2. Its first `authorization_servers` entry's metadata: RFC 8414
//!    (`/.well-known/oauth-authorization-server<issuer path>`), then OpenID discovery
//!    (`/.well-known/openid-configuration<issuer path>`, then
//!    `<issuer>/.well-known/openid-configuration`).
//! 3. Its `token_endpoint` and `token_endpoint_auth_methods_supported`.
//!
//! Every URL fetched passes the egress allow-list first (a denied host is a permanent
//! error naming it), and the resource the metadata names must be the MCP server's own
//! URL or a parent of it, so a server cannot send flow's credentials elsewhere.

use reqwest::Url;
use serde::Deserialize;
use tokio::time::Instant;

use super::Auth;
use super::auth::{Credentials, challenge_param, without_query};
use crate::Error;
use crate::egress::AllowList;
use crate::http::classify::detail;

/// The words of the error [`discover`] ends with when a server publishes no
/// protected-resource metadata at all: what a sign-in falls back on [`legacy`] for.
const NO_RESOURCE_METADATA: &str = "no protected-resource metadata";

/// Whether `error` is [`discover`]'s "no protected-resource metadata" (a server of the
/// 2025-03-26 revision, or one without metadata), not a refusal or an unreachable URL.
pub(crate) fn lacks_resource_metadata(error: &Error) -> bool {
    error.message.contains(NO_RESOURCE_METADATA)
}

/// What discovery found: where and how to ask for a token, and for which resource.
#[derive(Debug, Clone)]
pub(crate) struct Discovered {
    /// The authorization server's token endpoint.
    pub(crate) token_url: String,
    /// The authorization server's issuer (the audience of a private-key JWT).
    pub(crate) issuer: String,
    /// `token_endpoint_auth_methods_supported` (empty when not given).
    pub(crate) methods: Vec<String>,
    /// The RFC 8707 `resource` for token requests.
    pub(crate) resource: String,
    /// The protected resource's `scopes_supported`, space-joined, if any.
    pub(crate) scopes_supported: Option<String>,
    /// What a sign-in (authorization code) needs besides the token endpoint.
    pub(crate) sign_in: SignInMetadata,
}

/// The parts of the authorization server's metadata a sign-in uses (`flow connect`).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct SignInMetadata {
    #[serde(default)]
    pub(crate) authorization_endpoint: Option<String>,
    #[serde(default)]
    pub(crate) registration_endpoint: Option<String>,
    #[serde(default)]
    pub(crate) revocation_endpoint: Option<String>,
    #[serde(default)]
    pub(crate) code_challenge_methods_supported: Vec<String>,
    #[serde(default)]
    pub(crate) client_id_metadata_document_supported: bool,
    #[serde(default)]
    pub(crate) scopes_supported: Vec<String>,
    #[serde(default)]
    pub(crate) authorization_response_iss_parameter_supported: bool,
}

#[derive(Deserialize)]
struct ResourceMetadata {
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    authorization_servers: Vec<String>,
    #[serde(default)]
    scopes_supported: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct ServerMetadata {
    #[serde(default)]
    issuer: Option<String>,
    token_endpoint: Option<String>,
    #[serde(default)]
    token_endpoint_auth_methods_supported: Vec<String>,
    #[serde(flatten)]
    sign_in: SignInMetadata,
}

/// The URLs to fetch and the check each one passes.
struct Fetcher<'a> {
    http: &'a reqwest::Client,
    allow: Option<&'a AllowList>,
    deadline: Instant,
}

impl Fetcher<'_> {
    /// The JSON at `url`, or `None` when the server has none there (any non-2xx, or an
    /// answer that is not the expected document).
    async fn get<T: for<'de> Deserialize<'de>>(&self, url: &Url) -> Result<Option<T>, Error> {
        let host = url.host_str().unwrap_or("");
        if let Some(allow) = self.allow
            && !allow.allows(host)
        {
            return Err(Error::permanent(format!(
                "authorization discovery: egress to `{host}` is not allowed by `egress.allow` in flow.toml ({})",
                without_query(url.as_str())
            )));
        }
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(Error::not_sent(
                "authorization discovery: the timeout expired; the tool call was not sent",
            ));
        }
        let request = self
            .http
            .get(url.clone())
            .header(reqwest::header::ACCEPT, "application/json")
            .timeout(remaining);
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                return Err(Error::not_sent(format!(
                    "authorization discovery: {}: {}; the tool call was not sent",
                    without_query(url.as_str()),
                    detail(&e)
                )));
            }
        };
        if !response.status().is_success() {
            tracing::debug!(target: "flow_adapters::mcp", url = %without_query(url.as_str()), status = %response.status(), "no metadata here");
            return Ok(None);
        }
        Ok(response.json::<T>().await.ok())
    }
}

/// `origin + prefix + path` (path without its trailing slash; `/` counts as empty).
fn well_known(base: &Url, prefix: &str) -> Option<Url> {
    let path = base.path().trim_end_matches('/');
    let mut url = base.clone();
    url.set_query(None);
    url.set_fragment(None);
    url.set_path(&format!("{prefix}{path}"));
    Some(url)
}

/// Finds the token endpoint for the MCP server at `mcp_url`, starting from the
/// `WWW-Authenticate` value of its 401.
pub(crate) async fn discover(
    http: &reqwest::Client,
    mcp_url: &str,
    challenge: &str,
    allow: Option<&AllowList>,
    deadline: Instant,
) -> Result<Discovered, Error> {
    let fetch = Fetcher {
        http,
        allow,
        deadline,
    };
    let server = Url::parse(mcp_url)
        .map_err(|e| Error::permanent(format!("authorization discovery: bad MCP URL: {e}")))?;
    let mut candidates = Vec::new();
    if let Some(url) = challenge_param(challenge, "resource_metadata") {
        let url = server.join(&url).map_err(|e| {
            Error::permanent(format!(
                "authorization discovery: bad resource_metadata URL {url:?}: {e}"
            ))
        })?;
        candidates.push(url);
    }
    candidates.extend(well_known(&server, "/.well-known/oauth-protected-resource"));
    let mut root = server.clone();
    root.set_path("/.well-known/oauth-protected-resource");
    root.set_query(None);
    candidates.push(root);
    candidates.dedup();
    let mut metadata = None;
    for url in &candidates {
        if let Some(found) = fetch.get::<ResourceMetadata>(url).await? {
            metadata = Some(found);
            break;
        }
    }
    let Some(metadata) = metadata else {
        return Err(Error::permanent(format!(
            "authorization discovery: {NO_RESOURCE_METADATA} for {} (tried {})",
            without_query(mcp_url),
            candidates
                .iter()
                .map(|u| without_query(u.as_str()))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    let resource = match metadata.resource {
        Some(resource) if !covers(&resource, &server) => {
            return Err(Error::permanent(format!(
                "authorization discovery: the metadata is for resource {}, not {}; refusing to authorize",
                without_query(&resource),
                without_query(mcp_url)
            )));
        }
        Some(resource) => resource,
        None => without_query(mcp_url),
    };
    let Some(issuer) = metadata.authorization_servers.first() else {
        return Err(Error::permanent(
            "authorization discovery: the protected-resource metadata names no authorization server",
        ));
    };
    let issuer_url = Url::parse(issuer).map_err(|e| {
        Error::permanent(format!(
            "authorization discovery: bad authorization server {issuer:?}: {e}"
        ))
    })?;
    let server_metadata = authorization_server(&fetch, &issuer_url).await?;
    let token_url = server_metadata.token_endpoint.ok_or_else(|| {
        Error::permanent(format!(
            "authorization discovery: authorization server {} has no token_endpoint",
            without_query(issuer)
        ))
    })?;
    let token = Url::parse(&token_url).map_err(|e| {
        Error::permanent(format!("authorization discovery: bad token_endpoint: {e}"))
    })?;
    if let Some(allow) = allow
        && !allow.allows(token.host_str().unwrap_or(""))
    {
        return Err(Error::permanent(format!(
            "authorization discovery: egress to `{}` (the token endpoint) is not allowed by `egress.allow` in flow.toml",
            token.host_str().unwrap_or("")
        )));
    }
    Ok(Discovered {
        token_url,
        issuer: server_metadata.issuer.unwrap_or_else(|| issuer.clone()),
        methods: server_metadata.token_endpoint_auth_methods_supported,
        resource,
        scopes_supported: metadata
            .scopes_supported
            .filter(|s| !s.is_empty())
            .map(|s| s.join(" ")),
        sign_in: server_metadata.sign_in,
    })
}

/// The 2025-03-26 revision's discovery, for a server without protected-resource
/// metadata: the authorization server is the MCP server's origin, its RFC 8414 metadata
/// at `<origin>/.well-known/oauth-authorization-server`, and without that the default
/// endpoints `/authorize`, `/token` and `/register` there (with PKCE S256, which that
/// revision requires). Used for sign-ins only.
pub(crate) async fn legacy(
    http: &reqwest::Client,
    mcp_url: &str,
    allow: Option<&AllowList>,
    deadline: Instant,
) -> Result<Discovered, Error> {
    let fetch = Fetcher {
        http,
        allow,
        deadline,
    };
    let server = Url::parse(mcp_url)
        .map_err(|e| Error::permanent(format!("authorization discovery: bad MCP URL: {e}")))?;
    let mut origin = server.clone();
    origin.set_path("");
    origin.set_query(None);
    origin.set_fragment(None);
    let base = origin.as_str().trim_end_matches('/').to_string();
    let mut url = origin.clone();
    url.set_path("/.well-known/oauth-authorization-server");
    let found = fetch.get::<ServerMetadata>(&url).await?;
    let (issuer, token_url, methods, mut sign_in) = match found {
        Some(m) if m.token_endpoint.is_some() => (
            m.issuer.unwrap_or_else(|| base.clone()),
            m.token_endpoint.unwrap_or_default(),
            m.token_endpoint_auth_methods_supported,
            m.sign_in,
        ),
        _ => (
            base.clone(),
            format!("{base}/token"),
            Vec::new(),
            SignInMetadata {
                authorization_endpoint: Some(format!("{base}/authorize")),
                registration_endpoint: Some(format!("{base}/register")),
                ..SignInMetadata::default()
            },
        ),
    };
    if sign_in.code_challenge_methods_supported.is_empty() {
        sign_in.code_challenge_methods_supported = vec!["S256".to_string()];
    }
    Ok(Discovered {
        token_url,
        issuer,
        methods,
        resource: without_query(mcp_url),
        scopes_supported: None,
        sign_in,
    })
}

/// Credentials and the first scope for a server found by discovery, or `None` when the
/// workflow configured no client credentials to use.
///
/// Scope: the workflow's `scope` and the challenge's; else the protected resource's
/// `scopes_supported`; else none (the parameter is omitted).
pub(crate) async fn credentials(
    url: &str,
    auth: &Auth,
    challenge: &str,
    http: &reqwest::Client,
    allow: Option<&AllowList>,
    deadline: Instant,
) -> Result<Option<(Credentials, Option<String>)>, Error> {
    let Auth::ClientCredentials {
        client_id,
        client_auth,
        scope,
        ..
    } = auth
    else {
        return Ok(None);
    };
    let found = discover(http, url, challenge, allow, deadline).await?;
    tracing::debug!(target: "flow_adapters::mcp", token_url = %without_query(&found.token_url), "authorization server discovered");
    let challenged = super::auth::challenge_scope(challenge);
    let scope = super::auth::scope_union(scope.as_deref(), challenged.as_deref())
        .or(found.scopes_supported.clone());
    let credentials = Credentials {
        token_url: found.token_url,
        client_id: client_id.clone(),
        client_auth: client_auth.clone(),
        resource: found.resource,
        audience: found.issuer,
        methods: found.methods,
    };
    Ok(Some((credentials, scope)))
}

/// RFC 8414 then OpenID discovery, path-inserted first, then path-appended.
async fn authorization_server(fetch: &Fetcher<'_>, issuer: &Url) -> Result<ServerMetadata, Error> {
    let mut candidates: Vec<Url> = Vec::new();
    candidates.extend(well_known(
        issuer,
        "/.well-known/oauth-authorization-server",
    ));
    candidates.extend(well_known(issuer, "/.well-known/openid-configuration"));
    let mut appended = issuer.clone();
    appended.set_path(&format!(
        "{}/.well-known/openid-configuration",
        issuer.path().trim_end_matches('/')
    ));
    candidates.push(appended);
    candidates.dedup();
    for url in &candidates {
        if let Some(found) = fetch.get::<ServerMetadata>(url).await?
            && found.token_endpoint.is_some()
        {
            return Ok(found);
        }
    }
    Err(Error::permanent(format!(
        "authorization discovery: no authorization server metadata for {} (tried {})",
        without_query(issuer.as_str()),
        candidates
            .iter()
            .map(|u| without_query(u.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

/// Whether `resource` is the server's URL or a parent of it (same origin, path prefix).
fn covers(resource: &str, server: &Url) -> bool {
    let Ok(resource) = Url::parse(resource) else {
        return false;
    };
    let same_origin = resource.scheme() == server.scheme()
        && resource.host_str() == server.host_str()
        && resource.port_or_known_default() == server.port_or_known_default();
    let prefix = resource.path().trim_end_matches('/');
    let path = server.path();
    same_origin
        && (prefix.is_empty()
            || path == prefix
            || path.starts_with(&format!("{prefix}/"))
            || path.trim_end_matches('/') == prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn well_known_urls_insert_the_path() {
        let server = url("http://localhost:9/mcp");
        assert_eq!(
            well_known(&server, "/.well-known/oauth-protected-resource").map(String::from),
            Some("http://localhost:9/.well-known/oauth-protected-resource/mcp".to_string())
        );
        let issuer = url("http://localhost:9/");
        assert_eq!(
            well_known(&issuer, "/.well-known/oauth-authorization-server").map(String::from),
            Some("http://localhost:9/.well-known/oauth-authorization-server".to_string())
        );
    }

    #[test]
    fn resources_cover_their_own_paths_only() {
        let server = url("http://localhost:9/mcp");
        assert!(covers("http://localhost:9/mcp", &server));
        assert!(covers("http://localhost:9/", &server));
        assert!(covers("http://localhost:9", &server));
        assert!(!covers("https://evil.example.com/mcp", &server));
        assert!(!covers("http://localhost:10/mcp", &server));
        assert!(!covers("http://localhost:9/other", &server));
        assert!(!covers("http://localhost:9/mc", &server));
    }
}
