//! Waits (migration 0011, `ledger/src/waits`): a node that completes from outside the
//! run. Event waits and published events here; callbacks and heartbeats in
//! `waits/callbacks.rs`; the deadline sweep and the races it runs in `waits/sweep.rs`.

mod callbacks;
mod sweep;

use std::sync::Arc;
use std::time::Duration;

use flow_ledger::{
    BeginWait, Error, EventFilter, EventType, Published, PublishedEvent, RunLease, RunStatus,
    Timestamp, Wait, WaitKind, WaitStatus,
};
use serde_json::{Value, json};

use crate::common::*;

crate::conformance!(
    a_wait_begins_once_per_step,
    publishing_is_idempotent_on_the_event_id,
    one_event_id_published_twice_at_once_signals_once,
    lookback_reaches_back_from_when_the_wait_began,
    a_publish_while_the_run_is_held_stops_its_pause,
    a_worker_that_lost_the_run_cannot_mark_a_signal_seen,
    a_publish_and_a_pause_never_leave_the_run_paused,
    an_event_completes_the_wait_once,
    an_event_stamped_before_the_wait_began_counts_when_published_after,
    a_look_reads_on_from_where_it_stopped,
);

/// The event wait's node, and the event it waits for.
const NODE: &str = "await_ship";
const EVENT: &str = "shipment.delivered";

fn event_wait(step_id: &str, lookback_ms: i64, timeout_ms: i64) -> BeginWait {
    BeginWait {
        node_id: NODE.into(),
        step_id: step_id.into(),
        kind: WaitKind::Event,
        event_name: Some(EVENT.into()),
        matcher: Some("event.order == 42".into()),
        lookback_ms,
        timeout_ms,
        heartbeat_ms: None,
        token_hash: None,
    }
}

/// A run held by worker 1 with a running step `begin.step_id` of `begin.node_id`, which
/// has begun `begin`.
async fn begun(db: &TestDb, run_id: &str, begin: BeginWait) -> (RunLease, Wait) {
    let run = running(db, run_id, &worker("1")).await;
    db.ledger
        .create_step(&run, step(&begin.step_id, &begin.node_id, 0), db.now())
        .await
        .unwrap();
    let w = db.ledger.begin_wait(&run, begin, db.now()).await.unwrap();
    (run, w)
}

async fn get(db: &TestDb, run_id: &str, node_id: &str) -> Wait {
    db.ledger.get_wait(run_id, node_id).await.unwrap().unwrap()
}

async fn run_status(db: &TestDb, run_id: &str) -> RunStatus {
    db.ledger.get_run(run_id).await.unwrap().status
}

async fn pause(db: &TestDb, run: &RunLease) -> bool {
    db.ledger
        .pause_run_awaiting(run, "awaiting", db.now())
        .await
        .unwrap()
}

async fn publish(db: &TestDb, name: &str, id: &str, data: Value) -> Published {
    db.ledger
        .publish_event(name, Some(id), &data, Some("ops"), db.now())
        .await
        .unwrap()
}

async fn candidates(db: &TestDb, run_id: &str) -> Vec<PublishedEvent> {
    let (_, events) = db
        .ledger
        .wait_candidates(run_id, NODE, None)
        .await
        .unwrap()
        .unwrap();
    events
}

fn ids(events: &[PublishedEvent]) -> Vec<&str> {
    events.iter().map(|e| e.event_id.as_str()).collect()
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

fn assert_not_found<T: std::fmt::Debug>(r: Result<T, Error>, what: &str) {
    assert!(matches!(r, Err(Error::NotFound { .. })), "{what}: {r:?}");
}

/// `begin_wait` writes one pending row (deadline = now + timeout, `wait.requested`);
/// the same step again finds it as it stands; a new step of the node (a retry) waits
/// anew, even over a settled wait; a lease that ran out begins nothing.
async fn a_wait_begins_once_per_step(db: TestDb) {
    let (run, w) = begun(&db, "run_a", event_wait(NODE, 0, 60_000)).await;
    assert_eq!((w.status, w.kind), (WaitStatus::Pending, WaitKind::Event));
    assert_eq!((w.run_id.as_str(), w.step_id.as_str()), ("run_a", NODE));
    assert_eq!(w.event_name.as_deref(), Some(EVENT));
    assert_eq!(w.matcher.as_deref(), Some("event.order == 42"));
    assert_eq!(w.began_at, T0);
    let deadline = Timestamp(T0.0 + 60_000);
    assert_eq!((w.deadline, w.hard_deadline), (deadline, deadline));
    assert_eq!((w.signal, w.seen_signal, w.settled_at), (0, 0, None));
    assert_eq!(count(&db, EventType::WaitRequested).await, 1);

    db.advance(Duration::from_secs(5));
    let again = db
        .ledger
        .begin_wait(&run, event_wait(NODE, 0, 60_000), db.now())
        .await
        .unwrap();
    assert_eq!(again, w, "the same step keeps its row and its deadline");
    assert_eq!(count(&db, EventType::WaitRequested).await, 1);

    publish(&db, EVENT, "e1", json!({ "order": 42 })).await;
    let events = candidates(&db, "run_a").await;
    let done = db
        .ledger
        .complete_event_wait(&run, NODE, &events[0], db.now())
        .await
        .unwrap();
    assert_eq!(done.status, WaitStatus::Completed);

    db.advance(Duration::from_secs(1));
    let retry = "await_ship_retry1";
    db.ledger
        .create_step(&run, step(retry, NODE, 1), db.now())
        .await
        .unwrap();
    let anew = db
        .ledger
        .begin_wait(&run, event_wait(retry, 0, 30_000), db.now())
        .await
        .unwrap();
    assert_eq!(
        (anew.status, anew.step_id.as_str()),
        (WaitStatus::Pending, retry)
    );
    assert_eq!(anew.began_at, db.now());
    assert_eq!(anew.deadline, Timestamp(db.now().0 + 30_000));
    assert_eq!(anew.output, None);
    assert_eq!((anew.event_id.as_deref(), anew.settled_at), (None, None));
    assert_eq!(
        anew.signal, 0,
        "events before this step's wait are not its signal"
    );
    assert_eq!(count(&db, EventType::WaitRequested).await, 2);
    let rows = db
        .ledger
        .list_waits(flow_ledger::WaitFilter {
            run_id: Some("run_a".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rows, [anew], "one row per (run, node)");

    db.advance(LEASE);
    let lost = db
        .ledger
        .begin_wait(&run, event_wait("await_ship_retry2", 0, 30_000), db.now())
        .await;
    assert!(matches!(lost, Err(Error::LeaseLost)), "{lost:?}");
    assert_eq!(get(&db, "run_a", NODE).await.step_id, retry);
}

/// The same event id twice is one event (the second `duplicate`, nothing signalled);
/// no id gets an `ev_` one; names and ids must be 1 to 200 printable characters.
async fn publishing_is_idempotent_on_the_event_id(db: TestDb) {
    begun(&db, "run_a", event_wait(NODE, 0, 60_000)).await;
    let first = publish(&db, EVENT, "evt-1", json!({ "order": 42 })).await;
    assert_eq!(
        first,
        Published {
            event_id: "evt-1".into(),
            duplicate: false,
            signalled: 1,
        }
    );
    db.advance(Duration::from_secs(1));
    let second = publish(&db, EVENT, "evt-1", json!({ "order": 43 })).await;
    assert!(second.duplicate, "{second:?}");
    assert_eq!((second.event_id.as_str(), second.signalled), ("evt-1", 0));
    assert_eq!(
        get(&db, "run_a", NODE).await.signal,
        1,
        "a duplicate signals nothing"
    );
    let stored = db
        .ledger
        .list_published_events(Some(EVENT), 0)
        .await
        .unwrap();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(
        stored[0].data,
        json!({ "order": 42 }),
        "the first publish stands"
    );
    assert_eq!(stored[0].published_at, T0);
    assert_eq!(stored[0].published_by.as_deref(), Some("ops"));

    let generated = db
        .ledger
        .publish_event(EVENT, None, &json!({ "order": 44 }), None, db.now())
        .await
        .unwrap();
    assert!(generated.event_id.starts_with("ev_"), "{generated:?}");
    assert!(!generated.duplicate);
    let stored = db.ledger.list_published_events(None, 0).await.unwrap();
    assert_eq!(
        ids(&stored),
        [generated.event_id.as_str(), "evt-1"],
        "newest first"
    );

    let long = "x".repeat(201);
    let bad: [(&str, Option<&str>); 6] = [
        ("", None),
        ("   ", None),
        (&long, None),
        ("a\nb", None),
        (EVENT, Some("")),
        (EVENT, Some(&long)),
    ];
    for (name, id) in bad {
        let r = db
            .ledger
            .publish_event(name, id, &json!({}), None, db.now())
            .await;
        assert!(
            matches!(r, Err(Error::InvalidEvent { .. })),
            "name {name:?} id {id:?}: {r:?}"
        );
    }
    let longest = "x".repeat(200);
    publish(&db, &longest, &longest, json!(null)).await;
    assert_eq!(
        db.ledger
            .list_published_events(None, 0)
            .await
            .unwrap()
            .len(),
        3
    );
    assert_eq!(get(&db, "run_a", NODE).await.signal, 2);
}

/// Two publishers of the same event id at once: one stores and signals it, the other
/// is told `duplicate`; many rounds.
async fn one_event_id_published_twice_at_once_signals_once(db: TestDb) {
    begun(&db, "run_a", event_wait(NODE, 0, 60_000)).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    for round in 0..8 {
        let now = db.now();
        let publishers: Vec<_> = (0..2)
            .map(|i| {
                let (ledger, barrier) = (db.ledger.clone(), barrier.clone());
                let id = format!("e{round}");
                tokio::spawn(async move {
                    barrier.wait().await;
                    let data = json!({ "publisher": i });
                    ledger
                        .publish_event(EVENT, Some(&id), &data, None, now)
                        .await
                })
            })
            .collect();
        let mut duplicates = 0;
        for p in publishers {
            let p = p.await.unwrap().unwrap();
            assert_eq!(p.event_id, format!("e{round}"));
            duplicates += usize::from(p.duplicate);
        }
        assert_eq!(duplicates, 1, "round {round}");
        assert_eq!(get(&db, "run_a", NODE).await.signal, round + 1);
    }
    let stored = db.ledger.list_published_events(Some(EVENT), 0).await;
    assert_eq!(stored.unwrap().len(), 8);
}

/// A wait's candidates are its name's events from `lookback` before it began, oldest
/// first: an event 5 s before counts with 24 h (and with exactly 5 s), not with 0 or
/// 4.999 s; another name's never does. Only events after it began are its signal.
async fn lookback_reaches_back_from_when_the_wait_began(db: TestDb) {
    publish(&db, EVENT, "e-old", json!({ "order": 1 })).await;
    publish(&db, "shipment.lost", "e-other", json!({ "order": 1 })).await;
    db.advance(Duration::from_secs(5));
    let lookbacks = [
        ("run_day", 86_400_000),
        ("run_zero", 0),
        ("run_five", 5_000),
        ("run_short", 4_999),
    ];
    for (run_id, lookback) in lookbacks {
        begun(&db, run_id, event_wait(NODE, lookback, 60_000)).await;
    }
    assert_eq!(ids(&candidates(&db, "run_day").await), ["e-old"]);
    assert!(candidates(&db, "run_zero").await.is_empty());
    assert_eq!(ids(&candidates(&db, "run_five").await), ["e-old"]);
    assert!(candidates(&db, "run_short").await.is_empty());
    assert_eq!(get(&db, "run_day", NODE).await.signal, 0);

    db.advance(Duration::from_millis(1));
    let p = publish(&db, EVENT, "e-new", json!({ "order": 42 })).await;
    assert_eq!(p.signalled, 4);
    publish(&db, "shipment.lost", "e-other-2", json!({ "order": 42 })).await;
    assert_eq!(ids(&candidates(&db, "run_day").await), ["e-old", "e-new"]);
    assert_eq!(ids(&candidates(&db, "run_zero").await), ["e-new"]);
    let (w, events) = db
        .ledger
        .wait_candidates("run_zero", NODE, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(w.signal, 1, "one event of its name since it began");
    assert_eq!(events[0].data, json!({ "order": 42 }));
    assert!(
        db.ledger
            .wait_candidates("run_zero", "no_such_node", None)
            .await
            .unwrap()
            .is_none()
    );
}

/// A publish of the wait's name while its worker holds the run (nothing to re-queue)
/// makes the worker's pause refuse until it says it saw that signal; a publish while
/// the run is paused re-queues it.
async fn a_publish_while_the_run_is_held_stops_its_pause(db: TestDb) {
    let (run, _) = begun(&db, "run_a", event_wait(NODE, 0, 60_000)).await;
    let p = publish(&db, EVENT, "e1", json!({ "order": 7 })).await;
    assert_eq!(p.signalled, 1);
    assert_eq!(run_status(&db, "run_a").await, RunStatus::Running);
    let w = get(&db, "run_a", NODE).await;
    assert_eq!((w.signal, w.seen_signal), (1, 0));
    assert!(
        !pause(&db, &run).await,
        "an event it has not looked at: look again"
    );
    assert_eq!(run_status(&db, "run_a").await, RunStatus::Running);

    db.ledger.saw_signal(&run, NODE, w.signal, 0).await.unwrap();
    assert!(
        pause(&db, &run).await,
        "it looked at e1 and it did not match"
    );
    assert_eq!(run_status(&db, "run_a").await, RunStatus::Paused);

    let other = publish(&db, "shipment.lost", "x1", json!({})).await;
    assert_eq!(other.signalled, 0);
    assert_eq!(run_status(&db, "run_a").await, RunStatus::Paused);

    let p = publish(&db, EVENT, "e2", json!({ "order": 8 })).await;
    assert_eq!(p.signalled, 1);
    assert_eq!(run_status(&db, "run_a").await, RunStatus::Queued);
    assert_eq!(get(&db, "run_a", NODE).await.signal, 2);

    let run = db
        .ledger
        .claim_run("run_a", &worker("2"), LEASE, db.now())
        .await
        .unwrap();
    let resumed = db
        .ledger
        .begin_wait(&run, event_wait(NODE, 0, 60_000), db.now())
        .await
        .unwrap();
    assert_eq!(
        (resumed.status, resumed.signal, resumed.seen_signal),
        (WaitStatus::Pending, 2, 1)
    );
    assert!(!pause(&db, &run).await, "e2 is not looked at yet");
    db.ledger.saw_signal(&run, NODE, 2, 0).await.unwrap();
    db.ledger.saw_signal(&run, NODE, 1, 0).await.unwrap();
    assert_eq!(
        get(&db, "run_a", NODE).await.seen_signal,
        2,
        "never goes back"
    );
    assert!(pause(&db, &run).await);
    assert_eq!(run_status(&db, "run_a").await, RunStatus::Paused);
}

/// `saw_signal` is fenced by the run lease: a worker whose run was taken over (here
/// from an earlier step, whose count means nothing to the new wait) is `LeaseLost` and
/// changes nothing, so the new holder's pause still refuses over an unseen event.
async fn a_worker_that_lost_the_run_cannot_mark_a_signal_seen(db: TestDb) {
    let (old, _) = begun(&db, "run_a", event_wait(NODE, 0, 60_000)).await;
    db.advance(LEASE);
    let run = db
        .ledger
        .claim_run("run_a", &worker("2"), LEASE, db.now())
        .await
        .unwrap();
    let retry = "await_ship_retry1";
    db.ledger
        .create_step(&run, step(retry, NODE, 1), db.now())
        .await
        .unwrap();
    db.ledger
        .begin_wait(&run, event_wait(retry, 0, 60_000), db.now())
        .await
        .unwrap();
    publish(&db, EVENT, "e1", json!({ "order": 42 })).await;
    let stale = db.ledger.saw_signal(&old, NODE, 5, 0).await;
    assert!(matches!(stale, Err(Error::LeaseLost)), "{stale:?}");
    let w = get(&db, "run_a", NODE).await;
    assert_eq!((w.signal, w.seen_signal), (1, 0));
    assert!(!pause(&db, &run).await, "e1 is not looked at by the holder");
    assert_eq!(run_status(&db, "run_a").await, RunStatus::Running);
    db.ledger.saw_signal(&run, NODE, 1, 0).await.unwrap();
    assert!(pause(&db, &run).await);
    let after = db.ledger.saw_signal(&run, NODE, 1, 0).await;
    assert!(matches!(after, Err(Error::LeaseLost)), "paused: {after:?}");
}

/// A publish and the worker's pause at once, many rounds: either the pause refuses (it
/// saw the signal) or the publish re-queues the paused run; never a paused run with an
/// event it has not looked at.
async fn a_publish_and_a_pause_never_leave_the_run_paused(db: TestDb) {
    for round in 0..8 {
        let run_id = format!("run_{round}");
        let (run, _) = begun(&db, &run_id, event_wait(NODE, 0, 60_000)).await;
        let (ledger, now, id) = (db.ledger.clone(), db.now(), format!("e{round}"));
        race_settle_and_pause(&db, run, async move {
            let published = ledger
                .publish_event(EVENT, Some(&id), &json!({}), None, now)
                .await
                .unwrap();
            assert_eq!(published.signalled, round + 1, "every run's wait so far");
        })
        .await;
    }
}

/// The worker completes its wait with the event it matched: `completed`, the event's
/// data as output and its id, one `wait.completed`; a second completion changes
/// nothing, and a settled wait is no longer signalled.
async fn an_event_completes_the_wait_once(db: TestDb) {
    let (run, _) = begun(&db, "run_a", event_wait(NODE, 0, 60_000)).await;
    let data = json!({ "order": 42, "carrier": "dhl" });
    publish(&db, EVENT, "e1", data.clone()).await;
    publish(&db, EVENT, "e2", json!({ "order": 42, "carrier": "ups" })).await;
    let events = candidates(&db, "run_a").await;
    assert_eq!(ids(&events), ["e1", "e2"]);
    db.advance(Duration::from_secs(1));
    let done = db
        .ledger
        .complete_event_wait(&run, NODE, &events[0], db.now())
        .await
        .unwrap();
    assert_eq!(done.status, WaitStatus::Completed);
    assert_eq!(done.output, Some(data.clone()));
    assert_eq!(done.event_id.as_deref(), Some("e1"));
    assert_eq!(done.settled_by.as_deref(), Some("event"));
    assert_eq!(done.settled_at, Some(db.now()));
    assert_eq!(count(&db, EventType::WaitCompleted).await, 1);
    assert_eq!(db.ledger.count_pending_waits().await.unwrap(), 0);

    let again = db
        .ledger
        .complete_event_wait(&run, NODE, &events[1], db.now())
        .await
        .unwrap();
    assert_eq!(again, done, "the first completion stands");
    assert_eq!(count(&db, EventType::WaitCompleted).await, 1);
    let late = publish(&db, EVENT, "e3", json!({ "order": 42 })).await;
    assert_eq!(late.signalled, 0);
    assert_eq!(get(&db, "run_a", NODE).await.signal, done.signal);
    assert!(
        !pause(&db, &run).await,
        "its step still runs: apply the event first"
    );

    let unknown = db
        .ledger
        .complete_event_wait(&run, "no_such_node", &events[0], db.now())
        .await;
    assert_not_found(unknown, "a node without a wait");
    db.advance(LEASE);
    let lost = db
        .ledger
        .complete_event_wait(&run, NODE, &events[1], db.now())
        .await;
    assert!(matches!(lost, Err(Error::LeaseLost)), "{lost:?}");
}

/// A publisher whose clock is behind (or whose publish waited on the name's lock while
/// the wait began): its event is stamped before the wait began, yet published after
/// it, so it is a candidate even without `lookback`.
async fn an_event_stamped_before_the_wait_began_counts_when_published_after(db: TestDb) {
    let (_run, _) = begun(&db, "run_skew", event_wait(NODE, 0, 60_000)).await;
    let early = Timestamp(db.now().0 - 5_000);
    db.ledger
        .publish_event(EVENT, Some("skewed"), &json!({ "order": 42 }), None, early)
        .await
        .unwrap();
    assert_eq!(ids(&candidates(&db, "run_skew").await), ["skewed"]);
}

/// A worker that looked records how far it read: the next look reads only what came
/// after, so a name with many events is not read from its start on every publish.
async fn a_look_reads_on_from_where_it_stopped(db: TestDb) {
    let (run, _) = begun(&db, "run_cursor", event_wait(NODE, 0, 60_000)).await;
    for id in ["c1", "c2", "c3"] {
        publish(&db, EVENT, id, json!({ "order": 7 })).await;
    }
    let all = candidates(&db, "run_cursor").await;
    assert_eq!(ids(&all), ["c1", "c2", "c3"]);
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq), "in seq order");
    db.ledger
        .saw_signal(&run, NODE, 3, all[1].seq)
        .await
        .unwrap();
    assert_eq!(ids(&candidates(&db, "run_cursor").await), ["c3"]);
    let w = get(&db, "run_cursor", NODE).await;
    assert_eq!((w.seen_signal, w.seen_seq), (3, all[1].seq));
}
