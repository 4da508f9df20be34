//! PostgreSQL specifics: connection settings and migrations.
//!
//! The run queue is claimed with `FOR UPDATE SKIP LOCKED`, call claims with
//! `INSERT … ON CONFLICT DO NOTHING` followed by `SELECT … FOR UPDATE` (in `runs.rs` and
//! `calls.rs`); everything else is the SQL shared with SQLite.

use std::str::FromStr;
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgSslMode};

use crate::error::Error;
use crate::options::OpenOptions;

/// The PostgreSQL migrations, embedded at build time.
pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// How long the pool's first connection may take before a direct connection is opened
/// to learn why it is slow (see [`connect`]).
const DIAGNOSE_AFTER: Duration = Duration::from_millis(250);

/// Opens the pool with exactly one connection; more are opened only while that many
/// operations overlap (up to `max_connections`). A one-shot command used to pay for three
/// sessions — a direct connection opened and closed to check the server, the pool's
/// eager first one, and a second pool connection when an operation started before the
/// previous one's connection was back in the pool (sqlx returns it on a spawned task) —
/// each a TLS handshake when the server offers TLS.
///
/// A pool reports only "timed out", and it retries a refused connection silently until
/// then; the operator needs the reason (connection refused, unknown database,
/// authentication failed). Errors other than refusals come back from the pool at once;
/// if it has not connected after [`DIAGNOSE_AFTER`], one direct connection is opened to
/// find the reason, and closed if it succeeds (the server was merely slow).
pub(crate) async fn connect(
    url: &str,
    url_redacted: &str,
    opts: &OpenOptions,
) -> Result<PgPool, Error> {
    let bad_url = |reason: String| Error::Unavailable {
        url: url_redacted.to_owned(),
        reason: format!("bad URL: {reason}"),
    };
    let (url, commit) = SynchronousCommit::from_url(url).map_err(bad_url)?;
    let url = url.as_str();
    let connect = PgConnectOptions::from_str(url)
        .map_err(|e| bad_url(e.to_string()))?
        .statement_cache_capacity(256)
        .application_name("flow");
    let opened = Opening {
        url_redacted,
        opts,
        commit,
    };
    if let Some(plain) = loopback_without_tls(&connect, url) {
        match open_pool(&plain, &opened).await {
            // The server answered and refused (a loopback server that accepts only
            // TLS, say): try again as the URL alone would have connected.
            Err(Refused {
                by_server: true, ..
            }) => {}
            done => return done.map_err(|r| r.error),
        }
    }
    open_pool(&connect, &opened).await.map_err(|r| r.error)
}

/// What [`open_pool`] opens with, besides the connection options.
struct Opening<'a> {
    url_redacted: &'a str,
    opts: &'a OpenOptions,
    commit: SynchronousCommit,
}

/// `synchronous_commit` on flow's own sessions. An `outbound` mark is what keeps a
/// request from leaving twice, so its commit must survive a crash of the server before
/// flow sends: PostgreSQL acknowledges a commit under `off` before its WAL is on disk
/// (a crash loses up to three `wal_writer_delay`s of them, 0.6 s by default), and a
/// server, database or role may default to that for its other clients. flow therefore sets the level itself on every pooled
/// connection, whatever the server's default: `on` unless the URL's
/// `synchronous_commit=` asks for `remote_write` or `remote_apply` (weaker levels are
/// refused).
///
/// With a synchronous standby (`synchronous_standby_names`), `on` also waits for the
/// standby to flush the commit, `remote_apply` for it to apply it (reads there see the
/// mark), `remote_write` only for its operating system to have it (a crash of both
/// machines can lose it). Without one, all three wait for the primary's disk alone, and
/// a standby promoted after a failover (an asynchronous one) can lack acknowledged
/// marks: the README's guarantees hold for a primary that survives or a synchronous
/// standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SynchronousCommit {
    On,
    RemoteWrite,
    RemoteApply,
}

impl SynchronousCommit {
    /// The URL's query parameter that chooses the level (flow's, taken out of the URL
    /// before the driver reads it).
    const PARAM: &'static str = "synchronous_commit";

    fn as_str(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::RemoteWrite => "remote_write",
            Self::RemoteApply => "remote_apply",
        }
    }

    /// The URL without flow's `synchronous_commit=` parameter, and the level it asked
    /// for (`on` when absent). Any other value is refused: flow will not acknowledge an
    /// outbound mark a crash of the server can lose.
    fn from_url(url: &str) -> Result<(String, Self), String> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), Self::On));
        };
        let mut level = Self::On;
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if key != Self::PARAM {
                kept.push(pair);
                continue;
            }
            level = match value {
                "on" => Self::On,
                "remote_write" => Self::RemoteWrite,
                "remote_apply" => Self::RemoteApply,
                other => {
                    return Err(format!(
                        "{}={other}: flow's commits must survive a crash of the server; use on (the default), remote_write or remote_apply",
                        Self::PARAM
                    ));
                }
            };
        }
        let url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok((url, level))
    }
}

/// How strong a `synchronous_commit` value is, weakest first (`off` < `local` <
/// `remote_write` < `on` < `remote_apply`); what PostgreSQL also accepts for `on` and
/// `off` (`true`, `yes`, `1`, …) is never what `current_setting` shows.
fn commit_rank(level: &str) -> u8 {
    match level {
        "local" => 1,
        "remote_write" => 2,
        "on" => 3,
        "remote_apply" => 4,
        _ => 0,
    }
}

/// Sets `commit` on a new pooled connection, in the one round trip that also reads what
/// the server would have given flow's session (its file, database and role settings),
/// and on the pool's first connection (`first` still set) says in the log when that was
/// weaker, or when a `remote_*` level has no synchronous standby to wait for.
async fn set_synchronous_commit(
    conn: &mut PgConnection,
    commit: SynchronousCommit,
    first: &std::sync::atomic::AtomicBool,
) -> Result<(), sqlx::Error> {
    use sqlx::Row;
    // The level comes from `SynchronousCommit::as_str`, never from input.
    let sql = format!(
        "WITH was AS MATERIALIZED (SELECT current_setting('synchronous_commit') AS level,
           current_setting('synchronous_standby_names') AS standbys)
         SELECT level, standbys, set_config('synchronous_commit', '{}', false) FROM was",
        commit.as_str()
    );
    let row = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .fetch_one(&mut *conn)
        .await?;
    if !first.swap(false, std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    let (was, standbys): (String, String) = (row.try_get(0)?, row.try_get(1)?);
    let ours = commit.as_str();
    if commit_rank(&was) < commit_rank(ours) {
        tracing::info!(
            server = %was,
            flow = ours,
            "PostgreSQL gives this role and database synchronous_commit = {was}; flow's own connections set {ours} (other clients keep {was})"
        );
    }
    if commit != SynchronousCommit::On && standbys.trim().is_empty() {
        tracing::warn!(
            flow = ours,
            "synchronous_commit = {ours} was asked, but the server has no synchronous standby (synchronous_standby_names is empty): commits wait for the primary's disk only, and a standby promoted after a failover can lack acknowledged outbound marks"
        );
    }
    Ok(())
}

/// Why [`open_pool`] failed, and whether the server itself answered with the refusal
/// (rather than not answering, or not being there).
struct Refused {
    error: Error,
    by_server: bool,
}

/// Opens the pool (see [`connect`]), every connection of it with flow's
/// `synchronous_commit` ([`set_synchronous_commit`]).
async fn open_pool(connect: &PgConnectOptions, opening: &Opening<'_>) -> Result<PgPool, Refused> {
    let Opening {
        url_redacted,
        opts,
        commit,
    } = *opening;
    let unavailable = |reason: String| Error::Unavailable {
        url: url_redacted.to_owned(),
        reason,
    };
    let no_answer = || {
        unavailable(format!(
            "no answer within {} ms",
            opts.connect_timeout.as_millis()
        ))
    };
    let max = if opts.max_connections == 0 {
        10
    } else {
        opts.max_connections
    };
    let refused = |e: sqlx::Error| Refused {
        by_server: matches!(e, sqlx::Error::Database(_)),
        error: match e {
            sqlx::Error::PoolTimedOut => no_answer(),
            e => unavailable(e.to_string()),
        },
    };
    let failed = |error: Error| Refused {
        error,
        by_server: false,
    };
    let first = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .min_connections(0)
        .acquire_timeout(opts.connect_timeout)
        .after_connect(move |conn, _| {
            let first = first.clone();
            Box::pin(async move { set_synchronous_commit(conn, commit, &first).await })
        })
        .connect_with(connect.clone());
    tokio::pin!(pool);
    tokio::select! {
        r = &mut pool => return r.map_err(refused),
        () = tokio::time::sleep(DIAGNOSE_AFTER.min(opts.connect_timeout)) => {}
    }
    let direct = <sqlx::PgConnection as sqlx::Connection>::connect_with(connect);
    tokio::select! {
        r = &mut pool => return r.map_err(refused),
        r = tokio::time::timeout(opts.connect_timeout, direct) => match r {
            Ok(Ok(conn)) => {
                let _ = sqlx::Connection::close(conn).await;
            }
            Ok(Err(e)) => return Err(refused(e)),
            Err(_) => return Err(failed(no_answer())),
        },
    }
    pool.await.map_err(refused)
}

/// TLS to a server on this machine's loopback interface protects nothing (whoever can
/// read loopback traffic is root here) and costs every connection a handshake: ~4 ms of
/// the server's time each, a fifth of a PostgreSQL `flow run` of W2 (benches/README.md,
/// "PostgreSQL start-up"). So a loopback host connects in plain text unless the URL or
/// the environment says anything about TLS (an `ssl…` parameter, a `PGSSL…` variable:
/// a mode, a client certificate, a root); any other host keeps the driver's default
/// (`prefer`). `Some` only when the options were changed: [`connect`] goes back to the
/// default if the server refuses a plain connection (one that accepts only TLS).
fn loopback_without_tls(connect: &PgConnectOptions, url: &str) -> Option<PgConnectOptions> {
    let in_url = url::Url::parse(url).is_ok_and(|u| {
        u.query_pairs()
            .any(|(k, _)| k.to_ascii_lowercase().starts_with("ssl"))
    });
    let in_env = std::env::vars_os().any(|(k, _)| k.to_string_lossy().starts_with("PGSSL"));
    if in_url || in_env || !is_loopback(connect.get_host()) {
        return None;
    }
    Some(connect.clone().ssl_mode(PgSslMode::Disable))
}

/// `localhost`, `127.0.0.0/8` or `::1` (a Unix socket never uses TLS anyway).
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The tables whose planner statistics the ledger keeps from going stale.
const TABLES: [&str; 7] = [
    "runs",
    "run_inputs",
    "steps",
    "tool_calls",
    "tool_call_attempts",
    "outbox",
    "event_deliveries",
];

/// The ledger's tables whose statistics describe a table much smaller than it now is:
/// never analyzed, or changed more rows since than the statistics counted (and at
/// least 64). Autovacuum would get there, but only after its nap (a minute) and a
/// 10% change; meanwhile a burst meets plans made for an empty table. The floor is
/// low because the harm starts early: with no statistics, the fence of each run's
/// final statement (`pure/batch.rs`) read every call of the tenant through
/// `tool_calls_expired_leases` (148 rows and up to 19 ms at the 150th run of a new
/// database), and a table analyzed whenever its changes outnumber its rows is analyzed
/// a logarithmic number of times as it grows.
/// A table never analyzed is also stale once it fills two pages: the activity counters
/// reach the view late (a backend reports them at most once a second, and one that
/// then goes idle, as a pooled connection does after a burst, only ~10 s later),
/// a drain of 500 runs is over by then, but a file's size is known at once.
///
/// The count is `pg_stat_user_tables.n_mod_since_analyze`'s own function: planning a
/// query over that view cost the server ~6 ms at every PostgreSQL `flow run` (its
/// prepare and first execution), this one ~1 ms.
const STALE: &str = "
SELECT n.name AS t
FROM unnest($1::text[]) AS n(name)
JOIN pg_class c ON c.oid = to_regclass(n.name)
WHERE (pg_stat_get_mod_since_analyze(c.oid) >= 64
       AND (c.reltuples < 0 OR pg_stat_get_mod_since_analyze(c.oid) > c.reltuples))
   OR (c.reltuples < 0 AND pg_relation_size(c.oid) >= 16384)";

/// ANALYZEs the ledger's tables whose statistics are stale (see `STALE`) and returns
/// their names. With no statistics, or statistics taken while the tables were empty,
/// PostgreSQL takes every index that starts with `(tenant, workspace)` for as good as
/// the primary key: measured on a fresh database meeting 10,000 queued runs, each
/// foreign-key check and fenced run update scanned every run of the tenant (2 ms at
/// 10,000 runs, growing with the table), and four daemons drained ~370 runs/s instead of
/// ~1,650. One process at a time analyzes (an advisory lock; the others skip).
pub(crate) async fn refresh_statistics(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    refresh_statistics_on(&mut conn).await
}

/// [`refresh_statistics`] for a one-shot command, beside its run: the check on a
/// connection of its own, closed after (taking the pool's idle connection for it made
/// the run open a second one: a connection's start-up on the run's path, ~4 ms). When a
/// table is stale, the ANALYZE goes through the pool, whose close the exiting process
/// waits for.
pub(crate) async fn refresh_statistics_aside(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    let mut conn = PgConnection::connect_with(&pool.connect_options()).await?;
    let stale = stale_tables(&mut conn).await;
    let _ = conn.close().await;
    if stale?.is_empty() {
        return Ok(Vec::new());
    }
    refresh_statistics(pool).await
}

async fn stale_tables(conn: &mut PgConnection) -> Result<Vec<String>, sqlx::Error> {
    let tables: Vec<String> = TABLES.iter().map(|t| (*t).to_owned()).collect();
    sqlx::query_scalar(STALE)
        .bind(&tables)
        .fetch_all(&mut *conn)
        .await
}

async fn refresh_statistics_on(conn: &mut PgConnection) -> Result<Vec<String>, sqlx::Error> {
    let stale = stale_tables(conn).await?;
    if stale.is_empty() {
        return Ok(stale);
    }
    let mut tx = conn.begin().await?;
    let ours: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext('flow.analyze'))")
            .fetch_one(&mut *tx)
            .await?;
    if !ours {
        return Ok(Vec::new());
    }
    // The names come from `TABLES`, never from input.
    let sql = format!("ANALYZE {}", stale.join(", "));
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(stale)
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use sqlx::postgres::{PgConnectOptions, PgSslMode};

    use super::{SynchronousCommit, commit_rank, is_loopback, loopback_without_tls};

    /// What `loopback_without_tls` makes of `url`: `Some(mode)` when it changed it.
    fn plain(url: &str) -> Option<PgSslMode> {
        let opts = PgConnectOptions::from_str(url).expect("url");
        loopback_without_tls(&opts, url).map(|o| o.get_ssl_mode())
    }

    #[test]
    fn only_a_loopback_url_that_says_nothing_of_tls_goes_plain() {
        if std::env::vars_os().any(|(k, _)| k.to_string_lossy().starts_with("PGSSL")) {
            return; // the environment asks for TLS: nothing is ever changed
        }
        for url in [
            "postgres://u@127.0.0.1:5432/db",
            "postgresql://u@localhost/db",
            "postgres://u@[::1]/db?application_name=x",
        ] {
            assert!(matches!(plain(url), Some(PgSslMode::Disable)), "{url}");
        }
        for url in [
            "postgres://u@127.0.0.1/db?sslmode=prefer",
            "postgres://u@127.0.0.1/db?a=b&sslmode=require",
            "postgres://u@127.0.0.1/db?ssl-mode=require",
            "postgres://u@127.0.0.1/db?ssl%6Dode=require",
            "postgres://u@localhost/db?sslcert=/c.pem&sslkey=/k.pem",
            "postgres://u@localhost/db?sslrootcert=/ca.pem",
            "postgres://u@db.example/db",
            "postgres://u@10.0.0.5/db",
        ] {
            assert!(plain(url).is_none(), "{url}");
        }
    }

    /// flow's `synchronous_commit=` leaves the URL (the driver would warn of a
    /// parameter it does not know), everything else stays as written; a level weaker
    /// than `on` is refused.
    #[test]
    fn the_urls_synchronous_commit_is_flows_and_at_least_on() {
        let level = |url: &str| SynchronousCommit::from_url(url);
        for (url, left, asked) in [
            ("postgres://u@h/db", "postgres://u@h/db", "on"),
            (
                "postgres://u@h/db?synchronous_commit=remote_apply",
                "postgres://u@h/db",
                "remote_apply",
            ),
            (
                "postgres://u@h/db?sslmode=require&synchronous_commit=remote_write&options=-c%20a%3Db",
                "postgres://u@h/db?sslmode=require&options=-c%20a%3Db",
                "remote_write",
            ),
            (
                "postgres://u@h/db?synchronous_commit=on&application_name=x",
                "postgres://u@h/db?application_name=x",
                "on",
            ),
        ] {
            let (url_left, got) = level(url).expect(url);
            assert_eq!((url_left.as_str(), got.as_str()), (left, asked), "{url}");
        }
        for bad in ["off", "local", "", "ON", "remote_flush"] {
            let url = format!("postgres://u@h/db?synchronous_commit={bad}");
            let err = level(&url).expect_err(&url);
            assert!(err.contains(&format!("synchronous_commit={bad}:")), "{err}");
        }
        assert!(commit_rank("off") < commit_rank("local"));
        assert!(commit_rank("local") < commit_rank("remote_write"));
        assert!(commit_rank("remote_write") < commit_rank("on"));
        assert!(commit_rank("on") < commit_rank("remote_apply"));
    }

    #[test]
    fn loopback_hosts_are_told_from_others() {
        for host in [
            "localhost",
            "LOCALHOST",
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "[::1]",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in ["db.example", "10.0.0.5", "::2", "localhost.example", ""] {
            assert!(!is_loopback(host), "{host}");
        }
    }
}
