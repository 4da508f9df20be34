//! Redrive: an operator sends a failed run round again. Its named nodes get a new step
//! (`<node>_retry<n+1>`, pending, due now) and the run goes back on the queue, in one
//! transaction with a `run.redriven` event that records who, when and why. A failed
//! call run again is a new effect attempt (a new key, `<base>:<n+1>`); a succeeded one
//! is replayed from the ledger, never re-sent. A run with a call in doubt is refused:
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
use crate::state::{RunStatus, RunTransition, StepStatus};
use crate::steps::create_step_in;

/// What a redrive did: the run, back on the queue, and the steps it created.
#[derive(Debug, Clone, PartialEq)]
pub struct Redriven {
    /// The run after the change (`queued`).
    pub run: Run,
    /// The new steps, `(node, step id)`, in the order asked.
    pub steps: Vec<(String, String)>,
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
        let latest = rows
            .iter()
            .filter(|r| &r.node_id == node)
            .max_by_key(|r| r.retry)
            .cloned();
        out.extend(latest);
    }
    Ok(out)
}

impl Ledger {
    /// Redrives failed run `run_id`: each of `nodes` that has a step gets a new pending
    /// step due `now`, the run is re-queued (its error and end time cleared) and
    /// `run.redriven` records `actor`. Refused: an unknown run (`NotFound`), a run that
    /// is not failed (`Terminal` for a succeeded or cancelled one, `InvalidTransition`
    /// otherwise), a call of the run in doubt (`InDoubt`), or no node with a step to
    /// run again (`InvalidTransition`). Nothing is written when refused.
    pub async fn redrive_run(
        &self,
        run_id: &str,
        nodes: Vec<String>,
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
                let row = requeue_failed(c, &ledger, &row, to, now).await?;
                let payload = json!({
                    "nodes": steps.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                    "steps": steps.iter().map(|(_, s)| s).collect::<Vec<_>>(),
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
                })
            })
        })
        .await
    }
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
