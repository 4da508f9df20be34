//! Reads: one run, steps, calls, attempts, usage, events (listing and counting runs under
//! a filter is `search.rs`). Each is one statement on a pooled connection (no write lock
//! taken).

use crate::conn::args;
use crate::error::Error;
use crate::events::{Event, EventFilter};
use crate::ledger::Ledger;
#[cfg(any(test, feature = "testkit"))]
use crate::model::{Attempt, Usage};
use crate::model::{Run, Step, ToolCall};
#[cfg(any(test, feature = "testkit"))]
use crate::rows::{AttemptRow, UsageRow};
use crate::rows::{CallRow, EventRow, RunRow, StepRow, call_cols, run_cols, step_cols};

/// The `LIMIT` a listing binds: what the filter asks for, or the listing's default when it
/// asks for none (`0`, a filter's default).
pub(crate) fn page_limit(asked: u32, default: u32) -> i64 {
    i64::from(if asked == 0 { default } else { asked })
}

impl Ledger {
    /// One run.
    pub async fn get_run(&self, run_id: &str) -> Result<Run, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        pc.conn()
            .optional::<RunRow>(
                concat!(
                    "SELECT ",
                    run_cols!(),
                    " FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3"
                ),
                args![&s.tenant, &s.workspace, run_id],
            )
            .await?
            .ok_or_else(|| Error::NotFound {
                what: format!("run {run_id}"),
            })?
            .into_run()
    }

    /// Whether an operator asked to cancel the run: one indexed read, cheap enough for
    /// an executor to poll every second (a heartbeat writes, so it runs less often).
    pub async fn cancel_requested(&self, run_id: &str) -> Result<bool, Error> {
        #[derive(sqlx::FromRow)]
        struct Flag {
            cancel_requested: bool,
        }
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let flag = pc
            .conn()
            .optional::<Flag>(
                "SELECT cancel_requested FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3",
                args![&s.tenant, &s.workspace, run_id],
            )
            .await?
            .ok_or_else(|| Error::NotFound {
                what: format!("run {run_id}"),
            })?;
        Ok(flag.cancel_requested)
    }

    /// The steps of a run, in creation order.
    pub async fn list_steps(&self, run_id: &str) -> Result<Vec<Step>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<StepRow>(
                concat!(
                    "SELECT ",
                    step_cols!(),
                    " FROM steps WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                     ORDER BY created_at, step_id"
                ),
                args![&s.tenant, &s.workspace, run_id],
            )
            .await?;
        rows.into_iter().map(StepRow::into_step).collect()
    }

    /// The tool calls of a run, in creation order.
    pub async fn list_calls(&self, run_id: &str) -> Result<Vec<ToolCall>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<CallRow>(
                concat!(
                    "SELECT ",
                    call_cols!(),
                    " FROM tool_calls WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                     ORDER BY created_at, tool_call_id"
                ),
                args![&s.tenant, &s.workspace, run_id],
            )
            .await?;
        rows.into_iter().map(CallRow::into_call).collect()
    }

    /// One tool call.
    pub async fn get_call(&self, run_id: &str, tool_call_id: &str) -> Result<ToolCall, Error> {
        let mut pc = self.pool().acquire().await?;
        crate::calls::read_call(&mut pc.conn(), self, run_id, tool_call_id)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: format!("tool call {run_id}/{tool_call_id}"),
            })?
            .into_call()
    }

    /// The effect attempts of a run's calls, by call and attempt.
    #[cfg(any(test, feature = "testkit"))]
    pub async fn list_attempts(&self, run_id: &str) -> Result<Vec<Attempt>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<AttemptRow>(
                "SELECT tool_call_id, step_id, attempt, sent_key, outbound_started_at,
                    finished_at, outcome, error_kind, error_message, requests_sent
                 FROM tool_call_attempts WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                 ORDER BY tool_call_id, attempt, finished_at, id",
                args![&s.tenant, &s.workspace, run_id],
            )
            .await?;
        rows.into_iter().map(AttemptRow::into_attempt).collect()
    }

    /// The usage rows (one per request sent) of a run.
    #[cfg(any(test, feature = "testkit"))]
    pub async fn list_usage(&self, run_id: &str) -> Result<Vec<Usage>, Error> {
        let s = self.scope();
        let mut pc = self.pool().acquire().await?;
        let rows = pc
            .conn()
            .all::<UsageRow>(
                "SELECT tool_call_id, tool, attempt, sent_key, kind, quantity, created_at
                 FROM usage WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                 ORDER BY tool_call_id, attempt, created_at, id",
                args![&s.tenant, &s.workspace, run_id],
            )
            .await?;
        rows.into_iter().map(UsageRow::into_usage).collect()
    }

    /// Outbox events, oldest first.
    ///
    /// One run's events and the whole feed are two statements: under one
    /// `($3 IS NULL OR run_id = $3)` SQLite walked the outbox by `seq` testing every
    /// event for the run (a run page read all 100,000 runs' events: 28 ms p50,
    /// benches/at_scale.rs); with the run named, `outbox_by_run` gives its events in
    /// `seq` order.
    pub async fn list_events(&self, filter: EventFilter) -> Result<Vec<Event>, Error> {
        let s = self.scope();
        let limit = page_limit(filter.limit, 1000);
        let after = filter.after_seq.unwrap_or(-1);
        let mut pc = self.pool().acquire().await?;
        let mut c = pc.conn();
        let rows = match &filter.run_id {
            Some(run) => {
                c.all::<EventRow>(
                    "SELECT seq, id, type, time, run_id, step_id, tool_call_id, payload
                     FROM outbox WHERE tenant = $1 AND workspace = $2 AND run_id = $3
                       AND seq > $4
                     ORDER BY seq LIMIT $5",
                    args![&s.tenant, &s.workspace, run, after, limit],
                )
                .await?
            }
            None => {
                c.all::<EventRow>(
                    "SELECT seq, id, type, time, run_id, step_id, tool_call_id, payload
                     FROM outbox WHERE tenant = $1 AND workspace = $2 AND seq > $3
                     ORDER BY seq LIMIT $4",
                    args![&s.tenant, &s.workspace, after, limit],
                )
                .await?
            }
        };
        rows.into_iter().map(EventRow::into_event).collect()
    }
}
