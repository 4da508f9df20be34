//! Operator resolution and pure calls.

use flow_ledger::{
    CallClaim, CallOutcome, CallStatus, Error, ErrorKind, EventFilter, EventType, PureCall,
    PureRecorded, Resolution, Resolve, RunLease, StepError, StepStatus, canonical_hash,
};
use serde_json::{Value, json};

use crate::common::*;

crate::conformance!(
    resolve_succeeded_records_who_when_how,
    resolve_failed_fails_the_step,
    resolve_retry_resends_the_same_key,
    resolve_only_from_in_doubt,
    a_finished_runs_call_settles_as_succeeded_or_failed_never_retry,
    settling_the_last_doubt_requeues_a_paused_run,
    pure_call_is_one_commit_and_replays,
    pure_call_failed_then_retry_failed,
);

async fn in_doubt(db: &TestDb) -> RunLease {
    let run = running(db, "run_a", &worker("1")).await;
    db.ledger
        .create_step(&run, step("pay", "pay", 0), db.now())
        .await
        .unwrap();
    let lease = claimed(
        db.ledger
            .claim_call(claim(&run, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
    );
    sent_then_in_doubt(db, &lease, "connection reset").await;
    db.ledger
        .pause_run(&run, "pay in doubt", db.now())
        .await
        .unwrap();
    run
}

/// A cancelled run's in-doubt call stays settleable: an operator who learns that the
/// money moved must be able to record it. `retry` is refused (nothing is left to send
/// it) and writes nothing; `succeeded` is recorded, audited and leaves the run cancelled.
async fn a_finished_runs_call_settles_as_succeeded_or_failed_never_retry(db: TestDb) {
    in_doubt(&db).await;
    db.ledger.request_cancel("run_a", db.now()).await.unwrap();
    let events_before = db.ledger.list_events(EventFilter::default()).await.unwrap();
    let err = db
        .ledger
        .resolve_call(resolve(Resolution::Retry), db.now())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Terminal {
                status: flow_ledger::RunStatus::Cancelled
            }
        ),
        "{err}"
    );
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!((call.status, call.resolution), (CallStatus::InDoubt, None));
    let events = db.ledger.list_events(EventFilter::default()).await.unwrap();
    assert_eq!(
        events.len(),
        events_before.len(),
        "a refused retry records nothing"
    );

    let call = db
        .ledger
        .resolve_call(
            resolve(Resolution::Succeeded(json!({"id": "rf_1"}))),
            db.now(),
        )
        .await
        .unwrap();
    assert_eq!(call.status, CallStatus::Succeeded);
    assert_eq!(call.resolved_by.as_deref(), Some("alice"));
    let run = db.ledger.get_run("run_a").await.unwrap();
    assert_eq!(
        run.status,
        flow_ledger::RunStatus::Cancelled,
        "the run stays as it ended"
    );
    let types = event_types(&db, "run_a").await;
    assert_eq!(
        types.last().map(String::as_str),
        Some("tool_call.resolved"),
        "{types:?}"
    );
    let left = db
        .ledger
        .list_in_doubt(flow_ledger::InDoubtFilter::default())
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// Settling the last doubt of a paused run puts it back on the queue in the same
/// transaction; settling one of two leaves it paused.
async fn settling_the_last_doubt_requeues_a_paused_run(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    for node in ["pay", "ship"] {
        db.ledger
            .create_step(&run, step(node, node, 0), db.now())
            .await
            .unwrap();
        let lease = claimed(
            db.ledger
                .claim_call(
                    claim(&run, node, node, &format!("k-{node}"), json!({})),
                    db.now(),
                )
                .await
                .unwrap(),
        );
        sent_then_in_doubt(&db, &lease, "connection reset").await;
    }
    db.ledger
        .pause_run(&run, "pay, ship in doubt", db.now())
        .await
        .unwrap();
    let mut first = resolve(Resolution::Retry);
    first.tool_call_id = "ship".into();
    db.ledger.resolve_call(first, db.now()).await.unwrap();
    let r = db.ledger.get_run("run_a").await.unwrap();
    assert_eq!(
        r.status,
        flow_ledger::RunStatus::Paused,
        "pay is still in doubt"
    );
    db.ledger
        .resolve_call(resolve(Resolution::Succeeded(json!({"id": 1}))), db.now())
        .await
        .unwrap();
    let r = db.ledger.get_run("run_a").await.unwrap();
    assert_eq!(
        r.status,
        flow_ledger::RunStatus::Queued,
        "nothing left in doubt"
    );
    let events = db
        .ledger
        .list_events(EventFilter {
            run_id: Some("run_a".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let queued = events
        .iter()
        .filter(|e| e.event_type == EventType::RunQueued && e.payload["requeued"] == json!(true))
        .collect::<Vec<_>>();
    assert_eq!(queued.len(), 1, "{events:?}");
    assert_eq!(queued[0].payload["by"], json!("alice"), "audited");
    // A daemon can take it now.
    let w = worker("2");
    let claimed = db
        .ledger
        .claim_next(
            flow_ledger::ClaimRuns {
                worker: &w,
                lease: LEASE,
                limit: 10,
            },
            db.now(),
        )
        .await
        .unwrap();
    let ids: Vec<_> = claimed.iter().map(|l| l.run_id.as_str()).collect();
    assert_eq!(ids, ["run_a"]);
}

fn resolve(resolution: Resolution) -> Resolve {
    Resolve {
        run_id: "run_a".into(),
        tool_call_id: "pay".into(),
        resolution,
        by: "alice".into(),
        note: Some("checked the PSP dashboard".into()),
    }
}

async fn resolve_succeeded_records_who_when_how(db: TestDb) {
    in_doubt(&db).await;
    let t = db.advance(std::time::Duration::from_secs(60));
    let call = db
        .ledger
        .resolve_call(resolve(Resolution::Succeeded(json!({"id": "rf_1"}))), t)
        .await
        .unwrap();
    assert_eq!(
        (call.status, call.output.clone()),
        (CallStatus::Succeeded, Some(json!({"id": "rf_1"})))
    );
    assert_eq!(call.resolution.as_deref(), Some("succeeded"));
    assert_eq!(call.resolved_by.as_deref(), Some("alice"));
    assert_eq!(call.resolved_at, Some(t));
    assert_eq!(
        call.resolution_note.as_deref(),
        Some("checked the PSP dashboard")
    );
    assert_eq!(call.finished_at, Some(t));
    assert_eq!(db.ledger.get_call("run_a", "pay").await.unwrap(), call);
    let st = &db.ledger.list_steps("run_a").await.unwrap()[0];
    assert_eq!(
        (st.status, st.output.clone()),
        (StepStatus::Succeeded, Some(json!({"id": "rf_1"})))
    );
    let events = db
        .ledger
        .list_events(EventFilter {
            run_id: Some("run_a".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let ev = events
        .iter()
        .find(|e| e.event_type == EventType::ToolCallResolved)
        .expect("resolved event");
    assert_eq!(
        (ev.payload["resolution"].as_str(), ev.payload["by"].as_str()),
        (Some("succeeded"), Some("alice"))
    );
    assert_eq!(ev.time, t);
    // Resuming replays it.
    let run = db
        .ledger
        .claim_run("run_a", &worker("2"), LEASE, db.now())
        .await
        .unwrap();
    assert!(matches!(
        db.ledger
            .claim_call(claim(&run, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
        CallClaim::Replay(_)
    ));
}

async fn resolve_failed_fails_the_step(db: TestDb) {
    in_doubt(&db).await;
    let call = db
        .ledger
        .resolve_call(
            resolve(Resolution::Failed("refund never arrived".into())),
            db.now(),
        )
        .await
        .unwrap();
    assert_eq!(
        (call.status, call.error_kind),
        (CallStatus::Failed, Some(ErrorKind::Permanent))
    );
    assert_eq!(call.error_message.as_deref(), Some("refund never arrived"));
    assert_eq!(call.resolution.as_deref(), Some("failed"));
    let st = &db.ledger.list_steps("run_a").await.unwrap()[0];
    assert_eq!(
        (st.status, st.error_message.as_deref()),
        (StepStatus::Failed, Some("refund never arrived"))
    );
    let types = event_types(&db, "run_a").await;
    assert!(
        types.ends_with(&[
            "step.failed".to_owned(),
            "tool_call.resolved".to_owned(),
            // Its last doubt settled, the paused run is back on the queue.
            "run.queued".to_owned()
        ]),
        "{types:?}"
    );
}

async fn resolve_retry_resends_the_same_key(db: TestDb) {
    in_doubt(&db).await;
    let call = db
        .ledger
        .resolve_call(resolve(Resolution::Retry), db.now())
        .await
        .unwrap();
    assert_eq!(
        (call.status, call.lease_holder.as_ref(), call.attempt_count),
        (CallStatus::Claimed, None, 1)
    );
    assert_eq!(call.resolution.as_deref(), Some("retry"));
    let st = &db.ledger.list_steps("run_a").await.unwrap()[0];
    assert_eq!(st.status, StepStatus::Pending);
    let run = db
        .ledger
        .claim_run("run_a", &worker("2"), LEASE, db.now())
        .await
        .unwrap();
    let lease = claimed(
        db.ledger
            .claim_call(claim(&run, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
    );
    assert_eq!((lease.attempt, lease.key.as_str()), (1, "k:1"));
    // Holding the claim, the step runs again (no separate start needed).
    assert_eq!(
        db.ledger.list_steps("run_a").await.unwrap()[0].status,
        StepStatus::Running
    );
    db.ledger.mark_outbound(&lease, db.now()).await.unwrap();
    db.ledger
        .complete_call(complete_ok(&lease, json!("ok")), db.now())
        .await
        .unwrap();
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(
        (call.status, call.outbound_requests, call.attempt_count),
        (CallStatus::Succeeded, 2, 1)
    );
    let attempts = db.ledger.list_attempts("run_a").await.unwrap();
    let got: Vec<_> = attempts
        .iter()
        .map(|a| (a.sent_key.as_str(), a.outcome.as_str()))
        .collect();
    assert_eq!(got, [("k:1", "unknown"), ("k:1", "succeeded")]);
}

async fn resolve_only_from_in_doubt(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    call_ok(&db, &run, "pay", "k", json!(1)).await;
    match db
        .ledger
        .resolve_call(resolve(Resolution::Retry), db.now())
        .await
    {
        Err(Error::InvalidTransition { from, .. }) => assert_eq!(from, "succeeded"),
        other => panic!("expected InvalidTransition, got {other:?}"),
    }
    let mut missing = resolve(Resolution::Retry);
    missing.tool_call_id = "nope".into();
    assert!(matches!(
        db.ledger.resolve_call(missing, db.now()).await,
        Err(Error::NotFound { .. })
    ));
}

fn pure<'a>(run: &'a RunLease, step_id: &str, retry: u32, outcome: CallOutcome) -> PureCall<'a> {
    let request = json!({"text": "hi"});
    PureCall {
        run,
        step: step(step_id, "shape", retry),
        tool_call_id: "shape".into(),
        tool: "core.echo".into(),
        idempotency_key: "run_a:shape".into(),
        request_hash: canonical_hash(&request),
        request,
        outcome,
        retry_failed: retry > 0,
        next_step: None,
    }
}

async fn pure_call_is_one_commit_and_replays(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    let got = db
        .ledger
        .record_pure_call(
            pure(&run, "shape", 0, CallOutcome::Succeeded(json!("hi"))),
            db.now(),
        )
        .await
        .unwrap();
    assert_eq!(got, PureRecorded::Recorded);
    let call = db.ledger.get_call("run_a", "shape").await.unwrap();
    assert_eq!(
        (call.status, call.attempt_count, call.outbound_requests),
        (CallStatus::Succeeded, 1, 0)
    );
    let st = &db.ledger.list_steps("run_a").await.unwrap()[0];
    assert_eq!(
        (st.status, st.output.clone(), st.tool_call_id.as_deref()),
        (StepStatus::Succeeded, Some(json!("hi")), Some("shape"))
    );
    assert_eq!(db.ledger.list_attempts("run_a").await.unwrap().len(), 1);
    assert!(
        db.ledger.list_usage("run_a").await.unwrap().is_empty(),
        "nothing left the process"
    );
    // A second record never overwrites a success: the stored outcome is replayed.
    let again = db
        .ledger
        .record_pure_call(
            pure(&run, "shape", 0, CallOutcome::Succeeded(json!("other"))),
            db.now(),
        )
        .await
        .unwrap();
    match again {
        PureRecorded::Replayed(r) => assert_eq!(r.output, Some(json!("hi"))),
        other => panic!("expected Replayed, got {other:?}"),
    }
    assert_eq!(
        db.ledger.get_call("run_a", "shape").await.unwrap().output,
        Some(json!("hi"))
    );
    assert_eq!(
        event_types(&db, "run_a").await,
        vec![
            "run.queued",
            "run.started",
            "step.started",
            "step.succeeded"
        ]
    );
}

async fn pure_call_failed_then_retry_failed(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    let err = StepError {
        kind: ErrorKind::Transient,
        message: "flaky".into(),
    };
    let mut first = pure(&run, "shape", 0, CallOutcome::Failed(err.clone()));
    first.next_step = Some(flow_ledger::NewStep {
        step_id: "shape_retry1".into(),
        node_id: "shape".into(),
        retry: 1,
        not_before: Some(db.now()),
        status: StepStatus::Pending,
    });
    db.ledger.record_pure_call(first, db.now()).await.unwrap();
    let steps = db.ledger.list_steps("run_a").await.unwrap();
    assert_eq!(
        (steps[0].status, steps[1].status),
        (StepStatus::Failed, StepStatus::Pending)
    );
    let got = db
        .ledger
        .record_pure_call(
            pure(
                &run,
                "shape_retry1",
                1,
                CallOutcome::Succeeded(Value::from(7)),
            ),
            db.now(),
        )
        .await
        .unwrap();
    assert_eq!(got, PureRecorded::Recorded);
    let call = db.ledger.get_call("run_a", "shape").await.unwrap();
    assert_eq!(
        (call.status, call.attempt_count, call.step_id.as_str()),
        (CallStatus::Succeeded, 2, "shape_retry1")
    );
    let steps = db.ledger.list_steps("run_a").await.unwrap();
    assert_eq!(steps[1].status, StepStatus::Succeeded);
}
