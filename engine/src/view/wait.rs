//! A wait as readers see it ([`WaitView`]): `flow show`, `GET /api/v1/waits`, the run's
//! JSON.

use flow_ledger::{Timestamp, Wait, WaitKind, WaitStatus};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value as Json;

/// One node waiting (or done waiting) for an event or its callback.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct WaitView {
    /// The run.
    pub run: String,
    /// The waiting node.
    pub node: String,
    /// The step that waits.
    pub step: String,
    /// `event` (a `wait:` node) or `callback`.
    pub kind: WaitKind,
    /// Where it stands.
    pub status: WaitStatus,
    /// The event's name (event waits).
    pub event: Option<String>,
    /// The `match` expression, as written.
    #[serde(rename = "match")]
    pub matcher: Option<String>,
    /// How far before `began_at` a published event still counts, in ms.
    pub lookback_ms: i64,
    /// When it began.
    pub began_at: Timestamp,
    /// When it times out (sooner than `timeout_at` when a heartbeat is due first).
    pub deadline: Timestamp,
    /// When it times out whatever the heartbeats say.
    pub timeout_at: Timestamp,
    /// The last heartbeat (callbacks).
    pub last_heartbeat_at: Option<Timestamp>,
    /// When it ended.
    pub settled_at: Option<Timestamp>,
    /// What ended it: `event`, `callback` or `sweep` (the deadline, a finished run).
    pub settled_by: Option<String>,
    /// The event that completed it.
    pub event_id: Option<String>,
    /// The node's output: the event's data or the callback's output.
    pub output: Option<Json>,
    /// The callback's error (`ok: false`).
    pub error: Option<String>,
}

impl WaitView {
    /// The view of a stored wait.
    pub fn of(w: &Wait) -> Self {
        Self {
            run: w.run_id.clone(),
            node: w.node_id.clone(),
            step: w.step_id.clone(),
            kind: w.kind,
            status: w.status,
            event: w.event_name.clone(),
            matcher: w.matcher.clone(),
            lookback_ms: w.lookback_ms,
            began_at: w.began_at,
            deadline: w.deadline,
            timeout_at: w.hard_deadline,
            last_heartbeat_at: w.last_beat_at,
            settled_at: w.settled_at,
            settled_by: w.settled_by.clone(),
            event_id: w.event_id.clone(),
            output: w.output.clone(),
            error: w.error.clone(),
        }
    }
}
