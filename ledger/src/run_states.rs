//! A claimed run's state changes: finish, pause, requeue, cancel.
//!
//! Each is one fenced transaction (or one statement) that moves the run along an edge
//! of `RunStatus` and writes the event of that edge with it. The queue side — enqueue,
//! claim, heartbeat, release — is `runs.rs`.

use serde_json::json;

use crate::clock::Timestamp;
use crate::conn::{Arg, Conn, args};
use crate::error::Error;
use crate::events::{EventType, NewEvent, audited, emit};
use crate::fence::{Fence, run_fence};
use crate::finish::{FinishedRow, FinishedRun, finished_cols};
use crate::ledger::Ledger;
use crate::model::{Actor, Run, RunFinish, RunLease, Scope};
use crate::rows::{RunRow, run_cols};
use crate::runs::run_for_update;
use crate::state::{RunStatus, RunTransition};

/// The fenced finish of a run and its event in ONE statement (`$10..$12`: event id,
/// type, payload; the outbox columns mirror `events::emit`): a script on SQLite (the
/// insert happens only if the update did), data-modifying CTEs on PostgreSQL.
const FINISH_RUN: (&str, &str) = (
    concat!(
        "UPDATE runs SET status = $6, output = $7, error = $8, finished_at = $9,
            updated_at = $9, lease_expires_at = NULL
         WHERE",
        run_fence!(),
        "RETURNING ",
        finished_cols!(),
        ";
         INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id, tool_call_id,
            payload)
         SELECT $1, $2, $10, $11, $9, $3, NULL, NULL, $12 WHERE changes() = 1"
    ),
    concat!(
        "WITH r AS (
            UPDATE runs SET status = $6, output = $7, error = $8, finished_at = $9,
                updated_at = $9, lease_expires_at = NULL
            WHERE",
        run_fence!(),
        "RETURNING ",
        finished_cols!(),
        "),
         e AS (
            INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id,
                tool_call_id, payload, txid)
            SELECT $1, $2, $10, $11, $9, $3, NULL, NULL, $12,
                pg_current_xact_id()::text::bigint FROM r)
         SELECT ",
        finished_cols!(),
        " FROM r"
    ),
);

/// Runs `FINISH_RUN` with [`Ledger::finish_args`]: `LeaseLost` unless the run was
/// still held.
pub(crate) async fn finish_run_in(c: &mut Conn<'_>, args: Vec<Arg>) -> Result<FinishedRun, Error> {
    let sql = c.pick(FINISH_RUN.0, FINISH_RUN.1);
    let rows = c.all::<FinishedRow>(sql, args).await?;
    rows.into_iter()
        .next()
        .ok_or(Error::LeaseLost)?
        .into_finished()
}

impl Ledger {
    /// Finishes a run (fenced). An output over the limit turns a success into a failure
    /// naming the limit. Emits `run.succeeded`, `run.failed` or `run.cancelled`.
    pub async fn finish_run(
        &self,
        lease: &RunLease,
        finish: RunFinish,
        now: Timestamp,
    ) -> Result<FinishedRun, Error> {
        let a = self.finish_args(lease, &finish, now)?;
        let finished = if let Some(parent) = lease.parent.clone() {
            // A child's end wakes its paused parent in the same transaction.
            let ledger = self.clone();
            self.write(move |c| {
                Box::pin(async move {
                    // The parent's row first (see `wake_parent_in`).
                    wake_parent_in(c, ledger.scope(), &parent, now).await?;
                    finish_run_in(c, a).await
                })
            })
            .await
        } else {
            // One statement: the fenced update and its event (no round trips between).
            self.write_statement(move |c| Box::pin(async move { finish_run_in(c, a).await }))
                .await
        };
        if finished.is_ok() {
            crate::notify::settled_here();
        }
        finished
    }

    /// The bound values of `FINISH_RUN`, decided in Rust: the event, and a success whose
    /// output is over the limit turned into a failure naming it.
    pub(crate) fn finish_args(
        &self,
        lease: &RunLease,
        finish: &RunFinish,
        now: Timestamp,
    ) -> Result<Vec<Arg>, Error> {
        let (mut status, mut error) = (finish.status, finish.error.clone());
        // The fence (`status = 'running'` and the token) guarantees the from-state.
        RunTransition::Finish.check(RunStatus::Running, status)?;
        let event = match status {
            RunStatus::Succeeded => EventType::RunSucceeded,
            RunStatus::Cancelled => EventType::RunCancelled,
            _ => EventType::RunFailed,
        };
        let mut output = None;
        let mut event = event;
        if let Some(v) = &finish.output {
            match self.checked_json(v) {
                Ok(s) => output = Some(s),
                Err(e) => {
                    status = RunStatus::Failed;
                    event = EventType::RunFailed;
                    error = Some(format!("run {e}; nothing was stored"));
                }
            }
        }
        let s = self.scope();
        let payload = json!({ "status": status.as_str(), "error": error });
        let own = args![
            status.as_str(),
            output,
            error,
            now,
            crate::events::new_event_id(),
            event.as_str(),
            payload.to_string(),
        ];
        Ok([Fence::run(s, lease), own].concat())
    }

    /// Pauses a run (fenced): an in-doubt call waits for an operator. Clears the lease;
    /// `requeue_run` or `claim_run` resumes it. Emits `run.paused`.
    pub async fn pause_run(
        &self,
        lease: &RunLease,
        reason: &str,
        now: Timestamp,
    ) -> Result<(), Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        let reason = reason.to_owned();
        self.write(move |c| {
            Box::pin(async move { pause_in(c, ledger.scope(), &lease, &reason, now).await })
        })
        .await?;
        crate::notify::settled_here();
        Ok(())
    }

    /// Puts a paused run, or a running run whose worker is gone (lease expired or holder
    /// provably dead), back on the queue (`flow resume --detach`). The token is bumped
    /// so the old holder is fenced out. A queued run is returned as is; a live lease is
    /// `Busy`; a finished run is `Terminal`. Emits `run.queued`.
    pub async fn requeue_run(&self, run_id: &str, now: Timestamp) -> Result<Run, Error> {
        self.requeue_run_as(run_id, None, now).await
    }

    /// [`Ledger::requeue_run`] on behalf of `actor` (its `by` and `reason` go into the
    /// `run.queued` event: the audit trail of the operator API).
    pub async fn requeue_run_as(
        &self,
        run_id: &str,
        actor: Option<Actor>,
        now: Timestamp,
    ) -> Result<Run, Error> {
        let ledger = self.clone();
        let run_id = run_id.to_owned();
        self.write(move |c| {
            Box::pin(async move {
                let scope = ledger.scope();
                let run_id = run_id.as_str();
                let row = run_for_update(c, scope, run_id).await?;
                let from = row.status()?;
                if from == RunStatus::Queued {
                    return row.into_run();
                }
                let to = RunTransition::Requeue.check(from, RunStatus::Queued)?;
                if from == RunStatus::Running {
                    row.check_not_held(now)?;
                }
                let row = requeue_in(c, scope, &row, to, actor.as_ref(), now).await?;
                row.into_run()
            })
        })
        .await
    }

    /// Asks a run to stop. Queued and paused runs, and running runs whose holder is gone
    /// (lease expired or process provably dead), are cancelled at once (emits
    /// `run.cancelled`); a run held by a live worker gets `cancel_requested`, which the
    /// worker sees at its next heartbeat. Cancelling a cancelled run is a no-op; other finished runs
    /// are `Terminal`.
    #[cfg(any(test, feature = "testkit"))]
    pub async fn request_cancel(&self, run_id: &str, now: Timestamp) -> Result<Run, Error> {
        self.request_cancel_as(run_id, None, now).await
    }

    /// `Ledger::request_cancel` on behalf of `actor`: its `by` and `reason` go into
    /// the `run.cancelled` event, or, when a live worker still holds the run, into a
    /// `run.cancel_requested` event (the audit trail of the operator API).
    pub async fn request_cancel_as(
        &self,
        run_id: &str,
        actor: Option<Actor>,
        now: Timestamp,
    ) -> Result<Run, Error> {
        let ledger = self.clone();
        let run_id = run_id.to_owned();
        let cancelled = self.write(move |c| {
            Box::pin(async move {
                let scope = ledger.scope();
                // A child's parent is locked before the child (see `wake_parent_in`).
                let parent = c
                    .optional::<(Option<String>,)>(
                        "SELECT parent_run_id FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3",
                        args![&scope.tenant, &scope.workspace, run_id.as_str()],
                    )
                    .await?
                    .and_then(|(p,)| p);
                if let Some(parent) = parent {
                    let _ = run_for_update(c, scope, &parent).await;
                }
                let row = cancel_in(c, &ledger, &run_id, actor.as_ref(), now).await?;
                cancel_descendants(c, &ledger, &run_id, actor.as_ref(), now).await?;
                row.into_run()
            })
        })
        .await;
        if cancelled.is_ok() {
            crate::notify::settled_here();
        }
        cancelled
    }
}

/// Pauses the run held under `lease` (fenced) in the caller's transaction, saying why:
/// the lease is cleared; `requeue_run` or `claim_run` resumes it. Emits `run.paused`.
pub(crate) async fn pause_in(
    c: &mut Conn<'_>,
    scope: &crate::model::Scope,
    lease: &RunLease,
    reason: &str,
    now: Timestamp,
) -> Result<(), Error> {
    let to = RunTransition::Pause.check(RunStatus::Running, RunStatus::Paused)?;
    let n = c
        .execute(
            concat!(
                "UPDATE runs SET status = $8, pause_reason = $6,
                    lease_expires_at = NULL, updated_at = $7 WHERE",
                run_fence!()
            ),
            [Fence::run(scope, lease), args![reason, now, to.as_str()]].concat(),
        )
        .await?;
    if n == 0 {
        return Err(Error::LeaseLost);
    }
    emit(
        c,
        scope,
        now,
        NewEvent::run(
            EventType::RunPaused,
            &lease.run_id,
            json!({ "reason": reason }),
        ),
    )
    .await
}

/// Puts the locked run `row` back on the queue as `to` (queued) in the caller's
/// transaction: the holder is cleared and fenced out (token bumped), `run.queued` is
/// written (with `actor`, the audit trail) and the daemons are woken. Shared by
/// [`Ledger::requeue_run_as`] and the resolution that settles a paused run's last doubt.
pub(crate) async fn requeue_in(
    c: &mut Conn<'_>,
    scope: &crate::model::Scope,
    row: &RunRow,
    to: RunStatus,
    actor: Option<&Actor>,
    now: Timestamp,
) -> Result<RunRow, Error> {
    let run_id = row.id.as_str();
    let row = c
        .optional::<RunRow>(
            concat!(
                "UPDATE runs SET status = $6, worker = NULL, lease_expires_at = NULL,
                    lease_token = lease_token + 1, pause_reason = NULL, updated_at = $4,
                    not_before = CASE WHEN not_before > $4 THEN $4 ELSE not_before END
                 WHERE tenant = $1 AND workspace = $2 AND id = $3 AND lease_token = $5
                 RETURNING ",
                run_cols!()
            ),
            args![
                &scope.tenant,
                &scope.workspace,
                run_id,
                now,
                row.lease_token,
                to.as_str()
            ],
        )
        .await?
        .ok_or(Error::LeaseLost)?;
    emit(
        c,
        scope,
        now,
        NewEvent::run(
            EventType::RunQueued,
            run_id,
            audited(json!({ "requeued": true }), actor),
        ),
    )
    .await?;
    crate::notify::notify_queued(c, scope).await?;
    Ok(row)
}

/// [`Ledger::request_cancel_as`] of one run in the caller's transaction: cancelled at
/// once when nobody holds it (its paused parent, if it is a child, is woken), else
/// `cancel_requested`.
async fn cancel_in(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run_id: &str,
    actor: Option<&Actor>,
    now: Timestamp,
) -> Result<RunRow, Error> {
    let scope = ledger.scope();
    let row = run_for_update(c, scope, run_id).await?;
    let status = row.status()?;
    if status == RunStatus::Cancelled {
        return Ok(row);
    }
    let to = RunTransition::Cancel.check(status, RunStatus::Cancelled)?;
    // A running run whose holder is gone (lease ended, or its process is
    // provably dead) has nobody to see the request: it is cancelled at once.
    let held = status == RunStatus::Running && row.check_not_held(now).is_err();
    let row = match status {
        RunStatus::Running if held => {
            let row = c
                .optional::<RunRow>(
                    concat!(
                        "UPDATE runs SET cancel_requested = TRUE, updated_at = $4
                         WHERE tenant = $1 AND workspace = $2 AND id = $3 RETURNING ",
                        run_cols!()
                    ),
                    args![&scope.tenant, &scope.workspace, run_id, now],
                )
                .await?
                .ok_or(Error::LeaseLost)?;
            if let Some(actor) = actor {
                let payload = audited(json!({}), Some(actor));
                let event = NewEvent::run(EventType::RunCancelRequested, run_id, payload);
                emit(c, scope, now, event).await?;
            }
            row
        }
        _ => {
            let row = c
                .optional::<RunRow>(
                    concat!(
                        "UPDATE runs SET cancel_requested = TRUE, status = $5,
                            error = 'cancelled', finished_at = $4, updated_at = $4,
                            lease_expires_at = NULL
                         WHERE tenant = $1 AND workspace = $2 AND id = $3 RETURNING ",
                        run_cols!()
                    ),
                    args![&scope.tenant, &scope.workspace, run_id, now, to.as_str()],
                )
                .await?
                .ok_or(Error::LeaseLost)?;
            emit(
                c,
                scope,
                now,
                NewEvent::run(
                    EventType::RunCancelled,
                    run_id,
                    audited(json!({ "from": status.as_str() }), actor),
                ),
            )
            .await?;
            // Nobody holds the run, so nobody will record what its calls
            // left outbound did: they are in doubt now, not silently lost.
            crate::calls::abandoned_to_in_doubt(c, ledger, run_id, now).await?;
            row
        }
    };
    if let Some(parent) = row.parent_run_id.as_deref()
        && row.status()? == RunStatus::Cancelled
    {
        wake_parent_in(c, scope, parent, now).await?;
    }
    Ok(row)
}

/// Cancels the unfinished children marked `cancel` of `run_id`, and theirs, in the
/// caller's transaction (each parent is locked before its children); how many.
pub(crate) async fn cancel_descendants(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run_id: &str,
    actor: Option<&Actor>,
    now: Timestamp,
) -> Result<u32, Error> {
    let scope = ledger.scope();
    let mut todo = children_to_cancel(c, scope, run_id).await?;
    let mut n = 0u32;
    while let Some(child) = todo.pop() {
        cancel_in(c, ledger, &child, actor, now).await?;
        n += 1;
        todo.extend(children_to_cancel(c, scope, &child).await?);
    }
    Ok(n)
}

/// Puts `parent_run_id` back on the queue if it is paused: a child of it ended. Locks
/// the parent's row, as the parent's own pause does (`holds/`); callers
/// call it before they touch the child's row, so that every transaction that locks
/// both takes the parent first (a parent's cancel does too): no deadlock on
/// PostgreSQL.
pub(crate) async fn wake_parent_in(
    c: &mut Conn<'_>,
    s: &Scope,
    parent_run_id: &str,
    now: Timestamp,
) -> Result<(), Error> {
    match run_for_update(c, s, parent_run_id).await {
        Ok(parent) => requeue_paused(c, s, &parent, None, now).await,
        // A parent deleted under its child has nobody left to wake.
        Err(Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The children of `run_id` that a cancel of it carries down to: not ended, marked
/// `cancel`.
pub(crate) async fn children_to_cancel(
    c: &mut Conn<'_>,
    s: &Scope,
    run_id: &str,
) -> Result<Vec<String>, Error> {
    let rows = c
        .all::<(String,)>(
            "SELECT id FROM runs WHERE tenant = $1 AND workspace = $2 AND parent_run_id = $3
               AND on_parent_cancel = $4 AND status IN ($5, $6, $7)
             ORDER BY id",
            args![
                &s.tenant,
                &s.workspace,
                run_id,
                crate::model::OnParentCancel::Cancel.as_str(),
                RunStatus::Queued.as_str(),
                RunStatus::Running.as_str(),
                RunStatus::Paused.as_str()
            ],
        )
        .await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// Puts the run back on the queue if it is paused: a decision, an event, a callback or a
/// child's end lets it go on.
pub(crate) async fn requeue_paused(
    c: &mut Conn<'_>,
    s: &Scope,
    run: &RunRow,
    actor: Option<&Actor>,
    now: Timestamp,
) -> Result<(), Error> {
    if run.status()? == RunStatus::Paused {
        let to = RunTransition::Requeue.check(RunStatus::Paused, RunStatus::Queued)?;
        requeue_in(c, s, run, to, actor, now).await?;
    }
    Ok(())
}
