//! MCP tasks (the `io.modelcontextprotocol/tasks` extension): a server may answer a
//! `tools/call` with a task handle (`resultType: "task"`) instead of the result, and the
//! client asks `tasks/get` until the task ends.
//!
//! flow declares the extension, reports the task id to the engine the moment it
//! arrives ([`Report::Task`]; the engine writes it to the ledger) and polls at the
//! server's `pollIntervalMs` (clamped to [`MIN_POLL`]..[`MAX_POLL`]) until the attempt's
//! deadline:
//!
//! | `tasks/get` says | outcome |
//! |---|---|
//! | `completed` | the task's `CallToolResult`, read as any call's result |
//! | `failed` | `Permanent`: the server reports the request failed |
//! | `cancelled` | `Unknown`: flow did not cancel it, and what it did before is unknown |
//! | `working` / `input_required` at the deadline | `Unknown` *with the task id* ([`Outcome::task`]): the engine lets the call go and collects it later, not in doubt |
//! | an error answer (the server no longer knows the task), or no way to ask | `Unknown` without a task: in doubt |
//!
//! `input_required` elicitations are answered with the tool's policy through
//! `tasks/update`, and reported like any elicitation. Other input requests (sampling,
//! roots) are left unanswered: the task waits for them until it or the attempt ends.
//! Polls are reads: they are not counted in `requests_sent`.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use rmcp::model::{
    CallToolResult, GetTaskParams, InputRequest, InputRequests, JsonObject, TaskPayload,
    UpdateTaskParams,
};
use rmcp::service::{Peer, RoleClient};
use serde_json::Value;
use tokio::time::Instant;

use super::classify;
use super::elicit::{self, Elicitation};
use crate::{Error, Outcome, Reports};

/// The shortest wait between two polls, whatever the server suggests.
pub(super) const MIN_POLL: Duration = Duration::from_millis(50);
/// The longest wait between two polls, whatever the server suggests.
pub(super) const MAX_POLL: Duration = Duration::from_secs(5);
/// The wait when the server suggests none.
const DEFAULT_POLL: Duration = Duration::from_millis(500);

/// One task being waited for.
pub(super) struct Wait<'a> {
    /// The session's peer.
    pub peer: &'a Peer<RoleClient>,
    /// The tool's elicitation policy, for `input_required`.
    pub policy: &'a Elicitation,
    /// The task id.
    pub task_id: &'a str,
    /// The server's suggested poll interval, if any.
    pub poll_ms: Option<u64>,
    /// When the attempt ends.
    pub deadline: Instant,
    /// "MCP server … tool `…`", for messages.
    pub what: &'a str,
    /// Where elicitations are reported.
    pub reports: Option<&'a Reports>,
    /// Requests of the call so far (the `tools/call` that started the task).
    pub sent: u32,
}

/// How waiting ended: the outcome, and whether the session should be replaced (its
/// transport failed while asking).
pub(super) struct Ended {
    pub outcome: Outcome,
    pub discard: bool,
}

fn interval(poll_ms: Option<u64>) -> Duration {
    poll_ms
        .map_or(DEFAULT_POLL, Duration::from_millis)
        .clamp(MIN_POLL, MAX_POLL)
}

/// Polls `tasks/get` until the task ends or the deadline passes.
pub(super) async fn wait(w: Wait<'_>) -> Ended {
    let Wait {
        peer,
        policy,
        task_id,
        poll_ms,
        deadline,
        what,
        reports,
        sent,
    } = w;
    let mut every = interval(poll_ms);
    let mut answered: HashSet<String> = HashSet::new();
    let still_working = || {
        let message = format!(
            "{what}: task {task_id} was still working when the attempt's time ran out; flow asks for its result again"
        );
        Outcome::task_working(task_id, message, sent)
    };
    loop {
        let asked_at = Instant::now();
        if asked_at >= deadline {
            return done(still_working());
        }
        let ask = peer.get_task(GetTaskParams::new(task_id));
        let got = match tokio::time::timeout_at(deadline, ask).await {
            Err(_) => return done(still_working()),
            Ok(Ok(got)) => got,
            Ok(Err(error)) => {
                let failure = classify::request_error(&error, what);
                let message = format!(
                    "{what}: could not learn how task {task_id} ended: {}",
                    failure.error.message
                );
                return Ended {
                    outcome: Outcome::err(Error::unknown(message), sent),
                    discard: failure.discard,
                };
            }
        };
        if let Some(ms) = got.task.task.poll_interval_ms {
            every = interval(Some(ms));
        }
        tracing::debug!(target: "flow_adapters::mcp", task = task_id, status = ?got.task.status(), "tasks/get");
        match got.task.payload {
            TaskPayload::Completed { result } => return done(completed(result, what, sent)),
            TaskPayload::Failed { error } => {
                let message = format!("{what}: task {task_id} failed: {}", error_text(&error));
                return done(Outcome::err(Error::permanent(message), sent));
            }
            TaskPayload::Cancelled => {
                let message = format!(
                    "{what}: the server reports task {task_id} cancelled; flow did not cancel it, and whether it took effect is unknown"
                );
                return done(Outcome::err(Error::unknown(message), sent));
            }
            TaskPayload::InputRequired { input_requests } => {
                answer_inputs(
                    peer,
                    policy,
                    task_id,
                    &input_requests,
                    &mut answered,
                    reports,
                )
                .await;
            }
            _ => {}
        }
        let next = (asked_at + every).min(deadline);
        tokio::time::sleep_until(next).await;
    }
}

fn done(outcome: Outcome) -> Ended {
    Ended {
        outcome,
        discard: false,
    }
}

/// A completed task's result, read as the `tools/call` result it stands for.
fn completed(result: JsonObject, what: &str, sent: u32) -> Outcome {
    match serde_json::from_value::<CallToolResult>(Value::Object(result)) {
        Ok(result) => Outcome {
            result: classify::output(result, what),
            requests_sent: sent,
            task: None,
            mcp_session: None,
            http_status: None,
        },
        Err(e) => Outcome::err(
            Error::permanent(format!(
                "{what}: the task completed with a result that is not a tool result: {e}"
            )),
            sent,
        ),
    }
}

/// The `message` of a JSON-RPC error object, with its code.
fn error_text(error: &JsonObject) -> String {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("no message");
    match error.get("code").and_then(Value::as_i64) {
        Some(code) => format!("{message} (code {code})"),
        None => message.to_string(),
    }
}

/// Answers the task's new elicitation requests with the tool's policy, in one
/// `tasks/update`. A failed update is logged: the next poll shows the task still
/// asking, and the request is not answered twice.
async fn answer_inputs(
    peer: &Peer<RoleClient>,
    policy: &Elicitation,
    task_id: &str,
    requests: &InputRequests,
    answered: &mut HashSet<String>,
    reports: Option<&Reports>,
) {
    let mut responses = BTreeMap::new();
    for (key, request) in requests {
        if answered.contains(key) {
            continue;
        }
        let InputRequest::Elicitation(request) = request else {
            continue;
        };
        let where_ = format!("in task {task_id}");
        match elicit::answer_inline(policy, &request.params, reports, &where_) {
            Ok(value) => {
                responses.insert(key.clone(), value);
                answered.insert(key.clone());
            }
            Err(e) => {
                tracing::warn!(target: "flow_adapters::mcp", task = task_id, error = %e, "cannot encode an elicitation answer");
            }
        }
    }
    if responses.is_empty() {
        return;
    }
    if let Err(e) = peer
        .update_task(UpdateTaskParams::new(task_id, responses))
        .await
    {
        tracing::warn!(target: "flow_adapters::mcp", task = task_id, error = %e, "tasks/update failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poll_interval_is_clamped() {
        assert_eq!(interval(None), DEFAULT_POLL);
        assert_eq!(interval(Some(0)), MIN_POLL);
        assert_eq!(interval(Some(120)), Duration::from_millis(120));
        assert_eq!(interval(Some(3_600_000)), MAX_POLL);
    }

    #[test]
    fn error_text_names_message_and_code() {
        let e = serde_json::json!({"code": -32603, "message": "boom"});
        let e = e.as_object().cloned().unwrap_or_default();
        assert_eq!(error_text(&e), "boom (code -32603)");
        assert_eq!(error_text(&JsonObject::new()), "no message");
    }
}
