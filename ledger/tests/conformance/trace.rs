//! What the ledger keeps for traces: a key's trace context (stored by its first
//! outbound mark, carried by every later claim of the same key, forgotten with the key),
//! a run's latest execution segment, and the in-doubt figures a daemon's alerts read.

use std::time::Duration;

use flow_ledger::{CallOutcome, CompleteCall, ErrorKind, Resolution, Resolve, RunLease, StepError};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    a_keys_trace_context_is_kept_for_its_resends_and_forgotten_with_the_key,
    a_runs_latest_segment_is_kept_under_its_lease_only,
    calls_in_doubt_are_counted_by_tool_with_the_oldest,
);

const FIRST: &str = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";
const OTHER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01";

/// Claims `node` of `run` (tool `tool`, key `k_<node>`), marks it outbound with
/// `trace`, and puts it in doubt.
async fn in_doubt(db: &TestDb, run: &RunLease, node: &str, tool: &str, trace: Option<&str>) {
    db.ledger
        .create_step(run, step(node, node, 0), db.now())
        .await
        .unwrap();
    let mut req = claim(run, node, node, &format!("k_{node}"), json!({}));
    req.tool = tool.into();
    let mut lease = claimed(db.ledger.claim_call(req, db.now()).await.unwrap());
    assert_eq!(lease.trace_parent, None, "a fresh key has no trace yet");
    lease.trace_parent = trace.map(str::to_owned);
    lease.trace_state = trace.map(|_| "vendor=1".to_owned());
    sent_then_in_doubt(db, &lease, "connection reset").await;
}

/// An operator's `retry` of `run_a`'s paused `pay`, and the run claimed again.
async fn retry_pay(db: &TestDb) -> RunLease {
    db.ledger
        .resolve_call(
            Resolve {
                run_id: "run_a".into(),
                tool_call_id: "pay".into(),
                resolution: Resolution::Retry,
                by: "alice".into(),
                note: None,
            },
            db.now(),
        )
        .await
        .unwrap();
    db.ledger
        .claim_run("run_a", &worker("2"), LEASE, db.now())
        .await
        .unwrap()
}

async fn a_keys_trace_context_is_kept_for_its_resends_and_forgotten_with_the_key(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    in_doubt(&db, &run, "pay", "payments", Some(FIRST)).await;
    db.ledger
        .pause_run(&run, "in doubt", db.now())
        .await
        .unwrap();
    let run = retry_pay(&db).await;
    // The same key again: the stored context comes with the claim, and a second mark
    // does not replace it.
    let mut again = claimed(
        db.ledger
            .claim_call(claim(&run, "pay", "pay", "k_pay", json!({})), db.now())
            .await
            .unwrap(),
    );
    assert_eq!(again.key, "k_pay:1");
    assert_eq!(again.trace_parent.as_deref(), Some(FIRST));
    assert_eq!(again.trace_state.as_deref(), Some("vendor=1"));
    again.trace_parent = Some(OTHER.into());
    again.trace_state = None;
    // In doubt once more and retried: the first mark's context is still the one stored.
    sent_then_in_doubt(&db, &again, "timeout").await;
    db.ledger
        .pause_run(&run, "in doubt", db.now())
        .await
        .unwrap();
    let run = retry_pay(&db).await;
    let third = claimed(
        db.ledger
            .claim_call(claim(&run, "pay", "pay", "k_pay", json!({})), db.now())
            .await
            .unwrap(),
    );
    assert_eq!(
        third.trace_parent.as_deref(),
        Some(FIRST),
        "the first mark's stays"
    );
    assert_eq!(third.trace_state.as_deref(), Some("vendor=1"));
    db.ledger.mark_outbound(&third, db.now()).await.unwrap();
    let failed = CompleteCall {
        lease: &third,
        outcome: CallOutcome::Failed(StepError {
            kind: ErrorKind::Transient,
            message: "503".into(),
        }),
        requests_sent: 1,
        step: None,
        next_step: None,
    };
    db.ledger.complete_call(failed, db.now()).await.unwrap();
    // A new attempt is a new key: its trace is its own.
    let mut retry = claim(&run, "pay", "pay", "k_pay", json!({}));
    retry.retry_failed = true;
    let next = claimed(db.ledger.claim_call(retry, db.now()).await.unwrap());
    assert_eq!(next.key, "k_pay:2");
    assert_eq!((next.trace_parent, next.trace_state), (None, None));
}

async fn a_runs_latest_segment_is_kept_under_its_lease_only(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    assert_eq!(
        db.ledger.get_run("run_a").await.unwrap().trace_segment,
        None
    );
    db.ledger.set_trace_segment(&run, FIRST).await.unwrap();
    assert_eq!(
        db.ledger
            .get_run("run_a")
            .await
            .unwrap()
            .trace_segment
            .as_deref(),
        Some(FIRST)
    );
    // A holder whose lease was taken over writes nothing.
    db.clock.set(run.expires_at);
    let taken = db
        .ledger
        .claim_run("run_a", &worker("2"), LEASE, db.now())
        .await
        .unwrap();
    db.ledger.set_trace_segment(&run, OTHER).await.unwrap();
    let read = db.ledger.get_run("run_a").await.unwrap();
    assert_eq!(read.trace_segment.as_deref(), Some(FIRST));
    db.ledger.set_trace_segment(&taken, OTHER).await.unwrap();
    assert_eq!(
        db.ledger
            .get_run("run_a")
            .await
            .unwrap()
            .trace_segment
            .as_deref(),
        Some(OTHER)
    );
}

async fn calls_in_doubt_are_counted_by_tool_with_the_oldest(db: TestDb) {
    assert!(db.ledger.calls_in_doubt_by_tool().await.unwrap().is_empty());
    let run = running(&db, "run_a", &worker("1")).await;
    let first = db.now();
    in_doubt(&db, &run, "pay", "payments", None).await;
    db.advance(Duration::from_secs(10));
    in_doubt(&db, &run, "notify", "email", None).await;
    db.advance(Duration::from_secs(10));
    in_doubt(&db, &run, "refund", "payments", None).await;
    let got: Vec<(String, i64, i64)> = db
        .ledger
        .calls_in_doubt_by_tool()
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.tool, t.calls, t.oldest.0))
        .collect();
    assert_eq!(
        got,
        [
            ("email".into(), 1, first.0 + 10_000),
            ("payments".into(), 2, first.0)
        ]
    );
}
