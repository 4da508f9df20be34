//! Concurrency slots (`slots.rs`): at most N calls of a limit between the outbound mark
//! and their outcome; in doubt keeps a slot; waiters are served oldest first; a freed
//! slot wakes the oldest waiter's parked run; concurrent marks never exceed the limit.

use std::time::Duration;

use flow_ledger::{CallLease, InDoubtReport, RunLease, Slot, SlotMark, SlotUse};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    a_limit_counts_calls_in_flight_and_in_doubt,
    waiters_are_served_oldest_first_and_a_freed_slot_wakes_the_next,
    concurrent_marks_never_exceed_the_limit,
    a_hold_off_lasts_until_its_latest_end,
    a_waiting_call_says_why_until_it_is_marked,
);

fn ops() -> flow_ledger::Actor {
    flow_ledger::Actor {
        by: "ops".into(),
        reason: Some("the SMS provider dropped it".into()),
    }
}

fn slot(limit: u32) -> Slot {
    Slot {
        key: "wf/sms".into(),
        limit,
    }
}

/// A running run `run_id` with its step `send` and a claimed call.
async fn waiting_call(db: &TestDb, run_id: &str) -> (RunLease, CallLease) {
    let run = running(db, run_id, &worker(run_id)).await;
    db.ledger
        .create_step(&run, step("send", "send", 0), db.now())
        .await
        .unwrap();
    let call = claim_send(db, &run).await;
    (run, call)
}

async fn claim_send(db: &TestDb, run: &RunLease) -> CallLease {
    let key = format!("{}:send", run.run_id);
    claimed(
        db.ledger
            .claim_call(claim(run, "send", "send", &key, json!({})), db.now())
            .await
            .unwrap(),
    )
}

async fn mark(db: &TestDb, call: &CallLease, limit: u32) -> SlotMark {
    db.ledger
        .mark_outbound_in_slot(call, &slot(limit), db.now())
        .await
        .unwrap()
}

async fn a_limit_counts_calls_in_flight_and_in_doubt(db: TestDb) {
    let (_, a) = waiting_call(&db, "run_a").await;
    let (_, b) = waiting_call(&db, "run_b").await;
    let (run_c, c) = waiting_call(&db, "run_c").await;
    assert_eq!(mark(&db, &a, 2).await, SlotMark::Marked);
    assert_eq!(mark(&db, &b, 2).await, SlotMark::Marked);
    assert_eq!(
        mark(&db, &c, 2).await,
        SlotMark::Full {
            in_use: 2,
            ahead: 0
        }
    );
    // The refused call was let go: it can neither send nor be marked under that claim.
    assert!(db.ledger.mark_outbound(&c, db.now()).await.is_err());
    // b's outcome is lost: in doubt, it keeps its slot.
    let report = InDoubtReport {
        requests_sent: 1,
        message: "timed out".into(),
    };
    db.ledger.mark_in_doubt(&b, report, db.now()).await.unwrap();
    // a succeeds: its slot is free for c.
    db.ledger
        .complete_call(complete_ok(&a, json!({})), db.now())
        .await
        .unwrap();
    assert_eq!(
        db.ledger.slot_use(db.now()).await.unwrap(),
        vec![SlotUse {
            key: "wf/sms".into(),
            in_flight: 0,
            in_doubt: 1,
            waiting: 1
        }]
    );
    let c = claim_send(&db, &run_c).await;
    assert_eq!(mark(&db, &c, 2).await, SlotMark::Marked);
    // Now the limit is full again: c in flight, b in doubt. An operator releases b's.
    let (run_d, d) = waiting_call(&db, "run_d").await;
    assert!(matches!(
        mark(&db, &d, 2).await,
        SlotMark::Full { in_use: 2, .. }
    ));
    assert!(
        db.ledger
            .release_slot("run_b", "send", &ops(), db.now())
            .await
            .unwrap()
    );
    assert!(
        !db.ledger
            .release_slot("run_b", "send", &ops(), db.now())
            .await
            .unwrap()
    );
    // A call not in doubt cannot have its slot released that way.
    assert!(
        !db.ledger
            .release_slot("run_c", "send", &ops(), db.now())
            .await
            .unwrap()
    );
    assert!(
        event_types(&db, "run_b")
            .await
            .contains(&"tool_call.slot_released".to_string())
    );
    let d = claim_send(&db, &run_d).await;
    assert_eq!(mark(&db, &d, 2).await, SlotMark::Marked);
    // A limit of another key is independent.
    let (_, e) = waiting_call(&db, "run_e").await;
    let other = Slot {
        key: "wf/email".into(),
        limit: 1,
    };
    assert_eq!(
        db.ledger
            .mark_outbound_in_slot(&e, &other, db.now())
            .await
            .unwrap(),
        SlotMark::Marked
    );
}

async fn waiters_are_served_oldest_first_and_a_freed_slot_wakes_the_next(db: TestDb) {
    let (_, a) = waiting_call(&db, "run_a").await;
    assert_eq!(mark(&db, &a, 1).await, SlotMark::Marked);
    let (run_b, b) = waiting_call(&db, "run_b").await;
    assert!(matches!(
        mark(&db, &b, 1).await,
        SlotMark::Full { ahead: 0, .. }
    ));
    db.advance(Duration::from_secs(1));
    let (run_c, c) = waiting_call(&db, "run_c").await;
    assert_eq!(
        mark(&db, &c, 1).await,
        SlotMark::Full {
            in_use: 1,
            ahead: 1
        }
    );
    // b's run parks on the queue for a while.
    let later = db.now().plus(Duration::from_secs(60));
    db.ledger.park_run(&run_b, later, db.now()).await.unwrap();
    db.advance(Duration::from_secs(1));
    db.ledger
        .complete_call(complete_ok(&a, json!({})), db.now())
        .await
        .unwrap();
    // The slot freed: b's run, the oldest waiter's, is due now.
    assert_eq!(
        db.ledger.get_run("run_b").await.unwrap().not_before,
        db.now()
    );
    // c asks first but b is ahead of it.
    let c = claim_send(&db, &run_c).await;
    assert_eq!(
        mark(&db, &c, 1).await,
        SlotMark::Full {
            in_use: 0,
            ahead: 1
        }
    );
    let run_b = db
        .ledger
        .claim_run("run_b", &worker("run_b"), LEASE, db.now())
        .await
        .unwrap();
    let b = claim_send(&db, &run_b).await;
    assert_eq!(mark(&db, &b, 1).await, SlotMark::Marked);
    // A waiter that stopped asking (its run is not claimed again) loses its place.
    db.ledger
        .complete_call(complete_ok(&b, json!({})), db.now())
        .await
        .unwrap();
    let (_, d) = waiting_call(&db, "run_d").await;
    assert!(matches!(
        mark(&db, &d, 1).await,
        SlotMark::Full { ahead: 1, .. }
    ));
    db.advance(flow_ledger::WAITER_FRESH + Duration::from_secs(1));
    let (_, e) = waiting_call(&db, "run_e").await;
    assert_eq!(mark(&db, &e, 1).await, SlotMark::Marked);
}

async fn concurrent_marks_never_exceed_the_limit(db: TestDb) {
    let mut calls = Vec::new();
    for i in 0..12 {
        calls.push(waiting_call(&db, &format!("run_{i:02}")).await.1);
    }
    let now = db.now();
    let mut tasks = Vec::new();
    for call in calls {
        let ledger = db.ledger.clone();
        tasks.push(tokio::spawn(async move {
            ledger.mark_outbound_in_slot(&call, &slot(3), now).await
        }));
    }
    let mut marked = 0;
    for t in tasks {
        if matches!(t.await.unwrap(), Ok(SlotMark::Marked)) {
            marked += 1;
        }
    }
    assert_eq!(marked, 3);
}

async fn a_hold_off_lasts_until_its_latest_end(db: TestDb) {
    let now = db.now();
    assert_eq!(db.ledger.held_off("wf/api", now).await.unwrap(), None);
    let two = now.plus(Duration::from_secs(2));
    let five = now.plus(Duration::from_secs(5));
    assert_eq!(db.ledger.hold_off("wf/api", five, now).await.unwrap(), five);
    // A shorter one later does not end it sooner; the same end twice is one row.
    assert_eq!(db.ledger.hold_off("wf/api", two, now).await.unwrap(), five);
    assert_eq!(db.ledger.hold_off("wf/api", five, now).await.unwrap(), five);
    assert_eq!(db.ledger.held_off("wf/api", now).await.unwrap(), Some(five));
    // Another key is not held off.
    assert_eq!(db.ledger.held_off("wf/other", now).await.unwrap(), None);
    db.clock.set(five);
    assert_eq!(db.ledger.held_off("wf/api", db.now()).await.unwrap(), None);
}

async fn a_waiting_call_says_why_until_it_is_marked(db: TestDb) {
    let (run, call) = waiting_call(&db, "run_a").await;
    db.ledger
        .release_call_waiting(&call, Some("rate limited until soon"), db.now())
        .await
        .unwrap();
    let stored = db.ledger.get_call("run_a", "send").await.unwrap();
    assert_eq!(stored.waiting.as_deref(), Some("rate limited until soon"));
    // Claimed again and refused a slot: the slot's words replace the rate limit's.
    let call = claim_send(&db, &run).await;
    let (_, holder) = waiting_call(&db, "run_b").await;
    assert_eq!(mark(&db, &holder, 1).await, SlotMark::Marked);
    assert!(matches!(mark(&db, &call, 1).await, SlotMark::Full { .. }));
    let stored = db.ledger.get_call("run_a", "send").await.unwrap();
    let why = stored.waiting.unwrap_or_default();
    assert!(
        why.starts_with("waiting for a slot of wf/sms: 1 of 1"),
        "{why}"
    );
    db.ledger
        .complete_call(complete_ok(&holder, json!({})), db.now())
        .await
        .unwrap();
    // Marked at last: nothing waits any more.
    let call = claim_send(&db, &run).await;
    assert_eq!(mark(&db, &call, 1).await, SlotMark::Marked);
    assert_eq!(
        db.ledger.get_call("run_a", "send").await.unwrap().waiting,
        None
    );
    // A refused request given back with the downstream's words.
    db.ledger
        .give_back_waiting(&call, Some("held off"), db.now())
        .await
        .unwrap();
    let stored = db.ledger.get_call("run_a", "send").await.unwrap();
    assert_eq!(stored.status, flow_ledger::CallStatus::Claimed);
    assert_eq!(stored.waiting.as_deref(), Some("held off"));
}
