//! Queue wake-ups: PostgreSQL `LISTEN/NOTIFY` on the channel [`QUEUE_CHANNEL`], and an
//! in-process signal on SQLite.
//!
//! `enqueue` and `requeue_run` send a notification inside their own transaction, so it is
//! delivered when (and only if) the run is committed (`enqueue_and_claim` sends none:
//! the run it creates is already claimed). A daemon that listens claims at
//! once instead of at its next poll. A notification is only a latency hint: one lost while
//! the listener reconnects costs at most a poll interval, never a run, because daemons
//! keep polling.
//!
//! SQLite has no notifications between processes, so daemons of other processes poll;
//! but a `flow daemon --serve` queues runs through the API and claims them in one
//! process, and there [`Ledger::listen_queue`] hears this process's own enqueues (a
//! [`tokio::sync::watch`] bumped by every enqueue here). Every write of one ledger handle
//! goes through its single writer in order, so a claim sent after the wake is committed
//! after the enqueue that sent it. A wake from another ledger of the same process (tests
//! open many) or of a transaction that then rolls back costs one empty claim.
use std::sync::LazyLock;

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::watch;

use crate::conn::{Conn, args};
use crate::db::Pool;
use crate::error::Error;
use crate::ledger::Ledger;
use crate::model::Scope;

/// The channel queue notifications are sent on; the payload names the scope
/// (`tenant/workspace`), so listeners of other scopes can ignore them.
pub const QUEUE_CHANNEL: &str = "flow_runs";

fn payload(scope: &Scope) -> String {
    format!("{}/{}", scope.tenant, scope.workspace)
}

/// This process's SQLite enqueues, counted: a [`QueueListener`] on SQLite waits for the
/// count to change.
static QUEUED_HERE: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::Sender::new(0));

/// This process's runs that finished or paused, counted: what a caller waiting for a
/// run it queued (flow's MCP server, in a `flow daemon --serve` that also executes the
/// run) wakes on instead of polling blind. Bumped after the transaction commits, so a
/// waiter that wakes and re-reads its run sees the new state; a bump for another run
/// costs it one read. Runs executed by other processes are not heard: waiters poll too.
static SETTLED_HERE: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::Sender::new(0));

/// Counts a run of this process that finished or paused (after its commit).
pub(crate) fn settled_here() {
    SETTLED_HERE.send_modify(|n| *n = n.wrapping_add(1));
}

impl Ledger {
    /// A receiver that changes whenever a run this process executes finishes or pauses
    /// (see `SETTLED_HERE`): subscribe before reading the run, then wait on
    /// `changed()` beside a poll.
    pub fn runs_settled_here(&self) -> watch::Receiver<u64> {
        SETTLED_HERE.subscribe()
    }
}

/// Sends the queue notification on `conn` (PostgreSQL) or to this process's listeners
/// (SQLite). Called inside the transaction that queues a run: PostgreSQL delivers it at
/// commit; on SQLite the listener's next claim queues behind this transaction.
pub(crate) async fn notify_queued(conn: &mut Conn<'_>, scope: &Scope) -> Result<(), Error> {
    if !conn.is_postgres() {
        QUEUED_HERE.send_modify(|n| *n = n.wrapping_add(1));
    } else {
        conn.execute(
            "SELECT pg_notify($1, $2)",
            args![QUEUE_CHANNEL, payload(scope)],
        )
        .await?;
    }
    Ok(())
}

/// What woke a [`QueueListener`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A run was queued (or re-queued) in this scope.
    Queued,
    /// The listening connection was lost and opened again: notifications sent meanwhile
    /// are gone, so the caller should look at the queue now.
    Reconnected,
}

/// Listens for queue wake-ups of one scope: a dedicated PostgreSQL connection, or this
/// process's own enqueues on SQLite.
pub struct QueueListener(Listening);

enum Listening {
    Postgres {
        listener: PgListener,
        /// The listener's own pool, kept to close its connection cleanly.
        own: PgPool,
        payload: String,
    },
    /// SQLite: the count of this process's enqueues (see the module's comment).
    InProcess(watch::Receiver<u64>),
}

impl std::fmt::Debug for QueueListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Listening::Postgres { payload, .. } => f
                .debug_struct("QueueListener")
                .field("payload", payload)
                .finish_non_exhaustive(),
            Listening::InProcess(_) => f.write_str("QueueListener(in process)"),
        }
    }
}

impl QueueListener {
    /// Waits for the next wake-up of this scope. Errors mean the connection is down and
    /// could not be opened again; calling `wait` again retries (back off meanwhile).
    pub async fn wait(&mut self) -> Result<Wake, Error> {
        match &mut self.0 {
            Listening::Postgres {
                listener, payload, ..
            } => loop {
                match listener.try_recv().await? {
                    Some(n) if n.payload() == payload.as_str() => return Ok(Wake::Queued),
                    Some(_) => {}
                    None => return Ok(Wake::Reconnected),
                }
            },
            Listening::InProcess(count) => match count.changed().await {
                Ok(()) => Ok(Wake::Queued),
                // The sender is a static: it is never dropped while the process runs.
                Err(_) => std::future::pending().await,
            },
        }
    }

    /// Ends the listening session with a goodbye to the server (dropping it instead
    /// leaves "connection reset by peer" in PostgreSQL's log).
    pub async fn close(self) {
        if let Listening::Postgres { listener, own, .. } = self.0 {
            drop(listener);
            own.close().await;
        }
    }
}

impl Ledger {
    /// Starts listening for queued runs of this handle's scope. On PostgreSQL the
    /// listener has its own connection (it does not take one of the pool's) and
    /// re-subscribes by itself after a reconnect; on SQLite it hears only this process's
    /// enqueues (`flow daemon --serve`), other processes' are found by polling.
    pub async fn listen_queue(&self) -> Result<Option<QueueListener>, Error> {
        let Pool::Postgres(pool) = self.pool() else {
            return Ok(Some(QueueListener(Listening::InProcess(
                QUEUED_HERE.subscribe(),
            ))));
        };
        let options = (*pool.connect_options()).clone();
        let own = PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_lazy_with(options);
        let mut listener = PgListener::connect_with(&own).await?;
        listener.listen(QUEUE_CHANNEL).await?;
        Ok(Some(QueueListener(Listening::Postgres {
            listener,
            own,
            payload: payload(self.scope()),
        })))
    }
}
