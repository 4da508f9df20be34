//! PostgreSQL specifics: connection settings and migrations.
//!
//! The run queue is claimed with `FOR UPDATE SKIP LOCKED`, call claims with
//! `INSERT … ON CONFLICT DO NOTHING` followed by `SELECT … FOR UPDATE` (in `runs.rs` and
//! `calls.rs`); everything else is the SQL shared with SQLite.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::error::Error;
use crate::options::OpenOptions;

/// The PostgreSQL migrations, embedded at build time.
pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

pub(crate) async fn connect(
    url: &str,
    url_redacted: &str,
    opts: &OpenOptions,
) -> Result<PgPool, Error> {
    let unavailable = |reason: String| Error::Unavailable {
        url: url_redacted.to_owned(),
        reason,
    };
    let connect = PgConnectOptions::from_str(url)
        .map_err(|e| unavailable(format!("bad URL: {e}")))?
        .statement_cache_capacity(256)
        .application_name("flow");
    let max = if opts.max_connections == 0 {
        10
    } else {
        opts.max_connections
    };
    // One direct connection first: a pool only reports "timed out", while the operator
    // needs the reason (connection refused, unknown database, authentication failed).
    match tokio::time::timeout(
        opts.connect_timeout,
        <sqlx::PgConnection as sqlx::Connection>::connect_with(&connect),
    )
    .await
    {
        Ok(Ok(conn)) => {
            let _ = sqlx::Connection::close(conn).await;
        }
        Ok(Err(e)) => return Err(unavailable(e.to_string())),
        Err(_) => {
            return Err(unavailable(format!(
                "no answer within {} ms",
                opts.connect_timeout.as_millis()
            )));
        }
    }
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(opts.connect_timeout)
        .connect_with(connect)
        .await
        .map_err(|e| unavailable(e.to_string()))
}

/// The tables whose planner statistics the ledger keeps from going stale.
const TABLES: [&str; 6] = [
    "runs",
    "steps",
    "tool_calls",
    "tool_call_attempts",
    "outbox",
    "event_deliveries",
];

/// The ledger's tables whose statistics describe a table much smaller than it now is:
/// never analyzed, or changed more rows since than the statistics counted (and at
/// least 1,000). Autovacuum would get there, but only after its nap (a minute) and a
/// 10% change; meanwhile a burst meets plans made for an empty table.
const STALE: &str = "
SELECT n.name AS t
FROM unnest($1::text[]) AS n(name)
JOIN pg_stat_user_tables s ON s.relid = to_regclass(n.name)
JOIN pg_class c ON c.oid = s.relid
WHERE s.n_mod_since_analyze >= 1000
  AND (c.reltuples < 0 OR s.n_mod_since_analyze > c.reltuples)";

/// ANALYZEs the ledger's tables whose statistics are stale (see `STALE`) and returns
/// their names. With no statistics, or statistics taken while the tables were empty,
/// PostgreSQL takes every index that starts with `(tenant, workspace)` for as good as
/// the primary key: measured on a fresh database meeting 10,000 queued runs, each
/// foreign-key check and fenced run update scanned every run of the tenant (2 ms at
/// 10,000 runs, growing with the table), and four daemons drained ~370 runs/s instead of
/// ~1,650. One process at a time analyzes (an advisory lock; the others skip).
pub(crate) async fn refresh_statistics(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    let tables: Vec<String> = TABLES.iter().map(|t| (*t).to_owned()).collect();
    let stale: Vec<String> = sqlx::query_scalar(STALE)
        .bind(&tables)
        .fetch_all(pool)
        .await?;
    if stale.is_empty() {
        return Ok(stale);
    }
    let mut tx = pool.begin().await?;
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
