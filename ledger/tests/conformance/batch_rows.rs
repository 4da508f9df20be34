//! Rows that batch statements hand the database at once (`runs:batch`, a claim of
//! several runs): on SQLite as binary JSON with raw strings (`conn::rows_arg`), on
//! PostgreSQL as JSON text. Every character comes back as given.

use flow_ledger::{ClaimRuns, EventFilter, EventType, NewRun, Timestamp};
use serde_json::json;

use crate::common::*;

crate::conformance!(a_batch_of_runs_keeps_every_character);

/// A batch of runs (`enqueue_batch`) and a claim of several (`run.started` for each) hand
/// their rows to SQLite as binary JSON with raw strings: names, inputs, priorities,
/// times and trace parents come back as given, quotes, escapes and non-ASCII included,
/// in the same order as one at a time.
async fn a_batch_of_runs_keeps_every_character(db: TestDb) {
    let now = db.now();
    let names = ["wf \"quoted\" \\ back", "ünïcödé ✓ 😀", "line\nbreak\ttab"];
    let runs: Vec<NewRun> = names
        .iter()
        .enumerate()
        .map(|(i, name)| NewRun {
            id: format!("run_{i}"),
            workflow_name: (*name).into(),
            workflow_text: format!("name: '{i}'\nnodes: {{}}\n"),
            inputs: json!({ "k\"ey": name, "n": [i, -1, null, true], "\\": { "é": "\u{1}" } }),
            priority: 1 - i32::try_from(i).unwrap(),
            not_before: (i == 1).then_some(Timestamp(now.0 - 5)),
            trace_parent: (i == 2)
                .then(|| "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
        })
        .collect();
    let got = db
        .ledger
        .enqueue_batch(runs.clone(), None, now)
        .await
        .unwrap();
    assert_eq!(got.len(), 3);
    for (want, got) in runs.iter().zip(&got) {
        assert!(got.created);
        let run = db.ledger.get_run(&want.id).await.unwrap();
        assert_eq!(run.workflow_name, want.workflow_name);
        assert_eq!(run.workflow_text, want.workflow_text);
        assert_eq!(run.inputs, want.inputs);
        assert_eq!(run.priority, want.priority);
        assert_eq!(run.not_before, want.not_before.unwrap_or(now));
        assert_eq!(run.trace_segment, want.trace_parent);
    }
    let queued = names_in_events(&db, EventType::RunQueued).await;
    let want: Vec<_> = runs
        .iter()
        .map(|r| (r.id.clone(), json!(r.workflow_name)))
        .collect();
    assert_eq!(queued, want, "run.queued events, in batch order");
    // One claim takes all three: one run.started each, in queue order (priority first).
    let w = worker("1");
    let claim = ClaimRuns {
        worker: &w,
        lease: LEASE,
        limit: 3,
    };
    let claimed = db.ledger.claim_next(claim, now).await.unwrap();
    let ids: Vec<_> = claimed.iter().map(|l| l.run_id.as_str()).collect();
    assert_eq!(ids, ["run_0", "run_1", "run_2"]);
    let started = names_in_events(&db, EventType::RunStarted).await;
    assert_eq!(started, want, "run.started events, in queue order");
}

/// The run and the `workflow_name` of its payload of each event of type `t`, in order.
async fn names_in_events(db: &TestDb, t: EventType) -> Vec<(String, serde_json::Value)> {
    db.ledger
        .list_events(EventFilter::default())
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type == t)
        .map(|e| (e.run_id.unwrap(), e.payload["workflow_name"].clone()))
        .collect()
}
