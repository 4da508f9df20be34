//! Bytes on disk per run: 10,000 runs of one ~5 KB workflow enqueued through
//! `enqueue_batch` (batches of 1,000, as `POST /api/v1/runs:batch` does) on a fresh SQLite
//! file, then the file's size (database + WAL, after the ledger is closed). The figure
//! behind migration 0007 (`workflow_texts`: one copy of a text per hash, not per run).
//!
//! Run: `cargo bench -p flow-ledger --bench text_storage` (a few seconds; the size does
//! not depend on the profile, so `--profile dev` gives the same figure without a release
//! build). `FLOW_BENCH_RUNS` changes the number of runs.

use flow_ledger::{Ledger, NewRun, OpenOptions, Timestamp};
use serde_json::json;

/// A workflow of about 5 KB: 40 nodes, each a small HTTP call.
fn workflow_text() -> String {
    let mut text = String::from(
        "name: storage-bench\ninputs:\n  order_id: { type: string, required: true }\ntools:\n",
    );
    text.push_str("  api: { kind: http, method: POST, url: \"http://127.0.0.1:8080/orders\" }\n");
    text.push_str("nodes:\n");
    let mut i = 0;
    while text.len() < 5_000 {
        text.push_str(&format!(
            "  step{i}:\n    tool: api\n    with: {{ order: \"${{{{ inputs.order_id }}}}\", n: {i} }}\n"
        ));
        if i > 0 {
            text.push_str(&format!("    needs: [step{}]\n", i - 1));
        }
        i += 1;
    }
    text
}

fn file_bytes(path: &std::path::Path) -> u64 {
    ["", "-wal"]
        .iter()
        .filter_map(|suffix| {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            std::fs::metadata(p).ok().map(|m| m.len())
        })
        .sum()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = std::env::var("FLOW_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("flow.db");
    let url = format!("sqlite://{}", path.display());
    let ledger = Ledger::open(&url, OpenOptions::default())
        .await
        .expect("open");
    let text = workflow_text();
    let empty = file_bytes(&path);
    let t0 = std::time::Instant::now();
    for batch in 0..runs.div_ceil(1_000) {
        let n = (runs - batch * 1_000).min(1_000);
        let new: Vec<NewRun> = (0..n)
            .map(|i| NewRun {
                id: format!("run_{batch}_{i}"),
                workflow_name: "storage-bench".into(),
                workflow_text: text.clone(),
                inputs: json!({"order_id": format!("{batch}-{i}")}),
                priority: 0,
                not_before: None,
                trace_parent: None,
            })
            .collect();
        ledger
            .enqueue_batch(new, None, Timestamp(1_800_000_000_000))
            .await
            .expect("enqueue batch");
    }
    let secs = t0.elapsed().as_secs_f64();
    ledger.close().await;
    let bytes = file_bytes(&path);
    println!(
        "text_storage: {runs} runs of one {} B workflow on SQLite: {:.1} MB on disk \
         ({} B/run over the empty ledger's {} B); enqueued in {secs:.2} s",
        text.len(),
        bytes as f64 / 1e6,
        (bytes - empty) / runs as u64,
        empty
    );
}
