//! The one way a hold settles. Every move of an approval, an event wait or a callback
//! out of `pending` — a decision, an event, a callback, its deadline (at the watcher, at
//! a late decision, when the node looks again), a cancel — is a [`Settle`] handed to
//! [`settle`]: the kind's compare-and-set (`pending` → the new status; the loser of a
//! race changes nothing), then, only when it won, the node's event and the paused run
//! back on the queue. Callers hold the run's row lock first, as the pause does
//! (`Ledger::pause_run_awaiting`), so no settle can slip between a worker's last look
//! and its pause.
//!
//! A child run's hold is the one kind not settled here: it has no row of its own to
//! move — the child's own end (the run state machine's compare-and-set) settles it, and
//! the same transaction wakes the parent (`run_states::wake_parent_in`).

use serde_json::Value;

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::{EventType, NodeRef, node_event};
use crate::model::{Actor, Scope};
use crate::rows::RunRow;
use crate::run_states::requeue_paused;
use crate::state::{ApprovalStatus, WaitStatus};

/// Which hold settles: its run, the step that waits, the node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HoldRef<'a> {
    pub(crate) run_id: &'a str,
    pub(crate) step_id: &'a str,
    pub(crate) node_id: &'a str,
}

/// What a hold settles to, with what only its kind records beside the status.
#[derive(Debug)]
pub(crate) enum Outcome<'a> {
    /// An approval: the decided request's `digest` (a decision on an older request
    /// changes nothing), who decided, why, and the inputs they gave (stored JSON).
    Approval {
        to: ApprovalStatus,
        digest: &'a str,
        by: Option<&'a str>,
        reason: Option<&'a str>,
        inputs: Option<String>,
    },
    /// An event wait or a callback: who settled it (`event`, `callback`, `deadline`,
    /// `sweep`), the event that completed it, the callback's output or error.
    Wait {
        to: WaitStatus,
        by: &'a str,
        event_id: Option<String>,
        output: Option<String>,
        error: Option<String>,
    },
}

impl<'a> Outcome<'a> {
    /// A wait moved to `to` by `by` with nothing else to record (a deadline, a cancel).
    pub(crate) fn wait(to: WaitStatus, by: &'a str) -> Self {
        Outcome::Wait {
            to,
            by,
            event_id: None,
            output: None,
            error: None,
        }
    }
}

/// One settle: the hold, its outcome, the node's event and the run to wake, both only
/// when the compare-and-set won.
#[derive(Debug)]
pub(crate) struct Settle<'a> {
    pub(crate) hold: HoldRef<'a>,
    pub(crate) outcome: Outcome<'a>,
    /// The node's event (`approval.decided`, `wait.timed_out`, …) and its payload;
    /// `None` for a cancel, which the run's own end already announced.
    pub(crate) event: Option<(EventType, Value)>,
    /// The run (locked by the caller) to put back on the queue if it is paused, and who
    /// did it; `None` when the caller holds the run (its worker applies the outcome).
    pub(crate) wake: Option<(&'a RunRow, Option<&'a Actor>)>,
}

/// Settles a pending hold (the module's doc); `false` when it was no longer pending —
/// someone else won, and nothing was written.
pub(crate) async fn settle(
    c: &mut Conn<'_>,
    s: &Scope,
    settle: Settle<'_>,
    now: Timestamp,
) -> Result<bool, Error> {
    let Settle {
        hold,
        outcome,
        event,
        wake,
    } = settle;
    let changed = match outcome {
        Outcome::Approval {
            to,
            digest,
            by,
            reason,
            inputs,
        } => {
            c.execute(
                "UPDATE approvals SET status = $5, decided_at = $6, decided_by = $7, reason = $8,
                    inputs = $9, next_remind_at = NULL
                 WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND node_id = $4
                   AND status = $10 AND digest = $11",
                args![
                    &s.tenant,
                    &s.workspace,
                    hold.run_id,
                    hold.node_id,
                    to.as_str(),
                    now,
                    by,
                    reason,
                    inputs,
                    ApprovalStatus::Pending.as_str(),
                    digest
                ],
            )
            .await?
        }
        Outcome::Wait {
            to,
            by,
            event_id,
            output,
            error,
        } => {
            c.execute(
                "UPDATE waits SET status = $5, settled_at = $6, settled_by = $7, event_id = $8,
                    output = $9, error = $10
                 WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND node_id = $4
                   AND status = $11 AND step_id = $12",
                args![
                    &s.tenant,
                    &s.workspace,
                    hold.run_id,
                    hold.node_id,
                    to.as_str(),
                    now,
                    by,
                    event_id,
                    output,
                    error,
                    WaitStatus::Pending.as_str(),
                    hold.step_id
                ],
            )
            .await?
        }
    } == 1;
    if !changed {
        return Ok(false);
    }
    if let Some((event_type, payload)) = event {
        let ids = NodeRef {
            run_id: hold.run_id,
            step_id: hold.step_id,
            node_id: hold.node_id,
        };
        node_event(c, s, ids, event_type, payload, now).await?;
    }
    if let Some((run, actor)) = wake {
        requeue_paused(c, s, run, actor, now).await?;
    }
    Ok(true)
}
