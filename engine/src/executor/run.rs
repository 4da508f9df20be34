//! The loop that performs [`super::decide`]'s actions for one run this worker holds.
//!
//! State is loaded from the ledger once, then kept in memory from the results of this
//! process's own actions (each already committed), so a node costs no extra reads. A
//! heartbeat task renews the run lease and reports cancellation requests. A caller that
//! must stop (a daemon shutting down) fires a stop token: no new step starts, steps in
//! flight finish and are recorded, and the run goes back to the queue.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flow_ledger::{
    ErrorKind, NewStep, Run, RunFinish, RunLease, RunStatus, Step, StepError, StepFinish,
    StepStatus, Timestamp,
};
use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::{Map, Value as Json, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::decide::{Action, Finish, NodeState, Situation, decide};
use super::heartbeat;
use super::progress::{Progress, StepEvent};
use crate::gateway::{self, Gateway, NextRetry, PureLog, StepCall, StepOrigin, StepResult};
use crate::plan::Plan;
use crate::retry;
use crate::workflow::{Workflow, expr};

/// How a run execution ended in this process.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    /// Final (or paused) status.
    pub status: RunStatus,
    /// The outputs of the sink nodes, keyed by node id (succeeded runs).
    pub output: Option<Json>,
    /// Why the run failed or paused.
    pub error: Option<String>,
}

/// Runs runs: shared by `flow run`, `flow resume` and the daemon.
#[derive(Clone)]
pub struct Executor {
    gateway: Gateway,
    progress: Arc<dyn Progress>,
    rng: Arc<std::sync::Mutex<rand::rngs::StdRng>>,
}

/// Per-workflow facts computed once per execution.
struct Prepared {
    /// For each node, the nodes whose outputs its expressions read.
    reads: Vec<Vec<usize>>,
}

impl Prepared {
    fn new(wf: &Workflow) -> Self {
        let index: HashMap<&str, usize> = wf
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.as_str(), i))
            .collect();
        let reads = wf
            .nodes
            .iter()
            .map(|n| {
                let mut templates = n.with.templates();
                templates.extend(n.condition.iter());
                templates.extend(n.idempotency_key.iter());
                let mut reads: Vec<usize> = templates
                    .iter()
                    .flat_map(|t| t.exprs().flat_map(expr::references).collect::<Vec<_>>())
                    .filter_map(|r| {
                        r.strip_prefix("nodes.")
                            .and_then(|rest| rest.split('.').next())
                            .and_then(|id| index.get(id).copied())
                    })
                    .collect();
                reads.sort_unstable();
                reads.dedup();
                reads
            })
            .collect();
        Self { reads }
    }
}

impl Executor {
    /// An executor over `gateway`, reporting to `progress`, drawing backoff jitter from
    /// `rng` (seeded in tests).
    pub fn new(gateway: Gateway, progress: Arc<dyn Progress>, rng: rand::rngs::StdRng) -> Self {
        Self {
            gateway,
            progress,
            rng: Arc::new(std::sync::Mutex::new(rng)),
        }
    }

    /// The gateway (ledger, tools, secrets).
    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// Executes the run held by `lease` until it finishes, pauses or is cancelled.
    /// Errors mean this process must stop touching the run (lease lost, ledger down);
    /// the run itself is left for a later resume.
    pub async fn execute(
        &self,
        lease: RunLease,
        wf: &Workflow,
        inputs: &Json,
    ) -> Result<RunOutcome, gateway::Error> {
        let ledger = self.gateway.ledger();
        let steps = ledger
            .list_steps(&lease.run_id)
            .await
            .map_err(gateway::Error::Ledger)?;
        let run = ledger
            .get_run(&lease.run_id)
            .await
            .map_err(gateway::Error::Ledger)?;
        let known = Known {
            inputs,
            steps: &steps,
            cancel_requested: run.cancel_requested,
        };
        self.execute_known(lease, wf, known, &CancellationToken::new())
            .await
    }

    /// Executes a run the caller has just claimed and read (the daemon), until it
    /// finishes, pauses, is cancelled — or `stop` fires: then no new step starts, the
    /// steps in flight finish and are recorded, and the run is released to the queue
    /// (the outcome's status is `Queued`) unless it could end at once.
    ///
    /// `run` is the row read after the claim, so it is not read again; and a first claim
    /// (fencing token 1) reads no steps, because no step can exist before a run's first
    /// claim (every claim and requeue increments the token; steps are written only under
    /// a lease).
    pub async fn execute_claimed(
        &self,
        lease: RunLease,
        wf: &Workflow,
        run: &Run,
        stop: &CancellationToken,
    ) -> Result<RunOutcome, gateway::Error> {
        let steps = if lease.token == 1 {
            Vec::new()
        } else {
            self.gateway
                .ledger()
                .list_steps(&lease.run_id)
                .await
                .map_err(gateway::Error::Ledger)?
        };
        let known = Known {
            inputs: &run.inputs,
            steps: &steps,
            cancel_requested: run.cancel_requested,
        };
        self.execute_known(lease, wf, known, stop).await
    }

    async fn execute_known(
        &self,
        lease: RunLease,
        wf: &Workflow,
        known: Known<'_>,
        stop: &CancellationToken,
    ) -> Result<RunOutcome, gateway::Error> {
        let span = tracing::info_span!("run", run = %lease.run_id);
        self.execute_inner(lease, wf, known, stop)
            .instrument(span)
            .await
    }

    async fn execute_inner(
        &self,
        lease: RunLease,
        wf: &Workflow,
        known: Known<'_>,
        stop: &CancellationToken,
    ) -> Result<RunOutcome, gateway::Error> {
        let ledger = self.gateway.ledger().clone();
        let plan = Plan::new(wf).map_err(|_| {
            gateway::Error::Ledger(flow_ledger::Error::NotFound {
                what: "an acyclic workflow".into(),
            })
        })?;
        let prepared = Prepared::new(wf);
        let inputs = known.inputs;
        let mut st = RunState::load(wf, known.steps);

        let cancel = Arc::new(AtomicBool::new(known.cancel_requested));
        let (lost_tx, mut lost_rx) = watch::channel(false);
        let heartbeat = heartbeat::start(
            ledger.clone(),
            lease.clone(),
            self.gateway.clone(),
            cancel.clone(),
            lost_tx,
        );
        let outcome = self
            .drive(
                &lease,
                wf,
                &plan,
                &prepared,
                inputs,
                &mut st,
                &cancel,
                &mut lost_rx,
                stop,
            )
            .await;
        drop(heartbeat);
        outcome
    }

    #[allow(clippy::too_many_arguments)]
    async fn drive(
        &self,
        lease: &RunLease,
        wf: &Workflow,
        plan: &Plan,
        prepared: &Prepared,
        inputs: &Json,
        st: &mut RunState,
        cancel: &AtomicBool,
        lost: &mut watch::Receiver<bool>,
        stop: &CancellationToken,
    ) -> Result<RunOutcome, gateway::Error> {
        let ledger = self.gateway.ledger();
        let mut in_flight = FuturesUnordered::new();
        // Steps that finished while the loop awaited something of its own (see `alongside`).
        let mut done = Vec::new();
        loop {
            for (finished, result) in done.drain(..) {
                self.settle(wf, st, finished, result?);
            }
            if *lost.borrow() {
                return Err(gateway::Error::LeaseLost {
                    run_id: lease.run_id.clone(),
                });
            }
            let now = self.gateway.now();
            let situation = Situation {
                now,
                in_flight: in_flight.len(),
                cancel_requested: cancel.load(Ordering::Relaxed),
            };
            let mut actions = decide(wf, plan, &st.nodes, situation);
            if stop.is_cancelled() {
                // Cooperative stop: start nothing; a run that can end now ends, else it
                // goes back to the queue once the steps in flight are recorded.
                actions.retain(|a| matches!(a, Action::Pause { .. } | Action::Finish { .. }));
                if actions.is_empty() {
                    if in_flight.is_empty() {
                        self.flush_pure(lease, st).await?;
                        return self.release(lease).await;
                    }
                    actions.push(Action::Wait { until: None });
                }
            }
            let mut wait_until = None;
            let mut progressed = false;
            for action in actions {
                match action {
                    Action::Start {
                        node,
                        step_id,
                        retry,
                        existing,
                    } => {
                        progressed = true;
                        let origin = if !existing {
                            StepOrigin::New
                        } else if matches!(st.nodes[node], NodeState::Pending { .. })
                            && !st.deferred.contains(&node)
                        {
                            StepOrigin::Pending
                        } else {
                            StepOrigin::Running
                        };
                        st.deferred.remove(&node);
                        let call = alongside(
                            &mut in_flight,
                            &mut done,
                            self.prepare_start(
                                lease, wf, prepared, inputs, st, node, &step_id, retry, origin,
                            ),
                        )
                        .await?;
                        if let Some(call) = call {
                            st.nodes[node] = NodeState::Running {
                                step_id: step_id.clone(),
                                retry,
                            };
                            st.first_started.entry(node).or_insert(now);
                            self.progress.step(StepEvent::Started {
                                node: &wf.nodes[node].id,
                                step_id: &step_id,
                                retry,
                            });
                            let gateway = self.gateway.clone();
                            let started = Instant::now();
                            let span = tracing::info_span!(
                                "step",
                                step = %step_id,
                                call = %wf.nodes[node].id
                            );
                            let step = async move {
                                let result = gateway.run_step(call).await;
                                (
                                    Finished {
                                        node,
                                        step_id,
                                        retry,
                                        took: started.elapsed(),
                                    },
                                    result,
                                )
                            };
                            in_flight.push(step.instrument(span));
                        }
                    }
                    Action::SkipUpstream { node } => {
                        progressed = true;
                        alongside(
                            &mut in_flight,
                            &mut done,
                            self.skip(lease, wf, st, node, "an upstream node was skipped"),
                        )
                        .await?;
                    }
                    Action::Wait { until } => wait_until = until,
                    Action::Pause { in_doubt } => {
                        let names: Vec<&str> =
                            in_doubt.iter().map(|&i| wf.nodes[i].id.as_str()).collect();
                        let reason = format!("tool call in doubt: {}", names.join(", "));
                        self.flush_pure(lease, st).await?;
                        ledger
                            .pause_run(lease, &reason, self.gateway.now())
                            .await
                            .map_err(|e| lease_err(e, lease))?;
                        return Ok(RunOutcome {
                            status: RunStatus::Paused,
                            output: None,
                            error: Some(reason),
                        });
                    }
                    Action::Finish { outcome } => {
                        // The kept pure results are written with the run's finish.
                        return self.finish(lease, wf, plan, st, outcome).await;
                    }
                }
            }
            // Steps that finished while an action was written are settled now, not after
            // the wait below (which may last as long as the slowest step in flight).
            if (progressed && in_flight.is_empty()) || !done.is_empty() {
                continue;
            }
            // Wait for a step to finish, a retry to come due, or the heartbeat.
            let sleep = wait_until.map(|t| {
                Duration::from_millis(
                    u64::try_from((t.0 - self.gateway.now().0).max(0)).unwrap_or(0),
                )
            });
            // Kept pure results are flushed when due even while other steps run.
            let flush_in = st
                .pure_log
                .due()
                .map(|due| due.saturating_duration_since(Instant::now()));
            tokio::select! {
                Some((finished, result)) = in_flight.next(), if !in_flight.is_empty() => {
                    self.settle(wf, st, finished, result?);
                }
                () = tokio::time::sleep(flush_in.unwrap_or_default()), if flush_in.is_some() => {
                    alongside(&mut in_flight, &mut done, self.flush_pure(lease, st)).await?;
                }
                () = async { tokio::time::sleep(sleep.unwrap_or(Duration::from_secs(3600))).await }, if sleep.is_some() => {}
                _ = lost.changed() => {}
                () = stop.cancelled(), if !stop.is_cancelled() => {}
                () = tokio::time::sleep(Duration::from_millis(500)), if in_flight.is_empty() && sleep.is_none() && !progressed => {}
            }
        }
    }

    /// Checks the condition and the deadline, then builds the gateway request; `None`
    /// when the node was settled without a call (skipped or past its deadline).
    #[allow(clippy::too_many_arguments)]
    async fn prepare_start<'a>(
        &self,
        lease: &'a RunLease,
        wf: &'a Workflow,
        prepared: &Prepared,
        inputs: &Json,
        st: &mut RunState,
        node: usize,
        step_id: &str,
        retry: u32,
        origin: StepOrigin,
    ) -> Result<Option<StepCall<'a>>, gateway::Error> {
        let decl = &wf.nodes[node];
        let now = self.gateway.now();
        let ctx = context(wf, prepared, st, node, inputs, &lease.run_id);
        if retry == 0
            && origin == StepOrigin::New
            && let Some(cond) = &decl.condition
        {
            match expr::eval_condition(cond, &ctx) {
                Ok(false) => {
                    self.skip(lease, wf, st, node, "its `if` condition is false")
                        .await?;
                    return Ok(None);
                }
                Ok(true) => {}
                Err(e) => {
                    let message = format!("`if` of node `{}`: {e}", decl.id);
                    self.fail_now(
                        lease,
                        wf,
                        st,
                        node,
                        step_id,
                        retry,
                        origin,
                        ErrorKind::Permanent,
                        message,
                    )
                    .await?;
                    return Ok(None);
                }
            }
        }
        let first = st.first_started.get(&node).copied().unwrap_or(now);
        let deadline = wf.deadline(decl).map(|d| first.plus(d));
        if let Some(d) = deadline
            && now >= d
        {
            let message = format!(
                "node `{}` passed its deadline of {}",
                decl.id,
                humantime::format_duration(wf.deadline(decl).unwrap_or_default())
            );
            self.fail_now(
                lease,
                wf,
                st,
                node,
                step_id,
                retry,
                origin,
                ErrorKind::Timeout,
                message,
            )
            .await?;
            return Ok(None);
        }
        let mut timeout = wf.timeout(decl);
        if let Some(d) = deadline {
            timeout = timeout.min(Duration::from_millis(
                u64::try_from(d.0 - now.0).unwrap_or(0),
            ));
        }
        let policy = wf.retry_policy(decl);
        let next = retry + 1;
        let next_retry = retry::allows(&policy, next).then(|| {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            NextRetry {
                step_id: format!("{}_retry{next}", decl.id),
                retry: next,
                delay: retry::next_delay(&policy, next, &mut *rng),
                deadline,
            }
        });
        let Some(tool) = wf.tools.get(&decl.tool) else {
            let message = format!("node `{}` uses unknown tool `{}`", decl.id, decl.tool);
            self.fail_now(
                lease,
                wf,
                st,
                node,
                step_id,
                retry,
                origin,
                ErrorKind::Permanent,
                message,
            )
            .await?;
            return Ok(None);
        };
        Ok(Some(StepCall {
            run: lease,
            workflow: wf,
            node: decl,
            tool,
            step_id: step_id.to_string(),
            retry,
            origin,
            ctx,
            timeout,
            next_retry,
            resend_budget: policy.max_retries,
            pure_log: Some(st.pure_log.clone()),
        }))
    }

    /// Writes the kept pure results: before any other write of the run, and when due.
    async fn flush_pure(&self, lease: &RunLease, st: &RunState) -> Result<(), gateway::Error> {
        st.pure_log
            .flush(self.gateway.ledger(), lease, self.gateway.now())
            .await
            .map_err(|e| lease_err(e, lease))
    }

    async fn skip(
        &self,
        lease: &RunLease,
        wf: &Workflow,
        st: &mut RunState,
        node: usize,
        why: &str,
    ) -> Result<(), gateway::Error> {
        self.flush_pure(lease, st).await?;
        let decl = &wf.nodes[node];
        let step = NewStep {
            step_id: decl.id.clone(),
            node_id: decl.id.clone(),
            retry: 0,
            not_before: None,
            status: StepStatus::Skipped,
        };
        self.gateway
            .ledger()
            .create_step(lease, step, self.gateway.now())
            .await
            .map_err(|e| lease_err(e, lease))?;
        st.nodes[node] = NodeState::Skipped;
        self.progress.step(StepEvent::Skipped {
            node: &decl.id,
            why,
        });
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn fail_now(
        &self,
        lease: &RunLease,
        wf: &Workflow,
        st: &mut RunState,
        node: usize,
        step_id: &str,
        retry: u32,
        origin: StepOrigin,
        kind: ErrorKind,
        message: String,
    ) -> Result<(), gateway::Error> {
        self.flush_pure(lease, st).await?;
        let ledger = self.gateway.ledger();
        let now = self.gateway.now();
        let decl = &wf.nodes[node];
        let wrap = |e| lease_err(e, lease);
        match origin {
            StepOrigin::New => {
                let step = NewStep {
                    step_id: step_id.to_string(),
                    node_id: decl.id.clone(),
                    retry,
                    not_before: None,
                    status: StepStatus::Running,
                };
                ledger.create_step(lease, step, now).await.map_err(wrap)?;
            }
            StepOrigin::Pending => {
                ledger.start_step(lease, step_id, now).await.map_err(wrap)?;
            }
            StepOrigin::Running => {}
        }
        let finish = StepFinish {
            step_id: step_id.to_string(),
            status: StepStatus::Failed,
            output: None,
            error: Some(StepError {
                kind,
                message: message.clone(),
            }),
        };
        ledger.finish_step(lease, finish, now).await.map_err(wrap)?;
        self.progress.step(StepEvent::Finished {
            node: &decl.id,
            step_id,
            retry,
            took: Duration::ZERO,
            result: &StepResult::Failed {
                kind,
                message: message.clone(),
                retry: None,
            },
        });
        st.nodes[node] = NodeState::Failed { kind, message };
        Ok(())
    }

    fn settle(&self, wf: &Workflow, st: &mut RunState, f: Finished, result: StepResult) {
        let Finished {
            node,
            step_id,
            retry,
            took,
        } = f;
        let step_id = step_id.as_str();
        self.progress.step(StepEvent::Finished {
            node: &wf.nodes[node].id,
            step_id,
            retry,
            took,
            result: &result,
        });
        st.nodes[node] = match result {
            StepResult::Succeeded { output } => NodeState::Succeeded { output },
            StepResult::Failed {
                retry: Some((step_id, retry, not_before)),
                ..
            } => NodeState::Pending {
                step_id,
                retry,
                not_before,
            },
            StepResult::Failed {
                kind,
                message,
                retry: None,
            } => NodeState::Failed { kind, message },
            StepResult::InDoubt => NodeState::InDoubt {
                step_id: step_id.to_string(),
            },
            StepResult::Deferred { until } => {
                st.deferred.insert(node);
                NodeState::Pending {
                    step_id: step_id.to_string(),
                    retry,
                    not_before: until,
                }
            }
        };
    }

    /// Gives the run back to the queue after a cooperative stop.
    async fn release(&self, lease: &RunLease) -> Result<RunOutcome, gateway::Error> {
        self.gateway
            .ledger()
            .release_run(lease, self.gateway.now())
            .await
            .map_err(|e| lease_err(e, lease))?;
        Ok(RunOutcome {
            status: RunStatus::Queued,
            output: None,
            error: Some("released to the queue: this worker is stopping".to_string()),
        })
    }

    async fn finish(
        &self,
        lease: &RunLease,
        wf: &Workflow,
        plan: &Plan,
        st: &RunState,
        outcome: Finish,
    ) -> Result<RunOutcome, gateway::Error> {
        let (status, output, error) = match outcome {
            Finish::Succeeded => {
                let mut out = Map::new();
                for i in plan.sinks() {
                    let v = match &st.nodes[i] {
                        NodeState::Succeeded { output } => output.clone(),
                        _ => Json::Null,
                    };
                    out.insert(wf.nodes[i].id.clone(), v);
                }
                (RunStatus::Succeeded, Some(Json::Object(out)), None)
            }
            Finish::Failed => {
                let failed: Vec<String> = st
                    .nodes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, n)| match n {
                        NodeState::Failed { message, .. } if !wf.nodes[i].continue_on_error => {
                            Some(format!("node `{}` failed: {message}", wf.nodes[i].id))
                        }
                        _ => None,
                    })
                    .collect();
                (RunStatus::Failed, None, Some(failed.join("; ")))
            }
            Finish::Cancelled => (
                RunStatus::Cancelled,
                None,
                Some("cancelled on request".to_string()),
            ),
        };
        let finish = RunFinish {
            status,
            output: output.clone(),
            error: error.clone(),
        };
        st.pure_log
            .finish(self.gateway.ledger(), lease, finish, self.gateway.now())
            .await
            .map_err(|e| lease_err(e, lease))?;
        Ok(RunOutcome {
            status,
            output,
            error,
        })
    }
}

fn lease_err(e: flow_ledger::Error, lease: &RunLease) -> gateway::Error {
    match e {
        flow_ledger::Error::LeaseLost => gateway::Error::LeaseLost {
            run_id: lease.run_id.clone(),
        },
        other => gateway::Error::Ledger(other),
    }
}

/// What the caller already read about a run, so the executor need not read it again.
struct Known<'a> {
    inputs: &'a Json,
    steps: &'a [Step],
    cancel_requested: bool,
}

/// A step that came back from the gateway.
struct Finished {
    node: usize,
    step_id: String,
    retry: u32,
    took: Duration,
}

/// The run's node states as recorded, plus bookkeeping of this execution.
struct RunState {
    nodes: Vec<NodeState>,
    /// Pure results kept in memory until the next flush (`gateway::lazy`): flushed
    /// before every other write of this run.
    pure_log: Arc<PureLog>,
    first_started: HashMap<usize, Timestamp>,
    deferred: HashSet<usize>,
}

impl RunState {
    fn load(wf: &Workflow, steps: &[Step]) -> Self {
        let index: HashMap<&str, usize> = wf
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id.as_str(), i))
            .collect();
        let mut latest: Vec<Option<&Step>> = vec![None; wf.nodes.len()];
        let mut first_started = HashMap::new();
        for s in steps {
            let Some(&i) = index.get(s.node_id.as_str()) else {
                continue;
            };
            if latest[i].is_none_or(|l| s.retry >= l.retry) {
                latest[i] = Some(s);
            }
            if let Some(t) = s.started_at {
                let e = first_started.entry(i).or_insert(t);
                if t < *e {
                    *e = t;
                }
            }
        }
        let nodes = latest
            .iter()
            .map(|s| match s {
                None => NodeState::NotStarted,
                Some(s) => match s.status {
                    StepStatus::Pending => NodeState::Pending {
                        step_id: s.step_id.clone(),
                        retry: s.retry,
                        not_before: s.not_before.unwrap_or(Timestamp(0)),
                    },
                    StepStatus::Running => NodeState::Interrupted {
                        step_id: s.step_id.clone(),
                        retry: s.retry,
                    },
                    StepStatus::Succeeded => NodeState::Succeeded {
                        output: s.output.clone().unwrap_or(Json::Null),
                    },
                    StepStatus::Failed => NodeState::Failed {
                        kind: s.error_kind.unwrap_or(ErrorKind::Permanent),
                        message: s.error_message.clone().unwrap_or_default(),
                    },
                    StepStatus::Skipped => NodeState::Skipped,
                    StepStatus::Paused => NodeState::InDoubt {
                        step_id: s.step_id.clone(),
                    },
                    StepStatus::Cancelled => NodeState::Cancelled,
                },
            })
            .collect();
        Self {
            nodes,
            pure_log: Arc::new(PureLog::new()),
            first_started,
            deferred: HashSet::new(),
        }
    }
}

/// The expression context of a node: inputs, the run id, and the outputs it reads.
fn context(
    wf: &Workflow,
    prepared: &Prepared,
    st: &RunState,
    node: usize,
    inputs: &Json,
    run_id: &str,
) -> Json {
    let mut nodes = Map::new();
    for &i in &prepared.reads[node] {
        let output = match &st.nodes[i] {
            NodeState::Succeeded { output } => output.clone(),
            _ => Json::Null,
        };
        nodes.insert(wf.nodes[i].id.clone(), json!({ "output": output }));
    }
    json!({ "inputs": inputs, "nodes": nodes, "run": { "id": run_id } })
}

/// Awaits `work` of the run loop's own while still polling the steps in flight, keeping
/// what they finish in `done` for the loop to settle next.
///
/// Otherwise the loop polls its steps only while it waits in its `select!`, and its own
/// awaits (a due flush of kept pure results, a skipped or failed step's write) can wait
/// for something a step holds — the pure log while the step flushes it, a row its open
/// transaction has locked. A step that is not polled never lets go, and the run hangs
/// for good: it did in CI, after "✓ prepare" (`crash::a_waiting_ledger_write_does_not_wedge_the_run`
/// reproduces it; this and the pure log's own write task each fix it alone).
async fn alongside<S, W>(in_flight: &mut S, done: &mut Vec<S::Item>, work: W) -> W::Output
where
    S: futures::Stream + Unpin,
    W: std::future::Future,
{
    tokio::pin!(work);
    loop {
        tokio::select! {
            biased;
            out = &mut work => return out,
            Some(item) = in_flight.next() => done.push(item),
        }
    }
}
