//! `wait:` (a node that waits for a published event) and `callback:` (a node whose call
//! hands its downstream a URL to call back, then waits for it).

use std::time::Duration;

use super::condition::condition;
use super::keys::{CALLBACK_KEYS, MAX_WAIT, WAIT_EVENT_KEYS, WAIT_KEYS};
use super::{Cx, get};
use crate::workflow::model::{CallbackDecl, OnTimeout, WaitDecl};
use crate::workflow::yaml::Node;

/// `wait: { event: { name, match, lookback }, timeout, on_timeout }`.
pub(super) fn wait(cx: &mut Cx, node: &Node) -> Option<WaitDecl> {
    let fields = cx.map(node, "`wait`")?;
    cx.check_keys(fields, &[WAIT_KEYS], "`wait`");
    let Some(event) = get(fields, "event") else {
        cx.error_help(
            node.pos,
            "`wait` has no `event`",
            "add `event: { name: shipment.delivered }` (the name events are published under)",
        );
        return None;
    };
    let ev = cx.map(event, "`wait.event`")?;
    cx.check_keys(ev, &[WAIT_EVENT_KEYS], "`wait.event`");
    let name = match get(ev, "name") {
        Some(n) => cx.string(n, "`wait.event.name`")?,
        None => {
            cx.error_help(
                event.pos,
                "`wait.event` has no `name`",
                "add `name:` (e.g. `shipment.delivered`)",
            );
            return None;
        }
    };
    if name.trim().is_empty() || name.len() > 200 {
        cx.error(event.pos, "`wait.event.name` must be 1 to 200 characters");
    }
    let matcher = get(ev, "match").and_then(|n| condition(cx, n, "wait.event.match"));
    let lookback = get(ev, "lookback")
        .and_then(|n| cx.duration(n, "`wait.event.lookback`", MAX_WAIT))
        .unwrap_or(Duration::ZERO);
    let timeout = required_timeout(cx, fields, node, "wait")?;
    Some(WaitDecl {
        pos: node.pos,
        event: name,
        matcher,
        lookback,
        timeout,
        on_timeout: on_timeout(cx, fields, "wait"),
    })
}

/// `callback: { timeout, heartbeat, on_timeout }`.
pub(super) fn callback(cx: &mut Cx, node: &Node) -> Option<CallbackDecl> {
    let fields = cx.map(node, "`callback`")?;
    cx.check_keys(fields, &[CALLBACK_KEYS], "`callback`");
    let timeout = required_timeout(cx, fields, node, "callback")?;
    let heartbeat =
        get(fields, "heartbeat").and_then(|n| cx.duration(n, "`callback.heartbeat`", MAX_WAIT));
    if let (Some(hb), Some(n)) = (heartbeat, get(fields, "heartbeat"))
        && hb >= timeout
    {
        cx.error(
            n.pos,
            "`callback.heartbeat` at or after the `timeout` never matters",
        );
    }
    Some(CallbackDecl {
        pos: node.pos,
        timeout,
        heartbeat,
        on_timeout: on_timeout(cx, fields, "callback"),
    })
}

fn required_timeout(
    cx: &mut Cx,
    fields: &[(crate::workflow::yaml::Key, Node)],
    node: &Node,
    what: &str,
) -> Option<Duration> {
    match get(fields, "timeout") {
        Some(n) => cx.duration(n, &format!("`{what}.timeout`"), MAX_WAIT),
        None => {
            cx.error_help(
                node.pos,
                format!("`{what}` has no `timeout`"),
                "add `timeout:` (e.g. `2d`): nothing may wait for ever",
            );
            None
        }
    }
}

fn on_timeout(cx: &mut Cx, fields: &[(crate::workflow::yaml::Key, Node)], what: &str) -> OnTimeout {
    let Some(n) = get(fields, "on_timeout") else {
        return OnTimeout::Fail;
    };
    match cx.string(n, &format!("`{what}.on_timeout`")).as_deref() {
        Some("fail") | None => OnTimeout::Fail,
        Some("skip") => OnTimeout::Skip,
        Some(other) => {
            cx.error_help(
                n.pos,
                format!("unknown `on_timeout` `{other}`"),
                "use `fail` or `skip`",
            );
            OnTimeout::Fail
        }
    }
}
