//! How one execution of a run ends in this worker: finished (its outcome and the kept
//! pure results in one commit), released after a cooperative stop, or parked on the
//! queue until its next start when nothing of it can move before then.

use flow_ledger::{RunFinish, RunStatus, Timestamp};
use serde_json::{Map, Value as Json};

use super::decide::Finish;
use super::node::NodeState;
use super::run::RunOutcome;
use super::scope::{RunScope, lease_err};
use super::state::RunState;
use crate::gateway;

impl RunScope<'_> {
    /// Gives the run back to the queue after a cooperative stop.
    pub(super) async fn release(&self) -> Result<RunOutcome, gateway::Error> {
        let lease = self.lease();
        self.writer
            .release(self.gateway.now())
            .await
            .map_err(|e| lease_err(e, lease))?;
        Ok(RunOutcome {
            status: RunStatus::Queued,
            output: None,
            error: Some("released to the queue: this worker is stopping".to_string()),
        })
    }

    /// Nothing is in flight and nothing can start before `until`: the run goes back to
    /// the queue until then (`not_before`), its kept results written first, and this
    /// worker takes other work.
    pub(super) async fn park(&self, until: Timestamp) -> Result<RunOutcome, gateway::Error> {
        let lease = self.lease();
        self.writer
            .park(until, self.gateway.now())
            .await
            .map_err(|e| lease_err(e, lease))?;
        Ok(RunOutcome {
            status: RunStatus::Queued,
            output: None,
            error: Some(format!(
                "parked on the queue until {}: nothing can start before then",
                until.to_rfc3339()
            )),
        })
    }

    /// Ends the run with `outcome`, writing the kept pure results in the same commit.
    pub(super) async fn finish(
        &self,
        st: &RunState,
        outcome: Finish,
    ) -> Result<RunOutcome, gateway::Error> {
        let (lease, wf, plan) = (self.lease(), self.wf, self.plan);
        let (status, output, error) = match outcome {
            Finish::Succeeded => {
                let mut out = Map::new();
                for i in plan.sinks() {
                    let v = match &st.nodes[i] {
                        // A `for_each` sink gives its counts: its items are in their steps.
                        NodeState::Succeeded { output } if wf.nodes[i].for_each.is_some() => {
                            let mut counts = output.clone();
                            if let Json::Object(map) = &mut counts {
                                map.remove("items");
                            }
                            counts
                        }
                        NodeState::Succeeded { output } => output.clone(),
                        _ => Json::Null,
                    };
                    out.insert(wf.nodes[i].id.clone(), v);
                }
                (RunStatus::Succeeded, Some(Json::Object(out)), None)
            }
            Finish::Failed => {
                let failed: Vec<String> = st
                    .nodes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, n)| match n {
                        NodeState::Failed { message, .. } if !wf.nodes[i].continue_on_error => {
                            Some(format!("node `{}` failed: {message}", wf.nodes[i].id))
                        }
                        _ => None,
                    })
                    .collect();
                (RunStatus::Failed, None, Some(failed.join("; ")))
            }
            Finish::Cancelled => (
                RunStatus::Cancelled,
                None,
                Some("cancelled on request".to_string()),
            ),
        };
        // A parent that ends other than by success leaves no `cancel` child of its
        // running for nobody (a child waiting elsewhere, or paused).
        if status != RunStatus::Succeeded && wf.nodes.iter().any(|n| n.child().is_some()) {
            self.gateway
                .ledger()
                .cancel_children(lease, self.gateway.now())
                .await
                .map_err(|e| lease_err(e, lease))?;
        }
        let finish = RunFinish {
            status,
            output: output.clone(),
            error: error.clone(),
        };
        self.writer
            .finish(finish, self.gateway.now())
            .await
            .map_err(|e| lease_err(e, lease))?;
        Ok(RunOutcome {
            status,
            output,
            error,
        })
    }
}
