//! Steps 4–7 of a call that leaves the process, under its claim: a recorded remote
//! task is collected; else the rate limit and quota, the fenced outbound mark, the
//! sends (again with the same key while `disposition` says so) and the outcome. Runs
//! in the call's CLIENT span (`trace.rs`), which records how it ended.

use std::time::Duration;

use flow_adapters::{Call, FailureKind, Outcome, SideEffect, Tool};
use flow_ledger::CallLease;
use serde_json::Value as Json;

use tracing::Instrument as _;

use super::{
    Disposition, Gateway, History, Observed, Rendered, StepCall, StepResult, disposition, trace,
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
        (tool, class): (&dyn Tool, SideEffect),
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
            let collected = self.collect(c, &lease, tool, args, (&task, class)).await?;
            self.inner.faults.hit(Point::AfterComplete, node_id);
            return self.then_callback(c, collected).await;
        }

        // 4. Rate limit and quota, counted across workers.
        if let Some(until) = self.rate_limited(c.workflow, c.tool).await? {
            self.inner.ledger.release_call(&lease, self.now()).await?;
            return Ok(StepResult::Deferred { until });
        }

        let span = trace::call_span(c, &rendered.target, &lease, self.secrets_of(c));
        let result = self
            .outbound(c, args, (tool, class), lease)
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
        (tool, class): (&dyn Tool, SideEffect),
        mut lease: CallLease,
    ) -> Result<StepResult, flow_ledger::Error> {
        let node_id = c.call_id.as_str();
        // 5–7. Outbound, the adapter, the outcome. The HTTP clients exist before the
        // mark (they are built on first use).
        self.tools().warm();
        trace::decide(&mut lease);
        self.inner.ledger.mark_outbound(&lease, self.now()).await?;
        trace::marked();
        self.inner.faults.hit(Point::AfterOutbound, node_id);
        let Sent {
            outcome,
            next,
            sent,
            unknown_before,
        } = self.send(c, &lease, tool, args, class).await;
        self.inner.faults.hit(Point::AfterResponse, node_id);
        trace::answered(&outcome);
        if sent > 1 {
            self.count_extra_requests(c, sent - 1).await?;
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
    async fn send(
        &self,
        c: &StepCall<'_>,
        lease: &CallLease,
        tool: &dyn Tool,
        args: &Json,
        class: SideEffect,
    ) -> Sent {
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
                    lease,
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
