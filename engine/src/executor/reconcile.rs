//! Before a run pauses on in-doubt calls, the process holding it asks the downstream
//! about each call whose tool declares `reconcile:` ([`crate::reconcile`]). A settled
//! call changes the run's state (a node succeeded, or its step is pending a re-send with
//! the same key), so the loop decides again instead of pausing. Probes that come due soon
//! are waited for here; later ones are left to the schedule the ledger keeps (the
//! daemon's reconciler, `flow resume`, `flow reconcile`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::node::NodeState;
use super::scope::{RunScope, lease_err};
use super::state::RunState;
use crate::gateway;
use crate::item_id::{item_key, item_step_id};
use crate::reconcile::{ProbeCall, Reconciled, reconcile_call};

/// Longest this process waits, in all, for probes to come due before it pauses the run
/// and leaves them to the schedule.
pub const IN_PROCESS_WAIT: Duration = Duration::from_secs(10);

impl RunScope<'_> {
    /// Probes the in-doubt calls of `in_doubt` that declare `reconcile:`; true when one
    /// was settled (the state is reloaded from the ledger and the loop decides again).
    pub(super) async fn reconcile(
        &self,
        st: &mut RunState,
        in_doubt: &[usize],
        cancel: &AtomicBool,
        lost: &watch::Receiver<bool>,
    ) -> Result<bool, gateway::Error> {
        let nodes: Vec<usize> = in_doubt
            .iter()
            .copied()
            .filter(|&i| {
                self.wf
                    .tool_of(&self.wf.nodes[i])
                    .is_some_and(|t| t.reconcile.is_some())
            })
            .collect();
        // The calls to ask about: a node's, or each item in doubt of a `for_each` node.
        let calls: Vec<(usize, String)> = nodes
            .iter()
            .flat_map(|&i| match &st.nodes[i] {
                NodeState::FanOut(fan) => fan
                    .in_doubt_keys()
                    .map(|k| (i, item_step_id(&self.wf.nodes[i].id, k, 0)))
                    .collect::<Vec<_>>(),
                _ => vec![(i, self.wf.nodes[i].id.clone())],
            })
            .collect();
        if calls.is_empty() {
            return Ok(false);
        }
        // What a reload reads must include the results kept in memory.
        self.flush_pure().await?;
        let lease = self.lease();
        let by = lease.worker.to_string();
        let give_up_at = Instant::now() + IN_PROCESS_WAIT;
        loop {
            if cancel.load(Ordering::Relaxed) || *lost.borrow() {
                return Ok(false);
            }
            let mut changed = false;
            let mut next = None;
            for (i, call_id) in &calls {
                let node = &self.wf.nodes[*i];
                let call = ProbeCall {
                    wf: self.wf,
                    node,
                    call_id,
                    run_id: &lease.run_id,
                    inputs: self.inputs,
                    by: &by,
                    now_regardless: false,
                    dry_run: false,
                    run_live: true,
                };
                let outcome = reconcile_call(self.gateway, call)
                    .await
                    .map_err(|crate::reconcile::Error::Ledger(e)| gateway::Error::Ledger(e))?;
                log(call_id, &outcome);
                match outcome {
                    Reconciled::NotInDoubt | Reconciled::Probed { settled: true, .. } => {
                        changed = true
                    }
                    Reconciled::NotDue { at }
                    | Reconciled::Probed {
                        next_probe_at: Some(at),
                        ..
                    }
                    | Reconciled::NotAsked {
                        retry_at: Some(at), ..
                    } => next = Some(next.map_or(at, |n: flow_ledger::Timestamp| n.min(at))),
                    _ => {}
                }
            }
            if changed {
                let steps = self
                    .gateway
                    .ledger()
                    .list_steps(&lease.run_id)
                    .await
                    .map_err(|e| lease_err(e, lease))?;
                *st = RunState::load(self.wf, &steps);
                self.rebuild_fans(st).await?;
                // Decide again only if a node really left doubt: a call that is "not in
                // doubt" while its step still is (a row settled by hand half-way) must
                // pause the run, not spin here.
                let left_doubt = calls.iter().any(|(i, call_id)| {
                    let node = &self.wf.nodes[*i].id;
                    match st.items.get(i) {
                        Some(items) => item_key(node, call_id, 0)
                            .and_then(|k| items.get(k))
                            .is_none_or(|s| !matches!(s, NodeState::InDoubt { .. })),
                        None => !matches!(st.nodes[*i], NodeState::InDoubt { .. }),
                    }
                });
                return Ok(left_doubt);
            }
            let Some(at) = next else { return Ok(false) };
            let wait = Duration::from_millis(
                u64::try_from((at.0 - self.gateway.now().0).max(0)).unwrap_or(0),
            );
            if Instant::now() + wait > give_up_at {
                return Ok(false);
            }
            tokio::time::sleep(wait).await;
        }
    }
}

/// One line per probe outcome, for the operator watching `flow run`.
fn log(node: &str, outcome: &Reconciled) {
    match outcome {
        Reconciled::Probed {
            probe,
            observed,
            decision,
            http_status,
            detail,
            ..
        } => tracing::info!(
            node,
            probe,
            observed = observed.as_str(),
            decision = decision.as_str(),
            http_status,
            detail = detail.as_deref().unwrap_or(""),
            "reconcile: probed the downstream about the call in doubt"
        ),
        Reconciled::NotAsked { why, .. } => {
            tracing::warn!(node, why = why.as_str(), "reconcile: no probe sent");
        }
        Reconciled::Spent => {
            tracing::info!(node, "reconcile: probes spent; a human decides");
        }
        _ => {}
    }
}
