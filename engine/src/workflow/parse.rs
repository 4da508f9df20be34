//! From the span-annotated YAML tree to the workflow model, collecting every problem.
//!
//! Each converter reports what is wrong at the exact key or value and keeps going with a
//! best-effort value, so one pass finds all the problems of a file.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value as Json;

use super::diagnostic::{Diagnostic, Pos, did_you_mean};
use super::expr::{TValue, Template};
use super::model::{
    DEFAULT_MAX_PARALLEL, Defaults, HttpTool, Idempotency, InputDecl, InputType, McpAuth,
    McpServer, McpTool, NodeDecl, RetryPolicy, ToolDecl, ToolKind, Workflow,
};
use super::yaml::{Key, Node, Value};

/// Longest per-attempt timeout accepted: a day. Anything longer is a typo or a job for
/// a queue, not a request.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Longest whole-node deadline accepted: 30 days.
pub const MAX_DEADLINE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Most retries a node may declare.
pub const MAX_RETRIES: u32 = 100;
/// Largest `max_parallel`.
pub const MAX_PARALLEL: u32 = 1024;

const TOP_KEYS: &[&str] = &[
    "name",
    "description",
    "inputs",
    "defaults",
    "max_parallel",
    "tools",
    "nodes",
];
const INPUT_KEYS: &[&str] = &["type", "required", "default", "description"];
const DEFAULTS_KEYS: &[&str] = &["timeout", "deadline", "retry_policy"];
const RETRY_KEYS: &[&str] = &["max_retries", "backoff"];
const BACKOFF_KEYS: &[&str] = &["initial", "max", "multiplier", "jitter"];
const NODE_KEYS: &[&str] = &[
    "tool",
    "needs",
    "with",
    "if",
    "retry_policy",
    "timeout",
    "deadline",
    "idempotency_key",
    "continue_on_error",
    "description",
];
const TOOL_COMMON_KEYS: &[&str] = &[
    "kind",
    "description",
    "timeout",
    "rate_limit",
    "quota",
    "idempotency",
    "read_only",
];
const FUNCTION_KEYS: &[&str] = &["function"];
const COMMAND_KEYS: &[&str] = &["command", "env", "cwd", "env_allow"];
const HTTP_KEYS: &[&str] = &[
    "method",
    "url",
    "headers",
    "query",
    "body",
    "idempotency_header",
    "follow_redirects",
    "max_response_bytes",
];
const MCP_KEYS: &[&str] = &["server", "tool", "auth"];
const TOOL_KINDS: &[&str] = &["function", "command", "http", "mcp"];
const HTTP_METHODS: &[&str] = &["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"];

/// Collects diagnostics while converting.
pub(crate) struct Cx {
    pub(crate) diags: Vec<Diagnostic>,
    /// Every tool name declared, valid or not, so a node using a broken tool is not also
    /// told the tool does not exist.
    pub(crate) declared_tools: Vec<String>,
}

impl Cx {
    pub(crate) fn error(&mut self, pos: Pos, message: impl Into<String>) {
        self.diags.push(Diagnostic::new(pos, message.into()));
    }

    fn error_help(&mut self, pos: Pos, message: impl Into<String>, help: impl Into<String>) {
        self.diags
            .push(Diagnostic::new(pos, message.into()).with_help(help));
    }

    fn map<'a>(&mut self, node: &'a Node, what: &str) -> Option<&'a [(Key, Node)]> {
        match &node.value {
            Value::Map(entries) => {
                self.check_duplicates(entries, what);
                Some(entries)
            }
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be a mapping, found {}", node.type_name()),
                );
                None
            }
        }
    }

    /// Reports repeated keys of one mapping, naming them for what they are.
    fn check_duplicates(&mut self, entries: &[(Key, Node)], what: &str) {
        let mut first: std::collections::HashMap<&str, Pos> =
            std::collections::HashMap::with_capacity(entries.len());
        for (key, _) in entries {
            let Some(first_pos) = first.get(key.name.as_str()).copied() else {
                first.insert(&key.name, key.pos);
                continue;
            };
            let message = match what {
                "`nodes`" => format!("duplicate node id `{}`", key.name),
                "`tools`" => format!("duplicate tool `{}`", key.name),
                _ => format!("duplicate key `{}` in {what}", key.name),
            };
            self.error_help(
                key.pos,
                message,
                format!("`{}` is first defined at line {}", key.name, first_pos.line),
            );
        }
    }

    /// Reports duplicate keys anywhere under a free-form value (`default:`, `with:`).
    fn check_duplicates_deep(&mut self, node: &Node, what: &str) {
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            match &n.value {
                Value::Map(entries) => {
                    self.check_duplicates(entries, what);
                    stack.extend(entries.iter().map(|(_, v)| v));
                }
                Value::Seq(items) => stack.extend(items.iter()),
                _ => {}
            }
        }
    }

    /// Reports keys outside `allowed`, suggesting the nearest allowed one.
    fn check_keys(&mut self, entries: &[(Key, Node)], allowed: &[&[&str]], context: &str) {
        for (key, _) in entries {
            if allowed.iter().any(|set| set.contains(&key.name.as_str())) {
                continue;
            }
            let all = allowed.iter().flat_map(|s| s.iter().copied());
            let message = format!("unknown key `{}` in {context}", key.name);
            match did_you_mean(&key.name, all) {
                Some(near) => self.error_help(key.pos, message, format!("did you mean `{near}`?")),
                None => {
                    let list: Vec<&str> = allowed.iter().flat_map(|s| s.iter().copied()).collect();
                    self.error_help(
                        key.pos,
                        message,
                        format!("allowed keys: {}", list.join(", ")),
                    );
                }
            }
        }
    }

    /// A plain string field. Such fields are never rendered, so a `${{ }}` in one would be
    /// used as literal text: refused rather than silently kept.
    fn string(&mut self, node: &Node, what: &str) -> Option<String> {
        let s = self.text(node, what)?;
        if s.contains("${{") {
            self.error_help(
                node.pos,
                format!("{what} does not take expressions, found `{s}`"),
                "expressions are evaluated in `with`, `if`, `idempotency_key` and a tool's templated fields (url, headers, query, body, command, env, auth); this value would be used as literal text",
            );
            return None;
        }
        Some(s)
    }

    /// Free text (`description`): anything goes, it is never evaluated.
    fn text(&mut self, node: &Node, what: &str) -> Option<String> {
        match &node.value {
            Value::Str(s) => Some(s.clone()),
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be a string, found {}", node.type_name()),
                );
                None
            }
        }
    }

    fn bool(&mut self, node: &Node, what: &str) -> Option<bool> {
        match &node.value {
            Value::Bool(b) => Some(*b),
            Value::Str(s) if s.contains("${{") => {
                self.error_help(
                    node.pos,
                    format!("{what} must be true or false, found the expression `{s}`"),
                    format!("{what} is fixed when the workflow is written; it is not evaluated"),
                );
                None
            }
            Value::Str(s) if matches!(s.trim(), "true" | "false") => {
                self.error_help(
                    node.pos,
                    format!("{what} must be true or false, found the string `{s}`"),
                    format!("write {} without quotes", s.trim()),
                );
                None
            }
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be true or false, found {}", node.type_name()),
                );
                None
            }
        }
    }

    fn count(&mut self, node: &Node, what: &str, min: u64, max: u64) -> Option<u64> {
        match &node.value {
            Value::Int(i) if *i >= 0 && (*i as u64) >= min && (*i as u64) <= max => Some(*i as u64),
            Value::Int(i) => {
                self.error(
                    node.pos,
                    format!("{what} must be between {min} and {max}, found {i}"),
                );
                None
            }
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be a whole number, found {}", node.type_name()),
                );
                None
            }
        }
    }

    fn number(&mut self, node: &Node, what: &str, min: f64, max: f64) -> Option<f64> {
        let value = match &node.value {
            Value::Int(i) => *i as f64,
            Value::Float(f) => *f,
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be a number, found {}", node.type_name()),
                );
                return None;
            }
        };
        if !(min..=max).contains(&value) {
            self.error(
                node.pos,
                format!("{what} must be between {min} and {max}, found {value}"),
            );
            return None;
        }
        Some(value)
    }

    fn duration(&mut self, node: &Node, what: &str, max: Duration) -> Option<Duration> {
        let text = match &node.value {
            Value::Str(s) => s.clone(),
            Value::Int(i) => {
                self.error_help(
                    node.pos,
                    format!("{what} needs a unit, found `{i}`"),
                    format!("write `{i}s` or `{i}ms`"),
                );
                return None;
            }
            _ => {
                self.error(
                    node.pos,
                    format!(
                        "{what} must be a duration like `250ms`, `30s`, `5m`, `1h`, found {}",
                        node.type_name()
                    ),
                );
                return None;
            }
        };
        match parse_duration(&text) {
            Ok(d) if d.is_zero() => {
                self.error(node.pos, format!("{what} must be longer than zero"));
                None
            }
            Ok(d) if d > max => {
                self.error(
                    node.pos,
                    format!(
                        "{what} `{text}` is longer than the limit of {}",
                        humantime::format_duration(max)
                    ),
                );
                None
            }
            Ok(d) => Some(d),
            Err(reason) => {
                self.error_help(
                    node.pos,
                    format!("invalid duration `{text}` for {what}: {reason}"),
                    "use a number and a unit: `250ms`, `30s`, `5m`, `1h`",
                );
                None
            }
        }
    }

    fn template(&mut self, node: &Node, what: &str) -> Option<Template> {
        let text = match &node.value {
            Value::Str(s) => s.clone(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be a string, found {}", node.type_name()),
                );
                return None;
            }
        };
        match Template::parse(&text, node.pos) {
            Ok(t) => Some(t),
            Err(e) => {
                self.error(node.pos, format!("{what}: {e}"));
                None
            }
        }
    }

    fn template_list(&mut self, node: &Node, what: &str) -> Vec<Template> {
        match &node.value {
            Value::Seq(items) => items
                .iter()
                .filter_map(|i| self.template(i, what))
                .collect(),
            Value::Str(s) => {
                self.error_help(
                    node.pos,
                    format!("{what} must be a list (argv, no shell), found a string"),
                    format!(
                        "write `[{}]`",
                        s.split_whitespace()
                            .map(|w| format!("\"{w}\""))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
                Vec::new()
            }
            _ => {
                self.error(
                    node.pos,
                    format!("{what} must be a list, found {}", node.type_name()),
                );
                Vec::new()
            }
        }
    }

    fn template_map(&mut self, node: &Node, what: &str) -> Vec<(String, Template)> {
        let Some(entries) = self.map(node, what) else {
            return Vec::new();
        };
        entries
            .iter()
            .filter_map(|(k, v)| {
                self.template(v, &format!("{what}.{}", k.name))
                    .map(|t| (k.name.clone(), t))
            })
            .collect()
    }

    fn tvalue(&mut self, node: &Node, what: &str) -> TValue {
        if let Value::Map(entries) = &node.value {
            self.check_duplicates(entries, what);
        }
        match &node.value {
            Value::Str(_) => self
                .template(node, what)
                .map_or(TValue::Const(Json::Null), |t| {
                    if t.has_expr() {
                        TValue::Str(t)
                    } else {
                        TValue::Const(node.to_json())
                    }
                }),
            Value::Seq(items) => TValue::Seq(items.iter().map(|i| self.tvalue(i, what)).collect()),
            Value::Map(entries) => TValue::Map(
                entries
                    .iter()
                    .map(|(k, v)| (k.name.clone(), self.tvalue(v, what)))
                    .collect(),
            ),
            _ => TValue::Const(node.to_json()),
        }
    }
}

/// Parses `250ms`, `30s`, `5m`, `1h`, `1h30m` (humantime's grammar).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| e.to_string())
}

fn get<'a>(entries: &'a [(Key, Node)], name: &str) -> Option<&'a Node> {
    entries.iter().find(|(k, _)| k.name == name).map(|(_, v)| v)
}

/// Converts the root of a workflow file. `stem` names the workflow when `name:` is absent.
pub(crate) fn workflow(cx: &mut Cx, root: &Node, stem: &str) -> Workflow {
    let mut wf = Workflow {
        name: stem.to_string(),
        description: None,
        inputs: Vec::new(),
        defaults: Defaults::default(),
        max_parallel: DEFAULT_MAX_PARALLEL,
        tools: BTreeMap::new(),
        nodes: Vec::new(),
    };
    let Some(entries) = cx.map(root, "a workflow file") else {
        return wf;
    };
    cx.check_keys(entries, &[TOP_KEYS], "the workflow");
    if let Some(n) = get(entries, "name")
        && let Some(name) = cx.string(n, "`name`")
    {
        wf.name = name;
    }
    wf.description = get(entries, "description").and_then(|n| cx.text(n, "`description`"));
    if let Some(n) = get(entries, "inputs") {
        wf.inputs = inputs(cx, n);
    }
    if let Some(n) = get(entries, "defaults") {
        wf.defaults = defaults(cx, n);
    }
    if let Some(n) = get(entries, "max_parallel")
        && let Some(v) = cx.count(n, "`max_parallel`", 1, u64::from(MAX_PARALLEL))
    {
        wf.max_parallel = v as u32;
    }
    if let Some(n) = get(entries, "tools")
        && let Some(tools) = cx.map(n, "`tools`")
    {
        for (key, spec) in tools {
            cx.declared_tools.push(key.name.clone());
            if let Some(tool) = tool(cx, key, spec) {
                wf.tools.insert(key.name.clone(), tool);
            }
        }
    }
    match get(entries, "nodes") {
        Some(n) => {
            if let Some(nodes) = cx.map(n, "`nodes`") {
                if nodes.is_empty() {
                    cx.error(
                        n.pos,
                        "`nodes` is empty: a workflow needs at least one node",
                    );
                }
                wf.nodes = nodes.iter().filter_map(|(k, v)| node(cx, k, v)).collect();
            }
        }
        None => cx.error_help(
            root.pos,
            "missing required key `nodes`",
            "add `nodes:` with at least one node",
        ),
    }
    wf
}

fn inputs(cx: &mut Cx, node: &Node) -> Vec<InputDecl> {
    let Some(entries) = cx.map(node, "`inputs`") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (key, spec) in entries {
        let what = format!("input `{}`", key.name);
        if !is_identifier(&key.name) {
            cx.error(
                key.pos,
                format!("{what}: input names must be identifiers (letters, digits, `_`)"),
            );
        }
        let Some(fields) = cx.map(spec, &what) else {
            continue;
        };
        cx.check_keys(fields, &[INPUT_KEYS], &what);
        let ty = match get(fields, "type") {
            Some(t) => match cx.string(t, &format!("{what} `type`")) {
                Some(name) => match InputType::parse(&name) {
                    Some(ty) => Some(ty),
                    None => {
                        let hint = did_you_mean(&name, InputType::NAMES).map_or_else(
                            || format!("types are: {}", InputType::NAMES.join(", ")),
                            |n| format!("did you mean `{n}`?"),
                        );
                        cx.error_help(t.pos, format!("unknown type `{name}` for {what}"), hint);
                        None
                    }
                },
                None => None,
            },
            None => {
                cx.error_help(
                    key.pos,
                    format!("{what} has no `type`"),
                    format!("add `type:` ({})", InputType::NAMES.join(", ")),
                );
                None
            }
        };
        let required = get(fields, "required")
            .and_then(|n| cx.bool(n, "`required`"))
            .unwrap_or(false);
        let default = get(fields, "default").map(|d| {
            cx.check_duplicates_deep(d, "`default`");
            (d.pos, d.to_json())
        });
        if let (Some(ty), Some((pos, value))) = (ty, &default)
            && !ty.accepts(value)
        {
            cx.error(
                *pos,
                format!("the default of {what} is not of type {}", ty.name()),
            );
        }
        let description = get(fields, "description").and_then(|n| cx.text(n, "`description`"));
        if let Some(ty) = ty {
            out.push(InputDecl {
                name: key.name.clone(),
                ty,
                required,
                default: default.map(|(_, v)| v),
                description,
            });
        }
    }
    out
}

fn defaults(cx: &mut Cx, node: &Node) -> Defaults {
    let mut d = Defaults::default();
    let Some(entries) = cx.map(node, "`defaults`") else {
        return d;
    };
    cx.check_keys(entries, &[DEFAULTS_KEYS], "`defaults`");
    d.timeout = get(entries, "timeout").and_then(|n| cx.duration(n, "`timeout`", MAX_TIMEOUT));
    d.deadline = get(entries, "deadline").and_then(|n| cx.duration(n, "`deadline`", MAX_DEADLINE));
    d.retry_policy = get(entries, "retry_policy").and_then(|n| retry_policy(cx, n));
    d
}

fn retry_policy(cx: &mut Cx, node: &Node) -> Option<RetryPolicy> {
    let entries = cx.map(node, "`retry_policy`")?;
    cx.check_keys(entries, &[RETRY_KEYS], "`retry_policy`");
    let mut p = RetryPolicy::default();
    let mut ok = true;
    if let Some(n) = get(entries, "max_retries") {
        match cx.count(n, "`max_retries`", 0, u64::from(MAX_RETRIES)) {
            Some(v) => p.max_retries = v as u32,
            None => ok = false,
        }
    }
    if let Some(b) = get(entries, "backoff") {
        let fields = cx.map(b, "`backoff`")?;
        cx.check_keys(fields, &[BACKOFF_KEYS], "`backoff`");
        let mut set = |cx: &mut Cx, name: &str, target: &mut Duration| {
            if let Some(n) = get(fields, name) {
                match cx.duration(n, &format!("`backoff.{name}`"), MAX_TIMEOUT) {
                    Some(d) => *target = d,
                    None => ok = false,
                }
            }
        };
        set(cx, "initial", &mut p.initial);
        set(cx, "max", &mut p.max);
        if let Some(n) = get(fields, "multiplier") {
            match cx.number(n, "`backoff.multiplier`", 1.0, 10.0) {
                Some(v) => p.multiplier = v,
                None => ok = false,
            }
        }
        if let Some(n) = get(fields, "jitter") {
            match cx.number(n, "`backoff.jitter`", 0.0, 1.0) {
                Some(v) => p.jitter = v,
                None => ok = false,
            }
        }
        if p.max < p.initial {
            cx.error(b.pos, "`backoff.max` is shorter than `backoff.initial`");
        }
    }
    if !ok {
        return None;
    }
    Some(p)
}

fn tool(cx: &mut Cx, key: &Key, spec: &Node) -> Option<ToolDecl> {
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
                let command_node = required(cx, "command")?;
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
    let idempotency = match get(fields, "idempotency") {
        None => Idempotency::None,
        Some(n) => match cx.string(n, "`idempotency`").as_deref() {
            Some("none") => Idempotency::None,
            Some("header") => Idempotency::Header,
            Some(other) => {
                cx.error_help(
                    n.pos,
                    format!("unknown idempotency `{other}`"),
                    "use `none` or `header`",
                );
                Idempotency::None
            }
            None => Idempotency::None,
        },
    };
    let rate_limit_per_minute =
        get(fields, "rate_limit").and_then(|n| per(cx, n, "rate_limit", "per_minute", 1_000_000));
    let quota_per_day =
        get(fields, "quota").and_then(|n| per(cx, n, "quota", "per_day", 100_000_000));
    let description = get(fields, "description").and_then(|n| cx.text(n, "`description`"));
    let timeout = get(fields, "timeout").and_then(|n| cx.duration(n, "`timeout`", MAX_TIMEOUT));
    let read_only = get(fields, "read_only").and_then(|n| cx.bool(n, "`read_only`"));
    Some(ToolDecl {
        name: key.name.clone(),
        pos: key.pos,
        kind: kind?,
        description,
        timeout,
        rate_limit_per_minute,
        quota_per_day,
        idempotency,
        read_only,
    })
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

fn string_list(cx: &mut Cx, node: &Node, what: &str) -> Vec<String> {
    match &node.value {
        Value::Seq(items) => items.iter().filter_map(|i| cx.string(i, what)).collect(),
        _ => {
            cx.error(
                node.pos,
                format!(
                    "{what} must be a list of strings, found {}",
                    node.type_name()
                ),
            );
            Vec::new()
        }
    }
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
    Some(McpTool {
        server,
        tool: cx.string(tool, "`tool`")?,
        auth,
    })
}

fn mcp_auth(cx: &mut Cx, node: &Node) -> Option<McpAuth> {
    let entries = cx.map(node, "`auth`")?;
    cx.check_keys(entries, &[&["bearer", "oauth"]], "`auth`");
    if let Some(b) = get(entries, "bearer") {
        return cx.template(b, "`auth.bearer`").map(McpAuth::Bearer);
    }
    if let Some(o) = get(entries, "oauth") {
        let f = cx.map(o, "`auth.oauth`")?;
        cx.check_keys(
            f,
            &[&["token_url", "client_id", "client_secret", "scope"]],
            "`auth.oauth`",
        );
        let mut field = |name: &str| {
            let n = get(f, name);
            if n.is_none() {
                cx.error(o.pos, format!("`auth.oauth` is missing `{name}`"));
            }
            n.and_then(|n| cx.template(n, &format!("`auth.oauth.{name}`")))
        };
        let token_url = field("token_url");
        let client_id = field("client_id");
        let client_secret = field("client_secret");
        return Some(McpAuth::ClientCredentials {
            token_url: token_url?,
            client_id: client_id?,
            client_secret: client_secret?,
            scope: get(f, "scope").and_then(|n| cx.string(n, "`auth.oauth.scope`")),
        });
    }
    cx.error(node.pos, "`auth` needs `bearer` or `oauth`");
    None
}

fn node(cx: &mut Cx, key: &Key, spec: &Node) -> Option<NodeDecl> {
    let id = key.name.clone();
    let what = format!("node `{id}`");
    if !is_node_id(&id) {
        cx.error_help(
            key.pos,
            format!("invalid node id `{id}`"),
            "node ids use lower-case letters, digits, `_` and `-`",
        );
    } else if let Some(n) = reserved_retry_suffix(&id) {
        cx.error_help(
            key.pos,
            format!("node id `{id}` ends in `_retry{n}`, which is reserved for retry steps"),
            "rename the node; retries of node `x` are recorded as steps `x_retry1`, `x_retry2`, …",
        );
    }
    let fields = cx.map(spec, &what)?;
    cx.check_keys(fields, &[NODE_KEYS], &what);
    let (tool, tool_pos) = match get(fields, "tool") {
        Some(t) => (cx.string(t, "`tool`").unwrap_or_default(), t.pos),
        None => {
            cx.error_help(
                key.pos,
                format!("{what} has no `tool`"),
                "add `tool:` naming one of the workflow's tools",
            );
            (String::new(), key.pos)
        }
    };
    let needs: Vec<(String, Pos)> = match get(fields, "needs") {
        None => Vec::new(),
        Some(n) => match &n.value {
            Value::Str(s) => vec![(s.clone(), n.pos)],
            Value::Seq(items) => items
                .iter()
                .filter_map(|i| cx.string(i, "`needs` entries").map(|s| (s, i.pos)))
                .collect(),
            _ => {
                cx.error(
                    n.pos,
                    format!(
                        "`needs` must be a list of node ids, found {}",
                        n.type_name()
                    ),
                );
                Vec::new()
            }
        },
    };
    let condition = get(fields, "if").and_then(|n| condition(cx, n));
    Some(NodeDecl {
        id,
        pos: key.pos,
        tool,
        tool_pos,
        needs: needs.iter().map(|(id, _)| id.clone()).collect(),
        needs_pos: needs.iter().map(|(_, pos)| *pos).collect(),
        with: get(fields, "with")
            .map(|n| cx.tvalue(n, "`with`"))
            .unwrap_or_default(),
        condition,
        condition_pos: get(fields, "if").map(|n| n.pos),
        retry_policy: get(fields, "retry_policy").and_then(|n| retry_policy(cx, n)),
        timeout: get(fields, "timeout").and_then(|n| cx.duration(n, "`timeout`", MAX_TIMEOUT)),
        deadline: get(fields, "deadline").and_then(|n| cx.duration(n, "`deadline`", MAX_DEADLINE)),
        idempotency_key: get(fields, "idempotency_key")
            .and_then(|n| cx.template(n, "`idempotency_key`")),
        continue_on_error: get(fields, "continue_on_error")
            .and_then(|n| cx.bool(n, "`continue_on_error`"))
            .unwrap_or(false),
        description: get(fields, "description").and_then(|n| cx.text(n, "`description`")),
    })
}

/// An `if:`: always one expression, never a string whose truth is its non-emptiness.
///
/// `true` / `false` are themselves; a single `${{ expr }}`, whatever whitespace surrounds
/// it, is `expr`; a string without `${{ }}` is an expression too, as in GitHub Actions
/// (`if: inputs.go`, `if: "false"`). Text mixed with expressions (`"${{ a }} and
/// ${{ b }}"`, `"x ${{ a }}"`), an empty string and numbers are refused: each used to be
/// a non-empty string, which is always true.
fn condition(cx: &mut Cx, n: &Node) -> Option<Template> {
    let text = match &n.value {
        Value::Bool(b) => return Template::expression(&b.to_string(), n.pos).ok(),
        Value::Str(s) => s.trim(),
        _ => {
            cx.error_help(
                n.pos,
                format!(
                    "`if` must be true, false or an expression, found {}",
                    n.type_name()
                ),
                "write `if: true`, `if: false` or `if: ${{ inputs.go }}`",
            );
            return None;
        }
    };
    if text.is_empty() {
        cx.error_help(
            n.pos,
            "`if` is empty",
            "write `if: true`, `if: false` or an expression; remove `if` to always run",
        );
        return None;
    }
    let template = match Template::parse(text, n.pos) {
        Ok(t) => t,
        Err(e) => {
            cx.error(n.pos, format!("`if`: {e}"));
            return None;
        }
    };
    let src = match (template.whole_expr(), template.has_expr()) {
        (Some(src), _) => src.to_string(),
        (None, false) => text.to_string(),
        (None, true) => {
            cx.error_help(
                n.pos,
                format!("`if` must be one expression, found `{text}`"),
                "text around or between `${{ }}` makes a string, which is always true; put the whole condition in one `${{ … }}`, e.g. `${{ a and b }}`",
            );
            return None;
        }
    };
    match Template::expression(&src, n.pos) {
        Ok(t) => Some(t),
        Err(e) => {
            cx.error(n.pos, format!("`if`: {e}"));
            None
        }
    }
}

/// Node ids: `[a-z0-9_-]+` (they become step ids and appear in URLs and file names).
pub fn is_node_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// The `n` of a trailing `_retry<n>`, which would collide with retry step ids.
pub fn reserved_retry_suffix(id: &str) -> Option<&str> {
    let idx = id.rfind("_retry")?;
    let digits = &id[idx + "_retry".len()..];
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some(digits)
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("3 fortnights").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn node_ids_and_reserved_suffixes() {
        assert!(is_node_id("fetch-user_2"));
        assert!(!is_node_id("Fetch"));
        assert!(!is_node_id("a b"));
        assert_eq!(reserved_retry_suffix("charge_retry1"), Some("1"));
        assert_eq!(reserved_retry_suffix("charge_retry"), None);
        assert_eq!(reserved_retry_suffix("retry1"), None);
        assert_eq!(reserved_retry_suffix("charge_retryx"), None);
    }
}
