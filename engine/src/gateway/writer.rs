//! The run's own writes: one value that holds the run lease and the run's kept pure
//! results, and writes those results before every other write of the run.
//!
//! "Kept pure results first" (see `lazy.rs`) used to be a call to flush written by hand
//! before each write, at seven places in the executor and the gateway; one missing call
//! would let the ledger hold a step without the pure outputs it was built from. Here the
//! flush is inside every write, so a new write cannot forget it.
//!
//! Writes fenced by a *call* lease (`mark_outbound`, renewals, `complete_call`,
//! `mark_in_doubt`, `release_call`) go to the ledger directly: they all follow that
//! call's claim, and a claim always follows [`RunWriter::open_step`], which flushed.

use std::time::Instant;

use flow_ledger::{
    Error, ErrorKind, FinishedRun, Ledger, NewStep, PureCall, PureRecorded, PureResult, RunFinish,
    RunLease, StepError, StepFinish, StepStatus, Timestamp,
};

use flow_adapters::Window;

use super::StepOrigin;
use super::lazy::PureLog;

/// A run's writes under its lease (see the module docs).
#[derive(Debug)]
pub struct RunWriter {
    ledger: Ledger,
    lease: RunLease,
    window: Window,
    pure: PureLog,
}

impl RunWriter {
    /// The writer of the run `lease` holds, with nothing kept yet; `window` is the run
    /// lease by this process's clock, which the heartbeat confirms.
    pub fn new(ledger: Ledger, lease: RunLease, window: Window) -> Self {
        Self {
            ledger,
            lease,
            window,
            pure: PureLog::new(),
        }
    }

    /// The run lease every write is fenced by.
    pub fn lease(&self) -> &RunLease {
        &self.lease
    }

    /// The run lease by this process's monotonic clock: part of every call's fence, so
    /// no request leaves once the heartbeat could not confirm the run in time.
    pub fn window(&self) -> &Window {
        &self.window
    }

    /// Writes the kept pure results now (they came due).
    pub async fn flush(&self, now: Timestamp) -> Result<(), Error> {
        self.pure.flush(&self.ledger, &self.lease, now).await
    }

    /// When the kept results must be written at the latest (`None`: nothing kept).
    pub fn due(&self) -> Option<Instant> {
        self.pure.due()
    }

    /// Keeps a pure result for the next flush instead of writing it now.
    pub async fn keep(&self, result: PureResult, now: Timestamp) -> Result<(), Error> {
        self.pure.push(&self.ledger, &self.lease, result, now).await
    }

    /// Creates `step` (a node skipped or started for the first time).
    pub async fn create_step(&self, step: NewStep, now: Timestamp) -> Result<(), Error> {
        self.flush(now).await?;
        self.ledger.create_step(&self.lease, step, now).await?;
        Ok(())
    }

    /// Makes the step about to run `running`, as its `origin` requires: creates it, starts
    /// a pending retry, or keeps a row already running. Flushes in every case, so the
    /// claim that follows is written after the pure outputs its request was built from.
    pub async fn open_step(
        &self,
        origin: StepOrigin,
        step: NewStep,
        now: Timestamp,
    ) -> Result<(), Error> {
        self.flush(now).await?;
        match origin {
            StepOrigin::New => {
                let step = NewStep {
                    status: StepStatus::Running,
                    ..step
                };
                self.ledger.create_step(&self.lease, step, now).await?;
                Ok(())
            }
            StepOrigin::Pending => {
                self.ledger
                    .start_step(&self.lease, &step.step_id, now)
                    .await?;
                Ok(())
            }
            StepOrigin::Running => Ok(()),
        }
    }

    /// Finishes a step.
    pub async fn finish_step(&self, finish: StepFinish, now: Timestamp) -> Result<(), Error> {
        self.flush(now).await?;
        self.ledger.finish_step(&self.lease, finish, now).await?;
        Ok(())
    }

    /// Fails a step that never reached a call (or whose claim refused it).
    pub async fn fail_step(
        &self,
        step_id: &str,
        kind: ErrorKind,
        message: String,
        now: Timestamp,
    ) -> Result<(), Error> {
        let finish = StepFinish {
            step_id: step_id.to_string(),
            status: StepStatus::Failed,
            output: None,
            error: Some(StepError { kind, message }),
        };
        self.finish_step(finish, now).await
    }

    /// Records a pure call at once, with its step (and retry step), in one commit.
    pub async fn record_pure_call(
        &self,
        call: PureCall<'_>,
        now: Timestamp,
    ) -> Result<PureRecorded, Error> {
        self.flush(now).await?;
        self.ledger.record_pure_call(call, now).await
    }

    /// Pauses the run (its calls in doubt), saying why.
    pub async fn pause(&self, reason: &str, now: Timestamp) -> Result<(), Error> {
        self.flush(now).await?;
        self.ledger.pause_run(&self.lease, reason, now).await
    }

    /// Pauses the run for nodes awaiting approval, unless a decision came in while this
    /// worker held the run (`false`: start those nodes again instead).
    pub async fn pause_awaiting(&self, reason: &str, now: Timestamp) -> Result<bool, Error> {
        self.flush(now).await?;
        self.ledger
            .pause_run_awaiting(&self.lease, reason, now)
            .await
    }

    /// Gives the run back to the queue (this worker is stopping).
    pub async fn release(&self, now: Timestamp) -> Result<(), Error> {
        self.flush(now).await?;
        self.ledger.release_run(&self.lease, now).await
    }

    /// Puts the run back on the queue until `until` (its kept results written first).
    pub async fn park(&self, until: Timestamp, now: Timestamp) -> Result<(), Error> {
        self.flush(now).await?;
        self.ledger.park_run(&self.lease, until, now).await
    }

    /// Ends the run, writing the kept results in the finish's own commit.
    pub async fn finish(&self, finish: RunFinish, now: Timestamp) -> Result<FinishedRun, Error> {
        self.pure
            .finish(&self.ledger, &self.lease, finish, now)
            .await
    }
}
