//! OpenTelemetry: what `flow run` exports to a real OTLP/HTTP receiver on loopback
//! (decoded with the protocol's own protobuf types), and the trace context the
//! downstream receives.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::CountingServer;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;

use crate::support::{Backend, TestDb, output, runtime, stderr};

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
    let kv = span.attributes.iter().find(|kv| kv.key == key)?;
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
    let out = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("FLOW_SECRET_API_TOKEN", SECRET)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
    );
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
    let url = attr(client, "url.full").expect("url.full");
    assert!(
        url.starts_with(&format!("{}/refunds/", server.url())),
        "{url}"
    );
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
    assert_eq!(
        attr(one(&spans, "execute_tool refund"), "service.name"),
        None,
        "service.name is a resource attribute, not a span's"
    );
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
    // A port nobody listens on: bound, then closed.
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("addr"))
    };
    for (endpoint, what) in [(down, "down"), (hanging, "hanging")] {
        let db = TestDb::new(Backend::Sqlite);
        let file = db.write("w.yaml", &workflow(&server.url()));
        let started = Instant::now();
        let out = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .env("FLOW_SECRET_API_TOKEN", SECRET)
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        );
        let took = started.elapsed();
        assert_eq!(out.status.code(), Some(0), "{what}: {}", stderr(&out));
        // The exit waits at most one second for the last batch (telemetry::EXIT_FLUSH);
        // the export's own timeout is ten.
        assert!(took < Duration::from_secs(8), "{what}: took {took:?}");
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
