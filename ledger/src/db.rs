//! The pools, pooled connections and transactions of either backend, and how a write
//! reaches the database (SQLite: through the group-commit [`Writer`]; PostgreSQL: its
//! own transaction). Statements run on the [`Conn`] these hand out (`conn.rs`).

use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPool;
use sqlx::sqlite::SqlitePool;
use sqlx::{Postgres, Sqlite, SqliteConnection, Transaction};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::conn::Conn;
use crate::error::Error;
use crate::writer::{Op, Writer};

/// The pool of one backend. SQLite's carries a write gate and the group-commit
/// [`Writer`]: SQLite has one writer at a time anyway, and waiting for it on an async
/// mutex is fair and prompt, whereas waiting in SQLite's busy handler sleeps in growing
/// steps (a p99 of hundreds of milliseconds with 8 writers). Other processes are still
/// held off by `busy_timeout`.
#[derive(Debug, Clone)]
pub(crate) enum Pool {
    Sqlite(SqlitePool, Arc<Mutex<()>>, Writer),
    Postgres(PgPool),
}

impl Pool {
    /// A SQLite pool for reads (and the few writers that still open their own
    /// transactions) and a writer task on `write_conn` for the operations.
    pub(crate) fn sqlite(pool: SqlitePool, write_conn: SqliteConnection) -> Pool {
        let gate = Arc::new(Mutex::new(()));
        let writer = Writer::spawn(write_conn, gate.clone());
        Pool::Sqlite(pool, gate, writer)
    }

    /// Runs a write operation as one transaction. On SQLite it joins the writer's next
    /// group commit (its own savepoint, answered after the batch's `COMMIT`); on
    /// PostgreSQL it is its own transaction on a pooled connection (the server merges
    /// concurrent commits' WAL flushes by itself).
    pub(crate) async fn write<T: Send + 'static>(&self, op: Op<T>) -> Result<T, Error> {
        match self {
            Pool::Sqlite(_, _, writer) => writer.submit(op).await,
            Pool::Postgres(p) => {
                let mut tx = p.begin().await?;
                let v = op(&mut Conn::Postgres(&mut tx)).await?;
                tx.commit().await?;
                Ok(v)
            }
        }
    }

    /// Runs a write operation of ONE statement: like [`Pool::write`] on SQLite, and
    /// without `BEGIN`/`COMMIT` round trips on PostgreSQL (a lone statement is atomic).
    pub(crate) async fn write_statement<T: Send + 'static>(&self, op: Op<T>) -> Result<T, Error> {
        match self {
            Pool::Sqlite(_, _, writer) => writer.submit(op).await,
            Pool::Postgres(p) => {
                let mut c = p.acquire().await?;
                op(&mut Conn::Postgres(&mut c)).await
            }
        }
    }

    /// Starts a write transaction. SQLite uses `BEGIN IMMEDIATE`: every ledger write
    /// reads before it writes, and a deferred transaction that upgrades to a writer after
    /// another writer committed fails instead of waiting (DEPENDENCIES.md: 198 of 400
    /// increments lost). PostgreSQL uses row locks (`FOR UPDATE`) where it reads to decide.
    pub(crate) async fn begin(&self) -> Result<Tx, Error> {
        Ok(match self {
            Pool::Sqlite(p, gate, _) => {
                let guard = gate.clone().lock_owned().await;
                Tx::Sqlite(p.begin_with("BEGIN IMMEDIATE").await?, guard)
            }
            Pool::Postgres(p) => Tx::Postgres(p.begin().await?),
        })
    }

    /// A pooled connection for reads.
    pub(crate) async fn acquire(&self) -> Result<PoolConn, Error> {
        Ok(match self {
            Pool::Sqlite(p, _, _) => PoolConn::Sqlite {
                conn: p.acquire().await?,
                _gate: None,
            },
            Pool::Postgres(p) => PoolConn::Postgres(p.acquire().await?),
        })
    }

    /// A pooled connection for one write statement (its own implicit transaction: on
    /// SQLite a lone `UPDATE` takes the write lock before it reads), behind the gate.
    pub(crate) async fn acquire_write(&self) -> Result<PoolConn, Error> {
        Ok(match self {
            Pool::Sqlite(p, gate, _) => {
                let guard = gate.clone().lock_owned().await;
                PoolConn::Sqlite {
                    conn: p.acquire().await?,
                    _gate: Some(guard),
                }
            }
            Pool::Postgres(p) => PoolConn::Postgres(p.acquire().await?),
        })
    }

    pub(crate) async fn close(&self) {
        match self {
            Pool::Sqlite(p, _, writer) => {
                writer.close().await;
                p.close().await;
            }
            Pool::Postgres(p) => p.close().await,
        }
    }
}

/// A connection borrowed from the pool.
pub(crate) enum PoolConn {
    Sqlite {
        conn: PoolConnection<Sqlite>,
        _gate: Option<OwnedMutexGuard<()>>,
    },
    Postgres(PoolConnection<Postgres>),
}

impl PoolConn {
    /// The connection to run statements on.
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        match self {
            PoolConn::Sqlite { conn, .. } => Conn::Sqlite(conn),
            PoolConn::Postgres(c) => Conn::Postgres(c),
        }
    }
}

/// An open transaction on either backend.
pub(crate) enum Tx {
    /// The guard is released after commit or rollback (field order: dropped last).
    Sqlite(Transaction<'static, Sqlite>, OwnedMutexGuard<()>),
    Postgres(Transaction<'static, Postgres>),
}

impl Tx {
    /// The connection to run statements on.
    pub(crate) fn conn(&mut self) -> Conn<'_> {
        match self {
            Tx::Sqlite(t, _) => Conn::Sqlite(t),
            Tx::Postgres(t) => Conn::Postgres(t),
        }
    }

    /// Commits; on SQLite with `synchronous=FULL` this is the durable fsync.
    pub(crate) async fn commit(self) -> Result<(), Error> {
        match self {
            Tx::Sqlite(t, _guard) => t.commit().await?,
            Tx::Postgres(t) => t.commit().await?,
        }
        Ok(())
    }
}
