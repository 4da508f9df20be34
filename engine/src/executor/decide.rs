//! Deciding apart from doing: what a run should do next, as a pure function of its
//! recorded state. The loop in [`super::run`] performs the actions against the ledger and
//! the gateway; this file has no I/O, so the DAG rules are tested in microseconds.

use flow_ledger::Timestamp;

pub use super::node::NodeState;
use crate::gateway::StepOrigin;
use crate::plan::Plan;
use crate::workflow::Workflow;

/// Something the loop should do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Start (or resume) a step of a node.
    Start {
        /// Node index.
        node: usize,
        /// Step id to run.
        step_id: String,
        /// Retry number of that step.
        retry: u32,
        /// Where the step's row stands: none yet, a retry that came due, or a row left
        /// `running` (interrupted, deferred, resolved for re-send).
        origin: StepOrigin,
        /// The item of a `for_each` node the step is for (its position in the list).
        item: Option<usize>,
    },
    /// Evaluate a `for_each` node's list (its parents are settled) and record it.
    Expand {
        /// Node index.
        node: usize,
    },
    /// Every item of a `for_each` node is settled (or too many failed): record the node.
    Close {
        /// Node index.
        node: usize,
    },
    /// Record the node as skipped because an upstream node was skipped.
    SkipUpstream {
        /// Node index.
        node: usize,
    },
    /// Nothing to start now: wait for an in-flight step, or until this time.
    Wait {
        /// Wake-up time for the earliest pending retry.
        until: Option<Timestamp>,
    },
    /// Nothing can proceed without a resolution or a decision: pause the run.
    Pause {
        /// The nodes whose calls are in doubt.
        in_doubt: Vec<usize>,
        /// The nodes whose calls await approval.
        awaiting: Vec<usize>,
    },
    /// Every node is settled: finish the run.
    Finish {
        /// The run's final state.
        outcome: Finish,
    },
}

/// How a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// Every node succeeded, was skipped, or failed with `continue_on_error`.
    Succeeded,
    /// A node failed without `continue_on_error`.
    Failed,
    /// Cancelled on request.
    Cancelled,
}

/// What the decision looks at besides the node states.
#[derive(Debug, Clone, Copy)]
pub struct Situation {
    /// Current time.
    pub now: Timestamp,
    /// Steps executing in this process.
    pub in_flight: usize,
    /// Whether an operator asked to cancel.
    pub cancel_requested: bool,
}

/// Whether dependents of this node may proceed.
fn settles(wf: &Workflow, node: usize, state: &NodeState) -> bool {
    match state {
        NodeState::Succeeded { .. } | NodeState::Skipped => true,
        NodeState::Failed { .. } => wf.nodes[node].continue_on_error,
        _ => false,
    }
}

/// The next actions for a run: starts up to `max_parallel`, or one of wait / pause /
/// finish when nothing can start.
pub fn decide(wf: &Workflow, plan: &Plan, nodes: &[NodeState], s: Situation) -> Vec<Action> {
    if let Some(stop) = stopping(wf, nodes, s) {
        return stop;
    }
    let (actions, wake) = ready(wf, plan, nodes, s);
    if !actions.is_empty() {
        return actions;
    }
    idle(nodes, s, wake)
}

/// A cancel or a fatal failure: wait for what is in flight, then finish.
fn stopping(wf: &Workflow, nodes: &[NodeState], s: Situation) -> Option<Vec<Action>> {
    let fatal = nodes
        .iter()
        .enumerate()
        .any(|(i, n)| matches!(n, NodeState::Failed { .. }) && !wf.nodes[i].continue_on_error);
    if !(s.cancel_requested || fatal) {
        return None;
    }
    Some(if s.in_flight > 0 {
        vec![Action::Wait { until: None }]
    } else {
        vec![Action::Finish {
            outcome: if s.cancel_requested {
                Finish::Cancelled
            } else {
                Finish::Failed
            },
        }]
    })
}

/// What can start or be written now, within `max_parallel`; and the earliest time a
/// waiting retry comes due.
fn ready(
    wf: &Workflow,
    plan: &Plan,
    nodes: &[NodeState],
    s: Situation,
) -> (Vec<Action>, Option<Timestamp>) {
    let capacity = (wf.max_parallel as usize).saturating_sub(s.in_flight);
    let mut actions = Vec::new();
    let mut starts = 0usize;
    let mut wake: Option<Timestamp> = None;
    let mut wake_at = |t: Timestamp| wake = Some(wake.map_or(t, |w: Timestamp| w.min(t)));
    for &i in plan.order() {
        match &nodes[i] {
            NodeState::Interrupted { step_id, retry } if starts < capacity => {
                starts += 1;
                actions.push(Action::Start {
                    node: i,
                    step_id: step_id.clone(),
                    retry: *retry,
                    origin: StepOrigin::Running,
                    item: None,
                });
            }
            NodeState::Pending {
                step_id,
                retry,
                not_before,
            }
            | NodeState::Deferred {
                step_id,
                retry,
                until: not_before,
            } => {
                // A redriven node's new step waits for its parents' new attempts
                // (a retry's parents have always settled already).
                let waits = matches!(nodes[i], NodeState::Pending { .. })
                    && !plan.parents(i).iter().all(|&p| settles(wf, p, &nodes[p]));
                if waits {
                    continue;
                }
                if *not_before > s.now {
                    wake_at(*not_before);
                } else if starts < capacity {
                    starts += 1;
                    let origin = match &nodes[i] {
                        NodeState::Deferred { .. } => StepOrigin::Running,
                        _ => StepOrigin::Pending,
                    };
                    actions.push(Action::Start {
                        node: i,
                        step_id: step_id.clone(),
                        retry: *retry,
                        origin,
                        item: None,
                    });
                }
            }
            NodeState::NotStarted => {
                let parents = plan.parents(i);
                if !parents.iter().all(|&p| settles(wf, p, &nodes[p])) {
                    continue;
                }
                if parents.iter().any(|&p| nodes[p] == NodeState::Skipped) {
                    actions.push(Action::SkipUpstream { node: i });
                } else if wf.nodes[i].for_each.is_some() {
                    actions.push(Action::Expand { node: i });
                } else if starts < capacity {
                    starts += 1;
                    actions.push(Action::Start {
                        node: i,
                        step_id: wf.nodes[i].id.clone(),
                        retry: 0,
                        origin: StepOrigin::New,
                        item: None,
                    });
                }
            }
            NodeState::FanOut(fan) if fan.is_done() => actions.push(Action::Close { node: i }),
            NodeState::FanOut(fan) => {
                let (items, due) = fan.startable(s.now, capacity.saturating_sub(starts));
                if let Some(t) = due {
                    wake_at(t);
                }
                starts += items.len();
                actions.extend(items.into_iter().map(|it| Action::Start {
                    node: i,
                    step_id: it.step_id,
                    retry: it.retry,
                    origin: it.origin,
                    item: Some(it.item),
                }));
            }
            _ => {}
        }
    }
    (actions, wake)
}

/// Nothing can start: wait (for a step in flight or a retry), pause (on calls in doubt,
/// approvals, waits) or finish.
fn idle(nodes: &[NodeState], s: Situation, wake: Option<Timestamp>) -> Vec<Action> {
    if s.in_flight > 0 || wake.is_some() {
        return vec![Action::Wait { until: wake }];
    }
    let in_doubt: Vec<usize> = (0..nodes.len())
        .filter(|&i| match &nodes[i] {
            // A fan-out left here is not done (`ready` closes one that is) and nothing
            // of it can start: it holds items in doubt, or items waiting on their
            // children or their approvals. Never finish over it.
            NodeState::InDoubt { .. } => true,
            NodeState::FanOut(fan) => fan.counts().in_doubt > 0 || fan.awaiting() == 0,
            _ => false,
        })
        .collect();
    let awaiting: Vec<usize> = (0..nodes.len())
        .filter(|&i| match &nodes[i] {
            NodeState::AwaitingApproval { .. } | NodeState::Waiting { .. } => true,
            NodeState::FanOut(fan) => fan.awaiting() > 0,
            _ => false,
        })
        .collect();
    if !in_doubt.is_empty() || !awaiting.is_empty() {
        return vec![Action::Pause { in_doubt, awaiting }];
    }
    vec![Action::Finish {
        outcome: Finish::Succeeded,
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::parse_str;
    use flow_ledger::ErrorKind;
    use serde_json::json;

    fn diamond(extra: &str) -> (crate::workflow::ValidWorkflow, Plan) {
        let text = format!(
            "max_parallel: 2\ntools:\n  t: {{ kind: function, function: core.echo }}\nnodes:\n  a: {{ tool: t }}\n  b: {{ tool: t, needs: [a] {extra} }}\n  c: {{ tool: t, needs: [a] }}\n  d: {{ tool: t, needs: [b, c] }}\n"
        );
        let wf = parse_str(&text, "d.yaml").expect("valid");
        let plan = Plan::new(&wf).expect("acyclic");
        (wf, plan)
    }

    fn at(now: i64, in_flight: usize) -> Situation {
        Situation {
            now: Timestamp(now),
            in_flight,
            cancel_requested: false,
        }
    }

    fn ok() -> NodeState {
        NodeState::Succeeded { output: json!({}) }
    }

    fn starts(actions: &[Action]) -> Vec<usize> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Start { node, .. } => Some(*node),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn starts_roots_then_children_within_max_parallel() {
        let (wf, plan) = diamond("");
        let mut nodes = vec![NodeState::NotStarted; 4];
        assert_eq!(starts(&decide(&wf, &plan, &nodes, at(0, 0))), vec![0]);
        nodes[0] = ok();
        assert_eq!(starts(&decide(&wf, &plan, &nodes, at(0, 0))), vec![1, 2]);
        assert_eq!(
            starts(&decide(&wf, &plan, &nodes, at(0, 1))),
            vec![1],
            "one slot left"
        );
        assert_eq!(
            decide(&wf, &plan, &nodes, at(0, 2)),
            vec![Action::Wait { until: None }]
        );
    }

    #[test]
    fn pending_retries_wait_for_not_before() {
        let (wf, plan) = diamond("");
        let mut nodes = vec![
            ok(),
            NotStartedOr::pending(500),
            ok(),
            NodeState::NotStarted,
        ];
        assert_eq!(
            decide(&wf, &plan, &nodes, at(100, 0)),
            vec![Action::Wait {
                until: Some(Timestamp(500))
            }]
        );
        let actions = decide(&wf, &plan, &nodes, at(500, 0));
        assert_eq!(
            actions,
            vec![Action::Start {
                node: 1,
                step_id: "b_retry1".into(),
                retry: 1,
                origin: StepOrigin::Pending,
                item: None
            }]
        );
        // A deferred attempt waits the same way but keeps its `running` row.
        nodes[1] = NodeState::Deferred {
            step_id: "b_retry1".into(),
            retry: 1,
            until: Timestamp(700),
        };
        assert_eq!(
            decide(&wf, &plan, &nodes, at(600, 0)),
            vec![Action::Wait {
                until: Some(Timestamp(700))
            }]
        );
        assert_eq!(
            decide(&wf, &plan, &nodes, at(700, 0)),
            vec![Action::Start {
                node: 1,
                step_id: "b_retry1".into(),
                retry: 1,
                origin: StepOrigin::Running,
                item: None
            }]
        );
        nodes[1] = ok();
        assert_eq!(starts(&decide(&wf, &plan, &nodes, at(500, 0))), vec![3]);
    }

    struct NotStartedOr;
    impl NotStartedOr {
        fn pending(t: i64) -> NodeState {
            NodeState::Pending {
                step_id: "b_retry1".into(),
                retry: 1,
                not_before: Timestamp(t),
            }
        }
    }

    #[test]
    fn a_failure_stops_scheduling_and_fails_the_run() {
        let (wf, plan) = diamond("");
        let failed = NodeState::Failed {
            kind: ErrorKind::Permanent,
            message: "x".into(),
        };
        let nodes = vec![
            ok(),
            failed.clone(),
            NodeState::NotStarted,
            NodeState::NotStarted,
        ];
        assert_eq!(
            decide(&wf, &plan, &nodes, at(0, 1)),
            vec![Action::Wait { until: None }]
        );
        assert_eq!(
            decide(&wf, &plan, &nodes, at(0, 0)),
            vec![Action::Finish {
                outcome: Finish::Failed
            }]
        );
        let (wf, plan) = diamond(", continue_on_error: true");
        let nodes = vec![ok(), failed, ok(), NodeState::NotStarted];
        assert_eq!(starts(&decide(&wf, &plan, &nodes, at(0, 0))), vec![3]);
    }

    #[test]
    fn in_doubt_lets_independent_branches_finish_then_pauses() {
        let (wf, plan) = diamond("");
        let nodes = vec![
            ok(),
            NodeState::InDoubt {
                step_id: "b".into(),
            },
            NodeState::NotStarted,
            NodeState::NotStarted,
        ];
        assert_eq!(
            starts(&decide(&wf, &plan, &nodes, at(0, 0))),
            vec![2],
            "c is independent of b"
        );
        let nodes = vec![
            ok(),
            NodeState::InDoubt {
                step_id: "b".into(),
            },
            ok(),
            NodeState::NotStarted,
        ];
        assert_eq!(
            decide(&wf, &plan, &nodes, at(0, 0)),
            vec![Action::Pause {
                in_doubt: vec![1],
                awaiting: vec![]
            }]
        );
    }

    #[test]
    fn skipped_nodes_skip_their_dependents_and_runs_finish() {
        let (wf, plan) = diamond("");
        let nodes = vec![ok(), NodeState::Skipped, ok(), NodeState::NotStarted];
        assert_eq!(
            decide(&wf, &plan, &nodes, at(0, 0)),
            vec![Action::SkipUpstream { node: 3 }]
        );
        let nodes = vec![ok(), NodeState::Skipped, ok(), NodeState::Skipped];
        assert_eq!(
            decide(&wf, &plan, &nodes, at(0, 0)),
            vec![Action::Finish {
                outcome: Finish::Succeeded
            }]
        );
    }

    #[test]
    fn interrupted_steps_resume_first_and_cancel_waits_for_in_flight() {
        let (wf, plan) = diamond("");
        let nodes = vec![
            NodeState::Interrupted {
                step_id: "a".into(),
                retry: 0,
            },
            NodeState::NotStarted,
            NodeState::NotStarted,
            NodeState::NotStarted,
        ];
        assert_eq!(
            decide(&wf, &plan, &nodes, at(0, 0)),
            vec![Action::Start {
                node: 0,
                step_id: "a".into(),
                retry: 0,
                origin: StepOrigin::Running,
                item: None
            }]
        );
        let cancel = Situation {
            cancel_requested: true,
            ..at(0, 1)
        };
        assert_eq!(
            decide(&wf, &plan, &nodes, cancel),
            vec![Action::Wait { until: None }]
        );
        let cancel = Situation {
            cancel_requested: true,
            ..at(0, 0)
        };
        assert_eq!(
            decide(&wf, &plan, &nodes, cancel),
            vec![Action::Finish {
                outcome: Finish::Cancelled
            }]
        );
    }
}
