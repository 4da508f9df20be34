//! Benchmark (issue 29): what traces cost a run, and what a collector that is down or
//! hangs costs it, on the real release binary, each `flow run` its own process.
//!
//! `cargo bench --bench telemetry`. A 200-node chain of pure `core.echo` nodes on SQLite
//! (`FLOW_BENCH_NODES`), `FLOW_BENCH_SAMPLES` (default 25) rounds; each round runs every
//! variant once, in turn, so drift hits all alike:
//! - `off`: no endpoint (no exporting layer at all);
//! - `live`: a collector on loopback answering 200 at once;
//! - `live+pure`: the same with `[telemetry] pure_steps = true` (a span per node);
//! - `down`: an endpoint whose port refuses connections (target: within 5 % of `off`);
//! - `hangs`: a collector that accepts and never answers.
//!
//! Two medians per variant: until the run's result is on stdout (`result`: the run is
//! done and recorded), and until the process exits (`exit`: a command waits at most
//! `telemetry::EXIT_FLUSH`, 1 s, for its last spans). Ratios are to `off`.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A collector on loopback: reads each request and, unless `hang`, answers 200 with an
/// empty protobuf body; a hanging one keeps the connection open and never answers.
fn collector(hang: bool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                let mut held = Vec::new();
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if hang {
                                held.extend_from_slice(&buf[..n]);
                                continue;
                            }
                            let _ = stream.write_all(
                                b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
                            );
                        }
                    }
                }
            });
        }
    });
    format!("http://{addr}")
}

/// One `flow run`: (until the result is on stdout, until the process exited).
fn sample(dir: &std::path::Path, endpoint: Option<&str>, config: &str) -> (Duration, Duration) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flow"));
    cmd.current_dir(dir)
        .env_remove("RUST_LOG")
        .args([
            "--db",
            "sqlite://flow.db",
            "--config",
            config,
            "run",
            "chain.yaml",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (key, _) in std::env::vars() {
        if key.starts_with("OTEL_") || key.starts_with("FLOW_") {
            cmd.env_remove(key);
        }
    }
    if let Some(endpoint) = endpoint {
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
    }
    let t = Instant::now();
    let mut child = cmd.spawn().expect("spawn flow");
    let mut out = child.stdout.take().expect("stdout");
    let mut first = [0u8; 1];
    let _ = out.read(&mut first);
    let result = t.elapsed();
    let mut rest = Vec::new();
    let _ = out.read_to_end(&mut rest);
    let status = child.wait().expect("wait");
    let exit = t.elapsed();
    assert!(status.success(), "flow run: {status}");
    (result, exit)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let samples = common::env_usize("FLOW_BENCH_SAMPLES", 25);
    let nodes = common::env_usize("FLOW_BENCH_NODES", 200);
    let dir = tempfile::tempdir().expect("tempdir");
    let floor = common::fsync_floor(dir.path());
    println!(
        "machine: fsync floor {floor:?} per durable commit; {} cores; {nodes}-node chain, {samples} rounds",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    std::fs::write(dir.path().join("chain.yaml"), common::chain(nodes)).expect("chain");
    std::fs::write(dir.path().join("plain.toml"), "").expect("toml");
    std::fs::write(
        dir.path().join("pure.toml"),
        "[telemetry]\npure_steps = true\n",
    )
    .expect("toml");
    let live = collector(false);
    let hangs = collector(true);
    let down = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("addr"))
    };
    let variants: [(&str, Option<&str>, &str); 5] = [
        ("off", None, "plain.toml"),
        ("live", Some(&live), "plain.toml"),
        ("live+pure", Some(&live), "pure.toml"),
        ("down", Some(&down), "plain.toml"),
        ("hangs", Some(&hangs), "plain.toml"),
    ];
    // Warm the file cache and the ledger (migrated once).
    for (_, endpoint, config) in &variants {
        sample(dir.path(), *endpoint, config);
    }
    let mut times: Vec<(Vec<Duration>, Vec<Duration>)> =
        variants.iter().map(|_| (Vec::new(), Vec::new())).collect();
    for _ in 0..samples {
        for (i, (_, endpoint, config)) in variants.iter().enumerate() {
            let (result, exit) = sample(dir.path(), *endpoint, config);
            times[i].0.push(result);
            times[i].1.push(exit);
        }
    }
    let medians: Vec<(Duration, Duration)> = times
        .into_iter()
        .map(|(r, e)| (median(r), median(e)))
        .collect();
    let (off_result, off_exit) = medians[0];
    println!("variant     result (median)   ×off   exit (median)   ×off");
    for ((name, _, _), (result, exit)) in variants.iter().zip(&medians) {
        println!(
            "{name:<10} {:>10.1} ms   {:>6.3}   {:>10.1} ms   {:>6.3}",
            result.as_secs_f64() * 1e3,
            result.as_secs_f64() / off_result.as_secs_f64(),
            exit.as_secs_f64() * 1e3,
            exit.as_secs_f64() / off_exit.as_secs_f64(),
        );
    }
}
