//! Steps.

use std::time::Duration;

use flow_ledger::{Error, ErrorKind, NewStep, StepError, StepFinish, StepStatus};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    create_step_is_idempotent_and_emits,
    step_transitions_are_checked,
    step_output_over_the_limit_fails_the_step,
);

async fn create_step_is_idempotent_and_emits(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    let s = db
        .ledger
        .create_step(&run, step("a", "a", 0), db.now())
        .await
        .unwrap();
    assert_eq!(
        (s.status, s.started_at, s.retry),
        (StepStatus::Running, Some(db.now()), 0)
    );
    let later = db.advance(Duration::from_secs(1));
    let again = db
        .ledger
        .create_step(&run, step("a", "a", 0), later)
        .await
        .unwrap();
    assert_eq!(again, s, "the existing step is returned unchanged");
    assert!(matches!(
        db.ledger.create_step(&run, step("a", "b", 0), later).await,
        Err(Error::Conflict { .. })
    ));
    let nb = later.plus(Duration::from_secs(4));
    let retry = NewStep {
        step_id: "a_retry1".into(),
        node_id: "a".into(),
        retry: 1,
        not_before: Some(nb),
        status: StepStatus::Pending,
    };
    let r = db.ledger.create_step(&run, retry, later).await.unwrap();
    assert_eq!(
        (r.status, r.not_before, r.started_at),
        (StepStatus::Pending, Some(nb), None)
    );
    let skipped = NewStep {
        step_id: "c".into(),
        node_id: "c".into(),
        retry: 0,
        not_before: None,
        status: StepStatus::Skipped,
    };
    let c = db.ledger.create_step(&run, skipped, later).await.unwrap();
    assert_eq!(
        (c.status, c.finished_at),
        (StepStatus::Skipped, Some(later))
    );
    let bad = NewStep {
        step_id: "d".into(),
        node_id: "d".into(),
        retry: 0,
        not_before: None,
        status: StepStatus::Succeeded,
    };
    assert!(matches!(
        db.ledger.create_step(&run, bad, later).await,
        Err(Error::InvalidTransition { .. })
    ));
    assert_eq!(
        event_types(&db, "run_a").await,
        vec![
            "run.queued",
            "run.started",
            "step.started",
            "step.retry_scheduled"
        ]
    );
    let ids: Vec<_> = db
        .ledger
        .list_steps("run_a")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.step_id)
        .collect();
    assert_eq!(ids, ["a", "a_retry1", "c"]);
}

async fn step_transitions_are_checked(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    let pending = NewStep {
        step_id: "a".into(),
        node_id: "a".into(),
        retry: 0,
        not_before: None,
        status: StepStatus::Pending,
    };
    db.ledger
        .create_step(&run, pending, db.now())
        .await
        .unwrap();
    let started = db.ledger.start_step(&run, "a", db.now()).await.unwrap();
    assert_eq!(started.status, StepStatus::Running);
    // Starting again is a no-op.
    db.ledger.start_step(&run, "a", db.now()).await.unwrap();
    let fin = StepFinish {
        step_id: "a".into(),
        status: StepStatus::Succeeded,
        output: Some(json!({"x": 1})),
        error: None,
    };
    let done = db
        .ledger
        .finish_step(&run, fin.clone(), db.now())
        .await
        .unwrap();
    assert_eq!(
        (done.status, done.output.clone(), done.finished_at),
        (StepStatus::Succeeded, Some(json!({"x": 1})), Some(db.now()))
    );
    // Repeating the same finish is idempotent; a different one is refused.
    db.ledger.finish_step(&run, fin, db.now()).await.unwrap();
    let err = StepError {
        kind: ErrorKind::Permanent,
        message: "no".into(),
    };
    let other = StepFinish {
        step_id: "a".into(),
        status: StepStatus::Failed,
        output: None,
        error: Some(err),
    };
    match db.ledger.finish_step(&run, other, db.now()).await {
        Err(Error::InvalidTransition { from, to, .. }) => {
            assert_eq!((from.as_str(), to.as_str()), ("succeeded", "failed"))
        }
        other => panic!("expected InvalidTransition, got {other:?}"),
    }
    assert!(matches!(
        db.ledger.start_step(&run, "a", db.now()).await,
        Err(Error::InvalidTransition { .. })
    ));
    assert!(matches!(
        db.ledger.start_step(&run, "zz", db.now()).await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(
        event_types(&db, "run_a").await,
        vec![
            "run.queued",
            "run.started",
            "step.started",
            "step.succeeded"
        ]
    );
}

async fn step_output_over_the_limit_fails_the_step(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    db.ledger
        .create_step(&run, step("a", "a", 0), db.now())
        .await
        .unwrap();
    let limit = db.ledger.output_limit_bytes();
    let big = json!({"blob": "z".repeat(limit)});
    let size = big.to_string().len();
    let fin = StepFinish {
        step_id: "a".into(),
        status: StepStatus::Succeeded,
        output: Some(big),
        error: None,
    };
    let st = db.ledger.finish_step(&run, fin, db.now()).await.unwrap();
    assert_eq!(
        (st.status, st.error_kind, st.output),
        (StepStatus::Failed, Some(ErrorKind::Permanent), None)
    );
    let msg = st.error_message.unwrap();
    assert!(msg.contains(&format!("limit of {limit} bytes")), "{msg}");
    assert!(msg.contains(&format!("{size} bytes")), "{msg}");
    assert_eq!(
        event_types(&db, "run_a").await.last().unwrap(),
        "step.failed"
    );
}
