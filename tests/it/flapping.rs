//! A flapping downstream: it accepts a POST, lets the effect happen, resets the
//! connection without answering, refuses connections for a while, may answer 503 once
//! it is back, then recovers. Whatever the timings, one effect attempt keeps one key: a
//! request that left once can never become "not sent" again.
//!
//! The downstream here is a raw TCP server (not the counting HTTP server) because it
//! must close its listening socket to refuse connections and reset connections with
//! `SO_LINGER 0`; it counts every request that arrived, per `Idempotency-Key`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Notify;

use crate::support::{Backend, TestDb, backends, output, run_id, runtime, show, stderr};

/// How one flapping episode goes.
#[derive(Debug, Clone, Copy)]
struct Script {
    /// Requests that arrive, take effect and get their connection reset.
    resets: u32,
    /// How long connections are refused after each reset.
    refuse: Duration,
    /// Requests answered 503 once connections are accepted again.
    unavailable: u32,
}

/// Keys of the requests that arrived, in order.
type Arrivals = Arc<Mutex<Vec<String>>>;

fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(64)
}

/// Reads one HTTP/1.1 request (head and `Content-Length` body); its idempotency key.
async fn read_request(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let header = |name: &str| {
            head.lines().find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_string())
            })
        };
        let length: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < end + 4 + length {
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        return Some(header("idempotency-key").unwrap_or_default());
    }
}

/// Serves `script` on `addr`, recording every arrival in `arrivals`. A refusal window
/// ends after `script.refuse` or as soon as `reopen` is notified, whichever is first: a
/// test that must know the downstream is still down (or back) says so instead of racing
/// a clock on a loaded machine.
async fn flap(addr: SocketAddr, script: Script, arrivals: Arrivals, reopen: Arc<Notify>) {
    let mut resets = 0;
    let mut unavailable = 0;
    'serve: loop {
        let listener = match listen(addr) {
            Ok(l) => l,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let Some(key) = read_request(&mut stream).await else {
                continue;
            };
            arrivals.lock().expect("arrivals").push(key.clone());
            if resets < script.resets {
                // The effect happened; the answer never comes.
                resets += 1;
                let _ = stream.set_zero_linger();
                drop(stream);
                drop(listener);
                tokio::select! {
                    () = tokio::time::sleep(script.refuse) => {}
                    () = reopen.notified() => {}
                }
                continue 'serve;
            }
            let (status, body) = if unavailable < script.unavailable {
                unavailable += 1;
                (
                    "503 Service Unavailable",
                    "{\"error\":\"busy\"}".to_string(),
                )
            } else {
                ("200 OK", format!("{{\"charged\":true,\"key\":\"{key}\"}}"))
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    }
}

fn workflow(url: &str, idempotency: &str, initial_ms: u64) -> String {
    format!(
        r#"name: flap
defaults: {{ timeout: 10s, retry_policy: {{ max_retries: 2, backoff: {{ initial: {initial_ms}ms, max: 2s, multiplier: 2, jitter: 0 }} }} }}
tools:
  charge: {{ kind: http, method: POST, url: "{url}/charge"{idempotency} }}
nodes:
  charge: {{ tool: charge, with: {{ amount: 100 }} }}
"#
    )
}

/// One run against one flapping episode; returns what the downstream saw per key.
fn episode(
    backend: Backend,
    header: bool,
    script: Script,
    initial_ms: u64,
) -> (Option<i32>, BTreeMap<String, u32>, String) {
    let rt = runtime();
    let addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        probe.local_addr().expect("addr")
    };
    let arrivals: Arrivals = Arc::default();
    let server = rt.spawn(flap(addr, script, arrivals.clone(), Arc::default()));
    let db = TestDb::new(backend);
    let idempotency = if header { ", idempotency: header" } else { "" };
    let file = db.write(
        "flap.yaml",
        &workflow(&format!("http://{addr}"), idempotency, initial_ms),
    );
    let out = output(db.flow().arg("run").arg(&file));
    server.abort();
    let mut per_key = BTreeMap::new();
    for key in arrivals.lock().expect("arrivals").iter() {
        *per_key.entry(key.clone()).or_insert(0) += 1;
    }
    let run = run_id(&out);
    let status = show(&db, &run)["run"]["status"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let _ = stderr(&out);
    (out.status.code(), per_key, status)
}

/// The issue's reproduction, fixed timings: a reset, a second of refusals, recovery.
#[test]
fn a_reset_then_refused_connections_never_change_the_key() {
    for backend in backends() {
        let script = Script {
            resets: 1,
            refuse: Duration::from_millis(1_000),
            unavailable: 0,
        };
        let (code, per_key, status) = episode(backend, true, script, 500);
        assert_eq!(
            per_key.len(),
            1,
            "{backend:?}: one effect attempt, one key; the downstream saw {per_key:?} (exit {code:?}, run {status})"
        );
        assert!(
            per_key.keys().all(|k| k.ends_with(":charge:1")),
            "{per_key:?}"
        );
        assert!(
            matches!(
                (code, status.as_str()),
                (Some(0), "succeeded") | (Some(3), "paused")
            ),
            "{backend:?}: exit {code:?}, run {status}"
        );
    }
}

/// Random timings, both side-effect classes: never two keys for one effect attempt
/// sequence, and no key twice unless the tool is `idempotency: header`.
#[test]
fn a_flapping_downstream_never_sees_two_keys_for_one_effect() {
    let seed: u64 = std::env::var("FLOW_FLAP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("FLOW_FLAP_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cases = Vec::new();
    for backend in backends() {
        let rounds = if backend == Backend::Sqlite { 20 } else { 6 };
        for header in [true, false] {
            for _ in 0..rounds {
                let script = Script {
                    resets: rng.random_range(1..=2),
                    refuse: Duration::from_millis(rng.random_range(50..1_500)),
                    unavailable: rng.random_range(0..=1),
                };
                cases.push((backend, header, script, rng.random_range(100..600)));
            }
        }
    }
    let cases = Arc::new(Mutex::new(cases));
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let summary: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let cases = cases.clone();
            let failures = failures.clone();
            let summary = summary.clone();
            scope.spawn(move || {
                loop {
                    let Some((backend, header, script, initial)) =
                        cases.lock().expect("cases").pop()
                    else {
                        return;
                    };
                    let (code, per_key, status) = episode(backend, header, script, initial);
                    let what = format!(
                        "{backend:?} header={header} {script:?} initial={initial}ms: exit {code:?}, run {status}, downstream saw {per_key:?}"
                    );
                    *summary
                        .lock()
                        .expect("summary")
                        .entry(format!("header={header} {status}"))
                        .or_default() += 1;
                    let mut wrong = Vec::new();
                    if per_key.len() != 1 {
                        wrong.push("more than one key for one effect attempt sequence");
                    }
                    if !header && per_key.values().any(|n| *n > 1) {
                        wrong.push("a key sent twice by a tool that is not idempotency: header");
                    }
                    if !header && status != "paused" {
                        wrong.push("a reset request of a side-effecting tool must go in doubt");
                    }
                    if !matches!(
                        (code, status.as_str()),
                        (Some(0), "succeeded") | (Some(3), "paused")
                    ) {
                        wrong.push("the run must succeed or pause in doubt");
                    }
                    if !wrong.is_empty() {
                        failures
                            .lock()
                            .expect("failures")
                            .push(format!("{what}: {}", wrong.join("; ")));
                    }
                }
            });
        }
    });
    eprintln!("outcomes: {:?}", summary.lock().expect("summary"));
    let failures = failures.lock().expect("failures");
    assert!(
        failures.is_empty(),
        "seed {seed}: {} episodes broke the rule:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The same rule across processes: a header-idempotent call whose process died after a
/// reset send is found in doubt by `flow resume` and re-sent under its own key; while
/// the downstream still refuses connections it stays in doubt (never a new attempt), and
/// once it is back an operator's `retry` settles it with that same key.
#[test]
fn resume_of_a_reset_call_keeps_its_key_while_the_downstream_is_down() {
    for backend in backends() {
        let rt = runtime();
        let addr = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            probe.local_addr().expect("addr")
        };
        let arrivals: Arrivals = Arc::default();
        // Down for a minute unless told to come back: the resume below must meet a
        // downstream that is still down however slow the machine is.
        let script = Script {
            resets: 1,
            refuse: Duration::from_secs(60),
            unavailable: 0,
        };
        let reopen: Arc<Notify> = Arc::default();
        let server = rt.spawn(flap(addr, script, arrivals.clone(), reopen.clone()));
        let db = TestDb::new(backend);
        let file = db.write(
            "flap.yaml",
            &workflow(&format!("http://{addr}"), ", idempotency: header", 100)
                .replace("max_retries: 2", "max_retries: 1"),
        );
        // Dies after the sends, before their outcome is recorded: the call is left
        // `outbound`.
        let crashed = output(
            db.flow()
                .arg("run")
                .arg(&file)
                .env("FLOW_FAULT", "after_response:charge"),
        );
        assert_ne!(
            crashed.status.code(),
            Some(0),
            "{backend:?}: the fault point must fire"
        );
        let run = run_id(&crashed);
        let resumed = output(db.flow().arg("resume").arg(&run));
        assert_eq!(
            resumed.status.code(),
            Some(3),
            "{backend:?}: a refused re-send keeps the call in doubt: {}",
            stderr(&resumed)
        );
        assert_eq!(
            arrivals.lock().expect("arrivals").len(),
            1,
            "{backend:?}: only the reset send arrived while the downstream was down"
        );
        // Back up: wait until a connection is accepted before the operator retries.
        reopen.notify_one();
        let back = std::time::Instant::now();
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                back.elapsed() < Duration::from_secs(10),
                "{backend:?}: the downstream never came back"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let last = output(
            db.flow()
                .arg("resume")
                .arg(&run)
                .args(["--resolve", "charge=retry"]),
        );
        let keys: Vec<String> = arrivals.lock().expect("arrivals").clone();
        server.abort();
        assert!(
            keys.iter().all(|k| k == &format!("{run}:charge:1")),
            "{backend:?}: one effect attempt, one key: {keys:?}"
        );
        assert_eq!(
            keys.len(),
            2,
            "{backend:?}: the reset send and the settling one"
        );
        let s = show(&db, &run);
        assert_eq!(
            (last.status.code(), s["run"]["status"].as_str()),
            (Some(0), Some("succeeded")),
            "{backend:?}: {}\n{s:#}",
            stderr(&last)
        );
    }
}
