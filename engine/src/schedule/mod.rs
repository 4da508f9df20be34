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
//! - [`ticks`]: when a schedule's ticks fall (cron on a time zone's wall clock, the
//!   daylight-saving rules).
//! - [`fire`]: the daemon's pass — for each schedule, the ticks after its cursor become a
//!   [`flow_ledger::TickPlan`] (missed, to start, buffered) that the ledger applies once.
//! - [`manage`]: what the CLI, the API and the console do to schedules (list, pause,
//!   resume, trigger), one implementation; [`view`]: a schedule as they show it.
//! - this file: the configuration, checked when `flow.toml` is read (file:line:col).

pub mod fire;
pub mod manage;
pub mod ticks;
pub mod view;

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use flow_ledger::{NewRun, Overlap, ScheduleDef};
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use crate::workflow::Pos;
use crate::workflow::expr::{self, Template};
use ticks::Ticks;

/// The catch-up window of a schedule that sets none: a tick a daemon comes to later
/// than this (no daemon ran) is recorded missed rather than started.
pub const DEFAULT_CATCHUP: Duration = Duration::from_secs(60);

/// Longest catch-up window.
const MAX_CATCHUP: Duration = Duration::from_secs(31 * 24 * 3600);

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

/// A schedule, checked.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Its id.
    pub id: String,
    /// The workflow file (resolved against `flow.toml`'s directory).
    pub workflow: PathBuf,
    /// The workflow file as written in `flow.toml`: what the stored definition holds,
    /// so daemons reading the same file from other directories agree on it.
    pub workflow_written: String,
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
        let id = self.id.get_ref();
        let bad = |at: usize, message: String| Problem {
            at,
            message: format!("schedule `{id}`: {message}"),
        };
        if id.is_empty()
            || id.len() > 64
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(bad(
                self.id.span().start,
                "an id is 1 to 64 letters, digits, `_` or `-` (it is part of each tick's run id)"
                    .into(),
            ));
        }
        let zone = self.timezone.as_ref();
        let ticks =
            Ticks::parse(self.cron.get_ref(), zone.map(|z| z.get_ref().as_str())).map_err(|e| {
                let at = match (&e, zone) {
                    (ticks::TicksError::Zone(_), Some(z)) => z.span().start,
                    _ => self.cron.span().start,
                };
                bad(at, e.to_string())
            })?;
        let overlap = match self.overlap.as_ref().map(|o| (o.get_ref().as_str(), o)) {
            None | Some(("skip", _)) => Overlap::Skip,
            Some(("buffer_one", _)) => Overlap::BufferOne,
            Some(("allow", _)) => Overlap::Allow,
            Some((other, o)) => {
                return Err(bad(
                    o.span().start,
                    format!("overlap `{other}` is not one of skip, buffer_one, allow"),
                ));
            }
        };
        let catchup = match &self.catchup_window {
            None => DEFAULT_CATCHUP,
            Some(w) => humantime::parse_duration(w.get_ref())
                .ok()
                .filter(|d| *d <= MAX_CATCHUP)
                .ok_or_else(|| {
                    bad(
                        w.span().start,
                        format!(
                            "catchup_window `{}` is not a duration of at most 31 days (e.g. 30s, 6h)",
                            w.get_ref()
                        ),
                    )
                })?,
        };
        check_inputs(&self.inputs).map_err(|m| bad(self.id.span().start, m))?;
        let workflow = self.workflow.get_ref();
        if workflow.trim().is_empty() {
            return Err(bad(
                self.workflow.span().start,
                "`workflow` is empty".into(),
            ));
        }
        Ok(Schedule {
            id: id.clone(),
            workflow: base.join(workflow),
            workflow_written: workflow.clone(),
            cron: self.cron.get_ref().clone(),
            timezone: zone.map_or_else(|| "UTC".to_string(), |z| z.get_ref().clone()),
            ticks,
            inputs: self.inputs.clone(),
            overlap,
            catchup,
        })
    }
}

/// Each string input's templates parse and read only `schedule.*`.
fn check_inputs(inputs: &Map<String, Json>) -> Result<(), String> {
    for (name, v) in inputs {
        for s in strings(v) {
            let t = Template::parse(s, Pos { line: 1, col: 1 })
                .map_err(|e| format!("input `{name}`: {e}"))?;
            for src in t.exprs() {
                if let Some(r) = expr::references(src)
                    .into_iter()
                    .find(|r| !(r == "schedule" || r.starts_with("schedule.")))
                {
                    return Err(format!(
                        "input `{name}` reads `{r}`: a schedule's inputs may read only `schedule.time` and `schedule.id`"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The strings inside a JSON value.
fn strings(v: &Json) -> Vec<&str> {
    match v {
        Json::String(s) => vec![s.as_str()],
        Json::Array(a) => a.iter().flat_map(strings).collect(),
        Json::Object(m) => m.values().flat_map(strings).collect(),
        _ => Vec::new(),
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
    /// The definition the ledger stores and compares (its hash tells a change).
    pub fn def(&self) -> ScheduleDef {
        ScheduleDef {
            id: self.id.clone(),
            definition: json!({
                "workflow": self.workflow_written,
                "cron": self.cron,
                "timezone": self.timezone,
                "inputs": self.inputs,
                "overlap": self.overlap.as_str(),
                "catchup_window": humantime::format_duration(self.catchup).to_string(),
            }),
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
        crate::workflow::load_file(&self.workflow, &opts)
            .map(|(wf, source)| Loaded {
                wf,
                text: source.text,
            })
            .map_err(|d| format!("schedule `{}`: {}", self.id, d.to_string().trim_end()))
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
    fn inputs_render_the_tick_and_read_nothing_else() {
        let mut inputs = Map::new();
        inputs.insert("date".into(), json!("${{ schedule.time }}"));
        inputs.insert("tags".into(), json!(["x", "${{ schedule.id }}"]));
        assert!(check_inputs(&inputs).is_ok());
        let ctx = json!({ "schedule": { "time": "T", "id": "s" } });
        assert_eq!(
            render(&Json::Object(inputs), &ctx).expect("render"),
            json!({ "date": "T", "tags": ["x", "s"] })
        );
        let mut bad = Map::new();
        bad.insert("x".into(), json!("${{ inputs.y }}"));
        let e = check_inputs(&bad).expect_err("reads inputs");
        assert!(e.contains("reads `inputs.y`"), "{e}");
    }
}
