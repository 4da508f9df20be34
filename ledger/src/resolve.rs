//! Operator resolution of in-doubt calls (`flow resume --resolve`, the API's resolve).
//! Pure calls are recorded in `pure/`.

use serde_json::json;

use crate::calls::read_call;
use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::{EventType, NewEvent, emit};
use crate::ledger::Ledger;
use crate::model::{Actor, Resolution, Resolve, StepError, StepFinish, ToolCall};
use crate::rows::{CallRow, IntRow, StepRow, call_cols, step_cols};
use crate::run_states::requeue_in;
use crate::runs::run_for_update;
use crate::state::{CallStatus, CallTransition, ErrorKind, RunStatus, RunTransition, StepStatus};
use crate::steps::finish_step_in;

impl Ledger {
    /// Settles an in-doubt call (`flow resume --resolve`), recording who, when and how.
    /// Only from `in_doubt`; any other state is `InvalidTransition` naming it.
    /// `Succeeded`/`Failed` make the call terminal and finish its paused steps the same
    /// way — also on a finished run (a cancelled run's call whose money moved must be
    /// recordable); `Retry` makes it `claimed` with no holder and an expired lease (same
    /// attempt, same key), so the next claim takes it over and re-sends that key, and
    /// puts its paused steps back to `pending` — refused with `Terminal` on a finished
    /// run, which has nobody left to send. Emits `tool_call.resolved`. When this settles
    /// the last doubt of a paused run, the run goes back on the queue (`run.queued`) in
    /// the same transaction, so whoever settles it — CLI, API, console, reconciler —
    /// leaves no run paused with nothing in doubt. One transaction.
    pub async fn resolve_call(&self, req: Resolve, now: Timestamp) -> Result<ToolCall, Error> {
        let (status, output, error) = self.resolved_columns(&req.resolution)?;
        let ledger = self.clone();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                // `retry` on a finished run (cancelled, failed, succeeded) would make the
                // call claimable with no run left to claim it. Checked in the same
                // transaction as the update, so every caller is covered. The run row is
                // locked first (before the call), so two resolutions of one run's calls
                // agree on whether the last doubt is gone.
                let run = run_for_update(c, s, &req.run_id).await?;
                let run_status = run.status()?;
                if run_status.is_terminal() && matches!(req.resolution, Resolution::Retry) {
                    return Err(Error::Terminal { status: run_status });
                }
                let row = read_call(c, &ledger, &req.run_id, &req.tool_call_id)
                    .await?
                    .ok_or_else(|| Error::NotFound {
                        what: format!("tool call {}/{}", req.run_id, req.tool_call_id),
                    })?;
                let edge = match req.resolution {
                    Resolution::Retry => CallTransition::ResolveRetry,
                    Resolution::Succeeded(_) | Resolution::Failed(_) => {
                        CallTransition::ResolveTerminal
                    }
                };
                let (from, to) = edge.to(status)?;
                let found = row.status()?;
                if found != from {
                    return Err(Error::InvalidTransition {
                        what: "tool call",
                        from: found.as_str().into(),
                        to: format!("resolved {}", req.resolution.as_str()),
                    });
                }
                let terminal = status.is_terminal();
                let row = c
                    .optional::<CallRow>(
                        concat!(
                            "UPDATE tool_calls SET status = $5, output = $6, error_kind = $7,
                                error_message = $8, resolution = $9, resolved_by = $10,
                                resolved_at = $11, resolution_note = $12, updated_at = $11,
                                finished_at = CASE WHEN $13 THEN $11 ELSE NULL END,
                                lease_holder = NULL,
                                lease_expires_at = CASE WHEN $13 THEN NULL ELSE $11 END,
                                lease_token = lease_token + 1
                             WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $4
                               AND status = $14
                             RETURNING ",
                            call_cols!()
                        ),
                        args![
                            &s.tenant,
                            &s.workspace,
                            &req.run_id,
                            &req.tool_call_id,
                            to.as_str(),
                            output.clone(),
                            error.as_ref().map(|e| e.kind.as_str()),
                            error.as_ref().map(|e| e.message.clone()),
                            req.resolution.as_str(),
                            &req.by,
                            now,
                            req.note.clone(),
                            terminal,
                            from.as_str(),
                        ],
                    )
                    .await?
                    .ok_or(Error::LeaseLost)?;
                let paused = c
                    .all::<StepRow>(
                        concat!(
                            "SELECT ",
                            step_cols!(),
                            " FROM steps WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                               AND tool_call_id = $4 AND status = 'paused'"
                        ),
                        args![&s.tenant, &s.workspace, &req.run_id, &req.tool_call_id],
                    )
                    .await?;
                settle_paused(c, &ledger, &req, paused, error.as_ref(), now).await?;
                let payload = json!({
                    "resolution": req.resolution.as_str(),
                    "by": req.by,
                    "note": req.note,
                    "tool": row.tool,
                    "attempt": row.attempt_count,
                });
                emit(
                    c,
                    s,
                    now,
                    NewEvent {
                        event_type: EventType::ToolCallResolved,
                        run_id: &req.run_id,
                        step_id: Some(&row.step_id),
                        tool_call_id: Some(&req.tool_call_id),
                        payload,
                    },
                )
                .await?;
                if run_status == RunStatus::Paused {
                    requeue_if_settled(c, &ledger, &run, &req, now).await?;
                }
                row.into_call()
            })
        })
        .await
    }
}

impl Ledger {
    /// The call's status, stored output and error a resolution writes.
    fn resolved_columns(
        &self,
        resolution: &Resolution,
    ) -> Result<(CallStatus, Option<String>, Option<StepError>), Error> {
        Ok(match resolution {
            Resolution::Succeeded(v) => (CallStatus::Succeeded, Some(self.checked_json(v)?), None),
            Resolution::Failed(m) => (
                CallStatus::Failed,
                None,
                Some(StepError {
                    kind: ErrorKind::Permanent,
                    message: m.clone(),
                }),
            ),
            Resolution::Retry => (CallStatus::Claimed, None, None),
        })
    }
}

/// Puts the paused run `run` back on the queue once none of its calls is in doubt
/// any more (in the resolution's transaction, audited as the resolver).
async fn requeue_if_settled(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run: &crate::rows::RunRow,
    req: &Resolve,
    now: Timestamp,
) -> Result<(), Error> {
    if first_in_doubt(c, ledger, &req.run_id).await?.is_some() {
        return Ok(());
    }
    let to = RunTransition::Requeue.check(RunStatus::Paused, RunStatus::Queued)?;
    let actor = Actor {
        by: req.by.clone(),
        reason: req.note.clone(),
    };
    requeue_in(c, ledger.scope(), run, to, Some(&actor), now).await?;
    Ok(())
}

/// When the earliest call of `run_id` still in doubt became so; `None` when none of
/// the run's calls is in doubt (in the caller's transaction). One question for both
/// callers: a resolution re-queues the run when it settled the last doubt, and a
/// redrive is refused while one is left, saying since when (`Error::InDoubt`).
pub(crate) async fn first_in_doubt(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run_id: &str,
) -> Result<Option<Timestamp>, Error> {
    let s = ledger.scope();
    let since = c
        .optional::<IntRow>(
            "SELECT COALESCE(MIN(in_doubt_at), 0) AS n FROM tool_calls
             WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND status = $4
             HAVING COUNT(*) > 0",
            args![
                &s.tenant,
                &s.workspace,
                run_id,
                CallStatus::InDoubt.as_str()
            ],
        )
        .await?;
    Ok(since.map(|row| Timestamp(row.n)))
}

/// Whether `step` is the step of a callback node's wait (`callback:`).
async fn waits_for_callback(
    c: &mut Conn<'_>,
    s: &crate::model::Scope,
    run_id: &str,
    step: &StepRow,
) -> Result<bool, Error> {
    let found = c
        .optional::<(i64,)>(
            "SELECT CAST(1 AS BIGINT) FROM waits WHERE tenant = $1 AND workspace = $2
               AND run_id = $3 AND node_id = $4 AND step_id = $5 AND kind = 'callback'",
            args![
                &s.tenant,
                &s.workspace,
                run_id,
                &step.node_id,
                &step.step_id
            ],
        )
        .await?;
    Ok(found.is_some())
}

/// Finishes the steps paused on a resolved call as the resolution says (`retry` puts
/// them back to `pending`), in the resolution's transaction.
async fn settle_paused(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    req: &Resolve,
    paused: Vec<StepRow>,
    error: Option<&StepError>,
    now: Timestamp,
) -> Result<(), Error> {
    let s = ledger.scope();
    for step in paused {
        // A callback node's call that succeeded is not its step's end: the step goes on
        // (running) and its next holder replays the call, then reads the callback.
        if matches!(req.resolution, Resolution::Succeeded(_))
            && waits_for_callback(c, s, &req.run_id, &step).await?
        {
            c.execute(
                "UPDATE steps SET status = $6, updated_at = $5
                 WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND step_id = $4",
                args![
                    &s.tenant,
                    &s.workspace,
                    &req.run_id,
                    &step.step_id,
                    now,
                    StepStatus::Running.as_str()
                ],
            )
            .await?;
            continue;
        }
        let next = match &req.resolution {
            Resolution::Succeeded(v) => Some((StepStatus::Succeeded, Some(v.clone()))),
            Resolution::Failed(_) => Some((StepStatus::Failed, None)),
            Resolution::Retry => None,
        };
        match next {
            Some((st, out)) => {
                let finish = StepFinish {
                    step_id: step.step_id.clone(),
                    status: st,
                    output: out,
                    error: error.cloned(),
                };
                finish_step_in(c, ledger, &req.run_id, &finish, now).await?;
            }
            None => {
                c.execute(
                    "UPDATE steps SET status = $6, updated_at = $5
                     WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND step_id = $4
                       AND status = $7",
                    args![
                        &s.tenant,
                        &s.workspace,
                        &req.run_id,
                        &step.step_id,
                        now,
                        StepStatus::Pending.as_str(),
                        StepStatus::Paused.as_str(),
                    ],
                )
                .await?;
            }
        }
    }
    Ok(())
}
