//! A run's node states as the ledger recorded them, loaded once per execution and then
//! kept current from this process's own results.

use std::collections::HashMap;

use flow_ledger::{ErrorKind, Step, StepStatus, Timestamp};
use serde_json::Value as Json;

use super::node::NodeState;
use crate::gateway::StepOrigin;
use crate::item_id::item_key;
use crate::workflow::ValidWorkflow;

/// The run's node states as recorded, plus bookkeeping of this execution.
pub(super) struct RunState {
    pub(super) nodes: Vec<NodeState>,
    /// The recorded states of `for_each` items by node and key, until the node's list
    /// is evaluated again and they join its [`super::node::Fan`].
    pub(super) items: HashMap<usize, HashMap<String, NodeState>>,
    /// `for_each` nodes recorded as succeeded, whose output (every item's) is rebuilt
    /// from their items before the run goes on.
    pub(super) rebuild: Vec<usize>,
    /// `for_each` nodes whose own step row exists but did not end — a crash between
    /// its start and its end as the node closed, or a redrive's next attempt — with
    /// that row: the list is evaluated again and the node closes on it.
    pub(super) reopened: HashMap<usize, OwnStep>,
    /// When each node's first attempt started: its deadline counts from there.
    pub(super) first_started: HashMap<usize, Timestamp>,
    /// What a node's approval gives its dependents (`{"inputs": …}`), read from the
    /// ledger when a dependent that reads it starts.
    pub(super) approvals: HashMap<usize, Json>,
}

/// A `for_each` node's own step row: the one it closes on.
#[derive(Debug, Clone)]
pub(super) struct OwnStep {
    /// `node`, or `node_retry<n>` after a redrive.
    pub(super) step_id: String,
    /// Its retry number.
    pub(super) retry: u32,
    /// Where the row stands: none yet, pending (a redrive's), or left running.
    pub(super) origin: StepOrigin,
}

impl RunState {
    /// The state of every node from the run's step rows: each node's latest retry wins.
    pub(super) fn load(wf: &ValidWorkflow, steps: &[Step]) -> Self {
        let mut latest: Vec<Option<&Step>> = vec![None; wf.nodes.len()];
        let mut first_started = HashMap::new();
        let mut item_steps: HashMap<usize, HashMap<&str, &Step>> = HashMap::new();
        for s in steps {
            let Some(i) = wf.position(&s.node_id) else {
                continue;
            };
            if wf.nodes[i].for_each.is_some()
                && let Some(key) = item_key(&s.node_id, &s.step_id, s.retry)
            {
                let latest = item_steps.entry(i).or_default().entry(key).or_insert(s);
                if s.retry >= latest.retry {
                    *latest = s;
                }
            } else if latest[i].is_none_or(|l| s.retry >= l.retry) {
                latest[i] = Some(s);
            }
            if let Some(t) = s.started_at {
                let e = first_started.entry(i).or_insert(t);
                if t < *e {
                    *e = t;
                }
            }
        }
        let nodes = latest.iter().map(|s| match s {
            None => NodeState::NotStarted,
            Some(s) => state_of(s),
        });
        let mut nodes: Vec<NodeState> = nodes.collect();
        let mut reopened = HashMap::new();
        for (i, n) in nodes.iter_mut().enumerate() {
            if wf.nodes[i].for_each.is_none() {
                continue;
            }
            let own = match n {
                NodeState::Interrupted { step_id, retry }
                | NodeState::Deferred { step_id, retry, .. } => OwnStep {
                    step_id: step_id.clone(),
                    retry: *retry,
                    origin: StepOrigin::Running,
                },
                NodeState::Pending { step_id, retry, .. } => OwnStep {
                    step_id: step_id.clone(),
                    retry: *retry,
                    origin: StepOrigin::Pending,
                },
                _ => continue,
            };
            *n = NodeState::NotStarted;
            reopened.insert(i, own);
        }
        let rebuild = (0..nodes.len())
            .filter(|&i| {
                wf.nodes[i].for_each.is_some() && matches!(nodes[i], NodeState::Succeeded { .. })
            })
            .collect();
        let items = item_steps
            .into_iter()
            .map(|(i, steps)| {
                let states = steps
                    .into_iter()
                    .map(|(k, s)| (k.to_string(), state_of(s)))
                    .collect();
                (i, states)
            })
            .collect();
        Self {
            nodes,
            items,
            rebuild,
            reopened,
            first_started,
            approvals: HashMap::new(),
        }
    }

    /// The key of item `item` of `node` (a `for_each` node whose list is known).
    pub(super) fn item_key(&self, node: usize, item: Option<usize>) -> Option<String> {
        match (item, &self.nodes[node]) {
            (Some(i), NodeState::FanOut(fan)) => fan.keys.get(i).cloned(),
            _ => None,
        }
    }

    /// Sets the state of `node`, or of its item `item` (a `for_each` node's).
    pub(super) fn put(&mut self, node: usize, item: Option<usize>, state: NodeState) {
        match item {
            None => self.nodes[node] = state,
            Some(i) => {
                if let NodeState::FanOut(fan) = &mut self.nodes[node] {
                    fan.set(i, state);
                }
            }
        }
    }
}

/// The state a step row records.
fn state_of(s: &Step) -> NodeState {
    match s.status {
        StepStatus::Pending => NodeState::Pending {
            step_id: s.step_id.clone(),
            retry: s.retry,
            not_before: s.not_before.unwrap_or(Timestamp(0)),
        },
        StepStatus::Running => NodeState::Interrupted {
            step_id: s.step_id.clone(),
            retry: s.retry,
        },
        StepStatus::Succeeded => NodeState::Succeeded {
            output: s.output.clone().unwrap_or(Json::Null),
        },
        StepStatus::Failed => NodeState::Failed {
            kind: s.error_kind.unwrap_or(ErrorKind::Permanent),
            message: s.error_message.clone().unwrap_or_default(),
        },
        StepStatus::Skipped => NodeState::Skipped,
        StepStatus::Paused => NodeState::InDoubt {
            step_id: s.step_id.clone(),
        },
        StepStatus::Cancelled => NodeState::Cancelled,
    }
}
