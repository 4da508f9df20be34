//! Reconciliation's record: probes of an in-doubt call, its schedule, and the runs a
//! reconciler re-queues.

use std::time::Duration;

use flow_ledger::{
    BeginWait, CallStatus, Error, HoldKind, NewProbe, ProbeDecision, ProbeObserved, Resolution,
    Resolve, RunLease, RunStatus, SweptHold, Timestamp, WaitKind,
};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    probes_are_numbered_recorded_and_scheduled,
    a_probe_of_a_call_not_in_doubt_is_refused_and_records_nothing,
    due_probes_name_only_paused_runs_with_a_due_call_in_doubt,
    a_run_with_many_due_probes_is_one_timer_beside_a_hold,
    the_resend_budget_is_counted_in_the_ledger,
    two_probers_at_once_cannot_both_resend_past_the_budget,
);

fn resend(run_id: &str, max_resends: u32) -> NewProbe {
    NewProbe {
        observed: ProbeObserved::NotFound,
        detail: None,
        http_status: Some(404),
        next_probe_at: None,
        max_resends,
        ..probe(run_id, ProbeDecision::Resend, None)
    }
}

/// A re-send decided by one process counts for every later one: past
/// `max_resends`, the ledger records `needs_operator` instead, whatever the caller read.
async fn the_resend_budget_is_counted_in_the_ledger(db: TestDb) {
    in_doubt(&db, "run_a", true).await;
    let first = db
        .ledger
        .record_probe(resend("run_a", 1), db.now())
        .await
        .unwrap();
    assert_eq!(first.decision, ProbeDecision::Resend);
    assert_eq!(
        db.ledger
            .probe_schedule("run_a", "pay")
            .await
            .unwrap()
            .resends,
        1
    );
    // A second process that still believed one re-send was left (it read the schedule
    // before the first committed) asks for another: refused, recorded for a human.
    let second = db
        .ledger
        .record_probe(resend("run_a", 1), db.now())
        .await
        .unwrap();
    assert_eq!(
        (second.number, second.decision),
        (2, ProbeDecision::NeedsOperator)
    );
    let s = db.ledger.probe_schedule("run_a", "pay").await.unwrap();
    assert_eq!((s.resends, s.next_probe_at), (1, None), "nothing scheduled");
    let probes = db.ledger.list_probes("run_a").await.unwrap();
    assert_eq!(probes[1].decision, ProbeDecision::NeedsOperator);
    assert!(
        probes[1]
            .detail
            .as_deref()
            .is_some_and(|d| d.contains("max_resends")),
        "{:?}",
        probes[1].detail
    );
    let types = event_types(&db, "run_a").await;
    assert_eq!(
        types.last().map(String::as_str),
        Some("tool_call.needs_operator"),
        "{types:?}"
    );
    // A budget of 0: not even one.
    in_doubt(&db, "run_b", true).await;
    let none = db
        .ledger
        .record_probe(resend("run_b", 0), db.now())
        .await
        .unwrap();
    assert_eq!(none.decision, ProbeDecision::NeedsOperator);
}

/// Two probers that record a re-send of one call at the same moment: exactly one gets
/// it (SQLite serializes writers; PostgreSQL locks the call's schedule row first).
async fn two_probers_at_once_cannot_both_resend_past_the_budget(db: TestDb) {
    for round in 0..5 {
        let run_id = format!("run_{round}");
        in_doubt(&db, &run_id, true).await;
        let (a, b) = tokio::join!(
            db.ledger.record_probe(resend(&run_id, 1), db.now()),
            db.ledger.record_probe(resend(&run_id, 1), db.now()),
        );
        let decisions = [a.unwrap().decision, b.unwrap().decision];
        let resends = decisions
            .iter()
            .filter(|d| **d == ProbeDecision::Resend)
            .count();
        assert_eq!(resends, 1, "round {round}: {decisions:?}");
        assert_eq!(
            db.ledger
                .probe_schedule(&run_id, "pay")
                .await
                .unwrap()
                .resends,
            1
        );
    }
}

async fn in_doubt(db: &TestDb, run_id: &str, pause: bool) -> RunLease {
    let run = running(db, run_id, &worker("1")).await;
    db.ledger
        .create_step(&run, step("pay", "pay", 0), db.now())
        .await
        .unwrap();
    let lease = claimed(
        db.ledger
            .claim_call(
                claim(&run, "pay", "pay", &format!("{run_id}-k"), json!({})),
                db.now(),
            )
            .await
            .unwrap(),
    );
    sent_then_in_doubt(db, &lease, "timed out").await;
    if pause {
        db.ledger
            .pause_run(&run, "pay in doubt", db.now())
            .await
            .unwrap();
    }
    run
}

fn probe(run_id: &str, decision: ProbeDecision, next: Option<Timestamp>) -> NewProbe {
    NewProbe {
        run_id: run_id.into(),
        tool_call_id: "pay".into(),
        sent_key: format!("{run_id}-k:1"),
        observed: ProbeObserved::Unknown,
        decision,
        http_status: Some(503),
        detail: Some("neither verdict holds (HTTP 503)".into()),
        response: Some(json!({"status": 503, "body": "busy"})),
        next_probe_at: next,
        by: "host:1:1".into(),
        tool: "pay".into(),
        attempt: 1,
        requests_sent: 1,
        max_resends: 1,
    }
}

async fn probes_are_numbered_recorded_and_scheduled(db: TestDb) {
    in_doubt(&db, "run_a", true).await;
    let s = db.ledger.probe_schedule("run_a", "pay").await.unwrap();
    assert_eq!((s.probes, s.next_probe_at), (0, None));
    let later = Timestamp(db.now().0 + 5_000);
    let n = db
        .ledger
        .record_probe(
            probe("run_a", ProbeDecision::ProbeAgain, Some(later)),
            db.now(),
        )
        .await
        .unwrap();
    assert_eq!((n.number, n.decision), (1, ProbeDecision::ProbeAgain));
    let n = db
        .ledger
        .record_probe(probe("run_a", ProbeDecision::NeedsOperator, None), db.now())
        .await
        .unwrap();
    assert_eq!((n.number, n.decision), (2, ProbeDecision::NeedsOperator));
    let s = db.ledger.probe_schedule("run_a", "pay").await.unwrap();
    assert_eq!(
        (s.probes, s.next_probe_at),
        (2, None),
        "spent: nothing scheduled"
    );
    let probes = db.ledger.list_probes("run_a").await.unwrap();
    assert_eq!(probes.len(), 2);
    assert_eq!(probes[0].probe, 1);
    assert_eq!(probes[0].next_probe_at, Some(later));
    assert_eq!(probes[0].http_status, Some(503));
    assert_eq!(
        probes[0].response,
        Some(json!({"status": 503, "body": "busy"}))
    );
    assert_eq!(probes[1].decision, ProbeDecision::NeedsOperator);
    let types = event_types(&db, "run_a").await;
    assert_eq!(
        types.iter().filter(|t| *t == "tool_call.probed").count(),
        2,
        "{types:?}"
    );
    assert_eq!(
        types.last().map(String::as_str),
        Some("tool_call.needs_operator"),
        "{types:?}"
    );
    // Each probe's request is usage of kind `probe`, beside the effect's `request`.
    let usage = db.ledger.list_usage("run_a").await.unwrap();
    assert_eq!(
        usage
            .iter()
            .filter(|u| u.kind == flow_ledger::UsageKind::Probe)
            .count(),
        2,
        "{usage:?}"
    );
    // The call itself is untouched: still in doubt, for a human.
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(call.status, CallStatus::InDoubt);
}

async fn a_probe_of_a_call_not_in_doubt_is_refused_and_records_nothing(db: TestDb) {
    in_doubt(&db, "run_a", true).await;
    let resolve = Resolve {
        run_id: "run_a".into(),
        tool_call_id: "pay".into(),
        resolution: Resolution::Succeeded(json!({"id": 1})),
        by: "alice".into(),
        note: None,
    };
    db.ledger.resolve_call(resolve, db.now()).await.unwrap();
    let before = event_types(&db, "run_a").await;
    let err = db
        .ledger
        .record_probe(probe("run_a", ProbeDecision::ProbeAgain, None), db.now())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidTransition { .. }), "{err:?}");
    assert!(db.ledger.list_probes("run_a").await.unwrap().is_empty());
    assert_eq!(
        db.ledger
            .probe_schedule("run_a", "pay")
            .await
            .unwrap()
            .probes,
        0
    );
    assert_eq!(event_types(&db, "run_a").await, before);
    let missing = db
        .ledger
        .record_probe(probe("run_zz", ProbeDecision::ProbeAgain, None), db.now())
        .await
        .unwrap_err();
    assert!(matches!(missing, Error::NotFound { .. }), "{missing:?}");
}

async fn due_probes_name_only_paused_runs_with_a_due_call_in_doubt(db: TestDb) {
    let soon = Timestamp(db.now().0 + 1_000);
    // Paused, probe due soon: named once due.
    in_doubt(&db, "run_due", true).await;
    db.ledger
        .record_probe(
            probe("run_due", ProbeDecision::ProbeAgain, Some(soon)),
            db.now(),
        )
        .await
        .unwrap();
    // Paused, probes spent: never named.
    in_doubt(&db, "run_spent", true).await;
    db.ledger
        .record_probe(
            probe("run_spent", ProbeDecision::NeedsOperator, None),
            db.now(),
        )
        .await
        .unwrap();
    // Due, but the run is still held (running): its holder probes, not the reconciler.
    in_doubt(&db, "run_held", false).await;
    db.ledger
        .record_probe(
            probe("run_held", ProbeDecision::ProbeAgain, Some(soon)),
            db.now(),
        )
        .await
        .unwrap();
    assert!(probed(&db).await.is_empty(), "not due yet");
    db.advance(Duration::from_secs(2));
    assert_eq!(probed(&db).await, ["run_due"], "one timer fired");
    assert_eq!(
        db.ledger.get_run("run_due").await.unwrap().status,
        RunStatus::Queued,
        "its run is back on the queue"
    );
    assert_eq!(
        db.ledger.get_run("run_held").await.unwrap().status,
        RunStatus::Running,
        "a held run is left to its holder"
    );
    assert!(
        probed(&db).await.is_empty(),
        "a re-queued run is not named again"
    );
}

/// A paused run's calls in doubt are one timer, due at its soonest probe — not one per
/// call: a `for_each` run with many due probes cannot crowd another run's deadline out
/// of the watcher's batch (here a batch of 2, three due calls sooner than the wait).
async fn a_run_with_many_due_probes_is_one_timer_beside_a_hold(db: TestDb) {
    let due = Timestamp(db.now().0 + 10_000);
    let run = running(&db, "run_p", &worker("1")).await;
    for call in ["pay", "ship", "mail"] {
        let made = db.ledger.create_step(&run, step(call, call, 0), db.now());
        made.await.unwrap();
        let key = format!("run_p-{call}");
        let c = claim(&run, call, call, &key, json!({}));
        let lease = claimed(db.ledger.claim_call(c, db.now()).await.unwrap());
        sent_then_in_doubt(&db, &lease, "timed out").await;
        let p = NewProbe {
            tool_call_id: call.into(),
            sent_key: format!("{key}:1"),
            tool: call.into(),
            ..probe("run_p", ProbeDecision::ProbeAgain, Some(due))
        };
        db.ledger.record_probe(p, db.now()).await.unwrap();
    }
    db.ledger
        .pause_run(&run, "in doubt", db.now())
        .await
        .unwrap();
    let waiting = running(&db, "run_w", &worker("1")).await;
    let made = db
        .ledger
        .create_step(&waiting, step("ship", "ship", 0), db.now());
    made.await.unwrap();
    let wait = BeginWait {
        node_id: "ship".into(),
        step_id: "ship".into(),
        kind: WaitKind::Event,
        event_name: Some("order.shipped".into()),
        matcher: None,
        lookback_ms: 0,
        timeout_ms: 30_000,
        heartbeat_ms: None,
        token_hash: None,
    };
    db.ledger
        .begin_wait(&waiting, wait, db.now())
        .await
        .unwrap();
    db.ledger
        .pause_run(&waiting, "waits", db.now())
        .await
        .unwrap();

    db.advance(Duration::from_secs(31));
    let fired = db
        .ledger
        .fire_due_timers(db.now(), 2, timer_rules(no_reminders))
        .await
        .unwrap();
    assert_eq!(fired.probed, ["run_p"], "{fired:?}");
    let ship = SweptHold {
        kind: HoldKind::Event,
        run_id: "run_w".into(),
        subject: "ship".into(),
    };
    assert_eq!(fired.holds.timed_out, [ship], "{fired:?}");
    assert_eq!(
        db.ledger.get_run("run_w").await.unwrap().status,
        RunStatus::Queued
    );
}

/// The runs the daemons' timer watcher re-queues for a due probe now.
async fn probed(db: &TestDb) -> Vec<String> {
    db.ledger
        .fire_due_timers(db.now(), 100, timer_rules(no_reminders))
        .await
        .unwrap()
        .probed
}
