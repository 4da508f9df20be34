//! Claiming a tool call: the claim rules of the crate docs (`lib.rs`).
//!
//! One transaction: check the caller's run lease, read the call by id (then by key),
//! let `state::decide_claim` decide, and perform exactly that conditional write. SQLite
//! serializes claimers with `BEGIN IMMEDIATE`; PostgreSQL with `INSERT … ON CONFLICT DO
//! NOTHING` followed by `SELECT … FOR UPDATE`, so two racing claimers never both win and a
//! unique violation never reaches the caller.

use serde_json::json;

use crate::attempts::{AttemptRecord, insert_attempt};
use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::{EventType, NewEvent, emit};
use crate::ledger::{Ledger, check_run_lease};
use crate::model::{CallClaim, CallLease, ClaimCall};
use crate::rows::{CallRow, call_cols};
use crate::state::{
    CallStatus, CallTransition, ClaimDecision, StepStatus, attempt_key, decide_claim,
    decide_foreign_claim,
};
use crate::steps::pause_steps_in;
use crate::worker::WorkerId;

const SELECT_CALL: (&str, &str) = (
    concat!(
        "SELECT ",
        call_cols!(),
        " FROM tool_calls WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $4"
    ),
    concat!(
        "SELECT ",
        call_cols!(),
        " FROM tool_calls WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $4 FOR UPDATE"
    ),
);

const SELECT_CALL_BY_KEY: (&str, &str) = (
    concat!(
        "SELECT ",
        call_cols!(),
        " FROM tool_calls WHERE tenant = $1 AND workspace = $2 AND idempotency_key = $3"
    ),
    concat!(
        "SELECT ",
        call_cols!(),
        " FROM tool_calls WHERE tenant = $1 AND workspace = $2 AND idempotency_key = $3 FOR UPDATE"
    ),
);

const SELECT_CALL_OR_KEY: (&str, &str) = (
    concat!(
        "SELECT ",
        call_cols!(),
        " FROM tool_calls WHERE tenant = $1 AND workspace = $2
           AND ((run_id = $3 AND tool_call_id = $4) OR idempotency_key = $5)"
    ),
    concat!(
        "SELECT ",
        call_cols!(),
        " FROM tool_calls WHERE tenant = $1 AND workspace = $2
           AND ((run_id = $3 AND tool_call_id = $4) OR idempotency_key = $5) FOR UPDATE"
    ),
);

/// How many times a claim re-reads after losing an insert race before giving up with a
/// retryable error (one re-read always suffices; the bound only guards against a bug).
const CLAIM_ROUNDS: usize = 4;

pub(crate) async fn read_call(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run_id: &str,
    tool_call_id: &str,
) -> Result<Option<CallRow>, Error> {
    let s = ledger.scope();
    let (sqlite, pg) = SELECT_CALL;
    let sql = c.pick(sqlite, pg);
    c.optional::<CallRow>(sql, args![&s.tenant, &s.workspace, run_id, tool_call_id])
        .await
}

/// Reads a call by id and any call using its key, in one statement (one round trip and
/// one snapshot): `(own row, another call with the key)`.
pub(crate) async fn read_call_and_key(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run_id: &str,
    tool_call_id: &str,
    key: &str,
) -> Result<(Option<CallRow>, Option<CallRow>), Error> {
    let s = ledger.scope();
    let (sqlite, pg) = SELECT_CALL_OR_KEY;
    let sql = c.pick(sqlite, pg);
    let rows = c
        .all::<CallRow>(
            sql,
            args![&s.tenant, &s.workspace, run_id, tool_call_id, key],
        )
        .await?;
    let (own, other): (Vec<_>, Vec<_>) = rows
        .into_iter()
        .partition(|r| r.run_id == run_id && r.tool_call_id == tool_call_id);
    Ok((own.into_iter().next(), other.into_iter().next()))
}

pub(crate) async fn read_call_by_key(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    key: &str,
) -> Result<Option<CallRow>, Error> {
    let s = ledger.scope();
    let (sqlite, pg) = SELECT_CALL_BY_KEY;
    let sql = c.pick(sqlite, pg);
    c.optional::<CallRow>(sql, args![&s.tenant, &s.workspace, key])
        .await
}

/// The identity check of a call row against a claim: same tool, key and request.
pub(crate) fn check_identity(
    row: &CallRow,
    tool: &str,
    key: &str,
    request_hash: &str,
) -> Result<(), Error> {
    let reason = if row.tool != tool {
        format!(
            "tool call was recorded for tool {:?}, now {tool:?}",
            row.tool
        )
    } else if row.idempotency_key != key {
        format!(
            "tool call was recorded with idempotency key {:?}, now {key:?}",
            row.idempotency_key
        )
    } else if row.request_hash != request_hash {
        "tool call identity was reused with a different request".to_owned()
    } else {
        return Ok(());
    };
    Err(Error::Conflict {
        other_run: row.run_id.clone(),
        other_node: row.tool_call_id.clone(),
        reason,
    })
}

/// The check of another call that already uses the claimed key.
pub(crate) fn check_foreign(
    other: &CallRow,
    run_id: &str,
    tool: &str,
    request_hash: &str,
) -> Result<(), Error> {
    let reason = if other.run_id == run_id {
        "idempotency key already used by another node of this run".to_owned()
    } else if other.tool != tool || other.request_hash != request_hash {
        "idempotency key already used by another run with a different request".to_owned()
    } else {
        return Ok(());
    };
    Err(Error::Conflict {
        other_run: other.run_id.clone(),
        other_node: other.tool_call_id.clone(),
        reason,
    })
}

/// Writes the `tool_call.in_doubt` event.
pub(crate) async fn emit_in_doubt(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    row: &CallRow,
    reason: &str,
    now: Timestamp,
) -> Result<(), Error> {
    let payload = json!({
        "tool": row.tool,
        "attempt": row.attempt_count,
        "key": attempt_key(&row.idempotency_key, u32::try_from(row.attempt_count).unwrap_or(0)),
        "outbound_started_at": row.outbound_started_at.map(Timestamp),
        "step_id": row.step_id,
        "reason": reason,
    });
    emit(
        c,
        ledger.scope(),
        now,
        NewEvent {
            event_type: EventType::ToolCallInDoubt,
            run_id: &row.run_id,
            step_id: Some(&row.step_id),
            tool_call_id: Some(&row.tool_call_id),
            payload,
        },
    )
    .await
}

/// Every call of run `run_id` left `outbound` goes to `in_doubt`, as a takeover would
/// put it (attempt row, `uncounted_sends`, event), in the caller's transaction. For a run
/// cancelled while nobody held it: no later claim will take its calls over, so without
/// this a crashed send would stay `outbound` for ever — in no inbox, no gauge.
pub(crate) async fn abandoned_to_in_doubt(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run_id: &str,
    now: Timestamp,
) -> Result<(), Error> {
    let s = ledger.scope();
    let rows = c
        .all::<CallRow>(
            concat!(
                "SELECT ",
                call_cols!(),
                " FROM tool_calls WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                   AND status = $4"
            ),
            args![
                &s.tenant,
                &s.workspace,
                run_id,
                CallStatus::Outbound.as_str()
            ],
        )
        .await?;
    for row in rows {
        take_over_to_in_doubt(c, ledger, &row, &row.step_id, now).await?;
    }
    Ok(())
}

/// Moves an abandoned `outbound` call to `in_doubt` (takeover), with its attempt row,
/// paused steps and event. The row keeps its `lease_expires_at` (unless its holder is
/// provably dead): the end of the lease the worker it is taken from held, after which
/// that worker's fence lets nothing more leave — what a person resolving it is shown
/// and waits for. The holder and token are cleared, so no fence passes.
async fn take_over_to_in_doubt(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    row: &CallRow,
    caller_step: &str,
    now: Timestamp,
) -> Result<(), Error> {
    let s = ledger.scope();
    let (from, to) = CallTransition::ToInDoubt.states();
    let n = c
        .execute(
            "UPDATE tool_calls SET status = $7, in_doubt_at = $5, lease_holder = NULL,
                lease_expires_at = CASE WHEN $9 THEN NULL ELSE lease_expires_at END,
                lease_token = lease_token + 1, updated_at = $5,
                uncounted_sends = uncounted_sends + 1
             WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $4
               AND status = $8 AND lease_token = $6",
            args![
                &s.tenant,
                &s.workspace,
                &row.run_id,
                &row.tool_call_id,
                now,
                row.lease_token,
                to.as_str(),
                from.as_str(),
                row.holder_dead(),
            ],
        )
        .await?;
    if n == 0 {
        return Err(Error::Backend {
            message: "tool call changed under a row lock".into(),
            retryable: true,
        });
    }
    let reason = format!(
        "lease of {} ended after the request may have left; outcome unknown",
        row.lease_holder.as_deref().unwrap_or("?")
    );
    insert_attempt(
        c,
        ledger,
        AttemptRecord {
            run_id: &row.run_id,
            tool_call_id: &row.tool_call_id,
            step_id: &row.step_id,
            attempt: row.attempt_count,
            sent_key: attempt_key(
                &row.idempotency_key,
                u32::try_from(row.attempt_count).unwrap_or(0),
            ),
            outbound_started_at: row.outbound_started_at,
            outcome: crate::model::AttemptOutcome::Unknown,
            error_kind: Some("unknown"),
            error_message: Some(reason.clone()),
            requests_sent: 0,
        },
        now,
    )
    .await?;
    pause_steps_in(
        c,
        ledger,
        &row.run_id,
        [&row.step_id, caller_step],
        &row.tool_call_id,
        now,
    )
    .await?;
    emit_in_doubt(c, ledger, row, &reason, now).await
}

/// Requests sent under the current effect attempt of `row` whose outcome stayed unknown
/// (its `unknown` attempt rows; a crash takeover records 0 requests for a send that may
/// have left, so each row counts at least one). Read only when a claim takes over a
/// `claimed` call: the rare path after a crash or a `retry` resolution.
async fn unknown_sends(c: &mut Conn<'_>, ledger: &Ledger, row: &CallRow) -> Result<u32, Error> {
    let s = ledger.scope();
    let (n,) = c
        .optional::<(i64,)>(
            "SELECT CAST(COALESCE(SUM(CASE WHEN requests_sent > 0 THEN requests_sent ELSE 1 END), 0) AS BIGINT)
             FROM tool_call_attempts
             WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $4
               AND attempt = $5 AND outcome = 'unknown'",
            args![
                &s.tenant,
                &s.workspace,
                &row.run_id,
                &row.tool_call_id,
                row.attempt_count,
            ],
        )
        .await?
        .unwrap_or((0,));
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// A fenced statement over one call and the edge of the call's status machine it
/// takes: the two are written together so a statement cannot be run under another edge.
pub(crate) struct CallEdge {
    /// The statement (its `$n` as the caller binds them).
    pub(crate) sql: &'static str,
    /// The edge it takes (`from` and `to` bound from it).
    pub(crate) edge: CallTransition,
}

/// A failed call's next attempt, claimed by this run (fenced by the token read;
/// `CallTransition::RetryFailed`, `$11` → `$12`).
const CLAIM_NEW_ATTEMPT: CallEdge = CallEdge {
    sql: concat!(
        "UPDATE tool_calls SET status = $12, attempt_count = attempt_count + 1,
            lease_holder = $5, lease_token = lease_token + 1, run_token = $6,
            lease_expires_at = $7, step_id = $8, output = NULL, error_kind = NULL,
            error_message = NULL, finished_at = NULL, updated_at = $9,
            trace_parent = NULL, trace_state = NULL
         WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $4
           AND status = $11 AND lease_token = $10
         RETURNING ",
        call_cols!()
    ),
    edge: CallTransition::RetryFailed,
};

/// An abandoned `claimed` call taken over by this run (fenced by the token read;
/// `CallTransition::Takeover`, `$11` → `$12`).
const CLAIM_TAKEOVER: CallEdge = CallEdge {
    sql: concat!(
        "UPDATE tool_calls SET status = $12, lease_holder = $5, lease_token = lease_token + 1,
            run_token = $6, lease_expires_at = $7, step_id = $8, updated_at = $9
         WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $4
           AND status = $11 AND lease_token = $10
         RETURNING ",
        call_cols!()
    ),
    edge: CallTransition::Takeover,
};

/// An abandoned `outbound` call with a recorded remote task, taken over by this run to
/// collect the task (fenced by the token read; `CallTransition::Collect`, `$11` → `$12`):
/// still outbound, same attempt and key, and the request is not sent again.
const CLAIM_COLLECT: CallEdge = CallEdge {
    sql: concat!(
        "UPDATE tool_calls SET status = $12, lease_holder = $5, lease_token = lease_token + 1,
            run_token = $6, lease_expires_at = $7, step_id = $8, updated_at = $9
         WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND tool_call_id = $4
           AND status = $11 AND lease_token = $10 AND remote_task IS NOT NULL
         RETURNING ",
        call_cols!()
    ),
    edge: CallTransition::Collect,
};

/// The lease a claim that updated `row` as `decision` said hands back: a takeover
/// carries the sends whose outcome stayed unknown, a collection its remote task.
async fn lease_after(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    row: &CallRow,
    worker: &WorkerId,
    decision: &ClaimDecision,
) -> Result<CallLease, Error> {
    let prior_sends = match decision {
        ClaimDecision::Takeover => unknown_sends(c, ledger, row).await?,
        // A collected call's request left once; its outcome is not known yet.
        ClaimDecision::Collect => 1,
        _ => 0,
    };
    let mut lease = ledger.lease_from(row, worker, prior_sends)?;
    if *decision == ClaimDecision::Collect {
        lease.remote_task.clone_from(&row.remote_task);
    }
    Ok(lease)
}

/// Pauses the claiming step, tied to its call: the call is in doubt (in this run or in
/// the other one that holds the key), so the step waits on it.
async fn pause_claimer(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    req: &ClaimCall<'_>,
    now: Timestamp,
) -> Result<(), Error> {
    let step = req.step_id.as_str();
    pause_steps_in(
        c,
        ledger,
        &req.run.run_id,
        [step, step],
        &req.tool_call_id,
        now,
    )
    .await
}

/// The claim of a key that another call holds (another run's, or this run's under
/// another node): that call's outcome, `Busy` while it is leased, or in doubt with it
/// (this step paused too).
async fn claim_foreign(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    req: &ClaimCall<'_>,
    other: &CallRow,
    now: Timestamp,
) -> Result<CallClaim, Error> {
    let run = req.run;
    check_foreign(other, &run.run_id, &req.tool, &req.request_hash)?;
    let outcome = match decide_foreign_claim(&other.facts()?, now) {
        ClaimDecision::Replay => CallClaim::Replay(other.replayed(Some(other.run_id.clone()))?),
        ClaimDecision::Busy { holder, until } => {
            return Err(Error::Busy { holder, until });
        }
        _ => {
            // In doubt in the other run: this step waits on it too.
            pause_claimer(c, ledger, req, now).await?;
            CallClaim::InDoubt {
                since: Timestamp(other.in_doubt_at.unwrap_or(now.0)),
            }
        }
    };
    Ok(outcome)
}

/// Inserts a brand-new call claimed by this run (attempt 1); `None` when a racing
/// claimer's insert won (PostgreSQL), so the caller reads again.
async fn insert_claimed(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    req: &ClaimCall<'_>,
    expires_at: Timestamp,
    now: Timestamp,
) -> Result<Option<CallRow>, Error> {
    let s = ledger.scope();
    let run = req.run;
    c.optional::<CallRow>(
        concat!(
            "INSERT INTO tool_calls (tenant, workspace, run_id, tool_call_id,
                step_id, tool, idempotency_key, request, request_hash, status,
                attempt_count, outbound_requests, lease_holder, lease_token,
                run_token, lease_expires_at, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $14, 1, 0,
                $10, 1, $11, $12, $13, $13)
             ON CONFLICT DO NOTHING
             RETURNING ",
            call_cols!()
        ),
        args![
            &s.tenant,
            &s.workspace,
            &run.run_id,
            &req.tool_call_id,
            &req.step_id,
            &req.tool,
            &req.idempotency_key,
            req.request.to_string(),
            &req.request_hash,
            run.worker.as_str(),
            run.token,
            expires_at,
            now,
            CallStatus::Claimed.as_str(),
        ],
    )
    .await
}

/// Runs a claim's `UPDATE` (`sql`: a new attempt or a takeover), fenced by the row's
/// `lease_token` as read; `None` when another claimer changed the row first.
async fn update_claimed(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    req: &ClaimCall<'_>,
    statement: &CallEdge,
    lease_token: i64,
    expires_at: Timestamp,
    now: Timestamp,
) -> Result<Option<CallRow>, Error> {
    let s = ledger.scope();
    let run = req.run;
    let (from, to) = statement.edge.states();
    c.optional::<CallRow>(
        statement.sql,
        args![
            &s.tenant,
            &s.workspace,
            &run.run_id,
            &req.tool_call_id,
            run.worker.as_str(),
            run.token,
            expires_at,
            &req.step_id,
            now,
            lease_token,
            from.as_str(),
            to.as_str(),
        ],
    )
    .await
}

/// A claim of the call whose row exists: the row must be the same call (tool, key,
/// request), then `decide_claim` says what the claim comes to — a replay, busy, in
/// doubt, or the row claimed by this run under its fence. `None` when another claimer
/// changed the row between the read and the write: the caller reads it again.
async fn claim_existing(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    req: &ClaimCall<'_>,
    row: CallRow,
    now: Timestamp,
) -> Result<Option<CallClaim>, Error> {
    let run = req.run;
    check_identity(&row, &req.tool, &req.idempotency_key, &req.request_hash)?;
    let facts = row.facts()?;
    let decision = decide_claim(&facts, req.retry_failed, run.token, row.holder_dead(), now);
    let decided = decision.clone();
    let sql = match decision {
        ClaimDecision::Replay => {
            return Ok(Some(CallClaim::Replay(row.replayed(None)?)));
        }
        ClaimDecision::Busy { holder, until } => {
            return Err(Error::Busy { holder, until });
        }
        ClaimDecision::InDoubt(since) => {
            pause_claimer(c, ledger, req, now).await?;
            return Ok(Some(CallClaim::InDoubt {
                since: since.unwrap_or(now),
            }));
        }
        ClaimDecision::ToInDoubt => {
            take_over_to_in_doubt(c, ledger, &row, &req.step_id, now).await?;
            return Ok(Some(CallClaim::InDoubt { since: now }));
        }
        ClaimDecision::NewAttempt => CLAIM_NEW_ATTEMPT,
        ClaimDecision::Takeover => CLAIM_TAKEOVER,
        ClaimDecision::Collect => CLAIM_COLLECT,
    };
    let expires_at = now.plus(req.lease);
    let updated = update_claimed(c, ledger, req, &sql, row.lease_token, expires_at, now).await?;
    match updated {
        Some(updated) => {
            let lease = lease_after(c, ledger, &updated, &run.worker, &decided).await?;
            ledger.tie_step(c, req, now).await?;
            Ok(Some(CallClaim::Claimed(lease)))
        }
        // Another claimer changed the row first: read it again.
        None => Ok(None),
    }
}

impl Ledger {
    /// Claims a node's tool call. See the crate docs for the rules; in short:
    /// no row → `Claimed` (attempt 1); terminal → `Replay` (failed + `retry_failed` →
    /// `Claimed` with attempt n+1 and key `<base>:<n+1>`); abandoned `claimed` → taken
    /// over (`Claimed`, same attempt and key); abandoned `outbound` → `InDoubt` (step
    /// paused, `tool_call.in_doubt` emitted, same transaction); a live lease → `Busy`.
    /// The same key in another run: same request → that call's outcome (`from_run` set)
    /// or `Busy`/`InDoubt` while it is open; different request → `Conflict`.
    pub async fn claim_call(&self, req: ClaimCall<'_>, now: Timestamp) -> Result<CallClaim, Error> {
        let ledger = self.clone();
        let ClaimCall {
            run,
            step_id,
            tool_call_id,
            tool,
            idempotency_key,
            request,
            request_hash,
            retry_failed,
            lease,
        } = req;
        let run = run.clone();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let req = ClaimCall {
                    run: &run,
                    step_id,
                    tool_call_id,
                    tool,
                    idempotency_key,
                    request,
                    request_hash,
                    retry_failed,
                    lease,
                };
                let run = req.run;
                check_run_lease(c, s, run, Some(now)).await?;
                let expires_at = now.plus(req.lease);
                for _ in 0..CLAIM_ROUNDS {
                    let (row, other) = read_call_and_key(
                        c,
                        &ledger,
                        &run.run_id,
                        &req.tool_call_id,
                        &req.idempotency_key,
                    )
                    .await?;
                    let Some(row) = row else {
                        if let Some(other) = other {
                            if other.run_id == run.run_id && other.tool_call_id == req.tool_call_id
                            {
                                // Our own row, committed by a racing claimer between the two
                                // reads (PostgreSQL, READ COMMITTED): decide on it by id.
                                continue;
                            }
                            return claim_foreign(c, &ledger, &req, &other, now).await;
                        }
                        // A key no call holds may be one a deleted run used.
                        crate::retention::refuse_retired(c, s, &req.idempotency_key).await?;
                        let inserted = insert_claimed(c, &ledger, &req, expires_at, now).await?;
                        match inserted {
                            Some(row) => {
                                let lease = ledger.lease_from(&row, &run.worker, 0)?;
                                ledger.tie_step(c, &req, now).await?;
                                return Ok(CallClaim::Claimed(lease));
                            }
                            // Lost an insert race (PostgreSQL): the winner has committed; re-read.
                            None => continue,
                        }
                    };
                    if let Some(claim) = claim_existing(c, &ledger, &req, row, now).await? {
                        return Ok(claim);
                    }
                }
                Err(Error::Backend {
                    message: format!(
                        "claim of tool call {} did not settle after {CLAIM_ROUNDS} rounds",
                        req.tool_call_id
                    ),
                    retryable: true,
                })
            })
        })
        .await
    }

    fn lease_from(
        &self,
        row: &CallRow,
        worker: &WorkerId,
        prior_sends: u32,
    ) -> Result<CallLease, Error> {
        let attempt = u32::try_from(row.attempt_count).map_err(|_| Error::Corrupt {
            what: format!("attempt_count {}", row.attempt_count),
        })?;
        Ok(CallLease {
            run_id: row.run_id.clone(),
            tool_call_id: row.tool_call_id.clone(),
            step_id: row.step_id.clone(),
            tool: row.tool.clone(),
            worker: worker.clone(),
            token: row.lease_token,
            attempt,
            key: attempt_key(&row.idempotency_key, attempt),
            run_token: row.run_token,
            expires_at: Timestamp(row.lease_expires_at.unwrap_or(0)),
            prior_sends,
            remote_task: None,
            trace_parent: row.trace_parent.clone(),
            trace_state: row.trace_state.clone(),
        })
    }

    /// Records on the claiming step which call it made (for `flow show` and resolve), and
    /// marks it running: a step that holds a claim is executing, even if it was pending
    /// or paused before (e.g. re-claiming after an operator's `retry` resolution).
    async fn tie_step(
        &self,
        c: &mut Conn<'_>,
        req: &ClaimCall<'_>,
        now: Timestamp,
    ) -> Result<(), Error> {
        let s = self.scope();
        // `StepStatus::on_claim`, applied without reading the row.
        let moved = StepStatus::MOVED_BY_CLAIM;
        c.execute(
            "UPDATE steps SET tool_call_id = $5, updated_at = $6,
                status = CASE WHEN status IN ($7, $8) THEN $9 ELSE status END,
                started_at = COALESCE(started_at, $6)
             WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND step_id = $4",
            args![
                &s.tenant,
                &s.workspace,
                &req.run.run_id,
                &req.step_id,
                &req.tool_call_id,
                now,
                moved[0].as_str(),
                moved[1].as_str(),
                StepStatus::Running.as_str(),
            ],
        )
        .await?;
        Ok(())
    }
}
