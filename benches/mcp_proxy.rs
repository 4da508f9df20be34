//! Benchmark: what flow's MCP proxy adds to one `tools/call` (issue 51).
//!
//! `cargo bench --bench mcp_proxy`. One MCP client (rmcp, one session, calls one after
//! another) calls the `count` tool of flow's MCP test server (Streamable HTTP on
//! loopback) `FLOW_BENCH_CALLS` times (default 300), each with a new key:
//! - **direct**: to the server itself;
//! - **through the proxy**: to `/mcp` of a `flow daemon --serve` proxying that server
//!   (`[[mcp.servers]]`), on SQLite (`synchronous=FULL`) and on PostgreSQL (skipped when
//!   unreachable). Each call there is a run: enqueue, claim, outbound mark, forward,
//!   outcome, answer.
//!
//! It prints p50 and p99 of each, the proxy's added p50, and beside them the machine's
//! floor for the two commits a call needs at least (the outbound mark before, the outcome
//! after): two fsyncs on SQLite, two commit round trips on PostgreSQL.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::json;

/// The operator token `/mcp` is served with.
const TOKEN: &str = "bench-agent-token";

/// p50 and p99 of `samples`.
fn quantiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99))
}

/// `n` sequential `count` calls (`tool`) on one session to `url`; their latencies.
async fn calls(url: &str, token: Option<&str>, tool: &str, n: usize, tag: &str) -> Vec<Duration> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    if let Some(t) = token {
        config = config.auth_header(t.to_owned());
    }
    let transport = StreamableHttpClientTransport::from_config(config);
    let client = ().serve(transport).await.expect("MCP session");
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let args = json!({"key": format!("{tag}-{i}")});
        let serde_json::Value::Object(args) = args else {
            unreachable!()
        };
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        let mut meta = rmcp::model::MetaObject::new();
        meta.insert(
            "io.flow/idempotency-key".into(),
            json!(format!("{tag}-{i}")),
        );
        params.meta = Some(meta.into());
        let t = Instant::now();
        let r = client.call_tool(params).await.expect("tools/call");
        out.push(t.elapsed());
        assert_ne!(r.is_error, Some(true), "{r:?}");
    }
    let _ = client.cancel().await;
    out
}

/// A `flow daemon --serve` on `db` proxying the server at `mcp_url`; its base URL.
fn proxy(db: &str, mcp_url: &str, dir: &std::path::Path) -> (Child, String) {
    let config = dir.join("flow.toml");
    let text = format!(
        "[[api.tokens]]\nname = \"agent\"\nrole = \"operator\"\nsecret = \"AGENT\"\n\n\
         [[mcp.servers]]\nname = \"kit\"\nserver = {{ url = \"{mcp_url}\" }}\ntimeout = \"10s\"\n"
    );
    std::fs::write(&config, text).expect("flow.toml");
    let log = dir.join("flow.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_flow"))
        .env("FLOW_DATABASE_URL", db)
        .env("FLOW_SECRET_AGENT", TOKEN)
        .env_remove("RUST_LOG")
        .arg("--config")
        .arg(&config)
        .args(["daemon", "--poll-interval", "1s", "--serve", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn flow");
    for _ in 0..400 {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(rest) = text.split("API at ").nth(1) {
            let api = rest.split_whitespace().next().unwrap_or_default();
            return (child, api.trim_end_matches("/api/v1").to_owned());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!(
        "flow did not start: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// One line of figures; with `direct_p50`, what the proxy adds to it.
fn line(name: &str, samples: Vec<Duration>, direct_p50: Option<Duration>) -> Duration {
    let (p50, p99) = quantiles(samples);
    let added = direct_p50.map_or(String::new(), |d| {
        format!(
            "   added p50 {:>6.2} ms",
            p50.saturating_sub(d).as_secs_f64() * 1e3
        )
    });
    println!(
        "  {name:<28} p50 {:>7.2} ms   p99 {:>7.2} ms{added}",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
    );
    p50
}

/// The median of 200 `SELECT 1` commits (`BEGIN; … COMMIT`) on PostgreSQL at `url`.
async fn pg_commit_floor(url: &str) -> Duration {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.expect("pg");
    let mut samples = Vec::with_capacity(200);
    for _ in 0..200 {
        let t = Instant::now();
        let mut tx = c.begin().await.expect("begin");
        sqlx::query("SELECT 1")
            .execute(&mut *tx)
            .await
            .expect("select");
        tx.commit().await.expect("commit");
        samples.push(t.elapsed());
    }
    quantiles(samples).0
}

fn main() {
    let n = common::env_usize("FLOW_BENCH_CALLS", 300);
    let rt = common::runtime();
    let server = rt
        .block_on(flow_adapters::testkit::mcp::HttpServer::start(None))
        .expect("MCP test server");
    let mcp_url = server.url();
    let dir = tempfile::tempdir().expect("tempdir");
    println!("mcp_proxy: {n} sequential tools/call, one session, a new key each");
    // Warm both paths before measuring (sessions, connection pools, the page cache).
    let direct = rt.block_on(async {
        calls(&mcp_url, None, "count", 20, "warm").await;
        calls(&mcp_url, None, "count", n, "direct").await
    });
    let direct_p50 = line("direct", direct, None);

    let fsync = common::fsync_floor(dir.path());
    let sqlite = format!("sqlite://{}/bench.db", dir.path().display());
    let (mut child, base) = proxy(&sqlite, &mcp_url, dir.path());
    let proxied = rt.block_on(async {
        let url = format!("{base}/mcp");
        calls(&url, Some(TOKEN), "kit__count", 20, "warm-s").await;
        calls(&url, Some(TOKEN), "kit__count", n, "sqlite").await
    });
    let _ = child.kill();
    let _ = child.wait();
    line("proxy, SQLite", proxied, Some(direct_p50));
    println!(
        "  {:<28} {:>7.2} ms (two fsyncs of 512 B)",
        "floor, SQLite",
        (fsync * 2).as_secs_f64() * 1e3
    );

    // The proxy is started from this thread, not inside the runtime: the test server
    // runs on the runtime and must answer the proxy's listing meanwhile.
    let Some((url, admin, name)) = rt.block_on(common::fresh_pg()) else {
        println!("  postgres: SKIPPED (unreachable; set FLOW_TEST_POSTGRES_URL)");
        return;
    };
    let floor = rt.block_on(pg_commit_floor(&url));
    let pg_dir = tempfile::tempdir().expect("tempdir");
    let (mut child, base) = proxy(&url, &mcp_url, pg_dir.path());
    let proxied = rt.block_on(async {
        let api = format!("{base}/mcp");
        calls(&api, Some(TOKEN), "kit__count", 20, "warm-p").await;
        calls(&api, Some(TOKEN), "kit__count", n, "pg").await
    });
    let _ = child.kill();
    let _ = child.wait();
    line("proxy, PostgreSQL", proxied, Some(direct_p50));
    println!(
        "  {:<28} {:>7.2} ms (two commit round trips)",
        "floor, PostgreSQL",
        (floor * 2).as_secs_f64() * 1e3
    );
    rt.block_on(common::drop_pg(&admin, &name));
}
