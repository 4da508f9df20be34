//! The one sweep of every kind of hold: pending holds whose time came (a deadline, an
//! approval's reminder) or whose run or step ended without them, read in one query over
//! the `holds` view and handed, one by one, to their kind's rule.

use serde_json::Value;

use super::{HoldKind, HoldStatus};
use crate::clock::Timestamp;
use crate::conn::args;
use crate::error::Error;
use crate::ledger::Ledger;

/// What the sweep asks a kind's rule to do with one of its pending holds.
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

/// The hold one sweep changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweptHold {
    /// What it waited for.
    pub kind: HoldKind,
    /// Its run.
    pub run_id: String,
    /// What it waited on (the node id).
    pub subject: String,
}

/// What one [`Ledger::sweep_holds`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweptHolds {
    /// Holds that timed out now (their paused runs are back on the queue).
    pub timed_out: Vec<SweptHold>,
    /// Holds of finished runs or ended steps marked `cancelled`.
    pub cancelled: usize,
    /// Reminders emitted.
    pub reminded: usize,
}

impl Ledger {
    /// The daemons' sweep of every kind of hold (any daemon, any number at once): a
    /// pending hold past its deadline becomes `timed_out` by its kind's one
    /// compare-and-set — the same a decision, an event or a callback uses, so a race
    /// changes nothing twice — and its paused run goes back on the queue; a pending hold
    /// of a finished run, or of a step that ended without it (a failed call), becomes
    /// `cancelled`; an approval's due reminder is emitted (`approval.reminder`), the
    /// next one scheduled from `next_remind` (the engine reads the rule's `remind`
    /// list). A child run has no deadline: its own end settles its parent's hold. At
    /// most `limit` holds per sweep, soonest due first; each in its own transaction.
    pub async fn sweep_holds(
        &self,
        now: Timestamp,
        limit: u32,
        next_remind: fn(&Value, u32, Timestamp) -> Option<Timestamp>,
    ) -> Result<SweptHolds, Error> {
        let s = self.scope();
        let due = {
            let mut pc = self.pool().acquire().await?;
            pc.conn()
                .all::<(String, String, String, Option<i64>, i64)>(
                    "SELECT h.run_id, h.subject, h.kind, h.deadline,
                            CASE WHEN r.status IN ('succeeded', 'failed', 'cancelled')
                                OR st.status IN ('succeeded', 'failed', 'skipped', 'cancelled')
                              THEN CAST(1 AS BIGINT) ELSE CAST(0 AS BIGINT) END
                         FROM holds h JOIN runs r ON r.tenant = h.tenant
                           AND r.workspace = h.workspace AND r.id = h.run_id
                         LEFT JOIN steps st ON st.tenant = h.tenant
                           AND st.workspace = h.workspace AND st.run_id = h.run_id
                           AND st.step_id = h.step_id
                         WHERE h.tenant = $1 AND h.workspace = $2 AND h.status = $3
                           AND h.kind <> $6
                           AND (h.due_at <= $4 OR r.status IN ('succeeded', 'failed', 'cancelled')
                                OR st.status IN ('succeeded', 'failed', 'skipped', 'cancelled'))
                         ORDER BY h.due_at LIMIT $5",
                    args![
                        &s.tenant,
                        &s.workspace,
                        HoldStatus::Pending.as_str(),
                        now,
                        limit,
                        HoldKind::Child.as_str()
                    ],
                )
                .await?
        };
        let mut swept = SweptHolds::default();
        for (run_id, subject, kind, deadline, ended) in due {
            let kind: HoldKind = kind.parse()?;
            let due = if ended == 1 {
                Due::Cancelled
            } else if deadline.is_some_and(|d| d <= now.0) {
                Due::TimedOut
            } else {
                Due::Remind
            };
            // The kind's rule, in its own transaction with the run locked first: `true`
            // when it changed the hold, `false` when someone else won (a decision, an
            // event, a callback, another daemon's sweep).
            let changed = match kind {
                HoldKind::Approval => {
                    self.approval_due(&run_id, &subject, due, now, next_remind)
                        .await?
                }
                HoldKind::Event | HoldKind::Callback => {
                    self.wait_due(&run_id, &subject, due, now).await?
                }
                // Not read above: a child run's end is its parent's decision.
                HoldKind::Child => false,
            };
            if !changed {
                continue;
            }
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
        Ok(swept)
    }
}
