//! A run's history for its page: one line per outbox event of the run (steps started
//! and finished with their attempt and duration, calls in doubt, probes, resolutions,
//! redrives, cancels — and who did what by hand), oldest first.
//!
//! The outbox is the run's audit trail already (every state change writes its event in
//! the change's transaction), so the timeline is read from it, not kept a second time.
//! Durations come from the step rows (started → finished), which a pure call's step has
//! even when no `step.started` event was written for it.

use std::collections::HashMap;

use flow_ledger::{Event, EventType, Timestamp};
use serde::Serialize;
use serde_json::Value as Json;

use crate::duration_text::duration_ms;
use crate::view::StepView;

/// One line of the timeline.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Moment {
    /// When.
    pub(super) at: Timestamp,
    /// The event's type (`step.succeeded`, …).
    pub(super) event: &'static str,
    /// Its tone for the eye: `ok`, `bad`, `warn`, `run` or `idle` (a `st-` colour).
    pub(super) tone: &'static str,
    /// What happened, in words.
    pub(super) what: String,
    /// The node it concerns.
    pub(super) node: Option<String>,
    /// Which attempt of the node (1, 2, …), for step events.
    pub(super) attempt: Option<u64>,
    /// How long the step took, for a finished step.
    pub(super) took: Option<String>,
    /// More: an error, a reason, a probe's verdict.
    pub(super) detail: Option<String>,
    /// Who, when a person (or a probe) did it.
    pub(super) by: Option<String>,
}

fn text(p: &Json, key: &str) -> Option<String> {
    p.get(key).and_then(Json::as_str).map(str::to_string)
}

/// The words and tone of an event of `kind`, from its payload `p`.
fn describe(kind: EventType, p: &Json) -> (&'static str, String, Option<String>) {
    use EventType as E;
    let reason = text(p, "reason").or_else(|| text(p, "note"));
    match kind {
        E::RunQueued if p["requeued"] == true => ("idle", "back on the queue".into(), reason),
        E::RunQueued => ("idle", "queued".into(), reason),
        E::RunStarted => ("run", "claimed by a worker".into(), text(p, "worker")),
        E::RunPaused => ("warn", "paused".into(), reason),
        E::RunSucceeded => ("ok", "run succeeded".into(), None),
        E::RunFailed => ("bad", "run failed".into(), text(p, "error")),
        E::RunCancelled => ("bad", "run cancelled".into(), reason),
        E::RunCancelRequested => ("bad", "cancel requested".into(), reason),
        E::RunRedriven => {
            let nodes: Vec<&str> = p["nodes"]
                .as_array()
                .map(|a| a.iter().filter_map(Json::as_str).collect())
                .unwrap_or_default();
            let items = match p["items_run_again"].as_u64().unwrap_or(0) {
                0 => String::new(),
                1 => " (1 item)".to_string(),
                n => format!(" ({n} items)"),
            };
            let what = format!("redriven: {} again{items}", nodes.join(", "));
            ("run", what, reason)
        }
        E::StepStarted => ("run", "started".into(), None),
        E::StepSucceeded => ("ok", "succeeded".into(), None),
        E::StepFailed => ("bad", "failed".into(), text(p, "error")),
        E::StepRetryScheduled => {
            let when = text(p, "not_before").map(|t| format!("not before {t}"));
            ("idle", "retry scheduled".into(), when)
        }
        E::ToolCallInDoubt => ("warn", "call in doubt".into(), reason),
        E::ToolCallResolved => {
            let how = text(p, "resolution").unwrap_or_default();
            ("run", format!("resolved as {how}"), reason)
        }
        E::ToolCallProbed => {
            let seen = text(p, "observed").unwrap_or_default();
            let decided = text(p, "decision").unwrap_or_default();
            let what = format!("probed: {seen} → {decided}");
            ("idle", what, text(p, "detail"))
        }
        E::ToolCallNeedsOperator => ("warn", "needs an operator".into(), None),
        E::ToolCallSlotReleased => ("run", "concurrency slot released".into(), reason),
        E::ConnectionNeedsReconnect => (
            "bad",
            "connection needs a new sign-in".into(),
            text(p, "connection"),
        ),
        E::McpToolChanged => ("warn", "proxied tool changed".into(), text(p, "tool")),
        E::McpToolAccepted => ("ok", "proxied tool accepted".into(), text(p, "tool")),
        E::ToolCallTaskStarted => ("run", "remote task started".into(), text(p, "task_id")),
        E::ToolCallElicited => ("idle", "the server asked for input".into(), None),
        E::ApprovalRequested => ("warn", "awaiting approval".into(), text(p, "message")),
        E::ApprovalVoted => {
            let what = format!(
                "approved by {} (more needed)",
                text(p, "by").unwrap_or_default()
            );
            ("run", what, reason)
        }
        E::ApprovalDecided => {
            let by = text(p, "by").unwrap_or_default();
            match text(p, "decision").as_deref() {
                Some("deny") => ("bad", format!("denied by {by}"), reason),
                _ => ("ok", format!("approved by {by}"), reason),
            }
        }
        E::ApprovalReminder => ("warn", "approval reminder".into(), None),
        E::ApprovalTimedOut => ("bad", "approval timed out".into(), None),
        E::ApprovalInvalidated => (
            "warn",
            "approval void: the request changed".into(),
            text(p, "digest"),
        ),
        E::WaitRequested => match text(p, "event") {
            Some(name) => ("warn", format!("waiting for event {name}"), None),
            None => ("warn", "waiting for its callback".into(), None),
        },
        E::WaitCompleted => match (text(p, "event_id"), p["ok"] == false) {
            (Some(id), _) => ("ok", "event matched".into(), Some(id)),
            (None, true) => ("bad", "callback: failed".into(), text(p, "error")),
            (None, false) => ("ok", "callback came".into(), None),
        },
        E::WaitTimedOut => ("bad", "wait timed out".into(), None),
    }
}

/// The timeline of a run's `events` (oldest first), with durations from its `steps`.
pub(super) fn timeline(events: &[Event], steps: &[StepView]) -> Vec<Moment> {
    let by_step: HashMap<&str, &StepView> = steps.iter().map(|s| (s.id.as_str(), s)).collect();
    let step_of = |e: &Event| e.step_id.as_deref().and_then(|id| by_step.get(id).copied());
    events
        .iter()
        .map(|e| {
            let p = &e.payload;
            let (tone, what, detail) = describe(e.event_type, p);
            let step = step_of(e);
            let node = text(p, "node_id")
                .or_else(|| e.tool_call_id.clone())
                .or_else(|| step.map(|s| s.node.clone()));
            let is_step = e.event_type.as_str().starts_with("step.");
            let attempt = is_step
                .then(|| p["retry"].as_u64().or(step.map(|s| u64::from(s.retry))))
                .flatten()
                .map(|r| r + 1);
            let finished = matches!(
                e.event_type,
                EventType::StepSucceeded | EventType::StepFailed
            );
            let took = step
                .filter(|_| finished)
                .and_then(|s| Some((s.started_at?, s.finished_at?)))
                .map(|(a, b)| duration_ms(b.as_millis() - a.as_millis()));
            Moment {
                at: e.time,
                event: e.event_type.as_str(),
                tone,
                what,
                node,
                attempt,
                took,
                detail,
                by: text(p, "by"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use flow_ledger::StepStatus;
    use serde_json::json;

    use super::*;

    fn event(seq: i64, kind: EventType, step: Option<&str>, node: Option<&str>, p: Json) -> Event {
        Event {
            seq,
            id: format!("evt_{seq}"),
            event_type: kind,
            time: Timestamp(1_000 * seq),
            run_id: Some("r".into()),
            step_id: step.map(str::to_string),
            tool_call_id: node.map(str::to_string),
            payload: p,
        }
    }

    fn step(id: &str, node: &str, retry: u32, took_ms: i64) -> StepView {
        StepView {
            id: id.into(),
            node: node.into(),
            retry,
            status: StepStatus::Failed,
            not_before: None,
            started_at: Some(Timestamp(10_000)),
            finished_at: Some(Timestamp(10_000 + took_ms)),
            error: None,
            step_id: id.into(),
            node_id: node.into(),
        }
    }

    #[test]
    fn steps_carry_attempts_and_durations_and_people_their_names() {
        let steps = [
            step("charge", "charge", 0, 1_250),
            step("charge_retry1", "charge", 1, 40),
        ];
        let events = [
            event(
                1,
                EventType::StepStarted,
                Some("charge"),
                None,
                json!({"node_id": "charge", "retry": 0}),
            ),
            event(
                2,
                EventType::StepFailed,
                Some("charge"),
                Some("charge"),
                json!({"node_id": "charge", "retry": 0, "error": "HTTP 503"}),
            ),
            event(
                3,
                EventType::StepRetryScheduled,
                Some("charge_retry1"),
                None,
                json!({"node_id": "charge", "retry": 1}),
            ),
            event(
                4,
                EventType::ToolCallInDoubt,
                Some("charge_retry1"),
                Some("charge"),
                json!({"reason": "timed out"}),
            ),
            event(
                5,
                EventType::ToolCallProbed,
                None,
                Some("charge"),
                json!({"observed": "not_found", "decision": "resend", "by": "daemon"}),
            ),
            event(
                6,
                EventType::ToolCallResolved,
                Some("charge_retry1"),
                Some("charge"),
                json!({"resolution": "failed", "by": "otto", "note": "declined"}),
            ),
            event(
                7,
                EventType::RunRedriven,
                None,
                None,
                json!({"nodes": ["charge"], "by": "ada", "reason": "PSP fixed"}),
            ),
            event(
                8,
                EventType::RunCancelRequested,
                None,
                None,
                json!({"by": "ada", "reason": null}),
            ),
        ];
        let t = timeline(&events, &steps);
        let row = |i: usize| {
            let m = &t[i];
            (
                m.what.as_str(),
                m.node.as_deref(),
                m.attempt,
                m.took.as_deref(),
                m.by.as_deref(),
            )
        };
        assert_eq!(row(0), ("started", Some("charge"), Some(1), None, None));
        assert_eq!(
            row(1),
            ("failed", Some("charge"), Some(1), Some("1.250s"), None)
        );
        assert_eq!(t[1].detail.as_deref(), Some("HTTP 503"));
        assert_eq!((t[1].tone, t[1].event), ("bad", "step.failed"));
        assert_eq!(
            row(2),
            ("retry scheduled", Some("charge"), Some(2), None, None)
        );
        assert_eq!(t[3].detail.as_deref(), Some("timed out"));
        assert_eq!(
            row(4),
            (
                "probed: not_found → resend",
                Some("charge"),
                None,
                None,
                Some("daemon")
            )
        );
        assert_eq!(
            row(5),
            (
                "resolved as failed",
                Some("charge"),
                None,
                None,
                Some("otto")
            )
        );
        assert_eq!(t[5].detail.as_deref(), Some("declined"));
        assert_eq!(
            row(6),
            ("redriven: charge again", None, None, None, Some("ada"))
        );
        assert_eq!(t[6].detail.as_deref(), Some("PSP fixed"));
        assert_eq!(row(7), ("cancel requested", None, None, None, Some("ada")));
        assert_eq!(t.len(), events.len(), "one line per event");
    }

    #[test]
    fn a_redrive_says_how_many_items_run_again() {
        let p = json!({"nodes": ["notify"], "items_run_again": 3});
        let events = [event(1, EventType::RunRedriven, None, None, p)];
        let t = timeline(&events, &[]);
        assert_eq!(t[0].what, "redriven: notify again (3 items)");
    }
}
