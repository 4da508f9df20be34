//! Event delivery end to end (issue 7): a real webhook server started here, the real
//! `flow` binary as the dispatcher (killed with SIGKILL mid-delivery), an in-process
//! dispatcher on a test clock for the exact backoff schedule and the attempt cap, and the
//! crash points of the gateway for "no event without its state change" — on both
//! backends.
//!
//! `hook`: the webhook receiver; `delivery`: retries, SIGKILL, the schedule and the cap,
//! dead letters; `integrity`: signatures, shapes and secrets, crash points vs events,
//! `tail`.

mod daemon;
mod delivery;
mod hook;
mod integrity;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use flow_ledger::{EventType, Ledger, OpenOptions, Timestamp};
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

use crate::support::{TestDb, output, run_id, stderr, stdout};

const HOOK_SECRET: &str = "whsec_9f2Kq7LmX1";

/// HMAC-SHA256 of `body`, computed here with the `hmac` crate, not flow's code.
fn expected_signature(secret: &str, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

fn webhook_toml(url: &str, events: &str, extra: &str) -> String {
    format!(
        "[[consumers]]\nname = \"ops-webhook\"\nkind = \"webhook\"\nurl = \"{url}\"\nsecret_name = \"WEBHOOK\"\nevents = {events}\ntimeout = \"2s\"\n{extra}"
    )
}

/// `flow` for this test with the config and the webhook secret.
fn flow_with(db: &TestDb, config: &std::path::Path) -> std::process::Command {
    let mut cmd = db.flow();
    cmd.env("FLOW_CONFIG", config)
        .env("FLOW_SECRET_WEBHOOK", HOOK_SECRET);
    cmd
}

/// Starts `flow events dispatch` in the background.
fn spawn_dispatcher(db: &TestDb, config: &std::path::Path) -> Child {
    flow_with(db, config)
        .args(["events", "dispatch", "--poll-interval", "50ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn flow events dispatch")
}

fn deliveries(db: &TestDb, args: &[&str]) -> Vec<Value> {
    let out = output(db.flow().arg("events").args(args).arg("--json"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_slice::<Vec<Value>>(&out.stdout)
        .unwrap_or_else(|e| panic!("flow events --json ({e}): {}", stdout(&out)))
}

fn run_hello(db: &TestDb) -> String {
    let out = output(
        db.flow()
            .args(["run"])
            .arg(crate::support::repo().join("workflows/hello.yaml")),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    run_id(&out)
}

fn sigterm(child: &mut Child) -> std::process::Output {
    let pid = child.id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let start = Instant::now();
    while matches!(child.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    let status = child.wait().expect("wait");
    std::process::Output {
        status,
        stdout: Vec::new(),
        stderr: err.into_bytes(),
    }
}

/// Opens the test's ledger in this process.
fn open(rt: &tokio::runtime::Runtime, db: &TestDb) -> Ledger {
    rt.block_on(Ledger::open(&db.url, OpenOptions::default()))
        .expect("open ledger")
}

/// `{id: evt_<ULID>, type, time (RFC 3339 UTC), tenant, workspace, run_id, step_id,
/// tool_call_id, payload (an object)}`.
fn check_shape(e: &Value) {
    let id = e["id"].as_str().unwrap_or_default();
    let ulid = id.strip_prefix("evt_").unwrap_or_default();
    assert!(ulid.parse::<ulid::Ulid>().is_ok(), "id {id}");
    assert!(
        EventType::parse(e["type"].as_str().unwrap_or_default()).is_some(),
        "{e}"
    );
    let time = e["time"].as_str().unwrap_or_default();
    assert!(
        Timestamp::parse_rfc3339(time).is_some() && time.ends_with('Z'),
        "{e}"
    );
    assert_eq!(e["tenant"], "default");
    assert_eq!(e["workspace"], "default");
    assert!(
        e["run_id"].as_str().is_some_and(|r| r.starts_with("run_")),
        "{e}"
    );
    assert!(e["payload"].is_object(), "{e}");
    for key in ["step_id", "tool_call_id"] {
        assert!(e[key].is_null() || e[key].is_string(), "{e}");
    }
}
