//! The top level of a workflow file: its name, inputs, defaults, `max_parallel`, and the
//! `tools` and `nodes` maps handed to [`super::tools`] and [`super::nodes`].

use std::collections::BTreeMap;

use super::keys::{DEFAULTS_KEYS, INPUT_KEYS, MAX_DEADLINE, MAX_PARALLEL, MAX_TIMEOUT, TOP_KEYS};
use super::names::is_identifier;
use super::nodes::{node, retry_policy};
use super::tools::tool;
use super::{Cx, get};
use crate::workflow::diagnostic::did_you_mean;
use crate::workflow::model::{DEFAULT_MAX_PARALLEL, Defaults, InputDecl, InputType, Workflow};
use crate::workflow::yaml::Node;

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
            cx.constant(d, &format!("the default of {what}"));
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
