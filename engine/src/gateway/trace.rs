//! The gateway's part of a trace (`crate::telemetry`): the CLIENT span of a call that
//! leaves the process, its events, and the trace context each adapter carries to the
//! downstream. With telemetry off every function here is a no-op on a disabled span.

use flow_adapters::TraceContext;
use flow_ledger::CallLease;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::{StepCall, StepResult, Target};
use crate::secrets::Secrets;
use crate::telemetry::{spans, w3c};

/// The CLIENT span of the call `lease` holds for step `c`, to `target`. A URL that holds
/// a secret anywhere (its query and fragment are cut from every URL, after which a
/// secret's remains would no longer match the scrub) shows only its origin.
pub(super) fn call_span(
    c: &StepCall<'_>,
    target: &Target,
    lease: &CallLease,
    secrets: &Secrets,
) -> Span {
    let mut named = spans::CallTarget {
        tool: &c.tool.name,
        kind: "function",
        key: &lease.key,
        method: None,
        url: None,
        mcp_tool: None,
    };
    match target {
        Target::Function { .. } => {}
        Target::Command(_) => named.kind = "command",
        Target::Http(spec) => {
            named.kind = "http";
            if crate::telemetry::enabled() {
                named.method = Some(spec.method.to_ascii_uppercase());
                named.url = if secrets.finds(spec.url.as_bytes()) {
                    spans::origin_of(&spec.url)
                } else {
                    spans::redacted_url(&spec.url)
                };
            }
        }
        Target::Mcp(spec) => {
            named.kind = "mcp";
            named.mcp_tool = Some(&spec.tool);
        }
    }
    spans::call(&named)
}

/// Decides the trace context `lease`'s request carries, before its outbound mark: the
/// one stored with this key's first mark when there is one (a re-send after a crash or
/// a `retry` resolution carries the original's, and this span says it is a re-send and
/// links to the original), else this CLIENT span's, set on the lease for the mark to
/// store.
pub(super) fn decide(lease: &mut CallLease) {
    let span = Span::current();
    // Sent before: under this key by a process that died, or before a `retry`
    // resolution — whether or not that send was traced.
    if lease.prior_sends > 0 || lease.trace_parent.is_some() {
        spans::call_resent(&span);
    }
    match &lease.trace_parent {
        Some(stored) => {
            w3c::link(&span, stored, lease.trace_state.as_deref());
        }
        None => {
            if let Some((parent, state)) = w3c::of(&span) {
                lease.trace_parent = Some(parent);
                lease.trace_state = state;
            }
        }
    }
}

/// The trace context `lease`'s request carries ([`decide`]).
pub(super) fn carried(lease: &CallLease) -> Option<TraceContext> {
    lease.trace_parent.as_ref().map(|parent| TraceContext {
        parent: parent.clone(),
        state: lease.trace_state.clone(),
    })
}

/// Whether calls of `tool` carry the trace context (an MCP tool may say no).
pub(super) fn propagates(tool: &crate::workflow::ToolDecl) -> bool {
    match &tool.kind {
        crate::workflow::ToolKind::Mcp(m) => m.propagate_trace,
        _ => true,
    }
}

/// What the adapter saw of the answer (an HTTP status, an MCP session), on the CLIENT
/// span.
pub(super) fn answered(outcome: &flow_adapters::Outcome) {
    spans::call_answered(
        &Span::current(),
        outcome.http_status,
        outcome.mcp_session.as_deref(),
    );
}

/// The call's outbound mark is durable: the request may leave from here on.
pub(super) fn marked() {
    Span::current().add_event("outbound.marked", Vec::new());
}

/// The same key goes out again within this span (`sends` so far).
pub(super) fn resend(sends: u32) {
    Span::current().add_event(
        "resend",
        vec![opentelemetry::KeyValue::new(
            "flow.call.sends",
            i64::from(sends),
        )],
    );
}

/// A terminal result served from the ledger: an event on the step, no CLIENT span
/// (no request left for it).
pub(super) fn replayed(result: &StepResult) {
    Span::current().add_event(
        "replayed",
        vec![opentelemetry::KeyValue::new(
            "flow.call.state",
            state(result),
        )],
    );
}

/// Records how the call ended on its CLIENT span.
pub(super) fn ended(span: &Span, result: &Result<StepResult, flow_ledger::Error>) {
    let (state, failed) = match result {
        Ok(r) => (state(r), matches!(r, StepResult::Failed { .. })),
        Err(_) => ("interrupted", true),
    };
    spans::call_ended(span, state, failed);
}

/// The outcome of the call's send is unknown: it goes in doubt, for `reason` (what the
/// adapter saw; scrubbed on export like every attribute).
pub(super) fn in_doubt(reason: Option<&str>) {
    let attributes = reason
        .map(|r| {
            vec![opentelemetry::KeyValue::new(
                "flow.call.reason",
                r.to_owned(),
            )]
        })
        .unwrap_or_default();
    Span::current().add_event("in_doubt", attributes);
}

/// A result's state as the span shows it.
fn state(result: &StepResult) -> &'static str {
    match result {
        StepResult::Succeeded { .. } => "succeeded",
        StepResult::Failed { .. } => "failed",
        StepResult::InDoubt => "in_doubt",
        StepResult::Deferred { .. } => "deferred",
        StepResult::AwaitingApproval { .. } => "awaiting_approval",
        StepResult::Waiting { .. } => "waiting",
        StepResult::Skipped { .. } => "skipped",
        StepResult::TaskWorking { .. } => "task_working",
    }
}
