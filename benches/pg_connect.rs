//! Benchmark: what a one-shot `flow` command pays to reach PostgreSQL before it does
//! anything, measured on the real release binary, each command its own process.
//!
//! `cargo bench --bench pg_connect`. Prints, beside this machine's fsync floor, medians of
//! `FLOW_BENCH_SAMPLES` (default 20) runs of:
//! 1. `flow runs` (a read) over TLS (`?sslmode=prefer`, what a URL without `sslmode`
//!    gets from a server off this machine; the local server offers TLS) and on the
//!    default URL, which on loopback is plain text — target: TLS within 2× plain;
//! 2. `flow run` of a 200-node chain of pure `core.echo` nodes, on both URLs — target
//!    ≤ 150 ms over TLS.
//!
//! A fresh database on the local server (`FLOW_TEST_PG_HOST`/`FLOW_TEST_PG_PORT`, user
//! `postgres`), migrated once before measuring.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Median wall time of `samples` runs of `flow --db url args…`, each a new process.
fn median(url: &str, args: &[&str], samples: usize) -> Duration {
    let mut times: Vec<Duration> = (0..samples)
        .map(|_| {
            let t = Instant::now();
            let status = Command::new(env!("CARGO_BIN_EXE_flow"))
                .env_remove("RUST_LOG")
                .env_remove("PGSSLMODE")
                .arg("--db")
                .arg(url)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("spawn flow");
            let took = t.elapsed();
            assert!(status.success(), "flow {args:?} on {url}: {status}");
            took
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let samples: usize = std::env::var("FLOW_BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = tempfile::tempdir().expect("tempdir");
    let floor = common::fsync_floor(dir.path());
    println!(
        "machine: fsync floor {floor:?} per durable commit (median of 200 write+fsync, same directory); {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let name = format!(
        "flow_bench_connect_{}",
        ulid::Ulid::generate().to_string().to_lowercase()
    );
    if !common::psql("test", &format!("CREATE DATABASE {name}")) {
        println!("postgres: not reachable (psql -h 127.0.0.1 -U postgres); skipped");
        return;
    }
    let (host, port) = common::pg_host_port();
    let plain = format!("postgres://postgres@{host}:{port}/{name}");
    let tls = format!("{plain}?sslmode=prefer");
    let file = dir.path().join("chain200.yaml");
    std::fs::write(&file, common::chain(200)).expect("write chain");
    let file = file.display().to_string();

    // Migrate (and warm the server's caches) before measuring.
    median(&plain, &["migrate"], 1);
    median(&tls, &["run", &file], 1);

    let runs_tls = median(&tls, &["runs"], samples);
    let runs_plain = median(&plain, &["runs"], samples);
    println!(
        "postgres: `flow runs`, median of {samples}: sslmode=prefer (TLS) {runs_tls:.1?}, default URL (plain on loopback) {runs_plain:.1?} = {:.2}x (target <= 2.0x)",
        runs_tls.as_secs_f64() / runs_plain.as_secs_f64()
    );
    let chain_tls = median(&tls, &["run", &file], samples);
    let chain_plain = median(&plain, &["run", &file], samples);
    println!(
        "postgres: `flow run` of a 200-node chain, median of {samples}: sslmode=prefer (TLS) {chain_tls:.1?} (target <= 150ms), default URL (plain on loopback) {chain_plain:.1?}"
    );
    common::psql(
        "test",
        &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
    );
}
