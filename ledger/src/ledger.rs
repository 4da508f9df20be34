//! The `Ledger` facade: opening and the helpers every operation shares (the options it
//! opens with are in `options.rs`, which the backends read without importing this).
//!
//! The operations themselves live in `runs.rs`, `steps.rs`, `calls.rs`, `resolve.rs`,
//! `pure/`, `rate.rs` and `reads.rs`, each an `impl Ledger` block over the same backend-neutral
//! [`crate::conn::Conn`].

use std::sync::Arc;

use serde_json::Value;

use crate::clock::Timestamp;
use crate::conn::{Conn, args};
use crate::db::Pool;
use crate::error::Error;
use crate::fence::Fence;
use crate::model::{CallOutcome, RunLease, Scope, StepError};
pub use crate::options::{OpenOptions, SqliteSynchronous};
use crate::rows::{RunRow, run_cols};
use crate::state::{CallStatus, ErrorKind};
use crate::writer::BoxFuture;
use crate::{postgres, sqlite};

/// The durable ledger of runs, steps and tool calls, on SQLite or PostgreSQL.
/// Cheap to clone (a pool inside); share it between tasks.
#[derive(Debug, Clone)]
pub struct Ledger {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) scope: Scope,
    pub(crate) url_redacted: String,
    pub(crate) output_limit: usize,
    /// `sqlite://…?mode=ro`: every write is refused with [`Error::ReadOnly`].
    pub(crate) read_only: bool,
}

/// The migrations a ledger has applied, as [`holds_migrations`] compares them.
const APPLIED_MIGRATIONS: &str =
    "SELECT version, checksum, success FROM _sqlx_migrations ORDER BY version";

/// What [`APPLIED_MIGRATIONS`] read (or the error reading it).
type Applied = Result<Vec<(i64, Vec<u8>, bool)>, sqlx::Error>;

/// Whether `applied` is exactly `migrator`'s migrations, each a success with the
/// checksum embedded here (see [`Ledger::is_migrated`]); an error reading is `false`.
fn holds_migrations(applied: Applied, migrator: &sqlx::migrate::Migrator) -> bool {
    let Ok(applied) = applied else {
        return false;
    };
    let wanted: Vec<_> = migrator
        .iter()
        .filter(|m| m.migration_type.is_up_migration())
        .collect();
    applied.len() == wanted.len()
        && applied
            .iter()
            .zip(&wanted)
            .all(|((version, checksum, success), m)| {
                *success && *version == m.version && checksum.as_slice() == &*m.checksum
            })
}

impl Ledger {
    /// Opens `sqlite://PATH` (or `sqlite:PATH`; the file and its parent directory are
    /// created if missing) or `postgres://…` / `postgresql://…`, and applies migrations
    /// unless `opts.migrate` is off.
    ///
    /// `sqlite://PATH?mode=ro` opens an existing file read-only, for commands that only
    /// read (`flow runs`, `flow show`): nothing is created, migrated or written, and
    /// every write method fails with [`Error::ReadOnly`].
    pub async fn open(url: &str, opts: OpenOptions) -> Result<Ledger, Error> {
        let url_redacted = redact_url(url);
        let read_only = sqlite::is_read_only_url(url);
        let mut migrated = None;
        let pool = if let Some(path) = sqlite::path_of(url) {
            let (pool, mut writer) = sqlite::connect(path, &url_redacted, &opts, read_only).await?;
            // Asked on the writer's connection before it goes to the writer's task: the
            // pool's first connection waits for a read that may never come. Not asked
            // where nothing would be migrated anyway.
            if opts.migrate && !read_only {
                let applied = sqlx::query_as(APPLIED_MIGRATIONS)
                    .fetch_all(&mut writer)
                    .await;
                migrated = Some(holds_migrations(applied, &sqlite::MIGRATOR));
            }
            let wal =
                (!read_only).then(|| crate::writer::WalGuard::new(format!("{path}-wal").into()));
            Pool::sqlite(pool, writer, wal)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Pool::Postgres(postgres::connect(url, &url_redacted, &opts).await?)
        } else {
            return Err(Error::UnsupportedUrl { url: url_redacted });
        };
        let ledger = Ledger {
            inner: Arc::new(Inner {
                pool,
                scope: opts.scope.clone(),
                url_redacted,
                output_limit: opts.output_limit_bytes,
                read_only,
            }),
        };
        if opts.migrate && !read_only && migrated != Some(true) {
            ledger.migrate().await?;
        }
        ledger.keep_clock_anchored().await;
        Ok(ledger)
    }

    /// Applies pending migrations (embedded from `migrations/{sqlite,postgres}`).
    /// Safe to call concurrently: PostgreSQL takes an advisory lock, SQLite a write lock.
    pub async fn migrate(&self) -> Result<(), Error> {
        self.writable()?;
        if self.is_migrated().await {
            return Ok(());
        }
        match &self.inner.pool {
            Pool::Sqlite(p, _) => {
                // sqlx takes no lock across processes on SQLite: two processes opening a
                // fresh file at once can both decide to apply migration 1, and the loser
                // fails with "table already exists" once the winner commits. Each
                // migration is one transaction, so re-reading the applied set and trying
                // again converges.
                let mut tries = 0;
                loop {
                    match sqlite::MIGRATOR.run(p).await {
                        Ok(()) => break,
                        Err(_) if tries < 5 => {
                            tries += 1;
                            tokio::time::sleep(std::time::Duration::from_millis(50 * tries)).await;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Pool::Postgres(p) => postgres::MIGRATOR.run(p).await?,
        }
        Ok(())
    }

    /// Whether the ledger holds exactly this build's migrations, each applied with the
    /// checksum embedded here: one read, where sqlx's migrator takes a lock (an advisory
    /// lock round trip on PostgreSQL), creates its table if missing and reads twice.
    /// Every command opens the ledger, so this is paid by each `flow run` (on SQLite
    /// `open` asks the same on the writer's connection, [`holds_migrations`]). Anything else
    /// (a fresh database, a pending, failed, edited or unknown migration, an error) is
    /// `false`, and the migrator then applies or refuses as it always did.
    async fn is_migrated(&self) -> bool {
        let sql = APPLIED_MIGRATIONS;
        match &self.inner.pool {
            Pool::Sqlite(p, _) => {
                holds_migrations(sqlx::query_as(sql).fetch_all(p).await, &sqlite::MIGRATOR)
            }
            Pool::Postgres(p) => {
                holds_migrations(sqlx::query_as(sql).fetch_all(p).await, &postgres::MIGRATOR)
            }
        }
    }

    /// The newest migration this build carries: the ledger schema version it expects
    /// (`flow version` prints it beside the one a ledger has).
    pub fn schema_version() -> i64 {
        sqlite::MIGRATOR
            .iter()
            .map(|m| m.version)
            .max()
            .unwrap_or(0)
    }

    /// The newest migration applied to this ledger (`None`: none yet). Reads only, so it
    /// also answers on a ledger opened read-only or without migrating.
    pub async fn applied_schema_version(&self) -> Result<Option<i64>, Error> {
        const SQL: &str = "SELECT MAX(version) FROM _sqlx_migrations WHERE success";
        let found = match &self.inner.pool {
            Pool::Sqlite(p, _) => sqlx::query_scalar::<_, Option<i64>>(SQL).fetch_one(p).await,
            Pool::Postgres(p) => sqlx::query_scalar::<_, Option<i64>>(SQL).fetch_one(p).await,
        };
        match found {
            Ok(v) => Ok(v),
            // A database nothing has migrated has no migrations table.
            Err(sqlx::Error::Database(e)) if e.message().contains("_sqlx_migrations") => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// `sqlite` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        match &self.inner.pool {
            Pool::Sqlite(..) => "sqlite",
            Pool::Postgres(_) => "postgres",
        }
    }

    /// Whether statements go to PostgreSQL (some writes have a one-statement form there).
    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self.inner.pool, Pool::Postgres(_))
    }

    /// The URL this ledger was opened with, password hidden: safe for logs and errors.
    pub fn url_redacted(&self) -> &str {
        &self.inner.url_redacted
    }

    /// The tenant and workspace of this handle.
    pub fn scope(&self) -> &Scope {
        &self.inner.scope
    }

    /// Whether this handle was opened read-only (`sqlite://…?mode=ro`).
    #[cfg(any(test, feature = "testkit"))]
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    /// `Err(ReadOnly)` on a read-only handle: checked before any write is attempted.
    pub(crate) fn writable(&self) -> Result<(), Error> {
        if self.inner.read_only {
            Err(Error::ReadOnly {
                url: self.inner.url_redacted.clone(),
            })
        } else {
            Ok(())
        }
    }

    /// The output limit in bytes.
    #[cfg(any(test, feature = "testkit"))]
    pub fn output_limit_bytes(&self) -> usize {
        self.inner.output_limit
    }

    /// Closes the pool (waits for connections to return). Other clones become unusable.
    pub async fn close(&self) {
        self.inner.pool.close().await;
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Runs `op` as one write transaction (SQLite: inside the writer's group commit; see
    /// `writer.rs`). `op` owns what it needs: it may outlive its caller's wait.
    pub(crate) async fn write<T, F>(&self, op: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: for<'c, 'd> FnOnce(&'c mut Conn<'d>) -> BoxFuture<'c, Result<T, Error>> + Send + 'static,
    {
        self.writable()?;
        self.inner.pool.write(Box::new(op)).await
    }

    /// Like [`Ledger::write`] for an operation of one statement (no `BEGIN`/`COMMIT`
    /// round trips on PostgreSQL).
    pub(crate) async fn write_statement<T, F>(&self, op: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: for<'c, 'd> FnOnce(&'c mut Conn<'d>) -> BoxFuture<'c, Result<T, Error>> + Send + 'static,
    {
        self.writable()?;
        self.inner.pool.write_statement(Box::new(op)).await
    }

    /// Serializes a value that will be stored, refusing it when over the output limit.
    pub(crate) fn checked_json(&self, v: &Value) -> Result<String, Error> {
        let s = v.to_string();
        if s.len() > self.inner.output_limit {
            return Err(Error::OutputTooLarge {
                limit: self.inner.output_limit,
                size: s.len(),
            });
        }
        Ok(s)
    }

    /// The failure an output over the limit becomes (`None` when it fits): the one
    /// wording of the output-limit rule, whether the engine checks before recording or
    /// the ledger while it stores.
    pub fn refuse_output(&self, v: &Value) -> Option<StepError> {
        self.checked_json(v).err().map(output_refused)
    }

    /// The stored columns of a call's outcome: its status, output and error. An output
    /// over the limit is stored as the permanent failure [`Ledger::refuse_output`] says.
    pub(crate) fn outcome_columns(
        &self,
        outcome: &CallOutcome,
    ) -> (CallStatus, Option<String>, Option<StepError>) {
        match outcome {
            CallOutcome::Succeeded(v) => match self.checked_json(v) {
                Ok(s) => (CallStatus::Succeeded, Some(s), None),
                Err(e) => (CallStatus::Failed, None, Some(output_refused(e))),
            },
            CallOutcome::Failed(e) => (CallStatus::Failed, None, Some(e.clone())),
        }
    }
}

/// [`Error::OutputTooLarge`] as the step error it becomes.
pub(crate) fn output_refused(e: Error) -> StepError {
    StepError {
        kind: ErrorKind::Permanent,
        message: format!("{e}; it was not stored (outputs are never truncated)"),
    }
}

/// Reads a run row (PostgreSQL: `FOR SHARE`, so a concurrent claim that bumps the lease
/// token waits until this transaction ends and fencing holds for all of it).
pub(crate) async fn read_run_shared(
    conn: &mut Conn<'_>,
    scope: &Scope,
    run_id: &str,
) -> Result<RunRow, Error> {
    let sql = conn.pick(
        concat!(
            "SELECT ",
            run_cols!(),
            " FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3"
        ),
        concat!(
            "SELECT ",
            run_cols!(),
            " FROM runs WHERE tenant = $1 AND workspace = $2 AND id = $3 FOR SHARE"
        ),
    );
    conn.optional::<RunRow>(sql, args![&scope.tenant, &scope.workspace, run_id])
        .await?
        .ok_or_else(|| Error::NotFound {
            what: format!("run {run_id}"),
        })
}

/// Checks that `lease` still holds its run: same worker, same token, status running and,
/// when `live_at` is given, not expired at that time. Expiry is checked only where new
/// work or a side effect begins (claims, `mark_outbound`): recording a fact that already
/// happened is still correct as long as nobody took the run over (the token says that).
pub(crate) async fn check_run_lease(
    conn: &mut Conn<'_>,
    scope: &Scope,
    lease: &RunLease,
    live_at: Option<Timestamp>,
) -> Result<RunRow, Error> {
    let row = read_run_shared(conn, scope, &lease.run_id).await?;
    if Fence::holds(&row, lease, live_at)? {
        Ok(row)
    } else {
        Err(Error::LeaseLost)
    }
}

/// Hides the password of `scheme://user:password@host/…`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            let host = &authority[at + 1..];
            let user = userinfo.split(':').next().unwrap_or("");
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{tail}")
            } else {
                format!("{scheme}://{userinfo}@{host}{tail}")
            }
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            redact_url("postgres://u:s3cret@db:5432/flow"),
            "postgres://u:***@db:5432/flow"
        );
        assert_eq!(redact_url("postgres://u@db/flow"), "postgres://u@db/flow");
        assert_eq!(
            redact_url("sqlite://.flow/flow.db"),
            "sqlite://.flow/flow.db"
        );
    }
}
