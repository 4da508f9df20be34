//! The gateway through the real binary: rate limits and quotas shared by processes,
//! requests counted exactly as the downstream counted them (MCP re-auth included), MCP
//! tools over stdio and streamable HTTP, egress policy.

use std::process::Stdio;
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::{Behavior, CountingServer};
use flow_adapters::testkit::mcp::{AuthOptions, HttpServer};

use crate::support::{
    Backend, TestDb, backends, call, output, repo, run_id, runtime, show, stderr, stdout,
};

/// Waits until the current minute has at least `margin` left, so a per-minute window
/// does not roll over in the middle of a test.
fn away_from_minute_boundary(margin: Duration) {
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let left = Duration::from_secs(60)
            - Duration::from_millis(u64::try_from(now.as_millis() % 60_000).unwrap_or(0));
        if left > margin {
            return;
        }
        std::thread::sleep(left + Duration::from_millis(100));
    }
}

fn limited(url: &str, limit: &str) -> String {
    format!(
        r#"name: limited
tools:
  api: {{ kind: http, method: POST, url: "{url}/api", {limit} }}
nodes:
  one: {{ tool: api }}
  two: {{ tool: api }}
  three: {{ tool: api }}
"#
    )
}

/// Two processes share a per-minute limit (or a daily quota) of 4: exactly 4 requests
/// leave; the rest wait, deferred, without failing and without counting as attempts.
fn shared_limit(backend: Backend, limit: &str) {
    away_from_minute_boundary(Duration::from_secs(20));
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(backend);
    // Create the schema first so the two processes do not race on it.
    assert_eq!(output(db.flow().arg("migrate")).status.code(), Some(0));
    let file = db.write("w.yaml", &limited(&server.url(), limit));
    let spawn = |i: usize| {
        db.flow()
            .arg("run")
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(db.dir.path().join(format!("p{i}.log"))).expect("log"))
            .spawn()
            .expect("spawn")
    };
    let mut a = spawn(1);
    let mut b = spawn(2);
    let started = Instant::now();
    while server.total() < 4 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    let total = server.total();
    let still_running = matches!(a.try_wait(), Ok(None)) || matches!(b.try_wait(), Ok(None));
    let _ = a.kill();
    let _ = b.kill();
    let _ = a.wait();
    let _ = b.wait();
    let logs: String = (1..=2)
        .map(|i| {
            std::fs::read_to_string(db.dir.path().join(format!("p{i}.log"))).unwrap_or_default()
        })
        .collect();
    assert_eq!(
        total, 4,
        "{backend:?} {limit}: exactly the limit may leave\n{logs}"
    );
    assert!(
        still_running,
        "{backend:?} {limit}: the other calls must wait, not fail\n{logs}"
    );
    assert!(
        logs.contains("rate limited; trying again at"),
        "{backend:?}: {logs}"
    );
}

#[test]
fn a_rate_limit_holds_across_two_processes() {
    for backend in backends() {
        shared_limit(backend, "rate_limit: { per_minute: 4 }");
    }
}

#[test]
fn a_daily_quota_holds_across_two_processes() {
    for backend in backends() {
        shared_limit(backend, "quota: { per_day: 4 }");
    }
}

#[test]
fn outbound_requests_equal_what_the_downstream_counted() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    server.set(
        "/api",
        Behavior::FailTimes {
            times: 1,
            status: 500,
        },
    );
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write(
        "w.yaml",
        &format!(
            "name: usage\ntools:\n  api: {{ kind: http, method: POST, url: \"{}/api\" }}\n  get: {{ kind: http, method: GET, url: \"{}/get\" }}\nnodes:\n  post:\n    tool: api\n    retry_policy: {{ max_retries: 2, backoff: {{ initial: 10ms }} }}\n  read: {{ tool: get }}\n",
            server.url(),
            server.url()
        ),
    );
    let out = output(db.flow().arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let s = show(&db, &run_id(&out));
    let post = call(&s, "post");
    let posted = server.log().iter().filter(|r| r.path == "/api").count();
    assert_eq!(post["outbound_requests"], posted, "{s:#}");
    assert_eq!(post["attempt_count"], 2);
    let read = call(&s, "read");
    assert_eq!(read["outbound_requests"], 1);
    assert!(
        server
            .log()
            .iter()
            .any(|r| r.path == "/get" && r.key.is_none()),
        "GET carries no Idempotency-Key"
    );
}

#[test]
fn mcp_reauth_counts_both_requests() {
    let rt = runtime();
    let server = rt
        .block_on(HttpServer::start(Some(AuthOptions::default())))
        .expect("mcp server");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write(
        "w.yaml",
        &format!(
            r#"name: mcp-auth
tools:
  counter:
    kind: mcp
    server: {{ url: "{}" }}
    tool: count
    auth: {{ oauth: {{ token_url: "{}", client_id: flow, client_secret: "${{{{ secrets.MCP_SECRET }}}}" }} }}
nodes:
  tick: {{ tool: counter, with: {{ key: k1 }} }}
"#,
            server.url(),
            server.token_url()
        ),
    );
    let out = output(
        db.flow()
            .arg("run")
            .arg(&file)
            .env("FLOW_SECRET_MCP_SECRET", "flow-secret"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let s = show(&db, &run_id(&out));
    let tick = call(&s, "tick");
    assert_eq!(
        server.http().tool_call_requests(),
        2,
        "challenged once, re-sent once"
    );
    assert_eq!(tick["outbound_requests"], 2, "{s:#}");
    assert_eq!(tick["attempt_count"], 1);
    assert_eq!(server.stats().count("k1"), 1, "the tool ran once");
    assert!(!s.to_string().contains("flow-secret"));
}

#[test]
fn the_mcp_example_runs_over_stdio() {
    let bin = flow_adapters::testkit::bin_path();
    for backend in backends() {
        let db = TestDb::new(backend);
        let out = output(
            db.flow()
                .arg("run")
                .arg(repo().join("workflows/mcp.yaml"))
                .arg("--input")
                .arg(format!("server={}", bin.display())),
        );
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("output JSON");
        assert_eq!(v["notify"]["text"], "deploy finished", "{}", stdout(&out));
        let s = show(&db, &run_id(&out));
        assert_eq!(call(&s, "find")["status"], "succeeded");
    }
}

#[test]
fn egress_outside_the_allow_list_is_refused_before_any_claim() {
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    let db = TestDb::new(Backend::Sqlite);
    let config = db.write("flow.toml", "[egress]\nallow = [\"*.example.com\"]\n");
    let file = db.write("w.yaml", &limited(&server.url(), "timeout: 5s"));
    let out = output(db.flow().arg("--config").arg(&config).arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("egress to `127.0.0.1` is not allowed"),
        "{}",
        stderr(&out)
    );
    assert_eq!(server.total(), 0);
    let s = show(&db, &run_id(&out));
    assert_eq!(s["tool_calls"].as_array().map(Vec::len), Some(0));
    let bad = db.write("bad.toml", "[egress]\nalow = []\n");
    let out = output(db.flow().arg("--config").arg(&bad).arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(5));
    assert!(stderr(&out).contains("alow"), "{}", stderr(&out));
}

/// Every hop of a followed redirect passes the egress allow-list: a POST to an allowed
/// host answered `307 Location: <a host the list refuses>` fails permanently without
/// sending the second hop (its body and key never reach the refused host), and the one
/// request that did leave is counted.
#[test]
fn redirects_do_not_walk_past_the_egress_allow_list() {
    let rt = runtime();
    let allowed = rt.block_on(CountingServer::start()).expect("server");
    let refused = rt.block_on(CountingServer::start()).expect("server");
    let port = allowed.addr().port();
    allowed.set(
        "/start",
        Behavior::Redirect {
            to: format!("{}/x", refused.url()),
            status: 307,
        },
    );
    allowed.set("/next", Behavior::Echo);
    for backend in backends() {
        let db = TestDb::new(backend);
        let config = db.write("flow.toml", "[egress]\nallow = [\"localhost\"]\n");
        let wf = |path: &str| {
            format!(
                r#"name: hop
tools:
  api: {{ kind: http, method: POST, url: "http://localhost:{port}{path}", follow_redirects: true, timeout: 5s }}
nodes:
  charge: {{ tool: api, with: {{ amount: 7 }} }}
"#
            )
        };
        let file = db.write("w.yaml", &wf("/start"));
        let out = output(db.flow().arg("--config").arg(&config).arg("run").arg(&file));
        assert_eq!(out.status.code(), Some(1), "{backend:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("not followed: egress to `127.0.0.1` is not allowed"),
            "{backend:?}: {}",
            stderr(&out)
        );
        assert_eq!(
            refused.total(),
            0,
            "{backend:?}: the refused host saw a request"
        );
        let s = show(&db, &run_id(&out));
        assert_eq!(call(&s, "charge")["outbound_requests"], 1, "{backend:?}");
        assert_eq!(call(&s, "charge")["status"], "failed", "{backend:?}");
    }
    // A redirect within the list is still followed, each hop counted.
    allowed.set(
        "/start",
        Behavior::Redirect {
            to: format!("http://localhost:{port}/next"),
            status: 307,
        },
    );
    let db = TestDb::new(Backend::Sqlite);
    let config = db.write("flow.toml", "[egress]\nallow = [\"localhost\"]\n");
    let file = db.write(
        "w.yaml",
        &format!(
            r#"name: hop
tools:
  api: {{ kind: http, method: POST, url: "http://localhost:{port}/start", follow_redirects: true, timeout: 5s }}
nodes:
  charge: {{ tool: api, with: {{ amount: 7 }} }}
"#
        ),
    );
    let out = output(db.flow().arg("--config").arg(&config).arg("run").arg(&file));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let s = show(&db, &run_id(&out));
    assert_eq!(call(&s, "charge")["outbound_requests"], 2);
}

/// An MCP server's OAuth token endpoint is a host the request reaches (the client
/// secret goes there): it passes the egress allow-list like the server's own URL.
#[test]
fn an_mcp_token_endpoint_outside_the_allow_list_is_refused_before_any_request() {
    let rt = runtime();
    let server = rt
        .block_on(HttpServer::start(Some(AuthOptions::default())))
        .expect("mcp server");
    let db = TestDb::new(Backend::Sqlite);
    let config = db.write("flow.toml", "[egress]\nallow = [\"127.0.0.1\"]\n");
    let token_url = server.token_url().replace("127.0.0.1", "localhost");
    let file = db.write(
        "w.yaml",
        &format!(
            r#"name: mcp-egress
tools:
  counter:
    kind: mcp
    server: {{ url: "{}" }}
    tool: count
    auth: {{ oauth: {{ token_url: "{token_url}", client_id: flow, client_secret: "${{{{ secrets.MCP_SECRET }}}}" }} }}
nodes:
  tick: {{ tool: counter, with: {{ key: k1 }} }}
"#,
            server.url(),
        ),
    );
    let out = output(
        db.flow()
            .arg("--config")
            .arg(&config)
            .arg("run")
            .arg(&file)
            .env("FLOW_SECRET_MCP_SECRET", "flow-secret"),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("egress to `localhost` is not allowed"),
        "{}",
        stderr(&out)
    );
    assert_eq!(server.http().token_requests(), 0, "the secret never left");
    assert_eq!(server.http().requests(), 0);
}

/// A workflow without `name:` is named after its file, and that name keys its tools'
/// quotas. A run a daemon executes is re-read from its stored text: it must count under
/// the same key as `flow run` of the file (before, it was named after the snapshot's
/// label, one bucket per run, and the quota held for nobody).
#[test]
fn a_nameless_workflows_quota_holds_for_the_runs_a_daemon_executes() {
    for backend in backends() {
        let rt = runtime();
        let server = rt.block_on(CountingServer::start()).expect("server");
        let db = TestDb::new(backend);
        assert_eq!(output(db.flow().arg("migrate")).status.code(), Some(0));
        let text = limited(&server.url(), "quota: { per_day: 2 }").replace("name: limited\n", "");
        let file = db.write("nameless.yaml", &text);
        // `flow run` spends the quota (2 of its 3 calls leave; it waits for the third).
        let mut direct = db
            .flow()
            .arg("run")
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let started = Instant::now();
        while server.total() < 2 && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let submitted = output(db.flow().arg("submit").arg(&file));
        assert_eq!(submitted.status.code(), Some(0), "{}", stderr(&submitted));
        let mut daemon = db
            .flow()
            .args(["daemon", "--poll-interval", "50ms"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(db.dir.path().join("daemon.log")).expect("log"))
            .spawn()
            .expect("daemon");
        std::thread::sleep(Duration::from_secs(3));
        let total = server.total();
        for child in [&mut direct, &mut daemon] {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert_eq!(
            total, 2,
            "{backend:?}: the daemon's run counts under the same quota"
        );
    }
}
