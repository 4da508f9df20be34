//! Schedules (migration 0014, `ledger/src/schedules/`): a plan of due ticks applies once
//! however many daemons hand it in (the cursor is compared and set in the transaction
//! that starts the runs); overlap skips or buffers a tick while the previous run is
//! unfinished; missed ticks are one recorded range; changes, pauses, removals and
//! triggers are recorded with who.

use std::time::Duration;

use flow_ledger::{
    Actor, Applied, Error, Handled, HistoryKind, NewRun, Overlap, RunFinish, RunStatus,
    ScheduleDef, TickPlan, Timestamp,
};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    a_plan_applies_once_however_many_daemons_hand_it_in,
    overlap_skips_or_buffers_while_the_previous_run_is_unfinished,
    missed_ticks_changes_pauses_removals_and_triggers_are_recorded,
    a_taken_run_id_is_refused_and_a_pause_drops_the_buffered_tick,
    a_command_stores_without_removing_the_others,
    a_workflow_applies_its_own_schedules_and_no_one_elses,
);

fn def(id: &str, cron: &str) -> ScheduleDef {
    ScheduleDef {
        id: id.into(),
        definition: json!({ "cron": cron, "workflow": "w.yaml" }),
    }
}

fn run(id: &str) -> NewRun {
    new_run(id)
}

fn ms(base: Timestamp, s: i64) -> Timestamp {
    Timestamp(base.0 + s * 1000)
}

fn plan(state: &flow_ledger::ScheduleState, fire: &[i64], overlap: Overlap) -> TickPlan {
    let base = state.cursor;
    let fire: Vec<(Timestamp, NewRun)> = fire
        .iter()
        .map(|s| (ms(base, *s), run(&format!("sched.s.{s}"))))
        .collect();
    TickPlan {
        schedule_id: state.id.clone(),
        def_hash: state.def_hash.clone(),
        cursor: state.cursor,
        new_cursor: fire.last().map_or(state.cursor, |f| f.0),
        missed: None,
        buffered: None,
        fire,
        overlap,
    }
}

async fn history(db: &TestDb, id: &str) -> Vec<(HistoryKind, Option<String>, u64)> {
    let mut h: Vec<_> = db
        .ledger
        .schedule_history(Some(id), 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.kind, e.run_id, e.count))
        .collect();
    h.reverse();
    h
}

async fn a_plan_applies_once_however_many_daemons_hand_it_in(db: TestDb) {
    let t0 = db.now();
    let states = db
        .ledger
        .sync_schedules(vec![def("s", "* * * * * *")], "config a", true, t0)
        .await
        .unwrap();
    assert_eq!(states[0].cursor, t0, "a new schedule starts at now");
    let p = plan(&states[0], &[1, 2], Overlap::Allow);
    let now = db.advance(Duration::from_secs(3));
    let (a, b) = tokio::join!(
        db.ledger.handle_ticks(p.clone(), now),
        db.ledger.handle_ticks(p.clone(), now)
    );
    let outcomes = [a.unwrap(), b.unwrap()];
    let done: Vec<&Handled> = outcomes
        .iter()
        .filter(|h| matches!(h, Handled::Done { .. }))
        .collect();
    assert_eq!(done.len(), 1, "one applies, one is stale: {outcomes:?}");
    assert!(outcomes.contains(&Handled::Stale));
    assert_eq!(
        *done[0],
        Handled::Done {
            started: vec!["sched.s.1".into(), "sched.s.2".into()],
            skipped: 0,
            missed: 0,
            refused: 0,
            buffered: false
        }
    );
    assert_eq!(
        db.ledger.handle_ticks(p, now).await.unwrap(),
        Handled::Stale,
        "the same plan again changes nothing"
    );
    let state = &db.ledger.list_schedules().await.unwrap()[0];
    assert_eq!(state.cursor, ms(t0, 2));
    assert_eq!(state.last_run_id.as_deref(), Some("sched.s.2"));
    for id in ["sched.s.1", "sched.s.2"] {
        assert_eq!(
            db.ledger.get_run(id).await.unwrap().status,
            RunStatus::Queued
        );
    }
    let started = history(&db, "s").await;
    assert_eq!(
        started,
        [
            (HistoryKind::Started, Some("sched.s.1".into()), 1),
            (HistoryKind::Started, Some("sched.s.2".into()), 1)
        ]
    );
}

async fn overlap_skips_or_buffers_while_the_previous_run_is_unfinished(db: TestDb) {
    let t0 = db.now();
    let state = db
        .ledger
        .sync_schedules(vec![def("s", "* * * * * *")], "config", true, t0)
        .await
        .unwrap()
        .remove(0);
    let now = db.advance(Duration::from_secs(10));
    let h = db
        .ledger
        .handle_ticks(plan(&state, &[1, 2], Overlap::Skip), now)
        .await
        .unwrap();
    assert!(
        matches!(&h, Handled::Done { started, skipped: 1, .. } if started == &["sched.s.1"]),
        "the second tick finds the first run queued: {h:?}"
    );
    let state = db.ledger.list_schedules().await.unwrap().remove(0);
    let h = db
        .ledger
        .handle_ticks(plan(&state, &[1, 2], Overlap::BufferOne), now)
        .await
        .unwrap();
    assert!(
        matches!(&h, Handled::Done { started, skipped: 1, buffered: true, .. } if started.is_empty()),
        "one tick waits, the next is skipped: {h:?}"
    );
    let state = db.ledger.list_schedules().await.unwrap().remove(0);
    let waiting = ms(t0, 3);
    assert_eq!(state.buffered, Some(waiting));
    // A plan that forgets the buffered tick is stale.
    let mut p = plan(&state, &[], Overlap::BufferOne);
    assert_eq!(
        db.ledger.handle_ticks(p.clone(), now).await.unwrap(),
        Handled::Stale
    );
    // The previous run ends; the buffered tick starts.
    let lease = db
        .ledger
        .claim_run("sched.s.1", &worker("1"), LEASE, now)
        .await
        .unwrap();
    let fin = RunFinish {
        status: RunStatus::Succeeded,
        output: None,
        error: None,
    };
    db.ledger.finish_run(&lease, fin, now).await.unwrap();
    p.buffered = Some((waiting, run("sched.s.3")));
    let now = db.advance(Duration::from_secs(1));
    let h = db.ledger.handle_ticks(p, now).await.unwrap();
    assert!(
        matches!(&h, Handled::Done { started, buffered: false, .. } if started == &["sched.s.3"]),
        "{h:?}"
    );
    let state = db.ledger.list_schedules().await.unwrap().remove(0);
    assert_eq!(
        (state.buffered, state.last_run_id.as_deref()),
        (None, Some("sched.s.3"))
    );
    let kinds: Vec<HistoryKind> = history(&db, "s").await.into_iter().map(|h| h.0).collect();
    assert_eq!(
        kinds,
        [
            HistoryKind::Started,
            HistoryKind::SkippedOverlap,
            HistoryKind::Buffered,
            HistoryKind::SkippedOverlap,
            HistoryKind::Started
        ]
    );
}

async fn missed_ticks_changes_pauses_removals_and_triggers_are_recorded(db: TestDb) {
    let t0 = db.now();
    let state = db
        .ledger
        .sync_schedules(
            vec![def("s", "* * * * * *"), def("t", "@hourly")],
            "config a",
            true,
            t0,
        )
        .await
        .unwrap()
        .remove(0);
    let now = db.advance(Duration::from_secs(10));
    let mut p = plan(&state, &[6, 7], Overlap::Allow);
    p.missed = Some((ms(t0, 1), ms(t0, 5), 5));
    let h = db.ledger.handle_ticks(p, now).await.unwrap();
    assert!(matches!(h, Handled::Done { missed: 5, .. }), "{h:?}");
    let missed = db.ledger.schedule_history(Some("s"), 10).await.unwrap();
    let range = missed
        .iter()
        .find(|e| e.kind == HistoryKind::Missed)
        .expect("a missed range");
    assert_eq!(
        (range.tick_at, range.last_at, range.count),
        (ms(t0, 1), ms(t0, 5), 5)
    );

    // Paused: a plan is stale; resumed: the cursor moves to now (no catch-up).
    db.ledger
        .set_schedule_paused("s", true, &who("ada", None), now)
        .await
        .unwrap();
    let state = db.ledger.list_schedules().await.unwrap().remove(0);
    assert!(state.paused);
    let p = plan(&state, &[8], Overlap::Allow);
    assert_eq!(
        db.ledger.handle_ticks(p, now).await.unwrap(),
        Handled::Stale
    );
    let later = db.advance(Duration::from_secs(60));
    let resumed = db
        .ledger
        .set_schedule_paused("s", false, &who("ada", Some("back")), later)
        .await
        .unwrap();
    assert_eq!((resumed.paused, resumed.cursor), (false, later));
    assert!(matches!(
        db.ledger
            .set_schedule_paused("nope", true, &who("ada", None), later)
            .await,
        Err(flow_ledger::Error::NotFound { .. })
    ));

    // A changed definition is recorded with who; a schedule left out is removed.
    let mut changed = def("s", "*/5 * * * * *");
    changed.definition["inputs"] = json!({ "x": 1 });
    let changed_at = db.advance(Duration::from_secs(1));
    let states = db
        .ledger
        .sync_schedules(vec![changed], "config b", true, changed_at)
        .await
        .unwrap();
    assert_eq!(states[0].changed_by, "config b");
    assert_eq!(
        states[0].cursor, changed_at,
        "a change counts from its next tick: nothing of the old one is caught up"
    );
    let ids: Vec<String> = db
        .ledger
        .list_schedules()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, ["s"], "`t` was removed");
    let t_history = history(&db, "t").await;
    assert_eq!(t_history.last().map(|h| h.0), Some(HistoryKind::Removed));

    // A trigger starts a run of its own id now, the cursor untouched.
    let triggered_at = db.advance(Duration::from_secs(1));
    let enq = db
        .ledger
        .trigger_schedule(
            "s",
            run("sched.s.manual.1"),
            &who("ada", None),
            triggered_at,
        )
        .await
        .unwrap();
    assert!(enq.created);
    history_of_s_says_it_all(&db, changed_at).await;
}

/// The history of `s` after the test above, in order, with who and why.
async fn history_of_s_says_it_all(db: &TestDb, changed_at: Timestamp) {
    let s_history = db.ledger.schedule_history(Some("s"), 100).await.unwrap();
    let kinds: Vec<HistoryKind> = s_history.iter().rev().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            HistoryKind::Missed,
            HistoryKind::Started,
            HistoryKind::Started,
            HistoryKind::Paused,
            HistoryKind::Resumed,
            HistoryKind::Changed,
            HistoryKind::Triggered
        ]
    );
    let change = s_history
        .iter()
        .find(|e| e.kind == HistoryKind::Changed)
        .expect("changed");
    assert_eq!(change.actor.as_deref(), Some("config b"));
    assert!(change.detail.as_deref().unwrap_or_default().contains("*/5"));
    assert_eq!(
        db.ledger.list_schedules().await.unwrap()[0].cursor,
        changed_at
    );
    let resumed = s_history
        .iter()
        .find(|e| e.kind == HistoryKind::Resumed)
        .expect("resumed");
    assert_eq!(
        resumed.detail.as_deref(),
        Some("back"),
        "the reason is kept"
    );
}

async fn a_taken_run_id_is_refused_and_a_pause_drops_the_buffered_tick(db: TestDb) {
    let t0 = db.now();
    let state = db
        .ledger
        .sync_schedules(vec![def("s", "* * * * * *")], "config", true, t0)
        .await
        .unwrap()
        .remove(0);
    // Someone took tick 1's run id with other inputs.
    let mut other = run("sched.s.1");
    other.inputs = json!({ "not": "the schedule's" });
    db.ledger.enqueue(other, t0).await.unwrap();
    let now = db.advance(Duration::from_secs(5));
    let h = db
        .ledger
        .handle_ticks(plan(&state, &[1, 2], Overlap::BufferOne), now)
        .await
        .unwrap();
    assert!(
        matches!(&h, Handled::Done { started, refused: 1, .. } if started == &["sched.s.2"]),
        "the taken id is refused, the next tick starts: {h:?}"
    );
    let state = db.ledger.list_schedules().await.unwrap().remove(0);
    let h = db
        .ledger
        .handle_ticks(plan(&state, &[1], Overlap::BufferOne), now)
        .await
        .unwrap();
    assert!(matches!(h, Handled::Done { buffered: true, .. }), "{h:?}");
    db.ledger
        .set_schedule_paused("s", true, &who("ada", None), now)
        .await
        .unwrap();
    let state = db.ledger.list_schedules().await.unwrap().remove(0);
    assert_eq!(state.buffered, None);
    let kinds: Vec<HistoryKind> = history(&db, "s").await.into_iter().map(|h| h.0).collect();
    assert_eq!(
        kinds,
        [
            HistoryKind::Refused,
            HistoryKind::Started,
            HistoryKind::Buffered,
            HistoryKind::SkippedOverlap,
            HistoryKind::Paused
        ],
        "the buffered tick's end is recorded"
    );
    let refused = db
        .ledger
        .last_tick("s", &[HistoryKind::Refused])
        .await
        .unwrap()
        .expect("refused entry");
    assert_eq!(refused.run_id.as_deref(), Some("sched.s.1"));
    assert!(refused.detail.unwrap_or_default().contains("different"));
}

async fn a_command_stores_without_removing_the_others(db: TestDb) {
    let t0 = db.now();
    db.ledger
        .sync_schedules(
            vec![def("a", "@hourly"), def("b", "@daily")],
            "config",
            true,
            t0,
        )
        .await
        .unwrap();
    let later = db.advance(Duration::from_secs(1));
    db.ledger
        .sync_schedules(vec![def("c", "@hourly")], "cli", false, later)
        .await
        .unwrap();
    let ids: Vec<String> = db
        .ledger
        .list_schedules()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
}

fn applied(id: &str, owner: &str, cron: &str) -> ScheduleDef {
    ScheduleDef {
        id: id.into(),
        definition: json!({ "cron": cron, "applied_from": owner, "text": "name: w" }),
    }
}

/// `apply_schedules` adds, changes and removes only its own workflow's schedules, in
/// one transaction: an id `flow.toml` or another workflow holds refuses the whole
/// apply; a daemon's pruning sync leaves applied schedules alone.
async fn a_workflow_applies_its_own_schedules_and_no_one_elses(db: TestDb) {
    let t0 = db.now();
    let l = &db.ledger;
    l.sync_schedules(vec![def("cfg", "@daily")], "config", true, t0)
        .await
        .unwrap();
    // Workflow `v`'s schedule `z` is never `w`'s to remove.
    l.apply_schedules("v", vec![applied("z", "v", "@daily")], "vic", t0)
        .await
        .unwrap();
    let got = l
        .apply_schedules(
            "w",
            vec![applied("a", "w", "@hourly"), applied("b", "w", "@daily")],
            "alice",
            t0,
        )
        .await
        .unwrap();
    assert_eq!(
        got,
        [("a".into(), Applied::Added), ("b".into(), Applied::Added)]
    );
    // Another workflow may not take `a`, nor anyone `cfg`; nothing of either is stored.
    for (owner, id) in [("v", "a"), ("w", "cfg")] {
        let e = l
            .apply_schedules(
                owner,
                vec![
                    applied("new", owner, "@daily"),
                    applied(id, owner, "@daily"),
                ],
                "bob",
                t0,
            )
            .await
            .expect_err("owned");
        assert!(matches!(e, Error::Owned { .. }), "{e}");
    }
    let ids = |states: Vec<flow_ledger::ScheduleState>| -> Vec<String> {
        states.into_iter().map(|s| s.id).collect()
    };
    assert_eq!(
        ids(l.list_schedules().await.unwrap()),
        ["a", "b", "cfg", "z"]
    );
    // A daemon with another flow.toml prunes `cfg`, not the applied ones.
    let t1 = db.advance(Duration::from_secs(1));
    l.sync_schedules(vec![def("other", "@daily")], "config", true, t1)
        .await
        .unwrap();
    assert_eq!(
        ids(l.list_schedules().await.unwrap()),
        ["a", "b", "other", "z"]
    );
    // Nor does a flow.toml declaring `z` take it over: it stays `v`'s.
    l.sync_schedules(
        vec![def("other", "@daily"), def("z", "@hourly")],
        "config",
        true,
        t1,
    )
    .await
    .unwrap();
    let z = l.schedule_definition("z").await.unwrap().expect("z");
    assert_eq!(flow_ledger::applied_from(&z.definition), Some("v"));
    reapplied_then_removed(&db).await;
}

/// The second half of the story above: `w` applied again (`a` changed, `b` gone, `c`
/// new, `v`'s `z` kept), the heads without texts, then `remove`.
async fn reapplied_then_removed(db: &TestDb) {
    let l = &db.ledger;
    let ids = |states: Vec<flow_ledger::ScheduleState>| -> Vec<String> {
        states.into_iter().map(|s| s.id).collect()
    };
    // Applied again: `a` changed, `b` gone, `c` new.
    let t2 = db.advance(Duration::from_secs(1));
    let got = l
        .apply_schedules(
            "w",
            vec![applied("a", "w", "@daily"), applied("c", "w", "@daily")],
            "carol",
            t2,
        )
        .await
        .unwrap();
    assert_eq!(
        got,
        [
            ("a".into(), Applied::Changed),
            ("c".into(), Applied::Added),
            ("b".into(), Applied::Removed)
        ]
    );
    assert_eq!(
        ids(l.list_schedules().await.unwrap()),
        ["a", "c", "other", "z"]
    );
    // The heads a daemon lists each second hold no text; the whole one does.
    let heads = l.list_schedule_heads().await.unwrap();
    assert!(
        heads.iter().all(|h| h.definition.get("text").is_none()),
        "{heads:?}"
    );
    let whole = l.schedule_definition("a").await.unwrap().expect("a");
    assert!(whole.definition.get("text").is_some(), "{whole:?}");
    assert_eq!(
        heads.iter().find(|h| h.id == "a").map(|h| &h.def_hash),
        Some(&whole.def_hash)
    );
    let a = history(db, "a").await;
    assert!(a.iter().any(|e| e.0 == HistoryKind::Changed), "{a:?}");
    let b = l.schedule_history(Some("b"), 10).await.unwrap();
    assert!(
        b.iter()
            .any(|e| e.kind == HistoryKind::Removed && e.actor.as_deref() == Some("carol")),
        "{b:?}"
    );
    let again = l
        .apply_schedules(
            "w",
            vec![applied("a", "w", "@daily"), applied("c", "w", "@daily")],
            "carol",
            t2,
        )
        .await
        .unwrap();
    assert!(
        again.iter().all(|(_, c)| *c == Applied::Unchanged),
        "{again:?}"
    );
    // `remove` settles a clash whoever declared the id; an unknown id is NotFound.
    l.remove_schedule("z", &who("dora", Some("moved to flow.toml")), t2)
        .await
        .unwrap();
    let e = l
        .remove_schedule("z", &who("dora", None), t2)
        .await
        .expect_err("gone");
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
    assert_eq!(ids(l.list_schedules().await.unwrap()), ["a", "c", "other"]);
}

/// Who changed a schedule, and why.
fn who(by: &str, reason: Option<&str>) -> Actor {
    Actor {
        by: by.into(),
        reason: reason.map(str::to_owned),
    }
}
