//! Benchmark: the daemons' one timer watcher (`Ledger::fire_due_timers`, issue 50) over
//! an incident-sized ledger — what every daemon pays every 2 s, and what firing costs.
//!
//! `cargo bench --bench timers`. On SQLite and on a fresh PostgreSQL database (created
//! and dropped here), put in through the ledger as workers leave them (not measured):
//! `FLOW_BENCH_IN_DOUBT` (1,600) paused runs, each with one call in doubt whose next
//! probe is due in an hour, and `FLOW_BENCH_HOLDS` (1,000) paused runs, each waiting on
//! an event with a deadline in an hour. Then, `FLOW_BENCH_QUERIES` (50) times each:
//! - **idle**: the watcher at now, when nothing is due (the steady cost, every 2 s);
//! - **fire**: the watcher two hours later, 100 timers a batch (each re-queues a run
//!   or times a wait out, in its own transaction), until none is left: per batch and
//!   per timer.
//!
//! Printed beside the machine's fsync floor (one durable commit); medians and p99.
//! `FLOW_BENCH_ONLY` (`sqlite` or `postgres`) runs one backend.

mod common;

use std::time::{Duration, Instant};

use flow_ledger::{
    BeginWait, Ledger, NewProbe, NewRun, NewStep, OpenOptions, ProbeDecision, ProbeObserved,
    SqliteSynchronous, StepStatus, TimerRules, Timestamp, WaitKind, WorkerId,
};
use futures::stream::{self, StreamExt, TryStreamExt};
use serde_json::json;

const WORKFLOW: &str = "name: pay\ntools:\n  pay: { kind: http, method: POST, url: \"http://127.0.0.1:9/pay\" }\nnodes:\n  charge: { tool: pay }\n";
const LEASE: Duration = Duration::from_secs(3_600);
const HOUR_MS: i64 = 3_600_000;

fn now() -> Timestamp {
    flow_ledger::Clock::now(&flow_ledger::SystemClock)
}

fn rules() -> TimerRules {
    TimerRules {
        next_remind: |_, _, _| None,
        probe_by: "reconcile",
    }
}

fn new_run(id: &str) -> NewRun {
    NewRun {
        id: id.to_owned(),
        workflow_name: "pay".into(),
        workflow_text: WORKFLOW.into(),
        inputs: json!({}),
        priority: 0,
        not_before: None,
        trace_parent: None,
    }
}

fn step(id: &str) -> NewStep {
    NewStep {
        step_id: id.into(),
        node_id: id.into(),
        retry: 0,
        not_before: None,
        status: StepStatus::Running,
    }
}

/// Run `id`: its call sent and timed out, a probe due in an hour, the run paused.
async fn in_doubt(ledger: &Ledger, id: String) -> Result<(), flow_ledger::Error> {
    let worker = WorkerId::new("bench-host", 1, "1");
    ledger.enqueue(new_run(&id), now()).await?;
    let run = ledger.claim_run(&id, &worker, LEASE, now()).await?;
    ledger.create_step(&run, step("charge"), now()).await?;
    let request = json!({"method": "POST", "url": "http://127.0.0.1:9/pay"});
    let lease = common::send_and_lose(ledger, &run, request).await?;
    let probe = NewProbe {
        run_id: id.clone(),
        tool_call_id: "charge".into(),
        sent_key: lease.key.clone(),
        observed: ProbeObserved::Unknown,
        decision: ProbeDecision::ProbeAgain,
        http_status: Some(503),
        detail: None,
        response: None,
        next_probe_at: Some(Timestamp(now().0 + HOUR_MS)),
        by: "bench".into(),
        tool: "pay".into(),
        attempt: 1,
        requests_sent: 1,
        max_resends: 1,
    };
    ledger.record_probe(probe, now()).await?;
    ledger.pause_run(&run, "charge in doubt", now()).await
}

/// Run `id`: waiting on an event for an hour, paused.
async fn waiting(ledger: &Ledger, id: String) -> Result<(), flow_ledger::Error> {
    let worker = WorkerId::new("bench-host", 1, "1");
    ledger.enqueue(new_run(&id), now()).await?;
    let run = ledger.claim_run(&id, &worker, LEASE, now()).await?;
    ledger.create_step(&run, step("arrive"), now()).await?;
    let wait = BeginWait {
        node_id: "arrive".into(),
        step_id: "arrive".into(),
        kind: WaitKind::Event,
        event_name: Some("parcel.arrived".into()),
        matcher: None,
        lookback_ms: 0,
        timeout_ms: HOUR_MS,
        heartbeat_ms: None,
        token_hash: None,
    };
    ledger.begin_wait(&run, wait, now()).await?;
    ledger.pause_run(&run, "waits", now()).await
}

/// `(p50, p99)` of `samples`, in milliseconds.
fn p50_p99(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

async fn bench(name: &str, url: &str, doubts: usize, holds: usize, queries: usize) {
    let opts = OpenOptions {
        sqlite_synchronous: SqliteSynchronous::Full,
        ..OpenOptions::default()
    };
    let ledger = Ledger::open(url, opts).await.expect("open ledger");
    let t = Instant::now();
    let ids = (0..doubts).map(|i| (true, format!("doubt_{i:05}")));
    let ids = ids.chain((0..holds).map(|i| (false, format!("hold_{i:05}"))));
    stream::iter(ids)
        .map(|(doubt, id)| {
            let ledger = &ledger;
            async move {
                if doubt {
                    in_doubt(ledger, id).await
                } else {
                    waiting(ledger, id).await
                }
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await
        .expect("put the ledger in place");
    let _ = ledger.refresh_planner_statistics().await;
    println!(
        "\n{name}: {doubts} paused runs with a call in doubt, {holds} waiting on an event (put in {:.1} s)",
        t.elapsed().as_secs_f64()
    );
    let mut idle = Vec::with_capacity(queries);
    for _ in 0..queries {
        let t = Instant::now();
        let fired = ledger.fire_due_timers(now(), 100, rules()).await;
        idle.push(t.elapsed().as_secs_f64() * 1e3);
        let fired = fired.expect("watcher");
        assert!(fired.probed.is_empty() && fired.holds.timed_out.is_empty());
    }
    let (p50, p99) = p50_p99(idle);
    println!("  idle (nothing due), {queries} passes: p50 {p50:.2} ms, p99 {p99:.2} ms");
    let later = Timestamp(now().0 + 2 * HOUR_MS);
    let (mut batches, mut timers) = (Vec::new(), 0usize);
    loop {
        let t = Instant::now();
        let fired = ledger
            .fire_due_timers(later, 100, rules())
            .await
            .expect("watcher");
        let n = fired.probed.len() + fired.holds.timed_out.len();
        if n == 0 {
            break;
        }
        batches.push(t.elapsed().as_secs_f64() * 1e3);
        timers += n;
    }
    let total: f64 = batches.iter().sum();
    let count = batches.len();
    let (p50, p99) = p50_p99(batches);
    println!(
        "  fire: {timers} timers in {count} batches of up to 100: batch p50 {p50:.1} ms, p99 {p99:.1} ms; {:.2} ms per timer",
        total / timers.max(1) as f64
    );
    assert_eq!(timers, doubts + holds, "every timer fired once");
}

fn main() {
    let doubts = common::env_usize("FLOW_BENCH_IN_DOUBT", 1_600);
    let holds = common::env_usize("FLOW_BENCH_HOLDS", 1_000);
    let queries = common::env_usize("FLOW_BENCH_QUERIES", 50).max(1);
    let only = std::env::var("FLOW_BENCH_ONLY").unwrap_or_default();
    let dir = tempfile::tempdir().expect("tempdir");
    let floor = common::fsync_floor(dir.path());
    println!(
        "timers: the daemons' one watcher\nmachine: fsync floor {floor:?} per durable commit; {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    common::runtime().block_on(async {
        if only != "postgres" {
            let url = format!("sqlite://{}", dir.path().join("flow.db").display());
            bench("sqlite", &url, doubts, holds, queries).await;
        }
        if only != "sqlite" {
            common::on_fresh_pg(move |url| async move {
                bench("postgres", &url, doubts, holds, queries).await;
            })
            .await;
        }
    });
}
