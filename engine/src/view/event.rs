//! An outbox event as the API's feed shows it (`GET /api/v1/events`, the stream).

use flow_ledger::{Event, EventType};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value as Json;

use flow_ledger::Timestamp;

/// One event of the outbox, in commit order.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EventView {
    /// Its place in the feed: pass the last one back as `after` (or `Last-Event-ID`).
    pub seq: i64,
    /// Its id (a ULID): what consumers deduplicate by.
    pub id: String,
    /// What happened.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// When.
    pub time: Timestamp,
    /// The run it concerns.
    pub run: Option<String>,
    /// The step it concerns.
    pub step: Option<String>,
    /// The node (tool call) it concerns.
    pub node: Option<String>,
    /// The event's own fields (secrets are names, never values).
    pub payload: Json,
}

impl EventView {
    /// The view of `e`.
    pub fn of(e: &Event) -> EventView {
        EventView {
            seq: e.seq,
            id: e.id.clone(),
            event_type: e.event_type,
            time: e.time,
            run: e.run_id.clone(),
            step: e.step_id.clone(),
            node: e.tool_call_id.clone(),
            payload: e.payload.clone(),
        }
    }
}
