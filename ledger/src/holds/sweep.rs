//! A hold's rule when its timer fires (`Ledger::fire_due_timers`, `timers/`): a pending
//! hold whose time came (a deadline, an approval's reminder) or whose run or step ended
//! without it, handed to its kind's rule.

use serde_json::Value;

use super::HoldKind;
use crate::clock::Timestamp;
use crate::error::Error;
use crate::ledger::Ledger;

/// What a hold's timer asks its kind's rule to do with one of its pending holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// Its deadline passed: `timed_out`, and its paused run back on the queue (whose
    /// next holder applies the node's `on_timeout`).
    TimedOut,
    /// Its run or its step ended without it: `cancelled` (a callback token then
    /// answers 404).
    Cancelled,
    /// Its next reminder is due (an approval's `remind` list).
    Remind,
}

/// A hold a timer changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweptHold {
    /// What it waited for.
    pub kind: HoldKind,
    /// Its run.
    pub run_id: String,
    /// What it waited on (the node id).
    pub subject: String,
}

/// What the holds' timers did in one [`Ledger::fire_due_timers`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweptHolds {
    /// Holds that timed out now (their paused runs are back on the queue).
    pub timed_out: Vec<SweptHold>,
    /// Holds of finished runs or ended steps marked `cancelled`.
    pub cancelled: usize,
    /// Reminders emitted.
    pub reminded: usize,
}

/// One due hold as its timer reads it: what its rule needs to choose.
#[derive(Debug, Clone)]
pub(crate) struct DueHold {
    pub(crate) kind: HoldKind,
    pub(crate) run_id: String,
    pub(crate) subject: String,
    /// Its deadline (an approval's or a wait's; reminders come before it).
    pub(crate) deadline: Option<Timestamp>,
    /// Its run or its step ended without it.
    pub(crate) ended: bool,
}

impl Ledger {
    /// A due hold's timer fires: its kind's rule times it out by the kind's one
    /// compare-and-set — the same a decision, an event or a callback uses, so a race
    /// changes nothing twice — and puts its paused run back on the queue; cancels it
    /// when its run or step ended without it (a callback token then answers 404); or
    /// emits an approval's due reminder (`approval.reminder`, the next one scheduled
    /// from `next_remind`). Each in its own transaction that locks the run first.
    /// Counted into `swept` when it changed the hold.
    pub(crate) async fn fire_hold(
        &self,
        hold: DueHold,
        now: Timestamp,
        next_remind: fn(&Value, u32, Timestamp) -> Option<Timestamp>,
        swept: &mut SweptHolds,
    ) -> Result<(), Error> {
        let DueHold {
            kind,
            run_id,
            subject,
            deadline,
            ended,
        } = hold;
        let due = if ended {
            Due::Cancelled
        } else if deadline.is_some_and(|d| d <= now) {
            Due::TimedOut
        } else {
            Due::Remind
        };
        // `true` when the rule changed the hold, `false` when someone else won (a
        // decision, an event, a callback, another daemon's timer).
        let changed = match kind {
            HoldKind::Approval => {
                self.approval_due(&run_id, &subject, due, now, next_remind)
                    .await?
            }
            HoldKind::Event | HoldKind::Callback => {
                self.wait_due(&run_id, &subject, due, now).await?
            }
            // No timer: a child run's end is its parent's decision.
            HoldKind::Child => false,
        };
        if changed {
            match due {
                Due::TimedOut => swept.timed_out.push(SweptHold {
                    kind,
                    run_id,
                    subject,
                }),
                Due::Cancelled => swept.cancelled += 1,
                Due::Remind => swept.reminded += 1,
            }
        }
        Ok(())
    }
}
