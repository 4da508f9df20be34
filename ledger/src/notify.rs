//! Queue wake-ups: PostgreSQL `LISTEN/NOTIFY` on the channel [`QUEUE_CHANNEL`].
//!
//! `enqueue` and `requeue_run` send a notification inside their own transaction, so it is
//! delivered when (and only if) the run is committed. A daemon that listens claims at
//! once instead of at its next poll. A notification is only a latency hint: one lost while
//! the listener reconnects costs at most a poll interval, never a run, because daemons
//! keep polling. SQLite has no such mechanism; [`Ledger::listen_queue`] returns `None`
//! there and daemons just poll.

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};

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

/// Sends the queue notification on `conn` (PostgreSQL; nothing on SQLite). Called inside
/// the transaction that queues a run: PostgreSQL delivers it at commit.
pub(crate) async fn notify_queued(conn: &mut Conn<'_>, scope: &Scope) -> Result<(), Error> {
    if conn.is_postgres() {
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

/// A dedicated connection listening for queue notifications of one scope.
pub struct QueueListener {
    listener: PgListener,
    /// The listener's own pool, kept to close its connection cleanly.
    own: PgPool,
    payload: String,
}

impl std::fmt::Debug for QueueListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueListener")
            .field("payload", &self.payload)
            .finish_non_exhaustive()
    }
}

impl QueueListener {
    /// Waits for the next wake-up of this scope. Errors mean the connection is down and
    /// could not be opened again; calling `wait` again retries (back off meanwhile).
    pub async fn wait(&mut self) -> Result<Wake, Error> {
        loop {
            match self.listener.try_recv().await? {
                Some(n) if n.payload() == self.payload => return Ok(Wake::Queued),
                Some(_) => {}
                None => return Ok(Wake::Reconnected),
            }
        }
    }

    /// Ends the listening session with a goodbye to the server (dropping it instead
    /// leaves "connection reset by peer" in PostgreSQL's log).
    pub async fn close(self) {
        drop(self.listener);
        self.own.close().await;
    }
}

impl Ledger {
    /// Starts listening for queued runs of this handle's scope (PostgreSQL); `None` on
    /// SQLite, which has no notifications. The listener has its own connection (it does
    /// not take one of the pool's) and re-subscribes by itself after a reconnect.
    pub async fn listen_queue(&self) -> Result<Option<QueueListener>, Error> {
        let Pool::Postgres(pool) = self.pool() else {
            return Ok(None);
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
        Ok(Some(QueueListener {
            listener,
            own,
            payload: payload(self.scope()),
        }))
    }
}
