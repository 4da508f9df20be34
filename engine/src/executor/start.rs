//! A node's start: its `if`, its deadline, its timeout and next retry, and the
//! expression context it is rendered with, all decided before the gateway is called.

use std::time::Duration;

use flow_ledger::{ErrorKind, Timestamp};
use serde_json::{Map, Value as Json, json};

use super::node::NodeState;
use super::scope::{RunScope, StepAt};
use super::state::RunState;
use crate::gateway::{self, NextRetry, NodeStep, StepCall, StepOrigin};
use crate::retry;
use crate::workflow::ToolDecl;
use crate::workflow::model::{NodeKind, WaitDecl};
use crate::workflow::{Workflow, expr};

/// What a node's start comes to, decided from the workflow, the step, its expression
/// context and the time alone: [`plan_start`] is pure, so these rules are table-tested
/// without a ledger, and [`RunScope::prepare_start`] only performs the result.
#[derive(Debug)]
pub(super) enum StartPlan<'w> {
    /// Not run: record it skipped, saying why.
    Skip {
        /// Shown to the user.
        why: &'static str,
    },
    /// Fails without a call (its `if` erred, its deadline passed, its tool is unknown).
    Fail {
        /// Error kind recorded on the step.
        kind: ErrorKind,
        /// Error message recorded on the step.
        message: String,
    },
    /// Run the node's step under `timeout`; a retryable failure creates `next_retry`.
    Start {
        /// What the step runs: its tool's call, a wait, a child run.
        runs: Runs<'w>,
        /// The attempt's timeout, clipped to the node's deadline.
        timeout: Duration,
        /// The retry step to create, if the policy allows another.
        next_retry: Option<NextRetry>,
        /// How often the same key may be re-sent after an unknown outcome.
        resend_budget: u32,
    },
}

/// What a started step runs, by its node's kind: only a call crosses the gateway.
#[derive(Debug, Clone, Copy)]
pub(super) enum Runs<'w> {
    /// A call of this tool.
    Call(&'w ToolDecl),
    /// A wait for a published event.
    Wait(&'w WaitDecl),
    /// A child run.
    Child,
}

/// A step ready to run, by its node's kind: what [`RunScope::prepare_start`] hands the
/// loop.
pub(super) enum Started<'a> {
    /// Through the gateway.
    Call(StepCall<'a>),
    /// The executor's own wait (`executor/wait.rs`).
    Wait(NodeStep<'a>, &'a WaitDecl),
    /// The executor's own child run (`executor/child.rs`).
    Child(NodeStep<'a>),
}

impl<'a> Started<'a> {
    /// The step, whatever it runs.
    pub(super) fn step(&self) -> &NodeStep<'a> {
        match self {
            Self::Call(c) => c,
            Self::Wait(s, _) | Self::Child(s) => s,
        }
    }
}

/// Decides a node's start: `if:` first (only a first, new step evaluates it), then the
/// deadline counted from the node's `first` start, then the timeout and the next retry's
/// backoff (jitter from `rng`), then whether its tool exists.
pub(super) fn plan_start<'w>(
    wf: &'w Workflow,
    at: StepAt<'_>,
    ctx: &Json,
    first: Timestamp,
    now: Timestamp,
    rng: &mut impl rand::Rng,
) -> StartPlan<'w> {
    let decl = &wf.nodes[at.node];
    // An item's node evaluated its `if` once, before its list.
    if at.retry == 0
        && at.item.is_none()
        && at.origin == StepOrigin::New
        && let Some(cond) = &decl.condition
    {
        match expr::eval_condition(cond, ctx) {
            Ok(false) => {
                return StartPlan::Skip {
                    why: "its `if` condition is false",
                };
            }
            Ok(true) => {}
            Err(e) => {
                return StartPlan::Fail {
                    kind: ErrorKind::Permanent,
                    message: format!("`if` of node `{}`: {e}", decl.id),
                };
            }
        }
    }
    // A `wait:` node's only clock is its `wait.timeout` (a workflow-wide `deadline`
    // would fail it on the resume an event causes).
    let deadline = wf
        .deadline(decl)
        .filter(|_| matches!(decl.kind, NodeKind::Call(_)))
        .map(|d| first.plus(d));
    if let Some(d) = deadline
        && now >= d
    {
        return StartPlan::Fail {
            kind: ErrorKind::Timeout,
            message: format!(
                "node `{}` passed its deadline of {}",
                decl.id,
                humantime::format_duration(wf.deadline(decl).unwrap_or_default())
            ),
        };
    }
    let mut timeout = wf.timeout(decl);
    if let Some(d) = deadline {
        timeout = timeout.min(Duration::from_millis(
            u64::try_from(d.0 - now.0).unwrap_or(0),
        ));
    }
    let policy = wf.retry_policy(decl);
    let next = at.retry + 1;
    let next_retry = retry::allows(&policy, next).then(|| NextRetry {
        step_id: match at.item {
            None => format!("{}_retry{next}", decl.id),
            Some((_, key)) => crate::item_id::item_step_id(&decl.id, key, next),
        },
        retry: next,
        delay: retry::next_delay(&policy, next, rng),
        deadline,
    });
    let runs = match &decl.kind {
        NodeKind::Wait(w) => Runs::Wait(w),
        NodeKind::Child(_) => Runs::Child,
        NodeKind::Call(call) => match wf.tools.get(&call.tool) {
            Some(tool) => Runs::Call(tool),
            None => {
                return StartPlan::Fail {
                    kind: ErrorKind::Permanent,
                    message: format!("node `{}` uses unknown tool `{}`", decl.id, call.tool),
                };
            }
        },
    };
    StartPlan::Start {
        runs,
        timeout,
        next_retry,
        resend_budget: policy.max_retries,
    }
}

impl<'a> RunScope<'a> {
    /// Plans the start of `at` ([`plan_start`]) and performs what does not need the
    /// gateway: a skip or a failure is recorded here (`None`); a call is returned.
    pub(super) async fn prepare_start(
        &self,
        st: &mut RunState,
        at: StepAt<'_>,
    ) -> Result<Option<Started<'a>>, gateway::Error> {
        let wf = self.wf;
        let decl = &wf.nodes[at.node];
        let now = self.gateway.now();
        self.read_approvals(st, at.node).await?;
        let mut ctx = if at.item.is_some() {
            self.item_context(st, at.node)
        } else {
            self.context(st, at.node)
        };
        if let (Some((i, _)), NodeState::FanOut(fan), Json::Object(map)) =
            (at.item, &st.nodes[at.node], &mut ctx)
        {
            map.insert("item".into(), fan.items[i].clone());
        }
        let first = st.first_started.get(&at.node).copied().unwrap_or(now);
        let plan = {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            plan_start(wf, at, &ctx, first, now, &mut *rng)
        };
        let (runs, timeout, next_retry, resend_budget) = match plan {
            StartPlan::Skip { why } => {
                self.skip(st, at.node, why).await?;
                return Ok(None);
            }
            StartPlan::Fail { kind, message } => {
                self.fail_now(st, at, kind, message).await?;
                return Ok(None);
            }
            StartPlan::Start {
                runs,
                timeout,
                next_retry,
                resend_budget,
            } => (runs, timeout, next_retry, resend_budget),
        };
        let step = NodeStep {
            writer: self.writer,
            workflow: wf,
            node: decl,
            step_id: at.step_id.to_string(),
            call_id: at.call_id(&decl.id),
            retry: at.retry,
            origin: at.origin,
            ctx,
            timeout,
            next_retry,
            resend_budget,
            scrub: None,
        };
        Ok(Some(match runs {
            Runs::Call(tool) => Started::Call(StepCall { step, tool }),
            Runs::Wait(w) => Started::Wait(step, w),
            Runs::Child => Started::Child(step),
        }))
    }

    /// The expression context of a node: inputs, the run id, the outputs it reads and
    /// the approvals it reads (`nodes.<id>.approval.inputs`).
    fn context(&self, st: &RunState, node: usize) -> Json {
        self.context_reading(st, node, &self.prepared.reads[node])
    }

    /// The context of an item of a `for_each` node (without the item): only the inputs
    /// its expressions read.
    fn item_context(&self, st: &RunState, node: usize) -> Json {
        let inputs = match &self.prepared.item_inputs[node] {
            Some(names) => self.inputs_named(names),
            None => self.inputs.clone(),
        };
        self.context_with(st, node, &self.prepared.reads[node], inputs)
    }

    /// The run's inputs named `names` (an object of those alone).
    pub(super) fn inputs_named(&self, names: &[String]) -> Json {
        let some: Map<String, Json> = match self.inputs {
            Json::Object(all) => names
                .iter()
                .filter_map(|k| all.get(k).map(|v| (k.clone(), v.clone())))
                .collect(),
            _ => Map::new(),
        };
        Json::Object(some)
    }

    /// The expression context of a node whose expressions read the outputs of `reads`.
    pub(super) fn context_reading(&self, st: &RunState, node: usize, reads: &[usize]) -> Json {
        self.context_with(st, node, reads, self.inputs.clone())
    }

    /// The expression context of a node with `inputs` as its inputs.
    pub(super) fn context_with(
        &self,
        st: &RunState,
        node: usize,
        reads: &[usize],
        inputs: Json,
    ) -> Json {
        let mut nodes = Map::new();
        for &i in reads {
            let output = match &st.nodes[i] {
                NodeState::Succeeded { output } => output.clone(),
                _ => Json::Null,
            };
            nodes.insert(self.wf.nodes[i].id.clone(), json!({ "output": output }));
        }
        for &i in &self.prepared.approvals[node] {
            let entry = nodes
                .entry(self.wf.nodes[i].id.clone())
                .or_insert_with(|| json!({}));
            if let Json::Object(map) = entry {
                let approval = st.approvals.get(&i).cloned().unwrap_or(Json::Null);
                map.insert("approval".into(), approval);
            }
        }
        json!({ "inputs": inputs, "nodes": nodes, "run": { "id": self.lease().run_id } })
    }

    /// Reads the approvals `node` reads that this execution has not read yet: what the
    /// deciding approver gave (`{"inputs": …, "by": …}`).
    pub(super) async fn read_approvals(
        &self,
        st: &mut RunState,
        node: usize,
    ) -> Result<(), gateway::Error> {
        for &i in &self.prepared.approvals[node] {
            if st.approvals.contains_key(&i) {
                continue;
            }
            let id = &self.wf.nodes[i].id;
            let found = self
                .gateway
                .ledger()
                .get_approval(&self.lease().run_id, id)
                .await
                .map_err(gateway::Error::Ledger)?;
            let value = found.map_or(
                Json::Null,
                |a| json!({ "inputs": a.inputs.unwrap_or_else(|| json!({})), "by": a.decided_by }),
            );
            st.approvals.insert(i, value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use serde_json::json;

    use super::*;
    use crate::workflow::parse_str;

    /// One node `a` with `extra` keys, on a function tool.
    fn node(extra: &str) -> crate::workflow::ValidWorkflow {
        let text = format!(
            "inputs:\n  go: {{ type: boolean, default: false }}\ntools:\n  t: {{ kind: function, function: core.echo }}\nnodes:\n  a:\n    tool: t\n{extra}"
        );
        parse_str(&text, "start.yaml").expect("valid")
    }

    fn at(retry: u32, origin: StepOrigin) -> StepAt<'static> {
        StepAt {
            node: 0,
            step_id: "a",
            retry,
            origin,
            item: None,
        }
    }

    fn plan<'w>(wf: &'w Workflow, at: StepAt<'_>, first: i64, now: i64) -> StartPlan<'w> {
        let ctx = json!({ "inputs": { "go": false }, "nodes": {}, "run": { "id": "r" } });
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        plan_start(wf, at, &ctx, Timestamp(first), Timestamp(now), &mut rng)
    }

    #[test]
    fn a_false_condition_skips_only_a_new_first_step() {
        let wf = node("    if: \"${{ inputs.go }}\"\n");
        assert!(matches!(
            plan(&wf, at(0, StepOrigin::New), 0, 0),
            StartPlan::Skip { .. }
        ));
        // A retry, or a step whose row exists, already passed its condition.
        assert!(matches!(
            plan(&wf, at(1, StepOrigin::Pending), 0, 0),
            StartPlan::Start { .. }
        ));
        assert!(matches!(
            plan(&wf, at(0, StepOrigin::Running), 0, 0),
            StartPlan::Start { .. }
        ));
    }

    #[test]
    fn a_condition_that_errs_fails_the_step_permanently() {
        let wf = node("    if: \"${{ inputs.go + 'x' }}\"\n");
        match plan(&wf, at(0, StepOrigin::New), 0, 0) {
            StartPlan::Fail { kind, message } => {
                assert_eq!(kind, ErrorKind::Permanent);
                assert!(message.starts_with("`if` of node `a`"), "{message}");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn the_deadline_counts_from_the_first_start_and_clips_the_timeout() {
        let wf = node("    timeout: 10s\n    deadline: 3s\n");
        match plan(&wf, at(1, StepOrigin::Pending), 1_000, 2_500) {
            StartPlan::Start { timeout, .. } => assert_eq!(timeout, Duration::from_millis(1_500)),
            other => panic!("expected a call, got {other:?}"),
        }
        match plan(&wf, at(1, StepOrigin::Pending), 1_000, 4_000) {
            StartPlan::Fail { kind, message } => {
                assert_eq!(kind, ErrorKind::Timeout);
                assert_eq!(message, "node `a` passed its deadline of 3s");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn the_next_retry_exists_while_the_policy_allows_one() {
        let wf = node("    retry_policy: { max_retries: 2 }\n");
        match plan(&wf, at(1, StepOrigin::Pending), 0, 0) {
            StartPlan::Start {
                next_retry: Some(next),
                resend_budget,
                ..
            } => {
                assert_eq!((next.step_id.as_str(), next.retry), ("a_retry2", 2));
                assert_eq!(resend_budget, 2);
            }
            other => panic!("expected a call with a retry, got {other:?}"),
        }
        assert!(matches!(
            plan(&wf, at(2, StepOrigin::Pending), 0, 0),
            StartPlan::Start {
                next_retry: None,
                ..
            }
        ));
    }

    #[test]
    fn an_unknown_tool_fails_without_a_call() {
        let mut wf = node("").into_inner();
        if let crate::workflow::NodeKind::Call(call) = &mut wf.nodes[0].kind {
            call.tool = "gone".into();
        }
        match plan(&wf, at(0, StepOrigin::New), 0, 0) {
            StartPlan::Fail { kind, message } => {
                assert_eq!(kind, ErrorKind::Permanent);
                assert_eq!(message, "node `a` uses unknown tool `gone`");
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }
}
