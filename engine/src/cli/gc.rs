//! `flow gc`: one retention pass by hand, with what `[retention]` in `flow.toml` says;
//! `--dry-run` prints what it would delete and writes nothing.

use std::io::Write;

use clap::Args;
use flow_ledger::{Clock, Kept, SystemClock};

use super::{Cli, Error, exit, open_ledger};
use crate::config::Config;
use crate::retention::gc::{Mode, Report, pass};

/// Arguments of `flow gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Delete nothing: print what would be deleted.
    #[arg(long)]
    pub dry_run: bool,
    /// Delete at most this many rows per second (as a daemon does at `rate`); without
    /// it, as fast as the database allows.
    #[arg(long, value_name = "ROWS_PER_SECOND", value_parser = clap::value_parser!(u32).range(1..))]
    pub rate: Option<u32>,
    /// Print the report as JSON (`{dry_run, runs_deleted, runs_kept, kept, rows,
    /// tombstones}`).
    #[arg(long)]
    pub json: bool,
}

/// Why a run past the horizon stays, in words.
fn kept_words(k: &Kept) -> String {
    match k {
        Kept::NotFinished => "not finished".into(),
        Kept::TooRecent => "finished after the horizon".into(),
        Kept::CallOpen { node, status } => format!("call `{node}` is {status}"),
        Kept::ChildUnfinished { child } => format!("child run {child} has not finished"),
        Kept::ParentUnfinished { parent } => format!("parent run {parent} has not finished"),
    }
}

fn print(report: &Report, stdout: &mut dyn Write) {
    let verb = if report.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    let (runs, tombstones) = (report.runs_deleted, report.tombstones);
    let _ = writeln!(
        stdout,
        "{verb} {runs} run{} and {} rows in all; {tombstones} key tombstone{} {}",
        if runs == 1 { "" } else { "s" },
        report.rows.total(),
        if tombstones == 1 { "" } else { "s" },
        if report.dry_run {
            "would be written"
        } else {
            "written"
        },
    );
    for (table, n) in &report.rows.rows {
        let _ = writeln!(stdout, "  {table:<20} {n}");
    }
    if report.runs_kept > 0 {
        let _ = writeln!(
            stdout,
            "kept {} run{} past the horizon:",
            report.runs_kept,
            if report.runs_kept == 1 { "" } else { "s" }
        );
        for k in &report.kept {
            let _ = writeln!(stdout, "  {}  {}", k.run_id, kept_words(&k.why));
        }
        let named = u64::try_from(report.kept.len()).unwrap_or(u64::MAX);
        if report.runs_kept > named {
            let _ = writeln!(stdout, "  … and {} more", report.runs_kept - named);
        }
    }
}

/// `flow gc`.
pub(crate) async fn gc(cli: &Cli, args: &GcArgs, stdout: &mut dyn Write) -> Result<u8, Error> {
    let config = Config::load(cli.config.as_deref())?;
    let mut retention = config.retention;
    if !retention.is_on() {
        let _ = writeln!(
            stdout,
            "retention is off: flow.toml sets neither `runs` nor `events` under [retention]; nothing deleted"
        );
        return Ok(exit::OK);
    }
    let ledger = open_ledger(cli).await?;
    let mode = match (args.dry_run, args.rate) {
        (true, _) => Mode::DryRun,
        (false, None) => Mode::Now,
        (false, Some(rate)) => {
            retention.rate = rate;
            Mode::Paced
        }
    };
    let report = pass(&ledger, &retention, SystemClock.now(), mode, None, &|_| {})
        .await
        .map_err(|e| Error::unavailable(e.to_string()))?;
    if args.json {
        let _ = writeln!(
            stdout,
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print(&report, stdout);
    }
    Ok(exit::OK)
}
