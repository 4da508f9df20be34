//! One `tools/call` on a live session (`Session::call_tool`), and the answers to a
//! server that needs input before it acts.
//!
//! Protocol 2026-07-28 has no server-to-client requests: a server that needs input
//! answers the call with `resultType: "input_required"` (its `inputRequests`, and an
//! opaque `requestState`), and the client sends the call again with `inputResponses`
//! and the state. The server has not acted yet, so each round is a continuation of the
//! same effect attempt (counted as a request sent). [`answers`] fills the responses: an
//! elicitation gets the tool's policy (and is reported like any elicitation), `roots/list`
//! gets an empty list (flow exposes no filesystem roots), and sampling is refused — flow
//! has no model to ask — which fails the call before any effect.

use std::time::Duration;

use rmcp::ServiceError;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotification,
    CancelledNotificationParam, ClientRequest, InputRequest, InputRequiredResult, InputResponses,
    JsonObject, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RoleClient, RunningService};
use serde_json::json;
use tokio::time::Instant;

use super::elicit::{self, Elicitation, Handler};
use crate::{Error, Reports};

/// The most `input_required` rounds one call may take before it is refused.
pub(super) const MAX_INPUT_ROUNDS: u32 = 8;

/// The responses and the server's state an `input_required` round sends back.
pub(super) type Answered = (Option<InputResponses>, Option<String>);

/// The `_meta` key of the call's idempotency key: the name flow's own MCP server reads
/// (`flow mcp`), so a server that can dedupe, does. Never rename: clients hard-code it.
pub(crate) const KEY_META: &str = "io.flow/idempotency-key";

/// What goes around a call's request besides its arguments: where reports go, the
/// trace context, the fence it may leave under, and the call's idempotency key (sent
/// in `_meta`, so a server that dedupes does).
pub(super) struct Around<'a> {
    /// Where elicitations and other reports go.
    pub(super) reports: Option<&'a Reports>,
    /// The call's trace context.
    pub(super) trace: Option<&'a crate::TraceContext>,
    /// The fence the request may leave under.
    pub(super) fence: &'a crate::Fence,
    /// The effect attempt's key.
    pub(super) key: &'a str,
}

/// The `tools/call` params of one round: the arguments, the last round's answers, the
/// call's idempotency key (`_meta["io.flow/idempotency-key"]`) and trace (in
/// `_meta.traceparent` / `tracestate`, the keys MCP reserves).
pub(super) fn params(
    tool: &str,
    arguments: Option<&JsonObject>,
    (responses, state): Answered,
    trace: Option<&crate::TraceContext>,
    key: Option<&str>,
) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    if let Some(arguments) = arguments {
        params = params.with_arguments(arguments.clone());
    }
    let mut meta = rmcp::model::MetaObject::new();
    if let Some(key) = key {
        meta.insert(KEY_META.into(), serde_json::Value::String(key.to_owned()));
    }
    if let Some(trace) = trace {
        meta.set_traceparent(trace.parent.clone());
        if let Some(state) = &trace.state {
            meta.set_tracestate(state.clone());
        }
    }
    if !meta.is_empty() {
        params.meta = Some(meta.into());
    }
    params.input_responses = responses;
    params.request_state = state;
    params
}

/// What the next round of an `input_required` call carries (the responses and the
/// server's state), counting `rounds`; `Err` when flow cannot answer or the server is
/// still asking after [`MAX_INPUT_ROUNDS`].
pub(super) fn next_round(
    policy: &Elicitation,
    asked: InputRequiredResult,
    reports: Option<&Reports>,
    rounds: &mut u32,
) -> Result<Answered, String> {
    *rounds += 1;
    if *rounds > MAX_INPUT_ROUNDS {
        return Err(format!(
            "still asking for input after {MAX_INPUT_ROUNDS} rounds"
        ));
    }
    let responses = answers(policy, &asked, reports)?;
    Ok((Some(responses), asked.request_state))
}

/// The responses to a server's `inputRequests`, or why flow cannot give them.
pub(super) fn answers(
    policy: &Elicitation,
    asked: &InputRequiredResult,
    reports: Option<&Reports>,
) -> Result<InputResponses, String> {
    let mut responses = InputResponses::new();
    for (key, request) in asked.input_requests.iter().flatten() {
        let response = match request {
            InputRequest::Elicitation(request) => {
                elicit::answer_inline(policy, &request.params, reports, "(input_required)")
                    .map_err(|e| e.to_string())?
            }
            InputRequest::ListRoots(_) => json!({"roots": []}),
            InputRequest::CreateMessage(_) => {
                return Err(
                    "the server asks for sampling (an LLM completion), which flow does not provide"
                        .to_string(),
                );
            }
            _ => return Err("the server asks for an input flow does not know".to_string()),
        };
        responses.insert(key.clone(), response);
    }
    Ok(responses)
}

/// How a `tools/call` on a live session ended without a transport error.
pub(super) enum CallEnd {
    /// The server answered.
    Answered(CallToolResult),
    /// The server started a task for the call (`resultType: "task"`).
    Task(rmcp::model::Task),
    /// The server needs input before it acts (2026-07-28's multi-round-trip
    /// `input_required` result): answer and send the call again with the answers.
    InputRequired(InputRequiredResult),
    /// The deadline passed first; `cancelled` says whether `notifications/cancelled`
    /// went out. Either way the outcome is unknown: the server may have acted already.
    TimedOut { cancelled: bool },
}

/// How long sending `notifications/cancelled` may take after a timeout.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// Sends `tools/call` on `client`'s session and waits for its answer until `deadline`.
/// On timeout the request is cancelled (MCP `notifications/cancelled` with its id,
/// awaited up to [`CANCEL_GRACE`]) so the server may stop working on it.
pub(super) async fn call_tool(
    client: &RunningService<RoleClient, Handler>,
    label: &str,
    params: CallToolRequestParams,
    deadline: Instant,
    reports: Option<&Reports>,
) -> Result<CallEnd, ServiceError> {
    let peer = client.peer();
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    // Elicitation requests that arrive for this call are recorded on it: registered
    // before the request is written, since the server may ask before the write returns.
    let mut inflight = client.service().inflight().enter_pending(reports.cloned());
    let send = peer.send_request_with_option(request, PeerRequestOptions::no_options());
    let handle = match tokio::time::timeout_at(deadline, send).await {
        Ok(handle) => handle?,
        // Still writing when the time ran out: the request may have left.
        Err(_) => return Ok(CallEnd::TimedOut { cancelled: false }),
    };
    let id = handle.id.clone();
    inflight.rekey(id.clone());
    match tokio::time::timeout_at(deadline, handle.await_response()).await {
        Ok(Ok(ServerResult::CallToolResult(result))) => Ok(CallEnd::Answered(result)),
        Ok(Ok(ServerResult::CreateTaskResult(created))) => Ok(CallEnd::Task(created.task)),
        Ok(Ok(ServerResult::InputRequiredResult(asked))) => Ok(CallEnd::InputRequired(asked)),
        // `{}`: a result without content, as rmcp's own `call_tool` reads it.
        Ok(Ok(ServerResult::EmptyResult(_))) => {
            Ok(CallEnd::Answered(CallToolResult::success(Vec::new())))
        }
        Ok(Ok(_)) => Err(ServiceError::UnexpectedResponse),
        Ok(Err(error)) => Err(error),
        Err(_) => {
            let notification = CancelledNotification::new(CancelledNotificationParam::new(
                Some(id),
                Some("flow: the attempt timed out".to_string()),
            ));
            let cancel = peer.send_notification(notification.into());
            let cancelled = matches!(tokio::time::timeout(CANCEL_GRACE, cancel).await, Ok(Ok(())));
            tracing::debug!(target: "flow_adapters::mcp", server = %label, cancelled, "tools/call timed out; cancellation sent");
            Ok(CallEnd::TimedOut { cancelled })
        }
    }
}

/// A call that timed out after it was sent: unknown, saying whether the server was told.
pub(super) fn timed_out(what: &str, cancelled: bool) -> Error {
    let told = if cancelled {
        "; flow sent notifications/cancelled, but the server may have processed it already"
    } else {
        "; the server may have processed it"
    };
    Error::unknown(format!("{what}: timed out after the call was sent{told}"))
}
