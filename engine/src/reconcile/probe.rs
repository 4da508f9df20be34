//! One probe: render the `reconcile` request for an in-doubt call, send it under the
//! same rules as any call (secrets, egress allow-list, rate limit, timeout, body cap),
//! and read the answer through the block's `found` / `not_found` / `output`.
//!
//! What the expressions see: `inputs`, `run.id`, `call` (`key` — the key the effect
//! attempt was sent with —, `request` as stored, `outbound_at`, `attempt`, `tool`),
//! `secrets` in the request only, and `response` in the verdicts: `status`, `headers`,
//! `body` for HTTP; `body` (and `status: 0`) for a command's stdout or an MCP result.

use std::path::PathBuf;
use std::time::Duration;

use flow_adapters::{Call, Tool, command, http, mcp};
use flow_ledger::{Timestamp, ToolCall};
use serde_json::{Map, Value as Json, json};

use super::decide::Answer;
use crate::gateway::{Gateway, Target, render};
use crate::workflow::expr::{Template, eval_condition, secret_names};
use crate::workflow::{Probe, Reconcile, ToolDecl, Workflow};

/// Most bytes of an answer kept in the probe's audit row.
const KEPT_RESPONSE_BYTES: usize = 4096;

/// What one probe came to.
#[derive(Debug, Clone)]
pub struct Asked {
    /// The answer, read through the verdict expressions.
    pub answer: Answer,
    /// The HTTP status, if HTTP.
    pub http_status: Option<u16>,
    /// The answer as kept in the audit row (scrubbed, capped).
    pub summary: Option<Json>,
    /// Requests the probe sent.
    pub requests_sent: u32,
}

/// Why no probe was sent.
#[derive(Debug, Clone)]
pub enum NotAsked {
    /// The tool's rate limit or quota has no room: ask again at this time.
    Limited(Timestamp),
    /// The probe cannot be built or is not allowed (a missing secret, egress): the call
    /// stays in doubt and a human decides; the message says why.
    Refused(String),
}

/// What the probe of `call` reads.
pub(super) fn context(call: &ToolCall, inputs: &Json, run_id: &str) -> Json {
    json!({
        "inputs": inputs,
        "run": { "id": run_id },
        "call": {
            "key": call.current_key,
            "request": call.request,
            "outbound_at": call.outbound_started_at.map(|t| t.to_rfc3339()),
            "attempt": call.attempt_count,
            "tool": call.tool,
        },
    })
}

/// Sends the probe of `tool` for the call whose context is `ctx`.
pub(super) async fn ask(
    gateway: &Gateway,
    wf: &Workflow,
    tool: &ToolDecl,
    r: &Reconcile,
    ctx: &Json,
) -> Result<Asked, NotAsked> {
    let secrets = gateway.secrets();
    let needed = secret_names(r.request_templates());
    if let Some(name) = secrets.missing(needed.iter().map(String::as_str)) {
        return Err(NotAsked::Refused(format!(
            "the probe of tool `{}` reads secret `{name}`, which is not set",
            tool.name
        )));
    }
    let mut with_secrets = ctx.clone();
    if let Json::Object(map) = &mut with_secrets {
        map.insert(
            "secrets".into(),
            secrets.context(needed.iter().map(String::as_str), false),
        );
    }
    let timeout = r
        .timeout
        .or(tool.timeout)
        .unwrap_or(Duration::from_secs(10));
    let (target, args) = build(gateway, tool, r, &with_secrets).map_err(NotAsked::Refused)?;
    let (egress, allow_list) = gateway.egress();
    for host in target.hosts() {
        if !egress.allows(&host) {
            return Err(NotAsked::Refused(format!(
                "egress to `{host}` is not allowed by `egress.allow` in flow.toml (the probe of tool `{}`)",
                tool.name
            )));
        }
    }
    if let Some(until) = rate_limited(gateway, wf, tool).await {
        return Err(NotAsked::Limited(until));
    }
    let key = ctx
        .pointer("/call/key")
        .and_then(Json::as_str)
        .unwrap_or_default();
    let call = Call::new(args, key, timeout);
    let (sent, answer) = send(gateway, target, allow_list, call).await;
    let (status, response) = match answer {
        Ok(answer) => answer,
        Err(why) => {
            return Ok(Asked {
                answer: Answer::Unknown(secrets.scrub(&why)),
                http_status: None,
                summary: None,
                requests_sent: sent,
            });
        }
    };
    let response = secrets.scrub_json(&response);
    let summary = Some(capped(&response));
    let mut read = ctx.clone();
    if let Json::Object(map) = &mut read {
        map.insert("response".into(), response.clone());
    }
    Ok(Asked {
        answer: read_answer(r, &read, &response),
        http_status: status,
        summary,
        requests_sent: sent,
    })
}

/// The rendered probe and the arguments it is called with: never the tool's own request.
fn build(
    gateway: &Gateway,
    tool: &ToolDecl,
    r: &Reconcile,
    ctx: &Json,
) -> Result<(Target, Json), String> {
    let secrets = gateway.secrets();
    let templates = render::Renderer::new(ctx, secrets);
    let s = |t: &Template| templates.string(t);
    let pairs = |list: &[(String, Template)]| templates.pairs(list);
    Ok(match &r.probe {
        Probe::Http {
            method,
            url,
            headers,
            query,
        } => {
            let mut spec = http::Spec::new(method.clone(), s(url)?);
            spec.headers = pairs(headers)?;
            spec.query = pairs(query)?;
            spec.read_only = Some(true);
            if let crate::workflow::ToolKind::Http(h) = &tool.kind {
                spec.follow_redirects = h.follow_redirects;
            }
            (Target::Http(spec), Json::Null)
        }
        Probe::Command { command, env } => {
            let mut spec =
                command::Spec::new(command.iter().map(&s).collect::<Result<Vec<_>, _>>()?);
            spec.env = pairs(env)?;
            if let crate::workflow::ToolKind::Command { cwd, .. } = &tool.kind {
                spec.cwd = cwd.as_ref().map(PathBuf::from);
            }
            // The program reads the call it is asked about on stdin.
            (
                Target::Command(spec),
                ctx.get("call").cloned().unwrap_or(Json::Null),
            )
        }
        Probe::Mcp {
            tool: probe_tool,
            with,
        } => {
            // The server and its credentials are the tool's own; the arguments it was
            // rendered with are the call's stored `with`.
            let args = ctx
                .pointer("/call/request/with")
                .cloned()
                .unwrap_or(Json::Null);
            let (target, _) = render::render(tool, &args, ctx, secrets)?;
            let Target::Mcp(mut spec) = target else {
                return Err(format!("tool `{}` is not an mcp tool", tool.name));
            };
            if *probe_tool == spec.tool {
                return Err(format!(
                    "the probe of tool `{}` names the tool itself (`{probe_tool}`); a probe must only read",
                    tool.name
                ));
            }
            spec.tool.clone_from(probe_tool);
            spec.read_only_override = Some(true);
            spec.elicitation = mcp::Elicitation::Decline;
            let args = with
                .render(ctx)
                .map_err(|e| render::describe(&e, secrets))?;
            (Target::Mcp(spec), args)
        }
    })
}

/// `Some(when)` when the tool's rate limit or quota has no room for a probe now (the
/// gateway's own count, shared with the tool's calls); a ledger error means later.
async fn rate_limited(gateway: &Gateway, wf: &Workflow, tool: &ToolDecl) -> Option<Timestamp> {
    match gateway.rate_limited(wf, tool).await {
        Ok(until) => until,
        Err(e) => {
            tracing::warn!(tool = tool.name, error = %e, "cannot count the probe against the rate limit; probing later");
            Some(Timestamp(gateway.now().0 + 1_000))
        }
    }
}

/// Sends the probe: the requests sent, and `(HTTP status, response)` or why there is
/// no answer.
async fn send(
    gateway: &Gateway,
    target: Target,
    allow_list: Option<&flow_adapters::egress::AllowList>,
    call: Call,
) -> (u32, Result<(Option<u16>, Json), String>) {
    let out = match target {
        Target::Http(mut spec) => {
            spec.allow_hosts = allow_list.cloned();
            return match gateway.tools().http.tool(spec).exchange(call).await {
                Ok(a) => (
                    a.requests_sent,
                    Ok((
                        Some(a.status),
                        json!({ "status": a.status, "headers": a.headers, "body": a.body }),
                    )),
                ),
                Err((e, sent)) => (sent, Err(e.message)),
            };
        }
        Target::Command(spec) => command::CommandTool::new(spec).call(call).await,
        Target::Mcp(spec) => gateway.tools().mcp.tool(spec).call(call).await,
        Target::Function { .. } => return (0, Err("a function tool has nothing to probe".into())),
    };
    let sent = out.requests_sent;
    match out.result {
        Ok(body) => (sent, Ok((None, json!({ "status": 0, "body": body })))),
        Err(e) => (sent, Err(e.message)),
    }
}

/// The answer through the verdicts: exactly one of `found` / `not_found` must hold.
fn read_answer(r: &Reconcile, read: &Json, response: &Json) -> Answer {
    let found = eval_condition(&r.found, read);
    let not_found = eval_condition(&r.not_found, read);
    match (found, not_found) {
        (Ok(true), Ok(false)) => {
            let output = match &r.output {
                Some(o) => match o.render(read) {
                    Ok(v) => v,
                    Err(e) => return Answer::Unknown(format!("`reconcile.output`: {e}")),
                },
                None => response.get("body").cloned().unwrap_or(Json::Null),
            };
            Answer::Found(output)
        }
        (Ok(false), Ok(true)) => Answer::NotFound,
        (Ok(true), Ok(true)) => {
            Answer::Unknown("both `found` and `not_found` hold for this answer".into())
        }
        (Ok(false), Ok(false)) => Answer::Unknown(format!(
            "neither `found` nor `not_found` holds for this answer{}",
            response
                .get("status")
                .and_then(Json::as_u64)
                .filter(|s| *s != 0)
                .map(|s| format!(" (HTTP {s})"))
                .unwrap_or_default()
        )),
        (Err(e), _) => Answer::Unknown(format!("`reconcile.found`: {e}")),
        (_, Err(e)) => Answer::Unknown(format!("`reconcile.not_found`: {e}")),
    }
}

/// The answer as the audit row keeps it: whole when small, else its start as text.
fn capped(response: &Json) -> Json {
    let text = response.to_string();
    if text.len() <= KEPT_RESPONSE_BYTES {
        return response.clone();
    }
    let mut end = KEPT_RESPONSE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut m = Map::new();
    m.insert("truncated".into(), Json::from(text.len()));
    m.insert("start".into(), Json::from(&text[..end]));
    Json::Object(m)
}
