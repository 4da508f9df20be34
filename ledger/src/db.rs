//! The thin layer that lets one body of ledger logic drive both backends.
//!
//! Both SQLite and PostgreSQL accept `$1, $2` placeholders, and every column type in the
//! schema is text, a 64-bit integer or a boolean, so almost every statement is shared
//! text. A statement is run through [`Conn`] with a list of [`Arg`]s, which binds them
//! for whichever driver is underneath. The few statements that differ (`FOR UPDATE`, the
//! queue claim) are picked with [`Conn::pick`]. Row structs derive `FromRow` generically,
//! so the same struct decodes a SQLite row and a PostgreSQL row.

use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgRow};
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{FromRow, PgConnection, Postgres, Sqlite, SqliteConnection, Transaction};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::clock::Timestamp;
use crate::error::Error;
use crate::writer::{Op, Writer};

/// A value bound to a placeholder.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    Int(Option<i64>),
    Text(Option<String>),
    Bool(bool),
}

impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::Int(Some(v))
    }
}
impl From<Option<i64>> for Arg {
    fn from(v: Option<i64>) -> Self {
        Arg::Int(v)
    }
}
impl From<u32> for Arg {
    fn from(v: u32) -> Self {
        Arg::Int(Some(i64::from(v)))
    }
}
impl From<i32> for Arg {
    fn from(v: i32) -> Self {
        Arg::Int(Some(i64::from(v)))
    }
}
impl From<Timestamp> for Arg {
    fn from(v: Timestamp) -> Self {
        Arg::Int(Some(v.0))
    }
}
impl From<Option<Timestamp>> for Arg {
    fn from(v: Option<Timestamp>) -> Self {
        Arg::Int(v.map(|t| t.0))
    }
}
impl From<String> for Arg {
    fn from(v: String) -> Self {
        Arg::Text(Some(v))
    }
}
impl From<&String> for Arg {
    fn from(v: &String) -> Self {
        Arg::Text(Some(v.clone()))
    }
}
impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Arg::Text(Some(v.to_owned()))
    }
}
impl From<Option<String>> for Arg {
    fn from(v: Option<String>) -> Self {
        Arg::Text(v)
    }
}
impl From<Option<&str>> for Arg {
    fn from(v: Option<&str>) -> Self {
        Arg::Text(v.map(str::to_owned))
    }
}
impl From<bool> for Arg {
    fn from(v: bool) -> Self {
        Arg::Bool(v)
    }
}

/// Builds a `Vec<Arg>` from values of mixed types.
macro_rules! args {
    ($($v:expr),* $(,)?) => {
        vec![$($crate::db::Arg::from($v)),*]
    };
}
pub(crate) use args;

/// Rows that decode from both drivers.
pub(crate) trait AnyRow:
    for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin
{
}
impl<T> AnyRow for T where
    T: for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin
{
}

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

/// A connection of either backend, borrowed from a transaction.
pub(crate) enum Conn<'a> {
    Sqlite(&'a mut SqliteConnection),
    Postgres(&'a mut PgConnection),
}

macro_rules! bind_all {
    ($q:expr, $args:expr) => {{
        let mut q = $q;
        for a in $args {
            q = match a {
                Arg::Int(v) => q.bind(v),
                Arg::Text(v) => q.bind(v),
                Arg::Bool(v) => q.bind(v),
            };
        }
        q
    }};
}

impl Conn<'_> {
    /// True on PostgreSQL.
    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self, Conn::Postgres(_))
    }

    /// Picks the dialect-specific text of a statement.
    pub(crate) fn pick(&self, sqlite: &'static str, postgres: &'static str) -> &'static str {
        if self.is_postgres() { postgres } else { sqlite }
    }

    /// Runs a statement, returning the number of rows it changed.
    pub(crate) async fn execute(
        &mut self,
        sql: &'static str,
        args: Vec<Arg>,
    ) -> Result<u64, Error> {
        Ok(match self {
            Conn::Sqlite(c) => bind_all!(sqlx::query::<Sqlite>(sql), args)
                .execute(&mut **c)
                .await?
                .rows_affected(),
            Conn::Postgres(c) => bind_all!(sqlx::query::<Postgres>(sql), args)
                .execute(&mut **c)
                .await?
                .rows_affected(),
        })
    }

    /// Runs a query returning at most one row.
    pub(crate) async fn optional<T: AnyRow>(
        &mut self,
        sql: &'static str,
        args: Vec<Arg>,
    ) -> Result<Option<T>, Error> {
        Ok(match self {
            Conn::Sqlite(c) => {
                bind_all!(sqlx::query_as::<Sqlite, T>(sql), args)
                    .fetch_optional(&mut **c)
                    .await?
            }
            Conn::Postgres(c) => {
                bind_all!(sqlx::query_as::<Postgres, T>(sql), args)
                    .fetch_optional(&mut **c)
                    .await?
            }
        })
    }

    /// Runs a query returning any number of rows.
    pub(crate) async fn all<T: AnyRow>(
        &mut self,
        sql: &'static str,
        args: Vec<Arg>,
    ) -> Result<Vec<T>, Error> {
        Ok(match self {
            Conn::Sqlite(c) => {
                bind_all!(sqlx::query_as::<Sqlite, T>(sql), args)
                    .fetch_all(&mut **c)
                    .await?
            }
            Conn::Postgres(c) => {
                bind_all!(sqlx::query_as::<Postgres, T>(sql), args)
                    .fetch_all(&mut **c)
                    .await?
            }
        })
    }
}
