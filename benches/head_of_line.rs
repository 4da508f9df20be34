//! Benchmark: a hanging tool beside healthy runs (issue 53, "head of line").
//!
//! `cargo bench --bench head_of_line`. Two `flow daemon` processes of 32 slots each
//! drain `FLOW_BENCH_RUNS` (default 500) one-call `refund` runs against a healthy
//! loopback downstream (5 ms per request), twice in the same minute:
//!
//! 1. alone;
//! 2. while `FLOW_BENCH_HANGING` (default 100) `notify` runs, queued *before* the
//!    refunds, call an SMS tool with `concurrency: 4` whose downstream hangs for
//!    `FLOW_BENCH_HANG` (default 60 s).
//!
//! It prints both refund rates (first refund start to last refund finish, from the
//! ledger's own timestamps) and their ratio — the target is ≥ 80 % — and the most
//! requests the hanging downstream ever had in flight at once (must be ≤ 4). Without
//! flow control the waiting SMS runs would hold all 64 daemon slots and the refunds
//! would wait for the hang. On SQLite and on PostgreSQL (`FLOW_BENCH_ONLY=sqlite` or
//! `postgres` for one half).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::{Behavior, CountingServer};
use flow_ledger::{Clock, Ledger, NewRun, OpenOptions, RunFilter, RunStatus, SystemClock};

/// One POST to `url`, optionally through a limited tool.
fn workflow(name: &str, url: &str, limit: Option<u32>) -> String {
    let limit = limit.map_or(String::new(), |n| format!(", concurrency: {n}"));
    format!(
        r#"name: {name}
inputs:
  i: {{ type: integer, required: true }}
tools:
  post: {{ kind: http, method: POST, url: "{url}/{name}", timeout: 120s{limit} }}
nodes:
  call: {{ tool: post, with: {{ i: "${{{{ inputs.i }}}}" }} }}
"#
    )
}

async fn fill(ledger: &Ledger, name: &str, text: &str, n: usize, tag: &str) {
    for i in 0..n {
        let run = NewRun {
            id: format!("{name}-{tag}-{i:05}"),
            workflow_name: name.into(),
            workflow_text: text.into(),
            inputs: serde_json::json!({ "i": i }),
            priority: 0,
            not_before: None,
            trace_parent: None,
        };
        ledger
            .enqueue(run, SystemClock.now())
            .await
            .expect("enqueue");
    }
}

fn daemon(url: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_flow"))
        .env("FLOW_DATABASE_URL", url)
        .env_remove("RUST_LOG")
        .args(["daemon", "--concurrency", "32", "--poll-interval", "200ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn flow daemon")
}

/// Waits until the `prefix` runs all succeeded; their rate from the first start to the
/// last finish (runs/s).
async fn refund_rate(ledger: &Ledger, prefix: &str, n: usize) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let runs: Vec<_> = ledger
            .list_runs(RunFilter {
                status: Some(RunStatus::Succeeded),
                limit: u32::MAX,
                ..Default::default()
            })
            .await
            .expect("list runs")
            .into_iter()
            .filter(|r| r.id.starts_with(prefix))
            .collect();
        if runs.len() == n {
            let first = runs.iter().filter_map(|r| r.started_at).min();
            let last = runs.iter().filter_map(|r| r.finished_at).max();
            let ms = match (first, last) {
                (Some(a), Some(b)) => (b.0 - a.0).max(1),
                _ => 1,
            };
            return n as f64 * 1000.0 / ms as f64;
        }
        assert!(Instant::now() < deadline, "{prefix} runs did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn measure(url: &str, what: &str) {
    let runs = common::env_usize("FLOW_BENCH_RUNS", 500);
    let hanging = common::env_usize("FLOW_BENCH_HANGING", 100);
    let hang = Duration::from_secs(common::env_usize("FLOW_BENCH_HANG", 60) as u64);
    let pay = CountingServer::start().await.expect("pay server");
    pay.set("*", Behavior::hold(Duration::from_millis(5)));
    let sms = CountingServer::start().await.expect("sms server");
    sms.set("*", Behavior::hold(hang));
    let ledger = Ledger::open(url, OpenOptions::default())
        .await
        .expect("open ledger");
    let refund = workflow("refund", &pay.url(), None);
    let notify = workflow("notify", &sms.url(), Some(4));
    let mut daemons = vec![daemon(url), daemon(url)];

    // Warm-up (connections, caches, the planner's statistics): not measured.
    fill(&ledger, "refund", &refund, runs / 2, "warm").await;
    refund_rate(&ledger, "refund-warm", runs / 2).await;
    // 1. Alone.
    fill(&ledger, "refund", &refund, runs, "alone").await;
    let alone = refund_rate(&ledger, "refund-alone", runs).await;
    // 2. Behind the hanging tool's runs, queued first.
    fill(&ledger, "notify", &notify, hanging, "hang").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    fill(&ledger, "refund", &refund, runs, "beside").await;
    let beside = refund_rate(&ledger, "refund-beside", runs).await;
    let in_flight = sms.max_in_flight();
    println!(
        "{what}: {runs} refunds alone {alone:.0} runs/s; beside {hanging} runs of a tool hanging {hang:?} with concurrency 4: {beside:.0} runs/s = {:.0} % (target >= 80 %); the hanging downstream saw at most {in_flight} requests at once (limit 4)",
        beside / alone * 100.0
    );
    assert!(in_flight <= 4, "the concurrency limit did not hold");
    for d in &mut daemons {
        let _ = d.kill();
        let _ = d.wait();
    }
}

fn main() {
    let rt = common::runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let floor = common::fsync_floor(dir.path());
    println!(
        "machine: fsync floor {floor:?} per durable commit; {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let only = std::env::var("FLOW_BENCH_ONLY").unwrap_or_default();
    if only != "postgres" {
        let url = format!("sqlite://{}", dir.path().join("hol.db").display());
        rt.block_on(measure(&url, "sqlite"));
    }
    if only != "sqlite" {
        rt.block_on(common::on_fresh_pg(|url| async move {
            measure(&url, "postgres").await;
        }));
    }
}
