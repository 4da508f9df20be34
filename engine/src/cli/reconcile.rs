//! `flow reconcile`: probe every in-doubt call whose tool declares `reconcile:` now, and
//! say what each became (or, with `--dry-run`, would become).
//!
//! Only calls of paused runs are probed: a running run's holder probes its own calls
//! before it pauses, and two probers of one call would only waste the downstream's time
//! (they could not both settle it). A paused run whose last doubt a probe settles is
//! re-queued by the ledger's resolution (the daemons continue it); the command prints
//! how to continue it here instead. A finished run's calls are probed too: found is
//! recorded as succeeded, and nothing is ever re-sent for them.

use std::collections::BTreeSet;
use std::io::Write;

use clap::Args;
use serde_json::json;

use super::error::{Error, LedgerContext};
use super::run::Session;
use super::{Cli, exit};
use crate::reconcile::{ProbeCall, Reconciled, reconcile_call};
use crate::snapshot::snapshot;

/// `flow reconcile` options.
#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// Only this run's calls.
    #[arg(long)]
    pub run: Option<String>,
    /// Probe and report, but record and settle nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// One JSON object per call on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `flow reconcile`.
pub(crate) async fn reconcile(
    cli: &Cli,
    args: &ReconcileArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    let session = Session::open(cli, false, None).await?;
    let filter = flow_ledger::InDoubtFilter {
        run_id: args.run.clone(),
        ..Default::default()
    };
    let calls = session
        .ledger
        .list_in_doubt(filter)
        .await
        .doing(|| "cannot list calls in doubt".into())?;
    let by = format!("flow reconcile ({})", session.worker);
    let mut settled_runs = BTreeSet::new();
    let mut probed = 0usize;
    for c in &calls {
        let run = session
            .ledger
            .get_run(&c.run_id)
            .await
            .doing(|| format!("cannot read run {}", c.run_id))?;
        // A running run's holder probes its own calls; a paused run's and a finished
        // run's (whose outcome is still to be recorded, never re-sent) are probed here.
        let finished = run.status.is_terminal();
        let outcome = if run.status != flow_ledger::RunStatus::Paused && !finished {
            None
        } else {
            let wf = snapshot(&run).map_err(Error::Invalid)?;
            let Some(node) = wf.node(crate::item_id::node_of(&c.tool_call_id)) else {
                continue;
            };
            let call = ProbeCall {
                wf: &wf,
                node,
                call_id: &c.tool_call_id,
                run_id: &c.run_id,
                inputs: &run.inputs,
                by: &by,
                now_regardless: true,
                dry_run: args.dry_run,
                run_live: !finished,
            };
            Some(
                reconcile_call(session.executor.gateway(), call)
                    .await
                    .map_err(|crate::reconcile::Error::Ledger(e)| e)
                    .doing(|| format!("cannot reconcile {}/{}", c.run_id, c.tool_call_id))?,
            )
        };
        if matches!(outcome, Some(Reconciled::Probed { .. })) {
            probed += 1;
        }
        if !finished && matches!(outcome, Some(Reconciled::Probed { settled: true, .. })) {
            settled_runs.insert(c.run_id.clone());
        }
        print(
            stdout,
            args.json,
            &c.run_id,
            &c.tool_call_id,
            &c.current_key,
            outcome.as_ref(),
        );
    }
    let _ = writeln!(
        stderr,
        "{} call(s) in doubt, {probed} probed{}",
        calls.len(),
        if args.dry_run {
            " (dry run: nothing recorded or settled)"
        } else {
            ""
        }
    );
    for run in settled_runs {
        let _ = writeln!(
            stderr,
            "run {run} is queued for the daemons; or continue it here with: {} resume {run}",
            session.flow
        );
    }
    Ok(exit::OK)
}

fn print(
    stdout: &mut dyn Write,
    json: bool,
    run: &str,
    node: &str,
    key: &str,
    outcome: Option<&Reconciled>,
) {
    if json {
        let line = json!({ "run": run, "node": node, "key": key, "outcome": outcome });
        let _ = writeln!(stdout, "{line}");
        return;
    }
    let what = match outcome {
        None => "not probed: the run is running (its holder probes it)".to_string(),
        Some(Reconciled::NotReconcilable) => "not probed: its tool declares no `reconcile`".into(),
        Some(Reconciled::NotInDoubt) => "settled meanwhile by someone else".into(),
        Some(Reconciled::NotDue { at }) => format!("next probe due at {}", at.to_rfc3339()),
        Some(Reconciled::Spent) => "probes spent: resolve it by hand".into(),
        Some(Reconciled::NotAsked { why, .. }) => format!("not probed: {why}"),
        Some(Reconciled::Probed {
            probe,
            observed,
            decision,
            detail,
            ..
        }) => format!(
            "probe {probe}: {} → {}{}",
            observed.as_str(),
            decision.as_str(),
            detail
                .as_ref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default()
        ),
    };
    let _ = writeln!(stdout, "{run}  {node}  key {key}  {what}");
}
