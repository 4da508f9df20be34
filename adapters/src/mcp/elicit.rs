//! The client side of MCP elicitation: a server asking, mid-call, for input from "the
//! user". flow runs unattended, so a tool's declared [`Elicitation`] policy answers in
//! the user's place. Every question and answer is logged (target `flow_adapters::mcp`,
//! `info`) with the message, the decision and the field names — never the values — and
//! reported to the call that was asked ([`Report::Elicited`]), which the engine records
//! on the call with secrets scrubbed.
//!
//! Which call was asked: over streamable HTTP the request arrives on the response
//! stream of that call's POST (rmcp's `InboundStreamOrigin`); over stdio, where streams
//! are not separated, it is the session's only call in flight. When neither tells (two
//! calls in flight on one stdio session), the question is answered and logged but
//! recorded on no call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::ErrorData as McpError;
use rmcp::handler::client::ClientHandler;
use rmcp::model::{
    ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationCapability, ExtensionCapabilities, FormElicitationCapability, Implementation,
    JsonObject, RequestId, TASKS_EXTENSION_ID,
};
use rmcp::service::{InboundStreamOrigin, RequestContext, RoleClient};
use serde_json::{Value, json};

use super::version::Handshake;
use crate::{Report, Reports};

/// How flow answers a server's `elicitation/create` for one tool. Unattended runs have
/// no user to ask, so the workflow decides in advance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum Elicitation {
    /// Answer `decline`: the server's own no-input path (the default).
    #[default]
    Decline,
    /// Answer `accept` with the defaults of the requested schema; `decline` when a
    /// required field has no default.
    AcceptDefaults,
    /// Answer `accept` with these values, when they fit the requested schema (known
    /// property names, matching types, every required field present); else `decline`.
    Accept(JsonObject),
}

impl Elicitation {
    /// The policy's name in logs and messages.
    pub fn name(&self) -> &'static str {
        match self {
            Elicitation::Decline => "decline",
            Elicitation::AcceptDefaults => "accept_defaults",
            Elicitation::Accept(_) => "accept",
        }
    }

    /// The answer to a form request for `schema` (a JSON Schema object with primitive
    /// `properties`), and why, for the log.
    pub(crate) fn answer(&self, schema: &Value) -> (ElicitResult, String) {
        let properties = schema.get("properties").and_then(Value::as_object);
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let content = match self {
            Elicitation::Decline => Err("the policy is decline".to_string()),
            Elicitation::AcceptDefaults => defaults(properties, &required),
            Elicitation::Accept(values) => {
                fits(values, properties, &required).map(|()| values.clone())
            }
        };
        match content {
            Ok(content) => {
                let fields: Vec<&str> = content.keys().map(String::as_str).collect();
                let why = format!("accepted with fields [{}]", fields.join(", "));
                let mut result = ElicitResult::new(ElicitationAction::Accept);
                result.content = Some(Value::Object(content));
                (result, why)
            }
            Err(why) => (
                ElicitResult::new(ElicitationAction::Decline),
                format!("declined: {why}"),
            ),
        }
    }
}

/// The schema's defaults, or why they do not cover every required field.
fn defaults(properties: Option<&JsonObject>, required: &[&str]) -> Result<JsonObject, String> {
    let mut content = JsonObject::new();
    for (name, property) in properties.into_iter().flatten() {
        if let Some(default) = property.get("default") {
            content.insert(name.clone(), default.clone());
        }
    }
    match required.iter().find(|r| !content.contains_key(**r)) {
        Some(missing) => Err(format!("required field `{missing}` has no default")),
        None => Ok(content),
    }
}

/// Whether `values` answer the schema: every name a property, every type right, every
/// required field given.
fn fits(
    values: &JsonObject,
    properties: Option<&JsonObject>,
    required: &[&str],
) -> Result<(), String> {
    for (name, value) in values {
        let Some(property) = properties.and_then(|p| p.get(name)) else {
            return Err(format!("the server did not ask for `{name}`"));
        };
        let wanted = property.get("type").and_then(Value::as_str).unwrap_or("");
        let matches = match wanted {
            "string" => value.is_string(),
            "number" => value.is_number(),
            "integer" => value.is_i64() || value.is_u64(),
            "boolean" => value.is_boolean(),
            // Unknown or absent type: nothing to check against.
            _ => true,
        };
        if !matches {
            return Err(format!("`{name}` should be a {wanted}"));
        }
    }
    match required.iter().find(|r| !values.contains_key(**r)) {
        Some(missing) => Err(format!(
            "required field `{missing}` is not among the values"
        )),
        None => Ok(()),
    }
}

/// The calls of one session waiting for their answer, by JSON-RPC request id, with
/// where each one's reports go: what an elicitation is attributed to.
#[derive(Clone, Default)]
pub(super) struct Inflight(Arc<Mutex<HashMap<RequestId, Option<Reports>>>>);

/// Removes its call from [`Inflight`] when the call's wait ends, however it ends.
pub(super) struct InflightGuard {
    calls: Inflight,
    id: RequestId,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.calls.lock().remove(&self.id);
    }
}

impl InflightGuard {
    /// The call's JSON-RPC id, known once its request is written: its entry moves there
    /// from the provisional id it was registered under ([`Inflight::enter_pending`]).
    pub(super) fn rekey(&mut self, id: RequestId) {
        let mut calls = self.calls.lock();
        if let Some(reports) = calls.remove(&self.id) {
            calls.insert(id.clone(), reports);
        }
        self.id = id;
    }
}

impl Inflight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RequestId, Option<Reports>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers call `id` (reporting to `reports`) until the guard drops.
    pub(super) fn enter(&self, id: RequestId, reports: Option<Reports>) -> InflightGuard {
        self.lock().insert(id.clone(), reports);
        InflightGuard {
            calls: self.clone(),
            id,
        }
    }

    /// Registers a call before its request is written, under a provisional id (the
    /// session assigns the real one as it writes): a server may ask its question before
    /// the write returns, and the question must find the call in flight then — over
    /// stdio, registered only after the write, a fast server's elicitation found no call
    /// and was recorded on none. [`InflightGuard::rekey`] moves it to the real id.
    pub(super) fn enter_pending(&self, reports: Option<Reports>) -> InflightGuard {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = RequestId::String(format!("flow-pending-{n}").into());
        self.enter(id, reports)
    }

    /// Where a request that arrived for `origin` (if the transport knows) reports:
    /// that call, else the only call in flight; `Err` when it cannot be told.
    fn reports_for(&self, origin: Option<&RequestId>) -> Result<Option<Reports>, usize> {
        let calls = self.lock();
        if let Some(reports) = origin.and_then(|id| calls.get(id)) {
            return Ok(reports.clone());
        }
        match calls.len() {
            1 => Ok(calls.values().next().cloned().flatten()),
            n => Err(n),
        }
    }
}

/// What one elicitation came to, as recorded on the call.
pub(super) fn record(
    message: &str,
    requested: &Value,
    policy: &Elicitation,
    result: &ElicitResult,
    why: &str,
) -> Value {
    let action = match result.action {
        ElicitationAction::Accept => "accept",
        ElicitationAction::Decline => "decline",
        _ => "cancel",
    };
    json!({
        "message": message,
        "requested": requested,
        "action": action,
        "content": result.content,
        "decided_by": format!("policy {}", policy.name()),
        "why": why,
    })
}

/// The rmcp client handler of one session: flow's client info (with the elicitation
/// capability), the policy that answers elicitation requests, and the calls in flight
/// they are recorded on.
pub(super) struct Handler {
    info: ClientConfig,
    policy: Elicitation,
    label: String,
    inflight: Inflight,
}

impl Handler {
    /// The handler for a session started with `handshake`, answering with `policy`.
    pub(super) fn new(handshake: Handshake, policy: &Elicitation, label: &str) -> Self {
        let mut capabilities = ClientCapabilities::default();
        // The tasks extension (`task.rs`): a server may answer a call with a task.
        let mut extensions = ExtensionCapabilities::new();
        extensions.insert(TASKS_EXTENSION_ID.to_string(), JsonObject::new());
        capabilities.extensions = Some(extensions);
        capabilities.elicitation =
            Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
        let info = ClientConfig::new(
            capabilities,
            Implementation::new("flow", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(handshake.requested());
        Handler {
            info,
            policy: policy.clone(),
            label: label.to_string(),
            inflight: Inflight::default(),
        }
    }

    /// The calls in flight on this handler's session.
    pub(super) fn inflight(&self) -> &Inflight {
        &self.inflight
    }
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, McpError> {
        let origin = match context.extensions.get::<InboundStreamOrigin>() {
            Some(InboundStreamOrigin::OutboundRequest(id)) => Some(id.clone()),
            _ => None,
        };
        let (message, requested, result, why) = answer_request(&self.policy, &request);
        tracing::info!(target: "flow_adapters::mcp", server = %self.label, policy = self.policy.name(), %message, "elicitation {why}");
        match self.inflight.reports_for(origin.as_ref()) {
            Ok(Some(reports)) => reports.send(Report::Elicited(record(
                &message,
                &requested,
                &self.policy,
                &result,
                &why,
            ))),
            Ok(None) => {}
            Err(n) => {
                tracing::info!(target: "flow_adapters::mcp", server = %self.label, "the elicitation is recorded on no call: {n} calls are in flight and the transport does not say which one asked");
            }
        }
        Ok(result)
    }
}

/// The policy's answer to a question that came inside a result rather than as a
/// request of its own (a task's `inputRequests`, a 2026-07-28 `input_required` round):
/// logged and reported like one (`where_` names it in the log line), as JSON.
pub(super) fn answer_inline(
    policy: &Elicitation,
    request: &ElicitRequestParams,
    reports: Option<&Reports>,
    where_: &str,
) -> Result<Value, serde_json::Error> {
    let (message, requested, result, why) = answer_request(policy, request);
    tracing::info!(target: "flow_adapters::mcp", policy = policy.name(), %message, "elicitation {where_} {why}");
    if let Some(reports) = reports {
        reports.send(Report::Elicited(record(
            &message, &requested, policy, &result, &why,
        )));
    }
    serde_json::to_value(&result)
}

/// The policy's answer to one request: its message, the requested schema, the result
/// and why.
pub(super) fn answer_request(
    policy: &Elicitation,
    request: &ElicitRequestParams,
) -> (String, Value, ElicitResult, String) {
    let (message, requested, (result, why)) = match request {
        ElicitRequestParams::FormElicitationParams {
            message,
            requested_schema,
            ..
        } => {
            let schema = serde_json::to_value(requested_schema).unwrap_or(Value::Null);
            let answer = policy.answer(&schema);
            (message.clone(), schema, answer)
        }
        ElicitRequestParams::UrlElicitationParams { message, url, .. } => (
            message.clone(),
            json!({"url": url}),
            (
                ElicitResult::new(ElicitationAction::Decline),
                "declined: URL elicitation needs a person at a browser".to_string(),
            ),
        ),
        _ => (
            String::new(),
            Value::Null,
            (
                ElicitResult::new(ElicitationAction::Decline),
                "declined: unknown elicitation mode".to_string(),
            ),
        ),
    };
    (message, requested, result, why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "name": {"type": "string", "default": "ada"},
            "age": {"type": "integer"}
        }, "required": ["name"]})
    }

    fn action(policy: &Elicitation, schema: &Value) -> (ElicitationAction, Option<Value>) {
        let (result, _) = policy.answer(schema);
        (result.action, result.content)
    }

    #[test]
    fn decline_declines() {
        assert_eq!(
            action(&Elicitation::Decline, &schema()),
            (ElicitationAction::Decline, None)
        );
    }

    #[test]
    fn accept_defaults_uses_the_defaults_and_declines_without_one_for_a_required_field() {
        assert_eq!(
            action(&Elicitation::AcceptDefaults, &schema()),
            (ElicitationAction::Accept, Some(json!({"name": "ada"})))
        );
        let strict = json!({"properties": {"age": {"type": "integer"}}, "required": ["age"]});
        assert_eq!(
            action(&Elicitation::AcceptDefaults, &strict).0,
            ElicitationAction::Decline
        );
    }

    #[test]
    fn accept_gives_fitting_values_and_declines_on_a_mismatch() {
        let values = |v: Value| Elicitation::Accept(v.as_object().cloned().unwrap_or_default());
        assert_eq!(
            action(&values(json!({"name": "bob", "age": 7})), &schema()),
            (
                ElicitationAction::Accept,
                Some(json!({"name": "bob", "age": 7}))
            )
        );
        for bad in [
            json!({"name": 3}),
            json!({"nick": "b", "name": "x"}),
            json!({"age": 7}),
        ] {
            assert_eq!(
                action(&values(bad), &schema()).0,
                ElicitationAction::Decline
            );
        }
    }
}
