//! A person's decision ([`Ledger::decide_approval`]). The pause that a decision made
//! while the run was held must stop is every hold's: `holds/`.

use serde_json::json;

use super::rows::{ApprovalRow, read_row, with_votes};
use super::{Decide, Decided};
use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::EventType;
use crate::events::{NodeRef, node_event};
use crate::holds::{Outcome, Settle, settle};
use crate::ledger::Ledger;
use crate::model::Scope;
use crate::runs::run_for_update;
use crate::state::ApprovalStatus;

impl Ledger {
    /// Records a person's decision, in one transaction with the run locked first: the
    /// run must not be finished (`Terminal`), the approval must be `pending`
    /// (`Decided` naming the winner) and before its deadline (`PastDeadline`), for the
    /// digest the decider saw (`Stale`). A deny settles it; an approve is a vote (one
    /// per voter and digest: a second vote of the same voter counts once), and the vote
    /// that reaches `min` distinct approvers settles it approved. A settled approval
    /// puts a paused run back on the queue. Emits `approval.voted` or `approval.decided`
    /// with who, why and the digest.
    ///
    /// The deadline is judged here, in the transaction, at the decider's `now` — not by
    /// the caller, nor left to the sweep: with no daemon running nothing else would time
    /// the approval out, and a check made before the transaction lets a decision that
    /// waited on the run's lock past the deadline through. A decision at or after the
    /// deadline of a still `pending` approval does what the sweep would have done (the
    /// compare-and-set to `timed_out`, `approval.timed_out`, the paused run back on the
    /// queue, whose next holder applies `on_timeout`), commits that, and is refused.
    pub async fn decide_approval(&self, d: Decide, now: Timestamp) -> Result<Decided, Error> {
        let ledger = self.clone();
        let inputs = d
            .inputs
            .as_ref()
            .map(|v| self.checked_json(v))
            .transpose()?;
        let judged = self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let run = run_for_update(c, s, &d.run_id).await?;
                let run_status = run.status()?;
                if run_status.is_terminal() {
                    return Err(Error::Terminal { status: run_status });
                }
                let row = read_row(c, s, &d.run_id, &d.node_id)
                    .await?
                    .ok_or_else(|| Error::NotFound {
                        what: format!("approval of run {} node {}", d.run_id, d.node_id),
                    })?;
                if let Some(deadline) = timed_out(c, s, &run, &row, now).await? {
                    return Ok(Judged::PastDeadline(deadline));
                }
                let status: ApprovalStatus = row.status.parse()?;
                if status.is_decided() {
                    return Err(Error::Decided {
                        status,
                        by: row.decided_by.clone(),
                    });
                }
                if let Some(seen) = &d.digest
                    && *seen != row.digest
                {
                    return Err(Error::Stale {
                        current: row.digest.clone(),
                    });
                }
                record_vote(c, s, &d, &row, inputs.clone(), now).await?;
                let ids = NodeRef {
                    run_id: d.run_id.as_str(),
                    step_id: row.step_id.as_str(),
                    node_id: d.node_id.as_str(),
                };
                let actor = crate::model::Actor {
                    by: d.by.clone(),
                    reason: d.reason.clone(),
                };
                if !d.approve {
                    let payload = json!({
                        "decision": super::Vote::Deny, "by": d.by, "reason": d.reason, "digest": row.digest,
                    });
                    let denied = Settle {
                        hold: row.hold(),
                        outcome: Outcome::Approval {
                            to: ApprovalStatus::Denied,
                            digest: &row.digest,
                            by: Some(d.by.as_str()),
                            reason: d.reason.as_deref(),
                            inputs,
                        },
                        event: Some((EventType::ApprovalDecided, payload)),
                        wake: Some((&run, Some(&actor))),
                    };
                    if !settle(c, s, denied, now).await? {
                        return Err(Error::LeaseLost);
                    }
                    let row = read_row(c, s, &d.run_id, &d.node_id)
                        .await?
                        .ok_or(Error::LeaseLost)?;
                    return with_votes(c, s, row)
                        .await
                        .map(|a| Judged::decided(Decided::Denied(a)));
                }
                let approvers = approvers_of(c, s, &row).await?;
                let have = u32::try_from(approvers.len()).unwrap_or(u32::MAX);
                let min = u32::try_from(row.min_approvals.max(1)).unwrap_or(1);
                if have < min {
                    let payload = json!({
                        "by": d.by, "reason": d.reason, "digest": row.digest,
                        "approvers": have, "min": min,
                    });
                    node_event(c, s, ids, EventType::ApprovalVoted, payload, now).await?;
                    let approval = with_votes(c, s, row).await?;
                    return Ok(Judged::decided(Decided::Voted {
                        approval,
                        needed: min - have,
                    }));
                }
                let names = approvers;
                let by = names.join(", ");
                let payload = json!({
                    "decision": super::Vote::Approve, "by": by, "reason": d.reason, "digest": row.digest,
                    "approvers": names, "inputs": d.inputs,
                });
                let approved = Settle {
                    hold: row.hold(),
                    outcome: Outcome::Approval {
                        to: ApprovalStatus::Approved,
                        digest: &row.digest,
                        by: Some(by.as_str()),
                        reason: d.reason.as_deref(),
                        inputs,
                    },
                    event: Some((EventType::ApprovalDecided, payload)),
                    wake: Some((&run, Some(&actor))),
                };
                if !settle(c, s, approved, now).await? {
                    return Err(Error::LeaseLost);
                }
                let row = read_row(c, s, &d.run_id, &d.node_id)
                    .await?
                    .ok_or(Error::LeaseLost)?;
                with_votes(c, s, row)
                    .await
                    .map(|a| Judged::decided(Decided::Approved(a)))
            })
        })
        .await?;
        judged.into_result()
    }
}

/// Records `d`'s vote on the approval's current digest (a voter's later vote on the
/// same digest replaces theirs).
async fn record_vote(
    c: &mut Conn<'_>,
    s: &Scope,
    d: &Decide,
    row: &ApprovalRow,
    inputs: Option<String>,
    now: Timestamp,
) -> Result<(), Error> {
    c.execute(
        "INSERT INTO approval_votes (tenant, workspace, run_id, node_id, digest, voter,
            decision, at, reason, inputs)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (tenant, workspace, run_id, node_id, digest, voter) DO UPDATE
           SET decision = excluded.decision, at = excluded.at,
               reason = excluded.reason, inputs = excluded.inputs",
        args![
            &s.tenant,
            &s.workspace,
            &d.run_id,
            &d.node_id,
            &row.digest,
            &d.by,
            super::Vote::of(d.approve).as_str(),
            now,
            d.reason.clone(),
            inputs
        ],
    )
    .await?;
    Ok(())
}

/// What the decision's transaction came to. A decision past the deadline is an `Ok`
/// here so that the timeout it recorded commits; the caller is refused after.
enum Judged {
    Decided(Box<Decided>),
    PastDeadline(Timestamp),
}

impl Judged {
    fn decided(d: Decided) -> Self {
        Judged::Decided(Box::new(d))
    }

    fn into_result(self) -> Result<Decided, Error> {
        match self {
            Judged::Decided(decided) => Ok(*decided),
            Judged::PastDeadline(deadline) => Err(Error::PastDeadline { deadline }),
        }
    }
}

/// Whether `row` has timed out at `now`, its deadline if so: it is `timed_out` already,
/// or `pending` at or past its deadline — then it times out here, by the sweep's own
/// rule (`sweep::time_out`).
async fn timed_out(
    c: &mut Conn<'_>,
    s: &Scope,
    run: &crate::rows::RunRow,
    row: &ApprovalRow,
    now: Timestamp,
) -> Result<Option<Timestamp>, Error> {
    let status: ApprovalStatus = row.status.parse()?;
    let deadline = Timestamp(row.deadline);
    if status == ApprovalStatus::TimedOut {
        return Ok(Some(deadline));
    }
    if status != ApprovalStatus::Pending || now < deadline {
        return Ok(None);
    }
    super::sweep::time_out(c, s, Some(run), row, now).await?;
    Ok(Some(deadline))
}

/// The distinct approvers of `row`'s current request: votes to approve its digest cast
/// since it was asked (a request asked again after an invalidation starts over).
async fn approvers_of(
    c: &mut crate::conn::Conn<'_>,
    s: &crate::model::Scope,
    row: &super::ApprovalRow,
) -> Result<Vec<String>, Error> {
    let rows = c
        .all::<(String,)>(
            "SELECT voter FROM approval_votes WHERE tenant = $1 AND workspace = $2
               AND run_id = $3 AND node_id = $4 AND digest = $5 AND decision = $6
               AND at >= $7
             ORDER BY at, voter",
            args![
                &s.tenant,
                &s.workspace,
                &row.run_id,
                &row.node_id,
                &row.digest,
                super::Vote::Approve.as_str(),
                row.requested_at
            ],
        )
        .await?;
    Ok(rows.into_iter().map(|(v,)| v).collect())
}
