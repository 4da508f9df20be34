//! One rmcp client session per MCP server, reused across calls and restarted when dead.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use process_wrap::tokio::{CommandWrap, ProcessGroup};
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, JsonObject,
};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::auth::{self, AuthedClient, Credentials, Token, TokenSlot};
use super::classify::{self, Failure};
use super::{Annotations, Auth, McpTool, ServerSpec, Spec};
use crate::command::DEFAULT_ENV_ALLOW;
use crate::error::tail;
use crate::process::Group;
use crate::{Error, Outcome};

/// Sessions are keyed by server and credentials: two workflows using the same server
/// with different tokens must not share a session.
type Key = (ServerSpec, Auth);

type Slot = Arc<tokio::sync::Mutex<Option<Arc<Session>>>>;

/// The MCP sessions of a process. Cheap to clone; clones share the sessions.
///
/// Dropping the last clone closes every session (stdio servers are killed with their
/// process group); [`Pool::close`] does it gracefully.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    slots: Mutex<HashMap<Key, Slot>>,
    annotations: Mutex<HashMap<(Key, String), Annotations>>,
    http: reqwest::Client,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sessions = self.inner.slots.lock().map(|s| s.len()).unwrap_or(0);
        f.debug_struct("Pool").field("servers", &sessions).finish()
    }
}

/// How long stderr of a stdio server that failed to start is awaited for the message.
const STDERR_GRACE: Duration = Duration::from_millis(300);

/// Bound on establishing a TCP connection to an HTTP server or token endpoint.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// stderr kept per stdio server for error messages.
const STDERR_TAIL_BYTES: usize = 2048;

impl Pool {
    /// An empty pool with its own HTTP connection pool (rustls, no redirects).
    pub fn new() -> Result<Self, Error> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("flow/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::permanent(format!("cannot build the MCP HTTP client: {e}")))?;
        Ok(Pool {
            inner: Arc::new(Inner {
                slots: Mutex::new(HashMap::new()),
                annotations: Mutex::new(HashMap::new()),
                http,
            }),
        })
    }

    /// A tool for `spec`, using annotations fetched earlier by [`Pool::annotations`].
    pub fn tool(&self, spec: Spec) -> McpTool {
        let key = ((spec.server.clone(), spec.auth.clone()), spec.tool.clone());
        let annotations = self
            .inner
            .annotations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .copied();
        McpTool {
            pool: self.clone(),
            spec,
            annotations,
        }
    }

    /// The annotations of `spec.tool` from the server's `tools/list` (listed once per
    /// session), or `None` when the server does not list that tool. Starts the session
    /// if needed, within `timeout`.
    pub async fn annotations(
        &self,
        spec: &Spec,
        timeout: Duration,
    ) -> Result<Option<Annotations>, Error> {
        let deadline = Instant::now() + timeout;
        let key: Key = (spec.server.clone(), spec.auth.clone());
        let session = self.session(&key, deadline).await?;
        let what = format!("{} listing tools", session.label);
        let listed = session
            .tools
            .get_or_try_init(|| async {
                let listing = session.client.peer().list_all_tools();
                match tokio::time::timeout_at(deadline, listing).await {
                    Ok(Ok(tools)) => Ok(tools
                        .iter()
                        .map(|t| {
                            (
                                t.name.to_string(),
                                Annotations::from_rmcp(t.annotations.as_ref()),
                            )
                        })
                        .collect::<HashMap<_, _>>()),
                    Ok(Err(e)) => {
                        let failure = classify::request_error(&e, &what);
                        if failure.discard {
                            self.discard(&key, &session).await;
                        }
                        Err(failure.error)
                    }
                    // Listing has no side effect: a timeout is just "try later".
                    Err(_) => Err(Error::transient(format!("{what}: timed out"), None)),
                }
            })
            .await?;
        let found = listed.get(&spec.tool).copied();
        if let Some(annotations) = found {
            self.inner
                .annotations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert((key, spec.tool.clone()), annotations);
        }
        Ok(found)
    }

    /// Closes every session: stdio servers get their stdin closed, then SIGTERM, then
    /// SIGKILL (rmcp's shutdown sequence), each bounded.
    pub async fn close(&self) {
        let slots: Vec<Slot> = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, slot)| slot)
            .collect();
        for slot in slots {
            let session = slot.lock().await.take();
            if let Some(session) = session
                && let Ok(mut session) = Arc::try_unwrap(session)
            {
                let _ = session
                    .client
                    .close_with_timeout(Duration::from_secs(5))
                    .await;
            }
        }
    }

    /// Performs one `tools/call` (and at most one re-send after an auth challenge).
    pub(super) async fn call(
        &self,
        spec: &Spec,
        arguments: Option<JsonObject>,
        deadline: Instant,
    ) -> Outcome {
        let key: Key = (spec.server.clone(), spec.auth.clone());
        let session = match self.session(&key, deadline).await {
            Ok(session) => session,
            Err(error) => return Outcome::err(error, 0),
        };
        if let Err(error) = session.renew_if_stale(&self.inner.http, deadline).await {
            return Outcome::err(error, 0);
        }
        let what = format!("{} tool `{}`", session.label, spec.tool);
        let mut sent = 0_u32;
        let mut reauthenticated = false;
        loop {
            let mut params = CallToolRequestParams::new(spec.tool.clone());
            if let Some(arguments) = &arguments {
                params = params.with_arguments(arguments.clone());
            }
            let call = session.client.peer().call_tool(params);
            let failure = match tokio::time::timeout_at(deadline, call).await {
                Ok(Ok(result)) => {
                    return Outcome {
                        result: classify::output(result, &what),
                        requests_sent: sent + 1,
                    };
                }
                Ok(Err(error)) => classify::request_error(&error, &what),
                Err(_) => {
                    let message = format!(
                        "{what}: timed out after the call was sent; the server may have processed it"
                    );
                    return Outcome::err(Error::unknown(message), sent + 1);
                }
            };
            let Failure {
                error,
                sent: left,
                discard,
                challenge,
            } = failure;
            sent += u32::from(left);
            if discard {
                self.discard(&key, &session).await;
            }
            match challenge {
                Some(challenge) if !reauthenticated && session.can_reauthenticate() => {
                    reauthenticated = true;
                    match session
                        .reauthenticate(&self.inner.http, &challenge, deadline)
                        .await
                    {
                        Ok(()) => continue,
                        Err(token_error) => {
                            // A call already left (and was refused): nothing of it was
                            // processed, but it did count, so this is not `NotSent`.
                            let kind = match token_error.kind {
                                crate::ErrorKind::NotSent => {
                                    crate::ErrorKind::Transient { retry_after: None }
                                }
                                kind => kind,
                            };
                            let message = format!(
                                "{what}: re-authentication after a {challenge:?} challenge failed: {}",
                                token_error.message
                            );
                            return Outcome::err(Error::new(kind, message), sent);
                        }
                    }
                }
                Some(_) if reauthenticated => {
                    let message = format!(
                        "{} (still refused after one re-authentication)",
                        error.message
                    );
                    return Outcome::err(Error::new(error.kind, message), sent);
                }
                _ => return Outcome::err(error, sent),
            }
        }
    }

    /// The live session for `key`, started if there is none or the last one died.
    async fn session(&self, key: &Key, deadline: Instant) -> Result<Arc<Session>, Error> {
        let label = key.0.label();
        let slot: Slot = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        let mut guard = tokio::time::timeout_at(deadline, slot.lock())
            .await
            .map_err(|_| {
                Error::not_sent(format!(
                    "{label}: timed out waiting for the session to start"
                ))
            })?;
        if let Some(session) = guard.as_ref() {
            if session.is_alive() {
                return Ok(session.clone());
            }
            tracing::debug!(target: "flow_adapters::mcp", server = %label, "session ended; starting a new one");
        }
        *guard = None;
        let started =
            tokio::time::timeout_at(deadline, Session::start(key, &self.inner.http, deadline))
                .await;
        let session = match started {
            Ok(result) => Arc::new(result?),
            Err(_) => {
                return Err(Error::not_sent(format!(
                    "{label}: timed out starting the session (no answer to initialize); the tool call was not sent"
                )));
            }
        };
        *guard = Some(session.clone());
        Ok(session)
    }

    /// Forgets `session` if it is still the one in its slot.
    async fn discard(&self, key: &Key, session: &Arc<Session>) {
        let slot = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned();
        if let Some(slot) = slot {
            let mut guard = slot.lock().await;
            if guard.as_ref().is_some_and(|s| Arc::ptr_eq(s, session)) {
                *guard = None;
            }
        }
    }
}

/// One running rmcp client session.
struct Session {
    client: RunningService<RoleClient, ClientConfig>,
    /// A stdio server's process group, killed when the session is dropped.
    _group: Option<Group>,
    label: String,
    auth: Option<TokenState>,
    tools: OnceCell<HashMap<String, Annotations>>,
}

/// The OAuth state of a session that uses client credentials.
struct TokenState {
    slot: TokenSlot,
    credentials: Credentials,
    current: tokio::sync::Mutex<Token>,
}

impl Session {
    fn is_alive(&self) -> bool {
        !self.client.is_closed() && !self.client.peer().is_transport_closed()
    }

    fn can_reauthenticate(&self) -> bool {
        self.auth.is_some()
    }

    async fn renew_if_stale(&self, http: &reqwest::Client, deadline: Instant) -> Result<(), Error> {
        let Some(state) = &self.auth else {
            return Ok(());
        };
        let mut current = state.current.lock().await;
        if !current.is_stale(Instant::now()) {
            return Ok(());
        }
        let scope = current.scope.clone();
        let token = auth::fetch_token(http, &state.credentials, scope.as_deref(), deadline).await?;
        state.slot.set(token.access_token.clone());
        *current = token;
        Ok(())
    }

    /// Fetches a token covering the current and the challenged scopes.
    async fn reauthenticate(
        &self,
        http: &reqwest::Client,
        challenge: &str,
        deadline: Instant,
    ) -> Result<(), Error> {
        let Some(state) = &self.auth else {
            return Err(Error::permanent(
                "no client credentials to re-authenticate with",
            ));
        };
        let mut current = state.current.lock().await;
        let challenged = auth::challenge_scope(challenge);
        let scope = auth::scope_union(current.scope.as_deref(), challenged.as_deref());
        tracing::debug!(target: "flow_adapters::mcp", server = %self.label, scope = ?scope, "re-authenticating after a challenge");
        let token = auth::fetch_token(http, &state.credentials, scope.as_deref(), deadline).await?;
        state.slot.set(token.access_token.clone());
        *current = token;
        Ok(())
    }

    async fn start(key: &Key, http: &reqwest::Client, deadline: Instant) -> Result<Session, Error> {
        let (server, auth) = key;
        let label = server.label();
        match server {
            ServerSpec::Stdio { command, env, cwd } => {
                Self::start_stdio(label, command, env, cwd.as_deref()).await
            }
            ServerSpec::Http { url, headers } => {
                Self::start_http(label, url, headers, auth, http, deadline).await
            }
        }
    }

    async fn start_stdio(
        label: String,
        argv: &[String],
        env: &[(String, String)],
        cwd: Option<&std::path::Path>,
    ) -> Result<Session, Error> {
        let Some(program) = argv.first() else {
            return Err(Error::permanent(format!(
                "{label}: the server command is empty"
            )));
        };
        let mut command = tokio::process::Command::new(program);
        command.args(&argv[1..]).env_clear();
        for name in DEFAULT_ENV_ALLOW {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        command.envs(env.iter().map(|(k, v)| (k, v)));
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        let mut wrapped = CommandWrap::from(command);
        wrapped.wrap(ProcessGroup::leader());
        let (transport, stderr) = TokioChildProcess::builder(wrapped)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::not_sent(format!("{label}: cannot start `{program}`: {e}")))?;
        // From here on, dropping `group` (a failed or timed-out start, or the session's
        // end) kills the server and everything it started.
        let group = Group::of(transport.id());
        let stderr_tail = Arc::new(Mutex::new(Vec::new()));
        let drain = stderr.map(|pipe| {
            let keep = stderr_tail.clone();
            let label = label.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(target: "flow_adapters::mcp", server = %label, "stderr: {line}");
                    let mut kept = keep.lock().unwrap_or_else(|e| e.into_inner());
                    kept.extend_from_slice(line.as_bytes());
                    kept.push(b'\n');
                    let excess = kept.len().saturating_sub(STDERR_TAIL_BYTES);
                    kept.drain(..excess);
                }
            })
        });
        match client_info().serve(transport).await {
            Ok(client) => Ok(Session {
                client,
                _group: Some(group),
                label,
                auth: None,
                tools: OnceCell::new(),
            }),
            Err(e) => {
                if let Some(drain) = drain {
                    let _ = tokio::time::timeout(STDERR_GRACE, drain).await;
                }
                let (mut error, _) = classify::initialize_error(&e, &label);
                let stderr = tail(
                    &stderr_tail.lock().unwrap_or_else(|e| e.into_inner()),
                    STDERR_TAIL_BYTES,
                );
                if !stderr.is_empty() {
                    error.message.push_str("; stderr: ");
                    error.message.push_str(&stderr);
                }
                Err(error)
            }
        }
    }

    async fn start_http(
        label: String,
        url: &str,
        headers: &[(String, String)],
        auth: &Auth,
        http: &reqwest::Client,
        deadline: Instant,
    ) -> Result<Session, Error> {
        let mut custom = HashMap::new();
        for (name, value) in headers {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| Error::permanent(format!("{label}: invalid header name {name:?}")))?;
            let value = HeaderValue::from_str(value).map_err(|_| {
                Error::permanent(format!("{label}: invalid value for header `{name}`"))
            })?;
            custom.insert(header, value);
        }
        let slot = TokenSlot::default();
        let mut state = None;
        match auth {
            Auth::None => {}
            Auth::Bearer(token) => slot.set(token.clone()),
            Auth::ClientCredentials {
                token_url,
                client_id,
                client_secret,
                scope,
            } => {
                let credentials = Credentials {
                    token_url: token_url.clone(),
                    client_id: client_id.clone(),
                    client_secret: client_secret.clone(),
                };
                let token =
                    auth::fetch_token(http, &credentials, scope.as_deref(), deadline).await?;
                slot.set(token.access_token.clone());
                state = Some(TokenState {
                    slot: slot.clone(),
                    credentials,
                    current: tokio::sync::Mutex::new(token),
                });
            }
        }
        let connect = || {
            let config = StreamableHttpClientTransportConfig::with_uri(url)
                .custom_headers(custom.clone())
                // A silent re-initialize-and-resend would be a hidden, uncounted re-send.
                .reinit_on_expired_session(false);
            let client = AuthedClient {
                inner: http.clone(),
                token: slot.clone(),
            };
            client_info().serve(StreamableHttpClientTransport::with_client(client, config))
        };
        let client = match connect().await {
            Ok(client) => client,
            Err(e) => {
                let (error, challenge) = classify::initialize_error(&e, &label);
                let (Some(challenge), Some(state)) = (challenge, state.as_ref()) else {
                    return Err(error);
                };
                // Initializing is not the tool call: re-authenticating here costs no
                // counted request.
                let mut current = state.current.lock().await;
                let challenged = auth::challenge_scope(&challenge);
                let scope = auth::scope_union(current.scope.as_deref(), challenged.as_deref());
                let token =
                    auth::fetch_token(http, &state.credentials, scope.as_deref(), deadline).await?;
                slot.set(token.access_token.clone());
                *current = token;
                drop(current);
                connect()
                    .await
                    .map_err(|e| classify::initialize_error(&e, &label).0)?
            }
        };
        Ok(Session {
            client,
            _group: None,
            label,
            auth: state,
            tools: OnceCell::new(),
        })
    }
}

fn client_info() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("flow", env!("CARGO_PKG_VERSION")),
    )
}
