//! Database rows and their conversion to the public types.
//!
//! Rows hold only `String`, `i64` and `bool` so that one `FromRow` derive decodes both a
//! SQLite and a PostgreSQL row; states and JSON are parsed here, in one place.

use serde_json::Value;

use crate::clock::Timestamp;
use crate::error::Error;
use crate::events::{Event, EventType};
#[cfg(any(test, feature = "testkit"))]
use crate::model::{Attempt, Usage};
use crate::model::{Replayed, Run, Step, StepError, ToolCall};
use crate::state::{
    CallFacts, CallStatus, ErrorKind, LeaseView, RunStatus, StepStatus, attempt_key,
};
use crate::worker::WorkerId;

pub(crate) fn json(what: &str, s: Option<String>) -> Result<Option<Value>, Error> {
    s.map(|s| {
        serde_json::from_str(&s).map_err(|e| Error::Corrupt {
            what: format!("{what} is not JSON: {e}"),
        })
    })
    .transpose()
}

pub(crate) fn ts(v: Option<i64>) -> Option<Timestamp> {
    v.map(Timestamp)
}

fn kind(v: Option<String>) -> Result<Option<ErrorKind>, Error> {
    v.map(|k| k.parse()).transpose()
}

pub(crate) fn count(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct RunRow {
    pub id: String,
    pub workflow_name: String,
    /// `None` only when a run's shared text is missing (see [`run_cols`]).
    pub workflow_text: Option<String>,
    pub workflow_hash: String,
    pub inputs: String,
    pub inputs_hash: String,
    pub status: String,
    pub priority: i64,
    pub not_before: i64,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub worker: Option<String>,
    pub lease_token: i64,
    pub lease_expires_at: Option<i64>,
    pub cancel_requested: bool,
    pub pause_reason: Option<String>,
    pub output: Option<String>,
    pub error: Option<String>,
    pub parent_run_id: Option<String>,
    pub parent_step_id: Option<String>,
    pub on_parent_cancel: Option<String>,
    /// The latest execution segment's span context (migration 0019).
    #[sqlx(default)]
    pub trace_segment: Option<String>,
}

/// The columns a [`RunRow`] reads, for a statement whose rows come from the `runs` table
/// itself (`SELECT … FROM runs`, `UPDATE runs … RETURNING`). The workflow text is
/// resolved here, in the same statement: a run's own inline text when it has one (runs
/// enqueued before migration 0007), else the one shared copy in `workflow_texts` by the
/// run's hash, which the enqueue wrote in the run's transaction. A correlated subquery
/// rather than a join so that `FOR UPDATE`/`FOR SHARE` lock only the run row and the
/// same text serves `RETURNING` on both backends (SQLite evaluates subqueries on other
/// tables in `RETURNING`; the conformance suite's claims and finishes read it back).
macro_rules! run_cols {
    () => {
        "id, workflow_name, CASE WHEN runs.workflow_text <> '' THEN runs.workflow_text ELSE (SELECT wt.text FROM workflow_texts wt WHERE wt.tenant = runs.tenant AND wt.workspace = runs.workspace AND wt.hash = runs.workflow_hash) END AS workflow_text, workflow_hash, inputs, inputs_hash, status, priority, not_before, created_at, started_at, finished_at, worker, lease_token, lease_expires_at, cancel_requested, pause_reason, output, error, parent_run_id, parent_step_id, on_parent_cancel, trace_segment"
    };
}
pub(crate) use run_cols;

/// The same columns by name, for selecting from a CTE whose `RETURNING` listed
/// [`run_cols`] (its text is already resolved).
macro_rules! run_fields {
    () => {
        "id, workflow_name, workflow_text, workflow_hash, inputs, inputs_hash, status, priority, not_before, created_at, started_at, finished_at, worker, lease_token, lease_expires_at, cancel_requested, pause_reason, output, error, parent_run_id, parent_step_id, on_parent_cancel, trace_segment"
    };
}
pub(crate) use run_fields;

impl RunRow {
    pub(crate) fn status(&self) -> Result<RunStatus, Error> {
        self.status.parse()
    }

    /// The parent of a child run (a sub-workflow's run), from its three columns.
    pub(crate) fn parent(&self) -> Result<Option<crate::model::ParentLink>, Error> {
        let (Some(run_id), Some(step_id)) = (&self.parent_run_id, &self.parent_step_id) else {
            return Ok(None);
        };
        let on_cancel = match self.on_parent_cancel.as_deref() {
            Some("abandon") => crate::model::OnParentCancel::Abandon,
            Some("cancel") | None => crate::model::OnParentCancel::Cancel,
            Some(other) => {
                return Err(Error::Corrupt {
                    what: format!("run {}: on_parent_cancel {other:?}", self.id),
                });
            }
        };
        Ok(Some(crate::model::ParentLink {
            run_id: run_id.clone(),
            step_id: step_id.clone(),
            on_cancel,
        }))
    }

    /// For a running run: `Busy` (naming holder and expiry) while its lease is live and
    /// its holder is not provably dead — the only case in which nobody else may take it.
    pub(crate) fn check_not_held(&self, now: crate::clock::Timestamp) -> Result<(), Error> {
        let live = self.lease_expires_at.is_some_and(|e| e > now.0);
        let dead = self
            .worker
            .as_deref()
            .is_some_and(|w| WorkerId::from_string(w).is_provably_dead());
        if live && !dead {
            return Err(Error::Busy {
                holder: self.worker.clone().unwrap_or_default(),
                until: crate::clock::Timestamp(self.lease_expires_at.unwrap_or(0)),
            });
        }
        Ok(())
    }

    pub(crate) fn into_run(self) -> Result<Run, Error> {
        let status = self.status()?;
        let parent = self.parent()?;
        let Some(workflow_text) = self.workflow_text else {
            return Err(Error::Corrupt {
                what: format!(
                    "run {}: its workflow text (hash {}) is missing from workflow_texts",
                    self.id, self.workflow_hash
                ),
            });
        };
        Ok(Run {
            status,
            inputs: json("run inputs", Some(self.inputs))?.unwrap_or(Value::Null),
            output: json("run output", self.output)?,
            id: self.id,
            workflow_name: self.workflow_name,
            workflow_text,
            workflow_hash: self.workflow_hash,
            error: self.error,
            pause_reason: self.pause_reason,
            created_at: Timestamp(self.created_at),
            started_at: ts(self.started_at),
            finished_at: ts(self.finished_at),
            not_before: Timestamp(self.not_before),
            worker: self.worker.map(WorkerId::from_string),
            lease_token: self.lease_token,
            lease_expires_at: ts(self.lease_expires_at),
            cancel_requested: self.cancel_requested,
            priority: i32::try_from(self.priority).unwrap_or(0),
            parent,
            trace_segment: self.trace_segment,
        })
    }
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct StepRow {
    pub run_id: String,
    pub step_id: String,
    pub node_id: String,
    pub retry: i64,
    pub status: String,
    pub not_before: Option<i64>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub output: Option<String>,
    pub error_kind: Option<String>,
    pub error_message: Option<String>,
    pub tool_call_id: Option<String>,
}

macro_rules! step_cols {
    () => {
        "run_id, step_id, node_id, retry, status, not_before, created_at, started_at, finished_at, output, error_kind, error_message, tool_call_id"
    };
}
pub(crate) use step_cols;

impl StepRow {
    pub(crate) fn status(&self) -> Result<StepStatus, Error> {
        self.status.parse()
    }

    pub(crate) fn into_step(self) -> Result<Step, Error> {
        Ok(Step {
            status: self.status()?,
            output: json("step output", self.output)?,
            error_kind: kind(self.error_kind)?,
            run_id: self.run_id,
            step_id: self.step_id,
            node_id: self.node_id,
            retry: count(self.retry),
            not_before: ts(self.not_before),
            created_at: Timestamp(self.created_at),
            started_at: ts(self.started_at),
            finished_at: ts(self.finished_at),
            error_message: self.error_message,
            tool_call_id: self.tool_call_id,
        })
    }
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct CallRow {
    pub run_id: String,
    pub tool_call_id: String,
    pub step_id: String,
    pub tool: String,
    pub idempotency_key: String,
    pub request: String,
    pub request_hash: String,
    pub status: String,
    pub attempt_count: i64,
    pub outbound_requests: i64,
    pub lease_holder: Option<String>,
    pub lease_token: i64,
    pub run_token: i64,
    pub lease_expires_at: Option<i64>,
    pub outbound_started_at: Option<i64>,
    pub in_doubt_at: Option<i64>,
    pub output: Option<String>,
    pub error_kind: Option<String>,
    pub error_message: Option<String>,
    pub resolution: Option<String>,
    pub resolved_by: Option<String>,
    pub resolved_at: Option<i64>,
    pub resolution_note: Option<String>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    pub remote_task: Option<String>,
    pub uncounted_sends: i64,
    /// The stored trace context (migration 0019); absent from column lists that do not
    /// need it.
    #[sqlx(default)]
    pub trace_parent: Option<String>,
    #[sqlx(default)]
    pub trace_state: Option<String>,
    /// The concurrency limit the call counts against (migration 0025); absent from
    /// column lists that do not need it.
    #[sqlx(default)]
    pub slot: Option<String>,
    /// Why the claimed call waits unsent (migration 0025).
    #[sqlx(default)]
    pub waiting: Option<String>,
}

macro_rules! call_cols {
    () => {
        "run_id, tool_call_id, step_id, tool, idempotency_key, request, request_hash, status, attempt_count, outbound_requests, lease_holder, lease_token, run_token, lease_expires_at, outbound_started_at, in_doubt_at, output, error_kind, error_message, resolution, resolved_by, resolved_at, resolution_note, created_at, finished_at, remote_task, uncounted_sends, trace_parent, trace_state, slot, waiting"
    };
}
pub(crate) use call_cols;

impl CallRow {
    pub(crate) fn status(&self) -> Result<CallStatus, Error> {
        self.status.parse()
    }

    pub(crate) fn facts(&self) -> Result<CallFacts, Error> {
        Ok(CallFacts {
            status: self.status()?,
            lease: LeaseView {
                holder: self.lease_holder.clone(),
                expires_at: ts(self.lease_expires_at),
                run_token: self.run_token,
            },
            in_doubt_at: ts(self.in_doubt_at),
            remote_task: self.remote_task.is_some(),
        })
    }

    pub(crate) fn holder_dead(&self) -> bool {
        self.lease_holder
            .as_deref()
            .is_some_and(|h| WorkerId::from_string(h).is_provably_dead())
    }

    pub(crate) fn error(&self) -> Result<Option<StepError>, Error> {
        Ok(kind(self.error_kind.clone())?.map(|kind| StepError {
            kind,
            message: self.error_message.clone().unwrap_or_default(),
        }))
    }

    pub(crate) fn replayed(&self, from_run: Option<String>) -> Result<Replayed, Error> {
        Ok(Replayed {
            status: self.status()?,
            output: json("call output", self.output.clone())?,
            error: self.error()?,
            from_run,
            attempt_count: count(self.attempt_count),
            outbound_requests: count(self.outbound_requests),
        })
    }

    pub(crate) fn into_call(self) -> Result<ToolCall, Error> {
        Ok(ToolCall {
            status: self.status()?,
            output: json("call output", self.output)?,
            request: json("call request", Some(self.request))?.unwrap_or(Value::Null),
            error_kind: kind(self.error_kind)?,
            current_key: attempt_key(&self.idempotency_key, count(self.attempt_count)),
            run_id: self.run_id,
            tool_call_id: self.tool_call_id,
            step_id: self.step_id,
            tool: self.tool,
            attempt_count: count(self.attempt_count),
            outbound_requests: count(self.outbound_requests),
            idempotency_key: self.idempotency_key,
            outbound_started_at: ts(self.outbound_started_at),
            in_doubt_at: ts(self.in_doubt_at),
            lease_holder: self.lease_holder.map(WorkerId::from_string),
            lease_token: self.lease_token,
            lease_expires_at: ts(self.lease_expires_at),
            error_message: self.error_message,
            resolution: self.resolution,
            resolved_by: self.resolved_by,
            resolved_at: ts(self.resolved_at),
            resolution_note: self.resolution_note,
            request_hash: self.request_hash,
            created_at: Timestamp(self.created_at),
            finished_at: ts(self.finished_at),
            remote_task: self.remote_task,
            uncounted_sends: count(self.uncounted_sends),
            trace_parent: self.trace_parent,
            trace_state: self.trace_state,
            waiting: self.waiting,
        })
    }
}

#[cfg(any(test, feature = "testkit"))]
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct AttemptRow {
    pub tool_call_id: String,
    pub step_id: String,
    pub attempt: i64,
    pub sent_key: String,
    pub outbound_started_at: Option<i64>,
    pub finished_at: i64,
    pub outcome: String,
    pub error_kind: Option<String>,
    pub error_message: Option<String>,
    pub requests_sent: i64,
}

#[cfg(any(test, feature = "testkit"))]
impl AttemptRow {
    pub(crate) fn into_attempt(self) -> Result<Attempt, Error> {
        Ok(Attempt {
            error_kind: kind(self.error_kind)?,
            tool_call_id: self.tool_call_id,
            step_id: self.step_id,
            attempt: count(self.attempt),
            sent_key: self.sent_key,
            outbound_started_at: ts(self.outbound_started_at),
            finished_at: Timestamp(self.finished_at),
            outcome: self.outcome.parse()?,
            error_message: self.error_message,
            requests_sent: count(self.requests_sent),
        })
    }
}

#[cfg(any(test, feature = "testkit"))]
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct UsageRow {
    pub tool_call_id: String,
    pub tool: String,
    pub attempt: i64,
    pub sent_key: String,
    pub kind: String,
    pub quantity: i64,
    pub created_at: i64,
}

#[cfg(any(test, feature = "testkit"))]
impl UsageRow {
    pub(crate) fn into_usage(self) -> Result<Usage, Error> {
        Ok(Usage {
            tool_call_id: self.tool_call_id,
            tool: self.tool,
            attempt: count(self.attempt),
            sent_key: self.sent_key,
            kind: self.kind.parse()?,
            quantity: self.quantity,
            created_at: Timestamp(self.created_at),
        })
    }
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EventRow {
    pub seq: i64,
    pub id: String,
    #[sqlx(rename = "type")]
    pub event_type: String,
    pub time: i64,
    pub run_id: Option<String>,
    pub step_id: Option<String>,
    pub tool_call_id: Option<String>,
    pub payload: String,
}

impl EventRow {
    pub(crate) fn into_event(self) -> Result<Event, Error> {
        Ok(Event {
            event_type: EventType::parse(&self.event_type).ok_or_else(|| Error::Corrupt {
                what: format!("unknown event type {:?}", self.event_type),
            })?,
            payload: json("event payload", Some(self.payload))?.unwrap_or(Value::Null),
            seq: self.seq,
            id: self.id,
            time: Timestamp(self.time),
            run_id: self.run_id,
            step_id: self.step_id,
            tool_call_id: self.tool_call_id,
        })
    }
}

/// A single `count` or other integer column.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct IntRow {
    pub n: i64,
}

/// `(text, integer)` pairs, e.g. counts by status.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TextIntRow {
    pub t: String,
    pub n: i64,
}

/// A single text column.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TextRow {
    pub t: String,
}
