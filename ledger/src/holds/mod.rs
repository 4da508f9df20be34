//! Holds: a node parked until someone or something decides — an approval, an event
//! wait, a callback, a child run. Each kind keeps its own table of what only it knows
//! (votes and digests, matchers and tokens, the child's run); the `holds` view of
//! migration 0021 is the one row shape they share, and this module is its face: the
//! kinds, the one status machine they all map onto, and the one question a pause asks
//! ([`Ledger::pause_run_awaiting`]) so that no wake-up is lost whatever the kind.
//!
//! A pending hold's deadline, reminder, or orphaning (its run or step ended) is a timer
//! (`timers/`): the daemons' one watcher finds the due ones over every kind at once, and
//! each kind's rule (`sweep.rs`) settles its own through the one settle.
//!
//! Every settle of every kind goes through `settle` (`settle.rs`): the kind's
//! compare-and-set, then the node's event and the paused run's wake-up, once.
//!
//! Adding a kind of hold: a [`HoldKind`] variant, its status mapping (`HoldStatus::of_*`),
//! its `Outcome` and compare-and-set in `settle.rs`, a branch of the view (both
//! backends' migration; the `timers` view reads it), its rule in `sweep.rs`'s one
//! `match`, and the conformance case that checks the view and the kind agree
//! (`ledger/tests/conformance/holds.rs`).

mod settle;
mod sweep;

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::{RunLease, Scope};
use crate::runs::held_for_update;
use crate::state::{ApprovalStatus, RunStatus, StepStatus, WaitKind, WaitStatus};

pub(crate) use settle::{HoldRef, Outcome, Settle, settle};
pub(crate) use sweep::{Due, DueHold};
pub use sweep::{SweptHold, SweptHolds};

crate::state::text_enum! {
    /// What a hold waits for.
    HoldKind {
        /// People to approve the node's exact request (`approval:`).
        Approval => "approval",
        /// A published event its `match` accepts (`wait:`).
        Event => "event",
        /// A callback to the token its call handed out (`callback:`).
        Callback => "callback",
        /// A sub-workflow's run to end (`workflow:`).
        Child => "child",
    }
}

crate::state::text_enum! {
    /// Where a hold stands, whatever its kind: `pending` moves once to one of the
    /// others (each kind's own compare-and-set decides which; the loser of a race
    /// changes nothing).
    HoldStatus {
        /// Nobody has decided yet.
        Pending => "pending",
        /// Decided: approved or denied, the event came, the callback answered, the child
        /// ended. What the decision was is the kind's own (its table).
        Settled => "settled",
        /// Its deadline passed first.
        TimedOut => "timed_out",
        /// The run ended, or was redriven, while it waited.
        Cancelled => "cancelled",
    }
}

impl HoldKind {
    /// The kind of a wait row.
    pub fn of_wait(kind: WaitKind) -> Self {
        match kind {
            WaitKind::Event => Self::Event,
            WaitKind::Callback => Self::Callback,
        }
    }
}

impl HoldStatus {
    /// An approval's status as a hold's.
    pub fn of_approval(s: ApprovalStatus) -> Self {
        match s {
            ApprovalStatus::Pending => Self::Pending,
            ApprovalStatus::Approved | ApprovalStatus::Denied => Self::Settled,
            ApprovalStatus::TimedOut => Self::TimedOut,
            ApprovalStatus::Cancelled => Self::Cancelled,
        }
    }

    /// A wait's (event or callback) status as a hold's.
    pub fn of_wait(s: WaitStatus) -> Self {
        match s {
            WaitStatus::Pending => Self::Pending,
            WaitStatus::Completed | WaitStatus::Failed => Self::Settled,
            WaitStatus::TimedOut => Self::TimedOut,
            WaitStatus::Cancelled => Self::Cancelled,
        }
    }

    /// A child run's status as its parent's hold: settled once the child ended (its
    /// own cancel included: the parent's step then fails as the child did).
    pub fn of_child(s: RunStatus) -> Self {
        if s.is_terminal() {
            Self::Settled
        } else {
            Self::Pending
        }
    }
}

/// One row of the `holds` view: what every kind of hold has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The run that waits.
    pub run_id: String,
    /// The step that waits.
    pub step_id: String,
    /// What it waits on: the node id, or the child's run id.
    pub subject: String,
    /// What it waits for.
    pub kind: HoldKind,
    /// Where it stands.
    pub status: HoldStatus,
    /// When it times out (a child run has none).
    pub deadline: Option<Timestamp>,
    /// A pending hold signalled past what its worker looked at (a published event).
    pub unseen: bool,
}

/// Whether a hold of `run_id` changed under a step that still runs — settled, timed
/// out, cancelled, or signalled past what its worker saw — while the worker held the
/// run (so nothing re-queued it): then the worker must look again instead of pausing.
/// Read under the run's row lock, which every settle of every kind takes first.
async fn changed_under_running_step(
    c: &mut Conn<'_>,
    s: &Scope,
    run_id: &str,
) -> Result<bool, Error> {
    let found = c
        .optional::<(String,)>(
            "SELECT h.subject FROM holds h JOIN steps st ON st.tenant = h.tenant
               AND st.workspace = h.workspace AND st.run_id = h.run_id
               AND st.step_id = h.step_id
             WHERE h.tenant = $1 AND h.workspace = $2 AND h.run_id = $3
               AND st.status = $4 AND (h.status <> $5 OR h.unseen = 1)
             LIMIT 1",
            args![
                &s.tenant,
                &s.workspace,
                run_id,
                StepStatus::Running.as_str(),
                HoldStatus::Pending.as_str()
            ],
        )
        .await?;
    Ok(found.is_some())
}

impl Ledger {
    /// Pauses the run (fenced) for nodes that wait on holds — unless a hold of the run
    /// changed while its step still runs (a decision, an event, a callback or a child's
    /// end that came while this worker held the run, which therefore did not re-queue
    /// it): then nothing changes, the answer is `false`, and the caller looks at those
    /// nodes again. The run row is locked first, as every settle locks it, so the two
    /// cannot both miss each other. Emits `run.paused`.
    pub async fn pause_run_awaiting(
        &self,
        lease: &RunLease,
        reason: &str,
        now: Timestamp,
    ) -> Result<bool, Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        let reason = reason.to_owned();
        let paused = self
            .write(move |c| {
                Box::pin(async move {
                    let s = ledger.scope();
                    held_for_update(c, s, &lease).await?;
                    if changed_under_running_step(c, s, &lease.run_id).await? {
                        return Ok(false);
                    }
                    crate::run_states::pause_in(c, s, &lease, &reason, now).await?;
                    Ok(true)
                })
            })
            .await;
        if matches!(paused, Ok(true)) {
            crate::notify::settled_here();
        }
        paused
    }

    /// The holds of `run_id` by step: one read over every kind. Tests check the view
    /// against each kind's own status with it (the views read each kind's rows for what
    /// only that kind has).
    #[cfg(any(test, feature = "testkit"))]
    pub async fn holds_of_run(&self, run_id: &str) -> Result<Vec<Hold>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<(String, String, String, String, String, Option<i64>, i64)>(
                "SELECT run_id, step_id, subject, kind, status, deadline, unseen
                   FROM holds WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                  ORDER BY step_id, subject",
                args![&s.tenant, &s.workspace, run_id],
            )
            .await?;
        rows.into_iter()
            .map(
                |(run_id, step_id, subject, kind, status, deadline, unseen)| {
                    Ok(Hold {
                        run_id,
                        step_id,
                        subject,
                        kind: kind.parse()?,
                        status: status.parse()?,
                        deadline: deadline.map(Timestamp),
                        unseen: unseen != 0,
                    })
                },
            )
            .collect()
    }
}
