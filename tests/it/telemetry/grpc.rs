//! OTLP over gRPC: the same spans reach a collector's `TraceService/Export`, from a
//! command and from a daemon, and a collector that is down costs the run nothing.

use std::time::{Duration, Instant};

use flow_adapters::testkit::http::CountingServer;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message as _;

use super::{Received, SECRET, attr, hex, named, one, traced, workflow};
use crate::support::{Backend, TestDb, output, runtime, stderr};

/// An OTLP/gRPC receiver on loopback (the collector's `TraceService/Export`), keeping
/// each request's protobuf bytes like [`collector`] does.
async fn grpc_collector() -> (String, Received) {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };

    struct Keep(Received);

    #[tonic::async_trait]
    impl TraceService for Keep {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            (self.0)
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(request.into_inner().encode_to_vec());
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let service = TraceServiceServer::new(Keep(received.clone()));
    tokio::spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
    });
    (format!("http://{addr}"), received)
}

#[test]
fn spans_go_over_grpc_when_asked_from_a_command_or_a_daemon() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let (otlp, received) = rt.block_on(grpc_collector());

    // A command, asked by the environment (the collector's URL as is: no signal path).
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("w.yaml", &workflow(&server.url()));
    let out = output(
        traced(&db, &otlp)
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
            .arg("run")
            .arg(&file),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("not exported"), "{}", stderr(&out));
    let spans = received.spans();
    let run = one(&spans, "flow.run traced");
    let step = one(&spans, "flow.step pay");
    let client = one(&spans, "execute_tool refund");
    assert_eq!(step.parent_span_id, run.span_id);
    assert_eq!(client.parent_span_id, step.span_id);
    let expected = format!("00-{}-{}-01", hex(&client.trace_id), hex(&client.span_id));
    assert_eq!(
        server.log()[0].header("traceparent"),
        Some(expected.as_str())
    );
    for body in received.bodies() {
        let text = String::from_utf8_lossy(&body);
        assert!(!text.contains("s3cr3t"), "a secret was exported: {text}");
    }

    // A daemon, asked by flow.toml, exports in the background on its own runtime.
    let db = TestDb::new(Backend::Sqlite);
    db.write(
        "flow.toml",
        &format!("[telemetry]\notlp_endpoint = \"{otlp}\"\notlp_protocol = \"grpc\"\n"),
    );
    let file = db.write(
        "w.yaml",
        &workflow(&server.url()).replace("name: traced", "name: by_daemon"),
    );
    let submitted = output(db.flow().arg("submit").arg(&file));
    assert_eq!(submitted.status.code(), Some(0), "{}", stderr(&submitted));
    let mut daemon = crate::daemon::Daemon::start(
        &db,
        "d",
        &["--poll-interval", "100ms"],
        &[
            ("FLOW_SECRET_API_TOKEN", SECRET),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    crate::daemon::wait_until(Duration::from_secs(20), "the daemon's run span", || {
        !named(&received.spans(), "flow.run by_daemon").is_empty()
    });
    let spans = received.spans();
    daemon.signal("-TERM");
    let status = daemon.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
    assert!(!daemon.log().contains("panicked"), "{}", daemon.log());
    let run = one(&spans, "flow.run by_daemon");
    assert_eq!(attr(run, "flow.run.outcome").as_deref(), Some("succeeded"));

    // A gRPC collector that is down: the run neither fails nor waits for it.
    let down = format!("http://{}", crate::daemon::free_port());
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("w.yaml", &workflow(&server.url()));
    let started = Instant::now();
    let out = output(
        traced(&db, &down)
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
            // Far past the bound below: a run that waited for the export would take two
            // minutes, whatever the machine's load.
            .env("OTEL_EXPORTER_OTLP_TIMEOUT", "120000")
            .arg("run")
            .arg(&file),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert!(stderr(&out).contains("not exported"), "{}", stderr(&out));
}
