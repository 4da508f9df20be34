//! Statements on either backend: one SQL text, one list of [`Arg`]s, bound for whichever
//! driver is underneath, and rows that decode from both.
//!
//! Both SQLite and PostgreSQL accept `$1, $2` placeholders, and every column type in the
//! schema is text, a 64-bit integer or a boolean, so almost every statement is shared
//! text. The few statements that differ (`FOR UPDATE`, the queue claim) are picked with
//! [`Conn::pick`]. Row structs derive `FromRow` generically, so the same struct decodes a
//! SQLite row and a PostgreSQL row. (The pools and transactions these connections come
//! from live in `db.rs`; the SQLite group-commit writer in `writer.rs` uses only this.)

use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{FromRow, PgConnection, Postgres, Sqlite, SqliteConnection};

use crate::clock::Timestamp;
use crate::error::Error;

/// A value bound to a placeholder.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    Int(Option<i64>),
    Text(Option<String>),
    Bool(bool),
    /// Bytes: a batch's rows in SQLite's JSONB ([`jsonb_arg`]).
    Blob(Vec<u8>),
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
        vec![$($crate::conn::Arg::from($v)),*]
    };
}
pub(crate) use args;

/// A statement's JSON argument (a batch's rows as one array), `what` naming it in the
/// error. Strings and numbers only, so it cannot fail in practice; were it to, nothing
/// is written.
fn json_arg<T: serde::Serialize + ?Sized>(v: &T, what: &str) -> Result<String, Error> {
    serde_json::to_string(v).map_err(|e| Error::Backend {
        message: format!("{what} as JSON: {e}"),
        retryable: false,
    })
}

/// A statement's rows for SQLite in its binary JSON (JSONB), `what` naming it in the
/// error: `jsonb_each` and `->>` read it as it is, where a JSON text argument is parsed
/// into JSONB again by each statement that reads it, and each string with a quote in it
/// (a request, an output, an event payload) unescaped again by each `->>` (strings are
/// written raw). Four statements of a 102-node batch spent ~20% of a `flow run`'s
/// instructions there (benches/README.md, "W2 on SQLite: the batch in SQLite's JSONB").
fn jsonb_arg<T: serde::Serialize>(v: &T, what: &str) -> Result<Arg, Error> {
    serde_sqlite_jsonb::to_vec(v)
        .map(Arg::Blob)
        .map_err(|e| Error::Backend {
            message: format!("{what} as JSONB: {e}"),
            retryable: false,
        })
}

/// A batch's rows as each backend reads them best: SQLite's JSONB ([`jsonb_arg`], for
/// `jsonb_each`), JSON text on PostgreSQL (`$n::jsonb` parses it once per statement).
///
/// Keep the rows' fields strings, integers and `Option`s of them: `serde_sqlite_jsonb`
/// 0.2 writes a newtype struct (`struct Id(String)` with a derived `Serialize`) as
/// null and a float by `Display` (`1.0` as `1`, NaN as text SQLite refuses), where
/// JSON text would have kept them.
pub(crate) fn rows_arg<T: serde::Serialize>(
    postgres: bool,
    v: &T,
    what: &str,
) -> Result<Arg, Error> {
    if postgres {
        json_arg(v, what).map(Arg::from)
    } else {
        jsonb_arg(v, what)
    }
}

/// Rows that decode from both drivers.
pub(crate) trait AnyRow:
    for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin
{
}
impl<T> AnyRow for T where
    T: for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin
{
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
                Arg::Blob(v) => q.bind(v),
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

    /// On PostgreSQL, the transaction lock named `key` (`pg_advisory_xact_lock`): the
    /// transactions that take it take turns until they commit, so what one counts or
    /// looks up next under READ COMMITTED includes the other's writes. SQLite has one
    /// writer: nothing to take.
    pub(crate) async fn take_turns(&mut self, key: &str) -> Result<(), Error> {
        if self.is_postgres() {
            self.optional::<(i32,)>(
                "SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtextextended($1, 0))) AS l",
                args![key],
            )
            .await?;
        }
        Ok(())
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
