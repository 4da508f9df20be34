//! One rmcp client session per MCP server, reused across calls and restarted when dead.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use process_wrap::tokio::{CommandWrap, ProcessGroup};
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::JsonObject;
use rmcp::service::ClientServiceExt;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::auth::{AuthedClient, SessionSeen, TokenSlot};
use super::call::{self, Around, CallEnd};
use super::classify::{self, Failure};
use super::elicit::{Elicitation, Handler};
use super::session_auth::{self, ConnectionTokens, SessionAuth, StartCx};
use super::stdio::{Capped, MAX_MESSAGE_BYTES};
use super::task::{self, Wait};
use super::version::{self, Handshake};
use super::{Annotations, Auth, McpTool, ServerSpec, Spec};
use crate::command::DEFAULT_ENV_ALLOW;
use crate::egress::AllowList;
use crate::error::tail;
use crate::process::Group;
use crate::{Error, Outcome, Report};

/// Sessions are keyed by server, credentials and elicitation policy: two workflows
/// using the same server with different tokens must not share a session, and the
/// policy belongs to the session's client handler.
pub(super) type Key = (ServerSpec, Auth, Elicitation);

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
    http: crate::lazy_client::LazyClient,
    /// Hosts discovered authorization URLs may reach (`None`: any).
    egress: Mutex<Option<AllowList>>,
    /// Where connections' tokens come from (`None`: this process has none).
    connections: Mutex<Option<Arc<dyn ConnectionTokens>>>,
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
        let http = crate::lazy_client::LazyClient::new("MCP HTTP", || {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(CONNECT_TIMEOUT)
                .user_agent(concat!("flow/", env!("CARGO_PKG_VERSION")))
        });
        Ok(Pool {
            inner: Arc::new(Inner {
                slots: Mutex::new(HashMap::new()),
                annotations: Mutex::new(HashMap::new()),
                http,
                egress: Mutex::new(None),
                connections: Mutex::new(None),
            }),
        })
    }

    /// Restricts the URLs authorization discovery may fetch (protected-resource and
    /// authorization-server metadata, discovered token endpoints) to the operator's
    /// egress allow-list; `None` allows any host. The engine checks the MCP URL and an
    /// explicit `token_url` itself; only the pool sees the discovered ones.
    pub fn restrict_egress(&self, allow: Option<AllowList>) {
        *self.inner.egress.lock().unwrap_or_else(|e| e.into_inner()) = allow;
    }

    /// Lends connections' tokens to sessions whose tools say `auth: { connection }`.
    pub fn use_connections(&self, source: Arc<dyn ConnectionTokens>) {
        *self
            .inner
            .connections
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    fn connection_source(&self) -> Option<Arc<dyn ConnectionTokens>> {
        self.inner
            .connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn allow_list(&self) -> Option<AllowList> {
        self.inner
            .egress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A tool for `spec`, using annotations fetched earlier by [`Pool::annotations`].
    pub fn tool(&self, spec: Spec) -> McpTool {
        let key = (
            (
                spec.server.clone(),
                spec.auth.clone(),
                spec.elicitation.clone(),
            ),
            spec.tool.clone(),
        );
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
        let key = Self::key(spec);
        let session = self.session(&key, deadline).await?;
        let listed = session
            .tools
            .get_or_try_init(|| async {
                let tools = self.list_on(&key, &session, deadline).await?;
                Ok::<_, Error>(
                    tools
                        .iter()
                        .map(|t| {
                            (
                                t.name.to_string(),
                                Annotations::from_rmcp(t.annotations.as_ref()),
                            )
                        })
                        .collect::<HashMap<_, _>>(),
                )
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

    /// Performs one `tools/call` (and at most one re-send after an auth challenge),
    /// waiting for the task if the server answers with one (`task.rs`).
    pub(super) async fn call(
        &self,
        spec: &Spec,
        arguments: Option<JsonObject>,
        deadline: Instant,
        around: Around<'_>,
    ) -> Outcome {
        let key = Self::key(spec);
        let session = match self.session(&key, deadline).await {
            Ok(session) => session,
            Err(error) => return Outcome::err(error, 0),
        };
        let mut outcome = self
            .call_on(&key, &session, spec, arguments, deadline, around)
            .await;
        outcome.mcp_session = session.http_session.as_ref().and_then(SessionSeen::get);
        outcome
    }

    /// [`Pool::call`] on `session`: the `tools/call` rounds, a re-authentication after a
    /// challenge, a task waited for.
    async fn call_on(
        &self,
        key: &Key,
        session: &Arc<Session>,
        spec: &Spec,
        arguments: Option<JsonObject>,
        deadline: Instant,
        around: Around<'_>,
    ) -> Outcome {
        let Around {
            reports,
            trace,
            fence,
            key: idempotency_key,
        } = around;
        if let Err(error) = session.renew_if_stale(&self.inner.http, deadline).await {
            return Outcome::err(error, 0);
        }
        let what = format!("{} tool `{}`", session.label, spec.tool);
        let (mut sent, mut reauthenticated) = (0_u32, false);
        // The answers and state of the last `input_required` round, sent with the next.
        let (mut answered, mut rounds) = (call::Answered::default(), 0_u32);
        loop {
            let params = call::params(
                &spec.tool,
                arguments.as_ref(),
                std::mem::take(&mut answered),
                trace,
                spec.meta.then_some(idempotency_key),
            );
            let bearer = session.auth.as_ref().and_then(SessionAuth::bearer);
            // Checked before every round and re-send, and raced with it (`crate::fence`).
            if let Err(why) = fence.check() {
                return Outcome::err(Error::fenced(why, &what, sent), sent);
            }
            let end = call::call_tool(&session.client, &session.label, params, deadline, reports);
            let end = match fence.race(end).await {
                Ok(end) => end,
                Err(why) => return Outcome::err(Error::fenced_in_flight(why, &what), sent + 1),
            };
            let failure = match end {
                Ok(CallEnd::InputRequired(asked)) => {
                    sent += 1;
                    match call::next_round(&spec.elicitation, asked, reports, &mut rounds) {
                        Ok(next) => {
                            answered = next;
                            continue;
                        }
                        Err(why) => {
                            return Outcome::err(Error::permanent(format!("{what}: {why}")), sent);
                        }
                    }
                }
                Ok(CallEnd::Answered(result)) => {
                    return Outcome {
                        result: classify::output(result, &what),
                        requests_sent: sent + 1,
                        task: None,
                        mcp_session: None,
                        http_status: None,
                    };
                }
                Ok(CallEnd::Task(task)) => {
                    tracing::info!(target: "flow_adapters::mcp", server = %session.label, task = task.task_id, "the server started a task");
                    if let Some(reports) = reports {
                        reports.send(Report::Task(task.task_id.clone()));
                    }
                    let wait = Wait {
                        peer: session.client.peer(),
                        policy: &spec.elicitation,
                        task_id: &task.task_id,
                        poll_ms: task.poll_interval_ms,
                        deadline,
                        what: &what,
                        reports,
                        sent: sent + 1,
                    };
                    return self.wait(key, session, wait).await;
                }
                Ok(CallEnd::TimedOut { cancelled }) => {
                    return Outcome::err(call::timed_out(&what, cancelled), sent + 1);
                }
                Err(_) if session.tripped_limit() => classify::oversized(&what, MAX_MESSAGE_BYTES),
                Err(error) => classify::request_error(&error, &what),
            };
            let Failure {
                error,
                sent: left,
                discard,
                challenge,
            } = failure;
            sent += u32::from(left);
            if discard {
                self.discard(key, session).await;
            }
            match challenge {
                Some(challenge) if !reauthenticated && session.can_reauthenticate() => {
                    reauthenticated = true;
                    match session
                        .reauthenticate(&self.inner.http, &challenge, bearer.as_deref(), deadline)
                        .await
                    {
                        Ok(()) => continue,
                        Err(e) => {
                            return Outcome::err(
                                reauth_failed(session, e, &what, &challenge),
                                sent,
                            );
                        }
                    }
                }
                Some(challenge) if reauthenticated => {
                    return Outcome::err(refused_again(session, error, &challenge).await, sent);
                }
                _ => return Outcome::err(error, sent),
            }
        }
    }

    /// Waits for a task on `session`, replacing the session if its transport failed.
    pub(super) async fn wait(&self, key: &Key, session: &Arc<Session>, wait: Wait<'_>) -> Outcome {
        let ended = task::wait(wait).await;
        if ended.discard {
            self.discard(key, session).await;
        }
        ended.outcome
    }

    pub(super) fn key(spec: &Spec) -> Key {
        (
            spec.server.clone(),
            spec.auth.clone(),
            spec.elicitation.clone(),
        )
    }

    /// Builds the HTTP clients now if nothing has (see `http::Client::warm`): the
    /// sessions' and the connections' refresh client.
    pub fn warm(&self) -> Result<(), Error> {
        if let Some(source) = self.connection_source() {
            source.warm();
        }
        self.inner.http.get().map(|_| ())
    }

    /// The HTTP client sessions and token requests use (built at the first use).
    pub(super) fn http(&self) -> &crate::lazy_client::LazyClient {
        &self.inner.http
    }

    /// The live session for `key`, started if there is none or the last one died.
    pub(super) async fn session(
        &self,
        key: &Key,
        deadline: Instant,
    ) -> Result<Arc<Session>, Error> {
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
        let cx = StartCx {
            http: &self.inner.http,
            allow: self.allow_list(),
            connections: self.connection_source(),
            deadline,
        };
        let started = tokio::time::timeout_at(deadline, Session::start(key, &cx)).await;
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
    pub(super) async fn discard(&self, key: &Key, session: &Arc<Session>) {
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

/// The error of a call whose one re-authentication failed. A call already left (and was
/// refused): nothing of it was processed, but it did count, so a token endpoint's
/// `NotSent` becomes transient — except for a connection, whose errors say what a
/// person must do and are not sent.
fn reauth_failed(session: &Session, token_error: Error, what: &str, challenge: &str) -> Error {
    if session.uses_connection() {
        return token_error;
    }
    let kind = match token_error.kind {
        crate::FailureKind::NotSent => crate::FailureKind::Transient { retry_after: None },
        kind => kind,
    };
    let message = format!(
        "{what}: re-authentication after a {challenge:?} challenge failed: {}",
        token_error.message
    );
    Error::new(kind, message)
}

/// The error of a call refused again after its one re-authentication. A connection's
/// refusal is answered by a person (`flow connect`, its wanted scope recorded), and
/// nothing of the refused call was processed.
async fn refused_again(session: &Session, error: Error, challenge: &str) -> Error {
    if let Some(auth) = &session.auth {
        auth.record_refusal(challenge).await;
    }
    if let Some(name) = session.auth.as_ref().and_then(SessionAuth::connection) {
        return Error::not_sent(format!(
            "{} (still refused with a refreshed token of connection `{name}`: run `flow connect {name}`)",
            error.message
        ));
    }
    let message = format!(
        "{} (still refused after one re-authentication)",
        error.message
    );
    Error::new(error.kind, message)
}

/// One running rmcp client session.
pub(super) struct Session {
    pub(super) client: RunningService<RoleClient, Handler>,
    /// A stdio server's process group, killed when the session is dropped.
    _group: Option<Group>,
    /// A stdio server's process (kept so that it is reaped, not left a zombie).
    _child: Option<Box<dyn process_wrap::tokio::ChildWrapper>>,
    /// Set when a stdio server's answer tripped [`MAX_MESSAGE_BYTES`] (see `stdio.rs`).
    oversized: Option<Arc<AtomicBool>>,
    pub(super) label: String,
    auth: Option<SessionAuth>,
    tools: OnceCell<HashMap<String, Annotations>>,
    /// A Streamable HTTP session's id, once the server gave one.
    http_session: Option<SessionSeen>,
}

impl Session {
    /// Whether this (stdio) session's last answer was over [`MAX_MESSAGE_BYTES`]: the
    /// server processed the call; the stream was closed at that answer.
    fn tripped_limit(&self) -> bool {
        self.oversized
            .as_ref()
            .is_some_and(|o| o.load(Ordering::Acquire))
    }

    fn can_reauthenticate(&self) -> bool {
        self.auth.is_some()
    }

    /// Whether the session's token is a connection's: its errors keep their kind (a
    /// connection that needs a sign-in is not sent, not transient).
    fn uses_connection(&self) -> bool {
        self.auth
            .as_ref()
            .and_then(SessionAuth::connection)
            .is_some()
    }

    /// Renews the token before a call when it is about to expire.
    pub(super) async fn renew_if_stale(
        &self,
        http: &crate::lazy_client::LazyClient,
        deadline: Instant,
    ) -> Result<(), Error> {
        match &self.auth {
            None => Ok(()),
            Some(auth) => auth.renew_if_stale(http, deadline).await,
        }
    }

    /// Answers a challenge: a token covering the current and the challenged scopes.
    async fn reauthenticate(
        &self,
        http: &crate::lazy_client::LazyClient,
        challenge: &str,
        refused: Option<&str>,
        deadline: Instant,
    ) -> Result<(), Error> {
        tracing::debug!(target: "flow_adapters::mcp", server = %self.label, "re-authenticating after a challenge");
        match &self.auth {
            None => Err(Error::permanent(
                "no client credentials to re-authenticate with",
            )),
            Some(auth) => {
                auth.reauthenticate(http, challenge, refused, deadline)
                    .await
            }
        }
    }

    fn is_alive(&self) -> bool {
        !self.client.is_closed() && !self.client.peer().is_transport_closed()
    }

    /// Starts a session with `initialize`, or with `server/discover` when the server
    /// refuses `initialize` for its version (see [`version`]).
    async fn start(key: &Key, cx: &StartCx<'_>) -> Result<Session, Error> {
        let (server, auth, policy) = key;
        let label = server.label();
        let mut handshake = Handshake::Initialize;
        loop {
            let tried = handshake;
            let started = match server {
                ServerSpec::Stdio { command, env, cwd } => {
                    Self::start_stdio(&label, command, env, cwd.as_deref(), policy, &mut handshake)
                        .await
                }
                ServerSpec::Http { url, headers } => {
                    Self::start_http(&label, url, headers, auth, policy, cx, &mut handshake).await
                }
            };
            match started {
                Err(_) if handshake != tried => {
                    tracing::debug!(target: "flow_adapters::mcp", server = %label, "initialize refused for its protocol version; trying server/discover");
                }
                Err(error) => return Err(error),
                Ok(session) => {
                    let negotiated = session
                        .client
                        .peer()
                        .peer_info()
                        .map(|info| info.protocol_version.clone());
                    if let Some(negotiated) = negotiated {
                        version::check(&negotiated, &label)?;
                    }
                    return Ok(session);
                }
            }
        }
    }

    async fn start_stdio(
        label: &str,
        argv: &[String],
        env: &[(String, String)],
        cwd: Option<&std::path::Path>,
        policy: &Elicitation,
        handshake: &mut Handshake,
    ) -> Result<Session, Error> {
        let label = label.to_string();
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
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut wrapped = CommandWrap::from(command);
        wrapped.wrap(ProcessGroup::leader());
        let cannot =
            |e: std::io::Error| Error::not_sent(format!("{label}: cannot start `{program}`: {e}"));
        let mut child = wrapped.spawn().map_err(cannot)?;
        // From here on, dropping `group` (a failed or timed-out start, or the session's
        // end) kills the server and everything it started.
        let group = Group::of(child.id());
        let pipes = (
            child.stdout().take(),
            child.stdin().take(),
            child.stderr().take(),
        );
        let (Some(stdout), Some(stdin), stderr) = pipes else {
            return Err(cannot(std::io::Error::other("its stdio pipes are missing")));
        };
        // stdout through the answer limit HTTP has too (see `stdio.rs`).
        let oversized = Arc::new(AtomicBool::new(false));
        let transport = AsyncRwTransport::new_client(Capped::new(stdout, oversized.clone()), stdin);
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
        match Handler::new(*handshake, policy, &label)
            .serve_with_lifecycle(transport, handshake.lifecycle())
            .await
        {
            Ok(client) => Ok(Session {
                client,
                _group: Some(group),
                _child: Some(child),
                oversized: Some(oversized),
                label,
                auth: None,
                tools: OnceCell::new(),
                http_session: None,
            }),
            Err(e) => {
                if let Some(next) = handshake.next_after(&e) {
                    *handshake = next;
                }
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
        label: &str,
        url: &str,
        headers: &[(String, String)],
        auth: &Auth,
        policy: &Elicitation,
        cx: &StartCx<'_>,
        handshake: &mut Handshake,
    ) -> Result<Session, Error> {
        let label = label.to_string();
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
        let mut state = session_auth::initial(auth, &slot, url, cx).await?;
        let tried = *handshake;
        let oversized = Arc::new(AtomicBool::new(false));
        let seen = SessionSeen::default();
        let http = cx.http.get()?;
        let connect = || {
            let config = StreamableHttpClientTransportConfig::with_uri(url)
                .custom_headers(custom.clone())
                // A silent re-initialize-and-resend would be a hidden, uncounted re-send.
                .reinit_on_expired_session(false);
            let client = AuthedClient {
                inner: http.clone(),
                token: slot.clone(),
                oversized: oversized.clone(),
                session: seen.clone(),
            };
            Handler::new(tried, policy, &label).serve_with_lifecycle(
                StreamableHttpClientTransport::with_client(client, config),
                tried.lifecycle(),
            )
        };
        let client = match connect().await {
            Ok(client) => client,
            Err(e) => {
                if let Some(next) = handshake.next_after(&e) {
                    *handshake = next;
                }
                let (error, challenge) = classify::initialize_error(&e, &label);
                let Some(challenge) = challenge else {
                    return Err(error);
                };
                // Initializing is not the tool call: authenticating here costs no
                // counted request.
                let answered =
                    session_auth::answer_initialize(&mut state, url, auth, &slot, &challenge, cx);
                if !answered.await? {
                    return Err(error);
                }
                connect()
                    .await
                    .map_err(|e| classify::initialize_error(&e, &label).0)?
            }
        };
        Ok(Session {
            client,
            _group: None,
            _child: None,
            oversized: Some(oversized),
            label,
            auth: state,
            tools: OnceCell::new(),
            http_session: Some(seen),
        })
    }
}
