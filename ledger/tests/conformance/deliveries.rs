//! Per-consumer event delivery (the dispatcher's storage).

use std::time::Duration;

use flow_ledger::{
    DeliveryFilter, DeliveryOutcome, DeliveryStatus, Error, EventType, FinishDelivery,
    LeaseDeliveries, ScheduleDeliveries, StartAt, WorkerId,
};

use crate::common::*;

crate::conformance!(
    deliveries_are_at_least_once_and_fenced,
    consumers_filter_types_and_start_points,
    dead_letters_and_redelivery,
    batch_finish_is_fenced_per_delivery,
    listing_filters_and_keeps_the_newest,
    dead_dispatchers_leases_end_at_once,
    an_older_open_transaction_holds_events_back_until_it_ends,
);

fn schedule(consumer: &str, types: Vec<EventType>, start: StartAt) -> ScheduleDeliveries {
    ScheduleDeliveries {
        consumer: consumer.into(),
        types,
        start,
        limit: 0,
    }
}

/// Schedules until `expect` deliveries were added. On PostgreSQL an event becomes
/// schedulable once every older transaction in the cluster has ended (other tests'
/// included), so this may take a few rounds.
async fn schedule_n(db: &TestDb, req: ScheduleDeliveries, expect: u32) {
    let mut added = 0;
    for _ in 0..200 {
        added += db
            .ledger
            .schedule_deliveries(req.clone(), db.now())
            .await
            .unwrap();
        if added >= expect {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(added, expect);
}

async fn deliveries_are_at_least_once_and_fenced(db: TestDb) {
    for i in 0..3 {
        db.ledger
            .enqueue(new_run(&format!("run_{i}")), db.now())
            .await
            .unwrap();
        // No pause between them: deliveries go out in event-id order, and a process's
        // event ids keep their creation order within one millisecond too.
    }
    schedule_n(&db, schedule("hook", vec![], StartAt::Beginning), 3).await;
    // Scheduling again adds nothing (checkpoint), and never duplicates.
    assert_eq!(
        db.ledger
            .schedule_deliveries(schedule("hook", vec![], StartAt::Beginning), db.now())
            .await
            .unwrap(),
        0
    );
    let (d1, d2) = (worker("d1"), worker("d2"));
    let lease = |w| LeaseDeliveries {
        consumer: "hook",
        worker: w,
        lease: Duration::from_secs(10),
        limit: 2,
    };
    let got = db
        .ledger
        .lease_deliveries(lease(&d1), db.now())
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].event.run_id.as_deref(), Some("run_0"));
    assert_eq!(
        (got[0].attempts, got[0].event.event_type),
        (1, EventType::RunQueued)
    );
    // Leased ones are not handed out twice while the lease lives.
    let other = db
        .ledger
        .lease_deliveries(lease(&d2), db.now())
        .await
        .unwrap();
    assert_eq!(other.len(), 1);
    assert_eq!(other[0].event.run_id.as_deref(), Some("run_2"));
    db.ledger
        .finish_delivery(
            FinishDelivery {
                consumer: "hook",
                event_id: &got[0].event.id,
                worker: &d1,
                outcome: DeliveryOutcome::Delivered,
            },
            db.now(),
        )
        .await
        .unwrap();
    // d1 dies holding got[1]: after its lease the event is delivered again (same id).
    db.advance(Duration::from_secs(10));
    let again = db
        .ledger
        .lease_deliveries(lease(&d2), db.now())
        .await
        .unwrap();
    let ids: Vec<_> = again.iter().map(|d| d.event.id.clone()).collect();
    assert!(ids.contains(&got[1].event.id), "{ids:?}");
    let redo = again
        .iter()
        .find(|d| d.event.id == got[1].event.id)
        .unwrap();
    assert_eq!(redo.attempts, 2);
    // The dead dispatcher's late answer is refused.
    let late = FinishDelivery {
        consumer: "hook",
        event_id: &got[1].event.id,
        worker: &d1,
        outcome: DeliveryOutcome::Delivered,
    };
    assert!(matches!(
        db.ledger.finish_delivery(late, db.now()).await,
        Err(Error::LeaseLost)
    ));
    let delivered = db
        .ledger
        .list_deliveries(DeliveryFilter {
            status: Some(DeliveryStatus::Delivered),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(delivered.len(), 1);
}

async fn consumers_filter_types_and_start_points(db: TestDb) {
    let w = worker("1");
    let run = running(&db, "run_a", &w).await;
    db.ledger
        .pause_run(&run, "in doubt", db.now())
        .await
        .unwrap();
    let paused = vec![EventType::RunPaused, EventType::ToolCallInDoubt];
    schedule_n(&db, schedule("ops", paused.clone(), StartAt::Beginning), 1).await;
    // A consumer starting at the latest event sees only what comes after it.
    assert_eq!(
        db.ledger
            .schedule_deliveries(schedule("late", vec![], StartAt::Latest), db.now())
            .await
            .unwrap(),
        0
    );
    db.ledger.enqueue(new_run("run_b"), db.now()).await.unwrap();
    schedule_n(&db, schedule("late", vec![], StartAt::Latest), 1).await;
    assert_eq!(
        db.ledger
            .schedule_deliveries(schedule("ops", paused, StartAt::Beginning), db.now())
            .await
            .unwrap(),
        0
    );
    let ops = db
        .ledger
        .list_deliveries(DeliveryFilter {
            consumer: Some("ops".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].event.event_type, EventType::RunPaused);
}

async fn dead_letters_and_redelivery(db: TestDb) {
    db.ledger.enqueue(new_run("run_a"), db.now()).await.unwrap();
    schedule_n(&db, schedule("hook", vec![], StartAt::Beginning), 1).await;
    let d = worker("d");
    let lease = LeaseDeliveries {
        consumer: "hook",
        worker: &d,
        lease: Duration::from_secs(10),
        limit: 5,
    };
    let got = db.ledger.lease_deliveries(lease, db.now()).await.unwrap();
    let id = got[0].event.id.clone();
    let retry_at = db.now().plus(Duration::from_secs(2));
    let fail = |outcome| FinishDelivery {
        consumer: "hook",
        event_id: &id,
        worker: &d,
        outcome,
    };
    db.ledger
        .finish_delivery(
            fail(DeliveryOutcome::Retry {
                at: retry_at,
                error: "HTTP 500".into(),
            }),
            db.now(),
        )
        .await
        .unwrap();
    // Not due before its backoff.
    assert!(
        db.ledger
            .lease_deliveries(lease, db.now())
            .await
            .unwrap()
            .is_empty()
    );
    db.clock.set(retry_at);
    let got = db.ledger.lease_deliveries(lease, db.now()).await.unwrap();
    assert_eq!(
        (got.len(), got[0].attempts, got[0].last_error.as_deref()),
        (1, 2, Some("HTTP 500"))
    );
    db.ledger
        .finish_delivery(
            fail(DeliveryOutcome::Dead {
                error: "gave up".into(),
            }),
            db.now(),
        )
        .await
        .unwrap();
    // What /metrics reports: the dead letter, by consumer.
    assert_eq!(
        db.ledger.count_deliveries().await.unwrap(),
        [("hook".to_string(), DeliveryStatus::Dead, 1)]
    );
    let dead = db
        .ledger
        .list_deliveries(DeliveryFilter {
            status: Some(DeliveryStatus::Dead),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (dead.len(), dead[0].last_error.as_deref()),
        (1, Some("gave up"))
    );
    assert!(
        db.ledger
            .lease_deliveries(lease, db.now())
            .await
            .unwrap()
            .is_empty()
    );
    db.ledger.redeliver("hook", &id, db.now()).await.unwrap();
    let got = db.ledger.lease_deliveries(lease, db.now()).await.unwrap();
    assert_eq!((got.len(), got[0].attempts), (1, 1));
    assert!(matches!(
        db.ledger.redeliver("hook", "evt_nope", db.now()).await,
        Err(Error::NotFound { .. })
    ));
}

async fn batch_finish_is_fenced_per_delivery(db: TestDb) {
    for i in 0..3 {
        db.ledger
            .enqueue(new_run(&format!("run_{i}")), db.now())
            .await
            .unwrap();
    }
    schedule_n(&db, schedule("hook", vec![], StartAt::Beginning), 3).await;
    let (d1, d2) = (worker("d1"), worker("d2"));
    let lease = |w, secs| LeaseDeliveries {
        consumer: "hook",
        worker: w,
        lease: Duration::from_secs(secs),
        limit: 3,
    };
    let got = db
        .ledger
        .lease_deliveries(lease(&d1, 5), db.now())
        .await
        .unwrap();
    assert_eq!(got.len(), 3);
    // d1's lease ends; d2 takes all three and finishes the first before d1 answers.
    db.advance(Duration::from_secs(5));
    let taken = db
        .ledger
        .lease_deliveries(lease(&d2, 30), db.now())
        .await
        .unwrap();
    assert_eq!(taken.len(), 3);
    db.ledger
        .finish_delivery(
            FinishDelivery {
                consumer: "hook",
                event_id: &taken[0].event.id,
                worker: &d2,
                outcome: DeliveryOutcome::Delivered,
            },
            db.now(),
        )
        .await
        .unwrap();
    let late: Vec<FinishDelivery> = got
        .iter()
        .map(|d| FinishDelivery {
            consumer: "hook",
            event_id: &d.event.id,
            worker: &d1,
            outcome: DeliveryOutcome::Delivered,
        })
        .collect();
    let lost = db.ledger.finish_deliveries(&late, db.now()).await.unwrap();
    assert_eq!(
        lost.len(),
        3,
        "a stale dispatcher records nothing: {lost:?}"
    );
    let mine: Vec<FinishDelivery> = taken[1..]
        .iter()
        .map(|d| FinishDelivery {
            consumer: "hook",
            event_id: &d.event.id,
            worker: &d2,
            outcome: DeliveryOutcome::Dead {
                error: "HTTP 500".into(),
            },
        })
        .collect();
    assert!(
        db.ledger
            .finish_deliveries(&mine, db.now())
            .await
            .unwrap()
            .is_empty()
    );
    let all = db
        .ledger
        .list_deliveries(DeliveryFilter::default())
        .await
        .unwrap();
    let statuses: Vec<_> = all.iter().map(|d| d.status).collect();
    assert_eq!(
        statuses,
        [
            DeliveryStatus::Delivered,
            DeliveryStatus::Dead,
            DeliveryStatus::Dead
        ]
    );
}

async fn listing_filters_and_keeps_the_newest(db: TestDb) {
    for i in 0..4 {
        db.ledger
            .enqueue(new_run(&format!("run_{i}")), db.now())
            .await
            .unwrap();
    }
    schedule_n(&db, schedule("a", vec![], StartAt::Beginning), 4).await;
    schedule_n(&db, schedule("b", vec![], StartAt::Beginning), 4).await;
    let newest = db
        .ledger
        .list_deliveries(DeliveryFilter {
            consumer: Some("a".into()),
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let runs: Vec<_> = newest
        .iter()
        .map(|d| d.event.run_id.clone().unwrap())
        .collect();
    assert_eq!(runs, ["run_2", "run_3"], "the newest two, oldest first");
    let of_run = db
        .ledger
        .list_deliveries(DeliveryFilter {
            run_id: Some("run_1".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(of_run.len(), 2);
    let consumers: Vec<_> = of_run.iter().map(|d| d.consumer.as_str()).collect();
    assert_eq!(consumers, ["a", "b"]);
    let of_event = db
        .ledger
        .list_deliveries(DeliveryFilter {
            event_id: Some(of_run[0].event.id.clone()),
            consumer: Some("b".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(of_event.len(), 1);
    assert_eq!(of_event[0].consumer, "b");
    let last = db.ledger.last_event_seq().await.unwrap();
    assert_eq!(last, Some(newest[1].event.seq));
}

async fn dead_dispatchers_leases_end_at_once(db: TestDb) {
    assert_eq!(db.ledger.last_event_seq().await.unwrap(), None);
    let me = WorkerId::current();
    // Same pid, another start time: that process is gone.
    let Some(dead) = dead_local_worker() else {
        return;
    };
    let remote = worker("remote");
    for i in 0..2 {
        db.ledger
            .enqueue(new_run(&format!("run_{i}")), db.now())
            .await
            .unwrap();
    }
    schedule_n(&db, schedule("hook", vec![], StartAt::Beginning), 2).await;
    let lease = |w, limit| LeaseDeliveries {
        consumer: "hook",
        worker: w,
        lease: Duration::from_secs(60),
        limit,
    };
    let by_dead = db
        .ledger
        .lease_deliveries(lease(&dead, 1), db.now())
        .await
        .unwrap();
    let by_remote = db
        .ledger
        .lease_deliveries(lease(&remote, 1), db.now())
        .await
        .unwrap();
    assert_eq!((by_dead.len(), by_remote.len()), (1, 1));
    assert_eq!(
        db.ledger
            .expire_dead_delivery_leases(db.now())
            .await
            .unwrap(),
        1
    );
    // The dead dispatcher's delivery comes back now, the live remote one's does not.
    let again = db
        .ledger
        .lease_deliveries(lease(&me, 5), db.now())
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].event.id, by_dead[0].event.id);
    assert_eq!(again[0].attempts, 2);
}

/// On PostgreSQL an event committed while an older transaction (here: on another
/// database of the server) is still open is not scheduled yet; waiting for committed
/// events says so, and returns once that transaction ends, after which the event is
/// scheduled. SQLite has no such horizon.
async fn an_older_open_transaction_holds_events_back_until_it_ends(db: TestDb) {
    if !db.url.starts_with("postgres") {
        assert!(
            db.ledger
                .wait_for_committed_events(Duration::ZERO)
                .await
                .unwrap()
        );
        return;
    }
    let mut other = <sqlx::PgConnection as sqlx::Connection>::connect(&admin_url())
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN; SELECT pg_current_xact_id();")
        .execute(&mut other)
        .await
        .unwrap();
    db.ledger.enqueue(new_run("run_a"), db.now()).await.unwrap();
    let start = || schedule("c", vec![], StartAt::Beginning);
    assert_eq!(
        db.ledger
            .schedule_deliveries(start(), db.now())
            .await
            .unwrap(),
        0
    );
    assert!(
        !db.ledger
            .wait_for_committed_events(Duration::from_millis(200))
            .await
            .unwrap()
    );
    let end = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::raw_sql("COMMIT").execute(&mut other).await.unwrap();
    });
    assert!(
        db.ledger
            .wait_for_committed_events(Duration::from_secs(20))
            .await
            .unwrap()
    );
    end.await.unwrap();
    assert_eq!(
        db.ledger
            .schedule_deliveries(start(), db.now())
            .await
            .unwrap(),
        1
    );
}
