//! `ledger::Error`: one enum for the storage boundary.
//!
//! sqlx errors are mapped here and only here, so callers act on meaning (`LeaseLost`: stop,
//! `Busy`: someone else is working, `Conflict`: identity reused with other input) and a
//! unique-constraint violation never reaches them raw.

use crate::clock::Timestamp;

/// Everything a ledger method can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The row does not exist in this tenant/workspace.
    #[error("{what} not found")]
    NotFound {
        /// What was looked up, e.g. `run run_01H…`.
        what: String,
    },
    /// An identity (run id, tool_call_id, idempotency key) was reused with different input.
    #[error("conflict with run {other_run} node {other_node}: {reason}")]
    Conflict {
        /// The run that already owns the identity.
        other_run: String,
        /// The node (tool_call_id) that already owns it (empty for run-level conflicts).
        other_node: String,
        /// What differs.
        reason: String,
    },
    /// A change was refused because someone else owns the thing: a schedule `flow.toml`
    /// declares, or another workflow applied, cannot be replaced by `flow schedules
    /// apply` (the caller picks another id, or changes it where it is declared).
    #[error("{what} belongs to {owner}")]
    Owned {
        /// What was to change, e.g. ``schedule `nightly` ``.
        what: String,
        /// Who declared it, e.g. `flow.toml` or ``workflow `billing` ``.
        owner: String,
    },
    /// A brand-new claim presented an idempotency key that a run deleted by retention
    /// used (its tombstone, migration 0015): the outcome it would replay is gone, and a
    /// send could execute twice at a downstream that still remembers the key. Nothing
    /// was claimed or sent; the caller chooses a new key or settles it by hand.
    #[error(
        "the idempotency key was used by run {run_id} (node {node_id}, {outcome}), deleted by retention on {deleted_at}; choose a new key or resolve by hand"
    )]
    KeyRetired {
        /// The deleted run that used the key.
        run_id: String,
        /// Its node.
        node_id: String,
        /// How that call ended (`succeeded` or `failed`).
        outcome: crate::CallStatus,
        /// When retention deleted the run.
        deleted_at: Timestamp,
    },
    /// A live lease is held by someone else: never two workers (or senders) at once.
    #[error("busy: leased by {holder} until {until}")]
    Busy {
        /// The holder's worker id.
        holder: String,
        /// When its lease ends unless renewed.
        until: Timestamp,
    },
    /// This worker no longer holds the lease it wrote under (expired and taken over, or
    /// fenced out by a newer token). The caller must stop: it may not send or record.
    #[error("lease lost: this worker no longer holds the lease")]
    LeaseLost,
    /// The call's outcome is unknown; it waits for a resolution.
    #[error("tool call is in doubt since {since}")]
    InDoubt {
        /// When it became in doubt.
        since: Timestamp,
    },
    /// The requested change is not a legal transition from the current state.
    #[error("{what} cannot go from {from} to {to}")]
    InvalidTransition {
        /// `run`, `step` or `tool call`.
        what: &'static str,
        /// Current state.
        from: String,
        /// Requested state or action.
        to: String,
    },
    /// The run already finished; nothing may change it.
    #[error("run is already {status}")]
    Terminal {
        /// Its terminal status.
        status: crate::RunStatus,
    },
    /// An approval was already decided (approved, denied, timed out or cancelled):
    /// approve, deny, the deadline and a cancel race through one compare-and-set, and
    /// every loser is told who won.
    #[error("the approval is already {status}{}", by.as_ref().map(|b| format!(" (by {b})")).unwrap_or_default())]
    Decided {
        /// The winning status (`approved`, `denied`, `timed_out`, `cancelled`).
        status: crate::ApprovalStatus,
        /// Who decided, when a person did.
        by: Option<String>,
    },
    /// A decision (approve or deny) came at or after the approval's deadline: it timed
    /// out there, whether or not a sweep had recorded it yet, and nothing is decided
    /// after it (the node's `on_timeout` applies). Nothing of the decision was recorded.
    #[error(
        "the approval timed out at its deadline {}: a decision after it is refused",
        deadline.to_rfc3339()
    )]
    PastDeadline {
        /// The approval's deadline.
        deadline: Timestamp,
    },
    /// An approver decided on a request that has changed since they saw it (the digest
    /// they passed is not the one awaiting approval now).
    #[error(
        "the digest given is not the one awaiting approval ({current}): the request changed since it was shown, or the digest is mistyped; look again with `flow approvals`"
    )]
    Stale {
        /// The digest awaiting approval now.
        current: String,
    },
    /// A value is larger than `OpenOptions::output_limit_bytes` (never truncated).
    #[error("output is {size} bytes, over the limit of {limit} bytes")]
    OutputTooLarge {
        /// The configured limit.
        limit: usize,
        /// The value's size as JSON.
        size: usize,
    },
    /// A text the caller passed cannot be stored: PostgreSQL refuses a NUL byte in a
    /// text (`invalid byte sequence`, SQLSTATE 22021) and `\u0000` in JSON (22P05). It is
    /// the caller's input at fault, not the database: callers answer it as bad input
    /// (the API's 400), never as "database unavailable".
    #[error(
        "a text holds a NUL byte or another character that cannot be stored; nothing was written"
    )]
    InvalidText {
        /// The database's message, for logs (not shown: callers answer clients with the
        /// variant's own words, not the database's).
        reason: String,
    },
    /// A [`crate::RunFilter`] asks for something no run can have: an input name outside
    /// the id grammar (an over-long one included), an input value over
    /// [`crate::MAX_INPUT_VALUE_LEN`] bytes (such values are not indexed), a NUL
    /// character, or an id prefix longer than any id. Refused rather than answered with
    /// an empty page, so a typo in a search is told apart from "no such run": callers
    /// answer it as bad input (the API's 400).
    #[error("invalid run filter: {reason}")]
    InvalidFilter {
        /// What is wrong, in words fit for the person who typed the filter.
        reason: String,
    },
    /// An event to publish has no usable name or id (empty, over 200 bytes, a control
    /// character): the caller's input at fault (the API's 400).
    #[error("invalid event: {reason}")]
    InvalidEvent {
        /// What is wrong.
        reason: String,
    },
    /// The database cannot be reached or opened. The CLI maps this to exit code 5.
    #[error("database {url} is unavailable: {reason}")]
    Unavailable {
        /// The URL with any password replaced by `***`.
        url: String,
        /// Why.
        reason: String,
    },
    /// The ledger was opened read-only (`sqlite://…?mode=ro`) and this operation writes.
    /// Nothing was written; open it without `mode=ro` to write.
    #[error("ledger {url} is open read-only (mode=ro); this operation writes")]
    ReadOnly {
        /// The URL with any password replaced by `***`.
        url: String,
    },
    /// The URL's scheme is neither `sqlite:` nor `postgres:`/`postgresql:`.
    #[error("unsupported database URL {url}: expected sqlite://PATH or postgres://…")]
    UnsupportedUrl {
        /// The URL with any password replaced by `***`.
        url: String,
    },
    /// Migrations could not be applied.
    #[error("migration failed: {0}")]
    Migrate(String),
    /// A stored value does not parse (a row written by a newer or broken version).
    #[error("corrupt ledger data: {what}")]
    Corrupt {
        /// What failed to parse.
        what: String,
    },
    /// This process can no longer write the ledger safely (its SQLite write-ahead log
    /// was deleted or replaced under it): every write is refused from then on, and the
    /// process should stop — a restart opens the ledger as it now is. Never retryable.
    #[error("the ledger cannot be written by this process any more: {reason}")]
    Unusable {
        /// What happened, and what to do.
        reason: String,
    },
    /// Any other database error. `retryable` is true for transient conditions (connection
    /// lost, pool timeout, SQLITE_BUSY, serialization failure, deadlock).
    #[error("database error: {message}")]
    Backend {
        /// The driver's message (never contains bound values, so never secrets).
        message: String,
        /// Whether repeating the operation may succeed.
        retryable: bool,
    },
}

/// What a caller can do about an [`Error`]: the one classification every face maps from
/// (the API's status, the CLI's exit code), so a new error is classed once, here, and no
/// face needs a wildcard that would hide it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request itself is wrong (a value too large, text the database cannot store, a
    /// bad filter or event, a URL flow cannot open): fix it; the same again fails again.
    BadInput,
    /// What it names does not exist.
    NotFound,
    /// The ledger's state refuses it now — held by another, already decided, in doubt,
    /// not in that state, a retired key, a deadline passed: read the state and decide.
    Conflict,
    /// This process may not do it (a ledger opened read-only).
    Forbidden,
    /// The database cannot be used now (unreachable, a timeout, a failed migration):
    /// try later or fix the connection.
    Unavailable,
    /// Stored data does not parse, or this process can no longer write safely: stop;
    /// a person must look.
    Corrupt,
}

impl Error {
    /// Its [`ErrorClass`]. Exhaustive on purpose: a new variant must be classed here.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::NotFound { .. } => ErrorClass::NotFound,
            Error::Conflict { .. }
            | Error::Owned { .. }
            | Error::KeyRetired { .. }
            | Error::Busy { .. }
            | Error::LeaseLost
            | Error::InDoubt { .. }
            | Error::InvalidTransition { .. }
            | Error::Terminal { .. }
            | Error::Decided { .. }
            | Error::PastDeadline { .. }
            | Error::Stale { .. } => ErrorClass::Conflict,
            Error::OutputTooLarge { .. }
            | Error::InvalidText { .. }
            | Error::InvalidFilter { .. }
            | Error::InvalidEvent { .. }
            | Error::UnsupportedUrl { .. } => ErrorClass::BadInput,
            Error::ReadOnly { .. } => ErrorClass::Forbidden,
            Error::Unavailable { .. } | Error::Migrate(_) | Error::Backend { .. } => {
                ErrorClass::Unavailable
            }
            Error::Corrupt { .. } | Error::Unusable { .. } => ErrorClass::Corrupt,
        }
    }

    /// Whether repeating the same operation may succeed (a transient backend problem).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Backend {
                retryable: true,
                ..
            }
        )
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        let retryable = match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => {
                let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
                // SQLite: 5 BUSY, 6 LOCKED, 13 FULL (a full disk: space may come back;
                // a holder retries its outcome write rather than leave the call in doubt)
                // and their extended codes, low byte.
                // PostgreSQL: 40001 serialization, 40P01 deadlock, 57P01 admin shutdown,
                // class 08 connection exceptions, class 53 insufficient resources (a
                // full disk, too many connections).
                let sqlite_busy = code
                    .parse::<i64>()
                    .map(|c| matches!(c & 0xff, 5 | 6 | 13))
                    .unwrap_or(false);
                sqlite_busy
                    || matches!(code.as_str(), "40001" | "40P01" | "57P01" | "55P03")
                    || code.starts_with("08")
                    || code.starts_with("53")
            }
            _ => false,
        };
        if let sqlx::Error::Database(db) = &e
            && db.is_unique_violation()
        {
            // Callers handle the races they expect; one that slips through is still a
            // conflict of identities, never a raw driver error.
            return Error::Conflict {
                other_run: String::new(),
                other_node: String::new(),
                reason: format!("identity already in use ({})", db.message()),
            };
        }
        if let sqlx::Error::Database(db) = &e
            && matches!(db.code().as_deref(), Some("22021" | "22P05"))
        {
            return Error::InvalidText {
                reason: db.message().to_string(),
            };
        }
        Error::Backend {
            message: e.to_string(),
            retryable,
        }
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        Error::Migrate(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::{Error, ErrorClass};

    /// The classes the faces map from: a decided approval, a stale digest and a bad
    /// filter are the caller's to act on (they fell to "unavailable" behind a wildcard),
    /// a corrupt row and a lost WAL are not.
    #[test]
    fn every_error_has_the_class_a_caller_can_act_on() {
        let decided = Error::Decided {
            status: crate::ApprovalStatus::Approved,
            by: None,
        };
        assert_eq!(decided.class(), ErrorClass::Conflict);
        let stale = Error::Stale {
            current: "d".into(),
        };
        assert_eq!(stale.class(), ErrorClass::Conflict);
        let filter = Error::InvalidFilter { reason: "x".into() };
        assert_eq!(filter.class(), ErrorClass::BadInput);
        let corrupt = Error::Corrupt { what: "row".into() };
        assert_eq!(corrupt.class(), ErrorClass::Corrupt);
        assert_eq!(
            Error::from(sqlx::Error::PoolTimedOut).class(),
            ErrorClass::Unavailable
        );
    }

    #[test]
    fn transient_backend_errors_are_retryable() {
        assert!(Error::from(sqlx::Error::PoolTimedOut).is_retryable());
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(Error::from(sqlx::Error::Io(io)).is_retryable());
        assert!(!Error::from(sqlx::Error::RowNotFound).is_retryable());
        assert!(!Error::LeaseLost.is_retryable());
        assert!(
            !Error::Busy {
                holder: "w".into(),
                until: crate::Timestamp(0)
            }
            .is_retryable()
        );
    }
}
