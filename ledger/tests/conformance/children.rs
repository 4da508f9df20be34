//! Child runs (sub-workflows, migration 0013, `ledger/src/children.rs`): a child is
//! inserted and claimed for its parent's worker in one transaction fenced by the
//! parent's lease, found again (never a second) when the parent asks again, refused to a
//! run of another parent; its end wakes its paused parent; a parent about to pause sees
//! a child that ended under its running step; a parent's cancel carries down to its
//! `cancel` children and theirs, not to `abandon` ones; listings filter by parent.

use flow_ledger::{
    Error, NewRun, OnParentCancel, ParentLink, RunFilter, RunFinish, RunStatus, StepStatus,
};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    a_child_is_started_once_claimed_for_its_parent_and_refused_to_another,
    a_childs_end_wakes_its_paused_parent,
    a_parent_does_not_pause_over_a_child_that_ended_unseen,
    a_childs_end_and_its_parents_pause_at_once_never_leave_the_parent_paused,
    a_cancel_carries_down_to_cancel_children_only,
    a_parent_being_cancelled_starts_no_child,
);

fn child(id: &str) -> NewRun {
    NewRun {
        id: id.into(),
        workflow_name: "kid".into(),
        workflow_text: "name: kid\nnodes: {}\n".into(),
        inputs: json!({ "tenant": "t1" }),
        priority: 0,
        not_before: None,
        trace_parent: None,
    }
}

fn link(parent: &str, step: &str, on_cancel: OnParentCancel) -> ParentLink {
    ParentLink {
        run_id: parent.into(),
        step_id: step.into(),
        on_cancel,
    }
}

/// A parent holding a running step `p` (its sub-workflow node's).
async fn parent(db: &TestDb, id: &str) -> flow_ledger::RunLease {
    let run = running(db, id, &worker("1")).await;
    db.ledger
        .create_step(&run, step("p", "p", 0), db.now())
        .await
        .expect("step");
    run
}

async fn start(
    db: &TestDb,
    p: &flow_ledger::RunLease,
    id: &str,
    on_cancel: OnParentCancel,
) -> Result<flow_ledger::ChildStart, Error> {
    db.ledger
        .start_child(
            p,
            child(id),
            link(&p.run_id, "p", on_cancel),
            &p.worker,
            LEASE,
            db.now(),
        )
        .await
}

async fn a_child_is_started_once_claimed_for_its_parent_and_refused_to_another(db: TestDb) {
    let p = parent(&db, "par").await;
    let first = start(&db, &p, "par.p", OnParentCancel::Cancel)
        .await
        .unwrap();
    assert!(first.created);
    let lease = first.lease.expect("claimed for the parent's worker");
    assert_eq!(lease.parent.as_deref(), Some("par"));
    assert_eq!(first.run.status, RunStatus::Running);
    assert_eq!(
        first.run.parent,
        Some(link("par", "p", OnParentCancel::Cancel))
    );
    // Asked again (the parent started again): the same child, not claimable while held.
    let again = start(&db, &p, "par.p", OnParentCancel::Cancel)
        .await
        .unwrap();
    assert!(!again.created && again.lease.is_none(), "{again:?}");
    // A run of that id under another parent is refused.
    let other = parent(&db, "other").await;
    let err = db
        .ledger
        .start_child(
            &other,
            child("par.p"),
            link("other", "p", OnParentCancel::Cancel),
            &other.worker,
            LEASE,
            db.now(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Conflict { .. }), "{err:?}");
    // A stale parent lease starts nothing.
    let stale = flow_ledger::RunLease {
        token: p.token + 1,
        ..p.clone()
    };
    let err = start(&db, &stale, "par.q", OnParentCancel::Cancel)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost), "{err:?}");
    let listed = db
        .ledger
        .list_runs(RunFilter {
            parent: Some("par".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<&str> = listed.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["par.p"], "only the parent's children are listed");
    let counts = db
        .ledger
        .count_runs(&RunFilter {
            parent: Some("par".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let total: i64 = counts.iter().map(|(_, n)| n).sum();
    assert_eq!(total, 1, "{counts:?}");
}

async fn a_childs_end_wakes_its_paused_parent(db: TestDb) {
    let p = parent(&db, "par").await;
    let started = start(&db, &p, "par.p", OnParentCancel::Cancel)
        .await
        .unwrap();
    let kid = started.lease.expect("claimed");
    let paused = db
        .ledger
        .pause_run_awaiting(&p, "waiting on child", db.now())
        .await
        .unwrap();
    assert!(paused);
    assert_eq!(
        db.ledger.get_run("par").await.unwrap().status,
        RunStatus::Paused
    );
    let finish = RunFinish {
        status: RunStatus::Succeeded,
        output: Some(json!({ "done": true })),
        error: None,
    };
    db.ledger.finish_run(&kid, finish, db.now()).await.unwrap();
    assert_eq!(
        db.ledger.get_run("par").await.unwrap().status,
        RunStatus::Queued,
        "the child's end put its parent back on the queue"
    );
}

/// A child's end and its parent's pause released together, many rounds: either the
/// pause refuses (the parent's step runs over an ended child: it looks again) or the
/// end finds the parent paused and re-queues it; never a paused parent whose child has
/// ended.
async fn a_childs_end_and_its_parents_pause_at_once_never_leave_the_parent_paused(db: TestDb) {
    for round in 0..8 {
        let id = format!("par{round}");
        let p = parent(&db, &id).await;
        let kid = start(&db, &p, &format!("{id}.p"), OnParentCancel::Cancel)
            .await
            .unwrap()
            .lease
            .expect("claimed");
        let (ledger, now) = (db.ledger.clone(), db.now());
        race_settle_and_pause(&db, p, async move {
            let finish = RunFinish {
                status: RunStatus::Succeeded,
                output: Some(json!({ "round": round })),
                error: None,
            };
            ledger.finish_run(&kid, finish, now).await.unwrap();
        })
        .await;
    }
}

async fn a_parent_does_not_pause_over_a_child_that_ended_unseen(db: TestDb) {
    let p = parent(&db, "par").await;
    let kid = start(&db, &p, "par.p", OnParentCancel::Cancel)
        .await
        .unwrap()
        .lease
        .expect("claimed");
    let finish = RunFinish {
        status: RunStatus::Failed,
        output: None,
        error: Some("boom".into()),
    };
    db.ledger.finish_run(&kid, finish, db.now()).await.unwrap();
    let paused = db
        .ledger
        .pause_run_awaiting(&p, "waiting on child", db.now())
        .await
        .unwrap();
    assert!(
        !paused,
        "the parent's step still runs over an ended child: look again"
    );
    assert_eq!(
        db.ledger.get_run("par").await.unwrap().status,
        RunStatus::Running
    );
    // Once the parent's step has seen it, it may pause.
    let fin = flow_ledger::StepFinish {
        step_id: "p".into(),
        status: StepStatus::Failed,
        output: None,
        error: None,
    };
    db.ledger.finish_step(&p, fin, db.now()).await.unwrap();
    let steps = db.ledger.list_steps("par").await.unwrap();
    assert_eq!(steps[0].status, StepStatus::Failed);
    assert!(
        db.ledger
            .pause_run_awaiting(&p, "waiting", db.now())
            .await
            .unwrap()
    );
}

async fn a_cancel_carries_down_to_cancel_children_only(db: TestDb) {
    let p = parent(&db, "par").await;
    let kid = start(&db, &p, "par.a", OnParentCancel::Cancel)
        .await
        .unwrap()
        .lease
        .expect("claimed");
    // The child has a child of its own, and pauses.
    db.ledger
        .create_step(&kid, step("p", "p", 0), db.now())
        .await
        .unwrap();
    let grandchild = db
        .ledger
        .start_child(
            &kid,
            child("par.a.p"),
            link("par.a", "p", OnParentCancel::Cancel),
            &kid.worker,
            LEASE,
            db.now(),
        )
        .await
        .unwrap();
    assert!(grandchild.created);
    db.ledger
        .pause_run(&kid, "waiting", db.now())
        .await
        .unwrap();
    start(&db, &p, "par.b", OnParentCancel::Abandon)
        .await
        .unwrap();
    db.ledger.request_cancel("par", db.now()).await.unwrap();
    let status = |id: &'static str| {
        let l = db.ledger.clone();
        async move { l.get_run(id).await.unwrap() }
    };
    let par = status("par").await;
    assert!(par.cancel_requested, "the parent is held: asked to stop");
    assert_eq!(
        status("par.a").await.status,
        RunStatus::Cancelled,
        "paused: cancelled at once"
    );
    let gc = status("par.a.p").await;
    assert!(gc.cancel_requested, "the grandchild too (held: asked)");
    let b = status("par.b").await;
    assert!(
        !b.cancel_requested && b.status == RunStatus::Running,
        "abandon: left running"
    );
}

async fn a_parent_being_cancelled_starts_no_child(db: TestDb) {
    let p = parent(&db, "par").await;
    db.ledger.request_cancel("par", db.now()).await.unwrap();
    let err = start(&db, &p, "par.p", OnParentCancel::Cancel)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Conflict { .. }), "{err:?}");
    let children = db
        .ledger
        .list_runs(RunFilter {
            parent: Some("par".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(children.is_empty(), "{children:?}");
}
