//! Handling a schedule's due ticks: ONE transaction that checks the cursor is still the
//! one the daemon read, records the missed range, starts (or skips, or buffers) each
//! tick's run by the overlap rule, and moves the cursor. A second daemon with the same
//! plan finds the cursor moved and does nothing ([`Handled::Stale`]).

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::enqueue::{EnqueueTx, enqueue_in};
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::{NewRun, Scope};
use crate::state::RunStatus;

use super::{HistoryEntry, HistoryKind, record, state_for_update};

/// What a tick does when the schedule's previous run is unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlap {
    /// Start nothing; record the tick `skipped_overlap` (the default).
    #[default]
    Skip,
    /// Keep one tick waiting and start it when the previous run ends; the ticks after
    /// it are skipped.
    BufferOne,
    /// Start it anyway.
    Allow,
}

impl Overlap {
    /// The name in a configuration file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::BufferOne => "buffer_one",
            Self::Allow => "allow",
        }
    }
}

/// A daemon's plan for one schedule's due ticks, computed from the state it read.
#[derive(Debug, Clone)]
pub struct TickPlan {
    /// The schedule.
    pub schedule_id: String,
    /// The definition's hash the plan was computed from (a changed definition makes
    /// the plan stale).
    pub def_hash: String,
    /// The cursor the daemon read: the plan applies only if it is still there.
    pub cursor: Timestamp,
    /// Where the cursor goes: the last tick the plan considered.
    pub new_cursor: Timestamp,
    /// Ticks older than the catch-up window: `(first, last, count)`.
    pub missed: Option<(Timestamp, Timestamp, u64)>,
    /// The buffered tick to start now (the previous run may have ended), with its run.
    pub buffered: Option<(Timestamp, NewRun)>,
    /// Each tick to start, in order, with its run (its id derived from the tick).
    pub fire: Vec<(Timestamp, NewRun)>,
    /// What a tick does while the previous run is unfinished.
    pub overlap: Overlap,
}

/// What [`Ledger::handle_ticks`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// The plan applied: the runs started (new ones only), the ticks skipped for
    /// overlap, and the missed ticks recorded.
    Done {
        /// Ids of the runs started.
        started: Vec<String>,
        /// Ticks skipped because the previous run was unfinished.
        skipped: u64,
        /// Ticks recorded missed.
        missed: u64,
        /// Ticks whose run id was taken by another run (recorded `refused`).
        refused: u64,
        /// Whether a tick now waits for the previous run (`buffer_one`).
        buffered: bool,
    },
    /// Another daemon moved the cursor (or the schedule was paused, changed or
    /// removed) since the plan was computed: nothing was written.
    Stale,
}

impl Ledger {
    /// Applies `plan` (see the module): all of it or nothing.
    pub async fn handle_ticks(&self, plan: TickPlan, now: Timestamp) -> Result<Handled, Error> {
        let ledger = self.clone();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let Some(state) = state_for_update(c, s, &plan.schedule_id).await? else {
                    return Ok(Handled::Stale);
                };
                let buffered_matches = state.buffered == plan.buffered.as_ref().map(|b| b.0);
                if state.cursor != plan.cursor
                    || state.paused
                    || state.def_hash != plan.def_hash
                    || !buffered_matches
                {
                    return Ok(Handled::Stale);
                }
                apply(c, &ledger, s, plan, state.last_run_id, now).await
            })
        })
        .await
    }
}

/// The plan's writes, once the cursor checked out.
async fn apply(
    c: &mut Conn<'_>,
    ledger: &Ledger,
    s: &Scope,
    plan: TickPlan,
    mut last_run: Option<String>,
    now: Timestamp,
) -> Result<Handled, Error> {
    let id = plan.schedule_id.as_str();
    let mut missed = 0;
    if let Some((first, last, count)) = plan.missed {
        missed = count;
        let mut e = tick(id, first, HistoryKind::Missed, now);
        e.last_at = last;
        e.count = count;
        record(c, s, &e).await?;
    }
    let (mut started, mut skipped, mut refused) = (Vec::new(), 0u64, 0u64);
    let mut buffered = None;
    let mut tx = EnqueueTx::default();
    let ticks = plan.buffered.into_iter().chain(plan.fire);
    for (at, run) in ticks {
        let busy = match &last_run {
            Some(prev) if plan.overlap != Overlap::Allow => unfinished(c, s, prev).await?,
            _ => false,
        };
        if busy {
            let kind = if plan.overlap == Overlap::BufferOne && buffered.is_none() {
                buffered = Some(at);
                HistoryKind::Buffered
            } else {
                skipped += 1;
                HistoryKind::SkippedOverlap
            };
            record(c, s, &tick(id, at, kind, now)).await?;
            continue;
        }
        let enq = match enqueue_in(c, ledger, &run, None, now, &mut tx).await {
            Ok(enq) => enq,
            Err(Error::Conflict { reason, .. }) => {
                // The tick's run id is taken by another run (another workflow or
                // inputs): nothing is started under it, and the tick says why.
                let mut e = tick(id, at, HistoryKind::Refused, now);
                e.run_id = Some(run.id.clone());
                e.detail = Some(reason);
                record(c, s, &e).await?;
                refused += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut e = tick(id, at, HistoryKind::Started, now);
        e.run_id = Some(run.id.clone());
        record(c, s, &e).await?;
        if enq.created {
            started.push(run.id.clone());
        }
        last_run = Some(run.id);
    }
    tx.finish(c, s).await?;
    c.execute(
        "UPDATE schedules SET cursor_at = $4, last_run_id = $5, buffered_at = $6
         WHERE tenant = $1 AND workspace = $2 AND id = $3",
        args![
            &s.tenant,
            &s.workspace,
            id,
            plan.new_cursor,
            last_run,
            buffered
        ],
    )
    .await?;
    Ok(Handled::Done {
        started,
        skipped,
        missed,
        refused,
        buffered: buffered.is_some(),
    })
}

/// Whether run `id` has not finished (a run that is gone counts as finished).
async fn unfinished(c: &mut Conn<'_>, s: &Scope, id: &str) -> Result<bool, Error> {
    let status = c
        .optional::<(String,)>(
            "SELECT status FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3",
            args![&s.tenant, &s.workspace, id],
        )
        .await?;
    Ok(match status {
        Some((st,)) => !st.parse::<RunStatus>()?.is_terminal(),
        None => false,
    })
}

fn tick(id: &str, at: Timestamp, kind: HistoryKind, now: Timestamp) -> HistoryEntry {
    HistoryEntry {
        schedule_id: id.to_owned(),
        tick_at: at,
        kind,
        run_id: None,
        last_at: at,
        count: 1,
        actor: None,
        detail: None,
        recorded_at: now,
    }
}
