//! The ledger's request and row types.
//!
//! Requests with more than a few fields are structs (no bare bool arguments); rows
//! are plain data with serde so the CLI can print them as JSON as they are.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::lineage::{OnParentCancel, ParentLink};
use serde_json::Value;

use crate::clock::Timestamp;
use crate::error::Error;
use crate::state::{CallStatus, ErrorKind, RunStatus, StepStatus};
use crate::worker::WorkerId;

/// Which tenant and workspace a [`crate::Ledger`] handle reads and writes. Fixed when the
/// ledger is opened, so no query can forget to filter by it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scope {
    /// Tenant (default `default`).
    pub tenant: String,
    /// Workspace within the tenant (default `default`).
    pub workspace: String,
}

impl Default for Scope {
    fn default() -> Self {
        Self {
            tenant: "default".into(),
            workspace: "default".into(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Runs

/// A run to put on the queue.
#[derive(Debug, Clone)]
pub struct NewRun {
    /// `run_<ULID>`, chosen by the caller so that a retried submit is idempotent.
    pub id: String,
    /// The workflow's `name`.
    pub workflow_name: String,
    /// The YAML text the run will execute (a snapshot: editing the file later does not
    /// change a queued or paused run). Stored once per distinct text (`workflow_texts`);
    /// its hash ([`crate::workflow_hash`], computed by the ledger) is what an idempotent
    /// re-submit compares.
    pub workflow_text: String,
    /// The run's inputs.
    pub inputs: Value,
    /// Higher runs first.
    pub priority: i32,
    /// Not claimable before this time (`None` = at once).
    pub not_before: Option<Timestamp>,
    /// The W3C `traceparent` of whoever submitted the run (an API request's header):
    /// the run's first execution segment continues that trace.
    pub trace_parent: Option<String>,
}

/// The result of [`crate::Ledger::enqueue`].
#[derive(Debug, Clone)]
pub struct Enqueued {
    /// The run as stored.
    pub run: Run,
    /// False when the same run (same id, hash and inputs) was already there.
    pub created: bool,
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// Run id.
    pub id: String,
    /// Current status.
    pub status: RunStatus,
    /// Workflow name.
    pub workflow_name: String,
    /// Workflow YAML snapshot (resolved from `workflow_texts` when the run row does not
    /// hold it inline).
    pub workflow_text: String,
    /// SHA-256 hex of the snapshot ([`crate::workflow_hash`]).
    pub workflow_hash: String,
    /// Inputs.
    pub inputs: Value,
    /// Final output, once succeeded.
    pub output: Option<Value>,
    /// Final error message, once failed or cancelled.
    pub error: Option<String>,
    /// Why it paused, while paused.
    pub pause_reason: Option<String>,
    /// Enqueue time.
    pub created_at: Timestamp,
    /// First claim time.
    pub started_at: Option<Timestamp>,
    /// Terminal time.
    pub finished_at: Option<Timestamp>,
    /// Not claimable before this time.
    pub not_before: Timestamp,
    /// Current or last lease holder.
    pub worker: Option<WorkerId>,
    /// Current lease token (fencing token; +1 per claim).
    pub lease_token: i64,
    /// Lease end while running.
    pub lease_expires_at: Option<Timestamp>,
    /// A cancel was requested; the holder stops at its next heartbeat.
    pub cancel_requested: bool,
    /// Queue priority.
    pub priority: i32,
    /// The run and step that started this run, when it is a sub-workflow's run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    /// Where the run's next execution segment's trace comes from: before its first
    /// claim, the submitter's `traceparent` (the segment continues that trace); after,
    /// the latest segment's span context when it was traced (the next one links to it).
    /// Not part of the run's public view.
    #[serde(skip)]
    pub trace_segment: Option<String>,
}

/// Which runs [`crate::Ledger::list_runs`] returns (newest first) and
/// [`crate::Ledger::count_runs`] counts.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// Only runs in this status.
    pub status: Option<RunStatus>,
    /// At most this many (0 = 100).
    pub limit: u32,
    /// Only runs of this workflow (its `name:`).
    pub workflow: Option<String>,
    /// Only runs created at or after this time.
    pub since: Option<Timestamp>,
    /// Only runs created before this time.
    pub until: Option<Timestamp>,
    /// Keyset paging: only runs after this one in the listing's order (newest first),
    /// so a page boundary stays put while new runs arrive.
    pub after: Option<RunCursor>,
    /// Only runs whose inputs hold every one of these `(name, value)` pairs (AND): the
    /// operator's "which run handled order 117?". A pair matches a top-level input
    /// whose value is the string `value` exactly (case and bytes), or a number or
    /// boolean whose JSON text is `value` (`117` matches both `117` and `"117"`,
    /// `true` both `true` and `"true"`, `1.5` matches `1.5` but not `1.50`). Nulls,
    /// arrays, objects and strings over [`crate::MAX_INPUT_VALUE_LEN`] bytes are never
    /// matched. Names must pass the id grammar (`ids::check_id`) and values fit that
    /// bound, or the listing fails with [`crate::Error::InvalidFilter`]. Their order does
    /// not matter: the page walks the pair the fewest runs have.
    pub inputs: Vec<(String, String)>,
    /// Only runs whose id starts with this text (byte for byte, so `%` and `_` are
    /// themselves; empty = every run): what an operator pastes from a log line.
    /// Longer than [`crate::ids::MAX_ID_LEN`] bytes, or holding NUL, is
    /// [`crate::Error::InvalidFilter`].
    pub id_prefix: Option<String>,
    /// Only the children of this run (the runs its sub-workflow nodes started).
    pub parent: Option<String>,
}

/// Where a page of [`crate::Ledger::list_runs`] ended: the last run's creation time
/// and id (the listing's sort key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCursor {
    /// The last listed run's `created_at`.
    pub created_at: Timestamp,
    /// The last listed run's id (ties on `created_at` are ordered by id).
    pub id: String,
}

impl RunCursor {
    /// The cursor after `run`.
    pub fn after(run: &Run) -> Self {
        Self {
            created_at: run.created_at,
            id: run.id.clone(),
        }
    }

    /// `<created_at ms>.<id>`: what the CLI prints and takes back.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.created_at.0, self.id)
    }

    /// The inverse of [`RunCursor::encode`]; `None` for text it did not produce.
    pub fn decode(text: &str) -> Option<Self> {
        let (ms, id) = text.split_once('.')?;
        Some(Self {
            created_at: Timestamp(ms.parse().ok()?),
            id: id.to_string(),
        })
    }
}

/// A batch claim from the run queue.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRuns<'a> {
    /// Who claims.
    pub worker: &'a WorkerId,
    /// Lease length; renew with `heartbeat` well before it ends.
    pub lease: Duration,
    /// At most this many runs.
    pub limit: u32,
}

/// Ownership of a run by a worker. Every write on the run's behalf carries `token`: a
/// worker whose run was taken over gets `LeaseLost` instead of a silent success.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunLease {
    /// The run.
    pub run_id: String,
    /// The holder.
    pub worker: WorkerId,
    /// Fencing token, strictly increasing per run.
    pub token: i64,
    /// Lease end at the time of the claim or last heartbeat.
    pub expires_at: Timestamp,
    /// The parent run, when this is a child run: its finish wakes that parent in the
    /// same transaction.
    pub parent: Option<String>,
}

/// A run taken off the queue: its lease and the row as the claim left it, so a worker
/// starts executing without reading the run again (one round trip less per run).
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The lease every write on the run's behalf carries.
    pub lease: RunLease,
    /// The run (status `running`, held by the claimer).
    pub run: Run,
}

/// What a heartbeat tells the holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatAck {
    /// The new lease end.
    pub expires_at: Timestamp,
    /// Someone asked to cancel the run: stop starting new work.
    pub cancel_requested: bool,
}

/// How a run ends.
#[derive(Debug, Clone)]
pub struct RunFinish {
    /// `Succeeded`, `Failed` or `Cancelled`.
    pub status: RunStatus,
    /// Output of a succeeded run.
    pub output: Option<Value>,
    /// Error message of a failed or cancelled run.
    pub error: Option<String>,
}

// ---------------------------------------------------------------------------------------
// Steps

/// A step to create: `node` for the first attempt, `node_retry<n>` for retry n.
#[derive(Debug, Clone, PartialEq)]
pub struct NewStep {
    /// Step id.
    pub step_id: String,
    /// Node id.
    pub node_id: String,
    /// Retry index (0 for the first attempt).
    pub retry: u32,
    /// Durable backoff: not to be started before this.
    pub not_before: Option<Timestamp>,
    /// `Pending`, `Running` or `Skipped`.
    pub status: StepStatus,
}

/// An error with its kind, as stored on steps and calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepError {
    /// What the executor may do about it.
    pub kind: ErrorKind,
    /// Human-readable message (no secret values).
    pub message: String,
}

/// How a step ends.
#[derive(Debug, Clone, PartialEq)]
pub struct StepFinish {
    /// Step id.
    pub step_id: String,
    /// `Succeeded`, `Failed`, `Skipped` or `Cancelled`.
    pub status: StepStatus,
    /// Output of a succeeded step (limited to `output_limit_bytes`).
    pub output: Option<Value>,
    /// Error of a failed step.
    pub error: Option<StepError>,
}

impl StepFinish {
    /// The step finish a call's terminal outcome means: the one conversion of an outcome
    /// into a step's end, so a completed call, a pure call and a replay finish their
    /// step alike.
    pub fn from_outcome(step_id: impl Into<String>, outcome: CallOutcome) -> Self {
        let step_id = step_id.into();
        match outcome {
            CallOutcome::Succeeded(v) => Self {
                step_id,
                status: StepStatus::Succeeded,
                output: Some(v),
                error: None,
            },
            CallOutcome::Failed(e) => Self {
                step_id,
                status: StepStatus::Failed,
                output: None,
                error: Some(e),
            },
        }
    }
}

/// A step as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Run id.
    pub run_id: String,
    /// Step id.
    pub step_id: String,
    /// Node id.
    pub node_id: String,
    /// Retry index.
    pub retry: u32,
    /// Current status.
    pub status: StepStatus,
    /// Durable backoff.
    pub not_before: Option<Timestamp>,
    /// Creation time.
    pub created_at: Timestamp,
    /// Start time.
    pub started_at: Option<Timestamp>,
    /// End time.
    pub finished_at: Option<Timestamp>,
    /// Output.
    pub output: Option<Value>,
    /// Error kind.
    pub error_kind: Option<ErrorKind>,
    /// Error message.
    pub error_message: Option<String>,
    /// The tool call this step claimed, if any.
    pub tool_call_id: Option<String>,
}

// ---------------------------------------------------------------------------------------
// Tool calls

/// A claim on a node's tool call (the crate docs' claim rules).
#[derive(Debug, Clone)]
pub struct ClaimCall<'a> {
    /// The caller's run lease (the claim is refused with `LeaseLost` without it).
    pub run: &'a RunLease,
    /// The step making this attempt.
    pub step_id: String,
    /// The node id; stable across the node's steps.
    pub tool_call_id: String,
    /// Tool name.
    pub tool: String,
    /// Base idempotency key; attempt n sends `<key>:<n>`.
    pub idempotency_key: String,
    /// The redacted request (secret names only).
    pub request: Value,
    /// [`crate::canonical_hash`] of the request, computed by the caller.
    pub request_hash: String,
    /// A failed call starts a new effect attempt instead of being replayed.
    pub retry_failed: bool,
    /// Call lease length.
    pub lease: Duration,
}

/// Ownership of a call by a step. Carries everything the fenced writes need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallLease {
    /// Run id.
    pub run_id: String,
    /// Node id.
    pub tool_call_id: String,
    /// The step that holds it.
    pub step_id: String,
    /// Tool name (for usage rows).
    pub tool: String,
    /// The holder.
    pub worker: WorkerId,
    /// Call fencing token.
    pub token: i64,
    /// Effect attempt number (1-based).
    pub attempt: u32,
    /// The key to SEND: `<base>:<attempt>`.
    pub key: String,
    /// The run lease token this claim was made under.
    pub run_token: i64,
    /// Lease end.
    pub expires_at: Timestamp,
    /// Requests already sent under this effect attempt's key by earlier claims whose
    /// outcome stayed unknown (a crash, or an in-doubt call resolved `retry`); 0 for a
    /// fresh attempt. Such an attempt may have taken effect: a later "not sent" on a
    /// re-send never makes it safe to change the key.
    pub prior_sends: u32,
    /// The remote task this attempt already started (an MCP task id recorded by
    /// `record_task`), when the claim took the call over to collect it: the holder
    /// asks for the task's result and must not send the call again.
    pub remote_task: Option<String>,
    /// The W3C `traceparent` stored with this key's first outbound mark (a re-send
    /// carries it again), or — set by the holder before its mark — the one to store.
    #[serde(default)]
    pub trace_parent: Option<String>,
    /// The `tracestate` stored beside [`CallLease::trace_parent`].
    #[serde(default)]
    pub trace_state: Option<String>,
}

/// A terminal outcome returned without calling the tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Replayed {
    /// `Succeeded` or `Failed`.
    pub status: CallStatus,
    /// Stored output.
    pub output: Option<Value>,
    /// Stored error.
    pub error: Option<StepError>,
    /// Set when replaying another run's call that used the same key and request.
    pub from_run: Option<String>,
    /// Effect attempts of the replayed call.
    pub attempt_count: u32,
    /// Requests it sent.
    pub outbound_requests: u32,
}

/// The answer to a claim that did not fail.
#[derive(Debug, Clone, PartialEq)]
pub enum CallClaim {
    /// This step may send (after `mark_outbound`).
    Claimed(CallLease),
    /// The call is terminal: use the stored outcome.
    Replay(Replayed),
    /// The call is (or just became, by this claim's takeover) in doubt: the step is
    /// paused; the engine pauses the run once independent branches finish.
    InDoubt {
        /// When it became in doubt.
        since: Timestamp,
    },
}

/// A call's terminal outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    /// The tool succeeded with this output.
    Succeeded(Value),
    /// The tool failed.
    Failed(StepError),
}

/// Recording the outcome of an outbound call.
#[derive(Debug, Clone)]
pub struct CompleteCall<'a> {
    /// The call lease (fenced: token and run lease must still match).
    pub lease: &'a CallLease,
    /// What happened.
    pub outcome: CallOutcome,
    /// Requests actually sent in this attempt (one usage row each).
    pub requests_sent: u32,
    /// Finish the step in the same transaction.
    pub step: Option<StepFinish>,
    /// Create the next step (e.g. `node_retry1` with `not_before`) in the same transaction.
    pub next_step: Option<NewStep>,
}

/// The worker learned that the outcome of an outbound call is unknown.
#[derive(Debug, Clone)]
pub struct InDoubtReport {
    /// Requests that left (or may have left) in this attempt.
    pub requests_sent: u32,
    /// What happened (timeout, connection lost…).
    pub message: String,
}

/// An operator's decision on an in-doubt call.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// It happened; this is its output.
    Succeeded(Value),
    /// It did not happen (or failed); this is why.
    Failed(String),
    /// Re-send with the same key and attempt (safe only if the downstream dedupes).
    Retry,
}

impl Resolution {
    /// The stored text (`succeeded`, `failed`, `retry`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Resolution::Succeeded(_) => "succeeded",
            Resolution::Failed(_) => "failed",
            Resolution::Retry => "retry",
        }
    }
}

/// Settling an in-doubt call.
#[derive(Debug, Clone)]
pub struct Resolve {
    /// Run id.
    pub run_id: String,
    /// Node id.
    pub tool_call_id: String,
    /// The decision.
    pub resolution: Resolution,
    /// Who decided (OS user or worker id).
    pub by: String,
    /// Why.
    pub note: Option<String>,
}

/// Who asked for a mutation, and why: an API token's name and the reason its caller
/// gave. Written as `by` and `reason` into the mutation's event payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// The token's name (`[[api.tokens]] name`), or the OS user for the CLI.
    pub by: String,
    /// Why, as the operator said (optional).
    pub reason: Option<String>,
}

/// A tool call as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Run id.
    pub run_id: String,
    /// Node id.
    pub tool_call_id: String,
    /// The step that last claimed it.
    pub step_id: String,
    /// Tool name.
    pub tool: String,
    /// Current status.
    pub status: CallStatus,
    /// Effect attempts started.
    pub attempt_count: u32,
    /// Requests known to have been sent.
    pub outbound_requests: u32,
    /// Base idempotency key.
    pub idempotency_key: String,
    /// Key of the current attempt (`<base>:<attempt_count>`).
    pub current_key: String,
    /// Last outbound mark.
    pub outbound_started_at: Option<Timestamp>,
    /// When it became in doubt.
    pub in_doubt_at: Option<Timestamp>,
    /// Lease holder (`None` when released or never leased).
    pub lease_holder: Option<WorkerId>,
    /// Call fencing token.
    pub lease_token: i64,
    /// Lease end.
    pub lease_expires_at: Option<Timestamp>,
    /// Output.
    pub output: Option<Value>,
    /// Error kind.
    pub error_kind: Option<ErrorKind>,
    /// Error message.
    pub error_message: Option<String>,
    /// Operator resolution (`succeeded`, `failed`, `retry`).
    pub resolution: Option<String>,
    /// Who resolved it.
    pub resolved_by: Option<String>,
    /// When.
    pub resolved_at: Option<Timestamp>,
    /// Why.
    pub resolution_note: Option<String>,
    /// Redacted request.
    pub request: Value,
    /// Canonical request hash.
    pub request_hash: String,
    /// Creation time.
    pub created_at: Timestamp,
    /// Terminal time.
    pub finished_at: Option<Timestamp>,
    /// The remote task the downstream started for the current attempt (an MCP task
    /// id), if any: what a later holder collects instead of sending again, and what an
    /// operator looks up before resolving the call by hand.
    pub remote_task: Option<String>,
    /// Sends whose request count is unknown (the holder died after the outbound mark):
    /// each may have sent at least one request beyond `outbound_requests`.
    pub uncounted_sends: u32,
    /// The W3C `traceparent` stored with the current attempt's first outbound mark when
    /// that send was traced: every re-send of the key carries it, and a probe's or a
    /// resolution's span links to it, so a trace shows what became of the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_parent: Option<String>,
    /// The `tracestate` stored beside it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_state: Option<String>,
    /// Why a claimed call was let go unsent and waits — a slot of the tool's
    /// concurrency limit, its rate limit, the downstream's `Retry-After` — in words, so
    /// `flow show`, the API and the console can say why a run is not moving. Cleared by
    /// the outbound mark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

impl ToolCall {
    /// How many requests left, as far as the ledger knows: an exact count, or a lower
    /// bound when a send's count is unknown. What `flow show`, the API and the console
    /// print, so that nobody reads "0 sent" above "the request left".
    pub fn requests_sent(&self) -> RequestsSent {
        RequestsSent {
            known: self.outbound_requests,
            uncounted_sends: self.uncounted_sends,
        }
    }
}

/// A call's count of requests sent ([`ToolCall::requests_sent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestsSent {
    /// Requests known to have left.
    pub known: u32,
    /// Sends whose count is unknown (each may have sent at least one request).
    pub uncounted_sends: u32,
}

impl RequestsSent {
    /// The exact count, or `None` when some send's count is unknown.
    pub fn exact(self) -> Option<u32> {
        (self.uncounted_sends == 0).then_some(self.known)
    }
}

impl std::fmt::Display for RequestsSent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.uncounted_sends {
            0 => write!(f, "{}", self.known),
            1 => write!(
                f,
                "{} known + 1 send unknown (at least 1 may have left)",
                self.known
            ),
            n => write!(
                f,
                "{} known + {n} sends unknown (at least 1 each may have left)",
                self.known
            ),
        }
    }
}

/// One effect attempt that reached an outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// Node id.
    pub tool_call_id: String,
    /// Step that made it.
    pub step_id: String,
    /// Attempt number.
    pub attempt: u32,
    /// Key sent.
    pub sent_key: String,
    /// Outbound mark.
    pub outbound_started_at: Option<Timestamp>,
    /// Outcome time.
    pub finished_at: Timestamp,
    /// What it came to.
    pub outcome: AttemptOutcome,
    /// Error kind.
    pub error_kind: Option<ErrorKind>,
    /// Error message.
    pub error_message: Option<String>,
    /// Requests sent in this attempt.
    pub requests_sent: u32,
}

crate::state::text_enum! {
    /// What one effect attempt came to (`tool_call_attempts.outcome`).
    AttemptOutcome {
        /// The call succeeded.
        Succeeded => "succeeded",
        /// The call failed (the downstream said so, or it was never sent).
        Failed => "failed",
        /// Sent, with no answer: the call went in doubt.
        Unknown => "unknown",
    }
}

impl AttemptOutcome {
    /// The outcome a call's new status records: `succeeded`, `failed`, anything else
    /// (in doubt) `unknown`.
    pub fn of_call(status: CallStatus) -> Self {
        match status {
            CallStatus::Succeeded => Self::Succeeded,
            CallStatus::Failed => Self::Failed,
            _ => Self::Unknown,
        }
    }
}

crate::state::text_enum! {
    /// What a usage row counts (`usage.kind`): every request that left counts against
    /// limits, and the two kinds say why it was sent.
    UsageKind {
        /// A request of the call itself (an effect attempt).
        Request => "request",
        /// A reconciliation probe's request, asking whether the effect happened.
        Probe => "probe",
    }
}

/// One request sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Node id.
    pub tool_call_id: String,
    /// Tool name.
    pub tool: String,
    /// Attempt number.
    pub attempt: u32,
    /// Key sent.
    pub sent_key: String,
    /// What was sent: an effect's request or a probe's.
    pub kind: UsageKind,
    /// Always 1 for requests.
    pub quantity: i64,
    /// When.
    pub created_at: Timestamp,
}

// ---------------------------------------------------------------------------------------
// Rate limits

/// A fixed counting window, aligned to UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Window {
    /// The current UTC second (`hh:mm:ss.000` to the next second).
    Second,
    /// The current UTC minute (`hh:mm:00.000` to the next minute).
    Minute,
    /// The current UTC day (`00:00:00.000Z` to the next midnight): a daily quota.
    Day,
}

impl Window {
    /// Stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            Window::Second => "second",
            Window::Minute => "minute",
            Window::Day => "day",
        }
    }

    /// Window length in milliseconds.
    pub fn millis(self) -> i64 {
        match self {
            Window::Second => 1_000,
            Window::Minute => 60_000,
            Window::Day => 86_400_000,
        }
    }

    /// Start of the window containing `t`.
    pub fn start(self, t: Timestamp) -> Timestamp {
        Timestamp(t.0.div_euclid(self.millis()) * self.millis())
    }
}

/// One request asking to be counted.
#[derive(Debug, Clone)]
pub struct RateAcquire {
    /// What is limited, e.g. a tool name.
    pub key: String,
    /// Which window.
    pub window: Window,
    /// At most this many per window.
    pub limit: u32,
}

/// The answer of [`crate::Ledger::rate_acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateDecision {
    /// Counted; `count` requests used in this window so far.
    Granted {
        /// Count after this request.
        count: u32,
    },
    /// The window is full; try again at `retry_at` (the next window's start).
    Limited {
        /// Next window start.
        retry_at: Timestamp,
    },
}
