//! Retention at scale: a million one-step runs pushed through a ledger with
//! `[retention] runs = "1h"` on a test clock, and what stays flat — the database's size,
//! the claim's latency (p50/p99) and the first page of `GET /api/v1/runs` (`list_runs`,
//! p99) — at 10 %, 50 % and 100 % of the runs executed.
//!
//! Each run is what a real one-step run writes: enqueued in a batch of 1,000 (with an
//! input, so the search index holds a row), claimed in batches of 50 (timed), a step,
//! a side-effecting call (claim, outbound mark, outcome with the step's finish, so
//! attempt, usage and events rows), and the run's finish. The test clock moves
//! `3600 / (FLOW_BENCH_KEEP / 1000)` s per batch, so the `1h` horizon keeps
//! `FLOW_BENCH_KEEP` runs (default 50,000); after every batch one retention pass
//! (`flow::retention::gc::pass`, unpaced) deletes what is past it, leaving a tombstone per
//! key; tombstones expire after `keys = "2h"` (compressed as the horizon is) and
//! delivered events after `events = "1h"`.
//!
//! Run: `cargo bench --bench retention` (tens of minutes for a million on SQLite).
//! Environment: `FLOW_BENCH_RUNS` (default 1000000), `FLOW_BENCH_KEEP` (runs the horizon
//! keeps, default 50000), `FLOW_BENCH_ONLY` (`sqlite` or
//! `postgres`), `FLOW_TEST_POSTGRES_URL` (admin URL, default
//! `postgres://postgres@127.0.0.1:5432/test`).

use std::time::{Duration, Instant};

use flow::retention::Retention;
use flow::retention::gc::{Mode, pass};
use flow_ledger::{
    CallClaim, CallOutcome, ClaimCall, ClaimRuns, Clock, CompleteCall, Ledger, ManualClock, NewRun,
    NewStep, OpenOptions, RunFilter, RunFinish, RunLease, RunStatus, StepFinish, StepStatus,
    Timestamp, WorkerId, canonical_hash,
};
use serde_json::json;
use sqlx::Connection;

const T0: i64 = 1_800_000_000_000;
const BATCH: usize = 1_000;
const CLAIM: u32 = 50;
const LEASE: Duration = Duration::from_secs(3600);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// One run's call, step and finish (what a daemon writes for a one-node run).
async fn execute(ledger: Ledger, run: RunLease, now: Timestamp) {
    let step = NewStep {
        step_id: "pay".into(),
        node_id: "pay".into(),
        retry: 0,
        not_before: None,
        status: StepStatus::Running,
    };
    ledger.create_step(&run, step, now).await.expect("step");
    let request = json!({ "amount": 10, "order": run.run_id });
    let claim = ClaimCall {
        run: &run,
        step_id: "pay".into(),
        tool_call_id: "pay".into(),
        tool: "payments".into(),
        idempotency_key: format!("{}:pay", run.run_id),
        request_hash: canonical_hash(&request),
        request,
        retry_failed: false,
        lease: LEASE,
    };
    let CallClaim::Claimed(lease) = ledger.claim_call(claim, now).await.expect("claim") else {
        panic!("a fresh key is claimed");
    };
    ledger.mark_outbound(&lease, now).await.expect("outbound");
    let output = json!({ "ok": true });
    let done = CompleteCall {
        lease: &lease,
        outcome: CallOutcome::Succeeded(output.clone()),
        requests_sent: 1,
        step: Some(StepFinish {
            step_id: "pay".into(),
            status: StepStatus::Succeeded,
            output: Some(output.clone()),
            error: None,
        }),
        next_step: None,
    };
    ledger.complete_call(done, now).await.expect("complete");
    let finish = RunFinish {
        status: RunStatus::Succeeded,
        output: Some(output),
        error: None,
    };
    ledger.finish_run(&run, finish, now).await.expect("finish");
}

/// The database's size in bytes (SQLite: pages in use and free; PostgreSQL: the
/// database on disk).
async fn size(url: &str) -> i64 {
    if let Some(path) = url.strip_prefix("sqlite://") {
        let len = |p: &str| std::fs::metadata(p).map_or(0, |m| i64::try_from(m.len()).unwrap_or(0));
        return len(path) + len(&format!("{path}-wal"));
    }
    let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query_scalar("SELECT pg_database_size(current_database())")
        .fetch_one(&mut c)
        .await
        .expect("size")
}

/// The read floor: p50 of `get_run` of one run by primary key, `n` calls.
async fn floor_p50(ledger: &Ledger, id: &str, n: usize) -> f64 {
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        ledger.get_run(id).await.expect("get_run");
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    percentile(&mut ms, 0.5)
}

/// p99 of the first page of the runs list (newest first, 50), `n` calls.
async fn list_p99(ledger: &Ledger, n: usize) -> f64 {
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let page = ledger
            .list_runs(RunFilter {
                limit: 50,
                ..RunFilter::default()
            })
            .await
            .expect("list");
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(!page.is_empty());
    }
    percentile(&mut ms, 0.99)
}

async fn bench(name: &str, url: &str, runs: usize, keep: usize) {
    let tick = Duration::from_secs(3600 / (keep / BATCH).max(1) as u64);
    let clock = ManualClock::new(Timestamp(T0));
    let ledger = Ledger::open(url, OpenOptions::default())
        .await
        .expect("open");
    let retention = Retention {
        runs: Some(Duration::from_secs(3600)),
        events: Some(Duration::from_secs(3600)),
        keys: Duration::from_secs(7200),
        ..Retention::default()
    };
    let worker = WorkerId::current();
    let checkpoints = [runs / 10, runs / 2, runs];
    let mut claims_ms: Vec<f64> = Vec::new();
    let (mut deleted, mut gc_secs) = (0u64, 0.0);
    let start = Instant::now();
    println!(
        "{name}: {runs} runs, horizon 1h = {keep} runs kept ({} s per batch of {BATCH})",
        tick.as_secs()
    );
    println!(
        "  {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8}",
        "executed",
        "size MiB",
        "claim p50",
        "claim p99",
        "list p99",
        "floor p50",
        "deleted",
        "gc s"
    );
    for b in 0..runs / BATCH {
        let now = clock.advance(tick);
        let batch: Vec<NewRun> = (0..BATCH)
            .map(|i| NewRun {
                id: format!("run_{:07}", b * BATCH + i),
                workflow_name: "pay".into(),
                workflow_text: "name: pay\nnodes: {}\n".into(),
                inputs: json!({ "order_id": b * BATCH + i }),
                priority: 0,
                not_before: None,
                trace_parent: None,
            })
            .collect();
        ledger
            .enqueue_batch(batch, None, now)
            .await
            .expect("enqueue");
        loop {
            let t = Instant::now();
            let req = ClaimRuns {
                worker: &worker,
                lease: LEASE,
                limit: CLAIM,
            };
            let claimed = ledger.claim_next(req, now).await.expect("claim");
            claims_ms.push(t.elapsed().as_secs_f64() * 1e3);
            if claimed.is_empty() {
                break;
            }
            let tasks: Vec<_> = claimed
                .into_iter()
                .map(|run| tokio::spawn(execute(ledger.clone(), run, now)))
                .collect();
            for t in tasks {
                t.await.expect("task");
            }
        }
        let t = Instant::now();
        let report = pass(&ledger, &retention, clock.now(), Mode::Now, None, &|_| {})
            .await
            .expect("gc");
        gc_secs += t.elapsed().as_secs_f64();
        deleted += report.runs_deleted;
        let executed = (b + 1) * BATCH;
        if checkpoints.contains(&executed) {
            let list = list_p99(&ledger, 200).await;
            let floor = floor_p50(&ledger, &format!("run_{:07}", executed - 1), 200).await;
            #[allow(clippy::cast_precision_loss)]
            let mib = size(url).await as f64 / (1024.0 * 1024.0);
            let window = claims_ms.len().min(4_000);
            let mut recent = claims_ms.split_off(claims_ms.len() - window);
            println!(
                "  {executed:>9} {mib:>10.1} {:>8.2}ms {:>8.2}ms {list:>8.2}ms {floor:>8.3}ms {deleted:>9} {gc_secs:>8.1}",
                percentile(&mut recent, 0.5),
                percentile(&mut recent, 0.99),
            );
            claims_ms.clear();
        }
    }
    println!("  {} runs in {:.0} s", runs, start.elapsed().as_secs_f64());
    ledger.close().await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs = env_or("FLOW_BENCH_RUNS", 1_000_000).max(BATCH * 10) / BATCH * BATCH;
    let only = std::env::var("FLOW_BENCH_ONLY").unwrap_or_default();
    let keep = env_or("FLOW_BENCH_KEEP", 50_000).max(BATCH);
    if only.is_empty() || only == "sqlite" {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}/flow.db", dir.path().display());
        bench("sqlite", &url, runs, keep).await;
    }
    if only.is_empty() || only == "postgres" {
        let admin = std::env::var("FLOW_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let Ok(mut conn) = sqlx::PgConnection::connect(&admin).await else {
            println!("postgres: not reachable at {admin}; skipped");
            return;
        };
        let name = format!(
            "flow_bench_{}",
            ulid::Ulid::generate().to_string().to_lowercase()
        );
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("create database");
        let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
        bench("postgres", &format!("{base}/{name}"), runs, keep).await;
        let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
        let _ = sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await;
    }
}
