//! Benchmark: the peers' W3 — many one-node runs end to end through the API — on both
//! backends, beside the same backend's drain rate (issue 30).
//!
//! `cargo bench --bench w3`. For each run count of `FLOW_BENCH_W3` (default `500,10000`)
//! and each backend (SQLite `synchronous=FULL`; PostgreSQL on `FLOW_TEST_PG_HOST`, skipped
//! when unreachable) it prints, beside the machine's floor (an fsync; a commit round trip
//! on PostgreSQL):
//! - **drain**: one `flow daemon --exit-when-idle` executing runs queued beforehand (the
//!   ceiling), first start to last finish;
//! - **end to end, one process**: the runs sent as `POST /api/v1/runs:batch` (500 a
//!   batch, 4 batches in flight) to a `flow daemon --serve`, which executes them: first
//!   submit to last finish, and its ratio to the drain (target ≥ 0.8);
//! - **end to end, serve + daemons**: the same to a separate `flow serve`, with one
//!   daemon on SQLite and two on PostgreSQL (the peers' README: many workers share a
//!   PostgreSQL queue).
//!
//! Restate's figure for the same shape comes from the peers' `restate/run.sh`, run in the
//! same hour (its W3 is 500 invocations, 64 in flight).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flow_ledger::{Clock, Ledger, OpenOptions, SystemClock};
use futures::stream::{self, StreamExt};

/// Runs a batch carries (`runs:batch` takes up to 1,000).
const BATCH: usize = 500;

/// The operator token the API is served with (`flow.toml` beside the databases).
const TOKEN: &str = "bench-operator-token";

/// `[api]` tokens for `--config`: `flow daemon --serve` has no unauthenticated mode.
const CONFIG: &str =
    "[[api.tokens]]\nname = \"bench\"\nrole = \"operator\"\nsecret = \"BENCH_TOKEN\"\n";

fn flow(url: &str, args: &[&str], stderr: Stdio) -> Child {
    let config = std::env::temp_dir().join(format!("flow-bench-w3-{}.toml", std::process::id()));
    std::fs::write(&config, CONFIG).expect("write flow.toml");
    Command::new(env!("CARGO_BIN_EXE_flow"))
        .env("FLOW_DATABASE_URL", url)
        .env("FLOW_SECRET_BENCH_TOKEN", TOKEN)
        .env_remove("RUST_LOG")
        .arg("--config")
        .arg(&config)
        .args(args)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn flow")
}

/// Starts `flow <args>` (a serving command) and returns it with its API's base URL.
fn serving(url: &str, args: &[&str]) -> (Child, String) {
    let mut child = flow(url, args, Stdio::piped());
    let base = common::api_base(&mut child);
    (child, base)
}

async fn open(url: &str) -> Ledger {
    Ledger::open(url, OpenOptions::default())
        .await
        .expect("open ledger")
}

/// Queues `n` runs through the library, 1,000 per commit (not measured).
async fn fill(ledger: &Ledger, n: usize) {
    let ids: Vec<usize> = (0..n).collect();
    for chunk in ids.chunks(1_000) {
        let runs = chunk
            .iter()
            .map(|&i| common::one_node_run("pre", i))
            .collect();
        let now = SystemClock.now();
        ledger.enqueue_batch(runs, None, now).await.expect("fill");
    }
}

fn rate(n: usize, from_ms: i64, to_ms: i64) -> f64 {
    n as f64 * 1000.0 / (to_ms - from_ms).max(1) as f64
}

/// The ceiling: one daemon draining `n` runs queued beforehand.
async fn drain(url: &str, n: usize) -> f64 {
    let ledger = open(url).await;
    fill(&ledger, n).await;
    let args = ["daemon", "--exit-when-idle", "--concurrency", "64"];
    let status = flow(url, &args, Stdio::null()).wait().expect("daemon");
    assert!(status.success());
    let (first, last) = common::wait_succeeded(&ledger, n).await;
    ledger.close().await;
    rate(n, first, last)
}

/// `n` runs through `POST /api/v1/runs:batch` at `base`; the rate from the first submit
/// to the last finish.
async fn submit(ledger: &Ledger, base: &str, n: usize) -> f64 {
    let client = reqwest::Client::new();
    let started = SystemClock.now().0;
    let batches: Vec<usize> = (0..n.div_ceil(BATCH)).collect();
    stream::iter(batches)
        .for_each_concurrent(4, |b| {
            let (client, base) = (client.clone(), base.to_owned());
            async move {
                let range = b * BATCH..((b + 1) * BATCH).min(n);
                common::submit_one_node_batch(&client, &base, Some(TOKEN), range).await;
            }
        })
        .await;
    let (_, last) = common::wait_succeeded(ledger, n).await;
    rate(n, started, last)
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// End to end with the API and the workers in one `flow daemon --serve`.
async fn one_process(url: &str, n: usize) -> f64 {
    let ledger = open(url).await;
    let args = [
        "daemon",
        "--concurrency",
        "64",
        "--poll-interval",
        "50ms",
        "--serve",
        "127.0.0.1:0",
    ];
    let (daemon, base) = serving(url, &args);
    let r = submit(&ledger, &base, n).await;
    stop(daemon);
    ledger.close().await;
    r
}

/// End to end with a `flow serve` and `daemons` separate daemons.
async fn separate(url: &str, n: usize, daemons: usize) -> f64 {
    let ledger = open(url).await;
    let (server, base) = serving(url, &["serve", "--addr", "127.0.0.1:0"]);
    let args = ["daemon", "--concurrency", "64", "--poll-interval", "50ms"];
    let workers: Vec<Child> = (0..daemons)
        .map(|_| flow(url, &args, Stdio::null()))
        .collect();
    let r = submit(&ledger, &base, n).await;
    workers.into_iter().for_each(stop);
    stop(server);
    ledger.close().await;
    r
}

/// One backend at one run count: a fresh database per measurement from `fresh`.
async fn measure(backend: &str, n: usize, daemons: usize, fresh: &mut dyn FnMut() -> String) {
    let d = drain(&fresh(), n).await;
    let one = one_process(&fresh(), n).await;
    let sep = separate(&fresh(), n, daemons).await;
    println!(
        "{backend:<10} {n:>6} runs: drain {d:>6.0} runs/s | daemon --serve {one:>6.0} runs/s ({:.2}× drain) | serve + {daemons} daemon(s) {sep:>6.0} runs/s ({:.2}× drain)",
        one / d,
        sep / d
    );
}

/// Median of 50 one-row commits on PostgreSQL (`INSERT` in autocommit): its floor.
async fn pg_commit_floor(url: &str) -> Duration {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query("CREATE TABLE IF NOT EXISTS floor_probe (x int)")
        .execute(&mut c)
        .await
        .expect("probe table");
    let mut samples = Vec::new();
    for i in 0..50 {
        let t = Instant::now();
        sqlx::query("INSERT INTO floor_probe VALUES ($1)")
            .bind(i)
            .execute(&mut c)
            .await
            .expect("insert");
        samples.push(t.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let rt = common::runtime();
    let counts: Vec<usize> = std::env::var("FLOW_BENCH_W3")
        .unwrap_or_else(|_| "500,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let floor = common::fsync_floor(dir.path());
    println!(
        "machine: fsync floor {floor:?} per durable commit; {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    rt.block_on(async {
        let pg = common::psql("postgres", "SELECT 1");
        if pg {
            let _ = common::psql("postgres", "DROP DATABASE IF EXISTS flow_bench_w3_floor");
            common::psql("postgres", "CREATE DATABASE flow_bench_w3_floor");
            let f = pg_commit_floor(&common::pg_url("flow_bench_w3_floor")).await;
            let _ = common::psql("postgres", "DROP DATABASE IF EXISTS flow_bench_w3_floor");
            println!("PostgreSQL: a one-row commit round trip {f:?} (median of 50)");
        }
        let mut k = 0;
        for &n in &counts {
            let mut sqlite = || {
                k += 1;
                format!(
                    "sqlite://{}",
                    dir.path().join(format!("w3-{k}.db")).display()
                )
            };
            measure("SQLite", n, 1, &mut sqlite).await;
            if !pg {
                println!("PostgreSQL: not reachable, skipped");
                continue;
            }
            let mut postgres = || {
                k += 1;
                let name = format!("flow_bench_w3_{k}");
                let _ = common::psql("postgres", &format!("DROP DATABASE IF EXISTS {name}"));
                assert!(common::psql("postgres", &format!("CREATE DATABASE {name}")));
                common::pg_url(&name)
            };
            measure("PostgreSQL", n, 2, &mut postgres).await;
        }
    });
}
