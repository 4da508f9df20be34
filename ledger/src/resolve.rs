//! Operator resolution of in-doubt calls, and one-commit recording of pure calls.

use serde_json::json;

use crate::calls::{
    AttemptRecord, check_foreign, check_identity, insert_attempt, read_call, read_call_by_key,
};
use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::{EventType, NewEvent, emit};
use crate::ledger::{Ledger, check_run_lease, read_run_shared};
use crate::model::{
    CallOutcome, PureCall, PureRecorded, Replayed, Resolution, Resolve, StepError, StepFinish,
    ToolCall,
};
use crate::rows::{CallRow, StepRow, call_cols, step_cols};
use crate::state::{
    CallStatus, ClaimDecision, ErrorKind, StepStatus, decide_claim, decide_foreign_claim,
};
use crate::steps::{create_step_in, finish_step_in};

impl Ledger {
    /// Settles an in-doubt call (`flow resume --resolve`), recording who, when and how.
    /// Only from `in_doubt`; any other state is `InvalidTransition` naming it, and only
    /// while the run is not finished (`Terminal` naming its status: a cancelled run's
    /// in-doubt call stays as recorded).
    /// `Succeeded`/`Failed` make the call terminal and finish its paused steps the same
    /// way; `Retry` makes it `claimed` with no holder and an expired lease (same attempt,
    /// same key), so the next claim takes it over and re-sends that key, and puts its
    /// paused steps back to `pending`. Emits `tool_call.resolved`. One transaction.
    pub async fn resolve_call(&self, req: Resolve, now: Timestamp) -> Result<ToolCall, Error> {
        let (status, output, error) = match &req.resolution {
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
        };
        let ledger = self.clone();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                // A finished run (cancelled, failed, succeeded) is a record: settling one
                // of its calls would change it after the fact, and `retry` would make the
                // call claimable with no run left to claim it. Checked in the same
                // transaction as the update, so every caller is covered.
                let run = read_run_shared(c, s, &req.run_id).await?;
                let run_status = run.status()?;
                if run_status.is_terminal() {
                    return Err(Error::Terminal { status: run_status });
                }
                let row = read_call(c, &ledger, &req.run_id, &req.tool_call_id)
                    .await?
                    .ok_or_else(|| Error::NotFound {
                        what: format!("tool call {}/{}", req.run_id, req.tool_call_id),
                    })?;
                let from = row.status()?;
                if from != CallStatus::InDoubt {
                    return Err(Error::InvalidTransition {
                        what: "tool call",
                        from: from.as_str().into(),
                        to: format!("resolved {}", req.resolution.as_str()),
                    });
                }
                crate::state::check_call_transition(from, status)?;
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
                               AND status = 'in_doubt'
                             RETURNING ",
                            call_cols!()
                        ),
                        args![
                            &s.tenant,
                            &s.workspace,
                            &req.run_id,
                            &req.tool_call_id,
                            status.as_str(),
                            output.clone(),
                            error.as_ref().map(|e| e.kind.as_str()),
                            error.as_ref().map(|e| e.message.clone()),
                            req.resolution.as_str(),
                            &req.by,
                            now,
                            req.note.clone(),
                            terminal,
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
                row.into_call()
            })
        })
        .await
    }

    /// The general way of [`Ledger::record_pure_call`] (`pure.rs` tries a one-statement
    /// way for brand-new calls first): every case, statement by statement.
    pub(crate) async fn record_pure_call_in_steps(
        &self,
        req: PureCall<'_>,
        now: Timestamp,
    ) -> Result<PureRecorded, Error> {
        let ledger = self.clone();
        let PureCall {
            run,
            step,
            tool_call_id,
            tool,
            idempotency_key,
            request,
            request_hash,
            outcome,
            retry_failed,
            next_step,
        } = req;
        let run = run.clone();
        self.write(move |c| {
            Box::pin(async move {
                let req = PureCall {
                    run: &run,
                    step,
                    tool_call_id,
                    tool,
                    idempotency_key,
                    request,
                    request_hash,
                    outcome,
                    retry_failed,
                    next_step,
                };
                let run = req.run;
                check_run_lease(c, ledger.scope(), run, Some(now)).await?;
                create_step_in(c, &ledger, &run.run_id, &req.step, now).await?;
                let existing = read_call(c, &ledger, &run.run_id, &req.tool_call_id).await?;
                let replay = match existing {
                    Some(row) => {
                        check_identity(&row, &req.tool, &req.idempotency_key, &req.request_hash)?;
                        let d = decide_claim(
                            &row.facts()?,
                            req.retry_failed,
                            run.token,
                            row.holder_dead(),
                            now,
                        );
                        match d {
                            ClaimDecision::Replay => Some(row.replayed(None)?),
                            ClaimDecision::NewAttempt | ClaimDecision::Takeover => {
                                let attempt = match d {
                                    ClaimDecision::NewAttempt => row.attempt_count + 1,
                                    _ => row.attempt_count,
                                };
                                ledger
                                    .write_pure(c, &req, attempt, Some(row.lease_token), now)
                                    .await?;
                                None
                            }
                            ClaimDecision::Busy { holder, until } => {
                                return Err(Error::Busy { holder, until });
                            }
                            ClaimDecision::InDoubt(since) => {
                                return Err(Error::InDoubt {
                                    since: since.unwrap_or(now),
                                });
                            }
                            ClaimDecision::ToInDoubt => {
                                return Err(Error::InvalidTransition {
                                    what: "tool call",
                                    from: "outbound".into(),
                                    to: "recorded as a pure call".into(),
                                });
                            }
                        }
                    }
                    None => match read_call_by_key(c, &ledger, &req.idempotency_key).await? {
                        Some(other)
                            if other.run_id == run.run_id
                                && other.tool_call_id == req.tool_call_id =>
                        {
                            // A racing writer committed our own row between the reads.
                            return Err(Error::Busy {
                                holder: other.lease_holder.unwrap_or_default(),
                                until: Timestamp(other.lease_expires_at.unwrap_or(now.0)),
                            });
                        }
                        Some(other) => {
                            check_foreign(&other, &run.run_id, &req.tool, &req.request_hash)?;
                            match decide_foreign_claim(&other.facts()?, now) {
                                ClaimDecision::Replay => {
                                    Some(other.replayed(Some(other.run_id.clone()))?)
                                }
                                ClaimDecision::Busy { holder, until } => {
                                    return Err(Error::Busy { holder, until });
                                }
                                _ => {
                                    return Err(Error::InDoubt {
                                        since: Timestamp(other.in_doubt_at.unwrap_or(now.0)),
                                    });
                                }
                            }
                        }
                        None => {
                            ledger.write_pure(c, &req, 1, None, now).await?;
                            None
                        }
                    },
                };
                let (finish, result) = pure_finish(&req, replay);
                finish_step_in(c, &ledger, &run.run_id, &finish, now).await?;
                if let Some(next) = &req.next_step {
                    create_step_in(c, &ledger, &run.run_id, next, now).await?;
                }
                Ok(result)
            })
        })
        .await
    }

    async fn write_pure(
        &self,
        c: &mut Conn<'_>,
        req: &PureCall<'_>,
        attempt: i64,
        prev_token: Option<i64>,
        now: Timestamp,
    ) -> Result<(), Error> {
        let s = self.scope();
        let run = req.run;
        let (status, output, error) = self.outcome_columns(&req.outcome);
        let a = args![
            &s.tenant,
            &s.workspace,
            &run.run_id,
            &req.tool_call_id,
            &req.step.step_id,
            &req.tool,
            &req.idempotency_key,
            req.request.to_string(),
            &req.request_hash,
            status.as_str(),
            attempt,
            output,
            error.as_ref().map(|e| e.kind.as_str()),
            error.as_ref().map(|e| e.message.clone()),
            run.token,
            now,
            prev_token.unwrap_or(0),
        ];
        let n = match prev_token {
            None => {
                c.execute(
                    "INSERT INTO tool_calls (tenant, workspace, run_id, tool_call_id, step_id,
                        tool, idempotency_key, request, request_hash, status, attempt_count,
                        outbound_requests, output, error_kind, error_message, lease_token,
                        run_token, created_at, updated_at, finished_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 0, $12, $13, $14,
                        $17 + 1, $15, $16, $16, $16)",
                    a,
                )
                .await?
            }
            Some(_) => {
                c.execute(
                    "UPDATE tool_calls SET step_id = $5, status = $10, attempt_count = $11,
                        output = $12, error_kind = $13, error_message = $14,
                        lease_token = lease_token + 1, run_token = $15, lease_holder = NULL,
                        lease_expires_at = NULL, updated_at = $16, finished_at = $16
                     WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $4
                       AND tool = $6 AND idempotency_key = $7 AND request = $8
                       AND request_hash = $9 AND lease_token = $17",
                    a,
                )
                .await?
            }
        };
        if n != 1 {
            return Err(Error::LeaseLost);
        }
        insert_attempt(
            c,
            self,
            AttemptRecord {
                run_id: &run.run_id,
                tool_call_id: &req.tool_call_id,
                step_id: &req.step.step_id,
                attempt,
                sent_key: crate::state::attempt_key(
                    &req.idempotency_key,
                    u32::try_from(attempt).unwrap_or(0),
                ),
                outbound_started_at: None,
                outcome: status.as_str(),
                error_kind: error.as_ref().map(|e| e.kind.as_str()),
                error_message: error.as_ref().map(|e| e.message.clone()),
                requests_sent: 0,
            },
            now,
        )
        .await?;
        c.execute(
            "UPDATE steps SET tool_call_id = $5
             WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND step_id = $4",
            args![
                &s.tenant,
                &s.workspace,
                &run.run_id,
                &req.step.step_id,
                &req.tool_call_id
            ],
        )
        .await?;
        Ok(())
    }
}

/// How a pure call's step finishes, and what the caller is told: a call found terminal
/// is replayed with its stored outcome, else the step takes the outcome just observed.
fn pure_finish(req: &PureCall<'_>, replay: Option<Replayed>) -> (StepFinish, PureRecorded) {
    let (outcome, result) = match &replay {
        Some(r) => {
            let outcome = match (r.status, &r.output, &r.error) {
                (CallStatus::Succeeded, out, _) => {
                    CallOutcome::Succeeded(out.clone().unwrap_or(serde_json::Value::Null))
                }
                (_, _, err) => CallOutcome::Failed(err.clone().unwrap_or(StepError {
                    kind: ErrorKind::Permanent,
                    message: "failed".into(),
                })),
            };
            (outcome, PureRecorded::Replayed(r.clone()))
        }
        None => (req.outcome.clone(), PureRecorded::Recorded),
    };
    let finish = match outcome {
        CallOutcome::Succeeded(v) => StepFinish {
            step_id: req.step.step_id.clone(),
            status: StepStatus::Succeeded,
            output: Some(v),
            error: None,
        },
        CallOutcome::Failed(e) => StepFinish {
            step_id: req.step.step_id.clone(),
            status: StepStatus::Failed,
            output: None,
            error: Some(e),
        },
    };
    (finish, result)
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
                    "UPDATE steps SET status = 'pending', updated_at = $5
                     WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND step_id = $4
                       AND status = 'paused'",
                    args![&s.tenant, &s.workspace, &req.run_id, &step.step_id, now],
                )
                .await?;
            }
        }
    }
    Ok(())
}
