//! The pools and pooled connections of either backend, and how a write reaches the
//! database: every write is an operation handed to [`Pool::write`] or
//! [`Pool::write_statement`] (SQLite: the group-commit [`Writer`], the one writer of the
//! file in this process; PostgreSQL: its own transaction). Reads borrow a pooled
//! connection. Statements run on the [`Conn`] these hand out (`conn.rs`).

use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPool;
use sqlx::sqlite::SqlitePool;
use sqlx::{Postgres, Sqlite, SqliteConnection};
use tokio::sync::Mutex;

use crate::conn::Conn;
use crate::error::Error;
use crate::writer::{Op, Writer};

/// The pool of one backend. SQLite's carries the group-commit [`Writer`]: SQLite has
/// one writer at a time anyway, and every write of this process queues for that one
/// task, fairly and promptly, instead of waiting in SQLite's busy handler, which sleeps
/// in growing steps (a p99 of hundreds of milliseconds with 8 writers). Other processes
/// are still held off by `busy_timeout`.
#[derive(Debug, Clone)]
pub(crate) enum Pool {
    Sqlite(SqlitePool, Writer),
    Postgres(PgPool),
}

impl Pool {
    /// A SQLite pool for reads and a writer task on `write_conn` for every write.
    pub(crate) fn sqlite(
        pool: SqlitePool,
        write_conn: SqliteConnection,
        wal: Option<crate::writer::WalGuard>,
    ) -> Pool {
        let writer = Writer::spawn(write_conn, Arc::new(Mutex::new(())), wal);
        Pool::Sqlite(pool, writer)
    }

    /// Runs a write operation as one transaction. On SQLite it joins the writer's next
    /// group commit (its own savepoint, answered after the batch's `COMMIT`); on
    /// PostgreSQL it is its own transaction on a pooled connection (the server merges
    /// concurrent commits' WAL flushes by itself).
    pub(crate) async fn write<T: Send + 'static>(&self, op: Op<T>) -> Result<T, Error> {
        match self {
            Pool::Sqlite(_, writer) => writer.submit(op).await,
            Pool::Postgres(p) => {
                let p = p.clone();
                run_to_end(async move {
                    let mut tx = p.begin().await?;
                    match op(&mut Conn::Postgres(&mut tx)).await {
                        Ok(v) => {
                            tx.commit().await?;
                            Ok(v)
                        }
                        Err(e) => {
                            // Rolled back before the answer, not when the dropped
                            // transaction's connection is next used: until then its
                            // row locks stay, and another claim's SKIP LOCKED passes
                            // over a claimable run (a flake of the differential test).
                            let _ = tx.rollback().await;
                            Err(e)
                        }
                    }
                })
                .await
            }
        }
    }

    /// Runs a write operation of ONE statement: like [`Pool::write`] on SQLite, and
    /// without `BEGIN`/`COMMIT` round trips on PostgreSQL (a lone statement is atomic).
    pub(crate) async fn write_statement<T: Send + 'static>(&self, op: Op<T>) -> Result<T, Error> {
        match self {
            Pool::Sqlite(_, writer) => writer.submit(op).await,
            Pool::Postgres(p) => {
                let p = p.clone();
                run_to_end(async move {
                    let mut c = p.acquire().await?;
                    op(&mut Conn::Postgres(&mut c)).await
                })
                .await
            }
        }
    }

    /// A pooled connection for reads.
    pub(crate) async fn acquire(&self) -> Result<PoolConn, Error> {
        Ok(match self {
            Pool::Sqlite(p, _) => PoolConn::Sqlite(p.acquire().await?),
            Pool::Postgres(p) => PoolConn::Postgres(p.acquire().await?),
        })
    }

    pub(crate) async fn close(&self) {
        match self {
            Pool::Sqlite(p, writer) => {
                writer.close().await;
                p.close().await;
            }
            Pool::Postgres(p) => p.close().await,
        }
    }
}

/// Runs a PostgreSQL write on a task of its own, so a caller that stops waiting (a
/// timeout, a dropped future) cannot cancel it between `BEGIN` and `COMMIT`: a `BEGIN`
/// cancelled mid-flight can return its connection to the pool inside an open
/// transaction (launchbadge/sqlx#4393), where the next borrower's statements would
/// never commit — seen here as a heartbeat that another handle could not read. SQLite's
/// writes already run on the writer task.
async fn run_to_end<T: Send + 'static>(
    write: impl std::future::Future<Output = Result<T, Error>> + Send + 'static,
) -> Result<T, Error> {
    tokio::spawn(write).await.map_err(|e| Error::Backend {
        message: format!("write task ended without an answer: {e}"),
        retryable: false,
    })?
}

/// A connection borrowed from the pool.
pub(crate) enum PoolConn {
    Sqlite(PoolConnection<Sqlite>),
    Postgres(PoolConnection<Postgres>),
}

impl PoolConn {
    /// The connection to run statements on.
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        match self {
            PoolConn::Sqlite(conn) => Conn::Sqlite(conn),
            PoolConn::Postgres(c) => Conn::Postgres(c),
        }
    }
}
