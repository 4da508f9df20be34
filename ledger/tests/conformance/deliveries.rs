//! Per-consumer event delivery (the dispatcher's storage).

use std::time::Duration;

use flow_ledger::{
    DeliveryFilter, DeliveryOutcome, DeliveryStatus, Error, EventType, FinishDelivery,
    LeaseDeliveries, ScheduleDeliveries, StartAt,
};

use crate::common::*;

crate::conformance!(
    deliveries_are_at_least_once_and_fenced,
    consumers_filter_types_and_start_points,
    dead_letters_and_redelivery,
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
