//! Retention (migration 0015): deleting what has outlived its use without giving up a
//! promise.
//!
//! - A finished run is deleted whole, in ONE transaction ([`Ledger::gc_run`]): its row,
//!   steps, calls, attempts, usage, probes, approvals, waits, callback tokens, fan-out
//!   lists and input index, plus a tombstone per call key (`tombstones.rs`). A crash
//!   leaves the whole run or none of it. The transaction locks the run row and checks
//!   again that it may go: finished before the horizon, no call open or in doubt, no
//!   unfinished child and no unfinished parent (that parent may still read it).
//! - The rest (`sweep.rs`) is deleted by age in batches: delivered outbox events,
//!   published events no pending wait still has to read, tombstones past `keys`,
//!   schedule history, closed rate-limit windows, and workflow texts no run references.
//!
//! The engine decides the horizons and the pace (`[retention]` in `flow.toml`); the
//! ledger decides what is safe.

mod delete;
mod sweep;
pub(crate) mod tombstones;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::Scope;
use crate::state::RunStatus;

pub use sweep::Sweep;
pub(crate) use tombstones::refuse_retired;
pub use tombstones::{Tombstone, key_hash};

/// One table a run's deletion reaches: its name, the delete and the dry run's count.
macro_rules! run_table {
    ($t:literal) => {
        (
            $t,
            concat!(
                "DELETE FROM ",
                $t,
                " WHERE tenant = $1 AND workspace = $2 AND run_id = $3"
            ),
            concat!(
                "SELECT COUNT(*) AS n FROM ",
                $t,
                " WHERE tenant = $1 AND workspace = $2 AND run_id = $3"
            ),
        )
    };
}

/// Every table that holds rows of one run, children before `runs` (foreign keys). The
/// outbox is not here: events have their own horizon (`events`), and a consumer may
/// not have them yet.
const RUN_TABLES: [(&str, &str, &str); 12] = [
    run_table!("steps"),
    run_table!("tool_call_attempts"),
    run_table!("usage"),
    run_table!("call_probes"),
    run_table!("call_reconcile"),
    run_table!("approval_votes"),
    run_table!("approvals"),
    run_table!("waits"),
    run_table!("callback_tokens"),
    run_table!("fanouts"),
    run_table!("run_inputs"),
    run_table!("tool_calls"),
];

/// Rows deleted (or, on a dry run, that would be), by table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Deleted {
    /// Table name → rows.
    pub rows: BTreeMap<String, u64>,
}

impl Deleted {
    /// Adds `n` rows of `table` (zero counts are not kept).
    pub fn add(&mut self, table: &str, n: u64) {
        if n > 0 {
            *self.rows.entry(table.to_owned()).or_default() += n;
        }
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Deleted) {
        for (t, n) in &other.rows {
            self.add(t, *n);
        }
    }

    /// All rows, every table.
    pub fn total(&self) -> u64 {
        self.rows.values().sum()
    }

    /// Rows of `table`.
    pub fn of(&self, table: &str) -> u64 {
        self.rows.get(table).copied().unwrap_or(0)
    }
}

/// Why a finished run older than the horizon was kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kept", rename_all = "snake_case")]
pub enum Kept {
    /// It is not finished (or was redriven since it was listed).
    NotFinished,
    /// It finished after the horizon.
    TooRecent,
    /// A call of it may have sent and has no known outcome: in doubt, or outbound.
    /// Deleting it would forget a request that may have left. (A `claimed` call in a
    /// finished run — its current attempt never marked outbound; any earlier attempt
    /// settled before it was claimed again — can no longer send: the run fence refuses
    /// its mark; it does not keep the run.)
    CallOpen {
        /// The call (node id).
        node: String,
        /// Its state.
        status: String,
    },
    /// A child run of it has not finished.
    ChildUnfinished {
        /// The child.
        child: String,
    },
    /// Its parent has not finished and may still read it.
    ParentUnfinished {
        /// The parent.
        parent: String,
    },
}

/// What [`Ledger::gc_run`] did with one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunGc {
    /// Deleted (or, on a dry run, would be).
    Deleted {
        /// Rows by table.
        rows: Deleted,
        /// Tombstones written (or, on a dry run, that would be).
        tombstones: u64,
    },
    /// Kept, and why.
    Kept(Kept),
    /// Not there (another process deleted it first).
    Gone,
}

/// A retention candidate: a finished run, in `finished_at` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// When it finished.
    pub finished_at: Timestamp,
    /// The run.
    pub id: String,
}

/// A run and what could keep it, read in one statement.
#[derive(sqlx::FromRow)]
struct RunFacts {
    status: String,
    finished_at: Option<i64>,
    parent_run_id: Option<String>,
    /// A call that may have sent with no known outcome (its node), and its state.
    open_node: Option<String>,
    open_status: Option<String>,
    /// An unfinished child.
    child: Option<String>,
    /// The parent's status.
    parent_status: Option<String>,
}

/// The run's row and its blockers (`$1` tenant, `$2` workspace, `$3` the run).
const RUN_FACTS: &str = "SELECT r.status, r.finished_at, r.parent_run_id,
                (SELECT c.tool_call_id FROM tool_calls c
                 WHERE c.tenant = r.tenant AND c.workspace = r.workspace AND c.run_id = r.id
                   AND c.status NOT IN ('succeeded', 'failed', 'claimed')
                 ORDER BY c.tool_call_id LIMIT 1) AS open_node,
                (SELECT c.status FROM tool_calls c
                 WHERE c.tenant = r.tenant AND c.workspace = r.workspace AND c.run_id = r.id
                   AND c.status NOT IN ('succeeded', 'failed', 'claimed')
                 ORDER BY c.tool_call_id LIMIT 1) AS open_status,
                (SELECT k.id FROM runs k
                 WHERE k.tenant = r.tenant AND k.workspace = r.workspace AND k.parent_run_id = r.id
                   AND k.status NOT IN ('succeeded', 'failed', 'cancelled')
                 LIMIT 1) AS child,
                (SELECT p.status FROM runs p
                 WHERE p.tenant = r.tenant AND p.workspace = r.workspace
                   AND p.id = r.parent_run_id) AS parent_status
     FROM runs r WHERE r.tenant = $1 AND r.workspace = $2 AND r.id = $3";

/// Whether the run may be deleted, read in one statement (three on PostgreSQL with
/// `lock`). With `lock` (a real deletion), on PostgreSQL its parent is locked `FOR
/// SHARE` and then its own row `FOR UPDATE` — parent before child, the order every
/// writer takes — so a redrive of the parent, or a second deleter, waits for this
/// transaction; a dry run locks nothing. `Ok(Err(kept))` when it stays.
async fn check_deletable(
    c: &mut Conn<'_>,
    s: &Scope,
    run_id: &str,
    before: Timestamp,
    lock: bool,
) -> Result<Option<Result<Timestamp, Kept>>, Error> {
    let lock = lock && c.is_postgres();
    if lock {
        c.all::<(String,)>(
            "SELECT p.status FROM runs p WHERE p.tenant = $1 AND p.workspace = $2
               AND p.id = (SELECT r.parent_run_id FROM runs r
                           WHERE r.tenant = $1 AND r.workspace = $2 AND r.id = $3)
             FOR SHARE",
            args![&s.tenant, &s.workspace, run_id],
        )
        .await?;
    }
    if lock {
        // Locked first, then read in a statement of its own: its snapshot is taken
        // after the lock is granted, so it sees what the holder we waited for wrote.
        c.all::<(String,)>(
            "SELECT status FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3
             FOR UPDATE",
            args![&s.tenant, &s.workspace, run_id],
        )
        .await?;
    }
    let Some(run) = c
        .optional::<RunFacts>(RUN_FACTS, args![&s.tenant, &s.workspace, run_id])
        .await?
    else {
        return Ok(None);
    };
    let status: RunStatus = run.status.parse()?;
    let Some(finished_at) = run.finished_at.filter(|_| status.is_terminal()) else {
        return Ok(Some(Err(Kept::NotFinished)));
    };
    if finished_at >= before.0 {
        return Ok(Some(Err(Kept::TooRecent)));
    }
    if let (Some(node), Some(status)) = (run.open_node, run.open_status) {
        return Ok(Some(Err(Kept::CallOpen { node, status })));
    }
    if let Some(child) = run.child {
        return Ok(Some(Err(Kept::ChildUnfinished { child })));
    }
    if let (Some(parent), Some(st)) = (run.parent_run_id, run.parent_status)
        && !st.parse::<RunStatus>()?.is_terminal()
    {
        return Ok(Some(Err(Kept::ParentUnfinished { parent })));
    }
    Ok(Some(Ok(Timestamp(finished_at))))
}

impl Ledger {
    /// Finished runs that finished before `before`, oldest first, after `after` (the
    /// last candidate of the previous page), at most `limit`. A candidate may still be
    /// kept: [`Ledger::gc_run`] decides.
    pub async fn gc_candidates(
        &self,
        before: Timestamp,
        after: Option<&Candidate>,
        limit: u32,
    ) -> Result<Vec<Candidate>, Error> {
        let s = self.scope();
        let (at, id) = after.map_or((i64::MIN, String::new()), |c| {
            (c.finished_at.0, c.id.clone())
        });
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<(i64, String)>(
                "SELECT finished_at, id FROM runs
                 WHERE tenant = $1 AND workspace = $2 AND finished_at IS NOT NULL
                   AND finished_at < $3
                   AND (finished_at > $4 OR (finished_at = $4 AND id > $5))
                 ORDER BY finished_at, id LIMIT $6",
                args![&s.tenant, &s.workspace, before, at, id, i64::from(limit)],
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|(at, id)| Candidate {
                finished_at: Timestamp(at),
                id,
            })
            .collect())
    }

    /// Deletes one run whole, in one transaction, if it may go (see the module docs):
    /// finished before `before`, nothing of it open, no unfinished child or parent. Its
    /// call keys become tombstones in the same transaction. With `dry_run` nothing is
    /// written: the answer counts what would be deleted.
    pub async fn gc_run(
        &self,
        run_id: &str,
        before: Timestamp,
        now: Timestamp,
        dry_run: bool,
    ) -> Result<RunGc, Error> {
        let run_id = run_id.to_owned();
        if dry_run {
            let s = self.scope();
            let mut pc = self.pool().acquire().await?;
            let mut c = pc.conn();
            return Ok(
                match check_deletable(&mut c, s, &run_id, before, false).await? {
                    None => RunGc::Gone,
                    Some(Err(kept)) => RunGc::Kept(kept),
                    Some(Ok(_)) => RunGc::Deleted {
                        rows: delete::count_run(&mut c, s, &run_id).await?,
                        tombstones: tombstones::count(&mut c, s, &run_id).await?,
                    },
                },
            );
        }
        let ledger = self.clone();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                Ok(match check_deletable(c, s, &run_id, before, true).await? {
                    None => RunGc::Gone,
                    Some(Err(kept)) => RunGc::Kept(kept),
                    Some(Ok(used_at)) => {
                        let (rows, tombstones) =
                            delete::delete_run(c, s, &run_id, used_at, now).await?;
                        RunGc::Deleted { rows, tombstones }
                    }
                })
            })
        })
        .await
    }
}
