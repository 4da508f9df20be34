//! The contract between the engine and every adapter.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::Value;

use crate::{Error, Fence};

/// A boxed, sendable future, so that [`Tool`] stays dyn-compatible (the engine holds
/// `Box<dyn Tool>` built from a workflow's tool spec).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What an adapter reports while a call is under way, before its outcome: facts the
/// engine records on the call the moment they happen.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// The downstream started a remote task for the call (an MCP task id,
    /// `resultType: "task"`); the adapter goes on waiting for it. Recorded durably, so
    /// that after a crash or a timeout the call is collected by that id instead of
    /// being in doubt.
    Task(String),
    /// The server asked for input mid-call (MCP elicitation) and the tool's policy
    /// answered: `{message, requested, action, content, decided_by, why}`. Values are
    /// as sent; the engine scrubs secrets before it stores them.
    Elicited(Value),
}

/// Where an adapter sends its [`Report`]s for one call.
#[derive(Debug, Clone)]
pub struct Reports(tokio::sync::mpsc::UnboundedSender<Report>);

impl Reports {
    /// A sink and the receiver the engine reads reports from.
    pub fn channel() -> (Reports, tokio::sync::mpsc::UnboundedReceiver<Report>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Reports(tx), rx)
    }

    /// Sends `report`. A receiver that is gone is not the adapter's problem: the call
    /// goes on either way.
    pub fn send(&self, report: Report) {
        let _ = self.0.send(report);
    }
}

impl PartialEq for Reports {
    fn eq(&self, other: &Self) -> bool {
        self.0.same_channel(&other.0)
    }
}

/// One call of a tool, fully rendered: the engine has already substituted every
/// `${{ }}` expression and secret, so adapters never see templates.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The node's rendered `with`.
    pub args: Value,
    /// The key of this effect attempt (`<base>:<attempt>`), sent as `Idempotency-Key`
    /// by HTTP tools so a deduplicating downstream can recognise a re-send.
    pub idempotency_key: String,
    /// Per-attempt timeout. Always set: no request leaves without one.
    pub timeout: Duration,
    /// Where to send what happens during the call (`None`: nobody records it; a
    /// remote task is then waited for all the same).
    pub reports: Option<Reports>,
    /// The W3C trace context of the call (its CLIENT span, or the one stored with the
    /// call's first outbound mark on a re-send): each adapter carries it the way its
    /// downstream reads it. Never part of the request's digest.
    pub trace: Option<TraceContext>,
    /// Until when a request of this call may still leave the process (the engine's
    /// leases by this process's monotonic clock): every adapter checks it immediately
    /// before a request, a reconnect or a re-send is handed to the transport, and a
    /// request not yet answered is given up when it closes (see [`crate::Fence`]).
    pub fence: Fence,
}

/// A W3C trace context (`traceparent` and `tracestate`), as text: adapters pass it on
/// without knowing OpenTelemetry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `00-<trace id>-<span id>-<flags>`.
    pub parent: String,
    /// Vendor state, when the trace has any.
    pub state: Option<String>,
}

impl Call {
    /// A call with these arguments, key and per-attempt timeout.
    pub fn new(args: Value, idempotency_key: impl Into<String>, timeout: Duration) -> Self {
        Call {
            args,
            idempotency_key: idempotency_key.into(),
            timeout,
            reports: None,
            trace: None,
            fence: Fence::open(),
        }
    }

    /// The same call, sent only while `fence` is open.
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    /// The same call, carrying `trace` to the downstream.
    pub fn with_trace(mut self, trace: Option<TraceContext>) -> Self {
        self.trace = trace;
        self
    }

    /// The same call, sending its reports to `reports`.
    pub fn with_reports(mut self, reports: Reports) -> Self {
        self.reports = Some(reports);
        self
    }
}

/// What a call produced, and how many requests it sent to get there.
///
/// `requests_sent` is what the ledger's `outbound_requests` and the usage rows count
/// (and rate limits and quotas): requests that actually left the process, including the MCP re-auth
/// re-send and excluding an HTTP connect attempt that was refused.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The tool's JSON output, or the classified failure.
    pub result: Result<Value, Error>,
    /// Requests that left the process during this call.
    pub requests_sent: u32,
    /// A remote task still working when the call returned (its time ran out, or the
    /// connection to it was lost while it worked): the result is then an `Unknown`
    /// error, and the task is what [`Tool::collect`] asks about later.
    pub task: Option<String>,
    /// The MCP session the call went over (Streamable HTTP's `Mcp-Session-Id`), for the
    /// call's trace (`mcp.session.id`); `None` for other tools and stdio servers.
    pub mcp_session: Option<String>,
    /// The status of the HTTP answer the outcome was read from (the last hop's), for the
    /// call's trace (`http.response.status_code`); `None` when no answer came.
    pub http_status: Option<u16>,
}

impl Outcome {
    /// A successful outcome.
    pub fn ok(value: Value, requests_sent: u32) -> Self {
        Outcome {
            result: Ok(value),
            requests_sent,
            task: None,
            mcp_session: None,
            http_status: None,
        }
    }

    /// A failed outcome.
    pub fn err(error: Error, requests_sent: u32) -> Self {
        Outcome {
            result: Err(error),
            requests_sent,
            task: None,
            mcp_session: None,
            http_status: None,
        }
    }

    /// A call whose remote task `task` was still working when it returned.
    pub fn task_working(task: &str, message: impl Into<String>, requests_sent: u32) -> Self {
        Outcome {
            result: Err(Error::unknown(message)),
            requests_sent,
            task: Some(task.to_owned()),
            mcp_session: None,
            http_status: None,
        }
    }
}

/// How safe it is to repeat a tool's call whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SideEffect {
    /// Repeating may repeat the effect: an unknown outcome goes `in_doubt`. (Named for
    /// what it is, not "no side-effect guarantee": it is the class that *has* effects.)
    NotIdempotent,
    /// The downstream deduplicates on the `Idempotency-Key`: re-send with the same key.
    IdempotentHeader,
    /// Reading only (GET, MCP `readOnlyHint`/`idempotentHint`, pure functions):
    /// re-sending is harmless.
    ReadOnly,
}

/// One callable tool, built per call by the engine from a rendered spec plus a shared
/// client or pool. Implementations classify every failure; none turns an error into a
/// success value.
pub trait Tool: Send + Sync {
    /// Performs the call under `call.timeout`.
    fn call(&self, call: Call) -> BoxFuture<'_, Outcome>;

    /// The side-effect class, which decides how an unknown outcome is resolved.
    fn side_effect(&self) -> SideEffect;

    /// Asks for the outcome of remote task `task_id`, which an earlier call of this
    /// tool started (and the engine recorded from its [`Report::Task`]), under `call.timeout`
    /// and without calling the tool again. Tools that never start remote tasks keep
    /// this default: the outcome is unknown.
    fn collect(&self, call: Call, task_id: &str) -> BoxFuture<'_, Outcome> {
        let _ = call;
        let message = format!("this tool cannot collect remote task {task_id}");
        Box::pin(std::future::ready(Outcome::err(Error::unknown(message), 0)))
    }
}
