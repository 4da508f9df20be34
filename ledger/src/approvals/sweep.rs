//! The daemons' sweep of approvals: deadlines, reminders, and the approvals of finished
//! runs.

use serde_json::{Value, json};

use super::Approval;
use super::rows::{parse_json, read_row, settle, with_votes};
use crate::clock::Timestamp;
use crate::conn::args;
use crate::error::Error;
use crate::events::EventType;
use crate::events::node_event;
use crate::ledger::Ledger;
use crate::run_states::requeue_paused;
use crate::runs::run_for_update;
use crate::state::ApprovalStatus;

/// What one sweep of [`Ledger::sweep_approvals`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Swept {
    /// Approvals that timed out now (their paused runs are back on the queue).
    pub timed_out: Vec<Approval>,
    /// Approvals of finished runs marked `cancelled`.
    pub cancelled: usize,
    /// Reminders emitted.
    pub reminded: usize,
}

impl Ledger {
    /// The daemons' sweep (any daemon, any number at once): pending approvals past
    /// their deadline become `timed_out` through the same compare-and-set a decision
    /// uses (`approval.timed_out`; a paused run goes back on the queue, whose next
    /// holder applies `on_timeout`); pending approvals of finished runs become
    /// `cancelled`; due reminders are emitted (`approval.reminder`), the next one
    /// scheduled from `next_remind` (the engine reads the rule's `remind` list). At
    /// most `limit` of each per sweep; each approval in its own transaction.
    pub async fn sweep_approvals(
        &self,
        now: Timestamp,
        limit: u32,
        next_remind: fn(&Value, u32, Timestamp) -> Option<Timestamp>,
    ) -> Result<Swept, Error> {
        let s = self.scope();
        let due = {
            let mut pc = self.pool().acquire().await?;
            pc.conn()
                .all::<(String, String, i64, i64)>(
                    "SELECT a.run_id, a.node_id, a.deadline,
                        CASE WHEN r.status IN ('succeeded', 'failed', 'cancelled')
                          THEN CAST(1 AS BIGINT) ELSE CAST(0 AS BIGINT) END
                     FROM approvals a JOIN runs r ON r.tenant = a.tenant
                       AND r.workspace = a.workspace AND r.id = a.run_id
                     WHERE a.tenant = $1 AND a.workspace = $2 AND a.status = $3
                       AND (a.deadline <= $4 OR a.next_remind_at <= $4
                            OR r.status IN ('succeeded', 'failed', 'cancelled'))
                     ORDER BY a.deadline LIMIT $5",
                    args![
                        &s.tenant,
                        &s.workspace,
                        ApprovalStatus::Pending.as_str(),
                        now,
                        limit
                    ],
                )
                .await?
        };
        let mut swept = Swept::default();
        for (run_id, node_id, deadline, finished) in due {
            let kind = if finished == 1 {
                ApprovalStatus::Cancelled
            } else if deadline <= now.0 {
                ApprovalStatus::TimedOut
            } else {
                ApprovalStatus::Pending
            };
            match self
                .sweep_one(&run_id, &node_id, kind, now, next_remind)
                .await?
            {
                Some(SweptOne::TimedOut(a)) => swept.timed_out.push(*a),
                Some(SweptOne::Cancelled) => swept.cancelled += 1,
                Some(SweptOne::Reminded) => swept.reminded += 1,
                None => {}
            }
        }
        Ok(swept)
    }

    async fn sweep_one(
        &self,
        run_id: &str,
        node_id: &str,
        kind: ApprovalStatus,
        now: Timestamp,
        next_remind: fn(&Value, u32, Timestamp) -> Option<Timestamp>,
    ) -> Result<Option<SweptOne>, Error> {
        let ledger = self.clone();
        let (run_id, node_id) = (run_id.to_owned(), node_id.to_owned());
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let run = run_for_update(c, s, &run_id).await?;
                let Some(row) = read_row(c, s, &run_id, &node_id).await? else {
                    return Ok(None);
                };
                if row.status != ApprovalStatus::Pending.as_str() {
                    return Ok(None);
                }
                let ids = (run_id.as_str(), row.step_id.as_str(), node_id.as_str());
                match kind {
                    ApprovalStatus::Cancelled => {
                        if !settle(c, s, &row, kind, (None, None, None), now).await? {
                            return Ok(None);
                        }
                        Ok(Some(SweptOne::Cancelled))
                    }
                    ApprovalStatus::TimedOut => {
                        if !settle(c, s, &row, kind, (None, None, None), now).await? {
                            return Ok(None);
                        }
                        let payload = json!({ "deadline": row.deadline });
                        node_event(c, s, ids, EventType::ApprovalTimedOut, payload, now).await?;
                        requeue_paused(c, s, &run, None, now).await?;
                        let row = read_row(c, s, &run_id, &node_id)
                            .await?
                            .ok_or(Error::LeaseLost)?;
                        let a = with_votes(c, s, row).await?;
                        Ok(Some(SweptOne::TimedOut(Box::new(a))))
                    }
                    _ => {
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
                            return Ok(None);
                        }
                        let payload = json!({
                            "reminder": sent, "deadline": row.deadline, "message": row.message,
                        });
                        node_event(c, s, ids, EventType::ApprovalReminder, payload, now).await?;
                        Ok(Some(SweptOne::Reminded))
                    }
                }
            })
        })
        .await
    }
}

/// What one approval's sweep did.
enum SweptOne {
    TimedOut(Box<Approval>),
    Cancelled,
    Reminded,
}
