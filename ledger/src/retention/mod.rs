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

mod sweep;
mod tombstones;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::Scope;
use crate::rows::IntRow;
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

#[derive(sqlx::FromRow)]
struct RunFacts {
    status: String,
    finished_at: Option<i64>,
    parent_run_id: Option<String>,
}

/// On PostgreSQL, locks the run's parent (if any) `FOR SHARE` before the run itself is
/// locked — parent before child, the order every writer takes — so a redrive of the
/// parent cannot commit between the parent's check and the child's deletion.
async fn lock_parent(c: &mut Conn<'_>, s: &Scope, run_id: &str) -> Result<(), Error> {
    let parent = c
        .optional::<(Option<String>,)>(
            "SELECT parent_run_id FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3",
            args![&s.tenant, &s.workspace, run_id],
        )
        .await?;
    if let Some((Some(parent),)) = parent {
        c.optional::<(String,)>(
            "SELECT status FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3 FOR SHARE",
            args![&s.tenant, &s.workspace, &parent],
        )
        .await?;
    }
    Ok(())
}

/// Whether the run may be deleted. With `lock` (a real deletion), on PostgreSQL its
/// parent and then its row are locked first (a redrive or a second deleter waits for
/// this transaction); a dry run locks nothing. `Ok(Err(kept))` when it stays.
async fn check_deletable(
    c: &mut Conn<'_>,
    s: &Scope,
    run_id: &str,
    before: Timestamp,
    lock: bool,
) -> Result<Option<Result<Timestamp, Kept>>, Error> {
    let lock = lock && c.is_postgres();
    if lock {
        lock_parent(c, s, run_id).await?;
    }
    let sql = if lock {
        "SELECT status, finished_at, parent_run_id FROM runs
         WHERE tenant = $1 AND workspace = $2 AND id = $3 FOR UPDATE"
    } else {
        "SELECT status, finished_at, parent_run_id FROM runs
         WHERE tenant = $1 AND workspace = $2 AND id = $3"
    };
    let Some(run) = c
        .optional::<RunFacts>(sql, args![&s.tenant, &s.workspace, run_id])
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
    if let Some((node, status)) = c
        .optional::<(String, String)>(
            "SELECT tool_call_id, status FROM tool_calls
             WHERE tenant = $1 AND workspace = $2 AND run_id = $3
               AND status NOT IN ('succeeded', 'failed', 'claimed')
             LIMIT 1",
            args![&s.tenant, &s.workspace, run_id],
        )
        .await?
    {
        return Ok(Some(Err(Kept::CallOpen { node, status })));
    }
    if let Some((child,)) = c
        .optional::<(String,)>(
            "SELECT id FROM runs
             WHERE tenant = $1 AND workspace = $2 AND parent_run_id = $3
               AND status NOT IN ('succeeded', 'failed', 'cancelled')
             LIMIT 1",
            args![&s.tenant, &s.workspace, run_id],
        )
        .await?
    {
        return Ok(Some(Err(Kept::ChildUnfinished { child })));
    }
    if let Some(parent) = run.parent_run_id {
        let open = c
            .optional::<(String,)>(
                "SELECT status FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3",
                args![&s.tenant, &s.workspace, &parent],
            )
            .await?
            .map(|(st,)| st.parse::<RunStatus>())
            .transpose()?
            .is_some_and(|st| !st.is_terminal());
        if open {
            return Ok(Some(Err(Kept::ParentUnfinished { parent })));
        }
    }
    Ok(Some(Ok(Timestamp(finished_at))))
}

/// Deletes the run's rows, table by table, and leaves its tombstones.
async fn delete_run(
    c: &mut Conn<'_>,
    s: &Scope,
    run_id: &str,
    used_at: Timestamp,
    now: Timestamp,
) -> Result<(Deleted, u64), Error> {
    let mut deleted = Deleted::default();
    let buried = tombstones::bury(c, s, run_id, used_at, now).await?;
    for (table, delete, _) in RUN_TABLES {
        let n = c
            .execute(delete, args![&s.tenant, &s.workspace, run_id])
            .await?;
        deleted.add(table, n);
    }
    let n = c
        .execute(
            "DELETE FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3",
            args![&s.tenant, &s.workspace, run_id],
        )
        .await?;
    deleted.add("runs", n);
    let a = || args![&s.tenant, &s.workspace, run_id];
    let n = c.execute(sweep::RUN_EVENT_DELIVERIES, a()).await?;
    deleted.add("event_deliveries", n);
    let n = c.execute(sweep::RUN_EVENTS, a()).await?;
    deleted.add("outbox", n);
    Ok((deleted, buried))
}

/// What deleting the run would delete (the dry run).
async fn count_run(c: &mut Conn<'_>, s: &Scope, run_id: &str) -> Result<Deleted, Error> {
    let mut counted = Deleted::default();
    for (table, _, count) in RUN_TABLES {
        let n = c
            .optional::<IntRow>(count, args![&s.tenant, &s.workspace, run_id])
            .await?
            .map_or(0, |r| r.n);
        counted.add(table, u64::try_from(n).unwrap_or(0));
    }
    counted.add("runs", 1);
    let n = c
        .optional::<IntRow>(
            sweep::RUN_EVENTS_DRY,
            args![&s.tenant, &s.workspace, run_id],
        )
        .await?
        .map_or(0, |r| r.n);
    counted.add("outbox", u64::try_from(n).unwrap_or(0));
    Ok(counted)
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
                        rows: count_run(&mut c, s, &run_id).await?,
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
                        let (rows, tombstones) = delete_run(c, s, &run_id, used_at, now).await?;
                        RunGc::Deleted { rows, tombstones }
                    }
                })
            })
        })
        .await
    }
}
