//! A tool call as readers see it ([`CallView`]: the run page, `flow show --json`, the
//! in-doubt inbox), the probes that asked a downstream about it, and the audit trail.

use flow_ledger::{CallStatus, ErrorKind, Event, Probe, ProbeDecision, ProbeObserved, ToolCall};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value as Json;

use flow_ledger::Timestamp;

/// Why something failed: the kind a caller can act on, and the message.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ErrorView {
    /// The error's kind (`timeout`, `http_status`, …; `null` when not classified).
    pub kind: Option<ErrorKind>,
    /// What went wrong, in words.
    pub message: String,
}

impl ErrorView {
    /// The error of a row with an `error_kind` / `error_message` pair.
    pub fn of(kind: Option<ErrorKind>, message: Option<&String>) -> Option<ErrorView> {
        message.map(|m| ErrorView {
            kind,
            message: m.clone(),
        })
    }
}

/// How an operator (or a probe) settled a call in doubt.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ResolutionView {
    /// `succeeded`, `failed` or `retry`.
    pub how: String,
    /// Who: the token's name, the console user, `$USER@host`, or `probe`.
    pub by: Option<String>,
    /// When.
    pub at: Option<Timestamp>,
    /// Why, as they gave it.
    pub reason: Option<String>,
}

/// One tool call: its state, how many requests left (never a bare 0 beside "the
/// request left"), its key, its error or resolution, the request as stored (secrets
/// are names, never values) and its output.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CallView {
    /// The run.
    pub run: String,
    /// The node whose call this is (a node has at most one call).
    pub node: String,
    /// The tool.
    pub tool: String,
    /// The call's state.
    pub status: CallStatus,
    /// Effect attempts started.
    pub attempts: u32,
    /// Requests that left: exact, or `null` when a send's count is unknown (a crash
    /// after the outbound mark); `requests_known` is then the lower bound.
    pub requests_sent: Option<u32>,
    /// Requests known to have left.
    pub requests_known: u32,
    /// Sends whose count is unknown (each may have sent at least one request).
    pub uncounted_sends: u32,
    /// `requests_sent` in words ("0 known + 1 send unknown (at least 1 may have left)").
    pub requests_text: String,
    /// The idempotency key of the current attempt (what the downstream saw).
    pub key: String,
    /// The call's base idempotency key (attempts add `:<n>`).
    pub idempotency_key: String,
    /// The last outbound mark: when the request was about to leave.
    pub outbound_at: Option<Timestamp>,
    /// When it became in doubt.
    pub in_doubt_at: Option<Timestamp>,
    /// While in doubt: why the outcome is unknown (a timeout, a lost connection, the
    /// holder's crash after the outbound mark).
    pub in_doubt_reason: Option<String>,
    /// While in doubt after a takeover from a worker not known to be dead: when that
    /// worker's lease ends (or ended). Until then its own fence may still let the
    /// request leave, so the downstream can show nothing yet; resolving is refused
    /// before it (the CLI waits for it).
    pub holder_lease_until: Option<Timestamp>,
    /// Its error, if it failed (or the error that put it in doubt).
    pub error: Option<ErrorView>,
    /// How it was settled by hand or by a probe.
    pub resolution: Option<ResolutionView>,
    /// The MCP task the server may still know: what to look up before settling.
    pub remote_task: Option<String>,
    /// Why the call waits with nothing sent — a slot of its tool's concurrency limit,
    /// its rate limit, the downstream's `Retry-After` — while it is claimed and waiting.
    pub waiting: Option<String>,
    /// The request as stored (secrets are names, never values).
    pub request: Json,
    /// Its output, once it succeeded.
    pub output: Option<Json>,
    /// What servers asked during the call and how the tool's policy answered
    /// (`tool_call.elicited` events, secrets scrubbed), oldest first.
    pub elicitations: Vec<Json>,
    /// The names these fields had before, for one release.
    #[serde(flatten)]
    pub aliases: CallAliases,
}

/// The names `flow show --json` gave call fields before the views were unified:
/// written beside the new ones for one release, then removed.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CallAliases {
    /// Deprecated: `node`.
    #[schemars(extend("deprecated" = true))]
    pub tool_call_id: String,
    /// Deprecated: `attempts`.
    #[schemars(extend("deprecated" = true))]
    pub attempt_count: u32,
    /// Deprecated: `requests_sent`.
    #[schemars(extend("deprecated" = true))]
    pub outbound_requests: Option<u32>,
    /// Deprecated: `requests_known`.
    #[schemars(extend("deprecated" = true))]
    pub outbound_requests_known: u32,
    /// Deprecated: `key`.
    #[schemars(extend("deprecated" = true))]
    pub current_key: String,
    /// Deprecated: `outbound_at`.
    #[schemars(extend("deprecated" = true))]
    pub outbound_started_at: Option<Timestamp>,
}

/// What the holder's crash after the outbound mark leaves as the reason a call is in
/// doubt when nothing more precise was recorded.
const CRASHED: &str = "the process sending it stopped after the outbound mark (crash or lost lease): the request may have left";

impl CallView {
    /// The view of `c`; `events` are its run's events (for elicitations and the
    /// in-doubt reason; empty where they were not read, as in the inbox).
    pub fn of(c: &ToolCall, events: &[Event]) -> CallView {
        let sent = c.requests_sent();
        let mine = |e: &&Event| e.tool_call_id.as_deref() == Some(c.tool_call_id.as_str());
        let elicitations = events
            .iter()
            .filter(mine)
            .filter(|e| e.event_type == flow_ledger::EventType::ToolCallElicited)
            .map(|e| {
                let mut record = e.payload.clone();
                if let Json::Object(map) = &mut record {
                    map.insert("at".into(), Json::String(e.time.to_rfc3339()));
                }
                record
            })
            .collect();
        let in_doubt_reason = (c.status == CallStatus::InDoubt).then(|| {
            let recorded = events
                .iter()
                .filter(mine)
                .rev()
                .find(|e| e.event_type == flow_ledger::EventType::ToolCallInDoubt)
                .and_then(|e| e.payload["reason"].as_str().map(str::to_string));
            recorded
                .or_else(|| c.error_message.clone())
                .unwrap_or_else(|| CRASHED.to_string())
        });
        CallView {
            run: c.run_id.clone(),
            node: c.tool_call_id.clone(),
            tool: c.tool.clone(),
            status: c.status,
            attempts: c.attempt_count,
            requests_sent: sent.exact(),
            requests_known: c.outbound_requests,
            uncounted_sends: c.uncounted_sends,
            requests_text: sent.to_string(),
            key: c.current_key.clone(),
            idempotency_key: c.idempotency_key.clone(),
            outbound_at: c.outbound_started_at,
            in_doubt_at: c.in_doubt_at,
            in_doubt_reason,
            holder_lease_until: (c.status == CallStatus::InDoubt)
                .then_some(c.lease_expires_at)
                .flatten(),
            error: ErrorView::of(c.error_kind, c.error_message.as_ref()),
            resolution: c.resolution.as_ref().map(|how| ResolutionView {
                how: how.clone(),
                by: c.resolved_by.clone(),
                at: c.resolved_at,
                reason: c.resolution_note.clone(),
            }),
            remote_task: c.remote_task.clone(),
            waiting: (c.status == CallStatus::Claimed)
                .then(|| c.waiting.clone())
                .flatten(),
            request: c.request.clone(),
            output: c.output.clone(),
            elicitations,
            aliases: CallAliases {
                tool_call_id: c.tool_call_id.clone(),
                attempt_count: c.attempt_count,
                outbound_requests: sent.exact(),
                outbound_requests_known: c.outbound_requests,
                current_key: c.current_key.clone(),
                outbound_started_at: c.outbound_started_at,
            },
        }
    }
}

/// One probe: a read-only question to the downstream about a call in doubt, what it
/// answered and what flow decided.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ProbeView {
    /// The node whose call was probed.
    pub node: String,
    /// Its number among the call's probes (1, 2, …).
    pub probe: u32,
    /// The idempotency key asked about.
    pub key: String,
    /// When.
    pub at: Timestamp,
    /// What the answer said about the effect attempt.
    pub observed: ProbeObserved,
    /// What flow did with it.
    pub decision: ProbeDecision,
    /// The probe's HTTP status, if it was HTTP.
    pub http_status: Option<u16>,
    /// More, in words.
    pub detail: Option<String>,
    /// The downstream's answer as stored (secrets redacted).
    pub response: Option<Json>,
    /// When the next probe is due, if one is.
    pub next_probe_at: Option<Timestamp>,
    /// Who asked: `daemon`, or the operator who pressed "probe now".
    pub by: String,
    /// Deprecated (one release): `node`.
    #[schemars(extend("deprecated" = true))]
    pub tool_call_id: String,
}

impl ProbeView {
    /// The view of `p`.
    pub fn of(p: &Probe) -> ProbeView {
        ProbeView {
            node: p.tool_call_id.clone(),
            probe: p.probe,
            key: p.sent_key.clone(),
            at: p.probed_at,
            observed: p.observed,
            decision: p.decision,
            http_status: p.http_status,
            detail: p.detail.clone(),
            response: p.response.clone(),
            next_probe_at: p.next_probe_at,
            by: p.by.clone(),
            tool_call_id: p.tool_call_id.clone(),
        }
    }
}

/// Who changed a run by hand, when and why: one event that carries a `by`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AuditEntry {
    /// The event (`run.cancelled`, `tool_call.resolved`, …).
    pub event: flow_ledger::EventType,
    /// When.
    pub at: Timestamp,
    /// Who.
    pub by: String,
    /// The node it concerned, if one.
    pub node: Option<String>,
    /// Why, as they gave it.
    pub reason: Option<String>,
}

impl AuditEntry {
    /// The audit trail of `events` (those with a `by`), oldest first.
    pub fn trail(events: &[Event]) -> Vec<AuditEntry> {
        events
            .iter()
            .filter_map(|e| {
                let by = e.payload["by"].as_str()?;
                let reason = e.payload.get("reason").or_else(|| e.payload.get("note"));
                Some(AuditEntry {
                    event: e.event_type,
                    at: e.time,
                    by: by.to_string(),
                    node: e.tool_call_id.clone(),
                    reason: reason.and_then(Json::as_str).map(str::to_string),
                })
            })
            .collect()
    }
}

/// For a call in doubt taken over from a worker not known to be dead: the end of that
/// worker's lease when it is still ahead of `now` — the worker's fence could still let
/// the request leave until then, so a person must not judge from the downstream yet.
/// `None` once it has passed (or for any other call). The end cannot move: the takeover
/// cleared the holder and moved the token on, so nobody renews it.
pub fn holder_may_send_until(c: &ToolCall, now: Timestamp) -> Option<Timestamp> {
    if c.status != CallStatus::InDoubt {
        return None;
    }
    c.lease_expires_at.filter(|t| *t > now)
}
