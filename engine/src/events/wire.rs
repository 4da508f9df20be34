//! The JSON form of an event as consumers receive it (webhook body, file line).
//!
//! ```json
//! {"id": "evt_01J…", "type": "run.paused", "time": "2026-11-30T10:42:04.123Z",
//!  "tenant": "default", "workspace": "default",
//!  "run_id": "run_01J…", "step_id": "charge", "tool_call_id": null,
//!  "payload": {"reason": "…"}}
//! ```
//! `id` is stable across re-deliveries: consumers dedupe on it. `time` is when the state
//! change happened, not when it was delivered. The outbox's `seq` is left out: it is a
//! database detail, not an order consumers could rely on (PostgreSQL transactions commit
//! out of `seq` order, and redeliveries come later).

use flow_ledger::{Event, Scope};
use serde_json::{Value, json};

/// The event as a JSON value.
pub fn to_json(event: &Event, scope: &Scope) -> Value {
    json!({
        "id": event.id,
        "type": event.event_type.as_str(),
        "time": event.time,
        "tenant": scope.tenant,
        "workspace": scope.workspace,
        "run_id": event.run_id,
        "step_id": event.step_id,
        "tool_call_id": event.tool_call_id,
        "payload": event.payload,
    })
}

/// The bytes that are sent and signed. The webhook body is produced by the same
/// `serde_json::to_vec` of the same value, so the signature covers exactly what leaves.
pub fn to_bytes(value: &Value) -> Vec<u8> {
    // Serializing a `Value` cannot fail (its keys are strings).
    serde_json::to_vec(value).unwrap_or_default()
}
