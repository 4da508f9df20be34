//! The one-statement way of pure calls and the all-or-nothing batch of lazily kept pure
//! results: they write exactly what the general way writes, and only for new nodes.

use flow_ledger::{
    CallOutcome, CallStatus, Error, EventFilter, Ledger, PureBatchRecorded, PureCall, PureRecorded,
    PureResult, RunLease, RunStatus, StepStatus, Timestamp, canonical_hash,
};
use serde_json::json;

use crate::common::{LEASE, TestDb, event_types, new_run, running, step, worker};

crate::conformance!(
    fresh_pure_call_matches_the_general_way,
    batch_writes_what_one_call_at_a_time_writes,
    batch_keeps_every_character_of_its_values,
    batch_records_every_result_with_its_events,
    batch_is_all_or_nothing_when_a_node_is_not_new,
    a_long_batch_is_written_in_order_and_all_or_nothing,
    batch_is_fenced_by_the_run_lease,
    batch_refuses_a_key_used_by_another_run,
    concurrent_writers_commit_together_and_fail_alone,
    finish_run_with_records_kept_results_and_the_finish_together,
);

fn result(node: &str, key: &str, at: Timestamp) -> PureResult {
    let request = json!({ "node": node });
    PureResult {
        step_id: node.into(),
        node_id: node.into(),
        tool_call_id: node.into(),
        tool: "core.echo".into(),
        idempotency_key: key.into(),
        request_hash: canonical_hash(&request),
        request,
        output: json!({ "out": node }),
        started_at: at,
        finished_at: Timestamp(at.0 + 1),
    }
}

fn pure<'a>(run: &'a RunLease, node: &str, out: serde_json::Value) -> PureCall<'a> {
    let request = json!({ "node": node });
    PureCall {
        run,
        step: step(node, node, 0),
        tool_call_id: node.into(),
        tool: "core.echo".into(),
        idempotency_key: format!("{}:{node}", run.run_id),
        request_hash: canonical_hash(&request),
        request,
        outcome: CallOutcome::Succeeded(out),
        retry_failed: false,
        next_step: None,
    }
}

/// Everything a reader sees of a run's steps, calls, attempts and events, minus ids.
async fn snapshot(l: &Ledger, run_id: &str) -> serde_json::Value {
    let steps: Vec<_> = l
        .list_steps(run_id)
        .await
        .unwrap()
        .into_iter()
        .map(|s| {
            json!([
                s.step_id,
                s.status.as_str(),
                s.output,
                s.tool_call_id,
                s.started_at,
                s.finished_at
            ])
        })
        .collect();
    let calls: Vec<_> = l
        .list_calls(run_id)
        .await
        .unwrap()
        .into_iter()
        .map(|c| {
            json!([
                c.tool_call_id,
                c.status.as_str(),
                c.attempt_count,
                c.output,
                c.current_key
            ])
        })
        .collect();
    let attempts: Vec<_> = l
        .list_attempts(run_id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| {
            let key = a.sent_key.strip_prefix(run_id).map(str::to_owned);
            json!([a.tool_call_id, a.attempt, key, a.requests_sent])
        })
        .collect();
    let events: Vec<_> = l
        .list_events(EventFilter {
            run_id: Some(run_id.into()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|e| json!([e.event_type.as_str(), e.step_id, e.tool_call_id, e.payload]))
        .collect();
    json!({ "steps": steps, "calls": calls, "attempts": attempts, "events": events })
}

/// Records `batch` for run `a` (`run_a`) in one batch, after the test recorded the same
/// nodes one at a time for `run_b`; checks the batch took them all and both runs' steps
/// read alike, and returns the two snapshots (`run_a`, `run_b`) to compare further.
async fn batch_beside_one_at_a_time(
    db: &TestDb,
    a: &RunLease,
    batch: &[PureResult],
    t: Timestamp,
) -> (serde_json::Value, serde_json::Value) {
    let got = db.ledger.record_pure_calls(a, batch, t).await.unwrap();
    assert_eq!(got, PureBatchRecorded::All);
    let (sa, sb) = (
        snapshot(&db.ledger, "run_a").await,
        snapshot(&db.ledger, "run_b").await,
    );
    assert_eq!(sa["steps"], sb["steps"]);
    (sa, sb)
}

async fn fresh_pure_call_matches_the_general_way(db: TestDb) {
    // Run a: a brand-new node (the one-statement way). Run b: the same node after its
    // step was created running first (an interrupted step: the general way).
    let a = running(&db, "run_a", &worker("1")).await;
    let b = running(&db, "run_b", &worker("1")).await;
    let now = db.now();
    let got = db
        .ledger
        .record_pure_call(pure(&a, "shape", json!("hi")), now)
        .await;
    assert_eq!(got.unwrap(), PureRecorded::Recorded);
    db.ledger
        .create_step(&b, step("shape", "shape", 0), now)
        .await
        .unwrap();
    let got = db
        .ledger
        .record_pure_call(pure(&b, "shape", json!("hi")), now)
        .await;
    assert_eq!(got.unwrap(), PureRecorded::Recorded);
    let (sa, sb) = (
        snapshot(&db.ledger, "run_a").await,
        snapshot(&db.ledger, "run_b").await,
    );
    assert_eq!(sa["steps"], sb["steps"]);
    assert_eq!(sa["attempts"], sb["attempts"]);
    assert_eq!(sa["events"], sb["events"]);
    // The keys differ by run id only.
    assert_eq!(sa["calls"][0][4], json!("run_a:shape:1"));
    assert_eq!(sb["calls"][0][4], json!("run_b:shape:1"));
}

async fn batch_writes_what_one_call_at_a_time_writes(db: TestDb) {
    let a = running(&db, "run_a", &worker("1")).await;
    let b = running(&db, "run_b", &worker("1")).await;
    let t = db.now();
    let mut batch = Vec::new();
    for node in ["x", "y", "z"] {
        let mut r = result(node, &format!("run_a:{node}"), t);
        r.finished_at = t;
        batch.push(r);
        let mut one = pure(&b, node, json!({ "out": node }));
        one.request = json!({ "node": node });
        one.request_hash = canonical_hash(&one.request);
        let got = db.ledger.record_pure_call(one, t).await.unwrap();
        assert_eq!(got, PureRecorded::Recorded);
    }
    let (sa, sb) = batch_beside_one_at_a_time(&db, &a, &batch, t).await;
    assert_eq!(sa["attempts"], sb["attempts"]);
    assert_eq!(sa["events"], sb["events"]);
    let strip = |v: &serde_json::Value| {
        let mut v = v.clone();
        for c in v.as_array_mut().unwrap() {
            c[4] = json!(null);
        }
        v
    };
    assert_eq!(strip(&sa["calls"]), strip(&sb["calls"]));
}

/// The batch's rows travel to SQLite as binary JSON with raw strings: quotes,
/// backslashes, escapes, non-ASCII and long values come back byte for byte, as the
/// one-at-a-time way (plain SQL parameters) stores them.
async fn batch_keeps_every_character_of_its_values(db: TestDb) {
    let a = running(&db, "run_a", &worker("1")).await;
    let b = running(&db, "run_b", &worker("1")).await;
    let t = db.now();
    let awkward = [
        json!("say \"hi\" \\ and \\\" then\nnew line\ttab \u{0001}\u{001f}"),
        json!({ "é": "ünïcödé ✓ 😀 𝄞", "k\"ey": ["\\u0041", "\u{7f}", null, true, 1.5e300] }),
        json!("x".repeat(70_000)),
        json!({ "nested": { "deep": [[["\\\\"]]], "empty": "" } }),
    ];
    let mut batch = Vec::new();
    for (i, out) in awkward.iter().enumerate() {
        let node = format!("n{i}");
        let request = json!({ "node": node, "with": out });
        let key = format!("ké\"y {i} ✓");
        batch.push(PureResult {
            step_id: node.clone(),
            node_id: node.clone(),
            tool_call_id: node.clone(),
            tool: "core.echo".into(),
            idempotency_key: format!("run_a:{key}"),
            request_hash: canonical_hash(&request),
            request: request.clone(),
            output: out.clone(),
            started_at: t,
            finished_at: t,
        });
        let mut one = pure(&b, &node, out.clone());
        one.idempotency_key = format!("run_b:{key}");
        one.request_hash = canonical_hash(&request);
        one.request = request;
        let got = db.ledger.record_pure_call(one, t).await.unwrap();
        assert_eq!(got, PureRecorded::Recorded);
    }
    let (sa, sb) = batch_beside_one_at_a_time(&db, &a, &batch, t).await;
    assert_eq!(sa["events"], sb["events"]);
    for (i, out) in awkward.iter().enumerate() {
        assert_eq!(&sa["steps"][i][2], out, "step n{i}'s output");
        assert_eq!(&sa["calls"][i][3], out, "call n{i}'s output");
    }
    // The keys and the calls' requests, read back as stored.
    let calls = db.ledger.list_calls("run_a").await.unwrap();
    for (i, c) in calls.iter().enumerate() {
        assert_eq!(c.idempotency_key, format!("run_a:ké\"y {i} ✓"));
        assert_eq!(c.request, batch[i].request, "call n{i}'s request");
        assert_eq!(c.request_hash, batch[i].request_hash);
    }
}

async fn batch_records_every_result_with_its_events(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    let t = db.now();
    let batch = vec![
        result("a", "run_a:a", t),
        result("b", "run_a:b", t),
        result("c", "run_a:c", t),
    ];
    let got = db
        .ledger
        .record_pure_calls(&run, &batch, db.now())
        .await
        .unwrap();
    assert_eq!(got, PureBatchRecorded::All);
    let steps = db.ledger.list_steps("run_a").await.unwrap();
    assert_eq!(steps.len(), 3);
    for s in &steps {
        assert_eq!(s.status, StepStatus::Succeeded);
        assert_eq!(s.output, Some(json!({ "out": s.node_id })));
        assert_eq!(
            (s.started_at, s.finished_at),
            (Some(t), Some(Timestamp(t.0 + 1)))
        );
        assert_eq!(s.tool_call_id.as_deref(), Some(s.node_id.as_str()));
    }
    for c in db.ledger.list_calls("run_a").await.unwrap() {
        assert_eq!(
            (c.status, c.attempt_count, c.outbound_requests),
            (CallStatus::Succeeded, 1, 0)
        );
    }
    assert_eq!(db.ledger.list_attempts("run_a").await.unwrap().len(), 3);
    assert!(db.ledger.list_usage("run_a").await.unwrap().is_empty());
    let mut expected = vec!["run.queued", "run.started"];
    for _ in 0..3 {
        expected.extend(["step.started", "step.succeeded"]);
    }
    assert_eq!(event_types(&db, "run_a").await, expected);
    // A node recorded this way replays like any other.
    match db
        .ledger
        .record_pure_call(pure(&run, "b", json!("other")), db.now())
        .await
        .unwrap()
    {
        PureRecorded::Replayed(r) => assert_eq!(r.output, Some(json!({ "out": "b" }))),
        other => panic!("expected a replay, got {other:?}"),
    }
}

async fn batch_is_all_or_nothing_when_a_node_is_not_new(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    let t = db.now();
    db.ledger
        .record_pure_call(pure(&run, "b", json!(1)), t)
        .await
        .unwrap();
    let before = snapshot(&db.ledger, "run_a").await;
    let batch = vec![
        result("a", "run_a:a", t),
        result("b", "run_a:b", t),
        result("c", "run_a:c", t),
    ];
    let got = db
        .ledger
        .record_pure_calls(&run, &batch, db.now())
        .await
        .unwrap();
    assert_eq!(
        got,
        PureBatchRecorded::NotNew {
            node_id: "b".into()
        }
    );
    assert_eq!(
        snapshot(&db.ledger, "run_a").await,
        before,
        "nothing of the batch stays"
    );
    // A step that exists without a call is not new either.
    db.ledger
        .create_step(&run, step("d", "d", 0), t)
        .await
        .unwrap();
    let got = db
        .ledger
        .record_pure_calls(&run, &[result("d", "run_a:d", t)], t)
        .await
        .unwrap();
    assert_eq!(
        got,
        PureBatchRecorded::NotNew {
            node_id: "d".into()
        }
    );
}

/// A batch of 300 results: every result written, its events in batch order; and one
/// node that is not new, far into the batch, leaves nothing of the rows before it.
async fn a_long_batch_is_written_in_order_and_all_or_nothing(db: TestDb) {
    let n = 300;
    let nodes: Vec<String> = (0..n).map(|i| format!("n{i:03}")).collect();
    let batch = |run: &str, t| -> Vec<PureResult> {
        nodes
            .iter()
            .map(|node| result(node, &format!("{run}:{node}"), t))
            .collect()
    };
    let a = running(&db, "run_a", &worker("1")).await;
    let t = db.now();
    let got = db
        .ledger
        .record_pure_calls(&a, &batch("run_a", t), t)
        .await
        .unwrap();
    assert_eq!(got, PureBatchRecorded::All);
    assert_eq!(db.ledger.list_steps("run_a").await.unwrap().len(), n);
    assert_eq!(db.ledger.list_calls("run_a").await.unwrap().len(), n);
    assert_eq!(db.ledger.list_attempts("run_a").await.unwrap().len(), n);
    let events = db
        .ledger
        .list_events(EventFilter {
            run_id: Some("run_a".into()),
            limit: 10_000,
            ..Default::default()
        })
        .await
        .unwrap();
    let steps: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| Some((e.event_type.as_str().to_owned(), e.step_id.clone()?)))
        .collect();
    let expected: Vec<(String, String)> = nodes
        .iter()
        .flat_map(|node| {
            [
                ("step.started".to_owned(), node.clone()),
                ("step.succeeded".to_owned(), node.clone()),
            ]
        })
        .collect();
    assert_eq!(steps, expected, "events in batch order");

    let b = running(&db, "run_b", &worker("1")).await;
    db.ledger
        .record_pure_call(pure(&b, "n250", json!(1)), t)
        .await
        .unwrap();
    let before = snapshot(&db.ledger, "run_b").await;
    let got = db
        .ledger
        .record_pure_calls(&b, &batch("run_b", t), t)
        .await
        .unwrap();
    assert_eq!(
        got,
        PureBatchRecorded::NotNew {
            node_id: "n250".into()
        }
    );
    assert_eq!(snapshot(&db.ledger, "run_b").await, before, "nothing stays");
}

async fn batch_is_fenced_by_the_run_lease(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    let t = db.now();
    let later = db.advance(LEASE + std::time::Duration::from_secs(1));
    let got = db
        .ledger
        .record_pure_calls(&run, &[result("a", "run_a:a", t)], later)
        .await;
    assert!(matches!(got, Err(Error::LeaseLost)), "{got:?}");
    // Taken over by another worker: the old holder's batch is refused too.
    let other = db
        .ledger
        .claim_run("run_a", &worker("2"), LEASE, later)
        .await
        .unwrap();
    assert!(other.token > run.token);
    let got = db
        .ledger
        .record_pure_calls(&run, &[result("a", "run_a:a", t)], later)
        .await;
    assert!(matches!(got, Err(Error::LeaseLost)), "{got:?}");
    assert!(db.ledger.list_steps("run_a").await.unwrap().is_empty());
}

async fn batch_refuses_a_key_used_by_another_run(db: TestDb) {
    let a = running(&db, "run_a", &worker("1")).await;
    let b = running(&db, "run_b", &worker("1")).await;
    let t = db.now();
    let mut first = pure(&a, "greet", json!("hi"));
    first.idempotency_key = "greet-shared".into();
    db.ledger.record_pure_call(first, t).await.unwrap();
    let got = db
        .ledger
        .record_pure_calls(&b, &[result("greet", "greet-shared", t)], t)
        .await;
    assert_eq!(
        got.unwrap(),
        PureBatchRecorded::NotNew {
            node_id: "greet".into()
        }
    );
    assert!(db.ledger.list_steps("run_b").await.unwrap().is_empty());
}

async fn concurrent_writers_commit_together_and_fail_alone(db: TestDb) {
    // 16 tasks write at once (on SQLite they share group commits); one of them writes
    // under a lease that was taken over and must fail alone, leaving nothing.
    let mut runs = Vec::new();
    for i in 0..16 {
        runs.push(running(&db, &format!("run_{i}"), &worker("1")).await);
    }
    let t = db.now();
    let stale = runs[7].clone();
    db.ledger
        .claim_run("run_7", &worker("2"), LEASE, t)
        .await
        .unwrap_err();
    db.ledger.release_run(&runs[7], t).await.unwrap();
    db.ledger
        .claim_run("run_7", &worker("2"), LEASE, t)
        .await
        .unwrap();
    let tasks: Vec<_> = runs
        .into_iter()
        .map(|run| {
            let l = db.ledger.clone();
            tokio::spawn(async move {
                let key = format!("{}:n", run.run_id);
                let r = l.record_pure_calls(&run, &[result("n", &key, t)], t).await;
                (run.run_id, r)
            })
        })
        .collect();
    for task in tasks {
        let (run_id, r) = task.await.unwrap();
        let steps = db.ledger.list_steps(&run_id).await.unwrap();
        if run_id == stale.run_id {
            assert!(matches!(r, Err(Error::LeaseLost)), "{r:?}");
            assert!(steps.is_empty());
        } else {
            assert_eq!(r.unwrap(), PureBatchRecorded::All);
            assert_eq!(steps.len(), 1);
        }
    }
}

async fn finish_run_with_records_kept_results_and_the_finish_together(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    let t = db.now();
    let finish = || flow_ledger::RunFinish {
        status: flow_ledger::RunStatus::Succeeded,
        output: Some(json!({ "b": { "out": "b" } })),
        error: None,
    };
    // Not new: nothing is written, the run is still running.
    db.ledger
        .record_pure_call(pure(&run, "b", json!(1)), t)
        .await
        .unwrap();
    let before = snapshot(&db.ledger, "run_a").await;
    let got = db
        .ledger
        .finish_run_with(
            &run,
            &[result("a", "run_a:a", t), result("b", "run_a:b", t)],
            finish(),
            t,
        )
        .await
        .unwrap();
    assert_eq!(got, None);
    assert_eq!(snapshot(&db.ledger, "run_a").await, before);
    assert_eq!(
        db.ledger.get_run("run_a").await.unwrap().status,
        flow_ledger::RunStatus::Running
    );
    // New: both in one transaction, the run's event after its steps'.
    let got = db
        .ledger
        .finish_run_with(
            &run,
            &[result("a", "run_a:a", t), result("c", "run_a:c", t)],
            finish(),
            t,
        )
        .await
        .unwrap()
        .expect("finished");
    assert_eq!(got.status, flow_ledger::RunStatus::Succeeded);
    let steps = db.ledger.list_steps("run_a").await.unwrap();
    assert_eq!(steps.len(), 3);
    assert!(steps.iter().all(|s| s.status == StepStatus::Succeeded));
    let types = event_types(&db, "run_a").await;
    let step = ["step.started", "step.succeeded"];
    let expected: Vec<&str> = ["run.queued", "run.started"]
        .into_iter()
        .chain(step.repeat(3))
        .chain(["run.succeeded"])
        .collect();
    assert_eq!(types, expected, "events in the order they happened");
    assert_eq!(got.output, Some(json!({ "b": { "out": "b" } })));
    assert_eq!(
        (got.id.as_str(), got.status),
        ("run_a", RunStatus::Succeeded)
    );
    // The finish returns what it wrote, not the run's inputs and text (read them back).
    let read = db.ledger.get_run("run_a").await.unwrap();
    assert_eq!(read.workflow_text, new_run("run_a").workflow_text);
    assert_eq!(read.output, got.output);
    // A lost lease is reported as such.
    let b = running(&db, "run_b", &worker("1")).await;
    let later = db.advance(LEASE + std::time::Duration::from_secs(1));
    let got = db
        .ledger
        .finish_run_with(&b, &[result("a", "run_b:a", t)], finish(), later)
        .await;
    assert!(matches!(got, Err(Error::LeaseLost)), "{got:?}");
}
