//! Benchmark: 1,000 sub-workflow children of one node, through the real binary.
//!
//! `cargo bench --bench children` (`FLOW_BENCH_CHILDREN`, default 1,000;
//! `FLOW_BENCH_SAMPLES`, default 3; `FLOW_BENCH_CONCURRENCY`, default 8). One
//! `workflow:` node fans out (`for_each`) over `range(n)`; each item starts a child run
//! of a two-node workflow of pure functions (`core.echo`), so the cost is the engine's
//! and the ledger's: each child is a run row inserted and claimed in one transaction,
//! executed in-process, finished, and its output read back by the parent. On SQLite
//! (`synchronous=FULL`), each sample on a fresh, already migrated ledger; two ways:
//! - `run`: `flow run` of the parent (no daemon);
//! - `daemon`: `flow submit`, then one `flow daemon --exit-when-idle` drains it (its
//!   wall time includes the daemon's start and its idle check at the end).
//!
//! Prints the median wall time (range over the samples), children per second and the
//! commits each child costs against this machine's fsync floor.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = r#"name: child
inputs:
  n: { type: integer, required: true }
tools:
  echo: { kind: function, function: core.echo }
nodes:
  first:
    tool: echo
    with: { n: "${{ inputs.n }}" }
  second:
    needs: [first]
    tool: echo
    with: { twice: "${{ nodes.first.output.n * 2 }}" }
"#;

fn parent(concurrency: usize) -> String {
    format!(
        r#"name: parent
max_parallel: {concurrency}
inputs:
  n: {{ type: integer, required: true }}
nodes:
  kids:
    workflow: child.yaml
    for_each:
      items: "${{{{ range(inputs.n) }}}}"
      key: "k${{{{ item }}}}"
      max_items: 1000000
      concurrency: {concurrency}
    with: {{ n: "${{{{ item }}}}" }}
"#
    )
}

fn flow(url: &str, dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flow"));
    c.env_remove("RUST_LOG")
        .env_remove("FLOW_FAULT")
        .current_dir(dir)
        .arg("--db")
        .arg(url)
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// The parent's children that succeeded, by `flow runs --parent`.
fn succeeded_children(url: &str, dir: &Path, parent: &str, n: usize) -> usize {
    let out = flow(url, dir)
        .args([
            "runs",
            "--parent",
            parent,
            "--status",
            "succeeded",
            "--json",
        ])
        .args(["--limit", &(n + 1).to_string()])
        .output()
        .expect("flow runs");
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).map_or(0, |v| v.len())
}

/// One sample: a fresh ledger, then the parent run `how` (`run` or `daemon`).
fn sample(dir: &Path, i: usize, how: &str, n: usize) -> Duration {
    let url = format!("sqlite://{}", dir.join(format!("{how}-{i}.db")).display());
    let migrated = flow(&url, dir)
        .arg("migrate")
        .stdout(Stdio::null())
        .status()
        .expect("flow migrate");
    assert!(migrated.success(), "flow migrate: {migrated}");
    let run_id = format!("bench-{how}-{i}");
    let n_arg = format!("n={n}");
    let args = ["parent.yaml", "--input", &n_arg, "--run-id", &run_id];
    let started = Instant::now();
    if how == "run" {
        let out = flow(&url, dir)
            .arg("run")
            .args(args)
            .output()
            .expect("flow run");
        assert!(out.status.success(), "flow run: {}", out.status);
    } else {
        let submitted = flow(&url, dir)
            .arg("submit")
            .args(args)
            .stdout(Stdio::null())
            .status()
            .expect("flow submit");
        assert!(submitted.success(), "flow submit: {submitted}");
        let drained = flow(&url, dir)
            .args(["daemon", "--exit-when-idle"])
            .stdout(Stdio::null())
            .status()
            .expect("flow daemon");
        assert!(drained.success(), "flow daemon: {drained}");
    }
    let wall = started.elapsed();
    assert_eq!(
        succeeded_children(&url, dir, &run_id, n),
        n,
        "every child of {run_id} succeeded"
    );
    wall
}

fn main() {
    let n = common::env_usize("FLOW_BENCH_CHILDREN", 1_000).max(1);
    let samples = common::env_usize("FLOW_BENCH_SAMPLES", 3).max(1);
    let concurrency = common::env_usize("FLOW_BENCH_CONCURRENCY", 8).clamp(1, 1024);
    let dir = tempfile::tempdir().expect("tempdir");
    let floor = common::fsync_floor(dir.path());
    println!(
        "machine: fsync floor {floor:?} per durable commit (median of 200 write+fsync, same directory); {} cores",
        std::thread::available_parallelism().map_or(0, |c| c.get())
    );
    std::fs::write(dir.path().join("child.yaml"), CHILD).expect("write child");
    std::fs::write(dir.path().join("parent.yaml"), parent(concurrency)).expect("write parent");
    for how in ["run", "daemon"] {
        let mut walls: Vec<Duration> = (0..samples)
            .map(|i| sample(dir.path(), i, how, n))
            .collect();
        walls.sort();
        let median = walls[walls.len() / 2];
        let per_child = median / u32::try_from(n).unwrap_or(u32::MAX);
        println!(
            "{how:>6}: {n} children of one node (concurrency {concurrency}), SQLite: median {median:.2?} (range {:.2?}–{:.2?}) = {:.0} children/s, {per_child:.2?} per child = {:.1}× the fsync floor",
            walls[0],
            walls[walls.len() - 1],
            n as f64 / median.as_secs_f64(),
            per_child.as_secs_f64() / floor.as_secs_f64().max(1e-9),
        );
    }
}
