//! What an operator does to schedules — list them, pause, resume, trigger — in one
//! place for `flow schedules`, `/api/v1/schedules` and the console's Schedules page:
//! the schedules of `flow.toml` and those workflow files carried (`flow schedules
//! apply`, read from the ledger).
//!
//! Each change first stores the configuration's definitions as a daemon would
//! (`Ledger::sync_schedules`), so it works before any daemon ran, then changes the
//! schedule, recorded with who.

use flow_ledger::{Actor, HistoryKind, Ledger, ScheduleState, Timestamp};

use super::Schedule;
use super::view::ScheduleView;

/// Why a change to a schedule was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Neither the configuration nor an applied workflow has a schedule of that id.
    #[error("no schedule `{id}` in {config} nor applied from a workflow file")]
    Unknown {
        /// The id asked for.
        id: String,
        /// Where the schedules were read from.
        config: String,
    },
    /// The tick's run cannot be built (its workflow does not validate, its inputs do
    /// not fit).
    #[error("{0}")]
    Invalid(String),
    /// The ledger failed.
    #[error(transparent)]
    Ledger(#[from] flow_ledger::Error),
}

/// The schedules of one configuration and where they were read from.
#[derive(Debug, Clone, Default)]
pub struct Schedules {
    /// The checked entries.
    pub list: Vec<Schedule>,
    /// `config <path>`: who stores their definitions.
    pub source: String,
    /// The configuration file they were read from (`None`: no file).
    pub path: Option<std::path::PathBuf>,
}

/// What a tick that started nothing came to.
const SKIPS: &[HistoryKind] = &[
    HistoryKind::SkippedOverlap,
    HistoryKind::Missed,
    HistoryKind::Buffered,
    HistoryKind::Refused,
];

fn now() -> Timestamp {
    Timestamp(super::now_utc().timestamp_millis())
}

impl Schedules {
    /// `list`, read from the configuration file at `path` (`None`: no file).
    pub fn new(list: Vec<Schedule>, path: Option<&std::path::Path>) -> Self {
        let source = path.map_or_else(
            || "config flow.toml (none found)".to_string(),
            |p| format!("config {}", p.display()),
        );
        Self {
            list,
            source,
            path: path.map(std::path::Path::to_path_buf),
        }
    }

    /// Every schedule: the configuration's, then those workflow files carried
    /// (`flow schedules apply`), read from the ledger's `states` (one `flow.toml`
    /// declares under the same id wins).
    pub fn all(&self, states: &[ScheduleState]) -> Vec<Schedule> {
        let mut out = self.list.clone();
        out.extend(applied(states).filter(|a| !self.list.iter().any(|s| s.id == a.id)));
        out
    }

    fn find(&self, states: &[ScheduleState], id: &str) -> Result<Schedule, Error> {
        self.all(states)
            .into_iter()
            .find(|s| s.id == id)
            .ok_or_else(|| Error::Unknown {
                id: id.to_string(),
                config: self.source.clone(),
            })
    }

    /// Stores schedule `s` if no daemon did yet (a command works before any daemon
    /// ran); a stored one is left as it is, whatever this file says.
    async fn store(&self, ledger: &Ledger, s: &Schedule) -> Result<(), Error> {
        if ledger
            .list_schedules()
            .await?
            .iter()
            .any(|st| st.id == s.id)
        {
            return Ok(());
        }
        ledger
            .sync_schedules(vec![s.def()], &self.source, false, now())
            .await?;
        Ok(())
    }

    /// Every schedule as a reader sees it.
    pub async fn views(&self, ledger: &Ledger) -> Result<Vec<ScheduleView>, Error> {
        let states = ledger.list_schedules().await?;
        let all = self.all(&states);
        let mut out = Vec::with_capacity(all.len());
        for s in &all {
            out.push(view_of(ledger, s, &states).await?);
        }
        Ok(out)
    }

    /// The view of schedule `id` (only its own history is read).
    pub async fn view(&self, ledger: &Ledger, id: &str) -> Result<ScheduleView, Error> {
        let states = ledger.list_schedules().await?;
        let s = self.find(&states, id)?;
        view_of(ledger, &s, &states).await
    }

    /// Pauses (`pause`) or resumes schedule `id` as `who` (a name and a reason).
    pub async fn set_paused(
        &self,
        ledger: &Ledger,
        id: &str,
        pause: bool,
        who: &Actor,
    ) -> Result<ScheduleState, Error> {
        let s = self.find(&ledger.list_schedules().await?, id)?;
        self.store(ledger, &s).await?;
        Ok(ledger.set_schedule_paused(id, pause, who, now()).await?)
    }

    /// Starts one run of schedule `id` now as `who`; its id.
    pub async fn trigger(&self, ledger: &Ledger, id: &str, who: &Actor) -> Result<String, Error> {
        let s = self.find(&ledger.list_schedules().await?, id)?;
        let run_id = format!("sched.{}.manual.{}", s.id, ulid::Ulid::generate());
        let run = s
            .new_run(super::now_utc(), run_id)
            .map_err(Error::Invalid)?;
        self.store(ledger, &s).await?;
        let enq = ledger.trigger_schedule(id, run, who, now()).await?;
        Ok(enq.run.id)
    }
}

/// The schedules workflow files carried, as stored (one whose definition no longer
/// reads is left out, logged).
pub fn applied(states: &[ScheduleState]) -> impl Iterator<Item = Schedule> + '_ {
    states.iter().filter_map(|st| match Schedule::applied(&st.id, &st.definition)? {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(schedule = %st.id, error = %e, "schedule: its stored definition cannot be read");
            None
        }
    })
}

/// `s` as a reader sees it, beside the stored `states`: its latest run and skip read.
async fn view_of(
    ledger: &Ledger,
    s: &Schedule,
    states: &[ScheduleState],
) -> Result<ScheduleView, Error> {
    let last_run = ledger
        .last_tick(&s.id, &[HistoryKind::Started, HistoryKind::Triggered])
        .await?;
    let last_skip = ledger.last_tick(&s.id, SKIPS).await?;
    let state = states.iter().find(|st| st.id == s.id);
    Ok(ScheduleView::of(
        s,
        state,
        last_run,
        last_skip,
        super::now_utc(),
    ))
}
