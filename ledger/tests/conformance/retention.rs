//! Retention (migration 0015, `ledger/src/retention/`): a finished run goes whole in one
//! transaction and leaves a tombstone per key, which a later claim of the key is
//! refused by; what must stay stays (a call in doubt, an unfinished child or parent, a
//! run too recent or not finished); the sweeps delete by age and keep what a consumer
//! or a pending wait still needs.

use std::time::Duration;

use flow_ledger::{
    Error, Kept, OnParentCancel, ParentLink, RunFinish, RunGc, RunLease, RunStatus, StartAt, Sweep,
    Timestamp,
};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    a_finished_run_goes_whole_and_its_keys_are_refused_after,
    what_must_stay_stays,
    a_call_only_claimed_does_not_keep_a_finished_run,
    sweeps_delete_by_age_and_keep_what_is_still_needed,
    a_deleted_runs_events_go_only_when_delivered,
    two_deleters_at_once_delete_each_run_once,
);

/// Every table that holds rows of a run, with its run column.
const RUN_TABLES: [(&str, &str); 14] = [
    ("runs", "id"),
    ("steps", "run_id"),
    ("tool_calls", "run_id"),
    ("tool_call_attempts", "run_id"),
    ("usage", "run_id"),
    ("call_probes", "run_id"),
    ("call_reconcile", "run_id"),
    ("approvals", "run_id"),
    ("approval_votes", "run_id"),
    ("waits", "run_id"),
    ("callback_tokens", "run_id"),
    ("fanouts", "run_id"),
    ("run_inputs", "run_id"),
    ("runs", "parent_run_id"),
];

/// Rows of `run` left in any table (0 once it is deleted).
async fn rows_of(db: &TestDb, run: &str) -> i64 {
    let mut n = 0;
    for (table, col) in RUN_TABLES {
        n += scalar(
            &db.url,
            &format!("SELECT COUNT(*) FROM {table} WHERE {col} = '{run}'"),
        )
        .await;
    }
    n
}

async fn finish(db: &TestDb, run: &RunLease, status: RunStatus) {
    let f = RunFinish {
        status,
        output: None,
        error: None,
    };
    db.ledger
        .finish_run(run, f, db.now())
        .await
        .expect("finish");
}

/// A run with one succeeded call under `key`, finished.
async fn done_with_key(db: &TestDb, id: &str, key: &str) {
    let run = running(db, id, &worker("1")).await;
    call_ok(db, &run, "refund", key, json!({"ok": true})).await;
    finish(db, &run, RunStatus::Succeeded).await;
}

async fn a_finished_run_goes_whole_and_its_keys_are_refused_after(db: TestDb) {
    done_with_key(&db, "old", "refund-42").await;
    let later = db.advance(Duration::from_secs(3600));
    done_with_key(&db, "young", "refund-43").await;
    let horizon = Timestamp(later.0 - 1);
    let cands = db.ledger.gc_candidates(horizon, None, 10).await.unwrap();
    assert_eq!(
        cands.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        ["old"]
    );
    // A dry run counts and writes nothing.
    let dry = db
        .ledger
        .gc_run("old", horizon, db.now(), true)
        .await
        .unwrap();
    let RunGc::Deleted { rows, tombstones } = dry else {
        panic!("{dry:?}")
    };
    assert_eq!(
        (rows.of("runs"), rows.of("tool_calls"), tombstones),
        (1, 1, 1),
        "a dry run counts what a pass would delete and write"
    );
    assert!(rows_of(&db, "old").await > 0);
    let done = db
        .ledger
        .gc_run("old", horizon, db.now(), false)
        .await
        .unwrap();
    let RunGc::Deleted { rows, tombstones } = done else {
        panic!("{done:?}")
    };
    assert_eq!((rows.of("runs"), rows.of("steps"), tombstones), (1, 1, 1));
    assert_eq!(rows_of(&db, "old").await, 0, "no row of the run is left");
    assert!(
        rows_of(&db, "young").await > 0,
        "the recent run is untouched"
    );
    assert_eq!(
        db.ledger
            .gc_run("old", horizon, db.now(), false)
            .await
            .unwrap(),
        RunGc::Gone
    );
    let t = db
        .ledger
        .key_tombstone("refund-42")
        .await
        .unwrap()
        .expect("tombstone");
    assert_eq!(
        (t.run_id.as_str(), t.node_id.as_str(), t.outcome.as_str()),
        ("old", "refund", "succeeded")
    );
    let stored = scalar(
        &db.url,
        "SELECT COUNT(*) FROM key_tombstones WHERE key_hash = 'refund-42'",
    )
    .await;
    assert_eq!(stored, 0, "the key is stored as its hash only");

    // A new run presenting the key is refused, nothing claimed; a new key goes through.
    let again = running(&db, "again", &worker("1")).await;
    db.ledger
        .create_step(&again, step("refund", "refund", 0), db.now())
        .await
        .unwrap();
    let refused = db
        .ledger
        .claim_call(
            claim(
                &again,
                "refund",
                "refund",
                "refund-42",
                json!({"n": "refund"}),
            ),
            db.now(),
        )
        .await;
    match refused {
        Err(Error::KeyRetired { run_id, .. }) => assert_eq!(run_id, "old"),
        other => panic!("expected KeyRetired, got {other:?}"),
    }
    assert!(db.ledger.list_calls("again").await.unwrap().is_empty());
    claimed(
        db.ledger
            .claim_call(
                claim(
                    &again,
                    "refund",
                    "refund",
                    "refund-44",
                    json!({"n": "refund"}),
                ),
                db.now(),
            )
            .await
            .unwrap(),
    );
    // The same run id submitted again is refused at once, naming the deleted run (its
    // default keys derive from the id: a new run would be stopped only node by node,
    // after its first nodes had sent), and no run is created.
    match db.ledger.enqueue(new_run("old"), db.now()).await {
        Err(Error::KeyRetired { run_id, .. }) => assert_eq!(run_id, "old"),
        other => panic!("expected KeyRetired for the reused id, got {other:?}"),
    }
    assert!(matches!(
        db.ledger.get_run("old").await,
        Err(Error::NotFound { .. })
    ));
}

async fn what_must_stay_stays(db: TestDb) {
    let w = worker("1");
    // A cancelled run with a call in doubt.
    let doubt = running(&db, "doubt", &w).await;
    db.ledger
        .create_step(&doubt, step("pay", "pay", 0), db.now())
        .await
        .unwrap();
    let lease = claimed(
        db.ledger
            .claim_call(
                claim(&doubt, "pay", "pay", "pay-1", json!({"n": 1})),
                db.now(),
            )
            .await
            .unwrap(),
    );
    sent_then_in_doubt(&db, &lease, "timeout").await;
    finish(&db, &doubt, RunStatus::Cancelled).await;
    // A finished parent whose child runs on; a finished child whose parent runs on.
    let parent = running(&db, "parent", &w).await;
    db.ledger
        .create_step(&parent, step("p", "p", 0), db.now())
        .await
        .unwrap();
    let link = |p: &str| ParentLink {
        run_id: p.into(),
        step_id: "p".into(),
        on_cancel: OnParentCancel::Abandon,
    };
    db.ledger
        .start_child(&parent, new_run("kid"), link("parent"), &w, LEASE, db.now())
        .await
        .unwrap();
    finish(&db, &parent, RunStatus::Failed).await;
    let busy = running(&db, "busy", &w).await;
    db.ledger
        .create_step(&busy, step("p", "p", 0), db.now())
        .await
        .unwrap();
    let start = db
        .ledger
        .start_child(
            &busy,
            new_run("done-kid"),
            link("busy"),
            &w,
            LEASE,
            db.now(),
        )
        .await
        .unwrap();
    finish(
        &db,
        &start.lease.expect("claimed for the parent's worker"),
        RunStatus::Succeeded,
    )
    .await;
    let queued = new_run("queued");
    db.ledger.enqueue(queued, db.now()).await.unwrap();
    let now = db.advance(Duration::from_secs(60));
    let gc = |id: &'static str| {
        let l = db.ledger.clone();
        async move { l.gc_run(id, now, now, false).await.unwrap() }
    };
    assert!(
        matches!(gc("doubt").await, RunGc::Kept(Kept::CallOpen { node, status }) if node == "pay" && status == "in_doubt")
    );
    assert_eq!(
        gc("parent").await,
        RunGc::Kept(Kept::ChildUnfinished {
            child: "kid".into()
        })
    );
    assert_eq!(
        gc("done-kid").await,
        RunGc::Kept(Kept::ParentUnfinished {
            parent: "busy".into()
        })
    );
    assert_eq!(gc("queued").await, RunGc::Kept(Kept::NotFinished));
    let early = Timestamp(now.0 - 3_600_000);
    assert_eq!(
        db.ledger.gc_run("doubt", early, now, false).await.unwrap(),
        RunGc::Kept(Kept::TooRecent)
    );
    for id in ["doubt", "parent", "done-kid", "queued"] {
        assert!(rows_of(&db, id).await > 0, "{id} is whole");
    }
    // Once the parent finishes, its child may go.
    finish(&db, &busy, RunStatus::Succeeded).await;
    assert!(matches!(gc("done-kid").await, RunGc::Deleted { .. }));
}

/// Schedules every outbox event for consumer `hook` (on PostgreSQL an event becomes
/// schedulable once older transactions end: rounds).
async fn schedule_all(db: &TestDb, at: Timestamp, events: i64) {
    let hook = flow_ledger::ScheduleDeliveries {
        consumer: "hook".into(),
        types: vec![],
        start: StartAt::Beginning,
        limit: 0,
    };
    let mut scheduled = 0;
    for _ in 0..200 {
        scheduled += db
            .ledger
            .schedule_deliveries(hook.clone(), at)
            .await
            .unwrap();
        if i64::from(scheduled) >= events {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(i64::from(scheduled), events);
}

/// Leases and delivers every delivery of `hook`; how many.
async fn deliver_all(db: &TestDb, at: Timestamp) -> i64 {
    let w = worker("d");
    let req = flow_ledger::LeaseDeliveries {
        consumer: "hook",
        worker: &w,
        lease: Duration::from_secs(10),
        limit: 100,
    };
    let got = db.ledger.lease_deliveries(req, at).await.unwrap();
    for g in &got {
        let f = flow_ledger::FinishDelivery {
            consumer: "hook",
            event_id: &g.event.id,
            worker: &w,
            outcome: flow_ledger::DeliveryOutcome::Delivered,
        };
        db.ledger.finish_delivery(f, at).await.unwrap();
    }
    i64::try_from(got.len()).unwrap()
}

async fn sweeps_delete_by_age_and_keep_what_is_still_needed(db: TestDb) {
    done_with_key(&db, "a", "k-a").await;
    let p = db
        .ledger
        .publish_event("shipment", Some("e1"), &json!({"n": 1}), None, db.now())
        .await
        .unwrap();
    assert!(!p.duplicate);
    let p2 = db
        .ledger
        .publish_event("shipment", Some("e2"), &json!({"n": 2}), None, db.now())
        .await
        .unwrap();
    assert!(!p2.duplicate);
    let t1 = db.advance(Duration::from_secs(3600));
    let events = scalar(&db.url, "SELECT COUNT(*) FROM outbox").await;
    assert!(events > 0);
    // A consumer with pending deliveries holds every event it has not had.
    schedule_all(&db, t1, events).await;
    let sweep = Sweep {
        events_before: Some(t1),
        history_before: Some(t1),
        keys_before: None,
        windows_before: Some(t1),
        texts: true,
        limit: 1000,
    };
    let d = db.ledger.gc_sweep(&sweep, t1, false).await.unwrap();
    assert_eq!(
        d.of("outbox"),
        0,
        "pending deliveries keep their events: {d:?}"
    );
    assert_eq!(
        d.of("published_events"),
        1,
        "no wait needs e1; e2 is its name's newest"
    );
    assert_eq!(
        d.of("workflow_texts"),
        0,
        "run `a` still references its text"
    );
    // Delivered, the events of no run go with their deliveries; run `a`'s stay with it.
    assert_eq!(deliver_all(&db, t1).await, events);
    let of_a = scalar(&db.url, "SELECT COUNT(*) FROM outbox WHERE run_id = 'a'").await;
    let others = u64::try_from(events - of_a).unwrap();
    let d = db.ledger.gc_sweep(&sweep, t1, false).await.unwrap();
    assert_eq!(
        (d.of("outbox"), d.of("event_deliveries")),
        (others, others),
        "{d:?}"
    );
    // Run `a` goes with its events; its text goes at the next sweep; its tombstone
    // expires `keys` after the deletion.
    let gone = db.ledger.gc_run("a", t1, t1, false).await.unwrap();
    let RunGc::Deleted { rows, tombstones } = gone else {
        panic!("{gone:?}")
    };
    let of_a = u64::try_from(of_a).unwrap();
    assert_eq!(
        (rows.of("outbox"), rows.of("event_deliveries"), tombstones),
        (of_a, of_a, 1)
    );
    assert_eq!(
        scalar(&db.url, "SELECT COUNT(*) FROM event_deliveries").await,
        0
    );
    let d = db.ledger.gc_sweep(&sweep, t1, false).await.unwrap();
    assert_eq!(d.of("workflow_texts"), 1, "{d:?}");
    assert!(db.ledger.key_tombstone("k-a").await.unwrap().is_some());
    let expire = Sweep {
        keys_before: Some(Timestamp(t1.0 + 1)),
        ..Sweep::default()
    };
    let early = Sweep {
        keys_before: Some(t1),
        limit: 10,
        ..Sweep::default()
    };
    assert_eq!(
        db.ledger.gc_sweep(&early, t1, false).await.unwrap().total(),
        0
    );
    let dry = db
        .ledger
        .gc_sweep(
            &Sweep {
                limit: 1000,
                ..expire.clone()
            },
            t1,
            true,
        )
        .await
        .unwrap();
    assert_eq!(dry.of("key_tombstones"), 1);
    assert!(
        db.ledger.key_tombstone("k-a").await.unwrap().is_some(),
        "a dry run writes nothing"
    );
    let d = db.ledger.gc_sweep(&expire, t1, false).await.unwrap();
    assert_eq!(d.of("key_tombstones"), 1, "{d:?}");
    assert!(db.ledger.key_tombstone("k-a").await.unwrap().is_none());
}

async fn a_call_only_claimed_does_not_keep_a_finished_run(db: TestDb) {
    let run = running(&db, "quiet", &worker("1")).await;
    db.ledger
        .create_step(&run, step("pay", "pay", 0), db.now())
        .await
        .unwrap();
    claimed(
        db.ledger
            .claim_call(
                claim(&run, "pay", "pay", "pay-9", json!({"n": 9})),
                db.now(),
            )
            .await
            .unwrap(),
    );
    finish(&db, &run, RunStatus::Cancelled).await;
    let now = db.advance(Duration::from_secs(60));
    let gone = db.ledger.gc_run("quiet", now, now, false).await.unwrap();
    assert!(
        matches!(gone, RunGc::Deleted { tombstones: 0, .. }),
        "nothing left: {gone:?}"
    );
    assert!(db.ledger.key_tombstone("pay-9").await.unwrap().is_none());
    assert_eq!(rows_of(&db, "quiet").await, 0);
}

/// A run's events go with it only once delivered: one left pending keeps itself and its
/// delivery (no delivery is ever left without its event), the others go with theirs.
async fn a_deleted_runs_events_go_only_when_delivered(db: TestDb) {
    done_with_key(&db, "a", "k-a").await;
    let t1 = db.advance(Duration::from_secs(3600));
    let events = scalar(&db.url, "SELECT COUNT(*) FROM outbox WHERE run_id = 'a'").await;
    assert!(events >= 2, "{events}");
    schedule_all(
        &db,
        t1,
        scalar(&db.url, "SELECT COUNT(*) FROM outbox").await,
    )
    .await;
    // Every delivery but the newest is delivered.
    let w = worker("d");
    let req = flow_ledger::LeaseDeliveries {
        consumer: "hook",
        worker: &w,
        lease: Duration::from_secs(10),
        limit: 100,
    };
    let got = db.ledger.lease_deliveries(req, t1).await.unwrap();
    let (pending, delivered) = got.split_last().expect("deliveries");
    for g in delivered {
        let f = flow_ledger::FinishDelivery {
            consumer: "hook",
            event_id: &g.event.id,
            worker: &w,
            outcome: flow_ledger::DeliveryOutcome::Delivered,
        };
        db.ledger.finish_delivery(f, t1).await.unwrap();
    }
    let gone = db.ledger.gc_run("a", t1, t1, false).await.unwrap();
    let RunGc::Deleted { rows, .. } = gone else {
        panic!("{gone:?}")
    };
    assert_eq!(
        i64::try_from(got.len()).unwrap(),
        events,
        "one delivery per event"
    );
    let of_a = u64::try_from(events).unwrap();
    assert_eq!(
        (rows.of("outbox"), rows.of("event_deliveries")),
        (of_a - 1, of_a - 1),
        "{rows:?}"
    );
    let left = format!(
        "SELECT COUNT(*) FROM outbox WHERE run_id = 'a' AND id = '{}'",
        pending.event.id
    );
    assert_eq!(scalar(&db.url, &left).await, 1, "the pending event stays");
    assert_eq!(
        scalar(&db.url, "SELECT COUNT(*) FROM outbox").await,
        1,
        "only the pending event stays"
    );
    let orphans = scalar(
        &db.url,
        "SELECT COUNT(*) FROM event_deliveries d WHERE NOT EXISTS
           (SELECT 1 FROM outbox e WHERE e.tenant = d.tenant AND e.workspace = d.workspace
              AND e.id = d.event_id)",
    )
    .await;
    assert_eq!(orphans, 0, "no delivery without its event");
}

/// Two deleters on one ledger at once (two connections of its pool: on PostgreSQL
/// truly concurrent, the second waits on the run's lock), walking the runs in opposite
/// orders: each run is deleted once, the other sees it gone, every key is tombstoned
/// once and nothing fails.
async fn two_deleters_at_once_delete_each_run_once(db: TestDb) {
    let ids: Vec<String> = (0..12).map(|i| format!("r{i}")).collect();
    for id in &ids {
        done_with_key(&db, id, &format!("key-{id}")).await;
    }
    let t1 = db.advance(Duration::from_secs(3600));
    let walk = |order: Vec<String>| {
        let l = db.ledger.clone();
        async move {
            let mut deleted = Vec::new();
            for id in order {
                match l.gc_run(&id, t1, t1, false).await.expect("gc_run") {
                    RunGc::Deleted { tombstones, .. } => deleted.push((id, tombstones)),
                    RunGc::Gone => {}
                    other => panic!("{id}: {other:?}"),
                }
            }
            deleted
        }
    };
    let mut backwards = ids.clone();
    backwards.reverse();
    let (a, b) = tokio::join!(walk(ids.clone()), walk(backwards));
    let mut all: Vec<(String, u64)> = a.into_iter().chain(b).collect();
    all.sort();
    let mut want: Vec<(String, u64)> = ids.iter().map(|id| (id.clone(), 1)).collect();
    want.sort();
    assert_eq!(all, want, "each run deleted once, with its tombstone");
    assert_eq!(scalar(&db.url, "SELECT COUNT(*) FROM runs").await, 0);
    assert_eq!(
        scalar(&db.url, "SELECT COUNT(*) FROM key_tombstones").await,
        12
    );
}
