//! SQLite specifics: URL parsing, connection settings, migrations.
//!
//! WAL lets readers run beside the single writer; `synchronous=FULL` makes each commit
//! durable (the `outbound` mark must survive power loss); `busy_timeout` makes a writer
//! wait for another instead of failing; every write transaction is `BEGIN IMMEDIATE`
//! (see `db::Pool::begin`).

use std::path::Path;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

use sqlx::ConnectOptions;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};

use crate::error::Error;
use crate::options::{OpenOptions, SqliteSynchronous as Sync};

/// The SQLite migrations, embedded at build time.
pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

/// The file path of a `sqlite://PATH` or `sqlite:PATH` URL (query string dropped);
/// `None` for any other URL. Commands that only read check that it exists before opening.
pub fn path_of(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    Some(rest.split('?').next().unwrap_or(rest))
}

/// Whether a `sqlite:` URL asks for a read-only ledger (`?mode=ro`, SQLite's own URI
/// parameter): the file is then opened read-only, never created, migrated or written.
pub fn is_read_only_url(url: &str) -> bool {
    if path_of(url).is_none() {
        return false;
    }
    url.split_once('?').is_some_and(|(_, query)| {
        query
            .split('&')
            .any(|pair| pair.eq_ignore_ascii_case("mode=ro"))
    })
}

/// Opens the group-commit writer's own connection and creates the pool (reads,
/// migrations), which connects at its first use.
/// With `read_only`, every connection is opened read-only (SQLite itself then refuses
/// any write) and a missing file is an error instead of being created.
pub(crate) async fn connect(
    path: &str,
    url_redacted: &str,
    opts: &OpenOptions,
    read_only: bool,
) -> Result<(SqlitePool, SqliteConnection), Error> {
    let unavailable = |reason: String| Error::Unavailable {
        url: url_redacted.to_owned(),
        reason,
    };
    if path.is_empty() {
        return Err(unavailable("empty SQLite path".into()));
    }
    if read_only && !Path::new(path).is_file() {
        return Err(unavailable(format!(
            "{path} does not exist (a read-only ledger is never created)"
        )));
    }
    if let Some(parent) = Path::new(path).parent()
        && !parent.as_os_str().is_empty()
        && !read_only
    {
        std::fs::create_dir_all(parent)
            .map_err(|e| unavailable(format!("cannot create {}: {e}", parent.display())))?;
    }
    let sync = match opts.sqlite_synchronous {
        Sync::Full => SqliteSynchronous::Full,
        Sync::Normal => SqliteSynchronous::Normal,
    };
    let connect = SqliteConnectOptions::new().filename(path);
    // Read-only: no journal-mode switch (a write to the header) and no file creation.
    let connect = if read_only {
        connect.read_only(true).create_if_missing(false)
    } else {
        connect
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
    };
    let connect = connect
        .synchronous(sync)
        .busy_timeout(opts.busy_timeout)
        .foreign_keys(true)
        // Savepoints (one per group-commit job) and big statements spill to temporary
        // files by default: a create, write and unlink per batch. Keep them in memory.
        .pragma("temp_store", "memory")
        .statement_cache_capacity(256);
    let max = if opts.max_connections == 0 {
        8
    } else {
        opts.max_connections
    };
    let pool_options = SqlitePoolOptions::new()
        .max_connections(max)
        .acquire_timeout(opts.connect_timeout.max(opts.busy_timeout * 2));
    // The writer's connection is the first one (it creates the file and switches it to
    // WAL); the pool connects when something first reads. A one-shot `flow run` of pure
    // nodes never does: each SQLite connection reads and parses the whole schema when it
    // opens (~4% of a 102-node run's instructions) and gets a thread of its own.
    let writer = while_busy(opts.busy_timeout, || connect.connect())
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    let pool = pool_options.connect_lazy_with(connect);
    Ok((pool, writer))
}

/// Retries `attempt` while SQLite answers "database is locked", for up to `patience`.
///
/// Opening a connection switches a new file to WAL, which needs exclusive access. When
/// two processes open a brand-new file at once, both read it and both try to upgrade;
/// SQLite refuses one of them with `SQLITE_BUSY` at once instead of calling its busy
/// handler (waiting would deadlock). Seen in CI: `flow show`, polling for a run, failed
/// with exit 5 while `flow run` was opening the same new file. The refused one only
/// has to try again; this waits as long as `busy_timeout` lets any statement wait.
/// Only the writer's connection, a process's first, needs it: the pool's connect later,
/// to a file this process already switched to WAL (which lasts).
async fn while_busy<T, F, Fut>(patience: Duration, attempt: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let started = std::time::Instant::now();
    let pauses = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(5))
        .with_max_delay(Duration::from_millis(100))
        .without_max_times();
    attempt
        .retry(pauses)
        .when(|e| is_busy(e) && started.elapsed() < patience)
        .await
}

/// `SQLITE_BUSY` and its extended codes (the low byte is 5).
fn is_busy(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| c & 0xff == 5),
        _ => false,
    }
}
