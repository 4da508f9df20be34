//! The gateway: the at-most-once boundary every tool call crosses (README: "How
//! at-most-once works").
//!
//! Order of one call: render `with` and the tool spec, resolve secrets (missing → a
//! permanent failure, no claim) → egress allow-list (denied → permanent, no claim) →
//! ledger claim (replay / in doubt / busy / conflict end here) → a downstream's
//! hold-off, the rate limit and daily quota, counted in the ledger (limited → release the
//! claim and defer; not an attempt) → fenced `mark_outbound` (committed before any byte
//! leaves; for a tool with `concurrency:` it takes a slot in the same transaction, and
//! with none free the claim is let go and the call waits in line) → the adapter under the
//! per-attempt timeout, renewing the call lease while waiting → outcome, attempt row,
//! usage rows, step finish and the next retry step in one transaction.
//!
//! Pure in-process functions skip the claim and the outbound mark: nothing leaves the
//! process, so they are recorded in one commit (step, call and outcome together) — or,
//! for a node's successful first attempt, kept in the run's [`PureLog`] and recorded
//! with the next ones (`lazy.rs`), which is flushed before any other write of the run.

mod approve;
mod child;
mod deferral;
pub mod disposition;
pub mod egress;
pub mod lazy;
mod outbound;
mod prepare;
mod record;
pub mod render;
mod task;
mod tools;
mod trace;
mod wait;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use flow_adapters::{Call, FailureKind, SideEffect, Tool};
use flow_ledger::{
    CallClaim, CallLease, ClaimCall, Clock, ErrorKind, Ledger, RateAcquire, RateDecision,
    Resolution, Resolve, RunLease, StepStatus, Timestamp, Window,
};
use serde_json::Value as Json;

pub use deferral::Deferral;
pub use disposition::{Disposition, History, Observed, disposition};
pub use lazy::PureLog;
pub use render::Target;
pub use tools::Tools;
pub use wait::{Awaited, token_hash};
pub use writer::RunWriter;

use crate::fault::{Faults, Point};
use crate::secrets::Secrets;
use crate::workflow::{NodeDecl, ToolDecl, Workflow};
use egress::Egress;

/// Problems that stop the whole run's execution here (not a node failure).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another worker holds the run now; this process must stop touching it.
    #[error("lost the lease on run {run_id}")]
    LeaseLost {
        /// The run.
        run_id: String,
    },
    /// The ledger failed (database unreachable, …).
    #[error(transparent)]
    Ledger(flow_ledger::Error),
}

impl Error {
    /// A ledger error of a step of `run_id`: a lost lease names the run (the executor
    /// stops that run's execution, nothing else).
    pub(crate) fn from_ledger(e: flow_ledger::Error, run_id: &str) -> Self {
        match e {
            flow_ledger::Error::LeaseLost => Self::LeaseLost {
                run_id: run_id.to_string(),
            },
            other => Self::Ledger(other),
        }
    }
}

/// Everything the gateway needs; cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
    }
}

struct Inner {
    ledger: Ledger,
    clock: Arc<dyn Clock>,
    tools: Tools,
    secrets: Secrets,
    egress: Egress,
    /// `egress`'s list as the HTTP adapter checks it on every redirect hop.
    allow_list: Option<flow_adapters::egress::AllowList>,
    /// `[[policy.approvals]]`: calls that need an approval whatever the workflow says.
    policy: crate::policy::Policy,
    faults: Faults,
    /// `[api] public_url`: where `callback.url` points (unset: callback nodes fail
    /// before anything is sent).
    public_url: Option<String>,
}

/// Where the step row of a call stands before the gateway runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepOrigin {
    /// No row yet: create it running.
    New,
    /// A pending retry step whose `not_before` passed: start it.
    Pending,
    /// A running step (interrupted, deferred or resolved for re-send): keep it.
    Running,
}

/// The retry step to create if this attempt fails with a retryable error.
#[derive(Debug, Clone)]
pub struct NextRetry {
    /// `node_retry<n>`.
    pub step_id: String,
    /// n.
    pub retry: u32,
    /// Backoff before it may start.
    pub delay: Duration,
    /// The node's deadline: no retry may start after it.
    pub deadline: Option<Timestamp>,
}

/// One step of one node, whatever its kind: what the executor knows when it starts it
/// (its row, its retry, its context, its clock). A call node's step crosses the gateway
/// as a [`StepCall`]; a wait's or a child's is run by the executor with the gateway's
/// step helpers.
#[derive(Debug, Clone)]
pub struct NodeStep<'a> {
    /// The run's writer: its lease (fencing) and its kept pure results.
    pub writer: &'a RunWriter,
    /// The workflow (for its name: rate-limit keys).
    pub workflow: &'a Workflow,
    /// The node.
    pub node: &'a NodeDecl,
    /// The step id.
    pub step_id: String,
    /// The call's id in the ledger: the node id, or `node[<key>]` for an item of a
    /// `for_each` node. The default idempotency key is `<run>:<call_id>`.
    pub call_id: String,
    /// The step's retry number.
    pub retry: u32,
    /// Whether the step row exists.
    pub origin: StepOrigin,
    /// Expression context: `inputs`, `nodes` (ancestors' outputs), `run`.
    pub ctx: Json,
    /// Per-attempt timeout (already capped by the deadline).
    pub timeout: Duration,
    /// Retry to schedule on a retryable failure, if the budget allows one.
    pub next_retry: Option<NextRetry>,
    /// Most re-sends with the same key for a self-resolving tool (read-only or
    /// `idempotency: header`) whose outcome is unknown: the node's retry budget.
    pub resend_budget: u32,
    /// The secrets plus this call's own (a callback token), set by the gateway: what
    /// the call's stored request, output and errors are scrubbed with.
    pub scrub: Option<Secrets>,
}

impl NodeStep<'_> {
    /// The run lease this call's writes are fenced by.
    pub fn run(&self) -> &RunLease {
        self.writer.lease()
    }
}

/// A call node's step with its tool: the only thing that crosses the at-most-once
/// boundary ([`Gateway::run_step`]).
#[derive(Debug, Clone)]
pub struct StepCall<'a> {
    /// The step.
    pub step: NodeStep<'a>,
    /// The node's tool.
    pub tool: &'a ToolDecl,
}

impl<'a> std::ops::Deref for StepCall<'a> {
    type Target = NodeStep<'a>;

    fn deref(&self) -> &NodeStep<'a> {
        &self.step
    }
}

impl std::ops::DerefMut for StepCall<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.step
    }
}

/// What became of a step.
#[derive(Debug, Clone, PartialEq)]
pub enum StepResult {
    /// The call succeeded (or was replayed as succeeded).
    Succeeded {
        /// The output (secrets scrubbed).
        output: Json,
    },
    /// The call failed; `retry` is the retry step created with it, if any.
    Failed {
        /// Error kind.
        kind: ErrorKind,
        /// Error message (secrets scrubbed).
        message: String,
        /// The retry step scheduled in the same transaction.
        retry: Option<(String, u32, Timestamp)>,
    },
    /// The call is in doubt; the step is paused.
    InDoubt,
    /// Nothing was sent; try again at `until`.
    Deferred {
        /// When to try again.
        until: Timestamp,
        /// Why it waits.
        why: Deferral,
    },
    /// The node's call awaits approval (nothing claimed, nothing sent): the node waits,
    /// and the run pauses once nothing else can run.
    AwaitingApproval {
        /// When the approval times out.
        deadline: Timestamp,
    },
    /// The node waits for an event or its callback (after its call succeeded): the
    /// run pauses once nothing else can run; an event, a callback or the deadline's
    /// sweep puts it back on the queue.
    Waiting {
        /// When the wait times out.
        deadline: Timestamp,
        /// What it waits for.
        on: Awaited,
    },
    /// Not run: its approval timed out with `on_timeout: skip`.
    Skipped {
        /// Why.
        why: String,
    },
    /// The call's remote task was still working when the attempt's time ran out: the
    /// call stays outbound with its task (not in doubt); start the step again at
    /// `until` to ask how the task ended.
    TaskWorking {
        /// The task id.
        task: String,
        /// When to ask again.
        until: Timestamp,
    },
}

/// The ledger's name for an adapter error kind.
pub fn ledger_kind(kind: &FailureKind) -> ErrorKind {
    match kind {
        FailureKind::Permanent => ErrorKind::Permanent,
        FailureKind::Transient { .. } => ErrorKind::Transient,
        FailureKind::Unknown => ErrorKind::Unknown,
        FailureKind::NotSent => ErrorKind::NotSent,
    }
}

/// What the gateway checks before a call leaves, both read once from flow.toml: where
/// a request may go (`[egress]`) and which calls need an approval or are refused
/// (`[[policy]]`).
#[derive(Debug, Default)]
pub struct Guards {
    /// The hosts requests may reach.
    pub egress: Egress,
    /// The approval and refusal rules.
    pub policy: crate::policy::Policy,
}

/// The adapter a call goes out through and what the call does to the world: the two
/// travel together from the claim to the outcome (the class judges an unknown outcome).
#[derive(Clone, Copy)]
pub(crate) struct Via<'a> {
    /// The tool's adapter.
    pub(crate) tool: &'a dyn Tool,
    /// Its side-effect class.
    pub(crate) class: SideEffect,
}

/// A call's lease and the window in which this process knows it holds (renewals move
/// it): what a request may leave under.
#[derive(Clone, Copy)]
pub(crate) struct Held<'a> {
    /// The call lease.
    pub(crate) lease: &'a CallLease,
    /// Its window by this process's monotonic clock.
    pub(crate) window: &'a flow_adapters::Window,
}

impl<'a> Held<'a> {
    /// `lease` within `window`.
    pub(crate) fn new(lease: &'a CallLease, window: &'a flow_adapters::Window) -> Self {
        Self { lease, window }
    }
}

impl Gateway {
    /// A gateway over `ledger` with the given tools, secrets and egress policy.
    pub fn new(
        ledger: Ledger,
        clock: Arc<dyn Clock>,
        tools: Tools,
        secrets: Secrets,
        guards: Guards,
        public_url: Option<String>,
        faults: Faults,
    ) -> Self {
        let Guards { egress, policy } = guards;
        // Discovered MCP authorization URLs are fetched by the pool, past this gate.
        tools.mcp.restrict_egress(egress.allow_list());
        crate::connections::store::install(&tools.mcp, &ledger, &clock, &secrets, &egress);
        Self {
            inner: Arc::new(Inner {
                ledger,
                clock,
                tools,
                secrets,
                allow_list: egress.allow_list(),
                egress,
                policy,
                faults,
                public_url: public_url.map(|u| u.trim_end_matches('/').to_owned()),
            }),
        }
    }

    /// The ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.inner.ledger
    }

    /// The clock.
    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// The clock itself, for the services beside the executor (event delivery,
    /// retention) that keep time on their own: the process has this one.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    /// The secrets (for scrubbing logs).
    pub fn secrets(&self) -> &Secrets {
        &self.inner.secrets
    }

    /// What a call's stored request, output and errors are scrubbed with: the
    /// process's secrets, plus the call's own callback token.
    pub(super) fn secrets_of<'s>(&'s self, c: &'s NodeStep<'_>) -> &'s Secrets {
        c.scrub.as_ref().unwrap_or(&self.inner.secrets)
    }

    /// The tools (for validation of function names).
    pub fn tools(&self) -> &Tools {
        &self.inner.tools
    }

    /// The egress policy, and its list as the HTTP adapter checks it on every redirect
    /// hop (a reconciliation probe obeys both, as any call does).
    pub fn egress(&self) -> (&Egress, Option<&flow_adapters::egress::AllowList>) {
        (&self.inner.egress, self.inner.allow_list.as_ref())
    }

    /// Runs one step through the boundary.
    pub async fn run_step(&self, c: StepCall<'_>) -> Result<StepResult, Error> {
        let run_id = c.run().run_id.clone();
        self.run_step_inner(c)
            .await
            .map_err(|e| Error::from_ledger(e, &run_id))
    }

    async fn run_step_inner(&self, mut c: StepCall<'_>) -> Result<StepResult, flow_ledger::Error> {
        let started_at = self.now();
        // A callback node's token exists (hashed, in the ledger) before its call is
        // rendered with it, and is scrubbed from everything stored like a secret.
        if let Some(cb) = c.node.callback() {
            let minted = match self.mint_callback(&c, cb).await? {
                Ok(m) => m,
                Err(done) => return Ok(done),
            };
            if let Json::Object(map) = &mut c.ctx {
                map.insert("callback".into(), minted.ctx);
            }
            c.scrub = Some(
                self.inner
                    .secrets
                    .with_value("callback.url", &minted.url)
                    .with_value("callback.token", &minted.token),
            );
        }

        // 1–2. Secrets, `with`, the idempotency key, the tool spec; egress.
        let rendered = match self.render_request(&c) {
            Ok(r) => r,
            Err(message) => {
                return self
                    .fail_without_claim(&c, ErrorKind::Permanent, message)
                    .await;
            }
        };

        // Pure functions: no claim, no outbound mark, one commit.
        if let Target::Function { name } = &rendered.target
            && let Some(f) = self.inner.tools.functions.get(name)
            && f.is_pure()
        {
            let Rendered {
                args,
                base_key,
                request,
                request_hash,
                ..
            } = rendered;
            let out = f
                .call(Call::new(
                    args,
                    format!("{base_key}:{}", c.retry + 1),
                    c.timeout,
                ))
                .await;
            return self
                .record_pure(&c, base_key, request, request_hash, started_at, out)
                .await;
        }
        // The rest is a call that leaves the process, boxed: its future (claim, rate
        // limit, outbound mark, sends, completion) is tens of kilobytes, and inline it
        // made every step's future as large — a pure node's too, copied several times
        // as the executor built and queued it (callgrind, benches/README.md "W2").
        Box::pin(self.call_out(&c, rendered)).await
    }

    /// Steps 3–7 of a call to a tool outside the process: the claim (after the pure
    /// results this request may have been built from), rate limit and quota, the
    /// outbound mark, the sends and the outcome.
    async fn call_out(
        &self,
        c: &StepCall<'_>,
        rendered: Rendered,
    ) -> Result<StepResult, flow_ledger::Error> {
        // Faults name the node (any of its items) or one item (`notify[c3]`).
        let node_id = c.call_id.as_str();
        let (tool, class, destructive): (Box<dyn Tool>, SideEffect, Option<bool>) =
            match self.tool_for(&rendered.target, c.timeout).await {
                Ok(t) => t,
                Err(message) => {
                    return self
                        .fail_without_claim(c, ErrorKind::Permanent, message)
                        .await;
                }
            };

        // 3. The claim (after the pure results this request may have been built from).
        let step = self.new_step(c, StepStatus::Running);
        c.writer.open_step(c.origin, step, self.now()).await?;

        // An approval (the node's, or the installation's policy) is decided, for
        // exactly this request, before anything is claimed.
        if let Some(decl) = self.approval_for(c, &rendered.target, destructive) {
            if let Some(result) = self.approval_gate(c, &decl, &rendered).await? {
                return Ok(result);
            }
            self.inner.faults.hit(Point::AfterApproval, node_id);
        }
        let lease = match self.claim(c, &rendered, class).await? {
            Claimed::Lease(lease) => lease,
            Claimed::Done(result) => {
                trace::replayed(&result);
                return self.then_callback(c, result).await;
            }
        };
        let via = Via {
            tool: tool.as_ref(),
            class,
        };
        self.call_leased(c, &rendered, via, lease).await
    }

    /// A callback node whose call succeeded goes on to its callback; any other result
    /// is the step's.
    async fn then_callback(
        &self,
        c: &StepCall<'_>,
        result: StepResult,
    ) -> Result<StepResult, flow_ledger::Error> {
        match (c.node.callback(), &result) {
            (Some(cb), StepResult::Succeeded { .. }) => self.after_callback_call(c, cb).await,
            _ => Ok(result),
        }
    }

    /// Claims the call, waiting out another worker's lease and resolving a leftover in
    /// doubt once when its class allows: the lease to send under, or the step's result
    /// already (a replay, in doubt, a key conflict).
    async fn claim(
        &self,
        c: &StepCall<'_>,
        r: &Rendered,
        class: SideEffect,
    ) -> Result<Claimed, flow_ledger::Error> {
        let node_id = c.call_id.as_str();
        let mut reclaimed = false;
        loop {
            let claim = self
                .inner
                .ledger
                .claim_call(
                    ClaimCall {
                        run: c.run(),
                        step_id: c.step_id.clone(),
                        tool_call_id: node_id.to_string(),
                        tool: c.tool.name.clone(),
                        idempotency_key: r.base_key.clone(),
                        request: r.request.clone(),
                        request_hash: r.request_hash.clone(),
                        retry_failed: c.retry > 0,
                        lease: crate::lease::length(),
                    },
                    self.now(),
                )
                .await;
            match claim {
                Ok(CallClaim::Claimed(lease)) => return Ok(Claimed::Lease(lease)),
                Ok(CallClaim::Replay(replay)) => {
                    return self.finish_replay(c, replay).await.map(Claimed::Done);
                }
                Ok(CallClaim::InDoubt { .. }) => {
                    if !reclaimed && self.auto_resolve(c, node_id, class).await? {
                        reclaimed = true;
                        continue;
                    }
                    return Ok(Claimed::Done(StepResult::InDoubt));
                }
                Err(flow_ledger::Error::Busy { holder, until }) => {
                    tracing::info!(node = node_id, %holder, until = %until.to_rfc3339(), "call is leased by another worker; waiting");
                    let wait = (until.0 - self.now().0).clamp(100, 5_000);
                    tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(1_000)))
                        .await;
                }
                Err(flow_ledger::Error::Conflict {
                    other_run,
                    other_node,
                    reason,
                }) => {
                    let message = format!(
                        "idempotency key conflict with run {other_run} node {other_node}: {reason}"
                    );
                    return self
                        .fail_claimed_step(c, ErrorKind::Conflict, message)
                        .await
                        .map(Claimed::Done);
                }
                Err(flow_ledger::Error::KeyRetired {
                    run_id,
                    node_id,
                    outcome,
                    deleted_at,
                }) => {
                    // Nothing was claimed or sent: the outcome that key stands for was
                    // deleted by retention, and a send could execute twice downstream.
                    let message = format!(
                        "idempotency key `{}` was used by run {run_id} (node {node_id}, {outcome}), deleted by retention on {deleted_at}; choose a new key or resolve by hand",
                        r.base_key
                    );
                    return self
                        .fail_claimed_step(c, ErrorKind::Conflict, message)
                        .await
                        .map(Claimed::Done);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Builds the adapter and its side-effect class (workflow overrides first).
    async fn tool_for(
        &self,
        target: &Target,
        timeout: Duration,
    ) -> Result<(Box<dyn Tool>, SideEffect, Option<bool>), String> {
        let tools = &self.inner.tools;
        Ok(match target {
            Target::Function { name } => {
                let f = tools
                    .functions
                    .get(name)
                    .ok_or_else(|| format!("unknown function `{name}`"))?;
                let class = f.side_effect();
                (Box::new(f), class, None)
            }
            Target::Command(spec) => {
                let t = flow_adapters::command::CommandTool::new(spec.clone());
                let class = t.side_effect();
                (Box::new(t), class, None)
            }
            Target::Http(spec) => {
                let t = tools.http.tool(spec.clone());
                let class = t.side_effect();
                (Box::new(t), class, None)
            }
            Target::Mcp(spec) => {
                let annotations = if let Some(pinned) = spec.pinned {
                    Some(pinned)
                } else if spec.read_only_override.is_none() {
                    match tools.mcp.annotations(spec, timeout).await {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!(tool = spec.tool, error = %self.inner.secrets.scrub(&e.message), "cannot list MCP tool annotations; treating the tool as side-effecting");
                            None
                        }
                    }
                } else {
                    None
                };
                // MCP's defaults: a tool that says nothing may destroy data.
                let destructive = match spec.read_only_override {
                    Some(read_only) => !read_only,
                    None => annotations.is_none_or(|a| !a.read_only && a.destructive),
                };
                let t = tools.mcp.tool(spec.clone()).with_annotations(annotations);
                let class = t.side_effect();
                (Box::new(t), class, Some(destructive))
            }
        })
    }

    /// A self-resolving tool (read-only or `idempotency: header`) found in doubt after a
    /// crash: re-send with the same key, as declared, while the retry budget lasts.
    async fn auto_resolve(
        &self,
        c: &StepCall<'_>,
        node_id: &str,
        class: SideEffect,
    ) -> Result<bool, flow_ledger::Error> {
        let call = self.inner.ledger.get_call(&c.run().run_id, node_id).await?;
        let history = History {
            unknown_before: true,
            // A crash after the outbound mark counts as a send too (its requests are
            // uncounted): a process killed at that point again and again must not
            // re-send without end.
            resends_left: (1 + c.resend_budget)
                .saturating_sub(call.outbound_requests.saturating_add(call.uncounted_sends)),
        };
        if disposition(Observed::FoundInDoubt, class, history) != Disposition::ResendSameKey {
            return Ok(false);
        }
        let resolve = Resolve {
            run_id: c.run().run_id.clone(),
            tool_call_id: node_id.to_string(),
            resolution: Resolution::Retry,
            by: format!("flow ({})", c.run().worker),
            note: Some("declared safe to re-send (read-only or idempotency: header)".into()),
        };
        let call = self.inner.ledger.resolve_call(resolve, self.now()).await?;
        crate::telemetry::spans::resolved(&call, crate::telemetry::spans::Resolver::Flow);
        Ok(true)
    }

    /// `Some(when)` if the tool's rate limit or daily quota has no room now, or its
    /// downstream asked every sender to hold off.
    ///
    /// Every request to the tool's downstream takes a slot here: the tool's own calls
    /// and its reconciliation probes (`reconcile::probe`).
    pub async fn rate_limited(
        &self,
        workflow: &Workflow,
        tool: &ToolDecl,
    ) -> Result<Option<Timestamp>, flow_ledger::Error> {
        Ok(self.limited(workflow, tool).await?.map(|(until, _)| until))
    }

    /// [`Gateway::rate_limited`], saying which limit: a downstream's hold-off (checked
    /// first, taking nothing), then the day quota, the minute and the second windows.
    pub(super) async fn limited(
        &self,
        workflow: &Workflow,
        tool: &ToolDecl,
    ) -> Result<Option<(Timestamp, Deferral)>, flow_ledger::Error> {
        if !tool.flow_controlled() {
            return Ok(None);
        }
        let key = limit_key(workflow, tool);
        if let Some(until) = self.inner.ledger.held_off(&key, self.now()).await? {
            return Ok(Some((until, Deferral::HeldOff)));
        }
        // The day quota is checked first: when it is exhausted the minute window is not
        // touched. (When the minute window then refuses, the day slot taken stays used:
        // a known over-count of one per refusal, on the safe side of the quota.)
        for (limit, window) in rate_windows(tool) {
            if let RateDecision::Limited { retry_at } = self
                .inner
                .ledger
                .rate_acquire(
                    RateAcquire {
                        key: key.clone(),
                        window,
                        limit,
                    },
                    self.now(),
                )
                .await?
            {
                return Ok(Some((retry_at, Deferral::RateLimited)));
            }
        }
        Ok(None)
    }

    /// Requests beyond the first (MCP re-auth, same-key re-sends) count against limits too.
    async fn count_extra_requests(
        &self,
        c: &StepCall<'_>,
        extra: u32,
    ) -> Result<(), flow_ledger::Error> {
        let key = limit_key(c.workflow, c.tool);
        for (_, window) in rate_windows(c.tool) {
            self.inner
                .ledger
                .rate_add(&key, window, extra, self.now())
                .await?;
        }
        Ok(())
    }
}

/// What a tool's limits are counted under in the ledger — its rate windows, quota,
/// hold-off and concurrency slots: `<workflow>/<tool>`, the same for a resume and for
/// every daemon.
pub(super) fn limit_key(workflow: &Workflow, tool: &ToolDecl) -> String {
    format!("{}/{}", workflow.name, tool.name)
}

/// The tool's counted windows that have a limit, the day quota first, then the minute
/// and the second.
fn rate_windows(tool: &ToolDecl) -> impl Iterator<Item = (u32, Window)> {
    [
        (tool.quota_per_day, Window::Day),
        (tool.rate_limit_per_minute, Window::Minute),
        (tool.rate_limit_per_second, Window::Second),
    ]
    .into_iter()
    .filter_map(|(limit, window)| Some((limit?, window)))
}

/// A node's call rendered and checked, before anything is claimed.
struct Rendered {
    /// The node's rendered `with`, as the adapter receives it.
    args: Json,
    /// The idempotency key before the attempt suffix.
    base_key: String,
    target: Target,
    /// The stored request (secrets scrubbed) and its canonical hash.
    request: Json,
    request_hash: String,
    /// The secrets the request itself reads (`with` and the tool's request templates,
    /// not its credentials), sorted: what an approval's digest binds by value.
    bound_secrets: Vec<String>,
}

/// How a claim ended: a lease to send under, or the step's result without a send.
enum Claimed {
    Lease(CallLease),
    Done(StepResult),
}
