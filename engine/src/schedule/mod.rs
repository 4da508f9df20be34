//! Schedules: `[[schedules]]` in `flow.toml`, fired by every `flow daemon` that reads
//! it, exactly once per tick however many daemons run.
//!
//! ```toml
//! [[schedules]]
//! id = "nightly"
//! workflow = "workflows/reconcile-payments.yaml"   # relative to flow.toml
//! cron = "0 2 * * *"                               # six fields: seconds first
//! timezone = "Europe/Paris"                        # IANA; default UTC
//! inputs = { region = "eu", date = "${{ schedule.time }}" }
//! overlap = "skip"                                 # skip | buffer_one | allow
//! catchup_window = "6h"                            # default 1m
//! ```
//!
//! - [`ticks`](crate::workflow::ticks) and
//!   [`schedule_fields`](crate::workflow::schedule_fields) (in the language, since a
//!   workflow file's `schedules:` are checked by the same rules): when a schedule's
//!   ticks fall, and the fields of one schedule checked wherever they are written.
//! - [`fire`]: the daemon's pass — for each schedule, the ticks after its cursor become a
//!   [`flow_ledger::TickPlan`] (missed, to start, buffered) that the ledger applies once.
//! - [`manage`]: what the CLI, the API and the console do to schedules (list, pause,
//!   resume, trigger), one implementation; [`view`]: a schedule as they show it.
//! - this file: the configuration, checked when `flow.toml` is read (file:line:col).

pub mod fire;
pub mod manage;
pub mod view;

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use flow_ledger::{NewRun, Overlap, ScheduleDef};
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use crate::workflow::Pos;
use crate::workflow::expr::Template;
pub use crate::workflow::schedule_fields::DEFAULT_CATCHUP;
use crate::workflow::schedule_fields::{Fields, Written};
use crate::workflow::ticks::Ticks;

/// One `[[schedules]]` entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// The schedule's id: part of each tick's run id.
    pub id: toml::Spanned<String>,
    /// The workflow file, relative to `flow.toml`.
    pub workflow: toml::Spanned<String>,
    /// Five fields (six with seconds first) or `@hourly`-style names.
    pub cron: toml::Spanned<String>,
    /// An IANA time zone name; UTC when absent.
    #[serde(default)]
    pub timezone: Option<toml::Spanned<String>>,
    /// The run's inputs; strings may read `${{ schedule.time }}` (the tick, RFC 3339)
    /// and `${{ schedule.id }}`.
    #[serde(default)]
    pub inputs: Map<String, Json>,
    /// `skip` (default), `buffer_one` or `allow`.
    #[serde(default)]
    pub overlap: Option<toml::Spanned<String>>,
    /// How late a tick may still start (e.g. `6h`); default 1m.
    #[serde(default)]
    pub catchup_window: Option<toml::Spanned<String>>,
}

/// Which workflow a schedule's ticks run, and where its text comes from.
#[derive(Debug, Clone)]
pub enum Target {
    /// A file `flow.toml` names: read and checked at each tick, so an edit takes effect
    /// at the next one.
    File {
        /// The file (resolved against `flow.toml`'s directory).
        path: PathBuf,
        /// The file as written in `flow.toml`: what the stored definition holds, so
        /// daemons reading the same file from other directories agree on it.
        written: String,
    },
    /// A workflow whose `schedules:` were stored with `flow schedules apply`: its text
    /// as applied (sub-workflows included), so every daemon on every host runs the
    /// same one without the file; applying the file again changes it.
    Applied {
        /// The file as given to `apply` (shown, not read).
        file: String,
        /// The workflow's name: the schedules' owner (`applied_from`).
        name: String,
        /// The whole text.
        text: String,
    },
}

/// A schedule, checked.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Its id.
    pub id: String,
    /// The workflow its ticks run.
    pub target: Target,
    /// The cron expression as written.
    pub cron: String,
    /// The time zone as written (`UTC` when absent).
    pub timezone: String,
    /// When its ticks fall.
    pub ticks: Ticks,
    /// The inputs, as written (templates rendered per tick).
    pub inputs: Map<String, Json>,
    /// What a tick does while the previous run is unfinished.
    pub overlap: Overlap,
    /// How late a tick may still start.
    pub catchup: Duration,
}

/// A schedule's workflow, read and checked once for the ticks of one pass.
pub struct Loaded {
    wf: crate::workflow::ValidWorkflow,
    text: String,
}

/// A problem of one schedule: where (a byte offset into `flow.toml`) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Byte offset of the offending value.
    pub at: usize,
    /// What is wrong.
    pub message: String,
}

impl ScheduleConfig {
    /// Checks the entry; `base` is `flow.toml`'s directory.
    pub fn check(&self, base: &Path) -> Result<Schedule, Problem> {
        let at = |s: &toml::Spanned<String>| (s.get_ref().clone(), s.span().start);
        let written = Written {
            id: at(&self.id),
            cron: at(&self.cron),
            timezone: self.timezone.as_ref().map(at),
            inputs: (self.inputs.clone(), self.id.span().start),
            overlap: self.overlap.as_ref().map(at),
            catchup_window: self.catchup_window.as_ref().map(at),
        };
        let fields = written
            .check()
            .map_err(|(at, message)| Problem { at, message })?;
        let workflow = self.workflow.get_ref();
        if workflow.trim().is_empty() {
            return Err(Problem {
                at: self.workflow.span().start,
                message: format!("schedule `{}`: `workflow` is empty", fields.id),
            });
        }
        Ok(Schedule::new(
            fields,
            Target::File {
                path: base.join(workflow),
                written: workflow.clone(),
            },
        ))
    }
}

/// `v` with each string's templates rendered in `ctx`.
fn render(v: &Json, ctx: &Json) -> Result<Json, String> {
    Ok(match v {
        Json::String(s) if s.contains("${{") => Template::parse(s, Pos { line: 1, col: 1 })
            .and_then(|t| t.render(ctx))
            .map_err(|e| e.to_string())?,
        Json::Array(a) => Json::Array(a.iter().map(|x| render(x, ctx)).collect::<Result<_, _>>()?),
        Json::Object(m) => Json::Object(
            m.iter()
                .map(|(k, x)| Ok((k.clone(), render(x, ctx)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

/// Now, as schedules judge it: `SystemClock` (the PostgreSQL server's clock where the
/// ledger has one), so a daemon whose wall clock is ahead never fires a tick early nor
/// records future ticks as missed, and one behind never fires late.
pub fn now_utc() -> DateTime<Utc> {
    let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
    DateTime::from_timestamp_millis(now.as_millis()).unwrap_or_else(Utc::now)
}

/// A tick's nominal time as RFC 3339 (UTC, seconds).
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The run id of schedule `id`'s tick at `t`: `sched.<id>.<YYYYMMDDTHHMMSSZ>`, the same
/// for every daemon that computes it (a run id cannot hold the `:` of RFC 3339).
pub fn tick_run_id(id: &str, t: DateTime<Utc>) -> String {
    format!("sched.{id}.{}", t.format("%Y%m%dT%H%M%SZ"))
}

impl Schedule {
    /// A schedule of `fields` that runs `target`.
    pub fn new(fields: Fields, target: Target) -> Self {
        let Fields {
            id,
            cron,
            timezone,
            ticks,
            inputs,
            overlap,
            catchup,
        } = fields;
        Self {
            id,
            target,
            cron,
            timezone,
            ticks,
            inputs,
            overlap,
            catchup,
        }
    }

    /// A schedule a workflow file carried, stored by `flow schedules apply`: read back
    /// from its stored definition; `None` for one `flow.toml` declares.
    pub fn applied(id: &str, definition: &Json) -> Option<Result<Self, String>> {
        let name = flow_ledger::applied_from(definition)?;
        let text = |key: &str| definition.get(key).and_then(Json::as_str).unwrap_or("");
        Some(Fields::of_definition(id, definition).map(|fields| {
            Self::new(
                fields,
                Target::Applied {
                    file: text("workflow").to_string(),
                    name: name.to_string(),
                    text: text("text").to_string(),
                },
            )
        }))
    }

    /// The definition the ledger stores and compares (its hash tells a change).
    pub fn def(&self) -> ScheduleDef {
        let mut m = Fields::definition(&self.fields());
        match &self.target {
            Target::File { written, .. } => {
                m.insert("workflow".into(), json!(written));
            }
            Target::Applied { file, name, text } => {
                m.insert("workflow".into(), json!(file));
                m.insert(flow_ledger::APPLIED_FROM.into(), json!(name));
                m.insert("text".into(), json!(text));
            }
        }
        ScheduleDef {
            id: self.id.clone(),
            definition: Json::Object(m),
        }
    }

    /// The fields again (what a definition holds besides the workflow).
    fn fields(&self) -> Fields {
        Fields {
            id: self.id.clone(),
            cron: self.cron.clone(),
            timezone: self.timezone.clone(),
            ticks: self.ticks.clone(),
            inputs: self.inputs.clone(),
            overlap: self.overlap,
            catchup: self.catchup,
        }
    }

    /// The workflow its ticks run, as an operator reads it: the file, or the file as
    /// applied.
    pub fn workflow_label(&self) -> String {
        match &self.target {
            Target::File { path, .. } => path.display().to_string(),
            Target::Applied { file, .. } => file.clone(),
        }
    }

    /// The run of the tick at `t` (`run_id`), its workflow read and checked now, so an
    /// edit of the file takes effect at the next tick; or why it cannot start.
    pub fn new_run(&self, t: DateTime<Utc>, run_id: String) -> Result<NewRun, String> {
        self.run_of(&self.load()?, t, run_id)
    }

    /// The schedule's workflow, read and checked now; or why it cannot be used.
    pub fn load(&self) -> Result<Loaded, String> {
        let opts = crate::snapshot::validate_options();
        let fail = |d: crate::workflow::Diagnostics| {
            format!("schedule `{}`: {}", self.id, d.to_string().trim_end())
        };
        match &self.target {
            Target::File { path, .. } => crate::workflow::load_file(path, &opts)
                .map(|(wf, source)| Loaded {
                    wf,
                    text: source.text,
                })
                .map_err(fail),
            Target::Applied { file, name, text } => {
                crate::workflow::parse_named(text, &format!("{file} (as applied)"), name, &opts)
                    .map(|wf| Loaded {
                        wf,
                        text: text.clone(),
                    })
                    .map_err(fail)
            }
        }
    }

    /// The run of the tick at `t` (`run_id`) of the workflow `loaded`.
    pub fn run_of(
        &self,
        loaded: &Loaded,
        t: DateTime<Utc>,
        run_id: String,
    ) -> Result<NewRun, String> {
        let Loaded { wf, text } = loaded;
        let ctx = json!({ "schedule": { "time": rfc3339(t), "id": self.id } });
        let given = match render(&Json::Object(self.inputs.clone()), &ctx)? {
            Json::Object(m) => m,
            _ => Map::new(),
        };
        let inputs = crate::inputs::from_json(wf, given)
            .map_err(|e| format!("schedule `{}`: {e}", self.id))?;
        Ok(NewRun {
            id: run_id,
            workflow_name: wf.name.clone(),
            workflow_text: text.clone(),
            inputs,
            priority: 0,
            not_before: None,
            trace_parent: None,
        })
    }
}

/// Checks every `[[schedules]]` entry of a `flow.toml` in `base`: the schedules, or the
/// first problem. Ids are unique.
pub fn check_all(entries: &[ScheduleConfig], base: &Path) -> Result<Vec<Schedule>, Problem> {
    let mut out: Vec<Schedule> = Vec::with_capacity(entries.len());
    for e in entries {
        let s = e.check(base)?;
        if out.iter().any(|o| o.id == s.id) {
            return Err(Problem {
                at: e.id.span().start,
                message: format!("schedule `{}`: the id is used twice", s.id),
            });
        }
        out.push(s);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_run_id_is_the_schedule_and_the_tick() {
        let t = DateTime::parse_from_rfc3339("2026-03-29T01:30:00Z")
            .expect("time")
            .with_timezone(&Utc);
        let id = tick_run_id("nightly", t);
        assert_eq!(id, "sched.nightly.20260329T013000Z");
        assert!(flow_ledger::ids::check_id(flow_ledger::ids::IdKind::Run, &id).is_ok());
        assert_eq!(rfc3339(t), "2026-03-29T01:30:00Z");
    }

    #[test]
    fn inputs_render_the_tick() {
        let mut inputs = Map::new();
        inputs.insert("date".into(), json!("${{ schedule.time }}"));
        inputs.insert("tags".into(), json!(["x", "${{ schedule.id }}"]));
        let ctx = json!({ "schedule": { "time": "T", "id": "s" } });
        assert_eq!(
            render(&Json::Object(inputs), &ctx).expect("render"),
            json!({ "date": "T", "tags": ["x", "s"] })
        );
    }
}
