//! What the benchmark programs share: the machine's fsync floor they print beside their
//! figures, their runtime, `FLOW_BENCH_*` knobs, the PostgreSQL server they use and the
//! chain workflow. (A folder with `mod.rs`, so Cargo does not take it for a benchmark of
//! its own.)

// Each program includes this module and uses part of it.
#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The multi-threaded tokio runtime every program drives its work on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A `FLOW_BENCH_*` knob: the variable's number, or `default` when unset or not one.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The PostgreSQL server the programs use (`FLOW_TEST_PG_HOST`/`_PORT`, as the tests).
pub fn pg_host_port() -> (String, String) {
    let host = std::env::var("FLOW_TEST_PG_HOST").unwrap_or_else(|_| "127.0.0.1".into());
    let port = std::env::var("FLOW_TEST_PG_PORT").unwrap_or_else(|_| "5432".into());
    (host, port)
}

/// The URL of database `name` on that server.
pub fn pg_url(name: &str) -> String {
    let (host, port) = pg_host_port();
    format!("postgres://postgres@{host}:{port}/{name}")
}

/// Runs `sql` in database `db` with `psql`; whether it succeeded.
pub fn psql(db: &str, sql: &str) -> bool {
    let (host, port) = pg_host_port();
    Command::new("psql")
        .args([
            "-h", &host, "-p", &port, "-U", "postgres", "-d", db, "-qc", sql,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `n` pure nodes, each needing the previous one, one at a time.
pub fn chain(n: usize) -> String {
    let mut t = String::from(
        "name: chain\nmax_parallel: 1\ntools:\n  e: { kind: function, function: core.echo }\nnodes:\n",
    );
    t.push_str("  n0: { tool: e, with: { i: 0 } }\n");
    for i in 1..n {
        t.push_str(&format!(
            "  n{i}: {{ tool: e, needs: [n{}], with: {{ i: {i} }} }}\n",
            i - 1
        ));
    }
    t
}

/// Median of one `write + fsync` of 512 bytes, 200 samples, in `dir`: the least one
/// durable commit can cost here.
pub fn fsync_floor(dir: &Path) -> Duration {
    let path = dir.join("fsync-probe");
    let mut f = std::fs::File::create(&path).expect("probe file");
    let mut samples: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            f.write_all(&[0u8; 512]).expect("write");
            f.sync_all().expect("fsync");
            t.elapsed()
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}
