//! Tool specs: the common keys (kind, timeout, rate limit, quota, idempotency) and each
//! kind's own (function, command, http, mcp with its server and auth).

use super::keys::{
    COMMAND_KEYS, FUNCTION_KEYS, HTTP_KEYS, HTTP_METHODS, MAX_TIMEOUT, MCP_KEYS, TOOL_COMMON_KEYS,
    TOOL_KINDS,
};
use super::names::is_tool_name;
use super::reconcile::reconcile;
use super::values::string_list;
use super::{Cx, get};
use crate::workflow::diagnostic::{Pos, did_you_mean};
use crate::workflow::expr::Template;
use crate::workflow::tool::{
    DeclaredAnnotations, HttpTool, Idempotency, McpAuth, McpElicitation, McpServer, McpTool,
    ToolDecl, ToolKind,
};
use crate::workflow::yaml::{Key, Node, Value};

pub(super) fn tool(cx: &mut Cx, key: &Key, spec: &Node) -> Option<ToolDecl> {
    let what = format!("tool `{}`", key.name);
    if !is_tool_name(&key.name) {
        cx.error(
            key.pos,
            format!("{what}: tool names may hold letters, digits, `_`, `-` and `.`"),
        );
    }
    let fields = cx.map(spec, &what)?;
    let Some(kind_node) = get(fields, "kind") else {
        cx.error_help(
            key.pos,
            format!("{what} has no `kind`"),
            format!("add `kind:` ({})", TOOL_KINDS.join(", ")),
        );
        return None;
    };
    let kind_name = cx.string(kind_node, "`kind`")?;
    let kind_keys: &[&str] = match kind_name.as_str() {
        "function" => FUNCTION_KEYS,
        "command" => COMMAND_KEYS,
        "http" => HTTP_KEYS,
        "mcp" => MCP_KEYS,
        other => {
            let hint = did_you_mean(other, TOOL_KINDS.iter().copied()).map_or_else(
                || format!("kinds are: {}", TOOL_KINDS.join(", ")),
                |n| format!("did you mean `{n}`?"),
            );
            cx.error_help(
                kind_node.pos,
                format!("unknown tool kind `{other}` for {what}"),
                hint,
            );
            return None;
        }
    };
    cx.check_keys(fields, &[TOOL_COMMON_KEYS, kind_keys], &what);
    let required = |cx: &mut Cx, name: &str| -> Option<&Node> {
        let n = get(fields, name);
        if n.is_none() {
            cx.error(
                key.pos,
                format!("{what} (kind {kind_name}) is missing required key `{name}`"),
            );
        }
        n
    };
    let kind = (|| -> Option<ToolKind> {
        Some(match kind_name.as_str() {
            "function" => ToolKind::Function {
                function: {
                    let n = required(cx, "function")?;
                    cx.string(n, "`function`")?
                },
            },
            "command" => {
                let command = required(cx, "command")?;
                command_tool(cx, fields, command)
            }
            "http" => {
                let url = required(cx, "url")?;
                ToolKind::Http(http_tool(cx, fields, url)?)
            }
            _ => {
                let server = required(cx, "server");
                let tool = required(cx, "tool");
                ToolKind::Mcp(mcp_tool(cx, fields, server?, tool?)?)
            }
        })
    })();
    let idempotency = get(fields, "idempotency").map_or(Idempotency::None, |n| idempotency(cx, n));
    let (rate_limit_per_second, rate_limit_per_minute) =
        get(fields, "rate_limit").map_or((None, None), |n| rate_limit(cx, n));
    let quota_per_day =
        get(fields, "quota").and_then(|n| per(cx, n, "quota", "per_day", 100_000_000));
    let concurrency = get(fields, "concurrency")
        .and_then(|n| cx.count(n, "`concurrency`", 1, MAX_CONCURRENCY))
        .map(|v| v as u32);
    let description = get(fields, "description").and_then(|n| cx.text(n, "`description`"));
    let timeout = get(fields, "timeout").and_then(|n| cx.duration(n, "`timeout`", MAX_TIMEOUT));
    let read_only = get(fields, "read_only").and_then(|n| cx.bool(n, "`read_only`"));
    let reconcile = get(fields, "reconcile").and_then(|n| reconcile(cx, n, &kind_name));
    Some(ToolDecl {
        name: key.name.clone(),
        pos: key.pos,
        kind: kind?,
        description,
        timeout,
        rate_limit_per_minute,
        rate_limit_per_second,
        quota_per_day,
        concurrency,
        idempotency,
        read_only,
        reconcile,
    })
}

/// A tool's `idempotency:` (`none` or `header`; anything else is an error and `none`).
fn idempotency(cx: &mut Cx, n: &Node) -> Idempotency {
    match cx.string(n, "`idempotency`").as_deref() {
        Some("header") => Idempotency::Header,
        Some("none") | None => Idempotency::None,
        Some(other) => {
            cx.error_help(
                n.pos,
                format!("unknown idempotency `{other}`"),
                "use `none` or `header`",
            );
            Idempotency::None
        }
    }
}

/// A `kind: command` tool: its program and arguments (`command`), `env`, `cwd` and
/// `env_allow`.
fn command_tool(cx: &mut Cx, fields: &[(Key, Node)], command_node: &Node) -> ToolKind {
    let command = cx.template_list(command_node, "`command`");
    if command.is_empty() && matches!(command_node.value, Value::Seq(_)) {
        cx.error(command_node.pos, "`command` must name a program");
    }
    ToolKind::Command {
        command,
        env: get(fields, "env")
            .map(|n| cx.template_map(n, "`env`"))
            .unwrap_or_default(),
        cwd: get(fields, "cwd").and_then(|n| cx.string(n, "`cwd`")),
        env_allow: get(fields, "env_allow").map(|n| string_list(cx, n, "`env_allow`")),
    }
}

/// Most calls of one tool a `concurrency:` may let be in flight at once.
const MAX_CONCURRENCY: u64 = 100_000;

/// `rate_limit: { per_second: N, per_minute: M }`: either or both (per second, per
/// minute), each counted in the ledger.
fn rate_limit(cx: &mut Cx, node: &Node) -> (Option<u32>, Option<u32>) {
    let Some(entries) = cx.map(node, "`rate_limit`") else {
        return (None, None);
    };
    cx.check_keys(entries, &[&["per_second", "per_minute"]], "`rate_limit`");
    let second = get(entries, "per_second")
        .and_then(|n| cx.count(n, "`rate_limit.per_second`", 1, 100_000))
        .map(|v| v as u32);
    let minute = get(entries, "per_minute")
        .and_then(|n| cx.count(n, "`rate_limit.per_minute`", 1, 1_000_000))
        .map(|v| v as u32);
    if get(entries, "per_second").is_none() && get(entries, "per_minute").is_none() {
        cx.error(
            node.pos,
            "`rate_limit` needs `per_second` or `per_minute`".to_string(),
        );
    }
    (second, minute)
}

fn per(cx: &mut Cx, node: &Node, what: &str, field: &str, max: u64) -> Option<u32> {
    let entries = cx.map(node, &format!("`{what}`"))?;
    cx.check_keys(entries, &[&[field]], &format!("`{what}`"));
    let Some(n) = get(entries, field) else {
        cx.error(node.pos, format!("`{what}` needs `{field}`"));
        return None;
    };
    cx.count(n, &format!("`{what}.{field}`"), 1, max)
        .map(|v| v as u32)
}

fn http_tool(cx: &mut Cx, fields: &[(Key, Node)], url: &Node) -> Option<HttpTool> {
    let method = match get(fields, "method") {
        None => Some("GET".to_string()),
        Some(n) => cx
            .string(n, "`method`")
            .map(|m| m.to_ascii_uppercase())
            .and_then(|m| {
                if HTTP_METHODS.contains(&m.as_str()) {
                    Some(m)
                } else {
                    cx.error_help(
                        n.pos,
                        format!("unknown HTTP method `{m}`"),
                        format!("methods are: {}", HTTP_METHODS.join(", ")),
                    );
                    None
                }
            }),
    };
    let url = cx.template(url, "`url`");
    if let Some(lit) = url.as_ref().and_then(Template::as_literal)
        && !(lit.starts_with("http://") || lit.starts_with("https://"))
    {
        cx.error_help(
            url.as_ref().map_or_else(Pos::default, |u| u.pos),
            format!("`url` must start with http:// or https://, found `{lit}`"),
            "only HTTP(S) endpoints are supported",
        );
    }
    let max_response_bytes = get(fields, "max_response_bytes")
        .and_then(|n| cx.count(n, "`max_response_bytes`", 1, 1 << 30));
    Some(HttpTool {
        method: method?,
        url: url?,
        headers: get(fields, "headers")
            .map(|n| cx.template_map(n, "`headers`"))
            .unwrap_or_default(),
        query: get(fields, "query")
            .map(|n| cx.template_map(n, "`query`"))
            .unwrap_or_default(),
        body: get(fields, "body").map(|n| cx.tvalue(n, "`body`")),
        idempotency_header: get(fields, "idempotency_header")
            .and_then(|n| cx.string(n, "`idempotency_header`"))
            .unwrap_or_else(|| "Idempotency-Key".to_string()),
        follow_redirects: get(fields, "follow_redirects")
            .and_then(|n| cx.bool(n, "`follow_redirects`"))
            .unwrap_or(false),
        max_response_bytes,
    })
}

fn mcp_tool(cx: &mut Cx, fields: &[(Key, Node)], server: &Node, tool: &Node) -> Option<McpTool> {
    let server_fields = cx.map(server, "`server`")?;
    let server = match (get(server_fields, "command"), get(server_fields, "url")) {
        (Some(command), None) => {
            cx.check_keys(
                server_fields,
                &[&["command", "args", "env", "cwd"]],
                "`server`",
            );
            let mut argv = cx.template_list(command, "`server.command`");
            if let Some(args) = get(server_fields, "args") {
                argv.extend(cx.template_list(args, "`server.args`"));
            }
            if argv.is_empty() {
                cx.error(command.pos, "`server.command` must name a program");
            }
            McpServer::Stdio {
                command: argv,
                env: get(server_fields, "env")
                    .map(|n| cx.template_map(n, "`server.env`"))
                    .unwrap_or_default(),
                cwd: get(server_fields, "cwd").and_then(|n| cx.string(n, "`server.cwd`")),
            }
        }
        (None, Some(url)) => {
            cx.check_keys(server_fields, &[&["url", "headers"]], "`server`");
            McpServer::Http {
                url: cx.template(url, "`server.url`")?,
                headers: get(server_fields, "headers")
                    .map(|n| cx.template_map(n, "`server.headers`"))
                    .unwrap_or_default(),
            }
        }
        (Some(_), Some(_)) => {
            cx.error(
                server.pos,
                "`server` takes either `command` (stdio) or `url` (streamable HTTP), not both",
            );
            return None;
        }
        (None, None) => {
            cx.error_help(server.pos, "`server` needs `command` or `url`", "stdio: `command: [\"python3\", \"server.py\"]`; HTTP: `url: http://127.0.0.1:9000/mcp`");
            return None;
        }
    };
    let auth = match get(fields, "auth") {
        None => McpAuth::None,
        Some(n) => mcp_auth(cx, n)?,
    };
    let elicitation = match get(fields, "elicitation") {
        None => McpElicitation::Decline,
        Some(n) => mcp_elicitation(cx, n)?,
    };
    let propagate_trace = match get(fields, "propagate_trace") {
        None => true,
        Some(n) => cx.bool(n, "`propagate_trace`")?,
    };
    let annotations = match get(fields, "annotations") {
        None => None,
        Some(n) => Some(mcp_annotations(cx, n)?),
    };
    Some(McpTool {
        server,
        tool: cx.string(tool, "`tool`")?,
        auth,
        elicitation,
        propagate_trace,
        annotations,
    })
}

/// `annotations: { read_only, destructive, idempotent }` (each optional, MCP's
/// defaults otherwise).
fn mcp_annotations(cx: &mut Cx, n: &Node) -> Option<DeclaredAnnotations> {
    let fields = cx.map(n, "`annotations`")?;
    cx.check_keys(
        fields,
        &[&["read_only", "destructive", "idempotent"]],
        "`annotations`",
    );
    let flag = |cx: &mut Cx, key: &str, default: bool| match get(fields, key) {
        None => Some(default),
        Some(v) => cx.bool(v, &format!("`annotations.{key}`")),
    };
    Some(DeclaredAnnotations {
        read_only: flag(cx, "read_only", false)?,
        destructive: flag(cx, "destructive", true)?,
        idempotent: flag(cx, "idempotent", false)?,
    })
}

const ELICITATION_HELP: &str =
    "`elicitation` is `decline`, `accept_defaults` or `{ accept: { field: value, … } }`";

fn mcp_elicitation(cx: &mut Cx, node: &Node) -> Option<McpElicitation> {
    match &node.value {
        Value::Str(s) if s == "decline" => Some(McpElicitation::Decline),
        Value::Str(s) if s == "accept_defaults" => Some(McpElicitation::AcceptDefaults),
        Value::Map(entries) => {
            cx.check_keys(entries, &[&["accept"]], "`elicitation`");
            let Some(values) = get(entries, "accept") else {
                cx.error(node.pos, ELICITATION_HELP);
                return None;
            };
            let Value::Map(fields) = &values.value else {
                cx.error(
                    values.pos,
                    format!(
                        "`elicitation.accept` must be a mapping of field to value, found {}",
                        values.type_name()
                    ),
                );
                return None;
            };
            let mut accepted = serde_json::Map::new();
            for (key, value) in fields {
                if matches!(value.value, Value::Seq(_) | Value::Map(_) | Value::Null) {
                    cx.error(
                        value.pos,
                        format!(
                            "`elicitation.accept.{}` must be a string, number or boolean, found {}",
                            key.name,
                            value.type_name()
                        ),
                    );
                }
                cx.constant(value, &format!("`elicitation.accept.{}`", key.name));
                accepted.insert(key.name.clone(), value.to_json());
            }
            Some(McpElicitation::Accept(accepted))
        }
        _ => {
            cx.error(node.pos, ELICITATION_HELP);
            None
        }
    }
}

fn mcp_auth(cx: &mut Cx, node: &Node) -> Option<McpAuth> {
    let entries = cx.map(node, "`auth`")?;
    cx.check_keys(entries, &[&["bearer", "oauth", "connection"]], "`auth`");
    if let Some(b) = get(entries, "bearer") {
        return cx.template(b, "`auth.bearer`").map(McpAuth::Bearer);
    }
    if let Some(c) = get(entries, "connection") {
        let name = cx.string(c, "`auth.connection`")?;
        if !super::names::is_connection_name(&name) {
            cx.error(c.pos, super::names::CONNECTION_NAME_HELP);
            return None;
        }
        return Some(McpAuth::Connection(name));
    }
    if let Some(o) = get(entries, "oauth") {
        let f = cx.map(o, "`auth.oauth`")?;
        cx.check_keys(
            f,
            &[&[
                "token_url",
                "client_id",
                "client_secret",
                "private_key",
                "signing_algorithm",
                "token_endpoint_auth",
                "scope",
            ]],
            "`auth.oauth`",
        );
        let Some(id) = get(f, "client_id") else {
            cx.error(o.pos, "`auth.oauth` is missing `client_id`");
            return None;
        };
        let mut optional =
            |name: &str| get(f, name).and_then(|n| cx.template(n, &format!("`auth.oauth.{name}`")));
        let token_url = optional("token_url");
        let client_secret = optional("client_secret");
        let private_key = optional("private_key");
        let client_id = cx.template(id, "`auth.oauth.client_id`")?;
        let signing_algorithm = get(f, "signing_algorithm")
            .and_then(|n| cx.string(n, "`auth.oauth.signing_algorithm`"));
        let token_endpoint_auth = get(f, "token_endpoint_auth")
            .and_then(|n| cx.string(n, "`auth.oauth.token_endpoint_auth`"));
        if let Some(method) = &token_endpoint_auth
            && !["client_secret_basic", "client_secret_post"].contains(&method.as_str())
        {
            cx.error(
                o.pos,
                "`auth.oauth.token_endpoint_auth` is `client_secret_basic` or `client_secret_post` (a `private_key` means private_key_jwt; neither secret nor key means none)",
            );
        }
        if client_secret.is_some() && private_key.is_some() {
            cx.error(
                o.pos,
                "`auth.oauth` takes `client_secret` or `private_key`, not both",
            );
        }
        return Some(McpAuth::ClientCredentials {
            token_url,
            client_id,
            client_secret,
            private_key,
            signing_algorithm,
            token_endpoint_auth,
            scope: get(f, "scope").and_then(|n| cx.string(n, "`auth.oauth.scope`")),
        });
    }
    cx.error(node.pos, "`auth` needs `bearer`, `oauth` or `connection`");
    None
}
