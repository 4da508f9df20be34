//! The daemon's side of schedules: store the definitions of `flow.toml` (once at start),
//! then, about once a second and at each tick, turn every schedule's due ticks — those
//! of `flow.toml` and those workflow files carried (`flow schedules apply`, read from
//! the ledger each pass) — into a [`TickPlan`] and hand it to the ledger, which applies
//! it once across all daemons.
//!
//! A plan is computed from the cursor read: the ticks in `(cursor, now]` (at most
//! [`MAX_TICKS_PER_PASS`]; the next pass takes the rest) split by the catch-up window
//! into missed ones (one range) and ones to start; each start carries its run, built
//! now (the workflow file read and checked at each tick). A schedule whose workflow no
//! longer validates logs why and leaves its cursor: its ticks are started once it is
//! fixed, or recorded missed once they are older than the window.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use flow_ledger::{Handled, Ledger, ScheduleState, TickPlan, Timestamp};
use tokio_util::sync::CancellationToken;

use super::{Schedule, tick_run_id};
use crate::daemon::metrics::Metrics;

/// Most ticks one pass considers per schedule (a per-second schedule after a day
/// without daemons has 86,400): the cursor moves past them, the next pass goes on.
pub const MAX_TICKS_PER_PASS: usize = 1_000;

/// Longest a pass waits for the next: pauses, resumes and new runs' ends are seen
/// within it.
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// What one daemon fires: the schedules of its `flow.toml`.
pub struct Scheduler {
    ledger: Ledger,
    schedules: Vec<Schedule>,
    /// Each schedule's definition hash: a stored one that differs was changed by a
    /// daemon with another `flow.toml`, and this one leaves it alone.
    hashes: Vec<String>,
    /// Schedules this daemon said it does not fire (said once per change).
    warned: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Why a schedule's ticks cannot start, as last logged.
    problems: std::sync::Mutex<std::collections::HashMap<String, String>>,
    metrics: Arc<Metrics>,
    /// Who stores definitions (`config <path>`), for the history.
    actor: String,
    /// The schedules workflow files carried, by id: the stored hash they were read at
    /// and the schedule (`None`: its definition does not read).
    applied: std::sync::Mutex<AppliedCache>,
}

/// Applied schedules by id: `(stored hash, schedule)`.
type AppliedCache = std::collections::HashMap<String, (String, Option<Arc<Schedule>>)>;

/// An applied schedule from its whole stored state, or `None` (said at error).
fn read_applied(full: &ScheduleState) -> Option<Arc<Schedule>> {
    match Schedule::applied(&full.id, &full.definition)? {
        Ok(s) => Some(Arc::new(s)),
        Err(e) => {
            tracing::error!(schedule = %full.id, error = %e, "schedule: its stored definition cannot be read; it does not fire until applied again");
            None
        }
    }
}

/// Reads the configuration again (`flow.toml` changed): its schedules, or why not.
pub type Reload = Box<dyn Fn() -> Result<super::manage::Schedules, String> + Send + Sync>;

/// Where the schedules came from, watched for changes: the file, its last modification
/// time, and how to read it again.
pub struct Watch {
    /// The configuration file.
    pub path: std::path::PathBuf,
    /// How to read it.
    pub reload: Reload,
}

fn to_utc(t: Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.0).unwrap_or_default()
}

fn to_ts(t: DateTime<Utc>) -> Timestamp {
    Timestamp(t.timestamp_millis())
}

impl Scheduler {
    /// A scheduler of `schedules` on `ledger` (their source is who stores them).
    pub fn new(ledger: Ledger, schedules: super::manage::Schedules, metrics: Arc<Metrics>) -> Self {
        let super::manage::Schedules {
            list: schedules,
            source: actor,
            ..
        } = schedules;
        let hashes = schedules
            .iter()
            .map(|s| flow_ledger::canonical_hash(&s.def().definition))
            .collect();
        Self {
            ledger,
            schedules,
            hashes,
            warned: std::sync::Mutex::default(),
            problems: std::sync::Mutex::default(),
            metrics,
            actor,
            applied: std::sync::Mutex::default(),
        }
    }

    /// Fires ticks until `stop`: stores the definitions, then passes over the schedules
    /// each second (sooner when a tick is due sooner). A database error is logged and
    /// the pass is tried again: ticks are not lost, they wait behind the cursor. With
    /// `watch`, a change of the configuration file is read at the next pass: new and
    /// changed schedules are stored (recorded `changed`), removed ones removed, and they
    /// take effect from their next tick.
    pub async fn run(mut self, stop: CancellationToken, watch: Option<Watch>) {
        let modified = |w: &Watch| std::fs::metadata(&w.path).and_then(|m| m.modified()).ok();
        let mut seen = watch.as_ref().and_then(modified);
        let mut defs: Vec<_> = self.schedules.iter().map(Schedule::def).collect();
        // A daemon whose flow.toml declares no schedule stores (and prunes) nothing: it
        // fires the schedules workflow files carried (`flow schedules apply`).
        let mut synced = self.schedules.is_empty();
        // An outage is one line when it starts and one when it ends, not one per pass.
        let mut failing = false;
        while !stop.is_cancelled() {
            let now = super::now_utc();
            if let Some(w) = &watch
                && let Some(m) = modified(w)
                && Some(m) != seen
            {
                seen = Some(m);
                match (w.reload)() {
                    Ok(fresh) => {
                        tracing::warn!(file = %w.path.display(), schedules = fresh.list.len(), "schedules: the configuration changed; storing its schedules");
                        // A file that declared none and still declares none prunes
                        // nothing: the other daemons' files may declare some.
                        synced = self.schedules.is_empty() && fresh.list.is_empty();
                        self = Self::new(self.ledger.clone(), fresh, self.metrics.clone());
                        defs = self.schedules.iter().map(Schedule::def).collect();
                    }
                    Err(e) => {
                        tracing::error!(file = %w.path.display(), error = %e, "schedules: the changed configuration cannot be read; firing the schedules read before")
                    }
                }
            }
            if !synced {
                match self
                    .ledger
                    .sync_schedules(defs.clone(), &self.actor, true, to_ts(now))
                    .await
                {
                    Ok(_) => synced = true,
                    Err(e) => {
                        if !std::mem::replace(&mut failing, true) {
                            tracing::warn!(error = %e, "schedules: cannot store the definitions; trying again every {}s (said once)", MAX_SLEEP.as_secs());
                        }
                    }
                }
            }
            let sleep = if synced {
                match self.pass(now).await {
                    Ok(next) => {
                        if std::mem::replace(&mut failing, false) {
                            tracing::info!("schedules: the ledger answers again; firing");
                        }
                        next
                    }
                    Err(e) => {
                        if !std::mem::replace(&mut failing, true) {
                            tracing::warn!(error = %e, "schedules: a pass failed; trying again every {}s (said once)", MAX_SLEEP.as_secs());
                        }
                        MAX_SLEEP
                    }
                }
            } else {
                MAX_SLEEP
            };
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// One pass over every schedule at `now`; how long until the next is worth doing.
    /// A schedule that fails is logged and left for the next pass; the others go on.
    pub async fn pass(&self, now: DateTime<Utc>) -> Result<Duration, flow_ledger::Error> {
        let states = self.ledger.list_schedule_heads().await?;
        let mut next = now + TimeDelta::from_std(MAX_SLEEP).unwrap_or_default();
        let applied = self.applied(&states).await;
        let own = self.schedules.iter().zip(&self.hashes);
        for (s, hash) in own.chain(applied.iter().map(|(s, h)| (&**s, h))) {
            let state = states.iter().find(|st| st.id == s.id);
            if !self.fires(s, state, hash) {
                continue;
            }
            let Some(state) = state else { continue };
            if let Err(e) = self.one(s, state, now).await {
                tracing::warn!(schedule = %s.id, error = %e, "schedule: its ticks could not be handled; trying again");
            }
            if let Some(t) = s.ticks.next_after(now) {
                next = next.min(t);
            }
        }
        Ok((next - now)
            .to_std()
            .unwrap_or_default()
            .max(Duration::from_millis(20)))
    }

    /// The schedules workflow files carried (`flow schedules apply`) among the stored
    /// `heads`, each with its stored hash. One is read whole (its workflow's text) and
    /// parsed only when its hash is new; one whose definition cannot be read is said
    /// once per definition and left out.
    async fn applied(&self, heads: &[ScheduleState]) -> Vec<(Arc<Schedule>, String)> {
        let mut known =
            std::mem::take(&mut *self.applied.lock().unwrap_or_else(|e| e.into_inner()));
        let mut kept = std::collections::HashMap::new();
        for h in heads {
            if flow_ledger::applied_from(&h.definition).is_none()
                || self.schedules.iter().any(|s| s.id == h.id)
            {
                continue;
            }
            let entry = match known.remove(&h.id) {
                Some((hash, s)) if hash == h.def_hash => (hash, s),
                _ => match self.ledger.schedule_definition(&h.id).await {
                    Ok(Some(full)) => (full.def_hash.clone(), read_applied(&full)),
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(schedule = %h.id, error = %e, "schedule: its definition cannot be read; trying again");
                        continue;
                    }
                },
            };
            kept.insert(h.id.clone(), entry);
        }
        let out = kept
            .values()
            .filter_map(|(hash, s)| Some((s.clone()?, hash.clone())))
            .collect();
        *self.applied.lock().unwrap_or_else(|e| e.into_inner()) = kept;
        out
    }

    /// The due ticks of one schedule, handed to the ledger.
    async fn one(
        &self,
        s: &Schedule,
        state: &ScheduleState,
        now: DateTime<Utc>,
    ) -> Result<(), flow_ledger::Error> {
        if state.paused || self.waits_on_buffer(s, state, now).await? {
            return Ok(());
        }
        let (plan, problem) = plan(s, state, now);
        self.say_problem(s, problem);
        match plan {
            Some(plan) => self.apply(s, plan, now).await,
            None => Ok(()),
        }
    }

    /// Logs why `s`'s ticks cannot start, once per distinct reason (a pass runs every
    /// second), and that they can again.
    fn say_problem(&self, s: &Schedule, problem: Option<String>) {
        let mut said = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        match problem {
            Some(p) if said.get(&s.id) != Some(&p) => {
                tracing::error!(schedule = %s.id, error = %p, "schedule: its ticks cannot start until this is fixed (past the catch-up window they are recorded missed)");
                said.insert(s.id.clone(), p);
            }
            Some(_) => {}
            None => {
                if said.remove(&s.id).is_some() {
                    tracing::warn!(schedule = %s.id, "schedule: its ticks start again");
                }
            }
        }
    }

    /// Whether this daemon fires `s`: the ledger holds the definition this daemon read.
    /// Otherwise (another daemon stored another `flow.toml`'s, or removed it) it says
    /// so once, at warn, and leaves the schedule to the daemons that agree with it.
    fn fires(&self, s: &Schedule, state: Option<&ScheduleState>, hash: &str) -> bool {
        let why = match state {
            None => Some("it is not in the ledger (a daemon with another flow.toml removed it)"),
            Some(st) if st.def_hash != hash => Some(
                "the ledger holds another definition (a daemon with another flow.toml stored it)",
            ),
            Some(_) => None,
        };
        let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        match why {
            Some(why) => {
                if warned.insert(s.id.clone()) {
                    tracing::warn!(schedule = %s.id, "schedule: this daemon does not fire it: {why}; restart every daemon with the same flow.toml");
                }
                false
            }
            None => {
                warned.remove(&s.id);
                true
            }
        }
    }

    /// Whether the only thing due is a buffered tick whose previous run is still
    /// unfinished (a read, so a long run does not cost a write a second).
    async fn waits_on_buffer(
        &self,
        s: &Schedule,
        state: &ScheduleState,
        now: DateTime<Utc>,
    ) -> Result<bool, flow_ledger::Error> {
        if state.buffered.is_none() || !s.ticks.between(to_utc(state.cursor), now, 1).is_empty() {
            return Ok(false);
        }
        let Some(prev) = &state.last_run_id else {
            return Ok(false);
        };
        match self.ledger.get_run(prev).await {
            Ok(run) => Ok(!run.status.is_terminal()),
            Err(flow_ledger::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn apply(
        &self,
        s: &Schedule,
        plan: TickPlan,
        now: DateTime<Utc>,
    ) -> Result<(), flow_ledger::Error> {
        let tried = plan.fire.len() + usize::from(plan.buffered.is_some());
        match self.ledger.handle_ticks(plan, to_ts(now)).await? {
            Handled::Done {
                started,
                skipped,
                missed,
                refused,
                buffered,
            } => {
                if refused > 0 {
                    tracing::error!(schedule = %s.id, ticks = refused, "schedule: a tick's run id is taken by another run; nothing started (see flow schedules history)");
                }
                for id in &started {
                    tracing::info!(schedule = %s.id, run = %id, "schedule: tick started its run");
                }
                if skipped > 0 {
                    tracing::info!(schedule = %s.id, ticks = skipped, "schedule: previous run unfinished; ticks skipped (overlap: skip)");
                }
                if missed > 0 {
                    tracing::warn!(schedule = %s.id, ticks = missed, window = %humantime::format_duration(s.catchup), "schedule: ticks older than the catch-up window recorded missed");
                }
                let m = &self.metrics;
                m.schedule_ticks(&s.id, "started", started.len() as u64);
                m.schedule_ticks(&s.id, "skipped_overlap", skipped);
                m.schedule_ticks(&s.id, "missed", missed);
                m.schedule_ticks(&s.id, "buffered", u64::from(buffered));
                m.schedule_ticks(&s.id, "refused", refused);
                tracing::debug!(schedule = %s.id, tried, "schedule: ticks handled");
            }
            Handled::Stale => {
                tracing::debug!(schedule = %s.id, "schedule: another daemon handled these ticks");
            }
        }
        Ok(())
    }
}

/// The plan for `s`'s ticks after its cursor at `now`, or `None` when nothing is due.
/// The workflow is read once for the plan; one that cannot be used (it no longer
/// validates) starts nothing and says why (`Err`): the missed ticks are still
/// recorded, and the cursor stays before the first tick to start until it can, or
/// until that tick is older than the window and missed.
pub fn plan(
    s: &Schedule,
    state: &ScheduleState,
    now: DateTime<Utc>,
) -> (Option<TickPlan>, Option<String>) {
    let cursor = to_utc(state.cursor);
    let due = s.ticks.between(cursor, now, MAX_TICKS_PER_PASS);
    if due.is_empty() && state.buffered.is_none() {
        return (None, None);
    }
    let horizon = now - TimeDelta::from_std(s.catchup).unwrap_or_default();
    let (old, fresh): (Vec<_>, Vec<_>) = due.iter().partition(|t| **t < horizon);
    let missed = match (old.first(), old.last()) {
        (Some(first), Some(last)) => Some((to_ts(*first), to_ts(*last), old.len() as u64)),
        _ => None,
    };
    let mut new_cursor = old.last().map_or(state.cursor, |t| to_ts(*t));
    let loaded = if fresh.is_empty() && state.buffered.is_none() {
        None
    } else {
        match s.load() {
            Ok(l) => Some(l),
            Err(e) => {
                // Only what does not need the workflow: the missed range.
                let plan = missed.map(|m| TickPlan {
                    schedule_id: s.id.clone(),
                    def_hash: state.def_hash.clone(),
                    cursor: state.cursor,
                    new_cursor,
                    missed: Some(m),
                    buffered: None,
                    fire: Vec::new(),
                    overlap: s.overlap,
                });
                // A buffered tick stays buffered: the plan must carry it to apply.
                return (plan.filter(|_| state.buffered.is_none()), Some(e));
            }
        }
    };
    let mut problem = None;
    let mut build = |t: DateTime<Utc>| {
        let loaded = loaded.as_ref()?;
        match s.run_of(loaded, t, tick_run_id(&s.id, t)) {
            Ok(run) => Some(run),
            Err(e) => {
                problem = Some(e);
                None
            }
        }
    };
    let buffered = match state.buffered {
        Some(b) => match build(to_utc(b)) {
            Some(run) => Some((b, run)),
            None => return (None, problem),
        },
        None => None,
    };
    let mut fire = Vec::with_capacity(fresh.len());
    for t in fresh {
        let Some(run) = build(t) else { break };
        fire.push((to_ts(t), run));
        new_cursor = to_ts(t);
    }
    if missed.is_none() && fire.is_empty() && buffered.is_none() {
        return (None, problem);
    }
    let plan = TickPlan {
        schedule_id: s.id.clone(),
        def_hash: state.def_hash.clone(),
        cursor: state.cursor,
        new_cursor,
        missed,
        buffered,
        fire,
        overlap: s.overlap,
    };
    (Some(plan), problem)
}
