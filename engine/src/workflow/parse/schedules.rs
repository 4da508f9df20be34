//! `schedules:` — when a workflow should run by itself. Each item's fields are checked
//! as `flow.toml`'s `[[schedules]]` are ([`crate::workflow::schedule_fields`]), with problems at
//! the item's line and column; `flow schedules apply FILE` stores them.

use super::keys::SCHEDULE_KEYS;
use super::{Cx, get};
use crate::workflow::diagnostic::Pos;
use crate::workflow::model::WorkflowSchedule;
use crate::workflow::schedule_fields::Written;
use crate::workflow::yaml::{Node, Value};

/// The `schedules:` list: each item checked, ids unique.
pub(super) fn schedules(cx: &mut Cx, node: &Node) -> Vec<WorkflowSchedule> {
    let Value::Seq(items) = &node.value else {
        cx.error(
            node.pos,
            format!(
                "`schedules` must be a list of schedules (`- id: …`), found {}",
                node.type_name()
            ),
        );
        return Vec::new();
    };
    let mut out: Vec<WorkflowSchedule> = Vec::with_capacity(items.len());
    for item in items {
        let Some(s) = one(cx, item) else { continue };
        if let Some(first) = out.iter().find(|o| o.fields.id == s.fields.id) {
            cx.error_help(
                s.at,
                format!("duplicate schedule id `{}`", s.fields.id),
                format!(
                    "`{}` is first defined at line {}",
                    s.fields.id, first.at.line
                ),
            );
            continue;
        }
        out.push(s);
    }
    out
}

/// One item, or `None` (its problems reported).
fn one(cx: &mut Cx, item: &Node) -> Option<WorkflowSchedule> {
    let entries = cx.map(item, "a schedule")?;
    cx.check_keys(entries, &[SCHEDULE_KEYS], "a schedule");
    let mut field = |key: &str| -> Option<(String, Pos)> {
        let n = get(entries, key)?;
        cx.string(n, &format!("schedule `{key}`"))
            .map(|v| (v, n.pos))
    };
    let (id, cron) = (field("id"), field("cron"));
    let (timezone, overlap, catchup_window) =
        (field("timezone"), field("overlap"), field("catchup_window"));
    let inputs = match get(entries, "inputs") {
        None => (serde_json::Map::new(), item.pos),
        Some(n) => {
            cx.map(n, "schedule `inputs`")?;
            cx.check_duplicates_deep(n, "schedule `inputs`");
            match n.to_json() {
                serde_json::Value::Object(m) => (m, n.pos),
                _ => (serde_json::Map::new(), n.pos),
            }
        }
    };
    let (Some(id), Some(cron)) = (id, cron) else {
        for key in ["id", "cron"] {
            if get(entries, key).is_none() {
                cx.error_help(
                    item.pos,
                    format!("a schedule has no `{key}`"),
                    "a schedule needs `id:` and `cron:` (e.g. `cron: \"0 2 * * *\"`)",
                );
            }
        }
        return None;
    };
    let written = Written {
        id,
        cron,
        timezone,
        inputs,
        overlap,
        catchup_window,
    };
    match written.check() {
        Ok(fields) => Some(WorkflowSchedule {
            at: item.pos,
            fields,
        }),
        Err((at, message)) => {
            cx.error(at, message);
            None
        }
    }
}
