//! Remote tasks: a call whose downstream started a task (its id recorded while the call
//! is outbound) is collected by its next holder instead of going in doubt; the id is
//! fenced like every holder write; a fresh send forgets it.

use flow_ledger::{CallClaim, CallStatus, Error};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    a_recorded_task_is_collected_after_the_holder_dies,
    a_released_task_call_is_collected_by_the_same_run,
    task_writes_are_fenced_and_need_an_outbound_call,
    a_fresh_send_forgets_the_task_of_an_earlier_one,
    an_elicitation_is_an_event_on_its_call,
);

/// The `pay` call of `run` (key `k`), claimed.
async fn claim_pay(db: &TestDb, run: &flow_ledger::RunLease) -> flow_ledger::CallLease {
    claimed(
        db.ledger
            .claim_call(claim(run, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
    )
}

/// Worker 1 sends, records the task and dies; worker 2's claim takes the call over
/// still outbound with the task (no in doubt, same key), and completes it.
async fn a_recorded_task_is_collected_after_the_holder_dies(db: TestDb) {
    let (w1, w2) = (worker("1"), worker("2"));
    let r1 = running(&db, "run_a", &w1).await;
    let c1 = claim_pay(&db, &r1).await;
    db.ledger.mark_outbound(&c1, db.now()).await.unwrap();
    db.ledger
        .record_task(&c1, "task-1", db.now())
        .await
        .unwrap();
    assert_eq!(
        db.ledger
            .get_call("run_a", "pay")
            .await
            .unwrap()
            .remote_task,
        Some("task-1".into())
    );
    db.clock.set(r1.expires_at);
    let r2 = db
        .ledger
        .claim_run("run_a", &w2, LEASE, db.now())
        .await
        .unwrap();
    let c2 = claim_pay(&db, &r2).await;
    assert_eq!(c2.remote_task.as_deref(), Some("task-1"));
    assert_eq!((c2.attempt, c2.key.as_str(), c2.prior_sends), (1, "k:1", 1));
    assert!(c2.token > c1.token);
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(call.status, CallStatus::Outbound);
    assert_eq!(call.in_doubt_at, None);
    // The dead holder is fenced out; the collector completes.
    assert!(matches!(
        db.ledger.record_task(&c1, "task-x", db.now()).await,
        Err(Error::LeaseLost)
    ));
    db.ledger
        .complete_call(complete_ok(&c2, json!({"done": true})), db.now())
        .await
        .unwrap();
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(call.status, CallStatus::Succeeded);
    let types = event_types(&db, "run_a").await;
    assert!(
        types.contains(&"tool_call.task_started".to_owned()),
        "{types:?}"
    );
    assert!(
        !types.contains(&"tool_call.in_doubt".to_owned()),
        "{types:?}"
    );
}

/// A holder whose time ran out while the task works lets the call go; the same run's
/// next claim collects it.
async fn a_released_task_call_is_collected_by_the_same_run(db: TestDb) {
    let w = worker("1");
    let run = running(&db, "run_a", &w).await;
    let c1 = claim_pay(&db, &run).await;
    db.ledger.mark_outbound(&c1, db.now()).await.unwrap();
    db.ledger
        .record_task(&c1, "task-2", db.now())
        .await
        .unwrap();
    db.ledger.release_task(&c1, db.now()).await.unwrap();
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(
        (call.status, call.lease_holder),
        (CallStatus::Outbound, None)
    );
    let c2 = claim_pay(&db, &run).await;
    assert_eq!(c2.remote_task.as_deref(), Some("task-2"));
    // The released lease can no longer write.
    assert!(matches!(
        db.ledger.release_task(&c1, db.now()).await,
        Err(Error::LeaseLost)
    ));
}

/// No task on a call that is not outbound, and no release of a call without one.
async fn task_writes_are_fenced_and_need_an_outbound_call(db: TestDb) {
    let w = worker("1");
    let run = running(&db, "run_a", &w).await;
    let c = claim_pay(&db, &run).await;
    // Claimed, not yet outbound: nothing can have started a task.
    assert!(matches!(
        db.ledger.record_task(&c, "task-3", db.now()).await,
        Err(Error::LeaseLost)
    ));
    db.ledger.mark_outbound(&c, db.now()).await.unwrap();
    assert!(matches!(
        db.ledger.release_task(&c, db.now()).await,
        Err(Error::InvalidTransition { .. })
    ));
    // Nothing changed: the call is still held and outbound, with no task.
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(call.status, CallStatus::Outbound);
    assert_eq!(call.remote_task, None);
    assert!(call.lease_holder.is_some());
}

/// An in-doubt call re-sent by an operator's `retry` starts over: the old task id is
/// forgotten at the new outbound mark, so a crash then is in doubt, not a collection
/// of the old task.
async fn a_fresh_send_forgets_the_task_of_an_earlier_one(db: TestDb) {
    let (w1, w2) = (worker("1"), worker("2"));
    let r1 = running(&db, "run_a", &w1).await;
    let c1 = claim_pay(&db, &r1).await;
    db.ledger.mark_outbound(&c1, db.now()).await.unwrap();
    db.ledger
        .record_task(&c1, "task-4", db.now())
        .await
        .unwrap();
    db.ledger
        .mark_in_doubt(
            &c1,
            flow_ledger::InDoubtReport {
                requests_sent: 1,
                message: "the server no longer knows the task".into(),
            },
            db.now(),
        )
        .await
        .unwrap();
    db.ledger
        .resolve_call(
            flow_ledger::Resolve {
                run_id: "run_a".into(),
                tool_call_id: "pay".into(),
                resolution: flow_ledger::Resolution::Retry,
                by: "alice".into(),
                note: None,
            },
            db.now(),
        )
        .await
        .unwrap();
    let c2 = claim_pay(&db, &r1).await;
    assert_eq!(c2.remote_task, None);
    db.ledger.mark_outbound(&c2, db.now()).await.unwrap();
    assert_eq!(
        db.ledger
            .get_call("run_a", "pay")
            .await
            .unwrap()
            .remote_task,
        None
    );
    db.clock.set(r1.expires_at);
    let r2 = db
        .ledger
        .claim_run("run_a", &w2, LEASE, db.now())
        .await
        .unwrap();
    assert!(matches!(
        db.ledger
            .claim_call(claim(&r2, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
        CallClaim::InDoubt { .. }
    ));
}

/// An elicitation is written as an event on the call, fenced by its lease.
async fn an_elicitation_is_an_event_on_its_call(db: TestDb) {
    let w = worker("1");
    let run = running(&db, "run_a", &w).await;
    let c = claim_pay(&db, &run).await;
    db.ledger.mark_outbound(&c, db.now()).await.unwrap();
    let record = json!({"message": "who?", "action": "decline", "decided_by": "policy decline"});
    db.ledger
        .record_elicitation(&c, record.clone(), db.now())
        .await
        .unwrap();
    let events = db
        .ledger
        .list_events(flow_ledger::EventFilter {
            run_id: Some("run_a".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let elicited: Vec<_> = events
        .iter()
        .filter(|e| e.event_type == flow_ledger::EventType::ToolCallElicited)
        .collect();
    assert_eq!(elicited.len(), 1);
    assert_eq!(elicited[0].tool_call_id.as_deref(), Some("pay"));
    assert_eq!(elicited[0].payload, record);
    db.ledger
        .complete_call(complete_ok(&c, json!(1)), db.now())
        .await
        .unwrap();
    // Once the call is settled its lease is gone: nothing more is recorded on it.
    assert!(matches!(
        db.ledger.record_elicitation(&c, record, db.now()).await,
        Err(Error::LeaseLost)
    ));
}
