//! After the claim: the fenced writes of a call lease holder.
//!
//! `mark_outbound` is the pivot of at-most-once: ONE conditional `UPDATE` that checks, in
//! the same statement, that this worker still holds the call lease (token, holder,
//! unexpired) *and* the run lease (worker, token, unexpired, running). It commits before
//! returning, so a request is only ever written after the mark is durable, and a worker
//! that lost either lease can never send.

use std::time::Duration;

use serde_json::{Value, json};

use crate::clock::Timestamp;
use crate::conn::{Arg, Conn, args};
use crate::error::Error;
use crate::fence::{Fence, call_fence, live_call_fence};
use crate::ledger::Ledger;
use crate::model::{CallLease, CompleteCall, InDoubtReport};
use crate::rows::{CallRow, call_cols};
use crate::state::{CallTransition, ErrorKind};
use crate::steps::{create_step_in, finish_step_in, pause_steps_in};

use crate::attempts::{AttemptRecord, insert_attempt, insert_usage};
use crate::calls::{CallEdge, emit_in_doubt, read_call};
use crate::events::{EventType, NewEvent, emit};

/// A holder letting go of a claimed call it never sent (`CallTransition::Release`):
/// no holder, a lease that expired at `$8`, the status unchanged.
const LET_GO_CLAIMED: CallEdge = CallEdge {
    sql: concat!(
        "UPDATE tool_calls SET lease_holder = NULL, lease_expires_at = $8, updated_at = $8,
            waiting = $10
         WHERE",
        call_fence!(),
        "AND status = $9"
    ),
    edge: CallTransition::Release,
};

/// The same for an outbound call whose remote task is recorded (`CallTransition::Collect`).
const LET_GO_TASK: CallEdge = CallEdge {
    sql: concat!(
        "UPDATE tool_calls SET lease_holder = NULL, lease_expires_at = $8, updated_at = $8,
            waiting = $10
         WHERE",
        call_fence!(),
        "AND status = $9 AND remote_task IS NOT NULL"
    ),
    edge: CallTransition::Collect,
};

/// Runs one of the let-go statements for `lease` (fence, `now`, the edge's state): the
/// next claim of the call takes it over. The rows changed (0: not this holder's, or
/// not in that state).
async fn let_go(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    lease: &CallLease,
    statement: &CallEdge,
    waiting: Option<&str>,
    now: Timestamp,
) -> Result<u64, Error> {
    let (from, _) = statement.edge.states();
    let mut a = fence_args(ledger, lease);
    a.extend(args![now, from.as_str(), waiting]);
    c.execute(statement.sql, a).await
}

/// An event about the call `lease` holds.
async fn call_event(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    lease: &CallLease,
    event_type: EventType,
    payload: Value,
    now: Timestamp,
) -> Result<(), Error> {
    let event = NewEvent {
        event_type,
        run_id: &lease.run_id,
        step_id: Some(&lease.step_id),
        tool_call_id: Some(&lease.tool_call_id),
        payload,
    };
    emit(c, ledger.scope(), now, event).await
}

/// `$1..$7` of the holder's writes (`crate::fence`).
fn fence_args(ledger: &Ledger, lease: &CallLease) -> Vec<Arg> {
    Fence::call(ledger.scope(), lease)
}

impl Ledger {
    /// claimed → outbound, durably, before any byte of the request is written. Refused
    /// with `LeaseLost` unless this worker still holds both the call lease and the run
    /// lease, unexpired, checked in the same statement. (On PostgreSQL a run takeover
    /// that commits while this statement runs is still safe: the new holder's claim locks
    /// the call row, sees `outbound` under an older run token and makes it `in_doubt`.)
    /// A fresh send forgets any remote task of an earlier send of the key.
    pub async fn mark_outbound(&self, lease: &CallLease, now: Timestamp) -> Result<(), Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        self.write_statement(move |c| {
            Box::pin(async move { ledger.mark_in(c, &lease, None, now).await })
        })
        .await
    }

    /// The outbound mark's statement, in the caller's transaction; `slot` is the
    /// concurrency limit the call now counts against (`slots.rs`), if its tool has one.
    pub(crate) async fn mark_in(
        &self,
        c: &mut Conn<'_>,
        lease: &CallLease,
        slot: Option<&str>,
        now: Timestamp,
    ) -> Result<(), Error> {
        let (from, to) = CallTransition::MarkOutbound.states();
        let mut a = fence_args(self, lease);
        a.extend(args![
            now,
            to.as_str(),
            from.as_str(),
            lease.trace_parent.as_deref(),
            lease.trace_state.as_deref(),
            slot
        ]);
        // The trace context is stored by the key's first mark only: a re-send
        // keeps the original's (SET reads the row as it was).
        let n = c
            .execute(
                concat!(
                    "UPDATE tool_calls SET status = $9, outbound_started_at = $8,
                        remote_task = NULL, updated_at = $8,
                        trace_parent = COALESCE(trace_parent, $11),
                        trace_state = CASE WHEN trace_parent IS NULL THEN $12
                            ELSE trace_state END,
                        slot = $13, slot_waiting_since = NULL, waiting = NULL WHERE",
                    live_call_fence!(),
                    "AND status = $10"
                ),
                a,
            )
            .await?;
        if n == 1 {
            return Ok(());
        }
        match read_call(c, self, &lease.run_id, &lease.tool_call_id).await? {
            None => Err(Error::NotFound {
                what: format!("tool call {}/{}", lease.run_id, lease.tool_call_id),
            }),
            Some(_) => Err(Error::LeaseLost),
        }
    }

    /// Extends the call lease while the adapter works (fenced by tokens; see
    /// `complete_call` for why expiry alone does not refuse).
    pub async fn renew_call_lease(
        &self,
        lease: &CallLease,
        duration: Duration,
        now: Timestamp,
    ) -> Result<Timestamp, Error> {
        let expires_at = now.plus(duration);
        let ledger = self.clone();
        let lease = lease.clone();
        self.write_statement(move |c| {
            Box::pin(async move {
                let lease = &lease;
                let mut a = fence_args(&ledger, lease);
                a.push(expires_at.into());
                a.push(now.into());
                let n = c
                    .execute(
                        concat!(
                            "UPDATE tool_calls SET lease_expires_at = $8, updated_at = $9",
                            " WHERE",
                            call_fence!(),
                            " AND status IN ('claimed', 'outbound')"
                        ),
                        a,
                    )
                    .await?;
                if n == 0 {
                    return Err(Error::LeaseLost);
                }
                Ok(expires_at)
            })
        })
        .await
    }

    /// Records the outcome of an outbound call, in ONE transaction: the call's terminal
    /// state, `outbound_requests += requests_sent`, an attempt row, one usage row per
    /// request, the optional step finish and next step, and their events.
    ///
    /// Fenced by the call token and the run token, but not by expiry: if the lease ran
    /// out and nobody took the call over, recording the outcome that really happened is
    /// strictly better than leaving it in doubt; if someone did take over, the token
    /// changed (the call is `in_doubt`) and this is `LeaseLost`.
    pub async fn complete_call(&self, req: CompleteCall<'_>, now: Timestamp) -> Result<(), Error> {
        let (status, output, error) = self.outcome_columns(&req.outcome);
        let (from, to) = CallTransition::Complete.to(status)?;
        let ledger = self.clone();
        let CompleteCall {
            lease,
            outcome,
            requests_sent,
            step,
            next_step,
        } = req;
        let lease = lease.clone();
        self.write(move |c| {
            Box::pin(async move {
                let req = CompleteCall {
                    lease: &lease,
                    outcome,
                    requests_sent,
                    step,
                    next_step,
                };
                let lease = req.lease;
                let mut a = fence_args(&ledger, lease);
                a.extend(args![
                    to.as_str(),
                    output,
                    error.as_ref().map(|e| e.kind.as_str()),
                    error.as_ref().map(|e| e.message.clone()),
                    req.requests_sent,
                    now,
                    from.as_str(),
                ]);
                let row = c
                    .optional::<CallRow>(
                        concat!(
                            "UPDATE tool_calls SET status = $8, output = $9, error_kind = $10,
                                error_message = $11, outbound_requests = outbound_requests + $12,
                                finished_at = $13, updated_at = $13, lease_holder = NULL,
                                lease_expires_at = NULL",
                            " WHERE",
                            call_fence!(),
                            " AND status = $14 RETURNING ",
                            call_cols!()
                        ),
                        a,
                    )
                    .await?
                    .ok_or(Error::LeaseLost)?;
                insert_attempt(
                    c,
                    &ledger,
                    AttemptRecord {
                        run_id: &lease.run_id,
                        tool_call_id: &lease.tool_call_id,
                        step_id: &lease.step_id,
                        attempt: i64::from(lease.attempt),
                        sent_key: lease.key.clone(),
                        outbound_started_at: row.outbound_started_at,
                        outcome: crate::model::AttemptOutcome::of_call(status),
                        error_kind: error.as_ref().map(|e| e.kind.as_str()),
                        error_message: error.as_ref().map(|e| e.message.clone()),
                        requests_sent: req.requests_sent,
                    },
                    now,
                )
                .await?;
                insert_usage(c, &ledger, lease, req.requests_sent, now).await?;
                ledger.step_effects(c, &lease.run_id, &req, now).await?;
                if let Some(slot) = &row.slot {
                    crate::slots::wake_next_waiter(c, ledger.scope(), slot, now).await?;
                }
                Ok(())
            })
        })
        .await
    }

    async fn step_effects(
        &self,
        c: &mut Conn<'_>,
        run_id: &str,
        req: &CompleteCall<'_>,
        now: Timestamp,
    ) -> Result<(), Error> {
        if let Some(finish) = &req.step {
            finish_step_in(c, self, run_id, finish, now).await?;
        }
        if let Some(next) = &req.next_step {
            create_step_in(c, self, run_id, next, now).await?;
        }
        Ok(())
    }

    /// The worker itself learned that the outcome is unknown (timeout or connection lost
    /// after the request left): outbound → in_doubt with an `unknown` attempt row, usage
    /// rows, the step paused and `tool_call.in_doubt`, in one fenced transaction.
    pub async fn mark_in_doubt(
        &self,
        lease: &CallLease,
        report: InDoubtReport,
        now: Timestamp,
    ) -> Result<(), Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        self.write(move |c| {
            Box::pin(async move {
                let lease = &lease;
                let (from, to) = CallTransition::ToInDoubt.states();
                let mut a = fence_args(&ledger, lease);
                a.extend(args![
                    report.message.clone(),
                    report.requests_sent,
                    now,
                    to.as_str(),
                    from.as_str(),
                    ErrorKind::Unknown.as_str(),
                ]);
                let row = c
                    .optional::<CallRow>(
                        concat!(
                            "UPDATE tool_calls SET status = $11, in_doubt_at = $10,
                                error_kind = $13, error_message = $8,
                                outbound_requests = outbound_requests + $9, updated_at = $10,
                                lease_holder = NULL, lease_expires_at = NULL,
                                lease_token = lease_token + 1",
                            " WHERE",
                            call_fence!(),
                            " AND status = $12 RETURNING ",
                            call_cols!()
                        ),
                        a,
                    )
                    .await?
                    .ok_or(Error::LeaseLost)?;
                insert_attempt(
                    c,
                    &ledger,
                    AttemptRecord {
                        run_id: &lease.run_id,
                        tool_call_id: &lease.tool_call_id,
                        step_id: &lease.step_id,
                        attempt: i64::from(lease.attempt),
                        sent_key: lease.key.clone(),
                        outbound_started_at: row.outbound_started_at,
                        outcome: crate::model::AttemptOutcome::Unknown,
                        error_kind: Some(ErrorKind::Unknown.as_str()),
                        error_message: Some(report.message.clone()),
                        requests_sent: report.requests_sent,
                    },
                    now,
                )
                .await?;
                insert_usage(c, &ledger, lease, report.requests_sent, now).await?;
                pause_steps_in(
                    c,
                    &ledger,
                    &lease.run_id,
                    [&lease.step_id, &row.step_id],
                    &lease.tool_call_id,
                    now,
                )
                .await?;
                emit_in_doubt(c, &ledger, &row, &report.message, now).await?;
                Ok(())
            })
        })
        .await
    }

    /// Gives back a claim that never went outbound (rate limited, deferred). It is not an
    /// attempt and leaves nothing that blocks a later claim: the row stays `claimed` with
    /// no holder and a lease that expired at `now`, attempt count and key unchanged, so
    /// the next claim of this call takes it over and sends the same key.
    pub async fn release_call(&self, lease: &CallLease, now: Timestamp) -> Result<(), Error> {
        self.release_call_waiting(lease, None, now).await
    }

    /// [`Ledger::release_call`], saying why the call waits (`ToolCall::waiting`: a rate
    /// limit, a downstream's `Retry-After`), for whoever asks why the run is not moving.
    pub async fn release_call_waiting(
        &self,
        lease: &CallLease,
        waiting: Option<&str>,
        now: Timestamp,
    ) -> Result<(), Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        let waiting = waiting.map(str::to_owned);
        self.write_statement(move |c| {
            Box::pin(async move {
                let why = waiting.as_deref();
                let n = let_go(c, &ledger, &lease, &LET_GO_CLAIMED, why, now).await?;
                if n == 0 {
                    return Err(Error::LeaseLost);
                }
                Ok(())
            })
        })
        .await
    }

    /// Gives the call back, unsent: outbound (or still claimed, when the mark did not
    /// commit) → claimed with no holder and a lease that ends at `now`, attempt, key and
    /// sends unchanged, so the next claim takes it over and sends the same key as if the
    /// mark had never been written (`CallTransition::GiveBack`).
    ///
    /// Only the holder may say this, and only when it knows no byte of the request left:
    /// its fence closed before the adapter handed the request to the transport, or the
    /// mark's acknowledgement was lost before anything was sent. Fenced by both tokens
    /// and not by expiry (like `complete_call`): once another worker took the run over,
    /// its claim decided the call (in doubt) and this is `LeaseLost`.
    pub async fn give_back_unsent(&self, lease: &CallLease, now: Timestamp) -> Result<(), Error> {
        self.give_back_waiting(lease, None, now).await
    }

    /// [`Ledger::give_back_unsent`] for a request the downstream refused unprocessed
    /// and asked to be sent later (`429`/`503` with `Retry-After`): no effect happened, so
    /// the call goes back to be claimed again with the same key, not an attempt; `waiting`
    /// says why (`ToolCall::waiting`).
    pub async fn give_back_waiting(
        &self,
        lease: &CallLease,
        waiting: Option<&str>,
        now: Timestamp,
    ) -> Result<(), Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        let waiting = waiting.map(str::to_owned);
        self.write_statement(move |c| {
            Box::pin(async move {
                let (from, to) = CallTransition::GiveBack.states();
                let mut a = fence_args(&ledger, &lease);
                a.extend(args![now, to.as_str(), from.as_str(), waiting]);
                let n = c
                    .execute(
                        concat!(
                            "UPDATE tool_calls SET status = $9, lease_holder = NULL,
                                lease_expires_at = $8, updated_at = $8, waiting = $11
                             WHERE",
                            call_fence!(),
                            "AND status IN ($9, $10) AND remote_task IS NULL"
                        ),
                        a,
                    )
                    .await?;
                if n == 0 {
                    return Err(Error::LeaseLost);
                }
                Ok(())
            })
        })
        .await
    }

    /// Records the remote task the downstream started for this outbound call (an MCP
    /// task id), durably, the moment the adapter reports it, with a
    /// `tool_call.task_started` event. From then on a crash or a timeout does not leave
    /// the call in doubt: the next holder collects the task (`ClaimDecision::Collect`).
    /// Fenced like every holder write; `LeaseLost` if this worker no longer holds the
    /// call.
    pub async fn record_task(
        &self,
        lease: &CallLease,
        task_id: &str,
        now: Timestamp,
    ) -> Result<(), Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        let task_id = task_id.to_owned();
        self.write(move |c| {
            Box::pin(async move {
                let (from, _) = CallTransition::Collect.states();
                let mut a = fence_args(&ledger, &lease);
                a.extend(args![now, from.as_str(), &task_id]);
                let n = c
                    .execute(
                        concat!(
                            "UPDATE tool_calls SET remote_task = $10, updated_at = $8 WHERE",
                            call_fence!(),
                            "AND status = $9"
                        ),
                        a,
                    )
                    .await?;
                if n == 0 {
                    return Err(Error::LeaseLost);
                }
                let payload = json!({"task_id": task_id, "sent_key": lease.key});
                call_event(
                    c,
                    &ledger,
                    &lease,
                    EventType::ToolCallTaskStarted,
                    payload,
                    now,
                )
                .await
            })
        })
        .await
    }

    /// Records what a server asked during this call and how the tool's policy answered
    /// (`record`, already scrubbed of secrets by the caller) as a `tool_call.elicited`
    /// event on the call. Fenced by the call lease.
    pub async fn record_elicitation(
        &self,
        lease: &CallLease,
        record: Value,
        now: Timestamp,
    ) -> Result<(), Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        self.write(move |c| {
            Box::pin(async move {
                let a = fence_args(&ledger, &lease);
                let held = c
                    .optional::<(i64,)>(
                        concat!("SELECT lease_token FROM tool_calls WHERE", call_fence!()),
                        a,
                    )
                    .await?;
                if held.is_none() {
                    return Err(Error::LeaseLost);
                }
                call_event(c, &ledger, &lease, EventType::ToolCallElicited, record, now).await
            })
        })
        .await
    }

    /// Lets go of an outbound call whose remote task still works (the attempt's time
    /// is up, the task is not): the call stays `outbound` with its task id, no holder
    /// and an expired lease, so the next claim collects the task instead of sending
    /// again or putting the call in doubt. Refused (`InvalidTransition`) for a call with
    /// no recorded task, and `LeaseLost` for a holder that lost the call.
    pub async fn release_task(&self, lease: &CallLease, now: Timestamp) -> Result<(), Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        self.write_statement(move |c| {
            Box::pin(async move {
                let (from, _) = CallTransition::Collect.states();
                let n = let_go(c, &ledger, &lease, &LET_GO_TASK, None, now).await?;
                if n == 1 {
                    return Ok(());
                }
                match read_call(c, &ledger, &lease.run_id, &lease.tool_call_id).await? {
                    Some(row) if row.lease_token == lease.token && row.remote_task.is_none() => {
                        Err(Error::InvalidTransition {
                            what: "tool call without a remote task",
                            from: row.status,
                            to: from.as_str().to_owned(),
                        })
                    }
                    _ => Err(Error::LeaseLost),
                }
            })
        })
        .await
    }
}
