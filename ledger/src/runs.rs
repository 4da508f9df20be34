//! The run queue: claim, heartbeat, release, expiry of dead local workers (putting runs
//! on it is `enqueue.rs`; a claimed run's finish, pause, requeue and cancel are `run_states.rs`).
//!
//! A run's lease is `(worker, lease_token, lease_expires_at)` on its row. Every claim
//! increments `lease_token`, so a worker that lost its run (expired and re-claimed)
//! carries a stale token and all its fenced writes get `LeaseLost`.

use std::time::Duration;

use serde_json::json;

use crate::clock::Timestamp;
use crate::conn::{Conn, args, rows_arg};
use crate::error::Error;
use crate::events::{EventType, NewEvent, emit};
use crate::fence::{Fence, run_fence};
use crate::ledger::Ledger;
use crate::model::{ClaimRuns, Claimed, HeartbeatAck, RunLease, Scope};
use crate::rows::{RunRow, TextRow, run_cols, run_fields};
use crate::state::{RunStatus, RunTransition};
use crate::worker::WorkerId;

const SELECT_RUN_FOR_UPDATE: (&str, &str) = (
    concat!(
        "SELECT ",
        run_cols!(),
        " FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3"
    ),
    concat!(
        "SELECT ",
        run_cols!(),
        " FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3 FOR UPDATE"
    ),
);

/// The run's row, locked until the transaction ends; `NotFound` names the run.
pub(crate) async fn run_for_update(
    c: &mut Conn<'_>,
    scope: &crate::model::Scope,
    run_id: &str,
) -> Result<RunRow, Error> {
    let (sqlite, pg) = SELECT_RUN_FOR_UPDATE;
    let sql = c.pick(sqlite, pg);
    c.optional::<RunRow>(sql, args![&scope.tenant, &scope.workspace, run_id])
        .await?
        .ok_or_else(|| Error::NotFound {
            what: format!("run {run_id}"),
        })
}

/// The run `lease` holds, its row locked until the transaction ends; `LeaseLost` when
/// the lease no longer holds it. What a change that must not race the run's other
/// writers (a decision, a child's end) starts with.
pub(crate) async fn held_for_update(
    c: &mut Conn<'_>,
    scope: &Scope,
    lease: &RunLease,
) -> Result<RunRow, Error> {
    let row = run_for_update(c, scope, &lease.run_id).await?;
    if Fence::holds(&row, lease, None)? {
        Ok(row)
    } else {
        Err(Error::LeaseLost)
    }
}

/// Claims the queue: SQLite inside `BEGIN IMMEDIATE` (one writer at a time), PostgreSQL
/// with `FOR UPDATE SKIP LOCKED` so concurrent workers take different runs without
/// waiting on each other. Queued runs and expired leases are looked up apart, each by
/// its own index (`runs_next_runnable`, `runs_expired_leases`), then merged in queue
/// order: one `OR` of the two made every claim scan and sort the whole `runs` table,
/// finished runs included.
///
/// On PostgreSQL the claim also writes the `run.started` events (`$7`: a JSON array of
/// event ids, one per possible row), so it is ONE statement and holds its row locks for
/// no client round trip. That matters beyond the claim itself: a claim whose snapshot
/// predates another claim's commit still row-locks the runs that other claim took (a
/// `FOR UPDATE` re-check locks the newest row version before finding it no longer
/// queued), and the worker executing such a run waits for that lock to finish its run.
/// Measured with 4 daemons: these waits were a third of the time runs spent finishing.
///
/// `status = (SELECT 'queued')` hides the value from the planner on purpose. Statistics
/// are usually taken while the queue is empty (a drained queue, or a new database), so
/// with the literal the planner expects one queued run and reads and sorts EVERY queued
/// run on each claim (10,000 queued: 7.6 ms a claim, and the sort was the largest item
/// in PostgreSQL's CPU profile). Not knowing the value, it assumes a share of the table
/// and walks `runs_next_runnable` in queue order, stopping after `LIMIT` rows (0.36 ms).
/// Likewise the update finds its rows by the `ctid`s the lookups locked (a TID scan,
/// whatever the statistics say): with `id IN (SELECT ...)` a never-analyzed table got a
/// nested loop over every run of the tenant (52 ms a claim at 10,000 runs), and with
/// `id = ANY (...)` a scan of another index. The rows are locked by this statement, so
/// their `ctid` cannot change before the update; were one stale, the update would skip
/// that row (the re-check fails), never touch another.
const CLAIM_NEXT: (&str, &str) = (
    concat!(
        "UPDATE runs SET status = 'running', worker = $3, lease_token = lease_token + 1,
            lease_expires_at = $4, started_at = COALESCE(started_at, $5), updated_at = $5,
            pause_reason = NULL
         WHERE tenant = $1 AND workspace = $2 AND id IN (
            SELECT id FROM (
                SELECT * FROM (
                    SELECT id, priority, not_before, created_at FROM runs
                    WHERE tenant = $1 AND workspace = $2 AND status = 'queued'
                      AND not_before <= $5
                    ORDER BY priority DESC, not_before, created_at, id
                    LIMIT $6)
                UNION ALL
                SELECT * FROM (
                    SELECT id, priority, not_before, created_at FROM runs
                    WHERE tenant = $1 AND workspace = $2 AND status = 'running'
                      AND lease_expires_at <= $5
                    ORDER BY priority DESC, not_before, created_at, id
                    LIMIT $6))
            ORDER BY priority DESC, not_before, created_at, id
            LIMIT $6)
         RETURNING ",
        run_cols!()
    ),
    concat!(
        "WITH queued AS (
            SELECT ctid AS tid, id, priority, not_before, created_at FROM runs
            WHERE tenant = $1 AND workspace = $2 AND status = (SELECT 'queued')
              AND not_before <= $5
            ORDER BY priority DESC, not_before, created_at, id
            LIMIT $6
            FOR UPDATE SKIP LOCKED),
         expired AS (
            SELECT ctid AS tid, id, priority, not_before, created_at FROM runs
            WHERE tenant = $1 AND workspace = $2 AND status = 'running'
              AND lease_expires_at <= $5
            ORDER BY priority DESC, not_before, created_at, id
            LIMIT $6
            FOR UPDATE SKIP LOCKED),
         next AS (
            SELECT tid FROM (SELECT * FROM queued UNION ALL SELECT * FROM expired) AS due
            ORDER BY priority DESC, not_before, created_at, id
            LIMIT $6),
         u AS (
            UPDATE runs SET status = 'running', worker = $3, lease_token = lease_token + 1,
                lease_expires_at = $4, started_at = COALESCE(started_at, $5), updated_at = $5,
                pause_reason = NULL
            WHERE ctid = ANY (ARRAY(SELECT tid FROM next))
            RETURNING ",
        run_cols!(),
        "),
         o AS (
            SELECT id, worker, lease_token, workflow_name, row_number() OVER (
                ORDER BY priority DESC, not_before, created_at, id) AS n
            FROM u),
         e AS (
            INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id,
                tool_call_id, payload, txid)
            SELECT $1, $2, $7::jsonb ->> (o.n - 1)::int, 'run.started', $5, o.id, NULL, NULL,
                jsonb_build_object('worker', o.worker, 'lease_token', o.lease_token,
                    'workflow_name', o.workflow_name)::text,
                pg_current_xact_id()::text::bigint
            FROM o ORDER BY o.n)
         SELECT ",
        run_fields!(),
        " FROM u"
    ),
);

/// `run.started` events of many claimed runs in ONE statement on SQLite (`$4`: an
/// array of [`StartedEvent`] in queue order, in SQLite's JSONB, `conn::rows_arg`; the
/// outbox columns mirror `events::emit`). PostgreSQL writes them inside its claim
/// statement.
const SQLITE_EMIT_STARTED_ALL: &str =
    "INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id, tool_call_id,
        payload)
     SELECT $1, $2, j.value ->> 'id', 'run.started', $3, j.value ->> 'run', NULL, NULL,
        j.value ->> 'payload'
     FROM jsonb_each($4) AS j ORDER BY CAST(j.key AS INTEGER)";

/// One element of `SQLITE_EMIT_STARTED_ALL`'s array.
#[derive(serde::Serialize)]
struct StartedEvent<'a> {
    id: String,
    run: &'a str,
    payload: String,
}

/// Most runs one claim takes, whatever limit is asked for (a PostgreSQL claim binds one
/// event id per run it may take).
pub const MAX_CLAIM: u32 = 1_000;

/// Highest priority first, then oldest `not_before`, then oldest, then by id.
fn sort_in_queue_order(rows: &mut [RunRow]) {
    rows.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then(a.not_before.cmp(&b.not_before))
            .then(a.created_at.cmp(&b.created_at))
            .then(a.id.cmp(&b.id))
    });
}

fn lease_of(row: &RunRow, worker: &WorkerId) -> RunLease {
    RunLease {
        run_id: row.id.clone(),
        worker: worker.clone(),
        token: row.lease_token,
        expires_at: Timestamp(row.lease_expires_at.unwrap_or(0)),
        parent: row.parent_run_id.clone(),
    }
}

/// The `run.started` payload (the PostgreSQL claim builds the same object in SQL).
fn started_payload(row: &RunRow) -> serde_json::Value {
    json!({
        "worker": row.worker,
        "lease_token": row.lease_token,
        "workflow_name": row.workflow_name,
    })
}

/// `run.started` for each row a SQLite claim took, in one statement however many there
/// are (a PostgreSQL claim writes them itself).
async fn emit_started_all(
    conn: &mut Conn<'_>,
    ledger: &Ledger,
    rows: &[RunRow],
    now: Timestamp,
) -> Result<(), Error> {
    if let [row] = rows {
        return emit_started(conn, ledger, row, now).await;
    }
    if rows.is_empty() {
        return Ok(());
    }
    let events: Vec<StartedEvent<'_>> = rows
        .iter()
        .map(|row| StartedEvent {
            id: crate::events::new_event_id(),
            run: &row.id,
            payload: started_payload(row).to_string(),
        })
        .collect();
    let scope = ledger.scope();
    let events = rows_arg(conn.is_postgres(), &events, "run.started events")?;
    conn.execute(
        SQLITE_EMIT_STARTED_ALL,
        args![&scope.tenant, &scope.workspace, now, events],
    )
    .await?;
    Ok(())
}

async fn emit_started(
    conn: &mut Conn<'_>,
    ledger: &Ledger,
    row: &RunRow,
    now: Timestamp,
) -> Result<(), Error> {
    let payload = started_payload(row);
    emit(
        conn,
        ledger.scope(),
        now,
        NewEvent::run(EventType::RunStarted, &row.id, payload),
    )
    .await
}

impl Ledger {
    /// Claims up to `limit` runs (at most [`MAX_CLAIM`]): queued ones whose `not_before`
    /// has passed and running ones whose lease expired, highest priority first, then
    /// oldest `not_before`.
    /// Each claim increments the run's fencing token and emits `run.started` (on every
    /// claim, takeovers included, with the worker and token in the payload).
    pub async fn claim_next(
        &self,
        req: ClaimRuns<'_>,
        now: Timestamp,
    ) -> Result<Vec<RunLease>, Error> {
        let worker = req.worker.clone();
        let rows = self.claim_rows(req, now).await?;
        Ok(rows.iter().map(|r| lease_of(r, &worker)).collect())
    }

    /// [`Ledger::claim_next`], returning each claimed run with its lease: what a daemon
    /// needs to start executing it without reading it back.
    pub async fn claim_next_runs(
        &self,
        req: ClaimRuns<'_>,
        now: Timestamp,
    ) -> Result<Vec<Claimed>, Error> {
        let worker = req.worker.clone();
        let rows = self.claim_rows(req, now).await?;
        rows.into_iter()
            .map(|r| {
                let lease = lease_of(&r, &worker);
                Ok(Claimed {
                    lease,
                    run: r.into_run()?,
                })
            })
            .collect()
    }

    async fn claim_rows(&self, req: ClaimRuns<'_>, now: Timestamp) -> Result<Vec<RunRow>, Error> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let (limit, lease) = (req.limit.min(MAX_CLAIM), req.lease);
        let scope = self.scope();
        let mut a = args![
            &scope.tenant,
            &scope.workspace,
            req.worker.as_str(),
            now.plus(lease),
            now,
            i64::from(limit),
        ];
        let (sqlite, pg) = CLAIM_NEXT;
        if self.is_postgres() {
            let ids: Vec<String> = (0..limit).map(|_| crate::events::new_event_id()).collect();
            a.extend(args![serde_json::Value::from(ids).to_string()]);
            let mut rows = self
                .write_statement(move |c| Box::pin(async move { c.all::<RunRow>(pg, a).await }))
                .await?;
            // RETURNING order is unspecified: restore the queue order.
            sort_in_queue_order(&mut rows);
            return Ok(rows);
        }
        let ledger = self.clone();
        self.write(move |c| {
            Box::pin(async move {
                let mut rows = c.all::<RunRow>(sqlite, a).await?;
                // In queue order before the events are written in that order.
                sort_in_queue_order(&mut rows);
                emit_started_all(c, &ledger, &rows, now).await?;
                Ok(rows)
            })
        })
        .await
    }

    /// Claims one specific run (for `flow resume`): allowed when it is queued, paused,
    /// running with an expired lease, or running under a provably dead worker (taken over
    /// at once). A live lease held by anyone (this process included) is `Busy`; a
    /// finished run is `Terminal`.
    pub async fn claim_run(
        &self,
        run_id: &str,
        worker: &WorkerId,
        lease: Duration,
        now: Timestamp,
    ) -> Result<RunLease, Error> {
        let ledger = self.clone();
        let run_id = run_id.to_owned();
        let worker = worker.clone();
        self.write(move |c| {
            Box::pin(async move {
                let scope = ledger.scope();
                let (run_id, worker) = (run_id.as_str(), &worker);
                let row = run_for_update(c, scope, run_id).await?;
                let lease = claim_locked(c, &ledger, &row, worker, lease, now).await?;
                Ok(lease)
            })
        })
        .await
    }

    /// Extends the run lease. Fenced by token, not by expiry: a holder whose lease ran
    /// out but whose run nobody took over may go on. Also reports a pending cancel
    /// request, so the worker learns of it without another query.
    pub async fn heartbeat(
        &self,
        lease: &RunLease,
        duration: Duration,
        now: Timestamp,
    ) -> Result<HeartbeatAck, Error> {
        let expires_at = now.plus(duration);
        let ledger = self.clone();
        let lease = lease.clone();
        self.write_statement(move |c| {
            Box::pin(async move {
                let scope = ledger.scope();
                #[derive(sqlx::FromRow)]
                struct Ack {
                    cancel_requested: bool,
                }
                let ack = c
                    .optional::<Ack>(
                        concat!(
                            "UPDATE runs SET lease_expires_at = $6, updated_at = $7 WHERE",
                            run_fence!(),
                            "RETURNING cancel_requested"
                        ),
                        [Fence::run(scope, &lease), args![expires_at, now]].concat(),
                    )
                    .await?
                    .ok_or(Error::LeaseLost)?;
                Ok(HeartbeatAck {
                    expires_at,
                    cancel_requested: ack.cancel_requested,
                })
            })
        })
        .await
    }

    /// Gives a run back to the queue (daemon shutdown): status `queued`, lease cleared.
    /// The token stays, so the next claim's token is still strictly greater.
    pub async fn release_run(&self, lease: &RunLease, now: Timestamp) -> Result<(), Error> {
        self.requeue_held(lease, None, now).await
    }

    /// Puts a run whose next start is at `until` back on the queue until then (status
    /// `queued`, `not_before = until`, lease cleared): a worker does not wait with a run
    /// that has nothing in flight. Fenced like [`Ledger::release_run`].
    pub async fn park_run(
        &self,
        lease: &RunLease,
        until: Timestamp,
        now: Timestamp,
    ) -> Result<(), Error> {
        self.requeue_held(lease, Some(until), now).await
    }

    /// The holder's run back to the queue, due at `until` when given.
    async fn requeue_held(
        &self,
        lease: &RunLease,
        until: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<(), Error> {
        let ledger = self.clone();
        let lease = lease.clone();
        let to = RunTransition::Release.check(RunStatus::Running, RunStatus::Queued)?;
        self.write_statement(move |c| {
            Box::pin(async move {
                let scope = ledger.scope();
                let n = c
                    .execute(
                        concat!(
                            "UPDATE runs SET status = $7, worker = NULL, lease_expires_at = NULL,
                                updated_at = $6, not_before = COALESCE($8, not_before) WHERE",
                            run_fence!()
                        ),
                        [Fence::run(scope, &lease), args![now, to.as_str(), until]].concat(),
                    )
                    .await?;
                if n == 0 {
                    return Err(Error::LeaseLost);
                }
                Ok(())
            })
        })
        .await
    }

    /// Expires every run and call lease held by a worker on this host that is provably
    /// dead (see [`WorkerId::is_provably_dead`]), so takeovers happen at once instead of
    /// after the lease length. Returns how many leases were expired.
    pub async fn expire_dead_local_workers(&self, now: Timestamp) -> Result<u32, Error> {
        let ledger = self.clone();
        self.write(move |c| {
            Box::pin(async move {
                let scope = ledger.scope();
                let holders = c
                    .all::<TextRow>(
                        "SELECT DISTINCT worker AS t FROM runs
                         WHERE tenant = $1 AND workspace = $2 AND status = 'running'
                           AND lease_expires_at > $3 AND worker IS NOT NULL
                         UNION
                         SELECT DISTINCT lease_holder AS t FROM tool_calls
                         WHERE tenant = $1 AND workspace = $2 AND status IN ('claimed', 'outbound')
                           AND lease_expires_at > $3 AND lease_holder IS NOT NULL",
                        args![&scope.tenant, &scope.workspace, now],
                    )
                    .await?;
                let mut expired = 0u64;
                for h in holders {
                    if !WorkerId::from_string(h.t.clone()).is_provably_dead() {
                        continue;
                    }
                    tracing::info!(worker = %h.t, "expiring leases of a dead local worker");
                    expired += c
                        .execute(
                            "UPDATE runs SET lease_expires_at = $4, updated_at = $4
                             WHERE tenant = $1 AND workspace = $2 AND worker = $3
                               AND status = 'running' AND lease_expires_at > $4",
                            args![&scope.tenant, &scope.workspace, &h.t, now],
                        )
                        .await?;
                    expired += c
                        .execute(
                            "UPDATE tool_calls SET lease_expires_at = $4, updated_at = $4
                             WHERE tenant = $1 AND workspace = $2 AND lease_holder = $3
                               AND status IN ('claimed', 'outbound') AND lease_expires_at > $4",
                            args![&scope.tenant, &scope.workspace, &h.t, now],
                        )
                        .await?;
                }
                Ok(u32::try_from(expired).unwrap_or(u32::MAX))
            })
        })
        .await
    }
}

/// Claims the run whose row the caller locked (`run_for_update`) for `worker`: allowed
/// when it is queued, paused, or running with no live holder (see
/// [`Ledger::claim_run`]). Emits `run.started`.
pub(crate) async fn claim_locked(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    row: &RunRow,
    worker: &WorkerId,
    lease: Duration,
    now: Timestamp,
) -> Result<RunLease, Error> {
    let scope = ledger.scope();
    let run_id = row.id.as_str();
    let status = row.status()?;
    let to = RunTransition::Claim.check(status, RunStatus::Running)?;
    if status == RunStatus::Running {
        row.check_not_held(now)?;
    }
    let row = c
        .optional::<RunRow>(
            concat!(
                "UPDATE runs SET status = $8, worker = $4, lease_token = lease_token + 1,
                    lease_expires_at = $5, started_at = COALESCE(started_at, $6),
                    updated_at = $6, pause_reason = NULL
                 WHERE tenant = $1 AND workspace = $2 AND id = $3 AND lease_token = $7
                 RETURNING ",
                run_cols!()
            ),
            args![
                &scope.tenant,
                &scope.workspace,
                run_id,
                worker.as_str(),
                now.plus(lease),
                now,
                row.lease_token,
                to.as_str(),
            ],
        )
        .await?
        .ok_or(Error::LeaseLost)?;
    emit_started(c, ledger, &row, now).await?;
    Ok(lease_of(&row, worker))
}
