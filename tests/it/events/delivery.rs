//! At least once: a failing webhook, a dispatcher killed mid-delivery, the exact backoff
//! schedule and the 64-attempt cap on a test clock, dead letters and `redeliver`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flow::config::{ConsumerConfig, ConsumerKind, ConsumerStart};
use flow::events::{Dispatcher, Options};
use flow::secrets::Secrets;
use flow_ledger::{Clock, DeliveryFilter, DeliveryStatus, ManualClock, Timestamp};

use super::hook::Hook;
use super::*;
use crate::support::{Backend, backends, runtime};

fn failing_then_delivered(backend: Backend) {
    let rt = runtime();
    let hook = Hook::start(&rt);
    hook.set(|s| s.fail = 2);
    let db = TestDb::new(backend);
    let config = db.write(
        "flow.toml",
        &webhook_toml(&hook.url(), "[\"run.succeeded\"]", ""),
    );
    let run = run_hello(&db);
    let mut dispatcher = spawn_dispatcher(&db, &config);
    // Fails twice (backoff 1 s, then 2 s), then is accepted.
    hook.wait_for(Duration::from_secs(30), "three deliveries", |r| {
        r.len() >= 3
    });
    let ctx = format!("{backend:?}");
    let start = Instant::now();
    let delivered = loop {
        let d = deliveries(&db, &[]);
        if d.first().is_some_and(|d| d["status"] == "delivered") {
            break d;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{ctx}: {d:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let stopped = sigterm(&mut dispatcher);
    assert_eq!(
        stopped.status.code(),
        Some(0),
        "{ctx}: {}",
        stderr(&stopped)
    );
    assert_eq!(
        delivered.len(),
        1,
        "{ctx}: only run.succeeded passes the filter"
    );
    assert_eq!(delivered[0]["attempts"], 3, "{ctx}");
    assert_eq!(
        delivered[0]["last_error"]
            .as_str()
            .map(|e| e.contains("HTTP 500")),
        Some(true)
    );
    let got = hook.received();
    assert_eq!(got.len(), 3, "{ctx}: nothing after it was accepted");
    let id = &got[0].event_id;
    assert!(
        got.iter().all(|r| &r.event_id == id),
        "{ctx}: the same event id each time"
    );
    for r in &got {
        let body = r.json();
        assert_eq!(&body["id"], id, "{ctx}");
        assert_eq!(body["type"], "run.succeeded", "{ctx}");
        assert_eq!(body["run_id"], run.as_str(), "{ctx}");
        assert_eq!(r.idempotency_key, *id, "{ctx}");
        assert_eq!(
            r.signature,
            expected_signature(HOOK_SECRET, &r.body),
            "{ctx}"
        );
    }
}

#[test]
fn a_failing_webhook_gets_the_same_event_again_until_it_accepts() {
    for backend in backends() {
        failing_then_delivered(backend);
    }
}

fn killed_mid_delivery(backend: Backend) {
    let rt = runtime();
    let hook = Hook::start(&rt);
    hook.set(|s| s.hold = true);
    let db = TestDb::new(backend);
    let config = db.write(
        "flow.toml",
        &webhook_toml(&hook.url(), "[\"run.succeeded\"]", ""),
    );
    run_hello(&db);
    let mut first = spawn_dispatcher(&db, &config);
    hook.wait_for(Duration::from_secs(20), "the held delivery", |r| {
        r.len() == 1
    });
    first.kill().expect("SIGKILL");
    first.wait().expect("wait");
    let ctx = format!("{backend:?}");
    let pending = deliveries(&db, &[]);
    assert_eq!(
        pending[0]["status"], "pending",
        "{ctx}: not lost, not done: {pending:?}"
    );
    hook.set(|s| s.hold = false);
    let mut second = spawn_dispatcher(&db, &config);
    // The dead dispatcher ran on this host: its lease ends at once, no 30 s wait.
    hook.wait_for(Duration::from_secs(10), "the re-delivery", |r| r.len() == 2);
    let start = Instant::now();
    loop {
        let d = deliveries(&db, &[]);
        if d[0]["status"] == "delivered" {
            assert_eq!(d[0]["attempts"], 2, "{ctx}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{ctx}: {d:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    sigterm(&mut second);
    let got = hook.received();
    assert_eq!(
        got[0].event_id, got[1].event_id,
        "{ctx}: at least once, same id"
    );
    assert_eq!(got[0].body, got[1].body, "{ctx}: the same bytes");
}

#[test]
fn a_dispatcher_killed_mid_delivery_delivers_again_after_restart() {
    for backend in backends() {
        killed_mid_delivery(backend);
    }
}

fn in_process_consumer(url: &str, max_attempts: Option<u32>) -> Vec<flow::events::Consumer> {
    let config = ConsumerConfig {
        name: "hook".into(),
        kind: ConsumerKind::Webhook,
        url: Some(url.into()),
        secret_name: Some("WEBHOOK".into()),
        path: None,
        events: Some(vec!["run.queued".into()]),
        timeout: Some("2s".into()),
        max_attempts,
        start: ConsumerStart::Beginning,
    };
    let secrets = Secrets::from_pairs([("WEBHOOK".to_string(), HOOK_SECRET.to_string())]);
    flow::events::consumers(&[config], &secrets).expect("consumers")
}

fn schedule_and_cap(backend: Backend) {
    let rt = runtime();
    let hook = Hook::start(&rt);
    hook.set(|s| s.fail = u32::MAX);
    let db = TestDb::new(backend);
    let ledger = open(&rt, &db);
    let clock = ManualClock::new(Timestamp(1_800_000_000_000));
    let new_run = flow_ledger::NewRun {
        id: "run_capped".into(),
        workflow_name: "wf".into(),
        workflow_text: "name: wf\nnodes: {}\n".into(),
        inputs: serde_json::json!({}),
        priority: 0,
        not_before: None,
        trace_parent: None,
    };
    rt.block_on(ledger.enqueue(new_run, clock.now()))
        .expect("enqueue");
    let dispatcher = Dispatcher::new(
        ledger.clone(),
        in_process_consumer(&hook.url(), None),
        Arc::new(clock.clone()),
    )
    .with_options(Options {
        concurrency: 1,
        ..Options::default()
    });
    let ctx = format!("{backend:?}");
    let once = || rt.block_on(dispatcher.dispatch_once()).expect("dispatch");
    // PostgreSQL schedules an event once every older transaction has ended.
    let mut first = once();
    for _ in 0..200 {
        if first.attempts() > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        first = once();
    }
    assert_eq!((first.scheduled, first.retried), (1, 1), "{ctx}: {first:?}");
    let delivery = || {
        let mut d = rt
            .block_on(ledger.list_deliveries(DeliveryFilter::default()))
            .expect("list");
        assert_eq!(d.len(), 1);
        d.remove(0)
    };
    let mut schedule = Vec::new();
    for attempt in 1..=64u32 {
        let d = delivery();
        assert_eq!(d.attempts, attempt, "{ctx}");
        if attempt == 64 {
            assert_eq!(
                d.status,
                DeliveryStatus::Dead,
                "{ctx}: the 64th failure is the last"
            );
            break;
        }
        assert_eq!(d.status, DeliveryStatus::Pending, "{ctx}");
        let wait = d.next_attempt_at.0 - clock.now().0;
        schedule.push(wait / 1000);
        assert_eq!(wait % 1000, 0, "{ctx}: whole seconds");
        // Not a millisecond early.
        clock.set(Timestamp(d.next_attempt_at.0 - 1));
        assert_eq!(
            once().attempts(),
            0,
            "{ctx}: attempt {} came early",
            attempt + 1
        );
        clock.set(d.next_attempt_at);
        let s = once();
        assert_eq!(s.attempts(), 1, "{ctx}: attempt {}", attempt + 1);
    }
    let mut expected = vec![1, 2, 4, 8, 16, 32, 64, 128, 256];
    expected.resize(63, 300);
    assert_eq!(schedule, expected, "{ctx}: 2^(n-1) s capped at 300 s");
    assert_eq!(hook.received().len(), 64, "{ctx}: exactly 64 attempts");
    let dead = delivery();
    assert!(
        dead.last_error
            .as_deref()
            .is_some_and(|e| e.contains("gave up after 64 attempts") && e.contains("HTTP 500")),
        "{ctx}: {:?}",
        dead.last_error
    );
    // A dead letter stays dead, however long we wait.
    clock.advance(Duration::from_secs(86_400));
    assert_eq!(once().attempts(), 0, "{ctx}");
    assert_eq!(hook.received().len(), 64, "{ctx}");
    // Re-queued by hand, it is sent at once and, now accepted, recorded done.
    hook.set(|s| s.fail = 0);
    rt.block_on(ledger.redeliver("hook", &dead.event.id, clock.now()))
        .expect("redeliver");
    let s = once();
    assert_eq!(s.delivered, 1, "{ctx}: {s:?}");
    assert_eq!(delivery().status, DeliveryStatus::Delivered, "{ctx}");
    assert_eq!(delivery().attempts, 1, "{ctx}: the cap applies afresh");
}

#[test]
fn backoff_doubles_to_five_minutes_and_gives_up_after_64_attempts() {
    for backend in backends() {
        schedule_and_cap(backend);
    }
}

#[test]
fn dead_letters_are_listed_and_redeliver_requeues_them() {
    let rt = runtime();
    let hook = Hook::start(&rt);
    hook.set(|s| s.fail = u32::MAX);
    let db = TestDb::new(Backend::Sqlite);
    let config = db.write(
        "flow.toml",
        &webhook_toml(&hook.url(), "[\"run.succeeded\"]", "max_attempts = 2\n"),
    );
    run_hello(&db);
    let dispatch = || {
        let out = output(flow_with(&db, &config).args(["events", "dispatch", "--once"]));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        stderr(&out)
    };
    assert!(dispatch().contains("1 to retry"));
    let none = output(db.flow().args(["events", "--failed"]));
    assert_eq!(none.status.code(), Some(0));
    assert!(stdout(&none).is_empty() && stderr(&none).contains("no dead letters"));
    std::thread::sleep(Duration::from_millis(1100));
    assert!(dispatch().contains("1 dead"));
    let dead = deliveries(&db, &["--failed"]);
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["status"], "dead");
    assert_eq!(dead[0]["attempts"], 2);
    assert_eq!(dead[0]["consumer"], "ops-webhook");
    assert_eq!(dead[0]["event"]["type"], "run.succeeded");
    let id = dead[0]["event"]["id"].as_str().expect("id").to_string();
    let human = output(db.flow().args(["events", "--failed"]));
    let line = stdout(&human);
    assert!(
        line.contains(&id) && line.contains("dead") && line.contains("gave up after 2 attempts"),
        "{line}"
    );
    // A table: a header row, then one row per delivery with the note cut to one line.
    let rows: Vec<&str> = line.lines().collect();
    assert_eq!(rows.len(), 2, "{line}");
    assert!(
        rows[0].starts_with("EVENT") && rows[0].ends_with("NOTE"),
        "{line}"
    );
    assert_eq!(
        rows[0].find("TYPE"),
        rows[1].find("run.succeeded"),
        "{line}"
    );
    // Nothing more happens to a dead letter.
    std::thread::sleep(Duration::from_millis(1100));
    dispatch();
    assert_eq!(hook.received().len(), 2);
    // Unknown ids and consumers are refused.
    let nope = output(db.flow().args(["events", "redeliver", "evt_nope"]));
    assert_eq!(nope.status.code(), Some(2), "{}", stderr(&nope));
    let wrong = output(
        db.flow()
            .args(["events", "redeliver", &id, "--consumer", "audit"]),
    );
    assert_eq!(wrong.status.code(), Some(2), "{}", stderr(&wrong));
    // The downstream is fixed; the operator re-queues the dead letter.
    hook.set(|s| s.fail = 0);
    let re = output(db.flow().args(["events", "redeliver", &id]));
    assert_eq!(re.status.code(), Some(0), "{}", stderr(&re));
    assert_eq!(
        stdout(&re).trim(),
        format!("re-queued {id} for ops-webhook")
    );
    assert!(deliveries(&db, &["--failed"]).is_empty());
    assert!(dispatch().contains("1 delivered"));
    let done = deliveries(&db, &["--status", "delivered"]);
    assert_eq!((done.len(), done[0]["attempts"].as_u64()), (1, Some(1)));
    assert_eq!(hook.received().len(), 3);
    assert_eq!(hook.received()[2].event_id, id);
    // `--failed` re-queues every dead letter; a delivered one can be re-sent by id.
    let all = output(db.flow().args(["events", "redeliver", "--failed"]));
    assert_eq!(all.status.code(), Some(0));
    assert!(stderr(&all).contains("no dead letters"));
    let again = output(
        db.flow()
            .args(["events", "redeliver", &id, "--consumer", "ops-webhook"]),
    );
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(dispatch().contains("1 delivered"));
    assert_eq!(hook.received().len(), 4);
}
