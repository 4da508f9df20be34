//! The approval tables' rows and the statements every approval operation shares: read
//! a row with its votes, who submitted the run, and the row as the hold a settle moves
//! (the compare-and-set itself is every kind's: `holds::settle`).

use serde_json::Value;

use super::{Approval, ApprovalVote};
use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::EventType;
use crate::holds::{HoldRef, Outcome};
use crate::model::Scope;
use crate::state::ApprovalStatus;

#[derive(Debug, sqlx::FromRow)]
pub(super) struct ApprovalRow {
    pub(super) run_id: String,
    pub(super) node_id: String,
    pub(super) step_id: String,
    pub(super) tool: String,
    pub(super) status: String,
    pub(super) request: String,
    pub(super) digest: String,
    pub(super) message: Option<String>,
    pub(super) rule: String,
    pub(super) min_approvals: i64,
    pub(super) submitted_by: Option<String>,
    pub(super) requested_at: i64,
    pub(super) deadline: i64,
    pub(super) reminders_sent: i64,
    pub(super) next_remind_at: Option<i64>,
    pub(super) decided_at: Option<i64>,
    pub(super) decided_by: Option<String>,
    pub(super) reason: Option<String>,
    pub(super) inputs: Option<String>,
}

macro_rules! approval_cols {
    () => {
        " run_id, node_id, step_id, tool, status, request, digest, message, rule,
          min_approvals, submitted_by, requested_at, deadline, reminders_sent, next_remind_at,
          decided_at, decided_by, reason, inputs "
    };
}
pub(super) use approval_cols;

#[derive(Debug, sqlx::FromRow)]
pub(super) struct VoteRow {
    /// Read only where votes of several runs are read at once.
    #[sqlx(default)]
    pub(super) run_id: Option<String>,
    pub(super) node_id: String,
    pub(super) digest: String,
    pub(super) voter: String,
    pub(super) decision: String,
    pub(super) at: i64,
    pub(super) reason: Option<String>,
    pub(super) inputs: Option<String>,
}

pub(super) fn parse_json(what: &str, s: &str) -> Result<Value, Error> {
    serde_json::from_str(s).map_err(|e| Error::Corrupt {
        what: format!("{what} is not JSON: {e}"),
    })
}

impl ApprovalRow {
    /// This approval as the hold a settle moves (`holds::settle`).
    pub(super) fn hold(&self) -> HoldRef<'_> {
        HoldRef {
            run_id: &self.run_id,
            step_id: &self.step_id,
            node_id: &self.node_id,
        }
    }

    /// This approval's request moved to `to` by nobody (its deadline, a cancel).
    pub(super) fn outcome(&self, to: ApprovalStatus) -> Outcome<'_> {
        Outcome::Approval {
            to,
            digest: &self.digest,
            by: None,
            reason: None,
            inputs: None,
        }
    }

    pub(super) fn into_approval(self, votes: Vec<ApprovalVote>) -> Result<Approval, Error> {
        Ok(Approval {
            status: self.status.parse()?,
            request: parse_json("approval request", &self.request)?,
            rule: parse_json("approval rule", &self.rule)?,
            inputs: self
                .inputs
                .as_deref()
                .map(|s| parse_json("approval inputs", s))
                .transpose()?,
            run_id: self.run_id,
            node_id: self.node_id,
            step_id: self.step_id,
            tool: self.tool,
            digest: self.digest,
            message: self.message,
            min_approvals: u32::try_from(self.min_approvals.max(0)).unwrap_or(u32::MAX),
            submitted_by: self.submitted_by,
            requested_at: Timestamp(self.requested_at),
            deadline: Timestamp(self.deadline),
            reminders_sent: u32::try_from(self.reminders_sent.max(0)).unwrap_or(u32::MAX),
            next_remind_at: self.next_remind_at.map(Timestamp),
            decided_at: self.decided_at.map(Timestamp),
            decided_by: self.decided_by,
            reason: self.reason,
            votes,
        })
    }
}

impl VoteRow {
    pub(super) fn into_vote(self) -> Result<ApprovalVote, Error> {
        Ok(ApprovalVote {
            inputs: self
                .inputs
                .as_deref()
                .map(|s| parse_json("vote inputs", s))
                .transpose()?,
            voter: self.voter,
            decision: self.decision.parse()?,
            digest: self.digest,
            at: Timestamp(self.at),
            reason: self.reason,
        })
    }
}

/// The approval row of (run, node) in the caller's transaction, without its votes.
pub(super) async fn read_row(
    c: &mut Conn<'_>,
    s: &Scope,
    run_id: &str,
    node_id: &str,
) -> Result<Option<ApprovalRow>, Error> {
    c.optional::<ApprovalRow>(
        concat!(
            "SELECT ",
            approval_cols!(),
            " FROM approvals WHERE tenant = $1 AND workspace = $2 AND run_id = $3 AND node_id = $4"
        ),
        args![&s.tenant, &s.workspace, run_id, node_id],
    )
    .await
}

/// The votes of a run's approvals (all nodes), oldest first.
pub(super) async fn read_votes(
    c: &mut Conn<'_>,
    s: &Scope,
    run_id: &str,
) -> Result<Vec<(String, ApprovalVote)>, Error> {
    let rows = c
        .all::<VoteRow>(
            "SELECT node_id, digest, voter, decision, at, reason, inputs FROM approval_votes
             WHERE tenant = $1 AND workspace = $2 AND run_id = $3 ORDER BY at, voter",
            args![&s.tenant, &s.workspace, run_id],
        )
        .await?;
    rows.into_iter()
        .map(|r| {
            let node = r.node_id.clone();
            r.into_vote().map(|v| (node, v))
        })
        .collect()
}

/// The row with its votes.
pub(super) async fn with_votes(
    c: &mut Conn<'_>,
    s: &Scope,
    row: ApprovalRow,
) -> Result<Approval, Error> {
    let node = row.node_id.clone();
    let votes = read_votes(c, s, &row.run_id)
        .await?
        .into_iter()
        .filter(|(n, _)| *n == node)
        .map(|(_, v)| v)
        .collect();
    row.into_approval(votes)
}

/// Who submitted the run, from its first `run.queued` event (the outbox is the audit
/// trail: the API records the submitting token's name there).
///
/// A child run has the starter of its root: a sub-workflow's approval under
/// `forbid_self` must refuse the token that started the parent (its own `run.queued`
/// names nobody). Runs started from the CLI name `USER@host`.
pub(super) async fn submitter(
    c: &mut Conn<'_>,
    s: &Scope,
    run_id: &str,
) -> Result<Option<String>, Error> {
    /// Deeper than any sub-workflow chain flow accepts (cycles are refused at load).
    const MAX_DEPTH: usize = 64;
    let mut root = run_id.to_owned();
    for _ in 0..MAX_DEPTH {
        let parent = c
            .optional::<(Option<String>,)>(
                "SELECT parent_run_id FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3",
                args![&s.tenant, &s.workspace, &root],
            )
            .await?
            .and_then(|(p,)| p);
        match parent {
            Some(p) => root = p,
            None => break,
        }
    }
    let run_id = root.as_str();
    let row = c
        .optional::<(String,)>(
            "SELECT payload FROM outbox WHERE tenant = $1 AND workspace = $2 AND run_id = $3
               AND type = $4 ORDER BY seq LIMIT 1",
            args![
                &s.tenant,
                &s.workspace,
                run_id,
                EventType::RunQueued.as_str()
            ],
        )
        .await?;
    Ok(row.and_then(|(p,)| {
        serde_json::from_str::<Value>(&p)
            .ok()
            .and_then(|v| v.get("by").and_then(Value::as_str).map(str::to_owned))
    }))
}
