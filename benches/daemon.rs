//! Benchmark: draining the run queue with real `flow daemon` processes, and how long a
//! submitted run waits before a daemon starts it.
//!
//! `cargo bench --bench daemon`. Prints, beside this machine's fsync floor:
//! 1. 10,000 one-node runs (a pure `core.echo` node) drained by 1 daemon on SQLite
//!    (`synchronous=FULL`) — target ≥ 1,000 runs/s;
//! 2. the same drained by 4 daemons on PostgreSQL (a fresh database on the local
//!    server) — target ≥ 1,500 runs/s;
//! 3. submit-to-start latency p50/p99 on PostgreSQL with LISTEN/NOTIFY and polling only
//!    (`--no-listen`, the default 1 s poll).
//!
//! The runs are enqueued through the library before the daemons start (enqueueing is
//! not what is measured); the daemons are the release `flow` binary, each its own
//! process, as in production. `FLOW_BENCH_RUNS` changes the run count,
//! `FLOW_BENCH_NO_ANALYZE=1` skips the ANALYZE before the PostgreSQL drain (a fresh
//! database meeting a burst), `FLOW_BENCH_LATENCY_SAMPLES` the latency sample count,
//! `FLOW_BENCH_CONCURRENCY` the daemons' `--concurrency` (default 64), `FLOW_BENCH_ONLY`
//! (`sqlite` or `postgres`) runs one half,
//! `FLOW_TEST_PG_HOST`/`FLOW_TEST_PG_PORT` the PostgreSQL server (user `postgres`).

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flow_ledger::{
    Clock, Ledger, NewRun, OpenOptions, RunFilter, RunStatus, SqliteSynchronous, SystemClock,
};
use futures::stream::{self, StreamExt};
use rand::{Rng, SeedableRng};

fn new_run(i: usize) -> NewRun {
    common::one_node_run("bench", i)
}

/// Enqueues `n` runs, 16 at a time.
async fn fill(ledger: &Ledger, n: usize) {
    fill_with(ledger, n, "bench").await;
}

/// Enqueues `n` runs named `{prefix}-NNNNNN`, 16 at a time.
async fn fill_with(ledger: &Ledger, n: usize, prefix: &str) {
    stream::iter(0..n)
        .for_each_concurrent(16, |i| async move {
            let mut run = new_run(i);
            run.id = format!("{prefix}-{i:06}");
            ledger
                .enqueue(run, SystemClock.now())
                .await
                .expect("enqueue");
        })
        .await;
}

fn daemon(url: &str, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_flow"))
        .env("FLOW_DATABASE_URL", url)
        .env_remove("RUST_LOG")
        .arg("daemon")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn flow daemon")
}

/// What one drain measured.
struct Drain {
    wall: Duration,
    /// First run start to last run finish, from the ledger's own timestamps.
    span_ms: i64,
}

/// Starts `daemons` daemons with `--exit-when-idle` on a queue of `runs` runs and waits
/// for all of them to exit; checks that every run succeeded.
async fn drain(url: &str, ledger: &Ledger, daemons: usize, runs: usize) -> Drain {
    let concurrency = common::env_usize("FLOW_BENCH_CONCURRENCY", 64).to_string();
    let started = Instant::now();
    let mut children: Vec<Child> = (0..daemons)
        .map(|_| daemon(url, &["--exit-when-idle", "--concurrency", &concurrency]))
        .collect();
    for c in &mut children {
        let status = c.wait().expect("wait for daemon");
        assert!(status.success(), "a daemon failed: {status}");
    }
    let wall = started.elapsed();
    // Only the measured runs (`bench-…`), not a warm-up's.
    let all: Vec<_> = ledger
        .list_runs(RunFilter {
            status: None,
            limit: u32::MAX,
            ..Default::default()
        })
        .await
        .expect("list runs")
        .into_iter()
        .filter(|r| r.id.starts_with("bench-"))
        .collect();
    let ok = all
        .iter()
        .filter(|r| r.status == RunStatus::Succeeded)
        .count();
    assert_eq!(ok, runs, "every run must succeed");
    let first = all.iter().filter_map(|r| r.started_at).min();
    let last = all.iter().filter_map(|r| r.finished_at).max();
    let span_ms = match (first, last) {
        (Some(a), Some(b)) => b.0 - a.0,
        _ => 0,
    };
    Drain { wall, span_ms }
}

fn report(what: &str, runs: usize, d: &Drain, target: f64) {
    let per_s = runs as f64 / d.wall.as_secs_f64();
    let span_per_s = if d.span_ms > 0 {
        runs as f64 * 1000.0 / d.span_ms as f64
    } else {
        f64::NAN
    };
    println!(
        "{what}: {runs} one-node runs in {:.2?} = {per_s:.0} runs/s (first start to last finish: {span_per_s:.0} runs/s; target >= {target:.0})",
        d.wall
    );
}

/// Submit-to-start latency: `samples` runs submitted one at a time to one idle daemon
/// started with `args`, each after the previous one started and a random 20–1,000 ms
/// pause (so a submit finds the daemon waiting, at a random point of its 1 s poll); p50
/// and p99 of `started_at − submit time` (milliseconds, both from this machine's clock).
async fn latency(url: &str, ledger: &Ledger, args: &[&str], samples: usize) -> (i64, i64) {
    let mut child = daemon(url, args);
    // Let it connect, LISTEN and reach its first poll.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut waits = Vec::with_capacity(samples);
    for i in 0..samples {
        let mut run = new_run(i);
        run.id = format!("lat-{}-{i}", ulid::Ulid::generate());
        let submitted = SystemClock.now();
        ledger
            .enqueue(run.clone(), submitted)
            .await
            .expect("enqueue");
        let started = loop {
            let r = ledger.get_run(&run.id).await.expect("get run");
            if let Some(s) = r.started_at {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        waits.push(started.0 - submitted.0);
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..1000))).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    waits.sort_unstable();
    let pick = |q: f64| waits[((waits.len() - 1) as f64 * q).round() as usize];
    (pick(0.5), pick(0.99))
}

fn main() {
    let rt = common::runtime();
    let runs = common::env_usize("FLOW_BENCH_RUNS", 10_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let floor = common::fsync_floor(dir.path());
    println!(
        "machine: fsync floor {floor:?} per durable commit (median of 200 write+fsync, same directory); {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "  a one-node pure run writes once (step, call, outcome and the run's finish together) besides its share of a batch claim: at one fsync per write that is ~{:.0} runs/s; group commit lets runs share fsyncs",
        1.0 / floor.as_secs_f64()
    );

    let only = std::env::var("FLOW_BENCH_ONLY").unwrap_or_default();
    if only != "postgres" {
        sqlite(&rt, dir.path(), runs);
    }
    if only != "sqlite" {
        postgres(&rt, runs);
    }
}

/// 1. SQLite, one daemon.
fn sqlite(rt: &tokio::runtime::Runtime, dir: &Path, runs: usize) {
    let path = dir.join("queue.db");
    let url = format!("sqlite://{}", path.display());
    rt.block_on(async {
        // Filling is not measured: no fsync per enqueue (the daemon opens with FULL).
        let filler = Ledger::open(
            &url,
            OpenOptions {
                sqlite_synchronous: SqliteSynchronous::Normal,
                ..OpenOptions::default()
            },
        )
        .await
        .expect("open sqlite");
        fill(&filler, runs).await;
        let d = drain(&url, &filler, 1, runs).await;
        report("sqlite FULL, 1 daemon", runs, &d, 1000.0);
        filler.close().await;
    });
}

/// 2 and 3. PostgreSQL: four daemons, then the latency with and without LISTEN/NOTIFY.
fn postgres(rt: &tokio::runtime::Runtime, runs: usize) {
    let name = format!(
        "flow_bench_{}",
        ulid::Ulid::generate().to_string().to_lowercase()
    );
    if !common::psql("test", &format!("CREATE DATABASE {name}")) {
        println!("postgres: not reachable (psql -h 127.0.0.1 -U postgres); skipped");
        return;
    }
    let url = common::pg_url(&name);
    rt.block_on(async {
        let ledger = Ledger::open(&url, OpenOptions::default())
            .await
            .expect("open postgres");
        // A queue that has been in use has planner statistics that describe it
        // (autovacuum); a fresh one has none, or says "empty", which makes every index
        // look free. Measure the steady state: a warm-up drain of 2,000 runs (not
        // measured), ANALYZE, then the measured drain. `FLOW_BENCH_NO_ANALYZE=1` measures
        // a fresh database meeting a burst instead (see ARCHITECTURE.md).
        if std::env::var_os("FLOW_BENCH_NO_ANALYZE").is_none() {
            fill_with(&ledger, 2_000, "warm").await;
            let _ = drain(&url, &ledger, 4, 0).await;
            assert!(common::psql(&name, "ANALYZE"), "ANALYZE failed");
        }
        fill(&ledger, runs).await;
        let d = drain(&url, &ledger, 4, runs).await;
        report("postgres, 4 daemons", runs, &d, 1500.0);
        // `FLOW_BENCH_LATENCY_SAMPLES=0` measures throughput only.
        let samples = common::env_usize("FLOW_BENCH_LATENCY_SAMPLES", 60);
        if samples > 0 {
            let (p50, p99) = latency(&url, &ledger, &[], samples).await;
            println!(
                "postgres: submit-to-start latency with LISTEN/NOTIFY: p50 {p50} ms, p99 {p99} ms ({samples} runs)"
            );
            let (p50, p99) = latency(&url, &ledger, &["--no-listen"], samples).await;
            println!(
                "postgres: submit-to-start latency polling only (--no-listen, 1 s poll): p50 {p50} ms, p99 {p99} ms ({samples} runs)"
            );
        }
        ledger.close().await;
    });
    common::psql(
        "test",
        &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
    );
}
