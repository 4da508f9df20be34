//! One claimed run, executed in its own task: parse its workflow snapshot
//! (cached: a queue usually holds many runs of few workflows), execute it with the shared
//! [`Executor`], and give the run back to the queue when this process cannot go on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use flow_ledger::{Claimed, Ledger, Run, RunFinish, RunLease, RunStatus};
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;
use super::outage::Outage;
use crate::executor::Executor;
use crate::gateway;
use crate::workflow::ValidWorkflow;

/// Most workflow snapshots kept parsed; the cache is emptied when it fills up.
const CACHE_LIMIT: usize = 256;

/// What every run task shares.
pub(crate) struct Shared {
    pub executor: Executor,
    pub ledger: Ledger,
    pub metrics: Arc<Metrics>,
    /// Fires on a graceful stop: executions start nothing new and release their runs.
    pub stop: CancellationToken,
    /// Whether the database answers, reported by the claim loop and every run task.
    pub outage: Outage,
    workflows: Mutex<HashMap<String, Arc<ValidWorkflow>>>,
    /// `flow` and the non-default global options, for the commands log lines suggest.
    pub flow: String,
}

impl Shared {
    pub fn new(
        executor: Executor,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
        flow: String,
    ) -> Arc<Self> {
        let ledger = executor.gateway().ledger().clone();
        Arc::new(Self {
            flow,
            outage: Outage::new(ledger.url_redacted()),
            ledger,
            executor,
            metrics,
            stop,
            workflows: Mutex::new(HashMap::new()),
        })
    }

    /// The run's workflow, parsed and validated once per distinct snapshot text.
    fn workflow(&self, run: &Run) -> Result<Arc<ValidWorkflow>, String> {
        let cached = self
            .workflows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&run.workflow_text)
            .cloned();
        if let Some(wf) = cached {
            return Ok(wf);
        }
        let wf = Arc::new(crate::snapshot::snapshot(run)?);
        let mut cache = self.workflows.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(run.workflow_text.clone(), wf.clone());
        Ok(wf)
    }

    fn now(&self) -> flow_ledger::Timestamp {
        self.executor.gateway().now()
    }
}

/// A run whose execution ended here (its lease is no longer this process's concern).
pub(crate) struct Ended {
    pub run_id: String,
    /// How: the run's status, `queued` (released) or `lost` (not released: another
    /// worker holds it, or the database did not answer before the lease ran out).
    pub status: &'static str,
}

/// Executes the run held by `lease` until it ends here. The metrics record how: the
/// run's status, `queued` (released), or `lost` (another worker holds it now, or the
/// database did not come back before the lease ran out).
pub(crate) async fn execute(shared: Arc<Shared>, claimed: Claimed) -> Ended {
    let run_id = claimed.lease.run_id.clone();
    let status = execute_inner(&shared, claimed).await;
    shared.metrics.finished(status);
    Ended { run_id, status }
}

async fn execute_inner(shared: &Shared, claimed: Claimed) -> &'static str {
    let Claimed { lease, run } = claimed;
    let wf = match shared.workflow(&run) {
        Ok(wf) => wf,
        Err(message) => return fail_unrunnable(shared, &lease, message).await,
    };
    // Every secret the workflow reads must be set in this daemon's environment before
    // any node runs: found only at its node, a missing one would fail the run after
    // earlier nodes had sent their requests. (Other daemons would lack it as well: they
    // share the configuration, so the run fails rather than bouncing between them.)
    let names = wf.secret_names();
    let missing = shared
        .executor
        .gateway()
        .secrets()
        .missing_all(names.iter().map(String::as_str));
    if !missing.is_empty() {
        let message = format!(
            "secret{} {} not set in the daemon's environment: provide {} or a --secrets-file line for each; nothing was sent",
            if missing.len() == 1 { "" } else { "s" },
            missing
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", "),
            missing
                .iter()
                .map(|n| format!("FLOW_SECRET_{n}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
        return fail_unrunnable(shared, &lease, message).await;
    }
    tracing::debug!(run = %run.id, workflow = %run.workflow_name, token = lease.token, "run claimed");
    match shared
        .executor
        .execute_claimed(lease.clone(), &wf, &run, &shared.stop)
        .await
    {
        Ok(outcome) => {
            let status = outcome.status.as_str();
            match outcome.status {
                RunStatus::Paused => tracing::warn!(
                    run = %run.id,
                    workflow = %run.workflow_name,
                    reason = outcome.error.as_deref().unwrap_or("in doubt"),
                    "run paused: see `{} show {}`", shared.flow, run.id
                ),
                RunStatus::Queued => tracing::info!(
                    run = %run.id,
                    workflow = %run.workflow_name,
                    why = outcome.error.as_deref().unwrap_or("stopping"),
                    "run back on the queue"
                ),
                _ => tracing::info!(
                    run = %run.id,
                    workflow = %run.workflow_name,
                    status,
                    error = outcome.error.as_deref(),
                    "run finished"
                ),
            }
            status
        }
        Err(gateway::Error::LeaseLost { .. }) => {
            tracing::warn!(run = %run.id, "lost the run's lease: another worker has it now");
            "lost"
        }
        Err(gateway::Error::Ledger(e @ flow_ledger::Error::Unusable { .. })) => {
            // Nothing more is written from here: the run is left to its lease.
            shared.outage.failed(Instant::now(), "run", &e);
            "lost"
        }
        Err(gateway::Error::Ledger(e)) => {
            tracing::warn!(run = %run.id, error = %e, "the ledger failed during the run; giving it back to the queue");
            give_back(shared, &lease).await
        }
    }
}

/// A run whose stored workflow this binary cannot run (it no longer validates) fails
/// with the reason: releasing it would only hand it to the next worker, forever.
async fn fail_unrunnable(shared: &Shared, lease: &RunLease, message: String) -> &'static str {
    tracing::error!(run = %lease.run_id, error = %message, "cannot run this run's workflow");
    let finish = RunFinish {
        status: RunStatus::Failed,
        output: None,
        error: Some(message),
    };
    match shared.ledger.finish_run(lease, finish, shared.now()).await {
        Ok(_) => "failed",
        Err(flow_ledger::Error::LeaseLost) => "lost",
        Err(_) => give_back(shared, lease).await,
    }
}

/// Puts a run this process cannot go on with back on the queue, retrying with backoff
/// while the database is unreachable. Gives up after two lease lengths: by then the
/// lease has expired and any worker may reclaim the run (its calls' fate is then decided
/// by the ledger: `claimed` ones are taken over, `outbound` ones go in doubt).
async fn give_back(shared: &Shared, lease: &RunLease) -> &'static str {
    let started = Instant::now();
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
        .build();
    loop {
        let attempt = Instant::now();
        let released = shared.ledger.release_run(lease, shared.now()).await;
        match &released {
            Ok(()) => {
                shared.outage.ok(attempt);
            }
            Err(e) => {
                // A busy daemon claims nothing, so its runs may be the only ones to see
                // the database go; they say so once, like the claim loop.
                shared.outage.failed(attempt, "run", e);
            }
        }
        match released {
            Ok(()) => return "queued",
            Err(flow_ledger::Error::LeaseLost | flow_ledger::Error::Unusable { .. }) => {
                return "lost";
            }
            Err(e) if started.elapsed() >= crate::lease::length() * 2 => {
                tracing::warn!(run = %lease.run_id, error = %e, "could not release the run; its lease will expire");
                return "lost";
            }
            Err(_) => {
                let delay = delays.next().unwrap_or(Duration::from_secs(5));
                tokio::time::sleep(delay).await;
            }
        }
    }
}
