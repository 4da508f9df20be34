//! Opening: URLs, errors, scopes, migrations.

use std::time::Duration;

use flow_ledger::{ClaimRuns, Error, Ledger, OpenOptions, RunFilter, Scope};
use sqlx::Connection;

use crate::common::*;

crate::conformance!(
    scopes_never_see_each_other,
    migrate_is_idempotent,
    an_edited_or_unknown_migration_is_still_refused,
    planner_statistics_follow_a_burst
);

async fn scopes_never_see_each_other(db: TestDb) {
    let other = Ledger::open(
        &db.url,
        OpenOptions {
            scope: Scope {
                tenant: "acme".into(),
                workspace: "prod".into(),
            },
            ..OpenOptions::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(other.scope().tenant, "acme");
    // The same run id in two scopes: two runs, no conflict.
    db.ledger.enqueue(new_run("run_a"), db.now()).await.unwrap();
    let mut diff = new_run("run_a");
    diff.inputs = serde_json::json!({"other": true});
    assert!(other.enqueue(diff, db.now()).await.unwrap().created);
    let w = worker("1");
    let got = other
        .claim_next(
            ClaimRuns {
                worker: &w,
                lease: LEASE,
                limit: 10,
            },
            db.now(),
        )
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    // The default scope's run is untouched and its events are its own.
    assert_eq!(
        db.ledger.get_run("run_a").await.unwrap().status,
        flow_ledger::RunStatus::Queued
    );
    assert_eq!(
        db.ledger
            .list_runs(RunFilter::default())
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(event_types(&db, "run_a").await, vec!["run.queued"]);
    // Same key in two scopes: independent calls.
    let la = running(&db, "run_b", &w).await;
    claimed(
        db.ledger
            .claim_call(
                claim(&la, "pay", "pay", "shared", serde_json::json!({})),
                db.now(),
            )
            .await
            .unwrap(),
    );
    let lb = &got[0];
    claimed(
        other
            .claim_call(
                claim(lb, "pay", "pay", "shared", serde_json::json!({"x": 1})),
                db.now(),
            )
            .await
            .unwrap(),
    );
}

/// Opening skips sqlx's migrator when the ledger holds exactly this build's migrations;
/// anything else must still reach it: an applied migration whose text changed, and a
/// ledger migrated by a newer flow (a version this build does not carry).
async fn an_edited_or_unknown_migration_is_still_refused(db: TestDb) {
    let sqlite = db.url.starts_with("sqlite:");
    let opts = || OpenOptions {
        migrate: true,
        ..OpenOptions::default()
    };
    // Migrated: opening again (the fast path) works.
    Ledger::open(&db.url, opts()).await.unwrap().close().await;
    // A version from the future, then gone again.
    let newer = "INSERT INTO _sqlx_migrations (version, description, installed_on, success, checksum, execution_time)
        SELECT 999999, 'from a newer flow', installed_on, success, checksum, execution_time
        FROM _sqlx_migrations WHERE version = 2 RETURNING version";
    assert_eq!(scalar(&db.url, newer).await, 999_999);
    let unknown = Ledger::open(&db.url, opts()).await;
    assert!(
        unknown.is_err(),
        "an unknown applied migration must be refused"
    );
    let forget = "DELETE FROM _sqlx_migrations WHERE version = 999999 RETURNING version";
    assert_eq!(scalar(&db.url, forget).await, 999_999);
    Ledger::open(&db.url, opts()).await.unwrap().close().await;
    // An applied migration whose text changed.
    let edit = if sqlite {
        "UPDATE _sqlx_migrations SET checksum = X'00' WHERE version = 1 RETURNING version"
    } else {
        "UPDATE _sqlx_migrations SET checksum = '\\x00'::bytea WHERE version = 1 RETURNING version"
    };
    assert_eq!(scalar(&db.url, edit).await, 1);
    let edited = Ledger::open(&db.url, opts()).await;
    assert!(
        matches!(&edited, Err(e) if e.to_string().contains("modified")),
        "an edited migration must be refused: {edited:?}"
    );
}

async fn migrate_is_idempotent(db: TestDb) {
    db.ledger.migrate().await.unwrap();
    let again = Ledger::open(
        &db.url,
        OpenOptions {
            migrate: false,
            ..OpenOptions::default()
        },
    )
    .await
    .unwrap();
    again.migrate().await.unwrap();
    again.enqueue(new_run("run_a"), db.now()).await.unwrap();
    assert!(!again.url_redacted().is_empty());
}

#[tokio::test]
async fn unknown_scheme_is_a_typed_error() {
    match Ledger::open("mysql://u:pw@h/db", OpenOptions::default()).await {
        Err(Error::UnsupportedUrl { url }) => assert_eq!(url, "mysql://u:***@h/db"),
        other => panic!("expected UnsupportedUrl, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn unreachable_postgres_is_unavailable_with_the_password_hidden() {
    let opts = OpenOptions {
        connect_timeout: Duration::from_secs(2),
        ..OpenOptions::default()
    };
    // Port 1 on loopback: nothing listens there.
    match Ledger::open("postgres://flow:hunter2@127.0.0.1:1/flow", opts).await {
        Err(e @ Error::Unavailable { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("postgres://flow:***@127.0.0.1:1/flow"),
                "{text}"
            );
            assert!(!text.contains("hunter2"), "{text}");
        }
        other => panic!("expected Unavailable, got {:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn sqlite_creates_its_directory_and_accepts_both_url_forms() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("a/b/flow.db");
    let l = Ledger::open(
        &format!("sqlite:{}", deep.display()),
        OpenOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(l.backend_name(), "sqlite");
    assert!(deep.exists());
    l.close().await;
    let l = Ledger::open(
        &format!("sqlite://{}?mode=rwc", deep.display()),
        OpenOptions::default(),
    )
    .await
    .unwrap();
    l.enqueue(new_run("run_a"), T0).await.unwrap();
    // A path that cannot be created: Unavailable, not a panic.
    let blocked = dir.path().join("file");
    std::fs::write(&blocked, b"x").unwrap();
    let url = format!("sqlite://{}/sub/flow.db", blocked.display());
    assert!(matches!(
        Ledger::open(&url, OpenOptions::default()).await,
        Err(Error::Unavailable { .. })
    ));
}

/// A new database meeting a burst: once the runs outnumber what the statistics say,
/// the refresh (either form) analyzes `runs` (PostgreSQL), after which a run is found by its primary
/// key rather than by scanning the tenant through another index; then nothing is
/// stale. A hundred runs are enough (the floor was 1,000 changed rows, and a 500-run
/// drain met plans made for an empty database throughout). SQLite has nothing to
/// refresh.
async fn planner_statistics_follow_a_burst(db: TestDb) {
    let pg = db.url.starts_with("postgres");
    for i in 0..100 {
        db.ledger
            .enqueue(new_run(&format!("run_{i:05}")), db.now())
            .await
            .unwrap();
    }
    if !pg {
        assert!(
            db.ledger
                .refresh_planner_statistics()
                .await
                .unwrap()
                .is_empty()
        );
        return;
    }
    // The server's activity counters lag a little behind the commits. The check a
    // one-shot command makes beside its run (on a connection of its own) analyzes too.
    let started = std::time::Instant::now();
    loop {
        let analyzed = db.ledger.refresh_planner_statistics_aside().await.unwrap();
        if analyzed.iter().any(|t| t == "runs") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "runs never found stale: {analyzed:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let again = db.ledger.refresh_planner_statistics().await.unwrap();
    assert!(!again.iter().any(|t| t == "runs"), "{again:?}");
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    // A hundred runs fill a few pages, where a sequential scan beats any index: the
    // question is which index, so scans are ruled out (before the ANALYZE this
    // picks an index that only starts with (tenant, workspace)).
    sqlx::query("SET enable_seqscan = off")
        .execute(&mut conn)
        .await
        .unwrap();
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT 1 FROM runs WHERE tenant = 'default' AND workspace = 'default' \
         AND id = 'run_00060'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(
        plan.iter().any(|l| l.contains("runs_pkey")),
        "{}",
        plan.join("\n")
    );
}

/// `?mode=ro` (SQLite): reads work, every write is refused with `ReadOnly` before it
/// reaches the database, and a missing file is not created.
#[tokio::test]
async fn sqlite_read_only_urls_read_and_refuse_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.db");
    let url = format!("sqlite://{}", path.display());
    let rw = Ledger::open(&url, OpenOptions::default()).await.unwrap();
    rw.enqueue(new_run("run_ro"), T0).await.unwrap();
    rw.close().await;
    let size = std::fs::metadata(&path).unwrap().len();
    let ro = Ledger::open(&format!("{url}?mode=ro"), OpenOptions::default())
        .await
        .unwrap();
    assert!(ro.is_read_only());
    assert_eq!(ro.get_run("run_ro").await.unwrap().id, "run_ro");
    assert_eq!(ro.list_runs(RunFilter::default()).await.unwrap().len(), 1);
    assert!(matches!(
        ro.enqueue(new_run("run_2"), T0).await,
        Err(Error::ReadOnly { .. })
    ));
    assert!(matches!(
        ro.request_cancel("run_ro", T0).await,
        Err(Error::ReadOnly { .. })
    ));
    assert!(matches!(ro.migrate().await, Err(Error::ReadOnly { .. })));
    ro.close().await;
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    let missing = dir.path().join("sub/missing.db");
    let err = Ledger::open(
        &format!("sqlite://{}?mode=ro", missing.display()),
        OpenOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
    assert!(!missing.exists() && !missing.parent().unwrap().exists());
}

/// Whether the ledger's own connections to the database at `url` use TLS
/// (`pg_stat_ssl`, read from another connection while the ledger holds its pool).
async fn ledger_uses_tls(url: &str, admin: &mut sqlx::PgConnection) -> bool {
    let ledger = Ledger::open(url, OpenOptions::default()).await.unwrap();
    ledger.ping().await.unwrap();
    let listed = "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
         WHERE a.datname = current_database() AND a.application_name = 'flow'";
    let ssl: Vec<bool> = sqlx::query_scalar(listed)
        .fetch_all(&mut *admin)
        .await
        .unwrap();
    ledger.close().await;
    // Gone before the next look, which must see only its own ledger's connections.
    let started = std::time::Instant::now();
    while !sqlx::query_scalar::<_, bool>(listed)
        .fetch_all(&mut *admin)
        .await
        .unwrap()
        .is_empty()
    {
        assert!(started.elapsed() < Duration::from_secs(10), "never closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!ssl.is_empty(), "the ledger's connection is not listed");
    ssl.iter().all(|s| *s)
}

/// A server on loopback is reached in plain text (TLS there protects nothing and costs
/// each connection a handshake) unless the URL asks for TLS, which is then used.
#[tokio::test]
async fn a_loopback_server_is_reached_without_tls_unless_the_url_asks() {
    let Some((url, name)) = fresh_pg_database().await else {
        assert!(!ci(), "PostgreSQL is required in CI");
        return;
    };
    let _drop = PgDrop::new(name);
    assert!(
        url.contains("127.0.0.1") || url.contains("localhost"),
        "this test needs a loopback server: {url}"
    );
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    assert!(
        !ledger_uses_tls(&url, &mut admin).await,
        "plain on loopback"
    );
    let server_tls: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    if server_tls == "on" {
        let sep = if url.contains('?') { '&' } else { '?' };
        let asked = format!("{url}{sep}sslmode=require");
        assert!(ledger_uses_tls(&asked, &mut admin).await, "TLS when asked");
    }
}

/// A server, database or role may default to `synchronous_commit = off`, under which
/// PostgreSQL acknowledges a commit a crash of the server can lose — an outbound mark
/// among them, and with it the record that a request left. flow's own connections say
/// `on` all the same (also against `off` in the URL's driver options), or what the URL's
/// `synchronous_commit=` asks; a weaker level there is refused before connecting.
#[tokio::test]
async fn flows_connections_commit_synchronously_whatever_the_servers_default() {
    let Some((url, name)) = fresh_pg_database().await else {
        assert!(!ci(), "PostgreSQL is required in CI");
        return;
    };
    let _drop = PgDrop::new(name.clone());
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    let off = format!("ALTER DATABASE {name} SET synchronous_commit = off");
    sqlx::query(sqlx::AssertSqlSafe(off))
        .execute(&mut admin)
        .await
        .unwrap();
    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    let theirs: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert_eq!(theirs, "off", "the database's default for a new session");

    let sep = if url.contains('?') { '&' } else { '?' };
    let opts = || OpenOptions {
        max_connections: 3,
        ..OpenOptions::default()
    };
    for (url, expected) in [
        (url.clone(), "on"),
        (format!("{url}{sep}options[synchronous_commit]=off"), "on"),
        (
            format!("{url}{sep}synchronous_commit=remote_apply"),
            "remote_apply",
        ),
        (
            format!("{url}{sep}synchronous_commit=remote_write"),
            "remote_write",
        ),
    ] {
        let ledger = Ledger::open(&url, opts()).await.unwrap();
        // Three at once: the pool opens more than its first connection.
        let (a, b, c) = tokio::join!(
            ledger.postgres_setting("synchronous_commit"),
            ledger.postgres_setting("synchronous_commit"),
            ledger.postgres_setting("synchronous_commit"),
        );
        for got in [a, b, c] {
            assert_eq!(got.unwrap().as_deref(), Some(expected), "{url}");
        }
        ledger.close().await;
    }
    let weaker = format!("{url}{sep}synchronous_commit=off");
    let err = Ledger::open(&weaker, opts()).await.unwrap_err();
    assert!(
        matches!(&err, Error::Unavailable { reason, .. } if reason.contains("synchronous_commit=off")),
        "{err}"
    );
}
