//! `flow show`, `flow runs`, `flow cancel`: reading and steering runs.

use std::io::Write;

use clap::Args;
use flow_ledger::{CallStatus, Ledger, RunCursor, RunFilter, RunStatus, Timestamp};

use super::table::{first_line, table, terminal_width};
use super::{Cli, Error, exit, open_ledger};
use crate::duration_text::duration_ms;
use crate::view::{CallView, RunSummary, RunView, parse_time};

/// Arguments of `flow show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The run id.
    pub run: String,
    /// Print one JSON object: `run`, `steps`, `tool_calls`.
    #[arg(long)]
    pub json: bool,
    /// Client mode: read through a `flow serve` instead of the database.
    #[command(flatten)]
    pub remote: super::Remote,
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
    /// Most runs to list (at least 1); when there are more, the command for the next
    /// page is printed on stderr.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    /// Only runs of this workflow (its `name:`).
    #[arg(long)]
    pub workflow: Option<String>,
    /// Only runs created at or after this time: RFC 3339 (`2026-12-01T09:00:00Z`) or a
    /// duration ago (`2h`, `30m`).
    #[arg(long)]
    pub since: Option<String>,
    /// Only runs created before this time (same forms as `--since`).
    #[arg(long)]
    pub until: Option<String>,
    /// Only runs whose input NAME is VALUE (a string, or a number or boolean as JSON:
    /// `order_id=117` matches 117 and "117"). Repeatable; all must match.
    #[arg(long = "input", value_name = "NAME=VALUE")]
    pub inputs: Vec<String>,
    /// Only runs whose id starts with this text.
    #[arg(long, value_name = "TEXT")]
    pub prefix: Option<String>,
    /// Only the children of this run: the runs its sub-workflow nodes started.
    #[arg(long, value_name = "RUN")]
    pub parent: Option<String>,
    /// Continue a listing after the page that printed this cursor.
    #[arg(long)]
    pub cursor: Option<String>,
    /// Client mode: list through a `flow serve` instead of the database.
    #[command(flatten)]
    pub remote: super::Remote,
}

/// Arguments of `flow cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The run id.
    pub run: String,
    /// Who and why (recorded in the run's audit trail).
    #[command(flatten)]
    pub who: super::who::Who,
    /// Client mode: cancel through a `flow serve` instead of the database.
    #[command(flatten)]
    pub remote: super::Remote,
}

/// Prints the `flow show --json` object of `run_id` on `stdout`; a failure to read it
/// is reported on `stderr`. The exit code: 0, or the error's.
pub(crate) async fn print_json(
    ledger: &Ledger,
    run_id: &str,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    super::error::finish(write_json(ledger, run_id, stdout).await, stderr)
}

async fn write_json(ledger: &Ledger, run_id: &str, stdout: &mut dyn Write) -> Result<u8, Error> {
    let v = RunView::load(ledger, run_id)
        .await
        .map_err(|e| run_error(run_id, e))?;
    let _ = writeln!(
        stdout,
        "{}",
        serde_json::to_string_pretty(&v).unwrap_or_default()
    );
    Ok(exit::OK)
}

/// A ledger error while reading `run_id`: an unknown run is the user's input (exit 2),
/// anything else the ledger's (exit 5).
fn run_error(run_id: &str, e: flow_ledger::Error) -> Error {
    if matches!(e, flow_ledger::Error::NotFound { .. }) {
        Error::invalid(format!("no run `{run_id}`"))
    } else {
        Error::Ledger(e)
    }
}

/// `flow show`.
pub(crate) async fn show(cli: &Cli, args: &ShowArgs, stdout: &mut dyn Write) -> Result<u8, Error> {
    let ledger = open_ledger(cli).await?;
    if args.json {
        return write_json(&ledger, &args.run, stdout).await;
    }
    let resume = format!("{} resume", super::flow_command(cli));
    let text = human(&ledger, &args.run, &resume)
        .await
        .map_err(|e| run_error(&args.run, e))?;
    let approvals = approvals_text(&ledger, &args.run, &resume)
        .await
        .map_err(|e| run_error(&args.run, e))?;
    let waits = waits_text(&ledger, &args.run)
        .await
        .map_err(|e| run_error(&args.run, e))?;
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.write_all(approvals.as_bytes());
    let _ = stdout.write_all(waits.as_bytes());
    Ok(exit::OK)
}

/// The run's waits for the human view: what each node waits for (or waited for), its
/// deadline and how it ended.
async fn waits_text(ledger: &Ledger, run_id: &str) -> Result<String, flow_ledger::Error> {
    use std::fmt::Write as _;
    let filter = flow_ledger::WaitFilter {
        run_id: Some(run_id.to_owned()),
        status: None,
        limit: 1000,
    };
    let list = ledger.list_waits(filter).await?;
    let mut out = String::new();
    if list.is_empty() {
        return Ok(out);
    }
    let _ = writeln!(out, "\nWaits:");
    for w in &list {
        let what = match &w.event_name {
            Some(name) => format!("event {name}"),
            None => "callback".to_owned(),
        };
        let how = match (&w.event_id, &w.error) {
            (Some(id), _) => format!("  by event {id}"),
            (None, Some(e)) => format!("  error: {e}"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  {}  {}  {what}  deadline {}{how}",
            w.node_id,
            w.status,
            w.deadline.to_rfc3339()
        );
        if w.status == flow_ledger::WaitStatus::Pending
            && let Some(name) = &w.event_name
        {
            let _ = writeln!(out, "    flow publish {name} --data '<JSON>'");
        }
    }
    Ok(out)
}

/// The run's lines of `flow show`: status, times, inputs, output, error, and for a
/// running run who holds it, whether that process lives, and how to continue it.
fn run_header(run: &flow_ledger::Run, resume: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "run {}  {}  workflow {}",
        run.id, run.status, run.workflow_name
    );
    let took = match (run.started_at, run.finished_at) {
        (Some(a), Some(b)) => format!("  took {}", duration_ms(b.0 - a.0)),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "  created {}  started {}  finished {}{took}",
        run.created_at.to_rfc3339(),
        run.started_at.map_or("-".into(), |t| t.to_rfc3339()),
        run.finished_at.map_or("-".into(), |t| t.to_rfc3339())
    );
    if let Some(p) = &run.parent {
        let _ = writeln!(out, "  child of run {} (step {})", p.run_id, p.step_id);
    }
    let _ = writeln!(out, "  inputs {}", shorten(&run.inputs.to_string()));
    if let Some(output) = &run.output {
        let _ = writeln!(out, "  output {}", shorten(&output.to_string()));
    }
    if let Some(e) = run.error.as_ref().or(run.pause_reason.as_ref()) {
        let _ = writeln!(out, "  {e}");
    }
    if run.status == RunStatus::Running {
        let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
        let holder = run
            .worker
            .as_ref()
            .map_or_else(|| "nobody".to_string(), ToString::to_string);
        let dead = run.worker.as_ref().is_some_and(|w| w.is_provably_dead());
        let expired = run.lease_expires_at.is_none_or(|t| t <= now);
        let state = if dead {
            "its process is gone"
        } else if expired {
            "its lease has expired"
        } else {
            "alive"
        };
        let until = run.lease_expires_at.map_or("-".into(), |t| t.to_rfc3339());
        let _ = writeln!(out, "  held by {holder} (lease until {until}; {state})");
        if dead || expired {
            let _ = writeln!(out, "  continue with: {resume} {}", run.id);
        }
    }
    out
}

/// The human view of `flow show`: the run (times, inputs, output, who holds it), the DAG
/// in order with each node's steps and call, and for every call in doubt the exact
/// commands that resolve it. `resume` is the resume command as the user should paste it.
async fn human(ledger: &Ledger, run_id: &str, resume: &str) -> Result<String, flow_ledger::Error> {
    use std::fmt::Write as _;
    let run = ledger.get_run(run_id).await?;
    let steps = crate::view::run::steps_as_seen(ledger, run_id).await?;
    let calls = ledger.list_calls(run_id).await?;
    let probes = ledger.list_probes(run_id).await?;
    // The events say why a call went in doubt (`CallView::of` reads the reason there).
    let events = ledger
        .list_events(flow_ledger::EventFilter {
            run_id: Some(run_id.to_string()),
            ..Default::default()
        })
        .await?;
    let mut out = run_header(&run, resume);
    let wf = crate::snapshot::snapshot(&run).ok();
    let order: Vec<String> = match &wf {
        Some(wf) => wf
            .plan()
            .order()
            .iter()
            .map(|&i| wf.nodes[i].id.clone())
            .collect(),
        None => Vec::new(),
    };
    let fans: Vec<String> = wf
        .iter()
        .flat_map(|wf| &wf.nodes)
        .filter(|n| n.for_each.is_some())
        .map(|n| n.id.clone())
        .collect();
    let mut nodes = order;
    for s in &steps {
        if !nodes.contains(&s.node_id) {
            nodes.push(s.node_id.clone());
        }
    }
    let mut in_doubt = Vec::new();
    let _ = writeln!(out);
    for node in &nodes {
        if fans.contains(node) {
            let total = ledger.get_fanout(run_id, node).await?;
            let total = total.map(|f| f.keys.len() + f.vanished.len());
            items_text(&mut out, node, &steps, total);
            in_doubt.extend(
                calls
                    .iter()
                    .filter(|c| crate::item_id::is_item_of(node, &c.tool_call_id))
                    .filter(|c| c.status == CallStatus::InDoubt)
                    .cloned(),
            );
            continue;
        }
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
                c.status,
                c.tool,
                c.attempt_count,
                c.requests_sent(),
                c.current_key
            );
            if let Some(task) = &c.remote_task {
                let _ = writeln!(out, "    remote task {task}");
            }
            if let (flow_ledger::CallStatus::Claimed, Some(why)) = (c.status, &c.waiting) {
                let _ = writeln!(out, "    waiting: {why}");
            }
            if let Some(how) = &c.resolution {
                let _ = writeln!(
                    out,
                    "    resolved {how} by {} at {}",
                    c.resolved_by.as_deref().unwrap_or("?"),
                    c.resolved_at.map_or("?".into(), |t| t.to_rfc3339())
                );
            }
            for p in probes.iter().filter(|p| &p.tool_call_id == node) {
                let _ = writeln!(
                    out,
                    "    probe {}  {}  {} → {}{}",
                    p.probe,
                    p.probed_at.to_rfc3339(),
                    p.observed.as_str(),
                    p.decision.as_str(),
                    p.detail
                        .as_ref()
                        .map(|d| format!("  ({d})"))
                        .unwrap_or_default()
                );
            }
            if c.status == CallStatus::InDoubt {
                in_doubt.push(c.clone());
            }
        }
    }
    let children = crate::view::run::children(ledger, run_id).await?;
    if !children.runs.is_empty() {
        let _ = writeln!(out, "\nchild runs (flow show <run>):");
        for c in &children.runs {
            let step = c.parent.as_ref().map_or("", |p| p.step.as_str());
            let _ = writeln!(out, "  {}  {}  {step}", c.id, c.status);
        }
        if children.more {
            let _ = writeln!(out, "  … more: flow runs --parent {run_id}");
        }
    }
    in_doubt_text(&mut out, &in_doubt, &events, resume, run_id);
    Ok(out)
}

/// The calls in doubt of the human view, each with the three commands that settle it.
fn in_doubt_text(
    out: &mut String,
    in_doubt: &[flow_ledger::ToolCall],
    events: &[flow_ledger::Event],
    resume: &str,
    run_id: &str,
) {
    use std::fmt::Write as _;
    if in_doubt.is_empty() {
        return;
    }
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
        let view = CallView::of(c, events);
        if let Some(why) = view.in_doubt_reason {
            let _ = writeln!(out, "  # why: {why}");
        }
        if let Some(until) = view.holder_lease_until {
            let at = until.to_rfc3339();
            let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
            let _ = if until > now {
                writeln!(
                    out,
                    "  # taken over from a worker whose lease ends at {at}: it could still send until then — check the downstream after it (resolving waits for it)"
                )
            } else {
                writeln!(
                    out,
                    "  # taken over from a worker whose lease ended at {at}: it could not start sending after that"
                )
            };
        }
        let _ = writeln!(
            out,
            "  {resume} {run_id} --resolve {}=succeeded --output '<the JSON output>'   # it happened",
            c.tool_call_id
        );
        let _ = writeln!(
            out,
            "  {resume} {run_id} --resolve {}=failed --error '<why>'                  # it did not happen; fail the node",
            c.tool_call_id
        );
        let _ = writeln!(
            out,
            "  {resume} {run_id} --resolve {}=retry                                 # re-send with the same key",
            c.tool_call_id
        );
    }
}

/// A `for_each` node in the human view: its state and counts, then the items that did
/// not simply succeed (in doubt and failed first; at most 20, the rest counted).
fn items_text(out: &mut String, node: &str, steps: &[flow_ledger::Step], total: Option<usize>) {
    use std::fmt::Write as _;
    let view = crate::view::ItemsView::of(node, steps, total);
    let own = steps
        .iter()
        .rfind(|s| s.node_id == node && s.step_id == node)
        .map(|s| s.status.as_str());
    // Items paused and none running: the node waits for a person (as `flow show
    // --json`'s node status says).
    let held = view.in_doubt > 0 && view.running == 0;
    let state = match own {
        Some("running") | None if held && total.is_some() => "paused",
        Some(own) => own,
        None if total.is_some() => "running",
        None => "not started",
    };
    let _ = writeln!(out, "{node}  {state}  {}", view.counts_line());
    const SHOWN: usize = 20;
    for item in view.listed.iter().take(SHOWN) {
        let error = item
            .error
            .as_ref()
            .map(|e| {
                let kind = e.kind.map_or("error", |k| k.as_str());
                format!("  {kind}: {}", shorten(&e.message))
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "    item {:<24} {:<10}{error}",
            item.step,
            item.status.as_str()
        );
    }
    let unlisted = view.failed + view.in_doubt + view.running + view.skipped + view.cancelled;
    if unlisted > SHOWN {
        let _ = writeln!(
            out,
            "    … and {} more (flow show --json lists {}; the API pages them all)",
            unlisted - SHOWN,
            crate::view::items::LISTED
        );
    }
}

/// The run's approvals for the human view: each one's state, and for those waiting the
/// request as it will be sent, what is still needed and the commands that decide.
async fn approvals_text(
    ledger: &Ledger,
    run_id: &str,
    resume: &str,
) -> Result<String, flow_ledger::Error> {
    use std::fmt::Write as _;
    let filter = flow_ledger::ApprovalFilter {
        run_id: Some(run_id.to_owned()),
        status: None,
        limit: 1000,
        as_of: Some(flow_ledger::Clock::now(&flow_ledger::SystemClock)),
    };
    let list = ledger.list_approvals(filter).await?;
    let mut out = String::new();
    if list.is_empty() {
        return Ok(out);
    }
    let flow = resume.strip_suffix("resume").unwrap_or("flow ");
    let _ = writeln!(out, "\nApprovals:");
    for a in list.iter().map(crate::view::ApprovalView::of) {
        let _ = writeln!(
            out,
            "  {}  {}  {}/{} approved{}  deadline {}",
            a.node,
            a.status,
            a.approved_by.len(),
            a.min,
            a.decided_by
                .as_ref()
                .map(|b| format!("  by {b}"))
                .unwrap_or_default(),
            a.deadline.to_rfc3339()
        );
        if a.status != flow_ledger::ApprovalStatus::Pending {
            continue;
        }
        if let Some(m) = &a.message {
            let _ = writeln!(out, "    message: {m}");
        }
        let _ = writeln!(out, "    request: {}", a.request);
        let _ = writeln!(out, "    digest:  {}", a.digest);
        let required: String = a
            .inputs
            .as_array()
            .map(|list| {
                list.iter()
                    .filter(|i| i["required"] == true && i["default"].is_null())
                    .filter_map(|i| i["name"].as_str())
                    .map(|n| format!(" --input {n}='<…>'"))
                    .collect()
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "    {flow}approve {run_id} {}{required} --digest {}   # {} more approver(s) needed",
            a.node, a.digest, a.still_needed
        );
        let _ = writeln!(out, "    {flow}deny {run_id} {} --reason '<why>'", a.node);
    }
    Ok(out)
}

/// One step of the human view: id, status, how long it took, when a pending retry is
/// due, and its error.
fn step_line(s: &flow_ledger::Step) -> String {
    use std::fmt::Write as _;
    let mut line = format!("    step {:<24} {:<10}", s.step_id, s.status.as_str());
    if let (Some(a), Some(b)) = (s.started_at, s.finished_at) {
        let _ = write!(line, " {}", duration_ms(b.0 - a.0));
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
) -> Result<u8, Error> {
    let status = match &args.status {
        None => None,
        Some(s) => Some(s.parse::<RunStatus>().map_err(|_| {
            Error::invalid(format!(
                "unknown status `{s}`; use queued, running, succeeded, failed, paused or cancelled"
            ))
        })?),
    };
    let (times, after) = time_and_cursor(args)?;
    let inputs = input_pairs(&args.inputs)?;
    let ledger = open_ledger(cli).await?;
    // One more than asked tells whether another page exists.
    let runs = ledger
        .list_runs(RunFilter {
            status,
            limit: args.limit.saturating_add(1),
            workflow: args.workflow.clone(),
            since: times[0],
            until: times[1],
            after,
            inputs,
            id_prefix: args.prefix.clone().filter(|p| !p.is_empty()),
            parent: args.parent.clone(),
        })
        .await
        .map_err(Error::Ledger)?;
    let more = runs.len() > args.limit as usize;
    let runs = &runs[..runs.len().min(args.limit as usize)];
    if args.json {
        let list: Vec<RunSummary> = runs.iter().map(RunSummary::of).collect();
        let _ = writeln!(
            stdout,
            "{}",
            serde_json::to_string_pretty(&list).unwrap_or_default()
        );
    } else {
        let rows: Vec<Vec<String>> = runs
            .iter()
            .map(|r| {
                let took = match (r.started_at, r.finished_at) {
                    (Some(a), Some(b)) => duration_ms(b.0 - a.0),
                    _ => "-".into(),
                };
                vec![
                    r.id.clone(),
                    r.status.as_str().to_string(),
                    r.workflow_name.clone(),
                    r.created_at.to_rfc3339(),
                    took,
                    r.error.as_deref().map(first_line).unwrap_or_default(),
                ]
            })
            .collect();
        let header = ["RUN", "STATUS", "WORKFLOW", "CREATED", "TOOK", "ERROR"];
        let _ = stdout.write_all(table(&header, &rows, terminal_width()).as_bytes());
    }
    if more && let Some(last) = runs.last() {
        let next = next_page(format!("{} runs", super::flow_command(cli)), args);
        let cursor = RunCursor::after(last).encode();
        let _ = writeln!(stderr, "more runs: {next} --cursor {cursor}");
    }
    Ok(exit::OK)
}

/// `--input NAME=VALUE` of `flow runs`, split; a pair without `=` or a name is an input
/// error (exit 2).
pub(crate) fn input_pairs(pairs: &[String]) -> Result<Vec<(String, String)>, Error> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
            _ => Err(Error::invalid(format!(
                "--input `{p}`: expected NAME=VALUE (e.g. --input order_id=117)"
            ))),
        })
        .collect()
}

/// `--since`, `--until` and `--cursor` of `flow runs`, parsed; a bad one is an input
/// error (exit 2).
fn time_and_cursor(args: &RunsArgs) -> Result<([Option<Timestamp>; 2], Option<RunCursor>), Error> {
    let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
    let mut times = [None, None];
    for (slot, (flag, value)) in times
        .iter_mut()
        .zip([("--since", &args.since), ("--until", &args.until)])
    {
        if let Some(text) = value {
            *slot = Some(parse_time(text, now).ok_or_else(|| {
                Error::invalid(format!(
                    "{flag} `{text}` is neither an RFC 3339 time (2026-12-01T09:00:00Z) nor a duration ago (2h, 30m)"
                ))
            })?);
        }
    }
    let after = match args.cursor.as_deref().map(RunCursor::decode) {
        None => None,
        Some(Some(c)) => Some(c),
        Some(None) => {
            return Err(Error::invalid(format!(
                "--cursor `{}` is not a cursor flow printed",
                args.cursor.as_deref().unwrap_or_default()
            )));
        }
    };
    Ok((times, after))
}

/// The `flow runs` command for the next page (without its `--cursor`): `prefix`, then
/// the filters, limit and format of `args` (`flow runs` and `flow runs --server`).
pub(crate) fn next_page(prefix: String, args: &RunsArgs) -> String {
    let mut next = prefix;
    for (flag, value) in [
        ("--status", args.status.as_deref()),
        ("--workflow", args.workflow.as_deref()),
        ("--since", args.since.as_deref()),
        ("--until", args.until.as_deref()),
        ("--prefix", args.prefix.as_deref()),
        ("--parent", args.parent.as_deref()),
    ] {
        if let Some(v) = value {
            next.push_str(&format!(" {flag} {}", super::shell_quote(v)));
        }
    }
    for pair in &args.inputs {
        next.push_str(&format!(" --input {}", super::shell_quote(pair)));
    }
    if args.limit != 100 {
        next.push_str(&format!(" --limit {}", args.limit));
    }
    if args.json {
        next.push_str(" --json");
    }
    next
}

/// `text` cut to what fits on a line, pointing at `--json` for the rest.
fn shorten(text: &str) -> String {
    const MAX: usize = 160;
    if text.chars().count() <= MAX {
        return text.to_string();
    }
    let cut: String = text.chars().take(MAX).collect();
    format!("{cut}… (in full: --json)")
}

/// After a cancel: the run's calls still in doubt, and how to settle each. Cancelling
/// does not settle them — the request may have taken effect — so an operator who
/// cancels must hear that they remain, and that only `succeeded` or `failed` is left.
async fn warn_in_doubt(ledger: &flow_ledger::Ledger, run: &str, stderr: &mut dyn Write) {
    let filter = flow_ledger::InDoubtFilter {
        run_id: Some(run.to_string()),
        ..Default::default()
    };
    let Ok(calls) = ledger.list_in_doubt(filter).await else {
        return;
    };
    for c in &calls {
        let _ = writeln!(
            stderr,
            "warning: call `{}` (tool {}, key {}) is still in doubt: its request may have taken effect (requests sent {}); cancelling does not settle it. Record what happened with `flow resume {run} --resolve {node}=succeeded --output JSON` (or `{node}=failed`), or ask the downstream with `flow reconcile --run {run}`",
            c.tool_call_id,
            c.tool,
            c.current_key,
            c.requests_sent(),
            node = c.tool_call_id,
        );
    }
}

/// `flow cancel`.
pub(crate) async fn cancel(
    cli: &Cli,
    args: &CancelArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    let actor = args.who.actor()?;
    let ledger = open_ledger(cli).await?;
    let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
    // What the run was before, to say which kind of cancel happened.
    let before = ledger.get_run(&args.run).await.ok();
    match ledger.request_cancel_as(&args.run, Some(actor), now).await {
        Ok(run) => {
            let _ = writeln!(stdout, "{} {}", run.id, run.status);
            let was_running = before
                .as_ref()
                .is_some_and(|r| r.status == RunStatus::Running);
            if run.status == RunStatus::Cancelled && was_running {
                let holder = before
                    .as_ref()
                    .and_then(|r| r.worker.as_ref())
                    .map_or_else(|| "its worker".to_string(), |w| w.to_string());
                let _ = writeln!(
                    stderr,
                    "run {} cancelled at once: {holder} is gone (its lease expired or its process died); calls it left outbound stay recorded as they are",
                    run.id
                );
            } else if run.status == RunStatus::Cancelled {
                let _ = writeln!(stderr, "run {} cancelled", run.id);
            } else {
                let _ = writeln!(
                    stderr,
                    "cancellation requested: run {} stops starting steps, lets in-flight calls finish, then ends cancelled",
                    run.id
                );
            }
            warn_in_doubt(&ledger, &run.id, stderr).await;
            Ok(exit::OK)
        }
        Err(flow_ledger::Error::Terminal { status }) => Err(Error::invalid(format!(
            "run {} already finished ({status})",
            args.run
        ))),
        Err(e) => Err(run_error(&args.run, e)),
    }
}
