//! What an adapter reports during a call (`call_renewing`, which also renews the call
//! lease), and remote tasks: a downstream that answers a call with a task (an MCP task) instead of
//! the result. The adapter reports the task id the moment it arrives and the gateway
//! writes it to the ledger (`Ledger::record_task`); from then on the call is never put
//! in doubt for a crash or a timeout, because flow can ask how the task ended:
//!
//! - the attempt's time runs out while the task works → the call is let go, still
//!   `outbound` with its task (`Ledger::release_task`), and the step is deferred
//!   ([`StepResult::TaskWorking`]): the next start of the step claims it back;
//! - a crash → the next holder's claim finds the task (`ClaimDecision::Collect`);
//!
//! and either way [`Gateway::collect`] asks the tool for the task's end
//! (`Tool::collect`), without sending the call again, and settles the call through the
//! same rule as a send ([`disposition`]). Only a crash before the task id was written,
//! or a server that no longer knows the task, leaves the call in doubt.

use std::time::Duration;

use flow_adapters::{Call, Fence, Outcome, Report, Reports, Tool, Window};
use flow_ledger::CallLease;
use serde_json::Value as Json;

use super::{
    Disposition, Gateway, Held, History, Observed, StepCall, StepResult, Via, disposition,
};

/// How soon a step whose remote task was still working starts again (it then waits
/// for the task for up to its timeout).
const TASK_RECHECK: Duration = Duration::from_millis(100);

impl Gateway {
    /// Asks the tool how the remote task `task_id` of the call under `lease` ended,
    /// and settles the call as a send would. Nothing is sent again, rate limits are not
    /// taken (polls are reads), and the attempt's one request is counted once here.
    pub(super) async fn collect(
        &self,
        c: &StepCall<'_>,
        lease: &CallLease,
        via: Via<'_>,
        args: &Json,
        task_id: &str,
    ) -> Result<StepResult, flow_ledger::Error> {
        tracing::info!(
            node = c.node.id.as_str(),
            task = task_id,
            "asking how the remote task of a call already sent ended"
        );
        let call = Call::new(args.clone(), lease.key.clone(), c.timeout);
        let window = self.call_window(lease);
        let out = self
            .call_renewing(c, Held::new(lease, &window), via.tool, call, Some(task_id))
            .await;
        if out.task.is_some() {
            return self.task_working(c, lease, out, 1).await;
        }
        let history = History {
            unknown_before: true,
            resends_left: 0,
        };
        let next = disposition(Observed::of(&out.result), via.class, history);
        // The request that started the task left once; it was never counted, since a
        // deferral or a crash wrote no attempt row for it.
        self.complete(c, lease, next, out.result, 1, true).await
    }

    /// The attempt's time ran out while the remote task of `out` works: the call stays
    /// outbound with its task and no holder, and the step starts again shortly. If the
    /// task id never reached the ledger (its write failed), there is nothing to collect
    /// by after all: the call is in doubt, as any unknown outcome.
    pub(super) async fn task_working(
        &self,
        c: &StepCall<'_>,
        lease: &CallLease,
        out: Outcome,
        sent: u32,
    ) -> Result<StepResult, flow_ledger::Error> {
        let task = out.task.clone().unwrap_or_default();
        match self.inner.ledger.release_task(lease, self.now()).await {
            Ok(()) => {
                tracing::info!(
                    node = c.node.id.as_str(),
                    task,
                    "the remote task is still working; asking again"
                );
                Ok(StepResult::TaskWorking {
                    task,
                    until: self.now().plus(TASK_RECHECK),
                })
            }
            Err(flow_ledger::Error::InvalidTransition { .. }) => {
                self.complete(c, lease, Disposition::InDoubt, out.result, sent, true)
                    .await
            }
            Err(e) => Err(e),
        }
    }

    /// Writes what the adapter reported during a call: a task id (durably, before the
    /// adapter's wait for it can matter) or an elicitation (secrets scrubbed). A write
    /// that fails is logged; the call goes on, and its outcome write is fenced anyway.
    pub(super) async fn record_report(&self, lease: &CallLease, report: Report) {
        let ledger = &self.inner.ledger;
        let written = match report {
            Report::Task(task) => ledger.record_task(lease, &task, self.now()).await,
            Report::Elicited(record) => {
                let record = self.inner.secrets.scrub_json(&record);
                ledger.record_elicitation(lease, record, self.now()).await
            }
        };
        if let Err(e) = written {
            tracing::warn!(call = lease.tool_call_id, error = %e, "could not record what the tool reported during the call");
        }
    }

    /// Calls the adapter (or, with `collect`, asks it how that remote task ended),
    /// renewing the call lease every third of its length meanwhile and recording what
    /// the adapter reports as it happens (a task id, an elicitation).
    ///
    /// The adapter gets the call's fence: the run lease's window and the call lease's,
    /// by this process's monotonic clock. Each renewal that succeeds confirms the call's
    /// window from the moment it was asked; a refused one (`LeaseLost`) closes it at
    /// once, and one that cannot reach the ledger lets it lapse at its deadline. The
    /// renewals run beside the adapter, so a renewal stuck on the ledger neither holds
    /// the adapter up nor keeps the window open.
    pub(super) async fn call_renewing(
        &self,
        c: &StepCall<'_>,
        held: Held<'_>,
        tool: &dyn Tool,
        call: Call,
        collect: Option<&str>,
    ) -> Outcome {
        let Held { lease, window } = held;
        let fence = Self::fence(c, window);
        let (reports, mut reported) = Reports::channel();
        let call = call.with_reports(reports).with_fence(fence);
        let hard_limit = call.timeout + Duration::from_secs(5);
        let work = match collect {
            Some(task) => tool.collect(call, task),
            None => tool.call(call),
        };
        let fut = tokio::time::timeout(hard_limit, work);
        tokio::pin!(fut);
        let renewing = self.renew_call(lease, window);
        tokio::pin!(renewing);
        loop {
            tokio::select! {
                out = &mut fut => {
                    // What was reported before the end is recorded before the end is.
                    while let Ok(report) = reported.try_recv() {
                        self.record_report(lease, report).await;
                    }
                    return out.unwrap_or_else(|_| Outcome::err(flow_adapters::Error::unknown("the tool did not return within its timeout"), 1));
                }
                Some(report) = reported.recv() => self.record_report(lease, report).await,
                () = &mut renewing => {}
            }
        }
    }

    /// The call lease `lease` by this process's monotonic clock, from its stored end.
    pub(super) fn call_window(&self, lease: &CallLease) -> Window {
        Window::until(crate::lease::local_deadline(lease.expires_at, self.now()))
    }

    /// What a request of the call may leave under: the run's window and the call's.
    pub(super) fn fence(c: &StepCall<'_>, window: &Window) -> Fence {
        Fence::of([c.writer.window().clone(), window.clone()])
    }

    /// Renews the call lease every third of its length, confirming or closing `window`
    /// (see [`Gateway::call_renewing`]); never returns while the lease is held.
    async fn renew_call(&self, lease: &CallLease, window: &Window) {
        let mut tick = tokio::time::interval(crate::lease::length() / 3);
        tick.tick().await;
        loop {
            tick.tick().await;
            let asked = std::time::Instant::now();
            match self
                .inner
                .ledger
                .renew_call_lease(lease, crate::lease::length(), self.now())
                .await
            {
                Ok(_) => window.confirm(crate::lease::confirmed_until(asked)),
                Err(flow_ledger::Error::LeaseLost) => {
                    window.lose();
                    tracing::error!(
                        call = lease.tool_call_id,
                        "call lease lost: another worker holds the call; nothing more is sent under it"
                    );
                    return std::future::pending().await;
                }
                Err(e) => {
                    tracing::warn!(call = lease.tool_call_id, error = %e, "could not renew the call lease; no request leaves once it lapses by this process's clock");
                }
            }
        }
    }
}
