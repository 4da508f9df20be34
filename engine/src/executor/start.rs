//! A node's start: its `if`, its deadline, its timeout and next retry, and the
//! expression context it is rendered with, all decided before the gateway is called.

use std::time::Duration;

use flow_ledger::ErrorKind;
use serde_json::{Map, Value as Json, json};

use super::decide::NodeState;
use super::scope::{RunScope, StepAt};
use super::state::RunState;
use crate::gateway::{self, NextRetry, StepCall, StepOrigin};
use crate::retry;
use crate::workflow::expr;

impl<'a> RunScope<'a> {
    /// Checks the condition and the deadline, then builds the gateway request; `None`
    /// when the node was settled without a call (skipped or past its deadline).
    pub(super) async fn prepare_start(
        &self,
        st: &mut RunState,
        at: StepAt<'_>,
    ) -> Result<Option<StepCall<'a>>, gateway::Error> {
        let StepAt {
            node,
            step_id,
            retry,
            origin,
        } = at;
        let (lease, wf) = (self.lease, self.wf);
        let decl = &wf.nodes[node];
        let now = self.gateway.now();
        let ctx = self.context(st, node);
        if retry == 0
            && origin == StepOrigin::New
            && let Some(cond) = &decl.condition
        {
            match expr::eval_condition(cond, &ctx) {
                Ok(false) => {
                    self.skip(st, node, "its `if` condition is false").await?;
                    return Ok(None);
                }
                Ok(true) => {}
                Err(e) => {
                    let message = format!("`if` of node `{}`: {e}", decl.id);
                    self.fail_now(st, at, ErrorKind::Permanent, message).await?;
                    return Ok(None);
                }
            }
        }
        let first = st.first_started.get(&node).copied().unwrap_or(now);
        let deadline = wf.deadline(decl).map(|d| first.plus(d));
        if let Some(d) = deadline
            && now >= d
        {
            let message = format!(
                "node `{}` passed its deadline of {}",
                decl.id,
                humantime::format_duration(wf.deadline(decl).unwrap_or_default())
            );
            self.fail_now(st, at, ErrorKind::Timeout, message).await?;
            return Ok(None);
        }
        let mut timeout = wf.timeout(decl);
        if let Some(d) = deadline {
            timeout = timeout.min(Duration::from_millis(
                u64::try_from(d.0 - now.0).unwrap_or(0),
            ));
        }
        let policy = wf.retry_policy(decl);
        let next = retry + 1;
        let next_retry = retry::allows(&policy, next).then(|| {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            NextRetry {
                step_id: format!("{}_retry{next}", decl.id),
                retry: next,
                delay: retry::next_delay(&policy, next, &mut *rng),
                deadline,
            }
        });
        let Some(tool) = wf.tools.get(&decl.tool) else {
            let message = format!("node `{}` uses unknown tool `{}`", decl.id, decl.tool);
            self.fail_now(st, at, ErrorKind::Permanent, message).await?;
            return Ok(None);
        };
        Ok(Some(StepCall {
            run: lease,
            workflow: wf,
            node: decl,
            tool,
            step_id: step_id.to_string(),
            retry,
            origin,
            ctx,
            timeout,
            next_retry,
            resend_budget: policy.max_retries,
            pure_log: Some(st.pure_log.clone()),
        }))
    }

    /// The expression context of a node: inputs, the run id, and the outputs it reads.
    fn context(&self, st: &RunState, node: usize) -> Json {
        let mut nodes = Map::new();
        for &i in &self.prepared.reads[node] {
            let output = match &st.nodes[i] {
                NodeState::Succeeded { output } => output.clone(),
                _ => Json::Null,
            };
            nodes.insert(self.wf.nodes[i].id.clone(), json!({ "output": output }));
        }
        json!({ "inputs": self.inputs, "nodes": nodes, "run": { "id": self.lease.run_id } })
    }
}
