//! claim → mark_outbound → complete cycles per second, and one-node pure-function runs
//! per second, on SQLite (FULL and NORMAL) and PostgreSQL, with 1 and 8 concurrent
//! tasks, printed beside this machine's fsync floor.
//!
//! Run: `cargo bench -p flow-ledger` (about a minute). A durable tool call costs at least
//! two durable commits (the outbound mark and the outcome) plus the claim, so on SQLite
//! FULL one sequential cycle cannot beat ~3 fsyncs; concurrency only helps where commits
//! can overlap (PostgreSQL group commit) — SQLite serializes writers.
//!
//! Environment: `FLOW_BENCH_SECONDS` (per round, default 1.5), `FLOW_BENCH_ROUNDS`
//! (default 3), `FLOW_TEST_POSTGRES_URL` (admin URL, default
//! `postgres://postgres@127.0.0.1:5432/test`).

use std::io::{Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

use flow_ledger::{
    CallClaim, CallOutcome, ClaimCall, Clock, CompleteCall, Ledger, NewRun, NewStep, OpenOptions,
    PureCall, RunFinish, RunStatus, SqliteSynchronous, StepStatus, SystemClock, WorkerId,
    canonical_hash,
};
use serde_json::json;
use sqlx::Connection;

const LEASE: Duration = Duration::from_secs(3600);

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// Median latency (ms) of `n` write+fdatasync and write+fsync calls on a file in `dir`.
fn fsync_floor(dir: &std::path::Path, n: usize) -> std::io::Result<(f64, f64)> {
    let path = dir.join("fsync-probe");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    let block = vec![7u8; 4096];
    let (mut data, mut full) = (Vec::new(), Vec::new());
    for i in 0..n {
        f.seek(SeekFrom::Start(((i % 16) * 4096) as u64))?;
        f.write_all(&block)?;
        let t = Instant::now();
        f.sync_data()?;
        data.push(t.elapsed().as_secs_f64() * 1e3);
        f.write_all(&block)?;
        let t = Instant::now();
        f.sync_all()?;
        full.push(t.elapsed().as_secs_f64() * 1e3);
    }
    std::fs::remove_file(path)?;
    Ok((median(&mut data), median(&mut full)))
}

struct Round {
    cycles: u64,
    secs: f64,
    latencies_ms: Vec<f64>,
}

/// One task: its own run, then cycles on fresh tool calls until `deadline`.
async fn task_cycles(ledger: Ledger, task: usize, round: usize, deadline: Instant) -> Round {
    let clock = SystemClock;
    let worker = WorkerId::current();
    let run_id = format!("run_bench_{round}_{task}");
    ledger
        .enqueue(
            NewRun {
                id: run_id.clone(),
                workflow_name: "bench".into(),
                workflow_text: "name: bench".into(),
                inputs: json!({}),
                priority: 0,
                not_before: None,
                trace_parent: None,
            },
            clock.now(),
        )
        .await
        .expect("enqueue");
    let run = ledger
        .claim_run(&run_id, &worker, LEASE, clock.now())
        .await
        .expect("claim run");
    let request = json!({"amount": 1});
    let hash = canonical_hash(&request);
    let start = Instant::now();
    let mut latencies_ms = Vec::new();
    let mut i = 0u64;
    while Instant::now() < deadline {
        let t = Instant::now();
        let node = format!("n{i}");
        let claim = ClaimCall {
            run: &run,
            step_id: node.clone(),
            tool_call_id: node.clone(),
            tool: "bench".into(),
            idempotency_key: format!("{run_id}:{node}"),
            request: request.clone(),
            request_hash: hash.clone(),
            retry_failed: false,
            lease: LEASE,
        };
        let lease = match ledger.claim_call(claim, clock.now()).await.expect("claim") {
            CallClaim::Claimed(l) => l,
            other => panic!("unexpected {other:?}"),
        };
        ledger
            .mark_outbound(&lease, clock.now())
            .await
            .expect("outbound");
        let done = CompleteCall {
            lease: &lease,
            outcome: CallOutcome::Succeeded(json!({"ok": true})),
            requests_sent: 1,
            step: None,
            next_step: None,
        };
        ledger
            .complete_call(done, clock.now())
            .await
            .expect("complete");
        latencies_ms.push(t.elapsed().as_secs_f64() * 1e3);
        i += 1;
    }
    Round {
        cycles: i,
        secs: start.elapsed().as_secs_f64(),
        latencies_ms,
    }
}

/// One task running one-node runs with a pure function: enqueue, claim, record the pure
/// call (step + call + attempt in one commit), finish: 4 commits per run.
async fn task_pure_runs(ledger: Ledger, task: usize, round: usize, deadline: Instant) -> Round {
    let clock = SystemClock;
    let worker = WorkerId::current();
    let request = json!({"text": "hi"});
    let hash = canonical_hash(&request);
    let start = Instant::now();
    let mut latencies_ms = Vec::new();
    let mut i = 0u64;
    while Instant::now() < deadline {
        let t = Instant::now();
        let run_id = format!("run_pure_{round}_{task}_{i}");
        ledger
            .enqueue(
                NewRun {
                    id: run_id.clone(),
                    workflow_name: "bench".into(),
                    workflow_text: "name: bench".into(),
                    inputs: json!({}),
                    priority: 0,
                    not_before: None,
                    trace_parent: None,
                },
                clock.now(),
            )
            .await
            .expect("enqueue");
        let run = ledger
            .claim_run(&run_id, &worker, LEASE, clock.now())
            .await
            .expect("claim run");
        let pure = PureCall {
            run: &run,
            step: NewStep {
                step_id: "shape".into(),
                node_id: "shape".into(),
                retry: 0,
                not_before: None,
                status: StepStatus::Running,
            },
            tool_call_id: "shape".into(),
            tool: "core.echo".into(),
            idempotency_key: format!("{run_id}:shape"),
            request: request.clone(),
            request_hash: hash.clone(),
            outcome: CallOutcome::Succeeded(json!("hi")),
            retry_failed: false,
            next_step: None,
        };
        ledger
            .record_pure_call(pure, clock.now())
            .await
            .expect("pure");
        let fin = RunFinish {
            status: RunStatus::Succeeded,
            output: Some(json!("hi")),
            error: None,
        };
        ledger
            .finish_run(&run, fin, clock.now())
            .await
            .expect("finish");
        latencies_ms.push(t.elapsed().as_secs_f64() * 1e3);
        i += 1;
    }
    Round {
        cycles: i,
        secs: start.elapsed().as_secs_f64(),
        latencies_ms,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Work {
    CallCycles,
    PureRuns,
}

struct Figures {
    per_sec_median: f64,
    p50_ms: f64,
    p99_ms: f64,
}

async fn measure(ledger: &Ledger, work: Work, tasks: usize, rounds: usize, secs: f64) -> Figures {
    let mut rates = Vec::new();
    let mut lat = Vec::new();
    for round in 0..rounds {
        let deadline = Instant::now() + Duration::from_secs_f64(secs);
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let (l, task) = (ledger.clone(), t + 100 * tasks);
                match work {
                    Work::CallCycles => tokio::spawn(task_cycles(l, task, round, deadline)),
                    Work::PureRuns => tokio::spawn(task_pure_runs(l, task, round, deadline)),
                }
            })
            .collect();
        let mut cycles = 0;
        let mut elapsed: f64 = 0.0;
        for h in handles {
            let r = h.await.expect("task");
            cycles += r.cycles;
            elapsed = elapsed.max(r.secs);
            lat.extend(r.latencies_ms);
        }
        rates.push(cycles as f64 / elapsed);
    }
    Figures {
        per_sec_median: median(&mut rates),
        p50_ms: percentile(&mut lat, 0.5),
        p99_ms: percentile(&mut lat, 0.99),
    }
}

fn print_row(name: &str, tasks: usize, f: &Figures, fsync_ms: f64) {
    let per_cycle_fsyncs = if f.per_sec_median > 0.0 {
        (1000.0 / f.per_sec_median * tasks as f64) / fsync_ms
    } else {
        f64::NAN
    };
    println!(
        "{name:<16} {tasks:>5} {:>14.0} {:>12.2} {:>10.2} {:>20.1}",
        f.per_sec_median, f.p50_ms, f.p99_ms, per_cycle_fsyncs
    );
}

async fn fresh_pg() -> Option<(String, String, String)> {
    let admin = std::env::var("FLOW_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let mut conn =
        match tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(&admin))
            .await
        {
            Ok(Ok(c)) => c,
            _ => return None,
        };
    let name = format!(
        "flow_bench_{}",
        ulid::Ulid::generate().to_string().to_lowercase()
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .ok()?;
    let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
    Some((format!("{base}/{name}"), admin.clone(), name))
}

async fn drop_pg(admin: &str, name: &str) {
    if let Ok(mut c) = sqlx::PgConnection::connect(admin).await {
        let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
        let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut c).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: f64 = std::env::var("FLOW_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let rounds: usize = std::env::var("FLOW_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let dir = tempfile::tempdir().expect("tempdir");
    let (fdatasync_ms, fsync_ms) = fsync_floor(dir.path(), 200).expect("fsync probe");
    println!(
        "fsync floor ({}): fdatasync median {fdatasync_ms:.3} ms, fsync median {fsync_ms:.3} ms (200 calls each)",
        dir.path().display()
    );
    println!("rounds: {rounds} x {secs} s; per second = median over rounds; latencies over all");
    for (work, title) in [
        (
            Work::CallCycles,
            "claim_call -> mark_outbound -> complete_call (3 commits)",
        ),
        (
            Work::PureRuns,
            "one-node runs: enqueue -> claim_run -> record_pure_call -> finish_run (4 commits)",
        ),
    ] {
        println!();
        println!("{title}");
        println!(
            "{:<16} {:>5} {:>14} {:>12} {:>10} {:>20}",
            "backend", "tasks", "per second", "p50 ms", "p99 ms", "mean/fdatasync"
        );
        for (name, sync) in [
            ("sqlite FULL", SqliteSynchronous::Full),
            ("sqlite NORMAL", SqliteSynchronous::Normal),
        ] {
            for tasks in [1, 8] {
                let url = format!(
                    "sqlite://{}/{}-{tasks}.db",
                    dir.path().display(),
                    name.replace(' ', "-")
                );
                let opts = OpenOptions {
                    sqlite_synchronous: sync,
                    ..OpenOptions::default()
                };
                let ledger = Ledger::open(&url, opts).await.expect("open sqlite");
                let f = measure(&ledger, work, tasks, rounds, secs).await;
                print_row(name, tasks, &f, fdatasync_ms);
                ledger.close().await;
            }
        }
        match fresh_pg().await {
            None => println!("postgres: SKIPPED (unreachable; set FLOW_TEST_POSTGRES_URL)"),
            Some((url, admin, db)) => {
                let ledger = Ledger::open(&url, OpenOptions::default())
                    .await
                    .expect("open postgres");
                for tasks in [1, 8] {
                    let f = measure(&ledger, work, tasks, rounds, secs).await;
                    print_row("postgres", tasks, &f, fdatasync_ms);
                }
                ledger.close().await;
                drop_pg(&admin, &db).await;
            }
        }
    }
    // The floor moves with whatever else the machine does: measure it again.
    let (fdatasync_end, fsync_end) = fsync_floor(dir.path(), 200).expect("fsync probe");
    println!();
    println!(
        "fsync floor again at the end: fdatasync median {fdatasync_end:.3} ms, fsync median {fsync_end:.3} ms"
    );
}
