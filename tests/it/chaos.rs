//! Seeded random SIGKILLs on a 5-node diamond whose every node posts to a holding
//! downstream. After each kill, in-doubt calls are resolved from the downstream's own
//! log (arrived → succeeded, not arrived → retry with the same key) and the run resumed
//! until it succeeds. Then every node's effect must have landed exactly once.
//!
//! In reconcile mode the tool declares a probe of the downstream's effect record instead:
//! no human (no resolve command) is ever needed, and still every effect lands once.
//!
//! `FLOW_TEST_SEED` replays a failing sequence; `FLOW_CHAOS_ITERATIONS` runs longer
//! (default 25 per backend and mode, 100 in all).

use std::process::Stdio;
use std::time::Duration;

use flow_adapters::testkit::http::{Behavior, CountingServer};
use rand::{Rng, SeedableRng};

use crate::support::{TestDb, backends, output, show, stderr};

const NODES: [&str; 5] = ["a", "b", "c", "d", "e"];

fn workflow(url: &str, reconcile: bool) -> String {
    // The probe asks the downstream's own record of arrivals by key; not_found is
    // trusted a second after the request left (a killed process's bytes have landed).
    // Random kills may land on a call's re-send as well: the re-send budget is set to
    // its most so that kills, not the budget, are what the test exercises (a spent
    // budget pages a person by design; `doubt_budget.rs` tests that).
    let probe = if reconcile {
        format!(
            r#"
    reconcile:
      request: {{ url: "{url}/_control/effects/${{{{ call.key }}}}" }}
      found: "${{{{ response.status == 200 }}}}"
      not_found: "${{{{ response.status == 404 }}}}"
      after: 1s
      interval: 200ms
      max_resends: 10"#
        )
    } else {
        String::new()
    };
    format!(
        r#"name: diamond
max_parallel: 4
tools:
  effect:
    kind: http
    method: POST
    url: "{url}/effect/${{{{ with.node }}}}"
    timeout: 10s{probe}
nodes:
  a: {{ tool: effect, with: {{ node: a }} }}
  b: {{ tool: effect, needs: [a], with: {{ node: b }} }}
  c: {{ tool: effect, needs: [a], with: {{ node: c }} }}
  d: {{ tool: effect, needs: [b, c], with: {{ node: d }} }}
  e: {{ tool: effect, needs: [d], with: {{ node: e }} }}
"#
    )
}

fn iterations() -> usize {
    std::env::var("FLOW_CHAOS_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(25)
}

/// Starts `flow` with `args`, kills it with SIGKILL after `after`, returns whether it was
/// still running (and so was killed).
fn kill_after(db: &TestDb, args: &[&str], after: Duration) -> (bool, Option<i32>) {
    let mut child = db
        .flow()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn flow");
    std::thread::sleep(after);
    let killed = matches!(child.try_wait(), Ok(None));
    if killed {
        let _ = child.kill();
    }
    let status = child.wait().expect("wait");
    (killed, status.code())
}

/// Starts `flow daemon` and SIGKILLs it while one of its calls is outbound: every
/// effect path holds its requests until released, so the first request to arrive is
/// still in flight when the kill lands (the call was marked outbound before it left).
/// Then the paths answer after `hold` again and the held requests are let go.
fn kill_daemon_mid_call(db: &TestDb, server: &CountingServer, hold: Duration) {
    for node in NODES {
        server.set(&format!("/effect/{node}"), Behavior::HoldUntilReleased);
    }
    let before = server.total();
    let mut child = db
        .flow()
        .args(["daemon", "--poll-interval", "100ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn flow daemon");
    let start = std::time::Instant::now();
    while server.total() == before {
        if start.elapsed() > Duration::from_secs(60) || !matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            panic!("the daemon sent no request within 60 s (or exited)");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    for node in NODES {
        server.set(&format!("/effect/{node}"), Behavior::hold(hold));
    }
    server.release();
}

/// What the kills produced, to show the test exercised the in-doubt paths.
#[derive(Debug, Default)]
struct Stats {
    kills: u32,
    resolved_arrived: u32,
    resolved_retry: u32,
    /// Calls settled by a probe (reconcile mode).
    reconciled: u32,
}

/// One backend's setting: the mode, the kill window, the ledger, the downstream, the file.
struct Setting<'a> {
    reconcile: bool,
    window: Duration,
    db: &'a TestDb,
    server: &'a CountingServer,
    file: &'a str,
}

fn one_run(c: &Setting<'_>, rng: &mut rand::rngs::StdRng, ctx: &str, stats: &mut Stats) {
    let Setting {
        reconcile,
        window,
        db,
        server,
        file,
    } = *c;
    let run_id = format!("chaos-{}", rng.random::<u64>());
    // Kill somewhere inside the time an uninterrupted run takes on this backend.
    let kill_at = window.mul_f64(rng.random_range(0.1..1.0));
    stats.kills += u32::from(kill_after(db, &["run", file, "--run-id", &run_id], kill_at).0);
    let mut rounds = 0;
    loop {
        rounds += 1;
        assert!(rounds < 20, "{ctx}: run {run_id} did not converge");
        // Sometimes crash the resume too.
        // `flow run --run-id` is an idempotent start: it attaches to the run if the killed
        // process had created it, and resumes it. Sometimes it is killed too.
        let args = ["run", file, "--run-id", &run_id];
        if rng.random_bool(0.3) {
            let at = window.mul_f64(rng.random_range(0.1..1.0));
            stats.kills += u32::from(kill_after(db, &args, at).0);
            continue;
        }
        let out = output(db.flow().args(args));
        match out.status.code() {
            Some(0) => break,
            Some(3) if reconcile => {
                panic!(
                    "{ctx}: run {run_id} paused for a human although its tool reconciles:\n{}\n{:#}",
                    stderr(&out),
                    show(db, &run_id)
                );
            }
            Some(3) => {
                let s = show(db, &run_id);
                for c in s["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|c| c["status"] == "in_doubt")
                {
                    let node = c["tool_call_id"].as_str().unwrap_or_default();
                    let key = c["current_key"].as_str().unwrap_or_default();
                    let arrived = server.count(key) > 0;
                    let mut cmd = db.flow();
                    cmd.args(["resume", &run_id, "--detach", "--resolve"]);
                    if arrived {
                        stats.resolved_arrived += 1;
                        cmd.arg(format!("{node}=succeeded"))
                            .args(["--output", r#"{"resolved": "arrived"}"#]);
                    } else {
                        stats.resolved_retry += 1;
                        cmd.arg(format!("{node}=retry"));
                    }
                    let r = output(&mut cmd);
                    assert_eq!(
                        r.status.code(),
                        Some(0),
                        "{ctx}: resolving {node}: {}",
                        stderr(&r)
                    );
                }
            }
            other => panic!(
                "{ctx}: resume of {run_id} exited {other:?}:\n{}",
                stderr(&out)
            ),
        }
    }
    let s = show(db, &run_id);
    assert_eq!(s["run"]["status"], "succeeded", "{ctx}: {s:#}");
    stats.reconciled += landed_once(server, &s, &run_id, ctx);
}

/// Checks that every node's effect of `run` landed at the downstream exactly once, and
/// that no effect request at all came without an `Idempotency-Key` (such a request
/// belongs to no run's count, so it would be a duplicate nobody sees); returns how many
/// of the run's calls a probe settled.
fn landed_once(server: &CountingServer, show: &serde_json::Value, run: &str, ctx: &str) -> u32 {
    let keyless: Vec<String> = server
        .log()
        .iter()
        .filter(|r| r.path.starts_with("/effect/") && r.key.is_none())
        .map(|r| format!("#{} {} {}", r.seq, r.method, r.path))
        .collect();
    assert!(
        keyless.is_empty(),
        "{ctx}: effect requests without an Idempotency-Key: {keyless:?}"
    );
    for node in NODES {
        let arrivals = server
            .log()
            .iter()
            .filter(|r| {
                r.path == format!("/effect/{node}")
                    && r.key
                        .as_deref()
                        .is_some_and(|k| k.starts_with(&format!("{run}:")))
            })
            .count();
        assert_eq!(
            arrivals, 1,
            "{ctx}: node {node} of {run} landed {arrivals} times"
        );
    }
    let reconciled = show["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["resolution"]["by"] == "reconcile")
        .count();
    u32::try_from(reconciled).unwrap_or(u32::MAX)
}

#[test]
fn random_kills_never_duplicate_or_lose_an_effect() {
    chaos(false);
}

#[test]
fn random_kills_with_reconcile_need_no_human_and_duplicate_nothing() {
    chaos(true);
}

fn chaos(reconcile: bool) {
    let seed: u64 = std::env::var("FLOW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("chaos seed: {seed} (replay with FLOW_TEST_SEED={seed})");
    let rt = crate::support::runtime();
    for backend in backends() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (backend as u64));
        let server = rt.block_on(CountingServer::start()).expect("server");
        for node in NODES {
            server.set(
                &format!("/effect/{node}"),
                Behavior::hold(Duration::from_millis(40)),
            );
        }
        let db = TestDb::new(backend);
        let file = db.write("diamond.yaml", &workflow(&server.url(), reconcile));
        let file = file.display().to_string();
        // How long one uninterrupted run takes here (process start, connect, five calls):
        // the kills are spread over that window so they land while calls are in flight.
        let started = std::time::Instant::now();
        let warm = output(db.flow().args(["run", &file]));
        assert_eq!(warm.status.code(), Some(0), "{}", stderr(&warm));
        let window = started.elapsed();
        let mut stats = Stats::default();
        for i in 0..iterations() {
            let ctx = format!("seed {seed} {backend:?} iteration {i} (kill window {window:?})");
            let ctx = format!("{ctx}{}", if reconcile { " reconcile mode" } else { "" });
            let setting = Setting {
                reconcile,
                window,
                db: &db,
                server: &server,
                file: &file,
            };
            one_run(&setting, &mut rng, &ctx, &mut stats);
        }
        eprintln!("{backend:?}: {stats:?}");
        let settled = stats.resolved_arrived + stats.resolved_retry + stats.reconciled;
        assert!(
            stats.kills > 0 && settled > 0,
            "seed {seed}: the kills never left a call in doubt: {stats:?}"
        );
        if reconcile {
            assert_eq!(
                stats.resolved_arrived + stats.resolved_retry,
                0,
                "seed {seed}: no human"
            );
        }
    }
}

/// Daemons SIGKILLed at random while they drain reconcilable runs: each next daemon
/// takes the dead one's runs over (provably dead on this host), finds their calls in
/// doubt and probes them. No run ever needs a human (no probe pages one, and every run
/// succeeds with daemons alone; a run may be paused for a while, waiting for its next
/// probe), and every effect lands once.
/// `FLOW_CHAOS_RUNS` submits more (default 20 per backend).
#[test]
fn daemons_killed_at_random_leave_nothing_for_a_human() {
    let seed: u64 = std::env::var("FLOW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("daemon chaos seed: {seed} (replay with FLOW_TEST_SEED={seed})");
    let runs: usize = std::env::var("FLOW_CHAOS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let rt = crate::support::runtime();
    for backend in backends() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (backend as u64));
        let server = rt.block_on(CountingServer::start()).expect("server");
        for node in NODES {
            server.set(
                &format!("/effect/{node}"),
                Behavior::hold(Duration::from_millis(60)),
            );
        }
        let db = TestDb::new(backend);
        let file = db.write("diamond.yaml", &workflow(&server.url(), true));
        let ids: Vec<String> = (0..runs).map(|i| format!("dchaos-{i}")).collect();
        for id in &ids {
            let out = output(db.flow().arg("submit").arg(&file).args(["--run-id", id]));
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        }
        let ctx = format!("seed {seed} {backend:?}");
        let start = std::time::Instant::now();
        // The first kill lands mid-call for certain; the later ones wherever they fall.
        kill_daemon_mid_call(&db, &server, Duration::from_millis(60));
        let mut kills = 1;
        loop {
            let statuses: Vec<String> = ids
                .iter()
                .map(|id| {
                    show(&db, id)["run"]["status"]
                        .as_str()
                        .unwrap_or("?")
                        .to_owned()
                })
                .collect();
            assert!(
                !statuses.iter().any(|s| s == "failed"),
                "{ctx}: a run failed: {statuses:?}"
            );
            // Paused is a passing state here: a run waits for its call's next probe,
            // which the next daemon's reconciler sends (convergence below proves it).
            // A probe that hands the call to a person is what must never happen.
            for (id, status) in ids.iter().zip(&statuses) {
                if status != "paused" {
                    continue;
                }
                let view = show(&db, id);
                let paged = view["probes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["decision"] == "needs_operator");
                assert!(!paged, "{ctx}: run {id} needs a human: {view:#}");
            }
            if statuses.iter().all(|s| s == "succeeded") {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(180),
                "{ctx}: did not converge: {statuses:?}"
            );
            let life = Duration::from_millis(rng.random_range(100..800));
            let (killed, _) = kill_after(&db, &["daemon", "--poll-interval", "100ms"], life);
            kills += u32::from(killed);
        }
        let mut reconciled = 0;
        for id in &ids {
            reconciled += landed_once(&server, &show(&db, id), id, &ctx);
        }
        eprintln!(
            "{backend:?}: {runs} runs, {kills} daemon kills, {reconciled} calls settled by probes"
        );
        assert!(kills > 0, "{ctx}: no daemon was killed");
        // The mid-call kill left a call in doubt, and a probe (no human) settled it.
        assert!(
            reconciled > 0,
            "{ctx}: no call was in flight at a kill ({kills} kills)"
        );
    }
}
