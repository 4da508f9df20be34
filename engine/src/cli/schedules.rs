//! `flow schedules`: the schedules of `flow.toml` as the ledger holds them — each with
//! its next tick, last run and last skip — and `pause`, `resume`, `trigger`, `history`.
//!
//! The command reads the same `flow.toml` the daemons read; a command that changes a
//! schedule first stores the file's definitions as a daemon would (so it works before
//! any daemon ran), then changes it, recorded with `--by`. `apply FILE` stores the
//! `schedules:` a workflow file carries; they are listed and steered like the others.

use std::io::Write;

use clap::{Args, Subcommand};
use flow_ledger::{HistoryKind, Ledger, Timestamp};
use serde_json::{Value as Json, json};

use super::table::{table, terminal_width};
use super::who::Who;
use super::{Cli, Error, exit, open_ledger};
use crate::config::Config;
use crate::schedule::manage::{self, Schedules};
use crate::schedule::view::TickView;

/// Arguments of `flow schedules`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SchedulesArgs {
    /// What to do (without one: list the schedules).
    #[command(subcommand)]
    pub command: Option<SchedulesCommand>,
    /// Print a JSON array of `{id, workflow, cron, timezone, paused, next_tick,
    /// last_run, last_skip, …}`.
    #[arg(long)]
    pub json: bool,
}

/// `flow schedules` subcommands.
#[derive(Debug, Subcommand)]
pub enum SchedulesCommand {
    /// Stop a schedule's ticks from starting runs (recorded with --by).
    Pause(OneSchedule),
    /// Start its ticks again from now (the ticks of the pause are not caught up).
    Resume(OneSchedule),
    /// Start one run of the schedule now, with its own id (`sched.<id>.manual.<ulid>`).
    Trigger(OneSchedule),
    /// What became of the latest ticks, and who changed what.
    History(HistoryArgs),
    /// Remove a stored schedule whoever declared it (recorded with --by): what settles
    /// an id flow.toml and a workflow file both claim. A daemon whose flow.toml still
    /// declares it stores it again at its next start or reload.
    Remove(OneSchedule),
    /// Store the `schedules:` a workflow file carries (its text with them): every daemon
    /// fires them from the ledger, without the file. Applying the file again changes
    /// them (from their next tick) and removes those it no longer carries.
    Apply(ApplyArgs),
}

/// Arguments of `flow schedules apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The workflow file.
    pub file: std::path::PathBuf,
    /// Who applies it, recorded in each schedule's history.
    #[command(flatten)]
    pub who: Who,
    /// Print JSON: `{workflow, schedules: [{id, change, next_tick}]}`.
    #[arg(long)]
    pub json: bool,
}

/// One schedule and who acts on it.
#[derive(Debug, Args)]
pub struct OneSchedule {
    /// The schedule's id (`[[schedules]] id`).
    pub id: String,
    /// Who and why.
    #[command(flatten)]
    pub who: Who,
}

/// Arguments of `flow schedules history`.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Only this schedule.
    pub id: Option<String>,
    /// Most entries (newest first).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn when(t: Timestamp) -> String {
    t.to_rfc3339()
}

/// The schedules of the configuration `cli` reads.
fn configured(cli: &Cli) -> Result<Schedules, Error> {
    let mut config = Config::load(cli.config.as_deref())?;
    Ok(Schedules::new(
        std::mem::take(&mut config.schedules),
        config.path.as_deref(),
    ))
}

fn refused(e: manage::Error) -> Error {
    match e {
        manage::Error::Unknown { .. } | manage::Error::Invalid(_) => Error::invalid(e.to_string()),
        manage::Error::Ledger(e) => Error::Ledger(e),
    }
}

/// `flow schedules …`.
pub(crate) async fn schedules(
    cli: &Cli,
    args: &SchedulesArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    let schedules = configured(cli)?;
    let ledger = open_ledger(cli).await?;
    match &args.command {
        None => list(&ledger, &schedules, args.json, stdout).await,
        Some(SchedulesCommand::Pause(one) | SchedulesCommand::Resume(one)) => {
            let pause = matches!(args.command, Some(SchedulesCommand::Pause(_)));
            let who = one.who.actor()?;
            let by = &who.by;
            let state = schedules
                .set_paused(&ledger, &one.id, pause, &who)
                .await
                .map_err(refused)?;
            let what = if state.paused { "paused" } else { "resumed" };
            let _ = writeln!(stdout, "schedule {} {what} by {by}", state.id);
            Ok(exit::OK)
        }
        Some(SchedulesCommand::Trigger(one)) => {
            let who = one.who.actor()?;
            let run = schedules
                .trigger(&ledger, &one.id, &who)
                .await
                .map_err(refused)?;
            let _ = writeln!(stdout, "{run}");
            Ok(exit::OK)
        }
        Some(SchedulesCommand::History(h)) => history(&ledger, h, stdout).await,
        Some(SchedulesCommand::Apply(a)) => apply(&ledger, &schedules, a, stdout).await,
        Some(SchedulesCommand::Remove(one)) => {
            let who = one.who.actor()?;
            let now = Timestamp(crate::schedule::now_utc().timestamp_millis());
            ledger
                .remove_schedule(&one.id, &who, now)
                .await
                .map_err(|e| match e {
                    flow_ledger::Error::NotFound { .. } => {
                        Error::invalid(format!("no schedule `{}` is stored", one.id))
                    }
                    e => Error::Ledger(e),
                })?;
            let _ = writeln!(stdout, "schedule {} removed by {}", one.id, who.by);
            Ok(exit::OK)
        }
    }
}

/// `flow schedules apply FILE`: the file validated (schedules included, each tick's
/// run buildable), then its schedules stored in one transaction.
async fn apply(
    ledger: &Ledger,
    configured: &Schedules,
    args: &ApplyArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    use crate::schedule::{Schedule, Target};
    let by = args.who.name()?;
    let (wf, source) = crate::workflow::load_file(&args.file, &crate::snapshot::validate_options())
        .map_err(|d| Error::Diagnostics(d.to_string()))?;
    let file = args.file.display().to_string();
    // The stored definition names the file by its name alone: applying it from another
    // directory (`./t.yaml`, a CI checkout) is not a change.
    let shown = args
        .file
        .file_name()
        .map_or_else(|| file.clone(), |n| n.to_string_lossy().into_owned());
    let mut list = Vec::with_capacity(wf.schedules.len());
    for ws in &wf.schedules {
        if configured.list.iter().any(|c| c.id == ws.fields.id) {
            return Err(Error::invalid(format!(
                "{file}:{}:{}: schedule `{}` is declared in {} too; give this one another id (nothing was applied)",
                ws.at.line,
                ws.at.col,
                ws.fields.id,
                configured
                    .path
                    .as_ref()
                    .map_or_else(|| "flow.toml".to_string(), |p| p.display().to_string())
            )));
        }
        let target = Target::Applied {
            file: shown.clone(),
            name: wf.name.clone(),
            text: source.text.clone(),
        };
        let s = Schedule::new(ws.fields.clone(), target);
        // What no tick could start is refused now, not found at the first tick.
        s.new_run(crate::schedule::now_utc(), format!("sched.{}.check", s.id))
            .map_err(|e| {
                Error::invalid(format!(
                    "{file}:{}:{}: {e} (nothing was applied)",
                    ws.at.line, ws.at.col
                ))
            })?;
        list.push(s);
    }
    let defs = list.iter().map(Schedule::def).collect();
    let now = Timestamp(crate::schedule::now_utc().timestamp_millis());
    let changes = ledger
        .apply_schedules(&wf.name, defs, &by, now)
        .await
        .map_err(|e| match e {
            flow_ledger::Error::Owned { .. } => Error::invalid(format!(
                "{e}; give this one another id (nothing was applied)"
            )),
            e => Error::Ledger(e),
        })?;
    let next = |id: &str| {
        list.iter()
            .find(|s| s.id == id)
            .and_then(|s| s.ticks.next_after(crate::schedule::now_utc()))
            .map(|t| Timestamp(t.timestamp_millis()))
    };
    if args.json {
        let items: Vec<Json> = changes
            .iter()
            .map(|(id, c)| json!({ "id": id, "change": c.as_str(), "next_tick": next(id) }))
            .collect();
        let _ = writeln!(
            stdout,
            "{}",
            json!({ "workflow": wf.name, "schedules": items })
        );
        return Ok(exit::OK);
    }
    if changes.is_empty() {
        let _ = writeln!(
            stdout,
            "{file} carries no schedules; workflow `{}` had none stored",
            wf.name
        );
    }
    for (id, c) in &changes {
        let tick =
            next(id).map_or_else(String::new, |t| format!(" (next tick {})", t.to_rfc3339()));
        let _ = writeln!(stdout, "schedule {id} {}{tick}", c.as_str());
    }
    Ok(exit::OK)
}

async fn list(
    ledger: &Ledger,
    schedules: &Schedules,
    as_json: bool,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    let views = schedules.views(ledger).await.map_err(refused)?;
    if as_json {
        let _ = writeln!(stdout, "{}", json!(views));
        return Ok(exit::OK);
    }
    if views.is_empty() {
        let _ = writeln!(stdout, "no schedules in {}", schedules.source);
        return Ok(exit::OK);
    }
    let tick = |t: &Option<TickView>| {
        t.as_ref().map_or_else(
            || "-".to_string(),
            |t| format!("{} {}", t.outcome, t.tick.to_rfc3339()),
        )
    };
    let lines: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            vec![
                v.id.clone(),
                format!("{} {}", v.cron, v.timezone),
                if v.paused {
                    "paused".into()
                } else {
                    v.next_tick
                        .map_or_else(|| "-".into(), Timestamp::to_rfc3339)
                },
                tick(&v.last_run),
                tick(&v.last_skip),
            ]
        })
        .collect();
    let head = ["ID", "CRON", "NEXT", "LAST RUN", "LAST SKIP"];
    let _ = write!(stdout, "{}", table(&head, &lines, terminal_width()));
    Ok(exit::OK)
}

async fn history(ledger: &Ledger, h: &HistoryArgs, stdout: &mut dyn Write) -> Result<u8, Error> {
    let entries = ledger.schedule_history(h.id.as_deref(), h.limit).await?;
    if h.json {
        let list: Vec<Json> = entries
            .iter()
            .map(|e| {
                json!({
                    "schedule": e.schedule_id, "tick": when(e.tick_at), "outcome": e.kind.as_str(),
                    "run": e.run_id, "last": when(e.last_at), "count": e.count,
                    "by": e.actor, "detail": e.detail, "recorded_at": when(e.recorded_at),
                })
            })
            .collect();
        let _ = writeln!(stdout, "{}", Json::Array(list));
        return Ok(exit::OK);
    }
    for e in &entries {
        let what = match e.kind {
            HistoryKind::Missed => format!("missed {} ticks up to {}", e.count, when(e.last_at)),
            _ => e.kind.as_str().to_string(),
        };
        let extra = [
            e.run_id.as_deref(),
            e.actor.as_deref().map(|_| ""),
            e.detail.as_deref(),
        ]
        .into_iter()
        .flatten()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
        let by = e
            .actor
            .as_deref()
            .map(|a| format!(" by {a}"))
            .unwrap_or_default();
        let _ = writeln!(
            stdout,
            "{} {} {what}{by} {extra}",
            when(e.tick_at),
            e.schedule_id
        );
    }
    Ok(exit::OK)
}
