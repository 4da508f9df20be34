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
    let connect = PgConnectOptions::from_str(url)
        .map_err(|e| Error::Unavailable {
            url: url_redacted.to_owned(),
            reason: format!("bad URL: {e}"),
        })?
        .statement_cache_capacity(256)
        .application_name("flow");
    if let Some(plain) = loopback_without_tls(&connect, url) {
        match open_pool(&plain, url_redacted, opts).await {
            // The server answered and refused (a loopback server that accepts only
            // TLS, say): try again as the URL alone would have connected.
            Err(Refused {
                by_server: true, ..
            }) => {}
            done => return done.map_err(|r| r.error),
        }
    }
    open_pool(&connect, url_redacted, opts)
        .await
        .map_err(|r| r.error)
}

/// Why [`open_pool`] failed, and whether the server itself answered with the refusal
/// (rather than not answering, or not being there).
struct Refused {
    error: Error,
    by_server: bool,
}

/// Opens the pool (see [`connect`]).
async fn open_pool(
    connect: &PgConnectOptions,
    url_redacted: &str,
    opts: &OpenOptions,
) -> Result<PgPool, Refused> {
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
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .min_connections(0)
        .acquire_timeout(opts.connect_timeout)
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

    use super::{is_loopback, loopback_without_tls};

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
