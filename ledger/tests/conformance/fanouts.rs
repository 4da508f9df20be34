//! Fan-out lists (migration 0012, `ledger/src/fanouts.rs`) and the item calls of a
//! `for_each` node: a list is stored once per (run, node) under the live run lease and
//! replaced whole; a holder that lost the run writes none; kept pure results of items
//! are recorded under their own call id (`node[<key>]`), not their node's.

use flow_ledger::{Error, Fanout, PureBatchRecorded, PureResult, Timestamp, canonical_hash};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    a_list_is_stored_once_and_replaced_whole,
    a_holder_that_lost_the_run_writes_no_list,
    kept_results_of_items_are_recorded_under_their_own_call,
);

fn list(keys: &[&str], vanished: &[&str], at: Timestamp) -> Fanout {
    Fanout {
        node_id: "notify".into(),
        items: json!(keys.iter().map(|k| json!({ "id": k })).collect::<Vec<_>>()),
        keys: keys.iter().map(|k| (*k).to_string()).collect(),
        vanished: vanished.iter().map(|k| (*k).to_string()).collect(),
        created_at: at,
        updated_at: at,
    }
}

async fn a_list_is_stored_once_and_replaced_whole(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    assert_eq!(db.ledger.get_fanout("run_a", "notify").await.unwrap(), None);
    let first = db.now();
    db.ledger
        .record_fanout(&run, &list(&["a", "b", "c"], &[], first), first)
        .await
        .unwrap();
    let stored = db.ledger.get_fanout("run_a", "notify").await.unwrap();
    assert_eq!(stored, Some(list(&["a", "b", "c"], &[], first)));
    let later = db.advance(std::time::Duration::from_secs(5));
    db.ledger
        .record_fanout(&run, &list(&["c", "a"], &["b"], later), later)
        .await
        .unwrap();
    let stored = db
        .ledger
        .get_fanout("run_a", "notify")
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(stored.keys, ["c", "a"], "replaced whole, in the new order");
    assert_eq!(stored.vanished, ["b"]);
    assert_eq!(stored.items, json!([{ "id": "c" }, { "id": "a" }]));
    assert_eq!(
        (stored.created_at, stored.updated_at),
        (first, later),
        "first stored when the list was first evaluated"
    );
    assert_eq!(
        db.ledger.get_fanout("run_a", "other").await.unwrap(),
        None,
        "one row per node"
    );
}

async fn a_holder_that_lost_the_run_writes_no_list(db: TestDb) {
    let old = running(&db, "run_a", &worker("1")).await;
    db.advance(LEASE);
    let new = db
        .ledger
        .claim_run("run_a", &worker("2"), LEASE, db.now())
        .await
        .unwrap();
    let now = db.now();
    let err = db
        .ledger
        .record_fanout(&old, &list(&["x"], &[], now), now)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost), "{err:?}");
    assert_eq!(db.ledger.get_fanout("run_a", "notify").await.unwrap(), None);
    db.ledger
        .record_fanout(&new, &list(&["y"], &[], now), now)
        .await
        .unwrap();
    let stored = db.ledger.get_fanout("run_a", "notify").await.unwrap();
    assert_eq!(stored.map(|f| f.keys), Some(vec!["y".to_string()]));
}

async fn kept_results_of_items_are_recorded_under_their_own_call(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    let at = db.now();
    let item = |key: &str| {
        let request = json!({ "to": key });
        PureResult {
            step_id: format!("notify[{key}]"),
            node_id: "notify".into(),
            tool_call_id: format!("notify[{key}]"),
            tool: "core.echo".into(),
            idempotency_key: format!("run_a:notify[{key}]"),
            request_hash: canonical_hash(&request),
            request,
            output: json!({ "sent": key }),
            started_at: at,
            finished_at: at,
        }
    };
    let recorded = db
        .ledger
        .record_pure_calls(&run, &[item("a"), item("b")], at)
        .await
        .unwrap();
    assert_eq!(recorded, PureBatchRecorded::All);
    let mut calls: Vec<String> = db
        .ledger
        .list_calls("run_a")
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.tool_call_id)
        .collect();
    calls.sort();
    assert_eq!(calls, ["notify[a]", "notify[b]"]);
    let steps = db.ledger.list_steps("run_a").await.unwrap();
    assert!(
        steps
            .iter()
            .all(|s| s.node_id == "notify" && s.tool_call_id.as_deref() == Some(s.step_id.as_str())),
        "{steps:?}"
    );
    // The same item again is not new: the batch writes nothing.
    let again = db
        .ledger
        .record_pure_calls(&run, &[item("b")], at)
        .await
        .unwrap();
    assert!(
        matches!(again, PureBatchRecorded::NotNew { .. }),
        "{again:?}"
    );
}
