//! Benchmark: the API and the console over a large ledger, through a real `flow serve`
//! (issue 24's "100,000 runs: the list with an input filter p99 < 50 ms, the in-doubt
//! table with 1,000 calls renders < 200 ms (server time), both backends").
//!
//! `cargo bench --bench at_scale`. On SQLite and on a fresh PostgreSQL database (created
//! and dropped here): `FLOW_BENCH_RUNS` (100,000) runs put in through the ledger's
//! `enqueue_batch` (not measured), each with a scalar `order_id` (half numbers, half
//! strings, 1% sharing 50 values) and a `customer`; `FLOW_BENCH_IN_DOUBT` (1,000) of
//! them then claimed, their one call sent and timed out (`claim_call`, `mark_outbound`,
//! `mark_in_doubt`, `pause_run`: what a worker writes), so they wait in the inbox. Then
//! a release `flow serve --insecure-no-auth` on loopback answers, one request at a time,
//! each timed from send to the last byte of the body (`FLOW_BENCH_QUERIES`, 200, per
//! figure; 50 for the in-doubt pages):
//! - the floor: `GET /ui/console.css` (no database) and `GET /api/v1/runs/{id}`;
//! - `GET /api/v1/runs?input.order_id=<a run's>&limit=50` (target p99 < 50 ms), the
//!   same with a shared value (~20 runs), and the console's `/ui/runs?input=order_id=…`
//!   (it also counts by status) and its unfiltered first page `/ui/runs`;
//! - `GET /api/v1/in-doubt` (all 1,000 calls) and the console's worklist `/ui/in-doubt`
//!   (its first 200 rows), target < 200 ms.
//!
//! `FLOW_BENCH_ONLY` (`sqlite` or `postgres`) runs one backend; `FLOW_TEST_POSTGRES_URL`
//! is the admin URL (default `postgres://postgres@127.0.0.1:5432/test`).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flow_ledger::{
    Ledger, NewRun, NewStep, OpenOptions, SqliteSynchronous, StepStatus, Timestamp, WorkerId,
};
use futures::stream::{self, StreamExt, TryStreamExt};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};

/// The runs' workflow: one HTTP call, as the runs put in doubt would have.
const PAY: &str = "name: pay\ninputs:\n  order_id: { type: string }\ntools:\n  pay: { kind: http, method: POST, url: \"http://127.0.0.1:9/pay\" }\nnodes:\n  charge: { tool: pay, with: { order: \"${{ inputs.order_id }}\" } }\n";

const BATCH: usize = 1_000;
const LEASE: Duration = Duration::from_secs(3_600);

fn run_id(i: usize) -> String {
    format!("run_{i:07}")
}

/// Run `i`'s `order_id`: 1% share one of 50 values, the rest are unique (even: a number,
/// odd: the same digits as a string; both are found by their text).
fn order_id(i: usize) -> Value {
    if i.is_multiple_of(100) {
        json!(format!("shared-{}", (i / 100) % 50))
    } else if i.is_multiple_of(2) {
        json!(i)
    } else {
        json!(i.to_string())
    }
}

fn order_text(i: usize) -> String {
    match order_id(i) {
        Value::String(s) => s,
        other => other.to_string(),
    }
}

fn new_run(i: usize) -> NewRun {
    NewRun {
        id: run_id(i),
        workflow_name: "pay".into(),
        workflow_text: PAY.into(),
        inputs: json!({"order_id": order_id(i), "customer": format!("cust_{}", i % 500)}),
        priority: 0,
        not_before: None,
        trace_parent: None,
    }
}

fn now() -> Timestamp {
    flow_ledger::Clock::now(&flow_ledger::SystemClock)
}

/// Enqueues `runs` runs, 1,000 a commit; on PostgreSQL refreshing the planner
/// statistics every 10 batches as a daemon does (else the enqueue's own lookups scan).
async fn load(ledger: &Ledger, runs: usize) -> f64 {
    let t = Instant::now();
    for batch in 0..runs.div_ceil(BATCH) {
        if batch % 10 == 1 {
            ledger
                .refresh_planner_statistics()
                .await
                .expect("statistics");
        }
        let first = batch * BATCH;
        let new = (first..(first + BATCH).min(runs)).map(new_run).collect();
        ledger
            .enqueue_batch(new, None, now())
            .await
            .expect("enqueue batch");
    }
    t.elapsed().as_secs_f64()
}

/// Claims run `i`, sends its `charge` call and loses the answer (a timeout): the call
/// is in doubt and the run paused, as a worker leaves them.
async fn put_in_doubt(ledger: &Ledger, i: usize) -> Result<(), flow_ledger::Error> {
    let worker = WorkerId::new("bench-host", 1, "1");
    let id = run_id(i);
    let run = ledger.claim_run(&id, &worker, LEASE, now()).await?;
    let step = NewStep {
        step_id: "charge".into(),
        node_id: "charge".into(),
        retry: 0,
        not_before: None,
        status: StepStatus::Running,
    };
    ledger.create_step(&run, step, now()).await?;
    let request = json!({"method": "POST", "url": "http://127.0.0.1:9/pay", "body": {"order": order_text(i)}});
    common::send_and_lose(ledger, &run, request).await?;
    ledger.pause_run(&run, "charge in doubt", now()).await
}

/// `count` calls in doubt, spread over the runs (8 at a time).
async fn doubts(ledger: &Ledger, runs: usize, count: usize) -> f64 {
    let t = Instant::now();
    let step = (runs / count.max(1)).max(1);
    stream::iter((0..count.min(runs)).map(|k| k * step + 1))
        .map(|i| put_in_doubt(ledger, i))
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await
        .expect("put in doubt");
    t.elapsed().as_secs_f64()
}

/// `flow serve --insecure-no-auth` on a free loopback port over `url`; its base URL.
fn serve(url: &str) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flow"))
        .env("FLOW_DATABASE_URL", url)
        .env_remove("RUST_LOG")
        .args(["serve", "--insecure-no-auth", "--addr", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn flow serve");
    let base = common::api_base(&mut child);
    (child, base)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// Times `calls` GETs of `path(i)` (send to the last byte), checks each answered 200
/// and `check` accepts the body; prints a row with p50, p99 and the mean body size.
async fn time<P, C>(
    client: &reqwest::Client,
    base: &str,
    name: &str,
    calls: usize,
    path: P,
    check: C,
) where
    P: Fn(usize) -> String,
    C: Fn(&str) -> bool,
{
    let (mut ms, mut bytes) = (Vec::with_capacity(calls), 0usize);
    for i in 0..calls {
        let url = format!("{base}{}", path(i));
        let t = Instant::now();
        let resp = client.get(&url).send().await.expect("request");
        let status = resp.status();
        let body = resp.text().await.expect("body");
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(status.is_success(), "{url}: {status}: {body}");
        assert!(
            check(&body),
            "{url}: unexpected answer: {}",
            &body[..body.len().min(500)]
        );
        bytes += body.len();
    }
    let (p50, p99) = (percentile(&mut ms, 0.5), percentile(&mut ms, 0.99));
    let kb = bytes as f64 / calls as f64 / 1024.0;
    println!("  {name:<58} {calls:>5} {p50:>8.2} {p99:>8.2} {kb:>9.1}");
}

/// How many `calls` an API listing holds.
fn calls_in(body: &str) -> usize {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["calls"].as_array().map(Vec::len))
        .unwrap_or(0)
}

/// How many runs an API listing holds.
fn runs_in(body: &str) -> usize {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["runs"].as_array().map(Vec::len))
        .unwrap_or(0)
}

/// Every figure against one server over a loaded ledger.
async fn measure(base: &str, runs: usize, in_doubt: usize, calls: usize) {
    let client = reqwest::Client::new();
    let mut rng = StdRng::seed_from_u64(24);
    let picks: Vec<usize> = (0..calls).map(|_| rng.random_range(0..runs)).collect();
    // One unique order_id per pick (a shared one is a figure of its own).
    let unique: Vec<usize> = picks
        .iter()
        .map(|&i| if i % 100 == 0 { i + 1 } else { i })
        .collect();
    let unique: Vec<usize> = unique.into_iter().map(|i| i.min(runs - 1)).collect();
    println!(
        "  {:<58} {:>5} {:>8} {:>8} {:>9}",
        "GET", "calls", "p50 ms", "p99 ms", "KiB/call"
    );
    let head = |b: &str| b.contains("body");
    time(
        &client,
        base,
        "floor: /ui/console.css (no database)",
        calls,
        |_| "/ui/console.css".into(),
        head,
    )
    .await;
    time(
        &client,
        base,
        "floor: /api/v1/runs/{id} (one run, by key)",
        calls,
        |i| format!("/api/v1/runs/{}", run_id(picks[i])),
        |b| b.contains("\"run\""),
    )
    .await;
    let one = |b: &str| runs_in(b) == 1;
    time(
        &client,
        base,
        "/api/v1/runs?input.order_id=<a run's>&limit=50",
        calls,
        |i| {
            format!(
                "/api/v1/runs?input.order_id={}&limit=50",
                order_text(unique[i])
            )
        },
        one,
    )
    .await;
    let some = |b: &str| runs_in(b) >= 1;
    let shared = |i: usize| format!("shared-{}", picks[i] % 50.min(runs.div_ceil(100)));
    time(
        &client,
        base,
        "/api/v1/runs?input.order_id=shared-N&limit=50 (~20 runs)",
        calls,
        |i| format!("/api/v1/runs?input.order_id={}&limit=50", shared(i)),
        some,
    )
    .await;
    time(
        &client,
        base,
        "/api/v1/runs?input.customer=<one of 500>&limit=50&counts=true",
        calls,
        |i| {
            format!(
                "/api/v1/runs?input.customer=cust_{}&limit=50&counts=true",
                picks[i] % 500
            )
        },
        some,
    )
    .await;
    let page = |b: &str| b.contains("<table");
    time(
        &client,
        base,
        "console /ui/runs?input=order_id=<a run's> (+ counts)",
        calls,
        |i| format!("/ui/runs?input=order_id%3D{}", order_text(unique[i])),
        page,
    )
    .await;
    time(
        &client,
        base,
        "console /ui/runs (first page, counts of all runs)",
        calls.min(50),
        |_| "/ui/runs".into(),
        page,
    )
    .await;
    let all = move |b: &str| calls_in(b) == in_doubt.min(1_000);
    time(
        &client,
        base,
        &format!("/api/v1/in-doubt ({in_doubt} calls in doubt)"),
        calls.min(50),
        |_| "/api/v1/in-doubt".into(),
        all,
    )
    .await;
    let rows = |b: &str| b.matches("name=\"call\"").count() >= in_doubt.min(200);
    time(
        &client,
        base,
        "console /ui/in-doubt (worklist, first 200 rows)",
        calls.min(50),
        |_| "/ui/in-doubt".into(),
        rows,
    )
    .await;
}

/// Loads a ledger at `url`, serves it and measures.
async fn bench(label: &str, url: &str, runs: usize, in_doubt: usize, calls: usize) {
    let opts = OpenOptions {
        sqlite_synchronous: SqliteSynchronous::Normal,
        ..OpenOptions::default()
    };
    let ledger = Ledger::open(url, opts).await.expect("open ledger");
    let loaded = load(&ledger, runs).await;
    let doubted = doubts(&ledger, runs, in_doubt).await;
    if !url.starts_with("sqlite:") {
        settle_statistics(&ledger).await;
    }
    println!(
        "\n{label}: {runs} runs loaded in {loaded:.1} s, {in_doubt} calls put in doubt in {doubted:.1} s"
    );
    let (mut server, base) = serve(url);
    measure(&base, runs, in_doubt, calls).await;
    let _ = server.kill();
    let _ = server.wait();
    ledger.close().await;
}

/// What a daemon does every 5 s: ANALYZE the tables whose statistics are stale, asked
/// until `runs` and `run_inputs` were (the activity counters lag commits; at most 20 s).
async fn settle_statistics(ledger: &Ledger) {
    let started = Instant::now();
    let mut analyzed: Vec<String> = Vec::new();
    while started.elapsed() < Duration::from_secs(20) {
        analyzed.extend(
            ledger
                .refresh_planner_statistics()
                .await
                .expect("statistics"),
        );
        if ["runs", "run_inputs"]
            .iter()
            .all(|t| analyzed.iter().any(|a| a == t))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn main() {
    let runs = common::env_usize("FLOW_BENCH_RUNS", 100_000).max(1);
    let in_doubt = common::env_usize("FLOW_BENCH_IN_DOUBT", 1_000).min(runs);
    let calls = common::env_usize("FLOW_BENCH_QUERIES", 200).max(1);
    let only = std::env::var("FLOW_BENCH_ONLY").unwrap_or_default();
    let dir = tempfile::tempdir().expect("tempdir");
    let floor = common::fsync_floor(dir.path());
    println!(
        "at_scale: {runs} runs, {in_doubt} calls in doubt, {calls} requests per figure (fewer where marked)\nmachine: fsync floor {floor:?} per durable commit; {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    common::runtime().block_on(async {
        if only != "postgres" {
            let url = format!("sqlite://{}", dir.path().join("flow.db").display());
            bench("sqlite", &url, runs, in_doubt, calls).await;
        }
        if only != "sqlite" {
            common::on_fresh_pg(move |url| async move {
                bench("postgres", &url, runs, in_doubt, calls).await;
            })
            .await;
        }
    });
}
