//! Benchmark: runs waiting on callbacks, completed by a burst of callback POSTs.
//!
//! `cargo bench --bench callbacks` (`FLOW_BENCH_RUNS`, default 1,000; `FLOW_BENCH_ONLY`
//! = `sqlite` | `postgres`). For each backend: a real `flow serve` (its URL is
//! `[api] public_url`) and one `flow daemon`; `FLOW_BENCH_RUNS` runs of a one-node
//! workflow whose node POSTs its callback URL to a loopback warehouse (which answers
//! 200 at once) and then waits. Once every run is paused waiting, 8 clients POST the
//! callbacks (`{ok: true, output}`), one per run. Prints, beside the machine's floor
//! (fsync; a commit round trip on PostgreSQL):
//! - completion throughput: runs / (last run finished − first callback sent);
//! - p50 / p99 from a run's callback sent to that run finished (the ledger's
//!   `finished_at`, same clock).

mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::CountingServer;
use flow_ledger::{Clock, Ledger, OpenOptions, RunStatus, SystemClock};
use futures::stream::{self, StreamExt};
use serde_json::json;

fn workflow(warehouse: &str) -> String {
    format!(
        "name: cb\ninputs:\n  i: {{ type: integer, required: true }}\ntools:\n  w: {{ kind: http, method: POST, url: \"{warehouse}/orders\", timeout: 10s }}\nnodes:\n  fulfil:\n    tool: w\n    with: {{ i: \"${{{{ inputs.i }}}}\", notify_url: \"${{{{ callback.url }}}}\" }}\n    callback: {{ timeout: 1h }}\n"
    )
}

fn flow(url: &str, config: &std::path::Path, args: &[&str], stderr: Stdio) -> Child {
    Command::new(env!("CARGO_BIN_EXE_flow"))
        .env("FLOW_DATABASE_URL", url)
        .env("FLOW_CONFIG", config)
        .env_remove("RUST_LOG")
        .args(args)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn flow")
}

/// `flow serve --insecure-no-auth` on `addr`, once it listens.
fn serve(url: &str, config: &std::path::Path, addr: &str) -> Child {
    use std::io::{BufRead, BufReader};
    let args = ["serve", "--insecure-no-auth", "--addr", addr];
    let mut child = flow(url, config, &args, Stdio::piped());
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    loop {
        let line = lines
            .next()
            .expect("flow serve exited")
            .expect("stderr line");
        if line.contains("listening on ") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    child
}

async fn count(ledger: &Ledger, status: RunStatus) -> usize {
    let counts = ledger.count_runs_by_status().await.expect("count");
    counts
        .iter()
        .find(|(s, _)| *s == status)
        .map_or(0, |(_, c)| usize::try_from(*c).unwrap_or(0))
}

async fn bench(name: &str, url: &str, runs: usize, dir: &std::path::Path) {
    let ledger = Ledger::open(url, OpenOptions::default())
        .await
        .expect("open");
    let floor = floor(name, &ledger, dir).await;
    let warehouse = CountingServer::start().await.expect("warehouse");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, format!("[api]\npublic_url = \"http://{port}\"\n")).expect("config");
    let mut server = serve(url, &config, &port.to_string());
    let base = format!("http://{port}");
    let args = ["daemon", "--concurrency", "64", "--poll-interval", "50ms"];
    let mut daemon = flow(url, &config, &args, Stdio::null());
    let client = reqwest::Client::new();
    let text = workflow(&warehouse.url());
    let batches: Vec<usize> = (0..runs.div_ceil(100)).collect();
    for b in batches {
        let list: Vec<_> = (b * 100..((b + 1) * 100).min(runs))
            .map(|i| json!({"workflow": text, "inputs": {"i": i}, "run_id": format!("cb-{i:06}")}))
            .collect();
        let resp = client
            .post(format!("{base}/api/v1/runs:batch"))
            .json(&json!({ "runs": list }))
            .send()
            .await
            .expect("submit");
        assert!(
            resp.status().is_success(),
            "{}",
            resp.text().await.unwrap_or_default()
        );
    }
    let waiting = Instant::now();
    while count(&ledger, RunStatus::Paused).await < runs {
        assert!(
            waiting.elapsed() < Duration::from_secs(600),
            "runs never all waited"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let urls: Vec<(String, String)> = warehouse
        .log()
        .iter()
        .map(|r| {
            let i = r.body["i"].as_i64().expect("i");
            (
                format!("cb-{i:06}"),
                r.body["notify_url"].as_str().expect("url").to_owned(),
            )
        })
        .collect();
    assert_eq!(urls.len(), runs, "one call per run");
    let first_ms = SystemClock.now().0;
    let sent: Vec<(String, i64)> = stream::iter(urls)
        .map(|(run, u)| {
            let client = client.clone();
            async move {
                let at = SystemClock.now().0;
                let resp = client
                    .post(u)
                    .json(&json!({"ok": true, "output": {"shipped": true}}))
                    .send()
                    .await
                    .expect("callback");
                assert!(resp.status().is_success(), "callback: {}", resp.status());
                (run, at)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    while count(&ledger, RunStatus::Succeeded).await < runs {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let done = ledger
        .list_runs(flow_ledger::RunFilter {
            status: Some(RunStatus::Succeeded),
            limit: u32::MAX,
            ..Default::default()
        })
        .await
        .expect("list");
    let finished: HashMap<String, i64> = done
        .iter()
        .filter_map(|r| r.finished_at.map(|t| (r.id.clone(), t.0)))
        .collect();
    let last = finished.values().copied().max().unwrap_or(first_ms);
    let mut lat: Vec<i64> = sent
        .iter()
        .filter_map(|(run, at)| finished.get(run).map(|f| f - at))
        .collect();
    lat.sort_unstable();
    let pct = |p: usize| lat[(lat.len() * p / 100).min(lat.len() - 1)];
    println!(
        "{name}: {runs} runs waiting on callbacks, completed by {runs} POSTs from 8 clients: {:.0} runs/s (first callback sent to last run finished); callback sent → run finished p50 {} ms, p99 {} ms; floor {floor:?}",
        runs as f64 * 1000.0 / (last - first_ms).max(1) as f64,
        pct(50),
        pct(99)
    );
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = server.kill();
    let _ = server.wait();
    ledger.close().await;
}

/// The backend's floor: fsync of a file for SQLite, a commit round trip for PostgreSQL.
async fn floor(name: &str, ledger: &Ledger, dir: &std::path::Path) -> Duration {
    if name == "sqlite" {
        return common::fsync_floor(dir);
    }
    let mut samples: Vec<Duration> = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let _ = ledger.count_runs_by_status().await;
        samples.push(t.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let runs = common::env_usize("FLOW_BENCH_RUNS", 1_000).max(1);
    let only = std::env::var("FLOW_BENCH_ONLY").unwrap_or_default();
    let dir = tempfile::tempdir().expect("tempdir");
    println!(
        "callbacks: {runs} runs; {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    common::runtime().block_on(async {
        if only != "postgres" {
            let url = format!("sqlite://{}", dir.path().join("cb.db").display());
            bench("sqlite", &url, runs, dir.path()).await;
        }
        if only != "sqlite" {
            let db = format!("flow_bench_cb_{}", std::process::id());
            if common::psql("postgres", &format!("CREATE DATABASE {db}")) {
                bench("postgres", &common::pg_url(&db), runs, dir.path()).await;
                common::psql(
                    "postgres",
                    &format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
                );
            } else {
                println!("postgres: SKIPPED (psql could not create a database)");
            }
        }
    });
}
