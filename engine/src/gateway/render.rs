//! Turning a tool declaration plus a node's arguments into a concrete adapter request,
//! and its redacted twin for the ledger.
//!
//! Rendering happens once, with real secret values; the stored request is the rendered
//! one passed through [`Secrets::scrub_json`], so secret values never reach the ledger
//! while the canonical hash stays stable when a secret rotates.

use std::path::PathBuf;

use flow_adapters::{command, http, mcp};
use serde_json::{Value as Json, json};

use crate::secrets::Secrets;
use crate::workflow::expr::{self, Template};
use crate::workflow::{McpAuth, McpElicitation, McpServer, ToolDecl, ToolKind};

/// What a node's call will do, with every template rendered.
#[derive(Debug, Clone)]
pub enum Target {
    /// An in-process function.
    Function {
        /// Registry name.
        name: String,
    },
    /// A local command.
    Command(command::Spec),
    /// An HTTP request.
    Http(http::Spec),
    /// A tool on an MCP server.
    Mcp(mcp::Spec),
}

impl Target {
    /// Hosts the request will reach, for the egress allow-list: the URL's, and for an
    /// MCP server with OAuth client credentials the token endpoint's too (the client
    /// secret is sent there).
    pub fn hosts(&self) -> Vec<String> {
        let urls: Vec<&str> = match self {
            Self::Http(spec) => vec![spec.url.as_str()],
            Self::Mcp(spec) => {
                let mut urls = Vec::new();
                if let mcp::ServerSpec::Http { url, .. } = &spec.server {
                    urls.push(url.as_str());
                    if let mcp::Auth::ClientCredentials {
                        token_url: Some(token_url),
                        ..
                    } = &spec.auth
                    {
                        urls.push(token_url.as_str());
                    }
                }
                urls
            }
            _ => Vec::new(),
        };
        urls.into_iter()
            .filter_map(|u| url::Url::parse(u).ok())
            .filter_map(|u| {
                u.host_str()
                    .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_string())
            })
            .collect()
    }
}

/// Renders a spec's templates against one context, describing a failure without any
/// secret value: what a call's tool spec and a reconciliation probe's spec share.
pub struct Renderer<'a> {
    ctx: &'a Json,
    secrets: &'a Secrets,
}

impl<'a> Renderer<'a> {
    /// Templates rendered against `ctx`, errors described with `secrets` scrubbed.
    pub fn new(ctx: &'a Json, secrets: &'a Secrets) -> Self {
        Renderer { ctx, secrets }
    }

    /// One template as a string.
    pub fn string(&self, t: &Template) -> Result<String, String> {
        t.render_string(self.ctx)
            .map_err(|e| describe(&e, self.secrets))
    }

    /// Name–template pairs (headers, query, environment) as name–string pairs.
    pub fn pairs(&self, list: &[(String, Template)]) -> Result<Vec<(String, String)>, String> {
        list.iter()
            .map(|(k, t)| Ok((k.clone(), self.string(t)?)))
            .collect()
    }
}

/// Renders a tool spec for one call. `args` are the node's rendered `with`.
pub fn render(
    tool: &ToolDecl,
    args: &Json,
    base: &Json,
    secrets: &Secrets,
) -> Result<(Target, Json), String> {
    let mut ctx = base.clone();
    if let Json::Object(map) = &mut ctx {
        map.insert("with".into(), args.clone());
    }
    let r = Renderer::new(&ctx, secrets);
    let s = |t: &Template| r.string(t);
    let pairs = |list: &[(String, Template)]| r.pairs(list);
    let target = match &tool.kind {
        ToolKind::Function { function } => Target::Function {
            name: function.clone(),
        },
        ToolKind::Command {
            command,
            env,
            cwd,
            env_allow,
        } => {
            let mut spec =
                command::Spec::new(command.iter().map(&s).collect::<Result<Vec<_>, _>>()?);
            spec.env = pairs(env)?;
            spec.cwd = cwd.as_ref().map(PathBuf::from);
            if let Some(allow) = env_allow {
                spec.env_allow.clone_from(allow);
            }
            Target::Command(spec)
        }
        ToolKind::Http(h) => {
            let mut spec = http::Spec::new(h.method.clone(), s(&h.url)?);
            spec.headers = pairs(&h.headers)?;
            spec.query = pairs(&h.query)?;
            let sends_body = !matches!(h.method.as_str(), "GET" | "HEAD" | "OPTIONS");
            spec.body = match &h.body {
                Some(body) => Some(body.render(&ctx).map_err(|e| describe(&e, secrets))?),
                None if sends_body => Some(args.clone()),
                None => None,
            };
            spec.idempotency_header = Some(h.idempotency_header.clone());
            spec.follow_redirects = h.follow_redirects;
            if let Some(max) = h.max_response_bytes {
                spec.max_response_bytes = usize::try_from(max).unwrap_or(usize::MAX);
            }
            spec.read_only = tool.read_only;
            spec.idempotent_header = tool.idempotency == crate::workflow::Idempotency::Header;
            Target::Http(spec)
        }
        ToolKind::Mcp(m) => {
            let server = match &m.server {
                McpServer::Stdio { command, env, cwd } => mcp::ServerSpec::Stdio {
                    command: command.iter().map(&s).collect::<Result<Vec<_>, _>>()?,
                    env: pairs(env)?,
                    cwd: cwd.as_ref().map(PathBuf::from),
                },
                McpServer::Http { url, headers } => mcp::ServerSpec::Http {
                    url: s(url)?,
                    headers: pairs(headers)?,
                },
            };
            let auth = match &m.auth {
                McpAuth::None => mcp::Auth::None,
                McpAuth::Bearer(t) => mcp::Auth::Bearer(s(t)?),
                McpAuth::Connection(name) => mcp::Auth::Connection(name.clone()),
                McpAuth::ClientCredentials {
                    token_url,
                    client_id,
                    client_secret,
                    private_key,
                    signing_algorithm,
                    token_endpoint_auth,
                    scope,
                } => mcp::Auth::ClientCredentials {
                    token_url: token_url.as_ref().map(&s).transpose()?,
                    client_id: s(client_id)?,
                    client_auth: match (client_secret, private_key) {
                        (Some(secret), _)
                            if token_endpoint_auth.as_deref() == Some("client_secret_post") =>
                        {
                            mcp::ClientAuth::SecretPost(s(secret)?)
                        }
                        (Some(secret), _) => mcp::ClientAuth::Secret(s(secret)?),
                        (None, Some(key)) => mcp::ClientAuth::PrivateKeyJwt {
                            key_pem: s(key)?,
                            algorithm: signing_algorithm
                                .clone()
                                .unwrap_or_else(|| "ES256".to_string()),
                        },
                        (None, None) => mcp::ClientAuth::None,
                    },
                    scope: scope.clone(),
                },
            };
            Target::Mcp(mcp::Spec {
                server,
                tool: m.tool.clone(),
                auth,
                read_only_override: tool.read_only,
                elicitation: match &m.elicitation {
                    McpElicitation::Decline => mcp::Elicitation::Decline,
                    McpElicitation::AcceptDefaults => mcp::Elicitation::AcceptDefaults,
                    McpElicitation::Accept(values) => mcp::Elicitation::Accept(values.clone()),
                },
                meta: m.propagate_trace,
                pinned: m.annotations.map(|a| mcp::Annotations {
                    read_only: a.read_only,
                    idempotent: a.idempotent,
                    destructive: a.destructive,
                }),
            })
        }
    };
    let request = secrets.scrub_json(&describe_request(tool, &target, args));
    Ok((target, request))
}

/// The request as stored in the ledger (before scrubbing): enough to see what was sent
/// and to compare two requests for the cross-run idempotency check.
fn describe_request(tool: &ToolDecl, target: &Target, args: &Json) -> Json {
    let spec = match target {
        Target::Function { name } => json!({ "function": name }),
        Target::Command(c) => json!({
            "command": c.argv,
            "env": c.env.iter().map(|(k, v)| (k.clone(), Json::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
            "cwd": c.cwd.as_ref().map(|p| p.display().to_string()),
        }),
        Target::Http(h) => json!({
            "method": h.method,
            "url": h.url,
            "headers": h.headers.iter().map(|(k, v)| (k.clone(), Json::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
            "query": h.query.iter().map(|(k, v)| (k.clone(), Json::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
            "body": h.body,
        }),
        Target::Mcp(m) => {
            let server = match &m.server {
                mcp::ServerSpec::Stdio { command, .. } => json!({ "command": command }),
                mcp::ServerSpec::Http { url, .. } => json!({ "url": url }),
            };
            json!({ "server": server, "tool": m.tool })
        }
    };
    json!({ "tool": tool.name, "kind": tool.kind.name(), "spec": spec, "with": args })
}

/// An expression error, scrubbed (an error message may quote a rendered value).
pub fn describe(e: &expr::Error, secrets: &Secrets) -> String {
    secrets.scrub(&e.to_string())
}
