//! Reconciliation in a trace: a probe of an in-doubt call and the resolution it makes
//! are spans of their own, linked to the call's CLIENT span (which ended at the doubt).

use flow_adapters::testkit::http::CountingServer;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;

use super::{attr, collector, event_attr, hex, ids, one, traced};
use crate::support::{Backend, TestDb, output, runtime, stderr};

#[test]
fn a_probe_and_the_resolution_it_makes_are_spans_linked_to_the_call_in_doubt() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let (otlp, received) = rt.block_on(collector(false));
    let db = TestDb::new(Backend::Sqlite);
    let text =
        crate::reconcile::workflow(&server.url(), &crate::reconcile::effects(&server), "0s", 3);
    let file = db.write("pay.yaml", &text);
    // Killed after the request left: in doubt, and the downstream has the effect.
    let crashed = output(
        traced(&db, &otlp)
            .arg("run")
            .arg(&file)
            .env("FLOW_FAULT", "after_response:charge"),
    );
    assert_eq!(crashed.status.code(), None, "{}", stderr(&crashed));
    let run = crate::support::run_id(&crashed);
    let sent = server.log()[0]
        .header("traceparent")
        .expect("the send was traced")
        .to_owned();
    let (_, call_span) = ids(&sent);

    // The resume probes, finds the effect, settles the call and finishes the run.
    let out = output(traced(&db, &otlp).args(["resume", &run]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let spans = received.spans();
    let probe = one(&spans, "flow.probe pay");
    assert_eq!(probe.kind, SpanKind::Client as i32);
    assert_eq!(
        attr(probe, "flow.call.key"),
        Some(format!("{run}:charge:1"))
    );
    assert_eq!(
        event_attr(probe, "probe", "flow.probe.observed").as_deref(),
        Some("found")
    );
    assert_eq!(
        event_attr(probe, "probe", "flow.probe.decision").as_deref(),
        Some("succeed")
    );
    assert_eq!(
        event_attr(probe, "probe", "http.response.status_code").as_deref(),
        Some("200")
    );
    assert!(
        probe.links.iter().any(|l| hex(&l.span_id) == call_span),
        "{:?}",
        probe.links
    );
    let settled = one(&spans, "flow.resolve charge");
    assert_eq!(
        settled.parent_span_id, probe.span_id,
        "settled by that probe"
    );
    assert_eq!(
        event_attr(settled, "resolved", "flow.resolution").as_deref(),
        Some("succeeded")
    );
    assert_eq!(
        event_attr(settled, "resolved", "flow.resolved.by").as_deref(),
        Some("reconcile")
    );
    assert!(settled.links.iter().any(|l| hex(&l.span_id) == call_span));
    // The probe ran inside the resumed segment.
    let segment = one(&spans, "flow.run pay");
    assert_eq!(probe.parent_span_id, segment.span_id);
}
