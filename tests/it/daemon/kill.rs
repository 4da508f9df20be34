//! Several daemons drain one queue while one of them is SIGKILLed in the middle of a
//! call; every effect lands once.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::{Behavior, CountingServer};
use flow_ledger::{CallStatus, EventFilter, EventType, Ledger, RunFilter, RunStatus};

use super::{Daemon, chain, enqueue, open_ledger, statuses, wait_until};
use crate::support::{Backend, TestDb, output, postgres_available, runtime, stderr, stdout};

/// SIGKILLs `daemon` while one of its calls is outbound: every path is held until
/// released, and the kill waits for the ledger to show a call leased by `daemon`,
/// marked outbound, whose request arrived after the hold began (so it is still held). Then requests are
/// answered after 15 ms again and the held ones are let go.
fn kill_mid_call(
    rt: &tokio::runtime::Runtime,
    ledger: &Ledger,
    server: &CountingServer,
    daemon: &mut Daemon,
) {
    server.set("*", Behavior::HoldUntilReleased);
    // Requests that arrive after this one are held (behaviour and arrival number are
    // taken under one lock); those before may be finishing their 15 ms.
    let from = u64::from(server.total());
    let pid = daemon.pid();
    let held_by_daemon = || {
        let held: HashSet<String> = server
            .log()
            .into_iter()
            .filter(|r| r.seq > from)
            .filter_map(|r| r.key)
            .collect();
        let running = RunFilter {
            status: Some(RunStatus::Running),
            limit: 10_000,
            ..Default::default()
        };
        let runs = rt.block_on(ledger.list_runs(running)).expect("list runs");
        let of_pid = |w: Option<&flow_ledger::WorkerId>| {
            w.and_then(|w| w.parts()).is_some_and(|(_, p, _)| p == pid)
        };
        runs.iter().filter(|r| of_pid(r.worker.as_ref())).any(|r| {
            let calls = rt.block_on(ledger.list_calls(&r.id)).expect("calls");
            calls.iter().any(|c| {
                c.status == CallStatus::Outbound
                    && of_pid(c.lease_holder.as_ref())
                    && held.contains(&c.current_key)
            })
        })
    };
    wait_until(
        Duration::from_secs(30),
        "a call of the daemon to kill held outbound",
        held_by_daemon,
    );
    let _ = daemon.child.kill();
    let _ = daemon.child.wait();
    server.set("*", Behavior::hold(Duration::from_millis(15)));
    server.release();
}

/// Resolves every in-doubt call of the paused runs from the server's own record (arrived
/// → succeeded, never arrived → re-send with the same key) and re-queues the runs; checks
/// that each such call really was ambiguous: held by the killed daemon, sent at most once.
fn resolve_in_doubt(
    rt: &tokio::runtime::Runtime,
    db: &TestDb,
    ledger: &Ledger,
    server: &CountingServer,
    killed_pid: u32,
) -> (u32, u32) {
    let (mut arrived, mut retried) = (0, 0);
    for (run_id, status) in statuses(rt, ledger) {
        if status != RunStatus::Paused {
            continue;
        }
        let calls = rt.block_on(ledger.list_calls(&run_id)).expect("calls");
        let events = rt
            .block_on(ledger.list_events(EventFilter {
                run_id: Some(run_id.clone()),
                after_seq: None,
                limit: 0,
            }))
            .expect("events");
        for c in calls.iter().filter(|c| c.status == CallStatus::InDoubt) {
            // The event names the lease holder whose request may have left.
            let reason = events
                .iter()
                .find(|e| {
                    e.event_type == EventType::ToolCallInDoubt
                        && e.tool_call_id.as_deref() == Some(&c.tool_call_id)
                })
                .and_then(|e| e.payload["reason"].as_str())
                .unwrap_or_default()
                .to_string();
            assert!(
                reason.contains(&format!(":{killed_pid}:")),
                "{run_id}/{}: only the killed daemon's calls may be in doubt: {reason}",
                c.tool_call_id
            );
            let n = server.count(&c.current_key);
            assert!(n <= 1, "{}: sent {n} times", c.current_key);
            let mut cmd = db.flow();
            cmd.args(["resume", &run_id, "--detach", "--resolve"]);
            if n == 1 {
                arrived += 1;
                cmd.arg(format!("{}=succeeded", c.tool_call_id))
                    .args(["--output", r#"{"resolved": "arrived"}"#]);
            } else {
                retried += 1;
                cmd.arg(format!("{}=retry", c.tool_call_id));
            }
            let out = output(&mut cmd);
            assert_eq!(out.status.code(), Some(0), "resolve: {}", stderr(&out));
        }
    }
    (arrived, retried)
}

/// `daemons` daemon processes drain `runs` runs of the three-node chain while one of
/// them is SIGKILLed a third of the way through and replaced.
fn many_daemons_one_killed(backend: Backend, daemons: usize, runs: usize) {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    server.set("*", Behavior::hold(Duration::from_millis(15)));
    let db = TestDb::new(backend);
    let text = chain(&server.url());
    let file = db.write("chain3.yaml", &text);
    let ledger = open_ledger(&rt, &db);
    let by_cli = runs / 10;
    for i in 0..runs - by_cli {
        enqueue(&rt, &ledger, &text, &format!("lib-{i}"), i);
    }
    let args = ["--concurrency", "8", "--poll-interval", "250ms"];
    let mut procs: Vec<Daemon> = (0..daemons)
        .map(|n| Daemon::start(&db, &format!("d{n}"), &args, &[]))
        .collect();
    // Runs submitted while the daemons work, through the CLI (NOTIFY wakes them on PG).
    let submitter = {
        let file = file.clone();
        let dir = db.dir.path().to_path_buf();
        let url = db.url.clone();
        std::thread::spawn(move || {
            for i in 0..by_cli {
                let out = output(
                    crate::support::flow()
                        .current_dir(&dir)
                        .env("FLOW_DATABASE_URL", &url)
                        .arg("submit")
                        .arg(&file)
                        .args(["--input", &format!("i={}", 10_000 + i)]),
                );
                assert_eq!(out.status.code(), Some(0), "submit: {}", stderr(&out));
                assert!(stdout(&out).trim().starts_with("run_"));
            }
        })
    };
    let started = Instant::now();
    let third = u32::try_from(runs).unwrap_or(u32::MAX);
    wait_until(Duration::from_secs(40), "a third of the requests", || {
        server.total() >= third
    });
    let killed_pid = procs[0].pid();
    kill_mid_call(&rt, &ledger, &server, &mut procs[0]);
    procs.push(Daemon::start(&db, "replacement", &args, &[]));
    submitter.join().expect("submitter");
    let ctx = format!("{backend:?}");
    wait_until(Duration::from_secs(60), "every run to end", || {
        let s = statuses(&rt, &ledger);
        s.len() == runs
            && s.values()
                .all(|st| matches!(st, RunStatus::Succeeded | RunStatus::Paused))
    });
    let paused = statuses(&rt, &ledger)
        .values()
        .filter(|s| **s == RunStatus::Paused)
        .count();
    let (arrived, retried) = resolve_in_doubt(&rt, &db, &ledger, &server, killed_pid);
    // The kill landed while a call was outbound (`kill_mid_call`), and its request had
    // arrived: that run paused in doubt and was resolved as arrived.
    assert!(
        paused >= 1 && arrived >= 1,
        "{backend:?}: no call was in flight at the kill ({paused} paused, {arrived} arrived, {retried} retried)"
    );
    wait_until(Duration::from_secs(30), "resolved runs to succeed", || {
        statuses(&rt, &ledger)
            .values()
            .all(|st| *st == RunStatus::Succeeded)
    });
    for d in procs.iter_mut().skip(1) {
        d.signal("-TERM");
        let status = d.wait(Duration::from_secs(20));
        assert_eq!(status.code(), Some(0), "{ctx}: daemon log:\n{}", d.log());
    }
    // Every effect landed exactly once; no key was ever sent twice.
    let log = server.log();
    let mut per_key: HashMap<String, u32> = HashMap::new();
    for r in &log {
        *per_key
            .entry(r.key.clone().unwrap_or_default())
            .or_default() += 1;
    }
    let twice: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{ctx}: keys sent twice: {twice:?}");
    for (run_id, _) in statuses(&rt, &ledger) {
        for node in ["a", "b", "c"] {
            let landed = log
                .iter()
                .filter(|r| {
                    r.path == format!("/effect/{node}")
                        && r.key
                            .as_deref()
                            .is_some_and(|k| k.starts_with(&format!("{run_id}:")))
                })
                .count();
            assert_eq!(
                landed, 1,
                "{ctx}: {run_id} node {node} landed {landed} times"
            );
        }
    }
    eprintln!(
        "{ctx}: {runs} runs by {daemons} daemons (+1 replacement) in {:?}; {paused} paused after the kill ({arrived} calls had arrived, {retried} had not)",
        started.elapsed()
    );
}

#[test]
fn three_daemons_on_postgres_survive_a_sigkill() {
    if postgres_available() {
        many_daemons_one_killed(Backend::Postgres, 3, 300);
    }
}

#[test]
fn two_daemons_on_one_sqlite_file_survive_a_sigkill() {
    many_daemons_one_killed(Backend::Sqlite, 2, 300);
}
