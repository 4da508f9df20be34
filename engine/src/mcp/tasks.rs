//! Long calls as MCP tasks (the tasks extension, SEP-2663, server-directed): a call
//! whose run has not finished when `[mcp] wait` ends — it waits for a person, an event
//! or a callback, or simply runs long — answers with a task whose id is the run id.
//!
//! A task is a view of the run, not state of its own: `tasks/get` reads the run from
//! the ledger (so tasks survive a server restart, and any server sharing the ledger
//! answers for them), `tasks/cancel` asks the run to stop as `flow cancel` does. Only
//! a client that declared the extension gets tasks; any other gets the
//! `flow_run_status` answer of [`Front::answer`]. A call that asked for progress (a
//! `progressToken`) of a workflow with `for_each` nodes gets `notifications/progress`
//! with the items ended out of the items listed ([`Front::items_progress`]).

use flow_ledger::{Actor, Run, RunStatus};
use rmcp::model::{CallToolResult, DetailedTask, Task, TaskPayload, TaskStatus};
use serde_json::Value as Json;

use super::{Front, SUBMITTER_PREFIX};

/// How often a client should ask about a task (ms).
const POLL_MS: u64 = 500;

impl Front {
    /// The task of `run`, seeded with what `answer` says about it.
    pub fn task(&self, run: &Run, answer: &CallToolResult) -> Task {
        let now = self.clock.now().to_rfc3339();
        let mut task = Task::new(
            run.id.clone(),
            TaskStatus::Working,
            run.created_at.to_rfc3339(),
            now,
        )
        .with_poll_interval_ms(POLL_MS);
        if let Some(text) = first_text(answer) {
            task = task.with_status_message(text);
        }
        task
    }

    /// `tasks/get`: the run as a task — working (with what it waits for), completed
    /// (with the call's result, an error result for a failed run), or cancelled.
    pub async fn detailed(&self, run: &Run) -> DetailedTask {
        let answer = self.answer(run, false).await;
        let mut task = self.task(run, &answer);
        if let Some(done) = run.finished_at {
            task.last_updated_at = done.to_rfc3339();
        }
        let payload = match run.status {
            RunStatus::Succeeded | RunStatus::Failed => {
                task.status = TaskStatus::Completed;
                match serde_json::to_value(&answer) {
                    Ok(Json::Object(result)) => TaskPayload::Completed { result },
                    _ => TaskPayload::Working,
                }
            }
            RunStatus::Cancelled => {
                task.status = TaskStatus::Cancelled;
                TaskPayload::Cancelled
            }
            RunStatus::Queued | RunStatus::Running | RunStatus::Paused => TaskPayload::Working,
        };
        DetailedTask::new(task, payload)
    }

    /// `tasks/cancel`: asks the run to stop, recorded as the agent's (calls in flight
    /// finish and are recorded; nothing new is sent).
    pub async fn cancel(&self, run_id: &str, principal: &str) -> Result<Run, flow_ledger::Error> {
        let actor = Actor {
            by: format!("{SUBMITTER_PREFIX}{principal}"),
            reason: Some("MCP tasks/cancel".to_owned()),
        };
        self.ledger
            .request_cancel_as(run_id, Some(actor), self.clock.now())
            .await
    }
}

impl Front {
    /// How far `run_id`'s `for_each` nodes are: items ended (succeeded, failed, skipped,
    /// cancelled or in doubt) and items listed, over every such node; `None` before any
    /// list is known. What a call's progress notifications report.
    pub async fn items_progress(&self, run_id: &str) -> Option<(usize, usize)> {
        let view = crate::view::RunView::load(&self.ledger, run_id)
            .await
            .ok()?;
        let mut seen = false;
        let (mut done, mut total) = (0, 0);
        for items in view.nodes.iter().filter_map(|n| n.items.as_ref()) {
            if let Some(t) = items.total {
                seen = true;
                total += t;
                done += items.succeeded
                    + items.failed
                    + items.skipped
                    + items.cancelled
                    + items.in_doubt;
            }
        }
        seen.then_some((done, total))
    }
}

/// The first text block of a result.
fn first_text(result: &CallToolResult) -> Option<String> {
    result
        .content
        .iter()
        .find_map(|c| c.as_text().map(|t| t.text.clone()))
}
