//! `flow run` and `flow resume`: start or continue a run and execute it here.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use flow_ledger::{Ledger, NewRun, Resolution, Resolve, RunLease, RunStatus, WorkerId};
use serde_json::Value as Json;

use super::{Cli, Error, exit, logging, open_ledger};
use crate::config::Config;
use crate::executor::{Executor, RunOutcome, progress};
use crate::runtime::Runtime;
use crate::secrets::Secrets;
use crate::snapshot::{snapshot, validate_options};
use crate::workflow::{ValidWorkflow, Workflow, load_file};

/// Arguments of `flow run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Workflow file.
    pub file: PathBuf,
    /// An input, `NAME=VALUE`, typed by the workflow's declaration (`n=42` is an integer
    /// when `n` is declared `integer`). Repeatable.
    #[arg(long = "input", value_name = "NAME=VALUE")]
    pub inputs: Vec<String>,
    /// A JSON or YAML file holding a mapping of inputs (`--input` wins).
    #[arg(long)]
    pub inputs_file: Option<PathBuf>,
    /// Run id, making the start idempotent: the same file and inputs attach to that run.
    #[arg(long)]
    pub run_id: Option<String>,
    /// Print the `flow show --json` object instead of the run's output.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `flow resume`.
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The run id.
    pub run: String,
    /// Settle an in-doubt call first: `NODE=succeeded` (with --output), `NODE=failed`
    /// (with optional --error) or `NODE=retry` (re-send with the same idempotency key).
    #[arg(long, value_name = "NODE=succeeded|failed|retry")]
    pub resolve: Option<String>,
    /// The call's output when resolving as succeeded (JSON).
    #[arg(long, value_name = "JSON")]
    pub output: Option<String>,
    /// The error message when resolving as failed.
    #[arg(long, value_name = "MSG")]
    pub error: Option<String>,
    /// Re-queue the run for `flow daemon` workers instead of executing it here.
    #[arg(long)]
    pub detach: bool,
    /// Who resolves, and why (recorded with the resolution).
    #[command(flatten)]
    pub who: super::who::Who,
    /// Print the `flow show --json` object instead of the run's output.
    #[arg(long)]
    pub json: bool,
    /// `--server`: settle or re-queue through the operator API instead of `--db` (the
    /// server's daemons continue the run).
    #[command(flatten)]
    pub remote: super::Remote,
}

/// The pieces every executing command needs.
pub(crate) struct Session {
    pub ledger: Ledger,
    pub executor: Executor,
    pub worker: WorkerId,
    /// `flow` with the global options that differ from their defaults, for the
    /// follow-up commands this session prints.
    pub flow: String,
    /// `--log-format json`: lines printed outside the command's stderr are JSON too.
    pub json_logs: bool,
}

/// Watches for SIGINT (Ctrl-C) and SIGTERM while a run executes here, both alike: a
/// service manager (systemd, Kubernetes, `timeout`) stops with SIGTERM, and a run killed
/// by it mid-call would be left `running` with that call found in doubt. The first
/// signal fires `stop` (no new step starts; in-flight calls finish, are recorded, and
/// the run is released, exit 130); the second exits at once (130 after SIGINT, 143 after
/// SIGTERM), leaving the run to be found by `resume` once its lease ends. The watcher
/// ends when the returned handle is dropped.
fn interrupts(
    stop: tokio_util::sync::CancellationToken,
    resume: String,
    json: bool,
) -> tokio_util::task::AbortOnDropHandle<()> {
    let say = move |text: &str| {
        let line = if json {
            crate::json_line::render("flow", text, serde_json::Value::Null)
        } else {
            text.to_string()
        };
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    };
    // Installed here, before the run starts, not in the task: a spawned task may first
    // run after the executor has sent a request, and a signal before then would kill.
    let signals = crate::daemon::shutdown::Signals::install();
    tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
        let mut signals = match signals {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGINT/SIGTERM: a signal ends the run at once");
                return;
            }
        };
        let Some(first) = signals.next().await else {
            return;
        };
        say(&format!(
            "interrupted: no new steps start; calls in flight finish and are recorded ({} received; Ctrl-C or SIGTERM again exits at once)",
            first.name()
        ));
        stop.cancel();
        if let Some(second) = signals.next().await {
            say(&format!(
                "exiting at once: the run stays running until its lease ends; continue with: {resume}"
            ));
            std::process::exit(i32::from(second.exit_code()));
        }
    }))
}

/// PostgreSQL plans a run's statements from the tables' statistics, and without them
/// (autovacuum off, or not yet come by after a burst) it takes any index that starts
/// with `(tenant, workspace)` as good as the right one: measured, W2's batch of 100
/// pure results checked every call of the tenant for its keys (26 ms of a 73 ms run at
/// 6,000 calls, growing with the table). A daemon checks every few seconds; a one-shot
/// `flow run` or `flow resume` checks beside its run, on a connection of its own, so the
/// run neither waits for it nor for a second connection of the pool; the exit waits for
/// the check (and an ANALYZE it started) within its 2 s bound before closing the ledger.
fn refresh_statistics_meanwhile(ledger: &Ledger) {
    if ledger.backend_name() != "postgres" {
        return;
    }
    let ledger = ledger.clone();
    super::spawn_beside(async move {
        if let Err(e) = ledger.refresh_planner_statistics_aside().await {
            tracing::debug!(error = %e, "cannot check the planner statistics");
        }
    });
}

impl Session {
    /// Loads secrets and config, opens the ledger, builds the executor. With `wf`, every
    /// secret it names is checked before the ledger is even opened.
    pub(crate) async fn open(cli: &Cli, live: bool, wf: Option<&Workflow>) -> Result<Self, Error> {
        let secrets = Secrets::load(cli.secrets_file.as_deref())?;
        let config = Config::load(cli.config.as_deref())?;
        logging::init(
            cli.log_format,
            &secrets,
            &config.telemetry,
            crate::telemetry::Process::Command,
        );
        if let Some(wf) = wf {
            check_secrets(wf, &secrets)?;
        }
        if let Some(why) = wf.and_then(|wf| config.refuses(wf)) {
            return Err(Error::invalid(why));
        }
        let ledger = open_ledger(cli).await?;
        refresh_statistics_meanwhile(&ledger);
        let public_url = config.api.public_url.clone();
        let guards = crate::gateway::Guards {
            egress: config.egress,
            policy: config.policy,
        };
        let runtime = Runtime::with_ledger(ledger.clone(), secrets, guards, public_url)?;
        let progress: Arc<dyn progress::Progress> = if live {
            Arc::from(progress::for_stderr(
                cli.log_format == super::LogFormat::Json,
            ))
        } else {
            Arc::new(progress::Silent)
        };
        let executor = runtime.executor(progress);
        Ok(Self {
            ledger,
            executor,
            worker: WorkerId::current(),
            flow: super::flow_command(cli),
            json_logs: cli.log_format == super::LogFormat::Json,
        })
    }

    fn now(&self) -> flow_ledger::Timestamp {
        self.executor.gateway().now()
    }

    /// Claims `run_id`, waiting while another live worker holds it.
    async fn claim(&self, run_id: &str, stderr: &mut dyn Write) -> Result<Option<RunLease>, Error> {
        let mut said = false;
        loop {
            match self
                .ledger
                .claim_run(run_id, &self.worker, crate::lease::length(), self.now())
                .await
            {
                Ok(lease) => return Ok(Some(lease)),
                Err(flow_ledger::Error::Busy { holder, until }) => {
                    if !said {
                        let _ = writeln!(
                            stderr,
                            "run {run_id} is held by {holder} until {}; waiting for the lease",
                            until.to_rfc3339()
                        );
                        said = true;
                    }
                    let wait = (until.0 - self.now().0).clamp(200, 2_000);
                    tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(1_000)))
                        .await;
                }
                Err(flow_ledger::Error::Terminal { .. }) => return Ok(None),
                Err(e) => {
                    return Err(Error::unavailable(format!(
                        "cannot claim run {run_id}: {e}"
                    )));
                }
            }
        }
    }

    /// Claims and executes a run here, then prints the result.
    async fn execute(
        &self,
        run_id: &str,
        json: bool,
        stdout: &mut dyn Write,
        stderr: &mut dyn Write,
    ) -> Result<u8, Error> {
        if let Err(e) = self.ledger.expire_dead_local_workers(self.now()).await {
            tracing::warn!(error = %e, "could not expire leases of dead local workers");
        }
        let Some(lease) = self.claim(run_id, stderr).await? else {
            return self.print_finished(run_id, json, stdout, stderr).await;
        };
        let run = self.ledger.get_run(run_id).await.map_err(unavailable)?;
        let wf = match snapshot(&run) {
            Ok(wf) => wf,
            Err(message) => {
                let _ = self.ledger.release_run(&lease, self.now()).await;
                return Err(Error::invalid(message));
            }
        };
        self.execute_leased(lease, &wf, &run, json, stdout, stderr)
            .await
    }

    /// Executes `run`, claimed here under `lease`, as `wf` (its stored workflow, parsed),
    /// then prints the result.
    async fn execute_leased(
        &self,
        lease: RunLease,
        wf: &ValidWorkflow,
        run: &flow_ledger::Run,
        json: bool,
        stdout: &mut dyn Write,
        stderr: &mut dyn Write,
    ) -> Result<u8, Error> {
        let run_id = run.id.as_str();
        let stop = tokio_util::sync::CancellationToken::new();
        let _interrupts = interrupts(
            stop.clone(),
            format!("{} resume {run_id}", self.flow),
            self.json_logs,
        );
        // The run just read after the claim is the one executed: reading it again
        // would hold a second copy of its inputs (a 10,000-item list is ~6 MiB parsed).
        match self.executor.execute_claimed(lease, wf, run, &stop).await {
            Ok(outcome) => Ok(self
                .print_outcome(run_id, &outcome, json, stdout, stderr)
                .await),
            Err(e) => Err(Error::unavailable(format!(
                "run {run_id} stopped: {e}; `{} resume {run_id}` continues it",
                self.flow
            ))),
        }
    }

    async fn print_outcome(
        &self,
        run_id: &str,
        outcome: &RunOutcome,
        json: bool,
        stdout: &mut dyn Write,
        stderr: &mut dyn Write,
    ) -> u8 {
        if json {
            super::print_json(&self.ledger, run_id, stdout, stderr).await;
        } else if let Some(output) = &outcome.output {
            let _ = writeln!(
                stdout,
                "{}",
                serde_json::to_string_pretty(output).unwrap_or_default()
            );
        }
        match outcome.status {
            RunStatus::Succeeded => {
                let _ = writeln!(stderr, "run {run_id} succeeded");
                exit::OK
            }
            RunStatus::Paused => {
                let _ = writeln!(
                    stderr,
                    "run {run_id} paused: {}",
                    outcome.error.as_deref().unwrap_or("in doubt")
                );
                let why = outcome.error.as_deref().unwrap_or_default();
                let what = match (why.contains("in doubt"), why.contains("awaiting approval")) {
                    (true, true) => {
                        "the calls in doubt, the approvals waiting and how to settle them"
                    }
                    (false, true) => "what awaits approval and how to approve or deny it",
                    _ if why.contains("waiting:") => {
                        "what the run waits for (`flow publish` sends an event)"
                    }
                    // Its calls in doubt, if any, are the child's: resolved there.
                    _ if why.contains("waiting on child") && !why.contains("calls in doubt") => {
                        "the child runs it waits on (what each needs is settled in that run)"
                    }
                    _ => "the calls in doubt and how to resolve them",
                };
                let _ = writeln!(stderr, "  see `{} show {run_id}` for {what}", self.flow);
                exit::PAUSED
            }
            RunStatus::Cancelled => {
                let _ = writeln!(stderr, "run {run_id} cancelled");
                exit::CANCELLED
            }
            RunStatus::Queued => {
                let _ = writeln!(
                    stderr,
                    "run {run_id} stopped (interrupted): its calls in flight finished and were recorded, the lease is released"
                );
                let _ = writeln!(stderr, "  continue with: {} resume {run_id}", self.flow);
                exit::INTERRUPTED
            }
            _ => {
                let _ = writeln!(
                    stderr,
                    "run {run_id} failed: {}",
                    outcome.error.as_deref().unwrap_or("failed")
                );
                exit::FAILED
            }
        }
    }

    async fn print_finished(
        &self,
        run_id: &str,
        json: bool,
        stdout: &mut dyn Write,
        stderr: &mut dyn Write,
    ) -> Result<u8, Error> {
        let run = self.ledger.get_run(run_id).await.map_err(unavailable)?;
        let outcome = RunOutcome {
            status: run.status,
            output: run.output.clone(),
            error: run.error.clone(),
        };
        let _ = writeln!(stderr, "run {run_id} already finished ({})", run.status);
        Ok(self
            .print_outcome(run_id, &outcome, json, stdout, stderr)
            .await)
    }
}

/// A ledger error that stops the command, exit by its class (`Error::Ledger`).
fn unavailable(e: flow_ledger::Error) -> Error {
    Error::Ledger(e)
}

/// Every secret the workflow names must have a value before the run is created or
/// claimed: found only when its node runs, a missing one would fail the run after earlier
/// nodes had already sent their requests. Missing ones are [`Error::MissingSecrets`].
fn check_secrets(wf: &Workflow, secrets: &Secrets) -> Result<(), Error> {
    let names = wf.secret_names();
    let missing = secrets.missing_all(names.iter().map(String::as_str));
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::MissingSecrets {
        workflow: wf.name.clone(),
        names: missing.iter().map(ToString::to_string).collect(),
    })
}

/// Everything `flow run` and `flow submit` check before they touch the database — the
/// file validates, the inputs type-check, the run id is well formed — and the run to
/// enqueue. Bad input is an input error (exit 2): nothing is written.
pub(super) fn check_new_run(
    file: &std::path::Path,
    inputs: &[String],
    inputs_file: Option<&std::path::Path>,
    run_id: Option<&str>,
) -> Result<(ValidWorkflow, NewRun), Error> {
    if let Some(id) = run_id {
        super::check_id(flow_ledger::ids::IdKind::Run, "--run-id", id)?;
    }
    let (wf, source) = load_file(file, &validate_options())
        .map_err(|diags| Error::Diagnostics(diags.to_string()))?;
    let inputs = crate::inputs::resolve(&wf, inputs, inputs_file)
        .map_err(|e| Error::invalid(e.to_string()))?;
    let id = match run_id {
        Some(id) => id.to_owned(),
        None => format!("run_{}", ulid::Ulid::generate()),
    };
    let new = NewRun {
        id,
        workflow_name: wf.name.clone(),
        workflow_text: source.text,
        inputs,
        priority: 0,
        not_before: None,
        trace_parent: None,
    };
    Ok((wf, new))
}

/// Who starts a run from the CLI, recorded in its `run.queued` (`USER@host`, the name
/// `flow approve` decides under by default); `None` where the process cannot tell (no
/// user name anywhere).
pub(crate) fn started_by(who: &super::who::Who) -> Option<flow_ledger::Actor> {
    who.name()
        .ok()
        .map(|by| flow_ledger::Actor { by, reason: None })
}

/// `flow run`.
pub(crate) async fn run(
    cli: &Cli,
    args: &RunArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    let (wf, new) = check_new_run(
        &args.file,
        &args.inputs,
        args.inputs_file.as_deref(),
        args.run_id.as_deref(),
    )?;
    let run_id = new.id.clone();
    let session = Session::open(cli, true, Some(&wf)).await?;
    let (worker, now) = (&session.worker, session.now());
    // Who started it (`USER@host`): what `forbid_self` compares deciders with.
    let starter = started_by(&super::who::Who::default());
    match session
        .ledger
        .enqueue_and_claim(new, starter.as_ref(), worker, crate::lease::length(), now)
        .await
    {
        Ok((enq, Some(lease))) => {
            let _ = writeln!(stderr, "run {run_id} started ({})", wf.name);
            // Created and claimed here with the text just parsed: the stored copy is
            // that text, so it is not parsed again, and no step can exist yet.
            return session
                .execute_leased(lease, &wf, &enq.run, args.json, stdout, stderr)
                .await;
        }
        Ok((enq, None)) => {
            let _ = writeln!(
                stderr,
                "run {run_id} exists with the same workflow and inputs ({}); attaching",
                enq.run.status
            );
        }
        Err(e) => return Err(refused_start(&run_id, "start", e)),
    }
    session.execute(&run_id, args.json, stdout, stderr).await
}

/// `--run-id` names a run that exists with another workflow or other inputs (exit 2).
/// Why a run could not be queued, as `flow run` and `flow submit` say it: the id taken
/// by another run or retired by retention is the user's to change (exit 2); anything
/// else is the ledger's (exit 5). `verb` is what was being done (`start`, `queue`).
pub(super) fn refused_start(run_id: &str, verb: &str, e: flow_ledger::Error) -> Error {
    match e {
        flow_ledger::Error::Conflict { reason, .. } => conflict(run_id, &reason),
        flow_ledger::Error::KeyRetired {
            node_id,
            outcome,
            deleted_at,
            ..
        } => Error::invalid(format!(
            "run id `{run_id}` was used by a run deleted by retention on {} whose node `{node_id}` sent a request ({outcome}); the keys derived from that id stay retired (`[retention] keys`), so choose another run id; nothing was written",
            deleted_at.to_rfc3339()
        )),
        source => Error::LedgerWhile {
            doing: format!("cannot {verb} run {run_id}"),
            source,
        },
    }
}

pub(super) fn conflict(run_id: &str, reason: &str) -> Error {
    Error::invalid(format!(
        "run {run_id} already exists with a different workflow or inputs: {reason}"
    ))
}

/// A parsed `--resolve`.
fn parse_resolution(
    args: &ResumeArgs,
    wf: &Workflow,
) -> Result<Option<(String, Resolution)>, String> {
    let Some(spec) = &args.resolve else {
        if args.output.is_some() || args.error.is_some() {
            return Err("--output and --error only go with --resolve".into());
        }
        return Ok(None);
    };
    let (node, how) = spec
        .rsplit_once('=')
        .ok_or_else(|| format!("--resolve `{spec}`: expected NODE=succeeded|failed|retry"))?;
    // An item of a `for_each` node is resolved by its call id, `node[<key>]`.
    let base = match crate::item_id::node_of(node) {
        base if wf.node(base).is_some_and(|n| n.for_each.is_some()) => base,
        _ => node,
    };
    if wf.node(base).is_none() {
        let ids: Vec<&str> = wf.nodes.iter().map(|n| n.id.as_str()).collect();
        return Err(format!(
            "--resolve: the run's workflow has no node `{node}` (nodes: {})",
            ids.join(", ")
        ));
    }
    let resolution = match how {
        "succeeded" => {
            let text = args
                .output
                .as_deref()
                .ok_or("--resolve NODE=succeeded needs --output JSON (the call's output)")?;
            if args.error.is_some() {
                return Err("--error goes with NODE=failed, not NODE=succeeded".into());
            }
            let value: Json = serde_json::from_str(text)
                .map_err(|e| format!("--output is not valid JSON: {e}"))?;
            Resolution::Succeeded(value)
        }
        "failed" => {
            if args.output.is_some() {
                return Err("--output goes with NODE=succeeded, not NODE=failed".into());
            }
            Resolution::Failed(
                args.error
                    .clone()
                    .unwrap_or_else(|| "resolved as failed by an operator".into()),
            )
        }
        "retry" => {
            if args.output.is_some() || args.error.is_some() {
                return Err("NODE=retry takes neither --output nor --error".into());
            }
            Resolution::Retry
        }
        other => {
            return Err(format!(
                "--resolve: unknown resolution `{other}`; use succeeded, failed or retry"
            ));
        }
    };
    Ok(Some((node.to_string(), resolution)))
}

/// `flow resume`.
pub(crate) async fn resume(
    cli: &Cli,
    args: &ResumeArgs,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Result<u8, Error> {
    let session = Session::open(cli, !args.detach, None).await?;
    let run = match session.ledger.get_run(&args.run).await {
        Ok(run) => run,
        Err(flow_ledger::Error::NotFound { .. }) => {
            return Err(Error::invalid(format!(
                "no run `{}` in {}",
                args.run,
                session.ledger.url_redacted()
            )));
        }
        Err(e) => return Err(unavailable(e)),
    };
    let wf = snapshot(&run).map_err(Error::Invalid)?;
    // A detached run is executed by a daemon, whose own secrets count.
    if !args.detach {
        check_secrets(&wf, session.executor.gateway().secrets())?;
    }
    let mut resolved = false;
    if let Some((node, resolution)) = parse_resolution(args, &wf).map_err(Error::Invalid)? {
        let actor = args.who.actor()?;
        resolve(&session, &run.id, node, resolution, actor, stderr).await?;
        resolved = true;
    }
    if args.detach {
        let said = match session.ledger.requeue_run(&run.id, session.now()).await {
            Ok(_) => "queued for the daemons".to_string(),
            // The resolution settled the run's last doubt and re-queued it in the same
            // transaction; a daemon may hold it, or have finished it, already: what
            // --detach asked for.
            Err(flow_ledger::Error::Busy { holder, .. }) if resolved => {
                format!("already continuing under {holder}")
            }
            Err(flow_ledger::Error::Terminal { status }) if resolved => status.to_string(),
            Err(source) => {
                return Err(Error::LedgerWhile {
                    doing: format!("cannot re-queue run {}", run.id),
                    source,
                });
            }
        };
        let _ = writeln!(stdout, "{}", run.id);
        let _ = writeln!(stderr, "run {} {said}", run.id);
        return Ok(exit::OK);
    }
    session.execute(&run.id, args.json, stdout, stderr).await
}

/// Settles the in-doubt call of `node` as `resolution` (`flow resume --resolve`).
async fn resolve(
    session: &Session,
    run_id: &str,
    node: String,
    resolution: Resolution,
    actor: flow_ledger::Actor,
    stderr: &mut dyn Write,
) -> Result<(), Error> {
    let how = resolution.as_str();
    // Taken over from a worker whose lease has not ended: it could still send, so what
    // the person checked may not be the last word. Wait it out (at most one lease).
    if let Ok(call) = session.ledger.get_call(run_id, &node).await
        && let Some(until) = crate::view::call::holder_may_send_until(&call, session.now())
    {
        let _ = writeln!(
            stderr,
            "call `{node}` was taken over from a worker whose lease ends at {}: it could still send until then; waiting before resolving",
            until.to_rfc3339()
        );
        let left = until.0.saturating_sub(session.now().0).saturating_add(1);
        tokio::time::sleep(Duration::from_millis(u64::try_from(left).unwrap_or(0))).await;
    }
    let req = Resolve {
        run_id: run_id.to_string(),
        tool_call_id: node.clone(),
        resolution,
        by: actor.by,
        note: actor.reason,
    };
    match session.ledger.resolve_call(req, session.now()).await {
        Ok(call) => {
            crate::telemetry::spans::resolved(&call, crate::telemetry::spans::Resolver::Cli);
            let _ = writeln!(stderr, "resolved {node} as {how}");
            Ok(())
        }
        Err(flow_ledger::Error::NotFound { .. }) => Err(Error::invalid(format!(
            "node `{node}` has no tool call in run {run_id}"
        ))),
        Err(flow_ledger::Error::Terminal { status }) => Err(Error::invalid(format!(
            "cannot resolve `{node}` as retry: run {run_id} is {status}, so nothing can re-send it; record what happened with `--resolve {node}=succeeded --output JSON` or `--resolve {node}=failed`; nothing was written"
        ))),
        // Left `outbound` by a worker that stopped (a crash) before anybody looked: it is
        // not in doubt until a resume takes the run over and finds it so.
        Err(flow_ledger::Error::InvalidTransition { from, .. }) if from == "outbound" => {
            Err(Error::invalid(format!(
                "cannot resolve `{node}` yet: its call is still `outbound` (the worker that sent it stopped before anybody looked, or still holds it); run `flow resume {run_id}` first — it takes the run over once the holder's lease has ended and finds the call in doubt — then resolve it; nothing was written"
            )))
        }
        Err(e @ flow_ledger::Error::InvalidTransition { .. }) => Err(Error::invalid(format!(
            "cannot resolve `{node}`: {e} (only calls in doubt can be resolved)"
        ))),
        Err(source) => Err(Error::LedgerWhile {
            doing: format!("cannot resolve `{node}`"),
            source,
        }),
    }
}
