//! Flow control through the real binary: a tool's `concurrency:` limit, counted in the
//! ledger across daemons, holds against a downstream that hangs — never more of its
//! calls in flight than the limit (the downstream counts), and the runs waiting for a
//! slot hold no daemon slot, so other workflows' runs go on (head of line). With daemons
//! SIGKILLed mid-call the limit still holds, nothing is sent twice, and once the calls
//! left in doubt are resolved every run finishes (no slot leaked).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::{Behavior, CountingServer};
use flow_ledger::{Ledger, NewRun, RunStatus};

use crate::daemon::{Daemon, open_ledger, wait_until};
use crate::support::{Backend, TestDb, backends, output, postgres_available, runtime, stderr};

/// `notify`: one POST to a downstream that may hang, through a tool limited to `limit`
/// calls in flight.
fn notify(url: &str, limit: u32) -> String {
    format!(
        r#"name: notify
inputs:
  i: {{ type: integer, required: true }}
tools:
  sms: {{ kind: http, method: POST, url: "{url}/sms", timeout: 60s, concurrency: {limit} }}
nodes:
  send: {{ tool: sms, with: {{ i: "${{{{ inputs.i }}}}" }} }}
"#
    )
}

/// `refund`: one POST to a healthy downstream, no limit.
fn refund(url: &str) -> String {
    format!(
        r#"name: refund
inputs:
  i: {{ type: integer, required: true }}
tools:
  pay: {{ kind: http, method: POST, url: "{url}/refund", timeout: 10s }}
nodes:
  refund: {{ tool: pay, with: {{ i: "${{{{ inputs.i }}}}" }} }}
"#
    )
}

fn enqueue(rt: &tokio::runtime::Runtime, ledger: &Ledger, name: &str, text: &str, i: usize) {
    let run = NewRun {
        id: format!("{name}-{i:04}"),
        workflow_name: name.into(),
        workflow_text: text.to_string(),
        inputs: serde_json::json!({ "i": i }),
        priority: 0,
        not_before: None,
        trace_parent: None,
    };
    rt.block_on(ledger.enqueue(run, flow_ledger::Clock::now(&flow_ledger::SystemClock)))
        .expect("enqueue");
}

/// The runs of `workflow` in `status`.
fn count(rt: &tokio::runtime::Runtime, ledger: &Ledger, prefix: &str, status: RunStatus) -> usize {
    let filter = flow_ledger::RunFilter {
        status: Some(status),
        limit: 10_000,
        ..Default::default()
    };
    rt.block_on(ledger.list_runs(filter))
        .expect("list runs")
        .iter()
        .filter(|r| r.id.starts_with(prefix))
        .count()
}

#[test]
fn a_hanging_tool_takes_its_slots_and_no_daemon_slot_from_other_runs() {
    for backend in backends() {
        let rt = runtime();
        let sms = rt.block_on(CountingServer::start()).expect("sms server");
        let pay = rt.block_on(CountingServer::start()).expect("pay server");
        sms.set("*", Behavior::HoldUntilReleased);
        pay.set("*", Behavior::hold(Duration::from_millis(5)));
        let db = TestDb::new(backend);
        let ledger = open_ledger(&rt, &db);
        let (notify, refund) = (notify(&sms.url(), 2), refund(&pay.url()));
        // Twelve runs for the hanging tool first, then the refunds: with four daemon
        // slots, runs that held a slot while waiting for the tool would stall them all.
        for i in 0..12 {
            enqueue(&rt, &ledger, "notify", &notify, i);
        }
        for i in 0..40 {
            enqueue(&rt, &ledger, "refund", &refund, i);
        }
        let args = ["--concurrency", "4", "--poll-interval", "100ms"];
        let daemons: Vec<Daemon> = (0..2)
            .map(|n| Daemon::start(&db, &format!("d{n}"), &args, &[]))
            .collect();
        let started = Instant::now();
        wait_until(Duration::from_secs(60), "every refund succeeded", || {
            count(&rt, &ledger, "refund-", RunStatus::Succeeded) == 40
        });
        let refunds_took = started.elapsed();
        // Meanwhile, exactly the limit's two calls reached the hanging downstream.
        assert_eq!(sms.total(), 2, "{backend:?}: requests to the hanging tool");
        assert_eq!(sms.max_in_flight(), 2, "{backend:?}");
        // The downstream recovers: every waiting call gets its slot in turn.
        sms.set("*", Behavior::hold(Duration::from_millis(20)));
        sms.release();
        wait_until(Duration::from_secs(90), "every notify succeeded", || {
            count(&rt, &ledger, "notify-", RunStatus::Succeeded) == 12
        });
        assert!(
            sms.max_in_flight() <= 2,
            "{backend:?}: {}",
            sms.max_in_flight()
        );
        let keys: Vec<String> = sms.log().into_iter().filter_map(|r| r.key).collect();
        let distinct: HashSet<&String> = keys.iter().collect();
        assert_eq!(
            (keys.len(), distinct.len()),
            (12, 12),
            "{backend:?}: {keys:?}"
        );
        // Nothing holds a slot any more.
        let left = rt
            .block_on(ledger.slot_use(flow_ledger::Clock::now(&flow_ledger::SystemClock)))
            .expect("slots");
        assert!(left.is_empty(), "{backend:?}: {left:?}");
        eprintln!("{backend:?}: 40 refunds beside a hanging tool in {refunds_took:?}");
        drop(daemons);
    }
}

/// Three daemons on PostgreSQL drain runs of a tool limited to 3 calls in flight while
/// one of them is SIGKILLed and restarted, again and again, at random moments.
#[test]
fn the_limit_holds_across_daemons_killed_at_random() {
    if !postgres_available() {
        eprintln!("skipped: no PostgreSQL");
        return;
    }
    let rt = runtime();
    let sms = rt.block_on(CountingServer::start()).expect("sms server");
    sms.set("*", Behavior::hold(Duration::from_millis(60)));
    let db = TestDb::new(Backend::Postgres);
    let ledger = open_ledger(&rt, &db);
    let text = notify(&sms.url(), 3);
    let runs = 60;
    for i in 0..runs {
        enqueue(&rt, &ledger, "notify", &text, i);
    }
    let args = ["--concurrency", "6", "--poll-interval", "100ms"];
    let mut daemons: Vec<Daemon> = (0..3)
        .map(|n| Daemon::start(&db, &format!("d{n}"), &args, &[]))
        .collect();
    let mut rng = rand::rng();
    for round in 0..4 {
        let pause = rand::Rng::random_range(&mut rng, 300..1200);
        std::thread::sleep(Duration::from_millis(pause));
        let victim = rand::Rng::random_range(&mut rng, 0..daemons.len());
        daemons[victim].kill();
        daemons[victim] = Daemon::start(&db, &format!("d{victim}-{round}"), &args, &[]);
    }
    // The calls the kills left in doubt keep their slots: resolve them from the
    // downstream's own record (arrived → succeeded, never arrived → re-send the key),
    // until every run has finished.
    let deadline = Instant::now() + Duration::from_secs(120);
    while count(&rt, &ledger, "notify-", RunStatus::Succeeded) < runs {
        assert!(Instant::now() < deadline, "runs did not finish");
        resolve_in_doubt(&rt, &db, &ledger, &sms);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        sms.max_in_flight() <= 3,
        "{} in flight",
        sms.max_in_flight()
    );
    let mut seen = HashSet::new();
    for key in sms.log().into_iter().filter_map(|r| r.key) {
        assert!(seen.insert(key.clone()), "{key} was sent twice");
    }
    let left = rt
        .block_on(ledger.slot_use(flow_ledger::Clock::now(&flow_ledger::SystemClock)))
        .expect("slots");
    assert!(left.is_empty(), "{left:?}");
}

/// Resolves every in-doubt call of the paused runs from the server's record.
fn resolve_in_doubt(
    rt: &tokio::runtime::Runtime,
    db: &TestDb,
    ledger: &Ledger,
    server: &CountingServer,
) {
    let filter = flow_ledger::RunFilter {
        status: Some(RunStatus::Paused),
        limit: 10_000,
        ..Default::default()
    };
    for run in rt.block_on(ledger.list_runs(filter)).expect("runs") {
        let calls = rt.block_on(ledger.list_calls(&run.id)).expect("calls");
        for c in calls
            .iter()
            .filter(|c| c.status == flow_ledger::CallStatus::InDoubt)
        {
            let arrived = server.count(&c.current_key);
            assert!(arrived <= 1, "{}: sent {arrived} times", c.current_key);
            let mut cmd = db.flow();
            cmd.args(["resume", &run.id, "--detach", "--resolve"]);
            if arrived == 1 {
                cmd.arg(format!("{}=succeeded", c.tool_call_id))
                    .args(["--output", r#"{"resolved": "arrived"}"#]);
            } else {
                cmd.arg(format!("{}=retry", c.tool_call_id));
            }
            let out = output(&mut cmd);
            assert_eq!(out.status.code(), Some(0), "resolve: {}", stderr(&out));
        }
    }
}

/// `throttled`: one POST through a tool with a rate limit of 2 per second.
fn throttled(url: &str) -> String {
    format!(
        r#"name: throttled
inputs:
  i: {{ type: integer, required: true }}
tools:
  api: {{ kind: http, method: POST, url: "{url}/api", timeout: 10s, rate_limit: {{ per_second: 2 }} }}
nodes:
  call: {{ tool: api, with: {{ i: "${{{{ inputs.i }}}}" }} }}
"#
    )
}

/// A downstream answers `429` with `Retry-After: 2` to three daemons: after each 429 no
/// daemon sends again until its hold-off ends (a 250 ms grace for requests already past
/// their mark), the waiting calls do not all go at once when it ends but at the tool's
/// rate (the ledger's windows are fixed UTC seconds: requests counted at the end of one
/// may arrive in the next, so an arrival second may see up to twice the limit, never
/// the 16 that wait), and once it recovers every run succeeds on its first attempt — no
/// retry spent.
#[test]
fn a_429_with_retry_after_holds_off_every_daemon() {
    for backend in backends() {
        held_off(backend, &[&[], &[], &[]]);
    }
}

/// The same on PostgreSQL with the first daemon's wall clock 10 s behind and the one
/// started after its first 429 10 s ahead (libfaketime): hold-offs and rate windows are
/// judged by the server's clock (`flow_ledger::SystemClock` anchored to it), so the one
/// ahead does not send inside the hold-off the other wrote. Unanchored (as on SQLite,
/// whose processes share one host's clock) it reads that hold-off as long over.
#[test]
fn a_hold_off_holds_across_daemons_with_skewed_clocks() {
    const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    let faketime = std::path::Path::new(LIBFAKETIME).exists();
    assert!(
        !flow_adapters::testkit::flags::ci() || (faketime && postgres_available()),
        "CI needs libfaketime and PostgreSQL"
    );
    if !faketime || !postgres_available() {
        eprintln!("skipped: needs libfaketime and PostgreSQL");
        return;
    }
    let skew = |offset: &'static str| -> [(&'static str, &'static str); 3] {
        [
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME", offset),
            ("DONT_FAKE_MONOTONIC", "1"),
        ]
    };
    held_off(Backend::Postgres, &[&skew("-10s"), &skew("+10s")]);
}

/// One daemon per entry of `daemons` (its extra environment) drains 16 runs of
/// `throttled` while the downstream answers `429` with `Retry-After: 2` for 4.5 s.
fn held_off(backend: Backend, daemons: &[&[(&str, &str)]]) {
    let rt = runtime();
    let api = rt.block_on(CountingServer::start()).expect("server");
    api.set("*", Behavior::status_retry_after(429, "2"));
    let db = TestDb::new(backend);
    let ledger = open_ledger(&rt, &db);
    let text = throttled(&api.url());
    let runs = 16;
    for i in 0..runs {
        enqueue(&rt, &ledger, "throttled", &text, i);
    }
    let args = ["--concurrency", "4", "--poll-interval", "100ms"];
    // The first daemon meets the first 429; the others start after it, so they
    // must learn of the hold-off from the ledger alone.
    let mut started = vec![Daemon::start(&db, "d0", &args, daemons[0])];
    wait_until(Duration::from_secs(30), "the first request", || {
        api.total() > 0
    });
    // Past the grace for requests already on their way.
    std::thread::sleep(Duration::from_millis(400));
    for (n, env) in daemons.iter().enumerate().skip(1) {
        started.push(Daemon::start(&db, &format!("d{n}"), &args, env));
    }
    std::thread::sleep(Duration::from_millis(4500));
    let refused_until = api.log().last().map_or(0, |r| r.at_ms);
    api.set("*", Behavior::hold(Duration::from_millis(5)));
    wait_until(Duration::from_secs(60), "every run succeeded", || {
        count(&rt, &ledger, "throttled-", RunStatus::Succeeded) == runs
    });
    let log = api.log();
    // After each refusal, nothing until its hold-off ends.
    for refused in log.iter().filter(|r| r.at_ms <= refused_until) {
        let early: Vec<u64> = log
            .iter()
            .map(|r| r.at_ms)
            .filter(|&t| t > refused.at_ms + 250 && t + 100 < refused.at_ms + 2000)
            .collect();
        assert!(
            early.is_empty(),
            "{backend:?}: requests {early:?} within the hold-off of the 429 at {}",
            refused.at_ms
        );
    }
    let mut per_second = std::collections::BTreeMap::<u64, u32>::new();
    for r in &log {
        *per_second.entry(r.at_ms / 1000).or_default() += 1;
    }
    assert!(
        per_second.values().all(|&n| n <= 4),
        "{backend:?}: requests per second {per_second:?}"
    );
    // Every run's one call succeeded on its first attempt, its key re-sent as is.
    for i in 0..runs {
        let calls = rt
            .block_on(ledger.list_calls(&format!("throttled-{i:04}")))
            .expect("calls");
        assert_eq!(calls.len(), 1, "{backend:?}: {calls:?}");
        assert_eq!(calls[0].attempt_count, 1, "{backend:?}: {:?}", calls[0]);
    }
    let refusals = log.iter().filter(|r| r.at_ms <= refused_until).count();
    eprintln!(
        "{backend:?}: {refusals} refusals, {} requests in all for {runs} runs",
        log.len()
    );
    drop(started);
}

/// A daemon SIGSTOPped while its call holds the only slot loses its lease; the daemon
/// that takes the run over finds the call in doubt and it keeps the slot, so no other
/// run's call goes out — before, during or after the stopped daemon wakes (its fence
/// stops it sending). Once the downstream has let the first request go, an operator
/// releases the slot (`flow release-slot`, audited) and the others go, one at a time.
#[test]
fn a_call_in_doubt_keeps_its_slot_until_released() {
    for backend in backends() {
        let rt = runtime();
        let sms = rt.block_on(CountingServer::start()).expect("sms server");
        sms.set("*", Behavior::HoldUntilReleased);
        let db = TestDb::new(backend);
        let ledger = open_ledger(&rt, &db);
        let text = notify(&sms.url(), 1);
        enqueue(&rt, &ledger, "notify", &text, 0);
        let args = ["--concurrency", "4", "--poll-interval", "100ms"];
        let stopped = Daemon::start(&db, "stopped", &args, &[("FLOW_LEASE", "2s")]);
        wait_until(Duration::from_secs(30), "the first request", || {
            sms.total() == 1
        });
        stopped.signal("-STOP");
        for i in 1..4 {
            enqueue(&rt, &ledger, "notify", &text, i);
        }
        let other = Daemon::start(&db, "other", &args, &[]);
        wait_until(
            Duration::from_secs(30),
            "the first run paused in doubt",
            || count(&rt, &ledger, "notify-0000", RunStatus::Paused) == 1,
        );
        std::thread::sleep(Duration::from_secs(2));
        stopped.signal("-CONT");
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(
            sms.total(),
            1,
            "{backend:?}: the slot held by the call in doubt"
        );
        sms.set("*", Behavior::hold(Duration::from_millis(20)));
        sms.release();
        let out = output(db.flow().args([
            "release-slot",
            "notify-0000",
            "send",
            "--by",
            "ops",
            "--reason",
            "the provider dropped it",
        ]));
        assert_eq!(out.status.code(), Some(0), "{backend:?}: {}", stderr(&out));
        wait_until(Duration::from_secs(60), "the other runs succeeded", || {
            count(&rt, &ledger, "notify-", RunStatus::Succeeded) == 3
        });
        assert_eq!(sms.total(), 4, "{backend:?}: each run's request once");
        assert_eq!(sms.max_in_flight(), 1, "{backend:?}");
        // A second release finds no slot, an unknown node no call: exit 2 with the reason.
        for (node, reason) in [
            ("send", "holds no concurrency slot"),
            ("nope", "has no call of node `nope`"),
        ] {
            let refused =
                output(
                    db.flow()
                        .args(["release-slot", "notify-0000", node, "--by", "ops"]),
                );
            let said = stderr(&refused);
            assert_eq!(refused.status.code(), Some(2), "{backend:?}: {said}");
            assert!(said.contains(reason), "{backend:?}: {said}");
        }
        drop((stopped, other));
    }
}
