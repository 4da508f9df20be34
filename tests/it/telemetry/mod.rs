//! OpenTelemetry: what `flow run` exports to a real OTLP/HTTP receiver on loopback
//! (decoded with the protocol's own protobuf types), and the trace context the
//! downstream receives.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::CountingServer;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;

use crate::support::{Backend, TestDb, output, runtime, stderr};

mod grpc;
mod probes;

/// A secret the HTTP tool puts in its URL path and its Authorization header: no form of
/// it may reach an exported span.
const SECRET: &str = "s3cr3t+v@l\"ue-7f1";

/// The bodies an OTLP/HTTP receiver got, as sent.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<Vec<u8>>>>);

impl Received {
    fn bodies(&self) -> Vec<Vec<u8>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every span of every request, decoded.
    fn spans(&self) -> Vec<Span> {
        let mut spans = Vec::new();
        for body in self.bodies() {
            let request = ExportTraceServiceRequest::decode(body.as_slice())
                .unwrap_or_else(|e| panic!("not an OTLP trace request: {e}"));
            for resource in request.resource_spans {
                for scope in resource.scope_spans {
                    spans.extend(scope.spans);
                }
            }
        }
        spans
    }
}

/// An OTLP/HTTP receiver on loopback (`POST /v1/traces`), answering like a collector;
/// with `hang`, it takes the request and never answers.
async fn collector(hang: bool) -> (String, Received) {
    let received = Received::default();
    let kept = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                kept.0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(body.to_vec());
                if hang {
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
                (
                    [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), received)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Attribute `key` of `span` as text (strings, integers and booleans).
fn attr(span: &Span, key: &str) -> Option<String> {
    value(&span.attributes, key)
}

/// Attribute `key` of the first event `name` of `span`, as text.
fn event_attr(span: &Span, name: &str, key: &str) -> Option<String> {
    let event = span.events.iter().find(|e| e.name == name)?;
    value(&event.attributes, key)
}

fn value(attributes: &[KeyValue], key: &str) -> Option<String> {
    let kv = attributes.iter().find(|kv| kv.key == key)?;
    match kv.value.as_ref()?.value.as_ref()? {
        Any::StringValue(s) => Some(s.clone()),
        Any::IntValue(i) => Some(i.to_string()),
        Any::BoolValue(b) => Some(b.to_string()),
        other => Some(format!("{other:?}")),
    }
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found = named(spans, name);
    assert_eq!(
        found.len(),
        1,
        "{name}: {:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    found[0]
}

/// prepare (pure) → pay (HTTP, the secret in its path and header) → done (pure).
fn workflow(url: &str) -> String {
    format!(
        r#"name: traced
tools:
  echo: {{ kind: function, function: core.echo }}
  refund:
    kind: http
    method: POST
    url: "{url}/refunds/${{{{ secrets.API_TOKEN }}}}"
    headers: {{ Authorization: "Bearer ${{{{ secrets.API_TOKEN }}}}" }}
nodes:
  prepare: {{ tool: echo, with: {{ amount: 5 }} }}
  pay: {{ tool: refund, needs: [prepare], with: {{ amount: 5 }} }}
  done: {{ tool: echo, needs: [pay], with: {{ ok: true }} }}
"#
    )
}

#[test]
fn a_run_exports_its_spans_and_the_downstream_continues_the_client_span() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let (otlp, received) = rt.block_on(collector(false));
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("w.yaml", &workflow(&server.url()));
    let out = output(traced(&db, &otlp).arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let spans = received.spans();
    let run = one(&spans, "flow.run traced");
    let step = one(&spans, "flow.step pay");
    let client = one(&spans, "execute_tool refund");
    // Pure steps are not exported by default.
    assert!(named(&spans, "flow.step prepare").is_empty());
    assert!(named(&spans, "flow.step done").is_empty());

    // One trace, parent to child: run → step → CLIENT.
    assert!(run.parent_span_id.is_empty(), "the run segment is a root");
    assert_eq!(step.parent_span_id, run.span_id);
    assert_eq!(client.parent_span_id, step.span_id);
    assert_eq!(step.trace_id, run.trace_id);
    assert_eq!(client.trace_id, run.trace_id);
    assert_eq!(client.kind, SpanKind::Client as i32);

    let run_id = attr(run, "flow.run.id").expect("flow.run.id");
    assert_eq!(attr(run, "flow.workflow").as_deref(), Some("traced"));
    assert_eq!(attr(run, "flow.run.segment").as_deref(), Some("1"));
    assert_eq!(attr(run, "flow.run.outcome").as_deref(), Some("succeeded"));
    assert_eq!(attr(step, "flow.run.id"), Some(run_id.clone()));
    assert_eq!(attr(step, "flow.node").as_deref(), Some("pay"));
    assert_eq!(attr(step, "flow.step.attempt").as_deref(), Some("1"));
    assert_eq!(
        attr(client, "gen_ai.operation.name").as_deref(),
        Some("execute_tool")
    );
    assert_eq!(attr(client, "gen_ai.tool.name").as_deref(), Some("refund"));
    assert_eq!(
        attr(client, "flow.call.state").as_deref(),
        Some("succeeded")
    );
    assert_eq!(attr(client, "http.request.method").as_deref(), Some("POST"));
    assert_eq!(
        attr(client, "http.response.status_code").as_deref(),
        Some("200")
    );
    // The URL holds the secret: only its origin is shown.
    assert_eq!(attr(client, "url.full"), Some(server.url()));
    let events: Vec<&str> = client.events.iter().map(|e| e.name.as_str()).collect();
    assert!(events.contains(&"outbound.marked"), "{events:?}");

    // The downstream got the CLIENT span as its parent, and the same key the span names.
    let log = server.log();
    assert_eq!(log.len(), 1, "{log:?}");
    let expected = format!("00-{}-{}-01", hex(&client.trace_id), hex(&client.span_id));
    assert_eq!(log[0].header("traceparent"), Some(expected.as_str()));
    assert_eq!(attr(client, "flow.call.key"), log[0].key);

    // The secret was used, and no form of it was exported.
    assert!(
        log[0]
            .header("authorization")
            .is_some_and(|v| v.contains(SECRET))
    );
    for body in received.bodies() {
        let text = String::from_utf8_lossy(&body);
        assert!(!text.contains("s3cr3t"), "a secret was exported: {text}");
    }
    let request =
        ExportTraceServiceRequest::decode(received.bodies()[0].as_slice()).expect("decode");
    let resource = request.resource_spans[0]
        .resource
        .clone()
        .expect("resource");
    let service = resource
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| kv.value.as_ref()?.value.clone());
    assert_eq!(service, Some(Any::StringValue("flow".into())));
}

#[test]
fn flow_toml_names_the_endpoint_and_can_ask_for_pure_steps() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let (otlp, received) = rt.block_on(collector(false));
    let db = TestDb::new(Backend::Sqlite);
    db.write(
        "flow.toml",
        &format!("[telemetry]\notlp_endpoint = \"{otlp}\"\npure_steps = true\n"),
    );
    let file = db.write("w.yaml", &workflow(&server.url()));
    let out = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("FLOW_SECRET_API_TOKEN", SECRET),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let spans = received.spans();
    let run = one(&spans, "flow.run traced");
    for node in ["prepare", "pay", "done"] {
        let step = one(&spans, &format!("flow.step {node}"));
        assert_eq!(step.parent_span_id, run.span_id, "{node}");
    }
    // A pure step is not a call that leaves: no CLIENT span for it.
    assert_eq!(
        spans
            .iter()
            .filter(|s| s.kind == SpanKind::Client as i32)
            .count(),
        1
    );

    // A bad endpoint in flow.toml is an installation error, said before anything runs.
    db.write(
        "flow.toml",
        "[telemetry]\notlp_endpoint = \"collector:4318\"\n",
    );
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(stderr(&out).contains("otlp_endpoint"), "{}", stderr(&out));
}

#[test]
fn a_collector_that_is_down_or_hangs_neither_fails_nor_holds_up_the_run() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let (hanging, received) = rt.block_on(collector(true));
    // A port nobody listens on (bound, then closed).
    let down = format!("http://{}", crate::daemon::free_port());
    // The same run without telemetry: the yardstick.
    let run_once = |endpoint: Option<&str>| {
        let db = TestDb::new(Backend::Sqlite);
        let file = db.write("w.yaml", &workflow(&server.url()));
        let mut cmd = db.flow();
        cmd.arg("run")
            .arg(&file)
            .env("FLOW_SECRET_API_TOKEN", SECRET);
        if let Some(endpoint) = endpoint {
            // An export timeout far past the bound below: a run that waited for the
            // export would take two minutes, whatever the machine's load.
            cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
                .env("OTEL_EXPORTER_OTLP_TIMEOUT", "120000");
        }
        let started = Instant::now();
        let out = output(&mut cmd);
        (out, started.elapsed())
    };
    let (plain, baseline) = run_once(None);
    assert_eq!(plain.status.code(), Some(0), "{}", stderr(&plain));
    for (endpoint, what) in [(down, "down"), (hanging, "hanging")] {
        let (out, took) = run_once(Some(&endpoint));
        assert_eq!(out.status.code(), Some(0), "{what}: {}", stderr(&out));
        // The exit waits at most one second for the last batch (telemetry::EXIT_FLUSH);
        // the export's own timeout is two minutes here.
        assert!(
            took < baseline + Duration::from_secs(60),
            "{what}: took {took:?}, {baseline:?} without telemetry"
        );
        assert!(
            stderr(&out).contains("not exported"),
            "{what}: the dropped spans are counted and said: {}",
            stderr(&out)
        );
    }
    assert!(
        !received.bodies().is_empty(),
        "the hanging collector was reached"
    );
}

/// The span context a `traceparent` names: (trace id, span id), hex.
fn ids(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    (parts[1].to_owned(), parts[2].to_owned())
}

/// The run spans of one outcome.
fn runs_ending<'a>(spans: &'a [Span], outcome: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| {
            s.name == "flow.run traced" && attr(s, "flow.run.outcome").as_deref() == Some(outcome)
        })
        .collect()
}

/// `flow` on `db` with the workflow's secret, exporting to `otlp`.
fn traced(db: &TestDb, otlp: &str) -> std::process::Command {
    let mut cmd = db.flow();
    cmd.env("FLOW_SECRET_API_TOKEN", SECRET)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp);
    cmd
}

/// `flow run FILE`, traced, killed after `pay`'s request left; the run id.
fn crash_after_response(db: &TestDb, file: &std::path::Path, otlp: &str) -> String {
    let crashed = output(
        traced(db, otlp)
            .arg("run")
            .arg(file)
            .env("FLOW_FAULT", "after_response:pay"),
    );
    assert_eq!(crashed.status.code(), None, "{}", stderr(&crashed));
    crate::support::run_id(&crashed)
}

#[test]
fn a_resend_after_a_crash_carries_the_original_traceparent_and_each_segment_links_back() {
    for backend in crate::support::backends() {
        let rt = runtime();
        let server = rt.block_on(CountingServer::start()).expect("server");
        let (otlp, received) = rt.block_on(collector(false));
        let db = TestDb::new(backend);
        let file = db.write("w.yaml", &workflow(&server.url()));

        // 1. Killed after the request left, before its outcome was recorded.
        let run = crash_after_response(&db, &file, &otlp);
        let first = server.log();
        assert_eq!(first.len(), 1, "{backend:?}");
        let original = first[0]
            .header("traceparent")
            .expect("the first send carried a traceparent")
            .to_owned();
        let (trace, span) = ids(&original);

        // 2. Resumed: in doubt, the run pauses — and that segment is exported at once,
        // linked to the killed one (the trace of the original send).
        let paused = output(traced(&db, &otlp).args(["resume", &run]));
        assert_eq!(
            paused.status.code(),
            Some(3),
            "{backend:?}: {}",
            stderr(&paused)
        );
        let spans = received.spans();
        let segment = runs_ending(&spans, "paused");
        assert_eq!(
            segment.len(),
            1,
            "{backend:?}: the paused segment was exported"
        );
        assert!(
            segment[0].links.iter().any(|l| hex(&l.trace_id) == trace),
            "{backend:?}: the paused segment links to the killed one: {:?}",
            segment[0].links
        );
        assert_ne!(
            hex(&segment[0].trace_id),
            trace,
            "{backend:?}: a segment is its own trace"
        );
        assert_eq!(
            server.log().len(),
            1,
            "{backend:?}: nothing re-sent blindly"
        );

        // 3. An operator says `retry`: the same key goes out again with the original's
        // traceparent; the new CLIENT span says it is a re-send and links to the original,
        // and no exported CLIENT span claims the original's id.
        let resolved = output(traced(&db, &otlp).args(["resume", &run, "--resolve", "pay=retry"]));
        assert_eq!(
            resolved.status.code(),
            Some(0),
            "{backend:?}: {}",
            stderr(&resolved)
        );
        let log = server.log();
        assert_eq!(log.len(), 2, "{backend:?}");
        assert_eq!(log[1].key, first[0].key, "{backend:?}: the same key");
        assert_eq!(
            log[1].header("traceparent"),
            Some(original.as_str()),
            "{backend:?}: the re-send carries the stored traceparent"
        );
        let spans = received.spans();
        let clients: Vec<&Span> = spans
            .iter()
            .filter(|s| s.kind == SpanKind::Client as i32)
            .collect();
        assert_eq!(
            clients.len(),
            1,
            "{backend:?}: one CLIENT span, the re-send's"
        );
        let resend = clients[0];
        assert_eq!(attr(resend, "flow.call.resend").as_deref(), Some("true"));
        assert_ne!(hex(&resend.span_id), span, "{backend:?}");
        assert!(
            resend
                .links
                .iter()
                .any(|l| hex(&l.trace_id) == trace && hex(&l.span_id) == span),
            "{backend:?}: the re-send links to the original send: {:?}",
            resend.links
        );
        // The operator's decision is a span of its own, linked to the call it settled.
        let settled = one(&spans, "flow.resolve pay");
        assert_eq!(
            event_attr(settled, "resolved", "flow.resolution").as_deref(),
            Some("retry")
        );
        // The kind of resolver, not the person (the ledger keeps the OS user).
        assert_eq!(
            event_attr(settled, "resolved", "flow.resolved.by").as_deref(),
            Some("cli")
        );
        assert!(
            settled.links.iter().any(|l| hex(&l.span_id) == span),
            "{backend:?}: the resolution links to the original send: {:?}",
            settled.links
        );
        let done = runs_ending(&spans, "succeeded");
        assert_eq!(done.len(), 1, "{backend:?}");
        assert!(
            done[0]
                .links
                .iter()
                .any(|l| l.span_id == segment[0].span_id),
            "{backend:?}: the last segment links to the paused one"
        );
    }
}

/// One MCP call (`count`, a side effect) to the testkit server at `url`.
fn mcp_workflow(url: &str, propagate: bool) -> String {
    format!(
        r#"name: traced-mcp
tools:
  count:
    kind: mcp
    server: {{ url: "{url}" }}
    tool: count
    propagate_trace: {propagate}
nodes:
  tick: {{ tool: count, with: {{ key: k1 }} }}
"#
    )
}

#[test]
fn an_mcp_call_carries_its_client_span_in_meta_unless_the_tool_says_no() {
    let rt = runtime();
    let server = rt
        .block_on(flow_adapters::testkit::mcp::HttpServer::start(None))
        .expect("mcp server");
    let (otlp, received) = rt.block_on(collector(false));
    let run = |propagate: bool| {
        let db = TestDb::new(Backend::Sqlite);
        let file = db.write("w.yaml", &mcp_workflow(&server.url(), propagate));
        output(
            db.flow()
                .arg("run")
                .arg(&file)
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
        )
    };

    let out = run(true);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let metas = server.http().call_metas();
    assert_eq!(metas.len(), 1, "{metas:?}");
    let spans = received.spans();
    let client = one(&spans, "execute_tool count");
    assert_eq!(
        attr(client, "mcp.method.name").as_deref(),
        Some("tools/call")
    );
    assert_eq!(attr(client, "mcp.tool.name").as_deref(), Some("count"));
    let sessions = server.sessions_seen();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(attr(client, "mcp.session.id"), Some(sessions[0].clone()));
    let expected = format!("00-{}-{}-01", hex(&client.trace_id), hex(&client.span_id));
    assert_eq!(metas[0]["traceparent"], serde_json::json!(expected));
    // The call's idempotency key goes with it, so a server that dedupes, does.
    let key = metas[0]["io.flow/idempotency-key"]
        .as_str()
        .unwrap_or_default();
    assert!(key.ends_with(":1"), "the effect attempt's key: {metas:?}");

    // A server that refuses `_meta` keys it does not know: the call fails while flow
    // propagates, and succeeds with `propagate_trace: false`, carrying none.
    server.refuse_unknown_meta(true);
    let refused = run(true);
    assert_ne!(
        refused.status.code(),
        Some(0),
        "the strict server refused the call"
    );
    assert!(
        stderr(&refused).contains("unknown _meta key"),
        "{}",
        stderr(&refused)
    );
    let out = run(false);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let metas = server.http().call_metas();
    assert!(
        metas.last().is_some_and(
            |m| m.get("traceparent").is_none() && m.get("io.flow/idempotency-key").is_none()
        ),
        "{metas:?}"
    );
}

#[test]
fn a_run_submitted_with_a_traceparent_continues_that_trace() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let (otlp, received) = rt.block_on(collector(false));
    let db = TestDb::new(Backend::Sqlite);
    let api = crate::api::serve(&db);
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let text = workflow(&server.url()).replace(
        r#"headers: { Authorization: "Bearer ${{ secrets.API_TOKEN }}" }"#,
        "headers: {}",
    );
    let text = text.replace("/refunds/${{ secrets.API_TOKEN }}", "/refunds");
    let status = rt.block_on(async {
        reqwest::Client::new()
            .post(format!("{}/api/v1/runs", api.base))
            .bearer_auth(crate::api::OPERATOR)
            .header("traceparent", parent)
            .json(&serde_json::json!({"workflow": text, "run_id": "traced-1"}))
            .send()
            .await
            .expect("submit")
            .status()
    });
    assert_eq!(status, reqwest::StatusCode::CREATED);
    drop(api);
    let out = output(
        db.flow()
            .args(["daemon", "--exit-when-idle", "--poll-interval", "50ms"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let spans = received.spans();
    let run = one(&spans, "flow.run traced");
    assert_eq!(attr(run, "flow.run.outcome").as_deref(), Some("succeeded"));
    let (trace, span) = ids(parent);
    assert_eq!(
        hex(&run.trace_id),
        trace,
        "the run continues the submitter's trace"
    );
    assert_eq!(hex(&run.parent_span_id), span);
    let client = one(&spans, "execute_tool refund");
    assert_eq!(hex(&client.trace_id), trace);
    assert_eq!(
        attr(client, "url.full"),
        Some(format!("{}/refunds", server.url())),
        "a URL without a secret keeps its path"
    );
    let log = server.log();
    assert!(
        log[0]
            .header("traceparent")
            .is_some_and(|t| t.contains(&trace)),
        "{log:?}"
    );
}

#[test]
fn a_command_gets_its_client_span_as_traceparent_in_its_environment() {
    let rt = runtime();
    let (otlp, received) = rt.block_on(collector(false));
    let db = TestDb::new(Backend::Sqlite);
    let seen = db.dir.path().join("traceparent.txt");
    let file = db.write(
        "w.yaml",
        &format!(
            r#"name: traced-cmd
tools:
  note:
    kind: command
    command: ["sh", "-c", "cat > /dev/null; printf '%s' \"$TRACEPARENT\" > {}; echo '{{}}'"]
nodes:
  a: {{ tool: note }}
"#,
            seen.display()
        ),
    );
    let out = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let spans = received.spans();
    let client = one(&spans, "execute_tool note");
    let expected = format!("00-{}-{}-01", hex(&client.trace_id), hex(&client.span_id));
    let got = std::fs::read_to_string(&seen).expect("the command wrote its TRACEPARENT");
    assert_eq!(got, expected);
}

#[test]
fn a_daemon_counts_the_spans_a_dead_collector_did_not_take() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    // A port nobody listens on (bound, then closed).
    let down = format!("http://{}", crate::daemon::free_port());
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("w.yaml", &workflow(&server.url()));
    let submitted = output(db.flow().arg("submit").arg(&file));
    assert_eq!(submitted.status.code(), Some(0), "{}", stderr(&submitted));
    let metrics = crate::daemon::free_port();
    let metrics_arg = metrics.to_string();
    let mut daemon = crate::daemon::Daemon::start(
        &db,
        "d",
        &["--poll-interval", "100ms", "--metrics-addr", &metrics_arg],
        &[
            ("FLOW_SECRET_API_TOKEN", SECRET),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &down),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let dropped = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("flow_telemetry_spans_dropped_total"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
    };
    let started = Instant::now();
    let seen = loop {
        let body = crate::daemon::http_get(metrics, "/metrics").map(|(_, b)| b);
        let n = body.as_deref().and_then(dropped).unwrap_or(0.0);
        if n >= 3.0 || started.elapsed() > Duration::from_secs(20) {
            break (n, body);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    daemon.signal("-TERM");
    let _ = daemon.wait(Duration::from_secs(10));
    assert_eq!(
        server.log().len(),
        1,
        "the run was executed: {}",
        daemon.log()
    );
    // run, step and CLIENT span of the one run, at least.
    assert!(
        seen.0 >= 3.0,
        "dropped spans are counted: {:?}\n{}",
        seen.1,
        daemon.log()
    );
}
