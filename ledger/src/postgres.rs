//! PostgreSQL specifics: connection settings and migrations.
//!
//! The run queue is claimed with `FOR UPDATE SKIP LOCKED`, call claims with
//! `INSERT … ON CONFLICT DO NOTHING` followed by `SELECT … FOR UPDATE` (in `runs.rs` and
//! `calls.rs`); everything else is the SQL shared with SQLite.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::error::Error;
use crate::ledger::OpenOptions;

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
