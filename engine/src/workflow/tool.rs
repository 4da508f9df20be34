//! A workflow's tools: what each one calls (a function, a command, an HTTP endpoint, a
//! tool on an MCP server), how its downstream treats a repeated request, and how an
//! unknown outcome is asked about (`reconcile:`).

use std::time::Duration;

use super::diagnostic::Pos;
use super::expr::{TValue, Template};

/// How a tool's downstream deals with repeated requests (README: side-effect classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Idempotency {
    /// The downstream does not dedupe: an unknown outcome goes in doubt.
    #[default]
    None,
    /// The downstream dedupes on the idempotency-key header: re-sending with the same key
    /// is safe.
    Header,
}

/// A declared tool.
#[derive(Debug, Clone)]
pub struct ToolDecl {
    /// The tool's name, as used by `nodes.<id>.tool`.
    pub name: String,
    /// Where it is declared, for messages that concern the tool.
    pub pos: Pos,
    /// Kind-specific settings.
    pub kind: ToolKind,
    /// Free text for humans.
    pub description: Option<String>,
    /// Per-attempt timeout for calls of this tool.
    pub timeout: Option<Duration>,
    /// Requests per minute across all workers.
    pub rate_limit_per_minute: Option<u32>,
    /// Requests per second across all workers.
    pub rate_limit_per_second: Option<u32>,
    /// Requests per UTC day across all workers.
    pub quota_per_day: Option<u32>,
    /// `concurrency:` at most this many calls of the tool between the outbound mark and
    /// their outcome, across all workers (a call in doubt keeps its slot): a downstream
    /// that hangs can take no more than these, and the rest wait without a worker.
    pub concurrency: Option<u32>,
    /// Side-effect class declared by the workflow.
    pub idempotency: Idempotency,
    /// `read_only:` override (`None` = infer: GET is read-only, MCP annotations).
    pub read_only: Option<bool>,
    /// `reconcile:`: how to ask the downstream whether an in-doubt call took effect.
    pub reconcile: Option<Reconcile>,
}

impl ToolDecl {
    /// Whether the tool is under flow control (a rate limit, a quota or a concurrency
    /// limit): then a downstream's `Retry-After` holds off every worker's calls of it,
    /// not only the call that got it, and each call asks the ledger first.
    pub fn flow_controlled(&self) -> bool {
        self.rate_limit_per_minute.is_some()
            || self.rate_limit_per_second.is_some()
            || self.quota_per_day.is_some()
            || self.concurrency.is_some()
    }
}

/// Default `reconcile.after`: a `not_found` is trusted only this long after the request
/// left, so a request still in flight (or queued downstream) is not taken for lost.
pub const DEFAULT_RECONCILE_AFTER: Duration = Duration::from_secs(10);
/// Default `reconcile.max_probes`: then a human is asked.
pub const DEFAULT_MAX_PROBES: u32 = 5;
/// Default `reconcile.max_resends`: how many times reconciliation may re-send a call's
/// key on a trusted `not_found` before a human decides. A downstream whose status
/// endpoint lags its effect endpoint answers `not_found` for an effect it has (or is
/// about to have): each re-send could be executed, so the budget is small and counted
/// in the ledger, not per process.
pub const DEFAULT_MAX_RESENDS: u32 = 1;
/// Default `reconcile.interval`: the wait before the second probe (doubling after).
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// A tool's `reconcile:` block. When a call of the tool is in doubt (the request may or
/// may not have taken effect), flow asks the downstream with this read-only probe before
/// it pages a human; `gateway::reconcile` decides what the answer means.
#[derive(Debug, Clone)]
pub struct Reconcile {
    /// Where `reconcile:` is written.
    pub pos: Pos,
    /// The request that asks.
    pub probe: Probe,
    /// True when the answer says the effect took place (one expression).
    pub found: Template,
    /// True when the answer says it did not (one expression).
    pub not_found: Template,
    /// The node's output when found (default: the answer's body).
    pub output: Option<TValue>,
    /// How long after the request left a `not_found` is trusted.
    pub after: Duration,
    /// Probes with an unknown answer before a human is asked.
    pub max_probes: u32,
    /// Re-sends of the key on a trusted `not_found` before a human is asked (counted
    /// across processes and crashes: `call_probes` rows decided `resend`).
    pub max_resends: u32,
    /// Wait before the second probe; doubles, up to a minute.
    pub interval: Duration,
    /// Per-probe timeout (default: the tool's).
    pub timeout: Option<Duration>,
}

/// How a probe asks: always another request than the tool's own.
#[derive(Debug, Clone)]
pub enum Probe {
    /// An HTTP request (`reconcile.request`).
    Http {
        /// Upper-case method (default GET).
        method: String,
        /// URL template.
        url: Template,
        /// Header templates.
        headers: Vec<(String, Template)>,
        /// Query parameter templates.
        query: Vec<(String, Template)>,
    },
    /// Another tool of the same MCP server (`reconcile.tool`, `reconcile.with`).
    Mcp {
        /// The tool's name on the server.
        tool: String,
        /// Its arguments.
        with: TValue,
    },
    /// A local program (`reconcile.command`, `reconcile.env`); it gets the call as JSON
    /// on stdin.
    Command {
        /// Program and arguments.
        command: Vec<Template>,
        /// Declared environment.
        env: Vec<(String, Template)>,
    },
}

impl Reconcile {
    /// The templates of the probe request (they may read secrets).
    pub fn request_templates(&self) -> Vec<&Template> {
        match &self.probe {
            Probe::Http {
                url,
                headers,
                query,
                ..
            } => std::iter::once(url)
                .chain(headers.iter().map(|(_, t)| t))
                .chain(query.iter().map(|(_, t)| t))
                .collect(),
            Probe::Mcp { with, .. } => with.templates(),
            Probe::Command { command, env } => {
                command.iter().chain(env.iter().map(|(_, t)| t)).collect()
            }
        }
    }

    /// The templates that read the answer (stored and logged: no secrets).
    pub fn answer_templates(&self) -> Vec<&Template> {
        let mut out = vec![&self.found, &self.not_found];
        if let Some(o) = &self.output {
            out.extend(o.templates());
        }
        out
    }
}

/// The four tool kinds.
#[derive(Debug, Clone)]
pub enum ToolKind {
    /// An in-process function from the registry.
    Function {
        /// Registry name, e.g. `core.echo`.
        function: String,
    },
    /// A local program (argv, no shell).
    Command {
        /// Program and arguments (templated).
        command: Vec<Template>,
        /// Declared environment (templated; the only way secrets reach a command).
        env: Vec<(String, Template)>,
        /// Working directory.
        cwd: Option<String>,
        /// Inherited environment variable names (default: a small allow-list).
        env_allow: Option<Vec<String>>,
    },
    /// An HTTP endpoint.
    Http(HttpTool),
    /// A tool on an MCP server.
    Mcp(McpTool),
}

impl ToolKind {
    /// The `kind:` name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Function { .. } => "function",
            Self::Command { .. } => "command",
            Self::Http(_) => "http",
            Self::Mcp(_) => "mcp",
        }
    }
}

/// An `http` tool.
#[derive(Debug, Clone)]
pub struct HttpTool {
    /// Upper-case method.
    pub method: String,
    /// URL template.
    pub url: Template,
    /// Header templates.
    pub headers: Vec<(String, Template)>,
    /// Query parameter templates.
    pub query: Vec<(String, Template)>,
    /// Body template; `None` = the node's `with` for non-GET methods.
    pub body: Option<TValue>,
    /// Name of the idempotency-key header.
    pub idempotency_header: String,
    /// Whether 3xx responses are followed.
    pub follow_redirects: bool,
    /// Largest response body accepted.
    pub max_response_bytes: Option<u64>,
}

/// An `mcp` tool.
#[derive(Debug, Clone)]
pub struct McpTool {
    /// How to reach the server.
    pub server: McpServer,
    /// The tool's name on the server.
    pub tool: String,
    /// How to authenticate.
    pub auth: McpAuth,
    /// How the server's `elicitation/create` requests are answered (no one is there to ask).
    pub elicitation: McpElicitation,
    /// Whether calls carry `_meta`: the idempotency key (`io.flow/idempotency-key`) and
    /// the trace context (`traceparent` / `tracestate`); `propagate_trace: false` for a
    /// server that refuses `_meta` keys it does not know.
    pub propagate_trace: bool,
    /// `annotations:`: the tool's behaviour hints as reviewed, used instead of what the
    /// server lists (for side-effect classes and `[[policy.approvals]]`): a server that
    /// later changes its hints cannot loosen them. flow's MCP proxy sets them from a
    /// tool's pinned definition.
    pub annotations: Option<DeclaredAnnotations>,
}

/// An MCP tool's declared `annotations:` (MCP's defaults for a hint left out:
/// `read_only: false`, `destructive: true`, `idempotent: false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeclaredAnnotations {
    /// `readOnlyHint`.
    pub read_only: bool,
    /// `destructiveHint`.
    pub destructive: bool,
    /// `idempotentHint`.
    pub idempotent: bool,
}

/// A tool's `elicitation:` policy: an unattended run answers the server's questions in
/// advance. Accepted values are literals (no templates), so no secret can reach them.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum McpElicitation {
    /// `decline` (the default).
    #[default]
    Decline,
    /// `accept_defaults`: the requested schema's defaults.
    AcceptDefaults,
    /// `{ accept: { … } }`: these values.
    Accept(serde_json::Map<String, serde_json::Value>),
}

/// An MCP server.
#[derive(Debug, Clone)]
pub enum McpServer {
    /// A child process speaking MCP on stdio.
    Stdio {
        /// Program and arguments (templated).
        command: Vec<Template>,
        /// Environment (templated).
        env: Vec<(String, Template)>,
        /// Working directory.
        cwd: Option<String>,
    },
    /// A streamable-HTTP endpoint.
    Http {
        /// URL template.
        url: Template,
        /// Header templates.
        headers: Vec<(String, Template)>,
    },
}

/// MCP authentication.
#[derive(Debug, Clone, Default)]
pub enum McpAuth {
    /// None.
    #[default]
    None,
    /// A bearer token (usually `${{ secrets.NAME }}`).
    Bearer(Template),
    /// A connection's token (`flow connect NAME`; `[[connections]]` in `flow.toml`).
    Connection(String),
    /// OAuth 2 `client_credentials`.
    ClientCredentials {
        /// Token endpoint; `None` discovers it from the server's 401.
        token_url: Option<Template>,
        /// Client id.
        client_id: Template,
        /// Client secret (`client_secret_basic`/`_post`), if any.
        client_secret: Option<Template>,
        /// PKCS#8 PEM private key for `private_key_jwt`, if any.
        private_key: Option<Template>,
        /// `ES256` or `RS256` for `private_key_jwt` (default `ES256`).
        signing_algorithm: Option<String>,
        /// `client_secret_post` forces the secret into the form.
        token_endpoint_auth: Option<String>,
        /// Requested scope.
        scope: Option<String>,
    },
}

impl ToolKind {
    /// The templates that shape *what* the call asks for — an HTTP tool's URL, query
    /// and body, a command's argv — as opposed to the credentials it is sent with (HTTP
    /// headers, a command's environment, an MCP server's connection and auth). The
    /// secrets read here are bound into an approval's digest; credentials stay outside,
    /// so rotating a token does not void the approvals given for its requests.
    pub fn request_templates(&self) -> Vec<&Template> {
        match self {
            ToolKind::Function { .. } | ToolKind::Mcp(_) => Vec::new(),
            ToolKind::Command { command, .. } => command.iter().collect(),
            ToolKind::Http(h) => {
                let mut out = vec![&h.url];
                out.extend(h.query.iter().map(|(_, t)| t));
                if let Some(body) = &h.body {
                    out.extend(body.templates());
                }
                out
            }
        }
    }

    /// Every template in the tool spec (what validation checks and secrets are read from).
    pub fn templates(&self) -> Vec<&Template> {
        let mut out = Vec::new();
        match self {
            ToolKind::Function { .. } => {}
            ToolKind::Command { command, env, .. } => {
                out.extend(command);
                out.extend(env.iter().map(|(_, t)| t));
            }
            ToolKind::Http(h) => {
                out.push(&h.url);
                out.extend(h.headers.iter().map(|(_, t)| t));
                out.extend(h.query.iter().map(|(_, t)| t));
                if let Some(body) = &h.body {
                    out.extend(body.templates());
                }
            }
            ToolKind::Mcp(m) => {
                match &m.server {
                    McpServer::Stdio { command, env, .. } => {
                        out.extend(command);
                        out.extend(env.iter().map(|(_, t)| t));
                    }
                    McpServer::Http { url, headers } => {
                        out.push(url);
                        out.extend(headers.iter().map(|(_, t)| t));
                    }
                }
                match &m.auth {
                    McpAuth::None | McpAuth::Connection(_) => {}
                    McpAuth::Bearer(t) => out.push(t),
                    McpAuth::ClientCredentials {
                        token_url,
                        client_id,
                        client_secret,
                        private_key,
                        ..
                    } => {
                        out.push(client_id);
                        out.extend(
                            [token_url, client_secret, private_key]
                                .into_iter()
                                .flatten(),
                        );
                    }
                }
            }
        }
        out
    }
}
