//! Outbox events (the README's guarantee 4: an event exists only with its state change).
//!
//! Each state-changing method inserts its events into `outbox` inside its own
//! transaction: no event without its state change, no state change without its event.
//! Payloads carry only what the ledger already stores (redacted), never secret values.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::error::Error;
use crate::model::Scope;

/// The event types flow emits. Consumers filter on [`EventType::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum EventType {
    /// A run entered the queue.
    #[serde(rename = "run.queued")]
    RunQueued,
    /// A worker claimed a run (emitted on every claim, takeovers included).
    #[serde(rename = "run.started")]
    RunStarted,
    /// A run paused (in doubt, or operator).
    #[serde(rename = "run.paused")]
    RunPaused,
    /// A run succeeded.
    #[serde(rename = "run.succeeded")]
    RunSucceeded,
    /// A run failed.
    #[serde(rename = "run.failed")]
    RunFailed,
    /// A run was cancelled.
    #[serde(rename = "run.cancelled")]
    RunCancelled,
    /// An operator asked a run held by a live worker to stop (the worker ends it
    /// cancelled at its next heartbeat; `run.cancelled` follows).
    #[serde(rename = "run.cancel_requested")]
    RunCancelRequested,
    /// An operator put a failed run back on the queue; its failed nodes run again as
    /// new effect attempts (`Ledger::redrive_run`).
    #[serde(rename = "run.redriven")]
    RunRedriven,
    /// A step started running.
    #[serde(rename = "step.started")]
    StepStarted,
    /// A step succeeded.
    #[serde(rename = "step.succeeded")]
    StepSucceeded,
    /// A step failed.
    #[serde(rename = "step.failed")]
    StepFailed,
    /// A retry step was created, waiting for its backoff.
    #[serde(rename = "step.retry_scheduled")]
    StepRetryScheduled,
    /// A tool call became in doubt.
    #[serde(rename = "tool_call.in_doubt")]
    ToolCallInDoubt,
    /// An in-doubt tool call was resolved.
    #[serde(rename = "tool_call.resolved")]
    ToolCallResolved,
    /// A probe asked the downstream about an in-doubt call (reconciliation).
    #[serde(rename = "tool_call.probed")]
    ToolCallProbed,
    /// An in-doubt call's probes are spent, or could not settle it: a human decides.
    #[serde(rename = "tool_call.needs_operator")]
    ToolCallNeedsOperator,
    /// An operator released the concurrency slot a call in doubt held (`flow
    /// release-slot`): the call stays in doubt but no longer counts against its limit.
    #[serde(rename = "tool_call.slot_released")]
    ToolCallSlotReleased,
    /// The downstream started a remote task for a call (an MCP task); its id is
    /// recorded, and the call is collected by it after a crash or a timeout.
    #[serde(rename = "tool_call.task_started")]
    ToolCallTaskStarted,
    /// A server asked for input during a call (MCP elicitation) and the tool's policy
    /// answered: the question, the answer (secrets scrubbed) and who decided.
    #[serde(rename = "tool_call.elicited")]
    ToolCallElicited,
    /// A node's call awaits approval: its request (secrets as names) is frozen with
    /// its digest; nothing is sent before enough approvers approve that digest.
    #[serde(rename = "approval.requested")]
    ApprovalRequested,
    /// One approver approved; more are needed (`min`).
    #[serde(rename = "approval.voted")]
    ApprovalVoted,
    /// An approval was decided: approved (by whom, with which inputs) or denied (why).
    #[serde(rename = "approval.decided")]
    ApprovalDecided,
    /// A pending approval is still waiting: a reminder (`remind:`), e.g. for a pager.
    #[serde(rename = "approval.reminder")]
    ApprovalReminder,
    /// Nobody decided before the deadline; `on_timeout` applies (a timeout never
    /// approves).
    #[serde(rename = "approval.timed_out")]
    ApprovalTimedOut,
    /// The request rendered at send time is not the one approved (or awaiting): the
    /// approval is void and the new request awaits approval.
    #[serde(rename = "approval.invalidated")]
    ApprovalInvalidated,
    /// A node began to wait: for an event (`wait:`) or for its callback (after its
    /// call succeeded), with the deadline.
    #[serde(rename = "wait.requested")]
    WaitRequested,
    /// A wait ended: an event matched (its id) or a callback came (`ok` or not).
    #[serde(rename = "wait.completed")]
    WaitCompleted,
    /// Nothing came before the wait's deadline (or its heartbeat's).
    #[serde(rename = "wait.timed_out")]
    WaitTimedOut,
    /// A connection's refresh token was refused: a person must run `flow connect` again.
    #[serde(rename = "connection.needs_reconnect")]
    ConnectionNeedsReconnect,
    /// A proxied MCP server lists one of its tools with a definition other than the
    /// pinned one: the proxy keeps the pin until an admin accepts the new definition.
    #[serde(rename = "mcp.tool_changed")]
    McpToolChanged,
    /// An admin accepted a proxied tool's new definition as its pin: who, why, and the
    /// digests before and after.
    #[serde(rename = "mcp.tool_accepted")]
    McpToolAccepted,
}

impl EventType {
    /// Every type.
    pub const ALL: &'static [EventType] = &[
        Self::RunQueued,
        Self::RunStarted,
        Self::RunPaused,
        Self::RunSucceeded,
        Self::RunFailed,
        Self::RunCancelled,
        Self::RunCancelRequested,
        Self::RunRedriven,
        Self::StepStarted,
        Self::StepSucceeded,
        Self::StepFailed,
        Self::StepRetryScheduled,
        Self::ToolCallInDoubt,
        Self::ToolCallResolved,
        Self::ToolCallProbed,
        Self::ToolCallNeedsOperator,
        Self::ToolCallSlotReleased,
        Self::ToolCallTaskStarted,
        Self::ToolCallElicited,
        Self::ApprovalRequested,
        Self::ApprovalVoted,
        Self::ApprovalDecided,
        Self::ApprovalReminder,
        Self::ApprovalTimedOut,
        Self::ApprovalInvalidated,
        Self::WaitRequested,
        Self::WaitCompleted,
        Self::WaitTimedOut,
        Self::ConnectionNeedsReconnect,
        Self::McpToolChanged,
        Self::McpToolAccepted,
    ];

    /// The stored and delivered name, e.g. `tool_call.in_doubt`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RunQueued => "run.queued",
            Self::RunStarted => "run.started",
            Self::RunPaused => "run.paused",
            Self::RunSucceeded => "run.succeeded",
            Self::RunFailed => "run.failed",
            Self::RunCancelled => "run.cancelled",
            Self::RunCancelRequested => "run.cancel_requested",
            Self::RunRedriven => "run.redriven",
            Self::StepStarted => "step.started",
            Self::StepSucceeded => "step.succeeded",
            Self::StepFailed => "step.failed",
            Self::StepRetryScheduled => "step.retry_scheduled",
            Self::ToolCallInDoubt => "tool_call.in_doubt",
            Self::ToolCallResolved => "tool_call.resolved",
            Self::ToolCallProbed => "tool_call.probed",
            Self::ToolCallNeedsOperator => "tool_call.needs_operator",
            Self::ToolCallSlotReleased => "tool_call.slot_released",
            Self::ToolCallTaskStarted => "tool_call.task_started",
            Self::ToolCallElicited => "tool_call.elicited",
            Self::ApprovalRequested => "approval.requested",
            Self::ApprovalVoted => "approval.voted",
            Self::ApprovalDecided => "approval.decided",
            Self::ApprovalReminder => "approval.reminder",
            Self::ApprovalTimedOut => "approval.timed_out",
            Self::ApprovalInvalidated => "approval.invalidated",
            Self::WaitRequested => "wait.requested",
            Self::WaitCompleted => "wait.completed",
            Self::WaitTimedOut => "wait.timed_out",
            Self::ConnectionNeedsReconnect => "connection.needs_reconnect",
            Self::McpToolChanged => "mcp.tool_changed",
            Self::McpToolAccepted => "mcp.tool_accepted",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<EventType> {
        Self::ALL.iter().copied().find(|t| t.as_str() == s)
    }
}

/// An event as stored in the outbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Delivery order within the database.
    pub seq: i64,
    /// `evt_<ULID>`: what consumers dedupe on.
    pub id: String,
    /// Type.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// When the state change happened (the `now` of the method that made it).
    pub time: Timestamp,
    /// Run id.
    pub run_id: Option<String>,
    /// Step id.
    pub step_id: Option<String>,
    /// Tool call id.
    pub tool_call_id: Option<String>,
    /// Details (no secret values).
    pub payload: Value,
}

/// Which events [`crate::Ledger::list_events`] returns (oldest first).
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Only events of this run.
    pub run_id: Option<String>,
    /// Only events with `seq` greater than this (a consumer checkpoint).
    pub after_seq: Option<i64>,
    /// At most this many (0 = 1000).
    pub limit: u32,
}

/// An event about to be written.
pub(crate) struct NewEvent<'a> {
    pub(crate) event_type: EventType,
    pub(crate) run_id: &'a str,
    pub(crate) step_id: Option<&'a str>,
    pub(crate) tool_call_id: Option<&'a str>,
    pub(crate) payload: Value,
}

impl<'a> NewEvent<'a> {
    pub(crate) fn run(event_type: EventType, run_id: &'a str, payload: Value) -> Self {
        Self {
            event_type,
            run_id,
            step_id: None,
            tool_call_id: None,
            payload,
        }
    }
}

/// `payload` with the actor's `by` and `reason` added (unchanged without an actor).
pub(crate) fn audited(mut payload: Value, actor: Option<&crate::model::Actor>) -> Value {
    if let (Some(actor), Value::Object(map)) = (actor, &mut payload) {
        map.insert("by".into(), Value::String(actor.by.clone()));
        map.insert(
            "reason".into(),
            actor.reason.clone().map_or(Value::Null, Value::String),
        );
    }
    payload
}

/// The node an event is about: its run, its step, and the node (stored in the event's
/// `tool_call_id`, the name a call's id has in the outbox). Three strings by name, so
/// they cannot be passed in the wrong order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeRef<'a> {
    pub(crate) run_id: &'a str,
    pub(crate) step_id: &'a str,
    pub(crate) node_id: &'a str,
}

/// An event about one node of a run (`ids` = run, step, node): what approvals and
/// waits emit.
pub(crate) async fn node_event(
    c: &mut Conn<'_>,
    s: &Scope,
    ids: NodeRef<'_>,
    event_type: EventType,
    payload: Value,
    now: Timestamp,
) -> Result<(), Error> {
    let NodeRef {
        run_id,
        step_id,
        node_id,
    } = ids;
    emit(
        c,
        s,
        now,
        NewEvent {
            event_type,
            run_id,
            step_id: Some(step_id),
            tool_call_id: Some(node_id),
            payload,
        },
    )
    .await
}

/// Inserts one event about no run (a connection's) in the caller's transaction.
pub(crate) async fn emit_unscoped(
    conn: &mut Conn<'_>,
    scope: &Scope,
    now: Timestamp,
    event_type: EventType,
    payload: Value,
) -> Result<(), Error> {
    let row = OutboxRow {
        event_type,
        run_id: None,
        step_id: None,
        tool_call_id: None,
        payload,
    };
    insert(conn, scope, now, row).await
}

/// Inserts one event in the caller's transaction.
pub(crate) async fn emit(
    conn: &mut Conn<'_>,
    scope: &Scope,
    now: Timestamp,
    ev: NewEvent<'_>,
) -> Result<(), Error> {
    let row = OutboxRow {
        event_type: ev.event_type,
        run_id: Some(ev.run_id),
        step_id: ev.step_id,
        tool_call_id: ev.tool_call_id,
        payload: ev.payload,
    };
    insert(conn, scope, now, row).await
}

/// One outbox row: its type, the run, step and call it is about (none for a
/// connection's), and its payload.
struct OutboxRow<'a> {
    event_type: EventType,
    run_id: Option<&'a str>,
    step_id: Option<&'a str>,
    tool_call_id: Option<&'a str>,
    payload: Value,
}

/// The ULIDs of this process's event ids, in creation order: event ids order the
/// outbox for consumers (deliveries are leased in id order), and two ids made in one
/// millisecond by `Ulid::generate` would sort at random.
static EVENT_IDS: std::sync::Mutex<ulid::Generator> = std::sync::Mutex::new(ulid::Generator::new());

/// A new event id (`evt_<ULID>`), greater than every one this process made before.
pub(crate) fn new_event_id() -> String {
    let mut ids = EVENT_IDS.lock().unwrap_or_else(|e| e.into_inner());
    let id = match ids.generate() {
        Ok(id) => id,
        // 2^80 ids in one millisecond: never in practice; order then by chance.
        Err(_) => ulid::Ulid::generate(),
    };
    format!("evt_{id}")
}

async fn insert(
    conn: &mut Conn<'_>,
    scope: &Scope,
    now: Timestamp,
    row: OutboxRow<'_>,
) -> Result<(), Error> {
    let OutboxRow {
        event_type,
        run_id,
        step_id,
        tool_call_id,
        payload,
    } = row;
    let id = new_event_id();
    let sql = conn.pick(
        "INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id, tool_call_id, payload)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        // The transaction id orders events for consumers (see migration 0002).
        "INSERT INTO outbox (tenant, workspace, id, type, time, run_id, step_id, tool_call_id, payload, txid)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, pg_current_xact_id()::text::bigint)",
    );
    conn.execute(
        sql,
        args![
            &scope.tenant,
            &scope.workspace,
            id,
            event_type.as_str(),
            now,
            run_id,
            step_id,
            tool_call_id,
            payload.to_string(),
        ],
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::new_event_id;

    #[test]
    fn event_ids_made_in_one_millisecond_keep_their_order() {
        // Thousands of ids fall in each millisecond here: plain ULIDs would sort at
        // random within it.
        let ids: Vec<String> = (0..5_000).map(|_| new_event_id()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids out of order");
    }
}
