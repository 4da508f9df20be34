//! Many kept pure results in one statement, all or nothing, and the run's finish with
//! them: the first attempts the engine kept in memory (`PureLog`), written before any
//! other write of the run (see ARCHITECTURE.md, "Lazy pure results").

use crate::clock::Timestamp;
use crate::conn::{Arg, Conn, args, rows_arg};
use crate::error::Error;
use crate::fence::{Fence, live_run_fence, run_fence};
use crate::finish::{FinishedRow, FinishedRun, finished_cols};
use crate::ledger::{Ledger, check_run_lease};
use crate::model::{RunFinish, RunLease};
use crate::pure::{PureBatchRecorded, PureResult};
use crate::rows::IntRow;
use crate::run_states::finish_run_in;
use crate::state::StepStatus;

use super::fresh::{Fresh, write_fresh};

/// The reason a batch op rolls itself back with when a node is not new: an error is what
/// undoes the writes before it, and this one is turned into `NotNew` (no other
/// `Conflict` can come out of that op).
const NOT_NEW: &str = "not new: record it the general way";

/// Many succeeded first attempts at once (`$7`: an array of `Fresh::batch_item` in
/// SQLite's JSONB, `conn::rows_arg`; `$8`: its length): the same rows and events as
/// `SQLITE_FRESH` for each, in one command. Each insert after the first happens only if
/// the one before wrote all `$8` rows; the caller rolls back unless the last returns
/// `2 × $8` rows (all or nothing).
///
/// `jsonb_each`, not `json_each`: `json_each` hands each element back as JSON *text*, so
/// every `j.value ->> 'field'` parsed the whole element again (request, output and event
/// payloads included) — fifteen parses per element per statement, 30% of a 102-node
/// `flow run` (callgrind, benches/README.md "W2"). `jsonb_each` hands back the element's
/// binary form, which `->>` reads without parsing; the values it extracts are the same.
/// The argument itself is JSONB too, so no statement parses the batch as text.
const SQLITE_BATCH: &str = concat!(
    "
INSERT INTO steps (tenant, workspace, run_id, step_id, node_id, retry, status, created_at,
    updated_at, started_at, finished_at, output, error_kind, error_message, tool_call_id)
SELECT $1, $2, $3, j.value ->> 'step', j.value ->> 'node', 0, 'succeeded', j.value ->> 't0',
    j.value ->> 't1', j.value ->> 't0', j.value ->> 't1', j.value ->> 'out', NULL, NULL,
    j.value ->> 'call'
FROM jsonb_each($7) AS j
WHERE EXISTS (SELECT 1 FROM runs WHERE",
    live_run_fence!(),
    ")
    AND NOT EXISTS (SELECT 1 FROM tool_calls t WHERE t.tenant = $1 AND t.workspace = $2
        AND t.run_id = $3 AND t.tool_call_id = j.value ->> 'call')
    AND NOT EXISTS (SELECT 1 FROM tool_calls t WHERE t.tenant = $1 AND t.workspace = $2
        AND t.idempotency_key = j.value ->> 'key')
ON CONFLICT DO NOTHING;
INSERT INTO tool_calls (tenant, workspace, run_id, tool_call_id, step_id, tool,
    idempotency_key, request, request_hash, status, attempt_count, outbound_requests, output,
    error_kind, error_message, lease_token, run_token, created_at, updated_at, finished_at)
SELECT $1, $2, $3, j.value ->> 'call', j.value ->> 'step', j.value ->> 'tool',
    j.value ->> 'key', j.value ->> 'req', j.value ->> 'hash', 'succeeded', 1, 0,
    j.value ->> 'out', NULL, NULL, 1, $5, j.value ->> 't0', j.value ->> 't1', j.value ->> 't1'
FROM jsonb_each($7) AS j WHERE changes() = $8;
INSERT INTO tool_call_attempts (tenant, workspace, id, run_id, tool_call_id, step_id, attempt,
    sent_key, outbound_started_at, finished_at, outcome, error_kind, error_message,
    requests_sent)
SELECT $1, $2, j.value ->> 'att', $3, j.value ->> 'call', j.value ->> 'step', 1,
    j.value ->> 'sk', NULL, j.value ->> 't1', 'succeeded', NULL, NULL, 0
FROM jsonb_each($7) AS j WHERE changes() = $8;
INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id, tool_call_id, payload)
SELECT $1, $2,
    CASE w.i WHEN 0 THEN j.value ->> 'e0' ELSE j.value ->> 'e1' END,
    CASE w.i WHEN 0 THEN 'step.started' ELSE 'step.succeeded' END,
    CASE w.i WHEN 0 THEN j.value ->> 't0' ELSE j.value ->> 't1' END,
    $3, j.value ->> 'step',
    CASE w.i WHEN 0 THEN NULL ELSE j.value ->> 'call' END,
    CASE w.i WHEN 0 THEN j.value ->> 'p0' ELSE j.value ->> 'p1' END
FROM jsonb_each($7) AS j, (SELECT 0 AS i UNION ALL SELECT 1 AS i) AS w
WHERE changes() = $8
ORDER BY CAST(j.key AS INTEGER), w.i
RETURNING 1 AS n;
"
);

/// The CTEs `POSTGRES_BATCH` and `POSTGRES_BATCH_FINISH` share: the fence (`ok`), the
/// elements to write (`go`, empty unless all are new and the lease holds) and their
/// steps, calls and attempts. Each statement adds its own events and result.
macro_rules! postgres_batch_head {
    () => {
        concat!(
            "
WITH j AS (SELECT x.v, x.k FROM jsonb_array_elements($7::jsonb) WITH ORDINALITY AS x(v, k)),
ok AS (
    SELECT 1 AS one FROM runs
    WHERE",
            live_run_fence!(),
            "AND NOT EXISTS (SELECT 1 FROM tool_calls t WHERE t.tenant = $1 AND t.workspace = $2
              AND t.run_id = $3 AND t.tool_call_id = ANY (ARRAY(SELECT v ->> 'call' FROM j)))
      AND NOT EXISTS (SELECT 1 FROM tool_calls t WHERE t.tenant = $1 AND t.workspace = $2
              AND t.idempotency_key = ANY (ARRAY(SELECT v ->> 'key' FROM j)))
      AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.tenant = $1 AND s.workspace = $2
              AND s.run_id = $3 AND s.step_id = ANY (ARRAY(SELECT v ->> 'step' FROM j)))
    FOR SHARE),
go AS (SELECT j.v, j.k FROM j, ok),
s AS (
    INSERT INTO steps (tenant, workspace, run_id, step_id, node_id, retry, status, created_at,
        updated_at, started_at, finished_at, output, error_kind, error_message, tool_call_id)
    SELECT $1, $2, $3, v ->> 'step', v ->> 'node', 0, 'succeeded', (v ->> 't0')::bigint,
        (v ->> 't1')::bigint, (v ->> 't0')::bigint, (v ->> 't1')::bigint, v ->> 'out', NULL,
        NULL, v ->> 'call'
    FROM go),
c AS (
    INSERT INTO tool_calls (tenant, workspace, run_id, tool_call_id, step_id, tool,
        idempotency_key, request, request_hash, status, attempt_count, outbound_requests,
        output, error_kind, error_message, lease_token, run_token, created_at, updated_at,
        finished_at)
    SELECT $1, $2, $3, v ->> 'call', v ->> 'step', v ->> 'tool', v ->> 'key', v ->> 'req',
        v ->> 'hash', 'succeeded', 1, 0, v ->> 'out', NULL, NULL, 1, $5, (v ->> 't0')::bigint,
        (v ->> 't1')::bigint, (v ->> 't1')::bigint
    FROM go),
a AS (
    INSERT INTO tool_call_attempts (tenant, workspace, id, run_id, tool_call_id, step_id,
        attempt, sent_key, outbound_started_at, finished_at, outcome, error_kind,
        error_message, requests_sent)
    SELECT $1, $2, v ->> 'att', $3, v ->> 'call', v ->> 'step', 1, v ->> 'sk', NULL,
        (v ->> 't1')::bigint, 'succeeded', NULL, NULL, 0
    FROM go),
"
        )
    };
}

/// The same on PostgreSQL, all or nothing by itself: nothing is written unless all `$8`
/// are new. Returns how many were written. The "is anything here already?" checks are
/// one-time probes with `= ANY (array)` on the unique indexes, not anti-joins against
/// the element list: the planner, which guesses 100 elements for the list, otherwise
/// hashes every call of the tenant on each batch (a scan that grows with the table).
const POSTGRES_BATCH: &str = concat!(
    postgres_batch_head!(),
    "e AS (
    INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id, tool_call_id,
        payload, txid)
    SELECT $1, $2,
        CASE w.i WHEN 0 THEN go.v ->> 'e0' ELSE go.v ->> 'e1' END,
        CASE w.i WHEN 0 THEN 'step.started' ELSE 'step.succeeded' END,
        CASE w.i WHEN 0 THEN (go.v ->> 't0')::bigint ELSE (go.v ->> 't1')::bigint END,
        $3, go.v ->> 'step',
        CASE w.i WHEN 0 THEN NULL ELSE go.v ->> 'call' END,
        CASE w.i WHEN 0 THEN go.v ->> 'p0' ELSE go.v ->> 'p1' END,
        pg_current_xact_id()::text::bigint
    FROM go, (VALUES (0), (1)) AS w(i)
    ORDER BY go.k, w.i)
SELECT COUNT(*) AS n FROM go
"
);

/// `POSTGRES_BATCH` and the run's finish (as `FINISH_RUN`) in ONE statement, atomic
/// without `BEGIN`/`COMMIT`: a daemon finishing a run of pure nodes costs one round trip.
/// `$9..$15` are `FINISH_RUN`'s `$6..$12`. The finish happens only if the batch does
/// (`ok`); the step events and the run's event are one insert, so their `seq` order is
/// the order they happened in. Returns the finished run, or no row when nothing was
/// written (a node not new, or the lease gone: the caller finds out which the
/// transactional way).
const POSTGRES_BATCH_FINISH: &str = concat!(
    postgres_batch_head!(),
    "r AS (
    UPDATE runs SET status = $9, output = $10, error = $11, finished_at = $12,
        updated_at = $12, lease_expires_at = NULL
    WHERE",
    run_fence!(),
    "AND EXISTS (SELECT 1 FROM ok)
    RETURNING ",
    finished_cols!(),
    "),
e AS (
    INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id, tool_call_id,
        payload, txid)
    SELECT $1, $2, x.id, x.type, x.time, $3, x.step_id, x.tool_call_id, x.payload,
        pg_current_xact_id()::text::bigint
    FROM (
        SELECT CASE w.i WHEN 0 THEN go.v ->> 'e0' ELSE go.v ->> 'e1' END AS id,
            CASE w.i WHEN 0 THEN 'step.started' ELSE 'step.succeeded' END AS type,
            CASE w.i WHEN 0 THEN (go.v ->> 't0')::bigint ELSE (go.v ->> 't1')::bigint END
                AS time,
            go.v ->> 'step' AS step_id,
            CASE w.i WHEN 0 THEN NULL ELSE go.v ->> 'call' END AS tool_call_id,
            CASE w.i WHEN 0 THEN go.v ->> 'p0' ELSE go.v ->> 'p1' END AS payload,
            go.k AS k, w.i AS i
        FROM go, (VALUES (0), (1)) AS w(i)
        UNION ALL
        SELECT $13, $14, $12, NULL, NULL, $15, $8 + 1, 0 FROM r) AS x
    ORDER BY x.k, x.i)
SELECT ",
    finished_cols!(),
    " FROM r"
);

impl Ledger {
    /// Records pure results the engine kept in memory, in ONE transaction and all or
    /// nothing: each becomes a new succeeded step and call with its attempt row and its
    /// `step.started` / `step.succeeded` events, exactly as `record_pure_call` would
    /// write it. Fenced by the run lease, unexpired at `now` (`LeaseLost` otherwise). If
    /// any node already has a step or a call, or its key is used by another call,
    /// nothing is written and `NotNew` names it.
    pub async fn record_pure_calls(
        &self,
        run: &RunLease,
        results: &[PureResult],
        now: Timestamp,
    ) -> Result<PureBatchRecorded, Error> {
        if results.is_empty() {
            return Ok(PureBatchRecorded::All);
        }
        let fresh = self.fresh_results(results)?;
        if self.write_batch(run, &fresh, now).await? {
            return Ok(PureBatchRecorded::All);
        }
        // Not all new (or the lease is gone): one at a time, to name the node.
        let ledger = self.clone();
        let run = run.clone();
        let outcome = self
            .write(move |c| {
                Box::pin(async move {
                    for f in &fresh {
                        if !write_fresh(c, &ledger, &run, f, now).await? {
                            check_run_lease(c, ledger.scope(), &run, Some(now)).await?;
                            // Undo the earlier ones: the batch is all or nothing.
                            return Err(Error::Conflict {
                                other_run: run.run_id.clone(),
                                other_node: f.node_id.clone(),
                                reason: NOT_NEW.into(),
                            });
                        }
                    }
                    Ok(())
                })
            })
            .await;
        match outcome {
            Ok(()) => Ok(PureBatchRecorded::All),
            Err(Error::Conflict {
                other_node, reason, ..
            }) if reason == NOT_NEW => Ok(PureBatchRecorded::NotNew {
                node_id: other_node,
            }),
            Err(e) => Err(e),
        }
    }
}
/// The bound values of `SQLITE_BATCH` / `POSTGRES_BATCH`, and how many results.
fn batch_args(
    ledger: &Ledger,
    run: &RunLease,
    fresh: &[Fresh],
    now: Timestamp,
) -> Result<(Vec<Arg>, i64), Error> {
    let items: Vec<_> = fresh.iter().map(Fresh::batch_item).collect();
    let items = rows_arg(ledger.is_postgres(), &items, "a batch of pure results")?;
    let n = i64::try_from(fresh.len()).unwrap_or(i64::MAX);
    let s = ledger.scope();
    let a = [Fence::run(s, run), args![now, items, n]].concat();
    Ok((a, n))
}

/// The error a batch rolls itself back with when not every result was new (SQLite may
/// have written part of it): turned back into "not new" by [`is_not_new`].
fn not_new() -> Error {
    Error::Conflict {
        other_run: String::new(),
        other_node: String::new(),
        reason: NOT_NEW.into(),
    }
}

fn is_not_new(e: &Error) -> bool {
    matches!(e, Error::Conflict { reason, .. } if reason == NOT_NEW)
}

/// Writes a whole batch in one statement; `not_new()` unless every result was new and
/// the run lease held.
async fn batch_in(c: &mut Conn<'_>, a: Vec<Arg>, n: i64) -> Result<(), Error> {
    let sql = c.pick(SQLITE_BATCH, POSTGRES_BATCH);
    let rows = c.all::<IntRow>(sql, a).await?;
    let all = if c.is_postgres() {
        rows.first().is_some_and(|r| r.n == n)
    } else {
        i64::try_from(rows.len()).ok() == Some(2 * n)
    };
    if all { Ok(()) } else { Err(not_new()) }
}

impl Ledger {
    /// Writes all of `fresh` in one statement (see `SQLITE_BATCH`); `false` (nothing
    /// written) unless every one was new and the lease held.
    async fn write_batch(
        &self,
        run: &RunLease,
        fresh: &[Fresh],
        now: Timestamp,
    ) -> Result<bool, Error> {
        let (a, n) = batch_args(self, run, fresh, now)?;
        match self
            .write_statement(move |c| Box::pin(async move { batch_in(c, a, n).await }))
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if is_not_new(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The rows of `results`, their JSON printed once. Borrowed: the caller keeps the
    /// results for the one-at-a-time way, and a copy of each request and output tree
    /// cost more than these few strings (W1's profile).
    fn fresh_results(&self, results: &[PureResult]) -> Result<Vec<Fresh>, Error> {
        let mut fresh = Vec::with_capacity(results.len());
        for r in results {
            fresh.push(Fresh {
                output: Some(self.checked_json(&r.output)?),
                step_id: r.step_id.clone(),
                retry: 0,
                tool_call_id: r.tool_call_id.clone(),
                node_id: r.node_id.clone(),
                tool: r.tool.clone(),
                key: r.idempotency_key.clone(),
                request: r.request.to_string(),
                request_hash: r.request_hash.clone(),
                status: StepStatus::Succeeded,
                error: None,
                started_at: r.started_at,
                finished_at: r.finished_at,
            });
        }
        Ok(fresh)
    }

    /// Records kept pure results (as [`Ledger::record_pure_calls`]) and finishes the run
    /// (as [`Ledger::finish_run`]) in ONE transaction: a run whose last steps were pure
    /// costs one commit at its end, not two. `Ok(None)`: a result was not new and
    /// nothing was written — record them with `record_pure_calls`, then finish.
    pub async fn finish_run_with(
        &self,
        lease: &RunLease,
        results: &[PureResult],
        finish: RunFinish,
        now: Timestamp,
    ) -> Result<Option<FinishedRun>, Error> {
        if results.is_empty() {
            return self.finish_run(lease, finish, now).await.map(Some);
        }
        let fresh = self.fresh_results(results)?;
        if self.is_postgres() && lease.parent.is_none() {
            // One statement (see `POSTGRES_BATCH_FINISH`); nothing written means a node
            // was not new or the lease is gone: the transaction below tells which (its
            // arguments are built only then, off the common path).
            let (mut one, _) = batch_args(self, lease, &fresh, now)?;
            one.extend(self.finish_args(lease, &finish, now)?.into_iter().skip(5));
            let done = self
                .write_statement(move |c| {
                    Box::pin(async move {
                        c.all::<FinishedRow>(POSTGRES_BATCH_FINISH, one)
                            .await?
                            .into_iter()
                            .next()
                            .map(FinishedRow::into_finished)
                            .transpose()
                    })
                })
                .await?;
            if done.is_some() {
                return Ok(done);
            }
        }
        let (batch, n) = batch_args(self, lease, &fresh, now)?;
        let fin = self.finish_args(lease, &finish, now)?;
        let ledger = self.clone();
        let run = lease.clone();
        let done = self
            .write(move |c| {
                Box::pin(async move {
                    // A child's end wakes its paused parent in the same transaction (the
                    // parent's row locked before anything of the child: `wake_parent_in`).
                    if let Some(parent) = &run.parent {
                        crate::run_states::wake_parent_in(c, ledger.scope(), parent, now).await?;
                    }
                    if let Err(e) = batch_in(c, batch, n).await {
                        if is_not_new(&e) {
                            // A lost lease is reported as such, not as "not new".
                            check_run_lease(c, ledger.scope(), &run, Some(now)).await?;
                        }
                        return Err(e);
                    }
                    finish_run_in(c, fin).await
                })
            })
            .await;
        match done {
            Ok(run) => {
                crate::notify::settled_here();
                Ok(Some(run))
            }
            Err(e) if is_not_new(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
