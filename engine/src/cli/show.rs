//! `flow show`, `flow runs`, `flow cancel`: reading and steering runs.

use std::io::Write;

use clap::Args;
use flow_ledger::{CallStatus, Ledger, RunFilter, RunStatus, Timestamp};
use serde_json::{Value as Json, json};

use super::{Cli, exit, open_ledger};
use crate::plan::Plan;

/// Arguments of `flow show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The run id.
    pub run: String,
    /// Print one JSON object: `run`, `steps`, `tool_calls`.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `flow runs`.
#[derive(Debug, Args)]
pub struct RunsArgs {
    /// Only runs in this state (queued, running, succeeded, failed, paused, cancelled).
    #[arg(long)]
    pub status: Option<String>,
    /// Print a JSON array of `{id, status, workflow, created_at, finished_at}`.
    #[arg(long)]
    pub json: bool,
    /// Most runs to list.
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
}

/// Arguments of `flow cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The run id.
    pub run: String,
}

fn ts(t: Option<Timestamp>) -> Json {
    t.map_or(Json::Null, |t| Json::String(t.to_rfc3339()))
}

/// The `flow show --json` object (the shape the README's CLI reference documents, plus a
/// few extra fields).
pub(crate) async fn show_json(ledger: &Ledger, run_id: &str) -> Result<Json, flow_ledger::Error> {
    let run = ledger.get_run(run_id).await?;
    let steps = ledger.list_steps(run_id).await?;
    let calls = ledger.list_calls(run_id).await?;
    Ok(json!({
        "run": {
            "id": run.id,
            "status": run.status.as_str(),
            "workflow": run.workflow_name,
            "created_at": run.created_at.to_rfc3339(),
            "started_at": ts(run.started_at),
            "finished_at": ts(run.finished_at),
            "error": run.error.or(run.pause_reason),
            "inputs": run.inputs,
            "output": run.output,
        },
        "steps": steps.iter().map(|s| json!({
            "step_id": s.step_id,
            "node_id": s.node_id,
            "retry": s.retry,
            "status": s.status.as_str(),
            "not_before": ts(s.not_before),
            "started_at": ts(s.started_at),
            "finished_at": ts(s.finished_at),
            "error": s.error_message.as_ref().map(|m| json!({"kind": s.error_kind.map(|k| k.as_str()), "message": m})),
        })).collect::<Vec<_>>(),
        "tool_calls": calls.iter().map(|c| json!({
            "tool_call_id": c.tool_call_id,
            "tool": c.tool,
            "status": c.status.as_str(),
            "attempt_count": c.attempt_count,
            "outbound_requests": c.outbound_requests,
            "idempotency_key": c.idempotency_key,
            "current_key": c.current_key,
            "outbound_started_at": ts(c.outbound_started_at),
            "error": c.error_message.as_ref().map(|m| json!({"kind": c.error_kind.map(|k| k.as_str()), "message": m})),
            "resolution": c.resolution.as_ref().map(|r| json!({"how": r, "by": c.resolved_by, "at": ts(c.resolved_at)})),
        })).collect::<Vec<_>>(),
    }))
}

pub(crate) async fn print_json(
    ledger: &Ledger,
    run_id: &str,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    match show_json(ledger, run_id).await {
        Ok(v) => {
            let _ = writeln!(
                stdout,
                "{}",
                serde_json::to_string_pretty(&v).unwrap_or_default()
            );
            exit::OK
        }
        Err(e) => report(stderr, run_id, &e),
    }
}

fn report(stderr: &mut dyn Write, run_id: &str, e: &flow_ledger::Error) -> u8 {
    if matches!(e, flow_ledger::Error::NotFound { .. }) {
        let _ = writeln!(stderr, "error: no run `{run_id}`");
        exit::INVALID
    } else {
        let _ = writeln!(stderr, "error: {e}");
        exit::UNAVAILABLE
    }
}

/// `flow show`.
pub(crate) async fn show(
    cli: &Cli,
    args: &ShowArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let ledger = match open_ledger(cli, stderr).await {
        Ok(l) => l,
        Err(code) => return code,
    };
    if args.json {
        return print_json(&ledger, &args.run, stdout, stderr).await;
    }
    match human(&ledger, &args.run).await {
        Ok(text) => {
            let _ = stdout.write_all(text.as_bytes());
            exit::OK
        }
        Err(e) => report(stderr, &args.run, &e),
    }
}

/// The human view: the DAG in order, each node's steps and call, and for every call in
/// doubt the exact commands that resolve it.
async fn human(ledger: &Ledger, run_id: &str) -> Result<String, flow_ledger::Error> {
    use std::fmt::Write as _;
    let run = ledger.get_run(run_id).await?;
    let steps = ledger.list_steps(run_id).await?;
    let calls = ledger.list_calls(run_id).await?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "run {}  {}  workflow {}",
        run.id, run.status, run.workflow_name
    );
    let _ = writeln!(
        out,
        "  created {}  finished {}",
        run.created_at.to_rfc3339(),
        run.finished_at.map_or("-".into(), |t| t.to_rfc3339())
    );
    if let Some(e) = run.error.as_ref().or(run.pause_reason.as_ref()) {
        let _ = writeln!(out, "  {e}");
    }
    let order: Vec<String> = match crate::snapshot::snapshot(&run) {
        Ok(wf) => match Plan::new(&wf) {
            Ok(plan) => plan
                .order()
                .iter()
                .map(|&i| wf.nodes[i].id.clone())
                .collect(),
            Err(_) => Vec::new(),
        },
        Err(_) => Vec::new(),
    };
    let mut nodes = order;
    for s in &steps {
        if !nodes.contains(&s.node_id) {
            nodes.push(s.node_id.clone());
        }
    }
    let mut in_doubt = Vec::new();
    let _ = writeln!(out);
    for node in &nodes {
        let node_steps: Vec<_> = steps.iter().filter(|s| &s.node_id == node).collect();
        let call = calls.iter().find(|c| &c.tool_call_id == node);
        let state = node_steps
            .last()
            .map_or("not started", |s| s.status.as_str());
        let _ = writeln!(out, "{node}  {state}");
        for s in &node_steps {
            let _ = writeln!(out, "{}", step_line(s));
        }
        if let Some(c) = call {
            let _ = writeln!(
                out,
                "    call {}  tool {}  attempts {}  requests sent {}  key {}",
                c.status, c.tool, c.attempt_count, c.outbound_requests, c.current_key
            );
            if let Some(how) = &c.resolution {
                let _ = writeln!(
                    out,
                    "    resolved {how} by {} at {}",
                    c.resolved_by.as_deref().unwrap_or("?"),
                    c.resolved_at.map_or("?".into(), |t| t.to_rfc3339())
                );
            }
            if c.status == CallStatus::InDoubt {
                in_doubt.push(c.clone());
            }
        }
    }
    if !in_doubt.is_empty() {
        let _ = writeln!(
            out,
            "\nIn doubt: the request left and no outcome was recorded. Check the downstream"
        );
        let _ = writeln!(
            out,
            "(look for the idempotency key), then settle each call with one of:"
        );
        for c in in_doubt {
            let _ = writeln!(
                out,
                "\n  # {} (key {}, outbound at {})",
                c.tool_call_id,
                c.current_key,
                c.outbound_started_at.map_or("?".into(), |t| t.to_rfc3339())
            );
            let _ = writeln!(
                out,
                "  flow resume {run_id} --resolve {}=succeeded --output '<the JSON output>'   # it happened",
                c.tool_call_id
            );
            let _ = writeln!(
                out,
                "  flow resume {run_id} --resolve {}=failed --error '<why>'                  # it did not happen; fail the node",
                c.tool_call_id
            );
            let _ = writeln!(
                out,
                "  flow resume {run_id} --resolve {}=retry                                 # re-send with the same key",
                c.tool_call_id
            );
        }
    }
    Ok(out)
}

/// One step of the human view: id, status, how long it took, when a pending retry is
/// due, and its error.
fn step_line(s: &flow_ledger::Step) -> String {
    use std::fmt::Write as _;
    let mut line = format!("    step {:<24} {:<10}", s.step_id, s.status.as_str());
    if let (Some(a), Some(b)) = (s.started_at, s.finished_at) {
        let _ = write!(line, " {}ms", b.0 - a.0);
    }
    if let Some(nb) = s
        .not_before
        .filter(|_| s.status == flow_ledger::StepStatus::Pending)
    {
        let _ = write!(line, " not before {}", nb.to_rfc3339());
    }
    if let Some(m) = &s.error_message {
        let _ = write!(
            line,
            " {}: {m}",
            s.error_kind.map_or("error", |k| k.as_str())
        );
    }
    line.trim_end().to_string()
}

/// `flow runs`.
pub(crate) async fn runs(
    cli: &Cli,
    args: &RunsArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let status = match &args.status {
        None => None,
        Some(s) => match s.parse::<RunStatus>() {
            Ok(st) => Some(st),
            Err(_) => {
                let _ = writeln!(
                    stderr,
                    "error: unknown status `{s}`; use queued, running, succeeded, failed, paused or cancelled"
                );
                return exit::INVALID;
            }
        },
    };
    let ledger = match open_ledger(cli, stderr).await {
        Ok(l) => l,
        Err(code) => return code,
    };
    let runs = match ledger
        .list_runs(RunFilter {
            status,
            limit: args.limit,
        })
        .await
    {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(stderr, "error: {e}");
            return exit::UNAVAILABLE;
        }
    };
    if args.json {
        let list: Vec<Json> = runs
            .iter()
            .map(|r| json!({"id": r.id, "status": r.status.as_str(), "workflow": r.workflow_name, "created_at": r.created_at.to_rfc3339(), "finished_at": ts(r.finished_at)}))
            .collect();
        let _ = writeln!(
            stdout,
            "{}",
            serde_json::to_string_pretty(&list).unwrap_or_default()
        );
    } else {
        for r in &runs {
            let _ = writeln!(
                stdout,
                "{:<32} {:<10} {:<24} {}",
                r.id,
                r.status.as_str(),
                r.workflow_name,
                r.created_at.to_rfc3339()
            );
        }
    }
    exit::OK
}

/// `flow cancel`.
pub(crate) async fn cancel(
    cli: &Cli,
    args: &CancelArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let ledger = match open_ledger(cli, stderr).await {
        Ok(l) => l,
        Err(code) => return code,
    };
    let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
    match ledger.request_cancel(&args.run, now).await {
        Ok(run) => {
            let _ = writeln!(stdout, "{} {}", run.id, run.status);
            if run.status == RunStatus::Cancelled {
                let _ = writeln!(stderr, "run {} cancelled", run.id);
            } else {
                let _ = writeln!(
                    stderr,
                    "cancellation requested: run {} stops starting steps, lets in-flight calls finish, then ends cancelled",
                    run.id
                );
            }
            exit::OK
        }
        Err(flow_ledger::Error::Terminal { status }) => {
            let _ = writeln!(
                stderr,
                "error: run {} already finished ({status})",
                args.run
            );
            exit::INVALID
        }
        Err(e) => report(stderr, &args.run, &e),
    }
}
