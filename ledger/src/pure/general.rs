//! The general way of recording a pure call: every case the one-statement forms leave
//! (a step that exists, a call found terminal or taken over, a key used by another run,
//! a lost lease), statement by statement in one transaction, decided by the same claim
//! table as a side-effecting call (`decide_claim`, `decide_foreign_claim`).

use crate::attempts::{AttemptRecord, insert_attempt};
use crate::calls::{check_foreign, check_identity, read_call, read_call_by_key};
use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::ledger::{Ledger, check_run_lease};
use crate::model::{CallOutcome, Replayed, StepError, StepFinish};
use crate::pure::{PureCall, PureRecorded};
use crate::state::{CallStatus, ClaimDecision, ErrorKind, decide_claim, decide_foreign_claim};
use crate::steps::{create_step_in, finish_step_in};

impl Ledger {
    /// The general way of [`Ledger::record_pure_call`] (`fresh.rs` tries a one-statement
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
                    Some(row) => ledger.pure_over_own(c, &req, row, now).await?,
                    None => ledger.pure_by_key(c, &req, now).await?,
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

    /// A pure call over its own existing row: replayed when it ended, written again
    /// as a new attempt or a takeover, refused when the row is held or in doubt.
    async fn pure_over_own(
        &self,
        c: &mut Conn<'_>,
        req: &PureCall<'_>,
        row: crate::rows::CallRow,
        now: Timestamp,
    ) -> Result<Option<Replayed>, Error> {
        let run = req.run;
        check_identity(&row, &req.tool, &req.idempotency_key, &req.request_hash)?;
        let facts = row.facts()?;
        let d = decide_claim(&facts, req.retry_failed, run.token, row.holder_dead(), now);
        let attempt = match d {
            ClaimDecision::Replay => return Ok(Some(row.replayed(None)?)),
            ClaimDecision::NewAttempt => row.attempt_count + 1,
            ClaimDecision::Takeover => row.attempt_count,
            ClaimDecision::Busy { holder, until } => return Err(Error::Busy { holder, until }),
            ClaimDecision::InDoubt(since) => {
                return Err(Error::InDoubt {
                    since: since.unwrap_or(now),
                });
            }
            ClaimDecision::ToInDoubt | ClaimDecision::Collect => {
                return Err(Error::InvalidTransition {
                    what: "tool call",
                    from: "outbound".into(),
                    to: "recorded as a pure call".into(),
                });
            }
        };
        self.write_pure(c, req, attempt, Some(row.lease_token), now)
            .await?;
        Ok(None)
    }

    /// A pure call with no row of its own: its key's outcome in another run is
    /// replayed (same request), or the call is written as attempt 1.
    async fn pure_by_key(
        &self,
        c: &mut Conn<'_>,
        req: &PureCall<'_>,
        now: Timestamp,
    ) -> Result<Option<Replayed>, Error> {
        let run = req.run;
        let Some(other) = read_call_by_key(c, self, &req.idempotency_key).await? else {
            self.write_pure(c, req, 1, None, now).await?;
            return Ok(None);
        };
        if other.run_id == run.run_id && other.tool_call_id == req.tool_call_id {
            // A racing writer committed our own row between the reads.
            return Err(Error::Busy {
                holder: other.lease_holder.unwrap_or_default(),
                until: Timestamp(other.lease_expires_at.unwrap_or(now.0)),
            });
        }
        check_foreign(&other, &run.run_id, &req.tool, &req.request_hash)?;
        match decide_foreign_claim(&other.facts()?, now) {
            ClaimDecision::Replay => Ok(Some(other.replayed(Some(other.run_id.clone()))?)),
            ClaimDecision::Busy { holder, until } => Err(Error::Busy { holder, until }),
            _ => Err(Error::InDoubt {
                since: Timestamp(other.in_doubt_at.unwrap_or(now.0)),
            }),
        }
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
                outcome: crate::model::AttemptOutcome::of_call(status),
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
    let finish = StepFinish::from_outcome(&req.step.step_id, outcome);
    (finish, result)
}
