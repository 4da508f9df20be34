//! Recording what became of a step: opening its row, failing it before or after a claim,
//! pure results (kept or committed), the outcome of an outbound call and replays.

use flow_adapters::{FailureKind, Outcome, SideEffect};
use flow_ledger::{
    CallLease, CallOutcome, CompleteCall, ErrorKind, InDoubtReport, NewStep, PureCall,
    PureRecorded, Replayed, StepError, StepFinish, StepStatus, Timestamp,
};
use serde_json::Value as Json;

use super::disposition::{Disposition, History, Observed, disposition};
use super::{Gateway, NodeStep, StepCall, StepOrigin, StepResult, ledger_kind};

impl Gateway {
    /// The row of `c`'s step, in `status`.
    pub(crate) fn new_step(&self, c: &NodeStep<'_>, status: StepStatus) -> NewStep {
        NewStep {
            step_id: c.step_id.clone(),
            node_id: c.node.id.clone(),
            retry: c.retry,
            not_before: None,
            status,
        }
    }

    /// A failure found before any claim (render, secret, egress): the step fails, no call
    /// row exists, nothing was sent.
    pub(crate) async fn fail_without_claim(
        &self,
        c: &NodeStep<'_>,
        kind: ErrorKind,
        message: String,
    ) -> Result<StepResult, flow_ledger::Error> {
        let step = self.new_step(c, StepStatus::Running);
        c.writer.open_step(c.origin, step, self.now()).await?;
        self.fail_claimed_step(c, kind, message).await
    }

    pub(crate) async fn fail_claimed_step(
        &self,
        c: &NodeStep<'_>,
        kind: ErrorKind,
        message: String,
    ) -> Result<StepResult, flow_ledger::Error> {
        let message = self.secrets_of(c).scrub(&message);
        c.writer
            .fail_step(&c.step_id, kind, message.clone(), self.now())
            .await?;
        Ok(StepResult::Failed {
            kind,
            message,
            retry: None,
        })
    }

    /// Ends the step as skipped (an approval's or a wait's `on_timeout: skip`): nothing
    /// was sent by it; its dependents are skipped as after any skip.
    pub(crate) async fn skip_claimed_step(
        &self,
        c: &NodeStep<'_>,
        why: String,
    ) -> Result<StepResult, flow_ledger::Error> {
        let finish = StepFinish {
            step_id: c.step_id.clone(),
            status: StepStatus::Skipped,
            output: None,
            error: None,
        };
        c.writer.finish_step(finish, self.now()).await?;
        Ok(StepResult::Skipped { why })
    }

    pub(super) async fn record_pure(
        &self,
        c: &StepCall<'_>,
        base_key: String,
        request: Json,
        request_hash: String,
        started_at: Timestamp,
        out: Outcome,
    ) -> Result<StepResult, flow_ledger::Error> {
        let now = self.now();
        // Nothing left the process: the read-only row of the rule applies.
        let retryable = disposition(
            Observed::of(&out.result),
            SideEffect::ReadOnly,
            History::default(),
        ) == Disposition::NewAttempt;
        let (outcome, next) = self.outcome_of(c, out.result, retryable, now);
        // A first attempt that succeeded, under the run's own key, is kept for the next
        // flush; a crash before it only means computing it again (`lazy.rs`).
        if let (CallOutcome::Succeeded(output), None) = (&outcome, &next)
            && c.origin == StepOrigin::New
            && c.retry == 0
            && c.node.idempotency_key.is_none()
        {
            let kept = flow_ledger::PureResult {
                step_id: c.step_id.clone(),
                node_id: c.node.id.clone(),
                tool_call_id: c.call_id.clone(),
                tool: c.tool.name.clone(),
                idempotency_key: base_key,
                request,
                request_hash,
                output: output.clone(),
                started_at,
                finished_at: now,
            };
            c.writer.keep(kept, now).await?;
            return Ok(result_of(outcome, next));
        }
        let step = self.new_step(c, StepStatus::Running);
        let recorded = c
            .writer
            .record_pure_call(
                PureCall {
                    run: c.run(),
                    step,
                    tool_call_id: c.call_id.clone(),
                    tool: c.tool.name.clone(),
                    idempotency_key: base_key,
                    request,
                    request_hash,
                    outcome: outcome.clone(),
                    retry_failed: c.retry > 0,
                    next_step: next.clone(),
                },
                now,
            )
            .await?;
        match recorded {
            PureRecorded::Recorded => Ok(result_of(outcome, next)),
            PureRecorded::Replayed(r) => Ok(replayed_result(r)),
        }
    }

    /// The ledger outcome of an adapter result, and the retry step to create with it
    /// when `retryable` (the disposition said [`Disposition::NewAttempt`]) and the
    /// node's budget and deadline allow one.
    pub(super) fn outcome_of(
        &self,
        c: &StepCall<'_>,
        result: Result<Json, flow_adapters::Error>,
        retryable: bool,
        now: Timestamp,
    ) -> (CallOutcome, Option<NewStep>) {
        let secrets = self.secrets_of(c);
        match result {
            Ok(output) => {
                let output = secrets.scrub_json(&output);
                if let Some(refused) = self.inner.ledger.refuse_output(&output) {
                    return (CallOutcome::Failed(refused), None);
                }
                (CallOutcome::Succeeded(output), None)
            }
            Err(e) => {
                let kind = ledger_kind(&e.kind);
                let retry_after = match &e.kind {
                    FailureKind::Transient { retry_after } => *retry_after,
                    _ => None,
                };
                let message = secrets.scrub(&e.message);
                let next = c.next_retry.as_ref().filter(|_| retryable).and_then(|r| {
                    let delay = r.delay.max(retry_after.unwrap_or_default());
                    let not_before = now.plus(delay);
                    if r.deadline.is_some_and(|d| not_before > d) {
                        return None;
                    }
                    Some(NewStep {
                        step_id: r.step_id.clone(),
                        node_id: c.node.id.clone(),
                        retry: r.retry,
                        not_before: Some(not_before),
                        status: StepStatus::Pending,
                    })
                });
                (CallOutcome::Failed(StepError { kind, message }), next)
            }
        }
    }

    /// Records the end of an outbound attempt as `next` (the disposition of its last
    /// send) says: in doubt, or the outcome with its step finish and retry step.
    pub(super) async fn complete(
        &self,
        c: &StepCall<'_>,
        lease: &CallLease,
        next: Disposition,
        result: Result<Json, flow_adapters::Error>,
        sent: u32,
        unknown_before: bool,
    ) -> Result<StepResult, flow_ledger::Error> {
        let now = self.now();
        if next == Disposition::InDoubt {
            let last = match &result {
                Err(e) => e.message.as_str(),
                Ok(_) => "no error",
            };
            let message = if unknown_before
                && !matches!(&result, Err(e) if e.kind == FailureKind::Unknown)
            {
                format!(
                    "outcome unknown: an earlier send of this key may have taken effect, and the re-sends did not settle it (last: {last})"
                )
            } else {
                last.to_string()
            };
            let report = InDoubtReport {
                requests_sent: sent,
                message: self.secrets_of(c).scrub(&message),
            };
            let ledger = &self.inner.ledger;
            self.holder_write("record the call in doubt", |now| {
                ledger.mark_in_doubt(lease, report.clone(), now)
            })
            .await?;
            return Ok(StepResult::InDoubt);
        }
        let (outcome, next) = self.outcome_of(c, result, next == Disposition::NewAttempt, now);
        let step = StepFinish::from_outcome(&c.step_id, outcome.clone());
        // A callback node's step goes on after its call succeeded: it waits.
        let waits = c.node.callback().is_some() && matches!(outcome, CallOutcome::Succeeded(_));
        let ledger = &self.inner.ledger;
        self.holder_write("record the call's outcome", |now| {
            let req = CompleteCall {
                lease,
                outcome: outcome.clone(),
                requests_sent: sent,
                step: (!waits).then(|| step.clone()),
                next_step: next.clone(),
            };
            ledger.complete_call(req, now)
        })
        .await?;
        Ok(result_of(outcome, next))
    }

    /// A replayed terminal call: the step takes its stored outcome; a replayed failure is
    /// a recorded fact, not retried here.
    pub(super) async fn finish_replay(
        &self,
        c: &StepCall<'_>,
        r: Replayed,
    ) -> Result<StepResult, flow_ledger::Error> {
        let result = replayed_result(r);
        let outcome = match &result {
            StepResult::Succeeded { output } => CallOutcome::Succeeded(output.clone()),
            StepResult::Failed { kind, message, .. } => CallOutcome::Failed(StepError {
                kind: *kind,
                message: message.clone(),
            }),
            StepResult::InDoubt
            | StepResult::Deferred { .. }
            | StepResult::TaskWorking { .. }
            | StepResult::AwaitingApproval { .. }
            | StepResult::Waiting { .. }
            | StepResult::Skipped { .. } => {
                return Ok(result);
            }
        };
        if c.node.callback().is_some() && matches!(outcome, CallOutcome::Succeeded(_)) {
            // The call is done; the step waits for its callback (`after_callback_call`).
            return Ok(result);
        }
        let finish = StepFinish::from_outcome(&c.step_id, outcome);
        c.writer.finish_step(finish, self.now()).await?;
        Ok(result)
    }
}

pub(super) fn result_of(outcome: CallOutcome, next: Option<NewStep>) -> StepResult {
    match outcome {
        CallOutcome::Succeeded(output) => StepResult::Succeeded { output },
        CallOutcome::Failed(e) => StepResult::Failed {
            kind: e.kind,
            message: e.message,
            retry: next.map(|s| (s.step_id, s.retry, s.not_before.unwrap_or(Timestamp(0)))),
        },
    }
}

pub(super) fn replayed_result(r: Replayed) -> StepResult {
    match (r.output, r.error) {
        (_, Some(e)) => StepResult::Failed {
            kind: e.kind,
            message: e.message,
            retry: None,
        },
        (output, None) => StepResult::Succeeded {
            output: output.unwrap_or(Json::Null),
        },
    }
}

/// How long the holder of a call goes on retrying a write of what it knows (the
/// outcome it holds, a call given back unsent) while the ledger fails transiently. The
/// writes are fenced by tokens: once another worker takes the run over they are
/// refused (`LeaseLost`) and the retrying ends; until then the answer in hand is worth
/// more than a call left in doubt (a stalled PostgreSQL, a SQLite write lock, a full
/// disk for minutes).
const HOLDER_WRITE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// A ledger failure that repeating the same write may get past (the database busy,
/// unreachable or out of room), as opposed to a refusal (`LeaseLost`, `Unusable`, …):
/// what the holder's writes retry, and what a failed mark is given back on.
pub(super) fn transient(e: &flow_ledger::Error) -> bool {
    e.is_retryable() || matches!(e, flow_ledger::Error::Unavailable { .. })
}

impl Gateway {
    /// Runs `write` (with a fresh `now` each time) until it succeeds, fails for a reason
    /// that repeating cannot change, or [`HOLDER_WRITE_PATIENCE`] runs out; backs off
    /// from 100 ms to 5 s and says so once, then once a minute.
    pub(super) async fn holder_write<T, F, Fut>(
        &self,
        what: &str,
        mut write: F,
    ) -> Result<T, flow_ledger::Error>
    where
        F: FnMut(Timestamp) -> Fut,
        Fut: std::future::Future<Output = Result<T, flow_ledger::Error>>,
    {
        let started = std::time::Instant::now();
        let mut delay = std::time::Duration::from_millis(100);
        let mut said: Option<std::time::Instant> = None;
        loop {
            match write(self.now()).await {
                Err(e) if transient(&e) && started.elapsed() < HOLDER_WRITE_PATIENCE => {
                    if said.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60)) {
                        tracing::warn!(error = %e, "cannot {what} yet; retrying while this worker holds the call");
                        said = Some(std::time::Instant::now());
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(5));
                }
                other => {
                    if said.is_some() && other.is_ok() {
                        tracing::info!("could {what} after {:?}", started.elapsed());
                    }
                    return other;
                }
            }
        }
    }
}
