//! Nodes: the tool a node calls, what it needs, `with`, `if`, its retry policy (also
//! the shape of `defaults.retry_policy`), timeout, deadline, idempotency key and flags.

use std::time::Duration;

use super::keys::{
    APPROVAL_KEYS, APPROVER_ROLES, APPROVERS_KEYS, BACKOFF_KEYS, CHILD_NODE_KEYS, MAX_APPROVERS,
    MAX_DEADLINE, MAX_REMINDERS, MAX_RETRIES, MAX_TIMEOUT, NODE_KEYS, RETRY_KEYS, WAIT_NODE_KEYS,
};
use super::names::{is_node_id, reserved_retry_suffix};
use super::values::string_list;
use super::{Cx, get};
use crate::workflow::diagnostic::Pos;
use crate::workflow::model::RetryPolicy;
use crate::workflow::model::{ApprovalDecl, CallDecl, ChildDecl, NodeDecl, NodeKind, OnTimeout};
use crate::workflow::yaml::{Key, Node, Value};
use flow_ledger::OnParentCancel;

pub(super) fn node(cx: &mut Cx, key: &Key, spec: &Node) -> Option<NodeDecl> {
    let id = key.name.clone();
    let what = format!("node `{id}`");
    if !is_node_id(&id) {
        cx.error_help(
            key.pos,
            format!("invalid node id `{id}`"),
            "node ids use 1 to 128 lower-case letters, digits, `_` and `-`",
        );
    } else if let Some(n) = reserved_retry_suffix(&id) {
        cx.error_help(
            key.pos,
            format!("node id `{id}` ends in `_retry{n}`, which is reserved for retry steps"),
            "rename the node; retries of node `x` are recorded as steps `x_retry1`, `x_retry2`, …",
        );
    }
    let fields = cx.map(spec, &what)?;
    let waits = get(fields, "wait").is_some();
    let child = get(fields, "workflow").is_some();
    if child {
        // A sub-workflow node calls no tool either.
        cx.check_keys(
            fields,
            &[CHILD_NODE_KEYS],
            &format!("{what} (a `workflow:` node)"),
        );
    } else if waits {
        // A `wait:` node calls no tool: what a call would need is refused by name.
        cx.check_keys(
            fields,
            &[WAIT_NODE_KEYS],
            &format!("{what} (a `wait:` node)"),
        );
    } else {
        cx.check_keys(fields, &[NODE_KEYS], &what);
    }
    // A `wait:` or `workflow:` that does not parse is reported; the node stays (as a
    // call of no tool, which nothing else reports) so its dependents raise nothing more.
    let unparsed = || {
        NodeKind::Call(CallDecl {
            tool: String::new(),
            tool_pos: key.pos,
            approval: None,
            callback: None,
        })
    };
    let kind = if child {
        get(fields, "workflow")
            .and_then(|n| child_decl(cx, n, fields))
            .map_or_else(unparsed, NodeKind::Child)
    } else if waits {
        get(fields, "wait")
            .and_then(|n| super::waits::wait(cx, n))
            .map_or_else(unparsed, NodeKind::Wait)
    } else {
        NodeKind::Call(call_decl(cx, key, fields, &what))
    };
    let needs = get(fields, "needs").map_or_else(Vec::new, |n| needs(cx, n));
    let condition = get(fields, "if").and_then(|n| super::condition::condition(cx, n, "if"));
    Some(NodeDecl {
        id,
        pos: key.pos,
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
        for_each: get(fields, "for_each").and_then(|n| super::for_each::for_each(cx, n)),
        kind,
    })
}

/// A node's `needs:`: one node id or a list of them, each with where it was written.
fn needs(cx: &mut Cx, n: &Node) -> Vec<(String, Pos)> {
    match &n.value {
        Value::Str(s) => vec![(s.clone(), n.pos)],
        Value::Seq(items) => items
            .iter()
            .filter_map(|i| cx.string(i, "`needs` entries").map(|s| (s, i.pos)))
            .collect(),
        _ => {
            let found = n.type_name();
            cx.error(
                n.pos,
                format!("`needs` must be a list of node ids, found {found}"),
            );
            Vec::new()
        }
    }
}

/// What a node that calls a tool declares: its `tool:` (an error when missing), its
/// `approval:` and `callback:`.
fn call_decl(cx: &mut Cx, key: &Key, fields: &[(Key, Node)], what: &str) -> CallDecl {
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
    CallDecl {
        tool,
        tool_pos,
        approval: get(fields, "approval").and_then(|n| approval(cx, n)),
        callback: get(fields, "callback").and_then(|n| super::waits::callback(cx, n)),
    }
}

/// `workflow: PATH` and the node's `on_parent_cancel:` (`cancel`, the default, or
/// `abandon`).
fn child_decl(cx: &mut Cx, node: &Node, fields: &[(Key, Node)]) -> Option<ChildDecl> {
    let path = cx.string(node, "`workflow`")?;
    if path.trim().is_empty() {
        cx.error_help(
            node.pos,
            "`workflow` is empty",
            "name the child workflow's file, relative to this one: `workflow: provision.yaml`",
        );
        return None;
    }
    let on_parent_cancel = match get(fields, "on_parent_cancel") {
        None => OnParentCancel::Cancel,
        Some(n) => match cx.string(n, "`on_parent_cancel`").as_deref() {
            Some("cancel") => OnParentCancel::Cancel,
            Some("abandon") => OnParentCancel::Abandon,
            Some(other) => {
                cx.error_help(
                    n.pos,
                    format!("`on_parent_cancel` must be `cancel` or `abandon`, found `{other}`"),
                    "`cancel` (the default) cancels the child with its parent; `abandon` lets it run on",
                );
                OnParentCancel::Cancel
            }
            None => OnParentCancel::Cancel,
        },
    };
    Some(ChildDecl {
        pos: node.pos,
        path,
        on_parent_cancel,
    })
}

/// `approval:`: who approves (roles, token names, how many), `forbid_self`, the inputs
/// approvers give, the required `timeout`, `on_timeout` and reminders.
fn approval(cx: &mut Cx, node: &Node) -> Option<ApprovalDecl> {
    let fields = cx.map(node, "`approval`")?;
    cx.check_keys(fields, &[APPROVAL_KEYS], "`approval`");
    let (mut roles, mut tokens, mut min) = (Vec::new(), Vec::new(), 1u32);
    if let Some(a) = get(fields, "approvers")
        && let Some(who) = cx.map(a, "`approval.approvers`")
    {
        cx.check_keys(who, &[APPROVERS_KEYS], "`approval.approvers`");
        if let Some(n) = get(who, "roles") {
            roles = string_list(cx, n, "`approvers.roles`");
            for r in &roles {
                if !APPROVER_ROLES.contains(&r.as_str()) {
                    cx.error_help(
                        n.pos,
                        format!("`approvers.roles` names unknown role `{r}`"),
                        "approvers are `operator` or `admin` tokens (a `viewer` never decides)",
                    );
                }
            }
        }
        if let Some(n) = get(who, "tokens") {
            tokens = string_list(cx, n, "`approvers.tokens`");
        }
        if let Some(n) = get(who, "min") {
            min = cx
                .count(n, "`approvers.min`", 1, u64::from(MAX_APPROVERS))
                .map_or(1, |v| v as u32);
            if !tokens.is_empty() && roles.is_empty() && (tokens.len() as u64) < u64::from(min) {
                cx.error_help(
                    n.pos,
                    format!(
                        "`approvers.min` is {min} but only {} token(s) may approve",
                        tokens.len()
                    ),
                    "name more tokens, add `roles`, or lower `min`",
                );
            }
        }
    }
    let timeout = match get(fields, "timeout") {
        Some(n) => cx.duration(n, "`approval.timeout`", MAX_DEADLINE)?,
        None => {
            cx.error_help(
                node.pos,
                "`approval` has no `timeout`",
                "add `timeout:` (e.g. `4h`): an approval nobody decides must not wait for ever",
            );
            return None;
        }
    };
    let on_timeout = match get(fields, "on_timeout") {
        None => OnTimeout::Fail,
        Some(n) => match cx.string(n, "`approval.on_timeout`").as_deref() {
            Some("fail") => OnTimeout::Fail,
            Some("skip") => OnTimeout::Skip,
            Some(other) => {
                cx.error_help(
                    n.pos,
                    format!("unknown `on_timeout` `{other}`"),
                    "use `fail` or `skip` (a timeout never approves)",
                );
                OnTimeout::Fail
            }
            None => OnTimeout::Fail,
        },
    };
    let mut remind = Vec::new();
    if let Some(n) = get(fields, "remind") {
        match &n.value {
            Value::Seq(items) if items.len() <= MAX_REMINDERS => {
                for item in items {
                    if let Some(d) = cx.duration(item, "`approval.remind` entries", MAX_DEADLINE) {
                        if d >= timeout {
                            cx.error(
                                item.pos,
                                "a reminder at or after the `timeout` is never sent",
                            );
                        }
                        remind.push(d);
                    }
                }
                remind.sort();
            }
            _ => cx.error(
                n.pos,
                format!("`approval.remind` must be a list of at most {MAX_REMINDERS} durations"),
            ),
        }
    }
    Some(ApprovalDecl {
        pos: node.pos,
        message: get(fields, "message").and_then(|n| cx.template(n, "`approval.message`")),
        roles,
        tokens,
        min,
        forbid_self: get(fields, "forbid_self")
            .and_then(|n| cx.bool(n, "`forbid_self`"))
            .unwrap_or(false),
        inputs: get(fields, "inputs").map_or_else(Vec::new, |n| super::inputs::inputs(cx, n)),
        timeout,
        on_timeout,
        remind,
    })
}

pub(super) fn retry_policy(cx: &mut Cx, node: &Node) -> Option<RetryPolicy> {
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
