//! `for_each` under SIGKILL, through the real binary, against a downstream that counts
//! requests per `Idempotency-Key` and the most it was handling at once.
//!
//! 1. The issue's acceptance test. A 10,000-item `for_each` whose tool POSTs with
//!    `idempotency: header`; two `flow daemon`s on one PostgreSQL ledger. The daemon
//!    holding the run is SIGKILLed after ~3,000 sends, while `concurrency` requests are
//!    held at the downstream (so they are certainly outbound); the other daemon takes the
//!    run over (the dead holder is provably dead on this host, so its leases expire at
//!    once) and finishes it. Guaranteed: exactly 10,000 effects, one per key — every key
//!    `<run>:notify[c<i>]:1` arrives, no other key does, and only the calls in flight at
//!    the kill arrive twice: found in doubt, they are re-sent with the *same* key, which
//!    the tool declares the downstream dedupes on (at most once per effect attempt); and
//!    at no moment are more than `concurrency` requests in flight at the downstream.
//! 2. The strict variant: a plain POST (no idempotency), 2,000 items, `flow run` on
//!    SQLite SIGKILLed mid-way with requests held in flight. `flow resume` sends every
//!    other item once and pauses the run naming the items whose calls were in flight;
//!    nothing in doubt is ever sent again (not even with a retry budget left). Resolving
//!    them from the downstream's own record (arrived → succeeded, never arrived → retry)
//!    finishes the run with every key arrived exactly once.
//!
//! The list is `range(inputs.n)`, not an input array: with the list itself in the
//! expression context, evaluating each item's key currently converts the whole context,
//! list included, once per item, so expanding 10,000 items is quadratic (about two
//! minutes in a debug build, at every expansion: the start and the takeover). The
//! guarantees checked here do not depend on where the list comes from.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use flow_adapters::testkit::http::{Behavior, CountingServer};
use flow_ledger::{CallStatus, Ledger, OpenOptions, RunStatus, ToolCall};

use crate::support::{Backend, TestDb, output, postgres_available, runtime, stderr, stdout};

/// Items in flight at once (`for_each.concurrency`; the run's `max_parallel` is higher).
const CONCURRENCY: u32 = 25;

/// How long the downstream takes per request, so that requests overlap.
const HOLD_MS: u64 = 5;

/// A `for_each` over `range(n)` POSTing each item to `<url>/mail` under the key
/// `c<i>`. `idempotency` is appended to the tool (e.g. `, idempotency: header`). The
/// node has a retry budget of one: what a header-idempotent call found in doubt spends
/// on its same-key re-send, and what a plain POST must never spend on one.
fn workflow(url: &str, idempotency: &str) -> String {
    format!(
        r#"name: mail
max_parallel: 32
inputs:
  n: {{ type: integer, required: true }}
tools:
  post: {{ kind: http, method: POST, url: "{url}/mail", timeout: 10s{idempotency} }}
nodes:
  notify:
    for_each:
      items: "${{{{ range(inputs.n) }}}}"
      key: "c${{{{ item }}}}"
      concurrency: {CONCURRENCY}
      max_items: 50000
    tool: post
    with: {{ to: "c${{{{ item }}}}@example.com" }}
    retry_policy: {{ max_retries: 1 }}
"#
    )
}

/// The key item `i` of `run` is sent under (effect attempt 1).
fn key(run: &str, i: usize) -> String {
    format!("{run}:notify[c{i}]:1")
}

/// Polls until `done` holds, failing after `limit` with `what`.
fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "timed out after {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `flow` child whose stderr goes to a file in the test directory.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn start(db: &TestDb, name: &str, args: &[&str]) -> Proc {
        let log = db.dir.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = db
            .flow()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn flow {args:?}: {e}"));
        Proc { child, log }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The last lines of its stderr, for failure messages.
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the downstream had seen when the kill landed.
struct AtKill {
    /// Requests that had arrived.
    arrivals: u64,
    /// Keys of the requests held in flight (arrived after the hold began, unanswered).
    held: HashSet<String>,
}

/// SIGKILLs `victim` while item calls are in flight: from now on every request is held
/// until released; once the held requests fill `concurrency` (or stop coming for 3 s)
/// the kill lands. Then requests are answered after [`HOLD_MS`] again and the held ones
/// are let go. The victim is reaped, so it is provably dead to the other processes.
fn kill_mid_items(server: &CountingServer, victim: &mut Proc) -> AtKill {
    server.set("*", Behavior::HoldUntilReleased);
    // Requests after this one are held (behaviour and arrival number are taken under one
    // lock); the ones before may be finishing their hold.
    let from = u64::from(server.total());
    let held = || u64::from(server.total()).saturating_sub(from);
    wait_until(
        Duration::from_secs(30),
        "a request of the process to kill to be held",
        || held() >= 1,
    );
    let first = Instant::now();
    while held() < u64::from(CONCURRENCY) && first.elapsed() < Duration::from_secs(3) {
        assert!(
            victim.alive(),
            "the process to kill exited:\n{}",
            victim.tail()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = victim.child.kill();
    let _ = victim.child.wait();
    let arrivals = u64::from(server.total());
    server.set("*", Behavior::Hold { ms: HOLD_MS });
    server.release();
    let held = server
        .log()
        .into_iter()
        .filter(|r| r.seq > from)
        .filter_map(|r| r.key)
        .collect();
    AtKill { arrivals, held }
}

/// Arrivals per key, and the number of requests that came without a key.
fn arrivals(server: &CountingServer) -> (HashMap<String, Vec<u64>>, usize) {
    let mut per_key: HashMap<String, Vec<u64>> = HashMap::new();
    let mut keyless = 0;
    for r in server.log() {
        match r.key {
            Some(k) => per_key.entry(k).or_default().push(r.seq),
            None => keyless += 1,
        }
    }
    (per_key, keyless)
}

fn open_ledger(rt: &tokio::runtime::Runtime, db: &TestDb) -> Ledger {
    rt.block_on(Ledger::open(&db.url, OpenOptions::default()))
        .expect("open the ledger")
}

/// `n` as the run's output reports it for `notify` (`succeeded`, `failed`, `skipped`).
fn counts(output: &serde_json::Value) -> (u64, u64, u64) {
    let n = &output["notify"];
    let get = |f: &str| n[f].as_u64().unwrap_or(u64::MAX);
    (get("succeeded"), get("failed"), get("skipped"))
}

/// The downstream's record after the kill: one effect per key — every item's own key,
/// at most one same-key re-send and only of a request in flight at the kill, every
/// effect completed, never more than `concurrency` at once. Returns how many keys were
/// re-sent and the most requests in flight.
fn one_effect_per_key(
    server: &CountingServer,
    run: &str,
    items: usize,
    at_kill: &AtKill,
) -> (usize, u32) {
    let (per_key, keyless) = arrivals(server);
    assert_eq!(keyless, 0, "every request carries its item's key");
    let expected: HashSet<String> = (0..items).map(|i| key(run, i)).collect();
    let mut unexpected: Vec<&String> = per_key.keys().filter(|k| !expected.contains(*k)).collect();
    unexpected.sort();
    assert!(
        unexpected.is_empty(),
        "{} keys outside the items' own (a new effect attempt or a changed key), e.g. {:?}",
        unexpected.len(),
        &unexpected[..unexpected.len().min(10)]
    );
    let mut missing: Vec<&String> = expected
        .iter()
        .filter(|k| !per_key.contains_key(*k))
        .collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "{} items never reached the downstream, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert_eq!(per_key.len(), items, "exactly {items} distinct keys");
    let mut resent: Vec<(&String, &Vec<u64>)> =
        per_key.iter().filter(|(_, seqs)| seqs.len() > 1).collect();
    resent.sort();
    for (k, seqs) in &resent {
        assert_eq!(
            seqs.len(),
            2,
            "{k} arrived {} times: at most once, plus one same-key re-send after the kill",
            seqs.len()
        );
        assert!(
            seqs[0] <= at_kill.arrivals,
            "{k} was re-sent, so its first request must have been in flight at the kill (arrival #{} of {} at the kill)",
            seqs[0],
            at_kill.arrivals
        );
    }
    assert!(
        resent.len() <= CONCURRENCY as usize,
        "only calls in flight at the kill may be re-sent: {} re-sent, concurrency {CONCURRENCY}",
        resent.len()
    );
    let resent_keys: HashSet<&String> = resent.iter().map(|(k, _)| *k).collect();
    let mut lost: Vec<&String> = at_kill
        .held
        .iter()
        .filter(|k| !resent_keys.contains(k))
        .collect();
    lost.sort();
    assert!(
        !at_kill.held.is_empty() && lost.is_empty(),
        "every request held unanswered at the kill was found in doubt and re-sent with its key ({} held; not re-sent: {lost:?})",
        at_kill.held.len()
    );
    let mut incomplete: Vec<&String> = expected
        .iter()
        .filter(|k| server.completed(k) == 0)
        .collect();
    incomplete.sort();
    assert!(
        incomplete.is_empty(),
        "every key's effect was completed by the downstream at least once: {} never were, e.g. {:?}",
        incomplete.len(),
        &incomplete[..incomplete.len().min(10)]
    );
    let max = server.max_in_flight();
    assert!(
        max <= CONCURRENCY,
        "at most `concurrency` ({CONCURRENCY}) requests in flight at the downstream at once, saw {max}"
    );
    assert!(
        max > 1,
        "the requests never overlapped (max in flight {max}): concurrency was not exercised"
    );

    (resent.len(), max)
}

/// The ledger agrees: every item's call succeeded in its first effect attempt.
fn every_item_call_succeeded_once(
    rt: &tokio::runtime::Runtime,
    ledger: &Ledger,
    run: &str,
    items_n: usize,
) {
    let calls = rt.block_on(ledger.list_calls(run)).expect("calls");
    let items: Vec<&ToolCall> = calls
        .iter()
        .filter(|c| c.tool_call_id.starts_with("notify["))
        .collect();
    assert_eq!(items.len(), items_n, "one call per item");
    let not_ok: Vec<String> = items
        .iter()
        .filter(|c| c.status != CallStatus::Succeeded || c.attempt_count != 1)
        .take(10)
        .map(|c| {
            format!(
                "{} {:?} attempt {}",
                c.tool_call_id, c.status, c.attempt_count
            )
        })
        .collect();
    assert!(
        not_ok.is_empty(),
        "every item's call succeeded in its first effect attempt: {not_ok:?}"
    );
}

/// What the downstream saw after the resume: each call held at the kill is in doubt,
/// no key in doubt was sent again, no key twice, each succeeded item once. Returns the
/// arrivals by key.
fn never_resent(
    server: &CountingServer,
    calls: &[ToolCall],
    in_doubt: &[&ToolCall],
    at_kill: &AtKill,
    before: &HashMap<String, Vec<u64>>,
) -> HashMap<String, Vec<u64>> {
    let doubtful: HashSet<&str> = in_doubt.iter().map(|c| c.current_key.as_str()).collect();
    for k in &at_kill.held {
        assert!(
            doubtful.contains(k.as_str()),
            "{k} was held unanswered at the kill, so its call is in doubt"
        );
    }
    let (after, keyless) = arrivals(server);
    assert_eq!(keyless, 0, "every request carries its item's key");
    for c in in_doubt {
        let was = before.get(&c.current_key).map_or(0, Vec::len);
        let now = after.get(&c.current_key).map_or(0, Vec::len);
        assert!(
            was <= 1 && now == was,
            "{} is in doubt: sent {was} time(s) before the kill, {now} after the resume: never re-sent",
            c.tool_call_id
        );
    }
    let twice: Vec<(&String, usize)> = after
        .iter()
        .filter(|(_, s)| s.len() > 1)
        .map(|(k, s)| (k, s.len()))
        .collect();
    assert!(twice.is_empty(), "keys sent more than once: {twice:?}");
    for c in calls.iter().filter(|c| c.status == CallStatus::Succeeded) {
        assert_eq!(
            after.get(&c.current_key).map_or(0, Vec::len),
            1,
            "{}: a succeeded item landed once",
            c.tool_call_id
        );
    }
    after
}

/// Settles each call in doubt from the downstream's record (succeeded if it arrived,
/// re-sent if not); the run then finishes with one effect per key. Returns how many had
/// arrived, how many were re-sent, and the most requests in flight.
fn settle_from_the_downstream(
    db: &TestDb,
    server: &CountingServer,
    run: &str,
    in_doubt: &[&ToolCall],
    items: usize,
) -> (usize, usize, u32) {
    let (mut arrived, mut retried) = (0, 0);
    for c in in_doubt {
        let mut cmd = db.flow();
        cmd.args(["resume", run, "--detach", "--resolve"]);
        if server.count(&c.current_key) == 1 {
            arrived += 1;
            cmd.arg(format!("{}=succeeded", c.tool_call_id))
                .args(["--output", r#"{"resolved": "arrived"}"#]);
        } else {
            retried += 1;
            cmd.arg(format!("{}=retry", c.tool_call_id));
        }
        let out = output(&mut cmd);
        assert_eq!(
            out.status.code(),
            Some(0),
            "resolving {}: {}",
            c.tool_call_id,
            stderr(&out)
        );
    }
    let done = output(db.flow().args(["resume", run]));
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    let result: serde_json::Value = serde_json::from_slice(&done.stdout).expect("the run's output");
    assert_eq!(counts(&result), (items as u64, 0, 0), "{result}");
    let (end, _) = arrivals(server);
    let expected: HashSet<String> = (0..items).map(|i| key(run, i)).collect();
    let got: HashSet<String> = end.keys().cloned().collect();
    assert_eq!(got, expected, "each item's own key, and no other");
    let twice: Vec<(&String, usize)> = end
        .iter()
        .filter(|(_, s)| s.len() != 1)
        .map(|(k, s)| (k, s.len()))
        .collect();
    assert!(
        twice.is_empty(),
        "every key arrived exactly once: {twice:?}"
    );
    let max = server.max_in_flight();
    assert!(
        max <= CONCURRENCY,
        "at most `concurrency` ({CONCURRENCY}) requests in flight at once, saw {max}"
    );
    (arrived, retried, max)
}

/// Which of `daemons` holds `run` (waits for one to claim it).
fn holder_of(rt: &tokio::runtime::Runtime, ledger: &Ledger, run: &str, daemons: &[Proc]) -> usize {
    let mut holder = None;
    wait_until(Duration::from_secs(30), "a daemon to claim the run", || {
        let r = rt.block_on(ledger.get_run(run)).expect("get run");
        holder = r
            .worker
            .as_ref()
            .and_then(|w| w.parts())
            .map(|(_, pid, _)| pid)
            .filter(|_| r.status == RunStatus::Running);
        holder.is_some()
    });
    daemons
        .iter()
        .position(|d| Some(d.pid()) == holder)
        .unwrap_or_else(|| {
            panic!("the run is held by pid {holder:?}, not by a daemon of this test")
        })
}

#[test]
fn ten_thousand_items_two_postgres_daemons_one_sigkilled_one_effect_per_key_within_the_concurrency()
{
    if !postgres_available() {
        return;
    }
    const ITEMS: usize = 10_000;
    let started = Instant::now();
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    server.set("*", Behavior::Hold { ms: HOLD_MS });
    let db = TestDb::new(Backend::Postgres);
    let file = db.write(
        "mail.yaml",
        &workflow(&server.url(), ", idempotency: header"),
    );
    let out = output(
        db.flow()
            .arg("submit")
            .arg(&file)
            .args(["--input", &format!("n={ITEMS}")]),
    );
    assert_eq!(out.status.code(), Some(0), "submit: {}", stderr(&out));
    let run = stdout(&out).trim().to_string();
    let ledger = open_ledger(&rt, &db);
    let args = ["daemon", "--poll-interval", "100ms"];
    let mut daemons = [Proc::start(&db, "d0", &args), Proc::start(&db, "d1", &args)];

    // One daemon holds the run (the run lease): that is the one to kill.
    let victim = holder_of(&rt, &ledger, &run, &daemons);
    let survivor_pid = daemons[1 - victim].pid();
    wait_until(
        Duration::from_secs(120),
        "~3,000 sends before the kill",
        || {
            assert!(
                daemons[victim].alive(),
                "the holder exited:\n{}",
                daemons[victim].tail()
            );
            server.total() >= 3_000
        },
    );
    let killed_after = started.elapsed();
    let at_kill = kill_mid_items(&server, &mut daemons[victim]);
    let killed = Instant::now();
    wait_until(
        Duration::from_secs(60),
        "the other daemon to take the run over and send",
        || u64::from(server.total()) > at_kill.arrivals,
    );
    let takeover = killed.elapsed();

    // The other daemon takes the run over and finishes it: nothing for a human.
    let mut last = RunStatus::Running;
    wait_until(
        Duration::from_secs(180),
        "the surviving daemon to finish the run",
        || {
            last = rt.block_on(ledger.get_run(&run)).expect("get run").status;
            matches!(
                last,
                RunStatus::Succeeded | RunStatus::Failed | RunStatus::Paused | RunStatus::Cancelled
            )
        },
    );
    let finished_after = started.elapsed();
    let survivor = &mut daemons[1 - victim];
    let r = rt.block_on(ledger.get_run(&run)).expect("get run");
    assert_eq!(
        last,
        RunStatus::Succeeded,
        "the run must succeed without a human (pause reason {:?}, error {:?}); surviving daemon's log:\n{}",
        r.pause_reason,
        r.error,
        survivor.tail()
    );
    assert_eq!(
        r.worker
            .as_ref()
            .and_then(|w| w.parts())
            .map(|(_, pid, _)| pid),
        Some(survivor_pid),
        "the surviving daemon finished the run"
    );
    let output = r.output.clone().unwrap_or_default();
    assert_eq!(
        counts(&output),
        (ITEMS as u64, 0, 0),
        "every item succeeded: {output}"
    );
    let status = std::process::Command::new("kill")
        .args(["-TERM", &survivor.pid().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    wait_until(
        Duration::from_secs(20),
        "the surviving daemon to stop",
        || !survivor.alive(),
    );

    let (resent, max) = one_effect_per_key(&server, &run, ITEMS, &at_kill);
    every_item_call_succeeded_once(&rt, &ledger, &run, ITEMS);
    rt.block_on(ledger.close());
    eprintln!(
        "{ITEMS} items: kill after {killed_after:?} at {} arrivals ({} held in flight), first send of the other daemon {takeover:?} later, {} keys re-sent, max in flight {max}/{CONCURRENCY}, run finished after {finished_after:?}, test {:?}",
        at_kill.arrivals,
        at_kill.held.len(),
        resent,
        started.elapsed()
    );
}

#[test]
fn without_idempotency_the_items_in_flight_at_a_sigkill_stay_in_doubt_and_are_never_sent_again() {
    const ITEMS: usize = 2_000;
    let started = Instant::now();
    let rt = runtime();
    let server = rt.block_on(CountingServer::start()).expect("server");
    server.set("*", Behavior::Hold { ms: HOLD_MS });
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("mail.yaml", &workflow(&server.url(), ""));
    let file = file.display().to_string();
    let run = "fe-strict";
    let n = format!("n={ITEMS}");
    let mut first = Proc::start(&db, "run", &["run", &file, "--input", &n, "--run-id", run]);
    wait_until(
        Duration::from_secs(60),
        "~700 sends before the kill",
        || {
            assert!(first.alive(), "flow run exited:\n{}", first.tail());
            server.total() >= 700
        },
    );
    let at_kill = kill_mid_items(&server, &mut first);
    let (before, _) = arrivals(&server);

    // The resume sends every item not yet sent, once, and pauses on those in doubt.
    let resumed = output(db.flow().args(["resume", run]));
    assert_eq!(
        resumed.status.code(),
        Some(3),
        "the resume pauses in doubt: {}",
        stderr(&resumed)
    );
    let ledger = open_ledger(&rt, &db);
    let r = rt.block_on(ledger.get_run(run)).expect("get run");
    assert_eq!(r.status, RunStatus::Paused, "{:?}", r.pause_reason);
    let calls = rt.block_on(ledger.list_calls(run)).expect("calls");
    let in_doubt: Vec<&ToolCall> = calls
        .iter()
        .filter(|c| c.status == CallStatus::InDoubt)
        .collect();
    let succeeded = calls
        .iter()
        .filter(|c| c.status == CallStatus::Succeeded)
        .count();
    assert_eq!(
        succeeded + in_doubt.len(),
        ITEMS,
        "every item either succeeded or is in doubt: {:?}",
        calls
            .iter()
            .filter(|c| !matches!(c.status, CallStatus::Succeeded | CallStatus::InDoubt))
            .map(|c| format!("{} {:?}", c.tool_call_id, c.status))
            .take(10)
            .collect::<Vec<_>>()
    );
    assert!(
        !in_doubt.is_empty() && in_doubt.len() <= CONCURRENCY as usize,
        "the calls in flight at the kill, and only they, are in doubt: {} (concurrency {CONCURRENCY})",
        in_doubt.len()
    );
    let after = never_resent(&server, &calls, &in_doubt, &at_kill, &before);
    // `flow show` lists each item in doubt with the command that settles it.
    let shown = output(db.flow().args(["show", run]));
    let text = stdout(&shown);
    for c in &in_doubt {
        assert!(
            text.contains(&format!("--resolve {}=succeeded", c.tool_call_id)),
            "`flow show` names {} and how to resolve it:\n{text}",
            c.tool_call_id
        );
    }
    // Resuming again without a resolution sends nothing.
    let again = output(db.flow().args(["resume", run]));
    assert_eq!(again.status.code(), Some(3), "{}", stderr(&again));
    assert_eq!(
        server.total() as usize,
        after.values().map(Vec::len).sum::<usize>(),
        "a second resume sent nothing"
    );

    let (arrived, retried, max) = settle_from_the_downstream(&db, &server, run, &in_doubt, ITEMS);
    rt.block_on(ledger.close());
    eprintln!(
        "{ITEMS} items: killed at {} arrivals ({} held), {} in doubt ({arrived} had arrived, {retried} had not), max in flight {max}/{CONCURRENCY}, test {:?}",
        at_kill.arrivals,
        at_kill.held.len(),
        in_doubt.len(),
        started.elapsed()
    );
}
