//! The spans flow exports, in one place: their names and attributes are a contract with
//! the dashboards and queries users build on them (README "Telemetry").
//!
//! - `flow.run <workflow>`: one execution segment of a run — a claim of the run by one
//!   process. A resume or a takeover is a new segment, so no span stays open across a
//!   pause and a week-long run is not one trace-long span.
//! - `flow.step <node>`: one step (a node's try; retries are their own steps).
//! - `execute_tool <tool>` (kind CLIENT): a call that leaves the process, from its claim
//!   to its outcome, with the events `outbound.marked`, `in_doubt` and `resend`;
//!   `flow.call.resend = true` when its key was sent before (after a crash, or a `retry`
//!   resolution), absent otherwise (set once: an attribute recorded twice is exported
//!   twice). A result
//!   replayed from the ledger is an event on its step (`replayed`), never a CLIENT span.
//!
//! Built as tracing spans: `otel.name` / `otel.kind` name them for the exporter, and the
//! plain fields (`run`, `step`, `call`) keep the log lines' span context as it was.

use tracing::Span;
use tracing::field::Empty;

/// The span of one execution segment of run `run_id` of `workflow`, under fencing
/// token `segment` (each claim of the run increments it).
pub fn run(run_id: &str, workflow: &str, segment: i64) -> Span {
    tracing::info_span!(
        "run",
        run = %run_id,
        otel.name = %format_args!("flow.run {workflow}"),
        flow.run.id = %run_id,
        flow.workflow = %workflow,
        flow.run.segment = segment,
        flow.run.outcome = Empty,
    )
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

/// The span of one step; a pure function's under [`super::PURE_STEP_TARGET`], which the
/// exporter drops unless `[telemetry] pure_steps = true`.
pub fn step(s: &Step<'_>, pure: bool) -> Span {
    macro_rules! step_span {
        ($target:expr) => {
            tracing::info_span!(
                target: $target,
                "step",
                step = %s.step_id,
                call = %s.node,
                otel.name = %format_args!("flow.step {}", s.node),
                flow.run.id = %s.run_id,
                flow.node = %s.node,
                flow.step.id = %s.step_id,
                flow.step.attempt = u64::from(s.retry) + 1,
            )
        };
    }
    if pure {
        step_span!(super::PURE_STEP_TARGET)
    } else {
        step_span!("flow::step")
    }
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
    /// HTTP: the URL without credentials, query or fragment.
    pub url: Option<String>,
    /// MCP: the tool's name on its server.
    pub mcp_tool: Option<&'a str>,
}

/// The CLIENT span of one call that leaves the process (after its claim).
pub fn call(t: &CallTarget<'_>) -> Span {
    tracing::info_span!(
        target: "flow::call",
        "call",
        otel.name = %format_args!("execute_tool {}", t.tool),
        otel.kind = "client",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %t.tool,
        flow.tool.kind = t.kind,
        flow.call.key = %t.key,
        flow.call.state = Empty,
        flow.call.resend = Empty,
        http.request.method = t.method.as_deref(),
        url.full = t.url.as_deref(),
        mcp.method.name = t.mcp_tool.map(|_| "tools/call"),
        mcp.tool.name = t.mcp_tool,
        otel.status_code = Empty,
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traced_url_keeps_no_credentials_or_query() {
        let got = redacted_url("https://user:pw@api.example.com/v1/refunds?token=abc#x");
        assert_eq!(got.as_deref(), Some("https://api.example.com/v1/refunds"));
        assert_eq!(redacted_url("not a url"), None);
    }
}
