//! Tools on MCP servers, through one rmcp client session per server.
//!
//! # Sessions
//! A [`Pool`] keeps one session per (server, credentials) and reuses it for every call
//! in the process: a stdio server is started once, an HTTP server is initialized once.
//! A session whose child exited or whose transport closed is replaced on the next call.
//! Starting a session counts against the call's timeout; failing to start it (spawn
//! failure, the child exiting, no `initialize` answer in time, connection refused) is
//! `NotSent`, since the tool call itself never left.
//!
//! Stdio servers run as the leader of their own process group with a cleared
//! environment (the command adapter's default allow-list plus the declared `env`);
//! their stderr is logged at `debug` (target `flow_adapters::mcp`) and its tail is
//! quoted when the server fails to start.
//!
//! # Calls and classification
//! `tools/call` with `Call::args` (an object, or `null` for none) under `Call::timeout`:
//!
//! | what happened | result |
//! |---|---|
//! | result with `structuredContent` | that value |
//! | result with text content | see [`McpTool`]: JSON when the text is JSON |
//! | `isError: true` | `Permanent` carrying the tool's text |
//! | JSON-RPC error (unknown tool, bad params, internal error) | `Permanent` |
//! | HTTP 429/5xx | `Transient` (`Retry-After` honoured) |
//! | other HTTP 4xx | `Permanent` |
//! | HTTP 404 for the session (server restarted) | `Transient`; the next call starts a new session (rmcp's silent re-initialize-and-resend is turned off) |
//! | timeout after the call was sent (flow then sends `notifications/cancelled`), transport died mid-call (child exited, connection lost) | `Unknown` |
//! | connection refused before the call was written | `NotSent` |
//! | `input_required` (2026-07-28) | answered (`call.rs`) and sent again with the answers, each round a request; sampling asked for → `Permanent` |
//! | a task (`resultType: "task"`) | reported at once ([`crate::Report::Task`]), then waited for with `tasks/get`; see `task.rs` |
//!
//! # Tasks
//! The client declares the tasks extension. A task's id is reported the moment it
//! arrives, and `tasks/get` is asked until the task ends or the attempt's deadline: a
//! task still working then comes back `Unknown` *with* [`Outcome::task`] set, which the
//! engine does not treat as in doubt but collects later through [`Tool::collect`]
//! (`McpTool::collect`, `Pool::collect`), without calling the tool again.
//!
//! # Elicitation
//! The client declares the `elicitation` capability (form mode) and answers each
//! `elicitation/create` with the tool's [`Elicitation`] policy (`elicit.rs`); URL-mode
//! requests are declined. Each question and decision is logged at `info` and reported
//! to the call that was asked ([`crate::Report::Elicited`]; `elicit.rs` says how the call
//! is found).
//!
//! # Protocol versions
//! 2025-06-18, 2025-11-25 and 2026-07-28 (and 2025-03-26 from older servers); see `version.rs` for the negotiation. A server
//! on any other revision is `Permanent`, naming both sides.
//!
//! # Authorization (HTTP servers)
//! [`Auth::Bearer`] sends `Authorization: Bearer <token>`. [`Auth::ClientCredentials`]
//! with a `token_url` fetches a token there (OAuth `client_credentials`) before the
//! session starts; without one, the first 401's `WWW-Authenticate` starts discovery
//! (`discovery.rs`: RFC 9728, then RFC 8414 / OpenID) and the token comes from the
//! discovered endpoint, every URL checked against [`Pool::restrict_egress`]'s list.
//! Every token request carries `resource` (RFC 8707); the client authenticates as
//! [`ClientAuth`] says. Tokens are renewed 30 s before they expire.
//! When a call is answered 401, or 403 `insufficient_scope`, with a
//! `WWW-Authenticate: Bearer … scope="…"` challenge, a token for the union of the
//! current and the challenged scopes is fetched and the call re-sent **at most once**,
//! on the same session; both requests count in `requests_sent` (2). A second challenge,
//! or a challenge without client credentials, is `Permanent`.
//!
//! rmcp logs at `ERROR` for conditions flow classifies and reports itself: a 401 while
//! initializing ("worker quit with fatal … AuthRequired", target
//! `rmcp::transport::worker`) and a session that could not be deleted because the
//! server is gone (target `rmcp::transport::streamable_http_client`). An embedder's log
//! filter should turn those two targets off
//! (`rmcp::transport::worker=off,rmcp::transport::streamable_http_client=off`), since no
//! level short of `off` hides an `ERROR`.
//!
//! # Side effect class
//! `read_only_override` when set; else `ReadOnly` when the tool's annotations say
//! `readOnlyHint` or `idempotentHint` (fetched with [`Pool::annotations`]); else `None`.

mod auth;
mod call;
mod classify;
mod connect;
mod discovery;
mod elicit;
mod jwt;
mod listing;
mod pool;
mod session_auth;
mod stdio;
mod task;
mod version;

use std::path::PathBuf;

use serde_json::Value;
use tokio::time::Instant;

use crate::{BoxFuture, Call, Error, Outcome, Reports, SideEffect, Tool};
pub use connect::{Granted, OAuth, OAuthClient, SignIn, TokenFailure};
pub use elicit::Elicitation;
pub use pool::Pool;
pub use session_auth::ConnectionTokens;

/// How to reach an MCP server.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum ServerSpec {
    /// A child process speaking MCP on stdin/stdout.
    Stdio {
        /// Program and arguments (no shell).
        command: Vec<String>,
        /// Declared environment (values rendered, secrets included).
        env: Vec<(String, String)>,
        /// Working directory; flow's own when `None`.
        cwd: Option<PathBuf>,
    },
    /// A streamable-HTTP endpoint.
    Http {
        /// The MCP endpoint, e.g. `http://127.0.0.1:9000/mcp`.
        url: String,
        /// Extra headers on every request (values may carry secrets; never logged).
        headers: Vec<(String, String)>,
    },
}

impl ServerSpec {
    /// A short name for messages: the program, or the URL without query.
    pub(crate) fn label(&self) -> String {
        match self {
            ServerSpec::Stdio { command, .. } => format!(
                "MCP server `{}`",
                command.first().map(String::as_str).unwrap_or("")
            ),
            ServerSpec::Http { url, .. } => format!("MCP server {}", auth::without_query(url)),
        }
    }
}

impl std::fmt::Debug for ServerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerSpec::Stdio { command, env, cwd } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("env", &crate::redact::Pairs(env))
                .field("cwd", cwd)
                .finish(),
            ServerSpec::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", &auth::without_query(url))
                .field("headers", &crate::redact::Pairs(headers))
                .finish(),
        }
    }
}

/// Credentials for an HTTP MCP server (ignored for stdio servers).
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Auth {
    /// No `Authorization` header.
    None,
    /// A fixed bearer token.
    Bearer(String),
    /// A connection's token (`flow connect NAME`), lent by the pool's
    /// [`ConnectionTokens`] and refreshed for every worker at once.
    Connection(String),
    /// OAuth 2 `client_credentials` grant, with the token endpoint given or found by
    /// discovery from the server's 401 (see the module docs).
    ClientCredentials {
        /// The authorization server's token endpoint; `None` discovers it.
        token_url: Option<String>,
        /// Client id (pre-registered with the authorization server).
        client_id: String,
        /// How the client proves who it is at the token endpoint.
        client_auth: ClientAuth,
        /// Scope to ask for first (space-separated), if any.
        scope: Option<String>,
    },
}

/// OAuth client authentication at the token endpoint (RFC 6749 §2.3, RFC 7523).
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum ClientAuth {
    /// A client secret: `client_secret_basic`, or `client_secret_post` when the
    /// authorization server's metadata lists post and not basic.
    Secret(String),
    /// A client secret, always sent in the form (`client_secret_post`).
    SecretPost(String),
    /// A public client: only `client_id` in the form (`none`).
    None,
    /// `private_key_jwt`: an assertion signed with this PKCS#8 PEM key.
    PrivateKeyJwt {
        /// The private key, PEM.
        key_pem: String,
        /// `ES256` (P-256) or `RS256`.
        algorithm: String,
    },
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientAuth::Secret(_) => f.write_str("Secret(\"…\")"),
            ClientAuth::SecretPost(_) => f.write_str("SecretPost(\"…\")"),
            ClientAuth::None => f.write_str("None"),
            ClientAuth::PrivateKeyJwt { algorithm, .. } => f
                .debug_struct("PrivateKeyJwt")
                .field("key_pem", &crate::redact::Hidden)
                .field("algorithm", algorithm)
                .finish(),
        }
    }
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::None => f.write_str("None"),
            Auth::Bearer(_) => f.write_str("Bearer(\"…\")"),
            Auth::Connection(name) => f.debug_tuple("Connection").field(name).finish(),
            Auth::ClientCredentials {
                token_url,
                client_id,
                client_auth,
                scope,
            } => f
                .debug_struct("ClientCredentials")
                .field("token_url", &token_url.as_deref().map(auth::without_query))
                .field("client_id", client_id)
                .field("client_auth", client_auth)
                .field("scope", scope)
                .finish(),
        }
    }
}

/// An MCP tool as declared by a workflow, with values already rendered.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Spec {
    /// Where the server is.
    pub server: ServerSpec,
    /// The tool's name on that server.
    pub tool: String,
    /// Credentials (HTTP servers).
    pub auth: Auth,
    /// The workflow's `read_only:`; overrides the tool's annotations.
    pub read_only_override: Option<bool>,
    /// How the server's elicitation requests during this tool's calls are answered.
    pub elicitation: Elicitation,
    /// Whether calls carry `_meta` — the call's idempotency key
    /// (`io.flow/idempotency-key`, so a server that dedupes, does) and the trace
    /// context. Off for a server that refuses `_meta` keys it does not know (the
    /// workflow's `propagate_trace: false`).
    pub meta: bool,
    /// Behaviour hints fixed by the caller (a workflow's `annotations:`; flow's MCP
    /// proxy pins them): used instead of the server's listing, which is then not asked.
    pub pinned: Option<Annotations>,
}

/// A tool's behaviour hints from `tools/list`, with MCP's defaults applied when the
/// server gives none (read-only false, idempotent false, destructive true).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Annotations {
    /// `readOnlyHint`: the tool does not modify its environment.
    pub read_only: bool,
    /// `idempotentHint`: repeating a call with the same arguments has no further effect.
    pub idempotent: bool,
    /// `destructiveHint`: the tool may destroy data (meaningful when not read-only).
    pub destructive: bool,
}

impl Annotations {
    /// The hints as `tools/list` gives them (MCP's defaults for those left out).
    pub fn from_rmcp(annotations: Option<&rmcp::model::ToolAnnotations>) -> Self {
        Annotations {
            read_only: annotations.and_then(|a| a.read_only_hint).unwrap_or(false),
            idempotent: annotations.and_then(|a| a.idempotent_hint).unwrap_or(false),
            destructive: annotations.and_then(|a| a.destructive_hint).unwrap_or(true),
        }
    }
}

/// Calls one tool of one server through a [`Pool`].
///
/// Text results: one text block is returned as JSON when it parses as JSON, else as a
/// string; several text blocks become an array (each parsed the same way).
#[derive(Debug, Clone)]
pub struct McpTool {
    pool: Pool,
    spec: Spec,
    annotations: Option<Annotations>,
}

impl McpTool {
    /// A tool for `spec`; its side-effect class uses annotations already fetched by
    /// [`Pool::annotations`] for this server and tool, if any.
    pub fn new(pool: &Pool, spec: Spec) -> Self {
        pool.tool(spec)
    }

    /// The same tool with these annotations (e.g. from the engine's own cache).
    pub fn with_annotations(mut self, annotations: Option<Annotations>) -> Self {
        self.annotations = annotations;
        self
    }

    /// The annotations the side-effect class is computed from.
    pub fn annotations(&self) -> Option<Annotations> {
        self.annotations
    }

    async fn run(&self, call: Call) -> Outcome {
        if call.timeout.is_zero() {
            return Outcome::err(Error::permanent("mcp: the timeout must be positive"), 0);
        }
        let arguments = match call.args {
            Value::Null => None,
            Value::Object(map) => Some(map),
            other => {
                let message = format!(
                    "mcp: the arguments of tool `{}` must be an object, got {other}",
                    self.spec.tool
                );
                return Outcome::err(Error::permanent(message), 0);
            }
        };
        let deadline = Instant::now() + call.timeout;
        self.pool
            .call(
                &self.spec,
                arguments,
                deadline,
                call::Around {
                    reports: call.reports.as_ref(),
                    trace: call.trace.as_ref(),
                    fence: &call.fence,
                    key: &call.idempotency_key,
                },
            )
            .await
    }

    async fn collect_task(&self, call: Call, task_id: String) -> Outcome {
        if call.timeout.is_zero() {
            return Outcome::err(Error::permanent("mcp: the timeout must be positive"), 0);
        }
        let deadline = Instant::now() + call.timeout;
        self.pool
            .collect(&self.spec, &task_id, deadline, call.reports.as_ref())
            .await
    }
}

impl Tool for McpTool {
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome> {
        Box::pin(self.run(call))
    }

    fn collect(&self, call: Call, task_id: &str) -> BoxFuture<'_, Outcome> {
        Box::pin(self.collect_task(call, task_id.to_owned()))
    }

    fn side_effect(&self) -> SideEffect {
        match self.spec.read_only_override {
            Some(true) => SideEffect::ReadOnly,
            Some(false) => SideEffect::NotIdempotent,
            None => match self.annotations {
                Some(a) if a.read_only || a.idempotent => SideEffect::ReadOnly,
                _ => SideEffect::NotIdempotent,
            },
        }
    }
}

impl Pool {
    /// Asks for the end of task `task_id`, which an earlier call of `spec` started,
    /// until `deadline`, without calling the tool again. A session that cannot start
    /// means flow cannot ask: `Unknown`, without the task (in doubt).
    pub(super) async fn collect(
        &self,
        spec: &Spec,
        task_id: &str,
        deadline: Instant,
        reports: Option<&Reports>,
    ) -> Outcome {
        let key = Pool::key(spec);
        let session = match self.session(&key, deadline).await {
            Ok(session) => session,
            Err(error) => {
                let message = format!("cannot ask about task {task_id}: {}", error.message);
                return Outcome::err(Error::unknown(message), 0);
            }
        };
        if let Err(error) = session.renew_if_stale(self.http(), deadline).await {
            let message = format!("cannot ask about task {task_id}: {}", error.message);
            return Outcome::err(Error::unknown(message), 0);
        }
        let what = format!("{} tool `{}`", session.label, spec.tool);
        let wait = task::Wait {
            peer: session.client.peer(),
            policy: &spec.elicitation,
            task_id,
            poll_ms: None,
            deadline,
            what: &what,
            reports,
            sent: 0,
        };
        self.wait(&key, &session, wait).await
    }
}
