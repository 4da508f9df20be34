//! Holds (migration 0021, `ledger/src/holds.rs`): every kind of parked node — an
//! approval, an event wait, a callback, a child run — reads as one row shape with one
//! status machine, and that row agrees with the kind's own status at every step of its
//! life. The pause asks its one question of these rows; the kinds' own tests
//! (`approvals.rs`, `waits.rs`, `children.rs`) show it stops for each.

use flow_ledger::{
    AskApproval, BeginWait, Decide, Gate, Hold, HoldKind, HoldStatus, NewRun, OnParentCancel,
    ParentLink, RunFinish, RunLease, RunStatus, StepFinish, StepStatus, SweptHold, WaitKind,
};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    an_approval_is_a_hold_that_agrees_with_its_status,
    waits_and_callbacks_are_holds_that_agree_with_their_status,
    a_child_run_is_a_hold_of_its_parents_step,
    one_sweep_settles_every_kind_in_the_order_it_comes_due,
);

fn approval(node: &str) -> AskApproval {
    AskApproval {
        node_id: node.into(),
        step_id: node.into(),
        tool: "payments".into(),
        request: json!({ "amount": 10 }),
        digest: "d1".into(),
        message: None,
        rule: json!({ "min": 1 }),
        min: 1,
        timeout_ms: 60_000,
        first_remind_ms: None,
    }
}

fn wait(node: &str, kind: WaitKind) -> BeginWait {
    BeginWait {
        node_id: node.into(),
        step_id: node.into(),
        kind,
        event_name: (kind == WaitKind::Event).then(|| "order.shipped".into()),
        matcher: None,
        lookback_ms: 0,
        timeout_ms: 30_000,
        heartbeat_ms: None,
        token_hash: (kind == WaitKind::Callback).then(|| "hash-of-token".into()),
    }
}

/// The run's holds, keyed by what they wait on.
async fn holds(db: &TestDb, run: &str) -> Vec<Hold> {
    db.ledger.holds_of_run(run).await.unwrap()
}

async fn hold(db: &TestDb, run: &str, subject: &str) -> Hold {
    holds(db, run)
        .await
        .into_iter()
        .find(|h| h.subject == subject)
        .unwrap_or_else(|| panic!("no hold on {subject}"))
}

/// The approval of node `approve`, as its own table holds it.
async fn approval_row(db: &TestDb) -> flow_ledger::Approval {
    let found = db.ledger.get_approval("run_h", "approve").await.unwrap();
    found.expect("the approval was asked")
}

/// A run held by worker 1 with a running step per node of `nodes`, and no hold yet.
async fn with_steps(db: &TestDb, nodes: &[&str]) -> RunLease {
    let run: RunLease = running(db, "run_h", &worker("1")).await;
    for node in nodes {
        db.ledger
            .create_step(&run, step(node, node, 0), db.now())
            .await
            .unwrap();
    }
    assert!(
        holds(db, "run_h").await.is_empty(),
        "no hold before one is asked"
    );
    run
}

/// An approval is listed with its kind, step and deadline, and its status is
/// `HoldStatus::of_approval` of its own before and after a decision — so the view's
/// mapping (SQL, per backend) and the Rust one cannot drift apart.
async fn an_approval_is_a_hold_that_agrees_with_its_status(db: TestDb) {
    let run = with_steps(&db, &["approve"]).await;
    // An approval: pending, then settled by a decision.
    let gate = db
        .ledger
        .approval_gate(&run, approval("approve"), db.now())
        .await
        .unwrap();
    assert!(matches!(gate, Gate::Pending(_)), "{gate:?}");
    let h = hold(&db, "run_h", "approve").await;
    let own = approval_row(&db).await;
    assert_eq!(
        (h.kind, h.step_id.as_str()),
        (HoldKind::Approval, "approve")
    );
    assert_eq!(h.status, HoldStatus::of_approval(own.status));
    assert_eq!(
        (h.status, h.deadline),
        (HoldStatus::Pending, Some(own.deadline))
    );
    let decide = Decide {
        run_id: "run_h".into(),
        node_id: "approve".into(),
        by: "alice".into(),
        approve: true,
        reason: None,
        inputs: None,
        digest: None,
    };
    db.ledger.decide_approval(decide, db.now()).await.unwrap();
    let own = approval_row(&db).await;
    let h = hold(&db, "run_h", "approve").await;
    assert_eq!(h.status, HoldStatus::of_approval(own.status));
    assert_eq!(h.status, HoldStatus::Settled);
}

/// An event wait and a callback are holds of their kind with the wait's deadline; an
/// event published under a pending wait's name marks it unseen (what the pause asks);
/// the deadline times both out, and the view agrees with `HoldStatus::of_wait`.
async fn waits_and_callbacks_are_holds_that_agree_with_their_status(db: TestDb) {
    let run = with_steps(&db, &["ship", "hook"]).await;
    // An event wait and a callback: pending, and the event one signalled but unseen
    // once a matching name is published; the deadline times both out.
    for (node, kind) in [("ship", WaitKind::Event), ("hook", WaitKind::Callback)] {
        db.ledger
            .begin_wait(&run, wait(node, kind), db.now())
            .await
            .unwrap();
        let h = hold(&db, "run_h", node).await;
        let own = db.ledger.get_wait("run_h", node).await.unwrap().unwrap();
        assert_eq!(h.kind, HoldKind::of_wait(kind));
        assert_eq!((h.status, h.unseen), (HoldStatus::Pending, false));
        assert_eq!(h.status, HoldStatus::of_wait(own.status));
        assert_eq!(h.deadline, Some(own.deadline));
    }
    db.ledger
        .publish_event("order.shipped", Some("e1"), &json!({}), None, db.now())
        .await
        .unwrap();
    assert!(
        hold(&db, "run_h", "ship").await.unseen,
        "signalled past the last look"
    );
    assert!(!hold(&db, "run_h", "hook").await.unseen);
    db.advance(std::time::Duration::from_secs(31));
    sweep(&db).await;
    for node in ["ship", "hook"] {
        let own = db.ledger.get_wait("run_h", node).await.unwrap().unwrap();
        let h = hold(&db, "run_h", node).await;
        assert_eq!(h.status, HoldStatus::of_wait(own.status), "{node}");
        assert_eq!(h.status, HoldStatus::TimedOut, "{node}");
    }
}

/// Starts the child run `run_h.kid` from `run`'s step `kid`.
async fn start_kid(db: &TestDb, run: &RunLease) -> flow_ledger::ChildStart {
    db.ledger
        .start_child(
            run,
            NewRun {
                workflow_name: "kid".into(),
                workflow_text: "name: kid\nnodes: {}\n".into(),
                inputs: json!({}),
                ..new_run("run_h.kid")
            },
            ParentLink {
                run_id: "run_h".into(),
                step_id: "kid".into(),
                on_cancel: OnParentCancel::Cancel,
            },
            &run.worker,
            LEASE,
            db.now(),
        )
        .await
        .unwrap()
}

/// A child run is a hold of its parent's step, with no deadline: pending while it runs,
/// settled once it ended.
async fn a_child_run_is_a_hold_of_its_parents_step(db: TestDb) {
    let run = with_steps(&db, &["kid"]).await;
    // A child run: pending while it runs, settled when it ends; no deadline.
    let started = start_kid(&db, &run).await;
    let h = hold(&db, "run_h", "run_h.kid").await;
    assert_eq!((h.kind, h.step_id.as_str()), (HoldKind::Child, "kid"));
    assert_eq!((h.status, h.deadline), (HoldStatus::Pending, None));
    assert_eq!(h.status, HoldStatus::of_child(RunStatus::Running));
    let kid = started.lease.expect("claimed for the parent's worker");
    let finish = RunFinish {
        status: RunStatus::Succeeded,
        output: Some(json!({})),
        error: None,
    };
    db.ledger.finish_run(&kid, finish, db.now()).await.unwrap();
    let h = hold(&db, "run_h", "run_h.kid").await;
    assert_eq!(h.status, HoldStatus::of_child(RunStatus::Succeeded));
    assert_eq!(h.status, HoldStatus::Settled);
    assert_eq!(
        holds(&db, "run_h").await.len(),
        1,
        "one row per parked node"
    );
}

/// One sweep serves every kind: it times out each hold when its own deadline passes (the
/// waits at 30 s, the approval at 60 s, each once), cancels a hold whose step ended
/// without it (an approval of a failed step), and never touches a child run (no
/// deadline: its own end settles it).
async fn one_sweep_settles_every_kind_in_the_order_it_comes_due(db: TestDb) {
    let run = with_steps(&db, &["approve", "ship", "hook", "kid"]).await;
    let gate = db.ledger.approval_gate(&run, approval("approve"), db.now());
    assert!(matches!(gate.await.unwrap(), Gate::Pending(_)));
    for (node, kind) in [("ship", WaitKind::Event), ("hook", WaitKind::Callback)] {
        let begun = db.ledger.begin_wait(&run, wait(node, kind), db.now());
        begun.await.unwrap();
    }
    start_kid(&db, &run).await;
    // A second run whose approval's step fails before anyone decides.
    let orphan = running(&db, "run_o", &worker("1")).await;
    let created = db
        .ledger
        .create_step(&orphan, step("approve", "approve", 0), db.now());
    created.await.unwrap();
    let gate = db
        .ledger
        .approval_gate(&orphan, approval("approve"), db.now());
    assert!(matches!(gate.await.unwrap(), Gate::Pending(_)));
    let failed = StepFinish {
        step_id: "approve".into(),
        status: StepStatus::Failed,
        output: None,
        error: None,
    };
    db.ledger
        .finish_step(&orphan, failed, db.now())
        .await
        .unwrap();

    let now = sweep(&db).await;
    assert!(now.timed_out.is_empty(), "nothing is due yet: {now:?}");
    assert_eq!(now.cancelled, 1, "the failed step's approval: {now:?}");
    assert_eq!(
        hold(&db, "run_o", "approve").await.status,
        HoldStatus::Cancelled
    );

    db.advance(std::time::Duration::from_secs(31));
    let waits = sweep(&db).await;
    let timed_out = |kind, subject: &str| SweptHold {
        kind,
        run_id: "run_h".into(),
        subject: subject.into(),
    };
    let mut got = waits.timed_out.clone();
    got.sort_by(|a, b| a.subject.cmp(&b.subject));
    assert_eq!(
        got,
        [
            timed_out(HoldKind::Callback, "hook"),
            timed_out(HoldKind::Event, "ship")
        ]
    );
    assert_eq!(
        hold(&db, "run_h", "approve").await.status,
        HoldStatus::Pending
    );

    db.advance(std::time::Duration::from_secs(30));
    let approval = sweep(&db).await;
    assert_eq!(
        approval.timed_out,
        [timed_out(HoldKind::Approval, "approve")]
    );
    let again = sweep(&db).await;
    assert_eq!(again, flow_ledger::SweptHolds::default(), "each fires once");
    let kid = hold(&db, "run_h", "run_h.kid").await;
    assert_eq!(
        (kid.kind, kid.status),
        (HoldKind::Child, HoldStatus::Pending)
    );
}
