//! What consumers get: signed, well-formed events free of secrets (webhook and file);
//! events that match the ledger's state changes after every crash point; `tail`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::Duration;

use flow_adapters::testkit::http::CountingServer;
use flow_ledger::{Clock, EventFilter, RunStatus, StepStatus};

use super::hook::{Hook, Received};
use super::*;
use crate::support::{Backend, backends, runtime};

// The secrets test's workflow (its downstream echoes the secret back, and a second
// call quotes it) and the crash test's (pure, HTTP side effect, pure).
use crate::crash::workflow as pay;
use crate::secrets::{SECRET as API_SECRET, workflow as secretive};

#[test]
fn events_are_signed_well_formed_and_free_of_secrets_in_webhooks_and_files() {
    let rt = runtime();
    let hook = Hook::start(&rt);
    let downstream = rt.block_on(CountingServer::start()).expect("server");
    downstream.set(
        "/reject",
        flow_adapters::testkit::http::Behavior::Json {
            status: 400,
            body: serde_json::json!({ "error": format!("bad token {API_SECRET}") }),
        },
    );
    let db = TestDb::new(Backend::Sqlite);
    let file = db.dir.path().join("audit").join("events.jsonl");
    std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
    let config = db.write(
        "flow.toml",
        &format!(
            "{}\n[[consumers]]\nname = \"audit\"\nkind = \"file\"\npath = \"{}\"\n",
            webhook_toml(&hook.url(), "[\"run.*\", \"step.*\", \"tool_call.*\"]", ""),
            file.display()
        ),
    );
    let wf = db.write("w.yaml", &secretive(&downstream.url()));
    let out = output(
        flow_with(&db, &config)
            .arg("run")
            .arg(&wf)
            .env("FLOW_SECRET_API_TOKEN", API_SECRET),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        downstream
            .log()
            .iter()
            .any(|r| r.body.to_string().contains(API_SECRET)),
        "the downstream did get the secret"
    );
    let once = output(flow_with(&db, &config).args(["events", "dispatch", "--once"]));
    assert_eq!(once.status.code(), Some(0), "{}", stderr(&once));
    assert!(stderr(&once).contains("delivered"), "{}", stderr(&once));
    let got = hook.received();
    let types: BTreeSet<String> = got
        .iter()
        .map(|r| r.json()["type"].as_str().unwrap_or_default().to_string())
        .collect();
    for t in [
        "run.queued",
        "run.started",
        "step.started",
        "step.succeeded",
        "step.failed",
        "run.succeeded",
    ] {
        assert!(types.contains(t), "{t} missing from {types:?}");
    }
    for r in &got {
        assert_eq!(r.signature, expected_signature(HOOK_SECRET, &r.body));
        assert_ne!(r.signature, expected_signature("another secret", &r.body));
        let text = String::from_utf8_lossy(&r.body);
        assert!(!text.contains(API_SECRET), "a secret in an event: {text}");
        assert!(
            !text.contains(HOOK_SECRET),
            "the signing key in an event: {text}"
        );
        let body = r.json();
        assert_eq!(body["id"].as_str(), Some(r.event_id.as_str()));
        check_shape(&body);
    }
    // The failed node's event says what failed, with the secret's name in place of it.
    let failed = got
        .iter()
        .map(Received::json)
        .find(|b| b["type"] == "step.failed")
        .expect("step.failed");
    let error = failed["payload"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("HTTP 400") && error.contains("API_TOKEN"),
        "{failed}"
    );
    // The file consumer got the same events, one complete JSON document per line.
    let text = std::fs::read_to_string(&file).expect("events file");
    assert!(text.ends_with('\n'));
    assert!(!text.contains(API_SECRET) && !text.contains(HOOK_SECRET));
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("torn line {l:?}: {e}")))
        .collect();
    let file_ids: BTreeSet<&str> = lines.iter().filter_map(|l| l["id"].as_str()).collect();
    let hook_ids: BTreeSet<&str> = got.iter().map(|r| r.event_id.as_str()).collect();
    assert_eq!(file_ids, hook_ids);
    assert_eq!(lines.len(), file_ids.len(), "each event once");
    lines.iter().for_each(check_shape);
    // Dispatching again hands nobody anything new: the consumer checkpoints hold.
    let again = output(flow_with(&db, &config).args(["events", "dispatch", "--once"]));
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(hook.received().len(), got.len());
    assert_eq!(std::fs::read_to_string(&file).expect("file"), text);
    let listed = output(db.flow().args(["events", "--json", "--limit", "1000"]));
    assert!(!stdout(&listed).contains(API_SECRET));
    assert_eq!(deliveries(&db, &["--limit", "1000"]).len(), 2 * got.len());
    // A webhook whose secret is not set does not start.
    let unset = output(
        db.flow()
            .env("FLOW_CONFIG", &config)
            .args(["events", "dispatch", "--once"]),
    );
    assert_eq!(unset.status.code(), Some(5));
    assert!(
        stderr(&unset).contains("FLOW_SECRET_WEBHOOK"),
        "{}",
        stderr(&unset)
    );
}

/// Every recorded state change has its event and every event its state change.
fn check_consistent(rt: &tokio::runtime::Runtime, ledger: &Ledger, run_id: &str, ctx: &str) {
    let run = rt.block_on(ledger.get_run(run_id)).expect("run");
    let steps = rt.block_on(ledger.list_steps(run_id)).expect("steps");
    let calls = rt.block_on(ledger.list_calls(run_id)).expect("calls");
    let events = rt
        .block_on(ledger.list_events(EventFilter {
            run_id: Some(run_id.into()),
            ..Default::default()
        }))
        .expect("events");
    let of = |t: EventType, step: Option<&str>| {
        events
            .iter()
            .filter(|e| e.event_type == t && (step.is_none() || e.step_id.as_deref() == step))
            .count()
    };
    // The run: its last run-level event is the one of its status.
    let last_run_event = events
        .iter()
        .rev()
        .find(|e| e.event_type.as_str().starts_with("run."))
        .map(|e| e.event_type);
    let expected = match run.status {
        RunStatus::Queued => EventType::RunQueued,
        RunStatus::Running => EventType::RunStarted,
        RunStatus::Paused => EventType::RunPaused,
        RunStatus::Succeeded => EventType::RunSucceeded,
        RunStatus::Failed => EventType::RunFailed,
        RunStatus::Cancelled => EventType::RunCancelled,
    };
    assert_eq!(
        last_run_event,
        Some(expected),
        "{ctx}: run {:?}",
        run.status
    );
    for t in [
        EventType::RunSucceeded,
        EventType::RunFailed,
        EventType::RunCancelled,
    ] {
        assert_eq!(of(t, None), usize::from(t == expected), "{ctx}: {t:?}");
    }
    // Steps: started ⇔ step.started (once or more); succeeded ⇔ step.succeeded; failed ⇔ step.failed.
    let ids: BTreeSet<&str> = steps.iter().map(|s| s.step_id.as_str()).collect();
    for s in &steps {
        let sid = Some(s.step_id.as_str());
        let c = format!("{ctx}: step {} ({:?})", s.step_id, s.status);
        // A step paused in doubt and resumed starts (and says so) again.
        assert_eq!(
            of(EventType::StepStarted, sid) > 0,
            s.started_at.is_some(),
            "{c}"
        );
        assert_eq!(
            of(EventType::StepSucceeded, sid),
            usize::from(s.status == StepStatus::Succeeded),
            "{c}"
        );
        assert_eq!(
            of(EventType::StepFailed, sid),
            usize::from(s.status == StepStatus::Failed),
            "{c}"
        );
    }
    for e in &events {
        if let Some(step) = &e.step_id {
            assert!(
                ids.contains(step.as_str()),
                "{ctx}: event of a missing step {e:?}"
            );
        }
    }
    // Calls: in doubt now ⇔ an in-doubt event not followed by a resolution.
    let mut open: BTreeMap<String, i32> = BTreeMap::new();
    for e in &events {
        let call = e.tool_call_id.clone().unwrap_or_default();
        match e.event_type {
            EventType::ToolCallInDoubt => *open.entry(call).or_default() += 1,
            EventType::ToolCallResolved => *open.entry(call).or_default() -= 1,
            _ => {}
        }
    }
    for c in &calls {
        let in_doubt = c.status == flow_ledger::CallStatus::InDoubt;
        let pending = open.get(&c.tool_call_id).copied().unwrap_or(0);
        assert_eq!(
            pending,
            i32::from(in_doubt),
            "{ctx}: call {} ({:?})",
            c.tool_call_id,
            c.status
        );
    }
}

fn crash_points(backend: Backend) {
    let rt = runtime();
    let downstream = rt.block_on(CountingServer::start()).expect("server");
    for point in [
        "after_claim",
        "after_outbound",
        "after_response",
        "after_complete",
    ] {
        let db = TestDb::new(backend);
        let ledger = open(&rt, &db);
        let wf = db.write("pay.yaml", &pay(&downstream.url()));
        let ctx = format!("{backend:?} {point}");
        let crashed = output(
            db.flow()
                .arg("run")
                .arg(&wf)
                .env("FLOW_FAULT", format!("{point}:charge")),
        );
        assert_eq!(crashed.status.code(), None, "{ctx}: {}", stderr(&crashed));
        let run = run_id(&crashed);
        check_consistent(&rt, &ledger, &run, &format!("{ctx}, crashed"));
        let resumed = output(db.flow().args(["resume", &run]));
        check_consistent(&rt, &ledger, &run, &format!("{ctx}, resumed"));
        if resumed.status.code() == Some(3) {
            let settled = output(
                db.flow()
                    .args(["resume", &run, "--resolve", "charge=retry"]),
            );
            assert_eq!(
                settled.status.code(),
                Some(0),
                "{ctx}: {}",
                stderr(&settled)
            );
            check_consistent(&rt, &ledger, &run, &format!("{ctx}, resolved"));
        } else {
            assert_eq!(
                resumed.status.code(),
                Some(0),
                "{ctx}: {}",
                stderr(&resumed)
            );
        }
    }
}

#[test]
fn crash_points_leave_no_event_without_its_state_change_and_vice_versa() {
    for backend in backends() {
        crash_points(backend);
    }
}

/// `events tail` prints only events written after it started, whole runs in order. The
/// tail says nothing when it is ready, so the test does not guess when that is: it
/// writes runs until one is followed from `run.queued` to `run.succeeded` (a slow start
/// only costs another run), and no event of the run written before the tail may appear.
#[test]
fn tail_follows_new_events() {
    let db = TestDb::new(Backend::Sqlite);
    let old = run_hello(&db);
    let mut tail = db
        .flow()
        .args(["events", "tail", "--json", "--poll-interval", "50ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tail");
    let out = tail.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(out)) {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen: Vec<Value> = Vec::new();
    let mut followed = None;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(250));
        let run = run_hello(&db);
        while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
            let e: Value = serde_json::from_str(&line).expect("json line");
            check_shape(&e);
            let done = e["type"] == "run.succeeded" && e["run_id"] == run.as_str();
            seen.push(e);
            if done {
                break;
            }
        }
        let this: Vec<&Value> = seen
            .iter()
            .filter(|e| e["run_id"] == run.as_str())
            .collect();
        let whole = this.first().is_some_and(|e| e["type"] == "run.queued")
            && this.last().is_some_and(|e| e["type"] == "run.succeeded");
        if whole {
            followed = Some(this.len());
            break;
        }
    }
    let _ = tail.kill();
    let _ = tail.wait();
    assert!(
        seen.iter().all(|e| e["run_id"] != old.as_str()),
        "only new events: {seen:?}"
    );
    let n = followed.unwrap_or_else(|| panic!("no run was followed whole: {seen:?}"));
    assert!(n >= 8, "{seen:?}");
}

#[test]
fn tail_from_start_reads_a_backlog_larger_than_a_page() {
    let rt = runtime();
    let db = TestDb::new(Backend::Sqlite);
    let ledger = open(&rt, &db);
    let n = 1_100;
    rt.block_on(async {
        for i in 0..n {
            let run = flow_ledger::NewRun {
                id: format!("run_{i:05}"),
                workflow_name: "wf".into(),
                workflow_text: "name: wf\nnodes: {}\n".into(),
                inputs: serde_json::json!({}),
                priority: 0,
                not_before: None,
                trace_parent: None,
            };
            let now = flow_ledger::SystemClock.now();
            ledger.enqueue(run, now).await.expect("enqueue");
        }
    });
    let mut tail = db
        .flow()
        .args(["events", "tail", "--from-start", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tail");
    let reader = std::io::BufReader::new(tail.stdout.take().expect("stdout"));
    let mut runs = Vec::new();
    for line in std::io::BufRead::lines(reader) {
        let e: Value = serde_json::from_str(&line.expect("line")).expect("json line");
        runs.push(e["run_id"].as_str().unwrap_or_default().to_string());
        if runs.len() == n {
            break;
        }
    }
    let _ = tail.kill();
    let _ = tail.wait();
    let expected: Vec<String> = (0..n).map(|i| format!("run_{i:05}")).collect();
    assert_eq!(runs, expected, "every event once, in order");
}
