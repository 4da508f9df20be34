//! Races: tasks and OS processes competing for the same call and for the queue.
//!
//! The process tests re-execute this test binary (`--exact <this test>`) with
//! `FLOW_LEDGER_CHILD` set; the child opens the same database, waits for a shared start
//! instant, does its claims and prints `FLOW_CHILD <result>` lines for the parent.

use std::collections::HashSet;
use std::time::Duration;

use flow_ledger::{CallClaim, ClaimRuns, Clock, Error, Ledger, RunLease, SystemClock, Timestamp};
use serde_json::json;

use crate::common::*;

crate::conformance!(
    sixteen_tasks_claim_the_same_call,
    sixteen_runs_claim_the_same_key,
    eight_tasks_never_claim_a_run_twice,
    writes_abandoned_by_their_callers_leave_no_transaction_behind,
);

fn describe(r: &Result<CallClaim, Error>) -> &'static str {
    match r {
        Ok(CallClaim::Claimed(_)) => "claimed",
        Ok(CallClaim::Replay(_)) => "replay",
        Ok(CallClaim::InDoubt { .. }) => "in_doubt",
        Err(Error::Busy { .. }) => "busy",
        Err(_) => "error",
    }
}

async fn sixteen_tasks_claim_the_same_call(db: TestDb) {
    let run = running(&db, "run_a", &worker("1")).await;
    let now = db.now();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (ledger, run) = (db.ledger.clone(), run.clone());
        tasks.push(tokio::spawn(async move {
            let r = ledger
                .claim_call(claim(&run, "pay", "pay", "k", json!({})), now)
                .await;
            if let Err(e) = &r
                && !matches!(e, Error::Busy { .. })
            {
                panic!("unexpected error: {e}");
            }
            describe(&r)
        }));
    }
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.unwrap());
    }
    assert_eq!(
        got.iter().filter(|r| **r == "claimed").count(),
        1,
        "{got:?}"
    );
    assert_eq!(got.iter().filter(|r| **r == "busy").count(), 15, "{got:?}");
}

async fn sixteen_runs_claim_the_same_key(db: TestDb) {
    let w = worker("1");
    let mut leases = Vec::new();
    for i in 0..16 {
        leases.push(running(&db, &format!("run_{i}"), &w).await);
    }
    let now = db.now();
    let mut tasks = Vec::new();
    for run in leases {
        let ledger = db.ledger.clone();
        tasks.push(tokio::spawn(async move {
            let r = ledger
                .claim_call(
                    claim(&run, "pay", "pay", "refund-7", json!({"amount": 1})),
                    now,
                )
                .await;
            if let Err(e) = &r
                && !matches!(e, Error::Busy { .. })
            {
                panic!("unexpected error (a raw unique violation?): {e}");
            }
            describe(&r)
        }));
    }
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.unwrap());
    }
    assert_eq!(
        got.iter().filter(|r| **r == "claimed").count(),
        1,
        "{got:?}"
    );
}

async fn eight_tasks_never_claim_a_run_twice(db: TestDb) {
    for i in 0..60 {
        db.ledger
            .enqueue(new_run(&format!("run_{i:02}")), db.now())
            .await
            .unwrap();
    }
    let now = db.now();
    let mut tasks = Vec::new();
    for t in 0..8 {
        let ledger = db.ledger.clone();
        tasks.push(tokio::spawn(async move {
            let w = worker(&format!("t{t}"));
            let mut mine = Vec::new();
            loop {
                let got = ledger
                    .claim_next(
                        ClaimRuns {
                            worker: &w,
                            lease: LEASE,
                            limit: 3,
                        },
                        now,
                    )
                    .await
                    .unwrap();
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.into_iter().map(|l| l.run_id));
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(all.len(), 60, "claimed {} times for 60 runs", all.len());
    assert_eq!(unique.len(), 60);
}

// ---------------------------------------------------------------------------------------
// Four OS processes.

const CHILD: &str = "FLOW_LEDGER_CHILD";

struct Child {
    mode: String,
    url: String,
    start_at: i64,
    now: Timestamp,
    lease: Option<RunLease>,
}

fn child_env() -> Option<Child> {
    let mode = std::env::var(CHILD).ok()?;
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} missing"));
    Some(Child {
        mode,
        url: var("FLOW_LEDGER_CHILD_URL"),
        start_at: var("FLOW_LEDGER_CHILD_START").parse().unwrap(),
        now: Timestamp(var("FLOW_LEDGER_CHILD_NOW").parse().unwrap()),
        lease: std::env::var("FLOW_LEDGER_CHILD_LEASE")
            .ok()
            .map(|s| serde_json::from_str(&s).unwrap()),
    })
}

async fn run_child(c: Child) {
    let ledger = Ledger::open(&c.url, options()).await.expect("child open");
    let wait = c.start_at - SystemClock.now().as_millis();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
    match c.mode.as_str() {
        "call" => {
            let run = c.lease.expect("lease");
            let r = ledger
                .claim_call(claim(&run, "pay", "pay", "k", json!({})), c.now)
                .await;
            if let Err(e) = &r {
                println!("FLOW_CHILD detail {e}");
            }
            println!("FLOW_CHILD {}", describe(&r));
        }
        "runs" => {
            let w = flow_ledger::WorkerId::current();
            loop {
                let got = ledger
                    .claim_next(
                        ClaimRuns {
                            worker: &w,
                            lease: LEASE,
                            limit: 2,
                        },
                        c.now,
                    )
                    .await
                    .expect("claim_next");
                if got.is_empty() {
                    break;
                }
                for l in got {
                    println!("FLOW_CHILD {}", l.run_id);
                }
            }
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// Starts 4 copies of this test binary running `test_name` in child `mode`; returns the
/// `FLOW_CHILD` lines they printed.
fn spawn_children(
    test_name: &str,
    mode: &str,
    db: &TestDb,
    lease: Option<&RunLease>,
) -> Vec<String> {
    let exe = std::env::current_exe().expect("current exe");
    let start_at = SystemClock.now().as_millis() + 2500;
    let children: Vec<_> = (0..4)
        .map(|_| {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args(["--exact", test_name, "--nocapture", "--test-threads=1"])
                .env(CHILD, mode)
                .env("FLOW_LEDGER_CHILD_URL", &db.url)
                .env("FLOW_LEDGER_CHILD_START", start_at.to_string())
                .env("FLOW_LEDGER_CHILD_NOW", db.now().as_millis().to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::inherit());
            if let Some(l) = lease {
                cmd.env("FLOW_LEDGER_CHILD_LEASE", serde_json::to_string(l).unwrap());
            }
            cmd.spawn().expect("spawn child")
        })
        .collect();
    let mut lines = Vec::new();
    for child in children {
        let out = child.wait_with_output().expect("child output");
        assert!(
            out.status.success(),
            "child failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        lines.extend(
            text.lines()
                // libtest prints "test <name> ... " right before the first line.
                .filter_map(|l| l.find("FLOW_CHILD ").map(|i| &l[i + "FLOW_CHILD ".len()..]))
                .map(str::to_owned),
        );
    }
    lines
}

async fn processes_claim_the_same_call(backend: Backend, test_name: &str) {
    if let Some(c) = child_env() {
        return run_child(c).await;
    }
    let Some(db) = open(backend, options()).await else {
        return;
    };
    let run = running(&db, "run_a", &worker("1")).await;
    let all = spawn_children(test_name, "call", &db, Some(&run));
    let lines: Vec<_> = all
        .iter()
        .filter(|l| !l.starts_with("detail "))
        .cloned()
        .collect();
    assert_eq!(lines.len(), 4, "{all:?}");
    assert_eq!(
        lines.iter().filter(|l| *l == "claimed").count(),
        1,
        "{lines:?}"
    );
    assert_eq!(
        lines.iter().filter(|l| *l == "busy").count(),
        3,
        "{lines:?}"
    );
}

async fn processes_claim_runs(backend: Backend, test_name: &str) {
    if let Some(c) = child_env() {
        return run_child(c).await;
    }
    let Some(db) = open(backend, options()).await else {
        return;
    };
    for i in 0..40 {
        db.ledger
            .enqueue(new_run(&format!("run_{i:02}")), db.now())
            .await
            .unwrap();
    }
    let lines = spawn_children(test_name, "runs", &db, None);
    let unique: HashSet<_> = lines.iter().collect();
    assert_eq!(lines.len(), 40, "{lines:?}");
    assert_eq!(unique.len(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_four_processes_claim_the_same_call() {
    processes_claim_the_same_call(
        Backend::Sqlite,
        "races::sqlite_four_processes_claim_the_same_call",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_four_processes_claim_the_same_call() {
    processes_claim_the_same_call(
        Backend::Postgres,
        "races::postgres_four_processes_claim_the_same_call",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_four_processes_never_claim_a_run_twice() {
    processes_claim_runs(
        Backend::Sqlite,
        "races::sqlite_four_processes_never_claim_a_run_twice",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_four_processes_never_claim_a_run_twice() {
    processes_claim_runs(
        Backend::Postgres,
        "races::postgres_four_processes_never_claim_a_run_twice",
    )
    .await;
}

/// A caller that stops waiting for a write (a timeout, a dropped task) must not leave a
/// transaction open on a pooled connection: the next borrower's statements would run
/// inside it and never commit (sqlx can leave one behind when a PostgreSQL `BEGIN` is
/// cancelled mid-flight: launchbadge/sqlx#4393; seen here under load as "heartbeat 1 is
/// not visible", fixed by running each PostgreSQL write on a task of its own so no
/// caller can cancel it mid-transaction). Hundreds of writes are abandoned at random
/// moments on a two-connection pool; every heartbeat after that must be visible to
/// another handle.
async fn writes_abandoned_by_their_callers_leave_no_transaction_behind(db: TestDb) {
    use rand::Rng as _;
    let run = running(&db, "run_a", &worker("1")).await;
    let small = flow_ledger::OpenOptions {
        max_connections: 2,
        ..options()
    };
    let ledger = Ledger::open(&db.url, small).await.expect("open");
    let now = db.now();
    let mut rng = rand::rng();
    let mut finished = 0;
    for i in 0..600 {
        let wait = Duration::from_micros(rng.random_range(0..2500));
        let write = ledger.create_step(&run, step(&format!("s{i}"), &format!("n{i}"), 0), now);
        if tokio::time::timeout(wait, write).await.is_ok() {
            finished += 1;
        }
    }
    assert!(
        finished < 600,
        "no write was abandoned: this test shows nothing"
    );
    for k in 0..20u64 {
        let ack = ledger
            .heartbeat(&run, Duration::from_secs(100 + k), now)
            .await
            .expect("heartbeat");
        let seen = db.ledger.get_run("run_a").await.expect("get run");
        assert_eq!(
            seen.lease_expires_at,
            Some(ack.expires_at),
            "heartbeat {k} is not visible to another handle: it ran inside a transaction \
             an abandoned write left open"
        );
    }
    ledger.close().await;
}
