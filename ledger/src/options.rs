//! How to open a ledger: the options both backends' `connect` read.
//!
//! Kept apart from the `Ledger` facade so that `sqlite.rs` and `postgres.rs` depend on
//! the options only, and the facade on them (no import circle).

use std::time::Duration;

use crate::model::Scope;

/// SQLite's `synchronous` setting: the durability/throughput trade-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SqliteSynchronous {
    /// Every commit is fsynced: durable against power loss (the default).
    #[default]
    Full,
    /// WAL commits are fsynced only at checkpoints: faster, still safe against process
    /// crashes, but a power loss may roll back the last commits — including an
    /// `outbound` mark, which would let a request be sent twice. Use only where the
    /// machine's power loss is not a concern.
    Normal,
}

/// How to open a ledger.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Tenant and workspace of every row this handle reads or writes.
    pub scope: Scope,
    /// SQLite durability (ignored for PostgreSQL).
    pub sqlite_synchronous: SqliteSynchronous,
    /// Pool size (0 = backend default: 8 for SQLite, 10 for PostgreSQL). On PostgreSQL
    /// this is a ceiling: the pool opens one connection and adds one only while that many
    /// operations overlap. A command that never overlaps operations should pass 1, so it
    /// never pays a second connection (a TLS handshake) for an operation that merely
    /// started before the previous one's connection was back in the pool.
    pub max_connections: u32,
    /// Apply pending migrations on open (the CLI's `flow migrate` calls
    /// [`Ledger::migrate`] with this off).
    pub migrate: bool,
    /// Largest step, call or run output stored, in bytes of JSON. Larger outputs fail
    /// the step with a permanent error naming the limit; nothing is truncated.
    pub output_limit_bytes: usize,
    /// How long to wait for a database connection before `Unavailable`.
    pub connect_timeout: Duration,
    /// SQLite `busy_timeout`: how long a writer waits for another writer.
    pub busy_timeout: Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            scope: Scope::default(),
            sqlite_synchronous: SqliteSynchronous::Full,
            max_connections: 0,
            migrate: true,
            output_limit_bytes: 1024 * 1024,
            connect_timeout: Duration::from_secs(5),
            busy_timeout: Duration::from_secs(5),
        }
    }
}
