//! Benchmark: a `for_each` of a pure function through the real `flow run` binary.
//!
//! `cargo bench --bench for_each` (`FLOW_BENCH_ITEMS`, default 10,000;
//! `FLOW_BENCH_SAMPLES`, default 3; `FLOW_BENCH_ONLY` = `input` | `range`). One node fans
//! out over `FLOW_BENCH_ITEMS` items, each item a step `fan[<key>]` calling `core.echo`
//! (so nothing leaves the process: the cost is the engine's and the ledger's), on SQLite
//! (`synchronous=FULL`), each sample a new process on a fresh, already migrated ledger.
//! Two shapes of the same fan-out:
//! - `input`: the list is a run input (`--inputs-file`), items `{id, email}`, key
//!   `item.id` — what a workflow usually does;
//! - `range`: the list is `range(inputs.n)`, key `c<item>` — the same items without a
//!   list in the expression context (the difference between the two is what carrying
//!   the list in every item's context costs).
//!
//! Prints, beside this machine's fsync floor: the median wall time of `flow run` (process
//! start to exit; range over the samples), per item, and the process's peak RSS (`%M` of
//! `/usr/bin/time` when it is installed, else `VmHWM` of `/proc/<pid>/status` polled
//! until the exit, a lower bound). Targets (issue): < 2 s and < 64 MiB at 10,000 items.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The workflow: `fan` over the list `items`, keyed by `key`, calling `core.echo`.
fn workflow(inputs: &str, items: &str, key: &str, with: &str) -> String {
    format!(
        r#"name: fan
max_parallel: 64
inputs:
  {inputs}
tools:
  echo: {{ kind: function, function: core.echo }}
nodes:
  fan:
    for_each:
      items: "{items}"
      key: "{key}"
      max_items: 1000000
    tool: echo
    with: {with}
"#
    )
}

/// One shape of the fan-out: its name, workflow and the extra arguments of `flow run`.
struct Shape {
    name: &'static str,
    what: &'static str,
    text: String,
    args: Vec<String>,
}

/// One `flow run`: wall time and peak RSS in KiB (`exact`: measured by the kernel at exit).
struct Sample {
    wall: Duration,
    rss_kib: u64,
    exact: bool,
}

/// `VmHWM` (the peak resident set so far) of a live process, in KiB.
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Runs `flow --db url args…` once and checks that the node's `items` all succeeded.
fn sample(url: &str, args: &[String], items: usize, dir: &Path) -> Sample {
    let time = Path::new("/usr/bin/time");
    let rss_file = dir.join("rss.txt");
    let _ = std::fs::remove_file(&rss_file);
    let mut cmd = if time.exists() {
        let mut c = Command::new(time);
        c.arg("-f")
            .arg("%M")
            .arg("-o")
            .arg(&rss_file)
            .arg(env!("CARGO_BIN_EXE_flow"));
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_flow"))
    };
    cmd.env_remove("RUST_LOG")
        .env_remove("FLOW_FAULT")
        .arg("--db")
        .arg(url)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let started = Instant::now();
    let mut child = cmd.spawn().expect("spawn flow");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    // Without /usr/bin/time: poll the peak of the flow process itself until it exits.
    let mut polled = 0;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if !time.exists() {
            polled = polled.max(vm_hwm_kib(child.id()).unwrap_or(0));
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let wall = started.elapsed();
    let out = reader.join().unwrap_or_default();
    assert!(status.success(), "flow {args:?}: {status}");
    let result: serde_json::Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("flow run printed no JSON output ({e}): {out}"));
    assert_eq!(
        result["fan"]["succeeded"].as_u64(),
        Some(items as u64),
        "every item succeeded: {result}"
    );
    match std::fs::read_to_string(&rss_file)
        .ok()
        .and_then(|t| t.trim().lines().last()?.trim().parse().ok())
    {
        Some(rss_kib) => Sample {
            wall,
            rss_kib,
            exact: true,
        },
        None => Sample {
            wall,
            rss_kib: polled,
            exact: false,
        },
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn main() {
    let items = common::env_usize("FLOW_BENCH_ITEMS", 10_000).max(1);
    let samples = common::env_usize("FLOW_BENCH_SAMPLES", 3).max(1);
    let only = std::env::var("FLOW_BENCH_ONLY").ok();
    let dir = tempfile::tempdir().expect("tempdir");
    let floor = common::fsync_floor(dir.path());
    println!(
        "machine: fsync floor {floor:?} per durable commit (median of 200 write+fsync, same directory); {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let list: Vec<serde_json::Value> = (0..items)
        .map(|i| serde_json::json!({ "id": format!("c{i}"), "email": format!("c{i}@example.com") }))
        .collect();
    let inputs = dir.path().join("inputs.json");
    std::fs::write(
        &inputs,
        serde_json::json!({ "customers": list }).to_string(),
    )
    .expect("write inputs");
    let shapes = [
        Shape {
            name: "input",
            what: "list from an input array ({id, email} items, key item.id)",
            text: workflow(
                "customers: { type: array, required: true }",
                "${{ inputs.customers }}",
                "${{ item.id }}",
                r#"{ to: "${{ item.email }}" }"#,
            ),
            args: vec!["--inputs-file".into(), inputs.display().to_string()],
        },
        Shape {
            name: "range",
            what: "list from range(n) (no list in the context, key c<i>)",
            text: workflow(
                "n: { type: integer, required: true }",
                "${{ range(inputs.n) }}",
                "c${{ item }}",
                r#"{ to: "c${{ item }}@example.com" }"#,
            ),
            args: vec!["--input".into(), format!("n={items}")],
        },
    ];
    for shape in &shapes {
        if only.as_deref().is_some_and(|o| o != shape.name) {
            continue;
        }
        let file = dir.path().join(format!("{}.yaml", shape.name));
        std::fs::write(&file, &shape.text).expect("write workflow");
        let mut args = vec!["run".to_string(), file.display().to_string()];
        args.extend(shape.args.iter().cloned());
        let mut runs: Vec<Sample> = (0..samples)
            .map(|i| {
                let db = dir.path().join(format!("{}-{i}.db", shape.name));
                let url = format!("sqlite://{}", db.display());
                // A fresh ledger, migrated outside the measurement.
                let migrated = Command::new(env!("CARGO_BIN_EXE_flow"))
                    .args(["--db", &url, "migrate"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .expect("flow migrate");
                assert!(migrated.success(), "flow migrate: {migrated}");
                sample(&url, &args, items, dir.path())
            })
            .collect();
        runs.sort_by_key(|s| s.wall);
        let median = &runs[runs.len() / 2];
        let rss = runs.iter().map(|s| s.rss_kib).max().unwrap_or(0);
        let exact = runs.iter().all(|s| s.exact);
        let per_item = median.wall / u32::try_from(items).unwrap_or(u32::MAX);
        println!(
            "sqlite FULL: `flow run` of a {items}-item for_each of core.echo, {}: median of {samples} {:.2?} ({:.2?}–{:.2?}), {per_item:.1?} per item = {:.2}x the fsync floor; peak RSS {}{:.1} MiB (targets at 10,000 items: < 2 s, < 64 MiB)",
            shape.what,
            median.wall,
            runs[0].wall,
            runs[runs.len() - 1].wall,
            per_item.as_secs_f64() / floor.as_secs_f64(),
            if exact { "" } else { ">= " },
            mib(rss),
        );
    }
}
