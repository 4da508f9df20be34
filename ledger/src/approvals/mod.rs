//! Approvals (`approval:` on a node, migration 0010): the request a node is about to
//! send, frozen with its digest until people approve it; their votes; and the one
//! compare-and-set through which approve, deny, the deadline and a cancel race.
//!
//! The gateway asks [`Ledger::approval_gate`] before it claims a call: the answer is
//! written in the ledger before the outbound mark, and a request whose digest is not the
//! approved one never leaves (the row goes back to `pending` under the new digest).

mod decide;
mod rows;
mod sweep;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::EventType;
use crate::events::{NodeRef, node_event};
use crate::fence::{Fence, live_run_fence};
use crate::ledger::Ledger;
use crate::model::{RunLease, Scope};
use crate::state::ApprovalStatus;
use rows::{ApprovalRow, approval_cols, read_row, submitter, with_votes};

/// What a node asks approval for (the gateway, under the run's lease).
#[derive(Debug, Clone)]
pub struct AskApproval {
    /// The node.
    pub node_id: String,
    /// The step asking.
    pub step_id: String,
    /// The node's tool.
    pub tool: String,
    /// The request as rendered, secrets as names (what approvers see).
    pub request: Value,
    /// Its canonical digest (the call's request hash): what an approval binds to.
    pub digest: String,
    /// The rendered `message`.
    pub message: Option<String>,
    /// What it takes (approvers, `min`, `forbid_self`, `inputs`, `on_timeout`), as the
    /// engine describes it; stored for deciders and views.
    pub rule: Value,
    /// Distinct approvers needed.
    pub min: u32,
    /// How long it may wait, from the request (a changed request waits anew).
    pub timeout_ms: i64,
    /// The first reminder, from the request, if any.
    pub first_remind_ms: Option<i64>,
}

/// What the gateway may do with a node's call.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// Approved for exactly this request: send it.
    Approved(Approval),
    /// Still waiting (just asked, more approvers needed, or the request changed).
    Pending(Approval),
    /// Denied: fail the node with the reason.
    Denied(Approval),
    /// Nobody decided in time: `on_timeout` applies.
    TimedOut(Approval),
}

/// One approver's vote.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ApprovalVote {
    /// Who (token name, or the CLI's `--by` / OS user).
    pub voter: String,
    /// Which way they voted: `approve` or `deny`.
    pub decision: Vote,
    /// The digest voted for.
    pub digest: String,
    /// When.
    pub at: Timestamp,
    /// Why, as they said.
    pub reason: Option<String>,
    /// The inputs they gave.
    pub inputs: Option<Value>,
}

crate::state::text_enum! {
    /// Which way one approver voted (`approval_votes.decision`).
    Vote {
        /// For the request whose digest the vote names.
        Approve => "approve",
        /// Against it: settles the approval denied.
        Deny => "deny",
    }
}

impl Vote {
    /// The vote of a decision that approves or not.
    pub fn of(approve: bool) -> Self {
        if approve { Self::Approve } else { Self::Deny }
    }
}

/// An approval as stored, with its votes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Approval {
    /// The run.
    pub run_id: String,
    /// The node.
    pub node_id: String,
    /// The step that asked last.
    pub step_id: String,
    /// The node's tool.
    pub tool: String,
    /// Where it stands.
    pub status: ApprovalStatus,
    /// The request awaiting (or given) approval, secrets as names.
    pub request: Value,
    /// Its digest.
    pub digest: String,
    /// The rendered message.
    pub message: Option<String>,
    /// What it takes (the engine's description).
    pub rule: Value,
    /// Distinct approvers needed.
    pub min_approvals: u32,
    /// Who submitted the run (`forbid_self`), when known.
    pub submitted_by: Option<String>,
    /// When the current request was asked.
    pub requested_at: Timestamp,
    /// When it times out.
    pub deadline: Timestamp,
    /// Reminders sent so far.
    pub reminders_sent: u32,
    /// When the next reminder is due, if any.
    pub next_remind_at: Option<Timestamp>,
    /// When it was decided.
    pub decided_at: Option<Timestamp>,
    /// Who decided (approvers joined by `, `).
    pub decided_by: Option<String>,
    /// The deciding reason.
    pub reason: Option<String>,
    /// The deciding approver's inputs.
    pub inputs: Option<Value>,
    /// Every vote, oldest first (older digests included: the audit trail).
    pub votes: Vec<ApprovalVote>,
}

impl Approval {
    /// Distinct approvers of the current request so far: votes for its digest cast
    /// since it was asked (a request asked again after an invalidation starts over).
    pub fn approvers(&self) -> Vec<&str> {
        self.votes
            .iter()
            .filter(|v| {
                v.digest == self.digest && v.decision == Vote::Approve && v.at >= self.requested_at
            })
            .map(|v| v.voter.as_str())
            .collect()
    }
}

/// A person's decision (CLI, API, console), already authorized by the engine.
#[derive(Debug, Clone)]
pub struct Decide {
    /// The run.
    pub run_id: String,
    /// The node.
    pub node_id: String,
    /// Who.
    pub by: String,
    /// Approve (a vote; approved once `min` distinct approvers voted) or deny.
    pub approve: bool,
    /// Why.
    pub reason: Option<String>,
    /// The approver's inputs (checked by the engine against the node's declaration).
    pub inputs: Option<Value>,
    /// The digest the decider saw; a different one awaiting now is [`Error::Stale`].
    pub digest: Option<String>,
}

/// What a decision came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// The last vote needed: approved (the run is back on the queue if it was paused).
    Approved(Approval),
    /// Denied (the run is back on the queue if it was paused).
    Denied(Approval),
    /// A vote counted; `needed` more distinct approvers are still needed.
    Voted {
        /// The approval after the vote.
        approval: Approval,
        /// Distinct approvers still needed.
        needed: u32,
    },
}

/// Which approvals [`Ledger::list_approvals`] returns (oldest request first).
#[derive(Debug, Clone, Default)]
pub struct ApprovalFilter {
    /// Only this run's.
    pub run_id: Option<String>,
    /// Only this status (`None`: every status), as of `as_of`.
    pub status: Option<ApprovalStatus>,
    /// At most this many (0 = 1000).
    pub limit: u32,
    /// The time the listing is for: an approval still stored `pending` whose deadline
    /// is at or before it is listed, and filtered, as `timed_out` — which it is: no
    /// decision is taken after the deadline ([`Ledger::decide_approval`]), and without
    /// a daemon no sweep records the timeout, so the stored status alone would show it
    /// waiting for a decision it can no longer get. `None`: the stored status.
    pub as_of: Option<Timestamp>,
}

/// The status an approval row has at `$6` (a `pending` one past its deadline has timed
/// out), for the listing's filter; `$6` NULL keeps the stored status.
macro_rules! status_as_of {
    () => {
        "(CASE WHEN status = 'pending' AND deadline <= $6 THEN 'timed_out' ELSE status END)"
    };
}

impl Ledger {
    /// Asks (or asks again) for approval of a node's call, under the run's live lease,
    /// in one transaction: no row → a `pending` one (`approval.requested`); `pending`
    /// past its deadline → `timed_out` (the same compare-and-set the sweep uses);
    /// `pending` or `approved` for another digest → `pending` under the new digest with
    /// a new deadline (`approval.invalidated`, then `approval.requested`); `cancelled`
    /// (the run was redriven, or finished while it waited and was redriven) → `pending`
    /// anew the same way; otherwise the row as it stands. Only [`Gate::Approved`] lets the call leave.
    pub async fn approval_gate(
        &self,
        lease: &RunLease,
        ask: AskApproval,
        now: Timestamp,
    ) -> Result<Gate, Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        let request = self.checked_json(&ask.request)?;
        let rule = ask.rule.to_string();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let held = c
                    .optional::<(i64,)>(
                        concat!("SELECT lease_token FROM runs WHERE", live_run_fence!()),
                        [Fence::run(s, &lease), args![now]].concat(),
                    )
                    .await?;
                if held.is_none() {
                    return Err(Error::LeaseLost);
                }
                let a = Asked {
                    run_id: lease.run_id.as_str(),
                    ask: &ask,
                    request: &request,
                    rule: &rule,
                    now,
                    deadline: Timestamp(now.0.saturating_add(ask.timeout_ms)),
                    remind: ask.first_remind_ms.map(|ms| now.0.saturating_add(ms)),
                };
                let run_id = a.run_id;
                match read_row(c, s, run_id, &ask.node_id).await? {
                    None => a.insert(c, s).await?,
                    Some(row) => {
                        let status: ApprovalStatus = row.status.parse()?;
                        let changed = row.digest != ask.digest;
                        let fresh = !changed && status == ApprovalStatus::Pending;
                        if fresh && now.0 >= row.deadline {
                            // This worker holds the run: it applies the time-out itself.
                            sweep::time_out(c, s, None, &row, now).await?;
                        }
                        let open =
                            matches!(status, ApprovalStatus::Pending | ApprovalStatus::Approved);
                        // `cancelled` here means the run runs again (a redrive): a
                        // cancelled ask is never an answer, so it is asked anew.
                        if (changed && open) || status == ApprovalStatus::Cancelled {
                            a.reask(c, s, &row, status).await?;
                        }
                    }
                }
                let row = read_row(c, s, run_id, &ask.node_id)
                    .await?
                    .ok_or(Error::LeaseLost)?;
                let approval = with_votes(c, s, row).await?;
                Ok(match approval.status {
                    ApprovalStatus::Approved => Gate::Approved(approval),
                    ApprovalStatus::Denied => Gate::Denied(approval),
                    ApprovalStatus::TimedOut => Gate::TimedOut(approval),
                    ApprovalStatus::Pending | ApprovalStatus::Cancelled => Gate::Pending(approval),
                })
            })
        })
        .await
    }

    /// One approval with its votes, if the node has asked.
    pub async fn get_approval(
        &self,
        run_id: &str,
        node_id: &str,
    ) -> Result<Option<Approval>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let mut conn = pc.conn();
        let c = &mut conn;
        match read_row(c, s, run_id, node_id).await? {
            Some(row) => with_votes(c, s, row).await.map(Some),
            None => Ok(None),
        }
    }

    /// Approvals under `filter`, oldest request first, each with its votes; with
    /// `filter.as_of`, a `pending` one past its deadline is listed as `timed_out`.
    pub async fn list_approvals(&self, filter: ApprovalFilter) -> Result<Vec<Approval>, Error> {
        let s = self.scope();
        let limit = crate::reads::page_limit(filter.limit, 1000);
        let mut pc = self.pool().acquire().await?;
        let mut conn = pc.conn();
        let c = &mut conn;
        let rows = c
            .all::<ApprovalRow>(
                concat!(
                    "SELECT ",
                    approval_cols!(),
                    " FROM approvals WHERE tenant = $1 AND workspace = $2
                       AND ($3 IS NULL OR run_id = $3) AND ($4 IS NULL OR ",
                    status_as_of!(),
                    " = $4)
                     ORDER BY requested_at, run_id, node_id LIMIT $5"
                ),
                args![
                    &s.tenant,
                    &s.workspace,
                    filter.run_id.clone(),
                    filter.status.map(|st| st.as_str()),
                    limit,
                    filter.as_of
                ],
            )
            .await?;
        // Every listed approval's votes in one read (not one per approval): the same
        // filter and page, as a subquery.
        let votes = c
            .all::<rows::VoteRow>(
                concat!(
                    "SELECT node_id, digest, voter, decision, at, reason, inputs, run_id
                     FROM approval_votes WHERE tenant = $1 AND workspace = $2
                       AND (run_id, node_id) IN (
                         SELECT run_id, node_id FROM approvals
                         WHERE tenant = $1 AND workspace = $2
                           AND ($3 IS NULL OR run_id = $3) AND ($4 IS NULL OR ",
                    status_as_of!(),
                    " = $4)
                         ORDER BY requested_at, run_id, node_id LIMIT $5)
                     ORDER BY at, voter"
                ),
                args![
                    &s.tenant,
                    &s.workspace,
                    filter.run_id,
                    filter.status.map(|st| st.as_str()),
                    limit,
                    filter.as_of
                ],
            )
            .await?;
        let mut by_node: std::collections::HashMap<(String, String), Vec<ApprovalVote>> =
            std::collections::HashMap::new();
        for v in votes {
            let key = (v.run_id.clone().unwrap_or_default(), v.node_id.clone());
            by_node.entry(key).or_default().push(v.into_vote()?);
        }
        rows.into_iter()
            .map(|row| {
                let key = (row.run_id.clone(), row.node_id.clone());
                let votes = by_node.remove(&key).unwrap_or_default();
                let mut a = row.into_approval(votes)?;
                if a.status == ApprovalStatus::Pending
                    && filter.as_of.is_some_and(|at| a.deadline <= at)
                {
                    a.status = ApprovalStatus::TimedOut;
                }
                Ok(a)
            })
            .collect()
    }

    /// How many approvals are pending at `now` (the `flow_approvals_pending` gauge,
    /// badges): one past its deadline has timed out, recorded by a sweep or not.
    pub async fn count_pending_approvals(&self, now: Timestamp) -> Result<u64, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let n = pc
            .conn()
            .optional::<(i64,)>(
                "SELECT COUNT(*) FROM approvals WHERE tenant = $1 AND workspace = $2
                   AND status = $3 AND deadline > $4",
                args![
                    &s.tenant,
                    &s.workspace,
                    ApprovalStatus::Pending.as_str(),
                    now
                ],
            )
            .await?
            .map_or(0, |(n,)| n);
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// One ask of the gate, with what it writes.
struct Asked<'a> {
    run_id: &'a str,
    ask: &'a AskApproval,
    request: &'a str,
    rule: &'a str,
    now: Timestamp,
    deadline: Timestamp,
    remind: Option<i64>,
}

impl Asked<'_> {
    fn ids(&self) -> NodeRef<'_> {
        NodeRef {
            run_id: self.run_id,
            step_id: &self.ask.step_id,
            node_id: &self.ask.node_id,
        }
    }

    /// `approval.requested` for this ask.
    async fn requested(&self, c: &mut Conn<'_>, s: &Scope) -> Result<(), Error> {
        let payload = json!({
            "tool": self.ask.tool, "digest": self.ask.digest, "message": self.ask.message,
            "min": self.ask.min, "deadline": self.deadline,
        });
        let t = EventType::ApprovalRequested;
        node_event(c, s, self.ids(), t, payload, self.now).await
    }

    /// The node's first ask: a `pending` row (with who submitted the run).
    async fn insert(&self, c: &mut Conn<'_>, s: &Scope) -> Result<(), Error> {
        let by = submitter(c, s, self.run_id).await?;
        let a = self.ask;
        c.execute(
            "INSERT INTO approvals (tenant, workspace, run_id, node_id, step_id, tool,
                status, request, digest, message, rule, min_approvals, submitted_by,
                requested_at, deadline, next_remind_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
            args![
                &s.tenant,
                &s.workspace,
                self.run_id,
                &a.node_id,
                &a.step_id,
                &a.tool,
                ApprovalStatus::Pending.as_str(),
                self.request,
                &a.digest,
                a.message.clone(),
                self.rule,
                a.min,
                by,
                self.now,
                self.deadline,
                self.remind
            ],
        )
        .await?;
        self.requested(c, s).await
    }

    /// Another request than the one pending or approved: `pending` again under the new
    /// digest, with a new deadline and no decision (`approval.invalidated`).
    async fn reask(
        &self,
        c: &mut Conn<'_>,
        s: &Scope,
        row: &ApprovalRow,
        status: ApprovalStatus,
    ) -> Result<(), Error> {
        let a = self.ask;
        c.execute(
            "UPDATE approvals SET status = $5, step_id = $6, request = $7,
                digest = $8, message = $9, rule = $10, min_approvals = $11,
                requested_at = $12, deadline = $13, next_remind_at = $14,
                reminders_sent = 0, decided_at = NULL, decided_by = NULL,
                reason = NULL, inputs = NULL
             WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND node_id = $4
               AND status = $15 AND digest = $16",
            args![
                &s.tenant,
                &s.workspace,
                self.run_id,
                &a.node_id,
                ApprovalStatus::Pending.as_str(),
                &a.step_id,
                self.request,
                &a.digest,
                a.message.clone(),
                self.rule,
                a.min,
                self.now,
                self.deadline,
                self.remind,
                status.as_str(),
                &row.digest
            ],
        )
        .await?;
        let payload = json!({
            "was": status.as_str(), "old_digest": row.digest, "digest": a.digest,
        });
        let t = EventType::ApprovalInvalidated;
        node_event(c, s, self.ids(), t, payload, self.now).await?;
        self.requested(c, s).await
    }
}
