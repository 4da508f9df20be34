//! Benchmark: the executor on a 1,000-node chain and a 1,000-way fan-out of pure
//! function nodes, on SQLite (`synchronous=FULL`), beside this machine's two-fsync floor
//! measured in the same run, and the fan-out's peak RSS (in a fresh process).
//!
//! `cargo bench --bench executor`. Targets (issue 5): chain ≤ 1.0× the floor per node;
//! fan-out < 50 MB peak RSS. Set `FLOW_BENCH_PG=postgres://…/db` to add PostgreSQL.

mod common;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flow::executor::Executor;
use flow::executor::progress::Silent;
use flow::fault::Faults;
use flow::gateway::{Gateway, Tools};
use flow::secrets::Secrets;
use flow::workflow::parse_str;
use flow_ledger::{Clock, Ledger, NewRun, OpenOptions, SystemClock, WorkerId};
use rand::SeedableRng;

fn fan_out(n: usize) -> String {
    let mut t = String::from(
        "name: fanout\nmax_parallel: 64\ntools:\n  e: { kind: function, function: core.echo }\nnodes:\n  root: { tool: e }\n",
    );
    for i in 0..n {
        t.push_str(&format!(
            "  b{i}: {{ tool: e, needs: [root], with: {{ i: {i} }} }}\n"
        ));
    }
    let needs: Vec<String> = (0..n).map(|i| format!("b{i}")).collect();
    t.push_str(&format!(
        "  join: {{ tool: e, needs: [{}] }}\n",
        needs.join(", ")
    ));
    t
}

/// Median of `write + fsync` done twice (a durable call needs at least two commits).
fn two_fsync_floor(dir: &Path) -> Duration {
    let path = dir.join("fsync-probe");
    let mut f = std::fs::File::create(&path).expect("probe file");
    let mut samples = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        for _ in 0..2 {
            f.write_all(&[0u8; 512]).expect("write");
            f.sync_all().expect("fsync");
        }
        samples.push(t.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

async fn run_once(url: &str, text: &str) -> Duration {
    let ledger = Ledger::open(url, OpenOptions::default())
        .await
        .expect("ledger");
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let tools = Tools::new().expect("tools");
    let gateway = Gateway::new(
        ledger.clone(),
        clock.clone(),
        tools,
        Secrets::default(),
        flow::gateway::Guards::default(),
        None,
        Faults::default(),
    );
    let executor = Executor::new(
        gateway,
        Arc::new(Silent),
        rand::rngs::StdRng::seed_from_u64(1),
    );
    let wf = parse_str(text, "bench.yaml").expect("valid workflow");
    let id = format!("run_{}", ulid::Ulid::generate());
    let run = NewRun {
        id: id.clone(),
        workflow_name: wf.name.clone(),
        workflow_text: text.to_string(),
        inputs: serde_json::json!({}),
        priority: 0,
        not_before: None,
        trace_parent: None,
    };
    ledger.enqueue(run, clock.now()).await.expect("enqueue");
    let lease = ledger
        .claim_run(
            &id,
            &WorkerId::current(),
            flow::lease::length(),
            clock.now(),
        )
        .await
        .expect("claim");
    let started = Instant::now();
    let outcome = executor
        .execute(lease, &wf, &serde_json::json!({}))
        .await
        .expect("execute");
    let took = started.elapsed();
    assert_eq!(outcome.status, flow_ledger::RunStatus::Succeeded);
    ledger.close().await;
    took
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let rt = common::runtime();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--fanout-child") {
        let url = &args[2];
        let took = rt.block_on(run_once(url, &fan_out(1000)));
        println!("{} {}", took.as_micros(), peak_rss_kib());
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let floor = two_fsync_floor(dir.path());
    println!("machine: two-fsync floor (median of 200, same directory): {floor:?}");

    let mut per_node = Vec::new();
    for i in 0..3 {
        let url = format!(
            "sqlite://{}",
            dir.path().join(format!("chain{i}.db")).display()
        );
        let took = rt.block_on(run_once(&url, &common::chain(1000)));
        per_node.push(took / 1000);
    }
    per_node.sort();
    let median = per_node[1];
    println!(
        "sqlite FULL: 1,000-node chain: median {median:?} per node over 3 runs = {:.2}x the two-fsync floor (target <= 1.0x)",
        median.as_secs_f64() / floor.as_secs_f64()
    );

    let url = format!("sqlite://{}", dir.path().join("fanout.db").display());
    let exe = std::env::current_exe().expect("current exe");
    let out = std::process::Command::new(exe)
        .args(["--fanout-child", &url])
        .output()
        .expect("fan-out child");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text
        .split_whitespace()
        .map(|v| v.parse::<u64>().unwrap_or(0));
    let (micros, rss) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    println!(
        "sqlite FULL: 1,000-way fan-out: {:?} total, {:?} per node, peak RSS {:.1} MB (target < 50 MB)",
        Duration::from_micros(micros),
        Duration::from_micros(micros / 1002),
        rss as f64 / 1024.0
    );

    if let Ok(pg) = std::env::var("FLOW_BENCH_PG") {
        let took = rt.block_on(run_once(&pg, &common::chain(1000)));
        println!("postgres: 1,000-node chain: {:?} per node", took / 1000);
    }
}
