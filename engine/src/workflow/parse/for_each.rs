//! `for_each:` on a node: the list, the item's key, and the limits (`max_items`,
//! `concurrency`, `tolerate`, `in_doubt`).

use super::keys::{FOR_EACH_KEYS, MAX_PARALLEL, TOLERATE_KEYS};
use super::{Cx, get};
use crate::workflow::model::{DEFAULT_MAX_ITEMS, ForEachDecl, MAX_MAX_ITEMS, Tolerance};
use crate::workflow::yaml::{Node, Value};

/// `for_each: { items, key, max_items, concurrency, tolerate, in_doubt }`.
pub(super) fn for_each(cx: &mut Cx, node: &Node) -> Option<ForEachDecl> {
    let fields = cx.map(node, "`for_each`")?;
    cx.check_keys(fields, &[FOR_EACH_KEYS], "`for_each`");
    let Some(items) = get(fields, "items") else {
        cx.error_help(
            node.pos,
            "`for_each` has no `items`",
            "add `items: \"${{ nodes.<id>.output.<list> }}\"` (a JSON array)",
        );
        return None;
    };
    let items = cx.tvalue(items, "`for_each.items`");
    let key = match get(fields, "key") {
        Some(n) => cx.template(n, "`for_each.key`")?,
        None => {
            cx.error_help(
                node.pos,
                "`for_each` has no `key`",
                "add `key: \"${{ item.id }}\"`: an item's identity, never its position, names its step and its call's idempotency key",
            );
            return None;
        }
    };
    if !key.has_expr() {
        cx.error_help(
            node.pos,
            "`for_each.key` is a constant: every item would have the same key",
            "read the item: `key: \"${{ item.id }}\"`",
        );
    }
    let max_items = get(fields, "max_items")
        .and_then(|n| cx.count(n, "`for_each.max_items`", 1, u64::from(MAX_MAX_ITEMS)))
        .map_or(DEFAULT_MAX_ITEMS, |v| v as u32);
    let concurrency = get(fields, "concurrency")
        .and_then(|n| cx.count(n, "`for_each.concurrency`", 1, u64::from(MAX_PARALLEL)))
        .map(|v| v as u32);
    if let Some(n) = get(fields, "in_doubt") {
        match cx.string(n, "`for_each.in_doubt`").as_deref() {
            Some("hold") | None => {}
            Some(other) => cx.error_help(
                n.pos,
                format!("unknown `for_each.in_doubt` `{other}`"),
                "use `hold`: an item in doubt holds only itself, and the run pauses once nothing else can run",
            ),
        }
    }
    let tolerate = get(fields, "tolerate")
        .and_then(|n| tolerate(cx, n))
        .unwrap_or(Tolerance::Count(0));
    Some(ForEachDecl {
        pos: node.pos,
        items,
        key,
        max_items,
        concurrency,
        tolerate,
    })
}

/// `tolerate: { failed: 3 }` or `tolerate: { failed: "2%" }`.
fn tolerate(cx: &mut Cx, node: &Node) -> Option<Tolerance> {
    let fields = cx.map(node, "`for_each.tolerate`")?;
    cx.check_keys(fields, &[TOLERATE_KEYS], "`for_each.tolerate`");
    let n = get(fields, "failed")?;
    match &n.value {
        Value::Int(_) => cx
            .count(n, "`tolerate.failed`", 0, u64::from(MAX_MAX_ITEMS))
            .map(|c| Tolerance::Count(c as u32)),
        Value::Str(s) => {
            let pct = s
                .trim()
                .strip_suffix('%')
                .and_then(|p| p.trim().parse::<f64>().ok())
                .filter(|p| (0.0..=100.0).contains(p));
            if pct.is_none() {
                cx.error_help(
                    n.pos,
                    format!("`tolerate.failed` must be a count or a percentage, found `{s}`"),
                    "write `failed: 3` or `failed: \"2%\"` (0% to 100%)",
                );
            }
            pct.map(Tolerance::Percent)
        }
        _ => {
            cx.error(
                n.pos,
                format!(
                    "`tolerate.failed` must be a count or a percentage, found {}",
                    n.type_name()
                ),
            );
            None
        }
    }
}
