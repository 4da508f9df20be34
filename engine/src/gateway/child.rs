//! A sub-workflow node's step, the gateway's half: its row opened, and settled from
//! how its child run ended. Nothing is rendered against secrets or claimed: the node
//! sends nothing itself (its child's calls go through the gateway as any run's do).
//! Starting and executing the child is the executor's (`executor/child.rs`), since a
//! child is a run.

use flow_ledger::{ErrorKind, StepFinish, StepStatus};
use serde_json::Value as Json;

use super::{Gateway, NodeStep, StepResult};

impl Gateway {
    /// Opens the step's row, running (or keeps the one a crash left running).
    pub async fn open_child_step(&self, c: &NodeStep<'_>) -> Result<(), super::Error> {
        let step = self.new_step(c, StepStatus::Running);
        c.writer
            .open_step(c.origin, step, self.now())
            .await
            .map_err(|e| super::Error::from_ledger(e, &c.run().run_id))
    }

    /// The step succeeded with its child's output.
    pub async fn child_succeeded(
        &self,
        c: &NodeStep<'_>,
        output: Json,
    ) -> Result<StepResult, super::Error> {
        let finish = StepFinish {
            step_id: c.step_id.clone(),
            status: StepStatus::Succeeded,
            output: Some(output.clone()),
            error: None,
        };
        c.writer
            .finish_step(finish, self.now())
            .await
            .map_err(|e| super::Error::from_ledger(e, &c.run().run_id))?;
        Ok(StepResult::Succeeded { output })
    }

    /// The step failed for good (its child failed or was cancelled, or could not be
    /// started): a node of a child is retried inside the child; a new child would send
    /// every one of its calls again.
    pub async fn child_failed(
        &self,
        c: &NodeStep<'_>,
        kind: ErrorKind,
        message: String,
    ) -> Result<StepResult, super::Error> {
        self.fail_claimed_step(c, kind, message)
            .await
            .map_err(|e| super::Error::from_ledger(e, &c.run().run_id))
    }
}
