//! A row of the In doubt worklist ([`InboxRow`]): one call in doubt with what an
//! operator needs to decide about it at a glance — its run and workflow, node, tool,
//! key, since when and why it is in doubt, and what the last probe made of it.
//!
//! Built from a page of calls and three reads that answer for the whole page at once
//! (`Ledger::run_names`, `Ledger::last_probes`, `Ledger::last_events` for the
//! `tool_call.in_doubt` that says why), never one query per call: the inbox must stay
//! quick with a thousand calls in doubt.

use std::collections::HashMap;

use flow_ledger::inbox::{InboxFilter, LastProbe, RunName};
use flow_ledger::{Event, EventType, Ledger, ProbeDecision, ProbeObserved, Timestamp, ToolCall};
use schemars::JsonSchema;
use serde::Serialize;

use super::CallView;

/// What the last probe of a call found and what flow did with it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ProbeVerdict {
    /// Its number among the call's probes (1, 2, …).
    pub probe: u32,
    /// When.
    pub at: Timestamp,
    /// What the answer said about the effect attempt.
    pub observed: ProbeObserved,
    /// What flow decided.
    pub decision: ProbeDecision,
}

/// One call in doubt as the worklist shows it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct InboxRow {
    /// The run.
    pub run: String,
    /// The run's workflow (`name:`; empty if the run could not be read).
    pub workflow: String,
    /// The run whose sub-workflow node started this one (it waits on it): resolving the
    /// call lets both go on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_run: Option<String>,
    /// The node whose call is in doubt.
    pub node: String,
    /// The tool.
    pub tool: String,
    /// The idempotency key of the current attempt: what to look up downstream.
    pub key: String,
    /// When it became in doubt.
    pub in_doubt_at: Option<Timestamp>,
    /// Why the outcome is unknown.
    pub why: String,
    /// The last probe's verdict (`null`: never probed).
    pub last_probe: Option<ProbeVerdict>,
    /// The call whole (its request as stored, attempts, requests sent), for the row's
    /// detail.
    pub call: CallView,
}

impl InboxRow {
    /// The rows of `calls`, in their order, with the workflow names of `runs`, the last
    /// probes of `probes` and the reasons of `doubts` (each call's last
    /// `tool_call.in_doubt` event), each matched by run and node; missing ones stay
    /// empty (a call without its event gets the reason `CallView` falls back to).
    pub fn build(
        calls: &[ToolCall],
        runs: &[RunName],
        probes: &[LastProbe],
        doubts: &[Event],
    ) -> Vec<InboxRow> {
        let names: HashMap<&str, &RunName> = runs.iter().map(|r| (r.id.as_str(), r)).collect();
        let last: HashMap<(&str, &str), &LastProbe> = probes
            .iter()
            .map(|p| ((p.run_id.as_str(), p.probe.tool_call_id.as_str()), p))
            .collect();
        calls
            .iter()
            .zip(CallView::in_doubt(calls, doubts))
            .map(|(c, call)| {
                let key = (c.run_id.as_str(), c.tool_call_id.as_str());
                InboxRow {
                    run: c.run_id.clone(),
                    workflow: names
                        .get(c.run_id.as_str())
                        .map_or_else(String::new, |r| r.workflow.clone()),
                    parent_run: names.get(c.run_id.as_str()).and_then(|r| r.parent.clone()),
                    node: c.tool_call_id.clone(),
                    tool: c.tool.clone(),
                    key: c.current_key.clone(),
                    in_doubt_at: c.in_doubt_at,
                    why: call.in_doubt_reason.clone().unwrap_or_default(),
                    last_probe: last.get(&key).map(|p| ProbeVerdict {
                        probe: p.probe.probe,
                        at: p.probe.probed_at,
                        observed: p.probe.observed,
                        decision: p.probe.decision,
                    }),
                    call,
                }
            })
            .collect()
    }

    /// The rows `filter` matches, oldest first: four statements whatever their number
    /// (the calls, their runs' names, their last probes, why each is in doubt).
    pub async fn load(
        ledger: &Ledger,
        filter: InboxFilter,
    ) -> Result<Vec<InboxRow>, flow_ledger::Error> {
        let calls = ledger.in_doubt_inbox(filter).await?;
        let runs: Vec<String> = calls.iter().map(|c| c.run_id.clone()).collect();
        let pairs: Vec<(String, String)> = calls
            .iter()
            .map(|c| (c.run_id.clone(), c.tool_call_id.clone()))
            .collect();
        let names = ledger.run_names(&runs).await?;
        let probes = ledger.last_probes(&pairs).await?;
        let doubts = doubt_events(ledger, &calls).await?;
        Ok(Self::build(&calls, &names, &probes, &doubts))
    }
}

/// The last `tool_call.in_doubt` event of each of `calls` that has one (what says why
/// it is in doubt): one statement for any number of calls, so a page of a thousand
/// calls costs one read, not a thousand.
pub async fn doubt_events(
    ledger: &Ledger,
    calls: &[ToolCall],
) -> Result<Vec<Event>, flow_ledger::Error> {
    let pairs: Vec<(String, String)> = calls
        .iter()
        .map(|c| (c.run_id.clone(), c.tool_call_id.clone()))
        .collect();
    ledger.last_events(&pairs, EventType::ToolCallInDoubt).await
}

impl CallView {
    /// The views of `calls`, in their order, each with the reason its own event among
    /// `doubts` (see [`doubt_events`]) gives, matched by run and node; a call without
    /// one gets the reason [`CallView::of`] falls back to. What the API's in-doubt
    /// listing and the console's worklist both show, so they say the same why.
    pub fn in_doubt(calls: &[ToolCall], doubts: &[Event]) -> Vec<CallView> {
        let why: HashMap<(&str, &str), &Event> = doubts
            .iter()
            .filter_map(|e| Some(((e.run_id.as_deref()?, e.tool_call_id.as_deref()?), e)))
            .collect();
        calls
            .iter()
            .map(|c| {
                let key = (c.run_id.as_str(), c.tool_call_id.as_str());
                let events = why.get(&key).map_or(&[][..], |e| std::slice::from_ref(*e));
                CallView::of(c, events)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use flow_ledger::{CallStatus, Probe, RunStatus};
    use serde_json::json;

    use super::*;

    fn call(run: &str, node: &str, message: Option<&str>) -> ToolCall {
        ToolCall {
            run_id: run.into(),
            tool_call_id: node.into(),
            step_id: node.into(),
            tool: "pay".into(),
            status: CallStatus::InDoubt,
            attempt_count: 1,
            outbound_requests: 1,
            idempotency_key: format!("{run}:{node}"),
            current_key: format!("{run}:{node}:1"),
            outbound_started_at: Some(Timestamp(1_000)),
            in_doubt_at: Some(Timestamp(2_000)),
            lease_holder: None,
            lease_token: 0,
            lease_expires_at: None,
            output: None,
            error_kind: None,
            error_message: message.map(str::to_string),
            resolution: None,
            resolved_by: None,
            resolved_at: None,
            resolution_note: None,
            request: json!({"amount": 10, "token": "{\"$secret\":\"PAY\"}"}),
            request_hash: String::new(),
            created_at: Timestamp(500),
            finished_at: None,
            remote_task: None,
            trace_parent: None,
            trace_state: None,
            uncounted_sends: 0,
            waiting: None,
        }
    }

    fn probe(run: &str, node: &str, n: u32, decision: ProbeDecision) -> LastProbe {
        LastProbe {
            run_id: run.into(),
            probe: Probe {
                tool_call_id: node.into(),
                probe: n,
                sent_key: format!("{run}:{node}:1"),
                probed_at: Timestamp(3_000),
                observed: ProbeObserved::Unknown,
                decision,
                http_status: Some(503),
                detail: None,
                response: None,
                next_probe_at: None,
                by: "daemon".into(),
            },
        }
    }

    #[test]
    fn rows_take_names_and_probes_by_run_and_node() {
        let calls = [
            call("r1", "charge", Some("timed out after 30s")),
            call("r2", "charge", None),
            call("r1", "ship", None),
        ];
        let runs = [RunName {
            id: "r1".into(),
            workflow: "pay".into(),
            status: RunStatus::Paused,
            parent: None,
        }];
        // A probe of r2's other node must not be taken for r2/charge.
        let probes = [
            probe("r1", "charge", 2, ProbeDecision::NeedsOperator),
            probe("r2", "ship", 1, ProbeDecision::ProbeAgain),
        ];
        // r1/ship's reason comes from its event; r2 has an event of another node only.
        let doubt = |run: &str, node: &str, reason: &str| Event {
            seq: 1,
            id: "evt_1".into(),
            event_type: EventType::ToolCallInDoubt,
            time: Timestamp(2_000),
            run_id: Some(run.into()),
            step_id: None,
            tool_call_id: Some(node.into()),
            payload: json!({"reason": reason}),
        };
        let doubts = [
            doubt("r1", "ship", "lease ended after the outbound mark"),
            doubt("r2", "ship", "not mine"),
        ];
        let rows = InboxRow::build(&calls, &runs, &probes, &doubts);
        let got: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|r| (r.run.as_str(), r.node.as_str(), r.workflow.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("r1", "charge", "pay"),
                ("r2", "charge", ""),
                ("r1", "ship", "pay")
            ],
            "in the calls' order; an unknown run has no name"
        );
        assert_eq!(rows[0].why, "timed out after 30s");
        assert!(
            rows[1].why.contains("stopped after the outbound mark"),
            "{}",
            rows[1].why
        );
        let verdict = rows[0].last_probe.as_ref().map(|p| (p.probe, p.decision));
        assert_eq!(verdict, Some((2, ProbeDecision::NeedsOperator)));
        assert!(rows[1].last_probe.is_none() && rows[2].last_probe.is_none());
        assert_eq!(rows[0].key, "r1:charge:1");
        let json = serde_json::to_value(&rows[0]).unwrap_or_default();
        assert_eq!(json["last_probe"]["observed"], "unknown", "{json}");
        assert_eq!(json["in_doubt_at"], "1970-01-01T00:00:02.000Z", "{json}");
        assert_eq!(json["call"]["request"]["amount"], 10, "{json}");
    }
}
