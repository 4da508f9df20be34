//! A SQLite ledger that answers reads but cannot be written must not look healthy, and
//! a daemon whose write-ahead log was deleted under it stops before it writes (marks)
//! anything more. Before, `/healthz` only read (200 while another process held the
//! write lock for a minute), and after `rm flow.db-wal` a daemon went on marking and
//! sending into the unlinked file, which a SIGKILL then lost: resuming sent those keys
//! again.

use std::time::Duration;

use flow_adapters::testkit::http::{Behavior, CountingServer};

use super::{Daemon, free_port, http_get, slow_then_next, submit, wait_until};
use crate::support::{Backend, TestDb, show};

#[test]
fn healthz_fails_while_another_process_holds_the_write_lock() {
    let rt = crate::support::runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("slow.yaml", &slow_then_next(&down.url()));
    let run = submit(&db, &file);
    let addr = free_port();
    let addr_arg = addr.to_string();
    let d = Daemon::start(
        &db,
        "d",
        &["--poll-interval", "100ms", "--metrics-addr", &addr_arg],
        &[],
    );
    wait_until(Duration::from_secs(20), "the run and /healthz", || {
        show(&db, &run)["run"]["status"] == "succeeded"
            && http_get(addr, "/healthz").is_some_and(|(code, _)| code == 200)
    });
    // Another connection (another process would do the same) takes SQLite's write lock
    // and keeps it.
    let holder = WriteLock::take(&rt, &db);
    let (code, body) = http_get(addr, "/healthz").expect("healthz answers");
    assert_eq!(
        code, 503,
        "a ledger nobody can write is not healthy: {body}"
    );
    holder.release(&rt);
    wait_until(Duration::from_secs(15), "/healthz recovers", || {
        http_get(addr, "/healthz").is_some_and(|(code, _)| code == 200)
    });
    drop(d);
}

#[test]
fn a_daemon_whose_wal_was_deleted_stops_before_it_writes_again() {
    let rt = crate::support::runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    down.set("/slow", Behavior::hold(Duration::from_secs(2)));
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("slow.yaml", &slow_then_next(&down.url()));
    let run = submit(&db, &file);
    let mut d = Daemon::start(&db, "d", &["--poll-interval", "100ms"], &[]);
    wait_until(Duration::from_secs(20), "slow in flight", || {
        down.count(&format!("{run}:slow:1")) == 1
    });
    // The operator deletes the WAL under the running daemon (what it held — the claim
    // and the mark — is lost with it; nothing can bring that back).
    let wal = db.dir.path().join("flow.db-wal");
    std::fs::remove_file(&wal).expect("rm flow.db-wal");
    let status = d.wait(Duration::from_secs(30));
    assert_eq!(status.code(), Some(5), "exit 5:\n{}", d.log());
    assert!(
        d.log().contains("write-ahead log") && d.log().contains("restart it"),
        "{}",
        d.log()
    );
    assert_eq!(
        down.count(&format!("{run}:next:1")),
        0,
        "nothing more was marked and sent after the WAL went"
    );
}

/// An answer in hand survives a short ledger outage (issue 49, break 8): the outcome
/// write meets a write lock held past `busy_timeout` (5 s) and is retried while this
/// worker holds the call, instead of leaving the answered call in doubt.
#[test]
fn an_answer_in_hand_survives_a_write_lock_held_past_the_busy_timeout() {
    let rt = crate::support::runtime();
    let down = rt.block_on(CountingServer::start()).expect("downstream");
    down.set("/slow", Behavior::hold(Duration::from_millis(1_500)));
    let db = TestDb::new(Backend::Sqlite);
    let file = db.write("slow.yaml", &slow_then_next(&down.url()));
    let log = db.dir.path().join("run.log");
    let mut run = db
        .flow()
        .arg("run")
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("flow run");
    wait_until(Duration::from_secs(20), "slow in flight", || {
        down.total() == 1
    });
    let holder = WriteLock::take(&rt, &db);
    // The answer comes back while the lock is held; keep it past busy_timeout.
    std::thread::sleep(Duration::from_secs(7));
    holder.release(&rt);
    let status = run.wait().expect("flow run exits");
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "the run finishes:\n{said}");
    let id = crate::support::run_id_in_text(&said);
    let s = show(&db, &id);
    assert_eq!(
        crate::support::call(&s, "slow")["status"],
        "succeeded",
        "{s:#}"
    );
    assert_eq!(down.total(), 2, "slow once, next once");
}

/// SQLite's write lock taken by a connection of this test (another process holding it
/// would be the same to flow), held until released.
struct WriteLock(sqlx::SqliteConnection);

impl WriteLock {
    fn take(rt: &tokio::runtime::Runtime, db: &TestDb) -> Self {
        let path = db.dir.path().join("flow.db");
        rt.block_on(async {
            use sqlx::{ConnectOptions as _, Executor as _};
            let mut c = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .connect()
                .await
                .expect("a second connection");
            c.execute("BEGIN IMMEDIATE").await.expect("the write lock");
            WriteLock(c)
        })
    }

    fn release(mut self, rt: &tokio::runtime::Runtime) {
        rt.block_on(async {
            use sqlx::Executor as _;
            self.0.execute("ROLLBACK").await.expect("release the lock");
        });
    }
}
