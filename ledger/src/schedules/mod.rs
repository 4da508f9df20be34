//! Schedules (migration 0014): one row per schedule with its definition as last seen,
//! whether it is paused, and its cursor (the last tick handled), and a history of what
//! became of each tick and what was done to the schedule.
//!
//! The engine computes a schedule's ticks (cron and time zone are its business); the
//! ledger keeps the promise that each tick is handled once however many daemons try:
//! [`Ledger::handle_ticks`] moves the cursor only from the value the daemon read
//! (compare-and-set, in the transaction that starts the tick's runs), and each run id
//! is derived from the schedule and the tick besides (`ticks.rs`).

mod apply;
mod ticks;

use serde_json::Value;

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::{Actor, Enqueued, NewRun, Scope};

pub use apply::{APPLIED_FROM, Applied, applied_from};
pub use ticks::{Handled, Overlap, TickPlan};

/// Most history entries one read returns.
pub const MAX_HISTORY_PAGE: u32 = 500;

/// A schedule as its definition says (what the engine read from `flow.toml`).
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleDef {
    /// The schedule's id (unique in the installation).
    pub id: String,
    /// The definition (cron, time zone, workflow, inputs, overlap, catch-up window), as
    /// JSON: shown to operators and compared by its hash.
    pub definition: Value,
}

/// A schedule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleState {
    /// The id.
    pub id: String,
    /// The definition last stored.
    pub definition: Value,
    /// Its canonical hash.
    pub def_hash: String,
    /// Paused: its ticks start nothing (and are not caught up on resume).
    pub paused: bool,
    /// The last tick handled: the ticks after it are due.
    pub cursor: Timestamp,
    /// The run of the last started tick (what `overlap` looks at).
    pub last_run_id: Option<String>,
    /// With `overlap: buffer_one`, the tick waiting for the previous run to end.
    pub buffered: Option<Timestamp>,
    /// When the definition or the pause last changed.
    pub changed_at: Timestamp,
    /// Who changed it (`config <path>` for a daemon that read `flow.toml`, or a name).
    pub changed_by: String,
}

/// What a history entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryKind {
    /// A tick started its run.
    Started,
    /// A tick found the previous run unfinished and started nothing.
    SkippedOverlap,
    /// A tick found the previous run unfinished and waits for it (`buffer_one`).
    Buffered,
    /// Ticks older than the catch-up window when a daemon came to them (a range).
    Missed,
    /// A tick whose run id was taken by another run (another workflow or inputs).
    Refused,
    /// A run started by hand.
    Triggered,
    /// Paused by someone.
    Paused,
    /// Resumed by someone.
    Resumed,
    /// The definition changed.
    Changed,
    /// The schedule left the configuration.
    Removed,
}

impl HistoryKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::SkippedOverlap => "skipped_overlap",
            Self::Buffered => "buffered",
            Self::Missed => "missed",
            Self::Refused => "refused",
            Self::Triggered => "triggered",
            Self::Paused => "paused",
            Self::Resumed => "resumed",
            Self::Changed => "changed",
            Self::Removed => "removed",
        }
    }

    fn parse(s: &str) -> Result<Self, Error> {
        Ok(match s {
            "started" => Self::Started,
            "skipped_overlap" => Self::SkippedOverlap,
            "buffered" => Self::Buffered,
            "missed" => Self::Missed,
            "refused" => Self::Refused,
            "triggered" => Self::Triggered,
            "paused" => Self::Paused,
            "resumed" => Self::Resumed,
            "changed" => Self::Changed,
            "removed" => Self::Removed,
            other => {
                return Err(Error::Corrupt {
                    what: format!("schedule history outcome `{other}`"),
                });
            }
        })
    }
}

/// One entry of a schedule's history.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryEntry {
    /// The schedule.
    pub schedule_id: String,
    /// The tick's nominal time (or when something was done).
    pub tick_at: Timestamp,
    /// What happened.
    pub kind: HistoryKind,
    /// The run started, if one was.
    pub run_id: Option<String>,
    /// For a range of missed ticks, the last of them.
    pub last_at: Timestamp,
    /// How many ticks the entry stands for (a missed range: its length; else 1).
    pub count: u64,
    /// Who did it (for what a person did).
    pub actor: Option<String>,
    /// What changed, in words.
    pub detail: Option<String>,
    /// When it was recorded.
    pub recorded_at: Timestamp,
}

#[derive(sqlx::FromRow)]
struct StateRow {
    id: String,
    definition: String,
    def_hash: String,
    paused: bool,
    cursor_at: i64,
    last_run_id: Option<String>,
    buffered_at: Option<i64>,
    changed_at: i64,
    changed_by: String,
}

impl StateRow {
    fn into_state(self) -> Result<ScheduleState, Error> {
        let definition = serde_json::from_str(&self.definition).map_err(|e| Error::Corrupt {
            what: format!("schedule {} definition is not JSON: {e}", self.id),
        })?;
        Ok(ScheduleState {
            id: self.id,
            definition,
            def_hash: self.def_hash,
            paused: self.paused,
            cursor: Timestamp(self.cursor_at),
            last_run_id: self.last_run_id,
            buffered: self.buffered_at.map(Timestamp),
            changed_at: Timestamp(self.changed_at),
            changed_by: self.changed_by,
        })
    }
}

#[derive(sqlx::FromRow)]
struct HistoryRow {
    schedule_id: String,
    tick_at: i64,
    outcome: String,
    run_id: Option<String>,
    last_at: i64,
    count: i64,
    actor: Option<String>,
    detail: Option<String>,
    recorded_at: i64,
}

impl HistoryRow {
    fn into_entry(self) -> Result<HistoryEntry, Error> {
        Ok(HistoryEntry {
            kind: HistoryKind::parse(&self.outcome)?,
            schedule_id: self.schedule_id,
            tick_at: Timestamp(self.tick_at),
            run_id: self.run_id,
            last_at: Timestamp(self.last_at),
            count: u64::try_from(self.count).unwrap_or(0),
            actor: self.actor,
            detail: self.detail,
            recorded_at: Timestamp(self.recorded_at),
        })
    }
}

/// One history entry, in the caller's transaction. An entry for the same tick and
/// outcome is not written twice.
pub(crate) async fn record(c: &mut Conn<'_>, s: &Scope, e: &HistoryEntry) -> Result<(), Error> {
    c.execute(
        "INSERT INTO schedule_history (tenant, workspace, schedule_id, tick_at, outcome,
            run_id, last_at, count, actor, detail, recorded_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING",
        args![
            &s.tenant,
            &s.workspace,
            &e.schedule_id,
            e.tick_at,
            e.kind.as_str(),
            e.run_id.clone(),
            e.last_at,
            i64::try_from(e.count).unwrap_or(i64::MAX),
            e.actor.clone(),
            e.detail.clone(),
            e.recorded_at
        ],
    )
    .await?;
    Ok(())
}

/// An entry of `kind` for `id` at `now`, by `actor`.
fn entry(
    id: &str,
    kind: HistoryKind,
    actor: &str,
    detail: Option<String>,
    now: Timestamp,
) -> HistoryEntry {
    HistoryEntry {
        schedule_id: id.to_owned(),
        tick_at: now,
        kind,
        run_id: None,
        last_at: now,
        count: 1,
        actor: Some(actor.to_owned()),
        detail,
        recorded_at: now,
    }
}

/// Removes each stored schedule `keep` does not keep (asked with its id and the
/// workflow that applied it, `None` for `flow.toml`'s), recorded `removed` with `actor`
/// and `detail`, in the caller's transaction. A row goes only as it was read
/// (`def_hash` in the `WHERE`): one stored since stays. The ids removed.
async fn prune_stored(
    c: &mut Conn<'_>,
    s: &Scope,
    keep: impl Fn(&str, Option<&str>) -> bool,
    who: &Actor,
    now: Timestamp,
) -> Result<Vec<String>, Error> {
    let stored = c
        .all::<(String, String, String)>(
            "SELECT id, definition, def_hash FROM schedules WHERE tenant = $1 AND workspace = $2",
            args![&s.tenant, &s.workspace],
        )
        .await?;
    let mut removed = Vec::new();
    for (id, definition, hash) in stored {
        let definition = serde_json::from_str::<Value>(&definition).ok();
        if keep(&id, definition.as_ref().and_then(applied_from)) {
            continue;
        }
        let gone = c
            .execute(
                "DELETE FROM schedules
                 WHERE tenant = $1 AND workspace = $2 AND id = $3 AND def_hash = $4",
                args![&s.tenant, &s.workspace, &id, &hash],
            )
            .await?;
        if gone == 0 {
            continue;
        }
        let e = entry(&id, HistoryKind::Removed, &who.by, who.reason.clone(), now);
        record(c, s, &e).await?;
        removed.push(id);
    }
    Ok(removed)
}

/// The error for a schedule that is not stored.
fn unknown(id: &str) -> Error {
    Error::NotFound {
        what: format!("schedule {id}"),
    }
}

/// The schedule `id`, its row locked until the transaction ends (on PostgreSQL; a
/// SQLite write transaction holds the whole database).
pub(crate) async fn state_for_update(
    c: &mut Conn<'_>,
    s: &Scope,
    id: &str,
) -> Result<Option<ScheduleState>, Error> {
    let sql = c.pick(
        "SELECT id, definition, def_hash, paused, cursor_at, last_run_id, buffered_at,
            changed_at, changed_by FROM schedules
         WHERE tenant = $1 AND workspace = $2 AND id = $3",
        "SELECT id, definition, def_hash, paused, cursor_at, last_run_id, buffered_at,
            changed_at, changed_by FROM schedules
         WHERE tenant = $1 AND workspace = $2 AND id = $3 FOR UPDATE",
    );
    c.optional::<StateRow>(sql, args![&s.tenant, &s.workspace, id])
        .await?
        .map(StateRow::into_state)
        .transpose()
}

impl Ledger {
    /// Makes the stored schedules match `defs` (what `flow.toml` says now): a new one
    /// is stored with its cursor at `now` (ticks before a schedule existed are not
    /// caught up); a changed definition is stored and recorded (`changed`, by `actor`),
    /// taking effect from the next tick after `now` (the cursor moves there); with
    /// `prune`, a stored schedule no longer in `defs` is removed and recorded
    /// (`removed`) unless a workflow file carried it (`apply_schedules`) — a daemon starting with its `flow.toml` prunes, a command that
    /// only needs the schedules stored does not. Returns the stored states of `defs`.
    pub async fn sync_schedules(
        &self,
        defs: Vec<ScheduleDef>,
        actor: &str,
        prune: bool,
        now: Timestamp,
    ) -> Result<Vec<ScheduleState>, Error> {
        let ledger = self.clone();
        let actor = actor.to_owned();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let mut out = Vec::with_capacity(defs.len());
                for def in &defs {
                    // A schedule a workflow file carried is not taken over by a
                    // `flow.toml` entry of the same id (an older file, a typo): the row
                    // stays the workflow's, and this daemon, seeing another definition,
                    // says so and leaves it alone (`flow schedules remove` settles it).
                    if applied_from(&def.definition).is_none()
                        && let Some(st) = state_for_update(c, s, &def.id).await?
                        && applied_from(&st.definition).is_some()
                    {
                        out.push(st);
                        continue;
                    }
                    out.push(sync_one(c, s, def, &actor, now).await?);
                }
                if !prune {
                    return Ok(out);
                }
                // A schedule a workflow file carried is `flow schedules apply`'s to
                // remove, not `flow.toml`'s.
                let keep = |id: &str, owner: Option<&str>| {
                    owner.is_some() || defs.iter().any(|d| d.id == id)
                };
                let who = Actor {
                    by: actor,
                    reason: None,
                };
                prune_stored(c, s, keep, &who, now).await?;
                Ok(out)
            })
        })
        .await
    }

    /// Every stored schedule, by id, each definition without a workflow's text (what a
    /// daemon reads each second: [`Ledger::schedule_definition`] gives the whole one).
    pub async fn list_schedule_heads(&self) -> Result<Vec<ScheduleState>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let mut c = pc.conn();
        let sql = c.pick(
            "SELECT id, json_remove(definition, '$.text') AS definition, def_hash, paused,
                cursor_at, last_run_id, buffered_at, changed_at, changed_by
             FROM schedules WHERE tenant = $1 AND workspace = $2 ORDER BY id",
            "SELECT id, (definition::jsonb - 'text')::text AS definition, def_hash, paused,
                cursor_at, last_run_id, buffered_at, changed_at, changed_by
             FROM schedules WHERE tenant = $1 AND workspace = $2 ORDER BY id",
        );
        c.all::<StateRow>(sql, args![&s.tenant, &s.workspace])
            .await?
            .into_iter()
            .map(StateRow::into_state)
            .collect()
    }

    /// Schedule `id` whole (its definition with a workflow's text), or `None`.
    pub async fn schedule_definition(&self, id: &str) -> Result<Option<ScheduleState>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        pc.conn()
            .optional::<StateRow>(
                "SELECT id, definition, def_hash, paused, cursor_at, last_run_id, buffered_at,
                    changed_at, changed_by
                 FROM schedules WHERE tenant = $1 AND workspace = $2 AND id = $3",
                args![&s.tenant, &s.workspace, id],
            )
            .await?
            .map(StateRow::into_state)
            .transpose()
    }

    /// Removes schedule `id`, whoever declared it, recorded `removed` with `actor` (and
    /// `reason`): what settles an id two sources claim, or a schedule no daemon prunes.
    /// A daemon whose `flow.toml` still declares it stores it again at its next start
    /// or reload. `NotFound` for an unknown id.
    pub async fn remove_schedule(
        &self,
        id: &str,
        who: &Actor,
        now: Timestamp,
    ) -> Result<ScheduleState, Error> {
        let ledger = self.clone();
        let id = id.to_owned();
        let Actor { by: actor, reason } = who.clone();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let state = state_for_update(c, s, &id)
                    .await?
                    .ok_or_else(|| unknown(&id))?;
                c.execute(
                    "DELETE FROM schedules WHERE tenant = $1 AND workspace = $2 AND id = $3",
                    args![&s.tenant, &s.workspace, &id],
                )
                .await?;
                record(c, s, &entry(&id, HistoryKind::Removed, &actor, reason, now)).await?;
                Ok(state)
            })
        })
        .await
    }

    /// Every stored schedule, by id.
    pub async fn list_schedules(&self) -> Result<Vec<ScheduleState>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        pc.conn()
            .all::<StateRow>(
                "SELECT id, definition, def_hash, paused, cursor_at, last_run_id, buffered_at,
                    changed_at, changed_by
                 FROM schedules WHERE tenant = $1 AND workspace = $2 ORDER BY id",
                args![&s.tenant, &s.workspace],
            )
            .await?
            .into_iter()
            .map(StateRow::into_state)
            .collect()
    }

    /// Pauses (`paused`) or resumes a schedule, recorded with `actor` (and `reason`). A
    /// resumed schedule's cursor moves to `now`: the ticks of the pause are not caught
    /// up. A tick buffered when the schedule is paused is dropped, recorded
    /// `skipped_overlap`. `NotFound` for an unknown id.
    pub async fn set_schedule_paused(
        &self,
        id: &str,
        paused: bool,
        who: &Actor,
        now: Timestamp,
    ) -> Result<ScheduleState, Error> {
        let ledger = self.clone();
        let id = id.to_owned();
        let Actor { by: actor, reason } = who.clone();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                let state = state_for_update(c, s, &id)
                    .await?
                    .ok_or_else(|| unknown(&id))?;
                if state.paused == paused {
                    return Ok(state);
                }
                let cursor = if paused {
                    state.cursor
                } else {
                    now.max(state.cursor)
                };
                c.execute(
                    "UPDATE schedules SET paused = $4, cursor_at = $5, buffered_at = NULL,
                        changed_at = $6, changed_by = $7
                     WHERE tenant = $1 AND workspace = $2 AND id = $3",
                    args![&s.tenant, &s.workspace, &id, paused, cursor, now, &actor],
                )
                .await?;
                if let Some(at) = state.buffered {
                    let mut dropped = entry(&id, HistoryKind::SkippedOverlap, &actor, None, now);
                    (dropped.tick_at, dropped.last_at) = (at, at);
                    dropped.detail = Some("a buffered tick, dropped by a pause".into());
                    record(c, s, &dropped).await?;
                }
                let kind = if paused {
                    HistoryKind::Paused
                } else {
                    HistoryKind::Resumed
                };
                record(c, s, &entry(&id, kind, &actor, reason, now)).await?;
                state_for_update(c, s, &id)
                    .await?
                    .ok_or_else(|| unknown(&id))
            })
        })
        .await
    }

    /// Starts one run of schedule `id` now (`flow schedules trigger`), recorded
    /// `triggered` with `actor`. The run has its own id (the caller's); the cursor and
    /// the ticks are untouched. `NotFound` for an unknown id.
    pub async fn trigger_schedule(
        &self,
        id: &str,
        run: NewRun,
        who: &Actor,
        now: Timestamp,
    ) -> Result<Enqueued, Error> {
        let ledger = self.clone();
        let id = id.to_owned();
        let Actor { by: actor, reason } = who.clone();
        self.write(move |c| {
            Box::pin(async move {
                let s = ledger.scope();
                if state_for_update(c, s, &id).await?.is_none() {
                    return Err(unknown(&id));
                }
                let mut tx = crate::enqueue::EnqueueTx::default();
                let enq = crate::enqueue::enqueue_in(c, &ledger, &run, None, now, &mut tx).await?;
                tx.finish(c, s).await?;
                let mut e = entry(&id, HistoryKind::Triggered, &actor, reason, now);
                e.run_id = Some(run.id.clone());
                record(c, s, &e).await?;
                Ok(enq)
            })
        })
        .await
    }

    /// The latest entry of schedule `id` whose outcome is one of `kinds` (its last run,
    /// its last skip), by tick.
    pub async fn last_tick(
        &self,
        id: &str,
        kinds: &[HistoryKind],
    ) -> Result<Option<HistoryEntry>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let mut latest: Option<HistoryEntry> = None;
        for kind in kinds {
            let row = pc
                .conn()
                .optional::<HistoryRow>(
                    "SELECT schedule_id, tick_at, outcome, run_id, last_at, count, actor, detail,
                        recorded_at FROM schedule_history
                     WHERE tenant = $1 AND workspace = $2 AND schedule_id = $3 AND outcome = $4
                     ORDER BY tick_at DESC LIMIT 1",
                    args![&s.tenant, &s.workspace, id, kind.as_str()],
                )
                .await?
                .map(HistoryRow::into_entry)
                .transpose()?;
            if let Some(e) = row
                && latest.as_ref().is_none_or(|l| e.tick_at > l.tick_at)
            {
                latest = Some(e);
            }
        }
        Ok(latest)
    }

    /// The latest `limit` history entries of schedule `id` (all schedules: `None`),
    /// newest first.
    pub async fn schedule_history(
        &self,
        id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<HistoryEntry>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let limit = i64::from(limit.min(MAX_HISTORY_PAGE));
        // Two statements, so that one schedule's history is read by its index.
        let (sql, a) = match id {
            Some(id) => (
                "SELECT schedule_id, tick_at, outcome, run_id, last_at, count, actor, detail,
                    recorded_at FROM schedule_history
                 WHERE tenant = $1 AND workspace = $2 AND schedule_id = $3
                 ORDER BY recorded_at DESC, tick_at DESC LIMIT $4",
                args![&s.tenant, &s.workspace, id, limit],
            ),
            None => (
                "SELECT schedule_id, tick_at, outcome, run_id, last_at, count, actor, detail,
                    recorded_at FROM schedule_history
                 WHERE tenant = $1 AND workspace = $2
                 ORDER BY recorded_at DESC, tick_at DESC LIMIT $3",
                args![&s.tenant, &s.workspace, limit],
            ),
        };
        pc.conn()
            .all::<HistoryRow>(sql, a)
            .await?
            .into_iter()
            .map(HistoryRow::into_entry)
            .collect()
    }
}

/// Stores `def` if new or changed (see [`Ledger::sync_schedules`]).
async fn sync_one(
    c: &mut Conn<'_>,
    s: &Scope,
    def: &ScheduleDef,
    actor: &str,
    now: Timestamp,
) -> Result<ScheduleState, Error> {
    let hash = crate::canonical_hash(&def.definition);
    let text = def.definition.to_string();
    match state_for_update(c, s, &def.id).await? {
        Some(state) if state.def_hash == hash => return Ok(state),
        Some(state) => {
            // A new definition counts from its next tick: the old one's ticks after
            // the cursor are not started under the new one (nor caught up).
            c.execute(
                "UPDATE schedules SET definition = $4, def_hash = $5, changed_at = $6,
                    changed_by = $7, cursor_at = $8, buffered_at = NULL
                 WHERE tenant = $1 AND workspace = $2 AND id = $3",
                args![
                    &s.tenant,
                    &s.workspace,
                    &def.id,
                    &text,
                    &hash,
                    now,
                    actor,
                    now.max(state.cursor)
                ],
            )
            .await?;
            let detail = apply::change_detail(&state.definition, &def.definition);
            record(
                c,
                s,
                &entry(&def.id, HistoryKind::Changed, actor, Some(detail), now),
            )
            .await?;
        }
        None => {
            c.execute(
                "INSERT INTO schedules (tenant, workspace, id, definition, def_hash, paused,
                    cursor_at, changed_at, changed_by)
                 VALUES ($1, $2, $3, $4, $5, FALSE, $6, $6, $7) ON CONFLICT DO NOTHING",
                args![&s.tenant, &s.workspace, &def.id, &text, &hash, now, actor],
            )
            .await?;
        }
    }
    state_for_update(c, s, &def.id)
        .await?
        .ok_or_else(|| unknown(&def.id))
}
