//! Redrive: an operator sends a failed run round again. Its named nodes get a new step
//! (`<node>_retry<n+1>`, pending, due now) and the run goes back on the queue, in one
//! transaction with a `run.redriven` event that records who, when and why. A failed
//! call run again is a new effect attempt (a new key, `<base>:<n+1>`); a succeeded one
//! is replayed from the ledger, never re-sent; a node whose approval was decided asks
//! again (approved, denied or timed out: see [`ask_again`]). A run with a call in doubt is refused:
//! its doubt must be settled first (what is in doubt may have happened).

use serde_json::json;

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::events::{EventType, NewEvent, audited, emit};
use crate::ledger::Ledger;
use crate::model::{Actor, NewStep, Run};
use crate::resolve::first_in_doubt;
use crate::rows::{RunRow, StepRow, run_cols, step_cols};
use crate::runs::run_for_update;
use crate::state::{ApprovalStatus, CallStatus, RunStatus, RunTransition, StepStatus};
use crate::steps::create_step_in;

/// What a redrive runs again (the engine chooses from the run's workflow: `flow
/// redrive`'s rule).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Redrive {
    /// Nodes, in the order to run: each that has a step gets its next one
    /// (`<node>_retry<n+1>`), after its latest own step (items' steps aside).
    pub nodes: Vec<String>,
    /// The next attempts of `for_each` items (`node[<key>]_retry<n>`, pending), one per
    /// item whose latest attempt failed or was cancelled; each item's node is among
    /// `nodes`. The item keeps its key, so its succeeded siblings replay.
    pub items: Vec<NewStep>,
}

/// What a redrive did: the run, back on the queue, and the steps it created.
#[derive(Debug, Clone, PartialEq)]
pub struct Redriven {
    /// The run after the change (`queued`).
    pub run: Run,
    /// The nodes' new steps, `(node, step id)`, in the order asked.
    pub steps: Vec<(String, String)>,
    /// The `for_each` items' new steps (step ids), in the order asked.
    pub items: Vec<String>,
    /// The approvals that will be asked again (node ids, `node[<key>]` for an item):
    /// a decision taken for the failed attempt does not carry over to a redrive.
    pub approvals_asked_again: Vec<String>,
}

/// The latest step of each of `nodes` (by retry number), in that order; a node with no
/// step is left out (it has not started: it runs anyway once its parents settle).
async fn latest_steps(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run_id: &str,
    nodes: &[String],
) -> Result<Vec<StepRow>, Error> {
    let s = ledger.scope();
    let rows = c
        .all::<StepRow>(
            concat!(
                "SELECT ",
                step_cols!(),
                " FROM steps WHERE tenant = $1 AND workspace = $2 AND run_id = $3"
            ),
            args![&s.tenant, &s.workspace, run_id],
        )
        .await?;
    let mut out = Vec::new();
    for node in nodes {
        // An item's step (`node[<key>]…`) is not the node's own.
        let item = format!("{node}[");
        let latest = rows
            .iter()
            .filter(|r| &r.node_id == node && !r.step_id.starts_with(&item))
            .max_by_key(|r| r.retry)
            .cloned();
        out.extend(latest);
    }
    Ok(out)
}

impl Ledger {
    /// Redrives failed run `run_id`: each of `again.nodes` that has a step gets a new
    /// pending step due `now`, and so does each of `again.items`; the run is re-queued (its error and end time cleared) and
    /// `run.redriven` records `actor`. Refused: an unknown run (`NotFound`), a run that
    /// is not failed (`Terminal` for a succeeded or cancelled one, `InvalidTransition`
    /// otherwise), a call of the run in doubt (`InDoubt`), or no node with a step to
    /// run again (`InvalidTransition`). Nothing is written when refused.
    pub async fn redrive_run(
        &self,
        run_id: &str,
        again: Redrive,
        actor: Option<Actor>,
        now: Timestamp,
    ) -> Result<Redriven, Error> {
        let ledger = self.clone();
        let run_id = run_id.to_owned();
        self.write(move |c| {
            Box::pin(async move {
                let scope = ledger.scope();
                let row = run_for_update(c, scope, &run_id).await?;
                let to = RunTransition::Redrive.check(row.status()?, RunStatus::Queued)?;
                if let Some(since) = first_in_doubt(c, &ledger, &run_id).await? {
                    return Err(Error::InDoubt { since });
                }
                let Redrive { nodes, items } = again;
                let latest = latest_steps(c, &ledger, &run_id, &nodes).await?;
                if latest.is_empty() {
                    return Err(Error::InvalidTransition {
                        what: "run",
                        from: "failed with nothing to run again".into(),
                        to: to.as_str().into(),
                    });
                }
                let mut steps = Vec::with_capacity(latest.len());
                for prev in &latest {
                    let retry = u32::try_from(prev.retry + 1).unwrap_or(u32::MAX);
                    let step = NewStep {
                        step_id: format!("{}_retry{retry}", prev.node_id),
                        node_id: prev.node_id.clone(),
                        retry,
                        not_before: Some(now),
                        status: StepStatus::Pending,
                    };
                    create_step_in(c, &ledger, &run_id, &step, now).await?;
                    steps.push((step.node_id, step.step_id));
                }
                let mut items_again = Vec::with_capacity(items.len());
                for item in items {
                    if !nodes.contains(&item.node_id) {
                        return Err(Error::InvalidTransition {
                            what: "step",
                            from: format!("item {} of a node not run again", item.step_id),
                            to: StepStatus::Pending.as_str().into(),
                        });
                    }
                    create_step_in(c, &ledger, &run_id, &item, now).await?;
                    items_again.push(item.step_id);
                }
                let asked_again = ask_again(c, &ledger, &run_id, &latest, now).await?;
                let row = requeue_failed(c, &ledger, &row, to, now).await?;
                let payload = json!({
                    "nodes": steps.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                    "steps": steps.iter().map(|(_, s)| s).collect::<Vec<_>>(),
                    "items_run_again": items_again.len(),
                    "approvals_asked_again": &asked_again,
                });
                emit(
                    c,
                    scope,
                    now,
                    NewEvent::run(
                        EventType::RunRedriven,
                        &run_id,
                        audited(payload, actor.as_ref()),
                    ),
                )
                .await?;
                crate::notify::notify_queued(c, scope).await?;
                Ok(Redriven {
                    run: row.into_run()?,
                    steps,
                    items: items_again,
                    approvals_asked_again: asked_again,
                })
            })
        })
        .await
    }
}

/// The decided approvals of the redriven nodes (an item of a `for_each` node is
/// `node[<key>]`) whose call did not succeed, set `cancelled` so the gate asks again:
/// an approval or a denial was given for one attempt at one moment, and a redrive — an
/// operator sending the node round again, perhaps hours later — is a new decision to
/// take. A call that succeeded is replayed, not sent, and keeps its approval. Returns
/// the approvals' node ids (`run.redriven` lists them).
async fn ask_again(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run_id: &str,
    latest: &[StepRow],
    now: Timestamp,
) -> Result<Vec<String>, Error> {
    let s = ledger.scope();
    let mut asked = Vec::new();
    for step in latest {
        let rows = c
            .all::<(String,)>(
                "UPDATE approvals SET status = $5, decided_at = $6,
                    reason = 'the run was redriven: asked again'
                 WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                   AND (node_id = $4 OR substr(node_id, 1, length($4) + 1) = $4 || '[')
                   AND status IN ($7, $8, $9)
                   AND NOT EXISTS (
                     SELECT 1 FROM tool_calls t
                     WHERE t.tenant = approvals.tenant AND t.workspace = approvals.workspace
                       AND t.run_id = approvals.run_id AND t.tool_call_id = approvals.node_id
                       AND t.status = $10)
                 RETURNING node_id",
                args![
                    &s.tenant,
                    &s.workspace,
                    run_id,
                    &step.node_id,
                    ApprovalStatus::Cancelled.as_str(),
                    now,
                    ApprovalStatus::Approved.as_str(),
                    ApprovalStatus::Denied.as_str(),
                    ApprovalStatus::TimedOut.as_str(),
                    CallStatus::Succeeded.as_str()
                ],
            )
            .await?;
        asked.extend(rows.into_iter().map(|(n,)| n));
    }
    asked.sort();
    Ok(asked)
}

/// The failed run `row`, back on the queue as `to`, its error, output and end time
/// cleared and its lease token moved on.
async fn requeue_failed(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    row: &RunRow,
    to: RunStatus,
    now: Timestamp,
) -> Result<RunRow, Error> {
    let s = ledger.scope();
    c.optional::<RunRow>(
        concat!(
            "UPDATE runs SET status = $5, error = NULL, output = NULL, finished_at = NULL,
                pause_reason = NULL, worker = NULL, lease_expires_at = NULL,
                lease_token = lease_token + 1, cancel_requested = FALSE,
                not_before = $4, updated_at = $4
             WHERE tenant = $1 AND workspace = $2 AND id = $3 AND lease_token = $6
             RETURNING ",
            run_cols!()
        ),
        args![
            &s.tenant,
            &s.workspace,
            &row.id,
            now,
            to.as_str(),
            row.lease_token
        ],
    )
    .await?
    .ok_or(Error::LeaseLost)
}
