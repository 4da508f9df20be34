//! A schedule as a reader sees it (`flow schedules --json`, `GET /api/v1/schedules`,
//! the console's Schedules page): its definition (`flow.toml`'s, or a workflow file's as
//! applied) beside what the
//! ledger holds — paused or not, its next tick, its last run and its last skip.

use flow_ledger::{HistoryEntry, ScheduleState, Timestamp};
use schemars::JsonSchema;
use serde::Serialize;

use super::Schedule;

/// One schedule.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ScheduleView {
    /// Its id (`[[schedules]] id`).
    pub id: String,
    /// The workflow file it runs (as applied, for one a workflow file carried).
    pub workflow: String,
    /// Where it is declared: `flow.toml` (`[[schedules]]`) or `workflow` (a workflow
    /// file's `schedules:`, stored with `flow schedules apply`).
    pub declared_in: String,
    /// The cron expression.
    pub cron: String,
    /// The IANA time zone the cron is read in.
    pub timezone: String,
    /// `skip`, `buffer_one` or `allow`.
    pub overlap: String,
    /// How late a tick may still start (e.g. `1m`).
    pub catchup_window: String,
    /// Whether a daemon (or a command) stored it in the ledger yet.
    pub stored: bool,
    /// Paused: its ticks start nothing.
    pub paused: bool,
    /// Its next tick (absent while paused).
    pub next_tick: Option<Timestamp>,
    /// The latest tick that started a run (or the latest trigger).
    pub last_run: Option<TickView>,
    /// The latest tick that started nothing (skipped, buffered or missed).
    pub last_skip: Option<TickView>,
    /// Who last changed its definition or its pause (`config <path>` or a name).
    pub changed_by: Option<String>,
    /// When.
    pub changed_at: Option<Timestamp>,
}

/// What became of one tick (or a range of missed ticks).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TickView {
    /// The tick's nominal time (the first of a missed range).
    pub tick: Timestamp,
    /// `started`, `triggered`, `skipped_overlap`, `buffered`, `missed` or `refused`.
    pub outcome: String,
    /// The run it started.
    pub run: Option<String>,
    /// How many ticks it stands for (a missed range).
    pub count: u64,
}

impl TickView {
    fn of(e: &HistoryEntry) -> Self {
        Self {
            tick: e.tick_at,
            outcome: e.kind.as_str().to_string(),
            run: e.run_id.clone(),
            count: e.count,
        }
    }
}

impl ScheduleView {
    /// The view of `s`, with its stored state (if any) and its latest run and skip
    /// (`Ledger::last_tick`).
    pub fn of(
        s: &Schedule,
        state: Option<&ScheduleState>,
        last_run: Option<HistoryEntry>,
        last_skip: Option<HistoryEntry>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Self {
        let paused = state.is_some_and(|st| st.paused);
        let from = state
            .and_then(|st| chrono::DateTime::from_timestamp_millis(st.cursor.0))
            .map_or(now, |c| c.max(now));
        let next_tick = (!paused)
            .then(|| s.ticks.next_after(from))
            .flatten()
            .map(|t| Timestamp(t.timestamp_millis()));
        Self {
            id: s.id.clone(),
            workflow: s.workflow_label(),
            declared_in: match s.target {
                super::Target::File { .. } => "flow.toml",
                super::Target::Applied { .. } => "workflow",
            }
            .to_string(),
            cron: s.cron.clone(),
            timezone: s.timezone.clone(),
            overlap: s.overlap.as_str().to_string(),
            catchup_window: humantime::format_duration(s.catchup).to_string(),
            stored: state.is_some(),
            paused,
            next_tick,
            last_run: last_run.as_ref().map(TickView::of),
            last_skip: last_skip.as_ref().map(TickView::of),
            changed_by: state.map(|st| st.changed_by.clone()),
            changed_at: state.map(|st| st.changed_at),
        }
    }
}
