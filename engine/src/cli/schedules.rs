//! `flow schedules`: the schedules of `flow.toml` as the ledger holds them — each with
//! its next tick, last run and last skip — and `pause`, `resume`, `trigger`, `history`.
//!
//! The command reads the same `flow.toml` the daemons read; a command that changes a
//! schedule first stores the file's definitions as a daemon would (so it works before
//! any daemon ran), then changes it, recorded with `--by`.

use std::io::Write;

use clap::{Args, Subcommand};
use flow_ledger::{HistoryKind, Ledger, Timestamp};
use serde_json::{Value as Json, json};

use super::table::{table, terminal_width};
use super::who::Who;
use super::{Cli, CliError, exit, open_ledger};
use crate::config::Config;
use crate::schedule::manage::{ManageError, Schedules};
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
fn configured(cli: &Cli) -> Result<Schedules, CliError> {
    let mut config = Config::load(cli.config.as_deref())?;
    Ok(Schedules::new(
        std::mem::take(&mut config.schedules),
        config.path.as_deref(),
    ))
}

fn refused(e: ManageError) -> CliError {
    match e {
        ManageError::Unknown { .. } | ManageError::Invalid(_) => CliError::invalid(e.to_string()),
        ManageError::Ledger(e) => CliError::unavailable(e.to_string()),
    }
}

/// `flow schedules …`.
pub(crate) async fn schedules(
    cli: &Cli,
    args: &SchedulesArgs,
    stdout: &mut dyn Write,
) -> Result<u8, CliError> {
    let schedules = configured(cli)?;
    let ledger = open_ledger(cli).await?;
    match &args.command {
        None => list(&ledger, &schedules, args.json, stdout).await,
        Some(SchedulesCommand::Pause(one) | SchedulesCommand::Resume(one)) => {
            let pause = matches!(args.command, Some(SchedulesCommand::Pause(_)));
            let by = one.who.name()?;
            let state = schedules
                .set_paused(&ledger, &one.id, pause, (&by, one.who.reason.as_deref()))
                .await
                .map_err(refused)?;
            let what = if state.paused { "paused" } else { "resumed" };
            let _ = writeln!(stdout, "schedule {} {what} by {by}", state.id);
            Ok(exit::OK)
        }
        Some(SchedulesCommand::Trigger(one)) => {
            let by = one.who.name()?;
            let run = schedules
                .trigger(&ledger, &one.id, (&by, one.who.reason.as_deref()))
                .await
                .map_err(refused)?;
            let _ = writeln!(stdout, "{run}");
            Ok(exit::OK)
        }
        Some(SchedulesCommand::History(h)) => history(&ledger, h, stdout).await,
    }
}

async fn list(
    ledger: &Ledger,
    schedules: &Schedules,
    as_json: bool,
    stdout: &mut dyn Write,
) -> Result<u8, CliError> {
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

async fn history(ledger: &Ledger, h: &HistoryArgs, stdout: &mut dyn Write) -> Result<u8, CliError> {
    let entries = ledger
        .schedule_history(h.id.as_deref(), h.limit)
        .await
        .map_err(|e| CliError::unavailable(e.to_string()))?;
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
