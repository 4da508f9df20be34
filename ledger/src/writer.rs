//! SQLite group commit: one task owns the write connection and commits many operations
//! at once.
//!
//! SQLite has one writer at a time, and with `synchronous=FULL` every commit is an
//! fsync. Instead of each operation taking the write lock, running its statements and
//! committing alone, operations are sent here as jobs. The writer task opens one
//! `BEGIN IMMEDIATE`, runs every job that is waiting (and those that arrive while it
//! works, up to [`MAX_BATCH`]) each under its own `SAVEPOINT`, and commits once:
//! - a job that fails is rolled back to its savepoint alone and answered with its error;
//!   the others are unaffected;
//! - a job that succeeds is answered only after the batch's `COMMIT` returned, so a
//!   caller never acts on a write that is not durable (`mark_outbound` keeps its
//!   guarantee: the request leaves only after its mark is on disk);
//! - if the `COMMIT` fails (or SQLite dropped the transaction under a job), every job of
//!   the batch is answered with that error: none of them happened.
//!
//! Jobs run to completion in this task even if their caller stops waiting, so a caller
//! that is cancelled mid-operation cannot leave half of its writes in a shared
//! transaction. Every write of the ledger goes through this task (`db::Pool` has no other
//! way to write); it holds a gate for each batch, which its tests hold to queue jobs
//! deterministically.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sqlx::{Executor, SqliteConnection};
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::conn::Conn;
use crate::error::Error;

/// Most jobs committed together: bounds how long the first job of a batch waits for
/// its commit while later ones keep arriving.
pub(crate) const MAX_BATCH: usize = 128;

/// A boxed future borrowing the connection it runs on.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A ledger operation: a function of a connection that is already inside a transaction.
/// It must not commit or roll back itself.
pub(crate) type Op<T> =
    Box<dyn for<'c, 'd> FnOnce(&'c mut Conn<'d>) -> BoxFuture<'c, Result<T, Error>> + Send>;

/// The handle operations are sent through. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    tx: mpsc::UnboundedSender<Msg>,
}

enum Msg {
    Job(Box<dyn Job>),
    /// Finish what is queued before this, close the connection, then answer.
    Close(oneshot::Sender<()>),
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Job(_) => "Job",
            Msg::Close(_) => "Close",
        })
    }
}

/// Answers a job's caller with its batch's commit result.
type Reply = Box<dyn FnOnce(Result<(), &Error>) + Send>;

/// What a job left after it ran.
enum Ran {
    /// It succeeded: answer with the commit's result.
    Done(Reply),
    /// It failed: roll it back, then answer with its error.
    Failed(Box<dyn FnOnce() + Send>),
}

trait Job: Send {
    fn run<'c>(self: Box<Self>, conn: &'c mut SqliteConnection) -> BoxFuture<'c, Ran>;
    fn fail(self: Box<Self>, e: Error);
}

struct OpJob<T> {
    op: Op<T>,
    reply: oneshot::Sender<Result<T, Error>>,
}

impl<T: Send + 'static> Job for OpJob<T> {
    fn run<'c>(self: Box<Self>, conn: &'c mut SqliteConnection) -> BoxFuture<'c, Ran> {
        let OpJob { op, reply } = *self;
        Box::pin(async move {
            let mut c = Conn::Sqlite(conn);
            match op(&mut c).await {
                Ok(v) => Ran::Done(Box::new(move |commit: Result<(), &Error>| {
                    let _ = reply.send(commit.map(|()| v).map_err(shared));
                })),
                Err(e) => Ran::Failed(Box::new(move || {
                    let _ = reply.send(Err(e));
                })),
            }
        })
    }

    fn fail(self: Box<Self>, e: Error) {
        let _ = self.reply.send(Err(e));
    }
}

/// The batch's error, given to each of its callers.
fn shared(e: &Error) -> Error {
    Error::Backend {
        message: format!("group commit failed, nothing of this operation was kept: {e}"),
        retryable: e.is_retryable(),
    }
}

fn closed() -> Error {
    Error::Backend {
        message: "the ledger is closed".into(),
        retryable: false,
    }
}

/// The identity (device, inode) of the ledger's write-ahead log as this process opened
/// it. A WAL deleted or replaced under a running process (`rm flow.db-wal`, a restore
/// copied over it) leaves this process writing into an unlinked file that no other
/// process reads and that a crash loses — marks included, so a call that left could
/// look never sent. Checked before every batch; once it differs, nothing more is
/// written here ([`Error::Unusable`]).
#[derive(Debug)]
pub(crate) struct WalGuard {
    path: std::path::PathBuf,
    seen: Option<(u64, u64)>,
    broken: Option<String>,
}

impl WalGuard {
    /// Watches the WAL at `path` (`<database>-wal`).
    pub(crate) fn new(path: std::path::PathBuf) -> Self {
        let mut guard = WalGuard {
            path,
            seen: None,
            broken: None,
        };
        guard.seen = guard.identity();
        guard
    }

    fn identity(&self) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.dev(), m.ino()))
    }

    /// `Err` once the WAL this process writes is no longer the file at its path.
    fn check(&mut self) -> Result<(), Error> {
        if self.broken.is_none() {
            match (self.seen, self.identity()) {
                (None, now) => self.seen = now,
                (Some(a), Some(b)) if a == b => {}
                (Some(_), now) => {
                    let what = if now.is_some() { "replaced" } else { "deleted" };
                    let reason = format!(
                        "the SQLite write-ahead log {} was {what} while this process had the ledger open: its writes would go to a file no other process reads and a crash would lose them, so this process writes nothing more; restart it",
                        self.path.display()
                    );
                    tracing::error!("{reason}");
                    self.broken = Some(reason);
                }
            }
        }
        match &self.broken {
            Some(reason) => Err(Error::Unusable {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }
}

impl Writer {
    /// Starts the writer task on `conn` (a connection of its own, not one of the pool's);
    /// `wal` watches the database's write-ahead log (`None`: not watched).
    pub(crate) fn spawn(
        conn: SqliteConnection,
        gate: Arc<Mutex<()>>,
        wal: Option<WalGuard>,
    ) -> Writer {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(conn, gate, rx, wal));
        Writer { tx }
    }

    /// Runs `op` in the next batch and returns its result once the batch committed.
    pub(crate) async fn submit<T: Send + 'static>(&self, op: Op<T>) -> Result<T, Error> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Msg::Job(Box::new(OpJob { op, reply })))
            .map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?
    }

    /// Lets queued jobs finish, then closes the write connection.
    pub(crate) async fn close(&self) {
        let (done, rx) = oneshot::channel();
        if self.tx.send(Msg::Close(done)).is_ok() {
            let _ = rx.await;
        }
    }
}

async fn exec(conn: &mut SqliteConnection, sql: &'static str) -> Result<(), Error> {
    conn.execute(sqlx::raw_sql(sql)).await?;
    Ok(())
}

async fn run(
    mut conn: SqliteConnection,
    gate: Arc<Mutex<()>>,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    mut wal: Option<WalGuard>,
) {
    let mut next: Option<Msg> = None;
    loop {
        let msg = match next.take() {
            Some(m) => m,
            None => match rx.recv().await {
                Some(m) => m,
                None => break,
            },
        };
        let first = match msg {
            Msg::Job(j) => j,
            Msg::Close(done) => {
                rx.close();
                let _ = sqlx::Connection::close(conn).await;
                let _ = done.send(());
                return;
            }
        };
        let _gate = gate.lock().await;
        if let Some(Err(e)) = wal.as_mut().map(WalGuard::check) {
            first.fail(e);
            continue;
        }
        if let Err(e) = exec(&mut conn, "BEGIN IMMEDIATE; SAVEPOINT op").await {
            // A connection left inside a transaction would refuse every later BEGIN.
            let _ = exec(&mut conn, "ROLLBACK").await;
            first.fail(e);
            continue;
        }
        let mut replies = Vec::new();
        let mut lost: Option<Error> = None;
        let mut job = Some(first);
        let mut ran = 0;
        while let Some(j) = job.take() {
            if ran > 0
                && let Err(e) = exec(&mut conn, "SAVEPOINT op").await
            {
                j.fail(shared(&e));
                lost = Some(e);
                break;
            }
            ran += 1;
            match j.run(&mut conn).await {
                Ran::Done(reply) => replies.push(reply),
                Ran::Failed(answer) => {
                    // Some errors (I/O, a full disk) make SQLite roll back the whole
                    // transaction: then the savepoint is gone and so is the batch.
                    let undone = exec(&mut conn, "ROLLBACK TO op").await;
                    answer();
                    if let Err(e) = undone {
                        lost = Some(e);
                        break;
                    }
                }
            }
            if ran < MAX_BATCH {
                match rx.try_recv() {
                    Ok(Msg::Job(j)) => job = Some(j),
                    Ok(close) => next = Some(close),
                    Err(_) => {}
                }
            }
        }
        let result = match lost {
            Some(e) => Err(e),
            None => exec(&mut conn, "COMMIT").await,
        };
        if result.is_err() {
            let _ = exec(&mut conn, "ROLLBACK").await;
        }
        drop(_gate);
        for reply in replies {
            reply(result.as_ref().map(|_| ()));
        }
    }
}

#[cfg(test)]
mod tests {
    //! The batch rules, made deterministic: the test holds the write gate while it queues
    //! jobs, so they all land in one batch.

    use std::time::Duration;

    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
    use sqlx::{ConnectOptions, Executor};

    use super::*;
    use crate::conn::args;
    use crate::rows::IntRow;

    async fn open(dir: &tempfile::TempDir) -> (Writer, Arc<Mutex<()>>, SqliteConnection) {
        let opts = SqliteConnectOptions::new()
            .filename(dir.path().join("w.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .foreign_keys(true);
        let mut reader = opts.connect().await.expect("reader");
        reader
            .execute(sqlx::raw_sql(
                "CREATE TABLE parent (id INTEGER PRIMARY KEY);
                 CREATE TABLE item (id INTEGER PRIMARY KEY, parent INTEGER
                    REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);
                 INSERT INTO parent (id) VALUES (1);",
            ))
            .await
            .expect("schema");
        let gate = Arc::new(Mutex::new(()));
        let writer = Writer::spawn(opts.connect().await.expect("writer"), gate.clone(), None);
        (writer, gate, reader)
    }

    /// Inserts item `id` under `parent`; `fail_after` makes the op fail after its write.
    fn insert(
        writer: &Writer,
        id: i64,
        parent: i64,
        fail_after: bool,
    ) -> BoxFuture<'static, Result<i64, Error>> {
        let writer = writer.clone();
        Box::pin(async move {
            writer
                .submit(Box::new(move |c| {
                    Box::pin(async move {
                        c.execute(
                            "INSERT INTO item (id, parent) VALUES ($1, $2)",
                            args![id, parent],
                        )
                        .await?;
                        if fail_after {
                            return Err(Error::LeaseLost);
                        }
                        Ok(id)
                    })
                }))
                .await
        })
    }

    async fn items(reader: &mut SqliteConnection) -> Vec<i64> {
        let mut c = Conn::Sqlite(reader);
        let rows: Vec<IntRow> = c
            .all("SELECT id AS n FROM item ORDER BY id", args![])
            .await
            .expect("read items");
        rows.into_iter().map(|r| r.n).collect()
    }

    #[tokio::test]
    async fn a_failing_operation_rolls_back_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (writer, gate, mut reader) = open(&dir).await;
        let held = gate.lock().await;
        let jobs: Vec<_> = (1..=5)
            .map(|i| tokio::spawn(insert(&writer, i, 1, i == 3)))
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(held);
        let mut results = Vec::new();
        for j in jobs {
            results.push(j.await.expect("task"));
        }
        assert!(matches!(results[2], Err(Error::LeaseLost)), "{results:?}");
        for (i, r) in results.iter().enumerate() {
            if i != 2 {
                assert_eq!(r.as_ref().ok(), Some(&(i as i64 + 1)));
            }
        }
        assert_eq!(items(&mut reader).await, vec![1, 2, 4, 5]);
    }

    #[tokio::test]
    async fn callers_are_answered_only_after_the_commit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (writer, gate, mut reader) = open(&dir).await;
        let (release, wait) = oneshot::channel::<()>();
        let held = gate.lock().await;
        let first = tokio::spawn(insert(&writer, 1, 1, false));
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The second job of the batch blocks until the test lets it go.
        let w = writer.clone();
        let second = tokio::spawn(async move {
            w.submit(Box::new(move |c| {
                Box::pin(async move {
                    c.execute("INSERT INTO item (id, parent) VALUES (2, 1)", args![])
                        .await?;
                    let _ = wait.await;
                    Ok(2i64)
                })
            }))
            .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(held);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!first.is_finished(), "answered before its batch committed");
        assert_eq!(
            items(&mut reader).await,
            Vec::<i64>::new(),
            "nothing is visible yet"
        );
        release.send(()).expect("release");
        assert_eq!(first.await.expect("task").expect("first"), 1);
        assert_eq!(second.await.expect("task").expect("second"), 2);
        assert_eq!(items(&mut reader).await, vec![1, 2]);
    }

    #[tokio::test]
    async fn a_batch_that_fails_to_commit_fails_every_caller() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (writer, gate, mut reader) = open(&dir).await;
        let held = gate.lock().await;
        // Item 2 names a missing parent: the deferred foreign key fails the COMMIT.
        let jobs: Vec<_> = [(1, 1), (2, 99), (3, 1)]
            .into_iter()
            .map(|(id, parent)| tokio::spawn(insert(&writer, id, parent, false)))
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(held);
        for j in jobs {
            let r = j.await.expect("task");
            assert!(matches!(r, Err(Error::Backend { .. })), "{r:?}");
        }
        assert_eq!(items(&mut reader).await, Vec::<i64>::new());
        // The writer recovers: the next batch commits.
        insert(&writer, 4, 1, false)
            .await
            .expect("after a failed batch");
        assert_eq!(items(&mut reader).await, vec![4]);
        writer.close().await;
        assert!(insert(&writer, 5, 1, false).await.is_err(), "closed");
    }
}
