//! Finding runs among many (migration 0009, `ledger/src/search.rs`): 100,000 runs put in
//! through `enqueue_batch`, then `list_runs` pages (limit 50) under input filters and an
//! id prefix, and `count_runs` with and without an input filter, each timed call by call
//! (p50/p99), on SQLite and on a fresh PostgreSQL database, beside the machine's floor
//! for a read: `get_run` of one run by primary key on the same ledger.
//!
//! The runs: `order_id` unique for 99% of them (half numbers, half strings), the other
//! 1% sharing 50 values (`shared-N`, ~20 runs each); `customer` one of 500 (~200 runs
//! each); `region` one of 4 (25% each); 8 workflows; statuses spread over queued,
//! running, succeeded, failed and cancelled by one UPDATE after loading (the ledger has
//! no bulk finish, and only the reads are measured). On PostgreSQL the planner
//! statistics are refreshed while loading the way a daemon does
//! (`refresh_planner_statistics`), and the spread is followed by `VACUUM (ANALYZE)`.
//!
//! Run: `cargo bench -p flow-ledger --bench run_search` (a few minutes: most of it is
//! loading). Environment: `FLOW_BENCH_RUNS` (default 100000), `FLOW_BENCH_QUERIES`
//! (calls per figure, default 200), `FLOW_BENCH_ONLY` (`sqlite` or `postgres`),
//! `FLOW_TEST_POSTGRES_URL` (admin URL, default
//! `postgres://postgres@127.0.0.1:5432/test`).

use std::time::{Duration, Instant};

use flow_ledger::{Ledger, NewRun, OpenOptions, RunCursor, RunFilter, Timestamp};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};
use sqlx::Connection;

const T0: i64 = 1_800_000_000_000;
const BATCH: usize = 1_000;
const CUSTOMERS: usize = 500;
const REGIONS: [&str; 4] = ["eu", "us", "apac", "latam"];

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn run_id(i: usize) -> String {
    format!("run_{i:07}")
}

/// Run `i`'s `order_id`: 1% share one of 50 values, the rest are unique (even: a number,
/// odd: the same digits as a string; both are found by their text).
fn order_id(i: usize) -> Value {
    if i.is_multiple_of(100) {
        json!(format!("shared-{}", (i / 100) % 50))
    } else if i.is_multiple_of(2) {
        json!(i)
    } else {
        json!(i.to_string())
    }
}

fn order_text(i: usize) -> String {
    match order_id(i) {
        Value::String(s) => s,
        other => other.to_string(),
    }
}

fn new_run(i: usize) -> NewRun {
    let workflow = format!("wf_{}", i % 8);
    NewRun {
        id: run_id(i),
        workflow_text: format!("name: {workflow}\nnodes: {{}}\n"),
        workflow_name: workflow,
        inputs: json!({
            "order_id": order_id(i),
            "customer": format!("cust_{}", i % CUSTOMERS),
            "region": REGIONS[i % REGIONS.len()],
            "amount": (i * 7) % 1_000,
        }),
        priority: 0,
        not_before: None,
        trace_parent: None,
    }
}

/// Enqueues `runs` runs in batches of 1,000, one second apart, and spreads statuses.
/// Every 10 batches the planner statistics are refreshed, as a daemon does every 5 s
/// (a no-op on SQLite): without it PostgreSQL, whose statistics still describe an empty
/// `runs`, finds each run of the enqueue by scanning the tenant's runs (and loaded
/// 57,000 runs in 8 minutes here, slowing down as they grew).
async fn load(ledger: &Ledger, url: &str, runs: usize) -> f64 {
    let t = Instant::now();
    for batch in 0..runs.div_ceil(BATCH) {
        if batch % 10 == 1 {
            ledger
                .refresh_planner_statistics()
                .await
                .expect("statistics");
        }
        let first = batch * BATCH;
        let new: Vec<NewRun> = (first..(first + BATCH).min(runs)).map(new_run).collect();
        let now = Timestamp(T0 + 1_000 * batch as i64);
        ledger
            .enqueue_batch(new, None, now)
            .await
            .expect("enqueue batch");
    }
    let secs = t.elapsed().as_secs_f64();
    let spread = "UPDATE runs SET status = CASE CAST(substr(id, 5) AS INTEGER) % 10
        WHEN 0 THEN 'queued' WHEN 1 THEN 'running' WHEN 2 THEN 'failed'
        WHEN 3 THEN 'cancelled' ELSE 'succeeded' END";
    execute(url, spread).await;
    if !url.starts_with("sqlite:") {
        // The spread rewrote every run at once, which real runs never do; clean up after
        // it as autovacuum would (this bench's server may have autovacuum off).
        execute(url, "VACUUM (ANALYZE) runs, run_inputs").await;
    }
    secs
}

async fn execute(url: &str, sql: &'static str) {
    if url.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(url).await.expect("connect");
        sqlx::raw_sql(sql).execute(&mut c).await.expect("execute");
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
        sqlx::raw_sql(sql).execute(&mut c).await.expect("execute");
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Times `calls` calls of `one(i)` (each returns how many rows it got) and prints a row.
async fn time<F, Fut>(name: &str, calls: usize, mut one: F)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let (mut ms, mut rows) = (Vec::with_capacity(calls), 0);
    for i in 0..calls {
        let t = Instant::now();
        rows += one(i).await;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (p50, p99) = (percentile(&mut ms, 0.5), percentile(&mut ms, 0.99));
    let mean_rows = rows as f64 / calls as f64;
    println!("  {name:<52} {calls:>5} {p50:>9.2} {p99:>9.2} {mean_rows:>10.1}");
}

fn by_inputs(pairs: &[(&str, String)]) -> RunFilter {
    RunFilter {
        limit: 50,
        inputs: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect(),
        ..Default::default()
    }
}

async fn list(ledger: &Ledger, filter: RunFilter) -> usize {
    ledger.list_runs(filter).await.expect("list").len()
}

/// Every figure on one loaded ledger.
async fn measure(ledger: &Ledger, runs: usize, calls: usize) {
    let mut rng = StdRng::seed_from_u64(7);
    let picks: Vec<usize> = (0..calls).map(|_| rng.random_range(0..runs)).collect();
    println!(
        "  {:<52} {:>5} {:>9} {:>9} {:>10}",
        "figure", "calls", "p50 ms", "p99 ms", "rows/call"
    );
    time("floor: get_run by id", calls, |i| {
        let id = run_id(picks[i]);
        async move {
            ledger.get_run(&id).await.expect("get run");
            1
        }
    })
    .await;
    time("list_runs order_id=<a run's>", calls, |i| {
        list(ledger, by_inputs(&[("order_id", order_text(picks[i]))]))
    })
    .await;
    time("list_runs order_id=shared-N (~20 runs)", calls, |i| {
        let value = format!("shared-{}", picks[i] % 50);
        list(ledger, by_inputs(&[("order_id", value)]))
    })
    .await;
    // Where the walk is: the cursor of the last page and the customer it pages through.
    let at = std::sync::Arc::new(std::sync::Mutex::new((None::<RunCursor>, 0usize)));
    time(
        "list_runs customer=<one of 500>, pages along cursor",
        calls,
        |_| {
            let at = at.clone();
            async move {
                let (after, customer) = at.lock().expect("cursor").clone();
                let filter = RunFilter {
                    after,
                    ..by_inputs(&[("customer", format!("cust_{customer}"))])
                };
                let page = ledger.list_runs(filter).await.expect("page");
                let mut at = at.lock().expect("cursor");
                // A short page is the last one: the next call starts the next customer.
                at.0 = page
                    .last()
                    .map(RunCursor::after)
                    .filter(|_| page.len() == 50);
                if at.0.is_none() {
                    at.1 += 1;
                }
                page.len()
            }
        },
    )
    .await;
    time("list_runs customer=<c> AND region=<c's own>", calls, |i| {
        let c = picks[i] % CUSTOMERS;
        let region = REGIONS[c % REGIONS.len()].to_owned();
        list(
            ledger,
            by_inputs(&[("customer", format!("cust_{c}")), ("region", region)]),
        )
    })
    .await;
    time(
        "list_runs region=<r> AND order_id=<a run's> (wide first)",
        calls,
        |i| {
            let n = picks[i];
            let pairs = [
                ("region", REGIONS[n % 4].to_owned()),
                ("order_id", order_text(n)),
            ];
            list(ledger, by_inputs(&pairs))
        },
    )
    .await;
    time(
        "list_runs id_prefix=<a run's id minus 2 digits>",
        calls,
        |i| {
            let id = run_id(picks[i]);
            let filter = RunFilter {
                limit: 50,
                id_prefix: Some(id[..id.len() - 2].to_owned()),
                ..Default::default()
            };
            list(ledger, filter)
        },
    )
    .await;
    time("list_runs id_prefix=<no run's>", calls.min(20), |_| {
        let filter = RunFilter {
            limit: 50,
            id_prefix: Some("run_x".to_owned()),
            ..Default::default()
        };
        list(ledger, filter)
    })
    .await;
    measure_counts(ledger, &picks, calls).await;
}

/// The `count_runs` figures: without a filter, under a narrow and a wide one.
async fn measure_counts(ledger: &Ledger, picks: &[usize], calls: usize) {
    let counts = |filter: RunFilter| async move {
        let c = ledger.count_runs(&filter).await.expect("count");
        c.iter().map(|(_, n)| *n as usize).sum::<usize>()
    };
    time("count_runs (no filter)", calls.min(50), |_| {
        counts(RunFilter::default())
    })
    .await;
    time("count_runs customer=<one of 500>", calls, |i| {
        counts(by_inputs(&[(
            "customer",
            format!("cust_{}", picks[i] % CUSTOMERS),
        )]))
    })
    .await;
    time("count_runs order_id=<a run's>", calls, |i| {
        counts(by_inputs(&[("order_id", order_text(picks[i]))]))
    })
    .await;
    time(
        "count_runs region=<one of 4> (25% of runs)",
        calls.min(50),
        |i| counts(by_inputs(&[("region", REGIONS[i % 4].to_owned())])),
    )
    .await;
}

/// What a daemon does every 5 s: ANALYZE the tables whose statistics are stale. The
/// server's activity counters lag the commits a little, so it is asked until both
/// tables the reads use have been analyzed (at most 20 s).
async fn refresh_statistics(ledger: &Ledger) -> Vec<String> {
    let started = Instant::now();
    let mut analyzed: Vec<String> = Vec::new();
    while started.elapsed() < Duration::from_secs(20) {
        analyzed.extend(
            ledger
                .refresh_planner_statistics()
                .await
                .expect("statistics"),
        );
        if ["runs", "run_inputs"]
            .iter()
            .all(|t| analyzed.iter().any(|a| a == t))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    analyzed
}

async fn fresh_pg() -> Option<(String, String, String)> {
    let admin = std::env::var("FLOW_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let connect = sqlx::PgConnection::connect(&admin);
    let Ok(Ok(mut conn)) = tokio::time::timeout(Duration::from_secs(5), connect).await else {
        return None;
    };
    let name = format!(
        "flow_bench_{}",
        ulid::Ulid::generate().to_string().to_lowercase()
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .ok()?;
    let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
    Some((format!("{base}/{name}"), admin.clone(), name))
}

async fn drop_pg(admin: &str, name: &str) {
    if let Ok(mut c) = sqlx::PgConnection::connect(admin).await {
        let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
        let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut c).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs = env_or("FLOW_BENCH_RUNS", 100_000);
    let calls = env_or("FLOW_BENCH_QUERIES", 200);
    let only = std::env::var("FLOW_BENCH_ONLY").unwrap_or_default();
    println!("run_search: {runs} runs, {calls} calls per figure (fewer where marked)");
    if only != "postgres" {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}/flow.db", dir.path().display());
        let ledger = Ledger::open(&url, OpenOptions::default())
            .await
            .expect("open sqlite");
        let secs = load(&ledger, &url, runs).await;
        println!(
            "\nsqlite: loaded in {secs:.1} s ({:.0} runs/s)",
            runs as f64 / secs
        );
        measure(&ledger, runs, calls).await;
        ledger.close().await;
    }
    if only == "sqlite" {
        return;
    }
    let Some((url, admin, db)) = fresh_pg().await else {
        println!("\npostgres: SKIPPED (unreachable; set FLOW_TEST_POSTGRES_URL)");
        return;
    };
    let ledger = Ledger::open(&url, OpenOptions::default())
        .await
        .expect("open postgres");
    let secs = load(&ledger, &url, runs).await;
    let analyzed = refresh_statistics(&ledger).await;
    println!(
        "\npostgres: loaded in {secs:.1} s ({:.0} runs/s); analyzed {analyzed:?}",
        runs as f64 / secs
    );
    measure(&ledger, runs, calls).await;
    ledger.close().await;
    drop_pg(&admin, &db).await;
}
