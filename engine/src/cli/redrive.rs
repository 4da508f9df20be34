//! `flow redrive RUN [--from NODE]`: a failed run goes back on the queue; its failed
//! nodes run again as new effect attempts (new keys, the next `_retry<n>` step) while
//! succeeded nodes are replayed (`crate::redrive` picks the nodes, the ledger does it
//! in one transaction). A run with a call in doubt is refused until it is settled.

use std::io::Write;

use clap::Args;
use serde_json::json;

use super::who::Who;
use super::{Cli, Error, exit, open_ledger};
use crate::redrive::{self, redrive as redrive_run};

/// Arguments of `flow redrive`.
#[derive(Debug, Args)]
pub struct RedriveArgs {
    /// The failed run.
    pub run: String,
    /// Also run this node and everything downstream of it again (their succeeded calls
    /// are replayed, never re-sent).
    #[arg(long, value_name = "NODE")]
    pub from: Option<String>,
    /// Who and why.
    #[command(flatten)]
    pub who: Who,
    /// `--server`: redrive through the operator API (its daemons run it).
    #[command(flatten)]
    pub remote: super::Remote,
}

/// `flow redrive` against `--db`: the run is queued for `flow daemon` workers (or a
/// `flow resume RUN` here).
pub(crate) async fn redrive(
    cli: &Cli,
    args: &RedriveArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    let actor = args.who.actor()?;
    let ledger = open_ledger(cli).await?;
    let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
    let done = redrive_run(&ledger, &args.run, args.from.as_deref(), actor, now)
        .await
        .map_err(|e| refused(&args.run, e))?;
    let steps: Vec<&str> = done.steps.iter().map(|(_, s)| s.as_str()).collect();
    let _ = writeln!(stdout, "{} {}", done.run.id, done.run.status);
    let items = match done.items.len() {
        0 => String::new(),
        1 => format!(" and 1 item as {}", done.items[0]),
        n => format!(" and {n} items as {}", ellipsis(&done.items, 5)),
    };
    let asked = match done.approvals_asked_again.as_slice() {
        [] => String::new(),
        nodes => format!(" (approval asked again: {})", nodes.join(", ")),
    };
    let _ = writeln!(
        stderr,
        "run {} redriven: {} run again as {}{items}{asked}; continue with `{} resume {}` or let a daemon take it",
        done.run.id,
        done.steps.len(),
        steps.join(", "),
        super::flow_command(cli),
        done.run.id,
    );
    Ok(exit::OK)
}

/// The first `n` of `ids` joined, and how many more.
fn ellipsis(ids: &[String], n: usize) -> String {
    let shown = ids.iter().take(n).cloned().collect::<Vec<_>>().join(", ");
    match ids.len().saturating_sub(n) {
        0 => shown,
        more => format!("{shown} … ({more} more)"),
    }
}

/// A refused redrive as the command line reports it: the user's mistake (exit 2) or the
/// ledger's trouble (exit 5).
fn refused(run: &str, e: redrive::Error) -> Error {
    use flow_ledger::Error as E;
    match e {
        redrive::Error::Ledger(E::NotFound { .. }) => Error::invalid(format!("no run `{run}`")),
        redrive::Error::Ledger(E::Terminal { status }) => Error::invalid(format!(
            "run {run} is {status}: only a failed run can be redriven"
        )),
        redrive::Error::Ledger(E::InDoubt { since }) => Error::invalid(format!(
            "run {run} has a call in doubt (since {since}): settle it first (`flow show {run}` says how); nothing was written"
        )),
        redrive::Error::Ledger(e @ E::InvalidTransition { .. }) => {
            Error::invalid(format!("cannot redrive run {run}: {e}"))
        }
        e @ (redrive::Error::UnknownNode { .. } | redrive::Error::Child { .. }) => {
            Error::invalid(e.to_string())
        }
        e => Error::unavailable(format!("cannot redrive run {run}: {e}")),
    }
}

/// `flow redrive --server URL`: `POST /api/v1/runs/{id}/redrive`.
pub(crate) async fn remote(
    server: &str,
    args: &RedriveArgs,
    stdout: &mut dyn Write,
) -> Result<u8, Error> {
    args.who.check_remote()?;
    let client = super::remote::client(server, &args.remote)?;
    let body = json!({ "from": args.from, "reason": args.who.reason });
    let v = client
        .post(&["runs", &args.run, "redrive"], &body)
        .await
        .map_err(|e| super::remote::failed(&e, client.has_token()))?;
    let _ = writeln!(
        stdout,
        "{} {}",
        v["run"]["id"].as_str().unwrap_or(&args.run),
        v["run"]["status"].as_str().unwrap_or("?")
    );
    Ok(exit::OK)
}
