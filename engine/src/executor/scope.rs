//! What one execution of a run passes around ([`RunScope`]), the per-workflow facts it
//! computes once ([`Prepared`]), and the ledger writes that settle a node without a tool
//! call (skipped, failed before its call), which the run loop and a node's start share.

use std::sync::Mutex;
use std::time::Duration;

use flow_ledger::{ErrorKind, NewStep, RunLease, StepStatus};
use rand::rngs::StdRng;
use serde_json::Value as Json;

use super::node::NodeState;
use super::progress::{Progress, StepEvent};
use super::state::RunState;
use crate::gateway::{self, Gateway, RunWriter, StepOrigin, StepResult};
use crate::plan::Plan;
use crate::workflow::{ValidWorkflow, expr};

/// Everything an execution reads but does not change, borrowed for its length: one
/// value instead of the same eight arguments on every function of the loop.
pub(super) struct RunScope<'a> {
    pub(super) gateway: &'a Gateway,
    pub(super) progress: &'a dyn Progress,
    /// Backoff jitter (seeded in tests).
    pub(super) rng: &'a Mutex<StdRng>,
    /// The run's writes: its lease (every write is fenced by it) and its kept pure
    /// results (written before every other write).
    pub(super) writer: &'a RunWriter,
    pub(super) wf: &'a ValidWorkflow,
    pub(super) plan: &'a Plan,
    pub(super) prepared: &'a Prepared,
    /// The run's inputs, as expressions read them.
    pub(super) inputs: &'a Json,
    /// The executor itself: a sub-workflow node's step executes its child with it.
    pub(super) executor: &'a super::handle::Executor,
    /// Fires when the run must stop here (the caller's stop token).
    pub(super) halt: &'a tokio_util::sync::CancellationToken,
    /// The run's cancel request, as the heartbeat reports it.
    pub(super) cancel: &'a std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// The step a start concerns: which node, under which step id and retry, and where its
/// step row stands in the ledger.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepAt<'s> {
    pub(super) node: usize,
    pub(super) step_id: &'s str,
    pub(super) retry: u32,
    pub(super) origin: StepOrigin,
    /// The item of a `for_each` node: its position in the list and its key.
    pub(super) item: Option<(usize, &'s str)>,
}

impl StepAt<'_> {
    /// The call's id: the node id, or `node[<key>]` for an item.
    pub(super) fn call_id(&self, node_id: &str) -> String {
        match self.item {
            None => node_id.to_string(),
            Some((_, key)) => crate::item_id::item_step_id(node_id, key, 0),
        }
    }
}

/// Per-workflow facts computed once per execution.
pub(super) struct Prepared {
    /// For each node, the nodes whose outputs its expressions read.
    pub(super) reads: Vec<Vec<usize>>,
    /// For each node, the nodes whose approval (`nodes.<id>.approval.inputs`) its
    /// expressions read: read from the ledger when the node starts.
    pub(super) approvals: Vec<Vec<usize>>,
    /// For each `for_each` node, the nodes its list reads: read once, when the list is
    /// evaluated, never copied into each item's context.
    pub(super) lists: Vec<Vec<usize>>,
    /// For each `for_each` node, the inputs its items' expressions (and its tool's
    /// spec) read: an item's context holds those, not every input (a list passed as an
    /// input would otherwise be copied once per item); `None`: every input.
    pub(super) item_inputs: Vec<Option<Vec<String>>>,
    /// For each node, whether another node's expressions read its output (a
    /// `for_each` node nobody reads keeps no item outputs in memory).
    pub(super) output_read: Vec<bool>,
}

impl Prepared {
    pub(super) fn new(wf: &ValidWorkflow) -> Self {
        let refs: Vec<Vec<String>> = wf
            .nodes
            .iter()
            .map(|n| {
                let mut templates = n.with.templates();
                templates.extend(n.condition.iter());
                templates.extend(n.idempotency_key.iter());
                templates.extend(n.approval().iter().flat_map(|a| a.message.iter()));
                templates
                    .iter()
                    .flat_map(|t| t.exprs().flat_map(expr::references).collect::<Vec<_>>())
                    .collect()
            })
            .collect();
        let nodes = |refs: &[String], approval: bool| {
            let mut out: Vec<usize> = refs
                .iter()
                .filter_map(|r| {
                    let mut parts = r.strip_prefix("nodes.")?.split('.');
                    let id = parts.next()?;
                    let wants = parts.next() == Some("approval");
                    (wants == approval).then(|| wf.position(id)).flatten()
                })
                .collect();
            out.sort_unstable();
            out.dedup();
            out
        };
        let lists: Vec<Vec<usize>> = wf
            .nodes
            .iter()
            .map(|n| {
                let refs: Vec<String> = n
                    .for_each
                    .iter()
                    .flat_map(|fe| fe.items.templates())
                    .flat_map(|t| t.exprs().flat_map(expr::references).collect::<Vec<_>>())
                    .collect();
                nodes(&refs, false)
            })
            .collect();
        let item_inputs = wf
            .nodes
            .iter()
            .map(|n| {
                if n.for_each.is_none() {
                    return Some(Vec::new());
                }
                let mut templates = n.with.templates();
                templates.extend(n.idempotency_key.iter());
                templates.extend(n.approval().iter().flat_map(|a| a.message.iter()));
                if let Some(tool) = wf.tool_of(n) {
                    templates.extend(tool.kind.templates());
                }
                // Read through a slice or a filter, an input may not be among the
                // references: such an item's context holds every input.
                let opaque = templates
                    .iter()
                    .flat_map(|t| t.exprs())
                    .any(|src| reads_opaquely(src, &["inputs"]));
                (!opaque).then(|| {
                    input_names(
                        templates
                            .iter()
                            .flat_map(|t| t.exprs().flat_map(expr::references)),
                    )
                })
            })
            .collect();
        let reads: Vec<Vec<usize>> = refs.iter().map(|r| nodes(r, false)).collect();
        let mut output_read = vec![false; wf.nodes.len()];
        for &i in reads.iter().chain(&lists).flatten() {
            output_read[i] = true;
        }
        Self {
            reads,
            approvals: refs.iter().map(|r| nodes(r, true)).collect(),
            lists,
            item_inputs,
            output_read,
        }
    }
}

impl RunScope<'_> {
    /// The run lease this execution holds.
    pub(super) fn lease(&self) -> &RunLease {
        self.writer.lease()
    }

    /// Writes the kept pure results now (they came due, or the run is stopping).
    pub(super) async fn flush_pure(&self) -> Result<(), gateway::Error> {
        self.writer
            .flush(self.gateway.now())
            .await
            .map_err(|e| lease_err(e, self.lease()))
    }

    /// Records `node` as skipped (its `if` was false, or an upstream node was skipped).
    pub(super) async fn skip(
        &self,
        st: &mut RunState,
        node: usize,
        why: &str,
    ) -> Result<(), gateway::Error> {
        let decl = &self.wf.nodes[node];
        let step = NewStep {
            step_id: decl.id.clone(),
            node_id: decl.id.clone(),
            retry: 0,
            not_before: None,
            status: StepStatus::Skipped,
        };
        self.writer
            .create_step(step, self.gateway.now())
            .await
            .map_err(|e| lease_err(e, self.lease()))?;
        st.nodes[node] = NodeState::Skipped;
        self.progress.step(StepEvent::Skipped {
            node: &decl.id,
            why,
        });
        Ok(())
    }

    /// Fails the step `at` without calling its tool (its `if` erred, its deadline passed,
    /// its tool is unknown), creating or starting its row first as its origin requires.
    pub(super) async fn fail_now(
        &self,
        st: &mut RunState,
        at: StepAt<'_>,
        kind: ErrorKind,
        message: String,
    ) -> Result<(), gateway::Error> {
        let StepAt {
            node,
            step_id,
            retry,
            origin,
            item,
        } = at;
        let now = self.gateway.now();
        let decl = &self.wf.nodes[node];
        let wrap = |e| lease_err(e, self.lease());
        let step = NewStep {
            step_id: step_id.to_string(),
            node_id: decl.id.clone(),
            retry,
            not_before: None,
            status: StepStatus::Running,
        };
        self.writer
            .open_step(origin, step, now)
            .await
            .map_err(wrap)?;
        self.writer
            .fail_step(step_id, kind, message.clone(), now)
            .await
            .map_err(wrap)?;
        self.progress.step(StepEvent::Finished {
            node: &decl.id,
            tool: decl.step_tool(),
            step_id,
            retry,
            took: Duration::ZERO,
            result: &StepResult::Failed {
                kind,
                message: message.clone(),
                retry: None,
            },
        });
        st.put(
            node,
            item.map(|(i, _)| i),
            NodeState::Failed { kind, message },
        );
        Ok(())
    }
}

/// Whether `src` reads one of `roots` through more than a plain path (a slice, a
/// filter, a call): minijinja's references may then not name what it reads, so a
/// context pruned to them could hide a value.
pub(super) fn reads_opaquely(src: &str, roots: &[&str]) -> bool {
    roots.iter().any(|r| src.contains(r)) && src.contains(['[', '|', '('])
}

/// The input names among expression references (`inputs.<name>…`), sorted, once each.
fn input_names(refs: impl Iterator<Item = String>) -> Vec<String> {
    let mut names: Vec<String> = refs
        .filter_map(|r| {
            r.strip_prefix("inputs.")
                .map(|p| p.split('.').next().unwrap_or(p).to_string())
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// A lost lease becomes [`gateway::Error::LeaseLost`] naming the run; other ledger
/// errors pass through.
pub(super) fn lease_err(e: flow_ledger::Error, lease: &RunLease) -> gateway::Error {
    match e {
        flow_ledger::Error::LeaseLost => gateway::Error::LeaseLost {
            run_id: lease.run_id.clone(),
        },
        other => gateway::Error::Ledger(other),
    }
}
