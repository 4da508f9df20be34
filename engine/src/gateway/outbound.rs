//! Steps 4–7 of a call that leaves the process, under its claim: a recorded remote
//! task is collected; else the rate limit and quota, the fenced outbound mark, the
//! sends (again with the same key while `disposition` says so) and the outcome. Runs
//! in the call's CLIENT span (`trace.rs`), which records how it ended.

use std::time::Duration;

use flow_adapters::{Call, FailureKind, Outcome};
use flow_ledger::{CallLease, Slot, SlotMark};
use serde_json::Value as Json;

use tracing::Instrument as _;

use super::{
    Disposition, Gateway, Held, History, Observed, Rendered, StepCall, StepResult, Via,
    disposition, trace,
};
use crate::fault::Point;

impl Gateway {
    /// The call `lease` holds, from its claim to its outcome. Steps 5–7 — from just
    /// before the outbound mark — run in the call's CLIENT span, which records how the
    /// call ended; a call that sends nothing (its callback expired, a remote task to
    /// collect, a rate limit) gets none.
    pub(super) async fn call_leased(
        &self,
        c: &StepCall<'_>,
        rendered: &Rendered,
        via: Via<'_>,
        lease: CallLease,
    ) -> Result<StepResult, flow_ledger::Error> {
        let node_id = c.call_id.as_str();
        self.inner.faults.hit(Point::AfterClaim, node_id);
        if let Some(expired) = self.callback_expired(c, &lease).await? {
            return Ok(expired);
        }
        let args = &rendered.args;

        // A call already sent whose remote task is recorded: ask how it ended.
        if let Some(task) = lease.remote_task.clone() {
            let collected = self.collect(c, &lease, via, args, &task).await?;
            self.inner.faults.hit(Point::AfterComplete, node_id);
            return self.then_callback(c, collected).await;
        }

        // 4. A downstream's hold-off, the rate limit and quota, counted across workers.
        if let Some((until, why)) = self.limited(c.workflow, c.tool).await? {
            let words = format!("{why} until {}", until.to_rfc3339());
            self.inner
                .ledger
                .release_call_waiting(&lease, Some(&words), self.now())
                .await?;
            return Ok(StepResult::Deferred { until, why });
        }

        let span = trace::call_span(c, &rendered.target, &lease, self.secrets_of(c));
        let result = self
            .outbound(c, args, via, lease)
            .instrument(span.clone())
            .await;
        trace::ended(&span, &result);
        result
    }

    /// Steps 5–7: the outbound mark, the sends and the outcome.
    async fn outbound(
        &self,
        c: &StepCall<'_>,
        args: &Json,
        via: Via<'_>,
        mut lease: CallLease,
    ) -> Result<StepResult, flow_ledger::Error> {
        let node_id = c.call_id.as_str();
        // 5–7. Outbound, the adapter, the outcome. The HTTP clients exist before the
        // mark (they are built on first use).
        self.tools().warm();
        trace::decide(&mut lease);
        let window = self.call_window(&lease);
        match self.mark(c, &lease).await {
            Ok(None) => {}
            Ok(Some(waits)) => return Ok(waits),
            Err(e) => return self.mark_failed(c, &lease, e).await,
        }
        trace::marked();
        self.inner.faults.hit(Point::AfterOutbound, node_id);
        let Sent {
            outcome,
            next,
            sent,
            unknown_before,
        } = self.send(c, Held::new(&lease, &window), via, args).await;
        self.inner.faults.hit(Point::AfterResponse, node_id);
        if sent == 0
            && matches!(&outcome.result, Err(e) if e.kind == FailureKind::NotSent)
            && let Err(why) = Self::fence(c, &window).check()
        {
            // Nothing left: the fence closed before the request reached the transport.
            tracing::warn!(
                node = node_id,
                call = lease.tool_call_id,
                "not sending: {why}; the call goes back to be claimed again, never in doubt"
            );
            return self.give_back(&lease).await;
        }
        trace::answered(&outcome);
        if sent > 1 {
            self.count_extra_requests(c, sent - 1).await?;
        }
        if next == Disposition::NewAttempt
            && let Some(wait) = asked_to_wait(&outcome)
        {
            return self.held_off(c, &lease, wait).await;
        }
        if outcome.task.is_some() {
            return self.task_working(c, &lease, outcome, sent).await;
        }
        if next == Disposition::InDoubt {
            trace::in_doubt(outcome.result.as_ref().err().map(|e| e.message.as_str()));
        }
        let result = self
            .complete(c, &lease, next, outcome.result, sent, unknown_before)
            .await?;
        self.inner.faults.hit(Point::AfterComplete, node_id);
        self.then_callback(c, result).await
    }

    /// Sends under `lease`, again with the same key for as long as `disposition` says
    /// so; the outcome of the last send and what it decided.
    async fn send(&self, c: &StepCall<'_>, held: Held<'_>, via: Via<'_>, args: &Json) -> Sent {
        let Held { lease, .. } = held;
        let Via { tool, class } = via;
        let node_id = c.node.id.as_str();
        // `disposition` decides after every send whether the same key goes out again,
        // and what the attempt's end is.
        let mut sent = 0u32;
        let mut sends = 0u32;
        let mut unknown_before = lease.prior_sends > 0;
        // The context the downstream sees, stored with the key's first mark (unless
        // the tool asks for none).
        let trace = trace::carried(lease).filter(|_| trace::propagates(c.tool));
        let (outcome, next) = loop {
            let out = self
                .call_renewing(
                    c,
                    held,
                    tool,
                    Call::new(args.clone(), lease.key.clone(), c.timeout).with_trace(trace.clone()),
                    None,
                )
                .await;
            sent += out.requests_sent;
            sends += 1;
            if out.task.is_some() {
                // A remote task still works: nothing is decided until it ends.
                break (out, Disposition::InDoubt);
            }
            let observed = Observed::of(&out.result);
            let history = History {
                unknown_before,
                resends_left: (1 + c.resend_budget)
                    .saturating_sub(lease.prior_sends.saturating_add(sends)),
            };
            let next = disposition(observed, class, history);
            unknown_before |= observed == Observed::Unknown;
            if next == Disposition::ResendSameKey {
                // Same key, same effect attempt: the downstream dedupes.
                let retry_after = match &out.result {
                    Err(e) => match e.kind {
                        FailureKind::Transient { retry_after } => retry_after,
                        _ => None,
                    },
                    Ok(_) => None,
                };
                let delay = c
                    .next_retry
                    .as_ref()
                    .map_or(Duration::from_millis(500), |r| r.delay)
                    .max(retry_after.unwrap_or_default());
                tracing::info!(
                    node = node_id,
                    resend = sends,
                    ?observed,
                    "outcome of the attempt unknown; re-sending with the same idempotency key"
                );
                tokio::time::sleep(delay).await;
                trace::resend(sends);
                continue;
            }
            break (out, next);
        };
        Sent {
            outcome,
            next,
            sent,
            unknown_before,
        }
    }
}

impl Gateway {
    /// The outbound mark — in a slot of the tool's concurrency limit when it has one.
    /// `Some(deferred)`: no slot was free; the claim was let go and the call waits in
    /// line, nothing sent and no attempt counted.
    async fn mark(
        &self,
        c: &StepCall<'_>,
        lease: &CallLease,
    ) -> Result<Option<StepResult>, flow_ledger::Error> {
        let ledger = &self.inner.ledger;
        let Some(limit) = c.tool.concurrency else {
            ledger.mark_outbound(lease, self.now()).await?;
            return Ok(None);
        };
        let slot = Slot {
            key: super::limit_key(c.workflow, c.tool),
            limit,
        };
        match ledger
            .mark_outbound_in_slot(lease, &slot, self.now())
            .await?
        {
            SlotMark::Marked => Ok(None),
            SlotMark::Full { in_use, ahead } => {
                // Near the front of the line, ask again soon; further back, the call that
                // frees a slot wakes the oldest waiter's run anyway.
                let again = if ahead < limit {
                    SLOT_ASK_SOON
                } else {
                    SLOT_ASK_LATER
                };
                Ok(Some(StepResult::Deferred {
                    until: self.now().plus(again),
                    why: super::Deferral::Concurrency {
                        limit,
                        in_use,
                        ahead,
                    },
                }))
            }
        }
    }

    /// The downstream refused the request unprocessed and said when to come back
    /// (`Retry-After`): the call goes back to be claimed again with the same key — not a
    /// failure, not an attempt, no retry spent — and waits until then; for a tool under
    /// flow control every worker's calls of it wait too (the hold-off is in the ledger).
    async fn held_off(
        &self,
        c: &StepCall<'_>,
        lease: &CallLease,
        wait: Duration,
    ) -> Result<StepResult, flow_ledger::Error> {
        let ledger = &self.inner.ledger;
        let mut until = self.now().plus(wait.max(MIN_HOLD_OFF));
        if c.tool.flow_controlled() {
            // Telling the other workers is worth a try, not a reason to leave this call
            // outbound (the next holder would have to call it in doubt).
            let key = super::limit_key(c.workflow, c.tool);
            match ledger.hold_off(&key, until, self.now()).await {
                Ok(latest) => until = latest,
                Err(e) => tracing::warn!(
                    tool = key,
                    error = %e,
                    "cannot record the downstream's hold-off for the other workers"
                ),
            }
        }
        let why = super::Deferral::HeldOff;
        let words = format!("{why} until {}", until.to_rfc3339());
        tracing::info!(
            node = c.node.id.as_str(),
            call = lease.tool_call_id,
            until = %until.to_rfc3339(),
            "the downstream asked to wait; the call waits with the same key"
        );
        self.holder_write("give the refused call back", |now| {
            ledger.give_back_waiting(lease, Some(&words), now)
        })
        .await?;
        Ok(StepResult::Deferred { until, why })
    }

    /// The outbound mark failed. `LeaseLost`: another worker holds the call; stop. Any
    /// other failure may be a commit whose acknowledgement was lost: this process knows
    /// it sent nothing, so it gives the call back (outbound or still claimed → claimed),
    /// retrying while the ledger is unreachable, instead of leaving a mark a later
    /// holder would have to call in doubt.
    async fn mark_failed(
        &self,
        c: &StepCall<'_>,
        lease: &CallLease,
        error: flow_ledger::Error,
    ) -> Result<StepResult, flow_ledger::Error> {
        if !super::record::transient(&error) {
            return Err(error);
        }
        tracing::warn!(
            node = c.node.id.as_str(),
            call = lease.tool_call_id,
            error = %error,
            "the outbound mark may not have been written; nothing was sent: giving the call back"
        );
        self.give_back(lease).await
    }

    /// Gives the call back unsent (`Ledger::give_back_unsent`, retried while the ledger
    /// is unreachable) and defers the step briefly: its next start claims the call again
    /// under a live lease, or finds that another worker holds the run.
    async fn give_back(&self, lease: &CallLease) -> Result<StepResult, flow_ledger::Error> {
        let ledger = &self.inner.ledger;
        self.holder_write("give the unsent call back", |now| {
            ledger.give_back_unsent(lease, now)
        })
        .await?;
        Ok(StepResult::Deferred {
            why: super::Deferral::GivenBack,
            until: self.now().plus(GIVEN_BACK_RETRY),
        })
    }
}

/// How soon a call that found no free slot asks again when it is near the front of the
/// line, and when it is further back (well within `flow_ledger::WAITER_FRESH`, so a
/// waiter keeps its place).
const SLOT_ASK_SOON: Duration = Duration::from_secs(1);
const SLOT_ASK_LATER: Duration = Duration::from_secs(10);

/// The shortest wait a `Retry-After` makes (a `0` must not make a busy loop).
const MIN_HOLD_OFF: Duration = Duration::from_millis(500);
/// The longest `Retry-After` flow waits out without counting an attempt; a longer one
/// ends the attempt as a transient failure, and the node's retry policy decides.
const MAX_HOLD_OFF: Duration = Duration::from_secs(3600);

/// The wait a downstream asked for, when its answer says the request had no effect and
/// when to come back (`429`/`503`/… with `Retry-After`, up to [`MAX_HOLD_OFF`]).
fn asked_to_wait(outcome: &flow_adapters::Outcome) -> Option<Duration> {
    match &outcome.result {
        Err(e) => match e.kind {
            FailureKind::Transient {
                retry_after: Some(wait),
            } if wait <= MAX_HOLD_OFF => Some(wait),
            _ => None,
        },
        Ok(_) => None,
    }
}

/// How soon a step whose call was given back unsent starts again.
const GIVEN_BACK_RETRY: Duration = Duration::from_secs(1);

/// What the sends of one attempt came to.
struct Sent {
    /// The last send's outcome.
    outcome: Outcome,
    /// What `disposition` decided from it.
    next: Disposition,
    /// Requests sent in all (an adapter may send more than one per call).
    sent: u32,
    /// Whether an earlier send of this attempt (or a crashed process's) had an unknown outcome.
    unknown_before: bool,
}
