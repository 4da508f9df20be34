//! A `for_each` node's list: evaluated when its parents are settled ([`RunScope::expand`]),
//! merged with what an earlier execution started, stored once in the ledger before any
//! item starts; and the node's own step written when its items are done
//! ([`RunScope::close`]).
//!
//! The merge keeps the promise that an item's call is sent at most once under a key that
//! never changes: items are matched by key, never by position, so a list re-evaluated
//! in another order (or with items added) finds each started item's state again; an
//! item that vanished after its call was sent is kept (with the item stored before); one
//! that vanished before is recorded skipped and reported.

use std::collections::HashMap;

use flow_ledger::{ErrorKind, Fanout, NewStep, StepFinish, StepStatus};
use serde_json::Value as Json;

use super::node::Fan;
use super::node::NodeState;
use super::progress::StepEvent;
use super::scope::{RunScope, StepAt, lease_err, reads_opaquely};
use super::state::{OwnStep, RunState};
use crate::gateway::{self, StepOrigin};
use crate::item_id::item_step_id;
use crate::workflow::expr;
use crate::workflow::model::ForEachDecl;

/// Longest item key: it is part of a step id and of an idempotency key header.
const MAX_KEY_LEN: usize = 200;

impl RunScope<'_> {
    /// Evaluates `node`'s `if` and list, merges them with the items already recorded and
    /// stores the list; the node then holds its items' states. A list that cannot be
    /// used (not an array, too long, a bad or repeated key) fails the node before any
    /// item is sent.
    pub(super) async fn expand(
        &self,
        st: &mut RunState,
        node: usize,
    ) -> Result<(), gateway::Error> {
        let decl = &self.wf.nodes[node];
        let Some(fe) = &decl.for_each else {
            return Ok(());
        };
        self.read_approvals(st, node).await?;
        let mut reads = self.prepared.reads[node].clone();
        reads.extend(&self.prepared.lists[node]);
        reads.sort_unstable();
        reads.dedup();
        // Every input: the list is evaluated once per expansion, and what an expression
        // reads through a slice or a filter is not always listed by its references.
        let ctx = self.context_reading(st, node, &reads);
        let own = own_step(st, node, &decl.id);
        let at = StepAt {
            node,
            step_id: &own.step_id,
            retry: own.retry,
            origin: own.origin,
            item: None,
        };
        if let Some(cond) = &decl.condition {
            match expr::eval_condition(cond, &ctx) {
                Ok(true) => {}
                Ok(false) => return self.skip(st, node, "its `if` condition is false").await,
                Err(e) => {
                    let message = format!("`if` of node `{}`: {e}", decl.id);
                    return self.fail_now(st, at, ErrorKind::Permanent, message).await;
                }
            }
        }
        let list = match evaluate(fe, &decl.id, ctx) {
            Ok(list) => list,
            Err(message) => return self.fail_now(st, at, ErrorKind::Permanent, message).await,
        };
        let listed = list.len();
        let loaded = st.items.remove(&node).unwrap_or_default();
        let stored = self.stored_list(&decl.id).await?;
        let merged = merge(list, stored, &loaded);
        let now = self.gateway.now();
        let wrap = |e| lease_err(e, self.lease());
        self.writer.flush(now).await.map_err(wrap)?;
        let fanout = Fanout {
            node_id: decl.id.clone(),
            items: Json::Array(merged.items),
            keys: merged.keys,
            vanished: merged.vanished,
            created_at: now,
            updated_at: now,
        };
        self.gateway
            .ledger()
            .record_fanout(self.lease(), &fanout, now)
            .await
            .map_err(wrap)?;
        // The list is held once: taken back from what was stored.
        let Fanout {
            items,
            mut keys,
            vanished,
            ..
        } = fanout;
        let mut items = match items {
            Json::Array(items) => items,
            _ => Vec::new(),
        };
        // A key that vanished before its call was sent: recorded skipped, never sent.
        for key in vanished {
            if !matches!(loaded.get(&key), Some(NodeState::Skipped)) {
                let step = NewStep {
                    step_id: item_step_id(&decl.id, &key, 0),
                    node_id: decl.id.clone(),
                    retry: 0,
                    not_before: None,
                    status: StepStatus::Skipped,
                };
                self.writer.create_step(step, now).await.map_err(wrap)?;
            }
            keys.push(key);
            items.push(Json::Null);
        }
        let mut states = loaded;
        for key in &keys[merged.listed_and_kept..] {
            states.insert(key.clone(), NodeState::Skipped);
        }
        let limit = fe.concurrency.unwrap_or(self.wf.max_parallel) as usize;
        let tolerated = fe.tolerate.allowed(listed);
        let mut fan = Fan::new(&decl.id, keys, items, states, limit, tolerated);
        if !self.prepared.output_read[node] {
            fan = fan.without_outputs();
        }
        tracing::info!(node = %decl.id, items = fan.len(), "for_each: list evaluated");
        st.nodes[node] = NodeState::FanOut(Box::new(fan));
        Ok(())
    }

    /// Writes the step of a `for_each` node whose items are done: its counts, or the
    /// failure naming the failed items; the node then holds its outcome.
    pub(super) async fn close(&self, st: &mut RunState, node: usize) -> Result<(), gateway::Error> {
        let NodeState::FanOut(fan) = &st.nodes[node] else {
            return Ok(());
        };
        let failure = fan.failure();
        let summary = fan.summary();
        let decl = &self.wf.nodes[node];
        let now = self.gateway.now();
        let wrap = |e| lease_err(e, self.lease());
        let own = own_step(st, node, &decl.id);
        let step = NewStep {
            step_id: own.step_id.clone(),
            node_id: decl.id.clone(),
            retry: own.retry,
            not_before: None,
            status: StepStatus::Running,
        };
        self.writer
            .open_step(own.origin, step, now)
            .await
            .map_err(wrap)?;
        let error = match &failure {
            Some(message) => {
                self.writer
                    .fail_step(&own.step_id, ErrorKind::Permanent, message.clone(), now)
                    .await
                    .map_err(wrap)?;
                Some(message.as_str())
            }
            None => {
                let finish = StepFinish {
                    step_id: own.step_id.clone(),
                    status: StepStatus::Succeeded,
                    output: Some(summary.clone()),
                    error: None,
                };
                self.writer.finish_step(finish, now).await.map_err(wrap)?;
                None
            }
        };
        self.progress.step(StepEvent::Closed {
            node: &decl.id,
            counts: &summary,
            error,
        });
        if let NodeState::FanOut(fan) = std::mem::replace(&mut st.nodes[node], NodeState::Skipped) {
            st.nodes[node] = fan.into_outcome();
        }
        Ok(())
    }

    /// The list stored for `node` of this run, if it was evaluated.
    async fn stored_list(&self, node: &str) -> Result<Option<Fanout>, gateway::Error> {
        self.gateway
            .ledger()
            .get_fanout(&self.lease().run_id, node)
            .await
            .map_err(gateway::Error::Ledger)
    }

    /// Rebuilds the output of the `for_each` nodes recorded as succeeded (their step
    /// holds the counts; the output holds every item's) from their stored lists and
    /// their items' steps.
    pub(super) async fn rebuild_fans(&self, st: &mut RunState) -> Result<(), gateway::Error> {
        for node in std::mem::take(&mut st.rebuild) {
            let decl = &self.wf.nodes[node];
            let Some(stored) = self.stored_list(&decl.id).await? else {
                continue;
            };
            let mut keys = stored.keys;
            keys.extend(stored.vanished);
            let items = vec![Json::Null; keys.len()];
            let loaded = st.items.remove(&node).unwrap_or_default();
            let mut fan = Fan::new(&decl.id, keys, items, loaded, 1, usize::MAX);
            if !self.prepared.output_read[node] {
                fan = fan.without_outputs();
            }
            st.nodes[node] = NodeState::Succeeded {
                output: fan.into_output(),
            };
        }
        Ok(())
    }
}

/// A `for_each` node's own step row: none yet (`node`, created as it closes), or the
/// one it reopened (left unfinished by an execution that stopped while the node
/// closed, or a redrive's next attempt).
fn own_step(st: &RunState, node: usize, id: &str) -> OwnStep {
    st.reopened.get(&node).cloned().unwrap_or_else(|| OwnStep {
        step_id: id.to_string(),
        retry: 0,
        origin: StepOrigin::New,
    })
}

/// A list merged with what an earlier execution stored and started.
struct Merged {
    /// The keys: the list's, then those kept because their call was sent.
    keys: Vec<String>,
    /// The items, same order.
    items: Vec<Json>,
    /// How many of `keys` are listed or kept (the rest, added later, vanished).
    listed_and_kept: usize,
    /// Keys that vanished before anything was sent (earlier ones included).
    vanished: Vec<String>,
}

/// Merges the evaluated `list` with the `stored` one: every listed item; each stored
/// item missing from the list whose step exists in `loaded` (it was started, so its
/// call may have been sent) is kept with its stored item; each one never started has
/// vanished.
fn merge(
    list: Vec<(String, Json)>,
    stored: Option<Fanout>,
    loaded: &HashMap<String, NodeState>,
) -> Merged {
    let (mut keys, mut items): (Vec<String>, Vec<Json>) = list.into_iter().unzip();
    let listed: HashMap<String, usize> = keys.iter().cloned().zip(0..).collect();
    let mut vanished = Vec::new();
    if let Some(stored) = stored {
        let old_items = match stored.items {
            Json::Array(a) => a,
            _ => Vec::new(),
        };
        let mut old_items = old_items.into_iter();
        for key in stored.keys {
            let item = old_items.next().unwrap_or(Json::Null);
            let started = !matches!(loaded.get(&key), None | Some(NodeState::NotStarted));
            if let Some(&at) = listed.get(&key) {
                // A started item keeps the item it was started with: its request
                // must stay the one already claimed (or sent).
                if started {
                    items[at] = item;
                }
                continue;
            }
            match loaded.get(&key) {
                None | Some(NodeState::NotStarted | NodeState::Skipped) => vanished.push(key),
                Some(_) => {
                    keys.push(key);
                    items.push(item);
                }
            }
        }
        for key in stored.vanished {
            if !listed.contains_key(&key) {
                vanished.push(key);
            }
        }
    }
    let listed_and_kept = keys.len();
    Merged {
        keys,
        items,
        listed_and_kept,
        vanished,
    }
}

/// Evaluates the list and each item's key: `(key, item)` in list order, or the message
/// the node fails with.
fn evaluate(fe: &ForEachDecl, id: &str, ctx: Json) -> Result<Vec<(String, Json)>, String> {
    // The key is rendered once per item: its context holds only what it reads, never
    // the list itself (which would make the evaluation quadratic in the list's length).
    let mut kctx = key_context(fe, &ctx);
    // The context is given up: a list that is an input is moved out of it, not copied.
    let value = fe
        .items
        .render_owned(ctx)
        .map_err(|e| format!("`for_each.items` of node `{id}`: {e}"))?;
    let Json::Array(list) = value else {
        return Err(format!(
            "`for_each.items` of node `{id}` is {}, not a list",
            type_name(&value)
        ));
    };
    if list.len() > fe.max_items as usize {
        return Err(format!(
            "`for_each.items` of node `{id}` has {} items, more than `max_items` ({}); nothing was sent",
            list.len(),
            fe.max_items
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    // By canonical form: `1` and `1.0` are one number, so one item (a list holding both
    // would send it twice under two keys). The key itself keeps the text it always had,
    // so items of runs started before this check keep theirs.
    let mut seen: HashMap<String, String> = HashMap::with_capacity(list.len());
    let mut repeated = Vec::new();
    for (index, item) in list.into_iter().enumerate() {
        if let Json::Object(map) = &mut kctx {
            map.insert("item".into(), item);
        }
        let rendered = fe.key.render(&kctx);
        let item = match &mut kctx {
            Json::Object(map) => map.remove("item").unwrap_or(Json::Null),
            _ => Json::Null,
        };
        let (key, canonical) = match rendered {
            Ok(Json::String(s)) => (s, None),
            Ok(Json::Number(n)) => (n.to_string(), Some(canonical_number(&n))),
            Ok(other) => {
                return Err(format!(
                    "`for_each.key` of node `{id}` is {} for item {index}: a key is a string or a number",
                    type_name(&other)
                ));
            }
            Err(e) => return Err(format!("`for_each.key` of node `{id}`, item {index}: {e}")),
        };
        if key.is_empty() || key.len() > MAX_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "`for_each.key` of node `{id}` is `{}` for item {index}: a key is 1 to {MAX_KEY_LEN} visible ASCII characters (no spaces)",
                key.escape_debug()
            ));
        }
        let canonical = canonical.unwrap_or_else(|| key.clone());
        match seen.get(&canonical) {
            Some(first) if *first == key => repeated.push(format!("`{key}`")),
            Some(first) => repeated.push(format!("`{key}` (the same number as `{first}`)")),
            None => {
                seen.insert(canonical, key.clone());
            }
        }
        out.push((key, item));
    }
    if !repeated.is_empty() {
        repeated.dedup();
        let shown: Vec<String> = repeated.iter().take(10).cloned().collect();
        return Err(format!(
            "`for_each.key` of node `{id}` is not unique: {} appear more than once; nothing was sent",
            shown.join(", ")
        ));
    }
    Ok(out)
}

/// A number key's canonical text: an integral value within f64's exact range as an
/// integer (`1.0` → `1`, `1e2` → `100`), any other as serde_json writes it.
fn canonical_number(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => {
            format!("{}", f as i64)
        }
        _ => n.to_string(),
    }
}

/// The context a key is rendered in: `run`, and the inputs and node entries its
/// expressions read (copied once per list, not once per item).
fn key_context(fe: &ForEachDecl, ctx: &Json) -> Json {
    // A key that reads inputs or nodes through more than a plain path (a slice, a
    // filter) gets them all: its references may not name what it reads.
    if fe
        .key
        .exprs()
        .any(|src| reads_opaquely(src, &["inputs", "nodes"]))
    {
        return ctx.clone();
    }
    let mut inputs = serde_json::Map::new();
    let mut nodes = serde_json::Map::new();
    for path in fe.key.exprs().flat_map(expr::references) {
        let mut parts = path.split('.');
        let (root, name) = (parts.next(), parts.next());
        if let (Some(root @ ("inputs" | "nodes")), Some(name)) = (root, name)
            && let Some(v) = ctx.get(root).and_then(|m| m.get(name))
        {
            let into = if root == "inputs" {
                &mut inputs
            } else {
                &mut nodes
            };
            into.insert(name.to_string(), v.clone());
        }
    }
    serde_json::json!({
        "inputs": inputs,
        "nodes": nodes,
        "run": ctx.get("run").cloned().unwrap_or(Json::Null),
    })
}

fn type_name(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}
