//! Approvals (migration 0010, `ledger/src/approvals.rs`): the gate a node's call asks
//! before it is claimed, the votes, and the one compare-and-set through which approve,
//! deny, the deadline and a cancel race.

use std::time::Duration;

use flow_ledger::{
    ApprovalFilter, ApprovalStatus, AskApproval, Decide, Decided, Error, EventFilter, EventType,
    Gate, RunLease, RunStatus, Timestamp,
};
use serde_json::{Value, json};

use crate::common::*;

crate::conformance!(
    a_node_asks_once_and_waits_until_approved,
    a_changed_request_voids_the_approval,
    min_two_needs_two_distinct_approvers,
    a_denial_settles_it_and_requeues_the_run,
    the_deadline_times_out_once_and_the_gate_agrees,
    a_decision_after_the_deadline_is_refused_without_a_sweep,
    listings_show_an_approval_past_its_deadline_timed_out,
    approve_and_timeout_race_to_one_transition,
    two_approvers_at_once_with_min_two_approve_once,
    a_decision_while_the_run_is_held_stops_its_pause,
    a_decision_and_a_pause_at_once_never_leave_the_run_paused,
    finished_runs_approvals_are_cancelled_by_the_sweep,
    reminders_come_due_one_at_a_time,
);

fn ask(digest: &str, min: u32, timeout_ms: i64) -> AskApproval {
    AskApproval {
        node_id: "refund".into(),
        step_id: "refund".into(),
        tool: "payments".into(),
        request: json!({ "amount": 10, "digest_of": digest }),
        digest: digest.into(),
        message: Some("Refund 10 EUR".into()),
        rule: json!({ "min": min, "remind_ms": [1_000, 2_000] }),
        min,
        timeout_ms,
        first_remind_ms: Some(1_000),
    }
}

fn decide(by: &str, approve: bool) -> Decide {
    Decide {
        run_id: "run_a".into(),
        node_id: "refund".into(),
        by: by.into(),
        approve,
        reason: Some(format!("{by} says so")),
        inputs: approve.then(|| json!({ "reason": "dup" })),
        digest: None,
    }
}

fn rule_reminders(rule: &Value, sent: u32, at: Timestamp) -> Option<Timestamp> {
    let ms = rule["remind_ms"].as_array()?.get(sent as usize)?.as_i64()?;
    Some(Timestamp(at.0 + ms))
}

/// A run `run_id` held by worker 1 whose node `refund` has asked for approval (digest
/// `d1`, `min` approvers, `timeout_ms`) and is pending.
async fn asked(db: &TestDb, run_id: &str, min: u32, timeout_ms: i64) -> RunLease {
    let run = running(db, run_id, &worker("1")).await;
    db.ledger
        .create_step(&run, step("refund", "refund", 0), db.now())
        .await
        .unwrap();
    let gate = db
        .ledger
        .approval_gate(&run, ask("d1", min, timeout_ms), db.now())
        .await
        .unwrap();
    assert!(matches!(gate, Gate::Pending(_)), "{gate:?}");
    run
}

/// A running run whose node `refund` has asked for approval (digest `d1`) and paused.
async fn awaiting(db: &TestDb, min: u32, timeout_ms: i64) -> RunLease {
    let run = asked(db, "run_a", min, timeout_ms).await;
    assert!(
        db.ledger
            .pause_run_awaiting(&run, "awaiting approval: refund", db.now())
            .await
            .unwrap()
    );
    run
}

async fn count(db: &TestDb, t: EventType) -> usize {
    db.ledger
        .list_events(EventFilter::default())
        .await
        .unwrap()
        .iter()
        .filter(|e| e.event_type == t)
        .count()
}

/// The gate asks once (one `approval.requested`), answers `Pending` until the decision,
/// then `Approved` for the same digest; the decision re-queues the paused run.
async fn a_node_asks_once_and_waits_until_approved(db: TestDb) {
    awaiting(&db, 1, 60_000).await;
    let a = db
        .ledger
        .get_approval("run_a", "refund")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.status, ApprovalStatus::Pending);
    assert_eq!(a.message.as_deref(), Some("Refund 10 EUR"));
    assert_eq!(a.deadline, Timestamp(db.now().0 + 60_000));
    let decided = db
        .ledger
        .decide_approval(decide("alice", true), db.now())
        .await
        .unwrap();
    let Decided::Approved(a) = decided else {
        panic!("{decided:?}");
    };
    assert_eq!(a.decided_by.as_deref(), Some("alice"));
    assert_eq!(a.inputs, Some(json!({ "reason": "dup" })));
    assert_eq!(
        db.ledger.get_run("run_a").await.unwrap().status,
        RunStatus::Queued,
        "the decision re-queues the paused run"
    );
    let run = running(&db, "run_a", &worker("2")).await;
    let gate = db
        .ledger
        .approval_gate(&run, ask("d1", 1, 60_000), db.now())
        .await
        .unwrap();
    assert!(matches!(gate, Gate::Approved(_)), "{gate:?}");
    assert_eq!(count(&db, EventType::ApprovalRequested).await, 1);
    assert_eq!(count(&db, EventType::ApprovalDecided).await, 1);
    let again = db
        .ledger
        .decide_approval(decide("bob", false), db.now())
        .await
        .unwrap_err();
    assert!(
        matches!(&again, Error::Decided { status: ApprovalStatus::Approved, by: Some(b) } if b == "alice"),
        "the loser is told who won: {again}"
    );
}

/// An approval binds to its digest: a gate that renders another request gets `Pending`
/// (never `Approved`), the row holds the new digest with a new deadline, and votes for
/// the old digest no longer count; `approval.invalidated` says what changed.
async fn a_changed_request_voids_the_approval(db: TestDb) {
    awaiting(&db, 1, 60_000).await;
    db.ledger
        .decide_approval(decide("alice", true), db.now())
        .await
        .unwrap();
    let run = running(&db, "run_a", &worker("2")).await;
    db.advance(Duration::from_secs(5));
    let gate = db
        .ledger
        .approval_gate(&run, ask("d2", 1, 60_000), db.now())
        .await
        .unwrap();
    let Gate::Pending(a) = gate else {
        panic!("a changed request must not pass: {gate:?}");
    };
    assert_eq!(
        (a.digest.as_str(), a.status),
        ("d2", ApprovalStatus::Pending)
    );
    assert_eq!(a.deadline, Timestamp(db.now().0 + 60_000));
    assert!(a.approvers().is_empty(), "alice approved d1, not d2");
    assert_eq!(a.decided_by, None);
    assert_eq!(count(&db, EventType::ApprovalInvalidated).await, 1);
    let stale = Decide {
        digest: Some("d1".into()),
        ..decide("bob", true)
    };
    let err = db
        .ledger
        .decide_approval(stale, db.now())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Stale { current } if current == "d2"),
        "{err}"
    );
}

/// `min: 2`: one vote is `Voted` (nothing approved), the same voter again counts once,
/// a second voter approves.
async fn min_two_needs_two_distinct_approvers(db: TestDb) {
    awaiting(&db, 2, 60_000).await;
    let first = db
        .ledger
        .decide_approval(decide("alice", true), db.now())
        .await
        .unwrap();
    assert!(
        matches!(first, Decided::Voted { needed: 1, .. }),
        "{first:?}"
    );
    let twice = db
        .ledger
        .decide_approval(decide("alice", true), db.now())
        .await
        .unwrap();
    assert!(
        matches!(twice, Decided::Voted { needed: 1, .. }),
        "a voter listed twice counts once: {twice:?}"
    );
    assert_eq!(
        db.ledger.get_run("run_a").await.unwrap().status,
        RunStatus::Paused
    );
    let second = db
        .ledger
        .decide_approval(decide("bob", true), db.now())
        .await
        .unwrap();
    let Decided::Approved(a) = second else {
        panic!("{second:?}");
    };
    assert_eq!(a.decided_by.as_deref(), Some("alice, bob"));
    assert_eq!(count(&db, EventType::ApprovalVoted).await, 2);
    assert_eq!(count(&db, EventType::ApprovalDecided).await, 1);
}

async fn a_denial_settles_it_and_requeues_the_run(db: TestDb) {
    awaiting(&db, 2, 60_000).await;
    db.ledger
        .decide_approval(decide("alice", true), db.now())
        .await
        .unwrap();
    let denied = db
        .ledger
        .decide_approval(decide("bob", false), db.now())
        .await
        .unwrap();
    let Decided::Denied(a) = denied else {
        panic!("{denied:?}");
    };
    assert_eq!(
        (a.decided_by.as_deref(), a.reason.as_deref()),
        (Some("bob"), Some("bob says so"))
    );
    assert_eq!(
        db.ledger.get_run("run_a").await.unwrap().status,
        RunStatus::Queued
    );
    let run = running(&db, "run_a", &worker("2")).await;
    let gate = db
        .ledger
        .approval_gate(&run, ask("d1", 2, 60_000), db.now())
        .await
        .unwrap();
    assert!(matches!(gate, Gate::Denied(_)), "{gate:?}");
}

/// Past the deadline the sweep times it out once (`approval.timed_out`, run re-queued);
/// a second sweep and the gate see `timed_out`; a late approval is `PastDeadline`,
/// naming the deadline.
async fn the_deadline_times_out_once_and_the_gate_agrees(db: TestDb) {
    awaiting(&db, 1, 2_000).await;
    let early = sweep(&db).await;
    assert!(early.timed_out.is_empty());
    db.advance(Duration::from_secs(3));
    let swept = sweep(&db).await;
    assert_eq!(swept.timed_out.len(), 1);
    let again = sweep(&db).await;
    assert!(again.timed_out.is_empty(), "no second timer firing");
    assert_eq!(count(&db, EventType::ApprovalTimedOut).await, 1);
    assert_eq!(
        db.ledger.get_run("run_a").await.unwrap().status,
        RunStatus::Queued
    );
    let late = db
        .ledger
        .decide_approval(decide("alice", true), db.now())
        .await
        .unwrap_err();
    let deadline = Timestamp(db.now().0 - 1_000);
    assert!(
        matches!(late, Error::PastDeadline { deadline: d } if d == deadline),
        "{late}"
    );
    assert!(late.to_string().contains(&deadline.to_rfc3339()), "{late}");
    let run = running(&db, "run_a", &worker("2")).await;
    let gate = db
        .ledger
        .approval_gate(&run, ask("d1", 1, 2_000), db.now())
        .await
        .unwrap();
    assert!(matches!(gate, Gate::TimedOut(_)), "{gate:?}");
}

/// No daemon, so no sweep: an approve (or a deny) at or after the deadline is refused
/// in the decision's own transaction, naming the deadline, and records no vote and no
/// decision; it times the approval out as the sweep would (once, the paused run back on
/// the queue) so the gate then answers `TimedOut` and nothing is sent. Issue 49: a
/// decision 4 s late was accepted, and the next worker sent the request.
async fn a_decision_after_the_deadline_is_refused_without_a_sweep(db: TestDb) {
    awaiting(&db, 1, 2_000).await;
    let deadline = Timestamp(db.now().0 + 2_000);
    db.advance(Duration::from_secs(2));
    for approve in [true, false] {
        let late = db
            .ledger
            .decide_approval(decide("alice", approve), db.now())
            .await
            .unwrap_err();
        assert!(
            matches!(late, Error::PastDeadline { deadline: d } if d == deadline),
            "at the deadline, approve={approve}: {late}"
        );
        assert!(late.to_string().contains(&deadline.to_rfc3339()), "{late}");
    }
    db.advance(Duration::from_secs(4));
    let late = db
        .ledger
        .decide_approval(decide("bob", true), db.now())
        .await
        .unwrap_err();
    assert!(matches!(late, Error::PastDeadline { .. }), "{late}");
    let a = db
        .ledger
        .get_approval("run_a", "refund")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.status, ApprovalStatus::TimedOut);
    assert!(a.votes.is_empty(), "no late vote recorded: {:?}", a.votes);
    assert_eq!((a.decided_by, a.inputs), (None, None));
    assert_eq!(count(&db, EventType::ApprovalDecided).await, 0);
    assert_eq!(count(&db, EventType::ApprovalVoted).await, 0);
    assert_eq!(count(&db, EventType::ApprovalTimedOut).await, 1, "once");
    assert_eq!(
        db.ledger.get_run("run_a").await.unwrap().status,
        RunStatus::Queued,
        "back on the queue, where on_timeout applies"
    );
    let run = running(&db, "run_a", &worker("2")).await;
    let gate = db
        .ledger
        .approval_gate(&run, ask("d1", 1, 2_000), db.now())
        .await
        .unwrap();
    assert!(matches!(gate, Gate::TimedOut(_)), "{gate:?}");
}

/// Listings as of a time: an approval stored `pending` whose deadline has passed (no
/// sweep recorded it) is listed and filtered as `timed_out`, and is not counted pending;
/// before its deadline, and without `as_of`, it is the stored `pending`.
async fn listings_show_an_approval_past_its_deadline_timed_out(db: TestDb) {
    awaiting(&db, 1, 2_000).await;
    let list = |status: Option<ApprovalStatus>, as_of: Option<Timestamp>| {
        db.ledger.list_approvals(ApprovalFilter {
            run_id: None,
            status,
            limit: 0,
            as_of,
        })
    };
    let statuses = |l: Vec<flow_ledger::Approval>| -> Vec<ApprovalStatus> {
        l.into_iter().map(|a| a.status).collect()
    };
    let (p, t) = (
        Some(ApprovalStatus::Pending),
        Some(ApprovalStatus::TimedOut),
    );
    let before = Timestamp(db.now().0 + 1_999);
    assert_eq!(
        statuses(list(p, Some(before)).await.unwrap()),
        [ApprovalStatus::Pending]
    );
    assert!(list(t, Some(before)).await.unwrap().is_empty());
    assert_eq!(db.ledger.count_pending_approvals(before).await.unwrap(), 1);
    let after = db.advance(Duration::from_secs(2));
    assert!(
        list(p, Some(after)).await.unwrap().is_empty(),
        "not pending"
    );
    assert_eq!(
        statuses(list(t, Some(after)).await.unwrap()),
        [ApprovalStatus::TimedOut]
    );
    assert_eq!(
        statuses(list(None, Some(after)).await.unwrap()),
        [ApprovalStatus::TimedOut]
    );
    assert_eq!(db.ledger.count_pending_approvals(after).await.unwrap(), 0);
    assert_eq!(
        statuses(list(p, None).await.unwrap()),
        [ApprovalStatus::Pending],
        "the stored status, for whoever asks for it"
    );
}

/// Approve and the deadline sweep at once, many rounds: exactly one of them settles
/// the approval, the other changes nothing.
async fn approve_and_timeout_race_to_one_transition(db: TestDb) {
    for round in 0..8 {
        let run_id = format!("run_r{round}");
        let run = asked(&db, &run_id, 1, 1_000).await;
        db.ledger
            .pause_run_awaiting(&run, "awaiting", db.now())
            .await
            .unwrap();
    }
    // The approvers decide in time by their clock (0.5 s after the ask), the sweeper's
    // clock is past the 1 s deadline: whichever commits first settles it.
    let in_time = Timestamp(db.now().0 + 500);
    db.advance(Duration::from_secs(2));
    let now = db.now();
    let approvals = (0..8).map(|round| {
        let ledger = db.ledger.clone();
        let d = Decide {
            run_id: format!("run_r{round}"),
            ..decide("alice", true)
        };
        async move { ledger.decide_approval(d, in_time).await }
    });
    let sweep = sweep_holds(&db.ledger, now, 100, no_reminders);
    let (decisions, swept) = tokio::join!(futures_join_all(approvals), sweep);
    let swept = swept.unwrap();
    let approved = decisions
        .iter()
        .filter(|d| matches!(d, Ok(Decided::Approved(_))))
        .count();
    let lost = decisions
        .iter()
        .filter(|d| matches!(d, Err(Error::PastDeadline { .. })))
        .count();
    assert_eq!(approved + lost, 8, "{decisions:?}");
    assert_eq!(
        swept.timed_out.len(),
        lost,
        "every approval the sweep won is one the approver lost"
    );
    for round in 0..8 {
        let a = db
            .ledger
            .get_approval(&format!("run_r{round}"), "refund")
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(
            a.status,
            ApprovalStatus::Approved | ApprovalStatus::TimedOut
        ));
    }
    let decided = count(&db, EventType::ApprovalDecided).await;
    let timed_out = count(&db, EventType::ApprovalTimedOut).await;
    assert_eq!(decided + timed_out, 8, "one transition per approval");
}

/// Two different approvers at once on a `min: 2` approval: approved exactly once.
async fn two_approvers_at_once_with_min_two_approve_once(db: TestDb) {
    for round in 0..5 {
        let run_id = format!("run_m{round}");
        let run = asked(&db, &run_id, 2, 60_000).await;
        db.ledger
            .pause_run_awaiting(&run, "awaiting", db.now())
            .await
            .unwrap();
        let (a, b) = tokio::join!(
            db.ledger.decide_approval(
                Decide {
                    run_id: run_id.clone(),
                    ..decide("alice", true)
                },
                db.now()
            ),
            db.ledger.decide_approval(
                Decide {
                    run_id: run_id.clone(),
                    ..decide("bob", true)
                },
                db.now()
            ),
        );
        let outcomes = [a.unwrap(), b.unwrap()];
        let approved = outcomes
            .iter()
            .filter(|d| matches!(d, Decided::Approved(_)))
            .count();
        let voted = outcomes
            .iter()
            .filter(|d| matches!(d, Decided::Voted { .. }))
            .count();
        assert_eq!((approved, voted), (1, 1), "round {round}: {outcomes:?}");
    }
    assert_eq!(count(&db, EventType::ApprovalDecided).await, 5);
}

/// A decision that lands while a worker holds the run (so it re-queues nothing) makes
/// that worker's pause refuse (`false`): the run is not left paused with its approval
/// decided.
async fn a_decision_while_the_run_is_held_stops_its_pause(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    db.ledger
        .create_step(&run, step("refund", "refund", 0), db.now())
        .await
        .unwrap();
    db.ledger
        .approval_gate(&run, ask("d1", 1, 60_000), db.now())
        .await
        .unwrap();
    db.ledger
        .decide_approval(decide("alice", true), db.now())
        .await
        .unwrap();
    assert_eq!(
        db.ledger.get_run("run_a").await.unwrap().status,
        RunStatus::Running
    );
    let paused = db
        .ledger
        .pause_run_awaiting(&run, "awaiting", db.now())
        .await
        .unwrap();
    assert!(!paused, "the approval is decided: go on instead of pausing");
    assert_eq!(
        db.ledger.get_run("run_a").await.unwrap().status,
        RunStatus::Running
    );
    let gate = db
        .ledger
        .approval_gate(&run, ask("d1", 1, 60_000), db.now())
        .await
        .unwrap();
    assert!(matches!(gate, Gate::Approved(_)), "{gate:?}");
}

/// An approve and the worker's pause released together, many rounds: either the pause
/// refuses (the approval is decided: the holder goes on) or the decision finds the run
/// paused and re-queues it; never a paused run with its approval decided (the lost
/// wake-up the waits' race test checks for events).
async fn a_decision_and_a_pause_at_once_never_leave_the_run_paused(db: TestDb) {
    for round in 0..8 {
        let run_id = format!("run_{round}");
        let run = asked(&db, &run_id, 1, 60_000).await;
        let (ledger, now) = (db.ledger.clone(), db.now());
        let decision = Decide {
            run_id,
            ..decide("alice", true)
        };
        race_settle_and_pause(&db, run, async move {
            let decided = ledger.decide_approval(decision, now).await.unwrap();
            assert!(matches!(decided, Decided::Approved(_)), "{decided:?}");
        })
        .await;
    }
}

async fn finished_runs_approvals_are_cancelled_by_the_sweep(db: TestDb) {
    awaiting(&db, 1, 60_000).await;
    db.ledger.request_cancel("run_a", db.now()).await.unwrap();
    let late = db
        .ledger
        .decide_approval(decide("alice", true), db.now())
        .await
        .unwrap_err();
    assert!(
        matches!(
            late,
            Error::Terminal {
                status: RunStatus::Cancelled
            }
        ),
        "{late}"
    );
    let swept = sweep(&db).await;
    assert_eq!(swept.cancelled, 1);
    let a = db
        .ledger
        .get_approval("run_a", "refund")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.status, ApprovalStatus::Cancelled);
}

async fn reminders_come_due_one_at_a_time(db: TestDb) {
    awaiting(&db, 1, 60_000).await;
    let none = sweep_holds(&db.ledger, db.now(), 100, rule_reminders)
        .await
        .unwrap();
    assert_eq!(none.reminded, 0);
    db.advance(Duration::from_millis(1_500));
    let one = sweep_holds(&db.ledger, db.now(), 100, rule_reminders)
        .await
        .unwrap();
    assert_eq!(one.reminded, 1);
    let same = sweep_holds(&db.ledger, db.now(), 100, rule_reminders)
        .await
        .unwrap();
    assert_eq!(same.reminded, 0, "the second reminder is due at 2 s");
    db.advance(Duration::from_secs(1));
    let two = sweep_holds(&db.ledger, db.now(), 100, rule_reminders)
        .await
        .unwrap();
    assert_eq!(two.reminded, 1);
    db.advance(Duration::from_secs(10));
    let done = sweep_holds(&db.ledger, db.now(), 100, rule_reminders)
        .await
        .unwrap();
    assert_eq!(done.reminded, 0, "two reminders declared, two sent");
    assert_eq!(count(&db, EventType::ApprovalReminder).await, 2);
}

/// Awaits every future of `futs` concurrently (the test crate has no `futures`).
async fn futures_join_all<F, T>(futs: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}
