//! W3C trace context as text: what a span hands a downstream (`traceparent`,
//! `tracestate`), and the span context a stored `traceparent` names (for links).

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{SpanContext, TraceContextExt as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// `span`'s context as `(traceparent, tracestate)`; `None` when `span` is not traced
/// (telemetry off, or not sampled in).
pub fn of(span: &Span) -> Option<(String, Option<String>)> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    let parent = carrier.remove("traceparent")?;
    Some((
        parent,
        carrier.remove("tracestate").filter(|s| !s.is_empty()),
    ))
}

/// The span context `traceparent` (and `tracestate`) name; `None` for text that is not
/// a valid one.
pub fn parse(parent: &str, state: Option<&str>) -> Option<SpanContext> {
    let mut carrier: HashMap<String, String> = HashMap::new();
    carrier.insert("traceparent".into(), parent.to_owned());
    if let Some(state) = state {
        carrier.insert("tracestate".into(), state.to_owned());
    }
    let cx = TraceContextPropagator::new().extract(&carrier);
    let found = cx.span().span_context().clone();
    found.is_valid().then_some(found)
}

/// Links `span` to the span `traceparent` names (an earlier execution segment, or the
/// original send of a re-sent key); nothing when either is not traced.
pub fn link(span: &Span, parent: &str, state: Option<&str>) {
    if let Some(cx) = parse(parent, state) {
        span.add_link(cx);
    }
}

/// Makes `span` (not yet started) a child of the span `traceparent` names: a run
/// submitted with a trace continues it. Nothing for an invalid one.
pub fn continue_from(span: &Span, parent: &str) {
    if let Some(cx) = parse(parent, None) {
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(cx));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_traceparent_names_its_span_and_garbage_names_none() {
        let cx = parse(
            "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01",
            Some("vendor=x"),
        )
        .expect("valid");
        assert_eq!(cx.span_id().to_string(), "00f067aa0ba902b7");
        assert_eq!(
            cx.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert!(parse("00-zz-yy-01", None).is_none());
        assert!(of(&Span::none()).is_none());
    }
}
