//! Which nodes a redrive runs again, from the run's stored workflow and its steps: the
//! one rule `flow redrive`, `POST /api/v1/runs/{id}/redrive` and the console's button
//! share. The ledger does the rest in one transaction (`Ledger::redrive_run`).
//!
//! Every node whose latest step failed gets a new attempt. `--from NODE` adds NODE and
//! every node downstream of it that has a step: their failed calls get a new attempt
//! (a new key), their succeeded calls are replayed from the ledger (never re-sent), and
//! their pure nodes and conditions are evaluated again. Nodes that never started need
//! nothing: they run once their parents settle.

use flow_ledger::{Actor, Ledger, Redriven, StepStatus, Timestamp};

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
    /// A node to run again has `for_each:`: its items cannot be redriven yet (a new run
    /// re-sends nothing its items already sent only under other keys, so say so).
    #[error(
        "run `{run}`: node `{node}` has `for_each:`, which cannot be redriven yet; resolve or start a new run"
    )]
    ForEach {
        /// The run.
        run: String,
        /// The node.
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
        .find(|&&i| chosen[i] && wf.nodes[i].for_each.is_some())
    {
        return Err(Error::ForEach {
            run: run_id.to_string(),
            node: wf.nodes[i].id.clone(),
        });
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
    let nodes = plan
        .order()
        .iter()
        .filter(|&&i| chosen[i])
        .map(|&i| wf.nodes[i].id.clone())
        .collect();
    Ok(ledger.redrive_run(run_id, nodes, Some(actor), now).await?)
}
