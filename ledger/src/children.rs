//! Child runs: the runs a sub-workflow node (`workflow:`) starts.
//!
//! A child is an ordinary run on the queue with three more columns (migration 0013):
//! the parent run, the parent's step whose result it is, and what a cancel of the
//! parent does to it. Its id is derived from the parent's step by the engine, so a
//! parent started again after a crash finds its child (insert-or-get) instead of
//! starting another. The ledger keeps the two in step:
//!
//! - [`Ledger::start_child`] inserts (or finds) the child and claims it for the
//!   parent's worker in the same transaction, fenced by the parent's lease: no daemon
//!   can take a child its parent is about to execute in-process, and a child whose
//!   parent died is taken over by anyone once its lease ends.
//! - a child's end (finish, or a cancel that ends it at once) puts its paused parent
//!   back on the queue in the same transaction (`run_states::wake_parent_in`);
//! - a parent that is about to pause while one of its children already ended does not
//!   pause (`Ledger::pause_run_awaiting` asks the `holds` view, under the parent's row
//!   lock, which a child's end takes too): one of the two always sees the other.
//! - a cancel of the parent carries down to its children marked `cancel`
//!   (`run_states::cancel_descendants`).

use std::time::Duration;

use crate::clock::Timestamp;
use crate::conn::args;
use crate::enqueue::{EnqueueTx, enqueue_in};
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::{NewRun, ParentLink, Run, RunLease};
use crate::runs::{claim_locked, held_for_update, run_for_update};
use crate::state::RunStatus;
use crate::worker::WorkerId;

/// What [`Ledger::start_child`] found or made.
#[derive(Debug, Clone)]
pub struct ChildStart {
    /// The child as it stands after the call.
    pub run: Run,
    /// Whether this call created it.
    pub created: bool,
    /// The child's lease when this call claimed it for the caller's worker: execute it.
    /// `None`: someone else holds it, or it ended or paused.
    pub lease: Option<RunLease>,
}

impl Ledger {
    /// Starts the child `run` of the step `link` names, or finds it: in one
    /// transaction, fenced by the parent's lease, the child is inserted (idempotent by
    /// id: the same workflow and inputs return the existing one, anything else is a
    /// `Conflict`, as is an existing run of another parent) and, when nobody holds it
    /// and it has not ended or paused, claimed for `worker` for `lease`.
    pub async fn start_child(
        &self,
        parent: &RunLease,
        run: NewRun,
        link: ParentLink,
        worker: &WorkerId,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ChildStart, Error> {
        let ledger = self.clone();
        let parent = parent.clone();
        let worker = worker.clone();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let prow = held_for_update(c, s, &parent).await?;
                // A cancel of the parent carries down only to children that exist: none
                // may start after it (the cancel took this row's lock too).
                if prow.cancel_requested {
                    return Err(Error::Conflict {
                        other_run: parent.run_id.clone(),
                        other_node: String::new(),
                        reason: format!(
                            "run {} is being cancelled: its sub-workflow does not start",
                            parent.run_id
                        ),
                    });
                }
                let mut tx = EnqueueTx::default();
                let enq = enqueue_in(c, &ledger, &run, None, now, &mut tx).await?;
                tx.finish(c, s).await?;
                if enq.created {
                    c.execute(
                        "UPDATE runs SET parent_run_id = $4, parent_step_id = $5,
                            on_parent_cancel = $6
                         WHERE tenant = $1 AND workspace = $2 AND id = $3",
                        args![
                            &s.tenant,
                            &s.workspace,
                            &run.id,
                            &link.run_id,
                            &link.step_id,
                            link.on_cancel.as_str()
                        ],
                    )
                    .await?;
                }
                let row = run_for_update(c, s, &run.id).await?;
                let same = row.parent_run_id.as_deref() == Some(link.run_id.as_str())
                    && row.parent_step_id.as_deref() == Some(link.step_id.as_str());
                if !same {
                    return Err(Error::Conflict {
                        other_run: run.id.clone(),
                        other_node: String::new(),
                        reason: format!(
                            "run id {} is taken by a run that is not the child of {} step {}",
                            run.id, link.run_id, link.step_id
                        ),
                    });
                }
                let claimable = match row.status()? {
                    RunStatus::Queued => true,
                    RunStatus::Running => row.check_not_held(now).is_ok(),
                    _ => false,
                };
                let lease = if claimable {
                    Some(claim_locked(c, &ledger, &row, &worker, lease, now).await?)
                } else {
                    None
                };
                let run = match &lease {
                    Some(_) => run_for_update(c, s, &run.id).await?.into_run()?,
                    None => row.into_run()?,
                };
                Ok(ChildStart {
                    run,
                    created: enq.created,
                    lease,
                })
            })
        })
        .await
    }

    /// Cancels the unfinished children marked `cancel` of the run `parent` holds (and
    /// theirs), fenced by its lease: a parent that ends other than by success (a node
    /// failed, a cancel) leaves no child of its running for nobody.
    pub async fn cancel_children(&self, parent: &RunLease, now: Timestamp) -> Result<u32, Error> {
        let ledger = self.clone();
        let parent = parent.clone();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                held_for_update(c, s, &parent).await?;
                crate::run_states::cancel_descendants(c, &ledger, &parent.run_id, None, now).await
            })
        })
        .await
    }
}
