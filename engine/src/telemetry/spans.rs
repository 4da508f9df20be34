//! The spans flow exports, in one place: their names and attributes are a contract with
//! the dashboards and queries users build on them (README "Telemetry").
//!
//! - `flow.run <workflow>`: one execution segment of a run — a claim of the run by one
//!   process. A resume or a takeover is a new segment, so no span stays open across a
//!   pause and a week-long run is not one trace-long span.
//! - `flow.step <node>`: one step (a node's try; retries are their own steps).
//! - `execute_tool <tool>` (kind CLIENT): a call that leaves the process, from just
//!   before its outbound mark to its outcome (a call deferred by a rate limit, or whose
//!   callback expired, sends nothing and gets none), with the events `outbound.marked`,
//!   `in_doubt` and `resend`; `flow.call.resend = true` when its key was sent before
//!   (after a crash, or a `retry` resolution). A result replayed from the ledger is an
//!   event on its step (`replayed`), never a CLIENT span.
//! - `flow.probe <tool>` (kind CLIENT): a reconciliation probe of an in-doubt call, with
//!   the event `probe` (what it found, what flow decided); `flow.resolve <node>`: an
//!   in-doubt call settled (by an operator, the API, or a probe), with the event
//!   `resolved` (how, by whom). The call's CLIENT span ended when it went in doubt, so
//!   both link to it (the context stored with its outbound mark) instead of adding to it.
//!
//! Built as tracing spans with the fields their log lines always had (`run`, `step`,
//! `call`) and `otel.name` / `otel.kind`, under stable targets a `RUST_LOG` filter can
//! name (`flow::run`, `flow::step`, `flow::pure_step`, `flow::call`, `flow::probe`,
//! `flow::resolve`: README "Logs"); every other attribute is set on the exported
//! span only while telemetry is on ([`super::enabled`]), so with it off a log line and
//! a span cost what they did before.

use flow_ledger::ToolCall;
use opentelemetry::KeyValue;
use opentelemetry::trace::Status;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Sets `attributes` on `span`'s exported span, when there is one.
fn set(span: &Span, attributes: impl FnOnce() -> Vec<KeyValue>) {
    if super::enabled() && !span.is_disabled() {
        for kv in attributes() {
            span.set_attribute(kv.key, kv.value);
        }
    }
}

/// The span of one execution segment of run `run_id` of `workflow`, under fencing
/// token `segment` (each claim of the run increments it).
pub fn run(run_id: &str, workflow: &str, segment: i64) -> Span {
    let span = tracing::info_span!(
        target: "flow::run",
        "run",
        run = %run_id,
        otel.name = %format_args!("flow.run {workflow}"),
    );
    set(&span, || {
        vec![
            KeyValue::new("flow.run.id", run_id.to_owned()),
            KeyValue::new("flow.workflow", workflow.to_owned()),
            KeyValue::new("flow.run.segment", segment),
        ]
    });
    span
}

/// Records how a segment ended (`succeeded`, `paused`, …) on its span.
pub fn run_ended(span: &Span, outcome: &'static str) {
    set(span, || vec![KeyValue::new("flow.run.outcome", outcome)]);
}

/// Where a step stands: its run, node, step id and try.
pub struct Step<'a> {
    /// The run.
    pub run_id: &'a str,
    /// The node (`notify`, or `notify[c3]` for an item of a fan-out).
    pub node: &'a str,
    /// The step id (`notify`, `notify_retry1`, …).
    pub step_id: &'a str,
    /// 0 for the node's first try, n for `<node>_retry<n>`.
    pub retry: u32,
}

/// The span of one step; a pure function's (`pure`, asked only while telemetry is on)
/// under [`super::PURE_STEP_TARGET`], which the exporter drops unless
/// `[telemetry] pure_steps = true`.
pub fn step(s: &Step<'_>, pure: bool) -> Span {
    macro_rules! step_span {
        ($target:expr) => {
            tracing::info_span!(
                target: $target,
                "step",
                step = %s.step_id,
                call = %s.node,
                otel.name = %format_args!("flow.step {}", s.node),
            )
        };
    }
    let span = if pure {
        step_span!(super::PURE_STEP_TARGET)
    } else {
        step_span!("flow::step")
    };
    set(&span, || {
        vec![
            KeyValue::new("flow.run.id", s.run_id.to_owned()),
            KeyValue::new("flow.node", s.node.to_owned()),
            KeyValue::new("flow.step.id", s.step_id.to_owned()),
            KeyValue::new("flow.step.attempt", i64::from(s.retry) + 1),
        ]
    });
    span
}

/// What the CLIENT span of a call names.
pub struct CallTarget<'a> {
    /// The tool's name in the workflow.
    pub tool: &'a str,
    /// `http`, `mcp`, `command` or `function`.
    pub kind: &'static str,
    /// The idempotency key of the call.
    pub key: &'a str,
    /// HTTP: the method, upper case.
    pub method: Option<String>,
    /// HTTP: the URL as a trace may show it ([`redacted_url`]).
    pub url: Option<String>,
    /// MCP: the tool's name on its server.
    pub mcp_tool: Option<&'a str>,
}

/// The CLIENT span of one call that leaves the process (from its outbound mark).
pub fn call(t: &CallTarget<'_>) -> Span {
    let span = tracing::info_span!(
        target: "flow::call",
        "call",
        otel.name = %format_args!("execute_tool {}", t.tool),
        otel.kind = "client",
    );
    set(&span, || {
        let mut kv = vec![
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("gen_ai.tool.name", t.tool.to_owned()),
            KeyValue::new("flow.tool.kind", t.kind),
            KeyValue::new("flow.call.key", t.key.to_owned()),
        ];
        if let Some(method) = &t.method {
            kv.push(KeyValue::new("http.request.method", method.clone()));
        }
        if let Some(url) = &t.url {
            kv.push(KeyValue::new("url.full", url.clone()));
        }
        if let Some(tool) = t.mcp_tool {
            kv.push(KeyValue::new("mcp.method.name", "tools/call"));
            kv.push(KeyValue::new("mcp.tool.name", tool.to_owned()));
        }
        kv
    });
    span
}

/// Records how a call ended (`succeeded`, `in_doubt`, …) on its CLIENT span; a failure
/// is the span's error status.
pub fn call_ended(span: &Span, state: &'static str, failed: bool) {
    set(span, || vec![KeyValue::new("flow.call.state", state)]);
    if failed && super::enabled() {
        span.set_status(Status::error(state));
    }
}

/// What a CLIENT span's call was answered with: the HTTP status, and the MCP session
/// (`Mcp-Session-Id`) it went over.
pub fn call_answered(span: &Span, http_status: Option<u16>, mcp_session: Option<&str>) {
    set(span, || {
        let mut kv = Vec::new();
        if let Some(status) = http_status {
            kv.push(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        if let Some(id) = mcp_session {
            kv.push(KeyValue::new("mcp.session.id", id.to_owned()));
        }
        kv
    });
}

/// Marks a CLIENT span as the re-send of a key sent before (set once: an attribute set
/// twice is exported twice).
pub fn call_resent(span: &Span) {
    set(span, || vec![KeyValue::new("flow.call.resend", true)]);
}

/// Links `span` to `call`'s CLIENT span, when its send was traced.
fn link_to_call(span: &Span, call: &ToolCall) {
    if super::enabled()
        && let Some(parent) = &call.trace_parent
    {
        super::w3c::link(span, parent, call.trace_state.as_deref());
    }
}

/// The attributes naming an in-doubt call on a probe's or a resolution's span.
fn call_attributes(call: &ToolCall) -> Vec<KeyValue> {
    vec![
        KeyValue::new("flow.run.id", call.run_id.clone()),
        KeyValue::new("flow.node", call.tool_call_id.clone()),
        KeyValue::new("gen_ai.tool.name", call.tool.clone()),
        KeyValue::new("flow.call.key", call.current_key.clone()),
    ]
}

/// The CLIENT span of a reconciliation probe about `call` (a request to its
/// downstream), linked to the call's own CLIENT span.
pub fn probe(call: &ToolCall) -> Span {
    let span = tracing::info_span!(
        target: "flow::probe",
        "probe",
        call = %call.tool_call_id,
        otel.name = %format_args!("flow.probe {}", call.tool),
        otel.kind = "client",
    );
    set(&span, || call_attributes(call));
    link_to_call(&span, call);
    span
}

/// What a probe found and what flow decided (or, in a dry run, would decide).
pub struct Probed {
    /// The probe's number (1-based).
    pub number: u32,
    /// `found`, `not_found`, `unknown`.
    pub observed: &'static str,
    /// `succeed`, `resend`, `probe_again`, `needs_operator`.
    pub decision: &'static str,
    /// The probe's HTTP status, if HTTP.
    pub http_status: Option<u16>,
    /// `flow reconcile --dry-run`: nothing was recorded or settled.
    pub dry_run: bool,
}

/// What a probe found, as the event `probe` on its span.
pub fn probed(span: &Span, p: &Probed) {
    if !super::enabled() {
        return;
    }
    let mut kv = vec![
        KeyValue::new("flow.probe.number", i64::from(p.number)),
        KeyValue::new("flow.probe.observed", p.observed),
        KeyValue::new("flow.probe.decision", p.decision),
    ];
    if p.dry_run {
        kv.push(KeyValue::new("flow.probe.dry_run", true));
    }
    if let Some(status) = p.http_status {
        kv.push(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
    }
    span.add_event("probe", kv);
}

/// No probe could be sent (a rate limit, a missing secret, egress): the event
/// `not_asked` with why, so the probe's span does not look like a request that left.
pub fn probe_not_asked(span: &Span, why: &str) {
    if super::enabled() {
        span.add_event(
            "not_asked",
            vec![KeyValue::new("flow.probe.why", why.to_owned())],
        );
    }
}

/// Who settled an in-doubt call, as a trace shows it: the kind of resolver, never the
/// person (the ledger's resolution keeps the OS user or the API token's name; a trace
/// goes to a third-party collector).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolver {
    /// A reconciliation probe (`reconcile`).
    Reconcile,
    /// flow itself: the tool is declared safe to re-send (`flow`).
    Flow,
    /// An operator at the command line (`cli`).
    Cli,
    /// A caller of the operator API or the console (`api`).
    Api,
}

impl Resolver {
    fn as_str(self) -> &'static str {
        match self {
            Resolver::Reconcile => "reconcile",
            Resolver::Flow => "flow",
            Resolver::Cli => "cli",
            Resolver::Api => "api",
        }
    }
}

/// `call` was just settled by `by` (it holds the resolution): a short
/// `flow.resolve <node>` span with the event `resolved` (`flow.resolution`: `succeeded`,
/// `failed`, `retry`; `flow.resolved.by`), a child of whatever span settles it (the
/// probe's, or the step's when flow re-sends on its own) and linked to the call's CLIENT
/// span. The operator's note is not exported (free text).
pub fn resolved(call: &ToolCall, by: Resolver) {
    if !super::enabled() {
        return;
    }
    let span = tracing::info_span!(
        target: "flow::resolve",
        "resolve",
        call = %call.tool_call_id,
        otel.name = %format_args!("flow.resolve {}", call.tool_call_id),
    );
    set(&span, || call_attributes(call));
    link_to_call(&span, call);
    let mut kv = vec![KeyValue::new("flow.resolved.by", by.as_str())];
    if let Some(how) = &call.resolution {
        kv.push(KeyValue::new("flow.resolution", how.clone()));
    }
    span.add_event("resolved", kv);
}

/// `url` as a trace may show it: no user info, query or fragment (any may hold a
/// secret or a personal value); `None` when it does not parse.
pub fn redacted_url(url: &str) -> Option<String> {
    let mut parsed = url::Url::parse(url).ok()?;
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    parsed.set_query(None);
    parsed.set_fragment(None);
    Some(parsed.to_string())
}

/// Only `url`'s scheme, host and port: for a URL that holds a secret.
pub fn origin_of(url: &str) -> Option<String> {
    let parsed = url::Url::parse(url).ok()?;
    Some(parsed.origin().ascii_serialization())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traced_url_keeps_no_credentials_or_query() {
        let got = redacted_url("https://user:pw@api.example.com/v1/refunds?token=abc#x");
        assert_eq!(got.as_deref(), Some("https://api.example.com/v1/refunds"));
        assert_eq!(redacted_url("not a url"), None);
        assert_eq!(
            origin_of("https://discord.com/api/webhooks/1/tok?wait=true").as_deref(),
            Some("https://discord.com")
        );
    }
}
