//! `[[mcp.servers]]`: flow as an at-most-once MCP proxy. The tools of each server are
//! offered under its name (`<server>__<tool>`), as the server declares them, and each
//! `tools/call` becomes a one-node run whose node calls that tool through the gateway:
//! claim, policy, approval, outbound mark, forward, record. So a proxied call gets
//! everything a workflow's call gets — at most once, in doubt after a lost answer or a
//! crash after the mark (never forwarded twice), rate limits, egress, secrets the agent
//! never sees, telemetry, the in-doubt inbox — and the front's one-run-per-call rule.
//!
//! The proxy adds no stack: a proxied tool is a [`super::catalog::Entry`] whose
//! workflow is generated here (its text is JSON, which is YAML) and parsed by the same
//! parser as any file, so the server settings are checked by the rules of a `kind: mcp`
//! tool.

use std::time::Duration;

use rmcp::model::Tool;
use serde_json::{Value as Json, json};

use super::catalog::{Catalog, Entry, Error};
use crate::config::McpServer;
use crate::gateway::Gateway;
use crate::gateway::render::{Target, render};
use crate::snapshot::validate_options;

/// The node of a proxied call's run.
pub const NODE: &str = "call";
/// Between a server's name and its tool's in the names the proxy lists.
pub const SEPARATOR: &str = "__";
/// How long listing one server's tools may take at start.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);

impl Catalog {
    /// Adds the tools of every server in `servers`, listed now: a server that cannot be
    /// reached or whose settings are refused stops the start with the reason.
    pub async fn add_servers(
        &mut self,
        servers: &[McpServer],
        gateway: &Gateway,
    ) -> Result<(), Error> {
        for server in servers {
            for entry in list(server, gateway).await? {
                if let Some(other) = self.get(&entry.tool.name) {
                    return Err(Error(format!(
                        "[[mcp.servers]] `{}`: tool `{}` is also offered by {}",
                        server.name,
                        entry.tool.name,
                        other.path.display()
                    )));
                }
                self.entries.push(entry);
            }
        }
        Ok(())
    }
}

/// The entries of `server`'s tools.
async fn list(server: &McpServer, gateway: &Gateway) -> Result<Vec<Entry>, Error> {
    let at = |e: String| Error(format!("[[mcp.servers]] `{}`: {e}", server.name));
    if server.name.is_empty()
        || !server
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        || server.name.contains(SEPARATOR)
    {
        return Err(at(format!(
            "name must be letters, digits, `-` and `_` (no `{SEPARATOR}`): it prefixes the tools"
        )));
    }
    // The server's settings as a workflow's tool reach it (and are checked as one).
    let probe = workflow(server, "", None).map_err(at)?;
    let decl = probe
        .workflow
        .tools
        .get("t")
        .ok_or_else(|| at("no tool".into()))?;
    let secrets = gateway.secrets();
    let names = probe.workflow.secret_names();
    if let Some(name) = secrets.missing(names.iter().map(String::as_str)) {
        return Err(at(format!(
            "secret `{name}` is not set: provide FLOW_SECRET_{name} in the environment or a line `{name}=…` in --secrets-file"
        )));
    }
    let ctx = json!({"secrets": secrets.context(names.iter().map(String::as_str), false)});
    let (target, _) = render(decl, &json!({}), &ctx, secrets).map_err(at)?;
    let Target::Mcp(spec) = target else {
        return Err(at("not an MCP server".into()));
    };
    let tools = gateway
        .tools()
        .mcp
        .list_tools(&spec, LIST_TIMEOUT)
        .await
        .map_err(|e| at(format!("cannot list its tools: {}", e.message)))?;
    let mut entries = Vec::with_capacity(tools.len());
    for listed in tools {
        let tool = pinned(server, listed, gateway).await.map_err(at)?;
        entries.push(workflow(server, &tool.name.clone(), Some(tool)).map_err(at)?);
    }
    Ok(entries)
}

/// What a tool's definition is, for its pin: what an agent is shown and what policy
/// reads.
fn definition(tool: &Tool) -> Json {
    json!({
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "annotations": tool.annotations,
    })
}

/// `listed` as its pin says: the definition first seen (recorded now if this is the
/// first time), whatever the server lists today, until an admin accepts a change.
async fn pinned(server: &McpServer, mut listed: Tool, gateway: &Gateway) -> Result<Tool, String> {
    let seen = definition(&listed);
    let now = gateway.now();
    let pin = gateway
        .ledger()
        .observe_tool(&server.name, &listed.name, &seen, now)
        .await
        .map_err(|e| format!("cannot read the pin of tool `{}`: {e}", listed.name))?;
    if pin.changed() {
        tracing::warn!(
            server = %server.name,
            tool = %listed.name,
            pinned = %pin.digest,
            seen = %pin.seen_digest,
            "a proxied tool's definition changed on its server; the pinned one stays until an admin accepts the change (`flow mcp accept`)"
        );
    }
    let d = &pin.definition;
    listed.description = d["description"].as_str().map(|t| t.to_owned().into());
    if let Json::Object(schema) = &d["inputSchema"] {
        listed.input_schema = std::sync::Arc::new(schema.clone());
    }
    listed.annotations = serde_json::from_value(d["annotations"].clone()).ok();
    Ok(listed)
}

/// The entry of `server`'s tool `name` (its listing `tool`; `None`: a probe).
fn workflow(server: &McpServer, name: &str, tool: Option<Tool>) -> Result<Entry, String> {
    let mut settings = serde_json::to_value(&server.tool).map_err(|e| e.to_string())?;
    let Json::Object(map) = &mut settings else {
        return Err("settings must be a table".into());
    };
    for reserved in ["kind", "tool", "annotations"] {
        if map.contains_key(reserved) {
            return Err(format!("`{reserved}` is set by the proxy; remove it"));
        }
    }
    map.insert("kind".into(), json!("mcp"));
    // The pinned hints, not the server's of the day, decide the side-effect class and
    // `[[policy.approvals]]` (a server that drops `destructiveHint` stays gated).
    if let Some(t) = &tool {
        let a = flow_adapters::mcp::Annotations::from_rmcp(t.annotations.as_ref());
        map.insert(
            "annotations".into(),
            json!({"read_only": a.read_only, "destructive": a.destructive, "idempotent": a.idempotent}),
        );
    }
    map.insert(
        "tool".into(),
        json!(if name.is_empty() { "-" } else { name }),
    );
    let full = format!("{}{SEPARATOR}{name}", server.name);
    let mut text = json!({
        "name": full,
        "inputs": {"arguments": {"type": "object", "default": {}}},
        "tools": {"t": settings},
        "nodes": {NODE: {"tool": "t", "with": "${{ inputs.arguments }}"}},
    });
    if let Some(d) = tool.as_ref().and_then(|t| t.description.as_deref()) {
        text["description"] = json!(d);
    }
    let text = text.to_string();
    let file = format!("flow.toml [[mcp.servers]] {}", server.name);
    let workflow = crate::workflow::parse_with(&text, &file, &validate_options())
        .map_err(|d| d.to_string().trim_end().to_owned())?;
    let mut listed = tool
        .unwrap_or_else(|| Tool::new_with_raw(full.clone(), None, rmcp::model::JsonObject::new()));
    listed.name = full.into();
    // flow's answers carry the run's state (waiting, in doubt, …), which no server's
    // output schema describes: the server's structured output still arrives, as
    // `structuredContent.output` of a succeeded call.
    listed.output_schema = None;
    Ok(Entry {
        path: file.into(),
        text,
        workflow,
        tool: listed,
        proxied: true,
    })
}
