//! A daemon whose wall clock is wrong judges leases and queued runs by the PostgreSQL
//! server's clock (`flow_ledger::SystemClock` anchored by `Ledger::anchor_clock`), not
//! its own. Before, a daemon 5 minutes ahead took a healthy daemon's live run over
//! within a second (its call in doubt, the run paused for a human), and one 5 minutes
//! behind claimed nothing. The skewed daemon runs under libfaketime (`faketime`, which
//! `.ci/test` installs); SQLite has no server clock (its processes share one host's).

use std::time::Duration;

use flow_adapters::testkit::http::{Behavior, CountingServer};

use super::{Daemon, submit, wait_until};
use crate::support::{Backend, TestDb, call, postgres_available, runtime, show};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// `slow` (held at the downstream) then `next`.
fn workflow(url: &str) -> String {
    format!(
        r#"name: skewed
tools:
  post: {{ kind: http, method: POST, url: "{url}/${{{{ with.path }}}}", timeout: 30s }}
nodes:
  slow: {{ tool: post, with: {{ path: slow }} }}
  next: {{ tool: post, needs: [slow], with: {{ path: next }} }}
"#
    )
}

/// The environment that sets a daemon's clocks `offset` off (`+5m`, `-5m`).
fn skewed(offset: &str) -> [(&'static str, String); 3] {
    [
        ("LD_PRELOAD", LIBFAKETIME.to_string()),
        ("FAKETIME", offset.to_string()),
        // tokio's timers and the lease windows run on the monotonic clock.
        ("DONT_FAKE_MONOTONIC", "1".to_string()),
    ]
}

/// Whether the test can run here; in CI it must.
fn runnable() -> bool {
    let faketime = std::path::Path::new(LIBFAKETIME).exists();
    let ci = flow_adapters::testkit::flags::ci();
    assert!(
        !ci || (faketime && postgres_available()),
        "CI needs libfaketime ({LIBFAKETIME}, .ci/test installs it) and PostgreSQL"
    );
    if !faketime || !postgres_available() {
        eprintln!("skipped: needs libfaketime at {LIBFAKETIME} and PostgreSQL");
    }
    faketime && postgres_available()
}

#[test]
fn a_daemon_five_minutes_ahead_does_not_take_a_live_run_over() {
    if !runnable() {
        return;
    }
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    down.set("/slow", Behavior::hold(Duration::from_secs(6)));
    let db = TestDb::new(Backend::Postgres);
    let file = db.write("skewed.yaml", &workflow(&down.url()));
    let run = submit(&db, &file);

    let honest = Daemon::start(&db, "honest", &["--poll-interval", "100ms"], &[]);
    let key = format!("{run}:slow:1");
    wait_until(
        Duration::from_secs(30),
        "the honest daemon sends slow",
        || down.count(&key) == 1,
    );
    let env = skewed("+5m");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let ahead = Daemon::start(&db, "ahead", &["--poll-interval", "100ms"], &env);
    wait_until(Duration::from_secs(40), "the run finishes", || {
        show(&db, &run)["run"]["status"] == "succeeded"
    });
    let s = show(&db, &run);
    assert_eq!(call(&s, "slow")["status"], "succeeded", "{s:#}");
    assert_eq!(down.count(&key), 1, "slow was sent once");
    assert_eq!(down.count(&format!("{run}:next:1")), 1);
    let said = ahead.log();
    assert!(
        said.contains("ahead of the database server's"),
        "the skewed daemon reports its skew:\n{said}"
    );
    drop((honest, ahead));
}

#[test]
fn a_daemon_five_minutes_behind_still_claims() {
    if !runnable() {
        return;
    }
    let rt = runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(Backend::Postgres);
    let file = db.write("skewed.yaml", &workflow(&down.url()));
    let env = skewed("-5m");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let behind = Daemon::start(&db, "behind", &["--poll-interval", "100ms"], &env);
    let run = submit(&db, &file);
    wait_until(Duration::from_secs(30), "the behind daemon runs it", || {
        show(&db, &run)["run"]["status"] == "succeeded"
    });
    assert!(
        behind.log().contains("behind the database server's"),
        "{}",
        behind.log()
    );
}

/// A daemon an hour ahead fires a schedule by the server's clock: every tick it starts
/// is at or before the real now, none is recorded `missed`, and the ticks keep coming
/// at the schedule's pace. Before, at +1 h a daemon fired runs an hour early, recorded
/// thousands of future ticks `missed` and moved the cursor past now.
#[test]
fn a_daemon_an_hour_ahead_fires_no_tick_early_and_misses_none() {
    if !runnable() {
        return;
    }
    let db = TestDb::new(Backend::Postgres);
    db.write(
        "w.yaml",
        "name: tick\ninputs:\n  at: { type: string, required: true }\ntools:\n  echo: { kind: function, function: core.echo }\nnodes:\n  a: { tool: echo, with: { at: \"${{ inputs.at }}\" } }\n",
    );
    db.write(
        "flow.toml",
        "[[schedules]]\nid = \"every\"\nworkflow = \"w.yaml\"\ncron = \"*/2 * * * * *\"\ninputs = { at = \"${{ schedule.time }}\" }\n",
    );
    let env = skewed("+1h");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let ahead = Daemon::start(&db, "ahead", &["--poll-interval", "100ms"], &env);
    wait_until(Duration::from_secs(30), "two ticks started", || {
        crate::schedules::history(&db)
            .iter()
            .filter(|e| e.0 == "started")
            .count()
            >= 2
    });
    drop(ahead);
    let now = flow_ledger::Clock::now(&flow_ledger::SystemClock);
    let h = crate::schedules::history(&db);
    for (outcome, tick, _, _) in &h {
        assert_ne!(outcome, "missed", "no tick is missed: {h:?}");
        let at = flow_ledger::Timestamp::parse_rfc3339(tick).expect("tick time");
        assert!(at <= now, "tick {tick} is not in the future: {h:?}");
    }
}

/// A daemon an hour ahead fires the timers of holds by the server's clock: a wait begun
/// by an honest process with a 3-second timeout times out (the watcher runs), while a
/// wait and an approval with 30-minute timeouts stay pending. Judged by its own clock
/// the daemon would time both out at once — an hour past a deadline that is 30 minutes
/// away — and fail the run.
#[test]
fn a_daemon_an_hour_ahead_times_out_no_hold_early() {
    if !runnable() {
        return;
    }
    let db = TestDb::new(Backend::Postgres);
    let file = db.write(
        "holds.yaml",
        r#"name: skewed-holds
tools:
  notify: { kind: command, command: ["true"], timeout: 10s }
nodes:
  short:
    wait: { event: { name: never.short }, timeout: 3s, on_timeout: skip }
  long:
    wait: { event: { name: never.long }, timeout: 30m, on_timeout: fail }
  gate:
    tool: notify
    approval: { approvers: { roles: [operator] }, timeout: 30m, on_timeout: fail }
"#,
    );
    // An honest process begins the holds (their deadlines by the true time) and pauses.
    let out = crate::support::output(db.flow().arg("run").arg(&file));
    assert_eq!(
        out.status.code(),
        Some(3),
        "paused: {}",
        crate::support::stderr(&out)
    );
    let run = crate::support::run_id(&out);
    let s = show(&db, &run);
    assert_eq!(s["run"]["status"], "paused", "{s:#}");

    let env = skewed("+1h");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let ahead = Daemon::start(&db, "ahead", &["--poll-interval", "100ms"], &env);
    let wait_of = |s: &serde_json::Value, node: &str| {
        s["waits"]
            .as_array()
            .and_then(|w| w.iter().find(|w| w["node"] == node).cloned())
            .unwrap_or_default()
    };
    wait_until(Duration::from_secs(30), "the 3 s wait times out", || {
        let s = show(&db, &run);
        wait_of(&s, "short")["status"] == "timed_out" && s["run"]["status"] == "paused"
    });
    // Two more turns of the watcher (every 2 s) under the skewed clock.
    std::thread::sleep(Duration::from_secs(5));
    let s = show(&db, &run);
    drop(ahead);
    assert_eq!(s["run"]["status"], "paused", "{s:#}");
    assert_eq!(wait_of(&s, "long")["status"], "pending", "{s:#}");
    assert_eq!(s["approvals"][0]["status"], "pending", "{s:#}");
}
