//! The loop that performs [`super::decide`]'s actions for one run this worker holds.
//!
//! State is loaded from the ledger once ([`super::state`]), then kept in memory from the
//! results of this process's own actions (each already committed), so a node costs no
//! extra reads. A heartbeat task renews the run lease and reports cancellation requests.
//! A caller that must stop (a daemon shutting down) fires a stop token: no new step
//! starts, steps in flight finish and are recorded, and the run goes back to the queue.
//! A node's start is prepared in [`super::start`]; what the loop passes around is a
//! [`RunScope`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flow_ledger::{ErrorKind, Run, RunLease, RunStatus, Step, Timestamp};
use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::Value as Json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::decide::{Action, Situation, decide};
use super::handle::Executor;
use super::heartbeat;
use super::node::NodeState;
use super::progress::StepEvent;
use super::scope::{Prepared, RunScope, StepAt, lease_err};
use super::start::Started;
use super::state::RunState;
use crate::gateway::{self, RunWriter, StepResult};
use crate::workflow::ValidWorkflow;

/// How far off a run's next start must be before a parking executor puts the run back on
/// the queue rather than waiting with it (shorter waits cost less than a claim).
const PARK_AFTER_MS: i64 = 900;

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

impl Executor {
    /// Executes the run held by `lease` until it finishes, pauses or is cancelled.
    /// Errors mean this process must stop touching the run (lease lost, ledger down);
    /// the run itself is left for a later resume.
    pub async fn execute(
        &self,
        lease: RunLease,
        wf: &ValidWorkflow,
        inputs: &Json,
    ) -> Result<RunOutcome, gateway::Error> {
        self.execute_reading(lease, wf, Some(inputs), &CancellationToken::new())
            .await
    }

    /// [`Executor::execute`] that also stops when `stop` fires (`flow run` on Ctrl-C):
    /// no new step starts, the steps in flight finish and are recorded, and the run is
    /// released to the queue (the outcome's status is `Queued`) unless it could end at
    /// once. The inputs are the run's stored ones.
    pub async fn execute_until(
        &self,
        lease: RunLease,
        wf: &ValidWorkflow,
        stop: &CancellationToken,
    ) -> Result<RunOutcome, gateway::Error> {
        self.execute_reading(lease, wf, None, stop).await
    }

    /// Reads the run and its steps, then executes it; `inputs` overrides the run's
    /// stored inputs when given.
    async fn execute_reading(
        &self,
        lease: RunLease,
        wf: &ValidWorkflow,
        inputs: Option<&Json>,
        stop: &CancellationToken,
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
            inputs: inputs.unwrap_or(&run.inputs),
            steps: &steps,
            cancel_requested: run.cancel_requested,
            trace_segment: run.trace_segment.as_deref(),
        };
        self.execute_known(lease, wf, known, stop).await
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
        wf: &ValidWorkflow,
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
            trace_segment: run.trace_segment.as_deref(),
        };
        self.execute_known(lease, wf, known, stop).await
    }

    async fn execute_known(
        &self,
        lease: RunLease,
        wf: &ValidWorkflow,
        known: Known<'_>,
        stop: &CancellationToken,
    ) -> Result<RunOutcome, gateway::Error> {
        let span = crate::telemetry::spans::run(&lease.run_id, &wf.name, lease.token);
        self.trace_segment(&lease, &span, known.trace_segment).await;
        let outcome = self
            .execute_inner(lease, wf, known, stop)
            .instrument(span.clone())
            .await;
        let status = match &outcome {
            Ok(o) => o.status.as_str(),
            Err(_) => "interrupted",
        };
        crate::telemetry::spans::run_ended(&span, status);
        outcome
    }

    /// A run's first segment continues its submitter's trace (`previous` before the first
    /// claim); a later one links to the previous segment. A traced segment is recorded as
    /// the run's latest (one fenced write, only when traced), so the next links to it.
    async fn trace_segment(&self, lease: &RunLease, span: &tracing::Span, previous: Option<&str>) {
        use crate::telemetry::w3c;
        // Before `of`, which starts the span: a parent can only be given before.
        match previous {
            Some(submitter) if lease.token == 1 => w3c::continue_from(span, submitter),
            Some(segment) => w3c::link(span, segment, None),
            None => {}
        }
        let Some((context, _)) = w3c::of(span) else {
            return;
        };
        if let Err(e) = self
            .gateway
            .ledger()
            .set_trace_segment(lease, &context)
            .await
        {
            tracing::debug!(error = %e, "cannot record the run's trace segment");
        }
    }

    async fn execute_inner(
        &self,
        lease: RunLease,
        wf: &ValidWorkflow,
        known: Known<'_>,
        stop: &CancellationToken,
    ) -> Result<RunOutcome, gateway::Error> {
        let ledger = self.gateway.ledger().clone();
        let prepared = Prepared::new(wf);
        let mut st = RunState::load(wf, known.steps);

        let cancel = Arc::new(AtomicBool::new(known.cancel_requested));
        let (lost_tx, mut lost_rx) = watch::channel(false);
        let window = flow_adapters::Window::until(crate::lease::local_deadline(
            lease.expires_at,
            self.gateway.now(),
        ));
        let heartbeat = heartbeat::start(
            ledger.clone(),
            lease.clone(),
            self.gateway.clone(),
            cancel.clone(),
            window.clone(),
            lost_tx,
        );
        let writer = RunWriter::new(ledger.clone(), lease.clone(), window);
        let scope = RunScope {
            gateway: &self.gateway,
            progress: &*self.progress,
            rng: &self.rng,
            writer: &writer,
            wf,
            plan: wf.plan(),
            prepared: &prepared,
            inputs: known.inputs,
            executor: self,
            halt: stop,
            cancel: &cancel,
        };
        let outcome = match scope.rebuild_fans(&mut st).await {
            Ok(()) => scope.drive(&mut st, &cancel, &mut lost_rx, stop).await,
            Err(e) => Err(e),
        };
        drop(heartbeat);
        outcome
    }
}

impl<'a> RunScope<'a> {
    /// The run loop: settle what finished, ask `decide`, perform its actions, then wait
    /// for a step, a due retry or flush, the heartbeat or the stop token.
    async fn drive(
        &self,
        st: &mut RunState,
        cancel: &AtomicBool,
        lost: &mut watch::Receiver<bool>,
        stop: &CancellationToken,
    ) -> Result<RunOutcome, gateway::Error> {
        let (lease, wf) = (self.lease(), self.wf);
        let mut in_flight = FuturesUnordered::new();
        // Steps that finished while the loop awaited something of its own (see `alongside`).
        let mut done = Vec::new();
        loop {
            for (finished, result) in done.drain(..) {
                self.settle(st, finished, result?);
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
            let mut actions = decide(wf, self.plan, &st.nodes, situation);
            if stop.is_cancelled() {
                // Cooperative stop: start nothing; a run that can end now ends, else it
                // goes back to the queue once the steps in flight are recorded.
                actions.retain(|a| matches!(a, Action::Pause { .. } | Action::Finish { .. }));
                if actions.is_empty() {
                    if in_flight.is_empty() {
                        return self.release().await;
                    }
                    actions.push(Action::Wait { until: None });
                }
            }
            // Before pausing on calls in doubt, ask the downstreams that can say.
            if let [Action::Pause { in_doubt, .. }] = actions.as_slice()
                && !(in_doubt.is_empty() || stop.is_cancelled())
                && self.reconcile(st, in_doubt, cancel, lost).await?
            {
                continue;
            }
            if let [Action::Wait { until: Some(until) }] = actions.as_slice()
                && self.executor.parks
                && in_flight.is_empty()
                && until.0 - now.0 >= PARK_AFTER_MS
            {
                return self.park(*until).await;
            }
            let mut wait_until = None;
            let mut progressed = false;
            for action in actions {
                match action {
                    Action::Start {
                        node,
                        step_id,
                        retry,
                        origin,
                        item,
                    } => {
                        progressed = true;
                        let key = st.item_key(node, item);
                        let at = StepAt {
                            node,
                            step_id: &step_id,
                            retry,
                            origin,
                            item: item.zip(key.as_deref()),
                        };
                        let step = alongside(&mut in_flight, &mut done, self.prepare_start(st, at))
                            .await?;
                        if let Some(step) = step {
                            in_flight.push(self.launch(st, node, item, step, now));
                        }
                    }
                    a @ (Action::Expand { .. }
                    | Action::Close { .. }
                    | Action::SkipUpstream { .. }) => {
                        progressed = true;
                        alongside(&mut in_flight, &mut done, self.write_action(st, a)).await?;
                    }
                    Action::Wait { until } => wait_until = until,
                    Action::Pause { in_doubt, awaiting } => {
                        if let Some(outcome) = self.pause(st, &in_doubt, &awaiting).await? {
                            return Ok(outcome);
                        }
                        progressed = true;
                    }
                    Action::Finish { outcome } => {
                        // The kept pure results are written with the run's finish.
                        return self.finish(st, outcome).await;
                    }
                }
            }
            // Steps that finished while an action was written are settled now, not after
            // the wait below (which may last as long as the slowest step in flight).
            if (progressed && in_flight.is_empty()) || !done.is_empty() {
                continue;
            }
            let idle = in_flight.is_empty() && wait_until.is_none() && !progressed;
            let flush_due = self
                .wait_for_change(st, &mut in_flight, wait_until, idle, lost, stop)
                .await?;
            if flush_due {
                alongside(&mut in_flight, &mut done, self.flush_pure()).await?;
            }
        }
    }

    /// Waits for whichever comes first: a step in flight finishing (settled here), the
    /// kept pure results coming due for their flush (even while other steps run: the
    /// answer is `true`, the caller flushes), a retry due at `until`, the heartbeat
    /// losing the lease, the stop token — or, when the loop is `idle` (nothing in
    /// flight, due or just done), half a second.
    async fn wait_for_change<F>(
        &self,
        st: &mut RunState,
        in_flight: &mut FuturesUnordered<F>,
        until: Option<Timestamp>,
        idle: bool,
        lost: &mut watch::Receiver<bool>,
        stop: &CancellationToken,
    ) -> Result<bool, gateway::Error>
    where
        F: Future<Output = (Finished, Result<StepResult, gateway::Error>)>,
    {
        let sleep = until.map(|t| {
            Duration::from_millis(u64::try_from((t.0 - self.gateway.now().0).max(0)).unwrap_or(0))
        });
        let flush_in = self
            .writer
            .due()
            .map(|due| due.saturating_duration_since(Instant::now()));
        tokio::select! {
            Some((finished, result)) = in_flight.next(), if !in_flight.is_empty() => {
                self.settle(st, finished, result?);
            }
            () = tokio::time::sleep(flush_in.unwrap_or_default()), if flush_in.is_some() => {
                return Ok(true);
            }
            () = async { tokio::time::sleep(sleep.unwrap_or(Duration::from_secs(3600))).await }, if sleep.is_some() => {}
            _ = lost.changed() => {}
            () = stop.cancelled(), if !stop.is_cancelled() => {}
            () = tokio::time::sleep(Duration::from_millis(500)), if idle => {}
        }
        Ok(false)
    }

    /// Writes what an action decides without a call: a node skipped because an upstream
    /// node was, a fan-out's list, a fan-out's close.
    async fn write_action(&self, st: &mut RunState, a: Action) -> Result<(), gateway::Error> {
        match a {
            Action::SkipUpstream { node } => {
                self.skip(st, node, "an upstream node was skipped").await
            }
            Action::Expand { node } => self.expand(st, node).await,
            Action::Close { node } => self.close(st, node).await,
            _ => Ok(()),
        }
    }

    /// Marks `node` running and returns its step: the gateway call, timed, in its span.
    /// The future borrows only what the call does (`'a`), not the loop's state.
    fn launch(
        &self,
        st: &mut RunState,
        node: usize,
        item: Option<usize>,
        started: Started<'a>,
        now: Timestamp,
    ) -> impl Future<Output = (Finished, Result<StepResult, gateway::Error>)> + use<'a> {
        let call = started.step();
        let (step_id, retry) = (call.step_id.clone(), call.retry);
        let running = NodeState::Running {
            step_id: step_id.clone(),
            retry,
        };
        st.put(node, item, running);
        st.first_started.entry(node).or_insert(now);
        let id = &self.wf.nodes[node].id;
        self.progress.step(StepEvent::Started {
            node: id,
            step_id: &step_id,
            retry,
        });
        let gateway = self.gateway.clone();
        let child = self.wf.child(id).map(|child| super::child::ChildCtx {
            executor: self.executor.nested(id),
            child: child.clone(),
            halt: self.halt.clone(),
            cancel: self.cancel.clone(),
        });
        let clock = Instant::now();
        let span = crate::telemetry::spans::step(
            &crate::telemetry::spans::Step {
                run_id: &call.run().run_id,
                node: &call.call_id,
                step_id: &step_id,
                retry,
            },
            // The target only decides what is exported: no registry lookup per step
            // when nothing is.
            crate::telemetry::enabled()
                && matches!(&started, Started::Call(c) if self.gateway.tools().is_pure(c.tool)),
        );
        let step = async move {
            // Boxed: the gateway's future is tens of kilobytes (every phase of a call),
            // and inline it made this future as large, copied several times per node
            // as it was built, instrumented and pushed into the set in flight (a third
            // of the executor's instructions on a fan-out of pure nodes, callgrind).
            // Only a call crosses the gateway; a wait and a child run are the executor's.
            let result = match (started, child) {
                (Started::Call(call), _) => Box::pin(gateway.run_step(call)).await,
                (Started::Wait(step, w), _) => {
                    Box::pin(super::wait::run_wait(&gateway, step, w)).await
                }
                (Started::Child(step), Some(cx)) => {
                    Box::pin(super::child::run_child(cx, step)).await
                }
                (Started::Child(step), None) => {
                    let message =
                        format!("the sub-workflow of node `{}` is not loaded", step.node.id);
                    gateway
                        .child_failed(&step, ErrorKind::Permanent, message)
                        .await
                }
            };
            (
                Finished {
                    node,
                    item,
                    step_id,
                    retry,
                    took: clock.elapsed(),
                },
                result,
            )
        };
        step.instrument(span)
    }

    /// Pauses the run because the calls of `in_doubt` are in doubt and those of
    /// `awaiting` await approval; `None` (nothing paused) when an approval was decided
    /// while this worker held the run — those nodes are then marked to start again.
    async fn pause(
        &self,
        st: &mut RunState,
        in_doubt: &[usize],
        awaiting: &[usize],
    ) -> Result<Option<RunOutcome>, gateway::Error> {
        let lease = self.lease();
        let names = |list: &[usize]| {
            list.iter()
                .map(|&i| in_doubt_name(self.wf, st, i))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut why = Vec::new();
        if !in_doubt.is_empty() {
            why.push(format!("tool call in doubt: {}", names(in_doubt)));
        }
        // A fan-out may have items awaiting approval and items waiting on children.
        let approvals: Vec<usize> = awaiting
            .iter()
            .copied()
            .filter(|&i| match &st.nodes[i] {
                NodeState::AwaitingApproval { .. } => true,
                NodeState::FanOut(fan) => fan.approving() > 0,
                _ => false,
            })
            .collect();
        if !approvals.is_empty() {
            let named: Vec<String> = approvals
                .iter()
                .map(|&i| match &st.nodes[i] {
                    NodeState::FanOut(fan) => {
                        items_named(&self.wf.nodes[i].id, fan.approving_keys())
                    }
                    _ => self.wf.nodes[i].id.clone(),
                })
                .collect();
            why.push(format!("awaiting approval: {}", named.join(", ")));
        }
        let (children, waiting): (Vec<usize>, Vec<usize>) = awaiting
            .iter()
            .filter(|&&i| match &st.nodes[i] {
                NodeState::Waiting { .. } => true,
                NodeState::FanOut(fan) => fan.waiting() > 0,
                _ => false,
            })
            .partition(|&&i| self.wf.nodes[i].child().is_some());
        if !waiting.is_empty() {
            why.push(format!("waiting: {}", names(&waiting)));
        }
        if !children.is_empty() {
            why.push(format!(
                "waiting on child: {}",
                self.children_named(st, &children)
            ));
        }
        let reason = why.join("; ");
        let now = self.gateway.now();
        if awaiting.is_empty() {
            self.writer
                .pause(&reason, now)
                .await
                .map_err(|e| lease_err(e, lease))?;
        } else {
            let paused = self
                .writer
                .pause_awaiting(&reason, now)
                .await
                .map_err(|e| lease_err(e, lease))?;
            if !paused {
                for &i in awaiting {
                    match &mut st.nodes[i] {
                        NodeState::AwaitingApproval { step_id, retry }
                        | NodeState::Waiting { step_id, retry, .. } => {
                            st.nodes[i] = NodeState::Interrupted {
                                step_id: step_id.clone(),
                                retry: *retry,
                            };
                        }
                        NodeState::FanOut(fan) => fan.interrupt_awaiting(),
                        _ => {}
                    }
                }
                return Ok(None);
            }
        }
        Ok(Some(RunOutcome {
            status: RunStatus::Paused,
            output: None,
            error: Some(reason),
        }))
    }

    /// The child runs sub-workflow nodes wait on, for the pause reason: `node (run
    /// <id>)`, or for a fan-out `node: n items`.
    fn children_named(&self, st: &RunState, nodes: &[usize]) -> String {
        nodes
            .iter()
            .map(|&i| {
                let id = &self.wf.nodes[i].id;
                match &st.nodes[i] {
                    NodeState::Waiting {
                        on: crate::gateway::Awaited::Child(run),
                        ..
                    } => format!("{id} (run {run})"),
                    NodeState::Waiting {
                        on: crate::gateway::Awaited::ChildInDoubt(run),
                        ..
                    } => format!("{id} (run {run}, a call in doubt there)"),
                    NodeState::FanOut(fan) => match fan.waiting() {
                        1 => format!("{id}: 1 item"),
                        n => format!("{id}: {n} items"),
                    },
                    _ => id.clone(),
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Records what a step's call came back with in the node's state (and reports it).
    fn settle(&self, st: &mut RunState, f: Finished, result: StepResult) {
        let wf = self.wf;
        let Finished {
            node,
            item,
            step_id,
            retry,
            took,
        } = f;
        let step_id = step_id.as_str();
        self.progress.step(StepEvent::Finished {
            node: &wf.nodes[node].id,
            tool: wf.nodes[node].step_tool(),
            step_id,
            retry,
            took,
            result: &result,
        });
        let state = match result {
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
            StepResult::AwaitingApproval { .. } => NodeState::AwaitingApproval {
                step_id: step_id.to_string(),
                retry,
            },
            StepResult::Waiting { on, .. } => NodeState::Waiting {
                step_id: step_id.to_string(),
                retry,
                on,
            },
            StepResult::Skipped { .. } => NodeState::Skipped,
            StepResult::Deferred { until, .. } | StepResult::TaskWorking { until, .. } => {
                NodeState::Deferred {
                    step_id: step_id.to_string(),
                    retry,
                    until,
                }
            }
        };
        st.put(node, item, state);
    }
}

/// How a paused node is named: its id, or for a `for_each` node its items in doubt
/// (`notify[a], notify[b] and 3 more`).
fn in_doubt_name(wf: &ValidWorkflow, st: &RunState, i: usize) -> String {
    let id = &wf.nodes[i].id;
    let keys: Vec<&str> = match (&st.nodes[i], st.items.get(&i)) {
        (NodeState::FanOut(fan), _) => fan.in_doubt_keys().collect(),
        // Reloaded after a probe: the items are not joined to their node yet.
        (_, Some(items)) => items
            .iter()
            .filter(|(_, s)| matches!(s, NodeState::InDoubt { .. }))
            .map(|(k, _)| k.as_str())
            .collect(),
        _ => return id.clone(),
    };
    items_named(id, keys.into_iter())
}

/// Items of node `id` by name, sorted, the first five named: `n[a], n[b], and 3 more`.
fn items_named<'k>(id: &str, keys: impl Iterator<Item = &'k str>) -> String {
    let mut keys: Vec<&str> = keys.collect();
    keys.sort_unstable();
    let mut names: Vec<String> = keys.iter().take(5).map(|k| format!("{id}[{k}]")).collect();
    if keys.len() > 5 {
        names.push(format!("and {} more", keys.len() - 5));
    }
    names.join(", ")
}

/// What the caller already read about a run, so the executor need not read it again.
struct Known<'a> {
    inputs: &'a Json,
    steps: &'a [Step],
    cancel_requested: bool,
    /// The previous execution segment's span context, when it was traced.
    trace_segment: Option<&'a str>,
}

/// A step that came back from the gateway.
struct Finished {
    node: usize,
    /// The item of a `for_each` node.
    item: Option<usize>,
    step_id: String,
    retry: u32,
    took: Duration,
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
