//! How many PostgreSQL sessions a command opens. Each one is a start-up (off loopback, a
//! TLS handshake when the server offers it), so a command that does one
//! thing after another must open exactly one.

use std::time::{Duration, Instant};

use sqlx::Connection as _;

use crate::support::{Backend, TestDb, output, postgres_available, repo, run_id, runtime, stderr};

/// Sessions ever established on the current database (`pg_stat_database.sessions`).
/// A backend adds its own session to the count when it flushes its statistics, at the
/// latest when it exits; so this first waits until no `flow` backend is left.
fn sessions_when_settled(rt: &tokio::runtime::Runtime, conn: &mut sqlx::PgConnection) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let live: i64 = rt
            .block_on(
                sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = 'flow'",
                )
                .fetch_one(&mut *conn),
            )
            .expect("pg_stat_activity");
        if live == 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // A backend leaves pg_stat_activity and flushes its counters in the same exit path.
    std::thread::sleep(Duration::from_millis(100));
    rt.block_on(
        sqlx::query_scalar(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&mut *conn),
    )
    .expect("pg_stat_database")
}

/// Reads, `submit`, `cancel` and `migrate` open one session each. Before, every command
/// opened three: a direct connection to check the server, the pool's eager first one, and
/// a second pool connection for an operation that started before the previous one's
/// connection was back in the pool.
#[test]
fn one_shot_commands_open_one_postgres_session() {
    if !postgres_available() {
        return;
    }
    let rt = runtime();
    let db = TestDb::new(Backend::Postgres);
    let hello = repo().join("workflows/hello.yaml");
    let out = output(
        db.flow()
            .arg("run")
            .arg(&hello)
            .args(["--input", "name=Ada"]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let run = run_id(&out);
    let out = output(
        db.flow()
            .arg("submit")
            .arg(&hello)
            .args(["--input", "name=Bo"]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let queued = crate::support::stdout(&out).trim().to_owned();

    let mut conn = rt
        .block_on(sqlx::PgConnection::connect(&db.url))
        .expect("connect");
    let hello = hello.display().to_string();
    let commands: Vec<Vec<&str>> = vec![
        vec!["runs"],
        vec!["runs", "--json"],
        vec!["show", &run],
        vec!["show", &run, "--json"],
        vec!["migrate"],
        vec!["submit", &hello, "--input", "name=Cy"],
        vec!["cancel", &queued],
    ];
    for args in commands {
        let before = sessions_when_settled(&rt, &mut conn);
        let out = output(db.flow().args(&args));
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        let opened = sessions_when_settled(&rt, &mut conn) - before;
        assert_eq!(
            opened,
            1,
            "`flow {}` opened {opened} sessions",
            args.join(" ")
        );
    }
    rt.block_on(conn.close()).expect("close");
}
