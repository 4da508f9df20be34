//! `flow connect NAME`: the OAuth authorization-code grant, run once by a person.
//!
//! Discovery from the MCP server's 401; a client (the configured id — a metadata
//! document URL when the server takes those — else dynamic registration); PKCE with
//! S256 only; a random `state` checked on return; RFC 8707 `resource`; a loopback
//! redirect (`http://127.0.0.1:<port>/callback`, RFC 8252) answered by a one-shot
//! listener. The URL is printed and handed to `--browser CMD` (or the platform's opener
//! when there is a display). Nothing is stored unless the code was exchanged: a state
//! mismatch, an error redirect or a refused exchange leave the ledger as it was.

use std::io::Write;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use flow_adapters::mcp::{OAuth, OAuthClient, SignIn, TokenFailure};
use flow_ledger::{Clock as _, Endpoints, Ledger, Sealed};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::ConnectionConfig;
use super::seal::{Key, Tokens};
use crate::secrets::Secrets;

/// Why a sign-in did not complete. Nothing was stored in any case.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The installation cannot sign in: no key, a missing client secret (exit 5).
    #[error("{0}")]
    Setup(String),
    /// The servers refused or could not be reached (exit 5).
    #[error("{0}")]
    Server(String),
    /// The browser came back with an error, a wrong `state`, or not at all (exit 2).
    #[error("{0}")]
    Refused(String),
    /// The ledger could not be read or written (exit 5; HTTP 503).
    #[error("{0}")]
    Ledger(String),
}

/// How the sign-in is run.
pub struct Options {
    /// The command that opens the URL (it gets the URL as its last argument); `None`
    /// uses the platform's opener when there is a display, else only prints.
    pub browser: Option<String>,
    /// How long to wait for the browser to come back.
    pub timeout: Duration,
    /// Who signs in (recorded).
    pub by: String,
}

/// What a sign-in stored.
#[derive(Debug)]
pub struct Connected {
    /// The connection.
    pub name: String,
    /// The scopes granted.
    pub scopes: Option<String>,
    /// Seconds until the access token expires, if said.
    pub expires_in: Option<u64>,
    /// Whether a refresh token was issued.
    pub has_refresh: bool,
    /// The generation stored.
    pub generation: i64,
}

/// A PKCE pair: the verifier (kept) and its S256 challenge (sent).
fn pkce() -> (String, String) {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    let verifier = URL_SAFE_NO_PAD.encode(bytes);
    let challenge = URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes()));
    (verifier, challenge)
}

fn random_state() -> String {
    let mut bytes = [0u8; 24];
    rand::fill(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The scope to ask for: the configured scopes, the ones runs were refused for, the
/// challenge's; else the server's `scopes_supported`; `offline_access` added when the
/// server lists it (a refresh token is the point).
pub(super) fn scope_for(
    config: &ConnectionConfig,
    wanted: Option<&str>,
    sign_in: &SignIn,
) -> Option<String> {
    fn add(scopes: &mut Vec<String>, s: &str) {
        for one in s.split_whitespace() {
            if !scopes.iter().any(|x| x == one) {
                scopes.push(one.to_owned());
            }
        }
    }
    let mut scopes: Vec<String> = Vec::new();
    for s in config.scopes.iter().map(String::as_str).chain(wanted) {
        add(&mut scopes, s);
    }
    if let Some(s) = &sign_in.challenged_scope {
        add(&mut scopes, s);
    }
    if scopes.is_empty()
        && let Some(supported) = &sign_in.scopes_supported
    {
        add(&mut scopes, supported);
    }
    let offers_offline = sign_in
        .scopes_supported
        .as_deref()
        .is_some_and(|s| s.split_whitespace().any(|x| x == "offline_access"));
    if offers_offline {
        add(&mut scopes, "offline_access");
    }
    (!scopes.is_empty()).then(|| scopes.join(" "))
}

/// What a sign-in to one connection works with: the connection's declaration, the
/// secrets its client credentials and the sealing key come from, and the OAuth client
/// (under this process's egress policy).
#[derive(Clone, Copy)]
pub struct SignInWith<'a> {
    /// The connection (`[[connections]]` of flow.toml).
    pub config: &'a ConnectionConfig,
    /// The process's secrets.
    pub secrets: &'a Secrets,
    /// The OAuth client.
    pub oauth: &'a OAuth,
}

/// The client to sign in with: configured, metadata document, or registered.
pub(super) async fn client_for(
    with: SignInWith<'_>,
    sign_in: &SignIn,
    redirect_uri: &str,
    scope: Option<&str>,
) -> Result<OAuthClient, Error> {
    let SignInWith {
        config,
        secrets,
        oauth,
    } = with;
    if let Some(id) = &config.client_id {
        let is_document = id.starts_with("https://");
        if is_document && !sign_in.client_id_metadata_document_supported {
            return Err(Error::Server(format!(
                "connection `{}`: client_id {id} is a metadata document URL, but the authorization server {} does not take those (client_id_metadata_document_supported)",
                config.name, sign_in.issuer
            )));
        }
        let secret = match &config.client_secret_name {
            Some(secret_name) => Some(secrets.get(secret_name).map(str::to_owned).ok_or_else(|| {
                Error::Setup(format!(
                    "connection `{}`: client_secret_name `{secret_name}` has no value (set FLOW_SECRET_{secret_name} or a --secrets-file line)",
                    config.name
                ))
            })?),
            None => None,
        };
        let method = match (&secret, &config.token_endpoint_auth) {
            (None, _) => "none".to_owned(),
            (Some(_), Some(m)) => m.clone(),
            (Some(_), None) => {
                let lists = |m: &str| sign_in.methods.iter().any(|x| x == m);
                if lists("client_secret_post") && !lists("client_secret_basic") {
                    "client_secret_post".to_owned()
                } else {
                    "client_secret_basic".to_owned()
                }
            }
        };
        return Ok(OAuthClient {
            client_id: id.clone(),
            secret,
            method,
        });
    }
    let Some(endpoint) = &sign_in.registration_endpoint else {
        return Err(Error::Setup(format!(
            "connection `{}`: the authorization server {} offers no dynamic registration; set `client_id` in its [[connections]] entry",
            config.name, sign_in.issuer
        )));
    };
    oauth
        .register(endpoint, redirect_uri, scope)
        .await
        .map_err(|e| Error::Server(format!("connection `{}`: {}", config.name, e.message)))
}

/// A sign-in begun and waiting for its browser: everything finishing it needs. Holds
/// the PKCE verifier and a client's secret, so it is sealed when stored (a console or
/// API sign-in) and never printed.
#[derive(Serialize, Deserialize)]
pub struct Pending {
    /// The connection.
    pub name: String,
    state: String,
    verifier: String,
    redirect_uri: String,
    scope: Option<String>,
    client_id: String,
    client_secret: Option<String>,
    method: String,
    server: String,
    resource: String,
    issuer: String,
    /// The server promised `iss` on its redirects (RFC 9207).
    #[serde(default)]
    iss_required: bool,
    token_endpoint: String,
    revocation_endpoint: Option<String>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("name", &self.name)
            .field("redirect_uri", &self.redirect_uri)
            .finish_non_exhaustive()
    }
}

impl Pending {
    /// The `state` the redirect must carry back.
    pub fn state(&self) -> &str {
        &self.state
    }

    /// The MCP server signed in to.
    pub fn server(&self) -> &str {
        &self.server
    }

    fn endpoints(&self) -> Endpoints {
        Endpoints {
            server: self.server.clone(),
            resource: self.resource.clone(),
            issuer: Some(self.issuer.clone()),
            token_endpoint: self.token_endpoint.clone(),
            revocation_endpoint: self.revocation_endpoint.clone(),
            client_id: self.client_id.clone(),
            auth_method: self.method.clone(),
        }
    }

    fn client(&self) -> OAuthClient {
        OAuthClient {
            client_id: self.client_id.clone(),
            secret: self.client_secret.clone(),
            method: self.method.clone(),
        }
    }
}

/// A sign-in begun: the URL the person opens, and what finishing needs.
#[derive(Debug)]
pub struct Begun {
    /// The authorization server's sign-in page, with every parameter.
    pub url: url::Url,
    /// Kept until the browser comes back to `redirect_uri`.
    pub pending: Pending,
}

/// Begins a sign-in to `config` whose browser will come back to `redirect_uri`:
/// discovery, PKCE S256 required, the scope, a client (registered for `redirect_uri`
/// when none is configured), a fresh verifier and `state`. Nothing is stored.
pub async fn begin(
    ledger: &Ledger,
    with: SignInWith<'_>,
    redirect_uri: &str,
) -> Result<Begun, Error> {
    let SignInWith { config, oauth, .. } = with;
    let name = &config.name;
    let server =
        |e: flow_adapters::Error| Error::Server(format!("connection `{name}`: {}", e.message));
    let sign_in = oauth.discover(&config.server).await.map_err(server)?;
    if !sign_in.code_challenge_methods.iter().any(|m| m == "S256") {
        return Err(Error::Server(format!(
            "connection `{name}`: the authorization server {} does not list PKCE S256 in code_challenge_methods_supported; flow signs in only with PKCE",
            sign_in.issuer
        )));
    }
    if sign_in.authorization_endpoint.is_none() {
        return Err(Error::Server(format!(
            "connection `{name}`: authorization server {} has no authorization_endpoint: it offers no sign-in in a browser (cross-app access? see [connections.cross_app])",
            sign_in.issuer
        )));
    }
    let wanted = ledger
        .connection(name)
        .await
        .map_err(|e| Error::Ledger(format!("cannot read the ledger: {e}")))?
        .and_then(|c| c.scopes_wanted);
    let scope = scope_for(config, wanted.as_deref(), &sign_in);
    let client = client_for(with, &sign_in, redirect_uri, scope.as_deref()).await?;
    let (verifier, challenge) = pkce();
    let state = random_state();
    let url = authorize_url(
        &sign_in,
        &client,
        redirect_uri,
        &challenge,
        &state,
        scope.as_deref(),
    )?;
    let pending = Pending {
        name: name.clone(),
        state,
        verifier,
        redirect_uri: redirect_uri.to_owned(),
        scope,
        client_id: client.client_id,
        client_secret: client.secret,
        method: client.method,
        server: config.server.clone(),
        resource: sign_in.resource,
        issuer: sign_in.issuer,
        iss_required: sign_in.iss_required,
        token_endpoint: sign_in.token_endpoint,
        revocation_endpoint: sign_in.revocation_endpoint,
    };
    Ok(Begun { url, pending })
}

/// Finishes sign-in `pending` with the redirect's query `params`: the checks (`state`,
/// no `error`, the issuer), the code exchanged, the tokens sealed under `key` and stored
/// as connected `by`. Nothing is stored when any of it fails.
pub async fn finish(
    ledger: &Ledger,
    oauth: &OAuth,
    key: &Key,
    pending: Pending,
    params: &[(String, String)],
    by: &str,
) -> Result<Connected, Error> {
    let name = pending.name.as_str();
    let code = code_of(
        name,
        params,
        &pending.state,
        &pending.issuer,
        pending.iss_required,
    )?;
    let client = pending.client();
    let granted = oauth
        .exchange_code(
            &pending.token_endpoint,
            &client,
            &code,
            &pending.verifier,
            &pending.redirect_uri,
            &pending.resource,
        )
        .await
        .map_err(|f| match f {
            TokenFailure::Refused(m) => Error::Refused(format!("connection `{name}`: {m}")),
            TokenFailure::Other(e) => Error::Server(format!("connection `{name}`: {}", e.message)),
        })?;
    let tokens = Tokens {
        access_token: granted.access_token.clone(),
        refresh_token: granted.refresh_token.clone(),
        client_secret: client.secret.clone(),
    };
    let scopes = granted.scope.clone().or_else(|| pending.scope.clone());
    let expires_in = granted.expires_in;
    let endpoints = pending.endpoints();
    store(
        ledger,
        name,
        endpoints,
        key,
        Granted {
            tokens,
            scopes,
            expires_in,
        },
        by,
    )
    .await
}

/// Runs the sign-in for `config` from this terminal — a loopback listener for the
/// redirect, the URL printed to `out` and handed to the browser — and stores the tokens
/// in `ledger`.
pub async fn connect(
    ledger: &Ledger,
    with: SignInWith<'_>,
    options: &Options,
    out: &mut dyn Write,
) -> Result<Connected, Error> {
    let SignInWith {
        config,
        secrets,
        oauth,
    } = with;
    let name = &config.name;
    let key = Key::from_secrets(secrets).map_err(|e| Error::Setup(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| Error::Setup(format!("cannot listen on 127.0.0.1 for the redirect: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::Setup(e.to_string()))?
        .port();
    let redirect_uri = format!("http://127.0.0.1:{port}/callback");
    let Begun { url, pending } = begin(ledger, with, &redirect_uri).await?;
    let _ = writeln!(out, "Sign in to connection `{name}` at:\n\n  {url}\n");
    let _ = writeln!(
        out,
        "Waiting for the browser to come back to {redirect_uri} …"
    );
    let _ = out.flush();
    open_browser(options.browser.as_deref(), url.as_str());
    let back = tokio::time::timeout(options.timeout, callback(&listener)).await;
    let params = back.map_err(|_| {
        Error::Refused(format!(
            "connection `{name}`: no sign-in came back within {}s; nothing was stored",
            options.timeout.as_secs()
        ))
    })??;
    finish(ledger, oauth, &key, pending, &params, &options.by).await
}

/// The sign-in URL: code flow, PKCE S256, state, resource, scope.
fn authorize_url(
    sign_in: &SignIn,
    client: &OAuthClient,
    redirect_uri: &str,
    challenge: &str,
    state: &str,
    scope: Option<&str>,
) -> Result<url::Url, Error> {
    let endpoint = sign_in.authorization_endpoint.as_deref().ok_or_else(|| {
        Error::Server(format!(
            "authorization server {} has no authorization_endpoint: it offers no sign-in in a browser",
            sign_in.issuer
        ))
    })?;
    let mut url = url::Url::parse(endpoint)
        .map_err(|e| Error::Server(format!("bad authorization_endpoint: {e}")))?;
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("response_type", "code")
            .append_pair("client_id", &client.client_id)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("code_challenge", challenge)
            .append_pair("code_challenge_method", "S256")
            .append_pair("state", state)
            .append_pair("resource", &sign_in.resource);
        if let Some(scope) = scope {
            q.append_pair("scope", scope);
        }
    }
    Ok(url)
}

/// The code of a redirect that passes the checks: our `state`, no `error`, the
/// expected issuer when it names one — or always, when the server promised to (RFC 9207).
fn code_of(
    name: &str,
    params: &[(String, String)],
    state: &str,
    issuer: &str,
    iss_required: bool,
) -> Result<String, Error> {
    let got = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    if !subtle_eq(got("state").unwrap_or(""), state) {
        return Err(Error::Refused(format!(
            "connection `{name}`: the redirect's state does not match the one sent (a forged or stale redirect); nothing was stored"
        )));
    }
    if iss_required && got("iss").is_none() {
        return Err(Error::Refused(format!(
            "connection `{name}`: the redirect carries no `iss` although {issuer} promises one (RFC 9207: a mix-up attack's redirect would look like this); nothing was stored"
        )));
    }
    if let Some(iss) = got("iss")
        && iss != issuer
    {
        return Err(Error::Refused(format!(
            "connection `{name}`: the redirect came from issuer {iss}, not {issuer} (RFC 9207); nothing was stored"
        )));
    }
    if let Some(error) = got("error") {
        let description = got("error_description").unwrap_or("");
        return Err(Error::Refused(format!(
            "connection `{name}`: the authorization server answered `{error}` {description}; nothing was stored"
        )));
    }
    got("code").map(str::to_owned).ok_or_else(|| {
        Error::Refused(format!(
            "connection `{name}`: the redirect carries no code; nothing was stored"
        ))
    })
}

/// What a sign-in was granted: the tokens to seal, and the scopes and the access
/// token's lifetime the server reported.
pub(super) struct Granted {
    pub(super) tokens: Tokens,
    pub(super) scopes: Option<String>,
    pub(super) expires_in: Option<u64>,
}

/// Seals the `granted` tokens under `key` and stores connection `name` with its
/// `endpoints`, connected `by`.
pub(super) async fn store(
    ledger: &Ledger,
    name: &str,
    endpoints: Endpoints,
    key: &Key,
    granted: Granted,
    by: &str,
) -> Result<Connected, Error> {
    let Granted {
        tokens,
        scopes,
        expires_in,
    } = granted;
    let now = flow_ledger::SystemClock.now();
    let s = ledger.scope();
    let sealed = Sealed {
        sealed: key.seal((&s.tenant, &s.workspace), name, &tokens),
        key_id: key.id().to_owned(),
        scopes_granted: scopes.clone(),
        access_expires_at: expires_in.map(|x| now.plus(Duration::from_secs(x))),
        has_refresh: tokens.refresh_token.is_some(),
    };
    let has_refresh = sealed.has_refresh;
    let generation = ledger
        .store_connection(name, endpoints, sealed, by, now)
        .await
        .map_err(|e| Error::Ledger(format!("cannot store connection `{name}`: {e}")))?;
    Ok(Connected {
        name: name.to_owned(),
        scopes,
        expires_in,
        has_refresh,
        generation,
    })
}

fn subtle_eq(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Starts the browser: `command` with the URL as its last argument (through `sh -c`,
/// so it may carry its own arguments), else the platform's opener when there is a
/// display. A browser that cannot start is reported; the URL was printed anyway. The
/// browser is left running (it may be the person's own, started by the opener); a
/// task reaps it.
fn open_browser(command: Option<&str>, url: &str) {
    let command = match command {
        Some(c) => c.to_owned(),
        None if cfg!(target_os = "macos") => "open".to_owned(),
        None if std::env::var_os("DISPLAY").is_some()
            || std::env::var_os("WAYLAND_DISPLAY").is_some() =>
        {
            "xdg-open".to_owned()
        }
        None => return,
    };
    let spawned = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{command} \"$FLOW_CONNECT_URL\""))
        .env("FLOW_CONNECT_URL", url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn();
    match spawned {
        Ok(mut child) => {
            tokio::spawn(async move {
                let _ = child.wait().await;
            });
        }
        Err(e) => {
            tracing::warn!(target: "flow::connections", "cannot start the browser `{command}`: {e}");
        }
    }
}

/// Waits for `GET /callback?…` on `listener` and answers it; other requests (a
/// browser's favicon) get 404. The query's pairs.
async fn callback(listener: &tokio::net::TcpListener) -> Result<Vec<(String, String)>, Error> {
    loop {
        let (mut stream, _) = listener
            .accept()
            .await
            .map_err(|e| Error::Setup(format!("the redirect listener failed: {e}")))?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 2048];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
            match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                _ => break,
            }
        }
        let head = String::from_utf8_lossy(&buf);
        let target = head
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("GET "))
            .and_then(|l| l.split(' ').next())
            .unwrap_or("");
        let Ok(url) = url::Url::parse(&format!("http://127.0.0.1{target}")) else {
            continue;
        };
        if url.path() != "/callback" {
            let _ = stream
                .write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
            continue;
        }
        let params: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        let ok = params.iter().any(|(k, _)| k == "code");
        let body = if ok {
            "flow: signed in. You can close this window."
        } else {
            "flow: the sign-in did not complete; see the terminal."
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\ncache-control: no-store\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
        return Ok(params);
    }
}
