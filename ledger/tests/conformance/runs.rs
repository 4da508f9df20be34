//! The run queue.

use std::time::Duration;

use flow_ledger::{ClaimRuns, Error, HeartbeatAck, RunFilter, RunFinish, RunStatus, WorkerId};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    enqueue_is_idempotent_by_id,
    enqueue_and_claim_claims_only_a_run_it_created,
    claim_next_orders_by_priority_then_not_before,
    claim_next_reclaims_expired_leases_and_fences_the_old_holder,
    claim_next_merges_expired_and_queued_runs_in_queue_order,
    claim_run_rules,
    claim_run_takes_over_a_provably_dead_local_worker,
    heartbeat_extends_and_reports_cancel,
    cancel_queued_and_running,
    release_pause_requeue,
    finish_run_emits_and_limits_output,
    expire_dead_local_workers_frees_runs_and_calls,
    counts_and_lists,
);

/// `flow run`'s one commit: a new run is queued and claimed together (the events say
/// both, in order); a run that already existed is not claimed, so another holder's lease
/// stays whole and the caller waits for it as before.
async fn enqueue_and_claim_claims_only_a_run_it_created(db: TestDb) {
    let now = db.now();
    let (enq, lease) = db
        .ledger
        .enqueue_and_claim(new_run("run_a"), None, &worker("a"), LEASE, now)
        .await
        .unwrap();
    assert!(enq.created);
    let lease = lease.expect("a created run is claimed");
    assert_eq!((lease.run_id.as_str(), lease.token), ("run_a", 1));
    let run = db.ledger.get_run("run_a").await.unwrap();
    assert_eq!(run.status, RunStatus::Running);
    assert_eq!(
        event_types(&db, "run_a").await,
        ["run.queued", "run.started"],
        "queued then started, in one transaction"
    );
    // The same run again, from another worker: attached, not claimed, lease untouched.
    let (again, none) = db
        .ledger
        .enqueue_and_claim(new_run("run_a"), None, &worker("b"), LEASE, now)
        .await
        .unwrap();
    assert!(!again.created && none.is_none());
    assert!(matches!(
        db.ledger.claim_run("run_a", &worker("b"), LEASE, now).await,
        Err(Error::Busy { .. })
    ));
    db.ledger.heartbeat(&lease, LEASE, now).await.unwrap();
}

async fn enqueue_is_idempotent_by_id(db: TestDb) {
    let now = db.now();
    let first = db.ledger.enqueue(new_run("run_a"), now).await.unwrap();
    assert!(first.created);
    assert_eq!(first.run.status, RunStatus::Queued);
    assert_eq!(first.run.inputs, json!({"order": 42}));
    assert_eq!(first.run.created_at, now);
    assert_eq!(first.run.not_before, now);

    // Same hash and inputs (key order irrelevant): the existing run.
    let mut again = new_run("run_a");
    again.inputs = serde_json::from_str(r#"{"order":42}"#).unwrap();
    let second = db
        .ledger
        .enqueue(again, db.advance(Duration::from_secs(1)))
        .await
        .unwrap();
    assert!(!second.created);
    assert_eq!(second.run.created_at, now);

    let mut other_inputs = new_run("run_a");
    other_inputs.inputs = json!({"order": 43});
    match db.ledger.enqueue(other_inputs, now).await {
        Err(Error::Conflict {
            other_run, reason, ..
        }) => {
            assert_eq!(other_run, "run_a");
            assert!(reason.contains("inputs"), "{reason}");
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    let mut other_wf = new_run("run_a");
    other_wf.workflow_text = "name: other\n".into();
    assert!(matches!(
        db.ledger.enqueue(other_wf, now).await,
        Err(Error::Conflict { .. })
    ));
    assert_eq!(event_types(&db, "run_a").await, vec!["run.queued"]);
}

async fn claim_next_orders_by_priority_then_not_before(db: TestDb) {
    let w = worker("a");
    let now = db.now();
    let mut later = new_run("run_later");
    later.not_before = Some(now.plus(Duration::from_secs(20)));
    db.ledger.enqueue(new_run("run_old"), now).await.unwrap();
    db.ledger.enqueue(later, now).await.unwrap();
    let mut high = new_run("run_high");
    high.priority = 5;
    db.ledger
        .enqueue(high, db.advance(Duration::from_millis(5)))
        .await
        .unwrap();
    db.ledger
        .enqueue(new_run("run_new"), db.advance(Duration::from_millis(5)))
        .await
        .unwrap();

    let claim = |limit| ClaimRuns {
        worker: &w,
        lease: LEASE,
        limit,
    };
    let got = db.ledger.claim_next(claim(2), db.now()).await.unwrap();
    let ids: Vec<_> = got.iter().map(|l| l.run_id.as_str()).collect();
    assert_eq!(ids, ["run_high", "run_old"]);
    // One `run.started` per claimed run (written together), naming worker and token.
    for l in &got {
        let events = db
            .ledger
            .list_events(flow_ledger::EventFilter {
                run_id: Some(l.run_id.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        let started: Vec<_> = events
            .iter()
            .filter(|e| e.event_type == flow_ledger::EventType::RunStarted)
            .collect();
        assert_eq!(started.len(), 1, "{events:?}");
        assert!(started[0].id.starts_with("evt_"));
        assert_eq!(started[0].time, db.now());
        assert_eq!(
            started[0].payload,
            json!({"worker": w.as_str(), "lease_token": l.token, "workflow_name": "wf"})
        );
    }
    assert!(got.iter().all(|l| l.token == 1 && l.worker == w));
    assert_eq!(got[0].expires_at, db.now().plus(LEASE));
    // Consumers see the `run.started` events in queue order.
    let started: Vec<String> = db
        .ledger
        .list_events(flow_ledger::EventFilter::default())
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type == flow_ledger::EventType::RunStarted)
        .filter_map(|e| e.run_id)
        .collect();
    assert_eq!(started, ["run_high", "run_old"]);

    let got = db.ledger.claim_next(claim(10), db.now()).await.unwrap();
    let ids: Vec<_> = got.iter().map(|l| l.run_id.as_str()).collect();
    assert_eq!(ids, ["run_new"], "run_later waits for its not_before");
    assert!(
        db.ledger
            .claim_next(claim(10), db.now())
            .await
            .unwrap()
            .is_empty()
    );

    db.clock.set(now.plus(Duration::from_secs(20)));
    // Any limit is fine: a claim takes at most MAX_CLAIM runs.
    let got = db
        .ledger
        .claim_next(claim(u32::MAX), db.now())
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].run_id, "run_later");
    let run = db.ledger.get_run("run_later").await.unwrap();
    assert_eq!(run.status, RunStatus::Running);
    assert_eq!(run.worker.as_ref(), Some(&w));
    assert_eq!(run.started_at, Some(db.now()));
    assert_eq!(
        event_types(&db, "run_later").await,
        vec!["run.queued", "run.started"]
    );
    assert!(
        db.ledger
            .claim_next(claim(0), db.now())
            .await
            .unwrap()
            .is_empty()
    );
}

/// Expired leases and queued runs are looked up apart (each by its own index) and must
/// still come out as one queue: by priority, then `not_before`, then age, up to `limit`.
async fn claim_next_merges_expired_and_queued_runs_in_queue_order(db: TestDb) {
    let (w1, w2) = (worker("1"), worker("2"));
    let req = |w, limit| ClaimRuns {
        worker: w,
        lease: LEASE,
        limit,
    };
    let mut exp = new_run("run_expired");
    exp.priority = 3;
    db.ledger.enqueue(exp, db.now()).await.unwrap();
    let mut old = new_run("run_expired_low");
    old.priority = -1;
    db.ledger.enqueue(old, db.now()).await.unwrap();
    let held = db.ledger.claim_next(req(&w1, 2), db.now()).await.unwrap();
    assert_eq!(held.len(), 2);
    let mut mid = new_run("run_mid");
    mid.priority = 1;
    db.ledger
        .enqueue(mid, db.advance(Duration::from_millis(5)))
        .await
        .unwrap();
    db.ledger
        .enqueue(new_run("run_low"), db.advance(Duration::from_millis(5)))
        .await
        .unwrap();
    db.clock.set(held[0].expires_at);

    let ids = |got: Vec<flow_ledger::RunLease>| -> Vec<String> {
        got.into_iter().map(|l| l.run_id).collect()
    };
    let got = db.ledger.claim_next(req(&w2, 2), db.now()).await.unwrap();
    assert_eq!(ids(got), ["run_expired", "run_mid"]);
    let got = db.ledger.claim_next(req(&w2, 1), db.now()).await.unwrap();
    assert_eq!(ids(got), ["run_low"]);
    let got = db.ledger.claim_next(req(&w2, 5), db.now()).await.unwrap();
    assert_eq!(ids(got), ["run_expired_low"]);
    assert!(
        db.ledger
            .claim_next(req(&w2, 5), db.now())
            .await
            .unwrap()
            .is_empty()
    );
}

async fn claim_next_reclaims_expired_leases_and_fences_the_old_holder(db: TestDb) {
    let (w1, w2) = (worker("1"), worker("2"));
    db.ledger.enqueue(new_run("run_a"), db.now()).await.unwrap();
    let req = |w| ClaimRuns {
        worker: w,
        lease: LEASE,
        limit: 5,
    };
    let l1 = db
        .ledger
        .claim_next(req(&w1), db.now())
        .await
        .unwrap()
        .remove(0);
    assert!(
        db.ledger
            .claim_next(req(&w2), db.now())
            .await
            .unwrap()
            .is_empty()
    );

    // Still live one millisecond before expiry; reclaimable at expiry.
    db.clock.set(l1.expires_at.minus(Duration::from_millis(1)));
    assert!(
        db.ledger
            .claim_next(req(&w2), db.now())
            .await
            .unwrap()
            .is_empty()
    );
    db.clock.set(l1.expires_at);
    let l2 = db
        .ledger
        .claim_next(req(&w2), db.now())
        .await
        .unwrap()
        .remove(0);
    assert_eq!(l2.run_id, "run_a");
    assert_eq!(l2.token, l1.token + 1);

    // The old holder is fenced out of everything.
    assert!(matches!(
        db.ledger.heartbeat(&l1, LEASE, db.now()).await,
        Err(Error::LeaseLost)
    ));
    let fin = RunFinish {
        status: RunStatus::Succeeded,
        output: None,
        error: None,
    };
    assert!(matches!(
        db.ledger.finish_run(&l1, fin.clone(), db.now()).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        db.ledger.pause_run(&l1, "x", db.now()).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        db.ledger.release_run(&l1, db.now()).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        db.ledger
            .create_step(&l1, step("a", "a", 0), db.now())
            .await,
        Err(Error::LeaseLost)
    ));
    // The new one is not.
    db.ledger.heartbeat(&l2, LEASE, db.now()).await.unwrap();
    db.ledger.finish_run(&l2, fin, db.now()).await.unwrap();
}

async fn claim_run_rules(db: TestDb) {
    let (w1, w2) = (worker("1"), worker("2"));
    db.ledger.enqueue(new_run("run_a"), db.now()).await.unwrap();
    let l1 = db
        .ledger
        .claim_run("run_a", &w1, LEASE, db.now())
        .await
        .unwrap();
    assert_eq!(l1.token, 1);
    match db.ledger.claim_run("run_a", &w2, LEASE, db.now()).await {
        Err(Error::Busy { holder, until }) => {
            assert_eq!(holder, w1.as_str());
            assert_eq!(until, l1.expires_at);
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    // Paused runs are claimable at once.
    db.ledger
        .pause_run(&l1, "in doubt", db.now())
        .await
        .unwrap();
    let l2 = db
        .ledger
        .claim_run("run_a", &w2, LEASE, db.now())
        .await
        .unwrap();
    assert_eq!(l2.token, 2);
    // Expired leases too.
    db.clock.set(l2.expires_at);
    let l3 = db
        .ledger
        .claim_run("run_a", &w1, LEASE, db.now())
        .await
        .unwrap();
    assert_eq!(l3.token, 3);
    let fin = RunFinish {
        status: RunStatus::Failed,
        output: None,
        error: Some("boom".into()),
    };
    db.ledger.finish_run(&l3, fin, db.now()).await.unwrap();
    assert!(matches!(
        db.ledger.claim_run("run_a", &w1, LEASE, db.now()).await,
        Err(Error::Terminal {
            status: RunStatus::Failed
        })
    ));
    assert!(matches!(
        db.ledger
            .claim_run("run_missing", &w1, LEASE, db.now())
            .await,
        Err(Error::NotFound { .. })
    ));
}

async fn claim_run_takes_over_a_provably_dead_local_worker(db: TestDb) {
    let me = WorkerId::current();
    // Same pid, another start time: that process is gone.
    let Some(dead) = dead_local_worker() else {
        return;
    };
    assert!(dead.is_provably_dead());
    db.ledger.enqueue(new_run("run_a"), db.now()).await.unwrap();
    db.ledger
        .claim_run("run_a", &dead, LEASE, db.now())
        .await
        .unwrap();
    let l = db
        .ledger
        .claim_run("run_a", &me, LEASE, db.now())
        .await
        .unwrap();
    assert_eq!(l.token, 2);
    // A live remote worker is never taken over before expiry.
    let remote = worker("remote");
    db.ledger.enqueue(new_run("run_b"), db.now()).await.unwrap();
    db.ledger
        .claim_run("run_b", &remote, LEASE, db.now())
        .await
        .unwrap();
    assert!(matches!(
        db.ledger.claim_run("run_b", &me, LEASE, db.now()).await,
        Err(Error::Busy { .. })
    ));
}

async fn heartbeat_extends_and_reports_cancel(db: TestDb) {
    let w = worker("1");
    let l = running(&db, "run_a", &w).await;
    let t = db.advance(Duration::from_secs(20));
    let ack = db.ledger.heartbeat(&l, LEASE, t).await.unwrap();
    assert_eq!(
        ack,
        HeartbeatAck {
            expires_at: t.plus(LEASE),
            cancel_requested: false
        }
    );
    // Past the original expiry the lease still holds (it was renewed).
    db.clock.set(l.expires_at.plus(Duration::from_secs(1)));
    let other = worker("2");
    assert!(
        db.ledger
            .claim_next(
                ClaimRuns {
                    worker: &other,
                    lease: LEASE,
                    limit: 1
                },
                db.now()
            )
            .await
            .unwrap()
            .is_empty()
    );
    let run = db.ledger.request_cancel("run_a", db.now()).await.unwrap();
    assert_eq!(run.status, RunStatus::Running);
    assert!(run.cancel_requested);
    let ack = db.ledger.heartbeat(&l, LEASE, db.now()).await.unwrap();
    assert!(ack.cancel_requested);
}

async fn cancel_queued_and_running(db: TestDb) {
    db.ledger.enqueue(new_run("run_q"), db.now()).await.unwrap();
    let run = db.ledger.request_cancel("run_q", db.now()).await.unwrap();
    assert_eq!(run.status, RunStatus::Cancelled);
    assert_eq!(run.finished_at, Some(db.now()));
    assert_eq!(
        event_types(&db, "run_q").await,
        vec!["run.queued", "run.cancelled"]
    );
    // Idempotent, and never claimed afterwards.
    db.ledger.request_cancel("run_q", db.now()).await.unwrap();
    let w = worker("1");
    assert!(
        db.ledger
            .claim_next(
                ClaimRuns {
                    worker: &w,
                    lease: LEASE,
                    limit: 5
                },
                db.now()
            )
            .await
            .unwrap()
            .is_empty()
    );

    let l = running(&db, "run_r", &w).await;
    db.ledger.request_cancel("run_r", db.now()).await.unwrap();
    let fin = RunFinish {
        status: RunStatus::Cancelled,
        output: None,
        error: Some("cancelled".into()),
    };
    db.ledger.finish_run(&l, fin, db.now()).await.unwrap();
    assert_eq!(
        db.ledger.get_run("run_r").await.unwrap().status,
        RunStatus::Cancelled
    );
    let fin = RunFinish {
        status: RunStatus::Succeeded,
        output: None,
        error: None,
    };
    let l2 = running(&db, "run_s", &w).await;
    db.ledger.finish_run(&l2, fin, db.now()).await.unwrap();
    assert!(matches!(
        db.ledger.request_cancel("run_s", db.now()).await,
        Err(Error::Terminal {
            status: RunStatus::Succeeded
        })
    ));
}

async fn release_pause_requeue(db: TestDb) {
    let (w1, w2) = (worker("1"), worker("2"));
    let l1 = running(&db, "run_a", &w1).await;
    db.ledger.release_run(&l1, db.now()).await.unwrap();
    let run = db.ledger.get_run("run_a").await.unwrap();
    assert_eq!(
        (run.status, run.worker, run.lease_expires_at),
        (RunStatus::Queued, None, None)
    );
    let l2 = db
        .ledger
        .claim_next(
            ClaimRuns {
                worker: &w2,
                lease: LEASE,
                limit: 1,
            },
            db.now(),
        )
        .await
        .unwrap()
        .remove(0);
    assert_eq!(l2.token, 2);

    db.ledger
        .pause_run(&l2, "tool call pay is in doubt", db.now())
        .await
        .unwrap();
    let run = db.ledger.get_run("run_a").await.unwrap();
    assert_eq!(run.status, RunStatus::Paused);
    assert_eq!(
        run.pause_reason.as_deref(),
        Some("tool call pay is in doubt")
    );
    // Paused runs are not in the queue until requeued.
    assert!(
        db.ledger
            .claim_next(
                ClaimRuns {
                    worker: &w1,
                    lease: LEASE,
                    limit: 1
                },
                db.now()
            )
            .await
            .unwrap()
            .is_empty()
    );
    let run = db.ledger.requeue_run("run_a", db.now()).await.unwrap();
    assert_eq!(run.status, RunStatus::Queued);
    assert!(run.pause_reason.is_none());
    let l3 = db
        .ledger
        .claim_next(
            ClaimRuns {
                worker: &w1,
                lease: LEASE,
                limit: 1,
            },
            db.now(),
        )
        .await
        .unwrap()
        .remove(0);
    assert!(l3.token > l2.token);
    // A live lease cannot be requeued; an expired one can, and its holder is fenced.
    assert!(matches!(
        db.ledger.requeue_run("run_a", db.now()).await,
        Err(Error::Busy { .. })
    ));
    db.clock.set(l3.expires_at);
    db.ledger.requeue_run("run_a", db.now()).await.unwrap();
    assert!(matches!(
        db.ledger.heartbeat(&l3, LEASE, db.now()).await,
        Err(Error::LeaseLost)
    ));
    assert_eq!(
        event_types(&db, "run_a").await,
        vec![
            "run.queued",
            "run.started",
            "run.started",
            "run.paused",
            "run.queued",
            "run.started",
            "run.queued"
        ]
    );
}

async fn finish_run_emits_and_limits_output(db: TestDb) {
    let w = worker("1");
    let l = running(&db, "run_a", &w).await;
    let fin = RunFinish {
        status: RunStatus::Succeeded,
        output: Some(json!({"ok": true})),
        error: None,
    };
    let run = db.ledger.finish_run(&l, fin, db.now()).await.unwrap();
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!(run.output, Some(json!({"ok": true})));
    assert_eq!(run.finished_at, Some(db.now()));
    assert_eq!(
        event_types(&db, "run_a").await.last().unwrap(),
        "run.succeeded"
    );

    let l = running(&db, "run_big", &w).await;
    let big = json!("x".repeat(db.ledger.output_limit_bytes() + 10));
    let fin = RunFinish {
        status: RunStatus::Succeeded,
        output: Some(big),
        error: None,
    };
    let run = db.ledger.finish_run(&l, fin, db.now()).await.unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run.output.is_none());
    let err = run.error.unwrap();
    assert!(
        err.contains(&db.ledger.output_limit_bytes().to_string()),
        "{err}"
    );
    assert_eq!(
        event_types(&db, "run_big").await.last().unwrap(),
        "run.failed"
    );
    let l = running(&db, "run_bad", &w).await;
    let fin = RunFinish {
        status: RunStatus::Queued,
        output: None,
        error: None,
    };
    assert!(matches!(
        db.ledger.finish_run(&l, fin, db.now()).await,
        Err(Error::InvalidTransition { .. })
    ));
}

async fn expire_dead_local_workers_frees_runs_and_calls(db: TestDb) {
    let me = WorkerId::current();
    // Same pid, another start time: that process is gone.
    let Some(dead) = dead_local_worker() else {
        return;
    };
    let l = running(&db, "run_a", &dead).await;
    db.ledger
        .create_step(&l, step("pay", "pay", 0), db.now())
        .await
        .unwrap();
    claimed(
        db.ledger
            .claim_call(claim(&l, "pay", "pay", "k", json!({})), db.now())
            .await
            .unwrap(),
    );
    let remote = worker("remote");
    running(&db, "run_b", &remote).await;
    assert_eq!(
        db.ledger.expire_dead_local_workers(db.now()).await.unwrap(),
        2
    );
    assert_eq!(
        db.ledger.expire_dead_local_workers(db.now()).await.unwrap(),
        0
    );
    // The dead worker's run is claimable at once; the remote worker's is not.
    let got = db
        .ledger
        .claim_next(
            ClaimRuns {
                worker: &me,
                lease: LEASE,
                limit: 5,
            },
            db.now(),
        )
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].run_id, "run_a");
    let call = db.ledger.get_call("run_a", "pay").await.unwrap();
    assert_eq!(call.lease_expires_at, Some(db.now()));
}

async fn counts_and_lists(db: TestDb) {
    let w = worker("1");
    for i in 0..3 {
        db.ledger
            .enqueue(
                new_run(&format!("run_{i}")),
                db.advance(Duration::from_millis(1)),
            )
            .await
            .unwrap();
    }
    running(&db, "run_x", &w).await;
    let counts = db.ledger.count_runs_by_status().await.unwrap();
    let get = |s| counts.iter().find(|(k, _)| *k == s).unwrap().1;
    assert_eq!(get(RunStatus::Queued), 3);
    assert_eq!(get(RunStatus::Running), 1);
    assert_eq!(get(RunStatus::Failed), 0);
    let queued = db
        .ledger
        .list_runs(RunFilter {
            status: Some(RunStatus::Queued),
            limit: 0,
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<_> = queued.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["run_2", "run_1", "run_0"]);
    assert_eq!(
        db.ledger
            .list_runs(RunFilter {
                status: None,
                limit: 2,
                ..Default::default()
            })
            .await
            .unwrap()
            .len(),
        2
    );
    assert!(matches!(
        db.ledger.get_run("nope").await,
        Err(Error::NotFound { .. })
    ));
}
