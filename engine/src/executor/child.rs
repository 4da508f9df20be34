//! A sub-workflow node's step: its child is a run of its own, started idempotently
//! (insert-or-get by an id derived from the parent's step, so a parent started again
//! after a crash reattaches to its child and never starts another), executed here when
//! nobody else holds it, and the step ends as the child ended. A child that pauses (in
//! doubt, awaiting approval) or is held by another worker leaves the step waiting: the
//! parent pauses "waiting on child" once nothing else can run, and the child's end puts
//! it back on the queue (`flow_ledger` `children.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flow_ledger::{ErrorKind, NewRun, OnParentCancel, ParentLink, RunStatus};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::handle::Executor;
use crate::gateway::{self, Awaited, NodeStep, StepResult};
use crate::workflow::children::Child;

/// The id of the child run of `step_id` in `parent`: `<parent>.<node>` or
/// `<parent>.<node>.<key>` for an item, when that is a valid run id; else the readable
/// part with a hash of the whole in place of what cannot be written (the ledger
/// refuses a taken id whose parent differs, so a clash is an error, never a shared run).
pub fn child_run_id(parent: &str, step_id: &str) -> String {
    let node = crate::item_id::node_of(step_id);
    let key = crate::item_id::item_key(node, step_id, 0);
    let plain = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
    };
    let readable = match key {
        None => format!("{parent}.{step_id}"),
        Some(k) if plain(k) => format!("{parent}.{node}.{k}"),
        Some(k) => format!("{parent}.{node}.h{}", &hex(k.as_bytes())[..16]),
    };
    if readable.len() <= flow_ledger::ids::MAX_ID_LEN && (key.is_some() || plain(step_id)) {
        return readable;
    }
    let whole = hex(format!("{parent}\n{step_id}").as_bytes());
    format!("child.{}", &whole[..40])
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What a child step needs from the parent's execution besides its call.
pub(super) struct ChildCtx {
    pub(super) executor: Executor,
    pub(super) child: Arc<Child>,
    /// Fires when the parent stops (a daemon shutting down): the child is released too.
    pub(super) halt: CancellationToken,
    /// The parent's cancel request, as its heartbeat reports it.
    pub(super) cancel: Arc<AtomicBool>,
}

/// Runs a sub-workflow node's step: opens it, starts (or finds) the child, executes it
/// when this worker got it, and settles the step from the child's state.
pub(super) async fn run_child(
    cx: ChildCtx,
    call: NodeStep<'_>,
) -> Result<StepResult, gateway::Error> {
    let gw = cx.executor.gateway().clone();
    gw.open_child_step(&call).await?;
    let decl = call
        .node
        .child()
        .map_or(OnParentCancel::Cancel, |d| d.on_parent_cancel);
    let inputs = match child_inputs(&call, &cx.child) {
        Ok(v) => v,
        Err(message) => return gw.child_failed(&call, ErrorKind::Permanent, message).await,
    };
    let lease = call.run();
    let id = child_run_id(&lease.run_id, &call.step_id);
    let new = NewRun {
        id: id.clone(),
        workflow_name: cx.child.workflow.name.clone(),
        workflow_text: cx.child.text.clone(),
        inputs,
        priority: 0,
        not_before: None,
        trace_parent: None,
    };
    let link = ParentLink {
        run_id: lease.run_id.clone(),
        step_id: call.step_id.clone(),
        on_cancel: decl,
    };
    let ledger = gw.ledger();
    let started = match ledger
        .start_child(
            lease,
            new,
            link,
            &lease.worker,
            crate::lease::length(),
            gw.now(),
        )
        .await
    {
        Ok(s) => s,
        Err(flow_ledger::Error::Conflict { reason, .. }) => {
            let message = format!("cannot start sub-workflow run {id}: {reason}");
            return gw.child_failed(&call, ErrorKind::Permanent, message).await;
        }
        Err(flow_ledger::Error::LeaseLost) => {
            return Err(gateway::Error::LeaseLost {
                run_id: lease.run_id.clone(),
            });
        }
        Err(e) => return Err(gateway::Error::Ledger(e)),
    };
    if let Some(child_lease) = started.lease {
        execute_here(&cx, child_lease, &started.run, decl).await;
    }
    let run = ledger.get_run(&id).await.map_err(gateway::Error::Ledger)?;
    match run.status {
        RunStatus::Succeeded => {
            let output = run.output.unwrap_or(Json::Null);
            gw.child_succeeded(&call, output).await
        }
        RunStatus::Failed => {
            let why = run.error.unwrap_or_else(|| "no reason recorded".into());
            let message = format!("sub-workflow run {id} failed: {why}");
            gw.child_failed(&call, ErrorKind::Permanent, message).await
        }
        RunStatus::Cancelled => {
            let message = format!("sub-workflow run {id} was cancelled");
            gw.child_failed(&call, ErrorKind::Permanent, message).await
        }
        RunStatus::Paused if in_doubt(ledger, &id).await => Ok(StepResult::Waiting {
            deadline: flow_ledger::Timestamp(i64::MAX),
            on: Awaited::ChildInDoubt(id),
        }),
        RunStatus::Queued | RunStatus::Running | RunStatus::Paused => Ok(StepResult::Waiting {
            deadline: flow_ledger::Timestamp(i64::MAX),
            on: Awaited::Child(id),
        }),
    }
}

/// Whether the paused child run `id` holds a call in doubt (a read failure counts as
/// no: the item then holds its slot, as before).
async fn in_doubt(ledger: &flow_ledger::Ledger, id: &str) -> bool {
    ledger.list_calls(id).await.is_ok_and(|calls| {
        calls
            .iter()
            .any(|c| c.status == flow_ledger::CallStatus::InDoubt)
    })
}

/// The child's inputs: the node's `with` rendered, checked against the child's
/// declared inputs and completed with their defaults.
fn child_inputs(call: &NodeStep<'_>, child: &Child) -> Result<Json, String> {
    let rendered = call
        .node
        .with
        .render(&call.ctx)
        .map_err(|e| format!("`with` of node `{}`: {e}", call.node.id))?;
    let given = match rendered {
        Json::Object(m) => m,
        Json::Null => serde_json::Map::new(),
        other => {
            return Err(format!(
                "`with` of node `{}` must be a mapping of the child's inputs, found {other}",
                call.node.id
            ));
        }
    };
    crate::inputs::from_json(&child.workflow, given).map_err(|e| {
        format!(
            "inputs of sub-workflow `{}` (node `{}`): {e}",
            child.path, call.node.id
        )
    })
}

/// Executes the child this worker claimed until it ends, pauses or is released. The
/// parent stopping releases it; the parent cancelled releases an `abandon` child (it
/// goes on under any daemon) — a `cancel` child was cancelled by the ledger with its
/// parent and sees that at its own heartbeat. An error leaves the child to its lease's
/// end, after which any worker takes it over; the parent reads its state either way.
async fn execute_here(
    cx: &ChildCtx,
    lease: flow_ledger::RunLease,
    run: &flow_ledger::Run,
    decl: OnParentCancel,
) {
    let stop = cx.halt.child_token();
    let id = lease.run_id.clone();
    let work = Box::pin(
        cx.executor
            .execute_claimed(lease, &cx.child.workflow, run, &stop),
    );
    tokio::pin!(work);
    let outcome = loop {
        tokio::select! {
            out = &mut work => break out,
            () = tokio::time::sleep(Duration::from_millis(200)), if !stop.is_cancelled() => {
                if decl == OnParentCancel::Abandon && cx.cancel.load(Ordering::Relaxed) {
                    stop.cancel();
                }
            }
        }
    };
    if let Err(e) = outcome {
        tracing::warn!(run = %id, error = %e, "sub-workflow run stopped here; its lease will end and any worker takes it over");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_ids_are_readable_valid_and_distinct() {
        assert_eq!(child_run_id("run_1", "provision"), "run_1.provision");
        assert_eq!(
            child_run_id("run_1", "provision[t-1]"),
            "run_1.provision.t-1"
        );
        let odd = child_run_id("run_1", "provision[a b/c]");
        assert!(odd.starts_with("run_1.provision.h"), "{odd}");
        assert_ne!(odd, child_run_id("run_1", "provision[a b/d]"));
        let long = child_run_id(&"r".repeat(120), "provision[k]");
        assert!(long.starts_with("child.") && long.len() <= 128, "{long}");
        for id in [odd, long, child_run_id("run_1", "provision[x.y]")] {
            assert!(
                flow_ledger::ids::check_id(flow_ledger::ids::IdKind::Run, &id).is_ok(),
                "{id}"
            );
        }
    }
}
