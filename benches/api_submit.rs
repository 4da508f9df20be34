//! Benchmark: runs submitted through the operator API while a daemon drains them, and
//! listing pages of a large ledger.
//!
//! `cargo bench --bench api_submit`. Prints, beside this machine's fsync floor:
//! 1. the drain rate of one `flow daemon` on SQLite (`synchronous=FULL`) of runs
//!    enqueued beforehand (the ceiling);
//! 2. end to end: `FLOW_BENCH_RUNS` (10,000) one-node runs submitted through
//!    `POST /api/v1/runs:batch` (batches of 100, 4 in flight) to a real `flow serve`
//!    while one daemon drains them: runs/s from the first submit to the last success
//!    (target ≥ 70% of 1. and ≥ 1,000 runs/s);
//! 3. `GET /api/v1/runs?limit=100` page latency p50/p99 over `FLOW_BENCH_LIST_RUNS`
//!    (100,000) runs, following `next_cursor` (target p99 < 50 ms).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Instant;

use flow_ledger::{Ledger, OpenOptions, SqliteSynchronous, SystemClock};
use futures::stream::{self, StreamExt};

fn flow(url: &str, args: &[&str], stderr: Stdio) -> Child {
    Command::new(env!("CARGO_BIN_EXE_flow"))
        .env("FLOW_DATABASE_URL", url)
        .env_remove("RUST_LOG")
        .args(args)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn flow")
}

/// `flow serve --insecure-no-auth` on a free loopback port; its base URL.
fn serve(url: &str) -> (Child, String) {
    let args = ["serve", "--insecure-no-auth", "--addr", "127.0.0.1:0"];
    let mut child = flow(url, &args, Stdio::piped());
    let base = common::api_base(&mut child);
    (child, base)
}

async fn open(url: &str) -> Ledger {
    let opts = OpenOptions {
        sqlite_synchronous: SqliteSynchronous::Normal,
        ..OpenOptions::default()
    };
    Ledger::open(url, opts).await.expect("open ledger")
}

/// Enqueues `n` runs through the library, 1,000 per commit (not measured).
async fn fill(ledger: &Ledger, prefix: &str, n: usize) {
    let ids: Vec<usize> = (0..n).collect();
    for chunk in ids.chunks(1_000) {
        let runs = chunk
            .iter()
            .map(|&i| common::one_node_run(prefix, i))
            .collect();
        let now = flow_ledger::Clock::now(&SystemClock);
        ledger.enqueue_batch(runs, None, now).await.expect("fill");
    }
}

fn main() {
    let rt = common::runtime();
    let runs = common::env_usize("FLOW_BENCH_RUNS", 10_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let floor = common::fsync_floor(dir.path());
    println!(
        "machine: fsync floor {floor:?} per durable commit; {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    rt.block_on(async {
        // 1. The ceiling: a daemon draining runs that are already queued.
        let url = format!("sqlite://{}", dir.path().join("drain.db").display());
        let ledger = open(&url).await;
        fill(&ledger, "pre", runs).await;
        let status = flow(&url, &["daemon", "--exit-when-idle", "--concurrency", "64"], Stdio::null())
            .wait()
            .expect("daemon");
        assert!(status.success());
        // First start to last finish, from the ledger (the process start-up is not
        // the drain), as the end-to-end figure below is taken.
        let (first, last) = common::wait_succeeded(&ledger, runs).await;
        let drain = runs as f64 * 1000.0 / (last - first).max(1) as f64;
        println!("drain of {runs} pre-submitted runs, 1 daemon, SQLite FULL: {drain:.0} runs/s (first start to last finish)");
        ledger.close().await;

        // 2. End to end through the API.
        let url = format!("sqlite://{}", dir.path().join("api.db").display());
        let ledger = open(&url).await;
        let (mut server, base) = serve(&url);
        let mut daemon = flow(&url, &["daemon", "--concurrency", "64", "--poll-interval", "50ms"], Stdio::null());
        let client = reqwest::Client::new();
        let started = Instant::now();
        let first_ms = flow_ledger::Clock::now(&SystemClock).0;
        let batches: Vec<usize> = (0..runs.div_ceil(100)).collect();
        stream::iter(batches)
            .for_each_concurrent(4, |b| {
                let client = client.clone();
                let base = base.clone();
                async move {
                    let range = b * 100..((b + 1) * 100).min(runs);
                    common::submit_one_node_batch(&client, &base, None, range).await;
                }
            })
            .await;
        let submitted = started.elapsed();
        let (_, last_ms) = common::wait_succeeded(&ledger, runs).await;
        let e2e = runs as f64 * 1000.0 / (last_ms - first_ms).max(1) as f64;
        println!(
            "end to end, {runs} runs via runs:batch (100 a batch, 4 in flight) while 1 daemon drains: {e2e:.0} runs/s ({:.0}% of the drain rate); submitting alone took {submitted:?} ({:.0} runs/s)",
            100.0 * e2e / drain,
            runs as f64 / submitted.as_secs_f64()
        );
        let _ = daemon.kill();
        let _ = daemon.wait();
        let _ = server.kill();
        let _ = server.wait();
        ledger.close().await;

        // 3. Listing pages of a large ledger.
        let big = common::env_usize("FLOW_BENCH_LIST_RUNS", 100_000);
        let url = format!("sqlite://{}", dir.path().join("list.db").display());
        let ledger = open(&url).await;
        fill(&ledger, "list", big).await;
        let (mut server, base) = serve(&url);
        let mut samples = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..300 {
            let path = match &cursor {
                Some(c) => format!("{base}/api/v1/runs?limit=100&cursor={c}"),
                None => format!("{base}/api/v1/runs?limit=100"),
            };
            let t = Instant::now();
            let page: serde_json::Value = client.get(path).send().await.expect("page").json().await.expect("json");
            samples.push(t.elapsed());
            cursor = page["next_cursor"].as_str().map(str::to_string);
        }
        samples.sort();
        println!(
            "GET /api/v1/runs?limit=100 over {big} runs, 300 pages following next_cursor: p50 {:?}, p99 {:?}",
            samples[samples.len() / 2],
            samples[samples.len() * 99 / 100]
        );
        let _ = server.kill();
        let _ = server.wait();
        ledger.close().await;
    });
}
