//! Test fixtures: a fresh ledger per test on a real SQLite file or a fresh PostgreSQL
//! database, and the `conformance!` macro that runs each test on both backends.

use std::time::Duration;

use flow_ledger::{
    CallClaim, CallLease, ClaimCall, CompleteCall, Ledger, ManualClock, NewRun, NewStep,
    OpenOptions, RunLease, RunStatus, StepStatus, Timestamp, WorkerId, canonical_hash,
};
use serde_json::{Value, json};
use sqlx::Connection;

/// A fixed start time (2027-01-15T08:00:00Z) so window and RFC 3339 checks are stable.
pub const T0: Timestamp = Timestamp(1_800_000_000_000);
pub const LEASE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A ledger on its own database, dropped (PostgreSQL) or deleted (SQLite) at the end.
pub struct TestDb {
    pub ledger: Ledger,
    pub url: String,
    pub clock: ManualClock,
    _dir: Option<tempfile::TempDir>,
    _pg: PgDrop,
}

/// Drops a test database when the test ends, panics included.
pub struct PgDrop(Option<String>);

impl TestDb {
    pub fn now(&self) -> Timestamp {
        use flow_ledger::Clock;
        self.clock.now()
    }

    pub fn advance(&self, d: Duration) -> Timestamp {
        self.clock.advance(d)
    }
}

impl PgDrop {
    /// Drops database `name` when this is dropped.
    pub fn new(name: String) -> Self {
        Self(Some(name))
    }
}

impl Drop for PgDrop {
    fn drop(&mut self) {
        if let Some(name) = self.0.take() {
            let admin = admin_url();
            // Drop runs outside the test's runtime: a fresh thread with its own runtime.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    if let Ok(mut c) = sqlx::PgConnection::connect(&admin).await {
                        let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                        let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut c).await;
                    }
                });
            })
            .join();
        }
    }
}

pub fn admin_url() -> String {
    std::env::var("FLOW_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{db}", &base[..path_start]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

fn skip_loudly(reason: &str) {
    eprintln!(
        "\n################################################################################\n\
         ##  SKIPPING the PostgreSQL half of this test: PostgreSQL is unreachable\n\
         ##  ({reason}).\n\
         ##  Set FLOW_TEST_POSTGRES_URL or start PostgreSQL; CI=true makes this a failure.\n\
         ################################################################################\n"
    );
}

/// Creates a fresh PostgreSQL database and returns its URL, or `None` (after a loud
/// message) when PostgreSQL is unreachable outside CI.
pub async fn fresh_pg_database() -> Option<(String, String)> {
    fresh_pg_database_with("").await
}

/// [`fresh_pg_database`] created with `CREATE DATABASE name <options>` (a collation, say).
pub async fn fresh_pg_database_with(options: &str) -> Option<(String, String)> {
    let admin = admin_url();
    let connect =
        tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(&admin)).await;
    let mut conn = match connect {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return unreachable_pg(&e.to_string()),
        Err(_) => return unreachable_pg("connect timed out"),
    };
    let name = format!(
        "flow_test_{}",
        ulid::Ulid::generate().to_string().to_lowercase()
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE {name} {options}"
    )))
    .execute(&mut conn)
    .await
    .expect("create database");
    Some((with_database(&admin, &name), name))
}

/// Whether a flag's value turns it on: set, and not `""`, `"0"` or `"false"` (any case).
///
/// A copy of `flow_adapters::testkit::flags::flag_on` (the ledger may not depend on the
/// adapters, not even in tests); `tests/tidy.rs` checks that the two are identical, so
/// `CI` means the same here as in every other test.
pub fn flag_on(value: Option<&str>) -> bool {
    value.is_some_and(|v| !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false"))
}

/// Whether the tests run in CI (`CI` on, by [`flag_on`]): a skip there is a failure.
pub fn ci() -> bool {
    flag_on(std::env::var("CI").ok().as_deref())
}

/// An id of a worker on this host that is provably dead: this process's host and pid
/// with another start time (the pid was reused). `None` (and a message) where `/proc`
/// cannot prove a death (not Linux). On Linux the start time must have the shape
/// `b<boot>.<ticks>.n<namespace>`: a broken `/proc` parse is a failure, not a skip that
/// would switch the provable-death tests off.
pub fn dead_local_worker() -> Option<WorkerId> {
    let me = WorkerId::current();
    let (host, pid, start) = me.parts().expect("worker id shape");
    if !cfg!(target_os = "linux") {
        eprintln!("not Linux: provable death is not testable here");
        return None;
    }
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let parts: Vec<&str> = start.strip_prefix('b').unwrap_or("").split('.').collect();
    let ns = match parts.as_slice() {
        [boot, ticks, ns] if digits(boot) && digits(ticks) => ns.strip_prefix('n'),
        _ => None,
    };
    let ns = ns
        .filter(|ns| digits(ns))
        .unwrap_or_else(|| panic!("on Linux the worker id must carry /proc's start time: {me}"));
    Some(WorkerId::new(host, pid, &format!("b1.1.n{ns}")))
}

fn unreachable_pg(reason: &str) -> Option<(String, String)> {
    if ci() {
        panic!("PostgreSQL is unreachable in CI: {reason}");
    }
    skip_loudly(reason);
    None
}

/// An empty database nothing has opened yet: its URL and what removes it at the end.
/// For tests that first shape a database the way an older flow left it.
pub struct EmptyDb {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    _pg: PgDrop,
}

/// A fresh, empty database on `backend`, or `None` when PostgreSQL is skipped.
pub async fn empty_database(backend: Backend) -> Option<EmptyDb> {
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("tempdir");
            let url = format!("sqlite://{}/flow.db", dir.path().display());
            Some(EmptyDb {
                url,
                _dir: Some(dir),
                _pg: PgDrop(None),
            })
        }
        Backend::Postgres => {
            let (url, name) = fresh_pg_database().await?;
            Some(EmptyDb {
                url,
                _dir: None,
                _pg: PgDrop(Some(name)),
            })
        }
    }
}

pub fn options() -> OpenOptions {
    OpenOptions::default()
}

/// A fresh ledger on a PostgreSQL database created with `options` (see
/// [`fresh_pg_database_with`]), or `None` when PostgreSQL is skipped.
pub async fn open_postgres_with(options: &str) -> Option<TestDb> {
    let (url, name) = fresh_pg_database_with(options).await?;
    let guard = PgDrop(Some(name));
    let ledger = Ledger::open(&url, self::options())
        .await
        .expect("open postgres");
    Some(TestDb {
        ledger,
        url,
        clock: ManualClock::new(T0),
        _dir: None,
        _pg: guard,
    })
}

/// A fresh ledger on `backend`, or `None` when PostgreSQL is skipped.
pub async fn open(backend: Backend, opts: OpenOptions) -> Option<TestDb> {
    let clock = ManualClock::new(T0);
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("tempdir");
            let url = format!("sqlite://{}/ledger/flow.db", dir.path().display());
            let ledger = Ledger::open(&url, opts).await.expect("open sqlite");
            Some(TestDb {
                ledger,
                url,
                clock,
                _dir: Some(dir),
                _pg: PgDrop(None),
            })
        }
        Backend::Postgres => {
            let (url, name) = fresh_pg_database().await?;
            let guard = PgDrop(Some(name));
            let ledger = Ledger::open(&url, opts).await.expect("open postgres");
            Some(TestDb {
                ledger,
                url,
                clock,
                _dir: None,
                _pg: guard,
            })
        }
    }
}

/// Generates `sqlite::<name>` and `postgres::<name>` tests from `async fn name(db: TestDb)`.
#[macro_export]
macro_rules! conformance {
    ($($name:ident),+ $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let db = $crate::common::open($crate::common::Backend::Sqlite, $crate::common::options())
                        .await
                        .expect("sqlite");
                    super::$name(db).await;
                }
            )+
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(db) = $crate::common::open($crate::common::Backend::Postgres, $crate::common::options()).await {
                        super::$name(db).await;
                    }
                }
            )+
        }
    };
}

// ---------------------------------------------------------------------------------------
// Helpers shared by the tests.

pub fn worker(name: &str) -> WorkerId {
    WorkerId::new(&format!("test-host-{name}"), 1, "1")
}

pub fn new_run(id: &str) -> NewRun {
    NewRun {
        id: id.to_owned(),
        workflow_name: "wf".into(),
        workflow_text: "name: wf\nnodes: {}\n".into(),
        inputs: json!({"order": 42}),
        priority: 0,
        not_before: None,
        trace_parent: None,
    }
}

/// Enqueues `run_id` and claims it with `w`.
pub async fn running(db: &TestDb, run_id: &str, w: &WorkerId) -> RunLease {
    let now = db.now();
    db.ledger
        .enqueue(new_run(run_id), now)
        .await
        .expect("enqueue");
    db.ledger
        .claim_run(run_id, w, LEASE, now)
        .await
        .expect("claim run")
}

pub fn step(step_id: &str, node: &str, retry: u32) -> NewStep {
    NewStep {
        step_id: step_id.into(),
        node_id: node.into(),
        retry,
        not_before: None,
        status: StepStatus::Running,
    }
}

pub fn claim<'a>(
    run: &'a RunLease,
    step_id: &str,
    node: &str,
    key: &str,
    request: Value,
) -> ClaimCall<'a> {
    ClaimCall {
        run,
        step_id: step_id.into(),
        tool_call_id: node.into(),
        tool: "payments".into(),
        idempotency_key: key.into(),
        request_hash: canonical_hash(&request),
        request,
        retry_failed: false,
        lease: LEASE,
    }
}

pub fn claimed(c: CallClaim) -> CallLease {
    match c {
        CallClaim::Claimed(l) => l,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

pub fn complete_ok(lease: &CallLease, output: Value) -> CompleteCall<'_> {
    CompleteCall {
        lease,
        outcome: flow_ledger::CallOutcome::Succeeded(output),
        requests_sent: 1,
        step: None,
        next_step: None,
    }
}

/// Runs a step through claim → outbound → complete(succeeded).
pub async fn call_ok(
    db: &TestDb,
    run: &RunLease,
    node: &str,
    key: &str,
    output: Value,
) -> CallLease {
    let now = db.now();
    db.ledger
        .create_step(run, step(node, node, 0), now)
        .await
        .expect("step");
    let lease = claimed(
        db.ledger
            .claim_call(claim(run, node, node, key, json!({"n": node})), now)
            .await
            .expect("claim"),
    );
    db.ledger
        .mark_outbound(&lease, now)
        .await
        .expect("outbound");
    db.ledger
        .complete_call(complete_ok(&lease, output), now)
        .await
        .expect("complete");
    lease
}

/// Event type names of a run, in order.
pub async fn event_types(db: &TestDb, run_id: &str) -> Vec<String> {
    db.ledger
        .list_events(flow_ledger::EventFilter {
            run_id: Some(run_id.into()),
            ..Default::default()
        })
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.event_type.as_str().to_owned())
        .collect()
}

/// One integer the test asks the database directly (not through the ledger).
pub async fn scalar(url: &str, sql: &str) -> i64 {
    use sqlx::Connection;
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    if url.starts_with("sqlite:") {
        let mut c = sqlx::SqliteConnection::connect(url).await.expect("connect");
        sqlx::query_scalar(sql).fetch_one(&mut c).await.expect(url)
    } else {
        let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
        sqlx::query_scalar(sql).fetch_one(&mut c).await.expect(url)
    }
}

/// The holder of `lease` marks its call outbound, one request leaves and its outcome is
/// lost (`message`): the call is in doubt.
pub async fn sent_then_in_doubt(db: &TestDb, lease: &CallLease, message: &str) {
    db.ledger.mark_outbound(lease, db.now()).await.unwrap();
    let report = flow_ledger::InDoubtReport {
        requests_sent: 1,
        message: message.into(),
    };
    db.ledger
        .mark_in_doubt(lease, report, db.now())
        .await
        .unwrap();
}

/// One round of the lost-wake-up race every kind of hold must win: `settle` (a
/// decision, a publish, a child's end) and the pause of `run` (whose step still runs)
/// start at the same moment. Whichever order the database puts them in, the run is not
/// left paused over a settled hold: if it paused, the settle put it back on the queue;
/// if not, it still runs and its worker looks again (`ledger/src/holds/`).
pub async fn race_settle_and_pause(
    db: &TestDb,
    run: RunLease,
    settle: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let (b1, b2) = (barrier.clone(), barrier);
    let (ledger, now, run_id) = (db.ledger.clone(), db.now(), run.run_id.clone());
    let settler = tokio::spawn(async move {
        b1.wait().await;
        settle.await;
    });
    let pauser = tokio::spawn(async move {
        b2.wait().await;
        ledger.pause_run_awaiting(&run, "awaiting", now).await
    });
    settler.await.expect("the settle ran");
    let paused = pauser.await.expect("the pause ran").expect("pause");
    let status = db.ledger.get_run(&run_id).await.expect("run").status;
    let expected = if paused {
        RunStatus::Queued
    } else {
        RunStatus::Running
    };
    assert_eq!(status, expected, "{run_id}: paused {paused}");
}

/// An approval rule with no reminders: what a sweep of holds is given by tests about
/// deadlines and orphaned holds.
pub fn no_reminders(_: &Value, _: u32, _: Timestamp) -> Option<Timestamp> {
    None
}

/// The rules the daemons' timer watcher is given, with approval reminders from
/// `next_remind`.
pub fn timer_rules(
    next_remind: fn(&Value, u32, Timestamp) -> Option<Timestamp>,
) -> flow_ledger::TimerRules {
    flow_ledger::TimerRules {
        next_remind,
        probe_by: "reconcile",
    }
}

/// The daemons' timer watcher at `now`, as far as holds go: what their timers did.
pub async fn sweep_holds(
    ledger: &Ledger,
    now: Timestamp,
    limit: u32,
    next_remind: fn(&Value, u32, Timestamp) -> Option<Timestamp>,
) -> Result<flow_ledger::SweptHolds, flow_ledger::Error> {
    let fired = ledger
        .fire_due_timers(now, limit, timer_rules(next_remind))
        .await?;
    Ok(fired.holds)
}

/// The daemons' timers of holds at the test clock's now, without reminders.
pub async fn sweep(db: &TestDb) -> flow_ledger::SweptHolds {
    sweep_holds(&db.ledger, db.now(), 100, no_reminders)
        .await
        .unwrap()
}
