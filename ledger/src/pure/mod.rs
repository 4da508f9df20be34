//! Pure function calls: one module for every way a pure result is written.
//!
//! A pure call never leaves the process, so it needs no claim and no outbound mark: its
//! step, call, attempt row and two events are written together, in one commit.
//! - `fresh.rs`: the common case — a node's first attempt, with no step and no call
//!   yet — in ONE statement per call;
//! - `batch.rs`: many kept first attempts in one statement, all or nothing
//!   ([`Ledger::record_pure_calls`]), and with the run's finish
//!   ([`Ledger::finish_run_with`]): the engine keeps consecutive pure results in memory
//!   and flushes them before anything else is written for the run (see ARCHITECTURE.md,
//!   "Lazy pure results");
//! - `general.rs`: every other case (a step that exists, a call to replay, a key used
//!   elsewhere, a lost lease), statement by statement, deciding it as a claim would.
//!
//! The one-statement forms spell their own inserts: the point of them is that one
//! statement does it all, so they cannot call the general inserts; each mirrors them
//! column for column, and the conformance tests
//! `fresh_pure_call_matches_the_general_way` and
//! `batch_writes_what_one_call_at_a_time_writes` compare what the ways write.

mod batch;
mod fresh;
mod general;
mod types;

use crate::clock::Timestamp;
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::CallOutcome;
use crate::state::StepStatus;

use fresh::{Fresh, write_fresh};
pub use types::{PureBatchRecorded, PureCall, PureRecorded, PureResult};

impl Ledger {
    /// Records a pure in-process function's call in ONE commit: creates the step if
    /// missing, writes the call terminal with its attempt row (no outbound mark and no
    /// usage: nothing leaves the process), finishes the step from the outcome and creates
    /// `next_step` if given. If the call is already terminal, replay semantics apply (a
    /// succeeded call is never overwritten; a failed one only with `retry_failed`): the
    /// step is finished with the stored outcome, which is returned.
    pub async fn record_pure_call(
        &self,
        req: PureCall<'_>,
        now: Timestamp,
    ) -> Result<PureRecorded, Error> {
        if let Some(fresh) = self.fresh_of(&req, now) {
            let ledger = self.clone();
            let run = req.run.clone();
            let written = self
                .write_statement(move |c| {
                    Box::pin(async move { write_fresh(c, &ledger, &run, &fresh, now).await })
                })
                .await;
            // Anything but a clean write (a step or call that exists, a lost lease, a
            // racing writer's unique violation) is decided by the general way.
            if matches!(written, Ok(true)) {
                return Ok(PureRecorded::Recorded);
            }
        }
        self.record_pure_call_in_steps(req, now).await
    }

    /// The one-statement form of `req`, when it is a brand-new step with nothing else
    /// to do (no retry step to create, an output within the limit).
    fn fresh_of(&self, req: &PureCall<'_>, now: Timestamp) -> Option<Fresh> {
        if req.step.status != StepStatus::Running
            || req.step.not_before.is_some()
            || req.next_step.is_some()
            || req.step.step_id.is_empty()
        {
            return None;
        }
        let (status, output, error) = match &req.outcome {
            CallOutcome::Succeeded(v) => (
                StepStatus::Succeeded,
                Some(self.checked_json(v).ok()?),
                None,
            ),
            CallOutcome::Failed(e) => (StepStatus::Failed, None, Some(e.clone())),
        };
        Some(Fresh {
            step_id: req.step.step_id.clone(),
            node_id: req.step.node_id.clone(),
            retry: req.step.retry,
            tool_call_id: req.tool_call_id.clone(),
            tool: req.tool.clone(),
            key: req.idempotency_key.clone(),
            request: req.request.to_string(),
            request_hash: req.request_hash.clone(),
            status,
            output,
            error,
            started_at: now,
            finished_at: now,
        })
    }
}
