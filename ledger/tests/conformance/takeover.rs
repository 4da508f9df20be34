//! Takeovers: abandoned claims are taken over, abandoned outbound calls go in doubt.

use std::time::Duration;

use flow_ledger::{CallClaim, CallStatus, Error, ErrorKind, InDoubtReport, StepStatus};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    expired_claimed_is_taken_over_with_the_same_attempt,
    run_takeover_fences_the_old_call_holder,
    a_call_taken_over_in_doubt_keeps_its_old_holders_lease_end,
    expired_outbound_becomes_in_doubt_and_pauses_the_step,
    worker_reported_in_doubt,
);

async fn expired_claimed_is_taken_over_with_the_same_attempt(db: TestDb) {
    let w = worker("1");
    let run = running(&db, "run_a", &w).await;
    let mut req = claim(&run, "pay", "pay", "k", json!({}));
    req.lease = Duration::from_secs(5);
    let old = claimed(db.ledger.claim_call(req, db.now()).await.unwrap());
    db.clock.set(old.expires_at);
    let ack = db.ledger.heartbeat(&run, LEASE, db.now()).await.unwrap();
    assert!(ack.expires_at > db.now());
    let new = claimed(
        db.ledger
            .claim_call(claim(&run, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
    );
    assert_eq!((new.attempt, new.key.as_str()), (1, "k:1"));
    assert_eq!(new.token, old.token + 1);
    // The old claim can neither send nor record.
    assert!(matches!(
        db.ledger.mark_outbound(&old, db.now()).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        db.ledger.release_call(&old, db.now()).await,
        Err(Error::LeaseLost)
    ));
    db.ledger.mark_outbound(&new, db.now()).await.unwrap();
    assert!(db.ledger.list_attempts("run_a").await.unwrap().is_empty());
}

async fn run_takeover_fences_the_old_call_holder(db: TestDb) {
    let (w1, w2) = (worker("1"), worker("2"));
    let r1 = running(&db, "run_a", &w1).await;
    let mut req = claim(&r1, "pay", "pay", "k", json!({}));
    req.lease = Duration::from_secs(600);
    let c1 = claimed(db.ledger.claim_call(req, db.now()).await.unwrap());
    db.clock.set(r1.expires_at);
    let r2 = db
        .ledger
        .claim_run("run_a", &w2, LEASE, db.now())
        .await
        .unwrap();
    // The call lease is still live, but it was claimed under an older run token.
    let c2 = claimed(
        db.ledger
            .claim_call(claim(&r2, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
    );
    assert_eq!((c2.attempt, c2.run_token), (1, r2.token));
    assert!(matches!(
        db.ledger.mark_outbound(&c1, db.now()).await,
        Err(Error::LeaseLost)
    ));
    db.ledger.mark_outbound(&c2, db.now()).await.unwrap();
    assert!(matches!(
        db.ledger
            .complete_call(complete_ok(&c1, json!(1)), db.now())
            .await,
        Err(Error::LeaseLost)
    ));
    db.ledger
        .complete_call(complete_ok(&c2, json!(2)), db.now())
        .await
        .unwrap();
    assert_eq!(
        db.ledger.get_call("run_a", "pay").await.unwrap().output,
        Some(json!(2))
    );
}

/// The run was taken over while its worker's call lease still ran (that worker is not
/// known to be dead, only late): the call goes in doubt keeping that lease's end, which
/// a person resolving it is shown and must wait for, with no holder and a new token so
/// the old holder can neither renew nor record.
async fn a_call_taken_over_in_doubt_keeps_its_old_holders_lease_end(db: TestDb) {
    let (w1, w2) = (worker("1"), worker("2"));
    let r1 = running(&db, "run_a", &w1).await;
    db.ledger
        .create_step(&r1, step("pay", "pay", 0), db.now())
        .await
        .unwrap();
    let mut req = claim(&r1, "pay", "pay", "k", json!({}));
    req.lease = Duration::from_secs(600);
    let c1 = claimed(db.ledger.claim_call(req, db.now()).await.unwrap());
    db.ledger.mark_outbound(&c1, db.now()).await.unwrap();
    db.clock.set(r1.expires_at);
    let r2 = db
        .ledger
        .claim_run("run_a", &w2, LEASE, db.now())
        .await
        .unwrap();
    let t = db.now();
    let found = db
        .ledger
        .claim_call(claim(&r2, "pay", "pay", "k", json!({})), t)
        .await
        .unwrap();
    assert_eq!(found, CallClaim::InDoubt { since: t });
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(call.status, CallStatus::InDoubt);
    assert_eq!(call.lease_holder, None);
    let kept = call
        .lease_expires_at
        .expect("the old holder's lease end is kept");
    assert!(
        kept > t,
        "its lease ran past the takeover: {kept:?} vs {t:?}"
    );
    assert!(matches!(
        db.ledger
            .complete_call(complete_ok(&c1, json!(1)), db.now())
            .await,
        Err(Error::LeaseLost)
    ));
}

async fn expired_outbound_becomes_in_doubt_and_pauses_the_step(db: TestDb) {
    let (w1, w2) = (worker("1"), worker("2"));
    let r1 = running(&db, "run_a", &w1).await;
    db.ledger
        .create_step(&r1, step("pay", "pay", 0), db.now())
        .await
        .unwrap();
    let c1 = claimed(
        db.ledger
            .claim_call(claim(&r1, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
    );
    let t_out = db.now();
    db.ledger.mark_outbound(&c1, t_out).await.unwrap();
    // The worker dies; its run lease expires; another worker resumes the run.
    db.clock.set(r1.expires_at);
    let r2 = db
        .ledger
        .claim_run("run_a", &w2, LEASE, db.now())
        .await
        .unwrap();
    let t = db.now();
    assert_eq!(
        db.ledger
            .claim_call(claim(&r2, "pay", "pay", "k", json!({})), t)
            .await
            .unwrap(),
        CallClaim::InDoubt { since: t }
    );
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(
        (call.status, call.in_doubt_at, call.attempt_count),
        (CallStatus::InDoubt, Some(t), 1)
    );
    assert_eq!(call.outbound_started_at, Some(t_out));
    let steps = db.ledger.list_steps("run_a").await.unwrap();
    assert_eq!(steps[0].status, StepStatus::Paused);
    let attempts = db.ledger.list_attempts("run_a").await.unwrap();
    assert_eq!(
        (
            attempts.len(),
            attempts[0].outcome.as_str(),
            attempts[0].sent_key.as_str()
        ),
        (1, "unknown", "k:1")
    );
    let events = db
        .ledger
        .list_events(flow_ledger::EventFilter {
            run_id: Some("run_a".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let ev = events
        .iter()
        .find(|e| e.event_type == flow_ledger::EventType::ToolCallInDoubt)
        .expect("in_doubt event");
    assert_eq!(
        (ev.tool_call_id.as_deref(), ev.step_id.as_deref()),
        (Some("pay"), Some("pay"))
    );
    assert_eq!(ev.payload["key"], "k:1");
    // Claiming again keeps saying in doubt (never re-sent), with the original time.
    let later = db.advance(Duration::from_secs(1));
    assert_eq!(
        db.ledger
            .claim_call(claim(&r2, "pay", "pay", "k", json!({})), later)
            .await
            .unwrap(),
        CallClaim::InDoubt { since: t }
    );
    let mut retry = claim(&r2, "pay", "pay", "k", json!({}));
    retry.retry_failed = true;
    assert!(matches!(
        db.ledger.claim_call(retry, later).await.unwrap(),
        CallClaim::InDoubt { .. }
    ));
    // The dead worker's late outcome is refused.
    assert!(matches!(
        db.ledger
            .complete_call(complete_ok(&c1, json!(1)), later)
            .await,
        Err(Error::LeaseLost)
    ));
}

async fn worker_reported_in_doubt(db: TestDb) {
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
    let report = InDoubtReport {
        requests_sent: 1,
        message: "timed out after 30s".into(),
    };
    db.ledger
        .mark_in_doubt(&lease, report.clone(), db.now())
        .await
        .unwrap();
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(
        (call.status, call.outbound_requests),
        (CallStatus::InDoubt, 1)
    );
    assert_eq!(
        (call.error_kind, call.error_message.as_deref()),
        (Some(ErrorKind::Unknown), Some("timed out after 30s"))
    );
    assert_eq!(
        db.ledger.list_steps("run_a").await.unwrap()[0].status,
        StepStatus::Paused
    );
    assert_eq!(db.ledger.list_usage("run_a").await.unwrap().len(), 1);
    assert_eq!(
        db.ledger.list_attempts("run_a").await.unwrap()[0].outcome,
        flow_ledger::AttemptOutcome::Unknown
    );
    assert!(
        event_types(&db, "run_a")
            .await
            .contains(&"tool_call.in_doubt".to_owned())
    );
    // Only once: the lease is gone.
    assert!(matches!(
        db.ledger.mark_in_doubt(&lease, report, db.now()).await,
        Err(Error::LeaseLost)
    ));
}
