//! Reconciliation: settle an in-doubt call by asking the downstream, before a human is
//! paged (README: "Reconciliation").
//!
//! A call is in doubt when its request may have left and its outcome is unknown. A tool
//! with a `reconcile:` block declares a read-only probe that asks the downstream whether
//! the effect attempt's key took effect. [`reconcile_call`] runs one probe and carries out
//! what [`decide::verdict`] says about its answer:
//! - found → the call is settled as succeeded with the probe's output, by `reconcile`;
//! - not found (and trusted) → settled for a re-send with the **same** key, so a late
//!   original is still deduplicated by a downstream that honours keys;
//! - otherwise it stays in doubt: probe again later, or a human decides.
//!
//! Settling goes through [`flow_ledger::Ledger::resolve_call`], the operator's own path,
//! so the at-most-once rules are not written twice, and two probers (or a prober and an
//! operator) cannot both settle a call: the second finds it no longer in doubt. Every
//! probe is recorded ([`flow_ledger::Ledger::record_probe`]).
//!
//! Who probes: the process holding the run (`flow run`, `flow resume`, a daemon's
//! worker) before it pauses the run ([`crate::executor`]); `flow reconcile` on demand;
//! and the daemon's reconciler, which re-queues paused runs whose next probe is due so
//! that a worker — one per run, by the run lease — probes them.

pub mod decide;
mod probe;

use flow_ledger::{CallStatus, NewProbe, Resolution, Resolve, Timestamp};
use serde::Serialize;
use serde_json::Value as Json;
use tracing::Instrument as _;

pub use decide::{Answer, Timing, Verdict, verdict};
pub use probe::NotAsked;

use crate::gateway::Gateway;
use crate::workflow::{NodeDecl, Workflow};

/// Who settles a call through a probe, as recorded in its resolution.
pub const RESOLVED_BY: &str = "reconcile";

/// One in-doubt call to probe.
#[derive(Debug, Clone, Copy)]
pub struct ProbeCall<'a> {
    /// The run's workflow.
    pub wf: &'a Workflow,
    /// The call's node.
    pub node: &'a NodeDecl,
    /// The call's id: the node id, or `node[<key>]` for an item of a `for_each` node.
    pub call_id: &'a str,
    /// The run.
    pub run_id: &'a str,
    /// The run's inputs.
    pub inputs: &'a Json,
    /// Who probes (a worker id, or the operator running `flow reconcile`).
    pub by: &'a str,
    /// Probe even when the schedule says not yet, or the probes are spent (`flow
    /// reconcile`: an operator asked).
    pub now_regardless: bool,
    /// Probe and report, but record and settle nothing (`flow reconcile --dry-run`).
    pub dry_run: bool,
    /// Whether the run can still continue (queued, running, paused). A finished run's
    /// call is probed so that its outcome can be recorded, but never re-sent.
    pub run_live: bool,
}

/// What became of one call.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Reconciled {
    /// The node's tool declares no `reconcile`.
    NotReconcilable,
    /// The call is no longer in doubt (settled meanwhile by someone else).
    NotInDoubt,
    /// Not due yet: probe at this time.
    NotDue {
        /// When.
        at: Timestamp,
    },
    /// The probes are spent: a human decides.
    Spent,
    /// No probe could be sent now (rate limit, missing secret, egress).
    NotAsked {
        /// Why.
        why: String,
        /// When to try again, if it may work later.
        retry_at: Option<Timestamp>,
    },
    /// A probe was sent.
    Probed {
        /// Its number (1-based; what it would have been, in a dry run).
        probe: u32,
        /// The key asked about.
        key: String,
        /// What the answer said (`found`, `not_found`, `unknown`).
        observed: flow_ledger::ProbeObserved,
        /// What flow did or, in a dry run, would do.
        decision: flow_ledger::ProbeDecision,
        /// The HTTP status, if HTTP.
        http_status: Option<u16>,
        /// Why the answer settled nothing.
        detail: Option<String>,
        /// When the next probe is due (`probe_again`).
        next_probe_at: Option<Timestamp>,
        /// Whether the call was settled (succeeded or for a re-send).
        settled: bool,
    },
}

/// Errors that stop reconciliation (the ledger failed); everything else is an outcome.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The ledger failed.
    #[error(transparent)]
    Ledger(#[from] flow_ledger::Error),
}

/// Probes one in-doubt call and carries out the verdict (see the module docs).
pub async fn reconcile_call(gateway: &Gateway, p: ProbeCall<'_>) -> Result<Reconciled, Error> {
    let due = match due(gateway, &p).await? {
        Ok(due) => due,
        Err(outcome) => return Ok(outcome),
    };
    let span = crate::telemetry::spans::probe(&due.call);
    let dry_run = p.dry_run;
    let outcome = probe_due(gateway, p, due).instrument(span.clone()).await?;
    match &outcome {
        Reconciled::Probed {
            probe,
            observed,
            decision,
            http_status,
            ..
        } => {
            let probed = crate::telemetry::spans::Probed {
                number: *probe,
                observed: observed.as_str(),
                decision: decision.as_str(),
                http_status: *http_status,
                dry_run,
            };
            crate::telemetry::spans::probed(&span, &probed);
        }
        Reconciled::NotAsked { why, .. } => crate::telemetry::spans::probe_not_asked(&span, why),
        _ => {}
    }
    Ok(outcome)
}

/// Asks the downstream about a call that is due, records the answer and carries out
/// the verdict.
async fn probe_due(gateway: &Gateway, p: ProbeCall<'_>, due: Due<'_>) -> Result<Reconciled, Error> {
    let ledger = gateway.ledger();
    let Due {
        tool,
        r,
        call,
        schedule,
    } = due;
    let ctx = probe::context(&call, p.inputs, p.run_id);
    let asked = match probe::ask(gateway, p.wf, tool, r, &ctx).await {
        Ok(asked) => asked,
        Err(NotAsked::Limited(at)) => {
            return Ok(Reconciled::NotAsked {
                why: "the tool's rate limit or quota has no room".into(),
                retry_at: Some(at),
            });
        }
        Err(NotAsked::Refused(why)) => {
            return Ok(Reconciled::NotAsked {
                why,
                retry_at: None,
            });
        }
    };
    let number = schedule.probes.saturating_add(1);
    let timing = Timing {
        now: gateway.now(),
        outbound_at: call.outbound_started_at,
        after: r.after,
        probe: number,
        max_probes: r.max_probes,
        resends: schedule.resends,
        max_resends: r.max_resends,
        run_live: p.run_live,
        interval: r.interval,
    };
    let v = verdict(&asked.answer, &timing);
    let detail = detail_of(&asked.answer, &v, &timing, r);
    let next_probe_at = match &v {
        Verdict::ProbeAgain { at } => Some(*at),
        // Due at once should the call be in doubt again (a re-send whose outcome is
        // unknown in turn): the probe count goes on from here.
        Verdict::Succeed(_) | Verdict::Resend => Some(timing.now),
        Verdict::NeedsOperator => None,
    };
    let report =
        |probe: u32, v: &Verdict, detail: &Option<String>, settled: bool| Reconciled::Probed {
            probe,
            key: call.current_key.clone(),
            observed: asked.answer.observed(),
            decision: v.decision(),
            http_status: asked.http_status,
            detail: detail.clone(),
            next_probe_at: next_probe_at.filter(|_| matches!(v, Verdict::ProbeAgain { .. })),
            settled,
        };
    if p.dry_run {
        return Ok(report(number, &v, &detail, false));
    }
    let recorded = ledger
        .record_probe(
            NewProbe {
                run_id: p.run_id.to_string(),
                tool_call_id: p.call_id.to_string(),
                sent_key: call.current_key.clone(),
                observed: asked.answer.observed(),
                decision: v.decision(),
                http_status: asked.http_status,
                detail: detail.clone(),
                response: asked.summary.clone(),
                next_probe_at,
                by: p.by.to_string(),
                tool: call.tool.clone(),
                attempt: call.attempt_count,
                requests_sent: asked.requests_sent,
                max_resends: r.max_resends,
            },
            timing.now,
        )
        .await;
    let recorded = match recorded {
        Ok(n) => n,
        Err(flow_ledger::Error::InvalidTransition { .. } | flow_ledger::Error::NotFound { .. }) => {
            return Ok(Reconciled::NotInDoubt);
        }
        Err(e) => return Err(e.into()),
    };
    // Another prober's re-send may have spent the budget meanwhile: the ledger's
    // decision is the one carried out.
    let (v, detail) = if recorded.decision == flow_ledger::ProbeDecision::NeedsOperator
        && v != Verdict::NeedsOperator
    {
        let spent = timing_spent(&timing);
        let detail = detail_of(&asked.answer, &Verdict::NeedsOperator, &spent, r);
        (Verdict::NeedsOperator, detail)
    } else {
        (v, detail)
    };
    let number = recorded.number;
    match settle(gateway, &p, &v, number, &call.current_key).await? {
        None => Ok(report(
            number,
            &v,
            &detail,
            !matches!(v, Verdict::ProbeAgain { .. } | Verdict::NeedsOperator),
        )),
        Some(other) => Ok(other),
    }
}

/// `t` with its re-send budget spent (what the ledger found when it refused a re-send).
fn timing_spent(t: &Timing) -> Timing {
    Timing {
        resends: t.max_resends,
        ..*t
    }
}

/// Why an answer settled nothing, in the words `flow show` and the inbox print.
fn detail_of(
    answer: &Answer,
    v: &Verdict,
    t: &Timing,
    r: &crate::workflow::Reconcile,
) -> Option<String> {
    match (answer, v) {
        (Answer::Unknown(why), _) => Some(why.clone()),
        (Answer::NotFound, Verdict::ProbeAgain { .. }) => Some(format!(
            "not found, but not trusted until {} after the latest send (reconcile.after)",
            crate::duration_text::duration(r.after)
        )),
        (Answer::NotFound, Verdict::NeedsOperator) if !t.run_live => Some(
            "not found, but the run is finished: nothing is re-sent; resolve the call as failed if it did not happen"
                .into(),
        ),
        (Answer::NotFound, Verdict::NeedsOperator) => Some(format!(
            "not found, but the re-send budget is spent ({} of reconcile.max_resends = {}): a downstream whose status lags its effects may have executed each send; a human decides",
            t.resends, t.max_resends
        )),
        _ => None,
    }
}

/// A call to probe now: its tool and `reconcile:` block, the call (in doubt) and its
/// probe schedule.
struct Due<'a> {
    tool: &'a crate::workflow::ToolDecl,
    r: &'a crate::workflow::Reconcile,
    call: flow_ledger::ToolCall,
    schedule: flow_ledger::ProbeSchedule,
}

/// What to probe, or why nothing is probed now (no `reconcile:`, not in doubt any more,
/// not due, probes spent).
async fn due<'a>(
    gateway: &Gateway,
    p: &ProbeCall<'a>,
) -> Result<Result<Due<'a>, Reconciled>, Error> {
    let ledger = gateway.ledger();
    let Some(tool) = p.wf.tool_of(p.node) else {
        return Ok(Err(Reconciled::NotReconcilable));
    };
    let Some(r) = &tool.reconcile else {
        return Ok(Err(Reconciled::NotReconcilable));
    };
    let call = match ledger.get_call(p.run_id, p.call_id).await {
        Ok(call) => call,
        Err(flow_ledger::Error::NotFound { .. }) => return Ok(Err(Reconciled::NotInDoubt)),
        Err(e) => return Err(e.into()),
    };
    if call.status != CallStatus::InDoubt {
        return Ok(Err(Reconciled::NotInDoubt));
    }
    let schedule = ledger.probe_schedule(p.run_id, p.call_id).await?;
    if !p.now_regardless {
        match schedule.next_probe_at {
            None if schedule.probes > 0 => return Ok(Err(Reconciled::Spent)),
            Some(at) if at > gateway.now() => return Ok(Err(Reconciled::NotDue { at })),
            _ => {}
        }
    }
    Ok(Ok(Due {
        tool,
        r,
        call,
        schedule,
    }))
}

/// Carries out a settling verdict through the operator's resolution path: `None` when
/// done (or nothing to settle), else what came of the call instead.
async fn settle(
    gateway: &Gateway,
    p: &ProbeCall<'_>,
    v: &Verdict,
    number: u32,
    key: &str,
) -> Result<Option<Reconciled>, Error> {
    let (resolution, note) = match v {
        Verdict::Succeed(output) => (
            Resolution::Succeeded(output.clone()),
            format!("probe {number} found the effect of key {key}"),
        ),
        Verdict::Resend => (
            Resolution::Retry,
            format!("probe {number} found no effect of key {key}; re-sending with the same key"),
        ),
        Verdict::ProbeAgain { .. } | Verdict::NeedsOperator => return Ok(None),
    };
    let resolve = Resolve {
        run_id: p.run_id.to_string(),
        tool_call_id: p.call_id.to_string(),
        resolution,
        by: RESOLVED_BY.to_string(),
        note: Some(note),
    };
    match gateway.ledger().resolve_call(resolve, gateway.now()).await {
        Ok(call) => {
            crate::telemetry::spans::resolved(&call, crate::telemetry::spans::Resolver::Reconcile);
            Ok(None)
        }
        Err(
            flow_ledger::Error::InvalidTransition { .. }
            | flow_ledger::Error::Terminal { .. }
            | flow_ledger::Error::NotFound { .. },
        ) => Ok(Some(Reconciled::NotInDoubt)),
        Err(e @ flow_ledger::Error::OutputTooLarge { .. }) => Ok(Some(Reconciled::NotAsked {
            why: format!("the probe's output cannot be recorded: {e}"),
            retry_at: None,
        })),
        Err(e) => Err(e.into()),
    }
}
