//! The tool-call state machine (`ledger/src/state.rs`, the crate docs' claim rules).

use std::time::Duration;

use flow_ledger::{
    CallClaim, CallOutcome, CallStatus, CompleteCall, Error, ErrorKind, StepError, StepFinish,
    StepStatus,
};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    claim_new_then_replay_succeeded,
    failed_is_replayed_unless_retry_failed,
    identity_reuse_is_a_conflict,
    live_claim_is_busy,
    released_claim_is_claimable_again,
    cross_run_key_replays_or_conflicts,
    complete_call_finishes_step_and_schedules_retry,
    call_output_over_the_limit_fails_permanently,
    mark_outbound_needs_live_leases,
    claim_needs_the_run_lease,
    renew_call_lease_is_fenced,
);

async fn claim_new_then_replay_succeeded(db: TestDb) {
    let w = worker("1");
    let run = running(&db, "run_a", &w).await;
    db.ledger
        .create_step(&run, step("pay", "pay", 0), db.now())
        .await
        .unwrap();
    let lease = claimed(
        db.ledger
            .claim_call(
                claim(&run, "pay", "pay", "refund-42", json!({"amount": 5})),
                db.now(),
            )
            .await
            .unwrap(),
    );
    assert_eq!(
        (lease.attempt, lease.key.as_str(), lease.token),
        (1, "refund-42:1", 1)
    );
    assert_eq!(lease.run_token, run.token);
    assert_eq!(lease.expires_at, db.now().plus(LEASE));
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(call.status, CallStatus::Claimed);
    assert_eq!(call.lease_holder.as_ref(), Some(&w));
    assert_eq!(call.request, json!({"amount": 5}));

    let t_out = db.advance(Duration::from_millis(3));
    db.ledger.mark_outbound(&lease, t_out).await.unwrap();
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(
        (call.status, call.outbound_started_at),
        (CallStatus::Outbound, Some(t_out))
    );
    let mut done = complete_ok(&lease, json!({"id": "rf_1"}));
    done.requests_sent = 2;
    db.ledger
        .complete_call(done, db.advance(Duration::from_millis(3)))
        .await
        .unwrap();

    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(call.status, CallStatus::Succeeded);
    assert_eq!((call.attempt_count, call.outbound_requests), (1, 2));
    assert_eq!(call.current_key, "refund-42:1");
    assert_eq!(call.output, Some(json!({"id": "rf_1"})));
    assert!(call.lease_holder.is_none());
    let attempts = db.ledger.list_attempts("run_a").await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(
        (
            attempts[0].sent_key.as_str(),
            attempts[0].outcome.as_str(),
            attempts[0].requests_sent
        ),
        ("refund-42:1", "succeeded", 2)
    );
    assert_eq!(attempts[0].outbound_started_at, Some(t_out));
    let usage = db.ledger.list_usage("run_a").await.unwrap();
    assert_eq!(usage.len(), 2);
    assert!(usage.iter().all(|u| u.sent_key == "refund-42:1"
        && u.kind == flow_ledger::UsageKind::Request
        && u.tool == "payments"));

    // Replayed, retry_failed or not: a success is never redone.
    for retry_failed in [false, true] {
        let mut req = claim(&run, "pay", "pay", "refund-42", json!({"amount": 5}));
        req.retry_failed = retry_failed;
        match db.ledger.claim_call(req, db.now()).await.unwrap() {
            CallClaim::Replay(r) => {
                assert_eq!(r.status, CallStatus::Succeeded);
                assert_eq!(r.output, Some(json!({"id": "rf_1"})));
                assert_eq!(
                    (r.from_run, r.attempt_count, r.outbound_requests),
                    (None, 1, 2)
                );
            }
            other => panic!("expected Replay, got {other:?}"),
        }
    }
    assert_eq!(
        db.ledger.list_steps("run_a").await.unwrap()[0]
            .tool_call_id
            .as_deref(),
        Some("pay")
    );
}

async fn fail_once(db: &TestDb, run: &flow_ledger::RunLease) -> flow_ledger::CallLease {
    db.ledger
        .create_step(run, step("pay", "pay", 0), db.now())
        .await
        .unwrap();
    let lease = claimed(
        db.ledger
            .claim_call(claim(run, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
    );
    db.ledger.mark_outbound(&lease, db.now()).await.unwrap();
    let err = StepError {
        kind: ErrorKind::Transient,
        message: "503".into(),
    };
    let done = CompleteCall {
        lease: &lease,
        outcome: CallOutcome::Failed(err),
        requests_sent: 1,
        step: None,
        next_step: None,
    };
    db.ledger.complete_call(done, db.now()).await.unwrap();
    lease
}

async fn failed_is_replayed_unless_retry_failed(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    fail_once(&db, &run).await;
    match db
        .ledger
        .claim_call(claim(&run, "pay", "pay", "k", json!({})), db.now())
        .await
        .unwrap()
    {
        CallClaim::Replay(r) => {
            assert_eq!(r.status, CallStatus::Failed);
            assert_eq!(
                r.error,
                Some(StepError {
                    kind: ErrorKind::Transient,
                    message: "503".into()
                })
            );
        }
        other => panic!("expected Replay, got {other:?}"),
    }
    db.ledger
        .create_step(&run, step("pay_retry1", "pay", 1), db.now())
        .await
        .unwrap();
    let mut req = claim(&run, "pay_retry1", "pay", "k", json!({}));
    req.retry_failed = true;
    let lease = claimed(db.ledger.claim_call(req, db.now()).await.unwrap());
    assert_eq!(
        (lease.attempt, lease.key.as_str(), lease.step_id.as_str()),
        (2, "k:2", "pay_retry1")
    );
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(
        (call.status, call.attempt_count, call.error_kind),
        (CallStatus::Claimed, 2, None)
    );
    db.ledger.mark_outbound(&lease, db.now()).await.unwrap();
    db.ledger
        .complete_call(complete_ok(&lease, json!(1)), db.now())
        .await
        .unwrap();
    let attempts = db.ledger.list_attempts("run_a").await.unwrap();
    let keys: Vec<_> = attempts
        .iter()
        .map(|a| (a.sent_key.as_str(), a.outcome.as_str()))
        .collect();
    assert_eq!(keys, [("k:1", "failed"), ("k:2", "succeeded")]);
    assert_eq!(
        db.ledger
            .get_call("run_a", "pay")
            .await
            .unwrap()
            .outbound_requests,
        2
    );
}

async fn identity_reuse_is_a_conflict(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    call_ok(&db, &run, "pay", "k", json!(1)).await;
    let base = || claim(&run, "pay", "pay", "k", json!({"n": "pay"}));
    let mut other_tool = base();
    other_tool.tool = "mailer".into();
    let mut other_key = base();
    other_key.idempotency_key = "k2".into();
    let mut other_req = base();
    other_req.request_hash = "sha256:other".into();
    for (req, needle) in [
        (other_tool, "tool"),
        (other_key, "key"),
        (other_req, "request"),
    ] {
        match db.ledger.claim_call(req, db.now()).await {
            Err(Error::Conflict {
                other_run,
                other_node,
                reason,
            }) => {
                assert_eq!((other_run.as_str(), other_node.as_str()), ("run_a", "pay"));
                assert!(reason.contains(needle), "{reason}");
            }
            other => panic!("expected Conflict, got {other:?}"),
        }
    }
    // Another node of the same run using the same key: a conflict too, never a raw
    // unique violation.
    match db
        .ledger
        .claim_call(
            claim(&run, "x", "other_node", "k", json!({"n": "pay"})),
            db.now(),
        )
        .await
    {
        Err(Error::Conflict { other_node, .. }) => assert_eq!(other_node, "pay"),
        other => panic!("expected Conflict, got {other:?}"),
    }
}

async fn live_claim_is_busy(db: TestDb) {
    let w = worker("1");
    let run = running(&db, "run_a", &w).await;
    let lease = claimed(
        db.ledger
            .claim_call(claim(&run, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
    );
    // The same worker claiming again (a second task): still Busy, never two senders.
    match db
        .ledger
        .claim_call(claim(&run, "pay", "pay", "k", json!({})), db.now())
        .await
    {
        Err(Error::Busy { holder, until }) => {
            assert_eq!(holder, w.as_str());
            assert_eq!(until, lease.expires_at);
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    db.ledger.mark_outbound(&lease, db.now()).await.unwrap();
    assert!(matches!(
        db.ledger
            .claim_call(claim(&run, "pay", "pay", "k", json!({})), db.now())
            .await,
        Err(Error::Busy { .. })
    ));
}

async fn released_claim_is_claimable_again(db: TestDb) {
    let (w1, w2) = (worker("1"), worker("2"));
    let r1 = running(&db, "run_a", &w1).await;
    let mut req = claim(&r1, "pay", "pay", "k", json!({}));
    req.lease = Duration::from_secs(600);
    let c1 = claimed(db.ledger.claim_call(req, db.now()).await.unwrap());
    db.ledger.release_call(&c1, db.now()).await.unwrap();
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(
        (
            call.status,
            call.lease_holder.as_ref(),
            call.lease_expires_at
        ),
        (CallStatus::Claimed, None, Some(db.now()))
    );
    assert!(matches!(
        db.ledger.mark_outbound(&c1, db.now()).await,
        Err(Error::LeaseLost)
    ));
    // Nothing blocks the next claim (same worker, or another after a run takeover).
    let c2 = claimed(
        db.ledger
            .claim_call(claim(&r1, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
    );
    assert_eq!((c2.attempt, c2.key.as_str()), (1, "k:1"));
    db.ledger.release_call(&c2, db.now()).await.unwrap();
    db.ledger.release_run(&r1, db.now()).await.unwrap();
    let r2 = db
        .ledger
        .claim_run("run_a", &w2, LEASE, db.now())
        .await
        .unwrap();
    let c3 = claimed(
        db.ledger
            .claim_call(claim(&r2, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
    );
    assert_eq!(c3.attempt, 1);
    assert!(
        db.ledger.list_attempts("run_a").await.unwrap().is_empty(),
        "a release is not an attempt"
    );
}

async fn cross_run_key_replays_or_conflicts(db: TestDb) {
    let w = worker("1");
    let ra = running(&db, "run_a", &w).await;
    let rb = running(&db, "run_b", &w).await;
    let rc = running(&db, "run_c", &w).await;
    // run_a's call is open: others with the same key and request wait.
    db.ledger
        .create_step(&ra, step("refund", "refund", 0), db.now())
        .await
        .unwrap();
    let ca = claimed(
        db.ledger
            .claim_call(
                claim(&ra, "refund", "refund", "refund-42", json!({"n": "refund"})),
                db.now(),
            )
            .await
            .unwrap(),
    );
    match db
        .ledger
        .claim_call(
            claim(&rb, "pay", "pay", "refund-42", json!({"n": "refund"})),
            db.now(),
        )
        .await
    {
        Err(Error::Busy { holder, .. }) => assert_eq!(holder, w.as_str()),
        other => panic!("expected Busy, got {other:?}"),
    }
    db.ledger.mark_outbound(&ca, db.now()).await.unwrap();
    db.ledger
        .complete_call(complete_ok(&ca, json!({"id": "rf_9"})), db.now())
        .await
        .unwrap();
    // Same key, same request: that call's outcome, from run_a.
    match db
        .ledger
        .claim_call(
            claim(&rb, "pay", "pay", "refund-42", json!({"n": "refund"})),
            db.now(),
        )
        .await
        .unwrap()
    {
        CallClaim::Replay(r) => {
            assert_eq!(r.from_run.as_deref(), Some("run_a"));
            assert_eq!(r.output, Some(json!({"id": "rf_9"})));
        }
        other => panic!("expected Replay, got {other:?}"),
    }
    // Same key, different request: a conflict naming the other run and node.
    match db
        .ledger
        .claim_call(
            claim(&rc, "pay", "pay", "refund-42", json!({"n": "different"})),
            db.now(),
        )
        .await
    {
        Err(Error::Conflict {
            other_run,
            other_node,
            reason,
        }) => {
            assert_eq!(
                (other_run.as_str(), other_node.as_str()),
                ("run_a", "refund")
            );
            assert!(reason.contains("different request"), "{reason}");
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert!(db.ledger.list_calls("run_b").await.unwrap().is_empty());
}

async fn complete_call_finishes_step_and_schedules_retry(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
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
    db.ledger.mark_outbound(&lease, db.now()).await.unwrap();
    let err = StepError {
        kind: ErrorKind::Transient,
        message: "HTTP 503".into(),
    };
    let backoff = db.now().plus(Duration::from_secs(2));
    let done = CompleteCall {
        lease: &lease,
        outcome: CallOutcome::Failed(err.clone()),
        requests_sent: 1,
        step: Some(StepFinish {
            step_id: "pay".into(),
            status: StepStatus::Failed,
            output: None,
            error: Some(err.clone()),
        }),
        next_step: Some(flow_ledger::NewStep {
            step_id: "pay_retry1".into(),
            node_id: "pay".into(),
            retry: 1,
            not_before: Some(backoff),
            status: StepStatus::Pending,
        }),
    };
    db.ledger.complete_call(done, db.now()).await.unwrap();
    let steps = db.ledger.list_steps("run_a").await.unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(
        (
            steps[0].status,
            steps[0].error_kind,
            steps[0].error_message.as_deref()
        ),
        (
            StepStatus::Failed,
            Some(ErrorKind::Transient),
            Some("HTTP 503")
        )
    );
    assert_eq!(
        (
            steps[1].step_id.as_str(),
            steps[1].status,
            steps[1].retry,
            steps[1].not_before
        ),
        ("pay_retry1", StepStatus::Pending, 1, Some(backoff))
    );
    assert_eq!(
        event_types(&db, "run_a").await,
        vec![
            "run.queued",
            "run.started",
            "step.started",
            "step.failed",
            "step.retry_scheduled"
        ]
    );
}

async fn call_output_over_the_limit_fails_permanently(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
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
    db.ledger.mark_outbound(&lease, db.now()).await.unwrap();
    let limit = db.ledger.output_limit_bytes();
    let big = json!("y".repeat(limit));
    let size = big.to_string().len();
    let mut done = complete_ok(&lease, big.clone());
    done.step = Some(StepFinish {
        step_id: "pay".into(),
        status: StepStatus::Succeeded,
        output: Some(big),
        error: None,
    });
    db.ledger.complete_call(done, db.now()).await.unwrap();
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(
        (call.status, call.error_kind, call.output),
        (CallStatus::Failed, Some(ErrorKind::Permanent), None)
    );
    let msg = call.error_message.unwrap();
    assert!(
        msg.contains(&limit.to_string()) && msg.contains(&size.to_string()),
        "{msg}"
    );
    let st = &db.ledger.list_steps("run_a").await.unwrap()[0];
    assert_eq!(
        (st.status, st.error_kind, st.output.as_ref()),
        (StepStatus::Failed, Some(ErrorKind::Permanent), None)
    );
    assert!(
        st.error_message
            .as_ref()
            .unwrap()
            .contains(&limit.to_string())
    );
}

async fn mark_outbound_needs_live_leases(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    let mut req = claim(&run, "pay", "pay", "k", json!({}));
    req.lease = Duration::from_secs(5);
    let lease = claimed(db.ledger.claim_call(req, db.now()).await.unwrap());
    // Call lease expired (nobody took over yet): sending now would race a takeover.
    db.clock.set(lease.expires_at);
    assert!(matches!(
        db.ledger.mark_outbound(&lease, db.now()).await,
        Err(Error::LeaseLost)
    ));
    // Renewed in time, but the run lease expired: refused too.
    db.clock.set(lease.expires_at.minus(Duration::from_secs(1)));
    db.ledger
        .renew_call_lease(&lease, Duration::from_secs(600), db.now())
        .await
        .unwrap();
    db.clock.set(run.expires_at);
    assert!(matches!(
        db.ledger.mark_outbound(&lease, db.now()).await,
        Err(Error::LeaseLost)
    ));
    db.ledger.heartbeat(&run, LEASE, db.now()).await.unwrap();
    db.ledger.mark_outbound(&lease, db.now()).await.unwrap();
    // Not twice.
    assert!(matches!(
        db.ledger.mark_outbound(&lease, db.now()).await,
        Err(Error::LeaseLost)
    ));
}

async fn claim_needs_the_run_lease(db: TestDb) {
    let (w1, w2) = (worker("1"), worker("2"));
    let r1 = running(&db, "run_a", &w1).await;
    db.clock.set(r1.expires_at);
    assert!(matches!(
        db.ledger
            .claim_call(claim(&r1, "pay", "pay", "k", json!({})), db.now())
            .await,
        Err(Error::LeaseLost)
    ));
    let r2 = db
        .ledger
        .claim_run("run_a", &w2, LEASE, db.now())
        .await
        .unwrap();
    db.ledger.heartbeat(&r2, LEASE, db.now()).await.unwrap();
    assert!(matches!(
        db.ledger
            .claim_call(claim(&r1, "pay", "pay", "k", json!({})), db.now())
            .await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        db.ledger
            .claim_call(claim(&r2, "pay", "pay", "k", json!({})), db.now())
            .await,
        Ok(CallClaim::Claimed(_))
    ));
}

async fn renew_call_lease_is_fenced(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    let mut req = claim(&run, "pay", "pay", "k", json!({}));
    req.lease = Duration::from_secs(5);
    let old = claimed(db.ledger.claim_call(req, db.now()).await.unwrap());
    let t = db.advance(Duration::from_secs(4));
    assert_eq!(
        db.ledger
            .renew_call_lease(&old, Duration::from_secs(5), t)
            .await
            .unwrap(),
        t.plus(Duration::from_secs(5))
    );
    db.clock.set(t.plus(Duration::from_secs(5)));
    let _new = claimed(
        db.ledger
            .claim_call(claim(&run, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
    );
    assert!(matches!(
        db.ledger.renew_call_lease(&old, LEASE, db.now()).await,
        Err(Error::LeaseLost)
    ));
}
