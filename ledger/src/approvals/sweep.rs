//! An approval's rule when its hold's timer fires: deadlines, reminders, and the
//! approvals of finished runs.

use serde_json::{Value, json};

use super::rows::{ApprovalRow, parse_json, read_row};
use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::EventType;
use crate::events::{NodeRef, node_event};
use crate::holds::{Due, Settle, settle};
use crate::ledger::Ledger;
use crate::model::Scope;
use crate::rows::RunRow;
use crate::runs::run_for_update;
use crate::state::ApprovalStatus;

impl Ledger {
    /// An approval's rule when its hold's timer fires (`Ledger::fire_due_timers`): a due
    /// approval times out (`approval.timed_out`, its paused run back on the queue), is
    /// cancelled (its run ended), or sends its next reminder (`approval.reminder`, the
    /// one after scheduled from `next_remind`). `false` when it was no longer pending.
    pub(crate) async fn approval_due(
        &self,
        run_id: &str,
        node_id: &str,
        due: Due,
        now: Timestamp,
        next_remind: fn(&Value, u32, Timestamp) -> Option<Timestamp>,
    ) -> Result<bool, Error> {
        let ledger = self.clone();
        let (run_id, node_id) = (run_id.to_owned(), node_id.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let run = run_for_update(c, s, &run_id).await?;
                let Some(row) = read_row(c, s, &run_id, &node_id).await? else {
                    return Ok(false);
                };
                if row.status != ApprovalStatus::Pending.as_str()
                    || (due == Due::TimedOut && row.deadline > now.0)
                {
                    return Ok(false);
                }
                let ids = NodeRef {
                    run_id: run_id.as_str(),
                    step_id: row.step_id.as_str(),
                    node_id: node_id.as_str(),
                };
                match due {
                    Due::Cancelled => {
                        let cancelled = Settle {
                            hold: row.hold(),
                            outcome: row.outcome(ApprovalStatus::Cancelled),
                            event: None,
                            wake: None,
                        };
                        settle(c, s, cancelled, now).await
                    }
                    Due::TimedOut => time_out(c, s, Some(&run), &row, now).await,
                    Due::Remind => {
                        let sent = u32::try_from(row.reminders_sent.max(0)).unwrap_or(0) + 1;
                        let rule = parse_json("approval rule", &row.rule)?;
                        let next = next_remind(&rule, sent, Timestamp(row.requested_at));
                        let n = c
                            .execute(
                                "UPDATE approvals SET reminders_sent = $5, next_remind_at = $6
                                 WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                                   AND node_id = $4 AND status = $7 AND reminders_sent = $8",
                                args![
                                    &s.tenant,
                                    &s.workspace,
                                    &run_id,
                                    &node_id,
                                    sent,
                                    next,
                                    ApprovalStatus::Pending.as_str(),
                                    row.reminders_sent
                                ],
                            )
                            .await?;
                        if n == 0 {
                            return Ok(false);
                        }
                        let payload = json!({
                            "reminder": sent, "deadline": row.deadline, "message": row.message,
                        });
                        node_event(c, s, ids, EventType::ApprovalReminder, payload, now).await?;
                        Ok(true)
                    }
                }
            })
        })
        .await
    }
}

/// Times a pending approval out at its deadline — the compare-and-set,
/// `approval.timed_out`, and `run` (when the caller does not hold it) back on the queue
/// if paused, whose next holder applies `on_timeout` — whether the watcher, a late
/// decision or the node's own look finds it first; `false` when it was no longer
/// pending.
pub(super) async fn time_out(
    c: &mut Conn<'_>,
    s: &Scope,
    run: Option<&RunRow>,
    row: &ApprovalRow,
    now: Timestamp,
) -> Result<bool, Error> {
    let timed_out = Settle {
        hold: row.hold(),
        outcome: row.outcome(ApprovalStatus::TimedOut),
        event: Some((
            EventType::ApprovalTimedOut,
            json!({ "deadline": row.deadline }),
        )),
        wake: run.map(|run| (run, None)),
    };
    settle(c, s, timed_out, now).await
}
