//! Callbacks (`ledger/src/waits/settle.rs`): a token's callback settles its wait once;
//! every token that cannot be used is the same `NotFound`; heartbeats move the deadline
//! but never past the timeout.

use std::time::Duration;

use flow_ledger::{
    BeginWait, CallbackReply, EventType, RunFinish, RunStatus, Timestamp, WaitKind, WaitStatus,
};
use serde_json::{Value, json};

use super::{assert_not_found, count, get, pause, run_status};
use crate::common::*;

crate::conformance!(
    a_callback_completes_the_wait_once,
    a_failed_callback_keeps_its_error,
    late_and_finished_runs_tokens_are_not_found,
    only_the_current_steps_tokens_count,
    a_callback_before_the_pause_stops_it,
    heartbeats_move_the_deadline_up_to_the_timeout,
    a_missed_heartbeat_times_the_wait_out,
    a_failed_steps_token_is_not_found_and_its_wait_is_cancelled,
);

pub(super) const CALL: &str = "charge";

/// A token's stored form (the ledger only ever sees a hash).
pub(super) fn hash(token: &str) -> String {
    format!("sha256:{token}")
}

pub(super) fn callback_wait(step_id: &str, token: &str, timeout_ms: i64) -> BeginWait {
    BeginWait {
        node_id: CALL.into(),
        step_id: step_id.into(),
        kind: WaitKind::Callback,
        event_name: None,
        matcher: None,
        lookback_ms: 0,
        timeout_ms,
        heartbeat_ms: None,
        token_hash: Some(hash(token)),
    }
}

pub(super) fn ok(output: Value) -> CallbackReply {
    CallbackReply {
        ok: true,
        output: Some(output),
        error: None,
    }
}

/// A run whose node `charge` began a callback wait for `token` and paused.
pub(super) async fn awaiting_callback(
    db: &TestDb,
    run_id: &str,
    token: &str,
    timeout_ms: i64,
) -> flow_ledger::RunLease {
    let (run, w) = super::begun(db, run_id, callback_wait(CALL, token, timeout_ms)).await;
    assert_eq!(
        (w.kind, w.status),
        (WaitKind::Callback, WaitStatus::Pending)
    );
    assert!(
        pause(db, &run).await,
        "a pending callback does not stop the pause"
    );
    run
}

/// `ok: true` completes the wait with its output and re-queues the paused run, once:
/// the same token again, and a token nobody minted, are `NotFound`.
async fn a_callback_completes_the_wait_once(db: TestDb) {
    awaiting_callback(&db, "run_a", "tok-a", 60_000).await;
    assert_eq!(run_status(&db, "run_a").await, RunStatus::Paused);
    db.advance(Duration::from_secs(2));
    let w = db
        .ledger
        .callback(&hash("tok-a"), ok(json!({ "receipt": "r1" })), db.now())
        .await
        .unwrap();
    assert_eq!(w.status, WaitStatus::Completed);
    assert_eq!(w.output, Some(json!({ "receipt": "r1" })));
    assert_eq!((w.error.as_deref(), w.settled_at), (None, Some(db.now())));
    assert_eq!(w.settled_by.as_deref(), Some("callback"));
    assert_eq!(get(&db, "run_a", CALL).await, w);
    assert_eq!(run_status(&db, "run_a").await, RunStatus::Queued);
    assert_eq!(count(&db, EventType::WaitCompleted).await, 1);

    let again = db
        .ledger
        .callback(&hash("tok-a"), ok(json!({ "receipt": "r2" })), db.now())
        .await;
    assert_not_found(again, "a used token");
    let unknown = db
        .ledger
        .callback(&hash("tok-zzz"), ok(json!(1)), db.now())
        .await;
    assert_not_found(unknown, "an unknown token");
    let beat = db.ledger.callback_heartbeat(&hash("tok-a"), db.now()).await;
    assert_not_found(beat, "a heartbeat on a used token");
    assert_eq!(get(&db, "run_a", CALL).await, w, "nothing changed");
    assert_eq!(count(&db, EventType::WaitCompleted).await, 1);
    assert_eq!(db.ledger.count_pending_waits().await.unwrap(), 0);
}

async fn a_failed_callback_keeps_its_error(db: TestDb) {
    awaiting_callback(&db, "run_a", "tok-a", 60_000).await;
    let reply = CallbackReply {
        ok: false,
        output: Some(json!({ "partial": true })),
        error: Some("card declined".into()),
    };
    let w = db
        .ledger
        .callback(&hash("tok-a"), reply, db.now())
        .await
        .unwrap();
    assert_eq!(w.status, WaitStatus::Failed);
    assert_eq!(w.error.as_deref(), Some("card declined"));
    assert_eq!(w.output, None, "a failure has no output");
    assert_eq!(run_status(&db, "run_a").await, RunStatus::Queued);
    assert_eq!(count(&db, EventType::WaitCompleted).await, 1);
    let late = db
        .ledger
        .callback(&hash("tok-a"), ok(json!(1)), db.now())
        .await;
    assert_not_found(late, "a token whose wait failed");
    assert_eq!(get(&db, "run_a", CALL).await.status, WaitStatus::Failed);
}

/// From its deadline on, and once its run is cancelled or finished, a token is
/// `NotFound`, and its wait is left for the sweep.
async fn late_and_finished_runs_tokens_are_not_found(db: TestDb) {
    awaiting_callback(&db, "run_late", "tok-late", 1_000).await;
    awaiting_callback(&db, "run_cancelled", "tok-cancelled", 60_000).await;
    let (held, _) = super::begun(&db, "run_done", callback_wait(CALL, "tok-done", 60_000)).await;
    db.ledger
        .request_cancel("run_cancelled", db.now())
        .await
        .unwrap();
    assert_eq!(run_status(&db, "run_cancelled").await, RunStatus::Cancelled);
    let finish = RunFinish {
        status: RunStatus::Succeeded,
        output: Some(json!(1)),
        error: None,
    };
    db.ledger.finish_run(&held, finish, db.now()).await.unwrap();

    db.advance(Duration::from_millis(999));
    let just_in_time = Timestamp(T0.0 + 999);
    for token in ["tok-cancelled", "tok-done"] {
        let r = db
            .ledger
            .callback(&hash(token), ok(json!(1)), just_in_time)
            .await;
        assert_not_found(r, token);
        let r = db
            .ledger
            .callback_heartbeat(&hash(token), just_in_time)
            .await;
        assert_not_found(r, token);
    }
    db.advance(Duration::from_millis(1));
    let at_deadline = db
        .ledger
        .callback(&hash("tok-late"), ok(json!(1)), db.now())
        .await;
    assert_not_found(at_deadline, "a callback at the deadline");
    for run_id in ["run_late", "run_cancelled", "run_done"] {
        let w = get(&db, run_id, CALL).await;
        assert_eq!(
            w.status,
            WaitStatus::Pending,
            "{run_id}: the sweep settles it"
        );
    }
    assert_eq!(count(&db, EventType::WaitCompleted).await, 0);
    assert_eq!(run_status(&db, "run_late").await, RunStatus::Paused);
}

/// A retry's wait (a new step id) voids the earlier step's tokens; two tokens minted
/// for the same step (a render after a crash) both count, and the first back wins.
async fn only_the_current_steps_tokens_count(db: TestDb) {
    let (run, _) = super::begun(&db, "run_a", callback_wait(CALL, "tok-1", 60_000)).await;
    let retry = "charge_retry1";
    db.ledger
        .create_step(&run, step(retry, CALL, 1), db.now())
        .await
        .unwrap();
    let w = db
        .ledger
        .begin_wait(&run, callback_wait(retry, "tok-2", 60_000), db.now())
        .await
        .unwrap();
    assert_eq!((w.step_id.as_str(), w.status), (retry, WaitStatus::Pending));
    let stale = db
        .ledger
        .callback(&hash("tok-1"), ok(json!("stale")), db.now())
        .await;
    assert_not_found(stale, "a token of an earlier step");
    let stale = db.ledger.callback_heartbeat(&hash("tok-1"), db.now()).await;
    assert_not_found(stale, "a heartbeat of an earlier step's token");

    db.advance(Duration::from_secs(1));
    let resumed = db
        .ledger
        .begin_wait(&run, callback_wait(retry, "tok-3", 60_000), db.now())
        .await
        .unwrap();
    assert_eq!(
        resumed, w,
        "a second render of the same step keeps the wait"
    );
    let won = db
        .ledger
        .callback(&hash("tok-3"), ok(json!("third")), db.now())
        .await
        .unwrap();
    assert_eq!(
        (won.status, won.output),
        (WaitStatus::Completed, Some(json!("third")))
    );
    let lost = db
        .ledger
        .callback(&hash("tok-2"), ok(json!("second")), db.now())
        .await;
    assert_not_found(lost, "the other token of a completed wait");
    assert_eq!(get(&db, "run_a", CALL).await.output, Some(json!("third")));
    assert_eq!(count(&db, EventType::WaitCompleted).await, 1);
}

/// A callback that comes while the worker still holds the run (its call's response not
/// recorded yet) completes the wait; the worker's pause then refuses.
async fn a_callback_before_the_pause_stops_it(db: TestDb) {
    let (run, _) = super::begun(&db, "run_a", callback_wait(CALL, "tok-a", 60_000)).await;
    let w = db
        .ledger
        .callback(&hash("tok-a"), ok(json!({ "id": 7 })), db.now())
        .await
        .unwrap();
    assert_eq!(w.status, WaitStatus::Completed);
    assert_eq!(run_status(&db, "run_a").await, RunStatus::Running);
    assert!(!pause(&db, &run).await, "the callback came: go on");
    assert_eq!(run_status(&db, "run_a").await, RunStatus::Running);
    let resumed = db
        .ledger
        .begin_wait(&run, callback_wait(CALL, "tok-b", 60_000), db.now())
        .await
        .unwrap();
    assert_eq!(resumed, w, "the worker finds the completed wait");
}

/// `heartbeat_ms`: the deadline is the next heartbeat's, each heartbeat moves it to
/// now + interval, but never past the timeout.
async fn heartbeats_move_the_deadline_up_to_the_timeout(db: TestDb) {
    let begin = BeginWait {
        heartbeat_ms: Some(3_000),
        ..callback_wait(CALL, "tok-a", 10_000)
    };
    let (_, w) = super::begun(&db, "run_a", begin).await;
    assert_eq!(w.deadline, Timestamp(T0.0 + 3_000));
    assert_eq!(w.hard_deadline, Timestamp(T0.0 + 10_000));
    assert_eq!((w.heartbeat_ms, w.last_beat_at), (Some(3_000), None));
    // (now after the advance, the deadline the heartbeat sets)
    let beats = [
        (2_000, 5_000),
        (4_500, 7_500),
        (7_000, 10_000),
        (9_000, 10_000),
        (9_999, 10_000),
    ];
    for (at, deadline) in beats {
        db.clock.set(Timestamp(T0.0 + at));
        let w = db
            .ledger
            .callback_heartbeat(&hash("tok-a"), db.now())
            .await
            .unwrap();
        assert_eq!(w.deadline, Timestamp(T0.0 + deadline), "heartbeat at +{at}");
        assert_eq!(w.last_beat_at, Some(db.now()));
        assert_eq!(w.status, WaitStatus::Pending);
    }
    let swept = sweep(&db).await;
    assert!(swept.timed_out.is_empty());
    db.clock.set(Timestamp(T0.0 + 10_000));
    let late = db.ledger.callback_heartbeat(&hash("tok-a"), db.now()).await;
    assert_not_found(late, "a heartbeat at the timeout");
    let swept = sweep(&db).await;
    assert_eq!(swept.timed_out.len(), 1);
    assert_eq!(get(&db, "run_a", CALL).await.status, WaitStatus::TimedOut);
}

/// No heartbeat within the interval: the sweep times the wait out long before its
/// timeout, and the token is dead from then on.
async fn a_missed_heartbeat_times_the_wait_out(db: TestDb) {
    let begin = BeginWait {
        heartbeat_ms: Some(3_000),
        ..callback_wait(CALL, "tok-a", 60_000)
    };
    super::begun(&db, "run_a", begin).await;
    db.advance(Duration::from_millis(2_999));
    let early = sweep(&db).await;
    assert!(early.timed_out.is_empty());
    db.advance(Duration::from_millis(1));
    let late = db.ledger.callback_heartbeat(&hash("tok-a"), db.now()).await;
    assert_not_found(late, "a heartbeat after the one missed");
    let swept = sweep(&db).await;
    assert_eq!(swept.timed_out.len(), 1);
    assert_eq!(swept.timed_out[0].run_id, "run_a");
    let w = get(&db, "run_a", CALL).await;
    assert_eq!(w.status, WaitStatus::TimedOut);
    assert_eq!(w.hard_deadline, Timestamp(T0.0 + 60_000));
    let cb = db
        .ledger
        .callback(&hash("tok-a"), ok(json!(1)), db.now())
        .await;
    assert_not_found(cb, "a callback after the timeout");
    assert_eq!(count(&db, EventType::WaitTimedOut).await, 1);
}

/// A step whose call failed takes no callback (its retry waits anew under a new token),
/// and the sweep cancels its wait rather than time it out later.
async fn a_failed_steps_token_is_not_found_and_its_wait_is_cancelled(db: TestDb) {
    let (lease, _) =
        super::begun(&db, "run_failed_step", callback_wait(CALL, "tok-f", 60_000)).await;
    let finish = flow_ledger::StepFinish {
        step_id: CALL.into(),
        status: flow_ledger::StepStatus::Failed,
        output: None,
        error: Some(flow_ledger::StepError {
            kind: flow_ledger::ErrorKind::Transient,
            message: "503".into(),
        }),
    };
    db.ledger
        .finish_step(&lease, finish, db.now())
        .await
        .unwrap();
    let late = db
        .ledger
        .callback(&hash("tok-f"), ok(json!({})), db.now())
        .await;
    assert_not_found(late, "a failed step's token");
    let swept = sweep(&db).await;
    assert_eq!(swept.cancelled, 1, "{swept:?}");
    assert_eq!(
        get(&db, "run_failed_step", CALL).await.status,
        WaitStatus::Cancelled
    );
}
