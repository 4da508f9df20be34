//! Which nodes a redrive runs again, from the run's stored workflow and its steps: the
//! one rule `flow redrive`, `POST /api/v1/runs/{id}/redrive` and the console's button
//! share. The ledger does the rest in one transaction (`Ledger::redrive_run`).
//!
//! Every node whose latest step failed gets a new attempt. `--from NODE` adds NODE and
//! every node downstream of it that has a step: their failed calls get a new attempt
//! (a new key), their succeeded calls are replayed from the ledger (never re-sent), and
//! their pure nodes and conditions are evaluated again. Nodes that never started need
//! nothing: they run once their parents settle.
//!
//! A `for_each` node run again keeps its items' keys: each item whose latest attempt
//! failed or was cancelled gets its next attempt (`node[<key>]_retry<n>`, a new effect
//! attempt as a node's retry is), items never started start as they would have, and
//! succeeded items are replayed — so a redrive of a fan-out that failed on one item
//! sends the failed and the never-sent items once and the others not at all.

use std::collections::BTreeMap;

use flow_ledger::{Actor, Ledger, NewStep, Redriven, Step, StepStatus, Timestamp};

use crate::item_id::{item_key, item_step_id};

/// Why a run could not be redriven.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--from` names no node of the run's workflow.
    #[error("run `{run}` has no node `{node}`")]
    UnknownNode {
        /// The run.
        run: String,
        /// The node asked for.
        node: String,
    },
    /// A node to run again is a sub-workflow (`workflow:`): a new attempt would start a
    /// new child, whose calls go out again under new keys.
    #[error(
        "run `{run}`: node `{node}` runs a sub-workflow, which cannot be redriven: a new attempt would start a new child that sends its calls again; start a new run"
    )]
    Child {
        /// The run.
        run: String,
        /// The node.
        node: String,
    },
    /// The run's stored workflow does not parse any more.
    #[error("run `{run}`: its stored workflow cannot be read: {why}")]
    Snapshot {
        /// The run.
        run: String,
        /// Why.
        why: String,
    },
    /// The ledger refused (not failed, a call in doubt, unknown run) or failed.
    #[error(transparent)]
    Ledger(#[from] flow_ledger::Error),
}

/// Redrives failed run `run_id` as `actor` (see the module docs for which nodes).
pub async fn redrive(
    ledger: &Ledger,
    run_id: &str,
    from: Option<&str>,
    actor: Actor,
    now: Timestamp,
) -> Result<Redriven, Error> {
    let run = ledger.get_run(run_id).await?;
    let wf = crate::snapshot::snapshot(&run).map_err(|why| Error::Snapshot {
        run: run_id.to_string(),
        why,
    })?;
    let steps = ledger.list_steps(run_id).await?;
    let plan = wf.plan();
    let mut chosen = vec![false; wf.nodes.len()];
    // Each node's latest step (the highest retry) decides whether it failed.
    let mut latest: Vec<Option<(u32, StepStatus)>> = vec![None; wf.nodes.len()];
    for s in &steps {
        // An item step of a `for_each` node (`node[<key>]`) is not the node's own.
        let item = crate::item_id::is_item_of(&s.node_id, &s.step_id);
        if let Some(i) = wf.position(&s.node_id)
            && !item
            && latest[i].is_none_or(|(r, _)| s.retry >= r)
        {
            latest[i] = Some((s.retry, s.status));
        }
    }
    for (i, l) in latest.iter().enumerate() {
        chosen[i] = matches!(l, Some((_, StepStatus::Failed)));
    }
    if let Some(node) = from {
        let start = wf.position(node).ok_or_else(|| Error::UnknownNode {
            run: run_id.to_string(),
            node: node.to_string(),
        })?;
        let mut seen = vec![false; wf.nodes.len()];
        let mut stack = vec![start];
        while let Some(i) = stack.pop() {
            if !std::mem::replace(&mut seen[i], true) {
                chosen[i] = true;
                stack.extend(plan.children(i).iter().copied());
            }
        }
    }
    if let Some(&i) = plan
        .order()
        .iter()
        .find(|&&i| chosen[i] && wf.nodes[i].child().is_some())
    {
        return Err(Error::Child {
            run: run_id.to_string(),
            node: wf.nodes[i].id.clone(),
        });
    }
    // The nodes to run again, in the order they run.
    let order: Vec<usize> = plan
        .order()
        .iter()
        .copied()
        .filter(|&i| chosen[i])
        .collect();
    let items = order
        .iter()
        .filter(|&&i| wf.nodes[i].for_each.is_some())
        .flat_map(|&i| items_again(&wf.nodes[i].id, &steps, now))
        .collect();
    let nodes = order.iter().map(|&i| wf.nodes[i].id.clone()).collect();
    let again = flow_ledger::Redrive { nodes, items };
    Ok(ledger.redrive_run(run_id, again, Some(actor), now).await?)
}

/// The next attempt of each item of `for_each` node `node` whose latest attempt failed
/// or was cancelled, in key order: pending, due `now`, keeping the item's key (its step
/// and call are named by it). Items with no step start as new ones; succeeded and
/// skipped items are left to replay.
fn items_again(node: &str, steps: &[Step], now: Timestamp) -> Vec<NewStep> {
    let mut latest: BTreeMap<&str, &Step> = BTreeMap::new();
    for s in steps.iter().filter(|s| s.node_id == node) {
        if let Some(key) = item_key(node, &s.step_id, s.retry) {
            let l = latest.entry(key).or_insert(s);
            if s.retry > l.retry {
                *l = s;
            }
        }
    }
    latest
        .into_iter()
        .filter(|(_, s)| matches!(s.status, StepStatus::Failed | StepStatus::Cancelled))
        .map(|(key, s)| {
            let retry = s.retry.saturating_add(1);
            NewStep {
                step_id: item_step_id(node, key, retry),
                node_id: node.to_string(),
                retry,
                not_before: Some(now),
                status: StepStatus::Pending,
            }
        })
        .collect()
}
