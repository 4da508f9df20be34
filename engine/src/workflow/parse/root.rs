//! The top level of a workflow file: its name, inputs, defaults, `max_parallel`, and the
//! `tools` and `nodes` maps handed to [`super::tools`] and [`super::nodes`].

use std::collections::BTreeMap;

use super::keys::{DEFAULTS_KEYS, MAX_DEADLINE, MAX_PARALLEL, MAX_TIMEOUT, TOP_KEYS};
use super::nodes::{node, retry_policy};
use super::tools::tool;
use super::{Cx, get};
use crate::workflow::model::{DEFAULT_MAX_PARALLEL, Defaults, Workflow};
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
        included: BTreeMap::new(),
        schedules: Vec::new(),
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
        wf.inputs = super::inputs::inputs(cx, n);
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
    if let Some(n) = get(entries, "included")
        && let Some(files) = cx.map(n, "`included`")
    {
        for (key, text) in files {
            // A file's text as is: its expressions are the file's, not this one's.
            match &text.value {
                crate::workflow::yaml::Value::Str(t) => {
                    wf.included.insert(key.name.clone(), t.clone());
                }
                _ => cx.error(
                    text.pos,
                    format!(
                        "an `included` file's text must be a string, found {}",
                        text.type_name()
                    ),
                ),
            }
        }
    }
    if let Some(n) = get(entries, "schedules") {
        wf.schedules = super::schedules::schedules(cx, n);
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
