//! The worklist's reads: the inbox filters (run id prefix, minimum age), and the
//! many-at-once reads of run names, last probes and calls by id, which must answer for
//! every id given in one statement and leave unknown ids out.

use std::time::Duration;

use flow_ledger::inbox::InboxFilter;
use flow_ledger::{
    CallStatus, EventType, NewProbe, ProbeDecision, ProbeObserved, Resolution, Resolve, RunStatus,
};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    the_inbox_filters_by_prefix_and_age,
    names_and_probes_are_read_for_many_ids_at_once,
    calls_and_events_are_read_for_many_ids_at_once,
);

/// Run `run_id` with its call `pay` in doubt (the run paused).
async fn in_doubt(db: &TestDb, run_id: &str) {
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
    db.ledger
        .pause_run(&run, "pay in doubt", db.now())
        .await
        .unwrap();
}

fn probe(run_id: &str, observed: ProbeObserved, decision: ProbeDecision) -> NewProbe {
    NewProbe {
        run_id: run_id.into(),
        tool_call_id: "pay".into(),
        sent_key: format!("{run_id}-k:1"),
        observed,
        decision,
        http_status: Some(503),
        detail: None,
        response: Some(json!({"status": 503})),
        next_probe_at: None,
        by: "host:1:1".into(),
        tool: "pay".into(),
        attempt: 1,
        requests_sent: 1,
        max_resends: 1,
    }
}

fn ids(calls: &[flow_ledger::ToolCall]) -> Vec<&str> {
    calls.iter().map(|c| c.run_id.as_str()).collect()
}

async fn the_inbox_filters_by_prefix_and_age(db: TestDb) {
    in_doubt(&db, "batch7-a").await;
    db.advance(Duration::from_secs(600));
    in_doubt(&db, "batch7-b").await;
    in_doubt(&db, "other-c").await;
    let all = db
        .ledger
        .in_doubt_inbox(InboxFilter::default())
        .await
        .unwrap();
    assert_eq!(
        ids(&all),
        ["batch7-a", "batch7-b", "other-c"],
        "oldest first"
    );
    let prefixed = InboxFilter {
        run_prefix: Some("batch7-".into()),
        ..InboxFilter::default()
    };
    let got = db.ledger.in_doubt_inbox(prefixed).await.unwrap();
    assert_eq!(ids(&got), ["batch7-a", "batch7-b"]);
    // A prefix is a prefix: not a substring, not a pattern.
    for p in ["atch7", "batch_", "%"] {
        let f = InboxFilter {
            run_prefix: Some(p.into()),
            ..InboxFilter::default()
        };
        assert!(db.ledger.in_doubt_inbox(f).await.unwrap().is_empty(), "{p}");
    }
    // In doubt for at least 5 minutes: only the first.
    let old = InboxFilter {
        in_doubt_before: Some(db.now().minus(Duration::from_secs(300))),
        ..InboxFilter::default()
    };
    assert_eq!(
        ids(&db.ledger.in_doubt_inbox(old).await.unwrap()),
        ["batch7-a"]
    );
    let both = InboxFilter {
        run_prefix: Some("other".into()),
        in_doubt_before: Some(db.now().minus(Duration::from_secs(300))),
        ..InboxFilter::default()
    };
    assert!(db.ledger.in_doubt_inbox(both).await.unwrap().is_empty());
    let wrong_tool = InboxFilter {
        tool: Some("pay".into()),
        ..InboxFilter::default()
    };
    assert!(
        db.ledger
            .in_doubt_inbox(wrong_tool)
            .await
            .unwrap()
            .is_empty()
    );
    let one = InboxFilter {
        limit: 1,
        tool: Some("payments".into()),
        node: Some("pay".into()),
        ..InboxFilter::default()
    };
    assert_eq!(
        ids(&db.ledger.in_doubt_inbox(one).await.unwrap()),
        ["batch7-a"]
    );
    // A settled call leaves the inbox.
    db.ledger
        .resolve_call(
            Resolve {
                run_id: "batch7-a".into(),
                tool_call_id: "pay".into(),
                resolution: Resolution::Failed("declined".into()),
                by: "ada".into(),
                note: None,
            },
            db.now(),
        )
        .await
        .unwrap();
    let left = db
        .ledger
        .in_doubt_inbox(InboxFilter::default())
        .await
        .unwrap();
    assert_eq!(ids(&left), ["batch7-b", "other-c"]);
}

async fn names_and_probes_are_read_for_many_ids_at_once(db: TestDb) {
    for r in ["run_a", "run_b", "run_c"] {
        in_doubt(&db, r).await;
    }
    let asked: Vec<String> = ["run_c", "run_a", "nope", "run_a"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let names = db.ledger.run_names(&asked).await.unwrap();
    let got: Vec<(&str, &str, RunStatus)> = names
        .iter()
        .map(|n| (n.id.as_str(), n.workflow.as_str(), n.status))
        .collect();
    assert_eq!(
        got,
        [
            ("run_a", "wf", RunStatus::Paused),
            ("run_c", "wf", RunStatus::Paused)
        ]
    );
    assert!(db.ledger.run_names(&[]).await.unwrap().is_empty());

    // run_a probed twice (the last one counts), run_b once, run_c never.
    let probes = [
        ("run_a", ProbeObserved::Unknown, ProbeDecision::ProbeAgain),
        (
            "run_b",
            ProbeObserved::NotFound,
            ProbeDecision::NeedsOperator,
        ),
        (
            "run_a",
            ProbeObserved::Unknown,
            ProbeDecision::NeedsOperator,
        ),
    ];
    for (run, observed, decision) in probes {
        db.ledger
            .record_probe(probe(run, observed, decision), db.now())
            .await
            .unwrap();
    }
    let pairs: Vec<(String, String)> = ["run_a", "run_b", "run_c", "nope"]
        .iter()
        .map(|r| (r.to_string(), "pay".to_string()))
        .collect();
    let last = db.ledger.last_probes(&pairs).await.unwrap();
    let got: Vec<(&str, u32, ProbeObserved, ProbeDecision)> = last
        .iter()
        .map(|l| {
            (
                l.run_id.as_str(),
                l.probe.probe,
                l.probe.observed,
                l.probe.decision,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "run_a",
                2,
                ProbeObserved::Unknown,
                ProbeDecision::NeedsOperator
            ),
            (
                "run_b",
                1,
                ProbeObserved::NotFound,
                ProbeDecision::NeedsOperator
            ),
        ]
    );
    assert_eq!(last[0].probe.response, Some(json!({"status": 503})));
    assert!(db.ledger.last_probes(&[]).await.unwrap().is_empty());
}

async fn calls_and_events_are_read_for_many_ids_at_once(db: TestDb) {
    for r in ["run_a", "run_b", "run_c"] {
        in_doubt(&db, r).await;
    }
    let pairs: Vec<(String, String)> = ["run_a", "run_b", "run_c", "nope"]
        .iter()
        .map(|r| (r.to_string(), "pay".to_string()))
        .collect();
    // Why each went in doubt: its last `tool_call.in_doubt` event, for a page at once.
    let doubts = db
        .ledger
        .last_events(&pairs, EventType::ToolCallInDoubt)
        .await
        .unwrap();
    let got: Vec<(Option<&str>, &str)> = doubts
        .iter()
        .map(|e| {
            (
                e.run_id.as_deref(),
                e.payload["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (Some("run_a"), "timed out"),
            (Some("run_b"), "timed out"),
            (Some("run_c"), "timed out")
        ]
    );
    assert!(
        db.ledger
            .last_events(&pairs, EventType::ToolCallResolved)
            .await
            .unwrap()
            .is_empty(),
        "none of that type yet"
    );
    let wrong_node = ("run_a".to_string(), "ship".to_string());
    let mut asked = pairs.clone();
    asked.push(wrong_node);
    let calls = db.ledger.calls_by_ids(&asked).await.unwrap();
    let got: Vec<(&str, &str, CallStatus)> = calls
        .iter()
        .map(|c| (c.run_id.as_str(), c.tool_call_id.as_str(), c.status))
        .collect();
    assert_eq!(
        got,
        [
            ("run_a", "pay", CallStatus::InDoubt),
            ("run_b", "pay", CallStatus::InDoubt),
            ("run_c", "pay", CallStatus::InDoubt),
        ]
    );
    assert_eq!(calls[0].current_key, "run_a-k:1");
}
