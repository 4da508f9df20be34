//! The outbox: events are written with their state change, never without it.

use flow_ledger::{Error, Event, EventFilter, EventType, RunFinish, RunStatus};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    a_run_lifecycle_writes_its_events,
    refused_changes_write_no_events,
    events_page_by_sequence
);

async fn a_run_lifecycle_writes_its_events(db: TestDb) {
    let w = worker("1");
    let run = running(&db, "run_a", &w).await;
    call_ok(&db, &run, "pay", "k", json!({"id": 1})).await;
    let fin = RunFinish {
        status: RunStatus::Succeeded,
        output: Some(json!(1)),
        error: None,
    };
    db.ledger.finish_run(&run, fin, db.now()).await.unwrap();
    let events = db
        .ledger
        .list_events(EventFilter {
            run_id: Some("run_a".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let types: Vec<_> = events.iter().map(|e| e.event_type).collect();
    assert_eq!(
        types,
        [
            EventType::RunQueued,
            EventType::RunStarted,
            EventType::StepStarted,
            EventType::RunSucceeded
        ]
    );
    for e in &events {
        assert!(e.id.starts_with("evt_") && e.id.len() == 30, "{}", e.id);
        assert_eq!(e.run_id.as_deref(), Some("run_a"));
        assert_eq!(e.time, db.now());
    }
    assert_eq!(events[1].payload["worker"], w.as_str());
    assert_eq!(events[2].step_id.as_deref(), Some("pay"));
    // Events serialize with their dotted type and an RFC 3339 time.
    let v = serde_json::to_value(&events[0]).unwrap();
    assert_eq!(v["type"], "run.queued");
    assert_eq!(v["time"], T0.to_rfc3339());
    let back: Event = serde_json::from_value(v).unwrap();
    assert_eq!(back, events[0]);
    let ids: std::collections::HashSet<_> = events.iter().map(|e| &e.id).collect();
    assert_eq!(ids.len(), events.len());
}

async fn refused_changes_write_no_events(db: TestDb) {
    let (w1, w2) = (worker("1"), worker("2"));
    let r1 = running(&db, "run_a", &w1).await;
    db.clock.set(r1.expires_at);
    let r2 = db
        .ledger
        .claim_run("run_a", &w2, LEASE, db.now())
        .await
        .unwrap();
    let before = event_types(&db, "run_a").await;
    let fin = RunFinish {
        status: RunStatus::Failed,
        output: None,
        error: None,
    };
    assert!(matches!(
        db.ledger.finish_run(&r1, fin, db.now()).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        db.ledger.pause_run(&r1, "x", db.now()).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        db.ledger
            .create_step(&r1, step("a", "a", 0), db.now())
            .await,
        Err(Error::LeaseLost)
    ));
    // A conflicting enqueue writes nothing either.
    let mut other = new_run("run_a");
    other.workflow_text = "name: x\n".into();
    assert!(db.ledger.enqueue(other, db.now()).await.is_err());
    assert_eq!(event_types(&db, "run_a").await, before);
    db.ledger.pause_run(&r2, "x", db.now()).await.unwrap();
    assert_eq!(
        event_types(&db, "run_a").await.last().unwrap(),
        "run.paused"
    );
}

async fn events_page_by_sequence(db: TestDb) {
    for i in 0..5 {
        db.ledger
            .enqueue(new_run(&format!("run_{i}")), db.now())
            .await
            .unwrap();
    }
    let first = db
        .ledger
        .list_events(EventFilter {
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(first.len(), 2);
    let rest = db
        .ledger
        .list_events(EventFilter {
            after_seq: Some(first[1].seq),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rest.len(), 3);
    assert!(rest.iter().all(|e| e.seq > first[1].seq));
    let runs: Vec<_> = first
        .iter()
        .chain(&rest)
        .map(|e| e.run_id.clone().unwrap())
        .collect();
    assert_eq!(runs, ["run_0", "run_1", "run_2", "run_3", "run_4"]);
}
