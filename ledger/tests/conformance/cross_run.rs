//! The same idempotency key in two runs: one effect, replayed or waited on, never twice.

use flow_ledger::{
    CallClaim, CallOutcome, InDoubtReport, PureCall, PureRecorded, StepStatus, canonical_hash,
};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    another_runs_in_doubt_call_pauses_this_step,
    pure_calls_replay_across_runs,
);

async fn another_runs_in_doubt_call_pauses_this_step(db: TestDb) {
    let w = worker("1");
    let ra = running(&db, "run_a", &w).await;
    let rb = running(&db, "run_b", &w).await;
    db.ledger
        .create_step(&ra, step("refund", "refund", 0), db.now())
        .await
        .unwrap();
    let req = || json!({"order": 42});
    let ca = claimed(
        db.ledger
            .claim_call(claim(&ra, "refund", "refund", "refund-42", req()), db.now())
            .await
            .unwrap(),
    );
    db.ledger.mark_outbound(&ca, db.now()).await.unwrap();
    let t = db.now();
    let report = InDoubtReport {
        requests_sent: 1,
        message: "timeout".into(),
    };
    db.ledger.mark_in_doubt(&ca, report, t).await.unwrap();

    db.ledger
        .create_step(&rb, step("pay", "pay", 0), db.now())
        .await
        .unwrap();
    let later = db.advance(std::time::Duration::from_secs(5));
    assert_eq!(
        db.ledger
            .claim_call(claim(&rb, "pay", "pay", "refund-42", req()), later)
            .await
            .unwrap(),
        CallClaim::InDoubt { since: t }
    );
    let st = &db.ledger.list_steps("run_b").await.unwrap()[0];
    assert_eq!(
        (st.status, st.tool_call_id.as_deref()),
        (StepStatus::Paused, Some("pay"))
    );
    // run_b has no call row of its own: the effect belongs to run_a's call.
    assert!(db.ledger.list_calls("run_b").await.unwrap().is_empty());
}

fn pure<'a>(run: &'a flow_ledger::RunLease, key: &str, text: &str) -> PureCall<'a> {
    let request = json!({ "text": text });
    PureCall {
        run,
        step: step("shape", "shape", 0),
        tool_call_id: "shape".into(),
        tool: "core.echo".into(),
        idempotency_key: key.into(),
        request_hash: canonical_hash(&request),
        request,
        outcome: CallOutcome::Succeeded(json!(text)),
        retry_failed: false,
        next_step: None,
    }
}

async fn pure_calls_replay_across_runs(db: TestDb) {
    let w = worker("1");
    let ra = running(&db, "run_a", &w).await;
    let rb = running(&db, "run_b", &w).await;
    let rc = running(&db, "run_c", &w).await;
    assert_eq!(
        db.ledger
            .record_pure_call(pure(&ra, "greet", "hi"), db.now())
            .await
            .unwrap(),
        PureRecorded::Recorded
    );
    match db
        .ledger
        .record_pure_call(pure(&rb, "greet", "hi"), db.now())
        .await
        .unwrap()
    {
        PureRecorded::Replayed(r) => {
            assert_eq!(r.from_run.as_deref(), Some("run_a"));
            assert_eq!(r.output, Some(json!("hi")));
        }
        other => panic!("expected Replayed, got {other:?}"),
    }
    let st = &db.ledger.list_steps("run_b").await.unwrap()[0];
    assert_eq!(
        (st.status, st.output.clone()),
        (StepStatus::Succeeded, Some(json!("hi")))
    );
    match db
        .ledger
        .record_pure_call(pure(&rc, "greet", "other"), db.now())
        .await
    {
        Err(flow_ledger::Error::Conflict {
            other_run,
            other_node,
            ..
        }) => {
            assert_eq!(
                (other_run.as_str(), other_node.as_str()),
                ("run_a", "shape")
            );
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    // The refused record changed nothing in run_c.
    assert!(db.ledger.list_steps("run_c").await.unwrap().is_empty());
}
