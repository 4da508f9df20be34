//! What the benchmark programs share: the machine's fsync floor they print beside their
//! figures, their runtime, `FLOW_BENCH_*` knobs, the PostgreSQL server they use and the
//! chain workflow. (A folder with `mod.rs`, so Cargo does not take it for a benchmark of
//! its own.)

// Each program includes this module and uses part of it.
#![allow(dead_code)]

use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection;

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

/// Reads a serving `flow`'s stderr (piped) until it names its address — `flow serve`'s
/// "listening on URL" or `flow daemon --serve`'s "API at URL/api/v1" — and returns the
/// base URL; the rest of stderr is drained on a thread so the child never blocks on it.
pub fn api_base(child: &mut Child) -> String {
    use std::io::{BufRead, BufReader};
    let mut lines = BufReader::new(child.stderr.take().expect("stderr piped")).lines();
    let base = loop {
        let line = lines.next().expect("flow exited").expect("stderr line");
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
        }
        if let Some(rest) = line.split("API at ").nth(1) {
            let api = rest.split_whitespace().next().unwrap_or_default();
            break api.trim_end_matches("/api/v1").to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    base
}

/// Waits (at most 10 minutes) until `n` runs of `ledger` succeeded; returns the first
/// `started_at` and the last `finished_at` (ms) of its runs, the span a rate is taken over.
pub async fn wait_succeeded(ledger: &flow_ledger::Ledger, n: usize) -> (i64, i64) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let counts = ledger.count_runs_by_status().await.expect("count");
        let done = counts
            .iter()
            .find(|(s, _)| *s == flow_ledger::RunStatus::Succeeded)
            .map_or(0, |(_, c)| *c);
        if usize::try_from(done).unwrap_or(0) >= n {
            break;
        }
        assert!(Instant::now() < deadline, "{done} of {n} runs after 10 min");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all = ledger
        .list_runs(flow_ledger::RunFilter {
            limit: u32::MAX,
            ..Default::default()
        })
        .await
        .expect("list");
    let first = all.iter().filter_map(|r| r.started_at).map(|t| t.0).min();
    let last = all.iter().filter_map(|r| r.finished_at).map(|t| t.0).max();
    (first.unwrap_or(0), last.unwrap_or(0))
}

/// The one-node workflow of the queue benchmarks (its input `i` keeps runs apart).
pub const ONE_NODE: &str = "name: one\ninputs:\n  i: { type: integer, required: true }\ntools:\n  e: { kind: function, function: core.echo }\nnodes:\n  echo: { tool: e, with: { i: \"${{ inputs.i }}\" } }\n";

/// Run `<prefix>-<i>` of [`ONE_NODE`], to enqueue through the library.
pub fn one_node_run(prefix: &str, i: usize) -> flow_ledger::NewRun {
    flow_ledger::NewRun {
        id: format!("{prefix}-{i:06}"),
        workflow_name: "one".into(),
        workflow_text: ONE_NODE.into(),
        inputs: serde_json::json!({ "i": i }),
        priority: 0,
        not_before: None,
        trace_parent: None,
    }
}

/// Submits runs `api-<i>` of [`ONE_NODE`] for each `i` of `range` in one
/// `POST /api/v1/runs:batch` to `base` (with `token` when the server wants one).
pub async fn submit_one_node_batch(
    client: &reqwest::Client,
    base: &str,
    token: Option<&str>,
    range: std::ops::Range<usize>,
) {
    let list: Vec<_> = range
        .map(|i| serde_json::json!({"workflow": ONE_NODE, "inputs": {"i": i}, "run_id": format!("api-{i:06}")}))
        .collect();
    let mut request = client.post(format!("{base}/api/v1/runs:batch"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let resp = request
        .json(&serde_json::json!({ "runs": list }))
        .send()
        .await
        .expect("submit");
    assert!(
        resp.status().is_success(),
        "{}",
        resp.text().await.unwrap_or_default()
    );
}

/// A fresh PostgreSQL database: `(url, admin url, name)`, or `None` when the server
/// does not answer.
pub async fn fresh_pg() -> Option<(String, String, String)> {
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

pub async fn drop_pg(admin: &str, name: &str) {
    if let Ok(mut c) = sqlx::PgConnection::connect(admin).await {
        let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
        let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut c).await;
    }
}

/// Runs `f` and always drops the database named, also when `f` panics.
pub async fn on_fresh_pg<F, Fut>(f: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some((url, admin, db)) = fresh_pg().await else {
        println!("\npostgres: SKIPPED (unreachable; set FLOW_TEST_POSTGRES_URL)");
        return;
    };
    let outcome = tokio::spawn(f(url)).await;
    drop_pg(&admin, &db).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Claims the `charge` call (tool `pay`, key `<run>:charge`) of the run `run` holds
/// with `request`, sends it and loses the answer: the call is in doubt, as a worker
/// leaves it after a timeout. Its lease.
pub async fn send_and_lose(
    ledger: &flow_ledger::Ledger,
    run: &flow_ledger::RunLease,
    request: serde_json::Value,
) -> Result<flow_ledger::CallLease, flow_ledger::Error> {
    use flow_ledger::Clock as _;
    let now = || flow_ledger::SystemClock.now();
    let claim = flow_ledger::ClaimCall {
        run,
        step_id: "charge".into(),
        tool_call_id: "charge".into(),
        tool: "pay".into(),
        idempotency_key: format!("{}:charge", run.run_id),
        request_hash: flow_ledger::canonical_hash(&request),
        request,
        retry_failed: false,
        lease: Duration::from_secs(3_600),
    };
    let flow_ledger::CallClaim::Claimed(lease) = ledger.claim_call(claim, now()).await? else {
        panic!("run {}: its call was not new", run.run_id);
    };
    ledger.mark_outbound(&lease, now()).await?;
    let report = flow_ledger::InDoubtReport {
        requests_sent: 1,
        message: "timed out after 30s waiting for the response".into(),
    };
    ledger.mark_in_doubt(&lease, report, now()).await?;
    Ok(lease)
}
