//! Benchmark: events per second that one dispatcher delivers to a local webhook (a real
//! axum server on loopback answering 204), on SQLite (`synchronous=FULL`), beside this
//! machine's fsync floor measured in the same run.
//!
//! `cargo bench --bench events`. Each measured run delivers the same 2,000 `run.queued`
//! events to a fresh consumer (its own checkpoint), with the default options (batches of
//! 64 finished in one commit, 16 requests in flight); the figure is the median of 5 runs.
//! Set `FLOW_BENCH_PG=postgres://…/db` to add PostgreSQL.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flow::config::{ConsumerConfig, ConsumerKind, ConsumerStart};
use flow::events::{Dispatcher, Summary};
use flow::secrets::Secrets;
use flow_ledger::{Clock, Ledger, NewRun, OpenOptions, SystemClock};

const EVENTS: u64 = 2_000;
const RUNS: usize = 5;

/// A webhook that accepts everything and counts.
async fn start_hook(count: Arc<AtomicU64>) -> String {
    let router = axum::Router::new().fallback(move || {
        let count = count.clone();
        async move {
            count.fetch_add(1, Ordering::Relaxed);
            axum::http::StatusCode::NO_CONTENT
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

fn consumer(name: &str, url: &str) -> ConsumerConfig {
    ConsumerConfig {
        name: name.into(),
        kind: ConsumerKind::Webhook,
        url: Some(url.into()),
        secret_name: Some("BENCH".into()),
        path: None,
        events: Some(vec!["run.queued".into()]),
        timeout: Some("5s".into()),
        max_attempts: None,
        start: ConsumerStart::Beginning,
    }
}

async fn bench(label: &str, url: &str, floor: Duration) {
    let ledger = Ledger::open(url, OpenOptions::default())
        .await
        .expect("ledger");
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    for i in 0..EVENTS {
        let run = NewRun {
            id: format!("run_bench_{i}"),
            workflow_name: "bench".into(),
            workflow_text: "name: bench\nnodes: {}\n".into(),
            inputs: serde_json::json!({}),
            priority: 0,
            not_before: None,
            trace_parent: None,
        };
        ledger.enqueue(run, clock.now()).await.expect("enqueue");
    }
    let count = Arc::new(AtomicU64::new(0));
    let hook = start_hook(count.clone()).await;
    let secrets = Secrets::from_pairs([("BENCH".to_string(), "bench-secret".to_string())]);
    let mut rates = Vec::new();
    for r in 0..RUNS {
        let consumers =
            flow::events::consumers(&[consumer(&format!("bench-{r}"), &hook)], &secrets)
                .expect("consumer");
        let dispatcher = Dispatcher::new(ledger.clone(), consumers, clock.clone());
        let before = count.load(Ordering::Relaxed);
        let started = Instant::now();
        let mut total = Summary::default();
        while total.delivered < EVENTS {
            let s = dispatcher.dispatch_once().await.expect("dispatch");
            assert_eq!(s.retried + s.dead + s.lost, 0, "{s:?}");
            total.delivered += s.delivered;
            if s.attempts() == 0 {
                // PostgreSQL: waiting for older transactions to end.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let took = started.elapsed();
        assert_eq!(count.load(Ordering::Relaxed) - before, EVENTS);
        rates.push(EVENTS as f64 / took.as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    let median = rates[rates.len() / 2];
    let per_event = Duration::from_secs_f64(1.0 / median);
    println!(
        "{label}: {median:.0} events/s delivered (median of {RUNS} runs of {EVENTS}; min {:.0}, max {:.0}) = {per_event:?} per event = {:.2}x one fsync",
        rates[0],
        rates[rates.len() - 1],
        per_event.as_secs_f64() / floor.as_secs_f64()
    );
    ledger.close().await;
}

fn main() {
    let rt = common::runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let floor = common::fsync_floor(dir.path());
    println!(
        "machine: one write+fsync (median of 200, same directory): {floor:?}; a batch of 64 deliveries costs 2 commits (lease, finish) = {:?} per event at the floor",
        floor * 2 / 64
    );
    let url = format!("sqlite://{}", dir.path().join("events.db").display());
    rt.block_on(bench(
        "sqlite FULL, one dispatcher, local webhook",
        &url,
        floor,
    ));
    if let Ok(pg) = std::env::var("FLOW_BENCH_PG") {
        rt.block_on(bench("postgres, one dispatcher, local webhook", &pg, floor));
    }
}
