//! A tool's `reconcile:` block: the probe (an HTTP request, another tool of the same MCP
//! server, or a command), the two verdict expressions and the probing schedule.

use super::condition::condition;
use super::keys::{MAX_TIMEOUT, RECONCILE_KEYS, RECONCILE_REQUEST_KEYS};
use super::values::parse_duration;
use super::{Cx, get};
use crate::workflow::tool::{
    DEFAULT_MAX_PROBES, DEFAULT_MAX_RESENDS, DEFAULT_PROBE_INTERVAL, DEFAULT_RECONCILE_AFTER,
    Probe, Reconcile,
};
use crate::workflow::yaml::{Key, Node, Value};
use std::time::Duration;

/// Most probes a block may declare: a probe is cheap, but a call stuck in doubt for a
/// thousand probes needs a human long before.
const MAX_PROBES: u64 = 100;
/// Most `reconcile.max_resends`: each re-send may be executed by a lagging downstream.
const MAX_RESENDS: u64 = 10;

/// `reconcile:` of a tool of kind `kind` (`http`, `mcp`, `command`; `function` tools run
/// in flow's own process and have nothing to ask).
pub(super) fn reconcile(cx: &mut Cx, node: &Node, kind: &str) -> Option<Reconcile> {
    let what = "`reconcile`";
    let fields = cx.map(node, what)?;
    cx.check_keys(fields, &[RECONCILE_KEYS], what);
    let probe = match kind {
        "http" => {
            let Some(request) = get(fields, "request") else {
                cx.error_help(
                    node.pos,
                    "`reconcile` of an http tool needs `request`",
                    "e.g. `request: { method: GET, url: \"https://api.example/charges/${{ call.key }}\" }`",
                );
                return None;
            };
            http_probe(cx, request)?
        }
        "mcp" => {
            let Some(tool) = get(fields, "tool") else {
                cx.error_help(
                    node.pos,
                    "`reconcile` of an mcp tool needs `tool` (another tool of the same server)",
                    "e.g. `tool: find_charge` with `with: { key: \"${{ call.key }}\" }`",
                );
                return None;
            };
            Probe::Mcp {
                tool: cx.string(tool, "`reconcile.tool`")?,
                with: get(fields, "with")
                    .map(|n| cx.tvalue(n, "`reconcile.with`"))
                    .unwrap_or_default(),
            }
        }
        "command" => {
            let Some(command) = get(fields, "command") else {
                cx.error(node.pos, "`reconcile` of a command tool needs `command`");
                return None;
            };
            let argv = cx.template_list(command, "`reconcile.command`");
            if argv.is_empty() {
                cx.error(command.pos, "`reconcile.command` must name a program");
            }
            Probe::Command {
                command: argv,
                env: get(fields, "env")
                    .map(|n| cx.template_map(n, "`reconcile.env`"))
                    .unwrap_or_default(),
            }
        }
        other => {
            cx.error_help(
                node.pos,
                format!("`reconcile` does not apply to {other} tools"),
                "a function runs inside flow, so its calls are never in doubt; reconcile http, mcp and command tools",
            );
            return None;
        }
    };
    misplaced_keys(cx, fields, kind);
    let verdict = |cx: &mut Cx, name: &str| -> Option<_> {
        match get(fields, name) {
            Some(n) => condition(cx, n, &format!("reconcile.{name}")),
            None => {
                cx.error_help(
                    node.pos,
                    format!("`reconcile` is missing `{name}`"),
                    "both `found` and `not_found` are needed: an answer that is neither leaves the call in doubt",
                );
                None
            }
        }
    };
    let found = verdict(cx, "found");
    let not_found = verdict(cx, "not_found");
    // `after: 0s` is meaningful (a downstream that records a request before it
    // answers anything): the one duration here that may be zero.
    let after = match get(fields, "after") {
        Some(n) if matches!(&n.value, Value::Str(t) if parse_duration(t).is_ok_and(|d| d.is_zero())) => {
            Duration::ZERO
        }
        Some(n) => cx.duration(n, "`reconcile.after`", MAX_TIMEOUT)?,
        None => DEFAULT_RECONCILE_AFTER,
    };
    let interval = match get(fields, "interval") {
        Some(n) => cx.duration(n, "`reconcile.interval`", MAX_TIMEOUT)?,
        None => DEFAULT_PROBE_INTERVAL,
    };
    let max_probes = budget(cx, fields, "max_probes", 1, MAX_PROBES, DEFAULT_MAX_PROBES)?;
    let max_resends = budget(
        cx,
        fields,
        "max_resends",
        0,
        MAX_RESENDS,
        DEFAULT_MAX_RESENDS,
    )?;
    let timeout =
        get(fields, "timeout").and_then(|n| cx.duration(n, "`reconcile.timeout`", MAX_TIMEOUT));
    Some(Reconcile {
        pos: node.pos,
        probe,
        found: found?,
        not_found: not_found?,
        output: get(fields, "output").map(|n| cx.tvalue(n, "`reconcile.output`")),
        after,
        max_probes,
        max_resends,
        interval,
        timeout,
    })
}

/// Reports the probe keys of another tool kind (`request` on an mcp tool, …).
fn misplaced_keys(cx: &mut Cx, fields: &[(Key, Node)], kind: &str) {
    let misplaced: &[&str] = match kind {
        "http" => &["tool", "with", "command", "env"],
        "mcp" => &["request", "command", "env"],
        _ => &["request", "tool", "with"],
    };
    for (key, _) in fields {
        if misplaced.contains(&key.name.as_str()) {
            cx.error(
                key.pos,
                format!("`reconcile.{}` does not apply to {kind} tools", key.name),
            );
        }
    }
}

/// One of the block's budgets (`max_probes`, `max_resends`): `min..=max`, or `default`.
fn budget(
    cx: &mut Cx,
    fields: &[(Key, Node)],
    name: &str,
    min: u64,
    max: u64,
    default: u32,
) -> Option<u32> {
    match get(fields, name) {
        Some(n) => u32::try_from(cx.count(n, &format!("`reconcile.{name}`"), min, max)?).ok(),
        None => Some(default),
    }
}

fn http_probe(cx: &mut Cx, request: &Node) -> Option<Probe> {
    let what = "`reconcile.request`";
    let fields = cx.map(request, what)?;
    cx.check_keys(fields, &[RECONCILE_REQUEST_KEYS], what);
    let method = match get(fields, "method") {
        None => "GET".to_string(),
        Some(n) => {
            let m = cx
                .string(n, "`reconcile.request.method`")?
                .to_ascii_uppercase();
            if !["GET", "HEAD"].contains(&m.as_str()) {
                cx.error_help(
                    n.pos,
                    format!("`reconcile.request.method` `{m}` is not a probe"),
                    "a probe only reads: use GET or HEAD",
                );
                return None;
            }
            m
        }
    };
    let Some(url) = get(fields, "url") else {
        cx.error(request.pos, "`reconcile.request` needs `url`");
        return None;
    };
    let url = cx.template(url, "`reconcile.request.url`")?;
    Some(Probe::Http {
        method,
        url,
        headers: get(fields, "headers")
            .map(|n| cx.template_map(n, "`reconcile.request.headers`"))
            .unwrap_or_default(),
        query: get(fields, "query")
            .map(|n| cx.template_map(n, "`reconcile.request.query`"))
            .unwrap_or_default(),
    })
}
