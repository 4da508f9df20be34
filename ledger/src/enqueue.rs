//! Putting runs on the queue: one run or a batch of them, in statements per slice of
//! 1,000 runs and per distinct workflow text, not per run.
//!
//! A batch (the API's `runs:batch`, up to 1,000 runs) used to be written run by run:
//! insert, read back, event and wake-up for each, four round trips a run. On PostgreSQL
//! that was ~2,000 round trips for 500 runs inside one transaction, and a daemon saw none
//! of them until the last — submission and execution took turns (benches/README.md,
//! "W3"). Now a slice is: the distinct new workflow texts (in hash order, so two
//! concurrent batches lock them in one order), one insert of every run whose `RETURNING`
//! gives its row, one insert of the `run.queued` events, the `run_inputs` rows and one
//! wake-up. Only an id already there (a retried submit, a repeat in the batch) costs a
//! read of its own.
//!
//! A text is stored before the runs that use it (their `RETURNING` resolves it), so a
//! transaction that goes on after a `Conflict` (a schedule's tick) may keep a text no run
//! uses; retention's sweep of unreferenced texts removes it.
//!
//! One run (`flow run`, `flow submit`, a single API submit) is the same code with plain
//! one-row statements (`INSERT_ONE_RUN`, `events::emit`): on a fresh PostgreSQL
//! connection a statement is parsed and planned at its first use, and the JSON forms
//! cost ~1.3 ms more of that than the row they write. `flow run`, which claims the run
//! it creates in the same transaction, keeps the inserted row instead of reading it back
//! and wakes no daemon (none could take a run it holds).
//!
//! The run row holds an empty `workflow_text`; the text goes once into `workflow_texts`
//! under its SHA-256 (insert-if-absent, in this transaction), and every read resolves it
//! there (`rows::run_cols`).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use crate::canonical::{canonical_hash, workflow_hash};
use crate::clock::Timestamp;
use crate::conn::{Conn, args, rows_arg};
use crate::error::Error;
use crate::events::{EventType, NewEvent, audited, emit, new_event_id};
use crate::ledger::Ledger;
use crate::model::{Actor, Enqueued, NewRun, RunLease, Scope};
use crate::rows::{RunRow, run_cols};
use crate::runs::{claim_locked, run_for_update};
use crate::search::PendingInputs;
use crate::worker::WorkerId;

/// What the JSON arguments here hold, for an error that names them.
const RUNS: &str = "a batch of runs";

/// Runs one statement set writes: a caller's longer list (a test's 50,000) is written in
/// slices of this many, in order, in the same transaction.
const SLICE: usize = 1_000;

/// What the runs of one enqueue transaction share: the hashes of the workflow texts it
/// has already stored (a batch of 1,000 runs of one workflow writes its text once) and
/// the `run_inputs` rows it has yet to write (one statement for the batch), which
/// [`EnqueueTx::finish`] writes before the transaction commits.
#[derive(Debug, Default)]
pub(crate) struct EnqueueTx {
    texts: HashSet<String>,
    inputs: PendingInputs,
    /// The caller claims the runs it enqueues in this transaction: no wake-up.
    claims: bool,
}

impl EnqueueTx {
    /// Writes what the transaction's runs left pending; call it after the last
    /// `enqueue_in`/`enqueue_all_in`, inside the same transaction.
    pub(crate) async fn finish(&mut self, c: &mut Conn<'_>, scope: &Scope) -> Result<(), Error> {
        self.inputs.write(c, scope).await
    }
}

/// Inserts the runs of `$4` (an array of [`RunValues`]: SQLite's JSONB or JSON text,
/// `conn::rows_arg`) that are not there yet, in array order, and returns their rows
/// (their texts are stored first). `WHERE true`:
/// SQLite's upsert after a `SELECT` needs a `WHERE` to tell `ON CONFLICT` from a join's
/// `ON`. The rows come from `RETURNING`, not from a read by id afterwards: a read of 500
/// ids planned against stale statistics scanned every run of the tenant once per id
/// (1.1 s a batch at 10,000 runs, PostgreSQL's statement log).
/// A tombstone naming run id `$id` (migration 0020): a deleted run of that id sent
/// something, so a new run may not take the id (its keys, derived from the id, are
/// retired). The inserts skip such an id; [`enqueue_slice`] then says why.
macro_rules! retired_run {
    ($id:literal) => {
        concat!(
            "SELECT 1 FROM key_tombstones t WHERE t.tenant = $1 AND t.workspace = $2
               AND t.run_id = ",
            $id
        )
    };
}

const INSERT_RUNS: (&str, &str) = (
    concat!(
        "INSERT INTO runs (tenant, workspace, id, workflow_name, workflow_text, workflow_hash,
        inputs, inputs_hash, status, priority, not_before, created_at, updated_at,
        trace_segment)
     SELECT $1, $2, r.value ->> 'id', r.value ->> 'name', '', r.value ->> 'hash',
        r.value ->> 'inputs', r.value ->> 'ih', 'queued', r.value ->> 'prio',
        r.value ->> 'nb', $3, $3, r.value ->> 'trace'
     FROM jsonb_each($4) AS r WHERE NOT EXISTS (",
        retired_run!("r.value ->> 'id'"),
        ")
     ORDER BY CAST(r.key AS INTEGER)
     ON CONFLICT DO NOTHING
     RETURNING ",
        run_cols!()
    ),
    concat!(
        "INSERT INTO runs (tenant, workspace, id, workflow_name, workflow_text, workflow_hash,
        inputs, inputs_hash, status, priority, not_before, created_at, updated_at,
        trace_segment)
     SELECT $1, $2, r ->> 'id', r ->> 'name', '', r ->> 'hash', r ->> 'inputs', r ->> 'ih',
        'queued', (r ->> 'prio')::bigint, (r ->> 'nb')::bigint, $3, $3, r ->> 'trace'
     FROM jsonb_array_elements($4::jsonb) WITH ORDINALITY AS x(r, k)
     WHERE NOT EXISTS (",
        retired_run!("r ->> 'id'"),
        ")
     ORDER BY k
     ON CONFLICT DO NOTHING
     RETURNING ",
        run_cols!()
    ),
);

/// `INSERT_RUNS` for one run, the same columns as plain values (`$4..$11`: id, name,
/// workflow hash, inputs, inputs hash, priority, not before, trace segment).
const INSERT_ONE_RUN: &str = concat!(
    "INSERT INTO runs (tenant, workspace, id, workflow_name, workflow_text, workflow_hash,
        inputs, inputs_hash, status, priority, not_before, created_at, updated_at,
        trace_segment)
     SELECT $1, $2, $4, $5, '', $6, $7, $8, 'queued', $9, $10, $3, $3, $11
     WHERE NOT EXISTS (",
    retired_run!("$4"),
    ")
     ON CONFLICT DO NOTHING
     RETURNING ",
    run_cols!()
);

/// The `run.queued` events of `$4` (an array of [`QueuedEvent`], as `INSERT_RUNS`'s), in
/// array order: the same rows `events::emit` writes one at a time.
const INSERT_QUEUED: (&str, &str) = (
    "INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id, tool_call_id,
        payload)
     SELECT $1, $2, e.value ->> 'id', $5, $3, e.value ->> 'run', NULL, NULL,
        e.value ->> 'payload'
     FROM jsonb_each($4) AS e ORDER BY CAST(e.key AS INTEGER)",
    // The transaction id orders events for consumers (see migration 0002).
    "INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id, tool_call_id,
        payload, txid)
     SELECT $1, $2, e ->> 'id', $5, $3, e ->> 'run', NULL, NULL, e ->> 'payload',
        pg_current_xact_id()::text::bigint
     FROM jsonb_array_elements($4::jsonb) WITH ORDINALITY AS x(e, k) ORDER BY k",
);

/// One run as `INSERT_RUNS` reads it (strings, integers and `Option`s only: see
/// `conn::rows_arg`).
#[derive(Serialize)]
struct RunValues<'a> {
    id: &'a str,
    name: &'a str,
    hash: &'a str,
    inputs: String,
    ih: &'a str,
    prio: i32,
    nb: i64,
    trace: Option<&'a str>,
}

/// One `run.queued` event as `INSERT_QUEUED` reads it.
#[derive(Serialize)]
struct QueuedEvent<'a> {
    id: String,
    run: &'a str,
    payload: String,
}

/// A run's two hashes: what an idempotent re-submit compares.
struct Hashes {
    workflow: String,
    inputs: String,
}

/// One run onto the queue in the caller's transaction (see [`Ledger::enqueue`]): a
/// batch of one.
pub(crate) async fn enqueue_in(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run: &NewRun,
    actor: Option<&Actor>,
    now: Timestamp,
    tx: &mut EnqueueTx,
) -> Result<Enqueued, Error> {
    let (enq, _) = enqueue_one_in(c, ledger, run, actor, now, tx).await?;
    Ok(enq)
}

/// [`enqueue_in`], with the row it inserted when the run is new.
async fn enqueue_one_in(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    run: &NewRun,
    actor: Option<&Actor>,
    now: Timestamp,
    tx: &mut EnqueueTx,
) -> Result<Queued, Error> {
    let one = std::slice::from_ref(run);
    let mut queued = enqueue_slice(c, ledger, one, actor, now, tx).await?;
    queued.pop().ok_or_else(|| Error::NotFound {
        what: format!("run {}", run.id),
    })
}

/// Runs onto the queue in the caller's transaction, idempotent by id as
/// [`Ledger::enqueue`] (the same id, workflow and inputs: `created: false`; the same id
/// with another workflow or inputs: `Conflict`, and the caller rolls back). Results are
/// in `runs`' order. Call [`EnqueueTx::finish`] after the last.
pub(crate) async fn enqueue_all_in(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    runs: &[NewRun],
    actor: Option<&Actor>,
    now: Timestamp,
    tx: &mut EnqueueTx,
) -> Result<Vec<Enqueued>, Error> {
    let mut out = Vec::with_capacity(runs.len());
    for slice in runs.chunks(SLICE) {
        let queued = enqueue_slice(c, ledger, slice, actor, now, tx).await?;
        out.extend(queued.into_iter().map(|(enq, _)| enq));
    }
    Ok(out)
}

/// What a slice did for one run: the answer, and the row it inserted when the run is
/// new (a caller that claims it in the same transaction needs no read-back).
type Queued = (Enqueued, Option<RunRow>);

async fn enqueue_slice(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    runs: &[NewRun],
    actor: Option<&Actor>,
    now: Timestamp,
    tx: &mut EnqueueTx,
) -> Result<Vec<Queued>, Error> {
    let scope = ledger.scope();
    let hashes = hashes_of(runs);
    let mut texts: Vec<(&str, &str)> = Vec::new();
    for (run, h) in runs.iter().zip(&hashes) {
        if tx.texts.insert(h.workflow.clone()) {
            texts.push((&h.workflow, &run.workflow_text));
        }
    }
    texts.sort_unstable();
    for (hash, text) in texts {
        store_text(c, scope, hash, text, now).await?;
    }
    let mut inserted = insert_runs(c, scope, runs, &hashes, now).await?;
    let mut out = Vec::with_capacity(runs.len());
    let mut events = Vec::new();
    for (run, h) in runs.iter().zip(&hashes) {
        // The first of this id in the slice is the one inserted; a repeat, or an id
        // already there, is read and compared. Each is compared: which of two entries
        // of one id an insert took is the database's to choose.
        if let Some(row) = inserted.remove(&run.id) {
            same_run(&row, h)?;
            // Searchable by input value from the moment it commits (`search.rs`).
            tx.inputs.add(c, scope, &run.id, now, &run.inputs).await?;
            events.push((run, h));
            let enq = Enqueued {
                run: row.clone().into_run()?,
                created: true,
            };
            out.push((enq, Some(row)));
            continue;
        }
        let row = match run_for_update(c, scope, &run.id).await {
            Err(Error::NotFound { .. }) => {
                return Err(crate::retention::tombstones::retired_run(c, scope, &run.id).await);
            }
            other => other?,
        };
        same_run(&row, h)?;
        let enq = Enqueued {
            run: row.into_run()?,
            created: false,
        };
        out.push((enq, None));
    }
    let created = !events.is_empty();
    if let [(run, h)] = events[..] {
        let payload = audited(queued_payload(run, h), actor);
        emit(
            c,
            scope,
            now,
            NewEvent::run(EventType::RunQueued, &run.id, payload),
        )
        .await?;
    } else if !events.is_empty() {
        let events: Vec<QueuedEvent<'_>> = events
            .into_iter()
            .map(|(run, h)| QueuedEvent {
                id: new_event_id(),
                run: &run.id,
                payload: audited(queued_payload(run, h), actor).to_string(),
            })
            .collect();
        insert_queued(c, scope, now, &events).await?;
    }
    if created && !tx.claims {
        crate::notify::notify_queued(c, scope).await?;
    }
    Ok(out)
}

/// `Conflict` unless the stored run has the workflow and inputs asked for: an id is one
/// run, whoever submits it again.
fn same_run(row: &RunRow, h: &Hashes) -> Result<(), Error> {
    if row.workflow_hash == h.workflow && row.inputs_hash == h.inputs {
        return Ok(());
    }
    let what = if row.workflow_hash != h.workflow {
        "workflow"
    } else {
        "set of inputs"
    };
    Err(Error::Conflict {
        other_run: row.id.clone(),
        other_node: String::new(),
        reason: format!("run id already used with a different {what}"),
    })
}

/// Each run's hashes; a batch of one workflow hashes its text once.
fn hashes_of(runs: &[NewRun]) -> Vec<Hashes> {
    let mut last: Option<(&str, String)> = None;
    runs.iter()
        .map(|run| {
            let workflow = match &last {
                Some((text, hash)) if *text == run.workflow_text => hash.clone(),
                _ => {
                    let hash = workflow_hash(&run.workflow_text);
                    last = Some((&run.workflow_text, hash.clone()));
                    hash
                }
            };
            Hashes {
                workflow,
                inputs: canonical_hash(&run.inputs),
            }
        })
        .collect()
}

/// Inserts the runs not there yet; returns the rows it inserted, by id.
async fn insert_runs(
    c: &mut Conn<'_>,
    scope: &Scope,
    runs: &[NewRun],
    hashes: &[Hashes],
    now: Timestamp,
) -> Result<HashMap<String, RunRow>, Error> {
    let values: Vec<RunValues<'_>> = runs
        .iter()
        .zip(hashes)
        .map(|(run, h)| RunValues {
            id: &run.id,
            name: &run.workflow_name,
            hash: &h.workflow,
            inputs: run.inputs.to_string(),
            ih: &h.inputs,
            prio: run.priority,
            nb: run.not_before.unwrap_or(now).0,
            trace: run.trace_parent.as_deref(),
        })
        .collect();
    let rows = if let [v] = &values[..] {
        let a = args![&scope.tenant, &scope.workspace, now, v.id, v.name, v.hash];
        let b = args![&v.inputs, v.ih, v.prio, v.nb, v.trace];
        c.all::<RunRow>(INSERT_ONE_RUN, [a, b].concat()).await?
    } else {
        let (sqlite, pg) = INSERT_RUNS;
        let sql = c.pick(sqlite, pg);
        c.all::<RunRow>(
            sql,
            args![
                &scope.tenant,
                &scope.workspace,
                now,
                rows_arg(c.is_postgres(), &values, RUNS)?
            ],
        )
        .await?
    };
    Ok(rows.into_iter().map(|r| (r.id.clone(), r)).collect())
}

async fn store_text(
    c: &mut Conn<'_>,
    scope: &Scope,
    hash: &str,
    text: &str,
    now: Timestamp,
) -> Result<(), Error> {
    c.execute(
        "INSERT INTO workflow_texts (tenant, workspace, hash, text, created_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT DO NOTHING",
        args![&scope.tenant, &scope.workspace, hash, text, now],
    )
    .await?;
    Ok(())
}

/// A `run.queued` event's payload (before the actor's audit fields).
fn queued_payload(run: &NewRun, h: &Hashes) -> serde_json::Value {
    json!({
        "workflow_name": run.workflow_name,
        "workflow_hash": h.workflow,
        "priority": run.priority,
        "not_before": run.not_before,
    })
}

async fn insert_queued(
    c: &mut Conn<'_>,
    scope: &Scope,
    now: Timestamp,
    events: &[QueuedEvent<'_>],
) -> Result<(), Error> {
    let (sqlite, pg) = INSERT_QUEUED;
    let sql = c.pick(sqlite, pg);
    c.execute(
        sql,
        args![
            &scope.tenant,
            &scope.workspace,
            now,
            rows_arg(c.is_postgres(), &events, RUNS)?,
            EventType::RunQueued.as_str()
        ],
    )
    .await?;
    Ok(())
}

impl Ledger {
    /// Puts a run on the queue. Idempotent by id: the same workflow hash and inputs
    /// return the existing run (`created: false`); anything else is a `Conflict`.
    /// Emits `run.queued`.
    pub async fn enqueue(&self, run: NewRun, now: Timestamp) -> Result<Enqueued, Error> {
        self.enqueue_as(run, None, now).await
    }

    /// [`Ledger::enqueue`] on behalf of `actor` (recorded as `by`/`reason` in the
    /// `run.queued` event: the operator API's audit trail).
    pub async fn enqueue_as(
        &self,
        run: NewRun,
        actor: Option<Actor>,
        now: Timestamp,
    ) -> Result<Enqueued, Error> {
        let ledger = self.clone();
        self.write(move |c| {
            Box::pin(async move {
                let mut tx = EnqueueTx::default();
                let enq = enqueue_in(c, &ledger, &run, actor.as_ref(), now, &mut tx).await?;
                tx.finish(c, ledger.scope()).await?;
                Ok(enq)
            })
        })
        .await
    }

    /// [`Ledger::enqueue`], and when the run is new, [`Ledger::claim_run`] in the same
    /// transaction: `flow run` executes the run it creates, and one commit instead of
    /// two is a durable commit less per run (an fsync on SQLite, a flushed WAL record on
    /// PostgreSQL). A run that already existed is not claimed here (`None`): another
    /// worker may hold it, and the caller waits for its lease as before.
    pub async fn enqueue_and_claim(
        &self,
        run: NewRun,
        actor: Option<&Actor>,
        worker: &WorkerId,
        lease: Duration,
        now: Timestamp,
    ) -> Result<(Enqueued, Option<RunLease>), Error> {
        let ledger = self.clone();
        let worker = worker.clone();
        let actor = actor.cloned();
        self.write(move |c| {
            Box::pin(async move {
                let mut tx = EnqueueTx {
                    claims: true,
                    ..EnqueueTx::default()
                };
                let (enq, row) =
                    enqueue_one_in(c, &ledger, &run, actor.as_ref(), now, &mut tx).await?;
                tx.finish(c, ledger.scope()).await?;
                // A new run's row was inserted by this transaction (and so is locked by
                // it); a run that was there is not claimed here.
                let Some(row) = row else {
                    return Ok((enq, None));
                };
                let lease = claim_locked(c, &ledger, &row, &worker, lease, now).await?;
                Ok((enq, Some(lease)))
            })
        })
        .await
    }
}
