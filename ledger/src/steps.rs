//! Steps: one attempt of a node (`node`, `node_retry<n>`), fenced by the run lease.
//!
//! The `*_in` functions take the caller's connection so that `complete_call` and
//! `record_pure_call` can finish a step and create the next one in their own transaction.

use serde_json::json;

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::{EventType, NewEvent, emit};
use crate::ledger::{Ledger, check_run_lease, output_refused};
use crate::model::{NewStep, RunLease, Step, StepFinish};
use crate::rows::{StepRow, step_cols};
use crate::state::StepStatus;

const SELECT_STEP: (&str, &str) = (
    concat!(
        "SELECT ",
        step_cols!(),
        " FROM steps WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND step_id = $4"
    ),
    concat!(
        "SELECT ",
        step_cols!(),
        " FROM steps WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND step_id = $4 FOR UPDATE"
    ),
);

pub(crate) async fn read_step(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run_id: &str,
    step_id: &str,
) -> Result<Option<StepRow>, Error> {
    let s = ledger.scope();
    let (sqlite, pg) = SELECT_STEP;
    let sql = c.pick(sqlite, pg);
    c.optional::<StepRow>(sql, args![&s.tenant, &s.workspace, run_id, step_id])
        .await
}

/// Creates a step unless the same one exists (same node and retry: returned as is).
pub(crate) async fn create_step_in(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run_id: &str,
    step: &NewStep,
    now: Timestamp,
) -> Result<StepRow, Error> {
    if !matches!(
        step.status,
        StepStatus::Pending | StepStatus::Running | StepStatus::Skipped
    ) {
        return Err(Error::InvalidTransition {
            what: "step",
            from: "new".into(),
            to: step.status.as_str().into(),
        });
    }
    let s = ledger.scope();
    let running = step.status == StepStatus::Running;
    let skipped = step.status == StepStatus::Skipped;
    let inserted = c
        .optional::<StepRow>(
            concat!(
                "INSERT INTO steps (tenant, workspace, run_id, step_id, node_id, retry, status,
                    not_before, created_at, updated_at, started_at, finished_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10, $11)
                 ON CONFLICT DO NOTHING
                 RETURNING ",
                step_cols!()
            ),
            args![
                &s.tenant,
                &s.workspace,
                run_id,
                &step.step_id,
                &step.node_id,
                step.retry,
                step.status.as_str(),
                step.not_before,
                now,
                running.then_some(now),
                skipped.then_some(now),
            ],
        )
        .await?;
    let Some(row) = inserted else {
        let row = read_step(c, ledger, run_id, &step.step_id)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: format!("step {run_id}/{}", step.step_id),
            })?;
        if row.node_id != step.node_id || row.retry != i64::from(step.retry) {
            return Err(Error::Conflict {
                other_run: run_id.to_owned(),
                other_node: row.node_id,
                reason: format!(
                    "step {} already exists for another node or retry",
                    step.step_id
                ),
            });
        }
        return Ok(row);
    };
    let event = match step.status {
        StepStatus::Running => Some(EventType::StepStarted),
        StepStatus::Pending if step.retry > 0 => Some(EventType::StepRetryScheduled),
        _ => None,
    };
    if let Some(event) = event {
        let payload = json!({
            "node_id": step.node_id,
            "retry": step.retry,
            "not_before": step.not_before,
        });
        emit(
            c,
            s,
            now,
            NewEvent {
                event_type: event,
                run_id,
                step_id: Some(&step.step_id),
                tool_call_id: None,
                payload,
            },
        )
        .await?;
    }
    Ok(row)
}

/// Finishes a step. A success whose output is over the limit becomes a permanent
/// failure naming the limit and the size. Repeating the same finish is a no-op.
pub(crate) async fn finish_step_in(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run_id: &str,
    finish: &StepFinish,
    now: Timestamp,
) -> Result<StepRow, Error> {
    if !matches!(
        finish.status,
        StepStatus::Succeeded | StepStatus::Failed | StepStatus::Skipped | StepStatus::Cancelled
    ) {
        return Err(Error::InvalidTransition {
            what: "step",
            from: "finish".into(),
            to: finish.status.as_str().into(),
        });
    }
    let row = read_step(c, ledger, run_id, &finish.step_id)
        .await?
        .ok_or_else(|| Error::NotFound {
            what: format!("step {run_id}/{}", finish.step_id),
        })?;
    let from = row.status()?;
    from.check_transition(finish.status)?;
    if from == finish.status {
        return Ok(row);
    }
    let mut status = finish.status;
    let mut error = finish.error.clone();
    let mut output = None;
    if let Some(v) = &finish.output {
        match ledger.checked_json(v) {
            Ok(s) => output = Some(s),
            Err(e) => {
                status = StepStatus::Failed;
                error = Some(output_refused(e));
            }
        }
    }
    let s = ledger.scope();
    // A step that ran to an outcome started, even when nothing marked it running first
    // (a pure retry step goes from pending to its outcome in one write); skipped and
    // cancelled steps never started.
    let started = matches!(status, StepStatus::Succeeded | StepStatus::Failed).then_some(now);
    let row = c
        .optional::<StepRow>(
            concat!(
                "UPDATE steps SET status = $5, output = $6, error_kind = $7, error_message = $8,
                    finished_at = $9, updated_at = $9, started_at = COALESCE(started_at, $11)
                 WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND step_id = $4
                   AND status = $10
                 RETURNING ",
                step_cols!()
            ),
            args![
                &s.tenant,
                &s.workspace,
                run_id,
                &finish.step_id,
                status.as_str(),
                output,
                error.as_ref().map(|e| e.kind.as_str()),
                error.as_ref().map(|e| e.message.clone()),
                now,
                from.as_str(),
                started,
            ],
        )
        .await?
        .ok_or(Error::LeaseLost)?;
    let event = match status {
        StepStatus::Succeeded => Some(EventType::StepSucceeded),
        StepStatus::Failed => Some(EventType::StepFailed),
        _ => None,
    };
    if let Some(event) = event {
        let payload = json!({
            "node_id": row.node_id,
            "retry": row.retry,
            "error_kind": error.as_ref().map(|e| e.kind.as_str()),
            "error": error.as_ref().map(|e| e.message.clone()),
        });
        emit(
            c,
            s,
            now,
            NewEvent {
                event_type: event,
                run_id,
                step_id: Some(&finish.step_id),
                tool_call_id: row.tool_call_id.as_deref(),
                payload,
            },
        )
        .await?;
    }
    Ok(row)
}

/// Pauses the given steps of a run that are pending or running (their call is in doubt)
/// and ties them to the call.
pub(crate) async fn pause_steps_in(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run_id: &str,
    step_ids: [&str; 2],
    tool_call_id: &str,
    now: Timestamp,
) -> Result<(), Error> {
    let s = ledger.scope();
    c.execute(
        "UPDATE steps SET status = $8, tool_call_id = $6, updated_at = $7
         WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND step_id IN ($4, $5)
           AND status IN ($9, $10)",
        args![
            &s.tenant,
            &s.workspace,
            run_id,
            step_ids[0],
            step_ids[1],
            tool_call_id,
            now,
            StepStatus::Paused.as_str(),
            StepStatus::Pending.as_str(),
            StepStatus::Running.as_str(),
        ],
    )
    .await?;
    Ok(())
}

impl Ledger {
    /// Creates a step (fenced by the run lease). Idempotent: the same step id with the
    /// same node and retry returns the existing row. Emits `step.started` when created
    /// running, `step.retry_scheduled` when a retry is created pending.
    pub async fn create_step(
        &self,
        lease: &RunLease,
        step: NewStep,
        now: Timestamp,
    ) -> Result<Step, Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        self.write(move |c| {
            Box::pin(async move {
                check_run_lease(c, ledger.scope(), &lease, None).await?;
                let row = create_step_in(c, &ledger, &lease.run_id, &step, now).await?;
                row.into_step()
            })
        })
        .await
    }

    /// pending → running (fenced). Starting a running step again is a no-op.
    /// Emits `step.started`.
    pub async fn start_step(
        &self,
        lease: &RunLease,
        step_id: &str,
        now: Timestamp,
    ) -> Result<Step, Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        let step_id = step_id.to_owned();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let step_id = step_id.as_str();
                check_run_lease(c, s, &lease, None).await?;
                let row = read_step(c, &ledger, &lease.run_id, step_id)
                    .await?
                    .ok_or_else(|| Error::NotFound {
                        what: format!("step {}/{step_id}", lease.run_id),
                    })?;
                let from = row.status()?;
                if from == StepStatus::Running {
                    return row.into_step();
                }
                from.check_transition(StepStatus::Running)?;
                let row = c
                    .optional::<StepRow>(
                        concat!(
                            "UPDATE steps SET status = $7, started_at = COALESCE(started_at, $5),
                                updated_at = $5
                             WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND step_id = $4
                               AND status = $6
                             RETURNING ",
                            step_cols!()
                        ),
                        args![
                            &s.tenant,
                            &s.workspace,
                            &lease.run_id,
                            step_id,
                            now,
                            from.as_str(),
                            StepStatus::Running.as_str()
                        ],
                    )
                    .await?
                    .ok_or(Error::LeaseLost)?;
                let payload = json!({ "node_id": row.node_id, "retry": row.retry });
                emit(
                    c,
                    s,
                    now,
                    NewEvent {
                        event_type: EventType::StepStarted,
                        run_id: &lease.run_id,
                        step_id: Some(step_id),
                        tool_call_id: None,
                        payload,
                    },
                )
                .await?;
                row.into_step()
            })
        })
        .await
    }

    /// Finishes a step (fenced). Returns the stored step: check its status, since an
    /// output over the limit turns a success into a permanent failure. Emits
    /// `step.succeeded` / `step.failed`.
    pub async fn finish_step(
        &self,
        lease: &RunLease,
        finish: StepFinish,
        now: Timestamp,
    ) -> Result<Step, Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        self.write(move |c| {
            Box::pin(async move {
                check_run_lease(c, ledger.scope(), &lease, None).await?;
                let row = finish_step_in(c, &ledger, &lease.run_id, &finish, now).await?;
                row.into_step()
            })
        })
        .await
    }
}
