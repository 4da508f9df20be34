//! Which workflows are MCP tools, and how each one describes itself to an agent.
//!
//! `[mcp] workflows` names files or globs relative to `flow.toml`. Each file is loaded
//! and validated as `flow submit` would (its sub-workflows carried in the text), once,
//! when the server starts: a bad file stops the server with its `FILE:LINE:COL`, not
//! the first agent that calls it. The tool's annotations are derived from what the
//! workflow does, never declared by hand, so they cannot drift from it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Value as Json, json};

use crate::gateway::Tools;
use crate::snapshot::validate_options;
use crate::workflow::{Idempotency, InputType, NodeKind, ToolKind, ValidWorkflow, Workflow};

/// One workflow offered as a tool.
#[derive(Debug)]
pub struct Entry {
    /// The file it was read from (for messages).
    pub path: PathBuf,
    /// The text stored with each run (sub-workflows included).
    pub text: String,
    /// The workflow, validated.
    pub workflow: ValidWorkflow,
    /// What `tools/list` says about it.
    pub tool: Tool,
    /// A tool of a proxied server (`super::proxy`): the call's arguments are the
    /// run's `arguments` input, and its answer is the one node's output.
    pub proxied: bool,
}

/// The tools of one server, in the order `[mcp] workflows` names them.
#[derive(Debug, Default)]
pub struct Catalog {
    /// The entries.
    pub entries: Vec<Entry>,
}

/// Why the catalog could not be built: the installation's fault (exit 5 at start).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Error(pub String);

impl Catalog {
    /// Loads every file the patterns name (relative to `base`, the directory of
    /// `flow.toml`). A pattern that matches nothing, a file that does not validate, or
    /// two workflows with one name are refused.
    pub fn load(patterns: &[String], base: &Path, tools: &Tools) -> Result<Catalog, Error> {
        let mut entries: Vec<Entry> = Vec::new();
        for pattern in patterns {
            for path in expand(pattern, base)? {
                let entry = load_one(&path, tools)?;
                if let Some(other) = entries.iter().find(|e| e.tool.name == entry.tool.name) {
                    return Err(Error(format!(
                        "[mcp] workflows: {} and {} both name a workflow `{}`: a tool's name must be unique (rename one with `name:`)",
                        other.path.display(),
                        path.display(),
                        entry.tool.name
                    )));
                }
                entries.push(entry);
            }
        }
        Ok(Catalog { entries })
    }

    /// The entry for the tool `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.tool.name == name)
    }

    /// Whether no workflow is offered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The files one pattern names, sorted; a plain path must exist, a glob must match.
fn expand(pattern: &str, base: &Path) -> Result<Vec<PathBuf>, Error> {
    let full = base.join(pattern);
    let text = full.to_string_lossy().into_owned();
    let mut found: Vec<PathBuf> = glob::glob(&text)
        .map_err(|e| {
            Error(format!(
                "[mcp] workflows: `{pattern}` is not a valid pattern: {e}"
            ))
        })?
        .filter_map(Result::ok)
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    if found.is_empty() {
        return Err(Error(format!(
            "[mcp] workflows: `{pattern}` matches no file (looked for {text})"
        )));
    }
    Ok(found)
}

/// One file, validated, as a tool.
fn load_one(path: &Path, tools: &Tools) -> Result<Entry, Error> {
    let (workflow, source) = crate::workflow::load_file(path, &validate_options())
        .map_err(|diags| Error(diags.to_string().trim_end().to_owned()))?;
    let tool = describe(&workflow, tools);
    Ok(Entry {
        path: path.to_path_buf(),
        text: source.text,
        workflow,
        tool,
        proxied: false,
    })
}

/// The tool an agent sees: name and description from the workflow, the input schema
/// from its declared inputs, the result's shape, and annotations from its nodes.
pub fn describe(wf: &Workflow, tools: &Tools) -> Tool {
    let description = wf.description.clone().unwrap_or_else(|| {
        format!(
            "Runs the flow workflow `{}` ({} node(s)); each side effect happens at most once.",
            wf.name,
            wf.nodes.len()
        )
    });
    let mut tool = Tool::new(wf.name.clone(), description, Arc::new(input_schema(wf)))
        .with_raw_output_schema(Arc::new(output_schema()))
        .with_annotations(annotations(wf, tools));
    tool.title = Some(wf.name.clone());
    tool
}

/// JSON Schema 2020-12 of the workflow's declared inputs.
fn input_schema(wf: &Workflow) -> JsonObject {
    let mut properties = serde_json::Map::new();
    let mut required = Vec::new();
    for decl in &wf.inputs {
        let mut p = serde_json::Map::new();
        p.insert("type".into(), json!(type_name(decl.ty)));
        if let Some(d) = &decl.description {
            p.insert("description".into(), json!(d));
        }
        if let Some(v) = &decl.default {
            p.insert("default".into(), v.clone());
        }
        if decl.required && decl.default.is_none() {
            required.push(json!(decl.name));
        }
        properties.insert(decl.name.clone(), Json::Object(p));
    }
    object(json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    }))
}

/// The JSON Schema type of an input type.
fn type_name(ty: InputType) -> &'static str {
    match ty {
        InputType::String => "string",
        InputType::Integer => "integer",
        InputType::Number => "number",
        InputType::Boolean => "boolean",
        InputType::Object => "object",
        InputType::Array => "array",
    }
}

/// The shape of every answer's `structuredContent` (`super::answer`).
fn output_schema() -> JsonObject {
    object(json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "run_id": {"type": "string", "description": "The flow run this call started or joined."},
            "status": {"type": "string", "enum": ["succeeded", "failed", "cancelled", "running", "waiting", "in_doubt"]},
            "output": {"type": "object", "description": "The outputs of the workflow's last nodes, by node id (succeeded runs)."},
            "error": {"type": "string"},
            "waiting_for": {"type": "object", "description": "What the run waits for, and who can give it."},
        },
        "required": ["run_id", "status"],
    }))
}

/// `read-only` when no node has a side effect; `destructive` unless every
/// side-effecting call is safe to repeat (its downstream dedupes on the key);
/// `open-world` when a call leaves the machine (HTTP, MCP).
fn annotations(wf: &Workflow, tools: &Tools) -> ToolAnnotations {
    let (mut effects, mut unsafe_to_repeat, mut open) = (false, false, false);
    for node in &wf.nodes {
        match &node.kind {
            NodeKind::Call(call) => {
                let Some(decl) = wf.tools.get(&call.tool) else {
                    continue;
                };
                open |= matches!(decl.kind, ToolKind::Http(_) | ToolKind::Mcp(_));
                if !read_only(decl, tools) {
                    effects = true;
                    unsafe_to_repeat |= decl.idempotency == Idempotency::None;
                }
            }
            NodeKind::Child(_) => {
                // A sub-workflow's effects are its own file's: counted as effects that
                // may not be safe to repeat rather than read again here.
                effects = true;
                unsafe_to_repeat = true;
            }
            NodeKind::Wait(_) => {}
        }
    }
    let mut a = ToolAnnotations::with_title(wf.name.clone())
        .read_only(!effects)
        .open_world(open);
    if effects {
        a = a.destructive(unsafe_to_repeat).idempotent(false);
    }
    a
}

/// Whether calls of `decl` change nothing: a pure function, a declared `read_only`, or
/// an HTTP `GET`, `HEAD` or `OPTIONS` (as the side-effect classes say).
fn read_only(decl: &crate::workflow::ToolDecl, tools: &Tools) -> bool {
    if let Some(declared) = decl.read_only {
        return declared;
    }
    match &decl.kind {
        ToolKind::Function { .. } => tools.is_pure(decl),
        ToolKind::Http(h) => matches!(h.method.as_str(), "GET" | "HEAD" | "OPTIONS"),
        _ => false,
    }
}

/// The object inside `v` (always one here: the literals above are objects).
fn object(v: Json) -> JsonObject {
    match v {
        Json::Object(o) => o,
        _ => JsonObject::new(),
    }
}
