//! Lazy pure results: a run's consecutive pure-function results kept in memory and
//! recorded together (see ARCHITECTURE.md, "Lazy pure results").
//!
//! A pure function sends nothing out of the process, so recording its result is only
//! bookkeeping: losing it in a crash means computing it again on resume, never a
//! duplicated side effect. The executor therefore records a node's successful first
//! attempt here and goes on at once; [`PureLog::flush`] writes everything pending in
//! one transaction (`Ledger::record_pure_calls`). The log is flushed before anything
//! else is written for the run — a side-effecting claim, a skipped or failed step, a
//! pause; at the run's end, in the finish's own transaction ([`PureLog::finish`]) — so
//! the ledger never holds a step without the steps whose outputs it used, and a request
//! is only ever sent after the pure outputs it was built from are durable (a
//! non-deterministic "pure" function cannot feed one value into a sent request and
//! another into the ledger). It is also flushed when it holds
//! [`MAX_PENDING`] results or its oldest is [`MAX_AGE`] old, which bounds how far
//! `flow show` can lag behind a running run.
//!
//! A flush writes on a task of its own, which holds the log until the write is done.
//! The run loop polls its steps' futures only between its own awaits, so a flush the
//! loop starts (a result came due, a node is skipped) while a step's flush holds the log
//! would otherwise wait for a future nobody polls: the run hung after its first pure
//! node whenever a step's write took longer than [`MAX_AGE`]. A spawned write also
//! cannot be dropped halfway when the step that started it is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flow_ledger::{
    CallOutcome, FinishedRun, Ledger, NewStep, PureBatchRecorded, PureCall, PureRecorded,
    PureResult, RunFinish, RunLease, StepStatus, Timestamp,
};
use tokio::sync::Mutex;
use tracing::Instrument as _;

/// Most results kept before a flush.
pub const MAX_PENDING: usize = 256;
/// Longest a result waits for its flush.
pub const MAX_AGE: Duration = Duration::from_millis(100);

/// The pure results of one run execution not yet in the ledger.
#[derive(Debug, Default)]
pub struct PureLog {
    /// Shared with the task writing a flush, which holds it until its write is done.
    pending: Arc<Mutex<Pending>>,
    /// When the oldest pending result was kept (read without the lock by the executor).
    oldest: std::sync::Mutex<Option<Instant>>,
}

#[derive(Debug, Default)]
struct Pending {
    results: Vec<PureResult>,
}

impl PureLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps a result; flushes at once when the log is full.
    pub async fn push(
        &self,
        ledger: &Ledger,
        run: &RunLease,
        result: PureResult,
        now: Timestamp,
    ) -> Result<(), flow_ledger::Error> {
        let full = {
            let mut p = self.pending.lock().await;
            p.results.push(result);
            let mut oldest = self.oldest.lock().unwrap_or_else(|e| e.into_inner());
            oldest.get_or_insert_with(Instant::now);
            p.results.len() >= MAX_PENDING
        };
        if full {
            self.flush(ledger, run, now).await?;
        }
        Ok(())
    }

    /// When the pending results must be flushed at the latest (`None`: nothing pending).
    pub fn due(&self) -> Option<Instant> {
        let oldest = self.oldest.lock().unwrap_or_else(|e| e.into_inner());
        oldest.map(|t| t + MAX_AGE)
    }

    /// Writes every pending result in one transaction. Flushes are serialized (the lock
    /// is held while writing), so results reach the ledger in the order they were kept.
    /// The write runs on its own task (see the module docs): waiting for the log never
    /// depends on the caller's other futures being polled.
    ///
    /// A node the ledger already knows (which the executor's eligibility rules make
    /// practically impossible: a first attempt with the run's own default key) is then
    /// recorded one at a time the general way; if the ledger holds another output for
    /// it than the one the run went on with, the run stops with a conflict and a resume
    /// continues from the ledger's values.
    pub async fn flush(
        &self,
        ledger: &Ledger,
        run: &RunLease,
        now: Timestamp,
    ) -> Result<(), flow_ledger::Error> {
        let mut held = self.pending.clone().lock_owned().await;
        if held.results.is_empty() {
            return Ok(());
        }
        let results = std::mem::take(&mut held.results);
        *self.oldest.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let (ledger, run) = (ledger.clone(), run.clone());
        // The caller's span goes along: the write's log lines keep their run and step ids.
        let write = tokio::spawn(
            async move {
                let written = write_batch(&ledger, &run, &results, now).await;
                if written.is_err() {
                    // Back in front, before the log is let go: a step waiting to flush
                    // must not find it empty and write (or send) without these.
                    held.results.splice(0..0, results);
                }
                drop(held);
                written
            }
            .instrument(tracing::Span::current()),
        );
        let written = match write.await {
            Ok(written) => written,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(flow_ledger::Error::Backend {
                message: "the write of kept pure results was stopped: the runtime is shutting down"
                    .into(),
                retryable: true,
            }),
        };
        if written.is_err() {
            let mut oldest = self.oldest.lock().unwrap_or_else(|e| e.into_inner());
            oldest.get_or_insert_with(Instant::now);
        }
        written
    }

    /// How many results are kept, not yet in the ledger.
    #[cfg(test)]
    async fn kept(&self) -> usize {
        self.pending.lock().await.results.len()
    }
}

/// Records a batch of kept results: in one transaction, or one at a time when the
/// ledger already knows one of them.
async fn write_batch(
    ledger: &Ledger,
    run: &RunLease,
    results: &[PureResult],
    now: Timestamp,
) -> Result<(), flow_ledger::Error> {
    match ledger.record_pure_calls(run, results, now).await? {
        PureBatchRecorded::All => Ok(()),
        PureBatchRecorded::NotNew { node_id } => {
            tracing::warn!(
                node = node_id,
                "a kept pure result is already in the ledger; recording one at a time"
            );
            one_by_one(ledger, run, results, now).await
        }
    }
}

impl PureLog {
    /// Writes the pending results and finishes the run in one transaction
    /// (`Ledger::finish_run_with`); the run's last write, so nothing is kept after it.
    pub async fn finish(
        &self,
        ledger: &Ledger,
        run: &RunLease,
        finish: RunFinish,
        now: Timestamp,
    ) -> Result<FinishedRun, flow_ledger::Error> {
        let results = {
            let mut p = self.pending.lock().await;
            *self.oldest.lock().unwrap_or_else(|e| e.into_inner()) = None;
            std::mem::take(&mut p.results)
        };
        if let Some(done) = ledger
            .finish_run_with(run, &results, finish.clone(), now)
            .await?
        {
            return Ok(done);
        }
        tracing::warn!("a kept pure result is already in the ledger; recording one at a time");
        one_by_one(ledger, run, &results, now).await?;
        ledger.finish_run(run, finish, now).await
    }
}

/// Records kept results one at a time, the general way (the fallback when a batch finds
/// a node the ledger already knows).
async fn one_by_one(
    ledger: &Ledger,
    run: &RunLease,
    results: &[PureResult],
    now: Timestamp,
) -> Result<(), flow_ledger::Error> {
    for r in results {
        one_at_a_time(ledger, run, r.clone(), now).await?;
    }
    Ok(())
}

async fn one_at_a_time(
    ledger: &Ledger,
    run: &RunLease,
    r: PureResult,
    now: Timestamp,
) -> Result<(), flow_ledger::Error> {
    let call = PureCall {
        run,
        step: NewStep {
            step_id: r.step_id.clone(),
            node_id: r.node_id.clone(),
            retry: 0,
            not_before: None,
            status: StepStatus::Running,
        },
        tool_call_id: r.tool_call_id,
        tool: r.tool,
        idempotency_key: r.idempotency_key,
        request: r.request,
        request_hash: r.request_hash,
        outcome: CallOutcome::Succeeded(r.output.clone()),
        retry_failed: false,
        next_step: None,
    };
    match ledger.record_pure_call(call, now).await? {
        PureRecorded::Recorded => Ok(()),
        PureRecorded::Replayed(stored) if stored.output.as_ref() == Some(&r.output) => Ok(()),
        PureRecorded::Replayed(_) => Err(flow_ledger::Error::Conflict {
            other_run: run.run_id.clone(),
            other_node: r.node_id,
            reason: "the ledger holds another output for this pure node than the one this \
                     execution used; resume the run to continue from the ledger"
                .into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    //! On a real SQLite ledger in a temp dir.
    use std::time::Duration;

    use flow_ledger::{Error, Ledger, NewRun, OpenOptions, PureResult, Timestamp, WorkerId};
    use serde_json::json;

    use super::PureLog;

    fn result(node: &str, run_id: &str, at: Timestamp) -> PureResult {
        PureResult {
            step_id: node.into(),
            node_id: node.into(),
            tool_call_id: node.into(),
            tool: "echo".into(),
            idempotency_key: format!("{run_id}:{node}"),
            request: json!({ "v": 1 }),
            request_hash: flow_ledger::canonical_hash(&json!({ "v": 1 })),
            output: json!({ "v": 1 }),
            started_at: at,
            finished_at: at,
        }
    }

    /// A flush that fails leaves the log as it was: the next flush writes the same
    /// results, in the same order, before anything kept after them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_flush_keeps_its_results_for_the_next() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}/flow.db", dir.path().display());
        let ledger = Ledger::open(&url, OpenOptions::default())
            .await
            .expect("open");
        let now = Timestamp(1_700_000_000_000);
        let run = NewRun {
            id: "run_a".into(),
            workflow_name: "w".into(),
            workflow_text: "name: w".into(),
            inputs: json!({}),
            priority: 0,
            not_before: None,
            trace_parent: None,
        };
        ledger.enqueue(run, now).await.expect("enqueue");
        let worker = WorkerId::new("test-host", 1, "1");
        let lease = ledger
            .claim_run("run_a", &worker, Duration::from_secs(60), now)
            .await
            .expect("claim");
        let stale = flow_ledger::RunLease {
            token: lease.token + 1,
            ..lease.clone()
        };

        let log = PureLog::new();
        for node in ["a", "b"] {
            log.push(&ledger, &lease, result(node, "run_a", now), now)
                .await
                .expect("keep");
        }
        let failed = log.flush(&ledger, &stale, now).await;
        assert!(matches!(failed, Err(Error::LeaseLost)), "{failed:?}");
        assert_eq!(log.kept().await, 2, "the failed flush's results are kept");
        assert!(log.due().is_some(), "and they still come due");
        log.push(&ledger, &lease, result("c", "run_a", now), now)
            .await
            .expect("keep");

        log.flush(&ledger, &lease, now).await.expect("flush");
        assert_eq!(log.kept().await, 0);
        let steps: Vec<String> = ledger
            .list_steps("run_a")
            .await
            .expect("steps")
            .into_iter()
            .map(|s| s.node_id)
            .collect();
        assert_eq!(steps, ["a", "b", "c"]);
        ledger.close().await;
    }
}
