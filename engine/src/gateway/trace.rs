//! The gateway's part of a trace (`crate::telemetry`): the CLIENT span of a call that
//! leaves the process, its events, and the trace context each adapter carries to the
//! downstream. With telemetry off every function here is a no-op on a disabled span.

use flow_adapters::TraceContext;
use flow_ledger::CallLease;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::{StepCall, StepResult, Target};
use crate::telemetry::{spans, w3c};

/// The CLIENT span of the call `lease` holds for step `c`, to `target`.
pub(super) fn call_span(c: &StepCall<'_>, target: &Target, lease: &CallLease) -> Span {
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
            named.method = Some(spec.method.to_ascii_uppercase());
            named.url = spans::redacted_url(&spec.url);
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
    match &lease.trace_parent {
        Some(stored) => {
            span.record("flow.call.resend", true);
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

/// Records how the call ended on its CLIENT span (the current span).
pub(super) fn ended(result: &Result<StepResult, flow_ledger::Error>) {
    let span = Span::current();
    let state = match result {
        Ok(r) => state(r),
        Err(_) => "interrupted",
    };
    span.record("flow.call.state", state);
    match result {
        Ok(StepResult::InDoubt) => span.add_event("in_doubt", Vec::new()),
        Ok(StepResult::Failed { .. }) | Err(_) => {
            span.record("otel.status_code", "ERROR");
        }
        _ => {}
    }
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
