//! The daemons' sweep of holds (`sweep_holds`) as it settles waits: a deadline fires
//! once whatever races it (another sweep, a callback), finished runs' waits are
//! cancelled, and the counts and lists the views read agree with all of it.

use std::sync::Arc;
use std::time::Duration;

use flow_ledger::{
    CallbackReply, EventType, HoldKind, RunFinish, RunStatus, Timestamp, WaitFilter, WaitStatus,
};
use serde_json::json;

use super::callbacks::{CALL, awaiting_callback, callback_wait, hash, ok};
use super::{NODE, begun, count, event_wait, get, pause, run_status};
use crate::common::*;

crate::conformance!(
    two_sweeps_at_once_time_a_wait_out_once,
    a_resumed_wait_past_its_deadline_times_out,
    finished_runs_waits_are_cancelled,
    a_callback_and_the_sweep_race_to_one_outcome,
    pending_waits_are_counted_and_listed,
);

/// Two daemons sweep at the same instant: each due wait times out exactly once (one
/// `wait.timed_out`), a paused run goes back on the queue, a held one stays with its
/// worker, whose pause then refuses.
async fn two_sweeps_at_once_time_a_wait_out_once(db: TestDb) {
    let mut held = Vec::new();
    for i in 0..6 {
        let (run, _) = begun(&db, &format!("run_{i}"), event_wait(NODE, 0, 2_000)).await;
        if i % 2 == 0 {
            assert!(pause(&db, &run).await);
        } else {
            held.push(run);
        }
    }
    let early = sweep(&db).await;
    assert!(
        early.timed_out.is_empty() && early.cancelled == 0,
        "{early:?}"
    );
    db.advance(Duration::from_secs(2));
    let now = db.now();
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let sweeps: Vec<_> = (0..2)
        .map(|_| {
            let (ledger, barrier) = (db.ledger.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                sweep_holds(&ledger, now, 100, no_reminders).await
            })
        })
        .collect();
    let mut timed_out = Vec::new();
    for s in sweeps {
        let swept = s.await.unwrap().unwrap();
        assert_eq!(swept.cancelled, 0);
        timed_out.extend(swept.timed_out);
    }
    let mut runs: Vec<_> = timed_out.iter().map(|w| w.run_id.clone()).collect();
    runs.sort();
    assert_eq!(runs, (0..6).map(|i| format!("run_{i}")).collect::<Vec<_>>());
    assert_eq!(count(&db, EventType::WaitTimedOut).await, 6, "one per wait");
    for h in &timed_out {
        assert_eq!(h.kind, HoldKind::Event);
        let w = get(&db, &h.run_id, &h.subject).await;
        assert_eq!(w.status, WaitStatus::TimedOut);
        assert_eq!(w.settled_by.as_deref(), Some("sweep"));
        assert_eq!(w.settled_at, Some(now));
    }
    for i in 0..6 {
        let expected = if i % 2 == 0 {
            RunStatus::Queued
        } else {
            RunStatus::Running
        };
        assert_eq!(
            run_status(&db, &format!("run_{i}")).await,
            expected,
            "run_{i}"
        );
    }
    for run in &held {
        assert!(!pause(&db, run).await, "its wait timed out: go on");
    }
    let again = sweep(&db).await;
    assert!(again.timed_out.is_empty(), "no second timer firing");
    assert_eq!(count(&db, EventType::WaitTimedOut).await, 6);
}

/// A worker that resumes a wait past its deadline (before any sweep) finds it timed
/// out, by the same compare-and-set; the sweep after it finds nothing.
async fn a_resumed_wait_past_its_deadline_times_out(db: TestDb) {
    let (run, _) = begun(&db, "run_a", event_wait(NODE, 0, 2_000)).await;
    db.advance(Duration::from_secs(2));
    let w = db
        .ledger
        .begin_wait(&run, event_wait(NODE, 0, 2_000), db.now())
        .await
        .unwrap();
    assert_eq!(w.status, WaitStatus::TimedOut);
    assert_eq!(w.deadline, Timestamp(T0.0 + 2_000));
    assert_eq!(count(&db, EventType::WaitTimedOut).await, 1);
    let swept = sweep(&db).await;
    assert!(swept.timed_out.is_empty(), "{swept:?}");
    let again = db
        .ledger
        .begin_wait(&run, event_wait(NODE, 0, 2_000), db.now())
        .await
        .unwrap();
    assert_eq!(again, w);
    assert_eq!(count(&db, EventType::WaitTimedOut).await, 1);
}

/// The pending waits of cancelled and finished runs become `cancelled` (not timed
/// out, and once); a live run's wait is left alone.
async fn finished_runs_waits_are_cancelled(db: TestDb) {
    let (paused, _) = begun(&db, "run_cancelled", event_wait(NODE, 0, 60_000)).await;
    assert!(pause(&db, &paused).await);
    db.ledger
        .request_cancel("run_cancelled", db.now())
        .await
        .unwrap();
    let (held, _) = begun(&db, "run_failed", callback_wait(CALL, "tok-f", 60_000)).await;
    let finish = RunFinish {
        status: RunStatus::Failed,
        output: None,
        error: Some("boom".into()),
    };
    db.ledger.finish_run(&held, finish, db.now()).await.unwrap();
    awaiting_callback(&db, "run_live", "tok-l", 60_000).await;
    assert_eq!(db.ledger.count_pending_waits().await.unwrap(), 3);

    for _ in 0..2 {
        let swept = sweep_holds(&db.ledger, db.now(), 1, no_reminders)
            .await
            .unwrap();
        assert_eq!(swept.cancelled, 1, "at most `limit` a sweep: {swept:?}");
        assert!(swept.timed_out.is_empty());
    }
    assert_eq!(
        get(&db, "run_cancelled", NODE).await.status,
        WaitStatus::Cancelled
    );
    assert_eq!(
        get(&db, "run_failed", CALL).await.status,
        WaitStatus::Cancelled
    );
    assert_eq!(get(&db, "run_live", CALL).await.status, WaitStatus::Pending);
    assert_eq!(db.ledger.count_pending_waits().await.unwrap(), 1);
    assert_eq!(count(&db, EventType::WaitTimedOut).await, 0);
    assert_eq!(count(&db, EventType::WaitCompleted).await, 0);
    let again = sweep(&db).await;
    assert_eq!(again.cancelled, 0);
    assert_eq!(
        run_status(&db, "run_cancelled").await,
        RunStatus::Cancelled,
        "a cancelled run stays cancelled"
    );
}

/// A callback just before the deadline and the sweep at it, at once, many rounds:
/// exactly one settles each wait; the callback that lost is `NotFound`.
async fn a_callback_and_the_sweep_race_to_one_outcome(db: TestDb) {
    for round in 0..8 {
        awaiting_callback(&db, &format!("run_{round}"), &format!("tok-{round}"), 1_000).await;
    }
    db.advance(Duration::from_secs(1));
    let now = db.now();
    let barrier = Arc::new(tokio::sync::Barrier::new(9));
    let callbacks: Vec<_> = (0..8)
        .map(|round| {
            let (ledger, barrier) = (db.ledger.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let reply = ok(json!({ "round": round }));
                let at = Timestamp(now.0 - 1);
                ledger
                    .callback(&hash(&format!("tok-{round}")), reply, at)
                    .await
            })
        })
        .collect();
    let sweep = {
        let (ledger, barrier) = (db.ledger.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            sweep_holds(&ledger, now, 100, no_reminders).await
        })
    };
    let mut completed = 0;
    let mut won = Vec::new();
    for (round, cb) in callbacks.into_iter().enumerate() {
        match cb.await.unwrap() {
            Ok(w) => {
                assert_eq!(w.status, WaitStatus::Completed);
                completed += 1;
                won.push(format!("run_{round}"));
            }
            Err(flow_ledger::Error::NotFound { .. }) => {}
            Err(e) => panic!("round {round}: {e}"),
        }
    }
    let swept = sweep.await.unwrap().unwrap();
    assert_eq!(completed + swept.timed_out.len(), 8, "{swept:?}");
    for round in 0..8 {
        let run_id = format!("run_{round}");
        let w = get(&db, &run_id, CALL).await;
        let by_sweep = swept.timed_out.iter().any(|t| t.run_id == run_id);
        assert_ne!(
            by_sweep,
            won.contains(&run_id),
            "{run_id}: exactly one winner"
        );
        let expected = if by_sweep {
            WaitStatus::TimedOut
        } else {
            WaitStatus::Completed
        };
        assert_eq!(w.status, expected, "{run_id}");
        assert_eq!(run_status(&db, &run_id).await, RunStatus::Queued);
    }
    assert_eq!(count(&db, EventType::WaitCompleted).await, completed);
    assert_eq!(count(&db, EventType::WaitTimedOut).await, 8 - completed);
}

/// `count_pending_waits` and `list_waits` (earliest deadline first, by status, by run)
/// follow every settlement.
async fn pending_waits_are_counted_and_listed(db: TestDb) {
    assert_eq!(db.ledger.count_pending_waits().await.unwrap(), 0);
    begun(&db, "run_a", event_wait(NODE, 0, 60_000)).await;
    awaiting_callback(&db, "run_b", "tok-b", 30_000).await;
    awaiting_callback(&db, "run_c", "tok-c", 10_000).await;
    let pending = |limit| WaitFilter {
        status: Some(WaitStatus::Pending),
        limit,
        ..Default::default()
    };
    let runs = |ws: Vec<flow_ledger::Wait>| ws.into_iter().map(|w| w.run_id).collect::<Vec<_>>();
    assert_eq!(db.ledger.count_pending_waits().await.unwrap(), 3);
    let listed = db.ledger.list_waits(pending(0)).await.unwrap();
    assert_eq!(runs(listed), ["run_c", "run_b", "run_a"]);
    assert_eq!(
        runs(db.ledger.list_waits(pending(2)).await.unwrap()),
        ["run_c", "run_b"]
    );

    db.ledger
        .callback(&hash("tok-b"), ok(json!(1)), db.now())
        .await
        .unwrap();
    let failed = CallbackReply {
        ok: false,
        output: None,
        error: Some("no".into()),
    };
    db.ledger
        .callback(&hash("tok-c"), failed, db.now())
        .await
        .unwrap();
    assert_eq!(db.ledger.count_pending_waits().await.unwrap(), 1);
    assert_eq!(
        runs(db.ledger.list_waits(pending(0)).await.unwrap()),
        ["run_a"]
    );
    let by = |status| WaitFilter {
        status: Some(status),
        ..Default::default()
    };
    let completed = db.ledger.list_waits(by(WaitStatus::Completed)).await;
    assert_eq!(runs(completed.unwrap()), ["run_b"]);
    let failed = db.ledger.list_waits(by(WaitStatus::Failed)).await;
    assert_eq!(runs(failed.unwrap()), ["run_c"]);

    db.advance(Duration::from_secs(60));
    let swept = sweep(&db).await;
    let swept: Vec<_> = swept.timed_out.iter().map(|h| h.run_id.as_str()).collect();
    assert_eq!(swept, ["run_a"]);
    assert_eq!(db.ledger.count_pending_waits().await.unwrap(), 0);
    assert!(db.ledger.list_waits(pending(0)).await.unwrap().is_empty());
    let timed_out = db.ledger.list_waits(by(WaitStatus::TimedOut)).await;
    assert_eq!(runs(timed_out.unwrap()), ["run_a"]);
    let all = db.ledger.list_waits(WaitFilter::default()).await.unwrap();
    assert_eq!(all.len(), 3);
    let only_b = WaitFilter {
        run_id: Some("run_b".into()),
        ..Default::default()
    };
    assert_eq!(runs(db.ledger.list_waits(only_b).await.unwrap()), ["run_b"]);
}
